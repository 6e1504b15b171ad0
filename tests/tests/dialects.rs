//! The API dialects beside OpenAI chat (Responses, Anthropic Messages, Ollama) against the real
//! server: each answers a conversation as chat completions do, streamed pieces add up to the
//! whole answer, tools and reasoning come in each dialect's shape, stored responses continue
//! on their cached prefix, and errors come in each dialect's shape without changing anything.

use llaisys_model::Tokenizer;
use llaisys_server::Server;
use llaisys_tests::{FixtureCopy, fixture_dir};
use serde_json::{Value, json};
use sha2::Digest;

mod common;
use common::{events, get, post, server_for, url};

const FIXTURE: &str = "tiny-untied-f32";
const TOOLS_FIXTURE: &str = "tiny-tied-f32";

/// Whether two JSON values are the same but for numbers within 1e-3 of each other: the same
/// prompt's log-probabilities computed in other batches (the second request finds the first's
/// prefix cached and computes one row, where AVX-512's one-row product sums in another order
/// than the many-row one) differ in their last bits.
fn nearly(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-3,
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| nearly(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| nearly(v, w)))
        }
        _ => a == b,
    }
}

/// The text of a Responses `response` (its message items' output text).
fn output_text(r: &Value) -> String {
    let items = r["output"].as_array().unwrap_or_else(|| panic!("no output: {r}"));
    let messages = items.iter().filter(|i| i["type"] == "message");
    messages.flat_map(|m| m["content"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap())).collect()
}

/// The text blocks of an Anthropic `message`.
fn message_text(r: &Value) -> String {
    let blocks = r["content"].as_array().unwrap_or_else(|| panic!("no content: {r}"));
    blocks.iter().filter(|b| b["type"] == "text").map(|b| b["text"].as_str().unwrap()).collect()
}

