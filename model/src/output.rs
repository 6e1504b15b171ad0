//! C7: the logits of a forward pass's flagged tokens. The buffers belong to the context and
//! are reused from pass to pass.

use burn::tensor::{Device, Int, Tensor, TensorData};

/// Logits rows of the last successful forward pass, or for rows that asked only for their best
/// token ([`Context::decode_picking`](crate::Context::decode_picking)), that token.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    vocab: usize,
    /// [rows with logits, vocab] row-major.
    logits: Vec<f32>,
    /// [n_outputs] the batch index of each row.
    rows: Vec<usize>,
    /// [n_outputs] what each row holds.
    kinds: Vec<Row>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Row {
    /// Its logits, the k-th row of `logits`.
    Logits(usize),
    /// The index of its largest logit.
    Picked(u32),
}

impl Outputs {
    pub(crate) fn new(vocab: usize) -> Self {
        Self { vocab, ..Self::default() }
    }

    /// Replaces the contents: the rows where `picked` is `Some` hold that token, the others in
    /// order the rows of `logits`.
    pub(crate) fn set(&mut self, logits: &[f32], picked: &[Option<u32>], rows: &[usize]) {
        debug_assert_eq!(picked.len(), rows.len());
        debug_assert_eq!(logits.len(), picked.iter().filter(|p| p.is_none()).count() * self.vocab);
        self.clear();
        self.logits.extend_from_slice(logits);
        self.rows.extend_from_slice(rows);
        let mut k = 0;
        self.kinds.extend(picked.iter().map(|p| match p {
            Some(token) => Row::Picked(*token),
            None => {
                k += 1;
                Row::Logits(k - 1)
            }
        }));
    }

    pub(crate) fn clear(&mut self) {
        self.logits.clear();
        self.rows.clear();
        self.kinds.clear();
    }

    /// Number of output rows (the number of flagged tokens).
    pub fn n_outputs(&self) -> usize {
        self.rows.len()
    }
    /// \[n_outputs\] batch index of each row.
    pub fn output_ids(&self) -> &[usize] {
        &self.rows
    }
    /// The `row`-th row's logits (`None` past the rows, or for a row that holds a picked token).
    pub fn row(&self, row: usize) -> Option<&[f32]> {
        match self.kinds.get(row)? {
            Row::Logits(k) => self.logits.get(k * self.vocab..(k + 1) * self.vocab),
            Row::Picked(_) => None,
        }
    }
    /// The token picked for the `row`-th row, if it asked for only that.
    pub fn picked(&self, row: usize) -> Option<u32> {
        match self.kinds.get(row)? {
            Row::Picked(token) => Some(*token),
            Row::Logits(_) => None,
        }
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

/// Each row's [`argmax`] on the tensor's device, so that only the indices need to come back:
/// the GPU kernel where it runs (`kernels::gpu_argmax`, two launches), on the CPU [`argmax`]
/// itself over the rows in memory, elsewhere Burn's op.
///
/// # Shapes
/// logits: [n, vocab] f32 → \[n\]
pub fn argmax_rows(logits: &Tensor<2>) -> Tensor<1, Int> {
    let [n, vocab] = logits.dims();
    let device = logits.device();
    if device == Device::flex()
        && let Ok(rows) = crate::transfers::read::<2, _, f32>(logits.clone())
    {
        let picks: Vec<i64> = (0..n).map(|r| argmax(&rows[r * vocab..(r + 1) * vocab]).unwrap_or(0) as i64).collect();
        return Tensor::from_data(TensorData::new(picks, [n]), &device);
    }
    crate::kernels::gpu_argmax(logits).unwrap_or_else(|| logits.clone().argmax(1).reshape([n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_map_to_batch_indices() {
        let mut out = Outputs::new(2);
        out.set(&[1.0, 2.0, 3.0, 4.0], &[None, None], &[0, 3]);
        assert_eq!((out.n_outputs(), out.output_ids()), (2, &[0, 3][..]));
        assert_eq!(out.logits_ith(3), Some(&[3.0, 4.0][..]));
        assert_eq!(out.logits_ith(1), None);
        assert_eq!(out.row(2), None);
        assert_eq!(out.picked(0), None);
    }

    #[test]
    fn picked_rows_hold_a_token_and_the_others_their_logits() {
        let mut out = Outputs::new(2);
        out.set(&[5.0, 6.0], &[Some(1), None, Some(0)], &[0, 1, 2]);
        assert_eq!((out.row(0), out.picked(0)), (None, Some(1)));
        assert_eq!((out.row(1), out.picked(1)), (Some(&[5.0, 6.0][..]), None));
        assert_eq!((out.row(2), out.picked(2)), (None, Some(0)));
        assert_eq!(out.logits_ith(1), Some(&[5.0, 6.0][..]));
        out.set(&[1.0, 2.0], &[None], &[4]);
        assert_eq!((out.n_outputs(), out.picked(0), out.row(0)), (1, None, Some(&[1.0, 2.0][..])));
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), Some(1));
        assert_eq!(argmax(&[]), None);
    }
}
