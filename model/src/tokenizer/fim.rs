//! A code model's fill-in-the-middle tokens, and the prompt that asks it for the text between a
//! prefix and a suffix: `[prefix token]prefix[suffix token]suffix[middle token]`, the model then
//! writing the middle (the "PSM" order every FIM-trained family here was trained on). With
//! context files or a repository name, Qwen2.5-Coder's repository format goes before it where the
//! vocabulary has its tokens: `[repo token]name\n`, then `[file token]path\ntext` for each file,
//! then `[file token]path\n` of the file being edited.

use super::{Tokenizer, TokenizerError};

/// The tokens, found by their text in the vocabulary. The spellings are the families' own, as
/// llama.cpp's vocabulary loader knows them: Qwen2.5-Coder's `<|fim_prefix|>`, StarCoder's
/// `<fim-prefix>`, Granite's `<fim_prefix>`, DeepSeek-Coder's `<｜fim▁begin｜>`, CodeLlama's `<PRE>`
/// (`▁<PRE>` in its SentencePiece vocabulary), GLM-4.5's `<|code_prefix|>`, Falcon-H1's
/// `<|prefix|>`, and the same for the others.
const PREFIX: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const SUFFIX: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const MIDDLE: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
/// Tokens that end a middle where the model writes them (with its end-of-sequence tokens).
const PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>"];
const REPO: &[&str] = &["<|repo_name|>", "<|fim_repo|>", "<fim-repo>", "<reponame>"];
const FILE: &[&str] = &["<|file_sep|>"];

/// The repository name of a prompt with context files whose request names none (llama.cpp's).
pub const FIM_DEFAULT_REPO: &str = "myproject";
/// The path of the file being edited where the request names none (llama.cpp's).
pub const FIM_DEFAULT_PATH: &str = "filename";

/// The fill-in-the-middle tokens of a vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FimTokens {
    pub prefix: u32,
    pub suffix: u32,
    pub middle: u32,
    pub pad: Option<u32>,
    /// Qwen2.5-Coder's repository-level tokens: the repository's name, a file's path.
    pub repo: Option<u32>,
    pub file: Option<u32>,
}

/// A file of context for a fill-in-the-middle prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FimFile {
    pub path: String,
    pub text: String,
}

/// A fill-in-the-middle prompt as text: the text before the cursor, the text after it, and
/// optionally other files of the project as context.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Infill {
    pub prefix: String,
    pub suffix: String,
    /// Files of the project, oldest first: as many as fit the budget, the last ones kept
    /// (whole files).
    pub files: Vec<FimFile>,
    /// The repository's name and the edited file's path, written in Qwen2.5-Coder's repository
    /// format before the prompt where there are context files or a name (default
    /// [`FIM_DEFAULT_REPO`] and [`FIM_DEFAULT_PATH`], as llama.cpp's).
    pub repo: Option<String>,
    pub path: Option<String>,
}

impl Infill {
    pub fn new(prefix: impl Into<String>, suffix: impl Into<String>) -> Self {
        Self { prefix: prefix.into(), suffix: suffix.into(), ..Self::default() }
    }

    /// Adds a context file (after those added before).
    pub fn file(mut self, path: impl Into<String>, text: impl Into<String>) -> Self {
        self.files.push(FimFile { path: path.into(), text: text.into() });
        self
    }
}

/// A fill-in-the-middle prompt as token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FimPrompt {
    pub ids: Vec<u32>,
    /// Context files left out for the budget (the first ones).
    pub files_left_out: usize,
}

impl FimTokens {
    /// The vocabulary's tokens, if it has the three a prompt needs.
    pub fn of(tokenizer: &Tokenizer) -> Option<Self> {
        let find = |spellings: &[&str]| spellings.iter().find_map(|s| tokenizer.token_to_id(s));
        Some(Self {
            prefix: find(PREFIX)?,
            suffix: find(SUFFIX)?,
            middle: find(MIDDLE)?,
            pad: find(PAD),
            repo: find(REPO),
            file: find(FILE),
        })
    }

    /// The tokens besides end-of-sequence that end a middle: the padding and the repository
    /// format's, which begin another file.
    pub fn stops(&self) -> Vec<u32> {
        [self.pad, self.repo, self.file].into_iter().flatten().collect()
    }

    /// The prompt of `infill`, within `budget` tokens: the prefix, suffix and tags always (their
    /// length may pass the budget, which the caller then refuses as any prompt too long), then
    /// as many context files as fit, the last ones kept. Text is encoded as prompts' text is
    /// (special tokens written in it become their ids), with the BOS the tokenizer adds to an
    /// input, if any, first.
    pub fn prompt(&self, tokenizer: &Tokenizer, infill: &Infill, budget: usize) -> Result<FimPrompt, TokenizerError> {
        let mut ids = tokenizer.encode_prompt("")?;
        let mut fim = vec![self.prefix];
        fim.extend(tokenizer.encode(&infill.prefix)?);
        fim.push(self.suffix);
        fim.extend(tokenizer.encode(&infill.suffix)?);
        fim.push(self.middle);
        if infill.files.is_empty() && infill.repo.is_none() {
            ids.extend(fim);
            return Ok(FimPrompt { ids, files_left_out: 0 });
        }
        // The repository's name and the edited file's path as Qwen2.5-Coder's format has them;
        // without its tokens, files are separated by a line that says so.
        let repository = self.repo.zip(self.file);
        // `[token]name\n`: the repository's, a file's.
        let named = |token: u32, name: &str| -> Result<Vec<u32>, TokenizerError> {
            let mut ids = vec![token];
            ids.extend(tokenizer.encode(&format!("{name}\n"))?);
            Ok(ids)
        };
        let (head, tail) = match repository {
            Some((repo, file)) => (
                named(repo, infill.repo.as_deref().unwrap_or(FIM_DEFAULT_REPO))?,
                named(file, infill.path.as_deref().unwrap_or(FIM_DEFAULT_PATH))?,
            ),
            None => (vec![], vec![]),
        };
        let mut files = Vec::with_capacity(infill.files.len());
        for f in &infill.files {
            let mut chunk = match repository {
                Some((_, file)) => named(file, &f.path)?,
                None => tokenizer.encode(&format!("\n\n--- {} ---\n\n", f.path))?,
            };
            chunk.extend(tokenizer.encode(&f.text)?);
            files.push(chunk);
        }
        let mut room = budget.saturating_sub(ids.len() + fim.len() + head.len() + tail.len());
        let mut kept = 0;
        for chunk in files.iter().rev() {
            if chunk.len() > room {
                break;
            }
            room -= chunk.len();
            kept += 1;
        }
        let files_left_out = files.len() - kept;
        ids.extend(head);
        for chunk in &files[files_left_out..] {
            ids.extend_from_slice(chunk);
        }
        ids.extend(tail);
        ids.extend(fim);
        Ok(FimPrompt { ids, files_left_out })
    }
}
