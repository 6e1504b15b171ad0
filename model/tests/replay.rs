//! Issue 31: decode steps recorded as a graph and replayed on a GPU (`LoadOptions::step_graphs`)
//! give the logits the same steps give run plainly, across the changes a replayed step must
//! follow: new token ids, positions and cells every step, six sequences in one step (two chunks
//! of the few-row products' four rows a cube, the last partial; a quantized file's too), more
//! than the few-row products take (Burn's matmul in the graph), a sequence's cells passing 64
//! and 128 (a wider cell table: a new graph), a weight replaced (the graphs read the old one's buffer:
//! they are dropped), sequences removed (two rows, then one). And they are replays: a replayed step launches nothing from the host, whichever
//! thread runs it (each replayed step here runs on a thread of its own, as the server's steps
//! run on the compute pool's threads: a model's device work stays on its one stream).

use burn::tensor::DType;
use llaisys_model::checkpoint::Checkpoint;
use llaisys_model::generate::one_sequence;
use llaisys_model::launches::Launches;
use llaisys_model::tensors::TensorSource;
use llaisys_model::{Batch, Context, KvDtype, LoadOptions, ModelSource, TensorData, argmax, load_model};
use llaisys_tests::{Reference, fixture_dir, gguf_fixture, test_device};

/// Decode steps of each run.
const STEPS: usize = 230;

/// Launches are counted process-wide: one test counts at a time.
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A context for `seqs` sequences of up to 256 positions (the fixtures' context).
fn context(source: &ModelSource, step_graphs: bool, seqs: usize) -> Context {
    let device = test_device().parse::<llaisys_model::DeviceSpec>().unwrap().device().unwrap();
    let opts = LoadOptions { step_graphs, ..LoadOptions::default() };
    let model = load_model(None, Some(source), &opts, &device).unwrap();
    Context::with_kv_dtype(model, 256 * seqs, KvDtype::F32)
}

/// One step of `rows` (sequence, token, position) with every row's logits: the logits, row by
/// row, and the launches the step made.
fn step(ctx: &mut Context, rows: &[(u32, u32, i64)]) -> (Vec<Vec<f32>>, Launches) {
    let mut batch = Batch::new();
    for &(seq, token, pos) in rows {
        batch.push(token, pos, &[seq], true);
    }
    let watch = llaisys_model::launches::watch(false).expect("a GPU build watches launches");
    ctx.decode(&batch).unwrap();
    let launched = watch.take();
    let logits = (0..rows.len()).map(|r| ctx.outputs().row(r).unwrap().to_vec()).collect();
    (logits, launched)
}

/// The largest difference between two steps' logits, over the largest logit.
fn apart(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let scale = a.iter().flatten().fold(1e-6f32, |m, x| m.max(x.abs()));
    a.iter().flatten().zip(b.iter().flatten()).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Runs the same greedy decode of `seqs` sequences (the two prompts in turn) on `source` with
/// and without graphs and compares every step; half-way, `replace` (a weight's name and
/// values) replaces a weight in both.
fn check(source: ModelSource, prompts: [&[u32]; 2], seqs: usize, replace: Option<(&str, TensorData)>) {
    let _counting = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (mut plain, mut replayed) = (context(&source, false, seqs), context(&source, true, seqs));
    let prompts: Vec<&[u32]> = (0..seqs).map(|s| prompts[s % 2]).collect();
    let mut next = vec![0u32; seqs];
    for (seq, prompt) in prompts.iter().enumerate() {
        for ctx in [&mut plain, &mut replayed] {
            ctx.decode(&one_sequence(prompt, seq as u32, 0)).unwrap();
        }
        next[seq] = argmax(plain.outputs().row(0).unwrap()).unwrap();
    }
    let mut pos: Vec<i64> = prompts.iter().map(|p| p.len() as i64).collect();
    let mut replays = 0;
    // Tensors made between the replayed steps and kept, of the sizes a step's buffers have: a
    // replay that wrote memory the pool has handed on would change them. (The recording holds
    // its buffers, and CubeCL allocates nothing on a page a live graph touched.)
    let info = replayed.model().info().clone();
    let device = replayed.model().device().clone();
    let mut kept = Vec::new();
    assert!(prompts.iter().all(|p| p.len() + STEPS <= 256), "the prompts leave room for the steps");
    // Every sequence together past 64 and 128 cells each, then the first two, then the first
    // alone (the fixtures' context is 256 positions).
    for i in 0..STEPS {
        let rows = match i {
            i if i < STEPS - 20 => seqs,
            i if i < STEPS - 10 => 2,
            _ => 1,
        };
        if let Some((name, data)) = replace.as_ref().filter(|_| i == STEPS / 2) {
            for ctx in [&mut plain, &mut replayed] {
                ctx.model_mut().replace_weight(name, data.clone()).unwrap();
            }
        }
        if i == STEPS - 20 || i == STEPS - 10 {
            for ctx in [&mut plain, &mut replayed] {
                for seq in rows..seqs {
                    ctx.kv_mut().seq_rm(seq as u32, ..).unwrap();
                }
            }
        }
        let rows: Vec<(u32, u32, i64)> = (0..rows).map(|s| (s as u32, next[s], pos[s])).collect();
        let (want, plain_launches) = step(&mut plain, &rows);
        let (got, launches) = std::thread::scope(|s| s.spawn(|| step(&mut replayed, &rows)).join().unwrap());
        for size in [info.hidden_size, info.vocab_size].map(|s| s * rows.len()) {
            kept.push(llaisys_model::Tensor::<1>::full([size], i as f32, &device));
        }
        let d = apart(&want, &got);
        assert!(d <= 1e-5, "step {i} ({} rows): the replayed logits are {d} apart from the plain ones", rows.len());
        assert!(plain_launches.total() > 0, "a plain step launches its kernels");
        if launches.total() == 0 {
            replays += 1;
        }
        for (s, row) in want.iter().enumerate() {
            next[s] = argmax(row).unwrap();
            pos[s] += 1;
        }
    }
    // Every step but the first two of each shape (run plainly, then recorded): all the rows in
    // tables of 64, 128 and 256 cells (and once more after the replacement), two and one row in
    // 256; and two more for each recording the runtime refused and the next step made (on
    // llvmpipe about one run in ten has one).
    assert!(replays >= STEPS - 18, "{replays} of {STEPS} steps replayed");
    for (k, t) in kept.into_iter().enumerate() {
        let want = (k / 2) as f32;
        let values = t.into_data().try_to_vec::<f32>().unwrap();
        assert!(values.iter().all(|&v| v == want), "a tensor made after step {} was written by a replay", k / 2);
    }
}

#[test]
#[cfg_attr(
    not(any(feature = "wgpu", feature = "cuda")),
    ignore = "replays a GPU backend's graphs: build with --features wgpu and run on a device (scripts/test-wgpu.sh)"
)]
fn replayed_steps_give_the_plain_steps_logits() {
    for name in ["tiny-tied-f32", "tiny-qwen3-f32", "tiny-qwen2moe-f32"] {
        let prompts = Reference::load(name).prompts;
        // Layer 1's attention output halved.
        let weight = "model.layers.1.self_attn.o_proj.weight";
        let original = Checkpoint::open(&fixture_dir(name)).unwrap().data(weight, DType::F32).unwrap();
        let halved: Vec<f32> = original.try_to_vec::<f32>().unwrap().iter().map(|x| x * 0.5).collect();
        let halved = TensorData::new(halved, original.shape().clone());
        // Six rows: two chunks of the few-row products' four a cube.
        check(ModelSource::Dir(fixture_dir(name)), [&prompts[0].ids, &prompts[1].ids], 6, Some((weight, halved)));
    }
}

