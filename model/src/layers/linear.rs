//! A linear layer `y = x·Wᵀ + b` over a weight matrix that is one trait, `LinearWeight`, chosen at
//! load for the weight's storage and device (as mistral.rs's `QuantMethod`): dense on the CPU
//! backend (our few-row kernels, the backend's GEMM for many rows), dense on any other Burn
//! backend (a GPU; in row parts where it passes the device's largest buffer), packed-quantized
//! (the CPU's quantized kernels), or quantized in its ggml blocks on a GPU (`quant::device`).
//! Each implementation picks its kernel when it is made, not per call, and counts the products
//! it runs by kernel (`kernels::calls`), so which kernel ran is observable in `/metrics` and
//! asserted in tests.

use std::fmt;
use std::ops::Range;
use std::slice;
use std::sync::Arc;

use burn::tensor::{DType, Device, FloatDType, Int, Tensor, TensorData};

use super::{RmsNorm, swiglu};
pub use crate::kernels::Pre;
use crate::kernels::{self, GemmIsa, KernelCall};
use crate::quant::device::{DeviceRows, part_rows};
use crate::quant::{self, PackedMatrix, QuantType};

/// A weight matrix [out, in] (the checkpoint's layout) and how it multiplies. Clones share the
/// storage.
pub type Weight = Arc<dyn LinearWeight>;

/// What a linear layer's weight does, whatever its storage and device.
pub trait LinearWeight: fmt::Debug + Send + Sync {
    /// [out, in]
    fn dims(&self) -> [usize; 2];

    /// `x·Wᵀ + b`.
    ///
    /// # Shapes
    /// x: [n, in] f32, bias: \[out\] f32 → [n, out] f32
    fn forward(&self, x: Tensor<2>, bias: Option<&Tensor<1>>) -> Tensor<2>;

    /// `pre(x)·Wᵀ + b (+ residual)`: the input's norm or gate before the product and a residual
    /// connection after it, in one kernel where the weight's device has one, else apart.
    ///
    /// # Shapes
    /// x: [n, in] f32 ([n, 2 · in] under `Pre::Gated`), bias: \[out\] f32, residual: [n, out]
    /// f32 → [n, out] f32
    fn forward_with(
        &self,
        x: Tensor<2>,
        pre: Pre<'_>,
        bias: Option<&Tensor<1>>,
        residual: Option<Tensor<2>>,
    ) -> Tensor<2> {
        add_residual(self.forward(pre.apply(x), bias), residual)
    }

    /// Rows `ids` as f32 (an embedding lookup).
    ///
    /// # Shapes
    /// ids: \[n\] → [n, in]
    fn rows(&self, ids: &[u32], device: &Device) -> Tensor<2>;

    /// Rows `ids` as f32, the ids on the device already (a replayed step's input), every tensor
    /// made on the way held for a recording under way (`graph::hold`): `None` where the weight
    /// has no such path (the CPU's blocks, a kernel that declines).
    ///
    /// # Shapes
    /// ids: \[n\] → [n, in]
    fn rows_at(&self, _ids: &Tensor<1, Int>) -> Option<Tensor<2>> {
        None
    }

    /// The kernel a few-row product (a decode step) runs on (products of more rows, prefill's or
    /// a batched step's, may run `gemm_avx512` or `gemm_avx2`): `xwt`, `burn_split`, `burn`,
    /// `quant_vnni`, `quant_avx2`, `quant_portable`.
    fn kernel(&self) -> &'static str;

    /// How it is stored, for logs: `bf16`, `Q5_0+Q8_0`.
    fn describe(&self) -> String;

    /// Bytes held.
    fn size_bytes(&self) -> usize;

    /// The matrix itself, for what is done at load only (stacking, replacing rows).
    fn matrix(&self) -> Matrix<'_>;
}

