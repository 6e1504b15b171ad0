//! What the HTTP test files share: a server on an ephemeral loopback port, and requests to it.
#![allow(dead_code)] // each test file uses its own part

use llaisys_server::{Config, Server};
use serde_json::Value;

/// A server for the model at `path` (a directory or a GGUF file) with extra
/// `section.key=value` settings.
pub async fn server_for(path: &std::path::Path, settings: &[(&str, &str)]) -> Server {
    let mut all: Vec<(String, String)> =
        vec![("model.path".into(), format!("{:?}", path.display().to_string())), ("server.port".into(), "0".into())];
    all.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let config = Config::load(None, std::iter::empty(), &all).unwrap();
    llaisys_server::start(&config).await.unwrap()
}

pub fn url(s: &Server, path: &str) -> String {
    format!("http://{}{path}", s.addr)
}

pub async fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new().post(url(s, path)).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub async fn get(s: &Server, path: &str) -> (u16, Value) {
    let r = reqwest::get(url(s, path)).await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// All `data:` payloads of an SSE response, `[DONE]` included.
pub async fn sse(s: &Server, path: &str, body: Value) -> Vec<String> {
    events(s, path, body).await.into_iter().map(|(_, data)| data).collect()
}

/// The `data:` payloads of an SSE response as JSON (`[DONE]` left out).
pub async fn sse_json(s: &Server, path: &str, body: Value) -> Vec<Value> {
    let data = sse(s, path, body).await;
    data.iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect()
}

/// Every event of an SSE response: its `event:` name (if any) and its data.
pub async fn events(s: &Server, path: &str, body: Value) -> Vec<(Option<String>, String)> {
    let r = reqwest::Client::new().post(url(s, path)).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|block| {
            let (mut name, mut data) = (None, None);
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_string());
                }
            }
            Some((name, data?))
        })
        .collect()
}
