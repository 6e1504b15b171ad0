//! x·Wᵀ over the packed layout with AVX2, for CPUs without AVX-512 VNNI (Zen 2 and 3, Intel
//! client cores, older Xeons). The layout's 64-byte vector holds 4 values of each of 16 rows;
//! its two 32-byte halves (rows 0-7 and 8-15) are one AVX2 vector each. With no `vpdpbusd`,
//! `vpmaddubsw` multiplies the weight bytes (unsigned) by 4 activation bytes broadcast to every
//! lane (signed) and adds each pair of products into a 16-bit lane. Those sums stay in 16 bits
//! over as many vectors as cannot overflow (activations lie in ±127: 8 vectors of 4-bit values,
//! 8 · 2 · 15 · 127 < 2¹⁵; 4 of 5-bit; 2 of 6-bit; the 4 of a 16-value sub-block of 2- and 3-bit
//! values, whose scales change with each), then `vpmaddwd` by ones adds the pairs into
//! each row's 32-bit lane. 8-bit values (Q8_0) would overflow a single pair as unsigned bytes,
//! so they are multiplied as signed values: |q| times x with q's sign, 2 · 128 · 127 < 2¹⁵.
//! IQ4_NL's and MXFP4's nibbles are looked up (`vpshufb`) as their levels + 128 and then taken
//! as Q8_0's values ([`LOOKUP`]).
//! Per block the integer sums become f32 with the weights' scale and the activation's, as in
//! `vnni.rs`. A tile is up to `ROWS` activation rows by one panel, both halves: a weight vector
//! is unpacked once and used by every row of the tile.
//!
//! K-quants with one activation scale per super-block (`Activations::shared`, as llama.cpp's
//! Q8_K) take `panel_k`: `vpmaddwd` widens the 16-bit sums by each row's sub-block scale
//! instead of by ones, so the super-block's eight groups add up in 32-bit integers, and the
//! minimums (Q4_K, Q5_K) or the −32 offset (Q6_K) come from the activations' integer block sums
//! the same way; floats are touched once per super-block, not once per group.
//!
//! `unsafe` (C8: the reason). The loads and stores of vectors take raw pointers, and the AVX2
//! functions may only run on a CPU that has those instructions. So `run` checks the features at
//! run time before calling the `#[target_feature]` code, and every load reads from a slice whose
//! length was checked (`load256`, `load128`, `load64`). A tile's activation blocks are read
//! unchecked (`block`) after its panel checked once that every block it reads is there
//! (`Activations::cover`).
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::QuantType;
use super::activation::{Activations, block};
use super::packed::{GROUP, Layout, PANEL, Part, prefetch_ahead, prefetch_piece};

/// Whether this CPU runs the kernel.
pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Most activation rows per tile. Past 2 rows the accumulators and partial sums of both halves
/// no longer fit the 16 registers, but unpacking each weight vector for more rows still wins:
/// prefill-sized products measured 97-132 GOP/s at 2 rows, 116-160 at 4, 123-170 at 6 and about
/// the same at 8 (quant_bench, 512 rows, demo shapes, Zen 3).
const ROWS: usize = 6;
/// Rows of a panel in one AVX2 vector.
const HALF: usize = PANEL / 2;
/// The `BITS` of a format whose 4-bit values stand for levels (IQ4_NL, MXFP4): unpacked as
/// nibbles, looked up as level + 128, then multiplied as Q8_0's 8-bit values.
const LOOKUP: usize = 16;

/// Whether values of `bits` are multiplied as signed bytes (Q8_0's, and the looked-up levels).
const fn signed_values(bits: usize) -> bool {
    bits == 8 || bits == LOOKUP
}

/// `$body` once for each listed value of `$u`, each a constant there: the value vectors' unpacking
/// and the points where 16-bit sums widen depend on u, and a loop kept them as jumps.
macro_rules! unroll {
    ($u:ident in [$($n:literal),*] $body:block) => {
        $({
            let $u: usize = $n;
            $body
        })*
    };
}

