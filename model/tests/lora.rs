//! LoRA adapters merged at load (`llaisys_model::adapter`), against transformers + PEFT over the
//! adapted fixtures (`scripts/make_lora_fixtures.py`): PEFT directories on checkpoints,
//! llama.cpp's GGUF adapter on GGUF files (q and k rows interleaved as llama.cpp stores them,
//! in f32 and in Q8_0), scales, several adapters, and the errors of adapters that do not fit.

use std::path::PathBuf;

use llaisys_model::adapter::Lora;
use llaisys_model::generate::{greedy, one_sequence};
use llaisys_model::quant::QuantType;
use llaisys_model::{
    Context, Device, DeviceSpec, KvDtype, LoadError, LoadOptions, ModelSource, WeightDtype, load_model,
};
use llaisys_tests::{Reference, converted_fixture, fixture_dir, gguf_fixture, max_abs_diff, test_device, topk_error};

/// Tolerance on logits: the parity tests' absolute 1e-3 (f32 weights and compute), or 2e-5 of the
/// logits' range where that is more. A merged adapter rounds apart from PEFT's unmerged products:
/// PEFT's own merged Llama fixture moves its logits 1.1e-5 of their range (0.0085 of 794).
fn tolerance(last_logits: &[f32]) -> f32 {
    let range = last_logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    (2e-5 * range).max(1e-3)
}

fn device() -> Device {
    test_device().parse::<DeviceSpec>().unwrap().device().unwrap()
}

fn adapter(name: &str) -> PathBuf {
    fixture_dir("lora").join(name)
}

fn load(source: ModelSource, adapters: Vec<Lora>) -> Result<Context, LoadError> {
    let opts = LoadOptions { adapters, ..LoadOptions::default() };
    Ok(Context::with_kv_dtype(load_model(None, Some(&source), &opts, &device())?, 256, KvDtype::F32))
}

/// The largest distance of `ctx`'s every prompt row from `reference`'s (top-k, the last row's
/// logits), as a fraction of the tolerance; its greedy tokens are the reference's where `greedy`.
fn worst_error(ctx: &mut Context, reference: &Reference, greedy_too: bool) -> f32 {
    let mut worst: f32 = 0.0;
    for (s, p) in reference.prompts.iter().enumerate() {
        let seq = s as u32;
        let mut batch = llaisys_model::Batch::new();
        for (i, &t) in p.ids.iter().enumerate() {
            batch.push(t, i as i64, &[seq], true);
        }
        ctx.decode(&batch).unwrap();
        let tol = tolerance(&p.last_logits);
        for (i, topk) in p.topk.iter().enumerate() {
            worst = worst.max(topk_error(ctx.outputs().logits_ith(i).unwrap(), topk) / tol);
        }
        let last = max_abs_diff(ctx.outputs().logits_ith(p.ids.len() - 1).unwrap(), &p.last_logits);
        worst = worst.max(last / tol);
        if greedy_too {
            let generation = greedy(ctx, seq + 100, &p.ids, p.greedy.len(), &[]).unwrap();
            assert_eq!(generation.tokens, p.greedy, "{} prompt {s}: greedy tokens", reference.model);
        }
    }
    worst
}

#[test]
fn peft_adapters_on_checkpoints_give_transformers_and_peft_logits() {
    // Llama (every projection, the embeddings and the head; one module's rank by pattern) and
    // Qwen3 (rank-stabilised scaling, one module's alpha by pattern; tied embeddings).
    for (name, base) in [("tiny-llama-lora", "tiny-llama-f32"), ("tiny-qwen3-lora-rs", "tiny-qwen3-f32")] {
        let reference = Reference::load(&format!("lora/{name}"));
        let mut ctx = load(ModelSource::Dir(fixture_dir(base)), vec![Lora::new(adapter(name))]).unwrap();
        let err = worst_error(&mut ctx, &reference, true);
        assert!(err < 1.0, "{name}: logits differ by {err} of the tolerance");
        // The adapter moved the model: its base's greedy tokens are not these.
        let base_ref = Reference::load(base);
        assert!(base_ref.prompts.iter().zip(&reference.prompts).all(|(b, a)| b.greedy != a.greedy));
    }
}

#[test]
fn llama_cpp_adapters_on_gguf_files_give_the_same_logits() {
    let reference = Reference::load("lora/tiny-llama-lora");
    let gguf = adapter("tiny-llama-lora-f32.gguf");
    // The fixture scripts' GGUF and llama.cpp's converter's: both interleave q and k rows, and
    // the adapter's rows of them are read the same way.
    for file in [gguf_fixture("tiny-llama-f32"), converted_fixture("tiny-llama-f32")] {
        let mut ctx = load(ModelSource::gguf(file.clone()), vec![Lora::new(&gguf)]).unwrap();
        let err = worst_error(&mut ctx, &reference, true);
        assert!(err < 1.0, "{}: logits differ by {err} of the tolerance", file.display());
    }
}

