//! Q4: f32 values to ggml's block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and the 256-value
//! K-quants Q4_K, Q5_K, Q6_K), for quantizing a checkpoint at load or a replaced weight.
//!
//! ggml's reference quantizers take the scale from the block's extreme value. Here each block
//! (each 32- or 16-value group of a K-quant block) tries a range of scales around that one and
//! keeps the scale (and, for Q4_1 / Q5_1 / Q4_K / Q5_K, the offset) whose values give the
//! smallest squared error, refined by a least-squares fit of the scale to the chosen integers
//! (what llama.cpp's `make_qx_quants` does for its importance-weighted quantizers). A K-quant
//! block then rounds its groups' scales to integers of one f16 super-scale (6 bits, or 8 signed
//! for Q6_K), tries the neighbours of each rounded scale and offset, and quantizes the values
//! again with the scales as stored.

use half::f16;
use rayon::prelude::*;

use super::QuantType;

/// Blocks a task of the rayon pool quantizes.
const BLOCKS_PER_TASK: usize = 256;

/// Quantizes `values` (a whole number of `ty`'s blocks) into its ggml layout, appended to `out`,
/// in tasks of 256 blocks over the rayon pool. `None` where the values are not
/// whole blocks.
pub fn quantize(ty: QuantType, values: &[f32], out: &mut Vec<u8>) -> Option<()> {
    if !values.len().is_multiple_of(ty.block_values()) {
        return None;
    }
    let tasks: Vec<Vec<u8>> = values
        .par_chunks(ty.block_values() * BLOCKS_PER_TASK)
        .map(|values| {
            let mut out = Vec::with_capacity(values.len() / ty.block_values() * ty.block_bytes());
            blocks(ty, values, &mut out);
            out
        })
        .collect();
    out.reserve(tasks.iter().map(Vec::len).sum());
    tasks.iter().for_each(|t| out.extend_from_slice(t));
    Some(())
}

/// `v` clamped to `[lo, hi]` and rounded to the nearest integer (ties to even), in inline
/// arithmetic: `f32::round` is a libm call on the baseline x86-64 target, a third of the
/// quantizer's time.
#[inline]
fn round_in(v: f32, lo: f32, hi: f32) -> f32 {
    // Adding 1.5 · 2^23 leaves no bits below the units (|v| < 2^22 after the clamp).
    const MAGIC: f32 = 12_582_912.0;
    (v.clamp(lo, hi) + MAGIC) - MAGIC
}

/// [`quantize`] on one task's whole blocks.
fn blocks(ty: QuantType, values: &[f32], out: &mut Vec<u8>) {
    if ty.is_k() {
        for block in values.chunks_exact(256) {
            let block: &[f32; 256] = block.try_into().expect("chunks of 256");
            match ty {
                QuantType::Q6K => k6_block(block, out),
                _ => kmin_block(block, ty, out),
            }
        }
        return;
    }
    for block in values.chunks_exact(32) {
        let block: &[f32; 32] = block.try_into().expect("chunks of 32");
        match ty {
            QuantType::Q8_0 => {
                let (d, q) = symmetric(block, 127, 127);
                out.extend_from_slice(&d.to_le_bytes());
                out.extend(q.iter().map(|&q| q as i8 as u8));
            }
            QuantType::Q4_0 | QuantType::Q5_0 => {
                let half = if ty == QuantType::Q4_0 { 8 } else { 16 };
                let (d, q) = symmetric(block, half, half - 1);
                let q = q.map(|q| (q + half) as u8);
                out.extend_from_slice(&d.to_le_bytes());
                if ty == QuantType::Q5_0 {
                    out.extend_from_slice(&fifth_bits(&q));
                }
                out.extend_from_slice(&nibbles(&q));
            }
            _ => {
                let top = if ty == QuantType::Q4_1 { 15 } else { 31 };
                let (d, m, q) = affine(block, top);
                out.extend_from_slice(&d.to_le_bytes());
                out.extend_from_slice(&m.to_le_bytes());
                if ty == QuantType::Q5_1 {
                    out.extend_from_slice(&fifth_bits(&q));
                }
                out.extend_from_slice(&nibbles(&q));
            }
        }
    }
}

