//! The feed-forward's gate over the stacked gate/up projection's output: SwiGLU's
//! `silu(gate) · up`, or GeGLU's `gelu_tanh(gate) · up` (Gemma's), both `g · σ(t) · up`: t = g
//! for silu, and since ½(1 + tanh z) = σ(2z), t = 2√(2/π) · (g + 0.044715 g³) for GELU's tanh
//! approximation; gpt-oss's clamped SwiGLU is the same with g = min(gate, limit), t = alpha · g
//! and `clamp(up, ±limit) + 1` for up.
//!
//! The Burn ops take three passes and two intermediate tensors (sigmoid, product), with the
//! exponential from the scalar libm; here one pass computes it with the vector exponential of
//! `exp.rs`: on AVX-512, or in plain Rust compiled for AVX2 where the CPU has it.

use pulp::x86::V4;
use pulp::{Simd, f32x16};
use rayon::prelude::*;

use super::exp::{exp, exp_plain};
use super::plain::Plain;
use crate::config::Activation;

const LANES: usize = 16;
/// Rows per parallel task: about 80 K outputs at the demo model's width, below which the
/// pool's overhead outweighs the split.
const MIN_ELEMENTS_PER_TASK: usize = 1 << 16;

/// GELU's tanh approximation as a sigmoid's argument: 2√(2/π) (in f32), and the cube's
/// coefficient.
pub(crate) const GELU_SCALE: f32 = 1.595_769_2;
pub(crate) const GELU_CUBE: f32 = 0.044_715;

/// `act(gate) · up` for each row of `gate_up` (`[gate | up]`, each `width` long).
///
/// # Shapes
/// gate_up: [n, 2 · width] → [n, width] row-major
pub fn run(gate_up: &[f32], width: usize, act: Activation) -> Vec<f32> {
    let (v4, plain) = (V4::try_new(), Plain::new());
    assert!(width > 0 && gate_up.len().is_multiple_of(2 * width), "swiglu: input is not [n, 2 · width]");
    let n = gate_up.len() / (2 * width);
    let mut out = vec![0.0f32; n * width];
    let rows_per_task = (MIN_ELEMENTS_PER_TASK / width).max(1);
    out.par_chunks_mut(width * rows_per_task).zip(gate_up.par_chunks(2 * width * rows_per_task)).for_each(
        |(out, input)| {
            for (out, row) in out.chunks_mut(width).zip(input.chunks(2 * width)) {
                let (gate, up) = row.split_at(width);
                match v4 {
                    Some(simd) => simd.vectorize(Row { simd, gate, up, out, act }),
                    None => plain.vectorize(
                        #[inline(always)]
                        || row_plain(gate, up, out, act),
                    ),
                }
            }
        },
    );
    out
}

/// A gate without an up: `g · σ(t)`, in place ([`gate_in_place`]).
#[derive(Debug, Clone, Copy)]
pub enum Gate {
    /// t = a · g (QuickGELU: a = 1.702; silu: 1).
    Scaled(f32),
    /// GELU's tanh approximation.
    Tanh,
}

/// Each value g becomes `g · σ(t)` ([`Gate`]), in tasks on the rayon pool.
pub fn gate_in_place(values: &mut [f32], gate: Gate) {
    let (v4, plain) = (V4::try_new(), Plain::new());
    values.par_chunks_mut(MIN_ELEMENTS_PER_TASK).for_each(|chunk| match v4 {
        Some(simd) => simd.vectorize(
            #[inline(always)]
            || gate_chunk(simd, chunk, gate),
        ),
        None => plain.vectorize(
            #[inline(always)]
            || {
                for g in chunk.iter_mut() {
                    *g /= 1.0 + exp_plain(-gate_arg(*g, gate));
                }
            },
        ),
    });
}

#[inline(always)]
fn gate_arg(g: f32, gate: Gate) -> f32 {
    match gate {
        Gate::Scaled(a) => a * g,
        Gate::Tanh => GELU_SCALE * (g + GELU_CUBE * g * g * g),
    }
}

