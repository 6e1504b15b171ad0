//! The q8_0 KV cache format (llama.cpp's `--cache-type-k q8_0`): each cell's row of `d` values
//! in blocks of 32, each an f16 scale and 32 signed bytes (`value = scale · q`, with the scale
//! the block's largest magnitude over 127), the last block zero-padded where `d` is not a
//! multiple of 32. The cache keeps the blocks in an f16 tensor, 17 16-bit words a block (the
//! scale's, then the bytes two by two), so Burn slices and copies them as any 16-bit cache.
//!
//! Rows are stored **rotated**: each piece of [`rotation_len`] values goes through an
//! orthonormal Walsh–Hadamard transform before it is quantized. A few channels of a head's keys
//! carry most of their magnitude (Qwen2's key biases), and a block's one scale then leaves the
//! other values few steps; the rotation spreads every channel over the whole piece. It is its own
//! inverse and keeps dot products, so attention over stored rows takes its queries rotated the
//! same way and rotates its output back ([`rotate`]). On Qwen2.5-0.5B (Q4_K_M, ten 512-token
//! chunks) this cut the KL divergence a q8_0 cache costs against an f16 one from 0.025 to 0.015
//! (llama.cpp, which rotates its quantized caches too, measured 0.017 on the same text).

use half::f16;

/// Values per block.
pub const VALUES: usize = 32;
/// 16-bit words per block.
pub const WORDS: usize = 17;

/// One block as it lies in the cache: the scale's word, then the 32 bytes two by two
/// (little-endian, as the cache's memory holds them).
pub type Block = [f16; WORDS];

/// The block of up to 32 values (the rest zero). The values are divided by the scale as stored
/// (rounded to f16), so that reading them back multiplies by the same one.
fn quantize(x: &[f32]) -> Block {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = f16::from_f32(amax / 127.0);
    let inv = if scale.to_f32() > 0.0 { 1.0 / scale.to_f32() } else { 0.0 };
    let mut q = [0i8; VALUES];
    for (q, &x) in q.iter_mut().zip(x) {
        *q = (x * inv).round().clamp(-127.0, 127.0) as i8;
    }
    let mut block = [f16::ZERO; WORDS];
    block[0] = scale;
    block[1..].copy_from_slice(&pulp::cast::<_, [f16; WORDS - 1]>(q));
    block
}

/// A block's scale.
#[inline(always)]
pub fn scale(block: &Block) -> f32 {
    block[0].to_f32()
}

/// A block's 32 bytes.
#[inline(always)]
pub fn bytes(block: &Block) -> [i8; VALUES] {
    let words: [f16; WORDS - 1] = block[1..].try_into().expect("a block's words");
    pulp::cast(words)
}

/// The block's values widened into `out` (up to 32).
#[inline(always)]
fn widen(block: &Block, out: &mut [f32]) {
    let scale = scale(block);
    for (o, q) in out.iter_mut().zip(bytes(block)) {
        *o = scale * q as f32;
    }
}

/// Values per rotated piece of a row of `d`: the largest power of two dividing `d`.
pub fn rotation_len(d: usize) -> usize {
    1 << d.trailing_zeros()
}

/// Rotates rows of `d` values (`x.len()` a multiple of `d`) in place, piece by piece (an
/// orthonormal Walsh–Hadamard transform of [`rotation_len`] values): applied twice, the rows
/// come back.
pub fn rotate(x: &mut [f32], d: usize) {
    let n = rotation_len(d);
    let norm = 1.0 / (n as f32).sqrt();
    for piece in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for pair in piece.chunks_exact_mut(2 * h) {
                let (a, b) = pair.split_at_mut(h);
                for (a, b) in a.iter_mut().zip(b) {
                    (*a, *b) = (*a + *b, *a - *b);
                }
            }
            h *= 2;
        }
        piece.iter_mut().for_each(|v| *v *= norm);
    }
}

/// Blocks of a row of `d` values.
pub fn blocks(d: usize) -> usize {
    d.div_ceil(VALUES)
}

/// 16-bit words of a row of `d` values.
pub fn row_words(d: usize) -> usize {
    blocks(d) * WORDS
}

/// The blocks the words hold (a whole number of blocks).
pub fn as_blocks(words: &[f16]) -> &[Block] {
    let (blocks, rest) = pulp::as_arrays::<WORDS, f16>(words);
    assert!(rest.is_empty(), "q8_0: {} words are not whole blocks", words.len());
    blocks
}

