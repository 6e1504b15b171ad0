//! C4: one forward pass's input as a struct of arrays (llama.cpp's `llama_batch`). Prefill and
//! decode differ only in how a batch is filled. `validate` turns a `Batch` into a `ValidBatch`
//! with every default resolved; only a `ValidBatch` reaches a model.

use std::collections::HashMap;

use crate::error::DecodeError;
use crate::kv::{KvCells, MAX_SEQ, Pos, SeqId, SeqSet};

/// Token ids, or embeddings given directly (e.g. from a multimodal encoder).
#[derive(Debug, Clone, PartialEq)]
pub enum BatchInput {
    /// \[n_tokens\]
    Tokens(Vec<u32>),
    /// [n_tokens, dim] row-major.
    Embeddings { values: Vec<f32>, dim: usize },
}

/// Rows of a token batch given as embeddings in place of their tokens' (an image's features).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Embedded {
    /// The first row they replace.
    pub row: usize,
    /// [rows, hidden] row-major.
    pub values: Vec<f32>,
    /// Per layer from the first, [rows, hidden] added to these rows' hidden states after that
    /// layer (Qwen3-VL's deepstack features); empty for others.
    pub deepstack: Vec<Vec<f32>>,
}

/// A batch of tokens from any number of sequences.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub input: BatchInput,
    /// \[n_tokens\] positions; `None`: each sequence's last position + 1, counting up.
    pub pos: Option<Vec<Pos>>,
    /// \[n_tokens\] the sequences each token belongs to; `None`: every token in sequence 0.
    pub seq_ids: Option<Vec<Vec<SeqId>>>,
    /// \[n_tokens\] whether a token's logits row is wanted; `None`: only the last token's.
    pub logits: Option<Vec<bool>>,
    /// Runs of rows whose embeddings are given instead of their tokens' (a token batch's only).
    pub embedded: Vec<Embedded>,
    /// \[n_tokens\] M-RoPE's positions (temporal, height, width) where they are not each row's
    /// position in all three (an image's tokens, and the tokens after them); `None`: they are.
    pub rope: Option<Vec<[Pos; 3]>>,
    /// \[n_tokens\] the last position of its sequences each token attends to, where some see
    /// past their own (an image's rows that see each other both ways: Gemma 3's); `None`: each
    /// its own position.
    pub sees: Option<Vec<Pos>>,
}

impl Batch {
    /// Tokens of sequence 0 at its next positions, logits for the last one (`llama_batch_get_one`).
    pub fn one(tokens: Vec<u32>) -> Self {
        Self {
            input: BatchInput::Tokens(tokens),
            pos: None,
            seq_ids: None,
            logits: None,
            embedded: Vec::new(),
            rope: None,
            sees: None,
        }
    }

    /// An empty batch to fill with [`Batch::push`]; every field is then explicit.
    pub fn new() -> Self {
        Self {
            input: BatchInput::Tokens(Vec::new()),
            pos: Some(Vec::new()),
            seq_ids: Some(Vec::new()),
            logits: Some(Vec::new()),
            embedded: Vec::new(),
            rope: None,
            sees: None,
        }
    }

    /// Appends one token (`common_batch_add`).
    ///
    /// # Panics
    /// On a batch not made by [`Batch::new`] (one with implicit positions, sequences or logits
    /// flags, or with embeddings): mixing explicit and implicit entries is a programming error.
    pub fn push(&mut self, token: u32, pos: Pos, seqs: &[SeqId], logits: bool) {
        let (BatchInput::Tokens(tokens), Some(p), Some(s), Some(l)) =
            (&mut self.input, &mut self.pos, &mut self.seq_ids, &mut self.logits)
        else {
            panic!("Batch::push needs a token batch made by Batch::new");
        };
        tokens.push(token);
        p.push(pos);
        s.push(seqs.to_vec());
        l.push(logits);
    }

