//! C9: per-sequence sampling from a logits row. Not part of the forward pass: a `Sampler` reads
//! one row and returns a token, its log-probability and the top-n alternatives.
//!
//! Order, as in vLLM: logit bias → repetition / presence / frequency penalties → (greedy:
//! argmax) → temperature → top-k → min-p → top-p → draw. Log-probabilities are those of the
//! model's raw distribution (log-softmax of the unprocessed row), as OpenAI and vLLM report.

use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::grammar::{Guidance, Guide, GuideEnd};

/// How to pick tokens for one sequence. `Default` is greedy with no penalties.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens; `None` = all.
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; 1 = all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one; 0 = none.
    pub min_p: f32,
    /// > 1 discourages tokens of the prompt and the output (Hugging Face's rule); 1 = off.
    pub repetition_penalty: f32,
    /// Subtracted once from every token already generated (OpenAI); 0 = off.
    pub presence_penalty: f32,
    /// Subtracted per occurrence of a token already generated (OpenAI); 0 = off.
    pub frequency_penalty: f32,
    /// Added to a token's logit before anything else (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// Same seed, same request → same tokens. `None`: seeded from the OS.
    pub seed: Option<u64>,
    /// How many alternatives with their log-probabilities to report per token (0 = none).
    pub top_logprobs: usize,
    /// Report each sampled token's log-probability (implied by `top_logprobs` > 0). Without it
    /// a greedy sequence with nothing else to apply needs only its row's best token, which a
    /// GPU finds where the logits are (see [`Sampler::picks_greedily`]).
    #[serde(default)]
    pub logprobs: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            top_logprobs: 0,
            logprobs: false,
        }
    }
}

/// A sampling parameter out of range; names the parameter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("sampling parameter `{param}`: {reason}")]
pub struct SamplingError {
    pub param: &'static str,
    pub reason: String,
}

impl SamplingParams {
    /// Checks every parameter against the vocabulary size; the limits are OpenAI's and vLLM's.
    pub fn validate(&self, vocab: usize) -> Result<(), SamplingError> {
        let bad = |param, reason: String| Err(SamplingError { param, reason });
        let finite_in = |v: f32, lo: f32, hi: f32| v.is_finite() && v >= lo && v <= hi;
        if !finite_in(self.temperature, 0.0, 100.0) {
            return bad("temperature", format!("{} is not in [0, 100]", self.temperature));
        }
        if self.top_k == Some(0) {
            return bad("top_k", "must be ≥ 1 (leave it out to keep all tokens)".into());
        }
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} is not in (0, 1]", self.top_p));
        }
        if !finite_in(self.min_p, 0.0, 1.0) {
            return bad("min_p", format!("{} is not in [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0 && self.repetition_penalty <= 10.0) {
            return bad("repetition_penalty", format!("{} is not in (0, 10]", self.repetition_penalty));
        }
        for (param, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !finite_in(v, -2.0, 2.0) {
                return bad(param, format!("{v} is not in [-2, 2]"));
            }
        }
        for &(token, bias) in &self.logit_bias {
            if token as usize >= vocab {
                return bad("logit_bias", format!("token {token} is not below the vocabulary size {vocab}"));
            }
            if !finite_in(bias, -100.0, 100.0) {
                return bad("logit_bias", format!("bias {bias} of token {token} is not in [-100, 100]"));
            }
        }
        if self.top_logprobs > 20 {
            return bad("top_logprobs", format!("{} is more than 20", self.top_logprobs));
        }
        Ok(())
    }

    fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == Some(1)
    }

    /// Whether sampled tokens' log-probabilities are reported.
    pub fn wants_logprobs(&self) -> bool {
        self.logprobs || self.top_logprobs > 0
    }
}

/// One chosen token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Log-probability of `token` under the raw distribution, where the parameters ask for it
    /// ([`SamplingParams::wants_logprobs`]).
    pub logprob: Option<f32>,
    /// The `top_logprobs` most likely tokens with their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
    /// Set when the sequence's constraint ends it with this token.
    pub end: Option<GuideEnd>,
    /// How long this token's grammar mask took, for a constrained sequence.
    pub mask_time: Option<Duration>,
}

/// The sampling state of one sequence: its parameters, its constraint, its random stream and
/// the counts the penalties need.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    /// T1: the sequence's constraint; its mask comes before every other step.
    guide: Option<Guide>,
    rng: StdRng,
    /// Tokens of the prompt (for the repetition penalty).
    prompt: Vec<u32>,
    /// Generated tokens and how often each occurred.
    generated: HashMap<u32, u32>,
    /// Scratch: the processed row, reused between steps.
    scratch: Vec<f32>,
}

