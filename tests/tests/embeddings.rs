//! Embeddings and rerank over HTTP: `/v1/embeddings` against transformers' float64 reference
//! (`embeddings.json` of the fixture), the same vector alone or in a batch, base64, dimensions,
//! Ollama's `/api/embed`, `/v1/rerank` in the reference's order, errors, and embeddings running
//! beside a generation without disturbing it.

use base64_check::decode;
use llaisys_tests::{FixtureCopy, fixture_dir};
use serde_json::{Value, json};

mod common;
use common::{post, server_for};

const FIXTURE: &str = "tiny-untied-f32";

/// Standard base64 back to bytes (the test's own decoder).
mod base64_check {
    pub fn decode(text: &str) -> Vec<u8> {
        let value = |c: u8| match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        };
        let mut out = Vec::new();
        for chunk in text.as_bytes().chunks(4) {
            let digits: Vec<u8> = chunk.iter().filter(|c| **c != b'=').map(|c| value(*c)).collect();
            let n = digits.iter().fold(0u32, |n, d| (n << 6) | u32::from(*d)) << (6 * (4 - digits.len()));
            out.extend(&n.to_be_bytes()[1..digits.len()]);
        }
        out
    }
}

fn reference() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture_dir(FIXTURE).join("embeddings.json")).unwrap()).unwrap()
}

