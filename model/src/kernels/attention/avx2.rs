//! One query against a whole block of sixteen cells with AVX2 and FMA, for CPUs without AVX-512
//! (Zen 2 and 3, Intel client cores): the counterpart of the AVX-512 `full_block`. The plain
//! path it replaces there scored each cell with a dot product of its own (a chain of dependent
//! adds and a horizontal sum each) and added each weighted value into the output in memory, a
//! load and a store per 8 lanes per cell; a 4,096-token prefill spent half its time there.
//! Here:
//! - **Scores**: eight keys at a time, each into its own accumulator (eight independent FMA
//!   chains), the query's vectors loaded once per eight keys; one transposing reduction turns
//!   the eight accumulators into a vector of eight scores.
//! - **Softmax**: the block's maximum, `e^(s − max)` on vectors (the Cephes polynomial of
//!   `exp.rs`), the running maximum and sum as on AVX-512.
//! - **Output**: up to eight vectors of it (64 values) stay in registers while the sixteen
//!   weighted values are added; a head dim of 128 takes two passes.
//!
//! [`lanes`] is `lanes.rs`'s path on AVX2: a prefill tile's query heads eight to a vector, one
//! per lane, so a block's scores are broadcast-key FMAs with nothing summed across lanes, and
//! the softmax and output are vectors over the queries; the scores are made in two halves of
//! eight cells (sixteen registers).
//!
//! `unsafe` (C8: the reason). The `#[target_feature]` function may only run on a CPU with AVX2
//! and FMA: the caller passes pulp's `V3` token, which exists only where the CPU has both. The
//! vector loads and stores are `kernels/avx2.rs`'s, on arrays of 8 f32. Nothing else here is
//! unsafe.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use pulp::x86::V3;

use super::Stored;
use super::lanes::Lanes;
use super::{Attention, Partial, Task, load_block};
use crate::kernels::avx2::{W, load, reduce_max, reduce_sum, store};
use crate::kernels::exp::{LN2_HI, LN2_LO, MAX, MIN, POLY, ROUND};
use crate::kernels::plain::Plain;

/// Cells in a block.
const CELLS: usize = 16;

/// [`super::full_block`]'s contract on AVX2: `q` is one query of the head dim d, `keys` and
/// `values` are the block's 16 cells widened to f32 ([16, d] each), `state` the query's running
/// maximum and sum, `o` its unnormalised output. Returns false (and does nothing) where d is
/// not 16, 32, 64 or 128; the caller then takes the general path.
pub(super) fn full_block(
    _cpu: V3,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    state: (&mut f32, &mut f32),
    o: &mut [f32],
) -> bool {
    let d = q.len();
    assert!(keys.len() >= CELLS * d && values.len() >= CELLS * d && o.len() == d, "attention: block operands");
    // SAFETY (each arm): the `V3` token exists only where the CPU has AVX2 and FMA.
    macro_rules! run {
        ($ch:literal) => {{
            let (q, o) = (vectors::<$ch>(q), vectors_mut::<$ch>(o));
            let (keys, values) = (cells::<$ch>(keys), cells::<$ch>(values));
            unsafe { block::<$ch>(q, keys, values, scale, state, o) }
        }};
    }
    match d {
        16 => run!(2),
        32 => run!(4),
        64 => run!(8),
        128 => run!(16),
        _ => return false,
    }
    true
}

/// The first `CH` vectors of `x` (at least that long).
fn vectors<const CH: usize>(x: &[f32]) -> &[[f32; W]; CH] {
    x.as_chunks::<W>().0.first_chunk::<CH>().expect("attention: a vector too short")
}

fn vectors_mut<const CH: usize>(x: &mut [f32]) -> &mut [[f32; W]; CH] {
    x.as_chunks_mut::<W>().0.first_chunk_mut::<CH>().expect("attention: a vector too short")
}

/// The first 16 cells of `x` ([16, d] with d `CH` vectors long).
fn cells<const CH: usize>(x: &[f32]) -> &[[[f32; W]; CH]; CELLS] {
    x.as_chunks::<W>().0.as_chunks::<CH>().0.first_chunk::<CELLS>().expect("attention: a block too short")
}

