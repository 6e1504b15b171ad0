//! The official Python clients against the real server: OpenAI's (chat, completions, tools,
//! structured outputs, the Responses API), Anthropic's and Ollama's. The test set-up makes a
//! virtual environment with them from PyPI under `target/openai-venv` (once; about 20 s).

use std::path::{Path, PathBuf};
use std::process::Command;

use llaisys_server::{Config, Server};
use llaisys_tests::{FixtureCopy, fixture_dir};
use serde_json::Value;

const FIXTURE: &str = "tiny-untied-f32";
const TOOLS_FIXTURE: &str = "tiny-tied-f32";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The virtualenv's python with the three clients, created on first use (one at a time: the
/// tests run in parallel).
fn python() -> PathBuf {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let venv = root().join("target/openai-venv");
    let python = venv.join("bin/python");
    let ready =
        || Command::new(&python).args(["-c", "import openai, anthropic, ollama"]).status().is_ok_and(|s| s.success());
    if !python.exists() || !ready() {
        let ok = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 is needed");
        assert!(ok.success(), "python3 -m venv failed");
        let packages = ["openai>=1.40,<4", "anthropic>=0.40,<1", "ollama>=0.4,<1"];
        let ok = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(packages)
            .status()
            .unwrap();
        assert!(ok.success(), "pip install {packages:?} failed (PyPI must be reachable)");
    }
    python
}

/// Servers for the plain fixture and for the tools fixture (Qwen2.5's template and tags, and
/// room for the tools in the prompt), with the copy the latter needs.
async fn servers() -> (Server, Server, FixtureCopy) {
    let settings = vec![
        ("model.path".to_string(), format!("{:?}", fixture_dir(FIXTURE).display().to_string())),
        ("server.port".into(), "0".into()),
    ];
    let server = llaisys_server::start(&Config::load(None, std::iter::empty(), &settings).unwrap()).await.unwrap();
    let tools_fixture = FixtureCopy::long_context(TOOLS_FIXTURE, 2048);
    let settings = vec![
        ("model.path".to_string(), format!("{:?}", tools_fixture.path().display().to_string())),
        ("model.name".into(), format!("{TOOLS_FIXTURE:?}")),
        ("server.port".into(), "0".into()),
    ];
    let tools_server =
        llaisys_server::start(&Config::load(None, std::iter::empty(), &settings).unwrap()).await.unwrap();
    (server, tools_server, tools_fixture)
}

