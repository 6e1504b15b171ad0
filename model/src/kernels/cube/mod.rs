//! GPU kernels for the CubeCL backends (issue 31), so that a dense layer's decode step is five
//! launches where Burn's ops took sixty: the few-row product with its input's norm or gate and
//! its bias and residual (`xwt`; over quantized blocks, `xwt_q`), the q/k/v projection with RoPE
//! and the KV write (`xwt_rope_kv`, `xwt_rope_kv_q`; with per-head q/k norms, the projection
//! then `rope_kv`), cell attention (split and merged past 256 cells); quantized
//! blocks dequantized (`dequantize`: prefill's products, embedding rows); and RMSNorm, SwiGLU,
//! RoPE, the KV write and a scaled, masked softmax alone, for the paths those do not take. Like the CPU kernels beside them, each entry point
//! takes Burn tensors, runs only where they live on a CubeCL device (wgpu or CUDA) in f32 and in
//! rows (not a matmul's storage tiles), and otherwise declines so the caller keeps the Burn ops.
//! Built with Burn's `fusion`, the tensors are fusion handles and these kernels stand aside
//! (Burn fuses the element-wise chains itself).

pub mod graph;
mod kernels;

use std::sync::OnceLock;

use burn::backend::{BackendTypes, Cube};
use burn::cubecl::ir::features::TypeUsage;
use burn::cubecl::prelude::{CubeCount, CubeDim, Scalar};
use burn::tensor::{DType, Float, Int, Shape, Tensor, TensorData};

use kernels::ROW_UNITS;

use super::{GpuWeight, Pre, QkNorms};
use crate::config::Activation;
use crate::quant::QuantType;
use crate::quant::device::DeviceRows;

/// This build has the GPU kernels.
pub const BUILT: bool = true;

type CubeTensor = <Cube as BackendTypes>::FloatTensorPrimitive;

/// Whether the kernels run: `LLAISYS_GPU_KERNELS=off` leaves every layer to Burn's ops (to
/// compare the two on a device, or to step around a kernel a driver miscompiles).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !std::env::var("LLAISYS_GPU_KERNELS").is_ok_and(|v| matches!(v.as_str(), "off" | "0")))
}

/// The CubeCL tensor of `x` where it is one in f32 rows (and the kernels are on).
fn cube<const D: usize>(x: &Tensor<D>) -> Option<CubeTensor> {
    if x.dtype() != DType::F32 || !enabled() {
        return None;
    }
    let t = x.clone().try_into_primitive::<Cube>().ok()?;
    (!t.meta.is_tiled()).then_some(t)
}

/// A new contiguous f32 tensor of `shape` on `like`'s device (its values unset).
fn empty(like: &CubeTensor, shape: impl Into<Shape>) -> CubeTensor {
    empty_as(like, shape, DType::F32)
}

/// A new contiguous tensor of `shape` and `dtype` on `like`'s device (its values unset).
fn empty_as(like: &CubeTensor, shape: impl Into<Shape>, dtype: DType) -> CubeTensor {
    let shape = shape.into();
    let handle = like.client.empty(shape.num_elements() * dtype.size());
    let t = CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), shape, handle, dtype);
    graph::hold_primitive(&t);
    t
}

fn tensor<const D: usize>(t: CubeTensor) -> Tensor<D> {
    Tensor::from_primitive::<Cube>(t)
}

/// Whether a kernel can read `dtype` (f32, f16 or bf16) in its buffers and widen it to f32 on
/// `client`'s device; false for any other type.
fn converts(dtype: DType, client: &burn::cubecl::client::Client) -> bool {
    let uses = match dtype {
        DType::F32 => <f32 as Scalar>::supported_uses(client),
        DType::F16 => <half::f16 as Scalar>::supported_uses(client),
        DType::BF16 => <half::bf16 as Scalar>::supported_uses(client),
        _ => return false,
    };
    uses.contains(TypeUsage::Buffer) && uses.contains(TypeUsage::Conversion)
}

/// Launches `$kernel::launch::<C>(client, count, dim, $args..)` with C the float type `$dtype`
/// names (f32, f16 or bf16; check it with [`converts`] first); `$kernel[T, ..]` puts the given
/// types before C (`launch::<T, .., C>`).
macro_rules! launch_in {
    ($dtype:expr, $kernel:path $([$($lead:ty),*])?, $client:expr, $count:expr, $dim:expr, $($arg:expr),* $(,)?) => {{
        use $kernel as kernel;
        match $dtype {
            DType::F16 => kernel::launch::<$($($lead,)*)? half::f16>($client, $count, $dim, $($arg),*),
            DType::BF16 => kernel::launch::<$($($lead,)*)? half::bf16>($client, $count, $dim, $($arg),*),
            _ => kernel::launch::<$($($lead,)*)? f32>($client, $count, $dim, $($arg),*),
        }
    }};
}

/// Cubes for one unit per value of `count`, in a grid a device accepts (at most 65,535 cubes
/// along a dimension).
fn elementwise(count: usize) -> (CubeCount, CubeDim) {
    const UNITS: usize = 256;
    let cubes = count.div_ceil(UNITS).max(1) as u32;
    let (x, y) = (cubes.min(65_535), cubes.div_ceil(65_535));
    (CubeCount::Static(x, y, 1), CubeDim::new_1d(UNITS as u32))
}

/// `count` cubes of `units` units, on two grid dimensions past 65,535 (the kernels stop the
/// cubes past `count`).
fn cubes(count: usize, units: usize) -> (CubeCount, CubeDim) {
    let count = count.max(1) as u32;
    let (x, y) = (count.min(65_535), count.div_ceil(65_535));
    (CubeCount::Static(x, y, 1), CubeDim::new_1d(units as u32))
}

/// The largest buffer `device` allocates, in bytes, as its runtime says (`None` off CubeCL).
pub fn buffer_limit(device: &burn::tensor::Device) -> Option<u64> {
    let t = Tensor::<1>::empty([1], device).try_into_primitive::<Cube>().ok()?;
    Some(t.client.properties().memory.max_page_size)
}

/// The most units a cube may have on every device (wgpu's default limit).
const MAX_UNITS: usize = 256;

/// One cube of [`ROW_UNITS`] units per row.
fn per_row(rows: usize) -> (CubeCount, CubeDim) {
    cubes(rows, ROW_UNITS)
}

