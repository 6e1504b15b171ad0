//! The model's own chat template (`chat_template` of `tokenizer_config.json`), rendered with
//! minijinja the way Hugging Face's `apply_chat_template` renders it.

use std::path::Path;

use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value, context};

use crate::config::read_json;
use crate::error::LoadError;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls (T3).
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
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
    /// templates print them with `tojson`).
    fn to_value(&self) -> Value {
        let mut pairs =
            vec![("role", Value::from(self.role.as_str())), ("content", Value::from(self.content.as_str()))];
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
                        ("id", Value::from(c.id.as_str())),
                        ("type", Value::from("function")),
                        ("function", function),
                    ])
                })
                .collect();
            pairs.push(("tool_calls", Value::from(calls)));
        }
        if let Some(id) = &self.tool_call_id {
            pairs.push(("tool_call_id", Value::from(id.as_str())));
        }
        Value::from_pairs(pairs)
    }
}

/// Python's `json.dumps(value, ensure_ascii=False)`, as Hugging Face's `tojson` filter writes
/// it: `", "` and `": "` separators, keys in their order.
fn python_json(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value as J;
    match value {
        J::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_json(v, out);
            }
            out.push(']');
        }
        J::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                python_json(v, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The template failed to render (it raised an exception or used something unsupported).
#[derive(Debug, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(String);

/// A compiled chat template with the special tokens it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Reads `DIR/tokenizer_config.json`; `Ok(None)` when it has no chat template.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, LoadError> {
        let path = dir.join("tokenizer_config.json");
        if !path.exists() {
            return Ok(None);
        }
        let json = read_json(&path)?;
        let source = match json.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            // A list of named templates: use the one named "default".
            Some(serde_json::Value::Array(list)) => match list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
            {
                Some(s) => s.to_string(),
                None => return Ok(None),
            },
            Some(other) => {
                return Err(LoadError::Config {
                    field: "chat_template".into(),
                    reason: format!("expected a string, found {other}"),
                });
            }
        };
        let token = |field: &str| {
            json.get(field)
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
        env.add_filter("tojson", |value: Value| -> Result<Value, minijinja::Error> {
            let json = serde_json::to_value(&value)
                .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
            let mut out = String::new();
            python_json(&json, &mut out);
            Ok(Value::from_safe_string(out))
        });
        env.add_template_owned(NAME, source).map_err(|e| TemplateError(e.to_string()))?;
        Ok(Self { env, bos_token, eos_token })
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
        let template = self.env.get_template(NAME).map_err(|e| TemplateError(e.to_string()))?;
        let messages: Vec<Value> = messages.iter().map(ChatMessage::to_value).collect();
        let tools = (!tools.is_empty()).then(|| Value::from(Serde(tools)));
        template
            .render(context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|e| TemplateError(e.to_string()))
    }
}
