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
use crate::output::RowNeed;

/// The largest top-k whose candidates are found on a GPU ([`Sampler::need`]) instead of the row
/// coming back: each takes a pass over the logits there. Qwen3's default is 20, Ollama's 40,
/// Hugging Face's 50.
pub const TOP_K_ON_DEVICE: usize = 64;

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
    /// a sequence with nothing else to apply needs only its row's best token (greedy) or best
    /// candidates (top-k), which a GPU finds where the logits are (see [`Sampler::need`]).
    #[serde(default)]
    pub logprobs: bool,
    /// The log-probabilities reported are of the distribution the token was drawn from (the
    /// row after logit bias, penalties and a grammar's mask, through temperature, top-k, min-p
    /// and top-p, renormalised; a greedy choice's is the token alone) rather than the model's
    /// raw one: llama.cpp's `post_sampling_probs`. Alternatives outside that set are not
    /// reported, so there may be fewer than `top_logprobs`.
    #[serde(default)]
    pub post_sampling: bool,
    /// Report each prompt token's log-probability given the tokens before it (the first has
    /// none), with this many alternatives (0-20): vLLM's `prompt_logprobs`, OpenAI's `echo`
    /// with `logprobs`. The whole prompt is then computed: no cached prefix is reused.
    #[serde(default)]
    pub prompt_logprobs: Option<usize>,
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
            post_sampling: false,
            prompt_logprobs: None,
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
        if let Some(n) = self.prompt_logprobs.filter(|n| *n > 20) {
            return bad("prompt_logprobs", format!("{n} is more than 20"));
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
    /// Log-probability of `token` under the raw distribution (or the one it was drawn from:
    /// [`SamplingParams::post_sampling`]), where the parameters ask for it
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
    /// Scratch of a draw: its candidates as rank keys, then ranked.
    draw: DrawScratch,
    /// The uniform number of a draw from candidates that fell past them
    /// ([`Sampler::sample_top`] gave `None`), for the draw from the whole row that follows.
    pending: Option<f32>,
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
        Self {
            params,
            guide: None,
            rng,
            prompt,
            generated: HashMap::new(),
            scratch: Vec::new(),
            draw: DrawScratch::default(),
            pending: None,
        }
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
            let token = match (self.params.is_greedy(), self.params.top_k) {
                (true, _) => crate::output::argmax(&row).unwrap_or(0),
                // What top-k leaves are the row's k best logits, as a GPU finds them: the draw
                // weighs those alone. Without a mass they are all there is: always a token.
                (false, Some(k)) if k < row.len() => {
                    let best = crate::output::top_logits(&row, k);
                    self.draw(best.iter().copied(), None).unwrap_or(0)
                }
                (false, _) => self.draw_row(&row),
            };
            self.scratch = row;
            token
        };
        *self.generated.entry(token).or_default() += 1;
        let mut mask_time = None;
        if let Some(guide) = &mut self.guide {
            end = end.or_else(|| guide.accept(token));
            mask_time = guide.take_mask_time();
        }
        let (logprob, top) = match (self.params.wants_logprobs(), self.params.post_sampling) {
            (true, false) => {
                let (logprob, top) = raw_logprobs(logits, token, self.params.top_logprobs);
                (Some(logprob), top)
            }
            (true, true) => {
                let (logprob, top) = self.drawn_logprobs(token);
                (Some(logprob), top)
            }
            (false, _) => (None, Vec::new()),
        };
        Sampled { token, logprob, top, end, mask_time }
    }

    /// `token`'s log-probability in the distribution [`Sampler::sample`] drew it from, and the
    /// `top_logprobs` most likely of that distribution with theirs
    /// ([`SamplingParams::post_sampling`]). A draw's row, once adjusted, is the scratch row
    /// (only a greedy choice of an unadjusted row skips it, and a greedy choice is certain).
    /// The weights, top-k, min-p and top-p are the draw's own; a token with no weight is not
    /// reported. The drawn token lies in the set; were it not, its log-probability would be
    /// the least finite one (llama.cpp's choice for a probability of 0).
    fn drawn_logprobs(&mut self, token: u32) -> (f32, Vec<(u32, f32)>) {
        let p = &self.params;
        let n = p.top_logprobs;
        if p.is_greedy() {
            return (0.0, if n > 0 { vec![(token, 0.0)] } else { Vec::new() });
        }
        let row = &self.scratch;
        let max = crate::kernels::row_max(row);
        let keys = &mut self.draw.keys;
        keys.clear();
        keys.extend(row.iter().enumerate().filter_map(|(i, &l)| {
            let w = crate::kernels::draw_weight(l, max, p.temperature);
            (w > 0.0).then(|| rank_key(i as u32, w))
        }));
        keys.sort_unstable();
        if let Some(k) = p.top_k {
            keys.truncate(k);
        }
        if p.min_p > 0.0 {
            keys.retain(|k| unkey(*k).1 >= p.min_p);
        }
        let mut total: f64 = keys.iter().map(|k| f64::from(unkey(*k).1)).sum();
        if p.top_p < 1.0 {
            let mut nucleus = 0.0;
            if let Some(i) = keys.iter().position(|k| {
                nucleus += f64::from(unkey(*k).1);
                nucleus >= f64::from(p.top_p) * total
            }) {
                keys.truncate(i + 1);
                total = nucleus;
            }
        }
        let log_total = total.ln();
        let logprob = |w: f32| (f64::from(w).ln() - log_total) as f32;
        let drawn = keys.iter().map(|k| unkey(*k)).find(|c| c.0 == token).map_or(f32::MIN, |c| logprob(c.1));
        let top = keys.iter().take(n).map(|k| unkey(*k)).map(|(t, w)| (t, logprob(w))).collect();
        (drawn, top)
    }

    /// What the next token needs of its logits row. [`RowNeed::Best`]: greedy with no bias or
    /// penalty, no constraint and no log-probabilities; the token comes to [`Sampler::picked`].
    /// [`RowNeed::Top`]: sampled with a top-k of at most [`TOP_K_ON_DEVICE`] and nothing else
    /// of the row needed; the candidates come to [`Sampler::sample_top`]. [`RowNeed::Draw`]:
    /// the same without a top-k; the candidates and the row's mass come to
    /// [`Sampler::sample_top`], which may want the whole row after all. Otherwise the whole
    /// row, to [`Sampler::sample`].
    ///
    /// Logit bias and penalties keep a greedy row, one with a top-k under [`TOP_K_ON_DEVICE`],
    /// or one without a top-k, on the device: it brings back that many candidates and the
    /// logits of the tokens they change ([`Sampler::watch`]); the sampler adjusts those (and
    /// the mass), and every other token is as it was, at or below the last candidate.
    pub fn need(&self) -> RowNeed {
        if self.guide.is_some() || self.params.wants_logprobs() {
            return RowNeed::Whole;
        }
        let adjusts = self.adjusts_logits();
        match self.params.top_k {
            _ if self.params.is_greedy() => match adjusts {
                false => RowNeed::Best,
                true => RowNeed::Top(TOP_K_ON_DEVICE),
            },
            Some(k) if !adjusts && k <= TOP_K_ON_DEVICE => RowNeed::Top(k),
            // Under the device's count: the last candidate is the floor the top-k must clear.
            Some(k) if adjusts && k < TOP_K_ON_DEVICE => RowNeed::Top(TOP_K_ON_DEVICE),
            None => RowNeed::Draw(self.params.temperature),
            _ => RowNeed::Whole,
        }
    }

    /// The tokens whose logits the logit bias and penalties change, sorted, each once (none
    /// where nothing changes them): a row that samples from candidates brings theirs back too
    /// ([`RowAsk::watch`](crate::RowAsk::watch)) for [`Sampler::sample_top`].
    pub fn watch(&self) -> Vec<u32> {
        let mut tokens: Vec<u32> = self.watched_tokens().collect();
        tokens.sort_unstable();
        tokens.dedup();
        tokens
    }

    /// [`Sampler::watch`]'s tokens, unsorted, some more than once.
    fn watched_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        let p = &self.params;
        let penalised = p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        let generated = penalised.then(|| self.generated.keys()).into_iter().flatten();
        let prompt: &[u32] = if p.repetition_penalty != 1.0 { &self.prompt } else { &[] };
        p.logit_bias.iter().map(|b| b.0).chain(generated.copied()).chain(prompt.iter().copied())
    }

    /// Records `token`, the best of its row, picked for a sequence whose [`Sampler::need`] is
    /// [`RowNeed::Best`].
    pub fn picked(&mut self, token: u32) -> Sampled {
        debug_assert_eq!(self.need(), RowNeed::Best);
        self.record(token)
    }

    /// Samples from `candidates`, the (token, logit) pairs of the row's largest logits, best
    /// first, for a sequence whose [`Sampler::need`] is [`RowNeed::Top`] (at least top-k of
    /// them where the row has that many; `mass` `None`) or [`RowNeed::Draw`] (`mass` the row's
    /// Σ exp((l − max) / t)): the token [`Sampler::sample`] draws from the whole row with the
    /// same random stream. `None` where that token may lie past the candidates (the draw, the
    /// min-p set or the top-p nucleus reaches past them): then [`Sampler::sample`] takes the
    /// whole row, with the same random number.
    ///
    /// With logit bias or penalties, `candidates` are the row's [`TOP_K_ON_DEVICE`] best before
    /// them, and `watched` the (token, logit) pairs, before them, of [`Sampler::watch`]'s tokens
    /// (more do no harm); `None` also where one of those is missing, or where too few tokens stay
    /// above the last candidate once adjusted for the choice to be made among them (every
    /// other token is at or below it), or the mass would lose its precision to the adjustment.
    pub fn sample_top(
        &mut self,
        candidates: &[(u32, f32)],
        mass: Option<f32>,
        watched: &[(u32, f32)],
    ) -> Option<Sampled> {
        debug_assert!(matches!(self.need(), RowNeed::Top(_) | RowNeed::Draw(_)));
        if !self.adjusts_logits() {
            let token = self.draw(candidates.iter().copied(), mass.map(f64::from))?;
            return Some(self.record(token));
        }
        // Every token past the candidates is at or below the last one, before and after.
        let floor = candidates.last().filter(|_| candidates.len() >= TOP_K_ON_DEVICE).map(|c| c.1);
        let mut raw: Vec<(u32, f32)> = candidates.iter().chain(watched).copied().collect();
        raw.sort_unstable_by_key(|c| c.0);
        raw.dedup_by_key(|c| c.0);
        // Without a floor the candidates are all the row's tokens that can be chosen.
        if floor.is_some() && self.watched_tokens().any(|t| raw.binary_search_by_key(&t, |c| c.0).is_err()) {
            return None;
        }
        let adjusted: Vec<(u32, f32)> = raw.iter().map(|&(token, l)| (token, self.adjusted(token, l))).collect();
        let token = match (floor, mass) {
            (Some(floor), Some(mass)) if self.params.top_k.is_none() && !self.params.is_greedy() => {
                self.draw_adjusted_mass(&raw, &adjusted, candidates[0].1, mass, floor)?
            }
            _ => self.draw_adjusted(&adjusted, floor)?,
        };
        Some(self.record(token))
    }

    /// [`Sampler::sample_top`]'s choice among `adjusted` candidates, all the row's tokens that
    /// can be chosen when `floor` is `None`, else the best of it before adjusting, each other
    /// token at or below `floor`: the best (greedy) or a draw from the top-k where those are
    /// above `floor` (strictly, and their probabilities above its, so that no tie with a token
    /// past them can change the order).
    fn draw_adjusted(&mut self, adjusted: &[(u32, f32)], floor: Option<f32>) -> Option<u32> {
        let best = adjusted
            .iter()
            .copied()
            .filter(|c| !c.1.is_nan())
            .reduce(|a, b| if b.1 > a.1 || (b.1 == a.1 && b.0 < a.0) { b } else { a });
        if self.params.is_greedy() {
            let (token, l) = best?;
            return (floor.is_none_or(|floor| l > floor)).then_some(token);
        }
        match (floor, self.params.top_k) {
            (Some(floor), Some(k)) => {
                let max = best?.1;
                let w = |l: f32| ((l - max) / self.params.temperature).exp();
                if adjusted.iter().filter(|c| w(c.1) > w(floor)).count() < k {
                    return None;
                }
            }
            // Without a top-k (and a mass) a draw can reach past them.
            (Some(_), None) => return None,
            (None, _) => {}
        }
        self.draw(adjusted.iter().copied(), None)
    }

    /// [`Sampler::sample_top`]'s draw without a top-k: the row's candidates and watched tokens,
    /// `raw` before the bias and penalties and `adjusted` after (in the same order), `max` the
    /// row's largest logit before, `mass` its Σ exp((l − max) / t) before, every other token
    /// at or below `floor` and unchanged. The draw walks the tokens whose probabilities stay
    /// above the floor's (the row's best, in order, once adjusted) against the adjusted mass:
    /// the unchanged tokens' share of `mass` rescaled to the new best, plus the adjusted ones'.
    /// `None` where it falls past them, or where the unchanged share is too small a difference
    /// of `mass` (a device's f32 sum) to hold its digits.
    fn draw_adjusted_mass(
        &mut self,
        raw: &[(u32, f32)],
        adjusted: &[(u32, f32)],
        max: f32,
        mass: f32,
        floor: f32,
    ) -> Option<u32> {
        let t = self.params.temperature;
        let best = adjusted.iter().map(|c| c.1).filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max);
        if best <= floor {
            return None;
        }
        let w = |l: f32, max: f32| f64::from(crate::kernels::draw_weight(l, max, t));
        let changed: f64 = raw.iter().map(|c| w(c.1, max)).sum();
        let scale = (f64::from(max - best) / f64::from(t)).exp();
        let unchanged = scale * (f64::from(mass) - changed).max(0.0);
        let total = unchanged + adjusted.iter().map(|c| w(c.1, best)).sum::<f64>();
        // The mass's rounding, about 1e-6 of it, is to stay under 1e-4 of the total.
        if !(total.is_finite() && scale * f64::from(mass) <= 100.0 * total) {
            return None;
        }
        let above = w(floor, best);
        let drawn = adjusted.iter().copied().filter(|c| w(c.1, best) > above);
        self.draw(drawn, Some(total))
    }

    /// Counts `token` for the penalties: a token chosen with nothing else to report.
    fn record(&mut self, token: u32) -> Sampled {
        *self.generated.entry(token).or_default() += 1;
        Sampled { token, logprob: None, top: Vec::new(), end: None, mask_time: None }
    }

    /// `logit` of `token` as [`Sampler::apply_bias_and_penalties`] changes it in a row.
    fn adjusted(&self, token: u32, mut logit: f32) -> f32 {
        for &(t, bias) in &self.params.logit_bias {
            if t == token {
                logit += bias;
            }
        }
        self.penalized(token, logit)
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
        // The tokens a penalty can reach: the generated ones, and the prompt's under a
        // repetition penalty; each once.
        let repeats = p.repetition_penalty != 1.0;
        let prompt = if repeats { &self.prompt[..] } else { &[] };
        let seen = prompt
            .iter()
            .copied()
            .chain(self.generated.keys().copied().filter(|t| !repeats || self.prompt.binary_search(t).is_err()));
        for t in seen {
            row[t as usize] = self.penalized(t, row[t as usize]);
        }
    }

    /// `logit` of `token` (its bias added) under the repetition, presence and frequency
    /// penalties, for a row ([`Sampler::apply_bias_and_penalties`]) or a candidate
    /// ([`Sampler::adjusted`]).
    fn penalized(&self, token: u32, mut logit: f32) -> f32 {
        let p = &self.params;
        let count = self.generated.get(&token).copied().unwrap_or(0);
        if p.repetition_penalty != 1.0 && (count > 0 || self.prompt.binary_search(&token).is_ok()) {
            logit = if logit > 0.0 { logit / p.repetition_penalty } else { logit * p.repetition_penalty };
        }
        if count > 0 {
            logit -= p.presence_penalty + p.frequency_penalty * count as f32;
        }
        logit
    }

    /// Temperature, top-k, min-p, top-p, then one draw from what remains of `logits`, (token,
    /// logit) pairs: a row's best candidates (a whole row goes through [`Sampler::draw_row`]),
    /// then with `mass` (Σ exp((l − max) / t) over the row) where they are not all that top-k
    /// leaves. Each weighs `kernels::draw_weight`, on either path. Masses add up in f64, so that
    /// the token drawn does not hang on the order they are added in (in f32, 150,000 small
    /// probabilities summed in two orders moved a draw by thousands of tokens). `None` where
    /// the token may be past the candidates; a uniform number drawn is then kept for the next
    /// draw (from the whole row).
    fn draw(&mut self, logits: impl Iterator<Item = (u32, f32)> + Clone, mass: Option<f64>) -> Option<u32> {
        let t = self.params.temperature;
        let max = logits.clone().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let keys = &mut self.draw.keys;
        keys.clear();
        let mut given = 0;
        keys.extend(logits.filter_map(|(token, l)| {
            given += 1;
            let w = crate::kernels::draw_weight(l, max, t);
            (w > 0.0).then(|| rank_key(token, w))
        }));
        self.draw_keys(given, mass)
    }

    /// [`Sampler::draw`] from a whole row (no mass: always a token), its weights computed a
    /// vector at a time (the same values, `kernels::draw_weights`). Only the tokens the walk
    /// can reach are ranked: those at least [`ROW_FLOORS`]' first floor (the best weighs 1)
    /// are walked against the whole row's total; where the walk (or the top-p nucleus) runs
    /// past them, with the same random number, those at least the next floor, and so on to
    /// every token. A walk over the tokens above a floor is the first part of the walk over
    /// them all, so the token drawn is the one a ranking of the whole row gives.
    fn draw_row(&mut self, row: &[f32]) -> u32 {
        let p = &self.params;
        let max = crate::kernels::row_max(row);
        let DrawScratch { keys, weights, ranked, starts } = &mut self.draw;
        crate::kernels::draw_weights(row, max, p.temperature, weights);
        // Min-p keeps the tokens at least this heavy; none that weigh nothing.
        let least = p.min_p;
        let total = crate::kernels::weights_total(weights, least);
        let r = self.pending.take().unwrap_or_else(|| self.rng.random::<f32>());
        for floor in ROW_FLOORS {
            let floor = floor.max(least);
            keys.clear();
            crate::kernels::weights_at_least(weights, floor, |i, w| keys.push(rank_key(i as u32, w)));
            // Under the floor lie more of min-p's tokens, until the floor is min-p's own.
            let open = floor > least;
            let mut ranked = Ranked::new(keys, ranked, starts);
            if let Some(token) = walk(p, &mut ranked, total, open, r) {
                return token;
            }
        }
        unreachable!("the last floor is min-p's: a walk over all its tokens draws one")
    }

    /// The rest of [`Sampler::draw`] over its candidates' rank keys (`self.draw.keys`), `given`
    /// of them before those that weigh nothing were left out.
    fn draw_keys(&mut self, given: usize, mass: Option<f64>) -> Option<u32> {
        let p = &self.params;
        let keys = &mut self.draw.keys;
        // Whether tokens past the candidates can still be drawn: they are the best of a longer
        // row (a mass given), none of them too unlikely to count, and nothing below cuts the
        // row within them.
        let mut open = mass.is_some() && keys.len() == given;
        if let Some(k) = p.top_k.filter(|k| *k < keys.len()) {
            keys.select_nth_unstable(k - 1);
            keys.truncate(k);
            open = false;
        }
        if p.min_p > 0.0 {
            // The best candidate has probability exp(0) = 1 before normalisation.
            let before = keys.len();
            keys.retain(|k| unkey(*k).1 >= p.min_p);
            if open && keys.len() == before {
                return None;
            }
            open = false;
        }
        let mut ranked = Ranked::new(keys, &mut self.draw.ranked, &mut self.draw.starts);
        let total: f64 = match mass {
            Some(mass) if open => mass,
            _ => ranked.total(),
        };
        let r = self.pending.take().unwrap_or_else(|| self.rng.random::<f32>());
        let token = walk(p, &mut ranked, total, open, r);
        if token.is_none() {
            self.pending = Some(r);
        }
        token
    }
}

