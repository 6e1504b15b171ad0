//! ggml formats a GGUF file may hold that llaisys's kernels do not compute in: IQ4_XS (many
//! publishers' 4-bit files), IQ4_NL (its fallback, and Q2_K's and Q3_K's, for rows that are
//! not whole 256-value blocks) and MXFP4 (gpt-oss's experts). Each is dequantized exactly as
//! ggml does (`dequantize`), and converted at load to a format the kernels run (`convert`, the
//! format `target` names):
//!
//! - IQ4_NL → Q8_0, exactly: its 16 levels are signed bytes, its scale is Q8_0's.
//! - IQ4_XS → Q8_0: the levels as IQ4_NL's, each 32-value block's scale `d · (ls − 32)` rounded
//!   to f16 (relative error at most 2⁻¹¹ per block, exact where the scale is an f16).
//! - MXFP4 → Q5_0, exactly wherever a block's scale is an f16 (2⁻²⁴ to 2¹⁵; a block whose scale
//!   is below that holds values under 4·10⁻⁷, rounded to f16's smallest steps): E2M1's values
//!   are ggml's levels {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12} times 2^(e − 128), and level + 16 is one
//!   of Q5_0's 5-bit values (q − 16) under the scale 2^(e − 128).
//!
//! The targets take more memory than the file (IQ4_XS 4.25 bits a weight → Q8_0 8.5, MXFP4 4.25
//! → Q5_0 5.5): the file's model, runnable, at a larger size. OpenAI's checkpoints keep MXFP4
//! blocks in a layout of their own ([`mxfp4_from_pairs`] puts a block in ggml's).

use half::f16;
use rayon::prelude::*;

use super::QuantType;

/// A ggml format converted at load (ggml's names and type ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Foreign {
    Iq4Nl,
    Iq4Xs,
    Mxfp4,
}

/// IQ4_NL's and IQ4_XS's 16 levels (`kvalues_iq4nl`).
const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4's E2M1 values doubled, by nibble (`kvalues_mxfp4`; the sign in bit 3).
const MXFP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Blocks converted per rayon task.
const BLOCKS_PER_TASK: usize = 256;

impl Foreign {
    pub const ALL: [Foreign; 3] = [Self::Iq4Nl, Self::Iq4Xs, Self::Mxfp4];

