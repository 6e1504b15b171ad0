//! `y = x·Wᵀ (+ b)` for few rows of `x` (decode steps) with f32, f16 or bf16 weights, on AVX2
//! and FMA: `xwt.rs`'s product for CPUs without AVX-512. Before it, such CPUs ran these products
//! through the backend's matmul, which widened the whole 16-bit weight to f32 on every call: a
//! bf16 demo model decoded at 1 token/s.
//!
//! The weight is streamed once from its storage in the checkpoint's `[out, in]` layout, eight
//! values a load widened in registers (f16 with F16C, bf16 by a shift), each output the dot
//! product of an `x` row with a weight row over four chains of FMAs. The weight rows are split
//! into blocks on the rayon pool, each block's rows read in order; the `x` rows of a product
//! (at most `XWT_MAX_ROWS`) take turns over each weight row while it is in L1.
//!
//! `unsafe` (C8: the reason). The loads take raw pointers, and the `#[target_feature]` function
//! may only run on a CPU with AVX2, FMA and F16C: `block_product` checks them at run time before
//! calling it, and `load` reads 8 elements from an array of 8 of the weight's type, whose layout
//! `Weight::KIND` names. Nothing else here is unsafe.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::prefetch::{AHEAD, prefetch};
use super::xwt::{Kind, Product, Weight};

/// f32 lanes of a vector.
const W: usize = 8;
/// Independent FMA chains of a dot product.
const CHAINS: usize = 4;

/// Whether this CPU runs the kernel.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Outputs `[j0, j0 + rows[i].len())` of every row i (`xwt::run` splits the product into these
/// blocks and checks the operands). Panics where the CPU lacks the instructions.
pub(super) fn block_product<T: Weight>(p: &Product<'_, T>, j0: usize, rows: &mut [&mut [f32]]) {
    assert!(available(), "the AVX2 x·Wᵀ needs AVX2, FMA and F16C");
    // SAFETY: `available()` found AVX2, FMA and F16C on this CPU.
    unsafe { block_avx2(p, j0, rows) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn block_avx2<T: Weight>(p: &Product<'_, T>, j0: usize, rows: &mut [&mut [f32]]) {
    let k = p.k;
    let row_bytes = k * size_of::<T>();
    for j in 0..rows[0].len() {
        let w = &p.w[(j0 + j) * k..(j0 + j + 1) * k];
        // A row's worth of the stream, `prefetch::AHEAD` bytes on.
        prefetch(w.as_ptr().cast::<u8>().wrapping_add(AHEAD), row_bytes);
        let bias = p.bias.map_or(0.0, |b| b[j0 + j]);
        for (i, row) in rows.iter_mut().enumerate() {
            row[j] = dot(&p.x[i * k..(i + 1) * k], w) + bias;
        }
    }
}

/// `Σ x·w` over four chains of FMAs (one chain waits on the FMA's latency every eight values).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot<T: Weight>(x: &[f32], w: &[T]) -> f32 {
    let (xv, xt) = x.as_chunks::<W>();
    let (wv, wt) = w.as_chunks::<W>();
    let (xq, xr) = xv.as_chunks::<CHAINS>();
    let (wq, wr) = wv.as_chunks::<CHAINS>();
    let mut acc = [_mm256_setzero_ps(); CHAINS];
    for (x, w) in xq.iter().zip(wq) {
        for c in 0..CHAINS {
            // SAFETY: `x[c]` is 8 f32, read unaligned.
            let xc = unsafe { _mm256_loadu_ps(x[c].as_ptr()) };
            acc[c] = _mm256_fmadd_ps(xc, load(&w[c]), acc[c]);
        }
    }
    for (x, w) in xr.iter().zip(wr) {
        // SAFETY: as above.
        let xc = unsafe { _mm256_loadu_ps(x.as_ptr()) };
        acc[0] = _mm256_fmadd_ps(xc, load(w), acc[0]);
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let mut sum = _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
    for (x, w) in xt.iter().zip(wt) {
        sum += x * w.to_f32();
    }
    sum
}

/// Eight weight elements as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load<T: Weight>(w: &[T; W]) -> __m256 {
    // SAFETY: `w` is 8 elements laid out as `T::KIND` says: 32 bytes of f32, or 16 bytes of
    // f16 or bf16, read unaligned.
    unsafe {
        match T::KIND {
            Kind::F32 => _mm256_loadu_ps(w.as_ptr().cast()),
            Kind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().cast())),
            // A bf16 is the top half of an f32.
            Kind::Bf16 => {
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(w.as_ptr().cast()))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{bf16, f16};

    use super::*;
    use crate::kernels::test_values as values;

    fn reference<T: Weight>(p: &Product<'_, T>) -> Vec<f64> {
        let mut out = Vec::new();
        for i in 0..p.m {
            for j in 0..p.n {
                let dot: f64 = (0..p.k).map(|t| p.x[i * p.k + t] as f64 * p.w[j * p.k + t].to_f32() as f64).sum();
                out.push(dot + p.bias.map_or(0.0, |b| b[j] as f64));
            }
        }
        out
    }

    fn check<T: Weight>(p: &Product<'_, T>, what: &str) {
        // One block of every output (as `xwt::run` would on a CPU without AVX-512).
        let mut got = vec![0.0f32; p.m * p.n];
        let mut rows: Vec<&mut [f32]> = got.chunks_mut(p.n).collect();
        block_product(p, 0, &mut rows);
        let want = reference(p);
        assert_eq!(got.len(), want.len());
        let err = got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
        assert!(err < 1e-4 * p.k as f64, "{what}: max error {err}");
    }

    /// Rows past the four chains' 32 values and past whole vectors (tails of 1-7), several x rows,
    /// outputs not a multiple of the blocks, with and without bias, in each weight type.
    #[test]
    #[cfg_attr(not(cpu_avx2), ignore = "this CPU lacks AVX2, FMA or F16C (the kernel does not run here)")]
    fn products_equal_the_reference() {
        assert!(available(), "the build saw the instructions this kernel needs; the run does not");
        for (m, n, k) in [(1, 1, 8), (1, 37, 50), (1, 20, 200), (2, 3, 1000), (3, 64, 896), (5, 102, 33), (7, 9, 7)] {
            let x = values(m * k, 1);
            let w = values(n * k, 2);
            let w16: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
            let wb16: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            let bias = values(n, 3);
            for bias in [None, Some(bias.as_slice())] {
                let what = format!("m={m} n={n} k={k} bias={}", bias.is_some());
                check(&Product { x: &x, w: &w, bias, m, n, k }, &format!("f32 {what}"));
                check(&Product { x: &x, w: &w16, bias, m, n, k }, &format!("f16 {what}"));
                check(&Product { x: &x, w: &wb16, bias, m, n, k }, &format!("bf16 {what}"));
            }
        }
    }
}