/// The floors of a whole row's walks ([`Sampler::draw_row`]), probabilities relative to the
/// best token's: the first holds the walk on most steps (the tokens within 5.5 · t nats of the
/// best), the second all but at most 151,936 · 2⁻²⁴ (1%) of the best's mass, the last every
/// token.
const ROW_FLOORS: [f32; 3] = [1.0 / 256.0, 1.0 / 16_777_216.0, 0.0];

/// The end of a draw: top-p's nucleus of `ranked` (the candidates left, most likely first)
/// against `total`, then the token at `r` of its mass. `open`: tokens past the candidates
/// count in `total` and may be drawn, so `None` where the nucleus or the draw reaches past
/// them; else always a token.
fn walk(p: &SamplingParams, ranked: &mut Ranked<'_>, mut total: f64, mut open: bool, r: f32) -> Option<u32> {
    let mut len = ranked.len();
    if open && !(total.is_finite() && total > 0.0) {
        return None;
    }
    if p.top_p < 1.0 {
        let mut nucleus = 0.0;
        match (0..len).position(|i| {
            nucleus += f64::from(ranked.get(i).1);
            nucleus >= f64::from(p.top_p) * total
        }) {
            Some(i) => {
                len = i + 1;
                open = false;
            }
            None if open => return None,
            None => {}
        }
        total = nucleus;
    }
    let mut u = f64::from(r) * total;
    for i in 0..len {
        let (token, w) = ranked.get(i);
        if u < f64::from(w) {
            return Some(token);
        }
        u -= f64::from(w);
    }
    if open {
        return None;
    }
    Some(len.checked_sub(1).map_or(0, |i| ranked.get(i).0))
}

