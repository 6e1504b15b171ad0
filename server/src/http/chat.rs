//! `POST /v1/chat/completions` and `POST /v1/completions`: parse, check, render the prompt,
//! then hand over to `Generation`.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use llaisys_model::tokenizer::ChatMessage;

use super::error::ApiError;
use super::generation::{Api, Generation};
use super::openai::{self, Bounds, ChatRequest, CompletionRequest, Prompt};
use super::{AppState, Body413, ModelEntry, RequestIdExt, with_model};

/// The limits a request of `model` is checked against.
fn bounds(state: &AppState, model: &ModelEntry, default_max_tokens: Option<usize>) -> Bounds {
    let context = model.info.context_length;
    let max_prompt = match state.limits.max_prompt_tokens {
        0 => context - 1,
        n => n.min(context - 1),
    };
    Bounds {
        context,
        max_prompt_tokens: max_prompt,
        max_tokens: state.limits.max_tokens,
        max_n: state.limits.max_n,
        default_max_tokens,
    }
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    Body413(body): Body413,
) -> Response {
    let req: ChatRequest = match openai::parse_request(&body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let name = req.common.model.clone();
    match chat(&state, &request_id, req).await {
        Ok(response) => response,
        Err(e) => with_model(e.into_response(), &name),
    }
}

async fn chat(state: &Arc<AppState>, request_id: &str, req: ChatRequest) -> Result<Response, ApiError> {
    let model = state.model(&req.common.model)?;
    if req.tools.as_ref().is_some_and(|t| !t.is_null()) {
        return Err(ApiError::invalid("tools", "tool calling is not supported by this server"));
    }
    let format = req.response_format.as_ref().filter(|f| !f.is_null());
    if format.is_some_and(|f| f.get("type").and_then(|t| t.as_str()) != Some("text")) {
        return Err(ApiError::invalid("response_format", "only {\"type\": \"text\"} is supported"));
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "developer") {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!("unknown role {:?} (system, user, assistant)", m.role),
            ));
        }
        let role = if m.role == "developer" { "system" } else { m.role.as_str() };
        messages.push(ChatMessage::new(role, m.text(i)?));
    }
    let template = model
        .template
        .as_ref()
        .ok_or_else(|| ApiError::bad_request(format!("the model '{}' has no chat template", model.name)))?;
    let text = template.render(&messages, true).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let prompt = model.tokenizer.encode(&text).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let top_logprobs = match (req.logprobs, req.top_logprobs) {
        (_, Some(k)) if !(0..=20).contains(&k) => {
            return Err(ApiError::invalid("top_logprobs", format!("top_logprobs must be in [0, 20], got {k}")));
        }
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true"));
        }
        (_, k) => k.unwrap_or(0) as usize,
    };
    let max_tokens = req.max_completion_tokens.or(req.common.max_tokens);
    let plan =
        req.common.plan(max_tokens, top_logprobs, prompt.len(), &model.defaults, &bounds(state, &model, None))?;
    let logprobs = req.logprobs.then_some(top_logprobs);
    let session = req.common.session_id.clone();
    let g =
        Generation::start(state, model, Api::Chat, request_id, vec![prompt], &plan, session, logprobs, false).await?;
    Ok(if plan.stream { g.stream() } else { g.respond().await })
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    Body413(body): Body413,
) -> Response {
    let req: CompletionRequest = match openai::parse_request(&body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let name = req.common.model.clone();
    match completion(&state, &request_id, req).await {
        Ok(response) => response,
        Err(e) => with_model(e.into_response(), &name),
    }
}

async fn completion(state: &Arc<AppState>, request_id: &str, req: CompletionRequest) -> Result<Response, ApiError> {
    let model = state.model(&req.common.model)?;
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix (fill-in-the-middle) is not supported"));
    }
    let encode = |text: &str| model.tokenizer.encode(text).map_err(|e| ApiError::invalid("prompt", e.to_string()));
    let prompts: Vec<Vec<u32>> = match &req.prompt {
        Prompt::Text(t) => vec![encode(t)?],
        Prompt::Texts(ts) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        Prompt::Ids(ids) => vec![ids.clone()],
        Prompt::IdLists(lists) => lists.clone(),
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt list is empty"));
    }
    let vocab = model.info.vocab_size;
    if let Some(bad) = prompts.iter().flatten().find(|t| **t as usize >= vocab) {
        return Err(ApiError::invalid("prompt", format!("token id {bad} is not below the vocabulary size {vocab}")));
    }
    let top_logprobs = match req.logprobs {
        None => None,
        Some(k) if (0..=20).contains(&k) => Some(k as usize),
        Some(k) => return Err(ApiError::invalid("logprobs", format!("logprobs must be in [0, 20], got {k}"))),
    };
    if let Some(b) = req.best_of.filter(|b| *b != req.common.n.unwrap_or(1)) {
        return Err(ApiError::invalid("best_of", format!("best_of other than n is not supported (got {b})")));
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
    let longest = if shortest == 0 { 0 } else { longest };
    // OpenAI's completions default to 16 tokens.
    let bounds = bounds(state, &model, Some(16));
    let plan = req.common.plan(req.common.max_tokens, top_logprobs.unwrap_or(0), longest, &model.defaults, &bounds)?;
    let session = req.common.session_id.clone();
    let g =
        Generation::start(state, model, Api::Completion, request_id, prompts, &plan, session, top_logprobs, req.echo)
            .await?;
    Ok(if plan.stream { g.stream() } else { g.respond().await })
}
