//! C1 from a GGUF file: the `{arch}.*` keys become the Hugging Face config fields they were
//! converted from, validated by the same code as a `config.json`. Errors name the GGUF key.

use serde_json::{Map, Value as Json, json};

use super::GgufFile;
use crate::config::ModelConfig;
use crate::error::LoadError;

/// Hugging Face field ← GGUF key under `{arch}.`.
const FIELDS: [(&str, &str); 8] = [
    ("hidden_size", "embedding_length"),
    ("num_hidden_layers", "block_count"),
    ("num_attention_heads", "attention.head_count"),
    ("num_key_value_heads", "attention.head_count_kv"),
    ("intermediate_size", "feed_forward_length"),
    ("max_position_embeddings", "context_length"),
    ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
    ("rope_theta", "rope.freq_base"),
];

/// Control tokens that end a generation, by text (llama.cpp's end-of-generation list for the
/// chat formats this model family uses).
const END_OF_GENERATION: [&str; 2] = ["<|im_end|>", "<|endoftext|>"];

/// The architecture (`general.architecture`).
pub fn architecture(file: &GgufFile) -> Result<String, LoadError> {
    file.get("general.architecture")
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .ok_or_else(|| file.error("general.architecture: missing, or not a string"))
}

/// The model's configuration.
pub fn model_config(file: &GgufFile) -> Result<ModelConfig, LoadError> {
    let arch = architecture(file)?;
    let mut obj = Map::new();
    obj.insert("model_type".into(), json!(arch));
    for (field, key) in FIELDS {
        let key = format!("{arch}.{key}");
        let Some(v) = file.get(&key) else { continue };
        let number = if field == "rms_norm_eps" || field == "rope_theta" {
            // f32 in the file: its shortest decimal, as the converter read it (1e-6, not 9.99e-7).
            v.as_f64().map(|x| json!((x as f32).to_string().parse::<f64>().unwrap_or(x)))
        } else {
            v.as_u64().map(|x| json!(x))
        };
        obj.insert(field.into(), number.ok_or_else(|| file.error(format!("{key}: expected a number, found {v:?}")))?);
    }
    let embed = file.tensor("token_embd.weight").ok_or_else(|| file.error("no token_embd.weight tensor"))?;
    obj.insert("vocab_size".into(), json!(embed.shape()[0]));
    obj.insert("tie_word_embeddings".into(), json!(file.tensor("output.weight").is_none()));
    let id = |key: &str| file.get(key).and_then(|v| v.as_u64());
    if let Some(bos) = id("tokenizer.ggml.bos_token_id") {
        obj.insert("bos_token_id".into(), json!(bos));
    }
    obj.insert("eos_token_id".into(), json!(eos_ids(file)));
    ModelConfig::from_json_str(&Json::Object(obj).to_string()).map_err(|e| match e {
        LoadError::Config { field, reason } => {
            let key = FIELDS.iter().find(|(f, _)| *f == field).map_or(field, |(_, k)| format!("{arch}.{k}"));
            file.error(format!("{key}: {reason}"))
        }
        other => other,
    })
}

/// End-of-generation ids: eos, eot, and the control tokens named in `END_OF_GENERATION`.
fn eos_ids(file: &GgufFile) -> Vec<u64> {
    let mut ids: Vec<u64> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|k| file.get(k)?.as_u64())
        .collect();
    let tokens = file.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).unwrap_or_default();
    let types = file.get("tokenizer.ggml.token_type").and_then(|v| v.as_array()).unwrap_or_default();
    for (i, (t, ty)) in tokens.iter().zip(types).enumerate() {
        if ty.as_i64() == Some(3) && t.as_str().is_some_and(|t| END_OF_GENERATION.contains(&t)) {
            ids.push(i as u64);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|id| seen.insert(*id));
    ids
}
