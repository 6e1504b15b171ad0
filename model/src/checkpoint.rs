//! C3: a Hugging Face safetensors checkpoint (`model.safetensors`, or the shards listed in
//! `model.safetensors.index.json`). The headers are read through a memory map; each tensor's
//! bytes are read from the file a few MiB at a time and converted straight into its Burn
//! tensor, so loading holds the converted weights plus one chunk — never the file's pages too
//! (reading the data through the map kept every page resident: 1 GB more peak memory for the
//! demo model).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, TensorData};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::config::read_json;
use crate::error::LoadError;
use crate::tensors::{Naming, Stored, TensorSource};

struct Shard {
    path: PathBuf,
    file: File,
    /// Only the header pages are ever touched.
    mmap: Mmap,
    /// Byte offset of the data section (8 + header length).
    data_start: usize,
}

/// One tensor's location in a shard.
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    range: (usize, usize),
}

/// The tensors of a checkpoint directory, by name.
pub struct Checkpoint {
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
}

impl Checkpoint {
    /// The model checkpoint in `dir`, its language model under a text model's names.
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let mut checkpoint = Self::from_files(shard_files(dir)?)?;
        checkpoint.entries = language_model(checkpoint.entries);
        Ok(checkpoint)
    }

    /// The vision tower of the checkpoint in `dir`: its tensors under the first of `prefixes`
    /// (prefix, what it becomes) each name has, renamed (Qwen's `visual.` or `model.visual.`,
    /// left off); `None` where it has none.
    pub fn vision(dir: &Path, prefixes: &[(&str, &str)]) -> Result<Option<Self>, LoadError> {
        let mut checkpoint = Self::from_files(shard_files(dir)?)?;
        checkpoint.entries = std::mem::take(&mut checkpoint.entries)
            .into_iter()
            .filter_map(|(name, e)| {
                let mut renamed =
                    prefixes.iter().filter_map(|(p, to)| name.strip_prefix(p).map(|rest| to.to_string() + rest));
                renamed.next().map(|name| (name, e))
            })
            .collect();
        Ok((!checkpoint.entries.is_empty()).then_some(checkpoint))
    }

    /// One safetensors file's tensors under their own names (a PEFT adapter's).
    pub fn open_file(path: &Path) -> Result<Self, LoadError> {
        Self::from_files(vec![path.to_path_buf()])
    }

    fn from_files(files: Vec<PathBuf>) -> Result<Self, LoadError> {
        let mut shards = Vec::with_capacity(files.len());
        let mut entries = HashMap::new();
        for (i, path) in files.into_iter().enumerate() {
            let file = File::open(&path).map_err(|source| LoadError::Io { path: path.clone(), source })?;
            // SAFETY: the mapping is read-only and lives as long as the `Checkpoint`. A file
            // changed by another process while mapped could change the bytes read, which can
            // give wrong weights but no memory unsafety in this code: every read is bounds-checked
            // against the validated header, and the bytes are only ever copied out.
            #[allow(unsafe_code)]
            let mmap = unsafe { Mmap::map(&file) }.map_err(|source| LoadError::Io { path: path.clone(), source })?;
            let bad = |reason: String| LoadError::Safetensors { path: path.clone(), reason };
            let (header_len, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| bad(format!("{e:?}")))?;
            for (name, info) in metadata.tensors() {
                let entry = Entry { shard: i, dtype: info.dtype, shape: info.shape.clone(), range: info.data_offsets };
                if entries.insert(name.clone(), entry).is_some() {
                    return Err(LoadError::DuplicateTensor { name });
                }
            }
            shards.push(Shard { path, file, mmap, data_start: 8 + header_len });
        }
        Ok(Self { shards, entries })
    }
}