/// RMSNorm, `x / sqrt(mean(x²) + eps) · w` per row.
///
/// # Shapes
/// x: [n, h] f32, w: \[h\] f32 → [n, h] f32
pub fn rms_norm(x: &Tensor<2>, w: &Tensor<1>, eps: f64) -> Option<Tensor<2>> {
    let [n, h] = x.dims();
    if w.dims() != [h] || n == 0 {
        return None;
    }
    let (x, w) = (cube(x)?, cube(w)?);
    let out = empty(&x, [n, h]);
    let (count, dim) = per_row(n);
    kernels::rms_norm::launch(
        &x.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        w.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        eps as f32,
        ROW_UNITS,
    );
    Some(tensor(out))
}

/// `act(gate) · up` (SwiGLU's silu, GeGLU's tanh-approximated GELU).
///
/// # Shapes
/// gate_up: [n, 2 · i] f32, gate in the first half of each row → [n, i] f32
pub fn swiglu(gate_up: &Tensor<2>, act: Activation) -> Option<Tensor<2>> {
    let [n, width] = gate_up.dims();
    if width == 0 || !width.is_multiple_of(2) {
        return None;
    }
    // gpt-oss's clamped gate: Burn's ops.
    let gelu = match act {
        Activation::Silu => false,
        Activation::GeluTanh => true,
        Activation::ClampedSwiglu { .. } => return None,
    };
    let x = cube(gate_up)?;
    let out = empty(&x, [n, width / 2]);
    let (count, dim) = elementwise(n * width / 2);
    kernels::swiglu::launch(&x.client.clone(), count, dim, x.into_tensor_arg(), out.clone().into_tensor_arg(), gelu);
    Some(tensor(out))
}

/// The rotary embedding of the first `width` columns of each row of x (whole heads of `d`),
/// each token by its own angles.
///
/// # Shapes
/// x: [n, ≥ width] f32, tables: [2, n, d/2] f32 (cos, sin) → [n, width] f32
pub fn rope(x: &Tensor<2>, width: usize, d: usize, tables: &Tensor<3>) -> Option<Tensor<2>> {
    let [n, columns] = x.dims();
    if d == 0 || !d.is_multiple_of(2) || !width.is_multiple_of(d) || width > columns || tables.dims() != [2, n, d / 2] {
        return None;
    }
    let (x, tables) = (cube(x)?, cube(tables)?);
    let out = empty(&x, [n, width]);
    let (count, dim) = elementwise(n * width / 2);
    kernels::rope::launch(
        &x.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        tables.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        d,
    );
    Some(tensor(out))
}

/// Softmax of `scores · scale + mask` over the last dimension; row j of each leading index reads
/// mask row j mod n.
///
/// # Shapes
/// scores: [b, r, e] f32, mask: [n, e] f32 additive with r a multiple of n → [b, r, e] f32
pub fn softmax(scores: &Tensor<3>, scale: f64, mask: Option<&Tensor<2>>) -> Option<Tensor<3>> {
    let [b, r, e] = scores.dims();
    if b * r == 0 || e == 0 {
        return None;
    }
    if let Some(mask) = mask {
        let [n, me] = mask.dims();
        if n == 0 || me != e || !r.is_multiple_of(n) {
            return None;
        }
    }
    let s = cube(scores)?;
    let m = match mask {
        Some(mask) => cube(mask)?,
        None => s.clone(),
    };
    let out = empty(&s, [b, r, e]);
    let (count, dim) = per_row(b * r);
    kernels::softmax::launch(
        &s.client.clone(),
        count,
        dim,
        s.into_tensor_arg(),
        m.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        scale as f32,
        mask.is_some(),
        ROW_UNITS,
    );
    Some(tensor(out))
}

/// The arguments of a few-row product kernel ([`kernels::xwt`]'s `xwt_column`, [`kernels::xwt_q`])
/// besides its weight: x, the norm's weight, the `pre` code and eps, the bias. An absent norm or
/// bias is a placeholder argument the kernel never reads.
struct Product {
    x: CubeTensor,
    norm: CubeTensor,
    code: u32,
    eps: f32,
    bias: CubeTensor,
    has_bias: bool,
}

impl Product {
    /// `None` where the kernel does not take them, for a weight of `outs` rows of `k`: no rows
    /// or more than [`crate::kernels::gpu_fused_rows`], x not as wide as `pre` reads, a bias not
    /// one per output, tensors not CubeCL rows in f32.
    fn new(x: &Tensor<2>, pre: Pre<'_>, [outs, k]: [usize; 2], bias: Option<&Tensor<1>>) -> Option<Self> {
        let [n, width] = x.dims();
        let inputs = if matches!(pre, Pre::Gated(_)) { 2 * k } else { k };
        if n == 0 || n > crate::kernels::gpu_fused_rows() || width != inputs || k == 0 || outs == 0 {
            return None;
        }
        if bias.is_some_and(|b| b.dims() != [outs]) {
            return None;
        }
        let x = cube(x)?;
        let (code, norm, eps) = pre_args(pre, &x, k)?;
        let bias = match bias {
            Some(b) => Some(cube(b)?),
            None => None,
        };
        let (has_bias, bias) = (bias.is_some(), bias.unwrap_or_else(|| x.clone()));
        Some(Self { x, norm, code, eps, bias, has_bias })
    }

    /// The rows a cube takes (the kernels' `rows`): [`kernels::XWT_ROWS`], fewer where x has
    /// no more.
    fn cube_rows(&self) -> usize {
        self.x.meta.shape()[0].min(kernels::XWT_ROWS)
    }

    /// The launch for `blocks` blocks of output columns: a cube a block and chunk of
    /// [`kernels::XWT_ROWS`] rows (the kernels' `product_cube`).
    fn grid(&self, blocks: usize) -> (CubeCount, CubeDim) {
        cubes(blocks * self.x.meta.shape()[0].div_ceil(kernels::XWT_ROWS), kernels::XWT_UNITS)
    }

    /// A dense weight as the kernels read it ([`dense_weight`]).
    fn weight(&self, w: &Tensor<2>) -> Option<CubeTensor> {
        dense_weight(w, &self.x.client)
    }

    /// `residual` as the kernels read it ([n, outs]), or a placeholder they never read.
    fn residual(&self, residual: Option<&Tensor<2>>, outs: usize) -> Option<(CubeTensor, bool)> {
        match residual {
            Some(r) if r.dims() == [self.x.meta.shape()[0], outs] => Some((cube(r)?, true)),
            Some(_) => None,
            None => Some((self.x.clone(), false)),
        }
    }
}

