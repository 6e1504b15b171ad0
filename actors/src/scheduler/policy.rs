//! E3/E4: continuous batching. Each step mixes one decode token of every running sequence with
//! chunks of waiting prompts, under a tokens-per-step and a sequences-per-step budget. Running
//! sequences go first, oldest first, so no long prompt starves them; while any sequence decodes,
//! prompts get at most a smaller prefill budget per step, so decoding sequences never wait
//! behind a whole prompt's prefill. Waiting prompts are admitted in arrival order while the KV
//! cache has room. When a running sequence cannot get
//! cells, the newest running sequence is preempted: its cells are freed and it goes back to the
//! head of the queue to be recomputed. All scheduling policy lives in `schedule`.
//!
//! Priorities (vLLM's `priority`, lower first): the queue is ordered by priority, then arrival;
//! running sequences get the step's budget by priority, then age; the victim of a preemption is
//! the least urgent (the newest of those); and a waiting sequence that finds no room preempts
//! running ones less urgent than itself. Equal priorities (all 0 under first come, first
//! served) leave every order above as it is.
//!
//! E5, prefix reuse: a finished sequence keeps its cells as a cached prefix. A new request whose
//! prompt starts with cached tokens gets them by a KV copy (shared cells) and computes only the
//! rest. Cached prefixes are evicted least recently used, before any running sequence is
//! preempted. Cells shared between owners are counted once per owner, so the accounting never
//! under-estimates what the cache holds. A cached prefix that a newer one extends is dropped.
//! A request for its prompt's log-probabilities reuses none: each prompt token's logits are
//! computed.
//!
//! E6, sessions: the cells of a session's last request stay cached and pinned to the session,
//! even with prefix caching off, so its next turn computes only the new tokens. Pinned prefixes
//! are evicted only when no unpinned one is left (so sessions can never starve new requests),
//! and are freed when the session is released (deleted or expired).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use llaisys_model::kv::{MAX_SEQ, push_checkpoint};
use llaisys_model::vision::PromptImages;
use llaisys_model::{Pos, SeqId};

use super::cost::StepCost;
use super::sequence::Sequence;
use crate::engine::EngineConfig;
use crate::host::GenerateParams;
use crate::request::{FinishReason, RequestId, RequestState};
use crate::speculative::draft_len;

/// One sequence's part of a step: `tokens` at positions `start_pos..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanItem {
    pub id: RequestId,
    pub seq: SeqId,
    pub start_pos: Pos,
    pub tokens: Vec<u32>,
    /// The chunk ends the sequence's known tokens: sample the next one from its last row.
    pub sample: bool,
    /// Most proposed tokens the worker may add after `tokens` (cells and budget are reserved
    /// for them); 0 for an item that does not speculate.
    pub max_drafts: usize,
    /// Keep a copy of the sequence's linear-attention state once it holds this many tokens (a
    /// model that has one; the item's tokens reach a token short of the prompt's end, or end a
    /// chunk of a long prompt `CHECKPOINT_EVERY` tokens past the last copy): the same prompt
    /// again, or a later one that extends it or shares its start, goes on from there.
    pub checkpoint: Option<usize>,
}

/// What a plan item produced, as the scheduler needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The tokens sampled, in order (several when proposals were accepted).
    pub tokens: Vec<u32>,
    /// The sequence ends after them for this reason (its constraint completed or failed).
    pub end: Option<FinishReason>,
    /// Proposed tokens, and how many of them were accepted.
    pub proposed: usize,
    pub accepted: usize,
}

/// A prefix reuse: `dst` gains ownership of `src`'s cells for positions `[0, len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCopy {
    pub src: SeqId,
    pub dst: SeqId,
    pub len: usize,
}

/// What the worker runs in one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Sequences whose cells to drop before the batch (finished, aborted, preempted, evicted).
    pub free: Vec<SeqId>,
    /// Prefix reuses, applied after `free` and before the batch.
    pub copies: Vec<PrefixCopy>,
    pub items: Vec<PlanItem>,
}

