//! Fuzz targets: every part of llaisys that parses bytes a user or a file controls, each as a
//! function of one input that must never panic (and, where the code has one, must keep an
//! invariant). Three drivers run them:
//!
//! - `tests/regressions.rs` (in `cargo test`): every committed input of `corpus/TARGET/`, the
//!   seeds and each crash ever found, as a regression case;
//! - `llaisys-fuzz` (`src/bin`), on the stable toolchain: mutates the corpus for a given time
//!   and saves any input that panics or hangs to `artifacts/TARGET/`;
//! - `libfuzzer/` (cargo-fuzz, nightly only): the same targets, coverage-guided.
//!
//! `scripts/fuzz.sh SECONDS` runs every target for that long with the best driver the machine
//! has.

use std::io::Write;
use std::sync::OnceLock;

use llaisys_actors::request::{
    Emit, Part, ReasoningParsing, ReasoningSplit, ReasoningTags, Route, TextCallSpec, TextCallTool, TextCalls,
    ToolCallDelta, ToolCallOut, ToolCallParser, ToolCallTags, ToolParsing, XmlTools,
};
use llaisys_actors::{ChatMessage, ChatRequest, CompletionRequest, Engine, Frontend};
use llaisys_model::tokenizer::ToolCall;
use llaisys_model::{ArgTags, Device, LoadOptions, ModelSource, load_model};
use llaisys_server::http::dialect::Work;
use llaisys_server::http::{anthropic, llamacpp, ollama, openai, responses};

/// A target: its name (its corpus folder) and what it does with one input.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target { name: "gguf", run: gguf },
    Target { name: "openai_request", run: openai_request },
    Target { name: "dialect_request", run: dialect_request },
    Target { name: "chat_template", run: chat_template },
    Target { name: "tool_calls", run: tool_calls },
    Target { name: "reasoning", run: reasoning },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The tiny fixture model's frontend (tokenizer, chat template, limits; no weights): what a
/// request's JSON and a conversation go through.
fn frontend() -> &'static Frontend {
    static FRONTEND: OnceLock<Frontend> = OnceLock::new();
    FRONTEND.get_or_init(|| {
        let path = llaisys_tests::fixture_dir("tiny-tied-f32");
        Engine::builder().model(path).build_frontend().expect("the fixture's frontend")
    })
}

/// A GGUF file from untrusted bytes: the reader (our own parser), then everything made from its
/// metadata (config, tokenizer, chat template) and, when that holds, the model's weights.
/// Errors are fine; a panic, or memory beyond the file's size times a small factor, is not.
pub fn gguf(data: &[u8]) {
    thread_local! {
        static PATH: std::path::PathBuf = {
            let thread = format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_alphanumeric(), "");
            std::env::temp_dir().join(format!("llaisys-fuzz-{}-{thread}.gguf", std::process::id()))
        };
    }
    let path = PATH.with(Clone::clone);
    let written = std::fs::File::create(&path).and_then(|mut f| f.write_all(data));
    written.expect("writing the input to a temporary file");
    // Removed however this input ends (a return, or a panic the driver catches): the files of
    // earlier runs were left in the temporary folder, one per thread and process.
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(path.clone());
    let Ok(file) = llaisys_model::gguf::GgufFile::open(&path) else { return };
    for t in file.tensors() {
        let _ = file.bytes(t);
    }
    if llaisys_model::gguf::model_config(&file).is_err() {
        return;
    }
    let source = ModelSource::gguf(path);
    if let Ok(tokenizer) = source.tokenizer() {
        let _ = tokenizer.encode("Hello, world! 你好 <|im_end|>");
        let _ = tokenizer.decode(&[0, 1, 2, 3], false);
    }
    let _ = source.chat_template();
    let _ = load_model(None, Some(&source), &LoadOptions::default(), &Device::flex());
}

/// An OpenAI request body from untrusted bytes, as the server takes it: parsed (chat and
/// completion), translated into the engine's request, then checked and rendered by the
/// frontend exactly as `/v1/chat/completions` and `/v1/completions` do.
pub fn openai_request(data: &[u8]) {
    if let Ok(req) = openai::parse_request::<openai::ChatRequest>(data) {
        let logprobs = req.top_logprobs.filter(|k| (0..=20).contains(k)).map(|k| k as usize);
        let plan = req.common.plan(req.max_completion_tokens.or(req.common.max_tokens), logprobs);
        let plan = plan.and_then(|p| p.with_response_format(req.response_format.as_ref()));
        if let (Ok(plan), Ok((tools, tool_choice)), Ok((mut messages, images))) =
            (plan, openai::tools(&req), openai::messages(&req.messages))
        {
            // The images as the server prepares them (decoded, resized, cut), each in place; a
            // remote one is not fetched here.
            for p in images {
                let llaisys_server::http::images::ImageData::Bytes(bytes) = &p.data else { continue };
                if let Ok(image) = llaisys_model::ImageProcessor::default().prepare(bytes) {
                    let image = std::sync::Arc::new(image);
                    messages[p.message].images.push(llaisys_model::tokenizer::MessageImage { at: p.at, image });
                }
            }
            let mut options = plan.options;
            (options.tools, options.tool_choice, options.parallel_tool_calls) =
                (tools, tool_choice, req.parallel_tool_calls);
            let _ = frontend().chat(&ChatRequest::new(messages).options(options));
        }
    }
    if let Ok(req) = openai::parse_request::<openai::CompletionRequest>(data) {
        let plan = req.common.plan(req.common.max_tokens, req.logprobs.map(|k| k.clamp(0, 20) as usize));
        if let (Ok(prompts), Ok(plan)) = (req.prompts(), plan) {
            let _ = frontend().completion(&CompletionRequest::batch(prompts).options(plan.options));
        }
    }
}

