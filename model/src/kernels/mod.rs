//! CPU kernels for the Flex backend, used where a Burn op is the bottleneck (issue 6), and GPU
//! kernels for the CubeCL backends (`gpu`, issue 31). Each entry point takes Burn tensors, runs
//! only when they live on its backend with a layout and dtype it handles (and, on the CPU, the
//! instructions it needs are there), and otherwise returns `None` so the caller keeps the plain
//! Burn ops: the model stays generic over the backend.

/// Runs `$tile!(R, C)` for a tile of R rows of x (≤ 4) by C weight rows (≤ 4), with R and C as
/// literals for the const-generic tile functions.
macro_rules! each_tile {
    ($shape:expr, $tile:ident) => {
        match $shape {
            (4, 4) => $tile!(4, 4),
            (4, 3) => $tile!(4, 3),
            (4, 2) => $tile!(4, 2),
            (4, 1) => $tile!(4, 1),
            (3, 4) => $tile!(3, 4),
            (3, 3) => $tile!(3, 3),
            (3, 2) => $tile!(3, 2),
            (3, 1) => $tile!(3, 1),
            (2, 4) => $tile!(2, 4),
            (2, 3) => $tile!(2, 3),
            (2, 2) => $tile!(2, 2),
            (2, 1) => $tile!(2, 1),
            (1, 4) => $tile!(1, 4),
            (1, 3) => $tile!(1, 3),
            (1, 2) => $tile!(1, 2),
            _ => $tile!(1, 1),
        }
    };
}

mod attention;
mod avx2;
mod awake;
mod bf16dot;
mod calls;
mod exp;
mod f16c;
mod gemm;
pub(crate) mod kv_q8;
mod norm_rope;
pub(crate) mod plain;
pub(crate) mod prefetch;
mod swiglu;
mod xwt;
mod xwt_avx2;

pub(crate) use swiglu::{GELU_CUBE, GELU_SCALE};

/// The GPU kernels, where this build has a CubeCL backend without Burn's fusion.
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) mod cube;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) use cube as gpu;
/// No GPU kernels in this build: every entry point declines.
#[cfg(not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))))]
pub(crate) mod gpu {
    use burn::tensor::{Int, Tensor};

    /// No graphs to capture: [`graph::Recorder::prepare`] never starts one.
    pub mod graph {
        use burn::tensor::Tensor;
        use burn::tensor::kind::Basic;

        /// Every tensor kind.
        pub trait OnCube: Basic {}
        impl<K: Basic> OnCube for K {}

        pub struct Recorder;
        pub struct Captured;
        impl Recorder {
            pub fn prepare<const D: usize, K: OnCube>(_: &Tensor<D, K>) -> Result<Recorder, String> {
                Err("no GPU kernels in this build".into())
            }
            pub fn record(&mut self) -> Result<(), String> {
                Err("no GPU kernels in this build".into())
            }
            pub fn finish(self) -> Result<Captured, String> {
                Err("no GPU kernels in this build".into())
            }
            pub fn discard(self) {}
        }
        impl Captured {
            /// # Safety
            /// Nothing to replay.
            #[allow(unsafe_code)]
            pub unsafe fn replay(&self) -> Result<(), String> {
                Err("no GPU kernels in this build".into())
            }
        }
        pub fn hold<const D: usize, K: OnCube>(_: &Tensor<D, K>) {}
        pub fn write_f32<const D: usize, K: OnCube>(_: &Tensor<D, K>, _: &[f32]) -> bool {
            false
        }
        pub fn write_ints<const D: usize, K: OnCube>(_: &Tensor<D, K>, _: &[i32]) -> bool {
            false
        }
    }

    pub fn rms_norm(_: &Tensor<2>, _: &Tensor<1>, _: f64) -> Option<Tensor<2>> {
        None
    }
    pub fn swiglu(_: &Tensor<2>, _: crate::config::Activation) -> Option<Tensor<2>> {
        None
    }
    pub fn rope(_: &Tensor<2>, _: usize, _: usize, _: &Tensor<3>) -> Option<Tensor<2>> {
        None
    }
    pub fn softmax(_: &Tensor<3>, _: f64, _: Option<&Tensor<2>>) -> Option<Tensor<3>> {
        None
    }
    pub fn attention(
        _: &Tensor<3>,
        _: &Tensor<3>,
        _: &Tensor<3>,
        _: &Tensor<2, Int>,
        _: Option<f32>,
        _: Option<&Tensor<1>>,
    ) -> Option<Tensor<2>> {
        None
    }
    pub fn kv_write(_: &mut [Tensor<3>; 2], _: [&Tensor<3>; 2], _: &Tensor<1, Int>) -> bool {
        false
    }
    pub fn rope_kv(
        _: &Tensor<2>,
        _: usize,
        _: usize,
        _: &Tensor<3>,
        _: Option<super::QkNorms<'_>>,
        _: &mut [Tensor<3>; 2],
        _: &Tensor<1, Int>,
    ) -> Option<Tensor<2>> {
        None
    }
    pub fn buffer_limit(_: &burn::tensor::Device) -> Option<u64> {
        None
    }
    pub fn argmax(_: &Tensor<2>) -> Option<Tensor<1, Int>> {
        None
    }
    pub fn top_k(_: &Tensor<2>, _: usize, _: Option<&[f32]>) -> Option<Tensor<3>> {
        None
    }
    #[allow(clippy::too_many_arguments)]
    pub fn moe(
        _: &Tensor<2>,
        _: super::Pre<'_>,
        _: &Tensor<2>,
        _: usize,
        _: bool,
        _: super::GpuWeight<'_>,
        _: super::GpuWeight<'_>,
        _: Option<&Tensor<2>>,
        _: Option<&Tensor<2>>,
    ) -> Option<Tensor<2>> {
        None
    }
    pub const BUILT: bool = false;
    pub fn enabled() -> bool {
        false
    }
    pub fn xwt_q(
        _: &Tensor<2>,
        _: super::Pre<'_>,
        _: &[crate::quant::device::DeviceRows],
        _: usize,
        _: Option<&Tensor<1>>,
        _: Option<&Tensor<2>>,
    ) -> Option<Tensor<2>> {
        None
    }
    pub fn dequantize(
        _: &[crate::quant::device::DeviceRows],
        _: usize,
        _: Option<&Tensor<1, Int>>,
        _: burn::tensor::DType,
    ) -> Option<Tensor<2>> {
        None
    }
    #[allow(clippy::too_many_arguments)]
    pub fn xwt_rope_kv(
        _: &Tensor<2>,
        _: super::Pre<'_>,
        _: super::GpuWeight<'_>,
        _: Option<&Tensor<1>>,
        _: usize,
        _: usize,
        _: &Tensor<3>,
        _: &mut [Tensor<3>; 2],
        _: &Tensor<1, Int>,
    ) -> Option<Tensor<2>> {
        None
    }
    pub fn xwt(
        _: &Tensor<2>,
        _: super::Pre<'_>,
        _: &Tensor<2>,
        _: Option<&Tensor<1>>,
        _: Option<&Tensor<2>>,
    ) -> Option<Tensor<2>> {
        None
    }
}

