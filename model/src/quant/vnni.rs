//! x·Wᵀ over the packed layout with AVX-512 VNNI: `vpdpbusd` multiplies the 64 weight bytes of
//! a vector (4 values of each of 16 rows) by 4 activation bytes broadcast to every lane and adds
//! each row's 4 products into its 32-bit lane, so 8 instructions give the integer dot products of
//! 16 rows with one 32-value activation block. Per block the integer sums become f32 with the
//! weights' scale and the activation's: `acc += f32(dot) · (S · d_x) + B · (d_x · Σq_x)`, where
//! S and B are the block's weight scale and offset (or minimum) per row; where the offset is a
//! constant o times S (`w = S · (u + o)`), the integer sum starts at o · Σq_x instead and the
//! second term goes. A tile is up to `ROWS`
//! activation rows by one panel: the panel's values are unpacked once per block and reused by
//! every row of the tile.
//!
//! `unsafe` (C8: the reason). The loads and stores of vectors take raw pointers, and the
//! AVX-512 VNNI functions may only run on a CPU that has those instructions. So `run` checks the
//! features at run time before calling the `#[target_feature]` code, and every load reads from a
//! slice whose length was checked (`load512`, `load256`, `load128`); the bias's loads and the
//! output rows' stores are masked to their slices' lengths (`store`). A tile's activation blocks
//! are read unchecked (`block`) after `panel` checked once that every block its records cover lies
//! within the activations. The one other unsafe statement is an empty `asm!` that pins the order
//! of a tile's products (`panel`): it has no instructions.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

use super::QuantType;
use super::activation::{Activations, block};
use super::packed::{GROUP, Layout, PANEL, Part, prefetch_ahead, prefetch_piece};

/// The 32 unsigned values of group g of 16 rows: vector u holds values 4u..4u + 4 of each row.
/// A macro so that it always expands inside the caller's AVX-512 code: as a function it was
/// not inlined, and its eight vectors went through memory.
macro_rules! values {
    ($l:expr, $rec:expr, $g:expr) => {{
        let (l, rec, g): (&Layout, &[u8], usize) = ($l, $rec, $g);
        let at = l.values_at(g);
        let mut w = [_mm512_setzero_si512(); 8];
        if l.ty == QuantType::Q8_0 {
            for (u, w) in w.iter_mut().enumerate() {
                *w = load512(&rec[at + 64 * u..]);
            }
        } else {
            let low = _mm512_set1_epi8(0x0f);
            for v in 0..4 {
                let bytes = load512(&rec[at + 64 * v..]);
                w[2 * v] = _mm512_and_si512(bytes, low);
                w[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low);
            }
            if let Some(lookup) = l.ty.lookup() {
                // IQ4_NL, MXFP4: each nibble's level + 128 (`vpshufb` looks 16 bytes up).
                let table = _mm512_broadcast_i32x4(load128(lookup));
                for w in w.iter_mut() {
                    *w = _mm512_shuffle_epi8(table, *w);
                }
            } else if l.ty.bits() == 6 {
                // Q6_K: field vector h holds bits 4-5 of value vector 4h + f at bits 2f..2f + 2 of
                // each byte; a 16-bit shift moves them to bits 4-5 (what crosses into the next
                // byte lands outside 4-5), and `w | (shifted & 0x30)` is one `vpternlogd` (0xF8).
                let field = _mm512_set1_epi8(0x30);
                for h in 0..2 {
                    let high = load512(&rec[l.plane_at(g, h)..]);
                    let at = |f: usize| match f {
                        0 => _mm512_slli_epi16(high, 4),
                        1 => _mm512_slli_epi16(high, 2),
                        2 => high,
                        _ => _mm512_srli_epi16(high, 2),
                    };
                    for f in 0..4 {
                        w[4 * h + f] = _mm512_ternarylogic_epi32(w[4 * h + f], at(f), field, 0xF8);
                    }
                }
            } else if l.ty.bits() == 5 {
                // Bit u of each byte of the field vector is the fifth bit of value vector u: a
                // 16-bit shift moves it to bit 4 (what crosses into the next byte lands
                // elsewhere), and `w | (shifted & 0x10)` is one `vpternlogd`.
                let high = load512(&rec[l.plane_at(g, 0)..]);
                let bit = _mm512_set1_epi8(0x10);
                let at = |u: usize| match u {
                    0 => _mm512_slli_epi16(high, 4),
                    1 => _mm512_slli_epi16(high, 3),
                    2 => _mm512_slli_epi16(high, 2),
                    3 => _mm512_slli_epi16(high, 1),
                    4 => high,
                    5 => _mm512_srli_epi16(high, 1),
                    6 => _mm512_srli_epi16(high, 2),
                    _ => _mm512_srli_epi16(high, 3),
                };
                for (u, w) in w.iter_mut().enumerate() {
                    *w = _mm512_ternarylogic_epi32(*w, at(u), bit, 0xF8);
                }
            }
        }
        w
    }};
}

