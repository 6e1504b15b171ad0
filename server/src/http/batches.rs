//! Batches of requests run in the background through the server's own routes (`crate::batch`,
//! as `llaisys run-batch` does), in two dialects over one store:
//! - OpenAI's Batch API over its Files API: `POST /v1/files` (a JSONL file of requests, `purpose:
//!   batch`), `POST /v1/batches` runs it, `GET /v1/batches/{id}` follows it, and its answers come
//!   back as files (`output_file_id`: those answered 200; `error_file_id`: the others), read with
//!   `GET /v1/files/{id}/content`. Files live in memory, `server.stored_files_bytes` of them at
//!   most (uploads past it are refused; answers are always kept), until deleted or the server
//!   stops.
//! - Anthropic's Message Batches: `POST /v1/messages/batches` with the requests inline
//!   (`custom_id`, `params`), `GET /v1/messages/batches/{id}` to follow, `.../results` for each
//!   request's result (`succeeded` with its message, `errored`, or `canceled`), `cancel`, list and
//!   `DELETE` once ended.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{AnthropicError, ApiError};
use super::generation::unix_now;
use super::ollama::rfc3339;
use super::{AppState, Body413, json_response, openai};
use crate::batch::Line;

/// The routes a batch may run (OpenAI's, and the other dialects' generation routes).
const ENDPOINTS: [&str; 6] =
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages", "/v1/rerank"];
/// Validation errors listed in a failed batch.
const MAX_LISTED_ERRORS: usize = 100;

/// Stored files and batches, newest first.
pub struct BatchStore {
    max_bytes: usize,
    inner: Mutex<Stores>,
}

#[derive(Default)]
struct Stores {
    files: VecDeque<StoredFile>,
    batches: VecDeque<Batch>,
    /// Bytes of the stored files.
    bytes: usize,
}

struct StoredFile {
    id: String,
    filename: String,
    purpose: String,
    created_at: u64,
    content: Arc<Vec<u8>>,
}

impl StoredFile {
    fn object(&self) -> Value {
        json!({
            "id": self.id, "object": "file", "bytes": self.content.len(), "created_at": self.created_at,
            "expires_at": null, "filename": self.filename, "purpose": self.purpose, "status": "processed",
            "status_details": null,
        })
    }
}

struct Batch {
    /// Anthropic's Message Batch (its shapes, its results kept in `results`), else OpenAI's.
    anthropic: bool,
    id: String,
    endpoint: String,
    input_file_id: String,
    completion_window: String,
    metadata: Value,
    status: &'static str,
    created_at: u64,
    /// When each status was reached (`in_progress_at`, `completed_at`, ...).
    times: HashMap<&'static str, u64>,
    output_file_id: Option<String>,
    error_file_id: Option<String>,
    counts: (usize, usize, usize),
    errors: Vec<Value>,
    cancel: Arc<AtomicBool>,
    /// An Anthropic batch's results, once it has ended.
    results: Option<Arc<Vec<u8>>>,
}

impl Batch {
    fn object(&self) -> Value {
        let at = |status: &str| self.times.get(status).copied();
        let errors = (!self.errors.is_empty()).then(|| json!({"object": "list", "data": self.errors}));
        json!({
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": errors,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.created_at, "in_progress_at": at("in_progress"),
            "expires_at": self.created_at + 24 * 3600, "finalizing_at": at("finalizing"),
            "completed_at": at("completed"), "failed_at": at("failed"), "expired_at": null,
            "cancelling_at": at("cancelling"), "cancelled_at": at("cancelled"),
            "request_counts": {"total": self.counts.0, "completed": self.counts.1, "failed": self.counts.2},
            "metadata": self.metadata,
        })
    }

