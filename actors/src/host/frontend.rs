//! From a request to prompt token ids and engine parameters: the model's tokenizer, chat
//! template and generation defaults, and the engine's request limits. The library and the
//! HTTP server both go through here, so the same request tokenizes and validates identically
//! through either (C10).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use llaisys_model::tokenizer::{ChatMessage, ChatTemplate};
use llaisys_model::{Constraint, GrammarCompiler, GrammarError, Guidance, ModelInfo, SamplingParams, Tokenizer};

use super::request::{ChatRequest, CompletionRequest, Options, Prompt, RequestError, Tool, ToolChoice};
use crate::GenerateParams;
use crate::request::{ToolCallTags, ToolParsing};

/// Sampling defaults from a model's `generation_config.json`, used where a request leaves a
/// field out; OpenAI's defaults otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub min_p: f32,
    pub repetition_penalty: f32,
    /// Extra end-of-sequence ids the generation config lists.
    pub eos_token_ids: Vec<u32>,
}

impl Default for GenerationDefaults {
    fn default() -> Self {
        Self { temperature: 1.0, top_p: 1.0, top_k: None, min_p: 0.0, repetition_penalty: 1.0, eos_token_ids: vec![] }
    }
}

impl GenerationDefaults {
    /// Reads a `generation_config.json`; an unreadable file changes nothing.
    pub fn from_file(path: &Path) -> Self {
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

/// The request's tool choice against its tools and constraint, before anything is rendered or
/// compiled; whether the tools are offered to the model.
fn check_tool_choice(options: &Options) -> Result<bool, RequestError> {
    let choice = options.tool_choice.clone().unwrap_or_default();
    if let ToolChoice::Function(name) = &choice
        && !options.tools.iter().any(|t| &t.name == name)
    {
        return Err(RequestError::invalid(
            "tool_choice",
            format!("tool_choice names {name:?}, which is not among the tools"),
        ));
    }
    if options.tools.is_empty() {
        return match choice {
            ToolChoice::None | ToolChoice::Auto => Ok(false),
            _ => Err(RequestError::invalid("tool_choice", "tool_choice requires tools")),
        };
    }
    if choice != ToolChoice::None && options.constraint.is_some() {
        return Err(RequestError::invalid(
            "constraint",
            "a constraint cannot be combined with tools unless tool_choice is none",
        ));
    }
    Ok(choice != ToolChoice::None)
}

/// Tools as OpenAI allows them: names of 1–64 letters, digits, `_` and `-`, each once;
/// parameters a JSON schema object.
fn check_tools(tools: &[Tool]) -> Result<(), RequestError> {
    for (i, tool) in tools.iter().enumerate() {
        let name_ok = (1..=64).contains(&tool.name.len())
            && tool.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(RequestError::invalid(
                format!("tools[{i}].function.name"),
                format!("{:?} is not a function name (1–64 of a-z, A-Z, 0-9, _ and -)", tool.name),
            ));
        }
        if tools[..i].iter().any(|t| t.name == tool.name) {
            return Err(RequestError::invalid(
                format!("tools[{i}].function.name"),
                format!("{:?} is offered twice", tool.name),
            ));
        }
        if !tool.parameters.is_object() {
            return Err(RequestError::invalid(
                format!("tools[{i}].function.parameters"),
                "the parameters are a JSON schema object",
            ));
        }
    }
    Ok(())
}

/// What one request may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Longest prompt in tokens (0: the context length − 1).
    pub max_prompt_tokens: usize,
    /// Most tokens one choice may generate.
    pub max_tokens: usize,
    /// Most choices per prompt.
    pub max_n: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self { max_prompt_tokens: 0, max_tokens: 4096, max_n: 8 }
    }
}

/// Alternatives per token a request may ask log-probabilities for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A checked request, ready to run: its prompts as token ids and each choice's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub(crate) prompts: Vec<Vec<u32>>,
    pub(crate) params: GenerateParams,
    pub(crate) n: usize,
    pub(crate) session: Option<String>,
    /// Whether the choices report log-probabilities.
    pub(crate) logprobs: bool,
}

impl Prepared {
    /// The prompts' token ids (a chat has one).
    pub fn prompts(&self) -> &[Vec<u32>] {
        &self.prompts
    }

