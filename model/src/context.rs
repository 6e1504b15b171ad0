//! One model instance with its KV cache and output buffers (llama.cpp's `llama_context`): the
//! unit a worker owns. `decode` validates, places, runs and either commits a whole batch or
//! leaves the cache exactly as it was.

use crate::transfers;
use std::panic::{AssertUnwindSafe, catch_unwind};

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::batch::{Batch, Limits, validate};
use crate::error::DecodeError;
use crate::kv::{KvCache, KvDtype};
use crate::kv::{Pos, SeqId};
use crate::lm::{LanguageModel, ModelInfo, Pooling, Readout};
use crate::output::{Outputs, Read, RowAsk, RowNeed, argmax, argmax_rows, unread};
use crate::sampling::TOP_K_ON_DEVICE;

pub struct Context {
    model: Box<dyn LanguageModel>,
    cache: KvCache,
    outputs: Outputs,
}

impl Context {
    /// A context whose cache holds `kv_capacity` cells (tokens, summed over sequences; shared
    /// cells count once), in the device's default KV dtype.
    pub fn new(model: Box<dyn LanguageModel>, kv_capacity: usize) -> Self {
        let dtype = KvDtype::default_for(model.device());
        Self::with_kv_dtype(model, kv_capacity, dtype)
    }

    /// A context whose cache stores keys and values in `dtype`.
    pub fn with_kv_dtype(model: Box<dyn LanguageModel>, kv_capacity: usize, dtype: KvDtype) -> Self {
        let (info, stream) = (model.info(), model.stream());
        let cache = stream
            .enter(|| KvCache::with_dtype(model.kv_layout(), kv_capacity, info.context_length, model.device(), dtype));
        let outputs = Outputs::new(info.vocab_size, stream);
        Self { model, cache, outputs }
    }

    pub fn info(&self) -> &ModelInfo {
        self.model.info()
    }
    pub fn model(&self) -> &dyn LanguageModel {
        self.model.as_ref()
    }
    /// For replacing weight slots between forward passes.
    pub fn model_mut(&mut self) -> &mut dyn LanguageModel {
        self.model.as_mut()
    }
    /// An image's features, for a batch's [`crate::Embedded`] runs
    /// ([`LanguageModel::encode_image`]).
    pub fn encode_image(&self, image: &crate::Image) -> Result<crate::vision::Features, DecodeError> {
        self.model.encode_image(image)
    }
    pub fn kv(&self) -> &KvCache {
        &self.cache
    }
    /// Sequence operations (`seq_rm`, `seq_cp`, …) go through here.
    pub fn kv_mut(&mut self) -> &mut KvCache {
        &mut self.cache
    }
    /// The logits of the last successful `decode`.
    pub fn outputs(&self) -> &Outputs {
        &self.outputs
    }

    /// Runs one batch (C4/C5); see [`Context::decode_with_abort`].
    pub fn decode(&mut self, batch: &Batch) -> Result<(), DecodeError> {
        self.decode_with_abort(batch, &|| false)
    }

    /// Runs one batch. On success the outputs hold the flagged rows' logits. On any error
    /// (invalid input, no KV slot, abort, internal — a panic inside the backend included) the
    /// cache's cells are as before and the previous outputs are cleared.
    pub fn decode_with_abort(&mut self, batch: &Batch, abort: &dyn Fn() -> bool) -> Result<(), DecodeError> {
        self.decode_picking(batch, abort, &[])
    }

    /// Whether a pass's sampled rows can bring back less than their logits ([`RowAsk`]): on a
    /// GPU; on the CPU the rows are in memory, and read whole.
    pub fn finds_candidates(&self) -> bool {
        *self.model.device() != Device::flex()
    }

