//! Prompt lookup (vLLM's `ngram`, llama.cpp's lookup decoding): the sequence's last `n` tokens
//! are looked up in everything before them, longest `n` first, and the tokens that followed
//! their latest earlier occurrence are the proposal. Code edits, summaries and extraction
//! repeat long runs of their input, which this finds for the cost of a hash lookup.
//!
//! Each sequence's index maps an n-gram's hash to where its latest occurrence continues; it is
//! extended by the tokens added since the last proposal, so a step costs O(new tokens · n).

use std::collections::HashMap;

use super::{DraftSlot, Proposer};
use crate::request::RequestId;

#[derive(Debug, Default)]
struct Index {
    /// n-gram hash → index of the token after its latest occurrence.
    next: HashMap<u64, u32>,
    /// Continuations `< indexed` are in `next`.
    indexed: usize,
}

#[derive(Debug)]
pub struct NgramProposer {
    min: usize,
    max: usize,
    seqs: HashMap<RequestId, Index>,
}

impl NgramProposer {
    pub const NAME: &'static str = "ngram";

    /// Matches n-grams of `min..=max` tokens (`1 ≤ min ≤ max`).
    pub fn new(min: usize, max: usize) -> Self {
        Self { min: min.max(1), max: max.max(min.max(1)), seqs: HashMap::new() }
    }

    /// The proposal for `history`, at most `max` tokens.
    fn lookup(&self, index: &Index, history: &[u32], max: usize) -> Vec<u32> {
        let len = history.len();
        for n in (self.min..=self.max.min(len)).rev() {
            let suffix = &history[len - n..];
            // A hash collision could name another n-gram: the tokens are compared.
            if let Some(&at) = index.next.get(&key(suffix))
                && let at = at as usize
                && at >= n
                && &history[at - n..at] == suffix
            {
                return history[at..len.min(at + max)].to_vec();
            }
        }
        Vec::new()
    }
}

impl Proposer for NgramProposer {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn propose(&mut self, slots: &mut [DraftSlot<'_>]) {
        for slot in slots {
            let index = self.seqs.entry(slot.id).or_default();
            let history = slot.history;
            // Every continuation that exists now, except the end (the suffix being looked up).
            for at in index.indexed.max(self.min)..history.len() {
                for n in self.min..=self.max.min(at) {
                    index.next.insert(key(&history[at - n..at]), at as u32);
                }
            }
            index.indexed = index.indexed.max(history.len());
            let index = &self.seqs[&slot.id];
            slot.drafts = if slot.max == 0 { Vec::new() } else { self.lookup(index, history, slot.max) };
        }
    }

    fn forget(&mut self, id: RequestId) {
        self.seqs.remove(&id);
    }
}

/// FNV-1a over the tokens, with the length mixed in.
fn key(tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ tokens.len() as u64;
    for &t in tokens {
        for b in t.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(p: &mut NgramProposer, history: &[u32], max: usize) -> Vec<u32> {
        let mut slots = [DraftSlot { id: 1, history, max, drafts: Vec::new() }];
        p.propose(&mut slots);
        std::mem::take(&mut slots[0].drafts)
    }

    #[test]
    fn the_tokens_after_the_latest_earlier_occurrence_are_proposed() {
        let mut p = NgramProposer::new(2, 3);
        // "5 6" occurred twice before; the latest continues with 9 10.
        let history = [5, 6, 7, 8, 1, 5, 6, 9, 10, 2, 5, 6];
        assert_eq!(propose(&mut p, &history, 2), vec![9, 10]);
        assert_eq!(propose(&mut p, &history, 8), vec![9, 10, 2, 5, 6], "up to the end of the history");
    }

    #[test]
    fn the_longest_match_wins_and_short_histories_propose_nothing() {
        let mut p = NgramProposer::new(1, 3);
        // The 1-gram "4" last continued with 1, the 3-gram "2 3 4" with 5.
        let history = [2, 3, 4, 5, 6, 4, 1, 2, 3, 4];
        assert_eq!(propose(&mut p, &history, 2), vec![5, 6]);
        let mut p = NgramProposer::new(2, 4);
        assert!(propose(&mut p, &[7], 4).is_empty());
        assert!(propose(&mut p, &[1, 2, 3, 4], 4).is_empty(), "no n-gram repeats");
    }

    #[test]
    fn the_index_grows_with_the_history() {
        let mut p = NgramProposer::new(2, 2);
        let mut history = vec![1, 2, 3, 4];
        assert!(propose(&mut p, &history, 4).is_empty());
        history.extend([1, 2]);
        assert_eq!(propose(&mut p, &history, 4), vec![3, 4, 1, 2]);
        history.extend([3, 9, 1, 2]);
        assert_eq!(propose(&mut p, &history, 1), vec![3], "the latest occurrence, now followed by 3 9");
        assert_eq!(propose(&mut p, &history, 2), vec![3, 9]);
        p.forget(1);
        assert!(p.seqs.is_empty());
    }
}
