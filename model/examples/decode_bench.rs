//! Times the products of batch-1 decode steps back to back, as a forward pass runs them: every
//! layer's own weights (so they stream from memory, not from the cache), inside the compute
//! pool with its threads kept awake (`kernels::with_awake_pool`), the norms and attention left
//! out. Reports the bytes streamed per second, to set beside `quant_bench`'s one-product figures
//! and the machine's memory bandwidth: what is lost between and at the ends of the products.
//! `cargo run --release -p llaisys-model --example decode_bench [hidden,inter,vocab,layers,kv]
//! [seconds]` (default Qwen2.5-1.5B's shape 1536,8960,151936,28,256 in llama.cpp's Q4_K_M mix:
//! Q4_K but for every other layer's down projection and the tied head, in Q6_K).

mod common;

use std::time::Instant;

use burn::tensor::Device;
use llaisys_model::kernels::with_awake_pool;
use llaisys_model::quant::{self, Kernel, PackedMatrix, Product, QuantType};

use common::random_blocks;

fn main() {
    let mut args = std::env::args().skip(1);
    let shape: Vec<usize> = args
        .next()
        .map(|a| a.split(',').map(|v| v.parse().expect("integers")).collect())
        .unwrap_or_else(|| vec![1536, 8960, 151936, 28, 256]);
    let [hidden, inter, vocab, layers, kv] = shape[..] else { panic!("the shape is hidden,inter,vocab,layers,kv") };
    let seconds: f64 = args.next().map(|s| s.parse().expect("seconds")).unwrap_or(5.0);
    let pack = |ty: QuantType, out: usize, input: usize, seed: u64| {
        PackedMatrix::from_ggml(ty, out, input, &random_blocks(ty, out, input, seed)).expect("packs")
    };
    // Per layer: q, k and v fused, the output projection, gate and up fused, down.
    let mut weights = Vec::new();
    for layer in 0..layers {
        let down = if layer % 2 == 0 { QuantType::Q6K } else { QuantType::Q4K };
        let seed = 4 * layer as u64;
        weights.push(pack(QuantType::Q4K, hidden + 2 * kv, hidden, seed));
        weights.push(pack(QuantType::Q4K, hidden, hidden, seed + 1));
        weights.push(pack(QuantType::Q4K, 2 * inter, hidden, seed + 2));
        weights.push(pack(down, hidden, inter, seed + 3));
    }
    weights.push(pack(QuantType::Q6K, vocab, hidden, u64::MAX));
    let bytes: usize = weights.iter().map(|w| w.size_bytes()).sum();
    let x_hidden: Vec<f32> = (0..hidden).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let x_inter: Vec<f32> = (0..inter).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let pass = || {
        for w in &weights {
            let x = if w.k() == hidden { &x_hidden } else { &x_inter };
            let out = quant::matmul_each(Kernel::best(), &[Product { x, m: 1, w, bias: None }]);
            std::hint::black_box(out);
        }
    };
    let pool = rayon::ThreadPoolBuilder::new().build().expect("a pool");
    let device = Device::flex();
    let (passes, elapsed) = pool.install(|| {
        with_awake_pool(&device, pass);
        let start = Instant::now();
        let mut passes = 0;
        while start.elapsed().as_secs_f64() < seconds {
            with_awake_pool(&device, pass);
            passes += 1;
        }
        (passes, start.elapsed().as_secs_f64())
    });
    let per_pass = elapsed / passes as f64;
    println!(
        "{} threads, {:.0} MB a pass: {:.2} ms a pass, {:.1} passes/s, {:.1} GB/s",
        pool.current_num_threads(),
        bytes as f64 / 1e6,
        per_pass * 1e3,
        1.0 / per_pass,
        bytes as f64 / per_pass / 1e9
    );
}
