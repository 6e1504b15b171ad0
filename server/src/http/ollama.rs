//! The part of Ollama's API that editors and chat apps call: `/api/chat`, `/api/generate`,
//! `/api/tags`, `/api/show`, `/api/ps` and `/api/version`. Ollama's option names
//! (`num_predict`, `repeat_penalty`, ...), `format` (`"json"` or a schema), `think`, tools with
//! object arguments, generate's `suffix` (fill in the middle), `logprobs` and `top_logprobs`;
//! answers stream by default as
//! newline-delimited JSON, the last line `done: true` with Ollama's counts and durations
//! (nanoseconds). Errors are `{"error": ...}`.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use llaisys_actors::request::{FinishReason, ToolCallOut};
use llaisys_actors::{ChatRequest, CompletionRequest, EmbedRequest, Infill, Options, Prompt, Tool, ToolChoice};
use llaisys_model::Constraint;
use llaisys_model::tokenizer::{ChatMessage, ToolCall, strftime};
use serde::Deserialize;
use serde_json::{Value, json};

use super::dialect::{Dialect, Frame, Run, Transport, Work, endpoint};
use super::error::{ApiError, ErrorShape};
use super::generation::{Generation, Step};
use super::openai::parse;
use super::{AppState, Body413, ModelEntry, RequestIdExt, images, json_response, with_model};

/// The Ollama release whose API this follows (clients check it before using newer fields such
/// as `think`).
const OLLAMA_VERSION: &str = "0.9.0";

/// A `POST /api/chat` body.
#[derive(Debug, Deserialize)]
pub struct ChatIn {
    model: String,
    messages: Vec<MessageIn>,
    #[serde(default)]
    tools: Vec<ToolIn>,
    format: Option<Value>,
    #[serde(default)]
    options: OptionsIn,
    stream: Option<bool>,
    think: Option<Value>,
    #[serde(flatten)]
    logprobs: LogprobsIn,
}

/// `logprobs` and `top_logprobs` (Ollama 0.12.11 and later): each generated token's
/// log-probability, with its `top_logprobs` (0-20) most likely alternatives', as OpenAI's chat
/// gives them.
#[derive(Debug, Default, Deserialize)]
struct LogprobsIn {
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<i64>,
}

impl LogprobsIn {
    /// The engine's `logprobs` option: the alternatives' count where asked (Ollama checks
    /// `top_logprobs` either way, and reads it only with `logprobs`).
    fn alternatives(&self) -> Result<Option<usize>, ApiError> {
        let top = self.top_logprobs.map(|n| super::alternatives("top_logprobs", n)).transpose()?.unwrap_or(0);
        Ok(self.logprobs.then_some(top))
    }
}

/// A `POST /api/generate` body.
#[derive(Debug, Deserialize)]
pub struct GenerateIn {
    model: String,
    #[serde(default)]
    prompt: String,
    system: Option<String>,
    suffix: Option<String>,
    template: Option<String>,
    context: Option<Vec<u32>>,
    #[serde(default)]
    raw: bool,
    #[serde(default)]
    images: Vec<Value>,
    format: Option<Value>,
    #[serde(default)]
    options: OptionsIn,
    stream: Option<bool>,
    think: Option<Value>,
    #[serde(flatten)]
    logprobs: LogprobsIn,
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    images: Vec<Value>,
    #[serde(default)]
    tool_calls: Vec<ToolCallIn>,
}

#[derive(Debug, Deserialize)]
struct ToolCallIn {
    id: Option<String>,
    function: FunctionCallIn,
}

#[derive(Debug, Deserialize)]
struct FunctionCallIn {
    name: String,
    #[serde(default)]
    arguments: Value,
}

#[derive(Debug, Deserialize)]
struct ToolIn {
    #[serde(rename = "type")]
    kind: Option<String>,
    function: FunctionIn,
}

#[derive(Debug, Deserialize)]
struct FunctionIn {
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
}

/// Ollama's `options`: the sampling and stopping ones are used; the rest (`num_ctx`,
/// `num_gpu`, `num_thread`, `keep_alive`-like runner settings) do not apply to a server whose
/// context and devices are set at start, and are ignored as Ollama ignores unknown ones.
#[derive(Debug, Default, Deserialize)]
struct OptionsIn {
    num_predict: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct EmbedIn {
    model: String,
    input: EmbedInput,
    /// Ollama cuts inputs longer than the context by default.
    truncate: Option<bool>,
    dimensions: Option<usize>,
}

/// One text or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum EmbedInput {
    One(String),
    Many(Vec<String>),
}

