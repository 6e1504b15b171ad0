//! `POST /v1/embeddings` (OpenAI's shape: text, token-id or list input, `dimensions`,
//! `encoding_format` float or base64; extensions `pooling` and `truncate`) and `POST /v1/rerank`
//! (also `/rerank`; Jina's and Cohere's shape as vLLM serves it): documents scored against the
//! query by a yes/no reranker's own judgement (extension `instruction`), or by the cosine of
//! their embeddings with any other model.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use llaisys_actors::{EmbedRequest, Embeddings, Pooling, Prompt as EnginePrompt, RerankRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{ApiError, ErrorShape};
use super::openai::{Prompt, parse};
use super::{AppState, Body413, ModelEntry, json_response, with_model};

#[derive(Debug, Deserialize)]
struct EmbeddingsIn {
    model: String,
    input: Prompt,
    encoding_format: Option<String>,
    dimensions: Option<i64>,
    pooling: Option<String>,
    #[serde(default)]
    truncate: bool,
}

#[derive(Debug, Deserialize)]
struct RerankIn {
    model: String,
    query: String,
    documents: Vec<Document>,
    top_n: Option<usize>,
    return_documents: Option<bool>,
    /// What relevance means (a yes/no reranker's instruction; default its trained one).
    instruction: Option<String>,
}

/// A document: its text, or `{"text": ...}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn text(&self) -> &str {
        match self {
            Document::Text(t) | Document::Object { text: t } => t,
        }
    }
}

/// Embeds `request` with `model` once admitted.
pub async fn embed(state: &Arc<AppState>, model: &ModelEntry, request: &EmbedRequest) -> Result<Embeddings, ApiError> {
    let _permit = state.admit(0).await?;
    let start = std::time::Instant::now();
    let embeddings = model.engine.embed(request).await?;
    state.metrics.embedded(&model.name, request.inputs.len(), embeddings.prompt_tokens, start.elapsed());
    Ok(embeddings)
}

/// `pooling` by name.
pub fn pooling(name: Option<&str>) -> Result<Option<Pooling>, ApiError> {
    name.map(|n| {
        Pooling::parse(n).ok_or_else(|| ApiError::invalid("pooling", format!("{n:?} is not a pooling (last, mean)")))
    })
    .transpose()
}

pub async fn embeddings(State(state): State<Arc<AppState>>, body: Result<Body413, ApiError>) -> Response {
    let answer = async || {
        let req: EmbeddingsIn = parse(&body?.0)?;
        let model = state.model(&req.model)?;
        let inputs: Vec<EnginePrompt> = match req.input {
            Prompt::Text(t) => vec![t.into()],
            Prompt::Texts(ts) => ts.into_iter().map(EnginePrompt::from).collect(),
            Prompt::Ids(ids) => vec![ids.into()],
            Prompt::IdLists(lists) => lists.into_iter().map(EnginePrompt::from).collect(),
        };
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("{other:?} is not an encoding (float, base64)"),
                ));
            }
        };
        let dimensions = match req.dimensions {
            Some(d) if d < 1 => {
                return Err(ApiError::invalid("dimensions", format!("dimensions must be at least 1, got {d}")));
            }
            d => d.map(|d| d as usize),
        };
        let request =
            EmbedRequest { inputs, pooling: pooling(req.pooling.as_deref())?, dimensions, truncate: req.truncate };
        let embeddings = embed(&state, &model, &request).await?;
        let data: Vec<Value> = (embeddings.vectors.iter().enumerate())
            .map(|(i, v)| {
                let embedding = if base64 { json!(base64_f32(v)) } else { json!(v) };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        let tokens = embeddings.prompt_tokens;
        let body = json!({
            "object": "list",
            "data": data,
            "model": model.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        });
        Ok(with_model(json_response(StatusCode::OK, &body), &model.name))
    };
    answer().await.unwrap_or_else(|e| e.response_in(ErrorShape::OpenAi))
}

pub async fn rerank(State(state): State<Arc<AppState>>, body: Result<Body413, ApiError>) -> Response {
    let answer = async || {
        let req: RerankIn = parse(&body?.0)?;
        let model = state.model(&req.model)?;
        if req.documents.is_empty() {
            return Err(ApiError::invalid("documents", "give at least one document"));
        }
        let (mut scored, tokens): (Vec<(usize, f32)>, usize) =
            if model.engine.frontend().text().is_some_and(|t| t.judges()) {
                let documents = req.documents.iter().map(|d| d.text().to_string()).collect();
                let request =
                    RerankRequest { query: req.query.clone(), documents, instruction: req.instruction.clone() };
                let _permit = state.admit(0).await?;
                let start = std::time::Instant::now();
                let scores = model.engine.rerank(&request).await?;
                state.metrics.embedded(&model.name, req.documents.len(), scores.prompt_tokens, start.elapsed());
                (scores.scores.into_iter().enumerate().collect(), scores.prompt_tokens)
            } else {
                let mut inputs = vec![EnginePrompt::from(req.query.as_str())];
                inputs.extend(req.documents.iter().map(|d| EnginePrompt::from(d.text())));
                let embeddings = embed(&state, &model, &EmbedRequest::new(inputs)).await?;
                let (query, documents) = embeddings.vectors.split_first().expect("the query's embedding");
                let cosine = |d: &Vec<f32>| query.iter().zip(d).map(|(a, b)| a * b).sum::<f32>();
                (documents.iter().map(cosine).enumerate().collect(), embeddings.prompt_tokens)
            };
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(req.top_n.unwrap_or(scored.len()));
        let results: Vec<Value> = scored
            .iter()
            .map(|&(i, score)| {
                let mut result = json!({"index": i, "relevance_score": score});
                if req.return_documents.unwrap_or(true) {
                    result["document"] = json!({"text": req.documents[i].text()});
                }
                result
            })
            .collect();
        let body = json!({
            "id": format!("rerank-{}", super::unix_now()),
            "model": model.name,
            "usage": {"total_tokens": tokens},
            "results": results,
        });
        Ok(with_model(json_response(StatusCode::OK, &body), &model.name))
    };
    answer().await.unwrap_or_else(|e| e.response_in(ErrorShape::OpenAi))
}

/// The vector's little-endian f32 bytes in standard base64 (OpenAI's `encoding_format: base64`).
fn base64_f32(v: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        assert_eq!(super::base64_f32(&[]), "");
        // 1.0f32 is 00 00 80 3f.
        assert_eq!(super::base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(super::base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
    }
}
