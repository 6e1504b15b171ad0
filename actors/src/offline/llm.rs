//! E9 (offline part): blocking batch generation. `Llm::generate` runs the engine's step loop —
//! schedule → run → postprocess — over the same `Scheduler` and `Executor` the actors use, so
//! prompts are continuously batched exactly as in serving.

use llaisys_model::{Constraint, Context, DecodeError, Guidance, LanguageModel, ModelInfo, Sampler, Tokenizer};

use crate::engine::{EngineConfig, EngineError, Usage};
use crate::host::{
    Answer, ChatRequest, Choice, CompletionRequest, Frontend, GenerateParams, Prepared, RequestError, TokenLogprob,
};
use crate::request::{FinishReason, RequestId, TextStream, ToolCallOut, ToolParsing};
use crate::scheduler::{Finished, Scheduler, Sequence};
use crate::worker::{Executor, Lane, outcomes};

/// One prompt's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated token ids (the stop token included when one ended it).
    pub tokens: Vec<u32>,
    /// Generated text without special tokens and without any stop string; `None` without a tokenizer.
    pub text: Option<String>,
    pub finish: FinishReason,
    /// T3: the tool calls the output made.
    pub tool_calls: Vec<ToolCallOut>,
}

/// One job's result, with what a chat answer needs besides the completion.
struct JobResult {
    completion: Completion,
    logprobs: Vec<TokenLogprob>,
    cached_tokens: usize,
}

/// An offline engine over one model. Its scheduler lives as long as it does, so cached
/// prefixes carry over from one `generate` call to the next.
pub struct Llm {
    executor: Executor,
    scheduler: Scheduler,
    frontend: Option<Frontend>,
    next_id: RequestId,
    /// Whether requests that do not say speculate.
    speculative: bool,
}

impl Llm {
    /// An offline engine; a tokenizer alone gives text but no chat (no template).
    pub fn new(model: Box<dyn LanguageModel>, tokenizer: Option<Tokenizer>, config: EngineConfig) -> Self {
        Self::with_frontend(model, tokenizer.map(Frontend::plain), config)
    }

    /// An offline engine with the model's text side (`Engine::builder().build_offline()`).
    pub fn with_frontend(model: Box<dyn LanguageModel>, frontend: Option<Frontend>, config: EngineConfig) -> Self {
        let scheduler = Scheduler::new(config.scheduler(model.info().context_length));
        let vocab = model.info().vocab_size;
        let ctx = Context::new(model, config.kv_capacity);
        let executor = Executor::new(ctx).with_proposer(config.proposer(None, vocab));
        Self { executor, scheduler, frontend, next_id: 0, speculative: config.speculative.default_on }
    }

    /// Proposals for speculating requests come from `draft`, a model with the same vocabulary
    /// (the caller checked it; `EngineBuilder::draft_model` does).
    pub fn with_draft(mut self, draft: Box<dyn LanguageModel>, config: &EngineConfig) -> Self {
        let vocab = self.executor.context().info().vocab_size;
        self.executor.set_proposer(config.proposer(Some(draft), vocab));
        self
    }

    /// Runs chat requests together (continuously batched) and returns their answers in order.
    /// The same requests through `Engine::chat` render and validate identically.
    pub fn chat(&mut self, requests: &[ChatRequest]) -> Result<Vec<Answer>, EngineError> {
        self.run_requests(requests, Frontend::prepare_chat)
    }

    /// Runs completion requests together and returns their answers in order.
    pub fn complete(&mut self, requests: &[CompletionRequest]) -> Result<Vec<Answer>, EngineError> {
        self.run_requests(requests, Frontend::prepare_completion)
    }

