//! Times `Linear::forward` (x·Wᵀ) at the demo model's shapes, for dense (f32, f16, bf16) and
//! quantized (Q8_0, Q5_0, Q4_0) weights, against Burn's plain matmul for the dense ones.
//! `cargo run --release -p llaisys-model --example linear_bench [rows,rows,...]`

mod common;

use std::sync::Arc;

use burn::tensor::{Device, Distribution, FloatDType, Tensor};
use common::time;
use llaisys_model::layers::Linear;
use llaisys_model::layers::linear::{self, Matrix};
use llaisys_model::quant::{PackedMatrix, QuantType};

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
        let values: Vec<f32> = weight.clone().into_data().try_to_vec().expect("f32");
        let dense = [FloatDType::F32, FloatDType::F16, FloatDType::BF16]
            .map(|d| (format!("{d:?}"), linear::dense(weight.clone().cast(d))));
        let packed = [QuantType::Q8_0, QuantType::Q5_0, QuantType::Q4_0].map(|q| {
            (
                q.name().to_string(),
                linear::packed(Arc::new(PackedMatrix::quantize(q, out, input, &values).expect("quantizes"))),
            )
        });
        for (kind, weight) in dense.into_iter().chain(packed) {
            let linear = Linear { weight, bias: None };
            let bytes = linear.weight.size_bytes() as f64;
            for &n in &rows {
                let x: Tensor<2> = Tensor::random([n, input], Distribution::Uniform(-1.0, 1.0), &device);
                let t = time(|| drop(linear.forward(x.clone()).into_data()));
                let plain = match linear.weight.matrix() {
                    Matrix::Dense(w) => {
                        let dtype: FloatDType = w.dtype().into();
                        time(|| {
                            drop(x.clone().cast(dtype).matmul(w.clone().transpose()).cast(FloatDType::F32).into_data())
                        }) * 1e3
                    }
                    Matrix::Packed(_) | Matrix::Blocks(..) | Matrix::DenseParts(_) => f64::NAN,
                };
                println!(
                    "{out:>8} {input:>6} {n:>6} {kind:>5}  {:>10.3} {:>8.1} {:>8.1}  {plain:>10.3}",
                    t * 1e3,
                    bytes / t / 1e9,
                    2.0 * (n * out * input) as f64 / t / 1e9,
                );
            }
        }
    }
}
