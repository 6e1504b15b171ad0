//! A sequence as the scheduler sees it: its tokens, how many of them are in the KV cache, and
//! its state. Everything else (cells needed, whether it is prefilling) is derived.

use std::time::{Duration, Instant};

use llaisys_model::SeqId;

use crate::request::{FinishReason, RequestId, RequestState};
use crate::speculative::Acceptance;

/// Limits of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopConditions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generating one of these ends the request (eos ids, unless ignored, plus the request's own).
    pub stop_token_ids: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: RequestId,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub stop: StopConditions,
    pub state: RequestState,
    /// The session this request continues (E6): its cells stay pinned when it finishes.
    pub session: Option<String>,
    /// Set when the request speculates: how its proposals fared.
    pub speculation: Option<Acceptance>,
    /// The KV-cache sequence id while admitted.
    pub(super) seq: Option<SeqId>,
    /// Leading tokens whose keys and values are in the cache.
    pub(super) computed: usize,
    /// Tokens of the step in flight (accounted in the cache, not yet computed).
    pub(super) scheduled: usize,
    /// Order of arrival (fairness: oldest first).
    pub(super) arrival: u64,
    /// Prompt tokens found in the prefix cache when it was (last) admitted.
    pub(super) cached_tokens: usize,
    pub(super) queued_at: Instant,
    /// Time from arrival to first admission.
    pub(super) queue_time: Option<Duration>,
}

impl Sequence {
    pub fn new(id: RequestId, prompt: Vec<u32>, stop: StopConditions) -> Self {
        let prompt_len = prompt.len();
        Self {
            id,
            tokens: prompt,
            prompt_len,
            stop,
            state: RequestState::Waiting,
            session: None,
            speculation: None,
            seq: None,
            computed: 0,
            scheduled: 0,
            arrival: 0,
            cached_tokens: 0,
            queued_at: Instant::now(),
            queue_time: None,
        }
    }

    /// Makes the request part of a session.
    pub fn in_session(mut self, session: Option<String>) -> Self {
        self.session = session;
        self
    }

    /// Makes the request speculate (when the engine has a proposer).
    pub fn speculating(mut self, on: bool) -> Self {
        self.speculation = on.then(Acceptance::default);
        self
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Tokens still to put through the model (the whole rest of the prompt, or 1 when decoding).
    pub(super) fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Why the sequence is done after its last token, if it is; `max_len` caps its total length.
    pub(super) fn finish_reason(&self, max_len: usize) -> Option<FinishReason> {
        let last = *self.output().last()?;
        if self.stop.stop_token_ids.contains(&last) {
            Some(FinishReason::Stop)
        } else if self.output().len() >= self.stop.max_tokens || self.tokens.len() >= max_len {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}