use std::cell::OnceCell;
use std::ops::Range;
use std::sync::Arc;

use burn::backend::Flex;
use burn::tensor::{DType, Device, Int, Tensor, TensorData, bf16, f16};

pub use awake::with_awake_pool;
pub use calls::{KernelCall, calls};
pub use exp::{draw_weight, draw_weights, log_sum_exp, row_max, weights_at_least, weights_total};
pub(crate) use gpu::graph;

use crate::config::Activation;
use crate::kv::Placement;
use crate::quant::PackedMatrix;
use crate::quant::device::DeviceRows;

/// Products with f32 weights and more rows than this go to the backend's GEMM, which packs its
/// operands and from here on is as fast (prefill). With 16-bit weights, more rows than this run
/// the packed GEMM (`gemm.rs`, AVX-512 or AVX2 tiles; bf16 ones `bf16dot` instead where its
/// `vdpbf16ps` outpaces f32 FMAs), fewer `xwt`'s dot products on AVX-512. Demo shapes on an
/// Emerald Rapids Xeon: at 64 rows the two are even, at 128 the GEMM is 1.4-1.7x faster, at 32
/// rows 0.8-1.1x, at 16 0.5-0.9x (it packs the weight on every call). Prefill 512 of the bf16
/// demo model: 177 tok/s on `bf16dot`, 285 on the AVX-512 GEMM. On AVX2 without AVX-512 the
/// backend widened the whole weight on every call: 106 tok/s there, 190 on the AVX2 GEMM
/// (a 2-core Zen 3).
pub const XWT_MAX_ROWS: usize = 64;

/// On AVX2 without AVX-512, products of more rows than this (up to `XWT_MAX_ROWS` with f32
/// weights, any count with 16-bit ones) run `gemm_avx2` instead of `xwt`: its broadcast tile
/// reads each weight vector once for six rows where `xwt`'s dot products read it once per row.
/// Demo shapes, Zen 3, f16 weights: at 8 rows `xwt` is faster on two of three shapes
/// (1.2-1.9x), at 10 rows `gemm_avx2` on all (1.1-1.6x), at 64 rows by 1.5-2.6x; f32 weights:
/// `gemm_avx2` by 1.5-2x at 16 rows, 2-2.9x at 64.
pub const XWT_AVX2_MAX_ROWS: usize = 8;

/// Whether this CPU runs the `xwt` kernel on AVX-512 (few-row products, and 16-bit ones at any
/// row count).
pub fn xwt_avx512() -> bool {
    pulp::x86::V4::try_new().is_some()
}

/// Whether this CPU runs the `xwt` kernel for few-row products (AVX-512, or AVX2 with FMA and
/// F16C).
pub fn xwt_available() -> bool {
    xwt_avx512() || xwt_avx2::available()
}

/// Whether this CPU runs the `bf16dot` kernel (AVX512-BF16) and it outpaces the f32 GEMM
/// there (see `bf16dot::outpaces_fma`).
pub fn bf16dot_outpaces_fma() -> bool {
    bf16dot::outpaces_fma()
}

/// `x·Wᵀ + b` on the Flex backend with the `xwt` kernel (few rows, or on AVX-512 any rows with
/// 16-bit weights); `None` when the tensors are not on Flex in the dtypes it takes, or the CPU
/// has neither AVX-512 nor AVX2 with FMA and F16C.
///
/// # Shapes
/// x: [m, k] f32, weight: [n, k] f32, f16 or bf16, bias: \[n\] f32 → [m, n] f32
pub fn xwt_linear(x: &Tensor<2>, weight: &Tensor<2>, bias: Option<&Tensor<1>>) -> Option<Tensor<2>> {
    dense_product(x, weight, bias, |x, w, bias, m, n, k| match w.dtype() {
        DType::F32 => xwt::run(&xwt::Product { x, w: w.as_slice::<f32>()?, bias, m, n, k }),
        DType::F16 => xwt::run(&xwt::Product { x, w: w.as_slice::<f16>()?, bias, m, n, k }),
        DType::BF16 => xwt::run(&xwt::Product { x, w: w.as_slice::<bf16>()?, bias, m, n, k }),
        _ => None,
    })
    .inspect(|_| KernelCall::Xwt.count())
}

pub use gemm::Isa as GemmIsa;

