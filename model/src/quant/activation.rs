//! Activations quantized per 32-value block to int8, as llama.cpp does before a quantized
//! product: `x ≈ d · q` with `d = max|x| / 127`. The block sums of q (whole, and per 16-value
//! half for Q6_K's sub-blocks) let the kernels apply the weights' offsets and minimums once per
//! block instead of once per value.

use pulp::Simd;
use pulp::x86::V4;
use rayon::prelude::*;

use super::packed::GROUP;
use crate::kernels::plain::Plain;

/// Rows of activations, each padded with zero blocks to `groups` blocks.
pub(crate) struct Activations {
    pub groups: usize,
    /// [rows · groups] the quantized values.
    pub q: Vec<[i8; GROUP]>,
    /// [rows · groups] the scale d.
    pub d: Vec<f32>,
    /// [rows · groups] d · Σ q.
    pub ds: Vec<f32>,
    /// [rows · groups] d · Σ q over each 16-value half.
    pub dsh: Vec<[f32; 2]>,
}

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 8;

impl Activations {
    /// Quantizes `m` rows of `k` values (`x` is [m, k] row-major) into rows of `groups` blocks
    /// (`groups · 32 ≥ k`; values past k are zero).
    pub fn quantize(x: &[f32], m: usize, k: usize, groups: usize) -> Self {
        assert!(x.len() == m * k && groups * GROUP >= k, "activations: {} values for [{m}, {k}]", x.len());
        let n = m * groups;
        let mut a = Self { groups, q: vec![[0; GROUP]; n], d: vec![0.0; n], ds: vec![0.0; n], dsh: vec![[0.0; 2]; n] };
        if n == 0 {
            return a;
        }
        let tasks = a.q.par_chunks_mut(groups * ROWS_PER_TASK).zip(a.d.par_chunks_mut(groups * ROWS_PER_TASK));
        let tasks =
            tasks.zip(a.ds.par_chunks_mut(groups * ROWS_PER_TASK)).zip(a.dsh.par_chunks_mut(groups * ROWS_PER_TASK));
        tasks.enumerate().for_each(|(t, (((q, d), ds), dsh))| {
            for r in 0..q.len() / groups {
                let row = &x[(t * ROWS_PER_TASK + r) * k..][..k];
                let span = r * groups..(r + 1) * groups;
                quantize_row(row, &mut q[span.clone()], &mut d[span.clone()], &mut ds[span.clone()], &mut dsh[span]);
            }
        });
        a
    }
}

/// 1.5·2²³: adding it to an f32 of magnitude below 2²² rounds the value to an integer.
const ROUND: f32 = 12_582_912.0;

fn quantize_row(row: &[f32], q: &mut [[i8; GROUP]], d: &mut [f32], ds: &mut [f32], dsh: &mut [[f32; 2]]) {
    match V4::try_new() {
        Some(simd) => simd.vectorize(QuantizeRow { simd, row, q, d, ds, dsh }),
        // The plain blocks, compiled for AVX2 where the CPU has it.
        None => Plain::new().vectorize(
            #[inline(always)]
            || quantize_row_plain(row, q, d, ds, dsh),
        ),
    }
}

#[inline(always)]
fn quantize_row_plain(row: &[f32], q: &mut [[i8; GROUP]], d: &mut [f32], ds: &mut [f32], dsh: &mut [[f32; 2]]) {
    for (g, block) in row.chunks(GROUP).enumerate() {
        let mut x = [0.0f32; GROUP];
        x[..block.len()].copy_from_slice(block);
        quantize_block(&x, &mut q[g], &mut d[g], &mut ds[g], &mut dsh[g]);
    }
}

/// One block in plain Rust (any CPU).
#[inline(always)]
fn quantize_block(x: &[f32; GROUP], q: &mut [i8; GROUP], d: &mut f32, ds: &mut f32, dsh: &mut [f32; 2]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let mut sums = [0i32; 2];
    for (i, (q, v)) in q.iter_mut().zip(x).enumerate() {
        // Round to nearest even by adding and taking away 1.5·2²³ (exact for |v·inv| ≤ 127):
        // vectorizes, where `round_ties_even` is a libm call per value without SSE4.1.
        *q = ((v * inv + ROUND) - ROUND) as i8;
        sums[i / 16] += *q as i32;
    }
    *d = scale;
    *ds = scale * (sums[0] + sums[1]) as f32;
    *dsh = [scale * sums[0] as f32, scale * sums[1] as f32];
}

