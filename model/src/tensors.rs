//! C3/Q1/Q4/Q6: where a model's tensors come from (a safetensors checkpoint or a GGUF file, both
//! [`TensorSource`]s) and how each weight matrix is kept in memory: the checkpoint's own
//! precision by default, or the [`WeightDtype`] asked for, dense (a Burn tensor), packed
//! quantized (the CPU) or in ggml's blocks (a GPU whose kernels read the format).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use burn::tensor::{DType, Device, Tensor, TensorData};
use half::{bf16, f16};

use crate::error::LoadError;
use crate::kernels;
use crate::layers::{Weight, linear};
use crate::quant::device::DeviceRows;
use crate::quant::{self, PackedMatrix, QuantType};

/// Which tensor names a source uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// Hugging Face's (`model.layers.0.self_attn.q_proj.weight`).
    Hf,
    /// llama.cpp's (`blk.0.attn_q.weight`).
    Gguf,
}

/// How a tensor is stored in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    F32,
    F16,
    Bf16,
    Quant(QuantType),
}

/// A file of named tensors.
pub trait TensorSource {
    fn naming(&self) -> Naming;
    fn names(&self) -> BTreeSet<&str>;
    /// Shape, outermost first (a weight's [out, in]).
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// How the tensor is stored, or the name of a type that does not load.
    fn stored(&self, name: &str) -> Option<Result<Stored, String>>;
    /// The tensor converted to `dtype` (F32, F16 or BF16; quantized tensors dequantized).
    fn data(&self, name: &str, dtype: DType) -> Result<TensorData, LoadError>;
    /// A quantized tensor's ggml blocks as stored (rows in the checkpoint's order).
    fn blocks(&self, _name: &str) -> Option<(QuantType, Cow<'_, [u8]>)> {
        None
    }
    /// The tensor has been loaded (a memory-mapped source drops its pages).
    fn done(&self, _name: &str) {}
    /// Where the source reads tensor `name`'s rows in another order than its file stores them
    /// (a GGUF file's interleaved q and k heads), the stored row each row read comes from:
    /// whatever changes the stored rows (an adapter made for the file) moves with them.
    fn row_order(&self, _name: &str) -> Option<Vec<usize>> {
        None
    }
}

/// f32 values as `TensorData` of `dtype` (F32, F16 or BF16).
pub fn convert(values: Vec<f32>, shape: Vec<usize>, dtype: DType) -> TensorData {
    match dtype {
        DType::F16 => TensorData::new(values.into_iter().map(f16::from_f32).collect::<Vec<_>>(), shape),
        DType::BF16 => TensorData::new(values.into_iter().map(bf16::from_f32).collect::<Vec<_>>(), shape),
        _ => TensorData::new(values, shape),
    }
}

/// The element type weight matrices are kept in (norms and biases are always f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDtype {
    /// The checkpoint's own: f32, f16 or bf16 as stored; a GGUF's quantized tensors stay
    /// quantized in their own formats.
    #[default]
    Auto,
    /// f32 (exact for every float checkpoint; twice the memory traffic of 16-bit).
    F32,
    /// f16: half the memory traffic of f32.
    F16,
    /// bf16: exact for bf16 checkpoints such as Qwen2.5's. Decode steps widen it to f32;
    /// prefill uses the CPU's bf16 dot products (activations rounded to bf16, as llama.cpp does).
    Bf16,
    /// A quantized format: tensors stored in it stay as they are; others are quantized at load.
    Quant(QuantType),
    /// llama.cpp's mixes of K-quants, `q3_k_m`, `q4_k_m` and `q5_k_m` (the base type given): the
    /// base for most matrices, Q6_K for the output head, more bits for the value and down
    /// projections of some layers (`Slot::mixed` chooses a matrix's type, as `llama-quantize`
    /// does).
    Mixed(QuantType),
}

