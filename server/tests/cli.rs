//! The `llaisys` binary end to end: `generate` on the fixtures prints transformers' greedy output;
//! `run-batch` answers a file of requests.

use std::process::{Command, Output};

use llaisys_model::Tokenizer;
use llaisys_tests::{FIXTURES, Reference, fixture_dir};

fn llaisys(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llaisys")).args(args).output().expect("run llaisys")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "llaisys failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn generate_prints_the_reference_greedy_ids() {
    for name in FIXTURES {
        let p = &Reference::load(name).prompts[0];
        let dir = fixture_dir(name);
        let ids = p.ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let n = p.greedy.len().to_string();
        let out =
            llaisys(&["generate", "--model", dir.to_str().unwrap(), "--prompt-ids", &ids, "--max-tokens", &n, "--ids"]);
        let expected = p.greedy.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        assert_eq!(stdout(&out).trim_end(), expected, "{name}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("finish length"));
    }
}

#[test]
fn generate_from_text_prints_the_reference_text_and_stops_at_eos() {
    let p = &Reference::load("tiny-untied-f32").prompts[1];
    let dir = fixture_dir("tiny-untied-f32");
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let (dir, n) = (dir.to_str().unwrap(), p.greedy.len().to_string());
    // Text leaves out special tokens, as OpenAI-compatible servers do.
    let full = llaisys(&["generate", "--model", dir, "--prompt", &p.text, "--max-tokens", &n, "--ignore-eos"]);
    assert_eq!(stdout(&full), format!("{}\n", tokenizer.decode(&p.greedy, true).unwrap()));
    // This continuation contains the fixture's eos, <|im_end|>: generation stops there.
    let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
    let at = p.greedy.iter().position(|t| *t == eos).expect("reference contains eos");
    let stopped = llaisys(&["generate", "--model", dir, "--prompt", &p.text, "--max-tokens", &n]);
    assert_eq!(stdout(&stopped), format!("{}\n", tokenizer.decode(&p.greedy[..at], true).unwrap()));
    assert!(String::from_utf8_lossy(&stopped.stderr).contains("finish stop"));
}

#[test]
fn sampling_flags_reach_the_engine() {
    let p = &Reference::load("tiny-tied-f32").prompts[0];
    let dir = fixture_dir("tiny-tied-f32");
    let dir = dir.to_str().unwrap();
    let ids = p.ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let run = |seed: &str| {
        stdout(&llaisys(&[
            "generate",
            "--model",
            dir,
            "--prompt-ids",
            &ids,
            "--max-tokens",
            "12",
            "--ids",
            "--ignore-eos",
            "--temperature",
            "1.5",
            "--top-p",
            "0.95",
            "--seed",
            seed,
        ]))
    };
    assert_eq!(run("5"), run("5"), "a seed reproduces");
    let greedy = p.greedy[..12].iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    assert!(run("5").trim_end() != greedy || run("6").trim_end() != greedy, "temperature 1.5 samples");
}

#[test]
fn chat_renders_the_model_template_around_the_prompt() {
    let dir = fixture_dir("tiny-tied-f32");
    let dir = dir.to_str().unwrap();
    let chat = llaisys(&["generate", "--model", dir, "--chat", "--prompt", "Hi", "--max-tokens", "5", "--ids"]);
    // The same prompt written out by hand (Qwen2's format) must give the same tokens.
    let text = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    let raw = llaisys(&["generate", "--model", dir, "--prompt", text, "--max-tokens", "5", "--ids"]);
    assert_eq!(stdout(&chat), stdout(&raw));
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let dir = fixture_dir("tiny-tied-f32");
    let dir = dir.to_str().unwrap();
    for (args, expected) in [
        (
            vec!["generate", "--model", dir, "--prompt-ids", "1,5000", "--ids"],
            "token id 5000 is not below the vocabulary size 1024",
        ),
        (vec!["generate", "--model", "/nonexistent", "--prompt-ids", "1"], "cannot read /nonexistent"),
        (vec!["generate", "--model", dir, "--prompt", "hi", "--dtype", "int3"], "unknown weight dtype `int3`"),
    ] {
        let out = llaisys(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// `--lora` merges an adapter as it loads: transformers + PEFT's greedy tokens, from the PEFT
/// directory on the checkpoint and from llama.cpp's GGUF adapter on the GGUF file, the latter as
/// two halves through `--lora-scaled`; a bad scale or adapter is a clear error.
#[test]
fn generate_with_a_lora_adapter_prints_the_adapted_models_tokens() {
    let p = &Reference::load("lora/tiny-llama-lora").prompts[0];
    let ids = p.ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let n = p.greedy.len().to_string();
    let expected = p.greedy.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let (dir, gguf) = (fixture_dir("tiny-llama-f32"), llaisys_tests::gguf_fixture("tiny-llama-f32"));
    let (peft, gguf_adapter) = (fixture_dir("lora/tiny-llama-lora"), fixture_dir("lora/tiny-llama-lora-f32.gguf"));
    let [dir, gguf, peft, gguf_adapter] = [&dir, &gguf, &peft, &gguf_adapter].map(|p| p.to_str().unwrap());
    let generate = |extra: &[&str]| {
        let mut args = vec!["generate", "--prompt-ids", &ids, "--max-tokens", &n, "--ids"];
        args.extend_from_slice(extra);
        llaisys(&args)
    };
    let adapted = generate(&["--model", dir, "--lora", peft]);
    assert_eq!(stdout(&adapted).trim_end(), expected);
    let halves =
        generate(&["--model", gguf, "--lora-scaled", gguf_adapter, "0.5", "--lora-scaled", gguf_adapter, "0.5"]);
    assert_eq!(stdout(&halves).trim_end(), expected);
    for (extra, says) in [
        (vec!["--model", dir, "--lora-scaled", peft, "half"], "--lora-scaled"),
        (vec!["--model", dir, "--lora", gguf_adapter], "a GGUF adapter applies to a GGUF model"),
        (vec!["--model", dir, "--lora", "/nonexistent"], "no adapter_config.json"),
    ] {
        let out = generate(&extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says) && !stderr.contains("panicked"), "{extra:?}: {stderr}");
    }
}

/// `llaisys bench` on a fixture: every measurement asked for lands in its JSON line with the
/// counts it was given (and each run's figure), and an unknown measurement is a usage error.
#[test]
fn bench_reports_every_measurement_it_is_asked_for() {
    let dir = fixture_dir("tiny-untied-f32");
    let dir = dir.to_str().unwrap();
    #[rustfmt::skip]
    let out = llaisys(&[
        "bench", "--model", dir, "--runs", "2", "--prefill", "8", "--decode-prompt", "4", "--decode-tokens", "4",
        "--concurrency", "1,3", "--prompt-tokens", "4", "--new-tokens", "3", "--soak-requests", "7",
        "--only", "prefill,decode,throughput,soak",
    ]);
    let text = stdout(&out);
    let json: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let positive = |v: &serde_json::Value| v.as_f64().is_some_and(|x| x > 0.0);
    assert!(positive(&json["prefill_8_tok_s"]) && positive(&json["decode_tok_s"]), "{json}");
    for runs in ["prefill_8_runs_tok_s", "decode_runs_tok_s"] {
        let runs = json[runs].as_array().unwrap();
        assert!(runs.len() == 2 && runs.iter().all(positive), "every run's figure: {json}");
    }
    let rows = json["throughput"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["concurrency"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 3]);
    assert!(rows.iter().all(|r| positive(&r["tok_s"]) && positive(&r["median_ttft_ms"])), "{json}");
    assert_eq!(json["soak"]["requests"], 7);
    assert!(positive(&json["rss_after_load_mb"]) && positive(&json["peak_rss_mb"]), "{json}");

    let bad = llaisys(&["bench", "--model", dir, "--only", "nonsense"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown measurement 'nonsense'"));
}

/// `llaisys perplexity` on a fixture: a finite perplexity above 1, the same for the safetensors
/// model and its F32 GGUF (the same weights), and clear errors for a context beyond the model's
/// and a text shorter than one chunk.
#[test]
fn perplexity_scores_a_text_the_same_through_either_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "The capital of France is Paris. def fibonacci(n): return n if n < 2 else n - 1\n".repeat(12),
    )
    .unwrap();
    let text = text.to_str().unwrap();
    let score = |model: &str| {
        let out = llaisys(&["perplexity", "--model", model, "--file", text, "--ctx", "64"]);
        let line = stdout(&out);
        let value: f64 =
            line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"));
        assert!(value.is_finite() && value > 1.0, "{line}");
        value
    };
    let hf = score(fixture_dir("tiny-tied-f32").to_str().unwrap());
    let gguf = score(llaisys_tests::gguf_fixture("tiny-tied-f32").to_str().unwrap());
    assert!((hf - gguf).abs() < 1e-3 * hf, "{hf} against {gguf}");
    let model = fixture_dir("tiny-tied-f32");
    let model = model.to_str().unwrap();
    let out = llaisys(&["perplexity", "--model", model, "--file", text, "--ctx", "4096"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("beyond the model's context"));
    std::fs::write(dir.path().join("short.txt"), "Hi").unwrap();
    let short = dir.path().join("short.txt");
    let out = llaisys(&["perplexity", "--model", model, "--file", short.to_str().unwrap(), "--ctx", "64"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("fewer than one chunk"));
}

/// `llaisys perplexity --reference`: a model against itself drifts by nothing and always agrees
/// on the top token; quantized files of the same weights drift, Q4_0 further than Q8_0; another
/// model drifts further still. `--kv-dtype` sets the model's cache: against itself with the
/// reference's f16 cache, f32 drifts a little and q8_0 more.
#[test]
fn perplexity_measures_the_kl_divergence_from_a_reference() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "Paris is the capital of France. def add(a, b): return a + b\n".repeat(16)).unwrap();
    let text = text.to_str().unwrap();
    let base = llaisys_tests::gguf_fixture("tiny-tied-f32");
    let kld_with = |model: &str, kv: &str| {
        let args = ["perplexity", "--model", model, "--file", text, "--ctx", "64", "--kv-dtype", kv, "--reference"];
        let out = llaisys(&[&args[..], &[base.to_str().unwrap()]].concat());
        let report = stdout(&out);
        let field = |prefix: &str| -> f64 {
            let line = report.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{report}"));
            line[prefix.len()..].split_whitespace().next().unwrap().trim_end_matches('%').parse().unwrap()
        };
        (field("KL divergence mean "), field("same top token "))
    };
    let kld = |model: &str| kld_with(model, "auto");
    let (same, top) = kld(base.to_str().unwrap());
    assert!(same < 1e-9 && top == 100.0, "a model against itself: {same} {top}");
    let (f32_cache, _) = kld_with(base.to_str().unwrap(), "f32");
    let (q8_cache, _) = kld_with(base.to_str().unwrap(), "q8_0");
    assert!(0.0 < f32_cache && f32_cache < q8_cache && q8_cache < 0.01, "KV caches: f32 {f32_cache}, q8_0 {q8_cache}");
    let out = llaisys(&["perplexity", "--model", base.to_str().unwrap(), "--file", text, "--kv-dtype", "q4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--kv-dtype") && err.contains("q8_0"), "{err}");
    let (q8, _) = kld(llaisys_tests::gguf_fixture("tiny-tied-q8_0").to_str().unwrap());
    let (q4, _) = kld(llaisys_tests::gguf_fixture("tiny-tied-q4_0").to_str().unwrap());
    // (Four bits drift far on a model of 64-value rows: KL 3.9 against Q8_0's 0.013.)
    assert!(0.0 < q8 && q8 < 0.1 && q8 < q4 && q4.is_finite(), "Q8_0 {q8}, Q4_0 {q4}");
    // Another model with the same vocabulary: far apart, and never the same first choice here.
    let (other, top) = kld(llaisys_tests::gguf_fixture("tiny-qwen3-f32").to_str().unwrap());
    assert!(other > 10.0 * q4 && top < 50.0, "another model: {other} {top}");
}

/// `llaisys serve` on the device under test (`LLAISYS_TEST_DEVICE`: the CPU here, Mesa's
/// llvmpipe through wgpu in `scripts/test-wgpu.sh`): a greedy completion over HTTP gives the
/// transformers reference, and `/metrics` labels the replica with its device.
#[test]
fn serve_answers_with_the_reference_on_the_test_device() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::Stdio;

    let device = llaisys_tests::test_device();
    let name = "tiny-untied-f32";
    let dir = fixture_dir(name);
    #[rustfmt::skip]
    let mut child = Command::new(env!("CARGO_BIN_EXE_llaisys"))
        .args(["serve", "--model", dir.to_str().unwrap(), "--port", "0", "--device", &device, "--set", "engine.kv_capacity=512"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("run llaisys serve");
    // The address is on the line `llaisys: serving 'NAME' on http://ADDR`.
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(addr) = line.split("on http://").nth(1) {
                let _ = tx.send(Ok(addr.trim().to_string()));
            } else if line.contains("rror") {
                let _ = tx.send(Err(line));
            }
        }
    });
    let started = rx.recv_timeout(std::time::Duration::from_secs(120));
    let addr = match started {
        Ok(Ok(addr)) => addr,
        other => {
            let _ = child.kill();
            panic!("llaisys serve --device {device} did not start: {other:?}");
        }
    };
    let http = |method: &str, path: &str, body: &str| -> String {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
    };
    let p = &Reference::load(name).prompts[0];
    let body = serde_json::json!({
        "model": name, "prompt": p.ids, "max_tokens": p.greedy.len(), "temperature": 0, "ignore_eos": true
    });
    let answer: serde_json::Value = serde_json::from_str(&http("POST", "/v1/completions", &body.to_string())).unwrap();
    // The prompt's log-probabilities, every prefill row read back from the device.
    let body = serde_json::json!({"model": name, "prompt": p.ids, "max_tokens": 1, "echo": true, "logprobs": 1});
    let scored: serde_json::Value = serde_json::from_str(&http("POST", "/v1/completions", &body.to_string())).unwrap();
    let metrics = http("GET", "/metrics", "");
    let _ = child.kill();
    let _ = child.wait();
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(answer["choices"][0]["text"], tokenizer.decode(&p.greedy, true).unwrap(), "{answer}");
    let logprobs = &scored["choices"][0]["logprobs"];
    let piece = |id: u32| String::from_utf8_lossy(&tokenizer.token_bytes(id).unwrap_or_default()).into_owned();
    assert_eq!(logprobs["token_logprobs"].as_array().map(Vec::len), Some(p.ids.len() + 1), "{scored}");
    assert_eq!(logprobs["token_logprobs"][0], serde_json::Value::Null, "{scored}");
    for pos in 1..p.ids.len() {
        let best = logprobs["top_logprobs"][pos].as_object().unwrap();
        assert!(
            best.contains_key(&piece(p.topk[pos - 1].ids[0])),
            "position {pos}: {best:?} against {:?}",
            p.topk[pos - 1]
        );
        assert!(logprobs["token_logprobs"][pos].as_f64().is_some_and(|l| l < 0.0), "{scored}");
    }
    let label = format!("device=\"{device}\"");
    assert!(metrics.lines().any(|l| l.starts_with("llaisys_num_requests_running") && l.contains(&label)), "{metrics}");
}

#[test]
fn a_device_this_build_lacks_or_cannot_parse_is_a_clear_error() {
    let dir = fixture_dir("tiny-tied-f32");
    let dir = dir.to_str().unwrap();
    let out = llaisys(&["generate", "--model", dir, "--prompt", "hi", "--device", "tpu:0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown device 'tpu:0'"));
    if cfg!(not(feature = "cuda")) {
        let out = llaisys(&["generate", "--model", dir, "--prompt", "hi", "--device", "cuda"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("--features cuda"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A KV cache element type the device does not compute in is refused when the engine is built,
/// naming the setting (Mesa's llvmpipe has no 16-bit floats), instead of failing at the first
/// forward pass; where the device has it, the engine runs with it.
#[test]
fn a_kv_dtype_the_device_lacks_is_a_clear_error() {
    let device = llaisys_tests::test_device();
    let spec: llaisys_model::DeviceSpec = device.parse().unwrap();
    let has_f16 = spec.device().unwrap().supports_dtype(llaisys_model::KvDtype::F16.dtype());
    let dir = fixture_dir("tiny-tied-f32");
    let args = ["--device", &device, "--kv-dtype", "f16", "--only", "decode", "--decode-prompt", "4"];
    let out = llaisys(
        &[&["bench", "--model", dir.to_str().unwrap()], &args[..], &["--decode-tokens", "2", "--runs", "1"]].concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if has_f16 {
        assert!(out.status.success(), "{stderr}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"kv_dtype\":\"f16\""));
    } else {
        assert!(
            !out.status.success() && stderr.contains("does not compute in f16") && stderr.contains("--kv-dtype f32"),
            "{stderr}"
        );
    }
}

/// `llaisys bench --device ...` on a GPU reports the decode step's kernel launches and its
/// host↔device transfers, counted where they are made: greedy decoding reads back only each
/// step's picked id (its argmax is found on the device), not the logits.
#[test]
fn bench_on_a_gpu_counts_launches_and_transfers_per_decode_step() {
    let device = llaisys_tests::test_device();
    let dir = fixture_dir("tiny-tied-f32");
    let args = ["--device", &device, "--only", "decode", "--decode-prompt", "4", "--decode-tokens", "8", "--runs", "1"];
    let out = llaisys(&[&["bench", "--model", dir.to_str().unwrap()], &args[..]].concat());
    let (text, stderr) = (stdout(&out), String::from_utf8_lossy(&out.stderr).to_string());
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let on_gpu = cfg!(any(feature = "wgpu", feature = "cuda")) && device != "cpu";
    if !on_gpu {
        assert!(json["launches"].is_null() && json["transfers"].is_null(), "nothing to count on the CPU: {json}");
        return;
    }
    assert!(json["launches"]["per_step"].as_f64().is_some_and(|n| n > 0.0), "{json}");
    let moved = &json["transfers"];
    let per_step = |key: &str| moved[key].as_f64().unwrap_or_else(|| panic!("{key}: {json}"));
    // Each pass uploads its inputs; the prompt's pass is among the steps.
    assert!(per_step("uploads_per_step") >= 4.0, "{json}");
    assert!((1.0..=1.2).contains(&per_step("readbacks_per_step")), "one read a step: {json}");
    assert!(per_step("readback_bytes_per_step") <= 16.0, "an id, not 1,024 logits: {json}");
}

/// Concurrent requests sampled at a high temperature (10) without a top-k: on a GPU most rows' draws
/// fall past their 64 candidates and the rows are read whole, and a step's such rows are read
/// together, one readback for all of them (a readback each made it more than one a token).
#[test]
fn a_steps_rows_read_whole_come_back_in_one_readback() {
    let device = llaisys_tests::test_device();
    let dir = fixture_dir("tiny-tied-f32");
    #[rustfmt::skip]
    let out = llaisys(&[
        "bench", "--model", dir.to_str().unwrap(), "--device", &device, "--only", "throughput",
        "--concurrency", "8", "--prompt-tokens", "4", "--new-tokens", "8", "--runs", "1", "--temperature", "10",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    let row = &json["throughput"][0];
    assert_eq!(row["concurrency"], 8, "{json}");
    if cfg!(any(feature = "wgpu", feature = "cuda")) && device != "cpu" {
        let (readbacks, bytes) =
            (row["readbacks_per_token"].as_f64().unwrap(), row["readback_bytes_per_token"].as_f64().unwrap());
        // Rows of 1,024 logits (4,096 bytes) came back for most tokens, in a readback or two a
        // step of eight tokens (and the prompts' passes').
        assert!(bytes > 2048.0, "rows were read whole: {json}");
        assert!(readbacks < 0.6, "one readback for a step's rows: {json}");
    } else {
        assert!(row.get("readbacks_per_token").is_none(), "{json}");
    }
}

/// `llaisys bench --temperature ... --top-k K` samples its decode requests (the JSON says how);
/// on a GPU each step reads back the row's K candidates (8·K bytes), not its logits; without a
/// top-k, or with penalties (with a top-k or without), 64 candidates (and the row's mass, and
/// the logits of the tokens the penalties change), and the row only where they cannot decide.
/// A sampling parameter out of range is a usage error naming the flags.
#[test]
fn bench_samples_when_asked_and_a_gpu_reads_back_only_the_candidates() {
    let device = llaisys_tests::test_device();
    let dir = fixture_dir("tiny-tied-f32");
    #[rustfmt::skip]
    let args = [
        "--device", &device, "--only", "decode", "--decode-prompt", "4", "--decode-tokens", "8", "--runs", "1",
        "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9",
    ];
    let out = llaisys(&[&["bench", "--model", dir.to_str().unwrap()], &args[..]].concat());
    let (text, stderr) = (stdout(&out), String::from_utf8_lossy(&out.stderr).to_string());
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let sampling = &json["sampling"];
    assert!(sampling["top_k"] == 20 && sampling["temperature"] == 0.8 && sampling["top_p"] == 0.9, "{json}");
    if cfg!(any(feature = "wgpu", feature = "cuda")) && device != "cpu" {
        let bytes = json["transfers"]["readback_bytes_per_step"].as_f64().unwrap();
        // 160 bytes a decode step; the prompt's pass (a step of its own) reads as much.
        assert!((150.0..=170.0).contains(&bytes), "20 candidates, not 1,024 logits: {json}");
    }
    for extra in [
        &["--temperature", "0.8"][..],
        &["--temperature", "0.8", "--top-k", "20", "--repetition-penalty", "1.1"],
        &["--temperature", "0.8", "--repetition-penalty", "1.1"],
        &["--temperature", "0.8", "--presence-penalty", "0.5", "--frequency-penalty", "-0.3"],
    ] {
        let out = llaisys(&[&["bench", "--model", dir.to_str().unwrap()], &args[..10], extra].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
        let flag = |name: &str| extra.iter().position(|f| *f == name).map(|i| extra[i + 1].parse::<f64>().unwrap());
        for (param, off) in [("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)] {
            let want = flag(&format!("--{}", param.replace('_', "-"))).unwrap_or(off);
            assert_eq!(json["sampling"][param], want, "{extra:?}: {json}");
        }
        if cfg!(any(feature = "wgpu", feature = "cuda")) && device != "cpu" {
            let bytes = json["transfers"]["readback_bytes_per_step"].as_f64().unwrap();
            // 64 candidates (and a mass): 512 or 520 bytes a step, 4 more a watched token (the
            // prompt's and the output's, under a penalty), a row of 4,096 where read.
            assert!((510.0..4096.0).contains(&bytes), "{extra:?}: candidates, rows rarely: {json}");
        }
    }
    let bad = llaisys(&["bench", "--model", dir.to_str().unwrap(), "--top-p", "2", "--only", "decode"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.contains("--top-p") && stderr.contains("top_p"), "{stderr}");
}

/// `llaisys run-batch` answers OpenAI's batch format in order, through the server's routes: each
/// reference prompt's greedy tokens (completions asked for their token ids), a chat, an
/// embedding; lines that are no requests answer an error; from a file to standard output, and
/// from standard input to a file.
#[test]
fn run_batch_answers_each_line_in_order() {
    let name = "tiny-untied-f32";
    let dir = fixture_dir(name);
    let prompts = Reference::load(name).prompts;
    let mut lines: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let body = serde_json::json!({"model": name, "prompt": p.ids, "max_tokens": p.greedy.len(),
                "temperature": 0, "ignore_eos": true, "return_token_ids": true});
            serde_json::json!({"custom_id": format!("p{i}"), "method": "POST", "url": "/v1/completions", "body": body})
                .to_string()
        })
        .collect();
    let chat = serde_json::json!({"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3});
    lines.push(
        serde_json::json!({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": chat})
            .to_string(),
    );
    lines.push(String::new()); // blank lines are skipped
    let embed = serde_json::json!({"model": name, "input": "hi"});
    lines.push(
        serde_json::json!({"custom_id": "embed", "method": "POST", "url": "/v1/embeddings", "body": embed}).to_string(),
    );
    lines.push(r#"{"custom_id": "wrong", "method": "POST", "url": "/v1/completions", "body": {"model": "nope", "prompt": "x"}}"#.into());
    lines.push(r#"{"custom_id": "streamed", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "stream": true}}"#.into());
    lines.push("not json".into());
    let input = lines.join("\n");
    let check = |answers: &str| {
        let answers: Vec<serde_json::Value> = answers.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let ids: Vec<String> = answers.iter().map(|a| a["custom_id"].as_str().unwrap_or("-").to_string()).collect();
        let mut expected: Vec<String> = (0..prompts.len()).map(|i| format!("p{i}")).collect();
        expected.extend(["chat", "embed", "wrong", "streamed", "-"].map(String::from));
        assert_eq!(ids, expected);
        for (a, p) in answers.iter().zip(&prompts) {
            assert_eq!(a["response"]["status_code"], 200, "{a}");
            let tokens: Vec<u32> =
                serde_json::from_value(a["response"]["body"]["choices"][0]["token_ids"].clone()).unwrap();
            assert_eq!(tokens, p.greedy, "{a}");
            assert_eq!(a["id"], format!("batch_req_{}", a["response"]["request_id"].as_str().unwrap()));
        }
        let [chat, embed, wrong, streamed, garbage] = &answers[prompts.len()..] else { panic!("{answers:?}") };
        assert_eq!(chat["response"]["body"]["object"], "chat.completion", "{chat}");
        assert_eq!(embed["response"]["body"]["data"][0]["object"], "embedding", "{embed}");
        assert_eq!(wrong["response"]["status_code"], 404, "{wrong}");
        assert_eq!(wrong["response"]["body"]["error"]["param"], "model", "{wrong}");
        for refused in [streamed, garbage] {
            assert!(refused["response"].is_null() && refused["error"]["message"].is_string(), "{refused}");
        }
    };
    let file = std::env::temp_dir().join(format!("llaisys-batch-{}.jsonl", std::process::id()));
    std::fs::write(&file, &input).unwrap();
    let out = llaisys(&["run-batch", "-i", file.to_str().unwrap(), "-o", "-", "--model", dir.to_str().unwrap()]);
    check(&stdout(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("requests answered, 5 succeeded, 3 failed"), "{out:?}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_llaisys"))
        .args(["run-batch", "-i", "-", "-o", file.to_str().unwrap(), "--model", dir.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    check(&std::fs::read_to_string(&file).unwrap());
    std::fs::remove_file(&file).unwrap();
}