#[test]
fn an_adapter_on_a_quantized_file_is_merged_and_quantized_again() {
    // Q8_0 weights with the change added, then quantized again as stored, against the f32 file
    // with the change added and quantized to Q8_0 once, at load. The adapted model is more
    // sensitive to rounding than the base (the f32 weights with the adapter quantized once give
    // logits 2-3% of their range from transformers + PEFT's), so the check is that the second
    // rounding costs at most as much again, and that the result is the adapted model, not the base.
    let (reference, base) = (Reference::load("lora/tiny-llama-lora"), Reference::load("tiny-llama-f32"));
    let lora = || vec![Lora::new(adapter("tiny-llama-lora-f32.gguf"))];
    let mut stored = load(ModelSource::gguf(gguf_fixture("tiny-llama-q8_0")), lora()).unwrap();
    let opts =
        LoadOptions { adapters: lora(), weight_dtype: WeightDtype::Quant(QuantType::Q8_0), ..LoadOptions::default() };
    let model = load_model(None, Some(&ModelSource::gguf(gguf_fixture("tiny-llama-f32"))), &opts, &device()).unwrap();
    let mut at_load = Context::with_kv_dtype(model, 256, KvDtype::F32);
    for (s, (a, b)) in reference.prompts.iter().zip(&base.prompts).enumerate() {
        let row = |ctx: &mut Context| {
            ctx.decode(&one_sequence(&a.ids, s as u32, 0)).unwrap();
            ctx.outputs().row(0).unwrap().to_vec()
        };
        let (stored_row, once_row) = (row(&mut stored), row(&mut at_load));
        let range = a.last_logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let [twice, once, unadapted] = [
            max_abs_diff(&stored_row, &a.last_logits),
            max_abs_diff(&once_row, &a.last_logits),
            max_abs_diff(&stored_row, &b.last_logits),
        ]
        .map(|e| e / range);
        eprintln!(
            "prompt {s}: of the range, {twice:.2e} from the adapted model ({once:.2e} quantized once, {unadapted:.2e} from the base)"
        );
        assert!(twice < 2.0 * once && twice * 10.0 < unadapted, "prompt {s}");
    }
}

#[test]
fn scales_and_several_adapters_add_up() {
    let (reference, base) = (Reference::load("lora/tiny-llama-lora"), Reference::load("tiny-llama-f32"));
    let dir = || ModelSource::Dir(fixture_dir("tiny-llama-f32"));
    let scaled = |scale| Lora { path: adapter("tiny-llama-lora"), scale };
    // Scale 0 is the base model; two halves are the whole adapter.
    let mut ctx = load(dir(), vec![scaled(0.0)]).unwrap();
    assert!(worst_error(&mut ctx, &base, true) < 1.0);
    let mut ctx = load(dir(), vec![scaled(0.5), scaled(0.5)]).unwrap();
    assert!(worst_error(&mut ctx, &reference, true) < 1.0);
    // And so in llama.cpp's format.
    let gguf = |scale| Lora { path: adapter("tiny-llama-lora-f32.gguf"), scale };
    let mut ctx = load(ModelSource::gguf(gguf_fixture("tiny-llama-f32")), vec![gguf(0.25), gguf(0.75)]).unwrap();
    assert!(worst_error(&mut ctx, &reference, true) < 1.0);
}

#[test]
fn adapters_that_do_not_fit_the_model_are_refused_by_name() {
    let cases = [
        // A PEFT adapter on a GGUF file, and a GGUF adapter on a checkpoint.
        (ModelSource::gguf(gguf_fixture("tiny-llama-f32")), adapter("tiny-llama-lora"), "convert_lora_to_gguf"),
        (ModelSource::Dir(fixture_dir("tiny-llama-f32")), adapter("tiny-llama-lora-f32.gguf"), "GGUF model"),
        // A head's change for a model whose head is its embeddings.
        (ModelSource::Dir(fixture_dir("tiny-qwen3-f32")), adapter("tiny-llama-lora"), "lm_head.weight"),
        // Llama's adapter on a Qwen3 file.
        (ModelSource::gguf(gguf_fixture("tiny-qwen3-f32")), adapter("tiny-llama-lora-f32.gguf"), "`llama` model"),
        // A model given as its adapter, and no adapter at all.
        (ModelSource::Dir(fixture_dir("tiny-llama-f32")), fixture_dir("tiny-llama-f32"), "adapter_config.json"),
        (ModelSource::gguf(gguf_fixture("tiny-llama-f32")), gguf_fixture("tiny-llama-f32"), "not an adapter"),
        (ModelSource::Dir(fixture_dir("tiny-llama-f32")), adapter("no-such-adapter"), "adapter_config.json"),
    ];
    for (source, path, says) in cases {
        let err = match load(source, vec![Lora::new(&path)]) {
            Ok(_) => panic!("{} was merged", path.display()),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(says) && err.contains(&*path.to_string_lossy()), "{}: {err}", path.display());
    }
}