/// A row's blocks on AVX-512: the same values as [`quantize_block`] (`vcvtps2dq` rounds to
/// nearest even, as the 1.5·2²³ trick does), two vectors per block.
struct QuantizeRow<'a> {
    simd: V4,
    row: &'a [f32],
    q: &'a mut [[i8; GROUP]],
    d: &'a mut [f32],
    ds: &'a mut [f32],
    dsh: &'a mut [[f32; 2]],
}

impl pulp::NullaryFnOnce for QuantizeRow<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let QuantizeRow { simd, row, q, d, ds, dsh } = self;
        let f = simd.avx512f;
        for (g, block) in row.chunks(GROUP).enumerate() {
            let mut x = [0.0f32; GROUP];
            x[..block.len()].copy_from_slice(block);
            let [x0, x1]: [pulp::f32x16; 2] = pulp::cast(x);
            let amax = simd.reduce_max_f32s(simd.max_f32s(simd.abs_f32s(x0), simd.abs_f32s(x1)));
            let scale = amax / 127.0;
            let inv = simd.splat_f32s(if amax > 0.0 { 127.0 / amax } else { 0.0 });
            let (q0, q1) = (
                f._mm512_cvtps_epi32(pulp::cast(simd.mul_f32s(x0, inv))),
                f._mm512_cvtps_epi32(pulp::cast(simd.mul_f32s(x1, inv))),
            );
            // Exact: at most 16 · 127 in magnitude.
            let (s0, s1) = (
                simd.reduce_sum_f32s(pulp::cast(f._mm512_cvtepi32_ps(q0))),
                simd.reduce_sum_f32s(pulp::cast(f._mm512_cvtepi32_ps(q1))),
            );
            let bytes: [[i8; 16]; 2] = [pulp::cast(f._mm512_cvtepi32_epi8(q0)), pulp::cast(f._mm512_cvtepi32_epi8(q1))];
            q[g] = pulp::cast(bytes);
            d[g] = scale;
            ds[g] = scale * (s0 + s1);
            dsh[g] = [scale * s0, scale * s1];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector path (AVX-512, or the plain blocks compiled for AVX2) gives exactly the plain
    /// path's values, ties included.
    #[test]
    #[cfg_attr(
        not(any(cpu_avx512, cpu_avx2)),
        ignore = "this CPU has neither AVX-512 nor AVX2 (only the plain path runs here)"
    )]
    fn the_vector_path_equals_the_plain_one() {
        assert!(
            V4::try_new().is_some() || pulp::x86::V3::try_new().is_some(),
            "the build saw the instructions this path needs; the run does not"
        );
        let mut x: Vec<f32> = crate::quant::test_values(5 * 70, 9).iter().map(|v| v * 3.0).collect();
        // Exact halves after scaling: amax 127 makes inv 1, so 2.5 and −0.5 are ties.
        x[..4].copy_from_slice(&[127.0, 2.5, -0.5, 1.5]);
        let (k, groups) = (70, 3);
        let got = Activations::quantize(&x, 5, k, groups);
        for r in 0..5 {
            for g in 0..groups {
                let mut block = [0.0f32; GROUP];
                let src = &x[r * k..(r + 1) * k];
                let part = &src[(g * GROUP).min(k)..((g + 1) * GROUP).min(k)];
                block[..part.len()].copy_from_slice(part);
                let (mut q, mut d, mut ds, mut dsh) = ([0i8; GROUP], 0.0, 0.0, [0.0; 2]);
                quantize_block(&block, &mut q, &mut d, &mut ds, &mut dsh);
                let i = r * groups + g;
                assert_eq!((got.q[i], got.d[i], got.ds[i], got.dsh[i]), (q, d, ds, dsh), "row {r} block {g}");
            }
        }
        assert_eq!(&got.q[0][..4], &[127, 2, 0, 2], "ties round to even");
    }

    /// Each value is within half a step of d · q; padding blocks are zero.
    #[test]
    fn blocks_round_to_within_half_a_step() {
        let (m, k) = (3, 70);
        let x: Vec<f32> = crate::quant::test_values(m * k, 3).iter().map(|v| v * 5.0).collect();
        let a = Activations::quantize(&x, m, k, 4);
        for r in 0..m {
            for i in 0..k {
                let g = r * 4 + i / GROUP;
                let back = a.d[g] * a.q[g][i % GROUP] as f32;
                assert!((back - x[r * k + i]).abs() <= a.d[g] * 0.5 + 1e-6, "row {r} value {i}");
            }
            let last = r * 4 + 3;
            assert_eq!((a.d[last], a.q[last]), (0.0, [0; GROUP]));
            let g = r * 4;
            let sum: i32 = a.q[g].iter().map(|&q| q as i32).sum();
            assert_eq!(a.ds[g], a.d[g] * sum as f32);
        }
    }
}
