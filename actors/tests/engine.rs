//! The actor engine end to end on the tiny fixtures and the mock model.

use std::sync::Arc;
use std::time::Duration;

use llaisys_actors::request::FinishReason;
use llaisys_actors::{
    Engine, EngineConfig, Event, EventStream, GenerateParams, GenerateRequest, ModelLoader, Router, Usage,
};
use llaisys_model::{Device, LoadOptions, ModelSource, Tokenizer, load_model};
use llaisys_tests::{Reference, fixture_dir};

mod common;
use common::wait_idle;

/// How long a test waits for the engine to go idle.
const IDLE: Duration = Duration::from_secs(2);

const FIXTURE: &str = "tiny-untied-f32";

async fn engine(config: EngineConfig) -> Engine {
    let dir = fixture_dir(FIXTURE);
    let model =
        load_model(None, Some(&ModelSource::Dir(dir.clone())), &LoadOptions::default(), &Device::flex()).unwrap();
    Engine::start(model, Some(Tokenizer::from_dir(&dir).unwrap()), config).await.unwrap()
}

fn mock_config() -> EngineConfig {
    EngineConfig {
        kv_capacity: 256,
        max_seqs_per_step: 8,
        max_tokens_per_step: 8,
        prefix_caching: false,
        ..EngineConfig::default()
    }
}

async fn mock_engine(fail_on_token: Option<u32>) -> Engine {
    mock_engine_with(fail_on_token, mock_config()).await
}

/// A mock engine that reloads the model from its directory when the worker is replaced.
async fn mock_engine_with(fail_on_token: Option<u32>, config: EngineConfig) -> Engine {
    // The loader holds the folder: it goes with the engine.
    let dir = tempfile_dir(fail_on_token);
    let loader: ModelLoader = Arc::new(move || {
        load_model(None, Some(&ModelSource::Dir(dir.path().into())), &LoadOptions::default(), &Device::flex())
    });
    Engine::start_with_loader(loader, None, config).await.unwrap()
}

