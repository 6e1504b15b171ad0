//! `y = x·Wᵀ (+ b)` for more than a few rows of `x` (prefill, batched decode) with f32, f16 or
//! bf16 weights, on AVX2 and FMA or on AVX-512: the products `xwt_avx2.rs` leaves to it past
//! `XWT_AVX2_MAX_ROWS` rows on CPUs without AVX-512, and the 16-bit products of more than
//! `XWT_MAX_ROWS` rows on CPUs with it. Before it, the first went to the backend's matmul, which
//! widened the whole weight to f32 and rounded `x` to the weight's 16-bit type on every call;
//! the second ran dot products (`xwt`'s 4×4 tiles, or `bf16dot`'s `vdpbf16ps`, which on an
//! Intel Xeon (Emerald Rapids) retires half an instruction a cycle where an f32 FMA retires two:
//! 16 bf16 products a cycle against 32 f32 ones).
//!
//! A classic register-tiled GEMM (the BLIS structure): the weight is packed per call, a chunk
//! of inputs at a time, into panels of `NR` outputs laid out input by input (`[KC][NR]` f32,
//! 16 KiB: in L1 while a tile runs), widened from its storage as it is packed (eight rows of
//! eight values widened in registers and transposed). A tile of `MR` rows by one panel keeps
//! `MR · NR` sums in registers; each input step loads the panel's vectors and broadcasts one
//! value of each row, no horizontal reductions. AVX2 (16 registers): `MR` = 6 by 16 outputs,
//! 12 FMAs for 8 loads; AVX-512 (32 registers): `MR` = 12 by 32 outputs, 24 FMAs for 14 loads.
//! Packing reads each weight element once per call, which the product's rows amortise.
//!
//! The output is split into blocks of columns (and, where there are too few, of rows), one rayon
//! task each; a task packs its block's panels for one chunk of inputs, then runs every tile of
//! its rows over them while the rows' chunk of `x` is in L1.
//!
//! `unsafe` (C8: the reason). The `#[target_feature]` functions may only run on a CPU with the
//! features they name: `run` checks them at run time (`Isa::available`) before calling one.
//! Vectors are read and written through arrays of exactly their size (`avx2::load`,
//! `avx2::store`, `load16`, `store16`, `xwt_avx2::widen`). Nothing else here is unsafe.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use rayon::prelude::*;

use super::avx2::{W, load, store};
use super::xwt::{Product, Weight};
use super::xwt_avx2::widen;

/// The instructions a product runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX2, FMA and F16C: 8-lane tiles.
    Avx2,
    /// AVX-512 besides: 16-lane tiles with twice the registers.
    Avx512,
}

impl Isa {
    /// Whether this CPU has the instructions.
    pub fn available(self) -> bool {
        let avx2 = super::xwt_avx2::available();
        match self {
            Isa::Avx2 => avx2,
            Isa::Avx512 => avx2 && is_x86_feature_detected!("avx512f"),
        }
    }
}

/// Panels per task at most: their chunks (256 KiB) stay in L2 while the rows' tiles pass.
const BLOCK_PANELS: usize = 16;

/// A panel's values at one input: its `8 · H` outputs, eight to an array.
type Step<const H: usize> = [[f32; W]; H];

/// A tile: rows of `x` (row r at `x[r · k..]`, this chunk's inputs) times one panel, into
/// columns `cols` of the rows; the sums added to what the columns hold, or written over them on
/// the first chunk (`first`); with `bias` (the last chunk) the bias is added too.
type TileFn<const H: usize> =
    unsafe fn(&[f32], usize, &[Step<H>], &mut [&mut [f32]], Range<usize>, bool, Option<&[f32]>);

/// Runs the product; panics where the CPU lacks `isa`.
///
/// # Shapes
/// returns [m, n] row-major
pub(super) fn run<T: Weight>(p: &Product<'_, T>, isa: Isa) -> Vec<f32> {
    assert!(isa.available(), "the {isa:?} GEMM needs instructions this CPU lacks");
    p.check();
    match isa {
        Isa::Avx2 => product::<T, 2>(p, 6, 256, tile_avx2),
        Isa::Avx512 => product::<T, 4>(p, AVX512_MR, 128, tile_avx512),
    }
}

