//! Speculative decoding end to end: the tokens are the ones decoding without it produces, the
//! KV cache holds exactly the accepted tokens after every step, and sampling keeps its
//! distribution.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use llaisys_actors::request::FinishReason;
use llaisys_actors::scheduler::{Scheduler, Sequence};
use llaisys_actors::speculative::{DraftSlot, NgramProposer, Proposer, SpeculativeConfig};
use llaisys_actors::worker::{Executor, Lane, outcomes};
use llaisys_actors::{Engine, EngineConfig, Event, GenerateParams, GenerateRequest, Llm};
use llaisys_model::batch::ValidBatch;
use llaisys_model::kv::{KvLayout, Placement};
use llaisys_model::{
    Context, DecodeError, Device, KvCache, LanguageModel, LoadError, LoadOptions, ModelInfo, ModelSource, Pos, Sampler,
    SamplingParams, SeqId, Tensor, TensorData, Tokenizer, load_model,
};
use llaisys_tests::{Reference, fixture_dir};

const FIXTURE: &str = "tiny-untied-f32";

fn model() -> Box<dyn LanguageModel> {
    load_model(None, Some(&ModelSource::Dir(fixture_dir(FIXTURE))), &LoadOptions::default(), &Device::flex()).unwrap()
}

/// Proposals of the most allowed length every step (`adaptive` off): on this tiny model a step
/// takes microseconds, so a learnt step cost is the machine's jitter and could turn speculation
/// off under a loaded test run (the policy has its own tests in the scheduler's).
fn config(speculate: bool) -> EngineConfig {
    let speculative =
        SpeculativeConfig { default_on: speculate, ngram_min: 1, adaptive: false, ..SpeculativeConfig::default() };
    EngineConfig {
        kv_capacity: 1024,
        max_seqs_per_step: 8,
        max_tokens_per_step: 64,
        speculative,
        ..EngineConfig::default()
    }
}

fn llm(speculate: bool) -> Llm {
    Llm::new(model(), Some(Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap()), config(speculate))
}

/// Eight prompts: the reference prompts, prefixes of them, and prompts that repeat themselves
/// (where prompt lookup finds much to propose).
fn prompts() -> Vec<Vec<u32>> {
    let r = Reference::load(FIXTURE);
    let mut prompts: Vec<Vec<u32>> = r.prompts.iter().map(|p| p.ids.clone()).collect();
    prompts.push(r.prompts[0].ids[..5].to_vec());
    prompts.push(r.prompts[1].ids[..9].to_vec());
    for k in 0..3 {
        let ids = &r.prompts[k].ids;
        prompts.push(ids.iter().chain(ids).chain(&ids[..ids.len() / 2]).copied().collect());
    }
    prompts
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams { max_tokens, ignore_eos: true, ..GenerateParams::default() }
}

#[test]
fn greedy_output_is_the_same_with_and_without_speculation() {
    let prompts = prompts();
    let plain = llm(false).generate(&prompts, &greedy(40)).unwrap();
    let mut spec = llm(true);
    let fast = spec.generate(&prompts, &greedy(40)).unwrap();
    for (i, (a, b)) in plain.iter().zip(&fast).enumerate() {
        assert_eq!(a.tokens, b.tokens, "prompt {i}");
        assert_eq!((&a.text, a.finish), (&b.text, b.finish), "prompt {i}");
    }
    let s = spec.scheduler();
    assert!(s.accepted > 20 && s.proposed > s.accepted, "proposed {}, accepted {}", s.proposed, s.accepted);
}

