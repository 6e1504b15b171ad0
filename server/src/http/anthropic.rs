//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//! System prompt, content blocks (`text`, `tool_use`, `tool_result`; `thinking` blocks of
//! earlier turns are dropped, as the chat templates drop earlier reasoning), tools and
//! `tool_choice`, `stop_sequences`, `thinking` (the chat template's `enable_thinking`); the
//! answer as a `message` with `thinking`, `text` and `tool_use` blocks, or as its stream of
//! `message_start`, `content_block_*`, `message_delta` and `message_stop` events. Errors
//! come in Anthropic's shape.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use llaisys_actors::request::{FinishReason, ToolCallOut};
use llaisys_actors::{ChatRequest, Choice, Options, Tool, ToolChoice};
use llaisys_model::tokenizer::{ChatMessage, ToolCall};
use serde::Deserialize;
use serde_json::{Value, json};

use super::dialect::{Dialect, Frame, Run, Work, endpoint};
use super::error::{ApiError, ErrorShape};
use super::generation::{Generation, Step};
use super::openai::parse;
use super::{AppState, Body413, RequestIdExt, images, json_response};

/// A `POST /v1/messages` body.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    model: String,
    messages: Vec<MessageIn>,
    system: Option<Text>,
    max_tokens: i64,
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: bool,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    tools: Option<Vec<ToolIn>>,
    tool_choice: Option<ToolChoiceIn>,
    thinking: Option<Thinking>,
}

/// `count_tokens` takes a request without `max_tokens` and sampling.
#[derive(Debug, Deserialize)]
struct CountRequest {
    model: String,
    messages: Vec<MessageIn>,
    system: Option<Text>,
    tools: Option<Vec<ToolIn>>,
    tool_choice: Option<ToolChoiceIn>,
    thinking: Option<Thinking>,
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    content: Text,
}

/// A string or a list of content blocks.
#[derive(Debug)]
enum Text {
    Plain(String),
    Blocks(Vec<Block>),
}

impl<'de> Deserialize<'de> for Text {
    /// By hand, so a bad block is named with its index and what is wrong with it.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Self::Plain(s)),
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, b)| {
                    serde_json::from_value(b).map_err(|e| D::Error::custom(format!("content block {i}: {e}")))
                })
                .collect::<Result<_, _>>()
                .map(Self::Blocks),
            _ => Err(D::Error::custom("expected a string or a list of content blocks")),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        content: Option<Text>,
        #[serde(default)]
        is_error: bool,
    },
    Thinking {},
    RedactedThinking {},
    Image {
        source: ImageSource,
    },
}

/// An image block's source: base64 bytes, or a URL (a `data:` URL, or a remote one to fetch).
#[derive(Debug, Deserialize)]
struct ImageSource {
    #[serde(rename = "type")]
    kind: String,
    data: Option<String>,
    url: Option<String>,
}