fn vector(v: &Value) -> Vec<f64> {
    v.as_array().unwrap_or_else(|| panic!("not a vector: {v}")).iter().map(|x| x.as_f64().unwrap()).collect()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_match_the_float64_reference_batched_or_not_in_every_encoding() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let reference = reference();
    let inputs = reference["inputs"].as_array().unwrap();
    let texts: Vec<&str> = inputs.iter().map(|i| i["text"].as_str().unwrap()).collect();
    for pooling in ["last", "mean"] {
        let (status, r) =
            post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": texts, "pooling": pooling})).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["object"], "list");
        let tokens: usize = inputs.iter().map(|i| i["ids"].as_array().unwrap().len()).sum();
        assert_eq!(r["usage"]["prompt_tokens"].as_u64(), Some(tokens as u64));
        for (i, (got, want)) in r["data"].as_array().unwrap().iter().zip(inputs).enumerate() {
            assert_eq!((got["index"].as_u64(), &got["object"]), (Some(i as u64), &json!("embedding")));
            let err = max_diff(&vector(&got["embedding"]), &vector(&want[pooling]));
            assert!(err < 1e-4, "{pooling} input {i}: {err}");
        }
    }
    // Token ids give the same vectors as the text; the default pooling is the last token's.
    let ids = &inputs[0]["ids"];
    let (_, by_ids) = post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": ids})).await;
    assert!(max_diff(&vector(&by_ids["data"][0]["embedding"]), &vector(&inputs[0]["last"])) < 1e-4);

    // Alone and in a batch of 16, the same within 1e-5.
    let sixteen: Vec<String> = (0..16).map(|i| format!("document number {i} {}", "word ".repeat(i))).collect();
    let (_, batch) = post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": sixteen})).await;
    for (i, text) in sixteen.iter().enumerate() {
        let (_, alone) = post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": text})).await;
        let err = max_diff(&vector(&alone["data"][0]["embedding"]), &vector(&batch["data"][i]["embedding"]));
        assert!(err < 1e-5, "input {i}: alone and in a batch differ by {err}");
    }

    // Past one batch's tokens (2,048) the inputs run in several batches, with the same result.
    let long: Vec<String> = (0..20).map(|i| format!("{i} {}", "word ".repeat(100))).collect();
    let (_, all) = post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": long})).await;
    assert!(all["usage"]["prompt_tokens"].as_u64().is_some_and(|t| t > 2048), "{all}");
    let (_, first) = post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": long[..10]})).await;
    let (_, second) = post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": long[10..]})).await;
    let halves: Vec<&Value> =
        first["data"].as_array().unwrap().iter().chain(second["data"].as_array().unwrap()).collect();
    for (i, (a, b)) in all["data"].as_array().unwrap().iter().zip(halves).enumerate() {
        assert!(max_diff(&vector(&a["embedding"]), &vector(&b["embedding"])) < 1e-5, "input {i}");
    }

    // base64 is the same floats; `dimensions` keeps a prefix, normalised again.
    let (_, b64) =
        post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": texts[1], "encoding_format": "base64"})).await;
    let bytes = decode(b64["data"][0]["embedding"].as_str().unwrap());
    let floats: Vec<f64> = bytes.chunks(4).map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap()))).collect();
    assert!(max_diff(&floats, &vector(&inputs[1]["last"])) < 1e-4);
    let (_, cut) = post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": texts[1], "dimensions": 8})).await;
    let cut = vector(&cut["data"][0]["embedding"]);
    let full = vector(&inputs[1]["last"]);
    let norm = full[..8].iter().map(|x| x * x).sum::<f64>().sqrt();
    assert_eq!(cut.len(), 8);
    assert!(max_diff(&cut, &full[..8].iter().map(|x| x / norm).collect::<Vec<_>>()) < 1e-4);

    // Ollama's endpoints give the same vectors.
    let (status, o) = post(&s, "/api/embed", json!({"model": FIXTURE, "input": [texts[0], texts[2]]})).await;
    assert_eq!(status, 200, "{o}");
    assert!(max_diff(&vector(&o["embeddings"][1]), &vector(&inputs[2]["last"])) < 1e-4);
    let (_, old) = post(&s, "/api/embeddings", json!({"model": FIXTURE, "prompt": texts[0]})).await;
    assert!(max_diff(&vector(&old["embedding"]), &vector(&inputs[0]["last"])) < 1e-4);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_orders_documents_as_the_reference_embeddings_do() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let reference = reference();
    let inputs = reference["inputs"].as_array().unwrap();
    let query = inputs[0]["text"].as_str().unwrap();
    let documents: Vec<&str> = inputs[1..].iter().map(|i| i["text"].as_str().unwrap()).collect();
    let q = vector(&inputs[0]["last"]);
    let mut expected: Vec<(usize, f64)> = (inputs[1..].iter().enumerate())
        .map(|(i, d)| (i, vector(&d["last"]).iter().zip(&q).map(|(a, b)| a * b).sum()))
        .collect();
    expected.sort_by(|a, b| b.1.total_cmp(&a.1));
    for path in ["/v1/rerank", "/rerank"] {
        let (status, r) =
            post(&s, path, json!({"model": FIXTURE, "query": query, "documents": documents, "top_n": 3})).await;
        assert_eq!(status, 200, "{r}");
        let results = r["results"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        for (got, (index, score)) in results.iter().zip(&expected) {
            assert_eq!(got["index"].as_u64(), Some(*index as u64), "{r}");
            assert!((got["relevance_score"].as_f64().unwrap() - score).abs() < 1e-4, "{r}");
            assert_eq!(got["document"]["text"], documents[*index]);
        }
    }
    let objects: Vec<Value> = documents.iter().map(|d| json!({"text": d})).collect();
    let (_, r) = post(
        &s,
        "/v1/rerank",
        json!({"model": FIXTURE, "query": query, "documents": objects, "return_documents": false}),
    )
    .await;
    assert_eq!(r["results"].as_array().unwrap().len(), documents.len());
    assert!(r["results"][0].get("document").is_none());
    s.shutdown().await;
}

