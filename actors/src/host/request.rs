//! The requests a host sends: a chat (messages rendered with the model's template) or a
//! completion (text or token ids as they are, or a code model's fill in the middle), each with
//! the same `Options`.

use llaisys_model::Constraint;
use llaisys_model::tokenizer::ChatMessage;
pub use llaisys_model::tokenizer::Infill;

use super::params::GenerateParams;

/// A request: its input (messages or prompts) and what to generate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request<I> {
    pub input: I,
    pub options: Options,
}

/// A chat: messages rendered with the model's chat template, then generation.
pub type ChatRequest = Request<Vec<ChatMessage>>;

/// A completion: each prompt continued as it is (`n` choices each).
pub type CompletionRequest = Request<Vec<Prompt>>;

/// A completion prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    /// Fill in the middle: a code model writes what goes between a prefix and a suffix.
    /// Encoded in the model's fill-in-the-middle tokens (`tokenizer::FimTokens`: Qwen2.5-Coder's
    /// `<|fim_prefix|>`, CodeLlama's `<PRE>`, ...); a model without them refuses it, naming
    /// `suffix`. Its context files take the prompt's room left after the prefix, the suffix and
    /// `max_tokens` (a quarter of the context where not given). Its choices also end at the
    /// model's padding and repository tokens (`<|fim_pad|>`, `<|file_sep|>`, `<|repo_name|>`),
    /// where a middle is over.
    Infill(Infill),
}

impl From<Infill> for Prompt {
    fn from(infill: Infill) -> Self {
        Self::Infill(infill)
    }
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Self {
        Self::Text(text.into())
    }
}

impl From<String> for Prompt {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(tokens: Vec<u32>) -> Self {
        Self::Tokens(tokens)
    }
}

/// Sampling, stopping and bookkeeping of a request. `None` fields take the model's generation
/// defaults (its `generation_config.json`, as vLLM applies them), then OpenAI's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Options {
    /// Most tokens generated per choice. Default: `default_max_tokens`.
    pub max_tokens: Option<usize>,
    /// Most tokens generated per choice where `max_tokens` is not given, within what is left of
    /// the context (OpenAI's completions API: 16). Default: what is left of the context, within
    /// the engine's `RequestLimits::max_tokens`.
    pub default_max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `Some(0)` turns top-k off.
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Added to the logits of these token ids.
    pub logit_bias: Vec<(u32, f32)>,
    /// Makes sampling reproducible; choice `i` uses `seed + i`.
    pub seed: Option<u64>,
    /// Stop strings (at most 16): the text ends before the first one and never contains it.
    pub stop: Vec<String>,
    /// Extra token ids that end a choice.
    pub stop_token_ids: Vec<u32>,
    /// Generate past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Choices per prompt (default 1).
    pub n: Option<usize>,
    /// Log-probabilities with this many alternatives (0–20) per generated token.
    pub logprobs: Option<usize>,
    /// The log-probabilities are of the distribution each token was drawn from (after bias,
    /// penalties, temperature, top-k, min-p and top-p; llama.cpp's `post_sampling_probs`),
    /// not the model's raw one.
    pub post_sampling_probs: bool,
    /// Each prompt token's log-probability given the ones before it (the first has none), with
    /// this many alternatives (0-20), in the answer's `Choice::prompt_logprobs`: vLLM's
    /// `prompt_logprobs`, OpenAI's completions with `echo` and `logprobs`. The whole prompt is
    /// computed (no cached prefix is reused).
    pub prompt_logprobs: Option<usize>,
    /// The conversation this request continues (E6): its cells stay cached, so the next turn
    /// computes only its new tokens. Only the first choice continues it.
    pub session: Option<String>,
    /// T1: what the output must match (a JSON schema, any JSON object, a regex, a choice, a
    /// Lark grammar). A constraint that does not compile is refused naming `constraint`.
    pub constraint: Option<Constraint>,
    /// T3: functions the model may call (chats only).
    pub tools: Vec<Tool>,
    /// Whether and which tool to call; default `Auto` (with tools).
    pub tool_choice: Option<ToolChoice>,
    /// Whether one answer may call several tools (default true).
    pub parallel_tool_calls: Option<bool>,
    /// More variables for the chat template (chats only), e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// A reasoning model's thinking ends after this many tokens (its closing tag is forced; the
    /// answer follows). Chats of models with think tags, and of harmony models (gpt-oss: its
    /// analysis message, `<|end|>` forced); others ignore it.
    pub thinking_budget: Option<usize>,
    /// Speculative decoding on or off for this request (default: the engine's setting). The
    /// output is the same either way; only its speed differs.
    pub speculative: Option<bool>,
    /// After this long from the first token, each choice ends (finish `Length`) at its next
    /// token once its text has a line break (llama.cpp's `t_max_predict_ms`).
    pub time_limit: Option<std::time::Duration>,
    /// Scheduling priority (vLLM's `priority`): lower is served sooner; default 0. Another
    /// value is refused naming `priority` unless the engine's `RequestLimits::scheduling_policy`
    /// is `Priority`.
    pub priority: i32,
}

