//! A request's output text as it streams: tokens are detokenized incrementally (never half a
//! character) and cut at the first stop string (never any part of it); a reasoning model's
//! thinking is split off first (stop strings and tool calls apply to the answer after it); with
//! tool calls (T3), the calls' tokens are split off into tool-call pieces; a harmony model's
//! messages (gpt-oss's) go to the reasoning, the answer or a call by their headers. Used by the
//! request actor and by offline generation alike.

use llaisys_model::Tokenizer;
use llaisys_model::tokenizer::{IncrementalDecoder, TokenizerError};

use super::harmony::{self, HarmonyParsing, HarmonySplit};
use super::reasoning::{Part, ReasoningParsing, ReasoningSplit};
use super::stop::{StopMatcher, StopOutcome};
use super::tools::{Emit, Route, TextCallSpec, TextCalls, ToolCallDelta, ToolCallParser, ToolParsing};

/// What one token adds: content text or reasoning text (possibly empty), or pieces of tool
/// calls (two where the token ends one call of an array and begins the next).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Piece {
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Clone)]
pub struct TextStream {
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    /// The stop string that ended the text.
    stopped: Option<String>,
    /// The tool-call parser and the decoder of the calls' text.
    tools: Option<(ToolCallParser, IncrementalDecoder)>,
    /// Whitespace after a tool call, held until text follows (the lines between calls and
    /// after the last are not content).
    held: String,
    /// The split of thinking from the answer, and the decoder of the thinking's text.
    reasoning: Option<(ReasoningSplit, IncrementalDecoder)>,
    /// Whitespace tokens before anything else of a reasoning model's output, held: layout if a
    /// think block opens next (GLM-4.5 writes `\n<think>` after its prompt), the answer's own
    /// start otherwise.
    lead: Vec<u32>,
    /// A harmony model's messages, and the decoders of their headers, reasoning and calls.
    harmony: Option<Box<Harmony>>,
    /// The recogniser of a call written as text (`tool_choice: auto`).
    text_calls: Option<TextCalls>,
    /// Whether a rejected call written as text is kept back for a second attempt
    /// (`rejected`) instead of coming out as text.
    retry: bool,
    /// The text of a rejected call, kept back.
    rejected: Option<String>,
    /// A rejected call's text given back, let out before the next text.
    given_back: String,
}

impl TextStream {
    /// Special tokens are left out of the text.
    pub fn new(stop: impl IntoIterator<Item = String>) -> Self {
        Self {
            decoder: IncrementalDecoder::new(true),
            stops: StopMatcher::new(stop),
            stopped: None,
            tools: None,
            held: String::new(),
            lead: Vec::new(),
            reasoning: None,
            harmony: None,
            text_calls: None,
            retry: false,
            rejected: None,
            given_back: String::new(),
        }
    }

    /// Recognises an answer that is a call written as text (needs `with_tool_calls`); with
    /// `retry`, an answer shaped as a call that is not one is kept back (`take_rejected`).
    pub fn with_text_calls(mut self, spec: Option<std::sync::Arc<TextCallSpec>>, retry: bool) -> Self {
        self.text_calls = spec.map(TextCalls::new);
        self.retry = retry;
        self
    }

    /// The text of a call written as text that was rejected and kept back, once: the answer
    /// is to be generated again, or, given back with `give_back`, let out after all.
    pub fn take_rejected(&mut self) -> Option<String> {
        self.rejected.take()
    }

    /// Whether the answer so far may be a call written as text, not decided yet (its text is
    /// held back).
    pub fn undecided(&self) -> bool {
        !self.stopped() && self.text_calls.as_ref().is_some_and(TextCalls::holding)
    }

    /// Lets out `text` (a rejected call's that could not be answered again) before whatever
    /// comes next.
    pub fn give_back(&mut self, text: String) {
        self.given_back = text;
        self.retry = false;
    }

    /// Splits off a reasoning model's thinking.
    pub fn with_reasoning(mut self, parsing: Option<ReasoningParsing>) -> Self {
        self.reasoning = parsing.map(|p| (ReasoningSplit::new(p), IncrementalDecoder::new(true)));
        self
    }

    /// Splits a harmony model's messages into reasoning, answer and tool calls.
    pub fn with_harmony(mut self, parsing: Option<HarmonyParsing>) -> Self {
        self.harmony = parsing.map(|p| {
            Box::new(Harmony {
                split: HarmonySplit::new(p),
                header: IncrementalDecoder::new(true),
                reasoning: IncrementalDecoder::new(true),
                call: IncrementalDecoder::new(true),
            })
        });
        self
    }

    /// Splits off tool calls as `parsing` says (stop strings apply to the content only).
    pub fn with_tool_calls(mut self, parsing: Option<&ToolParsing>) -> Self {
        self.tools = parsing.map(|p| (ToolCallParser::new(p), IncrementalDecoder::new(true)));
        self
    }