/// The tokens and finish of a stream.
async fn collect(mut stream: llaisys_actors::EventStream) -> (Vec<u32>, FinishReason) {
    let mut tokens = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Event::Token { token, .. } => tokens.push(token),
            Event::Finished { reason, usage, .. } => {
                assert_eq!(usage.completion_tokens, tokens.len());
                return (tokens, reason);
            }
        }
    }
    panic!("no finish")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_requests_some_speculating_stream_the_tokens_of_plain_decoding() {
    let prompts = prompts();
    let plain = llm(false).generate(&prompts, &greedy(40)).unwrap();
    let tokenizer = Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap();
    let engine = Engine::start(model(), Some(tokenizer), config(false)).await.unwrap();
    let mut streams = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let params = GenerateParams { speculative: Some(i % 2 == 0), ..greedy(40) };
        streams.push(engine.generate(GenerateRequest::new(prompt.clone(), params)).await.unwrap());
    }
    for (i, (stream, want)) in streams.into_iter().zip(&plain).enumerate() {
        let (tokens, reason) = collect(stream).await;
        assert_eq!((tokens, reason), (want.tokens.clone(), FinishReason::Length), "request {i}");
    }
    let stats = engine.stats().await.unwrap();
    assert_eq!(stats.speculative.proposer, "ngram");
    assert!(stats.speculative.accepted > 0, "{:?}", stats.speculative);
    assert_eq!(stats.kv_cells_used, stats.kv_cells_cached, "only cached prefixes hold cells");
    engine.shutdown().await;
}

#[test]
fn stop_strings_and_max_tokens_inside_an_accepted_run_end_where_they_would() {
    let prompts = prompts();
    let plain = llm(false).generate(&prompts, &greedy(40)).unwrap();
    // Each length from 1 to 12 tokens ends inside runs of accepted proposals somewhere.
    for max_tokens in 1..=12 {
        let out = llm(true).generate(&prompts, &greedy(max_tokens)).unwrap();
        for (a, b) in plain.iter().zip(&out) {
            assert_eq!(&a.tokens[..max_tokens], &b.tokens[..], "max_tokens {max_tokens}");
            assert_eq!(b.finish, FinishReason::Length);
        }
    }
    // A stop string from the middle of each long output.
    for (i, prompt) in prompts.iter().enumerate().skip(5) {
        let text = plain[i].text.clone().unwrap();
        let stop: String = text.chars().skip(text.chars().count() / 2).take(3).collect();
        let params = GenerateParams { stop: vec![stop.clone()], ..greedy(40) };
        let a = llm(false).generate(std::slice::from_ref(prompt), &params).unwrap().remove(0);
        let b = llm(true).generate(std::slice::from_ref(prompt), &params).unwrap().remove(0);
        assert_eq!(a.finish, FinishReason::Stop, "prompt {i}: {stop:?} in {text:?}");
        assert_eq!((a.tokens, a.text, a.finish), (b.tokens, b.text, b.finish), "prompt {i}");
    }
}

/// A model that fails every forward pass while `fail` is set.
struct Flaky {
    inner: Box<dyn LanguageModel>,
    fail: Arc<AtomicBool>,
}

impl LanguageModel for Flaky {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }
    fn kv_layout(&self) -> KvLayout {
        self.inner.kv_layout()
    }
    fn device(&self) -> &Device {
        self.inner.device()
    }
    fn forward(
        &self,
        batch: &ValidBatch<'_>,
        placement: &Placement,
        cache: &mut KvCache,
        abort: &dyn Fn() -> bool,
    ) -> Result<Tensor<2>, DecodeError> {
        if self.fail.load(Ordering::Relaxed) {
            return Err(DecodeError::InvalidInput("injected failure".into()));
        }
        self.inner.forward(batch, placement, cache, abort)
    }
    fn shift_keys(&self, cache: &mut KvCache, shifts: &[Pos]) {
        self.inner.shift_keys(cache, shifts)
    }
    fn replace_weight(&mut self, name: &str, data: TensorData) -> Result<(), LoadError> {
        self.inner.replace_weight(name, data)
    }
}

/// Positions of sequence `seq` in the cache, as the debug dump lists them.
fn positions(ctx: &Context, seq: SeqId) -> Vec<Pos> {
    let dump = ctx.kv().dump();
    let mut pos: Vec<Pos> = dump
        .lines()
        .skip(1)
        .filter_map(|line| {
            let (_, rest) = line.split_once(" → (")?;
            let (seqs, pos) = rest.trim_end_matches(')').rsplit_once(", ")?;
            seqs.contains(&format!("{seq}")).then(|| pos.parse().unwrap())
        })
        .collect();
    pos.sort_unstable();
    pos
}

