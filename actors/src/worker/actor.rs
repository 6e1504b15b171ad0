//! The worker actor: owns the model context and the samplers. A step's forward pass runs on a
//! blocking thread, never on the async runtime's threads; the result returns to the scheduler
//! as a message. An internal error (a panic in the forward pass, broken cache invariants)
//! means the model and its cache can no longer be trusted: the actor fails, and its
//! supervisor, the scheduler actor, replaces it.

use llaisys_model::DecodeError;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::executor::Executor;
use super::messages::ToWorker;
use super::read_out::{Job, Queue};
use crate::scheduler::ToScheduler;

pub struct WorkerActor;

pub struct WorkerState {
    /// `None` only while a step runs on its blocking thread.
    executor: Option<Executor>,
    scheduler: ActorRef<ToScheduler>,
    /// Prefill-only work waiting for a pass between steps.
    read_outs: Queue,
    /// Whether a `ToWorker::ReadOut` is in the mailbox (one at a time, so the jobs that arrive
    /// meanwhile join the pass it runs).
    read_out_due: bool,
}

pub struct WorkerArgs {
    pub executor: Executor,
    pub scheduler: ActorRef<ToScheduler>,
}

impl Actor for WorkerActor {
    type Msg = ToWorker;
    type State = WorkerState;
    type Arguments = WorkerArgs;

    async fn pre_start(&self, _: ActorRef<ToWorker>, args: WorkerArgs) -> Result<WorkerState, ActorProcessingErr> {
        Ok(WorkerState {
            executor: Some(args.executor),
            scheduler: args.scheduler,
            read_outs: Queue::default(),
            read_out_due: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ToWorker>,
        msg: ToWorker,
        state: &mut WorkerState,
    ) -> Result<(), ActorProcessingErr> {
        let executor = state.executor.as_mut().ok_or("worker executor missing")?;
        match msg {
            ToWorker::AddRequest(id, lane) => executor.add_request(id, *lane),
            ToWorker::RemoveRequest(id) => executor.remove_request(id),
            ToWorker::Embed { inputs, readout, reply } => {
                state.read_outs.push(Job { inputs, readout, reply });
                if !state.read_out_due {
                    myself.send_message(ToWorker::ReadOut)?;
                    state.read_out_due = true;
                }
            }
            ToWorker::ReadOut => {
                state.read_out_due = false;
                if let Some(pass) = state.read_outs.next_pass() {
                    let executor = state.executor.take().ok_or("worker executor missing")?;
                    tracing::debug!(jobs = pass.jobs(), "read-out pass");
                    let executor = tokio::task::spawn_blocking(move || {
                        pass.run(executor.context());
                        executor
                    })
                    .await?;
                    state.executor = Some(executor);
                }
                // What is left (and what arrived during the pass) goes after the steps queued now.
                if !state.read_outs.is_empty() {
                    myself.send_message(ToWorker::ReadOut)?;
                    state.read_out_due = true;
                }
            }
            ToWorker::Execute(plan) => {
                let mut executor = state.executor.take().ok_or("worker executor missing")?;
                let (executor, plan, result, elapsed) = tokio::task::spawn_blocking(move || {
                    let start = std::time::Instant::now();
                    let result = executor.execute(&plan);
                    (executor, plan, result, start.elapsed())
                })
                .await?;
                if let Err(DecodeError::Internal(e)) = result {
                    return Err(format!("forward pass failed: {e}").into());
                }
                let (kv_used, kv_bytes) = (executor.context().kv().used(), executor.context().kv().size_bytes());
                state.executor = Some(executor);
                state
                    .scheduler
                    .send_message(ToScheduler::StepDone { plan, result, elapsed, kv_used, kv_bytes })
                    .map_err(|_| "scheduler stopped")?;
            }
        }
        Ok(())
    }
}
