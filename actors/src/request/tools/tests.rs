use super::*;

const TAGS: ToolCallTags = ToolCallTags::pair(1, 2);

/// The calls of `<tool_call>` + `pieces` + `</tool_call>` for each call, pieces as tokens' text.
fn parse(calls: &[Vec<&str>]) -> Vec<ToolCallOut> {
    parse_with(&ToolParsing::json(TAGS, true), calls)
}

fn parse_with(parsing: &ToolParsing, calls: &[Vec<&str>]) -> Vec<ToolCallOut> {
    let mut parser = ToolCallParser::new(parsing);
    let mut out: Vec<ToolCallOut> = Vec::new();
    for pieces in calls {
        assert_eq!(parser.route(TAGS.open), Route::Call);
        for piece in pieces {
            assert_eq!(parser.route(100), Route::Call);
            for delta in parser.push_call_text(piece) {
                if delta.id.is_some() {
                    assert_eq!(delta.index, out.len(), "a call's header comes once, in order");
                    out.push(ToolCallOut::default());
                } else {
                    assert_eq!(delta.index + 1, out.len());
                }
                out[delta.index].add(&delta);
            }
        }
        assert_eq!(parser.route(2), Route::Call);
    }
    assert_eq!(parser.route(100), Route::Text);
    out
}

const CASES: &[(&str, &str, &str)] = &[
    ("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n", "get_weather", "{\"city\": \"Paris\"}"),
    ("\n{\"name\": \"noop\", \"arguments\": {}}\n", "noop", "{}"),
    (
        "{\"name\":\"f\",\"arguments\":{\"q\":\"say \\\"hi\\\" {not json}\",\"n\":[1,{\"d\":{\"e\":null}}],\"u\":\"東京 ☃\"}}",
        "f",
        "{\"q\":\"say \\\"hi\\\" {not json}\",\"n\":[1,{\"d\":{\"e\":null}}],\"u\":\"東京 ☃\"}",
    ),
    ("{\"name\": \"esc\\u0061pe\", \"arguments\": {\"k\": 1}}", "escape", "{\"k\": 1}"),
    ("{\"name\": \"num\", \"arguments\": 42}", "num", "42"),
    ("{\"name\": \"s\", \"arguments\": \"{\\\"a\\\": 1}\"}", "s", "\"{\\\"a\\\": 1}\""),
    ("{\"arguments\": {\"x\": [true, false]}, \"name\": \"late\"}", "late", "{\"x\": [true, false]}"),
];

#[test]
fn whole_calls_give_their_name_and_exact_argument_bytes() {
    for (text, name, arguments) in CASES {
        let calls = parse(&[vec![text]]);
        assert_eq!(calls.len(), 1, "{text}");
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), (*name, *arguments), "{text}");
        assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
    }
}

#[test]
fn any_split_into_pieces_gives_the_same_calls_as_the_whole() {
    for (text, name, arguments) in CASES {
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        for &(cut, _) in &chars {
            let calls = parse(&[vec![&text[..cut], &text[cut..]]]);
            assert_eq!(
                (calls[0].name.as_str(), calls[0].arguments.as_str()),
                (*name, *arguments),
                "cut at {cut}: {text}"
            );
        }
        // Every character its own token.
        let pieces: Vec<&str> = chars.iter().map(|&(i, c)| &text[i..i + c.len_utf8()]).collect();
        let calls = parse(&[pieces]);
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), (*name, *arguments), "{text}");
    }
}

#[test]
fn several_calls_get_their_own_index_and_id_and_text_around_them_is_content() {
    let calls =
        parse(&[vec![CASES[0].0], vec![CASES[1].0, ""], vec!["{\"name\": \"x\",", " \"arguments\": {\"a\": 1}}"]]);
    let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["get_weather", "noop", "x"]);
    assert_eq!(calls[2].arguments, "{\"a\": 1}");
    let ids: std::collections::HashSet<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids.len(), 3);
    let mut parser = ToolCallParser::new(&ToolParsing::json(TAGS, true));
    assert_eq!(parser.route(100), Route::Text);
    assert!(!parser.made_calls());
    assert_eq!(parser.route(2), Route::Text, "a stray closing tag is text (dropped as special)");
    assert_eq!(parser.route(TAGS.open), Route::Call);
    assert!(parser.made_calls());
}

