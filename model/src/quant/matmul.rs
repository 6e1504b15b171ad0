//! `y = x·Wᵀ + b` for a packed matrix: the activations are quantized once, the panels of every
//! part are split into blocks run on the rayon pool (each block a contiguous run of panels, so
//! each thread streams its weights sequentially), and within a block the activation rows are
//! walked in chunks that stay in L2 while the block's panels pass over them.

use std::ops::Range;

use rayon::prelude::*;

use super::QuantType;
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

    /// The kernel that runs a product of `m` rows by `w` where this one is asked for: itself,
    /// but for a one-row product (batch-1 decode) all in Q6_K (a Q4_K_M file's output head and
    /// its Q6_K down projections) on a CPU that runs 512-bit instructions as two halves (Zen 4),
    /// which streams from memory faster on the AVX2 kernel: 35.6 against 28.1 GB/s for a
    /// 151,936 × 1,536 head (quant_bench, 2 threads, medians of 4 interleaved runs; at 2 rows
    /// 33.8 against 32.0, at 4 the VNNI kernel leads, 26.4 against 22.8). (The VNNI kernel also
    /// hands the parts in Q2_K and Q3_K to the AVX2 one; such products count as its own.)
    pub fn for_product(self, w: &PackedMatrix, m: usize) -> Self {
        let q6k = w.parts.iter().all(|part| part.layout.ty == QuantType::Q6K);
        match self {
            Self::Vnni if m == 1 && q6k && vnni::halves_512() => Self::Avx2,
            kernel => kernel,
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
    let mut outs = matmul_each(kernel, &[Product { x, m, w, bias }]);
    outs.pop().expect("one product, one output")
}

/// One product of [`matmul_each`]: `x·Wᵀ + b`.
///
/// # Shapes
/// x: [m, k], w: [n, k], bias: \[n\] → [m, n] row-major
#[derive(Clone, Copy)]
pub struct Product<'a> {
    pub x: &'a [f32],
    pub m: usize,
    pub w: &'a PackedMatrix,
    pub bias: Option<&'a [f32]>,
}

/// Several products in one parallel loop over all their weights' blocks, each output as
/// [`matmul_with`] gives it. A decode step's experts are small matrices (under 2 MiB each):
/// run one by one, each pays for the pool's fork and join, and each thread's weight stream stops
/// and restarts at every product's end; together, the threads stream the experts back to back.
/// Panics if this CPU cannot run `kernel` (see [`Kernel::available`]).
pub fn matmul_each(kernel: Kernel, products: &[Product<'_>]) -> Vec<Vec<f32>> {
    for &Product { x, m, w, bias } in products {
        let k = w.k();
        assert!(x.len() == m * k, "quantized x·Wᵀ: x has {} values for [{m}, {k}]", x.len());
        assert!(bias.is_none_or(|b| b.len() == w.rows()), "quantized x·Wᵀ: bias size does not match the outputs");
    }
    let mut outs: Vec<Vec<f32>> = products.iter().map(|p| vec![0.0f32; p.m * p.w.rows()]).collect();
    let kernels: Vec<Kernel> = products.iter().map(|p| kernel.for_product(p.w, p.m)).collect();
    // Each product's activations, quantized once for the products that share an input and a
    // quantization (a decode step's experts all read the same row into their gate/up products).
    let mut quantized: Vec<Quantized<'_>> = Vec::new();
    let mut acts_of = Vec::with_capacity(products.len());
    for (&Product { x, m, w, .. }, &kernel) in products.iter().zip(&kernels) {
        // The AVX2 kernel multiplies K-quants' sub-block scales into the integer sums, which
        // needs one activation scale per super-block.
        let shared = match kernel == Kernel::Avx2 && w.parts.iter().all(|p| p.layout.ty.is_k()) {
            true => w.parts[0].layout.groups,
            false => 1,
        };
        let (k, groups) = (w.k(), w.padded_k() / GROUP);
        let same = |q: &Quantized<'_>| std::ptr::eq(q.x, x) && (q.k, q.groups, q.shared) == (k, groups, shared);
        let at = quantized.iter().position(same).unwrap_or_else(|| {
            quantized.push(Quantized { x, k, groups, shared, acts: Activations::quantize(x, m, k, groups, shared) });
            quantized.len() - 1
        });
        acts_of.push(at);
    }
    let blocks = blocks(products);
    let mut tasks = Vec::with_capacity(blocks.len());
    for (i, out) in outs.iter_mut().enumerate() {
        let mine: Vec<&Block> = blocks.iter().filter(|b| b.product == i).collect();
        let columns: Vec<Range<usize>> = mine.iter().map(|b| b.columns.clone()).collect();
        tasks.extend(mine.into_iter().zip(split_columns(out, products[i].w.rows(), &columns)));
    }
    tasks.into_par_iter().for_each(|(block, mut rows)| {
        let Product { m, w, bias, .. } = products[block.product];
        let kernel = kernels[block.product];
        let acts = &quantized[acts_of[block.product]].acts;
        let part = &w.parts[block.part];
        let bias = bias.map(|b| &b[block.columns.start..block.columns.end]);
        let chunk_rows = (CHUNK_BYTES / (acts.groups * (GROUP + 16))).clamp(8, 256);
        for x0 in (0..m).step_by(chunk_rows) {
            let x_rows = x0..(x0 + chunk_rows).min(m);
            let out = &mut rows[x_rows.clone()];
            match kernel {
                Kernel::Vnni if vnni::runs(part.layout.ty) => {
                    vnni::run(part, block.panels.clone(), acts, x_rows, out, bias)
                }
                Kernel::Vnni | Kernel::Avx2 => avx2::run(part, block.panels.clone(), acts, x_rows, out, bias),
                Kernel::Portable => portable::run(part, block.panels.clone(), acts, x_rows, out, bias),
            }
        }
    });
    outs
}

/// One input's activations as [`matmul_each`] quantized them, with what they were quantized for.
struct Quantized<'a> {
    x: &'a [f32],
    k: usize,
    groups: usize,
    shared: usize,
    acts: Activations,
}

/// A run of panels of one part of one product's weight, and the output columns they fill.
struct Block {
    product: usize,
    part: usize,
    panels: Range<usize>,
    columns: Range<usize>,
}

/// The panels of every part of every product split into blocks, in each product's column order:
/// about [`BLOCKS_PER_THREAD`] a thread in all, shared out by each part's work (its panels times
/// its product's rows), and at least one a part. A product without rows or outputs has none.
fn blocks(products: &[Product<'_>]) -> Vec<Block> {
    let work = |p: &Product<'_>, panels: usize| panels * p.m;
    let total: usize = products.iter().flat_map(|p| p.w.parts.iter().map(move |part| work(p, part.panels()))).sum();
    let target = (rayon::current_num_threads() * BLOCKS_PER_THREAD).max(1);
    let mut blocks = Vec::new();
    for (product, p) in products.iter().enumerate() {
        for (i, part) in p.w.parts.iter().enumerate() {
            let panels = part.panels();
            if p.m == 0 || panels == 0 {
                continue;
            }
            let n_blocks = (work(p, panels) * target).div_ceil(total).max(1);
            let step = panels.div_ceil(n_blocks).max(1);
            for p0 in (0..panels).step_by(step) {
                let p1 = (p0 + step).min(panels);
                let columns = part.col0 + p0 * PANEL..part.col0 + (p1 * PANEL).min(part.rows);
                blocks.push(Block { product, part: i, panels: p0..p1, columns });
            }
        }
    }
    blocks
}

#[cfg(test)]
mod tests;
