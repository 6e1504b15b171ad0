//! C2: what every model type provides to the rest of the system. The engine and server see only
//! this trait (through [`crate::Context`]); they never name a model type.

use burn::tensor::{Device, Tensor, TensorData};

use crate::batch::ValidBatch;
use crate::device::DeviceStream;
use crate::error::{DecodeError, LoadError};
use crate::kv::{KvCache, KvLayout, Placement, Pos};
use crate::vision::{Features, Image, VisionInfo};

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
    /// How its embeddings pool the final hidden states (the model's files say; else `Last`).
    pub pooling: Pooling,
    /// Bytes of one sequence's state in the linear-attention layers (Qwen3.5), each of its
    /// checkpoints as many; 0 for a model without. Such a state goes back only to a checkpoint:
    /// a sequence reuses another's cache whole or up to one, and never speculates.
    pub state_bytes: usize,
    /// How to send it images, where it sees them ([`LanguageModel::encode_image`]).
    pub vision: Option<VisionInfo>,
}

/// How a sequence's final hidden states become one embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The last token's (decoder embedding models: Qwen3-Embedding, gte-Qwen2, e5-mistral).
    #[default]
    Last,
    /// The mean over the tokens.
    Mean,
}

/// What a prefill-only pass reads out of each input.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Readout {
    /// Its final hidden states, pooled: an embedding, `[hidden]`.
    Pooled(Pooling),
    /// The logits of these tokens after its last token (a yes/no reranker's verdict),
    /// `[tokens]`. The caller checked that they are in the vocabulary.
    Logits(Vec<u32>),
}

impl Pooling {
    /// From its name (`last`, `mean`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "last" => Some(Self::Last),
            "mean" => Some(Self::Mean),
            _ => None,
        }
    }
}

/// A causal language model over a [`KvCache`]. Weights are immutable during a forward pass;
/// the cache lives outside the model.
pub trait LanguageModel: Send {
    fn info(&self) -> &ModelInfo;
    fn kv_layout(&self) -> KvLayout;
    fn device(&self) -> &Device;
    /// The device stream the model's work goes to ([`DeviceStream`]): its own on a GPU, where
    /// it enters the stream in each call, and its [`Context`](crate::Context) around the rest
    /// (the KV cache, reading outputs back). None by default.
    fn stream(&self) -> DeviceStream {
        DeviceStream::default()
    }

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

    /// Runs one batch as `forward` does but returns the final hidden states of
    /// `batch.out_rows` (after the last norm, before the output projection): [n_outputs,
    /// hidden], what embeddings are pooled from. A model without them says so.
    fn hidden(
        &self,
        batch: &ValidBatch<'_>,
        placement: &Placement,
        cache: &mut KvCache,
        abort: &dyn Fn() -> bool,
    ) -> Result<Tensor<2>, DecodeError> {
        let _ = (batch, placement, cache, abort);
        Err(DecodeError::InvalidInput("this model gives no hidden states (embeddings)".into()))
    }

    /// An image's features ([`Image::tokens`] rows of `hidden_size`, and the deepstack's): what a
    /// batch gives in place of its image tokens' embeddings ([`crate::Batch::embedded`]). A model
    /// that sees no images says so.
    fn encode_image(&self, image: &Image) -> Result<Features, DecodeError> {
        let _ = image;
        Err(DecodeError::InvalidInput("this model takes text only, not images".into()))
    }

    /// Re-rotates cached keys after `seq_add`: `shifts` is \[extent\], the position delta of each
    /// cell (0 = unchanged).
    fn shift_keys(&self, cache: &mut KvCache, shifts: &[Pos]);

    /// Replaces the weight stored under checkpoint name `name` (either naming) with values as
    /// the checkpoint the model was loaded from holds them (a Qwen3.5 GGUF file's linear
    /// attention in llama.cpp's layout, its norms with 1 added); the old tensor is released.
    fn replace_weight(&mut self, name: &str, data: TensorData) -> Result<(), LoadError>;
}