/// A draw's buffers, kept by its sampler from token to token (a whole row's candidates are
/// 1.2 MB).
#[derive(Debug, Default)]
struct DrawScratch {
    /// A whole row's weights, before they become keys.
    weights: Vec<f32>,
    keys: Vec<u64>,
    ranked: Vec<u64>,
    starts: Vec<u32>,
}

/// A candidate (token, unnormalised probability in (0, 1]) as one word that sorts most likely
/// first, then the smaller token: the probability's bits inverted above the token (positive
/// floats' bits order as their values).
fn rank_key(token: u32, p: f32) -> u64 {
    (u64::from(!p.to_bits()) << 32) | u64::from(token)
}

fn unkey(key: u64) -> (u32, f32) {
    (key as u32, f32::from_bits(!((key >> 32) as u32)))
}

/// Candidates in rank-key order as far as a walk reads them: counted into buckets of
/// probabilities (16 an octave, in order), each bucket sorted when the walk first reaches
/// it, so that a draw that stops among the first few hundred of a whole row's 150,000 sorts
/// those alone (sorting every candidate took 11-12 ms a token at the vocabulary's size, on a
/// 2-core Xeon; about 3 ms now, most of it the exponentials).
struct Ranked<'a> {
    items: &'a mut [u64],
    /// Where each bucket starts in `items`, and its end last.
    starts: &'a [u32],
    /// `items[..sorted]` is in order; it ends where `bucket` does.
    sorted: usize,
    bucket: usize,
}

