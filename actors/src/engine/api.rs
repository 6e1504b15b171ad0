//! E9: the handle a host application holds. `Engine::start` runs inside the host's tokio
//! runtime; clones of the handle share one engine; several engines can live in one process.

use std::sync::Arc;

use llaisys_model::{Constraint, Device, Guidance, LanguageModel, LoadError, ModelInfo, Tokenizer};
use ractor::{Actor, ActorRef};
use tokio::sync::mpsc::unbounded_channel;
use tokio::sync::watch;

use super::config::EngineConfig;
use super::error::EngineError;
use super::event::EventStream;
use super::stats::{EngineStats, LOCAL_NODE, ReplicaStats};
use crate::cluster::{FrontParts, ToFront};
use crate::host::{ChatRequest, CompletionRequest, EngineBuilder, Frontend, GenerateRequest, Generation, Prepared};
use crate::placement::{PlacementConfig, PlacerActor, PlacerArgs, Target, ToPlacer};
use crate::request::{FinishReason, RequestId};
use crate::scheduler::{IdSpace, ReplicaLoad, SchedulerActor, SchedulerArgs, Submission, ToScheduler, load_off_thread};
use crate::session::SessionInfo;

/// Loads an instance of the model: at start, and again when a failed worker is replaced.
pub type ModelLoader = Arc<dyn Fn() -> Result<Box<dyn LanguageModel>, LoadError> + Send + Sync>;

/// A replica to start: the device it runs on, and how to load the model (and the draft model)
/// there. Loaders are called at start and again to replace a failed worker.
#[derive(Clone)]
pub struct ReplicaSpec {
    pub device: String,
    pub loader: ModelLoader,
    pub draft: Option<ModelLoader>,
}

/// A started replica: its scheduler actor (which supervises its worker) and its device.
struct Replica {
    scheduler: ActorRef<ToScheduler>,
    device: String,
}

/// The cloneable handle to one engine: one replica of the model per device (D2), each a
/// scheduler with its worker and KV cache; with several, a placer actor picks one per request.
/// A cluster's front (N2) is an engine too, whose requests its router sends to nodes.
#[derive(Clone)]
pub struct Engine {
    route: Route,
    info: Arc<ModelInfo>,
    /// The model's text side (absent when started without a tokenizer).
    frontend: Option<Arc<Frontend>>,
}

/// A model's info and text side (tokenizer, chat template, defaults and limits) without its
/// weights: what a cluster's router-only front serves the API with
/// (`EngineBuilder::build_text`, or `Engine::text`).
#[derive(Clone)]
pub struct ModelText {
    pub(crate) info: Arc<ModelInfo>,
    pub(crate) frontend: Option<Arc<Frontend>>,
}

impl ModelText {
    pub(crate) fn new(info: ModelInfo, frontend: Option<Frontend>) -> Self {
        Self { info: Arc::new(info), frontend: frontend.map(Arc::new) }
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }
}

