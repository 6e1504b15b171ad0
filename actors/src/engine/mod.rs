//! The actor system (E1): a scheduler actor per engine (which also supervises the worker), a
//! worker actor owning the model, a request actor per request, a session actor per session;
//! `Engine` is the cloneable handle a host application holds, `Router` picks an engine by model
//! name (E10).

mod api;
mod messages;
mod request_actor;
mod router;
mod scheduler_actor;
mod session_actor;
mod worker_actor;

pub use api::{
    Engine, EngineStats, Event, EventStream, FinishCounts, GenerateRequest, ModelLoader, SpeculativeStats, Usage,
};
pub use router::Router;
pub use session_actor::SessionInfo;
