//! `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI JSON translated into the
//! engine's `ChatRequest` / `CompletionRequest` (the same path a host application takes), and
//! the answer in OpenAI's shapes: one object, or `chat.completion.chunk` / `text_completion`
//! chunks ending with `data: [DONE]`.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::response::Response;
use llaisys_actors::request::{FinishReason, ToolCallDelta, ToolCallOut};
use llaisys_actors::{ChatRequest, CompletionRequest, Options};
use serde_json::{Value, json};

use super::dialect::{Dialect, Frame, Run, Work, endpoint};
use super::error::{ApiError, ErrorShape};
use super::generation::{Generation, Step, TokenLogprob};
use super::openai;
use super::{AppState, Body413, RequestIdExt};

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    body: Result<Body413, ApiError>,
) -> Response {
    let model_of = |r: &openai::ChatRequest| r.common.model.clone();
    endpoint(ErrorShape::OpenAi, body, openai::parse_request, model_of, async |req| {
        chat(&state, &request_id, req).await
    })
    .await
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
    let mut options = plan.options;
    options.tools = tools;
    options.tool_choice = tool_choice;
    options.parallel_tool_calls = req.parallel_tool_calls;
    options.chat_template_kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(effort) = &req.reasoning_effort {
        reasoning_effort(effort, "reasoning_effort", &mut options.chat_template_kwargs)?;
    }
    options.thinking_budget = match req.thinking_token_budget {
        Some(b) if b < 0 => {
            let msg = format!("thinking_token_budget must be at least 0, got {b}");
            return Err(ApiError::invalid("thinking_token_budget", msg));
        }
        b => b.map(|b| b as usize),
    };
    let prompt_logprobs = options.prompt_logprobs;
    let request = ChatRequest::new(openai::chat_messages(state, &model, &req.messages).await?).options(options);
    let dialect = OpenAi {
        api: Api::Chat,
        id: String::new(),
        include_usage: plan.include_usage,
        echo_logprobs: None,
        prompt_logprobs,
        token_ids: req.common.return_token_ids.then(Vec::new),
        echo_only: false,
    };
    let run =
        Run { state, request_id, model, stream: plan.stream, constraint_field: plan.constraint_field, echo: false };
    run.run(Work::Chat(request), dialect).await
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    body: Result<Body413, ApiError>,
) -> Response {
    let model_of = |r: &openai::CompletionRequest| r.common.model.clone();
    let handle = async |req| completion(&state, &request_id, req).await.map_err(rename_logprobs);
    endpoint(ErrorShape::OpenAi, body, openai::parse_request, model_of, handle).await
}

async fn completion(
    state: &Arc<AppState>,
    request_id: &str,
    req: openai::CompletionRequest,
) -> Result<Response, ApiError> {
    let model = state.model(&req.common.model)?;
    let prompts = req.prompts()?;
    let logprobs = match req.logprobs {
        Some(k) if k < 0 => {
            return Err(ApiError::invalid("logprobs", format!("logprobs must be in [0, 20], got {k}")));
        }
        k => k.map(|k| k as usize),
    };
    if let Some(b) = req.best_of.filter(|b| *b != req.common.n.unwrap_or(1)) {
        return Err(ApiError::invalid("best_of", format!("best_of other than n is not supported (got {b})")));
    }
    // `max_tokens: 0` with `echo`: the prompt alone (scored, with `logprobs`), as OpenAI's legacy
    // completions and vLLM answer it; the one token the engine generates is not shown.
    let echo_only = req.echo && req.common.max_tokens == Some(0);
    let plan = req.common.plan(if echo_only { Some(1) } else { req.common.max_tokens }, logprobs)?;
    // An echoed prompt comes with its tokens' log-probabilities where they are asked for (the
    // way lm-evaluation-harness scores a continuation's likelihood).
    let echo_logprobs = logprobs.filter(|_| req.echo);
    let prompt_logprobs = plan.options.prompt_logprobs;
    // OpenAI's completions default to 16 tokens.
    let options =
        Options { default_max_tokens: Some(16), prompt_logprobs: echo_logprobs.max(prompt_logprobs), ..plan.options };
    let request = CompletionRequest::batch(prompts).options(options);
    let include_usage = plan.include_usage;
    let token_ids = req.common.return_token_ids.then(Vec::new);
    let dialect = OpenAi {
        api: Api::Completion,
        id: String::new(),
        include_usage,
        echo_logprobs,
        prompt_logprobs,
        token_ids,
        echo_only,
    };
    let run =
        Run { state, request_id, model, stream: plan.stream, constraint_field: plan.constraint_field, echo: req.echo };
    run.run(Work::Completion(request), dialect).await
}

