//! T3 on the tiny random fixture (Qwen2.5's chat template and tool-call tags): calls are
//! constrained to the tools' schemas, parsed by token id, streamed as pieces that add up to
//! the collected answer; the history's calls and results render through the template. The same
//! on the Qwen3.5 fixture, whose template writes calls as XML elements, and on GLM's, whose
//! template writes each argument between key and value tags.

use llaisys_actors::request::{FinishReason, ToolCallOut};
use llaisys_actors::{
    Answer, ChatMessage, ChatRequest, Choice, Constraint, Engine, EngineError, Event, GenerateParams, GenerateRequest,
    Output, StreamExt, Tool, ToolChoice, Usage,
};
use llaisys_model::tokenizer::ToolCall;
use llaisys_tests::{FixtureCopy, fixture_dir};
use serde_json::{Value, json};

const TIED: &str = "tiny-tied-f32";

fn weather() -> Tool {
    Tool::new(
        "get_weather",
        "Current weather of a city",
        json!({
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": false
        }),
    )
}

fn time() -> Tool {
    Tool::new(
        "get_time",
        "Current time in a zone",
        json!({"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}}, "required": ["zone"], "additionalProperties": false}),
    )
}

/// A user turn, an assistant turn calling `get_weather` (Paris, celsius), and the tool's result.
fn weather_history() -> Vec<ChatMessage> {
    let call = ToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: r#"{"city": "Paris", "unit": "celsius"}"#.into(),
    };
    vec![
        ChatMessage::new("user", "Weather in Paris?"),
        ChatMessage { tool_calls: vec![call], ..ChatMessage::new("assistant", "") },
        ChatMessage { tool_call_id: Some("call_1".into()), ..ChatMessage::new("tool", "22 degrees, sunny") },
    ]
}

fn ask() -> ChatRequest {
    ChatRequest::default()
        .user("What's the weather in Paris?")
        .tool(weather())
        .tool(time())
        .temperature(1.0)
        .max_tokens(120)
}

/// `ask()` with a call required, `n` 3 and room for several calls.
fn required(seed: u64, parallel: bool) -> ChatRequest {
    let mut r = ask().tool_choice(ToolChoice::Required).n(3).seed(seed).max_tokens(200);
    r.options.parallel_tool_calls = Some(parallel);
    r
}

/// A required call (one) to either tool, three choices, with the model's thinking turned off.
fn one_call_unthought(seed: u64) -> ChatRequest {
    let mut r = required(seed, false);
    r.options.chat_template_kwargs.insert("enable_thinking".into(), json!(false));
    r
}

/// `weather_history` with the weather tool renders as `reference` (`tests/fixtures/chat`), which
/// transformers rendered.
fn renders_weather_history_as(engine: &Engine, reference: &str) {
    let ids = engine.frontend().render_chat(&weather_history(), &[weather()], &Default::default(), true).unwrap();
    let reference = std::fs::read_to_string(fixture_dir("chat").join(reference)).unwrap();
    assert_eq!(engine.tokenizer().unwrap().decode(&ids, false).unwrap(), reference);
}

/// Mistral's call ids.
fn nine_letters_and_digits(id: &str) -> bool {
    id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric())
}

/// A required, not parallel, Mistral call: the answer is one valid call with a Mistral id.
fn one_mistral_call(c: &Choice) -> &ToolCallOut {
    assert_eq!((c.finish, c.tool_calls.len(), c.text.as_str()), (FinishReason::ToolCalls, 1, ""), "{c:?}");
    check_call(&c.tool_calls[0]);
    assert!(nine_letters_and_digits(&c.tool_calls[0].id), "{:?}", c.tool_calls[0].id);
    &c.tool_calls[0]
}

/// The calls of an answer that may have run out of length mid-call (then with a call begun):
/// every call before a cut one is whole and valid; how many that is.
fn whole_calls(c: &Choice) -> usize {
    let whole = match c.finish {
        FinishReason::ToolCalls => c.tool_calls.len(),
        FinishReason::Length if !c.tool_calls.is_empty() => c.tool_calls.len() - 1,
        _ => panic!("{c:?}"),
    };
    c.tool_calls[..whole].iter().for_each(check_call);
    whole
}