impl std::str::FromStr for WeightDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "q3_k_m" => Ok(Self::Mixed(QuantType::Q3K)),
            "q4_k_m" => Ok(Self::Mixed(QuantType::Q4K)),
            "q5_k_m" => Ok(Self::Mixed(QuantType::Q5K)),
            other => other.parse().map(Self::Quant).map_err(|_| {
                let quants = QuantType::ALL.map(|q| q.name().to_ascii_lowercase()).join(", ");
                format!("unknown weight dtype `{s}` (auto, f32, f16, bf16, {quants}, q3_k_m, q4_k_m, q5_k_m)")
            }),
        }
    }
}

impl std::fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::F32 => f.write_str("f32"),
            Self::F16 => f.write_str("f16"),
            Self::Bf16 => f.write_str("bf16"),
            Self::Quant(q) => f.write_str(&q.name().to_ascii_lowercase()),
            Self::Mixed(q) => write!(f, "{}_m", q.name().to_ascii_lowercase()),
        }
    }
}

/// How one matrix is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    Dense(DType),
    Packed(QuantType),
    /// ggml's blocks on a GPU (`quant::device`).
    Blocks(QuantType),
}

/// Whether packed quantized matrices can serve `device` (the kernels run on the CPU backend).
fn packed_runs_on(device: &Device) -> bool {
    *device == Device::flex()
}

/// The dense type a GPU's many-row products dequantize blocks to.
fn blocks_dense(device: &Device) -> DType {
    float_on(device, &[DType::F16])
}

/// The first of `preferred` that `device` computes in, else f32 (a GPU without 16-bit floats
/// in its shaders, such as Mesa's llvmpipe through OpenGL ES, keeps a 16-bit checkpoint in f32).
fn float_on(device: &Device, preferred: &[DType]) -> DType {
    preferred.iter().copied().find(|&d| device.supports_dtype(d)).unwrap_or(DType::F32)
}

/// `dtype` if `device` computes in it (an explicit `--dtype` is not silently widened).
fn supported(name: &str, dtype: DType, device: &Device) -> Result<DType, LoadError> {
    match device.supports_dtype(dtype) {
        true => Ok(dtype),
        false => Err(LoadError::Tensor {
            name: name.into(),
            reason: format!("this device does not compute in {dtype:?} (use --dtype f32, or auto)"),
        }),
    }
}

impl WeightDtype {
    /// How a matrix `name` stored as `stored`, with rows of `k` values, is kept on `device`.
    pub fn storage(self, name: &str, stored: Stored, k: usize, device: &Device) -> Result<Storage, LoadError> {
        let bad = |reason: String| Err(LoadError::Tensor { name: name.into(), reason });
        let storage = match (self, stored) {
            (Self::Auto, Stored::F32) | (Self::F32, _) => Storage::Dense(DType::F32),
            (Self::F16, _) => Storage::Dense(supported(name, DType::F16, device)?),
            (Self::Bf16, _) => Storage::Dense(supported(name, DType::BF16, device)?),
            (Self::Auto, Stored::F16) => Storage::Dense(float_on(device, &[DType::F16])),
            (Self::Auto, Stored::Bf16) => Storage::Dense(float_on(device, &[DType::BF16, DType::F16])),
            (Self::Auto, Stored::Quant(q)) if packed_runs_on(device) => Storage::Packed(q),
            (Self::Auto, Stored::Quant(q)) if kernels::blocks_run_on(device) => Storage::Blocks(q),
            // A GPU without its kernels (`LLAISYS_GPU_KERNELS=off`): dequantized to 16 bits
            // where it can.
            (Self::Auto, Stored::Quant(_)) => Storage::Dense(float_on(device, &[DType::F16])),
            // A mix's matrix takes the type `Slot::mixed` gives it; its base where none did.
            (Self::Quant(q) | Self::Mixed(q), _) => {
                // A K-quant's rows are 256-value blocks; a tensor whose rows are not takes the
                // 32-value format llama.cpp falls back to for it.
                let q = match q.k_fallback() {
                    Some(fallback) if !q.fits_row(k) => fallback,
                    _ => q,
                };
                if !q.fits_row(k) {
                    return bad(format!(
                        "{q} stores rows in blocks of {} values; this tensor's rows have {k}",
                        q.block_values()
                    ));
                }
                if packed_runs_on(device) {
                    Storage::Packed(q)
                } else if kernels::blocks_run_on(device) {
                    Storage::Blocks(q)
                } else {
                    return bad(format!("{q} weights run on the CPU, or on a GPU with its kernels on"));
                }
            }
        };
        Ok(storage)
    }
}

