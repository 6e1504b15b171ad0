//! The official OpenAI Python client against the real server. The test set-up makes a virtual
//! environment with `openai` from PyPI under `target/openai-venv` (once; about 10 s).

use std::path::{Path, PathBuf};
use std::process::Command;

use llaisys_server::Config;
use llaisys_tests::{FixtureCopy, fixture_dir};
use serde_json::Value;

const FIXTURE: &str = "tiny-untied-f32";
const TOOLS_FIXTURE: &str = "tiny-tied-f32";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The virtualenv's python, created on first use.
fn python() -> PathBuf {
    let venv = root().join("target/openai-venv");
    let python = venv.join("bin/python");
    if !python.exists() || !Command::new(&python).args(["-c", "import openai"]).status().is_ok_and(|s| s.success()) {
        let ok = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 is needed");
        assert!(ok.success(), "python3 -m venv failed");
        let ok = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "openai>=1.40,<4"])
            .status()
            .unwrap();
        assert!(ok.success(), "pip install openai failed (PyPI must be reachable)");
    }
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_works_unchanged() {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let settings = vec![
        ("model.path".to_string(), format!("{:?}", fixture_dir(FIXTURE).display().to_string())),
        ("server.port".into(), "0".into()),
    ];
    let server = llaisys_server::start(&Config::load(None, std::iter::empty(), &settings).unwrap()).await.unwrap();
    let base = format!("http://{}/v1", server.addr);
    // Tools need Qwen2.5's template and tags, and room for the tools in the prompt.
    let tools_fixture = FixtureCopy::long_context(TOOLS_FIXTURE, 2048);
    let settings = vec![
        ("model.path".to_string(), format!("{:?}", tools_fixture.path().display().to_string())),
        ("model.name".into(), format!("{TOOLS_FIXTURE:?}")),
        ("server.port".into(), "0".into()),
    ];
    let tools_server =
        llaisys_server::start(&Config::load(None, std::iter::empty(), &settings).unwrap()).await.unwrap();
    let tools_base = format!("http://{}/v1", tools_server.addr);
    let script = root().join("scripts/openai_client_check.py");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python).arg(script).args([&base, FIXTURE, &tools_base, TOOLS_FIXTURE]).output()
    })
    .await
    .unwrap()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the client script failed:\n{stderr}");
    let checks: Vec<Value> =
        String::from_utf8(output.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let get =
        |name: &str| checks.iter().find(|c| c["check"] == name).unwrap_or_else(|| panic!("no {name}: {checks:?}"));
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
