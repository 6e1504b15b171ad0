//! The HTTP service (S1–S5): axum routes, the middleware every request passes (request id,
//! logging, API keys, shutdown refusal, body limit), and the server's shared state.

mod admin;
mod admission;
pub mod anthropic;
mod batches;
mod chat;
mod cors;
pub mod dialect;
mod embeddings;
pub mod error;
pub mod fetch;
mod generation;
pub mod images;
pub mod llamacpp;
pub mod ollama;
pub mod openai;
pub mod responses;
mod webui;

pub use generation::unix_now;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use llaisys_actors::host::MAX_TOP_LOGPROBS;
use llaisys_actors::request::RequestId;
use llaisys_actors::{Engine, Router as Engines};
use llaisys_model::{ModelInfo, Tokenizer};

use crate::config::{AdmissionLimits, ServerConfig};
use crate::metrics::Metrics;
use error::{ApiError, ErrorShape, ErrorType};

/// One served model as a handler holds it: its engine (which holds the tokenizer, chat
/// template, defaults and request limits) under the name clients use. The table of served models
/// is the `Router` (`AppState::engines`); this is a view of one of its entries.
pub struct ModelEntry {
    pub name: String,
    pub engine: Engine,
}

impl ModelEntry {
    pub fn info(&self) -> &ModelInfo {
        self.engine.info()
    }

    /// What its weight files are, when the engine read them.
    pub fn files(&self) -> Option<&llaisys_model::FileSummary> {
        self.engine.frontend().text()?.files()
    }

    /// The LoRA adapters merged into its weights at load, in order, as the model list and
    /// `/lora-adapters` show them: `path` and `scale` (as given: 0.8, not its f32's digits).
    pub fn adapters(&self) -> Vec<serde_json::Value> {
        let adapters = self.engine.frontend().text().map_or(&[][..], |t| t.adapters());
        let scale = |s: f32| s.to_string().parse::<f64>().unwrap_or(f64::from(s));
        adapters.iter().map(|a| serde_json::json!({"path": a.path, "scale": scale(a.scale)})).collect()
    }

    pub fn tokenizer(&self) -> Result<&Tokenizer, ApiError> {
        self.engine.tokenizer().ok_or_else(|| ApiError::internal(format!("the model '{}' has no tokenizer", self.name)))
    }
}

/// Everything the handlers share.
pub struct AppState {
    /// The served models by name.
    pub engines: Engines,
    pub limits: AdmissionLimits,
    pub api_keys: Vec<String>,
    pub metrics: Metrics,
    shutting_down: AtomicBool,
    admission: Arc<admission::Admission>,
    /// Generation requests in flight by id, for the cancel endpoint.
    requests: Mutex<HashMap<String, (Engine, Vec<RequestId>)>>,
    next_id: AtomicU64,
    /// Stored responses of the Responses API.
    responses: responses::ResponseStore,
    /// Files and batches of the Batch API.
    batches: batches::BatchStore,
    /// How the routes run (set when they are built), for a batch's requests.
    options: std::sync::OnceLock<HttpOptions>,
    /// The models' digests, for Ollama's model lists.
    pub digests: Arc<ollama::Digests>,
    /// Which remote image URLs requests may name.
    pub fetcher: fetch::Fetcher,
}

impl AppState {
    pub fn new(engines: Engines, limits: AdmissionLimits, server: &ServerConfig) -> Self {
        let digests = Arc::new(ollama::Digests::default());
        for (_, engine) in engines.iter() {
            if let Some(files) = engine.frontend().text().and_then(|t| t.files()) {
                digests.start(files.files.clone());
            }
        }
        Self {
            digests,
            fetcher: fetch::Fetcher { urls: server.image_urls, hosts: server.image_url_hosts.clone() },
            api_keys: server.api_keys.clone(),
            responses: responses::ResponseStore::new(server.stored_responses),
            batches: batches::BatchStore::new(server.stored_files_bytes),
            options: std::sync::OnceLock::new(),
            admission: admission::Admission::new(limits.clone()),
            engines,
            limits,
            metrics: Metrics::new(),
            shutting_down: AtomicBool::new(false),
            requests: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        }
    }

