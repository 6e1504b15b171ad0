//! The engine as a host holds it (E9, E10): `Engine`, the cloneable handle over the actors of
//! one model (a scheduler and worker per replica, a placer when there are several, or a cluster
//! front's router), what a request yields (`Event`, `EventStream`), the engine's figures, its
//! configuration and errors, and `Router`, engines by model name.

mod api;
mod config;
mod error;
mod event;
mod router;
mod stats;

pub use api::{Engine, ModelLoader, ReplicaSpec};
pub use config::EngineConfig;
pub use error::{EngineError, NodeFailure, WorkerLoss};
pub use event::{Event, EventStream, Usage};
pub use router::Router;
pub use stats::{EngineStats, FinishCounts, LOCAL_NODE, ReplicaStats, SpeculativeStats};
