//! OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`, and
//! `GET /v1/responses/{id}/input_items`. Input as a string or as items (messages,
//! `function_call` and `function_call_output`; `reasoning` items of earlier turns are dropped,
//! as the chat templates drop earlier reasoning), `instructions`, function `tools` and
//! `tool_choice`, `text.format`, `reasoning.effort` (`none` turns a reasoning model's thinking
//! off), output-text log-probabilities; the answer as a `response` with `reasoning`, `message`
//! and `function_call` items, or as its typed stream events. A stored response (`store`, the
//! default) continues with `previous_response_id`: its conversation is kept here (a bounded
//! store, oldest dropped first) and its chain is one engine session, so the prefix stays cached.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use llaisys_actors::request::{FinishReason, ToolCallOut};
use llaisys_actors::{ChatRequest, Options, Tool, ToolChoice};
use llaisys_model::Constraint;
use llaisys_model::tokenizer::{ChatMessage, ToolCall};
use serde::Deserialize;
use serde_json::{Value, json};

use super::dialect::{Dialect, Frame, Run, Work, endpoint};
use super::error::{ApiError, ErrorShape};
use super::generation::{Generation, Step};
use super::openai::{parse, tool_choice_mode};
use super::{AppState, Body413, RequestIdExt, images, json_response};

/// A `POST /v1/responses` body.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    model: String,
    input: Input,
    instructions: Option<String>,
    #[serde(default)]
    tools: Vec<ToolIn>,
    tool_choice: Option<ToolChoiceIn>,
    parallel_tool_calls: Option<bool>,
    text: Option<TextConfig>,
    max_output_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_logprobs: Option<i64>,
    #[serde(default)]
    include: Vec<String>,
    #[serde(default)]
    stream: bool,
    previous_response_id: Option<String>,
    store: Option<bool>,
    reasoning: Option<ReasoningIn>,
    metadata: Option<serde_json::Map<String, Value>>,
    user: Option<String>,
    truncation: Option<String>,
}

/// A string, or a list of items.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<Value>),
}

#[derive(Debug, Deserialize)]
struct ToolIn {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    description: Option<String>,
    parameters: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ToolChoiceIn {
    Mode(String),
    Named {
        #[serde(rename = "type")]
        kind: String,
        name: Option<String>,
    },
}

#[derive(Debug, Deserialize)]
struct TextConfig {
    format: Option<Format>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Format {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        schema: Value,
        #[serde(default)]
        strict: Option<bool>,
    },
}

#[derive(Debug, Deserialize)]
struct ReasoningIn {
    effort: Option<String>,
}

/// A stored response: what `GET` returns, and the conversation a continuation extends.
pub struct Stored {
    response: Value,
    input_items: Vec<Value>,
    /// The conversation through this response's output (without `instructions`, which a
    /// continuation does not inherit).
    conversation: Vec<ChatMessage>,
    /// The engine session of the chain.
    session: String,
}

/// The stored responses, oldest dropped beyond the capacity (`server.stored_responses`).
pub struct ResponseStore {
    capacity: usize,
    inner: Mutex<Entries>,
}

/// The stored responses by id, and their ids oldest first.
#[derive(Default)]
struct Entries {
    by_id: HashMap<String, Arc<Stored>>,
    order: VecDeque<String>,
}

impl ResponseStore {
    pub fn new(capacity: usize) -> Self {
        Self { capacity, inner: Mutex::new(Entries::default()) }
    }

    fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.inner.lock().expect("response store lock").by_id.get(id).cloned()
    }

    fn put(&self, id: String, stored: Stored) {
        if self.capacity == 0 {
            return;
        }
        let mut entries = self.inner.lock().expect("response store lock");
        if entries.by_id.insert(id.clone(), Arc::new(stored)).is_none() {
            entries.order.push_back(id);
        }
        while entries.by_id.len() > self.capacity {
            let Some(old) = entries.order.pop_front() else { break };
            entries.by_id.remove(&old);
        }
    }

    fn remove(&self, id: &str) -> bool {
        let mut entries = self.inner.lock().expect("response store lock");
        entries.order.retain(|o| o != id);
        entries.by_id.remove(id).is_some()
    }
}

pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    body: Result<Body413, ApiError>,
) -> Response {
    let model_of = |r: &ResponsesRequest| r.model.clone();
    endpoint(ErrorShape::OpenAi, body, ResponsesRequest::parse, model_of, async |req| {
        generate(&state, &request_id, req).await
    })
    .await
}