    /// Whether a stop string has ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// The stop string that ended the text.
    pub fn stop_string(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Whether the output opened a tool call.
    pub fn made_tool_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(|(p, _)| p.made_calls())
    }

    /// What `token` adds (possibly nothing); always nothing once stopped.
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<Piece, TokenizerError> {
        if let Some((split, _)) = &self.reasoning
            && split.at_start()
            && !self.stopped()
        {
            let whitespace =
                |id| tokenizer.token_bytes(id).is_some_and(|b| !b.is_empty() && b.iter().all(u8::is_ascii_whitespace));
            if split.opens(token) {
                self.lead.clear();
            } else if whitespace(token) {
                self.lead.push(token);
                return Ok(Piece::default());
            } else if !self.lead.is_empty() {
                return self.push_lead(tokenizer, Some(token));
            }
        }
        self.push_token(tokenizer, token)
    }

    /// The held whitespace as the answer's start, then `token`.
    fn push_lead(&mut self, tokenizer: &Tokenizer, token: Option<u32>) -> Result<Piece, TokenizerError> {
        let mut piece = Piece::default();
        for id in std::mem::take(&mut self.lead).into_iter().chain(token) {
            let next = self.push_token(tokenizer, id)?;
            piece.text.push_str(&next.text);
            piece.reasoning.push_str(&next.reasoning);
            piece.tool_calls.extend(next.tool_calls);
        }
        Ok(piece)
    }

    fn push_token(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<Piece, TokenizerError> {
        if self.stopped() {
            return Ok(Piece::default());
        }
        if let Some(h) = &mut self.harmony {
            let tools = self.tools.as_mut().map(|(parser, _)| parser);
            if let Some(piece) = h.push(tokenizer, token, tools)? {
                return Ok(piece);
            }
        }
        let mut answer = false;
        if let Some((split, decoder)) = &mut self.reasoning {
            let reasoning = match split.route(token) {
                Part::Answer => {
                    answer = true;
                    String::new()
                }
                Part::Reasoning => split.reasoning(&decoder.push(tokenizer, token)?.unwrap_or_default()),
                // The thinking's last bytes, if it ended inside a character.
                Part::Tag { closed: true } => split.reasoning(&decoder.finish(tokenizer)?.unwrap_or_default()),
                Part::Tag { closed: false } => String::new(),
            };
            if !answer {
                return Ok(Piece { reasoning, ..Piece::default() });
            }
        }
        if let Some((parser, decoder)) = &mut self.tools
            && parser.route(token) == Route::Call
        {
            if parser.is_tag(token) {
                return Ok(Piece { tool_calls: parser.push_tag(token), ..Piece::default() });
            }
            let text = decoder.push(tokenizer, token)?.unwrap_or_default();
            return Ok(Piece { tool_calls: parser.push_call_text(&text), ..Piece::default() });
        }
        let mut text = match self.decoder.push(tokenizer, token)? {
            Some(delta) if answer => {
                let delta = self.reasoning.as_mut().map(|(split, _)| split.answer(&delta)).unwrap_or(delta);
                self.filter(&delta)
            }
            Some(delta) => self.filter(&delta),
            None => String::new(),
        };
        let mut tool_calls = Vec::new();
        if let (Some(recogniser), Some((parser, _))) = (&mut self.text_calls, &mut self.tools) {
            let mut emits = recogniser.push(&text);
            // A stop string ends the answer here: what is still undecided is decided now, and
            // nothing is answered again.
            if self.stopped.is_some() {
                emits.extend(recogniser.finish());
            }
            let keep = (self.retry && self.stopped.is_none()).then_some(&mut self.rejected);
            (text, tool_calls) = gather(emits, parser, keep);
        }
        if !self.given_back.is_empty() {
            text.insert_str(0, &std::mem::take(&mut self.given_back));
        }
        if self.made_tool_calls() {
            if text.trim().is_empty() {
                self.held.push_str(&text);
                text.clear();
            } else {
                text.insert_str(0, &std::mem::take(&mut self.held));
            }
        }
        Ok(Piece { text, tool_calls, ..Piece::default() })
    }

    /// What is still held back at the end of the stream (nothing once stopped): the rest of
    /// an unfinished thinking's text, or of the answer's.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<Piece, TokenizerError> {
        // An output of whitespace alone: its answer.
        let lead = self.push_lead(tokenizer, None)?;
        let mut tail = self.finish_text(tokenizer)?;
        tail.text.insert_str(0, &lead.text);
        Ok(tail)
    }

