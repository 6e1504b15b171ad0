//! llguidance's view of our tokenizer: every token's bytes (special and added `<...>` tokens
//! marked, so grammars reach them only by name and text never spells them), the vocabulary
//! padded to the logits' width, and the model's end-of-sequence ids.

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::GrammarError;
use crate::Tokenizer;

pub(super) struct VocabEnv {
    tokenizer: Tokenizer,
    trie: TokTrie,
}

impl VocabEnv {
    /// `width`: the logits' width (≥ the vocabulary); `eos`: the ids that end a sequence.
    pub(super) fn new(tokenizer: Tokenizer, width: usize, eos: &[u32]) -> Result<Self, GrammarError> {
        let inner = &tokenizer.inner;
        let vocab = inner.get_vocab_size(true);
        if width < vocab {
            return Err(GrammarError(format!("the logits ({width} wide) are narrower than the vocabulary ({vocab})")));
        }
        let added = inner.get_added_vocabulary().get_added_tokens_decoder();
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(width);
        for id in 0..width as u32 {
            let special = added.get(&id).map(|t| t.special || (t.content.starts_with('<') && t.content.ends_with('>')));
            let word = match (special, tokenizer.token_bytes(id)) {
                (Some(true), Some(bytes)) => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], &bytes].concat(),
                (_, Some(bytes)) => bytes,
                // Padding rows of the logits: tokens no text or grammar can produce.
                (_, None) => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], format!("<[{id}]>").as_bytes()].concat(),
            };
            words.push(word);
        }
        let Some((&first, _)) = eos.split_first() else {
            return Err(GrammarError("the model has no end-of-sequence token".into()));
        };
        if let Some(bad) = eos.iter().find(|t| **t as usize >= width) {
            return Err(GrammarError(format!("end-of-sequence token {bad} is outside the vocabulary")));
        }
        let info = TokRxInfo::new(width as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        Ok(Self { tokenizer, trie })
    }
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let exact = self.tokenizer.encodes_fragments_exactly();
        match std::str::from_utf8(s).ok().filter(|_| exact).and_then(|text| self.tokenizer.encode(text).ok()) {
            Some(ids) => ids,
            // Bytes that are no text, or a SentencePiece tokenizer (which writes a space first).
            None => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.tokenizer.encodes_fragments_exactly()
    }
}
