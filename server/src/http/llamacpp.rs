//! llama.cpp server's own API: `POST /completion` (also `/completions`), a prompt (text or
//! token ids) continued, and `POST /infill`, which code-completion plugins call (llama.vim,
//! llama.vscode): fill in the middle between `input_prefix` (with `prompt`, the text typed
//! after it, appended) and `input_suffix`, with `input_extra` files of the project as context
//! before it (`{"filename", "text"}`, oldest first: those that do not fit are left out from the
//! first, counted in `context_files_left_out`, and `truncated` is then true).
//!
//! Both take llama.cpp's names: `n_predict`, `temperature`, `top_k`, `top_p`, `min_p`,
//! `repeat_penalty`, `presence_penalty`, `frequency_penalty`, `seed`, `stop`, `ignore_eos`,
//! `stream`, and `n_probs` (each generated token's log-probability and its `n_probs` most likely
//! alternatives' as `completion_probabilities`, of the model's distribution; probabilities of
//! the distribution it was drawn from with `post_sampling_probs`) and `t_max_predict_ms` (past
//! that time from the first token, the answer ends, as at `n_predict`, once it has a line
//! break: what an editor shows of a completion that came in time); its other fields
//! (`samplers`, `cache_prompt`, ...) are left to their defaults. `n_predict: 0`
//! evaluates the prompt, caching it for
//! the next request, and answers with no text (the plugins send it to warm the cache with new
//! context). The answer in llama.cpp's shape: `content`, `stop`, `tokens`, `tokens_predicted`,
//! `tokens_evaluated`, `stop_type` (`eos`, `word` or `limit`) and `stopping_word`, `truncated`
//! and `timings`; streamed as
//! server-sent `data:` objects, the last with `stop: true`. Errors are OpenAI's shape, as
//! llama.cpp's. `GET /props` says what its clients read before they ask (`props`).

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use llaisys_actors::request::FinishReason;
use llaisys_actors::{CompletionRequest, Infill, Options, Prompt};
use llaisys_model::tokenizer::{FIM_DEFAULT_PATH, FIM_DEFAULT_REPO};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::dialect::{Dialect, Frame, Run, Work, endpoint};
use super::error::{ApiError, ErrorShape};
use super::generation::{Generation, Step, TokenLogprob};
use super::openai;
use super::{AppState, Body413, RequestIdExt, json_response};

/// The fields `/completion` and `/infill` share: the model, how much to generate and how.
#[derive(Debug, Deserialize)]
struct GenerationIn {
    /// The served model to use (llama.cpp serves one; optional where one is served).
    model: Option<String>,
    n_predict: Option<i64>,
    temperature: Option<f32>,
    top_k: Option<i64>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<i64>,
    #[serde(default)]
    stop: Vec<String>,
    #[serde(default)]
    ignore_eos: bool,
    /// Alternatives per token with their log-probabilities (0: no probabilities).
    n_probs: Option<i64>,
    /// The probabilities are of the distribution each token was drawn from.
    #[serde(default)]
    post_sampling_probs: bool,
    /// Past this many milliseconds from the first token, the answer ends once it has a line
    /// break (0: no limit).
    t_max_predict_ms: Option<i64>,
    #[serde(default)]
    stream: bool,
}

impl GenerationIn {
    /// The engine's options, and whether the one token generated is only for the cache
    /// (`n_predict: 0`).
    fn options(&self) -> Result<(Options, bool), ApiError> {
        let (max_tokens, warm_only) = match self.n_predict {
            // -1: until the end (or the context).
            None | Some(-1) => (None, false),
            Some(0) => (Some(1), true),
            Some(n) if n >= 1 => (Some(n as usize), false),
            Some(n) => return Err(ApiError::invalid("n_predict", format!("n_predict must be ≥ 0 or -1, got {n}"))),
        };
        // 0: no probabilities.
        let logprobs = self.n_probs.map(|n| super::alternatives("n_probs", n)).transpose()?.filter(|n| *n > 0);
        let options = Options {
            max_tokens,
            temperature: self.temperature,
            top_k: super::top_k_off_at_zero(self.top_k),
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            // llama.cpp: a negative seed is a random one.
            seed: self.seed.filter(|s| *s >= 0).map(|s| s as u64),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            logprobs,
            post_sampling_probs: self.post_sampling_probs,
            time_limit: match self.t_max_predict_ms {
                None | Some(0) => None,
                Some(ms) if ms > 0 => Some(Duration::from_millis(ms as u64)),
                Some(ms) => {
                    let message = format!("t_max_predict_ms must be ≥ 0, got {ms}");
                    return Err(ApiError::invalid("t_max_predict_ms", message));
                }
            },
            ..Options::default()
        };
        Ok((options, warm_only))
    }
}

