use serde_json::json;

use super::*;
use crate::{Sampler, SamplingParams, Tokenizer};

/// The tiny fixture's tokenizer: a byte-level BPE vocabulary with Qwen2's added tokens; the
/// logits are 1024 wide, the vocabulary 978.
fn compiler() -> (Tokenizer, GrammarCompiler) {
    let tokenizer = Tokenizer::from_dir(&llaisys_tests::fixture_dir("tiny-tied-f32")).unwrap();
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let compiler = GrammarCompiler::new(&tokenizer, 1024, &[im_end]).unwrap();
    (tokenizer, compiler)
}

/// Samples at temperature 1 from uniform logits under `grammar` until it ends (at most 400
/// tokens); the text.
fn random_text(tokenizer: &Tokenizer, grammar: &Grammar, seed: u64) -> (String, Option<GuideEnd>) {
    let (tokens, end) = uniform_tokens(grammar, 1024, seed, 400);
    (tokenizer.decode(&tokens, true).unwrap(), end)
}

/// Samples at temperature 1 from uniform logits `width` wide under `grammar`, until it ends or
/// `max` tokens; the tokens, and the end if it came.
fn uniform_tokens(grammar: &Grammar, width: usize, seed: u64, max: usize) -> (Vec<u32>, Option<GuideEnd>) {
    let params = SamplingParams { temperature: 1.0, seed: Some(seed), ..SamplingParams::default() };
    let mut sampler = Sampler::new(params, &[]).guided(&Guidance::grammar(grammar.clone()));
    let logits = vec![0.0; width];
    let mut tokens = Vec::new();
    while tokens.len() < max {
        let s = sampler.sample(&logits);
        tokens.push(s.token);
        if s.end.is_some() {
            return (tokens, s.end);
        }
    }
    (tokens, None)
}

#[test]
fn random_sampling_under_a_choice_or_regex_gives_only_matching_text() {
    let (tokenizer, compiler) = compiler();
    let choice = compiler.compile(&Constraint::Choice { choices: vec!["yes".into(), "no".into(), "a|b (c)".into()] });
    let choice = choice.unwrap();
    let regex = compiler.compile(&Constraint::Regex { pattern: r"[0-9]{3}-[a-z]{2,4}".into() }).unwrap();
    let pattern = regex_lite(r"[0-9]{3}-[a-z]{2,4}");
    for seed in 0..30 {
        let (text, end) = random_text(&tokenizer, &choice, seed);
        assert!(["yes", "no", "a|b (c)"].contains(&text.as_str()), "{text:?}");
        assert_eq!(end, Some(GuideEnd::Complete));
        let (text, end) = random_text(&tokenizer, &regex, seed);
        assert!(pattern(&text), "{text:?}");
        assert_eq!(end, Some(GuideEnd::Complete));
    }
}

/// `[0-9]{3}-[a-z]{2,4}` checked by hand.
fn regex_lite(_: &str) -> impl Fn(&str) -> bool {
    |t: &str| {
        let (digits, letters) = t.split_at(t.find('-').unwrap_or(0));
        digits.len() == 3
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (3..=5).contains(&letters.len())
            && letters[1..].bytes().all(|b| b.is_ascii_lowercase())
    }
}

#[test]
fn a_json_object_grammar_gives_parseable_objects_with_bounded_whitespace() {
    let (tokenizer, compiler) = compiler();
    let grammar = compiler.compile(&Constraint::JsonObject).unwrap();
    for seed in 0..20 {
        let (text, end) = random_text(&tokenizer, &grammar, seed);
        if end.is_none() {
            continue; // 400 tokens of a random object still open: allowed, nothing to check
        }
        let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(value.is_object(), "{text}");
        assert!(longest_whitespace_outside_strings(&text) <= 21, "{text:?}");
    }
}

/// The longest run of whitespace between JSON tokens (not inside strings).
fn longest_whitespace_outside_strings(json: &str) -> usize {
    let (mut in_string, mut escaped, mut run, mut longest) = (false, false, 0, 0);
    for c in json.chars() {
        if in_string {
            (in_string, escaped) = (escaped || c != '"', !escaped && c == '\\');
        } else if c.is_whitespace() {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
            in_string = c == '"';
        }
    }
    longest
}

