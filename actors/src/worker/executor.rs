//! Runs a `StepPlan` on the model: frees the listed sequences' cells, puts every item into one
//! batch (one forward pass for prefill chunks, decode tokens and proposed tokens alike), and
//! samples each item that asked for it with that request's own sampler.
//!
//! Speculation: a decode item allowed proposals gets them from the proposer, all of them go
//! into the batch with a logits row each, and the rows are sampled in order until a sampled
//! token differs from the proposal (see `speculative`). The cells of the rejected proposals are
//! removed in the same step, so after every step the cache holds exactly the accepted tokens.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use llaisys_model::vision::PromptImages;
use llaisys_model::{Batch, Context, DecodeError, GuideEnd, Outputs, RowAsk, RowNeed, Sampled, Sampler};
use rayon::prelude::*;

use crate::host::{GenerateParams, TokenLogprob};
use crate::request::{FinishReason, RequestId};
use crate::scheduler::{Outcome, StepPlan};
use crate::speculative::{DraftSlot, Proposer};

/// What one plan item produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ItemOutput {
    /// The tokens sampled, in order: none for a prefill chunk that does not end its prompt,
    /// one for a decode step, up to one more than `proposed` when speculating.
    pub sampled: Vec<Sampled>,
    /// Tokens proposed for the item, and how many of them were accepted.
    pub proposed: usize,
    pub accepted: usize,
    /// Once its prompt is computed, for a request that asked for them
    /// (`SamplingParams::prompt_logprobs`): each prompt token's log-probability given the ones
    /// before it, from the second on.
    pub prompt_logprobs: Vec<TokenLogprob>,
}

/// What the scheduler needs of each item's output: its tokens, and the reason its constraint
/// ends it with, if it does.
pub fn outcomes(outputs: &[ItemOutput]) -> Vec<Outcome> {
    let end = |s: &Sampled| match &s.end {
        None => None,
        Some(GuideEnd::Complete) => Some(FinishReason::Stop),
        Some(GuideEnd::Failed(e)) => {
            tracing::error!(error = e, "constrained decoding failed");
            Some(FinishReason::Error)
        }
    };
    outputs
        .iter()
        .map(|o| Outcome {
            tokens: o.sampled.iter().map(|s| s.token).collect(),
            end: o.sampled.last().and_then(end),
            proposed: o.proposed,
            accepted: o.accepted,
        })
        .collect()
}

/// The sequence rows `item` computes.
fn item_rows(item: &crate::scheduler::PlanItem) -> Range<usize> {
    let start = item.start_pos as usize;
    start..start + item.tokens.len()
}

/// A request as the worker knows it.
#[derive(Debug)]
pub struct Lane {
    sampler: Sampler,
    /// Its checked parameters (shared with the scheduler's sequence): the tokens that end it,
    /// at which a run of accepted proposals stops.
    params: Arc<GenerateParams>,
    /// For a request that speculates: its prompt and output so far (what proposals continue).
    history: Option<Vec<u32>>,
    /// For a request that asked for its prompt's log-probabilities, until they are computed.
    scoring: Option<PromptScoring>,
    /// For a prompt with images: each image's features, once encoded (kept while the request
    /// lives: a preempted prompt is computed again).
    features: Vec<Option<Arc<llaisys_model::vision::Features>>>,
}

/// A prompt whose tokens' log-probabilities are computed as it is: each prefill row's logits
/// give the next prompt token's.
#[derive(Debug)]
struct PromptScoring {
    prompt: Vec<u32>,
    /// Alternatives per token.
    alternatives: usize,
    /// The log-probabilities of `prompt[1..]`, as far as computed.
    logprobs: Vec<TokenLogprob>,
}

impl PromptScoring {
    /// The tokens `k` of a pass of `n` prompt tokens from position `start` whose logits give a
    /// log-probability not yet computed: each position's gives the next token's. Empty where
    /// the pass does not continue from where the last one stopped (its prompt is computed
    /// whole, so only a pass over positions already done).
    fn rows(&self, start: usize, n: usize) -> Range<usize> {
        let done = self.logprobs.len();
        let end = (start + n).min(self.prompt.len().saturating_sub(1));
        match start <= done && done < end {
            true => done - start..end - start,
            false => 0..0,
        }
    }