    /// Runs one batch as [`Context::decode_with_abort`] does, but output row `r` holds what
    /// `asks[r]` asks for (missing: [`RowNeed::Whole`]): its largest logit's index
    /// ([`Outputs::picked`]) or its best candidates ([`Outputs::top`]) with the logits of its
    /// watched tokens ([`Outputs::watched`]), found on the model's device, so that on a GPU
    /// only those come back, not rows of the vocabulary's size.
    pub fn decode_picking(
        &mut self,
        batch: &Batch,
        abort: &dyn Fn() -> bool,
        asks: &[RowAsk],
    ) -> Result<(), DecodeError> {
        self.outputs.clear();
        let info = self.model.info();
        let limits =
            Limits { vocab_size: info.vocab_size, hidden_size: info.hidden_size, context_length: info.context_length };
        let valid = validate(batch, self.cache.cells(), &limits)?;
        if let Some(t) = asks.iter().flat_map(|a| &a.watch).find(|t| **t as usize >= limits.vocab_size) {
            let msg = format!("watched token {t} is not below the vocabulary size {}", limits.vocab_size);
            return Err(DecodeError::InvalidInput(msg));
        }
        let placement = self
            .cache
            .cells()
            .find_slots(valid.len())
            .ok_or(DecodeError::NoKvSlot { needed: valid.len(), free: self.cache.cells().free() })?;
        if let Some(shifts) = self.cache.cells_mut().take_shifts() {
            self.model.shift_keys(&mut self.cache, &shifts);
        }
        self.cache.cells_mut().occupy(&placement, &valid.pos, &valid.seqs);
        let (model, cache) = (&self.model, &mut self.cache);
        let result = catch_unwind(AssertUnwindSafe(|| {
            model.stream().enter(|| read_rows(model.forward(&valid, &placement, cache, abort)?, asks))
        }))
        .unwrap_or_else(|panic| Err(DecodeError::Internal(panic_message(&panic))));
        match result {
            Ok((logits, reads, device_rows)) => {
                self.outputs.set(&logits, &reads, &valid.out_rows, device_rows);
                Ok(())
            }
            Err(e) => {
                self.cache.cells_mut().release(&placement);
                Err(e)
            }
        }
    }
}