impl ImageSource {
    fn data(&self, param: &str) -> Result<images::ImageData, ApiError> {
        match (self.kind.as_str(), &self.data, &self.url) {
            ("base64", Some(data), _) => images::from_base64(data, param).map(images::ImageData::Bytes),
            ("url", _, Some(url)) => images::from_url(url, param),
            ("base64", None, _) => Err(ApiError::invalid(&format!("{param}.data"), "a base64 source needs its data")),
            ("url", _, None) => Err(ApiError::invalid(&format!("{param}.url"), "a url source needs its url")),
            (other, _, _) => Err(ApiError::invalid(
                &format!("{param}.type"),
                format!("{other:?} is not an image source type (base64, url)"),
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
struct ToolIn {
    /// Absent or `custom` for client tools; Anthropic's server tools (web search, ...) have
    /// their own types, which this server does not run.
    #[serde(rename = "type")]
    kind: Option<String>,
    name: String,
    description: Option<String>,
    input_schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ToolChoiceIn {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    #[serde(default)]
    disable_parallel_tool_use: bool,
}

#[derive(Debug, Deserialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: String,
    /// With `enabled`: the most tokens thinking may take.
    budget_tokens: Option<i64>,
}

pub async fn messages(
    State(state): State<Arc<AppState>>,
    Extension(RequestIdExt(request_id)): Extension<RequestIdExt>,
    body: Result<Body413, ApiError>,
) -> Response {
    let model_of = |r: &MessagesRequest| r.model.clone();
    endpoint(ErrorShape::Anthropic, body, MessagesRequest::parse, model_of, async |req| {
        generate(&state, &request_id, req).await
    })
    .await
}

async fn generate(state: &Arc<AppState>, request_id: &str, req: MessagesRequest) -> Result<Response, ApiError> {
    let model = state.model(&req.model)?;
    let (mut request, pending) = req.chat_request()?;
    images::attach(&state.fetcher, &model, &mut request.input, pending).await?;
    let run = Run { state, request_id, model, stream: req.stream, constraint_field: None, echo: false };
    run.run(Work::Chat(request), Messages::default()).await
}

impl MessagesRequest {
    /// Parses a body (errors name the field).
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        parse(body)
    }

    /// The request in the engine's terms, and its images, not prepared yet.
    pub fn chat_request(&self) -> Result<(ChatRequest, Vec<images::Pending>), ApiError> {
        let req = self;
        if req.max_tokens < 1 {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("max_tokens must be at least 1, got {}", req.max_tokens),
            ));
        }
        let top_k = match req.top_k {
            None => None,
            Some(k) if k >= 1 => Some(k as usize),
            Some(k) => return Err(ApiError::invalid("top_k", format!("top_k must be at least 1, got {k}"))),
        };
        let mut options = Options {
            max_tokens: Some(req.max_tokens as usize),
            temperature: req.temperature,
            top_p: req.top_p,
            top_k,
            stop: req.stop_sequences.clone().unwrap_or_default(),
            chat_template_kwargs: thinking(req.thinking.as_ref())?,
            thinking_budget: budget(req.thinking.as_ref())?,
            ..Options::default()
        };
        tools(&mut options, req.tools.as_deref(), req.tool_choice.as_ref())?;
        let mut pending = Vec::new();
        let messages = conversation(req.system.as_ref(), &req.messages, &mut pending)?;
        Ok((ChatRequest::new(messages).options(options), pending))
    }
}

pub async fn count_tokens(State(state): State<Arc<AppState>>, body: Result<Body413, ApiError>) -> Response {
    let count = async |body: Result<Body413, ApiError>| {
        let req: CountRequest = parse(&body?.0)?;
        let model = state.model(&req.model)?;
        let mut options = Options::default();
        tools(&mut options, req.tools.as_deref(), req.tool_choice.as_ref())?;
        let offered = if options.tool_choice == Some(ToolChoice::None) { &[][..] } else { &options.tools[..] };
        let mut pending = Vec::new();
        let mut messages = conversation(req.system.as_ref(), &req.messages, &mut pending)?;
        images::attach(&state.fetcher, &model, &mut messages, pending).await?;
        let kwargs = thinking(req.thinking.as_ref())?;
        let tokens = model.engine.frontend().render_chat(&messages, offered, &kwargs, true)?;
        Ok::<_, ApiError>(json_response(StatusCode::OK, &json!({"input_tokens": tokens.len()})))
    };
    count(body).await.unwrap_or_else(|e| e.response_in(ErrorShape::Anthropic))
}

/// Sets the tools, the choice among them, and whether several calls may come.
fn tools(options: &mut Options, tools: Option<&[ToolIn]>, choice: Option<&ToolChoiceIn>) -> Result<(), ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.into_iter().flatten().enumerate() {
        if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
            return Err(ApiError::invalid(
                &format!("tools[{i}].type"),
                format!("server tools ({kind:?}) are not supported: give client tools with an input_schema"),
            ));
        }
        let parameters = t.input_schema.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        out.push(Tool { name: t.name.clone(), description: t.description.clone(), parameters });
    }
    options.tools = out;
    let Some(choice) = choice else { return Ok(()) };
    let mode = match (choice.kind.as_str(), &choice.name) {
        ("auto", _) => ToolChoice::Auto,
        ("any", _) => ToolChoice::Required,
        ("none", _) => ToolChoice::None,
        ("tool", Some(name)) => ToolChoice::Function(name.clone()),
        ("tool", None) => return Err(ApiError::invalid("tool_choice.name", "tool_choice of type tool needs a name")),
        (other, _) => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("{other:?} is not a tool_choice type (auto, any, tool, none)"),
            ));
        }
    };
    options.tool_choice = Some(mode);
    options.parallel_tool_calls = choice.disable_parallel_tool_use.then_some(false);
    Ok(())
}

