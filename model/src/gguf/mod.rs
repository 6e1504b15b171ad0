//! Q1/Q2: GGUF files, memory-mapped: the container (`file.rs`), the model configuration from its
//! metadata (`config.rs`), and its tokenizer and chat template (`tokenizer.rs`). A GGUF file is
//! a [`TensorSource`] like a safetensors checkpoint: its tensors load as stored (quantized ones
//! stay quantized) or converted to the dtype asked for.

mod config;
mod file;
mod tokenizer;

use std::collections::BTreeSet;

use burn::tensor::{DType, TensorData};
use half::{bf16, f16};

pub use config::{architecture, model_config};
pub use file::{GgufFile, TensorInfo, TensorType, Value};
pub use tokenizer::{chat_template, tokenizer};

use crate::error::LoadError;
use crate::quant::{self, QuantType};
use crate::tensors::{Naming, Stored, TensorSource, convert};

impl TensorSource for GgufFile {
    fn naming(&self) -> Naming {
        Naming::Gguf
    }

    fn names(&self) -> BTreeSet<&str> {
        self.tensors().iter().map(|t| t.name.as_str()).collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensor(name).map(TensorInfo::shape)
    }

    fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
        Some(match self.tensor(name)?.ty {
            TensorType::F32 => Ok(Stored::F32),
            TensorType::F16 => Ok(Stored::F16),
            TensorType::BF16 => Ok(Stored::Bf16),
            TensorType::Quant(q) => Ok(Stored::Quant(q)),
            other => Err(other.name()),
        })
    }

    fn data(&self, name: &str, dtype: DType) -> Result<TensorData, LoadError> {
        let t = self.tensor(name).ok_or_else(|| self.error(format!("no tensor `{name}`")))?;
        let bytes = self.bytes(t)?;
        let shape = t.shape();
        let data = match (t.ty, dtype) {
            (TensorType::F16, DType::F16) => TensorData::new(le::<f16, 2>(bytes, f16::from_le_bytes), shape),
            (TensorType::BF16, DType::BF16) => TensorData::new(le::<bf16, 2>(bytes, bf16::from_le_bytes), shape),
            (TensorType::F32, _) => convert(le::<f32, 4>(bytes, f32::from_le_bytes), shape, dtype),
            (TensorType::F16, _) => {
                convert(le::<f16, 2>(bytes, f16::from_le_bytes).into_iter().map(f16::to_f32).collect(), shape, dtype)
            }
            (TensorType::BF16, _) => {
                convert(le::<bf16, 2>(bytes, bf16::from_le_bytes).into_iter().map(bf16::to_f32).collect(), shape, dtype)
            }
            (TensorType::Quant(q), _) => {
                let mut values = vec![0.0f32; t.n_values()];
                quant::dequantize(q, bytes, &mut values);
                convert(values, shape, dtype)
            }
            (TensorType::Other(_), _) => return Err(self.unsupported(t)),
        };
        Ok(data)
    }

    fn blocks(&self, name: &str) -> Option<(QuantType, &[u8])> {
        let t = self.tensor(name)?;
        match t.ty {
            TensorType::Quant(q) => Some((q, self.bytes(t).ok()?)),
            _ => None,
        }
    }

    fn done(&self, name: &str) {
        if let Some(t) = self.tensor(name) {
            self.release(t);
        }
    }
}

/// Little-endian values of `N` bytes each.
fn le<T, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    bytes.chunks_exact(N).map(|b| from(b.try_into().expect("N bytes"))).collect()
}
