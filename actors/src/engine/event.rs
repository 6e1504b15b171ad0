//! What a running request yields: its events, and the token counts at its end.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::host::TokenLogprob;
use crate::request::{FinishReason, RequestId, ToolCallDelta};

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens reused from the cache (prefix reuse or the session) instead of computed.
    pub cached_tokens: usize,
}

/// What a request's stream yields: tokens as they come, then exactly one `Finished`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Event {
    Token {
        token: u32,
        /// Text this token completes (empty while a character or a possible stop string is
        /// incomplete; always empty without a tokenizer).
        text: String,
        /// Reasoning text this token completes (a reasoning model's thinking; `text` is then
        /// empty).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reasoning: String,
        /// The token's log-probability, where the request asked for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logprob: Option<f32>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        top_logprobs: Vec<(u32, f32)>,
        /// How long this token's grammar mask took (constrained requests only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mask_time: Option<Duration>,
        /// T3: the pieces of tool calls this token completes (its `text` is then empty): one,
        /// or two where it ends a call of an array and begins the next.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCallDelta>,
        /// With a choice's first token, where the request asked for them: its prompt tokens'
        /// log-probabilities, each given the ones before it, from the second token on.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        prompt_logprobs: Vec<TokenLogprob>,
    },
    Finished {
        reason: FinishReason,
        /// Text held back until the end (the rest of an incomplete character or stop prefix).
        text: String,
        /// Reasoning held back until the end (an output that ended inside its thinking).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reasoning: String,
        usage: Usage,
        /// Time from arrival to first admission (`None` if it never ran).
        queue_time: Option<Duration>,
        /// The stop string that ended the output (`reason` is then `Stop`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop: Option<String>,
    },
}

/// A request's events (also a `futures::Stream`). Dropping it cancels the request.
pub struct EventStream {
    pub id: RequestId,
    rx: UnboundedReceiver<Event>,
}

impl EventStream {
    pub(crate) fn new(id: RequestId, rx: UnboundedReceiver<Event>) -> Self {
        Self { id, rx }
    }

    /// The next event; `None` after `Finished`.
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event if one is already there.
    pub fn try_next(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }
}

impl Stream for EventStream {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}
