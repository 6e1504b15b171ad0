//! C2: what every model type provides to the rest of the system. The engine and server see only
//! this trait (through [`crate::Context`]); they never name a model type.

use burn::tensor::{Device, Tensor, TensorData};

use crate::batch::ValidBatch;
use crate::error::{DecodeError, LoadError};
use crate::kv::{KvCache, KvLayout, Placement, Pos};

/// What callers need to know about a loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub model_type: &'static str,
    pub vocab_size: usize,
    /// Width of an embedding row (for batches given as embeddings).
    pub hidden_size: usize,
    /// Positions stay below this.
    pub context_length: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// A causal language model over a [`KvCache`]. Weights are immutable during a forward pass;
/// the cache lives outside the model.
pub trait LanguageModel: Send {
    fn info(&self) -> &ModelInfo;
    fn kv_layout(&self) -> KvLayout;
    fn device(&self) -> &Device;

    /// Runs one batch (C5). Writes the batch's keys and values into the placed cells (already
    /// occupied in the cache's metadata) and returns the logits of `batch.out_rows`:
    /// [n_outputs, vocab]. `abort` is polled between layers.
    fn forward(
        &self,
        batch: &ValidBatch<'_>,
        placement: &Placement,
        cache: &mut KvCache,
        abort: &dyn Fn() -> bool,
    ) -> Result<Tensor<2>, DecodeError>;

    /// Re-rotates cached keys after `seq_add`: `shifts` is \[extent\], the position delta of each
    /// cell (0 = unchanged).
    fn shift_keys(&self, cache: &mut KvCache, shifts: &[Pos]);

    /// Replaces the weight stored under checkpoint name `name`; the old tensor is released.
    fn replace_weight(&mut self, name: &str, data: TensorData) -> Result<(), LoadError>;
}
