//! Q4: f32 values to ggml's block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the 256-value
//! K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and the formats of levels IQ4_NL and MXFP4), for
//! quantizing a checkpoint at load or a replaced weight.
//!
//! ggml's reference quantizers take the scale from the block's extreme value. Here each block
//! (each 32- or 16-value group of a K-quant block) tries a range of scales around that one: each
//! candidate picks the nearest integers, the scale (and, for Q4_1 / Q5_1 / Q4_K / Q5_K, the
//! offset) is refitted to those integers by least squares (as llama.cpp's `make_qx_quants` does),
//! and the fit that leaves the least squared error is kept. The sums of the pass that picks a
//! candidate's integers give its fit and its error in closed form, so a candidate costs one pass
//! over the values, and eight candidates share it, a vector lane each. A K-quant block then rounds
//! its groups' scales to integers of one f16 super-scale (6 bits, 4 for Q2_K, 6 signed for Q3_K,
//! 8 signed for Q6_K), tries
//! the neighbours of each rounded scale and offset, and quantizes the values again with the
//! scales as stored.
//!
//! IQ4_NL and MXFP4 ([`levels_block`]) take each value's nearest level: IQ4_NL tries 15 scales
//! around the extreme value's (either sign, as its levels run from −127 to 113), refits each by
//! least squares and keeps the best, as llama.cpp's quantizer does; MXFP4 tries the three powers
//! of two around the extreme value's.
//!
//! `unsafe` (C8: the reason). `blocks` calls the AVX2 build of the searches only after checking
//! at run time that the CPU has AVX2; nothing else here is unsafe.
#![allow(unsafe_code)]

use half::f16;
use rayon::prelude::*;

use super::QuantType;

/// Blocks a task of the rayon pool quantizes.
const BLOCKS_PER_TASK: usize = 256;

/// Quantizes `values` (a whole number of `ty`'s blocks) into its ggml layout, appended to `out`,
/// in tasks of 256 blocks over the rayon pool. Each value's squared error is weighted by
/// `√(σ² + x²)`, σ² the mean square of its 256 values (doubled for the K-quants): what
/// llama.cpp's quantizers weight by with an importance matrix of ones. Plain squared error keeps
/// the largest weights less well, and they matter more: on the demo model (KL divergence from
/// F16 over DESIGN.md) `q4_0` went from 0.1439 to 0.1037 with these weights (llama-quantize's
/// `Q4_0` 0.1296), `q3_k_m` from 0.0814 to 0.0570 (0.0702), `q4_k` from 0.01205 to 0.01148
/// (0.01184), `q4_k_m` stayed at 0.0050 (0.00493). `None` where the values are not whole blocks.
pub fn quantize(ty: QuantType, values: &[f32], out: &mut Vec<u8>) -> Option<()> {
    quantize_weighted(ty, values, None, out)
}

/// [`quantize`] with an importance vector (`importance[j]`: how much column j's error counts, a
/// row's column j being `values[r · k + j]` for `k = importance.len()`; llama.cpp's imatrix, the
/// mean square of the activations each column multiplies): each value's squared error is
/// weighted by `importance[j] · √(σ² + x²)`, as llama.cpp's quantizers weight it, σ² the mean
/// square of the row (of the 256-value block, doubled, for the K-quants). `None` where the
/// values are not whole blocks or whole rows of `k`, or `k` is not whole blocks.
pub fn quantize_weighted(ty: QuantType, values: &[f32], importance: Option<&[f32]>, out: &mut Vec<u8>) -> Option<()> {
    let bv = ty.block_values();
    if !values.len().is_multiple_of(bv) {
        return None;
    }
    if importance
        .is_some_and(|imp| imp.is_empty() || !imp.len().is_multiple_of(bv) || !values.len().is_multiple_of(imp.len()))
    {
        return None;
    }
    let spans = Spans::of(ty, values, importance);
    let task = bv * BLOCKS_PER_TASK;
    let tasks: Vec<Vec<u8>> = values
        .par_chunks(task)
        .enumerate()
        .map(|(t, values)| {
            let mut out = Vec::with_capacity(values.len() / bv * ty.block_bytes());
            // Each task weighs its own values: no copy of the whole matrix.
            blocks(ty, values, Some(&spans.weights(t * task, values)), &mut out);
            out
        })
        .collect();
    out.reserve(tasks.iter().map(Vec::len).sum());
    tasks.iter().for_each(|t| out.extend_from_slice(t));
    Some(())
}

/// What each value's weight in the squared error is made of: `importance[j] · √(σ² + x²)`, or
/// `√(σ² + x²)` without an importance vector (see [`quantize`] and [`quantize_weighted`]), σ²
/// taken per span of values (a K-quant's 256-value block, a row of `importance.len()` values,
/// or 256 values without an importance vector). A span of zeros (σ² = 0) weighs each value 1,
/// so its fit is still defined.
struct Spans<'a> {
    importance: Option<&'a [f32]>,
    span: usize,
    /// Each span's σ², NaN for a span weighed by ones.
    sigma2: Vec<f32>,
}

impl<'a> Spans<'a> {
    fn of(ty: QuantType, values: &[f32], importance: Option<&'a [f32]>) -> Self {
        let span = match importance {
            _ if ty.is_k() => 256,
            Some(imp) => imp.len(),
            None => 256,
        };
        let sigma2 = values
            .par_chunks(span)
            .map(|x| {
                let sum: f32 = x.iter().map(|v| v * v).sum();
                let sigma2 = if ty.is_k() { 2.0 * sum / 256.0 } else { sum / x.len() as f32 };
                if sum == 0.0 || !sigma2.is_finite() { f32::NAN } else { sigma2 }
            })
            .collect();
        Self { importance, span, sigma2 }
    }

    /// The weights of `values`, which start at value `at` of the matrix.
    fn weights(&self, at: usize, values: &[f32]) -> Vec<f32> {
        let (mut i, mut rest, mut w) = (at, values, Vec::with_capacity(values.len()));
        while !rest.is_empty() {
            // The rest of the span value i is in.
            let (x, tail) = rest.split_at((self.span - i % self.span).min(rest.len()));
            let sigma2 = self.sigma2[i / self.span];
            if sigma2.is_nan() {
                w.extend(std::iter::repeat_n(1.0, x.len()));
            } else {
                let imp = |j: usize| self.importance.map_or(1.0, |imp| imp[j % imp.len()]);
                w.extend(x.iter().enumerate().map(|(j, &x)| imp(i + j) * (sigma2 + x * x).sqrt()));
            }
            (i, rest) = (i + x.len(), tail);
        }
        w
    }
}