/// `$body` for each `$i` below `$r` (at most 8: a tile's activation rows, a group's value
/// vectors), `$i` a constant in each copy: indexed by constants, the tile's accumulators and the
/// group's values stay in registers (a loop over the rows kept them on the stack, a load and a
/// store per row and group).
macro_rules! unrolled {
    ($i:ident < $r:expr, $body:block) => {
        unrolled!(@ $i, $r, $body, 0 1 2 3 4 5 6 7)
    };
    (@ $i:ident, $r:expr, $body:block, $($n:literal)*) => {
        $(
            if $n < $r {
                let $i: usize = $n;
                $body
            }
        )*
    };
}

/// Whether this CPU runs the kernel.
pub fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// Whether this CPU runs each 512-bit instruction as two 256-bit halves: AMD's Zen 4 (family 25
/// with AVX-512 VNNI; Zen 5, family 26, has whole 512-bit data paths, and Intel's cores too).
/// There a one-row product in Q6_K, whose unpacking takes most of this kernel's instructions
/// when no other row shares it, runs faster on the AVX2 kernel (`Kernel::for_product`).
pub(crate) fn halves_512() -> bool {
    static ZEN4: OnceLock<bool> = OnceLock::new();
    *ZEN4.get_or_init(|| {
        // Leaves 0 and 1 (vendor, family) exist on every x86-64 CPU.
        let (vendor, version) = (__cpuid(0), __cpuid(1));
        // "AuthenticAMD", in the order CPUID returns it: ebx, edx, ecx.
        let amd = [vendor.ebx, vendor.edx, vendor.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163];
        let family = ((version.eax >> 8) & 0xf) + ((version.eax >> 20) & 0xff);
        amd && family == 25 && available() && super::avx2::available()
    })
}

/// Whether the kernel runs parts in `ty`: Q2_K and Q3_K go to the AVX2 kernel (every CPU with
/// AVX-512 VNNI has AVX2): their 2-bit fields are not written here, since the machines this
/// project is tested on have no AVX-512 to check them on.
pub(crate) fn runs(ty: QuantType) -> bool {
    ty.bits() >= 4
}

/// Most activation rows per tile (accumulators held in registers).
const ROWS: usize = 8;

/// A format as a type: each format's kernel is compiled on its own, its record layout and its
/// branches constants (one kernel for all took the format's branches and offsets at run time
/// in every group).
trait Format {
    const TY: QuantType;
    /// Which of the activations' `offset_sums` starts a block's integer sum: the one of the
    /// format's constant offset (`w = S · (u + o)`); `None` for a format with a minimum per
    /// block, whose term is added in float.
    const OFFSET: Option<usize> = offset_of(Self::TY);
}

/// Where `ty`'s offset is in [`OFFSETS`](super::activation::OFFSETS).
const fn offset_of(ty: QuantType) -> Option<usize> {
    match ty {
        QuantType::Q8_0 | QuantType::Iq4Nl | QuantType::Mxfp4 => Some(0),
        QuantType::Q5_0 => Some(1),
        QuantType::Q4_0 => Some(2),
        _ => None,
    }
}

/// The formats the kernel runs ([`runs`]), each as a [`Format`].
mod format {
    use super::{Format, QuantType};
    macro_rules! formats {
        ($($name:ident)*) => {$(
            pub(super) struct $name;
            impl Format for $name {
                const TY: QuantType = QuantType::$name;
            }
        )*};
    }
    formats!(Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4K Q5K Q6K Iq4Nl Mxfp4);
}

