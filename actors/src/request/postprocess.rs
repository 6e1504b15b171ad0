//! One choice's output as its client sees it: sampled tokens in, events out. Text is decoded
//! incrementally (never half a character), cut before the first stop string (never any part of
//! it), tool calls split off into their own pieces; the last event carries the text held back,
//! the finish reason (`tool_calls` when the answer called tools, `stop` when a stop string cut
//! it) and the token counts. The request actor and the offline engine both run their choices
//! through it.

use std::sync::Arc;
use std::time::Duration;

use llaisys_model::tokenizer::TokenizerError;
use llaisys_model::{Sampled, Tokenizer};

use super::{FinishReason, TextStream, ToolParsing};
use crate::engine::{Event, Usage};
use crate::host::GenerateParams;

pub struct Postprocess {
    /// Absent for an engine without a tokenizer: events then carry tokens and no text.
    tokenizer: Option<Arc<Tokenizer>>,
    text: TextStream,
    tool_calls: Option<ToolParsing>,
    prompt_tokens: usize,
    /// Tokens received so far.
    received: usize,
    /// How many tokens there were when a stop string ended the text: later ones (sampled before
    /// the engine heard, or accepted proposals of the same step) are not part of the output.
    stopped_after: Option<usize>,
    /// No more events but the finish: a stop string matched, or `close` was called.
    closed: bool,
}

impl Postprocess {
    pub fn new(prompt_tokens: usize, params: &GenerateParams, tokenizer: Option<Arc<Tokenizer>>) -> Self {
        let text = TextStream::new(params.stop.iter().cloned())
            .with_reasoning(params.reasoning)
            .with_tool_calls(params.tool_calls.map(|t| t.tags))
            .with_text_calls(params.text_calls.clone());
        Self {
            tokenizer,
            text,
            tool_calls: params.tool_calls,
            prompt_tokens,
            received: 0,
            stopped_after: None,
            closed: false,
        }
    }

    /// The event of a sampled token; `None` once the output has ended. After the token that
    /// completes a stop string, `stopped()` is true and the engine should end the sequence.
    pub fn token(&mut self, sampled: Sampled) -> Result<Option<Event>, TokenizerError> {
        self.received += 1;
        if self.closed {
            return Ok(None);
        }
        let piece = match &self.tokenizer {
            Some(tokenizer) => self.text.push(tokenizer, sampled.token)?,
            None => Default::default(),
        };
        if self.text.stopped() {
            self.stopped_after = Some(self.received);
            self.closed = true;
        }
        Ok(Some(Event::Token {
            token: sampled.token,
            text: piece.text,
            reasoning: piece.reasoning,
            logprob: sampled.logprob,
            top_logprobs: sampled.top,
            mask_time: sampled.mask_time,
            tool_call: piece.tool_call,
        }))
    }

    /// Whether a stop string has ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped_after.is_some()
    }

    /// No more token events (the client went away, or the output failed): the finish carries
    /// no held-back text.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// The last event of a choice the engine ended for `reason` after `completion_tokens`.
    pub fn finish(
        &mut self,
        reason: FinishReason,
        completion_tokens: usize,
        cached_tokens: usize,
        queue_time: Option<Duration>,
    ) -> Result<Event, TokenizerError> {
        let tail = match &self.tokenizer {
            Some(tokenizer) if !self.closed => self.text.finish(tokenizer)?,
            _ => Default::default(),
        };
        self.closed = true;
        // A stop string ends the output with `stop`, even if the engine ended it otherwise in
        // the same step.
        let reason = if self.stopped() { FinishReason::Stop } else { reason };
        let reason = ToolParsing::finish(self.tool_calls, reason, self.text.made_tool_calls());
        let completion_tokens = completion_tokens.min(self.stopped_after.unwrap_or(usize::MAX));
        let usage = Usage { prompt_tokens: self.prompt_tokens, completion_tokens, cached_tokens };
        Ok(Event::Finished { reason, text: tail.text, reasoning: tail.reasoning, usage, queue_time })
    }
}
