//! N1–N5 with real processes on loopback: a front (`llaisys serve --cluster-listen`) and worker
//! nodes (`llaisys worker --join`). Every process is killed when its test ends; every wait is
//! bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use llaisys_actors::cluster::{FRONT_GROUP, SCOPE, transport};
use llaisys_tests::{Reference, fixture_dir};
use ractor::ActorRef;
use ractor::message::{BoxedDowncastErr, SerializedMessage};

const COOKIE: &str = "test-cookie";

/// A child process, killed when dropped; its stderr lines go to a channel and are kept.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn start(args: &[&str], cookie: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_llaisys"))
            .args(args)
            .env("LLAISYS_CLUSTER_COOKIE", cookie)
            .env("LLAISYS_LOG", "info,llaisys_actors::cluster::front=debug")
            .stderr(Stdio::piped())
            .spawn()
            .expect("run llaisys");
        let (tx, lines) = mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        Self { child, lines, log }
    }

    /// Whether a line logged so far contains `text`.
    fn logged(&self, text: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(text))
    }

    /// Waits (at most `within`) for a line containing `text`; returns it.
    fn wait_for(&self, text: &str, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status().expect("kill");
        assert!(status.success());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A front (router only unless `serve_local`), its address and its cluster port, started on
/// `model`. The port is one the system had free a moment before; another process may take it
/// meanwhile (a worker's outgoing connection gets its port from the same range), so a front that
/// exits before it serves is started again on another.
fn front(model: &Path, extra: &[&str]) -> (Proc, String, u16) {
    let dir = model.to_str().unwrap();
    for _ in 0..5 {
        let cluster = free_port();
        let listen = format!("127.0.0.1:{cluster}");
        let mut args = vec!["serve", "--model", dir, "--port", "0", "--cluster-listen", &listen, "--name", "front"];
        args.extend(extra);
        let p = Proc::start(&args, COOKIE);
        if let Some(line) = p.wait_for("on http://", Duration::from_secs(120)) {
            let addr = line.split("on http://").nth(1).unwrap().trim().to_string();
            return (p, addr, cluster);
        }
        eprintln!("the front exited before serving, started again: {:?}", p.log.lock().unwrap());
    }
    panic!("the front never started");
}

fn worker(model: &Path, cluster: u16, name: &str, cookie: &str, extra: &[&str]) -> Proc {
    let join = format!("127.0.0.1:{cluster}");
    let mut args = vec!["worker", "--model", model.to_str().unwrap(), "--join", &join, "--name", name];
    args.extend(extra);
    Proc::start(&args, cookie)
}

/// Sends one HTTP/1.1 request (the server closes the connection after answering).
fn send(addr: &str, method: &str, path: &str, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    stream
}

/// One HTTP/1.1 exchange; the body of the answer.
fn http(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut stream = send(addr, method, path, body);
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

fn post(addr: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
    let text = http(addr, "POST", path, &body.to_string());
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The value of metric `name` for node `node` (summed over its replicas), if it has one.
fn metric(metrics: &str, name: &str, node: &str) -> Option<f64> {
    let label = format!("node=\"{node}\"");
    let values: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Polls `/metrics` until `done` holds (at most `within`); the last scrape.
fn metrics_until(addr: &str, within: Duration, done: impl Fn(&str) -> bool) -> (bool, String) {
    let deadline = Instant::now() + within;
    loop {
        let m = http(addr, "GET", "/metrics", "");
        if done(&m) || Instant::now() > deadline {
            return (done(&m), m);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn joined(m: &str, nodes: &[&str]) -> bool {
    nodes.iter().all(|n| metric(m, "llaisys_num_requests_running", n).is_some())
}

/// A copy of the tiny fixture run by the `mock` model with a fixed step time (a slow device).
struct SlowModel(PathBuf);

impl SlowModel {
    fn new(step_ms: u64) -> Self {
        let dir = std::env::temp_dir().join(format!("llaisys-cluster-slow-{}-{step_ms}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(fixture_dir("tiny-tied-f32")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
        let path = dir.join("config.json");
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        config["step_delay_ms"] = step_ms.into();
        config["max_position_embeddings"] = 4096.into();
        std::fs::write(&path, config.to_string()).unwrap();
        Self(dir)
    }
}

impl Drop for SlowModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Greedy answers through the cluster equal the transformers reference (what one server
/// gives); a session's turns stay on one node; a node with the wrong cookie is refused.
#[test]
fn a_front_and_two_workers_answer_like_one_server() {
    let name = "tiny-tied-f32";
    let model = fixture_dir(name);
    let (front, addr, cluster) = front(&model, &["--set", "cluster.serve_local=false"]);
    assert!(!front.logged("weights loaded"), "a router-only front loaded the weights");
    let health = http(&addr, "GET", "/health", "");
    assert!(health.contains("no node of the cluster serves"), "a front without nodes is healthy: {health}");
    let w1 = worker(&model, cluster, "w1", COOKIE, &[]);
    let _w2 = worker(&model, cluster, "w2", COOKIE, &[]);
    let (ok, m) = metrics_until(&addr, Duration::from_secs(60), |m| joined(m, &["w1", "w2"]));
    assert!(ok, "the workers did not join: {m}");
    assert!(w1.logged("weights loaded"), "a worker's log does not say it loaded its weights");
    let health: serde_json::Value = serde_json::from_str(&http(&addr, "GET", "/health", "")).unwrap();
    assert_eq!(health["nodes"], serde_json::json!(["w1", "w2"]), "{health}");
    assert!(metric(&m, "llaisys_num_requests_running", "front").is_none(), "a router-only front runs nothing");

    for p in &Reference::load(name).prompts {
        let body = serde_json::json!({
            "model": name, "prompt": p.ids, "max_tokens": p.greedy.len(), "temperature": 0, "ignore_eos": true
        });
        let answer = post(&addr, "/v1/completions", body);
        let tokenizer = llaisys_model::tokenizer::Tokenizer::from_dir(&model).unwrap();
        assert_eq!(answer["choices"][0]["text"], tokenizer.decode(&p.greedy, true).unwrap(), "{answer}");
    }

    let mut history = vec![serde_json::json!({"role": "user", "content": "hello there"})];
    for turn in 0..3 {
        let body = serde_json::json!({
            "model": name, "messages": history, "max_tokens": 4, "temperature": 0, "session_id": "conversation"
        });
        let answer = post(&addr, "/v1/chat/completions", body);
        let text = answer["choices"][0]["message"]["content"].clone();
        history.push(serde_json::json!({"role": "assistant", "content": text}));
        history.push(serde_json::json!({"role": "user", "content": format!("turn {turn}")}));
    }
    let (ok, m) = metrics_until(&addr, Duration::from_secs(10), |m| {
        let sessions = |n| metric(m, "llaisys_num_sessions", n).unwrap_or(0.0);
        sessions("w1") + sessions("w2") == 1.0
    });
    assert!(ok, "the session is not on exactly one node: {m}");

    let intruder = worker(&model, cluster, "w3", "not-the-cookie", &[]);
    let refused = intruder.wait_for("did not admit", Duration::from_secs(30));
    assert!(refused.is_some(), "a worker with the wrong cookie was not told it was refused");
    let m = http(&addr, "GET", "/metrics", "");
    assert!(metric(&m, "llaisys_num_requests_running", "w3").is_none(), "{m}");
}

/// The embeddings fixture's reference: its inputs (text and transformers' float64 vectors per
/// pooling) and their texts.
fn embedding_reference(model: &Path) -> (Vec<serde_json::Value>, Vec<String>) {
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("embeddings.json")).unwrap()).unwrap();
    let inputs = reference["inputs"].as_array().unwrap().clone();
    let texts = inputs.iter().map(|i| i["text"].as_str().unwrap().to_string()).collect();
    (inputs, texts)
}

fn vector(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// An embeddings answer `r` holds the reference's `pooling` vectors of every input, within 1e-4.
fn assert_embeddings(r: &serde_json::Value, inputs: &[serde_json::Value], pooling: &str) {
    let data = r["data"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(data.len(), inputs.len(), "{r}");
    for (i, (got, want)) in data.iter().zip(inputs).enumerate() {
        let (got, want) = (vector(&got["embedding"]), vector(&want[pooling]));
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(got.len() == want.len() && err < 1e-4, "{pooling} input {i}: {err}");
    }
}

/// Embeddings and rerank through a router-only front run on a node: the vectors equal
/// transformers' float64 reference (as on one server), the ranking the reference's, and a
/// request sent while no node serves waits for one to join.
#[test]
fn embeddings_and_rerank_run_on_the_nodes() {
    let name = "tiny-untied-f32";
    let model = fixture_dir(name);
    let (inputs, texts) = embedding_reference(&model);
    let (_front, addr, cluster) = front(&model, &["--set", "cluster.serve_local=false"]);
    // Asked before any node joined, the front holds the work until one can run it.
    let early = {
        let (addr, texts) = (addr.clone(), texts.clone());
        std::thread::spawn(move || post(&addr, "/v1/embeddings", serde_json::json!({"model": name, "input": texts})))
    };
    std::thread::sleep(Duration::from_millis(500));
    let _w1 = worker(&model, cluster, "w1", COOKIE, &[]);
    let early = early.join().unwrap();
    for pooling in ["last", "mean"] {
        let r = if pooling == "last" {
            early.clone()
        } else {
            post(&addr, "/v1/embeddings", serde_json::json!({"model": name, "input": texts, "pooling": pooling}))
        };
        assert_embeddings(&r, &inputs, pooling);
    }
    // A model without a reranker head ranks by the cosine of the embeddings.
    let q = vector(&inputs[0]["last"]);
    let mut expected: Vec<usize> = (0..inputs.len() - 1).collect();
    let score = |i: usize| -> f64 { vector(&inputs[i + 1]["last"]).iter().zip(&q).map(|(a, b)| a * b).sum() };
    expected.sort_by(|a, b| score(*b).total_cmp(&score(*a)));
    let body = serde_json::json!({"model": name, "query": texts[0], "documents": texts[1..]});
    let r = post(&addr, "/v1/rerank", body);
    let order: Vec<usize> = r["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|x| x["index"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(order, expected, "{r}");
}

/// A read-out whose node stops answering runs again on another: nothing of it was streamed, so
/// the caller gets the whole answer, as one node would give it, once the heartbeat has removed
/// the stalled node.
#[test]
fn a_read_out_on_a_node_that_stalls_runs_again_on_another() {
    let name = "tiny-untied-f32";
    let model = fixture_dir(name);
    let (inputs, texts) = embedding_reference(&model);
    let timeouts = ["--set", "cluster.heartbeat_interval_ms=200", "--set", "cluster.heartbeat_timeout_ms=1500"];
    let mut front_args = timeouts.to_vec();
    front_args.extend(["--set", "cluster.serve_local=false"]);
    let (_front, addr, cluster) = front(&model, &front_args);
    let w1 = worker(&model, cluster, "w1", COOKIE, &timeouts);
    let (ok, m) = metrics_until(&addr, Duration::from_secs(60), |m| joined(m, &["w1"]));
    assert!(ok, "the worker did not join: {m}");
    // The only node stalls; the read-out goes to it, then to the node that joins after.
    w1.signal("-STOP");
    let pending = {
        let (addr, texts) = (addr.clone(), texts.clone());
        std::thread::spawn(move || post(&addr, "/v1/embeddings", serde_json::json!({"model": name, "input": texts})))
    };
    std::thread::sleep(Duration::from_millis(300));
    let _w2 = worker(&model, cluster, "w2", COOKIE, &timeouts);
    assert_embeddings(&pending.join().unwrap(), &inputs, "last");
    let (ok, m) = metrics_until(&addr, Duration::from_secs(10), |m| !joined(m, &["w1"]) && joined(m, &["w2"]));
    assert!(ok, "the stalled node was not removed: {m}");
}

/// Streams a completion and returns (whether it ended with [DONE], its finish reasons, and
/// whether an error came).
fn stream(addr: &str, body: serde_json::Value) -> (bool, Vec<String>, bool) {
    let mut s = send(addr, "POST", "/v1/completions", &body.to_string());
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let done = text.contains("data: [DONE]");
    let reasons = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| v["choices"][0]["finish_reason"].as_str().map(String::from))
        .collect();
    (done, reasons, text.contains("\"error\""))
}

/// SIGKILL of a worker under load loses no request; SIGSTOP is noticed by the heartbeat; a
/// restarted worker rejoins and gets work; a dropped stream frees its cells on the remote node.
#[test]
fn nodes_that_die_or_stall_lose_no_request() {
    let slow = SlowModel::new(20);
    let mock = ["--set", "model.model_type=\"mock\"", "--set", "engine.prefix_caching=false"];
    let timeouts = ["--set", "cluster.heartbeat_interval_ms=200", "--set", "cluster.heartbeat_timeout_ms=1500"];
    let extra: Vec<&str> = mock.iter().chain(&timeouts).copied().collect();
    let mut front_args = extra.clone();
    front_args.extend(["--set", "cluster.serve_local=false", "--model-name", "any"]);
    let (_front, addr, cluster) = front(&slow.0, &front_args);
    // Each node takes two requests at once: of eight, four wait in the front's queue.
    let mut worker_args = extra.clone();
    worker_args.extend(["--set", "cluster.capacity=2"]);
    let w1 = worker(&slow.0, cluster, "w1", COOKIE, &worker_args);
    let w2 = worker(&slow.0, cluster, "w2", COOKIE, &worker_args);
    let (ok, m) = metrics_until(&addr, Duration::from_secs(60), |m| joined(m, &["w1", "w2"]));
    assert!(ok, "the workers did not join: {m}");

    // Eight streams of 1 s each; w1 is killed while its two stream and four are queued.
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let body = serde_json::json!({
                    "model": "any", "prompt": format!("request {i}"), "max_tokens": 50, "ignore_eos": true,
                    "stream": true
                });
                stream(&addr, body)
            })
        })
        .collect();
    let (ok, m) = metrics_until(&addr, Duration::from_secs(10), |m| {
        ["w1", "w2"].iter().all(|n| metric(m, "llaisys_num_requests_running", n) == Some(2.0))
    });
    assert!(ok, "the nodes never ran two requests each: {m}");
    w1.signal("-KILL");
    let mut completed = 0;
    for client in clients {
        let (done, reasons, error) = client.join().unwrap();
        assert!(done, "a stream did not end with [DONE]");
        assert!(reasons == ["length"] || error, "neither finished nor failed: {reasons:?}");
        completed += usize::from(reasons == ["length"]);
    }
    // w2's two and the four queued (which moved to w2) complete; w1's two had streamed.
    assert!(completed >= 6, "only {completed} of 8 completed");
    let (ok, m) = metrics_until(&addr, Duration::from_secs(10), |m| !joined(m, &["w1"]));
    assert!(ok, "the killed node is still in /metrics: {m}");
    drop(w1);

    // Restarted, it rejoins; with w2 stopped, the heartbeat removes w2 and w1 gets the work.
    let _w1 = worker(&slow.0, cluster, "w1", COOKIE, &extra);
    let (ok, m) = metrics_until(&addr, Duration::from_secs(60), |m| joined(m, &["w1"]));
    assert!(ok, "the restarted node did not rejoin: {m}");
    w2.signal("-STOP");
    let stopped = Instant::now();
    let (ok, m) = metrics_until(&addr, Duration::from_secs(10), |m| !joined(m, &["w2"]));
    assert!(ok, "the stopped node was not removed: {m}");
    assert!(stopped.elapsed() < Duration::from_secs(5), "removed after {:?}", stopped.elapsed());
    let body = serde_json::json!({"model": "any", "prompt": "after", "max_tokens": 3, "ignore_eos": true});
    let answer = post(&addr, "/v1/completions", body);
    assert_eq!(answer["choices"][0]["finish_reason"], "length", "{answer}");

    // With w2 stopped, everything runs on w1. A stream dropped after its first token is
    // cancelled there, and so is one cancelled through the endpoint: no cells stay used.
    let idle = |m: &str| {
        metric(m, "llaisys_kv_cache_cells_used", "w1") == Some(0.0)
            && metric(m, "llaisys_num_requests_running", "w1") == Some(0.0)
    };
    let body = serde_json::json!({"model": "any", "prompt": "drop me", "max_tokens": 500, "ignore_eos": true,
        "stream": true});
    let s = send(&addr, "POST", "/v1/completions", &body.to_string());
    let (reader, first) = first_chunk(s);
    assert!(first["id"].is_string(), "{first}");
    let (ok, m) = metrics_until(&addr, Duration::from_secs(10), |m| {
        metric(m, "llaisys_kv_cache_cells_used", "w1").is_some_and(|v| v > 0.0)
    });
    assert!(ok, "the request never ran: {m}");
    drop(reader);
    let (ok, m) = metrics_until(&addr, Duration::from_secs(10), idle);
    assert!(ok, "the dropped stream's cells were not freed on its node: {m}");

    let s = send(&addr, "POST", "/v1/completions", &body.to_string());
    let (mut rest, first) = first_chunk(s);
    let id = first["id"].as_str().expect("a chunk id").to_string();
    let answer = post(&addr, &format!("/v1/requests/{id}/cancel"), serde_json::json!({}));
    assert_eq!(answer["cancelled"], true, "{answer}");
    let mut tail = String::new();
    let _ = rest.read_to_string(&mut tail);
    assert!(tail.contains("\"finish_reason\":\"abort\"") && tail.contains("data: [DONE]"), "{tail}");
    let (ok, m) = metrics_until(&addr, Duration::from_secs(10), idle);
    assert!(ok, "the cancelled request's cells were not freed on its node: {m}");

    // Resumed, w2 reports again over its open connection and is routable again.
    w2.signal("-CONT");
    let (ok, m) = metrics_until(&addr, Duration::from_secs(10), |m| joined(m, &["w2"]));
    assert!(ok, "the resumed node did not come back: {m}");
}

/// Reads a stream up to its first data chunk; the rest of the stream and that chunk.
fn first_chunk(stream: TcpStream) -> (BufReader<TcpStream>, serde_json::Value) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended before its first chunk");
        if let Some(data) = line.trim().strip_prefix("data: ") {
            return (reader, serde_json::from_str(data).unwrap());
        }
    }
}

/// With every node at its capacity and the front's queue full, a request is refused with 429
/// and Retry-After; the admitted ones complete.
#[test]
fn a_full_cluster_refuses_with_429_and_retry_after() {
    let slow = SlowModel::new(20);
    let mock = ["--set", "model.model_type=\"mock\""];
    let mut front_args = mock.to_vec();
    front_args.extend(["--set", "cluster.serve_local=false", "--set", "limits.max_queue=1", "--model-name", "any"]);
    let (front, addr, cluster) = front(&slow.0, &front_args);
    let mut worker_args = mock.to_vec();
    worker_args.extend(["--set", "cluster.capacity=1"]);
    let _w1 = worker(&slow.0, cluster, "w1", COOKIE, &worker_args);
    let (ok, m) = metrics_until(&addr, Duration::from_secs(60), |m| joined(m, &["w1"]));
    assert!(ok, "the worker did not join: {m}");

    let body = serde_json::json!({"model": "any", "prompt": "long", "max_tokens": 50, "ignore_eos": true});
    let admit = || {
        let (addr, body) = (addr.clone(), body.clone());
        std::thread::spawn(move || post(&addr, "/v1/completions", body))
    };
    // In order: one runs on the node, one waits in the front's queue.
    let running = admit();
    let placed = front.wait_for("request placed", Duration::from_secs(30));
    assert!(placed.is_some(), "the first request was not placed");
    let waiting = admit();
    let queued = front.wait_for("request queued", Duration::from_secs(30));
    assert!(queued.is_some(), "the second request did not wait in the queue");
    let admitted = [running, waiting];
    let mut refused = send(&addr, "POST", "/v1/completions", &body.to_string());
    let mut response = String::new();
    let _ = refused.read_to_string(&mut response);
    let head = response.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 429"), "{response}");
    assert!(head.contains("retry-after: "), "{response}");
    for client in admitted {
        let answer = client.join().unwrap();
        assert_eq!(answer["choices"][0]["finish_reason"], "length", "{answer}");
    }
}

/// The prefix-cache hit rate of `routing` on conversations that share long system prompts.
fn hit_rate(routing: &str) -> f64 {
    let model = fixture_dir("tiny-tied-f32");
    let setting = format!("cluster.routing=\"{routing}\"");
    let extra = ["--set", "cluster.serve_local=false", "--set", &setting, "--model-name", "any"];
    let (_front, addr, cluster) = front(&model, &extra);
    let _w1 = worker(&model, cluster, "w1", COOKIE, &[]);
    let _w2 = worker(&model, cluster, "w2", COOKIE, &[]);
    let (ok, m) = metrics_until(&addr, Duration::from_secs(60), |m| joined(m, &["w1", "w2"]));
    assert!(ok, "the workers did not join: {m}");
    // Three prompts over two nodes: round robin sends each prompt to both in turn.
    let systems: Vec<Vec<u32>> = (0..3u32).map(|s| (0..120).map(|i| 10 + (s * 37 + i * 7) % 200).collect()).collect();
    for round in 0..6u32 {
        for system in &systems {
            let mut prompt = system.clone();
            prompt.extend([3 + round, 5 + round]);
            let body = serde_json::json!({"model": "any", "prompt": prompt, "max_tokens": 1, "ignore_eos": true});
            let answer = post(&addr, "/v1/completions", body);
            assert_eq!(answer["choices"][0]["finish_reason"], "length", "{answer}");
        }
    }
    // Every prompt token is looked up once; the nodes' reports of them come with their heartbeats.
    let looked_up = (systems.len() * 6 * (systems[0].len() + 2)) as f64;
    let sum = |m: &str, name| metric(m, name, "w1").unwrap_or(0.0) + metric(m, name, "w2").unwrap_or(0.0);
    let (ok, m) =
        metrics_until(&addr, Duration::from_secs(10), |m| sum(m, "llaisys_prefix_cache_queries_total") == looked_up);
    assert!(ok, "the nodes did not report {looked_up} prompt tokens looked up: {m}");
    sum(&m, "llaisys_prefix_cache_hits_total") / looked_up
}

#[test]
fn cache_aware_routing_hits_the_prefix_cache_more_than_round_robin() {
    let (aware, round_robin) = (hit_rate("cache_aware"), hit_rate("round_robin"));
    eprintln!("prefix-cache hit rate: cache_aware {aware:.3}, round_robin {round_robin:.3}");
    assert!(aware > round_robin, "cache_aware {aware} vs round_robin {round_robin}");
}

/// The front's certificate (for `localhost` and 127.0.0.1), its key and the authority that
/// signed it: test-only files, valid until 2126.
fn tls_file(name: &str) -> String {
    fixture_dir("tls").join(name).to_str().unwrap().to_string()
}

/// With TLS on the front, a worker that trusts its authority joins and serves; one without TLS
/// is not admitted.
#[test]
fn a_worker_joins_a_front_over_tls() {
    let name = "tiny-tied-f32";
    let model = fixture_dir(name);
    let (cert, key) = (
        format!("cluster.tls_cert=\"{}\"", tls_file("front.pem")),
        format!("cluster.tls_key=\"{}\"", tls_file("front.key")),
    );
    let (_front, addr, cluster) = front(&model, &["--set", "cluster.serve_local=false", "--set", &cert, "--set", &key]);
    let ca = format!("cluster.tls_ca=\"{}\"", tls_file("ca.pem"));
    let _w1 = worker(&model, cluster, "w1", COOKIE, &["--set", &ca, "--set", "cluster.tls_server_name=\"localhost\""]);
    let (ok, m) = metrics_until(&addr, Duration::from_secs(60), |m| joined(m, &["w1"]));
    assert!(ok, "the TLS worker did not join: {m}");
    let p = &Reference::load(name).prompts[0];
    let body = serde_json::json!({
        "model": name, "prompt": p.ids, "max_tokens": p.greedy.len(), "temperature": 0, "ignore_eos": true
    });
    let answer = post(&addr, "/v1/completions", body);
    let tokenizer = llaisys_model::tokenizer::Tokenizer::from_dir(&model).unwrap();
    assert_eq!(answer["choices"][0]["text"], tokenizer.decode(&p.greedy, true).unwrap(), "{answer}");

    let plain = worker(&model, cluster, "w2", COOKIE, &[]);
    assert!(plain.wait_for("did not admit", Duration::from_secs(30)).is_some(), "a raw worker was admitted");
    let m = http(&addr, "GET", "/metrics", "");
    assert!(metric(&m, "llaisys_num_requests_running", "w2").is_none(), "{m}");
}

/// A frame as a node of protocol version 0 would send it.
struct OldFrame;

impl ractor::Message for OldFrame {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        let args = br#"{"v":0,"from":"old","msg":{"Hello":{"load":1}}}"#.to_vec();
        Ok(SerializedMessage::Cast { variant: "llaisys".into(), args, metadata: None })
    }

    fn deserialize(_: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        Err(BoxedDowncastErr)
    }
}

/// This test process joins the front as node "old" and speaks another protocol version: the
/// front refuses it with a log naming both versions, and keeps serving.
#[test]
fn a_node_of_another_protocol_version_is_refused() {
    let model = fixture_dir("tiny-tied-f32");
    let (front, addr, cluster) = front(&model, &["--model-name", "any"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let any_port = "127.0.0.1:0".parse().unwrap();
        let server = transport::listen("old", COOKIE.into(), any_port, None).await.unwrap();
        tokio::spawn(transport::stay_joined(server, format!("127.0.0.1:{cluster}"), None));
        let deadline = Instant::now() + Duration::from_secs(30);
        let router = loop {
            if let Some(cell) = ractor::pg::get_scoped_members(&SCOPE.into(), &FRONT_GROUP.into()).pop() {
                break cell;
            }
            assert!(Instant::now() < deadline, "the front's router never appeared");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        ActorRef::<OldFrame>::from(router).cast(OldFrame).unwrap();
    });
    let refusal = front.wait_for("refused node 'old'", Duration::from_secs(30));
    let refusal = refusal.expect("the front did not log the refusal");
    let ours = format!("this front v{}", llaisys_actors::cluster::wire::PROTOCOL_VERSION);
    assert!(refusal.contains("protocol v0") && refusal.contains(&ours), "{refusal}");
    let m = http(&addr, "GET", "/metrics", "");
    assert!(metric(&m, "llaisys_num_requests_running", "old").is_none(), "{m}");
    let body = serde_json::json!({"model": "any", "prompt": "still serving", "max_tokens": 2, "ignore_eos": true});
    assert_eq!(post(&addr, "/v1/completions", body)["choices"][0]["finish_reason"], "length");
}