/// Same contract as `vnni::run`.
pub(crate) fn run(
    part: &Part,
    panels: Range<usize>,
    acts: &Activations,
    x_rows: Range<usize>,
    out: &mut [&mut [f32]],
    bias: Option<&[f32]>,
) {
    assert!(available(), "the AVX2 kernel needs AVX2, FMA and F16C");
    assert!(out.len() == x_rows.len() && x_rows.end * acts.groups <= acts.q.len(), "avx2: rows out of range");
    assert!(part.chunks * part.layout.groups <= acts.groups, "avx2: activations shorter than the weights");
    // SAFETY: `available()` found avx2, fma and f16c on this CPU.
    unsafe { run_block(part, panels, acts, x_rows.start, out, bias) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn run_block(
    part: &Part,
    panels: Range<usize>,
    acts: &Activations,
    x0: usize,
    out: &mut [&mut [f32]],
    bias: Option<&[f32]>,
) {
    let l = &part.layout;
    let first = panels.start;
    for p in panels {
        let col = (p - first) * PANEL;
        let width = PANEL.min(part.rows - p * PANEL);
        let recs = &part.data.bytes()[p * part.chunks * l.bytes..][..part.chunks * l.bytes];
        let bias = bias.map(|b| &b[col..col + width]);
        let mut i = 0;
        while i < out.len() {
            let rows = (out.len() - i).min(ROWS);
            let integer_scales = l.ty.is_k() && acts.shared == l.groups;
            // The panel comes from memory for its first tile; the later tiles find it cached.
            let fetch = i == 0;
            macro_rules! tile {
                ($r:literal) => {{
                    let bits = if l.ty.lookup().is_some() { LOOKUP } else { l.ty.bits() };
                    let acc = match (bits, integer_scales) {
                        (2, true) => panel_k::<$r, 2>(l, recs, acts, x0 + i, fetch),
                        (3, true) => panel_k::<$r, 3>(l, recs, acts, x0 + i, fetch),
                        (4, true) => panel_k::<$r, 4>(l, recs, acts, x0 + i, fetch),
                        (5, true) => panel_k::<$r, 5>(l, recs, acts, x0 + i, fetch),
                        (6, true) => panel_k::<$r, 6>(l, recs, acts, x0 + i, fetch),
                        (2, _) => panel::<$r, 2>(l, recs, acts, x0 + i, fetch),
                        (3, _) => panel::<$r, 3>(l, recs, acts, x0 + i, fetch),
                        (4, _) => panel::<$r, 4>(l, recs, acts, x0 + i, fetch),
                        (5, _) => panel::<$r, 5>(l, recs, acts, x0 + i, fetch),
                        (6, _) => panel::<$r, 6>(l, recs, acts, x0 + i, fetch),
                        (LOOKUP, _) => panel::<$r, LOOKUP>(l, recs, acts, x0 + i, fetch),
                        _ => panel::<$r, 8>(l, recs, acts, x0 + i, fetch),
                    };
                    store::<$r>(acc, &mut out[i..i + $r], col, width, bias);
                }};
            }
            match rows {
                6 => tile!(6),
                5 => tile!(5),
                4 => tile!(4),
                3 => tile!(3),
                2 => tile!(2),
                _ => tile!(1),
            }
            i += rows;
        }
    }
}

/// The 16 outputs (two halves of 8) of one panel for activation rows `x0..x0 + R`, for a format
/// of `BITS`-bit values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn panel<const R: usize, const BITS: usize>(
    l: &Layout,
    recs: &[u8],
    acts: &Activations,
    x0: usize,
    fetch: bool,
) -> [[__m256; 2]; R] {
    // Every block the tile reads, checked once: the loop reads them unchecked (`block`).
    assert!(acts.cover(x0, R, recs.len() / l.bytes * l.groups), "avx2: the activations do not cover the tile");
    let per_sum = per_sum(BITS);
    let ones = _mm256_set1_epi16(1);
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    // With `fetch`, the records `AHEAD` bytes on (a thread's panels lie one after another, so
    // this runs into the next panel too), a piece every four value vectors: asked for a whole
    // record at once (37 cache lines of Q4_K), the requests queued behind each other and the
    // 1.5B head streamed from DRAM at 19-24 GB/s in the K-quants and 30 in Q8_0; a piece per
    // group gave 33 for the K-quants, a piece per half group 33-36 for every format (Zen 3).
    let piece = prefetch_piece(l);
    for (c, rec) in recs.chunks_exact(l.bytes).enumerate() {
        for g in 0..l.groups {
            let mut at = [0; R];
            for (i, at) in at.iter_mut().enumerate() {
                *at = (x0 + i) * acts.groups + c * l.groups + g;
            }
            // Per row and half: the 32-bit sums of the current (sub-)block, and 16-bit partials.
            let mut sums = [[zero; 2]; R];
            let mut partial = [[zero; 2]; R];
            unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
                if fetch && u.is_multiple_of(4) {
                    prefetch_ahead(rec, piece, g, u);
                }
                let w = values::<BITS>(l, rec, g, u);
                // Q8_0: |q| and q's sign, with q = stored − 128.
                let bias = _mm256_set1_epi8(-128);
                let signed = [_mm256_xor_si256(w[0], bias), _mm256_xor_si256(w[1], bias)];
                let magnitude = [_mm256_abs_epi8(signed[0]), _mm256_abs_epi8(signed[1])];
                for i in 0..R {
                    // SAFETY: a block of row x0 + i below the records' groups, which `cover`
                    // checked above; the same below.
                    let x = x4(unsafe { block(&acts.q, at[i]) }, u);
                    for h in 0..2 {
                        let p = if signed_values(BITS) {
                            _mm256_maddubs_epi16(magnitude[h], _mm256_sign_epi8(x, signed[h]))
                        } else {
                            _mm256_maddubs_epi16(w[h], x)
                        };
                        partial[i][h] = if u.is_multiple_of(per_sum) { p } else { _mm256_add_epi16(partial[i][h], p) };
                        if u % per_sum == per_sum - 1 {
                            sums[i][h] = _mm256_add_epi32(sums[i][h], _mm256_madd_epi16(partial[i][h], ones));
                        }
                    }
                }
                if sub_blocks(BITS) && u == 3 {
                    // Q2_K, Q3_K, Q6_K: the group's first 16-value sub-block has its own scale.
                    sub_block_fold::<R, BITS>(l, rec, g, 0, &sums, acts, &at, &mut acc);
                    sums = [[zero; 2]; R];
                }
            });
            if sub_blocks(BITS) {
                sub_block_fold::<R, BITS>(l, rec, g, 1, &sums, acts, &at, &mut acc);
            } else {
                for h in 0..2 {
                    // Group g's weight scale S and offset B for half h of the rows: w = S · q + B
                    // (no B for Q8_0 and the looked-up levels, multiplied as signed).
                    let at_s = l.scales_at(g);
                    let (s, b) = match l.ty {
                        QuantType::Q4_1 | QuantType::Q5_1 => {
                            (f16_to_f32(&rec[at_s + 16 * h..]), f16_to_f32(&rec[at_s + 32 + 16 * h..]))
                        }
                        QuantType::Q4K | QuantType::Q5K => {
                            let sup = l.sup_at() + 16 * h;
                            let (d, dmin) = (f16_to_f32(&rec[sup..]), f16_to_f32(&rec[sup + 32..]));
                            let s = _mm256_mul_ps(d, u8_to_f32(&rec[at_s + HALF * h..]));
                            let m = _mm256_mul_ps(dmin, u8_to_f32(&rec[at_s + 16 + HALF * h..]));
                            (s, _mm256_sub_ps(_mm256_setzero_ps(), m))
                        }
                        ty => {
                            let d = if ty == QuantType::Mxfp4 {
                                e8m0_half(&rec[at_s + HALF * h..])
                            } else {
                                f16_to_f32(&rec[at_s + 16 * h..])
                            };
                            let offset = match ty {
                                QuantType::Q4_0 => -8.0,
                                QuantType::Q5_0 => -16.0,
                                _ => 0.0, // Q8_0, IQ4_NL, MXFP4
                            };
                            (d, _mm256_mul_ps(d, _mm256_set1_ps(offset)))
                        }
                    };
                    for i in 0..R {
                        // SAFETY: as above.
                        let dx = _mm256_set1_ps(unsafe { *block(&acts.d, at[i]) });
                        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[i][h]), _mm256_mul_ps(s, dx), acc[i][h]);
                        if !signed_values(BITS) {
                            // SAFETY: as above.
                            let ds = unsafe { *block(&acts.ds, at[i]) };
                            acc[i][h] = _mm256_fmadd_ps(b, _mm256_set1_ps(ds), acc[i][h]);
                        }
                    }
                }
            }
        }
    }
    acc
}