/// A request body of the other API dialects (Anthropic's Messages, OpenAI's Responses, Ollama's
/// chat and generate, llama.cpp's completion and infill) from untrusted bytes, as their endpoints take it: parsed, translated into
/// the engine's request, then checked and rendered by the frontend.
pub fn dialect_request(data: &[u8]) {
    let run = |work: Work| match work {
        Work::Chat(request) => drop(frontend().chat(&request)),
        Work::Completion(request) => drop(frontend().completion(&request)),
    };
    if let Ok(Ok((request, _))) = anthropic::MessagesRequest::parse(data).map(|r| r.chat_request()) {
        run(Work::Chat(request));
    }
    if let Ok(Ok((request, _, _))) = responses::ResponsesRequest::parse(data).map(|r| r.chat_request(&[])) {
        run(Work::Chat(request));
    }
    if let Ok(Ok((request, _))) = ollama::ChatIn::parse(data).map(|r| r.chat_request()) {
        run(Work::Chat(request));
    }
    if let Ok(Ok(Some((work, _)))) = ollama::GenerateIn::parse(data).map(|r| r.work()) {
        run(work);
    }
    for parsed in [llamacpp::Parsed::infill(data), llamacpp::Parsed::completion(data)].into_iter().flatten() {
        run(Work::Completion(parsed.request));
    }
}

/// A conversation from untrusted bytes through the model's chat template: messages of any role
/// and content (control characters, template syntax, invalid tool calls), rendered and
/// tokenized. Lines are messages: `role|content`, or `role|content|name|arguments` for a tool
/// call.
pub fn chat_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let messages: Vec<ChatMessage> = text
        .split('\n')
        .take(64)
        .map(|line| {
            let mut fields = line.splitn(4, '|');
            let role = fields.next().unwrap_or_default();
            let mut m = ChatMessage::new(role, fields.next().unwrap_or_default());
            if let (Some(name), Some(arguments)) = (fields.next(), fields.next()) {
                m.tool_calls.push(ToolCall { id: "call_0".into(), name: name.into(), arguments: arguments.into() });
            }
            m
        })
        .collect();
    let none = serde_json::Map::new();
    let _ = frontend().render_chat(&messages, &[], &none, true);
    let _ = frontend().render_chat(&messages, &[], &none, false);
}

