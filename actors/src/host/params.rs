//! What to generate for a prompt: the engine's parameters of one choice.

use llaisys_model::vision::PromptImages;
use llaisys_model::{Guidance, SamplingParams};

use std::sync::Arc;

use crate::request::{HarmonyParsing, ReasoningParsing, TextCallSpec, ToolParsing};

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
    /// With `text_calls`: the guidance of the one second attempt made when the answer began
    /// as a call written as text that is not one (a tool not offered, arguments that do not
    /// fit it or that nothing in the conversation asked for). The held-back text is dropped
    /// and the answer generated again as text that cannot begin as JSON or a code fence, and
    /// calls nothing. `None`: such an answer is the text it was.
    pub text_retry: Option<Guidance>,
    /// A reasoning model's thinking is split from the answer (chats of models with think tags).
    pub reasoning: Option<ReasoningParsing>,
    /// A harmony model's messages (gpt-oss's chats) are split into its reasoning, its answer
    /// and its tool calls.
    pub harmony: Option<HarmonyParsing>,
    /// T1/T4: what the output must match (a compiled grammar: `Engine::guidance`,
    /// `Llm::guidance`); the default constrains nothing.
    pub guidance: Guidance,
    /// Speculative decoding for this request; `None`: the engine's default. The tokens are the
    /// same either way (greedy: identical; sampled: the same distribution).
    pub speculative: Option<bool>,
    /// After this long from the first token, the choice ends (finish `Length`) at its next
    /// token once its text has a line break: llama.cpp's `t_max_predict_ms`, for code
    /// completion, whose editor shows what came in time.
    pub time_limit: Option<std::time::Duration>,
    /// Scheduling priority (vLLM's `priority`): a lower value is served sooner. The engine's
    /// queue is ordered by it, then by arrival, and when the cache is short a less urgent
    /// sequence is preempted first, also to admit a more urgent one. 0 unless the server's
    /// `limits.scheduling_policy` is `priority`.
    pub priority: i32,
    /// The prompt's images (a chat's), where it has any: the worker encodes each once and gives
    /// its features in place of its tokens, each row turned by M-RoPE.
    pub images: Option<Arc<PromptImages>>,
}

impl GenerateParams {
    /// The parameters of the second attempt at an answer whose call written as text was
    /// rejected (`text_retry`), if there is one.
    pub fn retried(&self) -> Option<GenerateParams> {
        let guidance = self.text_retry.clone()?;
        Some(GenerateParams { guidance, tool_calls: None, text_calls: None, text_retry: None, ..self.clone() })
    }
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
            text_retry: None,
            reasoning: None,
            harmony: None,
            speculative: None,
            time_limit: None,
            priority: 0,
            images: None,
        }
    }
}
