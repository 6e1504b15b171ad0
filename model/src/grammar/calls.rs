//! T3: the grammar of tool calls in the syntax a model's chat template writes them: between its
//! `<tool_call>` tags, Qwen2's and Qwen3's JSON object or Qwen3.5's (and Qwen3-Coder's) XML
//! elements, each parameter's value as the template writes it (text as it is, anything else as
//! JSON); or, for Llama 3.x, the whole answer one JSON object with the call's `parameters`;
//! Mistral's, after `[TOOL_CALLS]`, a JSON array of calls (7B v0.3, Nemo; Granite 3's the same
//! after `<|tool_call|>`) or each call's name, then `[ARGS]` and its arguments (Mistral Small
//! 3.2, Devstral, Magistral); GLM's, after `<tool_call>`, the call's name, then each argument's
//! key and value between tags of their own, the value as the XML syntax writes it.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How a model writes a tool call between its tags (its chat template says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum CallSyntax {
    /// `{"name": N, "arguments": A}` on a line of its own (Qwen2, Qwen3).
    #[default]
    Json,
    /// `<function=N>`, then `<parameter=P>`, the value on lines of its own, `</parameter>` per
    /// argument, then `</function>` (Qwen3.5, Qwen3-Coder).
    Xml,
    /// No tags: the answer is one call, `{"name": N, "parameters": A}` (Llama 3.1–3.3).
    Bare,
    /// `[TOOL_CALLS]`, then the calls as a JSON array of `{"name": N, "arguments": A}` to the
    /// end of the turn (Mistral 7B v0.3, Nemo).
    JsonArray,
    /// The same array after `<|tool_call|>` (Granite 3).
    TaggedList,
    /// `[TOOL_CALLS]N[ARGS]A` per call, one after another to the end of the turn, with
    /// `[CALL_ID]` and the call's id between the name and `[ARGS]` where `ids` (Mistral Small
    /// 3.2; Devstral and Magistral write none).
    Named { ids: bool },
    /// `<tool_call>N`, then `<arg_key>K</arg_key>` and `<arg_value>V</arg_value>`, each on a
    /// line of its own, per argument (V as the XML syntax writes a value: text as it is,
    /// anything else as JSON), then `</tool_call>` (GLM-4.5 and later); the argument tags are
    /// special tokens.
    ArgPairs,
}

/// A syntax's special tokens, by text (`CallSyntax::tags`) or by id in a vocabulary
/// ([`ToolCallTags`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallTags<T> {
    /// Opens a call (or Mistral's array of calls).
    pub open: T,
    /// Closes a call; `None`: the calls run to the end of the turn.
    pub close: Option<T>,
    /// Ends a call's name and begins its arguments (Mistral's `[ARGS]`).
    pub args: Option<T>,
    /// Precedes a call's id, after its name (Mistral Small 3.2's `[CALL_ID]`).
    pub call_id: Option<T>,
    /// Around each argument's key and value (GLM's `<arg_key>`, `<arg_value>`).
    pub pairs: Option<ArgTags<T>>,
}

/// The tags around a call's argument in `CallSyntax::ArgPairs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgTags<T> {
    /// `<arg_key>`, `</arg_key>`.
    pub key: T,
    pub key_end: T,
    /// `<arg_value>`, `</arg_value>`.
    pub value: T,
    pub value_end: T,
}

impl ArgTags<&'static str> {
    const GLM: Self = Self { key: "<arg_key>", key_end: "</arg_key>", value: "<arg_value>", value_end: "</arg_value>" };
}

impl<T: Copy + PartialEq> ArgTags<T> {
    /// Which of the tags `token` is.
    pub fn find(&self, token: T) -> Option<ArgTag> {
        [
            (self.key, ArgTag::Key),
            (self.key_end, ArgTag::KeyEnd),
            (self.value, ArgTag::Value),
            (self.value_end, ArgTag::ValueEnd),
        ]
        .into_iter()
        .find_map(|(t, tag)| (t == token).then_some(tag))
    }
}

/// One of `ArgTags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgTag {
    Key,
    KeyEnd,
    Value,
    ValueEnd,
}

/// A syntax's special tokens as ids in a model's vocabulary.
pub type ToolCallTags = CallTags<u32>;

