//! `y = x·Wᵀ (+ b)` for few rows of `x` (decode steps of up to `XWT_AVX2_MAX_ROWS` sequences)
//! with f32, f16 or bf16 weights, on AVX2 and FMA: `xwt.rs`'s product for CPUs without
//! AVX-512. Before it, such CPUs ran these products through the backend's matmul, which widened
//! the whole 16-bit weight to f32 on every call: a bf16 demo model decoded at 1 token/s.
//!
//! The weight is streamed once from its storage in the checkpoint's `[out, in]` layout, eight
//! values a load widened in registers (f16 with F16C, bf16 by a shift), each output the dot
//! product of an `x` row with a weight row over four chains of FMAs. The weight rows are split
//! into blocks on the rayon pool, each block's rows read in order; the `x` rows of a product
//! (at most `XWT_MAX_ROWS`) take turns over each weight row while it is in L1.
//!
//! `unsafe` (C8: the reason). The loads take raw pointers, and the `#[target_feature]` function
//! may only run on a CPU with AVX2, FMA and F16C: `block_product` checks them at run time before
//! calling it, and `widen` reads 8 elements from an array of 8 of the weight's type, whose layout
//! `Weight::KIND` names. Nothing else here is unsafe.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::avx2::{W, load, reduce_sum};
use super::xwt::{Kind, Product, Weight};
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
    // No software prefetch: each thread reads one sequential stream, which the hardware
    // prefetchers keep up with; asking for a row `prefetch::AHEAD` bytes on, as the AVX-512
    // kernel does, made decode of the f16 and bf16 demo model 5-10% slower on a Zen 3.
    for j in 0..rows[0].len() {
        let w = &p.w[(j0 + j) * k..(j0 + j + 1) * k];
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
            acc[c] = _mm256_fmadd_ps(load(&x[c]), widen(&w[c]), acc[c]);
        }
    }
    for (x, w) in xr.iter().zip(wr) {
        acc[0] = _mm256_fmadd_ps(load(x), widen(w), acc[0]);
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut sum = reduce_sum(v);
    for (x, w) in xt.iter().zip(wt) {
        sum += x * w.to_f32();
    }
    sum
}

/// Eight weight elements as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn widen<T: Weight>(w: &[T; W]) -> __m256 {
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