/// A call's id (OpenAI's, or Mistral's nine letters and digits) and its arguments against its
/// tool's schema.
fn check_call(call: &ToolCallOut) {
    let mistral = nine_letters_and_digits(&call.id);
    assert!(call.id.starts_with("call_") || mistral, "{call:?}");
    let args: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|e| panic!("{e}: {call:?}"));
    let map = args.as_object().unwrap();
    match call.name.as_str() {
        "get_weather" => {
            assert!(map["city"].as_str().is_some_and(|c| c.chars().count() <= 8), "{args}");
            assert!(["celsius", "fahrenheit"].contains(&map["unit"].as_str().unwrap()), "{args}");
            assert_eq!(map.len(), 2, "{args}");
        }
        "get_time" => {
            assert!(map["zone"].as_i64().is_some_and(|z| (-12..=14).contains(&z)), "{args}");
            assert_eq!(map.len(), 1, "{args}");
        }
        other => panic!("called an unknown tool {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_named_none_and_auto_calls_hold_for_a_random_model() {
    let fixture = FixtureCopy::long_context(TIED, 2048);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let open = engine.tokenizer().unwrap().token_to_id("<tool_call>").unwrap();

    // required: every choice calls tools, each call valid, finish `tool_calls`.
    let answer = engine.chat(ask().tool_choice(ToolChoice::Required).n(4).seed(1)).await.unwrap().answer().await;
    for c in &answer.choices {
        if c.finish == FinishReason::Length {
            continue;
        }
        assert_eq!(c.finish, FinishReason::ToolCalls, "{c:?}");
        assert!(!c.tool_calls.is_empty() && c.text.is_empty(), "{c:?}");
        c.tool_calls.iter().for_each(check_call);
    }

    // Named: that function, once; OpenAI finishes it with `stop`.
    let named = ask().tool_choice(ToolChoice::Function("get_time".into())).n(3).seed(2);
    for c in engine.chat(named).await.unwrap().answer().await.choices {
        assert_eq!((c.finish, c.tool_calls.len()), (FinishReason::Stop, 1), "{c:?}");
        assert_eq!(c.tool_calls[0].name, "get_time");
        check_call(&c.tool_calls[0]);
    }

    // parallel_tool_calls = false: exactly one call.
    let mut single = ask().tool_choice(ToolChoice::Required).n(3).seed(3);
    single.options.parallel_tool_calls = Some(false);
    for c in engine.chat(single).await.unwrap().answer().await.choices {
        assert_eq!((c.finish, c.tool_calls.len()), (FinishReason::ToolCalls, 1), "{c:?}");
    }

    // none forbids opening a call, however much the logits want it.
    let mut none = ask().tool_choice(ToolChoice::None).n(2).seed(4).max_tokens(20);
    none.options.logit_bias = vec![(open, 100.0)];
    for c in engine.chat(none).await.unwrap().answer().await.choices {
        assert!(c.tool_calls.is_empty() && !c.tokens.contains(&open), "{c:?}");
    }

    // none keeps a constraint's grammar (the tag cannot be spelled in it); other choices refuse one.
    let yes_no = Constraint::Choice { choices: vec!["yes".into(), "no".into()] };
    let constrained = ask().tool_choice(ToolChoice::None).constraint(yes_no.clone()).n(3).seed(6);
    for c in engine.chat(constrained).await.unwrap().answer().await.choices {
        assert!(["yes", "no"].contains(&c.text.as_str()) && c.finish == FinishReason::Stop, "{c:?}");
    }
    let Err(EngineError::Request(e)) = engine.chat(ask().constraint(yes_no)).await else { panic!("accepted") };
    assert_eq!(e.param.as_deref(), Some("constraint"));

    // auto: free until the model opens a call (pushed here by a bias), constrained after.
    let mut auto = ask().n(3).seed(5);
    auto.options.logit_bias = vec![(open, 100.0)];
    for c in engine.chat(auto).await.unwrap().answer().await.choices {
        assert!(!c.tool_calls.is_empty(), "{c:?}");
        c.tool_calls.iter().for_each(check_call);
    }
    engine.shutdown().await;
}

/// Qwen3.5's template writes calls as XML elements: the model is held to them (each parameter as
/// its schema says: text within its length, one of its choices, JSON within its bounds), they
/// come out as OpenAI's calls with JSON arguments, streamed in pieces that add up to the collected
/// answer; the history's calls render through the template as transformers renders them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen35_calls_are_xml_elements_held_to_the_schemas_and_read_as_json() {
    let fixture = FixtureCopy::long_context("tiny-qwen35-f32", 4096);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let tokenizer = engine.tokenizer().unwrap();
    let answer = engine.chat(one_call_unthought(31)).await.unwrap().answer().await;
    for c in &answer.choices {
        assert_eq!((c.finish, c.tool_calls.len()), (FinishReason::ToolCalls, 1), "{c:?}");
        check_call(&c.tool_calls[0]);
        let written = tokenizer.decode(&c.tokens, false).unwrap();
        assert!(written.contains("\n<function=get_") && written.contains("</function>\n"), "{written:?}");
        assert!(written.contains("<parameter="), "every tool here has a required parameter: {written:?}");
    }
    let named = one_call_unthought(32).tool_choice(ToolChoice::Function("get_time".into()));
    for c in engine.chat(named).await.unwrap().answer().await.choices {
        assert_eq!((c.finish, c.tool_calls.len(), c.tool_calls[0].name.as_str()), (FinishReason::Stop, 1, "get_time"));
        check_call(&c.tool_calls[0]);
    }

    streamed_calls_add_up_to(&engine, one_call_unthought(31), &answer).await;

    renders_weather_history_as(&engine, "qwen35-tools-history.txt");
    engine.shutdown().await;
}

