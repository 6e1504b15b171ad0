//! Parity with Hugging Face transformers on the tiny fixtures, through the batch API in three
//! ways that must agree: the whole prompt in one batch, the prompt in uneven chunks, and two
//! prompts interleaved as two sequences in the same batches.

use llaisys_model::generate::{Finish, greedy};
use llaisys_model::{Batch, BatchInput, Context, Device, DeviceSpec, KvDtype, LoadOptions, ModelSource, load_model};
use llaisys_tests::{FIXTURES, PromptRef, Reference, fixture_dir, max_abs_diff, test_device, topk_error};

/// Absolute tolerance on logits (f32 compute; the bf16 fixture's reference also computes in f32).
const TOL: f32 = 1e-3;

/// The device under test (`LLAISYS_TEST_DEVICE`; the CPU by default).
fn device() -> Device {
    test_device().parse::<DeviceSpec>().unwrap().device().unwrap()
}

fn context(name: &str) -> Context {
    let model = load_model(None, Some(&ModelSource::Dir(fixture_dir(name))), &LoadOptions::default(), &device())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Context::with_kv_dtype(model, 256, KvDtype::F32)
}

/// Checks every flagged row of the last decode against the reference top-k, by prompt position.
fn check_rows(ctx: &Context, batch_pos: &[(usize, usize)], reference: &PromptRef) -> f32 {
    let mut err: f32 = 0.0;
    for &(batch_index, prompt_pos) in batch_pos {
        let row = ctx.outputs().logits_ith(batch_index).expect("flagged row");
        err = err.max(topk_error(row, &reference.topk[prompt_pos]));
    }
    err
}

/// Greedy decode of several sequences together, one token each per batch, starting from the
/// first generated token of each. `seqs[i]` holds `prompts[i]`. Returns the tokens of each.
fn decode_together(
    ctx: &mut Context,
    seqs: &[u32],
    prompts: &[&PromptRef],
    first: Vec<u32>,
    steps: usize,
) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = first.iter().map(|t| vec![*t]).collect();
    for _ in 1..steps {
        let mut batch = Batch::new();
        for (s, toks) in out.iter().enumerate() {
            let pos = (prompts[s].ids.len() + toks.len() - 1) as i64;
            batch.push(*toks.last().unwrap(), pos, &[seqs[s]], true);
        }
        ctx.decode(&batch).unwrap();
        for (s, toks) in out.iter_mut().enumerate() {
            toks.push(llaisys_model::argmax(ctx.outputs().row(s).unwrap()).unwrap());
        }
    }
    out
}

#[test]
fn whole_prompt_matches_transformers_logits_and_greedy_tokens() {
    let mut worst: f32 = 0.0;
    for name in FIXTURES {
        let reference = Reference::load(name);
        let mut ctx = context(name);
        for (s, p) in reference.prompts.iter().enumerate() {
            let seq = s as u32;
            let mut batch = Batch::new();
            for (i, &t) in p.ids.iter().enumerate() {
                batch.push(t, i as i64, &[seq], true);
            }
            ctx.decode(&batch).unwrap();
            let rows: Vec<(usize, usize)> = (0..p.ids.len()).map(|i| (i, i)).collect();
            let err = check_rows(&ctx, &rows, p);
            let last = max_abs_diff(ctx.outputs().logits_ith(p.ids.len() - 1).unwrap(), &p.last_logits);
            assert!(err < TOL && last < TOL, "{name} prompt {s}: top-k error {err}, last-row error {last}");
            worst = worst.max(err).max(last);
            let generation = greedy(&mut ctx, seq, &p.ids, p.greedy.len(), &[]).unwrap();
            assert_eq!(generation.tokens, p.greedy, "{name} prompt {s}: greedy tokens");
            assert_eq!(generation.finish, Finish::Length);
        }
    }
    eprintln!("parity: max |logit − transformers| = {worst:.2e}");
}

