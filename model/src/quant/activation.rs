//! Activations quantized per 32-value block to int8, as llama.cpp does before a quantized
//! product: `x ≈ d · q` with `d = max|x| / 127`. The block sums of q (whole, and per 16-value
//! half for Q6_K's sub-blocks) let the kernels apply the weights' offsets and minimums once per
//! block instead of once per value. For K-quant weights a kernel may ask for one scale per
//! 256-value super-block (llama.cpp's Q8_K): its blocks then share `d`, and the weights'
//! sub-block scales can multiply the integer sums before anything is converted to float.
//!
//! `unsafe` (C8: the reason): [`block`] reads an element without a bounds check, for the kernels'
//! inner loops, which check once per tile that every block they read is there
//! ([`Activations::cover`]).
#![allow(unsafe_code)]

use pulp::Simd;
use pulp::x86::V4;
use rayon::prelude::*;

use super::packed::GROUP;
use crate::kernels::plain::Plain;

/// Rows of activations, each padded with zero blocks to `groups` blocks.
pub(crate) struct Activations {
    pub groups: usize,
    /// Blocks per run that shares one scale (1, or 8: a K-quant super-block's).
    pub shared: usize,
    /// [rows · groups] the quantized values.
    pub q: Vec<[i8; GROUP]>,
    /// [rows · groups] the scale d.
    pub d: Vec<f32>,
    /// [rows · groups] d · Σ q.
    pub ds: Vec<f32>,
    /// [rows · groups] d · Σ q over each 16-value half.
    pub dsh: Vec<[f32; 2]>,
    /// [rows · groups] Σ q over each 16-value half (at most 16 · 127 in magnitude).
    pub sums: Vec<[i16; 2]>,
    /// [rows · groups] Σ q times each of [`OFFSETS`]: where a format's weights are `d · (u + o)`
    /// with unsigned u and a constant offset o, a kernel starts the block's integer sum Σ u · q
    /// with o · Σ q instead of adding the offset's term in float afterwards.
    pub offset_sums: Vec<[i32; 3]>,
}

impl Activations {
    /// Whether rows `x0..x0 + rows` hold blocks `0..covered` in every array: what a kernel's
    /// tile checks once before it reads its blocks with [`block`].
    pub(crate) fn cover(&self, x0: usize, rows: usize, covered: usize) -> bool {
        let n = self.q.len();
        let equal = [self.d.len(), self.ds.len(), self.dsh.len(), self.sums.len(), self.offset_sums.len()];
        covered <= self.groups && (x0 + rows) * self.groups <= n && equal.iter().all(|&len| len == n)
    }
}

/// Element `a` of `v`, unchecked: a kernel's inner loop reads each of its rows' blocks a group,
/// and a bounds check on each took a compare and a branch (on ports the vector instructions use).
///
/// # Safety
/// `a < v.len()` (for the arrays of [`Activations`]: a block of a row that
/// [`Activations::cover`] found covered).
#[inline(always)]
pub(crate) unsafe fn block<T>(v: &[T], a: usize) -> &T {
    debug_assert!(a < v.len());
    // SAFETY: the caller's.
    unsafe { v.get_unchecked(a) }
}

/// The formats' constant offsets (`offset_sums`): −128 (Q8_0, IQ4_NL and MXFP4 as their
/// levels + 128), −16 (Q5_0), −8 (Q4_0).
pub(crate) const OFFSETS: [i32; 3] = [-128, -16, -8];

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 8;

impl Activations {
    /// Quantizes `m` rows of `k` values (`x` is [m, k] row-major) into rows of `groups` blocks
    /// (`groups · 32 ≥ k`; values past k are zero), each run of `shared` blocks with one scale
    /// (1, or 8 for a K-quant's super-block; it divides `groups`).
    pub fn quantize(x: &[f32], m: usize, k: usize, groups: usize, shared: usize) -> Self {
        assert!(x.len() == m * k && groups * GROUP >= k, "activations: {} values for [{m}, {k}]", x.len());
        assert!(shared > 0 && groups.is_multiple_of(shared), "activations: {groups} blocks in runs of {shared}");
        let n = m * groups;
        let mut a = Self {
            groups,
            shared,
            q: vec![[0; GROUP]; n],
            d: vec![0.0; n],
            ds: vec![0.0; n],
            dsh: vec![[0.0; 2]; n],
            sums: vec![[0; 2]; n],
            offset_sums: vec![[0; 3]; n],
        };
        if n == 0 {
            return a;
        }
        let per_task = groups * ROWS_PER_TASK;
        let tasks = a.q.par_chunks_mut(per_task).zip(a.d.par_chunks_mut(per_task));
        let tasks = tasks.zip(a.ds.par_chunks_mut(per_task)).zip(a.dsh.par_chunks_mut(per_task));
        let tasks = tasks.zip(a.sums.par_chunks_mut(per_task)).zip(a.offset_sums.par_chunks_mut(per_task));
        tasks.enumerate().for_each(|(t, (((((q, d), ds), dsh), sums), offset_sums))| {
            for r in 0..q.len() / groups {
                let row = &x[(t * ROWS_PER_TASK + r) * k..][..k];
                let at = r * groups..(r + 1) * groups;
                let blocks = Blocks {
                    q: &mut q[at.clone()],
                    d: &mut d[at.clone()],
                    ds: &mut ds[at.clone()],
                    dsh: &mut dsh[at.clone()],
                    sums: &mut sums[at.clone()],
                };
                quantize_row(row, shared, blocks);
                for (o, s) in offset_sums[at.clone()].iter_mut().zip(&sums[at]) {
                    *o = OFFSETS.map(|offset| offset * (s[0] as i32 + s[1] as i32));
                }
            }
        });
        a
    }
}