/// A multimodal checkpoint's language model under the names a text model's tensors have
/// (`model.`, `lm_head.`): Qwen3.5's `model.language_model.` (beside `model.visual.` and a
/// multi-token-prediction head `mtp.`), or Mistral 3's `language_model.model.` and
/// `language_model.lm_head.` (beside `vision_tower.` and `multi_modal_projector.`), or Qwen2-VL's
/// and Qwen2.5-VL's released `model.` and `lm_head.` beside `visual.`; the vision tower and the
/// extra heads are not served, so not listed. A text model's entries are returned as they are.
fn language_model<T>(entries: HashMap<String, T>) -> HashMap<String, T> {
    const QWEN: &str = "model.language_model.";
    const MISTRAL: &str = "language_model.";
    if entries.keys().any(|n| n.starts_with(QWEN)) {
        return entries
            .into_iter()
            .filter_map(|(name, e)| match name.strip_prefix(QWEN) {
                Some(rest) => Some((format!("model.{rest}"), e)),
                None if name.starts_with("model.") || name.starts_with("mtp.") => None,
                None => Some((name, e)),
            })
            .collect();
    }
    if entries.keys().any(|n| n.starts_with(MISTRAL)) {
        return entries
            .into_iter()
            .filter_map(|(name, e)| name.strip_prefix(MISTRAL).map(|rest| (rest.to_string(), e)))
            .collect();
    }
    let mut entries = entries;
    entries.retain(|name, _| !name.starts_with("visual."));
    entries
}

impl Checkpoint {
    /// The checkpoint with its family's tensors under the decoder's names
    /// (`Architecture::hf_aliases`: under `model.layers.{l}.`, `{e}` an expert's index).
    pub fn aliased(mut self, aliases: &[(&str, &str)]) -> Self {
        self.entries = aliased(self.entries, aliases);
        self
    }

    /// The checkpoint without the tensors of layers `layers` (`model.layers.{l}.`): a
    /// multi-token-prediction head's, after the model's (GLM-4.5's), which is not served.
    pub fn without_layers(mut self, layers: Range<usize>) -> Self {
        if !layers.is_empty() {
            self.entries.retain(|name, _| {
                let layer = name.strip_prefix("model.layers.").and_then(|r| r.split_once('.')).map(|(l, _)| l);
                !layer.and_then(|l| l.parse::<usize>().ok()).is_some_and(|l| layers.contains(&l))
            });
        }
        self
    }

    /// The shards' paths.
    pub fn files(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|s| s.path.clone()).collect()
    }

    /// Each tensor's values and bytes, by its stored type's name (`BF16`).
    pub fn sizes(&self) -> impl Iterator<Item = (usize, usize, String)> + '_ {
        self.entries.values().map(|e| (e.shape.iter().product(), e.range.1 - e.range.0, format!("{:?}", e.dtype)))
    }
}

/// `entries` under the decoder's names (`Architecture::hf_aliases`).
fn aliased<T>(entries: HashMap<String, T>, aliases: &[(&str, &str)]) -> HashMap<String, T> {
    if aliases.is_empty() {
        return entries;
    }
    entries
        .into_iter()
        .map(|(name, e)| {
            let ours = name.strip_prefix("model.layers.").and_then(|rest| {
                let (layer, tail) = rest.split_once('.')?;
                let ours = aliases.iter().find_map(|(ours, theirs)| alias_of(tail, ours, theirs))?;
                Some(format!("model.layers.{layer}.{ours}"))
            });
            (ours.unwrap_or(name), e)
        })
        .collect()
}

/// Values named as a checkpoint names its tensors (an adapter's changes to them), under the
/// names a [`Checkpoint`] of a family with `aliases` gives the same tensors: a multimodal
/// checkpoint's language model as a text model's, the family's aliases as the decoder's.
pub(crate) fn decoder_names<T>(entries: HashMap<String, T>, aliases: &[(&str, &str)]) -> HashMap<String, T> {
    aliased(language_model(entries), aliases)
}

