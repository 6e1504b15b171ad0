//! OpenAI's Batch API over its Files API: `POST /v1/files` (a JSONL file of requests, `purpose:
//! batch`), `POST /v1/batches` runs it in the background through the server's own routes
//! (`crate::batch`, as `llaisys run-batch` does), `GET /v1/batches/{id}` follows it, and its
//! answers come back as files (`output_file_id`: those answered 200; `error_file_id`: the
//! others), read with `GET /v1/files/{id}/content`. Files live in memory, `server.stored_files_bytes`
//! of them at most (uploads past it are refused; answers are always kept), until deleted or the
//! server stops.

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

use super::error::ApiError;
use super::generation::unix_now;
use super::{AppState, Body413, json_response, openai};

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
    let cancel = Arc::new(AtomicBool::new(false));
    let batch = Batch {
        id: format!("batch_{}", random_id()),
        endpoint: req.endpoint,
        input_file_id: req.input_file_id,
        completion_window: req.completion_window,
        metadata: req.metadata.map_or(Value::Null, Value::Object),
        status: "validating",
        created_at: unix_now(),
        times: HashMap::new(),
        output_file_id: None,
        error_file_id: None,
        counts: (0, 0, 0),
        errors: Vec::new(),
        cancel: cancel.clone(),
    };
    let (object, id, endpoint) = (batch.object(), batch.id.clone(), batch.endpoint.clone());
    state.batches.lock().batches.push_front(batch);
    tokio::spawn(run(state.clone(), id, endpoint, input, cancel));
    Ok(json_response(StatusCode::OK, &object))
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
    let answers = futures_util::stream::iter(lines)
        .take_while(|_: &(usize, String)| std::future::ready(!cancel.load(Ordering::SeqCst)))
        .map(|(n, text): (usize, String)| {
            let app = app.clone();
            async move { crate::batch::answer(&app, n, &text).await }
        })
        .buffered(width);
    let mut answers = std::pin::pin!(answers);
    let (mut output, mut errors) = (Vec::new(), Vec::new());
    while let Some(answer) = answers.next().await {
        let ok = answer["response"]["status_code"] == 200;
        let into = if ok { &mut output } else { &mut errors };
        into.extend_from_slice(format!("{answer}\n").as_bytes());
        store.with_batch(&id, |b| if ok { b.counts.1 += 1 } else { b.counts.2 += 1 });
    }
    store.with_batch(&id, |b| b.reach("finalizing"));
    let keep = |content: Vec<u8>, kind: &str| {
        (!content.is_empty())
            .then(|| store.put_file(format!("{id}_{kind}.jsonl"), "batch_output", content, false))
            .and_then(Result::ok)
            .and_then(|f| f["id"].as_str().map(str::to_string))
    };
    let (output_id, error_id) = (keep(output, "output"), keep(errors, "error"));
    store.with_batch(&id, |b| {
        (b.output_file_id, b.error_file_id) = (output_id, error_id);
        b.reach(if cancel.load(Ordering::SeqCst) { "cancelled" } else { "completed" });
    });
}

/// The input's request lines (numbered from 1), or why the batch fails: each line a request of
/// the batch's endpoint with its own `custom_id`.
fn validate(input: &[u8], endpoint: &str) -> Result<Vec<(usize, String)>, Vec<Value>> {
    let Ok(text) = std::str::from_utf8(input) else {
        return Err(vec![json!({"code": "invalid_file", "message": "the input file is not UTF-8 text", "line": null})]);
    };
    let (mut lines, mut errors, mut ids) = (Vec::new(), Vec::new(), HashSet::new());
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let n = i + 1;
        let mut error = |code: &str, message: String| {
            if errors.len() < MAX_LISTED_ERRORS {
                errors.push(json!({"code": code, "message": message, "param": null, "line": n}));
            }
        };
        let request: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                error("invalid_json_line", format!("line {n} is not JSON: {e}"));
                continue;
            }
        };
        match request.get("custom_id").and_then(Value::as_str) {
            None => error("missing_required_parameter", format!("line {n} has no string `custom_id`")),
            Some(id) if !ids.insert(id.to_string()) => {
                error("duplicate_custom_id", format!("line {n}: custom_id {id:?} is used twice"))
            }
            Some(_) => {}
        }
        if !request.get("method").and_then(Value::as_str).is_some_and(|m| m.eq_ignore_ascii_case("POST")) {
            error("invalid_method", format!("line {n}: `method` must be POST"));
        }
        if request.get("url").and_then(Value::as_str) != Some(endpoint) {
            error("mismatched_endpoint", format!("line {n}: `url` must be the batch's endpoint, {endpoint}"));
        }
        if !request.get("body").is_some_and(Value::is_object) {
            error("invalid_request", format!("line {n}: `body` must be the request's JSON object"));
        }
        lines.push((n, line.to_string()));
    }
    if lines.is_empty() && errors.is_empty() {
        errors.push(json!({"code": "empty_file", "message": "the input file holds no requests", "line": null}));
    }
    if errors.is_empty() { Ok(lines) } else { Err(errors) }
}

/// `GET /v1/batches/{id}`.
pub async fn batch(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let object = state.batches.with_batch(&id, |b| b.object()).ok_or_else(|| no_batch(&id))?;
    Ok(json_response(StatusCode::OK, &object))
}

/// `GET /v1/batches` (`limit`, `after`), newest first.
pub async fn list_batches(
    State(state): State<Arc<AppState>>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let items = state.batches.lock().batches.iter().map(|b| (b.id.clone(), b.object())).collect();
    Ok(json_response(StatusCode::OK, &page(items, &query)?))
}

/// `POST /v1/batches/{id}/cancel`: no further request starts; those running finish, and the
/// answers so far are kept (`cancelling`, then `cancelled`).
pub async fn cancel_batch(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let object = state
        .batches
        .with_batch(&id, |b| {
            if matches!(b.status, "validating" | "in_progress") {
                b.cancel.store(true, Ordering::SeqCst);
                b.reach("cancelling");
            }
            b.object()
        })
        .ok_or_else(|| no_batch(&id))?;
    Ok(json_response(StatusCode::OK, &object))
}