/// `x·Wᵀ + b` on the Flex backend with the packed GEMM on `isa` (many rows, f32 activations);
/// `None` as for `xwt_linear`, or where the CPU lacks `isa`'s instructions.
///
/// # Shapes
/// x: [m, k] f32, weight: [n, k] f32, f16 or bf16, bias: \[n\] f32 → [m, n] f32
pub fn gemm_linear(isa: GemmIsa, x: &Tensor<2>, weight: &Tensor<2>, bias: Option<&Tensor<1>>) -> Option<Tensor<2>> {
    if !isa.available() {
        return None;
    }
    dense_product(x, weight, bias, |x, w, bias, m, n, k| match w.dtype() {
        DType::F32 => Some(gemm::run(&xwt::Product { x, w: w.as_slice::<f32>()?, bias, m, n, k }, isa)),
        DType::F16 => Some(gemm::run(&xwt::Product { x, w: w.as_slice::<f16>()?, bias, m, n, k }, isa)),
        DType::BF16 => Some(gemm::run(&xwt::Product { x, w: w.as_slice::<bf16>()?, bias, m, n, k }, isa)),
        _ => None,
    })
    .inspect(|_| match isa {
        GemmIsa::Avx2 => KernelCall::GemmAvx2.count(),
        GemmIsa::Avx512 => KernelCall::GemmAvx512.count(),
    })
}

/// `x·Wᵀ + b` on the Flex backend with the `bf16dot` kernel (bf16 weights, activations rounded
/// to bf16; for many rows); `None` as for `xwt_linear`, or without AVX512-BF16.
///
/// # Shapes
/// x: [m, k] f32, weight: [n, k] bf16, bias: \[n\] f32 → [m, n] f32
pub fn bf16dot_linear(x: &Tensor<2>, weight: &Tensor<2>, bias: Option<&Tensor<1>>) -> Option<Tensor<2>> {
    dense_product(x, weight, bias, |x, w, bias, m, n, k| bf16dot::run(x, w.as_slice::<bf16>()?, bias, m, n, k))
        .inspect(|_| KernelCall::Bf16Dot.count())
}

type FlexPrimitive = <Flex as burn::backend::BackendTypes>::FloatTensorPrimitive;

/// Runs `kernel` over the Flex slices of `x`, the weight and the bias.
fn dense_product(
    x: &Tensor<2>,
    weight: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    kernel: impl FnOnce(&[f32], &FlexPrimitive, Option<&[f32]>, usize, usize, usize) -> Option<Vec<f32>>,
) -> Option<Tensor<2>> {
    let [m, k] = x.dims();
    let [n, wk] = weight.dims();
    if k != wk || x.dtype() != DType::F32 {
        return None;
    }
    let device = x.device();
    let x = contiguous(x)?;
    let w = weight.clone().try_into_primitive::<Flex>().ok()?;
    let b = match bias {
        Some(b) if b.dtype() == DType::F32 => Some(b.clone().try_into_primitive::<Flex>().ok()?),
        Some(_) => return None,
        None => None,
    };
    let bias = match &b {
        Some(b) => Some(b.as_slice::<f32>()?),
        None => None,
    };
    let out = kernel(x.as_slice::<f32>()?, &w, bias, m, n, k)?;
    Some(Tensor::from_data(TensorData::new(out, [m, n]), &device))
}

/// `x·Wᵀ + b` with a packed quantized weight on `kernel` (Flex tensors are read in place,
/// others copied to the host).
///
/// # Shapes
/// x: [m, k] f32, weight: [n, k], bias: \[n\] f32 → [m, n] f32
pub fn quantized_linear(
    x: &Tensor<2>,
    weight: &PackedMatrix,
    kernel: crate::quant::Kernel,
    bias: Option<&Tensor<1>>,
) -> Tensor<2> {
    let [m, _] = x.dims();
    let device = x.device();
    let bias: Option<Vec<f32>> = bias.map(|b| host_f32(b.clone()));
    let flex = contiguous(x);
    let out = match flex.as_ref().and_then(|f| f.as_slice::<f32>()) {
        Some(x) => crate::quant::matmul_with(kernel, x, m, weight, bias.as_deref()),
        None => crate::quant::matmul_with(kernel, &host_f32(x.clone()), m, weight, bias.as_deref()),
    };
    Tensor::from_data(TensorData::new(out, [m, weight.rows()]), &device)
}

/// A tensor's values as f32 on the host.
fn host_f32<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    crate::transfers::read(t.cast(burn::tensor::FloatDType::F32)).expect("f32 after the cast")
}

/// A pass's cells: where each row's key and value are written and the cells each row sees. On
/// the host for the CPU's kernels; for the GPU's, as device tables uploaded at their first use
/// and shared by every layer of the pass: \[n\] i32 write slots, and [n, 1 + width] i32 (each
/// row's count of visible cells, then the cells).
pub struct CellTable {
    /// Where each row's key and value go.
    pub placement: Placement,
    /// \[n\] cell indices each row sees, none empty (none given: a pass that only writes).
    pub visible: Vec<Vec<u32>>,
    device: Device,
    slots: OnceCell<Tensor<1, Int>>,
    table: OnceCell<Tensor<2, Int>>,
}

impl CellTable {
    pub fn new(placement: Placement, visible: Vec<Vec<u32>>, device: &Device) -> Self {
        Self { placement, visible, device: device.clone(), slots: OnceCell::new(), table: OnceCell::new() }
    }

    /// Whether the pass runs where the GPU kernels may (a build with them, a device not the CPU):
    /// elsewhere the GPU-only steps are not tried at all.
    pub fn on_gpu(&self) -> bool {
        GPU_KERNELS && self.device != Device::flex()
    }

    /// The write slots as the kernels read them.
    pub fn slot_values(&self) -> Vec<i32> {
        self.placement.cells.iter().map(|&c| c as i32).collect()
    }

