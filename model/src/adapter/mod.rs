//! LoRA adapters, merged into the weights as they load: a fine-tune kept as low-rank changes
//! to some of a base model's matrices (each `W + s · B · A`, B of [out, r], A of [r, in]), in
//! PEFT's directory format (`adapter_config.json`, `adapter_model.safetensors`: what Hugging
//! Face's `peft`, Unsloth and Axolotl save) for a checkpoint, or llama.cpp's GGUF adapter
//! (`convert_lora_to_gguf.py`'s) for a GGUF model. An [`Adapted`] source stands between the
//! model's file and the weights table: a changed tensor reads as its base values plus each
//! adapter's change, in f32, then is kept as the base tensor would be (a quantized matrix is
//! quantized again to its type, as `llama-export-lora` does); every other tensor reads as
//! stored. The model is the adapted model: no per-request adapters, no cost per token.

mod gguf;
mod peft;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, TensorData};
use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::quant::QuantType;
use crate::tensors::{Naming, Stored, TensorSource, convert, f32_values};

/// An adapter to merge: its path (a PEFT directory, or a GGUF adapter file) and how much of it
/// (`1.0`: as trained; llama.cpp's `--lora-scaled`).
#[derive(Debug, Clone, PartialEq)]
pub struct Lora {
    pub path: PathBuf,
    pub scale: f32,
}

impl Lora {
    /// The adapter at `path`, as trained.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), scale: 1.0 }
    }
}

/// One change to a tensor.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    /// Adds `up · down`: `up` [rows, rank] with the adapter's scale in it, `down` [rank, cols].
    LowRank { rank: usize, up: Vec<f32>, down: Vec<f32> },
    /// The tensor whole, in place of the base's (PEFT's `modules_to_save` and the embeddings it
    /// saves beside their low-rank changes; the norms some GGUF adapters carry): of several
    /// adapters', the last; the low-rank changes of all add to it.
    Whole { shape: Vec<usize>, values: Vec<f32> },
}

/// An adapter read: its changes, by the name of the tensor each changes.
#[derive(Debug)]
struct Adapter {
    path: PathBuf,
    /// Which names its tensors have, so which model files it applies to.
    naming: Naming,
    changes: HashMap<String, Vec<Change>>,
}

impl Adapter {
    /// Reads `lora` for a model of configuration `c`: a `.gguf` file is llama.cpp's format;
    /// anything else a PEFT directory (or a file in one).
    fn open(lora: &Lora, c: &ModelConfig) -> Result<Self, LoadError> {
        if !lora.scale.is_finite() {
            return Err(adapter_error(&lora.path, format!("scale {} is not a number", lora.scale)));
        }
        let is_gguf = lora.path.is_file() && lora.path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        match is_gguf {
            true => gguf::read(&lora.path, lora.scale, c),
            false => peft::read(&lora.path, lora.scale, c),
        }
    }
}

fn adapter_error(path: &Path, reason: impl Into<String>) -> LoadError {
    LoadError::Adapter { path: path.into(), reason: reason.into() }
}

/// A low-rank change of `up` ([rows, rank], times `scale`) and `down` ([rank, cols]).
fn low_rank(rank: usize, mut up: Vec<f32>, down: Vec<f32>, scale: f32) -> Change {
    up.iter_mut().for_each(|u| *u *= scale);
    Change::LowRank { rank, up, down }
}

/// `values` ([rows, cols], row-major) transposed.
fn transposed(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols).flat_map(|c| (0..rows).map(move |r| values[r * cols + c])).collect()
}