/// `pre`'s code for the product kernels, the norm's weight (x, never read, where it has none)
/// and its eps; `None` for a norm not of the `k` inputs.
fn pre_args(pre: Pre<'_>, x: &CubeTensor, k: usize) -> Option<(u32, CubeTensor, f32)> {
    Some(match pre {
        Pre::Plain => (kernels::PRE_PLAIN, x.clone(), 0.0),
        Pre::Norm { weight, eps } if weight.dims() == [k] => (kernels::PRE_NORM, cube(weight)?, eps as f32),
        Pre::Norm { .. } => return None,
        Pre::Gated(Activation::Silu) => (kernels::PRE_SWIGLU, x.clone(), 0.0),
        Pre::Gated(Activation::GeluTanh) => (kernels::PRE_GEGLU, x.clone(), 0.0),
        // gpt-oss's clamped gate is applied apart (the product reads its output).
        Pre::Gated(Activation::ClampedSwiglu { .. }) => return None,
    })
}

/// A dense weight as the kernels read it: CubeCL rows of a type `client`'s device reads and
/// widens.
fn dense_weight(w: &Tensor<2>, client: &burn::cubecl::client::Client) -> Option<CubeTensor> {
    let w = w.clone().try_into_primitive::<Cube>().ok().filter(|w| !w.meta.is_tiled())?;
    converts(w.dtype, client).then_some(w)
}

/// `pre(x)·Wᵀ + b + residual` for a decode step's rows, the weight read in its own type.
///
/// # Shapes
/// x: [n ≤ [`crate::kernels::gpu_fused_rows`], k] f32 ([n, 2k] under `Pre::Gated`), w: [out, k] f32, f16 or bf16, bias: \[out\]
/// f32, residual: [n, out] f32 → [n, out] f32
pub fn xwt(
    x: &Tensor<2>,
    pre: Pre<'_>,
    w: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    residual: Option<&Tensor<2>>,
) -> Option<Tensor<2>> {
    let [n, _] = x.dims();
    let [outs, _] = w.dims();
    let p = Product::new(x, pre, w.dims(), bias)?;
    let w = p.weight(w)?;
    let (residual, has_residual) = p.residual(residual, outs)?;
    let out = empty(&p.x, [n, outs]);
    let (count, dim) = p.grid(outs.div_ceil(kernels::XWT_OUTS));
    let rows = p.cube_rows();
    let client = p.x.client.clone();
    launch_in!(
        w.dtype,
        kernels::xwt,
        &client,
        count,
        dim,
        p.x.into_tensor_arg(),
        w.into_tensor_arg(),
        p.norm.into_tensor_arg(),
        p.bias.into_tensor_arg(),
        residual.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        p.eps,
        rows,
        p.code,
        p.has_bias,
        has_residual,
    );
    Some(tensor(out))
}

/// The stacked q/k/v projection of a decode step's rows, its norm and bias applied, with
/// RoPE and the KV write in the same launch: q's heads rotated (returned), k's rotated and v's
/// copied into their cells of a layer's cache, in place ([`in_place`]). A quantized weight takes
/// a launch a part, each part whole heads. `None`, nothing written, where it declines (what
/// [`Product::new`] declines, a cache type the device does not read, a shape it does not take,
/// a part that splits a head).
///
/// # Shapes
/// - x: [n ≤ [`crate::kernels::gpu_fused_rows`], k] f32; w: [(heads + 2 · kv_heads) · d, k] f32, f16, bf16 or blocks; bias: that
///   many f32
/// - tables: [2, n, d/2] f32 (cos, sin); caches: [kv_heads, capacity, d] each; slots: \[n\] i32
/// - returns q: [n, heads · d] f32
#[allow(clippy::too_many_arguments)]
pub fn xwt_rope_kv(
    x: &Tensor<2>,
    pre: Pre<'_>,
    w: GpuWeight<'_>,
    bias: Option<&Tensor<1>>,
    heads: usize,
    d: usize,
    tables: &Tensor<3>,
    caches: &mut [Tensor<3>; 2],
    slots: &Tensor<1, Int>,
) -> Option<Tensor<2>> {
    let [n, _] = x.dims();
    let [kv_heads, _, cd] = caches[0].dims();
    let width = (heads + 2 * kv_heads) * d;
    let [outs, k] = w.dims()?;
    if d < 2 || !d.is_multiple_of(2) || cd != d || outs != width {
        return None;
    }
    if tables.dims() != [2, n, d / 2] || slots.dims() != [n] {
        return None;
    }
    let p = Product::new(x, pre, [outs, k], bias)?;
    /// The weight as the kernels read it.
    enum Source {
        Dense(Box<CubeTensor>),
        Blocks(Vec<(u32, CubeTensor)>),
    }
    let source = match w {
        GpuWeight::Dense(w) => Source::Dense(Box::new(p.weight(w)?)),
        GpuWeight::Blocks(parts) if parts.iter().all(|part| part.rows().is_multiple_of(d)) => {
            Source::Blocks(block_parts(parts, k)?)
        }
        GpuWeight::Blocks(_) => return None,
    };
    let tables = cube(tables)?;
    let slots = slots.clone().try_into_primitive::<Cube>().ok().filter(|t| t.dtype == DType::I32)?;
    let q = empty(&p.x, [n, heads * d]);
    let pairs_per_cube = kernels::XWT_OUTS / 2;
    let rows = p.cube_rows();
    let written = in_place(caches, |kc, vc| match source {
        Source::Dense(w) => {
            let (count, dim) = p.grid((width / 2).div_ceil(pairs_per_cube));
            let w_dtype = w.dtype;
            let args =
                (p.x.into_tensor_arg(), (*w).into_tensor_arg(), p.norm.into_tensor_arg(), p.bias.into_tensor_arg());
            // The weight's type, then the cache's.
            macro_rules! launch {
                ($w:ty) => {
                    launch_in!(
                        kc.dtype,
                        kernels::xwt_rope_kv[$w],
                        &kc.client,
                        count,
                        dim,
                        args.0,
                        args.1,
                        args.2,
                        args.3,
                        tables.into_tensor_arg(),
                        q.clone().into_tensor_arg(),
                        kc.clone().into_tensor_arg(),
                        vc.clone().into_tensor_arg(),
                        slots.into_tensor_arg(),
                        p.eps,
                        rows,
                        p.code,
                        p.has_bias,
                        d,
                    )
                };
            }
            match w_dtype {
                DType::F16 => launch!(half::f16),
                DType::BF16 => launch!(half::bf16),
                _ => launch!(f32),
            }
        }
        Source::Blocks(parts) => {
            let mut head0 = 0;
            for (format, words) in parts {
                let part_rows = words.meta.shape()[0];
                let (count, dim) = p.grid((part_rows / 2).div_ceil(pairs_per_cube));
                launch_in!(
                    kc.dtype,
                    kernels::xwt_rope_kv_q,
                    &kc.client,
                    count,
                    dim,
                    p.x.clone().into_tensor_arg(),
                    words.into_tensor_arg(),
                    p.norm.clone().into_tensor_arg(),
                    p.bias.clone().into_tensor_arg(),
                    tables.clone().into_tensor_arg(),
                    q.clone().into_tensor_arg(),
                    kc.clone().into_tensor_arg(),
                    vc.clone().into_tensor_arg(),
                    slots.clone().into_tensor_arg(),
                    p.eps,
                    head0,
                    rows,
                    p.code,
                    p.has_bias,
                    d,
                    format,
                );
                head0 += part_rows / d;
            }
        }
    });
    written.then(|| tensor(q))
}