#[test]
#[cfg_attr(
    not(any(feature = "wgpu", feature = "cuda")),
    ignore = "replays a GPU backend's graphs: build with --features wgpu and run on a device (scripts/test-wgpu.sh)"
)]
fn replayed_steps_of_more_rows_than_the_few_row_products_take() {
    let prompts = Reference::load("tiny-tied-f32").prompts;
    // Burn's matmuls (and the norm, RoPE and KV write launched apart) in the graph.
    let seqs = llaisys_model::kernels::gpu_fused_rows() + 2;
    check(ModelSource::Dir(fixture_dir("tiny-tied-f32")), [&prompts[0].ids, &prompts[1].ids], seqs, None);
}

#[test]
#[cfg_attr(
    not(any(feature = "wgpu", feature = "cuda")),
    ignore = "replays a GPU backend's graphs: build with --features wgpu and run on a device (scripts/test-wgpu.sh)"
)]
fn replayed_quantized_steps_give_the_plain_steps_logits() {
    let prompts = Reference::load("tiny-tied-f32").prompts;
    // Six rows: two chunks of the few-row products' four a cube, the blocks read in the kernels.
    check(ModelSource::gguf(gguf_fixture("tiny-kquant")), [&prompts[0].ids, &prompts[1].ids], 6, None);
}

#[test]
#[cfg_attr(
    not(any(feature = "wgpu", feature = "cuda")),
    ignore = "replays a GPU backend's graphs: build with --features wgpu and run on a device (scripts/test-wgpu.sh)"
)]
fn quantized_steps_of_more_rows_than_the_few_row_products_take_are_not_recorded() {
    let _counting = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let source = ModelSource::gguf(gguf_fixture("tiny-kquant"));
    let prompts = Reference::load("tiny-tied-f32").prompts;
    // Past the few-row products' rows each product dequantizes its blocks, which no graph keeps.
    let seqs = llaisys_model::kernels::gpu_fused_rows() as u32 + 1;
    let mut ctx = context(&source, true, seqs as usize);
    let mut rows: Vec<(u32, u32, i64)> = Vec::new();
    for seq in 0..seqs {
        let prompt = &prompts[seq as usize % 2].ids;
        ctx.decode(&one_sequence(prompt, seq, 0)).unwrap();
        rows.push((seq, argmax(ctx.outputs().row(0).unwrap()).unwrap(), prompt.len() as i64));
    }
    // A shape's third step would replay were it recorded (the first runs plainly, the second
    // is recorded).
    for i in 0..6 {
        let (logits, launches) = step(&mut ctx, &rows);
        assert!(launches.total() > 0, "{seqs}-row step {i} of a quantized model replayed a graph");
        for (row, logits) in rows.iter_mut().zip(&logits) {
            row.1 = argmax(logits).unwrap();
            row.2 += 1;
        }
    }
}
