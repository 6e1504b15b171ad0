//! ggml's block formats as a GGUF file stores them (`ggml-common.h`), decoded into unsigned
//! values plus the parameters that turn them into weights, and dequantized with exactly ggml's
//! arithmetic (the same f32 operations in the same order as the PyPI `gguf` package's
//! `quants.dequantize`, so the results are bit-identical).

use half::f16;

use super::QuantType;

/// IQ4_NL's (and IQ4_XS's) 16 levels (`kvalues_iq4nl`).
pub(crate) const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4's E2M1 values doubled, by nibble (`kvalues_mxfp4`; the sign in bit 3).
pub(crate) const MXFP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// E8M0 scale `e` halved, 2^(e − 128), as ggml computes it (`ggml_e8m0_to_fp32_half`): the
/// doubled levels' scale.
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e as u32) - 1) << 23 };
    f32::from_bits(bits)
}

/// The scale of a block of levels: IQ4_NL's f16, MXFP4's E8M0 byte.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum LevelScale {
    F16(f16),
    E8m0(u8),
}

impl LevelScale {
    pub fn to_f32(self) -> f32 {
        match self {
            Self::F16(d) => d.to_f32(),
            Self::E8m0(e) => e8m0_half(e),
        }
    }
}

/// How a block's unsigned values become weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Params {
    /// `w = d · (q − offset)` (Q8_0: 128, Q4_0: 8, Q5_0: 16).
    Offset { d: f16, offset: u8 },
    /// `w = d · q + m` (Q4_1, Q5_1).
    Min { d: f16, m: f16 },
    /// `w = (d · sc[g]) · q − (dmin · m[g])` for 32-value group g (Q4_K, Q5_K).
    KMin { d: f16, dmin: f16, sc: [u8; 8], m: [u8; 8] },
    /// `w = (d · sc[h]) · q − (dmin · m[h])` for 16-value sub-block h (Q2_K).
    KMin16 { d: f16, dmin: f16, sc: [u8; 16], m: [u8; 16] },
    /// `w = (d · sc[h]) · (q − offset)` for 16-value sub-block h (Q6_K: 32, Q3_K: 4).
    KSigned { d: f16, sc: [i8; 16], offset: u8 },
    /// `w = d · levels[q]`, q a nibble (IQ4_NL, MXFP4).
    Levels { d: LevelScale, levels: &'static [i8; 16] },
}

/// One block: its values as unsigned integers (`q[..block_values]`; Q8_0's are `q + 128`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decoded {
    pub q: [u8; 256],
    pub params: Params,
}

fn f16_at(b: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([b[at], b[at + 1]])
}

/// The 6-bit scales and mins of a Q4_K / Q5_K block from their 12 packed bytes.
fn k_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3f;
        m[j] = s[j + 4] & 0x3f;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, m)
}