/// The older `/api/embeddings`: one `prompt`.
#[derive(Debug, Deserialize)]
struct EmbeddingsIn {
    model: String,
    prompt: String,
}

#[derive(Debug, Deserialize)]
struct ModelIn {
    #[serde(alias = "name")]
    model: String,
}

/// Parses a body, with errors in Ollama's shape.
fn body_of<T: serde::de::DeserializeOwned>(body: Result<Body413, ApiError>) -> Result<T, ApiError> {
    parse(&body?.0)
}

pub async fn version() -> Response {
    json_response(StatusCode::OK, &json!({"version": OLLAMA_VERSION}))
}

pub(super) fn rfc3339(secs: u64) -> String {
    strftime(secs, "%Y-%m-%dT%H:%M:%SZ")
}

fn details(m: &ModelEntry) -> Value {
    let family = m.info().model_type;
    let mut details = json!({"parent_model": "", "format": "", "family": family, "families": [family]});
    if let Some(files) = m.files() {
        details["format"] = files.format.into();
        details["parameter_size"] = parameter_size(files.parameters).into();
        details["quantization_level"] = files.quantization.clone().into();
    }
    details
}

/// A count as Ollama shows parameters: `494.03M`, `7.6B`.
fn parameter_size(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2}M", n as f64 / 1e6),
        n => format!("{:.2}K", n as f64 / 1e3),
    }
}

fn listed(state: &AppState, m: &ModelEntry) -> Value {
    let files = m.files();
    let modified = files
        .and_then(|f| std::fs::metadata(f.files.first()?).ok()?.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(m.engine.started_at(), |d| d.as_secs());
    json!({
        "name": m.name,
        "model": m.name,
        "modified_at": rfc3339(modified),
        "size": files.map_or(0, |f| f.bytes),
        "digest": files.map(|f| state.digests.get(&f.files)).unwrap_or_default(),
        "details": details(m),
    })
}

/// The sha256 of each served model's weight files, Ollama's `digest`: worked out once, on a
/// thread of its own at start (empty until then), over the files' bytes in order; a single file
/// the hub cache holds is named by it already.
#[derive(Default)]
pub struct Digests(std::sync::Mutex<std::collections::HashMap<Vec<std::path::PathBuf>, String>>);

impl Digests {
    pub fn start(self: &Arc<Self>, files: Vec<std::path::PathBuf>) {
        if let [file] = &files[..]
            && let Some(name) = std::fs::read_link(file).ok().and_then(|l| Some(l.file_name()?.to_str()?.to_owned()))
            && name.len() == 64
            && name.bytes().all(|b| b.is_ascii_hexdigit())
        {
            self.0.lock().expect("digests").insert(files, name.to_ascii_lowercase());
            return;
        }
        let digests = self.clone();
        let spawned = std::thread::Builder::new().name("llaisys-digest".into()).spawn(move || {
            use sha2::{Digest, Sha256};
            use std::io::Read;
            let mut sha = Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            for file in &files {
                let Ok(mut f) = std::fs::File::open(file) else { return };
                loop {
                    match f.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => sha.update(&buf[..n]),
                        Err(_) => return,
                    }
                }
            }
            let hex: String = sha.finalize().iter().map(|b| format!("{b:02x}")).collect();
            digests.0.lock().expect("digests").insert(files, hex);
        });
        if let Err(e) = spawned {
            tracing::warn!(%e, "no thread to work out a model's digest");
        }
    }

    fn get(&self, files: &[std::path::PathBuf]) -> String {
        self.0.lock().expect("digests").get(files).cloned().unwrap_or_default()
    }
}

pub async fn tags(State(state): State<Arc<AppState>>) -> Response {
    let models: Vec<Value> = state.models().map(|m| listed(&state, &m)).collect();
    json_response(StatusCode::OK, &json!({"models": models}))
}

