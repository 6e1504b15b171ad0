//! Q1/Q2: GGUF files, memory-mapped: the container (`file.rs`), the model configuration from its
//! metadata (`config.rs`), and its tokenizer and chat template (`tokenizer.rs`). A GGUF file is
//! a [`TensorSource`] like a safetensors checkpoint: its tensors load as stored (quantized ones
//! stay quantized) or converted to the dtype asked for.

mod config;
mod file;
mod tokenizer;

use std::borrow::Cow;
use std::collections::BTreeSet;

use burn::tensor::{DType, TensorData};
use half::{bf16, f16};
use rayon::prelude::*;

use config::model_blocks;
pub use config::{architecture, family, model_config, model_type};
pub use file::{GgufFile, TensorInfo, TensorType, Value, split_name, split_part};
pub use tokenizer::{chat_template, tokenizer};

use crate::error::LoadError;
use crate::quant::{self, Foreign, QuantType};
use crate::tensors::{Naming, Stored, TensorSource, convert};

impl TensorSource for GgufFile {
    fn naming(&self) -> Naming {
        Naming::Gguf
    }

    fn names(&self) -> BTreeSet<&str> {
        self.served().iter().flatten().map(String::as_str).collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.served_tensor(name).map(TensorInfo::shape)
    }

    fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
        Some(match self.served_tensor(name)?.ty {
            TensorType::F32 => Ok(Stored::F32),
            TensorType::F16 => Ok(Stored::F16),
            TensorType::BF16 => Ok(Stored::Bf16),
            TensorType::Quant(q) => Ok(Stored::Quant(q)),
            // Converted at load: stored, as far as loading goes, in the format it becomes.
            TensorType::Foreign(f) => Ok(Stored::Quant(f.target())),
            other => Err(other.name()),
        })
    }

    fn data(&self, name: &str, dtype: DType) -> Result<TensorData, LoadError> {
        let t = self.served_tensor(name).ok_or_else(|| self.error(format!("no tensor `{name}`")))?;
        let bytes = self.rows_in_hf_order(t)?;
        let bytes = &bytes[..];
        let shape = t.shape();
        let data = match (t.ty, dtype) {
            (TensorType::F16, DType::F16) => TensorData::new(le::<f16, 2>(bytes, f16::from_le_bytes), shape),
            (TensorType::BF16, DType::BF16) => TensorData::new(le::<bf16, 2>(bytes, bf16::from_le_bytes), shape),
            (TensorType::F32, _) => convert(le::<f32, 4>(bytes, f32::from_le_bytes), shape, dtype),
            (TensorType::F16, _) => convert(widened(bytes, |b| f16::from_le_bytes(b).to_f32()), shape, dtype),
            (TensorType::BF16, _) => convert(widened(bytes, |b| bf16::from_le_bytes(b).to_f32()), shape, dtype),
            (TensorType::Quant(q), _) => {
                let mut values = vec![0.0f32; t.n_values()];
                quant::dequantize(q, bytes, &mut values);
                convert(values, shape, dtype)
            }
            (TensorType::Foreign(f), _) => {
                let mut values = vec![0.0f32; t.n_values()];
                f.dequantize(bytes, &mut values).ok_or_else(|| self.unsupported(t))?;
                convert(values, shape, dtype)
            }
            (TensorType::Other(_), _) => return Err(self.unsupported(t)),
        };
        Ok(data)
    }

    fn blocks(&self, name: &str) -> Option<(QuantType, Cow<'_, [u8]>)> {
        let t = self.served_tensor(name)?;
        match t.ty {
            TensorType::Quant(q) => Some((q, self.rows_in_hf_order(t).ok()?)),
            TensorType::Foreign(f) => Some((f.target(), Cow::Owned(f.convert(&self.rows_in_hf_order(t).ok()?)?))),
            _ => None,
        }
    }

    fn done(&self, name: &str) {
        if let Some(t) = self.served_tensor(name) {
            self.release(t);
        }
    }

    fn row_order(&self, name: &str) -> Option<Vec<usize>> {
        let t = self.served_tensor(name)?;
        hf_row_order(t.shape().first().copied()?, self.interleaved_heads(&t.name)?)
    }
}

/// The file's row each checkpoint row of a q or k tensor of `rows` rows in `heads` heads is:
/// checkpoint row (head h, half j, index i) is the file's row (h, i, j). `None` where the rows do
/// not split into the heads' halves.
fn hf_row_order(rows: usize, heads: usize) -> Option<Vec<usize>> {
    if heads == 0 || rows == 0 || !rows.is_multiple_of(2 * heads) {
        return None;
    }
    let head_dim = rows / heads;
    let half = head_dim / 2;
    Some(
        (0..rows)
            .map(|r| {
                let (h, j, i) = (r / head_dim, (r % head_dim) / half, r % half);
                h * head_dim + 2 * i + j
            })
            .collect(),
    )
}