/// [`full_block`] for a head dim of `CH` vectors; the sizes are in the types, so no access is
/// checked in the loops.
#[target_feature(enable = "avx2,fma")]
fn block<const CH: usize>(
    q: &[[f32; W]; CH],
    keys: &[[[f32; W]; CH]; CELLS],
    values: &[[[f32; W]; CH]; CELLS],
    scale: f32,
    (max, sum): (&mut f32, &mut f32),
    o: &mut [[f32; W]; CH],
) {
    // The sixteen scores, eight per vector.
    let mut scores = [_mm256_setzero_ps(); 2];
    for (half, scores) in scores.iter_mut().enumerate() {
        let mut acc = [_mm256_setzero_ps(); W];
        for c in 0..CH {
            let qc = load(&q[c]);
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(qc, load(&keys[W * half + j][c]), *acc);
            }
        }
        *scores = _mm256_mul_ps(sums_of_8(acc), _mm256_set1_ps(scale));
    }
    let new_max = max.max(reduce_max(_mm256_max_ps(scores[0], scores[1])));
    // Rescale what came before when the maximum grows (e^−∞ = 0 the first time).
    let shrink = if new_max > *max {
        let shrink = (*max - new_max).exp();
        *sum *= shrink;
        *max = new_max;
        Some(_mm256_set1_ps(shrink))
    } else {
        None
    };
    let m = _mm256_set1_ps(new_max);
    let weights = [exp(_mm256_sub_ps(scores[0], m)), exp(_mm256_sub_ps(scores[1], m))];
    *sum += reduce_sum(_mm256_add_ps(weights[0], weights[1]));
    let mut w = [[0.0f32; W]; 2];
    store(&mut w[0], weights[0]);
    store(&mut w[1], weights[1]);
    // The output, up to eight vectors at a time, in registers while the cells' values add in.
    for c0 in (0..CH).step_by(W) {
        let n = (CH - c0).min(W);
        let mut acc = [_mm256_setzero_ps(); W];
        for (c, acc) in acc[..n].iter_mut().enumerate() {
            *acc = load(&o[c0 + c]);
            if let Some(shrink) = shrink {
                *acc = _mm256_mul_ps(*acc, shrink);
            }
        }
        for (t, &wt) in w.as_flattened().iter().enumerate() {
            let wt = _mm256_set1_ps(wt);
            for (c, acc) in acc[..n].iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(wt, load(&values[t][c0 + c]), *acc);
            }
        }
        for (c, acc) in acc[..n].iter().enumerate() {
            store(&mut o[c0 + c], *acc);
        }
    }
}

/// Lane j of the result is the sum of the lanes of `v[j]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn sums_of_8(v: [__m256; W]) -> __m256 {
    // Per 128-bit lane: pairs summed, then quads; lanes 0-3 hold v[0..4]'s low halves' sums
    // (and v[4..8]'s in the other vector), lanes 4-7 their high halves'.
    let (h01, h23) = (_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    let (h45, h67) = (_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    let (a, b) = (_mm256_hadd_ps(h01, h23), _mm256_hadd_ps(h45, h67));
    _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b))
}

/// `e^x` per lane, as `exp.rs` computes it.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp(x: __m256) -> __m256 {
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(MIN)), _mm256_set1_ps(MAX));
    let round = _mm256_set1_ps(ROUND);
    let k = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E), round), round);
    let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(POLY[0]);
    for c in &POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0));
    // 2^k from the exponent bits: k + 127 lies in [1, 254].
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
}

/// The task with the tile's queries along the lanes, for head dims of 16, 32, 64 and 128; `None`
/// for the others (the caller goes query by query). `plain` widens the blocks.
pub(super) fn lanes<T: Stored>(_cpu: V3, plain: Plain, a: &Attention<'_, T>, task: &Task) -> Option<Partial> {
    // SAFETY (each arm): the `V3` token exists only where the CPU has AVX2 and FMA.
    Some(match a.d {
        16 => unsafe { lanes_d::<T, 16>(plain, a, task) },
        32 => unsafe { lanes_d::<T, 32>(plain, a, task) },
        64 => unsafe { lanes_d::<T, 64>(plain, a, task) },
        128 => unsafe { lanes_d::<T, 128>(plain, a, task) },
        _ => return None,
    })
}

