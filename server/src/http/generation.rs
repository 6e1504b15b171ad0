//! One generation request of any dialect: its choices run as engine requests whose event
//! streams are merged into steps; the result is the dialect's JSON body, or its stream (S2:
//! SSE, or NDJSON for Ollama) which always ends with every choice's finish or an error.
//! Dropping it (the client went away) drops the engine streams, which cancels the requests.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use llaisys_actors::ValidRequest;
use llaisys_actors::host::{AnswerBuilder, TokenLogprob as EngineTokenLogprob};
use llaisys_actors::request::{FinishReason, ToolCallDelta};
use llaisys_actors::{Event, Generation as EngineGeneration, Output};
use serde_json::{Value, json};

use super::dialect::{Dialect, Frame, Transport};
use super::error::ApiError;
use super::{AppState, ModelEntry, Registration, json_response, with_model};

/// One choice's timing, for the latency metrics (its text, tokens and usage are the
/// `AnswerBuilder`'s).
#[derive(Default)]
struct Clock {
    prompt_tokens: usize,
    first_token: Option<Duration>,
    last_token: Option<Instant>,
    /// Tokens received so far (a stream dropped early never gets its usage).
    tokens_seen: usize,
    /// Tokens of the model's thinking.
    reasoning_tokens: usize,
    finished: bool,
}

/// A token's log-probability with its id, text and bytes, and the same for each alternative
/// (theirs have no alternatives).
pub struct TokenLogprob {
    pub id: u32,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<TokenLogprob>,
    /// A prompt token's rank in its row (1: the most likely).
    pub rank: Option<u32>,
}

impl TokenLogprob {
    /// OpenAI's entry: chat's `logprobs.content[]`, the Responses API's `logprobs[]`.
    pub fn openai(&self) -> Value {
        let top: Vec<Value> =
            self.top.iter().map(|a| json!({"token": a.token, "logprob": a.logprob, "bytes": a.bytes})).collect();
        json!({"token": self.token, "logprob": self.logprob, "bytes": self.bytes, "top_logprobs": top})
    }
}

/// What one engine event added to one choice.
pub struct Step {
    pub choice: usize,
    pub text: String,
    /// A reasoning model's thinking.
    pub reasoning: String,
    /// Pieces of tool calls.
    pub tool_calls: Vec<ToolCallDelta>,
    /// The choice finished with this reason (`Error`: the engine failed it).
    pub finish: Option<FinishReason>,
    /// The event was a generated token (not the finish).
    pub token: bool,
    /// The choice's log-probabilities before this step (`logprobs_of(choice, from)` gives
    /// this step's).
    pub logprobs_from: usize,
}

pub struct Generation {
    /// The HTTP request's id; dialects prefix it for their response ids.
    pub request_id: String,
    pub created: u64,
    model: Arc<ModelEntry>,
    state: Arc<AppState>,
    /// Requested alternatives per token, when logprobs were asked for.
    logprobs: Option<usize>,
    /// Requested alternatives per prompt token, when the prompt's log-probabilities were.
    prompt_logprobs: Option<usize>,
    merged: EngineGeneration,
    /// Every choice's text, tokens, tool calls, finish and usage as the events add up.
    answer: AnswerBuilder,
    clocks: Vec<Clock>,
    start: Instant,
    /// Echoed prompt text per prompt (completions with `echo`).
    echo: Vec<String>,
    /// Choices per prompt.
    n: usize,
    /// Fill-in-the-middle context files left out of the prompts for room.
    context_left_out: usize,
    _permit: super::admission::Permit,
    _registration: Registration,
}

