use super::*;
use crate::grammar::Guidance;

/// Logits whose softmax is `probs`.
fn logits_of(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams { seed: Some(7), ..SamplingParams::default() };
    f(&mut p);
    p.validate(1000).unwrap();
    p
}

/// How often each token is drawn in `n` draws from the same row.
fn frequencies(p: SamplingParams, row: &[f32], n: usize) -> Vec<f32> {
    let mut s = Sampler::new(p, &[]);
    let mut counts = vec![0usize; row.len()];
    for _ in 0..n {
        counts[s.sample(row).token as usize] += 1;
        s.generated.clear(); // independent draws: no penalties build up (none are set anyway)
    }
    counts.into_iter().map(|c| c as f32 / n as f32).collect()
}

#[test]
fn temperature_zero_is_argmax() {
    let row = [0.1, 3.0, 2.9, -1.0];
    let mut s = Sampler::new(SamplingParams::default(), &[]);
    assert_eq!(s.sample(&row).token, 1);
}

#[test]
fn top_k_one_equals_greedy_at_any_temperature() {
    let row = logits_of(&[0.3, 0.25, 0.45]);
    let f = frequencies(params(|p| (p.temperature, p.top_k) = (1.5, Some(1))), &row, 200);
    assert_eq!(f, vec![0.0, 0.0, 1.0]);
}

#[test]
fn the_same_seed_gives_the_same_tokens() {
    let row = logits_of(&[0.2; 5]);
    let draw = |seed| {
        let mut s = Sampler::new(params(|p| (p.temperature, p.seed) = (1.0, Some(seed))), &[]);
        (0..40).map(|_| s.sample(&row).token).collect::<Vec<_>>()
    };
    assert_eq!(draw(42), draw(42));
    assert_ne!(draw(42), draw(43));
}

#[test]
fn temperature_one_draws_with_the_model_probabilities() {
    let f = frequencies(params(|p| p.temperature = 1.0), &logits_of(&[0.7, 0.2, 0.1]), 4000);
    for (got, want) in f.iter().zip([0.7, 0.2, 0.1]) {
        assert!((got - want).abs() < 0.03, "frequencies {f:?}");
    }
}

#[test]
fn logit_bias_forces_a_token() {
    let row = logits_of(&[0.9, 0.09, 0.01]);
    let mut greedy = Sampler::new(params(|p| p.logit_bias = vec![(2, 100.0)]), &[]);
    assert_eq!(greedy.sample(&row).token, 2);
    let f = frequencies(params(|p| (p.temperature, p.logit_bias) = (1.0, vec![(0, -100.0)])), &row, 500);
    assert_eq!(f[0], 0.0, "a −100 bias bans a token");
}

