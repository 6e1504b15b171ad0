//! Tool calls written as text: with `tool_choice: auto`, small models often answer a request
//! for a tool with the call's JSON in a ```json fence, or bare, instead of between their
//! tool-call tags. An answer that *begins* that way is held back until it is decided: a JSON
//! object that is exactly a call to an offered tool (`{"name": ..., "arguments": {...}}`, or
//! Llama 3's `{"name": ..., "parameters": {...}}` with an optional `"type": "function"`; the
//! name offered, the arguments an object with the tool's required keys and no key it does not
//! have, and, when the conversation is given, one of its argument values drawn from it) becomes a
//! tool call; anything else is let through as the text it was, unchanged. One call per answer;
//! text after it streams as content.
//!
//! The last condition is for precision: a model that answers "Hello!" or "What is 17 times
//! 23?" with a call's JSON invents its arguments (`{"city": "London"}`), while a call the
//! conversation asked for carries something of it (a city, an amount, an address).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The offered tools as the recogniser checks a call against them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TextCallSpec {
    pub tools: Vec<TextCallTool>,
    /// The conversation's text, lowercased: a call counts only when one of its argument values
    /// (a string of two characters or more, or one of its words of four or more, or a number)
    /// appears in it, or it has none. `None`: not checked.
    #[serde(default)]
    pub grounds: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextCallTool {
    pub name: String,
    /// Keys the arguments must have.
    pub required: Vec<String>,
    /// Keys the arguments may have (`None`: any).
    pub properties: Option<Vec<String>>,
}

impl TextCallTool {
    /// From a tool's name and JSON schema.
    pub fn new(name: &str, schema: &Value) -> Self {
        let keys = |v: Option<&Value>| -> Option<Vec<String>> {
            match v? {
                Value::Array(a) => Some(a.iter().filter_map(|k| k.as_str().map(str::to_string)).collect()),
                Value::Object(o) => Some(o.keys().cloned().collect()),
                _ => None,
            }
        };
        let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
        let properties = keys(schema.get("properties"));
        Self {
            name: name.into(),
            required: keys(schema.get("required")).unwrap_or_default(),
            // Open schemas (no `additionalProperties: false`) still name their keys: a call
            // with other keys is a guess at another tool, not this one.
            properties: if closed || properties.as_ref().is_some_and(|p| !p.is_empty()) { properties } else { None },
        }
    }
}

impl TextCallSpec {
    /// The call `json` is (name, arguments as compact JSON text), if it is exactly a call to
    /// one of the tools.
    pub fn call(&self, json: &str) -> Option<(String, String)> {
        let Value::Object(object) = serde_json::from_str::<Value>(json).ok()? else { return None };
        // `arguments` (Qwen, Hermes, OpenAI) or `parameters` (Llama 3), and nothing else but
        // Llama's optional `"type": "function"`.
        let typed = object.get("type").is_some_and(|t| t == "function");
        let args = object.get("arguments").or_else(|| object.get("parameters"));
        if object.len() != 2 + usize::from(typed) {
            return None;
        }
        let (Some(Value::String(name)), Some(Value::Object(arguments))) = (object.get("name"), args) else {
            return None;
        };
        let tool = self.tools.iter().find(|t| &t.name == name)?;
        let required = tool.required.iter().all(|k| arguments.contains_key(k));
        let known = tool.properties.as_ref().is_none_or(|p| arguments.keys().all(|k| p.contains(k)));
        let arguments = Value::Object(arguments.clone());
        (required && known && self.grounded(&arguments)).then(|| (name.clone(), arguments.to_string()))
    }

    /// Whether one of the arguments' values comes from the conversation (or there is none).
    fn grounded(&self, arguments: &Value) -> bool {
        let Some(conversation) = &self.grounds else { return true };
        let mut values = Vec::new();
        leaf_values(arguments, &mut values);
        values.is_empty() || values.iter().any(|v| conversation.contains(v.as_str()))
    }
}

