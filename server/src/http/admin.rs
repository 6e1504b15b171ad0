//! The endpoints around generation: models, health, metrics, cancel, sessions, tokenize.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::openai::{self, ChatMessageIn};
use super::{AppState, Body413, ModelEntry, json_response};

/// A served model as OpenAI lists it, with vLLM's `max_model_len`, what it takes in
/// (`input_modalities`, OpenRouter's name: `text`, and `image` for a model that sees images), and
/// the LoRA adapters merged into its weights (`adapters`: path and scale, in order) where it has
/// any.
fn model_object(m: &ModelEntry) -> Value {
    let inputs: &[&str] = if m.info().vision.is_some() { &["text", "image"] } else { &["text"] };
    let mut model = json!({
        "id": m.name,
        "object": "model",
        "created": m.engine.started_at(),
        "owned_by": "llaisys",
        "max_model_len": m.info().context_length,
        "input_modalities": inputs,
    });
    let adapters = m.adapters();
    if !adapters.is_empty() {
        model["adapters"] = adapters.into();
    }
    model
}

pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<Value> = state.models().map(|m| model_object(&m)).collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

pub async fn model(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let m = state.model(&name)?;
    Ok(json_response(StatusCode::OK, &model_object(&m)))
}

/// 200 while the engines answer; 503 while shutting down or if an engine does not.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.is_shutting_down() {
        return ApiError::shutting_down().into_response();
    }
    let unavailable = ApiError::unavailable;
    let mut nodes = std::collections::BTreeSet::new();
    for m in state.models() {
        match m.engine.replica_stats().await {
            Err(e) => return unavailable(e.to_string()).into_response(),
            // A cluster's front is healthy while some node serves.
            Ok(replicas) if m.engine.is_cluster_front() => {
                if replicas.is_empty() {
                    return unavailable(format!("no node of the cluster serves model '{}'", m.name)).into_response();
                }
                nodes.extend(replicas.into_iter().map(|r| r.node));
            }
            Ok(_) => {}
        }
    }
    if nodes.is_empty() {
        json_response(StatusCode::OK, &json!({"status": "ok"}))
    } else {
        json_response(StatusCode::OK, &json!({"status": "ok", "nodes": nodes}))
    }
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut engines = Vec::new();
    for (name, engine) in state.engines.iter() {
        if let Ok(replicas) = engine.replica_stats().await {
            engines.push((name, replicas));
        }
    }
    let text = state.metrics.render(&engines);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// Cancels a generation request by its `x-request-id` or its completion id; it then ends with
/// finish reason `abort`.
pub async fn cancel(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let key = id.strip_prefix("chatcmpl-").or_else(|| id.strip_prefix("cmpl-")).unwrap_or(&id);
    if state.cancel(key).await {
        Ok(json_response(StatusCode::OK, &json!({"id": id, "cancelled": true})))
    } else {
        Err(ApiError::not_found(format!("no running request with id '{id}'")))
    }
}

#[derive(Deserialize)]
pub struct ModelQuery {
    model: Option<String>,
}

pub async fn sessions(State(state): State<Arc<AppState>>, Query(q): Query<ModelQuery>) -> Result<Response, ApiError> {
    let mut data = Vec::new();
    for m in state.models().filter(|m| q.model.as_deref().is_none_or(|n| n == m.name)) {
        for s in m.engine.sessions().await? {
            data.push(json!({
                "id": s.id,
                "object": "session",
                "model": m.name,
                "requests": s.requests,
                "active_requests": s.active,
                "idle_seconds": s.idle.as_secs_f64(),
                "cached_tokens": s.cached_tokens,
            }));
        }
    }
    if let Some(name) = &q.model {
        state.model(name)?;
    }
    Ok(json_response(StatusCode::OK, &json!({"object": "list", "data": data})))
}

/// Ends a session in every model that has it and frees its cells.
pub async fn delete_session(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<ModelQuery>,
) -> Result<Response, ApiError> {
    let mut deleted = false;
    for m in state.models().filter(|m| q.model.as_deref().is_none_or(|n| n == m.name)) {
        deleted |= m.engine.delete_session(&id).await?;
    }
    if !deleted {
        return Err(ApiError::not_found(format!("no session with id '{id}'")));
    }
    Ok(json_response(StatusCode::OK, &json!({"id": id, "object": "session", "deleted": true})))
}

#[derive(Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessageIn>>,
    #[serde(default = "yes")]
    add_generation_prompt: bool,
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

fn yes() -> bool {
    true
}

/// `{"prompt": text}` or `{"messages": [...]}` (rendered with the chat template) → token ids.
pub async fn tokenize(State(state): State<Arc<AppState>>, Body413(body): Body413) -> Result<Response, ApiError> {
    let req: TokenizeRequest = openai::parse(&body)?;
    let m = state.model_or_default(req.model.as_deref())?;
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), None) => m.tokenizer()?.encode(p).map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
        (None, Some(msgs)) => {
            // The same rendering a chat request gets.
            let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
            let messages = openai::chat_messages(&state, &m, msgs).await?;
            m.engine.frontend().render_chat(&messages, &[], &kwargs, req.add_generation_prompt)?
        }
        _ => return Err(ApiError::bad_request("give exactly one of `prompt` and `messages`")),
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({"tokens": tokens, "count": tokens.len(), "max_model_len": m.info().context_length}),
    ))
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

pub async fn detokenize(State(state): State<Arc<AppState>>, Body413(body): Body413) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = openai::parse(&body)?;
    let m = state.model_or_default(req.model.as_deref())?;
    if let Some(bad) = req.tokens.iter().find(|t| **t as usize >= m.info().vocab_size) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} is not below the vocabulary size {}", m.info().vocab_size),
        ));
    }
    let text = m.tokenizer()?.decode(&req.tokens, false).map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(json_response(StatusCode::OK, &json!({"prompt": text})))
}