#[test]
fn top_k_keeps_only_the_k_best() {
    let f = frequencies(params(|p| (p.temperature, p.top_k) = (1.0, Some(2))), &logits_of(&[0.1, 0.4, 0.3, 0.2]), 2000);
    assert_eq!((f[0], f[3]), (0.0, 0.0));
    assert!((f[1] - 4.0 / 7.0).abs() < 0.04, "{f:?}");
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_the_mass() {
    let row = logits_of(&[0.5, 0.3, 0.2]);
    let f = frequencies(params(|p| (p.temperature, p.top_p) = (1.0, 0.7)), &row, 1000);
    assert_eq!(f[2], 0.0, "{f:?}");
    assert!(f[1] > 0.2, "{f:?}");
    let f = frequencies(params(|p| (p.temperature, p.top_p) = (1.0, 0.5)), &row, 300);
    assert_eq!(f, vec![1.0, 0.0, 0.0]);
}

#[test]
fn min_p_drops_tokens_far_below_the_best() {
    // Threshold 0.35 × 0.5 = 0.175: 0.2 stays, 0.16 and 0.14 go.
    let f = frequencies(params(|p| (p.temperature, p.min_p) = (1.0, 0.35)), &logits_of(&[0.5, 0.2, 0.16, 0.14]), 1000);
    assert_eq!((f[2], f[3]), (0.0, 0.0), "{f:?}");
    assert!(f[1] > 0.2, "{f:?}");
}

#[test]
fn repetition_penalty_discourages_prompt_tokens() {
    let row = [2.0, 1.9, -1.0];
    let mut s = Sampler::new(params(|p| p.repetition_penalty = 1.2), &[0]);
    assert_eq!(s.sample(&row).token, 1, "2.0 / 1.2 < 1.9");
}

#[test]
fn presence_and_frequency_penalties_discourage_generated_tokens() {
    let row = [2.0, 1.5, 0.0];
    let mut s = Sampler::new(params(|p| p.frequency_penalty = 0.3), &[]);
    let tokens: Vec<u32> = (0..3).map(|_| s.sample(&row).token).collect();
    assert_eq!(tokens, vec![0, 0, 1], "2.0 − 2 × 0.3 < 1.5");
    let mut s = Sampler::new(params(|p| p.presence_penalty = 0.6), &[]);
    let tokens: Vec<u32> = (0..3).map(|_| s.sample(&row).token).collect();
    // After one 0: 1.4 < 1.5, so 1; then both carry the penalty once: 1.4 > 0.9, so 0 again.
    assert_eq!(tokens, vec![0, 1, 0]);
    // A resumed sampler continues the counts of what was generated before.
    let mut s = Sampler::resume(params(|p| p.frequency_penalty = 0.3), &Guidance::default(), &[], &[0, 0]);
    assert_eq!(s.sample(&row).token, 1, "2.0 − 2 × 0.3 < 1.5");
}

#[test]
fn logprobs_are_the_raw_log_softmax_with_the_best_alternatives() {
    let probs = [0.1, 0.6, 0.3];
    let mut s = Sampler::new(params(|p| (p.top_logprobs, p.logit_bias) = (2, vec![(0, 50.0)])), &[]);
    let out = s.sample(&logits_of(&probs));
    assert_eq!(out.token, 0);
    assert!((out.logprob.unwrap() - 0.1f32.ln()).abs() < 1e-5, "raw, unbiased distribution");
    assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
    assert!((out.top[0].1 - 0.6f32.ln()).abs() < 1e-5);
}

#[test]
fn post_sampling_logprobs_are_of_the_distribution_drawn_from() {
    let probs = [0.05, 0.4, 0.1, 0.3, 0.15];
    let row = logits_of(&probs);
    let close = |a: f32, b: f32| (a - b).abs() < 1e-5;
    let post = |f: fn(&mut SamplingParams)| {
        params(|p| {
            (p.temperature, p.top_logprobs, p.post_sampling) = (1.0, 5, true);
            f(p)
        })
    };
    // Top-k 3 keeps 0.4, 0.3 and 0.15, renormalised; every draw is one of them.
    let mut s = Sampler::new(post(|p| p.top_k = Some(3)), &[]);
    for _ in 0..20 {
        let out = s.sample(&row);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 4]);
        for (&(_, lp), want) in out.top.iter().zip([0.4, 0.3, 0.15]) {
            assert!(close(lp, (want / 0.85f32).ln()), "{lp} for {want}");
        }
        let drawn = out.top.iter().find(|t| t.0 == out.token).expect("the token drawn is among them");
        assert!(close(out.logprob.unwrap(), drawn.1));
    }
    // Top-p 0.6: the nucleus 0.4 + 0.3 reaches it; min-p 0.5 keeps what weighs half the best.
    for (edit, want) in [
        ((|p| p.top_p = 0.6) as fn(&mut SamplingParams), vec![(1, 0.4 / 0.7), (3, 0.3 / 0.7)]),
        (|p| p.min_p = 0.5, vec![(1, 0.4 / 0.7), (3, 0.3 / 0.7)]),
        // A bias moves the distribution the draw sees; the raw one would not show it.
        (|p| (p.top_k, p.logit_bias) = (Some(2), vec![(0, 10f32.ln())]), vec![(0, 0.5 / 0.9), (1, 0.4 / 0.9)]),
    ] {
        let out = Sampler::new(post(edit), &[]).sample(&row);
        assert_eq!(out.top.len(), want.len());
        for (&(t, lp), (wt, wp)) in out.top.iter().zip(want) {
            assert!(t == wt && close(lp, (wp as f32).ln()), "{t} {lp} against {wt} {wp}");
        }
    }
    // A greedy choice is certain.
    let out = Sampler::new(post(|p| p.temperature = 0.0), &[]).sample(&row);
    assert_eq!((out.token, out.logprob, out.top), (1, Some(0.0), vec![(1, 0.0)]));
}