// The kernels name a format by its ggml type id.
const _: () = assert!(
    QuantType::Q8_0.ggml_id() == kernels::Q8_0
        && QuantType::Q4_0.ggml_id() == kernels::Q4_0
        && QuantType::Q4_1.ggml_id() == kernels::Q4_1
        && QuantType::Q5_0.ggml_id() == kernels::Q5_0
        && QuantType::Q5_1.ggml_id() == kernels::Q5_1
        && QuantType::Q2K.ggml_id() == kernels::Q2_K
        && QuantType::Q3K.ggml_id() == kernels::Q3_K
        && QuantType::Q4K.ggml_id() == kernels::Q4_K
        && QuantType::Q5K.ggml_id() == kernels::Q5_K
        && QuantType::Q6K.ggml_id() == kernels::Q6_K
        && QuantType::Iq4Nl.ggml_id() == kernels::IQ4_NL
        && QuantType::Mxfp4.ggml_id() == kernels::MXFP4
);

/// Each part's format code and words as the kernels read them (rows of `k` values).
fn block_parts(parts: &[DeviceRows], k: usize) -> Option<Vec<(u32, CubeTensor)>> {
    if !enabled() || k == 0 || !k.is_multiple_of(kernels::CHUNK) {
        return None;
    }
    parts
        .iter()
        .map(|part| {
            let words = part.words.clone().try_into_primitive::<Cube>().ok()?;
            let fits = part.k == k && words.dtype == DType::U32 && words.is_contiguous();
            Some((part.ty.ggml_id(), words)).filter(|_| fits)
        })
        .collect()
}

/// `pre(x)·Wᵀ + b + residual` for a decode step's rows with a quantized weight read in its
/// blocks: one launch a part (stacked parts of different formats), each writing its columns.
///
/// # Shapes
/// x: [n ≤ [`crate::kernels::gpu_fused_rows`], k] f32 ([n, 2k] under `Pre::Gated`), parts: rows of k values stacked into
/// `out` rows, bias: \[out\] f32, residual: [n, out] f32 → [n, out] f32
pub fn xwt_q(
    x: &Tensor<2>,
    pre: Pre<'_>,
    parts: &[DeviceRows],
    k: usize,
    bias: Option<&Tensor<1>>,
    residual: Option<&Tensor<2>>,
) -> Option<Tensor<2>> {
    let [n, _] = x.dims();
    let outs = parts.iter().map(DeviceRows::rows).sum();
    let p = Product::new(x, pre, [outs, k], bias)?;
    let (residual, has_residual) = p.residual(residual, outs)?;
    let parts = block_parts(parts, k)?;
    let out = empty(&p.x, [n, outs]);
    let client = p.x.client.clone();
    let rows = p.cube_rows();
    let mut col0 = 0;
    for (format, words) in parts {
        let part_rows = words.meta.shape()[0];
        let (count, dim) = p.grid(part_rows.div_ceil(kernels::XWT_OUTS));
        kernels::xwt_q::launch(
            &client,
            count,
            dim,
            p.x.clone().into_tensor_arg(),
            words.into_tensor_arg(),
            p.norm.clone().into_tensor_arg(),
            p.bias.clone().into_tensor_arg(),
            residual.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            p.eps,
            col0,
            rows,
            p.code,
            p.has_bias,
            has_residual,
            format,
        );
        col0 += part_rows;
    }
    Some(tensor(out))
}

/// A quantized matrix's rows as floats of `dtype` (f32, f16 or bf16): all of them (the parts
/// stacked), or with `ids` rows `ids` (an embedding lookup).
///
/// # Shapes
/// parts: rows of k values; ids: \[n\] i32 → [rows or n, k]
pub fn dequantize(parts: &[DeviceRows], k: usize, ids: Option<&Tensor<1, Int>>, dtype: DType) -> Option<Tensor<2>> {
    let blocks = block_parts(parts, k)?;
    let (_, first) = blocks.first()?;
    let client = first.client.clone();
    if !converts(dtype, &client) {
        return None;
    }
    let (gather, ids) = match ids {
        Some(ids) => (true, ids.clone().try_into_primitive::<Cube>().ok().filter(|t| t.dtype == DType::I32)?),
        // A placeholder the kernel never reads.
        None => (false, empty_as(first, [1], DType::I32)),
    };
    let rows = if gather { ids.meta.shape()[0] } else { parts.iter().map(DeviceRows::rows).sum() };
    let out = empty_as(first, [rows, k], dtype);
    // Each part's first row, in the matrix and (stacking them all) in out.
    let mut row0 = 0;
    for (format, words) in blocks {
        let part_rows = words.meta.shape()[0];
        let (count, dim) = elementwise(if gather { rows } else { part_rows } * k / kernels::CHUNK);
        launch_in!(
            dtype,
            kernels::dequantize,
            &client,
            count,
            dim,
            words.into_tensor_arg(),
            ids.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            row0,
            gather,
            format,
        );
        row0 += part_rows;
    }
    Some(tensor(out))
}