/// Outputs of panels `panels` of `part` for activation rows `x_rows`: `out[i]` is the output
/// row of activation row `x_rows.start + i`, restricted to the panels' columns; `bias` starts at
/// the first of those columns.
pub(crate) fn run(
    part: &Part,
    panels: Range<usize>,
    acts: &Activations,
    x_rows: Range<usize>,
    out: &mut [&mut [f32]],
    bias: Option<&[f32]>,
) {
    assert!(available(), "the VNNI kernel needs AVX-512 VNNI");
    assert!(out.len() == x_rows.len() && x_rows.end * acts.groups <= acts.q.len(), "vnni: rows out of range");
    assert!(part.chunks * part.layout.groups <= acts.groups, "vnni: activations shorter than the weights");
    macro_rules! by_format {
        ($($name:ident)*) => {
            match part.layout.ty {
                // SAFETY: `available()` found avx512f, avx512bw and avx512vnni on this CPU.
                $(QuantType::$name => unsafe { run_block::<format::$name>(part, panels, acts, x_rows.start, out, bias) },)*
                ty => panic!("vnni: the kernel does not run {ty}"),
            }
        };
    }
    by_format!(Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4K Q5K Q6K Iq4Nl Mxfp4)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn run_block<F: Format>(
    part: &Part,
    panels: Range<usize>,
    acts: &Activations,
    x0: usize,
    out: &mut [&mut [f32]],
    bias: Option<&[f32]>,
) {
    assert!(part.layout == Layout::of(F::TY), "vnni: a part's layout is its format's");
    let first = panels.start;
    for p in panels {
        let col = (p - first) * PANEL;
        let width = PANEL.min(part.rows - p * PANEL);
        let recs = &part.data.bytes()[p * part.chunks * part.layout.bytes..][..part.chunks * part.layout.bytes];
        let bias = bias.map(|b| &b[col..col + width]);
        let mut i = 0;
        while i < out.len() {
            let rows = (out.len() - i).min(ROWS);
            macro_rules! tile {
                ($r:literal) => {{
                    let acc = panel::<F, $r>(recs, acts, x0 + i, i == 0);
                    store::<$r>(acc, &mut out[i..i + $r], col, width, bias);
                }};
            }
            match rows {
                8 => tile!(8),
                7 => tile!(7),
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

/// The 16 outputs of one panel for activation rows `x0..x0 + R`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn panel<F: Format, const R: usize>(recs: &[u8], acts: &Activations, x0: usize, fetch: bool) -> [__m512; R] {
    let l = &Layout::of(F::TY);
    // The tile's activations for every group the records cover, checked here once and read
    // unchecked below (`block`): checked in the loop, each row's three reads of a group took a
    // compare and a branch each (the branches on ports the vector instructions use), and the
    // 8-row loop ran 118 scalar instructions a group beside its 130 vector ones; 58 now.
    assert!(acts.cover(x0, R, recs.len() / l.bytes * l.groups), "vnni: the activations do not cover the tile");
    let row = |i: usize| (x0 + i) * acts.groups;
    let mut acc = [_mm512_setzero_ps(); R];
    // With `fetch` (a panel's first tile of rows: later ones find it cached), the records
    // `AHEAD` bytes on (a thread's panels lie one after another, so this runs into the next
    // panel too), two pieces with each group: asked for a whole record at once, a 7B head
    // streamed from DRAM at 20-25 GB/s in Q4_K, 25 in Q6_K and 28 in Q8_0 (Emerald Rapids).
    let piece = prefetch_piece(l);
    for (c, rec) in recs.chunks_exact(l.bytes).enumerate() {
        let (dsup, msup) = super_scales(l, rec);
        for g in 0..l.groups {
            if fetch {
                prefetch_ahead(rec, piece, g, 0);
                prefetch_ahead(rec, piece, g, 4);
            }
            let gi = c * l.groups + g;
            let w = values!(l, rec, g);
            if l.ty == QuantType::Q6K {
                // Two 16-value sub-blocks with their own scales: w = S_h · (q − 32).
                let at = l.scales_at(g);
                let s0 = _mm512_mul_ps(dsup, i8_to_f32(&rec[at..]));
                let s1 = _mm512_mul_ps(dsup, i8_to_f32(&rec[at + 16..]));
                let (b0, b1) = (_mm512_mul_ps(s0, _mm512_set1_ps(-32.0)), _mm512_mul_ps(s1, _mm512_set1_ps(-32.0)));
                unrolled!(i < R, {
                    let acc = &mut acc[i];
                    let a = row(i) + gi;
                    // SAFETY: a block of row x0 + i below the records' `covered` groups (gi), which
                    // `cover` checked above; the same below.
                    let (x, dx, [h0, h1]) =
                        unsafe { (block(&acts.q, a), _mm512_set1_ps(*block(&acts.d, a)), *block(&acts.dsh, a)) };
                    let zero = _mm512_setzero_si512();
                    let (d0, d1) = (dot(zero, &w, 0..4, x), dot(zero, &w, 4..8, x));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_mul_ps(s0, dx), *acc);
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_mul_ps(s1, dx), *acc);
                    *acc = _mm512_fmadd_ps(b0, _mm512_set1_ps(h0), *acc);
                    *acc = _mm512_fmadd_ps(b1, _mm512_set1_ps(h1), *acc);
                });
            } else {
                let (s, b) = scales(l, rec, g, dsup, msup);
                // Each row's integer dot product with the group, started (a format with a constant
                // offset) with the offset times the activations' sum: one FMA a row and group
                // fewer on the vector ports, for a broadcast that is a load.
                let mut dots = [_mm512_setzero_si512(); R];
                if let Some(k) = F::OFFSET {
                    unrolled!(i < R, {
                        // SAFETY: as above.
                        dots[i] = _mm512_set1_epi32(unsafe { block(&acts.offset_sums, row(i) + gi) }[k]);
                    });
                }
                if R >= 4 {
                    // One integer sum a row, the rows' products interleaved value vector by value
                    // vector: each product waits on its row's last, R products apart, so
                    // neighbours in the instruction stream are independent. Row by row (two
                    // chains of four a row), the out-of-order window had to hold several rows'
                    // chains to keep both vector ports busy: 6-8% slower at 512 rows in
                    // quant_bench, and 9% slower a 512-token prefill of a 1.5B model.
                    let mut xs: [&[i8; GROUP]; R] = [&[0; GROUP]; R];
                    unrolled!(i < R, {
                        // SAFETY: as above.
                        xs[i] = unsafe { block(&acts.q, row(i) + gi) };
                    });
                    unrolled!(u < 8, {
                        unrolled!(i < R, {
                            dots[i] = _mm512_dpbusd_epi32(dots[i], w[u], x4(xs[i], u));
                            // Keeps the order written: LLVM's scheduler otherwise gathers each
                            // row's eight products back into one chain. These empty statements
                            // keep their order among themselves, and each holds its row's sum
                            // until the next value vector.
                            // SAFETY: no instructions; the register is read and written back as is.
                            unsafe {
                                std::arch::asm!("/* {0} */", inout(zmm_reg) dots[i], options(nomem, nostack, preserves_flags))
                            };
                        });
                    });
                } else {
                    // A few rows: two chains of four products a row, not one of eight, each
                    // waiting on the last.
                    unrolled!(i < R, {
                        // SAFETY: as above.
                        let x = unsafe { block(&acts.q, row(i) + gi) };
                        dots[i] = _mm512_add_epi32(dot(dots[i], &w, 0..4, x), dot(_mm512_setzero_si512(), &w, 4..8, x));
                    });
                }
                unrolled!(i < R, {
                    let a = row(i) + gi;
                    // SAFETY: as above.
                    let d = unsafe { *block(&acts.d, a) };
                    let acc = &mut acc[i];
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[i]), _mm512_mul_ps(s, _mm512_set1_ps(d)), *acc);
                    if F::OFFSET.is_none() {
                        // SAFETY: as above.
                        let ds = unsafe { *block(&acts.ds, a) };
                        *acc = _mm512_fmadd_ps(b, _mm512_set1_ps(ds), *acc);
                    }
                });
            }
        }
    }
    acc
}