/// Every value's weight (see [`Spans`]).
#[cfg(test)]
fn weights(ty: QuantType, values: &[f32], importance: Option<&[f32]>) -> Vec<f32> {
    Spans::of(ty, values, importance).weights(0, values)
}

/// Adding 1.5 · 2^23 to an f32 under 2^22 in magnitude leaves no bits below the units:
/// subtracting it again rounds to the nearest integer, ties to even.
const MAGIC: f32 = 12_582_912.0;

/// `v` clamped to `[lo, hi]` (`lo` for a NaN) and rounded to the nearest integer (ties to even),
/// in inline arithmetic: `f32::round` is a libm call on the baseline x86-64 target.
#[inline(always)]
fn round_in(v: f32, lo: f32, hi: f32) -> f32 {
    (v.max(lo).min(hi) + MAGIC) - MAGIC
}

/// [`quantize`] on one task's whole blocks, compiled for AVX2 where the CPU has it. The searches
/// below are inlined into both versions, whose [`Pick`]s do the same operations in the same
/// order (and Rust never fuses a multiply and an add), so both give the same bytes.
fn blocks(ty: QuantType, values: &[f32], weights: Option<&[f32]>, out: &mut Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked on the line above.
        return unsafe { blocks_avx2(ty, values, weights, out) };
    }
    blocks_in::<Portable>(ty, values, weights, out)
}

/// [`blocks_in`] in 256-bit vectors.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn blocks_avx2(ty: QuantType, values: &[f32], weights: Option<&[f32]>, out: &mut Vec<u8>) {
    blocks_in::<Avx2>(ty, values, weights, out)
}

/// The work of [`blocks`], inlined into each of its versions.
#[inline(always)]
fn blocks_in<P: Pick>(ty: QuantType, values: &[f32], weights: Option<&[f32]>, out: &mut Vec<u8>) {
    let bv = ty.block_values();
    let weight = |i: usize| weights.map(|w| &w[i * bv..(i + 1) * bv]);
    if ty.is_k() {
        for (i, block) in values.chunks_exact(256).enumerate() {
            let block: &[f32; 256] = block.try_into().expect("chunks of 256");
            let w: Option<&[f32; 256]> = weight(i).map(|w| w.try_into().expect("256 weights"));
            match ty {
                QuantType::Q3K | QuantType::Q6K => signed_block::<P>(block, w, ty, out),
                QuantType::Q2K => q2k_block::<P>(block, w, out),
                _ => kmin_block::<P>(block, w, ty, out),
            }
        }
        return;
    }
    for (i, block) in values.chunks_exact(32).enumerate() {
        let block: &[f32; 32] = block.try_into().expect("chunks of 32");
        let w: Option<&[f32; 32]> = weight(i).map(|w| w.try_into().expect("32 weights"));
        match ty {
            QuantType::Iq4Nl | QuantType::Mxfp4 => levels_block(block, w, ty, out),
            QuantType::Q8_0 => {
                let (d, q) = symmetric::<P>(block, w, 127, 127);
                out.extend_from_slice(&d.to_le_bytes());
                out.extend(q.iter().map(|&q| q as i32 as i8 as u8));
            }
            QuantType::Q4_0 | QuantType::Q5_0 => {
                let half = if ty == QuantType::Q4_0 { 8 } else { 16 };
                let (d, q) = symmetric::<P>(block, w, half, half - 1);
                let q = q.map(|q| (q as i32 + half) as u8);
                out.extend_from_slice(&d.to_le_bytes());
                if ty == QuantType::Q5_0 {
                    out.extend_from_slice(&fifth_bits(&q));
                }
                out.extend_from_slice(&nibbles(&q));
            }
            QuantType::Q4_1 | QuantType::Q5_1 => {
                let top = if ty == QuantType::Q4_1 { 15 } else { 31 };
                let (d, m, q) = affine::<P>(block, w, top);
                let q = q.map(|q| q as u8);
                out.extend_from_slice(&d.to_le_bytes());
                out.extend_from_slice(&m.to_le_bytes());
                if ty == QuantType::Q5_1 {
                    out.extend_from_slice(&fifth_bits(&q));
                }
                out.extend_from_slice(&nibbles(&q));
            }
            _ => unreachable!("{ty} is a K-quant"),
        }
    }
}