/// [`gate_in_place`] on AVX-512.
#[inline(always)]
fn gate_chunk(simd: V4, values: &mut [f32], gate: Gate) {
    let (head, tail) = pulp::as_arrays_mut::<LANES, f32>(values);
    let (one, zero) = (simd.splat_f32s(1.0), simd.splat_f32s(0.0));
    let (scale, cube) = (simd.splat_f32s(GELU_SCALE), simd.splat_f32s(GELU_CUBE));
    for v in head {
        let g: f32x16 = pulp::cast(*v);
        let t = match gate {
            Gate::Scaled(a) => simd.mul_f32s(simd.splat_f32s(a), g),
            Gate::Tanh => simd.mul_f32s(scale, simd.mul_add_f32s(simd.mul_f32s(cube, simd.mul_f32s(g, g)), g, g)),
        };
        let e = exp(simd, simd.sub_f32s(zero, t));
        *v = pulp::cast(simd.div_f32s(g, simd.add_f32s(one, e)));
    }
    for g in tail {
        *g /= 1.0 + (-gate_arg(*g, gate)).exp();
    }
}

/// The sigmoid's argument for gate `g` (clamped already: `clamped`).
#[inline(always)]
fn arg(g: f32, act: Activation) -> f32 {
    match act {
        Activation::Silu => g,
        Activation::GeluTanh => GELU_SCALE * (g + GELU_CUBE * g * g * g),
        Activation::ClampedSwiglu { alpha, .. } => alpha * g,
    }
}

/// The gate and up as the product takes them: gpt-oss's clamped, its up plus 1.
#[inline(always)]
fn clamped(g: f32, u: f32, act: Activation) -> (f32, f32) {
    match act {
        Activation::ClampedSwiglu { limit, .. } => (g.min(limit), u.clamp(-limit, limit) + 1.0),
        _ => (g, u),
    }
}

/// One row in plain Rust with [`exp_plain`], which LLVM vectorizes.
#[inline(always)]
fn row_plain(gate: &[f32], up: &[f32], out: &mut [f32], act: Activation) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let (g, u) = clamped(g, u, act);
        *o = g / (1.0 + exp_plain(-arg(g, act))) * u;
    }
}

/// One row, as a callable that `V4::vectorize` inlines into its AVX-512 function.
struct Row<'a> {
    simd: V4,
    gate: &'a [f32],
    up: &'a [f32],
    out: &'a mut [f32],
    act: Activation,
}

