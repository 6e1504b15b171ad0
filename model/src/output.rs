//! C7: the logits of a forward pass's flagged tokens. The buffers belong to the context and
//! are reused from pass to pass.

use std::ops::Range;

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::device::DeviceStream;
use crate::error::DecodeError;

/// What a pass brings back of one output row ([`Context::decode_picking`]).
///
/// [`Context::decode_picking`]: crate::Context::decode_picking
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RowNeed {
    /// Its logits, all of them.
    #[default]
    Whole,
    /// The index of its largest logit only (greedy decoding), found on the model's device.
    Best,
    /// Its `k` largest logits with their tokens, best first (sampling with top-k and nothing
    /// else that reads the row, or penalties that only lower logits, which the sampler applies
    /// to the candidates, then reading the row only where they are not enough:
    /// [`Outputs::fetch_row`]), found on a GPU; where the logits are in host memory already
    /// (the CPU), or no kernel runs, the whole row.
    Top(usize),
    /// Its [`TOP_K_ON_DEVICE`] largest logits with their tokens and the row's probability mass
    /// at this temperature, Σ exp((l − max) / t) (sampling without a top-k and nothing else that
    /// reads the row): a draw from the row mostly falls among the best candidates, which the
    /// mass tells ([`Sampler::sample_top`]); where it does not, the row is read after all
    /// ([`Outputs::fetch_row`]). Found on a GPU; elsewhere the whole row, as for `Top`.
    ///
    /// [`TOP_K_ON_DEVICE`]: crate::sampling::TOP_K_ON_DEVICE
    /// [`Sampler::sample_top`]: crate::Sampler::sample_top
    Draw(f32),
}

/// What a pass brings back of one output row ([`Context::decode_picking`]): what [`RowNeed`]
/// says and, beside a row's candidates (`Top`, `Draw`), the logits of the `watch` tokens, the
/// ones its sampler's bias and penalties change ([`Sampler::watch`]), so that it can adjust
/// them and the row's mass without the row ([`Outputs::watched`]).
///
/// [`Context::decode_picking`]: crate::Context::decode_picking
/// [`Sampler::watch`]: crate::Sampler::watch
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RowAsk {
    pub need: RowNeed,
    pub watch: Vec<u32>,
}

impl From<RowNeed> for RowAsk {
    fn from(need: RowNeed) -> Self {
        Self { need, watch: Vec::new() }
    }
}

/// What a pass read back of one output row, for [`Outputs::set`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Read {
    /// The next row of the logits read.
    Logits,
    Picked(u32),
    /// (token, logit) best first, the row's mass where it was asked for ([`RowNeed::Draw`]),
    /// and the (token, logit) pairs of its watched tokens ([`RowAsk::watch`]).
    Top(Vec<(u32, f32)>, Option<f32>, Vec<(u32, f32)>),
}

/// Logits rows of the last successful forward pass or, for rows that asked for less
/// ([`RowNeed`]), their best token or their best candidates.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    vocab: usize,
    /// [rows with logits, vocab] row-major.
    logits: Vec<f32>,
    /// The candidates of the rows that hold some, one row after the other.
    candidates: Vec<(u32, f32)>,
    /// The watched tokens' logits of the rows that hold candidates, one row after the other.
    watched: Vec<(u32, f32)>,
    /// [n_outputs] the batch index of each row.
    rows: Vec<usize>,
    /// [n_outputs] what each row holds.
    kinds: Vec<Row>,
    /// The pass's logits on the device, [n_outputs, vocab], kept while a row that holds
    /// candidates may still be read whole ([`Outputs::fetch_rows`]).
    device_rows: Option<Tensor<2>>,
    /// The model's stream, which reads those rows.
    stream: DeviceStream,
}

#[derive(Debug, Clone, PartialEq)]
enum Row {
    /// Its logits, the k-th row of `logits`.
    Logits(usize),
    /// The index of its largest logit.
    Picked(u32),
    /// Its best candidates, its mass where it was asked for, and its watched tokens' logits.
    Top {
        /// Its range of `candidates`.
        candidates: Range<usize>,
        mass: Option<f32>,
        /// Its range of `watched`.
        watched: Range<usize>,
    },
}