/// A block of IQ4_NL or MXFP4 (see the module's note), appended in ggml's layout.
fn levels_block(x: &[f32; 32], w: Option<&[f32; 32]>, ty: QuantType, out: &mut Vec<u8>) {
    use super::ggml::{IQ4_LEVELS, MXFP4_LEVELS, e8m0_half};
    let levels = if ty == QuantType::Iq4Nl { &IQ4_LEVELS } else { &MXFP4_LEVELS };
    let weight = |i: usize| w.map_or(1.0, |w| w[i]);
    // The nibble of the level nearest to `v` (levels in units of the scale; the smaller of two
    // as near). IQ4_NL's levels ascend; MXFP4's are eight magnitudes, then the same negated.
    let nearest = |v: f32| -> u8 {
        if ty == QuantType::Iq4Nl {
            return nearest_sorted(levels, v) as u8;
        }
        let m = nearest_sorted(&levels[..8], v.abs());
        if v < 0.0 && m > 0 { m as u8 + 8 } else { m as u8 }
    };
    // Each value's nibble under scale d, and the weighted squared error.
    let assign = |d: f32| -> ([u8; 32], f32) {
        let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q: [u8; 32] = std::array::from_fn(|i| nearest(x[i] * inv));
        let err = (0..32).map(|i| weight(i) * (x[i] - d * levels[q[i] as usize] as f32).powi(2)).sum();
        (q, err)
    };
    let max = extreme(x);
    if ty == QuantType::Mxfp4 {
        // Scale 2^(e − 128) on doubled levels up to 12: the extreme value's power of two over 8.
        // (A NaN casts to 0; an infinity clamps to the largest finite scale.)
        let e0 = if max == 0.0 { 0 } else { (max.abs().log2().floor() + 125.0).clamp(0.0, 254.0) as i32 };
        let mut best: Option<(i32, [u8; 32], f32)> = None;
        for e in [e0 - 1, e0, e0 + 1].into_iter().filter(|e| (0..=254).contains(e)) {
            let (q, err) = assign(e8m0_half(e as u8));
            if err < best.map_or(f32::INFINITY, |b| b.2) {
                best = Some((e, q, err));
            }
        }
        // No finite error (non-finite values): the extreme value's own scale.
        let (e, q) = best.map_or_else(|| (e0, assign(e8m0_half(e0 as u8)).0), |(e, q, _)| (e, q));
        out.push(e as u8);
        out.extend_from_slice(&nibbles(&q));
        return;
    }
    let mut d = 0.0f32;
    if max != 0.0 {
        // The extreme value on −127 (either sign), then scales around it, each refitted.
        let (mut best_fit, mut best) = (0.0f32, max / -127.0);
        for t in -7..=7 {
            let scale = max / (-127.0 + t as f32);
            let q = assign(scale).0;
            let (mut sqx, mut sq2) = (0.0f32, 0.0f32);
            for i in 0..32 {
                let l = IQ4_LEVELS[q[i] as usize] as f32;
                (sqx, sq2) = (sqx + weight(i) * x[i] * l, sq2 + weight(i) * l * l);
            }
            if sq2 > 0.0 && sqx * sqx / sq2 > best_fit {
                (best_fit, best) = (sqx * sqx / sq2, sqx / sq2);
            }
        }
        d = best;
    }
    let d = f16::from_f32(d);
    let q = assign(d.to_f32()).0;
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&nibbles(&q));
}

/// The index of the level in `levels` (ascending) nearest to `v`, the lower of two as near (0
/// for a NaN).
#[inline(always)]
fn nearest_sorted(levels: &[i8], v: f32) -> usize {
    let i = levels.partition_point(|&l| (l as f32) < v);
    if i == 0 {
        0
    } else if i == levels.len() || v - levels[i - 1] as f32 <= levels[i] as f32 - v {
        i - 1
    } else {
        i
    }
}

/// ggml's 32-value nibble packing: value i low, value i + 16 high.
#[inline(always)]
fn nibbles(q: &[u8; 32]) -> [u8; 16] {
    std::array::from_fn(|i| (q[i] & 0x0f) | ((q[i + 16] & 0x0f) << 4))
}

/// The fifth bits of 32 values as a little-endian u32 (bit i for value i).
#[inline(always)]
fn fifth_bits(q: &[u8; 32]) -> [u8; 4] {
    let bits = q.iter().enumerate().fold(0u32, |acc, (i, &q)| acc | (((q >> 4) & 1) as u32) << i);
    bits.to_le_bytes()
}

/// Scale candidates per block: the extreme value divided by `levels + step·k` for k in
/// `-STEPS..STEPS` (whole groups of `LANES`: 48 symmetric, 24 affine).
const STEPS: i32 = 12;
const STEP: f32 = 0.1;

/// The value of `x` with the largest magnitude (the first of equals), 0 for none.
#[inline(always)]
fn extreme(x: &[f32]) -> f32 {
    x.iter().copied().fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

/// Σ x q, Σ q² and Σ q of a group's values `x` and the integers `q` a candidate scale picks for
/// them (each term times the value's weight, where there are weights): all a least-squares fit of a scale (and offset) to those integers needs, and the
/// squared error that fit removes from Σ x², so a candidate is scored in the one pass that picks
/// its integers.
#[derive(Clone, Copy)]
struct Sums {
    xq: f32,
    qq: f32,
    q: f32,
}

/// Candidates a pass scores side by side, a vector lane each.
const LANES: usize = 8;

/// How a search picks the integers of eight candidate scales at once: the integers nearest
/// `(x − offset) / scale` in `[lo, hi]` for each scale, a vector lane each, and their [`Sums`]
/// (each value's terms times its weight `w`, where there are weights).
/// Lanes, not values, fill the vector registers, so a group of 16 or 32 values needs no
/// horizontal sums. The searches are generic over it, so [`blocks`] builds them once a way.
trait Pick {
    fn pick<const N: usize>(x: &[f32; N], w: Option<&[f32; N]>, grid: Grid) -> [Sums; LANES];
}

/// Eight candidate scales, the offset subtracted before dividing by them, and the integers'
/// range.
#[derive(Clone, Copy)]
struct Grid<'a> {
    scales: &'a [f32; LANES],
    offset: f32,
    lo: i32,
    hi: i32,
}

/// Arrays of eight lanes, for any CPU.
struct Portable;

impl Pick for Portable {
    #[inline(always)]
    fn pick<const N: usize>(x: &[f32; N], w: Option<&[f32; N]>, grid: Grid) -> [Sums; LANES] {
        let Grid { scales, offset, lo, hi } = grid;
        let inv: [f32; LANES] = std::array::from_fn(|j| 1.0 / scales[j]);
        let (lo, hi) = (lo as f32, hi as f32);
        let (mut xq, mut qq, mut sq) = ([0.0f32; LANES], [0.0f32; LANES], [0.0f32; LANES]);
        match w {
            None => {
                for &v in x {
                    let t = v - offset;
                    for j in 0..LANES {
                        let q = round_in(t * inv[j], lo, hi);
                        xq[j] += v * q;
                        qq[j] += q * q;
                        sq[j] += q;
                    }
                }
            }
            Some(w) => {
                for (&v, &w) in x.iter().zip(w) {
                    let (t, wv) = (v - offset, w * v);
                    for j in 0..LANES {
                        let q = round_in(t * inv[j], lo, hi);
                        let wq = w * q;
                        xq[j] += wv * q;
                        qq[j] += wq * q;
                        sq[j] += wq;
                    }
                }
            }
        }
        std::array::from_fn(|j| Sums { xq: xq[j], qq: qq[j], q: sq[j] })
    }
}

/// AVX2 vectors: chosen only by [`blocks`], after checking that the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Pick for Avx2 {
    #[inline(always)]
    fn pick<const N: usize>(x: &[f32; N], w: Option<&[f32; N]>, grid: Grid) -> [Sums; LANES] {
        // SAFETY: `Avx2` searches run only in `blocks_avx2`, which `blocks` calls on a CPU with
        // AVX2.
        unsafe { pick_avx2(x, w, grid) }
    }
}