/// OpenAI's harmony format's tokens in a model's vocabulary (gpt-oss: `<|start|>` = 200006,
/// ...): its messages' tags, which its calls are written between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarmonyTags {
    pub start: u32,
    pub channel: u32,
    pub message: u32,
    pub end: u32,
    pub call: u32,
    pub ret: u32,
    /// `<|constrain|>`, before a call's content type (`json`).
    pub constrain: Option<u32>,
}

impl HarmonyTags {
    /// The tags in a vocabulary, each looked up by its text with `id` (a single token or none);
    /// `None` unless all but `<|constrain|>` are there.
    pub fn find(id: impl Fn(&str) -> Option<u32>) -> Option<Self> {
        Some(Self {
            start: id("<|start|>")?,
            channel: id("<|channel|>")?,
            message: id("<|message|>")?,
            end: id("<|end|>")?,
            call: id("<|call|>")?,
            ret: id("<|return|>")?,
            constrain: id("<|constrain|>"),
        })
    }
}

impl ToolCallTags {
    /// Calls between `open` and `close` tags.
    pub const fn pair(open: u32, close: u32) -> Self {
        Self { open, close: Some(close), args: None, call_id: None, pairs: None }
    }

    /// An array of calls after `open`, to the end of the turn.
    pub const fn array(open: u32) -> Self {
        Self { open, close: None, args: None, call_id: None, pairs: None }
    }
}

impl<T> CallTags<T> {
    /// The same tags as `U`s (a vocabulary's ids), or the first error `f` gives.
    pub fn try_map<U, E>(self, mut f: impl FnMut(T) -> Result<U, E>) -> Result<CallTags<U>, E> {
        Ok(CallTags {
            open: f(self.open)?,
            close: self.close.map(&mut f).transpose()?,
            args: self.args.map(&mut f).transpose()?,
            call_id: self.call_id.map(&mut f).transpose()?,
            pairs: match self.pairs {
                Some(p) => Some(ArgTags {
                    key: f(p.key)?,
                    key_end: f(p.key_end)?,
                    value: f(p.value)?,
                    value_end: f(p.value_end)?,
                }),
                None => None,
            },
        })
    }
}

impl CallSyntax {
    /// The special tokens of its calls (by text); `None`: calls have no tags. A syntax with no
    /// closing tag writes its calls to the end of the turn.
    pub fn tags(self) -> Option<CallTags<&'static str>> {
        let mistral = CallTags { open: "[TOOL_CALLS]", close: None, args: None, call_id: None, pairs: None };
        let qwen = CallTags { open: "<tool_call>", close: Some("</tool_call>"), ..mistral };
        match self {
            Self::Json | Self::Xml => Some(qwen),
            Self::ArgPairs => Some(CallTags { pairs: Some(ArgTags::GLM), ..qwen }),
            Self::JsonArray => Some(mistral),
            Self::TaggedList => Some(CallTags { open: "<|tool_call|>", ..mistral }),
            Self::Named { ids } => {
                Some(CallTags { args: Some("[ARGS]"), call_id: ids.then_some("[CALL_ID]"), ..mistral })
            }
            Self::Bare => None,
        }
    }

    /// A call's id as the template must see it in the history: Mistral's templates take only
    /// ids of nine letters and digits, so another id becomes its last nine letters and digits,
    /// zeros before fewer (vLLM keeps a longer id's last nine characters); the same id always
    /// becomes the same, so a call and its result still pair. The others take any id.
    pub fn history_id(self, id: &str) -> String {
        match self {
            Self::JsonArray | Self::Named { .. } => {
                let kept: Vec<char> = id.chars().filter(char::is_ascii_alphanumeric).collect();
                let last: String = kept[kept.len().saturating_sub(9)..].iter().collect();
                format!("{last:0>9}")
            }
            _ => id.to_string(),
        }
    }
}

/// Whether an XML call writes a parameter of this schema as text (its value as it is, a string
/// argument) rather than as JSON: a string type (alone or among others), or strings to choose
/// from. What the grammar makes the model write and what the parser reads back agree on it.
pub fn written_as_text(schema: &Value) -> bool {
    let strings = |v: &Value| v.as_array().is_some_and(|e| !e.is_empty() && e.iter().all(Value::is_string));
    match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(types)) => types.iter().any(|t| t == "string"),
        _ => schema.get("enum").is_some_and(strings) || schema.get("const").is_some_and(Value::is_string),
    }
}

