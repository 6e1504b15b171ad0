//! Models by name against a Hugging Face hub served on loopback by the test (axum): a repo's
//! listing, the download into the standard cache (resumed from a partial blob, checked by
//! sha256), a server started from `org/repo:QUANT`, the cache alone once the hub is gone or with
//! `offline`, and errors that name the repo and the files it has.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use llaisys_server::hub::{HubConfig, HubError, resolve};
use llaisys_tests::fixture_dir;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

mod common;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// One repo: its files, and sha256s it claims (to test a corrupted download).
struct Repo {
    files: Vec<(String, Vec<u8>)>,
    claimed: HashMap<String, String>,
}

/// A request the hub saw: its path, `Range` and `Authorization`.
type Seen = (String, Option<String>, Option<String>);

#[derive(Default)]
struct Hub {
    repos: HashMap<String, Repo>,
    /// Every request's path, range and authorization, in order.
    seen: Mutex<Vec<Seen>>,
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn record(hub: &Hub, path: String, headers: &HeaderMap) {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    hub.seen.lock().unwrap().push((path, header("range"), header("authorization")));
}

async fn listing(
    State(hub): State<Arc<Hub>>,
    UrlPath((org, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let repo = format!("{org}/{name}");
    record(&hub, format!("/api/models/{repo}"), &headers);
    let Some(r) = hub.repos.get(&repo) else { return (StatusCode::NOT_FOUND, "Repository not found").into_response() };
    let siblings: Vec<Value> = r
        .files
        .iter()
        .map(|(f, bytes)| match f.ends_with(".gguf") || f.ends_with(".safetensors") {
            true => {
                let sha256 = r.claimed.get(f).cloned().unwrap_or_else(|| sha(bytes));
                json!({"rfilename": f, "size": bytes.len(), "lfs": {"sha256": sha256, "size": bytes.len()}})
            }
            false => json!({"rfilename": f, "size": bytes.len()}),
        })
        .collect();
    axum::Json(json!({"id": repo, "sha": COMMIT, "siblings": siblings})).into_response()
}

async fn file(
    State(hub): State<Arc<Hub>>,
    UrlPath((org, name, commit, file)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let repo = format!("{org}/{name}");
    record(&hub, format!("/{repo}/resolve/{commit}/{file}"), &headers);
    let Some(bytes) =
        hub.repos.get(&repo).and_then(|r| r.files.iter().find(|(f, _)| *f == file)).map(|(_, b)| b.clone())
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let from = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse::<usize>().ok());
    match from {
        Some(from) if from < bytes.len() => (StatusCode::PARTIAL_CONTENT, bytes[from..].to_vec()).into_response(),
        _ => (StatusCode::OK, bytes).into_response(),
    }
}

async fn serve_hub(hub: Arc<Hub>) -> (String, tokio::task::JoinHandle<()>) {
    let app = axum::Router::new()
        .route("/api/models/{org}/{name}/revision/main", get(listing))
        .route("/{org}/{name}/resolve/{commit}/{*file}", get(file))
        .with_state(hub);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), task)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn hub_repos() -> HashMap<String, Repo> {
    let gguf = |name: &str| read(&fixture_dir("gguf").join(name));
    let mut repos = HashMap::new();
    let quantized = vec![
        ("tiny-tied-Q8_0.gguf".to_string(), gguf("tiny-tied-q8_0.gguf")),
        ("tiny-tied-Q4_0.gguf".to_string(), gguf("tiny-tied-q4_0.gguf")),
        ("README.md".to_string(), b"# tiny".to_vec()),
    ];
    repos.insert("llaisys/tiny-GGUF".into(), Repo { files: quantized, claimed: HashMap::new() });
    let one = vec![("model.gguf".to_string(), gguf("tiny-tied-f32.gguf"))];
    let claimed = HashMap::from([("model.gguf".to_string(), "0".repeat(64))]);
    repos.insert("llaisys/corrupt-GGUF".into(), Repo { files: one, claimed });
    // Split by llama.cpp's gguf-split, named as Qwen's own GGUF repos name their parts.
    let split = (1..=3)
        .map(|no| {
            let part = llaisys_model::gguf::split_name("tiny-tied-q8_0", no, 3);
            (llaisys_model::gguf::split_name("tiny-q8_0", no, 3), gguf(&format!("split/{part}")))
        })
        .collect();
    repos.insert("llaisys/split-GGUF".into(), Repo { files: split, claimed: HashMap::new() });
    let dir = fixture_dir("tiny-untied-f32");
    let mut checkpoint: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), read(&p)))
        .collect();
    checkpoint.sort();
    repos.insert("llaisys/tiny-hf".into(), Repo { files: checkpoint, claimed: HashMap::new() });
    // A vision model as llama.cpp's converter writes it: the language model and its projector file.
    let converted = |name: &str| read(&fixture_dir("gguf").join("converted").join(name));
    let vision = vec![
        ("tiny-VL-F32.gguf".to_string(), converted("tiny-qwen25vl-f32.gguf")),
        ("mmproj-tiny-VL-F32.gguf".to_string(), converted("mmproj-tiny-qwen25vl-f32.gguf")),
    ];
    repos.insert("llaisys/tiny-VL-GGUF".into(), Repo { files: vision, claimed: HashMap::new() });
    // A PEFT adapter of tiny-llama-f32, as PEFT pushes one (with its README).
    let lora = fixture_dir("lora/tiny-llama-lora");
    let mut adapter: Vec<(String, Vec<u8>)> =
        ["adapter_config.json", "adapter_model.safetensors"].map(|f| (f.to_string(), read(&lora.join(f)))).into();
    adapter.push(("README.md".into(), b"# a LoRA".to_vec()));
    repos.insert("llaisys/tiny-lora".into(), Repo { files: adapter, claimed: HashMap::new() });
    repos
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_by_name_come_through_the_hub_cache_checked_resumed_and_offline() {
    let home = std::env::temp_dir().join(format!("llaisys-hub-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let hub = Arc::new(Hub { repos: hub_repos(), ..Hub::default() });
    let (endpoint, task) = serve_hub(hub.clone()).await;
    let config = HubConfig {
        endpoint: endpoint.clone(),
        cache: home.join("hub"),
        token: Some("hf_test".into()),
        offline: false,
    };
    let repo_dir = home.join("hub/models--llaisys--tiny-GGUF");

    // A quantization by name: downloaded into the standard layout, byte for byte.
    let path = resolve("llaisys/tiny-GGUF:Q8_0", &config).await.unwrap().path;
    assert_eq!(path, repo_dir.join(format!("snapshots/{COMMIT}/tiny-tied-Q8_0.gguf")));
    let want = read(&fixture_dir("gguf").join("tiny-tied-q8_0.gguf"));
    assert_eq!(read(&path), want);
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink(), "the snapshot links to its blob");
    assert!(repo_dir.join("blobs").join(sha(&want)).is_file());
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(), COMMIT);
    let seen = hub.seen.lock().unwrap().clone();
    assert!(seen.iter().all(|(_, _, auth)| auth.as_deref() == Some("Bearer hf_test")), "HF_TOKEN is sent: {seen:?}");

    // A second resolution downloads nothing; a partial blob is resumed with a range request.
    let downloads = |hub: &Hub| hub.seen.lock().unwrap().iter().filter(|(p, _, _)| p.contains("/resolve/")).count();
    let before = downloads(&hub);
    assert_eq!(resolve("llaisys/tiny-GGUF:q8_0", &config).await.unwrap().path, path);
    assert_eq!(downloads(&hub), before, "the cache answers");
    let q4 = read(&fixture_dir("gguf").join("tiny-tied-q4_0.gguf"));
    let blobs = repo_dir.join("blobs");
    std::fs::write(blobs.join(format!("{}.incomplete", sha(&q4))), &q4[..q4.len() / 2]).unwrap();
    let path4 = resolve("hf://llaisys/tiny-GGUF/tiny-tied-Q4_0.gguf", &config).await.unwrap().path;
    assert_eq!(read(&path4), q4, "resumed to the whole file");
    let last = hub.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last.1, Some(format!("bytes={}-", q4.len() / 2)), "{last:?}");

    // Errors name the repo and what it has.
    let err = |e: HubError| e.to_string();
    let msg = err(resolve("llaisys/tiny-GGUF:Q5_K_M", &config).await.unwrap_err());
    assert!(
        msg.contains("Q5_K_M") && msg.contains("tiny-tied-Q8_0.gguf") && msg.contains("tiny-tied-Q4_0.gguf"),
        "{msg}"
    );
    let msg = err(resolve("llaisys/tiny-GGUF", &config).await.unwrap_err());
    assert!(msg.contains("several GGUF files") && msg.contains("llaisys/tiny-GGUF:QUANT"), "{msg}");
    let msg = err(resolve("llaisys/no-such-repo", &config).await.unwrap_err());
    assert!(msg.contains("no model repo llaisys/no-such-repo"), "{msg}");
    let msg = err(resolve("hf://llaisys/tiny-GGUF/missing.gguf", &config).await.unwrap_err());
    assert!(msg.contains("no file missing.gguf"), "{msg}");
    let corrupt = resolve("llaisys/corrupt-GGUF", &config).await.unwrap_err();
    assert!(matches!(corrupt, HubError::Checksum { .. }), "{corrupt}");
    let corrupt_blobs = home.join("hub/models--llaisys--corrupt-GGUF/blobs");
    assert_eq!(std::fs::read_dir(&corrupt_blobs).unwrap().count(), 0, "nothing of a bad download is kept");

    // A model split into parts: all of them are fetched, and it opens from its first.
    let first = resolve("llaisys/split-GGUF:Q8_0", &config).await.unwrap().path;
    assert!(first.ends_with("tiny-q8_0-00001-of-00003.gguf"), "{}", first.display());
    let file = llaisys_model::gguf::GgufFile::open(&first).unwrap();
    let whole = llaisys_model::gguf::GgufFile::open(&fixture_dir("gguf").join("tiny-tied-q8_0.gguf")).unwrap();
    assert_eq!(file.tensors().len(), whole.tensors().len());

    // A checkpoint repo resolves to its snapshot directory, which loads.
    let dir = resolve("llaisys/tiny-hf", &config).await.unwrap().path;
    assert!(dir.join("config.json").is_file() && dir.join("tokenizer.json").is_file());
    assert!(llaisys_model::ModelSource::resolve(&dir).is_ok());

    // An adapter repo resolves to its directory; a server's adapters may be given by name too.
    let adapter = resolve("llaisys/tiny-lora", &config).await.unwrap().path;
    assert!(adapter.join("adapter_config.json").is_file() && adapter.join("adapter_model.safetensors").is_file());
    let llama = fixture_dir("tiny-llama-f32");
    let settings = [
        ("model.path".to_string(), format!("{:?}", llama.to_string_lossy())),
        ("model.lora".into(), "[{ path = \"llaisys/tiny-lora\" }]".into()),
        ("server.port".into(), "0".into()),
    ];
    let adapted = llaisys_server::Config::load(None, std::iter::empty(), &settings).unwrap();
    let local = llaisys_server::serve::with_model_from(&adapted, &config).await.unwrap();
    assert_eq!(local.model.lora[0].path, adapter);
    let s = llaisys_server::start(&local).await.unwrap();
    let p = &llaisys_tests::Reference::load("lora/tiny-llama-lora").prompts[0];
    let body = json!({"model": "tiny-llama-f32", "prompt": p.ids, "max_tokens": p.greedy.len(), "temperature": 0, "ignore_eos": true});
    let (status, r) = common::post(&s, "/v1/completions", body).await;
    let tokenizer = llaisys_model::Tokenizer::from_dir(&llama).unwrap();
    assert_eq!((status, &r["choices"][0]["text"]), (200, &json!(tokenizer.decode(&p.greedy, true).unwrap())), "{r}");
    // The model list and llama.cpp's /lora-adapters say which adapters it carries; a change of
    // scale is refused (they are merged at load) and changes nothing.
    let listed = json!([{"path": adapter, "scale": 1.0}]);
    let (_, models) = common::get(&s, "/v1/models").await;
    assert_eq!(models["data"][0]["adapters"], listed, "{models}");
    let (status, adapters) = common::get(&s, "/lora-adapters").await;
    assert_eq!((status, adapters), (200, json!([{"id": 0, "path": adapter, "scale": 1.0}])));
    let (status, refused) = common::post(&s, "/lora-adapters", json!([{"id": 0, "scale": 0.5}])).await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused["error"]["message"].as_str().is_some_and(|m| m.contains("--lora-scaled")), "{refused}");
    let (_, again) = common::post(
        &s,
        "/v1/completions",
        json!({"model": "tiny-llama-f32", "prompt": p.ids,
        "max_tokens": p.greedy.len(), "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(again["choices"][0]["text"], r["choices"][0]["text"], "{again}");
    s.shutdown().await;

    // A server started by name serves the model under that name (its hub is the environment's:
    // here the test's, given as the environment would give it).
    let name = "llaisys/tiny-GGUF:Q8_0";
    let by_name = |offline: bool, hub: &HubConfig| {
        let settings = [("model.path".to_string(), format!("{name:?}")), ("server.port".into(), "0".into())];
        let config = llaisys_server::Config::load(None, std::iter::empty(), &settings).unwrap();
        let hub = HubConfig { offline, ..hub.clone() };
        async move {
            llaisys_server::start(&llaisys_server::serve::with_model_from(&config, &hub).await.unwrap()).await.unwrap()
        }
    };
    let s = by_name(false, &config).await;
    let (_, models) = common::get(&s, "/v1/models").await;
    assert_eq!(models["data"][0]["id"], name);
    assert!(models["data"][0].get("adapters").is_none(), "no adapters, no list: {models}");
    assert_eq!(common::get(&s, "/lora-adapters").await, (200, json!([])));
    let (status, r) =
        common::post(&s, "/v1/completions", json!({"model": name, "prompt": "Hello", "max_tokens": 3})).await;
    assert_eq!((status, r["usage"]["completion_tokens"].as_u64()), (200, Some(3)), "{r}");
    s.shutdown().await;

    // A vision model's repo: its projector file comes with it, and the server sees images.
    let resolved = resolve("llaisys/tiny-VL-GGUF", &config).await.unwrap();
    assert!(resolved.path.ends_with("tiny-VL-F32.gguf"), "the model, not its projector: {resolved:?}");
    let settings = [("model.path".to_string(), "\"llaisys/tiny-VL-GGUF\"".into()), ("server.port".into(), "0".into())];
    let vl = llaisys_server::Config::load(None, std::iter::empty(), &settings).unwrap();
    let local = llaisys_server::serve::with_model_from(&vl, &config).await.unwrap();
    assert_eq!(Some(local.model.mmproj.clone()), resolved.mmproj);
    let s = llaisys_server::start(&local).await.unwrap();
    let (_, models) = common::get(&s, "/v1/models").await;
    assert_eq!(models["data"][0]["input_modalities"], json!(["text", "image"]), "{models}");
    s.shutdown().await;

    // With the hub gone the cache answers; offline, only the cache, and what it lacks is named.
    task.abort();
    let _ = task.await;
    let gone = HubConfig { endpoint: "http://127.0.0.1:9".into(), ..config.clone() };
    assert_eq!(resolve("llaisys/tiny-GGUF:Q8_0", &gone).await.unwrap().path, path);
    let offline = HubConfig { offline: true, ..gone };
    assert_eq!(resolve("llaisys/tiny-GGUF:Q4_0", &offline).await.unwrap().path, path4);
    let vision = resolve("llaisys/tiny-VL-GGUF", &offline).await.unwrap();
    assert!(vision.mmproj.is_some_and(|m| m.ends_with("mmproj-tiny-VL-F32.gguf")), "the projector is cached too");
    let msg = err(resolve("llaisys/corrupt-GGUF", &offline).await.unwrap_err());
    assert!(msg.contains("llaisys/corrupt-GGUF is not in the hub cache") && msg.contains("offline"), "{msg}");
    let s = by_name(true, &offline).await;
    assert_eq!(common::get(&s, "/v1/models").await.1["data"][0]["id"], name);
    s.shutdown().await;
    let _ = std::fs::remove_dir_all(&home);
}