impl Sampler {
    /// Precondition: `params` passed `validate`.
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let mut prompt = prompt.to_vec();
        prompt.sort_unstable();
        prompt.dedup();
        Self { params, guide: None, rng, prompt, generated: HashMap::new(), scratch: Vec::new() }
    }

    /// The same sampler, constrained by `guidance`.
    pub fn guided(mut self, guidance: &Guidance) -> Self {
        let guide = guidance.guide();
        self.guide = guide.constrains_ever().then_some(guide);
        self
    }

    /// A sampler for a sequence that already generated `generated` (it is being recomputed on a
    /// restarted worker): the penalties count those tokens and its constraint has seen them.
    /// The random stream starts afresh.
    pub fn resume(params: SamplingParams, guidance: &Guidance, prompt: &[u32], generated: &[u32]) -> Self {
        let mut sampler = Self::new(params, prompt).guided(guidance);
        for &t in generated {
            *sampler.generated.entry(t).or_default() += 1;
            if let Some(guide) = &mut sampler.guide {
                guide.accept(t);
            }
        }
        sampler
    }

    /// Whether a grammar constrains (part of) the output.
    pub fn is_guided(&self) -> bool {
        self.guide.as_ref().is_some_and(Guide::has_grammar)
    }

    /// Computes the next token's grammar mask, if the sequence has a grammar (`sample` does it
    /// otherwise); the executor runs this for a whole batch in parallel with the forward pass.
    pub fn prepare(&mut self) {
        if let Some(guide) = &mut self.guide {
            guide.prepare();
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` and records it for the penalties.
    pub fn sample(&mut self, logits: &[f32]) -> Sampled {
        let constrained = self.guide.as_ref().is_some_and(Guide::constrains);
        let mut end = None;
        let token = if self.params.is_greedy() && !self.adjusts_logits() && !constrained {
            crate::output::argmax(logits).unwrap_or(0)
        } else {
            let mut row = std::mem::take(&mut self.scratch);
            row.clear();
            row.extend_from_slice(logits);
            if let Some(guide) = self.guide.as_mut().filter(|_| constrained)
                && let Err(e) = guide.apply(&mut row)
            {
                end = Some(GuideEnd::Failed(e));
            }
            self.apply_bias_and_penalties(&mut row);
            let token =
                if self.params.is_greedy() { crate::output::argmax(&row).unwrap_or(0) } else { self.draw(&row) };
            self.scratch = row;
            token
        };
        *self.generated.entry(token).or_default() += 1;
        let mut mask_time = None;
        if let Some(guide) = &mut self.guide {
            end = end.or_else(|| guide.accept(token));
            mask_time = guide.take_mask_time();
        }
        let (logprob, top) = match self.params.wants_logprobs() {
            true => {
                let (logprob, top) = raw_logprobs(logits, token, self.params.top_logprobs);
                (Some(logprob), top)
            }
            false => (None, Vec::new()),
        };
        Sampled { token, logprob, top, end, mask_time }
    }

    /// Whether this sequence's next token is its row's best one and nothing else of the row is
    /// needed: greedy, no bias or penalty, no constraint, no log-probabilities. Such a row's
    /// token can be picked where the logits are ([`Sampler::picked`]) instead of read back.
    pub fn picks_greedily(&self) -> bool {
        self.params.is_greedy() && !self.adjusts_logits() && self.guide.is_none() && !self.params.wants_logprobs()
    }

    /// Records `token`, the best of its row, picked for a sequence that [`picks_greedily`].
    ///
    /// [`picks_greedily`]: Sampler::picks_greedily
    pub fn picked(&mut self, token: u32) -> Sampled {
        debug_assert!(self.picks_greedily());
        *self.generated.entry(token).or_default() += 1;
        Sampled { token, logprob: None, top: Vec::new(), end: None, mask_time: None }
    }

    /// Whether logit bias or a penalty changes the logits before the choice.
    fn adjusts_logits(&self) -> bool {
        let p = &self.params;
        !p.logit_bias.is_empty()
            || p.repetition_penalty != 1.0
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
    }

    fn apply_bias_and_penalties(&self, row: &mut [f32]) {
        let p = &self.params;
        for &(token, bias) in &p.logit_bias {
            row[token as usize] += bias;
        }
        if p.repetition_penalty != 1.0 {
            let seen = self
                .prompt
                .iter()
                .copied()
                .chain(self.generated.keys().copied().filter(|t| self.prompt.binary_search(t).is_err()));
            for t in seen {
                let l = &mut row[t as usize];
                *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &count) in &self.generated {
                row[t as usize] -= p.presence_penalty + p.frequency_penalty * count as f32;
            }
        }
    }

    /// Temperature, top-k, min-p, top-p, then one draw from what remains.
    fn draw(&mut self, row: &[f32]) -> u32 {
        let p = &self.params;
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // Candidates as (token, unnormalised probability), most likely first after sorting.
        let mut cands: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, ((l - max) / p.temperature).exp()))
            .filter(|c| c.1 > 0.0)
            .collect();
        let by_prob = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if let Some(k) = p.top_k.filter(|k| *k < cands.len()) {
            cands.select_nth_unstable_by(k - 1, by_prob);
            cands.truncate(k);
        }
        if p.min_p > 0.0 {
            // The best candidate has probability exp(0) = 1 before normalisation.
            cands.retain(|c| c.1 >= p.min_p);
        }
        cands.sort_unstable_by(by_prob);
        if p.top_p < 1.0 {
            let total: f32 = cands.iter().map(|c| c.1).sum();
            let mut mass = 0.0;
            let keep = cands.iter().position(|c| {
                mass += c.1;
                mass >= p.top_p * total
            });
            cands.truncate(keep.map_or(cands.len(), |i| i + 1));
        }
        let total: f32 = cands.iter().map(|c| c.1).sum();
        let mut u = self.rng.random::<f32>() * total;
        for &(token, w) in &cands {
            if u < w {
                return token;
            }
            u -= w;
        }
        cands.last().map_or(0, |c| c.0)
    }
}

/// log-softmax of `logits` at `token`, and the `n` best tokens with theirs.
fn raw_logprobs(logits: &[f32], token: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
    let log_z = crate::kernels::log_sum_exp(logits);
    let mut top: Vec<(u32, f32)> = Vec::new();
    if n > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        let n = n.min(idx.len());
        if n < idx.len() {
            idx.select_nth_unstable_by(n - 1, cmp);
        }
        idx.truncate(n);
        idx.sort_unstable_by(cmp);
        top = idx.into_iter().map(|t| (t, logits[t as usize] - log_z)).collect();
    }
    (logits[token as usize] - log_z, top)
}

#[cfg(test)]
mod tests;
