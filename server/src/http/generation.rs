//! One generation request of either API: its choices run as engine requests whose event
//! streams are merged; the result is one JSON response, or an SSE stream (S2) that always ends
//! with a finish (or an error object) and `data: [DONE]`. Dropping it (the client went away)
//! drops the engine streams, which cancels the requests.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use llaisys_actors::ValidRequest;
use llaisys_actors::host::AnswerBuilder;
use llaisys_actors::request::{FinishReason, ToolCallDelta, ToolCallOut};
use llaisys_actors::{Event, Generation as EngineGeneration, Output};
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;

use super::error::ApiError;
use super::{AppState, ModelEntry, Registration, json_response, with_model};

/// Which API the request came through; it decides the JSON shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completion,
}

/// One choice's timing, for the latency metrics (its text, tokens and usage are the
/// `AnswerBuilder`'s).
#[derive(Default)]
struct Clock {
    prompt_tokens: usize,
    last_token: Option<Instant>,
    /// Tokens received so far (a stream dropped early never gets its usage).
    tokens_seen: usize,
    finished: bool,
}

/// A token's log-probability as OpenAI shows it: the token's text and bytes, and the same for
/// each alternative.
struct TokenLogprob {
    token: String,
    bytes: Vec<u8>,
    logprob: f32,
    top: Vec<(String, Vec<u8>, f32)>,
}

pub struct Generation {
    pub id: String,
    created: u64,
    api: Api,
    model: Arc<ModelEntry>,
    state: Arc<AppState>,
    /// Requested alternatives per token, when logprobs were asked for.
    logprobs: Option<usize>,
    include_usage: bool,
    merged: EngineGeneration,
    /// Every choice's text, tokens, tool calls, finish and usage as the events add up.
    answer: AnswerBuilder,
    clocks: Vec<Clock>,
    start: Instant,
    /// Echoed prompt text per prompt (completions with `echo`).
    echo: Vec<String>,
    n: usize,
    _permit: OwnedSemaphorePermit,
    _registration: Registration,
}

impl Generation {
    /// Admits the request and starts its choices (`n` for each prompt).
    pub async fn start(
        state: &Arc<AppState>,
        model: Arc<ModelEntry>,
        api: Api,
        request_id: &str,
        request: ValidRequest,
        include_usage: bool,
        echo: bool,
    ) -> Result<Self, ApiError> {
        let permit = state.admit().await?;
        let start = Instant::now();
        let logprobs = request.logprobs().then_some(request.params().sampling.top_logprobs);
        let n = request.n();
        let merged = model.engine.submit(request).await?;
        let registration = state.register(request_id, model.engine.clone(), merged.ids().to_vec());
        let tokenizer = model.tokenizer()?;
        let echo = if echo {
            merged
                .prompts()
                .iter()
                .map(|p| tokenizer.decode(p, false))
                .collect::<Result<_, _>>()
                .map_err(|e| ApiError::bad_request(e.to_string()))?
        } else {
            Vec::new()
        };
        let clocks: Vec<Clock> = merged
            .prompts()
            .iter()
            .flat_map(|p| (0..n).map(|_| Clock { prompt_tokens: p.len(), ..Clock::default() }))
            .collect();
        let answer = AnswerBuilder::new(clocks.len(), n, logprobs.is_some());
        let prefix = match api {
            Api::Chat => "chatcmpl-",
            Api::Completion => "cmpl-",
        };
        Ok(Self {
            id: format!("{prefix}{request_id}"),
            created: unix_now(),
            api,
            state: state.clone(),
            model,
            logprobs,
            include_usage,
            merged,
            answer,
            clocks,
            start,
            echo,
            n,
            _permit: permit,
            _registration: registration,
        })
    }

    /// Applies one engine event; returns what it adds to its choice: text, reasoning, a piece
    /// of a tool call.
    fn apply(&mut self, index: usize, event: Event) -> Added {
        let model = &self.model.name;
        let clock = &mut self.clocks[index];
        let added = match &event {
            Event::Token { text, reasoning, mask_time, tool_call, .. } => {
                let now = Instant::now();
                if let Some(t) = mask_time {
                    self.state.metrics.grammar_mask(model, *t);
                }
                match clock.last_token {
                    None => self.state.metrics.first_token(model, now - self.start),
                    Some(last) => self.state.metrics.inter_token(model, now - last),
                }
                clock.last_token = Some(now);
                clock.tokens_seen += 1;
                Added { text: text.clone(), reasoning: reasoning.clone(), tool_call: tool_call.clone() }
            }
            Event::Finished { reason, text, reasoning, usage, queue_time } => {
                clock.finished = true;
                if let Some(q) = queue_time {
                    self.state.metrics.queue_time(model, *q);
                }
                let e2e = self.start.elapsed();
                self.state.metrics.request_finished(model, *reason, usage.prompt_tokens, usage.completion_tokens, e2e);
                Added { text: text.clone(), reasoning: reasoning.clone(), tool_call: None }
            }
        };
        self.answer.add(index, event);
        added
    }