#[test]
fn a_strict_schema_names_the_keywords_it_cannot_enforce_and_a_lenient_one_warns() {
    let (_, compiler) = compiler();
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}, "dependentSchemas": {"a": {}}});
    let e = compiler.compile(&Constraint::JsonSchema { schema: schema.clone(), strict: true }).unwrap_err();
    assert!(e.0.contains("dependentSchemas"), "{e}");
    let lenient = compiler.compile(&Constraint::JsonSchema { schema, strict: false }).unwrap();
    assert!(lenient.warnings().iter().any(|w| w.contains("dependentSchemas")), "{:?}", lenient.warnings());
    let e = compiler.compile(&Constraint::JsonSchema { schema: json!(3), strict: false }).unwrap_err();
    assert!(e.0.contains("object or a boolean"), "{e}");
    assert!(compiler.compile(&Constraint::Lark { grammar: "start: foo".into() }).is_err());
    assert!(compiler.compile(&Constraint::Choice { choices: vec![] }).is_err());
}

#[test]
fn special_tokens_are_reached_by_name_only_and_padding_never() {
    let (tokenizer, compiler) = compiler();
    let open = compiler.special_token("<tool_call>").unwrap();
    assert_eq!(Some(open), tokenizer.token_to_id("<tool_call>"));
    let grammar = compiler.compile_lark(r#"start: <tool_call> "x" </tool_call>"#.into()).unwrap();
    let close = tokenizer.token_to_id("</tool_call>").unwrap();
    for seed in 0..5 {
        let params = SamplingParams { temperature: 1.0, seed: Some(seed), ..SamplingParams::default() };
        let mut sampler = Sampler::new(params, &[]).guided(&Guidance::grammar(grammar.clone()));
        // Padding rows (978..1024) carry the largest logits; they must never be drawn.
        let mut logits = vec![0.0; 1024];
        logits[978..].fill(50.0);
        let tokens: Vec<u32> = (0..3).map(|_| sampler.sample(&logits).token).collect();
        assert_eq!(tokens[0], open);
        assert_eq!(tokenizer.decode(&tokens[1..2], false).unwrap(), "x");
        assert_eq!(tokens[2], close);
    }
    // JSON strings cannot spell a special token: "<tool_call>" is text there.
    let json = compiler.compile(&Constraint::JsonSchema { schema: json!({"type": "string"}), strict: true }).unwrap();
    let mut guide = Guidance::grammar(json).guide();
    let mut row = vec![0.0; 1024];
    guide.apply(&mut row).unwrap();
    assert_eq!(row[open as usize], f32::NEG_INFINITY);
}

#[test]
fn a_lazy_guide_is_free_until_its_trigger_and_a_forbidding_one_bans_tokens() {
    let (tokenizer, compiler) = compiler();
    let open = compiler.special_token("<tool_call>").unwrap();
    let grammar = compiler.compile_lark(r#"start: "ok" </tool_call>"#.into()).unwrap();
    let mut guide = Guidance::after(open, grammar).guide();
    let mut row = vec![0.0; 1024];
    guide.apply(&mut row).unwrap();
    assert!(row.iter().all(|l| *l == 0.0), "free text before the trigger");
    assert_eq!(guide.accept(5), None);
    assert_eq!(guide.accept(open), None);
    guide.apply(&mut row).unwrap();
    let allowed: Vec<usize> = (0..1024).filter(|i| row[*i] == 0.0).collect();
    assert!(allowed.iter().all(|t| "ok".starts_with(&tokenizer.decode(&[*t as u32], false).unwrap())), "{allowed:?}");
    let mut guide = Guidance::forbid(vec![open]).guide();
    let mut row = vec![0.0; 1024];
    guide.apply(&mut row).unwrap();
    assert_eq!(row[open as usize], f32::NEG_INFINITY);
    assert_eq!(row.iter().filter(|l| l.is_infinite()).count(), 1);
}

#[test]
fn an_answer_that_may_not_open_as_json_is_free_after_its_first_token() {
    let (tokenizer, compiler) = compiler();
    let text = |t: u32| tokenizer.decode(&[t], false).unwrap();
    let openers = compiler.json_openers();
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    assert!(openers.contains(&im_end), "an empty answer is no answer");
    for t in 0..978u32 {
        let s = text(t);
        let blank = [' ', '\t', '\n', '\r'];
        let after = s.trim_start_matches(blank);
        let opens = after.starts_with(['{', '[', '`']) || (!s.is_empty() && after.is_empty());
        if opens && compiler.special_token(&s).is_none_or(|id| id != t) {
            assert!(openers.contains(&t), "{s:?} opens JSON, a fence or blank space");
        }
        if !opens && t != im_end {
            assert!(!openers.contains(&t), "{s:?} does not");
        }
    }
    let open = compiler.special_token("<tool_call>").unwrap();
    let mut guide = Guidance::forbid(vec![open]).not_opening_with(openers.clone()).guide();
    let banned = |guide: &mut Guide| {
        let mut row = vec![0.0; 1024];
        guide.apply(&mut row).unwrap();
        (0..1024u32).filter(|&t| row[t as usize] == f32::NEG_INFINITY).collect::<Vec<_>>()
    };
    let first = banned(&mut guide);
    assert!(first.contains(&open) && openers.iter().all(|t| first.contains(t)));
    assert_eq!(first.len(), openers.len() + 1);
    let hello = tokenizer.encode("Hello").unwrap()[0];
    assert!(!openers.contains(&hello));
    assert_eq!(guide.accept(hello), None);
    assert_eq!(banned(&mut guide), vec![open], "after its first token the answer may be anything but a call");
}

#[test]
fn a_spent_think_budget_allows_only_the_closing_tag_then_nothing_more() {
    let (open, close) = (900, 901);
    let thinking = Thinking { open, close, start: ThinkStart::MayOpen, budget: Some(2), newline: None };
    let mut guide = Guidance::default().after_thinking(thinking).guide();
    let free = |guide: &mut Guide| {
        let mut row = vec![0.0f32; 1024];
        guide.apply(&mut row).unwrap();
        row.iter().all(|l| *l == 0.0)
    };
    assert!(free(&mut guide) && !guide.constrains(), "before the block opens");
    for token in [open, 6, 7] {
        assert_eq!(guide.accept(token), None);
    }
    assert!(guide.constrains(), "two tokens thought: the budget is spent");
    let mut row = vec![1.0f32; 1024];
    guide.apply(&mut row).unwrap();
    assert_eq!(row.iter().filter(|l| l.is_finite()).count(), 1);
    assert_eq!(row[close as usize], 1.0, "the closing tag keeps its logit");
    guide.accept(close);
    assert!(free(&mut guide) && !guide.constrains(), "the answer is free");
    guide.accept(open);
    guide.accept(8);
    guide.accept(9);
    assert!(!guide.constrains(), "one block only");

    // The block opens as the first token or not at all (as the reasoning split reads it).
    let mut guide = Guidance::default().after_thinking(thinking).guide();
    for token in [5, open, 6, 7] {
        guide.accept(token);
    }
    assert!(!guide.constrains(), "an open tag in the answer is no thinking");

    // GLM's newline once before `<think>`: the block still opens and its budget holds; a second
    // newline, or anything else first, is the answer.
    let glm = Thinking { newline: Some(5), ..thinking };
    let mut guide = Guidance::default().after_thinking(glm).guide();
    for token in [5, open, 6, 7] {
        assert_eq!(guide.accept(token), None);
    }
    assert!(guide.constrains(), "the budget is spent after the newline and two thought tokens");
    for first in [[5, 5], [4, 5]] {
        let mut guide = Guidance::default().after_thinking(glm).guide();
        for token in first.into_iter().chain([open, 6, 7]) {
            guide.accept(token);
        }
        assert!(!guide.constrains(), "{first:?}: the tag came in the answer");
    }

    // A prompt that opened the block counts from the first token.
    let mut guide = Guidance::default().after_thinking(Thinking { start: ThinkStart::Inside, ..thinking }).guide();
    guide.accept(5);
    guide.accept(6);
    assert!(guide.constrains());
}

/// The tokens `apply` leaves allowed.
fn allowed(guide: &mut Guide) -> Vec<u32> {
    let mut row = vec![0.0f32; 1024];
    guide.apply(&mut row).unwrap();
    (0..1024).filter(|&t| row[t as usize] == 0.0).collect()
}

#[test]
fn a_constraint_applies_after_the_thinking() {
    let (tokenizer, compiler) = compiler();
    let (open, close) = (900, 901);
    let text = |t: &[u32]| tokenizer.decode(t, false).unwrap();
    let blank = |t: u32| !text(&[t]).is_empty() && text(&[t]).chars().all(|c| " \t\n\r".contains(c));
    let ws: Vec<u32> = (0..978).filter(|&t| blank(t)).collect();
    assert!(!ws.is_empty(), "the fixture's vocabulary has whitespace tokens");
    let json = compiler.compile(&Constraint::JsonSchema { schema: json!({"type": "object"}), strict: true }).unwrap();
    let thinking = Thinking { open, close, start: ThinkStart::MayOpen, budget: None, newline: None };
    let mut guide = Guidance::grammar(json.clone()).after_thinking(thinking).guide();
    // The first token: the open tag, or the grammar's first (an object's brace).
    let first = allowed(&mut guide);
    assert!(first.contains(&open) && !first.contains(&close) && !first.contains(&ws[0]), "{first:?}");
    assert!(first.iter().filter(|&&t| t != open).all(|&t| text(&[t]).starts_with('{')), "{first:?}");
    guide.accept(open);
    // Inside: free, whatever the grammar says (even its closing brace, or more tags).
    assert!(!guide.constrains());
    assert_eq!(allowed(&mut guide).len(), 1024);
    for t in [5, open, 7] {
        assert_eq!(guide.accept(t), None);
    }
    guide.accept(close);
    // Just after the close: whitespace (once, not the grammar's) or the grammar's first.
    let lead = allowed(&mut guide);
    assert!(lead.iter().filter(|&&t| !blank(t)).all(|&t| text(&[t]).starts_with('{')), "{lead:?}");
    assert!(ws.iter().all(|t| lead.contains(t)) && lead.iter().any(|&t| text(&[t]) == "{"), "{lead:?}");
    guide.accept(ws[0]);
    let next = allowed(&mut guide);
    assert!(next.iter().all(|&t| text(&[t]).starts_with('{')), "{next:?}");
    let brace = *next.iter().find(|&&t| text(&[t]) == "{").unwrap();
    assert_eq!(guide.accept(brace), None);
    assert_eq!(guide.accept(tokenizer.token_to_id("}").unwrap()), Some(GuideEnd::Complete), "the object is complete");

    // With GLM's newline: first the open tag, the newline or the grammar's first; after the
    // newline the open tag or the grammar's first, not the newline again (nor the grammar's
    // whitespace); then the block as before.
    let nl = tokenizer.encode("\n").unwrap()[0];
    let mut guide = Guidance::grammar(json.clone()).after_thinking(Thinking { newline: Some(nl), ..thinking }).guide();
    let with_newline = allowed(&mut guide);
    assert_eq!(with_newline.len(), first.len() + 1, "{with_newline:?}");
    assert!(with_newline.contains(&nl) && with_newline.contains(&open), "{with_newline:?}");
    assert_eq!(guide.accept(nl), None);
    assert_eq!(allowed(&mut guide), first, "after the newline: the tag or the grammar's first");
    guide.accept(open);
    assert_eq!(allowed(&mut guide).len(), 1024, "inside the block");

    // A first token that is not the open tag: no thinking, the grammar has it.
    let mut guide = Guidance::grammar(json.clone()).after_thinking(thinking).guide();
    guide.accept(*first.iter().find(|&&t| t != open).unwrap());
    assert!(!allowed(&mut guide).contains(&open));
    // A prompt that closed the block: the grammar from the first token, no tag.
    let closed = Thinking { start: ThinkStart::Closed, ..thinking };
    let mut guide = Guidance::grammar(json.clone()).after_thinking(closed).guide();
    let first = allowed(&mut guide);
    assert!(!first.contains(&open) && first.iter().all(|&t| text(&[t]).starts_with('{')), "{first:?}");
    // Inside from the start, with a budget: the close forced, then the grammar.
    let inside = Thinking { start: ThinkStart::Inside, budget: Some(1), ..thinking };
    let mut guide = Guidance::grammar(json).after_thinking(inside).guide();
    assert_eq!(allowed(&mut guide).len(), 1024);
    guide.accept(5);
    assert_eq!(allowed(&mut guide), vec![close]);
    guide.accept(close);
    assert!(allowed(&mut guide).iter().any(|&t| text(&[t]) == "{"));

    // A trigger (`tool_choice: auto`) inside the thinking is text; after it, the call's grammar.
    let call = compiler.special_token("<tool_call>").unwrap();
    let grammar = compiler.compile_lark(r#"start: "ok" </tool_call>"#.into()).unwrap();
    let mut guide = Guidance::after(call, grammar).after_thinking(thinking).guide();
    for t in [open, call, 5] {
        guide.accept(t);
    }
    assert_eq!(allowed(&mut guide).len(), 1024, "the tag inside the thinking starts nothing");
    guide.accept(close);
    guide.accept(ws[0]);
    assert_eq!(allowed(&mut guide).len(), 1024, "free text after the thinking, until the tag");
    guide.accept(call);
    assert!(allowed(&mut guide).iter().all(|&t| "ok".starts_with(&text(&[t]))));
    // Forbidden tokens (`tool_choice: none`) are allowed in the thinking, not after it.
    let mut guide = Guidance::forbid(vec![call]).after_thinking(thinking).guide();
    guide.accept(open);
    assert!(allowed(&mut guide).contains(&call));
    guide.accept(close);
    assert!(!allowed(&mut guide).contains(&call));
}

/// Mistral Small 3.2's calls (tiny-mixtral-f32's vocabulary, with its control tokens):
/// `[TOOL_CALLS]`, a tool's name, `[CALL_ID]` and nine letters and digits, `[ARGS]` and
/// arguments held to that tool's schema, as often as `parallel` allows; without ids, no
/// `[CALL_ID]`. Uniform sampling reaches every branch: both tools, one call and several.
#[test]
fn mistral_named_calls_give_a_name_an_id_and_schema_arguments_per_tag() {
    let tokenizer = Tokenizer::from_dir(&llaisys_tests::fixture_dir("tiny-mixtral-f32")).unwrap();
    let eos = tokenizer.token_to_id("</s>").unwrap();
    let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size(), &[eos]).unwrap();
    let id = |t: &str| compiler.special_token(t).unwrap();
    let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                         "required": ["city"], "additionalProperties": false});
    let time = json!({"type": "object", "properties": {"zone": {"type": "integer", "minimum": -99, "maximum": 99}},
                      "required": ["zone"], "additionalProperties": false});
    let functions = [("get_weather", &weather), ("get_time", &time)];
    for ids in [true, false] {
        let syntax = CallSyntax::Named { ids };
        let tags = syntax.tags().unwrap().try_map(|t| compiler.special_token(t).ok_or(t)).unwrap();
        assert_eq!((tags.args, tags.call_id.is_some()), (Some(id("[ARGS]")), ids));
        let grammar = compiler.tool_calls(&functions, Some(tags), syntax, true, true).unwrap();
        let (mut names, mut most) = (std::collections::BTreeSet::new(), 0);
        for seed in 0..40 {
            let (tokens, _) = uniform_tokens(&grammar, tokenizer.vocab_size(), seed, 300);
            let text = tokenizer.decode(&tokens, false).unwrap();
            let calls: Vec<&str> = text.trim_end_matches("</s>").split("[TOOL_CALLS]").skip(1).collect();
            assert!(text.starts_with("[TOOL_CALLS]") && !calls.is_empty(), "{text:?}");
            for call in &calls {
                let (head, args) = call.split_once("[ARGS]").unwrap_or_else(|| panic!("{text:?}"));
                let name = match head.split_once("[CALL_ID]") {
                    Some((name, id)) => {
                        assert!(ids && id.trim_start().len() == 9, "{text:?}");
                        assert!(id.trim_start().chars().all(|c| c.is_ascii_alphanumeric()), "{text:?}");
                        name
                    }
                    None => {
                        assert!(!ids, "{text:?}");
                        head
                    }
                };
                let args: serde_json::Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {text:?}"));
                match name.trim_start() {
                    "get_weather" => assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 6), "{text:?}"),
                    // JSON's `-0` reads as a float.
                    "get_time" => {
                        assert!(args["zone"].as_f64().is_some_and(|z| z.fract() == 0.0 && z.abs() <= 99.0), "{text:?}")
                    }
                    other => panic!("{other:?} in {text:?}"),
                }
                names.insert(name.trim_start().to_string());
            }
            most = most.max(calls.len());
        }
        assert_eq!(names.len(), 2);
        assert!(most > 1, "several calls");
    }
}