    /// The table's least width: each row's count, then the most cells a row sees.
    pub fn width(&self) -> usize {
        1 + self.visible.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The table as the kernels read it, `width` (at least [`Self::width`]) wide: each row's
    /// count, then its cells, then zeros.
    pub fn table_values(&self, width: usize) -> Vec<i32> {
        let mut rows = vec![0i32; self.visible.len() * width];
        for (row, cells) in rows.chunks_mut(width).zip(&self.visible) {
            row[0] = cells.len() as i32;
            for (slot, &cell) in row[1..].iter_mut().zip(cells) {
                *slot = cell as i32;
            }
        }
        rows
    }

    /// This table with its device tensors given (a replayed step's buffers, written already
    /// with [`Self::slot_values`] and [`Self::table_values`]) instead of uploaded.
    pub fn preset(self, slots: Tensor<1, Int>, table: Tensor<2, Int>) -> Self {
        let _ = self.slots.set(slots);
        let _ = self.table.set(table);
        self
    }

    fn slots(&self) -> &Tensor<1, Int> {
        self.slots.get_or_init(|| {
            let slots = self.slot_values();
            let n = slots.len();
            crate::transfers::upload(TensorData::new(slots, [n]), &self.device)
        })
    }

    fn table(&self) -> &Tensor<2, Int> {
        self.table.get_or_init(|| {
            let width = self.width();
            let rows = self.table_values(width);
            crate::transfers::upload(TensorData::new(rows, [self.visible.len(), width]), &self.device)
        })
    }
}

/// Writes a batch's keys and values into their cells of a layer's cache, in place, in one
/// launch on a GPU (the CPU's slice assignments are the caller's): false, the caches unchanged,
/// where it declines.
///
/// # Shapes
/// caches: [kv_heads, capacity, d] each; new: [kv_heads, n, d] f32 each
pub fn kv_write(caches: &mut [Tensor<3>; 2], new: [&Tensor<3>; 2], cells: &CellTable) -> bool {
    cells.on_gpu() && gpu::kv_write(caches, new, cells.slots())
}

/// Per-head RMSNorms (Qwen3's q and k norms): q's and k's \[head_dim\] weights, and epsilon.
pub type QkNorms<'a> = ([&'a Tensor<1>; 2], f64);

/// RoPE and the KV write as one GPU launch: q's heads rotated (returned), k's rotated and v's
/// copied into their cells of a layer's cache, in place, from the stacked q/k/v projection, with
/// `norms` q's and k's heads RMS-normalised first; `None`, nothing written, where it declines
/// (the CPU: its kernel rotates, slice assignments write).
///
/// # Shapes
/// qkv: [n, (heads + 2 · kv_heads) · d] f32, tables: [2, n, d/2] f32 (cos, sin), norms: \[d\]
/// f32 each, caches: [kv_heads, capacity, d] each → q: [n, heads · d] f32
pub fn rope_kv_write(
    qkv: &Tensor<2>,
    heads: usize,
    d: usize,
    tables: &Tensor<3>,
    norms: Option<QkNorms<'_>>,
    caches: &mut [Tensor<3>; 2],
    cells: &CellTable,
) -> Option<Tensor<2>> {
    if !cells.on_gpu() {
        return None;
    }
    gpu::rope_kv(qkv, heads, d, tables, norms, caches, cells.slots())
}

/// A weight as the GPU's few-row products read it.
#[derive(Clone, Copy)]
pub enum GpuWeight<'a> {
    /// f32, f16 or bf16 rows.
    Dense(&'a Tensor<2>),
    /// Quantized blocks (`quant::device`), in parts stacked in order.
    Blocks(&'a [DeviceRows]),
}

impl GpuWeight<'_> {
    /// [rows, values a row]; `None` for blocks without parts.
    pub fn dims(&self) -> Option<[usize; 2]> {
        match self {
            Self::Dense(w) => Some(w.dims()),
            Self::Blocks(parts) => Some([parts.iter().map(DeviceRows::rows).sum(), parts.first()?.k]),
        }
    }
}

/// The stacked q/k/v projection of a decode step's few rows (its norm and bias applied) with
/// RoPE and the KV write, as one GPU launch (a quantized weight: one a part): q's heads rotated
/// (returned), k's rotated and v's copied into their cells of a layer's cache, in place; `None`,
/// nothing written, where it declines (the CPU, more rows than [`gpu_fused_rows`]: the caller
/// projects, then [`rope_kv_write`]).
///
/// # Shapes
/// x: [n, k] f32, w: [(heads + 2 · kv_heads) · d, k], bias: that many f32, tables: [2, n, d/2]
/// f32 (cos, sin), caches: [kv_heads, capacity, d] each → q: [n, heads · d] f32
#[allow(clippy::too_many_arguments)]
pub fn project_rope_kv_write(
    x: &Tensor<2>,
    pre: Pre<'_>,
    w: GpuWeight<'_>,
    bias: Option<&Tensor<1>>,
    heads: usize,
    d: usize,
    tables: &Tensor<3>,
    caches: &mut [Tensor<3>; 2],
    cells: &CellTable,
) -> Option<Tensor<2>> {
    if !cells.on_gpu() {
        return None;
    }
    let q = gpu::xwt_rope_kv(x, pre, w, bias, heads, d, tables, caches, cells.slots())?;
    match w {
        GpuWeight::Dense(_) => KernelCall::CubeXwt.count(),
        GpuWeight::Blocks(_) => KernelCall::CubeXwtQ.count(),
    }
    Some(q)
}

/// Each attention head's learned sink (gpt-oss's `sinks`): a logit in its softmax's denominator
/// that no value goes with, so a head may attend to nothing. Kept on the host (the CPU kernel's)
/// and on the device (the GPU kernel's and Burn's ops').
#[derive(Debug, Clone)]
pub struct Sinks {
    /// \[heads\]
    pub host: Arc<[f32]>,
    /// \[heads\]
    pub device: Tensor<1>,
}