/// Decodes one block of `ty` from its `ty.block_bytes()` bytes.
pub(crate) fn decode(ty: QuantType, b: &[u8]) -> Decoded {
    debug_assert_eq!(b.len(), ty.block_bytes());
    let mut q = [0u8; 256];
    // 32-value blocks: 16 bytes of nibbles, value i in the low nibble of byte i, value i + 16 in
    // the high nibble; Q5's fifth bits in a little-endian u32, bit i for value i.
    let nibbles = |q: &mut [u8; 256], qs: &[u8]| {
        for i in 0..16 {
            q[i] = qs[i] & 0x0f;
            q[i + 16] = qs[i] >> 4;
        }
    };
    let fifth = |q: &mut [u8; 256], qh: &[u8]| {
        let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        for (i, v) in q.iter_mut().take(32).enumerate() {
            *v |= (((bits >> i) & 1) as u8) << 4;
        }
    };
    let params = match ty {
        QuantType::Q8_0 => {
            for i in 0..32 {
                q[i] = b[2 + i] ^ 0x80;
            }
            Params::Offset { d: f16_at(b, 0), offset: 128 }
        }
        QuantType::Q4_0 => {
            nibbles(&mut q, &b[2..18]);
            Params::Offset { d: f16_at(b, 0), offset: 8 }
        }
        QuantType::Q4_1 => {
            nibbles(&mut q, &b[4..20]);
            Params::Min { d: f16_at(b, 0), m: f16_at(b, 2) }
        }
        QuantType::Q5_0 => {
            nibbles(&mut q, &b[6..22]);
            fifth(&mut q, &b[2..6]);
            Params::Offset { d: f16_at(b, 0), offset: 16 }
        }
        QuantType::Q5_1 => {
            nibbles(&mut q, &b[8..24]);
            fifth(&mut q, &b[4..8]);
            Params::Min { d: f16_at(b, 0), m: f16_at(b, 2) }
        }
        QuantType::Q4K | QuantType::Q5K => {
            // 128 bytes of nibbles in four 32-byte chunks: chunk c holds values 64c.. in its low
            // nibbles and 64c + 32.. in its high ones. Q5_K: 32 bytes of fifth bits before them,
            // bit j of byte i for value 32j + i.
            let qs = if ty == QuantType::Q4K { &b[16..144] } else { &b[48..176] };
            for c in 0..4 {
                for i in 0..32 {
                    q[64 * c + i] = qs[32 * c + i] & 0x0f;
                    q[64 * c + 32 + i] = qs[32 * c + i] >> 4;
                }
            }
            if ty == QuantType::Q5K {
                let qh = &b[16..48];
                for (v, q) in q.iter_mut().enumerate() {
                    *q |= ((qh[v % 32] >> (v / 32)) & 1) << 4;
                }
            }
            let (sc, m) = k_scales(&b[4..16]);
            Params::KMin { d: f16_at(b, 0), dmin: f16_at(b, 2), sc, m }
        }
        QuantType::Q2K => {
            // scales[16] (sub-block h's scale in the low nibble of byte h, its min in the high
            // one), qs[64], d, dmin: value 128n + 32j + l's two bits at bits 2j of qs[32n + l].
            for (v, q) in q.iter_mut().enumerate() {
                let (n, j, l) = (v / 128, (v % 128) / 32, v % 32);
                *q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
            }
            let sc = std::array::from_fn(|h| b[h] & 0x0f);
            let m = std::array::from_fn(|h| b[h] >> 4);
            Params::KMin16 { d: f16_at(b, 80), dmin: f16_at(b, 82), sc, m }
        }
        QuantType::Q3K => {
            // hmask[32], qs[64], scales[12], d: value v = 128n + 32j + l (0..8) has its low two
            // bits at bits 2j of qs[32n + l], its third at bit 4n + j of hmask[l]. Sub-block h's
            // 6-bit scale (less 32): its low four bits in the low (h < 8) or high nibble of
            // scales[h % 8], its top two at bits 2(h / 4) of scales[8 + h % 4].
            for (v, q) in q.iter_mut().enumerate() {
                let (n, j, l) = (v / 128, (v % 128) / 32, v % 32);
                *q = ((b[32 + 32 * n + l] >> (2 * j)) & 3) | (((b[l] >> (4 * n + j)) & 1) << 2);
            }
            let s = &b[96..108];
            let sc = std::array::from_fn(|h| {
                let low = if h < 8 { s[h] & 0x0f } else { s[h - 8] >> 4 };
                ((low | (((s[8 + h % 4] >> (2 * (h / 4))) & 3) << 4)) as i8) - 32
            });
            Params::KSigned { d: f16_at(b, 108), sc, offset: 4 }
        }
        QuantType::Q6K => {
            // ql: 128 bytes in two halves of 64: half h holds values 128h.. in its low nibbles
            // and 128h + 64.. in its high ones. qh: 64 bytes in two halves of 32: bits 2s..2s+2
            // of byte i of half h are the top bits of value 128h + 32s + i.
            let (ql, qh) = (&b[0..128], &b[128..192]);
            for h in 0..2 {
                for i in 0..64 {
                    q[128 * h + i] = ql[64 * h + i] & 0x0f;
                    q[128 * h + 64 + i] = ql[64 * h + i] >> 4;
                }
                for s in 0..4 {
                    for i in 0..32 {
                        q[128 * h + 32 * s + i] |= ((qh[32 * h + i] >> (2 * s)) & 3) << 4;
                    }
                }
            }
            let mut sc = [0i8; 16];
            for (s, &byte) in sc.iter_mut().zip(&b[192..208]) {
                *s = byte as i8;
            }
            Params::KSigned { d: f16_at(b, 208), sc, offset: 32 }
        }
        QuantType::Iq4Nl => {
            nibbles(&mut q, &b[2..18]);
            Params::Levels { d: LevelScale::F16(f16_at(b, 0)), levels: &IQ4_LEVELS }
        }
        QuantType::Mxfp4 => {
            nibbles(&mut q, &b[1..17]);
            Params::Levels { d: LevelScale::E8m0(b[0]), levels: &MXFP4_LEVELS }
        }
    };
    Decoded { q, params }
}

