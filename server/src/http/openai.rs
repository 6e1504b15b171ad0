//! S1: OpenAI's request shapes for chat completions and completions, plus the extensions
//! (`top_k`, `min_p`, `repetition_penalty`, `session_id`, `ignore_eos`, `stop_token_ids`,
//! vLLM's `structured_outputs`), and their translation into engine parameters. Unknown fields are ignored, as vLLM does; a known
//! field of the wrong type is a 400 that names it.

use std::collections::HashMap;

use llaisys_actors::{Infill, Options, Prompt as EnginePrompt, Tool, ToolChoice};
use llaisys_model::Constraint;
use llaisys_model::tokenizer::{ChatMessage, ToolCall};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::{ModelEntry, images};

/// Sampling and stopping fields both endpoints share.
#[derive(Debug, Default, Deserialize)]
pub struct CommonFields {
    pub model: String,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<Stop>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub user: Option<String>,
    // Extensions (vLLM's names).
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub session_id: Option<String>,
    #[serde(default)]
    pub ignore_eos: bool,
    pub stop_token_ids: Option<Vec<u32>>,
    /// T5: vLLM's constraint extension, on both endpoints.
    pub structured_outputs: Option<StructuredOutputs>,
    /// Speculative decoding on or off for this request (default: `speculative.default`).
    pub speculative: Option<bool>,
    /// vLLM's: each prompt token's log-probability and rank, with this many alternatives.
    pub prompt_logprobs: Option<i64>,
    /// vLLM's: the answer carries its token ids and its prompt's.
    #[serde(default)]
    pub return_token_ids: bool,
    /// vLLM's scheduling priority: lower is served sooner (`limits.scheduling_policy =
    /// "priority"`; otherwise only 0 is taken).
    #[serde(default)]
    pub priority: i32,
}

/// vLLM's `structured_outputs`: exactly one of its fields.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    pub json: Option<serde_json::Value>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    /// A Lark grammar (llguidance's dialect).
    pub grammar: Option<String>,
    #[serde(default)]
    pub json_object: bool,
}

impl StructuredOutputs {
    fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        let mut found = Vec::new();
        if let Some(schema) = &self.json {
            // vLLM takes the schema as an object or as a JSON string.
            let schema = match schema {
                serde_json::Value::String(s) => serde_json::from_str(s).map_err(|e| {
                    ApiError::invalid("structured_outputs.json", format!("the schema string is not JSON: {e}"))
                })?,
                other => other.clone(),
            };
            found.push(Constraint::JsonSchema { schema, strict: false });
        }
        if let Some(pattern) = &self.regex {
            found.push(Constraint::Regex { pattern: pattern.clone() });
        }
        if let Some(choices) = &self.choice {
            found.push(Constraint::Choice { choices: choices.clone() });
        }
        if let Some(grammar) = &self.grammar {
            found.push(Constraint::Lark { grammar: grammar.clone() });
        }
        if self.json_object {
            found.push(Constraint::JsonObject);
        }
        match found.len() {
            0 | 1 => Ok(found.pop()),
            _ => Err(ApiError::invalid(
                "structured_outputs",
                "give exactly one of json, regex, choice, grammar and json_object",
            )),
        }
    }
}

/// Chat's `response_format` (T2).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: String,
    pub schema: Option<serde_json::Value>,
    /// OpenAI's default: not strict.
    #[serde(default)]
    pub strict: Option<bool>,
}

