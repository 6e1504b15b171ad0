//! Why the engine refused or failed a request: one enum for the whole engine, each variant
//! typed by its cause, with a stable label for logs and metrics (`error_type`).

use std::sync::Arc;

use llaisys_model::tokenizer::TokenizerError;
use llaisys_model::{DecodeError, GrammarError, LoadError};

use crate::host::RequestError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// The request is at fault; `param` names the field (checked before it ran).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The engine was started without a tokenizer: it takes token ids only.
    #[error("the engine has no tokenizer (it was started without one): give prompts as token ids")]
    NoTokenizer,
    #[error("the model '{name}' is not served; available: {}", available.join(", "))]
    UnknownModel { name: String, available: Vec<String> },
    #[error("the model name '{name}' is already served")]
    DuplicateModel { name: String },
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// Every node of a cluster is at its capacity and the front's queue is full.
    #[error("overloaded: every node ({nodes}) is at its capacity and the front's queue ({queued}) is full")]
    Overloaded { nodes: usize, queued: usize },
    /// A replica's worker could not be started (at the engine's start) or replaced.
    #[error("the model's worker on {device} {}: {cause}", if *.restart { "failed and could not be restarted" } else { "could not be started" })]
    WorkerLost { device: String, restart: bool, cause: WorkerLoss },
    /// Every replica is shutting down or lost its worker.
    #[error("no replica of the model takes requests")]
    NoReplica,
    /// A cluster's node failed the request, or left before it started.
    #[error("node '{node}': {reason}")]
    Node { node: String, reason: NodeFailure },
    /// An actor of the engine is gone (the engine was stopped).
    #[error("the engine's {actor} is not running")]
    Stopped { actor: &'static str },
    /// An actor of the engine could not be started.
    #[error("starting the engine's {actor}: {reason}")]
    Spawn { actor: &'static str, reason: String },
    /// The model's grammar compiler could not be built (constraints and tools need it).
    #[error("constrained decoding is unavailable for this model: {0}")]
    Grammar(GrammarError),
    /// A step of the offline engine failed.
    #[error(transparent)]
    Step(#[from] DecodeError),
    /// The offline engine could not decode its output.
    #[error("decoding the output: {0}")]
    Detokenize(#[from] TokenizerError),
}

/// Why a worker could not be (re)started.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WorkerLoss {
    #[error("loading the model: {0}")]
    Load(Arc<LoadError>),
    #[error("loading the draft model: {0}")]
    LoadDraft(Arc<LoadError>),
    /// The loader panicked or its thread was cancelled.
    #[error("the loader did not finish: {0}")]
    LoaderFailed(String),
    /// Its actor could not be spawned.
    #[error("starting its actor: {0}")]
    Spawn(String),
}

/// How a cluster's node failed a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NodeFailure {
    /// It left the cluster (its connection closed or its heartbeat stopped) before the request
    /// streamed anything, and it could not run elsewhere.
    #[error("it left the cluster")]
    Left,
    /// It refused the request for a reason of its own (not the request's fault).
    #[error("{error_type}: {message}")]
    Refused { error_type: String, message: String },
}

impl EngineError {
    /// A stable label for logs and metrics.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Request(_) => "invalid_request",
            Self::NoTokenizer => "no_tokenizer",
            Self::UnknownModel { .. } => "unknown_model",
            Self::DuplicateModel { .. } => "duplicate_model",
            Self::ShuttingDown => "shutting_down",
            Self::Overloaded { .. } => "overloaded",
            Self::WorkerLost { .. } => "worker_lost",
            Self::NoReplica => "no_replica",
            Self::Node { .. } => "node_failed",
            Self::Stopped { .. } => "engine_stopped",
            Self::Spawn { .. } => "spawn_failed",
            Self::Grammar(_) => "grammar_unavailable",
            Self::Step(_) => "step_failed",
            Self::Detokenize(_) => "detokenize_failed",
        }
    }

    /// Whether the request is at fault (the rest are the engine's or the deployment's).
    pub fn is_client_error(&self) -> bool {
        matches!(self, Self::Request(_) | Self::NoTokenizer | Self::UnknownModel { .. })
    }
}