/// A function the model may call (OpenAI's `tools[].function`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema of the arguments object.
    pub parameters: serde_json::Value,
}

impl Tool {
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: serde_json::Value) -> Self {
        Self { name: name.into(), description: Some(description.into()), parameters }
    }

    /// As OpenAI's `tools[]` entry (what chat templates render).
    pub fn to_json(&self) -> serde_json::Value {
        let mut function = serde_json::Map::new();
        function.insert("name".into(), self.name.clone().into());
        if let Some(d) = &self.description {
            function.insert("description".into(), d.clone().into());
        }
        function.insert("parameters".into(), self.parameters.clone());
        serde_json::json!({"type": "function", "function": function})
    }
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// No calls: the model answers in text.
    None,
    /// The model decides; a call it opens is constrained to the tools' schemas.
    #[default]
    Auto,
    /// At least one call, constrained from the first token.
    Required,
    /// A call of this function, constrained from the first token.
    Function(String),
}

impl<I> Request<I> {
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.options.max_tokens = Some(n);
        self
    }

    /// 0 is greedy.
    pub fn temperature(mut self, t: f32) -> Self {
        self.options.temperature = Some(t);
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.options.seed = Some(seed);
        self
    }

    pub fn stop(mut self, stop: impl Into<String>) -> Self {
        self.options.stop.push(stop.into());
        self
    }

    /// Generate past the model's end-of-sequence tokens (up to `max_tokens`).
    pub fn ignore_eos(mut self, ignore: bool) -> Self {
        self.options.ignore_eos = ignore;
        self
    }

    pub fn n(mut self, n: usize) -> Self {
        self.options.n = Some(n);
        self
    }

    pub fn logprobs(mut self, alternatives: usize) -> Self {
        self.options.logprobs = Some(alternatives);
        self
    }

    pub fn session(mut self, id: impl Into<String>) -> Self {
        self.options.session = Some(id.into());
        self
    }

    /// Offers a tool (T3).
    pub fn tool(mut self, tool: Tool) -> Self {
        self.options.tools.push(tool);
        self
    }

    pub fn tool_choice(mut self, choice: ToolChoice) -> Self {
        self.options.tool_choice = Some(choice);
        self
    }

    /// Constrains the output (T1), e.g. `Constraint::JsonSchema { schema, strict: true }`.
    pub fn constraint(mut self, constraint: Constraint) -> Self {
        self.options.constraint = Some(constraint);
        self
    }

    /// Speculative decoding on or off for this request.
    pub fn speculative(mut self, on: bool) -> Self {
        self.options.speculative = Some(on);
        self
    }

    /// A variable for the chat template (e.g. `enable_thinking`, false).
    pub fn template_kwarg(mut self, name: impl Into<String>, value: serde_json::Value) -> Self {
        self.options.chat_template_kwargs.insert(name.into(), value);
        self
    }

    pub fn options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }
}

impl ChatRequest {
    /// A chat with these messages.
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        Self { input: messages, options: Options::default() }
    }

    /// Appends a message (roles: `system`, `user`, `assistant`; `developer` is `system`).
    pub fn message(mut self, role: impl Into<String>, content: impl Into<String>) -> Self {
        self.input.push(ChatMessage::new(role, content));
        self
    }

    pub fn system(self, content: impl Into<String>) -> Self {
        self.message("system", content)
    }

    pub fn user(self, content: impl Into<String>) -> Self {
        self.message("user", content)
    }

    pub fn assistant(self, content: impl Into<String>) -> Self {
        self.message("assistant", content)
    }
}

impl CompletionRequest {
    /// A completion of one prompt.
    pub fn new(prompt: impl Into<Prompt>) -> Self {
        Self { input: vec![prompt.into()], options: Options::default() }
    }

    /// A completion of several prompts (`n` choices each).
    pub fn batch(prompts: Vec<Prompt>) -> Self {
        Self { input: prompts, options: Options::default() }
    }
}

/// A request the engine refuses before it runs; `param` names the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    pub param: Option<String>,
    pub message: String,
    /// A machine-readable code (`context_length_exceeded`).
    pub code: Option<&'static str>,
}

impl RequestError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { param: Some(param.into()), message: message.into(), code: None }
    }

    pub fn general(message: impl Into<String>) -> Self {
        Self { param: None, message: message.into(), code: None }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The codes requests are refused with, as `code` holds them (from their names, e.g. as a
    /// cluster's node sends them).
    pub fn known_code(name: &str) -> Option<&'static str> {
        ["context_length_exceeded"].into_iter().find(|c| *c == name)
    }
}

/// A request: prompt token ids and what to generate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// The conversation this request continues (E6): its cells stay pinned after it ends, so
    /// the next request of the session computes only its new tokens.
    pub session: Option<String>,
}

impl GenerateRequest {
    pub fn new(prompt: Vec<u32>, params: GenerateParams) -> Self {
        Self { prompt, params, session: None }
    }
}
