//! A GGUF file that keeps each expert's matrix as a tensor of its own (`blk.{l}.ffn_gate.{e}.weight`,
//! `ffn_up.{e}`, `ffn_down.{e}`, each [out, in]), read with each layer's experts stacked per
//! matrix (`blk.{l}.ffn_gate_exps.weight`, [experts, out, in]) as the decoder reads every other
//! GGUF file's. llama.cpp's converter wrote Mixtral so until it stacked the experts (spring
//! 2024), and many Mixtral 8x7B files still in use are of that kind; llama.cpp read them for a
//! while, each expert a view of the stacked tensor, and now refuses them (`tensor
//! 'blk.0.ffn_down_exps.weight' not found`).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use burn::tensor::{DType, TensorData};

use super::weights::{Slot, name_of};
use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::quant::QuantType;
use crate::tensors::{Naming, Stored, TensorSource};

/// The expert matrices and their per-expert stems (`blk.{l}.{stem}.{e}.weight`).
const MATRICES: [(Slot, &str); 3] =
    [(Slot::ExpertGate, "ffn_gate"), (Slot::ExpertUp, "ffn_up"), (Slot::ExpertDown, "ffn_down")];

/// Expert e's matrix `slot` of layer l as a file with one tensor per expert names it
/// (`blk.{l}.ffn_gate.{e}.weight`); `None` for a slot that is not an expert's matrix.
pub fn expert_tensor(slot: Slot, l: usize, e: usize) -> Option<String> {
    let (_, stem) = MATRICES.iter().find(|(s, _)| *s == slot)?;
    Some(format!("blk.{l}.{stem}.{e}.weight"))
}

/// The file with its per-expert tensors stacked (see the module's note).
pub struct SplitExperts {
    inner: Box<dyn TensorSource>,
    /// Each stacked tensor's name, and its experts' stored names in expert order.
    stacks: BTreeMap<String, Vec<String>>,
}

impl SplitExperts {
    /// `inner` with the per-expert tensors of config `c`'s experts stacked, where it holds them
    /// so; as it is otherwise. An expert's tensor missing, or experts of different shapes or
    /// types, is an error naming the tensor.
    pub fn wrap(inner: Box<dyn TensorSource>, c: &ModelConfig) -> Result<Box<dyn TensorSource>, LoadError> {
        let Some(experts) = c.moe.as_ref().map(|m| m.experts).filter(|_| inner.naming() == Naming::Gguf) else {
            return Ok(inner);
        };
        let names = inner.names();
        let mut stacks = BTreeMap::new();
        for l in 0..c.num_hidden_layers {
            for (slot, _) in MATRICES {
                let stacked = name_of(slot, Some(l), Naming::Gguf);
                let parts: Vec<String> = (0..experts).filter_map(|e| expert_tensor(slot, l, e)).collect();
                if names.contains(stacked.as_str()) || !parts.iter().any(|p| names.contains(p.as_str())) {
                    continue;
                }
                let missing: Vec<String> = parts.iter().filter(|p| !names.contains(p.as_str())).cloned().collect();
                if !missing.is_empty() {
                    return Err(LoadError::MissingTensors(missing));
                }
                let first = (inner.shape(&parts[0]), inner.stored(&parts[0]));
                if let Some(odd) = parts.iter().find(|p| (inner.shape(p), inner.stored(p)) != first) {
                    let reason = format!(
                        "its shape and type ({:?}, {:?}) differ from {}'s ({:?}, {:?}): a layer's experts are one matrix each",
                        inner.shape(odd),
                        inner.stored(odd),
                        parts[0],
                        first.0,
                        first.1
                    );
                    return Err(LoadError::Tensor { name: odd.clone(), reason });
                }
                stacks.insert(stacked, parts);
            }
        }
        match stacks.is_empty() {
            true => Ok(inner),
            false => Ok(Box::new(Self { inner, stacks })),
        }
    }
}

impl TensorSource for SplitExperts {
    fn naming(&self) -> Naming {
        self.inner.naming()
    }

    fn names(&self) -> BTreeSet<&str> {
        let mut names = self.inner.names();
        for (stacked, parts) in &self.stacks {
            for p in parts {
                names.remove(p.as_str());
            }
            names.insert(stacked.as_str());
        }
        names
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.stacks.get(name) {
            Some(parts) => Some([vec![parts.len()], self.inner.shape(&parts[0])?].concat()),
            None => self.inner.shape(name),
        }
    }

    fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
        self.inner.stored(self.stacks.get(name).map_or(name, |parts| &parts[0]))
    }

    fn data(&self, name: &str, dtype: DType) -> Result<TensorData, LoadError> {
        let Some(parts) = self.stacks.get(name) else { return self.inner.data(name, dtype) };
        let mut bytes = Vec::new();
        let mut stored = dtype;
        for p in parts {
            let data = self.inner.data(p, dtype)?;
            stored = data.dtype();
            bytes.extend_from_slice(data.as_bytes());
        }
        let shape = self.shape(name).ok_or_else(|| LoadError::MissingTensors(vec![name.into()]))?;
        Ok(TensorData::from_bytes_vec(bytes, shape, stored))
    }

    /// The experts' blocks one after another (all in one format: `wrap` checked their types).
    fn blocks(&self, name: &str) -> Option<(QuantType, Cow<'_, [u8]>)> {
        let Some(parts) = self.stacks.get(name) else { return self.inner.blocks(name) };
        let mut stacked = Vec::new();
        let mut format = None;
        for p in parts {
            let (q, bytes) = self.inner.blocks(p)?;
            if format.replace(q).is_some_and(|f| f != q) {
                return None;
            }
            stacked.extend_from_slice(&bytes);
        }
        Some((format?, Cow::Owned(stacked)))
    }

    fn done(&self, name: &str) {
        match self.stacks.get(name) {
            Some(parts) => parts.iter().for_each(|p| self.inner.done(p)),
            None => self.inner.done(name),
        }
    }

    fn row_order(&self, name: &str) -> Option<Vec<usize>> {
        self.stacks.get(name).map_or_else(|| self.inner.row_order(name), |_| None)
    }
}

#[cfg(test)]
mod tests;