/// A model's tool-call output from untrusted bytes, through the streaming parser, in every call
/// syntax (JSON, Qwen3.5's XML for a tool with a text and an integer parameter, Mistral's
/// array after an open tag with no closing tag, Mistral's `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`,
/// and GLM's `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`):
/// byte 0x01 opens a call (the array), 0x02 closes it where there is a closing tag, 0x03 and 0x04
/// are `[ARGS]` and `[CALL_ID]`, 0x05 to 0x08 GLM's argument tags, the rest is the model's text. Invariant: the calls
/// gathered from pieces of any size are the calls gathered from the whole text at once (what a
/// streamed and a non-streamed answer report must be byte-identical).
pub fn tool_calls(data: &[u8]) {
    const TAGS: ToolCallTags = ToolCallTags::pair(1, 2);
    let text = String::from_utf8_lossy(data);
    let schema = serde_json::json!({"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}});
    let xml = std::sync::Arc::new(XmlTools::new(&[("get_weather", &schema)]));
    let array = ToolParsing::json(ToolCallTags::array(1), true);
    let named = ToolParsing::json(ToolCallTags { args: Some(3), call_id: Some(4), ..ToolCallTags::array(1) }, true);
    let pairs = ArgTags { key: 5, key_end: 6, value: 7, value_end: 8 };
    let glm =
        ToolParsing { xml: Some(xml.clone()), ..ToolParsing::json(ToolCallTags { pairs: Some(pairs), ..TAGS }, true) };
    for parsing in [
        ToolParsing::json(TAGS, true),
        ToolParsing { xml: Some(xml), ..ToolParsing::json(TAGS, true) },
        array,
        named,
        glm,
    ] {
        parse_calls(&text, &parsing);
    }
    text_calls(&text);
}

fn parse_calls(text: &str, parsing: &ToolParsing) {
    const TAGS: ToolCallTags = ToolCallTags::pair(1, 2);
    let run = |piece_chars: usize| -> Vec<ToolCallOut> {
        let mut parser = ToolCallParser::new(parsing);
        let mut calls = Vec::new();
        let mut gather = |deltas: Vec<ToolCallDelta>| {
            for d in deltas {
                ToolCallOut::gather(&mut calls, &d);
            }
        };
        let mut pending = String::new();
        for c in text.chars() {
            let token = match c {
                '\u{1}' => Some(TAGS.open),
                '\u{2}' => TAGS.close,
                c @ '\u{3}'..='\u{8}' => Some(c as u32),
                _ => None,
            };
            match token {
                Some(tag) => {
                    gather(parser.push_call_text(&std::mem::take(&mut pending)));
                    if parser.route(tag) == Route::Call && parser.is_tag(tag) {
                        gather(parser.push_tag(tag));
                    }
                }
                None => {
                    if parser.route(0) == Route::Text {
                        continue;
                    }
                    pending.push(c);
                    if pending.chars().count() >= piece_chars {
                        gather(parser.push_call_text(&std::mem::take(&mut pending)));
                    }
                }
            }
        }
        gather(parser.push_call_text(&pending));
        calls
    };
    let whole = strip_ids(run(usize::MAX));
    for piece in [1, 2, 7] {
        assert_eq!(strip_ids(run(piece)), whole, "pieces of {piece} characters gather other calls");
    }
}

/// The same text as an answer that may be a call written as text (`tool_choice: auto`), fed in
/// pieces of several sizes: every split lets out the same text and calls, and when no call is
/// recognised the text comes out unchanged.
fn text_calls(text: &str) {
    let schema =
        serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let spec =
        std::sync::Arc::new(TextCallSpec { tools: vec![TextCallTool::new("get_weather", &schema)], grounds: None });
    let run = |piece_chars: usize| -> (String, Vec<(String, String)>) {
        let mut recogniser = TextCalls::new(spec.clone());
        let (mut out, mut calls) = (String::new(), Vec::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(piece_chars.max(1)) {
            for emit in recogniser.push(&piece.iter().collect::<String>()) {
                match emit {
                    Emit::Text(t) | Emit::Rejected(t) => out.push_str(&t),
                    Emit::Call { name, arguments } => calls.push((name, arguments)),
                }
            }
        }
        for emit in recogniser.finish() {
            match emit {
                Emit::Text(t) | Emit::Rejected(t) => out.push_str(&t),
                Emit::Call { name, arguments } => calls.push((name, arguments)),
            }
        }
        (out, calls)
    };
    let whole = run(usize::MAX);
    if whole.1.is_empty() {
        assert_eq!(whole.0, text, "text that is no call comes out unchanged");
    }
    for piece in [1, 3] {
        assert_eq!(run(piece), whole, "pieces of {piece} characters decide otherwise");
    }
}

/// A reasoning model's output from untrusted bytes, through the thinking/answer split: the first
/// byte's low bit says whether the prompt opened the think block, then byte 0x01 is `<think>`,
/// 0x02 `</think>`, the rest the model's text. Invariants: the reasoning and the answer shown
/// are the same however the text is split into tokens (a streamed and a non-streamed answer
/// must agree), the reasoning never starts or ends with whitespace, and an answer after the
/// thinking never starts with it.
pub fn reasoning(data: &[u8]) {
    const TAGS: ReasoningTags = ReasoningTags { open: 1, close: 2 };
    let Some((&first, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let parsing = ReasoningParsing { tags: TAGS, starts_open: first & 1 == 1 };
    let run = |piece_chars: usize| -> (String, String, bool) {
        let mut split = ReasoningSplit::new(parsing);
        let (mut reasoning, mut answer, mut closed) = (String::new(), String::new(), false);
        let mut pending = String::new();
        let mut flush = |split: &mut ReasoningSplit, pending: &mut String, part: Part| {
            let piece = std::mem::take(pending);
            match part {
                Part::Reasoning => reasoning.push_str(&split.reasoning(&piece)),
                Part::Answer => answer.push_str(&split.answer(&piece)),
                Part::Tag { .. } => {}
            }
        };
        let mut part = Part::Tag { closed: false };
        for c in text.chars() {
            let token = match c {
                '\u{1}' => TAGS.open,
                '\u{2}' => TAGS.close,
                _ => 0,
            };
            let next = split.route(token);
            if next != part || token != 0 {
                flush(&mut split, &mut pending, part);
            }
            closed |= next == Part::Tag { closed: true };
            part = next;
            if token == 0 {
                pending.push(c);
                if pending.chars().count() >= piece_chars {
                    flush(&mut split, &mut pending, part);
                }
            }
        }
        flush(&mut split, &mut pending, part);
        (reasoning, answer, closed)
    };
    let whole = run(usize::MAX);
    for piece in [1, 2, 7] {
        assert_eq!(run(piece), whole, "pieces of {piece} characters split otherwise");
    }
    let (reasoning, answer, closed) = whole;
    assert_eq!(reasoning.trim(), reasoning, "the reasoning keeps layout whitespace");
    if closed {
        assert_eq!(answer.trim_start(), answer, "the answer after the thinking keeps layout whitespace");
    }
}

/// Calls without their random ids.
fn strip_ids(calls: Vec<ToolCallOut>) -> Vec<(String, String)> {
    calls.into_iter().map(|c| (c.name, c.arguments)).collect()
}