/// GLM's calls (tiny-glm4moe-f32's vocabulary, whose argument tags are special tokens):
/// `<tool_call>`, a tool's name on its line, each argument's `<arg_key>` and `<arg_value>` on lines
/// of their own, text values as they are (within the schema's length, or one of its choices),
/// others as JSON held to the schema, `</tool_call>`; more calls where `parallel` allows, each
/// after a line break. Uniform sampling reaches every branch: both tools, the optional argument
/// written and left out, one call and several. After a tag the model wrote, the grammar takes a
/// call and refuses an unknown tool or a value off its schema.
#[test]
fn glm_calls_give_a_name_and_tagged_arguments_held_to_the_schemas() {
    let tokenizer = Tokenizer::from_dir(&llaisys_tests::fixture_dir("tiny-glm4moe-f32")).unwrap();
    let eos = tokenizer.token_to_id("<|user|>").unwrap();
    let compiler = GrammarCompiler::new(&tokenizer, tokenizer.vocab_size(), &[eos]).unwrap();
    let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                         "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false});
    let time = json!({"type": "object", "properties": {"zone": {"type": "integer", "minimum": -99, "maximum": 99}},
                      "required": ["zone"], "additionalProperties": false});
    let functions = [("get_weather", &weather), ("get_time", &time)];
    let syntax = CallSyntax::ArgPairs;
    let tags = syntax.tags().unwrap().try_map(|t| compiler.special_token(t).ok_or(t)).unwrap();
    assert_eq!(tags.pairs.map(|p| p.value), compiler.special_token("<arg_value>"));
    let grammar = compiler.tool_calls(&functions, Some(tags), syntax, true, true).unwrap();
    let (mut seen, mut most) = (std::collections::BTreeSet::new(), 0);
    for seed in 0..60 {
        let (tokens, _) = uniform_tokens(&grammar, tokenizer.vocab_size(), seed, 300);
        let text = tokenizer.decode(&tokens, false).unwrap();
        let body = text.trim_end_matches("<|user|>").trim_end_matches('\n');
        let calls: Vec<&str> = body.split("<tool_call>").skip(1).collect();
        assert!(body.starts_with("<tool_call>") && !calls.is_empty(), "{text:?}");
        for (i, call) in calls.iter().enumerate() {
            let call =
                if i + 1 < calls.len() { call.strip_suffix('\n').unwrap_or_else(|| panic!("{text:?}")) } else { call };
            let call = call.strip_suffix("</tool_call>").unwrap_or_else(|| panic!("{text:?}"));
            let (name, mut rest) = call.split_once('\n').unwrap_or_else(|| panic!("{text:?}"));
            let mut args = serde_json::Map::new();
            while let Some(pair) = rest.strip_prefix("<arg_key>") {
                let (key, after) = pair.split_once("</arg_key>\n<arg_value>").unwrap_or_else(|| panic!("{text:?}"));
                let (value, after) = after.split_once("</arg_value>\n").unwrap_or_else(|| panic!("{text:?}"));
                args.insert(key.to_string(), json!(value));
                rest = after;
            }
            assert_eq!(rest, "", "{text:?}");
            match name {
                "get_weather" => {
                    assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 6), "{text:?}");
                    assert!(args.get("unit").is_none_or(|u| u == "c" || u == "f"), "{text:?}");
                    assert!(args.keys().all(|k| k == "city" || k == "unit"), "{text:?}");
                    seen.insert(format!("{name} unit:{}", args.contains_key("unit")));
                }
                "get_time" => {
                    let zone: serde_json::Value = serde_json::from_str(args["zone"].as_str().unwrap()).unwrap();
                    assert!(zone.as_f64().is_some_and(|z| z.fract() == 0.0 && z.abs() <= 99.0), "{text:?}");
                    seen.insert(name.to_string());
                }
                other => panic!("{other:?} in {text:?}"),
            }
        }
        most = most.max(calls.len());
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(most > 1, "several calls");
    // The model opened the call: the grammar starts after the tag.
    let after_open = compiler.tool_calls(&functions, Some(tags), syntax, false, false).unwrap();
    let one = "get_time\n<arg_key>zone</arg_key>\n<arg_value>-7</arg_value>\n</tool_call>";
    assert!(follow(&tokenizer, &after_open, one).is_ok());
    for refused in [
        "get_date\n</tool_call>",
        "get_time\n<arg_key>zone</arg_key>\n<arg_value>\"-7\"</arg_value>\n</tool_call>",
        "get_time\n</tool_call>",
        "get_weather\n<arg_key>city</arg_key>\n<arg_value>Reykjavik</arg_value>\n</tool_call>",
    ] {
        assert!(follow(&tokenizer, &after_open, refused).is_err(), "{refused:?}");
    }
}