/// The schema of a JSON call to one of `functions`: `{"name": N, key: A}` with A held to N's
/// parameters' schema, written as the template writes JSON.
fn json_call(functions: &[(&str, &Value)], key: &str) -> Value {
    let calls: Vec<Value> = functions
        .iter()
        .map(|(name, parameters)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": name}, key: parameters},
                "required": ["name", key],
                "additionalProperties": false
            })
        })
        .collect();
    json!({"anyOf": calls, "x-guidance": template_json()})
}

/// The Lark grammar of an answer that is one call to one of `functions` (each name with its
/// parameters' schema), with no tags (`CallSyntax::Bare`).
pub(super) fn bare_call_grammar(functions: &[(&str, &Value)]) -> String {
    format!("start: %json {}\n", json_call(functions, "parameters"))
}

/// The Lark grammar of Mistral's (and Granite's) calls to `functions` (each name with its
/// parameters' schema): a JSON array of calls after `first` (the `[TOOL_CALLS]` or
/// `<|tool_call|>` tag, or nothing when the model wrote it), more than one if `parallel`. A SentencePiece vocabulary writes a space before the array.
pub(super) fn call_array_grammar(functions: &[(&str, &Value)], first: &str, parallel: bool) -> String {
    let more = if parallel { " (\", \" call)*" } else { "" };
    let schema = json_call(functions, "arguments");
    format!("start: {first}\" \"? \"[\" call{more} \"]\"\ncall: %json {schema}\n")
}

/// The Lark grammar of Mistral's newer calls to `functions` (each name with its parameters'
/// schema): after `first` (the tag, or nothing when the model wrote it), a name (a SentencePiece
/// vocabulary may write a space before it), `[CALL_ID]` and nine letters and digits where the
/// syntax has ids, `[ARGS]` and the arguments as the template writes JSON; each further call,
/// if `parallel`, opened by the tag again.
pub(super) fn named_calls_grammar(
    functions: &[(&str, &Value)],
    tags: ToolCallTags,
    first: &str,
    parallel: bool,
) -> String {
    let more = if parallel { format!(" (<[{}]> call)*", tags.open) } else { String::new() };
    let id = tags.call_id.map_or(String::new(), |t| format!(" <[{t}]> /[a-zA-Z0-9]{{9}}/"));
    let args = tags.args.map_or(String::new(), |t| format!(" <[{t}]>"));
    let names: Vec<String> = (0..functions.len()).map(|f| format!("f{f}")).collect();
    let mut g = format!(
        "start: {first}call{more}
call: {}
",
        names.join(" | ")
    );
    for (f, (name, parameters)) in functions.iter().enumerate() {
        let mut schema = (*parameters).clone();
        if let Value::Object(map) = &mut schema {
            map.insert("x-guidance".into(), template_json());
        }
        g += &format!("f{f}: \" \"? {}{id}{args} %json {schema}\n", Value::from(*name));
    }
    g
}

/// The Lark grammar of calls to `functions` (each name with its parameters' schema) between
/// tags, in `syntax`: `first` opens the first call (or nothing when the model opened it), `more`
/// the part after a call that allows another, `close` the closing tag's id, `pairs` the argument
/// tags' (`CallSyntax::ArgPairs`).
pub(super) fn calls_grammar(
    functions: &[(&str, &Value)],
    syntax: CallSyntax,
    first: &str,
    more: &str,
    close: u32,
    pairs: Option<ArgTags<u32>>,
) -> String {
    // Qwen2 models often end a call's line before the end of their turn.
    let start = format!("start: {first}call{more} \"\\n\"?\n");
    match syntax {
        CallSyntax::Json
        | CallSyntax::Bare
        | CallSyntax::JsonArray
        | CallSyntax::TaggedList
        | CallSyntax::Named { .. } => {
            let schema = json_call(functions, "arguments");
            format!("{start}call: \"\\n\" %json {schema} \"\\n\" <[{close}]>\n")
        }
        CallSyntax::Xml | CallSyntax::ArgPairs => {
            let names: Vec<String> = (0..functions.len()).map(|f| format!("f{f}")).collect();
            let names = names.join(" | ");
            // GLM's name follows the tag, and its lines end before the closing tag (only its
            // tags have `pairs`).
            let (elements, mut g) = match pairs {
                Some(tags) => (Elements::Pairs(tags), format!("{start}call: ({names}) <[{close}]>\n")),
                None => (Elements::Xml, format!("{start}call: \"\\n\" ({names}) \"\\n\" <[{close}]>\n")),
            };
            for (f, (name, parameters)) in functions.iter().enumerate() {
                g += &element_function(f, name, parameters, elements);
            }
            g
        }
    }
}