impl Outputs {
    /// Rows of `vocab` logits, of a model whose device work goes to `stream`.
    pub(crate) fn new(vocab: usize, stream: DeviceStream) -> Self {
        Self { vocab, stream, ..Self::default() }
    }

    /// Replaces the contents: row `r` (batch index `rows[r]`) holds what `reads[r]` says, the
    /// rows read whole in order the rows of `logits`; `device_rows`: the pass's logits on the
    /// device, where a row may have to be read after all.
    pub(crate) fn set(&mut self, logits: &[f32], reads: &[Read], rows: &[usize], device_rows: Option<Tensor<2>>) {
        debug_assert_eq!(reads.len(), rows.len());
        debug_assert_eq!(logits.len(), reads.iter().filter(|r| **r == Read::Logits).count() * self.vocab);
        self.clear();
        self.logits.extend_from_slice(logits);
        self.rows.extend_from_slice(rows);
        let mut k = 0;
        for read in reads {
            let kind = match read {
                Read::Logits => {
                    k += 1;
                    Row::Logits(k - 1)
                }
                Read::Picked(token) => Row::Picked(*token),
                Read::Top(candidates, mass, watched) => {
                    let (from, watched_from) = (self.candidates.len(), self.watched.len());
                    self.candidates.extend_from_slice(candidates);
                    self.watched.extend_from_slice(watched);
                    Row::Top {
                        candidates: from..self.candidates.len(),
                        mass: *mass,
                        watched: watched_from..self.watched.len(),
                    }
                }
            };
            self.kinds.push(kind);
        }
        self.device_rows = device_rows;
    }

    pub(crate) fn clear(&mut self) {
        self.logits.clear();
        self.candidates.clear();
        self.watched.clear();
        self.rows.clear();
        self.kinds.clear();
        self.device_rows = None;
    }

