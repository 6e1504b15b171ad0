//! Scheduler policy: budgets, fairness, admission, preemption and rejection, driven with fake
//! model outputs (every sampled token is 7; the stop token is 9).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::engine::EngineConfig;
use crate::host::GenerateParams;
use crate::request::FinishReason;
use crate::speculative::SpeculativeConfig;

/// Bytes of a recurrent model's state in these tests.
const STATE: usize = 1 << 20;

fn config(tokens: usize, seqs: usize, kv: usize) -> EngineConfig {
    EngineConfig {
        max_seqs_per_step: seqs,
        max_tokens_per_step: tokens,
        max_prefill_tokens_while_decoding: tokens,
        prefill_step_factor: 0.0,
        kv_capacity: kv,
        prefix_caching: false,
        speculative: SpeculativeConfig { max_draft: 4, ..SpeculativeConfig::default() },
        ..EngineConfig::default()
    }
}

/// A scheduler for a model whose context is 1000 tokens.
fn scheduler(config: EngineConfig) -> Scheduler {
    Scheduler::new(config, 1000)
}

/// Checked parameters: `max_tokens`, and 9 ends a sequence.
fn params(max_tokens: usize) -> Arc<GenerateParams> {
    Arc::new(GenerateParams { max_tokens, stop_token_ids: vec![9], ..GenerateParams::default() })
}

fn seq(id: u64, prompt_len: usize, max_tokens: usize) -> Sequence {
    Sequence::new(id, (1..=prompt_len as u32).collect(), params(max_tokens))
}

/// Applies one sampled token (or none) per plan item.
fn postprocess(s: &mut Scheduler, plan: &StepPlan, sampled: &[Option<u32>]) -> Vec<Finished> {
    let outcomes: Vec<Outcome> =
        sampled.iter().map(|t| Outcome { tokens: t.iter().copied().collect(), ..Outcome::default() }).collect();
    s.postprocess(plan, &outcomes)
}

/// Runs one step with fake outputs; returns the plan and who finished.
fn step(s: &mut Scheduler) -> (StepPlan, Vec<Finished>) {
    let plan = s.schedule().expect("work to do");
    let sampled: Vec<Option<u32>> = plan.items.iter().map(|i| i.sample.then_some(7)).collect();
    let finished = postprocess(s, &plan, &sampled);
    (plan, finished)
}

fn tokens_of(plan: &StepPlan, id: u64) -> usize {
    plan.items.iter().filter(|i| i.id == id).map(|i| i.tokens.len()).sum()
}

#[test]
fn a_prompt_is_prefilled_in_chunks_within_the_token_budget() {
    let mut s = scheduler(config(4, 8, 100));
    s.add(seq(0, 10, 2));
    let chunks: Vec<(usize, i64, bool)> = (0..3)
        .map(|_| {
            let (plan, _) = step(&mut s);
            (plan.items[0].tokens.len(), plan.items[0].start_pos, plan.items[0].sample)
        })
        .collect();
    assert_eq!(chunks, vec![(4, 0, false), (4, 4, false), (2, 8, true)]);
    let (plan, finished) = step(&mut s);
    assert_eq!((plan.items[0].tokens.clone(), plan.items[0].start_pos), (vec![7], 10), "decode the sampled token");
    let summary: Vec<_> = finished.iter().map(|f| (f.id, f.output.clone(), f.reason, f.cached_tokens)).collect();
    assert_eq!(summary, vec![(0, vec![7, 7], FinishReason::Length, 0)]);
}

#[test]
fn while_sequences_decode_prompts_get_only_the_prefill_budget() {
    let mut s = scheduler(EngineConfig { max_prefill_tokens_while_decoding: 5, ..config(64, 8, 1000) });
    s.add(seq(0, 3, 50));
    s.add(seq(1, 30, 5));
    let (plan, _) = step(&mut s);
    assert_eq!((tokens_of(&plan, 0), tokens_of(&plan, 1)), (3, 30), "nothing decodes yet: the whole budget");
    s.add(seq(2, 12, 5));
    s.add(seq(3, 4, 5));
    let mut steps = Vec::new();
    for _ in 0..4 {
        let (plan, _) = step(&mut s);
        assert_eq!((tokens_of(&plan, 0), tokens_of(&plan, 1)), (1, 1), "both decode every step");
        steps.push((tokens_of(&plan, 2), tokens_of(&plan, 3)));
    }
    // 12 + 4 prompt tokens, five per step, in arrival order.
    assert_eq!(steps, vec![(5, 0), (5, 0), (2, 3), (1, 1)]);
}

