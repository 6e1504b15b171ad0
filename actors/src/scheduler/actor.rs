//! The scheduler actor: owns the scheduling policy, the table of live requests and the session
//! actors, and supervises the worker. One step is in flight at a time: schedule → the worker
//! runs it → postprocess (tokens to request actors, finished requests ended) → schedule again.
//!
//! Supervision: when the worker fails (a panic or an internal error in the forward pass), the
//! requests of the batch it was running end with an error; every other request is kept and,
//! since the cache died with the worker, recomputed on a new worker with a freshly loaded model.

use std::collections::HashMap;
use std::sync::Arc;

use llaisys_model::{KvDtype, LanguageModel, Sampler, Tokenizer};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use super::messages::{ReplicaLoad, Retry, Submission, ToScheduler};
use super::policy::{Finished, Scheduler};
use super::sequence::Sequence;
use crate::engine::{
    EngineConfig, EngineError, EngineStats, Event, FinishCounts, ModelLoader, SpeculativeStats, WorkerLoss,
};
use crate::host::{GenerateParams, ValidChoice};
use crate::request::{FinishReason, RequestActor, RequestArgs, RequestId, ToRequest};
use crate::session::{SessionActor, SessionArgs, ToSession};
use crate::speculative::{DraftModelProposer, NgramProposer};
use crate::worker::{Executor, Lane, ToWorker, WorkerActor, WorkerArgs, outcomes};

pub struct SchedulerActor;

pub struct SchedulerArgs {
    /// The first instance of the model, and how to load another when the worker is restarted.
    pub model: Box<dyn LanguageModel>,
    pub loader: ModelLoader,
    /// Loads the draft model that proposes tokens for speculating requests, if there is one.
    pub draft: Option<ModelLoader>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub config: EngineConfig,
    /// The device it runs on, for errors.
    pub device: String,
    /// This replica's request ids: `first`, `first + stride`, ... (ids are unique across an
    /// engine's replicas, and `id % stride` names the replica).
    pub ids: IdSpace,
    /// Where the replica's load is published (for the placer).
    pub load: watch::Sender<ReplicaLoad>,
}

/// A replica's share of request ids.
#[derive(Debug, Clone, Copy)]
pub struct IdSpace {
    pub first: RequestId,
    pub stride: RequestId,
}

/// A request the engine is serving.
struct Live {
    actor: ActorRef<ToRequest>,
    /// A clone of the client's channel, to notice a dropped stream even before the first token.
    events: UnboundedSender<Event>,
    /// Its checked parameters (shared with its sequence), to give it a new sampler if the worker
    /// is restarted.
    params: Arc<GenerateParams>,
    speculating: bool,
    /// Its prompt and session, kept when its answer may be started over
    /// (`GenerateParams::text_retry`), even after its first attempt finished.
    origin: Option<(Vec<u32>, Option<String>)>,
}

pub struct SchedulerState {
    scheduler: Scheduler,
    worker: ActorRef<ToWorker>,
    loader: ModelLoader,
    draft: Option<ModelLoader>,
    /// Why the worker could not be restarted; the engine then refuses requests.
    worker_lost: Option<WorkerLoss>,
    worker_restarts: u64,
    /// Answers started over (`restart`).
    text_call_retries: u64,
    requests: HashMap<RequestId, Live>,
    sessions: HashMap<String, ActorRef<ToSession>>,
    tokenizer: Option<Arc<Tokenizer>>,
    config: EngineConfig,
    /// The device it runs on, for errors.
    device: String,
    next_id: RequestId,
    id_stride: RequestId,
    load: watch::Sender<ReplicaLoad>,
    /// Submissions received (published in the load).
    received: u64,
    /// The requests of the step the worker is running.
    in_flight: Option<Vec<RequestId>>,
    /// KV cells in use after the worker's last step (the worker reports it with each step).
    kv_cells_used: usize,
    /// The worker's KV cache: its dtype and bytes (as of the last step).
    kv_memory: (KvDtype, usize),
    /// `Engine::stats` callers that asked while a step was in flight.
    stats_waiting: Vec<RpcReplyPort<EngineStats>>,
    /// Restarts asked for while their request was in the step in flight: made once it is in,
    /// so that the prompt's cells are kept.
    retries: Vec<Retry>,
    shutting_down: bool,
    shutdown_waiters: Vec<RpcReplyPort<()>>,
    finished: FinishCounts,
}

