//! T3: a tool call in Qwen3.5's XML syntax (`CallSyntax::Xml`), read as it streams:
//! `<function=NAME>` gives the name; each `<parameter=KEY>\nVALUE\n</parameter>` gives one
//! argument of a JSON object, the value quoted when the tool's schema makes it text
//! (`written_as_text`) and as written (JSON) otherwise; `</function>` closes the object.

use std::collections::HashMap;

use llaisys_model::grammar::written_as_text;
use serde_json::Value;

const FUNCTION: &str = "<function=";
const PARAMETER: &str = "<parameter=";
/// What ends a value (as the grammar writes it: a `</parameter>` on a line of its own).
const END_PARAMETER: &str = "\n</parameter>\n";
const END_FUNCTION: &str = "</function>";

/// What reading XML calls needs of the offered tools: whether each one's parameters are
/// written as text.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct XmlTools(HashMap<String, HashMap<String, bool>>);

impl XmlTools {
    /// From each tool's name and its parameters' schema.
    pub fn new(functions: &[(&str, &Value)]) -> Self {
        let kinds = |parameters: &Value| {
            let properties = parameters.get("properties").and_then(Value::as_object).into_iter().flatten();
            properties.map(|(name, schema)| (name.clone(), written_as_text(schema))).collect()
        };
        Self(functions.iter().map(|(name, parameters)| (name.to_string(), kinds(parameters))).collect())
    }

    /// An argument's value as JSON: text quoted; otherwise as written when it is JSON (Python's
    /// `True`, `False` and `None`, which Qwen3.5's template writes for earlier calls, as JSON's),
    /// else quoted too. A parameter the tool does not list is text.
    pub(super) fn value(&self, function: &str, key: &str, raw: &str) -> String {
        let quoted = || Value::from(raw).to_string();
        if self.0.get(function).and_then(|f| f.get(key)).is_none_or(|&text| text) {
            return quoted();
        }
        let trimmed = raw.trim();
        if serde_json::from_str::<Value>(trimmed).is_ok() {
            return trimmed.to_string();
        }
        match trimmed {
            "True" => "true".into(),
            "False" => "false".into(),
            "None" => "null".into(),
            _ => quoted(),
        }
    }
}

/// A call's arguments as a JSON object written as its arguments complete: `{`, each
/// `"key": value` (`, ` between), `}`; `{}` for none.
#[derive(Debug, Clone, Default)]
pub(super) struct ArgumentsOut {
    count: usize,
    /// Text not yet handed out.
    pub(super) pending: String,
}

impl ArgumentsOut {
    /// Adds an argument, `value` JSON text.
    pub(super) fn add(&mut self, key: &str, value: &str) {
        self.pending += if self.count == 0 { "{" } else { ", " };
        self.pending += &format!("{}: {value}", Value::from(key));
        self.count += 1;
    }

    /// Closes the object.
    pub(super) fn close(&mut self) {
        self.pending += if self.count == 0 { "{}" } else { "}" };
    }
}

/// The call being read.
#[derive(Debug, Clone, Default)]
pub(super) struct XmlCall {
    /// Text read and not yet taken in.
    buf: String,
    pub(super) name: Option<String>,
    done: bool,
    pub(super) arguments: ArgumentsOut,
}

impl XmlCall {
    /// Reads `text`; each complete element moves the call on.
    pub(super) fn scan(&mut self, text: &str, tools: &XmlTools) {
        if self.done {
            return;
        }
        self.buf.push_str(text);
        while self.step(tools) {}
    }

    /// Takes in the next complete element; false when none is complete yet.
    fn step(&mut self, tools: &XmlTools) -> bool {
        let Some(name) = &self.name else {
            let Some(start) = self.buf.find(FUNCTION) else { return false };
            let Some(end) = self.buf[start..].find('>') else { return false };
            self.name = Some(self.buf[start + FUNCTION.len()..start + end].trim().to_string());
            self.buf.drain(..start + end + 1);
            return true;
        };
        let (param, close) = (self.buf.find(PARAMETER), self.buf.find(END_FUNCTION));
        match (param, close) {
            (Some(p), c) if c.is_none_or(|c| p < c) => {
                let Some(gt) = self.buf[p..].find('>').map(|g| p + g) else { return false };
                // The value starts on the next line.
                let Some(rest) = self.buf.get(gt + 1..).filter(|r| !r.is_empty()) else { return false };
                let skip = usize::from(rest.starts_with('\n'));
                let Some(len) = rest[skip..].find(END_PARAMETER) else { return false };
                let key = self.buf[p + PARAMETER.len()..gt].trim();
                let value = tools.value(name, key, &rest[skip..skip + len]);
                self.arguments.add(key, &value);
                self.buf.drain(..gt + 1 + skip + len + END_PARAMETER.len());
                true
            }
            (_, Some(_)) => {
                self.arguments.close();
                self.done = true;
                self.buf.clear();
                false
            }
            _ => false,
        }
    }
}
