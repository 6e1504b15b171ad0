//! llaisys-actors: the actor engine over the model core (DESIGN.md E1–E10).
//!
//! Not built yet: the engine issue fills this crate with the scheduler, worker, request and
//! session actors and the embeddable `Engine` handle. Until then `llaisys generate` drives
//! `llaisys_model::Context` directly.
