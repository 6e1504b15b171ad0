//! llaisys-server: the OpenAI-compatible HTTP service over the engine (DESIGN.md S1–S6).
//!
//! - `batch.rs`: OpenAI's batch format (JSONL requests answered through the routes in process);
//! - `config.rs`: S6, `config/default.toml` overridden by a file, `LLAISYS_*` and flags;
//! - `http/`: the routes (S1) of every API dialect, SSE streaming (S2), errors (S3), protection (S4);
//! - `hub.rs`: models by name, through the Hugging Face hub and its cache;
//! - `metrics.rs`: S5, Prometheus text through the `metrics` facade;
//! - `serve.rs`: loads the model and starts a `Server` from a `Config`.

pub mod batch;
pub mod config;
pub mod http;
pub mod hub;
pub mod metrics;
pub mod serve;

pub use config::Config;
pub use http::Server;
pub use serve::{ServeError, builder, load_entry, start, start_models};