    /// ggml's name (`Q3_K`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Iq4Nl => "IQ4_NL",
            Self::Iq4Xs => "IQ4_XS",
            Self::Mxfp4 => "MXFP4",
        }
    }

    /// ggml's type id, as GGUF stores it.
    pub const fn ggml_id(self) -> u32 {
        match self {
            Self::Iq4Nl => 20,
            Self::Iq4Xs => 23,
            Self::Mxfp4 => 39,
        }
    }

    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// Values per block: 32 for IQ4_NL and MXFP4, 256 for IQ4_XS.
    pub fn block_values(self) -> usize {
        match self {
            Self::Iq4Nl | Self::Mxfp4 => 32,
            Self::Iq4Xs => 256,
        }
    }

    /// Bytes per block in ggml's layout.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Iq4Nl => 18,
            Self::Iq4Xs => 136,
            Self::Mxfp4 => 17,
        }
    }

    /// Whether a row of `k` values can be stored in this format (whole blocks only).
    pub fn fits_row(self, k: usize) -> bool {
        k > 0 && k.is_multiple_of(self.block_values())
    }

    /// The format the kernels run this one's tensors in.
    pub fn target(self) -> QuantType {
        match self {
            Self::Iq4Nl | Self::Iq4Xs => QuantType::Q8_0,
            Self::Mxfp4 => QuantType::Q5_0,
        }
    }

    /// Whether `convert` gives every weight bit-identical (MXFP4's: where its scales are f16s).
    pub fn exact(self) -> bool {
        matches!(self, Self::Iq4Nl | Self::Mxfp4)
    }

    /// Dequantizes whole blocks with ggml's arithmetic: `bytes` holds `out.len() / block_values`
    /// blocks. `None` (and `out` unspecified) where the lengths do not agree.
    pub fn dequantize(self, bytes: &[u8], out: &mut [f32]) -> Option<()> {
        let (bv, bb) = (self.block_values(), self.block_bytes());
        if !out.len().is_multiple_of(bv) || bytes.len() != out.len() / bv * bb {
            return None;
        }
        for (b, out) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bv)) {
            match self {
                Self::Iq4Nl => {
                    let d = f16_at(b, 0);
                    for (v, o) in out.iter_mut().enumerate() {
                        *o = d * iq4_level(&b[2..18], v) as f32;
                    }
                }
                Self::Iq4Xs => {
                    for (g, out) in out.chunks_exact_mut(32).enumerate() {
                        let dl = iq4xs_scale(b, g);
                        for (v, o) in out.iter_mut().enumerate() {
                            *o = dl * iq4_level(&b[8 + 16 * g..24 + 16 * g], v) as f32;
                        }
                    }
                }
                Self::Mxfp4 => {
                    let d = e8m0_half(b[0]);
                    for (v, o) in out.iter_mut().enumerate() {
                        *o = d * MXFP4_LEVELS[nibble(&b[1..17], v) as usize] as f32;
                    }
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
                self.convert_blocks(blocks, &mut out);
                out
            })
            .collect();
        Some(tasks.concat())
    }

    /// Appends whole `blocks` in `target()`'s layout.
    fn convert_blocks(self, blocks: &[u8], out: &mut Vec<u8>) {
        let bb = self.block_bytes();
        match self {
            Self::Iq4Nl => blocks.chunks_exact(bb).for_each(|b| write_q8_0(&b[0..2], &b[2..18], out)),
            Self::Iq4Xs => {
                for b in blocks.chunks_exact(bb) {
                    for g in 0..8 {
                        let d = f16::from_f32(iq4xs_scale(b, g)).to_le_bytes();
                        write_q8_0(&d, &b[8 + 16 * g..24 + 16 * g], out);
                    }
                }
            }
            Self::Mxfp4 => blocks.chunks_exact(bb).for_each(|b| write_q5_0(b, out)),
        }
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

/// E8M0 scale `e` halved, 2^(e − 128), as ggml computes it (`ggml_e8m0_to_fp32_half`).
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e as u32) - 1) << 23 };
    f32::from_bits(bits)
}

/// The nibble of value v of a 32-value group (`qs`: 16 bytes, v in the low nibble of byte v,
/// v + 16 in the high one).
fn nibble(qs: &[u8], v: usize) -> u8 {
    if v < 16 { qs[v] & 0x0f } else { qs[v - 16] >> 4 }
}

/// Appends an MXFP4 block (ggml's layout) as a Q5_0 block: scale 2^(e − 128) as an f16, each
/// value's level + 16 as its 5-bit value (the low four bits in `qs` as MXFP4 has its nibbles,
/// the fifth in `qh`).
fn write_q5_0(block: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&f16::from_f32(e8m0_half(block[0])).to_le_bytes());
    let q = |v: usize| (MXFP4_LEVELS[nibble(&block[1..17], v) as usize] + 16) as u8;
    let qh: u32 = (0..32).map(|v| u32::from(q(v) >> 4) << v).sum();
    out.extend_from_slice(&qh.to_le_bytes());
    out.extend((0..16).map(|v| (q(v) & 0x0f) | ((q(v + 16) & 0x0f) << 4)));
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Level of value v of a 32-value IQ4 group (`qs` as [`nibble`] reads it).
fn iq4_level(qs: &[u8], v: usize) -> i8 {
    IQ4_LEVELS[nibble(qs, v) as usize]
}

/// IQ4_XS (`d scales_h:u16 scales_l[4] qs[128]`): group g's scale `d · (ls − 32)`, ls's low four
/// bits in nibble g % 2 of `scales_l[g / 2]`, its top two at bits 2g of `scales_h`.
fn iq4xs_scale(b: &[u8], g: usize) -> f32 {
    let high = u16::from_le_bytes([b[2], b[3]]);
    let ls = ((b[4 + g / 2] >> (4 * (g % 2))) & 0x0f) as i32 | ((((high >> (2 * g)) & 3) as i32) << 4);
    f16_at(b, 0) * (ls - 32) as f32
}