/// [`Portable`]'s arithmetic in AVX2 vectors, operation for operation, so both give the same
/// bits (the clamp's `max` then `min` take `lo` for a NaN in either).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn pick_avx2<const N: usize>(x: &[f32; N], w: Option<&[f32; N]>, grid: Grid) -> [Sums; LANES] {
    let Grid { scales, offset, lo, hi } = grid;
    use std::arch::x86_64::*;
    // SAFETY: `scales` is 8 f32, read unaligned.
    let inv = _mm256_div_ps(_mm256_set1_ps(1.0), unsafe { _mm256_loadu_ps(scales.as_ptr()) });
    let (lo, hi, magic) = (_mm256_set1_ps(lo as f32), _mm256_set1_ps(hi as f32), _mm256_set1_ps(MAGIC));
    let (mut xq, mut qq, mut sq) = (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
    match w {
        None => {
            for &v in x {
                let t = _mm256_set1_ps(v - offset);
                let clamped = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(t, inv), lo), hi);
                let q = _mm256_sub_ps(_mm256_add_ps(clamped, magic), magic);
                xq = _mm256_add_ps(xq, _mm256_mul_ps(_mm256_set1_ps(v), q));
                qq = _mm256_add_ps(qq, _mm256_mul_ps(q, q));
                sq = _mm256_add_ps(sq, q);
            }
        }
        Some(w) => {
            for (&v, &w) in x.iter().zip(w) {
                let t = _mm256_set1_ps(v - offset);
                let clamped = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(t, inv), lo), hi);
                let q = _mm256_sub_ps(_mm256_add_ps(clamped, magic), magic);
                let wq = _mm256_mul_ps(_mm256_set1_ps(w), q);
                xq = _mm256_add_ps(xq, _mm256_mul_ps(_mm256_set1_ps(w * v), q));
                qq = _mm256_add_ps(qq, _mm256_mul_ps(wq, q));
                sq = _mm256_add_ps(sq, wq);
            }
        }
    }
    let mut out = [[0.0f32; LANES]; 3];
    for (out, v) in out.iter_mut().zip([xq, qq, sq]) {
        // SAFETY: `out` is 8 f32, written unaligned.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    }
    std::array::from_fn(|j| Sums { xq: out[0][j], qq: out[1][j], q: out[2][j] })
}

impl Sums {
    /// Least squares of `x ≈ s · q`: `(s, the squared error removed)`; `None` where every q is 0.
    #[inline(always)]
    fn scale(self) -> Option<(f32, f32)> {
        (self.qq > 0.0).then(|| (self.xq / self.qq, self.xq * self.xq / self.qq))
    }

    /// Least squares of `x ≈ s · q + offset` over values of total weight `n` (their count, where
    /// they have no weights) whose weighted sum is `sx`: `(s, offset, the squared error
    /// removed)`; `None` where the integers do not determine both.
    #[inline(always)]
    fn affine(self, n: f32, sx: f32) -> Option<(f32, f32, f32)> {
        let det = n * self.qq - self.q * self.q;
        (det > 0.0).then(|| {
            let s = (n * self.xq - self.q * sx) / det;
            let offset = (self.qq * sx - self.q * self.xq) / det;
            (s, offset, s * self.xq + offset * sx)
        })
    }
}

/// The candidate scales of a symmetric search, in groups of lanes: the extreme value `max`
/// mapped to `−neg` (ggml's choice for Q4_0 / Q5_0 / Q6_K) or to `+pos`, give or take `STEPS`
/// steps.
#[inline(always)]
fn symmetric_candidates(max: f32, neg: i32, pos: i32) -> [[f32; LANES]; 6] {
    let mut groups = [[0.0; LANES]; 6];
    let scales = groups.as_flattened_mut();
    for (i, k) in (-STEPS..STEPS).enumerate() {
        let t = k as f32 * STEP;
        scales[2 * i] = max / -(neg as f32 + t);
        scales[2 * i + 1] = max / (pos as f32 + t);
    }
    groups
}

/// The candidate scales of an affine search, in groups of lanes: the range `hi − lo` mapped onto
/// `top + step·k` levels.
#[inline(always)]
fn affine_candidates(lo: f32, hi: f32, top: i32) -> [[f32; LANES]; 3] {
    let mut groups = [[0.0; LANES]; 3];
    for (scale, k) in groups.as_flattened_mut().iter_mut().zip(-STEPS..STEPS) {
        *scale = (hi - lo) / (top as f32 + k as f32 * STEP);
    }
    groups
}

/// The least-squares scale of the integers that fit `x` best among the symmetric candidates
/// (0 for a group of zeros).
#[inline(always)]
fn symmetric_scale<P: Pick, const N: usize>(x: &[f32; N], w: Option<&[f32; N]>, neg: i32, pos: i32) -> f32 {
    let max = extreme(x);
    if max == 0.0 {
        return 0.0;
    }
    let mut best = (f32::NEG_INFINITY, 0.0);
    for scales in &symmetric_candidates(max, neg, pos) {
        for sums in P::pick(x, w, Grid { scales, offset: 0.0, lo: -neg, hi: pos }) {
            if let Some((s, removed)) = sums.scale()
                && removed > best.0
                && s.is_finite()
            {
                best = (removed, s);
            }
        }
    }
    best.1
}

/// `w ≈ d · q` with integer q in `[-neg, pos]`: the best candidate's scale as an f16, and the
/// integers it picks.
#[inline(always)]
fn symmetric<P: Pick>(x: &[f32; 32], w: Option<&[f32; 32]>, neg: i32, pos: i32) -> (f16, [f32; 32]) {
    let d = to_f16(symmetric_scale::<P, 32>(x, w, neg, pos));
    (d, fit(x, w, d.to_f32(), 0.0, -neg, pos).1)
}

/// `v` as an f16, kept finite (the largest f16 where it would overflow).
#[inline(always)]
fn to_f16(v: f32) -> f16 {
    f16::from_f32(v.clamp(f16::MIN.to_f32(), f16::MAX.to_f32()))
}

