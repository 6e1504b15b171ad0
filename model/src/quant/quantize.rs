//! Q4: f32 values to ggml's 32-value block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), for
//! quantizing a safetensors checkpoint at load.
//!
//! ggml's reference quantizers take the scale from the block's extreme value. Here each block
//! tries a range of scales around that one and keeps the scale (and, for Q4_1 / Q5_1, the
//! offset) whose f16-rounded values give the smallest squared error, refined by a least-squares
//! fit of the scale to the chosen integers (what llama.cpp's `make_qx_quants` does for its
//! importance-weighted quantizers).

use half::f16;

use super::QuantType;

/// Quantizes `values` (a whole number of 32-value blocks) into `ty`'s ggml layout, appended to
/// `out`. Returns `None` for the K-quants, which this does not produce.
pub fn quantize(ty: QuantType, values: &[f32], out: &mut Vec<u8>) -> Option<()> {
    if ty.is_k() || !values.len().is_multiple_of(32) {
        return None;
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
    Some(())
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

/// `w ≈ d · q` with integer q in `[-neg, pos]`: the f16 scale with the least squared error.
fn symmetric(x: &[f32; 32], neg: i32, pos: i32) -> (f16, [i32; 32]) {
    let max = x.iter().copied().fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m });
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
        let q: [i32; 32] = std::array::from_fn(|i| ((x[i] / dq).round() as i32).clamp(-neg, pos));
        let err: f32 = x.iter().zip(&q).map(|(&v, &q)| (v - dq * q as f32).powi(2)).sum();
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
    // Least squares for the chosen integers: d = Σ x q / Σ q².
    let (sxq, sqq) =
        x.iter().zip(&best.2).fold((0.0f32, 0.0f32), |(a, b), (&v, &q)| (a + v * q as f32, b + (q * q) as f32));
    if sqq > 0.0 {
        consider(sxq / sqq, &mut best);
    }
    (best.1, best.2)
}

/// `w ≈ d · q + m` with integer q in `[0, top]`: the f16 pair with the least squared error.
fn affine(x: &[f32; 32], top: i32) -> (f16, f16, [u8; 32]) {
    let (lo, hi) = x.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
    let mut best = (f32::INFINITY, f16::ZERO, f16::from_f32(lo), [0u8; 32]);
    let consider =
        |d: f32, m: f32, best: &mut (f32, f16, f16, [u8; 32])| {
            let (d16, m16) = (f16::from_f32(d), f16::from_f32(m));
            let (dq, mq) = (d16.to_f32(), m16.to_f32());
            if !dq.is_finite() || !mq.is_finite() {
                return;
            }
            let q: [u8; 32] = std::array::from_fn(|i| {
                if dq == 0.0 { 0 } else { ((x[i] - mq) / dq).round().clamp(0.0, top as f32) as u8 }
            });
            let err: f32 = x.iter().zip(&q).map(|(&v, &q)| (v - (dq * q as f32 + mq)).powi(2)).sum();
            if err < best.0 {
                *best = (err, d16, m16, q);
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
        let q = best.3;
        let n = 32.0f32;
        let (sq, sqq, sx, sxq) = x.iter().zip(&q).fold((0.0f32, 0.0f32, 0.0f32, 0.0f32), |(a, b, c, e), (&v, &q)| {
            let q = q as f32;
            (a + q, b + q * q, c + v, e + v * q)
        });
        let det = n * sqq - sq * sq;
        if det > 0.0 {
            let d = (n * sxq - sq * sx) / det;
            let m = (sqq * sx - sq * sxq) / det;
            consider(d, m, &mut best);
        }
    }
    (best.1, best.2, best.3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize, test_values};

    fn rms_error(ty: QuantType, x: &[f32]) -> f32 {
        let mut bytes = Vec::new();
        quantize(ty, x, &mut bytes).unwrap();
        assert_eq!(bytes.len(), x.len() / 32 * ty.block_bytes());
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
        assert!(quantize(QuantType::Q4K, &x, &mut Vec::new()).is_none());
    }

    /// Constant and all-zero blocks quantize exactly.
    #[test]
    fn degenerate_blocks_are_exact() {
        for ty in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1] {
            assert_eq!(rms_error(ty, &[0.0; 64]), 0.0, "{ty} zeros");
        }
        for ty in [QuantType::Q4_1, QuantType::Q5_1] {
            assert_eq!(rms_error(ty, &[0.75; 32]), 0.0, "{ty} constant");
        }
    }
}