/// A sequence that left the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub id: RequestId,
    pub output: Vec<u32>,
    pub reason: FinishReason,
    /// Prompt tokens taken from the prefix cache instead of computed.
    pub cached_tokens: usize,
    /// Time from arrival to first admission (`None` if never admitted).
    pub queue_time: Option<Duration>,
    /// The session it belonged to.
    pub session: Option<String>,
}

impl Finished {
    fn of(s: &Sequence, reason: FinishReason, session: Option<String>) -> Self {
        let (cached_tokens, queue_time) = (s.cached_tokens, s.queue_time);
        Self { id: s.id, output: s.output().to_vec(), reason, cached_tokens, queue_time, session }
    }
}

/// A finished sequence's cells kept for reuse.
#[derive(Debug)]
struct CachedPrefix {
    seq: SeqId,
    /// The tokens whose keys and values the cells hold.
    tokens: Vec<u32>,
    last_used: u64,
    /// The session that pins it.
    session: Option<String>,
    /// Lengths at which a model with linear attention kept a copy of its state: it can be
    /// reused up to one of them, or whole.
    checkpoints: Vec<usize>,
}

#[derive(Debug)]
pub struct Scheduler {
    config: EngineConfig,
    /// The model's context length: no sequence grows past it.
    context_length: usize,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    free_seqs: Vec<SeqId>,
    /// Cells to free at the start of the next step.
    to_free: Vec<SeqId>,
    arrivals: u64,
    cached: Vec<CachedPrefix>,
    /// Advances every step; orders cached prefixes by last use.
    clock: u64,
    /// Number of preemptions so far (observable for tests and metrics).
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache, and how many were found (vLLM's counters).
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    /// Speculation: tokens proposed and accepted so far.
    pub proposed: u64,
    pub accepted: u64,
    /// Learnt from the steps that ran (`record_step`): all of them, and those with no prompt
    /// tokens (decoding and proposed tokens only). A prompt's tokens go through the batched
    /// products at a fraction of what one more decoding row costs on a compute-bound device, so
    /// proposals are priced by the decoding steps where those pin a token's cost down.
    cost: StepCost,
    decode_cost: StepCost,
    /// The model keeps a state per sequence that cannot be cut back (`with_states`).
    recurrent: bool,
    /// Bytes of one such state (and of each of its checkpoints).
    state_bytes: usize,
}

/// Most relative standard error of a decoding token's learnt cost for proposals to be priced
/// by it rather than by all steps.
const DECODE_FIT_ERROR: f64 = 0.25;

/// A model with linear attention keeps a copy of a sequence's state at the end of a prompt's
/// chunk once it is this many tokens past its last one (besides a token short of the prompt's
/// end).
const CHECKPOINT_EVERY: usize = 512;

/// Prompt tokens a step that decodes takes at least, whatever the time bound: prompts waiting
/// behind decoding sequences still advance.
const MIN_PREFILL: usize = 8;

impl Scheduler {
    pub fn new(config: EngineConfig, context_length: usize) -> Self {
        Self {
            config,
            context_length,
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_seqs: (0..MAX_SEQ as SeqId).rev().collect(),
            to_free: Vec::new(),
            arrivals: 0,
            cached: Vec::new(),
            clock: 0,
            preemptions: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            proposed: 0,
            accepted: 0,
            cost: StepCost::default(),
            decode_cost: StepCost::default(),
            recurrent: false,
            state_bytes: 0,
        }
    }

    /// For a model whose linear-attention layers keep a state per sequence of `state_bytes`
    /// (`ModelInfo::state_bytes`; 0: none):
    /// a cached sequence is reused whole or up to a checkpoint (its state cannot be cut back to
    /// any other prefix; one is kept a token short of each prompt's end, `PlanItem::checkpoint`), and
    /// nothing speculates (rejected proposals could not be taken back out of it).
    pub fn with_states(mut self, state_bytes: usize) -> Self {
        (self.recurrent, self.state_bytes) = (state_bytes > 0, state_bytes);
        self
    }

