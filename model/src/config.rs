//! C1: the Hugging Face `config.json` of a Qwen2-family checkpoint, validated before anything
//! is allocated. Every error names the offending field.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::LoadError;

/// The element type of a checkpoint's tensors (`torch_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointDtype {
    F32,
    F16,
    Bf16,
}

/// A validated transformer configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Derived: `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    /// The context length: the largest position + 1 a sequence may use.
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    pub torch_dtype: Option<CheckpointDtype>,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` may be one id or a list in the file.
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Reads and validates `DIR/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        Self::from_value(read_json(&dir.join("config.json"))?)
    }

    /// Parses and validates the text of a `config.json`.
    pub fn from_json_str(text: &str) -> Result<Self, LoadError> {
        let value = serde_json::from_str(text)
            .map_err(|e| LoadError::Json { path: "config.json".into(), reason: e.to_string() })?;
        Self::from_value(value)
    }

    fn from_value(value: Value) -> Result<Self, LoadError> {
        let Value::Object(obj) = value else {
            return Err(LoadError::Json { path: "config.json".into(), reason: "not a JSON object".into() });
        };
        let f = Fields(&obj);
        let hidden_size = f.usize("hidden_size")?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        let config = Self {
            model_type: f.opt_str("model_type")?.unwrap_or_else(|| "qwen2".into()),
            hidden_size,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: f.opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads),
            head_dim: hidden_size.checked_div(num_attention_heads).unwrap_or(0),
            intermediate_size: f.usize("intermediate_size")?,
            vocab_size: f.usize("vocab_size")?,
            max_position_embeddings: f.usize("max_position_embeddings")?,
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: f.rope_theta()?,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            // transformers ≥ 5 writes `dtype`, earlier versions `torch_dtype`.
            torch_dtype: match f.get("torch_dtype") {
                Some(_) => f.dtype("torch_dtype")?,
                None => f.dtype("dtype")?,
            },
            bos_token_id: f.opt_token("bos_token_id")?,
            eos_token_ids: f.token_list("eos_token_id")?,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), LoadError> {
        let bad = |field: &str, reason: String| Err(LoadError::Config { field: field.into(), reason });
        if self.num_hidden_layers == 0 {
            return bad("num_hidden_layers", "must be > 0".into());
        }
        if self.num_attention_heads == 0 {
            return bad("num_attention_heads", "must be > 0".into());
        }
        if self.hidden_size == 0 || !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(
                "hidden_size",
                format!("{} is not num_attention_heads ({}) × head_dim", self.hidden_size, self.num_attention_heads),
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad("hidden_size", format!("head_dim {} must be even for rotary embeddings", self.head_dim));
        }
        let (heads, kv) = (self.num_attention_heads, self.num_key_value_heads);
        if kv == 0 || kv > heads || !heads.is_multiple_of(kv) {
            return bad(
                "num_key_value_heads",
                format!("{kv} must be > 0, ≤ num_attention_heads ({heads}) and divide it"),
            );
        }
        for (field, value) in [
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if value == 0 {
                return bad(field, "must be > 0".into());
            }
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return bad("rms_norm_eps", format!("{} must be a positive number", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad("rope_theta", format!("{} must be a positive number", self.rope_theta));
        }
        let vocab = self.vocab_size;
        for (field, id) in self
            .bos_token_id
            .iter()
            .map(|id| ("bos_token_id", id))
            .chain(self.eos_token_ids.iter().map(|id| ("eos_token_id", id)))
        {
            if *id as usize >= vocab {
                return bad(field, format!("token id {id} is not below vocab_size {vocab}"));
            }
        }
        Ok(())
    }
}

/// Reads and parses a JSON file (config.json, tokenizer_config.json, a shard index).
pub(crate) fn read_json(path: &Path) -> Result<Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io { path: path.into(), source })?;
    serde_json::from_str(&text).map_err(|e| LoadError::Json { path: path.into(), reason: e.to_string() })
}

