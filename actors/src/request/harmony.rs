//! gpt-oss's output in OpenAI's harmony format, split as it streams. The output is a run of
//! messages, each a header and a body: `<|channel|>analysis<|message|>…<|end|>` (its
//! reasoning), `<|start|>assistant<|channel|>final<|message|>…<|return|>` (its answer),
//! `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`
//! (a call of tool NAME, its arguments the body; the recipient may also come before the
//! channel). The tags are single tokens recognised by id; a header's words are read from its
//! text when its body begins (`<|message|>`). A body goes to the reasoning (`analysis`), to a
//! tool call (a recipient), or to the answer (`final`, and a `commentary` with no recipient: a
//! preamble the model shows the user). The prompt ends after `<|start|>assistant`, so the
//! output starts in a header.

use serde::{Deserialize, Serialize};

/// The harmony format's tokens in a model's vocabulary (gpt-oss: `<|start|>` = 200006, ...).
pub use llaisys_model::HarmonyTags;

/// How a choice's output carries harmony messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarmonyParsing {
    pub tags: HarmonyTags,
    /// The prompt ends inside a message's body (after `<|message|>`): the output starts as that
    /// message's answer text.
    pub in_body: bool,
}

impl HarmonyParsing {
    /// The parsing of an output that follows `prompt`: in a header unless the prompt's last tag
    /// opened a body.
    pub fn after(tags: HarmonyTags, prompt: &[u32]) -> Self {
        let last =
            prompt.iter().rev().find(|&&t| [tags.start, tags.message, tags.end, tags.call, tags.ret].contains(&t));
        Self { tags, in_body: last == Some(&tags.message) }
    }
}

/// Where a token of the output belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A tag: no text of its own. `opens` names the tool a call's body now begins for (at its
    /// `<|message|>`); `closes` says a body ended.
    Tag {
        opens: Option<String>,
        closes: bool,
    },
    /// A header's words.
    Header,
    Reasoning,
    Answer,
    /// A tool call's arguments.
    Call,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Reasoning,
    Answer,
    Call,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Header,
    Body(Body),
    /// After a body's end, before the next `<|start|>`.
    Between,
}

/// The split of one output.
#[derive(Debug, Clone)]
pub struct HarmonySplit {
    tags: HarmonyTags,
    phase: Phase,
    /// The header's text so far, `<|channel|>` written in where it came.
    header: String,
    /// Whether a body has begun: an output that never begins one is not in the format, and
    /// its text is the answer (`unread`).
    read: bool,
}

/// Marks where `<|channel|>` came in a header's text.
const CHANNEL: &str = "<|channel|>";

impl HarmonySplit {
    pub fn new(parsing: HarmonyParsing) -> Self {
        let phase = if parsing.in_body { Phase::Body(Body::Answer) } else { Phase::Header };
        Self { tags: parsing.tags, phase, header: String::new(), read: parsing.in_body }
    }

    /// Where `token` belongs; moves past the tags.
    pub fn route(&mut self, token: u32) -> Route {
        let t = self.tags;
        let in_body = matches!(self.phase, Phase::Body(_));
        if token == t.start {
            self.phase = Phase::Header;
            self.header.clear();
            return Route::Tag { opens: None, closes: in_body };
        }
        if token == t.message && self.phase == Phase::Header {
            let (body, recipient) = self.read_header();
            self.phase = Phase::Body(body);
            self.read = true;
            return Route::Tag { opens: recipient.filter(|_| body == Body::Call), closes: false };
        }
        if [t.end, t.call, t.ret].contains(&token) {
            self.phase = Phase::Between;
            return Route::Tag { opens: None, closes: in_body };
        }
        if self.phase == Phase::Header && (token == t.channel || Some(token) == t.constrain) {
            self.header.push_str(if token == t.channel { CHANNEL } else { " " });
            return Route::Tag { opens: None, closes: false };
        }
        match self.phase {
            Phase::Header => Route::Header,
            Phase::Body(Body::Reasoning) => Route::Reasoning,
            Phase::Body(Body::Call) => Route::Call,
            // Text outside any message (a model that wrote past a message's end) is not lost.
            Phase::Body(Body::Answer) | Phase::Between => Route::Answer,
        }
    }

    /// Adds decoded header text.
    pub fn header_text(&mut self, text: &str) {
        self.header.push_str(text);
    }

