//! A reasoning model's thinking on the tiny Qwen3 fixture (its chat template and `<think>`
//! tokens): split from the answer by token id as it streams, before stop strings and tool calls,
//! byte-identical streamed and gathered; a template that opens the think block starts the output
//! inside it, and `enable_thinking: false` renders Qwen3's empty block. Mistral's `[THINK]` tags on
//! tiny-mixtral-f32 (Mistral Small 3.x's control tokens); SmolLM3's `/think` and `/no_think` modes
//! on tiny-smollm3-f32 (its chat template as llama.cpp keeps it); GLM-4.5's `\n<think>` on
//! tiny-glm4moe-f32.

use llaisys_actors::request::{
    FinishReason, ReasoningParsing, ReasoningTags, TextStream, ToolCallOut, ToolCallTags, ToolParsing,
};
use llaisys_actors::{ChatRequest, Constraint, Engine, Event, Output, StreamExt};
use llaisys_model::Tokenizer;
use llaisys_tests::{FixtureCopy, Reference, fixture_dir};

const QWEN3: &str = "tiny-qwen3-f32";

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixture_dir(QWEN3)).unwrap()
}

fn tags(t: &Tokenizer) -> ReasoningTags {
    ReasoningTags { open: t.token_to_id("<think>").unwrap(), close: t.token_to_id("</think>").unwrap() }
}

/// Streams `ids`; returns (answer text, reasoning, tool-call arguments).
fn stream(t: &Tokenizer, ids: &[u32], starts_open: bool, stop: &str) -> (String, String, String) {
    let tool_tags = ToolCallTags::pair(t.token_to_id("<tool_call>").unwrap(), t.token_to_id("</tool_call>").unwrap());
    let mut s = TextStream::new([stop.to_string()])
        .with_reasoning(Some(ReasoningParsing { tags: tags(t), starts_open }))
        .with_tool_calls(Some(&ToolParsing::json(tool_tags, true)));
    let (mut text, mut reasoning, mut args) = (String::new(), String::new(), String::new());
    for &id in ids {
        let piece = s.push(t, id).unwrap();
        text.push_str(&piece.text);
        reasoning.push_str(&piece.reasoning);
        for call in piece.tool_calls {
            args.push_str(&call.arguments);
        }
    }
    let tail = s.finish(t).unwrap();
    text.push_str(&tail.text);
    reasoning.push_str(&tail.reasoning);
    (text, reasoning, args)
}

#[test]
fn thinking_splits_off_before_stop_strings_and_tool_calls() {
    let t = tokenizer();
    let output = "<think>\nThe user greets; call f, then stop.\n</think>\n\nHello! <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
    let ids = t.encode(output).unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == tags(&t).open).count(), 1, "<think> is one token");
    let (text, reasoning, args) = stream(&t, &ids, false, "stop");
    // The stop string appears only in the thinking, which it does not cut.
    assert_eq!(reasoning, "The user greets; call f, then stop.");
    assert_eq!(text.trim_end(), "Hello!");
    assert_eq!(args, "{\"x\": 1}");
    // A stop string in the answer cuts the answer only.
    let (text, reasoning, _) = stream(&t, &ids, false, "llo");
    assert_eq!((text.as_str(), reasoning.as_str()), ("He", "The user greets; call f, then stop."));
}

