//! A request actor: runs its choice's sampled tokens through its `Postprocess` and sends the
//! events to its client. It tells the scheduler to end the request when a stop string matches
//! or when the client has dropped its stream, and to start it over when its answer was a call
//! written as text that no tool fits (`GenerateParams::text_retry`).

use std::sync::Arc;

use llaisys_model::Tokenizer;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc::UnboundedSender;

use super::messages::ToRequest;
use super::postprocess::Postprocess;
use super::{FinishReason, RequestId};
use crate::engine::Event;
use crate::host::GenerateParams;
use crate::scheduler::{Retry, ToScheduler};

pub struct RequestActor;

pub struct RequestArgs {
    pub id: RequestId,
    pub prompt_tokens: usize,
    /// Its checked parameters (stop strings, tool-call parsing).
    pub params: Arc<GenerateParams>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub events: UnboundedSender<Event>,
    pub scheduler: ActorRef<ToScheduler>,
}

pub struct RequestState {
    id: RequestId,
    output: Postprocess,
    events: UnboundedSender<Event>,
    scheduler: ActorRef<ToScheduler>,
    /// The scheduler was asked to end the request (stop string, client gone, failed output).
    ended: bool,
    /// Asked the scheduler to start the request over with these parameters: what arrives
    /// before its answer is kept until then.
    retrying: Option<(Arc<GenerateParams>, Vec<ToRequest>)>,
}

impl RequestState {
    /// Asks the scheduler to end this request (once); no more tokens are shown.
    fn end(&mut self, reason: FinishReason) {
        self.output.close();
        if !self.ended {
            self.ended = true;
            let _ = self.scheduler.send_message(ToScheduler::Finish { id: self.id, reason, reply: None });
        }
    }
}

impl Actor for RequestActor {
    type Msg = ToRequest;
    type State = RequestState;
    type Arguments = RequestArgs;

    async fn pre_start(&self, _: ActorRef<ToRequest>, args: RequestArgs) -> Result<RequestState, ActorProcessingErr> {
        let output = Postprocess::new(args.prompt_tokens, &args.params, args.tokenizer);
        Ok(RequestState {
            id: args.id,
            output,
            events: args.events,
            scheduler: args.scheduler,
            ended: false,
            retrying: None,
        })
    }

    async fn handle(
        &self,
        me: ActorRef<ToRequest>,
        msg: ToRequest,
        state: &mut RequestState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some((params, kept)) = &mut state.retrying {
            match msg {
                ToRequest::Restarted(true) => {
                    // What was kept is the first attempt's.
                    state.output.restarted(params);
                    (state.retrying, state.ended) = (None, false);
                }
                ToRequest::Restarted(false) => {
                    // It had ended: its answer is the rejected text after all.
                    let kept = std::mem::take(kept);
                    state.retrying = None;
                    state.output.not_restarted();
                    for msg in kept {
                        state.take(&me, msg);
                    }
                }
                other => kept.push(other),
            }
            return Ok(());
        }
        state.take(&me, msg);
        Ok(())
    }
}

impl RequestState {
    fn take(&mut self, me: &ActorRef<ToRequest>, msg: ToRequest) {
        match msg {
            ToRequest::Token(sampled) => match self.output.token(sampled) {
                Ok(events) => {
                    if events.into_iter().any(|event| self.events.send(event).is_err()) {
                        self.end(FinishReason::Abort); // the client dropped its stream
                    } else if self.output.stopped() {
                        self.end(FinishReason::Stop);
                    } else if self.output.out_of_time() {
                        self.end(FinishReason::Length);
                    } else if let Some(params) = self.output.retry() {
                        let retry =
                            ToScheduler::Retry(Retry { id: self.id, params: params.clone(), actor: me.clone() });
                        if self.scheduler.send_message(retry).is_ok() {
                            self.retrying = Some((params, Vec::new()));
                        } else {
                            self.output.not_restarted();
                        }
                    }
                }
                Err(e) => {
                    // The stream must still end with `Finished`: end the request instead.
                    tracing::error!(request_id = self.id, error = %e, "detokenization failed");
                    self.end(FinishReason::Error);
                }
            },
            ToRequest::PromptLogprobs(logprobs) => self.output.prompt_logprobs(logprobs),
            ToRequest::Restarted(_) => {}
            ToRequest::Finished { reason, completion_tokens, cached_tokens, queue_time } => {
                let finished = self.output.finish(reason, completion_tokens, cached_tokens, queue_time);
                let events = finished.unwrap_or_else(|e| {
                    tracing::error!(request_id = self.id, error = %e, "detokenization failed");
                    self.output.close();
                    let closed = self.output.finish(reason, completion_tokens, cached_tokens, queue_time);
                    closed.expect("a closed output decodes nothing more")
                });
                for event in events {
                    let _ = self.events.send(event);
                }
                me.stop(None);
            }
        }
    }
}
