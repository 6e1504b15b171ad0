//! The scheduler actor's messages, and what a replica publishes about itself.

use std::sync::Arc;
use std::time::Duration;

use llaisys_model::{DecodeError, Readout};
use ractor::{ActorId, ActorRef, RpcReplyPort};
use tokio::sync::mpsc::UnboundedSender;

use super::policy::StepPlan;
use crate::engine::{EngineError, EngineStats, Event};
use crate::host::{GenerateParams, ValidChoice};
use crate::request::{FinishReason, RequestId, ToRequest};
use crate::session::SessionInfo;
use crate::worker::ItemOutput;

/// A checked choice on its way to a scheduler: its events go to `events`, its id (or why it
/// was refused) to `reply`.
pub struct Submission {
    pub choice: Box<ValidChoice>,
    pub events: UnboundedSender<Event>,
    pub reply: RpcReplyPort<Result<RequestId, EngineError>>,
}

/// To the scheduler actor.
pub enum ToScheduler {
    /// Sent by `Engine::submit`, or by the placer on its behalf: queue the checked choice.
    /// Replies with its id, or why it was refused (shutting down, no worker).
    Submit(Submission),
    /// Sent by the worker when a step ran; carries what each plan item produced, how long the
    /// step took, and the KV cells in use and the cache's bytes after it (what `Engine::stats`
    /// reports; the bytes move with a model's linear-attention states).
    StepDone {
        plan: StepPlan,
        result: Result<Vec<ItemOutput>, DecodeError>,
        elapsed: Duration,
        kv_used: usize,
        kv_bytes: usize,
    },
    /// Sent by a request actor (a stop string matched, or its client went away) and by
    /// `Engine::cancel`: end the request at the next step. Replies whether it was known.
    Finish { id: RequestId, reason: FinishReason, reply: Option<RpcReplyPort<bool>> },
    /// Sent by a request actor whose answer was a rejected call written as text: start the
    /// request over from its prompt with `params` (`GenerateParams::text_retry`), and answer
    /// `actor` with `ToRequest::Restarted`.
    Retry(Retry),
    /// Sent by `Engine::stats`.
    Stats(RpcReplyPort<EngineStats>),
    /// Sent by `Engine::shutdown`: refuse new requests; reply once every request has finished.
    Shutdown(RpcReplyPort<()>),
    /// Sent by `Engine::sessions`.
    Sessions(RpcReplyPort<Vec<SessionInfo>>),
    /// Sent by `Engine::delete_session`: stop the session and free its cells. Replies whether
    /// it existed.
    DeleteSession { id: String, reply: RpcReplyPort<bool> },
    /// Sent by `Engine::embed`: pool these inputs' final hidden states on the worker, between
    /// steps (a scratch cache: no cell is taken).
    Embed { inputs: Vec<Vec<u32>>, readout: Readout, reply: RpcReplyPort<Result<Vec<Vec<f32>>, EngineError>> },
    /// Sent by a session actor idle past the timeout: end it unless a request of it arrived
    /// meanwhile. `actor` tells a stale message from the session's current actor.
    SessionIdle { id: String, actor: ActorId },
}

/// A request actor's `ToScheduler::Retry`.
pub struct Retry {
    pub id: RequestId,
    pub params: Arc<GenerateParams>,
    pub actor: ActorRef<ToRequest>,
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

// With ractor's `cluster` feature (the cluster's wire messages, `crate::cluster::wire`) every
// message type says whether it crosses the network; the engine's own never do.
impl ractor::Message for ToScheduler {}