/// ggml's 32-value nibble packing: value i low, value i + 16 high.
fn nibbles(q: &[u8; 32]) -> [u8; 16] {
    std::array::from_fn(|i| (q[i] & 0x0f) | ((q[i + 16] & 0x0f) << 4))
}

/// The fifth bits of 32 values as a little-endian u32 (bit i for value i).
fn fifth_bits(q: &[u8; 32]) -> [u8; 4] {
    let bits = q.iter().enumerate().fold(0u32, |acc, (i, &q)| acc | (((q >> 4) & 1) as u32) << i);
    bits.to_le_bytes()
}

/// Scale candidates per block: the extreme value divided by `levels + step·k` for k in
/// `-STEPS..=STEPS`.
const STEPS: i32 = 12;
const STEP: f32 = 0.1;

/// The value of `x` with the largest magnitude (the first of equals), 0 for none.
fn extreme(x: &[f32]) -> f32 {
    x.iter().copied().fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

/// Least squares of `x ≈ s · q` for the integers `q`: s = Σ x q / Σ q² (`None` where all are 0).
fn scale_fit(x: &[f32], q: &[i32]) -> Option<f32> {
    let (sxq, sqq) = x.iter().zip(q).fold((0.0f32, 0.0f32), |(a, b), (&v, &q)| (a + v * q as f32, b + (q * q) as f32));
    (sqq > 0.0).then(|| sxq / sqq)
}

/// Least squares of `x ≈ s · q + offset` for the 32 integers `q`: `(s, offset)` (`None` where
/// the integers do not determine them).
fn affine_fit(x: &[f32; 32], q: impl IntoIterator<Item = f32>) -> Option<(f32, f32)> {
    let (sq, sqq, sx, sxq) = x
        .iter()
        .zip(q)
        .fold((0.0f32, 0.0f32, 0.0f32, 0.0f32), |(a, b, c, e), (&v, q)| (a + q, b + q * q, c + v, e + v * q));
    let det = 32.0 * sqq - sq * sq;
    (det > 0.0).then(|| ((32.0 * sxq - sq * sx) / det, (sqq * sx - sq * sxq) / det))
}

/// `w ≈ d · q` with integer q in `[-neg, pos]`: the f16 scale with the least squared error.
fn symmetric(x: &[f32; 32], neg: i32, pos: i32) -> (f16, [i32; 32]) {
    let max = extreme(x);
    let mut best = (f32::INFINITY, f16::ZERO, [0i32; 32]);
    if max == 0.0 {
        return (best.1, best.2);
    }
    let consider = |d: f32, best: &mut (f32, f16, [i32; 32])| {
        let d16 = f16::from_f32(d);
        let dq = d16.to_f32();
        if dq == 0.0 || !dq.is_finite() {
            return;
        }
        let (err, q) = fit_error(x, dq, 0.0, -neg, pos);
        if err < best.0 {
            *best = (err, d16, q);
        }
    };
    // The extreme value maps to −neg (ggml's choice for Q4_0/Q5_0) or to +pos, give or take.
    for k in -STEPS..=STEPS {
        let t = k as f32 * STEP;
        consider(max / -(neg as f32 + t), &mut best);
        consider(max / (pos as f32 + t), &mut best);
    }
    // Least squares for the chosen integers.
    if let Some(d) = scale_fit(x, &best.2) {
        consider(d, &mut best);
    }
    (best.1, best.2)
}

/// `w ≈ d · q + m` with integer q in `[0, top]`: the f16 pair with the least squared error.
fn affine(x: &[f32; 32], top: i32) -> (f16, f16, [u8; 32]) {
    let (lo, hi) = x.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
    let mut best = (f32::INFINITY, f16::ZERO, f16::from_f32(lo), [0u8; 32]);
    let consider = |d: f32, m: f32, best: &mut (f32, f16, f16, [u8; 32])| {
        let (d16, m16) = (f16::from_f32(d), f16::from_f32(m));
        let (dq, mq) = (d16.to_f32(), m16.to_f32());
        if !dq.is_finite() || !mq.is_finite() {
            return;
        }
        let (err, q) = fit_error(x, dq, mq, 0, top);
        if err < best.0 {
            *best = (err, d16, m16, q.map(|q| q as u8));
        }
    };
    if hi <= lo {
        consider(0.0, lo, &mut best);
        return (best.1, best.2, best.3);
    }
    for k in -STEPS..=STEPS {
        let d = (hi - lo) / (top as f32 + k as f32 * STEP);
        consider(d, lo, &mut best);
        // Least squares of (d, m) for the integers this scale picks.
        if let Some((d, m)) = affine_fit(x, best.3.map(f32::from)) {
            consider(d, m, &mut best);
        }
    }
    (best.1, best.2, best.3)
}

/// Squared error of `x` against `scale · q + offset` with q the nearest integer in `[lo, hi]`
/// (q = lo where the scale is 0), and the integers.
fn fit_error<const N: usize>(x: &[f32; N], scale: f32, offset: f32, lo: i32, hi: i32) -> (f32, [i32; N]) {
    let q: [i32; N] = std::array::from_fn(|i| match scale {
        0.0 => lo,
        _ => round_in((x[i] - offset) / scale, lo as f32, hi as f32) as i32,
    });
    let err = x.iter().zip(&q).map(|(&v, &q)| (v - (scale * q as f32 + offset)).powi(2)).sum();
    (err, q)
}

/// One 32-value group of a Q4_K / Q5_K block: `w ≈ s · q − m` with q in `[0, top]`, s ≥ 0 and
/// m ≥ 0 (the format stores both unsigned): the pair with the least squared error among scales
/// around the group's range, each refined by least squares for the integers it picks.
fn kmin_group(x: &[f32; 32], top: i32) -> (f32, f32) {
    let (lo, hi) = x.iter().fold((0.0f32, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
    let mut best = (fit_error(x, 0.0, lo, 0, top).0, 0.0, -lo);
    if hi <= lo {
        return (best.1, best.2);
    }
    let consider = |s: f32, m: f32, best: &mut (f32, f32, f32)| {
        if s.is_finite() && m.is_finite() && s >= 0.0 && m >= 0.0 {
            let err = fit_error(x, s, -m, 0, top).0;
            if err < best.0 {
                *best = (err, s, m);
            }
        }
    };
    for k in -STEPS..=STEPS {
        let s = (hi - lo) / (top as f32 + k as f32 * STEP);
        consider(s, -lo, &mut best);
        // Least squares of (s, m) for the integers this scale picks; m = 0 where it would be
        // negative.
        let q = fit_error(x, s, lo, 0, top).1;
        match affine_fit(x, q.map(|q| q as f32)) {
            Some((s, offset)) if offset <= 0.0 => consider(s, -offset, &mut best),
            Some(_) => {
                if let Some(s) = scale_fit(x, &q) {
                    consider(s, 0.0, &mut best);
                }
            }
            None => {}
        }
    }
    (best.1, best.2)
}

/// The integer of `step`s nearest `v` in `[lo, hi]` (0 where the step is 0), and its
/// neighbours in that range: a stored scale's candidates.
fn neighbours(v: f32, step: f32, lo: i32, hi: i32) -> impl Iterator<Item = i32> {
    let at = if step != 0.0 { (v / step).round().clamp(lo as f32, hi as f32) as i32 } else { 0 };
    (at - 1..=at + 1).filter(move |c| (lo..=hi).contains(c))
}

/// A Q4_K or Q5_K block: `d`, `dmin`, the 12 bytes of 6-bit scales and mins, (Q5_K) the fifth
/// bits, the nibbles.
fn kmin_block(x: &[f32; 256], ty: QuantType, out: &mut Vec<u8>) {
    let top = if ty == QuantType::Q4K { 15 } else { 31 };
    let groups: [&[f32; 32]; 8] = std::array::from_fn(|g| x[32 * g..32 * (g + 1)].try_into().expect("32 values"));
    let fits = groups.map(|g| kmin_group(g, top));
    let (max_s, max_m) = fits.iter().fold((0.0f32, 0.0f32), |(a, b), &(s, m)| (a.max(s), b.max(m)));
    let (d, dmin) = (f16::from_f32(max_s / 63.0), f16::from_f32(max_m / 63.0));
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let (mut sc, mut m, mut q) = ([0u8; 8], [0u8; 8], [0u8; 256]);
    for (g, (group, &(s, min))) in groups.iter().zip(&fits).enumerate() {
        let mut best = (f32::INFINITY, 0, 0, [0i32; 32]);
        for c in neighbours(s, df, 0, 63) {
            for n in neighbours(min, dminf, 0, 63) {
                let (err, ints) = fit_error(group, df * c as f32, -(dminf * n as f32), 0, top);
                if err < best.0 {
                    best = (err, c, n, ints);
                }
            }
        }
        (sc[g], m[g]) = (best.1 as u8, best.2 as u8);
        for (q, &v) in q[32 * g..].iter_mut().zip(&best.3) {
            *q = v as u8;
        }
    }
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    // The inverse of `ggml::k_scales`: the low four scales and mins in bytes 0..8 with the high
    // four's top two bits above them, the high four's low bits in bytes 8..12.
    for j in 0..4 {
        out.push(sc[j] | ((sc[j + 4] >> 4) << 6));
    }
    for j in 0..4 {
        out.push(m[j] | ((m[j + 4] >> 4) << 6));
    }
    for j in 0..4 {
        out.push((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
    if ty == QuantType::Q5K {
        // Bit j of byte i: the fifth bit of value 32j + i.
        out.extend((0..32).map(|i| (0..8).fold(0u8, |b, j| b | (((q[32 * j + i] >> 4) & 1) << j))));
    }
    // Four 32-byte chunks: chunk c holds values 64c.. in its low nibbles, 64c + 32.. in its high.
    for c in 0..4 {
        out.extend((0..32).map(|i| (q[64 * c + i] & 0x0f) | ((q[64 * c + 32 + i] & 0x0f) << 4)));
    }
}

/// One 16-value group of a Q6_K block: `w ≈ s · q` with q in `[−32, 31]`, the scale with the
/// least squared error among those around the group's extreme value, refined by least squares.
fn k6_group(x: &[f32; 16]) -> f32 {
    let max = extreme(x);
    if max == 0.0 {
        return 0.0;
    }
    let mut best = (f32::INFINITY, 0.0);
    let consider = |s: f32, best: &mut (f32, f32)| {
        let err = fit_error(x, s, 0.0, -32, 31).0;
        if s.is_finite() && err < best.0 {
            *best = (err, s);
        }
    };
    for k in -STEPS..=STEPS {
        let t = k as f32 * STEP;
        // The extreme value maps to −32 (ggml's choice) or to +31, give or take.
        for s in [max / -(32.0 + t), max / (31.0 + t)] {
            consider(s, &mut best);
            if let Some(s) = scale_fit(x, &fit_error(x, s, 0.0, -32, 31).1) {
                consider(s, &mut best);
            }
        }
    }
    best.1
}

/// A Q6_K block: the low four bits, the top two bits, 16 signed 8-bit scales, `d`.
fn k6_block(x: &[f32; 256], out: &mut Vec<u8>) {
    let groups: [&[f32; 16]; 16] = std::array::from_fn(|g| x[16 * g..16 * (g + 1)].try_into().expect("16 values"));
    let scales = groups.map(k6_group);
    let max = extreme(&scales);
    // The largest scale maps to −128, the end of the signed range with the most room.
    let d = f16::from_f32(max / -128.0);
    let df = d.to_f32();
    let (mut sc, mut q) = ([0i8; 16], [0u8; 256]);
    for (g, (group, &s)) in groups.iter().zip(&scales).enumerate() {
        let mut best = (f32::INFINITY, 0, [0i32; 16]);
        for c in neighbours(s, df, -128, 127) {
            let (err, ints) = fit_error(group, df * c as f32, 0.0, -32, 31);
            if err < best.0 {
                best = (err, c, ints);
            }
        }
        sc[g] = best.1 as i8;
        for (q, &v) in q[16 * g..].iter_mut().zip(&best.2) {
            *q = (v + 32) as u8;
        }
    }
    // ql: two halves of 64 bytes, half h holding values 128h.. in its low nibbles and
    // 128h + 64.. in its high ones; qh: two halves of 32 bytes, bits 2s..2s+2 of byte i of half
    // h the top bits of value 128h + 32s + i.
    for h in 0..2 {
        out.extend((0..64).map(|i| (q[128 * h + i] & 0x0f) | ((q[128 * h + 64 + i] & 0x0f) << 4)));
    }
    for h in 0..2 {
        out.extend((0..32).map(|i| (0..4).fold(0u8, |b, s| b | (((q[128 * h + 32 * s + i] >> 4) & 3) << (2 * s)))));
    }
    out.extend(sc.iter().map(|&s| s as u8));
    out.extend_from_slice(&d.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize, test_values};

    fn rms_error(ty: QuantType, x: &[f32]) -> f32 {
        let mut bytes = Vec::new();
        quantize(ty, x, &mut bytes).unwrap();
        assert_eq!(bytes.len(), x.len() / ty.block_values() * ty.block_bytes());
        let mut back = vec![0.0; x.len()];
        dequantize(ty, &bytes, &mut back);
        (x.iter().zip(&back).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / x.len() as f32).sqrt()
    }

    /// ggml's reference quantizer (scale from the extreme value), for comparison.
    fn reference_rms_error(ty: QuantType, x: &[f32]) -> f32 {
        let mut err = 0.0;
        for b in x.chunks_exact(32) {
            let max = b.iter().copied().fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m });
            let (lo, hi) = b.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
            for &v in b {
                let w = match ty {
                    QuantType::Q8_0 => {
                        let d = f16::from_f32(max.abs() / 127.0).to_f32();
                        d * (v / d).round()
                    }
                    QuantType::Q4_0 | QuantType::Q5_0 => {
                        let half = if ty == QuantType::Q4_0 { 8.0 } else { 16.0 };
                        let d = f16::from_f32(max / -half).to_f32();
                        d * ((v / d + half + 0.5).trunc().clamp(0.0, 2.0 * half - 1.0) - half)
                    }
                    _ => {
                        let top = if ty == QuantType::Q4_1 { 15.0 } else { 31.0 };
                        let d = f16::from_f32((hi - lo) / top).to_f32();
                        let m = f16::from_f32(lo).to_f32();
                        d * ((v - lo) / d + 0.5).trunc().clamp(0.0, top) + m
                    }
                };
                err += (v - w).powi(2);
            }
        }
        (err / x.len() as f32).sqrt()
    }

    /// Every 32-value format round-trips within its resolution, and the chosen scales never do
    /// worse than ggml's reference quantizer (and do better overall).
    #[test]
    fn quantized_blocks_beat_the_reference_scales() {
        let x: Vec<f32> =
            test_values(32 * 256, 5).iter().enumerate().map(|(i, v)| v * (1.0 + (i % 7) as f32)).collect();
        for (ty, bound) in [
            (QuantType::Q8_0, 0.02),
            (QuantType::Q4_0, 0.35),
            (QuantType::Q4_1, 0.3),
            (QuantType::Q5_0, 0.18),
            (QuantType::Q5_1, 0.15),
        ] {
            let ours = rms_error(ty, &x);
            let reference = reference_rms_error(ty, &x);
            assert!(ours < bound, "{ty}: rms error {ours}");
            assert!(ours < reference, "{ty}: rms error {ours}, ggml's reference scales {reference}");
        }
        assert!(quantize(QuantType::Q4K, &x[..32 * 9], &mut Vec::new()).is_none(), "not whole blocks");
    }

    /// The K-quants round-trip within their resolution, finer with more bits, and closer than a
    /// 32-value format of as many bits a value (Q4_K and Q4_0 both store 4.5).
    #[test]
    fn k_quant_blocks_round_trip_within_their_resolution() {
        let x: Vec<f32> =
            test_values(256 * 64, 6).iter().enumerate().map(|(i, v)| v * (1.0 + (i / 32 % 7) as f32)).collect();
        let errors = [QuantType::Q4K, QuantType::Q5K, QuantType::Q6K].map(|ty| rms_error(ty, &x));
        eprintln!("Q4_K, Q5_K, Q6_K rms error: {errors:?}; Q4_0 {}", rms_error(QuantType::Q4_0, &x));
        assert!(errors[0] < 0.3 && errors[1] < errors[0] / 1.6 && errors[2] < errors[1] / 1.6, "{errors:?}");
        assert!(errors[0] < rms_error(QuantType::Q4_0, &x), "Q4_K {} against Q4_0", errors[0]);
    }

    /// Blocks whose values a K-quant holds exactly (random integers under random stored scales,
    /// offsets and super-scales) come back exactly: every bit of the packing is where ggml reads it.
    #[test]
    fn representable_k_quant_blocks_come_back_exactly() {
        let r = test_values(4096, 7);
        let int = |i: usize, n: u32| ((r[i % r.len()] + 1.0) / 2.0 * n as f32).floor().min(n as f32 - 1.0) as i32;
        for (ty, block) in [(QuantType::Q4K, 0), (QuantType::Q5K, 1), (QuantType::Q6K, 2), (QuantType::Q4K, 3)] {
            let seed = block * 1000;
            let top = if ty == QuantType::Q4K { 16 } else { 32 };
            let x: Vec<f32> = match ty {
                QuantType::Q6K => {
                    let d = f16::from_f32(0.01).to_f32();
                    // One scale at −128, so the super-scale comes out as above.
                    let sc: Vec<i32> = (0..16).map(|g| if g == 9 { -128 } else { int(seed + g, 255) - 127 }).collect();
                    (0..256)
                        .map(|i| {
                            // Every group spans −32..31, so its fit is the stored one.
                            let q = match i % 16 {
                                0 => -32,
                                1 => 31,
                                _ => int(seed + 50 + i, 64) - 32,
                            };
                            d * sc[i / 16] as f32 * q as f32
                        })
                        .collect()
                }
                _ => {
                    let (d, dmin) = (f16::from_f32(0.02).to_f32(), f16::from_f32(0.005).to_f32());
                    // One scale at 63 and one min at 63, so the super-scales come out as above.
                    let sc: Vec<i32> = (0..8).map(|g| if g == 3 { 63 } else { 1 + int(seed + g, 62) }).collect();
                    let m: Vec<i32> = (0..8).map(|g| if g == 5 { 63 } else { int(seed + 20 + g, 64) }).collect();
                    (0..256)
                        .map(|i| {
                            // Every group spans 0..top, so its fit is the stored one.
                            let q = match i % 32 {
                                0 => 0,
                                1 => top - 1,
                                _ => int(seed + 50 + i, top as u32),
                            };
                            d * sc[i / 32] as f32 * q as f32 - dmin * m[i / 32] as f32
                        })
                        .collect()
                }
            };
            assert!(rms_error(ty, &x) < 1e-6, "{ty}: rms error {}", rms_error(ty, &x));
        }
    }

    /// Constant and all-zero blocks quantize exactly.
    #[test]
    fn degenerate_blocks_are_exact() {
        for ty in QuantType::ALL {
            assert_eq!(rms_error(ty, &[0.0; 256]), 0.0, "{ty} zeros");
        }
        for ty in [QuantType::Q4_1, QuantType::Q5_1] {
            assert_eq!(rms_error(ty, &[0.75; 32]), 0.0, "{ty} constant");
        }
    }
}
