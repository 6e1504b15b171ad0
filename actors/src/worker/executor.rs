//! Runs a `StepPlan` on the model: frees the listed sequences' cells, puts every item into one
//! batch (one forward pass for prefill chunks and decode tokens alike), and samples each item
//! that asked for it with that request's own sampler.

use std::collections::HashMap;

use llaisys_model::{Batch, Context, DecodeError, GuideEnd, Sampled, Sampler};
use rayon::prelude::*;

use crate::request::{FinishReason, RequestId};
use crate::scheduler::StepPlan;

/// Each sampled item's token, and the reason its constraint ends it with, if it does.
pub fn tokens_and_ends(sampled: &[Option<Sampled>]) -> (Vec<Option<u32>>, Vec<Option<FinishReason>>) {
    let end = |s: &Sampled| match &s.end {
        None => None,
        Some(GuideEnd::Complete) => Some(FinishReason::Stop),
        Some(GuideEnd::Failed(e)) => {
            tracing::error!(error = e, "constrained decoding failed");
            Some(FinishReason::Error)
        }
    };
    sampled.iter().map(|s| (s.as_ref().map(|s| s.token), s.as_ref().and_then(end))).unzip()
}

pub struct Executor {
    ctx: Context,
    samplers: HashMap<RequestId, Sampler>,
}

impl Executor {
    pub fn new(ctx: Context) -> Self {
        Self { ctx, samplers: HashMap::new() }
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Registers the sampler of a new request.
    pub fn add_request(&mut self, id: RequestId, sampler: Sampler) {
        self.samplers.insert(id, sampler);
    }

    /// Forgets a finished request's sampler.
    pub fn remove_request(&mut self, id: RequestId) {
        self.samplers.remove(&id);
    }

    /// Runs one step. `result[k]` is what `plan.items[k]` sampled, if it sampled.
    /// On an error no item advanced; freed cells stay freed.
    ///
    /// The step runs on a thread of the compute (rayon) pool, the caller waiting: each
    /// kernel's parallel loop then starts inside the pool instead of waking it from outside and
    /// sleeping until it is done, 169 times a token (f16 decode 26 → 29 tok/s). A panic
    /// resumes on the caller.
    pub fn execute(&mut self, plan: &StepPlan) -> Result<Vec<Option<Sampled>>, DecodeError> {
        rayon::scope(|_| self.execute_here(plan))
    }

    fn execute_here(&mut self, plan: &StepPlan) -> Result<Vec<Option<Sampled>>, DecodeError> {
        for &seq in &plan.free {
            self.ctx
                .kv_mut()
                .seq_rm(seq, ..)
                .map_err(|e| DecodeError::Internal(format!("freeing sequence {seq}: {e}")))?;
        }
        for copy in &plan.copies {
            self.ctx
                .kv_mut()
                .seq_cp(copy.src, copy.dst, 0..copy.len as i64)
                .map_err(|e| DecodeError::Internal(format!("reusing the prefix of sequence {}: {e}", copy.src)))?;
        }
        if plan.items.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = Batch::new();
        let mut rows = Vec::with_capacity(plan.items.len());
        for item in &plan.items {
            for (k, &token) in item.tokens.iter().enumerate() {
                let last = k + 1 == item.tokens.len();
                batch.push(token, item.start_pos + k as i64, &[item.seq], item.sample && last);
            }
            rows.push(batch.len() - 1);
        }
        // T1: the grammar masks of the sequences that sample are computed on the compute pool
        // while the forward pass runs (they depend only on the tokens so far).
        let sampling: Vec<RequestId> = plan.items.iter().filter(|i| i.sample).map(|i| i.id).collect();
        let mut guided: Vec<&mut Sampler> =
            self.samplers.iter_mut().filter(|(id, s)| s.is_guided() && sampling.contains(id)).map(|(_, s)| s).collect();
        let ctx = &mut self.ctx;
        let (decoded, ()) = rayon::join(|| ctx.decode(&batch), || guided.par_iter_mut().for_each(|s| s.prepare()));
        decoded?;
        let outputs = self.ctx.outputs();
        plan.items
            .iter()
            .zip(rows)
            .map(|(item, row)| {
                if !item.sample {
                    return Ok(None);
                }
                let logits =
                    outputs.logits_ith(row).ok_or_else(|| DecodeError::Internal("missing logits row".into()))?;
                let sampler = self
                    .samplers
                    .get_mut(&item.id)
                    .ok_or_else(|| DecodeError::Internal(format!("request {} has no sampler", item.id)))?;
                Ok(Some(sampler.sample(logits)))
            })
            .collect()
    }
}
