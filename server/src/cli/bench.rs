//! `llaisys bench`: speed through the engine (the same path requests take when serving).
//!
//! - prefill: tokens/s of one request's prompt (time to its first token);
//! - decode: tokens/s of one request after its first token;
//! - throughput: N concurrent requests, each with its own prompt: aggregate generated tokens/s,
//!   time to first token, inter-token latency; with `--json-schema FILE` every request is
//!   constrained by that schema (T1) and the grammar masks' time per token is reported (a
//!   schema the output cannot complete within `--new-tokens` keeps the work comparable);
//! - soak (only when asked for): `--soak-requests` short requests, `--concurrency`'s largest
//!   at a time, and the resident memory after the first tenth and at the end (growth = leak);
//! - resident memory after loading and warming up, and the process's peak.
//!
//! Inputs are fixed by `--seed` (random token ids), prefix caching is off so repeated runs
//! compute the same work, a warm-up request runs first, and every figure is the median over
//! `--runs` runs. The table goes to stdout, followed by one JSON line with every figure.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use llaisys_actors::request::FinishReason;
use llaisys_actors::speculative::SpeculativeConfig;
use llaisys_actors::{ChatRequest, Constraint, Engine, EngineConfig, Event, GenerateParams, GenerateRequest, Guidance};
use llaisys_model::transfers::Transfers;
use llaisys_model::{DeviceSpec, KvDtype, SamplingParams, WeightDtype};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::CliError;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The model: a GGUF file, a Hugging Face directory, or `org/repo[:QUANT]` on the hub.
    #[arg(long)]
    model: PathBuf,
    /// Model type; default: `model_type` of config.json, or the GGUF's architecture.
    #[arg(long)]
    model_type: Option<String>,
    /// Weight dtype in memory: auto (the checkpoint's own), f32, f16, bf16, q8_0, q4_0, q4_1,
    /// q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, mxfp4, q3_k_m, q4_k_m, q5_k_m (quantized at load where
    /// stored otherwise).
    #[arg(long, default_value = "auto")]
    dtype: WeightDtype,
    /// An importance matrix weighting the errors of the matrices `--dtype` quantizes at load (see
    /// `llaisys generate --help`).
    #[arg(long)]
    imatrix: Option<PathBuf>,
    /// Devices, one replica each: cpu, wgpu, vulkan, gl, cuda (an index as in vulkan:1), as a list
    /// (`cpu,cpu`); GPUs need a build with the `wgpu` (or `cuda`) feature.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// The KV cache's element type: auto (the device's default, f16 on the CPU), f32, f16, bf16,
    /// q8_0 (the CPU only).
    #[arg(long, default_value = "auto")]
    kv_dtype: String,
    /// Prompt lengths of the prefill measurement.
    #[arg(long, value_delimiter = ',', default_value = "128,512")]
    prefill: Vec<usize>,
    /// Prompt and generated tokens of the batch-1 decode measurement.
    #[arg(long, default_value_t = 128)]
    decode_prompt: usize,
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Concurrent requests of the throughput measurements.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,32")]
    concurrency: Vec<usize>,
    /// Prompt tokens and generated tokens of each throughput request.
    #[arg(long, default_value_t = 100)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Runs of each measurement; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seed of the prompts' token ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Engine budgets (defaults as when serving).
    #[arg(long)]
    max_seqs_per_step: Option<usize>,
    #[arg(long)]
    max_tokens_per_step: Option<usize>,
    #[arg(long)]
    max_prefill_tokens_while_decoding: Option<usize>,
    #[arg(long)]
    prefill_step_factor: Option<f64>,
    /// Requests of the soak measurement (16-token prompts, 8 new tokens each).
    #[arg(long, default_value_t = 1000)]
    soak_requests: usize,
    /// Constrain the throughput requests by this JSON schema (a file).
    #[arg(long)]
    json_schema: Option<PathBuf>,
    /// Speculative decoding for every request (prompt lookup, or `--draft-model`).
    #[arg(long)]
    speculative: bool,
    /// A draft model proposing for speculative decoding (implies `--speculative`).
    #[arg(long)]
    draft_model: Option<PathBuf>,
    /// Most tokens proposed per sequence and step.
    #[arg(long)]
    max_draft: Option<usize>,
    /// The decode measurement's prompt: this file's text as a user message, rendered by the
    /// model's chat template, answered greedily until the answer ends (at most
    /// `--decode-tokens`), instead of random token ids. Speculation needs real text to guess.
    #[arg(long)]
    chat_prompt: Option<PathBuf>,
    /// On a GPU, time each kernel of the decode and throughput measurements on the device
    /// (kernels then run one at a time, so their tok/s is not the pass's): the reports rank
    /// kernels by device time.
    #[arg(long)]
    kernel_times: bool,
    /// Sampling of the decode and throughput requests: 0 = greedy (the default); above 0,
    /// `--top-k`, `--top-p` and `--min-p` apply as in a request (each request seeded by `--seed`);
    /// `--repetition-penalty` (1 = off), `--presence-penalty` and `--frequency-penalty` (0 =
    /// off) at any temperature.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Which measurements to run: prefill, decode, throughput, soak.
    #[arg(long, value_delimiter = ',', default_value = "prefill,decode,throughput")]
    only: Vec<String>,
}