impl<'a> Ranked<'a> {
    /// A key's bucket is its top bits past this many (its probability's exponent and first
    /// four mantissa bits).
    const SHIFT: u32 = 19;
    /// The bucket of probability 1 (the largest; smaller ones come after).
    const FIRST: u32 = !1.0f32.to_bits() >> Self::SHIFT;
    const BUCKETS: usize = (u32::MAX >> Self::SHIFT) as usize - Self::FIRST as usize + 1;

    fn bucket(key: u64) -> usize {
        (((key >> 32) as u32 >> Self::SHIFT).saturating_sub(Self::FIRST) as usize).min(Self::BUCKETS - 1)
    }

    /// `keys` counted into `ranked` by bucket (a counting sort), `starts` their bounds.
    fn new(keys: &[u64], ranked: &'a mut Vec<u64>, starts: &'a mut Vec<u32>) -> Self {
        starts.clear();
        starts.resize(Self::BUCKETS + 1, 0);
        for &key in keys {
            starts[Self::bucket(key) + 1] += 1;
        }
        for b in 0..Self::BUCKETS {
            starts[b + 1] += starts[b];
        }
        ranked.clear();
        ranked.resize(keys.len(), 0);
        let mut next = starts.clone();
        for &key in keys {
            let at = &mut next[Self::bucket(key)];
            ranked[*at as usize] = key;
            *at += 1;
        }
        Self { items: ranked, starts, sorted: 0, bucket: 0 }
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    /// The sum of every candidate's probability.
    fn total(&self) -> f64 {
        self.items.iter().map(|k| f64::from(unkey(*k).1)).sum()
    }

    /// The `i`-th best; precondition: `i < len()`.
    fn get(&mut self, i: usize) -> (u32, f32) {
        debug_assert!(i < self.len());
        while i >= self.sorted {
            while self.starts[self.bucket + 1] as usize <= self.sorted {
                self.bucket += 1;
            }
            let end = self.starts[self.bucket + 1] as usize;
            self.items[self.sorted..end].sort_unstable();
            self.sorted = end;
        }
        unkey(self.items[i])
    }
}

/// log-softmax of `logits` at `token`, and the `n` best tokens with theirs (the smaller token
/// first among equal logits; NaN and −∞ left out): a sampled token's log-probability, or a
/// prompt token's ([`SamplingParams::prompt_logprobs`]).
pub fn raw_logprobs(logits: &[f32], token: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
    let log_z = crate::kernels::log_sum_exp(logits);
    let mut top = crate::output::top_logits(logits, n);
    top.iter_mut().for_each(|(_, l)| *l -= log_z);
    (logits[token as usize] - log_z, top)
}

#[cfg(test)]
mod tests;
