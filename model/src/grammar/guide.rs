//! A request's constraint ([`Guidance`]) and the per-sequence state that enforces it
//! ([`Guide`]): a mask computed before each token (on the compute pool, alongside the forward
//! pass and the other sequences' masks), applied to the logits before every other sampling
//! step, and advanced by the token that was sampled.

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
    /// A reasoning model's thinking ends after this many tokens.
    think_budget: Option<ThinkBudget>,
}

/// A reasoning model's budget of thinking tokens: once `tokens` have been thought (inside
/// `open` … `close`; from the start when the prompt opened the block), `close` is the only
/// token allowed, so the answer begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ThinkBudget {
    pub open: u32,
    pub close: u32,
    /// The prompt opened the think block.
    pub starts_open: bool,
    pub tokens: usize,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub think_budget: Option<ThinkBudget>,
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

    /// The same, with the thinking cut at `budget`.
    pub fn with_think_budget(mut self, budget: ThinkBudget) -> Self {
        self.think_budget = Some(budget);
        self
    }

    /// What crosses the network for another node to compile this constraint again
    /// (`GrammarCompiler::guidance`).
    pub fn spec(&self) -> GuidanceSpec {
        GuidanceSpec {
            grammar: self.grammar.as_ref().map(Grammar::source),
            trigger: self.trigger,
            forbidden: self.forbidden.clone(),
            think_budget: self.think_budget,
        }
    }

    pub(super) fn from_parts(grammar: Option<Grammar>, spec: &GuidanceSpec) -> Self {
        Self { grammar, trigger: spec.trigger, forbidden: spec.forbidden.clone(), think_budget: spec.think_budget }
    }

    /// A new sequence's guide.
    pub fn guide(&self) -> Guide {
        let state = match (&self.grammar, self.trigger) {
            (None, _) => State::Free,
            (Some(g), None) => State::Active(Box::new(g.matcher())),
            (Some(g), Some(trigger)) => State::Waiting { trigger, grammar: g.clone() },
        };
        let think = self.think_budget.map(|budget| Think { budget, inside: budget.starts_open, used: 0, over: false });
        Guide { state, forbidden: self.forbidden.clone(), think, mask: None, mask_time: None }
    }
}

/// A sequence's thinking, counted against its budget.
#[derive(Debug, Clone, Copy)]
struct Think {
    budget: ThinkBudget,
    inside: bool,
    used: usize,
    /// The block has closed (the budget has no more to do).
    over: bool,
}

impl Think {
    /// The thinking must end now.
    fn spent(&self) -> bool {
        self.inside && self.used >= self.budget.tokens
    }

    fn accept(&mut self, token: u32) {
        if self.over {
            return;
        }
        if !self.inside {
            self.inside = token == self.budget.open;
        } else if token == self.budget.close {
            (self.inside, self.over) = (false, true);
        } else {
            self.used += 1;
        }
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
    /// The thinking's budget and how much of it is spent.
    think: Option<Think>,
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
        if self.mask.is_some() {
            return;
        }
        if let State::Active(matcher) = &mut self.state {
            let start = Instant::now();
            self.mask = Some(matcher.compute_mask().map_err(|e| e.to_string()));
            self.mask_time = Some(start.elapsed());
        }
    }

    /// Whether a grammar is (or will be, after its trigger) active.
    pub fn has_grammar(&self) -> bool {
        matches!(self.state, State::Waiting { .. } | State::Active(_))
    }

    /// Whether the guide ever changes a logit.
    pub fn constrains_ever(&self) -> bool {
        !matches!(self.state, State::Free) || !self.forbidden.is_empty() || self.think.is_some()
    }

    /// Whether `apply` changes the logits of the next token.
    pub fn constrains(&self) -> bool {
        matches!(self.state, State::Active(_)) || !self.forbidden.is_empty() || self.forced_close().is_some()
    }

    /// The think block's closing tag, when the budget is spent and it must come next (a grammar
    /// that is active decides alone).
    fn forced_close(&self) -> Option<usize> {
        let think = self.think.filter(Think::spent)?;
        (!matches!(self.state, State::Active(_))).then_some(think.budget.close as usize)
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
                if !matches!(self.state, State::Done) {
                    for &t in &self.forbidden {
                        if let Some(l) = row.get_mut(t as usize) {
                            *l = f32::NEG_INFINITY;
                        }
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
            think.accept(token);
        }
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