/// GLM's template writes a call's name after `<tool_call>` and each argument between
/// `<arg_key>` and `<arg_value>` tags (special tokens): the model is held to that and to the
/// schemas (text values as they are, others as JSON), the calls come out as OpenAI's with JSON
/// arguments, streamed in pieces that add up to the collected answer; the history's calls render
/// through the template as transformers renders them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn glm_calls_are_tagged_pairs_held_to_the_schemas_and_read_as_json() {
    let fixture = FixtureCopy::long_context("tiny-glm4moe-f32", 4096);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let tokenizer = engine.tokenizer().unwrap();
    let answer = engine.chat(one_call_unthought(61)).await.unwrap().answer().await;
    for c in &answer.choices {
        assert_eq!((c.finish, c.tool_calls.len(), c.text.as_str()), (FinishReason::ToolCalls, 1, ""), "{c:?}");
        check_call(&c.tool_calls[0]);
        let written = tokenizer.decode(&c.tokens, false).unwrap();
        assert!(
            written.starts_with("<tool_call>get_") && written.contains("</arg_value>\n</tool_call>"),
            "{written:?}"
        );
        assert!(written.contains("\n<arg_key>"), "every tool here has a required parameter: {written:?}");
    }
    let named = one_call_unthought(63).tool_choice(ToolChoice::Function("get_weather".into()));
    for c in engine.chat(named).await.unwrap().answer().await.choices {
        assert_eq!(
            (c.finish, c.tool_calls.len(), c.tool_calls[0].name.as_str()),
            (FinishReason::Stop, 1, "get_weather")
        );
        check_call(&c.tool_calls[0]);
    }

    streamed_calls_add_up_to(&engine, one_call_unthought(61), &answer).await;

    renders_weather_history_as(&engine, "glm4moe-tools-history.txt");
    engine.shutdown().await;
}

/// Llama 3.x writes a call as its whole answer, `{"name": ..., "parameters": ...}`, with no tags:
/// required and named calls are held to that and to the schemas and come out as OpenAI's calls;
/// `auto` is free (nothing to hold a grammar back until); the history's call renders as the
/// template writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_calls_are_the_whole_answer_held_to_the_schemas() {
    let fixture = FixtureCopy::long_context("tiny-llama-f32", 4096);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let tokenizer = engine.tokenizer().unwrap();
    let answer = engine.chat(ask().tool_choice(ToolChoice::Required).n(3).seed(41)).await.unwrap().answer().await;
    for c in &answer.choices {
        assert_eq!((c.finish, c.tool_calls.len(), c.text.as_str()), (FinishReason::ToolCalls, 1, ""), "{c:?}");
        check_call(&c.tool_calls[0]);
        let written = tokenizer.decode(&c.tokens, true).unwrap();
        assert!(written.starts_with("{\"name\": \"get_") && written.contains("\"parameters\": {"), "{written:?}");
    }
    let named = ask().tool_choice(ToolChoice::Function("get_time".into())).n(2).seed(42);
    for c in engine.chat(named).await.unwrap().answer().await.choices {
        assert_eq!((c.finish, c.tool_calls.len(), c.tool_calls[0].name.as_str()), (FinishReason::Stop, 1, "get_time"));
        check_call(&c.tool_calls[0]);
    }
    for c in engine.chat(ask().max_tokens(8).n(2).seed(43)).await.unwrap().answer().await.choices {
        assert!(matches!(c.finish, FinishReason::Stop | FinishReason::Length), "{c:?}");
    }
    let ids = engine.frontend().render_chat(&weather_history(), &[weather()], &Default::default(), true).unwrap();
    let rendered = tokenizer.decode(&ids, false).unwrap();
    let call = "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}<|eot_id|>";
    assert!(rendered.contains(call), "{rendered}");
    engine.shutdown().await;
}

