//! KV-cache behaviour with a real model, in the style of llama.cpp's semantics: sequence
//! operations change what later forward passes compute exactly as their contracts say, and a
//! failed forward pass changes nothing.

use burn::tensor::DType;
use llaisys_model::TensorData;
use llaisys_model::checkpoint::Checkpoint;
use llaisys_model::generate::{greedy, one_sequence};
use llaisys_model::sampling::TOP_K_ON_DEVICE;
use llaisys_model::tensors::TensorSource;
use llaisys_model::{
    Batch, Context, DecodeError, Device, DeviceSpec, KvDtype, LoadOptions, ModelSource, RowAsk, RowNeed, argmax,
    load_model,
};
use llaisys_tests::{Reference, fixture_dir, max_abs_diff, test_device, topk_error};

const FIXTURE: &str = "tiny-tied-f32";
const TOL: f32 = 1e-3;

/// The device under test (`LLAISYS_TEST_DEVICE`; the CPU by default).
fn device() -> Device {
    test_device().parse::<DeviceSpec>().unwrap().device().unwrap()
}

fn context(name: &str, capacity: usize) -> Context {
    let model =
        load_model(None, Some(&ModelSource::Dir(fixture_dir(name))), &LoadOptions::default(), &device()).unwrap();
    Context::with_kv_dtype(model, capacity, KvDtype::F32)
}

/// Continues `seq` greedily from `first` (already generated after position `pos - 1`).
fn continue_greedy(ctx: &mut Context, seq: u32, first: u32, pos: i64, n: usize) -> Vec<u32> {
    let mut tokens = vec![first];
    while tokens.len() < n {
        let p = pos + tokens.len() as i64 - 1;
        ctx.decode(&one_sequence(&[*tokens.last().unwrap()], seq, p)).unwrap();
        tokens.push(argmax(ctx.outputs().row(0).unwrap()).unwrap());
    }
    tokens
}

fn last_argmax(ctx: &Context) -> u32 {
    argmax(ctx.outputs().row(ctx.outputs().n_outputs() - 1).unwrap()).unwrap()
}

#[test]
fn seq_cp_shares_cells_and_both_sequences_decode_correctly() {
    let p = &Reference::load(FIXTURE).prompts[0];
    let n = p.ids.len();
    let mut ctx = context(FIXTURE, 128);
    ctx.decode(&one_sequence(&p.ids, 0, 0)).unwrap();
    let first = last_argmax(&ctx);
    ctx.kv_mut().seq_cp(0, 1, ..).unwrap();
    assert_eq!(ctx.kv().used(), n, "a copy shares cells");
    let a = continue_greedy(&mut ctx, 0, first, n as i64, 10);
    let b = continue_greedy(&mut ctx, 1, first, n as i64, 10);
    assert_eq!(a, p.greedy[..10]);
    assert_eq!(b, p.greedy[..10]);
    assert_eq!(ctx.kv().used(), n + 2 * 9, "only the continuations take new cells");
}

#[test]
fn seq_rm_frees_cells_for_reuse() {
    let prompts = Reference::load(FIXTURE).prompts;
    let (a, b) = (&prompts[0], &prompts[1]);
    let mut ctx = context(FIXTURE, b.ids.len());
    ctx.decode(&one_sequence(&a.ids, 0, 0)).unwrap();
    assert!(matches!(ctx.decode(&one_sequence(&b.ids, 1, 0)), Err(DecodeError::NoKvSlot { .. })));
    ctx.kv_mut().seq_rm(0, ..).unwrap();
    assert_eq!((ctx.kv().used(), ctx.kv().seq_pos_max(0)), (0, None));
    ctx.decode(&one_sequence(&b.ids, 1, 0)).unwrap();
    assert!(topk_error(ctx.outputs().row(0).unwrap(), &b.topk[b.ids.len() - 1]) < TOL);
}