/// A `POST /infill` body (besides `GenerationIn`'s fields).
#[derive(Debug, Deserialize)]
struct InfillIn {
    input_prefix: String,
    input_suffix: String,
    #[serde(default)]
    input_extra: Vec<ExtraIn>,
    /// Text after the prefix (what the user is typing).
    #[serde(default)]
    prompt: String,
}

#[derive(Debug, Deserialize)]
struct ExtraIn {
    text: String,
    filename: Option<String>,
}

impl InfillIn {
    /// The fill-in-the-middle prompt: llama.cpp writes the repository format, with its names,
    /// files or not.
    fn infill(&self) -> Infill {
        let mut infill = Infill::new(format!("{}{}", self.input_prefix, self.prompt), self.input_suffix.as_str());
        infill.repo = Some(FIM_DEFAULT_REPO.into());
        infill.path = Some(FIM_DEFAULT_PATH.into());
        for f in &self.input_extra {
            // llama.cpp's name for a chunk without one.
            infill = infill.file(f.filename.as_deref().unwrap_or("tmp"), f.text.as_str());
        }
        infill
    }
}

/// A `POST /completion` body (besides `GenerationIn`'s fields).
#[derive(Debug, Deserialize)]
struct CompletionIn {
    prompt: PromptIn,
}

/// llama.cpp's prompt: text, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptIn {
    Text(String),
    Ids(Vec<u32>),
}

/// A `/completion` or `/infill` body in the engine's terms.
pub struct Parsed {
    pub request: CompletionRequest,
    model: Option<String>,
    stream: bool,
    dialect: LlamaCpp,
}

/// A request's own fields and the shared ones, each read from the body's JSON (errors name the
/// field).
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<(T, GenerationIn), ApiError> {
    let value = openai::parse_json(body)?;
    Ok((openai::from_value(&value)?, openai::from_value(&value)?))
}

impl Parsed {
    fn new(prompt: Prompt, g: GenerationIn, infill: bool) -> Result<Self, ApiError> {
        let (options, warm_only) = g.options()?;
        let probs = options.logprobs.map(|_| options.post_sampling_probs);
        let request = CompletionRequest::new(prompt).options(options);
        let dialect = LlamaCpp { infill, warm_only, probs, sent: 0 };
        Ok(Self { request, model: g.model, stream: g.stream, dialect })
    }

    /// A `/infill` body.
    pub fn infill(body: &[u8]) -> Result<Self, ApiError> {
        let (req, g) = parse::<InfillIn>(body)?;
        Self::new(req.infill().into(), g, true)
    }

    /// A `/completion` body.
    pub fn completion(body: &[u8]) -> Result<Self, ApiError> {
        let (req, g) = parse::<CompletionIn>(body)?;
        let prompt = match req.prompt {
            PromptIn::Text(text) => text.into(),
            PromptIn::Ids(ids) => ids.into(),
        };
        Self::new(prompt, g, false)
    }

    async fn run(self, state: &Arc<AppState>, request_id: &str) -> Result<Response, ApiError> {
        let model = state.model_or_default(self.model.as_deref())?;
        let run = Run { state, request_id, model, stream: self.stream, constraint_field: None, echo: false };
        run.run(Work::Completion(self.request), self.dialect).await
    }
}

pub async fn infill(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    body: Result<Body413, ApiError>,
) -> Response {
    answer(&state, &request_id, body, Parsed::infill).await
}

pub async fn completion(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    body: Result<Body413, ApiError>,
) -> Response {
    answer(&state, &request_id, body, Parsed::completion).await
}

