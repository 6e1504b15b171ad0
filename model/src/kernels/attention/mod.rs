//! Grouped-query attention of each batch row over only the cache cells it can see, tiled with an
//! online softmax (flash-attention style: no score matrix is ever held), on any CPU: the tiles'
//! arithmetic is written once for AVX-512 (`V4`) and once in plain Rust (`Plain`), which LLVM
//! vectorizes for AVX2 and FMA where the CPU has them (`V3`); there, a whole block of sixteen
//! cells takes the AVX2 code of `avx2.rs`.
//!
//! The Burn path scores every row against every cell up to the cache's extent and masks the
//! rest with −∞: with 16 sequences decoding, each row pays for the other 15 sequences' cells,
//! and a long prompt's scores are a `[rows, extent]` matrix per head. Here:
//! - **Tiles of rows.** Consecutive rows whose visible cells are each a prefix of the next
//!   row's (a prompt's rows in a causal prefill) form a tile: their query heads of one KV head
//!   (up to [`Arith::tile_rows`] rows) walk the last row's cells together, each row masked past
//!   its own prefix. A block of 16 keys and values is widened to f32 once and used by every
//!   query of the tile, so the cache is read once per tile rather than once per row. Rows with
//!   unrelated cells (sequences decoding side by side) are tiles of one row each. On AVX-512 a
//!   tile of sixteen query heads or more runs with its queries along the vector lanes
//!   (`lanes.rs`), on AVX2 one of eight or more (`avx2.rs`); fewer (decoding rows) run query
//!   by query.
//! - **Online softmax.** Per block of 16 cells: the scores, a running maximum and sum, and the
//!   output rescaled when the maximum grows.
//! - **Split over the context.** When the tiles × KV heads are too few to occupy the pool (a
//!   few sequences decoding at depth), each tile's cells are split into chunks run as separate
//!   tasks, whose partial outputs are merged by their maxima and sums.
//!
//! Keys and values are read in the cache's dtype (f32, f16, bf16 or q8_0 blocks, [`Stored`])
//! and widened as loaded.

mod avx2;
mod lanes;

use std::ops::Range;

use pulp::x86::V4;
use pulp::{NullaryFnOnce, Simd, f32x16};
use rayon::prelude::*;

use super::exp::{exp_sub_sum, exp_sub_sum_plain};
use super::kv_q8::{self, Block};
use super::plain::{self, Plain};
use super::xwt::Weight;

const LANES: usize = 16;
/// The fewest cells a chunk of a split context holds.
const MIN_CHUNK: usize = 256;

/// The operands of one layer's attention.
pub struct Attention<'a, T> {
    /// [n, heads, d], rotated.
    pub q: &'a [f32],
    /// [kv_heads, capacity, row] each (`row` = [`Stored::row_len`] of d): the layer's whole
    /// cache; keys rotated.
    pub k: &'a [T],
    pub v: &'a [T],
    /// [n]: the cells each row sees (every row sees at least one).
    pub visible: &'a [Vec<u32>],
    pub heads: usize,
    pub kv_heads: usize,
    pub d: usize,
    pub capacity: usize,
    /// Each scaled score s becomes `cap · tanh(s / cap)` (Gemma 2's soft-capping): the general
    /// path only, query by query.
    pub softcap: Option<f32>,
    /// \[heads\]: each head's sink logit, in its softmax's denominator with no value (gpt-oss's),
    /// added where a row's chunks are merged.
    pub sinks: Option<&'a [f32]>,
}

/// Runs the attention on the widest vectors this CPU has.
///
/// # Shapes
/// returns [n, heads · d] row-major
pub fn run<T: Stored>(a: &Attention<'_, T>) -> Vec<f32> {
    match V4::try_new() {
        Some(simd) => run_on(a, simd),
        None => run_on(a, Plain::new()),
    }
}

/// What a cache holds a cell's row of `d` values in: a value each (f32, f16, bf16), or q8_0
/// blocks of 32.
pub(super) trait Stored: Copy + Send + Sync {
    /// Elements of a row of `d` values.
    fn row_len(d: usize) -> usize;
    /// Whole rows (`row_len(d)` elements each) widened to f32 into `dst` ([rows, d]).
    fn widen_rows<A: Arith>(arith: A, src: &[Self], d: usize, dst: &mut [f32]);
    /// Value `e` of a row.
    #[cfg(test)]
    fn value(row: &[Self], e: usize) -> f32;
}

