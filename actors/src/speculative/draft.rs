//! A draft model: a smaller (or more quantized) model with the target's vocabulary proposes
//! by greedy decoding in its own context. Each sequence has a sequence of the draft's KV cache
//! holding the tokens it has seen; before proposing, the part that no longer matches the
//! history (the rejected guesses) is removed and the rest of the history is fed, then each
//! further proposed token costs one draft forward pass, batched over the sequences.

use std::collections::HashMap;

use llaisys_model::kv::MAX_SEQ;
use llaisys_model::{Batch, Context, DecodeError, LanguageModel, SeqId, argmax};

use super::{DraftSlot, Proposer};
use crate::request::RequestId;

/// Most history tokens fed to the draft in one forward pass.
const CHUNK: usize = 512;

struct DraftSeq {
    seq: SeqId,
    /// The tokens whose keys and values the draft's cache holds for this sequence.
    cached: Vec<u32>,
}

pub struct DraftModelProposer {
    ctx: Context,
    /// Proposals are ids below this (the target's vocabulary).
    vocab: usize,
    seqs: HashMap<RequestId, DraftSeq>,
    free: Vec<SeqId>,
}

impl DraftModelProposer {
    pub const NAME: &'static str = "draft";

    /// A proposer running `model` with a cache of `kv_capacity` cells, proposing ids below
    /// `vocab`. The caller has checked that the vocabularies agree.
    pub fn new(model: Box<dyn LanguageModel>, kv_capacity: usize, vocab: usize) -> Self {
        let ctx = Context::new(model, kv_capacity);
        Self { ctx, vocab, seqs: HashMap::new(), free: (0..MAX_SEQ as SeqId).rev().collect() }
    }

    /// The next token by the draft's greedy choice from batch row `row`.
    fn pick(&self, row: usize) -> Option<u32> {
        let logits = self.ctx.outputs().logits_ith(row)?;
        argmax(&logits[..logits.len().min(self.vocab)])
    }

    /// Feeds each slot's history the draft has not seen and proposes its first token; then one
    /// token per pass. Returns the proposals, one per slot.
    fn run(&mut self, slots: &[(RequestId, &[u32], usize)]) -> Result<Vec<Vec<u32>>, DecodeError> {
        let mut drafts = vec![Vec::new(); slots.len()];
        // Catch-up: the history beyond what matches, in chunks; the last chunk's last row
        // gives the first proposal.
        let mut fed: Vec<usize> = Vec::with_capacity(slots.len());
        for &(id, history, _) in slots {
            let s = self.seqs.get_mut(&id).expect("slots have draft sequences");
            let keep = s.cached.iter().zip(history).take_while(|(a, b)| a == b).count().min(history.len() - 1);
            self.ctx.kv_mut().seq_rm(s.seq, keep as i64..).map_err(|e| DecodeError::Internal(e.to_string()))?;
            s.cached.truncate(keep);
            fed.push(keep);
        }
        loop {
            let mut batch = Batch::new();
            let mut rows = Vec::new();
            for (k, &(id, history, _)) in slots.iter().enumerate() {
                let seq = self.seqs[&id].seq;
                while fed[k] < history.len() && batch.len() < CHUNK {
                    let last = fed[k] + 1 == history.len();
                    batch.push(history[fed[k]], fed[k] as i64, &[seq], last);
                    if last {
                        rows.push((k, batch.len() - 1));
                    }
                    fed[k] += 1;
                }
            }
            if batch.is_empty() {
                break;
            }
            self.ctx.decode(&batch)?;
            for (k, row) in rows {
                drafts[k].extend(self.pick(row));
            }
        }
        for &(id, history, _) in slots {
            let s = self.seqs.get_mut(&id).expect("slots have draft sequences");
            s.cached = history.to_vec();
        }
        // One pass per further token, for the slots that want more.
        loop {
            let mut batch = Batch::new();
            let mut rows = Vec::new();
            for (k, &(id, _, max)) in slots.iter().enumerate() {
                let Some(&last) = drafts[k].last() else { continue };
                if drafts[k].len() >= max {
                    continue;
                }
                let s = &self.seqs[&id];
                batch.push(last, s.cached.len() as i64, &[s.seq], true);
                rows.push((k, batch.len() - 1));
            }
            if batch.is_empty() {
                break;
            }
            self.ctx.decode(&batch)?;
            for (k, row) in rows {
                let s = self.seqs.get_mut(&slots[k].0).expect("slots have draft sequences");
                s.cached.push(*drafts[k].last().expect("rows are of slots with a proposal"));
                drafts[k].extend(self.pick(row));
            }
        }
        Ok(drafts)
    }

    /// Frees every draft sequence but those of `keep`.
    fn evict_others(&mut self, keep: &[RequestId]) {
        let others: Vec<RequestId> = self.seqs.keys().filter(|id| !keep.contains(id)).copied().collect();
        for id in others {
            self.forget(id);
        }
    }
}

impl Proposer for DraftModelProposer {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn propose(&mut self, slots: &mut [DraftSlot<'_>]) {
        let mut wanted = Vec::new();
        for (k, slot) in slots.iter().enumerate() {
            if slot.max == 0 || slot.history.is_empty() {
                continue;
            }
            if !self.seqs.contains_key(&slot.id) {
                let Some(seq) = self.free.pop() else { continue };
                self.seqs.insert(slot.id, DraftSeq { seq, cached: Vec::new() });
            }
            wanted.push(k);
        }
        let args: Vec<(RequestId, &[u32], usize)> =
            wanted.iter().map(|&k| (slots[k].id, slots[k].history, slots[k].max)).collect();
        let mut result = self.run(&args);
        if matches!(result, Err(DecodeError::NoKvSlot { .. })) {
            // The draft's cache is full of other sequences: drop them and try once more.
            let ids: Vec<RequestId> = args.iter().map(|a| a.0).collect();
            self.evict_others(&ids);
            result = self.run(&args);
        }
        match result {
            Ok(drafts) => {
                for (k, drafts) in wanted.into_iter().zip(drafts) {
                    slots[k].drafts = drafts;
                }
            }
            Err(e) => {
                // Proposals are optional: the step goes on without them, the draft starts over.
                tracing::warn!(error = %e, "the draft model failed; its cache is cleared");
                let ids: Vec<RequestId> = self.seqs.keys().copied().collect();
                for id in ids {
                    self.forget(id);
                }
                self.ctx.kv_mut().clear();
            }
        }
    }

    fn forget(&mut self, id: RequestId) {
        if let Some(s) = self.seqs.remove(&id) {
            let _ = self.ctx.kv_mut().seq_rm(s.seq, ..);
            self.free.push(s.seq);
        }
    }
}
