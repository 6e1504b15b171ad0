//! C10: the tokenizer agrees with Hugging Face's, the chat template renders as transformers'
//! `apply_chat_template` does, and streaming never splits a UTF-8 character.

use llaisys_model::Tokenizer;
use llaisys_model::tokenizer::{ChatMessage, ChatTemplate, FimTokens, IncrementalDecoder, Infill};
use llaisys_tests::{FIXTURES, Reference, fixture_dir};

const SYSTEM: &str =
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";

fn template() -> ChatTemplate {
    ChatTemplate::from_dir(&fixture_dir("tiny-tied-f32")).unwrap().expect("the fixture has a chat template")
}

#[test]
fn tokenizer_matches_hugging_face_ids_and_round_trips() {
    for name in FIXTURES {
        let tokenizer = Tokenizer::from_dir(&fixture_dir(name)).unwrap();
        // The references were encoded as transformers encodes a prompt (Llama's, Mistral's and
        // Gemma's with their BOS).
        let (bos, end) = match name {
            n if n.contains("llama") => (Some("<|begin_of_text|>"), "<|eot_id|>"),
            n if n.contains("gemma") => (Some("<bos>"), "<end_of_turn>"),
            n if ["mistral", "mixtral", "ministral", "phi3"].iter().any(|m| n.contains(m)) => (Some("<s>"), "</s>"),
            n if n.contains("gptoss") => (None, "<|return|>"),
            n if n.contains("olmo") => (None, "<|endoftext|>"),
            n if n.contains("granite") => (None, "<|end_of_text|>"),
            n if n.contains("glm") || n.contains("deepseek") => (None, "<|user|>"),
            _ => (None, "<|im_end|>"),
        };
        let adds_bos = bos.is_some();
        let bos = bos.map(|b| tokenizer.token_to_id(b).unwrap());
        for p in Reference::load(name).prompts {
            assert_eq!(tokenizer.encode_prompt(&p.text).unwrap(), p.ids, "{name}: encode {:?}", p.text);
            let text_ids = if adds_bos { &p.ids[1..] } else { &p.ids[..] };
            assert_eq!(tokenizer.encode(&p.text).unwrap(), text_ids, "{name}: encode without BOS {:?}", p.text);
            assert_eq!(tokenizer.decode(text_ids, false).unwrap(), p.text, "{name}: decode");
            assert_eq!(tokenizer.decode(&p.greedy, false).unwrap(), p.greedy_text, "{name}: decode greedy");
            if adds_bos {
                assert_eq!(Some(p.ids[0]), bos, "{name}: a prompt starts with BOS");
            }
        }
        let eos = tokenizer.token_to_id(end).unwrap();
        assert_eq!(tokenizer.encode(end).unwrap(), vec![eos], "{name}: special tokens are recognised");
        assert_ne!(eos, 151645, "fixture special ids differ from the real model's");
        assert_ne!(eos, 128009, "fixture special ids differ from the real model's");
    }
}

#[test]
fn chat_template_renders_like_transformers() {
    let t = template();
    let user = [ChatMessage::new("user", "Hi")];
    // Expected strings printed by transformers 5.23 apply_chat_template on this fixture.
    assert_eq!(
        t.render(&user, true).unwrap(),
        format!("{SYSTEM}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    );
    assert_eq!(t.render(&user, false).unwrap(), format!("{SYSTEM}<|im_start|>user\nHi<|im_end|>\n"));
    let conversation = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        t.render(&conversation, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn templates_may_raise_and_use_python_string_methods() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{% if m.role not in ['user'] %}{{ raise_exception('only users here') }}{% endif %}{{ m.content.strip().upper() }}{% endfor %}".into(),
        String::new(),
        String::new(),
    )
    .unwrap();
    assert_eq!(t.render(&[ChatMessage::new("user", "  hi ")], false).unwrap(), "HI");
    let err = t.render(&[ChatMessage::new("tool", "x")], false).unwrap_err();
    assert!(err.to_string().contains("only users here"), "{err}");
    assert!(ChatTemplate::new("{% if %}".into(), String::new(), String::new()).is_err(), "syntax errors are errors");
}

#[test]
fn a_directory_without_a_template_has_none() {
    let dir = tempfile::tempdir().unwrap();
    assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_none());
    std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"chat_template": 5}"#).unwrap();
    assert!(ChatTemplate::from_dir(dir.path()).unwrap_err().to_string().contains("chat_template"));
}