impl ResponseFormat {
    pub fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        Ok(match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(Constraint::JsonObject),
            ResponseFormat::JsonSchema { json_schema } => {
                if json_schema.name.is_empty() {
                    return Err(ApiError::invalid("response_format.json_schema.name", "the name must not be empty"));
                }
                let Some(schema) = json_schema.schema.clone() else {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        "a json_schema needs its schema",
                    ));
                };
                Some(Constraint::JsonSchema { schema, strict: json_schema.strict.unwrap_or(false) })
            }
        })
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(skip)]
    pub common: CommonFields,
    pub messages: Vec<ChatMessageIn>,
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<ToolIn>>,
    pub tool_choice: Option<ToolChoiceIn>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<ResponseFormat>,
    /// More variables for the chat template (vLLM's extension), e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// A reasoning model thinks at most this many tokens (vLLM's name).
    pub thinking_token_budget: Option<i64>,
    /// OpenAI's reasoning effort: `none` turns a reasoning model's thinking off (the chat
    /// template's `enable_thinking`); `low`, `medium` and `high` go to templates that read it
    /// (gpt-oss's `reasoning_effort`).
    pub reasoning_effort: Option<String>,
}

/// `tools[]`: `{"type": "function", "function": {name, description, parameters}}`.
#[derive(Debug, Deserialize)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionIn,
}

#[derive(Debug, Deserialize)]
pub struct FunctionIn {
    pub name: Option<String>,
    pub description: Option<String>,
    pub parameters: Option<serde_json::Value>,
}

/// `tool_choice`: `"none" | "auto" | "required"` or `{"type": "function", "function": {"name": ...}}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoiceIn {
    Mode(String),
    Named { function: NamedFunction },
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// The tools of a chat request in the engine's terms.
pub fn tools(req: &ChatRequest) -> Result<(Vec<Tool>, Option<ToolChoice>), ApiError> {
    let mut tools = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        if t.kind.as_deref().is_some_and(|k| k != "function") {
            return Err(ApiError::invalid(&format!("tools[{i}].type"), "only function tools are supported"));
        }
        let Some(name) = t.function.name.clone() else {
            return Err(ApiError::invalid(&format!("tools[{i}].function.name"), "a tool needs a name"));
        };
        let parameters =
            t.function.parameters.clone().unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
        tools.push(Tool { name, description: t.function.description.clone(), parameters });
    }
    let choice = match &req.tool_choice {
        None => None,
        Some(ToolChoiceIn::Mode(m)) => Some(tool_choice_mode(m)?),
        Some(ToolChoiceIn::Named { function }) => Some(ToolChoice::Function(function.name.clone())),
    };
    Ok((tools, choice))
}

/// A `tool_choice` given as a word (OpenAI's chat and Responses APIs).
pub fn tool_choice_mode(mode: &str) -> Result<ToolChoice, ApiError> {
    match mode {
        "none" => Ok(ToolChoice::None),
        "auto" => Ok(ToolChoice::Auto),
        "required" => Ok(ToolChoice::Required),
        other => Err(ApiError::invalid(
            "tool_choice",
            format!("{other:?} is not a tool_choice (none, auto, required, or a named function)"),
        )),
    }
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    pub tool_calls: Option<Vec<ToolCallIn>>,
    pub tool_call_id: Option<String>,
}

/// An assistant message's `tool_calls[]`.
#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    pub id: Option<String>,
    pub function: ToolCallFunctionIn,
}

#[derive(Debug, Deserialize)]
pub struct ToolCallFunctionIn {
    pub name: String,
    /// OpenAI sends a JSON string; an object is taken as it is.
    pub arguments: serde_json::Value,
}

/// A message's content: a string or a list of parts (only text parts are supported).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// An image part's `{"url", "detail"}` (or the URL alone, as vLLM also takes it).
    pub image_url: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(skip)]
    pub common: CommonFields,
    pub prompt: Prompt,
    /// Completions' `logprobs` is the number of alternatives (0–5 in OpenAI's API).
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: bool,
    pub suffix: Option<String>,
    pub best_of: Option<i64>,
}

