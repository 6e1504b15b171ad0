//! C7: the logits of a forward pass's flagged tokens. The buffers belong to the context and
//! are reused from pass to pass.

/// Logits rows of the last successful forward pass.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    vocab: usize,
    /// [n_outputs, vocab] row-major.
    logits: Vec<f32>,
    /// [n_outputs] the batch index of each row.
    rows: Vec<usize>,
}

impl Outputs {
    pub(crate) fn new(vocab: usize) -> Self {
        Self { vocab, ..Self::default() }
    }

    /// Replaces the contents, reusing the buffers' capacity.
    pub(crate) fn set(&mut self, logits: &[f32], rows: &[usize]) {
        debug_assert_eq!(logits.len(), rows.len() * self.vocab);
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        self.rows.clear();
        self.rows.extend_from_slice(rows);
    }

    pub(crate) fn clear(&mut self) {
        self.logits.clear();
        self.rows.clear();
    }

    /// Number of logits rows (the number of flagged tokens).
    pub fn n_outputs(&self) -> usize {
        self.rows.len()
    }
    /// \[n_outputs\] batch index of each row.
    pub fn output_ids(&self) -> &[usize] {
        &self.rows
    }
    /// All rows, [n_outputs, vocab] row-major.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
    /// The `row`-th logits row.
    pub fn row(&self, row: usize) -> Option<&[f32]> {
        self.logits.get(row * self.vocab..(row + 1) * self.vocab)
    }
    /// The logits of batch token `i`, if it was flagged (`llama_get_logits_ith`).
    pub fn logits_ith(&self, i: usize) -> Option<&[f32]> {
        self.rows.iter().position(|r| *r == i).and_then(|row| self.row(row))
    }
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

/// Index of the largest value (the first one on ties); `None` for an empty row.
pub fn argmax(row: &[f32]) -> Option<u32> {
    // Two passes that vectorize (the largest value, then where it first is) instead of one
    // branchy pass: the lm head's rows are 151,936 long.
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    (!row.is_empty()).then(|| row.iter().position(|&v| v == max).unwrap_or(0) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_map_to_batch_indices() {
        let mut out = Outputs::new(2);
        out.set(&[1.0, 2.0, 3.0, 4.0], &[0, 3]);
        assert_eq!((out.n_outputs(), out.output_ids()), (2, &[0, 3][..]));
        assert_eq!(out.logits_ith(3), Some(&[3.0, 4.0][..]));
        assert_eq!(out.logits_ith(1), None);
        assert_eq!(out.row(2), None);
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), Some(1));
        assert_eq!(argmax(&[]), None);
    }
}
