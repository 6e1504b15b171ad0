//! E9: the handle a host application holds. `Engine::start` runs inside the host's tokio
//! runtime; clones of the handle share one engine; several engines can live in one process.
//! When the last clone is dropped the engine's actors stop (requests still running end with
//! `abort`); `shutdown` drains them first.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use llaisys_model::{Constraint, Device, Guidance, LanguageModel, LoadError, ModelInfo, Readout, Tokenizer};
use ractor::{Actor, ActorRef};
use tokio::sync::mpsc::unbounded_channel;
use tokio::sync::watch;

use super::config::EngineConfig;
use super::error::{EngineError, WorkerLoss};
use super::event::EventStream;
use super::stats::{EngineStats, LOCAL_NODE, ReplicaStats};
use crate::cluster::{FrontParts, ToFront};
use crate::host::{
    ChatRequest, CompletionRequest, EmbedRequest, Embeddings, EngineBuilder, Frontend, GenerateRequest, Generation,
    ModelText, RequestError, RequestLimits, RerankRequest, Scores, ValidRequest,
};
use crate::placement::{PlacementConfig, PlacerActor, PlacerArgs, Target, ToPlacer};
use crate::request::{FinishReason, RequestId};
use crate::scheduler::{IdSpace, ReplicaLoad, SchedulerActor, SchedulerArgs, Submission, ToScheduler, load_off_thread};
use crate::session::SessionInfo;
use crate::worker::read_out;

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

/// An engine's replicas in this process; when the last handle goes, so do their actors.
struct Local {
    replicas: Vec<Replica>,
    /// Picks each request's replica when there are several.
    placer: Option<ActorRef<ToPlacer>>,
    /// Embedding batches go to the replicas in turn.
    next_embed: AtomicUsize,
}

impl Drop for Local {
    fn drop(&mut self) {
        for r in &self.replicas {
            r.scheduler.stop(None);
        }
        if let Some(placer) = &self.placer {
            placer.stop(None);
        }
    }
}

/// The cloneable handle to one engine: one replica of the model per device (D2), each a
/// scheduler with its worker and KV cache; with several, a placer actor picks one per request.
/// A cluster's front (N2) is an engine too, whose requests its router sends to nodes.
#[derive(Clone)]
pub struct Engine {
    route: Route,
    /// The model's sizes, text side and request limits: where requests are checked.
    frontend: Arc<Frontend>,
    /// Unix time (seconds) the engine started.
    started_at: u64,
}