pub fn run(args: BenchArgs) -> Result<(), CliError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench(args))
}

/// One request's timings.
struct Timing {
    ttft: Duration,
    /// Gaps between consecutive tokens.
    gaps: Vec<Duration>,
    tokens: usize,
    /// Grammar mask time of each token (constrained requests).
    masks: Vec<Duration>,
    /// Why the request ended.
    finish: Option<FinishReason>,
}

async fn bench(args: BenchArgs) -> Result<(), CliError> {
    if args.runs == 0 {
        return Err(CliError::usage("--runs", "must be at least 1"));
    }
    for m in &args.only {
        if !["prefill", "decode", "throughput", "soak"].contains(&m.as_str()) {
            let reason = format!("unknown measurement '{m}' (prefill, decode, throughput, soak)");
            return Err(CliError::usage("--only", reason));
        }
    }
    let devices = DeviceSpec::parse_list(&args.device).map_err(|e| CliError::usage("--device", e.to_string()))?;
    let engine_on_gpu = devices.iter().any(|d| *d != DeviceSpec::Cpu);
    let defaults = EngineConfig::default();
    let max_seqs = args.max_seqs_per_step.unwrap_or(defaults.max_seqs_per_step);
    let most = args.concurrency.iter().copied().max().unwrap_or(1).max(1);
    let longest = args.prefill.iter().copied().chain([args.decode_prompt + args.decode_tokens]).max().unwrap_or(0);
    let kv_dtype = KvDtype::parse_setting(&args.kv_dtype).map_err(|e| CliError::usage("--kv-dtype", e))?;
    let config = EngineConfig {
        kv_dtype,
        kv_capacity: (most * (args.prompt_tokens + args.new_tokens)).max(longest + 1).max(defaults.kv_capacity),
        max_seqs_per_step: max_seqs,
        max_tokens_per_step: args.max_tokens_per_step.unwrap_or(defaults.max_tokens_per_step),
        max_prefill_tokens_while_decoding: args
            .max_prefill_tokens_while_decoding
            .unwrap_or(defaults.max_prefill_tokens_while_decoding),
        prefill_step_factor: args.prefill_step_factor.unwrap_or(defaults.prefill_step_factor),
        prefix_caching: false,
        ..defaults
    };
    let speculative = SpeculativeConfig {
        default_on: args.speculative || args.draft_model.is_some(),
        max_draft: args.max_draft.unwrap_or(defaults.speculative.max_draft),
        ..defaults.speculative
    };
    let config = EngineConfig { speculative, ..config };
    let model = super::local_model(&args.model).await?;
    let mut builder = Engine::builder().model(&model).dtype(args.dtype).devices(devices).config(config);
    if let Some(m) = &args.imatrix {
        builder = builder.imatrix(m);
    }
    if let Some(t) = &args.model_type {
        builder = builder.model_type(t.clone());
    }
    if let Some(draft) = &args.draft_model {
        builder = builder.draft_model(draft);
    }
    let engine = builder.build().await?;
    let guidance = match &args.json_schema {
        None => Guidance::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| CliError::Read { path: path.clone(), source })?;
            let schema = serde_json::from_str(&text)
                .map_err(|e| CliError::usage("--json-schema", format!("{}: {e}", path.display())))?;
            let start = Instant::now();
            let guidance = engine.guidance(&Constraint::JsonSchema { schema, strict: false })?;
            eprintln!("grammar compiler and schema ready in {:.0} ms", ms(start.elapsed()));
            guidance
        }
    };
    let info = engine.info().clone();
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: Some(args.seed),
        ..SamplingParams::default()
    };
    sampling.validate(info.vocab_size).map_err(|e| {
        let flags = "--temperature, --top-k, --top-p, --min-p, --repetition-penalty, --presence-penalty, \
                     --frequency-penalty";
        CliError::usage(flags, e.to_string())
    })?;
    // The decode measurement's requests, and the throughput measurement's (constrained where
    // asked); the others (warm-up, prefill) greedy.
    let sampled = GenerateParams { sampling, ..GenerateParams::default() };
    let throughput = GenerateParams { guidance, ..sampled.clone() };
    let greedy = GenerateParams::default();
    let mut rng = StdRng::seed_from_u64(args.seed);
    let vocab = info.vocab_size as u32;
    let mut prompt = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..vocab)).collect() };
    let fits = |prompt: usize, new: usize| prompt + new <= info.context_length;

    eprintln!("warming up");
    run_one(&engine, prompt(16), 4, &greedy).await?;

    let mut report = serde_json::Map::new();
    report.insert("model".into(), json!(args.model.display().to_string()));
    report.insert("dtype".into(), json!(args.dtype.to_string()));
    // As typed (0.8, not the f32's 0.800000011920929 widened).
    let typed = |v: f32| v.to_string().parse::<f64>().unwrap_or(f64::NAN);
    let s = &sampled.sampling;
    report.insert(
        "sampling".into(),
        json!({
            "temperature": typed(s.temperature),
            "top_k": s.top_k,
            "top_p": typed(s.top_p),
            "min_p": typed(s.min_p),
            "repetition_penalty": typed(s.repetition_penalty),
            "presence_penalty": typed(s.presence_penalty),
            "frequency_penalty": typed(s.frequency_penalty),
        }),
    );
    report.insert("device".into(), json!(args.device));
    report.insert("cpu".into(), json!(cpu_model()));
    let stats = engine.stats().await?;
    let kv_dtype = stats.kv_dtype.map_or("unknown", KvDtype::name);
    eprintln!("KV cache: {} cells in {kv_dtype}, {:.0} MB", stats.kv_capacity, stats.kv_bytes as f64 / 1e6);
    report.insert("kv_dtype".into(), json!(kv_dtype));
    report.insert("kv_cache_mb".into(), json!(round(stats.kv_bytes as f64 / 1e6)));
    report.insert("runs".into(), json!(args.runs));
    let loaded = rss_mb("VmRSS:");
    report.insert("rss_after_load_mb".into(), json!(loaded.map(round)));
    println!("{:<34} {:>12} {:>12} {:>12} {:>12}", "measurement", "tok/s", "ttft ms", "itl ms", "p99 itl ms");
    let only = |m: &str| args.only.iter().any(|o| o == m);

    if only("prefill") {
        for &n in &args.prefill {
            if !fits(n, 1) {
                eprintln!("prefill {n}: skipped, longer than the model's context ({})", info.context_length);
                continue;
            }
            let mut speeds = Vec::new();
            for _ in 0..args.runs {
                let t = run_one(&engine, prompt(n), 1, &greedy).await?;
                speeds.push(n as f64 / t.ttft.as_secs_f64());
            }
            report.insert(format!("prefill_{n}_runs_tok_s"), runs_json(&speeds));
            let speed = median(&mut speeds);
            println!("{:<34} {:>12.1}", format!("prefill {n} tokens"), speed);
            report.insert(format!("prefill_{n}_tok_s"), json!(round(speed)));
        }
    }

    let chat_prompt = match &args.chat_prompt {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| CliError::Read { path: path.clone(), source })?;
            let request = ChatRequest::default().user(text).temperature(0.0).max_tokens(args.decode_tokens);
            let valid = engine.prepare_chat(&request)?;
            Some((valid.prompts()[0].clone(), valid.params().clone()))
        }
        None => None,
    };
    let decode_prompt = chat_prompt.as_ref().map_or(args.decode_prompt, |(p, _)| p.len());
    if only("decode") && fits(decode_prompt, args.decode_tokens) {
        let (mut speeds, mut itls) = (Vec::new(), Vec::new());
        // GPU backends count every kernel the runtime launches (None on a CPU-only build). A
        // run's first token comes from its prompt's prefill: each run is preceded by a prefill
        // alone of a prompt as long (one token), whose launches and transfers are taken from
        // the run's, so that what is reported is its decode steps'.
        let watch = if engine_on_gpu { llaisys_model::launches::watch(args.kernel_times) } else { None };
        let (mut launched, mut moved) = (llaisys_model::launches::Launches::default(), Transfers::default());
        let mut steps = 0;
        for _ in 0..args.runs {
            let mut prefill = None;
            if let Some(watch) = &watch {
                watch.take();
                llaisys_model::transfers::take();
                match &chat_prompt {
                    Some((p, params)) => {
                        timed(&engine, p.clone(), GenerateParams { max_tokens: 1, ..params.clone() }).await?
                    }
                    None => run_one(&engine, prompt(args.decode_prompt), 1, &sampled).await?,
                };
                prefill = Some((watch.take(), llaisys_model::transfers::take()));
            }
            let t = match &chat_prompt {
                Some((p, params)) => timed(&engine, p.clone(), params.clone()).await?,
                None => run_one(&engine, prompt(args.decode_prompt), args.decode_tokens, &sampled).await?,
            };
            if let (Some(watch), Some((prefill_launches, prefill_moved))) = (&watch, prefill) {
                let mut run = watch.take();
                run.subtract(&prefill_launches);
                launched.add(run);
                moved = moved.plus(llaisys_model::transfers::take().minus(prefill_moved));
            }
            let decode_time: Duration = t.gaps.iter().sum();
            steps += t.gaps.len();
            speeds.push(t.gaps.len() as f64 / decode_time.as_secs_f64().max(1e-9));
            itls.push(ms(decode_time) / t.gaps.len().max(1) as f64);
        }
        report.insert("decode_runs_tok_s".into(), runs_json(&speeds));
        let (speed, itl) = (median(&mut speeds), median(&mut itls));
        let label = match &chat_prompt {
            Some((p, _)) => format!("decode chat answer after {}", p.len()),
            None => format!("decode {} after {}", args.decode_tokens, args.decode_prompt),
        };
        println!("{label:<34} {speed:>12.1} {:>12} {itl:>12.1}", "");
        report.insert("decode_tok_s".into(), json!(round(speed)));
        if watch.is_some() {
            let replayed = llaisys_model::LoadOptions::default().step_graphs;
            let launches = launch_report(&launched, steps, "decode step", args.kernel_times, replayed);
            report.insert("launches".into(), launches);
            report.insert("transfers".into(), transfer_report(&moved, steps));
        }
    }

    if only("throughput") && fits(args.prompt_tokens, args.new_tokens) {
        let mut rows = Vec::new();
        for &c in &args.concurrency {
            let mut results = Vec::new();
            // On a GPU, the launches and transfers of the runs (their prefills included) per
            // generated token.
            let watch = if engine_on_gpu { llaisys_model::launches::watch(args.kernel_times) } else { None };
            llaisys_model::transfers::take();
            for _ in 0..args.runs {
                let prompts: Vec<Vec<u32>> = (0..c).map(|_| prompt(args.prompt_tokens)).collect();
                results.push(concurrent(&engine, prompts, args.new_tokens, &throughput).await?);
            }
            let moved = llaisys_model::transfers::take();
            let generated = results.iter().map(|r| r.tokens).sum::<usize>().max(1) as f64;
            let pick = |f: fn(&Concurrent) -> f64| median(&mut results.iter().map(f).collect::<Vec<_>>());
            let mut row = json!({
                "concurrency": c,
                "tok_s": round(pick(|r| r.tok_s)),
                "mean_ttft_ms": round(pick(|r| r.mean_ttft_ms)),
                "median_ttft_ms": round(pick(|r| r.median_ttft_ms)),
                "mean_itl_ms": round(pick(|r| r.mean_itl_ms)),
                "p99_itl_ms": round(pick(|r| r.p99_itl_ms)),
                "max_request_itl_over_median": round(pick(|r| r.worst_request_itl_ratio)),
                "mask_p50_us": pick(|r| r.mask_p50_us).round(),
                "mask_p99_us": pick(|r| r.mask_p99_us).round(),
            });
            if engine_on_gpu {
                row["readbacks_per_token"] = json!((moved.readbacks as f64 / generated * 100.0).round() / 100.0);
                row["readback_bytes_per_token"] = json!((moved.readback_bytes as f64 / generated).round());
            }
            println!(
                "{:<34} {:>12.1} {:>12.0} {:>12.1} {:>12.1}",
                format!("{c} concurrent ({}+{} tokens)", args.prompt_tokens, args.new_tokens),
                row["tok_s"].as_f64().unwrap_or_default(),
                row["mean_ttft_ms"].as_f64().unwrap_or_default(),
                row["mean_itl_ms"].as_f64().unwrap_or_default(),
                row["p99_itl_ms"].as_f64().unwrap_or_default(),
            );
            if engine_on_gpu {
                println!(
                    "{:<34} {:>12.2} {:>12} {:>12.0}",
                    "  readbacks per token (bytes)",
                    row["readbacks_per_token"].as_f64().unwrap_or_default(),
                    "",
                    row["readback_bytes_per_token"].as_f64().unwrap_or_default(),
                );
            }
            if let Some(watch) = &watch {
                let replayed = llaisys_model::LoadOptions::default().step_graphs;
                row["launches"] =
                    launch_report(&watch.take(), generated as usize, "token", args.kernel_times, replayed);
            }
            if args.json_schema.is_some() {
                println!(
                    "{:<34} p50 {:.0} us, p99 {:.0} us",
                    "  grammar mask per token",
                    row["mask_p50_us"].as_f64().unwrap_or_default(),
                    row["mask_p99_us"].as_f64().unwrap_or_default()
                );
            }
            rows.push(row);
        }
        report.insert("throughput".into(), json!(rows));
    }

    if only("soak") && args.soak_requests > 0 {
        let (mut done, mut after_tenth) = (0, None);
        while done < args.soak_requests {
            let wave = most.min(args.soak_requests - done);
            concurrent(&engine, (0..wave).map(|_| prompt(16)).collect(), 8, &greedy).await?;
            done += wave;
            if after_tenth.is_none() && done >= args.soak_requests / 10 {
                after_tenth = rss_mb("VmRSS:");
            }
        }
        let end = rss_mb("VmRSS:");
        let growth = end.zip(after_tenth).map(|(e, t)| e - t);
        println!(
            "soak: {done} requests, resident {} MB after {}, {} MB at the end (growth {} MB)",
            after_tenth.map_or("?".into(), |v| format!("{v:.0}")),
            args.soak_requests / 10,
            end.map_or("?".into(), |v| format!("{v:.0}")),
            growth.map_or("?".into(), |v| format!("{v:.1}")),
        );
        report.insert(
            "soak".into(),
            json!({"requests": done, "rss_after_tenth_mb": after_tenth.map(round), "rss_end_mb": end.map(round),
                   "growth_mb": growth.map(round)}),
        );
    }

    if config.speculative.default_on {
        let s = engine.stats().await?.speculative;
        let rate = s.accepted as f64 / s.proposed.max(1) as f64;
        println!(
            "speculative ({}): {} proposed, {} accepted ({:.1}%)",
            s.proposer,
            s.proposed,
            s.accepted,
            100.0 * rate
        );
        report.insert(
            "speculative".into(),
            json!({"proposer": s.proposer, "proposed": s.proposed, "accepted": s.accepted, "acceptance": round(rate * 100.0) / 100.0}),
        );
    }
    // Which kernels the linear layers' products ran on (chosen at load for this CPU).
    let kernels: serde_json::Map<String, serde_json::Value> = llaisys_model::kernels::calls()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| (name.to_string(), json!(n)))
        .collect();
    println!(
        "linear products by kernel: {}",
        kernels.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
    );
    report.insert("kernel_calls".into(), serde_json::Value::Object(kernels));
    // A mixture of experts: tokens routed to each expert (all layers), and expert products run
    // (each reads its expert's weights once for all the tokens of a pass that chose it).
    let (routed, products) = llaisys_model::layers::expert_stats();
    if products > 0 {
        let tokens: u64 = routed.iter().sum();
        println!(
            "experts: {products} expert products for {tokens} routed tokens ({:.2} tokens per expert load); tokens per expert: {}",
            tokens as f64 / products as f64,
            routed.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
        );
        report.insert(
            "experts".into(),
            json!({"products": products, "routed_tokens": tokens, "tokens_per_expert": routed}),
        );
    }
    let peak = rss_mb("VmHWM:");
    println!(
        "resident memory after load: {}; peak: {}",
        loaded.map_or("unknown".into(), |mb| format!("{mb:.0} MB")),
        peak.map_or("unknown".into(), |mb| format!("{mb:.0} MB"))
    );
    report.insert("peak_rss_mb".into(), json!(peak.map(round)));
    engine.shutdown().await;
    println!("{}", serde_json::Value::Object(report));
    Ok(())
}

