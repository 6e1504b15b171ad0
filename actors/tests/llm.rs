//! Offline generation through the engine's step loop on the tiny fixtures: continuous
//! batching, chunked prefill and preemption must not change results; sampling and stop strings
//! behave as specified.

use llaisys_actors::request::FinishReason;
use llaisys_actors::{EngineConfig, GenerateParams, Llm};
use llaisys_model::generate::greedy;
use llaisys_model::{Context, Device, LoadOptions, ModelSource, SamplingParams, Tokenizer, load_model};
use llaisys_tests::{Reference, fixture_dir};

const FIXTURE: &str = "tiny-untied-f32";

fn llm(config: EngineConfig) -> Llm {
    let dir = fixture_dir(FIXTURE);
    let model =
        load_model(None, Some(&ModelSource::Dir(dir.clone())), &LoadOptions::default(), &Device::flex()).unwrap();
    Llm::new(model, Some(Tokenizer::from_dir(&dir).unwrap()), config)
}

/// The core's own greedy output for one prompt (a fresh context, the prompt in one batch).
fn core_greedy(prompt: &[u32], n: usize) -> Vec<u32> {
    let model =
        load_model(None, Some(&ModelSource::Dir(fixture_dir(FIXTURE))), &LoadOptions::default(), &Device::flex())
            .unwrap();
    greedy(&mut Context::new(model, 256), 0, prompt, n, &[]).unwrap().tokens
}

fn greedy_params(max_tokens: usize) -> GenerateParams {
    GenerateParams { max_tokens, ignore_eos: true, ..GenerateParams::default() }
}

/// Eight prompts of different lengths: the three reference prompts and prefixes of them.
fn eight_prompts() -> Vec<Vec<u32>> {
    let r = Reference::load(FIXTURE);
    let mut prompts: Vec<Vec<u32>> = r.prompts.iter().map(|p| p.ids.clone()).collect();
    for (k, len) in [(0, 3), (1, 11), (2, 17), (1, 1), (0, 7)] {
        prompts.push(r.prompts[k].ids[..len].to_vec());
    }
    prompts
}

#[test]
fn eight_concurrent_requests_match_the_core_and_transformers() {
    let reference = Reference::load(FIXTURE);
    let prompts = eight_prompts();
    // A small token budget forces chunked prefill mixed with decoding.
    let mut engine = llm(EngineConfig {
        kv_capacity: 512,
        max_seqs_per_step: 8,
        max_tokens_per_step: 12,
        ..EngineConfig::default()
    });
    let out = engine.generate(&prompts, &greedy_params(20)).unwrap();
    for (i, (prompt, c)) in prompts.iter().zip(&out).enumerate() {
        assert_eq!(c.tokens, core_greedy(prompt, 20), "prompt {i}: engine vs core");
        assert_eq!(c.finish, FinishReason::Length);
        if let Some(r) = reference.prompts.get(i) {
            assert_eq!(c.tokens, r.greedy, "prompt {i}: engine vs transformers");
        }
    }
    let single = engine.generate(&prompts[..1], &greedy_params(20)).unwrap();
    assert_eq!(single[0].tokens, reference.prompts[0].greedy, "one request alone");
}

#[test]
fn a_tiny_cache_preempts_and_every_request_still_completes_correctly() {
    let prompts = eight_prompts();
    let mut engine =
        llm(EngineConfig { kv_capacity: 64, max_seqs_per_step: 8, max_tokens_per_step: 32, ..EngineConfig::default() });
    let out = engine.generate(&prompts, &greedy_params(12)).unwrap();
    assert!(engine.scheduler().preemptions > 0, "64 cells cannot hold 8 requests at once");
    for (i, (prompt, c)) in prompts.iter().zip(&out).enumerate() {
        assert_eq!(c.tokens, core_greedy(prompt, 12), "prompt {i}");
    }
}