    /// Records the log-probabilities that output `rows` give, the rows of positions `at` on
    /// (each row's is the next prompt token's), computed in parallel; returns them all once
    /// the prompt is done (else none).
    fn score(&mut self, outputs: &Outputs, rows: Range<usize>, at: usize) -> Result<Vec<TokenLogprob>, DecodeError> {
        // Rows a device kept are read in one readback.
        let missing: Vec<usize> = rows.clone().filter(|&r| outputs.row(r).is_none()).collect();
        let fetched: HashMap<usize, Vec<f32>> = missing.iter().copied().zip(outputs.fetch_rows(&missing)?).collect();
        let next = &self.prompt[at + 1..at + 1 + rows.len()];
        let n = self.alternatives;
        let computed: Vec<TokenLogprob> = rows
            .into_par_iter()
            .zip(next.par_iter())
            .map(|(r, &token)| {
                let logits = outputs.row(r).or_else(|| fetched.get(&r).map(Vec::as_slice));
                let logits = logits.ok_or_else(|| DecodeError::Internal(format!("missing logits row {r}")))?;
                let (logprob, top) = llaisys_model::sampling::raw_logprobs(logits, token, n);
                let at = logits[token as usize];
                let rank = 1 + logits.iter().filter(|&&l| l > at).count() as u32;
                Ok(TokenLogprob { token, logprob, top, rank: Some(rank) })
            })
            .collect::<Result<_, DecodeError>>()?;
        self.logprobs.extend(computed);
        Ok(match self.logprobs.len() + 1 == self.prompt.len() {
            true => std::mem::take(&mut self.logprobs),
            false => Vec::new(),
        })
    }
}

impl Lane {
    /// `history`: the prompt and output so far, when the request speculates.
    pub fn new(sampler: Sampler, params: Arc<GenerateParams>, history: Option<Vec<u32>>) -> Self {
        let features = params.images.as_ref().map_or(Vec::new(), |i| vec![None; i.images.len()]);
        Self { sampler, params, history, scoring: None, features }
    }

    /// A request's lane before its first token: its sampler over `prompt`, guided as `params`
    /// say, and the prompt as its history when it `speculates`.
    pub fn fresh(prompt: &[u32], params: Arc<GenerateParams>, speculates: bool) -> Self {
        // Penalties count the prompt's tokens as the processor writes them: an image's rows as
        // its token, not the ids drawn for the cache.
        let shown = params.images.as_ref().map(|images| images.shown(prompt));
        let sampler =
            Sampler::new(params.sampling.clone(), shown.as_deref().unwrap_or(prompt)).guided(&params.guidance);
        Self::new(sampler, params, speculates.then(|| prompt.to_vec())).scoring(prompt)
    }

    /// The runs of `item`'s rows (the first of them batch row `row0`) that are image tokens, as
    /// their images' features: encoded by `Executor::encode_images` before.
    fn embed(&self, item: &crate::scheduler::PlanItem, row0: usize, runs: &mut Vec<llaisys_model::Embedded>) {
        let Some(images) = self.params.images.as_deref() else { return };
        for (k, rows) in images.reached(item_rows(item)) {
            let Some(features) = &self.features[k] else { continue };
            let row = row0 + images.rows[k] + rows.start - item.start_pos as usize;
            runs.push(features.embedded(images.images[k].tokens(), rows, row));
        }
    }

    /// Computes `prompt`'s log-probabilities as it goes through the model, if the request asked
    /// for them (a lane made again before its first token: its prompt is computed again).
    pub fn scoring(mut self, prompt: &[u32]) -> Self {
        self.scoring = (self.params.sampling.prompt_logprobs)
            .filter(|_| prompt.len() > 1)
            .map(|alternatives| PromptScoring { prompt: prompt.to_vec(), alternatives, logprobs: Vec::new() });
        self
    }
}

pub struct Executor {
    ctx: Context,
    lanes: HashMap<RequestId, Lane>,
    proposer: Option<Box<dyn Proposer>>,
}

impl Executor {
    pub fn new(ctx: Context) -> Self {
        Self { ctx, lanes: HashMap::new(), proposer: None }
    }

    /// Items that the plan allows proposals get them from `proposer` (without one, none).
    pub fn with_proposer(mut self, proposer: Box<dyn Proposer>) -> Self {
        self.set_proposer(proposer);
        self
    }

