//! `e^x` on AVX-512 (Cephes' `expf`: range reduction by ln 2 and a degree-5 polynomial, within
//! 2 ulp of libm), for SwiGLU's gate, attention's softmax and the sampler's log-probabilities,
//! where the scalar libm call per value was a visible share of a token.

use pulp::x86::V4;
use pulp::{Simd, f32x16};

const LANES: usize = 16;

/// The inputs' range, where `e^x` is a normal f32 (see [`exp`]).
pub(super) const MIN: f32 = -87.3;
pub(super) const MAX: f32 = 88.3;
/// Adding and taking away 1.5 · 2²³ rounds an f32 of magnitude below 2²² to the nearest integer.
pub(super) const ROUND: f32 = 12_582_912.0;
/// ln 2 in two parts: the first has 9 significant bits, so k times it is exact for |k| < 2¹⁵.
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
/// The polynomial p(r), highest power first: `e^r ≈ 1 + r + r² · p(r)` for |r| ≤ ln 2 / 2.
pub(super) const POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `e^x` per lane. Inputs are clamped to [-87.3, 88.3], where the result is a normal f32: below,
/// `silu` takes `1 + e^x` as 1 and above it as ∞ either way.
#[inline(always)]
pub(super) fn exp(simd: V4, x: f32x16) -> f32x16 {
    let x = simd.min_f32s(simd.max_f32s(x, simd.splat_f32s(MIN)), simd.splat_f32s(MAX));
    // x = k · ln 2 + r, |r| ≤ ln 2 / 2, with ln 2 in two parts so that r is exact.
    // Round to nearest by adding and taking away 1.5 · 2²³ (pulp 0.22's `round_f32x16` rounds
    // the lanes as f64s).
    let magic = simd.splat_f32s(ROUND);
    let k = simd.sub_f32s(simd.mul_add_f32s(x, simd.splat_f32s(std::f32::consts::LOG2_E), magic), magic);
    let r = simd.negate_mul_add_f32x16(k, simd.splat_f32s(LN2_HI), x);
    let r = simd.negate_mul_add_f32x16(k, simd.splat_f32s(LN2_LO), r);
    let mut p = simd.splat_f32s(POLY[0]);
    for c in &POLY[1..] {
        p = simd.mul_add_f32s(p, r, simd.splat_f32s(*c));
    }
    let p = simd.add_f32s(simd.mul_add_f32s(simd.mul_f32s(p, r), r, r), simd.splat_f32s(1.0));
    // 2^k from the exponent bits: k + 127 lies in [1, 254].
    let k = simd.convert_f32x16_to_i32x16(k);
    let bits = simd.shl_const_i32x16::<23>(simd.add_i32s(k, simd.splat_i32s(127)));
    simd.mul_f32s(p, pulp::cast(bits))
}

/// Replaces each `x` by `e^(x − max)` and returns their sum.
#[inline(always)]
pub(super) fn exp_sub_sum(simd: V4, xs: &mut [f32], max: f32) -> f32 {
    let (head, tail) = pulp::as_arrays_mut::<LANES, f32>(xs);
    let m = simd.splat_f32s(max);
    let mut sum = simd.splat_f32s(0.0);
    for x in head {
        let e = exp(simd, simd.sub_f32s(pulp::cast(*x), m));
        sum = simd.add_f32s(sum, e);
        *x = pulp::cast(e);
    }
    let mut total = simd.reduce_sum_f32s(sum);
    for x in tail {
        *x = (*x - max).exp();
        total += *x;
    }
    total
}

