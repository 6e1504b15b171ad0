//! E9: the handle a host application holds. `Engine::start` runs inside the host's tokio
//! runtime; clones of the handle share one engine; several engines can live in one process.

use std::sync::Arc;
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use llaisys_model::{Constraint, Guidance, LanguageModel, LoadError, ModelInfo, Tokenizer};
use ractor::{Actor, ActorRef};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::messages::ToScheduler;
use super::scheduler_actor::{SchedulerActor, SchedulerArgs};
use super::session_actor::SessionInfo;
use crate::host::{ChatRequest, CompletionRequest, EngineBuilder, Frontend, Generation, Prepared};
use crate::llm::{EngineConfig, EngineError, GenerateParams};
use crate::request::ToolCallDelta;
use crate::request::{FinishReason, RequestId};

/// Loads an instance of the model: at start, and again when a failed worker is replaced.
pub type ModelLoader = Arc<dyn Fn() -> Result<Box<dyn LanguageModel>, LoadError> + Send + Sync>;

/// A request: prompt token ids and what to generate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// The conversation this request continues (E6): its cells stay pinned after it ends, so
    /// the next request of the session computes only its new tokens.
    pub session: Option<String>,
}

impl GenerateRequest {
    pub fn new(prompt: Vec<u32>, params: GenerateParams) -> Self {
        Self { prompt, params, session: None }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens reused from the cache (prefix reuse or the session) instead of computed.
    pub cached_tokens: usize,
}

/// What a request's stream yields: tokens as they come, then exactly one `Finished`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token {
        token: u32,
        /// Text this token completes (empty while a character or a possible stop string is
        /// incomplete; always empty without a tokenizer).
        text: String,
        logprob: f32,
        top_logprobs: Vec<(u32, f32)>,
        /// How long this token's grammar mask took (constrained requests only).
        mask_time: Option<Duration>,
        /// T3: the piece of a tool call this token completes (its `text` is then empty).
        tool_call: Option<ToolCallDelta>,
    },
    Finished {
        reason: FinishReason,
        /// Text held back until the end (the rest of an incomplete character or stop prefix).
        text: String,
        usage: Usage,
        /// Time from arrival to first admission (`None` if it never ran).
        queue_time: Option<Duration>,
    },
}

/// A request's events (also a `futures::Stream`). Dropping it cancels the request.
pub struct EventStream {
    pub id: RequestId,
    rx: UnboundedReceiver<Event>,
}

impl EventStream {
    /// The next event; `None` after `Finished`.
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
}

impl Stream for EventStream {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}

/// A snapshot of the engine's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_cells_used: usize,
    pub kv_capacity: usize,
    /// Cells kept for prefix reuse (included in `kv_cells_used`).
    pub kv_cells_cached: usize,
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache, and how many were found.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub finished: FinishCounts,
    /// Live sessions.
    pub sessions: usize,
    /// Times a failed worker was replaced.
    pub worker_restarts: u64,
    pub speculative: SpeculativeStats,
}

/// Speculative decoding's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpeculativeStats {
    /// Who proposes: `ngram` (prompt lookup) or `draft` (a draft model).
    pub proposer: &'static str,
    /// Tokens proposed, and how many of them were accepted.
    pub proposed: u64,
    pub accepted: u64,
}

impl SpeculativeStats {
    pub fn rejected(&self) -> u64 {
        self.proposed - self.accepted
    }
}

/// Requests finished so far, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FinishCounts {
    pub stop: u64,
    pub length: u64,
    pub abort: u64,
    pub error: u64,
}

impl FinishCounts {
    pub fn total(&self) -> u64 {
        self.stop + self.length + self.abort + self.error
    }

    pub(super) fn count(&mut self, reason: FinishReason) {
        *match reason {
            FinishReason::Stop | FinishReason::ToolCalls => &mut self.stop,
            FinishReason::Length => &mut self.length,
            FinishReason::Abort => &mut self.abort,
            FinishReason::Error => &mut self.error,
        } += 1;
    }
}

/// The cloneable handle to one engine.
#[derive(Clone)]
pub struct Engine {
    scheduler: ActorRef<ToScheduler>,
    info: Arc<ModelInfo>,
    /// The model's text side (absent when started without a tokenizer).
    frontend: Option<Arc<Frontend>>,
}

impl Engine {
    /// Settings to load a model and start an engine over it: the usual way to make one.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Starts the actors for one model instance in the current tokio runtime. Without a
    /// loader the engine cannot replace a failed worker; it then refuses further requests.
    /// A tokenizer alone gives completions but no chat (no template).
    pub async fn start(
        model: Box<dyn LanguageModel>,
        tokenizer: Option<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let loader: ModelLoader = Arc::new(|| Err(LoadError::NoLoader));
        Self::spawn(model, loader, tokenizer.map(Frontend::plain), config, None).await
    }

    /// Starts the actors with a model from `loader`, which is called again to replace a worker
    /// that failed.
    pub async fn start_with_loader(
        loader: ModelLoader,
        tokenizer: Option<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        Self::start_with_frontend(loader, tokenizer.map(Frontend::plain), config).await
    }

    /// Starts the actors with a model from `loader` and the model's text side.
    pub async fn start_with_frontend(
        loader: ModelLoader,
        frontend: Option<Frontend>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        Self::start_with_draft(loader, frontend, config, None).await
    }

