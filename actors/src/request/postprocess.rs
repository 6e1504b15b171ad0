//! One choice's output as its client sees it: sampled tokens in, events out. Text is decoded
//! incrementally (never half a character), cut before the first stop string (never any part of
//! it), tool calls split off into their own pieces; the last event carries the text held back,
//! the finish reason (`tool_calls` when the answer called tools, `stop` when a stop string cut
//! it) and the token counts. The request actor and the offline engine both run their choices
//! through it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llaisys_model::tokenizer::TokenizerError;
use llaisys_model::{Sampled, Tokenizer};

use super::{FinishReason, TextStream, ToolParsing};
use crate::engine::{Event, Usage};
use crate::host::{GenerateParams, TokenLogprob};

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
    /// The parameters of a second attempt after a rejected call written as text
    /// (`GenerateParams::text_retry`), until it is made.
    retry: Option<Arc<GenerateParams>>,
    /// The rejected call's text while its second attempt is being started.
    rejected: Option<String>,
    /// Token events held back with their text: while a call written as text is undecided,
    /// and after it was rejected until the answer is started over (then they are dropped, so
    /// the client sees nothing of the first attempt: no text, tokens or log-probabilities).
    held: Vec<Event>,
    /// The prompt's log-probabilities (where asked), until the next token's event carries them.
    prompt_logprobs: Vec<TokenLogprob>,
    /// `GenerateParams::time_limit`, from when the first token came.
    time_limit: Option<Duration>,
    first_token: Option<Instant>,
    /// The text (or reasoning) let out so far has a line break.
    new_line: bool,
}

impl Postprocess {
    pub fn new(prompt_tokens: usize, params: &GenerateParams, tokenizer: Option<Arc<Tokenizer>>) -> Self {
        let text = TextStream::new(params.stop.iter().cloned())
            .with_reasoning(params.reasoning)
            .with_harmony(params.harmony)
            .with_tool_calls(params.tool_calls.as_ref())
            .with_text_calls(params.text_calls.clone(), params.text_retry.is_some());
        Self {
            tokenizer,
            text,
            tool_calls: params.tool_calls.clone(),
            prompt_tokens,
            received: 0,
            stopped_after: None,
            closed: false,
            retry: params.retried().map(Arc::new),
            rejected: None,
            prompt_logprobs: Vec::new(),
            time_limit: params.time_limit,
            first_token: None,
            new_line: false,
            held: Vec::new(),
        }
    }

    /// After a token: when the answer so far was a call written as text that was rejected
    /// (kept back, never shown), the parameters to generate it again with. The owner restarts
    /// the choice from its prompt with them and calls `restarted`, or, if the choice has
    /// ended, `not_restarted`. Once per choice.
    pub fn retry(&mut self) -> Option<Arc<GenerateParams>> {
        self.rejected.as_ref()?;
        self.retry.take()
    }

    /// The choice was restarted with `params` (from `retry`): the output starts over.
    pub fn restarted(&mut self, params: &GenerateParams) {
        *self = Self::new(self.prompt_tokens, params, self.tokenizer.take());
    }

    /// The choice could not be restarted: the rejected call's text comes out after all, with
    /// the next events.
    pub fn not_restarted(&mut self) {
        if let Some(text) = self.rejected.take() {
            self.text.give_back(text);
        }
    }

    /// The prompt tokens' log-probabilities (`SamplingParams::prompt_logprobs`), computed with
    /// the prompt: the next token's event carries them.
    pub fn prompt_logprobs(&mut self, logprobs: Vec<TokenLogprob>) {
        self.prompt_logprobs = logprobs;
    }

    /// The events a sampled token lets out: its own, after any held back; none once the
    /// output has ended, or while an answer written as a call is undecided. After the token
    /// that completes a stop string, `stopped()` is true and the engine should end the
    /// sequence.
    pub fn token(&mut self, sampled: Sampled) -> Result<Vec<Event>, TokenizerError> {
        self.received += 1;
        self.first_token.get_or_insert_with(Instant::now);
        if self.closed {
            return Ok(Vec::new());
        }
        let piece = match &self.tokenizer {
            Some(tokenizer) => self.text.push(tokenizer, sampled.token)?,
            None => Default::default(),
        };
        if self.text.stopped() {
            self.stopped_after = Some(self.received);
            self.closed = true;
        }
        self.new_line |= piece.text.contains('\n') || piece.reasoning.contains('\n');
        self.held.push(Event::Token {
            token: sampled.token,
            text: piece.text,
            reasoning: piece.reasoning,
            logprob: sampled.logprob,
            top_logprobs: sampled.top,
            mask_time: sampled.mask_time,
            tool_calls: piece.tool_calls,
            prompt_logprobs: std::mem::take(&mut self.prompt_logprobs),
        });
        if let Some(text) = self.text.take_rejected() {
            self.rejected = Some(text);
        }
        if self.text.undecided() || self.rejected.is_some() {
            return Ok(Vec::new());
        }
        Ok(std::mem::take(&mut self.held))
    }

    /// Whether a stop string has ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped_after.is_some()
    }

    /// Whether the time limit has passed since the first token and the text has a line break:
    /// the engine should end the sequence (as at its length limit).
    pub fn out_of_time(&self) -> bool {
        let limit = self.time_limit.zip(self.first_token);
        self.new_line && limit.is_some_and(|(limit, first)| first.elapsed() >= limit)
    }

    /// No more token events (the client went away, or the output failed): the finish carries
    /// no held-back text.
    pub fn close(&mut self) {
        self.closed = true;
        self.held.clear();
    }

    /// The last events of a choice the engine ended for `reason` after `completion_tokens`:
    /// any held back, then the finish.
    pub fn finish(
        &mut self,
        reason: FinishReason,
        completion_tokens: usize,
        cached_tokens: usize,
        queue_time: Option<Duration>,
    ) -> Result<Vec<Event>, TokenizerError> {
        self.not_restarted();
        let mut tail = match &self.tokenizer {
            Some(tokenizer) if !self.closed => self.text.finish(tokenizer)?,
            _ => Default::default(),
        };
        // A call decided at the end goes with the last of the answer's tokens, held back while
        // it was undecided.
        if !tail.tool_calls.is_empty() {
            let last = self.held.iter_mut().rev().find_map(|e| match e {
                Event::Token { tool_calls, .. } => Some(tool_calls),
                _ => None,
            });
            debug_assert!(last.is_some(), "an undecided answer's tokens are held back");
            if let Some(slot) = last {
                slot.append(&mut tail.tool_calls);
            }
        }
        self.closed = true;
        // A stop string ends the output with `stop`, even if the engine ended it otherwise in
        // the same step.
        let reason = if self.stopped() { FinishReason::Stop } else { reason };
        let reason = ToolParsing::finish(self.tool_calls.as_ref(), reason, self.text.made_tool_calls());
        let completion_tokens = completion_tokens.min(self.stopped_after.unwrap_or(usize::MAX));
        let usage = Usage { prompt_tokens: self.prompt_tokens, completion_tokens, cached_tokens };
        let mut events = std::mem::take(&mut self.held);
        let stop = self.text.stop_string().filter(|_| reason == FinishReason::Stop).map(String::from);
        events.push(Event::Finished { reason, text: tail.text, reasoning: tail.reasoning, usage, queue_time, stop });
        Ok(events)
    }
}