/// With a time bound, the prefill a decoding step takes follows the learnt step cost: here 10 ms
/// a step plus 1 ms a token, and a bound of twice a decode-only step of the batch the engine
/// settles into (both sequences decoding: 12 ms). With one sequence decoding (11 ms) a step may
/// add (2 × 12 − 11) ms / 1 ms = 13 prompt tokens; with a third request waiting, the bound is
/// 2 × 13 ms and the step adds 15. Before the cost is known, the static budget applies.
#[test]
fn the_prefill_of_a_decoding_step_follows_the_learnt_step_cost() {
    let mut s = scheduler(EngineConfig { prefill_step_factor: 2.0, ..config(64, 8, 1000) });
    s.add(seq(0, 3, 50));
    step(&mut s);
    s.add(seq(1, 40, 5));
    let (plan, _) = step(&mut s);
    assert_eq!((tokens_of(&plan, 0), tokens_of(&plan, 1)), (1, 40), "no cost learnt yet: the static budget");
    let mut s = scheduler(EngineConfig { prefill_step_factor: 2.0, ..config(64, 8, 1000) });
    for tokens in [43, 17, 64] {
        let item = PlanItem {
            id: 99,
            seq: 0,
            start_pos: 0,
            tokens: vec![0; tokens],
            sample: false,
            max_drafts: 0,
            checkpoint: None,
        };
        s.record_step(
            &StepPlan { items: vec![item], ..StepPlan::default() },
            &[],
            Duration::from_millis(10 + tokens as u64),
        );
    }
    s.add(seq(0, 3, 50));
    step(&mut s);
    s.add(seq(1, 40, 5));
    let chunks: Vec<usize> = (0..3).map(|_| tokens_of(&step(&mut s).0, 1)).collect();
    assert_eq!(chunks, vec![13, 13, 13]);
    s.add(seq(2, 40, 5));
    let (plan, _) = step(&mut s);
    assert_eq!((tokens_of(&plan, 1), tokens_of(&plan, 2)), (1, 15), "seq 1 ends its prompt; seq 2 gets 15");
}

#[test]
fn decoding_sequences_are_not_starved_by_a_long_prompt() {
    let mut s = scheduler(config(8, 8, 1000));
    s.add(seq(0, 3, 50));
    step(&mut s); // prefill 0
    s.add(seq(1, 40, 5));
    for _ in 0..5 {
        let (plan, _) = step(&mut s);
        assert_eq!(tokens_of(&plan, 0), 1, "the running sequence decodes every step");
        assert_eq!(tokens_of(&plan, 1), 7, "the long prompt takes the rest of the budget");
    }
}

#[test]
fn a_new_request_joins_while_others_decode() {
    let mut s = scheduler(config(64, 8, 1000));
    s.add(seq(0, 5, 100));
    s.add(seq(1, 5, 100));
    for _ in 0..3 {
        step(&mut s);
    }
    s.add(seq(2, 6, 3));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.items.iter().map(|i| i.id).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(tokens_of(&plan, 2), 6);
}

