//! Speculative decoding: proposers guess the next tokens of a sequence, the worker verifies the
//! guesses in the normal step (every proposed token gets its logits row in the same forward
//! pass as everyone else's tokens) and keeps the ones sampling would have produced anyway.
//!
//! - `Proposer` is what a proposer does: up to `max` tokens to follow a sequence's history.
//!   `NgramProposer` looks the sequence's last tokens up in its own prompt and output (prompt
//!   lookup); `DraftModelProposer` runs a smaller model with the same vocabulary.
//! - `Acceptance` and `draft_len` are the policy the scheduler applies per sequence: how many
//!   tokens to ask for, from the measured acceptance rate and what a token costs in the step.
//!
//! Verification (in `worker::Executor`) samples the rows in order with the request's own
//! sampler and stops at the first sampled token that differs from the proposal. The output is
//! then exactly what sampling without speculation draws: position `j` is sampled from the same
//! distribution with the same random draw, and the proposal only decides how many positions one
//! forward pass covers. For greedy requests that is the tokens greedy decoding produces; for
//! sampled ones it is rejection sampling against a proposal that is one token for sure (accept
//! `d` with probability `p(d)`, else draw from `p` without `d`), so the distribution is
//! unchanged.

mod draft;
mod ngram;
mod policy;

pub use draft::DraftModelProposer;
pub use ngram::NgramProposer;
pub use policy::{Acceptance, draft_len};

use crate::request::RequestId;

/// One sequence's request for proposals.
#[derive(Debug)]
pub struct DraftSlot<'a> {
    pub id: RequestId,
    /// The prompt and every token generated so far; proposals continue it.
    pub history: &'a [u32],
    /// Most tokens to propose.
    pub max: usize,
    /// The proposal (at most `max` tokens), filled by the proposer.
    pub drafts: Vec<u32>,
}

/// Guesses the tokens that follow sequences' histories.
pub trait Proposer: Send {
    /// For metrics and logs (`ngram`, `draft`).
    fn name(&self) -> &'static str;
    /// Fills each slot's `drafts` with at most `max` tokens (none when it has no guess).
    fn propose(&mut self, slots: &mut [DraftSlot<'_>]);
    /// The request finished: forget what is kept for it.
    fn forget(&mut self, id: RequestId);
}

/// Speculation settings of an engine (`[speculative]` in the server's config, where
/// `default_on` is `default`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(default)]
pub struct SpeculativeConfig {
    /// Speculate for requests that do not say (a request's `speculative` field decides for it).
    #[serde(rename = "default")]
    pub default_on: bool,
    /// Most tokens proposed for one sequence in one step.
    pub max_draft: usize,
    /// Fit each sequence's proposals to its acceptance rate and the step's learnt cost (up to
    /// `max_draft`; none where they would not pay). Off: `max_draft` tokens every step, as
    /// vLLM's `num_speculative_tokens`, whatever they cost.
    pub adaptive: bool,
    /// Prompt lookup matches the last `ngram_max` down to `ngram_min` tokens.
    pub ngram_min: usize,
    pub ngram_max: usize,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self { default_on: false, max_draft: 8, adaptive: true, ngram_min: 2, ngram_max: 4 }
    }
}

impl SpeculativeConfig {
    /// Checks the settings; an error names the setting at fault (as the server's config
    /// spells it) and why.
    pub fn validate(&self) -> Result<(), SettingError> {
        if self.max_draft > 32 {
            return Err(SettingError {
                key: "speculative.max_draft",
                reason: format!("{} is more than 32", self.max_draft),
            });
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max || self.ngram_max > 16 {
            let reason = format!("{}..{} is not a range within 1..16", self.ngram_min, self.ngram_max);
            return Err(SettingError { key: "speculative.ngram_min/ngram_max", reason });
        }
        Ok(())
    }
}

/// A speculation setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SettingError {
    pub key: &'static str,
    pub reason: String,
}
