//! A prefill tile with its queries along the vector lanes (AVX-512): sixteen query heads to a
//! vector, so nothing is ever summed across lanes.
//!
//! The per-query path scores a block of sixteen cells with sixteen dot products and one
//! transposing reduction (45 instructions) per query, then rescales each query on its own.
//! Here the tile's queries are transposed once per task (`[d, 16]` per vector, pre-scaled):
//! - **Scores:** for each cell of the block and each of the head's `d` dimensions, one FMA of the
//!   cell's key value (broadcast) into that cell's sixteen-query score vector: `16 · d` FMAs
//!   for 16 × 16 scores, sixteen independent sums.
//! - **Softmax:** the running maximum and sum are vectors over the queries; the causal mask (rows
//!   of the tile see different prefixes) is a lane mask per cell, built only for the blocks that
//!   need it.
//! - **Values:** the output is kept transposed (`[d, 16]`), eight dimensions at a time in
//!   registers, each taking the sixteen cells' broadcast value times their weight vector.
//!
//! The block's keys and values are widened once and read by every vector of the tile: a tile is
//! sixteen rows, so a GQA group of 7 (Qwen2.5-0.5B) fills seven vectors exactly.

use std::arch::x86_64::{__m512, _CMP_LT_OQ, _CMP_NEQ_OQ};

use pulp::x86::V4;
use pulp::{Simd, f32x16};

use super::Stored;
use super::{Attention, LANES, Partial, Task, load_block};

/// The task with the tile's queries along the lanes, for head dims of 16, 32, 64 and 128; `None`
/// for the others (the caller takes the per-query path).
#[inline(always)]
pub(super) fn tile<T: Stored>(simd: V4, a: &Attention<'_, T>, task: &Task) -> Option<Partial> {
    Some(match a.d {
        16 => tile_d::<T, 16>(simd, a, task),
        32 => tile_d::<T, 32>(simd, a, task),
        64 => tile_d::<T, 64>(simd, a, task),
        128 => tile_d::<T, 128>(simd, a, task),
        _ => return None,
    })
}

/// Output dimensions kept in registers at once while the values are added.
const OUT_CHUNK: usize = 8;

#[inline(always)]
fn tile_d<T: Stored, const D: usize>(simd: V4, a: &Attention<'_, T>, task: &Task) -> Partial {
    let cells = &a.visible[task.rows.end - 1];
    let mut l = Lanes::<LANES>::new(a, task, D);
    let (mut keys, mut values) = (vec![0.0f32; LANES * D], vec![0.0f32; LANES * D]);
    let f = simd.avx512f;
    for b0 in task.cells.clone().step_by(LANES) {
        let width = LANES.min(task.cells.end - b0);
        load_block(simd, a, task.kv_head, &cells[b0..b0 + width], &mut keys, &mut values);
        let (k_rows, _) = keys.as_chunks::<D>();
        let (v_rows, _) = values.as_chunks::<D>();
        for v in 0..l.vectors {
            let q = &l.qt[v * D..(v + 1) * D];
            let mut s = [simd.splat_f32s(0.0); LANES];
            for k in 0..D {
                let qk: f32x16 = pulp::cast(q[k]);
                for t in 0..LANES {
                    s[t] = simd.mul_add_f32s(simd.splat_f32s(k_rows[t][k]), qk, s[t]);
                }
            }
            // Lane masks of the cells each query sees, where some lane does not see them all.
            let masked = width < LANES || l.fewest[v] < b0 + LANES;
            let mut visible = [u16::MAX; LANES];
            if masked {
                let seen: __m512 = pulp::cast(l.seen[v]);
                for (t, m) in visible.iter_mut().enumerate() {
                    let position = f._mm512_set1_ps((b0 + t) as f32);
                    *m = if t < width { f._mm512_cmp_ps_mask::<_CMP_LT_OQ>(position, seen) } else { 0 };
                    s[t] =
                        pulp::cast(f._mm512_mask_blend_ps(*m, f._mm512_set1_ps(f32::NEG_INFINITY), pulp::cast(s[t])));
                }
            }
            let block_max = s.iter().fold(simd.splat_f32s(f32::NEG_INFINITY), |m, x| simd.max_f32s(m, *x));
            let old: f32x16 = pulp::cast(l.max[v]);
            let new = simd.max_f32s(old, block_max);
            // A lane that has seen no cell yet keeps −∞ as its maximum and 0 as its sum; its
            // weights are measured from 0 and masked to 0.
            let finite = f._mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(pulp::cast(new), f._mm512_set1_ps(f32::NEG_INFINITY));
            let reference: f32x16 = pulp::cast(f._mm512_maskz_mov_ps(finite, pulp::cast(new)));
            let shrink = super::super::exp::exp(simd, simd.sub_f32s(old, reference));
            let mut weights = [simd.splat_f32s(0.0); LANES];
            let mut total = simd.mul_f32s(pulp::cast(l.sum[v]), shrink);
            for t in 0..LANES {
                let w = super::super::exp::exp(simd, simd.sub_f32s(s[t], reference));
                weights[t] = if masked { pulp::cast(f._mm512_maskz_mov_ps(visible[t], pulp::cast(w))) } else { w };
                total = simd.add_f32s(total, weights[t]);
            }
            l.sum[v] = pulp::cast(total);
            l.max[v] = pulp::cast(new);
            let o = &mut l.ot[v * D..(v + 1) * D];
            for c in (0..D).step_by(OUT_CHUNK) {
                let mut acc: [f32x16; OUT_CHUNK] = std::array::from_fn(|j| simd.mul_f32s(pulp::cast(o[c + j]), shrink));
                for t in 0..LANES {
                    for j in 0..OUT_CHUNK {
                        acc[j] = simd.mul_add_f32s(simd.splat_f32s(v_rows[t][c + j]), weights[t], acc[j]);
                    }
                }
                for j in 0..OUT_CHUNK {
                    o[c + j] = pulp::cast(acc[j]);
                }
            }
        }
    }
    l.into_partial()
}

