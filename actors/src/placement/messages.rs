//! The placer actor's messages.

use crate::scheduler::Submission;

/// To the placer actor (engines with several replicas).
pub enum ToPlacer {
    /// `Engine::generate`'s request: forwarded, reply port and all, as `ToScheduler::Submit`
    /// to the replica the placement policy picks.
    Submit(Submission),
    /// A deleted session's pin is dropped.
    ForgetSession(String),
}

impl ractor::Message for ToPlacer {}
