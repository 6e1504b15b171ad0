//! Which kernel a model's linear layers run is chosen when the weights load, for their storage
//! and this CPU; the products are counted by kernel, and none ever falls back.

use llaisys_model::generate::greedy;
use llaisys_model::kernels::{calls, xwt_available};
use llaisys_model::quant::Kernel;
use llaisys_model::{Context, Device, LoadOptions, ModelSource, load_model};
use llaisys_tests::{fixture_dir, gguf_fixture};

fn count(kernel: &str) -> u64 {
    calls().into_iter().find(|(name, _)| *name == kernel).map_or(0, |(_, n)| n)
}

/// Decodes a few tokens from `source` and returns how many products ran on `kernel`.
fn products_on(source: ModelSource, kernel: &str) -> u64 {
    let model = load_model(None, Some(&source), &LoadOptions::default(), &Device::flex()).unwrap();
    let before = count(kernel);
    greedy(&mut Context::new(model, 64), 0, &[1, 2, 3], 4, &[]).unwrap();
    count(kernel) - before
}

#[test]
fn a_quantized_model_runs_the_quantized_kernel_this_cpu_has() {
    let kernel = match Kernel::best() {
        Kernel::Vnni => "quant_vnni",
        Kernel::Avx2 => "quant_avx2",
        Kernel::Portable => "quant_portable",
    };
    let products = products_on(ModelSource::gguf(gguf_fixture("tiny-tied-q8_0")), kernel);
    // 4 products per layer (qkv, o, gate_up, down) and the head, per step; 2 layers, 4 steps.
    assert!(products >= 4 * (2 * 4 + 1), "{products} products on {kernel}");
    assert_eq!(count("fallback"), 0, "a kernel refused the input its weight chose it for");
}

#[test]
fn a_dense_model_runs_the_dense_kernel_this_cpu_has() {
    let kernel = if xwt_available() { "xwt" } else { "burn_split" };
    let products = products_on(ModelSource::Dir(fixture_dir("tiny-bf16")), kernel);
    assert!(products > 0, "no product on {kernel}");
    assert_eq!(count("fallback"), 0, "a kernel refused the input its weight chose it for");
}