impl Sinks {
    pub fn new(values: Vec<f32>, device: &Device) -> Self {
        let heads = values.len();
        let tensor = Tensor::from_data(TensorData::new(values.clone(), [heads]), device);
        Self { host: values.into(), device: tensor }
    }
}

/// Attention of each row over only the cells it sees: the CPU kernel on the Flex backend, the
/// GPU kernel on a CubeCL one.
///
/// # Shapes
/// - q: [n, heads, d] f32 (rotated)
/// - k, v: [kv_heads, capacity, d] f32, f16 or bf16 (both the same), or q8_0 blocks in f16
///   words ([kv_heads, capacity, kv_q8::row_words(d)], with `q8`; the CPU only; see `kv_q8`
///   for their rotation): a layer's whole cache (keys with RoPE applied)
/// - cells: n rows
/// - sinks: \[heads\] (gpt-oss's: each head's softmax has its sink logit too)
/// - returns [n, heads · d] f32
pub fn attention(
    q: &Tensor<3>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    q8: bool,
    cells: &CellTable,
    softcap: Option<f64>,
    sinks: Option<&Sinks>,
) -> Option<Tensor<2>> {
    let softcap = softcap.map(|cap| cap as f32);
    if q.device() == Device::flex() {
        return flex_attention(q, k, v, q8, &cells.visible, softcap, sinks.map(|s| &s.host[..]));
    }
    if q8 {
        return None;
    }
    gpu::attention(q, k, v, cells.table(), softcap, sinks.map(|s| &s.device))
}

fn flex_attention(
    q: &Tensor<3>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    q8: bool,
    visible: &[Vec<u32>],
    softcap: Option<f32>,
    sinks: Option<&[f32]>,
) -> Option<Tensor<2>> {
    let [n, heads, d] = q.dims();
    let [kv_heads, capacity, kd] = k.dims();
    let row = if q8 { kv_q8::row_words(d) } else { d };
    if kd != row || v.dims() != k.dims() || n != visible.len() || q.dtype() != DType::F32 || k.dtype() != v.dtype() {
        return None;
    }
    if sinks.is_some_and(|s| s.len() != heads) {
        return None;
    }
    let device = q.device();
    let q = contiguous(q)?;
    let (k, v) = (k.clone().try_into_primitive::<Flex>().ok()?, v.clone().try_into_primitive::<Flex>().ok()?);
    let q = q.as_slice::<f32>()?;
    // The operands, over a cache stored in the type of `k` and `v`.
    macro_rules! operands {
        ($q:expr, $k:expr, $v:expr) => {
            attention::Attention { q: $q, k: $k, v: $v, visible, heads, kv_heads, d, capacity, softcap, sinks }
        };
    }
    macro_rules! run_in {
        ($t:ty) => {{
            let (k, v) = (k.as_slice::<$t>()?, v.as_slice::<$t>()?);
            Some(attention::run(&operands!(q, k, v)))
        }};
    }
    let out = match k.dtype() {
        DType::F16 if q8 => {
            // The stored rows are rotated: so are the queries, and the output is rotated back.
            let (k, v) = (kv_q8::as_blocks(k.as_slice::<f16>()?), kv_q8::as_blocks(v.as_slice::<f16>()?));
            let mut rotated = q.to_vec();
            kv_q8::rotate(&mut rotated, d);
            let mut out = attention::run(&operands!(&rotated, k, v));
            kv_q8::rotate(&mut out, d);
            Some(out)
        }
        DType::F32 => run_in!(f32),
        DType::F16 => run_in!(f16),
        DType::BF16 => run_in!(bf16),
        _ => None,
    }?;
    Some(Tensor::from_data(TensorData::new(out, [n, heads * d]), &device))
}

/// RMSNorm, `x / sqrt(mean(x²) + eps) · w` per row: the CPU kernel on the Flex backend, the
/// GPU kernel on a CubeCL one.
///
/// # Shapes
/// x: [n, h] f32, w: \[h\] f32 → [n, h] f32
pub fn rms_norm(x: &Tensor<2>, w: &Tensor<1>, eps: f64) -> Option<Tensor<2>> {
    flex_rms_norm(x, w, eps).or_else(|| gpu::rms_norm(x, w, eps))
}

fn flex_rms_norm(x: &Tensor<2>, w: &Tensor<1>, eps: f64) -> Option<Tensor<2>> {
    let [n, h] = x.dims();
    if x.dtype() != DType::F32 || w.dtype() != DType::F32 || w.dims() != [h] {
        return None;
    }
    let device = x.device();
    let (x, w) = (contiguous(x)?, contiguous(w)?);
    let out = norm_rope::rms_norm(x.as_slice::<f32>()?, w.as_slice::<f32>()?, eps as f32);
    Some(Tensor::from_data(TensorData::new(out, [n, h]), &device))
}

/// The rotary embedding of the heads of q (columns `q`) and k (columns `k`) of the stacked
/// q/k/v projection, on the Flex backend; `cos`, `sin`: [n, d/2] each token's angles. With
/// `norms` (q's and k's \[d\] weights, epsilon), each head is RMS-normalised first, in the
/// same pass.
///
/// # Shapes
/// qkv: [n, width] f32 → [n, width] f32, v's columns unchanged
pub fn rope_qk(
    qkv: &Tensor<2>,
    q: Range<usize>,
    k: Range<usize>,
    d: usize,
    (cos, sin): (&[f32], &[f32]),
    norms: Option<QkNorms<'_>>,
) -> Option<Tensor<2>> {
    let [n, width] = qkv.dims();
    if qkv.dtype() != DType::F32 {
        return None;
    }
    let device = qkv.device();
    let x = contiguous(qkv)?;
    let weights = match norms {
        Some(([wq, wk], eps))
            if [wq.dtype(), wk.dtype()] == [DType::F32; 2] && wq.dims() == [d] && wk.dims() == [d] =>
        {
            Some((contiguous(wq)?, contiguous(wk)?, eps as f32))
        }
        Some(_) => return None,
        None => None,
    };
    let norms = match &weights {
        Some((wq, wk, eps)) => {
            Some(norm_rope::HeadNorms { weights: [wq.as_slice::<f32>()?, wk.as_slice::<f32>()?], eps: *eps })
        }
        None => None,
    };
    let out = norm_rope::rope_qk(x.as_slice::<f32>()?, width, q, k, d, (cos, sin), norms);
    Some(Tensor::from_data(TensorData::new(out, [n, width]), &device))
}

