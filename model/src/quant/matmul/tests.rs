//! Quantized products against f64 products over the dequantized weights, for every format and
//! every kernel, over the model's shapes (896, 4864 and 151936 rows) and ragged tails.

use half::f16;

use super::*;
use crate::quant::{QuantType, dequantize, row_bytes, test_values};

/// Random blocks of `ty`: random bytes with every f16 scale replaced by a sane value (random
/// bytes would give infinities and NaNs), so all other fields take arbitrary bit patterns.
pub(crate) fn random_blocks(ty: QuantType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
    let n = rows * row_bytes(ty, k);
    let noise = test_values(n, seed);
    let mut bytes: Vec<u8> = noise.iter().map(|v| ((v + 1.0) * 127.9) as u8).collect();
    let scales = test_values(n / ty.block_bytes() * 2, seed + 1);
    let scale = |i: usize, lo: f32| f16::from_f32((lo + 0.05 * scales[i].abs()) * scales[i].signum());
    let fields = ty.f16_fields();
    for (b, block) in bytes.chunks_exact_mut(ty.block_bytes()).enumerate() {
        for (f, &at) in fields.iter().enumerate() {
            let mut v = scale(2 * b + f, 0.002);
            if ty.is_k() {
                v = f16::from_f32(v.to_f32().abs() * 0.1); // K-quant super-scales multiply 6/8-bit sub-scales
            }
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
        if ty == QuantType::Mxfp4 {
            block[0] = 112 + (b % 13) as u8; // E8M0 scales 2^-16 .. 2^-4 (levels up to 12)
        }
    }
    bytes
}

fn reference(x: &[f32], m: usize, w: &[f32], n: usize, k: usize, bias: Option<&[f32]>) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|t| x[i * k + t] as f64 * w[j * k + t] as f64).sum();
            out[i * n + j] = dot + bias.map_or(0.0, |b| b[j] as f64);
        }
    }
    out
}

/// The error a quantized product may have: llama.cpp's `test-quantize-fns` allows a dot-product
/// error of 0.02 per element of its data; here the bound follows the activation rounding itself.
/// Each activation is off by at most half a step d/2 (d = max|x|/127 of its block), uniformly, so
/// the error of output j has σ ≤ ‖w_j‖ · max d / √12; allow 5σ, plus f32 rounding.
fn tolerance(x: &[f32], w_row: &[f32]) -> f64 {
    let max_d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
    let norm = w_row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
    let abs: f64 = w_row.iter().zip(x).map(|(w, x)| (*w as f64 * *x as f64).abs()).sum();
    5.0 * norm * max_d / 12f64.sqrt() + 1e-5 * abs + 1e-6
}

fn check(kernel: Kernel, ty: QuantType, m: usize, n: usize, k: usize) {
    assert!(kernel.available(), "the build machine runs {kernel:?} and this one does not");
    let bytes = random_blocks(ty, n, k, (m * 31 + n * 7 + k) as u64);
    let packed = PackedMatrix::from_ggml(ty, n, k, &bytes).unwrap();
    let mut w = vec![0.0f32; n * k];
    dequantize(ty, &bytes, &mut w);
    // The packed layout dequantizes to exactly ggml's values.
    let mut row = vec![0.0f32; k];
    for j in [0, n / 2, n - 1] {
        packed.dequantize_row(j, &mut row);
        assert_eq!(row, w[j * k..(j + 1) * k], "{ty} [{n}, {k}] row {j}");
    }
    let x: Vec<f32> = test_values(m * k, 77).iter().map(|v| v * 3.0).collect();
    let bias = test_values(n, 5);
    let want = reference(&x, m, &w, n, k, Some(&bias));
    let got = matmul_with(kernel, &x, m, &packed, Some(&bias));
    assert_eq!(got.len(), m * n);
    let mut worst = 0.0f64;
    for i in 0..m {
        let xi = &x[i * k..(i + 1) * k];
        for j in 0..n {
            let err = (got[i * n + j] as f64 - want[i * n + j]).abs();
            let tol = tolerance(xi, &w[j * k..(j + 1) * k]);
            assert!(
                err <= tol,
                "{ty} {kernel:?} [{m}, {n}, {k}] ({i}, {j}): {} vs {} (tolerance {tol})",
                got[i * n + j],
                want[i * n + j]
            );
            worst = worst.max(err / tol);
        }
    }
    // llama.cpp's own criterion, on the worst output.
    let per_element = (0..m * n).map(|e| (got[e] as f64 - want[e]).abs()).fold(0.0, f64::max) / k as f64;
    assert!(per_element < 0.02, "{ty} {kernel:?}: error per element {per_element}");
    eprintln!("{ty} {kernel:?} [{m}, {n}, {k}]: worst error {worst:.2} of the tolerance");
}

/// Every format's product on `kernel`, on one row with a ragged panel, a full tile with a tail of
/// rows, and ffn_down's shape.
fn every_format(kernel: Kernel) {
    for ty in QuantType::ALL {
        let k = ty.block_values() * 2;
        check(kernel, ty, 1, 37, k);
        // Tiles of 8 and 3 rows, then 8 and 6 (the VNNI kernel's interleaved rows from 4 on).
        check(kernel, ty, 11, 16, k);
        check(kernel, ty, 14, 37, k);
        check(kernel, ty, 2, 896, 4864);
    }
}

