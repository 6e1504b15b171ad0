//! `y = x·Wᵀ (+ b)` with bf16 weights for many rows of `x` (prefill), on AVX512-BF16.
//!
//! `vdpbf16ps` multiplies 32 bf16 pairs and adds them into 16 f32 lanes: twice the products per
//! instruction of an f32 FMA, which is how a 2-core CPU gets past its f32 FMA peak (llama.cpp's
//! bf16 prefill does the same). `x` is rounded to bf16 once per product (to nearest, ties to
//! even); the weights are the checkpoint's bf16 values; sums are f32.
//!
//! Layout as in `xwt`: both operands are contiguous in `k`, and a 4×4 tile of (x row, weight
//! row) dot products keeps 16 accumulators. Weight rows are split into blocks, one rayon task
//! each; within a block, `x` is walked in chunks of rows that stay in L2 while the block's
//! weight rows (in L3 after the first chunk) pass over them.
//!
//! `unsafe` (C8: the reason). Stable Rust has no safe way to reach these instructions: pulp's
//! V4 token does not include AVX512-BF16, and a `#[target_feature]` function can only be called
//! safely from one with the same features. So this module calls its `#[target_feature]` task
//! function after checking at run time that the CPU has the features (`run`), and loads vectors
//! from slices whose length it has checked. Nothing else here is unsafe.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512, __m512bh, __m512i, _mm512_cvtne2ps_pbh, _mm512_dpbf16_ps, _mm512_fmadd_ps, _mm512_loadu_si512,
    _mm512_reduce_add_ps, _mm512_set1_ps, _mm512_setzero_ps,
};
use std::sync::OnceLock;
use std::time::Instant;

use burn::tensor::bf16;
use rayon::prelude::*;

use super::xwt::{column_blocks, store};

/// bf16 values per vector.
const LANES: usize = 32;
/// Tile: x rows × weight rows.
const MR: usize = 4;
const NR: usize = 4;
/// Bytes of `x` (as bf16) walked per chunk: well inside the 1 MiB L2, next to the weight rows.
const X_CHUNK_BYTES: usize = 256 << 10;

/// Whether this CPU runs the kernel.
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

/// Whether `vdpbf16ps` multiplies pairs of bf16 at more than 1.25 times the rate f32 FMAs
/// multiply f32 on this CPU: timed once per process, a few hundred microseconds. Where it does
/// (Zen 4 and 5 run both at one or two instructions a cycle, and a `vdpbf16ps` does twice the
/// products), this kernel beats the f32 GEMM (`gemm.rs`) on widened weights; where it does not
/// (an Emerald Rapids Xeon retires half a `vdpbf16ps` a cycle against two FMAs: the GEMM ran
/// prefill 512 of the bf16 demo model at 285 tok/s, this kernel at 177), the GEMM is faster.
pub fn outpaces_fma() -> bool {
    static OUTPACES: OnceLock<bool> = OnceLock::new();
    *OUTPACES.get_or_init(|| {
        if !available() {
            return false;
        }
        // The best of five alternating tries of each, so that a preemption does not decide.
        let (mut dp, mut fma) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..5 {
            // SAFETY: `available()` found avx512f and avx512bf16 on this CPU.
            dp = dp.min(unsafe { timed(dp_stream) });
            fma = fma.min(unsafe { timed(fma_stream) });
        }
        // A `vdpbf16ps` does 32 products, an FMA 16.
        fma / 16.0 > 1.25 * dp / 32.0
    })
}

/// Instructions of each stream.
const STREAM: usize = 16 * 4096;

/// Seconds `stream` takes.
///
/// # Safety
/// `stream`'s target features are on this CPU.
unsafe fn timed(stream: unsafe fn(f32) -> f32) -> f64 {
    let start = Instant::now();
    // SAFETY: the caller's.
    std::hint::black_box(unsafe { stream(std::hint::black_box(1.0)) });
    start.elapsed().as_secs_f64()
}

