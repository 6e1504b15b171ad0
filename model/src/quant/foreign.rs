//! A ggml format a GGUF file may hold that llaisys's kernels do not compute in: IQ4_XS (many
//! publishers' 4-bit files). It is dequantized exactly as ggml does (`dequantize`), and
//! converted at load to the format the kernels run (`convert`, the format `target` names):
//! IQ4_NL, keeping every nibble, each 32-value group's scale `d · (ls − 32)` rounded to f16
//! (relative error at most 2⁻¹¹ per group, exact where the scale is an f16). IQ4_XS's 4.25 bits
//! a weight become IQ4_NL's 4.5.

use half::f16;
use rayon::prelude::*;

use super::QuantType;
use super::ggml::IQ4_LEVELS;

/// A ggml format converted at load (ggml's names and type ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Foreign {
    Iq4Xs,
}

/// Blocks converted per rayon task.
const BLOCKS_PER_TASK: usize = 256;

impl Foreign {
    pub const ALL: [Foreign; 1] = [Self::Iq4Xs];

    /// ggml's name (`IQ4_XS`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Iq4Xs => "IQ4_XS",
        }
    }

    /// ggml's type id, as GGUF stores it.
    pub const fn ggml_id(self) -> u32 {
        match self {
            Self::Iq4Xs => 23,
        }
    }

    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            Self::Iq4Xs => 256,
        }
    }

    /// Bytes per block in ggml's layout.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Iq4Xs => 136,
        }
    }

    /// Whether a row of `k` values can be stored in this format (whole blocks only).
    pub fn fits_row(self, k: usize) -> bool {
        k > 0 && k.is_multiple_of(self.block_values())
    }

    /// The format the kernels run this one's tensors in.
    pub fn target(self) -> QuantType {
        match self {
            Self::Iq4Xs => QuantType::Iq4Nl,
        }
    }

    /// What `convert` changes, for the load's log.
    pub fn how(self) -> &'static str {
        match self {
            Self::Iq4Xs => "scales rounded to f16",
        }
    }

    /// Dequantizes whole blocks with ggml's arithmetic: `bytes` holds `out.len() / block_values`
    /// blocks. `None` (and `out` unspecified) where the lengths do not agree.
    pub fn dequantize(self, bytes: &[u8], out: &mut [f32]) -> Option<()> {
        let (bv, bb) = (self.block_values(), self.block_bytes());
        if !out.len().is_multiple_of(bv) || bytes.len() != out.len() / bv * bb {
            return None;
        }
        for (b, out) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bv)) {
            for (g, out) in out.chunks_exact_mut(32).enumerate() {
                let dl = iq4xs_scale(b, g);
                let qs = &b[8 + 16 * g..24 + 16 * g];
                for (v, o) in out.iter_mut().enumerate() {
                    let nibble = if v < 16 { qs[v] & 0x0f } else { qs[v - 16] >> 4 };
                    *o = dl * IQ4_LEVELS[nibble as usize] as f32;
                }
            }
        }
        Some(())
    }

    /// Whole blocks of this format as blocks of `target()`, the same number of values, in tasks
    /// of 256 blocks over the rayon pool; `None` where `bytes` is not whole blocks.
    pub fn convert(self, bytes: &[u8]) -> Option<Vec<u8>> {
        let bb = self.block_bytes();
        if !bytes.len().is_multiple_of(bb) {
            return None;
        }
        let t = self.target();
        let tasks: Vec<Vec<u8>> = bytes
            .par_chunks(BLOCKS_PER_TASK * bb)
            .map(|blocks| {
                let n = blocks.len() / bb * self.block_values();
                let mut out = Vec::with_capacity(n / t.block_values() * t.block_bytes());
                for b in blocks.chunks_exact(bb) {
                    // Each 32-value group an IQ4_NL block: its scale, then its 16 nibble bytes.
                    for g in 0..8 {
                        out.extend_from_slice(&f16::from_f32(iq4xs_scale(b, g)).to_le_bytes());
                        out.extend_from_slice(&b[8 + 16 * g..24 + 16 * g]);
                    }
                }
                out
            })
            .collect();
        Some(tasks.concat())
    }
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A block of MXFP4 from the layout of OpenAI's checkpoints (`*_blocks`, `*_scales`): `scale`
/// (E8M0) and 16 bytes holding value 2i in byte i's low nibble and 2i + 1 in its high one; in
/// ggml's layout, `e` then value v in byte v's low nibble and v + 16 in byte v's high one.
pub fn mxfp4_from_pairs(scale: u8, pairs: &[u8; 16]) -> [u8; 17] {
    let value = |v: usize| (pairs[v / 2] >> (4 * (v % 2))) & 0x0f;
    let mut block = [0u8; 17];
    block[0] = scale;
    for v in 0..16 {
        block[1 + v] = value(v) | (value(v + 16) << 4);
    }
    block
}

