//! llaisys-actors: the actor engine over the model core (DESIGN.md E1–E10).
//!
//! Built so far: the pieces of a request that need no actor — its state machine (E2) and its
//! stop-string matching (E7). The scheduler, worker, request and session actors and the
//! embeddable `Engine` handle come with the rest of the engine issue; until then
//! `llaisys generate` drives `llaisys_model::Context` directly.

pub mod request;