/// Reads back a pass's logits, [n, vocab], each row `r` as `asks[r]` asks: on a GPU the
/// candidates of the rows that sample (with their masses where asked, and their watched
/// tokens' logits) found there, or without any, each row's best, then the rows wanted whole,
/// in order; on the CPU every row, the best of those that want only it picked here. The
/// logits tensor comes back too where a row with candidates may still have to be read whole.
fn read_rows(logits: Tensor<2>, asks: &[RowAsk]) -> Result<ReadRows, DecodeError> {
    let [n, vocab] = logits.dims();
    let need = |r: usize| asks.get(r).map(|a| a.need).unwrap_or_default();
    let mut reads = vec![Read::Logits; n];
    let device = logits.device();
    if device == Device::flex() {
        // On the CPU the rows are in memory already: pick there, keep the others (a sampler
        // selects its top-k from a row as fast as a kernel would).
        let mut all = transfers::read::<2, _, f32>(logits).map_err(unread)?;
        let mut kept = 0;
        for (r, read) in reads.iter_mut().enumerate() {
            let row = r * vocab..(r + 1) * vocab;
            match need(r) {
                RowNeed::Best => *read = Read::Picked(argmax(&all[row]).unwrap_or(0)),
                _ => {
                    all.copy_within(row, kept * vocab);
                    kept += 1;
                }
            }
        }
        all.truncate(kept * vocab);
        return Ok((all, reads, None));
    }
    let k = (0..n)
        .filter_map(|r| match need(r) {
            RowNeed::Top(k) => Some(k),
            RowNeed::Draw(_) => Some(TOP_K_ON_DEVICE),
            _ => None,
        })
        .max();
    // A temperature a row where some row wants its mass (0 for the others: no mass taken).
    let temps: Option<Vec<f32>> = (0..n)
        .any(|r| matches!(need(r), RowNeed::Draw(_)))
        .then(|| (0..n).map(|r| if let RowNeed::Draw(t) = need(r) { t } else { 0.0 }).collect());
    let mut device_rows = None;
    if let Some((k, top)) = k.and_then(|k| Some((k, crate::kernels::gpu_top_k(&logits, k, temps.as_deref())?))) {
        let width = k + usize::from(temps.is_some());
        // The watched tokens of the rows that take candidates, gathered there and read back
        // behind the candidates: one readback.
        let watch = |r: usize| match (need(r), asks.get(r)) {
            (RowNeed::Top(_) | RowNeed::Draw(_), Some(ask)) => &ask.watch[..],
            _ => &[],
        };
        let index: Vec<i64> =
            (0..n).flat_map(|r| watch(r).iter().map(move |&t| (r * vocab + t as usize) as i64)).collect();
        let top = top.reshape([n * width * 2]);
        let read = match index.len() {
            0 => top,
            len => {
                let index = transfers::upload::<1, Int>(TensorData::new(index, [len]), &device);
                Tensor::cat(vec![top, logits.clone().reshape([n * vocab]).select(0, index)], 0)
            }
        };
        let all = transfers::read::<1, _, f32>(read).map_err(unread)?;
        let (pairs, mut gathered) = all.split_at(n * width * 2);
        for (r, read) in reads.iter_mut().enumerate() {
            let row = &pairs[r * width * 2..(r + 1) * width * 2];
            // Past the row's values the index is 1e30: no token.
            let mut candidates = row[..k * 2]
                .chunks_exact(2)
                .filter(|pair| pair[1] < vocab as f32)
                .map(|pair| (pair[1] as u32, pair[0]));
            match need(r) {
                RowNeed::Best => *read = Read::Picked(candidates.next().map_or(0, |c| c.0)),
                RowNeed::Top(_) | RowNeed::Draw(_) => {
                    let (values, rest) = gathered.split_at(watch(r).len());
                    gathered = rest;
                    let watched = watch(r).iter().copied().zip(values.iter().copied()).collect();
                    *read = match need(r) {
                        RowNeed::Top(k) => Read::Top(candidates.take(k).collect(), None, watched),
                        _ => Read::Top(candidates.collect(), Some(row[k * 2]), watched),
                    };
                }
                RowNeed::Whole => {}
            }
        }
        // Kept for the rows whose draw falls past their candidates (`Outputs::fetch_row`).
        device_rows = Some(logits.clone());
    } else if (0..n).any(|r| need(r) == RowNeed::Best) {
        // Every row's pick (one id each to read back, where leaving out the rows that do not
        // want it would take an upload).
        let best = argmax_rows(&logits);
        for (r, token) in transfers::read::<1, _, i32>(best).map_err(unread)?.into_iter().enumerate() {
            if need(r) == RowNeed::Best {
                reads[r] = Read::Picked(token as u32);
            }
        }
    }
    // The rows wanted whole, and those that sample where no kernel found their candidates.
    let whole: Vec<i64> = (0..n).filter(|r| reads[*r] == Read::Logits).map(|r| r as i64).collect();
    let rows = match whole.len() {
        0 => Vec::new(),
        len if len == n => transfers::read(logits).map_err(unread)?,
        len => {
            let index = transfers::upload::<1, Int>(TensorData::new(whole, [len]), &device);
            transfers::read(logits.select(0, index)).map_err(unread)?
        }
    };
    Ok((rows, reads, device_rows))
}

/// What [`read_rows`] brings back: the rows read whole, what each row holds, and the pass's
/// logits where a row may still be read whole.
type ReadRows = (Vec<f32>, Vec<Read>, Option<Tensor<2>>);

impl Context {
    /// Runs `batch` for its final hidden states (embeddings): [n_outputs · hidden] f32, the
    /// flagged rows in order. The batch's keys and values go to a scratch f32 cache of its own size
    /// that is dropped after, so the context's cache, its cells and its outputs are untouched
    /// (no KV is kept; running sequences are not disturbed). Each sequence starts at position 0.
    pub fn embed(&self, batch: &Batch) -> Result<Vec<f32>, DecodeError> {
        self.scratch_pass(batch, false)
    }