    /// The served model called `name`.
    pub fn model(&self, name: &str) -> Result<Arc<ModelEntry>, ApiError> {
        let engine = self.engines.engine(name)?.clone();
        Ok(Arc::new(ModelEntry { name: name.into(), engine }))
    }

    /// Every served model, by name.
    pub fn models(&self) -> impl Iterator<Item = ModelEntry> + '_ {
        self.engines.iter().map(|(name, engine)| ModelEntry { name: name.into(), engine: engine.clone() })
    }

    /// The model of a request that may leave it out (tokenize, detokenize): the only one served.
    pub fn model_or_default(&self, name: Option<&str>) -> Result<Arc<ModelEntry>, ApiError> {
        match (name, self.engines.only()) {
            (Some(n), _) => self.model(n),
            (None, Some(only)) => self.model(only),
            (None, None) => Err(ApiError::invalid("model", "several models are served: name one")),
        }
    }

    /// Waits for room in the engine, let in by `priority` (lower first) then arrival, or
    /// refuses with 429 when the queue is full.
    pub async fn admit(self: &Arc<Self>, priority: i32) -> Result<admission::Permit, ApiError> {
        self.admission.admit(priority).await
    }

    /// How the routes run (the defaults before they are built).
    fn options(&self) -> HttpOptions {
        self.options.get().cloned().unwrap_or_else(|| HttpOptions {
            max_body_bytes: 48 << 20,
            max_file_bytes: 0,
            grace: Duration::ZERO,
            webui: false,
            cors_origins: Vec::new(),
        })
    }

    /// Remembers a request's engine ids for the cancel endpoint until the guard drops.
    pub fn register(self: &Arc<Self>, id: &str, engine: Engine, ids: Vec<RequestId>) -> Registration {
        self.requests.lock().expect("request table lock").insert(id.into(), (engine, ids));
        Registration { state: self.clone(), id: id.into() }
    }

    /// Cancels a registered request; false if unknown (or already finished).
    pub async fn cancel(&self, id: &str) -> bool {
        let entry = self.requests.lock().expect("request table lock").get(id).cloned();
        let Some((engine, ids)) = entry else { return false };
        for rid in ids {
            engine.cancel(rid).await;
        }
        true
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    fn new_request_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        format!("{:012x}{:06x}", nanos as u64 & 0xffff_ffff_ffff, n & 0xff_ffff)
    }
}

/// Removes a request from the cancel table when its response is done.
pub struct Registration {
    state: Arc<AppState>,
    id: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut table) = self.state.requests.lock() {
            table.remove(&self.id);
        }
    }
}

/// The id of the HTTP request, set by the middleware (`x-request-id`).
#[derive(Debug, Clone)]
pub struct RequestIdExt(pub String);

/// Set by a handler so the access log names the model.
#[derive(Debug, Clone)]
pub struct ModelExt(pub String);

/// Marks a request made in process (a batch's), which needs no API key: clients cannot set it.
#[derive(Debug, Clone, Copy)]
pub struct InProcess;

/// A request body as bytes; over the limit it is a 413 error object.
pub struct Body413(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for Body413 {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::body::Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Self(bytes)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::too_large()),
            Err(e) => Err(ApiError::bad_request(format!("reading the body: {e}"))),
        }
    }
}

/// How the HTTP service runs, besides its state.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Largest request body (413 beyond it).
    pub max_body_bytes: usize,
    /// Largest upload to `POST /v1/files`.
    pub max_file_bytes: usize,
    /// How long shutdown waits for in-flight requests.
    pub grace: Duration,
    /// Serve the Web UI's files at `/`.
    pub webui: bool,
    /// Origins whose pages may call the API (CORS; `*`: any); empty: none.
    pub cors_origins: Vec<String>,
}