/// Loads matrix `name` ([out, in]) of `src` as `storage`; quantized at load, its columns' errors
/// weighted by `importance` (one value per column) where given.
pub fn load_matrix(
    src: &dyn TensorSource,
    name: &str,
    storage: Storage,
    importance: Option<&[f32]>,
    device: &Device,
) -> Result<Weight, LoadError> {
    let shape = src.shape(name).ok_or_else(|| LoadError::MissingTensors(vec![name.into()]))?;
    let [rows, k] = shape[..] else {
        return Err(LoadError::Tensor {
            name: name.into(),
            reason: format!("expected a matrix, found shape {shape:?}"),
        });
    };
    check_importance(name, importance, k)?;
    let packing = |e: crate::quant::PackError| LoadError::Tensor { name: name.into(), reason: e.to_string() };
    let weight = match storage {
        // A matrix larger than the device's largest buffer goes in parts.
        Storage::Dense(dtype) => linear::dense_fitting(src.data(name, dtype)?, dtype, device),
        Storage::Packed(q) => match src.blocks(name) {
            Some((stored, bytes)) if stored == q => {
                linear::packed(Arc::new(PackedMatrix::from_ggml(q, rows, k, &bytes).map_err(packing)?))
            }
            _ => {
                let values = f32_values(src, name)?;
                let packed = PackedMatrix::quantize_weighted(q, rows, k, &values, importance).map_err(packing)?;
                linear::packed(Arc::new(packed))
            }
        },
        Storage::Blocks(q) => {
            let bytes = match src.blocks(name) {
                Some((stored, bytes)) if stored == q => bytes,
                _ => {
                    let mut bytes = Vec::new();
                    quantized(name, &f32_values(src, name)?, q, importance, &mut bytes)?;
                    Cow::Owned(bytes)
                }
            };
            linear::blocks(upload_blocks(name, q, rows, k, &bytes, device)?, blocks_dense(device))
        }
    };
    src.done(name);
    Ok(weight)
}

/// Tensor `name`'s values as f32 (quantized ones dequantized).
pub(crate) fn f32_values(src: &dyn TensorSource, name: &str) -> Result<Vec<f32>, LoadError> {
    src.data(name, DType::F32)?
        .try_into_vec::<f32>()
        .map_err(|e| LoadError::Tensor { name: name.into(), reason: format!("reading values: {e:?}") })
}

/// The error for an importance vector that is not one value per column of rows of `k` (an
/// importance matrix made for another model).
fn check_importance(name: &str, importance: Option<&[f32]>, k: usize) -> Result<(), LoadError> {
    match importance {
        Some(imp) if imp.len() != k => Err(LoadError::Tensor {
            name: name.into(),
            reason: format!(
                "the importance matrix holds {} values for it, its rows {k} (was it made for another model?)",
                imp.len()
            ),
        }),
        _ => Ok(()),
    }
}

/// `values` of tensor `name` quantized to `q` on the host (ggml's blocks) and appended to
/// `bytes`, their columns weighted by `importance` where given.
fn quantized(
    name: &str,
    values: &[f32],
    q: QuantType,
    importance: Option<&[f32]>,
    bytes: &mut Vec<u8>,
) -> Result<(), LoadError> {
    quant::quantize_weighted(q, values, importance, bytes)
        .ok_or_else(|| LoadError::Tensor { name: name.into(), reason: format!("its values are not whole {q} blocks") })
}

/// ggml blocks of a `rows` × `k` matrix on `device`.
fn upload_blocks(
    name: &str,
    q: QuantType,
    rows: usize,
    k: usize,
    bytes: &[u8],
    device: &Device,
) -> Result<Vec<DeviceRows>, LoadError> {
    // A matrix larger than the device's largest buffer goes in parts.
    linear::upload_fitting(q, rows, k, bytes, blocks_dense(device), device).ok_or_else(|| LoadError::Tensor {
        name: name.into(),
        reason: format!("{} bytes are not {rows} rows of {k} values in {q}", bytes.len()),
    })
}