    /// The pass of [`Context::embed`], for the flagged rows' hidden states or (`logits`) their
    /// logits, [n_outputs · vocab].
    fn scratch_pass(&self, batch: &Batch, logits: bool) -> Result<Vec<f32>, DecodeError> {
        let info = self.model.info();
        let limits =
            Limits { vocab_size: info.vocab_size, hidden_size: info.hidden_size, context_length: info.context_length };
        // In f32 whatever the context's own cache holds: the scratch lives for one pass, and
        // embeddings are compared to other runtimes' to many digits.
        let (layout, cells, device) = (self.model.kv_layout(), batch.len().max(1), self.model.device());
        let stream = self.model.stream();
        let mut scratch =
            stream.enter(|| KvCache::with_dtype(layout, cells, info.context_length, device, KvDtype::F32));
        let valid = validate(batch, scratch.cells(), &limits)?;
        let placement = scratch
            .cells()
            .find_slots(valid.len())
            .ok_or(DecodeError::NoKvSlot { needed: valid.len(), free: scratch.cells().free() })?;
        scratch.cells_mut().occupy(&placement, &valid.pos, &valid.seqs);
        let model = &self.model;
        catch_unwind(AssertUnwindSafe(|| {
            let rows = match logits {
                false => model.hidden(&valid, &placement, &mut scratch, &|| false)?,
                true => model.forward(&valid, &placement, &mut scratch, &|| false)?,
            };
            let read = stream.enter(|| transfers::read(rows));
            read.map_err(|e| DecodeError::Internal(format!("reading the outputs: {e:?}")))
        }))
        .unwrap_or_else(|panic| Err(DecodeError::Internal(panic_message(&panic))))
    }
}

impl Context {
    /// One embedding per input (token ids, each its own sequence from position 0), pooled from
    /// the final hidden states as `pooling` says, not normalised: `[inputs][hidden]`. The inputs
    /// run as one batch through a scratch cache (see [`Context::embed`]); at most
    /// [`crate::kv::MAX_SEQ`] of them.
    pub fn embeddings(&self, inputs: &[Vec<u32>], pooling: Pooling) -> Result<Vec<Vec<f32>>, DecodeError> {
        self.readouts(inputs, &Readout::Pooled(pooling))
    }

    /// What `readout` reads out of each input (token ids, each its own sequence from position
    /// 0), run as [`Context::embeddings`] runs them: a pooled embedding, or the logits of some
    /// tokens after the input's last token.
    pub fn readouts(&self, inputs: &[Vec<u32>], readout: &Readout) -> Result<Vec<Vec<f32>>, DecodeError> {
        let pooling = match readout {
            Readout::Pooled(pooling) => *pooling,
            Readout::Logits(_) => Pooling::Last,
        };
        if inputs.len() > crate::kv::MAX_SEQ {
            let msg = format!("{} inputs in one batch; at most {}", inputs.len(), crate::kv::MAX_SEQ);
            return Err(DecodeError::InvalidInput(msg));
        }
        let mut batch = Batch::new();
        for (seq, ids) in inputs.iter().enumerate() {
            if ids.is_empty() {
                return Err(DecodeError::InvalidInput(format!("input {seq} is empty")));
            }
            for (i, &t) in ids.iter().enumerate() {
                let wanted = pooling == Pooling::Mean || i + 1 == ids.len();
                batch.push(t, i as Pos, &[seq as SeqId], wanted);
            }
        }
        if let Readout::Logits(tokens) = readout {
            let vocab = self.info().vocab_size;
            if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(DecodeError::InvalidInput(format!("token {t} is outside the vocabulary ({vocab})")));
            }
            let rows = self.scratch_pass(&batch, true)?;
            return Ok(rows.chunks_exact(vocab).map(|row| tokens.iter().map(|&t| row[t as usize]).collect()).collect());
        }
        let hidden = self.info().hidden_size;
        let rows = self.embed(&batch)?;
        let mut rows = rows.chunks_exact(hidden);
        Ok(inputs
            .iter()
            .map(|ids| match pooling {
                Pooling::Last => rows.next().map_or_else(Vec::new, <[f32]>::to_vec),
                Pooling::Mean => {
                    let mut sum = vec![0f64; hidden];
                    for row in rows.by_ref().take(ids.len()) {
                        sum.iter_mut().zip(row).for_each(|(s, &v)| *s += f64::from(v));
                    }
                    sum.iter().map(|s| (s / ids.len() as f64) as f32).collect()
                }
            })
            .collect())
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("forward pass panicked: {msg}")
}
