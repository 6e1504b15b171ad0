//! The official OpenAI Python client against the real server. The test set-up makes a virtual
//! environment with `openai` from PyPI under `target/openai-venv` (once; about 10 s).

use std::path::{Path, PathBuf};
use std::process::Command;

use llaisys_server::Config;
use llaisys_tests::fixture_dir;
use serde_json::Value;

const FIXTURE: &str = "tiny-untied-f32";

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
    let script = root().join("scripts/openai_client_check.py");
    let output = tokio::task::spawn_blocking(move || Command::new(python).arg(script).arg(base).arg(FIXTURE).output())
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
    server.shutdown().await;
}