    pub fn len(&self) -> usize {
        match &self.input {
            BatchInput::Tokens(t) => t.len(),
            BatchInput::Embeddings { values, dim } => values.len().checked_div(*dim).unwrap_or(0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

/// A checked batch with every default resolved.
#[derive(Debug, Clone)]
pub struct ValidBatch<'a> {
    pub input: &'a BatchInput,
    /// \[n_tokens\]
    pub pos: Vec<Pos>,
    /// \[n_tokens\]
    pub seqs: Vec<SeqSet>,
    /// \[n_outputs\] batch indices whose logits are wanted, ascending.
    pub out_rows: Vec<usize>,
    /// Runs of rows given as embeddings, in order, apart and within the batch.
    pub embedded: &'a [Embedded],
    /// \[n_tokens\] M-RoPE's positions, where given.
    pub rope: Option<&'a [[Pos; 3]]>,
    /// \[n_tokens\] the last position each token attends to ([`Batch::sees`]), where given.
    pub sees: Option<&'a [Pos]>,
}

impl ValidBatch<'_> {
    /// \[n_tokens\] the last position each token attends to: [`Self::sees`], else its own.
    pub fn seen(&self) -> &[Pos] {
        self.sees.unwrap_or(&self.pos)
    }

    pub fn len(&self) -> usize {
        self.pos.len()
    }
    pub fn is_empty(&self) -> bool {
        self.pos.is_empty()
    }
}

/// What a batch is checked against.
pub struct Limits {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Positions must stay below this.
    pub context_length: usize,
}

/// Checks a batch against the model and the cache's current positions.
pub fn validate<'a>(batch: &'a Batch, cells: &KvCells, limits: &Limits) -> Result<ValidBatch<'a>, DecodeError> {
    let bad = |msg: String| Err(DecodeError::InvalidInput(msg));
    let n = batch.len();
    if n == 0 {
        return bad("empty batch".into());
    }
    match &batch.input {
        BatchInput::Tokens(tokens) => {
            if let Some((i, t)) = tokens.iter().enumerate().find(|(_, t)| **t as usize >= limits.vocab_size) {
                return bad(format!("token {i}: id {t} is not below the vocabulary size {}", limits.vocab_size));
            }
        }
        BatchInput::Embeddings { values, dim } => {
            if *dim != limits.hidden_size || values.len() % dim != 0 {
                return bad(format!(
                    "embeddings: {} values of width {dim}; the model needs rows of width {}",
                    values.len(),
                    limits.hidden_size
                ));
            }
            if values.iter().any(|v| !v.is_finite()) {
                return bad("embeddings: values must be finite".into());
            }
        }
    }
    let mut end = 0;
    for (k, e) in batch.embedded.iter().enumerate() {
        let rows = e.values.len().checked_div(limits.hidden_size).unwrap_or(0);
        if !matches!(batch.input, BatchInput::Tokens(_)) {
            return bad("embedded rows are given in a token batch only".into());
        }
        if rows == 0 || e.values.len() % limits.hidden_size != 0 {
            return bad(format!(
                "embedded run {k}: {} values are not rows of width {}",
                e.values.len(),
                limits.hidden_size
            ));
        }
        if e.row < end || e.row + rows > n {
            return bad(format!(
                "embedded run {k}: rows {}..{} overlap another run or pass the batch's {n}",
                e.row,
                e.row + rows
            ));
        }
        if e.deepstack.iter().any(|d| d.len() != e.values.len()) {
            return bad(format!("embedded run {k}: a deepstack layer's values are not its rows'"));
        }
        if e.values.iter().chain(e.deepstack.iter().flatten()).any(|v| !v.is_finite()) {
            return bad(format!("embedded run {k}: values must be finite"));
        }
        end = e.row + rows;
    }
    if let Some(p) = batch.rope.as_ref().and_then(|r| r.iter().position(|p| p.iter().any(|&x| x < 0))) {
        return bad(format!("token {p}: a negative M-RoPE position"));
    }
    for (name, len) in [
        ("rope", batch.rope.as_ref().map(Vec::len)),
        ("sees", batch.sees.as_ref().map(Vec::len)),
        ("pos", batch.pos.as_ref().map(Vec::len)),
        ("seq_ids", batch.seq_ids.as_ref().map(Vec::len)),
        ("logits", batch.logits.as_ref().map(Vec::len)),
    ] {
        if let Some(len) = len.filter(|l| *l != n) {
            return bad(format!("`{name}` has {len} entries for {n} tokens"));
        }
    }
    let seqs = resolve_seqs(batch, n)?;
    let pos = resolve_positions(batch, &seqs, cells, limits.context_length)?;
    let out_rows = match &batch.logits {
        None => vec![n - 1],
        Some(flags) => flags.iter().enumerate().filter(|(_, f)| **f).map(|(i, _)| i).collect(),
    };
    if let Some(k) = batch.sees.as_ref().and_then(|s| s.iter().zip(&pos).position(|(s, p)| s < p)) {
        return bad(format!("token {k}: it would see less than its own position"));
    }
    Ok(ValidBatch {
        input: &batch.input,
        pos,
        seqs,
        out_rows,
        embedded: &batch.embedded,
        rope: batch.rope.as_deref(),
        sees: batch.sees.as_deref(),
    })
}