/// Found by fuzzing: on malformed JSON the name must not depend on how the text is split into
/// tokens (the streamed header carries the first name it reads): a stray `: "value"` after the
/// name, or a second name, is not part of it.
#[test]
fn the_first_name_is_the_name_however_the_text_is_split() {
    for text in ["{\"name\": \"game\": \"f\"}", "{\"name\": \"a\", \"name\": \"b\", \"arguments\": {}}"] {
        let whole = parse(&[vec![text]]);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let split = parse(&[chars.iter().map(String::as_str).collect()]);
        let names = |calls: &[ToolCallOut]| calls.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&whole), names(&split), "{text}");
        assert_eq!(names(&whole)[0], if text.contains("game") { "game" } else { "a" });
    }
}

/// Qwen3.5's calls as its template writes them, for a tool with a text, an integer, a choice,
/// an object and a boolean parameter.
const XML_CASES: &[(&str, &str, &str)] = &[
    (
        "\n<function=get_weather>\n<parameter=city>\nNew \"York\"\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n",
        "get_weather",
        "{\"city\": \"New \\\"York\\\"\", \"days\": 3}",
    ),
    (
        "\n<function=get_weather>\n<parameter=city>\nline one\n</parameter> is not the end\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n",
        "get_weather",
        "{\"city\": \"line one\\n</parameter> is not the end\", \"unit\": \"celsius\"}",
    ),
    (
        "\n<function=get_weather>\n<parameter=filter>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=fresh>\nTrue\n</parameter>\n<parameter=city>\n42\n</parameter>\n</function>\n",
        "get_weather",
        "{\"filter\": {\"a\": [1, 2]}, \"fresh\": true, \"city\": \"42\"}",
    ),
    ("\n<function=noop>\n</function>\n", "noop", "{}"),
    ("\n<function=noop>\n<parameter=extra>\n\n</parameter>\n</function>\n", "noop", "{\"extra\": \"\"}"),
];

/// Mistral's calls: `[TOOL_CALLS]`, then a JSON array of calls and no closing tag. Each object
/// is a call with its exact argument bytes and an id of nine letters and digits, however the
/// text is split (a piece that ends one call and begins the next included); text after the
/// array is content again.
#[test]
fn an_array_of_calls_after_an_open_tag_gives_each_call_however_split() {
    let parsing = ToolParsing::json(ToolCallTags::array(1), true);
    let text = " [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par}]is\", \"n\": [1, {\"d\": null}]}}, {\"name\": \"noop\", \"arguments\": {}}]";
    let want = [("get_weather", "{\"city\": \"Par}]is\", \"n\": [1, {\"d\": null}]}"), ("noop", "{}")];
    let chars: Vec<char> = text.chars().collect();
    for width in (1..=12).chain([chars.len()]) {
        let mut parser = ToolCallParser::new(&parsing);
        assert_eq!(parser.route(7), Route::Text, "before the tag, text");
        assert_eq!(parser.route(1), Route::Call);
        assert!(parser.is_tag(1) && !parser.is_tag(2));
        let mut calls: Vec<ToolCallOut> = Vec::new();
        for piece in chars.chunks(width) {
            assert_eq!(parser.route(100), Route::Call);
            for delta in parser.push_call_text(&piece.iter().collect::<String>()) {
                assert_eq!(delta.id.is_some(), delta.index == calls.len(), "a call's header comes once, first");
                ToolCallOut::gather(&mut calls, &delta);
            }
        }
        let got: Vec<(&str, &str)> = calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect();
        assert_eq!(got, want, "pieces of {width}");
        assert!(calls.iter().all(|c| c.id.len() == 9 && c.id.chars().all(|c| c.is_ascii_alphanumeric())));
        assert_eq!(parser.route(100), Route::Text, "after the array, text");
    }
}