    /// Bytes the cached sequences' states and checkpoints hold (a model with linear attention).
    fn cached_state_bytes(&self) -> usize {
        self.cached.iter().map(|c| (1 + c.checkpoints.len()) * self.state_bytes).sum()
    }

    /// A step of `plan` ran in `elapsed` (it teaches the step cost); `outcomes` count its
    /// proposed tokens, which it ran too.
    pub fn record_step(&mut self, plan: &StepPlan, outcomes: &[Outcome], elapsed: Duration) {
        let proposed: usize = outcomes.iter().map(|o| o.proposed).sum();
        let tokens = plan.items.iter().map(|i| i.tokens.len()).sum::<usize>() + proposed;
        if tokens > 0 {
            self.cost.record(tokens, elapsed.as_secs_f64());
            if plan.items.iter().all(|i| i.tokens.len() == 1) {
                self.decode_cost.record(tokens, elapsed.as_secs_f64());
            }
        }
    }

    /// Prompt tokens a step may take while `decode` sequences decode in it.
    fn prefill_budget(&self, decode: usize) -> usize {
        let cap = self.config.max_prefill_tokens_while_decoding.max(1);
        if self.config.prefill_step_factor <= 0.0 {
            return cap;
        }
        // The batch once the prompts held now decode too: its step is the gap most tokens see.
        let steady = (self.running.len() + self.waiting.len()).min(self.config.max_seqs_per_step);
        match self.cost.prefill_budget(decode, steady, self.config.prefill_step_factor) {
            Some(budget) => budget.clamp(MIN_PREFILL.min(cap), cap),
            None => cap,
        }
    }

    /// Queues a sequence. Precondition (the `Frontend`'s checks): its prompt is not empty and,
    /// with one generated token, fits the context and the KV cache.
    pub fn add(&mut self, mut seq: Sequence) {
        let prompt = seq.tokens.len();
        debug_assert!(
            prompt > 0 && prompt < self.context_length && prompt < self.config.kv_capacity,
            "a sequence the frontend should have refused: {prompt} tokens"
        );
        seq.arrival = self.arrivals;
        self.arrivals += 1;
        enqueue_by_priority(&mut self.waiting, seq, |s| s.params.priority, false);
    }

