//! How many tokens to propose for a sequence. The j-th proposed token yields a token only if
//! the j before it were accepted too: with a per-token acceptance rate `a`, its expected gain
//! is `a^j` tokens. Its cost is one more token in the step, which every sequence of the batch
//! waits for: the fraction `b / T` of a step of time `T`, where each token costs `b`, taken
//! from the `n` tokens the step produces anyway. So a sequence gets the longest proposal whose
//! last token still pays, `a^j > n · b / T`. At batch 1 on a memory-bound device `b ≪ T` and
//! proposals are long; as the batch grows the step becomes compute-bound, `n · b / T` nears 1
//! and speculation turns itself off.

/// Weight of earlier outcomes after each newer one.
const FORGET: f64 = 0.9;
/// What a sequence is assumed to accept before it has proposed anything: the rate drifts back
/// to it while a sequence does not speculate, so a sequence that stopped is tried again.
const PRIOR_RATE: f64 = 0.6;
const PRIOR_WEIGHT: f64 = 2.0;

/// A sequence's record of how its proposals fared.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Acceptance {
    /// Decayed counts of accepted proposed tokens and of trials (accepted ones plus the
    /// rejection that ended each run).
    accepted: f64,
    trials: f64,
}

impl Acceptance {
    /// A step proposed `proposed` tokens of which the first `accepted` were accepted.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        let rejected = usize::from(accepted < proposed);
        self.accepted = self.accepted * FORGET + accepted as f64;
        self.trials = self.trials * FORGET + (accepted + rejected) as f64;
    }

    /// A step in which the sequence did not speculate.
    pub fn idle(&mut self) {
        self.accepted *= FORGET;
        self.trials *= FORGET;
    }

    /// The estimated chance that a proposed token is accepted given the ones before it were.
    pub fn rate(&self) -> f64 {
        (self.accepted + PRIOR_RATE * PRIOR_WEIGHT) / (self.trials + PRIOR_WEIGHT)
    }
}

/// The proposal length for a sequence with acceptance `rate` where a step token's marginal
/// worth is `threshold` (`n · b / T`), at most `max`.
pub fn draft_len(rate: f64, threshold: f64, max: usize) -> usize {
    let mut gain = 1.0;
    let mut k = 0;
    while k < max {
        gain *= rate;
        if gain <= threshold {
            break;
        }
        k += 1;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposals_grow_with_acceptance_and_shrink_with_cost() {
        assert_eq!(draft_len(0.9, 0.1, 8), 8, "cheap tokens, good guesses: as many as allowed");
        assert_eq!(draft_len(0.9, 0.5, 8), 6);
        assert_eq!(draft_len(0.5, 0.2, 8), 2);
        assert_eq!(draft_len(0.9, 0.95, 8), 0, "a compute-bound step: none");
        assert_eq!(draft_len(0.9, 0.0, 3), 3);
    }

    #[test]
    fn the_rate_follows_outcomes_and_drifts_back_when_idle() {
        let mut a = Acceptance::default();
        assert!((a.rate() - PRIOR_RATE).abs() < 1e-9);
        for _ in 0..20 {
            a.record(4, 0);
        }
        assert!(a.rate() < 0.15, "every proposal rejected: {}", a.rate());
        for _ in 0..60 {
            a.idle();
        }
        assert!(a.rate() > 0.5, "back near the prior: {}", a.rate());
        for _ in 0..20 {
            a.record(4, 4);
        }
        assert!(a.rate() > 0.9, "everything accepted: {}", a.rate());
    }
}