    pub fn set_proposer(&mut self, proposer: Box<dyn Proposer>) {
        self.proposer = Some(proposer);
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Registers a new request.
    pub fn add_request(&mut self, id: RequestId, lane: Lane) {
        self.lanes.insert(id, lane);
    }

    /// Forgets a finished request.
    pub fn remove_request(&mut self, id: RequestId) {
        self.lanes.remove(&id);
        if let Some(p) = &mut self.proposer {
            p.forget(id);
        }
    }

    /// Runs one step. `result[k]` is what `plan.items[k]` produced.
    /// On an error no item advanced; freed cells stay freed.
    ///
    /// The step runs on a thread of the compute (rayon) pool, the caller waiting: each
    /// kernel's parallel loop then starts inside the pool instead of waking it from outside and
    /// sleeping until it is done, 169 times a token (f16 decode 26 → 29 tok/s). A panic
    /// resumes on the caller.
    pub fn execute(&mut self, plan: &StepPlan) -> Result<Vec<ItemOutput>, DecodeError> {
        rayon::scope(|_| self.execute_here(plan))
    }

    fn execute_here(&mut self, plan: &StepPlan) -> Result<Vec<ItemOutput>, DecodeError> {
        let internal = |what: String| move |e: llaisys_model::KvError| DecodeError::Internal(format!("{what}: {e}"));
        for &seq in &plan.free {
            self.ctx.kv_mut().seq_rm(seq, ..).map_err(internal(format!("freeing sequence {seq}")))?;
        }
        for copy in &plan.copies {
            self.ctx
                .kv_mut()
                .seq_cp(copy.src, copy.dst, 0..copy.len as i64)
                .map_err(internal(format!("reusing the prefix of sequence {}", copy.src)))?;
        }
        for item in &plan.items {
            if let Some(len) = item.checkpoint {
                self.ctx.kv_mut().seq_checkpoint(item.seq, len as i64);
            }
        }
        if plan.items.is_empty() {
            return Ok(Vec::new());
        }
        let drafts = self.propose(plan);
        self.encode_images(plan)?;
        let mut batch = Batch::new();
        // M-RoPE's positions of every row, given where some item has images turned so; the last
        // position each row sees, where some item has images whose rows see each other both ways.
        let (mut rope, mut sees) = (Vec::new(), Vec::new());
        let with_images = |test: fn(&PromptImages) -> bool| {
            plan.items.iter().any(|i| self.lanes.get(&i.id).and_then(|l| l.params.images.as_deref()).is_some_and(test))
        };
        let (turned, seeing) = (with_images(PromptImages::mrope), with_images(|i| i.bidirectional));
        // Per item: the index of its first logits row among the outputs (rows come in batch
        // order: an item that samples has one for its last token and one per proposal).
        let mut rows = Vec::with_capacity(plan.items.len());
        // Per output row: what its sequence needs of it (on a GPU, a greedy row's best token or a
        // top-k row's candidates are found there instead of the row coming back), and there the
        // tokens whose logits its bias and penalties change: those its sampler watches, and the
        // proposals (a proposal's row is sampled once the ones before it are counted).
        let mut asks = Vec::new();
        // Per item: the tokens whose rows give prompt log-probabilities, and the first such row.
        let mut scored = Vec::with_capacity(plan.items.len());
        let candidates = self.ctx.finds_candidates();
        for (item, drafts) in plan.items.iter().zip(&drafts) {
            let lane = self.lanes.get(&item.id);
            let scoring = lane.and_then(|l| l.scoring.as_ref());
            let scores = scoring.map_or(0..0, |s| s.rows(item.start_pos as usize, item.tokens.len()));
            if let Some(lane) = lane {
                lane.embed(item, batch.len(), &mut batch.embedded);
            }
            let images = lane.and_then(|l| l.params.images.as_deref());
            let at = |k: usize| item.start_pos + k as i64;
            let item_rows = 0..item.tokens.len() + drafts.len();
            if turned {
                rope.extend(item_rows.clone().map(|k| images.map_or([at(k); 3], |i| i.rope_at(at(k)))));
            }
            if seeing {
                sees.extend(item_rows.map(|k| images.map_or(at(k), |i| i.sees(at(k)))));
            }
            for (k, &token) in item.tokens.iter().enumerate() {
                let last = k + 1 == item.tokens.len();
                batch.push(token, item.start_pos + k as i64, &[item.seq], item.sample && last || scores.contains(&k));
            }
            scored.push((scores.clone(), asks.len()));
            asks.extend(std::iter::repeat_n(RowAsk::from(RowNeed::Whole), scores.len()));
            rows.push(asks.len());
            if item.sample {
                let ask = self.lanes.get(&item.id).map_or(RowAsk::from(RowNeed::Whole), |l| {
                    let mut watch = if candidates { l.sampler.watch() } else { Vec::new() };
                    if !watch.is_empty() {
                        watch.extend(drafts);
                        watch.sort_unstable();
                        watch.dedup();
                    }
                    RowAsk { need: l.sampler.need(), watch }
                });
                asks.extend(std::iter::repeat_n(ask, 1 + drafts.len()));
            }
            for (k, &token) in drafts.iter().enumerate() {
                batch.push(token, item.start_pos + (item.tokens.len() + k) as i64, &[item.seq], true);
            }
        }
        batch.rope = turned.then_some(rope);
        batch.sees = seeing.then_some(sees);
        // T1: the grammar masks of the sequences that sample are computed on the compute pool
        // while the forward pass runs (they depend only on the tokens so far).
        let sampling: Vec<RequestId> = plan.items.iter().filter(|i| i.sample).map(|i| i.id).collect();
        let mut guided: Vec<&mut Sampler> = self
            .lanes
            .iter_mut()
            .filter(|(id, l)| l.sampler.is_guided() && sampling.contains(id))
            .map(|(_, l)| &mut l.sampler)
            .collect();
        let ctx = &mut self.ctx;
        let (decoded, ()) = rayon::join(
            || ctx.decode_picking(&batch, &|| false, &asks),
            || guided.par_iter_mut().for_each(|s| s.prepare()),
        );
        decoded?;
        let mut prompt_logprobs = Vec::with_capacity(plan.items.len());
        for (item, (scores, first)) in plan.items.iter().zip(scored) {
            let mut done = Vec::new();
            if let Some(lane) = self.lanes.get_mut(&item.id)
                && let Some(scoring) = lane.scoring.as_mut().filter(|_| !scores.is_empty())
            {
                let at = item.start_pos as usize + scores.start;
                done = scoring.score(self.ctx.outputs(), first..first + scores.len(), at)?;
                if !done.is_empty() {
                    // Given once: a pass over the prompt again (after a preemption) gives none.
                    lane.scoring = None;
                }
            }
            prompt_logprobs.push(done);
        }
        // Each sampling item's rows go to its own lane, the lanes in parallel on the compute pool
        // (a draw from a whole row is milliseconds on the CPU).
        let mut lanes: HashMap<RequestId, &mut Lane> =
            self.lanes.iter_mut().filter(|(id, _)| sampling.contains(id)).map(|(id, l)| (*id, l)).collect();
        let mut jobs = Vec::with_capacity(sampling.len());
        for (k, item) in plan.items.iter().enumerate().filter(|(_, i)| i.sample) {
            let lane = lanes.remove(&item.id);
            jobs.push((k, lane.ok_or_else(|| DecodeError::Internal(format!("request {} has no sampler", item.id)))?));
        }
        let outputs = self.ctx.outputs();
        // A lane whose candidates cannot decide stops at that row; the rows all such lanes stop
        // at are read from the device in one readback, and those lanes go on from there.
        let mut sampled = vec![None; plan.items.len()];
        let mut pending: Vec<Verifying<'_>> = jobs
            .into_iter()
            .map(|(k, lane)| Verifying { k, lane, out: ItemOutput { proposed: drafts[k].len(), ..Default::default() } })
            .collect();
        let mut fetched = HashMap::new();
        while !pending.is_empty() {
            let verified: Vec<(Verifying<'_>, Option<usize>)> = pending
                .into_par_iter()
                .map(|mut v| {
                    verify(v.lane, outputs, &drafts[v.k], rows[v.k], &fetched, &mut v.out).map(|stop| (v, stop))
                })
                .collect::<Result<_, _>>()?;
            let mut stops = Vec::new();
            pending = Vec::new();
            for (v, stop) in verified {
                match stop {
                    Some(row) => {
                        stops.push(row);
                        pending.push(v);
                    }
                    None => sampled[v.k] = Some(v.out),
                }
            }
            if !stops.is_empty() {
                fetched.extend(stops.iter().copied().zip(outputs.fetch_rows(&stops)?));
            }
        }
        let mut outputs = Vec::with_capacity(plan.items.len());
        for (((item, drafts), output), prompt_logprobs) in
            plan.items.iter().zip(&drafts).zip(sampled).zip(prompt_logprobs)
        {
            let Some(mut output) = output else {
                outputs.push(ItemOutput { prompt_logprobs, ..ItemOutput::default() });
                continue;
            };
            output.prompt_logprobs = prompt_logprobs;
            // The proposals after the accepted ones leave the cache now.
            let kept = item.tokens.len() + output.sampled.len() - 1;
            if kept < item.tokens.len() + drafts.len() {
                let from = item.start_pos + kept as i64;
                self.ctx.kv_mut().seq_rm(item.seq, from..).map_err(internal(format!("rejecting from {from}")))?;
            }
            outputs.push(output);
        }
        Ok(outputs)
    }

    /// Encodes the images whose tokens the plan's items reach and that are not encoded yet.
    fn encode_images(&mut self, plan: &StepPlan) -> Result<(), DecodeError> {
        for item in &plan.items {
            let Some(lane) = self.lanes.get_mut(&item.id) else { continue };
            let Some(images) = lane.params.images.clone() else { continue };
            for (k, _) in images.reached(item_rows(item)) {
                if lane.features[k].is_none() {
                    lane.features[k] = Some(Arc::new(self.ctx.encode_image(&images.images[k])?));
                }
            }
        }
        Ok(())
    }

    /// Proposals for the plan's items (empty for items not allowed any).
    fn propose(&mut self, plan: &StepPlan) -> Vec<Vec<u32>> {
        let mut drafts = vec![Vec::new(); plan.items.len()];
        let Some(proposer) = &mut self.proposer else { return drafts };
        let mut slots = Vec::new();
        let mut index = Vec::new();
        for (k, item) in plan.items.iter().enumerate() {
            if item.max_drafts == 0 || !item.sample {
                continue;
            }
            if let Some(history) = self.lanes.get(&item.id).and_then(|l| l.history.as_deref()) {
                slots.push(DraftSlot { id: item.id, history, max: item.max_drafts, drafts: Vec::new() });
                index.push(k);
            }
        }
        if !slots.is_empty() {
            proposer.propose(&mut slots);
        }
        for (k, slot) in index.into_iter().zip(slots) {
            drafts[k] = slot.drafts;
            drafts[k].truncate(plan.items[k].max_drafts);
        }
        drafts
    }
}

/// An item's lane while its rows are sampled, and what it has sampled so far.
struct Verifying<'a> {
    k: usize,
    lane: &'a mut Lane,
    out: ItemOutput,
}

/// Samples an item's logits rows from output row `row` on with its lane, in order, while the
/// sampled token is the proposed one; stops early where the request ends (a stop token, its
/// constraint). Goes on after the rows already in `out`; returns the output row where it stopped
/// because the row's candidates cannot decide (a draw past them, or penalties that may have
/// brought a token past them among the best) and the row is not among the `fetched` ones: the
/// caller reads it and calls again. `None` once the item is done.
fn verify(
    lane: &mut Lane,
    outputs: &Outputs,
    drafts: &[u32],
    row: usize,
    fetched: &HashMap<usize, Vec<f32>>,
    out: &mut ItemOutput,
) -> Result<Option<usize>, DecodeError> {
    for j in out.sampled.len()..=drafts.len() {
        let sampled = if let Some(token) = outputs.picked(row + j) {
            lane.sampler.picked(token)
        } else if let Some(logits) = fetched.get(&(row + j)) {
            lane.sampler.sample(logits)
        } else if let Some(candidates) = outputs.top(row + j) {
            match lane.sampler.sample_top(candidates, outputs.mass(row + j), outputs.watched(row + j)) {
                Some(sampled) => sampled,
                None => return Ok(Some(row + j)),
            }
        } else if let Some(logits) = outputs.row(row + j) {
            lane.sampler.sample(logits)
        } else {
            return Err(DecodeError::Internal("missing logits row".into()));
        };
        let token = sampled.token;
        let ends = sampled.end.is_some() || lane.params.stop_token_ids.contains(&token);
        if let Some(history) = &mut lane.history {
            history.push(token);
        }
        out.sampled.push(sampled);
        let accepted = drafts.get(j) == Some(&token);
        out.accepted += usize::from(accepted);
        if ends || !accepted {
            break;
        }
    }
    Ok(None)
}