/// Follows `text` (tags written in) token by token under `grammar`: the end, or the first
/// refused token's text.
fn follow(tokenizer: &Tokenizer, grammar: &Grammar, text: &str) -> Result<Option<GuideEnd>, String> {
    let mut guide = Guidance::grammar(grammar.clone()).guide();
    for t in tokenizer.encode(text).unwrap() {
        if !allowed(&mut guide).contains(&t) {
            return Err(tokenizer.decode(&[t], false).unwrap());
        }
        if let Some(end) = guide.accept(t) {
            return Ok(Some(end));
        }
    }
    Ok(None)
}

/// tiny-gptoss-f32's tokenizer, its harmony tags, and a compiler with `<|return|>` and
/// `<|call|>` among the ends of a sequence (as gpt-oss's generation config has them).
fn harmony() -> (Tokenizer, HarmonyTags, GrammarCompiler) {
    let tokenizer = Tokenizer::from_dir(&llaisys_tests::fixture_dir("tiny-gptoss-f32")).unwrap();
    let tags = HarmonyTags::find(|t| tokenizer.token_to_id(t)).unwrap();
    assert!(tags.constrain.is_some());
    let compiler = GrammarCompiler::new(&tokenizer, 1024, &[tags.ret, tags.call]).unwrap();
    (tokenizer, tags, compiler)
}