/// IQ4_XS (`d scales_h:u16 scales_l[4] qs[128]`): group g's scale `d · (ls − 32)`, ls's low four
/// bits in nibble g % 2 of `scales_l[g / 2]`, its top two at bits 2g of `scales_h`.
fn iq4xs_scale(b: &[u8], g: usize) -> f32 {
    let high = u16::from_le_bytes([b[2], b[3]]);
    let ls = ((b[4 + g / 2] >> (4 * (g % 2))) & 0x0f) as i32 | ((((high >> (2 * g)) & 3) as i32) << 4);
    f16::from_le_bytes([b[0], b[1]]).to_f32() * (ls - 32) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// Random IQ4_XS blocks with finite scales.
    fn random_blocks(n: usize, seed: u64) -> Vec<u8> {
        let ty = Foreign::Iq4Xs;
        let values = crate::quant::test_values(n * ty.block_bytes(), seed);
        let mut bytes: Vec<u8> = values.iter().map(|v| ((v + 1.0) * 128.0) as u8).collect();
        for (i, block) in bytes.chunks_exact_mut(ty.block_bytes()).enumerate() {
            let d = f16::from_f32(0.001 + 0.0007 * (i % 13) as f32);
            block[..2].copy_from_slice(&d.to_le_bytes());
        }
        bytes
    }

    /// IQ4_XS becomes IQ4_NL with every nibble kept and each weight within its group scale's
    /// f16 rounding.
    #[test]
    fn conversions_keep_the_weights() {
        let ty = Foreign::Iq4Xs;
        let n = 6;
        let bytes = random_blocks(n, 23);
        let mut want = vec![0.0f32; n * ty.block_values()];
        ty.dequantize(&bytes, &mut want).unwrap();
        let converted = ty.convert(&bytes).unwrap();
        assert_eq!(converted.len(), want.len() / 32 * QuantType::Iq4Nl.block_bytes());
        let mut got = vec![0.0f32; want.len()];
        dequantize(ty.target(), &converted, &mut got);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= w.abs() * 2f32.powi(-11), "{g} for {w}");
        }
        assert_eq!(converted[2..18], bytes[8..24], "the first group's nibbles as they were");
    }

    /// OpenAI's layout (value 2i low, 2i + 1 high in byte i; transformers' `convert_moe_packed_tensors`
    /// reads it so) in ggml's MXFP4, dequantized: E2M1's values times 2^(e − 127), for scales in
    /// and below f16's range alike.
    #[test]
    fn openai_mxfp4_blocks_read_as_transformers_reads_them() {
        const E2M1: [f32; 16] =
            [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        let nibbles: Vec<u8> = (0..32u8).map(|v| (v * 7 + 3) % 16).collect();
        let pairs: [u8; 16] = std::array::from_fn(|i| nibbles[2 * i] | (nibbles[2 * i + 1] << 4));
        for e in [2u8, 100, 119, 127, 140, 254] {
            let block = mxfp4_from_pairs(e, &pairs);
            let mut got = [0.0f32; 32];
            dequantize(QuantType::Mxfp4, &block, &mut got);
            let scale = 2f64.powi(e as i32 - 127);
            let want: Vec<f32> = nibbles.iter().map(|&n| (E2M1[n as usize] as f64 * scale) as f32).collect();
            assert_eq!(got.to_vec(), want, "scale 2^{}", e as i32 - 127);
        }
    }

    /// Bytes that are not whole blocks are refused, never read past.
    #[test]
    fn partial_blocks_are_refused() {
        for ty in Foreign::ALL {
            let bytes = vec![0u8; ty.block_bytes() + 1];
            assert!(ty.convert(&bytes).is_none(), "{ty}");
            let mut out = vec![0.0f32; ty.block_values()];
            assert!(ty.dequantize(&bytes, &mut out).is_none(), "{ty}");
        }
    }
}
