//! The model's own chat template (`chat_template` of `tokenizer_config.json`), rendered with
//! minijinja the way Hugging Face's `apply_chat_template` renders it.

use std::path::Path;

use minijinja::value::{Kwargs, Serde};
use minijinja::{Environment, ErrorKind, Value, context};

use crate::config::read_json;
use crate::error::LoadError;
use crate::grammar::CallSyntax;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls (T3).
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
    /// The message's images, in order. A message with images is given to the template as a
    /// list of parts (`{"type": "text", "text"}` and `{"type": "image"}`, as transformers'
    /// processors give them), where the model's template writes each image's placeholder.
    pub images: Vec<MessageImage>,
}

/// An image of a message, and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageImage {
    /// The byte offset into the message's `content` it stands at (ascending; several may stand
    /// at one).
    pub at: usize,
    pub image: std::sync::Arc<crate::vision::Image>,
}

/// A tool call of an assistant turn: the function and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), ..Self::default() }
    }

    /// The message as the template sees it: tool calls with parsed arguments (Hugging Face's
    /// templates print them with `tojson`), their ids as `syntax` takes them.
    fn to_value(&self, syntax: CallSyntax) -> Value {
        let content = match self.images.is_empty() {
            true => Value::from(self.content.as_str()),
            false => {
                let mut parts = Vec::new();
                let mut from = 0;
                for image in &self.images {
                    let mut at = image.at.clamp(from, self.content.len());
                    while !self.content.is_char_boundary(at) {
                        at += 1;
                    }
                    if let Some(text) = self.content.get(from..at).filter(|t| !t.is_empty()) {
                        parts.push(Value::from_pairs([("type", Value::from("text")), ("text", Value::from(text))]));
                    }
                    parts.push(Value::from_pairs([("type", Value::from("image"))]));
                    from = at;
                }
                if let Some(text) = self.content.get(from..).filter(|t| !t.is_empty()) {
                    parts.push(Value::from_pairs([("type", Value::from("text")), ("text", Value::from(text))]));
                }
                Value::from(parts)
            }
        };
        let mut pairs = vec![("role", Value::from(self.role.as_str())), ("content", content)];
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(|c| {
                    let arguments = serde_json::from_str::<serde_json::Value>(&c.arguments)
                        .map(|v| Value::from(Serde(v)))
                        .unwrap_or_else(|_| Value::from(c.arguments.as_str()));
                    let function =
                        Value::from_pairs([("name", Value::from(c.name.as_str())), ("arguments", arguments)]);
                    Value::from_pairs([
                        ("id", Value::from(syntax.history_id(&c.id))),
                        ("type", Value::from("function")),
                        ("function", function),
                    ])
                })
                .collect();
            pairs.push(("tool_calls", Value::from(calls)));
        }
        if let Some(id) = &self.tool_call_id {
            pairs.push(("tool_call_id", Value::from(syntax.history_id(id))));
        }
        Value::from_pairs(pairs)
    }
}

/// `source` with every backslash that ends a line inside a string literal of a tag dropped with
/// its line break: Jinja2 reads a string literal as Python does (a line continuation), where
/// minijinja would keep both. Mistral Small 3.x's templates break their default system message
/// so. In the text between tags a backslash is text, and stays.
fn join_continued_lines(source: &str) -> String {
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let (mut i, mut tag, mut quote) = (0, false, None::<u8>);
    while i < b.len() {
        let (c, next) = (b[i], b.get(i + 1).copied());
        match (tag, quote, next) {
            (false, _, Some(n @ (b'{' | b'%'))) if c == b'{' => {
                tag = true;
                out.extend([c, n]);
                i += 2;
                continue;
            }
            (true, None, Some(b'}')) if c == b'}' || c == b'%' => {
                tag = false;
                out.extend([c, b'}']);
                i += 2;
                continue;
            }
            (true, None, _) if c == b'"' || c == b'\'' => quote = Some(c),
            (true, Some(_), Some(b'\n')) if c == b'\\' => {
                i += 2;
                continue;
            }
            (true, Some(_), Some(n)) if c == b'\\' => {
                out.extend([c, n]);
                i += 2;
                continue;
            }
            (true, Some(q), _) if c == q => quote = None,
            _ => {}
        }
        out.push(c);
        i += 1;
    }
    // Only ASCII bytes were dropped, so the rest is still UTF-8.
    String::from_utf8(out).unwrap_or_else(|_| source.to_string())
}