    /// Number of output rows (the number of flagged tokens).
    pub fn n_outputs(&self) -> usize {
        self.rows.len()
    }
    /// \[n_outputs\] batch index of each row.
    pub fn output_ids(&self) -> &[usize] {
        &self.rows
    }
    /// The `row`-th row's logits (`None` past the rows, or for a row that holds less).
    pub fn row(&self, row: usize) -> Option<&[f32]> {
        match self.kinds.get(row)? {
            Row::Logits(k) => self.logits.get(k * self.vocab..(k + 1) * self.vocab),
            _ => None,
        }
    }
    /// The token picked for the `row`-th row, if it asked for only that ([`RowNeed::Best`]).
    pub fn picked(&self, row: usize) -> Option<u32> {
        match self.kinds.get(row)? {
            Row::Picked(token) => Some(*token),
            _ => None,
        }
    }
    /// The `row`-th row's best (token, logit) pairs, best first, if it asked for them
    /// ([`RowNeed::Top`]) and they were found on the device (fewer than asked where the row has
    /// fewer values that are neither NaN nor −∞).
    pub fn top(&self, row: usize) -> Option<&[(u32, f32)]> {
        match self.kinds.get(row)? {
            Row::Top { candidates, .. } => self.candidates.get(candidates.clone()),
            _ => None,
        }
    }
    /// The `row`-th row's probability mass at the temperature it was asked for, Σ exp((l −
    /// max) / t) over its logits, if it asked for it ([`RowNeed::Draw`]) and holds candidates.
    pub fn mass(&self, row: usize) -> Option<f32> {
        match self.kinds.get(row)? {
            Row::Top { mass, .. } => *mass,
            _ => None,
        }
    }
    /// The `row`-th row's (token, logit) pairs of the tokens it was asked to watch
    /// ([`RowAsk::watch`]), in the order asked, if it holds candidates (empty otherwise).
    pub fn watched(&self, row: usize) -> &[(u32, f32)] {
        match self.kinds.get(row) {
            Some(Row::Top { watched, .. }) => self.watched.get(watched.clone()).unwrap_or_default(),
            _ => &[],
        }
    }
    /// The `row`-th row's logits, read from the device now: for a row that holds candidates
    /// ([`RowNeed::Top`], [`RowNeed::Draw`]) whose sampler cannot choose among them
    /// ([`Sampler::sample_top`]). One readback; the row is on the device until the next pass.
    /// [`Outputs::fetch_rows`] reads several in one.
    ///
    /// [`Sampler::sample_top`]: crate::Sampler::sample_top
    pub fn fetch_row(&self, row: usize) -> Result<Vec<f32>, DecodeError> {
        let mut rows = self.fetch_rows(&[row])?;
        rows.pop().ok_or_else(|| DecodeError::Internal(format!("output row {row} was not read")))
    }
    /// The logits of each of `rows` (output rows, in that order, repeats allowed), as
    /// [`Outputs::fetch_row`] reads them, those not in host memory read from the device in one
    /// readback (with one upload of their indices where there are several): the rows of a
    /// step's sequences whose candidates could not decide, read together.
    pub fn fetch_rows(&self, rows: &[usize]) -> Result<Vec<Vec<f32>>, DecodeError> {
        let missing: Vec<usize> = rows.iter().copied().filter(|&r| self.row(r).is_none()).collect();
        let mut read = Vec::new();
        if let Some(&first) = missing.first() {
            let Some(logits) = self.device_rows.as_ref() else {
                return Err(DecodeError::Internal(format!("output row {first} is not on the device")));
            };
            if let Some(&past) = missing.iter().find(|&&r| r >= self.rows.len()) {
                return Err(DecodeError::Internal(format!("output row {past} is past the pass's {}", self.rows.len())));
            }
            let picked = || match missing[..] {
                [row] => logits.clone().slice([row..row + 1, 0..self.vocab]),
                _ => {
                    let ids: Vec<i64> = missing.iter().map(|&r| r as i64).collect();
                    let ids: Tensor<1, Int> =
                        crate::transfers::upload(TensorData::new(ids, [missing.len()]), &logits.device());
                    logits.clone().select(0, ids)
                }
            };
            read = self.stream.enter(|| crate::transfers::read::<2, _, f32>(picked())).map_err(unread)?;
        }
        let mut read = read.chunks_exact(self.vocab.max(1));
        rows.iter()
            .map(|&r| match self.row(r) {
                Some(logits) => Ok(logits.to_vec()),
                None => {
                    read.next().map(<[f32]>::to_vec).ok_or_else(|| DecodeError::Internal("logits rows missing".into()))
                }
            })
            .collect()
    }
    /// The logits of batch token `i`, if it was flagged (`llama_get_logits_ith`).
    pub fn logits_ith(&self, i: usize) -> Option<&[f32]> {
        self.rows.iter().position(|r| *r == i).and_then(|row| self.row(row))
    }
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

/// A readback of a pass's logits (or what was found of them) that failed.
pub(crate) fn unread(e: burn::tensor::TensorReadError) -> DecodeError {
    DecodeError::Internal(format!("reading logits: {e:?}"))
}

/// Index of the largest value (the first one on ties); `None` for an empty row.
pub fn argmax(row: &[f32]) -> Option<u32> {
    // Two passes that vectorize (the largest value, then where it first is) instead of one
    // branchy pass: the lm head's rows are 151,936 long.
    let max = crate::kernels::row_max(row);
    (!row.is_empty()).then(|| row.iter().position(|&v| v == max).unwrap_or(0) as u32)
}

/// The `k` largest values of `row` with their indices, best first, the smaller index first
/// among equal ones, NaN and −∞ left out (fewer than `k` where the row has fewer others): the
/// candidates a GPU's top-k kernel finds, here for a row in host memory. One pass that skips
/// 16 values at a time below the k-th best so far, in place of ranking the whole row.
pub fn top_logits(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let k = k.min(row.len());
    // Pruned back to k whenever it holds this many.
    let cap = 4 * k.max(16);
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(cap + 16);
    if k == 0 {
        return best;
    }
    // Every value kept is above the floor: once k are known, the k-th best of them (a later
    // equal value has a larger index, so it comes after them).
    let mut floor = f32::NEG_INFINITY;
    for (c, chunk) in row.chunks(16).enumerate() {
        if chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max) <= floor {
            continue;
        }
        for (i, &v) in chunk.iter().enumerate() {
            if v > floor {
                best.push(((c * 16 + i) as u32, v));
            }
        }
        if best.len() >= cap {
            best.select_nth_unstable_by(k - 1, order);
            best.truncate(k);
            floor = best[k - 1].1;
        }
    }
    best.sort_unstable_by(order);
    best.truncate(k);
    best
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
        let mut out = Outputs::new(2, DeviceStream::default());
        out.set(&[1.0, 2.0, 3.0, 4.0], &[Read::Logits, Read::Logits], &[0, 3], None);
        assert_eq!((out.n_outputs(), out.output_ids()), (2, &[0, 3][..]));
        assert_eq!(out.logits_ith(3), Some(&[3.0, 4.0][..]));
        assert_eq!(out.logits_ith(1), None);
        assert_eq!(out.row(2), None);
        assert_eq!(out.picked(0), None);
    }

    #[test]
    fn rows_hold_a_token_candidates_or_their_logits() {
        let mut out = Outputs::new(2, DeviceStream::default());
        let reads = [
            Read::Picked(1),
            Read::Top(vec![(1, 0.5), (0, 0.25)], None, vec![]),
            Read::Logits,
            Read::Picked(0),
            Read::Top(vec![], Some(2.5), vec![(1, 6.0), (0, 5.0)]),
        ];
        out.set(&[5.0, 6.0], &reads, &[0, 1, 2, 3, 4], None);
        assert_eq!((out.row(0), out.picked(0), out.top(0)), (None, Some(1), None));
        assert_eq!((out.row(1), out.picked(1), out.top(1)), (None, None, Some(&[(1, 0.5), (0, 0.25)][..])));
        assert_eq!((out.row(2), out.picked(2), out.top(2)), (Some(&[5.0, 6.0][..]), None, None));
        assert_eq!((out.row(3), out.picked(3)), (None, Some(0)));
        assert_eq!((out.top(4), out.mass(4), out.mass(1), out.mass(2)), (Some(&[][..]), Some(2.5), None, None));
        assert_eq!((out.watched(4), out.watched(1), out.watched(2)), (&[(1, 6.0), (0, 5.0)][..], &[][..], &[][..]));
        assert_eq!(out.fetch_row(2).unwrap(), [5.0, 6.0]);
        assert!(out.fetch_row(4).is_err(), "no logits on a device to read the row from");
        assert_eq!(out.fetch_rows(&[2, 2]).unwrap(), [[5.0, 6.0], [5.0, 6.0]]);
        assert!(out.fetch_rows(&[2, 1]).is_err(), "row 1 holds candidates and nothing is on a device");
        assert!(out.fetch_rows(&[]).unwrap().is_empty());
        assert_eq!(out.logits_ith(2), Some(&[5.0, 6.0][..]));
        out.set(&[1.0, 2.0], &[Read::Logits], &[4], None);
        assert_eq!((out.n_outputs(), out.picked(0), out.top(0), out.row(0)), (1, None, None, Some(&[1.0, 2.0][..])));
    }

    /// The host's top-k ranks as a sort of the whole row would, ties by index, NaN and −∞ out,
    /// over rows long enough to prune many times, rising rows (each chunk above the floor)
    /// and rows of few distinct values.
    #[test]
    fn top_logits_equal_a_sort_of_the_row() {
        let sorted = |row: &[f32], k: usize| {
            let mut all: Vec<(u32, f32)> =
                row.iter().enumerate().filter(|(_, v)| **v > f32::NEG_INFINITY).map(|(i, &v)| (i as u32, v)).collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            all.truncate(k);
            all
        };
        let mut noisy: Vec<f32> = crate::kernels::test_values(10_007, 4).iter().map(|v| v * 20.0).collect();
        noisy[3] = f32::NAN;
        noisy[9000] = f32::NAN;
        noisy[77] = f32::NEG_INFINITY;
        let rising: Vec<f32> = (0..5000).map(|i| i as f32 * 0.01).collect();
        let few: Vec<f32> = (0..3000u32).map(|i| (i * 7919 % 13) as f32).collect();
        let short = [1.0f32, f32::NAN, f32::NEG_INFINITY, 2.0];
        for row in [&noisy[..], &rising, &few, &short] {
            for k in [1, 2, 5, 20, 64, 500, 20_000] {
                assert_eq!(top_logits(row, k), sorted(row, k), "k {k}, row of {}", row.len());
            }
        }
        assert!(top_logits(&noisy, 0).is_empty());
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), Some(1));
        assert_eq!(argmax(&[]), None);
    }
}