    /// Cells held by cached prefixes.
    pub fn kv_cached(&self) -> usize {
        self.cached.iter().map(|c| c.tokens.len()).sum()
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
    /// Cells accounted to admitted sequences (their computed tokens plus this step's) and to
    /// cached prefixes: derived from them, never stored (a cell shared by several owners counts
    /// once per owner, so this never under-estimates what the cache holds).
    pub fn kv_used(&self) -> usize {
        let running: usize = self.running.iter().map(|s| s.computed + s.scheduled).sum();
        running + self.kv_cached()
    }

    /// A sequence can grow to the context length, and no further than the whole cache.
    fn length_limit(&self) -> usize {
        self.context_length.min(self.config.kv_capacity)
    }

    fn kv_free(&self) -> usize {
        self.config.kv_capacity.saturating_sub(self.kv_used())
    }

    /// Builds the next step; `None` when there is nothing to run.
    pub fn schedule(&mut self) -> Option<StepPlan> {
        let mut plan = StepPlan { free: std::mem::take(&mut self.to_free), ..StepPlan::default() };
        self.clock += 1;
        let mut budget = self.config.max_tokens_per_step;
        // Prompt tokens this step may take: bounded while any sequence decodes.
        let decoding = self.running.iter().filter(|s| s.computed >= s.prompt_len).count();
        let mut prefill_budget = if decoding > 0 { self.prefill_budget(decoding) } else { usize::MAX };
        let mut preempted = false;
        // Running sequences, the most urgent first, then oldest first: a decode token each, or
        // the next prefill chunk (a stable sort: with equal priorities, the order they came in).
        self.running.sort_by_key(|s| s.params.priority);
        let mut i = 0;
        while i < self.running.len() && budget > 0 && plan.items.len() < self.config.max_seqs_per_step {
            let pending = self.running[i].pending();
            let prefill = pending > 1;
            let need = if prefill { pending.min(budget).min(prefill_budget) } else { pending.min(budget) };
            let need = chunk(self.running[i].images(), self.running[i].computed, need);
            if need == 0 {
                i += 1; // a prompt waiting for prefill budget
                continue;
            }
            while self.kv_free() < need && self.evict_lru(None, &mut plan.free) {}
            while self.kv_free() < need && i < self.running.len() {
                let victim = self.running.len() - 1; // the newest; possibly `i` itself
                self.preempt(victim, &mut plan);
                preempted = true;
            }
            if i == self.running.len() {
                break; // `i` itself was preempted
            }
            self.plan_item(i, need, &mut plan);
            // (A chunk may pass them to take an image whole.)
            budget = budget.saturating_sub(need);
            if prefill {
                prefill_budget = prefill_budget.saturating_sub(need);
            }
            i += 1;
        }
        // Waiting sequences in arrival order while there is room (none while preempting).
        while !preempted && budget.min(prefill_budget) > 0 && plan.items.len() < self.config.max_seqs_per_step {
            let budget_here = budget.min(prefill_budget);
            let Some(front) = self.waiting.front() else { break };
            let len = front.tokens.len();
            // A request for its prompt's log-probabilities computes its whole prompt.
            let mut hit = match front.params.sampling.prompt_logprobs {
                None => self.longest_prefix(&front.tokens, front.session.as_deref()).and_then(|(seq, len)| {
                    // Not into an image whose rows see each other both ways.
                    let len = front.images().map_or(len, |images| images.prefix_end(len));
                    (len > 0).then_some((seq, len))
                }),
                Some(_) => None,
            };
            let priority = front.params.priority;
            let images = front.params.images.clone();
            let images = images.as_deref();
            while !self.fits(len, hit, budget_here, images) && self.evict_lru(hit.map(|(seq, _)| seq), &mut plan.free) {
            }
            if !self.fits(len, hit, budget_here, images) && hit.is_some() {
                // Even alone with its prefix it does not fit: compute it all instead.
                hit = None;
                while !self.fits(len, None, budget_here, images) && self.evict_lru(None, &mut plan.free) {}
            }
            // Still no room: running sequences less urgent than it make way, the least urgent
            // (the newest of those) first; a prefix it would share is a cached one, not theirs.
            while !self.fits(len, hit, budget_here, images) {
                let least = (0..self.running.len()).max_by_key(|&i| self.running[i].params.priority);
                match least {
                    Some(i) if self.running[i].params.priority > priority => self.preempt(i, &mut plan),
                    _ => break,
                }
            }
            if !self.fits(len, hit, budget_here, images) {
                break;
            }
            let hit_len = hit.map_or(0, |(_, len)| len);
            let need = chunk(images, hit_len, (len - hit_len).min(budget_here));
            let Some(seq) = self.free_seqs.pop() else { break };
            let mut s = self.waiting.pop_front().expect("front exists");
            if self.config.prefix_caching || s.session.is_some() {
                self.prefix_queries += s.tokens.len() as u64;
                self.prefix_hits += hit_len as u64;
            }
            s.cached_tokens = hit_len;
            s.queue_time.get_or_insert_with(|| s.queued_at.elapsed());
            if let Some((src, len)) = hit {
                plan.copies.push(PrefixCopy { src, dst: seq, len });
                s.computed = len;
                if let Some(c) = self.cached.iter_mut().find(|c| c.seq == src) {
                    c.last_used = self.clock;
                    // The copy takes the checkpoints up to where it ends (`KvCache::seq_cp`).
                    s.checkpoints = c.checkpoints.iter().copied().filter(|&p| p <= len).collect();
                }
            }
            // The state machine allows waiting/preempted → running; anything else is a bug.
            s.state.transition(s.id, RequestState::Running).expect("queued sequences are waiting or preempted");
            s.seq = Some(seq);
            self.running.push(s);
            self.plan_item(self.running.len() - 1, need, &mut plan);
            budget = budget.saturating_sub(need);
            if need > 1 {
                prefill_budget = prefill_budget.saturating_sub(need);
            }
        }
        self.plan_drafts(&mut plan, budget);
        (!plan.items.is_empty() || !plan.free.is_empty()).then_some(plan)
    }

    /// Lets the step's decoding sequences that speculate propose tokens, within what is left
    /// of the token budget and the free cells (proposals never evict or preempt anything), as
    /// many as their acceptance rate pays for at this batch's step cost (`speculative`), and
    /// never past their `max_tokens` or the context; none while prompts wait to be prefilled.
    fn plan_drafts(&mut self, plan: &mut StepPlan, mut budget: usize) {
        let max_draft = self.config.speculative.max_draft;
        if max_draft == 0 || self.recurrent || !self.running.iter().any(|s| s.speculation.is_some()) {
            return;
        }
        // Prompts queued or part-way through their prefill would wait through the proposals'
        // share of every step until they are in: none till then (16 streams on the demo model
        // ran at 0.96-0.99x of plain decoding with proposals during admission).
        if !self.waiting.is_empty() || self.running.iter().any(|s| s.pending() > 1) {
            return;
        }
        let sampling = plan.items.iter().filter(|i| i.sample).count();
        let tokens: usize = plan.items.iter().map(|i| i.tokens.len()).sum();
        // A token's share of the step, times the tokens the step yields anyway; nothing while no
        // cost is learnt, or when the lengths are fixed (`SpeculativeConfig::adaptive`).
        let fit = self.decode_cost.fit_within(DECODE_FIT_ERROR).or_else(|| self.cost.fit());
        let threshold = match fit.filter(|_| self.config.speculative.adaptive) {
            Some((a, b)) => sampling as f64 * b / (a + b * tokens as f64),
            None => 0.0,
        };
        let limit = self.length_limit();
        for item in plan.items.iter_mut().filter(|i| i.sample && i.tokens.len() == 1) {
            let free = self.kv_free();
            let Some(s) = self.running.iter_mut().find(|s| s.id == item.id) else { continue };
            // Tokens it may still produce: this step's one, then the proposals' worth.
            let room = s.params.max_tokens.saturating_sub(s.output().len()).min(limit.saturating_sub(s.tokens.len()));
            let Some(acceptance) = &mut s.speculation else { continue };
            let k =
                draft_len(acceptance.rate(), threshold, max_draft).min(room.saturating_sub(1)).min(budget).min(free);
            if k == 0 {
                acceptance.idle();
                continue;
            }
            item.max_drafts = k;
            s.scheduled += k;
            budget -= k;
        }
    }

    fn plan_item(&mut self, i: usize, n: usize, plan: &mut StepPlan) {
        let s = &mut self.running[i];
        s.scheduled = n;
        let start = s.computed;
        let (end, keep) = (start + n, s.prompt_len - 1);
        let last = s.checkpoints.last().copied().unwrap_or(0);
        let checkpoint = match self.recurrent {
            false => None,
            true if keep > start && keep <= end => Some(keep),
            // Along a long prompt too, so that another prompt sharing its start (a system
            // prompt) goes on from there.
            true if end < keep && end >= last + CHECKPOINT_EVERY => Some(end),
            true => None,
        };
        plan.items.push(PlanItem {
            id: s.id,
            seq: s.seq.expect("running sequences hold a seq id"),
            start_pos: start as Pos,
            tokens: s.tokens[start..start + n].to_vec(),
            sample: start + n == s.tokens.len(),
            max_drafts: 0,
            checkpoint,
        });
    }

    /// Whether a waiting sequence of `len` tokens (with `images`) can be admitted now with
    /// `hit`: a free sequence id, and room for the copied prefix (counted again: shared cells
    /// are counted per owner) plus this step's chunk.
    fn fits(&self, len: usize, hit: Option<(SeqId, usize)>, budget: usize, images: Option<&PromptImages>) -> bool {
        let hit_len = hit.map_or(0, |(_, l)| l);
        !self.free_seqs.is_empty() && self.kv_free() >= hit_len + chunk(images, hit_len, (len - hit_len).min(budget))
    }

    /// The cached prefix sharing the most leading tokens with `tokens`, leaving at least one
    /// token to compute (its logits give the next token): `(seq, shared length)`; for a model
    /// with linear attention, up to the last of its checkpoints within them, or all of it.
    /// Without prefix caching only the request's own session's prefix is looked at.
    fn longest_prefix(&self, tokens: &[u32], session: Option<&str>) -> Option<(SeqId, usize)> {
        self.cached
            .iter()
            .filter(|c| self.config.prefix_caching || (session.is_some() && c.session.as_deref() == session))
            .map(|c| {
                let common = c.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len() - 1);
                let usable = if self.recurrent {
                    let points = c.checkpoints.iter().copied().chain([c.tokens.len()]);
                    points.filter(|&p| p <= common).max().unwrap_or(0)
                } else {
                    common
                };
                (c.seq, usable)
            })
            .filter(|&(_, len)| len > 0)
            .max_by_key(|(_, len)| *len)
    }

