//! T3: a tool call in GLM's syntax (`CallSyntax::ArgPairs`), read as it streams: the text after
//! `<tool_call>` up to the first tag is the name; each `<arg_key>K</arg_key>` and
//! `<arg_value>V</arg_value>` gives one argument of a JSON object, V taken as an XML call's value
//! (`XmlTools`: quoted where the tool's schema makes it text, as written otherwise);
//! `</tool_call>` closes the object. The tags are special tokens, recognised by id (`tag`).

use llaisys_model::ArgTag;

use super::XmlTools;
use super::xml::ArgumentsOut;

/// Where the call's text belongs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Part {
    #[default]
    Name,
    Key,
    Value,
    /// Between tags (the line breaks the template writes): nobody's.
    Between,
}

/// The call being read.
#[derive(Debug, Clone, Default)]
pub(super) struct PairCall {
    part: Part,
    /// The name's text as written (trimmed when the first tag ends it).
    name_raw: String,
    pub(super) name: Option<String>,
    key: String,
    value: String,
    pub(super) arguments: ArgumentsOut,
}

impl PairCall {
    /// Reads text between tags.
    pub(super) fn scan(&mut self, text: &str) {
        match self.part {
            Part::Name => self.name_raw.push_str(text),
            Part::Key => self.key.push_str(text),
            Part::Value => self.value.push_str(text),
            Part::Between => {}
        }
    }

    /// An argument tag, or the closing tag (`None`), moves the call on: the first ends the name,
    /// a value's end adds its argument, the closing tag ends the object.
    pub(super) fn tag(&mut self, tag: Option<ArgTag>, tools: &XmlTools) {
        if self.part == Part::Name {
            self.name = Some(self.name_raw.trim().to_string());
        }
        self.part = match tag {
            Some(ArgTag::Key) => {
                self.key.clear();
                Part::Key
            }
            Some(ArgTag::Value) => {
                self.value.clear();
                Part::Value
            }
            Some(ArgTag::KeyEnd) => Part::Between,
            Some(ArgTag::ValueEnd) => {
                let name = self.name.as_deref().unwrap_or_default();
                let key = self.key.trim();
                self.arguments.add(key, &tools.value(name, key, &self.value));
                Part::Between
            }
            None => {
                self.arguments.close();
                Part::Between
            }
        };
    }
}
