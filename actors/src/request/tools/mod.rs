//! T3: a choice's tool calls, parsed as they stream. The tags (`<tool_call>`, `</tool_call>`)
//! are single tokens recognised by id (decoding drops them as special); between them the text
//! `{"name": ..., "arguments": ...}` goes through a one-pass JSON scanner that hands out the
//! name once and the arguments in pieces, exactly the bytes the model wrote, never re-parsed;
//! a model whose template writes calls as XML elements (Qwen3.5) has them read by `XmlCall`,
//! the arguments handed out as JSON one parameter at a time; Mistral's calls, a JSON array after
//! `[TOOL_CALLS]` with no closing tag, are its objects read one after another by the same scanner;
//! Mistral's newer ones, `[TOOL_CALLS]name[ARGS]{...}` per call, have the name read up to
//! `[ARGS]` (an id after `[CALL_ID]` skipped) and the arguments handed out as written; GLM's,
//! `<tool_call>name` and each argument between key and value tags, are read by `PairCall`, the
//! tags moving it on by id (`push_tag`).

use std::sync::Arc;

use rand::distr::Alphanumeric;

use super::FinishReason;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A model's tool-call tags (Qwen2: `<tool_call>` = 151657, `</tool_call>` = 151658); with no
/// closing tag, Mistral's `[TOOL_CALLS]`: a JSON array of calls after it, or with `[ARGS]`, each
/// call's name and arguments.
pub use llaisys_model::ToolCallTags;

/// One piece of a tool call (OpenAI's `delta.tool_calls[]`): `id` and `name` come once, in
/// the call's first piece; `arguments` are appended.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ToolCallDelta {
    /// The call's place among the choice's calls.
    pub index: usize,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

/// A whole tool call, as the pieces add up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCallOut {
    pub id: String,
    pub name: String,
    /// The arguments exactly as generated (JSON text).
    pub arguments: String,
}

impl ToolCallOut {
    /// Adds a piece to the calls it belongs to (a new call's first piece starts it).
    pub fn gather(calls: &mut Vec<ToolCallOut>, delta: &ToolCallDelta) {
        if delta.index == calls.len() {
            calls.push(ToolCallOut::default());
        }
        if let Some(call) = calls.get_mut(delta.index) {
            call.add(delta);
        }
    }

    /// Adds a piece of the same call.
    pub fn add(&mut self, delta: &ToolCallDelta) {
        if let Some(id) = &delta.id {
            self.id.clone_from(id);
        }
        if let Some(name) = &delta.name {
            self.name.clone_from(name);
        }
        self.arguments.push_str(&delta.arguments);
    }
}

/// How a request's output carries tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolParsing {
    /// `None`: the model writes calls with no tags (Llama 3.x, `CallSyntax::Bare`); they are
    /// recognised in the text (`TextCalls`).
    pub tags: Option<ToolCallTags>,
    /// Calls between the tags are XML elements (`CallSyntax::Xml`) or key and value tags
    /// (`CallSyntax::ArgPairs`), read with what the offered tools say of their parameters;
    /// `None`: a JSON object.
    pub xml: Option<Arc<XmlTools>>,
    /// Finish with `tool_calls` when the output called tools (not for a named `tool_choice`,
    /// which OpenAI ends with `stop`).
    pub finish_with_tool_calls: bool,
}

impl ToolParsing {
    /// Calls in JSON between `tags`.
    pub fn json(tags: ToolCallTags, finish_with_tool_calls: bool) -> Self {
        Self { tags: Some(tags), xml: None, finish_with_tool_calls }
    }

    /// The finish reason of an output that ended for `reason`, having called tools or not.
    pub fn finish(parsing: Option<&Self>, reason: FinishReason, called: bool) -> FinishReason {
        match parsing {
            Some(p) if called && reason == FinishReason::Stop && p.finish_with_tool_calls => FinishReason::ToolCalls,
            _ => reason,
        }
    }
}

/// Where a token of the output belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Content text.
    Text,
    /// A tag or the inside of a call: its text goes to `push_call_text`.
    Call,
}

#[derive(Debug, Clone, Default)]
enum Value {
    /// Before the value of a key at the call object's level.
    #[default]
    Before,
    Name,
    Arguments,
    Other,
}

/// The call being read, in its syntax.
#[derive(Debug, Clone)]
enum Scan {
    Json(Call),
    Xml(XmlCall),
    Named(NamedCall),
    Pairs(PairCall),
}

/// Where a call in Mistral's `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Part {
    #[default]
    Name,
    Id,
    Arguments,
}

