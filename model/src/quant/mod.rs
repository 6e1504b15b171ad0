//! Q2–Q5: quantized weight matrices (on the CPU; on a GPU through `device.rs`).
//!
//! - `ggml.rs`: ggml's block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
//!   Q6_K) as they lie in a GGUF file, decoded and dequantized exactly as ggml does;
//! - `foreign.rs`: the GGUF format the kernels do not run (IQ4_XS), dequantized as ggml does and
//!   converted at load to one they do (IQ4_NL, the same nibbles);
//! - `quantize.rs`: f32 rows to every one of those formats, the scales chosen to minimise the
//!   squared error (in-situ quantization at load, Q4, and of replaced weights), weighted by an
//!   importance matrix (`imatrix.rs`, llama.cpp's files) where one is given;
//! - `packed.rs`: [`PackedMatrix`], the layout the kernels stream: 16 weight rows interleaved per
//!   32-value group, so one 64-byte load feeds a dot product of 16 rows at once (at most 3%
//!   larger than the file's blocks);
//! - `device.rs`: ggml's blocks padded to whole 32-bit words, as the GPU kernels read them;
//! - `activation.rs`: activations quantized per 32-value block to int8, as llama.cpp does;
//! - `vnni.rs` (AVX-512 VNNI, `vpdpbusd`), `avx2.rs` (AVX2, `vpmaddubsw`) and `portable.rs` (any
//!   CPU): x·Wᵀ over the packed layout; `matmul.rs` splits a product over the rayon pool and picks
//!   the kernel.

mod activation;
mod avx2;
pub mod device;
mod foreign;
mod ggml;
mod imatrix;
mod matmul;
mod packed;
mod portable;
mod quantize;
mod vnni;

pub use foreign::{Foreign, mxfp4_from_pairs};
#[cfg(feature = "wgpu")]
pub(crate) use ggml::{IQ4_LEVELS, MXFP4_LEVELS};
pub use ggml::{dequantize, row_bytes};
pub use imatrix::Imatrix;
pub use matmul::{Kernel, Product, matmul, matmul_each, matmul_with};
pub use packed::{PackError, PackedMatrix};
pub use quantize::{quantize, quantize_weighted};

/// The tensor types a file may hold, as errors list them.
pub fn loadable_types() -> String {
    format!(
        "F32, F16, BF16, {}; {} converted at load",
        QuantType::ALL.map(QuantType::name).join(", "),
        Foreign::ALL.map(Foreign::name).join(", ")
    )
}

/// A quantized block format (ggml's names and type ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    /// 16 non-uniform levels (`kvalues_iq4nl`) under an f16 scale per 32 values.
    Iq4Nl,
    /// OCP's MXFP4: E2M1 values (ggml stores them doubled, as levels) under a power-of-two
    /// (E8M0) scale per 32 values.
    Mxfp4,
}

impl QuantType {
    pub const ALL: [QuantType; 12] = [
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Iq4Nl,
        Self::Mxfp4,
    ];

    /// ggml's name (`Q4_K`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "Q8_0",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Iq4Nl => "IQ4_NL",
            Self::Mxfp4 => "MXFP4",
        }
    }

    /// ggml's type id (`ggml_type`), as GGUF stores it.
    pub const fn ggml_id(self) -> u32 {
        match self {
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2K => 10,
            Self::Q3K => 11,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::Iq4Nl => 20,
            Self::Mxfp4 => 39,
        }
    }

    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// Values per block: 32, or 256 for the K-quants.
    pub fn block_values(self) -> usize {
        if self.is_k() { 256 } else { 32 }
    }

    /// Bytes per block in ggml's layout.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 34,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q2K => 84,
            Self::Q3K => 110,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Iq4Nl => 18,
            Self::Mxfp4 => 17,
        }
    }

    /// Byte offsets of the f16 fields of a block in ggml's layout: its scale (`d`) and, where
    /// it has one, its minimum (`m` or `dmin`). MXFP4 has none: its scale is the E8M0 byte 0.
    pub fn f16_fields(self) -> &'static [usize] {
        match self {
            Self::Q8_0 | Self::Q4_0 | Self::Q5_0 | Self::Iq4Nl => &[0],
            Self::Mxfp4 => &[],
            Self::Q4_1 | Self::Q5_1 | Self::Q4K | Self::Q5K => &[0, 2],
            Self::Q2K => &[80, 82],
            Self::Q3K => &[108],
            Self::Q6K => &[208],
        }
    }

    pub fn is_k(self) -> bool {
        matches!(self, Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K)
    }

    /// Whether each 16-value sub-block has its own scale (Q2_K, Q3_K, Q6_K), not each 32-value
    /// group.
    pub(crate) fn sub_blocks(self) -> bool {
        matches!(self, Self::Q2K | Self::Q3K | Self::Q6K)
    }

    /// For a K-quant, the 32-value format llama.cpp stores a tensor in when its rows are not
    /// whole 256-value blocks (`llama-quantize`'s fallback): Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0
    /// for Q6_K, Q4_0 for Q2_K and Q3_K.
    pub fn k_fallback(self) -> Option<Self> {
        match self {
            Self::Q2K | Self::Q3K => Some(Self::Q4_0),
            Self::Q4K => Some(Self::Q5_0),
            Self::Q5K => Some(Self::Q5_1),
            Self::Q6K => Some(Self::Q8_0),
            _ => None,
        }
    }

    /// Bits of each stored value.
    pub(crate) fn bits(self) -> usize {
        match self {
            Self::Q8_0 => 8,
            Self::Q2K => 2,
            Self::Q3K => 3,
            Self::Q4_0 | Self::Q4_1 | Self::Q4K | Self::Iq4Nl | Self::Mxfp4 => 4,
            Self::Q5_0 | Self::Q5_1 | Self::Q5K => 5,
            Self::Q6K => 6,
        }
    }

    /// Where a 4-bit value (the nibble) stands for a level, not for itself (IQ4_NL, MXFP4:
    /// `w = d · level`), each nibble's level + 128 as an unsigned byte: the kernels look them up
    /// and take them as Q8_0's values (`d · (q − 128)`).
    pub(crate) fn lookup(self) -> Option<&'static [u8; 16]> {
        const fn biased(levels: [i8; 16]) -> [u8; 16] {
            let mut out = [0u8; 16];
            let mut i = 0;
            while i < 16 {
                out[i] = (levels[i] as i16 + 128) as u8;
                i += 1;
            }
            out
        }
        const IQ4: [u8; 16] = biased(ggml::IQ4_LEVELS);
        const MXFP4: [u8; 16] = biased(ggml::MXFP4_LEVELS);
        match self {
            Self::Iq4Nl => Some(&IQ4),
            Self::Mxfp4 => Some(&MXFP4),
            _ => None,
        }
    }

    /// Whether a row of `k` values can be stored in this format (whole blocks only).
    pub fn fits_row(self, k: usize) -> bool {
        k > 0 && k.is_multiple_of(self.block_values())
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for QuantType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s) || t.name().replace('_', "").eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown quantized type `{s}`"))
    }
}

/// Deterministic pseudo-random values in [-1, 1) for the tests of this module.
#[cfg(test)]
pub(crate) fn test_values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
