//! gpt-oss's harmony messages on the tiny gpt-oss fixture (its o200k-style tokenizer with the
//! format's special tokens, and gpt-oss's chat template): split by channel as they stream into
//! reasoning, answer and tool calls (the recipient before or after the channel), stop strings
//! cutting the answer only; a chat's prompt ends at the assistant's header, a constrained one
//! opens the final channel; `tool_choice: required` or a named tool makes the turn one call,
//! held to the format and the tool's schema; an output not in the format is answer text, not lost.

use llaisys_actors::request::{
    FinishReason, HarmonyParsing, HarmonyTags, TextStream, ToolCallDelta, ToolCallOut, ToolParsing,
};
use llaisys_actors::{ChatRequest, Engine, Tool, ToolChoice};
use llaisys_model::{Constraint, Tokenizer};
use llaisys_tests::{FixtureCopy, fixture_dir};

const GPT_OSS: &str = "tiny-gptoss-f32";

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixture_dir(GPT_OSS)).unwrap()
}

fn tags(t: &Tokenizer) -> HarmonyTags {
    let tags = HarmonyTags::find(|s| t.token_to_id(s)).expect("the harmony tags");
    assert!(tags.constrain.is_some());
    tags
}

/// Streams `output` (encoded) after a prompt ending at the assistant's header, one token at a
/// time; returns (answer text, reasoning, tool calls).
fn stream(t: &Tokenizer, output: &str, stop: &str, tools: bool) -> (String, String, Vec<ToolCallOut>) {
    let tags = tags(t);
    let parsing = ToolParsing { tags: None, xml: None, finish_with_tool_calls: true };
    let mut s = TextStream::new([stop.to_string()])
        .with_harmony(Some(HarmonyParsing::after(tags, &[tags.start])))
        .with_tool_calls(tools.then_some(&parsing));
    let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    let mut pieces: Vec<ToolCallDelta> = Vec::new();
    for id in t.encode(output).unwrap() {
        let piece = s.push(t, id).unwrap();
        text.push_str(&piece.text);
        reasoning.push_str(&piece.reasoning);
        pieces.extend(piece.tool_calls);
    }
    let tail = s.finish(t).unwrap();
    text.push_str(&tail.text);
    reasoning.push_str(&tail.reasoning);
    for piece in &pieces {
        ToolCallOut::gather(&mut calls, piece);
    }
    (text, reasoning, calls)
}

