//! Times a mixture-of-experts decode step's expert products on the CPU: each layer's chosen
//! experts run one product at a time (`quant::matmul`), or each layer's gate/up products in one
//! parallel loop and its down products in another (`quant::matmul_each`, as `Moe` runs packed
//! experts). The experts are distinct matrices, more of them than the caches hold, so every
//! product streams its weights from memory, as a real model's do.
//! `cargo run --release -p llaisys-model --example experts_bench [layers,experts,chosen]
//! [hidden,width]` (default 12 layers of 8 experts chosen among 32 at qwen3-moe-mini's
//! 2048,768: gate/up Q4_K, down Q6_K, as its Q4_K_M file stores them).

mod common;

use llaisys_model::quant::{self, PackedMatrix, Product, QuantType};

use common::{random_blocks, time};

fn main() {
    let mut args = std::env::args().skip(1);
    let parse = |a: String| -> Vec<usize> { a.split(',').map(|r| r.parse().expect("integers")).collect() };
    let counts = args.next().map(parse).unwrap_or_else(|| vec![12, 32, 8]);
    let shape = args.next().map(parse).unwrap_or_else(|| vec![2048, 768]);
    let (&[layers, experts, chosen], &[hidden, width]) = (&counts[..], &shape[..]) else {
        panic!("the arguments are layers,experts,chosen and hidden,width")
    };
    // The experts each layer's step runs: `chosen` of its own `experts`.
    let steps = layers * chosen;
    let matrix = |ty: QuantType, rows: usize, k: usize, seed: usize| {
        PackedMatrix::from_ggml(ty, rows, k, &random_blocks(ty, rows, k, seed as u64)).expect("packs")
    };
    let gate_up: Vec<PackedMatrix> = (0..steps).map(|e| matrix(QuantType::Q4K, 2 * width, hidden, e)).collect();
    let down: Vec<PackedMatrix> = (0..steps).map(|e| matrix(QuantType::Q6K, hidden, width, steps + e)).collect();
    let bytes: f64 = gate_up.iter().chain(&down).map(|m| m.size_bytes() as f64).sum();
    println!(
        "{layers} layers, {chosen} of {experts} experts each, [{}, {hidden}] Q4_K and [{hidden}, {width}] Q6_K: {:.0} MB a step",
        2 * width,
        bytes / 1e6
    );
    let x: Vec<f32> = (0..hidden).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let h: Vec<f32> = (0..width).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let kernel = quant::Kernel::best();
    for round in 1..=3 {
        let alone = time(|| {
            for (g, d) in gate_up.iter().zip(&down) {
                drop(quant::matmul(&x, 1, g, None));
                drop(quant::matmul(&h, 1, d, None));
            }
        });
        let together = time(|| {
            for layer in 0..layers {
                let experts = layer * chosen..(layer + 1) * chosen;
                let run = |x: &[f32], ws: &[PackedMatrix]| {
                    let products: Vec<Product<'_>> = ws.iter().map(|w| Product { x, m: 1, w, bias: None }).collect();
                    drop(quant::matmul_each(kernel, &products));
                };
                run(&x, &gate_up[experts.clone()]);
                run(&h, &down[experts]);
            }
        });
        println!(
            "round {round}: one at a time {:.2} ms ({:.1} GB/s), a layer's together {:.2} ms ({:.1} GB/s): {:.2}x",
            alone * 1e3,
            bytes / alone / 1e9,
            together * 1e3,
            bytes / together / 1e9,
            alone / together
        );
    }
}