#[test]
fn the_sequence_budget_caps_each_step_and_the_oldest_go_first() {
    let mut s = scheduler(config(100, 2, 1000));
    for id in 0..3 {
        s.add(seq(id, 2, 4));
    }
    let (plan, _) = step(&mut s);
    assert_eq!(plan.items.iter().map(|i| i.id).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!((s.n_running(), s.n_waiting()), (2, 1));
}

/// A sequence of `priority` (lower first).
fn urgent(id: u64, prompt_len: usize, max_tokens: usize, priority: i32) -> Sequence {
    let params = GenerateParams { max_tokens, stop_token_ids: vec![9], priority, ..GenerateParams::default() };
    Sequence::new(id, (1..=prompt_len as u32).collect(), Arc::new(params))
}

#[test]
fn the_queue_is_ordered_by_priority_then_arrival() {
    let order = |items: &[(i32, bool)]| {
        let mut q = VecDeque::new();
        for (i, &(p, first)) in items.iter().enumerate() {
            enqueue_by_priority(&mut q, (i, p), |x| x.1, first);
        }
        q.into_iter().map(|x| x.0).collect::<Vec<_>>()
    };
    // Equal priorities: push_back, and push_front for those first in line.
    assert_eq!(order(&[(0, false), (0, false), (0, true), (0, false)]), [2, 0, 1, 3]);
    assert_eq!(order(&[(0, false), (5, false), (0, false), (-1, false), (5, true)]), [3, 0, 2, 4, 1]);
    // One at a time (one sequence a step), admitted by priority, then arrival.
    let mut s = scheduler(config(64, 1, 100));
    for (id, priority) in [(0, 0), (1, 5), (2, 0), (3, -1)] {
        s.add(urgent(id, 2, 2, priority));
    }
    let mut admitted = Vec::new();
    while let Some(plan) = s.schedule() {
        for item in &plan.items {
            if !admitted.contains(&item.id) {
                admitted.push(item.id);
            }
        }
        let sampled: Vec<Option<u32>> = plan.items.iter().map(|i| i.sample.then_some(7)).collect();
        postprocess(&mut s, &plan, &sampled);
    }
    assert_eq!(admitted, [3, 0, 2, 1]);
}

#[test]
fn a_more_urgent_request_preempts_the_least_urgent_running_one_to_get_in() {
    for (newcomer, preempts) in [(-1, true), (3, false)] {
        let mut s = scheduler(config(64, 8, 20));
        s.add(urgent(0, 8, 50, 0));
        s.add(urgent(1, 8, 50, 3));
        step(&mut s);
        s.add(urgent(2, 8, 5, newcomer));
        let (plan, _) = step(&mut s);
        let ids: Vec<u64> = plan.items.iter().map(|i| i.id).collect();
        if preempts {
            // Sequence 1, the least urgent, made way; sequence 0 kept its place.
            assert_eq!((ids, s.preemptions, s.n_waiting()), (vec![0, 2], 1, 1));
            assert!(plan.free.len() == 1 && s.kv_used() <= 20);
        } else {
            // As urgent as the least urgent running one: it waits.
            assert_eq!((ids, s.preemptions, s.n_waiting()), (vec![0, 1], 0, 1));
        }
    }
}

#[test]
fn under_a_short_cache_the_least_urgent_is_preempted_before_the_newest() {
    let mut s = scheduler(config(64, 8, 14));
    s.add(urgent(0, 4, 6, 0));
    step(&mut s);
    s.add(urgent(1, 4, 6, -2));
    let mut last = Vec::new();
    while s.preemptions == 0 {
        let (plan, _) = step(&mut s);
        last = plan.items.iter().map(|i| i.id).collect();
    }
    // The newest, but the more urgent: sequence 0 went back to the queue instead.
    assert_eq!((last, s.n_waiting()), (vec![1], 1));
}

#[test]
fn under_a_tiny_cache_the_newest_is_preempted_and_everyone_still_finishes() {
    // Two prompts of 4 tokens generating 6 each need 20 cells; there are 14.
    let mut s = scheduler(config(64, 8, 14));
    s.add(seq(0, 4, 6));
    s.add(seq(1, 4, 6));
    let mut finished = Vec::new();
    let mut freed_on_preempt = false;
    for _ in 0..100 {
        let Some(plan) = s.schedule() else { break };
        assert!(s.kv_used() <= 14, "never more cells than the cache has");
        freed_on_preempt |= s.preemptions > 0 && !plan.free.is_empty();
        let sampled: Vec<Option<u32>> = plan.items.iter().map(|i| i.sample.then_some(7)).collect();
        finished.extend(postprocess(&mut s, &plan, &sampled));
    }
    assert!(s.preemptions > 0 && freed_on_preempt, "the cache was too small: someone was preempted");
    finished.sort_by_key(|f| f.id);
    assert_eq!(
        finished.iter().map(|f| (f.id, f.output.len(), f.reason)).collect::<Vec<_>>(),
        vec![(0, 6, FinishReason::Length), (1, 6, FinishReason::Length)]
    );
    assert_eq!(s.kv_used(), 0);
}

#[test]
fn a_stop_token_ends_the_request_with_stop() {
    let mut s = scheduler(config(64, 8, 100));
    s.add(seq(0, 3, 10));
    let plan = s.schedule().unwrap();
    let finished = postprocess(&mut s, &plan, &[Some(9)]);
    assert_eq!(finished[0].reason, FinishReason::Stop);
    let plan = s.schedule().expect("the finished sequence's cells are freed next step");
    assert_eq!((plan.free.len(), plan.items.len()), (1, 0));
    assert!(s.schedule().is_none());
}

#[test]
fn finishing_a_request_works_from_either_queue_and_frees_its_cells() {
    let mut s = scheduler(config(64, 1, 100));
    s.add(seq(0, 3, 10));
    s.add(seq(1, 3, 10));
    step(&mut s);
    let waiting = s.finish_request(1, FinishReason::Abort).unwrap();
    assert_eq!((waiting.id, waiting.reason, waiting.output.len()), (1, FinishReason::Abort, 0));
    let running = s.finish_request(0, FinishReason::Abort).unwrap();
    assert_eq!(running.output, vec![7]);
    assert_eq!(s.kv_used(), 0);
    assert_eq!(s.schedule().map(|p| p.free.len()), Some(1));
    assert!(s.finish_request(5, FinishReason::Abort).is_none());
}

#[test]
fn finishing_a_request_whose_step_is_in_flight_releases_its_cells() {
    let mut s = scheduler(config(64, 8, 100));
    s.add(seq(0, 5, 10));
    s.add(seq(1, 3, 10));
    let plan = s.schedule().unwrap();
    assert_eq!(s.kv_used(), 8);
    s.finish_request(0, FinishReason::Abort).unwrap();
    assert_eq!(s.kv_used(), 3, "the aborted request's scheduled cells are released");
    let sampled: Vec<Option<u32>> = plan.items.iter().map(|i| i.sample.then_some(7)).collect();
    assert!(postprocess(&mut s, &plan, &sampled).is_empty(), "results for the aborted request are ignored");
    assert_eq!(s.kv_used(), 3);
}

#[test]
fn a_sequence_that_fills_the_whole_cache_ends_with_length_instead_of_preempting_itself() {
    let mut s = scheduler(config(64, 8, 12));
    s.add(seq(0, 4, 100));
    let mut finished = Vec::new();
    for _ in 0..50 {
        let Some(plan) = s.schedule() else { break };
        let sampled: Vec<Option<u32>> = plan.items.iter().map(|i| i.sample.then_some(7)).collect();
        finished.extend(postprocess(&mut s, &plan, &sampled));
    }
    assert_eq!(s.preemptions, 0);
    assert_eq!(
        finished.iter().map(|f| (f.output.len(), f.reason)).collect::<Vec<_>>(),
        vec![(8, FinishReason::Length)]
    );
}

fn caching(tokens: usize, kv: usize) -> Scheduler {
    scheduler(EngineConfig { prefix_caching: true, ..config(tokens, 8, kv) })
}

/// Runs until every queued request finished; returns them.
fn run_all(s: &mut Scheduler) -> Vec<Finished> {
    let mut finished = Vec::new();
    for _ in 0..200 {
        if s.n_running() + s.n_waiting() == 0 {
            break;
        }
        finished.extend(step(s).1);
    }
    finished
}

fn with_prompt(id: u64, prompt: &[u32], max_tokens: usize) -> Sequence {
    Sequence::new(id, prompt.to_vec(), params(max_tokens))
}

#[test]
fn a_shared_prefix_is_copied_and_only_the_rest_computed() {
    let mut s = caching(64, 100);
    s.add(with_prompt(0, &[1, 2, 3, 4, 5, 6], 2));
    run_all(&mut s);
    assert_eq!((s.kv_cached(), s.kv_used()), (7, 7), "prompt + first output token stay cached");
    s.add(with_prompt(1, &[1, 2, 3, 4, 50, 60], 2));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.copies.len(), 1);
    assert_eq!(plan.copies[0].len, 4);
    assert_eq!((plan.items[0].start_pos, plan.items[0].tokens.clone()), (4, vec![50, 60]));
    assert_eq!((s.prefix_queries, s.prefix_hits), (12, 4));
    let out = run_all(&mut s);
    assert_eq!(out[0].cached_tokens, 4, "reported with the request");
}