/// The running models: all of them, loaded at start and kept until the server stops.
pub async fn ps(State(state): State<Arc<AppState>>) -> Response {
    let models: Vec<Value> = state
        .models()
        .map(|m| {
            let mut entry = listed(&state, &m);
            entry["expires_at"] = "9999-12-31T23:59:59Z".into();
            entry["size_vram"] = 0.into();
            entry["context_length"] = m.info().context_length.into();
            entry
        })
        .collect();
    json_response(StatusCode::OK, &json!({"models": models}))
}

pub async fn show(State(state): State<Arc<AppState>>, body: Result<Body413, ApiError>) -> Response {
    let show = || {
        let req: ModelIn = body_of(body)?;
        let m = state.model(&req.model)?;
        let info = m.info();
        let arch = info.model_type;
        let text = m.engine.frontend().text();
        let template = text.and_then(|t| t.chat_template()).map_or("", |t| t.source());
        let mut capabilities = vec!["completion"];
        if template.contains("tools") {
            capabilities.push("tools");
        }
        if text.is_some_and(|t| t.thinks()) {
            capabilities.push("thinking");
        }
        // Clients (Open WebUI, Ollama's own) offer to attach images where a model says this.
        if info.vision.is_some() {
            capabilities.push("vision");
        }
        let mut model_info = serde_json::Map::new();
        model_info.insert("general.architecture".into(), arch.into());
        model_info.insert(format!("{arch}.context_length"), info.context_length.into());
        model_info.insert(format!("{arch}.embedding_length"), info.hidden_size.into());
        model_info.insert(format!("{arch}.vocab_size"), info.vocab_size.into());
        if let Some(files) = m.files() {
            model_info.insert("general.parameter_count".into(), files.parameters.into());
        }
        Ok::<_, ApiError>(json_response(
            StatusCode::OK,
            &json!({
                "modelfile": "",
                "parameters": "",
                "template": template,
                "details": details(&m),
                "model_info": model_info,
                "capabilities": capabilities,
                "modified_at": rfc3339(m.engine.started_at()),
            }),
        ))
    };
    show().unwrap_or_else(|e| e.response_in(ErrorShape::Ollama))
}

pub async fn embed(State(state): State<Arc<AppState>>, body: Result<Body413, ApiError>) -> Response {
    let answer = async || {
        let req: EmbedIn = body_of(body)?;
        let model = state.model(&req.model)?;
        let texts = match req.input {
            EmbedInput::One(t) => vec![t],
            EmbedInput::Many(ts) => ts,
        };
        let request = EmbedRequest {
            inputs: texts.into_iter().map(Prompt::from).collect(),
            dimensions: req.dimensions,
            truncate: req.truncate.unwrap_or(true),
            ..EmbedRequest::default()
        };
        let start = std::time::Instant::now();
        let embeddings = super::embeddings::embed(&state, &model, &request).await?;
        let total = nanos(start.elapsed());
        let body = json!({
            "model": model.name,
            "embeddings": embeddings.vectors,
            "total_duration": total,
            "load_duration": 0,
            "prompt_eval_count": embeddings.prompt_tokens,
        });
        Ok(with_model(json_response(StatusCode::OK, &body), &model.name))
    };
    answer().await.unwrap_or_else(|e: ApiError| e.response_in(ErrorShape::Ollama))
}

/// The older one-prompt endpoint (its vector normalised, as `/api/embed`'s are).
pub async fn embeddings(State(state): State<Arc<AppState>>, body: Result<Body413, ApiError>) -> Response {
    let answer = async || {
        let req: EmbeddingsIn = body_of(body)?;
        let model = state.model(&req.model)?;
        let request = EmbedRequest { truncate: true, ..EmbedRequest::new(vec![Prompt::from(req.prompt)]) };
        let mut embeddings = super::embeddings::embed(&state, &model, &request).await?;
        let body = json!({"embedding": embeddings.vectors.pop().unwrap_or_default()});
        Ok(with_model(json_response(StatusCode::OK, &body), &model.name))
    };
    answer().await.unwrap_or_else(|e: ApiError| e.response_in(ErrorShape::Ollama))
}

pub async fn chat(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    body: Result<Body413, ApiError>,
) -> Response {
    let model_of = |r: &ChatIn| r.model.clone();
    endpoint(ErrorShape::Ollama, body, ChatIn::parse, model_of, async |req| run_chat(&state, &request_id, req).await)
        .await
}

