//! Quantized matrices as the GPU kernels read them (issue 31), in every format a GGUF file
//! holds: ggml's blocks as the file stores them, each block padded to whole 32-bit words so
//! that every field a kernel reads starts on a word. Q8_0, Q4_0 and Q5_0 get two bytes after
//! their f16 scale (their values then start on a word), IQ4_NL too, MXFP4 three after its E8M0
//! byte, Q3_K and Q6_K two at their end; Q4_1,
//! Q5_1, Q2_K, Q4_K and Q5_K need none. A file's bytes thus keep their size on the device, within 6% (Q8_0, 36
//! bytes a block for 34).

use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use super::QuantType;

/// The bytes inserted after the first `at` of each block of `ty` to pad it to whole words:
/// `(at, count)`.
fn padding(ty: QuantType) -> (usize, usize) {
    match ty {
        QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Iq4Nl => (2, 2),
        QuantType::Mxfp4 => (1, 3),
        QuantType::Q3K => (110, 2),
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

/// The most rows of `k` values in `ty` one part of a matrix holds so that the part fits a device
/// buffer of `limit` bytes, both as blocks and dequantized to floats of `dense_size` bytes (what
/// a many-row product reads): at least one.
pub fn part_rows(ty: QuantType, k: usize, dense_size: usize, limit: u64) -> usize {
    let row = (row_words(ty, k) * 4).max(k * dense_size).max(1) as u64;
    usize::try_from(limit / row).unwrap_or(usize::MAX).max(1)
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

    /// [`Self::upload`] in parts of at most `per_part` rows (a matrix larger than the device's
    /// largest buffer: [`part_rows`]).
    pub fn upload_parts(
        ty: QuantType,
        rows: usize,
        k: usize,
        bytes: &[u8],
        per_part: usize,
        device: &Device,
    ) -> Option<Vec<Self>> {
        let row_bytes = super::row_bytes(ty, k);
        if bytes.len() != rows * row_bytes {
            return None;
        }
        let per_part = per_part.max(1);
        (0..rows.max(1))
            .step_by(per_part)
            .map(|r0| {
                let n = per_part.min(rows - r0);
                Self::upload(ty, n, k, &bytes[r0 * row_bytes..(r0 + n) * row_bytes], device)
            })
            .collect()
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
        assert_eq!([9, 5, 5, 6, 6, 21, 28, 36, 44, 53, 5, 5], QuantType::ALL.map(block_words));
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

    /// A matrix larger than the device's largest buffer goes in parts that fit it, as blocks and
    /// dequantized: the demo model's embedding (151,936 rows of 896 in Q8_0, 1,008 bytes a row
    /// in blocks, 3,584 in f32) takes five parts of 128 MiB on llvmpipe; the parts hold the rows
    /// in order.
    #[test]
    fn large_matrices_go_in_parts_that_fit_a_buffer() {
        let mib = 1 << 20;
        assert_eq!(part_rows(QuantType::Q8_0, 896, 4, 128 * mib), 37_449);
        assert_eq!(151_936usize.div_ceil(part_rows(QuantType::Q8_0, 896, 4, 128 * mib)), 5);
        assert_eq!(part_rows(QuantType::Q8_0, 896, 2, 128 * mib), 128 * mib as usize / 1_792);
        assert_eq!(part_rows(QuantType::Q4K, 256, 2, 1), 1, "at least a row");
        assert_eq!(part_rows(QuantType::Q4K, 256, 2, u64::MAX), (u64::MAX / 512) as usize, "no limit");
        let (rows, k) = (10, 64);
        let bytes: Vec<u8> = (0..rows * super::super::row_bytes(QuantType::Q8_0, k)).map(|i| (i * 7) as u8).collect();
        let device = Device::flex();
        let whole = DeviceRows::upload(QuantType::Q8_0, rows, k, &bytes, &device).unwrap();
        let parts = DeviceRows::upload_parts(QuantType::Q8_0, rows, k, &bytes, 4, &device).unwrap();
        assert_eq!(parts.iter().map(DeviceRows::rows).collect::<Vec<_>>(), [4, 4, 2]);
        let joined = Tensor::cat(parts.into_iter().map(|p| p.words).collect(), 0);
        assert_eq!(joined.into_data(), whole.words.into_data());
        assert!(DeviceRows::upload_parts(QuantType::Q8_0, rows + 1, k, &bytes, 4, &device).is_none());
    }
}