    fn finish_text(&mut self, tokenizer: &Tokenizer) -> Result<Piece, TokenizerError> {
        let mut tail = Piece::default();
        if self.stopped() {
            return Ok(tail);
        }
        if let Some((split, decoder)) = &mut self.reasoning
            && split.thinking()
        {
            tail.reasoning = split.reasoning(&decoder.finish(tokenizer)?.unwrap_or_default());
        }
        let mut unread = None;
        if let Some(h) = &mut self.harmony {
            if h.split.reasoning() {
                tail.reasoning = h.reasoning.finish(tokenizer)?.unwrap_or_default();
            }
            // Nothing of an output not in the format is lost: its text is the answer.
            if let Some(text) = h.split.unread() {
                unread = Some(text + &h.header.finish(tokenizer)?.unwrap_or_default());
            }
        }
        if let Some(delta) = self.decoder.finish(tokenizer)? {
            let delta = self.reasoning.as_mut().map(|(split, _)| split.answer(&delta)).unwrap_or(delta);
            tail.text = self.filter(&delta);
        }
        if let Some(text) = unread {
            let text = self.filter(&text);
            tail.text.push_str(&text);
        }
        if !self.stopped() {
            tail.text.push_str(&self.stops.finish());
        }
        // An answer still undecided when it ended is decided now: a fenced call whose closing
        // fence never came is a call; anything else is the text it was.
        if let (Some(recogniser), Some((parser, _))) = (&mut self.text_calls, &mut self.tools) {
            let (held, calls) = gather(recogniser.finish(), parser, None);
            tail.text.insert_str(0, &held);
            tail.tool_calls = calls;
        }
        tail.text.insert_str(0, &std::mem::take(&mut self.given_back));
        Ok(tail)
    }

    fn filter(&mut self, delta: &str) -> String {
        match self.stops.push(delta) {
            StopOutcome::Continue(text) => text,
            StopOutcome::Stopped { text, stop } => {
                self.stopped = Some(stop);
                text
            }
        }
    }
}

/// A harmony model's messages as they stream.
#[derive(Debug, Clone)]
struct Harmony {
    split: HarmonySplit,
    header: IncrementalDecoder,
    reasoning: IncrementalDecoder,
    call: IncrementalDecoder,
}

impl Harmony {
    /// What `token` adds outside the answer (a tag, a header's words, reasoning, a call's
    /// arguments); `None` for answer text, which the stream's own path takes (stop strings
    /// apply to it). A call's body is answer text where the request offered no tools (`tools`).
    fn push(
        &mut self,
        tokenizer: &Tokenizer,
        token: u32,
        tools: Option<&mut ToolCallParser>,
    ) -> Result<Option<Piece>, TokenizerError> {
        let mut piece = Piece::default();
        match self.split.route(token) {
            harmony::Route::Tag { opens, closes } => {
                if closes {
                    // A body's last bytes, had it ended inside a character.
                    piece.reasoning = self.reasoning.finish(tokenizer)?.unwrap_or_default();
                    let rest = self.call.finish(tokenizer)?.unwrap_or_default();
                    if let (Some(parser), false) = (&tools, rest.is_empty()) {
                        piece.tool_calls.push(parser.more_arguments(rest));
                    }
                }
                if let (Some(name), Some(parser)) = (opens, tools) {
                    piece.tool_calls.push(parser.text_call(name, String::new()));
                }
            }
            harmony::Route::Header => {
                let text = self.header.push(tokenizer, token)?.unwrap_or_default();
                self.split.header_text(&text);
            }
            harmony::Route::Reasoning => piece.reasoning = self.reasoning.push(tokenizer, token)?.unwrap_or_default(),
            harmony::Route::Call => match tools {
                Some(parser) => {
                    let text = self.call.push(tokenizer, token)?.unwrap_or_default();
                    if !text.is_empty() {
                        piece.tool_calls.push(parser.more_arguments(text));
                    }
                }
                None => return Ok(None),
            },
            harmony::Route::Answer => return Ok(None),
        }
        Ok(Some(piece))
    }
}

/// The text and the call of the recogniser's `emits`; a rejected call's text is kept in `keep`
/// when given (the answer is to be generated again), else it is text.
fn gather(
    emits: Vec<Emit>,
    parser: &mut ToolCallParser,
    mut keep: Option<&mut Option<String>>,
) -> (String, Vec<ToolCallDelta>) {
    let (mut text, mut calls) = (String::new(), Vec::new());
    for emit in emits {
        match (emit, keep.as_deref_mut()) {
            (Emit::Rejected(t), Some(kept)) => *kept = Some(t),
            (Emit::Text(t) | Emit::Rejected(t), _) => text.push_str(&t),
            (Emit::Call { name, arguments }, _) => calls.push(parser.text_call(name, arguments)),
        }
    }
    (text, calls)
}