/// A call in Mistral's `[TOOL_CALLS]name[ARGS]{...}` being read.
#[derive(Debug, Clone, Default)]
struct NamedCall {
    part: Part,
    /// The name's text as written (trimmed when `[CALL_ID]` or `[ARGS]` ends it).
    name_raw: String,
    name: Option<String>,
    /// The arguments' JSON value: nesting, and whether in a string (after a backslash).
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// The value is complete: what follows is not the call's.
    done: bool,
    /// Argument text not yet handed out.
    pending: String,
}

impl NamedCall {
    /// A tag: `[CALL_ID]` or `[ARGS]` ends the name.
    fn tag(&mut self, part: Part) {
        if self.part == Part::Name {
            self.name = Some(self.name_raw.trim().to_string());
        }
        self.part = part;
    }

    /// Reads text: the name's, an id's (skipped), or the arguments' up to the end of their value.
    fn scan(&mut self, text: &str) {
        for c in text.chars() {
            match self.part {
                Part::Name => self.name_raw.push(c),
                Part::Id => {}
                Part::Arguments if self.done || (self.depth == 0 && c.is_whitespace()) => {}
                Part::Arguments => {
                    self.pending.push(c);
                    if self.in_string {
                        (self.escaped, self.in_string) = match (self.escaped, c) {
                            (true, _) => (false, true),
                            (false, '\\') => (true, true),
                            (false, '"') => (false, false),
                            _ => (false, true),
                        };
                    } else {
                        match c {
                            '"' => self.in_string = true,
                            '{' | '[' => self.depth += 1,
                            '}' | ']' => self.depth = self.depth.saturating_sub(1),
                            _ => {}
                        }
                    }
                    // A value ends with its last bracket (a scalar, which no schema gives
                    // arguments, runs to the next tag).
                    self.done = self.depth == 0 && !self.in_string && matches!(c, '}' | ']');
                }
            }
        }
    }
}

/// A call in JSON being read.
#[derive(Debug, Clone, Default)]
struct Call {
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// The key being read or last read at depth 1, and whether its colon has come.
    key: String,
    reading_key: bool,
    after_colon: bool,
    value: Value,
    /// The name's characters as written (unescaped when complete).
    name_raw: String,
    name: Option<String>,
    arguments_done: bool,
    /// Argument text not yet handed out (held until the name is known).
    pending: String,
}

/// Splits a choice's output into content and tool calls.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    tags: Option<ToolCallTags>,
    xml: Option<Arc<XmlTools>>,
    call: Option<Scan>,
    /// Whether the open call's id and name went out.
    header_sent: bool,
    /// Calls opened so far.
    calls: usize,
    /// Inside a JSON array of calls (a tag with no closing tag opened it).
    in_array: bool,
}

impl ToolCallParser {
    pub fn new(parsing: &ToolParsing) -> Self {
        Self { tags: parsing.tags, xml: parsing.xml.clone(), call: None, header_sent: false, calls: 0, in_array: false }
    }

    /// Whether the choice has opened a call.
    pub fn made_calls(&self) -> bool {
        self.calls > 0
    }

    pub fn is_tag(&self, token: u32) -> bool {
        self.tags.is_some_and(|t| {
            [Some(t.open), t.close, t.args, t.call_id].contains(&Some(token))
                || t.pairs.is_some_and(|p| p.find(token).is_some())
        })
    }

    /// Reads a tag (`is_tag`) the open call's syntax takes by id (GLM's argument tags and its
    /// closing tag); the piece it completes, if any.
    pub fn push_tag(&mut self, token: u32) -> Vec<ToolCallDelta> {
        let Some(tags) = self.tags else { return Vec::new() };
        let (Some(pairs), Some(Scan::Pairs(_))) = (tags.pairs, &self.call) else { return Vec::new() };
        let (tag, closing) = (pairs.find(token), Some(token) == tags.close);
        if tag.is_none() && !closing {
            return Vec::new();
        }
        let empty = XmlTools::default();
        let piece = self.piece(|scan, xml| {
            if let Scan::Pairs(call) = scan {
                call.tag(tag, xml.unwrap_or(&empty));
            }
        });
        if closing {
            self.call = None;
        }
        piece.into_iter().collect()
    }