#[test]
fn uneven_chunks_give_the_same_logits() {
    for name in FIXTURES {
        let reference = Reference::load(name);
        let mut ctx = context(name);
        for (s, p) in reference.prompts.iter().enumerate() {
            // LongRoPE turns a forward by the long factors when it reaches past the original
            // context (transformers' rule, by the forward's last position): chunks of a prompt
            // that passes it turn by the short ones until one reaches past, unlike the whole
            // prompt's forward, which the reference is (tiny-phi3-f32's is 32 positions).
            if name == "tiny-phi3-f32" && p.ids.len() > 32 {
                continue;
            }
            let seq = s as u32;
            let mut start = 0;
            for len in [3, 1, 5, 2].into_iter().chain(std::iter::repeat(7)) {
                if start == p.ids.len() {
                    break;
                }
                let end = (start + len).min(p.ids.len());
                // Default positions: each chunk continues the sequence.
                let chunk = Batch {
                    seq_ids: Some(vec![vec![seq]; end - start]),
                    logits: Some(vec![true; end - start]),
                    ..Batch::one(p.ids[start..end].to_vec())
                };
                ctx.decode(&chunk).unwrap();
                let rows: Vec<(usize, usize)> = (start..end).map(|i| (i - start, i)).collect();
                let err = check_rows(&ctx, &rows, p);
                assert!(err < TOL, "{name} prompt {s} chunk {start}..{end}: error {err}");
                start = end;
            }
            let first = llaisys_model::argmax(ctx.outputs().row(ctx.outputs().n_outputs() - 1).unwrap()).unwrap();
            let tokens = decode_together(&mut ctx, &[seq], &[p], vec![first], p.greedy.len());
            assert_eq!(tokens[0], p.greedy, "{name} prompt {s}: greedy after chunked prefill");
        }
    }
}

#[test]
fn interleaved_sequences_in_shared_batches_match_each_alone() {
    for name in FIXTURES {
        let reference = Reference::load(name);
        let (a, b) = (&reference.prompts[0], &reference.prompts[1]);
        let mut ctx = context(name);
        // Tokens of A (seq 0) and B (seq 1) alternate inside each batch, in chunks of 4 per sequence.
        let (mut ia, mut ib) = (0, 0);
        let mut first = [None; 2];
        while ia < a.ids.len() || ib < b.ids.len() {
            let mut batch = Batch::new();
            let mut rows = Vec::new();
            for _ in 0..4 {
                for (seq, p, i) in [(0u32, a, &mut ia), (1u32, b, &mut ib)] {
                    if *i < p.ids.len() {
                        rows.push((batch.len(), seq, *i));
                        batch.push(p.ids[*i], *i as i64, &[seq], true);
                        *i += 1;
                    }
                }
            }
            ctx.decode(&batch).unwrap();
            for &(bi, seq, pos) in &rows {
                let p = if seq == 0 { a } else { b };
                let err = topk_error(ctx.outputs().logits_ith(bi).unwrap(), &p.topk[pos]);
                assert!(err < TOL, "{name}: seq {seq} pos {pos}: error {err}");
                if pos + 1 == p.ids.len() {
                    first[seq as usize] = llaisys_model::argmax(ctx.outputs().logits_ith(bi).unwrap());
                }
            }
        }
        let first = first.map(|t| t.expect("both prompts finished")).to_vec();
        let tokens = decode_together(&mut ctx, &[0, 1], &[a, b], first, a.greedy.len());
        assert_eq!(tokens[0], a.greedy, "{name}: sequence A greedy");
        assert_eq!(tokens[1], b.greedy, "{name}: sequence B greedy");
    }
}

/// Rows of the embedding table given as input give the tokens' logits: Qwen2's as they are,
/// Granite's multiplied by its `embedding_multiplier` as its tokens' rows are (transformers'
/// `GraniteModel` scales whatever enters its first layer).
#[test]
fn embeddings_as_input_give_the_same_logits_as_their_tokens() {
    for name in ["tiny-tied-f32", "tiny-granite-f32"] {
        embedding_rows_give_the_tokens_logits(name);
    }
}