#[test]
fn channels_split_into_reasoning_answer_and_calls() {
    let t = tokenizer();
    let tags = tags(&t);
    assert!(t.encode("<|channel|>").unwrap() == [tags.channel], "the format's tags are single tokens");
    let output = "<|channel|>analysis<|message|>The user asks the weather; stop, then call.<|end|>\
                  <|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>\
                  <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    let (text, reasoning, calls) = stream(&t, output, "stop", true);
    // The stop string appears only in the reasoning, which it does not cut.
    assert_eq!(reasoning, "The user asks the weather; stop, then call.");
    assert_eq!(text, "Checking.");
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", "{\"city\": \"Paris\"}"));
    assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29, "{}", calls[0].id);

    // Two calls, the second's recipient before its channel; then the final answer, cut by a stop
    // string.
    let output = "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{}<|call|>\
                  <|start|>assistant to=functions.b<|channel|>commentary json<|message|>{\"x\": 1}<|call|>\
                  <|start|>assistant<|channel|>final<|message|>It is sunny. Bye<|return|>";
    let (text, reasoning, calls) = stream(&t, output, "Bye", true);
    // (Whitespace after the calls is held until text follows it: the space before the stop string.)
    assert_eq!((text.as_str(), reasoning.as_str()), ("It is sunny.", ""));
    let names: Vec<(&str, &str)> = calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect();
    assert_eq!(names, [("a", "{}"), ("b", "{\"x\": 1}")]);
    assert_ne!(calls[0].id, calls[1].id);

    // Without tools offered, a call's body is answer text; an output never in the format is
    // all answer text.
    let (text, _, calls) = stream(&t, "<|channel|>commentary to=functions.a<|message|>{}<|call|>", "stop", false);
    assert_eq!((text.as_str(), calls.len()), ("{}", 0));
    let (text, reasoning, _) = stream(&t, "Hello there", "stop", true);
    assert_eq!((text.as_str(), reasoning.as_str()), ("Hello there", ""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_ends_at_the_header_and_a_constrained_one_in_the_final_channel() {
    let engine = Engine::builder().model(fixture_dir(GPT_OSS)).build().await.unwrap();
    let t = tokenizer();
    let tags = tags(&t);
    let valid = engine.frontend().chat(&ChatRequest::default().user("Hi")).unwrap();
    let prompt = &valid.prompts()[0];
    assert!(t.decode(prompt, false).unwrap().ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"));
    assert_eq!(valid.params().harmony, Some(HarmonyParsing::after(tags, prompt)));
    assert!(!valid.params().harmony.unwrap().in_body);

    // A constrained answer is the final channel's, its grammar from the first token.
    let json = ChatRequest::default().user("Hi").constraint(Constraint::JsonObject).max_tokens(40).temperature(0.0);
    let valid = engine.frontend().chat(&json).unwrap();
    let prompt = &valid.prompts()[0];
    assert!(t.decode(prompt, false).unwrap().ends_with("<|start|>assistant<|channel|>final<|message|>"));
    assert!(valid.params().harmony.unwrap().in_body);
    let answer = engine.chat(json).await.unwrap().answer().await;
    let text = &answer.choices[0].text;
    assert!(text.trim_start().starts_with('{'), "{text:?}");
    assert_eq!(answer.choices[0].reasoning, "");

    // `auto` reads the calls the model chooses to write, unconstrained.
    let tool = Tool::new("get_weather", "The weather", serde_json::json!({"type": "object", "properties": {}}));
    let auto = engine.frontend().chat(&ChatRequest::default().user("Hi").tool(tool.clone())).unwrap();
    assert!(auto.params().tool_calls.is_some() && auto.params().guidance.is_free());
    assert!(t.decode(&auto.prompts()[0], false).unwrap().contains("namespace functions"));

    // The random model writes no harmony: its answer is its text, not lost.
    let answer =
        engine.chat(ChatRequest::default().user("Hi").max_tokens(8).ignore_eos(true).temperature(0.0)).await.unwrap();
    let answer = answer.answer().await;
    assert!(!answer.choices[0].text.is_empty() || !answer.choices[0].reasoning.is_empty());
}

/// `required` and a named tool make the turn one call, in the format and to the tool's schema;
/// OpenAI finishes the named one with `stop`. The random model is pushed to end any analysis
/// at once and to close the call when it may (a bias counts only where the grammar allows the
/// tag): what it writes between is its own, held to the grammar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_or_named_tool_choice_makes_the_turn_one_call() {
    // The tools' system prompt in the tiny vocabulary needs more than the fixture's 256 tokens.
    let fixture = FixtureCopy::long_context(GPT_OSS, 2048);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let tags = tags(&tokenizer());
    let tool = Tool::new("get_weather", "The weather", serde_json::json!({"type": "object", "properties": {}}));
    let other = Tool::new(
        "get_time",
        "The time",
        serde_json::json!({"type": "object", "properties": {"zone": {"type": "integer", "minimum": 0, "maximum": 9}},
                           "required": ["zone"], "additionalProperties": false}),
    );
    for (choice, finish) in
        [(ToolChoice::Required, FinishReason::ToolCalls), (ToolChoice::Function("get_time".into()), FinishReason::Stop)]
    {
        let mut chat = ChatRequest::default().user("Hi").tool(tool.clone()).tool(other.clone()).tool_choice(choice);
        chat = chat.max_tokens(120).temperature(0.0);
        chat.options.logit_bias = vec![(tags.end, 100.0), (tags.call, 100.0)];
        let valid = engine.frontend().chat(&chat).unwrap();
        assert!(!valid.params().guidance.is_free());
        let answer = engine.chat(chat).await.unwrap().answer().await;
        let c = &answer.choices[0];
        assert_eq!((c.finish, c.tool_calls.len(), c.text.as_str()), (finish, 1, ""), "{c:?}");
        let args: serde_json::Value = serde_json::from_str(&c.tool_calls[0].arguments).unwrap();
        match c.tool_calls[0].name.as_str() {
            "get_weather" => assert!(finish == FinishReason::ToolCalls && args.as_object().is_some(), "{c:?}"),
            "get_time" => assert!(args["zone"].as_u64().is_some_and(|z| z <= 9), "{c:?}"),
            other => panic!("{other:?}"),
        }
    }
}

/// A thinking budget caps gpt-oss's analysis: a chat with one has its turn held to the format
/// (one without, nothing). With a required call, `<|end|>` pushed away (the random model would
/// think on to the length limit) and the first piece of `analysis` and `<|call|>` pulled in (a
/// bias counts only where the grammar allows the token), the output reasons for exactly the
/// budget's tokens, `<|end|>` is then forced, and the call follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_budget_caps_the_analysis_message() {
    let fixture = FixtureCopy::long_context(GPT_OSS, 2048);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let t = tokenizer();
    let tags = tags(&t);
    let plain = ChatRequest::default().user("Hi");
    assert!(engine.frontend().chat(&plain).unwrap().params().guidance.is_free());
    let mut budgeted = plain.clone();
    budgeted.options.thinking_budget = Some(3);
    assert!(!engine.frontend().chat(&budgeted).unwrap().params().guidance.is_free());

    let tool = Tool::new(
        "get_weather",
        "The weather",
        serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false}),
    );
    let analysis = t.encode("analysis").unwrap()[0];
    for seed in 0..3 {
        let mut chat = ChatRequest::default().user("Hi").tool(tool.clone()).tool_choice(ToolChoice::Required);
        chat = chat.max_tokens(60).temperature(1.0).seed(seed);
        chat.options.thinking_budget = Some(3);
        chat.options.logit_bias = vec![(tags.end, -100.0), (tags.call, 100.0), (analysis, 100.0)];
        let answer = engine.chat(chat).await.unwrap().answer().await;
        let c = &answer.choices[0];
        assert_eq!((c.finish, c.tool_calls.len()), (FinishReason::ToolCalls, 1), "{c:?}");
        let ids = &c.tokens;
        let opened = ids.iter().position(|&id| id == tags.message).unwrap();
        assert_eq!(t.decode(&ids[..opened], false).unwrap(), "<|channel|>analysis", "{c:?}");
        assert_eq!(ids[opened + 1..].iter().position(|&id| id == tags.end), Some(3), "{c:?}");
        assert!(!c.reasoning.is_empty(), "{c:?}");
    }
}
