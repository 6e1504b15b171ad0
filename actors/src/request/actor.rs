//! A request actor: runs its choice's sampled tokens through its `Postprocess` and sends the
//! events to its client. It tells the scheduler to end the request when a stop string matches
//! or when the client has dropped its stream.

use std::sync::Arc;

use llaisys_model::Tokenizer;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc::UnboundedSender;

use super::messages::ToRequest;
use super::postprocess::Postprocess;
use super::{FinishReason, RequestId};
use crate::engine::Event;
use crate::host::GenerateParams;
use crate::scheduler::ToScheduler;

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
        Ok(RequestState { id: args.id, output, events: args.events, scheduler: args.scheduler, ended: false })
    }

    async fn handle(
        &self,
        me: ActorRef<ToRequest>,
        msg: ToRequest,
        state: &mut RequestState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ToRequest::Token(sampled) => match state.output.token(sampled) {
                Ok(Some(event)) => {
                    if state.events.send(event).is_err() {
                        state.end(FinishReason::Abort); // the client dropped its stream
                    } else if state.output.stopped() {
                        state.end(FinishReason::Stop);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    // The stream must still end with `Finished`: end the request instead.
                    tracing::error!(request_id = state.id, error = %e, "detokenization failed");
                    state.end(FinishReason::Error);
                }
            },
            ToRequest::Finished { reason, completion_tokens, cached_tokens, queue_time } => {
                let finished = state.output.finish(reason, completion_tokens, cached_tokens, queue_time);
                let event = finished.unwrap_or_else(|e| {
                    tracing::error!(request_id = state.id, error = %e, "detokenization failed");
                    state.output.close();
                    let closed = state.output.finish(reason, completion_tokens, cached_tokens, queue_time);
                    closed.expect("a closed output decodes nothing more")
                });
                let _ = state.events.send(event);
                me.stop(None);
            }
        }
        Ok(())
    }
}
