//! `y = x·Wᵀ (+ b)` for few rows of `x`, with the weight in the checkpoint's `[out, in]` layout,
//! f32 or f16, on AVX-512.
//!
//! Each output is the dot product of an `x` row with a weight row, and both are contiguous in
//! `in`, so the kernel streams the weight once, straight from its storage: no repacking (the
//! `gemm` crate packs the right-hand side on every call, which at 16 rows costs as much as the
//! product), f16 weights widened to f32 in registers and accumulated in f32. The weight rows are
//! split into blocks run on the rayon pool; within a block a 4×4 tile of (x row, weight row)
//! pairs keeps 16 accumulators in registers, so every weight vector loaded feeds up to four FMAs;
//! with at most four rows of `x` a tile takes one weight row, so each thread streams the weight
//! sequentially.

use burn::tensor::{bf16, f16};
use pulp::x86::V4;
use pulp::{Simd, f32x16};
use rayon::prelude::*;

use super::prefetch::{AHEAD, prefetch};
use super::xwt_avx2;

const LANES: usize = 16;
/// Tile size: x rows × weight rows per inner loop (16 zmm accumulators).
const MR: usize = 4;
const NR: usize = 4;
/// Products of at most this many rows run one weight row per tile (see `block_product`).
const STREAM_ROWS: usize = 4;

/// A weight element's layout, for kernels that load it through a pointer (`xwt_avx2.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    F32,
    F16,
    Bf16,
}

/// A weight element the kernel widens to f32.
pub trait Weight: Copy + Send + Sync {
    const KIND: Kind;
    /// Sixteen consecutive elements as f32 lanes.
    fn load(simd: V4, v: &[Self; LANES]) -> f32x16;
    fn to_f32(self) -> f32;
    /// `src` as f32 into `dst` (the same length), vectorized where the CPU can (F16C).
    fn widen_slice(src: &[Self], dst: &mut [f32]);
}

