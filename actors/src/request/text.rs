//! A request's output text as it streams: tokens are detokenized incrementally (never half a
//! character) and cut at the first stop string (never any part of it). Used by the request
//! actor and by offline generation alike.

use llaisys_model::Tokenizer;
use llaisys_model::tokenizer::{IncrementalDecoder, TokenizerError};

use super::stop::{StopMatcher, StopOutcome};

#[derive(Debug, Clone)]
pub struct TextStream {
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    stopped: bool,
}

impl TextStream {
    /// Special tokens are left out of the text.
    pub fn new(stop: impl IntoIterator<Item = String>) -> Self {
        Self { decoder: IncrementalDecoder::new(true), stops: StopMatcher::new(stop), stopped: false }
    }

    /// Whether a stop string has ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The text `token` completes (possibly empty); always empty once stopped.
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String, TokenizerError> {
        if self.stopped {
            return Ok(String::new());
        }
        Ok(match self.decoder.push(tokenizer, token)? {
            Some(delta) => self.filter(&delta),
            None => String::new(),
        })
    }

    /// What is still held back at the end of the stream (empty once stopped).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        let mut text = String::new();
        if !self.stopped
            && let Some(delta) = self.decoder.finish(tokenizer)?
        {
            text = self.filter(&delta);
        }
        if !self.stopped {
            text.push_str(&self.stops.finish());
        }
        Ok(text)
    }

    fn filter(&mut self, delta: &str) -> String {
        match self.stops.push(delta) {
            StopOutcome::Continue(text) => text,
            StopOutcome::Stopped(text) => {
                self.stopped = true;
                text
            }
        }
    }
}