fn embedding_rows_give_the_tokens_logits(name: &str) {
    let p = &Reference::load(name).prompts[0];
    let bytes = std::fs::read(fixture_dir(name).join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let embed = st.tensor("model.embed_tokens.weight").unwrap();
    let hidden = embed.shape()[1];
    let table: Vec<f32> = embed.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let values: Vec<f32> =
        p.ids.iter().flat_map(|&t| table[t as usize * hidden..(t as usize + 1) * hidden].to_vec()).collect();
    let mut ctx = context(name);
    ctx.decode(&Batch { input: BatchInput::Embeddings { values, dim: hidden }, ..Batch::one(vec![]) }).unwrap();
    let err = max_abs_diff(ctx.outputs().row(0).unwrap(), &p.last_logits);
    assert!(err < TOL, "{name}: embedding input differs from token input by {err}");
}

/// The quantized GGUF fixtures (Q8_0, Q4_0, Q5_0, and Q4_K_M's Q4_K and Q6_K; on a GPU also the
/// Q8_0 Qwen3, Llama and MoE files) on the device under test, loaded as they are: on a GPU they
/// stay in their blocks (the products read them, `cube_xwt_q`), so the last prompt row's logits
/// are a reference forward pass's over the dequantized weights to f32 tolerance, and so are the
/// greedy tokens. On the CPU the packed
/// kernels quantize activations to int8 as llama.cpp does (`tests/gguf.rs` holds them to that
/// budget): 8% of the logits' range here.
#[test]
fn quantized_ggufs_match_the_reference_over_their_dequantized_weights() {
    use llaisys_model::generate::one_sequence;
    use llaisys_tests::{gguf_family_references, gguf_fixture, gguf_references};
    let device = device();
    let blocks = llaisys_model::kernels::blocks_run_on(&device);
    let product_calls =
        || llaisys_model::kernels::calls().into_iter().find(|(k, _)| *k == "cube_xwt_q").map(|(_, n)| n);
    let before = product_calls();
    // The Qwen2 fixtures' references are float64 numpy; the other families' (Qwen3, Llama and
    // the MoEs in Q8_0) transformers in f32, checked on a GPU (`tests/gguf.rs` checks the CPU's).
    let qwen2 = gguf_references().into_iter().filter(|(name, _)| !name.ends_with("f32"));
    let families = gguf_family_references().into_iter().filter(|(name, _)| blocks && name.ends_with("q8_0"));
    for (name, reference) in qwen2.chain(families) {
        let source = ModelSource::gguf(gguf_fixture(&name));
        let model = load_model(None, Some(&source), &LoadOptions::default(), &device).unwrap();
        let mut ctx = Context::with_kv_dtype(model, 256, KvDtype::F32);
        for (s, p) in reference.prompts.iter().enumerate() {
            let seq = s as u32;
            ctx.decode(&one_sequence(&p.ids, seq, 0)).unwrap();
            let row = ctx.outputs().row(0).unwrap();
            let range = p.last_logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let err = max_abs_diff(row, &p.last_logits);
            eprintln!(
                "{name} prompt {s}: last row within {:.2e} of the range (margin {:.3})",
                err / range,
                p.min_margin
            );
            if !blocks {
                assert!(err < 0.08 * range, "{name} prompt {s}: {err} of {range}");
                continue;
            }
            assert!(err < (1e-4 * range).max(1e-3), "{name} prompt {s}: logits differ by {err} (range {range})");
            ctx.kv_mut().seq_rm(seq, ..).unwrap();
            let generation = greedy(&mut ctx, seq + 10, &p.ids, p.greedy.len(), &[]).unwrap();
            assert_eq!(generation.tokens, p.greedy, "{name} prompt {s}");
        }
    }
    if blocks {
        assert!(product_calls() > before, "no product read its blocks");
    }
}

/// The demo model's GGUF (`LLAISYS_TEST_MODEL`) on the device under test, as the file stores
/// it: its prompt's rows all at once (on a GPU, prefill's products over dequantized weights; the
/// embedding and output matrix, 544 MB as f32, a product a part where the device's buffers are
/// smaller, as llvmpipe's 128 MiB are) agree with the last row decoded alone (a decode step's
/// products over the blocks), and the greedy token is the same. On llvmpipe the two agree within
/// f32 rounding; on the CPU, whose many-row and few-row kernels round activations apart, within
/// its int8 noise.
#[test]
#[ignore = "needs the demo model: scripts/test-demo-model.sh (the CPU) and scripts/test-wgpu.sh (llvmpipe) run it"]
fn the_demo_model_prefill_rows_agree_with_a_decode_step() {
    let spec = test_device().parse::<DeviceSpec>().unwrap();
    let path = std::path::PathBuf::from(llaisys_tests::demo_model());
    let model = load_model(None, Some(&ModelSource::gguf(path)), &LoadOptions::default(), &device()).unwrap();
    let prompt = [785u32, 6722, 315, 9625, 374, 12095, 13];
    let mut ctx = Context::with_kv_dtype(model, 64, KvDtype::F32);
    // The prompt in sequence `seq`: the last row's logits.
    let mut decode = |seq: u32, outputs: bool| {
        let mut batch = Batch::new();
        for (i, &t) in prompt.iter().enumerate() {
            batch.push(t, i as i64, &[seq], outputs || i + 1 == prompt.len());
        }
        ctx.decode(&batch).unwrap();
        ctx.outputs().logits_ith(prompt.len() - 1).unwrap().to_vec()
    };
    let (all_rows, last_row) = (decode(0, true), decode(1, false));
    let range = last_row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v.abs()));
    let diff = max_abs_diff(&all_rows, &last_row);
    let tol = if spec == DeviceSpec::Cpu { 0.02 } else { 1e-4 };
    eprintln!("{spec}: the last row's logits, all rows against it alone: {diff} of {range}");
    assert!(diff <= tol * range, "{spec}: {diff} apart, over {tol} of the logits' range {range}");
    assert_eq!(llaisys_model::argmax(&all_rows), llaisys_model::argmax(&last_row));
}