impl Actor for SchedulerActor {
    type Msg = ToScheduler;
    type State = SchedulerState;
    type Arguments = SchedulerArgs;

    async fn pre_start(
        &self,
        me: ActorRef<ToScheduler>,
        args: SchedulerArgs,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        let (context_length, state_bytes) = (args.model.info().context_length, args.model.info().state_bytes);
        let draft = match &args.draft {
            Some(load) => Some(load_draft(load).await?),
            None => None,
        };
        let (worker, kv_memory) = spawn_worker(&me, args.model, draft, &args.config).await?;
        let scheduler = Scheduler::new(args.config, context_length).with_states(state_bytes);
        Ok(SchedulerState {
            scheduler,
            worker,
            loader: args.loader,
            draft: args.draft,
            worker_lost: None,
            worker_restarts: 0,
            text_call_retries: 0,
            requests: HashMap::new(),
            sessions: HashMap::new(),
            tokenizer: args.tokenizer,
            config: args.config,
            device: args.device,
            next_id: args.ids.first,
            id_stride: args.ids.stride.max(1),
            load: args.load,
            received: 0,
            in_flight: None,
            kv_cells_used: 0,
            kv_memory,
            stats_waiting: Vec::new(),
            retries: Vec::new(),
            shutting_down: false,
            shutdown_waiters: Vec::new(),
            finished: FinishCounts::default(),
        })
    }