/// A body parsed by `parse`, run, and answered in llama.cpp's shape.
async fn answer(
    state: &Arc<AppState>,
    request_id: &str,
    body: Result<Body413, ApiError>,
    parse: fn(&[u8]) -> Result<Parsed, ApiError>,
) -> Response {
    let model_of = |p: &Parsed| p.model.clone().unwrap_or_default();
    endpoint(ErrorShape::OpenAi, body, parse, model_of, async |p| p.run(state, request_id).await).await
}

/// llama.cpp's completion shape.
struct LlamaCpp {
    /// `/infill`'s answer: its context files left out are counted.
    infill: bool,
    /// `n_predict: 0`: the token generated is not the client's.
    warm_only: bool,
    /// `n_probs` asked for: `Some(post_sampling_probs)`.
    probs: Option<bool>,
    /// Tokens streamed so far.
    sent: usize,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// llama.cpp's `completion_probabilities`: each token's id, text, bytes and log-probability
/// with its alternatives' (`top_logprobs`); with `post_sampling` probabilities instead (`prob`,
/// `top_probs`).
fn probabilities(tokens: &[TokenLogprob], post_sampling: bool) -> Value {
    let (p, top) = if post_sampling { ("prob", "top_probs") } else { ("logprob", "top_logprobs") };
    let entry = |t: &TokenLogprob| {
        let mut e = json!({"id": t.id, "token": t.token, "bytes": t.bytes});
        e[p] = if post_sampling { t.logprob.exp() } else { t.logprob }.into();
        e
    };
    let all: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(t);
            e[top] = t.top.iter().map(entry).collect::<Vec<_>>().into();
            e
        })
        .collect();
    all.into()
}

impl LlamaCpp {
    /// The last object: the counts, why it stopped, and the timings.
    fn last(&self, g: &Generation, content: &str, tokens: &[u32]) -> Value {
        let choice = &g.answer().choices()[0];
        let predicted = if self.warm_only { 0 } else { choice.tokens.len() };
        let prompt_n = g.prompt_tokens(0);
        let total = g.elapsed();
        let prompt = g.first_token_after(0).unwrap_or(total);
        let predicted_time = total.saturating_sub(prompt);
        let per_second = |n: usize, d: Duration| if d.is_zero() { 0.0 } else { n as f64 / d.as_secs_f64() };
        let per_token = |n: usize, d: Duration| if n == 0 { 0.0 } else { ms(d) / n as f64 };
        let mut last = json!({
            "index": 0,
            "content": content,
            "tokens": tokens,
            "stop": true,
            "model": g.model(),
            "tokens_predicted": predicted,
            "tokens_evaluated": prompt_n,
            "stop_type": match (choice.finish, &choice.stop) {
                (FinishReason::Length, _) => "limit",
                (_, Some(_)) => "word",
                _ => "eos",
            },
            "stopping_word": choice.stop.as_deref().unwrap_or(""),
            "truncated": g.context_left_out() > 0,
            "timings": {
                "prompt_n": prompt_n,
                "prompt_ms": ms(prompt),
                "prompt_per_token_ms": per_token(prompt_n, prompt),
                "prompt_per_second": per_second(prompt_n, prompt),
                "predicted_n": predicted,
                "predicted_ms": ms(predicted_time),
                "predicted_per_token_ms": per_token(predicted, predicted_time),
                "predicted_per_second": per_second(predicted, predicted_time),
            },
        });
        if self.infill {
            last["context_files_left_out"] = g.context_left_out().into();
        }
        last
    }
}

impl Dialect for LlamaCpp {
    const SHAPE: ErrorShape = ErrorShape::OpenAi;

    fn body(&mut self, g: &Generation) -> Value {
        let choice = &g.answer().choices()[0];
        if self.warm_only {
            return self.last(g, "", &[]);
        }
        let mut last = self.last(g, &choice.text, &choice.tokens);
        if let Some(post_sampling) = self.probs {
            last["completion_probabilities"] = probabilities(&g.logprobs_of(0, 0), post_sampling);
        }
        last
    }

    fn open(&mut self, _: &Generation) -> Vec<Frame> {
        Vec::new()
    }