/// `thinking.budget_tokens` (with `enabled`) as the thinking's budget.
fn budget(thinking: Option<&Thinking>) -> Result<Option<usize>, ApiError> {
    match thinking.filter(|t| t.kind == "enabled").and_then(|t| t.budget_tokens) {
        Some(b) if b < 1 => {
            let msg = format!("thinking.budget_tokens must be at least 1, got {b}");
            Err(ApiError::invalid("thinking.budget_tokens", msg))
        }
        b => Ok(b.map(|b| b as usize)),
    }
}

/// `thinking` as the chat template's `enable_thinking`.
fn thinking(thinking: Option<&Thinking>) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut kwargs = serde_json::Map::new();
    match thinking.map(|t| t.kind.as_str()) {
        None => {}
        Some("enabled" | "adaptive") => {
            kwargs.insert("enable_thinking".into(), true.into());
        }
        Some("disabled") => {
            kwargs.insert("enable_thinking".into(), false.into());
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "thinking.type",
                format!("{other:?} is not a thinking type (enabled, disabled)"),
            ));
        }
    }
    Ok(kwargs)
}

/// The system prompt and the messages as the engine's chat: a user turn's `tool_result`
/// blocks become `tool` messages (in their order among its text), its `image` blocks images
/// where they stand in its text (added to `images`), an assistant turn's `tool_use` blocks its
/// tool calls.
fn conversation(
    system: Option<&Text>,
    messages: &[MessageIn],
    found: &mut Vec<images::Pending>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::new();
    if let Some(system) = system {
        out.push(message("system", text(system, "system")?));
    }
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}].content");
        let blocks = match &m.content {
            Text::Plain(t) => {
                out.push(message(&m.role, t.clone()));
                continue;
            }
            Text::Blocks(blocks) => blocks,
        };
        match m.role.as_str() {
            "user" => {
                let mut pending = String::new();
                // The images of the text not pushed yet (their message is the next one).
                let mut seen: Vec<images::Pending> = Vec::new();
                let mut flush = |out: &mut Vec<ChatMessage>, pending: &mut String, seen: &mut Vec<images::Pending>| {
                    if !pending.is_empty() || !seen.is_empty() {
                        found.extend(seen.drain(..).map(|p| images::Pending { message: out.len(), ..p }));
                        out.push(message("user", std::mem::take(pending)));
                    }
                };
                for (j, block) in blocks.iter().enumerate() {
                    match block {
                        Block::Text { text } => push_text(&mut pending, text),
                        Block::Image { source } => {
                            let param = format!("{at}[{j}].source");
                            let data = source.data(&param)?;
                            seen.push(images::Pending { message: 0, at: pending.len(), data, param });
                        }
                        Block::ToolResult { tool_use_id, content, is_error } => {
                            flush(&mut out, &mut pending, &mut seen);
                            let result =
                                content.as_ref().map(|c| text(c, &format!("{at}[{j}].content"))).transpose()?;
                            let result = result.unwrap_or_default();
                            let content = if *is_error { format!("Error: {result}") } else { result };
                            let tool_call_id = Some(tool_use_id.clone());
                            out.push(ChatMessage { tool_call_id, ..message("tool", content) });
                        }
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("{at}[{j}]"),
                                "a user turn holds text, image and tool_result blocks",
                            ));
                        }
                    }
                }
                flush(&mut out, &mut pending, &mut seen);
            }
            "assistant" => {
                let mut turn = message("assistant", String::new());
                for (j, block) in blocks.iter().enumerate() {
                    match block {
                        Block::Text { text } => push_text(&mut turn.content, text),
                        Block::ToolUse { id, name, input } => {
                            turn.tool_calls.push(ToolCall {
                                id: id.clone(),
                                name: name.clone(),
                                arguments: input.to_string(),
                            });
                        }
                        Block::Thinking {} | Block::RedactedThinking {} => {}
                        Block::ToolResult { .. } | Block::Image { .. } => {
                            return Err(ApiError::invalid(
                                &format!("{at}[{j}]"),
                                "tool_result and image blocks belong in user turns",
                            ));
                        }
                    }
                }
                out.push(turn);
            }
            other => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!("{other:?} is not a role here (user, assistant; the system prompt is `system`)"),
                ));
            }
        }
    }
    Ok(out)
}