#[test]
fn seq_rm_of_a_tail_lets_the_sequence_be_recomputed() {
    let p = &Reference::load(FIXTURE).prompts[1];
    let n = p.ids.len();
    let mut ctx = context(FIXTURE, 128);
    ctx.decode(&one_sequence(&p.ids, 0, 0)).unwrap();
    ctx.kv_mut().seq_rm(0, (n as i64 - 3)..).unwrap();
    assert_eq!(ctx.kv().seq_pos_max(0), Some(n as i64 - 4));
    ctx.decode(&one_sequence(&p.ids[n - 3..], 0, n as i64 - 3)).unwrap();
    assert!(max_abs_diff(ctx.outputs().row(0).unwrap(), &p.last_logits) < TOL);
}

/// Also for Gemma 3, whose local layers rotate by a base of their own and see a window of
/// positions (its second prompt is longer than the window), for SmolLM3, whose every fourth
/// layer does not rotate (its keys stay as they are), and for latent attention (GLM-4.7-Flash's,
/// DeepSeek V2's under YaRN), whose cached rows turn their rotated part only.
#[test]
fn seq_add_shifts_positions_and_attention_follows() {
    let fixtures = [
        (FIXTURE, 0),
        ("tiny-gemma3-f32", 1),
        ("tiny-smollm3-f32", 1),
        ("tiny-glm4moelite-f32", 0),
        ("tiny-deepseekv2-f32", 0),
    ];
    for (name, prompt) in fixtures {
        let p = &Reference::load(name).prompts[prompt];
        let n = p.ids.len() as i64;
        let shift = 17;
        // The prompt at positions 0..n, then shifted by +17 (keys re-rotated) …
        let mut shifted = context(name, 128);
        shifted.decode(&one_sequence(&p.ids, 0, 0)).unwrap();
        shifted.kv_mut().seq_add(0, .., shift).unwrap();
        assert_eq!(shifted.kv().seq_pos_max(0), Some(n - 1 + shift));
        // … equals the prompt computed at positions 17..n+17 from the start.
        let mut fresh = context(name, 128);
        fresh.decode(&one_sequence(&p.ids, 0, shift)).unwrap();
        let next = last_argmax(&fresh);
        for ctx in [&mut shifted, &mut fresh] {
            ctx.decode(&one_sequence(&[next], 0, n + shift)).unwrap();
        }
        let err = max_abs_diff(shifted.outputs().row(0).unwrap(), fresh.outputs().row(0).unwrap());
        assert!(err < TOL, "{name}: decode after a shift differs by {err}");
        // Without re-rotation the keys would be wrong: an unshifted cache gives other logits.
        let mut unshifted = context(name, 128);
        unshifted.decode(&one_sequence(&p.ids, 0, 0)).unwrap();
        unshifted.decode(&one_sequence(&[next], 0, n + shift)).unwrap();
        let unmoved = max_abs_diff(unshifted.outputs().row(0).unwrap(), fresh.outputs().row(0).unwrap());
        assert!(unmoved > 10.0 * TOL, "{name}: {unmoved}");
    }
}

#[test]
fn seq_keep_drops_other_sequences_and_the_kept_one_still_decodes() {
    let prompts = Reference::load(FIXTURE).prompts;
    let (a, b) = (&prompts[0], &prompts[1]);
    let mut ctx = context(FIXTURE, 128);
    ctx.decode(&one_sequence(&b.ids, 1, 0)).unwrap();
    ctx.decode(&one_sequence(&a.ids, 0, 0)).unwrap();
    let first = last_argmax(&ctx);
    ctx.kv_mut().seq_keep(0).unwrap();
    assert_eq!((ctx.kv().used(), ctx.kv().seq_pos_max(1)), (a.ids.len(), None));
    assert_eq!(continue_greedy(&mut ctx, 0, first, a.ids.len() as i64, 8), a.greedy[..8]);
}

#[test]
fn a_full_cache_fails_with_no_kv_slot_and_changes_nothing() {
    let prompts = Reference::load(FIXTURE).prompts;
    let (a, b) = (&prompts[0], &prompts[1]);
    let n = a.ids.len();
    let mut ctx = context(FIXTURE, n + 6);
    ctx.decode(&one_sequence(&a.ids, 0, 0)).unwrap();
    let first = last_argmax(&ctx);
    let before = ctx.kv().dump();
    let err = ctx.decode(&one_sequence(&b.ids[..7], 1, 0)).unwrap_err();
    assert_eq!(err, DecodeError::NoKvSlot { needed: 7, free: 6 });
    assert_eq!(ctx.kv().dump(), before, "cells unchanged");
    assert_eq!(ctx.outputs().n_outputs(), 0, "a failed pass leaves no stale outputs");
    // Tensors unchanged too: the sequence continues exactly as the reference.
    assert_eq!(continue_greedy(&mut ctx, 0, first, n as i64, 7), a.greedy[..7]);
    assert_eq!(ctx.kv().used(), n + 6);
}