/// A prompt of 12 tokens whose rows 2..8 are an image seeing itself both ways (Gemma 3's).
fn with_image(id: u64, prompt: &[u32]) -> Sequence {
    use llaisys_model::Image;
    use llaisys_model::vision::PromptImages;
    let image = Image { grid: [1, 4, 6], merge: 2, patches: Vec::new(), hash: 0 };
    let images = PromptImages {
        images: vec![Arc::new(image)],
        rows: vec![2],
        rope: Vec::new(),
        delta: 0,
        image_token: 9,
        bidirectional: true,
    };
    let params = GenerateParams { max_tokens: 1, images: Some(Arc::new(images)), ..GenerateParams::default() };
    Sequence::new(id, prompt.to_vec(), Arc::new(params))
}

#[test]
fn an_image_that_sees_itself_both_ways_is_computed_in_one_chunk_and_never_reused_in_part() {
    let mut s = caching(4, 100);
    let prompt: Vec<u32> = (1..=12).collect();
    s.add(with_image(0, &prompt));
    let mut chunks = Vec::new();
    for _ in 0..3 {
        let (plan, _) = step(&mut s);
        chunks.push((plan.items[0].start_pos, plan.items[0].tokens.len()));
    }
    // Before the image (not into it), the image whole past the budget of 4, the rest.
    assert_eq!(chunks, [(0, 2), (2, 6), (8, 4)]);
    run_all(&mut s);
    // A prompt that leaves the first one's within the image reuses only the rows before it.
    let mut other = prompt.clone();
    other[5] = 99;
    s.add(with_image(1, &other));
    let (plan, _) = step(&mut s);
    assert_eq!((plan.copies[0].len, plan.items[0].start_pos, plan.items[0].tokens.len()), (2, 2, 6));
}

#[test]
fn an_identical_prompt_still_computes_its_last_token() {
    let mut s = caching(64, 100);
    s.add(with_prompt(0, &[1, 2, 3, 4], 1));
    run_all(&mut s);
    s.add(with_prompt(1, &[1, 2, 3, 4], 1));
    let (plan, _) = step(&mut s);
    assert_eq!((plan.copies[0].len, plan.items[0].tokens.clone(), plan.items[0].sample), (3, vec![4], true));
}

#[test]
fn cached_prefixes_are_evicted_least_recently_used_before_anyone_is_preempted() {
    let mut s = caching(64, 20);
    for (id, first) in [(0, 10), (1, 20)] {
        s.add(with_prompt(id, &[first, first + 1, first + 2, first + 3, first + 4], 1));
        run_all(&mut s);
    }
    assert_eq!(s.kv_cached(), 10);
    // Touch prefix 0 so prefix 1 becomes the least recently used.
    s.add(with_prompt(2, &[10, 11, 12, 99], 1));
    run_all(&mut s);
    assert_eq!(s.kv_cached(), 14, "prefixes of 5, 5 and 4 tokens");
    // 7 new cells are needed and 6 are free: exactly one prefix goes, the least recently used
    // (request 1's: request 2 reused request 0's).
    s.add(with_prompt(3, &(30..37).collect::<Vec<u32>>(), 2));
    let (plan, _) = step(&mut s);
    assert!(plan.copies.is_empty());
    assert_eq!((plan.free.len(), s.kv_cached(), s.preemptions), (1, 9, 0), "{plan:?}");
    run_all(&mut s);
    // Request 0's prefix survived: a prompt starting with it still hits.
    s.add(with_prompt(4, &[10, 11, 12, 13, 77], 1));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.copies.first().map(|c| c.len), Some(4));
    // Request 1's did not.
    s.add(with_prompt(5, &[20, 21, 22, 23, 77], 1));
    let (plan, _) = step(&mut s);
    assert!(plan.copies.is_empty());
}