fn message(role: &str, content: String) -> ChatMessage {
    ChatMessage::new(role, content)
}

/// Text blocks are joined by a blank line.
fn push_text(to: &mut String, text: &str) {
    if !to.is_empty() {
        to.push_str("\n\n");
    }
    to.push_str(text);
}

/// The text of a string or of text-only blocks.
fn text(content: &Text, at: &str) -> Result<String, ApiError> {
    match content {
        Text::Plain(t) => Ok(t.clone()),
        Text::Blocks(blocks) => {
            let mut out = String::new();
            for (j, block) in blocks.iter().enumerate() {
                match block {
                    Block::Text { text } => push_text(&mut out, text),
                    _ => return Err(ApiError::invalid(&format!("{at}[{j}]"), "only text blocks are allowed here")),
                }
            }
            Ok(out)
        }
    }
}

/// `stop_reason` and `stop_sequence` of a choice's finish.
fn stop_reason(choice: &Choice) -> (&'static str, Option<&str>) {
    match (choice.finish, choice.stop.as_deref()) {
        (FinishReason::Length, _) => ("max_tokens", None),
        (FinishReason::ToolCalls, _) => ("tool_use", None),
        (FinishReason::Stop, Some(sequence)) => ("stop_sequence", Some(sequence)),
        (FinishReason::Stop | FinishReason::Abort | FinishReason::Error, _) => ("end_turn", None),
    }
}

/// A tool call's `input`: the arguments as an object (an answer cut off inside the call by
/// `max_tokens` has no whole object; its text is then kept under `_partial_arguments`).
fn input(call: &ToolCallOut) -> Value {
    match serde_json::from_str::<Value>(&call.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"_partial_arguments": call.arguments}),
    }
}

/// Anthropic's tool-use ids look like `toolu_…`.
fn tool_use_id(engine_id: &str) -> String {
    format!("toolu_{}", engine_id.strip_prefix("call_").unwrap_or(engine_id))
}

/// The kind of the content block a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    ToolUse(usize),
}

/// The Messages API's shapes; while streaming, the open content block.
#[derive(Default)]
struct Messages {
    open: Option<Open>,
    blocks: usize,
    failed: bool,
}

impl Messages {
    fn id(g: &Generation) -> String {
        format!("msg_{}", g.request_id)
    }

    fn usage(g: &Generation) -> Value {
        let u = g.answer().usage();
        json!({
            "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
            "cache_read_input_tokens": u.cached_tokens,
            "cache_creation_input_tokens": 0,
            "output_tokens": u.completion_tokens,
        })
    }

    /// Frames that close the open block (if it is not `kind`) and open one of `kind`.
    fn enter(&mut self, kind: Open, block: Value, frames: &mut Vec<Frame>) {
        if self.open == Some(kind) {
            return;
        }
        self.leave(frames);
        let event = json!({"type": "content_block_start", "index": self.blocks, "content_block": block});
        frames.push(Frame::named("content_block_start", &event));
        self.open = Some(kind);
    }