/// Mistral's newer calls: `[TOOL_CALLS]name[ARGS]{...}` per call (Small 3.2 with `[CALL_ID]`
/// and an id between), no closing tag. Each gives its name (without the space a SentencePiece
/// vocabulary writes before it) and its exact argument bytes, however split; an id the model
/// wrote is not the call's (the call gets its own nine letters and digits); text after a call's
/// arguments is nobody's until the next call.
#[test]
fn named_calls_after_an_open_tag_give_each_call_however_split() {
    const OPEN: u32 = 1;
    const ARGS: u32 = 3;
    const ID: u32 = 4;
    let parsing =
        ToolParsing::json(ToolCallTags { args: Some(ARGS), call_id: Some(ID), ..ToolCallTags::array(OPEN) }, true);
    // (token, text) in order; a tag's text is empty.
    let args = "{\"city\": \"Par}]is\", \"n\": [1, {\"d\": \"\\\"}\"}]}";
    let output = [
        (OPEN, ""),
        (0, " get_"),
        (0, "weather"),
        (ID, ""),
        (0, "a1B2c3D4e"),
        (ARGS, ""),
        (0, args),
        (0, "\n"),
        (OPEN, ""),
        (0, "noop"),
        (ARGS, ""),
        (0, "{}"),
    ];
    let want = [("get_weather", args), ("noop", "{}")];
    for width in (1..=12).chain([usize::MAX]) {
        let mut parser = ToolCallParser::new(&parsing);
        assert_eq!(parser.route(7), Route::Text, "before the tag, text");
        assert!([OPEN, ARGS, ID].iter().all(|&t| parser.is_tag(t)) && !parser.is_tag(2));
        let mut calls: Vec<ToolCallOut> = Vec::new();
        let mut after = Vec::new();
        for &(token, text) in &output {
            if token != 0 {
                assert_eq!(parser.route(token), Route::Call);
                continue;
            }
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(width.min(chars.len()).max(1)) {
                if parser.route(100) == Route::Text {
                    after.push(piece.iter().collect::<String>());
                    continue;
                }
                for delta in parser.push_call_text(&piece.iter().collect::<String>()) {
                    assert_eq!(delta.id.is_some(), delta.index == calls.len(), "a call's header comes once, first");
                    ToolCallOut::gather(&mut calls, &delta);
                }
            }
        }
        let got: Vec<(&str, &str)> = calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect();
        assert_eq!(got, want, "pieces of {width}");
        assert!(
            calls
                .iter()
                .all(|c| c.id.len() == 9 && c.id != "a1B2c3D4e" && c.id.chars().all(|c| c.is_ascii_alphanumeric()))
        );
        assert_eq!(after, ["\n"], "pieces of {width}: after the first call's arguments, text");
        assert!(parser.made_calls());
    }
}

fn xml_parsing() -> ToolParsing {
    let weather = serde_json::json!({"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["celsius", "fahrenheit"]},
        "filter": {"type": "object"}, "fresh": {"type": "boolean"}}});
    let noop = serde_json::json!({"type": "object"});
    let xml = XmlTools::new(&[("get_weather", &weather), ("noop", &noop)]);
    ToolParsing { xml: Some(std::sync::Arc::new(xml)), ..ToolParsing::json(TAGS, true) }
}

/// An XML call gives its name, and its arguments as a JSON object: text parameters quoted (a
/// `</parameter>` not on a line of its own is part of the value), the others as written (Python's
/// `True` as JSON's), parameters the tool does not list as text; the same however it is split.
#[test]
fn xml_calls_give_their_name_and_arguments_as_json_however_split() {
    let parsing = xml_parsing();
    for (text, name, arguments) in XML_CASES {
        let calls = parse_with(&parsing, &[vec![text]]);
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), (*name, *arguments), "{text}");
        serde_json::from_str::<serde_json::Value>(&calls[0].arguments).unwrap();
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let split = parse_with(&parsing, &[chars.iter().map(String::as_str).collect()]);
        assert_eq!((split[0].name.as_str(), split[0].arguments.as_str()), (*name, *arguments), "{text}");
    }
    let two = parse_with(&parsing, &[vec![XML_CASES[3].0], vec![XML_CASES[0].0]]);
    assert_eq!(two.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["noop", "get_weather"]);
}