/// The rotary embedding of the first `width` columns of each row (whole heads of `d`), each
/// token by its own angles: the GPU kernel on a CubeCL backend (the CPU kernel, [`rope_qk`],
/// reads its tables on the host).
///
/// # Shapes
/// x: [n, ≥ width] f32, tables: [2, n, d/2] f32 (cos, then sin) → [n, width] f32
pub fn rope(x: &Tensor<2>, width: usize, d: usize, tables: &Tensor<3>) -> Option<Tensor<2>> {
    gpu::rope(x, width, d, tables)
}

/// Softmax of `scores · scale + mask` over the last dimension (row j of each leading index
/// reads mask row j mod n): the CPU kernel on the Flex backend (in place where the scores are
/// held nowhere else: a vision tower's, whose rows attend without the attention kernel's cell
/// tables), the GPU kernel on a CubeCL one; `otherwise` where neither runs.
///
/// # Shapes
/// scores: [b, r, e] f32, mask: [n, e] f32 additive, r a multiple of n → [b, r, e] f32
pub fn softmax(
    scores: Tensor<3>,
    scale: f64,
    mask: Option<&Tensor<2>>,
    otherwise: impl FnOnce(Tensor<3>) -> Tensor<3>,
) -> Tensor<3> {
    let [b, r, e] = scores.dims();
    let mask_fits = mask.is_none_or(|m| {
        let [n, me] = m.dims();
        n > 0 && me == e && r.is_multiple_of(n) && m.dtype() == DType::F32
    });
    if scores.device() != Device::flex() || scores.dtype() != DType::F32 || b * r * e == 0 || !mask_fits {
        return match gpu::softmax(&scores, scale, mask) {
            Some(probs) => probs,
            None => otherwise(scores),
        };
    }
    let mask = match mask.map(contiguous) {
        Some(Some(m)) => Some(m),
        Some(None) => return otherwise(scores),
        None => None,
    };
    let mask = mask.as_ref().and_then(|m| m.as_slice::<f32>());
    flex_in_place(scores, |values| exp::softmax_rows(values, e, scale as f32, mask, r), otherwise)
}

/// A vision tower's MLP activation: `x · σ(1.702 x)` (QuickGELU, Qwen2-VL's), or GELU's tanh
/// form (`tanh`), in place in one pass on the Flex backend; `otherwise` elsewhere.
pub fn gelu(x: Tensor<2>, tanh: bool, otherwise: impl FnOnce(Tensor<2>) -> Tensor<2>) -> Tensor<2> {
    let gate = if tanh { swiglu::Gate::Tanh } else { swiglu::Gate::Scaled(1.702) };
    flex_in_place(x, |values| swiglu::gate_in_place(values, gate), otherwise)
}

/// `f` over the f32 values of `x` on the Flex backend: in place where nothing else holds them
/// (the output of the op before), on a copy where something does; `otherwise` on another
/// backend or type.
fn flex_in_place<const D: usize>(
    x: Tensor<D>,
    f: impl FnOnce(&mut [f32]),
    otherwise: impl FnOnce(Tensor<D>) -> Tensor<D>,
) -> Tensor<D> {
    if x.device() != Device::flex() || x.dtype() != DType::F32 {
        return otherwise(x);
    }
    let shape = x.dims();
    let len = shape.iter().product::<usize>();
    let Ok(mut p) = x.clone().try_into_primitive::<Flex>() else { return otherwise(x) };
    drop(x); // the primitive is the only reference now, where `x` was
    if p.as_slice::<f32>().map(<[f32]>::len) != Some(len) || p.storage::<f32>().len() != len {
        p = p.to_contiguous();
    }
    if let Some(values) = p.try_storage_mut::<f32>().filter(|s| s.len() == len) {
        f(values);
        return Tensor::from_primitive::<Flex>(p);
    }
    match p.as_slice::<f32>().map(<[f32]>::to_vec) {
        Some(mut values) if values.len() == len => {
            f(&mut values);
            Tensor::from_data(TensorData::new(values, shape), &Device::flex())
        }
        _ => otherwise(Tensor::from_primitive::<Flex>(p)),
    }
}

/// What a product's input goes through first, inside the GPU's few-row kernel where it runs.
#[derive(Debug, Clone, Copy)]
pub enum Pre<'a> {
    /// Nothing.
    Plain,
    /// RMSNorm by this \[k\] weight.
    Norm { weight: &'a Tensor<1>, eps: f64 },
    /// The feed-forward's gate, `act(gate) · up`, over a stacked [gate | up] input of twice the
    /// weight's inputs (SwiGLU's silu, GeGLU's tanh-approximated GELU: Gemma's).
    Gated(Activation),
}

/// `pre(x)·Wᵀ + b + residual` for a decode step's rows (up to [`gpu_fused_rows`]) with a dense
/// weight (f32, f16 or bf16, read in its own type): the GPU kernel on a CubeCL backend, one launch where Burn's
/// ops take the norm or the gate, the casts, the product, the bias and the sum (the CPU's
/// products are the weights' own).
///
/// # Shapes
/// x: [n, k] f32 ([n, 2k] under `Pre::Gated`), w: [out, k], bias: \[out\] f32, residual:
/// [n, out] f32 → [n, out] f32
pub fn gpu_xwt(
    x: &Tensor<2>,
    pre: Pre<'_>,
    w: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    residual: Option<&Tensor<2>>,
) -> Option<Tensor<2>> {
    gpu::xwt(x, pre, w, bias, residual)
}