#[test]
fn after_every_step_the_cache_holds_exactly_the_accepted_tokens() {
    let prompts = prompts();
    let plain = llm(false).generate(&prompts, &greedy(30)).unwrap();
    let fail = Arc::new(AtomicBool::new(false));
    let flaky = Flaky { inner: model(), fail: fail.clone() };
    let cfg = EngineConfig { prefix_caching: false, ..config(true) };
    let mut executor =
        Executor::new(Context::new(Box::new(flaky), cfg.kv_capacity)).with_proposer(Box::new(NgramProposer::new(1, 4)));
    let mut scheduler = Scheduler::new(cfg, 1 << 20);
    for (id, prompt) in prompts.iter().enumerate() {
        let params = Arc::new(GenerateParams { max_tokens: 30, ..GenerateParams::default() });
        scheduler.add(Sequence::new(id as u64, prompt.clone(), params.clone()).speculating(true));
        let sampler = Sampler::new(SamplingParams::default(), prompt);
        executor.add_request(id as u64, Lane::new(sampler, params, Some(prompt.clone())));
    }
    let cancelled = 3u64;
    let (mut steps, mut finished) = (0, HashMap::new());
    while let Some(plan) = scheduler.schedule() {
        steps += 1;
        if steps == 6 {
            // A failing step changes nothing: the cache is as before it, proposals and all.
            let before = executor.context().kv().dump();
            fail.store(true, Ordering::Relaxed);
            assert!(executor.execute(&plan).is_err());
            fail.store(false, Ordering::Relaxed);
            assert_eq!(executor.context().kv().dump(), before);
        }
        let outputs = executor.execute(&plan).unwrap();
        if steps == 8 {
            // Cancelled while its step ran: its cells are freed at the next step.
            finished.insert(cancelled, scheduler.finish_request(cancelled, FinishReason::Abort).unwrap());
        }
        for f in scheduler.postprocess(&plan, &outcomes(&outputs)) {
            executor.remove_request(f.id);
            finished.insert(f.id, f);
        }
        for item in &plan.items {
            let Some((prompt, generated)) = scheduler.tokens_of(item.id) else { continue };
            if generated.is_empty() {
                continue; // still prefilling
            }
            // Every token but the last sampled one (the next step's input) has its cell.
            let held = (prompt.len() + generated.len() - 1) as Pos;
            assert_eq!(positions(executor.context(), item.seq), (0..held).collect::<Vec<_>>(), "step {steps}");
        }
        assert!(executor.context().kv().cells().check_invariants());
    }
    assert!(scheduler.accepted > 0);
    assert_eq!(executor.context().kv().used(), 0, "cancelled and finished sequences freed their cells");
    for (id, want) in plain.iter().enumerate() {
        let got = &finished[&(id as u64)];
        if id as u64 == cancelled {
            assert_eq!(got.reason, FinishReason::Abort);
            assert_eq!(got.output[..], want.tokens[..got.output.len()]);
        } else {
            assert_eq!(got.output, want.tokens, "request {id}");
        }
    }
}

/// Proposes the model's greedy continuation of the prompt: likely tokens, which sampling at
/// temperature 3 accepts often but not always.
struct Oracle {
    prompt_len: usize,
    path: Vec<u32>,
}

impl Proposer for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }
    fn propose(&mut self, slots: &mut [DraftSlot<'_>]) {
        for slot in slots {
            let at = slot.history.len() - self.prompt_len;
            slot.drafts = self.path.iter().skip(at).take(slot.max).copied().collect();
        }
    }
    fn forget(&mut self, _: u64) {}
}