    /// Stopped (the engine's last handle dropped, or after `shutdown`): requests still live end
    /// with `abort`, so every stream gets its finish.
    async fn post_stop(&self, _: ActorRef<ToScheduler>, state: &mut SchedulerState) -> Result<(), ActorProcessingErr> {
        let ids: Vec<RequestId> = state.requests.keys().copied().collect();
        let aborted = ids.iter().filter_map(|id| state.scheduler.finish_request(*id, FinishReason::Abort)).collect();
        state.end(aborted);
        state.worker.stop(None);
        for session in state.sessions.values() {
            session.stop(None);
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        me: ActorRef<ToScheduler>,
        event: SupervisionEvent,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        let failure = match event {
            SupervisionEvent::ActorFailed(who, err) if who.get_id() == state.worker.get_id() => err.to_string(),
            SupervisionEvent::ActorTerminated(who, _, reason) if who.get_id() == state.worker.get_id() => {
                reason.unwrap_or_else(|| "the worker stopped".into())
            }
            // Session actors stop when the scheduler ends them; nothing else is linked.
            _ => return Ok(()),
        };
        state.restart_worker(&me, failure).await;
        state.step();
        state.publish_load();
        Ok(())
    }

    async fn handle(
        &self,
        me: ActorRef<ToScheduler>,
        msg: ToScheduler,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ToScheduler::Submit(Submission { choice, events, reply }) => {
                state.received += 1;
                let result = state.submit(&me, *choice, events).await;
                let _ = reply.send(result);
            }
            ToScheduler::StepDone { plan, result, elapsed, kv_used, kv_bytes } => {
                state.in_flight = None;
                state.kv_cells_used = kv_used;
                state.kv_memory.1 = kv_bytes;
                let finished = match result {
                    Ok(outputs) => {
                        let outcomes = outcomes(&outputs);
                        state.scheduler.record_step(&plan, &outcomes, elapsed);
                        for (item, output) in plan.items.iter().zip(outputs) {
                            if let Some(live) = state.requests.get(&item.id) {
                                if !output.prompt_logprobs.is_empty() {
                                    let _ = live.actor.send_message(ToRequest::PromptLogprobs(output.prompt_logprobs));
                                }
                                for s in output.sampled {
                                    let _ = live.actor.send_message(ToRequest::Token(s));
                                }
                            }
                        }
                        state.scheduler.postprocess(&plan, &outcomes)
                    }
                    Err(e) => {
                        // Invalid input for the model: only the requests of this batch fail.
                        tracing::error!(error = %e, requests = plan.items.len(), "step failed");
                        plan.items
                            .iter()
                            .filter_map(|i| state.scheduler.finish_request(i.id, FinishReason::Error))
                            .collect()
                    }
                };
                // A request whose actor asked to start it over while this step ran is not ended,
                // even if its first attempt just finished (a call's closing brace is often
                // followed by the end of the turn).
                let retries = std::mem::take(&mut state.retries);
                let again = |f: &Finished| f.reason != FinishReason::Error && retries.iter().any(|r| r.id == f.id);
                state.end(finished.into_iter().filter(|f| !again(f)).collect());
                for retry in retries {
                    state.restart(retry);
                }
                state.answer_stats();
            }
            ToScheduler::Retry(retry) => {
                if state.in_flight.as_ref().is_some_and(|ids| ids.contains(&retry.id)) {
                    state.retries.push(retry);
                } else {
                    state.restart(retry);
                }
            }
            ToScheduler::Finish { id, reason, reply } => {
                let finished = state.scheduler.finish_request(id, reason);
                if let Some(reply) = reply {
                    let _ = reply.send(finished.is_some());
                }
                state.end(finished.into_iter().collect());
            }
            ToScheduler::Stats(reply) => match state.in_flight {
                // The KV figure comes with the step's result: answer when it is in.
                Some(_) => state.stats_waiting.push(reply),
                None => {
                    let _ = reply.send(state.stats());
                }
            },
            ToScheduler::Sessions(reply) => {
                let mut infos = Vec::with_capacity(state.sessions.len());
                for (id, actor) in &state.sessions {
                    let cached_tokens = state.scheduler.session_cached(id);
                    if let Ok(info) = ractor::call!(actor, |reply| ToSession::Info { cached_tokens, reply }) {
                        infos.push(info);
                    }
                }
                infos.sort_by(|a, b| a.id.cmp(&b.id));
                let _ = reply.send(infos);
            }
            ToScheduler::DeleteSession { id, reply } => {
                let _ = reply.send(state.end_session(&id, "deleted"));
            }
            ToScheduler::Embed { inputs, readout, reply } => {
                if let Some(cause) = &state.worker_lost {
                    let device = state.device.clone();
                    let _ = reply.send(Err(EngineError::WorkerLost { device, restart: true, cause: cause.clone() }));
                } else {
                    // The worker answers the caller itself, between steps.
                    let worker = state.worker.clone();
                    tokio::spawn(async move {
                        let result = ractor::call!(worker, |r| ToWorker::Embed { inputs, readout, reply: r });
                        let _ = reply.send(match result {
                            Ok(pooled) => pooled.map_err(EngineError::Step),
                            Err(_) => Err(EngineError::Stopped { actor: "worker" }),
                        });
                    });
                }
            }
            ToScheduler::SessionIdle { id, actor } => {
                let current = state.sessions.get(&id).is_some_and(|a| a.get_id() == actor);
                let busy = state.scheduler.has_session_requests(&id);
                if current && !busy {
                    state.end_session(&id, "expired");
                }
            }
            ToScheduler::Shutdown(reply) => {
                state.shutting_down = true;
                state.shutdown_waiters.push(reply);
                state.end(Vec::new());
            }
        }
        state.step();
        state.publish_load();
        Ok(())
    }
}