impl<T: Weight> Stored for T {
    fn row_len(d: usize) -> usize {
        d
    }
    #[inline(always)]
    fn widen_rows<A: Arith>(arith: A, src: &[T], _d: usize, dst: &mut [f32]) {
        arith.widen(src, dst)
    }
    #[cfg(test)]
    fn value(row: &[T], e: usize) -> f32 {
        row[e].to_f32()
    }
}

impl Stored for Block {
    fn row_len(d: usize) -> usize {
        kv_q8::blocks(d)
    }
    #[inline(always)]
    fn widen_rows<A: Arith>(arith: A, src: &[Block], d: usize, dst: &mut [f32]) {
        if d.is_multiple_of(kv_q8::VALUES) {
            arith.widen_q8(src, dst) // the rows' blocks are one run of values
        } else {
            kv_q8::widen_rows(src, d, dst)
        }
    }
    #[cfg(test)]
    fn value(row: &[Block], e: usize) -> f32 {
        let block = &row[e / kv_q8::VALUES];
        kv_q8::scale(block) * kv_q8::bytes(block)[e % kv_q8::VALUES] as f32
    }
}

/// The vector arithmetic of a tile.
pub(super) trait Arith: Copy + Send + Sync {
    /// Most rows in a tile whose KV head has `group` query heads: each block of cells is
    /// widened once per tile.
    fn tile_rows(self, group: usize) -> usize;
    /// The whole task with its queries along the vector lanes, where this arithmetic has such a
    /// path for the tile; `None`: query by query.
    fn lanes<T: Stored>(self, a: &Attention<'_, T>, task: &Task) -> Option<Partial>;
    /// Runs `f` compiled for this arithmetic's instructions.
    fn vectorize<F: NullaryFnOnce>(self, f: F) -> F::Output;
    /// `src` widened to f32 into `dst` (the same length).
    fn widen<T: Weight>(self, src: &[T], dst: &mut [f32]);
    /// q8_0 blocks widened to f32 into `dst` (32 values a block).
    fn widen_q8(self, src: &[Block], dst: &mut [f32]);
    fn dot(self, a: &[f32], b: &[f32]) -> f32;
    /// Replaces each `x` by `e^(x − max)` and returns their sum.
    fn exp_sub_sum(self, xs: &mut [f32], max: f32) -> f32;
    /// One query against a whole block of 16 cells (see [`full_block`]); false where this head
    /// dim has no such path, and the caller takes the general one.
    #[allow(clippy::too_many_arguments)]
    fn full_block(
        self,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scale: f32,
        state: (&mut f32, &mut f32),
        o: &mut [f32],
    ) -> bool;
}

impl Arith for V4 {
    /// Sixteen rows: for the lanes path, a whole number of vectors whatever the group (seven
    /// for Qwen2.5's 7), each block widened once for all of them. On an Emerald Rapids Xeon
    /// (2 cores) the demo model's 16,384-token prefill ran at 155 tok/s, against 74 with
    /// tiles of 16 query heads scored query by query; 4,096 tokens 288 against 193.
    fn tile_rows(self, _group: usize) -> usize {
        LANES
    }
    #[inline(always)]
    fn lanes<T: Stored>(self, a: &Attention<'_, T>, task: &Task) -> Option<Partial> {
        if task.rows.len() * (a.heads / a.kv_heads) < LANES {
            return None;
        }
        lanes::tile(self, a, task)
    }
    #[inline(always)]
    fn vectorize<F: NullaryFnOnce>(self, f: F) -> F::Output {
        Simd::vectorize(self, f)
    }
    #[inline(always)]
    fn widen<T: Weight>(self, src: &[T], dst: &mut [f32]) {
        widen(self, src, dst)
    }
    #[inline(always)]
    fn widen_q8(self, src: &[Block], dst: &mut [f32]) {
        widen_q8(self, src, dst)
    }
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        super::xwt::dot(self, a, b, a.len())
    }
    #[inline(always)]
    fn exp_sub_sum(self, xs: &mut [f32], max: f32) -> f32 {
        exp_sub_sum(self, xs, max)
    }
    #[inline(always)]
    fn full_block(
        self,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scale: f32,
        state: (&mut f32, &mut f32),
        o: &mut [f32],
    ) -> bool {
        match q.len() {
            16 => full_block::<1>(self, q, keys, values, scale, state, o),
            32 => full_block::<2>(self, q, keys, values, scale, state, o),
            64 => full_block::<4>(self, q, keys, values, scale, state, o),
            128 => full_block::<8>(self, q, keys, values, scale, state, o),
            _ => return false,
        }
        true
    }
}