/// Where an engine's requests run.
#[derive(Clone)]
enum Route {
    /// On this process's replicas.
    Local { replicas: Arc<[Replica]>, placer: Option<ActorRef<ToPlacer>> },
    /// On a cluster's nodes, through the front's router.
    Cluster(Arc<FrontParts>),
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
        let spec = ReplicaSpec { device: device_label(model.device()), loader, draft: None };
        Self::spawn(vec![(model, spec)], tokenizer.map(Frontend::plain), config, PlacementConfig::default()).await
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
        let model = load(&loader).await?;
        let device = device_label(model.device());
        let spec = ReplicaSpec { device, loader, draft };
        Self::spawn(vec![(model, spec)], frontend, config, PlacementConfig::default()).await
    }

    /// Starts one replica per spec (the model loaded on each device in turn), placed by
    /// `placement` when there are several.
    pub async fn start_replicas(
        replicas: Vec<ReplicaSpec>,
        frontend: Option<Frontend>,
        config: EngineConfig,
        placement: PlacementConfig,
    ) -> Result<Self, EngineError> {
        if replicas.is_empty() {
            return Err(EngineError::Actor("an engine needs at least one replica".into()));
        }
        let mut loaded = Vec::with_capacity(replicas.len());
        for spec in replicas {
            let model = load(&spec.loader).await.map_err(|e| match e {
                EngineError::WorkerLost(why) => EngineError::WorkerLost(format!("{why} (device {})", spec.device)),
                e => e,
            })?;
            loaded.push((model, spec));
        }
        Self::spawn(loaded, frontend, config, placement).await
    }

    async fn spawn(
        replicas: Vec<(Box<dyn LanguageModel>, ReplicaSpec)>,
        frontend: Option<Frontend>,
        config: EngineConfig,
        placement: PlacementConfig,
    ) -> Result<Self, EngineError> {
        let info = Arc::new(replicas[0].0.info().clone());
        let tokenizer = frontend.as_ref().map(Frontend::shared_tokenizer);
        let stride = replicas.len() as u64;
        let (mut started, mut targets) = (Vec::new(), Vec::new());
        for (i, (model, spec)) in replicas.into_iter().enumerate() {
            let (load, watched) = watch::channel(ReplicaLoad { available: true, ..ReplicaLoad::default() });
            let args = SchedulerArgs {
                model,
                loader: spec.loader,
                draft: spec.draft,
                tokenizer: tokenizer.clone(),
                config,
                ids: IdSpace { first: i as u64, stride },
                load,
            };
            let (scheduler, _) = match Actor::spawn(None, SchedulerActor, args).await {
                Ok(spawned) => spawned,
                Err(e) => {
                    started.iter().for_each(|r: &Replica| r.scheduler.stop(None));
                    return Err(actor_error(e));
                }
            };
            targets.push(Target { scheduler: scheduler.clone(), load: watched });
            started.push(Replica { scheduler, device: spec.device });
        }
        let placer = match started.len() {
            1 => None,
            _ => {
                let args = PlacerArgs { targets, config: placement };
                let spawned = Actor::spawn(None, PlacerActor, args).await;
                Some(spawned.map_err(actor_error)?.0)
            }
        };
        let route = Route::Local { replicas: started.into(), placer };
        Ok(Self { route, info, frontend: frontend.map(Arc::new) })
    }

    /// An engine over `text` whose requests a cluster's front routes to its nodes.
    pub(crate) fn routed(text: ModelText, front: Arc<FrontParts>) -> Self {
        Self { route: Route::Cluster(front), info: text.info, frontend: text.frontend }
    }

    /// The model's info and text side, without the engine's replicas.
    pub fn text(&self) -> ModelText {
        ModelText { info: self.info.clone(), frontend: self.frontend.clone() }
    }

    /// Whether requests run on a cluster's nodes.
    pub fn is_cluster_front(&self) -> bool {
        matches!(self.route, Route::Cluster(_))
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
        let request = Box::new(request);
        let submission = |reply| Submission { request, events: tx, reply };
        let id = match &self.route {
            Route::Local { placer: Some(placer), .. } => {
                ractor::call!(placer, |r| ToPlacer::Submit(submission(r))).map_err(actor_error)?
            }
            Route::Local { replicas, .. } => {
                ractor::call!(replicas[0].scheduler, |r| ToScheduler::Submit(submission(r))).map_err(actor_error)?
            }
            Route::Cluster(c) => ractor::call!(c.front, |r| ToFront::Submit(submission(r))).map_err(actor_error)?,
        }?;
        Ok(EventStream::new(id, rx))
    }

    /// Cancels a request; it ends with `FinishReason::Abort` at the next step. Returns whether
    /// the request was still running or waiting.
    pub async fn cancel(&self, id: RequestId) -> bool {
        match &self.route {
            Route::Local { replicas, .. } => {
                let replica = &replicas[(id % replicas.len() as u64) as usize];
                ractor::call!(replica.scheduler, |reply| ToScheduler::Finish {
                    id,
                    reason: FinishReason::Abort,
                    reply: Some(reply)
                })
                .unwrap_or(false)
            }
            Route::Cluster(c) => ractor::call!(c.front, |reply| ToFront::Cancel { id, reply }).unwrap_or(false),
        }
    }

    /// The whole engine's figures: every replica's added up.
    pub async fn stats(&self) -> Result<EngineStats, EngineError> {
        let mut total = EngineStats::default();
        for replica in self.replica_stats().await? {
            total.add(&replica.stats);
        }
        Ok(total)
    }

    /// Each replica's figures, in `--device` order (a cluster's front: every node's, from their
    /// last reports).
    pub async fn replica_stats(&self) -> Result<Vec<ReplicaStats>, EngineError> {
        let replicas = match &self.route {
            Route::Local { replicas, .. } => replicas,
            Route::Cluster(c) => return ractor::call!(c.front, ToFront::Stats).map_err(actor_error),
        };
        let mut all = Vec::with_capacity(replicas.len());
        for r in replicas.iter() {
            let stats = ractor::call!(r.scheduler, ToScheduler::Stats).map_err(actor_error)?;
            all.push(ReplicaStats { node: LOCAL_NODE.into(), device: r.device.clone(), stats });
        }
        Ok(all)
    }

    /// The live sessions of every replica (or node), by id.
    pub async fn sessions(&self) -> Result<Vec<SessionInfo>, EngineError> {
        let replicas = match &self.route {
            Route::Local { replicas, .. } => replicas,
            Route::Cluster(c) => return ractor::call!(c.front, ToFront::Sessions).map_err(actor_error),
        };
        let mut all = Vec::new();
        for r in replicas.iter() {
            all.extend(ractor::call!(r.scheduler, ToScheduler::Sessions).map_err(actor_error)?);
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }

    /// Ends a session and frees its cells. Returns whether it existed.
    pub async fn delete_session(&self, id: &str) -> Result<bool, EngineError> {
        let (replicas, placer) = match &self.route {
            Route::Local { replicas, placer } => (replicas, placer),
            Route::Cluster(c) => {
                return ractor::call!(c.front, |reply| ToFront::DeleteSession { id: id.into(), reply })
                    .map_err(actor_error);
            }
        };
        if let Some(placer) = placer {
            let _ = placer.send_message(ToPlacer::ForgetSession(id.into()));
        }
        let mut existed = false;
        for r in replicas.iter() {
            existed |= ractor::call!(r.scheduler, |reply| ToScheduler::DeleteSession { id: id.into(), reply })
                .map_err(actor_error)?;
        }
        Ok(existed)
    }

    /// Refuses new requests, waits for every request to finish, then stops the actors.
    pub async fn shutdown(&self) {
        let (replicas, placer) = match &self.route {
            Route::Local { replicas, placer } => (replicas, placer),
            Route::Cluster(c) => return c.shutdown().await,
        };
        for r in replicas.iter() {
            let _ = ractor::call!(r.scheduler, ToScheduler::Shutdown);
            r.scheduler.stop(None);
        }
        if let Some(placer) = placer {
            placer.stop(None);
        }
    }
}

fn actor_error<E: std::fmt::Display>(e: E) -> EngineError {
    EngineError::Actor(e.to_string())
}

/// Loads a model off the async threads, for `Engine`'s start.
async fn load(loader: &ModelLoader) -> Result<Box<dyn LanguageModel>, EngineError> {
    load_off_thread(loader).await.map_err(|e| EngineError::WorkerLost(format!("loading the model: {e}")))
}

/// A device's name for stats and metrics when the caller gave none: `cpu` for Burn's CPU
/// backend, else the backend's own description.
fn device_label(device: &Device) -> String {
    match *device == Device::flex() {
        true => "cpu".into(),
        false => format!("{device:?}"),
    }
}