    /// Anthropic's Message Batch object.
    fn anthropic_object(&self) -> Value {
        let at = |status: &str| self.times.get(status).map(|t| rfc3339(*t));
        let ended = matches!(self.status, "completed" | "cancelled" | "failed");
        let processing_status = match self.status {
            _ if ended => "ended",
            "cancelling" => "canceling",
            _ => "in_progress",
        };
        let (total, succeeded, errored) = self.counts;
        let canceled = if ended { total - succeeded - errored } else { 0 };
        json!({
            "id": self.id, "type": "message_batch", "processing_status": processing_status,
            "request_counts": {"processing": total - succeeded - errored - canceled, "succeeded": succeeded,
                               "errored": errored, "canceled": canceled, "expired": 0},
            "ended_at": at("completed").or(at("cancelled")), "created_at": rfc3339(self.created_at),
            "expires_at": rfc3339(self.created_at + 24 * 3600), "archived_at": null,
            "cancel_initiated_at": at("cancelling"),
            "results_url": ended.then(|| format!("/v1/messages/batches/{}/results", self.id)),
        })
    }

    fn reach(&mut self, status: &'static str) {
        self.status = status;
        self.times.insert(status, unix_now());
    }
}

impl BatchStore {
    pub fn new(max_bytes: usize) -> Self {
        Self { max_bytes, inner: Mutex::new(Stores::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stores> {
        self.inner.lock().expect("batch store lock")
    }

    /// Keeps a file; `limit`: refused when the stored files would pass `max_bytes`.
    fn put_file(&self, filename: String, purpose: &str, content: Vec<u8>, limit: bool) -> Result<Value, ApiError> {
        let mut stores = self.lock();
        if limit && stores.bytes + content.len() > self.max_bytes {
            return Err(ApiError::files_full(format!(
                "the server keeps at most {} bytes of files (server.stored_files_bytes) and holds {}: delete some",
                self.max_bytes, stores.bytes
            )));
        }
        let id = format!("file-{}", random_id());
        let file =
            StoredFile { id, filename, purpose: purpose.into(), created_at: unix_now(), content: Arc::new(content) };
        let object = file.object();
        stores.bytes += file.content.len();
        stores.files.push_front(file);
        Ok(object)
    }

    fn with_batch<T>(&self, id: &str, f: impl FnOnce(&mut Batch) -> T) -> Option<T> {
        self.lock().batches.iter_mut().find(|b| b.id == id).map(f)
    }

    /// Cancels batch `id` of the dialect (no further request starts); its object, `None` if
    /// there is no such batch.
    fn cancel(&self, id: &str, anthropic: bool) -> Option<Value> {
        self.with_batch(id, |b| {
            if b.anthropic != anthropic {
                return None;
            }
            if matches!(b.status, "validating" | "in_progress") {
                b.cancel.store(true, Ordering::SeqCst);
                b.reach("cancelling");
            }
            Some(if anthropic { b.anthropic_object() } else { b.object() })
        })
        .flatten()
    }
}

fn random_id() -> String {
    format!("{:024x}", rand::random::<u128>() >> 32)
}

fn no_file(id: &str) -> ApiError {
    ApiError::not_found(format!("No such File object: {id}")).with_param("file_id")
}

fn no_batch(id: &str) -> ApiError {
    ApiError::not_found(format!("No such Batch object: {id}")).with_param("batch_id")
}

/// `POST /v1/files`: multipart form data with `file` and `purpose` (`batch`).
pub async fn create_file(State(state): State<Arc<AppState>>, mut form: Multipart) -> Result<Response, ApiError> {
    let (mut file, mut purpose) = (None, None);
    let bad = |e: axum::extract::multipart::MultipartError| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::files_full("the upload is larger than the server keeps (server.stored_files_bytes)")
        }
        _ => ApiError::bad_request(format!("the form: {e}")),
    };
    while let Some(field) = form.next_field().await.map_err(bad)? {
        match field.name() {
            Some("file") => {
                let name = field.file_name().unwrap_or("file.jsonl").to_string();
                file = Some((name, field.bytes().await.map_err(bad)?.to_vec()));
            }
            Some("purpose") => purpose = Some(field.text().await.map_err(bad)?),
            _ => {}
        }
    }
    let Some((filename, content)) = file else {
        return Err(ApiError::invalid("file", "the form has no `file` field"));
    };
    match purpose.as_deref() {
        Some("batch") => {}
        Some(other) => {
            let message = format!("purpose {other:?} is not kept by this server: only \"batch\" files are");
            return Err(ApiError::invalid("purpose", message));
        }
        None => return Err(ApiError::invalid("purpose", "the form has no `purpose` field (batch)")),
    }
    let object = state.batches.put_file(filename, "batch", content, true)?;
    Ok(json_response(StatusCode::OK, &object))
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
    purpose: Option<String>,
}

/// A page of `items` (newest first) after the one with id `after`.
fn page(items: Vec<(String, Value)>, query: &ListQuery) -> Result<Value, ApiError> {
    let limit = query.limit.unwrap_or(20);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("limit must be between 1 and 10000, got {limit}")));
    }
    let start = match &query.after {
        Some(after) => items.iter().position(|(id, _)| id == after).map_or(items.len(), |i| i + 1),
        None => 0,
    };
    let rest = &items[start.min(items.len())..];
    let shown = &rest[..limit.min(rest.len())];
    let data: Vec<&Value> = shown.iter().map(|(_, v)| v).collect();
    let (first, last) = (shown.first().map(|(id, _)| id), shown.last().map(|(id, _)| id));
    Ok(json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": rest.len() > limit}))
}