#[test]
fn a_restarted_request_starts_over_from_its_cached_prompt_with_its_new_parameters() {
    let mut s = caching(64, 100);
    s.add(with_prompt(0, &[1, 2, 3, 4], 10));
    s.add(with_prompt(1, &[8, 8, 8], 10));
    for _ in 0..3 {
        step(&mut s);
    }
    assert_eq!(s.tokens_of(0).map(|(_, out)| out.len()), Some(3));
    s.restart(0, vec![1, 2, 3, 4], None, params(5), false);
    assert_eq!(s.tokens_of(0), Some((&[1, 2, 3, 4][..], &[][..])), "its output is gone");
    assert_eq!(s.n_running() + s.n_waiting(), 2, "not twice");
    let (plan, _) = step(&mut s);
    let item = plan.items.iter().find(|i| i.id == 0).expect("back in the next step");
    assert_eq!((item.start_pos, item.tokens.clone(), item.sample), (3, vec![4], true), "the prompt's cells were kept");
    assert_eq!(plan.copies.first().map(|c| c.len), Some(3));
    let out = run_all(&mut s);
    let restarted = out.iter().find(|f| f.id == 0).unwrap();
    assert_eq!((restarted.output.len(), restarted.reason), (5, FinishReason::Length), "the new max_tokens");
    assert_eq!(out.iter().find(|f| f.id == 1).map(|f| f.output.len()), Some(10), "the other is untouched");
    // A request that had just finished is queued again the same way.
    s.restart(0, vec![1, 2, 3, 4], None, params(2), false);
    let (plan, _) = step(&mut s);
    assert_eq!((plan.items[0].id, plan.items[0].tokens.clone()), (0, vec![4]));
    assert_eq!(run_all(&mut s).iter().map(|f| (f.id, f.output.len())).collect::<Vec<_>>(), vec![(0, 2)]);
}

#[test]
fn an_aborted_request_keeps_its_computed_cells_but_not_a_step_in_flight() {
    let mut s = caching(64, 100);
    s.add(with_prompt(0, &[1, 2, 3], 10));
    step(&mut s);
    s.finish_request(0, FinishReason::Abort).unwrap();
    assert_eq!((s.kv_cached(), s.kv_used()), (3, 3));
    s.add(with_prompt(1, &[5, 6, 7], 10));
    s.schedule().unwrap(); // in flight, never postprocessed
    s.finish_request(1, FinishReason::Abort).unwrap();
    assert_eq!((s.kv_cached(), s.kv_used()), (3, 3));
}

#[test]
fn a_cached_prefix_that_a_newer_one_extends_is_dropped() {
    let mut s = caching(64, 100);
    s.add(with_prompt(0, &[1, 2, 3], 1));
    run_all(&mut s);
    s.add(with_prompt(1, &[1, 2, 3, 4, 5], 1));
    run_all(&mut s);
    assert_eq!((s.kv_cached(), s.kv_used()), (5, 5), "only the longer prefix is kept");
}

fn in_session(id: u64, prompt: &[u32], session: &str) -> Sequence {
    with_prompt(id, prompt, 2).in_session(Some(session.into()))
}

#[test]
fn a_session_pins_its_cells_without_prefix_caching_and_its_next_turn_computes_only_new_tokens() {
    let mut s = scheduler(config(64, 8, 100)); // prefix caching off
    s.add(in_session(0, &[1, 2, 3, 4], "a"));
    let out = run_all(&mut s);
    assert_eq!(out[0].output, vec![7, 7]);
    // Prompt and the first output token are computed; the last sampled token is not.
    assert_eq!(s.session_cached("a"), 5);
    // The next turn: the conversation so far plus new tokens.
    s.add(in_session(1, &[1, 2, 3, 4, 7, 7, 20, 21], "a"));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.copies[0].len, 5);
    assert_eq!(plan.items[0].tokens, vec![7, 20, 21]);
    run_all(&mut s);
    assert_eq!(s.session_cached("a"), 9, "the pin moved to the longer conversation");
    assert_eq!(s.kv_cached(), 9, "the older pin it extends was dropped");
    // Another request without the session does not reuse it (prefix caching is off).
    s.add(with_prompt(2, &[1, 2, 3, 4, 7], 1));
    assert!(step(&mut s).0.copies.is_empty());
    run_all(&mut s);
    assert!(s.release_session("a"));
    assert!(!s.release_session("a"));
    assert_eq!((s.kv_cached(), s.kv_used()), (0, 0));
    let freed = s.schedule().map(|p| p.free.len());
    assert_eq!(freed, Some(2), "request 2's cells and the session's are dropped by the next step");
}

