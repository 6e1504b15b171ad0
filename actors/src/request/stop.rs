//! E7: stop strings. Text is held back while it could still be the start of a stop string, so
//! no part of a stop string is ever emitted, even when it arrives split across tokens.

/// What the caller may show after feeding more text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Safe to emit (possibly empty: text is held back).
    Continue(String),
    /// Stop string `stop` matched: emit `text` (what precedes the match) and finish.
    Stopped { text: String, stop: String },
}

/// Watches a request's output for its stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet emitted: a suffix that may begin a stop string.
    pending: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), pending: String::new() }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.pending.push_str(text);
        // Earlier text never contained a stop string's start unheld, so a match lies in `pending`.
        // The earliest match; of those at the same place, the first listed.
        let found =
            self.stops.iter().filter_map(|s| Some((self.pending.find(s.as_str())?, s))).min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = found {
            let (text, stop) = (self.pending[..at].to_string(), stop.clone());
            self.pending.clear();
            return StopOutcome::Stopped { text, stop };
        }
        let hold = self.held_suffix_len();
        let emit = self.pending[..self.pending.len() - hold].to_string();
        self.pending.drain(..self.pending.len() - hold);
        StopOutcome::Continue(emit)
    }

    /// The held-back text, at the end of the stream (no stop string came).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn held_suffix_len(&self) -> usize {
        self.pending
            .char_indices()
            .map(|(i, _)| &self.pending[i..])
            .find(|suffix| self.stops.iter().any(|s| s.len() > suffix.len() && s.starts_with(suffix)))
            .map_or(0, str::len)
    }
}

#[cfg(test)]
mod tests {
    use super::StopOutcome::*;
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()))
    }

    /// Feeds pieces, returns everything emitted and whether it stopped.
    fn run(m: &mut StopMatcher, pieces: &[&str]) -> (String, bool) {
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                Continue(t) => out.push_str(&t),
                Stopped { text: t, .. } => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_across_tokens_is_never_emitted() {
        let mut m = matcher(&["###"]);
        assert_eq!(m.push("Hello #"), Continue("Hello ".into()));
        assert_eq!(m.push("#"), Continue(String::new()));
        assert_eq!(m.push("# rest"), Stopped { text: String::new(), stop: "###".into() });
    }

    /// The stop reported is the one that matched first in the text; of those matching at the
    /// same place, the first listed.
    #[test]
    fn the_stop_that_matched_first_is_reported() {
        let mut m = matcher(&["world", "lo w", "lo"]);
        assert_eq!(m.push("Hello world"), Stopped { text: "Hel".into(), stop: "lo w".into() });
    }

    #[test]
    fn held_text_is_released_when_it_stops_looking_like_a_stop() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(run(&mut m, &["a S", "T", "x b"]), ("a STx b".into(), false));
        let mut m = matcher(&["STOP"]);
        assert_eq!(run(&mut m, &["end S", "T"]), ("end ST".into(), false), "flushed at the end");
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        let mut m = matcher(&["world", "lo"]);
        assert_eq!(run(&mut m, &["hel", "lo world"]), ("hel".into(), true));
    }

    #[test]
    fn multi_byte_text_is_cut_on_character_boundaries() {
        let mut m = matcher(&["你好吗"]);
        assert_eq!(run(&mut m, &["说你", "好", "吗？"]), ("说".into(), true));
        let mut m = matcher(&["éé"]);
        assert_eq!(run(&mut m, &["café", " ok"]), ("café ok".into(), false));
    }

    #[test]
    fn no_stops_emits_everything_at_once() {
        let mut m = matcher(&[""]);
        assert_eq!(m.push("abc"), Continue("abc".into()));
        assert_eq!(m.finish(), "");
    }
}
