//! PEFT's LoRA directories: `adapter_config.json` (rank, alpha, their per-module patterns,
//! rank-stabilised scaling) and `adapter_model.safetensors`, whose tensors are named as the
//! base model's modules under `base_model.model.`: `{module}.lora_A.weight` [r, in] and
//! `{module}.lora_B.weight` [out, r]; an embedding's `{module}.lora_embedding_A` [r, vocab] and
//! `lora_embedding_B` [hidden, r]; tensors saved whole (`modules_to_save`, the embeddings PEFT
//! saves beside their changes as `{module}.base_layer.weight`) under their own names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Adapter, Change, adapter_error, low_rank, transposed};
use crate::checkpoint::{Checkpoint, decoder_names};
use crate::config::{ModelConfig, read_json};
use crate::error::LoadError;
use crate::tensors::{Naming, TensorSource, f32_values};

/// What PEFT's LoRA options this reading does not do, by their `adapter_config.json` fields:
/// each changes how the adapter computes (or which rows it applies to), so merging the plain
/// product would serve another model.
const REFUSED: &[(&str, &str)] = &[
    ("use_dora", "DoRA (weight-decomposed LoRA)"),
    ("lora_bias", "biases on the LoRA products"),
    ("fan_in_fan_out", "weights stored [in, out] (GPT-2's Conv1D)"),
    ("target_parameters", "changes to parameters (experts' 3-D tensors)"),
    ("trainable_token_indices", "trainable token embeddings"),
    ("alora_invocation_tokens", "activated LoRA (applied only after its invocation tokens)"),
    ("use_qalora", "QA-LoRA's pooled inputs"),
    ("layer_replication", "replicated layers"),
    ("arrow_config", "Arrow's routing among adapters"),
    ("use_bdlora", "BD-LoRA"),
    ("kasa_config", "KaSA"),
    ("velora_config", "VeLoRA"),
    ("monteclora_config", "MonteCLoRA"),
];

/// Reads the PEFT adapter at `path` (its directory, or a file in it) for a model of
/// configuration `c`, its changes times `scale`.
pub(super) fn read(path: &Path, scale: f32, c: &ModelConfig) -> Result<Adapter, LoadError> {
    let dir = match path.is_file() {
        true => path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        false => path.to_path_buf(),
    };
    let bad = |reason: String| adapter_error(path, reason);
    let config_path = dir.join("adapter_config.json");
    if !config_path.is_file() {
        return Err(bad("no adapter_config.json: an adapter is a PEFT directory or a GGUF adapter file".into()));
    }
    let config = read_json(&config_path)?;
    let options = Options::read(&config).map_err(bad)?;
    let weights = dir.join("adapter_model.safetensors");
    if !weights.is_file() {
        let reason = match dir.join("adapter_model.bin").is_file() {
            true => "its weights are in adapter_model.bin (a pickle, not read): save it with safe_serialization",
            false => "no adapter_model.safetensors",
        };
        return Err(bad(reason.into()));
    }
    let file = Checkpoint::open_file(&weights)?;

    // Each module's factors, and the tensors saved whole, by the base's tensor names.
    let mut factors: HashMap<String, Factors> = HashMap::new();
    let mut changes: HashMap<String, Vec<Change>> = HashMap::new();
    for key in file.names() {
        let name = key.strip_prefix("base_model.model.").unwrap_or(key);
        let values = || f32_values(&file, key).map_err(|e| bad(e.to_string()));
        let shape = file.shape(key).unwrap_or_default();
        let [a, b, embed_a, embed_b] = [".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B"]
            .map(|s| name.strip_suffix(s));
        let (module, factor) = match (a, b, embed_a, embed_b) {
            (Some(m), ..) => (m, Factor::A),
            (_, Some(m), ..) => (m, Factor::B),
            (_, _, Some(m), _) => (m, Factor::EmbeddingA),
            (.., Some(m)) => (m, Factor::EmbeddingB),
            _ => {
                if name.contains(".lora_") || name.contains("lora_magnitude_vector") {
                    return Err(bad(format!("`{key}`: a LoRA tensor of a kind not read (DoRA, LoRA biases?)")));
                }
                // Saved whole: `{module}.base_layer.weight` is the module's own weight.
                let name = name.replace(".base_layer.", ".");
                changes.entry(name).or_default().push(Change::Whole { shape, values: values()? });
                continue;
            }
        };
        if shape.len() != 2 {
            return Err(bad(format!("`{key}` is {shape:?}: LoRA factors are matrices")));
        }
        let entry = factors.entry(module.to_string()).or_default();
        entry.embedding |= matches!(factor, Factor::EmbeddingA | Factor::EmbeddingB);
        let slot = match factor {
            Factor::A | Factor::EmbeddingA => &mut entry.a,
            Factor::B | Factor::EmbeddingB => &mut entry.b,
        };
        *slot = Some((shape, values()?));
    }
    for (module, f) in factors {
        let (Some((a_shape, a)), Some((b_shape, b))) = (f.a, f.b) else {
            return Err(bad(format!("`{module}` has one of its two LoRA factors only")));
        };
        let rank = a_shape[0];
        if b_shape[1] != rank {
            return Err(bad(format!("`{module}`'s factors {a_shape:?} and {b_shape:?} do not multiply")));
        }
        let scale = scale * options.scaling(&module, rank);
        let change = match f.embedding {
            // An embedding's change is (B · A)ᵀ: [vocab, hidden] = Aᵀ [vocab, r] · Bᵀ [r, hidden].
            true => low_rank(rank, transposed(&a, rank, a_shape[1]), transposed(&b, b_shape[0], rank), scale),
            false => low_rank(rank, b, a, scale),
        };
        changes.entry(format!("{module}.weight")).or_default().push(change);
    }
    Ok(Adapter { path: path.into(), naming: Naming::Hf, changes: decoder_names(changes, c.arch.hf_aliases) })
}