/// One request of `prompt` sampled and constrained as `shape` says, generating exactly
/// `max_tokens` tokens.
async fn run_one(
    engine: &Engine,
    prompt: Vec<u32>,
    max_tokens: usize,
    shape: &GenerateParams,
) -> Result<Timing, CliError> {
    let params = GenerateParams { max_tokens, ignore_eos: true, ..shape.clone() };
    let timing = timed(engine, prompt, params).await?;
    if timing.tokens != max_tokens {
        let finish = timing.finish.map_or("no finish", |f| f.as_str());
        return Err(CliError::ShortRun { tokens: timing.tokens, max_tokens, finish });
    }
    Ok(timing)
}

/// Runs one request and times its tokens.
async fn timed(engine: &Engine, prompt: Vec<u32>, params: GenerateParams) -> Result<Timing, CliError> {
    let start = Instant::now();
    let mut stream = engine.generate(GenerateRequest::new(prompt, params)).await?;
    let (mut last, mut ttft, mut gaps, mut tokens, mut masks) = (start, None, Vec::new(), 0, Vec::new());
    let mut finish = None;
    while let Some(event) = stream.next().await {
        match event {
            Event::Token { mask_time, .. } => {
                masks.extend(mask_time);
                let now = Instant::now();
                match ttft {
                    None => ttft = Some(now - start),
                    Some(_) => gaps.push(now - last),
                }
                last = now;
                tokens += 1;
            }
            Event::Finished { reason, .. } => finish = Some(reason),
        }
    }
    Ok(Timing { ttft: ttft.unwrap_or_default(), gaps, tokens, masks, finish })
}

