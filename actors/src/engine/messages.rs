//! The typed messages between the actors.

use llaisys_model::{DecodeError, Sampled, Sampler};
use ractor::RpcReplyPort;
use tokio::sync::mpsc::UnboundedSender;

use super::api::{EngineStats, Event, GenerateRequest};
use crate::llm::EngineError;
use crate::request::{FinishReason, RequestId};
use crate::scheduler::StepPlan;

/// To the scheduler actor.
pub enum ToScheduler {
    /// Sent by `Engine::generate`: validate and queue a request whose events go to `events`.
    /// Replies with its id, or why it was refused.
    Submit {
        request: GenerateRequest,
        events: UnboundedSender<Event>,
        reply: RpcReplyPort<Result<RequestId, EngineError>>,
    },
    /// Sent by the worker when a step ran; carries what each plan item sampled.
    StepDone { plan: StepPlan, result: Result<Vec<Option<Sampled>>, DecodeError> },
    /// Sent by a request actor (a stop string matched, or its client went away) and by
    /// `Engine::cancel`: end the request at the next step. Replies whether it was known.
    Finish { id: RequestId, reason: FinishReason, reply: Option<RpcReplyPort<bool>> },
    /// Sent by `Engine::stats`.
    Stats(RpcReplyPort<EngineStats>),
    /// Sent by `Engine::shutdown`: refuse new requests; reply once every request has finished.
    Shutdown(RpcReplyPort<()>),
}

/// To the worker actor.
pub enum ToWorker {
    /// A new request's sampler (sent before any step that samples for it).
    AddRequest(RequestId, Box<Sampler>),
    /// A finished request's sampler is no longer needed.
    RemoveRequest(RequestId),
    /// Run one step off the async threads; the result goes back as `ToScheduler::StepDone`.
    Execute(StepPlan),
    /// Sent by `Engine::stats` through the scheduler: KV cells in use.
    KvUsed(RpcReplyPort<usize>),
}

/// To a request actor.
pub enum ToRequest {
    /// A token sampled for this request.
    Token(Sampled),
    /// The request ended; the actor sends its last events and stops.
    Finished { reason: FinishReason, completion_tokens: usize },
}
