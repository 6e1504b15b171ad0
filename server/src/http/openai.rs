//! S1: OpenAI's request shapes for chat completions and completions, plus the extensions
//! (`top_k`, `min_p`, `repetition_penalty`, `session_id`, `ignore_eos`, `stop_token_ids`), and
//! their translation into engine parameters. Unknown fields are ignored, as vLLM does; a known
//! field of the wrong type is a 400 that names it.

use std::collections::HashMap;

use llaisys_actors::GenerateParams;
use llaisys_model::SamplingParams;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::ApiError;

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
    pub tools: Option<serde_json::Value>,
    pub response_format: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
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

fn parse_json(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")).with_code("invalid_json"))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    Ok(value)
}

fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
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

/// Sampling defaults from the model's `generation_config.json` (as vLLM applies them), used
/// where a request leaves a field out; OpenAI's defaults otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub min_p: f32,
    pub repetition_penalty: f32,
    /// Extra end-of-sequence ids the model's generation config lists.
    pub eos_token_ids: Vec<u32>,
}

impl Default for Defaults {
    fn default() -> Self {
        Self { temperature: 1.0, top_p: 1.0, top_k: None, min_p: 0.0, repetition_penalty: 1.0, eos_token_ids: vec![] }
    }
}

impl Defaults {
    /// Reads a `generation_config.json`; an unreadable file changes nothing.
    pub fn from_file(path: &std::path::Path) -> Self {
        let mut d = Self::default();
        let Ok(text) = std::fs::read_to_string(path) else { return d };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else { return d };
        let num = |k: &str| json.get(k).and_then(serde_json::Value::as_f64).map(|v| v as f32);
        if let Some(t) = num("temperature") {
            d.temperature = t;
        }
        if let Some(p) = num("top_p") {
            d.top_p = p;
        }
        if let Some(k) = json.get("top_k").and_then(serde_json::Value::as_u64).filter(|k| *k > 0) {
            d.top_k = Some(k as usize);
        }
        if let Some(m) = num("min_p") {
            d.min_p = m;
        }
        if let Some(r) = num("repetition_penalty") {
            d.repetition_penalty = r;
        }
        d.eos_token_ids = match json.get("eos_token_id") {
            Some(serde_json::Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_u64()).map(|n| n as u32).collect(),
            _ => vec![],
        };
        d
    }
}

/// What a request asks of each of its choices.
pub struct Plan {
    pub params: GenerateParams,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
}

/// Server-side limits a request is checked against.
pub struct Bounds {
    pub context: usize,
    pub max_prompt_tokens: usize,
    pub max_tokens: usize,
    pub max_n: usize,
    /// `max_tokens` when the request gives none (`None`: what is left of the context).
    pub default_max_tokens: Option<usize>,
}

impl CommonFields {
    /// The engine parameters for a prompt of `prompt_len` tokens (the longest of the request's).
    pub fn plan(
        &self,
        max_tokens: Option<i64>,
        top_logprobs: usize,
        prompt_len: usize,
        defaults: &Defaults,
        bounds: &Bounds,
    ) -> Result<Plan, ApiError> {
        if prompt_len == 0 {
            return Err(ApiError::invalid("prompt", "the prompt is empty"));
        }
        if prompt_len > bounds.max_prompt_tokens {
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "This model's maximum context length is {} tokens. However, your prompt has {prompt_len} tokens.",
                    bounds.max_prompt_tokens + 1
                ),
            )
            .with_code("context_length_exceeded"));
        }
        let room = bounds.context - prompt_len;
        let max_tokens = match max_tokens {
            Some(m) if m <= 0 => {
                return Err(ApiError::invalid("max_tokens", format!("max_tokens must be at least 1, got {m}")));
            }
            Some(m) if m as usize > bounds.max_tokens => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!("max_tokens is {m}; this server allows at most {}", bounds.max_tokens),
                ));
            }
            Some(m) if m as usize > room => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!(
                        "This model's maximum context length is {} tokens. However, you requested {} tokens ({prompt_len} in the prompt, {m} in the completion).",
                        bounds.context,
                        prompt_len + m as usize
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            Some(m) => m as usize,
            None => bounds.default_max_tokens.unwrap_or(bounds.max_tokens).min(room),
        };
        let n = match self.n {
            None => 1,
            Some(n) if n >= 1 && n as usize <= bounds.max_n => n as usize,
            Some(n) => {
                return Err(ApiError::invalid("n", format!("n must be between 1 and {}, got {n}", bounds.max_n)));
            }
        };
        let top_k = match self.top_k {
            None => defaults.top_k,
            Some(k) if k == -1 || k == 0 => None, // vLLM: -1 disables
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
        logit_bias.sort_by_key(|(id, _)| *id);
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 16 || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", "stop takes at most 16 non-empty strings"));
        }
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k,
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(defaults.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            logit_bias,
            seed: self.seed.map(|s| s as u64),
            top_logprobs,
        };
        let mut stop_token_ids = self.stop_token_ids.clone().unwrap_or_default();
        if !self.ignore_eos {
            stop_token_ids.extend(&defaults.eos_token_ids);
        }
        let params = GenerateParams { max_tokens, sampling, stop, stop_token_ids, ignore_eos: self.ignore_eos };
        let include_usage = self.stream_options.as_ref().is_some_and(|o| o.include_usage);
        Ok(Plan { params, n, stream: self.stream, include_usage })
    }
}

impl ChatMessageIn {
    /// The message's text (text parts joined).
    pub fn text(&self, index: usize) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                &format!("messages[{index}].content"),
                                format!("content parts of type {kind:?} are not supported (text only)"),
                            ));
                        }
                    }
                }
                Ok(text)
            }
        }
    }
}
