//! The worker actor's messages.

use super::executor::Lane;
use crate::request::RequestId;
use crate::scheduler::StepPlan;

/// To the worker actor.
pub enum ToWorker {
    /// A new request's sampler and speculation state (sent before any step that samples for it).
    AddRequest(RequestId, Box<Lane>),
    /// A finished request's sampler and proposer state are no longer needed.
    RemoveRequest(RequestId),
    /// Run one step off the async threads; the result goes back as `ToScheduler::StepDone`.
    Execute(StepPlan),
}

impl ractor::Message for ToWorker {}
