//! `y = x·Wᵀ (+ b)` for more than a few rows of `x` (prefill, batched decode) with f32, f16 or
//! bf16 weights, on AVX2 and FMA: the products `xwt_avx2.rs` leaves to it past
//! `XWT_AVX2_MAX_ROWS` rows. Before it, those past 64 rows went to the backend's matmul, which
//! widened the whole weight to f32 and rounded `x` to the weight's 16-bit type on every call,
//! and those of 9 to 64 rows to `xwt_avx2.rs`, which reads each weight vector once per row.
//!
//! A classic register-tiled GEMM (the BLIS structure): the weight is packed per call, a chunk
//! of `KC` inputs at a time, into panels of `NR` = 16 outputs laid out input by input (`[KC][16]`
//! f32, 16 KiB: in L1 while a tile runs), widened from its storage as it is packed (eight rows of
//! eight values widened in registers and transposed). A tile of `MR` = 6 rows by one panel keeps
//! 12 accumulators in registers; each input step loads the panel's two vectors and broadcasts
//! one value of each row: 12 FMAs for 8 loads, no horizontal reductions. Packing reads each
//! weight element once per call, which the product's rows (more than `XWT_AVX2_MAX_ROWS`)
//! amortise.
//!
//! The output is split into blocks of columns (and, where there are too few, of rows), one rayon
//! task each; a task packs its block's panels for one chunk of inputs, then runs every six-row
//! tile of its rows over them while the rows' chunk of `x` is in L1.
//!
//! `unsafe` (C8: the reason). The `#[target_feature]` functions may only run on a CPU with AVX2,
//! FMA and F16C: `run` checks them at run time before calling one. Vectors are read and written
//! through arrays of exactly their size (`avx2::load`, `avx2::store`, `xwt_avx2::widen`). Nothing
//! else here is unsafe.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::avx2::{W, load, store};
use super::xwt::{Product, Weight};
use super::xwt_avx2::{available, widen};

/// Rows of `x` per tile.
const MR: usize = 6;
/// Outputs per panel: two vectors.
const NR: usize = 2 * W;
/// Inputs per packed chunk: a panel's chunk is `KC · NR` f32, 16 KiB.
const KC: usize = 256;

/// Panels per task at most: their chunks (256 KiB) stay in L2 while the rows' tiles pass.
const BLOCK_PANELS: usize = 16;

/// A panel's values at one input: its 16 outputs as two vectors.
type Step = [[f32; W]; 2];

/// Runs the product; panics where the CPU lacks AVX2, FMA or F16C.
///
/// # Shapes
/// returns [m, n] row-major
pub(super) fn run<T: Weight>(p: &Product<'_, T>) -> Vec<f32> {
    assert!(available(), "the AVX2 GEMM needs AVX2, FMA and F16C");
    p.check();
    let mut out = vec![0.0f32; p.m * p.n];
    if p.m == 0 || p.n == 0 {
        return out;
    }
    // About four tasks per thread: blocks of whole panels, and the rows split where the panels
    // are too few for that.
    let tasks = (rayon::current_num_threads() * 4).max(1);
    let panels = p.n.div_ceil(NR);
    let block = panels.div_ceil(tasks).clamp(1, BLOCK_PANELS) * NR;
    let row_pieces = tasks.div_ceil(panels.div_ceil(block / NR)).min(p.m.div_ceil(MR));
    let rows_per_task = p.m.div_ceil(row_pieces).next_multiple_of(MR);
    let ranges: Vec<_> = (0..p.n).step_by(block).map(|j| j..(j + block).min(p.n)).collect();
    let mut pieces = super::split_columns(&mut out, p.n, &ranges);
    let work: Vec<(usize, usize, &mut [&mut [f32]])> = pieces
        .iter_mut()
        .zip(&ranges)
        .flat_map(|(rows, cols)| {
            rows.chunks_mut(rows_per_task).enumerate().map(|(c, rows)| (cols.start, c * rows_per_task, rows))
        })
        .collect();
    work.into_par_iter().for_each(|(j0, i0, rows)| {
        // SAFETY: `available()` found AVX2, FMA and F16C on this CPU.
        unsafe { block_avx2(p, j0, i0, rows) }
    });
    out
}

/// Outputs `[j0, j0 + rows[i].len())` of rows `i0 + i`.
#[target_feature(enable = "avx2,fma,f16c")]
fn block_avx2<T: Weight>(p: &Product<'_, T>, j0: usize, i0: usize, rows: &mut [&mut [f32]]) {
    let width = rows[0].len();
    let panels = width.div_ceil(NR);
    let mut packed = vec![[[0.0f32; W]; 2]; panels * KC];
    for k0 in (0..p.k).step_by(KC) {
        let kc = KC.min(p.k - k0);
        for (q, panel) in packed.chunks_exact_mut(KC).enumerate() {
            pack(p, j0 + q * NR, (j0 + (q + 1) * NR).min(j0 + width), k0, &mut panel[..kc]);
        }
        let first = k0 == 0;
        let bias = if k0 + kc == p.k { p.bias } else { None };
        for (t, tile_rows) in rows.chunks_mut(MR).enumerate() {
            let i = i0 + t * MR;
            for (q, panel) in packed.chunks_exact(KC).enumerate() {
                let cols = q * NR..((q + 1) * NR).min(width);
                let bias = bias.map(|b| &b[j0 + cols.start..j0 + cols.end]);
                let panel = &panel[..kc];
                tile(&p.x[i * p.k + k0..], p.k, panel, tile_rows, cols, first, bias);
            }
        }
    }
}

