//! Plain Rust for the CPUs without AVX-512: code written over arrays of 8 lanes and run through
//! [`Plain::vectorize`], which compiles it for AVX2 and FMA (`pulp`'s `V3`) where the CPU has
//! them, so LLVM turns the lanes into vectors, and for baseline x86-64 elsewhere. The attention,
//! RMSNorm, SwiGLU and the activations' int8 blocks take this path when AVX-512 is absent.

use pulp::NullaryFnOnce;
use pulp::x86::V3;

/// Lanes of the plain code's partial sums (one AVX2 vector).
pub(crate) const LANES: usize = 8;

/// Whether this CPU has AVX2 and FMA for the plain code (checked once, when made).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plain(Option<V3>);

impl Plain {
    /// For this CPU.
    pub(crate) fn new() -> Self {
        Self(V3::try_new())
    }

    /// Without vector extensions beyond the baseline (for tests of the fallback).
    #[cfg(test)]
    pub(crate) fn baseline() -> Self {
        Self(None)
    }

    /// The AVX2 and FMA token, where the CPU has them (and this is not the baseline).
    #[inline(always)]
    pub(crate) fn v3(self) -> Option<V3> {
        self.0
    }

    /// Runs `f` compiled for AVX2 and FMA where the CPU has them: its body must be inlined
    /// (`#[inline(always)]` on the closure and everything it calls).
    #[inline(always)]
    pub(crate) fn vectorize<F: NullaryFnOnce>(self, f: F) -> F::Output {
        match self.0 {
            Some(simd) => simd.vectorize(f),
            None => f.call(),
        }
    }
}

/// `Σ a·b` over 8 partial sums, which LLVM vectorizes.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (ac, at) = a.as_chunks::<LANES>();
    let (bc, bt) = b.as_chunks::<LANES>();
    let mut acc = [0.0f32; LANES];
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + at.iter().zip(bt).map(|(x, y)| x * y).sum::<f32>()
}