impl Generation {
    /// Admits the request and starts its choices (`n` for each prompt).
    pub async fn start(
        state: &Arc<AppState>,
        model: Arc<ModelEntry>,
        request_id: &str,
        request: ValidRequest,
        echo: bool,
    ) -> Result<Self, ApiError> {
        let permit = state.admit(request.params().priority).await?;
        let start = Instant::now();
        let logprobs = request.logprobs().then_some(request.params().sampling.top_logprobs);
        let prompt_logprobs = request.params().sampling.prompt_logprobs;
        let n = request.n();
        let context_left_out = request.context_left_out();
        let merged = model.engine.submit(request).await?;
        let registration = state.register(request_id, model.engine.clone(), merged.ids().to_vec());
        let echo = if echo {
            let tokenizer = model.tokenizer()?;
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
        Ok(Self {
            request_id: request_id.into(),
            created: unix_now(),
            state: state.clone(),
            model,
            logprobs,
            prompt_logprobs,
            merged,
            answer,
            clocks,
            start,
            echo,
            n,
            context_left_out,
            _permit: permit,
            _registration: registration,
        })
    }

    /// The served model's name.
    pub fn model(&self) -> &str {
        &self.model.name
    }

    /// The answer so far: every choice's text, reasoning, tool calls, finish; the usage.
    pub fn answer(&self) -> &AnswerBuilder {
        &self.answer
    }

    /// Fill-in-the-middle context files left out of the prompts for room (`Infill::files`).
    pub fn context_left_out(&self) -> usize {
        self.context_left_out
    }

    /// The number of choices.
    pub fn choices(&self) -> usize {
        self.clocks.len()
    }

    /// Alternatives per token when log-probabilities were asked for.
    pub fn logprobs(&self) -> Option<usize> {
        self.logprobs
    }

    /// The prompt text choice `i` echoes (completions with `echo`).
    pub fn echo(&self, i: usize) -> Option<&str> {
        self.echo.get(i / self.n).map(String::as_str)
    }

    /// Time since the request was admitted.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Time from admission to choice `i`'s first token.
    pub fn first_token_after(&self, i: usize) -> Option<Duration> {
        self.clocks.get(i).and_then(|c| c.first_token)
    }

    /// Tokens choice `i` spent thinking (those that carried reasoning text).
    pub fn reasoning_tokens(&self, i: usize) -> usize {
        self.clocks.get(i).map_or(0, |c| c.reasoning_tokens)
    }

    /// The prompt's length of choice `i`.
    pub fn prompt_tokens(&self, i: usize) -> usize {
        self.clocks.get(i).map_or(0, |c| c.prompt_tokens)
    }

    /// Waits for the next engine event and applies it; `None` once every choice has finished.
    pub async fn next(&mut self) -> Option<Step> {
        let Output { choice, event } = self.merged.next().await?;
        let model = &self.model.name;
        let metrics = &self.state.metrics;
        let clock = &mut self.clocks[choice];
        let logprobs_from = self.answer.choices()[choice].logprobs.len();
        let step = match &event {
            Event::Token { text, reasoning, mask_time, tool_calls, .. } => {
                let now = Instant::now();
                if let Some(t) = mask_time {
                    metrics.grammar_mask(model, *t);
                }
                match clock.last_token {
                    None => {
                        clock.first_token = Some(now - self.start);
                        metrics.first_token(model, now - self.start);
                    }
                    Some(last) => metrics.inter_token(model, now - last),
                }
                clock.last_token = Some(now);
                clock.tokens_seen += 1;
                clock.reasoning_tokens += usize::from(!reasoning.is_empty());
                Step {
                    choice,
                    text: text.clone(),
                    reasoning: reasoning.clone(),
                    tool_calls: tool_calls.clone(),
                    finish: None,
                    token: true,
                    logprobs_from,
                }
            }
            Event::Finished { reason, text, reasoning, usage, queue_time, .. } => {
                clock.finished = true;
                if let Some(q) = queue_time {
                    metrics.queue_time(model, *q);
                }
                let e2e = self.start.elapsed();
                metrics.request_finished(model, *reason, usage.prompt_tokens, usage.completion_tokens, e2e);
                Step {
                    choice,
                    text: text.clone(),
                    reasoning: reasoning.clone(),
                    tool_calls: Vec::new(),
                    finish: Some(*reason),
                    token: false,
                    logprobs_from,
                }
            }
        };
        self.answer.add(choice, event);
        Some(step)
    }

    /// Log-probabilities with token text and bytes for choice `i`, from its `from`-th token on.
    pub fn logprobs_of(&self, i: usize, from: usize) -> Vec<TokenLogprob> {
        let choice = &self.answer.choices()[i];
        self.pieces(&choice.logprobs[from.min(choice.logprobs.len())..])
    }

    /// Choice `i`'s log-probabilities from its `from`-th token on as OpenAI's entries, where the
    /// request asked for them (chat's `logprobs.content`, the Responses API's and Ollama's).
    pub fn openai_logprobs(&self, i: usize, from: usize) -> Option<Vec<Value>> {
        self.logprobs?;
        Some(self.logprobs_of(i, from).iter().map(TokenLogprob::openai).collect())
    }

    /// Choice `i`'s prompt tokens' log-probabilities, each given the ones before it with its
    /// `alternatives` most likely (at most those asked for), where the request asked for them
    /// (`prompt_logprobs`) and they have come (with its first token): its first token (nothing
    /// comes before it: its `logprob` is none, 0), and the others'.
    pub fn prompt_logprobs_of(&self, i: usize, alternatives: usize) -> Option<(TokenLogprob, Vec<TokenLogprob>)> {
        self.prompt_logprobs?;
        let first = *self.merged.prompts().get(i / self.n)?.first()?;
        let first = EngineTokenLogprob { token: first, logprob: 0.0, top: Vec::new(), rank: None };
        let first = self.pieces(&[first]).pop()?;
        let mut rest = self.pieces(&self.answer.choices()[i].prompt_logprobs);
        rest.iter_mut().for_each(|t| t.top.truncate(alternatives));
        Some((first, rest))
    }

    /// Choice `i`'s prompt, as the engine took it (its token ids), an image's rows as the model's
    /// image token, as the model's processor writes them (the engine's ids for those rows are
    /// drawn from the image, for its prefix cache).
    pub fn prompt_ids(&self, i: usize) -> Vec<u32> {
        let mut ids = self.merged.prompts().get(i / self.n).cloned().unwrap_or_default();
        if let Some(images) = &self.merged.request().params().images {
            images.restore(&mut ids);
        }
        ids
    }

    /// Whether choice `i`'s first token has come (with its prompt's log-probabilities, where
    /// they were asked for).
    pub fn first_token(&self, i: usize) -> bool {
        self.answer.choices()[i].tokens.len() == 1
    }

    /// The engine's log-probabilities with their tokens' text and bytes.
    fn pieces(&self, logprobs: &[EngineTokenLogprob]) -> Vec<TokenLogprob> {
        let Some(tokenizer) = self.model.engine.tokenizer() else { return Vec::new() };
        let piece = |id: u32, logprob: f32, top: Vec<TokenLogprob>| {
            let bytes = tokenizer.token_bytes(id).unwrap_or_default();
            TokenLogprob { id, token: String::from_utf8_lossy(&bytes).into_owned(), bytes, logprob, top, rank: None }
        };
        logprobs
            .iter()
            .map(|t| TokenLogprob {
                rank: t.rank,
                ..piece(t.token, t.logprob, t.top.iter().map(|&(id, lp)| piece(id, lp, Vec::new())).collect())
            })
            .collect()
    }

    /// The error a dialect reports for a choice the engine failed.
    pub fn engine_error(&self) -> ApiError {
        ApiError::internal(format!("generation failed in the engine (request {}); see the server log", self.request_id))
    }

    /// The error to report if a choice failed in the engine (a choice that never finished
    /// counts as failed).
    fn failure(&self) -> Option<ApiError> {
        let failed = self.answer.choices().iter().any(|c| c.finish == FinishReason::Error);
        failed.then(|| self.engine_error())
    }

    /// Runs to the end and answers with the dialect's body.
    pub async fn respond<D: Dialect>(mut self, mut dialect: D) -> Response {
        while self.next().await.is_some() {}
        let response = match self.failure() {
            Some(err) => err.response_in(D::SHAPE),
            None => json_response(StatusCode::OK, &dialect.body(&self)),
        };
        with_model(response, &self.model.name)
    }

    /// Streams the dialect's frames as they come.
    pub fn stream<D: Dialect>(self, mut dialect: D) -> Response {
        let model = self.model.name.clone();
        let pending: VecDeque<Frame> = dialect.open(&self).into();
        let frames =
            stream::unfold((self, dialect, pending, false), |(mut g, mut d, mut pending, mut done)| async move {
                loop {
                    if let Some(frame) = pending.pop_front() {
                        return Some((frame, (g, d, pending, done)));
                    }
                    if done {
                        return None;
                    }
                    match g.next().await {
                        Some(step) => pending.extend(d.step(&g, &step)),
                        None => {
                            pending.extend(d.close(&g));
                            done = true;
                        }
                    }
                }
            });
        let response = match D::TRANSPORT {
            Transport::Sse => {
                let events = frames.map(|f| {
                    let event = SseEvent::default().data(f.data);
                    Ok::<_, Infallible>(match f.event {
                        Some(name) => event.event(name),
                        None => event,
                    })
                });
                Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
            }
            Transport::NdJson => {
                let lines = frames.map(|f| Ok::<_, Infallible>(format!("{}\n", f.data)));
                ([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response()
            }
        };
        with_model(response, &model)
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

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs()
}
