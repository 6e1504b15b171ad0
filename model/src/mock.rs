//! C2: the `mock` model type, a tiny deterministic model for engine tests without weights. It
//! uses the KV cache like a real model: each token's id is written into its cell, and the next
//! token is a function of the ids of the cells the token can see and of its position. So
//! prefix sharing, sequence isolation and cancellation behave as with a real model.

use std::time::Duration;

use burn::tensor::{Device, Tensor, TensorData};

use crate::batch::{BatchInput, ValidBatch};
use crate::config::read_json;
use crate::error::{DecodeError, LoadError};
use crate::kernels::CellTable;
use crate::kv::{KvCache, KvLayout, Placement, Pos, SeqSet};
use crate::lm::{LanguageModel, ModelInfo};
use crate::registry::LoadOptions;
use crate::source::ModelSource;

/// Defaults when no directory is given: vocabulary 256, context 4096, eos 0.
pub struct Mock {
    info: ModelInfo,
    /// A batch containing this token fails with an internal error (fault injection).
    fail_on_token: Option<u32>,
    /// Each forward pass takes at least this long (a slow model, for cancellation tests).
    step_delay: Duration,
    device: Device,
}

/// The registry entry. With a directory, its `config.json` sets `vocab_size`,
/// `max_position_embeddings`, `eos_token_id` and optionally `fail_on_token` and
/// `step_delay_ms`.
pub fn load(
    source: Option<&ModelSource>,
    _opts: &LoadOptions,
    device: &Device,
) -> Result<Box<dyn LanguageModel>, LoadError> {
    let s = Settings::read(source)?;
    let mut mock = Mock::new(s.vocab, s.context, s.eos, s.fail_on_token, device);
    mock.step_delay = s.step_delay;
    Ok(Box::new(mock))
}

/// The registry's info entry: what `load` would report.
pub fn info(source: Option<&ModelSource>) -> Result<ModelInfo, LoadError> {
    let s = Settings::read(source)?;
    Ok(Mock::info_of(s.vocab, s.context, s.eos))
}

/// A mock's `config.json`.
struct Settings {
    vocab: usize,
    context: usize,
    eos: Vec<u32>,
    fail_on_token: Option<u32>,
    step_delay: Duration,
}

impl Settings {
    fn read(source: Option<&ModelSource>) -> Result<Self, LoadError> {
        let Some(source) = source else {
            return Ok(Self {
                vocab: 256,
                context: 4096,
                eos: vec![0],
                fail_on_token: None,
                step_delay: Duration::ZERO,
            });
        };
        let json = read_json(&source.path().join("config.json"))?;
        let num = |field: &str, default: usize| -> Result<usize, LoadError> {
            match json.get(field) {
                None => Ok(default),
                Some(v) => v.as_u64().map(|n| n as usize).filter(|n| *n > 0).ok_or_else(|| LoadError::Config {
                    field: field.into(),
                    reason: format!("expected a positive integer, found {v}"),
                }),
            }
        };
        let vocab = num("vocab_size", 256)?;
        let eos = num("eos_token_id", vocab)?; // default: no eos (out of the vocabulary)
        Ok(Self {
            vocab,
            context: num("max_position_embeddings", 4096)?,
            eos: if eos < vocab { vec![eos as u32] } else { vec![] },
            fail_on_token: json.get("fail_on_token").and_then(|v| v.as_u64()).map(|t| t as u32),
            step_delay: Duration::from_millis(json.get("step_delay_ms").and_then(|v| v.as_u64()).unwrap_or(0)),
        })
    }
}

impl Mock {
    pub fn new(vocab: usize, context: usize, eos: Vec<u32>, fail_on_token: Option<u32>, device: &Device) -> Self {
        let info = Self::info_of(vocab, context, eos);
        Self { info, fail_on_token, step_delay: Duration::ZERO, device: device.clone() }
    }

    fn info_of(vocab: usize, context: usize, eos: Vec<u32>) -> ModelInfo {
        ModelInfo {
            model_type: "mock",
            vocab_size: vocab,
            hidden_size: 1,
            context_length: context,
            bos_token_id: None,
            eos_token_ids: eos,
            pooling: crate::Pooling::Last,
            state_bytes: 0,
            vision: None,
        }
    }

    /// The next token after a token at `pos` that sees cells holding `visible` ids.
    pub fn next_token(visible: impl Iterator<Item = u32>, pos: Pos, vocab: usize) -> u32 {
        let sum = visible.fold(0u64, |acc, t| acc.wrapping_mul(31).wrapping_add(t as u64 + 1));
        ((sum.wrapping_add(pos as u64 * 7)) % vocab as u64) as u32
    }
}

impl LanguageModel for Mock {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn kv_layout(&self) -> KvLayout {
        KvLayout { layers: 1, kv_heads: 1, head_dim: 1, recurrent: None, values_are_keys: false }
    }
    fn device(&self) -> &Device {
        &self.device
    }

    fn forward(
        &self,
        batch: &ValidBatch<'_>,
        placement: &Placement,
        cache: &mut KvCache,
        abort: &dyn Fn() -> bool,
    ) -> Result<Tensor<2>, DecodeError> {
        let ids: Vec<f32> = match batch.input {
            BatchInput::Tokens(ids) => ids.iter().map(|&t| t as f32).collect(),
            BatchInput::Embeddings { values, .. } => values.iter().map(|v| v.abs().round()).collect(),
        };
        if let Some(bad) = self.fail_on_token.filter(|t| ids.contains(&(*t as f32))) {
            return Err(DecodeError::Internal(format!("mock model: injected fault on token {bad}")));
        }
        std::thread::sleep(self.step_delay);
        if abort() {
            return Err(DecodeError::Aborted);
        }
        let n = ids.len();
        let kv = Tensor::<3>::from_data(TensorData::new(ids, [1, n, 1]), &self.device);
        cache.write(0, &CellTable::new(placement.clone(), Vec::new(), &self.device), kv.clone(), kv);
        let extent = cache.cells().extent();
        let (keys, _) = cache.read(0, extent);
        let stored = keys.try_into_vec_as::<f32>().map_err(|e| DecodeError::Internal(format!("{e:?}")))?;
        let vocab = self.info.vocab_size;
        let mut logits = vec![0f32; batch.out_rows.len() * vocab];
        for (row, &b) in batch.out_rows.iter().enumerate() {
            let (seqs, pos): (&SeqSet, Pos) = (&batch.seqs[b], batch.pos[b]);
            let visible = (0..extent).filter(|&c| cache.cells().is_visible(c, seqs, pos)).map(|c| stored[c] as u32);
            let next = Mock::next_token(visible, pos, vocab) as usize;
            for (k, value) in [(0, 10.0), (1, 5.0), (2, 2.5)] {
                logits[row * vocab + (next + k) % vocab] = value;
            }
        }
        Ok(Tensor::from_data(TensorData::new(logits, [batch.out_rows.len(), vocab]), &self.device))
    }

    fn shift_keys(&self, _cache: &mut KvCache, _shifts: &[Pos]) {
        // The mock's keys are token ids: position-free, nothing to rotate.
    }

    fn replace_weight(&mut self, _name: &str, _data: TensorData) -> Result<(), LoadError> {
        Err(LoadError::NoWeights("mock"))
    }
}