/// A weight's storage.
pub enum Matrix<'a> {
    /// A Burn tensor (f32, f16 or bf16) on its device.
    Dense(&'a Tensor<2>),
    /// A dense matrix larger than its device's largest buffer: row parts that fit it, stacked in
    /// order.
    DenseParts(&'a [Tensor<2>]),
    /// Quantized blocks in the layout the CPU kernels stream.
    Packed(&'a Arc<PackedMatrix>),
    /// Quantized blocks on a GPU, in parts of one format each (stacked in order), and the dense
    /// type its many-row products dequantize it to.
    Blocks(&'a [DeviceRows], DType),
}

impl<'a> Matrix<'a> {
    /// This matrix as the GPU's few-row products read it; `None` for the CPU's packed blocks.
    pub fn gpu(self) -> Option<kernels::GpuWeight<'a>> {
        match self {
            Matrix::Dense(w) => Some(kernels::GpuWeight::Dense(w)),
            Matrix::Blocks(parts, _) => Some(kernels::GpuWeight::Blocks(parts)),
            Matrix::Packed(_) | Matrix::DenseParts(_) => None,
        }
    }
}

/// A dense matrix's weight for its device: the CPU kernels on the CPU backend, Burn's ops
/// elsewhere.
pub fn dense(w: Tensor<2>) -> Weight {
    let cpu = (w.device() == Device::flex()).then(|| CpuKernels {
        avx512: kernels::xwt_avx512(),
        xwt: kernels::xwt_available(),
        gemm: [GemmIsa::Avx512, GemmIsa::Avx2].into_iter().find(|isa| isa.available()),
        bf16dot: kernels::bf16dot_outpaces_fma(),
    });
    Arc::new(Dense { w, cpu })
}

/// A dense matrix of `dtype` on `device` from `data` ([out, in], any float type): one tensor
/// where it fits the device's largest buffer, else in row parts that do ([`dense_parts`]).
pub fn dense_fitting(data: TensorData, dtype: DType, device: &Device) -> Weight {
    let row = (data.shape()[1] * dtype.size()).max(1) as u64;
    let rows = usize::try_from(kernels::buffer_limit(device) / row).unwrap_or(usize::MAX).max(1);
    dense_parts(data, dtype, device, rows)
}

/// A dense matrix of `dtype` on `device` from `data` ([out, in], any float type), in parts of at
/// most `rows` rows (at least one): one tensor where the matrix has no more.
pub fn dense_parts(data: TensorData, dtype: DType, device: &Device, rows: usize) -> Weight {
    let (out, rows) = (data.shape()[0], rows.max(1));
    if out <= rows {
        return dense(Tensor::from_data(data, (device, dtype)));
    }
    let parts = (0..out)
        .step_by(rows)
        .map(|start| Tensor::from_data(data_rows(&data, start..(start + rows).min(out)), (device, dtype)))
        .collect();
    in_parts(parts)
}

/// Rows `rows` of a matrix's values ([out, in]).
fn data_rows(data: &TensorData, rows: Range<usize>) -> TensorData {
    let k = data.shape()[1];
    let width = k * data.dtype().size();
    let bytes = data.as_bytes()[rows.start * width..rows.end * width].to_vec();
    TensorData::from_bytes_vec(bytes, [rows.len(), k], data.dtype())
}

/// Dense row parts stacked in order as one weight (the one part's own weight where there is one).
fn in_parts(mut tensors: Vec<Tensor<2>>) -> Weight {
    if tensors.len() == 1 {
        return dense(tensors.remove(0));
    }
    let parts = tensors.iter().map(|t| dense(t.clone())).collect();
    Arc::new(DenseParts { tensors, parts })
}

/// Dense matrices of one width stacked row-wise: one tensor where the stack fits the device's
/// largest buffer, else neighbours joined into parts that do.
fn stacked_dense(pieces: Vec<Tensor<2>>) -> Weight {
    let limit = kernels::buffer_limit(&pieces[0].device());
    let bytes = |t: &Tensor<2>| (t.shape().num_elements() * t.dtype().size()) as u64;
    let mut groups: Vec<(u64, Vec<Tensor<2>>)> = Vec::new();
    for t in pieces {
        match groups.last_mut() {
            Some((size, group)) if *size + bytes(&t) <= limit => {
                *size += bytes(&t);
                group.push(t);
            }
            _ => groups.push((bytes(&t), vec![t])),
        }
    }
    in_parts(groups.into_iter().map(|(_, g)| if g.len() == 1 { g[0].clone() } else { Tensor::cat(g, 0) }).collect())
}

/// A dense weight's tensors, in row order (`None` for quantized weights).
fn dense_pieces(w: &Weight) -> Option<Vec<Tensor<2>>> {
    match w.matrix() {
        Matrix::Dense(t) => Some(vec![t.clone()]),
        Matrix::DenseParts(parts) => Some(parts.to_vec()),
        Matrix::Packed(_) | Matrix::Blocks(..) => None,
    }
}

/// Ids for a row lookup on `device`.
fn ids_on(ids: &[u32], device: &Device) -> Tensor<1, Int> {
    let ids: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let n = ids.len();
    crate::transfers::upload(TensorData::new(ids, [n]), device)
}

/// A packed quantized matrix's weight (the CPU backend), on the fastest kernel this CPU runs.
pub fn packed(w: Arc<PackedMatrix>) -> Weight {
    Arc::new(Packed { w, kernel: quant::Kernel::best() })
}

/// A quantized matrix on a GPU, in its ggml blocks (parts of one format each, stacked in row
/// order), with the dense type its many-row products dequantize it to.
pub fn blocks(parts: Vec<DeviceRows>, dense: DType) -> Weight {
    assert!(!parts.is_empty() && parts.iter().all(|p| p.k == parts[0].k), "parts of one matrix share their width");
    Arc::new(Blocks { parts, dense })
}

/// Few-row products with at least this many outputs are split across threads when the CPU has
/// no AVX-512 for the kernel.
const SPLIT_MAX_ROWS: usize = 4;
const SPLIT_MIN_OUT: usize = 256;

/// x·Wᵀ with Burn's matmul: f32, or the weight's 16-bit type for 16-bit weights (activations
/// rounded to it) unless `widen`, where the weight is widened to f32 for the product.
fn burn_product(x: Tensor<2>, weight: Tensor<2>, widen: bool) -> Tensor<2> {
    match weight.dtype() {
        DType::F16 | DType::BF16 if widen => x.matmul(weight.cast(FloatDType::F32).transpose()),
        DType::F16 => x.cast(FloatDType::F16).matmul(weight.transpose()).cast(FloatDType::F32),
        DType::BF16 => x.cast(FloatDType::BF16).matmul(weight.transpose()).cast(FloatDType::F32),
        _ => x.matmul(weight.transpose()),
    }
}

fn add_residual(y: Tensor<2>, residual: Option<Tensor<2>>) -> Tensor<2> {
    match residual {
        Some(r) => r + y,
        None => y,
    }
}

impl Pre<'_> {
    /// The input as the product reads it: normed, gated, or as it is (the layers' own kernels or
    /// Burn's ops, where a product's kernel does not take it in).
    ///
    /// # Shapes
    /// x: [n, k] ([n, 2k] under `Gated`) → [n, k]
    pub fn apply(self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Pre::Plain => x,
            Pre::Norm { weight, eps } => RmsNorm { weight: weight.clone(), eps }.forward(x),
            Pre::Gated(act) => swiglu(x, act),
        }
    }
}

fn add_bias(y: Tensor<2>, bias: Option<&Tensor<1>>) -> Tensor<2> {
    match bias {
        Some(b) => y + b.clone().unsqueeze::<2>(),
        None => y,
    }
}

/// A dense matrix (checkpoint layout, `[out, in]`: faster than a pre-transposed weight for
/// the few-row products of decoding) on the CPU backend, or on another Burn backend (a GPU).
#[derive(Debug)]
struct Dense {
    w: Tensor<2>,
    /// On the CPU backend: what this CPU runs.
    cpu: Option<CpuKernels>,
}