    /// The parameters every choice runs with (choice `i` adds `i` to the seed).
    pub fn params(&self) -> &GenerateParams {
        &self.params
    }

    /// Choices per prompt.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Whether the choices report log-probabilities.
    pub fn logprobs(&self) -> bool {
        self.logprobs
    }

    /// Every choice in order (prompt by prompt, `n` each): its prompt and parameters, the
    /// seed offset by the choice's index within its prompt so that choices differ.
    pub(crate) fn choices(&self) -> impl Iterator<Item = (&Vec<u32>, GenerateParams)> + '_ {
        self.prompts.iter().flat_map(move |prompt| {
            (0..self.n).map(move |i| {
                let mut params = self.params.clone();
                params.sampling.seed = params.sampling.seed.map(|s| s.wrapping_add(i as u64));
                (prompt, params)
            })
        })
    }
}

/// The model's text side and the limits requests are checked against.
pub struct Frontend {
    /// Shared with the scheduler actor, which decodes the generated text.
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    defaults: GenerationDefaults,
    limits: RequestLimits,
    /// T1: the model's grammar compiler, built by the first constrained request (or `warm_grammar`).
    grammar: OnceLock<Result<Arc<GrammarCompiler>, GrammarError>>,
}

impl Frontend {
    pub fn new(
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        defaults: GenerationDefaults,
        limits: RequestLimits,
    ) -> Self {
        Self { tokenizer: Arc::new(tokenizer), template, defaults, limits, grammar: OnceLock::new() }
    }