    /// Evicts the least recently used cached prefix other than `keep` (its cells freed in the
    /// step whose free list is `free`), unpinned ones first; false when none is left.
    fn evict_lru(&mut self, keep: Option<SeqId>, free: &mut Vec<SeqId>) -> bool {
        let Some(i) = (0..self.cached.len())
            .filter(|&i| Some(self.cached[i].seq) != keep)
            .min_by_key(|&i| (self.cached[i].session.is_some(), self.cached[i].last_used))
        else {
            return false;
        };
        self.drop_cached(i, free);
        true
    }

    /// Frees the cells of `cached[i]` (in the step whose free list is `free`).
    fn drop_cached(&mut self, i: usize, free: &mut Vec<SeqId>) {
        let c = self.cached.swap_remove(i);
        if let Some(session) = &c.session {
            tracing::debug!(session, tokens = c.tokens.len(), "session prefix evicted");
        }
        free.push(c.seq);
        self.free_seqs.push(c.seq);
    }

    /// Frees a session's pinned prefix (the session was deleted or expired); false if it had
    /// none.
    pub fn release_session(&mut self, session: &str) -> bool {
        let Some(i) = self.cached.iter().position(|c| c.session.as_deref() == Some(session)) else {
            return false;
        };
        let mut free = std::mem::take(&mut self.to_free);
        self.drop_cached(i, &mut free);
        self.to_free = free;
        true
    }

