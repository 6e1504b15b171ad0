//! The request actor's messages.

use std::time::Duration;

use llaisys_model::Sampled;

use super::FinishReason;
use crate::host::TokenLogprob;

/// To a request actor.
pub enum ToRequest {
    /// A token sampled for this request.
    Token(Sampled),
    /// Its prompt's log-probabilities (where asked), before its first token.
    PromptLogprobs(Vec<TokenLogprob>),
    /// The answer to the actor's `ToScheduler::Retry`: whether the request was started over
    /// (every token before this message is the first attempt's), or had already ended.
    Restarted(bool),
    /// The request ended; the actor sends its last events and stops.
    Finished { reason: FinishReason, completion_tokens: usize, cached_tokens: usize, queue_time: Option<Duration> },
}

impl ractor::Message for ToRequest {}
