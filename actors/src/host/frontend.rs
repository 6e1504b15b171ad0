//! From a request to a `ValidRequest`: the model's chat template and tokenizer turn the input
//! into prompt token ids, the generation defaults and the request limits turn its options into
//! engine parameters, and `validate` checks the result against the model and the KV cache. The
//! library, the HTTP server and the offline engine all go through here, so the same request
//! tokenizes and validates identically through each (C10).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use llaisys_model::Image;
use llaisys_model::tokenizer::{ChatMessage, FimPrompt, FimTokens};
use llaisys_model::vision::{PromptImages, VisionInfo};
use llaisys_model::{
    CallSyntax, Constraint, GrammarCompiler, Guidance, ModelInfo, SamplingParams, ThinkStart, Thinking, Tokenizer,
};

use super::embed::{self, EmbedRequest, ValidEmbed};
use super::params::GenerateParams;
use super::request::{ChatRequest, CompletionRequest, GenerateRequest, Infill, Options, Prompt, RequestError, Tool};
use super::rerank::{self, RerankRequest, ValidRerank};
use super::text::{GenerationDefaults, ModelText};
use super::tools::{check_tool_choice, check_tools, constrain_calls, constrain_harmony};
use super::validate::{Bounds, Unchecked, ValidRequest, check_prompts};
use crate::engine::EngineError;
use crate::request::{HarmonyParsing, ReasoningParsing};

/// What one request may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct RequestLimits {
    /// Longest prompt in tokens (0: the context length − 1).
    pub max_prompt_tokens: usize,
    /// Most tokens one choice may generate.
    pub max_tokens: usize,
    /// Most choices per prompt.
    pub max_n: usize,
    /// Whether requests may set a `priority` (vLLM's `--scheduling-policy`).
    pub scheduling_policy: SchedulingPolicy,
    /// Most pixels an image is prepared at (0: the model's processor's `max_pixels`): a larger
    /// one is scaled down as the processor scales one past its own bound, to fewer tokens.
    pub max_image_pixels: usize,
}

/// [`RequestLimits::max_image_pixels`]' default: 1,280 tokens of Qwen2-VL's 28×28 pixels, the
/// bound Qwen's model cards suggest and transformers' processor has where its config sets none
/// (the released configs allow 16,384 tokens, minutes of the vision tower on a CPU).
pub const DEFAULT_MAX_IMAGE_PIXELS: usize = 1280 * 28 * 28;

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_prompt_tokens: 0,
            max_tokens: 4096,
            max_n: 8,
            scheduling_policy: SchedulingPolicy::Fcfs,
            max_image_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        }
    }
}

/// How the engine orders the requests it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingPolicy {
    /// First come, first served: a request's `priority` must be 0.
    #[default]
    Fcfs,
    /// By `priority` (lower first), then arrival; a less urgent sequence is preempted first.
    Priority,
}

/// Alternatives per token a request may ask log-probabilities for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The model's sizes, its text side and the limits requests are checked against: the one place
/// a request becomes a `ValidRequest`.
pub struct Frontend {
    /// Tells the requests this frontend checked from others (`ValidRequest::checked_by`).
    id: u64,
    info: ModelInfo,
    /// Absent for an engine started without a tokenizer (token ids only).
    text: Option<ModelText>,
    limits: RequestLimits,
    /// Cells of the engine's KV cache (`None` where requests run elsewhere: a cluster's front).
    kv_capacity: Option<usize>,
    /// The ids that end a choice unless it ignores them (the model's, then its generation
    /// config's).
    eos: Vec<u32>,
}

impl Frontend {
    /// `info`'s image processor, where it has one, takes images of at most
    /// `limits.max_image_pixels` (never fewer than its `min_pixels`).
    pub fn new(
        mut info: ModelInfo,
        text: Option<ModelText>,
        limits: RequestLimits,
        kv_capacity: Option<usize>,
    ) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        if let Some(p) = info.vision.as_mut().map(|v| &mut v.processor)
            && limits.max_image_pixels > 0
        {
            p.max_pixels = p.max_pixels.min(limits.max_image_pixels.max(p.min_pixels));
        }
        let mut eos = info.eos_token_ids.clone();
        if let Some(t) = &text {
            eos.extend(t.defaults.eos_token_ids.iter().filter(|id| !info.eos_token_ids.contains(id)));
        }
        Self { id: NEXT.fetch_add(1, Ordering::Relaxed), info, text, limits, kv_capacity, eos }
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// What the model is (vocabulary, context length, eos ids).
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn limits(&self) -> &RequestLimits {
        &self.limits
    }