impl CompletionRequest {
    /// The prompts in the engine's terms: each text or list of ids; with a `suffix`, each text
    /// the part before the middle a code model fills in (`Infill`), which neither ids nor `echo`
    /// go with.
    pub fn prompts(&self) -> Result<Vec<EnginePrompt>, ApiError> {
        let mut prompts: Vec<EnginePrompt> = match &self.prompt {
            Prompt::Text(t) => vec![t.as_str().into()],
            Prompt::Texts(ts) => ts.iter().map(|t| t.as_str().into()).collect(),
            Prompt::Ids(ids) => vec![ids.clone().into()],
            Prompt::IdLists(lists) => lists.iter().map(|ids| ids.clone().into()).collect(),
        };
        if let Some(suffix) = self.suffix.as_deref().filter(|s| !s.is_empty()) {
            if self.echo {
                return Err(ApiError::invalid("echo", "echo does not go with suffix (fill-in-the-middle)"));
            }
            for prompt in &mut prompts {
                let EnginePrompt::Text(prefix) = prompt else {
                    return Err(ApiError::invalid("prompt", "with suffix (fill-in-the-middle), the prompt is text"));
                };
                *prompt = Infill::new(std::mem::take(prefix), suffix).into();
            }
        }
        Ok(prompts)
    }
}

/// `prompt`: text, token ids, or a list of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

/// A request with the shared fields (read separately, so errors keep naming the field).
pub trait WithCommon {
    fn common_mut(&mut self) -> &mut CommonFields;
}

impl WithCommon for ChatRequest {
    fn common_mut(&mut self) -> &mut CommonFields {
        &mut self.common
    }
}

impl WithCommon for CompletionRequest {
    fn common_mut(&mut self) -> &mut CommonFields {
        &mut self.common
    }
}

/// Parses a generation request: its own fields, then the shared ones, from one JSON object.
pub fn parse_request<T: DeserializeOwned + WithCommon>(body: &[u8]) -> Result<T, ApiError> {
    let value = parse_json(body)?;
    let mut request: T = from_value(&value)?;
    *request.common_mut() = from_value(&value)?;
    Ok(request)
}

/// Parses a JSON body: malformed JSON and wrong field types are 400s naming the field.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    from_value(&parse_json(body)?)
}

pub(super) fn parse_json(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")).with_code("invalid_json"))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    Ok(value)
}

pub(super) fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // At the top level serde names a missing field itself.
        let param = if path == "." { field_in(&inner) } else { Some(path) };
        match param {
            Some(p) => ApiError::invalid(&p, format!("`{p}`: {inner}")),
            None => ApiError::bad_request(inner),
        }
    })
}

/// The field a serde message names (`missing field `model``).
fn field_in(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_string())
}

/// What a request asks besides its input, and how to answer it.
pub struct Plan {
    pub options: Options,
    pub stream: bool,
    pub include_usage: bool,
    /// The request field the constraint came from (engine errors about `constraint` name it).
    pub constraint_field: Option<&'static str>,
}

impl Plan {
    /// Adds chat's `response_format` constraint; one constraint per request.
    pub fn with_response_format(mut self, format: Option<&ResponseFormat>) -> Result<Self, ApiError> {
        let Some(constraint) = format.map(ResponseFormat::constraint).transpose()?.flatten() else { return Ok(self) };
        if self.options.constraint.is_some() {
            return Err(ApiError::invalid("response_format", "give either response_format or structured_outputs"));
        }
        self.options.constraint = Some(constraint);
        self.constraint_field = Some("response_format");
        Ok(self)
    }
}

