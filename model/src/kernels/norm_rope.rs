//! RMSNorm and the rotary embedding of q and k, each in one pass: the Burn ops take five passes
//! (square, mean, add, sqrt, divide, multiply) for a norm and about ten for the rotation of q
//! and k, each allocating, twice a layer per token; in decode they were most of the time outside
//! the products. The norm's sum of squares runs on AVX-512, or in plain Rust compiled for AVX2
//! where the CPU has it.

use pulp::x86::V4;
use pulp::{Simd, f32x16};
use rayon::prelude::*;

use super::plain::{self, Plain};

const LANES: usize = 16;
/// Rows per parallel task (a few hundred thousand values).
const ROWS_PER_TASK: usize = 64;

/// `x / sqrt(mean(x²) + eps) · w` per row.
///
/// # Shapes
/// x: [n, h], w: [h] → [n, h]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let (v4, plain) = (V4::try_new(), Plain::new());
    let h = w.len();
    assert!(h > 0 && x.len().is_multiple_of(h), "rms_norm: x is not [n, {h}]");
    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(h * ROWS_PER_TASK).zip(x.par_chunks(h * ROWS_PER_TASK)).for_each(|(out, x)| {
        for (out, x) in out.chunks_mut(h).zip(x.chunks(h)) {
            let sum = match v4 {
                Some(simd) => simd.vectorize(SumSquares { simd, x }),
                None => plain.vectorize(
                    #[inline(always)]
                    || plain::dot(x, x),
                ),
            };
            let scale = 1.0 / (sum / h as f32 + eps).sqrt();
            for ((o, x), w) in out.iter_mut().zip(x).zip(w) {
                *o = x * scale * w;
            }
        }
    });
    out
}

/// `Σ x²`, as a callable that `V4::vectorize` inlines into its AVX-512 function.
struct SumSquares<'a> {
    simd: V4,
    x: &'a [f32],
}

impl pulp::NullaryFnOnce for SumSquares<'_> {
    type Output = f32;

    #[inline(always)]
    fn call(self) -> f32 {
        let SumSquares { simd, x } = self;
        let (head, tail) = pulp::as_arrays::<LANES, f32>(x);
        let mut acc = simd.splat_f32s(0.0);
        for v in head {
            let v: f32x16 = pulp::cast(*v);
            acc = simd.mul_add_f32s(v, v, acc);
        }
        simd.reduce_sum_f32s(acc) + tail.iter().map(|v| v * v).sum::<f32>()
    }
}

/// The stacked q/k/v projection's output with the heads of q (columns `q`) and of k (columns
/// `k`) rotated (Hugging Face's rotate-half layout: dimension i pairs with i + d/2) and v as it
/// was. `cos` and `sin` are [n, d/2]: each token's angles.
/// With `norms`, each head of q and of k is RMS-normalised by its weights first (Qwen3).
///
/// # Shapes
/// qkv: [n, width] → [n, width]
pub fn rope_qk(
    qkv: &[f32],
    width: usize,
    q: std::ops::Range<usize>,
    k: std::ops::Range<usize>,
    d: usize,
    (cos, sin): (&[f32], &[f32]),
    norms: Option<HeadNorms<'_>>,
) -> Vec<f32> {
    let half = d / 2;
    let n = cos.len() / half.max(1);
    assert!(qkv.len() == n * width && sin.len() == cos.len(), "rope_qk: operands do not match their shapes");
    assert!(
        q.len().is_multiple_of(d) && k.len().is_multiple_of(d) && q.end <= width && k.end <= width,
        "rope_qk: heads"
    );
    let mut out = qkv.to_vec();
    out.par_chunks_mut(width * ROWS_PER_TASK).enumerate().for_each(|(task, rows)| {
        for (r, row) in rows.chunks_mut(width).enumerate() {
            let t = task * ROWS_PER_TASK + r;
            let (cos, sin) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
            for (part, cols) in [q.clone(), k.clone()].into_iter().enumerate() {
                for head in row[cols].chunks_mut(d) {
                    if let Some(HeadNorms { weights, eps }) = norms {
                        let scale = 1.0 / (head.iter().map(|v| v * v).sum::<f32>() / d as f32 + eps).sqrt();
                        head.iter_mut().zip(weights[part]).for_each(|(x, w)| *x = *x * scale * w);
                    }
                    let (x1, x2) = head.split_at_mut(half);
                    for i in 0..half {
                        let (a, b) = (x1[i], x2[i]);
                        x1[i] = a * cos[i] - b * sin[i];
                        x2[i] = b * cos[i] + a * sin[i];
                    }
                }
            }
        }
    });
    out
}

