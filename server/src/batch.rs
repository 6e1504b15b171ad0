//! OpenAI's batch format, as `llaisys run-batch` (vLLM's `run-batch`) takes it: JSONL lines, each
//! `{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions", "body": {...}}`, answered
//! through the server's own routes in process (every endpoint, check and limit of the HTTP API:
//! chat, completions, embeddings, responses, rerank, the other dialects), each answer a line
//! `{"id": "batch_req_...", "custom_id": ..., "response": {"status_code", "request_id", "body"},
//! "error": null}`. A line that is not a request of that shape answers `response: null` with
//! an `error` saying why; a refused request answers its status and the route's error body, as
//! OpenAI's batch outputs do.

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, header};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::http::InProcess;

/// A line of the batch format that is a request.
#[derive(Debug, Clone)]
pub struct Line {
    pub custom_id: String,
    /// The route, such as `/v1/chat/completions`.
    pub url: String,
    /// The request's JSON object, not streamed.
    pub body: Value,
}

/// Why a line is not a request of the batch format.
#[derive(Debug)]
pub struct Fault {
    /// The line's `custom_id`, where it has one.
    pub custom_id: Option<Value>,
    /// OpenAI's code for it (`invalid_json_line`, `missing_required_parameter`, ...).
    pub code: &'static str,
    pub message: String,
}

/// Reads input line `line` (its number counting from 1, for messages): a request of the
/// batch format, or its first fault.
pub fn parse(line: usize, text: &str) -> Result<Line, Fault> {
    let fault = |custom_id: Option<Value>, code, message: String| Fault { custom_id, code, message };
    let request: Value = serde_json::from_str(text)
        .map_err(|e| fault(None, "invalid_json_line", format!("line {line} is not JSON: {e}")))?;
    let given = request.get("custom_id").cloned();
    let refuse = |code, message: &str| fault(given.clone(), code, format!("line {line}: {message}"));
    let Some(Value::String(custom_id)) = &given else {
        return Err(refuse("missing_required_parameter", "`custom_id` must be a string"));
    };
    match request.get("method").and_then(Value::as_str) {
        Some(m) if m.eq_ignore_ascii_case("POST") => {}
        Some(m) => return Err(refuse("invalid_method", &format!("method {m} is not batched: only POST"))),
        None => return Err(refuse("invalid_method", "`method` is missing (POST)")),
    }
    let Some(url) = request.get("url").and_then(Value::as_str).filter(|u| u.starts_with('/')) else {
        return Err(refuse("invalid_url", "`url` must be a route of this server, such as /v1/chat/completions"));
    };
    let Some(body @ Value::Object(fields)) = request.get("body") else {
        return Err(refuse("invalid_request", "`body` must be the request's JSON object"));
    };
    if fields.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(refuse("invalid_request", "`stream` is not batched: each answer is one JSON body"));
    }
    Ok(Line { custom_id: custom_id.clone(), url: url.into(), body: body.clone() })
}

/// The answer line of input line `line` (its number counting from 1, for messages).
pub async fn answer(app: &Router, line: usize, text: &str) -> Value {
    match parse(line, text) {
        Ok(request) => send(app, &request).await,
        Err(fault) => failed(fault.custom_id, fault.message),
    }
}

/// The answer line of a request: its status and the route's body.
pub async fn send(app: &Router, request: &Line) -> Value {
    let Line { custom_id, url, body } = request;
    let http = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header(header::CONTENT_TYPE, "application/json")
        .extension(InProcess)
        .body(Body::from(body.to_string()));
    let http = match http {
        Ok(r) => r,
        Err(e) => return failed(Some(custom_id.as_str().into()), format!("`url` {url:?}: {e}")),
    };
    let response = app.clone().oneshot(http).await.unwrap_or_else(|never| match never {});
    let status = response.status().as_u16();
    let request_id = response.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let bytes = match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(b) => b,
        Err(e) => return failed(Some(custom_id.as_str().into()), format!("the answer could not be read: {e}")),
    };
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    json!({
        "id": format!("batch_req_{request_id}"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": null,
    })
}

/// The answer line of a line that is no request.
fn failed(custom_id: Option<Value>, message: String) -> Value {
    json!({
        "id": format!("batch_req_{:016x}", rand::random::<u64>()),
        "custom_id": custom_id.unwrap_or(Value::Null),
        "response": null,
        "error": {"code": "invalid_request", "message": message},
    })
}