/// Four activation bytes `x[4u..4u + 4]` in every 32-bit lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn x4(x: &[i8; GROUP], u: usize) -> __m512i {
    _mm512_set1_epi32(i32::from_le_bytes([x[4 * u] as u8, x[4 * u + 1] as u8, x[4 * u + 2] as u8, x[4 * u + 3] as u8]))
}

/// `init` + Σ over vectors `us` of the weights times the activations, per row.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
fn dot(init: __m512i, w: &[__m512i; 8], us: Range<usize>, x: &[i8; GROUP]) -> __m512i {
    let mut d = init;
    for u in us {
        d = _mm512_dpbusd_epi32(d, w[u], x4(x, u));
    }
    d
}

/// The super-block scales of a K-quant record (d, and dmin for Q4_K / Q5_K), else zeros.
#[inline]
#[target_feature(enable = "avx512f")]
fn super_scales(l: &Layout, rec: &[u8]) -> (__m512, __m512) {
    let zero = _mm512_setzero_ps();
    match l.ty {
        QuantType::Q4K | QuantType::Q5K => (f16_to_f32(&rec[l.sup_at()..]), f16_to_f32(&rec[l.sup_at() + 32..])),
        QuantType::Q6K => (f16_to_f32(&rec[l.sup_at()..]), zero),
        _ => (zero, zero),
    }
}