async fn generate(state: &Arc<AppState>, request_id: &str, req: ResponsesRequest) -> Result<Response, ApiError> {
    let model = state.model(&req.model)?;
    let previous = match &req.previous_response_id {
        None => None,
        Some(id) => Some(state.responses.get(id).ok_or_else(|| {
            ApiError::invalid("previous_response_id", format!("no stored response with id '{id}'"))
                .with_code("previous_response_not_found")
        })?),
    };
    let earlier = previous.as_ref().map_or(&[][..], |p| &p.conversation[..]);
    let (mut request, mut conversation, pending) = req.chat_request(earlier)?;
    // The input's images, prepared once: in the conversation stored and in the request.
    if !pending.is_empty() {
        images::attach(&state.fetcher, &model, &mut conversation, pending).await?;
        let before = request.input.len() - conversation.len();
        request.input.truncate(before);
        request.input.extend(conversation.iter().cloned());
    }
    let store = req.store.unwrap_or(true);
    let response_id = format!("resp_{request_id}");
    // The chain is one session, so each turn computes only its new tokens.
    let session = match &previous {
        Some(p) => p.session.clone(),
        None => response_id.clone(),
    };
    request.options.session = store.then(|| session.clone());
    let dialect = Responses {
        state: state.clone(),
        id: response_id,
        echo: req.echo(store),
        store: store.then(|| (req.input_items(), conversation, session)),
        stream: Stream::default(),
    };
    let run = Run { state, request_id, model, stream: req.stream, constraint_field: Some("text.format"), echo: false };
    run.run(Work::Chat(request), dialect).await
}

impl ResponsesRequest {
    /// Parses a body (errors name the field).
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        parse(body)
    }

    /// The input as items (a string is one user message).
    fn input_items(&self) -> Vec<Value> {
        match &self.input {
            Input::Text(text) => vec![json!({"type": "message", "role": "user", "content": text})],
            Input::Items(items) => items.clone(),
        }
    }

    /// The request in the engine's terms, continuing the conversation `earlier` (a stored
    /// response's); also the conversation through this input, to store with the answer, and the
    /// input's images (not prepared yet; their messages counted in that conversation).
    pub fn chat_request(
        &self,
        earlier: &[ChatMessage],
    ) -> Result<(ChatRequest, Vec<ChatMessage>, Vec<images::Pending>), ApiError> {
        let req = self;
        let mut conversation = earlier.to_vec();
        let mut pending = Vec::new();
        conversation.extend(items(&req.input_items(), earlier.len(), &mut pending)?);
        let mut messages = Vec::new();
        if let Some(instructions) = &req.instructions {
            messages.push(message("system", instructions.clone()));
        }
        messages.extend(conversation.iter().cloned());
        let max_tokens = match req.max_output_tokens {
            Some(m) if m < 1 => {
                return Err(ApiError::invalid(
                    "max_output_tokens",
                    format!("max_output_tokens must be at least 1, got {m}"),
                ));
            }
            m => m.map(|m| m as usize),
        };
        let logprobs = match (req.include.iter().any(|i| i == "message.output_text.logprobs"), req.top_logprobs) {
            (_, Some(k)) if !(0..=20).contains(&k) => {
                return Err(ApiError::invalid("top_logprobs", format!("top_logprobs must be in [0, 20], got {k}")));
            }
            (true, k) => Some(k.unwrap_or(0) as usize),
            (false, Some(k)) if k > 0 => Some(k as usize),
            (false, _) => None,
        };
        if let Some(unknown) = req
            .include
            .iter()
            .find(|i| !matches!(i.as_str(), "message.output_text.logprobs" | "reasoning.encrypted_content"))
        {
            return Err(ApiError::invalid("include", format!("{unknown:?} cannot be included by this server")));
        }
        if let Some(t) = req.truncation.as_deref().filter(|t| !matches!(*t, "disabled" | "auto")) {
            return Err(ApiError::invalid("truncation", format!("{t:?} is not a truncation (disabled, auto)")));
        }
        let (tools, tool_choice) = tools(&req.tools, req.tool_choice.as_ref())?;
        let constraint = match req.text.as_ref().and_then(|t| t.format.as_ref()) {
            None | Some(Format::Text) => None,
            Some(Format::JsonObject) => Some(Constraint::JsonObject),
            Some(Format::JsonSchema { name, schema, strict }) => {
                if name.is_empty() {
                    return Err(ApiError::invalid("text.format.name", "the name must not be empty"));
                }
                Some(Constraint::JsonSchema { schema: schema.clone(), strict: strict.unwrap_or(false) })
            }
        };
        let mut kwargs = serde_json::Map::new();
        if let Some(effort) = req.reasoning.as_ref().and_then(|r| r.effort.as_deref()) {
            super::chat::reasoning_effort(effort, "reasoning.effort", &mut kwargs)?;
        }
        let options = Options {
            max_tokens,
            temperature: req.temperature,
            top_p: req.top_p,
            logprobs,
            constraint,
            tools,
            tool_choice,
            parallel_tool_calls: req.parallel_tool_calls,
            chat_template_kwargs: kwargs,
            ..Options::default()
        };
        Ok((ChatRequest::new(messages).options(options), conversation, pending))
    }

    /// The request's settings as the response object repeats them.
    fn echo(&self, store: bool) -> Value {
        let req = self;
        json!({
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata.clone().unwrap_or_default(),
            "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.as_ref().and_then(|r| r.effort.clone()), "summary": null},
            "store": store,
            "temperature": req.temperature,
            "text": {"format": req.text.as_ref().and_then(|t| t.format.as_ref()).map_or(json!({"type": "text"}), format_json)},
            "tool_choice": tool_choice_json(req.tool_choice.as_ref()),
            "tools": req.tools.iter().map(tool_json).collect::<Vec<_>>(),
            "top_logprobs": req.top_logprobs,
            "top_p": req.top_p,
            "truncation": req.truncation.as_deref().unwrap_or("disabled"),
            "user": req.user,
        })
    }
}