/// Attention of each row over only the cells it sees, through a cell table made by
/// [`crate::kernels::CellTable`]: one launch, or where a row sees more than
/// [`kernels::SPLIT_CELLS`] cells, its cells split across cubes and a second launch merging them
/// (a long context keeps the device busy at batch 1).
///
/// # Shapes
/// - q: [n, heads, d] f32 (rotated)
/// - k, v: [kv_heads, capacity, d] f32, f16 or bf16 (both the same): a layer's whole cache
/// - cells: [n, 1 + width] i32: each row's count of visible cells, then the cells (none empty)
/// - returns [n, heads · d] f32
///
/// With `softcap`, each scaled score s is `cap · tanh(s / cap)` (Gemma 2's); with `sinks`
/// (\[heads\], gpt-oss's), each head's sink logit joins its softmax's denominator, where a row's
/// splits are merged (or its one split normalised).
pub fn attention(
    q: &Tensor<3>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    cells: &Tensor<2, Int>,
    softcap: Option<f32>,
    sinks: Option<&Tensor<1>>,
) -> Option<Tensor<2>> {
    let [n, heads, d] = q.dims();
    let [kv_heads, _, kd] = k.dims();
    let [rows, width] = cells.dims();
    if kd != d || v.dims() != k.dims() || rows != n || width < 2 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return None;
    }
    // A cube's units share out a head's dimensions.
    if d == 0 || d > kernels::SPLIT_CELLS {
        return None;
    }
    let splits = (width - 1).div_ceil(kernels::SPLIT_CELLS);
    if k.dtype() != v.dtype() {
        return None;
    }
    let qt = cube(q)?;
    let kt = k.clone().try_into_primitive::<Cube>().ok().filter(|t| !t.meta.is_tiled())?;
    let vt = v.clone().try_into_primitive::<Cube>().ok().filter(|t| !t.meta.is_tiled())?;
    let table = cells.clone().try_into_primitive::<Cube>().ok().filter(|t| t.dtype == DType::I32)?;
    if sinks.is_some_and(|s| s.dims() != [heads]) {
        return None;
    }
    // Without sinks, q stands in (never read).
    let sink = match sinks {
        Some(s) => cube(s)?,
        None => qt.clone(),
    };
    let split = splits > 1;
    let scratch = empty(&qt, [n * heads * splits, (width - 1).min(kernels::SPLIT_CELLS)]);
    let out = empty(&qt, [n, heads * d]);
    let parts = if split { empty(&qt, [n * heads * splits, 2 + d]) } else { out.clone() };
    let (count, dim) = cubes(n * heads * splits, kernels::SPLIT_CELLS);
    let client = qt.client.clone();
    let scale = 1.0 / (d as f32).sqrt();
    if !converts(kt.dtype, &client) {
        return None;
    }
    launch_in!(
        kt.dtype,
        kernels::cell_attention,
        &client,
        count,
        dim,
        qt.into_tensor_arg(),
        kt.into_tensor_arg(),
        vt.into_tensor_arg(),
        table.into_tensor_arg(),
        scratch.into_tensor_arg(),
        parts.clone().into_tensor_arg(),
        sink.clone().into_tensor_arg(),
        scale,
        softcap.unwrap_or(0.0),
        splits,
        split,
        sinks.is_some(),
        d,
    );
    if split {
        let (count, dim) = per_row(n * heads);
        kernels::merge_splits::launch(
            &client,
            count,
            dim,
            parts.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            sink.into_tensor_arg(),
            splits,
            sinks.is_some(),
            ROW_UNITS,
        );
    }
    Some(tensor(out))
}

/// Runs `launch` on a layer's two caches, which it writes in place: false, the caches as they
/// were, where they are not CubeCL tensors in rows of a float type the device reads and
/// converts, or another tensor shares them. The caches' own references go before the launch (a
/// buffer written in place must have no other owner) and come back as the primitives after.
fn in_place(caches: &mut [Tensor<3>; 2], launch: impl FnOnce(&CubeTensor, &CubeTensor)) -> bool {
    let [kc, vc] = caches;
    if kc.dtype() != vc.dtype() || kc.dims() != vc.dims() {
        return false;
    }
    let (Ok(kt), Ok(vt)) = (kc.clone().try_into_primitive::<Cube>(), vc.clone().try_into_primitive::<Cube>()) else {
        return false;
    };
    if kt.meta.is_tiled() || vt.meta.is_tiled() || !enabled() || !converts(kt.dtype, &kt.client) {
        return false;
    }
    drop((kc.extract(), vc.extract()));
    let mutable = kt.handle.can_mut() && vt.handle.can_mut();
    if mutable {
        launch(&kt, &vt);
    }
    (*kc, *vc) = (tensor(kt), tensor(vt));
    mutable
}

/// Writes keys and values into their cells of a layer's cache, in place; false (the caches as
/// they were) where the kernel declines ([`in_place`]).
///
/// # Shapes
/// - caches: [kv_heads, capacity, d] each, f32, f16 or bf16 (both the same)
/// - new: [kv_heads, n, d] f32 each
/// - slots: \[n\] i32, the cell of each token
pub fn kv_write(caches: &mut [Tensor<3>; 2], new: [&Tensor<3>; 2], slots: &Tensor<1, Int>) -> bool {
    let [kn, vn] = new;
    let [h, n, d] = kn.dims();
    let [ch, _, cd] = caches[0].dims();
    if vn.dims() != [h, n, d] || ch != h || cd != d || slots.dims() != [n] {
        return false;
    }
    let (Some(kn), Some(vn)) = (cube(kn), cube(vn)) else {
        return false;
    };
    let Some(slots) = slots.clone().try_into_primitive::<Cube>().ok().filter(|t| t.dtype == DType::I32) else {
        return false;
    };
    let (count, dim) = elementwise(h * n * d);
    in_place(caches, |kt, vt| {
        launch_in!(
            kt.dtype,
            kernels::kv_write,
            &kt.client,
            count,
            dim,
            kn.into_tensor_arg(),
            vn.into_tensor_arg(),
            kt.clone().into_tensor_arg(),
            vt.clone().into_tensor_arg(),
            slots.into_tensor_arg(),
        )
    })
}