#[derive(Debug, Clone, Copy)]
struct CpuKernels {
    /// AVX-512: every 16-bit product (any row count) runs the `xwt` kernel too.
    avx512: bool,
    /// Few-row products run the `xwt` kernel (AVX-512, or AVX2 with FMA and F16C).
    xwt: bool,
    /// The packed GEMM's instructions (`kernels::gemm_linear`): on AVX-512, 16-bit products of
    /// more than `XWT_MAX_ROWS` rows; on AVX2 alone, products of more than `XWT_AVX2_MAX_ROWS`
    /// rows (f32 weights up to `XWT_MAX_ROWS` rows, 16-bit ones at any count).
    gemm: Option<GemmIsa>,
    /// AVX512-BF16 where `vdpbf16ps` outpaces f32 FMAs (AMD's Zen 4 and 5; not Intel's Xeons):
    /// bf16 products of more than `XWT_MAX_ROWS` rows run `bf16dot` instead of the GEMM.
    bf16dot: bool,
}

impl CpuKernels {
    /// The GEMM's instructions where a product of `m` rows of a weight of `dtype` runs on it.
    fn gemm_for(&self, m: usize, dtype: DType) -> Option<GemmIsa> {
        let many_rows = m > kernels::XWT_MAX_ROWS;
        let sixteen_bits = matches!(dtype, DType::F16 | DType::BF16);
        self.gemm.filter(|isa| match isa {
            GemmIsa::Avx512 => many_rows && sixteen_bits,
            GemmIsa::Avx2 => m > kernels::XWT_AVX2_MAX_ROWS && (sixteen_bits || !many_rows),
        })
    }
}

impl Dense {
    /// On another device (a GPU): its few-row kernel where it runs, else Burn's matmul.
    fn device_forward(
        &self,
        x: Tensor<2>,
        pre: Pre<'_>,
        bias: Option<&Tensor<1>>,
        residual: Option<Tensor<2>>,
    ) -> Tensor<2> {
        if let Some(y) = kernels::gpu_xwt(&x, pre, &self.w, bias, residual.as_ref()) {
            KernelCall::CubeXwt.count();
            return y;
        }
        KernelCall::Burn.count();
        add_residual(add_bias(burn_product(pre.apply(x), self.w.clone(), false), bias), residual)
    }

    /// On the CPU: our kernels where they apply, else the backend's GEMM.
    fn cpu_forward(&self, cpu: CpuKernels, x: Tensor<2>, bias: Option<&Tensor<1>>) -> Tensor<2> {
        let [m, _] = x.dims();
        let [out, _] = self.w.dims();
        let dtype = self.w.dtype();
        let many_rows = m > kernels::XWT_MAX_ROWS;
        let gemm = cpu.gemm_for(m, dtype);
        if (cpu.avx512 && !(many_rows && dtype == DType::F32)) || (cpu.xwt && !many_rows) || gemm.is_some() {
            let product = match gemm {
                _ if many_rows && dtype == DType::BF16 && cpu.bf16dot => kernels::bf16dot_linear(&x, &self.w, bias),
                Some(isa) => kernels::gemm_linear(isa, &x, &self.w, bias),
                None => kernels::xwt_linear(&x, &self.w, bias),
            };
            if let Some(y) = product {
                return y;
            }
            // The kernel takes every input the model gives it: a refusal is a bug, counted.
            KernelCall::Fallback.count();
        }
        // Few-row products compute with f32 activations, as the `xwt` kernel does: rounding a
        // decode step's activations to 16 bits moved tiny-bf16's logits by 0.56 (against 1e-3).
        let widen = !many_rows;
        let y = if !cpu.xwt && m <= SPLIT_MAX_ROWS && out >= SPLIT_MIN_OUT && rayon::current_num_threads() > 1 {
            // The CPU backend runs few-row products on one thread, which streams the weight at
            // one core's memory bandwidth. Two halves of the rows on two threads stream it at
            // the machine's.
            KernelCall::BurnSplit.count();
            let half = out / 2;
            let (a, b) = rayon::join(
                || burn_product(x.clone(), self.w.clone().narrow(0, 0, half), widen),
                || burn_product(x.clone(), self.w.clone().narrow(0, half, out - half), widen),
            );
            Tensor::cat(vec![a, b], 1)
        } else {
            KernelCall::Burn.count();
            burn_product(x, self.w.clone(), widen)
        };
        add_bias(y, bias)
    }
}

impl LinearWeight for Dense {
    fn dims(&self) -> [usize; 2] {
        self.w.dims()
    }

    fn forward(&self, x: Tensor<2>, bias: Option<&Tensor<1>>) -> Tensor<2> {
        match self.cpu {
            Some(cpu) => self.cpu_forward(cpu, x, bias),
            None => self.device_forward(x, Pre::Plain, bias, None),
        }
    }

    fn forward_with(
        &self,
        x: Tensor<2>,
        pre: Pre<'_>,
        bias: Option<&Tensor<1>>,
        residual: Option<Tensor<2>>,
    ) -> Tensor<2> {
        match self.cpu {
            Some(cpu) => add_residual(self.cpu_forward(cpu, pre.apply(x), bias), residual),
            None => self.device_forward(x, pre, bias, residual),
        }
    }

    fn rows(&self, ids: &[u32], device: &Device) -> Tensor<2> {
        self.rows_at(&ids_on(ids, device)).expect("a dense weight gathers its rows")
    }

    fn rows_at(&self, ids: &Tensor<1, Int>) -> Option<Tensor<2>> {
        let rows = self.w.clone().select(0, ids.clone());
        kernels::graph::hold(&rows);
        let rows = rows.cast(FloatDType::F32);
        kernels::graph::hold(&rows);
        Some(rows)
    }

    /// `burn_split` runs few-row products with at least 256 outputs; fewer take `burn`.
    fn kernel(&self) -> &'static str {
        match self.cpu {
            Some(CpuKernels { xwt: true, .. }) => KernelCall::Xwt.name(),
            Some(_) => KernelCall::BurnSplit.name(),
            None if kernels::GPU_KERNELS => KernelCall::CubeXwt.name(),
            None => KernelCall::Burn.name(),
        }
    }

    fn describe(&self) -> String {
        format!("{:?}", self.w.dtype()).to_ascii_lowercase()
    }

    fn size_bytes(&self) -> usize {
        self.w.shape().num_elements() * self.w.dtype().size()
    }

    fn matrix(&self) -> Matrix<'_> {
        Matrix::Dense(&self.w)
    }
}