    fn usage(&self) -> Value {
        let usage = self.answer.usage();
        json!({
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        })
    }

    /// Log-probabilities as OpenAI shows them (token text and bytes) for choice `i`, from its
    /// `from`-th token on.
    fn logprobs_of(&self, i: usize, from: usize) -> Vec<TokenLogprob> {
        let Some(tokenizer) = self.model.engine.tokenizer() else { return Vec::new() };
        let piece = |id: u32| {
            let bytes = tokenizer.token_bytes(id).unwrap_or_default();
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        };
        let choice = &self.answer.choices()[i];
        choice.logprobs[from.min(choice.logprobs.len())..]
            .iter()
            .map(|t| {
                let (token, bytes) = piece(t.token);
                let top = t.top.iter().map(|&(id, lp)| (piece(id).0, piece(id).1, lp)).collect();
                TokenLogprob { token, bytes, logprob: t.logprob, top }
            })
            .collect()
    }

    /// Runs to the end and answers with one JSON object.
    pub async fn respond(mut self) -> Response {
        while let Some(Output { choice: index, event }) = self.merged.next().await {
            self.apply(index, event);
        }
        if let Some(err) = self.failure() {
            return with_model(err.into_response(), &self.model.name);
        }
        let choices: Vec<Value> = (self.answer.choices().iter().enumerate())
            .map(|(i, c)| {
                let finish = c.finish.as_str();
                match self.api {
                    Api::Chat => json!({
                        "index": i,
                        "message": chat_message(&c.text, &c.reasoning, &c.tool_calls),
                        "logprobs": self.logprobs.map(|_| chat_logprobs(&self.logprobs_of(i, 0))),
                        "finish_reason": finish,
                    }),
                    Api::Completion => {
                        let echo = self.echo.get(i / self.n).map_or("", String::as_str);
                        let logprobs = self.logprobs.map(|_| completion_logprobs(&self.logprobs_of(i, 0), echo.len()));
                        json!({
                            "index": i,
                            "text": format!("{echo}{}", c.text),
                            "logprobs": logprobs,
                            "finish_reason": finish,
                        })
                    }
                }
            })
            .collect();
        let object = match self.api {
            Api::Chat => "chat.completion",
            Api::Completion => "text_completion",
        };
        let mut body = self.envelope(object, choices);
        body["usage"] = self.usage();
        with_model(json_response(StatusCode::OK, &body), &self.model.name)
    }