/// Plain Rust (see `plain.rs`) for the general path; where the CPU has AVX2 and FMA, whole
/// blocks take `avx2.rs`.
impl Arith for Plain {
    /// With AVX2, eight rows: the lanes path's vectors of eight queries, whole whatever the
    /// group (on the Emerald Rapids Xeon's AVX2 instructions, the demo model's 4,096-token
    /// prefill ran 248 tok/s against 203 query by query, 512 tokens 413 against 374). Without,
    /// 32 query heads: query by query on AVX2 (Zen 3) a 4,096-token prefill ran 4% faster than
    /// with 16, and no faster with 64.
    fn tile_rows(self, group: usize) -> usize {
        match self.v3() {
            Some(_) => super::avx2::W,
            None => (32 / group).max(1),
        }
    }
    #[inline(always)]
    fn lanes<T: Stored>(self, a: &Attention<'_, T>, task: &Task) -> Option<Partial> {
        let cpu = self.v3()?;
        if task.rows.len() * (a.heads / a.kv_heads) < super::avx2::W {
            return None;
        }
        avx2::lanes(cpu, self, a, task)
    }
    #[inline(always)]
    fn vectorize<F: NullaryFnOnce>(self, f: F) -> F::Output {
        Plain::vectorize(self, f)
    }
    #[inline(always)]
    fn widen<T: Weight>(self, src: &[T], dst: &mut [f32]) {
        T::widen_slice(src, dst)
    }
    #[inline(always)]
    fn widen_q8(self, src: &[Block], dst: &mut [f32]) {
        kv_q8::widen_rows(src, kv_q8::VALUES, dst)
    }
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        plain::dot(a, b)
    }
    #[inline(always)]
    fn exp_sub_sum(self, xs: &mut [f32], max: f32) -> f32 {
        exp_sub_sum_plain(xs, max)
    }
    #[inline(always)]
    fn full_block(
        self,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scale: f32,
        state: (&mut f32, &mut f32),
        o: &mut [f32],
    ) -> bool {
        match self.v3() {
            Some(cpu) => avx2::full_block(cpu, q, keys, values, scale, state, o),
            None => false,
        }
    }
}

fn run_on<T: Stored, A: Arith>(a: &Attention<'_, T>, arith: A) -> Vec<f32> {
    let n = a.visible.len();
    assert!(a.kv_heads > 0 && a.heads.is_multiple_of(a.kv_heads), "attention: heads must be a multiple of kv heads");
    assert!(a.q.len() == n * a.heads * a.d, "attention: q does not match its shape");
    let row = T::row_len(a.d);
    assert!(a.k.len() == a.kv_heads * a.capacity * row && a.v.len() == a.k.len(), "attention: k, v do not match");
    assert!(
        a.visible.iter().flatten().all(|&c| (c as usize) < a.capacity),
        "attention: a visible cell lies outside the cache"
    );
    assert!(a.visible.iter().all(|cells| !cells.is_empty()), "attention: a row sees no cell");
    assert!(a.sinks.is_none_or(|s| s.len() == a.heads), "attention: one sink per head");
    let group = a.heads / a.kv_heads;
    let mut out = vec![0.0f32; n * a.heads * a.d];
    if out.is_empty() {
        return out;
    }
    let tiles = tiles(a.visible, arith.tile_rows(group));
    let longest = tiles.iter().map(|t| a.visible[t.end - 1].len()).max().unwrap_or(0);
    let units = tiles.len() * a.kv_heads;
    let threads = rayon::current_num_threads();
    let chunks = if units < 2 * threads { (2 * threads).div_ceil(units).min(longest / MIN_CHUNK).max(1) } else { 1 };
    let tasks: Vec<Task> = tiles
        .iter()
        .flat_map(|rows| {
            let cells = a.visible[rows.end - 1].len();
            let step = cells.div_ceil(chunks).next_multiple_of(LANES);
            (0..a.kv_heads).flat_map(move |kv_head| {
                (0..cells).step_by(step).map(move |c0| Task {
                    rows: rows.clone(),
                    kv_head,
                    cells: c0..(c0 + step).min(cells),
                })
            })
        })
        .collect();
    let partials: Vec<Partial> = tasks.par_iter().map(|task| arith.vectorize(TileHead { arith, a, task })).collect();
    // Merge each (tile, KV head)'s chunks into the output rows.
    let d = a.d;
    let mut at = 0;
    while at < tasks.len() {
        let (rows, kv_head) = (tasks[at].rows.clone(), tasks[at].kv_head);
        let end = at + tasks[at..].iter().take_while(|t| t.rows == rows && t.kv_head == kv_head).count();
        let parts = &partials[at..end];
        for (r, row) in rows.clone().enumerate() {
            for j in 0..group {
                let qi = r * group + j;
                let max = parts.iter().map(|p| p.max[qi]).fold(f32::NEG_INFINITY, f32::max);
                let o = &mut out[(row * a.heads + kv_head * group + j) * d..][..d];
                let mut sum = 0.0;
                for p in parts.iter().filter(|p| p.max[qi] > f32::NEG_INFINITY) {
                    let w = (p.max[qi] - max).exp();
                    sum += w * p.sum[qi];
                    for (o, x) in o.iter_mut().zip(&p.out[qi * d..(qi + 1) * d]) {
                        *o += w * x;
                    }
                }
                // A sink's weight relative to the row's maximum: an overflow to ∞ (a sink far
                // above every score) leaves the row 0, its limit.
                if let Some(sinks) = a.sinks {
                    sum += (sinks[kv_head * group + j] - max).exp();
                }
                o.iter_mut().for_each(|o| *o /= sum);
            }
        }
        at = end;
    }
    out
}

