//! A request actor: turns its sampled tokens into text (never half a character, never any part
//! of a stop string) and events for its client. It tells the scheduler to end the request when
//! a stop string matches or when the client has dropped its stream.

use std::sync::Arc;

use llaisys_model::Tokenizer;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc::UnboundedSender;

use super::messages::ToRequest;
use super::{FinishReason, Piece, RequestId, TextStream, ToolParsing};
use crate::engine::{Event, Usage};
use crate::scheduler::ToScheduler;

pub struct RequestActor;

pub struct RequestArgs {
    pub id: RequestId,
    pub prompt_tokens: usize,
    pub stop: Vec<String>,
    /// T3: how the output carries tool calls, if it may.
    pub tool_calls: Option<ToolParsing>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub events: UnboundedSender<Event>,
    pub scheduler: ActorRef<ToScheduler>,
}

pub struct RequestState {
    args: RequestArgs,
    text: TextStream,
    /// The scheduler was asked to end the request (stop string, or the client left): later
    /// tokens are not shown.
    ended: bool,
    /// Tokens received, and how many there were when a stop string ended the output: tokens
    /// after it (sampled before the scheduler heard, or accepted proposals of the same step)
    /// are not part of the completion.
    received: usize,
    stopped_after: Option<usize>,
}

impl RequestState {
    /// What `token` adds to the output; a matched stop string ends the request.
    fn piece_of(&mut self, token: u32) -> Result<Piece, ActorProcessingErr> {
        let Some(tokenizer) = &self.args.tokenizer else { return Ok(Piece::default()) };
        let piece = self.text.push(tokenizer, token)?;
        if self.text.stopped() && self.stopped_after.is_none() {
            self.stopped_after = Some(self.received);
            self.end(FinishReason::Stop);
        }
        Ok(piece)
    }

    /// Asks the scheduler to end this request (once).
    fn end(&mut self, reason: FinishReason) {
        if !self.ended {
            self.ended = true;
            let _ = self.args.scheduler.send_message(ToScheduler::Finish { id: self.args.id, reason, reply: None });
        }
    }

    /// What the text stream still holds at the end.
    fn rest(&mut self) -> Result<String, ActorProcessingErr> {
        match &self.args.tokenizer {
            Some(tokenizer) if !self.ended => Ok(self.text.finish(tokenizer)?),
            _ => Ok(String::new()),
        }
    }
}

impl Actor for RequestActor {
    type Msg = ToRequest;
    type State = RequestState;
    type Arguments = RequestArgs;

    async fn pre_start(&self, _: ActorRef<ToRequest>, args: RequestArgs) -> Result<RequestState, ActorProcessingErr> {
        let text = TextStream::new(args.stop.iter().cloned()).with_tool_calls(args.tool_calls.map(|t| t.tags));
        Ok(RequestState { args, text, ended: false, received: 0, stopped_after: None })
    }

    async fn handle(
        &self,
        me: ActorRef<ToRequest>,
        msg: ToRequest,
        state: &mut RequestState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ToRequest::Token(sampled) => {
                state.received += 1;
                if state.ended {
                    return Ok(());
                }
                let piece = match state.piece_of(sampled.token) {
                    Ok(piece) => piece,
                    Err(e) => {
                        // The stream must still end with `Finished`: end the request instead.
                        tracing::error!(request_id = state.args.id, error = %e, "detokenization failed");
                        state.end(FinishReason::Error);
                        return Ok(());
                    }
                };
                let event = Event::Token {
                    token: sampled.token,
                    text: piece.text,
                    logprob: sampled.logprob,
                    top_logprobs: sampled.top,
                    mask_time: sampled.mask_time,
                    tool_call: piece.tool_call,
                };
                if state.args.events.send(event).is_err() {
                    state.end(FinishReason::Abort); // the client dropped its stream
                }
            }
            ToRequest::Finished { reason, completion_tokens, cached_tokens, queue_time } => {
                let text = state.rest().unwrap_or_else(|e| {
                    tracing::error!(request_id = state.args.id, error = %e, "detokenization failed");
                    String::new()
                });
                let prompt_tokens = state.args.prompt_tokens;
                let completion_tokens = completion_tokens.min(state.stopped_after.unwrap_or(usize::MAX));
                let reason = ToolParsing::finish(state.args.tool_calls, reason, state.text.made_tool_calls());
                let _ = state.args.events.send(Event::Finished {
                    reason,
                    text,
                    usage: Usage { prompt_tokens, completion_tokens, cached_tokens },
                    queue_time,
                });
                me.stop(None);
            }
        }
        Ok(())
    }
}