/// Completions call the alternatives' count `logprobs` (chat: `top_logprobs`).
fn rename_logprobs(mut e: ApiError) -> ApiError {
    if e.param.as_deref() == Some("top_logprobs") {
        e.param = Some("logprobs".into());
    }
    e
}

/// Which of OpenAI's two generation APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
}

/// OpenAI's chat-completion and completion shapes.
struct OpenAi {
    api: Api,
    /// `chatcmpl-…` / `cmpl-…`, set when the generation starts.
    id: String,
    /// `stream_options.include_usage`: a last chunk with the usage and no choices.
    include_usage: bool,
    /// Completions with `echo` and `logprobs` (their count): the echoed prompt has its tokens'
    /// log-probabilities, which come with the first token (a stream sends the echo then).
    echo_logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs` (their count; not in a stream): a completion's choices and a
    /// chat's answer carry them.
    prompt_logprobs: Option<usize>,
    /// vLLM's `return_token_ids`: each choice's `token_ids` and its prompt's
    /// (`prompt_token_ids`: a completion choice's, a chat answer's); streamed, each chunk with
    /// the tokens since the last (how many went out, per choice) and the first with the prompt's.
    token_ids: Option<Vec<usize>>,
    /// Completions with `echo` and `max_tokens: 0`: the echoed prompt alone (no token of its
    /// own: finish `length`, no completion tokens counted).
    echo_only: bool,
}

impl OpenAi {
    fn id(&mut self, g: &Generation) -> String {
        if self.id.is_empty() {
            let prefix = match self.api {
                Api::Chat => "chatcmpl-",
                Api::Completion => "cmpl-",
            };
            self.id = format!("{prefix}{}", g.request_id);
        }
        self.id.clone()
    }

    /// The fields every response object and chunk carries.
    fn envelope(&mut self, g: &Generation, object: &str, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id(g),
            "object": object,
            "created": g.created,
            "model": g.model(),
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    /// The `object` of a streamed chunk.
    fn chunk_object(&self) -> &'static str {
        match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        }
    }

    fn chunk(&mut self, g: &Generation, choices: Vec<Value>) -> Frame {
        let object = self.chunk_object();
        Frame::data(&self.envelope(g, object, choices))
    }

    /// The chunk for `text` (and this step's logprobs) of choice `i`, finishing it if `finish`.
    fn delta(
        &mut self,
        g: &Generation,
        i: usize,
        text: &str,
        logprobs: Option<&[TokenLogprob]>,
        finish: Option<FinishReason>,
    ) -> Frame {
        let mut choice = match self.api {
            Api::Chat => json!({
                "index": i,
                "delta": if text.is_empty() && finish.is_some() { json!({}) } else { json!({"content": text}) },
                "logprobs": logprobs.map(chat_logprobs),
                "finish_reason": finish.map(|f| f.as_str()),
            }),
            Api::Completion => json!({
                "index": i,
                "text": text,
                "logprobs": logprobs.map(|l| completion_logprobs(None, l, 0)),
                "finish_reason": finish.map(|f| f.as_str()),
            }),
        };
        if finish.is_some() {
            // vLLM's: the stop string that ended the choice, or null.
            let stop = g.answer().choices()[i].stop.clone().filter(|_| !self.echo_only);
            choice["stop_reason"] = stop.into();
        }
        if let Some(sent) = &mut self.token_ids {
            sent.resize(sent.len().max(i + 1), usize::MAX);
            let tokens: &[u32] = if self.echo_only { &[] } else { &g.answer().choices()[i].tokens };
            if sent[i] == usize::MAX && self.api == Api::Completion {
                choice["prompt_token_ids"] = g.prompt_ids(i).into();
            }
            let from = if sent[i] == usize::MAX { 0 } else { sent[i] };
            choice["token_ids"] = tokens[from.min(tokens.len())..].into();
            sent[i] = tokens.len();
        }
        self.chunk(g, vec![choice])
    }

    /// A piece of choice `i`'s reasoning, as `reasoning_content` (DeepSeek's and vLLM's
    /// name) and `reasoning` (vLLM's newer one).
    fn reasoning_delta(&mut self, g: &Generation, i: usize, reasoning: &str) -> Frame {
        let delta = json!({"reasoning_content": reasoning, "reasoning": reasoning});
        self.chunk(g, vec![json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": null})])
    }

    /// A piece of choice `i`'s tool call: id, type and name once (the OpenAI SDK concatenates
    /// repeated strings), then argument pieces.
    fn tool_call_delta(&mut self, g: &Generation, i: usize, d: &ToolCallDelta) -> Frame {
        let mut function = serde_json::Map::new();
        if let Some(name) = &d.name {
            function.insert("name".into(), name.clone().into());
        }
        function.insert("arguments".into(), d.arguments.clone().into());
        let mut call = json!({"index": d.index, "function": function});
        if let Some(id) = &d.id {
            call["id"] = id.clone().into();
            call["type"] = "function".into();
        }
        let delta = json!({"tool_calls": [call]});
        self.chunk(g, vec![json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": null})])
    }

    fn usage(&self, g: &Generation) -> Value {
        let usage = g.answer().usage();
        let completion_tokens = if self.echo_only { 0 } else { usage.completion_tokens };
        json!({
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": usage.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        })
    }
}

impl Dialect for OpenAi {
    const SHAPE: ErrorShape = ErrorShape::OpenAi;

    fn body(&mut self, g: &Generation) -> Value {
        let choices: Vec<Value> = (g.answer().choices().iter().enumerate())
            .map(|(i, c)| {
                let finish = c.finish.as_str();
                let logprobs = g.logprobs().map(|_| g.logprobs_of(i, 0));
                match self.api {
                    Api::Chat => {
                        let mut choice = json!({
                            "index": i,
                            "message": chat_message(&c.text, &c.reasoning, &c.tool_calls),
                            "logprobs": logprobs.as_deref().map(chat_logprobs),
                            "finish_reason": finish,
                            "stop_reason": c.stop,
                        });
                        if self.token_ids.is_some() {
                            choice["token_ids"] = c.tokens.clone().into();
                        }
                        choice
                    }
                    Api::Completion => {
                        let echo = g.echo(i).unwrap_or("");
                        let prompt = self.echo_logprobs.and_then(|n| g.prompt_logprobs_of(i, n));
                        let (text, generated, finish) = match self.echo_only {
                            true => ("", &[][..], FinishReason::Length.as_str()),
                            false => (c.text.as_str(), logprobs.as_deref().unwrap_or_default(), finish),
                        };
                        let mut choice = json!({
                            "index": i,
                            "text": format!("{echo}{text}"),
                            "logprobs": logprobs.as_ref().map(|_| completion_logprobs(prompt.as_ref(), generated, echo.len())),
                            "finish_reason": finish,
                            "stop_reason": if self.echo_only { None } else { c.stop.clone() },
                        });
                        if let Some(n) = self.prompt_logprobs {
                            choice["prompt_logprobs"] = vllm_prompt_logprobs(g.prompt_logprobs_of(i, n));
                        }
                        if self.token_ids.is_some() {
                            choice["token_ids"] = if self.echo_only { vec![] } else { c.tokens.clone() }.into();
                            choice["prompt_token_ids"] = g.prompt_ids(i).into();
                        }
                        choice
                    }
                }
            })
            .collect();
        let object = match self.api {
            Api::Chat => "chat.completion",
            Api::Completion => "text_completion",
        };
        let mut body = self.envelope(g, object, choices);
        body["usage"] = self.usage(g);
        if let (Api::Chat, Some(n)) = (self.api, self.prompt_logprobs) {
            // vLLM's place for a chat's: the answer's (its choices share the prompt).
            body["prompt_logprobs"] = vllm_prompt_logprobs(g.prompt_logprobs_of(0, n));
        }
        if let (Api::Chat, Some(_)) = (self.api, &self.token_ids) {
            body["prompt_token_ids"] = g.prompt_ids(0).into();
        }
        body
    }

    fn open(&mut self, g: &Generation) -> Vec<Frame> {
        (0..g.choices())
            .filter_map(|i| match self.api {
                Api::Chat => {
                    let delta = json!({"role": "assistant", "content": ""});
                    let choice = json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": null});
                    let mut chunk = self.envelope(g, self.chunk_object(), vec![choice]);
                    if self.token_ids.is_some() {
                        // vLLM's: the first chunk has the prompt's ids.
                        chunk["prompt_token_ids"] = g.prompt_ids(i).into();
                    }
                    Some(Frame::data(&chunk))
                }
                Api::Completion if self.echo_logprobs.is_some() => None,
                Api::Completion => g.echo(i).map(|echo| self.delta(g, i, echo, None, None)),
            })
            .collect()
    }

    fn step(&mut self, g: &Generation, step: &Step) -> Vec<Frame> {
        let i = step.choice;
        let mut frames = Vec::new();
        if !step.reasoning.is_empty() {
            frames.push(self.reasoning_delta(g, i, &step.reasoning));
        }
        for d in &step.tool_calls {
            frames.push(self.tool_call_delta(g, i, d));
        }
        match step.finish {
            Some(FinishReason::Error) => frames.push(Frame::data(&g.engine_error().body())),
            // The echo alone: the token's text and reason are not the client's.
            Some(_) if self.echo_only => frames.push(self.delta(g, i, "", None, Some(FinishReason::Length))),
            Some(f) => frames.push(self.delta(g, i, &step.text, None, Some(f))),
            None if step.token && (!step.text.is_empty() || g.logprobs().is_some()) => {
                if let Some(n) = self.echo_logprobs.filter(|_| g.first_token(i)) {
                    // The echo, now that its log-probabilities have come with the first token.
                    let logprobs = completion_logprobs(g.prompt_logprobs_of(i, n).as_ref(), &[], 0);
                    let echo = g.echo(i).unwrap_or("");
                    let choice = json!({"index": i, "text": echo, "logprobs": logprobs, "finish_reason": null});
                    frames.push(self.chunk(g, vec![choice]));
                }
                if !self.echo_only {
                    let lp = g.logprobs().map(|_| g.logprobs_of(i, step.logprobs_from));
                    frames.push(self.delta(g, i, &step.text, lp.as_deref(), None));
                }
            }
            None => {}
        }
        frames
    }

    fn close(&mut self, g: &Generation) -> Vec<Frame> {
        let mut frames = Vec::new();
        if self.include_usage {
            let object = self.chunk_object();
            let mut body = self.envelope(g, object, vec![]);
            body["usage"] = self.usage(g);
            frames.push(Frame::data(&body));
        }
        frames.push(Frame { event: None, data: "[DONE]".into() });
        frames
    }
}

/// A chat answer's message: content `null` when it only called tools or only thought; a
/// reasoning model's thinking as `reasoning_content` and `reasoning`.
fn chat_message(text: &str, reasoning: &str, calls: &[ToolCallOut]) -> Value {
    let mut message = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        message["reasoning_content"] = reasoning.into();
        message["reasoning"] = reasoning.into();
    }
    if (!calls.is_empty() || !reasoning.is_empty()) && text.is_empty() {
        message["content"] = Value::Null;
    }
    if !calls.is_empty() {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        message["tool_calls"] = calls.into();
    }
    message
}

fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    json!({"content": tokens.iter().map(TokenLogprob::openai).collect::<Vec<_>>()})
}

/// Completions' legacy shape; `offset` is where the generated text starts (after an echo).
/// With the `prompt`'s log-probabilities (its first token, which has none, and the others') its
/// tokens come first, from offset 0; the first's log-probability and alternatives are null.
fn completion_logprobs(
    prompt: Option<&(TokenLogprob, Vec<TokenLogprob>)>,
    tokens: &[TokenLogprob],
    offset: usize,
) -> Value {
    let (first, rest) = match prompt {
        Some((first, rest)) => (Some(first), &rest[..]),
        None => (None, &[][..]),
    };
    let all: Vec<&TokenLogprob> = first.into_iter().chain(rest).chain(tokens).collect();
    let mut text_offset = Vec::with_capacity(all.len());
    let mut at = if first.is_some() { 0 } else { offset };
    for t in &all {
        text_offset.push(at);
        at += t.token.len();
    }
    let skip = usize::from(first.is_some());
    let nulls = || std::iter::repeat_n(Value::Null, skip);
    let top = |t: &&TokenLogprob| {
        json!(t.top.iter().map(|a| (a.token.clone(), json!(a.logprob))).collect::<serde_json::Map<_, _>>())
    };
    json!({
        "tokens": all.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": nulls().chain(all[skip..].iter().map(|t| json!(t.logprob))).collect::<Vec<_>>(),
        "top_logprobs": nulls().chain(all[skip..].iter().map(top)).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}

/// vLLM's `prompt_logprobs`: null for the first token (nothing comes before it), then for each
/// other a map from token ids to their `logprob`, `rank` and `decoded_token`: the prompt
/// token's, and its most likely alternatives' (ranks 1 on).
fn vllm_prompt_logprobs(prompt: Option<(TokenLogprob, Vec<TokenLogprob>)>) -> Value {
    let Some((_, rest)) = prompt else { return Value::Null };
    let entry =
        |t: &TokenLogprob, rank: Option<u32>| json!({"logprob": t.logprob, "rank": rank, "decoded_token": t.token});
    let rows = rest.iter().map(|t| {
        let mut row = serde_json::Map::new();
        row.insert(t.id.to_string(), entry(t, t.rank));
        for (k, a) in t.top.iter().enumerate() {
            row.entry(a.id.to_string()).or_insert_with(|| entry(a, Some(k as u32 + 1)));
        }
        Value::Object(row)
    });
    std::iter::once(Value::Null).chain(rows).collect::<Vec<_>>().into()
}

/// OpenAI's reasoning effort (`param` names the field) as chat-template variables, where the
/// request's own do not set them: `none` turns a reasoning model's thinking off
/// (`enable_thinking`); the others turn it on and go to templates that read a level
/// (`reasoning_effort`: gpt-oss's low, medium or high).
pub(crate) fn reasoning_effort(
    effort: &str,
    param: &str,
    kwargs: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<(), ApiError> {
    let (thinking, level) = match effort {
        "none" => (false, None),
        "minimal" | "low" => (true, Some("low")),
        "medium" => (true, Some("medium")),
        "high" | "xhigh" => (true, Some("high")),
        other => {
            let msg = format!("{other:?} is not an effort (none, minimal, low, medium, high)");
            return Err(ApiError::invalid(param, msg));
        }
    };
    kwargs.entry("enable_thinking").or_insert(thinking.into());
    if let Some(level) = level {
        kwargs.entry("reasoning_effort").or_insert(level.into());
    }
    Ok(())
}
