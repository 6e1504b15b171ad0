//! The seam between the engine and the API dialects (OpenAI chat and completions, OpenAI
//! Responses, Anthropic Messages, Ollama): a dialect turns its request into the engine's
//! `ChatRequest` (or `CompletionRequest`) and the engine's steps back into its own JSON. One
//! path runs them all: `run` validates, admits, counts and starts the generation, which
//! answers with the dialect's body or streams the dialect's frames.

use std::sync::Arc;

use axum::response::Response;
use llaisys_actors::{ChatRequest, CompletionRequest, ToolChoice};
use serde_json::Value;

use super::error::{ApiError, ErrorShape};
use super::generation::{Generation, Step};
use super::{AppState, Body413, ModelEntry, with_model};

/// How a stream travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Server-sent events (OpenAI, Anthropic).
    Sse,
    /// One JSON object per line (Ollama).
    NdJson,
}

/// One message of a stream: an SSE event (with its `event:` name where the dialect names
/// them) or an NDJSON line.
#[derive(Debug, Clone)]
pub struct Frame {
    pub event: Option<&'static str>,
    pub data: String,
}

impl Frame {
    pub fn data(value: &Value) -> Self {
        Self { event: None, data: value.to_string() }
    }

    pub fn named(event: &'static str, value: &Value) -> Self {
        Self { event: Some(event), data: value.to_string() }
    }
}

/// A dialect's side of a generation: its answer as one body, or as frames while it streams.
/// Each method sees the generation as it stands (the answer so far, usage, ids).
pub trait Dialect: Send + 'static {
    /// How this dialect's errors look.
    const SHAPE: ErrorShape;
    /// How its streams travel.
    const TRANSPORT: Transport = Transport::Sse;

    /// The whole answer (every choice finished without an engine error).
    fn body(&mut self, g: &Generation) -> Value;
    /// The frames that open a stream.
    fn open(&mut self, g: &Generation) -> Vec<Frame>;
    /// The frames of one step of one choice (text, reasoning, a tool-call piece, its finish;
    /// a finish of `FinishReason::Error` is the dialect's to report).
    fn step(&mut self, g: &Generation, step: &Step) -> Vec<Frame>;
    /// The frames that close a stream once every choice has finished.
    fn close(&mut self, g: &Generation) -> Vec<Frame>;
}

/// What a dialect asks of the engine.
pub enum Work {
    Chat(ChatRequest),
    Completion(CompletionRequest),
}

/// How to run a dialect's request.
pub struct Run<'a> {
    pub state: &'a Arc<AppState>,
    pub request_id: &'a str,
    pub model: Arc<ModelEntry>,
    pub stream: bool,
    /// The request's own name for the engine's `constraint` (`response_format`, `format`, ...),
    /// so the engine's refusals name the field the client sent.
    pub constraint_field: Option<&'static str>,
    /// Completions with `echo`: the prompt's text leads each choice.
    pub echo: bool,
}

impl Run<'_> {
    /// Validates the work, admits it, counts it, and answers (or streams) in `dialect`.
    pub async fn run<D: Dialect>(self, work: Work, dialect: D) -> Result<Response, ApiError> {
        let engine = &self.model.engine;
        let (valid, options) = match &work {
            Work::Chat(request) => (engine.prepare_chat(request), &request.options),
            Work::Completion(request) => (engine.prepare_completion(request), &request.options),
        };
        let valid = valid.map_err(|e| {
            let mut e: ApiError = e.into();
            if e.param.as_deref() == Some("constraint") {
                e.param = self.constraint_field.map(str::to_string);
            }
            e
        })?;
        let metrics = &self.state.metrics;
        if let Some(c) = &options.constraint {
            metrics.constrained_request(&self.model.name, c.kind());
        }
        if !options.tools.is_empty() && options.tool_choice != Some(ToolChoice::None) {
            metrics.constrained_request(&self.model.name, "tools");
        }
        let g = Generation::start(self.state, self.model, self.request_id, valid, self.echo).await?;
        Ok(if self.stream { g.stream(dialect) } else { g.respond(dialect).await })
    }
}

/// A generation endpoint's frame: the body parsed by `parse`, then `handle`; any error in the
/// dialect's `shape`, naming the request's model (`model_of`) for the access log.
pub async fn endpoint<T>(
    shape: ErrorShape,
    body: Result<Body413, ApiError>,
    parse: fn(&[u8]) -> Result<T, ApiError>,
    model_of: fn(&T) -> String,
    handle: impl AsyncFnOnce(T) -> Result<Response, ApiError>,
) -> Response {
    let request = match body.and_then(|Body413(bytes)| parse(&bytes)) {
        Ok(r) => r,
        Err(e) => return e.response_in(shape),
    };
    let model = model_of(&request);
    match handle(request).await {
        Ok(response) => response,
        Err(e) => with_model(e.response_in(shape), &model),
    }
}