#[test]
fn a_token_never_sees_another_sequence() {
    let prompts = Reference::load(FIXTURE).prompts;
    let (a, b) = (&prompts[0], &prompts[1]);
    let mut ctx = context(FIXTURE, 128);
    // B fills cells first, at the same positions A will use.
    ctx.decode(&one_sequence(&b.ids, 7, 0)).unwrap();
    let mut batch = Batch::new();
    for (i, &t) in a.ids.iter().enumerate() {
        batch.push(t, i as i64, &[3], true);
    }
    ctx.decode(&batch).unwrap();
    for i in 0..a.ids.len() {
        assert!(topk_error(ctx.outputs().logits_ith(i).unwrap(), &a.topk[i]) < TOL, "position {i}");
    }
}

#[test]
fn positions_track_pos_max_per_sequence() {
    let p = &Reference::load(FIXTURE).prompts[0];
    let mut ctx = context(FIXTURE, 128);
    assert_eq!(ctx.kv().seq_pos_max(2), None);
    ctx.decode(&Batch { seq_ids: Some(vec![vec![2]; p.ids.len()]), ..Batch::one(p.ids.clone()) }).unwrap();
    assert_eq!(ctx.kv().seq_pos_max(2), Some(p.ids.len() as i64 - 1));
    assert_eq!(ctx.kv().seq_pos_min(2), Some(0));
}

#[test]
fn an_aborted_pass_changes_nothing() {
    let p = &Reference::load(FIXTURE).prompts[0];
    let mut ctx = context(FIXTURE, 128);
    ctx.decode(&one_sequence(&p.ids[..4], 0, 0)).unwrap();
    let before = ctx.kv().dump();
    let err = ctx.decode_with_abort(&one_sequence(&p.ids[4..], 0, 4), &|| true).unwrap_err();
    assert_eq!(err, DecodeError::Aborted);
    assert_eq!(ctx.kv().dump(), before);
    ctx.decode(&one_sequence(&p.ids[4..], 0, 4)).unwrap();
    assert!(max_abs_diff(ctx.outputs().row(0).unwrap(), &p.last_logits) < TOL);
}

#[test]
fn an_internal_error_releases_the_placed_cells() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"model_type":"mock","vocab_size":64,"fail_on_token":13}"#)
        .unwrap();
    let model =
        load_model(None, Some(&ModelSource::Dir(dir.path().into())), &LoadOptions::default(), &device()).unwrap();
    let mut ctx = Context::with_kv_dtype(model, 16, KvDtype::F32);
    ctx.decode(&one_sequence(&[1, 2, 3], 0, 0)).unwrap();
    let err = ctx.decode(&one_sequence(&[4, 13], 0, 3)).unwrap_err();
    assert!(matches!(err, DecodeError::Internal(ref m) if m.contains("injected fault")), "{err:?}");
    assert_eq!(ctx.kv().used(), 3);
}

#[test]
fn the_mock_model_reads_its_context_from_the_cache() {
    let model = load_model(Some("mock"), None, &LoadOptions::default(), &device()).unwrap();
    let mut ctx = Context::with_kv_dtype(model, 64, KvDtype::F32);
    let first = greedy(&mut ctx, 0, &[5, 6, 7], 6, &[]).unwrap().tokens;
    assert_eq!(greedy(&mut ctx, 1, &[5, 6, 7], 6, &[]).unwrap().tokens, first, "deterministic");
    assert_ne!(greedy(&mut ctx, 2, &[5, 6, 8], 6, &[]).unwrap().tokens, first, "context-dependent");
}