    /// A tokenizer alone: no chat template, OpenAI's sampling defaults, default limits.
    pub fn plain(tokenizer: Tokenizer) -> Self {
        Self::new(tokenizer, None, GenerationDefaults::default(), RequestLimits::default())
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The tokenizer as a shared handle (the engine's actors use the same one).
    pub(crate) fn shared_tokenizer(&self) -> Arc<Tokenizer> {
        self.tokenizer.clone()
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    pub fn defaults(&self) -> &GenerationDefaults {
        &self.defaults
    }

    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }

    /// The model's grammar compiler over its vocabulary, padded to the logits' width; the
    /// tokens that end a sequence are the model's and its generation config's eos ids.
    pub fn grammar_compiler(&self, info: &ModelInfo) -> Result<Arc<GrammarCompiler>, GrammarError> {
        self.grammar
            .get_or_init(|| {
                let mut eos = info.eos_token_ids.clone();
                eos.extend(self.defaults.eos_token_ids.iter().filter(|t| !info.eos_token_ids.contains(t)));
                let start = std::time::Instant::now();
                let compiler = GrammarCompiler::new(&self.tokenizer, info.vocab_size, &eos).map(Arc::new);
                tracing::info!(elapsed_ms = start.elapsed().as_millis() as u64, "grammar compiler built");
                compiler
            })
            .clone()
    }

    /// Compiles `constraint` for a model described by `info` (T4: for `GenerateParams`).
    pub fn guidance(&self, constraint: &Constraint, info: &ModelInfo) -> Result<Guidance, RequestError> {
        let compiler =
            self.grammar_compiler(info).map_err(|e| RequestError::general(format!("constrained decoding: {e}")))?;
        let grammar = compiler.compile(constraint).map_err(|e| RequestError::invalid("constraint", e.0))?;
        for warning in grammar.warnings() {
            tracing::warn!(constraint = constraint.kind(), warning, "constraint feature not enforced");
        }
        Ok(Guidance::grammar(grammar))
    }

    /// The prompt token ids of a conversation: roles and tool calls checked (`developer` is
    /// `system`), then the model's chat template (which describes `tools`), then the tokenizer.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, RequestError> {
        if messages.is_empty() {
            return Err(RequestError::invalid("messages", "messages must not be empty"));
        }
        let mut checked = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "system" | "user" | "assistant" | "tool" => m.role.as_str(),
                "developer" => "system",
                other => {
                    return Err(RequestError::invalid(
                        format!("messages[{i}].role"),
                        format!("unknown role {other:?} (system, user, assistant, tool)"),
                    ));
                }
            };
            if !m.tool_calls.is_empty() && role != "assistant" {
                return Err(RequestError::invalid(
                    format!("messages[{i}].tool_calls"),
                    "only assistant messages call tools",
                ));
            }
            for (j, call) in m.tool_calls.iter().enumerate() {
                if call.name.is_empty() {
                    return Err(RequestError::invalid(
                        format!("messages[{i}].tool_calls[{j}].function.name"),
                        "a tool call needs the function's name",
                    ));
                }
                if let Err(e) = serde_json::from_str::<serde_json::Value>(&call.arguments) {
                    return Err(RequestError::invalid(
                        format!("messages[{i}].tool_calls[{j}].function.arguments"),
                        format!("the arguments are not JSON: {e}"),
                    ));
                }
            }
            checked.push(ChatMessage { role: role.into(), ..m.clone() });
        }
        check_tools(tools)?;
        let tools: Vec<serde_json::Value> = tools.iter().map(Tool::to_json).collect();
        let template = self.template.as_ref().ok_or_else(|| RequestError::general("the model has no chat template"))?;
        let text = template
            .render_with_tools(&checked, &tools, add_generation_prompt)
            .map_err(|e| RequestError::invalid("messages", e.to_string()))?;
        self.tokenizer.encode(&text).map_err(|e| RequestError::invalid("messages", e.to_string()))
    }

    /// Checks a chat for a model described by `info` and renders its prompt.
    pub fn prepare_chat(&self, request: &ChatRequest, info: &ModelInfo) -> Result<Prepared, RequestError> {
        let options = &request.options;
        let offered = check_tool_choice(options)?;
        let prompt = self.render_chat(&request.input, if offered { &options.tools } else { &[] }, true)?;
        let mut prepared = self.prepare(vec![prompt], options, info, None, "messages")?;
        self.prepare_tools(&mut prepared.params, options, info)?;
        Ok(prepared)
    }

    /// T3: the constraint and parsing of a chat's tool calls (checked by `check_tool_choice`).
    fn prepare_tools(
        &self,
        params: &mut GenerateParams,
        options: &Options,
        info: &ModelInfo,
    ) -> Result<(), RequestError> {
        if options.tools.is_empty() {
            return Ok(());
        }
        let choice = options.tool_choice.clone().unwrap_or_default();
        let compiler = self.grammar_compiler(info).map_err(|e| RequestError::general(format!("tool calls: {e}")))?;
        let (Some(open), Some(close)) = (compiler.special_token("<tool_call>"), compiler.special_token("</tool_call>"))
        else {
            return Err(RequestError::invalid("tools", "this model's vocabulary has no <tool_call> tags"));
        };
        if choice == ToolChoice::None {
            // A constraint's grammar decides alone (it reaches the tag only by naming it).
            if options.constraint.is_none() {
                params.guidance = Guidance::forbid(vec![open]);
            }
            return Ok(());
        }
        let functions: Vec<(&str, &serde_json::Value)> = options
            .tools
            .iter()
            .filter(|t| match &choice {
                ToolChoice::Function(name) => &t.name == name,
                _ => true,
            })
            .map(|t| (t.name.as_str(), &t.parameters))
            .collect();
        let named = matches!(choice, ToolChoice::Function(_));
        let parallel = options.parallel_tool_calls.unwrap_or(true) && !named;
        let with_open = choice != ToolChoice::Auto;
        let grammar = compiler
            .tool_calls(&functions, (open, close), with_open, parallel)
            .map_err(|e| RequestError::invalid("tools", e.0))?;
        params.guidance = if with_open {
            Guidance::grammar(grammar)
        } else {
            Guidance::after_or_opening(open, grammar, compiler.call_openers().to_vec())
        };
        params.tool_calls = Some(ToolParsing { tags: ToolCallTags { open, close }, finish_with_tool_calls: !named });
        Ok(())
    }

    /// Checks a completion for a model described by `info` and encodes its prompts.
    pub fn prepare_completion(&self, request: &CompletionRequest, info: &ModelInfo) -> Result<Prepared, RequestError> {
        if request.input.is_empty() {
            return Err(RequestError::invalid("prompt", "the prompt list is empty"));
        }
        let mut prompts = Vec::with_capacity(request.input.len());
        for prompt in &request.input {
            prompts.push(match prompt {
                Prompt::Text(text) => {
                    self.tokenizer.encode(text).map_err(|e| RequestError::invalid("prompt", e.to_string()))?
                }
                Prompt::Tokens(ids) => {
                    if let Some(bad) = ids.iter().find(|t| **t as usize >= info.vocab_size) {
                        return Err(RequestError::invalid(
                            "prompt",
                            format!("token id {bad} is not below the vocabulary size {}", info.vocab_size),
                        ));
                    }
                    ids.clone()
                }
            });
        }
        // OpenAI's completions default to 16 tokens.
        self.prepare(prompts, &request.options, info, Some(16), "prompt")
    }

    /// The engine parameters of `prompts` under `options`; `prompt_param` names the input in
    /// errors.
    fn prepare(
        &self,
        prompts: Vec<Vec<u32>>,
        options: &Options,
        info: &ModelInfo,
        default_max_tokens: Option<usize>,
        prompt_param: &str,
    ) -> Result<Prepared, RequestError> {
        let context = info.context_length;
        let max_prompt = match self.limits.max_prompt_tokens {
            0 => context - 1,
            n => n.min(context - 1),
        };
        if prompts.iter().any(Vec::is_empty) {
            return Err(RequestError::invalid(prompt_param, "the prompt is empty"));
        }
        let prompt_len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if prompt_len > max_prompt {
            return Err(RequestError::invalid(
                prompt_param,
                format!(
                    "This model's maximum context length is {} tokens. However, your prompt has {prompt_len} tokens.",
                    max_prompt + 1
                ),
            )
            .with_code("context_length_exceeded"));
        }
        let room = context - prompt_len;
        let max_tokens = match options.max_tokens {
            Some(0) => return Err(RequestError::invalid("max_tokens", "max_tokens must be at least 1, got 0")),
            Some(m) if m > self.limits.max_tokens => {
                return Err(RequestError::invalid(
                    "max_tokens",
                    format!("max_tokens is {m}; this server allows at most {}", self.limits.max_tokens),
                ));
            }
            Some(m) if m > room => {
                return Err(RequestError::invalid(
                    "max_tokens",
                    format!(
                        "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt_len} in the prompt, {m} in the completion).",
                        prompt_len + m
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            Some(m) => m,
            None => default_max_tokens.unwrap_or(self.limits.max_tokens).min(room),
        };
        let n = options.n.unwrap_or(1);
        if n == 0 || n > self.limits.max_n {
            return Err(RequestError::invalid("n", format!("n must be between 1 and {}, got {n}", self.limits.max_n)));
        }
        let top_logprobs = options.logprobs.unwrap_or(0);
        if top_logprobs > MAX_TOP_LOGPROBS {
            return Err(RequestError::invalid(
                "top_logprobs",
                format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs}"),
            ));
        }
        if options.stop.len() > 16 || options.stop.iter().any(String::is_empty) {
            return Err(RequestError::invalid("stop", "stop takes at most 16 non-empty strings"));
        }
        let d = &self.defaults;
        let mut logit_bias = options.logit_bias.clone();
        logit_bias.sort_by_key(|(id, _)| *id);
        let sampling = SamplingParams {
            temperature: options.temperature.unwrap_or(d.temperature),
            top_k: match options.top_k {
                None => d.top_k,
                Some(0) => None,
                Some(k) => Some(k),
            },
            top_p: options.top_p.unwrap_or(d.top_p),
            min_p: options.min_p.unwrap_or(d.min_p),
            repetition_penalty: options.repetition_penalty.unwrap_or(d.repetition_penalty),
            presence_penalty: options.presence_penalty.unwrap_or(0.0),
            frequency_penalty: options.frequency_penalty.unwrap_or(0.0),
            logit_bias,
            seed: options.seed,
            top_logprobs,
        };
        let mut stop_token_ids = options.stop_token_ids.clone();
        if !options.ignore_eos {
            stop_token_ids.extend(&d.eos_token_ids);
        }
        let guidance = match &options.constraint {
            Some(c) => self.guidance(c, info)?,
            None => Guidance::default(),
        };
        let params = GenerateParams {
            max_tokens,
            sampling,
            stop: options.stop.clone(),
            stop_token_ids,
            ignore_eos: options.ignore_eos,
            guidance,
            tool_calls: None,
            speculative: options.speculative,
        };
        Ok(Prepared { prompts, params, n, session: options.session.clone(), logprobs: options.logprobs.is_some() })
    }
}
