//! `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI JSON translated into the
//! engine's `ChatRequest` / `CompletionRequest`, which the engine checks and renders (the same
//! path a host application takes); then admission and `Generation`.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use llaisys_actors::{ChatRequest, CompletionRequest, Prompt as EnginePrompt, ToolChoice};

use super::error::ApiError;
use super::generation::{Api, Generation};
use super::openai::{self, Prompt};
use super::{AppState, Body413, RequestIdExt, with_model};

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    Body413(body): Body413,
) -> Response {
    let req: openai::ChatRequest = match openai::parse_request(&body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let name = req.common.model.clone();
    match chat(&state, &request_id, req).await {
        Ok(response) => response,
        Err(e) => with_model(e.into_response(), &name),
    }
}

async fn chat(state: &Arc<AppState>, request_id: &str, req: openai::ChatRequest) -> Result<Response, ApiError> {
    let model = state.model(&req.common.model)?;
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (_, Some(k)) if k < 0 => {
            return Err(ApiError::invalid("top_logprobs", format!("top_logprobs must be in [0, 20], got {k}")));
        }
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true"));
        }
        (false, _) => None,
        (true, k) => Some(k.unwrap_or(0) as usize),
    };
    let plan = req
        .common
        .plan(req.max_completion_tokens.or(req.common.max_tokens), logprobs)?
        .with_response_format(req.response_format.as_ref())?;
    let (tools, tool_choice) = openai::tools(&req)?;
    let mut options = plan.options.clone();
    options.tools = tools;
    options.tool_choice = tool_choice;
    options.parallel_tool_calls = req.parallel_tool_calls;
    options.chat_template_kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    let offers_tools = !options.tools.is_empty() && options.tool_choice != Some(ToolChoice::None);
    let request = ChatRequest::new(openai::messages(&req.messages)?).options(options);
    let valid = model.engine.prepare_chat(&request).map_err(|e| plan.api_error(e))?;
    plan.count_constraint(state, &model.name);
    if offers_tools {
        state.metrics.constrained_request(&model.name, "tools");
    }
    let g = Generation::start(state, model, Api::Chat, request_id, valid, plan.include_usage, false).await?;
    Ok(if plan.stream { g.stream() } else { g.respond().await })
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    Body413(body): Body413,
) -> Response {
    let req: openai::CompletionRequest = match openai::parse_request(&body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let name = req.common.model.clone();
    match completion(&state, &request_id, req).await {
        Ok(response) => response,
        Err(e) => with_model(e.into_response(), &name),
    }
}

async fn completion(
    state: &Arc<AppState>,
    request_id: &str,
    req: openai::CompletionRequest,
) -> Result<Response, ApiError> {
    let model = state.model(&req.common.model)?;
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix (fill-in-the-middle) is not supported"));
    }
    let prompts: Vec<EnginePrompt> = match req.prompt {
        Prompt::Text(t) => vec![t.into()],
        Prompt::Texts(ts) => ts.into_iter().map(EnginePrompt::from).collect(),
        Prompt::Ids(ids) => vec![ids.into()],
        Prompt::IdLists(lists) => lists.into_iter().map(EnginePrompt::from).collect(),
    };
    let logprobs = match req.logprobs {
        Some(k) if k < 0 => {
            return Err(ApiError::invalid("logprobs", format!("logprobs must be in [0, 20], got {k}")));
        }
        k => k.map(|k| k as usize),
    };
    if let Some(b) = req.best_of.filter(|b| *b != req.common.n.unwrap_or(1)) {
        return Err(ApiError::invalid("best_of", format!("best_of other than n is not supported (got {b})")));
    }
    let plan = req.common.plan(req.common.max_tokens, logprobs)?;
    let request = CompletionRequest::batch(prompts).options(plan.options.clone());
    let valid = model.engine.prepare_completion(&request).map_err(|e| rename_logprobs(plan.api_error(e)))?;
    plan.count_constraint(state, &model.name);
    let g = Generation::start(state, model, Api::Completion, request_id, valid, plan.include_usage, req.echo).await?;
    Ok(if plan.stream { g.stream() } else { g.respond().await })
}

/// Completions call the alternatives' count `logprobs` (chat: `top_logprobs`).
fn rename_logprobs(mut e: ApiError) -> ApiError {
    if e.param.as_deref() == Some("top_logprobs") {
        e.param = Some("logprobs".into());
    }
    e
}
