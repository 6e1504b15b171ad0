//! Grouped-query attention of each batch row over only the cache cells it can see, on AVX-512.
//!
//! The Burn path scores every row against every cell up to the cache's extent and masks the
//! rest with −∞: with 16 sequences decoding, each row pays for the other 15 sequences' cells
//! (scores, mask, exp, and the weighted sum), and the cost grows with the square of the
//! concurrency. Here a task per (row, kv head) walks the row's visible cells only: scores
//! against the group's query heads, softmax, then the weighted sum of the values.

use std::arch::x86_64::{__m512, __m512d};

use pulp::x86::V4;
use pulp::{Simd, f32x16};
use rayon::prelude::*;

use super::exp::exp_sub_sum;

const LANES: usize = 16;

/// The operands of one layer's attention.
pub struct Attention<'a> {
    /// [n, heads, d], rotated.
    pub q: &'a [f32],
    /// [kv_heads, capacity, d] each: the layer's whole cache; keys rotated.
    pub k: &'a [f32],
    pub v: &'a [f32],
    /// [n]: the cells each row sees (every row sees at least one).
    pub visible: &'a [Vec<u32>],
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
    pub capacity: usize,
}

/// Runs the attention on AVX-512; `None` when the CPU has no AVX-512 (the caller falls back).
///
/// # Shapes
/// returns [n, heads · d] row-major
pub fn run(a: &Attention<'_>) -> Option<Vec<f32>> {
    let simd = V4::try_new()?;
    let n = a.visible.len();
    assert!(a.kv_heads > 0 && a.heads.is_multiple_of(a.kv_heads), "attention: heads must be a multiple of kv heads");
    assert!(a.q.len() == n * a.heads * a.d, "attention: q does not match its shape");
    assert!(a.k.len() == a.kv_heads * a.capacity * a.d && a.v.len() == a.k.len(), "attention: k, v do not match");
    assert!(
        a.visible.iter().flatten().all(|&c| (c as usize) < a.capacity),
        "attention: a visible cell lies outside the cache"
    );
    let group = a.heads / a.kv_heads;
    let mut out = vec![0.0f32; n * a.heads * a.d];
    if out.is_empty() {
        return Some(out);
    }
    // Query head h reads kv head h / group, so out[t] holds kv head g's group at [g·group·d..].
    out.par_chunks_mut(group * a.d).enumerate().for_each(|(i, out)| {
        simd.vectorize(RowHead { simd, a, row: i / a.kv_heads, kv_head: i % a.kv_heads, out });
    });
    Some(out)
}

/// One row's query heads of one kv head, as a callable that `V4::vectorize` inlines into its
/// AVX-512 function.
struct RowHead<'a, 'o> {
    simd: V4,
    a: &'a Attention<'a>,
    row: usize,
    kv_head: usize,
    /// [group, d]
    out: &'o mut [f32],
}

impl pulp::NullaryFnOnce for RowHead<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let RowHead { simd, a, row, kv_head, out } = self;
        let (d, group) = (a.d, a.heads / a.kv_heads);
        let cells = &a.visible[row];
        let scale = 1.0 / (d as f32).sqrt();
        let q = &a.q[(row * a.heads + kv_head * group) * d..][..group * d];
        let cache = |c: u32| (kv_head * a.capacity + c as usize) * d;
        // scores[j][i]: query head j of the group against visible cell i. Sixteen cells at a time
        // when the head dim is 16, 32, 64 or 128 (`scores_of_16`), one at a time otherwise.
        let mut scores = vec![0.0f32; group * cells.len()];
        let blocked = match d {
            16 | 32 | 64 | 128 => cells.len() / LANES * LANES,
            _ => 0,
        };
        for j in 0..group {
            let q = &q[j * d..(j + 1) * d];
            for i0 in (0..blocked).step_by(LANES) {
                let keys: [&[f32]; LANES] = std::array::from_fn(|t| &a.k[cache(cells[i0 + t])..][..d]);
                let out = &mut scores[j * cells.len() + i0..][..LANES];
                match d {
                    16 => scores_of_16::<1>(simd, q, &keys, scale, out),
                    32 => scores_of_16::<2>(simd, q, &keys, scale, out),
                    64 => scores_of_16::<4>(simd, q, &keys, scale, out),
                    _ => scores_of_16::<8>(simd, q, &keys, scale, out),
                }
            }
        }
        for (i, &c) in cells.iter().enumerate().skip(blocked) {
            let k = &a.k[cache(c)..][..d];
            for j in 0..group {
                scores[j * cells.len() + i] = super::xwt::dot(simd, &q[j * d..(j + 1) * d], k, d) * scale;
            }
        }
        for j in 0..group {
            let s = &mut scores[j * cells.len()..(j + 1) * cells.len()];
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum = exp_sub_sum(simd, s, max);
            let o = &mut out[j * d..(j + 1) * d];
            for (i, &c) in cells.iter().enumerate() {
                let p = s[i] / sum;
                let v = &a.v[cache(c)..][..d];
                for (o, v) in o.iter_mut().zip(v) {
                    *o += p * v;
                }
            }
        }
    }
}