/// [`panel`] for a K-quant whose activations share one scale per super-block (see the module's
/// note): Q4_K and Q5_K (`w = d·s·q − dmin·m`, per 32-value group), Q2_K (the same per 16-value
/// sub-block) and Q6_K and Q3_K (`w = d·s·(q − 32)` or `(q − 4)`, a signed scale per 16-value
/// sub-block). The 32-bit sums cannot overflow: Q6_K's are the largest, each widening at
/// most 2 · 32004 · 128 (two 16-bit partials of two vectors, times a scale of at most 128), 32 of
/// them per super-block, 2.6·10⁸, and its offsets 16 · 128 · 2032 · 32 = 1.3·10⁸; Q4_K's reach
/// 3.1·10⁷, Q5_K's 6.4·10⁷, Q3_K's 16 · 2 · 7112 · 32 = 7.3·10⁶, Q2_K's 16 · 2 · 3048 · 15 =
/// 1.5·10⁶.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn panel_k<const R: usize, const BITS: usize>(
    l: &Layout,
    recs: &[u8],
    acts: &Activations,
    x0: usize,
    fetch: bool,
) -> [[__m256; 2]; R] {
    // Every block the tile reads, checked once: the loop reads them unchecked (`block`).
    assert!(acts.cover(x0, R, recs.len() / l.bytes * l.groups), "avx2: the activations do not cover the tile");
    let per_sum = per_sum(BITS);
    let signed = signed_scales(BITS);
    let ctrl = [pairs(0, signed), pairs(1, signed)];
    let zero = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let piece = prefetch_piece(l);
    for (c, rec) in recs.chunks_exact(l.bytes).enumerate() {
        let mut base = [0; R];
        for (i, base) in base.iter_mut().enumerate() {
            *base = (x0 + i) * acts.groups + c * l.groups;
        }
        // Per row and half: Σ over the super-block of each (sub-)block's dot times its scale,
        // and of its offset: the minimum times the block sum (Q4_K, Q5_K), or the scale times
        // the sub-block sum (Q6_K, for the −32).
        let mut sumi = [[zero; 2]; R];
        let mut offset = [[zero; 2]; R];
        for g in 0..l.groups {
            let at_s = l.scales_at(g);
            let mut scale = scale_pairs::<BITS>(&rec[at_s..], &ctrl);
            if !sub_blocks(BITS) {
                let m = scale_pairs::<BITS>(&rec[at_s + 16..], &ctrl);
                for i in 0..R {
                    // SAFETY: a block of row x0 + i below the records' groups, which `cover`
                    // checked above; the same below.
                    let [s0, s1] = unsafe { *block(&acts.sums, base[i] + g) };
                    let sums = _mm256_set1_epi32(i32::from(s0 as u16) | (i32::from(s1 as u16) << 16));
                    for h in 0..2 {
                        offset[i][h] = _mm256_add_epi32(offset[i][h], _mm256_madd_epi16(m[h], sums));
                    }
                }
            }
            let mut partial = [[zero; 2]; R];
            unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
                if fetch && u.is_multiple_of(4) {
                    prefetch_ahead(rec, piece, g, u);
                }
                if sub_blocks(BITS) && u.is_multiple_of(4) {
                    // Sub-block u / 4 of the group: its scale, and the scale (Q6_K, Q3_K) or the
                    // minimum (Q2_K, whose byte holds both) times the sub-block sum.
                    if u == 4 {
                        scale = scale_pairs::<BITS>(&rec[at_s + 16..], &ctrl);
                    }
                    let mut by = scale;
                    if BITS == 2 {
                        by = [_mm256_srli_epi16(scale[0], 4), _mm256_srli_epi16(scale[1], 4)];
                        let low = _mm256_set1_epi16(0x0f);
                        scale = [_mm256_and_si256(scale[0], low), _mm256_and_si256(scale[1], low)];
                    }
                    for i in 0..R {
                        // SAFETY: as above.
                        let sum = unsafe { block(&acts.sums, base[i] + g)[u / 4] };
                        let sum = _mm256_set1_epi32(i32::from(sum as u16));
                        for h in 0..2 {
                            offset[i][h] = _mm256_add_epi32(offset[i][h], _mm256_madd_epi16(by[h], sum));
                        }
                    }
                }
                let w = values::<BITS>(l, rec, g, u);
                for i in 0..R {
                    // SAFETY: as above.
                    let x = x4(unsafe { block(&acts.q, base[i] + g) }, u);
                    for h in 0..2 {
                        let p = _mm256_maddubs_epi16(w[h], x);
                        partial[i][h] = if u.is_multiple_of(per_sum) { p } else { _mm256_add_epi16(partial[i][h], p) };
                        if u % per_sum == per_sum - 1 {
                            sumi[i][h] = _mm256_add_epi32(sumi[i][h], _mm256_madd_epi16(partial[i][h], scale[h]));
                        }
                    }
                }
            });
        }
        // The super-block's floats.
        for h in 0..2 {
            let d = f16_to_f32(&rec[l.sup_at() + 16 * h..]);
            let dmin = f16_to_f32(&rec[l.sup_at() + 32 * usize::from(!signed) + 16 * h..]);
            for i in 0..R {
                let dx = _mm256_set1_ps(acts.d[base[i]]);
                if signed {
                    // The offset: 32 = 2⁵ (Q6_K), 4 = 2² (Q3_K).
                    let shift = _mm_cvtsi32_si128(if BITS == 6 { 5 } else { 2 });
                    let total = _mm256_sub_epi32(sumi[i][h], _mm256_sll_epi32(offset[i][h], shift));
                    acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, dx), acc[i][h]);
                } else {
                    acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[i][h]), _mm256_mul_ps(d, dx), acc[i][h]);
                    let m = _mm256_mul_ps(dmin, dx);
                    acc[i][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offset[i][h]), m, acc[i][h]);
                }
            }
        }
    }
    acc
}