/// GLM's calls: `<tool_call>name`, then per argument `<arg_key>K</arg_key>` and
/// `<arg_value>V</arg_value>` on lines of their own, then `</tool_call>`; the tags are special
/// tokens (their text empty). Each call gives its name and its arguments as a JSON object (text
/// parameters quoted, the others as written, Python's `True` as JSON's), however the text between
/// the tags is split; text after a call is content.
#[test]
fn glm_calls_give_their_name_and_arguments_from_the_tags_however_split() {
    use llaisys_model::ArgTags;
    const OPEN: u32 = 1;
    const CLOSE: u32 = 2;
    let (key, key_end, value, value_end) = (5, 6, 7, 8);
    let tags =
        ToolCallTags { pairs: Some(ArgTags { key, key_end, value, value_end }), ..ToolCallTags::pair(OPEN, CLOSE) };
    let parsing = ToolParsing { tags: Some(tags), ..xml_parsing() };
    // (token, text) in order; a tag's text is empty.
    let output = [
        (OPEN, ""),
        (0, "get_weather\n"),
        (key, ""),
        (0, "city"),
        (key_end, ""),
        (0, "\n"),
        (value, ""),
        (0, "New \"York\"\n</arg_value> 東京"),
        (value_end, ""),
        (0, "\n"),
        (key, ""),
        (0, "fresh"),
        (key_end, ""),
        (0, "\n"),
        (value, ""),
        (0, "True"),
        (value_end, ""),
        (0, "\n"),
        (key, ""),
        (0, "filter"),
        (key_end, ""),
        (0, "\n"),
        (value, ""),
        (0, "{\"a\": [1, 2]}"),
        (value_end, ""),
        (0, "\n"),
        (CLOSE, ""),
        (0, "\n"),
        (OPEN, ""),
        (0, "noop\n"),
        (CLOSE, ""),
        (0, " done"),
    ];
    let want = [
        (
            "get_weather",
            "{\"city\": \"New \\\"York\\\"\\n</arg_value> 東京\", \"fresh\": true, \"filter\": {\"a\": [1, 2]}}",
        ),
        ("noop", "{}"),
    ];
    for width in (1..=6).chain([usize::MAX]) {
        let mut parser = ToolCallParser::new(&parsing);
        assert_eq!(parser.route(100), Route::Text, "before the tag, text");
        assert!([OPEN, CLOSE, key, key_end, value, value_end].iter().all(|&t| parser.is_tag(t)) && !parser.is_tag(3));
        let (mut calls, mut after): (Vec<ToolCallOut>, Vec<String>) = (Vec::new(), Vec::new());
        let add = |calls: &mut Vec<ToolCallOut>, deltas: Vec<ToolCallDelta>| {
            for delta in deltas {
                assert_eq!(delta.id.is_some(), delta.index == calls.len(), "a call's header comes once, first");
                ToolCallOut::gather(calls, &delta);
            }
        };
        for &(token, text) in &output {
            if token != 0 {
                assert_eq!(parser.route(token), Route::Call);
                add(&mut calls, parser.push_tag(token));
                continue;
            }
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(width.min(chars.len()).max(1)) {
                let piece: String = piece.iter().collect();
                match parser.route(100) {
                    Route::Text => after.push(piece),
                    Route::Call => add(&mut calls, parser.push_call_text(&piece)),
                }
            }
        }
        let got: Vec<(&str, &str)> = calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect();
        assert_eq!(got, want, "pieces of {width}");
        serde_json::from_str::<serde_json::Value>(&calls[0].arguments).unwrap();
        assert!(calls.iter().all(|c| c.id.starts_with("call_")));
        assert_eq!(after.concat(), "\n done", "pieces of {width}: between and after the calls, text");
    }
}
