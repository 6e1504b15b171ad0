//! T1: constrained decoding. A [`Constraint`] (a JSON schema, any JSON object, a regex, a
//! choice list or a Lark grammar) is compiled by the model's [`GrammarCompiler`] (llguidance's
//! parser factory over this model's own vocabulary, `env.rs`) into a [`Grammar`]. A request
//! carries it as [`Guidance`]; each of its sequences drives a [`Guide`] from it: a token mask
//! before every sampling step, the sampled token after it.

mod calls;
mod compiler;
mod env;
mod guide;

use serde::{Deserialize, Serialize};

pub use calls::{ArgTag, ArgTags, CallSyntax, CallTags, HarmonyTags, ToolCallTags, written_as_text};
pub use compiler::{Grammar, GrammarCompiler};
pub use guide::{Guidance, GuidanceSpec, Guide, GuideEnd, ThinkStart, Thinking};

/// What a sequence's output must match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Constraint {
    /// JSON valid against `schema`. `strict` refuses schema keywords the grammar cannot
    /// enforce; otherwise they are ignored (and reported as warnings).
    JsonSchema { schema: serde_json::Value, strict: bool },
    /// Any JSON object.
    JsonObject,
    /// Text matching a regular expression (Rust `regex` syntax), as a whole.
    Regex { pattern: String },
    /// Exactly one of these strings.
    Choice { choices: Vec<String> },
    /// A Lark grammar in llguidance's dialect (special tokens as `<|im_end|>` or `<[151645]>`,
    /// JSON schemas inline as `%json { ... }`).
    Lark { grammar: String },
}

impl Constraint {
    /// The kind, as metrics label it.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonSchema { .. } => "json_schema",
            Constraint::JsonObject => "json_object",
            Constraint::Regex { .. } => "regex",
            Constraint::Choice { .. } => "choice",
            Constraint::Lark { .. } => "grammar",
        }
    }
}

/// A constraint that does not compile (names what is wrong), or a grammar that failed while
/// decoding.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// `text` as a regex that matches exactly it.
pub fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests;