/// How many `vpmaddubsw` results of `bits`-bit values add up in 16 bits before they are widened
/// (see the module's note): Q2_K's and Q3_K's could add up far more, but their scales change
/// with every 16-value sub-block (4 vectors).
const fn per_sum(bits: usize) -> usize {
    match bits {
        2 | 3 => 4,
        4 => 8,
        5 => 4,
        6 => 2,
        _ => 1,
    }
}

/// Whether the K-quant of `bits`-bit values scales each 16-value sub-block on its own (Q2_K,
/// Q3_K, Q6_K: no other format of those widths exists).
const fn sub_blocks(bits: usize) -> bool {
    matches!(bits, 2 | 3 | 6)
}

/// Whether the K-quant of `bits`-bit values has signed scales and a fixed offset (Q3_K, Q6_K)
/// rather than unsigned scales and minimums.
const fn signed_scales(bits: usize) -> bool {
    matches!(bits, 3 | 6)
}

/// The 16 rows' byte scales at the start of `b` as `vpmaddwd` operands, one per half: each
/// row's 32-bit lane holds its scale in both 16-bit halves (unsigned for Q2_K, Q4_K and Q5_K,
/// sign-extended for Q3_K's and Q6_K's).
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pairs<const BITS: usize>(b: &[u8], ctrl: &[__m256i; 2]) -> [__m256i; 2] {
    let rows = _mm256_broadcastsi128_si256(load128(b));
    let (lo, hi) = (_mm256_shuffle_epi8(rows, ctrl[0]), _mm256_shuffle_epi8(rows, ctrl[1]));
    if signed_scales(BITS) { [_mm256_srai_epi16(lo, 8), _mm256_srai_epi16(hi, 8)] } else { [lo, hi] }
}