/// Consecutive rows, each row's cells a prefix of the next row's, at most `most` rows.
fn tiles(visible: &[Vec<u32>], most: usize) -> Vec<Range<usize>> {
    let mut tiles = Vec::new();
    let mut start = 0;
    for row in 1..=visible.len() {
        let extends = row < visible.len() && row - start < most && {
            let (prev, next) = (&visible[row - 1], &visible[row]);
            next.len() >= prev.len() && next[..prev.len()] == prev[..]
        };
        if !extends {
            tiles.push(start..row);
            start = row;
        }
    }
    tiles
}

/// One tile's query heads of one KV head over a chunk of the tile's cells (the positions in
/// the last row's list).
pub(super) struct Task {
    rows: Range<usize>,
    kv_head: usize,
    cells: Range<usize>,
}

/// The unnormalised result of a task per query head: `out = Σ e^(s − max) · v`, `sum = Σ
/// e^(s − max)`; `max` is −∞ for a query that saw no cell of the chunk.
pub(super) struct Partial {
    /// [queries, d]
    out: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
}

/// A task as a callable that `vectorize` inlines into its function compiled for the vector
/// instructions.
struct TileHead<'a, 't, T, A> {
    arith: A,
    a: &'a Attention<'a, T>,
    task: &'t Task,
}

impl<T: Stored, A: Arith> pulp::NullaryFnOnce for TileHead<'_, '_, T, A> {
    type Output = Partial;

    #[inline(always)]
    fn call(self) -> Partial {
        let TileHead { arith, a, task } = self;
        if a.softcap.is_none()
            && let Some(p) = arith.lanes(a, task)
        {
            return p;
        }
        let (d, group) = (a.d, a.heads / a.kv_heads);
        let queries = task.rows.len() * group;
        let cells = &a.visible[task.rows.end - 1];
        // Row r of the tile sees positions [0, seen[r]) of `cells`.
        let seen: Vec<usize> = task.rows.clone().map(|row| a.visible[row].len()).collect();
        let scale = 1.0 / (d as f32).sqrt();
        let q = |qi: usize| {
            let (r, j) = (qi / group, qi % group);
            &a.q[((task.rows.start + r) * a.heads + a.kv_head_first(task.kv_head) + j) * d..][..d]
        };
        let mut p =
            Partial { out: vec![0.0; queries * d], max: vec![f32::NEG_INFINITY; queries], sum: vec![0.0; queries] };
        // A block of keys and values widened to f32: [LANES, d] each.
        let (mut keys, mut values) = (vec![0.0f32; LANES * d], vec![0.0f32; LANES * d]);
        let mut scores = [0.0f32; LANES];
        for b0 in task.cells.clone().step_by(LANES) {
            let width = LANES.min(task.cells.end - b0);
            load_block(arith, a, task.kv_head, &cells[b0..b0 + width], &mut keys, &mut values);
            for qi in 0..queries {
                // The cells of this block the query's row sees.
                let valid = seen[qi / group].saturating_sub(b0).min(width);
                if valid == 0 {
                    continue;
                }
                let q = q(qi);
                let o = &mut p.out[qi * d..(qi + 1) * d];
                let state = (&mut p.max[qi], &mut p.sum[qi]);
                let full = valid == LANES && a.softcap.is_none();
                if full && arith.full_block(q, &keys, &values, scale, (&mut *state.0, &mut *state.1), o) {
                    continue;
                }
                let s = &mut scores[..valid];
                for (t, s) in s.iter_mut().enumerate() {
                    *s = arith.dot(q, &keys[t * d..(t + 1) * d]) * scale;
                }
                if let Some(cap) = a.softcap {
                    s.iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
                }
                let (max, sum) = state;
                let new_max = s.iter().copied().fold(*max, f32::max);
                // Rescale what came before when the maximum grows (e^−∞ = 0 the first time).
                if new_max > *max {
                    let shrink = (*max - new_max).exp();
                    *sum *= shrink;
                    o.iter_mut().for_each(|o| *o *= shrink);
                    *max = new_max;
                }
                *sum += arith.exp_sub_sum(s, new_max);
                for (t, &w) in s.iter().enumerate() {
                    for (o, v) in o.iter_mut().zip(&values[t * d..(t + 1) * d]) {
                        *o += w * v;
                    }
                }
            }
        }
        p
    }
}

