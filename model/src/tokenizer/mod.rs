//! C10: the model's Hugging Face `tokenizer.json`, its chat template (`chat.rs`) and
//! incremental detokenization for streaming (`stream.rs`).

mod chat;
mod stream;

use std::path::Path;

pub use chat::{ChatMessage, ChatTemplate, TemplateError};
pub use stream::IncrementalDecoder;

use crate::error::LoadError;

/// A tokenizer failure at run time (e.g. an id the vocabulary lacks).
#[derive(Debug, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(pub(crate) String);

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Reads `DIR/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| LoadError::Tokenizer { path: path.clone(), reason: e.to_string() })?;
        Ok(Self { inner })
    }

    /// Token ids of `text`. Special tokens written in the text (`<|im_start|>`) become their ids;
    /// nothing is added (Qwen has no BOS).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(|e| TokenizerError(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; special tokens are kept unless `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.inner.decode(ids, skip_special).map_err(|e| TokenizerError(e.to_string()))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