impl SchedulerState {
    /// The replica's figures now.
    fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.scheduler.n_running(),
            waiting: self.scheduler.n_waiting(),
            kv_cells_used: self.kv_cells_used,
            kv_capacity: self.config.kv_capacity,
            kv_dtype: Some(self.kv_memory.0),
            kv_bytes: self.kv_memory.1,
            preemptions: self.scheduler.preemptions,
            kv_cells_cached: self.scheduler.kv_cached(),
            prefix_queries: self.scheduler.prefix_queries,
            prefix_hits: self.scheduler.prefix_hits,
            finished: self.finished,
            sessions: self.sessions.len(),
            worker_restarts: self.worker_restarts,
            text_call_retries: self.text_call_retries,
            speculative: SpeculativeStats {
                proposer: if self.draft.is_some() { DraftModelProposer::NAME } else { NgramProposer::NAME },
                proposed: self.scheduler.proposed,
                accepted: self.scheduler.accepted,
            },
        }
    }

    /// Answers the stats callers that waited for the step in flight.
    fn answer_stats(&mut self) {
        let stats = self.stats();
        for reply in self.stats_waiting.drain(..) {
            let _ = reply.send(stats);
        }
    }

    fn publish_load(&self) {
        let load = ReplicaLoad {
            held: self.requests.len(),
            received: self.received,
            available: !self.shutting_down && self.worker_lost.is_none(),
        };
        self.load.send_if_modified(|old| std::mem::replace(old, load) != load);
    }

    /// Queues a checked choice: its sequence, its request actor, its sampler on the worker and
    /// its session's actor. Refused only while shutting down or without a worker.
    async fn submit(
        &mut self,
        me: &ActorRef<ToScheduler>,
        choice: ValidChoice,
        events: UnboundedSender<Event>,
    ) -> Result<RequestId, EngineError> {
        if self.shutting_down {
            return Err(EngineError::ShuttingDown);
        }
        if let Some(cause) = &self.worker_lost {
            return Err(EngineError::WorkerLost { device: self.device.clone(), restart: true, cause: cause.clone() });
        }
        let ValidChoice { prompt, params, session } = choice;
        let id = self.next_id;
        let args = RequestArgs {
            id,
            prompt_tokens: prompt.len(),
            params: params.clone(),
            tokenizer: self.tokenizer.clone(),
            events: events.clone(),
            scheduler: me.clone(),
        };
        let (actor, _) = Actor::spawn(None, RequestActor, args)
            .await
            .map_err(|e| EngineError::Spawn { actor: "request actor", reason: e.to_string() })?;
        if let Some(s) = &session
            && let Err(e) = self.session_actor(me, s).await.and_then(|a| {
                a.send_message(ToSession::Begin).map_err(|_| EngineError::Stopped { actor: "session actor" })
            })
        {
            actor.stop(None);
            return Err(e);
        }
        let speculating = params.speculative.unwrap_or(self.config.speculative.default_on);
        let origin = params.text_retry.is_some().then(|| (prompt.clone(), session.clone()));
        let seq = Sequence::new(id, prompt, params.clone()).in_session(session.clone()).speculating(speculating);
        let lane = Lane::fresh(&seq.tokens, params.clone(), speculating);
        tracing::info!(
            request_id = id,
            prompt_tokens = seq.prompt_len,
            max_tokens = params.max_tokens,
            session = session.as_deref(),
            "request queued"
        );
        self.scheduler.add(seq);
        self.next_id += self.id_stride;
        // A worker that just died gets every live request's sampler when it is restarted.
        let _ = self.worker.send_message(ToWorker::AddRequest(id, Box::new(lane)));
        self.requests.insert(id, Live { actor, events, params, speculating, origin });
        Ok(id)
    }

    /// Starts a request over from its prompt with new parameters, if it has not ended, and
    /// tells its actor whether it did.
    fn restart(&mut self, Retry { id, params, actor }: Retry) {
        let live = self.requests.get_mut(&id);
        let restarted = match live.and_then(|l| Some((l.origin.clone()?, l))) {
            Some(((prompt, session), live)) => {
                live.params = params.clone();
                let lane = Lane::fresh(&prompt, params.clone(), live.speculating);
                self.scheduler.restart(id, prompt, session, params, live.speculating);
                let _ = self.worker.send_message(ToWorker::RemoveRequest(id));
                let _ = self.worker.send_message(ToWorker::AddRequest(id, Box::new(lane)));
                self.text_call_retries += 1;
                tracing::info!(request_id = id, "answer started over: it was a call written as text that no tool fits");
                true
            }
            None => false,
        };
        let _ = actor.send_message(ToRequest::Restarted(restarted));
    }

    /// The session's actor, started if the session is new.
    async fn session_actor(
        &mut self,
        me: &ActorRef<ToScheduler>,
        id: &str,
    ) -> Result<ActorRef<ToSession>, EngineError> {
        if let Some(actor) = self.sessions.get(id) {
            return Ok(actor.clone());
        }
        let args = SessionArgs { id: id.into(), idle_timeout: self.config.session_idle_timeout, scheduler: me.clone() };
        let (actor, _) = Actor::spawn_linked(None, SessionActor, args, me.get_cell())
            .await
            .map_err(|e| EngineError::Spawn { actor: "session actor", reason: e.to_string() })?;
        self.sessions.insert(id.into(), actor.clone());
        Ok(actor)
    }

    /// Stops a session and frees its cells; false if there was none.
    fn end_session(&mut self, id: &str, why: &str) -> bool {
        let Some(actor) = self.sessions.remove(id) else { return false };
        actor.stop(None);
        let freed = self.scheduler.session_cached(id);
        self.scheduler.release_session(id);
        tracing::info!(session = id, freed_cells = freed, "session {why}");
        true
    }

    /// Replaces a failed worker: its batch's requests end with an error, the others are put
    /// back to be recomputed on a new worker with a newly loaded model.
    async fn restart_worker(&mut self, me: &ActorRef<ToScheduler>, failure: String) {
        let batch = self.in_flight.take().unwrap_or_default();
        tracing::error!(error = failure, failed_requests = batch.len(), "worker failed; restarting it");
        let failed = batch.iter().filter_map(|id| self.scheduler.finish_request(*id, FinishReason::Error)).collect();
        self.end(failed);
        for retry in std::mem::take(&mut self.retries) {
            self.restart(retry);
        }
        self.scheduler.reset_kv();
        self.kv_cells_used = 0;
        self.worker_restarts += 1;
        self.answer_stats();
        match self.new_worker(me).await {
            Ok(worker) => {
                for (id, live) in &self.requests {
                    if let Some((prompt, generated)) = self.scheduler.tokens_of(*id) {
                        let p = &live.params;
                        let sampler = Sampler::resume(p.sampling.clone(), &p.guidance, prompt, generated);
                        let history = live.speculating.then(|| [prompt, generated].concat());
                        let mut lane = Lane::new(sampler, p.clone(), history);
                        if generated.is_empty() {
                            // Its prompt is computed again: its log-probabilities with it.
                            lane = lane.scoring(prompt);
                        }
                        let _ = worker.send_message(ToWorker::AddRequest(*id, Box::new(lane)));
                    }
                }
                self.worker = worker;
                tracing::info!(requeued_requests = self.requests.len(), "worker restarted");
            }
            Err(e) => {
                tracing::error!(error = %e, "the worker cannot be restarted; the engine refuses new requests");
                self.worker_lost = Some(e);
                let ids: Vec<RequestId> = self.requests.keys().copied().collect();
                let failed =
                    ids.iter().filter_map(|id| self.scheduler.finish_request(*id, FinishReason::Error)).collect();
                self.end(failed);
            }
        }
    }

    /// A worker over a newly loaded model (and draft model).
    async fn new_worker(&self, me: &ActorRef<ToScheduler>) -> Result<ActorRef<ToWorker>, WorkerLoss> {
        let model = load_off_thread(&self.loader).await?;
        let draft = match &self.draft {
            Some(load) => Some(load_draft(load).await?),
            None => None,
        };
        let spawned = spawn_worker(me, model, draft, &self.config).await;
        spawned.map(|(worker, _)| worker).map_err(|e| WorkerLoss::Spawn(e.to_string()))
    }

    /// Tells finished requests' actors and the worker; answers shutdown once all are done.
    fn end(&mut self, finished: Vec<Finished>) {
        for f in finished {
            if let Some(live) = self.requests.remove(&f.id) {
                let _ = live.actor.send_message(ToRequest::Finished {
                    reason: f.reason,
                    completion_tokens: f.output.len(),
                    cached_tokens: f.cached_tokens,
                    queue_time: f.queue_time,
                });
                if let Some(session) = f.session.as_ref().and_then(|s| self.sessions.get(s)) {
                    let _ = session.send_message(ToSession::End);
                }
            }
            let _ = self.worker.send_message(ToWorker::RemoveRequest(f.id));
            self.finished.count(f.reason);
            tracing::info!(
                request_id = f.id,
                finish_reason = f.reason.as_str(),
                completion_tokens = f.output.len(),
                "request finished"
            );
        }
        if self.shutting_down && self.requests.is_empty() && self.in_flight.is_none() {
            for waiter in self.shutdown_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }

    /// Ends requests whose client left, then starts the next step if none is in flight.
    fn step(&mut self) {
        let gone: Vec<RequestId> =
            self.requests.iter().filter(|(_, l)| l.events.is_closed()).map(|(id, _)| *id).collect();
        let finished =
            gone.into_iter().filter_map(|id| self.scheduler.finish_request(id, FinishReason::Abort)).collect();
        self.end(finished);
        if self.in_flight.is_some() {
            return;
        }
        if let Some(plan) = self.scheduler.schedule() {
            let ids = plan.items.iter().map(|i| i.id).collect();
            if self.worker.send_message(ToWorker::Execute(plan)).is_ok() {
                self.in_flight = Some(ids);
            }
        }
    }
}