    /// The most tokens one sequence may hold: the model's context, within the KV cache's cells.
    pub fn context(&self) -> usize {
        self.kv_capacity.map_or(self.info.context_length, |c| c.min(self.info.context_length))
    }

    /// How a request that sets no sampling option samples: the model's generation defaults, then
    /// OpenAI's (what llama.cpp's `/props` reports).
    pub fn default_sampling(&self) -> SamplingParams {
        let defaults = self.text.as_ref().map(ModelText::defaults).cloned().unwrap_or_default();
        sampling(&Options::default(), &defaults, 0)
    }

    /// The model's text side, if the engine has one.
    pub fn text(&self) -> Option<&ModelText> {
        self.text.as_ref()
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.text.as_ref().map(ModelText::tokenizer)
    }

    /// The tokenizer as a shared handle (the engine's actors decode with the same one).
    pub(crate) fn shared_tokenizer(&self) -> Option<Arc<Tokenizer>> {
        self.text.as_ref().map(|t| t.tokenizer.clone())
    }

    fn text_side(&self) -> Result<&ModelText, EngineError> {
        self.text.as_ref().ok_or(EngineError::NoTokenizer)
    }

    /// The model's grammar compiler over its vocabulary, padded to the logits' width.
    pub fn grammar_compiler(&self) -> Result<Arc<GrammarCompiler>, EngineError> {
        self.text_side()?.grammar_compiler(&self.info).map_err(EngineError::Grammar)
    }

    /// Compiles `constraint` for `GenerateParams::guidance` (T4: token-level requests take the
    /// same constraints as chats and completions).
    pub fn guidance(&self, constraint: &Constraint) -> Result<Guidance, EngineError> {
        let grammar =
            self.grammar_compiler()?.compile(constraint).map_err(|e| RequestError::invalid("constraint", e.0))?;
        for warning in grammar.warnings() {
            tracing::warn!(constraint = constraint.kind(), warning, "constraint feature not enforced");
        }
        Ok(Guidance::grammar(grammar))
    }