/// The lines of an NDJSON response.
async fn ndjson(s: &Server, path: &str, body: Value) -> Vec<Value> {
    let r = reqwest::Client::new().post(url(s, path)).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    r.text().await.unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The named events' data as JSON, checking each event's name is its data's `type`.
async fn typed_events(s: &Server, path: &str, body: Value) -> Vec<Value> {
    let all = events(s, path, body).await;
    all.into_iter()
        .map(|(name, data)| {
            let value: Value = serde_json::from_str(&data).unwrap();
            assert_eq!(name.as_deref(), value["type"].as_str(), "{value}");
            value
        })
        .collect()
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> impl Iterator<Item = &'a Value> {
    let kind = kind.to_string();
    events.iter().filter(move |e| e["type"] == kind.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dialect_gives_the_chat_completions_answer_streamed_or_not() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let (system, user) = ("You are terse.", "Hello there");
    let (status, chat) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": FIXTURE, "max_tokens": 12, "temperature": 0,
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}),
    )
    .await;
    assert_eq!(status, 200, "{chat}");
    let text = chat["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let length = chat["choices"][0]["finish_reason"] == "length";
    let (prompt, completion) = (&chat["usage"]["prompt_tokens"], &chat["usage"]["completion_tokens"]);

    // Responses.
    let body = |stream: bool| {
        json!({"model": FIXTURE, "max_output_tokens": 12, "temperature": 0, "instructions": system,
               "input": user, "stream": stream, "store": false})
    };
    let (status, r) = post(&s, "/v1/responses", body(false)).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["object"].as_str(), output_text(&r)), (Some("response"), text.clone()));
    assert_eq!(r["status"], if length { "incomplete" } else { "completed" }, "{r}");
    assert_eq!((&r["usage"]["input_tokens"], &r["usage"]["output_tokens"]), (prompt, completion));
    let events = typed_events(&s, "/v1/responses", body(true)).await;
    let sequence: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(sequence, (0..events.len() as u64).collect::<Vec<_>>());
    assert_eq!(events[0]["type"], "response.created");
    let streamed: String =
        of_type(&events, "response.output_text.delta").map(|e| e["delta"].as_str().unwrap()).collect();
    assert_eq!(streamed, text);
    let last = events.last().unwrap();
    assert_eq!(last["type"], if length { "response.incomplete" } else { "response.completed" });
    assert_eq!(output_text(&last["response"]), text);
    assert_eq!(of_type(&events, "response.output_item.done").count(), 1);

    // Anthropic Messages.
    let body = |stream: bool| {
        json!({"model": FIXTURE, "max_tokens": 12, "temperature": 0, "system": system,
               "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}], "stream": stream})
    };
    let (status, m) = post(&s, "/v1/messages", body(false)).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str(), message_text(&m)),
        (Some("message"), Some("assistant"), text.clone())
    );
    assert_eq!(m["stop_reason"], if length { "max_tokens" } else { "end_turn" });
    let input = m["usage"]["input_tokens"].as_u64().unwrap() + m["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!((Some(input), &m["usage"]["output_tokens"]), (prompt.as_u64(), completion));
    let events = typed_events(&s, "/v1/messages", body(true)).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"message_stop"));
    assert_eq!(kinds.iter().filter(|k| **k == "message_delta").count(), 1);
    assert_eq!(kinds.iter().filter(|k| **k == "content_block_start").count(), 1);
    let streamed: String =
        of_type(&events, "content_block_delta").map(|e| e["delta"]["text"].as_str().unwrap()).collect();
    assert_eq!(streamed, text);
    let (_, count) = post(
        &s,
        "/v1/messages/count_tokens",
        json!({"model": FIXTURE, "system": system, "messages": [{"role": "user", "content": user}]}),
    )
    .await;
    assert_eq!(count["input_tokens"].as_u64(), prompt.as_u64(), "{count}");

    // Ollama: chat, and generate with the same system prompt and prompt.
    let body = |stream: bool| {
        json!({"model": FIXTURE, "stream": stream, "options": {"temperature": 0, "num_predict": 12},
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
    };
    let (status, o) = post(&s, "/api/chat", body(false)).await;
    assert_eq!(status, 200, "{o}");
    assert_eq!((o["message"]["content"].as_str(), o["done"].as_bool()), (Some(text.as_str()), Some(true)));
    assert_eq!((&o["prompt_eval_count"], &o["eval_count"]), (prompt, completion));
    assert_eq!(o["done_reason"], if length { "length" } else { "stop" });
    let lines = ndjson(&s, "/api/chat", body(true)).await;
    assert!(lines.iter().rev().skip(1).all(|l| l["done"] == false) && lines.last().unwrap()["done"] == true);
    let streamed: String = lines.iter().map(|l| l["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(streamed, text);
    let (status, g) = post(
        &s,
        "/api/generate",
        json!({"model": FIXTURE, "system": system, "prompt": user, "stream": false,
               "options": {"temperature": 0, "num_predict": 12}}),
    )
    .await;
    assert_eq!((status, g["response"].as_str()), (200, Some(text.as_str())), "{g}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_continue_on_their_cached_prefix_and_can_be_deleted() {
    let s = server_for(&fixture_dir(FIXTURE), &[("server.stored_responses", "2")]).await;
    let turn = |input: Value, previous: Option<&str>| {
        json!({"model": FIXTURE, "max_output_tokens": 6, "temperature": 0, "input": input,
               "previous_response_id": previous})
    };
    let (status, first) = post(&s, "/v1/responses", turn(json!("Hello"), None)).await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap();
    assert!(id.starts_with("resp_"));
    let (status, stored) = get(&s, &format!("/v1/responses/{id}")).await;
    assert_eq!((status, &stored), (200, &first));
    let (_, items) = get(&s, &format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(items["data"][0]["content"], "Hello", "{items}");

    let next = json!([{"role": "user", "content": [{"type": "input_text", "text": "And again"}]}]);
    let (status, second) = post(&s, "/v1/responses", turn(next, Some(id))).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["previous_response_id"], id);
    // The second turn's prompt is the whole conversation, and its prefix was cached.
    let (_, chat) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": FIXTURE, "max_tokens": 1, "messages": [
            {"role": "user", "content": "Hello"}, {"role": "assistant", "content": output_text(&first)},
            {"role": "user", "content": "And again"}]}),
    )
    .await;
    assert_eq!(second["usage"]["input_tokens"], chat["usage"]["prompt_tokens"], "{second} {chat}");
    let total_first = first["usage"]["total_tokens"].as_u64().unwrap();
    let cached = second["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached + 1 >= total_first, "the first turn's tokens come from the cache: {cached} of {total_first}");

    // `store: false` keeps nothing; a deleted or evicted response cannot be continued.
    let (_, unstored) =
        post(&s, "/v1/responses", json!({"model": FIXTURE, "max_output_tokens": 2, "input": "x", "store": false}))
            .await;
    assert_eq!(get(&s, &format!("/v1/responses/{}", unstored["id"].as_str().unwrap())).await.0, 404);
    let deleted = reqwest::Client::new().delete(url(&s, &format!("/v1/responses/{id}"))).send().await.unwrap();
    assert_eq!(deleted.status().as_u16(), 200);
    assert_eq!(get(&s, &format!("/v1/responses/{id}")).await.0, 404);
    let (status, err) = post(&s, "/v1/responses", turn(json!("x"), Some(id))).await;
    assert_eq!((status, err["error"]["param"].as_str()), (400, Some("previous_response_id")), "{err}");
    // The store holds two: a third drops the oldest.
    let second_id = second["id"].as_str().unwrap();
    for _ in 0..2 {
        assert_eq!(post(&s, "/v1/responses", turn(json!("y"), None)).await.0, 200);
    }
    assert_eq!(get(&s, &format!("/v1/responses/{second_id}")).await.0, 404);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_round_trip_in_every_dialect() {
    let fixture = FixtureCopy::long_context(TOOLS_FIXTURE, 2048);
    let s = server_for(fixture.path(), &[("model.name", &format!("{TOOLS_FIXTURE:?}"))]).await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"], "additionalProperties": false});
    let question = "Weather in Paris?";
    // What chat completions count for a conversation with the tool, a call and its result.
    let chat_prompt = |arguments: &str| {
        json!({"model": TOOLS_FIXTURE, "max_tokens": 1, "tool_choice": "none",
               "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": schema}}],
               "messages": [{"role": "user", "content": question},
                            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
                            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]})
    };

    // Responses: a function_call item, then its output sent back.
    let tools =
        json!([{"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters": schema}]);
    let (status, r) = post(
        &s,
        "/v1/responses",
        json!({"model": TOOLS_FIXTURE, "temperature": 0, "max_output_tokens": 100, "tools": tools, "tool_choice": "required", "parallel_tool_calls": false, "input": question}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let call =
        r["output"].as_array().unwrap().iter().find(|i| i["type"] == "function_call").unwrap_or_else(|| panic!("{r}"));
    assert_eq!(call["name"], "get_weather");
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    let arguments: Value =
        serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}: {r}"));
    assert!(arguments["city"].is_string(), "{call}");
    let events = typed_events(
        &s,
        "/v1/responses",
        json!({"model": TOOLS_FIXTURE, "temperature": 0, "max_output_tokens": 100, "tools": tools, "tool_choice": "required", "parallel_tool_calls": false, "input": question, "stream": true}),
    )
    .await;
    let streamed: String =
        of_type(&events, "response.function_call_arguments.delta").map(|e| e["delta"].as_str().unwrap()).collect();
    assert_eq!(streamed, call["arguments"].as_str().unwrap(), "same seed, same call");
    let (status, r) = post(
        &s,
        "/v1/responses",
        json!({"model": TOOLS_FIXTURE, "max_output_tokens": 1, "tools": tools, "tool_choice": "none", "input": [
            {"role": "user", "content": question},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}]}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let (_, chat) = post(&s, "/v1/chat/completions", chat_prompt("{\"city\": \"Paris\"}")).await;
    assert_eq!(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"], "{r} {chat}");

    // Anthropic: a tool_use block, streamed as input_json_delta, then a tool_result.
    let tools = json!([{"name": "get_weather", "description": "Weather of a city", "input_schema": schema}]);
    let body = |stream: bool| {
        json!({"model": TOOLS_FIXTURE, "temperature": 0, "max_tokens": 100, "tools": tools, "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
               "messages": [{"role": "user", "content": question}], "stream": stream})
    };
    let (status, m) = post(&s, "/v1/messages", body(false)).await;
    assert_eq!((status, m["stop_reason"].as_str()), (200, Some("tool_use")), "{m}");
    let block = m["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").unwrap();
    assert!(block["id"].as_str().unwrap().starts_with("toolu_") && block["input"]["city"].is_string(), "{block}");
    let events = typed_events(&s, "/v1/messages", body(true)).await;
    let partial: String =
        of_type(&events, "content_block_delta").filter_map(|e| e["delta"]["partial_json"].as_str()).collect();
    assert_eq!(serde_json::from_str::<Value>(&partial).unwrap(), block["input"]);
    let start = of_type(&events, "content_block_start").next().unwrap();
    assert_eq!(
        (&start["content_block"]["type"], &start["content_block"]["name"]),
        (&json!("tool_use"), &json!("get_weather"))
    );
    let (status, m) = post(
        &s,
        "/v1/messages",
        json!({"model": TOOLS_FIXTURE, "max_tokens": 1, "tools": tools, "tool_choice": {"type": "none"}, "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "18 C"}]}]}]}),
    )
    .await;
    assert_eq!(status, 200, "{m}");
    let input = m["usage"]["input_tokens"].as_u64().unwrap() + m["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    let (_, chat) = post(&s, "/v1/chat/completions", chat_prompt(&json!({"city": "Paris"}).to_string())).await;
    assert_eq!(Some(input), chat["usage"]["prompt_tokens"].as_u64(), "{m} {chat}");

    // Ollama: calls with object arguments in the history, results as `tool` messages.
    let (status, o) = post(
        &s,
        "/api/chat",
        json!({"model": TOOLS_FIXTURE, "stream": false, "options": {"num_predict": 1},
               "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": schema}}],
               "messages": [{"role": "user", "content": question},
                            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                            {"role": "tool", "content": "18 C"}]}),
    )
    .await;
    assert_eq!(status, 200, "{o}");
    assert!(o["prompt_eval_count"].as_u64().unwrap() > 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_comes_as_each_dialects_thinking() {
    let thinking = FixtureCopy::thinking("tiny-qwen3-f32");
    let name = thinking.path().file_name().unwrap().to_string_lossy().to_string();
    let s = server_for(thinking.path(), &[]).await;
    let (_, chat) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": name, "max_tokens": 10, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    let reasoning = chat["choices"][0]["message"]["reasoning_content"].as_str().unwrap_or_else(|| panic!("{chat}"));
    assert!(!reasoning.is_empty());

    let (_, m) = post(
        &s,
        "/v1/messages",
        json!({"model": name, "max_tokens": 10, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(
        (&m["content"][0]["type"], &m["content"][0]["thinking"]),
        (&json!("thinking"), &json!(reasoning)),
        "{m}"
    );
    let events = typed_events(
        &s,
        "/v1/messages",
        json!({"model": name, "max_tokens": 10, "temperature": 0, "stream": true, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    let streamed: String =
        of_type(&events, "content_block_delta").filter_map(|e| e["delta"]["thinking"].as_str()).collect();
    assert_eq!(streamed, reasoning);

    let (_, r) =
        post(&s, "/v1/responses", json!({"model": name, "max_output_tokens": 10, "temperature": 0, "input": "Hi"}))
            .await;
    let item = &r["output"][0];
    assert_eq!((&item["type"], &item["content"][0]["text"]), (&json!("reasoning"), &json!(reasoning)), "{r}");
    assert!(r["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap() > 0, "{r}");

    let (_, o) = post(
        &s,
        "/api/chat",
        json!({"model": name, "stream": false, "options": {"temperature": 0, "num_predict": 10}, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(o["message"]["thinking"], reasoning, "{o}");

    // A budget of 3 thinking tokens: the same first 3, then `</think>` forced and the answer.
    let (status, budgeted) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": name, "max_tokens": 10, "temperature": 0, "ignore_eos": true, "thinking_token_budget": 3,
               "logprobs": true, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{budgeted}");
    let short = budgeted["choices"][0]["message"]["reasoning_content"].as_str().unwrap_or_else(|| panic!("{budgeted}"));
    assert!(reasoning.starts_with(short) && short.len() < reasoning.len(), "{short:?} of {reasoning:?}");
    assert!(budgeted["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{budgeted}");
    let tokens = budgeted["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let (n, chat_short) = (tokens.len(), short.to_string());
    assert_eq!(n, 10);
    let (_, m) = post(
        &s,
        "/v1/messages",
        json!({"model": name, "max_tokens": 10, "temperature": 0, "thinking": {"type": "enabled", "budget_tokens": 3},
               "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(m["content"][0]["thinking"], chat_short, "{m}");
    // Structured outputs and required tool calls constrain the answer only: the same thinking
    // as without them (as with `tool_choice: auto`, whose call tag starts a grammar only in the
    // answer), then the JSON or the call.
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                        "additionalProperties": false});
    let weather = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                         "properties": {"city": {"type": "string", "maxLength": 4}}, "required": ["city"],
                         "additionalProperties": false}}}]);
    let json_schema = json!({"name": "ok", "schema": schema, "strict": true});
    let pairs = [
        (json!({}), json!({"response_format": {"type": "json_schema", "json_schema": json_schema}})),
        (json!({"tools": weather, "tool_choice": "auto"}), json!({"tools": weather, "tool_choice": "required"})),
    ];
    for (free, constrained) in pairs {
        let chat = |extra: Value| {
            let mut body = json!({"model": name, "max_tokens": 100, "temperature": 0, "thinking_token_budget": 3,
                                  "messages": [{"role": "user", "content": "Hi"}]});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            post(&s, "/v1/chat/completions", body)
        };
        let (_, free) = chat(free).await;
        let (status, r) = chat(constrained).await;
        assert_eq!(status, 200, "{r}");
        let (choice, message) = (&r["choices"][0], &r["choices"][0]["message"]);
        let thought = &free["choices"][0]["message"]["reasoning_content"];
        assert!(thought.as_str().is_some_and(|t| !t.is_empty()) && message["reasoning_content"] == *thought, "{r}");
        if let Some(content) = message["content"].as_str() {
            let answer: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {r}"));
            assert!(answer["ok"].is_boolean() && choice["finish_reason"] == "stop", "{r}");
        } else {
            assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather", "{r}");
            assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
        }
    }
    let (status, err) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": name, "thinking_token_budget": -1, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!((status, err["error"]["param"].as_str()), (400, Some("thinking_token_budget")));
    s.shutdown().await;

    // Thinking off in each dialect's words: the template closes the think block (4 more tokens).
    let s = server_for(&fixture_dir("tiny-qwen3-f32"), &[]).await;
    let user = json!([{"role": "user", "content": "Hi"}]);
    let (_, on) =
        post(&s, "/v1/chat/completions", json!({"model": "tiny-qwen3-f32", "max_tokens": 1, "messages": user})).await;
    let on = on["usage"]["prompt_tokens"].as_u64().unwrap();
    let (_, m) = post(
        &s,
        "/v1/messages/count_tokens",
        json!({"model": "tiny-qwen3-f32", "thinking": {"type": "disabled"}, "messages": user}),
    )
    .await;
    assert_eq!(m["input_tokens"].as_u64(), Some(on + 4), "{m}");
    let (_, r) = post(
        &s,
        "/v1/responses",
        json!({"model": "tiny-qwen3-f32", "max_output_tokens": 1, "reasoning": {"effort": "none"}, "input": user}),
    )
    .await;
    assert_eq!(r["usage"]["input_tokens"].as_u64(), Some(on + 4), "{r}");
    // OpenAI's chat `reasoning_effort` too; a template variable the request sets wins.
    let chat = |extra: Value| {
        let mut body = json!({"model": "tiny-qwen3-f32", "max_tokens": 1, "messages": user});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let (_, c) = post(&s, "/v1/chat/completions", chat(json!({"reasoning_effort": "none"}))).await;
    assert_eq!(c["usage"]["prompt_tokens"].as_u64(), Some(on + 4), "{c}");
    let both = json!({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": true}});
    let (_, c) = post(&s, "/v1/chat/completions", chat(both)).await;
    assert_eq!(c["usage"]["prompt_tokens"].as_u64(), Some(on), "{c}");
    let (status, c) = post(&s, "/v1/chat/completions", chat(json!({"reasoning_effort": "lots"}))).await;
    assert_eq!((status, c["error"]["param"].as_str()), (400, Some("reasoning_effort")), "{c}");
    let (_, o) = post(&s, "/api/chat", json!({"model": "tiny-qwen3-f32", "stream": false, "think": false, "options": {"num_predict": 1}, "messages": user})).await;
    assert_eq!(o["prompt_eval_count"].as_u64(), Some(on + 4), "{o}");
    let (_, show) = post(&s, "/api/show", json!({"model": "tiny-qwen3-f32"})).await;
    assert!(show["capabilities"].as_array().unwrap().contains(&json!("thinking")), "{show}");
    // A constraint with thinking off applies from the first token: not even a favoured
    // `<think>` gets in. With thinking on, the first token may open the block.
    let think = Tokenizer::from_dir(&fixture_dir("tiny-qwen3-f32")).unwrap().token_to_id("<think>").unwrap();
    for on in [false, true] {
        let body = json!({"model": "tiny-qwen3-f32", "max_tokens": 40, "temperature": 0, "messages": user,
                          "logit_bias": {think.to_string(): 100}, "chat_template_kwargs": {"enable_thinking": on},
                          "thinking_token_budget": 1, "logprobs": true,
                          "response_format": {"type": "json_schema", "json_schema": json_schema.clone()}});
        let (status, r) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{r}");
        let content = r["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{r}"));
        let answer: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {r}"));
        assert!(answer["ok"].is_boolean(), "{r}");
        assert_eq!(r["choices"][0]["logprobs"]["content"][0]["token"] == "<think>", on, "{r}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_come_in_each_dialects_shape_and_change_nothing() {
    let s = server_for(&fixture_dir(FIXTURE), &[("server.max_body_bytes", "4096")]).await;
    let good =
        json!({"model": FIXTURE, "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]});
    let (_, before) = post(&s, "/v1/messages", good.clone()).await;
    let anthropic = [
        (json!({"model": FIXTURE, "messages": []}), 400, "invalid_request_error"),
        (json!({"model": "claude-opus", "max_tokens": 4, "messages": []}), 404, "not_found_error"),
        (
            json!({"model": FIXTURE, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"model": FIXTURE, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"model": FIXTURE, "max_tokens": 4, "tool_choice": {"type": "sometimes"}, "messages": [{"role": "user", "content": "x"}]}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"model": FIXTURE, "max_tokens": 4, "tools": [{"type": "web_search_20250305", "name": "web_search"}], "messages": [{"role": "user", "content": "x"}]}),
            400,
            "invalid_request_error",
        ),
        (
            json!({"model": FIXTURE, "max_tokens": 4, "messages": [{"role": "user", "content": "x".repeat(5000)}]}),
            413,
            "request_too_large",
        ),
    ];
    for (i, (body, status, kind)) in anthropic.into_iter().enumerate() {
        let (got, err) = post(&s, "/v1/messages", body).await;
        assert_eq!(
            (got, err["type"].as_str(), err["error"]["type"].as_str()),
            (status, Some("error"), Some(kind)),
            "case {i}: {err}"
        );
        assert!(err["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "case {i}");
    }
    let (status, err) = post(&s, "/v1/messages/count_tokens", json!({"model": "nope", "messages": []})).await;
    assert_eq!((status, err["error"]["type"].as_str()), (404, Some("not_found_error")));

    let responses = [
        (json!({"model": FIXTURE, "input": [{"type": "input_image", "image_url": "x"}]}), "input[0].type"),
        (json!({"model": FIXTURE, "input": "x", "previous_response_id": "resp_nope"}), "previous_response_id"),
        (json!({"model": FIXTURE, "input": "x", "max_output_tokens": 0}), "max_output_tokens"),
        (json!({"model": FIXTURE, "input": "x", "tools": [{"type": "web_search"}]}), "tools[0].type"),
        (json!({"model": FIXTURE, "input": "x", "reasoning": {"effort": "lots"}}), "reasoning.effort"),
        (json!({"model": FIXTURE, "input": [{"role": "robot", "content": "x"}]}), "input[0].role"),
    ];
    for (i, (body, param)) in responses.into_iter().enumerate() {
        let (status, err) = post(&s, "/v1/responses", body).await;
        assert_eq!((status, err["error"]["param"].as_str()), (400, Some(param)), "case {i}: {err}");
        assert_eq!(err["error"]["type"], "invalid_request_error");
    }
    assert_eq!(get(&s, "/v1/responses/resp_nope").await.0, 404);

    let ollama = [
        (json!({"model": "llama3", "messages": []}), 404),
        (json!({"model": FIXTURE, "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 0}}), 400),
        (json!({"model": FIXTURE, "messages": [{"role": "user", "content": "x"}], "format": 5}), 400),
        (json!({"model": FIXTURE, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}), 400),
        (json!({"model": FIXTURE, "messages": [{"role": "user", "content": "x"}], "think": "maybe"}), 400),
    ];
    for (i, (body, status)) in ollama.into_iter().enumerate() {
        let (got, err) = post(&s, "/api/chat", body).await;
        assert_eq!(got, status, "case {i}: {err}");
        assert!(err["error"].as_str().is_some_and(|m| !m.is_empty()), "case {i}: {err}");
    }
    let raw = reqwest::Client::new().post(url(&s, "/api/generate")).body("{oops").send().await.unwrap();
    assert_eq!(raw.status().as_u16(), 400);
    assert!(raw.json::<Value>().await.unwrap()["error"].is_string());

    let (status, after) = post(&s, "/v1/messages", good).await;
    assert_eq!((status, message_text(&after)), (200, message_text(&before)), "the server still answers the same");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_taken_as_bearer_or_x_api_key_and_refused_in_the_routes_shape() {
    let s = server_for(&fixture_dir(FIXTURE), &[("server.api_keys", r#"["sk-test"]"#)]).await;
    let client = reqwest::Client::new();
    let body = json!({"model": FIXTURE, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]});
    let with_x = client.post(url(&s, "/v1/messages")).header("x-api-key", "sk-test").json(&body).send().await.unwrap();
    assert_eq!(with_x.status().as_u16(), 200);
    let without = client.post(url(&s, "/v1/messages")).json(&body).send().await.unwrap();
    assert_eq!(without.status().as_u16(), 401);
    assert_eq!(without.json::<Value>().await.unwrap()["error"]["type"], "authentication_error");
    let tags = client.get(url(&s, "/api/tags")).header("x-api-key", "sk-wrong").send().await.unwrap();
    assert_eq!(tags.status().as_u16(), 401);
    assert!(tags.json::<Value>().await.unwrap()["error"].is_string(), "Ollama's shape");
    let tags = client.get(url(&s, "/api/tags")).bearer_auth("sk-test").send().await.unwrap();
    assert_eq!(tags.status().as_u16(), 200);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_listed_origins_only() {
    let s = server_for(&fixture_dir(FIXTURE), &[("server.cors_origins", r#"["https://app.example"]"#)]).await;
    let client = reqwest::Client::new();
    let preflight = |origin: &'static str| {
        client
            .request(reqwest::Method::OPTIONS, url(&s, "/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization, content-type")
            .send()
    };
    let ok = preflight("https://app.example").await.unwrap();
    assert_eq!(ok.status().as_u16(), 204);
    assert_eq!(ok.headers()["access-control-allow-origin"], "https://app.example");
    assert_eq!(ok.headers()["access-control-allow-headers"], "authorization, content-type");
    assert!(ok.headers()["access-control-allow-methods"].to_str().unwrap().contains("POST"));
    let other = preflight("https://evil.example").await.unwrap();
    assert!(!other.headers().contains_key("access-control-allow-origin"));
    let models = client.get(url(&s, "/v1/models")).header("origin", "https://app.example").send().await.unwrap();
    assert_eq!(models.headers()["access-control-allow-origin"], "https://app.example");
    assert_eq!(models.headers()["access-control-expose-headers"], "x-request-id, retry-after");
    s.shutdown().await;

    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let models = client.get(url(&s, "/v1/models")).header("origin", "https://app.example").send().await.unwrap();
    assert!(!models.headers().contains_key("access-control-allow-origin"), "off by default");
    s.shutdown().await;
    let path = format!("{:?}", fixture_dir(FIXTURE).display().to_string());
    for origin in [r#"["https://app.example/"]"#, r#"["app.example"]"#] {
        let settings = [("model.path".to_string(), path.clone()), ("server.cors_origins".to_string(), origin.into())];
        let bad = llaisys_server::Config::load(None, std::iter::empty(), &settings);
        assert!(bad.is_err_and(|e| e.to_string().contains("server.cors_origins")), "{origin}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_lists_shows_and_reports_the_served_models() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let (_, version) = get(&s, "/api/version").await;
    assert!(version["version"].as_str().is_some_and(|v| v.split('.').count() == 3), "{version}");
    let (_, tags) = get(&s, "/api/tags").await;
    assert_eq!(tags["models"][0]["name"], FIXTURE);
    assert_eq!(tags["models"][0]["details"]["family"], "qwen2");
    // The weight files' size, format, type, parameters, and (once worked out) their sha256.
    // The fixture's weights are in five shards.
    let shards: Vec<Vec<u8>> = (1..=5)
        .map(|i| std::fs::read(fixture_dir(FIXTURE).join(format!("model-0000{i}-of-00005.safetensors"))).unwrap())
        .collect();
    let header = |w: &[u8]| u64::from_le_bytes(w[..8].try_into().unwrap()) as usize;
    let parameters: usize = shards.iter().map(|w| (w.len() - 8 - header(w)) / 4).sum();
    let weights = shards.concat();
    let shown = match parameters {
        n if n >= 1_000_000 => format!("{:.2}M", n as f64 / 1e6),
        n => format!("{:.2}K", n as f64 / 1e3),
    };
    let entry = &tags["models"][0];
    assert_eq!(entry["size"].as_u64(), Some(weights.len() as u64), "{tags}");
    let details = &entry["details"];
    assert_eq!((&details["format"], &details["quantization_level"]), (&json!("safetensors"), &json!("F32")), "{tags}");
    assert_eq!(details["parameter_size"], shown, "{tags}");
    let sha: String = sha2::Sha256::digest(&weights).iter().map(|b| format!("{b:02x}")).collect();
    let mut digest = String::new();
    for _ in 0..100 {
        digest = get(&s, "/api/tags").await.1["models"][0]["digest"].as_str().unwrap_or_default().to_string();
        if !digest.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(digest, sha);
    let (_, ps) = get(&s, "/api/ps").await;
    assert_eq!(ps["models"][0]["context_length"], 256, "{ps}");
    assert_eq!(ps["models"][0]["size"], entry["size"], "{ps}");
    let (status, show) = post(&s, "/api/show", json!({"model": FIXTURE})).await;
    assert_eq!(status, 200, "{show}");
    assert_eq!(show["model_info"]["general.architecture"], "qwen2");
    assert_eq!(show["model_info"]["general.parameter_count"].as_u64(), Some(parameters as u64), "{show}");
    assert!(show["template"].as_str().unwrap().contains("im_start"), "the chat template's source");
    assert!(show["capabilities"].as_array().unwrap().contains(&json!("completion")));
    let (status, _) = post(&s, "/api/show", json!({"model": "nope"})).await;
    assert_eq!(status, 404);
    let (status, load) = post(&s, "/api/generate", json!({"model": FIXTURE})).await;
    assert_eq!((status, load["done_reason"].as_str()), (200, Some("load")), "an empty prompt loads the model");
    s.shutdown().await;

    // A GGUF split in parts: all of them count.
    let parts = fixture_dir("gguf").join("split");
    let s = server_for(&parts, &[]).await;
    let (_, tags) = get(&s, "/api/tags").await;
    let size: u64 = std::fs::read_dir(&parts).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    let entry = &tags["models"][0];
    assert_eq!(entry["size"].as_u64(), Some(size), "{tags}");
    let details = &entry["details"];
    assert_eq!((&details["format"], &details["quantization_level"]), (&json!("gguf"), &json!("Q8_0")), "{tags}");
    s.shutdown().await;
}

/// Ollama's `logprobs` and `top_logprobs`: `/api/chat` gives chat completions' `logprobs.content`
/// as its `logprobs`, whole or line by line with the tokens of each line's text; `/api/generate`
/// (raw) gives completions' log-probabilities; `top_logprobs` past 20 is refused, and without
/// `logprobs` nothing is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_logprobs_are_chat_completions_logprobs() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let messages = json!([{"role": "user", "content": "Hello there"}]);
    let body = json!({"model": FIXTURE, "messages": messages, "max_tokens": 6, "temperature": 0, "logprobs": true,
        "top_logprobs": 2});
    let (status, chat) = post(&s, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{chat}");
    let want = &chat["choices"][0]["logprobs"]["content"];
    assert_eq!(want.as_array().map(Vec::len), Some(6), "{chat}");
    let ollama = json!({"model": FIXTURE, "messages": messages, "options": {"num_predict": 6, "temperature": 0},
        "logprobs": true, "top_logprobs": 2, "stream": false});
    let (status, r) = post(&s, "/api/chat", ollama.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert!(nearly(&r["logprobs"], want), "{r} against {want}");
    let mut streamed = ollama.clone();
    streamed["stream"] = true.into();
    let lines = ndjson(&s, "/api/chat", streamed).await;
    let pieces: Vec<Value> = lines.iter().flat_map(|l| l["logprobs"].as_array().cloned().unwrap_or_default()).collect();
    assert!(nearly(&Value::from(pieces), want), "{lines:?}");
    for line in lines.iter().filter(|l| l["done"] == false) {
        let text: String = line["logprobs"].as_array().unwrap().iter().map(|t| t["token"].as_str().unwrap()).collect();
        assert_eq!(line["message"]["content"].as_str(), Some(text.as_str()), "a line's tokens are its text: {line}");
    }
    // Generate, raw: the completions API's figures.
    let body =
        json!({"model": FIXTURE, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logprobs": 1});
    let (_, c) = post(&s, "/v1/completions", body).await;
    let generate = json!({"model": FIXTURE, "prompt": "Once upon a time", "raw": true, "stream": false,
        "options": {"num_predict": 5, "temperature": 0}, "logprobs": true, "top_logprobs": 1});
    let (status, r) = post(&s, "/api/generate", generate).await;
    assert_eq!(status, 200, "{r}");
    let (got, want) = (r["logprobs"].as_array().unwrap(), &c["choices"][0]["logprobs"]);
    assert_eq!(got.len(), 5, "{r}");
    for (i, t) in got.iter().enumerate() {
        assert_eq!(&t["token"], &want["tokens"][i], "{t}");
        assert!(nearly(&t["logprob"], &want["token_logprobs"][i]), "{t}");
        let alternative = &t["top_logprobs"][0];
        assert!(
            nearly(&want["top_logprobs"][i][alternative["token"].as_str().unwrap()], &alternative["logprob"]),
            "{t}"
        );
    }
    let mut none = ollama.clone();
    none["logprobs"] = false.into();
    let (_, r) = post(&s, "/api/chat", none).await;
    assert!(r.get("logprobs").is_none(), "{r}");
    let mut too_many = ollama;
    too_many["top_logprobs"] = 21.into();
    let (status, err) = post(&s, "/api/chat", too_many).await;
    assert_eq!(status, 400, "{err}");
    assert!(err["error"].as_str().is_some_and(|e| e.contains("top_logprobs")), "{err}");
    s.shutdown().await;
}

/// Fill in the middle: OpenAI's completions with `suffix`, Ollama's generate with `suffix` and
/// llama.cpp's `/infill` each answer what the same prompt written in the model's FIM tokens by
/// hand gets (the middle's own stop tokens with it), streamed or not; `/infill` writes Qwen's
/// repository format before it, as llama.cpp does, with its context files, and leaves out, and
/// says so, those that do not fit; bad requests and a model without the tokens are refused
/// naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_in_the_middle_in_every_dialect() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let tokenizer = Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap();
    let stops: Vec<u32> =
        ["<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"].iter().map(|t| tokenizer.token_to_id(t).unwrap()).collect();
    // The greedy answer to a prompt written by hand: its text, and its usage and finish.
    let by_hand = async |prompt: &str, max_tokens: usize| {
        let body = json!({"model": FIXTURE, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                          "stop_token_ids": stops});
        let (status, r) = post(&s, "/v1/completions", body).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["usage"]["prompt_tokens"].as_u64(), Some(tokenizer.encode(prompt).unwrap().len() as u64));
        (
            r["choices"][0]["text"].as_str().unwrap().to_string(),
            r["usage"].clone(),
            r["choices"][0]["finish_reason"].clone(),
        )
    };
    let (prefix, typed, suffix) = ("def add(a, b):\n", "    c = ", "\n    return c\n");
    let psm = format!("<|fim_prefix|>{prefix}{typed}<|fim_suffix|>{suffix}<|fim_middle|>");
    let (text, usage, _) = by_hand(&psm, 8).await;

    let (status, c) = post(
        &s,
        "/v1/completions",
        json!({"model": FIXTURE, "prompt": format!("{prefix}{typed}"), "suffix": suffix, "max_tokens": 8, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{c}");
    let counts = |u: &Value| (u["prompt_tokens"].clone(), u["completion_tokens"].clone());
    assert_eq!((c["choices"][0]["text"].as_str(), counts(&c["usage"])), (Some(text.as_str()), counts(&usage)));

    let (status, g) = post(
        &s,
        "/api/generate",
        json!({"model": FIXTURE, "prompt": format!("{prefix}{typed}"), "suffix": suffix, "stream": false,
               "options": {"temperature": 0, "num_predict": 8}}),
    )
    .await;
    assert_eq!(status, 200, "{g}");
    assert_eq!((g["response"].as_str(), &g["prompt_eval_count"]), (Some(text.as_str()), &usage["prompt_tokens"]));

    // llama.cpp's /infill: the repository format with its names.
    let repo = format!("<|repo_name|>myproject\n<|file_sep|>filename\n{psm}");
    let (text, usage, finish) = by_hand(&repo, 8).await;
    let infill = |stream: bool| {
        json!({"input_prefix": prefix, "prompt": typed, "input_suffix": suffix, "n_predict": 8,
               "temperature": 0, "stream": stream, "samplers": ["top_k"], "t_max_predict_ms": 500})
    };
    let (status, i) = post(&s, "/infill", infill(false)).await;
    assert_eq!(status, 200, "{i}");
    assert_eq!((i["content"].as_str(), &i["stop"]), (Some(text.as_str()), &json!(true)));
    assert_eq!(
        (&i["tokens_evaluated"], &i["tokens_predicted"]),
        (&usage["prompt_tokens"], &usage["completion_tokens"])
    );
    assert_eq!(i["stop_type"], if finish == "length" { "limit" } else { "eos" });
    assert_eq!((&i["truncated"], &i["timings"]["prompt_n"]), (&json!(false), &usage["prompt_tokens"]));
    let tokens: Vec<u32> = serde_json::from_value(i["tokens"].clone()).unwrap();
    assert_eq!(tokenizer.decode(&tokens, true).unwrap(), text);
    let chunks = common::sse_json(&s, "/infill", infill(true)).await;
    let (last, pieces) = chunks.split_last().unwrap();
    assert!(pieces.iter().all(|p| p["stop"] == false) && last["stop"] == true, "{chunks:?}");
    assert_eq!(pieces.iter().map(|p| p["content"].as_str().unwrap()).collect::<String>(), text);
    assert_eq!(last["timings"]["predicted_n"], i["tokens_predicted"]);

    // Context files before the edited file's name.
    let extra = json!([{"filename": "util.py", "text": "import math\n"}, {"filename": "b.py", "text": "B = 2\n"}]);
    let first = "<|file_sep|>util.py\nimport math\n";
    let with_files = format!("<|repo_name|>myproject\n{first}<|file_sep|>b.py\nB = 2\n<|file_sep|>filename\n{psm}");
    let (text, usage, _) = by_hand(&with_files, 4).await;
    let (status, i) = post(
        &s,
        "/infill",
        json!({"input_prefix": prefix, "prompt": typed, "input_suffix": suffix, "input_extra": extra, "n_predict": 4,
               "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{i}");
    assert_eq!((i["content"].as_str(), &i["tokens_evaluated"]), (Some(text.as_str()), &usage["prompt_tokens"]));
    assert_eq!((&i["truncated"], &i["context_files_left_out"]), (&json!(false), &json!(0)));
    // With room for the last file only (the context is 256 tokens; n_predict takes the rest).
    let all = usage["prompt_tokens"].as_u64().unwrap() as usize;
    let n_predict = 256 - all;
    let (status, i) = post(
        &s,
        "/infill",
        json!({"input_prefix": prefix, "prompt": typed, "input_suffix": suffix, "input_extra": extra,
               "n_predict": n_predict, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{i}");
    let kept = all - tokenizer.encode(first).unwrap().len();
    assert_eq!(i["tokens_evaluated"].as_u64(), Some(kept as u64), "{i}");
    assert_eq!((&i["truncated"], &i["context_files_left_out"]), (&json!(true), &json!(1)));
    // n_predict 0 evaluates the prompt and answers no text.
    let (status, i) =
        post(&s, "/infill", json!({"input_prefix": prefix, "input_suffix": suffix, "n_predict": 0})).await;
    assert_eq!((status, i["content"].as_str(), &i["tokens_predicted"]), (200, Some(""), &json!(0)), "{i}");

    let refused = [
        ("/v1/completions", json!({"model": FIXTURE, "prompt": [1, 2, 3], "suffix": "x"}), "prompt"),
        ("/v1/completions", json!({"model": FIXTURE, "prompt": "a", "suffix": "x", "echo": true}), "echo"),
        ("/infill", json!({"input_prefix": "a"}), "input_suffix"),
        ("/infill", json!({"input_prefix": "a", "input_suffix": "b", "n_predict": -5}), "n_predict"),
        (
            "/infill",
            json!({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]}),
            "input_extra[0]",
        ),
    ];
    for (path, body, param) in refused {
        let (status, err) = post(&s, path, body).await;
        assert_eq!((status, err["error"]["param"].as_str()), (400, Some(param)), "{path}: {err}");
    }
    let (status, err) =
        post(&s, "/api/generate", json!({"model": FIXTURE, "prompt": "a", "suffix": "b", "system": "terse"})).await;
    assert_eq!(status, 400, "{err}");
    assert!(err["error"].as_str().is_some_and(|m| m.contains("suffix")), "{err}");
    s.shutdown().await;

    // Llama 3's vocabulary has no fill-in-the-middle tokens.
    let llama = server_for(&fixture_dir("tiny-llama-f32"), &[]).await;
    let (status, err) = post(&llama, "/infill", json!({"input_prefix": "a", "input_suffix": "b"})).await;
    assert_eq!((status, err["error"]["param"].as_str()), (400, Some("suffix")), "{err}");
    let (status, err) =
        post(&llama, "/v1/completions", json!({"model": "tiny-llama-f32", "prompt": "a", "suffix": "b"})).await;
    assert_eq!((status, err["error"]["param"].as_str()), (400, Some("suffix")), "{err}");
    llama.shutdown().await;
}

/// llama.cpp's `/completion` (and `/completions`) continues a prompt, text or token ids, as
/// `/v1/completions` does, in llama.cpp's shape, streamed or not; a prompt of mixed parts is
/// refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_completion_answers_as_openai_completions() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let prompt = "Once upon a time";
    let (status, c) =
        post(&s, "/v1/completions", json!({"model": FIXTURE, "prompt": prompt, "max_tokens": 6, "temperature": 0}))
            .await;
    assert_eq!(status, 200, "{c}");
    let text = c["choices"][0]["text"].as_str().unwrap().to_string();
    let (prompt_tokens, completion_tokens) = (&c["usage"]["prompt_tokens"], &c["usage"]["completion_tokens"]);
    let ids = Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap().encode_prompt(prompt).unwrap();
    for (path, prompt) in [("/completion", json!(prompt)), ("/completions", json!(prompt)), ("/completion", json!(ids))]
    {
        let body = json!({"prompt": prompt, "n_predict": 6, "temperature": 0, "cache_prompt": true});
        let (status, r) = post(&s, path, body).await;
        assert_eq!(status, 200, "{path}: {r}");
        assert_eq!((r["content"].as_str(), &r["stop"]), (Some(text.as_str()), &json!(true)), "{path}: {r}");
        assert_eq!((&r["tokens_evaluated"], &r["tokens_predicted"]), (prompt_tokens, completion_tokens), "{r}");
        assert!(r.get("context_files_left_out").is_none(), "{r}");
    }
    let streamed = json!({"prompt": prompt, "n_predict": 6, "temperature": 0, "stream": true});
    let chunks = common::sse_json(&s, "/completion", streamed).await;
    let (last, pieces) = chunks.split_last().unwrap();
    assert!(pieces.iter().all(|p| p["stop"] == false) && last["stop"] == true, "{chunks:?}");
    assert_eq!(pieces.iter().map(|p| p["content"].as_str().unwrap()).collect::<String>(), text);
    assert_eq!(&last["tokens_predicted"], completion_tokens);
    for (body, param) in [
        (json!({"prompt": prompt, "t_max_predict_ms": -5}), "t_max_predict_ms"),
        (json!({"prompt": [1, "two"]}), "prompt"),
        (json!({"n_predict": 4}), "prompt"),
    ] {
        let (status, err) = post(&s, "/completion", body).await;
        assert_eq!((status, err["error"]["param"].as_str()), (400, Some(param)), "{err}");
    }
    s.shutdown().await;
}

/// OpenAI's completions with `echo` and `logprobs` (how lm-evaluation-harness scores a
/// continuation): the echoed prompt's tokens come first, the first with null, each other's
/// log-probability given the tokens before it, with alternatives: transformers' (their best two
/// and the gap between them), the same whether or not the prompt was cached, and what a
/// generated token's log-probability was where the prompt holds the generated tokens; streamed,
/// the echo comes with them before the first token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_prompts_come_with_their_tokens_log_probabilities() {
    // An f32 cache, to compare with transformers' figures closely.
    let s = server_for(&fixture_dir(FIXTURE), &[("engine.kv_dtype", "\"f32\"")]).await;
    let tokenizer = Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap();
    let piece = |id: u32| String::from_utf8_lossy(&tokenizer.token_bytes(id).unwrap_or_default()).into_owned();
    let reference = llaisys_tests::Reference::load(FIXTURE);
    let p = &reference.prompts[0];
    let n = p.ids.len();
    let body =
        json!({"model": FIXTURE, "prompt": p.ids, "echo": true, "logprobs": 3, "max_tokens": 3, "temperature": 0});
    let (status, first) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{first}");
    let lp = &first["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n + 3, "{lp}");
    assert_eq!(
        (&lp["token_logprobs"][0], &lp["top_logprobs"][0], &lp["text_offset"][0]),
        (&Value::Null, &Value::Null, &json!(0))
    );
    let tokens: String = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(first["choices"][0]["text"].as_str(), Some(tokens.as_str()), "the echo and the answer, token by token");
    let mut checked = 0;
    for pos in 1..n {
        assert_eq!(lp["tokens"][pos], piece(p.ids[pos]));
        let logprob = lp["token_logprobs"][pos].as_f64().unwrap();
        let top = lp["top_logprobs"][pos].as_object().unwrap();
        // transformers' best two after position pos - 1, and the gap between them (the legacy
        // shape keys alternatives by text: where two of the fixture's pieces read the same,
        // one hides the other).
        let want = &p.topk[pos - 1];
        let pieces: Vec<String> = want.ids[..3].iter().map(|&id| piece(id)).collect();
        if pieces[1..].contains(&pieces[0]) || pieces[2] == pieces[1] {
            continue;
        }
        checked += 1;
        assert_eq!(top.len(), 3, "{lp}");
        let (a, b) = (&top[&pieces[0]], &top[&pieces[1]]);
        let gap = a.as_f64().unwrap() - b.as_f64().unwrap();
        assert!(
            (gap - f64::from(want.logits[0] - want.logits[1])).abs() < 1e-3,
            "position {pos}: {gap} against {want:?}"
        );
        assert!(logprob <= a.as_f64().unwrap() + 1e-6 && logprob < 0.0, "position {pos}: {logprob} {top:?}");
    }
    assert!(checked >= n / 2, "{checked} of {n} positions checked");
    // The first generated token's, against transformers' whole last row.
    let last = &p.last_logits;
    let max = last.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = f64::from(max) + last.iter().map(|l| f64::from(l - max).exp()).sum::<f64>().ln();
    let want = f64::from(last[p.greedy[0] as usize]) - log_z;
    assert!((lp["token_logprobs"][n].as_f64().unwrap() - want).abs() < 1e-3, "{lp}");
    // Again, its prompt now cached: computed whole again, the same figures.
    let (_, again) = post(&s, "/v1/completions", body.clone()).await;
    let close = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) => (a - b).abs() < 1e-4,
        _ => a == b,
    };
    let same = |a: &Value, b: &Value, what: &str| {
        let (a, b) = (a["token_logprobs"].as_array().unwrap(), b["token_logprobs"].as_array().unwrap());
        assert!(a.len() == b.len() && a.iter().zip(b).all(|(a, b)| close(a, b)), "{what}: {a:?} against {b:?}");
    };
    same(&again["choices"][0]["logprobs"], lp, "cached");
    // The generated tokens in the prompt: their log-probabilities, computed in one pass.
    let prompt = [&p.ids[..], &p.greedy[..3]].concat();
    let longer = json!({"model": FIXTURE, "prompt": prompt, "echo": true, "logprobs": 3,
        "max_tokens": 1, "temperature": 0});
    let (_, longer) = post(&s, "/v1/completions", longer).await;
    let longer = &longer["choices"][0]["logprobs"]["token_logprobs"];
    for k in n..n + 3 {
        assert!(
            close(&longer[k], &lp["token_logprobs"][k]),
            "token {k}: {} against {}",
            longer[k],
            lp["token_logprobs"][k]
        );
    }
    // Streamed: the echo with its figures first, then each token.
    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    let chunks = common::sse_json(&s, "/v1/completions", streamed).await;
    let echo = &chunks[0]["choices"][0];
    let prompt_text: String = lp["tokens"].as_array().unwrap()[..n].iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(echo["text"].as_str(), Some(prompt_text.as_str()), "{echo}");
    let echoed = &echo["logprobs"];
    assert_eq!(echoed["tokens"].as_array().unwrap().len(), n, "{echo}");
    let whole = json!({"token_logprobs": lp["token_logprobs"].as_array().unwrap()[..n]});
    same(echoed, &whole, "streamed");
    // max_tokens 0: the prompt alone, scored (streamed too), as OpenAI's legacy API and vLLM
    // answer it; without echo it is still refused.
    let mut scoring = body.clone();
    scoring["max_tokens"] = 0.into();
    let (status, only) = post(&s, "/v1/completions", scoring.clone()).await;
    assert_eq!(status, 200, "{only}");
    let choice = &only["choices"][0];
    assert_eq!((choice["text"].as_str(), &choice["finish_reason"]), (Some(prompt_text.as_str()), &json!("length")));
    assert_eq!((&only["usage"]["completion_tokens"], &only["usage"]["prompt_tokens"]), (&json!(0), &json!(n)));
    same(&choice["logprobs"], &whole, "echo only");
    scoring["stream"] = true.into();
    let chunks = common::sse_json(&s, "/v1/completions", scoring).await;
    let text: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(text, prompt_text, "{chunks:?}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length", "{chunks:?}");
    let (status, _) = post(&s, "/v1/completions", json!({"model": FIXTURE, "prompt": p.ids, "max_tokens": 0})).await;
    assert_eq!(status, 400, "max_tokens 0 without echo");
    // vLLM's prompt_logprobs: by token id, with ranks, on completions' choices and on a chat.
    let (status, v) = post(
        &s,
        "/v1/completions",
        json!({"model": FIXTURE, "prompt": p.ids, "prompt_logprobs": 2,
        "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let rows = v["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!((rows.len(), &rows[0]), (n, &Value::Null), "{v}");
    for pos in 1..n {
        let row = rows[pos].as_object().unwrap();
        let own = &row[&p.ids[pos].to_string()];
        assert!(close(&own["logprob"], &lp["token_logprobs"][pos]), "{own} against {}", lp["token_logprobs"][pos]);
        assert_eq!(own["decoded_token"], lp["tokens"][pos]);
        let rank = own["rank"].as_u64().unwrap();
        let ranks: Vec<u64> = row.values().map(|e| e["rank"].as_u64().unwrap()).collect();
        assert!(ranks.contains(&1) && ranks.contains(&2) && rank >= 1, "{row:?}");
        assert_eq!(row.len(), if rank <= 2 { 2 } else { 3 }, "the prompt token, and the best two: {row:?}");
    }
    let chat = json!({"model": FIXTURE, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 1,
        "prompt_logprobs": 0});
    let (status, c) = post(&s, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(status, 200, "{c}");
    let rows = c["prompt_logprobs"].as_array().unwrap();
    assert_eq!(Some(rows.len() as u64), c["usage"]["prompt_tokens"].as_u64(), "{c}");
    assert!(rows[1..].iter().all(|r| r.as_object().is_some_and(|r| r.len() == 1)), "the prompt token alone: {c}");
    for (bad, why) in [(json!({"stream": true}), "a stream"), (json!({"prompt_logprobs": 21}), "past 20")] {
        let mut body = chat.clone();
        body.as_object_mut().unwrap().extend(bad.as_object().unwrap().clone());
        let (status, err) = post(&s, "/v1/chat/completions", body).await;
        assert_eq!((status, err["error"]["param"].as_str()), (400, Some("prompt_logprobs")), "{why}: {err}");
    }
    // Echo alone, or logprobs alone: no prompt figures.
    let (_, plain) =
        post(&s, "/v1/completions", json!({"model": FIXTURE, "prompt": p.ids, "echo": true, "max_tokens": 2})).await;
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null, "{plain}");
    let (_, alone) =
        post(&s, "/v1/completions", json!({"model": FIXTURE, "prompt": p.ids, "logprobs": 1, "max_tokens": 2})).await;
    assert_eq!(alone["choices"][0]["logprobs"]["tokens"].as_array().map(Vec::len), Some(2), "{alone}");
    s.shutdown().await;
    // A prompt computed four tokens a step: each step's rows give the next ones, the same.
    let settings = [("engine.kv_dtype", "\"f32\""), ("engine.max_tokens_per_step", "4")];
    let s = server_for(&fixture_dir(FIXTURE), &settings).await;
    let (status, chunked) = post(&s, "/v1/completions", body).await;
    assert_eq!(status, 200, "{chunked}");
    same(&chunked["choices"][0]["logprobs"], lp, "chunked");
    s.shutdown().await;
}

/// vLLM's `return_token_ids`: a completion choice's `token_ids` and `prompt_token_ids`, a chat
/// choice's `token_ids` and its answer's `prompt_token_ids`; streamed, each chunk with the
/// tokens since the last (adding up to the whole) and the first with the prompt's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_ids_come_back_where_asked() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let tokenizer = Tokenizer::from_dir(&fixture_dir(FIXTURE)).unwrap();
    let p = &llaisys_tests::Reference::load(FIXTURE).prompts[0];
    let body = json!({"model": FIXTURE, "prompt": p.ids, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
        "return_token_ids": true});
    let (status, c) = post(&s, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{c}");
    let choice = &c["choices"][0];
    assert_eq!(choice["prompt_token_ids"], json!(p.ids), "{c}");
    assert_eq!(choice["token_ids"], json!(p.greedy[..6]), "{c}");
    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    let chunks = common::sse_json(&s, "/v1/completions", streamed).await;
    let ids: Vec<u64> = (chunks.iter())
        .flat_map(|c| c["choices"][0]["token_ids"].as_array().cloned().unwrap_or_default())
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(json!(ids), choice["token_ids"], "{chunks:?}");
    assert_eq!(chunks[0]["choices"][0]["prompt_token_ids"], json!(p.ids), "{chunks:?}");
    assert!(chunks[1..].iter().all(|c| c["choices"][0].get("prompt_token_ids").is_none()), "{chunks:?}");
    let chat = json!({"model": FIXTURE, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4,
        "temperature": 0, "return_token_ids": true});
    let (status, c) = post(&s, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{c}");
    let ids: Vec<u32> = serde_json::from_value(c["choices"][0]["token_ids"].clone()).unwrap();
    assert_eq!(ids.len() as u64, c["usage"]["completion_tokens"].as_u64().unwrap(), "{c}");
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), c["choices"][0]["message"]["content"].as_str().unwrap());
    let prompt: Vec<u32> = serde_json::from_value(c["prompt_token_ids"].clone()).unwrap();
    assert_eq!(prompt.len() as u64, c["usage"]["prompt_tokens"].as_u64().unwrap(), "{c}");
    assert!(tokenizer.decode(&prompt, false).unwrap().contains("Hello there"), "{c}");
    let (_, plain) = post(&s, "/v1/completions", json!({"model": FIXTURE, "prompt": p.ids, "max_tokens": 2})).await;
    assert!(plain["choices"][0].get("token_ids").is_none(), "only where asked: {plain}");
    s.shutdown().await;
}

/// llama.cpp's `n_probs`: `/completion` gives each token's log-probability and its best
/// alternatives' as `/v1/completions` gives them (`logprobs`), with ids and bytes, streamed or
/// not; `post_sampling_probs` gives the probabilities of the distribution drawn from (a greedy
/// token's is 1; under top-k 3 the three alternatives are all of it). Out of range is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_n_probs_are_the_openai_logprobs_in_llama_cpps_shape() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let prompt = "Once upon a time";
    let body = json!({"model": FIXTURE, "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3});
    let (status, c) = post(&s, "/v1/completions", body).await;
    assert_eq!(status, 200, "{c}");
    let openai = &c["choices"][0]["logprobs"];
    let close = nearly;
    let (status, r) =
        post(&s, "/completion", json!({"prompt": prompt, "n_predict": 6, "temperature": 0, "n_probs": 3})).await;
    assert_eq!(status, 200, "{r}");
    let probs = r["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 6, "{r}");
    for (i, p) in probs.iter().enumerate() {
        assert_eq!((&p["id"], &p["token"]), (&r["tokens"][i], &openai["tokens"][i]), "{p}");
        assert!(close(&p["logprob"], &openai["token_logprobs"][i]), "{p} against {openai}");
        let bytes: Vec<u8> = serde_json::from_value(p["bytes"].clone()).unwrap();
        assert_eq!(String::from_utf8_lossy(&bytes), p["token"].as_str().unwrap());
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{p}");
        assert_eq!(top[0]["id"], p["id"], "greedy: the best alternative is the token");
        for a in top {
            let token = a["token"].as_str().unwrap();
            assert!(close(&a["logprob"], &openai["top_logprobs"][i][token]), "{a} against {openai}");
            assert!(a["id"].as_u64().is_some() && a["bytes"].is_array(), "{a}");
        }
    }
    let streamed = json!({"prompt": prompt, "n_predict": 6, "temperature": 0, "n_probs": 3, "stream": true});
    let chunks = common::sse_json(&s, "/completion", streamed).await;
    let (last, pieces) = chunks.split_last().unwrap();
    assert!(last.get("completion_probabilities").is_none(), "{last}");
    let streamed: Vec<&Value> =
        pieces.iter().flat_map(|p| p["completion_probabilities"].as_array().unwrap().iter()).collect();
    assert_eq!(streamed.len(), 6, "{pieces:?}");
    for (a, b) in streamed.iter().zip(probs) {
        assert!(
            a["id"] == b["id"] && close(&a["logprob"], &b["logprob"]) && nearly(&a["top_logprobs"], &b["top_logprobs"])
        );
    }
    // The distribution drawn from: a greedy token is certain.
    let body = json!({"prompt": prompt, "n_predict": 3, "temperature": 0, "n_probs": 3, "post_sampling_probs": true});
    let (status, r) = post(&s, "/completion", body).await;
    assert_eq!(status, 200, "{r}");
    for (i, p) in r["completion_probabilities"].as_array().unwrap().iter().enumerate() {
        assert_eq!((&p["id"], &p["prob"]), (&r["tokens"][i], &json!(1.0)), "{p}");
        assert_eq!(p["top_probs"], json!([{"id": p["id"], "token": p["token"], "bytes": p["bytes"], "prob": 1.0}]));
        assert!(p.get("logprob").is_none() && p.get("top_logprobs").is_none(), "{p}");
    }
    // Sampled under top-k 3: the three alternatives are the whole distribution, the token one of them.
    let body = json!({"prompt": prompt, "n_predict": 8, "temperature": 1.5, "top_k": 3, "seed": 3, "n_probs": 5,
        "post_sampling_probs": true});
    let (status, r) = post(&s, "/completion", body).await;
    assert_eq!(status, 200, "{r}");
    let probs = r["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 8, "{r}");
    for p in probs {
        let top = p["top_probs"].as_array().unwrap();
        let sum: f64 = top.iter().map(|a| a["prob"].as_f64().unwrap()).sum();
        assert!(top.len() == 3 && (sum - 1.0).abs() < 1e-5, "{p}");
        let drawn = top.iter().find(|a| a["id"] == p["id"]).expect("the token is among its distribution's");
        assert!(close(&drawn["prob"], &p["prob"]) && p["prob"].as_f64().unwrap() > 0.0, "{p}");
    }
    for n in [21, -1] {
        let (status, err) = post(&s, "/completion", json!({"prompt": prompt, "n_probs": n})).await;
        assert_eq!((status, err["error"]["param"].as_str()), (400, Some("n_probs")), "{err}");
    }
    s.shutdown().await;
}

/// llama.cpp's `GET /props`: the context one request may fill (the fixture's 256 positions,
/// within a KV cache of 200 cells here), the defaults a `/completion` gets (the fixture's
/// generation config sets none: transformers' own; at most `limits.max_tokens` tokens), the
/// requests served at once (the admission limit), the model's name, first weight file and chat
/// template; `?model=` names it, an unknown one is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_props_say_the_context_defaults_slots_and_template() {
    let settings = [("engine.kv_capacity", "200"), ("limits.max_concurrent_requests", "3")];
    let s = server_for(&fixture_dir(FIXTURE), &settings).await;
    let (status, p) = get(&s, "/props").await;
    assert_eq!(status, 200, "{p}");
    let settings = &p["default_generation_settings"];
    assert_eq!(settings["n_ctx"], 200, "{p}");
    let params = &settings["params"];
    assert_eq!(
        (&params["n_predict"], &params["temperature"], &params["top_k"]),
        (&json!(4096), &json!(1.0), &json!(0))
    );
    assert_eq!(
        (&params["top_p"], &params["min_p"], &params["repeat_penalty"]),
        (&json!(1.0), &json!(0.0), &json!(1.0))
    );
    assert_eq!((&p["total_slots"], &p["model_alias"]), (&json!(3), &json!(FIXTURE)), "{p}");
    assert!(p["model_path"].as_str().unwrap().ends_with("model-00001-of-00005.safetensors"), "{p}");
    assert!(p["chat_template"].as_str().unwrap().contains("<|im_start|>"), "{p}");
    assert_eq!(p["modalities"]["vision"], false);
    let (status, named) = get(&s, &format!("/props?model={FIXTURE}")).await;
    assert_eq!((status, &named), (200, &p));
    let (status, err) = get(&s, "/props?model=nope").await;
    assert_eq!(status, 404, "{err}");
    s.shutdown().await;
}

/// The stop string that ended a choice: vLLM's `stop_reason` in OpenAI's chat and completions
/// (streamed in the finishing chunk), Anthropic's `stop_reason: "stop_sequence"` with the
/// sequence, llama.cpp's `stop_type: "word"` with the `stopping_word`; a choice that no stop
/// string ended says none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stop_string_that_ended_a_choice_is_reported_in_every_dialect() {
    let s = server_for(&fixture_dir(FIXTURE), &[]).await;
    let messages = json!([{"role": "user", "content": "Hello there"}]);
    let (_, free) = post(
        &s,
        "/v1/chat/completions",
        json!({"model": FIXTURE, "messages": messages, "max_tokens": 12, "temperature": 0}),
    )
    .await;
    assert_eq!(free["choices"][0]["stop_reason"], Value::Null, "{free}");
    let text = free["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    // A run of two ASCII letters or digits the greedy answer writes, past its first character.
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let at = (1..chars.len().saturating_sub(1))
        .find(|&i| chars[i].1.is_ascii_alphanumeric() && chars[i + 1].1.is_ascii_alphanumeric())
        .unwrap_or_else(|| panic!("no two letters in a row in {text:?}"));
    let stop = text[chars[at].0..chars[at].0 + 2].to_string();
    let before = &text[..text.find(&stop).unwrap()];
    let stops = json!([stop, "never written ~~~"]);

    let body = json!({"model": FIXTURE, "messages": messages, "max_tokens": 12, "temperature": 0, "stop": stops});
    let (status, r) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{r}");
    let choice = &r["choices"][0];
    assert_eq!((choice["message"]["content"].as_str(), &choice["finish_reason"]), (Some(before), &json!("stop")));
    assert_eq!(choice["stop_reason"], json!(stop), "{r}");
    let mut streamed = body;
    streamed["stream"] = true.into();
    let chunks = common::sse_json(&s, "/v1/chat/completions", streamed).await;
    let finishing = chunks.iter().find(|c| c["choices"][0]["finish_reason"] == "stop").expect("a finishing chunk");
    assert_eq!(finishing["choices"][0]["stop_reason"], json!(stop), "{finishing}");

    let (status, m) = post(
        &s,
        "/v1/messages",
        json!({"model": FIXTURE, "messages": messages, "max_tokens": 12, "temperature": 0, "stop_sequences": stops}),
    )
    .await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(
        (message_text(&m).as_str(), &m["stop_reason"], &m["stop_sequence"]),
        (before, &json!("stop_sequence"), &json!(stop))
    );
    let (_, m) =
        post(&s, "/v1/messages", json!({"model": FIXTURE, "messages": messages, "max_tokens": 12, "temperature": 0}))
            .await;
    assert_eq!((&m["stop_sequence"], m["stop_reason"] != "stop_sequence"), (&Value::Null, true), "{m}");

    // llama.cpp's /completion, on the chat's prompt as OpenAI's completions give it.
    let (_, c) = post(
        &s,
        "/v1/completions",
        json!({"model": FIXTURE, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}),
    )
    .await;
    let text = c["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let at = (1..chars.len().saturating_sub(1))
        .find(|&i| chars[i].1.is_ascii_alphanumeric() && chars[i + 1].1.is_ascii_alphanumeric())
        .unwrap_or_else(|| panic!("no two letters in a row in {text:?}"));
    let stop = text[chars[at].0..chars[at].0 + 2].to_string();
    let (status, l) = post(
        &s,
        "/completion",
        json!({"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "stop": [stop]}),
    )
    .await;
    assert_eq!(status, 200, "{l}");
    assert_eq!(
        (l["content"].as_str(), &l["stop_type"], &l["stopping_word"]),
        (Some(&text[..text.find(&stop).unwrap()]), &json!("word"), &json!(stop))
    );
    let (_, l) =
        post(&s, "/completion", json!({"prompt": "Once upon a time", "n_predict": 12, "temperature": 0})).await;
    assert_eq!((&l["stopping_word"], l["stop_type"] != "word"), (&json!(""), true), "{l}");
    s.shutdown().await;
}