async fn run_chat(state: &Arc<AppState>, request_id: &str, req: ChatIn) -> Result<Response, ApiError> {
    let model = state.model(&req.model)?;
    let (mut request, pending) = req.chat_request()?;
    images::attach(&state.fetcher, &model, &mut request.input, pending).await?;
    let dialect = Ollama { api: Api::Chat, calls_sent: 0, logprobs_sent: 0 };
    let stream = req.stream.unwrap_or(true);
    let run = Run { state, request_id, model, stream, constraint_field: Some("format"), echo: false };
    run.run(Work::Chat(request), dialect).await
}

impl ChatIn {
    /// Parses a body (errors name the field).
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        parse(body)
    }

    /// The request in the engine's terms, and its images (not prepared yet): each message's
    /// before its text, as Ollama places them.
    pub fn chat_request(&self) -> Result<(ChatRequest, Vec<images::Pending>), ApiError> {
        let req = self;
        let mut messages = Vec::new();
        let mut pending = Vec::new();
        for (i, m) in req.messages.iter().enumerate() {
            pending.extend(base64_images(&m.images, i, &format!("messages[{i}].images"))?);
            let tool_calls = (m.tool_calls.iter().enumerate())
                .map(|(j, c)| ToolCall {
                    id: c.id.clone().unwrap_or_else(|| format!("call_{i}_{j}")),
                    name: c.function.name.clone(),
                    arguments: match &c.function.arguments {
                        Value::String(s) => s.clone(),
                        Value::Null => "{}".into(),
                        other => other.to_string(),
                    },
                })
                .collect();
            messages.push(ChatMessage { tool_calls, ..ChatMessage::new(m.role.clone(), m.content.clone()) });
        }
        let mut tools = Vec::new();
        for (i, t) in req.tools.iter().enumerate() {
            if t.kind.as_deref().is_some_and(|k| k != "function") {
                return Err(ApiError::invalid(&format!("tools[{i}].type"), "only function tools are supported"));
            }
            let parameters =
                t.function.parameters.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            tools.push(Tool { name: t.function.name.clone(), description: t.function.description.clone(), parameters });
        }
        let mut options = options(&req.options, req.format.as_ref(), req.think.as_ref())?;
        options.logprobs = req.logprobs.alternatives()?;
        options.tool_choice = (!tools.is_empty()).then_some(ToolChoice::Auto);
        options.tools = tools;
        Ok((ChatRequest::new(messages).options(options), pending))
    }
}

pub async fn generate(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    body: Result<Body413, ApiError>,
) -> Response {
    let model_of = |r: &GenerateIn| r.model.clone();
    endpoint(ErrorShape::Ollama, body, GenerateIn::parse, model_of, async |req| {
        run_generate(&state, &request_id, req).await
    })
    .await
}

async fn run_generate(state: &Arc<AppState>, request_id: &str, req: GenerateIn) -> Result<Response, ApiError> {
    let model = state.model(&req.model)?;
    let Some((mut work, pending)) = req.work()? else {
        // Ollama's way to load a model (an empty prompt): it is loaded already.
        let body = json!({
            "model": model.name,
            "created_at": rfc3339(super::unix_now()),
            "response": "",
            "done": true,
            "done_reason": "load",
        });
        return Ok(with_model(json_response(StatusCode::OK, &body), &model.name));
    };
    if let Work::Chat(request) = &mut work {
        images::attach(&state.fetcher, &model, &mut request.input, pending).await?;
    }
    let dialect = Ollama { api: Api::Generate, calls_sent: 0, logprobs_sent: 0 };
    let stream = req.stream.unwrap_or(true);
    let run = Run { state, request_id, model, stream, constraint_field: Some("format"), echo: false };
    run.run(work, dialect).await
}

