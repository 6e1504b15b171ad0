//! The model core's errors (C8): loading errors and forward-pass results. Nothing here panics
//! on bad input; every failure is one of these values and names what was wrong.

use std::path::PathBuf;

/// Why a model, its weights or its tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {reason}")]
    Json { path: PathBuf, reason: String },
    #[error("config field `{field}`: {reason}")]
    Config { field: String, reason: String },
    #[error("unknown model type `{name}`; known types: {known}")]
    UnknownModelType { name: String, known: String },
    #[error("model type `{name}` needs {needs}, which llaisys does not implement yet; served types: {known}")]
    UnsupportedArchitecture { name: String, needs: &'static str, known: String },
    #[error("safetensors file {path}: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("missing tensors: {}", .0.join(", "))]
    MissingTensors(Vec<String>),
    #[error("unexpected tensors: {}", .0.join(", "))]
    UnexpectedTensors(Vec<String>),
    #[error("tensor `{name}` appears in more than one shard")]
    DuplicateTensor { name: String },
    #[error("slot {slot}{}: expected shape {expected:?}, found {found:?}", layer_suffix(*.layer))]
    Shape { slot: &'static str, layer: Option<usize>, expected: Vec<usize>, found: Vec<usize> },
    #[error(
        "tensor `{tensor}` (slot {slot}{}): type {dtype} does not load ({})",
        layer_suffix(*.layer),
        crate::quant::loadable_types()
    )]
    Dtype { tensor: String, slot: &'static str, layer: Option<usize>, dtype: String },
    #[error("tensor `{name}`: {reason}")]
    Tensor { name: String, reason: String },
    #[error("GGUF file {path}: {reason}")]
    Gguf { path: PathBuf, reason: String },
    #[error("{path} is not a model: {reason}")]
    NotAModel { path: PathBuf, reason: String },
    #[error("no weight slot named `{0}`")]
    UnknownSlot(String),
    #[error("model type `{0}` has no weights to replace")]
    NoWeights(&'static str),
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("model type `{model_type}` needs a model (a directory or a GGUF file)")]
    NeedsDirectory { model_type: &'static str },
    #[error("the model was given as an instance, without a loader: it cannot be loaded again")]
    NoLoader,
    #[error("adapter {path}: {reason}")]
    Adapter { path: PathBuf, reason: String },
}

impl LoadError {
    /// A short label for logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Io { .. } => "io",
            Self::Json { .. } | Self::Config { .. } => "config",
            Self::UnknownModelType { .. }
            | Self::UnsupportedArchitecture { .. }
            | Self::NeedsDirectory { .. }
            | Self::NotAModel { .. } => "model_type",
            Self::Safetensors { .. } | Self::Gguf { .. } => "file_format",
            Self::MissingTensors(_)
            | Self::UnexpectedTensors(_)
            | Self::DuplicateTensor { .. }
            | Self::Shape { .. }
            | Self::Dtype { .. }
            | Self::Tensor { .. } => "weights",
            Self::UnknownSlot(_) | Self::NoWeights(_) => "slot",
            Self::Tokenizer { .. } => "tokenizer",
            Self::NoLoader => "no_loader",
            Self::Adapter { .. } => "adapter",
        }
    }
}

fn layer_suffix(layer: Option<usize>) -> String {
    layer.map(|l| format!(" of layer {l}")).unwrap_or_default()
}

/// The result of a failed forward pass. A failed pass leaves the KV cache exactly as before.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The cache has fewer free cells than the batch has tokens; the caller decides what to evict.
    #[error("no KV slot: the batch needs {needed} cells, {free} are free")]
    NoKvSlot { needed: usize, free: usize },
    /// The abort check returned true between layers.
    #[error("forward pass aborted")]
    Aborted,
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl DecodeError {
    /// A short label for logs and metrics.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::NoKvSlot { .. } => "no_kv_slot",
            Self::Aborted => "aborted",
            Self::InvalidInput(_) => "invalid_input",
            Self::Internal(_) => "internal",
        }
    }
}

/// Result of a KV-cache sequence operation (C6); `Ok(())` is the OK status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("out of KV slots")]
    OutOfSlots,
    #[error("invalid sequence id")]
    InvalidSeq,
    #[error("invalid position")]
    InvalidPos,
    #[error("empty position range")]
    EmptyRange,
    #[error("internal KV cache error")]
    Internal,
    /// Part of a linear-attention layer's state: it holds a sequence's tokens all together, and
    /// goes back only to a checkpoint.
    #[error("a linear-attention state cannot be cut back or copied in part except to a checkpoint, nor shifted")]
    PartialState,
}

/// The numeric status codes of the original C interface: 0 OK, 1 OUT_OF_SLOTS, 2 INVALID_SEQ,
/// 3 INVALID_POS, 4 EMPTY_RANGE, 5 INTERNAL; and 6 PARTIAL_STATE (llaisys's own).
pub fn kv_status_code(result: Result<(), KvError>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(KvError::OutOfSlots) => 1,
        Err(KvError::InvalidSeq) => 2,
        Err(KvError::InvalidPos) => 3,
        Err(KvError::EmptyRange) => 4,
        Err(KvError::Internal) => 5,
        Err(KvError::PartialState) => 6,
    }
}
