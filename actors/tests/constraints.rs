//! T1/T2/T4/T5 on a tiny random fixture: a random model produces valid JSON, matching text or
//! one of the choices only if the constraint works. Many seeds at temperature 1, through the
//! engine (streamed, n > 1, logprobs) and the offline `Llm` (token-level `generate` included).

use llaisys_actors::request::FinishReason;
use llaisys_actors::{
    ChatRequest, CompletionRequest, Constraint, Engine, EngineError, Event, GenerateParams, Output, StreamExt,
};
use llaisys_model::SamplingParams;
use llaisys_tests::fixture_dir;
use serde_json::{Value, json};

const TIED: &str = "tiny-tied-f32";

/// Nested objects, arrays with min/max items, enums, bounded integers, required keys and
/// `additionalProperties: false`; strings are bounded so that a random model finishes.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 5}, "zip": {"type": "integer", "minimum": 10, "maximum": 99}},
                "required": ["city", "zip"],
                "additionalProperties": false
            },
            "active": {"type": "boolean"}
        },
        "required": ["name", "age", "role", "tags", "address"],
        "additionalProperties": false
    })
}

/// Checks `value` against the keywords `schema()` uses.
fn validate(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    let fail = |why: &str| Err(format!("{path}: {why} ({value})"));
    if let Some(choices) = schema.get("enum").and_then(Value::as_array) {
        return if choices.contains(value) { Ok(()) } else { fail("not in the enum") };
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(map) = value.as_object() else { return fail("not an object") };
            let props = schema["properties"].as_object().unwrap();
            for key in schema["required"].as_array().into_iter().flatten() {
                if !map.contains_key(key.as_str().unwrap()) {
                    return fail(&format!("missing {key}"));
                }
            }
            for (k, v) in map {
                match props.get(k) {
                    Some(s) => validate(s, v, &format!("{path}.{k}"))?,
                    None if schema["additionalProperties"] == json!(false) => return fail(&format!("extra key {k}")),
                    None => {}
                }
            }
            Ok(())
        }
        Some("array") => {
            let Some(items) = value.as_array() else { return fail("not an array") };
            let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = schema.get("maxItems").and_then(Value::as_u64).unwrap_or(u64::MAX) as usize;
            if items.len() < min || items.len() > max {
                return fail("item count out of bounds");
            }
            items.iter().enumerate().try_for_each(|(i, v)| validate(&schema["items"], v, &format!("{path}[{i}]")))
        }
        Some("string") => match value.as_str() {
            Some(s)
                if s.chars().count()
                    <= schema.get("maxLength").and_then(Value::as_u64).unwrap_or(u64::MAX) as usize =>
            {
                Ok(())
            }
            _ => fail("not a string within maxLength"),
        },
        Some("integer") => match value.as_i64() {
            Some(i) if i >= schema["minimum"].as_i64().unwrap() && i <= schema["maximum"].as_i64().unwrap() => Ok(()),
            _ => fail("not an integer within bounds"),
        },
        Some("boolean") => {
            if value.is_boolean() {
                Ok(())
            } else {
                fail("not a boolean")
            }
        }
        other => panic!("the validator does not know type {other:?}"),
    }
}

fn json_schema() -> Constraint {
    Constraint::JsonSchema { schema: schema(), strict: true }
}

#[test]
fn every_json_schema_output_of_a_random_model_parses_and_validates() {
    let mut llm = Engine::builder().model(fixture_dir(TIED)).build_offline().unwrap();
    // 8 requests × n = 4 choices, each seeded differently, at temperature 1, run as one batch.
    let requests: Vec<ChatRequest> = (0..8)
        .map(|seed| {
            ChatRequest::default()
                .user("Describe a user as JSON.")
                .constraint(json_schema())
                .temperature(1.0)
                .seed(seed * 97)
                .n(4)
                .max_tokens(160)
        })
        .collect();
    let answers = llm.chat(&requests).unwrap();
    let mut stopped = 0;
    for choice in answers.iter().flat_map(|a| &a.choices) {
        if choice.finish == FinishReason::Length {
            continue; // still inside the object after 160 tokens: nothing to check
        }
        assert_eq!(choice.finish, FinishReason::Stop);
        let value: Value = serde_json::from_str(&choice.text).unwrap_or_else(|e| panic!("{e}: {:?}", choice.text));
        validate(&schema(), &value, "$").unwrap();
        stopped += 1;
    }
    assert!(stopped >= 24, "only {stopped} of 32 outputs completed within 160 tokens");
}

