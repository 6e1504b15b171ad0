//! Quantized matrices as the GPU kernels read them (issue 31), in every format a GGUF file
//! holds: ggml's blocks as the file stores them, each block padded to whole 32-bit words so
//! that every field a kernel reads starts on a word. Q8_0, Q4_0 and Q5_0 get two bytes after
//! their f16 scale (their values then start on a word), Q6_K two at its end; Q4_1, Q5_1, Q4_K
//! and Q5_K need none. A file's bytes thus keep their size on the device, within 6% (Q8_0, 36
//! bytes a block for 34).

use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use super::QuantType;

/// The bytes inserted after the first `at` of each block of `ty` to pad it to whole words:
/// `(at, count)`.
fn padding(ty: QuantType) -> (usize, usize) {
    match ty {
        QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 => (2, 2),
        QuantType::Q6K => (210, 2),
        _ => (ty.block_bytes(), 0),
    }
}

/// 32-bit words of one block of `ty` on the device.
pub fn block_words(ty: QuantType) -> usize {
    (ty.block_bytes() + padding(ty).1).div_ceil(4)
}

/// Words of one row of `k` values. Precondition: `ty.fits_row(k)`.
pub fn row_words(ty: QuantType, k: usize) -> usize {
    k / ty.block_values() * block_words(ty)
}

/// A matrix's ggml blocks (`rows` rows of `k` values, rows in order) as device words, row after
/// row; `None` where the bytes are not that many blocks of rows of `k` values.
pub fn words(ty: QuantType, rows: usize, k: usize, bytes: &[u8]) -> Option<Vec<u32>> {
    if !ty.fits_row(k) || bytes.len() != rows * super::row_bytes(ty, k) {
        return None;
    }
    let (at, pad) = padding(ty);
    let mut words = Vec::with_capacity(rows * row_words(ty, k));
    // One block padded at a time (at most 212 bytes), not the whole matrix copied first.
    let mut padded = Vec::with_capacity(block_words(ty) * 4);
    for block in bytes.chunks_exact(ty.block_bytes()) {
        padded.clear();
        padded.extend_from_slice(&block[..at]);
        padded.extend(std::iter::repeat_n(0u8, pad));
        padded.extend_from_slice(&block[at..]);
        words.extend(padded.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
    }
    Some(words)
}

/// Rows of a quantized matrix on a device, all in one format: [rows, `row_words`] u32 words.
#[derive(Debug, Clone)]
pub struct DeviceRows {
    pub ty: QuantType,
    /// Values a row.
    pub k: usize,
    pub words: Tensor<2, Int>,
}

impl DeviceRows {
    /// A matrix's ggml blocks on `device`; `None` where [`words`] declines them.
    pub fn upload(ty: QuantType, rows: usize, k: usize, bytes: &[u8], device: &Device) -> Option<Self> {
        let words = words(ty, rows, k, bytes)?;
        let data = TensorData::new(words, [rows, row_words(ty, k)]);
        Some(Self { ty, k, words: Tensor::from_data(data, (device, DType::U32)) })
    }

    pub fn rows(&self) -> usize {
        self.words.dims()[0]
    }

    /// Bytes held on the device.
    pub fn size_bytes(&self) -> usize {
        self.words.shape().num_elements() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block pads to whole words, and its fields land where the kernels read them: Q8_0's
    /// scale in word 0 and its values from word 1; Q6_K's scale in its last word.
    #[test]
    fn blocks_pad_to_words_with_their_fields_in_place() {
        for ty in QuantType::ALL {
            assert_eq!((ty.block_bytes() + padding(ty).1) % 4, 0, "{ty}");
        }
        assert_eq!([9, 5, 5, 6, 6, 36, 44, 53], QuantType::ALL.map(block_words));
        let mut q8 = vec![0u8; 34];
        q8[..2].copy_from_slice(&[0x11, 0x22]);
        for (i, b) in q8[2..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let w = words(QuantType::Q8_0, 1, 32, &q8).unwrap();
        assert_eq!(w.len(), 9);
        assert_eq!(w[0], 0x2211);
        assert_eq!(w[1], u32::from_le_bytes([0, 1, 2, 3]));
        let mut q6 = vec![0u8; 210];
        q6[208..].copy_from_slice(&[0x33, 0x44]);
        assert_eq!(words(QuantType::Q6K, 1, 256, &q6).unwrap()[52], 0x4433);
        assert!(words(QuantType::Q8_0, 2, 32, &q8).is_none(), "one block short");
    }
}