/// `tail` under the decoder's name `ours` if it is the family's `theirs`, whose `{e}` (if any)
/// stands for an expert's index.
fn alias_of(tail: &str, ours: &str, theirs: &str) -> Option<String> {
    match theirs.split_once("{e}") {
        None => (tail == theirs).then(|| ours.to_string()),
        Some((before, after)) => {
            let e = tail.strip_prefix(before)?.strip_suffix(after)?;
            (!e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())).then(|| ours.replace("{e}", e))
        }
    }
}

impl TensorSource for Checkpoint {
    fn naming(&self) -> Naming {
        Naming::Hf
    }

    fn names(&self) -> BTreeSet<&str> {
        self.entries.keys().map(String::as_str).collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.entries.get(name).map(|e| e.shape.clone())
    }

    fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
        Some(match self.entries.get(name)?.dtype {
            Dtype::F32 => Ok(Stored::F32),
            Dtype::F16 => Ok(Stored::F16),
            Dtype::BF16 => Ok(Stored::Bf16),
            other => Err(format!("{other:?}")),
        })
    }

    /// Reads the tensor a few MiB at a time, converting as it goes.
    fn data(&self, name: &str, dtype: DType) -> Result<TensorData, LoadError> {
        let e = self.entries.get(name).ok_or_else(|| LoadError::MissingTensors(vec![name.into()]))?;
        let shard = &self.shards[e.shard];
        let (start, end) = (shard.data_start + e.range.0, shard.data_start + e.range.1);
        if end > shard.mmap.len() {
            let reason = format!("`{name}` lies outside the file");
            return Err(LoadError::Safetensors { path: shard.path.clone(), reason });
        }
        if !matches!(e.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            return Err(LoadError::Tensor { name: name.into(), reason: format!("type {:?} does not load", e.dtype) });
        }
        let io = |source| LoadError::Io { path: shard.path.clone(), source };
        let shape = e.shape.clone();
        Ok(match dtype {
            DType::F16 => TensorData::new(read(&shard.file, start, end, e.dtype, f16::from_f32).map_err(io)?, shape),
            DType::BF16 => TensorData::new(read(&shard.file, start, end, e.dtype, bf16::from_f32).map_err(io)?, shape),
            _ => TensorData::new(read(&shard.file, start, end, e.dtype, |x| x).map_err(io)?, shape),
        })
    }
}

impl Checkpoint {
    /// A tensor of bytes as stored (`U8`: MXFP4's blocks and scales in OpenAI's checkpoints).
    pub fn bytes(&self, name: &str) -> Result<Vec<u8>, LoadError> {
        let e = self.entries.get(name).ok_or_else(|| LoadError::MissingTensors(vec![name.into()]))?;
        let shard = &self.shards[e.shard];
        let (start, end) = (shard.data_start + e.range.0, shard.data_start + e.range.1);
        if end > shard.mmap.len() || e.dtype != Dtype::U8 {
            let reason = format!("`{name}` is not bytes within the file ({:?})", e.dtype);
            return Err(LoadError::Safetensors { path: shard.path.clone(), reason });
        }
        let mut out = vec![0u8; end - start];
        shard
            .file
            .read_exact_at(&mut out, start as u64)
            .map_err(|source| LoadError::Io { path: shard.path.clone(), source })?;
        Ok(out)
    }

    /// A tensor's stored type's name (`U8`, `BF16`).
    pub fn dtype_name(&self, name: &str) -> Option<String> {
        self.entries.get(name).map(|e| format!("{:?}", e.dtype))
    }
}

/// Bytes read per call while loading a tensor (a multiple of every element size).
const READ_CHUNK: usize = 4 << 20;

