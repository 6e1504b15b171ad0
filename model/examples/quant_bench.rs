//! Times the quantized x·Wᵀ on weights in a GGUF file's block formats (K-quants included; random
//! blocks, not quantized values) at a real model's shapes, and reports the bytes streamed
//! per second, to compare with the machine's memory bandwidth.
//! `cargo run --release -p llaisys-model --example quant_bench [rows,rows,...] [hidden,inter,vocab]
//! [TYPE,TYPE,...] [vnni|avx2|portable]` (default rows 1,4,16,512 at Qwen2.5-1.5B's shape
//! 1536,8960,151936, types Q4_K,Q6_K,Q5_K,Q8_0,Q4_0, the CPU's best kernel).

mod common;

use llaisys_model::quant::{self, Kernel, PackedMatrix, QuantType};

use common::{random_blocks, time};

fn main() {
    let mut args = std::env::args().skip(1);
    let parse = |a: String| -> Vec<usize> { a.split(',').map(|r| r.parse().expect("integers")).collect() };
    let rows = args.next().map(parse).unwrap_or_else(|| vec![1, 4, 16, 512]);
    let shape = args.next().map(parse).unwrap_or_else(|| vec![1536, 8960, 151936]);
    let [hidden, inter, vocab] = shape[..] else { panic!("the shape is hidden,inter,vocab") };
    let types: Vec<QuantType> = match args.next() {
        Some(names) => names
            .split(',')
            .map(|n| QuantType::ALL.into_iter().find(|t| t.name() == n).unwrap_or_else(|| panic!("no format {n}")))
            .collect(),
        None => vec![QuantType::Q4K, QuantType::Q6K, QuantType::Q5K, QuantType::Q8_0, QuantType::Q4_0],
    };
    let kernel = match args.next().as_deref() {
        None => Kernel::best(),
        Some("vnni") => Kernel::Vnni,
        Some("avx2") => Kernel::Avx2,
        Some("portable") => Kernel::Portable,
        Some(other) => panic!("no kernel {other} (vnni, avx2, portable)"),
    };
    assert!(kernel.available(), "this CPU does not run the {kernel:?} kernel");
    println!("{:>8} {:>6} {:>6} {:>5}  {:>10} {:>8} {:>8}", "out", "in", "rows", "type", "ms", "GB/s", "GOP/s");
    for (out, input) in [(2 * inter, hidden), (hidden, inter), (vocab, hidden)] {
        for &ty in &types {
            if !ty.fits_row(input) {
                // As llama.cpp's quantizer does, a file stores such rows in a 32-value format.
                println!("{out:>8} {input:>6} {:>6} {:>5}  rows of {input} are not whole blocks", "-", ty.name());
                continue;
            }
            let w = PackedMatrix::from_ggml(ty, out, input, &random_blocks(ty, out, input, 0)).expect("packs");
            let bytes = w.size_bytes() as f64;
            for &n in &rows {
                let x: Vec<f32> = (0..n * input).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
                let t = time(|| drop(quant::matmul_with(kernel, &x, n, &w, None)));
                println!(
                    "{out:>8} {input:>6} {n:>6} {:>5}  {:>10.3} {:>8.1} {:>8.1}",
                    ty.name(),
                    t * 1e3,
                    bytes / t / 1e9,
                    2.0 * (n * out * input) as f64 / t / 1e9
                );
            }
        }
    }
}