/// The 32-value formats on gate/up's shape (896 is 28 blocks of 32, an odd number of pairs),
/// three blocks (the second group of the last record is padding) and the lm head's rows.
fn model_shapes(kernel: Kernel) {
    for ty in [QuantType::Q8_0, QuantType::Q5_0, QuantType::Q4_1] {
        check(kernel, ty, 3, 4864, 896);
        check(kernel, ty, 1, 130, 96);
    }
    check(kernel, QuantType::Q8_0, 1, 151936, 32);
}

#[test]
fn every_format_matches_the_dequantized_product_on_the_portable_kernel() {
    every_format(Kernel::Portable);
}

#[test]
#[cfg_attr(not(cpu_avx512_vnni), ignore = "this CPU has no AVX-512 VNNI (the kernel does not run here)")]
fn every_format_matches_the_dequantized_product_on_the_vnni_kernel() {
    every_format(Kernel::Vnni);
}

#[test]
#[cfg_attr(not(cpu_avx2), ignore = "this CPU has no AVX2, FMA and F16C (the kernel does not run here)")]
fn every_format_matches_the_dequantized_product_on_the_avx2_kernel() {
    every_format(Kernel::Avx2);
}

/// The AVX2 kernel's K-quant path that multiplies the sub-block scales into the integer sums
/// gives the float path's outputs on the same activations (one scale per super-block), to f32
/// rounding (the float path rounds each group's terms; 1e-4 of the output): for every tile
/// height, both halves of ragged panels, and several super-blocks.
#[test]
#[cfg_attr(not(cpu_avx2), ignore = "this CPU has no AVX2, FMA and F16C (the kernel does not run here)")]
fn avx2_integer_scales_equal_the_float_path() {
    for ty in QuantType::ALL.into_iter().filter(|ty| ty.is_k()) {
        for m in [1, 2, 3, 4, 5, 6, 7, 13] {
            let (n, k) = (45, 768);
            let packed = PackedMatrix::from_ggml(ty, n, k, &random_blocks(ty, n, k, m as u64)).unwrap();
            let x: Vec<f32> = test_values(m * k, 3 + m as u64).iter().map(|v| v * 4.0).collect();
            let mut acts = Activations::quantize(&x, m, k, k / GROUP, 8);
            let part = &packed.parts[0];
            let run = |acts: &Activations| {
                let mut out = vec![0.0f32; m * n];
                let mut rows: Vec<&mut [f32]> = out.chunks_mut(n).collect();
                avx2::run(part, 0..part.panels(), acts, 0..m, &mut rows, None);
                out
            };
            let integer = run(&acts);
            acts.shared = 1; // the same values, through the float path
            let float = run(&acts);
            for (e, (a, b)) in integer.iter().zip(&float).enumerate() {
                assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{ty} m={m} output {e}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn thirty_two_value_formats_take_the_model_shapes_on_the_portable_kernel() {
    model_shapes(Kernel::Portable);
}

#[test]
#[cfg_attr(not(cpu_avx512_vnni), ignore = "this CPU has no AVX-512 VNNI (the kernel does not run here)")]
fn thirty_two_value_formats_take_the_model_shapes_on_the_vnni_kernel() {
    model_shapes(Kernel::Vnni);
}

#[test]
#[cfg_attr(not(cpu_avx2), ignore = "this CPU has no AVX2, FMA and F16C (the kernel does not run here)")]
fn thirty_two_value_formats_take_the_model_shapes_on_the_avx2_kernel() {
    model_shapes(Kernel::Avx2);
}

/// Stacked parts in different formats: each part's outputs land in its own columns.
#[test]
fn stacked_parts_keep_their_formats_and_columns() {
    let k = 256;
    let parts = [(QuantType::Q5_0, 40), (QuantType::Q8_0, 17), (QuantType::Q6K, 16)];
    let mut matrices = Vec::new();
    let mut w = Vec::new();
    for (i, &(ty, rows)) in parts.iter().enumerate() {
        let bytes = random_blocks(ty, rows, k, i as u64);
        let mut dq = vec![0.0f32; rows * k];
        dequantize(ty, &bytes, &mut dq);
        w.extend(dq);
        matrices.push(PackedMatrix::from_ggml(ty, rows, k, &bytes).unwrap());
    }
    let stacked = PackedMatrix::stack(matrices).unwrap();
    assert_eq!((stacked.rows(), stacked.k()), (73, k));
    let m = 5;
    let x = test_values(m * k, 9);
    let want = reference(&x, m, &w, 73, k, None);
    let got = matmul(&x, m, &stacked, None);
    for i in 0..m {
        for j in 0..73 {
            let tol = tolerance(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
            assert!((got[i * 73 + j] as f64 - want[i * 73 + j]).abs() <= tol, "({i}, {j})");
        }
    }
}

/// Several products in one loop ([`matmul_each`]) give each product's own output, bit for bit:
/// formats and widths that differ, a stacked matrix of two formats, a bias, no rows, one row
/// (a decode step's experts), more rows than a chunk of activations, and products that read the
/// same input; on every kernel here.
#[test]
fn products_run_together_equal_each_run_alone() {
    let single = |ty: QuantType, rows: usize, k: usize, seed: u64| {
        PackedMatrix::from_ggml(ty, rows, k, &random_blocks(ty, rows, k, seed)).unwrap()
    };
    let stacked =
        PackedMatrix::stack(vec![single(QuantType::Q4K, 40, 512, 1), single(QuantType::Q8_0, 23, 512, 2)]).unwrap();
    let weights = [
        (single(QuantType::Q4K, 1536, 256, 3), 1),
        (single(QuantType::Q6K, 256, 768, 4), 1),
        (stacked, 3),
        (single(QuantType::Q5_0, 37, 64, 5), 0),
        (single(QuantType::Q8_0, 200, 256, 6), 300),
        (single(QuantType::Q4K, 16, 256, 7), 1),
    ];
    let inputs: Vec<Vec<f32>> =
        weights.iter().enumerate().map(|(i, (w, m))| test_values(m * w.k(), 40 + i as u64)).collect();
    let bias = test_values(63, 8);
    let mut products: Vec<Product<'_>> = weights
        .iter()
        .zip(&inputs)
        .enumerate()
        .map(|(i, ((w, m), x))| Product { x, m: *m, w, bias: (i == 2).then_some(bias.as_slice()) })
        .collect();
    // Two more on the first product's input (quantized once for those that quantize it alike:
    // not the AVX2 kernel's Q8_0 beside its K-quants).
    let (q4k, q8) = (single(QuantType::Q4K, 48, 256, 9), single(QuantType::Q8_0, 48, 256, 10));
    products.push(Product { w: &q4k, ..products[0] });
    products.push(Product { w: &q8, ..products[0] });
    for kernel in [Kernel::Portable, Kernel::Avx2, Kernel::Vnni].into_iter().filter(|k| k.available()) {
        let together = matmul_each(kernel, &products);
        assert_eq!(together.len(), products.len());
        for (i, (p, got)) in products.iter().zip(&together).enumerate() {
            let alone = matmul_with(kernel, p.x, p.m, p.w, p.bias);
            assert_eq!(got.len(), p.m * p.w.rows(), "{kernel:?} product {i}");
            assert!(got.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "{kernel:?} product {i}");
        }
    }
    assert!(matmul_each(Kernel::Portable, &[]).is_empty());
}

/// In-situ quantization: a product with quantized weights is close to the f32 product.
#[test]
fn quantized_f32_weights_multiply_close_to_the_originals() {
    let (m, n, k) = (4, 50, 128);
    let w = test_values(n * k, 21);
    let x = test_values(m * k, 22);
    let want = reference(&x, m, &w, n, k, None);
    for (ty, rel) in [(QuantType::Q8_0, 0.01), (QuantType::Q4_0, 0.12), (QuantType::Q5_1, 0.05)] {
        let packed = PackedMatrix::quantize(ty, n, k, &w).unwrap();
        let got = matmul(&x, m, &packed, None);
        let err = got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).powi(2)).sum::<f64>().sqrt();
        let norm = want.iter().map(|w| w * w).sum::<f64>().sqrt();
        assert!(err / norm < rel, "{ty}: relative error {}", err / norm);
    }
    assert!(PackedMatrix::quantize(QuantType::Q4K, n, k, &w).is_err());
    assert!(PackedMatrix::quantize(QuantType::Q8_0, n, 100, &test_values(n * 100, 1)).is_err());
}

/// The VNNI kernel keeps every product but one-row products all in Q6_K, which go to the AVX2
/// kernel where 512-bit instructions run as two halves (Zen 4); any other kernel asked for is
/// the one that runs.
#[test]
fn only_one_row_q6_k_products_leave_the_vnni_kernel_and_only_on_a_zen_4() {
    let (k, n) = (256, 32);
    let q6 = PackedMatrix::from_ggml(QuantType::Q6K, n, k, &random_blocks(QuantType::Q6K, n, k, 1)).unwrap();
    let q4 = PackedMatrix::from_ggml(QuantType::Q4K, n, k, &random_blocks(QuantType::Q4K, n, k, 2)).unwrap();
    let mixed = PackedMatrix::stack(vec![q4.clone(), q6.clone()]).unwrap();
    let halves = vnni::halves_512();
    assert_eq!(Kernel::Vnni.for_product(&q6, 1), if halves { Kernel::Avx2 } else { Kernel::Vnni });
    for (w, m) in [(&q6, 2), (&q6, 4), (&q4, 1), (&mixed, 1)] {
        assert_eq!(Kernel::Vnni.for_product(w, m), Kernel::Vnni, "{w:?}, {m} rows");
    }
    for kernel in [Kernel::Avx2, Kernel::Portable] {
        assert_eq!(kernel.for_product(&q6, 1), kernel);
    }
}