/// Runs a client script with `args`; its checks by name.
async fn run_script(script: &str, args: Vec<String>) -> Vec<Value> {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let script = root().join("scripts").join(script);
    let output = tokio::task::spawn_blocking(move || Command::new(python).arg(script).args(args).output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client script failed:\n{stderr}");
    String::from_utf8(output.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn check<'a>(checks: &'a [Value], name: &str) -> &'a Value {
    checks.iter().find(|c| c["check"] == name).unwrap_or_else(|| panic!("no {name}: {checks:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_works_unchanged() {
    let (server, tools_server, _fixture) = servers().await;
    let (base, tools_base) = (format!("http://{}/v1", server.addr), format!("http://{}/v1", tools_server.addr));
    let checks =
        run_script("openai_client_check.py", vec![base, FIXTURE.into(), tools_base, TOOLS_FIXTURE.into()]).await;
    let get = |name: &str| check(&checks, name);
    assert_eq!(get("models")["ids"], serde_json::json!([FIXTURE]));
    let chat = get("chat");
    assert_eq!((chat["finish"].as_str(), chat["completion_tokens"].as_u64()), (Some("length"), Some(8)));
    let stream = get("chat_stream");
    assert_eq!(stream["text"], chat["text"], "streamed text equals the whole answer");
    assert_eq!(stream["finishes"], serde_json::json!(["length"]));
    assert_eq!(stream["completion_tokens"].as_u64(), Some(8));
    assert_eq!(get("completion")["completion_tokens"].as_u64(), Some(5));
    let error = get("error");
    assert_eq!((error["raised"].as_str(), error["status"].as_u64()), (Some("NotFoundError"), Some(404)));
    let batch = get("batch");
    assert_eq!(batch["status"], "completed", "{batch}");
    assert_eq!(batch["counts"], serde_json::json!([2, 1, 1]), "{batch}");
    assert_eq!(batch["metadata"], serde_json::json!({"job": "check"}));
    assert_eq!(batch["answers"], serde_json::json!([["hello", 200]]));
    assert_eq!(batch["text"], chat["text"], "a batched request answers as the same request sent alone");
    assert_eq!(batch["errors"], serde_json::json!([["missing", 404]]));
    assert_eq!(
        (&batch["listed"], &batch["status_after_cancel"], &batch["deleted"]),
        (&true.into(), &"completed".into(), &true.into())
    );

    let names = ["get_weather", "get_time"];
    let required = get("tools_required");
    assert_eq!(required["finish"], "tool_calls", "{required}");
    assert!(required["content"].is_null(), "content is null when there are only calls: {required}");
    let calls = required["calls"].as_array().unwrap();
    assert!(!calls.is_empty());
    for c in calls {
        assert!(c["id"].as_str().unwrap().starts_with("call_") && c["type"] == "function", "{c}");
        assert!(names.contains(&c["name"].as_str().unwrap()) && c["arguments"].is_object(), "{c}");
    }
    let stream = get("tools_stream");
    assert_eq!(stream["finishes"], serde_json::json!(["tool_calls"]));
    let streamed = stream["calls"].as_array().unwrap();
    assert_eq!(streamed.len(), calls.len(), "{stream}");
    for (s, w) in streamed.iter().zip(calls) {
        assert_eq!(
            (&s["name"], &s["raw"], &s["type"]),
            (&w["name"], &w["raw"], &w["type"]),
            "same seed: byte-identical"
        );
        assert!(
            s["id"].as_str().unwrap().starts_with("call_") && s["id"].as_str().unwrap().len() == 29,
            "the id came once"
        );
    }
    let named = get("tools_named");
    assert_eq!(named["finish"], "stop");
    assert_eq!(named["calls"][0]["name"], "get_time");
    assert_eq!(get("tools_none")["calls"], serde_json::json!([]));
    assert_eq!(get("tools_single")["counts"], serde_json::json!([1, 1, 1]));
    assert!(get("tools_multi_turn")["finish"].as_str().is_some());
    let parsed = get("parse");
    assert_eq!(parsed["finish"], "stop");
    assert!(parsed["parsed"]["city"].as_str().is_some_and(|c| c.chars().count() <= 8), "{parsed}");
    assert!(parsed["parsed"]["celsius"].as_i64().is_some_and(|t| (-50..=60).contains(&t)), "{parsed}");
    assert_eq!(get("parse_length")["raised"], "LengthFinishReasonError");
    tools_server.shutdown().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_responses_anthropic_and_ollama_clients_work_unchanged() {
    let (server, tools_server, _fixture) = servers().await;
    let (host, tools_host) = (format!("http://{}", server.addr), format!("http://{}", tools_server.addr));
    let checks =
        run_script("dialect_clients_check.py", vec![host, FIXTURE.into(), tools_host, TOOLS_FIXTURE.into()]).await;
    let get = |name: &str| check(&checks, name);
    let reference = &get("reference")["text"];
    assert!(reference.as_str().is_some_and(|t| !t.is_empty()));

    let r = get("responses");
    assert_eq!((&r["text"], r["output_tokens"].as_u64()), (reference, Some(8)), "{r}");
    let r = get("responses_stream");
    assert_eq!((&r["text"], &r["helper_text"]), (reference, reference), "{r}");
    assert!(r["last"] == "response.incomplete" || r["last"] == "response.completed", "{r}");
    let r = get("responses_previous");
    assert!(r["cached"].as_u64().unwrap() + 1 >= r["first_total"].as_u64().unwrap(), "the first turn is cached: {r}");
    assert_eq!(get("responses_retrieve")["same"], true);
    assert_eq!(get("responses_deleted")["raised"], "NotFoundError");
    let r = get("responses_tools");
    assert_eq!(r["names"], serde_json::json!(["get_weather"]), "{r}");
    assert!(r["arguments"][0]["city"].as_str().is_some_and(|c| c.chars().count() <= 8), "{r}");
    assert!(r["answered"].is_string());
    let r = get("responses_parse");
    assert!(
        r["parsed"]["city"].is_string() && r["parsed"]["celsius"].as_i64().is_some_and(|t| (-50..=60).contains(&t)),
        "{r}"
    );

    let e = get("embeddings");
    assert_eq!((e["count"].as_u64(), e["dims"].as_u64()), (Some(2), Some(64)), "{e}");
    assert!(e["same"].as_f64().unwrap() < 1e-6, "base64 decodes to the floats: {e}");
    assert!((e["norm"].as_f64().unwrap() - 1.0).abs() < 1e-4, "{e}");

    let a = get("anthropic");
    assert_eq!(
        (&a["text"], a["stop_reason"].as_str(), a["output_tokens"].as_u64()),
        (reference, Some("max_tokens"), Some(8))
    );
    let a = get("anthropic_stream");
    assert_eq!((&a["text"], &a["final"]), (reference, reference), "{a}");
    let a = get("anthropic_count");
    assert_eq!(a["input_tokens"], a["used"], "count_tokens counts the prompt a request uses");
    let b = get("anthropic_batch");
    assert_eq!(b["created"], serde_json::json!(["in_progress", 2]), "{b}");
    assert_eq!(b["counts"], serde_json::json!([1, 1, 0]), "{b}");
    assert_eq!(b["types"], serde_json::json!({"hello": "succeeded", "nope": "errored"}), "{b}");
    assert_eq!(&b["text"], reference, "a batched message answers as the same request sent alone: {b}");
    assert_eq!(
        (b["error"].as_str(), &b["listed"], b["deleted"].as_str()),
        (Some("not_found_error"), &true.into(), Some("message_batch_deleted"))
    );
    let a = get("anthropic_tools");
    assert_eq!(
        (a["stop_reason"].as_str(), &a["names"]),
        (Some("tool_use"), &serde_json::json!(["get_weather"])),
        "{a}"
    );
    assert!(a["inputs"][0]["city"].is_string(), "{a}");
    assert!(a["answered"].is_string());
    assert_eq!(
        (get("anthropic_error")["raised"].as_str(), get("anthropic_error")["status"].as_u64()),
        (Some("NotFoundError"), Some(404))
    );

    let o = get("ollama_chat");
    assert_eq!(
        (&o["text"], &o["streamed"], &o["done"], o["eval_count"].as_u64()),
        (reference, reference, &Value::Bool(true), Some(8)),
        "{o}"
    );
    let o = get("ollama_generate");
    assert_eq!(&o["text"], &o["streamed"], "{o}");
    // The prompt in the model's fill-in-the-middle tokens, the same from both clients.
    let f = get("fill_in_the_middle");
    let psm = "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c\n<|fim_middle|>";
    let tokens = llaisys_model::Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap().encode(psm).unwrap().len();
    assert_eq!(
        (f["prompt_tokens"].as_u64(), &f["ollama_prompt_tokens"]),
        (Some(tokens as u64), &f["prompt_tokens"]),
        "{f}"
    );
    assert!(f["openai"].is_string() && f["openai"] == f["ollama"], "{f}");
    let o = get("ollama_embed");
    assert!(o["count"] == 2 && o["same"].as_f64().unwrap() < 1e-6, "{o}");
    assert_eq!(get("ollama_list")["names"], serde_json::json!([FIXTURE]));
    assert_eq!(get("ollama_ps")["names"], serde_json::json!([FIXTURE]));
    let o = get("ollama_show");
    assert_eq!(o["architecture"], "qwen2");
    assert!(o["capabilities"].as_array().unwrap().contains(&serde_json::json!("completion")));
    assert_eq!(
        (get("ollama_error")["raised"].as_str(), get("ollama_error")["status"].as_u64()),
        (Some("ResponseError"), Some(404))
    );
    tools_server.shutdown().await;
    server.shutdown().await;
}