/// How a call's arguments are written one by one: Qwen3.5's XML elements, or GLM's key and
/// value tags.
#[derive(Clone, Copy)]
enum Elements {
    Xml,
    Pairs(ArgTags<u32>),
}

impl Elements {
    /// The Lark items before a call's arguments and after them.
    fn call(self, name: &str) -> (String, Option<String>) {
        match self {
            Self::Xml => (lit(&format!("<function={name}>\n")), Some(lit("</function>"))),
            Self::Pairs(_) => (lit(&format!("{name}\n")), None),
        }
    }

    /// The Lark items before an argument's value and after it.
    fn argument(self, param: &str) -> (String, String) {
        match self {
            Self::Xml => (lit(&format!("<parameter={param}>\n")), lit("\n</parameter>\n")),
            Self::Pairs(t) => (
                format!("<[{}]> {} <[{}]> \"\\n\" <[{}]>", t.key, lit(param), t.key_end, t.value),
                format!("<[{}]> \"\\n\"", t.value_end),
            ),
        }
    }
}

/// `s` as a Lark string literal.
fn lit(s: &str) -> String {
    Value::from(s).to_string()
}

/// The Lark grammar of a turn in OpenAI's harmony format (gpt-oss), after the prompt's
/// `<|start|>assistant`: at most one analysis message (the model's reasoning, free text to its
/// `<|end|>`, at most `budget` tokens of it, none for 0; then the next message's
/// `<|start|>assistant`), then, where `call` says a call must be made, at most one preamble (a
/// `commentary` message with no recipient) and one call to one of `functions` (each name with
/// its parameters' schema, as `%json` takes it):
/// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`, the arguments and
/// `<|call|>`, which ends the turn (a harmony turn makes one call); otherwise the final answer
/// (`<|channel|>final<|message|>…<|return|>`), after any preambles (`commentary` messages with
/// no recipient), or such a call where `functions` are offered.
pub(super) fn harmony_grammar(
    functions: &[(&str, Value)],
    tags: HarmonyTags,
    call: bool,
    budget: Option<usize>,
) -> String {
    let HarmonyTags { start, channel, message, end, ret, .. } = tags;
    let mut g = match budget {
        Some(0) => "start: reply\n".to_string(),
        _ => format!(
            r#"start: analysis? reply
analysis: <[{channel}]> "analysis" <[{message}]> think <[{end}]> <[{start}]> "assistant"
"#
        ),
    };
    match budget {
        Some(0) => {}
        Some(b) => g += &format!("think[max_tokens={b}]: /(?s:.*)/\n"),
        None => g += "think: /(?s:.*)/\n",
    }
    if call {
        // One preamble may come first (`commentary` with no recipient, which the model shows the
        // user before calling, as OpenAI's harmony guide has it).
        g += &format!(
            r#"reply: (<[{channel}]> "commentary" <[{message}]> text <[{end}]> <[{start}]> "assistant")? call
text: /(?s:.*)/
"#
        );
    } else {
        let call = if functions.is_empty() { "" } else { " | call" };
        g += &format!(
            r#"reply: <[{channel}]> "final" <[{message}]> text <[{ret}]> | <[{channel}]> "commentary" <[{message}]> text <[{end}]> <[{start}]> "assistant" reply{call}
text: /(?s:.*)/
"#
        );
    }
    if !functions.is_empty() {
        // Without `<|constrain|>` in the vocabulary the content type follows a space.
        let constrain = tags.constrain.map_or(r#"" json""#.to_string(), |c| format!(r#"" " <[{c}]> "json""#));
        let names: Vec<String> = (0..functions.len()).map(|f| format!("f{f}")).collect();
        g += &format!("call: <[{channel}]> \"commentary to=functions.\" ({})\n", names.join(" | "));
        for (f, (name, schema)) in functions.iter().enumerate() {
            g += &format!("f{f}: {} {constrain} <[{message}]> %json {schema} <[{}]>\n", Value::from(*name), tags.call);
        }
    }
    g
}

/// JSON as the template writes it (Python's json.dumps separators): what the model was trained
/// on, and no room for runaway whitespace.
fn template_json() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": true})
}