#[test]
fn a_weight_slot_can_be_replaced_and_is_checked() {
    let p = &Reference::load(FIXTURE).prompts[0];
    let mut ctx = context(FIXTURE, 64);
    let name = "model.layers.1.mlp.down_proj.weight";
    let err = ctx.model_mut().replace_weight(name, TensorData::new(vec![0f32; 6], [2, 3])).unwrap_err();
    assert!(err.to_string().contains("mlp_down_w of layer 1"), "{err}");
    let err = ctx
        .model_mut()
        .replace_weight("model.layers.9.mlp.up_proj.weight", TensorData::new(vec![0f32; 1], [1]))
        .unwrap_err();
    assert!(err.to_string().contains("no weight slot"), "{err}");
    ctx.model_mut().replace_weight(name, TensorData::new(vec![0f32; 64 * 128], [64, 128])).unwrap();
    ctx.decode(&one_sequence(&p.ids, 0, 0)).unwrap();
    assert!(max_abs_diff(ctx.outputs().row(0).unwrap(), &p.last_logits) > 10.0 * TOL, "the new weight is used");
}

/// q, k, v and gate, up are stacked into one matrix each: replacing one of them writes its rows
/// (and its bias's), not a neighbour's. Zeroing a slot changes the logits; putting the
/// checkpoint's tensor back restores them (it would not, had it landed on another slot's rows).
#[test]
fn a_stacked_weight_slot_is_replaced_in_its_own_rows() {
    let p = &Reference::load(FIXTURE).prompts[0];
    let ckpt = Checkpoint::open(&fixture_dir(FIXTURE)).unwrap();
    let mut ctx = context(FIXTURE, 64);
    let logits_after = |ctx: &mut Context| {
        ctx.kv_mut().seq_rm(0, ..).unwrap();
        ctx.decode(&one_sequence(&p.ids, 0, 0)).unwrap();
        max_abs_diff(ctx.outputs().row(0).unwrap(), &p.last_logits)
    };
    for slot in ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"]
        .map(|s| format!("self_attn.{s}"))
        .into_iter()
        .chain(["mlp.gate_proj.weight", "mlp.up_proj.weight"].map(String::from))
    {
        let name = format!("model.layers.1.{slot}");
        let original = ckpt.data(&name, DType::F32).unwrap();
        let zeros = TensorData::new(vec![0f32; original.num_elements()], original.shape().clone());
        ctx.model_mut().replace_weight(&name, zeros).unwrap();
        assert!(logits_after(&mut ctx) > 10.0 * TOL, "{name}: the zeroed slot is used");
        ctx.model_mut().replace_weight(&name, original).unwrap();
        assert!(logits_after(&mut ctx) < TOL, "{name}: the restored slot gives the reference logits");
    }
}

/// A mixture of experts' matrices replaced (a GGUF file's 3-D tensor: all of a layer's experts
/// at once) are what the next pass uses, and on a GPU they are stacked again, so a decode step
/// still routes its row there (the `cube_experts` products run); the tensor put back gives the
/// logits before.
#[test]
fn replaced_experts_are_used_and_routed_on_the_device_again() {
    use llaisys_model::gguf::GgufFile;
    use llaisys_tests::gguf_fixture;
    let name = "tiny-qwen2moe-f32";
    let device = device();
    let on_gpu = llaisys_model::kernels::blocks_run_on(&device);
    let source = ModelSource::gguf(gguf_fixture(name));
    // Plain steps, whose products are counted as they run (a replayed step calls nothing).
    let opts = LoadOptions { step_graphs: false, ..LoadOptions::default() };
    let model = load_model(None, Some(&source), &opts, &device).unwrap();
    let mut ctx = Context::with_kv_dtype(model, 64, KvDtype::F32);
    let file = GgufFile::open(&gguf_fixture(name)).unwrap();
    let routed = || {
        let calls = llaisys_model::kernels::calls();
        calls.iter().find(|(k, _)| *k == "cube_experts").map_or(0, |(_, n)| *n)
    };
    // The last row of a prompt decoded a token a step (each step one row: routed on a GPU), and
    // the experts' products that ran there.
    let steps = |ctx: &mut Context| -> (Vec<f32>, u64) {
        let before = routed();
        ctx.kv_mut().seq_rm(0, ..).unwrap();
        for (i, t) in [40u32, 77, 114, 151].into_iter().enumerate() {
            ctx.decode(&one_sequence(&[t], 0, i as i64)).unwrap();
        }
        (ctx.outputs().row(0).unwrap().to_vec(), routed() - before)
    };
    let (before, products) = steps(&mut ctx);
    // Two products (gate/up, down) a layer a step, for both layers.
    let want = if on_gpu { 2 * 2 * 4 } else { 0 };
    assert_eq!(products, want, "a decode step's experts run on the device where it routes them");
    for tensor in ["blk.1.ffn_down_exps.weight", "blk.0.ffn_gate_exps.weight"] {
        let original = file.data(tensor, DType::F32).unwrap();
        let zeros = TensorData::new(vec![0f32; original.num_elements()], original.shape().clone());
        ctx.model_mut().replace_weight(tensor, zeros).unwrap();
        let (zeroed, products) = steps(&mut ctx);
        assert!(max_abs_diff(&zeroed, &before) > 1e-3, "{tensor}: the zeroed experts are used");
        assert_eq!(products, want, "{tensor}: the replaced experts are routed on the device again");
        ctx.model_mut().replace_weight(tensor, original).unwrap();
        let (restored, _) = steps(&mut ctx);
        assert!(max_abs_diff(&restored, &before) < 1e-5, "{tensor}: the restored experts give the logits before");
    }
}