#[test]
fn out_of_range_parameters_are_named() {
    type Edit = fn(&mut SamplingParams);
    let cases: [(&str, Edit); 8] = [
        ("temperature", |p| p.temperature = -0.5),
        ("temperature", |p| p.temperature = f32::NAN),
        ("top_k", |p| p.top_k = Some(0)),
        ("top_p", |p| p.top_p = 0.0),
        ("min_p", |p| p.min_p = 1.5),
        ("frequency_penalty", |p| p.frequency_penalty = 3.0),
        ("logit_bias", |p| p.logit_bias = vec![(1000, 1.0)]),
        ("top_logprobs", |p| p.top_logprobs = 21),
    ];
    for (param, edit) in cases {
        let mut p = SamplingParams::default();
        edit(&mut p);
        assert_eq!(p.validate(1000).unwrap_err().param, param);
    }
}

#[test]
fn logprobs_only_when_asked_and_greedy_rows_can_be_picked_elsewhere() {
    let row = logits_of(&[0.1, 0.6, 0.3]);
    let mut s = Sampler::new(params(|_| {}), &[]);
    assert_eq!(s.need(), RowNeed::Best);
    let out = s.sample(&row);
    assert_eq!((out.token, out.logprob, out.top.len()), (1, None, 0), "nothing asked: no log-probability");
    assert_eq!(s.picked(1).token, 1);
    let mut s = Sampler::new(params(|p| p.logprobs = true), &[]);
    assert_eq!(s.need(), RowNeed::Whole, "log-probabilities need the whole row");
    assert!((s.sample(&row).logprob.unwrap() - 0.6f32.ln()).abs() < 1e-5);
    for (what, edit) in [
        (
            "a top-k past the device's",
            (|p| (p.temperature, p.top_k) = (0.7, Some(TOP_K_ON_DEVICE + 1))) as fn(&mut SamplingParams),
        ),
        ("alternatives", |p| p.top_logprobs = 1),
        ("a penalty with the device's top-k or more", |p| {
            (p.temperature, p.top_k, p.repetition_penalty) = (0.7, Some(TOP_K_ON_DEVICE), 1.1)
        }),
        ("top-k with log-probabilities", |p| (p.temperature, p.top_k, p.logprobs) = (0.7, Some(5), true)),
    ] {
        assert_eq!(Sampler::new(params(edit), &[]).need(), RowNeed::Whole, "{what}");
    }
    let top = params(|p| (p.temperature, p.top_k, p.top_p) = (0.7, Some(TOP_K_ON_DEVICE), 0.9));
    assert_eq!(Sampler::new(top, &[]).need(), RowNeed::Top(TOP_K_ON_DEVICE));
    for (what, edit) in [
        ("greedy with a penalty", (|p| p.repetition_penalty = 1.1) as fn(&mut SamplingParams)),
        ("greedy with a negative bias", |p| p.logit_bias = vec![(0, -1.0)]),
        ("top-k with penalties", |p| {
            (p.temperature, p.top_k, p.presence_penalty, p.frequency_penalty) = (0.7, Some(5), 0.5, 0.1)
        }),
        ("greedy with a bias that raises a logit", |p| p.logit_bias = vec![(0, 1.0)]),
        ("greedy with a repetition penalty under 1", |p| p.repetition_penalty = 0.9),
        ("top-k with a negative presence penalty", |p| {
            (p.temperature, p.top_k, p.presence_penalty) = (0.7, Some(5), -0.5)
        }),
    ] {
        assert_eq!(Sampler::new(params(edit), &[]).need(), RowNeed::Top(TOP_K_ON_DEVICE), "{what}");
    }
    let draw = params(|p| (p.temperature, p.top_p, p.min_p) = (0.7, 0.9, 0.1));
    assert_eq!(Sampler::new(draw, &[]).need(), RowNeed::Draw(0.7), "sampling without a top-k");
    let penalized = params(|p| (p.temperature, p.repetition_penalty) = (0.7, 1.1));
    assert_eq!(Sampler::new(penalized, &[]).need(), RowNeed::Draw(0.7), "a penalty without a top-k");
    // What a sampler watches: the biased tokens, the generated ones under a penalty, the
    // prompt's under a repetition penalty; nothing where no logit changes.
    let mut s = Sampler::new(params(|p| p.logit_bias = vec![(9, -1.0), (2, 1.0)]), &[5, 1]);
    s.record(7);
    assert_eq!(s.watch(), [2, 9], "a bias alone");
    let mut s = Sampler::new(params(|p| p.presence_penalty = 0.5), &[5, 1]);
    s.record(7);
    s.record(3);
    s.record(7);
    assert_eq!(s.watch(), [3, 7], "generated tokens");
    let mut s = Sampler::new(params(|p| (p.repetition_penalty, p.logit_bias) = (1.1, vec![(4, -2.0)])), &[5, 1, 5]);
    s.record(7);
    assert_eq!(s.watch(), [1, 4, 5, 7], "prompt, generated and biased tokens");
    let mut s = Sampler::new(params(|_| {}), &[5, 1]);
    s.record(7);
    assert!(s.watch().is_empty(), "nothing changes the logits");
    // A frequency penalty counts picked tokens as it counts sampled ones.
    let mut s = Sampler::new(params(|_| {}), &[]);
    s.picked(1);
    assert_eq!(s.generated.get(&1), Some(&1));
}