/// Reads bytes `[start, end)` of `file` as little-endian f32/f16/bf16 values, mapping each
/// through `to`, one chunk at a time.
fn read<T>(file: &File, start: usize, end: usize, dtype: Dtype, to: impl Fn(f32) -> T) -> std::io::Result<Vec<T>> {
    let mut out = Vec::with_capacity((end - start) * 8 / dtype.bitsize().max(1));
    let mut chunk = vec![0u8; READ_CHUNK.min(end - start)];
    let mut offset = start;
    while offset < end {
        let bytes = &mut chunk[..READ_CHUNK.min(end - offset)];
        file.read_exact_at(bytes, offset as u64)?;
        match dtype {
            Dtype::F32 => out.extend(bytes.chunks_exact(4).map(|b| to(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))),
            Dtype::F16 => out.extend(bytes.chunks_exact(2).map(|b| to(f16::from_le_bytes([b[0], b[1]]).to_f32()))),
            Dtype::BF16 => out.extend(bytes.chunks_exact(2).map(|b| to(bf16::from_le_bytes([b[0], b[1]]).to_f32()))),
            _ => {}
        }
        offset += bytes.len();
    }
    Ok(out)
}

/// `model.safetensors`, or every shard named by `model.safetensors.index.json`.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return Ok(vec![dir.join("model.safetensors")]);
    }
    let json = read_json(&index)?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| LoadError::Json { path: index.clone(), reason: "no `weight_map` object".into() })?;
    let mut files = BTreeSet::new();
    for file in map.values() {
        let name = file.as_str().filter(|f| !f.contains('/') && !f.contains('\\')).ok_or_else(|| LoadError::Json {
            path: index.clone(),
            reason: format!("`weight_map` entry {file} is not a file name"),
        })?;
        files.insert(dir.join(name));
    }
    Ok(files.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::{Entry, alias_of, language_model};

    /// Qwen3.5's, Mistral 3's and Qwen2.5-VL's multimodal layouts give the text model's names; the vision
    /// tower, the projector and the multi-token-prediction head are left out; a text model's
    /// names stay.
    #[test]
    fn a_multimodal_checkpoints_language_model_is_read_under_a_text_models_names() {
        let names = |list: &[&str]| -> Vec<String> {
            let entries = list
                .iter()
                .map(|n| {
                    (n.to_string(), Entry { shard: 0, dtype: safetensors::Dtype::F32, shape: vec![1], range: (0, 4) })
                })
                .collect();
            let mut out: Vec<String> = language_model(entries).into_keys().collect();
            out.sort();
            out
        };
        let text = ["lm_head.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight"];
        let mistral3 = [
            "language_model.lm_head.weight",
            "language_model.model.layers.0.mlp.up_proj.weight",
            "language_model.model.norm.weight",
            "multi_modal_projector.linear_1.weight",
            "vision_tower.patch_conv.weight",
        ];
        let qwen35 = [
            "lm_head.weight",
            "model.language_model.layers.0.mlp.up_proj.weight",
            "model.language_model.norm.weight",
            "model.visual.patch_embed.proj.weight",
            "mtp.fc.weight",
        ];
        let qwen25vl =
            ["lm_head.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight", "visual.merger.mlp.0.weight"];
        for list in [&text[..], &mistral3, &qwen35, &qwen25vl] {
            assert_eq!(names(list), text, "{list:?}");
        }
    }

    #[test]
    fn aliases_match_whole_names_and_expert_indices() {
        let (ours, theirs) = ("mlp.experts.{e}.gate_proj.weight", "block_sparse_moe.experts.{e}.w1.weight");
        assert_eq!(
            alias_of("block_sparse_moe.experts.17.w1.weight", ours, theirs).as_deref(),
            Some("mlp.experts.17.gate_proj.weight")
        );
        for other in [
            "block_sparse_moe.experts..w1.weight",
            "block_sparse_moe.experts.1x.w1.weight",
            "block_sparse_moe.experts.1.w2.weight",
        ] {
            assert_eq!(alias_of(other, ours, theirs), None, "{other}");
        }
        assert_eq!(
            alias_of("block_sparse_moe.gate.weight", "mlp.gate.weight", "block_sparse_moe.gate.weight").as_deref(),
            Some("mlp.gate.weight")
        );
        assert_eq!(alias_of("block_sparse_moe.gate.bias", "mlp.gate.weight", "block_sparse_moe.gate.weight"), None);
    }
}