impl Weight for f32 {
    const KIND: Kind = Kind::F32;
    #[inline(always)]
    fn load(_simd: V4, v: &[f32; LANES]) -> f32x16 {
        pulp::cast(*v)
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn widen_slice(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl Weight for f16 {
    const KIND: Kind = Kind::F16;
    #[inline(always)]
    fn load(simd: V4, v: &[f16; LANES]) -> f32x16 {
        let bits: [u16; LANES] = pulp::cast(*v);
        pulp::cast(simd.avx512f._mm512_cvtph_ps(pulp::cast(bits)))
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn widen_slice(src: &[f16], dst: &mut [f32]) {
        super::f16c::widen(src, dst);
    }
}

impl Weight for bf16 {
    const KIND: Kind = Kind::Bf16;
    #[inline(always)]
    fn load(simd: V4, v: &[bf16; LANES]) -> f32x16 {
        // A bf16 is the top half of an f32: widen each to 32 bits and shift it into place.
        let bits: pulp::u16x16 = pulp::cast(*v);
        pulp::cast(simd.shl_const_u32x16::<16>(simd.convert_u16x16_to_u32x16(bits)))
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn widen_slice(src: &[bf16], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    }
}

/// The operands of one product; `x` is [m, k], `w` is [n, k], `bias` is [n].
pub struct Product<'a, W> {
    pub x: &'a [f32],
    pub w: &'a [W],
    pub bias: Option<&'a [f32]>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl<W> Product<'_, W> {
    /// Panics unless the operands have the sizes their shapes say.
    pub(super) fn check(&self) {
        assert!(
            self.x.len() == self.m * self.k && self.w.len() == self.n * self.k,
            "x·Wᵀ: operand sizes do not match their shapes"
        );
        assert!(self.bias.is_none_or(|b| b.len() == self.n), "x·Wᵀ: bias size does not match the outputs");
    }
}

/// Runs the product on AVX-512, else on AVX2 (`xwt_avx2.rs`); `None` when the CPU has neither
/// (the caller falls back).
///
/// # Shapes
/// returns [m, n] row-major
pub fn run<W: Weight>(p: &Product<'_, W>) -> Option<Vec<f32>> {
    let simd = V4::try_new();
    if simd.is_none() && !xwt_avx2::available() {
        return None;
    }
    p.check();
    let mut out = vec![0.0f32; p.m * p.n];
    if p.m == 0 || p.n == 0 {
        return Some(out);
    }
    let (block, pieces) = column_blocks(&mut out, p.n);
    pieces.into_par_iter().enumerate().for_each(|(b, mut rows)| match simd {
        Some(simd) => simd.vectorize(Block { simd, p, j0: b * block, rows: &mut rows }),
        None => xwt_avx2::block_product(p, b * block, &mut rows),
    });
    Some(out)
}

/// `out` ([m, n] row-major, n > 0) split into blocks of columns, one task each: the block width
/// (a multiple of NR weight rows; about four blocks per thread balances the pool) and, per
/// block b, `out[i][b · width..]` of every row i, so each task owns its columns.
pub(super) fn column_blocks(out: &mut [f32], n: usize) -> (usize, Vec<Vec<&mut [f32]>>) {
    let blocks = (rayon::current_num_threads() * 4).max(1);
    let block = n.div_ceil(blocks).next_multiple_of(NR);
    let ranges: Vec<_> = (0..n).step_by(block).map(|j| j..(j + block).min(n)).collect();
    (block, super::split_columns(out, n, &ranges))
}

/// One task's block, as a callable that `V4::vectorize` inlines into its AVX-512 function (a
/// closure would not be inlined, and the intrinsics would compile as calls).
struct Block<'a, 'r, W> {
    simd: V4,
    p: &'a Product<'a, W>,
    j0: usize,
    rows: &'r mut [&'a mut [f32]],
}

impl<W: Weight> pulp::NullaryFnOnce for Block<'_, '_, W> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        block_product(self.simd, self.p, self.j0, self.rows);
    }
}

/// Outputs `[j0, j0 + rows[i].len())` of every row i.
#[inline(always)]
fn block_product<W: Weight>(simd: V4, p: &Product<'_, W>, j0: usize, rows: &mut [&mut [f32]]) {
    let (width, k) = (rows[0].len(), p.k);
    // Up to STREAM_ROWS rows the product is bound by memory: one weight row at a time keeps a
    // single sequential stream per thread, which this CPU's prefetchers sustain far better than
    // four interleaved rows (lm head, f16, one row: 33 against 20 GB/s). Above it the product
    // is bound by the FMAs, and four weight rows per tile halve the loads per FMA (copying
    // them first into a sequential buffer, or prefetching them, measured no faster).
    let step = if p.m <= STREAM_ROWS { 1 } else { NR };
    let row_bytes = k * std::mem::size_of::<W>();
    for jt in (0..width).step_by(step) {
        let nr = step.min(width - jt);
        let w = &p.w[(j0 + jt) * k..(j0 + jt + nr) * k];
        if step == 1 {
            // A row's worth of the stream, `prefetch::AHEAD` bytes on (f16 decode 30 → 33 tok/s).
            prefetch(w.as_ptr().cast::<u8>().wrapping_add(AHEAD), row_bytes);
        }
        let bias = p.bias.map(|b| &b[j0 + jt..]);
        for it in (0..p.m).step_by(MR) {
            let x = &p.x[it * k..(it + MR).min(p.m) * k];
            macro_rules! tile {
                ($mr:literal, $nr:literal) => {
                    store::<$mr, $nr>(rows, it, jt, bias, tile::<W, $mr, $nr>(simd, x, w, k))
                };
            }
            each_tile!((x.len() / k, nr), tile)
        }
    }
}

/// Dot products of the R rows of `x` with the C rows of `w`, each row `k` long.
///
/// No closures here: a closure is not compiled with the caller's target features, so the
/// intrinsics in it would become calls and the accumulators would live on the stack.
#[inline(always)]
fn tile<W: Weight, const R: usize, const C: usize>(simd: V4, x: &[f32], w: &[W], k: usize) -> [[f32; C]; R] {
    if R == 1 && C == 1 {
        let mut out = [[0.0; C]; R];
        out[0][0] = dot(simd, x, w, k);
        return out;
    }
    let chunks = k / LANES;
    let mut xv: [&[[f32; LANES]]; R] = [&[]; R];
    for (i, xv) in xv.iter_mut().enumerate() {
        *xv = &pulp::as_arrays::<LANES, f32>(&x[i * k..(i + 1) * k]).0[..chunks];
    }
    let mut wv: [&[[W; LANES]]; C] = [&[]; C];
    for (j, wv) in wv.iter_mut().enumerate() {
        *wv = &pulp::as_arrays::<LANES, W>(&w[j * k..(j + 1) * k]).0[..chunks];
    }
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; C]; R];
    for c in 0..chunks {
        let mut xs = [zero; R];
        for i in 0..R {
            xs[i] = pulp::cast(xv[i][c]);
        }
        for j in 0..C {
            let wc = W::load(simd, &wv[j][c]);
            for i in 0..R {
                acc[i][j] = simd.mul_add_f32s(xs[i], wc, acc[i][j]);
            }
        }
    }
    let mut out = [[0.0; C]; R];
    for i in 0..R {
        let x = &x[i * k + chunks * LANES..(i + 1) * k];
        for j in 0..C {
            let w = &w[j * k + chunks * LANES..(j + 1) * k];
            let mut sum = simd.reduce_sum_f32s(acc[i][j]);
            for t in 0..x.len() {
                sum += x[t] * w[t].to_f32();
            }
            out[i][j] = sum;
        }
    }
    out
}