/// `GET /v1/files` (`purpose`, `limit`, `after`).
pub async fn list_files(
    State(state): State<Arc<AppState>>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let stores = state.batches.lock();
    let items = (stores.files.iter())
        .filter(|f| query.purpose.as_ref().is_none_or(|p| *p == f.purpose))
        .map(|f| (f.id.clone(), f.object()))
        .collect();
    drop(stores);
    Ok(json_response(StatusCode::OK, &page(items, &query)?))
}

/// `GET /v1/files/{id}`.
pub async fn file(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let stores = state.batches.lock();
    let file = stores.files.iter().find(|f| f.id == id).ok_or_else(|| no_file(&id))?;
    Ok(json_response(StatusCode::OK, &file.object()))
}

/// `GET /v1/files/{id}/content`: the file's bytes.
pub async fn file_content(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let content = state.batches.lock().files.iter().find(|f| f.id == id).map(|f| f.content.clone());
    let content = content.ok_or_else(|| no_file(&id))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], Body::from(content.as_ref().clone())).into_response())
}

/// `DELETE /v1/files/{id}`.
pub async fn delete_file(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let mut stores = state.batches.lock();
    let i = stores.files.iter().position(|f| f.id == id).ok_or_else(|| no_file(&id))?;
    let file = stores.files.remove(i).expect("found");
    stores.bytes -= file.content.len();
    Ok(json_response(StatusCode::OK, &json!({"id": id, "object": "file", "deleted": true})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    input_file_id: String,
    endpoint: String,
    completion_window: String,
    #[serde(default)]
    metadata: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    output_expires_after: Option<Value>,
}

/// `POST /v1/batches`: checks the input file, then runs its requests in the background.
pub async fn create_batch(
    State(state): State<Arc<AppState>>,
    body: Result<Body413, ApiError>,
) -> Result<Response, ApiError> {
    let req: CreateBatch = openai::parse(&body?.0)?;
    // Answers are kept until deleted.
    let _ = req.output_expires_after;
    if !ENDPOINTS.contains(&req.endpoint.as_str()) {
        let message = format!("endpoint {:?} is not batched here: one of {}", req.endpoint, ENDPOINTS.join(", "));
        return Err(ApiError::invalid("endpoint", message));
    }
    if req.completion_window != "24h" {
        return Err(ApiError::invalid("completion_window", "completion_window must be \"24h\""));
    }
    let input = {
        let stores = state.batches.lock();
        let file = stores.files.iter().find(|f| f.id == req.input_file_id);
        let file = file.ok_or_else(|| no_file(&req.input_file_id).with_param("input_file_id"))?;
        if file.purpose != "batch" {
            return Err(ApiError::invalid("input_file_id", format!("{} is not a batch file", file.id)));
        }
        file.content.clone()
    };
    let batch = Batch::new(false, req.endpoint, req.input_file_id, req.completion_window, req.metadata);
    let object = batch.object();
    start(&state, batch, input);
    Ok(json_response(StatusCode::OK, &object))
}

impl Batch {
    fn new(
        anthropic: bool,
        endpoint: String,
        input_file_id: String,
        completion_window: String,
        metadata: Option<serde_json::Map<String, Value>>,
    ) -> Self {
        let prefix = if anthropic { "msgbatch" } else { "batch" };
        Batch {
            anthropic,
            id: format!("{prefix}_{}", random_id()),
            endpoint,
            input_file_id,
            completion_window,
            metadata: metadata.map_or(Value::Null, Value::Object),
            status: "validating",
            created_at: unix_now(),
            times: HashMap::new(),
            output_file_id: None,
            error_file_id: None,
            counts: (0, 0, 0),
            errors: Vec::new(),
            cancel: Arc::new(AtomicBool::new(false)),
            results: None,
        }
    }
}

/// Stores `batch` and runs its requests (`input`, JSONL) in the background.
fn start(state: &Arc<AppState>, batch: Batch, input: Arc<Vec<u8>>) {
    let (id, endpoint, cancel) = (batch.id.clone(), batch.endpoint.clone(), batch.cancel.clone());
    state.batches.lock().batches.push_front(batch);
    tokio::spawn(run(state.clone(), id, endpoint, input, cancel));
}

/// Validates a batch's lines, answers them in order through the routes, and stores the answers.
async fn run(state: Arc<AppState>, id: String, endpoint: String, input: Arc<Vec<u8>>, cancel: Arc<AtomicBool>) {
    let store = &state.batches;
    let lines = match validate(&input, &endpoint) {
        Ok(lines) => lines,
        Err(errors) => {
            store.with_batch(&id, |b| {
                b.errors = errors;
                b.reach("failed");
            });
            return;
        }
    };
    store.with_batch(&id, |b| {
        b.counts.0 = lines.len();
        if b.status == "validating" {
            b.reach("in_progress");
        }
    });
    // Half the engines' places at most, so that requests sent meanwhile still get in.
    let width = (state.limits.max_concurrent_requests / 2).clamp(1, 512);
    let app = super::app(state.clone(), &state.options());
    let lines = Arc::new(lines);
    let answers = futures_util::stream::iter(0..lines.len())
        .take_while(|_: &usize| std::future::ready(!cancel.load(Ordering::SeqCst)))
        .map(|i: usize| {
            let (app, lines) = (app.clone(), lines.clone());
            async move { crate::batch::send(&app, &lines[i]).await }
        })
        .buffered(width);
    let mut answers = std::pin::pin!(answers);
    // Each answer is written out as it comes (in order): OpenAI's into its output or its error
    // file, Anthropic's as its result line.
    let anthropic = store.with_batch(&id, |b| b.anthropic).unwrap_or(false);
    let (mut output, mut errors, mut answered) = (Vec::new(), Vec::new(), 0);
    while let Some(answer) = answers.next().await {
        let ok = answer["response"]["status_code"] == 200;
        store.with_batch(&id, |b| if ok { b.counts.1 += 1 } else { b.counts.2 += 1 });
        let line = if anthropic { anthropic_result(&answer) } else { answer };
        let into = if ok || anthropic { &mut output } else { &mut errors };
        into.extend_from_slice(format!("{line}\n").as_bytes());
        answered += 1;
    }
    store.with_batch(&id, |b| b.reach("finalizing"));
    let (mut output_id, mut error_id, mut results) = (None, None, None);
    if anthropic {
        // Those a cancel kept from starting.
        for line in &lines[answered..] {
            let canceled = json!({"custom_id": line.custom_id, "result": {"type": "canceled"}});
            output.extend_from_slice(format!("{canceled}\n").as_bytes());
        }
        results = Some(Arc::new(output));
    } else {
        let keep = |content: Vec<u8>, kind: &str| {
            (!content.is_empty())
                .then(|| store.put_file(format!("{id}_{kind}.jsonl"), "batch_output", content, false))
                .and_then(Result::ok)
                .and_then(|f| f["id"].as_str().map(str::to_string))
        };
        (output_id, error_id) = (keep(output, "output"), keep(errors, "error"));
    }
    store.with_batch(&id, |b| {
        (b.output_file_id, b.error_file_id, b.results) = (output_id, error_id, results);
        b.reach(if cancel.load(Ordering::SeqCst) { "cancelled" } else { "completed" });
    });
}

/// Anthropic's result line of a request's answer (`crate::batch::answer`'s):
/// `{"custom_id", "result": {"type": "succeeded", "message"} | {"type": "errored", "error"}}`.
fn anthropic_result(answer: &Value) -> Value {
    let response = &answer["response"];
    let result = match response["status_code"].as_u64() {
        Some(200) => json!({"type": "succeeded", "message": response["body"]}),
        Some(_) => json!({"type": "errored", "error": response["body"]}),
        None => json!({"type": "errored", "error": {"type": "error", "error": {
            "type": "invalid_request_error", "message": answer["error"]["message"]}}}),
    };
    json!({"custom_id": answer["custom_id"], "result": result})
}

/// The input's requests, or why the batch fails: each line a request of the batch's endpoint
/// (`crate::batch::parse`: a line's first fault is listed) with its own `custom_id`.
fn validate(input: &[u8], endpoint: &str) -> Result<Vec<Line>, Vec<Value>> {
    let Ok(text) = std::str::from_utf8(input) else {
        return Err(vec![json!({"code": "invalid_file", "message": "the input file is not UTF-8 text", "line": null})]);
    };
    let (mut lines, mut errors, mut ids) = (Vec::new(), Vec::new(), HashSet::new());
    for (i, text) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let n = i + 1;
        let mut error = |code: &str, message: String| {
            if errors.len() < MAX_LISTED_ERRORS {
                errors.push(json!({"code": code, "message": message, "param": null, "line": n}));
            }
        };
        let line = match crate::batch::parse(n, text) {
            Ok(line) => line,
            Err(fault) => {
                error(fault.code, fault.message);
                continue;
            }
        };
        if !ids.insert(line.custom_id.clone()) {
            error("duplicate_custom_id", format!("line {n}: custom_id {:?} is used twice", line.custom_id));
        }
        if line.url != endpoint {
            error("mismatched_endpoint", format!("line {n}: `url` must be the batch's endpoint, {endpoint}"));
        }
        lines.push(line);
    }
    if lines.is_empty() && errors.is_empty() {
        errors.push(json!({"code": "empty_file", "message": "the input file holds no requests", "line": null}));
    }
    if errors.is_empty() { Ok(lines) } else { Err(errors) }
}

/// `GET /v1/batches/{id}`.
pub async fn batch(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let object = state.batches.with_batch(&id, |b| (!b.anthropic).then(|| b.object())).flatten();
    Ok(json_response(StatusCode::OK, &object.ok_or_else(|| no_batch(&id))?))
}

/// `GET /v1/batches` (`limit`, `after`), newest first.
pub async fn list_batches(
    State(state): State<Arc<AppState>>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let stores = state.batches.lock();
    let items = stores.batches.iter().filter(|b| !b.anthropic).map(|b| (b.id.clone(), b.object())).collect();
    drop(stores);
    Ok(json_response(StatusCode::OK, &page(items, &query)?))
}

/// `POST /v1/batches/{id}/cancel`: no further request starts; those running finish, and the
/// answers so far are kept (`cancelling`, then `cancelled`).
pub async fn cancel_batch(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let object = state.batches.cancel(&id, false).ok_or_else(|| no_batch(&id))?;
    Ok(json_response(StatusCode::OK, &object))
}

/// `POST /v1/messages/batches`: Anthropic's requests inline, each `{custom_id, params}`; checked
/// at once (a `custom_id` of 1 to 64 letters, digits, `-` and `_`, given once; `params` an
/// object, not streamed), then run in the background.
pub async fn create_message_batch(
    State(state): State<Arc<AppState>>,
    body: Result<Body413, ApiError>,
) -> Result<Response, AnthropicError> {
    #[derive(Deserialize)]
    struct Create {
        requests: Vec<Value>,
    }
    let create: Create = openai::parse(&body?.0)?;
    if create.requests.is_empty() {
        return Err(ApiError::invalid("requests", "requests must hold at least one request").into());
    }
    let mut input = String::new();
    for (i, r) in create.requests.iter().enumerate() {
        let custom_id = r.get("custom_id").and_then(Value::as_str).unwrap_or("");
        let valid = (1..=64).contains(&custom_id.len())
            && custom_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            let message = format!("requests.{i}.custom_id must be 1 to 64 letters, digits, '-' or '_'");
            return Err(ApiError::invalid(&format!("requests.{i}.custom_id"), message).into());
        }
        let line = json!({"custom_id": custom_id, "method": "POST", "url": "/v1/messages", "body": r.get("params")});
        input.push_str(&format!("{line}\n"));
    }
    if let Err(errors) = validate(input.as_bytes(), "/v1/messages") {
        let message = errors[0]["message"].as_str().unwrap_or("a request is not valid").replace("line ", "request ");
        return Err(ApiError::invalid("requests", message).into());
    }
    let mut batch = Batch::new(true, "/v1/messages".into(), String::new(), "24h".into(), None);
    batch.counts.0 = create.requests.len();
    let object = batch.anthropic_object();
    start(&state, batch, Arc::new(input.into_bytes()));
    Ok(json_response(StatusCode::OK, &object))
}

