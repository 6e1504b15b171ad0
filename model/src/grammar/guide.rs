//! A request's constraint ([`Guidance`]) and the per-sequence state that enforces it
//! ([`Guide`]): a mask computed before each token (on the compute pool, alongside the forward
//! pass and the other sequences' masks), applied to the logits before every other sampling
//! step, and advanced by the token that was sampled.
//!
//! A reasoning model thinks before it answers: with [`Thinking`] the constraint applies to the
//! answer only. The think block is free text (cut at its budget, if any); the grammar, its
//! trigger and the forbidden tokens start after its closing tag, where one whitespace token
//! (the template's `</think>\n\n`) may come before a grammar's first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::Matcher;
use llguidance::toktrie::SimpleVob;

use super::Grammar;

/// What a request's sequences must produce, compiled; cheap to clone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Guidance {
    grammar: Option<Grammar>,
    /// The grammar takes over after this token (a tool call's opening tag); free text before.
    trigger: Option<u32>,
    /// Tokens never allowed while the text is free.
    forbidden: Vec<u32>,
    /// Tokens the answer may not begin with (a second attempt at an answer that must not be
    /// a call written as JSON: `GrammarCompiler::json_openers`).
    opening: Arc<[u32]>,
    /// A reasoning model's think block, which the rest applies after.
    thinking: Option<Thinking>,
}

/// A reasoning model's think block (`open` … `close`, single tokens): free text before the
/// answer, which is what the grammar, trigger and forbidden tokens constrain. Once `budget`
/// tokens have been thought, `close` is the only token allowed, so the answer begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Thinking {
    pub open: u32,
    pub close: u32,
    pub start: ThinkStart,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<usize>,
    /// The newline token the model may write once before opening the block (GLM's prompt ends
    /// at `<|assistant|>` and its turn begins `\n<think>`): neither thinking nor the answer's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newline: Option<u32>,
}

/// Where the output starts, as the prompt leaves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkStart {
    /// Before the block: the first token may open it (or begin the answer; no thinking then).
    MayOpen,
    /// Inside the block: the prompt opened it.
    Inside,
    /// After the block: the prompt closed it (thinking turned off); the answer starts at once.
    Closed,
}

/// A [`Guidance`] before compilation, serializable: the grammar in llguidance's JSON form and
/// the trigger settings.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GuidanceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forbidden: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub opening: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Thinking>,
}

impl Guidance {
    /// The whole output matches `grammar`.
    pub fn grammar(grammar: Grammar) -> Self {
        Self { grammar: Some(grammar), ..Self::default() }
    }

    /// Free text until `trigger` is sampled; what follows it matches `grammar`.
    pub fn after(trigger: u32, grammar: Grammar) -> Self {
        Self { grammar: Some(grammar), trigger: Some(trigger), ..Self::default() }
    }

    /// Free text without `tokens`.
    pub fn forbid(tokens: Vec<u32>) -> Self {
        Self { forbidden: tokens, ..Self::default() }
    }

    /// The same, and the answer may not begin with any of `tokens`.
    pub fn not_opening_with(mut self, tokens: Arc<[u32]>) -> Self {
        self.opening = tokens;
        self
    }

    /// The same, applied to a reasoning model's answer after its `thinking`.
    pub fn after_thinking(mut self, thinking: Thinking) -> Self {
        self.thinking = Some(thinking);
        self
    }

    /// Whether it constrains nothing (no grammar, nothing forbidden, no budget).
    pub fn is_free(&self) -> bool {
        self.grammar.is_none()
            && self.forbidden.is_empty()
            && self.opening.is_empty()
            && self.thinking.is_none_or(|t| t.budget.is_none())
    }

    /// What crosses the network for another node to compile this constraint again
    /// (`GrammarCompiler::guidance`).
    pub fn spec(&self) -> GuidanceSpec {
        GuidanceSpec {
            grammar: self.grammar.as_ref().map(Grammar::source),
            trigger: self.trigger,
            forbidden: self.forbidden.clone(),
            opening: self.opening.to_vec(),
            thinking: self.thinking,
        }
    }

    pub(super) fn from_parts(grammar: Option<Grammar>, spec: &GuidanceSpec) -> Self {
        Self {
            grammar,
            trigger: spec.trigger,
            forbidden: spec.forbidden.clone(),
            opening: spec.opening.as_slice().into(),
            thinking: spec.thinking,
        }
    }