/// One dot product (a decode step's tile; attention's odd scores): four chains of FMAs over alternating vectors, so the
/// FMA latency does not bound a row's stream (one chain waits four cycles per sixteen values).
#[inline(always)]
pub(super) fn dot<W: Weight>(simd: V4, x: &[f32], w: &[W], k: usize) -> f32 {
    const CHAINS: usize = 4;
    let (xv, _) = pulp::as_arrays::<LANES, f32>(&x[..k]);
    let (wv, _) = pulp::as_arrays::<LANES, W>(&w[..k]);
    let zero = simd.splat_f32s(0.0);
    let mut acc = [zero; CHAINS];
    let (xq, xr) = pulp::as_arrays::<CHAINS, [f32; LANES]>(xv);
    let (wq, wr) = pulp::as_arrays::<CHAINS, [W; LANES]>(wv);
    for (x, w) in xq.iter().zip(wq) {
        for c in 0..CHAINS {
            acc[c] = simd.mul_add_f32s(pulp::cast(x[c]), W::load(simd, &w[c]), acc[c]);
        }
    }
    for (x, w) in xr.iter().zip(wr) {
        acc[0] = simd.mul_add_f32s(pulp::cast(*x), W::load(simd, w), acc[0]);
    }
    let sum = simd.add_f32s(simd.add_f32s(acc[0], acc[1]), simd.add_f32s(acc[2], acc[3]));
    let tail = xv.len() * LANES;
    simd.reduce_sum_f32s(sum) + x[tail..k].iter().zip(&w[tail..k]).map(|(x, w)| x * w.to_f32()).sum::<f32>()
}