/// `e^x` as [`exp`] computes it, one value in plain Rust: in a loop inlined into a function
/// compiled for AVX2 and FMA, LLVM turns it into 8-lane vector code.
#[inline(always)]
pub(super) fn exp_plain(x: f32) -> f32 {
    let x = x.clamp(MIN, MAX);
    let rounded = x * std::f32::consts::LOG2_E + ROUND;
    let k = rounded - ROUND;
    let r = x - k * LN2_HI;
    let r = r - k * LN2_LO;
    let mut p = POLY[0];
    for c in &POLY[1..] {
        p = p * r + c;
    }
    let p = p * r * r + r + 1.0;
    // k as an integer from the bits of k + 1.5 · 2²³ (one unit a step there): `k as i32`, a
    // saturating conversion, kept LLVM from vectorizing the loops this is inlined into.
    let k = (rounded.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    p * f32::from_bits((k.wrapping_add(127) << 23) as u32)
}

/// [`exp_sub_sum`] in plain Rust (see [`exp_plain`]).
#[inline(always)]
pub(super) fn exp_sub_sum_plain(xs: &mut [f32], max: f32) -> f32 {
    use super::plain::LANES;
    let (head, tail) = xs.as_chunks_mut::<LANES>();
    let mut sum = [0.0f32; LANES];
    for x in head {
        for l in 0..LANES {
            x[l] = exp_plain(x[l] - max);
            sum[l] += x[l];
        }
    }
    let mut total: f32 = sum.iter().sum();
    for x in tail {
        *x = exp_plain(*x - max);
        total += *x;
    }
    total
}

/// A sampler's unnormalised probability of logit `l`, `e^((l − max) / t)`, as `exp_plain`
/// computes it, and 0 where the exponent is below −87.3 (so −∞, a masked token, and NaN weigh
/// nothing). Plain IEEE operations (no fused multiply-add, which Rust never contracts to): the
/// same value for one candidate as for a whole row's [`draw_weights`], in every build and on
/// every CPU, so that a draw among a row's best candidates equals the draw from the row.
#[inline(always)]
pub fn draw_weight(l: f32, max: f32, t: f32) -> f32 {
    let x = (l - max) / t;
    if x >= MIN { exp_plain(x) } else { 0.0 }
}

/// [`draw_weight`] of each logit of `row` into `out` (its length `row`'s): compiled for
/// AVX-512 or AVX2 where the CPU has them, so that LLVM computes 16 or 8 at a time (the
/// vocabulary's 151,936 through libm's `expf` one at a time were most of a sampled token's
/// draw).
pub fn draw_weights(row: &[f32], max: f32, t: f32, out: &mut Vec<f32>) {
    out.clear();
    out.resize(row.len(), 0.0);
    widest(
        #[inline(always)]
        || weigh(row, max, t, out),
    )
}

/// Rows of a task of [`softmax_rows`].
const SOFTMAX_ROWS: usize = 8;

/// Each row of `values` (rows of `e`) becomes the softmax of `row · scale + mask`, in place, the
/// rows in tasks on the rayon pool: `mask` ([n, e], additive) gives row j of every run of
/// `rows_per_lead` rows its row j mod n. A row masked whole becomes zeros.
pub fn softmax_rows(values: &mut [f32], e: usize, scale: f32, mask: Option<&[f32]>, rows_per_lead: usize) {
    use rayon::prelude::*;
    let n = mask.map_or(1, |m| m.len() / e.max(1));
    values.par_chunks_mut(e * SOFTMAX_ROWS).enumerate().for_each(|(task, rows)| {
        for (k, row) in rows.chunks_mut(e).enumerate() {
            let j = (task * SOFTMAX_ROWS + k) % rows_per_lead.max(1);
            let mask = mask.map(|m| &m[(j % n) * e..(j % n + 1) * e]);
            match V4::try_new() {
                Some(simd) => simd.vectorize(
                    #[inline(always)]
                    || softmax_row(row, scale, mask, |xs, max| exp_sub_sum(simd, xs, max)),
                ),
                None => super::plain::Plain::new().vectorize(
                    #[inline(always)]
                    || softmax_row(row, scale, mask, exp_sub_sum_plain),
                ),
            }
        }
    });
}

/// One row of [`softmax_rows`], its exponentials by `exp_sub_sum`.
#[inline(always)]
fn softmax_row(row: &mut [f32], scale: f32, mask: Option<&[f32]>, exp_sub_sum: impl FnOnce(&mut [f32], f32) -> f32) {
    match mask {
        Some(mask) => row.iter_mut().zip(mask).for_each(|(x, m)| *x = *x * scale + m),
        None => row.iter_mut().for_each(|x| *x *= scale),
    }
    let max = max_of(row);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let inv = 1.0 / exp_sub_sum(row, max);
    row.iter_mut().for_each(|x| *x *= inv);
}

/// [`draw_weights`]' loop, inlined into the function compiled for the CPU's vectors.
#[inline(always)]
fn weigh(row: &[f32], max: f32, t: f32, out: &mut [f32]) {
    for (w, &l) in out.iter_mut().zip(row) {
        *w = draw_weight(l, max, t);
    }
}

/// Runs `f`, plain Rust over arrays of lanes, compiled for AVX-512 where the CPU has it, else
/// as [`Plain::vectorize`](super::plain::Plain::vectorize) runs it: its body must be inlined
/// (`#[inline(always)]` on the closure and everything it calls).
#[inline(always)]
fn widest<F: pulp::NullaryFnOnce>(f: F) -> F::Output {
    match V4::try_new() {
        Some(simd) => simd.vectorize(f),
        None => super::plain::Plain::new().vectorize(f),
    }
}

/// The largest value of `row`, NaN left out (−∞ for an empty row or one of NaN alone): a
/// logits row's, which its weights and log-probabilities are taken relative to. Sixteen
/// running maxima, compiled for the CPU's vectors as [`draw_weights`] is (a fold of `f32::max`
/// ran a value at a time).
pub fn row_max(row: &[f32]) -> f32 {
    widest(
        #[inline(always)]
        || max_of(row),
    )
}

/// [`row_max`]'s loop.
#[inline(always)]
fn max_of(row: &[f32]) -> f32 {
    let mut maxima = [f32::NEG_INFINITY; LANES];
    let (lanes, tail) = row.as_chunks::<LANES>();
    for lane in lanes {
        for (m, &v) in maxima.iter_mut().zip(lane) {
            *m = if v > *m { v } else { *m };
        }
    }
    maxima.iter().chain(tail).copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Σ of the weights at least `floor` (a whole row's [`draw_weights`]), in f64: eight partial
/// sums, compiled for the CPU's vectors as [`draw_weights`] is.
pub fn weights_total(weights: &[f32], floor: f32) -> f64 {
    widest(
        #[inline(always)]
        || sum_at_least(weights, floor),
    )
}

/// [`weights_total`]' loop.
#[inline(always)]
fn sum_at_least(weights: &[f32], floor: f32) -> f64 {
    let mut sums = [0.0f64; 8];
    let (lanes, tail) = weights.as_chunks::<8>();
    for lane in lanes {
        for (sum, &w) in sums.iter_mut().zip(lane) {
            *sum += if w >= floor { f64::from(w) } else { 0.0 };
        }
    }
    let tail: f64 = tail.iter().filter(|w| **w >= floor).map(|&w| f64::from(w)).sum();
    sums.iter().sum::<f64>() + tail
}

/// Calls `f(i, w)` for each weight `w` of `weights` (a whole row's [`draw_weights`]) at least
/// `floor` and above 0, in order: the tokens a draw's walk reaches first. Sixteen at a time are
/// passed over where none is (their largest found with vectors, compiled as [`draw_weights`]).
pub fn weights_at_least(weights: &[f32], floor: f32, f: impl FnMut(usize, f32)) {
    widest(
        #[inline(always)]
        || each_at_least(weights, floor, f),
    )
}

/// [`weights_at_least`]' loop.
#[inline(always)]
fn each_at_least(weights: &[f32], floor: f32, mut f: impl FnMut(usize, f32)) {
    let (chunks, tail) = weights.as_chunks::<LANES>();
    let mut each = |at: usize, values: &[f32]| {
        for (j, &w) in values.iter().enumerate() {
            if w >= floor && w > 0.0 {
                f(at + j, w);
            }
        }
    };
    for (c, chunk) in chunks.iter().enumerate() {
        let top = chunk.iter().fold(0.0f32, |m, &w| if w > m { w } else { m });
        if top >= floor && top > 0.0 {
            each(c * LANES, chunk);
        }
    }
    each(chunks.len() * LANES, tail);
}

/// `ln Σ e^x` over `row` (−∞ for an empty row): the normaliser of log-probabilities.
pub fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row_max(row);
    if !max.is_finite() {
        return max;
    }
    let sum = match V4::try_new() {
        Some(simd) => simd.vectorize(SumExp { simd, row, max }),
        None => row.iter().map(|x| (x - max).exp()).sum(),
    };
    max + sum.ln()
}

/// `Σ e^(x − max)`, as a callable that `V4::vectorize` inlines into its AVX-512 function.
struct SumExp<'a> {
    simd: V4,
    row: &'a [f32],
    max: f32,
}

impl pulp::NullaryFnOnce for SumExp<'_> {
    type Output = f32;

    #[inline(always)]
    fn call(self) -> f32 {
        let SumExp { simd, row, max } = self;
        let (head, tail) = pulp::as_arrays::<LANES, f32>(row);
        let m = simd.splat_f32s(max);
        let mut sum = simd.splat_f32s(0.0);
        for x in head {
            sum = simd.add_f32s(sum, exp(simd, simd.sub_f32s(pulp::cast(*x), m)));
        }
        simd.reduce_sum_f32s(sum) + tail.iter().map(|x| (x - max).exp()).sum::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's maximum, its weights' total and the weights at least a floor, each against a
    /// value at a time: rows of every length around the lanes, NaN, −∞ and a maximum in the tail.
    #[test]
    fn row_max_total_and_heavy_weights_equal_plain_loops() {
        for n in [0, 1, 7, 8, 15, 16, 17, 33, 1000, 151_936] {
            let mut row: Vec<f32> = crate::kernels::test_values(n, 7).iter().map(|v| v * 10.0).collect();
            if n > 3 {
                row[1] = f32::NAN;
                row[2] = f32::NEG_INFINITY;
                row[n - 1] = 50.0;
            }
            let want = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(row_max(&row).to_bits(), want.to_bits(), "max of {n}");
            let mut weights = Vec::new();
            draw_weights(&row, want, 0.7, &mut weights);
            for floor in [0.0, 1e-9, 1.0 / 256.0, 0.5, 1.0] {
                let sum: f64 = weights.iter().filter(|w| **w >= floor).map(|&w| f64::from(w)).sum();
                let total = weights_total(&weights, floor);
                assert!((total - sum).abs() <= 1e-12 * sum.max(1.0), "{n} at {floor}: {total} vs {sum}");
                let mut heavy = Vec::new();
                weights_at_least(&weights, floor, |i, w| heavy.push((i, w)));
                let want: Vec<(usize, f32)> =
                    weights.iter().copied().enumerate().filter(|(_, w)| *w >= floor && *w > 0.0).collect();
                assert_eq!(heavy, want, "{n} at {floor}");
            }
        }
        assert!(row_max(&[f32::NAN, f32::NAN]) == f32::NEG_INFINITY);
    }

    /// Rows around the lanes, scaled, with and without a mask whose rows repeat every `n` rows of
    /// each run of `r`, one row masked whole; against f64.
    #[test]
    fn softmax_rows_match_an_f64_reference() {
        for e in [1, 15, 16, 17, 80, 1024] {
            let (runs, r, n) = (3, 4, 2);
            let values: Vec<f32> = crate::kernels::test_values(runs * r * e, 5).iter().map(|v| v * 20.0).collect();
            let mut mask: Vec<f32> = crate::kernels::test_values(n * e, 9).iter().map(|v| v * 3.0).collect();
            mask[e..].fill(f32::NEG_INFINITY); // mask row 1: every column
            for masked in [false, true] {
                let mut got = values.clone();
                softmax_rows(&mut got, e, 0.125, masked.then_some(&mask[..]), r);
                for (i, (row, got)) in values.chunks(e).zip(got.chunks(e)).enumerate() {
                    let m = masked.then(|| &mask[((i % r) % n) * e..][..e]);
                    let x: Vec<f64> =
                        (0..e).map(|c| f64::from(row[c]) * 0.125 + m.map_or(0.0, |m| f64::from(m[c]))).collect();
                    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = x.iter().map(|v| (v - max).exp()).sum();
                    for (c, &g) in got.iter().enumerate() {
                        let want = if max == f64::NEG_INFINITY { 0.0 } else { (x[c] - max).exp() / sum };
                        assert!((f64::from(g) - want).abs() < 1e-6, "e {e} row {i} col {c}: {g} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn log_sum_exp_matches_an_f64_reference() {
        for n in [0, 1, 15, 16, 17, 1000, 151_936] {
            let row: Vec<f32> = crate::kernels::test_values(n, 3).iter().map(|v| v * 30.0).collect();
            let got = log_sum_exp(&row);
            if n == 0 {
                assert_eq!(got, f32::NEG_INFINITY);
                continue;
            }
            let max = row.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64));
            let want = max + row.iter().map(|v| (*v as f64 - max).exp()).sum::<f64>().ln();
            assert!((got as f64 - want).abs() < 1e-5 * want.abs().max(1.0), "n {n}: {got} vs {want}");
        }
        assert_eq!(log_sum_exp(&[f32::NEG_INFINITY, 1.0]), 1.0);
    }

    /// The plain exponential is within a few ulp of libm's over the range the kernels use,
    /// and gives 0-ish and ∞-ish results at the clamps, never NaN from ±∞.
    #[test]
    fn the_plain_exponential_matches_libm() {
        for i in 0..=20_000 {
            let x = -87.0 + i as f32 * (175.0 / 20_000.0);
            let (got, want) = (exp_plain(x), (x as f64).exp());
            assert!(((got as f64 - want) / want).abs() < 4e-7, "e^{x}: {got} vs {want}");
        }
        assert!(exp_plain(f32::NEG_INFINITY) < 1e-37 && exp_plain(f32::INFINITY) > 1e38);
        let mut xs = [1.0f32, 2.0, 3.0, 0.5, -1.0, 2.5, 0.0, 1.5, 2.0, -3.0];
        let want: f64 = xs.iter().map(|x| (*x as f64 - 3.0).exp()).sum();
        assert!((exp_sub_sum_plain(&mut xs, 3.0) as f64 - want).abs() < 1e-6);
        assert!((xs[2] - 1.0).abs() < 1e-7);
    }

    /// A row's weights equal each value's own, bit for bit (however the row's loop is
    /// compiled), are within libm's rounding of `e^((l − max) / t)`, and are 0 for −∞, NaN and
    /// exponents below −87.3.
    #[test]
    fn a_rows_draw_weights_equal_each_values_own() {
        let mut row: Vec<f32> = crate::kernels::test_values(1003, 9).iter().map(|v| v * 40.0).collect();
        row[5] = f32::NEG_INFINITY;
        row[6] = f32::NAN;
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for t in [0.3f32, 0.7, 1.0, 2.5] {
            let mut out = Vec::new();
            draw_weights(&row, max, t, &mut out);
            assert_eq!(out.len(), row.len());
            for (i, (&w, &l)) in out.iter().zip(&row).enumerate() {
                assert_eq!(w.to_bits(), draw_weight(l, max, t).to_bits(), "t {t}, value {i}");
                // The exponent as the f32 arithmetic rounds it.
                let x = f64::from((l - max) / t);
                if l.is_nan() || x < f64::from(MIN) {
                    assert_eq!(w, 0.0, "t {t}, value {i}: {l}");
                } else {
                    assert!((f64::from(w) - x.exp()).abs() <= 1e-6 * x.exp(), "t {t}, value {i}: {w} vs {}", x.exp());
                }
            }
        }
    }
}