/// A dense matrix on a GPU larger than the device's largest buffer, in row parts that fit it
/// (Qwen's embedding and output matrix in f32, 544 MB, on Mesa's llvmpipe, whose buffers hold
/// 128 MiB): a product a part, their outputs side by side; a row lookup gathers from every part
/// and keeps each row from the part that holds it.
#[derive(Debug)]
struct DenseParts {
    tensors: Vec<Tensor<2>>,
    /// Each of `tensors` as a weight (sharing its buffer).
    parts: Vec<Weight>,
}

impl LinearWeight for DenseParts {
    fn dims(&self) -> [usize; 2] {
        [self.parts.iter().map(|p| p.dims()[0]).sum(), self.parts[0].dims()[1]]
    }

    fn forward(&self, x: Tensor<2>, bias: Option<&Tensor<1>>) -> Tensor<2> {
        let outputs: Vec<Tensor<2>> = self.parts.iter().map(|p| p.forward(x.clone(), None)).collect();
        outputs.iter().for_each(kernels::graph::hold);
        let y = Tensor::cat(outputs, 1);
        kernels::graph::hold(&y);
        add_bias(y, bias)
    }

    fn rows(&self, ids: &[u32], device: &Device) -> Tensor<2> {
        self.rows_at(&ids_on(ids, device)).expect("dense parts gather their rows")
    }

    fn rows_at(&self, ids: &Tensor<1, Int>) -> Option<Tensor<2>> {
        use kernels::graph::hold;
        let ([n], k) = (ids.dims(), self.dims()[1]);
        let mut out: Option<Tensor<2>> = None;
        let mut start = 0i64;
        for part in &self.parts {
            let len = part.dims()[0] as i64;
            // Every id's row of this part, clamped into it; kept where the id is in the part.
            let shifted = ids.clone().sub_scalar(start);
            hold(&shifted);
            let local = shifted.clamp(0, len - 1);
            hold(&local);
            let rows = part.rows_at(&local)?;
            out = Some(match out {
                None => rows,
                Some(out) => {
                    let (from, below) = (ids.clone().greater_equal_elem(start), ids.clone().lower_elem(start + len));
                    hold(&from);
                    hold(&below);
                    let inside = from.bool_and(below);
                    hold(&inside);
                    let kept = out.mask_where(inside.unsqueeze_dim::<2>(1).expand([n, k]), rows);
                    hold(&kept);
                    kept
                }
            });
            start += len;
        }
        out
    }

    fn kernel(&self) -> &'static str {
        self.parts[0].kernel()
    }

    fn describe(&self) -> String {
        format!("{} in {} parts", self.parts[0].describe(), self.parts.len())
    }

    fn size_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.size_bytes()).sum()
    }

    fn matrix(&self) -> Matrix<'_> {
        Matrix::DenseParts(&self.tensors)
    }
}

/// A packed quantized matrix on the CPU backend.
#[derive(Debug)]
struct Packed {
    w: Arc<PackedMatrix>,
    kernel: quant::Kernel,
}

impl LinearWeight for Packed {
    fn dims(&self) -> [usize; 2] {
        [self.w.rows(), self.w.k()]
    }

    fn forward(&self, x: Tensor<2>, bias: Option<&Tensor<1>>) -> Tensor<2> {
        packed_call(self.kernel.for_product(&self.w, x.dims()[0])).count();
        kernels::quantized_linear(&x, &self.w, self.kernel, bias)
    }

    fn rows(&self, ids: &[u32], device: &Device) -> Tensor<2> {
        let (n, k) = (ids.len(), self.w.k());
        let mut out = vec![0.0f32; n * k];
        for (row, &id) in out.chunks_exact_mut(k.max(1)).zip(ids) {
            self.w.dequantize_row(id as usize, row);
        }
        Tensor::from_data(TensorData::new(out, [n, k]), device)
    }

    fn kernel(&self) -> &'static str {
        packed_call(self.kernel).name()
    }

    fn describe(&self) -> String {
        let mut names: Vec<&str> = self.w.formats().iter().map(|(q, _)| q.name()).collect();
        names.dedup();
        names.join("+")
    }

    fn size_bytes(&self) -> usize {
        self.w.size_bytes()
    }

    fn matrix(&self) -> Matrix<'_> {
        Matrix::Packed(&self.w)
    }
}

/// The call a packed product counts as.
fn packed_call(kernel: quant::Kernel) -> KernelCall {
    match kernel {
        quant::Kernel::Vnni => KernelCall::QuantVnni,
        quant::Kernel::Avx2 => KernelCall::QuantAvx2,
        quant::Kernel::Portable => KernelCall::QuantPortable,
    }
}

/// `xᵢ·Wᵢᵀ` for several products in one parallel loop of the CPU's packed kernels
/// ([`quant::matmul_each`]): the experts of a decode step, their biases added by the kernels
/// (gpt-oss's). `None`, with nothing run, unless every weight is a packed matrix (the CPU
/// backend's quantized weights).
///
/// # Shapes
/// each x: [m, in] row-major (m = x.len() / in) → [m, out] row-major
pub fn packed_products(products: &[(&Linear, &[f32])]) -> Option<Vec<Vec<f32>>> {
    let kernel = quant::Kernel::best();
    let mut biases: Vec<Option<Vec<f32>>> = Vec::with_capacity(products.len());
    for (linear, _) in products {
        biases.push(match &linear.bias {
            Some(b) => Some(crate::transfers::read(b.clone()).ok()?),
            None => None,
        });
    }
    let products: Vec<quant::Product<'_>> = products
        .iter()
        .zip(&biases)
        .map(|(&(linear, x), bias)| match linear.weight.matrix() {
            Matrix::Packed(w) => Some(quant::Product { x, m: x.len() / w.k().max(1), w, bias: bias.as_deref() }),
            _ => None,
        })
        .collect::<Option<_>>()?;
    for p in &products {
        packed_call(kernel.for_product(p.w, p.m)).count();
    }
    Some(quant::matmul_each(kernel, &products))
}