/// `q · keys[t] · scale` for sixteen keys, with the head dim `CH` vectors long: the query stays
/// in registers, each key takes `CH` FMAs into its own accumulator, and the sixteen sums come
/// out of one transposing reduction (45 instructions, against 8 per single dot product's).
#[inline(always)]
fn scores_of_16<const CH: usize>(simd: V4, q: &[f32], keys: &[&[f32]; LANES], scale: f32, out: &mut [f32]) {
    let mut qv = [simd.splat_f32s(0.0); CH];
    for (qv, q) in qv.iter_mut().zip(pulp::as_arrays::<LANES, f32>(q).0) {
        *qv = pulp::cast(*q);
    }
    let mut acc = [simd.splat_f32s(0.0); LANES];
    for (acc, key) in acc.iter_mut().zip(keys) {
        let key = pulp::as_arrays::<LANES, f32>(key).0;
        for c in 0..CH {
            *acc = simd.mul_add_f32s(qv[c], pulp::cast(key[c]), *acc);
        }
    }
    let sums = simd.mul_f32s(reduce_16(simd, acc), simd.splat_f32s(scale));
    out.copy_from_slice(&pulp::cast::<f32x16, [f32; LANES]>(sums));
}

/// Lane t of the result is the sum of the lanes of `v[t]`.
#[inline(always)]
fn reduce_16(simd: V4, v: [f32x16; LANES]) -> f32x16 {
    let f = simd.avx512f;
    // Per 128-bit lane of each pair (a, b): (a0 + a2, b0 + b2, a1 + a3, b1 + b3).
    let mut s = [simd.splat_f32s(0.0); 8];
    for (p, s) in s.iter_mut().enumerate() {
        let (a, b): (__m512, __m512) = (pulp::cast(v[2 * p]), pulp::cast(v[2 * p + 1]));
        *s = pulp::cast(f._mm512_add_ps(f._mm512_unpacklo_ps(a, b), f._mm512_unpackhi_ps(a, b)));
    }
    // Per 128-bit lane, the four items 4p..4p + 4 summed over that lane.
    let mut t = [simd.splat_f32s(0.0); 4];
    for (p, t) in t.iter_mut().enumerate() {
        let (a, b): (__m512d, __m512d) = (pulp::cast(s[2 * p]), pulp::cast(s[2 * p + 1]));
        let lo = f._mm512_castpd_ps(f._mm512_unpacklo_pd(a, b));
        let hi = f._mm512_castpd_ps(f._mm512_unpackhi_pd(a, b));
        *t = pulp::cast(f._mm512_add_ps(lo, hi));
    }
    // Sum the four 128-bit lanes of t[p] into 128-bit lane p of the result.
    let [t0, t1, t2, t3]: [__m512; 4] = [pulp::cast(t[0]), pulp::cast(t[1]), pulp::cast(t[2]), pulp::cast(t[3])];
    let v01 = f._mm512_add_ps(f._mm512_shuffle_f32x4::<0x88>(t0, t1), f._mm512_shuffle_f32x4::<0xDD>(t0, t1));
    let v23 = f._mm512_add_ps(f._mm512_shuffle_f32x4::<0x88>(t2, t3), f._mm512_shuffle_f32x4::<0xDD>(t2, t3));
    pulp::cast(f._mm512_add_ps(f._mm512_shuffle_f32x4::<0x88>(v01, v23), f._mm512_shuffle_f32x4::<0xDD>(v01, v23)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_values as values;

    /// Softmax-weighted values in f64, computed over the visible cells.
    fn reference(a: &Attention<'_>) -> Vec<f64> {
        let (d, group) = (a.d, a.heads / a.kv_heads);
        let mut out = Vec::new();
        for (t, cells) in a.visible.iter().enumerate() {
            for h in 0..a.heads {
                let g = h / group;
                let q = &a.q[(t * a.heads + h) * d..][..d];
                let at = |c: u32| (g * a.capacity + c as usize) * d;
                let scores: Vec<f64> = cells
                    .iter()
                    .map(|&c| q.iter().zip(&a.k[at(c)..at(c) + d]).map(|(x, y)| *x as f64 * *y as f64).sum::<f64>())
                    .map(|s| s / (d as f64).sqrt())
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for e in 0..d {
                    out.push(cells.iter().zip(&weights).map(|(&c, w)| w / sum * a.v[at(c) + e] as f64).sum());
                }
            }
        }
        out
    }

    /// Rows that see different, interleaved sets of cells (as sequences decoding side by side
    /// do), head dims with and without a tail past 16 lanes, groups of 1 and 7 query heads, and
    /// rows seeing 16 or more cells (scored sixteen at a time, with a tail).
    #[test]
    #[cfg_attr(not(cpu_avx512), ignore = "this CPU has no AVX-512 (the kernel does not run here)")]
    fn attention_over_visible_cells_equals_the_reference() {
        assert!(V4::try_new().is_some(), "the build saw the instructions this kernel needs; the run does not");
        for (heads, kv_heads, d) in [(14, 2, 64), (4, 4, 8), (6, 2, 20), (2, 2, 16), (4, 2, 32), (2, 1, 128)] {
            let capacity = 40;
            let visible: Vec<Vec<u32>> = vec![
                (0..40).step_by(2).collect(),
                (1..40).step_by(2).collect(),
                vec![7],
                (0..25).collect(),
                (0..40).rev().collect(),
            ];
            let q = values(visible.len() * heads * d, 1);
            let k = values(kv_heads * capacity * d, 2);
            let v = values(kv_heads * capacity * d, 3);
            let a = Attention { q: &q, k: &k, v: &v, visible: &visible, heads, kv_heads, d, capacity };
            let got = run(&a).unwrap();
            let want = reference(&a);
            assert_eq!(got.len(), want.len());
            let err = got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
            assert!(err < 1e-5, "heads {heads}, kv heads {kv_heads}, d {d}: max error {err}");
        }
    }
}