#[test]
fn streaming_never_splits_a_character_and_loses_nothing() {
    let tokenizer = Tokenizer::from_dir(&fixture_dir("tiny-tied-f32")).unwrap();
    for p in Reference::load("tiny-tied-f32").prompts {
        let mut decoder = IncrementalDecoder::new(false);
        let (mut text, mut held) = (String::new(), 0);
        for &id in p.ids.iter().chain(&p.greedy) {
            match decoder.push(&tokenizer, id).unwrap() {
                Some(delta) => text.push_str(&delta),
                None => held += 1,
            }
        }
        text.push_str(&decoder.finish(&tokenizer).unwrap().unwrap_or_default());
        let all: Vec<u32> = p.ids.iter().chain(&p.greedy).copied().collect();
        assert_eq!(text, tokenizer.decode(&all, false).unwrap());
        if p.text.contains('你') {
            assert!(held > 0, "multi-byte characters span several tokens here, so some pushes wait");
        }
    }
}

/// A SentencePiece vocabulary (the Mistral fixture's): streamed token by token, the text keeps
/// the spaces `▁` stands for between words (the first only is dropped, as Hugging Face decodes),
/// and a character spelled as byte pieces (`<0xF0>` ...) comes out whole once its last byte does.
#[test]
fn streaming_a_sentencepiece_vocabulary_keeps_spaces_and_characters_whole() {
    let tokenizer = Tokenizer::from_dir(&fixture_dir("tiny-mistral-f32")).unwrap();
    let text = "Return  the list, naïve 🦀 café\n  done";
    let ids = tokenizer.encode(text).unwrap();
    let mut decoder = IncrementalDecoder::new(false);
    let mut out = String::new();
    for &id in &ids {
        if let Some(delta) = decoder.push(&tokenizer, id).unwrap() {
            assert!(!delta.contains('\u{FFFD}'), "half a character was emitted: {delta:?}");
            out.push_str(&delta);
        }
    }
    assert_eq!(decoder.finish(&tokenizer).unwrap(), None);
    assert_eq!(out, text);
    let crab = tokenizer.encode("🦀").unwrap();
    assert!(crab.len() > 2, "the fixture spells 🦀 as byte pieces: {crab:?}");
}

#[test]
fn streaming_of_the_prompt_text_is_exact() {
    // The prompt alone is valid UTF-8 at its end: no replacement character ever appears.
    let tokenizer = Tokenizer::from_dir(&fixture_dir("tiny-tied-f32")).unwrap();
    let p = &Reference::load("tiny-tied-f32").prompts[2];
    let mut decoder = IncrementalDecoder::new(false);
    let mut text = String::new();
    for &id in &p.ids {
        if let Some(delta) = decoder.push(&tokenizer, id).unwrap() {
            assert!(!delta.contains('\u{FFFD}'), "half a character was emitted: {delta:?}");
            text.push_str(&delta);
        }
    }
    assert_eq!(decoder.finish(&tokenizer).unwrap(), None);
    assert_eq!(text, p.text);
}

#[test]
fn streaming_can_skip_special_tokens() {
    let tokenizer = Tokenizer::from_dir(&fixture_dir("tiny-tied-f32")).unwrap();
    let ids = tokenizer.encode("Hi<|im_end|>").unwrap();
    let mut decoder = IncrementalDecoder::new(true);
    let text: String = ids.iter().filter_map(|&id| decoder.push(&tokenizer, id).unwrap()).collect();
    assert_eq!(text, "Hi");
}

#[test]
fn token_bytes_concatenate_to_the_exact_text() {
    let tokenizer = Tokenizer::from_dir(&fixture_dir("tiny-tied-f32")).unwrap();
    for p in Reference::load("tiny-tied-f32").prompts {
        // The prompts are real text (multi-byte characters split across tokens included).
        let bytes: Vec<u8> = p.ids.iter().flat_map(|&id| tokenizer.token_bytes(id).unwrap()).collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), p.text);
    }
    let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
    assert_eq!(tokenizer.token_bytes(eos).unwrap(), b"<|im_end|>");
    assert_eq!(tokenizer.token_bytes(u32::MAX), None);
}