/// The routes with their middleware.
pub fn app(state: Arc<AppState>, options: &HttpOptions) -> Router {
    let _ = state.options.set(options.clone());
    let upload = post(batches::create_file).layer(DefaultBodyLimit::max(options.max_file_bytes));
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(chat::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/v1/responses/{id}/input_items", get(responses::input_items))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/messages/batches", post(batches::create_message_batch).get(batches::list_message_batches))
        .route("/v1/messages/batches/{id}", get(batches::message_batch).delete(batches::delete_message_batch))
        .route("/v1/messages/batches/{id}/cancel", post(batches::cancel_message_batch))
        .route("/v1/messages/batches/{id}/results", get(batches::message_batch_results))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/rerank", post(embeddings::rerank))
        .route("/rerank", post(embeddings::rerank))
        .route("/v1/models", get(admin::models))
        .route("/v1/models/{model}", get(admin::model))
        .route("/v1/requests/{id}/cancel", post(admin::cancel))
        .route("/v1/sessions", get(admin::sessions))
        .route("/v1/sessions/{id}", delete(admin::delete_session))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/completion", post(llamacpp::completion))
        .route("/completions", post(llamacpp::completion))
        .route("/infill", post(llamacpp::infill))
        .route("/props", get(llamacpp::props))
        .route("/lora-adapters", get(llamacpp::lora_adapters).post(llamacpp::set_lora_adapters))
        .route("/v1/files", upload.get(batches::list_files))
        .route("/v1/files/{id}", get(batches::file).delete(batches::delete_file))
        .route("/v1/files/{id}/content", get(batches::file_content))
        .route("/v1/batches", post(batches::create_batch).get(batches::list_batches))
        .route("/v1/batches/{id}", get(batches::batch))
        .route("/v1/batches/{id}/cancel", post(batches::cancel_batch))
        .route("/tokenize", post(admin::tokenize))
        .route("/detokenize", post(admin::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let mut open = Router::new().route("/health", get(admin::health)).route("/metrics", get(admin::metrics));
    if options.webui {
        open = open.merge(webui::routes());
    }
    let mut routes = api
        .merge(open)
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(options.max_body_bytes));
    if !options.cors_origins.is_empty() {
        let allowed = cors::Cors::new(options.cors_origins.clone());
        routes = routes.layer(middleware::from_fn_with_state(allowed, cors::cors));
    }
    routes.layer(middleware::from_fn_with_state(state.clone(), access)).with_state(state)
}

/// API keys, when configured: `Authorization: Bearer KEY` (OpenAI, Ollama) or `x-api-key: KEY`
/// (Anthropic); refusals in the route's dialect.
async fn auth(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if state.api_keys.is_empty() || req.extensions().get::<InProcess>().is_some() {
        return next.run(req).await;
    }
    let given = {
        let header = |name| req.headers().get(name).and_then(|v: &HeaderValue| v.to_str().ok());
        let bearer = header(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
        bearer.or(header(HeaderName::from_static("x-api-key"))).map(|k| k.trim().to_string())
    };
    let shape = ErrorShape::of_path(req.uri().path());
    match given {
        Some(key) if state.api_keys.contains(&key) => next.run(req).await,
        Some(_) => ApiError::unauthorized("Incorrect API key provided.").response_in(shape),
        None => ApiError::unauthorized("Missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`.")
            .response_in(shape),
    }
}

/// Every request: an id (`x-request-id`, the client's if it sent a sane one), 503 while
/// shutting down, and one log line with id, method, route, model, status and latency.
async fn access(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| state.new_request_id(), str::to_string);
    req.extensions_mut().insert(RequestIdExt(id.clone()));
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let mut response = if state.is_shutting_down() && path != "/health" && path != "/metrics" {
        ApiError::shutting_down().into_response()
    } else {
        next.run(req).await
    };
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    let status = response.status().as_u16();
    let model = response.extensions().get::<ModelExt>().map(|m| m.0.clone());
    let error = response.extensions().get::<ErrorType>().map(|e| e.0);
    let route = route_label(&path);
    state.metrics.http_response(route, status);
    if let Some(error_type) = error {
        state.metrics.request_error(route, error_type);
    }
    tracing::info!(
        request_id = id,
        method = %method,
        path,
        model = model.as_deref().unwrap_or("-"),
        status,
        error_type = error.unwrap_or("-"),
        latency_ms = start.elapsed().as_secs_f64() * 1e3,
        "http request"
    );
    response
}

/// A bounded label for metrics (ids in paths are not labels).
fn route_label(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/responses" => "/v1/responses",
        "/v1/embeddings" => "/v1/embeddings",
        "/v1/rerank" | "/rerank" => "/v1/rerank",
        "/v1/messages" => "/v1/messages",
        "/v1/messages/count_tokens" => "/v1/messages/count_tokens",
        p if p.starts_with("/v1/messages/batches") => "/v1/messages/batches",
        "/v1/models" => "/v1/models",
        "/health" => "/health",
        "/metrics" => "/metrics",
        "/tokenize" => "/tokenize",
        "/detokenize" => "/detokenize",
        "/props" => "/props",
        p if p.starts_with("/v1/requests/") => "/v1/requests/{id}/cancel",
        p if p.starts_with("/v1/sessions") => "/v1/sessions",
        p if p.starts_with("/v1/responses/") => "/v1/responses/{id}",
        "/v1/files" => "/v1/files",
        p if p.starts_with("/v1/files/") => "/v1/files/{id}",
        "/v1/batches" => "/v1/batches",
        p if p.starts_with("/v1/batches/") => "/v1/batches/{id}",
        "/api/chat" => "/api/chat",
        "/api/generate" => "/api/generate",
        "/api/embed" | "/api/embeddings" => "/api/embed",
        p if p.starts_with("/api/") => "/api/other",
        p if p.starts_with("/v1/models/") => "/v1/models/{model}",
        p if p == "/" || p.starts_with("/ui/") => "webui",
        _ => "other",
    }
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    state: Arc<AppState>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    grace: Duration,
}