impl GgufFile {
    /// Per tensor, the name the decoder knows it by (`TensorSource`'s names): its own, or the
    /// decoder's for a family's alias (`Architecture::gguf_aliases`); `None` for the blocks of a
    /// multi-token-prediction head after the model's (`{arch}.nextn_predict_layers`), which are
    /// not read.
    fn served(&self) -> &[Option<String>] {
        self.served.get_or_init(|| {
            let family = family(self);
            let aliases = family.map_or(&[][..], |f| f.gguf_aliases);
            // A file whose count is wrong fails its configuration's reading.
            let blocks = model_blocks(self).ok().flatten();
            let serve = |name: &str| {
                let Some((block, tail)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else {
                    return Some(name.to_string());
                };
                if blocks.zip(block.parse::<u64>().ok()).is_some_and(|(blocks, b)| b >= blocks) {
                    return None;
                }
                match aliases.iter().find(|(_, theirs)| *theirs == tail) {
                    Some((ours, _)) => Some(format!("blk.{block}.{ours}")),
                    None => Some(name.to_string()),
                }
            };
            self.tensors().iter().map(|t| serve(&t.name)).collect()
        })
    }

    /// The tensor the decoder knows as `name`.
    fn served_tensor(&self, name: &str) -> Option<&TensorInfo> {
        let i = self.served().iter().position(|n| n.as_deref() == Some(name))?;
        self.tensors().get(i)
    }

    /// The tensors this file holds in formats converted at load, by format: `IQ4_XS → IQ4_NL
    /// (scales rounded to f16): 168 tensors`, one entry per format; empty when there are none.
    pub fn conversions(&self) -> Vec<String> {
        Foreign::ALL
            .into_iter()
            .filter_map(|f| {
                let n = self.tensors().iter().filter(|t| t.ty == TensorType::Foreign(f)).count();
                (n > 0).then(|| format!("{f} → {} ({}): {n} tensors", f.target(), f.how()))
            })
            .collect()
    }

    /// A tensor's bytes with its rows in the checkpoint's (Hugging Face's) order: llama.cpp's
    /// converter interleaves the two halves of each q and k head for the families whose RoPE
    /// rotates adjacent pairs (`Architecture::gguf_qk_interleaved`), and this undoes it, so the
    /// decoder's one RoPE serves every file. Each row's bytes move whole (a quantized row is
    /// whole blocks).
    fn rows_in_hf_order(&self, t: &TensorInfo) -> Result<Cow<'_, [u8]>, LoadError> {
        let bytes = self.bytes(t)?;
        let Some(heads) = self.interleaved_heads(&t.name) else { return Ok(Cow::Borrowed(bytes)) };
        let rows = t.shape().first().copied().unwrap_or(0);
        let order = hf_row_order(rows, heads).filter(|_| bytes.len().is_multiple_of(rows));
        let Some(order) = order else {
            return Err(self.error(format!("{}: {rows} rows do not split into {heads} heads", t.name)));
        };
        let row_bytes = bytes.len() / rows;
        let mut out = Vec::with_capacity(bytes.len());
        for from in order {
            out.extend_from_slice(&bytes[from * row_bytes..(from + 1) * row_bytes]);
        }
        Ok(Cow::Owned(out))
    }

    /// The heads of tensor `name` if its rows are interleaved (q and k weights and biases of a
    /// family that does so).
    fn interleaved_heads(&self, name: &str) -> Option<usize> {
        let arch = architecture(self).ok()?;
        if !family(self)?.gguf_qk_interleaved {
            return None;
        }
        let (_, tail) = name.strip_prefix("blk.")?.split_once('.')?;
        let key = match tail {
            "attn_q.weight" | "attn_q.bias" => "head_count",
            "attn_k.weight" | "attn_k.bias" => "head_count_kv",
            _ => return None,
        };
        let heads = self.get(&format!("{arch}.attention.{key}")).and_then(Value::as_u64);
        let heads = match (heads, key) {
            (None, "head_count_kv") => self.get(&format!("{arch}.attention.head_count")).and_then(Value::as_u64),
            (heads, _) => heads,
        };
        Some(heads.unwrap_or(0) as usize)
    }
}

/// Little-endian values of `N` bytes each.
fn le<T, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    bytes.chunks_exact(N).map(|b| from(b.try_into().expect("N bytes"))).collect()
}

/// Little-endian 16-bit floats as f32, in tasks of 64 Ki values on the rayon pool (a load
/// quantizing a 16-bit checkpoint converts every matrix).
fn widened(bytes: &[u8], widen: fn([u8; 2]) -> f32) -> Vec<f32> {
    const TASK: usize = 1 << 16;
    let mut values = vec![0.0f32; bytes.len() / 2];
    values.par_chunks_mut(TASK).zip(bytes.par_chunks(2 * TASK)).for_each(|(values, bytes)| {
        for (v, b) in values.iter_mut().zip(bytes.chunks_exact(2)) {
            *v = widen([b[0], b[1]]);
        }
    });
    values
}
