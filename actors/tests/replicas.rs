//! D2: several replicas of a model in one engine (here two on the CPU): outputs as from one,
//! requests of a session on one replica, a failing replica failing only its own requests.

use std::sync::Arc;
use std::time::Duration;

use llaisys_actors::placement::PlacementConfig;
use llaisys_actors::request::FinishReason;
use llaisys_actors::{
    DeviceSpec, Engine, EngineConfig, Event, EventStream, GenerateParams, GenerateRequest, ModelLoader, ReplicaSpec,
};
use llaisys_model::{Device, LoadOptions, ModelSource, load_model};
use llaisys_tests::fixture_dir;

mod common;
use common::wait_idle;

const FIXTURE: &str = "tiny-untied-f32";
const IDLE: Duration = Duration::from_secs(3);

fn config() -> EngineConfig {
    EngineConfig { kv_capacity: 512, max_seqs_per_step: 8, max_tokens_per_step: 64, ..EngineConfig::default() }
}

async fn fixture_engine(devices: &[DeviceSpec]) -> Engine {
    let builder = Engine::builder().model(fixture_dir(FIXTURE)).devices(devices.iter().copied()).config(config());
    builder.build().await.unwrap()
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest::new(prompt, GenerateParams { max_tokens, ignore_eos: true, ..GenerateParams::default() })
}

