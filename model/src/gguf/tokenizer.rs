//! The tokenizer and chat template a GGUF file carries (`tokenizer.ggml.*`,
//! `tokenizer.chat_template`), rebuilt as the Hugging Face tokenizer they were converted from,
//! so that it gives llama.cpp's ids:
//!
//! - `tokenizer.ggml.model` `gpt2`: byte-level BPE over `tokens` and `merges`, under the
//!   pre-tokenizer `tokenizer.ggml.pre` names (Qwen2's: NFC, its split regex; Llama 3's
//!   `llama-bpe` and Mistral Nemo's `tekken`: their split regexes, whole pieces that are tokens
//!   kept whole; cl100k's `dbrx` (Phi-4's) and o200k's `gpt-4o` (Phi-4-mini's): theirs; the
//!   StarCoder family's `refact` (Granite 3's): each digit apart, then GPT-2's split; DeepSeek's
//!   `deepseek-v3`, `deepseek-llm` and `deepseek-coder`: their chains of splits).
//! - `llama`: SentencePiece BPE (Llama 2, Mistral 7B): `tokens` merged pairwise, the pair whose
//!   piece has the highest of `scores` first, as llama.cpp and sentencepiece do (Hugging Face's
//!   conversion: every split of a piece into two pieces is a merge, ranked by the piece's
//!   score); spaces as `▁`, and one written before each text between special tokens (llama.cpp's
//!   `add_space_prefix`, Hugging Face's legacy Llama tokenizer); characters no piece holds as
//!   their bytes' `<0xXX>` pieces.
//!
//! Either way the control (type 3) and user-defined (type 4) tokens are added tokens, matched in
//! text first, and a BOS token goes before each prompt when `tokenizer.ggml.add_bos_token` says
//! so (when it is missing: as llama.cpp decides, for SentencePiece, Llama 3 and Tekken files).
//! Unused (type 5) tokens only pad the vocabulary to the embedding's rows and are left out, as
//! the Hugging Face tokenizer has no such tokens.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::GgufFile;
use crate::error::LoadError;
use crate::tokenizer::{ChatTemplate, SPM_SPACE as SPACE, Tokenizer};

/// How a `tokenizer.ggml.pre` splits and merges, as its tokenizer.json does.
struct PreTokenizer {
    /// The `tokenizer.ggml.pre` values that name it: its own first, then those llama.cpp treats
    /// as the same (`llama-vocab.cpp`: DeepSeek-R1-Distill-Qwen's files say `deepseek-r1-qwen`,
    /// older Llama 3 files `llama3` or `llama-v3`; Falcon 3's, Pixtral's and Mi:dm 2.0's files,
    /// `llama` all, `falcon3`, `pixtral` and `midm-2.0`).
    names: &'static [&'static str],
    /// The split patterns, applied in turn to the pieces of the one before (one for most; the
    /// StarCoder family's isolates each digit first). Numbers are one digit a piece for Qwen2, up
    /// to three for Llama 3.
    splits: &'static [&'static str],
    /// Normalised to NFC first (Qwen2's; Llama 3's has no normaliser).
    nfc: bool,
    /// A piece that is itself a token is that token, whatever the merges would make of it
    /// (Llama 3's `ignore_merges`: " Việt" is one token there, four by its merges).
    ignore_merges: bool,
    /// A BOS token before each prompt when the file does not say (llama.cpp's default for it).
    add_bos: bool,
}

/// Llama 3's split (and cl100k's): contractions, words, numbers up to three digits a piece.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-2's split (its byte-level pre-tokenizer's): contractions, words and numbers with a space
/// before them, other runs, and whitespace.
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

