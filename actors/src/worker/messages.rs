//! The worker actor's messages.

use llaisys_model::{DecodeError, Pooling};
use ractor::RpcReplyPort;

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
    /// Embed these inputs off the async threads (`Context::embeddings`); the result goes back
    /// to the caller.
    Embed { inputs: Vec<Vec<u32>>, pooling: Pooling, reply: RpcReplyPort<Result<Vec<Vec<f32>>, DecodeError>> },
}

impl ractor::Message for ToWorker {}