/// `w ≈ d · q + m` with integer q in `[0, top]`: scales mapping the block's range onto
/// `top + step·k` levels from its minimum, each refined by least squares for the integers it
/// picks; the best pair as f16s, and the integers they pick.
#[inline(always)]
fn affine<P: Pick>(x: &[f32; 32], w: Option<&[f32; 32]>, top: i32) -> (f16, f16, [f32; 32]) {
    let (lo, hi) = x.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
    let (n, sx) = weighted_sums(x, w);
    let mut best = (f32::NEG_INFINITY, 0.0, lo);
    if hi > lo {
        for scales in &affine_candidates(lo, hi, top) {
            for sums in P::pick(x, w, Grid { scales, offset: lo, lo: 0, hi: top }) {
                if let Some((d, m, removed)) = sums.affine(n, sx)
                    && removed > best.0
                    && d.is_finite()
                    && m.is_finite()
                {
                    best = (removed, d, m);
                }
            }
        }
    }
    let (d, m) = (to_f16(best.1), to_f16(best.2));
    (d, m, fit(x, w, d.to_f32(), m.to_f32(), 0, top).1)
}

/// The total weight of a group's values (their count where they have none) and their weighted
/// sum.
#[inline(always)]
fn weighted_sums<const N: usize>(x: &[f32; N], w: Option<&[f32; N]>) -> (f32, f32) {
    match w {
        None => (N as f32, x.iter().sum()),
        Some(w) => (w.iter().sum(), x.iter().zip(w).map(|(x, w)| w * x).sum()),
    }
}

/// Squared error of `x` (each value's times its weight, where there are weights) against
/// `scale · q + offset` with q the nearest integer in `[lo, hi]` (q = 0 clamped into the range
/// where the scale is 0), and the integers (as `f32`): a stored
/// scale's. The values are taken eight at a time into eight partial sums, so the loop runs in
/// vector registers; its callers inline it, and drop the integers where they only need the
/// error.
#[inline(always)]
fn fit<const N: usize>(
    x: &[f32; N],
    w: Option<&[f32; N]>,
    scale: f32,
    offset: f32,
    lo: i32,
    hi: i32,
) -> (f32, [f32; N]) {
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let (lo, hi) = (lo as f32, hi as f32);
    let (mut q, mut sums) = ([0.0f32; N], [0.0f32; 8]);
    for (i, (x, q)) in x.chunks_exact(8).zip(q.chunks_exact_mut(8)).enumerate() {
        for j in 0..8 {
            q[j] = round_in((x[j] - offset) * inv, lo, hi);
            let e = x[j] - (scale * q[j] + offset);
            sums[j] += match w {
                None => e * e,
                Some(w) => w[8 * i + j] * e * e,
            };
        }
    }
    (sums.iter().sum(), q)
}