    /// Tokens a session has pinned in the cache.
    pub fn session_cached(&self, session: &str) -> usize {
        self.cached.iter().find(|c| c.session.as_deref() == Some(session)).map_or(0, |c| c.tokens.len())
    }

    /// Keeps a finished sequence's cells as a cached prefix. Prefixes it extends are dropped
    /// (their cells are shared with it), except those pinned by another session; the session's
    /// previous pin, if not extended, stays cached unpinned.
    fn cache(&mut self, seq: SeqId, tokens: Vec<u32>, session: Option<String>, checkpoints: Vec<usize>) {
        let mut i = 0;
        while i < self.cached.len() {
            let c = &mut self.cached[i];
            let extended = tokens.starts_with(&c.tokens);
            let own_pin = session.is_some() && c.session == session;
            if extended && (c.session.is_none() || own_pin) {
                let mut free = std::mem::take(&mut self.to_free);
                self.drop_cached(i, &mut free);
                self.to_free = free;
                continue;
            }
            if own_pin {
                c.session = None;
            }
            i += 1;
        }
        self.cached.push(CachedPrefix { seq, tokens, last_used: self.clock, session, checkpoints });
        // A model with linear attention holds each cached sequence's state (and checkpoints) in
        // host memory besides its cells: their bytes are bounded on their own (the newest stays
        // if it fits alone).
        if self.recurrent {
            let mut free = std::mem::take(&mut self.to_free);
            let budget = self.config.cached_state_mb.saturating_mul(1 << 20);
            let newest = (1 + self.cached.last().map_or(0, |c| c.checkpoints.len())) * self.state_bytes;
            let keep = (newest <= budget).then_some(seq);
            while self.cached_state_bytes() > budget && self.evict_lru(keep, &mut free) {}
            self.to_free = free;
        }
    }