/// A quantized matrix on a GPU, kept in its ggml blocks (`quant::device`, within 6% of the
/// file's size): a decode step's few-row products read the blocks in the product kernel
/// (`cube_xwt_q`); more rows (prefill) dequantize them on the device to `dense` (16 bits where
/// the device has them) for Burn's matmul, as a dense weight of that type would run.
#[derive(Debug)]
struct Blocks {
    parts: Vec<DeviceRows>,
    dense: DType,
}

impl Blocks {
    fn k(&self) -> usize {
        self.parts[0].k
    }
}

/// A matrix in blocks on a GPU as `dtype`, dequantized there.
fn dequantized(parts: &[DeviceRows], dtype: DType) -> Tensor<2> {
    // Blocks are only made where the kernels run (`kernels::blocks_run_on`): a refusal is a bug.
    kernels::gpu_dequantize(parts, parts[0].k, None, dtype).expect("the device dequantizes its blocks")
}

impl LinearWeight for Blocks {
    fn dims(&self) -> [usize; 2] {
        [self.parts.iter().map(DeviceRows::rows).sum(), self.k()]
    }

    fn forward(&self, x: Tensor<2>, bias: Option<&Tensor<1>>) -> Tensor<2> {
        self.forward_with(x, Pre::Plain, bias, None)
    }

    fn forward_with(
        &self,
        x: Tensor<2>,
        pre: Pre<'_>,
        bias: Option<&Tensor<1>>,
        residual: Option<Tensor<2>>,
    ) -> Tensor<2> {
        if let Some(y) = kernels::gpu_xwt_q(&x, pre, &self.parts, self.k(), bias, residual.as_ref()) {
            KernelCall::CubeXwtQ.count();
            return y;
        }
        KernelCall::Burn.count();
        let x = pre.apply(x);
        let [rows, k] = self.dims();
        let y = if (rows * k * self.dense.size()) as u64 <= kernels::buffer_limit(&x.device()) {
            burn_product(x, dequantized(&self.parts, self.dense), false)
        } else {
            // Dequantized whole, the matrix would not fit one buffer: a product a part.
            let parts =
                self.parts.iter().map(|p| burn_product(x.clone(), dequantized(slice::from_ref(p), self.dense), false));
            Tensor::cat(parts.collect(), 1)
        };
        add_residual(add_bias(y, bias), residual)
    }

    fn rows(&self, ids: &[u32], device: &Device) -> Tensor<2> {
        let n = ids.len();
        let ids: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
        let ids: Tensor<1, Int> = crate::transfers::upload(TensorData::new(ids, [n]), device);
        // Where the kernel declines: gathered from the whole matrix.
        self.rows_at(&ids).unwrap_or_else(|| dequantized(&self.parts, DType::F32).select(0, ids))
    }

    fn rows_at(&self, ids: &Tensor<1, Int>) -> Option<Tensor<2>> {
        kernels::gpu_dequantize(&self.parts, self.k(), Some(ids), DType::F32)
    }

    fn kernel(&self) -> &'static str {
        KernelCall::CubeXwtQ.name()
    }

    fn describe(&self) -> String {
        let mut names: Vec<&str> = self.parts.iter().map(|p| p.ty.name()).collect();
        names.dedup();
        names.join("+")
    }

    fn size_bytes(&self) -> usize {
        self.parts.iter().map(DeviceRows::size_bytes).sum()
    }

    fn matrix(&self) -> Matrix<'_> {
        Matrix::Blocks(&self.parts, self.dense)
    }
}

/// Quantized format for a dense part stacked with quantized ones.
const FALLBACK_QUANT: QuantType = QuantType::Q8_0;