/// Mistral writes `[TOOL_CALLS]`, then its calls as a JSON array, to the end of its turn (no
/// closing tag): required, parallel and named calls are held to that and to the schemas, come
/// out as OpenAI's calls with ids of nine letters and digits (which its template insists on),
/// and stream in pieces that add up to the collected answer; the history's calls render with
/// such ids whatever the client's were (the last nine letters and digits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_calls_are_a_json_array_after_tool_calls_held_to_the_schemas() {
    let fixture = FixtureCopy::long_context("tiny-mistral-f32", 4096);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let tokenizer = engine.tokenizer().unwrap();
    let answer = engine.chat(required(51, false)).await.unwrap().answer().await;
    for c in &answer.choices {
        one_mistral_call(c);
        let written = tokenizer.decode(&c.tokens, false).unwrap();
        assert!(written.starts_with("[TOOL_CALLS]") && written.contains("[{\"name\": \"get_"), "{written:?}");
        assert!(written.ends_with("}}]</s>") || written.ends_with("}}]"), "{written:?}");
    }
    // Random weights go on calling until the length runs out: every call before the last is
    // whole and valid.
    let mut several = 0;
    for c in engine.chat(required(52, true).n(4)).await.unwrap().answer().await.choices {
        several += usize::from(whole_calls(&c) > 1);
    }
    assert!(several > 0, "parallel calls: one array holds several");
    let named = required(53, false).tool_choice(ToolChoice::Function("get_time".into()));
    for c in engine.chat(named).await.unwrap().answer().await.choices {
        assert_eq!((c.finish, c.tool_calls.len(), c.tool_calls[0].name.as_str()), (FinishReason::Stop, 1, "get_time"));
        check_call(&c.tool_calls[0]);
    }
    streamed_calls_add_up_to(&engine, required(51, false), &answer).await;

    // The tokenizer (legacy SentencePiece, as llama.cpp's) writes a space at the start of each
    // text after a special token: decoded, the prompt shows it.
    let ids = engine.frontend().render_chat(&weather_history(), &[weather()], &Default::default(), true).unwrap();
    let rendered = tokenizer.decode(&ids, false).unwrap();
    let call = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}, \"id\": \"0000call1\"}]</s>";
    assert!(rendered.contains(call), "{rendered}");
    let result = "[TOOL_RESULTS] {\"content\": 22 degrees, sunny, \"call_id\": \"0000call1\"}[/TOOL_RESULTS]";
    assert!(rendered.contains(result), "{rendered}");
    assert!(rendered.starts_with("<s>[AVAILABLE_TOOLS] [{\"type\": \"function\""), "{rendered}");
    assert!(rendered.contains("[/AVAILABLE_TOOLS][INST] Weather in Paris?[/INST]"), "{rendered}");
    engine.shutdown().await;
}

/// Granite 3 writes `<|tool_call|>`, then its calls as a JSON list, to the end of its turn (as
/// Mistral's array, another tag): required and named calls are held to that and to the schemas, come out as OpenAI's calls (ids as for Mistral's array, nine letters and digits;
/// Granite's template takes any), and stream in pieces that add up to the collected answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granite_calls_are_a_json_list_after_its_tool_call_tag() {
    let fixture = FixtureCopy::long_context("tiny-granite-f32", 4096);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let tokenizer = engine.tokenizer().unwrap();
    let answer = engine.chat(required(61, false)).await.unwrap().answer().await;
    for c in &answer.choices {
        assert_eq!((c.finish, c.tool_calls.len(), c.text.as_str()), (FinishReason::ToolCalls, 1, ""), "{c:?}");
        check_call(&c.tool_calls[0]);
        let written = tokenizer.decode(&c.tokens, false).unwrap();
        assert!(written.starts_with("<|tool_call|>[{\"name\": \"get_"), "{written:?}");
    }
    // Parallel calls: every call whole and valid (the random model closes its list after one;
    // several in one list are Mistral's grammar, tested on its fixture).
    for c in engine.chat(required(62, true).n(4)).await.unwrap().answer().await.choices {
        assert!(whole_calls(&c) >= 1, "{c:?}");
    }
    let named = required(63, false).tool_choice(ToolChoice::Function("get_time".into()));
    for c in engine.chat(named).await.unwrap().answer().await.choices {
        assert_eq!((c.finish, c.tool_calls.len(), c.tool_calls[0].name.as_str()), (FinishReason::Stop, 1, "get_time"));
        check_call(&c.tool_calls[0]);
    }
    streamed_calls_add_up_to(&engine, required(61, false), &answer).await;
    engine.shutdown().await;
}