/// `vpshufb` controls over 16 row bytes broadcast to both 128-bit lanes: the 32-bit lane j of
/// half h takes byte 8h + j twice, in the low byte of each 16-bit half (zero above), or, when
/// `signed`, in the high byte (to be shifted down with its sign).
#[inline]
#[target_feature(enable = "avx2")]
fn pairs(h: usize, signed: bool) -> __m256i {
    let mut c = [0x80u8; 32];
    for j in 0..HALF {
        let at = 4 * j + usize::from(signed);
        (c[at], c[at + 2]) = ((HALF * h + j) as u8, (HALF * h + j) as u8);
    }
    load256(&c)
}

/// Sub-block `sb` (values 16·sb.. of group g) of Q6_K or Q3_K, `w = S · (q − offset)`, or of
/// Q2_K, `w = S · q − M`: `acc += dot · S · d_x + B · (d_x · Σq_x)` over the sub-block, with
/// `B = −offset · S` or `−M`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn sub_block_fold<const R: usize, const BITS: usize>(
    l: &Layout,
    rec: &[u8],
    g: usize,
    sb: usize,
    sums: &[[__m256i; 2]; R],
    acts: &Activations,
    at: &[usize; R],
    acc: &mut [[__m256; 2]; R],
) {
    for h in 0..2 {
        let d = f16_to_f32(&rec[l.sup_at() + 16 * h..]);
        let bytes = &rec[l.scales_at(g) + 16 * sb + HALF * h..];
        let (s, b) = if BITS == 2 {
            // Q2_K's byte: the scale in its low nibble, the minimum in its high one.
            let byte = _mm256_cvtepu8_epi32(load64(bytes));
            let sc = _mm256_cvtepi32_ps(_mm256_and_si256(byte, _mm256_set1_epi32(0x0f)));
            let m = _mm256_cvtepi32_ps(_mm256_srli_epi32(byte, 4));
            let dmin = f16_to_f32(&rec[l.sup_at() + 32 + 16 * h..]);
            (_mm256_mul_ps(d, sc), _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, m)))
        } else {
            let s = _mm256_mul_ps(d, i8_to_f32(bytes));
            (s, _mm256_mul_ps(s, _mm256_set1_ps(if BITS == 6 { -32.0 } else { -4.0 })))
        };
        for i in 0..R {
            let dx = _mm256_set1_ps(acts.d[at[i]]);
            acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[i][h]), _mm256_mul_ps(s, dx), acc[i][h]);
            acc[i][h] = _mm256_fmadd_ps(b, _mm256_set1_ps(acts.dsh[at[i]][sb]), acc[i][h]);
        }
    }
}