/// The demo model's GGUF dequantized to f32 (`--dtype f32`) on a GPU device agrees with the
/// same on the CPU: dense, its embedding and output matrix (544 MB) are larger than llvmpipe's
/// largest buffer (128 MiB), so that device keeps them in row parts (a product a part, a row
/// lookup across them), in prefill, in decode steps and in their replays. The prompt's last
/// logits agree within f32 rounding, and so do five greedy tokens.
#[test]
#[ignore = "needs the demo model and a GPU device: scripts/test-wgpu.sh runs it on llvmpipe"]
fn gpu_demo_model_in_f32_agrees_with_the_cpu() {
    let spec = test_device().parse::<DeviceSpec>().unwrap();
    assert_ne!(spec, DeviceSpec::Cpu, "run it on a GPU device (LLAISYS_TEST_DEVICE)");
    let path = std::path::PathBuf::from(llaisys_tests::demo_model());
    let options = LoadOptions { weight_dtype: llaisys_model::WeightDtype::F32, ..LoadOptions::default() };
    let prompt = [785u32, 6722, 315, 9625, 374, 12095, 13];
    let run = |device: &Device| {
        let model = load_model(None, Some(&ModelSource::gguf(path.clone())), &options, device).unwrap();
        let mut ctx = Context::with_kv_dtype(model, 64, KvDtype::F32);
        let mut batch = Batch::new();
        for (i, &t) in prompt.iter().enumerate() {
            batch.push(t, i as i64, &[0], i + 1 == prompt.len());
        }
        ctx.decode(&batch).unwrap();
        let logits = ctx.outputs().logits_ith(prompt.len() - 1).unwrap().to_vec();
        (logits, greedy(&mut ctx, 1, &prompt, 5, &[]).unwrap().tokens)
    };
    let (want, want_ids) = run(&Device::flex());
    let (got, got_ids) = run(&device());
    let range = want.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v.abs()));
    let diff = max_abs_diff(&got, &want);
    eprintln!("{spec}: the prompt's last logits {diff} from the CPU's, of {range}; greedy {got_ids:?}");
    assert!(diff <= 1e-4 * range, "{spec}: {diff} from the CPU's logits, over 1e-4 of their range {range}");
    assert_eq!(got_ids, want_ids, "{spec}: greedy tokens");
}

