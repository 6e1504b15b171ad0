//! E3/E4: continuous batching. Each step mixes one decode token of every running sequence with
//! chunks of waiting prompts, under a tokens-per-step and a sequences-per-step budget. Running
//! sequences go first, oldest first, so no long prompt starves them; waiting prompts are
//! admitted in arrival order while the KV cache has room. When a running sequence cannot get
//! cells, the newest running sequence is preempted: its cells are freed and it goes back to the
//! head of the queue to be recomputed. All scheduling policy lives in `schedule`.

use std::collections::VecDeque;

use llaisys_model::kv::MAX_SEQ;
use llaisys_model::{Pos, SeqId};

use super::sequence::Sequence;
use crate::request::{FinishReason, RequestId, RequestState};

/// Budgets and sizes the scheduler works within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences in one forward pass.
    pub max_seqs_per_step: usize,
    /// Most tokens in one forward pass (prefill chunks are cut to fit).
    pub max_tokens_per_step: usize,
    /// Cells of the worker's KV cache.
    pub kv_capacity: usize,
    /// The model's context length.
    pub context_length: usize,
}

/// Why a request was refused at submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the prompt has {prompt} tokens; with room for one generated token it needs {needed} cells, the KV cache has {capacity}"
    )]
    NeverFits { prompt: usize, needed: usize, capacity: usize },
    #[error("the prompt has {prompt} tokens; the model's context is {context}")]
    TooLong { prompt: usize, context: usize },
    #[error("max_tokens must be at least 1")]
    NoTokens,
}

/// One sequence's part of a step: `tokens` at positions `start_pos..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanItem {
    pub id: RequestId,
    pub seq: SeqId,
    pub start_pos: Pos,
    pub tokens: Vec<u32>,
    /// The chunk ends the sequence's known tokens: sample the next one from its last row.
    pub sample: bool,
}

/// What the worker runs in one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Sequences whose cells to drop before the batch (finished, aborted or preempted).
    pub free: Vec<SeqId>,
    pub items: Vec<PlanItem>,
}

/// A sequence that left the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub id: RequestId,
    pub output: Vec<u32>,
    pub reason: FinishReason,
}