/// The keys and values of `block`'s cells (of KV head `kv_head`) widened to f32 into the first
/// rows of `keys` and `values` ([LANES, d] each); the rows past them are zeroed (the lanes
/// paths read a whole block, masked, and must add nothing but 0 from there).
#[inline(always)]
fn load_block<T: Stored, A: Arith>(
    arith: A,
    a: &Attention<'_, T>,
    kv_head: usize,
    block: &[u32],
    keys: &mut [f32],
    values: &mut [f32],
) {
    let (d, row) = (a.d, T::row_len(a.d));
    let cache = |c: u32| (kv_head * a.capacity + c as usize) * row;
    // A run of consecutive cells (a sequence's own cells mostly are) lies in one piece of the
    // cache: one call each for its keys and values, not one per cell.
    let mut t = 0;
    while t < block.len() {
        let run = 1 + block[t..].windows(2).take_while(|p| p[1] == p[0] + 1).count();
        let (from, to) = (cache(block[t]), t * d..(t + run) * d);
        T::widen_rows(arith, &a.k[from..][..run * row], d, &mut keys[to.clone()]);
        T::widen_rows(arith, &a.v[from..][..run * row], d, &mut values[to]);
        t += run;
    }
    keys[block.len() * d..].fill(0.0);
    values[block.len() * d..].fill(0.0);
}

impl<T> Attention<'_, T> {
    /// The first query head that reads KV head `g`.
    fn kv_head_first(&self, g: usize) -> usize {
        g * (self.heads / self.kv_heads)
    }
}

/// q8_0 blocks widened to f32 into `dst` (32 values a block): sixteen bytes sign-extended to
/// 32 bits, converted and scaled at a time.
#[inline(always)]
fn widen_q8(simd: V4, src: &[Block], dst: &mut [f32]) {
    use std::arch::x86_64::__m128i;
    let f = simd.avx512f;
    for (block, dst) in src.iter().zip(dst.chunks_exact_mut(kv_q8::VALUES)) {
        let scale = f._mm512_set1_ps(kv_q8::scale(block));
        let q: [__m128i; 2] = pulp::cast(kv_q8::bytes(block));
        let dst = pulp::as_arrays_mut::<LANES, f32>(dst).0;
        for (dst, q) in dst.iter_mut().zip(q) {
            *dst = pulp::cast(f._mm512_mul_ps(scale, f._mm512_cvtepi32_ps(f._mm512_cvtepi8_epi32(q))));
        }
    }
}

/// `src` widened to f32 into `dst` (the same length).
#[inline(always)]
fn widen<T: Weight>(simd: V4, src: &[T], dst: &mut [f32]) {
    let (sv, st) = pulp::as_arrays::<LANES, T>(src);
    let (dv, dt) = pulp::as_arrays_mut::<LANES, f32>(dst);
    for (d, s) in dv.iter_mut().zip(sv) {
        *d = pulp::cast(T::load(simd, s));
    }
    for (d, s) in dt.iter_mut().zip(st) {
        *d = s.to_f32();
    }
}

