//! Issue 31: decode steps recorded as a graph and replayed on a GPU (`LoadOptions::step_graphs`)
//! give the logits the same steps give run plainly, across the changes a replayed step must
//! follow: new token ids, positions and cells every step, two sequences in one step, a
//! sequence's cells passing 64 and 128 (a wider cell table: a new graph), a sequence removed (a
//! one-row step again). And they are replays: a replayed step launches nothing from the host.

use llaisys_model::generate::one_sequence;
use llaisys_model::{Batch, Context, KvDtype, LoadOptions, ModelSource, argmax, load_model};
use llaisys_tests::{Reference, fixture_dir, gguf_fixture, test_device};

/// Decode steps of each run.
const STEPS: usize = 230;

/// Launches are counted process-wide: one test counts at a time.
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn context(source: &ModelSource, step_graphs: bool) -> Context {
    let device = test_device().parse::<llaisys_model::DeviceSpec>().unwrap().device().unwrap();
    let opts = LoadOptions { step_graphs, ..LoadOptions::default() };
    let model = load_model(None, Some(source), &opts, &device).unwrap();
    Context::with_kv_dtype(model, 640, KvDtype::F32)
}

/// One step of `rows` (sequence, token, position) with every row's logits: the logits, row by
/// row, and the launches the step made.
fn step(ctx: &mut Context, rows: &[(u32, u32, i64)]) -> (Vec<Vec<f32>>, u64) {
    let mut batch = Batch::new();
    for &(seq, token, pos) in rows {
        batch.push(token, pos, &[seq], true);
    }
    let watch = llaisys_model::launches::watch(false).expect("a GPU build watches launches");
    ctx.decode(&batch).unwrap();
    let launched = watch.take().total();
    let logits = (0..rows.len()).map(|r| ctx.outputs().row(r).unwrap().to_vec()).collect();
    (logits, launched)
}

/// The largest difference between two steps' logits, over the largest logit.
fn apart(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let scale = a.iter().flatten().fold(1e-6f32, |m, x| m.max(x.abs()));
    a.iter().flatten().zip(b.iter().flatten()).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Runs the same greedy decode on `source` with and without graphs and compares every step.
fn check(source: ModelSource, prompts: [&[u32]; 2]) {
    let _counting = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (mut plain, mut replayed) = (context(&source, false), context(&source, true));
    let mut next = [0u32; 2];
    for (seq, prompt) in prompts.iter().enumerate() {
        for ctx in [&mut plain, &mut replayed] {
            ctx.decode(&one_sequence(prompt, seq as u32, 0)).unwrap();
        }
        next[seq] = argmax(plain.outputs().row(0).unwrap()).unwrap();
    }
    let mut pos = prompts.map(|p| p.len() as i64);
    let mut replays = 0;
    assert!(prompts.iter().all(|p| p.len() + STEPS <= 256), "the prompts leave room for the steps");
    // Both sequences together past 64 and 128 cells each, then the first alone (the fixtures'
    // context is 256 positions).
    for i in 0..STEPS {
        let two = i < STEPS - 10;
        if i == STEPS - 10 {
            for ctx in [&mut plain, &mut replayed] {
                ctx.kv_mut().seq_rm(1, ..).unwrap();
            }
        }
        let rows: Vec<(u32, u32, i64)> = (0..if two { 2 } else { 1 }).map(|s| (s as u32, next[s], pos[s])).collect();
        let (want, plain_launches) = step(&mut plain, &rows);
        let (got, launches) = step(&mut replayed, &rows);
        let d = apart(&want, &got);
        assert!(d <= 1e-5, "step {i} ({} rows): the replayed logits are {d} apart from the plain ones", rows.len());
        assert!(plain_launches > 0, "a plain step launches its kernels");
        if launches == 0 {
            replays += 1;
        }
        for (s, row) in want.iter().enumerate() {
            next[s] = argmax(row).unwrap();
            pos[s] += 1;
        }
    }
    // Every step but the first two of each shape (run plainly, then recorded): two rows in
    // tables of 64, 128 and 256 cells, one row in 256.
    assert!(replays >= STEPS - 8, "{replays} of {STEPS} steps replayed");
}

#[test]
#[cfg_attr(
    not(any(feature = "wgpu", feature = "cuda")),
    ignore = "replays a GPU backend's graphs: build with --features wgpu and run on a device (scripts/test-wgpu.sh)"
)]
fn replayed_steps_give_the_plain_steps_logits() {
    for name in ["tiny-tied-f32", "tiny-qwen3-f32", "tiny-qwen2moe-f32"] {
        let prompts = Reference::load(name).prompts;
        check(ModelSource::Dir(fixture_dir(name)), [&prompts[0].ids, &prompts[1].ids]);
    }
}

#[test]
#[cfg_attr(
    not(any(feature = "wgpu", feature = "cuda")),
    ignore = "replays a GPU backend's graphs: build with --features wgpu and run on a device (scripts/test-wgpu.sh)"
)]
fn replayed_quantized_steps_give_the_plain_steps_logits() {
    let prompts = Reference::load("tiny-tied-f32").prompts;
    check(ModelSource::Gguf(gguf_fixture("tiny-kquant")), [&prompts[0].ids, &prompts[1].ids]);
}