struct Concurrent {
    /// Tokens generated.
    tokens: usize,
    tok_s: f64,
    mean_ttft_ms: f64,
    median_ttft_ms: f64,
    mean_itl_ms: f64,
    p99_itl_ms: f64,
    /// The slowest request's mean inter-token latency over the median request's.
    worst_request_itl_ratio: f64,
    mask_p50_us: f64,
    mask_p99_us: f64,
}

async fn concurrent(
    engine: &Engine,
    prompts: Vec<Vec<u32>>,
    new_tokens: usize,
    shape: &GenerateParams,
) -> Result<Concurrent, CliError> {
    let start = Instant::now();
    let tasks: Vec<_> = prompts
        .into_iter()
        .map(|p| {
            let (engine, shape) = (engine.clone(), shape.clone());
            tokio::spawn(async move { run_one(&engine, p, new_tokens, &shape).await })
        })
        .collect();
    let mut timings = Vec::new();
    for task in tasks {
        timings.push(task.await.map_err(|_| CliError::GenerationFailed)??);
    }
    let wall = start.elapsed().as_secs_f64();
    let tokens: usize = timings.iter().map(|t| t.tokens).sum();
    let mut ttfts: Vec<f64> = timings.iter().map(|t| ms(t.ttft)).collect();
    let mut request_itls: Vec<f64> =
        timings.iter().map(|t| ms(t.gaps.iter().sum::<Duration>()) / t.gaps.len().max(1) as f64).collect();
    let mut gaps: Vec<f64> = timings.iter().flat_map(|t| t.gaps.iter().map(|g| ms(*g))).collect();
    gaps.sort_by(f64::total_cmp);
    let p99 = gaps.get(((gaps.len() as f64 * 0.99) as usize).min(gaps.len().saturating_sub(1))).copied();
    let worst = request_itls.iter().copied().fold(0.0, f64::max);
    let mut masks: Vec<f64> = timings.iter().flat_map(|t| t.masks.iter().map(|m| m.as_secs_f64() * 1e6)).collect();
    masks.sort_by(f64::total_cmp);
    let quantile = |q: f64| masks.get(((masks.len() as f64 * q) as usize).min(masks.len().saturating_sub(1))).copied();
    Ok(Concurrent {
        tokens,
        tok_s: tokens as f64 / wall,
        mean_ttft_ms: mean(&ttfts),
        median_ttft_ms: median(&mut ttfts),
        mean_itl_ms: mean(&request_itls),
        p99_itl_ms: p99.unwrap_or_default(),
        worst_request_itl_ratio: worst / median(&mut request_itls).max(1e-9),
        mask_p50_us: quantile(0.5).unwrap_or_default(),
        mask_p99_us: quantile(0.99).unwrap_or_default(),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Every run's figure, in the order run (the median hides a slow run; these machines have them).
fn runs_json(speeds: &[f64]) -> serde_json::Value {
    json!(speeds.iter().map(|&s| round(s)).collect::<Vec<_>>())
}

/// A resident-set figure of the process (`VmRSS:` now, `VmHWM:` peak), in MB; Linux only.
fn rss_mb(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The decode measurement's kernel launches per step (one token each), printed and as JSON:
/// the most launched kernels, or with `timed` the ones taking the most device time; `replayed`
/// where steps replay their recorded graphs (whose launches the host does not make).
/// `launches` over `steps` (decode steps, or generated tokens: `unit`), printed and as JSON.
fn launch_report(
    launches: &llaisys_model::launches::Launches,
    steps: usize,
    unit: &str,
    timed: bool,
    replayed: bool,
) -> serde_json::Value {
    let per_step = |n: f64| n / steps.max(1) as f64;
    let total = launches.total();
    println!("{:<34} {:>12.1}", format!("  kernel launches per {unit}"), per_step(total as f64));
    if replayed {
        println!(
            "    (a step replaying its recorded graph launches nothing from the host; LLAISYS_GPU_GRAPHS=off counts a plain step's)"
        );
    }
    let mut rows = Vec::new();
    let time = launches.time().as_secs_f64().max(1e-12);
    // Untimed, every time is zero and `ranked` orders by launches.
    for (kernel, n, t) in launches.ranked().into_iter().take(if timed { 16 } else { 12 }) {
        let us = per_step(t.as_secs_f64() * 1e6);
        if timed {
            let share = 100.0 * t.as_secs_f64() / time;
            println!("    {:>7.1} / {unit} {us:>9.1} us {share:>5.1}%  {kernel}", per_step(n as f64));
        } else {
            println!("    {:>7.1} / {unit}  {kernel}", per_step(n as f64));
        }
        rows.push(json!({ "kernel": kernel, "per_step": round(per_step(n as f64)), "device_us_per_step": round(us) }));
    }
    if timed {
        println!("    device time per {unit} {:.1} us (kernels one at a time)", per_step(time * 1e6));
    }
    json!({
        "per": unit, "per_step": round(per_step(total as f64)), "steps": steps, "timed": timed,
        "step_graphs": replayed, "top": rows,
    })
}

/// The decode measurement's host↔device transfers per step (its prompts' prefills taken out),
/// printed and as JSON.
fn transfer_report(moved: &llaisys_model::transfers::Transfers, steps: usize) -> serde_json::Value {
    let per_step = |n: u64| n as f64 / steps.max(1) as f64;
    let (up, down) = (per_step(moved.uploads), per_step(moved.readbacks));
    let (up_b, down_b) = (per_step(moved.upload_bytes), per_step(moved.readback_bytes));
    println!("{:<34} {up:>12.1} {:>12} {up_b:>12.0}", "  uploads per decode step (bytes)", "");
    println!("{:<34} {down:>12.1} {:>12} {down_b:>12.0}", "  readbacks per decode step (bytes)", "");
    json!({
        "uploads_per_step": round(up), "upload_bytes_per_step": round(up_b),
        "readbacks_per_step": round(down), "readback_bytes_per_step": round(down_b),
    })
}

/// The CPU's model name, as /proc/cpuinfo gives it.
fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}