#[test]
fn regex_choice_and_token_level_constraints_hold_for_a_random_model() {
    let mut llm = Engine::builder().model(fixture_dir(TIED)).build_offline().unwrap();
    let regex = Constraint::Regex { pattern: r"(ab|cd)[0-9]{2,3}!".into() };
    let choice = Constraint::Choice { choices: vec!["Paris".into(), "London".into(), "Rome, Italy".into()] };
    let requests = [
        CompletionRequest::new("The code is").constraint(regex).temperature(1.0).seed(5).n(8).max_tokens(20),
        CompletionRequest::new("The capital is")
            .constraint(choice.clone())
            .temperature(1.0)
            .seed(9)
            .n(8)
            .max_tokens(20),
    ];
    let answers = llm.complete(&requests).unwrap();
    for c in &answers[0].choices {
        let t = c.text.as_str();
        let ok = (t.starts_with("ab") || t.starts_with("cd"))
            && t.ends_with('!')
            && (2..=3).contains(&(t.len() - 3))
            && t[2..t.len() - 1].bytes().all(|b| b.is_ascii_digit());
        assert!(ok && c.finish == FinishReason::Stop, "{t:?} {:?}", c.finish);
    }
    for c in &answers[1].choices {
        assert!(["Paris", "London", "Rome, Italy"].contains(&c.text.as_str()), "{:?}", c.text);
        assert_eq!(c.finish, FinishReason::Stop);
    }
    // T4: the token-level API takes the same constraint.
    let guidance = llm.guidance(&choice).unwrap();
    let sampling = SamplingParams { temperature: 1.0, seed: Some(3), ..SamplingParams::default() };
    let params = GenerateParams { max_tokens: 20, sampling, guidance, ..GenerateParams::default() };
    let prompt = llm.tokenizer().unwrap().encode("Capital:").unwrap();
    let out = llm.generate(&[prompt], &params).unwrap();
    assert!(["Paris", "London", "Rome, Italy"].contains(&out[0].text.as_deref().unwrap()), "{:?}", out[0].text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_streams_constrained_json_with_logprobs_and_mask_times() {
    let engine = Engine::builder().model(fixture_dir(TIED)).build().await.unwrap();
    let request = ChatRequest::default()
        .user("JSON please")
        .constraint(Constraint::JsonObject)
        .temperature(1.0)
        .seed(11)
        .n(3)
        .logprobs(2)
        .max_tokens(180);
    let mut stream = engine.chat(request).await.unwrap();
    let mut texts = vec![String::new(); 3];
    let (mut masked, mut tokens) = (0, 0);
    let mut finishes = [None; 3];
    while let Some(Output { choice, event }) = stream.next().await {
        match event {
            Event::Token { text, mask_time, top_logprobs, .. } => {
                texts[choice].push_str(&text);
                tokens += 1;
                masked += usize::from(mask_time.is_some());
                assert_eq!(top_logprobs.len(), 2);
            }
            Event::Finished { reason, text, .. } => {
                texts[choice].push_str(&text);
                finishes[choice] = Some(reason);
            }
        }
    }
    assert_eq!(masked, tokens, "every constrained token had a mask");
    for (text, finish) in texts.iter().zip(&finishes) {
        if *finish == Some(FinishReason::Stop) {
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(v.is_object());
        }
    }
    // Bad constraints are refused naming the field, and the engine keeps serving.
    let bad = ChatRequest::default().user("x").constraint(Constraint::Regex { pattern: "(unclosed".into() });
    let Err(EngineError::Request(e)) = engine.chat(bad).await else { panic!("accepted a bad regex") };
    assert_eq!(e.param.as_deref(), Some("constraint"));
    let schema = json!({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}});
    let strict = ChatRequest::default().user("x").constraint(Constraint::JsonSchema { schema, strict: true });
    let Err(EngineError::Request(e)) = engine.chat(strict).await else { panic!("accepted an unknown format") };
    assert!(e.message.contains("no-such-format"), "{}", e.message);
    let answer = engine.chat(ChatRequest::default().user("hi").max_tokens(3)).await.unwrap().answer().await;
    assert_eq!(answer.usage.completion_tokens, 3);
    engine.shutdown().await;
}

/// `Options::time_limit` (llama.cpp's `t_max_predict_ms`): past it, a choice ends (finish
/// `Length`) at its first token once its text has a line break, through the engine and the
/// offline `Llm` alike; without a line break it goes on, and without the limit this seed's
/// answer has more lines. A regex makes the random model write lines (or no line break at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_limit_ends_a_choice_once_it_has_a_line_break() {
    use llaisys_actors::Options;
    use std::time::Duration;
    let request = |pattern: &str, time_limit| {
        let options = Options {
            max_tokens: Some(24),
            temperature: Some(1.0),
            seed: Some(4),
            constraint: Some(Constraint::Regex { pattern: pattern.into() }),
            time_limit,
            ..Options::default()
        };
        CompletionRequest::new("Lines:").options(options)
    };
    let lines = "(ab\n)+";
    let engine = Engine::builder().model(fixture_dir(TIED)).build().await.unwrap();
    let mut llm = Engine::builder().model(fixture_dir(TIED)).build_offline().unwrap();
    for limited in [true, false] {
        let time_limit = limited.then_some(Duration::ZERO);
        let streamed = engine.complete(request(lines, time_limit)).await.unwrap().answer().await;
        let offline = llm.complete(&[request(lines, time_limit)]).unwrap().remove(0);
        for (how, answer) in [("engine", &streamed), ("offline", &offline)] {
            let c = &answer.choices[0];
            match limited {
                // The first line break ends it: one line, however many tokens it took.
                true => assert_eq!((c.text.as_str(), c.finish), ("ab\n", FinishReason::Length), "{how}: {c:?}"),
                // The model's own end (the regex lets it end after any line).
                false => assert!(c.text.matches('\n').count() > 1, "{how}: {c:?}"),
            }
        }
    }
    // No line break: the limit never applies.
    let plain = engine.complete(request("[a-z]+", Some(Duration::ZERO))).await.unwrap().answer().await;
    assert_eq!((plain.choices[0].tokens.len(), plain.choices[0].finish), (24, FinishReason::Length), "{plain:?}");
    engine.shutdown().await;
}
