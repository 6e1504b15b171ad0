//! A reasoning model's thinking, split from its answer as it streams. The tags (`<think>`,
//! `</think>`) are single tokens recognised by id, like the tool-call tags; what lies between
//! them is reasoning, what follows the close tag the answer. A template that opens the think
//! block itself (the prompt's last tag is an open one) starts the output inside it. Whitespace
//! at the edges of the reasoning and at the start of the answer is not shown (it is the
//! template's layout, `<think>\n…\n</think>\n\n`), and never depends on where tokens split.

/// A model's reasoning tags (Qwen3: `<think>` = 151667, `</think>` = 151668).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningTags {
    pub open: u32,
    pub close: u32,
}

/// How a choice's output carries reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningParsing {
    pub tags: ReasoningTags,
    /// The prompt ends inside a think block: the output starts as reasoning.
    pub starts_open: bool,
}

impl ReasoningParsing {
    /// The parsing of an output that follows `prompt`: inside a think block when the prompt's
    /// last tag opens one.
    pub fn after(tags: ReasoningTags, prompt: &[u32]) -> Self {
        let last = prompt.iter().rev().find(|&&t| t == tags.open || t == tags.close);
        Self { tags, starts_open: last == Some(&tags.open) }
    }
}

/// Where a token of the output belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// A tag: no text of its own. `closed` when it ended the thinking.
    Tag {
        closed: bool,
    },
    Reasoning,
    Answer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing yet: an open tag starts the thinking, anything else the answer.
    Start,
    Thinking,
    Answer,
}

/// The split of one output.
#[derive(Debug, Clone)]
pub struct ReasoningSplit {
    tags: ReasoningTags,
    phase: Phase,
    /// Reasoning text has been shown (leading whitespace is dropped until then).
    shown: bool,
    /// Whitespace at the reasoning's end so far, shown only if more reasoning follows.
    held: String,
    /// The answer has not shown text yet (its leading whitespace is dropped).
    answer_lead: bool,
}

impl ReasoningSplit {
    pub fn new(parsing: ReasoningParsing) -> Self {
        let phase = if parsing.starts_open { Phase::Thinking } else { Phase::Start };
        Self { tags: parsing.tags, phase, shown: false, held: String::new(), answer_lead: false }
    }

    /// Where `token` belongs; moves past the tags.
    pub fn route(&mut self, token: u32) -> Part {
        match self.phase {
            Phase::Start if token == self.tags.open => {
                self.phase = Phase::Thinking;
                Part::Tag { closed: false }
            }
            Phase::Start | Phase::Answer => {
                self.phase = Phase::Answer;
                Part::Answer
            }
            Phase::Thinking if token == self.tags.close => {
                self.phase = Phase::Answer;
                self.answer_lead = true;
                Part::Tag { closed: true }
            }
            // A second open tag inside the thinking has no text of its own either.
            Phase::Thinking if token == self.tags.open => Part::Tag { closed: false },
            Phase::Thinking => Part::Reasoning,
        }
    }

    /// Whether nothing of the output has been routed yet (no tag, no text).
    pub fn at_start(&self) -> bool {
        self.phase == Phase::Start
    }

    /// Whether `token` opens the thinking.
    pub fn opens(&self, token: u32) -> bool {
        token == self.tags.open
    }

    /// Whether the output is inside its thinking.
    pub fn thinking(&self) -> bool {
        self.phase == Phase::Thinking
    }

    /// The reasoning text to show of `delta` (decoded reasoning text).
    pub fn reasoning(&mut self, delta: &str) -> String {
        let delta = if self.shown { delta } else { delta.trim_start() };
        let body = delta.trim_end();
        if body.is_empty() {
            self.held.push_str(delta);
            return String::new();
        }
        self.shown = true;
        let mut out = std::mem::take(&mut self.held);
        out.push_str(body);
        self.held.push_str(&delta[body.len()..]);
        out
    }

    /// The answer text to show of `delta` (decoded answer text).
    pub fn answer(&mut self, delta: &str) -> String {
        if !self.answer_lead {
            return delta.to_string();
        }
        let rest = delta.trim_start();
        self.answer_lead = rest.is_empty();
        rest.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGS: ReasoningTags = ReasoningTags { open: 1, close: 2 };

    /// Feeds (token, text) pairs; returns (reasoning, answer).
    fn split(starts_open: bool, pieces: &[(u32, &str)]) -> (String, String) {
        let mut s = ReasoningSplit::new(ReasoningParsing { tags: TAGS, starts_open });
        let (mut reasoning, mut answer) = (String::new(), String::new());
        for &(token, text) in pieces {
            match s.route(token) {
                Part::Tag { .. } => {}
                Part::Reasoning => reasoning.push_str(&s.reasoning(text)),
                Part::Answer => answer.push_str(&s.answer(text)),
            }
        }
        (reasoning, answer)
    }

    #[test]
    fn thinking_and_answer_split_at_the_tags_without_the_layout_whitespace() {
        let pieces = [
            (1, ""),
            (9, "\n"),
            (9, "Hmm, "),
            (9, "two"),
            (9, " \n"),
            (9, "lines"),
            (9, "\n"),
            (2, ""),
            (9, "\n\n"),
            (9, "Yes"),
            (9, " sir"),
        ];
        assert_eq!(split(false, &pieces), ("Hmm, two \nlines".into(), "Yes sir".into()));
        // However the text is split into tokens.
        let one_by_one: Vec<(u32, String)> = "\nHmm, two \nlines\n".chars().map(|c| (9, c.to_string())).collect();
        let mut pieces = vec![(1, String::new())];
        pieces.extend(one_by_one);
        pieces.push((2, String::new()));
        pieces.extend("\n\nYes sir".chars().map(|c| (9, c.to_string())));
        let pieces: Vec<(u32, &str)> = pieces.iter().map(|(t, s)| (*t, s.as_str())).collect();
        assert_eq!(split(false, &pieces), ("Hmm, two \nlines".into(), "Yes sir".into()));
    }

    #[test]
    fn an_output_without_thinking_is_all_answer_and_an_open_prompt_starts_thinking() {
        assert_eq!(split(false, &[(9, "\n"), (9, "Hi"), (1, "<think>")]), (String::new(), "\nHi<think>".into()));
        assert_eq!(split(true, &[(9, "plan"), (9, "...")]), ("plan...".into(), String::new()));
        assert_eq!(split(true, &[(9, "plan"), (2, ""), (9, " go")]), ("plan".into(), "go".into()));
    }

    #[test]
    fn the_prompts_last_tag_decides_where_the_output_starts() {
        assert!(ReasoningParsing::after(TAGS, &[5, 1, 7]).starts_open);
        assert!(!ReasoningParsing::after(TAGS, &[5, 1, 7, 2, 8]).starts_open);
        assert!(!ReasoningParsing::after(TAGS, &[5, 7]).starts_open);
    }
}