/// Loads the experts of 3-D tensor `name` ([experts, out, in], a GGUF file's `ffn_*_exps`), each
/// a matrix kept as `storage` (quantized experts stay in their format, sliced from the blocks);
/// quantized at load, each expert's columns weighted by its run of `importance` where given
/// (`experts · in` values, expert after expert).
pub fn load_experts(
    src: &dyn TensorSource,
    name: &str,
    storage: Storage,
    importance: Option<&[f32]>,
    device: &Device,
) -> Result<Vec<Weight>, LoadError> {
    let shape = src.shape(name).ok_or_else(|| LoadError::MissingTensors(vec![name.into()]))?;
    let [experts, rows, k] = shape[..] else {
        return Err(LoadError::Tensor {
            name: name.into(),
            reason: format!("expected [experts, out, in], found {shape:?}"),
        });
    };
    check_importance(name, importance, experts * k)?;
    let expert_importance = |e: usize| importance.map(|imp| &imp[e * k..(e + 1) * k]);
    let packing = |e: crate::quant::PackError| LoadError::Tensor { name: name.into(), reason: e.to_string() };
    // Each expert's bytes, read in place.
    let split = |bytes: &[u8]| -> Vec<std::ops::Range<usize>> {
        let per = (bytes.len() / experts.max(1)).max(1);
        (0..experts).map(|e| (e * per).min(bytes.len())..((e + 1) * per).min(bytes.len())).collect()
    };
    let weights = match storage {
        Storage::Dense(dtype) => {
            let data = src.data(name, dtype)?;
            let bytes = data.as_bytes();
            split(bytes)
                .into_iter()
                .map(|at| {
                    linear::dense_fitting(
                        TensorData::from_bytes_vec(bytes[at].to_vec(), [rows, k], dtype),
                        dtype,
                        device,
                    )
                })
                .collect()
        }
        Storage::Packed(q) => match src.blocks(name) {
            Some((stored, bytes)) if stored == q => split(&bytes)
                .into_iter()
                .map(|at| {
                    Ok(linear::packed(Arc::new(PackedMatrix::from_ggml(q, rows, k, &bytes[at]).map_err(packing)?)))
                })
                .collect::<Result<Vec<_>, LoadError>>()?,
            _ => {
                let values = f32_values(src, name)?;
                values
                    .chunks_exact(rows * k)
                    .enumerate()
                    .map(|(e, v)| {
                        let packed = PackedMatrix::quantize_weighted(q, rows, k, v, expert_importance(e));
                        Ok(linear::packed(Arc::new(packed.map_err(packing)?)))
                    })
                    .collect::<Result<Vec<_>, LoadError>>()?
            }
        },
        Storage::Blocks(q) => {
            let bytes = match src.blocks(name) {
                Some((stored, bytes)) if stored == q => bytes.into_owned(),
                _ => {
                    // Each expert's blocks weighted by its own importances.
                    let mut bytes = Vec::new();
                    for (e, v) in f32_values(src, name)?.chunks_exact(rows * k).enumerate() {
                        quantized(name, v, q, expert_importance(e), &mut bytes)?;
                    }
                    bytes
                }
            };
            split(&bytes)
                .into_iter()
                .map(|at| {
                    Ok(linear::blocks(upload_blocks(name, q, rows, k, &bytes[at], device)?, blocks_dense(device)))
                })
                .collect::<Result<Vec<_>, LoadError>>()?
        }
    };
    src.done(name);
    Ok(weights)
}

/// Loads tensor `name` as f32 (norm weights, biases).
pub fn load_f32<const D: usize>(src: &dyn TensorSource, name: &str, device: &Device) -> Result<Tensor<D>, LoadError> {
    let tensor = Tensor::from_data(src.data(name, DType::F32)?, (device, DType::F32));
    src.done(name);
    Ok(tensor)
}