const PRE_TOKENIZERS: [PreTokenizer; 11] = [
    PreTokenizer {
        names: &["qwen2", "deepseek-r1-qwen"],
        splits: &[
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        nfc: true,
        ignore_merges: false,
        add_bos: false,
    },
    // Qwen3.5's: Qwen2's with combining marks (\p{M}) kept with the letters before them, and no
    // NFC (llama.cpp's vocabulary test: "e\u{301}" is two tokens).
    PreTokenizer {
        names: &["qwen35"],
        splits: &[
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizer {
        names: &["llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral", "midm-2.0"],
        splits: &[LLAMA3_SPLIT],
        nfc: false,
        ignore_merges: true,
        add_bos: true,
    },
    // cl100k's (`dbrx`: DBRX's and Phi-4's, whose vocabulary is the same; `smaug-bpe`): Llama 3's
    // split without its whole-piece rule or BOS (llama.cpp's reading).
    PreTokenizer {
        names: &["dbrx", "smaug-bpe"],
        splits: &[LLAMA3_SPLIT],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    // GLM-4's and GLM-4.5's (`glm4`; `glm5`): Llama 3's split and whole-piece rule, no BOS (its
    // chat template writes `[gMASK]<sop>`).
    PreTokenizer { names: &["glm4", "glm5"], splits: &[LLAMA3_SPLIT], nfc: false, ignore_merges: true, add_bos: false },
    // OpenAI's o200k (`gpt-4o`: Phi-4-mini's; Llama 4's `llama4`): Tekken's words with English
    // contractions kept on them, numbers up to three digits a piece.
    PreTokenizer {
        names: &["gpt-4o", "llama4"],
        splits: &[
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    // Mistral Nemo's and later Mistral models' (Tekken): a word is a run of capitals then of
    // lower-case letters, or the other way round; numbers one digit a piece.
    PreTokenizer {
        names: &["tekken"],
        splits: &[
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        nfc: false,
        ignore_merges: true,
        add_bos: true,
    },
    // The StarCoder family's (`refact`, `starcoder`: Granite 3's): each digit a piece of its own,
    // then GPT-2's split over the rest.
    PreTokenizer {
        names: &["refact", "starcoder"],
        splits: &[r"\p{N}", GPT2_SPLIT],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    // DeepSeek V3's and R1's (`deepseek-v3`): numbers up to three digits a piece and runs of CJK
    // ideographs and kana apart first; then an ASCII punctuation mark kept on the ASCII letters
    // after it, words with their combining marks, runs of punctuation and symbols.
    PreTokenizer {
        names: &["deepseek-v3"],
        splits: &[
            r"\p{N}{1,3}",
            r"[一-龥぀-ゟ゠-ヿ]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
        ],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    // DeepSeek LLM's and V2's (`deepseek-llm`): each line break apart, then runs of the letters of
    // cased scripts (a space before them kept), of ASCII and full-width punctuation, trailing
    // whitespace, CJK and Hangul, and whole numbers.
    PreTokenizer {
        names: &["deepseek-llm"],
        splits: &[
            r"[\r\n]",
            r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            r"\s?[!-/:-~！-／：-～‘-‟\x{3000}-。]+",
            r"\s+$",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        ],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    // DeepSeek Coder's (`deepseek-coder`): each line break apart, then runs of letters and of
    // punctuation (a space before them kept), CJK and Hangul, and each digit.
    PreTokenizer {
        names: &["deepseek-coder"],
        splits: &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
];

/// ggml's token types.
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const UNUSED: i64 = 5;
const NORMAL: i64 = 1;

/// The file's tokenizer.
pub fn tokenizer(file: &GgufFile) -> Result<Tokenizer, LoadError> {
    let bad = |reason: String| file.error(format!("tokenizer: {reason}"));
    let tokens = strings(file, "tokenizer.ggml.tokens")?;
    let types: Vec<i64> = match file.get("tokenizer.ggml.token_type").and_then(|v| v.as_array()) {
        None => vec![NORMAL; tokens.len()],
        Some(a) => a
            .iter()
            .map(|v| v.as_i64().ok_or_else(|| bad("token_type holds a non-integer".into())))
            .collect::<Result<_, _>>()?,
    };
    if types.len() != tokens.len() {
        return Err(bad(format!("{} tokens but {} token types", tokens.len(), types.len())));
    }
    // Added tokens stay in the model's vocabulary too, so they keep the file's ids wherever
    // they lie (the added vocabulary takes a token's id from the model when it is there).
    let vocab: Vocab = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, ty))| **ty != UNUSED)
        .map(|(i, (t, _))| (t.clone(), i as u32))
        .collect();
    let model = file.get("tokenizer.ggml.model").and_then(|v| v.as_str());
    let (mut inner, add_bos) = match model {
        Some("gpt2") => byte_level_bpe(file, vocab)?,
        Some("llama") => sentencepiece(file, vocab, &tokens, &types)?,
        _ => {
            return Err(bad(format!(
                "tokenizer.ggml.model is {model:?}; byte-level BPE (\"gpt2\") and SentencePiece BPE (\"llama\") load"
            )));
        }
    };
    let added = |kinds: &[i64], special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(&types)
            .filter(|(_, ty)| kinds.contains(ty))
            .map(|(t, _)| AddedToken::from(t.clone(), special).normalized(false))
            .collect()
    };
    inner.add_special_tokens(&added(&[CONTROL, UNKNOWN], true));
    inner.add_tokens(&added(&[USER_DEFINED], false));
    if file.get("tokenizer.ggml.add_bos_token").and_then(|v| v.as_bool()).unwrap_or(add_bos) {
        let id = file.get("tokenizer.ggml.bos_token_id").and_then(|v| v.as_u64());
        let bos = id.and_then(|id| tokens.get(id as usize).map(|t| (t.clone(), id as u32)));
        let (bos, id) = bos.ok_or_else(|| bad("add_bos_token is set but bos_token_id names no token".into()))?;
        let template = TemplateProcessing::builder()
            .try_single(vec![bos.clone(), "$A".into()])
            .and_then(|t| t.try_pair(vec![bos.clone(), "$A".into(), format!("{bos}:1"), "$B:1".into()]))
            .map_err(|e| bad(e.to_string()))?
            .special_tokens(vec![(bos, id)])
            .build()
            .map_err(|e| bad(e.to_string()))?;
        inner.with_post_processor(Some(template));
    }
    Ok(Tokenizer::from_inner(inner))
}

/// Byte-level BPE (`gpt2`) under the file's pre-tokenizer; with whether it adds a BOS token by
/// default.
fn byte_level_bpe(file: &GgufFile, vocab: Vocab) -> Result<(tokenizers::Tokenizer, bool), LoadError> {
    let bad = |reason: String| file.error(format!("tokenizer: {reason}"));
    let family = crate::gguf::family(file);
    let pre = match file.get("tokenizer.ggml.pre").and_then(|v| v.as_str()) {
        Some(pre) => pre.to_string(),
        None => {
            // The family's own; Qwen2's for a file of no family we serve (its tokenizer alone).
            let pre = family.map_or("qwen2", |f| f.gguf_pre[0]);
            tracing::warn!("{}: no tokenizer.ggml.pre; using the `{pre}` pre-tokenizer", file.path().display());
            pre.to_string()
        }
    };
    let Some(pre) = PRE_TOKENIZERS.iter().find(|p| p.names.contains(&pre.as_str())) else {
        let known = PRE_TOKENIZERS.map(|p| p.names.join(", ")).join(", ");
        return Err(bad(format!("tokenizer.ggml.pre `{pre}` is not supported ({known})")));
    };
    let merges = strings(file, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| bad(format!("merge `{m}` has no space")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| bad(e.to_string()))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let mut steps = Vec::with_capacity(pre.splits.len() + 1);
    for &pattern in pre.splits {
        let split = Split::new(SplitPattern::Regex(pattern.into()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| bad(e.to_string()))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    if pre.nfc {
        inner.with_normalizer(Some(NFC));
    }
    inner.with_pre_tokenizer(Some(Sequence::new(steps)));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok((inner, pre.add_bos))
}

/// SentencePiece BPE (`llama`): merges from the pieces' scores, `▁` for spaces, byte fallback;
/// it adds a BOS token by default.
fn sentencepiece(
    file: &GgufFile,
    vocab: Vocab,
    tokens: &[String],
    types: &[i64],
) -> Result<(tokenizers::Tokenizer, bool), LoadError> {
    let bad = |reason: String| file.error(format!("tokenizer: {reason}"));
    let scores: Vec<f32> = file
        .get("tokenizer.ggml.scores")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("tokenizer.ggml.scores: missing, or not an array".into()))?
        .iter()
        .map(|v| v.as_f64().map(|x| x as f32).ok_or_else(|| bad("tokenizer.ggml.scores holds a non-number".into())))
        .collect::<Result<_, _>>()?;
    if scores.len() != tokens.len() {
        return Err(bad(format!("{} tokens but {} scores", tokens.len(), scores.len())));
    }
    // Every split of a normal piece into two pieces merges into it; the higher the piece's
    // score, the sooner (ties: the piece's id, then the halves' ids).
    let mut merges: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if types[id] != NORMAL {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                merges.push((scores[id], id as u32, l, r));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3))));
    let merges =
        merges.into_iter().map(|(_, _, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone())).collect();
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = tokens.iter().zip(types).find(|(_, ty)| **ty == UNKNOWN) {
        builder = builder.unk_token(unk.0.clone());
    }
    let mut inner = tokenizers::Tokenizer::new(builder.build().map_err(|e| bad(e.to_string()))?);
    let space_prefix = file.get("tokenizer.ggml.add_space_prefix").and_then(|v| v.as_bool()).unwrap_or(true);
    let replace = Replace::new(" ", SPACE).map_err(|e| bad(e.to_string()))?;
    let mut normalizers = vec![replace.into()];
    let mut decoders = vec![
        Replace::new(SPACE, " ").map_err(|e| bad(e.to_string()))?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if space_prefix {
        normalizers.insert(0, Prepend::new(SPACE.into()).into());
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok((inner, true))
}

/// The file's chat template, `None` if it has none.
pub fn chat_template(file: &GgufFile) -> Result<Option<ChatTemplate>, LoadError> {
    let Some(source) = file.get("tokenizer.chat_template") else { return Ok(None) };
    let source = source.as_str().ok_or_else(|| file.error("tokenizer.chat_template is not a string"))?;
    let token = |key: &str| -> String {
        let id = file.get(key).and_then(|v| v.as_u64());
        let tokens = file.get("tokenizer.ggml.tokens").and_then(|v| v.as_array());
        id.and_then(|id| tokens?.get(id as usize)?.as_str().map(str::to_owned)).unwrap_or_default()
    };
    ChatTemplate::new(source.to_string(), token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"))
        .map(Some)
        .map_err(|e| file.error(format!("tokenizer.chat_template: {e}")))
}

fn strings(file: &GgufFile, key: &str) -> Result<Vec<String>, LoadError> {
    let items = file
        .get(key)
        .and_then(|v| v.as_array())
        .ok_or_else(|| file.error(format!("{key}: missing, or not an array")))?;
    items
        .iter()
        .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| file.error(format!("{key} holds a non-string"))))
        .collect()
}