fn resolve_seqs(batch: &Batch, n: usize) -> Result<Vec<SeqSet>, DecodeError> {
    let Some(ids) = &batch.seq_ids else {
        return Ok(vec![SeqSet::single(0); n]);
    };
    ids.iter()
        .enumerate()
        .map(|(i, ids)| {
            if ids.is_empty() {
                return Err(DecodeError::InvalidInput(format!("token {i} belongs to no sequence")));
            }
            let mut set = SeqSet::default();
            for &s in ids {
                if s as usize >= MAX_SEQ {
                    return Err(DecodeError::InvalidInput(format!(
                        "token {i}: sequence id {s} is not below {MAX_SEQ}"
                    )));
                }
                set.insert(s);
            }
            Ok(set)
        })
        .collect()
}

/// Fills in default positions and checks that each sequence's positions only go forward:
/// above what the cache holds for it and strictly increasing within the batch.
fn resolve_positions(batch: &Batch, seqs: &[SeqSet], cells: &KvCells, n_ctx: usize) -> Result<Vec<Pos>, DecodeError> {
    let mut last: HashMap<SeqId, Pos> = HashMap::new();
    let last_of = |s: SeqId, last: &HashMap<SeqId, Pos>| last.get(&s).copied().or_else(|| cells.seq_pos_max(s));
    let mut out = Vec::with_capacity(seqs.len());
    for (i, set) in seqs.iter().enumerate() {
        let p = match &batch.pos {
            Some(pos) => pos[i],
            None => set.iter().map(|s| last_of(s, &last).map_or(0, |p| p + 1)).max().unwrap_or(0),
        };
        if p < 0 || p >= n_ctx as Pos {
            return Err(DecodeError::InvalidInput(format!(
                "token {i}: position {p} is outside the context [0, {n_ctx})"
            )));
        }
        for s in set.iter() {
            if let Some(prev) = last_of(s, &last).filter(|prev| p <= *prev) {
                return Err(DecodeError::InvalidInput(format!(
                    "token {i}: position {p} of sequence {s} does not follow its last position {prev}"
                )));
            }
            last.insert(s, p);
        }
        out.push(p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { vocab_size: 100, hidden_size: 8, context_length: 32 };

    fn err(batch: &Batch, cells: &KvCells) -> String {
        match validate(batch, cells, &LIMITS) {
            Err(DecodeError::InvalidInput(msg)) => msg,
            other => panic!("expected invalid input, got {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_positions_sequence_zero_and_last_logits() {
        let cells = KvCells::new(8, 32);
        let batch = Batch::one(vec![1, 2, 3]);
        let v = validate(&batch, &cells, &LIMITS).unwrap();
        assert_eq!((v.pos.clone(), v.out_rows.clone()), (vec![0, 1, 2], vec![2]));
        assert!(v.seqs.iter().all(|s| *s == SeqSet::single(0)));
    }

    #[test]
    fn default_positions_continue_each_sequence() {
        let mut cells = KvCells::new(8, 32);
        let p = cells.find_slots(2).unwrap();
        cells.occupy(&p, &[0, 1], &[SeqSet::single(1); 2]);
        let batch = Batch { seq_ids: Some(vec![vec![1], vec![0], vec![1]]), ..Batch::one(vec![5, 6, 7]) };
        assert_eq!(validate(&batch, &cells, &LIMITS).unwrap().pos, vec![2, 0, 3]);
    }

    #[test]
    fn bad_batches_are_rejected_with_the_reason() {
        let cells = KvCells::new(8, 32);
        assert!(err(&Batch::one(vec![]), &cells).contains("empty"));
        assert!(err(&Batch::one(vec![1, 100]), &cells).contains("id 100"));
        let mut b = Batch::new();
        b.push(1, 3, &[0], true);
        b.push(2, 2, &[0], true);
        assert!(err(&b, &cells).contains("does not follow"));
        let mut b = Batch::new();
        b.push(1, 32, &[0], true);
        assert!(err(&b, &cells).contains("outside the context"));
        let mut b = Batch::new();
        b.push(1, 0, &[], true);
        assert!(err(&b, &cells).contains("no sequence"));
        let mut b = Batch::new();
        b.push(1, 0, &[MAX_SEQ as u32], true);
        assert!(err(&b, &cells).contains("sequence id"));
        let b = Batch { logits: Some(vec![true]), ..Batch::one(vec![1, 2]) };
        assert!(err(&b, &cells).contains("`logits` has 1 entries"));
        let b = Batch { input: BatchInput::Embeddings { values: vec![0.0; 12], dim: 6 }, ..Batch::one(vec![]) };
        assert!(err(&b, &cells).contains("width"));
        let run = |row: usize, rows: usize| Embedded { row, values: vec![0.5; rows * 8], deepstack: Vec::new() };
        let b = Batch { embedded: vec![run(1, 2)], ..Batch::one(vec![1, 2]) };
        assert!(err(&b, &cells).contains("pass the batch"));
        let b = Batch { embedded: vec![run(0, 2), run(1, 1)], ..Batch::one(vec![1, 2, 3]) };
        assert!(err(&b, &cells).contains("overlap"));
        let b = Batch {
            embedded: vec![Embedded { row: 0, values: vec![0.5; 12], ..Default::default() }],
            ..Batch::one(vec![1, 2])
        };
        assert!(err(&b, &cells).contains("width 8"));
        let deep = Embedded { deepstack: vec![vec![0.5; 8]], ..run(0, 2) };
        let b = Batch { embedded: vec![deep], ..Batch::one(vec![1, 2]) };
        assert!(err(&b, &cells).contains("deepstack"));
        let deep = Embedded { deepstack: vec![vec![f32::NAN; 8]], ..run(0, 1) };
        let b = Batch { embedded: vec![deep], ..Batch::one(vec![1, 2]) };
        assert!(err(&b, &cells).contains("finite"));
        let b = Batch { rope: Some(vec![[0; 3]]), ..Batch::one(vec![1, 2]) };
        assert!(err(&b, &cells).contains("`rope` has 1 entries"));
        let b = Batch {
            embedded: vec![run(0, 1), run(2, 1)],
            rope: Some(vec![[0; 3], [1; 3], [1, 2, 2]]),
            ..Batch::one(vec![1, 2, 3])
        };
        assert!(validate(&b, &cells, &LIMITS).is_ok());
    }

    #[test]
    fn positions_may_not_go_back_into_the_cache() {
        let mut cells = KvCells::new(8, 32);
        let p = cells.find_slots(3).unwrap();
        cells.occupy(&p, &[0, 1, 2], &[SeqSet::single(0); 3]);
        let mut b = Batch::new();
        b.push(1, 2, &[0], true);
        assert!(err(&b, &cells).contains("last position 2"));
    }
}