#[test]
fn pinned_prefixes_are_evicted_only_after_unpinned_ones() {
    let mut s = caching(64, 16);
    s.add(in_session(0, &[1, 2, 3, 4, 5], "a"));
    run_all(&mut s);
    s.add(with_prompt(1, &[20, 21, 22, 23, 24], 1));
    run_all(&mut s);
    assert_eq!(s.kv_cached(), 11);
    // 6 cells are needed, 5 free: the unpinned prefix goes although it is the newer one.
    s.add(with_prompt(2, &[30, 31, 32, 33, 34], 1));
    run_all(&mut s);
    assert_eq!(s.session_cached("a"), 6);
    // Needing more than unpinned prefixes hold, the pin goes too rather than starving anyone.
    s.add(with_prompt(3, &(40..54).collect::<Vec<u32>>(), 1));
    let out = run_all(&mut s);
    assert_eq!(out.len(), 1);
    assert_eq!((s.session_cached("a"), s.preemptions), (0, 0));
}

#[test]
fn after_a_kv_reset_running_sequences_are_recomputed_and_finish() {
    let mut s = caching(64, 100);
    s.add(with_prompt(0, &[1, 2, 3], 1));
    run_all(&mut s);
    s.add(seq(1, 4, 3));
    s.add(seq(2, 5, 3));
    step(&mut s);
    s.reset_kv();
    assert_eq!((s.kv_used(), s.kv_cached(), s.n_running(), s.n_waiting()), (0, 0, 0, 2));
    assert_eq!(s.tokens_of(1), Some((&[1, 2, 3, 4][..], &[7][..])), "what it generated is kept");
    let (plan, _) = step(&mut s);
    assert!(plan.free.is_empty() && plan.copies.is_empty(), "nothing refers to the lost cache");
    assert_eq!(plan.items.iter().map(|i| (i.id, i.start_pos)).collect::<Vec<_>>(), vec![(1, 0), (2, 0)]);
    let out = run_all(&mut s);
    assert_eq!(out.iter().map(|f| f.output.len()).collect::<Vec<_>>(), vec![3, 3]);
}

/// Runs the prefill of a lone speculating sequence; returns the scheduler ready to decode.
fn speculating(kv: usize, prompt: usize, max_tokens: usize) -> Scheduler {
    speculating_with(config(64, 4, kv), prompt, max_tokens)
}

fn speculating_with(config: EngineConfig, prompt: usize, max_tokens: usize) -> Scheduler {
    let mut s = scheduler(config);
    s.add(seq(1, prompt, max_tokens).speculating(true));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.items[0].max_drafts, 0, "a prefill chunk proposes nothing");
    s
}

#[test]
fn proposals_reserve_cells_and_rejected_ones_are_given_back() {
    let mut s = speculating(100, 10, 50);
    assert_eq!(s.kv_used(), 10);
    let plan = s.schedule().unwrap();
    assert_eq!(plan.items[0].max_drafts, 4, "no step cost learnt yet: the most allowed");
    assert_eq!(s.kv_used(), 10 + 1 + 4, "the decode token and its proposals are reserved");
    // Three proposed, two accepted: three tokens sampled; the input and two proposals stay.
    let outcome = Outcome { tokens: vec![7, 7, 8], end: None, proposed: 3, accepted: 2 };
    assert!(s.postprocess(&plan, &[outcome]).is_empty());
    assert_eq!(s.kv_used(), 10 + 3);
    assert_eq!(s.tokens_of(1).unwrap().1, &[7, 7, 7, 8]);
    assert_eq!((s.proposed, s.accepted), (3, 2));
    let plan = s.schedule().unwrap();
    assert_eq!((plan.items[0].start_pos, plan.items[0].tokens.clone()), (13, vec![8]), "computed = 13");
}

/// Prompts waiting to be prefilled turn proposals off (each proposed token adds to the steps
/// they wait through); they come back once the prompts are in.
#[test]
fn waiting_prompts_turn_proposals_off_until_they_are_prefilled() {
    let mut s = speculating(400, 10, 50);
    s.add(seq(2, 150, 5));
    let drafts = |plan: &StepPlan| plan.items.iter().find(|i| i.id == 1).expect("decoding").max_drafts;
    // 150 prompt tokens, at most 63 a step beside the decode token: three steps of prefill.
    for _ in 0..3 {
        let (plan, _) = step(&mut s);
        assert!(tokens_of(&plan, 2) > 1);
        assert_eq!(drafts(&plan), 0, "a prompt is still being prefilled");
    }
    let (plan, _) = step(&mut s);
    assert_eq!((tokens_of(&plan, 2), drafts(&plan)), (1, 4), "the prompt is in: proposals again");
}

/// Records a step of `rows` (prompt chunks, or decoding rows of one token) that took `ms`.
fn record(s: &mut Scheduler, rows: &[usize], ms: f64) {
    let items = rows
        .iter()
        .map(|&n| PlanItem {
            id: 99,
            seq: 0,
            start_pos: 0,
            tokens: vec![0; n],
            sample: n == 1,
            max_drafts: 0,
            checkpoint: None,
        })
        .collect();
    s.record_step(&StepPlan { items, ..StepPlan::default() }, &[], Duration::from_secs_f64(ms / 1e3));
}

/// Steps of prompt chunks at 10 ms a step plus 2 ms a token.
fn prompt_steps(s: &mut Scheduler) {
    for tokens in [300, 40, 500, 120] {
        record(s, &[tokens], 10.0 + 2.0 * tokens as f64);
    }
}