/// Appends a Q8_0 block: the f16 scale's bytes and the levels of 16 IQ4 nibble bytes.
fn write_q8_0(d: &[u8], qs: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(d);
    out.extend((0..32).map(|v| iq4_level(qs, v) as u8));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// Random blocks of `ty` with finite scales (every f16 field in ggml's layout set).
    fn random_blocks(ty: Foreign, n: usize, seed: u64) -> Vec<u8> {
        let values = crate::quant::test_values(n * ty.block_bytes(), seed);
        let mut bytes: Vec<u8> = values.iter().map(|v| ((v + 1.0) * 128.0) as u8).collect();
        for (i, block) in bytes.chunks_exact_mut(ty.block_bytes()).enumerate() {
            match ty {
                // Every scale an f16 holds, 2⁻²⁴ to 2¹⁵.
                Foreign::Mxfp4 => block[0] = 104 + (i % 40) as u8,
                _ => {
                    let d = f16::from_f32(0.001 + 0.0007 * (i % 13) as f32);
                    block[..2].copy_from_slice(&d.to_le_bytes());
                }
            }
        }
        bytes
    }

    /// IQ4_NL and MXFP4 become their targets with every weight bit-identical; IQ4_XS within its
    /// scales' f16 rounding.
    #[test]
    fn conversions_keep_the_weights() {
        for ty in Foreign::ALL {
            let n = 512 / ty.block_values() * 3;
            let bytes = random_blocks(ty, n, ty.ggml_id() as u64);
            let mut want = vec![0.0f32; n * ty.block_values()];
            ty.dequantize(&bytes, &mut want).unwrap();
            let converted = ty.convert(&bytes).unwrap();
            assert_eq!(converted.len(), want.len() / ty.target().block_values() * ty.target().block_bytes(), "{ty}");
            let mut got = vec![0.0f32; want.len()];
            dequantize(ty.target(), &converted, &mut got);
            match ty {
                Foreign::Iq4Nl | Foreign::Mxfp4 => {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{ty}");
                }
                Foreign::Iq4Xs => {
                    for (g, w) in got.iter().zip(&want) {
                        assert!((g - w).abs() <= w.abs() * 2f32.powi(-11), "{ty}: {g} for {w}");
                    }
                }
            }
        }
    }

    /// OpenAI's layout (value 2i low, 2i + 1 high in byte i; transformers' `convert_moe_packed_tensors`
    /// reads it so) in ggml's, dequantized: E2M1's values times 2^(e − 127); a scale below f16's
    /// range converts to Q5_0 as zeros' worth (under 4·10⁻⁷).
    #[test]
    fn openai_mxfp4_blocks_read_as_transformers_reads_them() {
        const E2M1: [f32; 16] =
            [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        let nibbles: Vec<u8> = (0..32u8).map(|v| (v * 7 + 3) % 16).collect();
        let pairs: [u8; 16] = std::array::from_fn(|i| nibbles[2 * i] | (nibbles[2 * i + 1] << 4));
        for e in [100u8, 119, 127, 140] {
            let block = mxfp4_from_pairs(e, &pairs);
            let mut got = [0.0f32; 32];
            Foreign::Mxfp4.dequantize(&block, &mut got).unwrap();
            let scale = 2f32.powi(e as i32 - 127);
            let want: Vec<f32> = nibbles.iter().map(|&n| E2M1[n as usize] * scale).collect();
            assert_eq!(got.to_vec(), want, "scale 2^{}", e as i32 - 127);
            let mut q5 = [0.0f32; 32];
            dequantize(QuantType::Q5_0, &Foreign::Mxfp4.convert(&block).unwrap(), &mut q5);
            for (g, w) in q5.iter().zip(&want) {
                let exact = e >= 104;
                assert!(if exact { g == w } else { (g - w).abs() < 4e-7 }, "scale 2^{}: {g} for {w}", e as i32 - 127);
            }
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
