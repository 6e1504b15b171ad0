//! A running request as one stream: the events of all its choices, merged as they come.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::{BoxStream, SelectAll, Stream, StreamExt};

use crate::engine::{Event, EventStream, Usage};
use crate::request::{FinishReason, RequestId, ToolCallOut};

/// One event of one choice (choices are numbered prompt by prompt: prompt `p`'s choice `c` is
/// `p * n + c`). Each choice yields its tokens, then exactly one `Event::Finished`.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub choice: usize,
    pub event: Event,
}

/// A token's log-probability and the most likely alternatives (when asked for).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// One choice's whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub text: String,
    pub tokens: Vec<u32>,
    /// One entry per token when log-probabilities were asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// `Error` also when the engine lost the choice without finishing it.
    pub finish: FinishReason,
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

/// A running request: a `Stream` of `Output`s. Dropping it cancels every unfinished choice.
pub struct Generation {
    ids: Vec<RequestId>,
    prompts: Vec<Vec<u32>>,
    n: usize,
    logprobs: bool,
    merged: SelectAll<BoxStream<'static, Output>>,
}

impl Generation {
    pub(crate) fn new(streams: Vec<EventStream>, prompts: Vec<Vec<u32>>, n: usize, logprobs: bool) -> Self {
        let ids = streams.iter().map(|s| s.id).collect();
        let merged = futures_util::stream::select_all(
            streams.into_iter().enumerate().map(|(choice, s)| s.map(move |event| Output { choice, event }).boxed()),
        );
        Self { ids, prompts, n, logprobs, merged }
    }

    /// The engine request id of each choice (for `Engine::cancel`).
    pub fn ids(&self) -> &[RequestId] {
        &self.ids
    }

    /// The prompts' token ids, as the model sees them.
    pub fn prompts(&self) -> &[Vec<u32>] {
        &self.prompts
    }

    /// Choices per prompt.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Runs to the end and gathers every choice.
    pub async fn answer(mut self) -> Answer {
        let mut choices: Vec<Choice> = (0..self.ids.len())
            .map(|_| Choice {
                text: String::new(),
                tokens: Vec::new(),
                logprobs: Vec::new(),
                finish: FinishReason::Error,
                tool_calls: Vec::new(),
            })
            .collect();
        let mut usage = Usage::default();
        while let Some(Output { choice, event }) = self.next().await {
            let c = &mut choices[choice];
            match event {
                Event::Token { token, text, logprob, top_logprobs, tool_call, .. } => {
                    c.text.push_str(&text);
                    if let Some(delta) = &tool_call {
                        ToolCallOut::gather(&mut c.tool_calls, delta);
                    }
                    c.tokens.push(token);
                    if self.logprobs {
                        c.logprobs.push(TokenLogprob { token, logprob, top: top_logprobs });
                    }
                }
                Event::Finished { reason, text, usage: u, .. } => {
                    c.text.push_str(&text);
                    c.finish = reason;
                    if choice % self.n == 0 {
                        usage.prompt_tokens += u.prompt_tokens;
                        usage.cached_tokens += u.cached_tokens;
                    }
                    usage.completion_tokens += u.completion_tokens;
                }
            }
        }
        Answer { choices, usage }
    }
}

impl Stream for Generation {
    type Item = Output;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Output>> {
        self.merged.poll_next_unpin(cx)
    }
}
