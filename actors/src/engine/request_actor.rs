//! A request actor: turns its sampled tokens into text (never half a character, never any part
//! of a stop string) and events for its client. It tells the scheduler to end the request when
//! a stop string matches or when the client has dropped its stream.

use std::sync::Arc;

use llaisys_model::Tokenizer;
use llaisys_model::tokenizer::IncrementalDecoder;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc::UnboundedSender;

use super::api::Event;
use super::messages::{ToRequest, ToScheduler};
use crate::request::{FinishReason, RequestId, StopMatcher, StopOutcome};

pub struct RequestActor;

pub struct RequestArgs {
    pub id: RequestId,
    pub prompt_tokens: usize,
    pub stop: Vec<String>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub events: UnboundedSender<Event>,
    pub scheduler: ActorRef<ToScheduler>,
}

pub struct RequestState {
    args: RequestArgs,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    /// A stop string matched or the client left: later tokens are not shown.
    ended: bool,
}

impl RequestState {
    /// Text `token` completes, cut at a stop string (then the request is ended).
    fn text_of(&mut self, token: u32) -> Result<String, ActorProcessingErr> {
        let Some(tokenizer) = &self.args.tokenizer else { return Ok(String::new()) };
        let Some(delta) = self.decoder.push(tokenizer, token)? else { return Ok(String::new()) };
        Ok(self.filter(&delta))
    }

    fn filter(&mut self, delta: &str) -> String {
        match self.stops.push(delta) {
            StopOutcome::Continue(text) => text,
            StopOutcome::Stopped(text) => {
                self.end(FinishReason::Stop);
                text
            }
        }
    }

    /// Asks the scheduler to end this request (once).
    fn end(&mut self, reason: FinishReason) {
        if !self.ended {
            self.ended = true;
            let _ = self.args.scheduler.send_message(ToScheduler::Finish { id: self.args.id, reason, reply: None });
        }
    }

    /// What the decoder and stop matcher still hold at the end.
    fn rest(&mut self) -> Result<String, ActorProcessingErr> {
        let mut text = String::new();
        if self.ended {
            return Ok(text);
        }
        if let Some(tokenizer) = &self.args.tokenizer
            && let Some(delta) = self.decoder.finish(tokenizer)?
        {
            text = self.filter(&delta);
        }
        if !self.ended {
            text.push_str(&self.stops.finish());
        }
        Ok(text)
    }
}

impl Actor for RequestActor {
    type Msg = ToRequest;
    type State = RequestState;
    type Arguments = RequestArgs;

    async fn pre_start(&self, _: ActorRef<ToRequest>, args: RequestArgs) -> Result<RequestState, ActorProcessingErr> {
        let stops = StopMatcher::new(args.stop.iter().cloned());
        Ok(RequestState { args, decoder: IncrementalDecoder::new(true), stops, ended: false })
    }

    async fn handle(
        &self,
        me: ActorRef<ToRequest>,
        msg: ToRequest,
        state: &mut RequestState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ToRequest::Token(sampled) => {
                if state.ended {
                    return Ok(());
                }
                let text = state.text_of(sampled.token)?;
                let event =
                    Event::Token { token: sampled.token, text, logprob: sampled.logprob, top_logprobs: sampled.top };
                if state.args.events.send(event).is_err() {
                    state.end(FinishReason::Abort); // the client dropped its stream
                }
            }
            ToRequest::Finished { reason, completion_tokens } => {
                let text = state.rest()?;
                let prompt_tokens = state.args.prompt_tokens;
                let _ = state.args.events.send(Event::Finished { reason, text, prompt_tokens, completion_tokens });
                me.stop(None);
            }
        }
        Ok(())
    }
}