#[test]
fn a_token_in_several_sequences_is_stored_once_and_seen_by_each() {
    let p = &Reference::load(FIXTURE).prompts[2];
    let n = p.ids.len();
    let mut ctx = context(FIXTURE, 128);
    let mut batch = Batch::new();
    for (i, &t) in p.ids.iter().enumerate() {
        batch.push(t, i as i64, &[4, 5], i + 1 == n);
    }
    ctx.decode(&batch).unwrap();
    assert_eq!(
        (ctx.kv().used(), ctx.kv().seq_pos_max(4), ctx.kv().seq_pos_max(5)),
        (n, Some(n as i64 - 1), Some(n as i64 - 1))
    );
    let first = last_argmax(&ctx);
    assert_eq!(continue_greedy(&mut ctx, 4, first, n as i64, 6), p.greedy[..6]);
    assert_eq!(continue_greedy(&mut ctx, 5, first, n as i64, 6), p.greedy[..6]);
}

/// Rows that ask only for their best token get the index of the largest logit of the row a
/// plain pass reads back (on a GPU, found there); rows that ask for their top-k get, on a GPU,
/// that row's k largest logits with their tokens and the logits of the tokens they watch (on
/// the CPU the row itself); the other rows keep their logits, in order. A watched token past
/// the vocabulary is refused before the pass, and the cache is as it was.
#[test]
fn picked_rows_hold_the_best_token_or_candidates_of_the_row_they_replace() {
    let prompts = &Reference::load(FIXTURE).prompts;
    let batch = || {
        let mut batch = Batch::new();
        for (seq, p) in prompts.iter().take(3).enumerate() {
            for (i, &t) in p.ids.iter().enumerate() {
                batch.push(t, i as i64, &[seq as u32], true);
            }
        }
        batch
    };
    let on_cpu = test_device().parse::<DeviceSpec>().unwrap() == DeviceSpec::Cpu;
    let mut plain = context(FIXTURE, 256);
    plain.decode(&batch()).unwrap();
    let n = plain.outputs().n_outputs();
    let mixed = |r: usize| [RowNeed::Best, RowNeed::Whole, RowNeed::Top(5)][r % 3];
    for needs in [
        vec![RowNeed::Best; n],
        (0..n).map(mixed).collect::<Vec<_>>(),
        (0..n).map(|r| RowNeed::Top(1 + r % 7)).collect(),
        (0..n).map(|r| [RowNeed::Draw(0.8), RowNeed::Best, RowNeed::Top(3), RowNeed::Draw(1.5)][r % 4]).collect(),
        vec![RowNeed::Whole; 2],
    ] {
        let vocab = plain.outputs().vocab() as u32;
        // Some rows watch tokens (in any order, repeated, among the best or not), some none.
        let watch = |r: usize| match r % 3 {
            0 => vec![vocab - 1, r as u32, 3, 3],
            1 => vec![],
            _ => vec![(r * 17) as u32 % vocab],
        };
        let asks: Vec<RowAsk> = needs.iter().enumerate().map(|(r, &need)| RowAsk { need, watch: watch(r) }).collect();
        let mut ctx = context(FIXTURE, 256);
        ctx.decode_picking(&batch(), &|| false, &asks).unwrap();
        let out = ctx.outputs();
        assert_eq!(out.n_outputs(), n);
        for r in 0..n {
            let whole = plain.outputs().row(r).unwrap();
            let need = needs.get(r).copied().unwrap_or_default();
            if out.top(r).is_some() {
                let watched: Vec<u32> = out.watched(r).iter().map(|c| c.0).collect();
                assert_eq!(watched, watch(r), "row {r}: its watched tokens, in the order asked");
                assert!(out.watched(r).iter().all(|(t, v)| (whole[*t as usize] - v).abs() < TOL), "row {r}");
            } else {
                assert!(out.watched(r).is_empty(), "row {r}: nothing watched without candidates");
            }
            if need == RowNeed::Best {
                assert_eq!((out.picked(r), out.row(r), out.top(r)), (argmax(whole), None, None), "row {r}");
                continue;
            }
            assert_eq!(out.picked(r), None);
            match (need, out.top(r)) {
                (RowNeed::Top(k), Some(top)) => {
                    assert!(!on_cpu, "the CPU keeps a sampled row whole");
                    let mut best: Vec<u32> = (0..whole.len() as u32).collect();
                    best.sort_by(|a, b| whole[*b as usize].total_cmp(&whole[*a as usize]).then(a.cmp(b)));
                    let tokens: Vec<u32> = top.iter().map(|c| c.0).collect();
                    assert_eq!(tokens, best[..k], "row {r}: the {k} best tokens, best first");
                    assert!(top.iter().all(|(t, v)| (whole[*t as usize] - v).abs() < TOL), "row {r}");
                    assert_eq!(out.row(r), None);
                }
                (RowNeed::Draw(t), Some(top)) => {
                    assert!(!on_cpu, "the CPU keeps a sampled row whole");
                    let mut best: Vec<u32> = (0..whole.len() as u32).collect();
                    best.sort_by(|a, b| whole[*b as usize].total_cmp(&whole[*a as usize]).then(a.cmp(b)));
                    let k = TOP_K_ON_DEVICE.min(whole.len());
                    assert_eq!(top.iter().map(|c| c.0).collect::<Vec<_>>(), best[..k], "row {r}: the best tokens");
                    let max = whole[best[0] as usize];
                    let want: f64 = whole.iter().map(|&l| f64::from((l - max) / t).exp()).sum();
                    let mass = f64::from(out.mass(r).expect("a draw row's mass"));
                    assert!((mass - want).abs() < 1e-3 * want, "row {r}: mass {mass}, want {want}");
                    // The row itself, where a draw falls past the candidates.
                    assert!(max_abs_diff(&out.fetch_row(r).unwrap(), whole) < TOL, "row {r}");
                    assert_eq!(out.row(r), None);
                }
                (RowNeed::Top(_) | RowNeed::Draw(_), None) => {
                    assert!(on_cpu, "row {r}: a GPU finds a sampled row's candidates");
                    assert!(max_abs_diff(out.row(r).unwrap(), whole) < TOL, "row {r}");
                }
                _ => assert!(max_abs_diff(out.row(r).unwrap(), whole) < TOL, "row {r}"),
            }
        }
    }
    let mut ctx = context(FIXTURE, 256);
    let past = RowAsk { need: RowNeed::Top(3), watch: vec![1, plain.outputs().vocab() as u32] };
    let err = ctx.decode_picking(&batch(), &|| false, &[past]).unwrap_err();
    assert!(matches!(&err, DecodeError::InvalidInput(m) if m.contains("watched token")), "{err:?}");
    assert_eq!(ctx.kv().used(), 0, "a refused batch leaves the cache as it was");
}
