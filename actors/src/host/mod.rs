//! The host-app API: what a Rust program embedding llaisys uses, and the one request path the
//! HTTP server translates OpenAI JSON into (so the two can never disagree).
//!
//! - `builder`: `Engine::builder()` — model, dtype, device, engine config, request limits;
//! - `request`: `ChatRequest` and `CompletionRequest` with their `Options`;
//! - `frontend`: chat rendering, tokenization and defaults (`Frontend`), with `tools` (T3) and
//!   `validate`, the checks that make a `ValidRequest`, the only request the engine runs;
//! - `text`: a model's tokenizer, chat template and generation defaults (`ModelText`);
//! - `embed`: embedding requests (`EmbedRequest`), checked into a `ValidEmbed`;
//! - `rerank`: a yes/no reranker's judging prompts (`RerankRequest`), checked into a `ValidRerank`;
//! - `generation`: a running request as a `futures::Stream` of `Output`s, or its `Answer`
//!   (`answer`: one builder adds up every choice's events).

mod answer;
mod builder;
mod embed;
mod frontend;
mod generation;
mod params;
mod request;
mod rerank;
mod text;
mod tools;
mod validate;

pub use answer::{Answer, AnswerBuilder, Choice, TokenLogprob};
pub use builder::{BuildError, EngineBuilder};
pub use embed::{EmbedRequest, Embeddings, ValidEmbed};
pub use frontend::{Frontend, MAX_TOP_LOGPROBS, RequestLimits, SchedulingPolicy};
pub use generation::{Generation, Output};
pub use params::GenerateParams;
pub use request::{
    ChatRequest, CompletionRequest, GenerateRequest, Infill, Options, Prompt, Request, RequestError, Tool, ToolChoice,
};
pub use rerank::{DEFAULT_INSTRUCTION, RerankRequest, Reranker, Scores, ValidRerank, YesNo};
pub use text::{GenerationDefaults, ModelText};
pub use validate::{ValidChoice, ValidRequest};