/// The string (two characters or more, trimmed, lowercased; and their words of four or more)
/// and number values under `value`.
fn leaf_values(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => {
            let s = s.trim().to_lowercase();
            // A text the model wrote in its own words (a search query) counts by any of its
            // longer words.
            let words = s.split(|c: char| !c.is_alphanumeric()).filter(|w| w.chars().count() >= 4 && w.len() < s.len());
            out.extend(words.map(str::to_string));
            if s.chars().count() >= 2 {
                out.push(s);
            }
        }
        Value::Number(n) => match n.as_f64() {
            // `100.0` as the conversation would write it.
            Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => out.push(format!("{}", f as i64)),
            _ => out.push(n.to_string()),
        },
        Value::Array(items) => items.iter().for_each(|v| leaf_values(v, out)),
        Value::Object(fields) => fields.values().for_each(|v| leaf_values(v, out)),
        Value::Bool(_) | Value::Null => {}
    }
}

/// What the recogniser lets out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Emit {
    Text(String),
    Call {
        name: String,
        arguments: String,
    },
    /// The answer began with an object shaped as a call (`name` and `arguments` or
    /// `parameters`) that is not one of the offered tools' calls: its text, which the owner
    /// may answer again (`GenerateParams::text_retry`) or let out as it was.
    Rejected(String),
}

/// Longest answer held back while undecided; beyond it, it is text.
const MAX_HELD: usize = 16 * 1024;

/// The recogniser of one answer.
#[derive(Debug, Clone)]
pub struct TextCalls {
    spec: std::sync::Arc<TextCallSpec>,
    held: String,
    /// Decided: the rest is text.
    through: bool,
}

impl TextCalls {
    pub fn new(spec: std::sync::Arc<TextCallSpec>) -> Self {
        Self { spec, held: String::new(), through: false }
    }

    /// Whether answer text is held back, undecided.
    pub fn holding(&self) -> bool {
        !self.through && !self.held.is_empty()
    }

    /// Feeds answer text; what can be let out now.
    pub fn push(&mut self, text: &str) -> Vec<Emit> {
        if self.through {
            return if text.is_empty() { Vec::new() } else { vec![Emit::Text(text.into())] };
        }
        self.held.push_str(text);
        match self.decide(false) {
            Decision::Wait if self.held.len() <= MAX_HELD => Vec::new(),
            Decision::Wait | Decision::Text => self.let_through(),
            Decision::Rejected { end } => {
                let rest = self.held.split_off(end);
                self.through = true;
                let mut out = vec![Emit::Rejected(std::mem::take(&mut self.held))];
                if !rest.is_empty() {
                    out.push(Emit::Text(rest));
                }
                out
            }
            Decision::Call { end, name, arguments } => {
                // One call per answer: what follows it is content.
                let rest = self.held.split_off(end);
                self.held.clear();
                self.through = true;
                let mut out = vec![Emit::Call { name, arguments }];
                if !rest.is_empty() {
                    out.push(Emit::Text(rest));
                }
                out
            }
        }
    }

    /// The end of the answer: a call in a fence whose closing fence never came is a call (the
    /// answer ended there instead); whatever else is still held is text.
    pub fn finish(&mut self) -> Vec<Emit> {
        if !self.through
            && let Decision::Call { name, arguments, .. } = self.decide(true)
        {
            self.held.clear();
            self.through = true;
            return vec![Emit::Call { name, arguments }];
        }
        self.let_through()
    }

    fn let_through(&mut self) -> Vec<Emit> {
        self.through = true;
        let held = std::mem::take(&mut self.held);
        if held.is_empty() { Vec::new() } else { vec![Emit::Text(held)] }
    }

