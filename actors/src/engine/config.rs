//! The engine's sizes and budgets, defined once: the server's `[engine]` section deserialises
//! into `EngineConfig` and its `[speculative]` section into `SpeculativeConfig`; the scheduler's
//! policy reads them as they are.

use std::time::Duration;

use llaisys_model::{Context, KvDtype, LanguageModel};

use crate::speculative::{DraftModelProposer, NgramProposer, Proposer, SpeculativeConfig};

/// Sizes and budgets of one engine (`[engine]` in the server's config, where the idle timeout
/// is `session_idle_timeout_secs`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// KV cache cells (tokens across all sequences).
    pub kv_capacity: usize,
    /// The KV cache's element type (`"f32"`, `"f16"`, `"bf16"`; `"auto"` or absent: the
    /// device's default, f16 on the CPU).
    #[serde(deserialize_with = "kv_dtype")]
    pub kv_dtype: Option<KvDtype>,
    pub max_seqs_per_step: usize,
    pub max_tokens_per_step: usize,
    /// Most prompt tokens in a step that also decodes (bounds the decoding sequences'
    /// inter-token gap while prompts are prefilled).
    pub max_prefill_tokens_while_decoding: usize,
    /// A step that decodes takes at most this many times a decode-only step: its prefill is
    /// sized from the step cost learnt as the engine runs (0: only the token bound).
    pub prefill_step_factor: f64,
    /// Reuse the cells of finished requests for later prompts with the same prefix (E5).
    pub prefix_caching: bool,
    /// For a model with linear attention (Qwen3.5): the most MiB the finished sequences kept for
    /// reuse (sessions' included) may hold in states and their checkpoints (up to
    /// `MAX_CHECKPOINTS` a sequence), in host memory besides their cells; the least recently used
    /// go first.
    pub cached_state_mb: usize,
    /// A session with no request for this long is ended and its cells freed (E6).
    #[serde(rename = "session_idle_timeout_secs", deserialize_with = "seconds")]
    pub session_idle_timeout: Duration,
    /// Speculative decoding: who speculates and how far (its own section in the config).
    #[serde(skip)]
    pub speculative: SpeculativeConfig,
}

fn kv_dtype<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<KvDtype>, D::Error> {
    KvDtype::parse_setting(&<String as serde::Deserialize>::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    <u64 as serde::Deserialize>::deserialize(d).map(Duration::from_secs)
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            kv_capacity: 8192,
            kv_dtype: None,
            max_seqs_per_step: 32,
            max_tokens_per_step: 512,
            max_prefill_tokens_while_decoding: 256,
            prefill_step_factor: 2.0,
            prefix_caching: true,
            cached_state_mb: 2048,
            session_idle_timeout: Duration::from_secs(600),
            speculative: SpeculativeConfig::default(),
        }
    }
}

impl EngineConfig {
    /// A context over `model` with this engine's KV cache.
    pub fn context(&self, model: Box<dyn LanguageModel>) -> Context {
        let dtype = self.kv_dtype.unwrap_or_else(|| KvDtype::default_for(model.device()));
        Context::with_kv_dtype(model, self.kv_capacity, dtype)
    }

    /// The proposer of an engine with these settings: the draft model when one is given,
    /// otherwise prompt lookup (n-grams). It exists even when no request speculates by default,
    /// for the requests that ask.
    pub fn proposer(&self, draft: Option<Box<dyn LanguageModel>>, vocab: usize) -> Box<dyn Proposer> {
        let s = &self.speculative;
        match draft {
            Some(model) => Box::new(DraftModelProposer::new(model, self.kv_capacity, vocab)),
            None => Box::new(NgramProposer::new(s.ngram_min, s.ngram_max)),
        }
    }
}
