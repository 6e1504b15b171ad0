//! llaisys-actors: the engine over the model core (DESIGN.md E1–E10).
//!
//! - `engine/`: the actors (ractor) — scheduler, worker (forward pass on a blocking thread),
//!   one request actor per request — and `Engine`, the cloneable async handle (E1, E8, E9);
//! - `scheduler/`: the policy the scheduler actor owns: continuous batching with budgets, KV
//!   admission and preemption (E3, E4);
//! - `worker/`: the executor the worker actor owns: one step on the model, then sampling;
//! - `request/`: the request state machine (E2) and stop-string matching (E7);
//! - `llm.rs`: blocking offline generation over the same scheduler and executor (E9).
//!
//! Not built yet: prefix reuse (E5), sessions (E6), worker restart by a supervisor, routing
//! between several models (E10).

pub mod engine;
pub mod llm;
pub mod request;
pub mod scheduler;
pub mod worker;

pub use engine::{Engine, EngineStats, Event, EventStream, GenerateRequest};
pub use llm::{Completion, EngineConfig, EngineError, GenerateParams, Llm};