    /// Frees a running sequence's cells and puts it back at the head of the queue.
    fn preempt(&mut self, i: usize, plan: &mut StepPlan) {
        let mut s = self.running.remove(i);
        let seq = s.seq.take().expect("running sequences hold a seq id");
        plan.items.retain(|it| it.id != s.id);
        (s.computed, s.scheduled) = (0, 0);
        s.checkpoints.clear();
        s.state.transition(s.id, RequestState::Preempted).expect("running → preempted is allowed");
        plan.free.push(seq);
        self.free_seqs.push(seq);
        self.preemptions += 1;
        enqueue_by_priority(&mut self.waiting, s, |s| s.params.priority, true);
    }

    /// The worker lost its KV cache (it was restarted): running sequences go back to the head
    /// of the queue in arrival order to be recomputed, and cached prefixes are forgotten.
    pub fn reset_kv(&mut self) {
        let mut running = std::mem::take(&mut self.running);
        running.sort_by_key(|s| std::cmp::Reverse(s.arrival));
        for mut s in running {
            (s.seq, s.computed, s.scheduled) = (None, 0, 0);
            s.checkpoints.clear();
            s.state.transition(s.id, RequestState::Preempted).expect("running → preempted is allowed");
            enqueue_by_priority(&mut self.waiting, s, |s| s.params.priority, true);
        }
        self.cached.clear();
        self.to_free.clear();
        self.free_seqs = (0..MAX_SEQ as SeqId).rev().collect();
    }

    /// A queued or running request's prompt and what it generated so far.
    pub fn tokens_of(&self, id: RequestId) -> Option<(&[u32], &[u32])> {
        self.running.iter().chain(&self.waiting).find(|s| s.id == id).map(|s| s.tokens.split_at(s.prompt_len))
    }