impl Server {
    /// Binds `addr` and serves `state` until `shutdown`.
    pub async fn start(state: AppState, addr: SocketAddr, options: HttpOptions) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(state);
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let app = app(state.clone(), &options);
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        });
        Ok(Self { addr, state, stop, task, grace: options.grace })
    }

    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Graceful shutdown: new requests get 503 at once; in-flight ones finish (for at most the
    /// grace period); then the listener closes and the engines drain and stop.
    pub async fn shutdown(self) {
        self.state.shutting_down.store(true, Ordering::SeqCst);
        let drained = tokio::time::timeout(self.grace, async {
            while self.state.admission.in_use() > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!("shutdown grace period over with requests still running; they are cancelled");
        }
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(1), &mut task).await.is_err() {
            task.abort(); // dropping the connections cancels what still runs
        }
        self.state.engines.shutdown().await;
    }
}

/// `top_k` where 0 or less turns it off (Ollama's and llama.cpp's), as the engine's `Some(0)`.
fn top_k_off_at_zero(k: Option<i64>) -> Option<usize> {
    k.map(|k| k.max(0) as usize)
}

/// A dialect's count of alternatives per token (`n` in its field `param`): 0 to
/// [`MAX_TOP_LOGPROBS`], or an error naming the field.
fn alternatives(param: &str, n: i64) -> Result<usize, ApiError> {
    let message = || format!("{param} must be in [0, {MAX_TOP_LOGPROBS}], got {n}");
    usize::try_from(n).ok().filter(|n| *n <= MAX_TOP_LOGPROBS).ok_or_else(|| ApiError::invalid(param, message()))
}

/// Attaches the model name for the access log.
pub fn with_model(mut response: Response, model: &str) -> Response {
    response.extensions_mut().insert(ModelExt(model.into()));
    response
}

/// A JSON response.
pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], Body::from(value.to_string())).into_response()
}