/// The matrices stacked row-wise (one product per shared input). Dense ones stay one dense
/// tensor; packed ones keep their formats as parts, and so do blocks on a GPU; a dense matrix
/// stacked with quantized ones is quantized to Q8_0.
pub fn stack(weights: Vec<Weight>) -> Weight {
    let dense: Option<Vec<Vec<Tensor<2>>>> = weights.iter().map(dense_pieces).collect();
    if let Some(dense) = dense {
        return stacked_dense(dense.concat());
    }
    let on_gpu = weights.iter().find_map(|w| match w.matrix() {
        Matrix::Blocks(_, dtype) => Some(dtype),
        _ => None,
    });
    if let Some(dtype) = on_gpu {
        let parts: Option<Vec<DeviceRows>> = weights
            .iter()
            .map(|w| match w.matrix() {
                Matrix::Blocks(parts, _) => Some(parts.to_vec()),
                Matrix::Dense(_) | Matrix::DenseParts(_) => dense_pieces(w)?
                    .into_iter()
                    .map(|t| device_rows(t, FALLBACK_QUANT, dtype))
                    .collect::<Option<Vec<_>>>()
                    .map(|parts| parts.concat()),
                Matrix::Packed(_) => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(|parts| parts.concat());
        return match parts {
            Some(parts) => blocks(merged(parts, dtype), dtype),
            // A dense part whose rows are not whole Q8_0 blocks: all of it dense.
            None => stacked_dense(weights.iter().map(|w| dense_of(w, dtype)).collect()),
        };
    }
    let parts = weights.iter().map(|w| match w.matrix() {
        // The parts share their bytes with `p`: nothing is copied.
        Matrix::Packed(p) => PackedMatrix::clone(p),
        Matrix::Dense(t) => quantize_dense(t.clone(), FALLBACK_QUANT),
        Matrix::Blocks(..) | Matrix::DenseParts(_) => unreachable!("a GPU's matrices were stacked above"),
    });
    packed(Arc::new(PackedMatrix::stack(parts.collect()).expect("stacked weights share their input width")))
}

/// Matrices of one storage stacked in one buffer on a GPU whose kernels run (for kernels that
/// index rows across them: a mixture of experts routed on the device): dense of one type, or
/// quantized blocks of one format, one part each. `None` on the CPU, for mixed storage or
/// formats, or where the stack would pass the device's largest buffer.
pub fn stack_rows(weights: &[Weight]) -> Option<Weight> {
    let first = weights.first()?;
    let k = first.dims()[1];
    if weights.iter().any(|w| w.dims()[1] != k) {
        return None;
    }
    match first.matrix() {
        Matrix::Dense(t) => {
            let (device, dtype) = (t.device(), t.dtype());
            let tensors: Vec<Tensor<2>> = weights
                .iter()
                .map(|w| match w.matrix() {
                    Matrix::Dense(t) if t.dtype() == dtype => Some(t.clone()),
                    _ => None,
                })
                .collect::<Option<_>>()?;
            let rows: usize = tensors.iter().map(|t| t.dims()[0]).sum();
            let fits = (rows * k * dtype.size()) as u64 <= kernels::buffer_limit(&device);
            (kernels::blocks_run_on(&device) && fits).then(|| dense(Tensor::cat(tensors, 0)))
        }
        Matrix::Blocks([part], dense_type) => {
            let (ty, device) = (part.ty, part.words.device());
            let words: Vec<Tensor<2, Int>> = weights
                .iter()
                .map(|w| match w.matrix() {
                    Matrix::Blocks([p], _) if p.ty == ty => Some(p.words.clone()),
                    _ => None,
                })
                .collect::<Option<_>>()?;
            let rows: usize = words.iter().map(|w| w.dims()[0]).sum();
            let fits = (rows * quant::device::row_words(ty, k) * 4) as u64 <= kernels::buffer_limit(&device);
            let stacked = || DeviceRows { words: Tensor::cat(words, 0), ..part.clone() };
            (kernels::blocks_run_on(&device) && fits).then(|| blocks(vec![stacked()], dense_type))
        }
        _ => None,
    }
}

/// Rows `rows` of a matrix [`stack_rows`] made, as a weight of its own that shares the stack's
/// buffer (a copy where the device's buffer offsets cannot start at the first row).
pub fn row_view(stack: &Weight, rows: Range<usize>) -> Weight {
    match stack.matrix() {
        Matrix::Dense(t) => dense(t.clone().narrow(0, rows.start, rows.len())),
        Matrix::Blocks([part], dense_type) => blocks(vec![narrowed(part, rows)], dense_type),
        _ => unreachable!("stacks are one buffer on a GPU"),
    }
}

/// A matrix of the same kind as `like` holding `data` ([out, in]): dense in its dtype, or
/// quantized in the format of its first part (packed, or blocks on a GPU).
pub fn like(like: &Weight, data: TensorData, device: &Device) -> Weight {
    match like.matrix() {
        Matrix::Dense(w) | Matrix::DenseParts([w, ..]) => dense_fitting(data, w.dtype(), device),
        Matrix::DenseParts([]) => unreachable!("dense parts are at least two"),
        Matrix::Packed(w) => {
            let ty = w.formats().first().map_or(FALLBACK_QUANT, |(q, _)| *q);
            packed(Arc::new(quantize_dense(Tensor::from_data(data, device), ty)))
        }
        Matrix::Blocks(parts, dtype) => match host_blocks(&data, parts[0].ty, dtype, device) {
            Some(parts) => blocks(parts, dtype),
            None => dense_fitting(data, dtype, device),
        },
    }
}

/// A stack of one buffer ([`stack_rows`]) with `rows` overwritten by `data` ([rows.len(), in]):
/// dense rows in the stack's type, or blocks quantized to the stack's format. Taking `w` lets the
/// write land in place where nothing else holds the buffer (a copy of the stack otherwise).
/// `Err(w)` where the stack cannot take the rows as they are: blocks of several parts.
pub fn write_rows(w: Weight, rows: Range<usize>, data: TensorData, device: &Device) -> Result<Weight, Weight> {
    match w.matrix() {
        Matrix::Dense(t) => {
            let t = t.clone();
            // `t` is the buffer's one holder now: the assignment writes it in place.
            drop(w);
            let (all, dtype) = (0..t.dims()[1], t.dtype());
            Ok(dense(t.slice_assign([rows, all], Tensor::from_data(data, (device, dtype)))))
        }
        Matrix::Blocks([part], dense_type) => {
            let new = host_blocks(&data, part.ty, dense_type, device);
            let Some([new]) = new.map(<[DeviceRows; 1]>::try_from).and_then(Result::ok).filter(|[n]| n.ty == part.ty)
            else {
                return Err(w);
            };
            let DeviceRows { ty, k, words } = part.clone();
            // `words` is the buffer's one holder now: the assignment writes it in place.
            drop(w);
            let all = 0..words.dims()[1];
            let words = words.slice_assign([rows, all], new.words);
            Ok(blocks(vec![DeviceRows { ty, k, words }], dense_type))
        }
        _ => Err(w),
    }
}

/// `w` with `rows` overwritten by `data` ([rows.len(), in]) in the matrix's own dtype; for a
/// packed matrix the rows must be one stacked part, requantized to its format; blocks on a GPU
/// are requantized to the format of the part where the rows start.
pub fn replace_rows(w: &Weight, rows: Range<usize>, data: TensorData, device: &Device) -> Weight {
    match w.matrix() {
        Matrix::Dense(t) => {
            let all = 0..t.dims()[1];
            dense(t.clone().slice_assign([rows, all], Tensor::from_data(data, (device, t.dtype()))))
        }
        Matrix::DenseParts(parts) => {
            let mut start = 0;
            let parts = parts.iter().map(|t| {
                let span = start..start + t.dims()[0];
                start = span.end;
                let (from, to) = (rows.start.max(span.start), rows.end.min(span.end));
                if from >= to {
                    return t.clone();
                }
                let new = Tensor::from_data(data_rows(&data, from - rows.start..to - rows.start), (device, t.dtype()));
                t.clone().slice_assign([from - span.start..to - span.start, 0..t.dims()[1]], new)
            });
            in_parts(parts.collect())
        }
        Matrix::Packed(p) => {
            let (mut start, mut ty) = (0, FALLBACK_QUANT);
            for (q, n) in p.formats() {
                if start == rows.start {
                    ty = q;
                }
                start += n;
            }
            let part = quantize_dense(Tensor::from_data(data, device), ty);
            let mut updated = PackedMatrix::clone(p);
            assert!(updated.replace_rows(rows.start, part), "replaced rows are one stacked part");
            packed(Arc::new(updated))
        }
        Matrix::Blocks(parts, dtype) => {
            // Each part's rows of the matrix.
            let spans: Vec<Range<usize>> = parts
                .iter()
                .scan(0, |start, p| {
                    *start += p.rows();
                    Some(*start - p.rows()..*start)
                })
                .collect();
            let first = spans.iter().position(|s| s.contains(&rows.start)).expect("replaced rows are in the matrix");
            let Some(new) = host_blocks(&data, parts[first].ty, dtype, device) else {
                let (all, new) = (0..w.dims()[1], Tensor::from_data(data, (device, dtype)));
                return dense(dense_of(w, dtype).slice_assign([rows, all], new));
            };
            // The parts' rows before and after `rows`, and the new part between them.
            let mut kept = Vec::new();
            for (i, (p, span)) in parts.iter().zip(&spans).enumerate() {
                if rows.start > span.start {
                    kept.push(narrowed(p, 0..span.end.min(rows.start) - span.start));
                }
                if i == first {
                    kept.extend(new.iter().cloned());
                }
                if rows.end < span.end {
                    kept.push(narrowed(p, rows.end.max(span.start) - span.start..span.len()));
                }
            }
            blocks(merged(kept, dtype), dtype)
        }
    }
}

/// Rows `range` of a part.
fn narrowed(p: &DeviceRows, range: Range<usize>) -> DeviceRows {
    DeviceRows { words: p.words.clone().narrow(0, range.start, range.len()), ..p.clone() }
}

/// Adjacent parts of one format as one (one launch each in a product), where the part still
/// fits the device's largest buffer ([`part_rows`]; `dense`: the type it dequantizes to).
fn merged(parts: Vec<DeviceRows>, dense: DType) -> Vec<DeviceRows> {
    let Some(first) = parts.first() else {
        return parts;
    };
    let limit = kernels::buffer_limit(&first.words.device());
    let mut out: Vec<DeviceRows> = Vec::with_capacity(parts.len());
    for p in parts {
        match out.last_mut() {
            Some(last) if last.ty == p.ty && last.rows() + p.rows() <= part_rows(p.ty, p.k, dense.size(), limit) => {
                last.words = Tensor::cat(vec![last.words.clone(), p.words], 0)
            }
            _ => out.push(p),
        }
    }
    out
}

/// A weight as a dense matrix of `dtype` (blocks dequantized on their device).
fn dense_of(w: &Weight, dtype: DType) -> Tensor<2> {
    match w.matrix() {
        Matrix::Dense(t) => t.clone().cast(FloatDType::from(dtype)),
        Matrix::DenseParts(parts) => {
            Tensor::cat(parts.iter().map(|t| t.clone().cast(FloatDType::from(dtype))).collect(), 0)
        }
        Matrix::Blocks(parts, _) => dequantized(parts, dtype),
        Matrix::Packed(_) => unreachable!("packed matrices are the CPU's, blocks a GPU's"),
    }
}

/// `data` ([out, in], any float type) quantized on the host to `ty` and put on `device` as
/// blocks, in parts that fit its largest buffer as blocks and as `dense` ([`part_rows`]); `None`
/// where its rows are not whole blocks.
fn host_blocks(data: &TensorData, ty: QuantType, dense: DType, device: &Device) -> Option<Vec<DeviceRows>> {
    let (rows, k) = (data.shape()[0], data.shape()[1]);
    if !ty.fits_row(k) {
        return None;
    }
    let values: Vec<f32> = data.iter::<f32>().collect();
    let mut bytes = Vec::new();
    quant::quantize(ty, &values, &mut bytes)?;
    upload_fitting(ty, rows, k, &bytes, dense, device)
}

/// A dense matrix on a GPU read back and put there as blocks ([`host_blocks`]).
fn device_rows(t: Tensor<2>, ty: QuantType, dense: DType) -> Option<Vec<DeviceRows>> {
    let device = t.device();
    host_blocks(&t.into_data(), ty, dense, &device)
}

/// `rows` ggml rows of `k` values in `ty` put on `device`, in parts that fit its largest buffer
/// as blocks and dequantized to `dense` ([`part_rows`]); `None` where the bytes are not those
/// rows.
pub(crate) fn upload_fitting(
    ty: QuantType,
    rows: usize,
    k: usize,
    bytes: &[u8],
    dense: DType,
    device: &Device,
) -> Option<Vec<DeviceRows>> {
    let per_part = part_rows(ty, k, dense.size(), kernels::buffer_limit(device));
    DeviceRows::upload_parts(ty, rows, k, bytes, per_part, device)
}

/// A dense matrix quantized to `ty`.
fn quantize_dense(t: Tensor<2>, ty: QuantType) -> PackedMatrix {
    let [rows, k] = t.dims();
    let values = t.cast(FloatDType::F32).into_data().try_into_vec::<f32>().expect("f32 after the cast");
    PackedMatrix::quantize(ty, rows, k, &values).expect("rows of a stacked or replaced matrix fit the format")
}

/// `y = x·Wᵀ + b` with the checkpoint's `[out, in]` weight layout.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Weight,
    /// \[out\]
    pub bias: Option<Tensor<1>>,
}

impl Linear {
    /// # Shapes
    /// x: [n, in] (f32) → [n, out] (f32)
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.weight.forward(x, self.bias.as_ref())
    }

    /// `pre(x)·Wᵀ + b (+ residual)`: the input's norm or SwiGLU gate and a residual connection
    /// around the product, one kernel on a GPU for a decode step.
    ///
    /// # Shapes
    /// x: [n, in] (f32; [n, 2 · in] under `Pre::Gated`), residual: [n, out] (f32) → [n, out] (f32)
    pub fn forward_with(&self, x: Tensor<2>, pre: Pre<'_>, residual: Option<Tensor<2>>) -> Tensor<2> {
        self.weight.forward_with(x, pre, self.bias.as_ref(), residual)
    }

    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(rows: usize, cols: usize, seed: u32, device: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(crate::kernels::test_values(rows * cols, seed), [rows, cols]), device)
    }

    /// A one-row product (the few-row kernel, or the split across threads without AVX-512)
    /// equals that row of a product with more rows than the kernel takes (the backend's GEMM).
    #[test]
    fn one_row_products_equal_their_row_of_a_many_row_product() {
        let device = Device::flex();
        let (out, input) = (601, 48);
        let f32_weight = tensor(out, input, 7, &device);
        for (weight, tolerance) in [(f32_weight.clone(), 1e-4), (f32_weight.cast(FloatDType::F16), 2e-2)] {
            let linear = Linear { weight: dense(weight), bias: Some(tensor(1, out, 3, &device).reshape([out])) };
            let x = tensor(crate::kernels::XWT_MAX_ROWS + 3, input, 11, &device);
            let whole = linear.forward(x.clone()).into_data().try_to_vec::<f32>().unwrap();
            for row in [0, 5, crate::kernels::XWT_MAX_ROWS + 2] {
                let one = linear.forward(x.clone().narrow(0, row, 1)).into_data().try_to_vec::<f32>().unwrap();
                assert_eq!(one.len(), out);
                let expected = &whole[row * out..(row + 1) * out];
                let err = one.iter().zip(expected).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(err < tolerance, "row {row}: max difference {err}");
            }
        }
    }

    /// Stacking a dense matrix with a packed one, and replacing one stacked part's rows: the
    /// outputs of each part land in their own columns.
    #[test]
    fn packed_stacks_and_replaced_rows_stay_in_their_columns() {
        let device = Device::flex();
        let (k, a_rows, b_rows) = (64, 20, 12);
        let a = tensor(a_rows, k, 1, &device);
        let b = tensor(b_rows, k, 2, &device);
        let packed_a = packed(Arc::new(quantize_dense(a.clone(), QuantType::Q8_0)));
        let stacked = stack(vec![packed_a, dense(b.clone())]);
        assert_eq!(stacked.dims(), [a_rows + b_rows, k]);
        assert_eq!(stacked.describe(), "Q8_0");
        let x = tensor(3, k, 9, &device);
        let product = |w: &Weight| Linear { weight: w.clone(), bias: None }.forward(x.clone());
        let dense_product = |t: Tensor<2>| product(&dense(t)).into_data().try_into_vec::<f32>().unwrap();
        let close = |got: &[f32], want: &[f32]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 0.05);
        let got = product(&stacked);
        let (ya, yb) = (dense_product(a.clone()), dense_product(b.clone()));
        let part = |y: &Tensor<2>, r: Range<usize>| {
            y.clone().narrow(1, r.start, r.len()).into_data().try_into_vec::<f32>().unwrap()
        };
        assert!(close(&part(&got, 0..a_rows), &ya) && close(&part(&got, a_rows..a_rows + b_rows), &yb));
        // Replace b's rows by a's first 12: its columns now give a's outputs.
        let replacement = a.clone().narrow(0, 0, b_rows);
        let stacked = replace_rows(&stacked, a_rows..a_rows + b_rows, replacement.clone().into_data(), &device);
        let got = product(&stacked);
        assert!(close(&part(&got, a_rows..a_rows + b_rows), &dense_product(replacement)));
        assert!(close(&part(&got, 0..a_rows), &ya));
    }

    /// The weight picks its kernel when it is made, from the CPU it runs on, and counts the
    /// products it runs there.
    #[test]
    fn a_weight_runs_the_kernel_it_chose_at_load_and_counts_it() {
        let device = Device::flex();
        let w = tensor(300, 64, 5, &device);
        let dense_w = dense(w.clone().cast(FloatDType::F16));
        let expected = if kernels::xwt_available() { "xwt" } else { "burn_split" };
        assert_eq!(dense_w.kernel(), expected);
        let calls = |name: &str| kernels::calls().into_iter().find(|(k, _)| *k == name).map_or(0, |(_, n)| n);
        // Many rows (prefill) of a 16-bit weight: the AVX-512 GEMM, else the AVX2 one, else the
        // backend's; more than a few (batched decode): `xwt` on AVX-512, else the AVX2 GEMM.
        let (many, some) = if kernels::GemmIsa::Avx512.available() {
            ("gemm_avx512", "xwt")
        } else if kernels::GemmIsa::Avx2.available() {
            ("gemm_avx2", "gemm_avx2")
        } else {
            ("burn", "burn")
        };
        for (rows, kernel) in [(kernels::XWT_MAX_ROWS + 1, many), (kernels::XWT_AVX2_MAX_ROWS + 1, some)] {
            let before = calls(kernel);
            dense_w.forward(tensor(rows, 64, 1, &device), None);
            assert!(calls(kernel) > before, "{rows} rows: {kernel} was not counted");
        }
        let quantized = packed(Arc::new(quantize_dense(w, QuantType::Q8_0)));
        let expected = match quant::Kernel::best() {
            quant::Kernel::Vnni => "quant_vnni",
            quant::Kernel::Avx2 => "quant_avx2",
            quant::Kernel::Portable => "quant_portable",
        };
        assert_eq!(quantized.kernel(), expected);
        let before = calls(expected);
        quantized.forward(tensor(2, 64, 1, &device), None);
        assert!(calls(expected) > before, "{expected} was not counted");
    }
}