    fn step(&mut self, g: &Generation, step: &Step) -> Vec<Frame> {
        let mut frames = Vec::new();
        let choice = &g.answer().choices()[0];
        if !self.warm_only && !step.text.is_empty() {
            // The tokens since the last frame (a token whose text was held back comes with the next).
            let from = self.sent.min(choice.tokens.len());
            self.sent = choice.tokens.len();
            let mut frame = json!({
                "index": 0,
                "content": step.text,
                "tokens": &choice.tokens[from..],
                "stop": false,
                "tokens_predicted": choice.tokens.len(),
                "tokens_evaluated": g.prompt_tokens(0),
            });
            if let Some(post_sampling) = self.probs {
                frame["completion_probabilities"] = probabilities(&g.logprobs_of(0, from), post_sampling);
            }
            frames.push(Frame::data(&frame));
        }
        match step.finish {
            Some(FinishReason::Error) => frames.push(Frame::data(&g.engine_error().body_in(ErrorShape::OpenAi))),
            Some(_) => frames.push(Frame::data(&self.last(g, "", &[]))),
            None => {}
        }
        frames
    }

    fn close(&mut self, _: &Generation) -> Vec<Frame> {
        Vec::new()
    }
}

/// `GET /lora-adapters` (llama.cpp's): the LoRA adapters merged into the model's weights, each
/// with its `id` (its place in the order given), `path` and `scale`; `?model=NAME` picks one of
/// several served models.
pub async fn lora_adapters(
    State(state): State<Arc<AppState>>,
    Query(q): Query<PropsQuery>,
) -> Result<Response, ApiError> {
    let m = state.model_or_default(q.model.as_deref())?;
    let mut adapters = m.adapters();
    for (id, a) in adapters.iter_mut().enumerate() {
        a["id"] = id.into();
    }
    Ok(json_response(StatusCode::OK, &Value::from(adapters)))
}

/// `POST /lora-adapters`: llama.cpp changes its adapters' scales while it serves; here they are
/// merged into the weights as they load, so their scales are set at start, and a change is
/// refused saying so (nothing changes).
pub async fn set_lora_adapters() -> ApiError {
    ApiError::invalid(
        "scale",
        "LoRA adapters are merged into the weights at load: set their scales at start (--lora-scaled PATH SCALE, \
         or model.lora in the config), or serve the model with each set of adapters under its own name (model.also)",
    )
}

/// `?model=NAME`: which of several served models (llama.cpp's router's parameter).
#[derive(Debug, Deserialize)]
pub struct PropsQuery {
    model: Option<String>,
}

/// `GET /props` (llama.cpp's): what its clients read of a server before they ask. The context one
/// request may fill (`default_generation_settings.n_ctx`: the model's, within the KV cache), the
/// defaults a `/completion` without options gets (`params`: only the fields llaisys honours;
/// `n_predict` the most tokens it generates, `seed` llama.cpp's word for a random one), the
/// requests served at once (`total_slots`: the admission limit), the model (its name as
/// `model_alias`, its first weight file as `model_path`), its chat template, its modalities (images
/// where it sees them). `?model=NAME` picks one of several served models; with one it may be left out.
pub async fn props(State(state): State<Arc<AppState>>, Query(q): Query<PropsQuery>) -> Result<Response, ApiError> {
    let m = state.model_or_default(q.model.as_deref())?;
    let frontend = m.engine.frontend();
    let text = frontend.text();
    let s = frontend.default_sampling();
    let params = json!({
        "n_predict": frontend.limits().max_tokens,
        "seed": s.seed.unwrap_or(u64::from(u32::MAX)),
        "temperature": s.temperature,
        "top_k": s.top_k.unwrap_or(0),
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "stop": [],
        "ignore_eos": false,
        "n_probs": 0,
        "post_sampling_probs": false,
        "t_max_predict_ms": 0,
        "stream": false,
    });
    let path = m.files().and_then(|f| f.files.first()).map_or(m.name.clone(), |p| p.display().to_string());
    let body = json!({
        "default_generation_settings": {"n_ctx": frontend.context(), "params": params},
        "total_slots": state.limits.max_concurrent_requests,
        "model_alias": m.name,
        "model_path": path,
        "chat_template": text.and_then(|t| t.chat_template()).map_or("", |t| t.source()),
        "modalities": {"vision": m.info().vision.is_some(), "audio": false},
        "build_info": format!("llaisys {}", env!("CARGO_PKG_VERSION")),
        "is_sleeping": false,
    });
    Ok(json_response(StatusCode::OK, &body))
}