/// A mock model directory (config.json only), removed when dropped.
fn tempfile_dir(fail_on_token: Option<u32>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fail = fail_on_token.map_or(String::new(), |t| format!(r#","fail_on_token":{t}"#));
    let config = format!(r#"{{"model_type":"mock","vocab_size":200{fail}}}"#);
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    dir
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest::new(prompt, GenerateParams { max_tokens, ignore_eos: true, ..GenerateParams::default() })
}

fn in_session(prompt: Vec<u32>, max_tokens: usize, session: &str) -> GenerateRequest {
    GenerateRequest { session: Some(session.into()), ..request(prompt, max_tokens) }
}

fn usage(event: &Event) -> Usage {
    match event {
        Event::Finished { usage, .. } => *usage,
        other => panic!("not a finish: {other:?}"),
    }
}

/// All events of a stream: the tokens and the final event.
async fn collect(mut stream: EventStream) -> (Vec<u32>, String, Event) {
    let (mut tokens, mut text) = (Vec::new(), String::new());
    loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await.expect("an event within 30 s") {
            Some(Event::Token { token, text: t, .. }) => {
                tokens.push(token);
                text.push_str(&t);
            }
            Some(finished @ Event::Finished { .. }) => {
                if let Event::Finished { text: t, .. } = &finished {
                    text.push_str(t);
                }
                assert!(stream.next().await.is_none(), "nothing after Finished");
                return (tokens, text, finished);
            }
            None => panic!("stream ended without Finished"),
        }
    }
}

fn reason(event: &Event) -> FinishReason {
    match event {
        Event::Finished { reason, .. } => *reason,
        other => panic!("not a finish: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_match_the_transformers_reference() {
    let reference = Reference::load(FIXTURE);
    let engine = engine(EngineConfig {
        kv_capacity: 512,
        max_seqs_per_step: 8,
        max_tokens_per_step: 16,
        ..EngineConfig::default()
    })
    .await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        for p in &reference.prompts {
            streams.push(engine.generate(request(p.ids.clone(), 20)).await.unwrap());
        }
    }
    for (k, stream) in streams.into_iter().enumerate() {
        let p = &reference.prompts[k % 3];
        let (tokens, text, finished) = collect(stream).await;
        assert_eq!(tokens, p.greedy, "request {k}");
        let expected = Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap().decode(&p.greedy, true).unwrap();
        assert_eq!(text, expected, "request {k}: streamed text");
        assert_eq!(reason(&finished), FinishReason::Length);
        assert_eq!((usage(&finished).prompt_tokens, usage(&finished).completion_tokens), (p.ids.len(), 20));
    }
    assert_eq!(wait_idle(&engine, IDLE).await.finished.length, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_submitted_while_others_decode_finishes_first() {
    let engine = mock_engine(None).await;
    let long: Vec<EventStream> = vec![
        engine.generate(request(vec![1, 2, 3], 150)).await.unwrap(),
        engine.generate(request(vec![4, 5], 150)).await.unwrap(),
    ];
    let mut long = long;
    for s in &mut long {
        assert!(matches!(s.next().await, Some(Event::Token { .. })), "the long requests are decoding");
    }
    let (tokens, _, finished) = collect(engine.generate(request(vec![7, 8, 9], 3)).await.unwrap()).await;
    assert_eq!((tokens.len(), reason(&finished)), (3, FinishReason::Length));
    assert!(engine.stats().await.unwrap().running >= 2, "the short request ended while the long ones still run");
    for s in long {
        assert_eq!(reason(&collect(s).await.2), FinishReason::Length);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_id_ends_with_abort_and_frees_the_cells() {
    let engine = mock_engine(None).await;
    let mut stream = engine.generate(request(vec![1, 2, 3], 10_000)).await.unwrap();
    assert!(matches!(stream.next().await, Some(Event::Token { .. })));
    assert!(engine.cancel(stream.id).await);
    let (_, _, finished) = collect(stream).await;
    assert_eq!(reason(&finished), FinishReason::Abort);
    assert_eq!(wait_idle(&engine, IDLE).await.finished.abort, 1);
    assert!(!engine.cancel(12345).await, "unknown ids are not cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_cancels_during_decode_and_during_prefill() {
    let engine = mock_engine(None).await;
    let mut stream = engine.generate(request(vec![1, 2, 3], 10_000)).await.unwrap();
    assert!(matches!(stream.next().await, Some(Event::Token { .. })));
    drop(stream);
    wait_idle(&engine, IDLE).await;
    // A 200-token prompt takes 25 steps of 8 tokens: dropped before its first token.
    let stream = engine.generate(request((0..200).map(|t| t % 200).collect(), 5)).await.unwrap();
    drop(stream);
    let stats = wait_idle(&engine, IDLE).await;
    assert_eq!((stats.finished.abort, stats.finished.total()), (2, 2), "both ended by cancellation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_batch_fails_only_its_requests() {
    let engine = mock_engine(Some(13)).await;
    let (_, _, bad) = collect(engine.generate(request(vec![1, 13, 2], 5)).await.unwrap()).await;
    assert_eq!(reason(&bad), FinishReason::Error);
    let (tokens, _, good) = collect(engine.generate(request(vec![1, 2, 3], 5)).await.unwrap()).await;
    assert_eq!((tokens.len(), reason(&good)), (5, FinishReason::Length), "the engine keeps serving");
    wait_idle(&engine, IDLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_worker_is_replaced_and_requests_outside_its_batch_complete() {
    // One sequence per step: the second request waits while the first one's batch fails.
    let engine = mock_engine_with(Some(13), EngineConfig { max_seqs_per_step: 1, ..mock_config() }).await;
    let bad = engine.generate(request(vec![1, 13, 2], 5)).await.unwrap();
    let waiting = engine.generate(request(vec![1, 2, 3], 5)).await.unwrap();
    assert_eq!(reason(&collect(bad).await.2), FinishReason::Error);
    let (tokens, _, finished) = collect(waiting).await;
    assert_eq!(reason(&finished), FinishReason::Length);
    // The same request on an engine that never failed gives the same tokens.
    let clean = mock_engine(None).await;
    assert_eq!(tokens, collect(clean.generate(request(vec![1, 2, 3], 5)).await.unwrap()).await.0);
    let stats = wait_idle(&engine, IDLE).await;
    assert_eq!((stats.worker_restarts, stats.finished.error, stats.finished.length), (1, 1, 1));
    let (tokens, _, _) = collect(engine.generate(request(vec![4, 5], 5)).await.unwrap()).await;
    assert_eq!(tokens.len(), 5, "the new worker keeps serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_loader_a_failed_worker_fails_everything_and_the_engine_refuses_requests() {
    let dir = tempfile_dir(Some(13));
    let model =
        load_model(None, Some(&ModelSource::Dir(dir.path().into())), &LoadOptions::default(), &Device::flex()).unwrap();
    let engine = Engine::start(model, None, mock_config()).await.unwrap();
    assert_eq!(reason(&collect(engine.generate(request(vec![13], 5)).await.unwrap()).await.2), FinishReason::Error);
    let err = engine.generate(request(vec![1], 5)).await.err().expect("refused");
    assert!(err.to_string().contains("cannot be loaded again"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_next_turn_computes_only_its_new_tokens() {
    let engine = mock_engine(None).await; // prefix caching is off: only the session keeps cells
    let first: Vec<u32> = (1..=10).collect();
    let (out1, _, fin1) = collect(engine.generate(in_session(first.clone(), 5, "chat-1")).await.unwrap()).await;
    assert_eq!(usage(&fin1).cached_tokens, 0);
    let second: Vec<u32> = first.iter().chain(&out1).copied().chain([50, 51]).collect();
    let (out2, _, fin2) = collect(engine.generate(in_session(second.clone(), 5, "chat-1")).await.unwrap()).await;
    // Everything but the last generated token (never put through the model) was cached.
    assert_eq!(usage(&fin2).cached_tokens, 10 + 5 - 1);
    let (fresh, _, _) = collect(engine.generate(request(second, 5)).await.unwrap()).await;
    assert_eq!(out2, fresh, "reusing the session's cells does not change the output");
    let stats = wait_idle(&engine, IDLE).await;
    assert_eq!((stats.sessions, stats.prefix_hits, stats.kv_cells_cached), (1, 14, 21));
    let sessions = engine.sessions().await.unwrap();
    assert_eq!(
        sessions.iter().map(|s| (s.id.as_str(), s.requests, s.active, s.cached_tokens)).collect::<Vec<_>>(),
        vec![("chat-1", 2, 0, 21)]
    );
    assert!(engine.delete_session("chat-1").await.unwrap());
    assert!(!engine.delete_session("chat-1").await.unwrap(), "already gone");
    // The freed cells are dropped by the next step.
    collect(engine.generate(request(vec![1], 1)).await.unwrap()).await;
    let stats = wait_idle(&engine, IDLE).await;
    assert_eq!((stats.sessions, stats.kv_cells_used), (0, 0));
    let err = engine.generate(in_session(vec![1], 1, "")).await.err().expect("refused");
    assert!(err.to_string().contains("session id"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_expires_and_frees_its_cells() {
    let config = EngineConfig { session_idle_timeout: Duration::from_millis(100), ..mock_config() };
    let engine = mock_engine_with(None, config).await;
    collect(engine.generate(in_session(vec![1, 2, 3], 3, "s")).await.unwrap()).await;
    assert_eq!(engine.sessions().await.unwrap().len(), 1);
    for _ in 0..300 {
        if engine.sessions().await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(engine.sessions().await.unwrap().is_empty(), "expired");
    collect(engine.generate(request(vec![1], 1)).await.unwrap()).await;
    assert_eq!(wait_idle(&engine, IDLE).await.kv_cells_used, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_picks_the_engine_by_model_name() {
    let mut router = Router::new();
    router.add("mock-a", mock_engine(None).await).unwrap();
    router.add("tiny", engine(EngineConfig::default()).await).unwrap();
    assert!(router.add("tiny", mock_engine(None).await).is_err(), "one engine per name");
    assert_eq!(router.models().collect::<Vec<_>>(), vec!["mock-a", "tiny"]);
    let p = &Reference::load(FIXTURE).prompts[0];
    let (tokens, _, _) = collect(router.generate("tiny", request(p.ids.clone(), 20)).await.unwrap()).await;
    assert_eq!(tokens, p.greedy);
    let err = router.generate("gpt-4", request(vec![1], 1)).await.err().expect("unknown model");
    assert_eq!(err.to_string(), "the model 'gpt-4' is not served; available: mock-a, tiny");
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_and_shutdown_drains() {
    let engine = mock_engine(None).await;
    let err = engine.generate(request(vec![1, 999], 5)).await.err().unwrap();
    assert!(err.to_string().contains("not below the vocabulary size 200"), "{err}");
    let err = engine.generate(request((0..300).map(|t| t % 200).collect(), 5)).await.err().unwrap();
    assert!(err.to_string().contains("the KV cache has 256"), "{err}");
    let running = engine.generate(request(vec![1, 2, 3], 40)).await.unwrap();
    let handle = engine.clone();
    let shutdown = tokio::spawn(async move { handle.shutdown().await });
    let (tokens, _, finished) = collect(running).await;
    assert_eq!((tokens.len(), reason(&finished)), (40, FinishReason::Length), "in-flight work drains");
    shutdown.await.unwrap();
    assert!(engine.generate(request(vec![1], 1)).await.is_err(), "no new work after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_live_in_one_process() {
    let (a, b) = (mock_engine(None).await, engine(EngineConfig::default()).await);
    let (ta, _, _) = collect(a.generate(request(vec![5, 6], 4)).await.unwrap()).await;
    let p = &Reference::load(FIXTURE).prompts[0];
    let (tb, _, _) = collect(b.generate(request(p.ids.clone(), 20)).await.unwrap()).await;
    assert_eq!((ta.len(), tb), (4, p.greedy.clone()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_stops_the_engine_and_ends_its_requests_with_abort() {
    let engine = mock_engine(None).await;
    let clone = engine.clone();
    let mut stream = engine.generate(request(vec![1, 2, 3], 10_000)).await.unwrap();
    assert!(matches!(stream.next().await, Some(Event::Token { .. })));
    drop(engine);
    assert!(clone.stats().await.is_ok(), "a clone keeps the engine");
    drop(clone);
    let (_, _, finished) = collect(stream).await;
    assert_eq!(reason(&finished), FinishReason::Abort);
}