/// `STREAM` `vdpbf16ps` over 16 independent sums (more than its latency times its throughput).
#[target_feature(enable = "avx512f,avx512bf16")]
fn dp_stream(v: f32) -> f32 {
    let x: __m512bh = _mm512_cvtne2ps_pbh(_mm512_set1_ps(v), _mm512_set1_ps(v));
    let mut acc = [_mm512_setzero_ps(); 16];
    for _ in 0..STREAM / 16 {
        for a in &mut acc {
            *a = _mm512_dpbf16_ps(*a, x, x);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

/// `STREAM` f32 FMAs over 16 independent sums.
#[target_feature(enable = "avx512f,avx512bf16")]
fn fma_stream(v: f32) -> f32 {
    let x = _mm512_set1_ps(v);
    let mut acc = [_mm512_setzero_ps(); 16];
    for _ in 0..STREAM / 16 {
        for a in &mut acc {
            *a = _mm512_fmadd_ps(*a, x, x);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

/// `x·Wᵀ + b`; `None` when the CPU lacks AVX512-BF16 (the caller falls back).
///
/// # Shapes
/// x: [m, k], w: [n, k], bias: [n] → [m, n] row-major
pub fn run(x: &[f32], w: &[bf16], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Option<Vec<f32>> {
    if !available() {
        return None;
    }
    assert!(x.len() == m * k && w.len() == n * k, "x·Wᵀ (bf16): operand sizes do not match their shapes");
    assert!(bias.is_none_or(|b| b.len() == n), "x·Wᵀ (bf16): bias size does not match the outputs");
    let mut out = vec![0.0f32; m * n];
    if m == 0 || n == 0 {
        return Some(out);
    }
    let mut xb = vec![bf16::ZERO; m * k];
    xb.par_chunks_mut(k.max(1) * 64).zip(x.par_chunks(k.max(1) * 64)).for_each(|(xb, x)| {
        for (b, &v) in xb.iter_mut().zip(x) {
            *b = bf16::from_f32(v);
        }
    });
    let (block, pieces) = column_blocks(&mut out, n);
    let chunk_rows = (X_CHUNK_BYTES / (2 * k.max(1))).next_multiple_of(MR).max(MR);
    let task = Task { x: &xb, w, bias, k, chunk_rows };
    pieces.into_par_iter().enumerate().for_each(|(b, mut rows)| {
        // SAFETY: `available()` found avx512f and avx512bf16 on this CPU.
        unsafe { task.block(b * block, &mut rows) }
    });
    Some(out)
}

struct Task<'a> {
    /// [m, k] rounded to bf16.
    x: &'a [bf16],
    w: &'a [bf16],
    bias: Option<&'a [f32]>,
    k: usize,
    chunk_rows: usize,
}

impl Task<'_> {
    /// Outputs `[j0, j0 + rows[i].len())` of every row i.
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn block(&self, j0: usize, rows: &mut [&mut [f32]]) {
        let (m, width, k) = (rows.len(), rows[0].len(), self.k);
        for i0 in (0..m).step_by(self.chunk_rows) {
            let i1 = (i0 + self.chunk_rows).min(m);
            for jt in (0..width).step_by(NR) {
                let nr = NR.min(width - jt);
                let w = &self.w[(j0 + jt) * k..(j0 + jt + nr) * k];
                let bias = self.bias.map(|b| &b[j0 + jt..]);
                for it in (i0..i1).step_by(MR) {
                    let x = &self.x[it * k..(it + MR).min(i1) * k];
                    macro_rules! tile {
                        ($mr:literal, $nr:literal) => {
                            store::<$mr, $nr>(rows, it, jt, bias, tile::<$mr, $nr>(x, w, k))
                        };
                    }
                    each_tile!((x.len() / k, nr), tile)
                }
            }
        }
    }
}

/// 32 bf16 values from the front of `v`.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn load(v: &[bf16]) -> __m512bh {
    assert!(v.len() >= LANES);
    // SAFETY: `v` holds at least 32 bf16 (64 bytes), read unaligned; 32 bf16 bit patterns are a
    // valid `__m512bh`, the same 64 bytes as the `__m512i` loaded.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(v.as_ptr().cast())) }
}

/// Dot products of the R rows of `x` with the C rows of `w`, each row `k` long. No closures, so
/// everything here is compiled with the target features.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn tile<const R: usize, const C: usize>(x: &[bf16], w: &[bf16], k: usize) -> [[f32; C]; R] {
    let chunks = k / LANES;
    let mut acc: [[__m512; C]; R] = [[_mm512_setzero_ps(); C]; R];
    for c in 0..chunks {
        let at = c * LANES;
        let mut xs = [load(&x[at..]); R];
        for (i, xs) in xs.iter_mut().enumerate().skip(1) {
            *xs = load(&x[i * k + at..]);
        }
        for j in 0..C {
            let wv = load(&w[j * k + at..]);
            for i in 0..R {
                acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xs[i], wv);
            }
        }
    }
    let mut out = [[0.0; C]; R];
    for i in 0..R {
        let x = &x[i * k + chunks * LANES..(i + 1) * k];
        for j in 0..C {
            let w = &w[j * k + chunks * LANES..(j + 1) * k];
            let mut sum = _mm512_reduce_add_ps(acc[i][j]);
            for t in 0..x.len() {
                sum += x[t].to_f32() * w[t].to_f32();
            }
            out[i][j] = sum;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_values as values;

    /// Every tile shape, chunks of x rows, a k that is not a multiple of 32, with and without
    /// bias: equal to an f64 reference over the bf16-rounded operands.
    #[test]
    #[cfg_attr(not(cpu_avx512_bf16), ignore = "this CPU has no AVX512-BF16 (the kernel does not run here)")]
    fn products_equal_the_reference_over_bf16_operands() {
        assert!(available(), "the build saw the instructions this kernel needs; the run does not");
        for (m, n, k) in [(1, 1, 32), (5, 37, 50), (70, 9, 896), (130, 67, 33), (7, 130, 4864)] {
            let x = values(m * k, 1);
            let w: Vec<bf16> = values(n * k, 2).iter().map(|&v| bf16::from_f32(v)).collect();
            let bias = values(n, 3);
            for bias in [None, Some(bias.as_slice())] {
                let got = run(&x, &w, bias, m, n, k).unwrap();
                assert_eq!(got.len(), m * n);
                for i in 0..m {
                    for j in 0..n {
                        let dot: f64 =
                            (0..k).map(|t| bf16::from_f32(x[i * k + t]).to_f64() * w[j * k + t].to_f64()).sum::<f64>();
                        let want = dot + bias.map_or(0.0, |b| b[j] as f64);
                        let err = (got[i * n + j] as f64 - want).abs();
                        assert!(err < 1e-5 * k as f64, "m={m} n={n} k={k} [{i}, {j}]: {} vs {want}", got[i * n + j]);
                    }
                }
            }
        }
    }
}
