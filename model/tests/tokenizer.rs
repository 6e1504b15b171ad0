//! C10: the tokenizer agrees with Hugging Face's, the chat template renders as transformers'
//! `apply_chat_template` does, and streaming never splits a UTF-8 character.

use llaisys_model::Tokenizer;
use llaisys_model::tokenizer::{ChatMessage, ChatTemplate, IncrementalDecoder};
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
        for p in Reference::load(name).prompts {
            assert_eq!(tokenizer.encode(&p.text).unwrap(), p.ids, "{name}: encode {:?}", p.text);
            assert_eq!(tokenizer.decode(&p.ids, false).unwrap(), p.text, "{name}: decode");
            assert_eq!(tokenizer.decode(&p.greedy, false).unwrap(), p.greedy_text, "{name}: decode greedy");
        }
        let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
        assert_eq!(tokenizer.encode("<|im_end|>").unwrap(), vec![eos], "special tokens are recognised");
        assert_ne!(eos, 151645, "fixture special ids differ from the real model's");
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
