//! The actor system (E1): a scheduler actor per replica (which also supervises its worker), a
//! worker actor owning the model and its KV cache on one device, a placer actor choosing the
//! replica of each request when there are several (D2), a request actor per request, a session actor per session;
//! `Engine` is the cloneable handle a host application holds, `Router` picks an engine by model
//! name (E10).

mod api;
mod messages;
mod placer_actor;
mod request_actor;
mod router;
mod scheduler_actor;
mod session_actor;
mod worker_actor;

pub use api::{
    Engine, EngineStats, Event, EventStream, FinishCounts, GenerateRequest, LOCAL_NODE, ModelLoader, ModelText,
    ReplicaSpec, ReplicaStats, SpeculativeStats, Usage,
};
pub(crate) use messages::Submission;
pub use router::Router;
pub use session_actor::SessionInfo;