/// A mixture of experts' feed-forward for a decode step's rows routed on a GPU, over `pre(x)`
/// (x as it is, or normed on the device): each row's `top_k` experts chosen from the router's
/// `scores` there, run over the experts' matrices stacked (`gate_up`: each expert's gate rows
/// then its up rows; `down`: each expert's rows), a pair at a time or grouped by expert there
/// (past one pair an expert), and weighed, and the shared expert's output added, scaled by
/// `sigmoid` of its gate (the scores' last column), and the residual: three or six launches
/// and no read back. `None` where it declines (the CPU, a stack the kernels do not read).
///
/// # Shapes
/// x: [n, h] f32, scores: [n, experts] f32 (of pre(x)), or [n, experts + 1] with a shared
/// expert's gate, gate_up: [experts · 2 · width, h], down: [experts · h, width], shared: [n, h]
/// f32, residual: [n, h] f32 → [n, h] f32
#[allow(clippy::too_many_arguments)]
pub fn gpu_moe(
    x: &Tensor<2>,
    pre: Pre<'_>,
    scores: &Tensor<2>,
    top_k: usize,
    norm: bool,
    [gate_up, down]: [GpuWeight<'_>; 2],
    shared: Option<&Tensor<2>>,
    residual: Option<&Tensor<2>>,
) -> Option<Tensor<2>> {
    let y = gpu::moe(x, pre, scores, top_k, norm, gate_up, down, shared, residual)?;
    // Its two products: the gate/up and the down.
    KernelCall::CubeExperts.count();
    KernelCall::CubeExperts.count();
    Some(y)
}

/// The rows one cube of the GPU's few-row products takes (each keeps this many sums a lane);
/// a launch of more rows gives each chunk of four its own cubes.
pub const GPU_XWT_ROWS: usize = 4;

/// The most rows the GPU's few-row products take (a decode step): the weight read in its own
/// type or its blocks, the input's norm or gate, the bias, the residual and (the q/k/v
/// projection) RoPE and the KV write inside, a launch or one a part. More rows (a prompt) take
/// Burn's matmul, a quantized matrix dequantized for it first, and the norm, RoPE and KV write
/// launched apart.
///
/// Each chunk of [`GPU_XWT_ROWS`] rows reads the weight again, from the cache where its
/// neighbour cubes just read it: at 16 rows a quantized matrix's blocks are read four times
/// (Q4_K: about 2.3 bytes a weight), where dequantizing it to f16 writes and reads 4 bytes a
/// weight besides reading the blocks once, and keeps that memory. Not measured on a GPU yet:
/// `LLAISYS_GPU_FUSED_ROWS=N` sets it ([`gpu_fused_rows`]).
pub const GPU_FUSED_ROWS: usize = 16;

/// The most rows the GPU's few-row products take: `LLAISYS_GPU_FUSED_ROWS` where it is a number
/// from 1 to 64, else [`GPU_FUSED_ROWS`]. Read once.
pub fn gpu_fused_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        let rows = std::env::var("LLAISYS_GPU_FUSED_ROWS").ok().and_then(|v| v.trim().parse().ok());
        rows.filter(|r| (1..=64).contains(r)).unwrap_or(GPU_FUSED_ROWS)
    })
}

/// Above this many (row, expert) pairs an expert on average, a GPU's experts group their rows
/// on the host (`Moe`'s grouped pass, a read back of the router's scores): Burn's tiled
/// products read each expert's matrices once for all its rows, where the device's grouped
/// products read them once a chunk of four rows. A prompt's prefill groups on the host; a
/// decode batch (up to 256 rows of top-8 of 128 experts, as Qwen3-30B-A3B) on the device. Not
/// measured on a GPU yet: `LLAISYS_GPU_MOE_GROUPED=N` sets it ([`gpu_moe_pairs_per_expert`]).
pub const GPU_MOE_PAIRS_PER_EXPERT: usize = 16;

/// The most (row, expert) pairs an expert on average that a GPU's experts route on the device:
/// `LLAISYS_GPU_MOE_GROUPED` where it is a number, else [`GPU_MOE_PAIRS_PER_EXPERT`]; at least
/// 1 (0 and 1: past one pair an expert, on the host; a large one: prefill too, on the device).
/// Read once.
pub fn gpu_moe_pairs_per_expert() -> usize {
    static PAIRS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAIRS.get_or_init(|| {
        let pairs = std::env::var("LLAISYS_GPU_MOE_GROUPED").ok().and_then(|v| v.trim().parse().ok());
        pairs.unwrap_or(GPU_MOE_PAIRS_PER_EXPERT).max(1)
    })
}

/// Whether this build has the GPU kernels (a CubeCL backend, without Burn's fusion).
pub const GPU_KERNELS: bool = gpu::BUILT;

/// Whether quantized weights can stay in their ggml blocks on `device`: a GPU whose kernels
/// read them (this build has them, `LLAISYS_GPU_KERNELS` does not turn them off).
pub fn blocks_run_on(device: &Device) -> bool {
    GPU_KERNELS && *device != Device::flex() && gpu::enabled()
}

/// The largest buffer `device` allocates, in bytes: a GPU's (asked of its runtime once per
/// device), `u64::MAX` for the CPU or where the runtime does not say.
pub fn buffer_limit(device: &Device) -> u64 {
    static LIMITS: std::sync::Mutex<Vec<(Device, u64)>> = std::sync::Mutex::new(Vec::new());
    if *device == Device::flex() {
        return u64::MAX;
    }
    let mut limits = LIMITS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, limit)) = limits.iter().find(|(d, _)| d == device) {
        return *limit;
    }
    let limit = gpu::buffer_limit(device).unwrap_or(u64::MAX);
    limits.push((device.clone(), limit));
    limit
}

