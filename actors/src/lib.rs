//! llaisys-actors: the engine over the model core (DESIGN.md E1–E10).
//!
//! Built so far, as plain synchronous state the actors will own:
//! - `request/`: the request state machine (E2) and stop-string matching (E7);
//! - `scheduler/`: continuous batching with budgets, KV admission and preemption (E3, E4);
//! - `worker/`: the executor that runs a step on the model and samples (E1's worker job);
//! - `llm.rs`: blocking offline generation over them (E9's `LLM::generate`).
//!
//! The scheduler / worker / request / session actors (ractor), cancellation through mailboxes,
//! prefix reuse, sessions and the async `Engine` handle come with the rest of the engine issue.

pub mod llm;
pub mod request;
pub mod scheduler;
pub mod worker;

pub use llm::{Completion, EngineConfig, EngineError, GenerateParams, Llm};