impl GenerateIn {
    /// Parses a body (errors name the field).
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        parse(body)
    }

    /// The request in the engine's terms: the prompt in the chat template (with `system`), or
    /// as it is (`raw`); `None` for an empty prompt, which only loads the model. Its images (not
    /// prepared yet) stand before the prompt in its user message; a raw prompt takes none.
    pub fn work(&self) -> Result<Option<(Work, Vec<images::Pending>)>, ApiError> {
        let req = self;
        if req.template.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::invalid(
                "template",
                "a per-request template is not supported: the model's own is used",
            ));
        }
        if req.context.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(ApiError::invalid("context", "context (deprecated by Ollama) is not supported: use /api/chat"));
        }
        if !req.images.is_empty() && (req.raw || req.suffix.as_deref().is_some_and(|s| !s.is_empty())) {
            let reason = "images go into the chat template's user message: a raw prompt or a fill in the middle \
                          takes text only";
            return Err(ApiError::invalid("images", reason));
        }
        let suffix = req.suffix.as_deref().filter(|s| !s.is_empty());
        if req.prompt.is_empty() && suffix.is_none() {
            return Ok(None);
        }
        let mut options = options(&req.options, req.format.as_ref(), req.think.as_ref())?;
        options.logprobs = req.logprobs.alternatives()?;
        // With a suffix the prompt is the text before the middle the model fills in, in its
        // fill-in-the-middle tokens (as Ollama's code models' templates write it).
        if let Some(suffix) = suffix {
            if req.system.is_some() {
                return Err(ApiError::invalid(
                    "system",
                    "a system prompt does not go with suffix (fill-in-the-middle)",
                ));
            }
            let infill = Infill::new(req.prompt.as_str(), suffix);
            return Ok(Some((Work::Completion(CompletionRequest::new(infill).options(options)), Vec::new())));
        }
        Ok(Some(if req.raw {
            (Work::Completion(CompletionRequest::new(req.prompt.as_str()).options(options)), Vec::new())
        } else {
            let mut messages = Vec::new();
            if let Some(system) = &req.system {
                messages.push(ChatMessage::new("system", system.clone()));
            }
            let pending = base64_images(&req.images, messages.len(), "images")?;
            messages.push(ChatMessage::new("user", req.prompt.clone()));
            (Work::Chat(ChatRequest::new(messages).options(options)), pending)
        }))
    }
}

/// A message's `images` (base64 strings) as images before its text.
fn base64_images(list: &[Value], message: usize, field: &str) -> Result<Vec<images::Pending>, ApiError> {
    (list.iter().enumerate())
        .map(|(k, v)| {
            let param = format!("{field}[{k}]");
            let data = v.as_str().ok_or_else(|| ApiError::invalid(&param, "an image is a base64 string"))?;
            let data = images::ImageData::Bytes(images::from_base64(data, &param)?);
            Ok(images::Pending { message, at: 0, data, param })
        })
        .collect()
}