/// Value vector u of group g (values 4u..4u + 4 of each row), both halves, as unsigned bytes.
/// No closures here or in the callers: a closure is not compiled with the enclosing function's
/// target features, and its intrinsics become calls.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn values<const BITS: usize>(l: &Layout, rec: &[u8], g: usize, u: usize) -> [__m256i; 2] {
    let at = l.values_at(g);
    if BITS == 8 {
        return [load256(&rec[at + 64 * u..]), load256(&rec[at + 64 * u + 32..])];
    }
    let mut w = [_mm256_setzero_si256(); 2];
    if BITS <= 3 {
        // The low two bits: vector u / 4 holds value vector u at bits 2·(u % 4) of each byte.
        let low = _mm256_set1_epi8(3);
        for (h, w) in w.iter_mut().enumerate() {
            let bytes = load256(&rec[at + 64 * (u / 4) + 32 * h..]);
            *w = _mm256_and_si256(shift_bits(bytes, 2 * (u % 4), 0), low);
        }
    } else {
        // Nibbles: vector v holds value vector 2v in its low nibbles and 2v + 1 in its high ones.
        let low = _mm256_set1_epi8(0x0f);
        for (h, w) in w.iter_mut().enumerate() {
            let bytes = load256(&rec[at + 64 * (u / 2) + 32 * h..]);
            *w = _mm256_and_si256(shift_bits(bytes, 4 * (u % 2), 0), low);
        }
    }
    if BITS == LOOKUP
        && let Some(lookup) = l.ty.lookup()
    {
        let table = _mm256_broadcastsi128_si256(load128(lookup));
        w = [_mm256_shuffle_epi8(table, w[0]), _mm256_shuffle_epi8(table, w[1])];
    } else if BITS == 6 {
        // Field vector u / 4 holds bits 4-5 of value vector u at bits 2·(u % 4) of each byte.
        let field = _mm256_set1_epi8(0x30);
        for (h, w) in w.iter_mut().enumerate() {
            let high = load256(&rec[l.plane_at(g, u / 4) + 32 * h..]);
            *w = _mm256_or_si256(*w, _mm256_and_si256(shift_bits(high, 2 * (u % 4), 4), field));
        }
    } else if BITS == 3 || BITS == 5 {
        // Bit u of each byte of the field vector is the top bit (the third, or the fifth) of
        // value vector u.
        let bit = _mm256_set1_epi8(1 << (BITS - 1));
        for (h, w) in w.iter_mut().enumerate() {
            let high = load256(&rec[l.plane_at(g, 0) + 32 * h..]);
            *w = _mm256_or_si256(*w, _mm256_and_si256(shift_bits(high, u, BITS - 1), bit));
        }
    }
    w
}