/// q's heads rotated, and k's rotated and v's copied into their cells of a layer's cache (in
/// place, [`in_place`]), from the stacked q/k/v projection: one launch for RoPE and the KV
/// write, with `norms` q's and k's heads RMS-normalised first (Qwen3's per-head norms). `None`,
/// nothing written, where it declines.
///
/// # Shapes
/// - qkv: [n, (heads + 2 · kv_heads) · d] f32 (q's heads, k's, v's)
/// - tables: [2, n, d/2] f32 (cos, sin); norms: \[d\] f32 each
/// - caches: [kv_heads, capacity, d] each; slots: \[n\] i32
/// - returns q: [n, heads · d] f32
pub fn rope_kv(
    qkv: &Tensor<2>,
    heads: usize,
    d: usize,
    tables: &Tensor<3>,
    norms: Option<QkNorms<'_>>,
    caches: &mut [Tensor<3>; 2],
    slots: &Tensor<1, Int>,
) -> Option<Tensor<2>> {
    let [n, width] = qkv.dims();
    let [kv_heads, _, cd] = caches[0].dims();
    // A cube's units take a head's pairs.
    let units = (d / 2).next_power_of_two();
    if d == 0 || !d.is_multiple_of(2) || cd != d || width != (heads + 2 * kv_heads) * d || units > MAX_UNITS {
        return None;
    }
    if tables.dims() != [2, n, d / 2] || slots.dims() != [n] {
        return None;
    }
    let (x, tables) = (cube(qkv)?, cube(tables)?);
    let slots = slots.clone().try_into_primitive::<Cube>().ok().filter(|t| t.dtype == DType::I32)?;
    let (normed, [q_norm, k_norm], eps) = match norms {
        Some(([qn, kn], _)) if qn.dims() != [d] || kn.dims() != [d] => return None,
        Some(([qn, kn], eps)) => (true, [cube(qn)?, cube(kn)?], eps as f32),
        None => (false, [x.clone(), x.clone()], 0.0),
    };
    let q = empty(&x, [n, heads * d]);
    let (count, dim) = cubes(n * (heads + 2 * kv_heads), units);
    let written = in_place(caches, |kt, vt| {
        launch_in!(
            kt.dtype,
            kernels::rope_kv,
            &kt.client,
            count,
            dim,
            x.into_tensor_arg(),
            tables.into_tensor_arg(),
            q_norm.into_tensor_arg(),
            k_norm.into_tensor_arg(),
            q.clone().into_tensor_arg(),
            kt.clone().into_tensor_arg(),
            vt.clone().into_tensor_arg(),
            slots.into_tensor_arg(),
            eps,
            d,
            units,
            normed,
        )
    });
    written.then(|| tensor(q))
}

/// The index of each row's largest value (the first on ties; NaN and −∞ never), in two
/// launches: one cube a [`kernels::ARGMAX_CHUNK`] of a row, then one a row merging its chunks.
/// `None` past 2^24 columns (the kernels carry indices as f32).
///
/// # Shapes
/// x: [n, vocab] f32 → \[n\] i32
pub fn argmax(x: &Tensor<2>) -> Option<Tensor<1, Int>> {
    let [n, vocab] = x.dims();
    if n == 0 || vocab == 0 || vocab > 1 << 24 {
        return None;
    }
    let x = cube(x)?;
    let chunks = vocab.div_ceil(kernels::ARGMAX_CHUNK);
    let parts = empty(&x, [n * chunks, 2]);
    let out = empty_as(&x, [n], DType::I32);
    let client = x.client.clone();
    let (count, dim) = per_row(n * chunks);
    kernels::argmax_chunks::launch(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        parts.clone().into_tensor_arg(),
        chunks,
        ROW_UNITS,
    );
    let (count, dim) = per_row(n);
    kernels::argmax_merge::launch(
        &client,
        count,
        dim,
        parts.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        chunks,
        ROW_UNITS,
    );
    Some(Tensor::from_primitive::<Cube>(out))
}

/// Each row's `k` largest values, best first (the first index first among equal values; NaN
/// and −∞ never), with their indices, in two launches of [`kernels::top_k`]: one cube a
/// [`kernels::TOP_K_CHUNK`] of a row taking its `k` best, then one a row taking the `k` best of
/// those. Past a row's values the pairs are (−f32::MAX, 1e30). With `temps` (a temperature a
/// row, uploaded), each row's mass at its temperature in a last pair (mass, 0). `None` for k =
/// 0, k over a chunk, past 2^24 columns, or temperatures not one a row.
///
/// # Shapes
/// x: [n, vocab] f32, temps: \[n\] → [n, k (+ 1 with temps), 2] f32 (value, index)
pub fn top_k(x: &Tensor<2>, k: usize, temps: Option<&[f32]>) -> Option<Tensor<3>> {
    let [n, vocab] = x.dims();
    if n == 0 || vocab == 0 || vocab > 1 << 24 || k == 0 || k > kernels::TOP_K_CHUNK {
        return None;
    }
    if temps.is_some_and(|t| t.len() != n) {
        return None;
    }
    let device = x.device();
    let x = cube(x)?;
    let chunks = vocab.div_ceil(kernels::TOP_K_CHUNK);
    let parts = empty(&x, [n * chunks * k, 2]);
    let mass = temps.is_some();
    let out = empty(&x, [n, k + usize::from(mass), 2]);
    let (masses, temps) = match temps {
        Some(temps) => {
            let temps = crate::transfers::upload::<1, Float>(TensorData::new(temps.to_vec(), [n]), &device);
            (empty(&x, [n * chunks]), temps.try_into_primitive::<Cube>().ok()?)
        }
        // Not read: any buffers.
        None => (empty(&x, [1]), empty(&x, [1])),
    };
    let client = x.client.clone();
    for (input, output, cubes, pairs) in [(x, &parts, n * chunks, false), (parts.clone(), &out, n, true)] {
        let (count, dim) = per_row(cubes);
        let (input, output) = (input.into_tensor_arg(), output.clone().into_tensor_arg());
        let (m, t) = (masses.clone().into_tensor_arg(), temps.clone().into_tensor_arg());
        kernels::top_k::launch(&client, count, dim, input, output, m, t, chunks, k, pairs, mass, ROW_UNITS);
    }
    Some(tensor(out))
}

/// A stack of experts' matrices as [`kernels::xwt_experts`] or [`kernels::xwt_q_experts`] read
/// it: dense rows of a type the device widens, or blocks of one format in one part.
enum ExpertStack {
    Dense(CubeTensor),
    Blocks(u32, CubeTensor),
}

impl ExpertStack {
    /// `None` where the kernels do not take `w` (over `k` inputs): blocks in several parts,
    /// rows the device does not read.
    fn new(w: GpuWeight<'_>, k: usize, client: &burn::cubecl::client::Client) -> Option<Self> {
        match w {
            GpuWeight::Dense(t) => Some(Self::Dense(dense_weight(t, client)?)),
            GpuWeight::Blocks([part]) => {
                let (format, words) = block_parts(std::slice::from_ref(part), k)?.pop()?;
                Some(Self::Blocks(format, words))
            }
            GpuWeight::Blocks(_) => None,
        }
    }

