//! Issue 31: a model's device work stays on its one stream (`DeviceStream`), whichever thread
//! does it. CubeCL gives each thread a stream, and a launch that binds a buffer another stream
//! made flushes that stream and waits for it, a launch at a time; the server loads a model on one
//! thread, makes its context on another and runs its steps on the compute pool's. CubeCL's
//! streaming log, which this test binary turns on (its own process: the configuration is set
//! once, before the first device), names every such binding.

use std::path::{Path, PathBuf};
use std::thread;

use llaisys_model::generate::one_sequence;
use llaisys_model::{
    Batch, Context, Device, DeviceSpec, KvDtype, LoadOptions, ModelSource, Pooling, RowAsk, RowNeed, Tensor, argmax,
    load_model,
};
use llaisys_tests::{Reference, fixture_dir, gguf_fixture, test_device};

/// Turns CubeCL's streaming log on, into `log` (before the process's first device use).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn log_streams(log: &Path) {
    use burn::cubecl::config::streaming::StreamingLogLevel;
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

    let mut config = CubeClRuntimeConfig::default();
    config.streaming.logger.file = Some(log.to_path_buf());
    config.streaming.logger.level = StreamingLogLevel::Full;
    assert!(CubeClRuntimeConfig::try_set(config), "the first device use of this process comes after");
}

/// No CubeCL in this build (the test is ignored).
#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
fn log_streams(_: &Path) {}

/// The log's lines that say a launch bound another stream's buffer, or waited for one.
fn crossings(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().filter(|l| l.contains("is shared on") || l.starts_with("Waiting on")).map(str::to_string).collect()
}

/// Loads `source` on a thread, makes its context on a second, and runs on a new thread for each
/// step: greedy decode steps (one and two rows), a step whose row is read back whole after its
/// candidates, a context shift (keys rotated on the device) and embeddings.
/// `reference`: the fixture whose prompts it runs.
fn run_on_many_threads(device: &Device, source: ModelSource, reference: &str, step_graphs: bool) {
    let opts = LoadOptions { step_graphs, ..LoadOptions::default() };
    let model = {
        let device = device.clone();
        thread::spawn(move || load_model(None, Some(&source), &opts, &device).unwrap()).join().unwrap()
    };
    let mut ctx = thread::spawn(move || Context::with_kv_dtype(model, 256, KvDtype::F32)).join().unwrap();
    let prompts = Reference::load(reference).prompts;
    let on_a_thread = |ctx: &mut Context, f: &(dyn Fn(&mut Context) + Sync)| {
        thread::scope(|s| s.spawn(|| f(ctx)).join().unwrap());
    };
    let mut next = [0u32; 2];
    let mut pos = [0i64; 2];
    for seq in 0..2 {
        let ids = &prompts[seq].ids;
        on_a_thread(&mut ctx, &|ctx| ctx.decode(&one_sequence(ids, seq as u32, 0)).unwrap());
        next[seq] = argmax(ctx.outputs().row(0).unwrap()).unwrap();
        pos[seq] = ids.len() as i64;
    }
    for i in 0..12 {
        let rows = if i < 8 { 2 } else { 1 };
        let mut batch = Batch::new();
        for s in 0..rows {
            batch.push(next[s], pos[s], &[s as u32], true);
        }
        let asks = vec![RowAsk::from(RowNeed::Best); rows];
        on_a_thread(&mut ctx, &|ctx| ctx.decode_picking(&batch, &|| false, &asks).unwrap());
        for s in 0..rows {
            next[s] = ctx.outputs().picked(s).unwrap();
            pos[s] += 1;
        }
    }
    // Candidates found on the device, then the rows read from the device on another thread.
    let mut batch = Batch::new();
    for s in 0..2 {
        batch.push(next[s], pos[s], &[s as u32], true);
        pos[s] += 1;
    }
    let asks = vec![RowAsk::from(RowNeed::Top(8)); 2];
    on_a_thread(&mut ctx, &|ctx| ctx.decode_picking(&batch, &|| false, &asks).unwrap());
    let outputs = ctx.outputs();
    let rows = thread::scope(|s| s.spawn(|| outputs.fetch_rows(&[0, 1]).unwrap()).join().unwrap());
    assert!(rows.iter().all(|row| row.len() == ctx.info().vocab_size));
    // A context shift: sequence 0's keys rotated on the device at the next pass.
    ctx.kv_mut().seq_rm(1, ..).unwrap();
    ctx.kv_mut().seq_rm(0, 0..4).unwrap();
    ctx.kv_mut().seq_add(0, 4.., -4).unwrap();
    let mut batch = Batch::new();
    batch.push(next[0], pos[0] - 4, &[0], true);
    on_a_thread(&mut ctx, &|ctx| ctx.decode(&batch).unwrap());
    let inputs = vec![prompts[0].ids.clone(), prompts[1].ids.clone()];
    on_a_thread(&mut ctx, &|ctx| assert_eq!(ctx.embeddings(&inputs, Pooling::Mean).unwrap().len(), 2));
}

#[test]
#[cfg_attr(
    not(any(feature = "wgpu", feature = "cuda")),
    ignore = "reads a GPU backend's streaming log: build with --features wgpu and run on a device (scripts/test-wgpu.sh)"
)]
fn a_models_work_stays_on_its_stream_whichever_thread_does_it() {
    let dir = tempfile::tempdir().unwrap();
    let log: PathBuf = dir.path().join("streaming.log");
    log_streams(&log);
    let device = test_device().parse::<DeviceSpec>().unwrap().device().unwrap();

    for (name, source, reference) in [
        ("tiny-tied-f32", ModelSource::Dir(fixture_dir("tiny-tied-f32")), "tiny-tied-f32"),
        ("tiny-qwen2moe-f32", ModelSource::Dir(fixture_dir("tiny-qwen2moe-f32")), "tiny-qwen2moe-f32"),
        ("tiny-kquant", ModelSource::gguf(gguf_fixture("tiny-kquant")), "tiny-tied-f32"),
    ] {
        for step_graphs in [false, true] {
            run_on_many_threads(&device, source.clone(), reference, step_graphs);
            let crossed = crossings(&log);
            assert!(
                crossed.is_empty(),
                "{name} (step graphs {step_graphs}): {} launches bound another stream's buffers, as {:?}",
                crossed.len(),
                &crossed[..crossed.len().min(3)]
            );
        }
    }

    // The log does name a crossing: a tensor made on this thread's stream, added to on another's.
    // Tried a few times, the log read a while after each: on a loaded machine (CI runs the
    // replays beside this test) one try once left no line in the log.
    let named = (0..5).any(|_| {
        let here = Tensor::<1>::full([1024], 1.0, &device);
        let sum = thread::scope(|s| s.spawn(|| (here.clone() + 1.0).into_data().try_to_vec::<f32>().unwrap()).join())
            .unwrap();
        assert_eq!(sum[0], 2.0);
        thread::sleep(std::time::Duration::from_millis(200));
        !crossings(&log).is_empty()
    });
    assert!(named, "CubeCL's streaming log names a launch on another stream's buffer");
}