/// One query against a whole block of sixteen cells with the head dim `CH` vectors long: the
/// scores, the running maximum and sum (`state`), and the output, which stays in registers
/// while the sixteen weighted values are added.
#[inline(always)]
fn full_block<const CH: usize>(
    simd: V4,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    (max, sum): (&mut f32, &mut f32),
    o: &mut [f32],
) {
    let d = CH * LANES;
    let scores = scores_of_16::<CH>(simd, q, keys, scale);
    let new_max = max.max(simd.reduce_max_f32s(scores));
    let (ov, _) = pulp::as_arrays_mut::<LANES, f32>(o);
    let mut acc: [f32x16; CH] = std::array::from_fn(|c| pulp::cast(ov[c]));
    // Rescale what came before when the maximum grows (e^−∞ = 0 the first time).
    if new_max > *max {
        let shrink = (*max - new_max).exp();
        *sum *= shrink;
        let shrink = simd.splat_f32s(shrink);
        acc.iter_mut().for_each(|a| *a = simd.mul_f32s(*a, shrink));
        *max = new_max;
    }
    let weights = super::exp::exp(simd, simd.sub_f32s(scores, simd.splat_f32s(new_max)));
    *sum += simd.reduce_sum_f32s(weights);
    let weights: [f32; LANES] = pulp::cast(weights);
    // Even and odd cells into separate accumulators: twice the independent FMA chains.
    let mut odd = [simd.splat_f32s(0.0); CH];
    let values = pulp::as_arrays::<LANES, f32>(&values[..LANES * d]).0;
    for t in (0..LANES).step_by(2) {
        let (w0, w1) = (simd.splat_f32s(weights[t]), simd.splat_f32s(weights[t + 1]));
        let (v0, v1) = (&values[t * CH..(t + 1) * CH], &values[(t + 1) * CH..(t + 2) * CH]);
        for c in 0..CH {
            acc[c] = simd.mul_add_f32s(w0, pulp::cast(v0[c]), acc[c]);
            odd[c] = simd.mul_add_f32s(w1, pulp::cast(v1[c]), odd[c]);
        }
    }
    for c in 0..CH {
        ov[c] = pulp::cast(simd.add_f32s(acc[c], odd[c]));
    }
}

/// `q · keys[t] · scale` for sixteen keys (`keys`: [16, d] with the head dim d `CH` vectors
/// long): the query stays in registers, each key takes `CH` FMAs into its own accumulator, and
/// the sixteen sums come out of one transposing reduction (45 instructions, against 8 per single
/// dot product's).
#[inline(always)]
fn scores_of_16<const CH: usize>(simd: V4, q: &[f32], keys: &[f32], scale: f32) -> f32x16 {
    let mut qv = [simd.splat_f32s(0.0); CH];
    for (qv, q) in qv.iter_mut().zip(pulp::as_arrays::<LANES, f32>(q).0) {
        *qv = pulp::cast(*q);
    }
    let mut acc = [simd.splat_f32s(0.0); LANES];
    let keys = pulp::as_arrays::<LANES, f32>(&keys[..LANES * CH * LANES]).0;
    for (acc, key) in acc.iter_mut().zip(keys.chunks_exact(CH)) {
        for c in 0..CH {
            *acc = simd.mul_add_f32s(qv[c], pulp::cast(key[c]), *acc);
        }
    }
    simd.mul_f32s(reduce_16(simd, acc), simd.splat_f32s(scale))
}

