//! E9 (offline part): blocking batch generation. `Llm` runs the engine's step loop — schedule →
//! run → postprocess — over the same `Frontend` checks, `Scheduler`, `Executor`, `Postprocess`
//! and `AnswerBuilder` the actors and the server use, so requests are checked, continuously
//! batched and answered exactly as in serving.

use std::sync::Arc;
use std::time::Instant;

use llaisys_model::{Constraint, Guidance, LanguageModel, Tokenizer};

use crate::engine::{EngineConfig, EngineError};
use crate::host::{
    Answer, AnswerBuilder, ChatRequest, CompletionRequest, Frontend, GenerateParams, ModelText, RequestLimits,
    ValidChoice, ValidRequest,
};
use crate::request::{FinishReason, Postprocess, RequestId, ToolCallOut};
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

/// An offline engine over one model. Its scheduler lives as long as it does, so cached
/// prefixes carry over from one call to the next.
pub struct Llm {
    executor: Executor,
    scheduler: Scheduler,
    frontend: Frontend,
    next_id: RequestId,
    /// Whether requests that do not say speculate.
    speculative: bool,
}

/// One choice being run: where its events go and what turns its tokens into them.
struct Job {
    /// Its request and its place among the request's choices.
    request: usize,
    choice: usize,
    output: Postprocess,
    finished: Option<Finished>,
    /// Its prompt and session, kept when its answer may be started over
    /// (`GenerateParams::text_retry`).
    origin: Option<(Vec<u32>, Option<String>)>,
}

impl Llm {
    /// An offline engine; a tokenizer alone gives text but no chat (no template).
    pub fn new(model: Box<dyn LanguageModel>, tokenizer: Option<Tokenizer>, config: EngineConfig) -> Self {
        Self::with_text(model, tokenizer.map(ModelText::plain), RequestLimits::default(), config)
    }

    /// An offline engine with the model's text side, checking requests against `limits`
    /// (`Engine::builder().build_offline()`).
    pub fn with_text(
        model: Box<dyn LanguageModel>,
        text: Option<ModelText>,
        limits: RequestLimits,
        config: EngineConfig,
    ) -> Self {
        let info = model.info().clone();
        let scheduler = Scheduler::new(config, info.context_length).with_states(info.state_bytes);
        let frontend = Frontend::new(info, text, limits, Some(config.kv_capacity));
        let vocab = model.info().vocab_size;
        let ctx = config.context(model);
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
    /// Every request is checked first (none runs if one is refused), exactly as `Engine::chat`
    /// checks it.
    pub fn chat(&mut self, requests: &[ChatRequest]) -> Result<Vec<Answer>, EngineError> {
        let valid = requests.iter().map(|r| self.frontend.chat(r)).collect::<Result<Vec<_>, _>>()?;
        self.run(&valid)
    }

    /// Runs completion requests together and returns their answers in order.
    pub fn complete(&mut self, requests: &[CompletionRequest]) -> Result<Vec<Answer>, EngineError> {
        let valid = requests.iter().map(|r| self.frontend.completion(r)).collect::<Result<Vec<_>, _>>()?;
        self.run(&valid)
    }

    /// Generates for every prompt (token ids) with `params` as they are and returns the
    /// completions in prompt order; a prompt that cannot run is refused naming it.
    pub fn generate(&mut self, prompts: &[Vec<u32>], params: &GenerateParams) -> Result<Vec<Completion>, EngineError> {
        let valid = self.frontend.token_prompts(prompts.to_vec(), params.clone(), None)?;
        let answer = self.run(std::slice::from_ref(&valid))?.pop().expect("one answer per request");
        let with_text = self.frontend.tokenizer().is_some();
        let completions = answer.choices.into_iter().map(|c| Completion {
            tokens: c.tokens,
            text: with_text.then_some(c.text),
            finish: c.finish,
            tool_calls: c.tool_calls,
        });
        Ok(completions.collect())
    }

    /// The model's tokenizer, if it has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.frontend.tokenizer()
    }

    /// Where requests are checked: the model's sizes, text side and request limits.
    pub fn frontend(&self) -> &Frontend {
        &self.frontend
    }

    /// Compiles a constraint for `GenerateParams::guidance` (T4).
    pub fn guidance(&self, constraint: &Constraint) -> Result<Guidance, EngineError> {
        self.frontend.guidance(constraint)
    }