/// A sequence sampling with top-k draws the same tokens from its row's best candidates (what a
/// GPU finds) as from the whole row, seed for seed, whatever else applies after top-k
/// (temperature, min-p, top-p), and counts them the same.
#[test]
fn sampling_from_the_best_candidates_draws_what_the_whole_row_does() {
    // 300 logits, some equal, a NaN and a −∞ among them.
    let mut row: Vec<f32> = (0..300u32).map(|i| ((i * 7919) % 300) as f32 / 40.0 - 3.0).collect();
    row[17] = f32::NAN;
    row[23] = f32::NEG_INFINITY;
    row[150] = row[151];
    let order = best_first(&row);
    let candidates = |k: usize| order.iter().take(k).map(|&i| (i, row[i as usize])).collect::<Vec<_>>();
    for (k, temperature, min_p, top_p) in
        [(1, 0.5, 0.0, 1.0), (5, 1.0, 0.0, 1.0), (20, 0.7, 0.0, 0.8), (64, 1.3, 0.05, 0.95)]
    {
        for seed in 0..50 {
            let p = params(|p| {
                (p.top_k, p.temperature, p.min_p, p.top_p, p.seed) = (Some(k), temperature, min_p, top_p, Some(seed))
            });
            let (mut whole, mut top) = (Sampler::new(p.clone(), &[]), Sampler::new(p, &[]));
            for step in 0..3 {
                let want = whole.sample(&row).token;
                let got = match top.need() {
                    RowNeed::Top(k) => {
                        top.sample_top(&candidates(k), None, &[]).expect("top-k's candidates suffice").token
                    }
                    RowNeed::Best => top.picked(candidates(1)[0].0).token,
                    need => panic!("top-k {k} needs only candidates, not {need:?}"),
                };
                assert_eq!(got, want, "top-k {k}, seed {seed}, step {step}");
            }
            assert_eq!(top.generated, whole.generated);
        }
    }
}