#[test]
fn sampled_tokens_keep_their_distribution_under_speculation() {
    // The distribution of the fourth generated token over many seeds at temperature 3, with
    // and without proposals of the greedy path.
    let prompt = Reference::load(FIXTURE).prompts[0].ids.clone();
    let path = llm(false).generate(std::slice::from_ref(&prompt), &greedy(8)).unwrap().remove(0).tokens;
    const SEEDS: u64 = 500;
    let cfg = config(true);
    let histogram = |speculate: bool| {
        let proposer: Box<dyn Proposer> = Box::new(Oracle { prompt_len: prompt.len(), path: path.clone() });
        let mut executor = Executor::new(Context::new(model(), cfg.kv_capacity)).with_proposer(proposer);
        let mut scheduler = Scheduler::new(cfg, 1 << 20);
        let mut counts: HashMap<u32, f64> = HashMap::new();
        for seed in 0..SEEDS {
            let params = Arc::new(GenerateParams { max_tokens: 4, ..GenerateParams::default() });
            scheduler.add(Sequence::new(seed, prompt.clone(), params.clone()).speculating(speculate));
            let sampling = SamplingParams { temperature: 3.0, seed: Some(seed), ..SamplingParams::default() };
            let lane = Lane::new(Sampler::new(sampling, &prompt), params, speculate.then(|| prompt.clone()));
            executor.add_request(seed, lane);
            while let Some(plan) = scheduler.schedule() {
                let outputs = executor.execute(&plan).unwrap();
                for f in scheduler.postprocess(&plan, &outcomes(&outputs)) {
                    executor.remove_request(f.id);
                    *counts.entry(f.output[3]).or_default() += 1.0 / SEEDS as f64;
                }
            }
        }
        (counts, scheduler.proposed, scheduler.accepted)
    };
    let (plain, _, _) = histogram(false);
    let (spec, proposed, accepted) = histogram(true);
    assert!(accepted > 50 && proposed - accepted > 50, "proposed {proposed}, accepted {accepted}");
    assert!(plain.len() > 3, "temperature 3 spreads the mass: {plain:?}");
    // Total variation distance between the two empirical distributions. A wrong acceptance
    // rule (say, keeping every proposal) puts the greedy path's token at position 3 far more
    // often than sampling does, which moves the distance by much more than 0.1.
    let tokens: std::collections::HashSet<u32> = plain.keys().chain(spec.keys()).copied().collect();
    let tv: f64 =
        tokens.iter().map(|t| (plain.get(t).unwrap_or(&0.0) - spec.get(t).unwrap_or(&0.0)).abs()).sum::<f64>() / 2.0;
    assert!(tv < 0.1, "total variation {tv}: {plain:?} against {spec:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_model_proposes_and_the_output_is_unchanged() {
    let prompts = prompts();
    let plain = llm(false).generate(&prompts, &greedy(24)).unwrap();
    // The target as its own draft (every greedy proposal is accepted), and another model of the
    // same vocabulary as the draft (most are rejected): the tokens are the same either way.
    for (draft, all_accepted) in [(FIXTURE, true), ("tiny-tied-f32", false)] {
        let engine = Engine::builder()
            .model(fixture_dir(FIXTURE))
            .draft_model(fixture_dir(draft))
            .config(config(true))
            .build()
            .await
            .unwrap();
        let mut streams = Vec::new();
        for prompt in &prompts {
            streams.push(engine.generate(GenerateRequest::new(prompt.clone(), greedy(24))).await.unwrap());
        }
        for (i, (stream, want)) in streams.into_iter().zip(&plain).enumerate() {
            assert_eq!(collect(stream).await, (want.tokens.clone(), FinishReason::Length), "{draft}: request {i}");
        }
        let s = engine.stats().await.unwrap().speculative;
        assert_eq!(s.proposer, "draft");
        assert!(s.proposed > 0, "{s:?}");
        assert_eq!(s.accepted == s.proposed, all_accepted, "{draft}: {s:?}");
        engine.shutdown().await;
    }
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let dir = std::env::temp_dir().join(format!("llaisys-draft-vocab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"] {
        std::fs::copy(fixture_dir("tiny-tied-f32").join(f), dir.join(f)).unwrap();
    }
    // One added token more than the target has.
    let tokenizer = std::fs::read_to_string(fixture_dir("tiny-tied-f32").join("tokenizer.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&tokenizer).unwrap();
    let added = json["added_tokens"].as_array_mut().unwrap();
    let id = added.iter().filter_map(|t| t["id"].as_u64()).max().unwrap() + 1;
    let mut token = added[0].clone();
    token["id"] = id.into();
    token["content"] = "<|draft_only|>".into();
    added.push(token);
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    let err = Engine::builder().model(fixture_dir(FIXTURE)).draft_model(&dir).build_offline().err().unwrap();
    let msg = err.to_string();
    assert!(msg.contains("vocabulary differs") && msg.contains(&format!("{id} tokens against {}", id + 1)), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}