/// Packs weight rows `[j, j_end)` (at most `NR`), inputs `[k0, k0 + panel.len())`, into
/// `panel`: `panel[t]` holds the rows' values at input `k0 + t`, zero past `j_end`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack<T: Weight>(p: &Product<'_, T>, j: usize, j_end: usize, k0: usize, panel: &mut [Step]) {
    let kc = panel.len();
    let full = kc / W * W;
    for half in 0..2 {
        let r0 = j + half * W;
        if r0 + W <= j_end {
            // Eight rows of eight inputs at a time, widened and transposed in registers.
            let mut rows: [&[T]; W] = [&[]; W];
            for (r, row) in rows.iter_mut().enumerate() {
                *row = &p.w[(r0 + r) * p.k + k0..][..kc];
            }
            for t in (0..full).step_by(W) {
                // No `array::from_fn` closures: they compiled to functions of their own, as the
                // tile's did (1.2% of prefill there).
                let mut v = [_mm256_setzero_ps(); W];
                for (v, row) in v.iter_mut().zip(&rows) {
                    *v = widen::<T>(row[t..t + W].try_into().expect("eight inputs"));
                }
                for (s, c) in transpose(v).into_iter().enumerate() {
                    store(&mut panel[t + s][half], c);
                }
            }
            for t in full..kc {
                for (r, row) in rows.iter().enumerate() {
                    panel[t][half][r] = row[t].to_f32();
                }
            }
        } else {
            for r in 0..W {
                let row = (r0 + r < j_end).then(|| &p.w[(r0 + r) * p.k + k0..][..kc]);
                for (t, step) in panel.iter_mut().enumerate() {
                    step[half][r] = row.map_or(0.0, |row| row[t].to_f32());
                }
            }
        }
    }
}

/// The 8×8 transpose of eight vectors: lane `r` of result `c` is lane `c` of `v[r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose(v: [__m256; W]) -> [__m256; W] {
    let t0 = _mm256_unpacklo_ps(v[0], v[1]);
    let t1 = _mm256_unpackhi_ps(v[0], v[1]);
    let t2 = _mm256_unpacklo_ps(v[2], v[3]);
    let t3 = _mm256_unpackhi_ps(v[2], v[3]);
    let t4 = _mm256_unpacklo_ps(v[4], v[5]);
    let t5 = _mm256_unpackhi_ps(v[4], v[5]);
    let t6 = _mm256_unpacklo_ps(v[6], v[7]);
    let t7 = _mm256_unpackhi_ps(v[6], v[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// `rows.len()` (at most `MR`) rows of `x` (row r at `x[r · k..]`, this chunk's inputs) times
/// one panel, into columns `cols` of `rows`: added to what they hold, or over them on the first
/// chunk; with `bias` (the last chunk) the bias is added too.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile(
    x: &[f32],
    k: usize,
    panel: &[Step],
    rows: &mut [&mut [f32]],
    cols: std::ops::Range<usize>,
    first: bool,
    bias: Option<&[f32]>,
) {
    let kc = panel.len();
    // A tile of fewer rows repeats its last row (its sums are not stored): one loop of six
    // zipped streams, which compiles without bounds checks.
    let mut xr: [&[f32]; MR] = [&[]; MR];
    for (r, xr) in xr.iter_mut().enumerate() {
        *xr = &x[r.min(rows.len() - 1) * k..][..kc];
    }
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    let steps = panel.iter().zip(xr[0]).zip(xr[1]).zip(xr[2]).zip(xr[3]).zip(xr[4]).zip(xr[5]);
    for ((((((step, &x0), &x1), &x2), &x3), &x4), &x5) in steps {
        let w = [load(&step[0]), load(&step[1])];
        for (acc, x) in acc.iter_mut().zip([x0, x1, x2, x3, x4, x5]) {
            let b = _mm256_set1_ps(x);
            acc[0] = _mm256_fmadd_ps(b, w[0], acc[0]);
            acc[1] = _mm256_fmadd_ps(b, w[1], acc[1]);
        }
    }
    let add = match bias {
        None => [_mm256_setzero_ps(); 2],
        Some(b) => match b.as_chunks::<W>() {
            ([lo, hi], []) => [load(lo), load(hi)],
            _ => {
                let mut add = [[0.0f32; W]; 2];
                add.as_flattened_mut()[..b.len()].copy_from_slice(b);
                [load(&add[0]), load(&add[1])]
            }
        },
    };
    for (row, acc) in rows.iter_mut().zip(&acc) {
        let out = &mut row[cols.clone()];
        if let [a, b] = out.as_chunks_mut::<W>().0 {
            // A whole panel's columns, in place.
            for (h, c) in [a, b].into_iter().enumerate() {
                let before = if first { _mm256_setzero_ps() } else { load(c) };
                store(c, _mm256_add_ps(_mm256_add_ps(before, add[h]), acc[h]));
            }
        } else {
            // The last panel's fewer columns, through a copy.
            let mut c = [[0.0f32; W]; 2];
            if !first {
                c.as_flattened_mut()[..out.len()].copy_from_slice(out);
            }
            for (h, c) in c.iter_mut().enumerate() {
                let sum = _mm256_add_ps(_mm256_add_ps(load(c), add[h]), acc[h]);
                store(c, sum);
            }
            out.copy_from_slice(&c.as_flattened()[..out.len()]);
        }
    }
}