    /// The fields every response object and chunk carries.
    fn envelope(&self, object: &str, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model.name,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    fn engine_error(&self) -> ApiError {
        ApiError::internal(format!("generation failed in the engine (request {}); see the server log", self.id))
    }

    /// The error to report if a choice failed in the engine (a choice that never finished
    /// counts as failed).
    fn failure(&self) -> Option<ApiError> {
        let failed = self.answer.choices().iter().any(|c| c.finish == FinishReason::Error);
        failed.then(|| self.engine_error())
    }

    fn chunk_object(&self) -> &'static str {
        match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        }
    }

    fn chunk(&self, choices: Vec<Value>) -> SseEvent {
        SseEvent::default().data(self.envelope(self.chunk_object(), choices).to_string())
    }

    /// The chunk for `text` (and this event's logprobs) of choice `i`, finishing it if `finish`.
    fn delta(&self, i: usize, text: &str, logprobs: Option<&[TokenLogprob]>, finish: Option<FinishReason>) -> SseEvent {
        let choice = match self.api {
            Api::Chat => json!({
                "index": i,
                "delta": if text.is_empty() && finish.is_some() { json!({}) } else { json!({"content": text}) },
                "logprobs": logprobs.map(chat_logprobs),
                "finish_reason": finish.map(|f| f.as_str()),
            }),
            Api::Completion => json!({
                "index": i,
                "text": text,
                "logprobs": logprobs.map(|l| completion_logprobs(l, 0)),
                "finish_reason": finish.map(|f| f.as_str()),
            }),
        };
        self.chunk(vec![choice])
    }

    /// The chunk of a piece of choice `i`'s reasoning, as `reasoning_content` (DeepSeek's and
    /// vLLM's name) and `reasoning` (vLLM's newer one).
    fn reasoning_delta(&self, i: usize, reasoning: &str) -> SseEvent {
        self.chunk(vec![json!({
            "index": i,
            "delta": {"reasoning_content": reasoning, "reasoning": reasoning},
            "logprobs": null,
            "finish_reason": null,
        })])
    }

    /// The chunk of a piece of choice `i`'s tool call: id, type and name once (the OpenAI
    /// SDK concatenates repeated strings), then argument pieces.
    fn tool_call_delta(&self, i: usize, d: &ToolCallDelta) -> SseEvent {
        let mut function = serde_json::Map::new();
        if let Some(name) = &d.name {
            function.insert("name".into(), name.clone().into());
        }
        function.insert("arguments".into(), d.arguments.clone().into());
        let mut call = json!({"index": d.index, "function": function});
        if let Some(id) = &d.id {
            call["id"] = id.clone().into();
            call["type"] = "function".into();
        }
        self.chunk(vec![json!({
            "index": i,
            "delta": {"tool_calls": [call]},
            "logprobs": null,
            "finish_reason": null,
        })])
    }

    /// Streams the choices as server-sent events.
    pub fn stream(self) -> Response {
        let model = self.model.name.clone();
        let mut pending: VecDeque<SseEvent> = VecDeque::new();
        for i in 0..self.clocks.len() {
            match self.api {
                Api::Chat => pending.push_back(self.chunk(vec![json!({
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                })])),
                Api::Completion => {
                    if let Some(echo) = self.echo.get(i / self.n) {
                        pending.push_back(self.delta(i, echo, None, None));
                    }
                }
            }
        }
        let events = stream::unfold((self, pending, false), |(mut g, mut pending, mut done)| async move {
            loop {
                if let Some(event) = pending.pop_front() {
                    return Some((Ok::<_, Infallible>(event), (g, pending, done)));
                }
                if done {
                    return None;
                }
                match g.merged.next().await {
                    Some(Output { choice: i, event }) => {
                        let is_token = matches!(event, Event::Token { .. });
                        let before = g.answer.choices()[i].logprobs.len();
                        let Added { text, reasoning, tool_call } = g.apply(i, event);
                        if !reasoning.is_empty() {
                            pending.push_back(g.reasoning_delta(i, &reasoning));
                        }
                        if let Some(d) = &tool_call {
                            pending.push_back(g.tool_call_delta(i, d));
                        }
                        let finish = g.clocks[i].finished.then(|| g.answer.choices()[i].finish);
                        match finish {
                            Some(FinishReason::Error) => {
                                pending.push_back(SseEvent::default().data(g.engine_error().body().to_string()));
                            }
                            Some(f) => pending.push_back(g.delta(i, &text, None, Some(f))),
                            None if is_token && (!text.is_empty() || g.logprobs.is_some()) => {
                                let lp = g.logprobs.map(|_| g.logprobs_of(i, before));
                                pending.push_back(g.delta(i, &text, lp.as_deref(), None));
                            }
                            None => {}
                        }
                    }
                    None => {
                        if g.include_usage {
                            let mut body = g.envelope(g.chunk_object(), vec![]);
                            body["usage"] = g.usage();
                            pending.push_back(SseEvent::default().data(body.to_string()));
                        }
                        pending.push_back(SseEvent::default().data("[DONE]"));
                        done = true;
                    }
                }
            }
        });
        let sse = Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)));
        with_model(sse.into_response(), &model)
    }
}

impl Drop for Generation {
    /// A client that left before the end: its unfinished choices are aborted (dropping the
    /// engine streams cancels them) and counted as such.
    fn drop(&mut self) {
        let e2e = self.start.elapsed();
        for c in self.clocks.iter().filter(|c| !c.finished) {
            self.state.metrics.request_finished(
                &self.model.name,
                FinishReason::Abort,
                c.prompt_tokens,
                c.tokens_seen,
                e2e,
            );
        }
    }
}

/// What one event adds to its choice.
struct Added {
    text: String,
    reasoning: String,
    tool_call: Option<ToolCallDelta>,
}

/// A chat answer's message: content `null` when it only called tools or only thought; a
/// reasoning model's thinking as `reasoning_content` and `reasoning`.
fn chat_message(text: &str, reasoning: &str, calls: &[ToolCallOut]) -> Value {
    let mut message = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        message["reasoning_content"] = reasoning.into();
        message["reasoning"] = reasoning.into();
    }
    if (!calls.is_empty() || !reasoning.is_empty()) && text.is_empty() {
        message["content"] = Value::Null;
    }
    if !calls.is_empty() {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        message["tool_calls"] = calls.into();
    }
    message
}

fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            json!({
                "token": t.token,
                "logprob": t.logprob,
                "bytes": t.bytes,
                "top_logprobs": t.top.iter().map(|(tok, b, lp)| json!({"token": tok, "logprob": lp, "bytes": b})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"content": content})
}

/// Completions' legacy shape; `offset` is where the generated text starts (after an echo).
fn completion_logprobs(tokens: &[TokenLogprob], offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(tokens.len());
    let mut at = offset;
    for t in tokens {
        text_offset.push(at);
        at += t.token.len();
    }
    json!({
        "tokens": tokens.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(|t| t.top.iter().map(|(tok, _, lp)| (tok.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs()
}