/// `pre(x)·Wᵀ + b + residual` for a decode step's rows (up to [`gpu_fused_rows`]) with a
/// quantized weight on a GPU, read in its blocks (`quant::device`): one launch a part of the
/// stacked matrix.
///
/// # Shapes
/// x: [n, k] f32 ([n, 2k] under `Pre::Gated`), parts: rows of k values, out of them in
/// all, bias: \[out\] f32, residual: [n, out] f32 → [n, out] f32
pub fn gpu_xwt_q(
    x: &Tensor<2>,
    pre: Pre<'_>,
    parts: &[DeviceRows],
    k: usize,
    bias: Option<&Tensor<1>>,
    residual: Option<&Tensor<2>>,
) -> Option<Tensor<2>> {
    gpu::xwt_q(x, pre, parts, k, bias, residual)
}

/// A quantized matrix on a GPU as floats of `dtype` (f32, f16 or bf16), dequantized there: all
/// its rows (the parts stacked), or with `ids` (i32) those rows (each from the part that holds it).
///
/// # Shapes
/// parts: rows of k values, ids: \[n\] → [rows or n, k]
pub fn gpu_dequantize(parts: &[DeviceRows], k: usize, ids: Option<&Tensor<1, Int>>, dtype: DType) -> Option<Tensor<2>> {
    gpu::dequantize(parts, k, ids, dtype)
}

/// The index of each row's largest value on a GPU (the first on ties, never NaN or −∞) in two
/// launches, so that greedy decoding reads back one id a row.
///
/// # Shapes
/// x: [n, vocab] f32 → \[n\] i32
pub fn gpu_argmax(x: &Tensor<2>) -> Option<Tensor<1, Int>> {
    gpu::argmax(x)
}

/// Each row's `k` largest values with their indices on a GPU, best first (the first index
/// among equal values; never NaN or −∞), in two launches, so that a sampled row reads back `k`
/// candidates instead of the vocabulary. Past a row's values: (−f32::MAX, 1e30). With `temps`
/// (a temperature a row, uploaded), each row's probability mass at its temperature follows its
/// candidates as a last pair (Σ exp((l − max) / t) over the row's values but NaN; 0 where t ≤ 0),
/// so that a sampler without a top-k can tell whether its draw falls among the candidates.
///
/// # Shapes
/// x: [n, vocab] f32, temps: \[n\] → [n, k (+ 1 with temps), 2] f32 (value, index)
pub fn gpu_top_k(x: &Tensor<2>, k: usize, temps: Option<&[f32]>) -> Option<Tensor<3>> {
    gpu::top_k(x, k, temps)
}

/// `act(gate) · up`: the CPU kernel on the Flex backend, the GPU kernel on a CubeCL one.
///
/// # Shapes
/// gate_up: [n, 2 · i] f32, gate in the first half of each row → [n, i] f32
pub fn swiglu(gate_up: &Tensor<2>, act: Activation) -> Option<Tensor<2>> {
    flex_swiglu(gate_up, act).or_else(|| gpu::swiglu(gate_up, act))
}

/// `act(gate) · up` on the host, for rows already there.
///
/// # Shapes
/// gate_up: [n, 2 · width] row-major → [n, width]
pub(crate) fn swiglu_host(gate_up: &[f32], width: usize, act: Activation) -> Vec<f32> {
    swiglu::run(gate_up, width, act)
}

fn flex_swiglu(gate_up: &Tensor<2>, act: Activation) -> Option<Tensor<2>> {
    let [n, width] = gate_up.dims();
    if gate_up.dtype() != DType::F32 || width == 0 || !width.is_multiple_of(2) {
        return None;
    }
    let device = gate_up.device();
    let x = contiguous(gate_up)?;
    let out = swiglu::run(x.as_slice::<f32>()?, width / 2, act);
    Some(Tensor::from_data(TensorData::new(out, [n, width / 2]), &device))
}

/// `out` ([m, n] row-major) split by columns: per range (sorted, adjacent, covering `0..n`),
/// that range of every row, so a task per range owns its columns of the whole output.
pub(crate) fn split_columns<'a>(out: &'a mut [f32], n: usize, ranges: &[Range<usize>]) -> Vec<Vec<&'a mut [f32]>> {
    let rows = out.len().checked_div(n).unwrap_or(0);
    let mut pieces: Vec<Vec<&mut [f32]>> = ranges.iter().map(|_| Vec::with_capacity(rows)).collect();
    for row in out.chunks_mut(n.max(1)) {
        let mut rest = row;
        for (piece, range) in pieces.iter_mut().zip(ranges) {
            let (head, tail) = rest.split_at_mut(range.len());
            piece.push(head);
            rest = tail;
        }
        debug_assert!(rest.is_empty(), "column ranges do not cover the row");
    }
    pieces
}

/// The Flex primitive of `x`, copied into a contiguous buffer only when it is a strided view.
fn contiguous<const D: usize>(x: &Tensor<D>) -> Option<<Flex as burn::backend::BackendTypes>::FloatTensorPrimitive> {
    let x = x.clone().try_into_primitive::<Flex>().ok()?;
    Some(if x.as_slice::<f32>().is_some() { x } else { x.to_contiguous() })
}

/// Deterministic values in [-1, 1) for the kernels' and layers' tests.
#[cfg(test)]
pub(crate) fn test_values(len: usize, seed: u32) -> Vec<f32> {
    (0..len).map(|i| (((i as u32 ^ seed).wrapping_mul(2654435761) >> 16) % 1000) as f32 / 500.0 - 1.0).collect()
}