/// Qwen3's and Llama 3.2's own templates render as transformers 5.23's `apply_chat_template`
/// does on these fixtures: Qwen3's drops the thinking of earlier turns (Python string methods,
/// reversed slices, namespaces); Llama's writes the date (`strftime_now`), tools in the first
/// user turn with `tojson(indent=4)`, the key order as the request gave it.
#[test]
fn qwen3_and_llama3_templates_render_like_transformers() {
    let conversation = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "<think>\nGreet back.\n</think>\n\nHello!"),
        ChatMessage::new("user", "Weather in Paris?"),
    ];
    let tools = [serde_json::json!({"type": "function", "function": {"name": "get_weather",
        "description": "Weather in a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}})];
    let qwen3 = ChatTemplate::from_dir(&fixture_dir("tiny-qwen3-f32")).unwrap().unwrap();
    assert_eq!(
        qwen3.render(&conversation, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        qwen3.render_with_tools(&conversation[1..2], &tools, true).unwrap(),
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let llama = ChatTemplate::from_dir(&fixture_dir("tiny-llama-f32")).unwrap().unwrap();
    // transformers was given date_string "26 Jul 2024"; here the template asks strftime_now.
    let dated = |text: String| -> String {
        let (head, tail) = text.split_once("Today Date: ").expect("the template writes the date");
        let (date, rest) = tail.split_once('\n').unwrap();
        let [day, month, year]: [&str; 3] = date.split(' ').collect::<Vec<_>>().try_into().unwrap();
        assert!(day.len() == 2 && month.len() == 3 && year.len() == 4, "{date}");
        format!("{head}Today Date: 26 Jul 2024\n{rest}")
    };
    assert_eq!(
        dated(llama.render(&conversation, true).unwrap()),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>\nGreet back.\n</think>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    assert_eq!(
        dated(llama.render_with_tools(&conversation[1..2], &tools, true).unwrap()),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"Weather in a city\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

/// A fill-in-the-middle prompt is the prefix, the suffix and the middle token in the model's
/// own tokens (Qwen2.5-Coder's), context files before it in its repository format, as many as
/// fit the budget with the last ones kept; a vocabulary without the tokens has none.
#[test]
fn fill_in_the_middle_prompts_are_written_in_the_models_tokens() {
    let tokenizer = Tokenizer::from_dir(&fixture_dir("tiny-tied-f32")).unwrap();
    let fim = FimTokens::of(&tokenizer).expect("Qwen's vocabulary has the tokens");
    let id = |t: &str| tokenizer.token_to_id(t).unwrap();
    assert_eq!(
        (fim.prefix, fim.suffix, fim.middle),
        (id("<|fim_prefix|>"), id("<|fim_suffix|>"), id("<|fim_middle|>"))
    );
    assert_eq!(fim.stops(), [id("<|fim_pad|>"), id("<|repo_name|>"), id("<|file_sep|>")]);
    let parts = Infill::new("def add(a, b):\n    ", "\n    return c\n");
    let text = |ids: &[u32]| tokenizer.decode(ids, false).unwrap();
    let plain = fim.prompt(&tokenizer, &parts, 10_000).unwrap();
    assert_eq!(text(&plain.ids), "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c\n<|fim_middle|>");
    assert_eq!(plain.ids[0], fim.prefix, "the tags are the tokens, not their text spelled out");
    assert_eq!(plain.files_left_out, 0);

    let with = parts.clone().file("util.py", "import math\n").file("lib/b.py", "B = 2\n");
    let all = fim.prompt(&tokenizer, &with, 10_000).unwrap();
    let tail = "<|file_sep|>filename\n<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c\n<|fim_middle|>";
    assert_eq!(
        text(&all.ids),
        format!("<|repo_name|>myproject\n<|file_sep|>util.py\nimport math\n<|file_sep|>lib/b.py\nB = 2\n{tail}")
    );
    assert_eq!(all.files_left_out, 0);
    // A budget one token short of everything leaves the first file out, whole.
    let short = fim.prompt(&tokenizer, &with, all.ids.len() - 1).unwrap();
    assert_eq!(text(&short.ids), format!("<|repo_name|>myproject\n<|file_sep|>lib/b.py\nB = 2\n{tail}"));
    assert_eq!(short.files_left_out, 1);
    // No room at all: no file, the prefix and suffix still whole (the caller refuses a prompt
    // too long), and the names the request gives.
    let named = Infill { repo: Some("calc".into()), path: Some("calc/add.py".into()), ..with.clone() };
    let none = fim.prompt(&tokenizer, &named, 0).unwrap();
    assert_eq!(none.files_left_out, 2);
    assert_eq!(
        text(&none.ids),
        "<|repo_name|>calc\n<|file_sep|>calc/add.py\n<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c\n<|fim_middle|>"
    );

    // Granite's StarCoder-style tokens: no file separator, so files are set apart by a line.
    let granite = Tokenizer::from_dir(&fixture_dir("tiny-granite-f32")).unwrap();
    let g = FimTokens::of(&granite).expect("Granite's vocabulary has the tokens");
    assert_eq!(g.prefix, granite.token_to_id("<fim_prefix>").unwrap());
    let ids = g.prompt(&granite, &parts.clone().file("lib/b.py", "B = 2\n"), 10_000).unwrap().ids;
    assert_eq!(
        granite.decode(&ids, false).unwrap(),
        "\n\n--- lib/b.py ---\n\nB = 2\n<fim_prefix>def add(a, b):\n    <fim_suffix>\n    return c\n<fim_middle>"
    );
    // Llama 3's vocabulary has no such tokens.
    assert_eq!(FimTokens::of(&Tokenizer::from_dir(&fixture_dir("tiny-llama-f32")).unwrap()), None);
}