pub async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let stored = state.responses.get(&id).ok_or_else(|| not_found(&id))?;
    Ok(json_response(StatusCode::OK, &stored.response))
}

pub async fn input_items(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let stored = state.responses.get(&id).ok_or_else(|| not_found(&id))?;
    let data: Vec<Value> = (stored.input_items.iter().enumerate())
        .map(|(i, item)| {
            let mut item = item.clone();
            if item.get("id").is_none() {
                item["id"] = format!("{id}_in_{i}").into();
            }
            if item.get("type").is_none() {
                item["type"] = "message".into();
            }
            item
        })
        .collect();
    let (first, last) = (data.first().map(|i| i["id"].clone()), data.last().map(|i| i["id"].clone()));
    Ok(json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": false}),
    ))
}

pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if !state.responses.remove(&id) {
        return Err(not_found(&id));
    }
    Ok(json_response(StatusCode::OK, &json!({"id": id, "object": "response.deleted", "deleted": true})))
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no stored response with id '{id}'"))
}

fn message(role: &str, content: String) -> ChatMessage {
    ChatMessage::new(role, content)
}

/// Input items as chat messages: consecutive `function_call` items join the assistant turn
/// before them. A message's `input_image` parts are added to `images`, their messages counted
/// from `first`.
fn items(items: &[Value], first: usize, images: &mut Vec<images::Pending>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out: Vec<ChatMessage> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let field = |name: &str| -> Result<String, ApiError> {
            match item.get(name) {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(ApiError::invalid(&format!("{at}.{name}"), format!("`{at}.{name}` must be a string"))),
            }
        };
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = field("role")?;
                if !matches!(role.as_str(), "user" | "system" | "developer" | "assistant") {
                    return Err(ApiError::invalid(
                        &format!("{at}.role"),
                        format!("{role:?} is not a role (user, system, developer, assistant)"),
                    ));
                }
                let text =
                    content_text(item.get("content"), &format!("{at}.content"), Some((first + out.len(), images)))?;
                out.push(message(&role, text));
            }
            "function_call" => {
                let call = ToolCall { id: field("call_id")?, name: field("name")?, arguments: field("arguments")? };
                match out.last_mut() {
                    Some(last) if last.role == "assistant" => last.tool_calls.push(call),
                    _ => out.push(ChatMessage { tool_calls: vec![call], ..message("assistant", String::new()) }),
                }
            }
            "function_call_output" => {
                let output = content_text(item.get("output"), &format!("{at}.output"), None)?;
                out.push(ChatMessage { tool_call_id: Some(field("call_id")?), ..message("tool", output) });
            }
            "reasoning" => {}
            other => {
                return Err(ApiError::invalid(
                    &format!("{at}.type"),
                    format!(
                        "input items of type {other:?} are not supported (message, function_call, function_call_output, reasoning)"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// A message's content: a string, or text parts (`input_text`, `output_text`) joined; with
/// `images` (its message's index, and where they go), `input_image` parts where they stand.
fn content_text(
    content: Option<&Value>,
    at: &str,
    mut images: Option<(usize, &mut Vec<images::Pending>)>,
) -> Result<String, ApiError> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, part.get("text").and_then(Value::as_str), &mut images) {
                    ("input_text" | "output_text" | "text", Some(t), _) => text.push_str(t),
                    ("input_image", _, Some((message, found))) => {
                        let param = format!("{at}[{j}].image_url");
                        let Some(url) = part.get("image_url").and_then(Value::as_str) else {
                            let reason =
                                "an input_image needs its image_url (a data: or http(s) URL); file_id is not taken";
                            return Err(ApiError::invalid(&param, reason));
                        };
                        let data = images::from_url(url, &param)?;
                        found.push(images::Pending { message: *message, at: text.len(), data, param });
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{at}[{j}]"),
                            format!(
                                "content parts of type {kind:?} are not supported here (input_text, output_text, \
                                 input_image in messages)"
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid(at, format!("`{at}` must be a string or a list of text parts"))),
    }
}

fn tools(tools: &[ToolIn], choice: Option<&ToolChoiceIn>) -> Result<(Vec<Tool>, Option<ToolChoice>), ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::invalid(
                &format!("tools[{i}].type"),
                format!("tools of type {:?} are not supported (function only)", t.kind),
            ));
        }
        let Some(name) = t.name.clone() else {
            return Err(ApiError::invalid(&format!("tools[{i}].name"), "a function tool needs a name"));
        };
        let parameters = t.parameters.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        out.push(Tool { name, description: t.description.clone(), parameters });
    }
    let choice = match choice {
        None => None,
        Some(ToolChoiceIn::Mode(m)) => Some(tool_choice_mode(m)?),
        Some(ToolChoiceIn::Named { kind, name }) => match (kind.as_str(), name) {
            ("function", Some(name)) => Some(ToolChoice::Function(name.clone())),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "a named tool_choice is {\"type\": \"function\", \"name\": ...}",
                ));
            }
        },
    };
    Ok((out, choice))
}