/// Ollama's options, `format` and `think` as the engine's options.
fn options(o: &OptionsIn, format: Option<&Value>, think: Option<&Value>) -> Result<Options, ApiError> {
    let max_tokens = match o.num_predict {
        // -1: until the end; -2: fill the context. Both are the engine's default.
        None | Some(-1 | -2) => None,
        Some(n) if n >= 1 => Some(n as usize),
        Some(n) => {
            return Err(ApiError::invalid(
                "options.num_predict",
                format!("num_predict must be ≥ 1, -1 or -2, got {n}"),
            ));
        }
    };
    let constraint = match format {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => Some(Constraint::JsonObject),
        Some(schema @ Value::Object(_)) => Some(Constraint::JsonSchema { schema: schema.clone(), strict: false }),
        Some(other) => {
            return Err(ApiError::invalid("format", format!("format is \"json\" or a JSON schema, got {other}")));
        }
    };
    let mut kwargs = serde_json::Map::new();
    match think {
        None | Some(Value::Null) => {}
        Some(Value::Bool(on)) => {
            kwargs.insert("enable_thinking".into(), (*on).into());
        }
        Some(Value::String(level)) if matches!(level.as_str(), "low" | "medium" | "high") => {
            kwargs.insert("enable_thinking".into(), true.into());
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "think",
                format!("think is true, false, \"low\", \"medium\" or \"high\", got {other}"),
            ));
        }
    }
    Ok(Options {
        max_tokens,
        temperature: o.temperature,
        top_p: o.top_p,
        top_k: super::top_k_off_at_zero(o.top_k),
        min_p: o.min_p,
        repetition_penalty: o.repeat_penalty,
        presence_penalty: o.presence_penalty,
        frequency_penalty: o.frequency_penalty,
        seed: o.seed.map(|s| s as u64),
        stop: o.stop.clone().unwrap_or_default(),
        constraint,
        chat_template_kwargs: kwargs,
        ..Options::default()
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Generate,
}

/// Ollama's chat and generate shapes; tool calls go out whole (Ollama's arguments are an
/// object), when the answer finishes. Log-probabilities, where asked, go with the text of their
/// tokens (a token whose text was held back with the next line).
struct Ollama {
    api: Api,
    calls_sent: usize,
    logprobs_sent: usize,
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

fn done_reason(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::ToolCalls | FinishReason::Abort | FinishReason::Error => "stop",
    }
}

fn call_json(call: &ToolCallOut, index: usize) -> Value {
    let arguments =
        serde_json::from_str::<Value>(&call.arguments).unwrap_or_else(|_| Value::String(call.arguments.clone()));
    json!({"id": call.id, "function": {"index": index, "name": call.name, "arguments": arguments}})
}

impl Ollama {
    /// One line (or the whole answer): text, thinking and tool calls in this API's shape.
    fn piece(&self, g: &Generation, text: &str, thinking: &str, calls: &[Value]) -> Value {
        let mut body = json!({"model": g.model(), "created_at": rfc3339(super::unix_now())});
        match self.api {
            Api::Chat => {
                let mut message = json!({"role": "assistant", "content": text});
                if !thinking.is_empty() {
                    message["thinking"] = thinking.into();
                }
                if !calls.is_empty() {
                    message["tool_calls"] = calls.to_vec().into();
                }
                body["message"] = message;
            }
            Api::Generate => {
                body["response"] = text.into();
                if !thinking.is_empty() {
                    body["thinking"] = thinking.into();
                }
            }
        }
        body["done"] = false.into();
        body
    }

    /// Marks `body` as the last one: finish and Ollama's counts and durations.
    fn done(g: &Generation, body: &mut Value) {
        let choice = &g.answer().choices()[0];
        let usage = g.answer().usage();
        let total = g.elapsed();
        let prompt = g.first_token_after(0).unwrap_or(total);
        body["done"] = true.into();
        body["done_reason"] = done_reason(choice.finish).into();
        body["total_duration"] = nanos(total).into();
        body["load_duration"] = 0.into();
        body["prompt_eval_count"] = usage.prompt_tokens.into();
        body["prompt_eval_duration"] = nanos(prompt).into();
        body["eval_count"] = usage.completion_tokens.into();
        body["eval_duration"] = nanos(total.saturating_sub(prompt)).into();
    }
}

impl Dialect for Ollama {
    const SHAPE: ErrorShape = ErrorShape::Ollama;
    const TRANSPORT: Transport = Transport::NdJson;

    fn body(&mut self, g: &Generation) -> Value {
        let choice = &g.answer().choices()[0];
        let calls: Vec<Value> = choice.tool_calls.iter().enumerate().map(|(i, c)| call_json(c, i)).collect();
        let mut body = self.piece(g, &choice.text, &choice.reasoning, &calls);
        if let Some(logprobs) = g.openai_logprobs(0, 0) {
            body["logprobs"] = logprobs.into();
        }
        Self::done(g, &mut body);
        body
    }

    fn open(&mut self, _: &Generation) -> Vec<Frame> {
        Vec::new()
    }

    fn step(&mut self, g: &Generation, step: &Step) -> Vec<Frame> {
        let mut frames = Vec::new();
        if !step.text.is_empty() || !step.reasoning.is_empty() {
            let mut piece = self.piece(g, &step.text, &step.reasoning, &[]);
            if let Some(logprobs) = g.openai_logprobs(0, self.logprobs_sent) {
                self.logprobs_sent += logprobs.len();
                piece["logprobs"] = logprobs.into();
            }
            frames.push(Frame::data(&piece));
        }
        match step.finish {
            Some(FinishReason::Error) => frames.push(Frame::data(&g.engine_error().body_in(ErrorShape::Ollama))),
            Some(_) => {
                let choice = &g.answer().choices()[0];
                let calls: Vec<Value> =
                    choice.tool_calls.iter().enumerate().skip(self.calls_sent).map(|(i, c)| call_json(c, i)).collect();
                self.calls_sent = choice.tool_calls.len();
                if !calls.is_empty() {
                    frames.push(Frame::data(&self.piece(g, "", "", &calls)));
                }
                let mut last = self.piece(g, "", "", &[]);
                Self::done(g, &mut last);
                frames.push(Frame::data(&last));
            }
            None => {}
        }
        frames
    }

    fn close(&mut self, _: &Generation) -> Vec<Frame> {
        Vec::new()
    }
}