/// A task's queries laid out for a lanes path of `L` lanes, and its running state.
pub(super) struct Lanes<const L: usize> {
    /// Query heads in the tile, and the head dim.
    queries: usize,
    d: usize,
    pub vectors: usize,
    /// The queries transposed and scaled by `1/√d`: `[vectors, d]` of `L` lanes.
    pub qt: Vec<[f32; L]>,
    /// Each lane's count of visible cells (positions in the last row's list; 0 for the padding
    /// lanes of the last vector).
    pub seen: Vec<[f32; L]>,
    /// The fewest cells a vector's real lanes see: blocks below it need no mask.
    pub fewest: Vec<usize>,
    /// The output transposed, `[vectors, d]` of `L` lanes; the maxima and sums per vector.
    pub ot: Vec<[f32; L]>,
    pub max: Vec<[f32; L]>,
    pub sum: Vec<[f32; L]>,
}

impl<const L: usize> Lanes<L> {
    pub(super) fn new<T>(a: &Attention<'_, T>, task: &Task, d: usize) -> Self {
        let group = a.heads / a.kv_heads;
        let queries = task.rows.len() * group;
        let vectors = queries.div_ceil(L);
        let scale = 1.0 / (d as f32).sqrt();
        let mut qt = vec![[0.0f32; L]; vectors * d];
        let mut seen = vec![[0.0f32; L]; vectors];
        for qi in 0..queries {
            let row = task.rows.start + qi / group;
            let q = &a.q[(row * a.heads + a.kv_head_first(task.kv_head) + qi % group) * d..][..d];
            let (v, lane) = (qi / L, qi % L);
            for (k, &x) in q.iter().enumerate() {
                qt[v * d + k][lane] = x * scale;
            }
            seen[v][lane] = a.visible[row].len() as f32;
        }
        let fewest = (0..vectors)
            .map(|v| seen[v][..(queries - v * L).min(L)].iter().fold(f32::INFINITY, |m, &s| m.min(s)) as usize)
            .collect();
        Self {
            queries,
            d,
            vectors,
            qt,
            seen,
            fewest,
            ot: vec![[0.0; L]; vectors * d],
            max: vec![[f32::NEG_INFINITY; L]; vectors],
            sum: vec![[0.0; L]; vectors],
        }
    }

    /// The state back as one row of `d` per query.
    pub(super) fn into_partial(self) -> Partial {
        let Self { queries, d, ot, max, sum, .. } = self;
        let mut p = Partial { out: vec![0.0; queries * d], max: vec![0.0; queries], sum: vec![0.0; queries] };
        for qi in 0..queries {
            let (v, lane) = (qi / L, qi % L);
            for k in 0..d {
                p.out[qi * d + k] = ot[v * d + k][lane];
            }
            p.max[qi] = max[v][lane];
            p.sum[qi] = sum[v][lane];
        }
        p
    }
}