    /// Where `token` belongs; a tag opens or closes a call (with no tags, all is text). A tag
    /// with no closing tag opens an array of calls that takes the rest of the output.
    pub fn route(&mut self, token: u32) -> Route {
        let Some(tags) = self.tags else { return Route::Text };
        if tags.args.is_some() {
            return self.route_named(token, tags);
        }
        if tags.pairs.is_some() {
            // GLM's: the open tag starts a call; the rest of it, its closing tag included, moves
            // on in `push_tag` and `push_call_text`.
            if token == tags.open && self.call.is_none() {
                self.call = Some(Scan::Pairs(PairCall::default()));
                self.header_sent = false;
                self.calls += 1;
            }
            return if self.call.is_some() { Route::Call } else { Route::Text };
        }
        if self.array() {
            self.in_array |= token == tags.open;
            return if self.in_array { Route::Call } else { Route::Text };
        }
        if token == tags.open && self.call.is_none() {
            self.call = Some(match self.xml {
                Some(_) => Scan::Xml(XmlCall::default()),
                None => Scan::Json(Call::default()),
            });
            self.header_sent = false;
            self.calls += 1;
            Route::Call
        } else if Some(token) == tags.close && self.call.is_some() {
            self.call = None;
            Route::Call
        } else if self.call.is_some() {
            Route::Call
        } else {
            Route::Text
        }
    }

    /// `route` in Mistral's `[TOOL_CALLS]name[ARGS]{...}`: the open tag starts a call (ending
    /// the one before), `[CALL_ID]` and `[ARGS]` end its name; after its arguments' value the
    /// output is text until the next call.
    fn route_named(&mut self, token: u32, tags: ToolCallTags) -> Route {
        if token == tags.open {
            self.call = Some(Scan::Named(NamedCall::default()));
            self.header_sent = false;
            self.calls += 1;
            return Route::Call;
        }
        let Some(Scan::Named(call)) = &mut self.call else { return Route::Text };
        if Some(token) == tags.args {
            call.tag(Part::Arguments);
        } else if Some(token) == tags.call_id && call.part == Part::Name {
            call.tag(Part::Id);
        } else if call.done {
            self.call = None;
            return Route::Text;
        }
        Route::Call
    }

    /// A whole call the model wrote as text (see `TextCalls`), as one piece.
    pub fn text_call(&mut self, name: String, arguments: String) -> ToolCallDelta {
        self.calls += 1;
        ToolCallDelta { index: self.calls - 1, id: Some(self.new_call_id()), name: Some(name), arguments }
    }

    /// More of the last call's arguments, written in a format the parser does not read
    /// (harmony's, whose calls `text_call` opens).
    pub fn more_arguments(&self, arguments: String) -> ToolCallDelta {
        ToolCallDelta { index: self.calls.saturating_sub(1), id: None, name: None, arguments }
    }

    /// A new call's id: OpenAI's `call_` and 24 letters and digits; nine letters and digits
    /// for Mistral's syntaxes (no closing tag), whose templates refuse other ids when the call
    /// comes back in the history.
    fn new_call_id(&self) -> String {
        let array = self.array();
        let tail: String =
            StdRng::from_os_rng().sample_iter(&Alphanumeric).take(if array { 9 } else { 24 }).map(char::from).collect();
        if array { tail } else { format!("call_{tail}") }
    }

    /// Whether calls run to the end of the turn (Mistral's: a tag with no closing tag).
    fn array(&self) -> bool {
        self.tags.is_some_and(|t| t.close.is_none())
    }

    /// Reads text of the open call; the pieces it completes (one at most between tags; in an
    /// array, the end of one call and the start of the next may share a piece of text).
    pub fn push_call_text(&mut self, text: &str) -> Vec<ToolCallDelta> {
        if self.array() && !matches!(self.call, Some(Scan::Named(_))) {
            return self.push_array_text(text);
        }
        let piece = self.piece(|scan, xml| match scan {
            Scan::Json(call) => text.chars().for_each(|c| call.scan(c)),
            Scan::Xml(call) => {
                if let Some(xml) = xml {
                    call.scan(text, xml);
                }
            }
            Scan::Named(call) => call.scan(text),
            Scan::Pairs(call) => call.scan(text),
        });
        piece.into_iter().collect()
    }

    /// Reads text of an array of calls: each object in it is a call, read as between tags.
    fn push_array_text(&mut self, text: &str) -> Vec<ToolCallDelta> {
        let mut out = Vec::new();
        for c in text.chars() {
            match &mut self.call {
                Some(Scan::Json(call)) => {
                    call.scan(c);
                    if call.depth == 0 {
                        out.extend(self.piece(|_, _| ()));
                        self.call = None;
                    }
                }
                // Between calls: `[`, `, ` (a space before the array); after `]` the output is
                // text again.
                _ if c == ']' => self.in_array = false,
                _ if c != '{' || !self.in_array => {}
                _ => {
                    let mut call = Call::default();
                    call.scan(c);
                    self.call = Some(Scan::Json(call));
                    self.header_sent = false;
                    self.calls += 1;
                }
            }
        }
        if self.call.is_some() {
            out.extend(self.piece(|_, _| ()));
        }
        out
    }