#[test]
fn a_prompt_that_can_never_fit_is_rejected() {
    let mut engine = llm(EngineConfig { kv_capacity: 8, ..EngineConfig::default() });
    let err = engine.generate(&[vec![1, 2, 3], (1..=20).collect()], &greedy_params(4)).unwrap_err();
    assert!(err.to_string().starts_with("prompt 1: the prompt has 20 tokens"), "{err}");
}

#[test]
fn top_k_one_is_greedy_and_a_seed_reproduces_samples() {
    let prompts = eight_prompts();
    let mut engine = llm(EngineConfig::default());
    let greedy_out = engine.generate(&prompts, &greedy_params(10)).unwrap();
    let top1 = GenerateParams {
        sampling: SamplingParams { temperature: 1.3, top_k: Some(1), seed: Some(1), ..SamplingParams::default() },
        ..greedy_params(10)
    };
    assert_eq!(engine.generate(&prompts, &top1).unwrap(), greedy_out);
    let sampled = |seed| GenerateParams {
        sampling: SamplingParams { temperature: 1.0, seed: Some(seed), ..SamplingParams::default() },
        ..greedy_params(10)
    };
    let a = engine.generate(&prompts, &sampled(11)).unwrap();
    assert_eq!(engine.generate(&prompts, &sampled(11)).unwrap(), a, "same seed, same output");
    assert_ne!(engine.generate(&prompts, &sampled(12)).unwrap(), a, "another seed, another output");
}

#[test]
fn logit_bias_forces_a_token() {
    // The mock model's logits lie in [0, 10], like a real model's; the fixtures' are scaled up
    // to ~150 on purpose (clear greedy margins), where +100 is not exclusive.
    let model = load_model(Some("mock"), None, &LoadOptions::default(), &Device::flex()).unwrap();
    let mut engine = Llm::new(model, None, EngineConfig::default());
    let params = GenerateParams {
        sampling: SamplingParams {
            logit_bias: vec![(42, 100.0)],
            temperature: 0.8,
            seed: Some(3),
            ..SamplingParams::default()
        },
        ..greedy_params(5)
    };
    let out = engine.generate(&[vec![1, 2, 3], vec![9, 8]], &params).unwrap();
    assert!(out.iter().all(|c| c.tokens == vec![42; 5] && c.text.is_none()), "{out:?}");
}

#[test]
fn a_stop_string_split_across_tokens_is_not_emitted() {
    let reference = Reference::load(FIXTURE);
    let p = &reference.prompts[1];
    let tokenizer = Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap();
    // The greedy text begins with two tokens; a stop string made of the end of the first and
    // the start of the second spans the token boundary.
    let first = tokenizer.decode(&p.greedy[..1], true).unwrap();
    let second = tokenizer.decode(&p.greedy[1..2], true).unwrap();
    assert!(first.len() >= 2 && second.len() >= 2, "{first:?} {second:?}");
    let stop = format!("{}{}", &first[first.len() - 1..], &second[..2]);
    let mut engine = llm(EngineConfig::default());
    let params = GenerateParams { stop: vec![stop.clone()], ..greedy_params(20) };
    let out = engine.generate(std::slice::from_ref(&p.ids), &params).unwrap();
    assert_eq!(out[0].finish, FinishReason::Stop);
    assert_eq!(out[0].text.as_deref(), Some(&first[..first.len() - 1]), "text ends before {stop:?}");
}

#[test]
fn eos_ends_a_request_unless_ignored() {
    // The second reference prompt's greedy continuation contains this fixture's eos.
    let reference = Reference::load(FIXTURE);
    let p = &reference.prompts[1];
    let tokenizer = Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap();
    let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
    let at = p.greedy.iter().position(|t| *t == eos).expect("eos in the reference");
    let mut engine = llm(EngineConfig::default());
    let out = engine
        .generate(std::slice::from_ref(&p.ids), &GenerateParams { max_tokens: 20, ..GenerateParams::default() })
        .unwrap();
    assert_eq!((out[0].tokens.clone(), out[0].finish), (p.greedy[..=at].to_vec(), FinishReason::Stop));
    let expected = tokenizer.decode(&p.greedy[..at], true).unwrap();
    assert_eq!(out[0].text.as_deref(), Some(expected.as_str()), "no special tokens in the text");
}