/// A sequence sampling without a top-k draws from its row's best candidates and the row's mass
/// (what a GPU finds) the token it draws from the whole row, seed for seed, or says it needs the
/// row, and then draws that token from it with the same random number: under plain
/// temperature, min-p, top-p and both, on a row flat enough that 64 candidates often do not
/// hold the draw.
#[test]
fn sampling_from_candidates_and_the_mass_draws_what_the_whole_row_does_or_asks_for_it() {
    let mut row: Vec<f32> = (0..2000u32).map(|i| ((i * 7919) % 2000) as f32 / 300.0 - 3.0).collect();
    row[17] = f32::NAN;
    row[23] = f32::NEG_INFINITY;
    row[1500] = row[1501];
    let order = best_first(&row);
    let candidates: Vec<(u32, f32)> = order.iter().take(TOP_K_ON_DEVICE).map(|&i| (i, row[i as usize])).collect();
    let max = candidates[0].1;
    let mut ways = Ways::default();
    for (temperature, min_p, top_p) in
        [(1.0, 0.0, 1.0), (0.3, 0.0, 1.0), (0.7, 0.0, 0.9), (1.0, 0.3, 1.0), (0.5, 0.1, 0.6), (3.0, 0.0, 0.5)]
    {
        let mass: f64 = row.iter().map(|&l| f64::from(((l - max) / temperature).exp())).filter(|w| *w > 0.0).sum();
        for seed in 0..50 {
            let p = params(|p| (p.temperature, p.min_p, p.top_p, p.seed) = (temperature, min_p, top_p, Some(seed)));
            let (mut whole, mut top) = (Sampler::new(p.clone(), &[]), Sampler::new(p, &[]));
            assert_eq!(top.need(), RowNeed::Draw(temperature));
            for step in 0..3 {
                let want = whole.sample(&row).token;
                let got = ways.choose(&mut top, &candidates, Some(mass as f32), &row);
                assert_eq!(got, want, "T {temperature}, min-p {min_p}, top-p {top_p}, seed {seed}, step {step}");
            }
            assert_eq!(top.generated, whole.generated);
        }
    }
    assert!(ways.candidates > 100 && ways.rows > 100, "both ways taken: {ways:?}");
}

