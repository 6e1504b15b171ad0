//! The typed messages between the actors.

use std::time::Duration;

use llaisys_model::{DecodeError, Sampled};
use ractor::{ActorId, RpcReplyPort};
use tokio::sync::mpsc::UnboundedSender;

use super::api::{EngineStats, Event, GenerateRequest};
use super::session_actor::SessionInfo;
use crate::llm::EngineError;
use crate::request::{FinishReason, RequestId};
use crate::scheduler::StepPlan;
use crate::worker::{ItemOutput, Lane};

/// A request on its way to a scheduler: its events go to `events`, its id (or why it was
/// refused) to `reply`.
pub struct Submission {
    pub request: Box<GenerateRequest>,
    pub events: UnboundedSender<Event>,
    pub reply: RpcReplyPort<Result<RequestId, EngineError>>,
}

/// To the scheduler actor.
pub enum ToScheduler {
    /// Sent by `Engine::generate`, or by the placer on its behalf: validate and queue the
    /// request. Replies with its id, or why it was refused.
    Submit(Submission),
    /// Sent by the worker when a step ran; carries what each plan item produced and how long
    /// the step took.
    StepDone { plan: StepPlan, result: Result<Vec<ItemOutput>, DecodeError>, elapsed: Duration },
    /// Sent by a request actor (a stop string matched, or its client went away) and by
    /// `Engine::cancel`: end the request at the next step. Replies whether it was known.
    Finish { id: RequestId, reason: FinishReason, reply: Option<RpcReplyPort<bool>> },
    /// Sent by `Engine::stats`.
    Stats(RpcReplyPort<EngineStats>),
    /// Sent by `Engine::shutdown`: refuse new requests; reply once every request has finished.
    Shutdown(RpcReplyPort<()>),
    /// Sent by `Engine::sessions`.
    Sessions(RpcReplyPort<Vec<SessionInfo>>),
    /// Sent by `Engine::delete_session`: stop the session and free its cells. Replies whether
    /// it existed.
    DeleteSession { id: String, reply: RpcReplyPort<bool> },
    /// Sent by a session actor idle past the timeout: end it unless a request of it arrived
    /// meanwhile. `actor` tells a stale message from the session's current actor.
    SessionIdle { id: String, actor: ActorId },
}

/// To the placer actor (engines with several replicas).
pub enum ToPlacer {
    /// `Engine::generate`'s request: forwarded, reply port and all, as `ToScheduler::Submit`
    /// to the replica the placement policy picks.
    Submit(Submission),
    /// A deleted session's pin is dropped.
    ForgetSession(String),
}

/// What a replica's scheduler publishes after each message it handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplicaLoad {
    /// Requests running or waiting.
    pub held: usize,
    /// Submissions received so far (accepted or refused).
    pub received: u64,
    /// Whether it takes requests (not shutting down, its worker alive or restartable).
    pub available: bool,
}

/// To the worker actor.
pub enum ToWorker {
    /// A new request's sampler and speculation state (sent before any step that samples for it).
    AddRequest(RequestId, Box<Lane>),
    /// A finished request's sampler and proposer state are no longer needed.
    RemoveRequest(RequestId),
    /// Run one step off the async threads; the result goes back as `ToScheduler::StepDone`.
    Execute(StepPlan),
    /// Sent by `Engine::stats` through the scheduler: KV cells in use.
    KvUsed(RpcReplyPort<usize>),
}

/// To a session actor.
pub enum ToSession {
    /// A request of the session was queued.
    Begin,
    /// A request of the session finished.
    End,
    /// Sent by the scheduler for `Engine::sessions`, with what the session keeps cached.
    Info { cached_tokens: usize, reply: RpcReplyPort<SessionInfo> },
    /// The actor's own timer: check the idle time.
    Tick,
}

/// To a request actor.
pub enum ToRequest {
    /// A token sampled for this request.
    Token(Sampled),
    /// The request ended; the actor sends its last events and stops.
    Finished { reason: FinishReason, completion_tokens: usize, cached_tokens: usize, queue_time: Option<Duration> },
}

// With ractor's `cluster` feature (the cluster's wire messages, `crate::cluster::wire`) every
// message type says whether it crosses the network; these never do.
impl ractor::Message for ToScheduler {}
impl ractor::Message for ToPlacer {}
impl ractor::Message for ToWorker {}
impl ractor::Message for ToSession {}
impl ractor::Message for ToRequest {}