/// Qwen3-Reranker's judging prompt, as its model card writes it.
fn judging_prompt(instruction: &str, query: &str, document: &str) -> String {
    let system = "Judge whether the Document meets the requirements based on the Query and the Instruct provided. \
                  Note that the answer can only be \"yes\" or \"no\".";
    format!(
        "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n\
         <Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yes_no_reranker_scores_documents_by_its_own_judgement() {
    use llaisys_model::generate::one_sequence;
    use llaisys_model::{Context, Device, KvDtype, LoadOptions, ModelSource, Tokenizer, load_model};
    let fixture = FixtureCopy::reranker("tiny-qwen3-f32");
    let name = fixture.path().file_name().unwrap().to_string_lossy().to_string();
    let query = "What is the capital of France?";
    let documents = ["Paris is the capital of France.", "Berlin is in Germany.", "fn main() {}", "十二个月"];
    let instruction = "Given a web search query, retrieve relevant passages that answer the query";
    // The reference: each judging prompt alone through the model, σ(yes − no) after its end.
    let tokenizer = Tokenizer::from_dir(fixture.path()).unwrap();
    let (yes, no) = (tokenizer.token_to_id("yes").unwrap() as usize, tokenizer.token_to_id("no").unwrap() as usize);
    let source = ModelSource::Dir(fixture.path().into());
    let model = load_model(None, Some(&source), &LoadOptions::default(), &Device::flex()).unwrap();
    let mut ctx = Context::with_kv_dtype(model, 1024, KvDtype::F32);
    let mut judge = |instruction: &str, document: &str| {
        let ids = tokenizer.encode(&judging_prompt(instruction, query, document)).unwrap();
        assert!(ids.contains(&(yes as u32)) && ids.contains(&(no as u32)), "the prompt names both tokens");
        ctx.decode(&one_sequence(&ids, 1, 0)).unwrap();
        let row = ctx.outputs().row(0).unwrap();
        let margin = f64::from(row[yes]) - f64::from(row[no]);
        ctx.kv_mut().seq_rm(1, ..).unwrap();
        1.0 / (1.0 + (-margin).exp())
    };
    let expected: Vec<f64> = documents.iter().map(|d| judge(instruction, d)).collect();
    let other: Vec<f64> = documents.iter().map(|d| judge("Find code", d)).collect();
    let mut order: Vec<usize> = (0..documents.len()).collect();
    order.sort_by(|&a, &b| expected[b].total_cmp(&expected[a]));

    // A path that names a reranker: the model judges (batched; each score as alone).
    let s = server_for(fixture.path(), &[]).await;
    let rerank = |body: Value| post(&s, "/v1/rerank", body);
    let (status, r) = rerank(json!({"model": name, "query": query, "documents": documents})).await;
    assert_eq!(status, 200, "{r}");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.iter().map(|x| x["index"].as_u64().unwrap() as usize).collect::<Vec<_>>(), order, "{r}");
    for x in results {
        let i = x["index"].as_u64().unwrap() as usize;
        assert!(
            (x["relevance_score"].as_f64().unwrap() - expected[i]).abs() < 1e-5,
            "{i}: {x} against {}",
            expected[i]
        );
    }
    let (_, r) =
        rerank(json!({"model": name, "query": query, "documents": documents, "instruction": "Find code"})).await;
    for x in r["results"].as_array().unwrap() {
        let i = x["index"].as_u64().unwrap() as usize;
        assert!((x["relevance_score"].as_f64().unwrap() - other[i]).abs() < 1e-5, "{i}: {x} against {}", other[i]);
    }
    let (status, r) = rerank(json!({"model": name, "query": query, "documents": ["x".repeat(5000)]})).await;
    assert_eq!((status, r["error"]["param"].as_str()), (400, Some("documents")), "{r}");
    s.shutdown().await;

    // Told off, the same model ranks by its embeddings' cosine instead.
    let s = server_for(fixture.path(), &[("model.reranker", "\"off\"")]).await;
    let (_, r) = post(&s, "/v1/rerank", json!({"model": name, "query": query, "documents": documents})).await;
    let x = &r["results"][0];
    let i = x["index"].as_u64().unwrap() as usize;
    assert!((x["relevance_score"].as_f64().unwrap() - expected[i]).abs() > 1e-3, "{r}");
    s.shutdown().await;
    // A model without the two tokens cannot be made one.
    let settings = [
        ("model.path".to_string(), format!("{:?}", fixture_dir("tiny-qwen3-f32").display().to_string())),
        ("model.reranker".into(), "\"yes_no\"".into()),
        ("server.port".into(), "0".into()),
    ];
    let config = llaisys_server::Config::load(None, std::iter::empty(), &settings).unwrap();
    let err = llaisys_server::start(&config).await.err().expect("refused").to_string();
    assert!(err.contains("cannot rerank") && err.contains("\"yes\""), "{err}");
    let settings = [("model.path".to_string(), "\"m\"".to_string()), ("model.reranker".into(), "\"maybe\"".into())];
    let config = llaisys_server::Config::load(None, std::iter::empty(), &settings).unwrap();
    let err = llaisys_server::start(&config).await.err().expect("refused").to_string();
    assert!(err.contains("model.reranker"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_embedding_requests_get_clear_errors_and_a_generation_beside_embeddings_is_unchanged() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let cases = [
        (json!({"model": FIXTURE, "input": []}), "input"),
        (json!({"model": FIXTURE, "input": [""]}), "input"),
        (json!({"model": FIXTURE, "input": "x", "pooling": "cls"}), "pooling"),
        (json!({"model": FIXTURE, "input": "x", "dimensions": 0}), "dimensions"),
        (json!({"model": FIXTURE, "input": "x", "dimensions": 100000}), "dimensions"),
        (json!({"model": FIXTURE, "input": "x", "encoding_format": "hex"}), "encoding_format"),
        (json!({"model": FIXTURE, "input": [[99999]]}), "input"),
        (json!({"model": FIXTURE, "input": "word ".repeat(300)}), "input"),
    ];
    for (i, (body, param)) in cases.into_iter().enumerate() {
        let (status, err) = post(&s, "/v1/embeddings", body).await;
        assert_eq!((status, err["error"]["param"].as_str()), (400, Some(param)), "case {i}: {err}");
    }
    let (status, _) =
        post(&s, "/v1/embeddings", json!({"model": FIXTURE, "input": "word ".repeat(300), "truncate": true})).await;
    assert_eq!(status, 200, "truncate cuts to the context");
    let (status, err) = post(&s, "/api/embed", json!({"model": "nope", "input": "x"})).await;
    assert_eq!((status, err["error"].is_string()), (404, true));
    let (status, err) = post(&s, "/v1/rerank", json!({"model": FIXTURE, "query": "q", "documents": []})).await;
    assert_eq!((status, err["error"]["param"].as_str()), (400, Some("documents")));

    let chat = json!({"model": FIXTURE, "max_tokens": 24, "temperature": 0, "ignore_eos": true,
                      "messages": [{"role": "user", "content": "Hello"}]});
    let (_, alone) = post(&s, "/v1/chat/completions", chat.clone()).await;
    let embed = json!({"model": FIXTURE, "input": (0..32).map(|i| format!("text {i}")).collect::<Vec<_>>()});
    let (beside, embedded) = tokio::join!(post(&s, "/v1/chat/completions", chat), async {
        let mut statuses = Vec::new();
        for _ in 0..4 {
            statuses.push(post(&s, "/v1/embeddings", embed.clone()).await.0);
        }
        statuses
    });
    assert_eq!(embedded, vec![200; 4]);
    assert_eq!(beside.1["choices"][0]["message"], alone["choices"][0]["message"], "the generation is unchanged");
    let stats = reqwest::get(common::url(&s, "/metrics")).await.unwrap().text().await.unwrap();
    assert!(stats.contains("llaisys_embedding_inputs_total"), "embeddings are counted");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_model_and_an_embedding_model_serve_side_by_side_each_by_its_name() {
    let embedder = fixture_dir("tiny-qwen3-f32");
    let also = format!("[{{ path = {:?}, name = \"embedder\" }}]", embedder.display().to_string());
    let s = server_for(&fixture_dir(FIXTURE), &[("model.also", &also)]).await;
    let (_, models) = common::get(&s, "/v1/models").await;
    let mut ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, vec!["embedder", FIXTURE]);
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(embedder.join("embeddings.json")).unwrap()).unwrap();
    let first = &reference["inputs"][0];
    let (status, r) = post(&s, "/v1/embeddings", json!({"model": "embedder", "input": first["text"]})).await;
    assert_eq!(status, 200, "{r}");
    assert!(max_diff(&vector(&r["data"][0]["embedding"]), &vector(&first["last"])) < 1e-4);
    let chat = json!({"model": FIXTURE, "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]});
    assert_eq!(post(&s, "/v1/chat/completions", chat).await.0, 200);
    s.shutdown().await;

    // Two models under one name are refused at start, naming it.
    let same = format!("[{{ path = {:?}, name = {FIXTURE:?} }}]", embedder.display().to_string());
    let settings = [
        ("model.path".to_string(), format!("{:?}", fixture_dir(FIXTURE).display().to_string())),
        ("model.also".to_string(), same),
        ("server.port".to_string(), "0".to_string()),
    ];
    let config = llaisys_server::Config::load(None, std::iter::empty(), &settings).unwrap();
    let err = llaisys_server::start(&config).await.err().expect("a duplicate name is refused").to_string();
    assert!(err.contains(FIXTURE), "{err}");
}
