//! What a step costs, learnt from the steps that ran: `time ≈ a + b · tokens`, where a is what
//! every step pays (reading the weights) and b each token's compute, fitted by least squares
//! over the recent steps (older ones forgotten geometrically, so it follows the load). The
//! policy uses it to size the prefill it adds to a step that decodes: every decoding sequence
//! waits for the whole step, so a step may take at most `factor` times a decode-only step of
//! the batch the engine settles into once the prompts it holds are decoding too. Speculation
//! prices a proposed token by it, but only from a fit whose slope the steps pin down
//! (`fit_within`): on a small model a step takes microseconds, and its timings are mostly noise.

/// Weight of a step after each newer one.
const FORGET: f64 = 0.95;

#[derive(Debug, Clone, Default)]
pub struct StepCost {
    /// Decayed sums over steps of 1, tokens, seconds, tokens², tokens · seconds, seconds².
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    yy: f64,
}

impl StepCost {
    /// A step of `tokens` tokens took `secs`.
    pub fn record(&mut self, tokens: usize, secs: f64) {
        let x = tokens as f64;
        for s in [&mut self.w, &mut self.x, &mut self.y, &mut self.xx, &mut self.xy, &mut self.yy] {
            *s *= FORGET;
        }
        self.w += 1.0;
        self.x += x;
        self.y += secs;
        self.xx += x * x;
        self.xy += x * secs;
        self.yy += secs * secs;
    }

    /// `(a, b)`, once three or more recent steps vary enough in size to tell them apart.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let var = self.w * self.xx - self.x * self.x;
        if self.w < 2.5 || var <= 1e-9 * self.w * self.xx.max(1.0) {
            return None;
        }
        let b = (self.w * self.xy - self.x * self.y) / var;
        let a = (self.y - b * self.x) / self.w;
        (b > 0.0 && a.is_finite()).then_some((a.max(0.0), b))
    }

    /// The fit, if the standard error of its per-token cost is at most `rel_err` of that cost:
    /// the steps vary enough in size, and their times follow the line closely enough, to tell
    /// what one more token costs.
    pub fn fit_within(&self, rel_err: f64) -> Option<(f64, f64)> {
        if self.w < 4.0 {
            return None;
        }
        let (a, b) = self.fit()?;
        // The residual sum of squares of the least-squares line (a as fitted: a clamped
        // intercept only overstates it), over w - 2 degrees of freedom.
        let rss =
            (self.yy - 2.0 * a * self.y - 2.0 * b * self.xy + a * a * self.w + 2.0 * a * b * self.x + b * b * self.xx)
                .max(0.0);
        let var = self.w * self.xx - self.x * self.x;
        let se_b = (rss / (self.w - 2.0) * self.w / var).sqrt();
        (se_b <= rel_err * b).then_some((a, b))
    }

    /// Most prompt tokens to add to a step of `decode` decode tokens so that it takes at most
    /// `factor` times a decode-only step of `steady` sequences (the batch once every admitted
    /// prompt decodes, whose step is the gap the requests see most of the time; `steady` ≥
    /// `decode`); `None` before the fit exists.
    pub fn prefill_budget(&self, decode: usize, steady: usize, factor: f64) -> Option<usize> {
        let (a, b) = self.fit()?;
        let bound = factor * (a + b * steady.max(decode) as f64);
        Some(((bound - a - b * decode as f64) / b).floor().max(0.0) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_linear_cost_and_sizes_the_prefill() {
        let mut cost = StepCost::default();
        assert_eq!(cost.prefill_budget(16, 16, 2.5), None);
        // 15 ms per step plus 2 ms per token.
        for tokens in [512, 16, 48, 16, 300, 17, 80] {
            cost.record(tokens, 0.015 + 0.002 * tokens as f64);
        }
        let (a, b) = cost.fit().unwrap();
        assert!((a - 0.015).abs() < 1e-9 && (b - 0.002).abs() < 1e-12, "{a} {b}");
        // 16 decode tokens: 47 ms alone; 2.5 times that leaves 70.5 ms: 35 prompt tokens.
        assert_eq!(cost.prefill_budget(16, 16, 2.5), Some(35));
        assert_eq!(cost.prefill_budget(16, 16, 1.0), Some(0));
        // 4 decode tokens now, 16 once the waiting prompts decode: 2.5 × 47 ms = 117.5 ms, of
        // which the 4 decode tokens take 23 ms: 47 prompt tokens.
        assert_eq!(cost.prefill_budget(4, 16, 2.5), Some(47));
    }

    #[test]
    fn a_fit_the_steps_do_not_pin_down_is_not_trusted() {
        let steps = [16, 20, 17, 24, 18, 16, 22, 19, 21, 17];
        let mut clean = StepCost::default();
        let mut noisy = StepCost::default();
        for (i, tokens) in steps.into_iter().enumerate() {
            // 20 ms a step plus 4 ms a token, and the same with ±8-12 ms of jitter.
            let secs = 0.020 + 0.004 * tokens as f64;
            clean.record(tokens, secs + if i % 2 == 0 { 0.0005 } else { -0.0005 });
            noisy.record(tokens, secs + [0.01, -0.01, 0.012, -0.008, -0.012, 0.01, -0.01, 0.008, -0.01, 0.012][i]);
        }
        let (a, b) = clean.fit_within(0.25).expect("steps of 16 to 24 tokens pin a 4 ms slope down");
        assert!((a - 0.020).abs() < 0.002 && (b - 0.004).abs() < 0.0002, "{a} {b}");
        assert!(noisy.fit().is_some(), "a line fits any steps that vary in size");
        assert_eq!(noisy.fit_within(0.25), None, "but this one's slope is mostly jitter");
        let mut few = StepCost::default();
        for tokens in [16, 24, 20] {
            few.record(tokens, 0.020 + 0.004 * tokens as f64);
        }
        assert_eq!(few.fit_within(0.25), None, "three steps are too few to judge a fit by");
    }

    #[test]
    fn steps_of_one_size_give_no_fit() {
        let mut cost = StepCost::default();
        for _ in 0..10 {
            cost.record(16, 0.05);
        }
        assert_eq!(cost.prefill_budget(16, 16, 2.5), None);
    }
}