/// Group g's weight scale S and minimum B per row: `w = S · q + B` (Q4_1, Q5_1, Q4_K, Q5_K). A
/// format with a constant offset gets B = 0: its offset starts the integer sum (`Format::OFFSET`).
#[inline]
#[target_feature(enable = "avx512f")]
fn scales(l: &Layout, rec: &[u8], g: usize, dsup: __m512, msup: __m512) -> (__m512, __m512) {
    let at = l.scales_at(g);
    match l.ty {
        QuantType::Q4_1 | QuantType::Q5_1 => (f16_to_f32(&rec[at..]), f16_to_f32(&rec[at + 32..])),
        QuantType::Q4K | QuantType::Q5K => {
            let s = _mm512_mul_ps(dsup, u8_to_f32(&rec[at..]));
            let m = _mm512_mul_ps(msup, u8_to_f32(&rec[at + 16..]));
            (s, _mm512_sub_ps(_mm512_setzero_ps(), m))
        }
        ty => {
            let d = if ty == QuantType::Mxfp4 { e8m0_half(&rec[at..]) } else { f16_to_f32(&rec[at..]) };
            (d, _mm512_setzero_ps())
        }
    }
}

/// 16 E8M0 scales (bytes) halved, 2^(e − 128), as f32: the exponent field e shifted into place
/// is 2^(e − 127). A scale of 0 (2^−128, ggml's subnormal) gives 0.
#[inline]
#[target_feature(enable = "avx512f")]
fn e8m0_half(b: &[u8]) -> __m512 {
    let e = _mm512_cvtepu8_epi32(load128(b));
    _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(e, 23)), _mm512_set1_ps(0.5))
}

/// Adds the bias and writes the first `width` outputs of each row at column `col`.
#[inline]
#[target_feature(enable = "avx512f")]
fn store<const R: usize>(acc: [__m512; R], out: &mut [&mut [f32]], col: usize, width: usize, bias: Option<&[f32]>) {
    // The first `width` lanes (a panel is narrower only at the matrix's last rows), loaded and
    // stored under a mask: through copies, each row's 64 bytes were a call to memmove.
    let lanes = ((1u32 << width) - 1) as __mmask16;
    let b = match bias {
        // SAFETY: `bias` holds `width` f32, and the mask reads only those (masked-off lanes touch
        // no memory).
        Some(bias) => unsafe { _mm512_maskz_loadu_ps(lanes, bias[..width].as_ptr()) },
        None => _mm512_setzero_ps(),
    };
    for (row, acc) in out.iter_mut().zip(acc) {
        let dst = &mut row[col..col + width];
        // SAFETY: `dst` holds `width` f32, and the mask writes only those (masked-off lanes
        // touch no memory).
        unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), lanes, _mm512_add_ps(acc, b)) };
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn load512(b: &[u8]) -> __m512i {
    let b = &b[..64];
    // SAFETY: `b` holds 64 bytes, read unaligned.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn load256(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: `b` holds 32 bytes, read unaligned.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn load128(b: &[u8]) -> __m128i {
    let b = &b[..16];
    // SAFETY: `b` holds 16 bytes, read unaligned.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// 16 f16 values (32 bytes) as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn f16_to_f32(b: &[u8]) -> __m512 {
    _mm512_cvtph_ps(load256(b))
}

/// 16 unsigned bytes as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn u8_to_f32(b: &[u8]) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(load128(b)))
}

/// 16 signed bytes as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn i8_to_f32(b: &[u8]) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load128(b)))
}