    /// The piece of the open call that `read` (given the call and the XML tools) completes.
    fn piece(&mut self, read: impl FnOnce(&mut Scan, Option<&XmlTools>)) -> Option<ToolCallDelta> {
        let index = self.calls.checked_sub(1)?;
        let scan = self.call.as_mut()?;
        read(scan, self.xml.as_deref());
        let (name, pending) = match scan {
            Scan::Json(call) => (&call.name, &mut call.pending),
            Scan::Xml(call) => (&call.name, &mut call.arguments.pending),
            Scan::Named(call) => (&call.name, &mut call.pending),
            Scan::Pairs(call) => (&call.name, &mut call.arguments.pending),
        };
        let mut delta = ToolCallDelta { index, ..ToolCallDelta::default() };
        if !self.header_sent {
            delta.name = Some(name.clone()?);
            let pending = std::mem::take(pending);
            delta.id = Some(self.new_call_id());
            self.header_sent = true;
            delta.arguments = pending;
            return Some(delta);
        }
        delta.arguments = std::mem::take(pending);
        (delta.id.is_some() || !delta.arguments.is_empty()).then_some(delta)
    }
}

impl Call {
    /// Whether the scanner is inside the arguments value.
    fn in_arguments(&self) -> bool {
        matches!(self.value, Value::Arguments) && !self.arguments_done
    }

    /// Reads one character; argument characters are kept for the next piece.
    fn scan(&mut self, c: char) {
        let before = self.in_arguments();
        let ended_scalar = self.step(c);
        if (before || self.in_arguments()) && !ended_scalar {
            self.pending.push(c);
        }
    }

    /// Advances the state by `c`; true when `c` ended a scalar value without belonging to it.
    fn step(&mut self, c: char) -> bool {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
                if self.depth == 1 {
                    self.end_string_at_top();
                }
                return false;
            }
            if self.depth == 1 {
                if self.reading_key {
                    self.key.push(c);
                } else if matches!(self.value, Value::Name) {
                    self.name_raw.push(c);
                }
            }
            return false;
        }
        let starts_value = self.depth == 1 && self.after_colon && matches!(self.value, Value::Before);
        let kind = match self.key.as_str() {
            // Only the first name counts: the streamed header carries it, whatever follows.
            "name" if self.name.is_none() => Value::Name,
            "arguments" => Value::Arguments,
            _ => Value::Other,
        };
        match c {
            '"' => {
                self.in_string = true;
                if starts_value {
                    self.value = kind;
                } else if self.depth == 1 && !self.after_colon {
                    self.reading_key = true;
                    self.key.clear();
                }
            }
            '{' | '[' => {
                if starts_value {
                    self.value = if matches!(kind, Value::Name) { Value::Other } else { kind };
                }
                self.depth += 1;
            }
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 1 {
                    self.end_value();
                } else if self.depth == 0 {
                    let scalar = self.in_arguments();
                    self.end_value();
                    return scalar;
                }
            }
            ':' if self.depth == 1 => self.after_colon = true,
            ',' if self.depth == 1 => {
                let scalar = self.in_arguments();
                self.end_value();
                return scalar;
            }
            c if starts_value && !c.is_whitespace() => {
                // A number or a literal.
                self.value = if matches!(kind, Value::Name) { Value::Other } else { kind };
            }
            _ => {}
        }
        false
    }

    /// A string at the call object's level ended: a key, or a string value.
    fn end_string_at_top(&mut self) {
        if self.reading_key {
            self.reading_key = false;
        } else {
            if matches!(self.value, Value::Name) {
                let quoted = format!("\"{}\"", self.name_raw);
                self.name = Some(serde_json::from_str(&quoted).unwrap_or_else(|_| self.name_raw.clone()));
            }
            self.end_value();
        }
    }

    /// The value of the current key is complete.
    fn end_value(&mut self) {
        if matches!(self.value, Value::Arguments) {
            self.arguments_done = true;
        }
        self.value = Value::Before;
        self.after_colon = false;
        // A value belongs to the key before it: a stray `: value` after it belongs to none.
        self.key.clear();
    }
}

mod pairs;
#[cfg(test)]
mod tests;
mod text_calls;
mod xml;

use pairs::PairCall;

pub use text_calls::{Emit, TextCallSpec, TextCallTool, TextCalls};
use xml::XmlCall;
pub use xml::XmlTools;
