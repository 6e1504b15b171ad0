//! Embeddings: inputs (text or token ids) run through the model for their final hidden states,
//! pooled (the last token or the mean), then truncated and L2-normalised. They run as
//! prefill-only work on a worker, between its steps, with a scratch cache: no KV cell is kept
//! and running requests keep theirs.

use llaisys_model::Pooling;

use super::request::{Prompt, RequestError};

/// An embedding request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EmbedRequest {
    pub inputs: Vec<Prompt>,
    /// How the hidden states pool; default: the model's own (its files say, else the last token).
    pub pooling: Option<Pooling>,
    /// Keep the first this many dimensions (then normalise), as Matryoshka-trained models allow.
    pub dimensions: Option<usize>,
    /// Cut inputs longer than the context to its length instead of refusing them.
    pub truncate: bool,
}

impl EmbedRequest {
    pub fn new(inputs: Vec<Prompt>) -> Self {
        Self { inputs, ..Self::default() }
    }

    pub fn pooling(mut self, pooling: Pooling) -> Self {
        self.pooling = Some(pooling);
        self
    }
}

/// The embeddings of a request, in input order, each L2-normalised.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    /// Tokens embedded, over all inputs.
    pub prompt_tokens: usize,
}

/// A checked embedding request: token ids within the model's vocabulary and context.
#[derive(Debug, Clone)]
pub struct ValidEmbed {
    pub(crate) inputs: Vec<Vec<u32>>,
    pub(crate) pooling: Pooling,
    pub(crate) dimensions: Option<usize>,
}

impl ValidEmbed {
    pub fn inputs(&self) -> &[Vec<u32>] {
        &self.inputs
    }

    /// Truncates to the requested dimensions and L2-normalises each pooled vector.
    pub(crate) fn finish(&self, pooled: Vec<Vec<f32>>) -> Embeddings {
        let vectors = pooled
            .into_iter()
            .map(|mut v| {
                if let Some(d) = self.dimensions {
                    v.truncate(d);
                }
                let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
                if norm > 0.0 {
                    v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
                }
                v
            })
            .collect();
        Embeddings { vectors, prompt_tokens: self.inputs.iter().map(Vec::len).sum() }
    }
}

/// Checks the inputs of an embedding request (already tokenized): one at least, none empty,
/// ids in the vocabulary, lengths within the context (or cut to it).
pub(crate) fn check(
    request: &EmbedRequest,
    inputs: Vec<Vec<u32>>,
    vocab: usize,
    context: usize,
    hidden: usize,
    default_pooling: Pooling,
) -> Result<ValidEmbed, RequestError> {
    if inputs.is_empty() {
        return Err(RequestError::invalid("input", "give at least one input"));
    }
    let mut checked = Vec::with_capacity(inputs.len());
    for (i, mut ids) in inputs.into_iter().enumerate() {
        if ids.is_empty() {
            return Err(RequestError::invalid("input", format!("input {i} is empty")));
        }
        if let Some(bad) = ids.iter().find(|t| **t as usize >= vocab) {
            return Err(RequestError::invalid(
                "input",
                format!("input {i}: token id {bad} is not below the vocabulary size {vocab}"),
            ));
        }
        if ids.len() > context {
            if !request.truncate {
                let msg = format!("input {i} has {} tokens; the model's context is {context}", ids.len());
                return Err(RequestError::invalid("input", msg).with_code("context_length_exceeded"));
            }
            ids.truncate(context);
        }
        checked.push(ids);
    }
    if let Some(d) = request.dimensions
        && !(1..=hidden).contains(&d)
    {
        return Err(RequestError::invalid("dimensions", format!("dimensions must be in [1, {hidden}], got {d}")));
    }
    Ok(ValidEmbed {
        inputs: checked,
        pooling: request.pooling.unwrap_or(default_pooling),
        dimensions: request.dimensions,
    })
}
