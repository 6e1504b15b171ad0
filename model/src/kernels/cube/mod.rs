//! GPU kernels for the CubeCL backends (issue 31): one launch where Burn's ops take five or
//! six (RMSNorm, SwiGLU, the rotary embedding of q's and k's heads, attention's scaled and
//! masked softmax). Like the CPU kernels beside them, each entry point takes Burn tensors, runs
//! only where they live on a CubeCL device (wgpu or CUDA) in f32 and in rows (not a matmul's
//! storage tiles), and otherwise returns `None` so the caller keeps the Burn ops. Built with
//! Burn's `fusion`, the tensors are fusion handles and these kernels stand aside (Burn fuses
//! the element-wise chains itself).

mod kernels;

use burn::backend::{BackendTypes, Cube};
use burn::cubecl::prelude::{CubeCount, CubeDim};
use burn::tensor::{DType, Shape, Tensor};

use kernels::ROW_UNITS;

type CubeTensor = <Cube as BackendTypes>::FloatTensorPrimitive;

/// The CubeCL tensor of `x` where it is one in f32 rows.
fn cube<const D: usize>(x: &Tensor<D>) -> Option<CubeTensor> {
    if x.dtype() != DType::F32 {
        return None;
    }
    let t = x.clone().try_into_primitive::<Cube>().ok()?;
    (!t.meta.is_tiled()).then_some(t)
}

/// A new contiguous f32 tensor of `shape` on `like`'s device (its values unset).
fn empty(like: &CubeTensor, shape: impl Into<Shape>) -> CubeTensor {
    let shape = shape.into();
    let handle = like.client.empty(shape.num_elements() * size_of::<f32>());
    CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), shape, handle, DType::F32)
}

fn tensor<const D: usize>(t: CubeTensor) -> Tensor<D> {
    Tensor::from_primitive::<Cube>(t)
}

/// Cubes for one unit per value of `count`, in a grid a device accepts (at most 65,535 cubes
/// along a dimension).
fn elementwise(count: usize) -> (CubeCount, CubeDim) {
    const UNITS: usize = 256;
    let cubes = count.div_ceil(UNITS).max(1) as u32;
    let (x, y) = (cubes.min(65_535), cubes.div_ceil(65_535));
    (CubeCount::Static(x, y, 1), CubeDim::new_1d(UNITS as u32))
}

/// One cube per row.
fn per_row(rows: usize) -> (CubeCount, CubeDim) {
    (CubeCount::Static(rows as u32, 1, 1), CubeDim::new_1d(ROW_UNITS as u32))
}

/// RMSNorm, `x / sqrt(mean(x²) + eps) · w` per row.
///
/// # Shapes
/// x: [n, h] f32, w: \[h\] f32 → [n, h] f32
pub fn rms_norm(x: &Tensor<2>, w: &Tensor<1>, eps: f64) -> Option<Tensor<2>> {
    let [n, h] = x.dims();
    if w.dims() != [h] || n == 0 || n > 65_535 {
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

/// `silu(gate) · up`.
///
/// # Shapes
/// gate_up: [n, 2 · i] f32, gate in the first half of each row → [n, i] f32
pub fn swiglu(gate_up: &Tensor<2>) -> Option<Tensor<2>> {
    let [n, width] = gate_up.dims();
    if width == 0 || !width.is_multiple_of(2) {
        return None;
    }
    let x = cube(gate_up)?;
    let out = empty(&x, [n, width / 2]);
    let (count, dim) = elementwise(n * width / 2);
    kernels::swiglu::launch(&x.client.clone(), count, dim, x.into_tensor_arg(), out.clone().into_tensor_arg());
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
    if b * r == 0 || b * r > 65_535 || e == 0 {
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