    /// The scheduler's counters (preemptions, prefix-cache queries and hits).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Runs every choice of every request to the end, continuously batched, and gathers each
    /// request's answer.
    fn run(&mut self, requests: &[ValidRequest]) -> Result<Vec<Answer>, EngineError> {
        let tokenizer = self.frontend.shared_tokenizer();
        let mut answers: Vec<AnswerBuilder> = Vec::with_capacity(requests.len());
        let mut jobs: Vec<Job> = Vec::new();
        let base = self.next_id;
        for (r, request) in requests.iter().enumerate() {
            let choices = request.choices();
            answers.push(AnswerBuilder::new(choices.len(), request.n(), request.logprobs()));
            for (choice, ValidChoice { prompt, params, session }) in choices.into_iter().enumerate() {
                let id = base + jobs.len() as RequestId;
                let output = Postprocess::new(prompt.len(), &params, tokenizer.clone());
                let origin = params.text_retry.is_some().then(|| (prompt.clone(), session.clone()));
                self.add(id, prompt, params, session);
                jobs.push(Job { request: r, choice, output, finished: None, origin });
            }
        }
        self.next_id += jobs.len() as RequestId;
        if let Err(e) = self.steps(base, &mut jobs, &mut answers) {
            // Nothing of the failed run stays behind for the next one.
            for k in 0..jobs.len() as RequestId {
                self.scheduler.finish_request(base + k, FinishReason::Error);
                self.executor.remove_request(base + k);
            }
            return Err(e);
        }
        for (k, mut job) in jobs.into_iter().enumerate() {
            self.executor.remove_request(base + k as RequestId);
            let f = job.finished.ok_or(llaisys_model::DecodeError::Internal(format!("choice {k} never finished")))?;
            for event in job.output.finish(f.reason, f.output.len(), f.cached_tokens, f.queue_time)? {
                answers[job.request].add(job.choice, event);
            }
        }
        Ok(answers.into_iter().map(AnswerBuilder::finish).collect())
    }

    /// Steps until every job finished; the events of each go to its request's answer.
    fn steps(&mut self, base: RequestId, jobs: &mut [Job], answers: &mut [AnswerBuilder]) -> Result<(), EngineError> {
        while let Some(plan) = self.scheduler.schedule() {
            let start = Instant::now();
            let outputs = self.executor.execute(&plan)?;
            let outcomes = outcomes(&outputs);
            self.scheduler.record_step(&plan, &outcomes, start.elapsed());
            let mut retries = Vec::new();
            for (item, output) in plan.items.iter().zip(outputs) {
                let job = &mut jobs[(item.id - base) as usize];
                if !output.prompt_logprobs.is_empty() {
                    job.output.prompt_logprobs(output.prompt_logprobs);
                }
                for sampled in output.sampled {
                    for event in job.output.token(sampled)? {
                        answers[job.request].add(job.choice, event);
                    }
                    if let Some(params) = job.output.retry() {
                        retries.push((item.id, params));
                    }
                }
            }
            for f in self.scheduler.postprocess(&plan, &outcomes) {
                let job = (f.id - base) as usize;
                jobs[job].finished = Some(f);
            }
            // An answer that was a call written as text no tool fits is started over once the
            // step is in, as the scheduler actor does, even if its first attempt just finished.
            for (id, params) in retries {
                let job = &mut jobs[(id - base) as usize];
                let failed = job.finished.as_ref().is_some_and(|f| f.reason == FinishReason::Error);
                match &job.origin {
                    Some((prompt, session)) if !failed => {
                        let speculating = params.speculative.unwrap_or(self.speculative);
                        self.executor.remove_request(id);
                        self.executor.add_request(id, Lane::fresh(prompt, params.clone(), speculating));
                        self.scheduler.restart(id, prompt.clone(), session.clone(), params.clone(), speculating);
                        job.finished = None;
                        job.output.restarted(&params);
                    }
                    _ => job.output.not_restarted(),
                }
            }
            // A stop string (or the time limit) ends its sequence at the next step, as the
            // request actor's does.
            for (k, job) in jobs.iter_mut().enumerate().filter(|(_, job)| job.finished.is_none()) {
                let reason = if job.output.stopped() {
                    FinishReason::Stop
                } else if job.output.out_of_time() {
                    // No more tokens shown: those sampled before the sequence ends are not.
                    job.output.close();
                    FinishReason::Length
                } else {
                    continue;
                };
                job.finished = self.scheduler.finish_request(base + k as RequestId, reason);
            }
        }
        Ok(())
    }

    /// Queues a checked choice as request `id`: its sequence and its sampler.
    fn add(&mut self, id: RequestId, prompt: Vec<u32>, params: Arc<GenerateParams>, session: Option<String>) {
        let speculating = params.speculative.unwrap_or(self.speculative);
        let seq = Sequence::new(id, prompt, params.clone()).in_session(session).speculating(speculating);
        let lane = Lane::fresh(&seq.tokens, params, speculating);
        self.scheduler.add(seq);
        self.executor.add_request(id, lane);
    }
}