    /// At the end of an output that never began a message's body (a model not writing the
    /// format): what it wrote, taken for headers, as the answer's text.
    pub fn unread(&mut self) -> Option<String> {
        let text = std::mem::take(&mut self.header).replace(CHANNEL, "");
        (!self.read && !text.is_empty()).then_some(text)
    }

    /// Whether the output is inside its reasoning.
    pub fn reasoning(&self) -> bool {
        self.phase == Phase::Body(Body::Reasoning)
    }

    /// The body a header announces, and its recipient's tool name (`to=functions.NAME`, the
    /// namespace dropped; another recipient named as written).
    fn read_header(&self) -> (Body, Option<String>) {
        let recipient = self.header.split_once("to=").map(|(_, rest)| {
            let name: String = rest.chars().take_while(|c| !c.is_whitespace() && *c != '<').collect();
            name.strip_prefix("functions.").map(str::to_string).unwrap_or(name)
        });
        let channel = self.header.split_once(CHANNEL).and_then(|(_, rest)| rest.split_whitespace().next());
        let body = match (&recipient, channel) {
            (Some(name), _) if !name.is_empty() => Body::Call,
            (_, Some("analysis")) => Body::Reasoning,
            _ => Body::Answer,
        };
        (body, recipient)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGS: HarmonyTags =
        HarmonyTags { start: 1, channel: 2, message: 3, end: 4, call: 5, ret: 6, constrain: Some(7) };

    /// Routes a run of tokens and header words: words are header text where the split is in a
    /// header, else body tokens (token 100).
    fn run(split: &mut HarmonySplit, items: &[Result<u32, &str>]) -> Vec<Route> {
        items
            .iter()
            .map(|item| match item {
                Ok(tag) => split.route(*tag),
                Err(text) => {
                    let route = split.route(100);
                    if route == Route::Header {
                        split.header_text(text);
                    }
                    route
                }
            })
            .collect()
    }

    #[test]
    fn reasoning_then_an_answer() {
        let mut split = HarmonySplit::new(HarmonyParsing::after(TAGS, &[9, 1, 50]));
        let routes = run(
            &mut split,
            &[
                Ok(2),
                Err("analysis"),
                Ok(3),
                Err("think"),
                Ok(4),
                Ok(1),
                Err("assistant"),
                Ok(2),
                Err("final"),
                Ok(3),
                Err("hi"),
                Ok(6),
            ],
        );
        let tag = |closes| Route::Tag { opens: None, closes };
        assert_eq!(
            routes,
            [
                tag(false),
                Route::Header,
                tag(false),
                Route::Reasoning,
                tag(true),
                tag(false),
                Route::Header,
                tag(false),
                Route::Header,
                tag(false),
                Route::Answer,
                tag(true)
            ]
        );
    }

    /// A call's recipient after the channel or before it; a commentary with none is answer text.
    #[test]
    fn calls_name_their_tool_either_side_of_the_channel() {
        for header in [
            vec![Ok(2), Err("commentary to=functions.get_weather"), Ok(7), Err("json")],
            vec![Err(" to=functions.get_weather"), Ok(2), Err("commentary json")],
        ] {
            let mut split = HarmonySplit::new(HarmonyParsing::after(TAGS, &[1]));
            run(&mut split, &header);
            assert_eq!(split.route(3), Route::Tag { opens: Some("get_weather".into()), closes: false });
            assert_eq!(split.route(100), Route::Call);
            assert_eq!(split.route(5), Route::Tag { opens: None, closes: true });
        }
        let mut split = HarmonySplit::new(HarmonyParsing::after(TAGS, &[1]));
        run(&mut split, &[Ok(2), Err("commentary")]);
        assert_eq!(split.route(3), Route::Tag { opens: None, closes: false });
        assert_eq!(split.route(100), Route::Answer);
    }

    /// A prompt that ends inside a body starts the output as answer text.
    #[test]
    fn a_prompt_ending_in_a_body_starts_as_answer() {
        let parsing = HarmonyParsing::after(TAGS, &[1, 2, 3]);
        assert!(parsing.in_body);
        let mut split = HarmonySplit::new(parsing);
        assert_eq!(split.route(100), Route::Answer);
        assert!(!HarmonyParsing::after(TAGS, &[1, 2, 3, 4, 1]).in_body);
    }
}
