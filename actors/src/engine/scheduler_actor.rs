//! The scheduler actor: owns the scheduling policy and the table of live requests. One step is
//! in flight at a time: schedule → the worker runs it → postprocess (tokens to request actors,
//! finished requests ended) → schedule again.

use std::collections::HashMap;
use std::sync::Arc;

use llaisys_model::{Context, LanguageModel, ModelInfo, Sampler, Tokenizer};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::mpsc::UnboundedSender;

use super::api::{EngineStats, Event, FinishCounts, GenerateRequest};
use super::messages::{ToRequest, ToScheduler, ToWorker};
use super::request_actor::{RequestActor, RequestArgs};
use super::worker_actor::{WorkerActor, WorkerArgs};
use crate::llm::{EngineConfig, EngineError};
use crate::request::{FinishReason, RequestId};
use crate::scheduler::{Finished, Scheduler, Sequence};
use crate::worker::Executor;

pub struct SchedulerActor;

pub struct SchedulerArgs {
    pub model: Box<dyn LanguageModel>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub config: EngineConfig,
}

/// A request the engine is serving.
struct Live {
    actor: ActorRef<ToRequest>,
    /// A clone of the client's channel, to notice a dropped stream even before the first token.
    events: UnboundedSender<Event>,
}

pub struct SchedulerState {
    scheduler: Scheduler,
    worker: ActorRef<ToWorker>,
    requests: HashMap<RequestId, Live>,
    tokenizer: Option<Arc<Tokenizer>>,
    info: ModelInfo,
    kv_capacity: usize,
    next_id: RequestId,
    in_flight: bool,
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
        let info = args.model.info().clone();
        let executor = Executor::new(Context::new(args.model, args.config.kv_capacity));
        let (worker, _) =
            Actor::spawn_linked(None, WorkerActor, WorkerArgs { executor, scheduler: me.clone() }, me.get_cell())
                .await?;
        let scheduler = Scheduler::new(args.config.scheduler(info.context_length));
        Ok(SchedulerState {
            scheduler,
            worker,
            requests: HashMap::new(),
            tokenizer: args.tokenizer,
            info,
            kv_capacity: args.config.kv_capacity,
            next_id: 0,
            in_flight: false,
            shutting_down: false,
            shutdown_waiters: Vec::new(),
            finished: FinishCounts::default(),
        })
    }

    async fn handle(
        &self,
        me: ActorRef<ToScheduler>,
        msg: ToScheduler,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ToScheduler::Submit { request, events, reply } => {
                let result = state.submit(&me, request, events).await;
                let _ = reply.send(result);
            }
            ToScheduler::StepDone { plan, result } => {
                state.in_flight = false;
                let finished = match result {
                    Ok(sampled) => {
                        let tokens: Vec<Option<u32>> = sampled.iter().map(|s| s.as_ref().map(|s| s.token)).collect();
                        for (item, s) in plan.items.iter().zip(sampled) {
                            if let (Some(s), Some(live)) = (s, state.requests.get(&item.id)) {
                                let _ = live.actor.send_message(ToRequest::Token(s));
                            }
                        }
                        state.scheduler.postprocess(&plan, &tokens)
                    }
                    Err(e) => {
                        // Only the requests of the failed batch fail; the engine goes on.
                        tracing::error!(error = %e, requests = plan.items.len(), "step failed");
                        plan.items
                            .iter()
                            .filter_map(|i| state.scheduler.finish_request(i.id, FinishReason::Error))
                            .collect()
                    }
                };
                state.end(finished);
            }
            ToScheduler::Finish { id, reason, reply } => {
                let finished = state.scheduler.finish_request(id, reason);
                if let Some(reply) = reply {
                    let _ = reply.send(finished.is_some());
                }
                state.end(finished.into_iter().collect());
            }
            ToScheduler::Stats(reply) => {
                let kv_cells_used = ractor::call!(state.worker, ToWorker::KvUsed).unwrap_or(0);
                let _ = reply.send(EngineStats {
                    running: state.scheduler.n_running(),
                    waiting: state.scheduler.n_waiting(),
                    kv_cells_used,
                    kv_capacity: state.kv_capacity,
                    preemptions: state.scheduler.preemptions,
                    kv_cells_cached: state.scheduler.kv_cached(),
                    prefix_queries: state.scheduler.prefix_queries,
                    prefix_hits: state.scheduler.prefix_hits,
                    finished: state.finished,
                });
            }
            ToScheduler::Shutdown(reply) => {
                state.shutting_down = true;
                state.shutdown_waiters.push(reply);
                state.end(Vec::new());
            }
        }
        state.step();
        Ok(())
    }
}

impl SchedulerState {
    async fn submit(
        &mut self,
        me: &ActorRef<ToScheduler>,
        request: GenerateRequest,
        events: UnboundedSender<Event>,
    ) -> Result<RequestId, EngineError> {
        if self.shutting_down {
            return Err(EngineError::ShuttingDown);
        }
        let GenerateRequest { prompt, params } = request;
        params.sampling.validate(self.info.vocab_size)?;
        if let Some(t) = prompt.iter().find(|t| **t as usize >= self.info.vocab_size) {
            return Err(EngineError::Decode(llaisys_model::DecodeError::InvalidInput(format!(
                "prompt token {t} is not below the vocabulary size {}",
                self.info.vocab_size
            ))));
        }
        let id = self.next_id;
        let stop = params.stop_conditions(&self.info.eos_token_ids);
        self.scheduler.add(Sequence::new(id, prompt.clone(), stop))?;
        self.next_id += 1;
        let args = RequestArgs {
            id,
            prompt_tokens: prompt.len(),
            stop: params.stop.clone(),
            tokenizer: self.tokenizer.clone(),
            events: events.clone(),
            scheduler: me.clone(),
        };
        let actor = match Actor::spawn(None, RequestActor, args).await {
            Ok((actor, _)) => actor,
            Err(e) => {
                self.scheduler.finish_request(id, FinishReason::Error);
                return Err(EngineError::Actor(e.to_string()));
            }
        };
        let sampler = Box::new(Sampler::new(params.sampling, &prompt));
        self.worker
            .send_message(ToWorker::AddRequest(id, sampler))
            .map_err(|_| EngineError::Actor("worker stopped".into()))?;
        tracing::info!(request_id = id, prompt_tokens = prompt.len(), max_tokens = params.max_tokens, "request queued");
        self.requests.insert(id, Live { actor, events });
        Ok(id)
    }

    /// Tells finished requests' actors and the worker; answers shutdown once all are done.
    fn end(&mut self, finished: Vec<Finished>) {
        for f in finished {
            if let Some(live) = self.requests.remove(&f.id) {
                let _ = live
                    .actor
                    .send_message(ToRequest::Finished { reason: f.reason, completion_tokens: f.output.len() });
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
        if self.shutting_down && self.requests.is_empty() && !self.in_flight {
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
        if self.in_flight {
            return;
        }
        if let Some(plan) = self.scheduler.schedule() {
            self.in_flight = self.worker.send_message(ToWorker::Execute(plan)).is_ok();
        }
    }
}