/// `src` with `adapters` merged into its tensors, in order, each read and checked against the
/// model first (a tensor the model lacks, or of another shape, is an error naming it: an adapter
/// made for another model); `src` itself where there are none.
pub fn adapted(
    src: Box<dyn TensorSource>,
    adapters: &[Lora],
    c: &ModelConfig,
) -> Result<Box<dyn TensorSource>, LoadError> {
    if adapters.is_empty() {
        return Ok(src);
    }
    let mut changes: HashMap<String, Vec<Change>> = HashMap::new();
    for lora in adapters {
        Adapter::open(lora, c)?.fit(src.as_ref(), c, &mut changes)?;
        tracing::info!(path = %lora.path.display(), scale = lora.scale, "LoRA adapter merged into the weights");
    }
    Ok(Box::new(Adapted { inner: src, changes }))
}

impl Adapter {
    /// Checks this adapter's changes against the model `src` of configuration `c` and appends
    /// them to `changes`, each low-rank change's rows in the order `src` reads its tensor's.
    fn fit(
        self,
        src: &dyn TensorSource,
        c: &ModelConfig,
        changes: &mut HashMap<String, Vec<Change>>,
    ) -> Result<(), LoadError> {
        let bad = |reason: String| Err(adapter_error(&self.path, reason));
        if self.naming != src.naming() {
            return bad(match self.naming {
                Naming::Hf => "a PEFT adapter applies to a Hugging Face checkpoint; for a GGUF model, convert it \
                     with llama.cpp's convert_lora_to_gguf.py"
                    .into(),
                Naming::Gguf => "a GGUF adapter applies to a GGUF model; for a checkpoint, use the adapter's PEFT \
                     directory"
                    .into(),
            });
        }
        let names = src.names();
        let mut unknown: Vec<&str> = self.changes.keys().map(String::as_str).filter(|n| !names.contains(n)).collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            let head = |n: &&str| matches!(*n, "lm_head.weight" | "output.weight");
            let hint = match c.tie_word_embeddings && unknown.iter().any(head) {
                true => " (this model's output head is its embeddings: an adapter of the head is for an untied model)",
                false => " (is it an adapter of another model?)",
            };
            return bad(format!("it changes tensors the model does not have: {}{hint}", unknown.join(", ")));
        }
        let mut ordered: Vec<_> = self.changes.into_iter().collect();
        ordered.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, change) in
            ordered.into_iter().flat_map(|(n, changes)| changes.into_iter().map(move |change| (n.clone(), change)))
        {
            let shape = src.shape(&name).unwrap_or_default();
            let change = match change {
                Change::LowRank { rank, up, down } => {
                    let [rows, cols] = shape[..] else {
                        return bad(format!("`{name}` is {shape:?}: only matrices take low-rank changes"));
                    };
                    if rank == 0 || up.len() != rows * rank || down.len() != cols * rank {
                        let (r, k) =
                            (up.len().checked_div(rank).unwrap_or(0), down.len().checked_div(rank).unwrap_or(0));
                        return bad(format!(
                            "its change to `{name}` is [{r}, {k}] (rank {rank}), the tensor {shape:?}: is it an \
                             adapter of another model?"
                        ));
                    }
                    // Rows the source reads in another order than stored move with their changes.
                    let up = match src.row_order(&name) {
                        Some(order) if order.len() == rows => {
                            order.iter().flat_map(|&r| up[r * rank..(r + 1) * rank].iter().copied()).collect()
                        }
                        _ => up,
                    };
                    Change::LowRank { rank, up, down }
                }
                Change::Whole { shape: theirs, values } => {
                    if theirs != shape {
                        return bad(format!(
                            "it holds `{name}` whole as {theirs:?}, the model's is {shape:?} (a vocabulary resized \
                             in fine-tuning is not served: merge the adapter into its model)"
                        ));
                    }
                    Change::Whole { shape: theirs, values }
                }
            };
            changes.entry(name).or_default().push(change);
        }
        Ok(())
    }
}

/// A tensor source with adapters' changes merged into its tensors.
pub struct Adapted {
    inner: Box<dyn TensorSource>,
    changes: HashMap<String, Vec<Change>>,
}