/// Where an engine's requests run.
#[derive(Clone)]
enum Route {
    /// On this process's replicas.
    Local(Arc<Local>),
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
        let text = tokenizer.map(ModelText::plain);
        Self::spawn(vec![(model, spec)], text, RequestLimits::default(), config, PlacementConfig::default()).await
    }

    /// Starts the actors with a model from `loader`, which is called again to replace a worker
    /// that failed.
    pub async fn start_with_loader(
        loader: ModelLoader,
        tokenizer: Option<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        Self::start_with_text(loader, tokenizer.map(ModelText::plain), config, None).await
    }

    /// Starts the actors with a model from `loader` and the model's text side; speculating
    /// requests' proposals come from the model `draft` loads, if given (it must share the
    /// model's vocabulary: `EngineBuilder::draft_model` checks).
    pub async fn start_with_text(
        loader: ModelLoader,
        text: Option<ModelText>,
        config: EngineConfig,
        draft: Option<ModelLoader>,
    ) -> Result<Self, EngineError> {
        let model = load(&loader, "its device").await?;
        let spec = ReplicaSpec { device: device_label(model.device()), loader, draft };
        Self::spawn(vec![(model, spec)], text, RequestLimits::default(), config, PlacementConfig::default()).await
    }

    /// Starts one replica per spec (the model loaded on each device in turn), placed by
    /// `placement` when there are several.
    pub async fn start_replicas(
        replicas: Vec<ReplicaSpec>,
        text: Option<ModelText>,
        config: EngineConfig,
        placement: PlacementConfig,
    ) -> Result<Self, EngineError> {
        Self::start_limited(replicas, text, RequestLimits::default(), config, placement).await
    }

    /// As `start_replicas`, checking requests against `limits`.
    pub(crate) async fn start_limited(
        replicas: Vec<ReplicaSpec>,
        text: Option<ModelText>,
        limits: RequestLimits,
        config: EngineConfig,
        placement: PlacementConfig,
    ) -> Result<Self, EngineError> {
        if replicas.is_empty() {
            return Err(EngineError::NoReplica);
        }
        let mut loaded = Vec::with_capacity(replicas.len());
        for spec in replicas {
            loaded.push((load(&spec.loader, &spec.device).await?, spec));
        }
        Self::spawn(loaded, text, limits, config, placement).await
    }

    async fn spawn(
        replicas: Vec<(Box<dyn LanguageModel>, ReplicaSpec)>,
        text: Option<ModelText>,
        limits: RequestLimits,
        config: EngineConfig,
        placement: PlacementConfig,
    ) -> Result<Self, EngineError> {
        let info = replicas[0].0.info().clone();
        let frontend = Frontend::new(info, text, limits, Some(config.kv_capacity));
        let tokenizer = frontend.shared_tokenizer();
        let stride = replicas.len() as u64;
        let mut local = Local { replicas: Vec::new(), placer: None, next_embed: AtomicUsize::new(0) };
        let mut targets = Vec::new();
        for (i, (model, spec)) in replicas.into_iter().enumerate() {
            let (load, watched) = watch::channel(ReplicaLoad { available: true, ..ReplicaLoad::default() });
            let args = SchedulerArgs {
                model,
                loader: spec.loader,
                draft: spec.draft,
                tokenizer: tokenizer.clone(),
                config,
                device: spec.device.clone(),
                ids: IdSpace { first: i as u64, stride },
                load,
            };
            // On an error `local` drops, stopping the replicas started so far.
            let (scheduler, _) =
                Actor::spawn(None, SchedulerActor, args).await.map_err(|e| EngineError::WorkerLost {
                    device: spec.device.clone(),
                    restart: false,
                    cause: WorkerLoss::Spawn(e.to_string()),
                })?;
            targets.push(Target { scheduler: scheduler.clone(), load: watched });
            local.replicas.push(Replica { scheduler, device: spec.device });
        }
        if local.replicas.len() > 1 {
            let args = PlacerArgs { targets, config: placement };
            let (placer, _) = Actor::spawn(None, PlacerActor, args)
                .await
                .map_err(|e| EngineError::Spawn { actor: "placer", reason: e.to_string() })?;
            local.placer = Some(placer);
        }
        Ok(Self { route: Route::Local(Arc::new(local)), frontend: Arc::new(frontend), started_at: unix_now() })
    }

    /// An engine checking requests with `frontend` whose requests a cluster's front routes to
    /// its nodes.
    pub(crate) fn routed(frontend: Arc<Frontend>, front: Arc<FrontParts>) -> Self {
        Self { route: Route::Cluster(front), frontend, started_at: unix_now() }
    }

    /// Unix time (seconds) the engine started (OpenAI's `created` of a model).
    pub fn started_at(&self) -> u64 {
        self.started_at
    }

    /// Whether requests run on a cluster's nodes.
    pub fn is_cluster_front(&self) -> bool {
        matches!(self.route, Route::Cluster(_))
    }

    /// What the engine's model is (vocabulary, context length, eos ids).
    pub fn info(&self) -> &ModelInfo {
        self.frontend.info()
    }

    /// Where requests are checked: the model's sizes, text side and request limits.
    pub fn frontend(&self) -> &Arc<Frontend> {
        &self.frontend
    }

    /// The model's tokenizer, if the engine has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.frontend.tokenizer()
    }

    /// Compiles a constraint for `GenerateParams::guidance` (T4: token-level requests take the
    /// same constraints as chats and completions).
    pub fn guidance(&self, constraint: &Constraint) -> Result<Guidance, EngineError> {
        self.frontend.guidance(constraint)
    }

    /// Checks a chat request and renders its prompt, without running it.
    pub fn prepare_chat(&self, request: &ChatRequest) -> Result<ValidRequest, EngineError> {
        self.frontend.chat(request)
    }

    /// Checks a completion request and encodes its prompts, without running it.
    pub fn prepare_completion(&self, request: &CompletionRequest) -> Result<ValidRequest, EngineError> {
        self.frontend.completion(request)
    }

    /// Runs a chat: the stream of its choices' events.
    pub async fn chat(&self, request: ChatRequest) -> Result<Generation, EngineError> {
        self.submit(self.prepare_chat(&request)?).await
    }

    /// Runs a completion: the stream of its choices' events.
    pub async fn complete(&self, request: CompletionRequest) -> Result<Generation, EngineError> {
        self.submit(self.prepare_completion(&request)?).await
    }

    /// Queues every choice of a checked request. If one is refused, those already queued are
    /// cancelled (their streams dropped). A request checked by another engine is refused.
    pub async fn submit(&self, request: ValidRequest) -> Result<Generation, EngineError> {
        if request.checked_by != self.frontend.id() {
            return Err(
                RequestError::general("the request was checked for another engine: prepare it with this one").into()
            );
        }
        let mut streams = Vec::with_capacity(request.prompts().len() * request.n());
        for choice in request.choices() {
            let (tx, rx) = unbounded_channel();
            let submission = |reply| Submission { choice: Box::new(choice), events: tx, reply };
            let id = match &self.route {
                Route::Local(local) => match &local.placer {
                    Some(placer) => ractor::call!(placer, |r| ToPlacer::Submit(submission(r))).ok(),
                    None => ractor::call!(local.replicas[0].scheduler, |r| ToScheduler::Submit(submission(r))).ok(),
                },
                Route::Cluster(c) => ractor::call!(c.front, |r| ToFront::Submit(submission(r))).ok(),
            }
            .ok_or_else(|| self.stopped())??;
            streams.push(EventStream::new(id, rx));
        }
        Ok(Generation::new(streams, request))
    }

    /// Embeds each input of `request` (see [`EmbedRequest`]): checked here, then run on a
    /// worker between its steps in passes of at most 2,048 tokens (so long requests do not
    /// stall the decoding ones for long; short ones share a pass with other requests' inputs),
    /// pooled, truncated and normalised.
    pub async fn embed(&self, request: &EmbedRequest) -> Result<Embeddings, EngineError> {
        let valid = self.frontend.embedding(request)?;
        let pooled = self.read_out(valid.inputs(), Readout::Pooled(valid.pooling)).await?;
        Ok(valid.finish(pooled))
    }

    /// Scores each document of `request` against its query with a yes/no reranker (see
    /// [`RerankRequest`]; `Frontend::rerank` refuses other models): its judging prompts run as
    /// embeddings do.
    pub async fn rerank(&self, request: &RerankRequest) -> Result<Scores, EngineError> {
        let valid = self.frontend.rerank(request)?;
        let readout = Readout::Logits(vec![valid.judge.no, valid.judge.yes]);
        let logits = self.read_out(valid.inputs(), readout).await?;
        Ok(valid.finish(logits))
    }

    /// What `readout` reads out of each of `inputs` (checked), as prefill-only work on the
    /// workers, or on a cluster's nodes (the front sends the whole list to one node, which
    /// batches it as here).
    pub(crate) async fn read_out(&self, inputs: &[Vec<u32>], readout: Readout) -> Result<Vec<Vec<f32>>, EngineError> {
        let local = match &self.route {
            Route::Local(local) => local,
            Route::Cluster(parts) => {
                let inputs = inputs.to_vec();
                let result = ractor::call!(parts.front, |reply| ToFront::ReadOut { inputs, readout, reply });
                return result.map_err(|_| self.stopped())?;
            }
        };
        let mut pooled = Vec::with_capacity(inputs.len());
        let mut batch: Vec<Vec<u32>> = Vec::new();
        let mut tokens = 0;
        let inputs = inputs.iter();
        for input in inputs.map(Some).chain([None]) {
            let full = input.is_some_and(|i| !read_out::has_room(batch.len(), tokens, i.len()));
            if (full || input.is_none()) && !batch.is_empty() {
                let i = local.next_embed.fetch_add(1, Ordering::Relaxed) % local.replicas.len();
                let inputs = std::mem::take(&mut batch);
                let scheduler = &local.replicas[i].scheduler;
                let readout = readout.clone();
                let result = ractor::call!(scheduler, |reply| ToScheduler::Embed { inputs, readout, reply });
                pooled.extend(result.map_err(|_| self.stopped())??);
                tokens = 0;
            }
            if let Some(i) = input {
                tokens += i.len();
                batch.push(i.clone());
            }
        }
        Ok(pooled)
    }

    /// Checks and queues a request of token ids; returns its event stream.
    pub async fn generate(&self, request: GenerateRequest) -> Result<EventStream, EngineError> {
        let generation = self.submit(self.frontend.generate(request)?).await?;
        Ok(generation.into_streams().pop().expect("a token-level request has one choice"))
    }

    /// The actor a failed call could not reach.
    fn stopped(&self) -> EngineError {
        let actor = match &self.route {
            Route::Local(local) if local.placer.is_some() => "placer",
            Route::Local(_) => "scheduler",
            Route::Cluster(_) => "cluster front",
        };
        EngineError::Stopped { actor }
    }

    /// Cancels a request; it ends with `FinishReason::Abort` at the next step. Returns whether
    /// the request was still running or waiting.
    pub async fn cancel(&self, id: RequestId) -> bool {
        match &self.route {
            Route::Local(local) => {
                let replica = &local.replicas[(id % local.replicas.len() as u64) as usize];
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
        let local = match &self.route {
            Route::Local(local) => local,
            Route::Cluster(c) => return ractor::call!(c.front, ToFront::Stats).map_err(|_| self.stopped()),
        };
        let mut all = Vec::with_capacity(local.replicas.len());
        for r in &local.replicas {
            let stats = ractor::call!(r.scheduler, ToScheduler::Stats).map_err(|_| self.stopped())?;
            all.push(ReplicaStats { node: LOCAL_NODE.into(), device: r.device.clone(), stats });
        }
        Ok(all)
    }

    /// The live sessions of every replica (or node), by id.
    pub async fn sessions(&self) -> Result<Vec<SessionInfo>, EngineError> {
        let local = match &self.route {
            Route::Local(local) => local,
            Route::Cluster(c) => return ractor::call!(c.front, ToFront::Sessions).map_err(|_| self.stopped()),
        };
        let mut all = Vec::new();
        for r in &local.replicas {
            all.extend(ractor::call!(r.scheduler, ToScheduler::Sessions).map_err(|_| self.stopped())?);
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }

    /// Ends a session and frees its cells. Returns whether it existed.
    pub async fn delete_session(&self, id: &str) -> Result<bool, EngineError> {
        let local = match &self.route {
            Route::Local(local) => local,
            Route::Cluster(c) => {
                return ractor::call!(c.front, |reply| ToFront::DeleteSession { id: id.into(), reply })
                    .map_err(|_| self.stopped());
            }
        };
        if let Some(placer) = &local.placer {
            let _ = placer.send_message(ToPlacer::ForgetSession(id.into()));
        }
        let mut existed = false;
        for r in &local.replicas {
            existed |= ractor::call!(r.scheduler, |reply| ToScheduler::DeleteSession { id: id.into(), reply })
                .map_err(|_| self.stopped())?;
        }
        Ok(existed)
    }

    /// Refuses new requests, waits for every request to finish, then stops the actors.
    pub async fn shutdown(&self) {
        let local = match &self.route {
            Route::Local(local) => local,
            Route::Cluster(c) => return c.shutdown().await,
        };
        for r in &local.replicas {
            let _ = ractor::call!(r.scheduler, ToScheduler::Shutdown);
            r.scheduler.stop(None);
        }
        if let Some(placer) = &local.placer {
            placer.stop(None);
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Loads a model off the async threads, for `Engine`'s start.
async fn load(loader: &ModelLoader, device: &str) -> Result<Box<dyn LanguageModel>, EngineError> {
    load_off_thread(loader).await.map_err(|cause| EngineError::WorkerLost {
        device: device.into(),
        restart: false,
        cause,
    })
}

/// A device's name for stats and metrics when the caller gave none: `cpu` for Burn's CPU
/// backend, else the backend's own description.
fn device_label(device: &Device) -> String {
    match *device == Device::flex() {
        true => "cpu".into(),
        false => format!("{device:?}"),
    }
}
