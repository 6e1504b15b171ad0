//! The worker (E1): the actor that owns one model context and its KV cache on a device, and
//! the executor that runs a step on it (one forward pass, then sampling and verifying proposed
//! tokens).

mod actor;
mod executor;
mod messages;
pub(crate) mod read_out;

pub(crate) use actor::{WorkerActor, WorkerArgs};
pub use executor::{Executor, ItemOutput, Lane, outcomes};
pub use messages::ToWorker;
