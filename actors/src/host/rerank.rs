//! Reranking by a yes/no reranker (Qwen3-Reranker): the model reads each document with the
//! query in its own judging prompt, and the document's score is the probability that the next
//! token is "yes" rather than "no", σ(logit(yes) − logit(no)). The prompts run as prefill-only
//! work, batched like embeddings. A model is such a reranker when the engine is told so
//! ([`Reranker::YesNo`]), or by default when its path names it a reranker and "yes" and "no"
//! are single tokens of its vocabulary.

use std::path::Path;

use super::request::RequestError;
use super::text::ModelText;

/// How a model reranks, set when the engine is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reranker {
    /// The yes/no judge when the model's path names a reranker (`Qwen3-Reranker-0.6B`) and its
    /// vocabulary has the two tokens; otherwise none.
    #[default]
    Auto,
    /// The yes/no judge; a vocabulary without single "yes" and "no" tokens is refused at build.
    YesNo,
    /// None: the model judges nothing (a server reranks with its embeddings).
    Off,
}

impl Reranker {
    /// From its setting's name: `auto`, `yes_no`, `off`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "yes_no" => Some(Self::YesNo),
            "off" => Some(Self::Off),
            _ => None,
        }
    }

    /// The judge's tokens for the model at `path` with `text`: `Err` names what is missing
    /// when the judge was asked for.
    pub(crate) fn resolve(self, path: Option<&Path>, text: &ModelText) -> Result<Option<YesNo>, String> {
        let tokens = YesNo::of(text);
        match self {
            Self::Off => Ok(None),
            Self::YesNo => tokens.map(Some).ok_or_else(|| {
                "a yes/no reranker needs \"yes\" and \"no\" as single tokens of its vocabulary".to_string()
            }),
            Self::Auto => {
                let named = path.is_some_and(|p| p.to_string_lossy().to_lowercase().contains("reranker"));
                Ok(tokens.filter(|_| named))
            }
        }
    }
}

/// A yes/no reranker's two tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YesNo {
    pub yes: u32,
    pub no: u32,
}

impl YesNo {
    fn of(text: &ModelText) -> Option<Self> {
        let single = |word: &str| match text.tokenizer().encode(word).ok()?[..] {
            [id] => Some(id),
            _ => None,
        };
        Some(Self { yes: single("yes")?, no: single("no")? })
    }
}

/// What Qwen3-Reranker is trained to be asked, when the request gives no instruction.
pub const DEFAULT_INSTRUCTION: &str = "Given a web search query, retrieve relevant passages that answer the query";

/// Documents to score against a query.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RerankRequest {
    pub query: String,
    pub documents: Vec<String>,
    /// What relevance means here (default [`DEFAULT_INSTRUCTION`]).
    pub instruction: Option<String>,
}

impl RerankRequest {
    pub fn new(query: impl Into<String>, documents: Vec<String>) -> Self {
        Self { query: query.into(), documents, instruction: None }
    }
}

/// Each document's score in [0, 1], in request order.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    pub scores: Vec<f32>,
    /// Tokens read, over all the judging prompts.
    pub prompt_tokens: usize,
}

/// A checked rerank request: one judging prompt per document, each within the context.
#[derive(Debug, Clone)]
pub struct ValidRerank {
    pub(crate) inputs: Vec<Vec<u32>>,
    pub(crate) judge: YesNo,
}

impl ValidRerank {
    pub fn inputs(&self) -> &[Vec<u32>] {
        &self.inputs
    }

    /// The scores from each prompt's logits of `[no, yes]`.
    pub(crate) fn finish(&self, logits: Vec<Vec<f32>>) -> Scores {
        let scores = logits
            .iter()
            .map(|l| {
                let margin = f64::from(l[1]) - f64::from(l[0]);
                (1.0 / (1.0 + (-margin).exp())) as f32
            })
            .collect();
        Scores { scores, prompt_tokens: self.inputs.iter().map(Vec::len).sum() }
    }
}

/// The judging prompt of one document, as Qwen3-Reranker's model card writes it (its chat
/// format, thinking closed, the answer next).
pub(crate) fn prompt(instruction: &str, query: &str, document: &str) -> String {
    format!(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the \
         Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n\
         <Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n\
         <|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
}

/// Checks a request and tokenizes its prompts; `context`: the model's.
pub(crate) fn check(
    request: &RerankRequest,
    text: &ModelText,
    judge: YesNo,
    context: usize,
) -> Result<ValidRerank, RequestError> {
    if request.documents.is_empty() {
        return Err(RequestError::invalid("documents", "give at least one document"));
    }
    let instruction = request.instruction.as_deref().unwrap_or(DEFAULT_INSTRUCTION);
    let mut inputs = Vec::with_capacity(request.documents.len());
    for (i, document) in request.documents.iter().enumerate() {
        let ids = text
            .tokenizer()
            .encode(&prompt(instruction, &request.query, document))
            .map_err(|e| RequestError::invalid("documents", format!("document {i}: {e}")))?;
        if ids.len() > context {
            let msg = format!("document {i} with the query is {} tokens; the model's context is {context}", ids.len());
            return Err(RequestError::invalid("documents", msg).with_code("context_length_exceeded"));
        }
        inputs.push(ids);
    }
    Ok(ValidRerank { inputs, judge })
}