    /// The prompt token ids of a conversation: roles and tool calls checked (`developer` is
    /// `system`), then the model's chat template (which describes `tools` and is given
    /// `kwargs`, a request's `chat_template_kwargs`), then the tokenizer.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, EngineError> {
        Ok(self.render_chat_images(messages, tools, kwargs, add_generation_prompt)?.0)
    }

    /// [`Self::render_chat`], and the conversation's images where it has any: each image's
    /// placeholder token (the template's, once per image, or the one its [`Framing`](llaisys_model::vision::Framing) puts in
    /// the text) repeated once per feature row, those rows' ids drawn from the image
    /// ([`PromptImages::new`]). A model that sees no images refuses them, naming the message.
    pub fn render_chat_images(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<(Vec<u32>, Option<PromptImages>), EngineError> {
        let text = self.text_side()?;
        if messages.is_empty() {
            return Err(RequestError::invalid("messages", "messages must not be empty").into());
        }
        let checked = messages.iter().enumerate().map(|(i, m)| check_message(i, m)).collect::<Result<Vec<_>, _>>()?;
        check_tools(tools)?;
        let tools: Vec<serde_json::Value> = tools.iter().map(Tool::to_json).collect();
        let template = text.template.as_ref().ok_or_else(|| RequestError::general("the model has no chat template"))?;
        let rendered = template.render_with(&checked, &tools, kwargs, add_generation_prompt).map_err(|e| {
            let param =
                if e.to_string().contains("chat_template_kwargs") { "chat_template_kwargs" } else { "messages" };
            RequestError::invalid(param, e.to_string())
        })?;
        // A template that does not describe tools (Gemma's, Phi-3's) would drop them unseen.
        let without = || template.render_with(&checked, &[], kwargs, add_generation_prompt);
        if !tools.is_empty() && without().is_ok_and(|plain| plain == rendered) {
            let reason = "the model's chat template does not describe tools, so the model would not see them; \
                          describe them in a message instead";
            return Err(RequestError::invalid("tools", reason).into());
        }
        let first = checked.iter().position(|m| !m.images.is_empty());
        // The processor's text around each image, where the template writes only its start.
        let rendered = match self.info.vision.as_ref().filter(|_| first.is_some()) {
            Some(VisionInfo { framing: Some(framing), image_token, .. }) => {
                let piece = |id: u32| {
                    text.tokenizer.decode(&[id], false).map_err(|e| RequestError::invalid("messages", e.to_string()))
                };
                let (start, end, image) = (piece(framing.start)?, piece(framing.end)?, piece(*image_token)?);
                if start.is_empty() {
                    let reason = "the model's image start token reads as no text, so its images cannot be placed";
                    return Err(RequestError::invalid("messages", reason).into());
                }
                rendered.replace(&start, &format!("\n\n{start}{image}{end}\n\n"))
            }
            _ => rendered,
        };
        let ids = text.tokenizer.encode(&rendered).map_err(|e| RequestError::invalid("messages", e.to_string()))?;
        let Some(first) = first else {
            return Ok((ids, None));
        };
        let param = format!("messages[{first}].content");
        let Some(vision) = &self.info.vision else {
            let reason = format!("this model ({}) takes text only, not images", self.info.model_type);
            return Err(RequestError::invalid(param, reason).into());
        };
        let images: Vec<Arc<Image>> = checked.iter().flat_map(|m| m.images.iter().map(|i| i.image.clone())).collect();
        let token = vision.image_token;
        let placeholders = ids.iter().filter(|&&t| t == token).count();
        if placeholders != images.len() {
            let reason = format!(
                "{} images, and the chat template and text give {placeholders} image placeholders",
                images.len()
            );
            return Err(RequestError::invalid(param, reason).into());
        }
        let mut expanded = Vec::with_capacity(ids.len() + images.iter().map(|i| i.tokens()).sum::<usize>());
        let mut next = images.iter();
        for t in ids {
            let n = if t == token { next.next().map_or(1, |i| i.tokens()) } else { 1 };
            expanded.extend(std::iter::repeat_n(t, n));
        }
        let images = PromptImages::new(&mut expanded, vision, images, self.info.vocab_size)
            .map_err(|reason| RequestError::invalid(param, reason))?;
        Ok((expanded, Some(images)))
    }

    /// Checks a chat and renders its prompt.
    pub fn chat(&self, request: &ChatRequest) -> Result<ValidRequest, EngineError> {
        let options = &request.options;
        let offered = check_tool_choice(options)?;
        let tools = if offered { &options.tools[..] } else { &[] };
        let (prompt, images) = self.render_chat_images(&request.input, tools, &options.chat_template_kwargs, true)?;
        if images.is_some() && options.prompt_logprobs.is_some() {
            let reason = "a prompt with images has no log-probabilities for its image tokens; ask without images";
            return Err(RequestError::invalid("prompt_logprobs", reason).into());
        }
        if let Some(tags) = self.text_side()?.harmony {
            return self.harmony_chat(request, prompt, tags);
        }
        // The prompt as text: an image's rows as its token, not the ids drawn for the cache.
        let shown = images.as_ref().map(|images| images.shown(&prompt));
        let text = shown.as_deref().unwrap_or(&prompt);
        let reasoning = self.text_side()?.reasoning.map(|tags| ReasoningParsing::after(tags, text));
        let mut unchecked = self.unchecked(vec![prompt], options, "messages")?;
        unchecked.params.reasoning = reasoning;
        unchecked.params.images = images.map(Arc::new);
        if !options.tools.is_empty() {
            let syntax = self.text_side()?.template.as_ref().map_or(CallSyntax::Json, |t| t.call_syntax());
            constrain_calls(&mut unchecked.params, options, &request.input, syntax, &*self.grammar_compiler()?)?;
        }
        // A reasoning model's constraint applies to its answer, after the thinking.
        let params = &mut unchecked.params;
        if let Some(r) = reasoning
            && (options.thinking_budget.is_some() || !params.guidance.is_free())
        {
            let text = shown.as_deref().unwrap_or(&unchecked.prompts[0]);
            let start = self.think_start(r, text)?;
            let newline = if start == ThinkStart::MayOpen { self.think_newline(text)? } else { None };
            let thinking =
                Thinking { open: r.tags.open, close: r.tags.close, start, budget: options.thinking_budget, newline };
            for guidance in std::iter::once(&mut params.guidance).chain(&mut params.text_retry) {
                *guidance = std::mem::take(guidance).after_thinking(thinking);
            }
        }
        self.check(unchecked, "messages")
    }

    /// A chat of a harmony model (gpt-oss): its messages split by channel into reasoning, answer
    /// and tool calls (`HarmonyParsing`). Tools are called as the model chooses (`auto`), or
    /// the turn is one call (`required`, a named `tool_choice`) after the model's reasoning,
    /// held to the format and the tool's schema; a `thinking_budget` caps the reasoning (the
    /// analysis message). A constrained answer (`response_format`, a grammar) is the final
    /// channel's: the prompt opens that channel (`<|channel|>final<|message|>`), so the grammar
    /// holds from the answer's first token and the model does not reason first.
    fn harmony_chat(
        &self,
        request: &ChatRequest,
        mut prompt: Vec<u32>,
        tags: crate::request::HarmonyTags,
    ) -> Result<ValidRequest, EngineError> {
        let options = &request.options;
        if options.constraint.is_some() {
            let tokenizer = &self.text_side()?.tokenizer;
            let final_channel = tokenizer.encode("final").map_err(|e| RequestError::general(e.to_string()))?;
            prompt.push(tags.channel);
            prompt.extend(final_channel);
            prompt.push(tags.message);
        }
        let harmony = HarmonyParsing::after(tags, &prompt);
        let mut unchecked = self.unchecked(vec![prompt], options, "messages")?;
        unchecked.params.harmony = Some(harmony);
        // A constrained answer comes with no reasoning (and no tools: `check_tool_choice`).
        if options.constraint.is_none() {
            constrain_harmony(&mut unchecked.params, options, tags, || self.grammar_compiler())?;
        }
        self.check(unchecked, "messages")
    }

    /// Where a reasoning model's output starts: inside the think block when the prompt opened
    /// it; after it when the prompt closed it and only whitespace follows (thinking turned off,
    /// as Qwen3's `enable_thinking: false` renders); otherwise before it, free to open it.
    fn think_start(&self, r: ReasoningParsing, prompt: &[u32]) -> Result<ThinkStart, EngineError> {
        if r.starts_open {
            return Ok(ThinkStart::Inside);
        }
        let Some(at) = prompt.iter().rposition(|&t| t == r.tags.close) else {
            return Ok(ThinkStart::MayOpen);
        };
        let after = self.text_side()?.tokenizer.decode(&prompt[at + 1..], false);
        let closed = after.is_ok_and(|text| text.trim().is_empty());
        Ok(if closed { ThinkStart::Closed } else { ThinkStart::MayOpen })
    }

    /// The newline a model may write before opening its think block, where the prompt does not
    /// end with whitespace (GLM's ends at `<|assistant|>`, and its turns begin `\n<think>`), as
    /// one token of the vocabulary, if it is one.
    fn think_newline(&self, prompt: &[u32]) -> Result<Option<u32>, EngineError> {
        let tokenizer = &self.text_side()?.tokenizer;
        let last = prompt.last().and_then(|&t| tokenizer.decode(&[t], false).ok());
        if last.is_some_and(|text| text.ends_with(char::is_whitespace)) {
            return Ok(None);
        }
        Ok(match tokenizer.encode("\n").as_deref() {
            Ok(&[newline]) => Some(newline),
            _ => None,
        })
    }

    /// Checks a completion and encodes its prompts (text, or token ids as they are, or a
    /// fill-in-the-middle prompt in the model's tokens).
    pub fn completion(&self, request: &CompletionRequest) -> Result<ValidRequest, EngineError> {
        if request.input.is_empty() {
            return Err(RequestError::invalid("prompt", "the prompt list is empty").into());
        }
        let options = &request.options;
        let mut prompts = Vec::with_capacity(request.input.len());
        let (mut fim_stops, mut left_out) = (Vec::new(), 0);
        for prompt in &request.input {
            prompts.push(match prompt {
                Prompt::Infill(infill) => {
                    let (fim, prompt) = self.infill_ids(infill, options.max_tokens.or(options.default_max_tokens))?;
                    fim_stops = fim.stops();
                    left_out += prompt.files_left_out;
                    prompt.ids
                }
                other => self.prompt_id(other, "prompt")?,
            });
        }
        let mut unchecked = self.unchecked(prompts, options, "prompt")?;
        // A middle also ends at the model's padding and at the start of another file (for every
        // prompt of the request; `check` drops repeated ids).
        unchecked.params.stop_token_ids.extend(fim_stops);
        Ok(self.check(unchecked, "prompt")?.with_context_left_out(left_out))
    }

    /// A fill-in-the-middle prompt's ids within the prompt's room, `max_tokens` (a quarter of
    /// the context where not given) left for the middle; the model's tokens.
    fn infill_ids(&self, infill: &Infill, max_tokens: Option<usize>) -> Result<(FimTokens, FimPrompt), EngineError> {
        let text = self.text_side()?;
        let fim = text.fim.ok_or_else(|| {
            RequestError::invalid(
                "suffix",
                "this model has no fill-in-the-middle tokens (such as <|fim_prefix|>, <|fim_suffix|> and <|fim_middle|>): it cannot fill in between a prefix and a suffix",
            )
        })?;
        let max_prompt = self.bounds().max_prompt;
        let budget = max_prompt.saturating_sub(max_tokens.unwrap_or(self.info.context_length / 4));
        let prompt =
            fim.prompt(&text.tokenizer, infill, budget).map_err(|e| RequestError::invalid("prompt", e.to_string()))?;
        Ok((fim, prompt))
    }

    /// Checks an embedding request and tokenizes its text inputs as completions' prompts are.
    pub fn embedding(&self, request: &EmbedRequest) -> Result<ValidEmbed, EngineError> {
        let inputs = self.prompt_ids(&request.inputs, "input")?;
        let info = &self.info;
        Ok(embed::check(request, inputs, info.vocab_size, info.context_length, info.hidden_size, info.pooling)?)
    }

    /// Checks a request for a yes/no reranker and tokenizes its judging prompts.
    pub fn rerank(&self, request: &RerankRequest) -> Result<ValidRerank, EngineError> {
        let text = self.text_side()?;
        let judge = text.judge.ok_or_else(|| {
            RequestError::invalid("model", "this model is not a yes/no reranker (it reranks with its embeddings)")
        })?;
        Ok(rerank::check(request, text, judge, self.info.context_length)?)
    }

    /// Prompts as token ids ([`Self::prompt_id`]).
    fn prompt_ids(&self, prompts: &[Prompt], param: &str) -> Result<Vec<Vec<u32>>, EngineError> {
        prompts.iter().map(|prompt| self.prompt_id(prompt, param)).collect()
    }

    /// A prompt as token ids: text encoded as a prompt (with the BOS token where the model's
    /// tokenizer adds one), ids as they are; an encoding error names `param`. A
    /// fill-in-the-middle prompt is a completion's only (`completion` encodes it).
    fn prompt_id(&self, prompt: &Prompt, param: &str) -> Result<Vec<u32>, EngineError> {
        match prompt {
            Prompt::Text(text) => {
                let tokenizer = &self.text_side()?.tokenizer;
                Ok(tokenizer.encode_prompt(text).map_err(|e| RequestError::invalid(param, e.to_string()))?)
            }
            Prompt::Tokens(ids) => Ok(ids.clone()),
            Prompt::Infill(_) => {
                Err(RequestError::invalid(param, "a fill-in-the-middle prompt is only a completion's").into())
            }
        }
    }

    /// Checks a request of token ids with engine parameters as they are (no defaults applied).
    pub fn generate(&self, request: GenerateRequest) -> Result<ValidRequest, EngineError> {
        let GenerateRequest { prompt, params, session } = request;
        self.token_prompts(vec![prompt], params, session)
    }

    /// Checks prompts of token ids, one choice each, with engine parameters as they are.
    pub fn token_prompts(
        &self,
        prompts: Vec<Vec<u32>>,
        params: GenerateParams,
        session: Option<String>,
    ) -> Result<ValidRequest, EngineError> {
        let logprobs = params.sampling.wants_logprobs();
        self.check(Unchecked { prompts, params, n: 1, session, logprobs }, "prompt")
    }

    fn check(&self, unchecked: Unchecked, prompt_param: &str) -> Result<ValidRequest, EngineError> {
        Ok(unchecked.check(&self.bounds(), prompt_param, self.id)?)
    }

    fn bounds(&self) -> Bounds<'_> {
        let max_prompt = match self.limits.max_prompt_tokens {
            0 => self.info.context_length - 1,
            n => n.min(self.info.context_length - 1),
        };
        Bounds { info: &self.info, kv_capacity: self.kv_capacity, max_prompt, eos: &self.eos }
    }

    /// The engine parameters of `prompts` under `options`: the model's generation defaults where
    /// the options say nothing, and the request limits; `prompt_param` names the input in errors.
    fn unchecked(
        &self,
        prompts: Vec<Vec<u32>>,
        options: &Options,
        prompt_param: &str,
    ) -> Result<Unchecked, EngineError> {
        // The prompts first: a prompt too long for the context is that, whatever max_tokens says.
        check_prompts(&prompts, &self.bounds(), prompt_param)?;
        let context = self.info.context_length;
        let prompt_len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let room = context - prompt_len;
        let max_tokens = match options.max_tokens {
            Some(0) => return Err(RequestError::invalid("max_tokens", "max_tokens must be at least 1, got 0").into()),
            Some(m) if m > self.limits.max_tokens => {
                let message = format!("max_tokens is {m}; this server allows at most {}", self.limits.max_tokens);
                return Err(RequestError::invalid("max_tokens", message).into());
            }
            Some(m) if m > room => {
                let message = format!(
                    "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt_len} in the prompt, {m} in the completion).",
                    prompt_len + m
                );
                return Err(RequestError::invalid("max_tokens", message).with_code("context_length_exceeded").into());
            }
            Some(m) => m,
            None => options.default_max_tokens.unwrap_or(self.limits.max_tokens).min(self.limits.max_tokens).min(room),
        };
        let n = options.n.unwrap_or(1);
        if n == 0 || n > self.limits.max_n {
            let message = format!("n must be between 1 and {}, got {n}", self.limits.max_n);
            return Err(RequestError::invalid("n", message).into());
        }
        let top_logprobs = options.logprobs.unwrap_or(0);
        if top_logprobs > MAX_TOP_LOGPROBS {
            let message = format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs}");
            return Err(RequestError::invalid("top_logprobs", message).into());
        }
        if options.stop.len() > 16 || options.stop.iter().any(String::is_empty) {
            return Err(RequestError::invalid("stop", "stop takes at most 16 non-empty strings").into());
        }
        if options.priority != 0 && self.limits.scheduling_policy != SchedulingPolicy::Priority {
            let message =
                "priority scheduling is off on this server (`limits.scheduling_policy = \"priority\"` turns it on)";
            return Err(RequestError::invalid("priority", message).into());
        }
        let defaults = self.text.as_ref().map(ModelText::defaults).cloned().unwrap_or_default();
        let guidance = match &options.constraint {
            Some(c) => self.guidance(c)?,
            None => Guidance::default(),
        };
        let params = GenerateParams {
            max_tokens,
            sampling: sampling(options, &defaults, top_logprobs),
            stop: options.stop.clone(),
            stop_token_ids: options.stop_token_ids.clone(),
            ignore_eos: options.ignore_eos,
            guidance,
            tool_calls: None,
            text_calls: None,
            text_retry: None,
            reasoning: None,
            harmony: None,
            speculative: options.speculative,
            time_limit: options.time_limit,
            priority: options.priority,
            images: None,
        };
        let (session, logprobs) = (options.session.clone(), options.logprobs.is_some());
        Ok(Unchecked { prompts, params, n, session, logprobs })
    }
}