/// How `python_json` writes JSON: the arguments of Python's `json.dumps` that Hugging Face's
/// `tojson` filter passes on (its defaults: `ensure_ascii=False`, no indent, `", "` and `": "`
/// separators, keys in their order).
#[derive(Debug, Clone, Default)]
struct JsonStyle {
    indent: Option<usize>,
    /// `separators`: between items, between a key and its value; `None`: Python's default for
    /// the indent (`", "`, or `","` with an indent, and `": "`).
    separators: Option<(String, String)>,
    /// Non-ASCII characters as `\uXXXX` escapes (surrogate pairs past the BMP).
    ascii: bool,
    sort_keys: bool,
}

/// `value` as Python's `json.dumps` writes it in `style`.
fn python_json(value: &serde_json::Value, style: &JsonStyle, level: usize, out: &mut String) {
    use serde_json::Value as J;
    let indent = style.indent;
    let (item, key) = match &style.separators {
        Some((item, key)) => (item.as_str(), key.as_str()),
        None => (if indent.is_some() { "," } else { ", " }, ": "),
    };
    // An item's separator, then with an indent a newline and the item's indent.
    let open = |out: &mut String, bracket: char, i: usize| {
        if i == 0 {
            out.push(bracket);
        } else {
            out.push_str(item);
        }
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * (level + 1)));
        }
    };
    let close = |out: &mut String, bracket: char, empty: bool| {
        if empty {
            out.push(if bracket == ']' { '[' } else { '{' });
        } else if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * level));
        }
        out.push(bracket);
    };
    let string = |out: &mut String, s: &str| {
        let quoted = J::from(s).to_string();
        if !style.ascii {
            return out.push_str(&quoted);
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    };
    match value {
        J::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                open(out, '[', i);
                python_json(v, style, level + 1, out);
            }
            close(out, ']', items.is_empty());
        }
        J::Object(map) => {
            let mut entries: Vec<(&String, &J)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            for (i, (k, v)) in entries.into_iter().enumerate() {
                open(out, '{', i);
                string(out, k);
                out.push_str(key);
                python_json(v, style, level + 1, out);
            }
            close(out, '}', map.is_empty());
        }
        J::String(s) => string(out, s),
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// `strftime` of the time `secs` after the epoch (UTC), for the directives chat templates use
/// (`%d %b %Y` in Llama 3's); others are kept as written.
pub fn strftime(secs: u64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let days = secs / 86_400;
    let (h, m, sec) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // The civil date of a day count (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (month_name, weekday) = (MONTHS[(month - 1) as usize], DAYS[(days % 7) as usize]);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{m:02}")),
            Some('S') => out.push_str(&format!("{sec:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The template failed to render (it raised an exception or used something unsupported).
#[derive(Debug, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(String);

/// A compiled chat template with the special tokens it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat";

/// A JSON object's `chat_template`: a string, or the one named "default" of a list of named
/// templates; `None` where it has none.
fn template_field(json: &serde_json::Value) -> Result<Option<String>, LoadError> {
    Ok(match json.get("chat_template") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_string),
        Some(other) => {
            return Err(LoadError::Config {
                field: "chat_template".into(),
                reason: format!("expected a string, found {other}"),
            });
        }
    })
}

impl ChatTemplate {
    /// A checkpoint's chat template, where transformers finds it: `DIR/chat_template.jinja`
    /// (what transformers writes since 4.5x), else `tokenizer_config.json`'s `chat_template`, else
    /// a processor's `chat_template.json` (multimodal checkpoints': Qwen3-VL's); its BOS and EOS
    /// tokens from `tokenizer_config.json`. `Ok(None)` when there is none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, LoadError> {
        let config = dir.join("tokenizer_config.json");
        let config = if config.exists() { read_json(&config)? } else { serde_json::Value::Null };
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.exists() {
            Some(std::fs::read_to_string(&jinja).map_err(|e| LoadError::Io { path: jinja, source: e })?)
        } else {
            match template_field(&config)? {
                Some(source) => Some(source),
                None => {
                    let processor = dir.join("chat_template.json");
                    if processor.exists() { template_field(&read_json(&processor)?)? } else { None }
                }
            }
        };
        let Some(source) = source else { return Ok(None) };
        let token = |field: &str| {
            config
                .get(field)
                .and_then(|v| v.as_str().or_else(|| v.get("content").and_then(|c| c.as_str())))
                .unwrap_or_default()
                .to_string()
        };
        Self::new(source, token("bos_token"), token("eos_token"))
            .map(Some)
            .map_err(|e| LoadError::Config { field: "chat_template".into(), reason: e.to_string() })
    }

    /// Compiles `source`.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // Hugging Face renders with trim_blocks and lstrip_blocks, and Python's string methods.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        // transformers' `tojson`: `json.dumps` with its `ensure_ascii` (False unless given),
        // `indent`, `separators` and `sort_keys` (GLM's template asks for `ensure_ascii=False`).
        env.add_filter("tojson", |value: Value, kwargs: Kwargs| -> Result<Value, minijinja::Error> {
            let separators: Option<Vec<String>> = kwargs.get("separators")?;
            let separators = match separators.as_deref() {
                None => None,
                Some([item, key]) => Some((item.clone(), key.clone())),
                Some(_) => {
                    let e = "tojson: separators must be an (item, key) pair";
                    return Err(minijinja::Error::new(ErrorKind::InvalidOperation, e));
                }
            };
            let style = JsonStyle {
                indent: kwargs.get("indent")?,
                separators,
                ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
                sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
            };
            kwargs.assert_all_used()?;
            let json = serde_json::to_value(&value)
                .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
            let mut out = String::new();
            python_json(&json, &style, 0, &mut out);
            Ok(Value::from_safe_string(out))
        });
        // transformers gives templates the current date (Llama 3's writes it into the system turn).
        env.add_function("strftime_now", |format: String| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            strftime(now, &format)
        });
        env.add_template_owned(NAME, join_continued_lines(&source)).map_err(|e| TemplateError(e.to_string()))?;
        Ok(Self { env, source, bos_token, eos_token })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// How the template writes an assistant's tool calls (and so how the model writes them):
    /// after `[TOOL_CALLS]`, each call's name and `[ARGS]` where it writes `[ARGS]` (with
    /// `[CALL_ID]` and an id between where it writes that: Mistral Small 3.2), else a JSON
    /// array where it writes that tag (Mistral 7B v0.3, Nemo); XML elements where
    /// it spells out `<function=` and `<parameter=` (Qwen3.5, Qwen3-Coder); key and value tags
    /// where it writes `<arg_key>` and `<arg_value>` (GLM-4.5 and later); a JSON object
    /// between `<tool_call>` tags where it has them (Qwen2, Qwen3); else, where it writes a
    /// call's `"parameters"`, the answer as one JSON object (Llama 3.x).
    pub fn call_syntax(&self) -> CallSyntax {
        let has = |s: &str| self.source.contains(s);
        if has("[TOOL_CALLS]") && has("[ARGS]") {
            CallSyntax::Named { ids: has("[CALL_ID]") }
        } else if has("[TOOL_CALLS]") {
            CallSyntax::JsonArray
        } else if has("<|tool_call|>") {
            CallSyntax::TaggedList
        } else if has("<function=") && has("<parameter=") {
            CallSyntax::Xml
        } else if has("<arg_key>") && has("<arg_value>") {
            CallSyntax::ArgPairs
        } else if !has("<tool_call>") && has("\"parameters\"") {
            CallSyntax::Bare
        } else {
            CallSyntax::Json
        }
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends where the
    /// assistant's answer begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TemplateError> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// As `render`, with the tools the model may call (OpenAI's `tools` objects), which the
    /// template describes to the model (none: the template's `tools` is undefined).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with(messages, tools, &serde_json::Map::new(), add_generation_prompt)
    }

    /// As `render_with_tools`, with more variables for the template (a request's
    /// `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`); they cannot replace the ones
    /// the template is always given.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        kwargs: &serde_json::Map<String, serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        const GIVEN: [&str; 5] = ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];
        if let Some(key) = kwargs.keys().find(|k| GIVEN.contains(&k.as_str())) {
            return Err(TemplateError(format!("`{key}` is set by the server, not by chat_template_kwargs")));
        }
        let template = self.env.get_template(NAME).map_err(|e| TemplateError(e.to_string()))?;
        let syntax = self.call_syntax();
        let messages: Vec<Value> = messages.iter().map(|m| m.to_value(syntax)).collect();
        let tools = (!tools.is_empty()).then(|| Value::from(Serde(tools)));
        template
            .render(context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
                ..Value::from(Serde(kwargs))
            })
            .map_err(|e| TemplateError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint's template is read where transformers writes it: `chat_template.jinja`
    /// (before `tokenizer_config.json`'s), or a processor's `chat_template.json`; the BOS and EOS
    /// tokens come from `tokenizer_config.json` whichever holds the template.
    #[test]
    fn a_template_is_read_from_its_jinja_file_the_tokenizer_config_or_the_processors_json() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        let source = |dir: &Path| ChatTemplate::from_dir(dir).unwrap().map(|t| t.source().to_string());
        assert_eq!(source(dir.path()), None, "no files: no template");
        write("tokenizer_config.json", r#"{"bos_token":"<s>","eos_token":{"content":"</s>"}}"#);
        assert_eq!(source(dir.path()), None, "a tokenizer config without one");
        write("chat_template.json", r#"{"chat_template":"processor {{ bos_token }}"}"#);
        let t = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "processor <s>");
        write("tokenizer_config.json", r#"{"bos_token":"<s>","chat_template":"config"}"#);
        assert_eq!(source(dir.path()).as_deref(), Some("config"));
        write("chat_template.jinja", "jinja {{ eos_token }}");
        assert_eq!(source(dir.path()).as_deref(), Some("jinja {{ eos_token }}"));
        write("chat_template.json", r#"{"chat_template":7}"#);
        assert_eq!(source(dir.path()).as_deref(), Some("jinja {{ eos_token }}"), "the jinja file first");
        std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
        write("tokenizer_config.json", "{}");
        let err = ChatTemplate::from_dir(dir.path()).unwrap_err();
        assert!(err.to_string().contains("chat_template"), "{err}");
    }

    /// A backslash that ends a line inside a tag's string literal continues the line, as in
    /// Jinja2 (Mistral Small 3.1's default system message): "Paris.\⏎Your" renders "Paris.Your".
    /// Escapes stay escapes, and between tags a backslash and its line break are text.
    #[test]
    fn a_string_literal_continues_over_a_backslash_line_break() {
        let source = "{%- set m = \"Paris.\\\nYour \\\"x\\\" and \\\\\" %}{{ m }}|a\\\nb|{{ 'c\\\nd' }}";
        let t = ChatTemplate::new(source.into(), String::new(), String::new()).unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "Paris.Your \"x\" and \\|a\\\nb|cd");
        assert_eq!(t.source(), source, "the source as given");
    }

    /// Python's `strftime` gives these for the same instants.
    #[test]
    fn dates_format_like_python() {
        assert_eq!(
            strftime(1_721_952_000 + 3723, "%d %b %Y %A %a %B %H:%M:%S %y %e %%"),
            "26 Jul 2024 Friday Fri July 01:02:03 24 26 %"
        );
        assert_eq!(strftime(951_782_400, "%d %b %Y %A"), "29 Feb 2000 Tuesday");
        assert_eq!(strftime(0, "%q"), "%q");
    }

    /// Python's `json.dumps(..., indent=4, ensure_ascii=False)` gives this.
    #[test]
    fn tojson_indents_like_python() {
        let value = serde_json::json!({"a": [1, {"b": []}], "c": {}, "d": "é"});
        let mut out = String::new();
        python_json(&value, &JsonStyle { indent: Some(4), ..JsonStyle::default() }, 0, &mut out);
        assert_eq!(
            out,
            "{\n    \"a\": [\n        1,\n        {\n            \"b\": []\n        }\n    ],\n    \"c\": {},\n    \"d\": \"é\"\n}"
        );
        out.clear();
        python_json(&value, &JsonStyle::default(), 0, &mut out);
        assert_eq!(out, r#"{"a": [1, {"b": []}], "c": {}, "d": "é"}"#);
    }

    /// The `tojson` filter takes `json.dumps`'s arguments as transformers passes them on (GLM's
    /// template writes `tojson(ensure_ascii=False)`); Python gives these for the same value.
    #[test]
    fn tojson_takes_python_s_arguments() {
        let render = |args: &str| {
            let source = format!("{{{{ {{'b': 'é😀', 'a': [1, {{'z': none}}]}} | tojson({args}) }}}}");
            ChatTemplate::new(source, String::new(), String::new()).unwrap().render(&[], false)
        };
        assert_eq!(render("ensure_ascii=False").unwrap(), r#"{"b": "é😀", "a": [1, {"z": null}]}"#);
        assert_eq!(
            render("ensure_ascii=True, sort_keys=True, separators=(',', ':')").unwrap(),
            r#"{"a":[1,{"z":null}],"b":"\u00e9\ud83d\ude00"}"#
        );
        assert_eq!(
            render("ensure_ascii=True, indent=2").unwrap(),
            "{\n  \"b\": \"\\u00e9\\ud83d\\ude00\",\n  \"a\": [\n    1,\n    {\n      \"z\": null\n    }\n  ]\n}"
        );
        assert!(render("separators=(',',)").unwrap_err().0.contains("separators"));
        assert!(render("width=3").is_err(), "an argument json.dumps does not take");
    }
}