fn tool_json(t: &ToolIn) -> Value {
    json!({"type": t.kind, "name": t.name, "description": t.description, "parameters": t.parameters, "strict": false})
}

fn tool_choice_json(choice: Option<&ToolChoiceIn>) -> Value {
    match choice {
        None => "auto".into(),
        Some(ToolChoiceIn::Mode(m)) => m.clone().into(),
        Some(ToolChoiceIn::Named { kind, name }) => json!({"type": kind, "name": name}),
    }
}

fn format_json(format: &Format) -> Value {
    match format {
        Format::Text => json!({"type": "text"}),
        Format::JsonObject => json!({"type": "json_object"}),
        Format::JsonSchema { name, schema, strict } => {
            json!({"type": "json_schema", "name": name, "schema": schema, "strict": strict.unwrap_or(false)})
        }
    }
}

/// The kind of output item a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
    Call(usize),
}

/// A stream's progress: the open item, the finished ones, and the event count.
#[derive(Default)]
struct Stream {
    open: Option<(Open, Value)>,
    output: Vec<Value>,
    sequence: u64,
    failed: bool,
}

/// The Responses API's shapes, and where a finished response is stored.
struct Responses {
    state: Arc<AppState>,
    id: String,
    /// The request's settings as the response object repeats them.
    echo: Value,
    /// With `store`: the input items, the conversation so far, the chain's session.
    store: Option<(Vec<Value>, Vec<ChatMessage>, String)>,
    stream: Stream,
}

impl Responses {
    /// The response id without its `resp_`, for its items' ids.
    fn key(&self) -> &str {
        self.id.strip_prefix("resp_").unwrap_or(&self.id)
    }