    /// The model's tokenizer, if it has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.frontend.as_ref().map(Frontend::tokenizer)
    }

    /// Compiles a constraint for `GenerateParams::guidance` (T4).
    pub fn guidance(&self, constraint: &Constraint) -> Result<Guidance, EngineError> {
        let frontend = self.frontend.as_ref().ok_or(EngineError::NoTokenizer)?;
        Ok(frontend.guidance(constraint, self.executor.context().info())?)
    }

    /// Checks every request (none runs if one is refused), then runs them together.
    fn run_requests<R>(
        &mut self,
        requests: &[R],
        prepare: impl Fn(&Frontend, &R, &ModelInfo) -> Result<Prepared, RequestError>,
    ) -> Result<Vec<Answer>, EngineError> {
        let frontend = self.frontend.as_ref().ok_or(EngineError::NoTokenizer)?;
        let info = self.executor.context().info();
        let prepared = requests.iter().map(|r| prepare(frontend, r, info)).collect::<Result<Vec<_>, _>>()?;
        self.run_prepared(prepared)
    }

    fn run_prepared(&mut self, prepared: Vec<Prepared>) -> Result<Vec<Answer>, EngineError> {
        // Every choice of every request as one job, as `Engine::submit` queues them.
        let jobs: Vec<(Vec<u32>, GenerateParams)> =
            prepared.iter().flat_map(Prepared::choices).map(|(prompt, params)| (prompt.clone(), params)).collect();
        let mut results = self.run(&jobs)?.into_iter();
        let mut answers = Vec::with_capacity(prepared.len());
        for p in &prepared {
            let mut usage = Usage::default();
            let mut choices = Vec::new();
            for prompt in &p.prompts {
                for i in 0..p.n {
                    let r = results.next().ok_or_else(|| DecodeError::Internal("a choice went missing".into()))?;
                    if i == 0 {
                        usage.prompt_tokens += prompt.len();
                        usage.cached_tokens += r.cached_tokens;
                    }
                    usage.completion_tokens += r.completion.tokens.len();
                    let logprobs = if p.logprobs { r.logprobs } else { Vec::new() };
                    choices.push(Choice {
                        text: r.completion.text.unwrap_or_default(),
                        tokens: r.completion.tokens,
                        logprobs,
                        finish: r.completion.finish,
                        tool_calls: r.completion.tool_calls,
                    });
                }
            }
            answers.push(Answer { choices, usage });
        }
        Ok(answers)
    }

    /// The scheduler's counters (preemptions, prefix-cache queries and hits).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Generates for every prompt (token ids) and returns the completions in prompt order.
    pub fn generate(&mut self, prompts: &[Vec<u32>], params: &GenerateParams) -> Result<Vec<Completion>, EngineError> {
        let jobs: Vec<(Vec<u32>, GenerateParams)> = prompts.iter().map(|p| (p.clone(), params.clone())).collect();
        Ok(self.run(&jobs)?.into_iter().map(|r| r.completion).collect())
    }

    /// Runs every job (a prompt and its parameters) to the end, continuously batched.
    fn run(&mut self, jobs: &[(Vec<u32>, GenerateParams)]) -> Result<Vec<JobResult>, EngineError> {
        let info = self.executor.context().info().clone();
        for (_, params) in jobs {
            params.sampling.validate(info.vocab_size)?;
        }
        let tokenizer = self.frontend.as_ref().map(Frontend::tokenizer);
        let scheduler = &mut self.scheduler;
        let base = self.next_id;
        for (index, (prompt, params)) in jobs.iter().enumerate() {
            let stop = params.stop_conditions(&info.eos_token_ids);
            let seq = Sequence::new(base + index as RequestId, prompt.clone(), stop)
                .speculating(params.speculative.unwrap_or(self.speculative));
            if let Err(source) = scheduler.add(seq) {
                for earlier in 0..index {
                    scheduler.finish_request(base + earlier as RequestId, FinishReason::Abort);
                }
                return Err(EngineError::Admission { index, source });
            }
        }
        self.next_id += jobs.len() as RequestId;
        for (index, (prompt, params)) in jobs.iter().enumerate() {
            let sampler = Sampler::new(params.sampling.clone(), prompt).guided(&params.guidance);
            let mut lane = Lane::new(sampler);
            if params.speculative.unwrap_or(self.speculative) {
                lane = lane.speculating(prompt.clone(), params.stop_conditions(&info.eos_token_ids).stop_token_ids);
            }
            self.executor.add_request(base + index as RequestId, lane);
        }
        // Per job: its text stream and the text so far.
        let mut texts: Vec<(TextStream, String)> = jobs
            .iter()
            .map(|(_, p)| {
                let stream = TextStream::new(p.stop.iter().cloned()).with_tool_calls(p.tool_calls.map(|t| t.tags));
                (stream, String::new())
            })
            .collect();
        let mut calls: Vec<Vec<ToolCallOut>> = vec![Vec::new(); jobs.len()];
        let mut logprobs: Vec<Vec<TokenLogprob>> = vec![Vec::new(); jobs.len()];
        let mut done: Vec<Option<Finished>> = vec![None; jobs.len()];
        // Per job: the output's length when a stop string ended it (later tokens of the same
        // step, accepted proposals, are not part of it).
        let mut stopped_at: Vec<Option<usize>> = vec![None; jobs.len()];
        while let Some(plan) = scheduler.schedule() {
            let start = std::time::Instant::now();
            let outputs = self.executor.execute(&plan)?;
            let outcomes = outcomes(&outputs);
            scheduler.record_step(&plan, &outcomes, start.elapsed());
            for (item, output) in plan.items.iter().zip(&outputs) {
                let job = (item.id - base) as usize;
                for s in &output.sampled {
                    if stopped_at[job].is_some() {
                        break;
                    }
                    logprobs[job].push(TokenLogprob { token: s.token, logprob: s.logprob, top: s.top.clone() });
                    if let Some(tokenizer) = tokenizer {
                        let (stream, text) = &mut texts[job];
                        let piece = stream.push(tokenizer, s.token)?;
                        text.push_str(&piece.text);
                        if let Some(delta) = piece.tool_call {
                            ToolCallOut::gather(&mut calls[job], &delta);
                        }
                        if stream.stopped() {
                            stopped_at[job] = Some(logprobs[job].len());
                        }
                    }
                }
            }
            for mut f in scheduler.postprocess(&plan, &outcomes) {
                let id = (f.id - base) as usize;
                let reason = if texts[id].0.stopped() { FinishReason::Stop } else { f.reason };
                if let Some(n) = stopped_at[id] {
                    f.output.truncate(n);
                }
                done[id] = Some(Finished { reason, ..f });
            }
            for (id, (stream, _)) in texts.iter().enumerate() {
                if stream.stopped() && done[id].is_none() {
                    done[id] = scheduler.finish_request(base + id as RequestId, FinishReason::Stop).map(|mut f| {
                        f.output.truncate(stopped_at[id].unwrap_or(f.output.len()));
                        f
                    });
                }
            }
        }
        let mut results = Vec::with_capacity(jobs.len());
        let per_job = done.into_iter().zip(texts).zip(logprobs).zip(calls);
        for (id, (((finished, (mut stream, mut text)), logprobs), tool_calls)) in per_job.enumerate() {
            self.executor.remove_request(base + id as RequestId);
            let finished = finished.ok_or_else(|| DecodeError::Internal(format!("request {id} never finished")))?;
            let text = match tokenizer {
                Some(tokenizer) => {
                    text.push_str(&stream.finish(tokenizer)?);
                    Some(text)
                }
                None => None,
            };
            let cached_tokens = finished.cached_tokens;
            let finish = ToolParsing::finish(jobs[id].1.tool_calls, finished.reason, stream.made_tool_calls());
            let completion = Completion { tokens: finished.output, text, finish, tool_calls };
            results.push(JobResult { completion, logprobs, cached_tokens });
        }
        Ok(results)
    }
}