impl CommonFields {
    /// The typed options of these fields; `logprobs` is the number of alternatives when
    /// log-probabilities were asked for. Limits and defaults are the engine's to apply.
    pub fn plan(&self, max_tokens: Option<i64>, logprobs: Option<usize>) -> Result<Plan, ApiError> {
        let max_tokens = match max_tokens {
            Some(m) if m <= 0 => {
                return Err(ApiError::invalid("max_tokens", format!("max_tokens must be at least 1, got {m}")));
            }
            m => m.map(|m| m as usize),
        };
        let n = match self.n {
            Some(n) if n < 1 => return Err(ApiError::invalid("n", format!("n must be at least 1, got {n}"))),
            n => n.map(|n| n as usize),
        };
        let top_k = match self.top_k {
            None => None,
            Some(-1 | 0) => Some(0), // vLLM: -1 disables
            Some(k) if k > 0 => Some(k as usize),
            Some(k) => return Err(ApiError::invalid("top_k", format!("top_k must be -1 (off) or ≥ 1, got {k}"))),
        };
        let mut logit_bias = Vec::new();
        for (token, bias) in self.logit_bias.iter().flatten() {
            let id = token.parse::<u32>().map_err(|_| {
                ApiError::invalid("logit_bias", format!("logit_bias keys are token ids, got {token:?}"))
            })?;
            logit_bias.push((id, *bias));
        }
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let prompt_logprobs = match self.prompt_logprobs {
            None => None,
            Some(_) if self.stream => {
                return Err(ApiError::invalid("prompt_logprobs", "prompt_logprobs are not given in a stream"));
            }
            Some(k) => Some(super::alternatives("prompt_logprobs", k)?),
        };
        let options = Options {
            max_tokens,
            default_max_tokens: None,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias,
            seed: self.seed.map(|s| s as u64),
            stop,
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos,
            n,
            logprobs,
            post_sampling_probs: false,
            prompt_logprobs,
            session: self.session_id.clone(),
            constraint: self.structured_outputs.as_ref().map(StructuredOutputs::constraint).transpose()?.flatten(),
            tools: Vec::new(),
            tool_choice: None,
            parallel_tool_calls: None,
            chat_template_kwargs: serde_json::Map::new(),
            thinking_budget: None,
            speculative: self.speculative,
            time_limit: None,
            priority: self.priority,
        };
        let include_usage = self.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let constraint_field = options.constraint.as_ref().map(|_| "structured_outputs");
        Ok(Plan { options, stream: self.stream, include_usage, constraint_field })
    }
}

/// The messages as the engine takes them, their images prepared for `model` and in place.
pub async fn chat_messages(
    state: &super::AppState,
    model: &ModelEntry,
    messages: &[ChatMessageIn],
) -> Result<Vec<ChatMessage>, ApiError> {
    let (mut messages, pending) = self::messages(messages)?;
    images::attach(&state.fetcher, model, &mut messages, pending).await?;
    Ok(messages)
}

/// The messages as the engine takes them (text parts joined, tool calls with their
/// arguments as JSON text), and their images, not prepared yet.
pub fn messages(messages: &[ChatMessageIn]) -> Result<(Vec<ChatMessage>, Vec<images::Pending>), ApiError> {
    let mut pending = Vec::new();
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let tool_calls = m
                .tool_calls
                .iter()
                .flatten()
                .enumerate()
                .map(|(j, c)| ToolCall {
                    id: c.id.clone().unwrap_or_else(|| format!("call_{i}_{j}")),
                    name: c.function.name.clone(),
                    arguments: match &c.function.arguments {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    },
                })
                .collect();
            Ok(ChatMessage {
                role: m.role.clone(),
                content: m.text(i, &mut pending)?,
                tool_calls,
                tool_call_id: m.tool_call_id.clone(),
                images: Vec::new(),
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok((messages, pending))
}

impl ChatMessageIn {
    /// The message's text (text parts joined), its image parts' bytes added to `images` where
    /// they stand in it.
    pub fn text(&self, index: usize, images: &mut Vec<images::Pending>) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    let param = format!("messages[{index}].content[{j}]");
                    match (part.kind.as_str(), &part.text, &part.image_url) {
                        ("text", Some(t), _) => text.push_str(t),
                        ("image_url", _, Some(url)) => {
                            let param = format!("{param}.image_url");
                            let url = match url {
                                serde_json::Value::String(u) => u.as_str(),
                                other => other.get("url").and_then(serde_json::Value::as_str).unwrap_or_default(),
                            };
                            let data = images::from_url(url, &param)?;
                            images.push(images::Pending { message: index, at: text.len(), data, param });
                        }
                        (kind, _, _) => {
                            return Err(ApiError::invalid(
                                &format!("messages[{index}].content"),
                                format!("content parts of type {kind:?} are not supported (text and image_url)"),
                            ));
                        }
                    }
                }
                Ok(text)
            }
        }
    }
}