#[test]
fn a_request_sharing_a_prefix_reuses_its_cells_and_gives_the_same_output() {
    let reference = Reference::load(FIXTURE);
    let p = &reference.prompts[1];
    let mut engine = llm(EngineConfig::default());
    let first = engine.generate(std::slice::from_ref(&p.ids), &greedy_params(20)).unwrap();
    assert_eq!(first[0].tokens, p.greedy);
    // The same code prompt with a different ending: its first 20 tokens are cached.
    let mut second = p.ids[..20].to_vec();
    second.extend_from_slice(&reference.prompts[0].ids[..4]);
    let hits_before = engine.scheduler().prefix_hits;
    let out = engine.generate(std::slice::from_ref(&second), &greedy_params(12)).unwrap();
    assert_eq!(engine.scheduler().prefix_hits - hits_before, 20, "only the new 4 tokens were computed");
    assert_eq!(out[0].tokens, core_greedy(&second, 12), "output unchanged by the reuse");
}

/// Prompt log-probabilities (`Options::prompt_logprobs`): each prompt's, from its second token
/// on, the same whether it runs alone in one pass or with seven others in a small cache that
/// chunks its prefill and preempts it (its prompt computed again, its figures given once).
#[test]
fn prompt_logprobs_survive_chunking_and_preemption() {
    use llaisys_actors::{CompletionRequest, Options, Prompt};
    let prompts = eight_prompts();
    let options = Options {
        max_tokens: Some(12),
        temperature: Some(0.0),
        ignore_eos: true,
        prompt_logprobs: Some(2),
        ..Options::default()
    };
    let request = |ps: &[Vec<u32>]| {
        CompletionRequest::batch(ps.iter().cloned().map(Prompt::from).collect()).options(options.clone())
    };
    let mut alone = llm(EngineConfig { kv_capacity: 512, ..EngineConfig::default() });
    let mut squeezed =
        llm(EngineConfig { kv_capacity: 64, max_seqs_per_step: 8, max_tokens_per_step: 12, ..EngineConfig::default() });
    let together = squeezed.complete(&[request(&prompts)]).unwrap().remove(0);
    assert!(squeezed.scheduler().preemptions > 0, "64 cells cannot hold 8 requests at once");
    for (i, (prompt, c)) in prompts.iter().zip(&together.choices).enumerate() {
        let one = alone.complete(&[request(std::slice::from_ref(prompt))]).unwrap().remove(0);
        let want = &one.choices[0].prompt_logprobs;
        assert_eq!(want.len(), prompt.len() - 1, "prompt {i}");
        assert_eq!(want.iter().map(|t| t.token).collect::<Vec<_>>(), prompt[1..], "prompt {i}");
        assert_eq!(c.prompt_logprobs.len(), want.len(), "prompt {i}");
        for (got, want) in c.prompt_logprobs.iter().zip(want) {
            // The fixture's logits reach 100s: a batch's rounding moves them by 1e-5 of that.
            let tolerance = 1e-3 + 2e-5 * want.logprob.abs();
            assert!((got.logprob - want.logprob).abs() < tolerance, "prompt {i}: {got:?} against {want:?}");
            assert_eq!(got.top.len(), 2);
            assert_eq!(
                got.top.iter().map(|a| a.0).collect::<Vec<_>>(),
                want.top.iter().map(|a| a.0).collect::<Vec<_>>()
            );
        }
        assert!(want.iter().all(|t| t.logprob <= t.top[0].1 + 1e-6 && t.logprob < 0.0), "prompt {i}: {want:?}");
    }
    let plain = Options { prompt_logprobs: None, ..options.clone() };
    let without = alone.complete(&[CompletionRequest::new(Prompt::from(prompts[0].clone())).options(plain)]).unwrap();
    assert!(without[0].choices[0].prompt_logprobs.is_empty(), "only where asked");
}