/// One 32-value group of a Q4_K / Q5_K block (16-value, Q2_K): `w ≈ s · q − m` with q in `[0, top]`, s ≥ 0 and
/// m ≥ 0 (the format stores both unsigned). Scales map the group's range (with 0 in it) onto
/// `top + step·k` levels; each is refined by least squares for the integers it picks (with m = 0
/// where the unconstrained offset would be positive), and the pair removing the most squared
/// error is kept.
#[inline(always)]
fn kmin_group<P: Pick, const N: usize>(x: &[f32; N], w: Option<&[f32; N]>, top: i32) -> (f32, f32) {
    let (lo, hi) = x.iter().fold((0.0f32, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
    let (n, sx) = weighted_sums(x, w);
    // s = 0, every value at lo: Σ x² − Σ (x − lo)² (weighted).
    let mut best = (2.0 * lo * sx - n * lo * lo, 0.0, -lo);
    if hi <= lo {
        return (best.1, best.2);
    }
    for scales in &affine_candidates(lo, hi, top) {
        for sums in P::pick(x, w, Grid { scales, offset: lo, lo: 0, hi: top }) {
            let fitted = match sums.affine(n, sx) {
                Some((s, offset, removed)) if offset <= 0.0 => Some((removed, s, -offset)),
                Some(_) => sums.scale().map(|(s, removed)| (removed, s, 0.0)),
                None => None,
            };
            if let Some((removed, s, m)) = fitted
                && removed > best.0
                && s >= 0.0
                && s.is_finite()
                && m.is_finite()
            {
                best = (removed, s, m);
            }
        }
    }
    (best.1, best.2)
}

/// The integer of `step`s nearest `v` in `[lo, hi]` (0 where the step is 0), and its
/// neighbours in that range: a stored scale's candidates.
#[inline(always)]
fn neighbours(v: f32, step: f32, lo: i32, hi: i32) -> impl Iterator<Item = i32> {
    let at = if step != 0.0 { (v / step).round().clamp(lo as f32, hi as f32) as i32 } else { 0 };
    (at - 1..=at + 1).filter(move |c| (lo..=hi).contains(c))
}

/// A Q4_K or Q5_K block: `d`, `dmin`, the 12 bytes of 6-bit scales and mins, (Q5_K) the fifth
/// bits, the nibbles.
#[inline(always)]
fn kmin_block<P: Pick>(x: &[f32; 256], w: Option<&[f32; 256]>, ty: QuantType, out: &mut Vec<u8>) {
    let top = if ty == QuantType::Q4K { 15 } else { 31 };
    let groups: [&[f32; 32]; 8] = std::array::from_fn(|g| x[32 * g..32 * (g + 1)].try_into().expect("32 values"));
    let weights: [Option<&[f32; 32]>; 8] =
        std::array::from_fn(|g| w.map(|w| w[32 * g..32 * (g + 1)].try_into().expect("32 weights")));
    // A loop, not `groups.map`: the closure would be compiled without AVX2, and the searches
    // inlined into it too.
    let mut fits = [(0.0, 0.0); 8];
    for ((fit, group), w) in fits.iter_mut().zip(groups).zip(weights) {
        *fit = kmin_group::<P, 32>(group, w, top);
    }
    let (max_s, max_m) = fits.iter().fold((0.0f32, 0.0f32), |(a, b), &(s, m)| (a.max(s), b.max(m)));
    let (d, dmin) = (f16::from_f32(max_s / 63.0), f16::from_f32(max_m / 63.0));
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let (mut sc, mut m, mut q) = ([0u8; 8], [0u8; 8], [0u8; 256]);
    for (g, (group, &(s, min))) in groups.iter().zip(&fits).enumerate() {
        let mut best = (f32::INFINITY, 0, 0, [0.0f32; 32]);
        for c in neighbours(s, df, 0, 63) {
            for n in neighbours(min, dminf, 0, 63) {
                let (err, ints) = fit(group, weights[g], df * c as f32, -(dminf * n as f32), 0, top);
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

/// A 256-value block's 16 sub-blocks of 16 values, and their weights.
#[allow(clippy::type_complexity)]
#[inline(always)]
fn sub_blocks<'a>(x: &'a [f32; 256], w: Option<&'a [f32; 256]>) -> ([&'a [f32; 16]; 16], [Option<&'a [f32; 16]>; 16]) {
    let groups = std::array::from_fn(|g| x[16 * g..16 * (g + 1)].try_into().expect("16 values"));
    let weights = std::array::from_fn(|g| w.map(|w| w[16 * g..16 * (g + 1)].try_into().expect("16 weights")));
    (groups, weights)
}

/// A Q6_K or Q3_K block: `w ≈ d · sc · q` over 16-value sub-blocks, with q in `[−32, 31]` and
/// signed 8-bit scales (Q6_K) or q in `[−4, 3]` and 6-bit ones (Q3_K). Each sub-block's scale is
/// the least-squares scale of its best symmetric candidate; the largest maps to the scales'
/// negative end, the one with the most room.
#[inline(always)]
fn signed_block<P: Pick>(x: &[f32; 256], w: Option<&[f32; 256]>, ty: QuantType, out: &mut Vec<u8>) {
    let (neg, scale_neg) = if ty == QuantType::Q6K { (32, 128) } else { (4, 32) };
    let (groups, weights) = sub_blocks(x, w);
    let mut scales = [0.0; 16];
    for ((scale, group), w) in scales.iter_mut().zip(groups).zip(weights) {
        *scale = symmetric_scale::<P, 16>(group, w, neg, neg - 1);
    }
    let d = f16::from_f32(extreme(&scales) / -(scale_neg as f32));
    let df = d.to_f32();
    let (mut sc, mut q) = ([0i8; 16], [0u8; 256]);
    for (g, (group, &s)) in groups.iter().zip(&scales).enumerate() {
        let mut best = (f32::INFINITY, 0, [0.0f32; 16]);
        for c in neighbours(s, df, -scale_neg, scale_neg - 1) {
            let (err, ints) = fit(group, weights[g], df * c as f32, 0.0, -neg, neg - 1);
            if err < best.0 {
                best = (err, c, ints);
            }
        }
        sc[g] = best.1 as i8;
        for (q, &v) in q[16 * g..].iter_mut().zip(&best.2) {
            *q = (v as i32 + neg) as u8;
        }
    }
    if ty == QuantType::Q6K {
        write_q6k(&q, &sc, d, out);
    } else {
        write_q3k(&q, &sc, d, out);
    }
}

/// Appends a Q3_K block: values `q` (0..8, the weight `d · sc[i / 16] · (q − 4)`), its 16
/// sub-block scales (−32..32) and `d`.
fn write_q3k(q: &[u8; 256], sc: &[i8; 16], d: f16, out: &mut Vec<u8>) {
    // hmask: bit 4n + j of byte l the third bit of value 128n + 32j + l; qs: bits 2j of byte
    // 32n + l its low two bits; 12 bytes of 6-bit scales (stored + 32): low four bits in the low
    // (h < 8) or high nibble of byte h % 8, top two at bits 2(h / 4) of byte 8 + h % 4.
    let at = |n: usize, j: usize, l: usize| q[128 * n + 32 * j + l];
    out.extend((0..32).map(|l| (0..8).fold(0u8, |b, nj| b | (((at(nj / 4, nj % 4, l) >> 2) & 1) << nj))));
    for n in 0..2 {
        out.extend((0..32).map(|l| (0..4).fold(0u8, |b, j| b | ((at(n, j, l) & 3) << (2 * j)))));
    }
    let stored: [u8; 16] = std::array::from_fn(|h| (sc[h] as i32 + 32) as u8);
    out.extend((0..8).map(|i| (stored[i] & 0x0f) | ((stored[i + 8] & 0x0f) << 4)));
    out.extend((0..4).map(|i| (0..4).fold(0u8, |b, k| b | ((stored[4 * k + i] >> 4) << (2 * k)))));
    out.extend_from_slice(&d.to_le_bytes());
}

/// A Q2_K block: `w ≈ d · sc · q − dmin · m` over 16-value sub-blocks with q in `[0, 3]` and
/// 4-bit scales and mins: 16 bytes of `sc | m << 4`, the values' two bits, `d`, `dmin`.
#[inline(always)]
fn q2k_block<P: Pick>(x: &[f32; 256], w: Option<&[f32; 256]>, out: &mut Vec<u8>) {
    let (groups, weights) = sub_blocks(x, w);
    // A loop, not `groups.map`: see `kmin_block`.
    let mut fits = [(0.0, 0.0); 16];
    for ((fit, group), w) in fits.iter_mut().zip(groups).zip(weights) {
        *fit = kmin_group::<P, 16>(group, w, 3);
    }
    let (max_s, max_m) = fits.iter().fold((0.0f32, 0.0f32), |(a, b), &(s, m)| (a.max(s), b.max(m)));
    let (d, dmin) = (f16::from_f32(max_s / 15.0), f16::from_f32(max_m / 15.0));
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let (mut scales, mut q) = ([0u8; 16], [0u8; 256]);
    for (g, (group, &(s, min))) in groups.iter().zip(&fits).enumerate() {
        let mut best = (f32::INFINITY, 0, 0, [0.0f32; 16]);
        for c in neighbours(s, df, 0, 15) {
            for n in neighbours(min, dminf, 0, 15) {
                let (err, ints) = fit(group, weights[g], df * c as f32, -(dminf * n as f32), 0, 3);
                if err < best.0 {
                    best = (err, c, n, ints);
                }
            }
        }
        scales[g] = best.1 as u8 | ((best.2 as u8) << 4);
        for (q, &v) in q[16 * g..].iter_mut().zip(&best.3) {
            *q = v as u8;
        }
    }
    out.extend_from_slice(&scales);
    // Bits 2j of byte 32n + l: value 128n + 32j + l.
    for n in 0..2 {
        out.extend((0..32).map(|l| (0..4).fold(0u8, |b, j| b | (q[128 * n + 32 * j + l] << (2 * j)))));
    }
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
}

/// Appends a Q6_K block: values `q` (0..64, the weight `d · sc[i / 16] · (q − 32)`), its 16
/// sub-block scales and `d`.
fn write_q6k(q: &[u8; 256], sc: &[i8; 16], d: f16, out: &mut Vec<u8>) {
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

    /// IQ4_NL's levels, as many bits a value as Q4_0 (4.5), keep weights closer than Q4_0's
    /// uniform grid; MXFP4's power-of-two scales (4.25 bits) keep them less close than Q4_0, but
    /// within their resolution, and its scale is the extreme value's power of two or one of its
    /// neighbours.
    #[test]
    fn formats_of_levels_round_trip_within_their_resolution() {
        let x: Vec<f32> =
            test_values(32 * 256, 5).iter().enumerate().map(|(i, v)| v * (1.0 + (i % 7) as f32)).collect();
        let (iq4, mxfp4, q4) =
            (rms_error(QuantType::Iq4Nl, &x), rms_error(QuantType::Mxfp4, &x), rms_error(QuantType::Q4_0, &x));
        eprintln!("rms error: IQ4_NL {iq4}, MXFP4 {mxfp4}, Q4_0 {q4}");
        assert!(iq4 < q4, "IQ4_NL {iq4} against Q4_0 {q4}");
        assert!(mxfp4 < 2.0 * q4, "MXFP4 {mxfp4} against Q4_0 {q4}");
        let mut bytes = Vec::new();
        quantize(QuantType::Mxfp4, &x, &mut bytes).unwrap();
        for (block, b) in bytes.chunks_exact(17).zip(x.chunks_exact(32)) {
            let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let reference = amax.log2().floor() as i32 + 125; // ggml's quantize_row_mxfp4_ref
            assert!((block[0] as i32 - reference).abs() <= 1, "scale {} for ggml's {reference}", block[0]);
        }
    }

    /// The K-quants round-trip within their resolution, finer with more bits, and closer than a
    /// 32-value format of as many bits a value (Q4_K and Q4_0 both store 4.5).
    #[test]
    fn k_quant_blocks_round_trip_within_their_resolution() {
        let x: Vec<f32> =
            test_values(256 * 64, 6).iter().enumerate().map(|(i, v)| v * (1.0 + (i / 32 % 7) as f32)).collect();
        let errors = [QuantType::Q2K, QuantType::Q3K, QuantType::Q4K, QuantType::Q5K, QuantType::Q6K]
            .map(|ty| rms_error(ty, &x));
        eprintln!("Q2_K .. Q6_K rms error: {errors:?}; Q4_0 {}", rms_error(QuantType::Q4_0, &x));
        assert!(errors[2] < 0.3, "{errors:?}");
        for pair in errors.windows(2) {
            assert!(pair[1] < pair[0] / 1.6, "{errors:?}");
        }
        assert!(errors[2] < rms_error(QuantType::Q4_0, &x), "Q4_K {} against Q4_0", errors[2]);
    }

    /// Blocks whose values a K-quant holds exactly (random integers under random stored scales,
    /// offsets and super-scales) come back exactly: every bit of the packing is where ggml reads it.
    #[test]
    fn representable_k_quant_blocks_come_back_exactly() {
        let r = test_values(4096, 7);
        let int = |i: usize, n: u32| ((r[i % r.len()] + 1.0) / 2.0 * n as f32).floor().min(n as f32 - 1.0) as i32;
        let cases = [(QuantType::Q4K, 0), (QuantType::Q5K, 1), (QuantType::Q6K, 2), (QuantType::Q4K, 3)];
        let cases = cases.into_iter().chain([(QuantType::Q3K, 4), (QuantType::Q2K, 5), (QuantType::Q3K, 6)]);
        for (ty, block) in cases {
            let seed = block * 1000;
            let x: Vec<f32> = match ty {
                QuantType::Q3K | QuantType::Q6K => {
                    let d = f16::from_f32(0.01).to_f32();
                    let (neg, scale_neg) = if ty == QuantType::Q6K { (32, 128) } else { (4, 32) };
                    // One scale at the negative end, so the super-scale comes out as above.
                    let sc: Vec<i32> =
                        (0..16)
                            .map(|g| {
                                if g == 9 {
                                    -scale_neg
                                } else {
                                    int(seed + g, 2 * scale_neg as u32 - 1) - scale_neg + 1
                                }
                            })
                            .collect();
                    (0..256)
                        .map(|i| {
                            // Every group spans −neg..neg − 1, so its fit is the stored one.
                            let q = match i % 16 {
                                0 => -neg,
                                1 => neg - 1,
                                _ => int(seed + 50 + i, 2 * neg as u32) - neg,
                            };
                            d * sc[i / 16] as f32 * q as f32
                        })
                        .collect()
                }
                _ => {
                    // Q2_K: 16-value groups of 4 levels, 4-bit scales and mins; Q4_K, Q5_K: 32-value
                    // groups, 6-bit scales and mins.
                    let (size, levels, most) = match ty {
                        QuantType::Q2K => (16, 4, 15),
                        QuantType::Q4K => (32, 16, 63),
                        _ => (32, 32, 63),
                    };
                    let (d, dmin) = (f16::from_f32(0.02).to_f32(), f16::from_f32(0.005).to_f32());
                    // One scale and one min at the most, so the super-scales come out as above.
                    let sc: Vec<i32> = (0..256 / size)
                        .map(|g| if g == 3 { most } else { 1 + int(seed + g, most as u32 - 1) })
                        .collect();
                    let m: Vec<i32> = (0..256 / size)
                        .map(|g| if g == 5 { most } else { int(seed + 20 + g, most as u32 + 1) })
                        .collect();
                    (0..256)
                        .map(|i| {
                            // Every group spans 0..levels, so its fit is the stored one.
                            let q = match i % size {
                                0 => 0,
                                1 => levels - 1,
                                _ => int(seed + 50 + i, levels as u32),
                            };
                            d * sc[i / size] as f32 * q as f32 - dmin * m[i / size] as f32
                        })
                        .collect()
                }
            };
            assert!(rms_error(ty, &x) < 1e-6, "{ty}: rms error {}", rms_error(ty, &x));
        }
    }

    /// The AVX2 build of the searches gives the portable build's bytes in every format, on
    /// ordinary, constant, zero and one-signed blocks (on a CPU without AVX2 both calls take the
    /// portable build).
    #[test]
    fn every_build_gives_the_same_bytes() {
        let mut x: Vec<f32> =
            test_values(256 * 64, 8).iter().enumerate().map(|(i, v)| v * (1.0 + (i / 32 % 5) as f32)).collect();
        x[..256].fill(0.0);
        x[256..512].fill(-0.3);
        x[512..768].iter_mut().for_each(|v| *v = v.abs() + 0.5);
        x[768..1024].iter_mut().for_each(|v| *v = -v.abs() * 1e-6);
        let importance: Vec<f32> = test_values(256, 3).iter().map(|v| v.abs() * 4.0).collect();
        for ty in QuantType::ALL {
            let weighted = [("unweighted", None), ("by magnitude", Some(weights(ty, &x, None)))];
            let weighted = weighted.into_iter().chain([("by importance", Some(weights(ty, &x, Some(&importance))))]);
            for (how, w) in weighted {
                let (mut dispatched, mut portable) = (Vec::new(), Vec::new());
                blocks(ty, &x, w.as_deref(), &mut dispatched);
                blocks_in::<Portable>(ty, &x, w.as_deref(), &mut portable);
                assert!(dispatched == portable, "{ty} ({how}): the builds differ");
            }
        }
    }

    /// With an importance vector, the error where it is large falls: each format's error
    /// weighted by the importance is lower than without it (weighted by magnitude alone), and the
    /// error on the important columns falls.
    #[test]
    fn importance_moves_the_error_to_the_columns_that_matter_less() {
        let k = 512;
        let x: Vec<f32> =
            test_values(k * 16, 21).iter().enumerate().map(|(i, v)| v * (1.0 + (i % 7) as f32 * 0.3)).collect();
        // Every fourth column matters 100 times more.
        let importance: Vec<f32> = (0..k).map(|j| if j % 4 == 0 { 100.0 } else { 1.0 }).collect();
        for ty in QuantType::ALL {
            let decode = |importance: Option<&[f32]>| {
                let mut bytes = Vec::new();
                quantize_weighted(ty, &x, importance, &mut bytes).unwrap();
                let mut back = vec![0.0f32; x.len()];
                dequantize(ty, &bytes, &mut back);
                back
            };
            let (plain, weighted) = (decode(None), decode(Some(&importance)));
            // Squared errors on the important columns and on the rest.
            let split = |back: &[f32]| {
                let (mut hot, mut cold) = (0.0f64, 0.0f64);
                for (i, (b, x)) in back.iter().zip(&x).enumerate() {
                    let e = f64::from(b - x).powi(2);
                    if i % k % 4 == 0 { hot += e } else { cold += e }
                }
                (hot, cold)
            };
            let ((hot_plain, cold_plain), (hot_w, cold_w)) = (split(&plain), split(&weighted));
            let cost = |(hot, cold): (f64, f64)| 100.0 * hot + cold;
            eprintln!(
                "{ty}: important columns {hot_plain:.3e} -> {hot_w:.3e}, others {cold_plain:.3e} -> {cold_w:.3e}"
            );
            assert!(cost((hot_w, cold_w)) < cost((hot_plain, cold_plain)), "{ty}: the weighted error did not fall");
            assert!(hot_w < hot_plain, "{ty}: the important columns' error did not fall");
        }
        assert!(quantize_weighted(QuantType::Q4K, &x, Some(&importance[..100]), &mut Vec::new()).is_none());
        assert!(quantize_weighted(QuantType::Q8_0, &x[..k + 32], Some(&importance), &mut Vec::new()).is_none());
    }

    /// Without an importance vector the error is weighted by magnitude: in every format the
    /// largest tenth of the values (by magnitude) come out closer than plain squared error
    /// leaves them, at some cost to the rest.
    #[test]
    fn the_largest_values_are_kept_closer_than_plain_squared_error_keeps_them() {
        // Heavy-tailed values, as weights are: a few large ones in every block.
        let x: Vec<f32> = test_values(256 * 32, 17).iter().map(|v| v * v * v * 4.0 + v * 0.2).collect();
        let mut order: Vec<usize> = (0..x.len()).collect();
        order.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()));
        let largest = &order[..x.len() / 10];
        for ty in QuantType::ALL {
            let back = |bytes: &[u8]| {
                let mut back = vec![0.0f32; x.len()];
                dequantize(ty, bytes, &mut back);
                back
            };
            let (mut plain, mut weighted) = (Vec::new(), Vec::new());
            blocks(ty, &x, None, &mut plain);
            quantize(ty, &x, &mut weighted).unwrap();
            let error = |back: &[f32]| largest.iter().map(|&i| f64::from(back[i] - x[i]).powi(2)).sum::<f64>();
            let (plain, weighted) = (error(&back(&plain)), error(&back(&weighted)));
            eprintln!("{ty}: the largest tenth's squared error {plain:.3e} -> {weighted:.3e}");
            assert!(weighted < plain, "{ty}: {weighted} against plain squared error's {plain}");
        }
    }

    /// A checkpoint with non-finite, huge or tiny values quantizes without a panic, in blocks
    /// of the right size, and the blocks without such values decode as before.
    #[test]
    fn non_finite_values_do_not_panic() {
        let clean: Vec<f32> = test_values(512, 9);
        let mut x = clean.clone();
        for (i, v) in [(3, f32::NAN), (40, f32::INFINITY), (100, f32::NEG_INFINITY), (101, f32::MAX), (102, 1e-30)] {
            x[i] = v;
        }
        for ty in QuantType::ALL {
            let (mut bytes, mut reference) = (Vec::new(), Vec::new());
            quantize(ty, &x, &mut bytes).unwrap();
            quantize(ty, &clean, &mut reference).unwrap();
            assert_eq!(bytes.len(), reference.len(), "{ty}");
            // Values 256.. share no block with the odd ones.
            let half = bytes.len() / 2;
            assert_eq!(bytes[half..], reference[half..], "{ty}");
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