/// Per-head RMSNorms of q and k before the rotation: their weights (\[d\] each) and epsilon.
#[derive(Debug, Clone, Copy)]
pub struct HeadNorms<'a> {
    pub weights: [&'a [f32]; 2],
    pub eps: f32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_values;

    /// On the widest vectors this CPU has (AVX-512 on a machine that built with it), and the
    /// plain sum of squares (`plain::dot(x, x)`) on its own.
    #[test]
    fn rms_norm_matches_an_f64_reference() {
        #[cfg(cpu_avx512)]
        assert!(V4::try_new().is_some(), "the build saw the instructions this kernel needs; the run does not");
        let row = test_values(37, 3);
        let want: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum();
        assert!((plain::dot(&row, &row) as f64 - want).abs() < 1e-5);
        for (n, h) in [(1, 16), (3, 37), (130, 896)] {
            let x = test_values(n * h, 1);
            let w = test_values(h, 2);
            let got = rms_norm(&x, &w, 1e-6);
            for r in 0..n {
                let row = &x[r * h..(r + 1) * h];
                let rms = (row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / h as f64 + 1e-6).sqrt();
                for i in 0..h {
                    let want = row[i] as f64 / rms * w[i] as f64;
                    assert!((got[r * h + i] as f64 - want).abs() < 1e-5, "[{r}, {i}]");
                }
            }
        }
    }

    #[test]
    fn rope_rotates_q_and_k_and_leaves_v() {
        let (n, d, heads, kv) = (3, 8, 2, 1);
        let width = (heads + 2 * kv) * d;
        let qkv = test_values(n * width, 4);
        let angles: Vec<f32> = (0..n * d / 2).map(|i| i as f32 * 0.3).collect();
        let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| (a.cos(), a.sin())).unzip();
        let out = rope_qk(&qkv, width, 0..heads * d, heads * d..(heads + kv) * d, d, (&cos, &sin), None);
        for t in 0..n {
            for c in 0..width {
                let (head_c, i) = (c / d, c % d);
                let x = &qkv[t * width + head_c * d..][..d];
                let want = if head_c >= heads + kv {
                    qkv[t * width + c]
                } else {
                    let f = i % (d / 2);
                    let (co, si) = (cos[t * d / 2 + f], sin[t * d / 2 + f]);
                    if i < d / 2 { x[f] * co - x[f + d / 2] * si } else { x[f + d / 2] * co + x[f] * si }
                };
                assert!((out[t * width + c] - want).abs() < 1e-6, "token {t} column {c}");
            }
        }
    }

    /// With per-head norms, the pass equals normalising each head of q and k, then rotating.
    #[test]
    fn head_norms_then_rope_in_one_pass() {
        let (n, d, heads, kv) = (2, 8, 2, 1);
        let width = (heads + 2 * kv) * d;
        let qkv: Vec<f32> = test_values(n * width, 6).iter().map(|v| v * 3.0).collect();
        let (cos, sin): (Vec<f32>, Vec<f32>) = (0..n * d / 2).map(|i| ((i as f32).cos(), (i as f32).sin())).unzip();
        let (wq, wk) = (test_values(d, 7), test_values(d, 8));
        let (q, k) = (0..heads * d, heads * d..(heads + kv) * d);
        let norms = HeadNorms { weights: [&wq, &wk], eps: 1e-6 };
        let got = rope_qk(&qkv, width, q.clone(), k.clone(), d, (&cos, &sin), Some(norms));
        let mut normed = qkv.clone();
        for row in normed.chunks_mut(width) {
            for (cols, w) in [(q.clone(), &wq), (k.clone(), &wk)] {
                for head in row[cols].chunks_mut(d) {
                    let scale = 1.0 / (head.iter().map(|v| v * v).sum::<f32>() / d as f32 + 1e-6).sqrt();
                    head.iter_mut().zip(w.iter()).for_each(|(x, w)| *x = *x * scale * w);
                }
            }
        }
        let want = rope_qk(&normed, width, q, k, d, (&cos, &sin), None);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() < 1e-5, "{i}: {g} vs {w}");
        }
    }
}