    /// Whether the held text is a call, may still become one, or is text; `ended`: no more text
    /// comes (a fence's closing ticks may be missing).
    fn decide(&self, ended: bool) -> Decision {
        let start = self.held.len() - self.held.trim_start().len();
        let body = &self.held[start..];
        if body.len() < 3 && "```".starts_with(body) {
            return Decision::Wait;
        }
        if let Some(after_ticks) = body.strip_prefix("```") {
            let Some(line_end) = after_ticks.find('\n') else {
                return if "json".starts_with(after_ticks.trim_end()) { Decision::Wait } else { Decision::Text };
            };
            if !matches!(after_ticks[..line_end].trim(), "" | "json") {
                return Decision::Text;
            }
            let inner_at = start + 3 + line_end + 1;
            let inner = &self.held[inner_at..];
            let object_at = inner_at + (inner.len() - inner.trim_start().len());
            return match self.object(object_at) {
                Scan::Incomplete => Decision::Wait,
                Scan::Not => Decision::Text,
                Scan::Complete(end) => {
                    let after = &self.held[end..];
                    let trimmed = after.trim_start();
                    if trimmed.len() < 3 && "```".starts_with(trimmed) {
                        if ended { self.call(object_at, end, self.held.len()) } else { Decision::Wait }
                    } else if trimmed.starts_with("```") {
                        let close = end + (after.len() - trimmed.len()) + 3;
                        self.call(object_at, end, close)
                    } else {
                        Decision::Text
                    }
                }
            };
        }
        if body.starts_with('{') {
            return match self.object(start) {
                Scan::Incomplete => Decision::Wait,
                Scan::Not => Decision::Text,
                Scan::Complete(end) => self.call(start, end, end),
            };
        }
        Decision::Text
    }

    /// The call of the object at `[from, to)`, consumed through `end`.
    fn call(&self, from: usize, to: usize, end: usize) -> Decision {
        let json = &self.held[from..to];
        match self.spec.call(json) {
            Some((name, arguments)) => Decision::Call { end, name, arguments },
            None if call_shaped(json) => Decision::Rejected { end },
            None => Decision::Text,
        }
    }

    /// Scans the JSON object starting at byte `at` of the held text.
    fn object(&self, at: usize) -> Scan {
        let text = &self.held[at..];
        if text.is_empty() {
            return Scan::Incomplete;
        }
        if !text.starts_with('{') {
            return Scan::Not;
        }
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for (i, c) in text.char_indices() {
            if in_string {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => in_string = true,
                '{' | '[' => depth += 1,
                '}' | ']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Scan::Complete(at + i + 1);
                    }
                }
                _ => {}
            }
        }
        Scan::Incomplete
    }
}

enum Decision {
    Wait,
    Text,
    /// A complete object shaped as a call, not an acceptable one, consumed through `end`.
    Rejected {
        end: usize,
    },
    Call {
        end: usize,
        name: String,
        arguments: String,
    },
}

/// Whether `json` is an object naming a function with its arguments (or Llama 3's
/// parameters): a call, acceptable or not, rather than JSON the answer is made of.
fn call_shaped(json: &str) -> bool {
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(json) else { return false };
    matches!(object.get("name"), Some(Value::String(_)))
        && (object.contains_key("arguments") || object.contains_key("parameters"))
}

enum Scan {
    Incomplete,
    Not,
    /// The object ends before this byte.
    Complete(usize),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn recogniser() -> TextCalls {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        TextCalls::new(Arc::new(TextCallSpec { tools: vec![TextCallTool::new("get_weather", &schema)], grounds: None }))
    }

