//! The worker actor's messages.

use llaisys_model::{DecodeError, Readout};
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
    /// Read these inputs out (`Context::readouts`), in a pass between steps that other callers'
    /// inputs may share; the result goes back to the caller.
    Embed { inputs: Vec<Vec<u32>>, readout: Readout, reply: RpcReplyPort<Result<Vec<Vec<f32>>, DecodeError>> },
    /// Run the next pass of the queued read-outs off the async threads (the worker sends it to
    /// itself).
    ReadOut,
}

impl ractor::Message for ToWorker {}