/// The product with tiles of `mr` rows by panels of `8 · H` outputs over chunks of `kc` inputs.
fn product<T: Weight, const H: usize>(p: &Product<'_, T>, mr: usize, kc: usize, tile: TileFn<H>) -> Vec<f32> {
    let nr = H * W;
    let mut out = vec![0.0f32; p.m * p.n];
    if p.m == 0 || p.n == 0 {
        return out;
    }
    // About four tasks per thread: blocks of whole panels, and the rows split where the panels
    // are too few for that.
    let tasks = (rayon::current_num_threads() * 4).max(1);
    let panels = p.n.div_ceil(nr);
    let block = panels.div_ceil(tasks).clamp(1, BLOCK_PANELS) * nr;
    let row_pieces = tasks.div_ceil(panels.div_ceil(block / nr)).min(p.m.div_ceil(mr));
    let rows_per_task = p.m.div_ceil(row_pieces).next_multiple_of(mr);
    let ranges: Vec<_> = (0..p.n).step_by(block).map(|j| j..(j + block).min(p.n)).collect();
    let mut pieces = super::split_columns(&mut out, p.n, &ranges);
    let work: Vec<(usize, usize, &mut [&mut [f32]])> = pieces
        .iter_mut()
        .zip(&ranges)
        .flat_map(|(rows, cols)| {
            rows.chunks_mut(rows_per_task).enumerate().map(|(c, rows)| (cols.start, c * rows_per_task, rows))
        })
        .collect();
    work.into_par_iter().for_each(|(j0, i0, rows)| block_product(p, j0, i0, rows, mr, kc, tile));
    out
}

/// Outputs `[j0, j0 + rows[i].len())` of rows `i0 + i`.
fn block_product<T: Weight, const H: usize>(
    p: &Product<'_, T>,
    j0: usize,
    i0: usize,
    rows: &mut [&mut [f32]],
    mr: usize,
    kc_max: usize,
    tile: TileFn<H>,
) {
    let nr = H * W;
    let width = rows[0].len();
    let panels = width.div_ceil(nr);
    let mut packed: Vec<Step<H>> = vec![[[0.0f32; W]; H]; panels * kc_max];
    for k0 in (0..p.k).step_by(kc_max) {
        let kc = kc_max.min(p.k - k0);
        for (q, panel) in packed.chunks_exact_mut(kc_max).enumerate() {
            // SAFETY: `run` found AVX2, FMA and F16C on this CPU (every `Isa` has them).
            unsafe { pack(p, j0 + q * nr, (j0 + (q + 1) * nr).min(j0 + width), k0, &mut panel[..kc]) };
        }
        let first = k0 == 0;
        let bias = if k0 + kc == p.k { p.bias } else { None };
        for (t, tile_rows) in rows.chunks_mut(mr).enumerate() {
            let i = i0 + t * mr;
            for (q, panel) in packed.chunks_exact(kc_max).enumerate() {
                let cols = q * nr..((q + 1) * nr).min(width);
                let bias = bias.map(|b| &b[j0 + cols.start..j0 + cols.end]);
                // SAFETY: `run` found the instructions of the `Isa` whose tile this is.
                unsafe { tile(&p.x[i * p.k + k0..], p.k, &panel[..kc], tile_rows, cols, first, bias) };
            }
        }
    }
}