    /// As `start_with_frontend`, with speculating requests' proposals from the model `draft`
    /// loads (it must share the model's vocabulary: `EngineBuilder::draft_model` checks).
    pub async fn start_with_draft(
        loader: ModelLoader,
        frontend: Option<Frontend>,
        config: EngineConfig,
        draft: Option<ModelLoader>,
    ) -> Result<Self, EngineError> {
        let load = loader.clone();
        let model = tokio::task::spawn_blocking(move || load())
            .await
            .map_err(|e| EngineError::Actor(e.to_string()))?
            .map_err(|e| EngineError::WorkerLost(format!("loading the model: {e}")))?;
        Self::spawn(model, loader, frontend, config, draft).await
    }

    async fn spawn(
        model: Box<dyn LanguageModel>,
        loader: ModelLoader,
        frontend: Option<Frontend>,
        config: EngineConfig,
        draft: Option<ModelLoader>,
    ) -> Result<Self, EngineError> {
        let info = Arc::new(model.info().clone());
        let tokenizer = frontend.as_ref().map(Frontend::shared_tokenizer);
        let args = SchedulerArgs { model, loader, draft, tokenizer, config };
        let (scheduler, _) =
            Actor::spawn(None, SchedulerActor, args).await.map_err(|e| EngineError::Actor(e.to_string()))?;
        Ok(Self { scheduler, info, frontend: frontend.map(Arc::new) })
    }

    /// What the engine's model is (vocabulary, context length, eos ids).
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The model's text side: tokenizer, chat template, defaults and request limits.
    pub fn frontend(&self) -> Result<&Frontend, EngineError> {
        self.frontend.as_deref().ok_or(EngineError::NoTokenizer)
    }

    /// The model's tokenizer, if the engine has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.frontend.as_deref().map(Frontend::tokenizer)
    }

    /// Compiles a constraint for `GenerateParams::guidance` (T4: token-level requests take the
    /// same constraints as chats and completions).
    pub fn guidance(&self, constraint: &Constraint) -> Result<Guidance, EngineError> {
        Ok(self.frontend()?.guidance(constraint, &self.info)?)
    }

    /// Checks a chat request and renders its prompt, without running it.
    pub fn prepare_chat(&self, request: &ChatRequest) -> Result<Prepared, EngineError> {
        Ok(self.frontend()?.prepare_chat(request, &self.info)?)
    }

    /// Checks a completion request and encodes its prompts, without running it.
    pub fn prepare_completion(&self, request: &CompletionRequest) -> Result<Prepared, EngineError> {
        Ok(self.frontend()?.prepare_completion(request, &self.info)?)
    }

    /// Runs a chat: the stream of its choices' events.
    pub async fn chat(&self, request: ChatRequest) -> Result<Generation, EngineError> {
        self.submit(self.prepare_chat(&request)?).await
    }

    /// Runs a completion: the stream of its choices' events.
    pub async fn complete(&self, request: CompletionRequest) -> Result<Generation, EngineError> {
        self.submit(self.prepare_completion(&request)?).await
    }

    /// Queues every choice of a prepared request. If one is refused, those already queued are
    /// cancelled (their streams dropped).
    pub async fn submit(&self, prepared: Prepared) -> Result<Generation, EngineError> {
        let mut streams = Vec::with_capacity(prepared.prompts.len() * prepared.n);
        for (prompt, params) in prepared.choices() {
            // Only the first choice continues the session: one conversation, one pin.
            let session = if streams.is_empty() { prepared.session.clone() } else { None };
            streams.push(self.generate(GenerateRequest { prompt: prompt.clone(), params, session }).await?);
        }
        Ok(Generation::new(streams, prepared.prompts, prepared.n, prepared.logprobs))
    }

    /// Queues a request and returns its event stream.
    pub async fn generate(&self, request: GenerateRequest) -> Result<EventStream, EngineError> {
        let (tx, rx) = unbounded_channel();
        let id = ractor::call!(self.scheduler, |reply| ToScheduler::Submit {
            request: Box::new(request),
            events: tx,
            reply
        })
        .map_err(|e| EngineError::Actor(e.to_string()))??;
        Ok(EventStream { id, rx })
    }

    /// Cancels a request; it ends with `FinishReason::Abort` at the next step. Returns whether
    /// the request was still running or waiting.
    pub async fn cancel(&self, id: RequestId) -> bool {
        ractor::call!(self.scheduler, |reply| ToScheduler::Finish {
            id,
            reason: FinishReason::Abort,
            reply: Some(reply)
        })
        .unwrap_or(false)
    }

    pub async fn stats(&self) -> Result<EngineStats, EngineError> {
        ractor::call!(self.scheduler, ToScheduler::Stats).map_err(|e| EngineError::Actor(e.to_string()))
    }

    /// The live sessions, by id.
    pub async fn sessions(&self) -> Result<Vec<SessionInfo>, EngineError> {
        ractor::call!(self.scheduler, ToScheduler::Sessions).map_err(|e| EngineError::Actor(e.to_string()))
    }

    /// Ends a session and frees its cells. Returns whether it existed.
    pub async fn delete_session(&self, id: &str) -> Result<bool, EngineError> {
        ractor::call!(self.scheduler, |reply| ToScheduler::DeleteSession { id: id.into(), reply })
            .map_err(|e| EngineError::Actor(e.to_string()))
    }

    /// Refuses new requests, waits for every request to finish, then stops the actors.
    pub async fn shutdown(&self) {
        let _ = ractor::call!(self.scheduler, ToScheduler::Shutdown);
        self.scheduler.stop(None);
    }
}
