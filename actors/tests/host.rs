//! The host-app API on the tiny fixtures: `Engine::builder()`, chat and completion streams,
//! answers, the offline `Llm`, cancellation by drop, shutdown, several engines, refusals.

use std::time::Duration;

use llaisys_actors::request::FinishReason;
use llaisys_actors::{
    ChatRequest, CompletionRequest, Engine, EngineConfig, EngineError, Event, Output, RequestLimits, StreamExt,
};
use llaisys_tests::{Reference, fixture_dir};

mod common;
use common::wait_idle;

/// How long a test waits for the engine to go idle.
const IDLE: Duration = Duration::from_secs(3);

const TIED: &str = "tiny-tied-f32";
const UNTIED: &str = "tiny-untied-f32";

async fn engine(fixture: &str, config: EngineConfig) -> Engine {
    Engine::builder().model(fixture_dir(fixture)).config(config).build().await.unwrap()
}

fn question() -> ChatRequest {
    ChatRequest::default()
        .system("You are a helpful assistant.")
        .user("What is the capital of France?")
        .max_tokens(24)
        .temperature(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_streams_the_same_answer_it_collects_and_the_offline_llm_agrees() {
    let engine = engine(UNTIED, EngineConfig::default()).await;
    let prepared = engine.prepare_chat(&question()).unwrap();
    let answer = engine.chat(question()).await.unwrap().answer().await;
    let choice = &answer.choices[0];
    assert!(!choice.tokens.is_empty());
    assert_eq!(answer.usage.prompt_tokens, prepared.prompts()[0].len());
    assert_eq!(answer.usage.completion_tokens, choice.tokens.len());

    // Streamed: the tokens and text arrive in order, then one Finished with the same counts.
    let mut stream = engine.chat(question()).await.unwrap();
    assert_eq!(stream.prompts(), prepared.prompts());
    let (mut tokens, mut text, mut finishes) = (Vec::new(), String::new(), Vec::new());
    while let Some(Output { choice, event }) = stream.next().await {
        assert_eq!(choice, 0);
        match event {
            Event::Token { token, text: t, .. } => {
                tokens.push(token);
                text.push_str(&t);
            }
            Event::Finished { reason, text: t, usage, .. } => {
                text.push_str(&t);
                finishes.push((reason, usage.completion_tokens));
            }
        }
    }
    assert_eq!((&tokens, &text), (&choice.tokens, &choice.text));
    assert_eq!(finishes, vec![(choice.finish, choice.tokens.len())]);

    // The blocking offline engine renders, validates and generates identically.
    let mut llm = Engine::builder().model(fixture_dir(UNTIED)).build_offline().unwrap();
    let offline = llm.chat(&[question(), question().max_tokens(3)]).unwrap();
    assert_eq!(offline[0], answer);
    assert_eq!(offline[1].choices[0].tokens, choice.tokens[..3]);
    assert_eq!(offline[1].choices[0].finish, FinishReason::Length);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_take_text_or_ids_with_n_choices_and_logprobs() {
    let engine = engine(UNTIED, EngineConfig::default()).await;
    let p = &Reference::load(UNTIED).prompts[0];
    // Token ids as they are: greedy equals transformers' continuation.
    let request = CompletionRequest::new(p.ids.clone()).max_tokens(p.greedy.len()).temperature(0.0).ignore_eos(true);
    let answer = engine.complete(request).await.unwrap().answer().await;
    assert_eq!(answer.choices[0].tokens, p.greedy);

    // Two prompts, three seeded choices each, two alternatives per token.
    let request = CompletionRequest::batch(vec!["The capital of France is".into(), p.ids.clone().into()])
        .max_tokens(5)
        .n(3)
        .seed(11)
        .logprobs(2);
    let a = engine.complete(request.clone()).await.unwrap().answer().await;
    let b = engine.complete(request).await.unwrap().answer().await;
    assert_eq!(a.choices.len(), 6);
    let tokens = |x: &llaisys_actors::Answer| x.choices.iter().map(|c| c.tokens.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&a), tokens(&b), "same seed, same answer");
    for c in &a.choices {
        assert_eq!(c.logprobs.len(), c.tokens.len());
        assert!(c.logprobs.iter().all(|l| l.top.len() == 2 && l.logprob <= 0.0));
    }
    let first_prompt = engine.tokenizer().unwrap().encode("The capital of France is").unwrap().len();
    assert_eq!(a.usage.prompt_tokens, first_prompt + p.ids.len(), "each prompt counts once");
    assert_eq!(a.usage.completion_tokens, a.choices.iter().map(|c| c.tokens.len()).sum::<usize>());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_stream_mid_generation_frees_its_cells() {
    let config = EngineConfig { prefix_caching: false, ..EngineConfig::default() };
    let engine = engine(UNTIED, config).await;
    let mut stream = engine.chat(question().max_tokens(150).ignore_eos(true)).await.unwrap();
    for _ in 0..3 {
        assert!(matches!(stream.next().await, Some(Output { event: Event::Token { .. }, .. })));
    }
    assert!(engine.stats().await.unwrap().kv_cells_used > 0);
    drop(stream);
    let stats = wait_idle(&engine, IDLE).await;
    assert_eq!((stats.kv_cells_used, stats.finished.abort), (0, 1));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_in_one_process_do_not_interfere_and_shutdown_drains() {
    let (a, b) = (engine(TIED, EngineConfig::default()).await, engine(UNTIED, EngineConfig::default()).await);
    let alone_a = a.chat(question()).await.unwrap().answer().await;
    let alone_b = b.chat(question()).await.unwrap().answer().await;
    // Both at once, several requests each: every answer is what it was alone.
    let runs = (0..3).map(|_| {
        let (a, b) = (a.clone(), b.clone());
        async move {
            let (x, y) = tokio::join!(a.chat(question()), b.chat(question()));
            tokio::join!(x.unwrap().answer(), y.unwrap().answer())
        }
    });
    for (x, y) in futures_util::future::join_all(runs).await {
        assert_eq!(
            (&x.choices[0].tokens, &y.choices[0].tokens),
            (&alone_a.choices[0].tokens, &alone_b.choices[0].tokens)
        );
    }
    // Shutting `a` down drains its running request and leaves `b` serving.
    let running = a.chat(question().max_tokens(40).ignore_eos(true)).await.unwrap();
    let handle = a.clone();
    let shutdown = tokio::spawn(async move { handle.shutdown().await });
    let drained = running.answer().await;
    assert_eq!((drained.choices[0].tokens.len(), drained.choices[0].finish), (40, FinishReason::Length));
    shutdown.await.unwrap();
    assert!(a.chat(question()).await.is_err(), "no new work after shutdown");
    assert_eq!(b.chat(question()).await.unwrap().answer().await.choices, alone_b.choices);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_naming_the_field_and_change_nothing() {
    let limits = RequestLimits { max_prompt_tokens: 100, max_tokens: 64, max_n: 4, ..RequestLimits::default() };
    let engine = Engine::builder().model(fixture_dir(UNTIED)).limits(limits).build().await.unwrap();
    let before = engine.chat(question()).await.unwrap().answer().await;
    let long_prompt = CompletionRequest::new((0..150).collect::<Vec<u32>>());
    let cases: Vec<(Result<_, EngineError>, &str)> = vec![
        (engine.prepare_chat(&ChatRequest::default()), "messages"),
        (engine.prepare_chat(&question().message("robot", "hi")), "messages[2].role"),
        (engine.prepare_chat(&question().max_tokens(0)), "max_tokens"),
        (engine.prepare_chat(&question().max_tokens(65)), "max_tokens"),
        (engine.prepare_chat(&question().n(5)), "n"),
        (engine.prepare_chat(&question().logprobs(21)), "top_logprobs"),
        (engine.prepare_chat(&question().stop("")), "stop"),
        (engine.prepare_completion(&CompletionRequest::new(vec![1, 999_999])), "prompt"),
        (engine.prepare_completion(&CompletionRequest::new("")), "prompt"),
        (engine.prepare_completion(&CompletionRequest::batch(vec![])), "prompt"),
        (engine.prepare_completion(&long_prompt), "prompt"),
    ];
    for (i, (result, param)) in cases.into_iter().enumerate() {
        match result {
            Err(EngineError::Request(e)) => {
                assert_eq!(e.param.as_deref(), Some(param), "case {i}: {e}");
                assert!(!e.message.is_empty());
            }
            other => panic!("case {i}: not refused: {other:?}"),
        }
    }
    let Err(EngineError::Request(e)) = engine.prepare_completion(&long_prompt) else { panic!() };
    assert_eq!(e.code, Some("context_length_exceeded"));
    // Sampling parameters out of range are refused when submitted.
    assert!(
        engine
            .chat(question().options(llaisys_actors::Options { top_p: Some(2.0), ..question().options }))
            .await
            .is_err()
    );
    let after = engine.chat(question()).await.unwrap().answer().await;
    assert_eq!(after.choices, before.choices, "the engine still answers the same");
    assert_eq!(wait_idle(&engine, IDLE).await.running, 0);

    // A model without a chat template takes completions but refuses chats, clearly.
    let model = llaisys_model::load_model(
        None,
        Some(&llaisys_model::ModelSource::Dir(fixture_dir(UNTIED))),
        &Default::default(),
        &llaisys_actors::Device::flex(),
    )
    .unwrap();
    let tokenizer = llaisys_model::Tokenizer::from_dir(&fixture_dir(UNTIED)).unwrap();
    let plain = Engine::start(model, Some(tokenizer), EngineConfig::default()).await.unwrap();
    let Err(EngineError::Request(e)) = plain.chat(question()).await else { panic!("a chat without a template") };
    assert!(e.message.contains("no chat template"), "{e}");
    assert!(plain.complete(CompletionRequest::new("Hello").max_tokens(2)).await.is_ok());
    engine.shutdown().await;
    plain.shutdown().await;
}
