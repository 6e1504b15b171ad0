//! A request's whole answer, gathered from its choices' events: the one place that adds up text,
//! tokens, log-probabilities, tool calls, finish reasons and usage (each prompt's tokens counted
//! once however many choices it has). `Generation::answer`, the offline engine and the HTTP
//! server's JSON answers all gather through `AnswerBuilder`.

use crate::engine::{Event, Usage};
use crate::request::{FinishReason, ToolCallOut};

/// A token's log-probability and the most likely alternatives (when asked for).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
    /// A prompt token's rank in its row: 1 + how many tokens were more likely (vLLM's
    /// `prompt_logprobs`); not worked out for a generated token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// One choice's whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub text: String,
    /// A reasoning model's thinking (empty for others).
    pub reasoning: String,
    pub tokens: Vec<u32>,
    /// One entry per token when log-probabilities were asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// Where asked (`prompt_logprobs`): each prompt token's log-probability given the ones
    /// before it, from the second on.
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// `Error` also when the engine lost the choice without finishing it.
    pub finish: FinishReason,
    /// The stop string that ended it (`finish` is then `Stop`).
    pub stop: Option<String>,
    /// T3: the tool calls it made (their arguments exactly as streamed).
    pub tool_calls: Vec<ToolCallOut>,
}

/// A request's whole answer: every choice, and the token counts (each prompt counted once).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub choices: Vec<Choice>,
    pub usage: Usage,
}

impl Answer {
    /// The first choice's text.
    pub fn text(&self) -> &str {
        self.choices.first().map_or("", |c| c.text.as_str())
    }
}

/// Gathers the events of a request's choices (numbered prompt by prompt, `n` each) into its
/// `Answer`.
#[derive(Debug, Clone)]
pub struct AnswerBuilder {
    choices: Vec<Choice>,
    usage: Usage,
    /// Choices per prompt.
    n: usize,
    /// Keep each token's log-probabilities.
    logprobs: bool,
}

impl AnswerBuilder {
    /// `choices` in all; a choice that never finishes ends as `Error`.
    pub fn new(choices: usize, n: usize, logprobs: bool) -> Self {
        let empty = Choice {
            text: String::new(),
            reasoning: String::new(),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            finish: FinishReason::Error,
            stop: None,
            tool_calls: Vec::new(),
        };
        Self { choices: vec![empty; choices], usage: Usage::default(), n: n.max(1), logprobs }
    }

    /// Adds one event of choice `choice`.
    pub fn add(&mut self, choice: usize, event: Event) {
        let Some(c) = self.choices.get_mut(choice) else { return };
        match event {
            Event::Token { token, text, reasoning, logprob, top_logprobs, tool_calls, prompt_logprobs, .. } => {
                // Given again where the choice was started over.
                if !prompt_logprobs.is_empty() {
                    c.prompt_logprobs = prompt_logprobs;
                }
                c.text.push_str(&text);
                c.reasoning.push_str(&reasoning);
                for delta in &tool_calls {
                    ToolCallOut::gather(&mut c.tool_calls, delta);
                }
                c.tokens.push(token);
                // A request that asks for log-probabilities gets them with every token.
                if let (true, Some(logprob)) = (self.logprobs, logprob) {
                    c.logprobs.push(TokenLogprob { token, logprob, top: top_logprobs, rank: None });
                }
            }
            Event::Finished { reason, text, reasoning, usage, stop, .. } => {
                c.text.push_str(&text);
                c.reasoning.push_str(&reasoning);
                c.finish = reason;
                c.stop = stop;
                if choice.is_multiple_of(self.n) {
                    self.usage.prompt_tokens += usage.prompt_tokens;
                    self.usage.cached_tokens += usage.cached_tokens;
                }
                self.usage.completion_tokens += usage.completion_tokens;
            }
        }
    }

    /// The choices so far.
    pub fn choices(&self) -> &[Choice] {
        &self.choices
    }

    /// The token counts so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    pub fn finish(self) -> Answer {
        Answer { choices: self.choices, usage: self.usage }
    }
}