    /// Applies a step's results: `outcomes[k]` is what `plan.items[k]` produced. The cells
    /// reserved for proposals that were not accepted are given back (the worker removed them).
    /// Returns the sequences that finished.
    pub fn postprocess(&mut self, plan: &StepPlan, outcomes: &[Outcome]) -> Vec<Finished> {
        let mut finished = Vec::new();
        let limit = self.length_limit();
        let none = Outcome::default();
        for (k, item) in plan.items.iter().enumerate() {
            let Some(i) = self.running.iter().position(|s| s.id == item.id) else { continue };
            let outcome = outcomes.get(k).unwrap_or(&none);
            let s = &mut self.running[i];
            // The item's tokens and the accepted proposals are in the cache now; the last
            // sampled token is not (it is the next step's input).
            let accepted = outcome.tokens.len().saturating_sub(1);
            s.computed += item.tokens.len() + accepted;
            s.scheduled = 0;
            if let Some(len) = item.checkpoint {
                push_checkpoint(&mut s.checkpoints, len, |p| *p);
            }
            s.tokens.extend(&outcome.tokens);
            if let Some(acceptance) = &mut s.speculation
                && item.max_drafts > 0
            {
                acceptance.record(outcome.proposed, outcome.accepted);
                self.proposed += outcome.proposed as u64;
                self.accepted += outcome.accepted as u64;
            }
            if let Some(reason) = s.finish_reason(limit).or(outcome.end) {
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
        let session = s.session.take();
        Some(Finished::of(&s, reason, session))
    }

    /// Queues request `id` again, first in line, from `prompt` with `params` (its answer is to
    /// be generated again). If it is still queued or running, that first attempt is dropped
    /// without a word, its computed cells kept as a cached prefix as a finished sequence's are;
    /// either way its prompt is found among the cached prefixes (prefix caching or a session).
    pub fn restart(
        &mut self,
        id: RequestId,
        prompt: Vec<u32>,
        session: Option<String>,
        params: Arc<GenerateParams>,
        speculating: bool,
    ) {
        let first = self.running.iter().chain(&self.waiting).find(|s| s.id == id);
        let kept = first.map(|s| (s.arrival, s.queued_at, s.queue_time));
        if kept.is_some() {
            let _ = self.finish_request(id, FinishReason::Abort);
        }
        let mut seq = Sequence::new(id, prompt, params).in_session(session).speculating(speculating);
        match kept {
            Some((arrival, queued_at, queue_time)) => {
                (seq.arrival, seq.queued_at, seq.queue_time) = (arrival, queued_at, queue_time);
            }
            None => {
                seq.arrival = self.arrivals;
                self.arrivals += 1;
            }
        }
        enqueue_by_priority(&mut self.waiting, seq, |s| s.params.priority, true);
    }

    fn finish(&mut self, i: usize, reason: FinishReason) -> Finished {
        let mut s = self.running.remove(i);
        let session = s.session.clone();
        // Computed cells are valid whatever the reason, except after an error or while a step
        // that writes more of them is in flight.
        let keep = (self.config.prefix_caching || s.session.is_some())
            && reason != FinishReason::Error
            && s.scheduled == 0
            && s.computed > 0;
        match s.seq.take() {
            // Its cells stay, now as a cached prefix.
            Some(seq) if keep => {
                let tokens = s.tokens[..s.computed].to_vec();
                let checkpoints = std::mem::take(&mut s.checkpoints);
                self.cache(seq, tokens, s.session.take(), checkpoints);
            }
            Some(seq) => {
                self.to_free.push(seq);
                self.free_seqs.push(seq);
            }
            None => {}
        }
        // Stop/length only from running, which `s` is; abort/error from anywhere.
        let _ = s.state.transition(s.id, RequestState::Finished(reason));
        Finished::of(&s, reason, session)
    }

    /// Whether a queued or running request belongs to `session`.
    pub fn has_session_requests(&self, session: &str) -> bool {
        self.running.iter().chain(&self.waiting).any(|s| s.session.as_deref() == Some(session))
    }
}

/// Queues `item` behind every item as urgent as it (`priority`: lower first), or with `first`
/// ahead of those of its own priority (a preempted or restarted request, first in line): with
/// equal priorities, `push_back` and `push_front`.
pub fn enqueue_by_priority<T>(queue: &mut VecDeque<T>, item: T, priority: impl Fn(&T) -> i32, first: bool) {
    let p = priority(&item);
    let behind = |q: &T| if first { priority(q) >= p } else { priority(q) > p };
    let at = queue.iter().position(behind).unwrap_or(queue.len());
    queue.insert(at, item);
}

/// A chunk of `n` tokens from `start` of a sequence with `images`, its end moved where it would
/// cut an image whose rows see each other both ways ([`PromptImages::chunk_end`]: before the
/// image, or past the budget to its end).
fn chunk(images: Option<&PromptImages>, start: usize, n: usize) -> usize {
    images.map_or(n, |images| images.chunk_end(start, start + n) - start)
}
