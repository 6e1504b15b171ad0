//! Times `Linear::forward` (x·Wᵀ) at the demo model's shapes against Burn's plain matmul.
//! `cargo run --release -p llaisys-model --example linear_bench [rows,rows,...]`

use std::time::Instant;

use burn::tensor::{Device, Distribution, FloatDType, Tensor};
use llaisys_model::layers::Linear;

fn time(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut runs = 0;
    while start.elapsed().as_secs_f64() < 0.5 {
        f();
        runs += 1;
    }
    start.elapsed().as_secs_f64() / runs as f64
}

fn main() {
    let rows: Vec<usize> = std::env::args()
        .nth(1)
        .map(|a| a.split(',').map(|r| r.parse().expect("rows must be integers")).collect())
        .unwrap_or_else(|| vec![1, 4, 16, 32, 64, 128, 512]);
    let device = Device::flex();
    println!(
        "{:>8} {:>6} {:>6} {:>5}  {:>10} {:>8} {:>8}  {:>10}",
        "out", "in", "rows", "dtype", "linear ms", "GB/s", "GFLOP/s", "matmul ms"
    );
    for (out, input) in [(896, 896), (4864, 896), (896, 4864), (151936, 896)] {
        let weight: Tensor<2> = Tensor::random([out, input], Distribution::Uniform(-1.0, 1.0), &device);
        for dtype in [FloatDType::F32, FloatDType::F16] {
            let linear = Linear { weight: weight.clone().cast(dtype), bias: None };
            let bytes = (out * input * if dtype == FloatDType::F32 { 4 } else { 2 }) as f64;
            for &n in &rows {
                let x: Tensor<2> = Tensor::random([n, input], Distribution::Uniform(-1.0, 1.0), &device);
                let t = time(|| drop(linear.forward(x.clone()).into_data()));
                let w = linear.weight.clone();
                let plain = time(|| {
                    drop(x.clone().cast(dtype).matmul(w.clone().transpose()).cast(FloatDType::F32).into_data())
                });
                println!(
                    "{out:>8} {input:>6} {n:>6} {:>5}  {:>10.3} {:>8.1} {:>8.1}  {:>10.3}",
                    format!("{dtype:?}"),
                    t * 1e3,
                    bytes / t / 1e9,
                    2.0 * (n * out * input) as f64 / t / 1e9,
                    plain * 1e3
                );
            }
        }
    }
}