#[derive(Debug, Clone, Copy)]
enum Factor {
    A,
    B,
    EmbeddingA,
    EmbeddingB,
}

/// A module's two factors as read (shape, values).
#[derive(Default)]
struct Factors {
    a: Option<(Vec<usize>, Vec<f32>)>,
    b: Option<(Vec<usize>, Vec<f32>)>,
    embedding: bool,
}

/// The options of `adapter_config.json` that set a module's scale.
struct Options {
    alpha: f64,
    /// Module patterns with their own alpha (PEFT matches `(.*\.)?(pattern)$`).
    alpha_pattern: Vec<(regex::Regex, f64)>,
    /// rsLoRA: alpha / √r, not alpha / r.
    rslora: bool,
}

impl Options {
    fn read(config: &Value) -> Result<Self, String> {
        let peft_type = config.get("peft_type").and_then(Value::as_str).unwrap_or("LORA");
        if !peft_type.eq_ignore_ascii_case("lora") {
            return Err(format!("a {peft_type} adapter: only LoRA adapters are read"));
        }
        for (field, what) in REFUSED {
            let on = match config.get(*field) {
                None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                Some(Value::Array(a)) => !a.is_empty(),
                Some(Value::Object(o)) => !o.is_empty(),
                Some(_) => true,
            };
            if on {
                return Err(format!("`{field}` asks for {what}, which llaisys does not merge"));
            }
        }
        let number = |field: &str, default: f64| match config.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| format!("`{field}` is not a number")),
        };
        let mut alpha_pattern = Vec::new();
        if let Some(patterns) = config.get("alpha_pattern").and_then(Value::as_object) {
            for (pattern, alpha) in patterns {
                let alpha = alpha.as_f64().ok_or_else(|| format!("`alpha_pattern` of `{pattern}` is not a number"))?;
                let re = regex::Regex::new(&format!(r"^(.*\.)?({pattern})$"))
                    .map_err(|e| format!("`alpha_pattern` key `{pattern}`: {e}"))?;
                alpha_pattern.push((re, alpha));
            }
        }
        let rslora = config.get("use_rslora").and_then(Value::as_bool).unwrap_or(false);
        Ok(Self { alpha: number("lora_alpha", 8.0)?, alpha_pattern, rslora })
    }

    /// The scale of `module`'s change of rank `rank`: its alpha over the rank (or its root).
    fn scaling(&self, module: &str, rank: usize) -> f32 {
        let alpha = self.alpha_pattern.iter().find(|(re, _)| re.is_match(module)).map_or(self.alpha, |(_, a)| *a);
        let rank = rank as f64;
        (alpha / if self.rslora { rank.sqrt() } else { rank }) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_scales_follow_alpha_its_patterns_and_rslora() {
        let config =
            serde_json::json!({"lora_alpha": 16, "r": 8, "alpha_pattern": {"v_proj": 4, "layers\\.1\\.mlp\\..*": 2}});
        let o = Options::read(&config).unwrap();
        assert_eq!(o.scaling("model.layers.0.self_attn.q_proj", 8), 2.0);
        assert_eq!(o.scaling("model.layers.0.self_attn.v_proj", 8), 0.5);
        // A pattern matches whole dotted components at the end, as PEFT's does.
        assert_eq!(o.scaling("model.layers.0.self_attn.xv_proj", 8), 2.0);
        assert_eq!(o.scaling("model.layers.1.mlp.up_proj", 4), 0.5);
        let rs = Options::read(&serde_json::json!({"lora_alpha": 6, "use_rslora": true})).unwrap();
        assert_eq!(rs.scaling("q_proj", 4), 3.0);
    }

    #[test]
    fn options_that_change_the_computation_are_refused_by_name() {
        for (config, named) in [
            (serde_json::json!({"use_dora": true}), "use_dora"),
            (serde_json::json!({"peft_type": "IA3"}), "IA3"),
            (serde_json::json!({"target_parameters": ["mlp.experts.gate_up_proj"]}), "target_parameters"),
            (serde_json::json!({"alpha_pattern": {"q_proj(": 2}}), "q_proj("),
        ] {
            let err = Options::read(&config).err().unwrap_or_else(|| panic!("{config} was read"));
            assert!(err.contains(named), "{err}");
        }
        // Their defaults (off, empty) are not refusals.
        let defaults = serde_json::json!({"use_dora": false, "target_parameters": null, "layer_replication": null,
            "loftq_config": {}, "eva_config": null, "trainable_token_indices": null});
        assert!(Options::read(&defaults).is_ok());
    }
}