    /// Each pair's product with its expert's matrix, or each chunk's (a launch either way):
    /// [pairs, outs] (pair p of the [n, top_k] ids reading row p / top_k of x), or [rows of x,
    /// outs] in [`kernels::moe_group`]'s layout (chunk c's rows through `chunks[c]`'s matrix);
    /// x after `pre` (its code, and the norm's weight and eps: x and 0 where it has none).
    fn products(self, x: &CubeTensor, route: ExpertRoute<'_>, outs: usize, pre: (u32, &CubeTensor, f32)) -> CubeTensor {
        let (code, norm, eps) = pre;
        let blocks = outs.div_ceil(kernels::XWT_OUTS);
        let (rows, units) = match route {
            // A pair's cube writes its own row.
            ExpertRoute::Pairs(ids) => {
                let pairs = ids.meta.shape().num_elements();
                (pairs, pairs)
            }
            ExpertRoute::Chunks(chunks) => (x.meta.shape()[0], chunks.meta.shape().num_elements()),
        };
        let out = empty(x, [rows, outs]);
        let (count, dim) = cubes(blocks * units, kernels::XWT_UNITS);
        let (xa, na, oa) = (x.clone().into_tensor_arg(), norm.clone().into_tensor_arg(), out.clone().into_tensor_arg());
        match (self, route) {
            (Self::Dense(w), ExpertRoute::Pairs(ids)) => {
                let x_div = ids.meta.shape()[1];
                let (wa, ia) = (w.clone().into_tensor_arg(), ids.clone().into_tensor_arg());
                launch_in!(
                    w.dtype,
                    kernels::xwt_experts,
                    &x.client,
                    count,
                    dim,
                    xa,
                    wa,
                    na,
                    ia,
                    oa,
                    x_div,
                    blocks,
                    eps,
                    code
                )
            }
            (Self::Blocks(format, words), ExpertRoute::Pairs(ids)) => {
                let x_div = ids.meta.shape()[1];
                let (wa, ia) = (words.into_tensor_arg(), ids.clone().into_tensor_arg());
                kernels::xwt_q_experts::launch(
                    &x.client, count, dim, xa, wa, na, ia, oa, x_div, blocks, eps, code, format,
                )
            }
            (Self::Dense(w), ExpertRoute::Chunks(chunks)) => {
                let (wa, ca) = (w.clone().into_tensor_arg(), chunks.clone().into_tensor_arg());
                launch_in!(w.dtype, kernels::xwt_grouped, &x.client, count, dim, xa, wa, na, ca, oa, blocks, code)
            }
            (Self::Blocks(format, words), ExpertRoute::Chunks(chunks)) => {
                let (wa, ca) = (words.into_tensor_arg(), chunks.clone().into_tensor_arg());
                kernels::xwt_q_grouped::launch(&x.client, count, dim, xa, wa, na, ca, oa, blocks, code, format)
            }
        }
        out
    }
}

impl ExpertStack {
    /// The pairs' down products of x's rows (pair p's, under SwiGLU's gate) weighed by the
    /// router and summed into each row's output with `tail`'s terms, in one launch
    /// ([`kernels::xwt_experts_sum`]): [n, outs] (ids, weights: [n, top_k]).
    fn summed(self, x: &CubeTensor, ids: &CubeTensor, weights: &CubeTensor, outs: usize, tail: &Tail) -> CubeTensor {
        let [n, top_k] = [0, 1].map(|d| ids.meta.shape()[d]);
        let columns = kernels::XWT_OUTS / top_k.min(kernels::XWT_OUTS);
        let blocks = outs.div_ceil(columns);
        let out = empty(x, [n, outs]);
        let (count, dim) = cubes(n * blocks, kernels::XWT_UNITS);
        let [xa, ia, wta, sa, ga, ra, oa] =
            [x, ids, weights, &tail.shared_y, &tail.gate, &tail.residual, &out].map(|t| t.clone().into_tensor_arg());
        let (shared, residual, gate_col) = (tail.has_shared, tail.has_residual, tail.gate_col);
        // The kind of weight the kernel does not read: a stand-in of the other type.
        let (w, words, format) = match self {
            Self::Dense(w) => (w, empty_as(x, [1], DType::U32), kernels::DENSE),
            Self::Blocks(format, words) => (x.clone(), words, format),
        };
        let (dtype, wa, words) = (w.dtype, w.into_tensor_arg(), words.into_tensor_arg());
        launch_in!(
            dtype,
            kernels::xwt_experts_sum,
            &x.client,
            count,
            dim,
            xa,
            wa,
            words,
            ia,
            wta,
            sa,
            ga,
            gate_col,
            ra,
            oa,
            blocks,
            top_k,
            shared,
            residual,
            format
        );
        out
    }
}

/// What a mixture adds to its experts' weighed sum: the shared expert's output scaled by
/// `sigmoid` of column `gate_col` of `gate` (with `has_shared`), and the residual (with
/// `has_residual`); tensors not read stand in for those without (x).
struct Tail {
    shared_y: CubeTensor,
    gate: CubeTensor,
    gate_col: usize,
    residual: CubeTensor,
    has_shared: bool,
    has_residual: bool,
}