fn no_message_batch(id: &str) -> ApiError {
    ApiError::not_found(format!("message batch {id} not found")).with_param("message_batch_id")
}

/// `GET /v1/messages/batches/{id}`.
pub async fn message_batch(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, AnthropicError> {
    let object = state.batches.with_batch(&id, |b| b.anthropic.then(|| b.anthropic_object())).flatten();
    Ok(json_response(StatusCode::OK, &object.ok_or_else(|| no_message_batch(&id))?))
}

#[derive(Debug, Deserialize)]
pub struct MessageListQuery {
    limit: Option<usize>,
    after_id: Option<String>,
    before_id: Option<String>,
}

/// `GET /v1/messages/batches` (`limit`, `after_id`, `before_id`), newest first.
pub async fn list_message_batches(
    State(state): State<Arc<AppState>>,
    Query(query): Query<MessageListQuery>,
) -> Result<Response, AnthropicError> {
    let stores = state.batches.lock();
    let mut items: Vec<(String, Value)> =
        stores.batches.iter().filter(|b| b.anthropic).map(|b| (b.id.clone(), b.anthropic_object())).collect();
    drop(stores);
    if let Some(before) = &query.before_id {
        items.truncate(items.iter().position(|(id, _)| id == before).unwrap_or(0));
        items.reverse();
    }
    let after = query.after_id.clone();
    let mut listed = page(items, &ListQuery { limit: query.limit, after, purpose: None })?;
    if query.before_id.is_some() {
        let data = listed["data"].as_array_mut().expect("a page's data");
        data.reverse();
        let first = data.first().map(|b| b["id"].clone());
        let last = data.last().map(|b| b["id"].clone());
        (listed["first_id"], listed["last_id"]) = (first.unwrap_or(Value::Null), last.unwrap_or(Value::Null));
    }
    listed.as_object_mut().expect("a page").remove("object");
    Ok(json_response(StatusCode::OK, &listed))
}

/// `POST /v1/messages/batches/{id}/cancel`.
pub async fn cancel_message_batch(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, AnthropicError> {
    let object = state.batches.cancel(&id, true).ok_or_else(|| no_message_batch(&id))?;
    Ok(json_response(StatusCode::OK, &object))
}

/// `GET /v1/messages/batches/{id}/results`: a JSON line per request, once the batch has ended.
pub async fn message_batch_results(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, AnthropicError> {
    let results = state.batches.with_batch(&id, |b| b.anthropic.then(|| b.results.clone())).flatten();
    let results = results.ok_or_else(|| no_message_batch(&id))?;
    let results = results
        .ok_or_else(|| ApiError::bad_request(format!("message batch {id} has not ended: its results are not ready")))?;
    Ok(([(header::CONTENT_TYPE, "application/x-jsonl")], Body::from(results.as_ref().clone())).into_response())
}

/// `DELETE /v1/messages/batches/{id}`: a batch that has ended.
pub async fn delete_message_batch(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, AnthropicError> {
    let mut stores = state.batches.lock();
    let i = stores.batches.iter().position(|b| b.anthropic && b.id == id).ok_or_else(|| no_message_batch(&id))?;
    if stores.batches[i].results.is_none() {
        let message = format!("message batch {id} is still processing: cancel it, then delete it once it has ended");
        return Err(ApiError::bad_request(message).into());
    }
    stores.batches.remove(i);
    Ok(json_response(StatusCode::OK, &json!({"id": id, "type": "message_batch_deleted"})))
}
