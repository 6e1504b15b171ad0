//! E9 (offline part): blocking batch generation. `Llm::generate` runs the engine's step loop —
//! schedule → run → postprocess — over the same `Scheduler` and `Executor` the actors use, so
//! prompts are continuously batched exactly as in serving.

use std::time::Duration;

use llaisys_model::sampling::SamplingError;
use llaisys_model::tokenizer::TokenizerError;
use llaisys_model::{Context, DecodeError, LanguageModel, Sampler, SamplingParams, Tokenizer};

use crate::request::{FinishReason, RequestId, TextStream};
use crate::scheduler::{AdmissionError, Finished, Scheduler, SchedulerConfig, Sequence, StopConditions};
use crate::worker::Executor;

/// Sizes and budgets of one engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    /// KV cache cells (tokens across all sequences).
    pub kv_capacity: usize,
    pub max_seqs_per_step: usize,
    pub max_tokens_per_step: usize,
    /// Most prompt tokens in a step that also decodes (bounds the decoding sequences'
    /// inter-token gap while prompts are prefilled).
    pub max_prefill_tokens_while_decoding: usize,
    /// A step that decodes takes at most this many times a decode-only step: its prefill is
    /// sized from the step cost learnt as the engine runs (0: only the token bound).
    pub prefill_step_factor: f64,
    /// Reuse the cells of finished requests for later prompts with the same prefix (E5).
    pub prefix_caching: bool,
    /// A session with no request for this long is ended and its cells freed (E6).
    pub session_idle_timeout: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            kv_capacity: 8192,
            max_seqs_per_step: 32,
            max_tokens_per_step: 512,
            max_prefill_tokens_while_decoding: 256,
            prefill_step_factor: 2.0,
            prefix_caching: true,
            session_idle_timeout: Duration::from_secs(600),
        }
    }
}

impl EngineConfig {
    /// The scheduler's settings for a model of `context_length`.
    pub fn scheduler(&self, context_length: usize) -> SchedulerConfig {
        SchedulerConfig {
            max_seqs_per_step: self.max_seqs_per_step,
            max_tokens_per_step: self.max_tokens_per_step,
            max_prefill_tokens_while_decoding: self.max_prefill_tokens_while_decoding,
            prefill_step_factor: self.prefill_step_factor,
            kv_capacity: self.kv_capacity,
            context_length,
            prefix_caching: self.prefix_caching,
        }
    }
}

/// What to generate for each prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop strings: the text ends before the first one and never contains it.
    pub stop: Vec<String>,
    /// Extra stop token ids (the model's eos ids apply unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 16,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
        }
    }
}

impl GenerateParams {
    /// When a request with these parameters stops: its own stop ids plus the model's `eos`
    /// ids (unless `ignore_eos`), after `max_tokens`.
    pub fn stop_conditions(&self, eos: &[u32]) -> StopConditions {
        let mut stop_token_ids = self.stop_token_ids.clone();
        if !self.ignore_eos {
            stop_token_ids.extend(eos);
        }
        StopConditions { max_tokens: self.max_tokens, stop_token_ids }
    }
}

/// One prompt's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated token ids (the stop token included when one ended it).
    pub tokens: Vec<u32>,
    /// Generated text without special tokens and without any stop string; `None` without a tokenizer.
    pub text: Option<String>,
    pub finish: FinishReason,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("prompt {index}: {source}")]
    Admission { index: usize, source: AdmissionError },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Rejected(#[from] AdmissionError),
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("the model '{name}' is not served; available: {available}")]
    UnknownModel { name: String, available: String },
    #[error("the model name '{0}' is already served")]
    DuplicateModel(String),
    #[error("invalid session id: {0}")]
    InvalidSession(String),
    #[error("the model's worker failed and could not be restarted: {0}")]
    WorkerLost(String),
    #[error("engine actor: {0}")]
    Actor(String),
}

/// An offline engine over one model. Its scheduler lives as long as it does, so cached
/// prefixes carry over from one `generate` call to the next.
pub struct Llm {
    executor: Executor,
    scheduler: Scheduler,
    tokenizer: Option<Tokenizer>,
    next_id: RequestId,
}

impl Llm {
    pub fn new(model: Box<dyn LanguageModel>, tokenizer: Option<Tokenizer>, config: EngineConfig) -> Self {
        let scheduler = Scheduler::new(config.scheduler(model.info().context_length));
        let ctx = Context::new(model, config.kv_capacity);
        Self { executor: Executor::new(ctx), scheduler, tokenizer, next_id: 0 }
    }

    /// The scheduler's counters (preemptions, prefix-cache queries and hits).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Generates for every prompt (token ids) and returns the completions in prompt order.
    pub fn generate(&mut self, prompts: &[Vec<u32>], params: &GenerateParams) -> Result<Vec<Completion>, EngineError> {
        let info = self.executor.context().info().clone();
        params.sampling.validate(info.vocab_size)?;
        let scheduler = &mut self.scheduler;
        let base = self.next_id;
        for (index, prompt) in prompts.iter().enumerate() {
            let stop = params.stop_conditions(&info.eos_token_ids);
            if let Err(source) = scheduler.add(Sequence::new(base + index as RequestId, prompt.clone(), stop)) {
                for earlier in 0..index {
                    scheduler.finish_request(base + earlier as RequestId, FinishReason::Abort);
                }
                return Err(EngineError::Admission { index, source });
            }
        }
        self.next_id += prompts.len() as RequestId;
        for (index, prompt) in prompts.iter().enumerate() {
            self.executor.add_request(base + index as RequestId, Sampler::new(params.sampling.clone(), prompt));
        }
        // Per prompt: its text stream and the text so far.
        let mut texts: Vec<(TextStream, String)> =
            prompts.iter().map(|_| (TextStream::new(params.stop.iter().cloned()), String::new())).collect();
        let mut done: Vec<Option<Finished>> = vec![None; prompts.len()];
        while let Some(plan) = scheduler.schedule() {
            let start = std::time::Instant::now();
            let sampled = self.executor.execute(&plan)?;
            scheduler.record_step(&plan, start.elapsed());
            let tokens: Vec<Option<u32>> = sampled.iter().map(|s| s.as_ref().map(|s| s.token)).collect();
            for (item, token) in plan.items.iter().zip(&tokens) {
                if let (Some(t), Some(tokenizer)) = (token, &self.tokenizer) {
                    let (stream, text) = &mut texts[(item.id - base) as usize];
                    text.push_str(&stream.push(tokenizer, *t)?);
                }
            }
            for f in scheduler.postprocess(&plan, &tokens) {
                let id = (f.id - base) as usize;
                let reason = if texts[id].0.stopped() { FinishReason::Stop } else { f.reason };
                done[id] = Some(Finished { reason, ..f });
            }
            for (id, (stream, _)) in texts.iter().enumerate() {
                if stream.stopped() && done[id].is_none() {
                    done[id] = scheduler.finish_request(base + id as RequestId, FinishReason::Stop);
                }
            }
        }
        let mut completions = Vec::with_capacity(prompts.len());
        for (id, (finished, (mut stream, mut text))) in done.into_iter().zip(texts).enumerate() {
            self.executor.remove_request(base + id as RequestId);
            let finished = finished.ok_or_else(|| DecodeError::Internal(format!("request {id} never finished")))?;
            let text = match &self.tokenizer {
                Some(tokenizer) => {
                    text.push_str(&stream.finish(tokenizer)?);
                    Some(text)
                }
                None => None,
            };
            completions.push(Completion { tokens: finished.output, text, finish: finished.reason });
        }
        Ok(completions)
    }
}
