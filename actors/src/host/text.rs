//! A model's text side: its tokenizer, chat template and generation defaults, and the grammar
//! compiler over its vocabulary (built by the first constrained request).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use llaisys_model::adapter::Lora;
use llaisys_model::tokenizer::{ChatTemplate, FimTokens};
use llaisys_model::{FileSummary, GrammarCompiler, GrammarError, ModelInfo, Tokenizer};

use super::rerank::YesNo;
use crate::request::{HarmonyTags, ReasoningTags};

/// Sampling defaults from a model's `generation_config.json`, used where a request leaves a
/// field out; OpenAI's defaults otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub min_p: f32,
    pub repetition_penalty: f32,
    /// Extra end-of-sequence ids the generation config lists.
    pub eos_token_ids: Vec<u32>,
}

impl Default for GenerationDefaults {
    fn default() -> Self {
        Self { temperature: 1.0, top_p: 1.0, top_k: None, min_p: 0.0, repetition_penalty: 1.0, eos_token_ids: vec![] }
    }
}

impl GenerationDefaults {
    /// Reads a `generation_config.json`; an unreadable file changes nothing.
    pub fn from_file(path: &Path) -> Self {
        let mut d = Self::default();
        let Ok(text) = std::fs::read_to_string(path) else { return d };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else { return d };
        let num = |k: &str| json.get(k).and_then(serde_json::Value::as_f64).map(|v| v as f32);
        if let Some(t) = num("temperature") {
            d.temperature = t;
        }
        if let Some(p) = num("top_p") {
            d.top_p = p;
        }
        if let Some(k) = json.get("top_k").and_then(serde_json::Value::as_u64).filter(|k| *k > 0) {
            d.top_k = Some(k as usize);
        }
        if let Some(m) = num("min_p") {
            d.min_p = m;
        }
        if let Some(r) = num("repetition_penalty") {
            d.repetition_penalty = r;
        }
        d.eos_token_ids = match json.get("eos_token_id") {
            Some(serde_json::Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_u64()).map(|n| n as u32).collect(),
            _ => vec![],
        };
        d
    }
}

/// The tokenizer, chat template and generation defaults of a model, and what its files are.
pub struct ModelText {
    /// Shared with the scheduler actors, which decode the generated text.
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) template: Option<ChatTemplate>,
    pub(crate) defaults: GenerationDefaults,
    /// A reasoning model's think tags (`<think>` and `</think>`, or Magistral's `[THINK]` and
    /// `[/THINK]`: single tokens of its vocabulary): its chats' thinking is split from the answer.
    pub(crate) reasoning: Option<ReasoningTags>,
    /// A harmony model's tags (gpt-oss's `<|start|>`, `<|channel|>`, `<|message|>`, ...: single
    /// tokens of its vocabulary): its chats' messages are split by channel.
    pub(crate) harmony: Option<HarmonyTags>,
    /// A code model's fill-in-the-middle tokens (`Prompt::Infill` needs them).
    pub(crate) fim: Option<FimTokens>,
    /// A yes/no reranker's tokens (`Reranker` decides at build).
    pub(crate) judge: Option<YesNo>,
    /// What the weight files are (format, size, parameters, quantization), when read.
    pub(crate) files: Option<FileSummary>,
    /// The LoRA adapters merged into its weights at load, in order.
    pub(crate) adapters: Vec<Lora>,
    /// T1: the model's grammar compiler, built by the first constrained request.
    grammar: OnceLock<Result<Arc<GrammarCompiler>, GrammarError>>,
}

impl ModelText {
    pub fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>, defaults: GenerationDefaults) -> Self {
        let tag = |text: &str| match tokenizer.encode(text).ok()?[..] {
            [id] => Some(id),
            _ => None,
        };
        let pair = |open, close| tag(open).zip(tag(close));
        let reasoning = pair("<think>", "</think>")
            .or_else(|| pair("[THINK]", "[/THINK]"))
            .map(|(open, close)| ReasoningTags { open, close });
        let harmony = HarmonyTags::find(tag);
        let fim = FimTokens::of(&tokenizer);
        Self {
            tokenizer: Arc::new(tokenizer),
            template,
            defaults,
            reasoning,
            harmony,
            fim,
            judge: None,
            files: None,
            adapters: Vec::new(),
            grammar: OnceLock::new(),
        }
    }

    /// A tokenizer alone: no chat template, OpenAI's sampling defaults.
    pub fn plain(tokenizer: Tokenizer) -> Self {
        Self::new(tokenizer, None, GenerationDefaults::default())
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn defaults(&self) -> &GenerationDefaults {
        &self.defaults
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// The weight files' format, size, parameters and quantization (what model lists show).
    pub fn files(&self) -> Option<&FileSummary> {
        self.files.as_ref()
    }

    /// The LoRA adapters merged into the weights at load (their paths and scales), in order.
    pub fn adapters(&self) -> &[Lora] {
        &self.adapters
    }

    /// A yes/no reranker: it scores documents itself (`Engine::rerank`).
    pub fn judges(&self) -> bool {
        self.judge.is_some()
    }

    /// A reasoning model: its chats' thinking is split from the answer.
    pub fn thinks(&self) -> bool {
        self.reasoning.is_some()
    }

    /// The grammar compiler over the vocabulary, padded to the logits' width (`info`); the
    /// tokens that end a sequence are the model's and its generation config's eos ids.
    pub(crate) fn grammar_compiler(&self, info: &ModelInfo) -> Result<Arc<GrammarCompiler>, GrammarError> {
        self.grammar
            .get_or_init(|| {
                let mut eos = info.eos_token_ids.clone();
                eos.extend(self.defaults.eos_token_ids.iter().filter(|t| !info.eos_token_ids.contains(t)));
                let start = std::time::Instant::now();
                let compiler = GrammarCompiler::new(&self.tokenizer, info.vocab_size, &eos).map(Arc::new);
                tracing::info!(elapsed_ms = start.elapsed().as_millis() as u64, "grammar compiler built");
                compiler
            })
            .clone()
    }
}