    /// A new sequence's guide.
    pub fn guide(&self) -> Guide {
        let state = match (&self.grammar, self.trigger) {
            (None, _) => State::Free,
            (Some(g), None) => State::Active(Box::new(g.matcher())),
            (Some(g), Some(trigger)) => State::Waiting { trigger, grammar: g.clone() },
        };
        let think = self.thinking.map(|thinking| Think {
            phase: match thinking.start {
                ThinkStart::MayOpen => Phase::First,
                ThinkStart::Inside => Phase::Inside,
                ThinkStart::Closed => Phase::Answer,
            },
            thinking,
            used: 0,
        });
        let lead = self.grammar.as_ref().map(Grammar::whitespace).unwrap_or_default();
        Guide {
            state,
            forbidden: self.forbidden.clone(),
            opening: self.opening.clone(),
            begun: false,
            think,
            lead,
            mask: None,
            mask_time: None,
        }
    }
}

/// A sequence's place around its think block, and the thinking spent.
#[derive(Debug, Clone, Copy)]
struct Think {
    thinking: Thinking,
    phase: Phase,
    used: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first token: the open tag, the newline, or the answer's first.
    First,
    /// After the newline: the open tag, or the answer's first.
    Newline,
    Inside,
    /// Just after the closing tag: a whitespace token may come before a grammar's first.
    Closed,
    Answer,
}

impl Think {
    /// The thinking must end now.
    fn spent(&self) -> bool {
        self.phase == Phase::Inside && self.thinking.budget.is_some_and(|b| self.used >= b)
    }
}

/// Why a guide ended its sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum GuideEnd {
    /// The grammar is complete: nothing more may follow (finish reason `stop`).
    Complete,
    /// The grammar failed (an internal limit of the matcher); the sequence ends with an error.
    Failed(String),
}

enum State {
    Free,
    Waiting { trigger: u32, grammar: Grammar },
    Active(Box<Matcher>),
    Done,
}

/// One sequence's constraint state.
pub struct Guide {
    state: State,
    forbidden: Vec<u32>,
    /// Tokens the answer may not begin with.
    opening: Arc<[u32]>,
    /// Whether the answer has begun (a token after any think block).
    begun: bool,
    /// Where the sequence is around its think block.
    think: Option<Think>,
    /// The whitespace tokens allowed between the closing tag and a grammar.
    lead: Arc<[u32]>,
    /// The next token's mask, once computed.
    mask: Option<Result<SimpleVob, String>>,
    mask_time: Option<Duration>,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Free => "free",
            State::Waiting { .. } => "waiting for its trigger",
            State::Active(_) => "active",
            State::Done => "done",
        };
        f.debug_struct("Guide").field("state", &state).field("forbidden", &self.forbidden).finish()
    }
}

impl Guide {
    /// Computes the next token's mask if a grammar is active; does nothing if it is computed.
    pub fn prepare(&mut self) {
        if self.mask.is_some() || self.thinking() {
            return;
        }
        if let State::Active(matcher) = &mut self.state {
            let start = Instant::now();
            let mut mask = matcher.compute_mask().map_err(|e| e.to_string());
            if let (Ok(mask), Some(think)) = (&mut mask, self.think) {
                match think.phase {
                    Phase::First => {
                        mask.allow_token(think.thinking.open);
                        think.thinking.newline.into_iter().for_each(|t| mask.allow_token(t));
                    }
                    Phase::Newline => mask.allow_token(think.thinking.open),
                    Phase::Closed => self.lead.iter().for_each(|&t| mask.allow_token(t)),
                    Phase::Inside | Phase::Answer => {}
                }
            }
            self.mask = Some(mask);
            self.mask_time = Some(start.elapsed());
        }
    }

    /// Inside the think block: nothing but its budget applies.
    fn thinking(&self) -> bool {
        self.think.is_some_and(|t| t.phase == Phase::Inside)
    }

    /// Whether a grammar is (or will be, after its trigger) active.
    pub fn has_grammar(&self) -> bool {
        matches!(self.state, State::Waiting { .. } | State::Active(_))
    }