/// Lane t of the result is the sum of the lanes of `v[t]`.
#[inline(always)]
fn reduce_16(simd: V4, v: [f32x16; LANES]) -> f32x16 {
    use std::arch::x86_64::{__m512, __m512d};
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
    use half::{bf16, f16};

    use super::*;
    use crate::kernels::test_values as values;

    /// Softmax-weighted values in f64, computed over the visible cells.
    fn reference<T: Stored>(a: &Attention<'_, T>) -> Vec<f64> {
        let (d, group, row) = (a.d, a.heads / a.kv_heads, T::row_len(a.d));
        let mut out = Vec::new();
        for (t, cells) in a.visible.iter().enumerate() {
            for h in 0..a.heads {
                let g = h / group;
                let q = &a.q[(t * a.heads + h) * d..][..d];
                let at = |c: u32| (g * a.capacity + c as usize) * row;
                let scores: Vec<f64> = cells
                    .iter()
                    .map(|&c| {
                        let k = &a.k[at(c)..][..row];
                        q.iter().enumerate().map(|(e, x)| *x as f64 * T::value(k, e) as f64).sum::<f64>()
                    })
                    .map(|s| s / (d as f64).sqrt())
                    .map(|s| a.softcap.map_or(s, |cap| cap as f64 * (s / cap as f64).tanh()))
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sink = a.sinks.map_or(0.0, |s| (s[h] as f64 - max).exp());
                let sum: f64 = weights.iter().sum::<f64>() + sink;
                for e in 0..d {
                    let v = |c: u32| T::value(&a.v[at(c)..][..row], e) as f64;
                    out.push(cells.iter().zip(&weights).map(|(&c, w)| w / sum * v(c)).sum());
                }
            }
        }
        out
    }

    /// Every arithmetic this CPU runs (AVX-512, plain Rust compiled for it, plain Rust on the
    /// baseline) against the reference.
    fn check<T: Stored>(a: &Attention<'_, T>, what: &str) {
        let want = reference(a);
        let mut runs = vec![("plain", run_on(a, Plain::baseline())), ("plain for this CPU", run_on(a, Plain::new()))];
        if let Some(v4) = V4::try_new() {
            runs.push(("AVX-512", run_on(a, v4)));
        }
        for (arith, got) in runs {
            assert_eq!(got.len(), want.len());
            let err = got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
            assert!(err < 1e-5, "{what}, {arith}: max error {err}");
        }
    }

    /// Rows that see different, interleaved sets of cells (as sequences decoding side by side
    /// do), head dims with and without a tail past 16 lanes (and past a q8_0 block; Gemma's 256),
    /// groups of 1, 2, 4 and 7 query heads, and rows seeing 16 or more cells (scored sixteen at a
    /// time, with a tail), in each dtype.
    #[test]
    fn attention_over_visible_cells_equals_the_reference() {
        #[cfg(cpu_avx512)]
        assert!(V4::try_new().is_some(), "the build saw the instructions this kernel needs; the run does not");
        #[cfg(cpu_avx2)]
        assert!(Plain::new().v3().is_some(), "the build saw AVX2 and FMA; the run does not (no AVX2 block)");
        for (heads, kv_heads, d) in
            [(14, 2, 64), (4, 4, 8), (6, 2, 20), (2, 2, 16), (4, 2, 32), (2, 1, 128), (4, 1, 256)]
        {
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
            let what = format!("heads {heads}, kv heads {kv_heads}, d {d}");
            check(
                &Attention {
                    q: &q,
                    k: &k,
                    v: &v,
                    visible: &visible,
                    heads,
                    kv_heads,
                    d,
                    capacity,
                    softcap: None,
                    sinks: None,
                },
                &what,
            );
            // Soft-capped scores (Gemma 2's), at a cap the scores reach.
            let softcap = Some(0.5);
            check(
                &Attention {
                    q: &q,
                    k: &k,
                    v: &v,
                    visible: &visible,
                    heads,
                    kv_heads,
                    d,
                    capacity,
                    softcap,
                    sinks: None,
                },
                &what,
            );
            // Sinks below, around and above the scores (a head that attends to almost nothing).
            let sinks: Vec<f32> = (0..heads).map(|h| [-4.0, 0.0, 1.5, 30.0][h % 4]).collect();
            let sinks = Some(sinks.as_slice());
            check(
                &Attention {
                    q: &q,
                    k: &k,
                    v: &v,
                    visible: &visible,
                    heads,
                    kv_heads,
                    d,
                    capacity,
                    softcap: None,
                    sinks,
                },
                &what,
            );
            let (k16, v16): (Vec<f16>, Vec<f16>) =
                (k.iter().map(|&x| f16::from_f32(x)).collect(), v.iter().map(|&x| f16::from_f32(x)).collect());
            check(
                &Attention {
                    q: &q,
                    k: &k16,
                    v: &v16,
                    visible: &visible,
                    heads,
                    kv_heads,
                    d,
                    capacity,
                    softcap: None,
                    sinks: None,
                },
                &format!("{what}, f16"),
            );
            let (kb, vb): (Vec<bf16>, Vec<bf16>) =
                (k.iter().map(|&x| bf16::from_f32(x)).collect(), v.iter().map(|&x| bf16::from_f32(x)).collect());
            check(
                &Attention {
                    q: &q,
                    k: &kb,
                    v: &vb,
                    visible: &visible,
                    heads,
                    kv_heads,
                    d,
                    capacity,
                    softcap: None,
                    sinks: None,
                },
                &format!("{what}, bf16"),
            );
            let (kq, vq) = (kv_q8::quantize_rows(&k, d), kv_q8::quantize_rows(&v, d));
            let (k, v) = (kv_q8::as_blocks(&kq), kv_q8::as_blocks(&vq));
            check(
                &Attention { q: &q, k, v, visible: &visible, heads, kv_heads, d, capacity, softcap: None, sinks: None },
                &format!("{what}, q8_0"),
            );
        }
    }

    /// A causal prefill after a cached prefix (rows tiled together), its cells out of order and
    /// shared with another sequence's rows, long enough for several blocks and, with one row, for
    /// the context to be split into chunks; GQA ratios 1, 2 and 7; head dims 32, 64, 80 and 128
    /// (on AVX-512, 80 has no lanes path).
    #[test]
    fn tiled_and_split_attention_equals_the_reference() {
        let capacity = 1200;
        // A shared prefix of 700 cells, scattered: odd cells descending, then even ones.
        let prefix: Vec<u32> = (0..700u32).map(|i| if i < 350 { 699 - 2 * i } else { 2 * (i - 350) }).collect();
        for (heads, kv_heads, d) in [(4, 4, 64), (4, 2, 128), (14, 2, 64), (8, 4, 32), (6, 2, 80)] {
            // Sequence A: 37 prompt rows after the prefix (cells 700..); sequence B: one row
            // decoding after the prefix and 400 cells of its own; then A's prompt again (a
            // second tile run), and B alone (split over the context).
            let mut visible = Vec::new();
            for t in 0..37u32 {
                visible.push(prefix.iter().copied().chain(700..701 + t).collect::<Vec<u32>>());
            }
            let b: Vec<u32> = prefix.iter().copied().chain(750..1150).collect();
            visible.push(b.clone());
            for t in 0..3u32 {
                visible.push(prefix.iter().copied().chain(700..701 + t).collect());
            }
            let q = values(visible.len() * heads * d, 5);
            let k = values(kv_heads * capacity * d, 6);
            let v = values(kv_heads * capacity * d, 7);
            let what = format!("heads {heads}, kv heads {kv_heads}, d {d}");
            check(
                &Attention {
                    q: &q,
                    k: &k,
                    v: &v,
                    visible: &visible,
                    heads,
                    kv_heads,
                    d,
                    capacity,
                    softcap: None,
                    sinks: None,
                },
                &what,
            );
            let one = [b];
            let q1 = &q[..heads * d];
            check(
                &Attention {
                    q: q1,
                    k: &k,
                    v: &v,
                    visible: &one,
                    heads,
                    kv_heads,
                    d,
                    capacity,
                    softcap: None,
                    sinks: None,
                },
                &format!("{what}, alone"),
            );
            // Sinks where a split row's chunks are merged, and where tiles' rows are.
            let sinks: Vec<f32> = (0..heads).map(|h| h as f32 * 0.5 - 1.0).collect();
            let sinks = Some(sinks.as_slice());
            check(
                &Attention { q: q1, k: &k, v: &v, visible: &one, heads, kv_heads, d, capacity, softcap: None, sinks },
                &format!("{what}, alone, sinks"),
            );
            check(
                &Attention {
                    q: &q,
                    k: &k,
                    v: &v,
                    visible: &visible,
                    heads,
                    kv_heads,
                    d,
                    capacity,
                    softcap: None,
                    sinks,
                },
                &format!("{what}, sinks"),
            );
            let (kq, vq) = (kv_q8::quantize_rows(&k, d), kv_q8::quantize_rows(&v, d));
            let (k, v) = (kv_q8::as_blocks(&kq), kv_q8::as_blocks(&vq));
            check(
                &Attention { q: &q, k, v, visible: &visible, heads, kv_heads, d, capacity, softcap: None, sinks: None },
                &format!("{what}, q8_0"),
            );
            check(
                &Attention { q: q1, k, v, visible: &one, heads, kv_heads, d, capacity, softcap: None, sinks: None },
                &format!("{what}, q8_0 alone"),
            );
            check(
                &Attention { q: q1, k, v, visible: &one, heads, kv_heads, d, capacity, softcap: None, sinks },
                &format!("{what}, q8_0 alone, sinks"),
            );
        }
    }

    #[test]
    fn rows_whose_cells_extend_the_last_rows_share_a_tile() {
        let visible = vec![vec![3, 4], vec![3, 4, 5], vec![3, 4, 5, 6], vec![1], vec![1, 2], vec![9], vec![9]];
        assert_eq!(tiles(&visible, 8), vec![0..3, 3..5, 5..7]);
        assert_eq!(tiles(&visible, 2), vec![0..2, 2..3, 3..5, 5..7]);
        assert_eq!(tiles(&[vec![1, 2], vec![2, 3]], 8), vec![0..1, 1..2]);
    }
}
