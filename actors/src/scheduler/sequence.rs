//! A sequence as the scheduler sees it: its tokens, how many of them are in the KV cache, and
//! its state. Everything else (cells needed, whether it is prefilling) is derived.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llaisys_model::SeqId;
use llaisys_model::vision::PromptImages;

use crate::host::GenerateParams;
use crate::request::{FinishReason, RequestId, RequestState};
use crate::speculative::Acceptance;

#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: RequestId,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// What it generates and what ends it (`max_tokens`, `stop_token_ids`), checked: shared with
    /// the worker's sampler and the request's actor.
    pub params: Arc<GenerateParams>,
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
    /// Lengths at which the model keeps a copy of its linear-attention state
    /// (`PlanItem::checkpoint`, under `push_checkpoint`'s rule, as the KV cache does).
    pub(super) checkpoints: Vec<usize>,
    pub(super) queued_at: Instant,
    /// Time from arrival to first admission.
    pub(super) queue_time: Option<Duration>,
}

impl Sequence {
    /// Precondition: the prompt and parameters passed the `Frontend`'s checks (a `ValidChoice`).
    pub fn new(id: RequestId, prompt: Vec<u32>, params: Arc<GenerateParams>) -> Self {
        let prompt_len = prompt.len();
        debug_assert!(prompt_len > 0 && params.max_tokens > 0, "sequences come from checked requests");
        Self {
            id,
            tokens: prompt,
            prompt_len,
            params,
            state: RequestState::Waiting,
            session: None,
            speculation: None,
            seq: None,
            computed: 0,
            scheduled: 0,
            arrival: 0,
            cached_tokens: 0,
            checkpoints: Vec::new(),
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

    /// The prompt's images, where it has any.
    pub(super) fn images(&self) -> Option<&PromptImages> {
        self.params.images.as_deref()
    }

    /// Why the sequence is done after its last token, if it is; `max_len` caps its total length.
    pub(super) fn finish_reason(&self, max_len: usize) -> Option<FinishReason> {
        let last = *self.output().last()?;
        if self.params.stop_token_ids.contains(&last) {
            Some(FinishReason::Stop)
        } else if self.output().len() >= self.params.max_tokens || self.tokens.len() >= max_len {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}