/// The sampling parameters of `options`, the model's `defaults` where they say nothing.
fn sampling(options: &Options, defaults: &GenerationDefaults, top_logprobs: usize) -> SamplingParams {
    let mut logit_bias = options.logit_bias.clone();
    logit_bias.sort_by_key(|(id, _)| *id);
    SamplingParams {
        temperature: options.temperature.unwrap_or(defaults.temperature),
        top_k: match options.top_k {
            None => defaults.top_k,
            Some(0) => None,
            Some(k) => Some(k),
        },
        top_p: options.top_p.unwrap_or(defaults.top_p),
        min_p: options.min_p.unwrap_or(defaults.min_p),
        repetition_penalty: options.repetition_penalty.unwrap_or(defaults.repetition_penalty),
        presence_penalty: options.presence_penalty.unwrap_or(0.0),
        frequency_penalty: options.frequency_penalty.unwrap_or(0.0),
        logit_bias,
        seed: options.seed,
        top_logprobs,
        logprobs: options.logprobs.is_some(),
        post_sampling: options.post_sampling_probs,
        prompt_logprobs: options.prompt_logprobs,
    }
}

/// Message `i` of a conversation as the template takes it: a known role (`developer` is
/// `system`), tool calls only from the assistant, each naming its function with JSON arguments.
fn check_message(i: usize, m: &ChatMessage) -> Result<ChatMessage, RequestError> {
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
        return Err(RequestError::invalid(format!("messages[{i}].tool_calls"), "only assistant messages call tools"));
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
    Ok(ChatMessage { role: role.into(), ..m.clone() })
}