/// Proposals are priced by what one more token costs a step that only decodes, not by the
/// cheaper prompt tokens of the batched products: a device where prompt tokens cost 2 ms and
/// decoding rows 8 ms (beside 10 ms a step) gets one proposal at the prior rate, not three.
#[test]
fn proposals_are_priced_by_the_decoding_steps() {
    let mut s = speculating(100, 10, 50);
    prompt_steps(&mut s);
    assert_eq!(s.schedule().unwrap().items[0].max_drafts, 3, "only prompt steps: a token's share of a step is 2/12");
    let mut s = speculating(100, 10, 50);
    prompt_steps(&mut s);
    for rows in [1, 3, 2, 5, 1] {
        record(&mut s, &vec![1; rows], 10.0 + 8.0 * rows as f64);
    }
    assert_eq!(s.schedule().unwrap().items[0].max_drafts, 1, "a decoding token's share is 8/18");
}

/// Decoding steps whose jitter hides what a token costs (a small model, whose steps are short
/// beside the machine's noise) do not price proposals: the fit over all steps does, as before
/// any decoding step was seen.
#[test]
fn decoding_steps_lost_in_jitter_do_not_price_proposals() {
    let mut s = speculating(100, 10, 50);
    prompt_steps(&mut s);
    for (rows, jitter) in [(1, 6.0), (3, -7.0), (2, 5.0), (5, -8.0), (1, -4.0), (4, 7.0), (2, -6.0)] {
        record(&mut s, &vec![1; rows], 10.0 + 2.0 * rows as f64 + jitter);
    }
    assert_eq!(s.schedule().unwrap().items[0].max_drafts, 3);
}

/// With `adaptive` off every speculating sequence proposes `max_draft` tokens, even where the
/// learnt cost says a proposed token does not pay.
#[test]
fn fixed_proposal_lengths_ignore_the_learnt_cost() {
    let compute_bound = |adaptive: bool| {
        let spec = SpeculativeConfig { max_draft: 4, adaptive, ..SpeculativeConfig::default() };
        let mut s = speculating_with(EngineConfig { speculative: spec, ..config(64, 4, 100) }, 10, 50);
        for rows in [1, 3, 2, 5, 1, 4] {
            record(&mut s, &vec![1; rows], 0.1 + 20.0 * rows as f64);
        }
        s.schedule().unwrap().items[0].max_drafts
    };
    assert_eq!(compute_bound(true), 0, "each token costs a whole step's worth: none pays");
    assert_eq!(compute_bound(false), 4);
}

#[test]
fn proposals_stop_short_of_max_tokens_the_budget_and_the_cache() {
    // Two tokens left to generate after the first: at most one proposal.
    let mut s = speculating(100, 10, 3);
    assert_eq!(s.schedule().unwrap().items[0].max_drafts, 1);
    // A cache of 13 cells holds 13 tokens of the sequence: after this step's token, one more.
    let mut s = speculating(13, 10, 50);
    let plan = s.schedule().unwrap();
    assert_eq!(plan.items[0].max_drafts, 1);
    assert_eq!(s.kv_used(), 12);
    // Another sequence holding cells: proposals take only the free ones, never preempting.
    let mut s = scheduler(config(64, 4, 20));
    s.add(seq(1, 10, 50).speculating(true));
    s.add(seq(2, 7, 50));
    step(&mut s);
    let plan = s.schedule().unwrap();
    assert_eq!(plan.items.iter().map(|i| i.max_drafts).collect::<Vec<_>>(), vec![1, 0]);
    assert_eq!((s.kv_used(), s.preemptions), (20, 0));
    // A token budget of 3: the decode token and two proposals.
    let mut s = scheduler(config(3, 4, 100));
    s.add(seq(1, 2, 50).speculating(true));
    step(&mut s);
    assert_eq!(s.schedule().unwrap().items[0].max_drafts, 2);
    // Accepting everything finishes at max_tokens without overshooting.
    let mut s = speculating(100, 10, 3);
    let plan = s.schedule().unwrap();
    let outcome = Outcome { tokens: vec![7, 7], end: None, proposed: 1, accepted: 1 };
    let finished = s.postprocess(&plan, &[outcome]);
    assert_eq!(finished[0].output, vec![7, 7, 7]);
    assert_eq!(finished[0].reason, FinishReason::Length);
    assert_eq!(s.kv_used(), 0);
}

#[test]
fn sequences_that_do_not_speculate_get_no_proposals() {
    let mut s = scheduler(config(64, 4, 100));
    s.add(seq(1, 4, 10));
    step(&mut s);
    assert_eq!(s.schedule().unwrap().items[0].max_drafts, 0);
    let mut s = scheduler(EngineConfig {
        speculative: SpeculativeConfig { max_draft: 0, ..SpeculativeConfig::default() },
        ..config(64, 4, 100)
    });
    s.add(seq(1, 4, 10).speculating(true));
    step(&mut s);
    assert_eq!(s.schedule().unwrap().items[0].max_drafts, 0, "speculation is off for the engine");
}