/// How [`ExpertStack::products`] reads its rows' experts: a pair's (`ids[pair]` of the [n, top_k]
/// ids, its row of x `pair / top_k`), or a chunk's of [`kernels::moe_group`]'s layout.
#[derive(Clone, Copy)]
enum ExpertRoute<'a> {
    Pairs(&'a CubeTensor),
    Chunks(&'a CubeTensor),
}

/// The (row, slot) pairs of `ids` ([n, top_k]: each pair's expert of `experts`) grouped by
/// expert on the device ([`kernels::moe_group`]) and x's rows gathered in that order, after
/// `pre` (a norm's code, weight and eps, or plain) ([`kernels::moe_gather`]): two launches.
/// Returns the gathered rows ([chunks · MOE_CHUNK, h]), each chunk's expert ([chunks]: −1 for
/// chunks not used) and each pair's row of the gathered rows ([n · top_k]).
fn group(x: &CubeTensor, ids: &CubeTensor, experts: usize, pre: (u32, &CubeTensor, f32)) -> [CubeTensor; 3] {
    let (code, norm, eps) = pre;
    let (shape, pairs) = (x.meta.shape(), ids.meta.shape().num_elements());
    let (h, top_k) = (shape[1], pairs / shape[0]);
    // Every expert's pairs in whole chunks: at most the pairs' chunks plus a padded one for
    // each expert chosen.
    let chunks = (pairs + (kernels::MOE_CHUNK - 1) * experts.min(pairs)).div_ceil(kernels::MOE_CHUNK);
    let rows = chunks * kernels::MOE_CHUNK;
    let i32s = |len| empty_as(x, [len], DType::I32);
    let (slots, order, experts_of, starts) = (i32s(pairs), i32s(rows), i32s(chunks), i32s(experts + 1));
    let [ia, sa, oa, ea, sta] = [ids, &slots, &order, &experts_of, &starts].map(|t| t.clone().into_tensor_arg());
    let (one, units) = cubes(1, MAX_UNITS);
    kernels::moe_group::launch(&x.client, one, units, ia, sa, oa, ea, sta, top_k, MAX_UNITS);
    let xs = empty(x, [rows, h]);
    let (count, dim) = per_row(rows);
    let [xa, na, oa, ea, xsa] = [x, norm, &order, &experts_of, &xs].map(|t| t.clone().into_tensor_arg());
    let normed = code == kernels::PRE_NORM;
    kernels::moe_gather::launch(&x.client, count, dim, xa, na, oa, ea, xsa, eps, normed, ROW_UNITS);
    [xs, experts_of, slots]
}

/// A mixture of experts' feed-forward for a decode step's rows without the router's scores
/// leaving the device: each row's `top_k` experts chosen from its router's scores
/// ([`kernels::moe_route`]),
/// its (row, slot) pairs run through their experts' gate/up products (of `pre(x)`: x as it is
/// or normed) and down products under SwiGLU's gate (the experts' matrices stacked, expert e's
/// rows from e times a matrix's), and the pairs' outputs weighed and summed with the shared
/// expert's, scaled by `sigmoid` of its gate (the scores' last column), and the residual.
///
/// Two ways through the experts. With a pair an expert or fewer, each pair reads its expert's
/// matrices ([`kernels::xwt_experts`], the norm inside), and the down products sum each row's
/// pairs in their launch ([`kernels::xwt_experts_sum`]): three launches. With more, the pairs
/// are grouped by expert on the device ([`kernels::moe_group`]), x's rows gathered (and normed)
/// in that order ([`kernels::moe_gather`]), each chosen expert's matrices read once a chunk of
/// its pairs ([`kernels::xwt_grouped`]), and the outputs summed ([`kernels::moe_combine`]): six
/// launches. Nothing read back either way.
/// `None` where it declines (shapes, a stack in several parts, tensors not CubeCL rows in f32).
/// How many rows are worth routing here is the caller's choice (`Moe::routes_on_device`).
///
/// # Shapes
/// - x: [n, h] f32, pre: plain or a norm's, scores: [n, experts] f32 (of pre(x)), or [n,
///   experts + 1] with the shared expert's gate last
/// - gate_up: [experts · 2 · width, h] (each expert's gate rows, then its up rows), down:
///   [experts · h, width]
/// - shared: the shared expert's output [n, h] f32; residual: [n, h]
/// - returns [n, h] f32
#[allow(clippy::too_many_arguments)]
pub fn moe(
    x: &Tensor<2>,
    pre: Pre<'_>,
    scores: &Tensor<2>,
    top_k: usize,
    norm: bool,
    gate_up: GpuWeight<'_>,
    down: GpuWeight<'_>,
    shared: Option<&Tensor<2>>,
    residual: Option<&Tensor<2>>,
) -> Option<Tensor<2>> {
    let [n, h] = x.dims();
    let ([gu_rows, gu_k], [d_rows, width]) = (gate_up.dims()?, down.dims()?);
    let experts = d_rows.checked_div(h).unwrap_or(0);
    let fits = scores.dims() == [n, experts + usize::from(shared.is_some())]
        && n > 0
        && width > 0
        && (1..=experts).contains(&top_k);
    if !fits || gu_k != h || gu_rows != experts * 2 * width || d_rows != experts * h || experts >= 1 << 24 {
        return None;
    }
    if shared.is_some_and(|y| y.dims() != [n, h]) || residual.is_some_and(|r| r.dims() != [n, h]) {
        return None;
    }
    let (x, scores) = (cube(x)?, cube(scores)?);
    if matches!(pre, Pre::Gated(_)) {
        return None;
    }
    let (code, norm_weight, eps) = pre_args(pre, &x, h)?;
    let gate_up = ExpertStack::new(gate_up, h, &x.client)?;
    let down = ExpertStack::new(down, width, &x.client)?;
    let shared_y = match shared {
        Some(y) => cube(y)?,
        // Not read.
        None => x.clone(),
    };
    let residual_t = match residual {
        Some(r) => cube(r)?,
        None => x.clone(),
    };
    let tail = Tail {
        shared_y,
        gate: scores.clone(),
        gate_col: experts,
        residual: residual_t,
        has_shared: shared.is_some(),
        has_residual: residual.is_some(),
    };
    let client = x.client.clone();
    let ids = empty_as(&x, [n, top_k], DType::I32);
    let weights = empty(&x, [n, top_k]);
    let (count, dim) = cubes(n, 64);
    let (sa, ia, wa) = (scores.into_tensor_arg(), ids.clone().into_tensor_arg(), weights.clone().into_tensor_arg());
    kernels::moe_route::launch(&client, count, dim, sa, ia, wa, experts, top_k, norm, 64);
    if n * top_k <= experts {
        let route = ExpertRoute::Pairs(&ids);
        let gate_up = gate_up.products(&x, route, 2 * width, (code, &norm_weight, eps));
        return Some(tensor(down.summed(&gate_up, &ids, &weights, h, &tail)));
    }
    let [xs, experts_of, slots] = group(&x, &ids, experts, (code, &norm_weight, eps));
    let route = ExpertRoute::Chunks(&experts_of);
    let gate_up = gate_up.products(&xs, route, 2 * width, (kernels::PRE_PLAIN, &xs, 0.0));
    let y = down.products(&gate_up, route, h, (kernels::PRE_SWIGLU, &gate_up, 0.0));
    let out = empty(&x, [n, h]);
    let (count, dim) = elementwise(n * h);
    kernels::moe_combine::launch(
        &client,
        count,
        dim,
        y.into_tensor_arg(),
        weights.into_tensor_arg(),
        slots.into_tensor_arg(),
        tail.shared_y.into_tensor_arg(),
        tail.gate.into_tensor_arg(),
        tail.gate_col,
        tail.residual.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        top_k,
        tail.has_shared,
        tail.has_residual,
    );
    Some(tensor(out))
}