#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    free_seqs: Vec<SeqId>,
    /// Cells accounted to admitted sequences (their computed tokens plus this step's).
    kv_used: usize,
    /// Cells to free at the start of the next step.
    to_free: Vec<SeqId>,
    arrivals: u64,
    /// Number of preemptions so far (observable for tests and metrics).
    pub preemptions: u64,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        let seqs = MAX_SEQ.min(u32::MAX as usize) as SeqId;
        Self {
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_seqs: (0..seqs).rev().collect(),
            kv_used: 0,
            to_free: Vec::new(),
            arrivals: 0,
            preemptions: 0,
        }
    }

    /// Queues a sequence, refusing one that could never be served.
    pub fn add(&mut self, mut seq: Sequence) -> Result<(), AdmissionError> {
        let prompt = seq.tokens.len();
        if prompt == 0 {
            return Err(AdmissionError::EmptyPrompt);
        }
        if seq.stop.max_tokens == 0 {
            return Err(AdmissionError::NoTokens);
        }
        if prompt >= self.config.context_length {
            return Err(AdmissionError::TooLong { prompt, context: self.config.context_length });
        }
        if prompt + 1 > self.config.kv_capacity {
            return Err(AdmissionError::NeverFits { prompt, needed: prompt + 1, capacity: self.config.kv_capacity });
        }
        seq.arrival = self.arrivals;
        self.arrivals += 1;
        self.waiting.push_back(seq);
        Ok(())
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty() || !self.to_free.is_empty()
    }
    pub fn n_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn n_running(&self) -> usize {
        self.running.len()
    }
    pub fn kv_used(&self) -> usize {
        self.kv_used
    }

    fn kv_free(&self) -> usize {
        self.config.kv_capacity - self.kv_used
    }

    /// Builds the next step; `None` when there is nothing to run.
    pub fn schedule(&mut self) -> Option<StepPlan> {
        let mut plan = StepPlan { free: std::mem::take(&mut self.to_free), items: Vec::new() };
        let mut budget = self.config.max_tokens_per_step;
        let mut preempted = false;
        // Running sequences, oldest first: a decode token each, or the next prefill chunk.
        let mut i = 0;
        while i < self.running.len() && budget > 0 && plan.items.len() < self.config.max_seqs_per_step {
            let need = self.running[i].pending().min(budget);
            while self.kv_free() < need && i < self.running.len() {
                let victim = self.running.len() - 1; // the newest; possibly `i` itself
                self.preempt(victim, &mut plan);
                preempted = true;
            }
            if i == self.running.len() {
                break; // `i` itself was preempted
            }
            self.plan_item(i, need, &mut plan);
            budget -= need;
            i += 1;
        }
        // Waiting sequences in arrival order while there is room (none while preempting).
        while !preempted && budget > 0 && plan.items.len() < self.config.max_seqs_per_step {
            let Some(front) = self.waiting.front() else { break };
            let need = front.pending().min(budget);
            let Some(seq) = (self.kv_free() >= need).then(|| self.free_seqs.pop()).flatten() else { break };
            let mut s = self.waiting.pop_front().expect("front exists");
            // The state machine allows waiting/preempted → running; anything else is a bug.
            s.state.transition(s.id, RequestState::Running).expect("queued sequences are waiting or preempted");
            s.seq = Some(seq);
            self.running.push(s);
            self.plan_item(self.running.len() - 1, need, &mut plan);
            budget -= need;
        }
        (!plan.items.is_empty() || !plan.free.is_empty()).then_some(plan)
    }

    fn plan_item(&mut self, i: usize, n: usize, plan: &mut StepPlan) {
        let s = &mut self.running[i];
        s.scheduled = n;
        let start = s.computed;
        plan.items.push(PlanItem {
            id: s.id,
            seq: s.seq.expect("running sequences hold a seq id"),
            start_pos: start as Pos,
            tokens: s.tokens[start..start + n].to_vec(),
            sample: start + n == s.tokens.len(),
        });
        self.kv_used += n;
    }

    /// Frees a running sequence's cells and puts it back at the head of the queue.
    fn preempt(&mut self, i: usize, plan: &mut StepPlan) {
        let mut s = self.running.remove(i);
        let seq = s.seq.take().expect("running sequences hold a seq id");
        self.kv_used -= s.computed + s.scheduled;
        plan.items.retain(|it| it.id != s.id);
        (s.computed, s.scheduled) = (0, 0);
        s.state.transition(s.id, RequestState::Preempted).expect("running → preempted is allowed");
        plan.free.push(seq);
        self.free_seqs.push(seq);
        self.preemptions += 1;
        self.waiting.push_front(s);
    }

    /// Applies a step's results: `sampled[k]` is the token sampled for `plan.items[k]` (if it
    /// sampled). Returns the sequences that finished.
    pub fn postprocess(&mut self, plan: &StepPlan, sampled: &[Option<u32>]) -> Vec<Finished> {
        let mut finished = Vec::new();
        for (item, token) in plan.items.iter().zip(sampled) {
            let Some(i) = self.running.iter().position(|s| s.id == item.id) else { continue };
            let s = &mut self.running[i];
            s.computed += item.tokens.len();
            s.scheduled = 0;
            if let Some(t) = token {
                s.tokens.push(*t);
            }
            // A sequence can grow to the context length, and no further than the whole cache.
            let limit = self.config.context_length.min(self.config.kv_capacity);
            if let Some(reason) = s.finish_reason(limit) {
                finished.push(self.finish(i, reason));
            }
        }
        finished
    }

    /// Ends a request wherever it is (abort, stop string, error); `None` if unknown.
    pub fn finish_request(&mut self, id: RequestId, reason: FinishReason) -> Option<Finished> {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            return Some(self.finish(i, reason));
        }
        let i = self.waiting.iter().position(|s| s.id == id)?;
        let mut s = self.waiting.remove(i).expect("index exists");
        s.state.transition(id, RequestState::Finished(reason)).ok()?;
        Some(Finished { id, output: s.output().to_vec(), reason })
    }

    fn finish(&mut self, i: usize, reason: FinishReason) -> Finished {
        let mut s = self.running.remove(i);
        if let Some(seq) = s.seq.take() {
            self.to_free.push(seq);
            self.free_seqs.push(seq);
        }
        self.kv_used -= s.computed + s.scheduled;
        // Stop/length only from running, which `s` is; abort/error from anywhere.
        let _ = s.state.transition(s.id, RequestState::Finished(reason));
        Finished { id: s.id, output: s.output().to_vec(), reason }
    }
}