/// A sequence under logit bias and penalties, lowering or raising logits, greedy, with a top-k
/// or without one (then with the row's mass), picks from its row's 64 best candidates (before
/// those) and the logits of the tokens it watches the token it picks from the whole row, seed
/// for seed and step after step as its penalties grow, or says it needs the row (a token past
/// them might now be among the best, or the draw falls past them) and picks that token from it.
#[test]
fn penalties_choose_among_the_candidates_and_watched_tokens_or_ask_for_the_row() {
    let row: Vec<f32> = (0..1000u32).map(|i| ((i * 7919) % 1000) as f32 / 50.0 - 8.0).collect();
    let order = best_first(&row);
    let candidates: Vec<(u32, f32)> = order.iter().take(TOP_K_ON_DEVICE).map(|&i| (i, row[i as usize])).collect();
    let some_best: Vec<u32> = order.iter().copied().step_by(3).take(12).collect();
    let all_best: Vec<u32> = order[..TOP_K_ON_DEVICE].to_vec();
    let mass_at = |t: f32| {
        let max = row[order[0] as usize];
        row.iter().map(|&l| f64::from(((l - max) / t).exp())).sum::<f64>() as f32
    };
    let mut ways = Ways::default();
    type Case = (f32, Option<usize>, f32, f32, f32, Vec<(u32, f32)>);
    let cases: Vec<(&[u32], Case)> = vec![
        (&some_best, (0.0, None, 1.3, 0.0, 0.0, vec![])),
        (&[], (0.0, None, 1.0, 0.0, 0.0, all_best.iter().map(|&t| (t, -100.0)).collect())),
        (&some_best, (0.8, Some(20), 1.05, 0.0, 0.0, vec![])),
        (&[], (1.2, Some(48), 1.0, 0.5, 0.3, vec![(order[0], -2.0)])),
        (&all_best[..60], (0.7, Some(5), 2.0, 0.0, 0.0, vec![])),
        (&all_best[..40], (0.0, None, 1.0, 0.0, 1.5, vec![(order[3], -0.1)])),
        // Raising: a token far past the candidates brought to the top, a repetition penalty
        // under 1, a negative presence penalty.
        (&[], (0.0, None, 1.0, 0.0, 0.0, vec![(order[500], 25.0)])),
        (&some_best, (0.0, None, 0.8, 0.0, 0.0, vec![])),
        (&[], (0.9, Some(10), 1.0, -1.0, 0.0, vec![(order[300], 9.0)])),
        // Without a top-k: the candidates, the watched tokens and the adjusted mass.
        (&some_best, (1.0, None, 1.1, 0.3, 0.2, vec![])),
        (&[], (0.7, None, 1.0, 0.0, 0.0, vec![(order[0], -5.0), (order[100], 2.5)])),
        (&all_best[..50], (0.4, None, 1.5, 0.0, 0.0, vec![])),
        (&[], (2.0, None, 1.0, -0.5, 0.5, vec![(order[900], 15.0)])),
    ];
    for (prompt, (temperature, top_k, repetition, presence, frequency, bias)) in cases {
        for seed in 0..20 {
            let p = params(|p| {
                (p.temperature, p.top_k, p.top_p, p.seed) = (temperature, top_k, 0.9, Some(seed));
                (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) = (repetition, presence, frequency);
                p.logit_bias = bias.clone();
            });
            let (mut whole, mut top) = (Sampler::new(p.clone(), prompt), Sampler::new(p, prompt));
            let mass = match top.need() {
                RowNeed::Top(k) => {
                    assert!(k == TOP_K_ON_DEVICE && (temperature == 0.0 || top_k.is_some()));
                    None
                }
                RowNeed::Draw(t) => {
                    assert!(t == temperature && top_k.is_none());
                    Some(mass_at(t))
                }
                need => panic!("penalties need candidates, not {need:?}"),
            };
            for step in 0..6 {
                let want = whole.sample(&row).token;
                let got = ways.choose(&mut top, &candidates, mass, &row);
                assert_eq!(got, want, "T {temperature}, top-k {top_k:?}, rep {repetition}, seed {seed}, step {step}");
            }
            assert_eq!(top.generated, whole.generated);
        }
    }
    assert!(ways.candidates > 300 && ways.rows > 100, "both ways taken: {ways:?}");
    // A watched token left out: the candidates cannot tell where it went.
    let mut s = Sampler::new(params(|p| p.logit_bias = vec![(order[500], 25.0)]), &[]);
    assert_eq!(s.sample_top(&candidates, None, &[]), None);
}

/// The tokens of `row` best first (the smaller first among equal logits), NaN and −∞ left out:
/// the order of a GPU's candidates.
fn best_first(row: &[f32]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..row.len() as u32).filter(|&i| row[i as usize] > f32::NEG_INFINITY).collect();
    order.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
    order
}

/// How many tokens a sampler chose among its candidates, and how many from the row read after.
#[derive(Debug, Default)]
struct Ways {
    candidates: usize,
    rows: usize,
}

impl Ways {
    /// The executor's choice: among `candidates` (with `mass`, and the watched tokens' logits),
    /// or, where they cannot decide, from the whole `row`.
    fn choose(&mut self, s: &mut Sampler, candidates: &[(u32, f32)], mass: Option<f32>, row: &[f32]) -> u32 {
        let watched: Vec<(u32, f32)> = s.watch().iter().map(|&t| (t, row[t as usize])).collect();
        match s.sample_top(candidates, mass, &watched) {
            Some(sampled) => {
                self.candidates += 1;
                sampled.token
            }
            None => {
                self.rows += 1;
                s.sample(row).token
            }
        }
    }
}

