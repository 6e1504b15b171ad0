//! The host-app API: what a Rust program embedding llaisys uses, and the one request path the
//! HTTP server translates OpenAI JSON into (so the two can never disagree).
//!
//! - `builder`: `Engine::builder()` — model, dtype, device, engine config, request limits;
//! - `request`: `ChatRequest` and `CompletionRequest` with their `Options`;
//! - `frontend`: chat rendering, tokenization, defaults and validation (`Frontend`);
//! - `generation`: a running request as a `futures::Stream` of `Output`s, or its `Answer`.

mod builder;
mod frontend;
mod generation;
mod params;
mod request;

pub use builder::{BuildError, EngineBuilder};
pub use frontend::{Frontend, GenerationDefaults, MAX_TOP_LOGPROBS, Prepared, RequestLimits};
pub use generation::{Answer, Choice, Generation, Output, TokenLogprob};
pub use params::GenerateParams;
pub use request::{
    ChatRequest, CompletionRequest, GenerateRequest, Options, Prompt, Request, RequestError, Tool, ToolChoice,
};
