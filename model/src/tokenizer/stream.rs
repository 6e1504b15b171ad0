//! Incremental detokenization for streaming: each new token yields the text it completes, and
//! never half of a UTF-8 character (a byte-level BPE token may hold part of one). The method is
//! TGI's and vLLM's: decode a short window of recent tokens twice and emit the difference once
//! it no longer ends in a replacement character.

use super::{Tokenizer, TokenizerError};

/// The streaming state of one sequence's output.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window decoded for context (keeps merges like leading spaces right).
    prefix_offset: usize,
    /// Tokens before this were emitted.
    read_offset: usize,
    skip_special: bool,
}

impl IncrementalDecoder {
    pub fn new(skip_special: bool) -> Self {
        Self { skip_special, ..Self::default() }
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<Option<String>, TokenizerError> {
        self.ids.push(id);
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let Some(delta) = full.get(prefix.len()..) else {
            return Ok(None);
        };
        let delta = delta.to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(Some(delta))
    }

    /// Text held back at the end of the stream (an incomplete character shows as U+FFFD).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<Option<String>, TokenizerError> {
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(full.get(prefix.len()..).filter(|d| !d.is_empty()).map(str::to_string))
    }

    /// Every token pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}