    fn leave(&mut self, frames: &mut Vec<Frame>) {
        if self.open.take().is_some() {
            frames
                .push(Frame::named("content_block_stop", &json!({"type": "content_block_stop", "index": self.blocks})));
            self.blocks += 1;
        }
    }

    fn delta(&self, delta: Value) -> Frame {
        Frame::named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.blocks, "delta": delta}),
        )
    }
}

impl Dialect for Messages {
    const SHAPE: ErrorShape = ErrorShape::Anthropic;

    fn body(&mut self, g: &Generation) -> Value {
        let choice = &g.answer().choices()[0];
        let mut content = Vec::new();
        if !choice.reasoning.is_empty() {
            content.push(json!({"type": "thinking", "thinking": choice.reasoning, "signature": ""}));
        }
        if !choice.text.is_empty() || choice.tool_calls.is_empty() {
            content.push(json!({"type": "text", "text": choice.text}));
        }
        for call in &choice.tool_calls {
            content.push(
                json!({"type": "tool_use", "id": tool_use_id(&call.id), "name": call.name, "input": input(call)}),
            );
        }
        let (reason, sequence) = stop_reason(choice);
        json!({
            "id": Self::id(g),
            "type": "message",
            "role": "assistant",
            "model": g.model(),
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": Self::usage(g),
        })
    }

    fn open(&mut self, g: &Generation) -> Vec<Frame> {
        let message = json!({
            "id": Self::id(g),
            "type": "message",
            "role": "assistant",
            "model": g.model(),
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": g.prompt_tokens(0), "output_tokens": 0},
        });
        vec![
            Frame::named("message_start", &json!({"type": "message_start", "message": message})),
            Frame::named("ping", &json!({"type": "ping"})),
        ]
    }

    fn step(&mut self, g: &Generation, step: &Step) -> Vec<Frame> {
        let mut frames = Vec::new();
        if self.failed {
            return frames;
        }
        if !step.reasoning.is_empty() {
            self.enter(Open::Thinking, json!({"type": "thinking", "thinking": "", "signature": ""}), &mut frames);
            frames.push(self.delta(json!({"type": "thinking_delta", "thinking": step.reasoning})));
        }
        for d in &step.tool_calls {
            if let (Some(id), Some(name)) = (&d.id, &d.name) {
                self.leave(&mut frames);
                let block = json!({"type": "tool_use", "id": tool_use_id(id), "name": name, "input": {}});
                self.enter(Open::ToolUse(d.index), block, &mut frames);
            }
            if !d.arguments.is_empty() && self.open == Some(Open::ToolUse(d.index)) {
                frames.push(self.delta(json!({"type": "input_json_delta", "partial_json": d.arguments})));
            }
        }
        if !step.text.is_empty() {
            self.enter(Open::Text, json!({"type": "text", "text": ""}), &mut frames);
            frames.push(self.delta(json!({"type": "text_delta", "text": step.text})));
        }
        match step.finish {
            Some(FinishReason::Error) => {
                self.failed = true;
                frames.push(Frame::named("error", &g.engine_error().body_in(ErrorShape::Anthropic)));
            }
            Some(_) => {
                if self.blocks == 0 && self.open.is_none() {
                    // An empty answer still has its (empty) text block.
                    self.enter(Open::Text, json!({"type": "text", "text": ""}), &mut frames);
                }
                self.leave(&mut frames);
                let (reason, sequence) = stop_reason(&g.answer().choices()[0]);
                let delta = json!({"stop_reason": reason, "stop_sequence": sequence});
                let event = json!({"type": "message_delta", "delta": delta, "usage": Self::usage(g)});
                frames.push(Frame::named("message_delta", &event));
            }
            None => {}
        }
        frames
    }

    fn close(&mut self, _: &Generation) -> Vec<Frame> {
        if self.failed {
            return Vec::new();
        }
        vec![Frame::named("message_stop", &json!({"type": "message_stop"}))]
    }
}