/// The draw as a whole sort of the candidates would make it (the sampler ranks only as far as
/// its walk goes): temperature, top-k, min-p, top-p, then the token at `u01` of the mass.
fn sorted_draw(row: &[f32], p: &SamplingParams, u01: f32) -> u32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut cands: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, ((l - max) / p.temperature).exp()))
        .filter(|c| c.1 > 0.0)
        .collect();
    cands.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    cands.truncate(p.top_k.unwrap_or(usize::MAX));
    cands.retain(|c| c.1 >= p.min_p);
    let total: f64 = cands.iter().map(|c| f64::from(c.1)).sum();
    let mut mass = 0.0;
    let keep = cands.iter().position(|c| {
        mass += f64::from(c.1);
        mass >= f64::from(p.top_p) * total
    });
    cands.truncate(keep.map_or(cands.len(), |i| i + 1));
    let mut u = f64::from(u01) * cands.iter().map(|c| f64::from(c.1)).sum::<f64>();
    for &(token, w) in &cands {
        if u < f64::from(w) {
            return token;
        }
        u -= f64::from(w);
    }
    cands.last().map_or(0, |c| c.0)
}

/// Over a row of 40,000 logits (past what is sorted at once), the sampler draws, seed for seed,
/// the token a whole sort would: walks that stop early, and flat distributions (a high
/// temperature) whose walk goes thousands deep, with each truncation.
#[test]
fn ranking_only_as_far_as_the_walk_goes_draws_what_a_sort_would() {
    let row: Vec<f32> = (0..40_000u32)
        .map(|i| ((i.wrapping_mul(2654435761) >> 16) % 1000) as f32 / 100.0 - 5.0 + (i % 997 == 0) as u8 as f32 * 6.0)
        .collect();
    let cases: [fn(&mut SamplingParams); 5] = [
        |p| p.temperature = 1.0,
        |p| (p.temperature, p.top_p) = (0.7, 0.9),
        |p| (p.temperature, p.top_p, p.min_p) = (1.5, 0.95, 0.01),
        |p| (p.temperature, p.top_k) = (1.0, Some(500)),
        |p| (p.temperature, p.top_k, p.top_p) = (3.0, Some(20_000), 0.99),
    ];
    for (case, edit) in cases.into_iter().enumerate() {
        for seed in 0..20 {
            let mut p = params(edit);
            p.seed = Some(seed);
            let u01 = StdRng::seed_from_u64(seed).random::<f32>();
            let want = sorted_draw(&row, &p, u01);
            assert_eq!(Sampler::new(p, &[]).sample(&row).token, want, "case {case}, seed {seed}");
        }
    }
}

/// A whole row's draw ranks the tokens above a floor first and goes below it only where its
/// walk or the nucleus reaches past them: seed for seed, with random numbers that end the walk
/// among the best, past the first floor, and past the second (a tail that holds under 1% of the
/// mass, each of its tokens below 2⁻²⁴ of the best), it draws what a sort of the row would.
#[test]
fn a_whole_rows_draw_past_each_floor_draws_what_a_sort_would() {
    let noise = crate::kernels::test_values(150_000, 5);
    // The best at 17 over 150,000 tokens near 0, and some between.
    let mut peaked: Vec<f32> = noise.iter().map(|v| v * 0.5).collect();
    for (i, l) in [(10, 17.0), (20_000, 16.0), (77_777, 12.5), (149_999, 11.0), (5, 10.0)] {
        peaked[i] = l;
    }
    let flat: Vec<f32> = noise.iter().map(|v| v * 4.0).collect();
    let cases: [fn(&mut SamplingParams); 4] = [
        |p| p.temperature = 1.0,
        |p| (p.temperature, p.top_p) = (1.0, 0.999),
        |p| (p.temperature, p.min_p) = (1.0, 1e-9),
        |p| (p.temperature, p.top_p, p.min_p) = (0.9, 0.95, 0.001),
    ];
    for (r, row) in [&peaked, &flat].into_iter().enumerate() {
        for (case, edit) in cases.iter().enumerate() {
            for u01 in [0.0, 0.3, 0.9, 0.99, 0.995, 0.9999, 1.0 - f32::EPSILON / 2.0] {
                let mut s = Sampler::new(params(edit), &[]);
                s.pending = Some(u01);
                let want = sorted_draw(row, &params(edit), u01);
                assert_eq!(s.sample(row).token, want, "row {r}, case {case}, at {u01}");
            }
        }
    }
}