#[test]
fn an_output_that_never_closes_its_thinking_is_all_reasoning() {
    let t = tokenizer();
    let ids = t.encode("\nStill thinking about 你好 and more  ").unwrap();
    let (text, reasoning, _) = stream(&t, &ids, true, "zz");
    assert_eq!((text.as_str(), reasoning.as_str()), ("", "Still thinking about 你好 and more"));
    let (text, reasoning, _) = stream(&t, &ids, false, "zz");
    assert_eq!((text.as_str(), reasoning.as_str()), ("\nStill thinking about 你好 and more  ", ""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_opens_the_thinking_streams_reasoning_identical_to_the_answer() {
    let dir = FixtureCopy::thinking(QWEN3);
    let engine = Engine::builder().model(dir.path()).build().await.unwrap();
    let request = || ChatRequest::default().user("Hi").max_tokens(12).ignore_eos(true).temperature(0.0);
    let answer = engine.chat(request()).await.unwrap().answer().await;
    let choice = &answer.choices[0];
    assert_eq!(choice.finish, FinishReason::Length);
    assert_eq!(choice.text, "", "the thinking never closed: no answer");
    let t = tokenizer();
    let want = t.decode(&choice.tokens, true).unwrap();
    assert_eq!(choice.reasoning, want.trim(), "every token was reasoning");
    assert!(!choice.reasoning.is_empty());
    let mut streamed = String::new();
    let mut generation = engine.chat(request()).await.unwrap();
    while let Some(Output { event, .. }) = generation.next().await {
        match event {
            Event::Token { text, reasoning, .. } | Event::Finished { text, reasoning, .. } => {
                assert_eq!(text, "");
                streamed.push_str(&reasoning);
            }
        }
    }
    assert_eq!(streamed, choice.reasoning, "streamed and gathered reasoning differ");
}

/// Magistral's and Ministral 3's thinking is `[THINK]` ... `[/THINK]` (control tokens of their
/// vocabulary): a prompt that opens it (tiny-mixtral-f32, Mistral Small 3.x's control tokens, its
/// template's generation prompt edited to open it) makes the output reasoning until the model
/// closes it, the answer content after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_think_tags_split_the_reasoning_from_the_answer() {
    let dir = FixtureCopy::template_edited("tiny-mixtral-f32", 4096, "{{- '[/INST]' }}", "{{- '[/INST][THINK]' }}");
    let engine = Engine::builder().model(dir.path()).build().await.unwrap();
    let t = engine.tokenizer().unwrap();
    let request = || ChatRequest::default().user("Hi").max_tokens(12).ignore_eos(true).temperature(0.0);
    let answer = engine.chat(request()).await.unwrap().answer().await;
    let choice = &answer.choices[0];
    assert_eq!((choice.finish, choice.text.as_str()), (FinishReason::Length, ""), "the thinking never closed");
    assert_eq!(choice.reasoning, t.decode(&choice.tokens, true).unwrap().trim());
    assert!(!choice.reasoning.is_empty());
    engine.shutdown().await;

    // Thinking the model opens and closes itself, then an answer and Mistral Small 3.2's call.
    let [open, close, calls, args] =
        ["[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]"].map(|s| t.token_to_id(s).unwrap());
    let output = "[THINK]Plan: greet, then call f.[/THINK]Sure.[TOOL_CALLS]f[ARGS]{\"x\": 1}";
    let ids = t.encode(output).unwrap();
    let tools = ToolCallTags { args: Some(args), ..ToolCallTags::array(calls) };
    let mut s = TextStream::new(Vec::<String>::new())
        .with_reasoning(Some(ReasoningParsing::after(ReasoningTags { open, close }, &[])))
        .with_tool_calls(Some(&ToolParsing::json(tools, true)));
    let (mut text, mut reasoning, mut called) = (String::new(), String::new(), Vec::new());
    for &id in &ids {
        let piece = s.push(t, id).unwrap();
        text.push_str(&piece.text);
        reasoning.push_str(&piece.reasoning);
        piece.tool_calls.iter().for_each(|d| ToolCallOut::gather(&mut called, d));
    }
    assert_eq!((reasoning.trim(), text.trim()), ("Plan: greet, then call f.", "Sure."));
    assert_eq!((called.len(), called[0].name.as_str(), called[0].arguments.as_str()), (1, "f", "{\"x\": 1}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_thinking_false_renders_the_empty_block_and_the_answer_is_content() {
    let engine = Engine::builder().model(fixture_dir(QWEN3)).build().await.unwrap();
    let t = tokenizer();
    let plain = engine.frontend().chat(&ChatRequest::default().user("Hi")).unwrap();
    let off = ChatRequest::default().user("Hi").template_kwarg("enable_thinking", false.into());
    let valid = engine.frontend().chat(&off).unwrap();
    let (plain, off_ids) = (&plain.prompts()[0], &valid.prompts()[0]);
    assert_eq!(&off_ids[..plain.len()], &plain[..]);
    assert_eq!(t.decode(&off_ids[plain.len()..], false).unwrap(), "<think>\n\n</think>\n\n");
    assert!(!ReasoningParsing::after(tags(&t), off_ids).starts_open);
    // The fixture's greedy answer is content, not reasoning.
    let p = &Reference::load(QWEN3).prompts[0];
    assert!(!p.greedy.contains(&tags(&t).open), "the fixture never thinks");
    let answer = engine.chat(off.max_tokens(8).ignore_eos(true).temperature(0.0)).await.unwrap().answer().await;
    assert_eq!(answer.choices[0].reasoning, "");
    assert!(!answer.choices[0].text.is_empty());
    // A template variable cannot replace what the server gives the template.
    let bad = ChatRequest::default().user("Hi").template_kwarg("messages", serde_json::json!([]));
    let err = engine.frontend().chat(&bad).unwrap_err().to_string();
    assert!(err.contains("chat_template_kwargs"), "{err}");
}

/// SmolLM3 thinks unless told not to: its system header says `/think` by default, and its
/// prompt then leaves the think block to the model; `enable_thinking: false` or `/no_think` in
/// the system message says `/no_think` and closes an empty block in the prompt, so the output
/// is the answer. Its think tags are its vocabulary's tokens, split off by id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm3_thinks_unless_its_mode_says_no_think() {
    // Its default system prompt is longer than the fixture's 256 positions in the tiny vocabulary.
    let fixture = FixtureCopy::long_context("tiny-smollm3-f32", 2048);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let t = Tokenizer::from_dir(fixture.path()).unwrap();
    let tags = ReasoningTags { open: t.token_to_id("<think>").unwrap(), close: t.token_to_id("</think>").unwrap() };
    let rendered = |chat: &ChatRequest| {
        let valid = engine.frontend().chat(chat).unwrap();
        let prompt = valid.prompts()[0].clone();
        (t.decode(&prompt, false).unwrap(), valid.params().reasoning.is_some(), prompt)
    };
    let (text, split, prompt) = rendered(&ChatRequest::default().user("Hi"));
    assert!(text.contains("Reasoning Mode: /think") && text.ends_with("<|im_start|>assistant\n"), "{text}");
    assert!(split && !ReasoningParsing::after(tags, &prompt).starts_open);
    for off in [
        ChatRequest::default().user("Hi").template_kwarg("enable_thinking", false.into()),
        ChatRequest::default().system("Be brief. /no_think").user("Hi"),
    ] {
        let (text, split, prompt) = rendered(&off);
        assert!(text.contains("Reasoning Mode: /no_think") && text.ends_with("<think>\n\n</think>\n"), "{text}");
        assert!(split && !ReasoningParsing::after(tags, &prompt).starts_open);
        let answer = engine.chat(off.max_tokens(6).ignore_eos(true).temperature(0.0)).await.unwrap().answer().await;
        assert_eq!(answer.choices[0].reasoning, "");
        assert!(!answer.choices[0].text.is_empty());
    }
}

/// GLM-4.5's prompt ends at `<|assistant|>` and the model writes `\n<think>…</think>\n` before
/// its answer: the whitespace before the think block is layout, split off with it; without a
/// think block, whitespace at the start is the answer's own. `enable_thinking: false` renders
/// the empty block (`\n<think></think>`) in the prompt, so the output is the answer. A
/// constrained answer or a thinking budget lets the model write its newline before `<think>`
/// (once), and the budget holds after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn glm_thinking_after_a_newline_splits_off() {
    let fixture = fixture_dir("tiny-glm4moe-f32");
    let t = Tokenizer::from_dir(&fixture).unwrap();
    let tags = ReasoningTags { open: t.token_to_id("<think>").unwrap(), close: t.token_to_id("</think>").unwrap() };
    let split = |output: &str| {
        let mut s = TextStream::new([]).with_reasoning(Some(ReasoningParsing { tags, starts_open: false }));
        let (mut text, mut reasoning) = (String::new(), String::new());
        for id in t.encode(output).unwrap() {
            let piece = s.push(&t, id).unwrap();
            text.push_str(&piece.text);
            reasoning.push_str(&piece.reasoning);
        }
        let tail = s.finish(&t).unwrap();
        text.push_str(&tail.text);
        (reasoning + &tail.reasoning, text)
    };
    assert_eq!(split("\n<think>Plan it.</think>\nHello"), ("Plan it.".into(), "Hello".into()));
    // (A tag after the answer began is a special token: left out of the text.)
    assert_eq!(split("\n\nHi <think>"), (String::new(), "\n\nHi ".into()));
    assert_eq!(split(" \n"), (String::new(), " \n".into()));
    let engine = Engine::builder().model(&fixture).build().await.unwrap();
    let rendered = |chat: &ChatRequest| {
        let valid = engine.frontend().chat(chat).unwrap();
        let prompt = valid.prompts()[0].clone();
        (t.decode(&prompt, false).unwrap(), valid.params().reasoning.is_some(), prompt)
    };
    let (text, splits, prompt) = rendered(&ChatRequest::default().user("Hi"));
    assert_eq!(text, "[gMASK]<sop><|user|>\nHi<|assistant|>");
    assert!(splits && !ReasoningParsing::after(tags, &prompt).starts_open);
    let off = ChatRequest::default().user("Hi").template_kwarg("enable_thinking", false.into());
    let (text, _, prompt) = rendered(&off);
    assert!(text.ends_with("<|user|>\nHi/nothink<|assistant|>\n<think></think>"), "{text}");
    assert!(!ReasoningParsing::after(tags, &prompt).starts_open);
    let answer = engine.chat(off.clone().max_tokens(6).ignore_eos(true).temperature(0.0)).await.unwrap().answer().await;
    assert_eq!(answer.choices[0].reasoning, "");
    assert!(!answer.choices[0].text.is_empty());

    // The newline is biased above `<think>`: it comes first, then the tag (the newline again
    // would be the answer's, which the JSON object's grammar does not begin with), two tokens of
    // thinking, the closing tag forced by the budget, then the object.
    let newline = t.encode("\n").unwrap()[0];
    let (open, close) = (tags.open, tags.close);
    let mut budgeted = ChatRequest::default().user("Hi").constraint(Constraint::JsonObject).max_tokens(12);
    budgeted.options.thinking_budget = Some(2);
    budgeted.options.logit_bias = vec![(newline, 100.0), (open, 50.0)];
    let newline_of = |chat: &ChatRequest| {
        engine.frontend().chat(chat).unwrap().params().guidance.spec().thinking.and_then(|t| t.newline)
    };
    assert_eq!(newline_of(&budgeted), Some(newline), "the prompt ends at <|assistant|>");
    let mut closed = off.constraint(Constraint::JsonObject);
    closed.options.thinking_budget = Some(2);
    assert_eq!(newline_of(&closed), None, "the prompt closed the block");
    let c = &engine.chat(budgeted).await.unwrap().answer().await.choices[0];
    assert_eq!((c.tokens[0], c.tokens[1], c.tokens[4]), (newline, open, close), "{:?}", t.decode(&c.tokens, false));
    assert_eq!(c.reasoning, t.decode(&c.tokens[2..4], false).unwrap(), "{c:?}");
    assert!(c.text.starts_with('{'), "{c:?}");
}

/// An image's rows are ids drawn from its pixels' hash for the prefix cache, and may be any token,
/// `<think>` among them: what reads the prompt as text reads it as the processor writes it. On
/// the tiny Qwen3-VL fixture (its template opens no think block; its vocabulary has the tags),
/// an image whose drawn ids hold `<think>` leaves the answer an answer.
#[test]
fn an_images_drawn_ids_never_open_a_think_block() {
    use llaisys_model::Image;
    use llaisys_model::tokenizer::{ChatMessage, MessageImage};
    let fixture = fixture_dir("tiny-qwen3vl-f32");
    let frontend = Engine::builder().model(&fixture).build_frontend().unwrap();
    let open = Tokenizer::from_dir(&fixture).unwrap().token_to_id("<think>").unwrap();
    let chat = |hash: u64| {
        let image = Image { grid: [1, 8, 8], merge: 2, patches: vec![0.0; 64 * 1536], hash };
        let mut message = ChatMessage::new("user", "What is in the picture?");
        message.images.push(MessageImage { at: 0, image: std::sync::Arc::new(image) });
        frontend.chat(&ChatRequest::new(vec![message])).unwrap()
    };
    let text = chat(0);
    assert!(!text.params().reasoning.expect("the vocabulary has the tags").starts_open);
    let hash = (1..10_000).find(|&h| chat(h).prompts()[0].contains(&open)).expect("some image draws <think>");
    let valid = chat(hash);
    assert!(!valid.params().reasoning.unwrap().starts_open, "image {hash}'s drawn <think> opened the output");
}

/// The sampler's penalties read the prompt as the processor writes it, never an image's drawn
/// ids: a chat whose image draws the greedy first token answers as one whose image does not (the
/// same pixels: the same features and logits), under a repetition penalty that would push that
/// token down were it in the prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_images_drawn_ids_are_never_penalised_as_prompt_tokens() {
    use llaisys_actors::Options;
    use llaisys_model::Image;
    use llaisys_model::tokenizer::{ChatMessage, MessageImage};
    let fixture = fixture_dir("tiny-qwen3vl-f32");
    let frontend = Engine::builder().model(&fixture).build_frontend().unwrap();
    let request = |hash: u64| {
        let image = Image { grid: [1, 8, 8], merge: 2, patches: vec![0.0; 64 * 1536], hash };
        let mut message = ChatMessage::new("user", "What is in the picture?");
        message.images.push(MessageImage { at: 0, image: std::sync::Arc::new(image) });
        let options = Options { repetition_penalty: Some(10.0), ..Options::default() };
        ChatRequest::new(vec![message]).options(options).temperature(0.0).max_tokens(1)
    };
    let engine = Engine::builder().model(&fixture).build().await.unwrap();
    let first = |hash| {
        let engine = engine.clone();
        async move { engine.chat(request(hash)).await.unwrap().answer().await.choices[0].tokens[0] }
    };
    let prompt = |hash| frontend.chat(&request(hash)).unwrap().prompts()[0].clone();
    let token = first(0).await;
    assert!(!prompt(0).contains(&token), "the first token is not among image 0's ids nor the text's");
    let hash = (1..20_000).find(|&h| prompt(h).contains(&token)).expect("some image draws the token");
    assert_eq!(first(hash).await, token, "image {hash}'s drawn ids were penalised");
}