/// Typed access to the fields of a JSON object, each error naming its field.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, field: &str) -> Option<&Value> {
        self.0.get(field).filter(|v| !v.is_null())
    }

    fn err(field: &str, expected: &str, found: &Value) -> LoadError {
        LoadError::Config { field: field.into(), reason: format!("expected {expected}, found {found}") }
    }

    fn opt_usize(&self, field: &str) -> Result<Option<usize>, LoadError> {
        self.get(field)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| Self::err(field, "a non-negative integer", v))
            })
            .transpose()
    }

    fn usize(&self, field: &str) -> Result<usize, LoadError> {
        self.opt_usize(field)?.ok_or_else(|| LoadError::Config { field: field.into(), reason: "missing".into() })
    }

    fn opt_f64(&self, field: &str) -> Result<Option<f64>, LoadError> {
        self.get(field).map(|v| v.as_f64().ok_or_else(|| Self::err(field, "a number", v))).transpose()
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>, LoadError> {
        self.get(field).map(|v| v.as_bool().ok_or_else(|| Self::err(field, "true or false", v))).transpose()
    }

    fn opt_str(&self, field: &str) -> Result<Option<String>, LoadError> {
        self.get(field)
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| Self::err(field, "a string", v)))
            .transpose()
    }

    fn opt_token(&self, field: &str) -> Result<Option<u32>, LoadError> {
        self.get(field)
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| Self::err(field, "a token id", v)))
            .transpose()
    }

    fn token_list(&self, field: &str) -> Result<Vec<u32>, LoadError> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| Self::err(field, "token ids", v)))
                .collect(),
            Some(_) => Ok(self.opt_token(field)?.into_iter().collect()),
        }
    }

    /// `rope_theta` at the top level (transformers < 5) or in `rope_parameters`; only the
    /// default (unscaled) rotary embedding is implemented, so any scaling is an error.
    fn rope_theta(&self) -> Result<f64, LoadError> {
        if let Some(scaling) = self.get("rope_scaling") {
            return Err(Self::err("rope_scaling", "null (rope scaling is not supported)", scaling));
        }
        let Some(params) = self.get("rope_parameters") else {
            return Ok(self.opt_f64("rope_theta")?.unwrap_or(10_000.0));
        };
        let Value::Object(params) = params else {
            return Err(Self::err("rope_parameters", "an object", params));
        };
        let nested = Fields(params);
        match nested.opt_str("rope_type")?.as_deref() {
            None | Some("default") => {}
            Some(other) => {
                return Err(LoadError::Config {
                    field: "rope_parameters.rope_type".into(),
                    reason: format!("`{other}` is not supported (only `default`)"),
                });
            }
        }
        let theta = nested.opt_f64("rope_theta").map_err(|_| LoadError::Config {
            field: "rope_parameters.rope_theta".into(),
            reason: "expected a number".into(),
        })?;
        Ok(theta.or(self.opt_f64("rope_theta")?).unwrap_or(10_000.0))
    }

    fn dtype(&self, field: &str) -> Result<Option<CheckpointDtype>, LoadError> {
        Ok(match self.opt_str(field)?.as_deref() {
            None => None,
            Some("float32") => Some(CheckpointDtype::F32),
            Some("float16") => Some(CheckpointDtype::F16),
            Some("bfloat16") => Some(CheckpointDtype::Bf16),
            Some(other) => {
                return Err(LoadError::Config {
                    field: field.into(),
                    reason: format!("unsupported dtype `{other}` (float32, float16, bfloat16)"),
                });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"{"model_type":"qwen2","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"intermediate_size":128,"vocab_size":1024,"max_position_embeddings":256,
        "rms_norm_eps":1e-6,"rope_theta":10000.0,"tie_word_embeddings":true,"torch_dtype":"float32",
        "bos_token_id":956,"eos_token_id":958}"#;

    fn with(field: &str, value: &str) -> String {
        let mut v: Value = serde_json::from_str(TINY).unwrap();
        v[field] = serde_json::from_str(value).unwrap();
        v.to_string()
    }

    fn field_of(err: LoadError) -> String {
        match err {
            LoadError::Config { field, .. } => field,
            other => panic!("expected a config error, got {other}"),
        }
    }

    #[test]
    fn parses_a_valid_config_and_derives_head_dim() {
        let c = ModelConfig::from_json_str(TINY).unwrap();
        assert_eq!((c.head_dim, c.num_key_value_heads, c.eos_token_ids.clone()), (16, 2, vec![958]));
        assert!(c.tie_word_embeddings);
    }

    #[test]
    fn eos_may_be_a_list() {
        let c = ModelConfig::from_json_str(&with("eos_token_id", "[958, 956]")).unwrap();
        assert_eq!(c.eos_token_ids, vec![958, 956]);
    }

    #[test]
    fn inconsistent_head_size_names_hidden_size() {
        let err = ModelConfig::from_json_str(&with("hidden_size", "66")).unwrap_err();
        assert_eq!(field_of(err), "hidden_size");
    }

    #[test]
    fn kv_heads_must_divide_heads() {
        for kv in ["3", "8", "0"] {
            let err = ModelConfig::from_json_str(&with("num_key_value_heads", kv)).unwrap_err();
            assert_eq!(field_of(err), "num_key_value_heads", "kv heads {kv}");
        }
    }

    #[test]
    fn zero_sizes_are_rejected_by_name() {
        for field in ["num_hidden_layers", "vocab_size", "max_position_embeddings", "intermediate_size"] {
            let err = ModelConfig::from_json_str(&with(field, "0")).unwrap_err();
            assert_eq!(field_of(err), field);
        }
    }

    #[test]
    fn wrong_types_name_the_field() {
        let err = ModelConfig::from_json_str(&with("num_attention_heads", "\"four\"")).unwrap_err();
        assert!(err.to_string().contains("num_attention_heads"), "{err}");
        let err = ModelConfig::from_json_str(&with("rope_theta", "[]")).unwrap_err();
        assert_eq!(field_of(err), "rope_theta");
        let err = ModelConfig::from_json_str(&with("torch_dtype", "\"int8\"")).unwrap_err();
        assert_eq!(field_of(err), "torch_dtype");
    }

    #[test]
    fn special_ids_must_be_in_the_vocabulary() {
        let err = ModelConfig::from_json_str(&with("eos_token_id", "151645")).unwrap_err();
        assert_eq!(field_of(err), "eos_token_id");
    }

    #[test]
    fn missing_required_field_is_named() {
        let mut v: Value = serde_json::from_str(TINY).unwrap();
        v.as_object_mut().unwrap().remove("vocab_size");
        let err = ModelConfig::from_json_str(&v.to_string()).unwrap_err();
        assert_eq!(field_of(err), "vocab_size");
    }

    #[test]
    fn transformers_5_layout_is_read() {
        let mut v: Value = serde_json::from_str(TINY).unwrap();
        let obj = v.as_object_mut().unwrap();
        obj.remove("rope_theta");
        obj.remove("torch_dtype");
        obj.insert("dtype".into(), "bfloat16".into());
        obj.insert("rope_parameters".into(), serde_json::json!({"rope_theta": 1e6, "rope_type": "default"}));
        let c = ModelConfig::from_json_str(&v.to_string()).unwrap();
        assert_eq!((c.rope_theta, c.torch_dtype), (1e6, Some(CheckpointDtype::Bf16)));
    }

    #[test]
    fn rope_scaling_is_refused_by_name() {
        let err = ModelConfig::from_json_str(&with("rope_scaling", r#"{"type":"yarn","factor":4.0}"#)).unwrap_err();
        assert_eq!(field_of(err), "rope_scaling");
        let err = ModelConfig::from_json_str(&with("rope_parameters", r#"{"rope_type":"yarn"}"#)).unwrap_err();
        assert_eq!(field_of(err), "rope_parameters.rope_type");
    }

    #[test]
    fn malformed_json_is_an_error() {
        assert!(matches!(ModelConfig::from_json_str("{\"hidden_size\": "), Err(LoadError::Json { .. })));
    }
}
