//! The vector helpers the AVX2 kernels share (`attention/avx2.rs`, `xwt_avx2.rs`): loads and
//! stores of eight f32 and the horizontal sum and maximum of a vector. Each is compiled for AVX2
//! and FMA and inlined into its callers, which are compiled for at least those.
//!
//! `unsafe` (C8: the reason). The vector loads and stores take raw pointers; each reads or
//! writes exactly the 8 f32 of the array it is given. Nothing else here is unsafe.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// f32 lanes of a vector.
pub(super) const W: usize = 8;

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn load(v: &[f32; W]) -> __m256 {
    // SAFETY: `v` is 8 f32, read unaligned.
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn store(v: &mut [f32; W], x: __m256) {
    // SAFETY: `v` is 8 f32, written unaligned.
    unsafe { _mm256_storeu_ps(v.as_mut_ptr(), x) }
}

/// The sum of the lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn reduce_sum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The largest lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn reduce_max(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}
