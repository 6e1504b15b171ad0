//! What to generate for a prompt: the engine's parameters of one choice.

use llaisys_model::{Guidance, SamplingParams};

use std::sync::Arc;

use crate::request::{ReasoningParsing, TextCallSpec, ToolParsing};

/// What to generate for each prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop strings: the text ends before the first one and never contains it.
    pub stop: Vec<String>,
    /// Extra stop token ids (the model's eos ids apply unless `ignore_eos`). Once checked
    /// (`ValidRequest::params`), every id that ends the choice, the model's included.
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// T3: the output's tool calls are parsed (by their tags' ids) and streamed as such.
    pub tool_calls: Option<ToolParsing>,
    /// T3 with `tool_choice: auto`: an answer that is a call written as text (a ```json fence
    /// or bare JSON) to one of these tools becomes a tool call.
    pub text_calls: Option<Arc<TextCallSpec>>,
    /// A reasoning model's thinking is split from the answer (chats of models with think tags).
    pub reasoning: Option<ReasoningParsing>,
    /// T1/T4: what the output must match (a compiled grammar: `Engine::guidance`,
    /// `Llm::guidance`); the default constrains nothing.
    pub guidance: Guidance,
    /// Speculative decoding for this request; `None`: the engine's default. The tokens are the
    /// same either way (greedy: identical; sampled: the same distribution).
    pub speculative: Option<bool>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 16,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            guidance: Guidance::default(),
            tool_calls: None,
            text_calls: None,
            reasoning: None,
            speculative: None,
        }
    }
}