impl Adapted {
    /// Tensor `name`'s values with its changes, f32.
    fn merged(&self, name: &str, changes: &[Change]) -> Result<(Vec<f32>, Vec<usize>), LoadError> {
        let shape = self.inner.shape(name).ok_or_else(|| LoadError::MissingTensors(vec![name.into()]))?;
        // The last adapter holding the tensor whole gives its base values; every low-rank change
        // adds to them.
        let whole = changes.iter().rev().find_map(|c| match c {
            Change::Whole { values, .. } => Some(values.clone()),
            Change::LowRank { .. } => None,
        });
        let mut values = match whole {
            Some(values) => values,
            None => f32_values(self.inner.as_ref(), name)?,
        };
        for change in changes {
            match change {
                Change::Whole { .. } => {}
                Change::LowRank { rank, up, down } => {
                    let cols = down.len() / rank;
                    values.par_chunks_mut(cols).zip(up.par_chunks(*rank)).for_each(|(row, up)| {
                        for (u, down) in up.iter().zip(down.chunks_exact(cols)) {
                            row.iter_mut().zip(down).for_each(|(v, d)| *v += u * d);
                        }
                    });
                }
            }
        }
        Ok((values, shape))
    }
}

impl TensorSource for Adapted {
    fn naming(&self) -> Naming {
        self.inner.naming()
    }

    fn names(&self) -> std::collections::BTreeSet<&str> {
        self.inner.names()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.inner.shape(name)
    }