    /// Whether the guide ever changes a logit.
    pub fn constrains_ever(&self) -> bool {
        !matches!(self.state, State::Free)
            || !self.forbidden.is_empty()
            || !self.opening.is_empty()
            || self.think.is_some_and(|t| t.thinking.budget.is_some())
    }

    /// Whether `apply` changes the logits of the next token.
    pub fn constrains(&self) -> bool {
        if self.thinking() {
            return self.forced_close().is_some();
        }
        matches!(self.state, State::Active(_)) || !self.forbidden.is_empty() || self.opens()
    }

    /// The next token begins the answer, and some tokens may not.
    fn opens(&self) -> bool {
        !self.begun && !self.opening.is_empty() && self.think.is_none_or(|t| t.phase != Phase::Inside)
    }

    /// The think block's closing tag, when the budget is spent and it must come next.
    fn forced_close(&self) -> Option<usize> {
        self.think.filter(Think::spent).map(|t| t.thinking.close as usize)
    }

    /// Sets every token the sequence may not produce next to -∞. `Err` if the grammar failed
    /// or allows nothing.
    pub fn apply(&mut self, row: &mut [f32]) -> Result<(), String> {
        if let Some(close) = self.forced_close() {
            if close < row.len() {
                row.iter_mut().enumerate().filter(|(i, _)| *i != close).for_each(|(_, l)| *l = f32::NEG_INFINITY);
                if !row[close].is_finite() {
                    row[close] = 0.0;
                }
            }
            return Ok(());
        }
        if self.thinking() {
            return Ok(());
        }
        self.prepare();
        match &self.mask {
            Some(Ok(mask)) => {
                if mask.is_zero() {
                    return Err("the grammar allows no token".into());
                }
                let words = mask.as_slice();
                for (w, chunk) in row.chunks_mut(32).enumerate() {
                    let bits = words.get(w).copied().unwrap_or(0);
                    if bits == u32::MAX {
                        continue;
                    }
                    for (b, l) in chunk.iter_mut().enumerate() {
                        if bits & (1 << b) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
                Ok(())
            }
            Some(Err(e)) => Err(e.clone()),
            None => {
                let opening = if self.opens() { &self.opening[..] } else { &[] };
                let forbidden = if matches!(self.state, State::Done) { &[] } else { &self.forbidden[..] };
                for &t in forbidden.iter().chain(opening) {
                    if let Some(l) = row.get_mut(t as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
                Ok(())
            }
        }
    }

    /// Advances by the sampled `token`; `Some` when the sequence must end here.
    pub fn accept(&mut self, token: u32) -> Option<GuideEnd> {
        self.mask = None;
        if let Some(think) = &mut self.think {
            let Thinking { open, close, .. } = think.thinking;
            match think.phase {
                Phase::First | Phase::Newline if token == open => {
                    think.phase = Phase::Inside;
                    return None;
                }
                Phase::First if Some(token) == think.thinking.newline => {
                    think.phase = Phase::Newline;
                    return None;
                }
                Phase::Inside if token == close => {
                    think.phase = if matches!(self.state, State::Active(_)) { Phase::Closed } else { Phase::Answer };
                    return None;
                }
                Phase::Inside => {
                    think.used += 1;
                    return None;
                }
                Phase::Closed if self.lead.contains(&token) => {
                    think.phase = Phase::Answer;
                    return None;
                }
                Phase::First | Phase::Newline | Phase::Closed => think.phase = Phase::Answer,
                Phase::Answer => {}
            }
        }
        self.begun = true;
        match &mut self.state {
            State::Free | State::Done => None,
            State::Waiting { trigger, grammar } => {
                if token == *trigger {
                    self.state = State::Active(Box::new(grammar.matcher()));
                }
                None
            }
            State::Active(matcher) => match matcher.consume_token(token) {
                Err(e) => {
                    self.state = State::Done;
                    Some(GuideEnd::Failed(e.to_string()))
                }
                Ok(()) if matcher.is_stopped() => {
                    self.state = State::Done;
                    Some(GuideEnd::Complete)
                }
                Ok(()) => None,
            },
        }
    }

    /// The time the last mask took, once (`None` if no mask was computed since).
    pub fn take_mask_time(&mut self) -> Option<Duration> {
        self.mask_time.take()
    }
}