#[inline(always)]
pub(super) fn store<const R: usize, const C: usize>(
    rows: &mut [&mut [f32]],
    i0: usize,
    j0: usize,
    bias: Option<&[f32]>,
    values: [[f32; C]; R],
) {
    for (i, row) in values.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            rows[i0 + i][j0 + j] = v + bias.map_or(0.0, |b| b[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemm::{self, Isa};
    use crate::kernels::test_values as values;

    fn reference<W: Weight>(p: &Product<'_, W>) -> Vec<f64> {
        let mut out = vec![0.0; p.m * p.n];
        for i in 0..p.m {
            for j in 0..p.n {
                let dot: f64 =
                    (0..p.k).map(|t| p.x[i * p.k + t] as f64 * p.w[j * p.k + t].to_f32() as f64).sum::<f64>();
                out[i * p.n + j] = dot + p.bias.map_or(0.0, |b| b[j] as f64);
            }
        }
        out
    }

    fn max_error(a: &[f32], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max)
    }

    /// Every tile shape (rows and outputs not multiples of 4), one-row products over whole groups of
    /// four vectors and a remainder, a k that is not a multiple of 16 (or of 8), many-row products,
    /// with and without bias: `check` gets each case's product with f32, f16 and bf16 weights.
    fn each_case(check: impl Fn(&Product<'_, f32>, &Product<'_, f16>, &Product<'_, bf16>, &str)) {
        for (m, n, k) in
            [(1, 1, 16), (1, 37, 50), (1, 20, 200), (1, 3, 1000), (3, 64, 896), (5, 102, 33), (16, 130, 128), (7, 9, 7)]
                .into_iter()
                // Many-row products (`gemm.rs`): row tiles of 6 or 12 and a rest, panels of 16
                // or 32 and a rest, inputs over more than one chunk (128 or 256) and not a
                // multiple of 8.
                .chain([(13, 40, 300), (70, 33, 520), (67, 16, 256), (25, 70, 130)])
        {
            let x = values(m * k, 1);
            let w = values(n * k, 2);
            let w16: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            let wb16: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            let bias = values(n, 3);
            for bias in [None, Some(bias.as_slice())] {
                check(
                    &Product { x: &x, w: &w, bias, m, n, k },
                    &Product { x: &x, w: &w16, bias, m, n, k },
                    &Product { x: &x, w: &wb16, bias, m, n, k },
                    &format!("m={m} n={n} k={k} bias={}", bias.is_some()),
                );
            }
        }
    }

    fn assert_close<W: Weight>(got: &[f32], p: &Product<'_, W>, what: &str) {
        assert_eq!(got.len(), p.m * p.n);
        let err = max_error(got, &reference(p));
        assert!(err < 1e-4 * p.k as f64, "{what}: max error {err}");
    }

    #[test]
    #[cfg_attr(not(cpu_avx512), ignore = "this CPU has no AVX-512 (the kernel does not run here)")]
    fn products_equal_the_reference_for_every_tile_shape() {
        assert!(V4::try_new().is_some(), "the build saw the instructions this kernel needs; the run does not");
        each_case(|p32, p16, pb16, what| {
            assert_close(&run(p32).unwrap(), p32, &format!("f32 {what}"));
            assert_close(&run(p16).unwrap(), p16, &format!("f16 {what}"));
            assert_close(&run(pb16).unwrap(), pb16, &format!("bf16 {what}"));
        });
    }

    /// The AVX2 kernel (`xwt_avx2.rs`) on the same cases, one block of every output, as `run`
    /// gives it on a CPU without AVX-512.
    #[test]
    #[cfg_attr(not(cpu_avx2), ignore = "this CPU lacks AVX2, FMA or F16C (the kernel does not run here)")]
    fn avx2_products_equal_the_reference() {
        assert!(xwt_avx2::available(), "the build saw the instructions this kernel needs; the run does not");
        fn avx2<W: Weight>(p: &Product<'_, W>) -> Vec<f32> {
            let mut out = vec![0.0f32; p.m * p.n];
            let mut rows: Vec<&mut [f32]> = out.chunks_mut(p.n).collect();
            xwt_avx2::block_product(p, 0, &mut rows);
            out
        }
        each_case(|p32, p16, pb16, what| {
            assert_close(&avx2(p32), p32, &format!("f32 {what}"));
            assert_close(&avx2(p16), p16, &format!("f16 {what}"));
            assert_close(&avx2(pb16), pb16, &format!("bf16 {what}"));
        });
    }

    /// The many-row kernel (`gemm.rs`) on AVX2 on the same cases.
    #[test]
    #[cfg_attr(not(cpu_avx2), ignore = "this CPU lacks AVX2, FMA or F16C (the kernel does not run here)")]
    fn avx2_gemm_products_equal_the_reference() {
        gemm_products_equal_the_reference(Isa::Avx2);
    }

    /// The many-row kernel (`gemm.rs`) on AVX-512 on the same cases.
    #[test]
    #[cfg_attr(not(cpu_avx512), ignore = "this CPU has no AVX-512 (the kernel does not run here)")]
    fn avx512_gemm_products_equal_the_reference() {
        gemm_products_equal_the_reference(Isa::Avx512);
    }

    fn gemm_products_equal_the_reference(isa: Isa) {
        assert!(isa.available(), "the build saw the instructions this kernel needs; the run does not");
        each_case(|p32, p16, pb16, what| {
            assert_close(&gemm::run(p32, isa), p32, &format!("f32 {what}"));
            assert_close(&gemm::run(p16, isa), p16, &format!("f16 {what}"));
            assert_close(&gemm::run(pb16, isa), pb16, &format!("bf16 {what}"));
        });
    }
}