#[target_feature(enable = "avx2,fma")]
fn lanes_d<T: Stored, const D: usize>(plain: Plain, a: &Attention<'_, T>, task: &Task) -> Partial {
    let cells = &a.visible[task.rows.end - 1];
    let mut l = Lanes::<W>::new(a, task, D);
    let (mut keys, mut values) = (vec![0.0f32; CELLS * D], vec![0.0f32; CELLS * D]);
    let minus_infinity = _mm256_set1_ps(f32::NEG_INFINITY);
    for b0 in task.cells.clone().step_by(CELLS) {
        let width = CELLS.min(task.cells.end - b0);
        load_block(plain, a, task.kv_head, &cells[b0..b0 + width], &mut keys, &mut values);
        let (k_rows, _) = keys.as_chunks::<D>();
        let (v_rows, _) = values.as_chunks::<D>();
        for v in 0..l.vectors {
            let q = &l.qt[v * D..(v + 1) * D];
            let mut s = [_mm256_setzero_ps(); CELLS];
            for half in 0..2 {
                let mut acc = [_mm256_setzero_ps(); W];
                for (k, q) in q.iter().enumerate() {
                    let qk = load(q);
                    for (t, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm256_fmadd_ps(_mm256_set1_ps(k_rows[half * W + t][k]), qk, *acc);
                    }
                }
                s[half * W..(half + 1) * W].copy_from_slice(&acc);
            }
            // Lane masks of the cells each query sees, where some lane does not see them all.
            let masked = width < CELLS || l.fewest[v] < b0 + CELLS;
            let mut visible = [_mm256_setzero_ps(); CELLS];
            if masked {
                let seen = load(&l.seen[v]);
                for (t, m) in visible.iter_mut().enumerate().take(width) {
                    *m = _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_set1_ps((b0 + t) as f32), seen);
                }
                for (s, m) in s.iter_mut().zip(&visible) {
                    *s = _mm256_blendv_ps(minus_infinity, *s, *m);
                }
            }
            let block_max = s.iter().fold(minus_infinity, |m, x| _mm256_max_ps(m, *x));
            let old = load(&l.max[v]);
            let new = _mm256_max_ps(old, block_max);
            // A lane that has seen no cell yet keeps −∞ and 0; its weights are measured from 0
            // and masked to 0.
            let reference = _mm256_and_ps(new, _mm256_cmp_ps::<_CMP_NEQ_OQ>(new, minus_infinity));
            let shrink = exp(_mm256_sub_ps(old, reference));
            let mut weights = [[0.0f32; W]; CELLS];
            let mut total = _mm256_mul_ps(load(&l.sum[v]), shrink);
            for (t, w) in weights.iter_mut().enumerate() {
                let mut wt = exp(_mm256_sub_ps(s[t], reference));
                if masked {
                    wt = _mm256_and_ps(wt, visible[t]);
                }
                total = _mm256_add_ps(total, wt);
                store(w, wt);
            }
            store(&mut l.sum[v], total);
            store(&mut l.max[v], new);
            // The output transposed, eight dimensions at a time in registers.
            let o = &mut l.ot[v * D..(v + 1) * D];
            for c in (0..D).step_by(W) {
                let mut acc = [_mm256_setzero_ps(); W];
                for (j, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_mul_ps(load(&o[c + j]), shrink);
                }
                for (t, w) in weights.iter().enumerate() {
                    let wt = load(w);
                    for (j, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm256_fmadd_ps(_mm256_set1_ps(v_rows[t][c + j]), wt, *acc);
                    }
                }
                for (j, acc) in acc.iter().enumerate() {
                    store(&mut o[c + j], *acc);
                }
            }
        }
    }
    l.into_partial()
}
