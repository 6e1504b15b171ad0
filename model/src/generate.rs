//! Greedy generation with the core alone (no engine): the `llaisys generate` path and the
//! reference the engine's output is compared with.

use std::time::{Duration, Instant};

use crate::batch::Batch;
use crate::context::Context;
use crate::error::DecodeError;
use crate::kv::SeqId;
use crate::output::argmax;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token was produced (it is included in `tokens`).
    Stop,
    /// `max_tokens` were produced.
    Length,
    /// The sequence reached the context length.
    Context,
}

#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish: Finish,
    /// Time of the prompt's forward pass (which also yields the first token).
    pub prefill: Duration,
    /// Time of the forward passes after the first token.
    pub decode: Duration,
}

/// Generates greedily in sequence `seq` (cleared first) from `prompt`, stopping at one of
/// `stop` ids, after `max_tokens`, or at the context length. The prompt goes in one batch.
pub fn greedy(
    ctx: &mut Context,
    seq: SeqId,
    prompt: &[u32],
    max_tokens: usize,
    stop: &[u32],
) -> Result<Generation, DecodeError> {
    ctx.kv_mut().seq_rm(seq, ..).map_err(|e| DecodeError::InvalidInput(format!("sequence {seq}: {e}")))?;
    let context = ctx.info().context_length;
    let mut tokens = Vec::new();
    let mut batch = one_sequence(prompt, seq, 0);
    let start = Instant::now();
    let mut prefill = Duration::ZERO;
    let finish = loop {
        if tokens.len() == max_tokens {
            break Finish::Length;
        }
        let next_pos = prompt.len() + tokens.len();
        if next_pos >= context {
            break Finish::Context;
        }
        ctx.decode(&batch)?;
        let row = ctx.outputs().row(0).ok_or_else(|| DecodeError::Internal("no logits row".into()))?;
        let next = argmax(row).ok_or_else(|| DecodeError::Internal("empty logits row".into()))?;
        if tokens.is_empty() {
            prefill = start.elapsed();
        }
        tokens.push(next);
        if stop.contains(&next) {
            break Finish::Stop;
        }
        batch = one_sequence(&[next], seq, next_pos as i64);
    };
    Ok(Generation { tokens, finish, prefill, decode: start.elapsed() - prefill })
}

/// Tokens of one sequence at positions `p0..`, logits for the last.
pub fn one_sequence(tokens: &[u32], seq: SeqId, p0: i64) -> Batch {
    let mut batch = Batch::new();
    for (i, &t) in tokens.iter().enumerate() {
        batch.push(t, p0 + i as i64, &[seq], i + 1 == tokens.len());
    }
    batch
}