/// Packs weight rows `[j, j_end)` (at most `8 · H`), inputs `[k0, k0 + panel.len())`, into
/// `panel`: `panel[t]` holds the rows' values at input `k0 + t`, zero past `j_end`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack<T: Weight, const H: usize>(p: &Product<'_, T>, j: usize, j_end: usize, k0: usize, panel: &mut [Step<H>]) {
    let kc = panel.len();
    let full = kc / W * W;
    for half in 0..H {
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

/// An AVX2 tile (`TileFn`) of at most 6 rows by a panel of 16 outputs.
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_avx2(
    x: &[f32],
    k: usize,
    panel: &[Step<2>],
    rows: &mut [&mut [f32]],
    cols: Range<usize>,
    first: bool,
    bias: Option<&[f32]>,
) {
    let kc = panel.len();
    // A tile of fewer rows repeats its last row (its sums are not stored): one loop of six
    // zipped streams, which compiles without bounds checks.
    let mut xr: [&[f32]; 6] = [&[]; 6];
    for (r, xr) in xr.iter_mut().enumerate() {
        *xr = &x[r.min(rows.len() - 1) * k..][..kc];
    }
    let mut acc = [[_mm256_setzero_ps(); 2]; 6];
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

/// Rows of an AVX-512 tile: 24 sums, two panel vectors and a broadcast in the 32 registers.
const AVX512_MR: usize = 12;

/// An AVX-512 tile (`TileFn`) of at most `AVX512_MR` rows by a panel of 32 outputs.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn tile_avx512(
    x: &[f32],
    k: usize,
    panel: &[Step<4>],
    rows: &mut [&mut [f32]],
    cols: Range<usize>,
    first: bool,
    bias: Option<&[f32]>,
) {
    let kc = panel.len();
    // A tile of fewer rows repeats its last row (its sums are not stored).
    let mut xr: [&[f32]; AVX512_MR] = [&[]; AVX512_MR];
    for (r, xr) in xr.iter_mut().enumerate() {
        *xr = &x[r.min(rows.len() - 1) * k..][..kc];
    }
    let mut acc = [[_mm512_setzero_ps(); 2]; AVX512_MR];
    for (t, step) in panel.iter().enumerate() {
        let (lo, hi) = halves(step);
        let w = [load16(lo), load16(hi)];
        for (acc, xr) in acc.iter_mut().zip(&xr) {
            let b = _mm512_set1_ps(xr[t]);
            acc[0] = _mm512_fmadd_ps(b, w[0], acc[0]);
            acc[1] = _mm512_fmadd_ps(b, w[1], acc[1]);
        }
    }
    let mut add = [[0.0f32; 16]; 2];
    if let Some(b) = bias {
        add.as_flattened_mut()[..b.len()].copy_from_slice(b);
    }
    let add = [load16(&add[0]), load16(&add[1])];
    for (row, acc) in rows.iter_mut().zip(&acc) {
        let out = &mut row[cols.clone()];
        if let ([a, b], []) = out.as_chunks_mut::<16>() {
            // A whole panel's columns, in place.
            for (h, c) in [a, b].into_iter().enumerate() {
                let before = if first { _mm512_setzero_ps() } else { load16(c) };
                store16(c, _mm512_add_ps(_mm512_add_ps(before, add[h]), acc[h]));
            }
        } else {
            // The last panel's fewer columns, through a copy.
            let mut c = [[0.0f32; 16]; 2];
            if !first {
                c.as_flattened_mut()[..out.len()].copy_from_slice(out);
            }
            for (h, c) in c.iter_mut().enumerate() {
                store16(c, _mm512_add_ps(_mm512_add_ps(load16(c), add[h]), acc[h]));
            }
            out.copy_from_slice(&c.as_flattened()[..out.len()]);
        }
    }
}

/// A 32-output step as its two 16-lane halves.
#[inline(always)]
fn halves(step: &Step<4>) -> (&[f32; 16], &[f32; 16]) {
    let ([lo, hi], []) = step.as_flattened().as_chunks::<16>() else { unreachable!("a step is 32 f32") };
    (lo, hi)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn load16(v: &[f32; 16]) -> __m512 {
    // SAFETY: `v` is 16 f32, read unaligned.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn store16(v: &mut [f32; 16], x: __m512) {
    // SAFETY: `v` is 16 f32, written unaligned.
    unsafe { _mm512_storeu_ps(v.as_mut_ptr(), x) }
}