/// Runs `loader` on a blocking thread (loading reads and converts the whole checkpoint).
pub(crate) async fn load_off_thread(loader: &ModelLoader) -> Result<Box<dyn LanguageModel>, WorkerLoss> {
    let loader = loader.clone();
    match tokio::task::spawn_blocking(move || loader()).await {
        Ok(loaded) => loaded.map_err(|e| WorkerLoss::Load(Arc::new(e))),
        Err(e) => Err(WorkerLoss::LoaderFailed(e.to_string())),
    }
}

/// The draft model, off the async threads.
async fn load_draft(loader: &ModelLoader) -> Result<Box<dyn LanguageModel>, WorkerLoss> {
    load_off_thread(loader).await.map_err(|e| match e {
        WorkerLoss::Load(e) => WorkerLoss::LoadDraft(e),
        other => other,
    })
}

async fn spawn_worker(
    me: &ActorRef<ToScheduler>,
    model: Box<dyn LanguageModel>,
    draft: Option<Box<dyn LanguageModel>>,
    config: &EngineConfig,
) -> Result<(ActorRef<ToWorker>, (KvDtype, usize)), ractor::SpawnErr> {
    let proposer = config.proposer(draft, model.info().vocab_size);
    let context = config.context(model);
    let kv_memory = (context.kv().dtype(), context.kv().size_bytes());
    let executor = Executor::new(context).with_proposer(proposer);
    let args = WorkerArgs { executor, scheduler: me.clone() };
    Ok((Actor::spawn_linked(None, WorkerActor, args, me.get_cell()).await?.0, kv_memory))
}
