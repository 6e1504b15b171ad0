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

/// The answer line of input line `line` (its number counting from 1, for messages).
pub async fn answer(app: &Router, line: usize, text: &str) -> Value {
    let request: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return failed(None, format!("line {line} is not JSON: {e}")),
    };
    let custom_id = request.get("custom_id").cloned();
    let refuse = |message: String| failed(custom_id.clone(), format!("line {line}: {message}"));
    let Some(Value::String(_)) = &custom_id else {
        return refuse("`custom_id` must be a string".into());
    };
    match request.get("method").and_then(Value::as_str) {
        Some(m) if m.eq_ignore_ascii_case("POST") => {}
        Some(m) => return refuse(format!("method {m} is not batched: only POST")),
        None => return refuse("`method` is missing (POST)".into()),
    }
    let Some(url) = request.get("url").and_then(Value::as_str).filter(|u| u.starts_with('/')) else {
        return refuse("`url` must be a route of this server, such as /v1/chat/completions".into());
    };
    let Some(body @ Value::Object(fields)) = request.get("body") else {
        return refuse("`body` must be the request's JSON object".into());
    };
    if fields.get("stream").and_then(Value::as_bool) == Some(true) {
        return refuse("`stream` is not batched: each answer is one JSON body".into());
    }
    let http = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header(header::CONTENT_TYPE, "application/json")
        .extension(InProcess)
        .body(Body::from(body.to_string()));
    let http = match http {
        Ok(r) => r,
        Err(e) => return refuse(format!("`url` {url:?}: {e}")),
    };
    let response = app.clone().oneshot(http).await.unwrap_or_else(|never| match never {});
    let status = response.status().as_u16();
    let request_id = response.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let bytes = match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(b) => b,
        Err(e) => return refuse(format!("the answer could not be read: {e}")),
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
