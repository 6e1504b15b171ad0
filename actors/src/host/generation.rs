//! A running request as one stream: the events of all its choices, merged as they come.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::{BoxStream, SelectAll, Stream, StreamExt};

use super::answer::{Answer, AnswerBuilder};
use super::validate::ValidRequest;
use crate::engine::{Event, EventStream};
use crate::request::RequestId;

/// One event of one choice (choices are numbered prompt by prompt: prompt `p`'s choice `c` is
/// `p * n + c`). Each choice yields its tokens, then exactly one `Event::Finished`.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub choice: usize,
    pub event: Event,
}

/// A running request: a `Stream` of `Output`s. Dropping it cancels every unfinished choice.
pub struct Generation {
    ids: Vec<RequestId>,
    request: ValidRequest,
    merged: SelectAll<BoxStream<'static, Output>>,
    /// The choices' own streams until the first poll merges them (`into_streams` takes them).
    streams: Vec<EventStream>,
}

impl Generation {
    pub(crate) fn new(streams: Vec<EventStream>, request: ValidRequest) -> Self {
        let ids = streams.iter().map(|s| s.id).collect();
        Self { ids, request, merged: SelectAll::new(), streams }
    }

    /// The choices' event streams, one by one (a token-level request's single stream).
    pub(crate) fn into_streams(mut self) -> Vec<EventStream> {
        std::mem::take(&mut self.streams)
    }

    /// The request it runs.
    pub fn request(&self) -> &ValidRequest {
        &self.request
    }

    /// The engine request id of each choice (for `Engine::cancel`).
    pub fn ids(&self) -> &[RequestId] {
        &self.ids
    }

    /// The prompts' token ids, as the model sees them.
    pub fn prompts(&self) -> &[Vec<u32>] {
        self.request.prompts()
    }

    /// Choices per prompt.
    pub fn n(&self) -> usize {
        self.request.n()
    }

    /// Runs to the end and gathers every choice.
    pub async fn answer(mut self) -> Answer {
        let mut answer = AnswerBuilder::new(self.ids.len(), self.request.n(), self.request.logprobs());
        while let Some(Output { choice, event }) = self.next().await {
            answer.add(choice, event);
        }
        answer.finish()
    }
}

impl Stream for Generation {
    type Item = Output;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Output>> {
        // All streams move in at the first poll, so a stream's place is its choice.
        for (choice, s) in std::mem::take(&mut self.streams).into_iter().enumerate() {
            self.merged.push(s.map(move |event| Output { choice, event }).boxed());
        }
        self.merged.poll_next_unpin(cx)
    }
}