    /// The response object with `status` and `output`.
    fn object(&self, g: &Generation, status: &str, output: Vec<Value>) -> Value {
        let mut response = json!({
            "id": self.id,
            "object": "response",
            "created_at": g.created,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "model": g.model(),
            "output": output,
            "usage": null,
        });
        if let (Some(to), Some(from)) = (response.as_object_mut(), self.echo.as_object()) {
            to.extend(from.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        response
    }

    /// The finished response: its status from the finish, with usage.
    fn finished(&self, g: &Generation, output: Vec<Value>) -> Value {
        let choice = &g.answer().choices()[0];
        let usage = g.answer().usage();
        let status = if choice.finish == FinishReason::Length { "incomplete" } else { "completed" };
        let mut response = self.object(g, status, output);
        if status == "incomplete" {
            response["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        response["usage"] = json!({
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": g.reasoning_tokens(0)},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        });
        response
    }

    /// Keeps a finished response and its conversation for `previous_response_id`.
    fn keep(&mut self, g: &Generation, response: &Value) {
        let Some((input_items, mut conversation, session)) = self.store.take() else { return };
        let choice = &g.answer().choices()[0];
        let calls = choice
            .tool_calls
            .iter()
            .map(|c| ToolCall { id: c.id.clone(), name: c.name.clone(), arguments: c.arguments.clone() })
            .collect();
        conversation.push(ChatMessage { tool_calls: calls, ..message("assistant", choice.text.clone()) });
        let stored = Stored { response: response.clone(), input_items, conversation, session };
        self.state.responses.put(self.id.clone(), stored);
    }

    fn reasoning_item(&self, text: &str, status: &str) -> Value {
        json!({
            "type": "reasoning",
            "id": format!("rs_{}", self.key()),
            "status": status,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "encrypted_content": null,
        })
    }

    fn message_item(&self, text: &str, logprobs: Vec<Value>, status: &str) -> Value {
        json!({
            "type": "message",
            "id": format!("msg_{}", self.key()),
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}],
        })
    }

    fn call_item(&self, index: usize, call: &ToolCallOut, status: &str) -> Value {
        json!({
            "type": "function_call",
            "id": format!("fc_{}_{index}", self.key()),
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
            "status": status,
        })
    }

    /// A stream event of `kind` with its sequence number.
    fn event(&mut self, kind: &'static str, mut fields: Value) -> Frame {
        fields["type"] = kind.into();
        fields["sequence_number"] = self.stream.sequence.into();
        self.stream.sequence += 1;
        Frame::named(kind, &fields)
    }

    /// Opens an output item of `kind` (closing the open one first).
    fn enter(&mut self, kind: Open, item: Value, frames: &mut Vec<Frame>) {
        if self.stream.open.as_ref().is_some_and(|(k, _)| *k == kind) {
            return;
        }
        self.leave(frames);
        let output_index = self.stream.output.len();
        // Announced without content; the content part is announced next, as OpenAI does.
        let mut announced = item.clone();
        if let Some(content) = announced.get_mut("content") {
            *content = json!([]);
        }
        frames.push(self.event("response.output_item.added", json!({"output_index": output_index, "item": announced})));
        if let Some(part) = item.get("content").and_then(|c| c.get(0)) {
            let fields = json!({"item_id": item["id"], "output_index": output_index, "content_index": 0, "part": part});
            frames.push(self.event("response.content_part.added", fields));
        }
        self.stream.open = Some((kind, item));
    }

    /// Closes the open output item with its `.done` events.
    fn leave(&mut self, frames: &mut Vec<Frame>) {
        let Some((kind, mut item)) = self.stream.open.take() else { return };
        let output_index = self.stream.output.len();
        let id = item["id"].clone();
        item["status"] = "completed".into();
        match kind {
            Open::Reasoning => {
                let part = item["content"][0].clone();
                let fields =
                    json!({"item_id": id, "output_index": output_index, "content_index": 0, "text": part["text"]});
                frames.push(self.event("response.reasoning_text.done", fields));
                let fields = json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": part});
                frames.push(self.event("response.content_part.done", fields));
            }
            Open::Message => {
                let part = item["content"][0].clone();
                let fields = json!({"item_id": id, "output_index": output_index, "content_index": 0, "text": part["text"], "logprobs": part["logprobs"]});
                frames.push(self.event("response.output_text.done", fields));
                let fields = json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": part});
                frames.push(self.event("response.content_part.done", fields));
            }
            Open::Call(_) => {
                let fields = json!({"item_id": id, "output_index": output_index, "name": item["name"], "arguments": item["arguments"]});
                frames.push(self.event("response.function_call_arguments.done", fields));
            }
        }
        frames.push(self.event("response.output_item.done", json!({"output_index": output_index, "item": item})));
        self.stream.output.push(item);
    }

    /// Appends `text` to the open item's text field at `path` and returns the event fields.
    fn append(&mut self, path: &[&str], text: &str) -> Value {
        let output_index = self.stream.output.len();
        let (_, item) = self.stream.open.as_mut().expect("an open item");
        let mut at = &mut *item;
        for key in path {
            at = match key.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*key],
            };
        }
        let joined = format!("{}{text}", at.as_str().unwrap_or(""));
        *at = joined.into();
        json!({"item_id": item["id"], "output_index": output_index, "delta": text})
    }
}