/// `v` shifted so that each byte's bit `from` lands on bit `to` (a 16-bit shift: the bits that
/// cross into the neighbouring byte land elsewhere, and the caller masks what it wants). Both
/// are constants where it is inlined, so the match is one shift.
#[inline]
#[target_feature(enable = "avx2")]
fn shift_bits(v: __m256i, from: usize, to: usize) -> __m256i {
    match to as isize - from as isize {
        4 => _mm256_slli_epi16(v, 4),
        3 => _mm256_slli_epi16(v, 3),
        2 => _mm256_slli_epi16(v, 2),
        1 => _mm256_slli_epi16(v, 1),
        0 => v,
        -1 => _mm256_srli_epi16(v, 1),
        -2 => _mm256_srli_epi16(v, 2),
        -3 => _mm256_srli_epi16(v, 3),
        -4 => _mm256_srli_epi16(v, 4),
        -5 => _mm256_srli_epi16(v, 5),
        -6 => _mm256_srli_epi16(v, 6),
        _ => _mm256_srli_epi16(v, 7),
    }
}

/// Four activation bytes `x[4u..4u + 4]` in every 32-bit lane.
#[inline]
#[target_feature(enable = "avx2")]
fn x4(x: &[i8; GROUP], u: usize) -> __m256i {
    _mm256_set1_epi32(i32::from_le_bytes([x[4 * u] as u8, x[4 * u + 1] as u8, x[4 * u + 2] as u8, x[4 * u + 3] as u8]))
}

/// Adds the bias and writes the first `width` outputs of each row at column `col`.
#[inline]
#[target_feature(enable = "avx2")]
fn store<const R: usize>(
    acc: [[__m256; 2]; R],
    out: &mut [&mut [f32]],
    col: usize,
    width: usize,
    bias: Option<&[f32]>,
) {
    for (row, acc) in out.iter_mut().zip(acc) {
        let mut values = [0.0f32; PANEL];
        // SAFETY: `values` holds 16 f32: two stores of 8 (32 bytes each) at 0 and 8.
        unsafe {
            _mm256_storeu_ps(values.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(values.as_mut_ptr().add(HALF), acc[1]);
        }
        for (j, v) in values[..width].iter().enumerate() {
            row[col + j] = v + bias.map_or(0.0, |b| b[j]);
        }
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn load256(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: `b` holds 32 bytes, read unaligned.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn load128(b: &[u8]) -> __m128i {
    let b = &b[..16];
    // SAFETY: `b` holds 16 bytes, read unaligned.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn load64(b: &[u8]) -> __m128i {
    let b = &b[..8];
    // SAFETY: `b` holds 8 bytes, read unaligned into the low half of the vector.
    unsafe { _mm_loadl_epi64(b.as_ptr().cast()) }
}

/// 8 f16 values (16 bytes) as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16_to_f32(b: &[u8]) -> __m256 {
    _mm256_cvtph_ps(load128(b))
}

/// 8 E8M0 scales (bytes) halved, 2^(e − 128), as f32 (as `vnni::e8m0_half`; a scale of 0 gives 0).
#[inline]
#[target_feature(enable = "avx2")]
fn e8m0_half(b: &[u8]) -> __m256 {
    let e = _mm256_cvtepu8_epi32(load64(b));
    _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e, 23)), _mm256_set1_ps(0.5))
}

/// 8 unsigned bytes as f32.
#[inline]
#[target_feature(enable = "avx2")]
fn u8_to_f32(b: &[u8]) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load64(b)))
}

/// 8 signed bytes as f32.
#[inline]
#[target_feature(enable = "avx2")]
fn i8_to_f32(b: &[u8]) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load64(b)))
}