/// Weight `i` of a decoded block, with ggml's arithmetic.
#[inline]
pub(crate) fn weight(q: u8, params: &Params, i: usize) -> f32 {
    match *params {
        Params::Offset { d, offset } => d.to_f32() * (q as i32 - offset as i32) as f32,
        Params::Min { d, m } => d.to_f32() * q as f32 + m.to_f32(),
        Params::KMin { d, dmin, sc, m } => {
            let g = i / 32;
            d.to_f32() * sc[g] as f32 * q as f32 - dmin.to_f32() * m[g] as f32
        }
        Params::KMin16 { d, dmin, sc, m } => {
            let h = i / 16;
            d.to_f32() * sc[h] as f32 * q as f32 - dmin.to_f32() * m[h] as f32
        }
        Params::KSigned { d, sc, offset } => d.to_f32() * sc[i / 16] as f32 * (q as i32 - offset as i32) as f32,
        Params::Levels { d, levels } => d.to_f32() * levels[q as usize] as f32,
    }
}

/// Bytes of one row of `k` values in `ty`'s layout. Precondition: `ty.fits_row(k)`.
pub fn row_bytes(ty: QuantType, k: usize) -> usize {
    k / ty.block_values() * ty.block_bytes()
}

/// Dequantizes whole blocks of `ty`: `bytes` holds `out.len() / block_values` blocks.
pub fn dequantize(ty: QuantType, bytes: &[u8], out: &mut [f32]) {
    let (bv, bb) = (ty.block_values(), ty.block_bytes());
    assert!(
        out.len().is_multiple_of(bv) && bytes.len() == out.len() / bv * bb,
        "dequantize {ty}: {} bytes for {} values",
        bytes.len(),
        out.len()
    );
    for (block, out) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bv)) {
        let d = decode(ty, block);
        for (i, o) in out.iter_mut().enumerate() {
            *o = weight(d.q[i], &d.params, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q8_0 round trip by hand: d = 0.5, values −4..: w = 0.5 · q.
    #[test]
    fn q8_0_blocks_dequantize_as_d_times_q() {
        let mut block = vec![0u8; 34];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        for i in 0..32 {
            block[2 + i] = (i as i8 - 4) as u8;
        }
        let mut out = [0.0f32; 32];
        dequantize(QuantType::Q8_0, &block, &mut out);
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, 0.5 * (i as f32 - 4.0));
        }
    }

    /// The 6-bit K scales: the low four come straight from bytes 0..8, the high four are split
    /// between byte 8.. (low bits) and the top two bits of bytes 0..8.
    #[test]
    fn k_scales_unpack_six_bit_fields() {
        let s = [1, 2, 3, 0xC4, 5, 6, 7, 0x48, 0x21, 0x43, 0x65, 0x87];
        let (sc, m) = k_scales(&s);
        assert_eq!(sc, [1, 2, 3, 4, 1, 3, 5, 0x37]);
        assert_eq!(m, [5, 6, 7, 8, 2, 4, 6, 0x18]);
    }
}