/// gpt-oss's required call (tiny-gptoss-f32's vocabulary with the harmony tags, `<|call|>` among
/// the ends of a sequence as in gpt-oss's generation config): at most one analysis message, then
/// at most one preamble, a call's header naming an offered tool, arguments held to its schema,
/// and `<|call|>`, which completes the grammar. The final channel, a second analysis, an unknown
/// tool and a body without `<|call|>` are refused. Sampling with the tags favoured reaches both tools, with
/// and without the analysis.
#[test]
fn a_harmony_call_may_follow_one_analysis_message_and_ends_the_turn() {
    let (tokenizer, tags, compiler) = harmony();
    let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                         "required": ["city"], "additionalProperties": false});
    let time = json!({"type": "object", "properties": {"zone": {"type": "integer", "minimum": -9, "maximum": 9}},
                      "required": ["zone"], "additionalProperties": false});
    let grammar = compiler.harmony_turn(&[("get_weather", &weather), ("get_time", &time)], tags, true, None).unwrap();

    let follow = |text: &str| follow(&tokenizer, &grammar, text);
    let call =
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
    assert_eq!(follow(call), Ok(Some(GuideEnd::Complete)));
    let spaced = call.replace(r#""city":"#, r#""city": "#);
    assert_eq!(follow(&spaced), Ok(Some(GuideEnd::Complete)));
    let thought = format!("<|channel|>analysis<|message|>Need weather: call it.<|end|><|start|>assistant{call}");
    assert_eq!(follow(&thought), Ok(Some(GuideEnd::Complete)));
    // One preamble may come before the call, after the analysis or alone; not two.
    let preamble = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant";
    assert_eq!(follow(&format!("{preamble}{call}")), Ok(Some(GuideEnd::Complete)));
    let both = format!("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant{preamble}{call}");
    assert_eq!(follow(&both), Ok(Some(GuideEnd::Complete)));
    assert!(follow(&format!("{preamble}{preamble}{call}")).is_err());
    // Not a call: the final channel, a second analysis, another tool, arguments off the schema,
    // a body ended as an answer.
    assert!(follow("<|channel|>final<|message|>Hi<|return|>").is_err());
    let twice = format!("<|channel|>analysis<|message|>a<|end|><|start|>assistant{thought}");
    assert!(follow(&twice).is_err());
    assert!(follow(&call.replace("get_weather", "get_news")).is_err());
    assert!(follow(&call.replace("Paris", "Parisian")).is_err());
    assert!(follow(&call.replace("<|call|>", "<|return|>")).is_err());

    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..40 {
        let params = SamplingParams { temperature: 1.0, seed: Some(seed), ..SamplingParams::default() };
        let mut sampler = Sampler::new(params, &[]).guided(&Guidance::grammar(grammar.clone()));
        let mut logits = vec![0.0; 1024];
        for tag in [tags.channel, tags.end] {
            logits[tag as usize] = 6.0;
        }
        let mut tokens = Vec::new();
        let mut end = None;
        while tokens.len() < 400 && end.is_none() {
            let s = sampler.sample(&logits);
            tokens.push(s.token);
            end = s.end;
        }
        assert_eq!(end, Some(GuideEnd::Complete), "{:?}", tokenizer.decode(&tokens, false));
        let text = tokenizer.decode(&tokens, false).unwrap();
        let (head, rest) = text.split_once("<|channel|>commentary to=functions.").unwrap_or_else(|| panic!("{text:?}"));
        // Before the call: an analysis, then a preamble, each optional.
        let messages: Vec<&str> = head.split_terminator("<|end|><|start|>assistant").collect();
        let kinds: Vec<bool> = messages.iter().map(|m| m.starts_with("<|channel|>analysis<|message|>")).collect();
        let preamble = |m: &&str| m.starts_with("<|channel|>commentary<|message|>");
        assert!(head.is_empty() || head.ends_with("<|end|><|start|>assistant"), "{text:?}");
        assert!(matches!(kinds[..], [] | [_] | [true, false]), "{text:?}");
        assert!(messages.iter().zip(&kinds).all(|(m, &a)| a || preamble(m)), "{text:?}");
        let (name, args) = rest.split_once(" <|constrain|>json<|message|>").unwrap_or_else(|| panic!("{text:?}"));
        let args: serde_json::Value =
            serde_json::from_str(args.strip_suffix("<|call|>").unwrap()).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        match name {
            "get_weather" => assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 6), "{text:?}"),
            "get_time" => {
                assert!(args["zone"].as_f64().is_some_and(|z| z.fract() == 0.0 && z.abs() <= 9.0), "{text:?}")
            }
            other => panic!("{other:?} in {text:?}"),
        }
        seen.insert((name.to_string(), kinds.first() == Some(&true)));
    }
    assert_eq!(seen.len(), 4, "both tools, with and without analysis: {seen:?}");
}

