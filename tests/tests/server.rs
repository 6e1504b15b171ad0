//! The real server on an ephemeral loopback port with a tiny fixture, driven over HTTP.

use std::time::Duration;

use futures_util::StreamExt;
use llaisys_model::Tokenizer;
use llaisys_server::{Config, Server};
use llaisys_tests::{Reference, demo_model, fixture_dir, gguf_fixture};
use serde_json::{Value, json};

mod common;
use common::{post, server_for, sse, url};

const FIXTURE: &str = "tiny-untied-f32";

/// A server for the fixture with extra `section.key=value` settings.
async fn server(settings: &[(&str, &str)]) -> Server {
    server_for(&fixture_dir(FIXTURE), settings).await
}

/// The chunks' JSON (all but `[DONE]`, which must come last, once).
fn chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect()
}

fn reference_text(p: &llaisys_tests::PromptRef) -> String {
    Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap().decode(&p.greedy, true).unwrap()
}

async fn metric(s: &Server, name: &str) -> f64 {
    let text = reqwest::get(url(s, "/metrics")).await.unwrap().text().await.unwrap();
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_from_token_ids_match_the_reference_streamed_or_not() {
    let s = server(&[]).await;
    let reference = Reference::load(FIXTURE);
    for p in &reference.prompts {
        let body = json!({"model": FIXTURE, "prompt": p.ids, "max_tokens": 20, "temperature": 0, "ignore_eos": true, "logprobs": 2});
        let (status, r) = post(&s, "/v1/completions", body.clone()).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["object"], "text_completion");
        assert_eq!(r["choices"][0]["text"], reference_text(p));
        assert_eq!(r["choices"][0]["finish_reason"], "length");
        assert_eq!(
            (r["usage"]["prompt_tokens"].as_u64(), r["usage"]["completion_tokens"].as_u64()),
            (Some(p.ids.len() as u64), Some(20))
        );
        assert_eq!(r["usage"]["total_tokens"].as_u64(), Some(p.ids.len() as u64 + 20));
        let lp = &r["choices"][0]["logprobs"];
        assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 20);
        assert!(lp["top_logprobs"].as_array().unwrap().iter().all(|m| m.as_object().unwrap().len() <= 2));
        assert!(lp["token_logprobs"].as_array().unwrap().iter().all(|v| v.as_f64().unwrap() <= 0.0));
        let mut streamed = body;
        streamed["stream"] = json!(true);
        let chunks = chunks(&sse(&s, "/v1/completions", streamed).await);
        let text: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
        assert_eq!(text, reference_text(p));
        let finishes: Vec<&Value> =
            chunks.iter().map(|c| &c["choices"][0]["finish_reason"]).filter(|f| !f.is_null()).collect();
        assert_eq!(finishes, vec!["length"]);
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_a_role_chunk_deltas_a_finish_and_usage() {
    let s = server(&[]).await;
    let body = json!({"model": FIXTURE, "messages": [{"role": "user", "content": "Hello 你好"}], "max_tokens": 12, "temperature": 0});
    let (status, whole) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = chunks(&sse(&s, "/v1/chat/completions", streamed).await);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    let text: String = chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str()).collect();
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap(), "streamed = whole");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
    assert_eq!(usage["usage"]["prompt_tokens"], whole["usage"]["prompt_tokens"]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_seeds_and_stop_strings() {
    let s = server(&[]).await;
    let body = json!({"model": FIXTURE, "prompt": "The capital of France is", "max_tokens": 10, "temperature": 1.0, "seed": 7, "n": 3});
    let body_n = body.clone();
    let (_, a) = post(&s, "/v1/completions", body.clone()).await;
    let (_, b) = post(&s, "/v1/completions", body).await;
    let texts = |r: &Value| {
        r["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(texts(&a).len(), 3);
    assert_eq!(texts(&a), texts(&b), "same seed, same outputs");
    assert_eq!(a["usage"]["completion_tokens"].as_u64(), Some(30));
    assert_eq!(a["choices"][2]["index"], 2);
    // Streamed, the three choices interleave; each index carries its own text and one finish.
    let mut streamed = body_n.clone();
    streamed["stream"] = json!(true);
    let chunks = chunks(&sse(&s, "/v1/completions", streamed).await);
    for (i, expected) in texts(&a).iter().enumerate() {
        let mine: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]).filter(|c| c["index"] == i).collect();
        let text: String = mine.iter().map(|c| c["text"].as_str().unwrap()).collect();
        assert_eq!(&text, expected, "choice {i}");
        assert_eq!(mine.iter().filter(|c| !c["finish_reason"].is_null()).count(), 1, "choice {i}");
    }
    // A stop string taken from the middle of the greedy text ends the text before it.
    let p = &Reference::load(FIXTURE).prompts[0];
    let full = reference_text(p);
    let stop: String = full.chars().skip(6).take(3).collect();
    let body = json!({"model": FIXTURE, "prompt": p.ids, "max_tokens": 20, "temperature": 0, "ignore_eos": true, "stop": [stop]});
    let (_, r) = post(&s, "/v1/completions", body).await;
    let text = r["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text, &full[..full.find(&stop).unwrap()]);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_an_openai_error_object_and_changes_nothing() {
    let s = server(&[("server.max_body_bytes", "4096")]).await;
    let client = reqwest::Client::new();
    let good = json!({"model": FIXTURE, "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0});
    let (_, before) = post(&s, "/v1/completions", good.clone()).await;
    let raw = |body: &'static str| {
        client.post(url(&s, "/v1/completions")).header("content-type", "application/json").body(body).send()
    };
    let cases: Vec<(reqwest::Response, u16, Option<&str>)> = vec![
        (raw("{not json").await.unwrap(), 400, None),
        (
            raw(r#"{"model": "tiny-untied-f32", "prompt": [1], "max_tokens": "ten"}"#).await.unwrap(),
            400,
            Some("max_tokens"),
        ),
        (raw(r#"{"model": "tiny-untied-f32", "prompt": [1], "temperature": 1e9}"#).await.unwrap(), 400, None),
        (raw(r#"{"model": "gpt-4", "prompt": [1]}"#).await.unwrap(), 404, Some("model")),
        (
            raw(r#"{"model": "tiny-untied-f32", "prompt": [1], "max_tokens": 0}"#).await.unwrap(),
            400,
            Some("max_tokens"),
        ),
        (
            raw(r#"{"model": "tiny-untied-f32", "prompt": [1], "max_tokens": -5}"#).await.unwrap(),
            400,
            Some("max_tokens"),
        ),
        (raw(r#"{"model": "tiny-untied-f32", "prompt": [99999]}"#).await.unwrap(), 400, Some("prompt")),
        (client.get(url(&s, "/v1/nothing")).send().await.unwrap(), 404, None),
        (client.post(url(&s, "/v1/completions")).body(vec![b' '; 10_000]).send().await.unwrap(), 413, None),
    ];
    for (i, (response, status, param)) in cases.into_iter().enumerate() {
        assert_eq!(response.status().as_u16(), status, "case {i}");
        assert!(response.headers().contains_key("x-request-id"), "case {i}");
        let body: Value = response.json().await.unwrap();
        let err = &body["error"];
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()) && err["type"].is_string(), "case {i}: {body}");
        if let Some(p) = param {
            assert_eq!(err["param"], p, "case {i}: {body}");
        }
    }
    let long: Vec<u32> = (0..300).map(|i| i % 500).collect();
    let (status, body) = post(&s, "/v1/completions", json!({"model": FIXTURE, "prompt": long})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("context_length_exceeded")));
    let (status, after) = post(&s, "/v1/completions", good).await;
    assert_eq!((status, &after["choices"]), (200, &before["choices"]), "the server still answers the same");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_required_when_configured() {
    let s = server(&[("server.api_keys", r#"["sk-test"]"#)]).await;
    let client = reqwest::Client::new();
    let models = |key: Option<&'static str>| {
        let mut r = client.get(url(&s, "/v1/models"));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    assert_eq!(models(None).await.unwrap().status().as_u16(), 401);
    let wrong = models(Some("sk-wrong")).await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    assert_eq!(wrong.json::<Value>().await.unwrap()["error"]["type"], "authentication_error");
    assert_eq!(models(Some("sk-test")).await.unwrap().status().as_u16(), 200);
    assert_eq!(client.get(url(&s, "/health")).send().await.unwrap().status().as_u16(), 200, "health is open");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_with_retry_after() {
    let s = server(&[("limits.max_concurrent_requests", "1"), ("limits.max_queue", "0")]).await;
    let long = json!({"model": FIXTURE, "prompt": [1, 2, 3], "max_tokens": 200, "ignore_eos": true, "stream": true});
    let first = reqwest::Client::new().post(url(&s, "/v1/completions")).json(&long).send().await.unwrap();
    let mut body = first.bytes_stream();
    body.next().await; // admitted and streaming
    let r = reqwest::Client::new().post(url(&s, "/v1/completions")).json(&long).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().contains_key("retry-after"));
    drop(body);
    for _ in 0..200 {
        let (status, _) = post(&s, "/v1/completions", json!({"model": FIXTURE, "prompt": [1], "max_tokens": 1})).await;
        if status == 200 {
            s.shutdown().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the slot never came back after the first client left");
}

/// vLLM's `priority`: refused under first come, first served (the default), taken under
/// `limits.scheduling_policy = "priority"` (the order it gives is the admission queue's and the
/// scheduler's to test: `http::admission`, `scheduler::tests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_are_refused_under_first_come_first_served() {
    let ask = |priority: i64| json!({"model": FIXTURE, "prompt": [1, 2], "max_tokens": 2, "priority": priority});
    let s = server(&[]).await;
    let (status, body) = post(&s, "/v1/completions", ask(5)).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("priority")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("scheduling_policy"), "{body}");
    assert_eq!(post(&s, "/v1/completions", ask(0)).await.0, 200);
    s.shutdown().await;
    let s = server(&[("limits.scheduling_policy", "\"priority\"")]).await;
    for priority in [-3, 0, 7] {
        let (status, body) = post(&s, "/v1/completions", ask(priority)).await;
        assert_eq!((status, body["usage"]["completion_tokens"].as_u64()), (200, Some(2)), "{body}");
    }
    let (status, body) = post(&s, "/v1/completions", json!({"model": FIXTURE, "prompt": [1], "priority": 1.5})).await;
    assert_eq!(status, 400, "{body}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stream_frees_its_cells_and_the_cancel_endpoint_ends_with_abort() {
    let s = server(&[("engine.prefix_caching", "false")]).await;
    let long = json!({"model": FIXTURE, "prompt": [1, 2, 3], "max_tokens": 250, "ignore_eos": true, "stream": true});
    let r = reqwest::Client::new().post(url(&s, "/v1/completions")).json(&long).send().await.unwrap();
    let mut body = r.bytes_stream();
    body.next().await;
    assert!(metric(&s, "llaisys_kv_cache_cells_used").await > 0.0);
    drop(body);
    let mut freed = false;
    for _ in 0..200 {
        if metric(&s, "llaisys_kv_cache_cells_used").await == 0.0
            && metric(&s, "llaisys_num_requests_running").await == 0.0
        {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the cells of the closed stream are freed");
    assert_eq!(
        metric(&s, "llaisys_request_success_total{model=\"tiny-untied-f32\",finished_reason=\"abort\"}").await,
        1.0
    );
    // The cancel endpoint, with the id of the stream's first chunk.
    let r = reqwest::Client::new().post(url(&s, "/v1/completions")).json(&long).send().await.unwrap();
    let mut body = r.bytes_stream();
    let first = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    let chunk: Value =
        serde_json::from_str(first.trim().strip_prefix("data: ").unwrap().split("\n\n").next().unwrap()).unwrap();
    let id = chunk["id"].as_str().unwrap();
    let (status, _) = post(&s, &format!("/v1/requests/{id}/cancel"), json!({})).await;
    assert_eq!(status, 200);
    let mut rest = first;
    while let Some(bytes) = body.next().await {
        rest.push_str(&String::from_utf8_lossy(&bytes.unwrap()));
    }
    assert!(rest.contains(r#""finish_reason":"abort""#), "{rest}");
    assert!(rest.trim_end().ends_with("data: [DONE]"));
    let (status, _) = post(&s, &format!("/v1/requests/{id}/cancel"), json!({})).await;
    assert_eq!(status, 404, "finished requests are no longer cancellable");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_streams_all_finish_once() {
    let s = server(&[("engine.prefix_caching", "false")]).await;
    let tasks: Vec<_> = (0..64u32)
        .map(|i| {
            let u = url(&s, "/v1/completions");
            tokio::spawn(async move {
                let body = json!({"model": FIXTURE, "prompt": [1 + i, 2, 3 + i], "max_tokens": 8, "ignore_eos": true, "stream": true});
                let r = reqwest::Client::new().post(u).json(&body).send().await.unwrap();
                r.text().await.unwrap()
            })
        })
        .collect();
    for task in tasks {
        let text = task.await.unwrap();
        assert_eq!(text.matches("\"finish_reason\":\"length\"").count(), 1, "{text}");
        assert_eq!(text.matches("data: [DONE]").count(), 1);
        assert!(text.trim_end().ends_with("data: [DONE]"));
    }
    assert_eq!(metric(&s, "llaisys_request_success_total").await, 64.0);
    assert_eq!(metric(&s, "llaisys_generation_tokens_total").await, 64.0 * 8.0);
    assert_eq!(metric(&s, "llaisys_kv_cache_cells_used").await, 0.0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_prometheus_text_and_move() {
    let s = server(&[]).await;
    let count = || metric(&s, "llaisys_request_success_total");
    let before = count().await;
    post(&s, "/v1/completions", json!({"model": FIXTURE, "prompt": [5, 6], "max_tokens": 2})).await;
    assert_eq!(count().await, before + 1.0);
    let text = reqwest::get(url(&s, "/metrics")).await.unwrap().text().await.unwrap();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok(), "{line}");
        assert!(name.starts_with("llaisys_"), "{line}");
    }
    for name in [
        "llaisys_time_to_first_token_seconds_bucket",
        "llaisys_e2e_request_latency_seconds_count",
        "llaisys_kv_cache_usage_perc",
        "llaisys_prefix_cache_hits_total",
    ] {
        assert!(text.contains(name), "{name} missing");
    }
    // The products ran on the kernels the weights chose at load, none on a fallback.
    let ran: f64 = text
        .lines()
        .filter(|l| l.starts_with("llaisys_kernel_calls_total{") && !l.contains("fallback"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(ran > 0.0, "no linear product counted");
    assert!(text.contains("llaisys_kernel_calls_total{kernel=\"fallback\"} 0"), "a kernel fell back");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_second_turn_reuses_its_cells_and_sessions_can_be_deleted() {
    let s = server(&[("engine.prefix_caching", "false")]).await;
    let turn = |messages: Value| json!({"model": FIXTURE, "messages": messages, "max_tokens": 6, "temperature": 0, "session_id": "conv-1"});
    let (_, first) = post(&s, "/v1/chat/completions", turn(json!([{"role": "user", "content": "hello"}]))).await;
    let answer = first["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let messages = json!([{"role": "user", "content": "hello"}, {"role": "assistant", "content": answer}, {"role": "user", "content": "more"}]);
    let (_, second) = post(&s, "/v1/chat/completions", turn(messages)).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= first["usage"]["prompt_tokens"].as_u64().unwrap(), "{second}");
    let list: Value = reqwest::get(url(&s, "/v1/sessions")).await.unwrap().json().await.unwrap();
    assert_eq!(list["data"][0]["id"], "conv-1");
    assert_eq!(list["data"][0]["requests"], 2);
    let client = reqwest::Client::new();
    assert_eq!(client.delete(url(&s, "/v1/sessions/conv-1")).send().await.unwrap().status().as_u16(), 200);
    assert_eq!(client.delete(url(&s, "/v1/sessions/conv-1")).send().await.unwrap().status().as_u16(), 404);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_streams_and_refuses_new_requests() {
    let s = server(&[]).await;
    let u = url(&s, "/v1/completions");
    let body = json!({"model": FIXTURE, "prompt": [1, 2], "max_tokens": 100, "ignore_eos": true, "stream": true});
    let r = reqwest::Client::new().post(&u).json(&body).send().await.unwrap();
    let mut stream = r.bytes_stream();
    let mut text = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();
    let client = reqwest::Client::new();
    let state = s.state().clone();
    let shutdown = tokio::spawn(s.shutdown());
    while !state.is_shutting_down() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = client.post(&u).json(&json!({"model": FIXTURE, "prompt": [1]})).send().await;
    if let Ok(r) = refused {
        assert_eq!(r.status().as_u16(), 503);
    }
    while let Some(bytes) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&bytes.unwrap()));
    }
    assert!(
        text.contains(r#""finish_reason":"length""#) && text.trim_end().ends_with("data: [DONE]"),
        "drained: {text}"
    );
    shutdown.await.unwrap();
}

/// The real model, when `LLAISYS_TEST_MODEL` names it (the demo GGUF of scripts/fetch_demo_model.sh,
/// or a directory), with every weight dtype in `LLAISYS_TEST_DTYPES` (default: auto).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the demo model: scripts/fetch_demo_model.sh, then LLAISYS_TEST_MODEL=models/qwen2.5-coder-0.5b-instruct.gguf"]
async fn the_demo_model_knows_the_capital_of_france() {
    let path = demo_model();
    let dtypes = std::env::var("LLAISYS_TEST_DTYPES").unwrap_or_else(|_| "auto".into());
    for dtype in dtypes.split(',') {
        let settings = vec![
            ("model.path".to_string(), format!("{path:?}")),
            ("model.dtype".into(), format!("{dtype:?}")),
            ("server.port".into(), "0".into()),
        ];
        let s = llaisys_server::start(&Config::load(None, std::iter::empty(), &settings).unwrap()).await.unwrap();
        let name = s.state().engines.models().next().unwrap().to_string();
        let question = "What is the capital of France? Answer in one sentence.";
        let body = json!({"model": name, "messages": [{"role": "user", "content": question}], "max_tokens": 30, "temperature": 0});
        let (status, r) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{r}");
        let answer = r["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        eprintln!("{dtype}: {answer}");
        assert!(answer.contains("Paris"), "{dtype}: {r}");
        s.shutdown().await;
    }
}

/// The real model, a code model trained to fill in the middle: given the line after the cursor
/// and the code after it, its greedy middle is the body of the function (the same middle
/// llama.cpp's server writes for this prompt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the demo model: scripts/fetch_demo_model.sh, then LLAISYS_TEST_MODEL=models/qwen2.5-coder-0.5b-instruct.gguf"]
async fn the_demo_model_fills_in_the_body_of_a_function() {
    let path = demo_model();
    let settings = vec![("model.path".to_string(), format!("{path:?}")), ("server.port".into(), "0".into())];
    let s = llaisys_server::start(&Config::load(None, std::iter::empty(), &settings).unwrap()).await.unwrap();
    let name = s.state().engines.models().next().unwrap().to_string();
    let body = json!({"model": name, "prompt": "def fib(n):\n    ", "suffix": "\n\nprint(fib(10))\n",
                      "max_tokens": 32, "temperature": 0});
    let (status, r) = post(&s, "/v1/completions", body).await;
    assert_eq!(status, 200, "{r}");
    let middle = r["choices"][0]["text"].as_str().unwrap().replace(' ', "");
    assert!(middle.starts_with("ifn<=1:") && middle.contains("returnfib(n-1)+fib(n-2)"), "{r}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_ui_is_served_from_the_binary_and_can_be_turned_off() {
    let s = server(&[("server.api_keys", r#"["k"]"#)]).await;
    let page = reqwest::get(url(&s, "/")).await.unwrap();
    assert_eq!(page.status().as_u16(), 200, "the page is open even with API keys");
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'self'"));
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"src="/ui/app.js""#) && !html.contains("http://") && !html.contains("https://"));
    for (file, content_type) in
        [("app.js", "text/javascript"), ("style.css", "text/css"), ("icon.svg", "image/svg+xml")]
    {
        let r = reqwest::get(url(&s, &format!("/ui/{file}"))).await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{file}");
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with(content_type), "{file}");
    }
    let missing = reqwest::get(url(&s, "/ui/nope.js")).await.unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    assert_eq!(missing.json::<Value>().await.unwrap()["error"]["type"], "not_found_error");
    s.shutdown().await;
    let off = server(&[("server.webui", "false")]).await;
    assert_eq!(reqwest::get(url(&off, "/")).await.unwrap().status().as_u16(), 404);
    off.shutdown().await;
}

/// A GGUF file served directly: named after the file, its own tokenizer and chat template, and
/// the F32 file's greedy text equal to the safetensors model's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gguf_files_serve_with_their_own_tokenizer_and_template() {
    let reference = Reference::load("tiny-tied-f32");
    let hf_tokenizer = Tokenizer::from_dir(&fixture_dir("tiny-tied-f32")).unwrap();
    for name in ["tiny-tied-f32", "tiny-kquant"] {
        let s = server_for(&gguf_fixture(name), &[]).await;
        let models: Value = reqwest::get(url(&s, "/v1/models")).await.unwrap().json().await.unwrap();
        assert_eq!(models["data"][0]["id"], name);
        for p in &reference.prompts {
            let body = json!({"model": name, "prompt": p.text, "max_tokens": 20, "temperature": 0, "ignore_eos": true});
            let (status, r) = post(&s, "/v1/completions", body).await;
            assert_eq!(status, 200, "{r}");
            assert_eq!(r["usage"]["prompt_tokens"].as_u64(), Some(p.ids.len() as u64), "{name}: the prompt's ids");
            assert_eq!(r["usage"]["completion_tokens"].as_u64(), Some(20));
            if name == "tiny-tied-f32" {
                assert_eq!(r["choices"][0]["text"], hf_tokenizer.decode(&p.greedy, true).unwrap());
            }
        }
        let body =
            json!({"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0});
        let (status, r) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{r}");
        // The chat template was rendered: "<|im_start|>system\n…<|im_end|>\n<|im_start|>user\nHi…".
        assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() > 10, "{r}");
        s.shutdown().await;
    }
}

/// Qwen3, Llama 3, the MoE families and Qwen3.5 through the server as directories and GGUF files: a text prompt (Llama's
/// with its BOS) continues as transformers' greedy tokens, the three prompts at once (batched)
/// and again (their prefixes cached) and with speculation on; a chat renders the family's own
/// template and ends on its end-of-turn token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_and_llama_serve_like_transformers_batched_cached_and_speculative() {
    for (fixture, path) in [
        ("tiny-qwen3-f32", fixture_dir("tiny-qwen3-f32")),
        ("tiny-llama-f32", fixture_dir("tiny-llama-f32")),
        ("tiny-qwen3-f32", gguf_fixture("tiny-qwen3-f32")),
        ("tiny-llama-f32", gguf_fixture("tiny-llama-f32")),
        ("tiny-qwen3moe-f32", fixture_dir("tiny-qwen3moe-f32")),
        ("tiny-qwen2moe-f32", gguf_fixture("tiny-qwen2moe-f32")),
        ("tiny-qwen35-f32", fixture_dir("tiny-qwen35-f32")),
        ("tiny-qwen35moe-f32", fixture_dir("tiny-qwen35moe-f32")),
        ("tiny-qwen35-f32", gguf_fixture("tiny-qwen35-f32")),
        ("tiny-qwen3next-f32", fixture_dir("tiny-qwen3next-f32")),
    ] {
        let s = server_for(&path, &[("speculative.ngram_min", "1")]).await;
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let reference = Reference::load(fixture);
        let tokenizer = Tokenizer::from_dir(&fixture_dir(fixture)).unwrap();
        for round in 0..2 {
            let requests = reference.prompts.iter().map(|p| {
                let body = json!({"model": name, "prompt": p.text, "max_tokens": 20, "temperature": 0,
                                  "ignore_eos": true, "speculative": round == 1});
                let s = &s;
                async move { (p, post(s, "/v1/completions", body).await) }
            });
            for (p, (status, r)) in futures_util::future::join_all(requests).await {
                assert_eq!(status, 200, "{r}");
                assert_eq!(r["usage"]["prompt_tokens"].as_u64(), Some(p.ids.len() as u64), "{name}: {:?}", p.text);
                let want = tokenizer.decode(&p.greedy, true).unwrap();
                assert_eq!(r["choices"][0]["text"], want, "{name} round {round}: {:?}", p.text);
            }
        }
        // The second round reused the first's cells (Qwen3.5's states from the checkpoints kept
        // a token short of each prompt's end) and still continued as transformers.
        let hits = metric(&s, "llaisys_prefix_cache_hits_total").await;
        assert!(hits > 0.0, "{name}: the second round reused no cells");
        let body = json!({"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 30,
                          "temperature": 0});
        let (status, r) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{r}");
        let end = if fixture.contains("llama") { "<|eot_id|>" } else { "<|im_end|>" };
        let template = llaisys_model::tokenizer::ChatTemplate::from_dir(&fixture_dir(fixture)).unwrap().unwrap();
        let rendered = template.render(&[llaisys_model::tokenizer::ChatMessage::new("user", "Hi")], true).unwrap();
        let prompt_ids = tokenizer.encode(&rendered).unwrap();
        assert_eq!(r["usage"]["prompt_tokens"].as_u64(), Some(prompt_ids.len() as u64), "{name}: {rendered:?}");
        assert_eq!(
            prompt_ids.iter().filter(|&&t| Some(t) == tokenizer.token_to_id("<|begin_of_text|>")).count(),
            usize::from(fixture.contains("llama")),
            "{name}: one BOS, from the template"
        );
        if r["choices"][0]["finish_reason"] == "stop" {
            assert!(!r["choices"][0]["message"]["content"].as_str().unwrap_or_default().contains(end), "{r}");
        }
        s.shutdown().await;
    }
}

/// A reasoning model's thinking over HTTP: `message.reasoning_content` (and `reasoning`) with
/// `content` null when the output never left its thinking, the streamed `delta.reasoning_content`
/// pieces adding up to it byte for byte; `chat_template_kwargs` reach the template, and a bad
/// one is a 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_comes_as_reasoning_content_streamed_or_not() {
    let thinking = llaisys_tests::FixtureCopy::thinking("tiny-qwen3-f32");
    let s = server_for(thinking.path(), &[]).await;
    let body = |stream: bool| {
        json!({"model": thinking.path().file_name().unwrap().to_string_lossy(), "messages": [{"role": "user", "content": "Hi"}],
               "max_tokens": 10, "temperature": 0, "ignore_eos": true, "stream": stream})
    };
    let (status, r) = post(&s, "/v1/chat/completions", body(false)).await;
    assert_eq!(status, 200, "{r}");
    let message = &r["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap_or_else(|| panic!("{r}"));
    assert!(!reasoning.is_empty() && message["reasoning"] == message["reasoning_content"], "{r}");
    assert!(message["content"].is_null(), "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    let events = chunks(&sse(&s, "/v1/chat/completions", body(true)).await);
    let streamed: String =
        events.iter().filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str()).collect();
    assert_eq!(streamed, reasoning);
    assert!(events.iter().all(|c| c["choices"][0]["delta"]["content"].as_str().unwrap_or_default().is_empty()));
    s.shutdown().await;

    let s = server_for(&fixture_dir("tiny-qwen3-f32"), &[]).await;
    let chat = |kwargs: Value| {
        json!({"model": "tiny-qwen3-f32", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
               "temperature": 0, "chat_template_kwargs": kwargs})
    };
    let (_, on) = post(&s, "/v1/chat/completions", chat(json!({}))).await;
    let (status, off) = post(&s, "/v1/chat/completions", chat(json!({"enable_thinking": false}))).await;
    assert_eq!(status, 200, "{off}");
    let tokens = |r: &Value| r["usage"]["prompt_tokens"].as_u64().unwrap();
    // "<think>\n\n</think>\n\n" in the fixture's vocabulary.
    assert_eq!(tokens(&off), tokens(&on) + 4, "{on} {off}");
    let (status, err) = post(&s, "/v1/chat/completions", chat(json!({"add_generation_prompt": false}))).await;
    assert_eq!((status, err["error"]["param"].as_str()), (400, Some("chat_template_kwargs")), "{err}");
    let (status, err) = post(&s, "/v1/chat/completions", chat(json!(5))).await;
    assert_eq!(status, 400, "{err}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_and_the_http_api_tokenize_and_answer_a_chat_identically() {
    use llaisys_actors::{ChatRequest, Engine};
    let s = server(&[]).await;
    let engine = Engine::builder().model(fixture_dir(FIXTURE)).build().await.unwrap();
    // A developer message (the template knows only `system`) and content as parts.
    let body = json!({
        "model": FIXTURE, "temperature": 0, "max_tokens": 12,
        "messages": [
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": "Where is "}, {"type": "text", "text": "Paris?"}]},
        ],
    });
    let request = ChatRequest::default()
        .message("developer", "Answer briefly.")
        .user("Where is Paris?")
        .max_tokens(12)
        .temperature(0.0);
    let library_prompt = engine.prepare_chat(&request).unwrap().prompts()[0].clone();
    let (status, tokenized) =
        post(&s, "/tokenize", json!({"model": FIXTURE, "messages": body["messages"].clone()})).await;
    assert_eq!(status, 200, "{tokenized}");
    let http_prompt: Vec<u32> = serde_json::from_value(tokenized["tokens"].clone()).unwrap();
    assert_eq!(http_prompt, library_prompt);

    let answer = engine.chat(request).await.unwrap().answer().await;
    let (status, r) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], library_prompt.len());
    assert_eq!(r["usage"]["completion_tokens"], answer.usage.completion_tokens);
    assert_eq!(r["choices"][0]["message"]["content"], answer.text());
    assert_eq!(r["choices"][0]["finish_reason"], answer.choices[0].finish.as_str());
    // Streamed, the same text.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let text: String = chunks(&sse(&s, "/v1/chat/completions", streamed).await)
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, answer.text());
    engine.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_requests_answer_as_plain_ones_and_are_counted() {
    let p = &Reference::load(FIXTURE).prompts[0];
    // A prompt that repeats itself: prompt lookup finds what follows.
    let prompt: Vec<u32> = p.ids.iter().chain(&p.ids).chain(&p.ids[..p.ids.len() / 2]).copied().collect();
    let body = |speculative: bool, stream: bool| {
        json!({"model": FIXTURE, "prompt": prompt, "max_tokens": 30, "temperature": 0, "ignore_eos": true,
               "speculative": speculative, "stream": stream})
    };
    // Prompt lookup from 1-grams, and the fixture as its own draft model, whose greedy proposals
    // are all the target's own tokens; speculation off by default: each request decides. The
    // proposals are of fixed length: this tiny model's steps are too short for a learnt cost.
    let draft = format!("{:?}", fixture_dir(FIXTURE).display().to_string());
    for settings in [("speculative.ngram_min", "1"), ("speculative.draft_model", draft.as_str())] {
        let s = server(&[settings, ("speculative.adaptive", "false")]).await;
        let (_, plain) = post(&s, "/v1/completions", body(false, false)).await;
        assert_eq!(metric(&s, "llaisys_spec_decode_num_draft_tokens_total").await, 0.0);
        let (_, fast) = post(&s, "/v1/completions", body(true, false)).await;
        assert_eq!(fast["choices"][0]["text"], plain["choices"][0]["text"], "{settings:?}");
        assert_eq!(fast["usage"]["completion_tokens"], 30);
        let streamed: String = chunks(&sse(&s, "/v1/completions", body(true, true)).await)
            .iter()
            .map(|c| c["choices"][0]["text"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(streamed, plain["choices"][0]["text"].as_str().unwrap(), "{settings:?}");
        // Whether the random fixture's greedy answer copies its prompt, as prompt lookup guesses,
        // depends on the CPU's rounding, so only the draft model is held to acceptances.
        let lookup = settings.0 == "speculative.ngram_min";
        let proposed = metric(&s, "llaisys_spec_decode_num_draft_tokens_total").await;
        let accepted = metric(&s, "llaisys_spec_decode_num_accepted_tokens_total").await;
        let rejected = metric(&s, "llaisys_spec_decode_num_rejected_tokens_total").await;
        assert!(proposed > 0.0 && proposed == accepted + rejected, "{settings:?}: {proposed} {accepted} {rejected}");
        assert!(lookup || accepted > 0.0, "{settings:?}: {proposed} {accepted} {rejected}");
        s.shutdown().await;
    }
    // A setting out of range is refused at start, naming its key.
    let settings = [
        ("model.path".into(), format!("{:?}", fixture_dir(FIXTURE).display().to_string())),
        ("speculative.max_draft".into(), "64".into()),
    ];
    let config = Config::load(None, std::iter::empty(), &settings);
    let err = config.expect_err("refused").to_string();
    assert!(err.contains("speculative.max_draft"), "{err}");
}

/// `POST /v1/files` of `content` (a JSONL file) for `purpose`, as multipart form data.
fn upload_request(client: &reqwest::Client, s: &Server, purpose: &str, content: &str) -> reqwest::RequestBuilder {
    let part = |name: &str, extra: &str, value: &str| {
        format!("--B\r\ncontent-disposition: form-data; name=\"{name}\"{extra}\r\n\r\n{value}\r\n")
    };
    let body = part("purpose", "", purpose) + &part("file", "; filename=\"in.jsonl\"", content) + "--B--\r\n";
    client.post(url(s, "/v1/files")).header("content-type", "multipart/form-data; boundary=B").body(body)
}

/// OpenAI's Batch API beside API keys and a small file store: uploads are checked (key,
/// purpose, size), a file of malformed lines fails its batch listing each line's fault, a good
/// one runs although its requests carry no key (they are made in process), and deleting a file
/// gives its bytes back. The official client's round trip is in `official_clients.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_check_their_files_and_run_in_process() {
    let line = |id: &str, url: &str| {
        json!({"custom_id": id, "method": "POST", "url": url,
               "body": {"model": FIXTURE, "prompt": [1, 2], "max_tokens": 2}})
        .to_string()
    };
    let good = [line("a", "/v1/completions"), line("b", "/v1/completions")].join("\n");
    let faulty =
        [line("a", "/v1/completions"), "not json".into(), line("a", "/v1/completions"), line("c", "/v1/embeddings")];
    let faulty = faulty.join("\n");
    // Room for either file, not both.
    let limit = faulty.len() + good.len() - 1;
    let s = server(&[("server.api_keys", r#"["sk-test"]"#), ("server.stored_files_bytes", &limit.to_string())]).await;
    let client = reqwest::Client::new();
    let upload = |key: Option<&str>, purpose: &str, content: String| {
        let mut r = upload_request(&client, &s, purpose, &content);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut r = client.request(method, url(&s, path)).bearer_auth("sk-test");
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    assert_eq!(upload(None, "batch", good.clone()).await.0, 401);
    let (status, body) = upload(Some("sk-test"), "fine-tune", good.clone()).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("purpose")), "{body}");
    assert_eq!(upload(Some("sk-test"), "batch", "x".repeat(limit + 1)).await.0, 413);

    let (status, file) = upload(Some("sk-test"), "batch", faulty).await;
    assert_eq!(status, 200, "{file}");
    let create = |file: &Value, endpoint: &str, window: &str| json!({"input_file_id": file["id"], "endpoint": endpoint, "completion_window": window});
    let (status, body) = call(reqwest::Method::POST, "/v1/batches", Some(create(&file, "/v1/models", "24h"))).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("endpoint")), "{body}");
    let (status, body) = call(reqwest::Method::POST, "/v1/batches", Some(create(&file, "/v1/completions", "1h"))).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("completion_window")), "{body}");
    let unknown = json!({"id": "file-nope"});
    assert_eq!(
        call(reqwest::Method::POST, "/v1/batches", Some(create(&unknown, "/v1/completions", "24h"))).await.0,
        404
    );
    assert_eq!(call(reqwest::Method::GET, "/v1/batches/batch_nope", None).await.0, 404);

    let finished = |batch: Value| async move {
        let path = format!("/v1/batches/{}", batch["id"].as_str().unwrap());
        for _ in 0..500 {
            let (_, b) = call(reqwest::Method::GET, &path, None).await;
            if ["completed", "failed", "cancelled"].contains(&b["status"].as_str().unwrap()) {
                return b;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the batch never finished");
    };
    let (_, batch) = call(reqwest::Method::POST, "/v1/batches", Some(create(&file, "/v1/completions", "24h"))).await;
    let failed = finished(batch).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let faults: Vec<(u64, &str)> = failed["errors"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["line"].as_u64().unwrap(), e["code"].as_str().unwrap()))
        .collect();
    assert_eq!(faults, [(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_endpoint")]);

    // The store is nearly full: deleting the faulty file makes room for the good one.
    assert_eq!(upload(Some("sk-test"), "batch", good.clone()).await.0, 413);
    let path = format!("/v1/files/{}", file["id"].as_str().unwrap());
    assert_eq!(call(reqwest::Method::DELETE, &path, None).await.1["deleted"], true);
    assert_eq!(call(reqwest::Method::GET, &path, None).await.0, 404);
    let (status, file) = upload(Some("sk-test"), "batch", good).await;
    assert_eq!(status, 200, "{file}");
    let (_, batch) = call(reqwest::Method::POST, "/v1/batches", Some(create(&file, "/v1/completions", "24h"))).await;
    let done = finished(batch).await;
    assert_eq!(
        (&done["status"], &done["request_counts"]),
        (&json!("completed"), &json!({"total": 2, "completed": 2, "failed": 0})),
        "{done}"
    );
    assert!(done["error_file_id"].is_null());
    let content = client
        .get(url(&s, &format!("/v1/files/{}/content", done["output_file_id"].as_str().unwrap())))
        .bearer_auth("sk-test")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ids: Vec<String> =
        content.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["custom_id"].to_string()).collect();
    assert_eq!(ids, ["\"a\"", "\"b\""]);
    s.shutdown().await;
}

/// A cancelled batch starts no further request; what it answered is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_batch_keeps_what_it_answered() {
    let s = server(&[("limits.max_concurrent_requests", "2")]).await;
    let client = reqwest::Client::new();
    let lines: Vec<String> = (0..200)
        .map(|i| {
            json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/completions",
                   "body": {"model": FIXTURE, "prompt": [1, 2], "max_tokens": 100, "ignore_eos": true}})
            .to_string()
        })
        .collect();
    let r = upload_request(&client, &s, "batch", &lines.join("\n"));
    let file: Value = r.send().await.unwrap().json().await.unwrap();
    let create = json!({"input_file_id": file["id"], "endpoint": "/v1/completions", "completion_window": "24h"});
    let (_, batch) = post(&s, "/v1/batches", create).await;
    let id = batch["id"].as_str().unwrap();
    let (status, cancelling) = post(&s, &format!("/v1/batches/{id}/cancel"), json!({})).await;
    assert_eq!((status, cancelling["status"].as_str()), (200, Some("cancelling")), "{cancelling}");
    let mut done = Value::Null;
    for _ in 0..500 {
        done = reqwest::get(url(&s, &format!("/v1/batches/{id}"))).await.unwrap().json().await.unwrap();
        if done["status"] == "cancelled" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(done["status"], "cancelled", "{done}");
    let answered = done["request_counts"]["completed"].as_u64().unwrap();
    assert!(answered < 200 && done["request_counts"]["total"] == 200, "{done}");
    let kept = match done["output_file_id"].as_str() {
        Some(f) => reqwest::get(url(&s, &format!("/v1/files/{f}/content")))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
            .lines()
            .count(),
        None => 0,
    };
    assert_eq!(kept as u64, answered);
    s.shutdown().await;
}

/// Anthropic's Message Batches refuse malformed requests at once, in Anthropic's error shape;
/// results and deletion wait for the batch to end; a cancelled one marks what it did not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_batches_check_their_requests_and_end_before_results() {
    let s = server(&[("limits.max_concurrent_requests", "2")]).await;
    let params = json!({"model": FIXTURE, "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]});
    let request = |id: &str| json!({"custom_id": id, "params": params});
    let refused = [
        json!({"requests": []}),
        json!({"requests": [request("has space")]}),
        json!({"requests": [request("a"), request("a")]}),
        json!({"requests": [{"custom_id": "s", "params": {"model": FIXTURE, "stream": true, "max_tokens": 1}}]}),
        json!({"requests": [{"custom_id": "p"}]}),
    ];
    for body in refused {
        let (status, answer) = post(&s, "/v1/messages/batches", body.clone()).await;
        assert_eq!((status, answer["type"].as_str()), (400, Some("error")), "{body} → {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
    }
    let (status, missing) = common::get(&s, "/v1/messages/batches/msgbatch_nope").await;
    assert_eq!((status, missing["error"]["type"].as_str()), (404, Some("not_found_error")), "{missing}");

    let requests: Vec<Value> = (0..100).map(|i| request(&format!("r{i}"))).collect();
    let (status, batch) = post(&s, "/v1/messages/batches", json!({"requests": requests})).await;
    assert_eq!((status, batch["processing_status"].as_str()), (200, Some("in_progress")), "{batch}");
    let id = batch["id"].as_str().unwrap();
    assert!(id.starts_with("msgbatch_") && batch["results_url"].is_null());
    assert_eq!(common::get(&s, &format!("/v1/messages/batches/{id}/results")).await.0, 400, "not ended yet");
    let r = reqwest::Client::new().delete(url(&s, &format!("/v1/messages/batches/{id}"))).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400, "still processing");
    let (_, cancelling) = post(&s, &format!("/v1/messages/batches/{id}/cancel"), json!({})).await;
    assert_eq!(cancelling["processing_status"], "canceling", "{cancelling}");
    let mut ended = Value::Null;
    for _ in 0..500 {
        ended = common::get(&s, &format!("/v1/messages/batches/{id}")).await.1;
        if ended["processing_status"] == "ended" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let counts = &ended["request_counts"];
    assert_eq!(ended["processing_status"], "ended", "{ended}");
    let (succeeded, canceled) = (counts["succeeded"].as_u64().unwrap(), counts["canceled"].as_u64().unwrap());
    assert!(canceled > 0 && succeeded + canceled == 100 && counts["processing"] == 0, "{ended}");
    let results = reqwest::get(url(&s, ended["results_url"].as_str().unwrap())).await.unwrap().text().await.unwrap();
    let types: Vec<String> = results
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["result"]["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types.len(), 100);
    assert_eq!(types.iter().filter(|t| *t == "canceled").count() as u64, canceled);
    assert!(types.iter().skip_while(|t| *t == "succeeded").all(|t| t == "canceled"), "in order: {types:?}");
    let r = reqwest::Client::new().delete(url(&s, &format!("/v1/messages/batches/{id}"))).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    s.shutdown().await;
}
