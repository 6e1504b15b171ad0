//! llama.cpp's GGUF adapters (`general.type` `adapter`, `adapter.type` `lora`, as
//! `convert_lora_to_gguf.py` writes them): each changed tensor's factors under its GGUF name,
//! `{name}.lora_a` [r, in] and `{name}.lora_b` [out, r] (the token embeddings' flipped:
//! `lora_a` [vocab, r], `lora_b` [hidden, r]), scaled by `adapter.lora.alpha` over the rank
//! (by 1 where the file gives no alpha), as llama.cpp scales them.

use std::collections::HashMap;
use std::path::Path;

use super::{Adapter, Change, adapter_error, low_rank, transposed};
use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::gguf::{GgufFile, Value};
use crate::tensors::{Naming, TensorSource, f32_values};

/// Reads the GGUF adapter at `path` for a model of configuration `c`, its changes times `scale`.
pub(super) fn read(path: &Path, scale: f32, c: &ModelConfig) -> Result<Adapter, LoadError> {
    let file = GgufFile::open(path)?;
    let bad = |reason: String| adapter_error(path, reason);
    let text = |key: &str| file.get(key).and_then(Value::as_str).unwrap_or("");
    match (text("general.type"), text("adapter.type")) {
        ("adapter", "lora") => {}
        ("adapter", other) => return Err(bad(format!("a `{other}` adapter: only LoRA adapters are read"))),
        (other, _) => return Err(bad(format!("not an adapter (its general.type is `{other}`): a model's file?"))),
    }
    let arch = text("general.architecture");
    if arch != c.arch.gguf {
        return Err(bad(format!("an adapter of a `{arch}` model; this model is `{}`", c.arch.gguf)));
    }
    if file.get("adapter.alora.invocation_tokens").is_some() {
        return Err(bad(
            "an activated LoRA (applied only after its invocation tokens), which llaisys does not merge".into()
        ));
    }
    let alpha = file.get("adapter.lora.alpha").and_then(Value::as_f64).unwrap_or(0.0) as f32;

    let read = |name: &str| Ok::<_, LoadError>((file.shape(name).unwrap_or_default(), f32_values(&file, name)?));
    let mut changes: HashMap<String, Vec<Change>> = HashMap::new();
    for name in file.names() {
        let target = match (name.strip_suffix(".lora_a"), name.strip_suffix(".lora_b")) {
            (Some(t), _) => t,
            (_, Some(_)) => continue,
            // Norms fine-tuned with the adapter (mergekit-extract-lora's), whole.
            _ if name.ends_with("_norm.weight") => {
                let (shape, values) = read(name)?;
                changes.entry(name.to_string()).or_default().push(Change::Whole { shape, values });
                continue;
            }
            _ => return Err(bad(format!("`{name}`: neither a LoRA factor (`.lora_a`, `.lora_b`) nor a norm"))),
        };
        let b_name = format!("{target}.lora_b");
        if file.shape(&b_name).is_none() {
            return Err(bad(format!("`{name}` has no `{b_name}`")));
        }
        let ((a_shape, a), (b_shape, b)) = (read(name)?, read(&b_name)?);
        let (&[a_rows, a_cols], &[b_rows, rank]) = (&a_shape[..], &b_shape[..]) else {
            return Err(bad(format!("`{target}`'s factors are {a_shape:?} and {b_shape:?}: not matrices")));
        };
        let scale = if alpha != 0.0 { scale * alpha / rank as f32 } else { scale };
        let embedding = target.ends_with("token_embd.weight");
        let (up, down) = match embedding {
            // [vocab, hidden] = lora_a [vocab, r] · lora_bᵀ [r, hidden].
            true if a_cols == rank => (a, transposed(&b, b_rows, rank)),
            false if a_rows == rank => (b, a),
            _ => return Err(bad(format!("`{target}`'s factors {a_shape:?} and {b_shape:?} do not multiply"))),
        };
        changes.entry(target.to_string()).or_default().push(low_rank(rank, up, down, scale));
    }
    for name in file.names() {
        if let Some(target) = name.strip_suffix(".lora_b")
            && !changes.contains_key(target)
        {
            return Err(bad(format!("`{name}` has no `{target}.lora_a`")));
        }
    }
    Ok(Adapter { path: path.into(), naming: Naming::Gguf, changes })
}