/// Rule `f{f}`: a call of `name` as `elements`, its parameters in the schema's order, the
/// required ones always written.
fn element_function(f: usize, name: &str, parameters: &Value, elements: Elements) -> String {
    let properties = parameters.get("properties").and_then(Value::as_object);
    let required: Vec<&str> =
        parameters.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let (begin, finish) = elements.call(name);
    let mut body = vec![begin];
    let mut rules = String::new();
    for (p, (param, schema)) in properties.into_iter().flatten().enumerate() {
        let rule = format!("f{f}_{p}");
        let optional = if required.contains(&param.as_str()) { "" } else { "?" };
        body.push(format!("{rule}{optional}"));
        let (open, end) = elements.argument(param);
        rules += &if written_as_text(schema) {
            match (text_choices(schema), elements) {
                (Some(choices), _) => format!(
                    "{rule}: {open} ({}) {end}\n",
                    choices.iter().map(|c| lit(c)).collect::<Vec<_>>().join(" | ")
                ),
                // XML's value ends at text, which the value's lexeme must not take; a tag
                // token is no text of it.
                (None, Elements::Xml) => {
                    format!("{rule}: {open} {rule}_text\n{rule}_text[suffix={end}]: /{}/\n", text_regex(schema))
                }
                (None, Elements::Pairs(_)) => format!("{rule}: {open} /{}/ {end}\n", text_regex(schema)),
            }
        } else {
            let mut schema = schema.clone();
            if let Value::Object(map) = &mut schema {
                map.insert("x-guidance".into(), template_json());
            }
            format!("{rule}: {open} %json {schema} {end}\n")
        };
    }
    body.extend(finish);
    format!("f{f}: {}\n{rules}", body.join(" "))
}

/// The strings a text parameter is one of (`enum`, `const`), if it is.
fn text_choices(schema: &Value) -> Option<Vec<&str>> {
    if let Some(c) = schema.get("const").and_then(Value::as_str) {
        return Some(vec![c]);
    }
    let choices: Vec<&str> = schema.get("enum")?.as_array()?.iter().filter_map(Value::as_str).collect();
    (!choices.is_empty()).then_some(choices)
}

/// A free text parameter's value as a regex (inside Lark's `/.../`): its `pattern` (anchored at
/// both ends, as a JSON grammar reads it), else any text within its length bounds.
fn text_regex(schema: &Value) -> String {
    let regex = match schema.get("pattern").and_then(Value::as_str) {
        Some(p) => format!("(?:{})", p.strip_prefix('^').unwrap_or(p).strip_suffix('$').unwrap_or(p)),
        None => {
            let bound = |key| schema.get(key).and_then(Value::as_u64);
            match (bound("minLength"), bound("maxLength")) {
                (None, None) => "(?s:.*)".to_string(),
                (min, max) => {
                    format!("(?s:.{{{},{}}})", min.unwrap_or(0), max.map_or(String::new(), |m| m.to_string()))
                }
            }
        }
    };
    regex.replace('/', "\\/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_parameters_are_strings_or_choices_of_strings() {
        assert!(written_as_text(&json!({"type": "string", "maxLength": 3})));
        assert!(written_as_text(&json!({"type": ["string", "null"]})));
        assert!(written_as_text(&json!({"enum": ["a", "b"]})));
        assert!(written_as_text(&json!({"const": "x"})));
        assert!(!written_as_text(&json!({"type": "integer"})));
        assert!(!written_as_text(&json!({"enum": ["a", 1]})));
        assert!(!written_as_text(&json!({"anyOf": [{"type": "string"}]})));
        assert!(!written_as_text(&json!({})));
        assert_eq!(text_regex(&json!({"maxLength": 8})), "(?s:.{0,8})");
        assert_eq!(text_regex(&json!({"pattern": "^a/b$"})), "(?:a\\/b)");
    }
}