    /// A changed tensor keeps its base's type: a quantized matrix is quantized again.
    fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
        self.inner.stored(name)
    }

    fn data(&self, name: &str, dtype: DType) -> Result<TensorData, LoadError> {
        match self.changes.get(name) {
            Some(changes) => {
                let (values, shape) = self.merged(name, changes)?;
                Ok(convert(values, shape, dtype))
            }
            None => self.inner.data(name, dtype),
        }
    }

    /// A changed tensor has no stored blocks: it is quantized from its merged values.
    fn blocks(&self, name: &str) -> Option<(QuantType, std::borrow::Cow<'_, [u8]>)> {
        match self.changes.contains_key(name) {
            true => None,
            false => self.inner.blocks(name),
        }
    }

    fn done(&self, name: &str) {
        self.inner.done(name);
    }

    fn row_order(&self, name: &str) -> Option<Vec<usize>> {
        self.inner.row_order(name)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// A GGUF-named model of two tensors held in memory: `blk.0.attn_q.weight` [4, 2] (values
    /// 0..8) read with its rows in the order [1, 0, 3, 2], and `output_norm.weight` [2].
    struct Memory;

    impl TensorSource for Memory {
        fn naming(&self) -> Naming {
            Naming::Gguf
        }
        fn names(&self) -> BTreeSet<&str> {
            BTreeSet::from(["blk.0.attn_q.weight", "output_norm.weight"])
        }
        fn shape(&self, name: &str) -> Option<Vec<usize>> {
            self.names().contains(name).then(|| if name.starts_with("blk") { vec![4, 2] } else { vec![2] })
        }
        fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
            self.shape(name).map(|_| Ok(Stored::Quant(QuantType::Q8_0)))
        }
        fn data(&self, name: &str, _: DType) -> Result<TensorData, LoadError> {
            let shape = self.shape(name).ok_or_else(|| LoadError::MissingTensors(vec![name.into()]))?;
            let values: Vec<f32> = match name.starts_with("blk") {
                true => [1, 0, 3, 2].iter().flat_map(|&r| [2 * r, 2 * r + 1]).map(|v| v as f32).collect(),
                false => vec![1.0, 1.0],
            };
            Ok(TensorData::new(values, shape))
        }
        fn blocks(&self, _: &str) -> Option<(QuantType, std::borrow::Cow<'_, [u8]>)> {
            Some((QuantType::Q8_0, std::borrow::Cow::Borrowed(&[])))
        }
        fn row_order(&self, name: &str) -> Option<Vec<usize>> {
            name.starts_with("blk").then(|| vec![1, 0, 3, 2])
        }
    }

    fn config() -> ModelConfig {
        ModelConfig::from_json_str(
            r#"{"model_type":"llama","hidden_size":2,"num_hidden_layers":1,"num_attention_heads":1,
            "intermediate_size":4,"vocab_size":8,"max_position_embeddings":16}"#,
        )
        .unwrap()
    }

    fn adapter(changes: Vec<(&str, Change)>) -> Adapter {
        let mut by_name: HashMap<String, Vec<Change>> = HashMap::new();
        for (name, change) in changes {
            by_name.entry(name.into()).or_default().push(change);
        }
        Adapter { path: "a".into(), naming: Naming::Gguf, changes: by_name }
    }

    fn values(src: &dyn TensorSource, name: &str) -> Vec<f32> {
        f32_values(src, name).unwrap()
    }

    #[test]
    fn changes_add_to_the_stored_rows_where_the_source_reads_them() {
        // up · down: stored row r changes by (r + 1) · [1, -1], times 0.5.
        let q = low_rank(1, vec![1.0, 2.0, 3.0, 4.0], vec![1.0, -1.0], 0.5);
        let norm = Change::Whole { shape: vec![2], values: vec![3.0, 4.0] };
        let mut changes = HashMap::new();
        let (c, src) = (config(), Memory);
        adapter(vec![("blk.0.attn_q.weight", q.clone()), ("output_norm.weight", norm)])
            .fit(&src, &c, &mut changes)
            .unwrap();
        // A second adapter's change adds to the first's, and the last whole tensor is the base.
        let norm = Change::Whole { shape: vec![2], values: vec![5.0, 6.0] };
        adapter(vec![("blk.0.attn_q.weight", q), ("output_norm.weight", norm)]).fit(&src, &c, &mut changes).unwrap();
        let adapted = Adapted { inner: Box::new(Memory), changes };
        // Read row r is stored row [1, 0, 3, 2][r], whose values are (2 · s, 2 · s + 1).
        let expected: Vec<f32> =
            [1.0f32, 0.0, 3.0, 2.0].iter().flat_map(|&s| [2.0 * s + (s + 1.0), 2.0 * s + 1.0 - (s + 1.0)]).collect();
        assert_eq!(values(&adapted, "blk.0.attn_q.weight"), expected);
        assert_eq!(values(&adapted, "output_norm.weight"), [5.0, 6.0]);
        // Changed tensors are quantized again from their values, as their type.
        assert!(adapted.blocks("blk.0.attn_q.weight").is_none());
        assert_eq!(adapted.stored("blk.0.attn_q.weight"), Some(Ok(Stored::Quant(QuantType::Q8_0))));
    }

    #[test]
    fn changes_that_do_not_fit_are_refused_by_name() {
        let (c, src) = (config(), Memory);
        let fit =
            |changes: Vec<(&str, Change)>| adapter(changes).fit(&src, &c, &mut HashMap::new()).unwrap_err().to_string();
        let wide = low_rank(1, vec![1.0; 4], vec![1.0; 3], 1.0);
        assert!(fit(vec![("blk.0.attn_q.weight", wide)]).contains("[4, 3] (rank 1), the tensor [4, 2]"));
        let unknown = low_rank(1, vec![1.0; 4], vec![1.0; 2], 1.0);
        assert!(fit(vec![("blk.0.attn_k.weight", unknown)]).contains("blk.0.attn_k.weight"));
        let norm = Change::Whole { shape: vec![3], values: vec![1.0; 3] };
        assert!(fit(vec![("output_norm.weight", norm)]).contains("whole as [3]"));
        let on_norm = low_rank(1, vec![1.0; 2], vec![1.0], 1.0);
        assert!(fit(vec![("output_norm.weight", on_norm)]).contains("only matrices"));
    }
}
