//! The Web UI in a real browser: `tests/webui/browser.mjs` drives Debian's headless Chromium
//! (through playwright-core) against the real server. `tests/webui/setup.sh` installs both on
//! first use. The server serves the tiny fixture (whose greedy answers this test computes over
//! the API first), a slow mock model, so Stop can land mid-answer, a tool-calling and a reasoning
//! copy of fixtures, and the Qwen2-VL fixture, which sees an attached image.
//! Screenshots of the main states go to `target/webui-screenshots/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use base64::Engine as _;
use llaisys_actors::Engine;
use llaisys_server::{Config, load_entry, start_models};
use llaisys_tests::{FixtureCopy, fixture_dir};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

const FIXTURE: &str = "tiny-untied-f32";
const SLOW: &str = "slow-mock";
const TOOLS: &str = "tools-fixture";
const THINKING: &str = "thinking-fixture";
const VISION: &str = "tiny-qwen2vl-f32";

fn webui_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("webui")
}

fn run_setup() {
    let status = std::process::Command::new("bash").arg(webui_dir().join("setup.sh")).status().unwrap();
    assert!(status.success(), "tests/webui/setup.sh failed: {status}");
}

/// A mock model directory that decodes with the fixture's tokenizer, 80 ms per step.
fn slow_model_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("webui-slow-mock");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture_dir(FIXTURE).join(file), dir.join(file)).unwrap();
    }
    // The fixture's vocabulary size; no eos, so it runs to max_tokens unless stopped.
    let config = json!({"model_type": "mock", "vocab_size": 1024, "max_position_embeddings": 512, "step_delay_ms": 80});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_ui_in_headless_chromium() {
    run_setup();
    let out =
        Command::new("node").arg("--test").arg("markdown.test.mjs").current_dir(webui_dir()).output().await.unwrap();
    assert!(out.status.success(), "markdown tests:\n{}", String::from_utf8_lossy(&out.stdout));

    let settings = [
        ("server.port".to_string(), "0".to_string()),
        ("model.path".into(), format!("{:?}", fixture_dir(FIXTURE).display().to_string())),
    ];
    let config = Config::load(None, std::iter::empty(), &settings).unwrap();
    let builder = Engine::builder().config(config.engine_config()).limits(config.request_limits());
    let fixture = load_entry(builder.clone().model(fixture_dir(FIXTURE)), FIXTURE.into()).await.unwrap();
    let slow = load_entry(builder.clone().model(slow_model_dir()), SLOW.into()).await.unwrap();
    // Qwen2.5's chat template and tool-call tags, with room for the tools in the prompt.
    let tools_dir = FixtureCopy::long_context("tiny-tied-f32", 2048);
    let tools = load_entry(builder.clone().model(tools_dir.path()), TOOLS.into()).await.unwrap();
    // Qwen3's template opening the think block: the answer is all reasoning.
    let thinking_dir = FixtureCopy::thinking("tiny-qwen3-f32");
    let thinking = load_entry(builder.clone().model(thinking_dir.path()), THINKING.into()).await.unwrap();
    let vision = load_entry(builder.clone().model(fixture_dir(VISION)), VISION.into()).await.unwrap();
    let server = start_models(vec![fixture, slow, tools, thinking, vision], &config).await.unwrap();
    let url = format!("http://{}", server.addr);

    // The greedy answers the page must show, from the API (the streamed text is checked against
    // the non-streamed one; the fixture's greedy tokens are checked against transformers elsewhere).
    let chat = |model: &str, prompt: Value, max_tokens: usize| {
        let body = json!({"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": max_tokens});
        let request = reqwest::Client::new().post(format!("{url}/v1/chat/completions")).json(&body);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap()["choices"][0]["message"].clone() }
    };
    let mut expected = serde_json::Map::new();
    for prompt in ["Hello there", "Tell me a story"] {
        let message = chat(FIXTURE, prompt.into(), 40).await;
        let text = message["content"].as_str().unwrap_or_else(|| panic!("{message}"));
        assert!(!text.is_empty());
        expected.insert(prompt.into(), text.into());
    }
    // The reasoning model's thinking, all of its answer.
    let message = chat(THINKING, "Think".into(), 12).await;
    let reasoning = message["reasoning_content"].as_str().unwrap_or_else(|| panic!("{message}"));
    assert!(!reasoning.is_empty() && message["content"].is_null(), "{message}");
    expected.insert("Think".into(), reasoning.into());
    // An image the page attaches from a file, as the page sends it (a small PNG goes as it is).
    let image = fixture_dir(VISION).join("images/square.png");
    let data_url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&image).unwrap())
    );
    let parts = json!([{"type": "image_url", "image_url": {"url": data_url}}, {"type": "text", "text": "Describe"}]);
    let message = chat(VISION, parts, 8).await;
    let text = message["content"].as_str().unwrap_or_else(|| panic!("{message}"));
    expected.insert("Image".into(), text.into());

    let screenshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/webui-screenshots");
    let mut browser = Command::new("node")
        .arg("browser.mjs")
        .current_dir(webui_dir())
        .env("LLAISYS_URL", &url)
        .env("LLAISYS_EXPECTED", Value::Object(expected).to_string())
        .env("LLAISYS_FIXTURE", FIXTURE)
        .env("LLAISYS_SLOW", SLOW)
        .env("LLAISYS_TOOLS", TOOLS)
        .env("LLAISYS_THINKING", THINKING)
        .env("LLAISYS_VISION", VISION)
        .env("LLAISYS_IMAGE", &image)
        .env("LLAISYS_SCREENSHOTS", &screenshots)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node is needed for the Web UI test");
    let mut stdin = browser.stdin.take().unwrap();
    let mut lines = BufReader::new(browser.stdout.take().unwrap()).lines();
    let mut passed = Vec::new();
    let mut server = Some(server);
    let run = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            println!("browser: {line}");
            if line == "STOP_SERVER" {
                server.take().unwrap().shutdown().await;
                stdin.write_all(b"stopped\n").await.unwrap();
            } else if let Some(step) = line.strip_prefix("PASS ") {
                passed.push(step.to_string());
            }
        }
        browser.wait().await.unwrap()
    };
    let status = tokio::time::timeout(std::time::Duration::from_secs(240), run).await.expect("the browser test hung");
    if let Some(server) = server {
        server.shutdown().await;
    }
    assert!(status.success(), "the browser test failed after {passed:?} (screenshot: {})", screenshots.display());
    assert_eq!(passed.last().map(String::as_str), Some("all"), "{passed:?}");
    assert_eq!(passed.len(), 11, "{passed:?}");
}
