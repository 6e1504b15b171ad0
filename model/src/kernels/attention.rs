//! Grouped-query attention of each batch row over only the cache cells it can see, on AVX-512.
//!
//! The Burn path scores every row against every cell up to the cache's extent and masks the
//! rest with −∞: with 16 sequences decoding, each row pays for the other 15 sequences' cells
//! (scores, mask, exp, and the weighted sum), and the cost grows with the square of the
//! concurrency. Here a task per (row, kv head) walks the row's visible cells only: scores
//! against the group's query heads, softmax, then the weighted sum of the values.

use pulp::x86::V4;
use rayon::prelude::*;

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
        // scores[j][i]: query head j of the group against visible cell i.
        let mut scores = vec![0.0f32; group * cells.len()];
        for (i, &c) in cells.iter().enumerate() {
            let k = &a.k[cache(c)..][..d];
            for j in 0..group {
                scores[j * cells.len() + i] = dot(simd, &q[j * d..(j + 1) * d], k) * scale;
            }
        }
        for j in 0..group {
            let s = &mut scores[j * cells.len()..(j + 1) * cells.len()];
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for x in s.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
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

/// `a · b`: the x·Wᵀ kernel's one-by-one tile.
#[inline(always)]
fn dot(simd: V4, a: &[f32], b: &[f32]) -> f32 {
    super::xwt::tile::<f32, 1, 1>(simd, a, b, a.len())[0][0]
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
    /// do), head dims with and without a tail past 16 lanes, groups of 1 and 7 query heads.
    #[test]
    fn attention_over_visible_cells_equals_the_reference() {
        if V4::try_new().is_none() {
            eprintln!("no AVX-512 on this CPU: the kernel is not used here");
            return;
        }
        for (heads, kv_heads, d) in [(14, 2, 64), (4, 4, 8), (6, 2, 20)] {
            let capacity = 40;
            let visible: Vec<Vec<u32>> =
                vec![(0..40).step_by(2).collect(), (1..40).step_by(2).collect(), vec![7], (0..25).collect()];
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
