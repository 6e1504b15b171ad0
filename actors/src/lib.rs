//! llaisys-actors: the engine over the model core (DESIGN.md E1–E10).
//!
//! - `engine/`: the actors (ractor) — scheduler (also the worker's supervisor), worker (forward
//!   pass on a blocking thread), one request actor per request, one session actor per session —
//!   `Engine`, the cloneable async handle (E1, E6, E8, E9), and `Router` (E10);
//! - `scheduler/`: the policy the scheduler actor owns: continuous batching with budgets, KV
//!   admission and preemption, prefix reuse and session pins (E3–E6);
//! - `worker/`: the executor the worker actor owns: one step on the model, then sampling;
//! - `request/`: the request state machine (E2) and stop-string matching (E7);
//! - `llm.rs`: blocking offline generation over the same scheduler and executor (E9).

pub mod engine;
pub mod llm;
pub mod request;
pub mod scheduler;
pub mod worker;

pub use engine::{Engine, EngineStats, Event, EventStream, GenerateRequest, ModelLoader, Router, SessionInfo, Usage};
pub use llm::{Completion, EngineConfig, EngineError, GenerateParams, Llm};
