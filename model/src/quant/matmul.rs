//! `y = x·Wᵀ + b` for a packed matrix: the activations are quantized once, the panels of every
//! part are split into blocks run on the rayon pool (each block a contiguous run of panels, so
//! each thread streams its weights sequentially), and within a block the activation rows are
//! walked in chunks that stay in L2 while the block's panels pass over them.

use std::ops::Range;

use rayon::prelude::*;

use super::activation::Activations;
use super::packed::{GROUP, PANEL, PackedMatrix};
use super::{avx2, portable, vnni};
use crate::kernels::split_columns;

/// Which kernel runs the products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512 VNNI (`vpdpbusd`).
    Vnni,
    /// AVX2 (`vpmaddubsw`), for CPUs without AVX-512 VNNI.
    Avx2,
    /// Plain Rust, any CPU.
    Portable,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub fn best() -> Self {
        if vnni::available() {
            Self::Vnni
        } else if avx2::available() {
            Self::Avx2
        } else {
            Self::Portable
        }
    }
    pub fn available(self) -> bool {
        match self {
            Self::Vnni => vnni::available(),
            Self::Avx2 => avx2::available(),
            Self::Portable => true,
        }
    }
}

/// Blocks per thread: enough for the pool to balance uneven progress.
const BLOCKS_PER_THREAD: usize = 4;
/// Bytes of quantized activations walked per chunk (well inside a 1 MiB L2).
const CHUNK_BYTES: usize = 256 << 10;

/// `x·Wᵀ + b` with the best kernel.
///
/// # Shapes
/// x: [m, k], w: [n, k], bias: \[n\] → [m, n] row-major
pub fn matmul(x: &[f32], m: usize, w: &PackedMatrix, bias: Option<&[f32]>) -> Vec<f32> {
    matmul_with(Kernel::best(), x, m, w, bias)
}

/// `x·Wᵀ + b` with `kernel`. Panics if this CPU cannot run it (see [`Kernel::available`]).
pub fn matmul_with(kernel: Kernel, x: &[f32], m: usize, w: &PackedMatrix, bias: Option<&[f32]>) -> Vec<f32> {
    let (n, k) = (w.rows(), w.k());
    assert!(x.len() == m * k, "quantized x·Wᵀ: x has {} values for [{m}, {k}]", x.len());
    assert!(bias.is_none_or(|b| b.len() == n), "quantized x·Wᵀ: bias size does not match the outputs");
    let mut out = vec![0.0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    // The AVX2 kernel multiplies K-quants' sub-block scales into the integer sums, which needs
    // one activation scale per super-block.
    let shared = match kernel == Kernel::Avx2 && w.parts.iter().all(|p| p.layout.ty.is_k()) {
        true => w.parts[0].layout.groups,
        false => 1,
    };
    let acts = Activations::quantize(x, m, k, w.padded_k() / GROUP, shared);
    let blocks = blocks(w);
    let columns: Vec<Range<usize>> = blocks.iter().map(|b| b.columns.clone()).collect();
    let pieces = split_columns(&mut out, n, &columns);
    let chunk_rows = (CHUNK_BYTES / (acts.groups * (GROUP + 16))).clamp(8, 256);
    blocks.into_par_iter().zip(pieces).for_each(|(block, mut rows)| {
        let part = &w.parts[block.part];
        let bias = bias.map(|b| &b[block.columns.start..block.columns.end]);
        for x0 in (0..m).step_by(chunk_rows) {
            let x_rows = x0..(x0 + chunk_rows).min(m);
            let out = &mut rows[x_rows.clone()];
            match kernel {
                Kernel::Vnni => vnni::run(part, block.panels.clone(), &acts, x_rows, out, bias),
                Kernel::Avx2 => avx2::run(part, block.panels.clone(), &acts, x_rows, out, bias),
                Kernel::Portable => portable::run(part, block.panels.clone(), &acts, x_rows, out, bias),
            }
        }
    });
    out
}

/// A run of panels of one part, and the output columns they fill.
struct Block {
    part: usize,
    panels: Range<usize>,
    columns: Range<usize>,
}

/// The panels of every part split into blocks, in column order.
fn blocks(w: &PackedMatrix) -> Vec<Block> {
    let total: usize = w.parts.iter().map(|p| p.panels()).sum();
    let target = (rayon::current_num_threads() * BLOCKS_PER_THREAD).max(1);
    let mut blocks = Vec::new();
    for (i, part) in w.parts.iter().enumerate() {
        let panels = part.panels();
        let n_blocks = (panels * target).div_ceil(total).max(1);
        let step = panels.div_ceil(n_blocks).max(1);
        for p0 in (0..panels).step_by(step) {
            let p1 = (p0 + step).min(panels);
            let columns = part.col0 + p0 * PANEL..part.col0 + (p1 * PANEL).min(part.rows);
            blocks.push(Block { part: i, panels: p0..p1, columns });
        }
    }
    blocks
}

#[cfg(test)]
mod tests;