    /// Feeds `text` in pieces of `step` bytes (at char boundaries); everything let out, in order.
    fn run(text: &str, step: usize) -> Vec<Emit> {
        let mut r = recogniser();
        let mut out = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + step).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            out.extend(r.push(&text[at..end]));
            at = end;
        }
        out.extend(r.finish());
        // Adjacent text pieces joined, so the splits do not matter.
        let mut joined: Vec<Emit> = Vec::new();
        for e in out {
            match (joined.last_mut(), e) {
                (Some(Emit::Text(a)), Emit::Text(b)) => a.push_str(&b),
                (_, e) => joined.push(e),
            }
        }
        joined
    }

    fn call(city: &str) -> Emit {
        Emit::Call { name: "get_weather".into(), arguments: json!({"city": city}).to_string() }
    }

    #[test]
    fn fenced_and_bare_calls_of_an_offered_tool_become_calls_in_any_split() {
        let fenced =
            "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```";
        for step in [1, 2, 3, 7, 100] {
            assert_eq!(run(fenced, step), vec![call("Paris")], "step {step}");
            assert_eq!(
                run("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"北京\"}}", step),
                vec![call("北京")]
            );
            let llama = "{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
            assert_eq!(run(llama, step), vec![call("Oslo")], "Llama 3's JSON call");
            assert_eq!(
                run("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", step),
                vec![call("Rome")]
            );
            assert_eq!(
                run(&format!("{fenced}\nI asked for the weather."), step),
                vec![call("Paris"), Emit::Text("\nI asked for the weather.".into())],
                "text after the call is content"
            );
            for unclosed in ["", "\n", "\n``"] {
                let answer = format!("{}{unclosed}", fenced.strip_suffix("\n```").unwrap());
                assert_eq!(run(&answer, step), vec![call("Paris")], "ended before its closing fence: {answer:?}");
            }
        }
    }

    #[test]
    fn anything_else_comes_out_as_the_text_it_was() {
        for text in [
            "Hello! How can I help?",
            "```python\nprint('hi')\n```",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
            "{\"a\": \"}\\\"{\"}",
            "{\"name\": \"Ada\", \"age\": 36}",
            "```",
            "   ",
        ] {
            for step in [1, 4, 100] {
                let expected = if text.is_empty() { vec![] } else { vec![Emit::Text(text.into())] };
                assert_eq!(run(text, step), expected, "{text:?} in steps of {step}");
            }
        }
    }

    #[test]
    fn a_call_no_tool_fits_is_rejected_whole_and_what_follows_is_text() {
        for call in [
            "```json\n{\"name\": \"reverse_string\", \"arguments\": {\"s\": \"x\"}}\n```",
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n```",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"extra\": 1}",
            "{\"type\": \"tool\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"parameters\": {}}",
        ] {
            for step in [1, 4, 100] {
                let text = format!("{call}\nDone.");
                let out = run(&text, step);
                assert_eq!(out[0], Emit::Rejected(call.into()), "{call:?} in steps of {step}");
                assert_eq!(out[1..], [Emit::Text("\nDone.".into())], "{call:?} in steps of {step}");
            }
        }
    }

    #[test]
    fn a_call_must_draw_an_argument_from_the_conversation_when_it_is_given() {
        let schema = json!({"type": "object", "properties": {"amount": {"type": "number"}, "to": {"type": "string"},
            "city": {"type": "string"}, "flags": {"type": "array"}}});
        let spec = |conversation: &str| TextCallSpec {
            tools: vec![TextCallTool::new("f", &schema)],
            grounds: Some(conversation.to_lowercase()),
        };
        let call = |conversation: &str, arguments: Value| {
            spec(conversation).call(&json!({"name": "f", "arguments": arguments}).to_string()).is_some()
        };
        assert!(call("Weather in PARIS?", json!({"city": "Paris"})), "any case");
        assert!(call("北京今天天气怎么样？", json!({"city": "北京"})));
        assert!(!call("Hello!", json!({"city": "London"})), "an invented city");
        assert!(!call("What is the capital of France?", json!({"city": "Paris"})));
        assert!(call("Convert 100 USD to euros", json!({"amount": 100.0, "to": "EUR"})), "one value is enough");
        assert!(call("Convert 2.5 dollars", json!({"amount": 2.5})));
        assert!(!call("Convert some dollars", json!({"amount": 100, "to": "EUR"})));
        assert!(call("Search the web for the latest Rust release", json!({"to": "latest Rust release notes"})));
        assert!(
            !call("What is the capital of France?", json!({"to": "the weather in London"})),
            "short words do not count"
        );
        assert!(call("anything", json!({})), "nothing to check");
        assert!(call("anything", json!({"city": " x "})), "one letter says nothing either way");
        assert!(call("ping Oslo", json!({"flags": [true, {"city": "oslo"}]})), "values at any depth");
        let unchecked = TextCallSpec { grounds: None, ..spec("") };
        assert!(unchecked.call(r#"{"name": "f", "arguments": {"city": "London"}}"#).is_some());
    }

    #[test]
    fn text_that_cannot_be_a_call_is_let_through_at_once() {
        let mut r = recogniser();
        assert_eq!(r.push("Sure"), vec![Emit::Text("Sure".into())]);
        assert_eq!(r.push("!"), vec![Emit::Text("!".into())]);
        let mut r = recogniser();
        assert_eq!(r.push("```py"), vec![Emit::Text("```py".into())]);
        let mut r = recogniser();
        assert_eq!(r.push("```json\n"), vec![], "held while it may be a call");
    }
}