/// A model with linear attention (`with_states`) reuses a cached sequence whole or up to a
/// checkpoint, kept a token short of each prompt's end (and taken by a copy up to where it
/// ends): a prompt sharing less than that computes everything, one extending all of a sequence
/// copies it, one sharing a prompt copies up to a token short of that prompt's end, as does the
/// same prompt again; and its sequences never propose tokens.
#[test]
fn a_recurrent_model_reuses_whole_sequences_or_up_to_checkpoints_and_never_speculates() {
    let mut s = scheduler(EngineConfig { prefix_caching: true, ..config(64, 8, 100) }).with_states(STATE);
    s.add(with_prompt(0, &[1, 2, 3, 4, 5, 6], 2));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.items[0].checkpoint, Some(5), "kept a token short of the prompt's end");
    let (plan, _) = step(&mut s);
    assert_eq!(plan.items[0].checkpoint, None, "decoding keeps none");
    // The first request's computed tokens: its prompt and the first output token (7).
    s.add(with_prompt(1, &[1, 2, 3, 4, 50, 60], 2));
    let (plan, _) = step(&mut s);
    assert!(plan.copies.is_empty(), "a part of a state short of a checkpoint is not reused: {plan:?}");
    assert_eq!((plan.items[0].start_pos, plan.items[0].tokens.len()), (0, 6));
    run_all(&mut s);
    s.add(with_prompt(2, &[1, 2, 3, 4, 5, 6, 7, 8], 2));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.copies.first().map(|c| c.len), Some(7), "the whole sequence continues: {plan:?}");
    assert_eq!((plan.items[0].start_pos, plan.items[0].tokens.clone()), (7, vec![8]));
    assert_eq!(plan.items[0].checkpoint, None, "the copy holds 7 already");
    run_all(&mut s);
    // Request 2's sequence replaced request 0's (it extends it) and kept its checkpoint at 5.
    s.add(with_prompt(3, &[1, 2, 3, 4, 5, 6, 99, 100], 2));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.copies.first().map(|c| c.len), Some(5), "up to the first prompt's checkpoint: {plan:?}");
    assert_eq!((plan.items[0].start_pos, plan.items[0].tokens.clone()), (5, vec![6, 99, 100]));
    assert_eq!(plan.items[0].checkpoint, Some(7), "asked for part way through the item");
    run_all(&mut s);
    s.add(with_prompt(4, &[1, 2, 3, 4, 5, 6, 99, 100], 2));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.copies.first().map(|c| c.len), Some(7), "the same prompt again: {plan:?}");
    assert_eq!(s.prefix_hits, 7 + 5 + 7);

    let mut s = scheduler(config(64, 4, 100)).with_states(STATE);
    s.add(seq(1, 10, 50).speculating(true));
    step(&mut s);
    let plan = s.schedule().unwrap();
    assert_eq!(plan.items[0].max_drafts, 0, "nothing speculates");
}

/// A model with linear attention keeps finished sequences while their states and checkpoints fit
/// `cached_state_mb`, the least recently used going first; a model without keeps them all.
#[test]
fn a_recurrent_model_caches_at_most_its_states_bound() {
    for recurrent in [true, false] {
        // Each sequence here holds a state and its prompt's checkpoint: 2 MiB; room for two.
        let config = EngineConfig { prefix_caching: true, cached_state_mb: 5, ..config(64, 8, 100) };
        let mut s = scheduler(config).with_states(if recurrent { STATE } else { 0 });
        for id in 0..3 {
            s.add(with_prompt(id, &[10 * id as u32 + 1, 2, 3], 1));
            run_all(&mut s);
        }
        let want = if recurrent { 2 } else { 3 };
        assert_eq!(s.kv_cached(), want * 3, "recurrent {recurrent}");
        // The oldest went: its prompt again is computed whole.
        s.add(with_prompt(9, &[1, 2, 3, 4], 1));
        let (plan, _) = step(&mut s);
        assert_eq!(plan.copies.is_empty(), recurrent, "recurrent {recurrent}: {plan:?}");
    }
}

/// Along a long prompt a recurrent model keeps a checkpoint at the end of a chunk every
/// `CHECKPOINT_EVERY` tokens: another prompt sharing its start (a system prompt) reuses it.
#[test]
fn a_long_prompt_keeps_checkpoints_along_it_for_prompts_sharing_its_start() {
    let config = EngineConfig { prefix_caching: true, ..config(512, 8, 4000) };
    let mut s = Scheduler::new(config, 4096).with_states(STATE);
    let system: Vec<u32> = (1..=1200).collect();
    s.add(with_prompt(0, &system, 1));
    let checkpoints: Vec<Option<usize>> = (0..3).map(|_| step(&mut s).0.items[0].checkpoint).collect();
    assert_eq!(checkpoints, [Some(512), Some(1024), Some(1199)]);
    run_all(&mut s);
    let mut other = system[..700].to_vec();
    other.extend([5000, 5001]);
    s.add(with_prompt(1, &other, 1));
    let (plan, _) = step(&mut s);
    assert_eq!(plan.copies.first().map(|c| c.len), Some(512), "{plan:?}");
    assert_eq!((plan.items[0].start_pos, plan.items[0].tokens.len()), (512, 190));
}