/// Mistral Small 3.2 writes each call as `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`, one after
/// another to the end of its turn (Devstral and Magistral leave out the id): required, parallel
/// and named calls are held to that and to the schemas (the id nine letters and digits), come
/// out as OpenAI's calls with ids of their own, and stream in pieces that add up to the
/// collected answer; the history's calls render so, with ids its template takes. The fixture's
/// vocabulary has `[THINK]`: its thinking, if it opens it, is cut at once (a budget of 0), and
/// the calls follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_small_calls_are_a_name_then_args_held_to_the_schemas() {
    let required = |seed, parallel| {
        let mut r = required(seed, parallel);
        r.options.thinking_budget = Some(0);
        r
    };
    let with_ids = FixtureCopy::long_context("tiny-mixtral-f32", 4096);
    let without_ids = FixtureCopy::template_edited("tiny-mixtral-f32", 4096, "{{- '[CALL_ID]' + tool_call.id }}", "");
    for (fixture, ids) in [(&with_ids, true), (&without_ids, false)] {
        let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
        let tokenizer = engine.tokenizer().unwrap();
        let answer = engine.chat(required(61, false)).await.unwrap().answer().await;
        for c in &answer.choices {
            let call = one_mistral_call(c);
            let written = tokenizer.decode(&c.tokens, false).unwrap();
            // After a closed thinking, the one whitespace token the grammar allows there.
            let written = written.strip_prefix("[THINK][/THINK]").map_or(written.as_str(), str::trim_start);
            assert!(written.starts_with("[TOOL_CALLS]") && written.contains(call.name.as_str()), "{written:?}");
            assert_eq!(written.contains("[CALL_ID]"), ids, "{written:?}");
            let args = written.split_once("[ARGS]").map(|(_, a)| a.trim_start().trim_end_matches("</s>"));
            assert_eq!(args, Some(call.arguments.as_str()), "{written:?}");
        }
        // This fixture ends its turn after one call: with the tag favoured, it makes several
        // (until the length runs out, or it ends anyway), every call before a cut one whole and
        // valid.
        let mut parallel = required(62, true);
        parallel.options.logit_bias = vec![(tokenizer.token_to_id("[TOOL_CALLS]").unwrap(), 100.0)];
        for c in engine.chat(parallel).await.unwrap().answer().await.choices {
            assert!(whole_calls(&c) > 1, "{c:?}");
        }
        let named = required(63, false).tool_choice(ToolChoice::Function("get_time".into()));
        for c in engine.chat(named).await.unwrap().answer().await.choices {
            assert_eq!(
                (c.finish, c.tool_calls.len(), c.tool_calls[0].name.as_str()),
                (FinishReason::Stop, 1, "get_time")
            );
            check_call(&c.tool_calls[0]);
        }
        streamed_calls_add_up_to(&engine, required(61, false), &answer).await;

        let ids_of = engine.frontend().render_chat(&weather_history(), &[weather()], &Default::default(), true);
        let rendered = tokenizer.decode(&ids_of.unwrap(), false).unwrap();
        let id = if ids { "[CALL_ID] 0000call1" } else { "" };
        let call = format!("[TOOL_CALLS] get_weather{id}[ARGS] {{\"city\": \"Paris\", \"unit\": \"celsius\"}}</s>");
        assert!(rendered.contains(&call), "{rendered}");
        assert!(
            rendered.contains("[TOOL_RESULTS] 0000call1[TOOL_CONTENT] 22 degrees, sunny[/TOOL_RESULTS]"),
            "{rendered}"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_tool_call_pieces_add_up_to_the_answer_byte_for_byte() {
    let fixture = FixtureCopy::long_context(TIED, 2048);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let request = || ask().tool_choice(ToolChoice::Required).n(3).seed(21);
    let answer = engine.chat(request()).await.unwrap().answer().await;
    streamed_calls_add_up_to(&engine, request(), &answer).await;
    engine.shutdown().await;
}

/// `request` streamed: each choice's call pieces (no text beside them, a call's id and name once,
/// first) add up byte for byte to `answer`'s calls, and it finishes as `answer` did.
async fn streamed_calls_add_up_to(engine: &Engine, request: ChatRequest, answer: &Answer) {
    let n = answer.choices.len();
    let mut stream = engine.chat(request).await.unwrap();
    let mut calls: Vec<Vec<ToolCallOut>> = vec![Vec::new(); n];
    let mut finishes = vec![None; n];
    while let Some(Output { choice, event }) = stream.next().await {
        match event {
            Event::Token { tool_calls, text, .. } => {
                assert!(text.is_empty() || tool_calls.is_empty());
                for delta in tool_calls {
                    let known = calls[choice].len();
                    assert_eq!(delta.id.is_some(), delta.index == known, "id and name come once, first");
                    ToolCallOut::gather(&mut calls[choice], &delta);
                }
            }
            Event::Finished { reason, .. } => finishes[choice] = Some(reason),
        }
    }
    for (i, c) in answer.choices.iter().enumerate() {
        assert_eq!(finishes[i], Some(c.finish));
        let strip =
            |calls: &[ToolCallOut]| calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect::<Vec<_>>();
        assert_eq!(strip(&calls[i]), strip(&c.tool_calls), "choice {i}: same seed, same calls, same bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_renders_through_the_template_and_bad_tools_are_refused() {
    let fixture = FixtureCopy::long_context(TIED, 2048);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let history = weather_history();
    let frontend = engine.frontend();
    let ids = frontend.render_chat(&history, &[weather()], &Default::default(), true).unwrap();
    let text = engine.tokenizer().unwrap().decode(&ids, false).unwrap();
    // Exactly what transformers renders (tests/fixtures/chat/README.md).
    let reference = std::fs::read_to_string(fixture_dir("chat").join("tools-history.txt")).unwrap();
    assert_eq!(text, reference);
    for expected in [
        "# Tools",
        r#"{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}"#,
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call><|im_end|>",
        "<|im_start|>user\n<tool_response>\n22 degrees, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    let answer =
        engine.chat(ChatRequest::new(history.clone()).tool(weather()).max_tokens(4)).await.unwrap().answer().await;
    assert!(answer.usage.completion_tokens > 0);

    let refused = |request: ChatRequest| {
        let engine = &engine;
        async move {
            match engine.chat(request).await {
                Err(EngineError::Request(e)) => e.param.unwrap_or_default(),
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("accepted"),
            }
        }
    };
    let nameless = Tool::new("", "no name", json!({"type": "object"}));
    assert_eq!(refused(ask().tool(nameless)).await, "tools[2].function.name");
    assert_eq!(refused(ask().tool_choice(ToolChoice::Function("nope".into()))).await, "tool_choice");
    assert_eq!(refused(ChatRequest::default().user("x").tool_choice(ToolChoice::Required)).await, "tool_choice");
    let mut bad_args = history.clone();
    bad_args[1].tool_calls[0].arguments = "{city: Paris".into();
    assert_eq!(
        refused(ChatRequest::new(bad_args).tool(weather())).await,
        "messages[1].tool_calls[0].function.arguments"
    );
    let not_schema = Tool::new("f", "d", json!("object"));
    assert_eq!(refused(ChatRequest::default().user("x").tool(not_schema)).await, "tools[0].function.parameters");
    engine.shutdown().await;

    // A template that does not describe tools (Gemma 3's) would drop them unseen: refused, and
    // the same chat without them is answered.
    let gemma = Engine::builder().model(fixture_dir("tiny-gemma3-f32")).build().await.unwrap();
    match gemma.chat(ChatRequest::default().user("x").tool(weather()).max_tokens(2)).await {
        Err(EngineError::Request(e)) => {
            assert_eq!(e.param.as_deref(), Some("tools"));
            assert!(e.message.contains("does not describe tools"), "{}", e.message);
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("tools the template drops were accepted"),
    }
    let answer = gemma.chat(ChatRequest::default().user("x").max_tokens(2)).await.unwrap().answer().await;
    assert_eq!(answer.usage.completion_tokens, 2);
    gemma.shutdown().await;
}

/// `auto`: an answer the model writes as a ```json fence or bare JSON that is exactly a call to
/// an offered tool becomes that tool call (streamed as one piece, finish `tool_calls`); JSON
/// naming another tool, or with a key the tool lacks, stays the text it was.
#[test]
fn a_call_written_as_text_is_a_call_only_when_it_is_exactly_one_of_the_tools() {
    use llaisys_actors::host::AnswerBuilder;
    use llaisys_actors::request::Postprocess;
    let fixture = FixtureCopy::long_context(TIED, 2048);
    let frontend = Engine::builder().model(fixture.path()).build_frontend().unwrap();
    let valid = frontend.chat(&ask().tool_choice(ToolChoice::Auto)).unwrap();
    let params = valid.params();
    let tokenizer = std::sync::Arc::new(frontend.tokenizer().unwrap().clone());
    let run_with = |params: &GenerateParams, answer: &str| {
        let mut post = Postprocess::new(3, params, Some(tokenizer.clone()));
        let mut builder = AnswerBuilder::new(1, 1, false);
        let ids = tokenizer.encode(answer).unwrap();
        let mut pieces = Vec::new();
        for &token in &ids {
            let sampled = llaisys_model::Sampled { token, logprob: None, top: vec![], end: None, mask_time: None };
            for event in post.token(sampled).unwrap() {
                if let Event::Token { tool_calls, .. } = &event {
                    pieces.extend(tool_calls.iter().cloned());
                }
                builder.add(0, event);
            }
            // Nobody starts it over here: a rejected call is let out as text.
            if post.retry().is_some() {
                post.not_restarted();
            }
        }
        for event in post.finish(FinishReason::Stop, ids.len(), 0, None).unwrap() {
            if let Event::Token { tool_calls, .. } = &event {
                pieces.extend(tool_calls.iter().cloned());
            }
            builder.add(0, event);
        }
        (builder.finish().choices.remove(0), pieces)
    };
    let run = |answer: &str| run_with(params, answer);
    let arguments = json!({"city": "Paris", "unit": "celsius"});
    for answer in [
        format!("```json\n{}\n```", json!({"name": "get_weather", "arguments": arguments})),
        format!("{}", json!({"name": "get_weather", "arguments": arguments})),
        // Ended before its closing fence.
        format!("```json\n{}\n", json!({"name": "get_weather", "arguments": arguments})),
    ] {
        let (choice, pieces) = run(&answer);
        assert_eq!((choice.text.as_str(), choice.finish), ("", FinishReason::ToolCalls), "{answer}");
        assert_eq!(choice.tool_calls.len(), 1, "{answer}");
        let call = &choice.tool_calls[0];
        assert_eq!(
            (call.name.as_str(), serde_json::from_str::<Value>(&call.arguments).unwrap()),
            ("get_weather", arguments.clone())
        );
        assert!(call.id.starts_with("call_") && pieces.len() == 1, "one whole piece: {pieces:?}");
    }
    for answer in [
        format!("```json\n{}\n```", json!({"name": "tell_joke", "arguments": {}})),
        format!("{}", json!({"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "when": "now"}})),
        "```python\nprint('weather')\n```".to_string(),
        "Sunny in Paris.".to_string(),
    ] {
        let (choice, _) = run(&answer);
        assert_eq!((choice.text.as_str(), choice.finish), (answer.as_str(), FinishReason::Stop));
        assert!(choice.tool_calls.is_empty());
    }
    // A stop string that ends the answer while a call written as text is undecided: the text
    // before it comes out, as any text before a stop string does.
    let stopping = GenerateParams { stop: vec!["STOP".into()], ..params.clone() };
    for (answer, shown) in [
        ("{\"name\": \"get_weather\", \"argu STOP ments\"}", "{\"name\": \"get_weather\", \"argu "),
        (
            "```json\n{\"name\": \"tell_joke\", \"arguments\": {}}\n```STOP",
            "```json\n{\"name\": \"tell_joke\", \"arguments\": {}}\n```",
        ),
        ("```jsonSTOP", "```json"),
    ] {
        let (choice, _) = run_with(&stopping, answer);
        assert_eq!((choice.text.as_str(), choice.finish), (shown, FinishReason::Stop), "{answer:?}");
    }
}

/// The call written as text that no tool fits: a city nobody named.
const ATLANTIS: &str = r#"{"name": "get_weather", "arguments": {"city": "Atlantis", "unit": "celsius"}}"#;

/// A first attempt forced (by a regex in place of the chat's guidance) to answer with
/// `ATLANTIS`, then `tail` (a regex).
fn rejected_first_attempt(frontend: &llaisys_actors::Frontend, tail: &str) -> (Vec<u32>, GenerateParams) {
    let valid = frontend.chat(&ask().tool_choice(ToolChoice::Auto).max_tokens(200)).unwrap();
    let mut params = valid.params().clone();
    assert!(params.text_retry.is_some(), "auto answers a rejected call again");
    let pattern = format!("{}{tail}", regex_escape(ATLANTIS));
    params.guidance = frontend.guidance(&Constraint::Regex { pattern }).unwrap();
    (valid.prompts()[0].clone(), params)
}

fn regex_escape(s: &str) -> String {
    s.chars().map(|c| if "{}[]().*+?|\\^$".contains(c) { format!("\\{c}") } else { c.to_string() }).collect()
}

/// A choice's streamed text, token events and usage.
async fn streamed(engine: &Engine, prompt: &[u32], params: GenerateParams) -> (String, usize, Usage, FinishReason) {
    let mut stream = engine.generate(GenerateRequest::new(prompt.to_vec(), params)).await.unwrap();
    let (mut text, mut tokens) = (String::new(), 0);
    loop {
        match stream.next().await.expect("the stream ends with Finished") {
            Event::Token { text: t, tool_calls, .. } => {
                assert!(tool_calls.is_empty());
                text.push_str(&t);
                tokens += 1;
            }
            Event::Finished { text: t, usage, reason, .. } => {
                text.push_str(&t);
                return (text, tokens, usage, reason);
            }
        }
    }
}

/// What a second attempt may be: no call, nothing of the first, and not opening as JSON.
fn check_second_attempt(text: &str) {
    assert!(!text.contains("Atlantis") && !text.contains("get_weather"), "{text:?}");
    assert!(!text.starts_with(['{', '[', '`', ' ', '\n']), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_is_a_call_no_tool_fits_is_answered_again_as_text() {
    let fixture = FixtureCopy::long_context(TIED, 2048);
    let engine = Engine::builder().model(fixture.path()).build().await.unwrap();
    let (prompt, params) = rejected_first_attempt(engine.frontend(), "[a-z ]{30,40}");
    for seed in 0..3 {
        let mut params = params.clone();
        (params.sampling.temperature, params.sampling.seed) = (1.0, Some(seed));
        let (text, tokens, usage, reason) = streamed(&engine, &prompt, params).await;
        assert!(matches!(reason, FinishReason::Stop | FinishReason::Length), "{reason:?}");
        check_second_attempt(&text);
        assert_eq!(tokens, usage.completion_tokens, "the first attempt's tokens are not shown");
    }
    // A first attempt that ended in the step that decided it cannot be started over: its text
    // is the answer, whole.
    let (prompt, params) = rejected_first_attempt(engine.frontend(), "");
    let (text, tokens, usage, reason) = streamed(&engine, &prompt, params).await;
    assert_eq!((text.as_str(), reason), (ATLANTIS, FinishReason::Stop));
    assert_eq!(tokens, usage.completion_tokens);
    let stats = engine.stats().await.unwrap();
    assert_eq!((stats.running, stats.waiting), (0, 0), "nothing left behind");
    assert_eq!(stats.text_call_retries, 3, "the three that were started over");
    engine.shutdown().await;

    // The offline engine steps itself: it starts over even an attempt that just ended.
    let mut llm = Engine::builder().model(fixture.path()).build_offline().unwrap();
    for tail in ["[a-z ]{30,40}", ""] {
        let (prompt, mut params) = rejected_first_attempt(llm.frontend(), tail);
        (params.sampling.temperature, params.sampling.seed) = (1.0, Some(7));
        let out = llm.generate(&[prompt], &params).unwrap().remove(0);
        assert!(out.tool_calls.is_empty());
        check_second_attempt(out.text.as_deref().unwrap());
        let shown = llm.tokenizer().unwrap().decode(&out.tokens, true).unwrap();
        assert!(!shown.contains("Atlantis"), "the first attempt's tokens are not shown: {shown:?}");
    }
}