/// A thinking budget on a harmony turn: after `budget` tokens of the analysis message its
/// `<|end|>` is the only token allowed, then the final answer (after any preamble) or, where
/// tools are offered, a call; a budget of 0 allows no analysis at all, and with a required call
/// the analysis is capped the same way.
#[test]
fn a_harmony_thinking_budget_ends_the_analysis_and_holds_the_turn_to_the_format() {
    let (tokenizer, tags, compiler) = harmony();
    let weather = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let thought = "<|channel|>analysis<|message|>one two three four five six";
    let answer = "<|channel|>final<|message|>Sunny.<|return|>";
    let call =
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
    for (functions, required) in
        [(vec![], false), (vec![("get_weather", &weather)], false), (vec![("get_weather", &weather)], true)]
    {
        let grammar = compiler.harmony_turn(&functions, tags, required, Some(3)).unwrap();
        // Three tokens of thought, then only the end of the message.
        let mut guide = Guidance::grammar(grammar.clone()).guide();
        let ids = tokenizer.encode(thought).unwrap();
        let opened = ids.iter().position(|&t| t == tags.message).unwrap() + 1;
        for &t in &ids[..opened + 3] {
            assert!(allowed(&mut guide).contains(&t), "{}", tokenizer.decode(&[t], false).unwrap());
            assert_eq!(guide.accept(t), None);
        }
        assert_eq!(allowed(&mut guide), [tags.end]);
        let short = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant";
        if required {
            assert_eq!(follow(&tokenizer, &grammar, &format!("{short}{call}")), Ok(Some(GuideEnd::Complete)));
            assert!(follow(&tokenizer, &grammar, &format!("{short}{}", answer)).is_err());
            continue;
        }
        assert_eq!(follow(&tokenizer, &grammar, &format!("{short}{}", answer)), Ok(Some(GuideEnd::Complete)));
        let preamble =
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Ok<|return|>";
        assert_eq!(follow(&tokenizer, &grammar, preamble), Ok(Some(GuideEnd::Complete)));
        assert_eq!(follow(&tokenizer, &grammar, call).is_ok(), !functions.is_empty(), "{functions:?}");
    }
    // No budget for thinking: no analysis.
    let none = compiler.harmony_turn(&[], tags, false, Some(0)).unwrap();
    assert!(follow(&tokenizer, &none, thought).is_err());
    assert_eq!(follow(&tokenizer, &none, answer), Ok(Some(GuideEnd::Complete)));
}