/// Qwen3.5's linear-attention state moves with its sequence: copied whole to another sequence it
/// continues there as transformers does; a copy of part of it, or cutting it back, is refused and
/// changes nothing (the sequence still continues as transformers does) unless it ends at a
/// checkpoint (kept now, or on the way through a pass when asked ahead): then the copy, and the
/// sequence cut back to it, continue as transformers does.
#[test]
fn a_linear_attention_state_is_copied_whole_or_to_a_checkpoint() {
    let name = "tiny-qwen35-f32";
    let reference = Reference::load(name);
    let p = &reference.prompts[0];
    let mut ctx = context(name);
    let len = p.ids.len() as i64;
    let empty = ctx.kv().size_bytes();
    // Asked ahead: kept part way through the prompt's pass, a token short of its end.
    ctx.kv_mut().seq_checkpoint(0, len - 1);
    let mut batch = Batch::new();
    for (i, &t) in p.ids.iter().enumerate() {
        batch.push(t, i as i64, &[0], i + 1 == p.ids.len());
    }
    ctx.decode(&batch).unwrap();
    let first = llaisys_model::argmax(ctx.outputs().row(0).unwrap()).unwrap();
    let partial = Err(llaisys_model::KvError::PartialState);
    assert_eq!(ctx.kv_mut().seq_cp(0, 2, 0..len - 2), partial);
    assert_eq!(ctx.kv_mut().seq_rm(0, 3..), partial);
    assert_eq!(ctx.kv_mut().seq_add(0, 1.., -1), partial);
    assert_eq!(ctx.kv().seq_pos_max(2), None, "nothing was copied");
    // From the checkpoint a token short, the prompt's last token gives transformers' logits.
    ctx.kv_mut().seq_cp(0, 2, 0..len - 1).unwrap();
    let mut last = Batch::new();
    last.push(p.ids[p.ids.len() - 1], len - 1, &[2], true);
    ctx.decode(&last).unwrap();
    let diff = max_abs_diff(ctx.outputs().row(0).unwrap(), &p.last_logits);
    assert!(diff < 1e-3, "from the checkpoint: {diff} from transformers' last logits");
    ctx.kv_mut().seq_rm(2, ..).unwrap();
    // Kept now: the prompt's end.
    let held = ctx.kv().size_bytes();
    assert_eq!(held - empty, 2 * ctx.info().state_bytes, "a state and its checkpoint, as ModelInfo says");
    ctx.kv_mut().seq_checkpoint(0, len);
    assert_eq!(ctx.kv().size_bytes() - held, ctx.info().state_bytes, "a checkpoint is counted in the cache's size");
    ctx.kv_mut().seq_cp(0, 1, 0..len).unwrap();
    let tokens = decode_together(&mut ctx, &[0, 1], &[p, p], vec![first, first], p.greedy.len());
    assert_eq!(tokens[0], p.greedy, "the original");
    assert_eq!(tokens[1], p.greedy, "the copy");
    // Both went on past the checkpoint: the prompt's part of either is still to be had from it.
    assert_eq!(ctx.kv_mut().seq_cp(1, 3, 0..len - 2), partial, "only at a checkpoint");
    assert_eq!(ctx.kv_mut().seq_rm(1, len + 1..), partial, "only from a checkpoint");
    ctx.kv_mut().seq_cp(1, 3, 0..len).unwrap();
    ctx.kv_mut().seq_rm(0, len..).unwrap();
    assert_eq!(ctx.kv().seq_pos_max(0), Some(len - 1));
    let tokens = decode_together(&mut ctx, &[0, 3], &[p, p], vec![first, first], p.greedy.len());
    assert_eq!(tokens[0], p.greedy, "cut back to its checkpoint");
    assert_eq!(tokens[1], p.greedy, "copied from a copy's inherited checkpoint");
    // A sequence removed whole starts again from nothing.
    ctx.kv_mut().seq_rm(1, ..).unwrap();
    let generation = greedy(&mut ctx, 1, &p.ids, p.greedy.len(), &[]).unwrap();
    assert_eq!(generation.tokens, p.greedy);
}

/// Qwen3.5's weights replaced by their checkpoint names with the checkpoint's own values (q and k,
/// which loading reorders, their norms, the linear attention's projections, convolution and
/// norms) leave its outputs as transformers' (a replacement is reordered as loading was).
#[test]
fn qwen35_weights_replaced_with_their_own_values_keep_the_outputs() {
    use llaisys_model::tensors::TensorSource;
    let name = "tiny-qwen35-f32";
    let checkpoint = llaisys_model::checkpoint::Checkpoint::open(&fixture_dir(name)).unwrap();
    let mut ctx = context(name);
    let replaced = [
        "model.layers.3.self_attn.q_proj.weight",
        "model.layers.3.self_attn.k_proj.weight",
        "model.layers.3.self_attn.q_norm.weight",
        "model.layers.3.self_attn.k_norm.weight",
        "model.layers.3.input_layernorm.weight",
        "model.layers.0.linear_attn.in_proj_qkv.weight",
        "model.layers.0.linear_attn.in_proj_a.weight",
        "model.layers.0.linear_attn.conv1d.weight",
        "model.layers.0.linear_attn.A_log",
        "model.layers.0.linear_attn.norm.weight",
        "model.norm.weight",
    ];
    for tensor in replaced {
        let data = checkpoint.data(tensor, burn::tensor::DType::F32).unwrap();
        ctx.model_mut().replace_weight(tensor, data).unwrap_or_else(|e| panic!("{tensor}: {e}"));
    }
    let p = &Reference::load(name).prompts[0];
    let generation = greedy(&mut ctx, 0, &p.ids, p.greedy.len(), &[]).unwrap();
    assert_eq!(generation.tokens, p.greedy);
    ctx.decode(&llaisys_model::generate::one_sequence(&p.ids, 1, 0)).unwrap();
    let last = max_abs_diff(ctx.outputs().row(0).unwrap(), &p.last_logits);
    assert!(last < TOL, "last-row error {last}");
}
