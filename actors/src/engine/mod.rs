//! The actor system (E1): a scheduler actor per engine, a worker actor owning the model, a
//! request actor per request; `Engine` is the cloneable handle a host application holds.

mod api;
mod messages;
mod request_actor;
mod scheduler_actor;
mod worker_actor;

pub use api::{Engine, EngineStats, Event, EventStream, FinishCounts, GenerateRequest};