impl Dialect for Responses {
    const SHAPE: ErrorShape = ErrorShape::OpenAi;

    fn body(&mut self, g: &Generation) -> Value {
        let choice = &g.answer().choices()[0];
        let mut output = Vec::new();
        if !choice.reasoning.is_empty() {
            output.push(self.reasoning_item(&choice.reasoning, "completed"));
        }
        if !choice.text.is_empty() || choice.tool_calls.is_empty() {
            let logprobs = g.openai_logprobs(0, 0).unwrap_or_default();
            output.push(self.message_item(&choice.text, logprobs, "completed"));
        }
        for (i, call) in choice.tool_calls.iter().enumerate() {
            output.push(self.call_item(i, call, "completed"));
        }
        let response = self.finished(g, output);
        self.keep(g, &response);
        response
    }

    fn open(&mut self, g: &Generation) -> Vec<Frame> {
        let response = self.object(g, "in_progress", Vec::new());
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    fn step(&mut self, g: &Generation, step: &Step) -> Vec<Frame> {
        let mut frames = Vec::new();
        if self.stream.failed {
            return frames;
        }
        if !step.reasoning.is_empty() {
            self.enter(Open::Reasoning, self.reasoning_item("", "in_progress"), &mut frames);
            let mut fields = self.append(&["content", "0", "text"], &step.reasoning);
            fields["content_index"] = 0.into();
            frames.push(self.event("response.reasoning_text.delta", fields));
        }
        for d in &step.tool_calls {
            if let (Some(id), Some(name)) = (&d.id, &d.name) {
                self.leave(&mut frames);
                let call = ToolCallOut { id: id.clone(), name: name.clone(), arguments: String::new() };
                self.enter(Open::Call(d.index), self.call_item(d.index, &call, "in_progress"), &mut frames);
            }
            if !d.arguments.is_empty() && matches!(self.stream.open, Some((Open::Call(i), _)) if i == d.index) {
                let fields = self.append(&["arguments"], &d.arguments);
                frames.push(self.event("response.function_call_arguments.delta", fields));
            }
        }
        let logprobs = g.openai_logprobs(0, step.logprobs_from).unwrap_or_default();
        if !step.text.is_empty() {
            self.enter(Open::Message, self.message_item("", Vec::new(), "in_progress"), &mut frames);
            let mut fields = self.append(&["content", "0", "text"], &step.text);
            if let Some((_, item)) = self.stream.open.as_mut()
                && let Some(all) = item["content"][0]["logprobs"].as_array_mut()
            {
                all.extend(logprobs.iter().cloned());
            }
            fields["content_index"] = 0.into();
            fields["logprobs"] = logprobs.into();
            frames.push(self.event("response.output_text.delta", fields));
        }
        match step.finish {
            Some(FinishReason::Error) => {
                self.stream.failed = true;
                self.leave(&mut frames);
                let output = std::mem::take(&mut self.stream.output);
                let mut response = self.object(g, "failed", output);
                let error = g.engine_error();
                response["error"] = json!({"code": "server_error", "message": error.message});
                frames.push(self.event("response.failed", json!({"response": response})));
            }
            Some(_) => {
                if self.stream.output.is_empty() && self.stream.open.is_none() {
                    // An empty answer still has its (empty) message.
                    self.enter(Open::Message, self.message_item("", Vec::new(), "in_progress"), &mut frames);
                }
                self.leave(&mut frames);
            }
            None => {}
        }
        frames
    }

    fn close(&mut self, g: &Generation) -> Vec<Frame> {
        if self.stream.failed {
            return Vec::new();
        }
        let output = std::mem::take(&mut self.stream.output);
        let response = self.finished(g, output);
        self.keep(g, &response);
        let kind = if response["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
        vec![self.event(kind, json!({"response": response}))]
    }
}
