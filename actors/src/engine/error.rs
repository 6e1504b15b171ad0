//! Why the engine refused or failed a request.

use llaisys_model::DecodeError;
use llaisys_model::sampling::SamplingError;
use llaisys_model::tokenizer::TokenizerError;

use crate::host::RequestError;
use crate::scheduler::AdmissionError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("prompt {index}: {source}")]
    Admission { index: usize, source: AdmissionError },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Rejected(#[from] AdmissionError),
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// Every node is at its capacity and the front's queue is full (HTTP 429).
    #[error("overloaded: {0}")]
    Overloaded(String),
    #[error("the model '{name}' is not served; available: {available}")]
    UnknownModel { name: String, available: String },
    #[error("the model name '{0}' is already served")]
    DuplicateModel(String),
    #[error("invalid session id: {0}")]
    InvalidSession(String),
    #[error("the model's worker failed and could not be restarted: {0}")]
    WorkerLost(String),
    #[error("engine actor: {0}")]
    Actor(String),
    /// A request refused before it ran; `param` names the field at fault.
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("the engine has no tokenizer (it was started without one): give prompts as token ids")]
    NoTokenizer,
}