/// The tokens and the final event of a stream.
async fn collect(mut stream: EventStream) -> (Vec<u32>, Event) {
    let mut tokens = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await.expect("an event within 30 s") {
            Some(Event::Token { token, .. }) => tokens.push(token),
            Some(finished) => return (tokens, finished),
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

/// Distinct prompts (no shared prefix, so placement balances them).
fn prompts(n: u32) -> Vec<Vec<u32>> {
    (0..n).map(|i| (0..6).map(|k| (i * 17 + k * 5 + 3) % 90 + 1).collect()).collect()
}

/// Runs every prompt at once; returns each one's tokens and request id.
async fn run_all(engine: &Engine, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<(Vec<u32>, u64, FinishReason)> {
    let mut streams = Vec::new();
    for p in prompts {
        streams.push(engine.generate(request(p.clone(), max_tokens)).await.unwrap());
    }
    let mut out = Vec::new();
    for s in streams {
        let id = s.id;
        let (tokens, finished) = collect(s).await;
        out.push((tokens, id, reason(&finished)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_give_one_replicas_greedy_outputs_and_share_the_load() {
    let prompts = prompts(8);
    let one = fixture_engine(&[DeviceSpec::Cpu]).await;
    let expected = run_all(&one, &prompts, 12).await;
    let two = fixture_engine(&[DeviceSpec::Cpu, DeviceSpec::Cpu]).await;
    let got = run_all(&two, &prompts, 12).await;
    for (i, ((want, _, _), (have, _, why))) in expected.iter().zip(&got).enumerate() {
        assert_eq!((have, *why), (want, FinishReason::Length), "prompt {i}");
    }
    wait_idle(&two, IDLE).await;
    let replicas = two.replica_stats().await.unwrap();
    assert_eq!(replicas.len(), 2);
    for r in &replicas {
        assert_eq!(r.device, "cpu");
        assert!(r.stats.finished.length >= 2, "each replica served a share: {replicas:?}");
    }
    let total = two.stats().await.unwrap();
    assert_eq!(total.finished.length, 8);
    assert_eq!(total.kv_capacity, 2 * config().kv_capacity);
    // Ids are unique across replicas, and a cancel finds its replica.
    let mut ids: Vec<u64> = got.iter().map(|(_, id, _)| *id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8);
    let long = two.generate(request(vec![5, 6, 7], 200)).await.unwrap();
    let id = long.id;
    assert!(two.cancel(id).await);
    assert_eq!(reason(&collect(long).await.1), FinishReason::Abort);
    two.shutdown().await;
    one.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_turns_stay_on_its_replica_and_reuse_its_cache() {
    let engine = fixture_engine(&[DeviceSpec::Cpu, DeviceSpec::Cpu]).await;
    let mut history: Vec<Vec<u32>> = vec![vec![3, 4, 5, 6], vec![40, 41, 42, 43]];
    let mut replica_of = [None, None];
    for turn in 0..3 {
        for (s, h) in history.iter_mut().enumerate() {
            let req = GenerateRequest { session: Some(format!("s{s}")), ..request(h.clone(), 4) };
            let stream = engine.generate(req).await.unwrap();
            let replica = stream.id % 2;
            assert_eq!(*replica_of[s].get_or_insert(replica), replica, "session {s} turn {turn} moved");
            let (tokens, finished) = collect(stream).await;
            let Event::Finished { usage, .. } = finished else { unreachable!() };
            if turn > 0 {
                assert!(usage.cached_tokens + 3 >= h.len(), "turn {turn} of session {s} reused {usage:?}");
            }
            h.extend(tokens);
            h.push(7 + turn as u32);
        }
    }
    assert_ne!(replica_of[0], replica_of[1], "two new sessions on an idle engine spread");
    let sessions = engine.sessions().await.unwrap();
    assert_eq!(sessions.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["s0", "s1"]);
    assert!(engine.delete_session("s0").await.unwrap());
    assert!(!engine.delete_session("s0").await.unwrap());
    engine.shutdown().await;
}

/// A mock model directory whose worker fails on `fail_on_token`, stepping slowly enough that
/// requests overlap.
/// (Removed when dropped.)
fn mock_dir(fail_on_token: Option<u32>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fail = fail_on_token.map_or(String::new(), |t| format!(r#","fail_on_token":{t}"#));
    let config = format!(r#"{{"model_type":"mock","vocab_size":200,"step_delay_ms":5{fail}}}"#);
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    dir
}

/// The replicas' loader holds `dir`: it goes with the engine.
async fn mock_replicas(dir: tempfile::TempDir, n: usize) -> Engine {
    let dir = Arc::new(dir);
    let loader: ModelLoader = Arc::new(move || {
        load_model(None, Some(&ModelSource::Dir(dir.path().into())), &LoadOptions::default(), &Device::flex())
    });
    let spec = ReplicaSpec { device: "cpu".into(), loader, draft: None };
    let config = EngineConfig { kv_capacity: 512, prefix_caching: false, ..EngineConfig::default() };
    Engine::start_replicas(vec![spec; n], None, config, PlacementConfig::default()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_replica_fails_only_its_own_requests() {
    let prompts = prompts(6);
    // A fault token no good request meets: the mock is deterministic, so one clean run shows
    // every token the good requests see.
    let clean = mock_replicas(mock_dir(None), 1).await;
    let seen: Vec<u32> =
        run_all(&clean, &prompts, 30).await.into_iter().flat_map(|(t, _, _)| t).chain(prompts.concat()).collect();
    clean.shutdown().await;
    let fault = (100..199).find(|t| !seen.contains(t)).expect("a token the good requests never meet");
    let engine = mock_replicas(mock_dir(Some(fault)), 2).await;
    let mut good = Vec::new();
    for p in &prompts {
        good.push(engine.generate(request(p.clone(), 30)).await.unwrap());
    }
    let bad = engine.generate(request(vec![1, fault, 2], 30)).await.unwrap();
    let failed_replica = bad.id % 2;
    assert_eq!(reason(&collect(bad).await.1), FinishReason::Error);
    for stream in good {
        let replica = stream.id % 2;
        let (tokens, finished) = collect(stream).await;
        if replica != failed_replica {
            assert_eq!((tokens.len(), reason(&finished)), (30, FinishReason::Length), "the other replica's request");
        }
    }
    wait_idle(&engine, IDLE).await;
    let replicas = engine.replica_stats().await.unwrap();
    let other = &replicas[1 - failed_replica as usize].stats;
    assert_eq!((other.worker_restarts, other.finished.error), (0, 0), "{replicas:?}");
    assert_eq!(replicas[failed_replica as usize].stats.worker_restarts, 1);
    // Both keep serving.
    for (tokens, _, why) in run_all(&engine, &prompts[..4], 5).await {
        assert_eq!((tokens.len(), why), (5, FinishReason::Length));
    }
    engine.shutdown().await;
}