/// Rows of `d` values (`x.len()` a multiple of `d`), rotated, as their blocks' words.
pub fn quantize_rows(x: &[f32], d: usize) -> Vec<f16> {
    let rows = x.len() / d;
    let mut words = vec![f16::ZERO; rows * row_words(d)];
    let blocks = pulp::as_arrays_mut::<WORDS, f16>(&mut words).0;
    let mut rotated = vec![0f32; d];
    for (row, out) in x.chunks_exact(d).zip(blocks.chunks_exact_mut(self::blocks(d))) {
        rotated.copy_from_slice(row);
        rotate(&mut rotated, d);
        for (values, block) in rotated.chunks(VALUES).zip(out) {
            *block = quantize(values);
        }
    }
    words
}

/// The rows of `d` values the words hold, widened to f32 and rotated back.
pub fn dequantize_rows(words: &[f16], d: usize) -> Vec<f32> {
    let blocks = as_blocks(words);
    let rows = blocks.len() / self::blocks(d);
    let mut out = vec![0f32; rows * d];
    widen_rows(blocks, d, &mut out);
    rotate(&mut out, d);
    out
}

/// Rows of `d` values ([rows, blocks(d)] blocks) widened into `out` ([rows, d]), as stored
/// (rotated).
#[inline(always)]
pub fn widen_rows(blocks: &[Block], d: usize, out: &mut [f32]) {
    for (row, out) in blocks.chunks_exact(self::blocks(d)).zip(out.chunks_exact_mut(d)) {
        for (block, out) in row.iter().zip(out.chunks_mut(VALUES)) {
            widen(block, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotated_rows_round_trip_within_half_a_step_of_their_block() {
        for d in [8, 16, 32, 40, 64, 128] {
            let x: Vec<f32> = (0..3 * d).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013 * (1 + i / d) as f32).collect();
            let words = quantize_rows(&x, d);
            assert_eq!(words.len(), 3 * row_words(d));
            // What the blocks hold is the rotated rows, quantized.
            let mut rotated = x.clone();
            rotate(&mut rotated, d);
            let mut back = vec![0f32; x.len()];
            widen_rows(as_blocks(&words), d, &mut back);
            for (r, (row, got)) in rotated.chunks(d).zip(back.chunks(d)).enumerate() {
                for (b, (want, got)) in row.chunks(VALUES).zip(got.chunks(VALUES)).enumerate() {
                    let step = want.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    // Half a step, plus the scale's f16 rounding over 127 steps.
                    let tol = step * (0.5 + 127.0 * 2f32.powi(-11)) + 1e-7;
                    let err = want.iter().zip(got).map(|(w, g)| (w - g).abs()).fold(0f32, f32::max);
                    assert!(err <= tol, "d {d}, row {r}, block {b}: error {err} over a step of {step}");
                }
            }
            // Read back, the rows are rotated back.
            rotate(&mut back, d);
            assert_eq!(dequantize_rows(&words, d), back);
        }
    }

    #[test]
    fn a_block_lies_as_its_scale_then_its_bytes() {
        // d = 1: nothing to rotate.
        let x = [127.0f32];
        let words = quantize_rows(&x, 1);
        assert_eq!(words[0], f16::ONE, "the scale first");
        let raw: Vec<u8> = words[1..].iter().flat_map(|w| w.to_bits().to_le_bytes()).collect();
        assert_eq!(raw, [&[127u8][..], &[0; 31]].concat());
        let block = as_blocks(&words)[0];
        assert_eq!((scale(&block), bytes(&block)[0]), (1.0, 127));
        assert_eq!(quantize_rows(&[0.0; 32], 32), vec![f16::ZERO; WORDS], "a zero block is all zero");
    }

    /// The rotation is orthonormal and its own inverse, piece by piece; it spreads a lone
    /// channel over its whole piece (what a quantized block needs).
    #[test]
    fn the_rotation_keeps_dot_products_and_undoes_itself() {
        for d in [1, 16, 48, 64, 128] {
            let n = rotation_len(d);
            assert!(d.is_multiple_of(n) && (d / n) % 2 == 1, "d {d}: piece {n}");
            let x: Vec<f32> = (0..2 * d).map(|i| ((i * 29 % 53) as f32 - 26.0) * 0.1).collect();
            let y: Vec<f32> = (0..2 * d).map(|i| ((i * 17 % 31) as f32 - 15.0) * 0.2).collect();
            let (mut rx, mut ry) = (x.clone(), y.clone());
            rotate(&mut rx, d);
            rotate(&mut ry, d);
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f32>();
            assert!((dot(&x, &y) - dot(&rx, &ry)).abs() < 1e-3 * dot(&x, &x).sqrt() * dot(&y, &y).sqrt(), "d {d}");
            rotate(&mut rx, d);
            assert!(x.iter().zip(&rx).all(|(a, b)| (a - b).abs() < 1e-5), "d {d}: not its own inverse");
        }
        let mut spike = vec![0f32; 64];
        spike[5] = 8.0;
        rotate(&mut spike, 64);
        assert!(spike.iter().all(|v| (v.abs() - 1.0).abs() < 1e-6), "{spike:?}");
    }
}