impl pulp::NullaryFnOnce for Row<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Row { simd, gate, up, out, act } = self;
        let (gv, gt) = pulp::as_arrays::<LANES, f32>(gate);
        let (uv, ut) = pulp::as_arrays::<LANES, f32>(up);
        let (ov, ot) = pulp::as_arrays_mut::<LANES, f32>(out);
        let one = simd.splat_f32s(1.0);
        let (scale, cube) = (simd.splat_f32s(GELU_SCALE), simd.splat_f32s(GELU_CUBE));
        for ((g, u), o) in gv.iter().zip(uv).zip(ov.iter_mut()) {
            let (mut g, mut u): (f32x16, f32x16) = (pulp::cast(*g), pulp::cast(*u));
            let t = match act {
                Activation::Silu => g,
                Activation::GeluTanh => {
                    simd.mul_f32s(scale, simd.mul_add_f32s(simd.mul_f32s(cube, simd.mul_f32s(g, g)), g, g))
                }
                Activation::ClampedSwiglu { alpha, limit } => {
                    let (high, low) = (simd.splat_f32s(limit), simd.splat_f32s(-limit));
                    g = simd.min_f32s(g, high);
                    u = simd.add_f32s(simd.max_f32s(simd.min_f32s(u, high), low), one);
                    simd.mul_f32s(simd.splat_f32s(alpha), g)
                }
            };
            let e = exp(simd, simd.sub_f32s(simd.splat_f32s(0.0), t));
            let gated = simd.div_f32s(g, simd.add_f32s(one, e));
            *o = pulp::cast(simd.mul_f32s(gated, u));
        }
        for ((&g, &u), o) in gt.iter().zip(ut).zip(ot.iter_mut()) {
            let (g, u) = clamped(g, u, act);
            *o = g / (1.0 + (-arg(g, act)).exp()) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In f64, GELU as transformers writes it (`gelu_pytorch_tanh`: ½ g (1 + tanh z)).
    fn reference(gate_up: &[f32], width: usize, act: Activation) -> Vec<f32> {
        let gate = |g: f64, u: f64| match act {
            Activation::Silu => g / (1.0 + (-g).exp()) * u,
            Activation::GeluTanh => {
                0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh()) * u
            }
            // transformers' `GptOssExperts._apply_gate`.
            Activation::ClampedSwiglu { alpha, limit } => {
                let (alpha, limit) = (alpha as f64, limit as f64);
                let (g, u) = (g.min(limit), u.clamp(-limit, limit));
                g / (1.0 + (-alpha * g).exp()) * (u + 1.0)
            }
        };
        gate_up
            .chunks(2 * width)
            .flat_map(|row| {
                let (g, u) = row.split_at(width);
                g.iter().zip(u).map(|(&g, &u)| gate(g as f64, u as f64) as f32)
            })
            .collect()
    }

    /// QuickGELU and GELU-tanh in place, vector part and tail, lengths around the lanes and past
    /// one task, against f64.
    #[test]
    fn quick_gelu_and_gelu_in_place_match_an_f64_reference() {
        for len in [0, 1, 15, 16, 17, 5000, (1 << 16) + 3] {
            let values: Vec<f32> = crate::kernels::test_values(len, 4).iter().map(|v| v * 12.0).collect();
            for gate in [Gate::Scaled(1.702), Gate::Tanh] {
                let mut got = values.clone();
                gate_in_place(&mut got, gate);
                for (&g, &y) in values.iter().zip(&got) {
                    let g = f64::from(g);
                    let want = match gate {
                        Gate::Scaled(a) => g / (1.0 + (-f64::from(a) * g).exp()),
                        Gate::Tanh => {
                            0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
                        }
                    };
                    assert!((f64::from(y) - want).abs() < 1e-5 * want.abs().max(1.0), "{gate:?} {g}: {y} vs {want}");
                }
            }
        }
    }

    /// Every width's vector part and scalar tail, against an f64 reference, across the range
    /// where the exponential is computed and beyond its clamp on both sides, for both gates.
    /// On the widest vectors this CPU has (AVX-512 on a machine that built with it); the plain
    /// row is checked on its own below.
    #[test]
    fn swiglu_and_geglu_match_an_f64_reference() {
        #[cfg(cpu_avx512)]
        assert!(V4::try_new().is_some(), "the build saw the instructions this kernel needs; the run does not");
        // gpt-oss's clamp at its own 7 (gates clamped), and at 0.5 (ups too).
        let clamped = [7.0, 0.5].map(|limit| Activation::ClampedSwiglu { alpha: 1.702, limit });
        for act in [Activation::Silu, Activation::GeluTanh].into_iter().chain(clamped) {
            check(act);
        }
    }

    fn check(act: Activation) {
        for (n, width) in [(1, 16), (3, 37), (5, 4864), (40, 2000)] {
            let values = crate::kernels::test_values(n * 2 * width, 5);
            // Gates from -100 to 100; ups in [-1, 1).
            let gate_up: Vec<f32> = values
                .chunks(2 * width)
                .flat_map(|row| {
                    let (g, u) = row.split_at(width);
                    g.iter().map(|g| g * 100.0).chain(u.iter().copied()).collect::<Vec<_>>()
                })
                .collect();
            let got = run(&gate_up, width, act);
            let want = reference(&gate_up, width, act);
            let mut plain = vec![0.0f32; n * width];
            for (o, row) in plain.chunks_mut(width).zip(gate_up.chunks(2 * width)) {
                row_plain(&row[..width], &row[width..], o, act);
            }
            for (i, (g, w)) in plain.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 2e-6 * w.abs().max(1e-3),
                    "{act:?} plain, n {n} width {width} [{i}]: {g} vs {w}"
                );
            }
            assert_eq!(got.len(), n * width);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 2e-6 * w.abs().max(1e-3), "{act:?} n {n} width {width} [{i}]: {g} vs {w}");
            }
        }
        // The exponential near 0, where the gates' slopes matter most.
        let gate_up: Vec<f32> = (0..64).map(|i| (i as f32 - 16.0) / 8.0).collect();
        let (got, want) = (run(&gate_up, 32, act), reference(&gate_up, 32, act));
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1e-6), "{act:?}: {g} vs {w}");
        }
    }
}
