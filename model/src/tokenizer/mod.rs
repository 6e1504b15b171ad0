//! C10: the model's Hugging Face `tokenizer.json`, its chat template (`chat.rs`), a code model's
//! fill-in-the-middle prompts (`fim.rs`) and incremental detokenization for streaming
//! (`stream.rs`).

mod chat;
mod fim;
mod stream;

use std::path::Path;

pub use chat::{ChatMessage, ChatTemplate, MessageImage, TemplateError, ToolCall, strftime};
pub use fim::{FIM_DEFAULT_PATH, FIM_DEFAULT_REPO, FimFile, FimPrompt, FimTokens, Infill};
pub use stream::IncrementalDecoder;

use crate::error::LoadError;

/// A tokenizer failure at run time (e.g. an id the vocabulary lacks).
#[derive(Debug, Clone, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(pub(crate) String);

#[derive(Clone)]
pub struct Tokenizer {
    pub(crate) inner: tokenizers::Tokenizer,
    pieces: Pieces,
}

/// How the vocabulary's pieces spell bytes, read from the decoder that turns them back into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pieces {
    /// GPT-2's byte-level alphabet (Qwen, Llama 3): every byte is one character.
    ByteLevel,
    /// SentencePiece's (Llama 2, Mistral): text as it is with `▁` for a space, and bytes no piece
    /// holds as `<0xXX>` pieces.
    Metaspace,
    /// Any other: a piece is its own text.
    Text,
}

impl Pieces {
    fn of(inner: &tokenizers::Tokenizer) -> Self {
        use tokenizers::DecoderWrapper as D;
        fn find(d: &D, ty: &impl Fn(&D) -> bool) -> bool {
            match d {
                D::Sequence(s) => s.get_decoders().iter().any(|d| find(d, ty)),
                d => ty(d),
            }
        }
        let Some(decoder) = inner.get_decoder() else { return Self::Text };
        if find(decoder, &|d| matches!(d, D::ByteLevel(_))) {
            Self::ByteLevel
        } else if find(decoder, &|d| matches!(d, D::Metaspace(_) | D::ByteFallback(_))) {
            Self::Metaspace
        } else {
            Self::Text
        }
    }

    /// The bytes `piece`, a piece of the model's vocabulary, stands for.
    fn bytes(self, piece: String) -> Vec<u8> {
        match self {
            Self::ByteLevel => {
                piece.chars().map(byte_of_char).collect::<Option<Vec<u8>>>().unwrap_or_else(|| piece.into_bytes())
            }
            Self::Metaspace => match fallback_byte(&piece) {
                Some(byte) => vec![byte],
                None => piece.replace(SPM_SPACE, " ").into_bytes(),
            },
            Self::Text => piece.into_bytes(),
        }
    }
}

/// SentencePiece's space, `▁`.
pub(crate) const SPM_SPACE: &str = "\u{2581}";

/// The byte of a byte-fallback piece, `<0x0A>`.
fn fallback_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

impl Tokenizer {
    /// Reads `DIR/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| LoadError::Tokenizer { path: path.clone(), reason: e.to_string() })?;
        Ok(Self::from_inner(inner))
    }

    pub(crate) fn from_inner(inner: tokenizers::Tokenizer) -> Self {
        Self { pieces: Pieces::of(&inner), inner }
    }

    /// Whether `encode` gives tokens whose bytes are exactly the text's. A SentencePiece tokenizer
    /// writes a space before a text (`▁` before its first word), so a fragment tokenized alone
    /// is not the same bytes.
    pub fn encodes_fragments_exactly(&self) -> bool {
        self.pieces == Pieces::ByteLevel
    }

    /// Token ids of `text`. Special tokens written in the text (`<|im_start|>`) become their ids;
    /// nothing is added (a rendered chat carries its own BOS where the template writes one).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(|e| TokenizerError(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of a raw prompt: `encode` plus what the model's tokenizer adds to each input
    /// (Llama 3's BOS; nothing for Qwen, which has no BOS).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, true).map_err(|e| TokenizerError(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; special tokens are kept unless `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.inner.decode(ids, skip_special).map_err(|e| TokenizerError(e.to_string()))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The exact bytes token `id` stands for (a byte-level BPE token, or a byte-fallback piece,
    /// may be part of a UTF-8 character; a SentencePiece piece's `▁` is a space); `None` if the
    /// vocabulary lacks it.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let piece = self.inner.id_to_token(id)?;
        // Added tokens (`<|im_end|>`, `[INST]`) are plain text; the model's pieces are spelled
        // in its own way.
        let added = self.inner.get_added_vocabulary();
        let special = added.is_special_token(&piece) || added.get_added_tokens_decoder().contains_key(&id);
        Some(if special { piece.into_bytes() } else { self.pieces.bytes(piece) })
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Where two vocabularies first differ; `None` when every id stands for the same token.
    pub fn vocab_difference(&self, other: &Tokenizer) -> Option<String> {
        let (a, b) = (self.vocab_size(), other.vocab_size());
        if a != b {
            return Some(format!("{a} tokens against {b}"));
        }
        (0..a as u32).find_map(|id| {
            let (x, y) = (self.inner.id_to_token(id), other.inner.id_to_token(id));
            (x != y).then(|| format!("token {id} is {x:?} against {y:?}"))
        })
    }
}

/// The byte a character of GPT-2's byte-level alphabet stands for: printable Latin-1 bytes are
/// themselves, the other 68 bytes were shifted to U+0100.. in order.
fn byte_of_char(c: char) -> Option<u8> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let code = c as u32;
    if code < 0x100 {
        return printable(code).then_some(code as u8);
    }
    let shifted = (0u32..0x100).filter(|b| !printable(*b)).nth((code - 0x100) as usize)?;
    Some(shifted as u8)
}