/// One row's blocks, to fill.
struct Blocks<'a> {
    q: &'a mut [[i8; GROUP]],
    d: &'a mut [f32],
    ds: &'a mut [f32],
    dsh: &'a mut [[f32; 2]],
    sums: &'a mut [[i16; 2]],
}

/// 1.5·2²³: adding it to an f32 of magnitude below 2²² rounds the value to an integer.
const ROUND: f32 = 12_582_912.0;

fn quantize_row(row: &[f32], shared: usize, blocks: Blocks<'_>) {
    match V4::try_new() {
        Some(simd) if shared == 1 => simd.vectorize(QuantizeRow { simd, row, blocks }),
        // The plain blocks, compiled for AVX2 where the CPU has it.
        _ => Plain::new().vectorize(
            #[inline(always)]
            || quantize_row_plain(row, shared, blocks),
        ),
    }
}

#[inline(always)]
fn quantize_row_plain(row: &[f32], shared: usize, b: Blocks<'_>) {
    // Blocks `g..g + n` of the row as it is (the padding past its end is zero).
    let span = |g: usize, n: usize| &row[(g * GROUP).min(row.len())..((g + n) * GROUP).min(row.len())];
    for g0 in (0..b.q.len()).step_by(shared) {
        let amax = span(g0, shared).iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for g in g0..g0 + shared {
            let mut x = [0.0f32; GROUP];
            let part = span(g, 1);
            x[..part.len()].copy_from_slice(part);
            quantize_block(&x, amax, &mut b.q[g], &mut b.d[g], &mut b.ds[g], &mut b.dsh[g], &mut b.sums[g]);
        }
    }
}

/// One block in plain Rust (any CPU), with the scale `amax / 127` (its own maximum, or its
/// super-block's).
#[inline(always)]
fn quantize_block(
    x: &[f32; GROUP],
    amax: f32,
    q: &mut [i8; GROUP],
    d: &mut f32,
    ds: &mut f32,
    dsh: &mut [f32; 2],
    sums_out: &mut [i16; 2],
) {
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
    *sums_out = [sums[0] as i16, sums[1] as i16];
}

/// A row's blocks on AVX-512: the same values as [`quantize_block`] (`vcvtps2dq` rounds to
/// nearest even, as the 1.5·2²³ trick does), two vectors per block.
struct QuantizeRow<'a> {
    simd: V4,
    row: &'a [f32],
    blocks: Blocks<'a>,
}

impl pulp::NullaryFnOnce for QuantizeRow<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let QuantizeRow { simd, row, blocks: Blocks { q, d, ds, dsh, sums } } = self;
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
            sums[g] = [s0 as i16, s1 as i16];
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
        let got = Activations::quantize(&x, 5, k, groups, 1);
        for r in 0..5 {
            for g in 0..groups {
                let mut block = [0.0f32; GROUP];
                let src = &x[r * k..(r + 1) * k];
                let part = &src[(g * GROUP).min(k)..((g + 1) * GROUP).min(k)];
                block[..part.len()].copy_from_slice(part);
                let (mut q, mut d, mut ds, mut dsh, mut sums) = ([0i8; GROUP], 0.0, 0.0, [0.0; 2], [0; 2]);
                let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                quantize_block(&block, amax, &mut q, &mut d, &mut ds, &mut dsh, &mut sums);
                let i = r * groups + g;
                let got_i = (got.q[i], got.d[i], got.ds[i], got.dsh[i], got.sums[i]);
                assert_eq!(got_i, (q, d, ds, dsh, sums), "row {r} block {g}");
            }
        }
        assert_eq!(&got.q[0][..4], &[127, 2, 0, 2], "ties round to even");
    }

    /// Each value is within half a step of d · q; padding blocks are zero.
    #[test]
    fn blocks_round_to_within_half_a_step() {
        let (m, k) = (3, 70);
        let x: Vec<f32> = crate::quant::test_values(m * k, 3).iter().map(|v| v * 5.0).collect();
        let a = Activations::quantize(&x, m, k, 4, 1);
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
            assert_eq!(a.offset_sums[g], [-128 * sum, -16 * sum, -8 * sum]);
            let halves = [0, 16].map(|h| a.q[g][h..h + 16].iter().map(|&q| q as i32).sum::<i32>() as i16);
            assert_eq!(a.sums[g], halves);
        }
    }

    /// Runs of 8 blocks (a K-quant super-block) share one scale, their largest value's: each
    /// value within half of that step, one value at ±127 in each run.
    #[test]
    fn super_blocks_share_one_scale() {
        let (m, k) = (2, 600);
        let mut x: Vec<f32> = crate::quant::test_values(m * k, 5).iter().map(|v| v * 2.0).collect();
        x[300] = 40.0; // one large value: its run's scale, not its neighbours'
        let a = Activations::quantize(&x, m, k, 24, 8);
        assert_eq!(a.shared, 8);
        for r in 0..m {
            for run in 0..3 {
                let blocks = r * 24 + run * 8..r * 24 + run * 8 + 8;
                let d = a.d[blocks.start];
                assert!(a.d[blocks.clone()].iter().all(|&b| b == d), "row {r} run {run}");
                let values: Vec<f32> =
                    (run * 256..run * 256 + 256).map(|i| if i < k { x[r * k + i] } else { 0.0 }).collect();
                let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert_eq!(d, amax / 127.0, "row {r} run {run}");
                for (i, v) in values.iter().enumerate() {
                    let b = blocks.start + i / GROUP;
                    assert!((d * a.q[b][i % GROUP] as f32 - v).abs() <= d * 0.5 + 1e-6, "row {r} value {i}");
                }
                assert!(a.q[blocks].iter().flatten().any(|&q| q.abs() == 127));
            }
        }
    }
}
