//! The layer functions on the device under test (`LLAISYS_TEST_DEVICE`: the CPU kernels on the
//! CPU, issue 31's CubeCL kernels on a GPU backend; Mesa's llvmpipe in CI) against f64
//! references on awkward shapes: rows not a multiple of a cube's units, GQA ratios 1, 2 and 7,
//! head_dim 64 and 128, masked rows, strided inputs. On a GPU device each test also checks, by
//! the runtime's launch count, that its kernel ran (and not the Burn ops it replaces).

use std::sync::{Mutex, PoisonError};

use burn::tensor::DType;
use llaisys_model::arch::Activation;
use llaisys_model::kernels::gpu_fused_rows;
use llaisys_model::layers::{RmsNorm, Rope, Sinks, attention, swiglu};
use llaisys_model::{Device, DeviceSpec, Tensor, TensorData};
use llaisys_tests::test_device;

fn device() -> (DeviceSpec, Device) {
    let spec = test_device().parse::<DeviceSpec>().unwrap();
    (spec, spec.device().unwrap())
}

/// Deterministic values in [−scale, scale).
fn values(len: usize, seed: u32, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|i| ((((i as u32 ^ seed).wrapping_mul(2654435761) >> 16) % 2000) as f32 / 1000.0 - 1.0) * scale)
        .collect()
}

fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec::<f32>().unwrap()
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((*g as f64 - w).abs() <= tol * w.abs().max(1.0), "{what}[{i}]: {g} vs {w}");
    }
}

/// `v` as stored in `dtype`, read back as f32.
fn rounded(v: &[f32], dtype: burn::tensor::FloatDType, device: &Device) -> Vec<f32> {
    let t = Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), device);
    host(t.cast(dtype).cast(burn::tensor::FloatDType::F32))
}

/// A layer's cache ([heads, capacity, d], as f32) after a write: the cell `slots[t]` of head h
/// holds `new(t, h)` (within `tol`, relative), every other cell what it held before.
fn assert_cells(
    cache: &[f32],
    stored: &[f32],
    slots: &[usize],
    (heads, capacity, d): (usize, usize, usize),
    new: impl Fn(usize, usize) -> Vec<f32>,
    tol: f32,
    what: &str,
) {
    for h in 0..heads {
        for cell in 0..capacity {
            let at = (h * capacity + cell) * d;
            let want = match slots.iter().position(|&s| s == cell) {
                Some(t) => new(t, h),
                None => stored[at..at + d].to_vec(),
            };
            let got = &cache[at..at + d];
            assert!(
                got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= tol * w.abs().max(1.0)),
                "{what} head {h} cell {cell}: {got:?} vs {want:?}"
            );
        }
    }
}

/// Runs `f`, then, on a GPU device, checks that a kernel whose name contains `kernel` (case and
/// underscores ignored) was launched.
/// One launch watch at a time in this process (a second would replace the first).
fn ran<T>(spec: DeviceSpec, kernel: &str, f: impl FnOnce() -> T) -> T {
    ran_all(spec, &[kernel], f)
}

/// [`ran`] for each of `kernels`.
fn ran_all<T>(spec: DeviceSpec, kernels: &[&str], f: impl FnOnce() -> T) -> T {
    static ONE_WATCH: Mutex<()> = Mutex::new(());
    let _one = ONE_WATCH.lock().unwrap_or_else(PoisonError::into_inner);
    let watch = llaisys_model::launches::watch(false);
    let out = f();
    if let Some(watch) = watch.filter(|_| spec != DeviceSpec::Cpu) {
        let launched = watch.take();
        let key = |s: &str| s.to_ascii_lowercase().replace('_', "");
        for kernel in kernels {
            assert!(
                launched.by_kernel.keys().any(|k| key(k).contains(&key(kernel))),
                "no {kernel} kernel ran on {spec}: {:?}",
                launched.by_kernel.keys().collect::<Vec<_>>()
            );
        }
    }
    out
}

#[test]
fn rms_norm_matches_a_reference() {
    let (spec, device) = device();
    // 66,000 rows: more cubes than one grid dimension holds.
    for (n, h) in [(1, 8), (3, 200), (2, 896), (5, 13), (66_000, 4)] {
        let x = values(n * h, 7, 3.0);
        let w = values(h, 11, 2.0);
        let norm = RmsNorm { weight: Tensor::from_data(TensorData::new(w.clone(), [h]), &device), eps: 1e-6 };
        let input = Tensor::<2>::from_data(TensorData::new(x.clone(), [n, h]), &device);
        let got = ran(spec, "rms_norm", || host(norm.forward(input)));
        let mut want = Vec::with_capacity(n * h);
        for row in x.chunks(h) {
            let scale = 1.0 / (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / h as f64 + 1e-6).sqrt();
            want.extend(row.iter().zip(&w).map(|(&v, &w)| v as f64 * scale * w as f64));
        }
        assert_close(&got, &want, 1e-5, &format!("rms_norm {n}x{h}"));
    }
}

/// SwiGLU (the device's kernel) and GeGLU (Gemma's; Burn's ops on a GPU).
#[test]
fn swiglu_and_geglu_match_a_reference_on_a_strided_input() {
    let (spec, device) = device();
    let (n, i) = (3, 300);
    // The stacked projection's [gate | up] as a narrowed view of a wider tensor.
    let wide = values(n * (2 * i + 5), 3, 8.0);
    let clamped = Activation::ClampedSwiglu { alpha: 1.702, limit: 3.0 };
    for act in [Activation::Silu, Activation::GeluTanh, clamped] {
        let gate_up =
            Tensor::<2>::from_data(TensorData::new(wide.clone(), [n, 2 * i + 5]), &device).narrow(1, 0, 2 * i);
        let run = || host(swiglu(gate_up, act));
        let got = if act == Activation::Silu { ran(spec, "swiglu", run) } else { run() };
        let mut want = Vec::with_capacity(n * i);
        for row in wide.chunks(2 * i + 5) {
            for j in 0..i {
                let (g, u) = (row[j] as f64, row[i + j] as f64);
                let gated = match act {
                    Activation::Silu => g / (1.0 + (-g).exp()) * u,
                    Activation::GeluTanh => {
                        0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh()) * u
                    }
                    // gpt-oss's (Burn's ops on a GPU).
                    Activation::ClampedSwiglu { alpha, limit } => {
                        let (alpha, limit) = (alpha as f64, limit as f64);
                        let (g, u) = (g.min(limit), u.clamp(-limit, limit));
                        g / (1.0 + (-alpha * g).exp()) * (u + 1.0)
                    }
                };
                want.push(gated);
            }
        }
        assert_close(&got, &want, 1e-5, &format!("{act:?}"));
    }
}

#[test]
fn rope_rotates_q_and_k_and_keeps_v() {
    let (spec, device) = device();
    for (heads, kv_heads, d) in [(2, 1, 64), (7, 1, 128), (4, 4, 64)] {
        let n = 3;
        let positions = [0, 9, 1000];
        let width = (heads + 2 * kv_heads) * d;
        let x = values(n * width, 5, 2.0);
        let rope = Rope::new(d, 1_000_000.0);
        let tables = rope.tables(&positions, &device);
        let qkv = Tensor::<2>::from_data(TensorData::new(x.clone(), [n, width]), &device);
        let (q_cols, k_cols) = (0..heads * d, heads * d..(heads + kv_heads) * d);
        let [q, k, v] = ran(spec, "rope", || Rope::apply_qk(qkv, q_cols, k_cols, &tables, None)).map(host);
        let half = d / 2;
        let (mut want_q, mut want_k, mut want_v) = (vec![], vec![], vec![]);
        for (token, row) in x.chunks(width).enumerate() {
            for head in 0..heads + kv_heads {
                let x = &row[head * d..(head + 1) * d];
                let mut out = vec![0.0; d];
                for i in 0..half {
                    let freq = 1.0 / 1_000_000f64.powf((2 * i) as f64 / d as f64);
                    let angle = positions[token] as f64 * freq;
                    let (cos, sin) = (angle.cos(), angle.sin());
                    out[i] = x[i] as f64 * cos - x[i + half] as f64 * sin;
                    out[i + half] = x[i + half] as f64 * cos + x[i] as f64 * sin;
                }
                if head < heads { want_q.extend(out) } else { want_k.extend(out) }
            }
            want_v.extend(row[(heads + kv_heads) * d..].iter().map(|&v| v as f64));
        }
        // f32 angles (as transformers computes them) at position 1,000: a few ulps of the angle.
        let what = format!("rope heads {heads}/{kv_heads} d {d}");
        assert_close(&q, &want_q, 2e-3, &format!("{what} q"));
        assert_close(&k, &want_k, 2e-3, &format!("{what} k"));
        assert_close(&v, &want_v, 0.0, &format!("{what} v"));
    }
}

/// GQA attention, with and without a mask, with soft-capped scores (Gemma 2's) and with sinks
/// (gpt-oss's), against a reference softmax in f64.
#[test]
fn attention_matches_a_reference() {
    let (spec, device) = device();
    for (heads, kv_heads, d, n, extent, masked, softcap, sinks) in [
        (2, 2, 64, 1, 5, false, None, false),
        (4, 2, 64, 3, 130, true, None, false),
        (7, 1, 128, 2, 300, true, None, false),
        (14, 2, 64, 1, 257, false, None, false),
        (4, 2, 64, 3, 130, true, Some(0.5), false),
        (4, 2, 64, 3, 130, true, None, true),
        (2, 2, 64, 1, 5, false, None, true),
    ] {
        // Sinks below, about and far above the scores.
        let sink: Vec<f32> = (0..heads).map(|h| [-3.0, 0.5, 20.0][h % 3]).collect();
        let sinks = sinks.then(|| Sinks::new(sink.clone(), &device));
        let q = values(n * heads * d, 1, 1.5);
        let k = values(kv_heads * extent * d, 2, 1.5);
        let v = values(kv_heads * extent * d, 3, 1.0);
        // Row r sees the cells below extent − r·3, and every cell it sees when unmasked.
        let sees = |r: usize, c: usize| !masked || c < extent - r * 3;
        let mask: Vec<f32> =
            (0..n * extent).map(|i| if sees(i / extent, i % extent) { 0.0 } else { f32::NEG_INFINITY }).collect();
        let qt = Tensor::<3>::from_data(TensorData::new(q.clone(), [n, heads, d]), &device);
        let kt = Tensor::<3>::from_data(TensorData::new(k.clone(), [kv_heads, extent, d]), &device);
        let vt = Tensor::<3>::from_data(TensorData::new(v.clone(), [kv_heads, extent, d]), &device);
        let mt = masked.then(|| Tensor::<2>::from_data(TensorData::new(mask, [n, extent]), &device));
        // Capped scores and sinks take Burn's ops, not the fused softmax.
        let run = || host(attention(qt, kt, vt, mt, softcap, sinks.as_ref()));
        let got = if softcap.is_none() && sinks.is_none() { ran(spec, "softmax", run) } else { run() };
        let mut want = vec![0.0f64; n * heads * d];
        for r in 0..n {
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let qrow = &q[(r * heads + h) * d..][..d];
                let scores: Vec<f64> = (0..extent)
                    .map(|c| {
                        let krow = &k[(kvh * extent + c) * d..][..d];
                        let dot: f64 = qrow.iter().zip(krow).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let s = dot / (d as f64).sqrt();
                        let s = softcap.map_or(s, |cap| cap * (s / cap).tanh());
                        if sees(r, c) { s } else { f64::NEG_INFINITY }
                    })
                    .collect();
                let sink = sinks.as_ref().map(|_| sink[h] as f64);
                let top = scores.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - top).exp());
                for (c, w) in weights.iter().enumerate() {
                    for i in 0..d {
                        want[(r * heads + h) * d + i] += w / total * v[(kvh * extent + c) * d + i] as f64;
                    }
                }
            }
        }
        let what = format!(
            "attention {heads}/{kv_heads} d {d} n {n} extent {extent} cap {softcap:?} sinks {}",
            sinks.is_some()
        );
        assert_close(&got, &want, 1e-4, &what);
    }
}

/// The k inputs a product reads from `row` in f64: as given (`plain`), RMS-normalised by `g`
/// (`normed`), or SwiGLU- or GeGLU-gated from [gate | up] (`gated`, `gelu-gated`: transformers'
/// `gelu_pytorch_tanh`).
fn product_input(row: &[f32], how: &str, k: usize, g: &[f32]) -> Vec<f64> {
    let gelu = |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
    match how {
        "plain" => row[..k].iter().map(|&v| v as f64).collect(),
        "normed" => {
            let ss = row[..k].iter().map(|&v| v as f64 * v as f64).sum::<f64>();
            let scale = 1.0 / (ss / k as f64 + 1e-6).sqrt();
            row[..k].iter().zip(g).map(|(&v, &g)| v as f64 * scale * g as f64).collect()
        }
        "gelu-gated" => (0..k).map(|i| gelu(row[i] as f64) * row[k + i] as f64).collect(),
        _ => (0..k).map(|i| row[i] as f64 / (1.0 + (-row[i] as f64).exp()) * row[k + i] as f64).collect(),
    }
}

/// Row counts for the few-row products: each a cube's four rows or fewer, two and three chunks
/// (the last partial), the most they take ([`gpu_fused_rows`]) and one more (Burn's matmul).
fn few_rows() -> Vec<usize> {
    let most = gpu_fused_rows();
    let mut rows = vec![1, 2, 3, 4, 6, 9, most, most + 1];
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// A dense linear layer's few-row product, its input as given, RMS-normalised or SwiGLU-gated
/// first, with its bias and a residual added, against an f64 reference, for every weight type
/// the device computes in: one to four rows (a cube's), several chunks of four with a partial
/// last one, and the most the kernel takes; more rows than that go through Burn's matmul and
/// must agree too.
#[test]
fn few_row_products_match_a_reference() {
    use burn::tensor::{DType, FloatDType};
    use llaisys_model::layers::{Linear, Pre, linear};
    let (spec, device) = device();
    let (k, outs) = (300, 37);
    let w = values(outs * k, 21, 0.5);
    let b = values(outs, 22, 1.0);
    let g = values(k, 23, 1.5);
    let norm = RmsNorm { weight: Tensor::from_data(TensorData::new(g.clone(), [k]), &device), eps: 1e-6 };
    for (dtype, tol) in [(FloatDType::F32, 1e-4), (FloatDType::F16, 1e-2), (FloatDType::BF16, 3e-2)] {
        if !device.supports_dtype(DType::from(dtype)) {
            eprintln!("{spec} does not compute in {dtype:?}: its products are not checked here");
            continue;
        }
        let weight = Tensor::<2>::from_data(TensorData::new(w.clone(), [outs, k]), &device).cast(dtype);
        // The weight as stored (rounded to its type), for the reference.
        let stored = host(weight.clone().cast(FloatDType::F32));
        let layer = Linear {
            weight: linear::dense(weight),
            bias: Some(Tensor::from_data(TensorData::new(b.clone(), [outs]), &device)),
        };
        for (pre, name) in [
            (Pre::Plain, "plain"),
            (norm.pre(), "normed"),
            (Pre::Gated(Activation::Silu), "gated"),
            (Pre::Gated(Activation::GeluTanh), "gelu-gated"),
        ] {
            let width = if name.ends_with("gated") { 2 * k } else { k };
            for n in few_rows() {
                // x as a narrowed view (a row stride wider than its width).
                let xs = values(n * (width + 3), n as u32, 2.0);
                let x =
                    Tensor::<2>::from_data(TensorData::new(xs.clone(), [n, width + 3]), &device).narrow(1, 0, width);
                let r = values(n * outs, 40 + n as u32, 1.0);
                let residual = Tensor::<2>::from_data(TensorData::new(r.clone(), [n, outs]), &device);
                let kernel = if n <= gpu_fused_rows() { "xwt" } else { "matmul" };
                let got = ran(spec, kernel, || host(layer.forward_with(x.clone(), pre, Some(residual))));
                let plain = host(layer.forward_with(x, pre, None));
                let mut want = Vec::with_capacity(n * outs);
                for row in xs.chunks(width + 3) {
                    let input = product_input(row, name, k, &g);
                    for o in 0..outs {
                        let dot: f64 = input.iter().zip(&stored[o * k..(o + 1) * k]).map(|(a, &w)| a * w as f64).sum();
                        want.push(dot + b[o] as f64);
                    }
                }
                let what = format!("{dtype:?} weight, {name} input, {n} rows");
                assert_close(&plain, &want, tol, &what);
                let summed: Vec<f64> = want.iter().zip(&r).map(|(w, r)| w + *r as f64).collect();
                assert_close(&got, &summed, tol, &format!("{what}, plus a residual"));
            }
        }
    }
}

/// A dense matrix kept in row parts (as one larger than its GPU's largest buffer is) multiplies,
/// gathers rows and takes replaced rows as the same matrix kept whole: parts of 10 rows with a
/// partial last one, rows looked up across them out of order and twice, a replacement that
/// spans three parts, and a stack with a matrix kept whole.
#[test]
fn a_dense_matrix_in_parts_works_as_one() {
    use llaisys_model::layers::{Linear, Pre, Weight, linear};
    let (_, device) = device();
    let (k, outs) = (300, 37);
    let w = values(outs * k, 31, 0.5);
    let data = || TensorData::new(w.clone(), [outs, k]);
    let whole = linear::dense_parts(data(), DType::F32, &device, outs);
    let parts = linear::dense_parts(data(), DType::F32, &device, 10);
    assert_eq!((whole.describe(), parts.describe()), ("f32".to_string(), "f32 in 4 parts".to_string()));
    assert_eq!(parts.dims(), [outs, k]);
    let norm = RmsNorm { weight: Tensor::from_data(TensorData::new(values(k, 33, 1.5), [k]), &device), eps: 1e-6 };
    let check = |whole: &Weight, parts: &Weight, what: &str| {
        let outs = whole.dims()[0];
        let bias = Tensor::<1>::from_data(TensorData::new(values(outs, 32, 1.0), [outs]), &device);
        for n in [1, 3, 9] {
            let x = Tensor::<2>::from_data(TensorData::new(values(n * k, n as u32, 2.0), [n, k]), &device);
            for pre in [Pre::Plain, norm.pre()] {
                let layer = |weight: &Weight| Linear { weight: weight.clone(), bias: Some(bias.clone()) };
                let want: Vec<f64> =
                    host(layer(whole).forward_with(x.clone(), pre, None)).iter().map(|&v| v as f64).collect();
                let got = host(layer(parts).forward_with(x.clone(), pre, None));
                assert_close(&got, &want, 1e-5, &format!("{what}: {n} rows"));
            }
        }
        let ids = [36, 0, 10, 9, 20, 36, 19, 30];
        let (got, want) = (host(parts.rows(&ids, &device)), host(whole.rows(&ids, &device)));
        assert_eq!(got.len(), ids.len() * k, "{what}: rows {ids:?}");
        for (i, id) in ids.iter().enumerate() {
            assert!(got[i * k..(i + 1) * k] == want[i * k..(i + 1) * k], "{what}: row {id} (lookup {i}) differs");
        }
    };
    check(&whole, &parts, "as loaded");
    // Rows 8..23 replaced: the end of the first part, all of the second, the start of the third.
    let new = values(15 * k, 34, 0.5);
    let replace = |weight| linear::replace_rows(weight, 8..23, TensorData::new(new.clone(), [15, k]), &device);
    let (whole, parts) = (replace(&whole), replace(&parts));
    assert_eq!(parts.describe(), "f32 in 4 parts");
    check(&whole, &parts, "with rows replaced");
    let more = linear::dense_parts(TensorData::new(values(5 * k, 35, 0.5), [5, k]), DType::F32, &device, 5);
    let (whole, parts) = (linear::stack(vec![whole, more.clone()]), linear::stack(vec![parts, more]));
    assert_eq!(parts.dims(), [outs + 5, k]);
    check(&whole, &parts, "stacked");
}

/// Attention over a layer's whole cache through each row's visible cells (out of order, shared
/// between rows, one cell alone, more cells than a cube has units, and rows long enough for the
/// GPU kernel to split them over several cubes beside rows with none in the later splits), as
/// the decoder calls it, against an f64 reference, with and without soft-capped scores (Gemma
/// 2's) and sinks (gpt-oss's); on every KV type the device computes in.
#[test]
fn cell_attention_matches_a_reference() {
    use burn::tensor::{DType, FloatDType};
    use llaisys_model::kernels::{CellTable, attention as cell_attention};
    use llaisys_model::kv::Placement;
    let (spec, device) = device();
    let capacity = 1200;
    let short: Vec<Vec<u32>> =
        vec![vec![5], (0..200).rev().map(|c| (c * 7 % 400) as u32).collect(), vec![399, 0, 17, 5, 200, 201]];
    let long: Vec<Vec<u32>> = vec![
        vec![5],
        (0..300).rev().map(|c| (c * 7 % 1200) as u32).collect(),
        vec![1199, 0, 17, 5, 200, 201],
        (100..1100).collect(),
    ];
    for (heads, kv_heads, d, visible, softcap, with_sinks) in [
        (2, 2, 64, &short, None, false),
        (4, 2, 128, &long, None, false),
        (7, 1, 64, &long, None, false),
        (7, 1, 128, &short, None, false),
        (2, 2, 64, &short, Some(0.5), false),
        (4, 2, 128, &long, Some(0.5), false),
        // gpt-oss's sinks, below, about and far above the scores: split rows and whole ones.
        (4, 2, 128, &long, None, true),
        (7, 1, 64, &short, None, true),
    ] {
        let sink: Vec<f32> = (0..heads).map(|h| [-3.0, 0.5, 20.0][h % 3]).collect();
        let sinks = with_sinks.then(|| Sinks::new(sink.clone(), &device));
        let n = visible.len();
        let q = values(n * heads * d, 31, 1.5);
        let k = values(kv_heads * capacity * d, 32, 1.5);
        let v = values(kv_heads * capacity * d, 33, 1.0);
        for (dtype, tol) in [(FloatDType::F32, 1e-4), (FloatDType::F16, 1e-2), (FloatDType::BF16, 3e-2)] {
            if !device.supports_dtype(DType::from(dtype)) {
                continue;
            }
            let kt = Tensor::<3>::from_data(TensorData::new(k.clone(), [kv_heads, capacity, d]), &device).cast(dtype);
            let vt = Tensor::<3>::from_data(TensorData::new(v.clone(), [kv_heads, capacity, d]), &device).cast(dtype);
            let (ks, vs) = (host(kt.clone().cast(FloatDType::F32)), host(vt.clone().cast(FloatDType::F32)));
            let qt = Tensor::<3>::from_data(TensorData::new(q.clone(), [n, heads, d]), &device);
            let cells = CellTable::new(Placement { cells: Vec::new() }, visible.to_vec(), &device);
            // The GPU kernel splits rows of more than 256 cells and merges the splits.
            let kernel = if visible.iter().any(|cells| cells.len() > 256) { "merge_splits" } else { "cell_attention" };
            let got = ran(spec, kernel, || {
                host(
                    cell_attention(&qt, &kt, &vt, false, &cells, softcap, sinks.as_ref())
                        .expect("an attention kernel runs on the test device"),
                )
            });
            let mut want = vec![0.0f64; n * heads * d];
            for (r, seen) in visible.iter().enumerate() {
                for h in 0..heads {
                    let kvh = h / (heads / kv_heads);
                    let qrow = &q[(r * heads + h) * d..][..d];
                    let scores: Vec<f64> = seen
                        .iter()
                        .map(|&c| {
                            let krow = &ks[(kvh * capacity + c as usize) * d..][..d];
                            let s = qrow.iter().zip(krow).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>()
                                / (d as f64).sqrt();
                            softcap.map_or(s, |cap| cap * (s / cap).tanh())
                        })
                        .collect();
                    let sink = with_sinks.then_some(sink[h] as f64);
                    let top = scores.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                    let total: f64 = weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - top).exp());
                    for (&c, w) in seen.iter().zip(&weights) {
                        for i in 0..d {
                            want[(r * heads + h) * d + i] +=
                                w / total * vs[(kvh * capacity + c as usize) * d + i] as f64;
                        }
                    }
                }
            }
            let what = format!(
                "cell attention {heads}/{kv_heads} d {d}, {dtype:?} cache, cap {softcap:?}, sinks {with_sinks}"
            );
            assert_close(&got, &want, tol, &what);
        }
    }
}

/// Keys and values written into their cells of a layer's cache in one launch on a GPU, in the
/// cache's type, the other cells unchanged; on the CPU the kernel declines (the cache's slice
/// assignments write there) and gives the caches back as they were.
#[test]
fn kv_writes_land_in_their_cells() {
    use burn::tensor::{DType, FloatDType};
    use llaisys_model::kernels::{CellTable, kv_write};
    use llaisys_model::kv::Placement;
    let (spec, device) = device();
    let (kv_heads, capacity, d, n) = (3, 50, 64, 4);
    let slots = vec![7, 3, 49, 8];
    let k = values(kv_heads * n * d, 51, 1.0);
    let v = values(kv_heads * n * d, 52, 1.0);
    for dtype in [FloatDType::F32, FloatDType::F16, FloatDType::BF16] {
        if !device.supports_dtype(DType::from(dtype)) {
            continue;
        }
        let old = values(kv_heads * capacity * d, 53, 1.0);
        let cache =
            || Tensor::<3>::from_data(TensorData::new(old.clone(), [kv_heads, capacity, d]), &device).cast(dtype);
        let kt = Tensor::<3>::from_data(TensorData::new(k.clone(), [kv_heads, n, d]), &device);
        let vt = Tensor::<3>::from_data(TensorData::new(v.clone(), [kv_heads, n, d]), &device);
        let cells = CellTable::new(Placement { cells: slots.clone() }, Vec::new(), &device);
        let stored = host(cache().cast(FloatDType::F32));
        let mut caches = [cache(), cache()];
        let written = kv_write(&mut caches, [&kt, &vt], &cells);
        let [kc, vc] = caches;
        if spec == DeviceSpec::Cpu {
            assert!(!written, "the CPU's caches are written by slice assignment");
            assert_eq!((host(kc.cast(FloatDType::F32)), host(vc.cast(FloatDType::F32))), (stored.clone(), stored));
            continue;
        }
        assert!(written, "the kv write kernel declined on {spec}");
        let (kc, vc) = (host(kc.cast(FloatDType::F32)), host(vc.cast(FloatDType::F32)));
        let round = |v: &[f32]| rounded(v, dtype, &device);
        let layout = (kv_heads, capacity, d);
        let (k_at, v_at) = (
            |t: usize, h: usize| round(&k[(h * n + t) * d..][..d]),
            |t: usize, h: usize| round(&v[(h * n + t) * d..][..d]),
        );
        assert_cells(&kc, &stored, &slots, layout, k_at, 1e-6, &format!("{dtype:?} k"));
        assert_cells(&vc, &stored, &slots, layout, v_at, 1e-6, &format!("{dtype:?} v"));
    }
}

/// RoPE and the KV write as one GPU launch: q's heads come back rotated, k's rotated and v's
/// as they were land in their cells, in the cache's type, the other cells unchanged; with
/// per-head norms (Qwen3's), q's and k's heads normalised first. On the CPU it declines and
/// writes nothing.
#[test]
fn rope_and_the_kv_write_in_one_launch() {
    use burn::tensor::{DType, FloatDType};
    use llaisys_model::kernels::{CellTable, rope_kv_write};
    use llaisys_model::kv::Placement;
    let (spec, device) = device();
    let (n, capacity) = (3, 20);
    let positions = [4, 0, 300];
    let slots = vec![19, 2, 3];
    for (heads, kv_heads, d, normed) in [(7, 1, 64, false), (7, 1, 64, true), (4, 2, 128, true), (2, 2, 80, true)] {
        let width = (heads + 2 * kv_heads) * d;
        let x = values(n * width, 61, 2.0);
        let rope = Rope::new(d, 10_000.0);
        let tables = rope.tables(&positions, &device);
        let norm = |seed| RmsNorm {
            weight: Tensor::from_data(TensorData::new(values(d, seed, 1.5), [d]), &device),
            eps: 1e-6,
        };
        let norms = normed.then(|| [norm(63), norm(64)]);
        for dtype in [FloatDType::F32, FloatDType::F16, FloatDType::BF16] {
            if !device.supports_dtype(DType::from(dtype)) {
                continue;
            }
            let what = format!("{heads}/{kv_heads} d {d}{}, {dtype:?}", if normed { " normed" } else { "" });
            let old = values(kv_heads * capacity * d, 62, 1.0);
            let cache =
                || Tensor::<3>::from_data(TensorData::new(old.clone(), [kv_heads, capacity, d]), &device).cast(dtype);
            let stored = host(cache().cast(FloatDType::F32));
            let mut caches = [cache(), cache()];
            let cells = CellTable::new(Placement { cells: slots.clone() }, Vec::new(), &device);
            let qkv = Tensor::<2>::from_data(TensorData::new(x.clone(), [n, width]), &device);
            let qk = norms.as_ref().map(RmsNorm::qk);
            let q = ran(spec, "rope_kv", || rope_kv_write(&qkv, heads, d, tables.stacked(), qk, &mut caches, &cells));
            let [kc, vc] = caches.map(|c| host(c.cast(FloatDType::F32)));
            if spec == DeviceSpec::Cpu {
                assert!(q.is_none(), "the CPU rotates with its own kernel and writes by slice assignment");
                assert_eq!((kc, vc), (stored.clone(), stored));
                continue;
            }
            let q = host(q.unwrap_or_else(|| panic!("{what}: the RoPE + KV write kernel declined on {spec}")));
            // The reference: the layer's own norms and rotation (checked above against f64) and
            // the write.
            let qk_rows = [0..heads * d, heads * d..(heads + kv_heads) * d];
            let [q_rows, k_rows] = qk_rows;
            let [want_q, want_k, want_v] = Rope::apply_qk(qkv, q_rows, k_rows, &tables, norms.as_ref()).map(host);
            assert_close(&q, &want_q.iter().map(|&v| v as f64).collect::<Vec<_>>(), 1e-5, &format!("{what}: q"));
            let round = |v: &[f32]| rounded(v, dtype, &device);
            let layout = (kv_heads, capacity, d);
            let row = |new: &[f32], t: usize, h: usize| round(&new[(t * kv_heads + h) * d..][..d]);
            // Normalised heads may round either way in a 16-bit cache: one step of its type.
            let tol = match dtype {
                _ if !normed => 1e-6,
                FloatDType::F16 => 1e-3,
                FloatDType::BF16 => 8e-3,
                _ => 1e-5,
            };
            assert_cells(&kc, &stored, &slots, layout, |t, h| row(&want_k, t, h), tol, &format!("{what}: k"));
            assert_cells(&vc, &stored, &slots, layout, |t, h| row(&want_v, t, h), tol, &format!("{what}: v"));
        }
    }
}

/// A decode step's q/k/v projection (the attention norm and the bias applied) with RoPE and the
/// KV write in one launch on a GPU, against the projection and the RoPE + KV write launched
/// apart (each checked above): the same q, the same keys and values in the rows' cells, every
/// other cell unchanged; for weights and caches of every type the device computes in, a GQA
/// ratio of 7 and of 1, head_dim 64 and 128, one row, four, and nine (three chunks of a cube's
/// rows). On the CPU it declines and writes nothing.
#[test]
fn the_projection_rope_and_kv_write_in_one_launch() {
    use burn::tensor::{DType, FloatDType};
    use llaisys_model::layers::{Linear, linear};
    let (spec, device) = device();
    let k = 300;
    for (heads, kv_heads, d, slots) in
        [(7, 1, 64, vec![19, 2, 3, 7]), (2, 2, 128, vec![5]), (2, 1, 64, vec![19, 2, 3, 7, 11, 0, 5, 13, 16])]
    {
        let width = (heads + 2 * kv_heads) * d;
        let w = values(width * k, 73, 0.5);
        let b = values(width, 74, 1.0);
        for (dtype, tol) in [(FloatDType::F32, 1e-5), (FloatDType::F16, 1e-2), (FloatDType::BF16, 3e-2)] {
            if !device.supports_dtype(DType::from(dtype)) {
                continue;
            }
            let qkv = Linear {
                weight: linear::dense(
                    Tensor::<2>::from_data(TensorData::new(w.clone(), [width, k]), &device).cast(dtype),
                ),
                bias: Some(Tensor::from_data(TensorData::new(b.clone(), [width]), &device)),
            };
            let what = format!("{heads}/{kv_heads} d {d}, {} rows, {dtype:?}", slots.len());
            let fused =
                projected_apart_and_fused(spec, &device, &qkv, (heads, kv_heads, d), &slots, dtype, "xwt_rope_kv");
            if let Some(([q, kc, vc], [want_q, want_k, want_v])) = fused {
                let wide = |v: &[f32]| v.iter().map(|&v| v as f64).collect::<Vec<_>>();
                assert_close(&q, &wide(&want_q), 1e-5, &format!("{what}: q"));
                assert_close(&kc, &wide(&want_k), tol, &format!("{what}: keys"));
                assert_close(&vc, &wide(&want_v), tol, &format!("{what}: values"));
            }
        }
    }
}

/// The fused projection of [`the_projection_rope_and_kv_write_in_one_launch`] over a quantized
/// weight read in its blocks (a launch a part, each whole heads): Q4_K's q and k with Q6_K's v
/// (as in Q4_K_M files) for four rows, Q8_0 alone for six (two chunks of a cube's rows),
/// against `xwt_q`'s projection and the RoPE + KV write apart. A part that splits a head is
/// declined, nothing written.
#[test]
fn a_quantized_projection_rope_and_kv_write_in_one_launch() {
    use burn::tensor::FloatDType;
    use llaisys_model::kernels::{CellTable, project_rope_kv_write};
    use llaisys_model::kv::Placement;
    use llaisys_model::layers::{Linear, Pre, linear};
    use llaisys_model::quant::QuantType;
    use llaisys_model::quant::device::DeviceRows;
    let (spec, device) = device();
    if !blocks_run(spec, &device) {
        return;
    }
    let k = 256;
    let parts = |shape: &[(QuantType, usize)], seed: u32| {
        let parts = shape.iter().enumerate().map(|(p, &(ty, rows))| {
            let (bytes, _) = random_blocks(ty, rows, k, seed + p as u32);
            linear::blocks(vec![DeviceRows::upload(ty, rows, k, &bytes, &device).unwrap()], DType::F32)
        });
        linear::stack(parts.collect())
    };
    for (heads, kv_heads, d, shape, slots) in [
        (7, 1, 64, vec![(QuantType::Q4K, 8 * 64), (QuantType::Q6K, 64)], vec![19, 2, 3, 7]),
        (2, 2, 128, vec![(QuantType::Q8_0, 6 * 128)], vec![19, 2, 3, 7, 11, 0]),
    ] {
        let width = (heads + 2 * kv_heads) * d;
        let qkv = Linear {
            weight: parts(&shape, 500 + d as u32),
            bias: Some(Tensor::from_data(TensorData::new(values(width, 74, 1.0), [width]), &device)),
        };
        let what = format!("{heads}/{kv_heads} d {d}, {}, {} rows", qkv.weight.describe(), slots.len());
        let (got, want) = projected_apart_and_fused(
            spec,
            &device,
            &qkv,
            (heads, kv_heads, d),
            &slots,
            FloatDType::F32,
            "xwt_rope_kv_q",
        )
        .unwrap_or_else(|| panic!("{what}: declined"));
        for ((got, want), part) in got.iter().zip(&want).zip(["q", "keys", "values"]) {
            let wide: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            assert_close(got, &wide, 1e-5, &format!("{what}: {part}"));
        }
    }
    // Parts of 96 rows split the heads of 64: declined, the caches as they were.
    let (heads, kv_heads, d) = (1, 1, 64);
    let qkv = parts(&[(QuantType::Q8_0, 96), (QuantType::Q4_0, 96)], 600);
    let x = Tensor::<2>::from_data(TensorData::new(values(k, 72, 2.0), [1, k]), &device);
    let tables = Rope::new(d, 10_000.0).tables(&[3], &device);
    let cache =
        || Tensor::<3>::from_data(TensorData::new(values(kv_heads * 20 * d, 75, 1.0), [kv_heads, 20, d]), &device);
    let mut caches = [cache(), cache()];
    let cells = CellTable::new(Placement { cells: vec![4] }, Vec::new(), &device);
    let gpu = qkv.matrix().gpu().unwrap();
    let q = project_rope_kv_write(&x, Pre::Plain, gpu, None, heads, d, tables.stacked(), &mut caches, &cells);
    assert!(q.is_none(), "parts that split a head are declined");
    assert_eq!(caches.map(host), [cache(), cache()].map(host), "a declined launch writes nothing");
}

/// q, a layer's keys and its values, as f32.
type QKeysValues = [Vec<f32>; 3];

/// The q/k/v projection `qkv` of a row per slot after an RMSNorm, with RoPE and the
/// KV write, on the device under test: fused into one launch (`kernel`, checked to run), and
/// apart (the layer's product, then the RoPE + KV write): `Some(([q, keys, values] fused, the
/// same apart))` as f32, with the cells no row writes checked unchanged; `None` on the CPU,
/// where the fused kernel declines (and is checked to write nothing).
fn projected_apart_and_fused(
    spec: DeviceSpec,
    device: &Device,
    qkv: &llaisys_model::layers::Linear,
    (heads, kv_heads, d): (usize, usize, usize),
    slots: &[usize],
    dtype: burn::tensor::FloatDType,
    kernel: &str,
) -> Option<(QKeysValues, QKeysValues)> {
    use burn::tensor::FloatDType;
    use llaisys_model::kernels::{CellTable, project_rope_kv_write, rope_kv_write};
    use llaisys_model::kv::Placement;
    let [width, k] = qkv.weight.dims();
    let capacity = 20;
    let n = slots.len();
    let g = values(k, 71, 1.5);
    let norm = RmsNorm { weight: Tensor::from_data(TensorData::new(g, [k]), device), eps: 1e-6 };
    let positions: Vec<i64> = (0..n).map(|r| [4, 0, 300, 17][r % 4] + r as i64).collect();
    let tables = Rope::new(d, 10_000.0).tables(&positions, device);
    let x = Tensor::<2>::from_data(TensorData::new(values(n * k, 72, 2.0), [n, k]), device);
    assert_eq!(width, (heads + 2 * kv_heads) * d);
    let old = values(kv_heads * capacity * d, 75, 1.0);
    let cache = || Tensor::<3>::from_data(TensorData::new(old.clone(), [kv_heads, capacity, d]), device).cast(dtype);
    let stored = host(cache().cast(FloatDType::F32));
    let cells = CellTable::new(Placement { cells: slots.to_vec() }, Vec::new(), device);
    let mut fused = [cache(), cache()];
    let gpu = qkv.weight.matrix().gpu().expect("a weight the GPU reads");
    let q = ran(spec, kernel, || {
        project_rope_kv_write(&x, norm.pre(), gpu, qkv.bias.as_ref(), heads, d, tables.stacked(), &mut fused, &cells)
    });
    let [kc, vc] = fused.map(|c| host(c.cast(FloatDType::F32)));
    if spec == DeviceSpec::Cpu {
        assert!(q.is_none(), "the CPU projects, rotates and writes apart");
        assert_eq!((kc, vc), (stored.clone(), stored));
        return None;
    }
    let q = host(q?);
    let mut apart = [cache(), cache()];
    let projected = qkv.forward_with(x, norm.pre(), None);
    let want_q = host(rope_kv_write(&projected, heads, d, tables.stacked(), None, &mut apart, &cells).unwrap());
    let [want_k, want_v] = apart.map(|c| host(c.cast(FloatDType::F32)));
    // The cells no row writes keep what they held.
    for (at, (&k, &s)) in kc.iter().zip(&stored).enumerate() {
        if !slots.contains(&(at / d % capacity)) {
            assert_eq!(k, s, "key {at} changed");
        }
    }
    Some(([q, kc, vc], [want_q, want_k, want_v]))
}

/// A `rows` × `k` matrix of random ggml blocks of `ty` whose scales are small and of either
/// sign (one of them an f16 subnormal), as `(bytes, the values ggml dequantizes them to)`.
fn random_blocks(ty: llaisys_model::quant::QuantType, rows: usize, k: usize, seed: u32) -> (Vec<u8>, Vec<f32>) {
    use half::f16;
    use llaisys_model::quant::{dequantize, row_bytes};
    let len = rows * row_bytes(ty, k);
    let mut bytes: Vec<u8> = (0..len as u32).map(|i| ((i ^ seed).wrapping_mul(2654435761) >> 13) as u8).collect();
    for (b, block) in bytes.chunks_exact_mut(ty.block_bytes()).enumerate() {
        let scale = |i: usize| {
            let s = values(1, (b * 4 + i) as u32 ^ seed, 0.02)[0];
            // The second block's first scale is a subnormal f16 (about 3e-5).
            if b == 1 && i == 0 { f16::from_bits(0x8200) } else { f16::from_f32(s) }
        };
        // A scale and, where the format has one, a min.
        for (i, &at) in ty.f16_fields().iter().enumerate() {
            block[at..at + 2].copy_from_slice(&scale(i).to_le_bytes());
        }
        if ty == llaisys_model::quant::QuantType::Mxfp4 {
            // E8M0 scales 2^-14 .. 2^-7; the second block's the subnormal 2^-127.
            block[0] = if b == 1 { 1 } else { 114 + (b % 8) as u8 };
        }
    }
    let mut want = vec![0.0f32; rows * k];
    dequantize(ty, &bytes, &mut want);
    (bytes, want)
}

/// Whether the device under test keeps quantized weights in their blocks (a GPU's kernels).
fn blocks_run(spec: DeviceSpec, device: &Device) -> bool {
    let runs = llaisys_model::kernels::blocks_run_on(device);
    if !runs {
        eprintln!("{spec} does not keep quantized weights in blocks: the CPU's packed kernels are tested in quant");
    }
    runs
}

/// Quantized weights on a GPU, in ggml's blocks: rows looked up (an embedding) and whole
/// matrices dequantized (what prefill's products read) equal ggml's dequantization, in every
/// format, one block's scale an f16 subnormal; a stacked matrix of three
/// formats, one of them quantized at load from f32 rows, reads each part in its own.
#[test]
fn quantized_rows_dequantize_as_ggml_does() {
    use llaisys_model::layers::linear;
    use llaisys_model::quant::QuantType;
    use llaisys_model::quant::device::DeviceRows;
    let (spec, device) = device();
    if !blocks_run(spec, &device) {
        return;
    }
    let k = 512;
    let close = |got: &[f32], want: &[f32], what: &str| {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-6 * w.abs() + 1e-30, "{what}[{i}]: {g} vs {w}");
        }
    };
    let mut parts = Vec::new();
    for (t, ty) in QuantType::ALL.into_iter().enumerate() {
        let rows = 21;
        let (bytes, want) = random_blocks(ty, rows, k, 100 + t as u32);
        let part = DeviceRows::upload(ty, rows, k, &bytes, &device).unwrap();
        let weight = linear::blocks(vec![part.clone()], DType::F32);
        assert_eq!(weight.dims(), [rows, k]);
        assert_eq!(weight.describe(), ty.name());
        let ids = [0u32, 20, 1, 1, 7];
        let got = ran(spec, "dequantize", || host(weight.rows(&ids, &device)));
        let picked: Vec<f32> = ids.iter().flat_map(|&r| want[r as usize * k..(r as usize + 1) * k].to_vec()).collect();
        close(&got, &picked, &format!("{ty} rows"));
        if matches!(ty, QuantType::Q4K | QuantType::Q6K) {
            parts.push((weight, want));
        }
    }
    // Q4_K, Q6_K and an f32 matrix stacked (the f32 one quantized to Q8_0 at the stacking).
    let dense = values(5 * k, 9, 1.0);
    let (dense_weight, mut q8) = {
        let t = Tensor::<2>::from_data(TensorData::new(dense.clone(), [5, k]), &device);
        let mut bytes = Vec::new();
        llaisys_model::quant::quantize(QuantType::Q8_0, &dense, &mut bytes).unwrap();
        let mut back = vec![0.0f32; 5 * k];
        llaisys_model::quant::dequantize(QuantType::Q8_0, &bytes, &mut back);
        (linear::dense(t), back)
    };
    let (weights, mut want): (Vec<_>, Vec<Vec<f32>>) = parts.into_iter().unzip();
    let stacked = linear::stack(weights.into_iter().chain([dense_weight]).collect());
    assert_eq!(stacked.describe(), "Q4_K+Q6_K+Q8_0");
    want.push(std::mem::take(&mut q8));
    let want = want.concat();
    let all: Vec<u32> = (0..47).collect();
    close(&host(stacked.rows(&all, &device)), &want, "stacked rows");
    // Rows of every part, out of order and repeated: each from the part that holds it, in one
    // launch a part.
    let ids = [46u32, 0, 30, 17, 46, 5, 21];
    let got = ran(spec, "dequantize", || host(stacked.rows(&ids, &device)));
    let picked: Vec<f32> = ids.iter().flat_map(|&r| want[r as usize * k..(r as usize + 1) * k].to_vec()).collect();
    close(&got, &picked, "rows of stacked parts");

    // Rows replaced (a weight slot's update): the Q6_K part's rows 3..7 quantized to Q6_K, the
    // rows around them as they were, the part whole again.
    let new = values(4 * k, 10, 1.0);
    let mut bytes = Vec::new();
    llaisys_model::quant::quantize(QuantType::Q6K, &new, &mut bytes).unwrap();
    let mut back = vec![0.0f32; 4 * k];
    llaisys_model::quant::dequantize(QuantType::Q6K, &bytes, &mut back);
    let replaced = linear::replace_rows(&stacked, 24..28, TensorData::new(new, [4, k]), &device);
    assert_eq!(replaced.describe(), "Q4_K+Q6_K+Q8_0");
    let mut want = want;
    want[24 * k..28 * k].copy_from_slice(&back);
    close(&host(replaced.rows(&all, &device)), &want, "replaced rows");
    assert_eq!(replaced.size_bytes(), stacked.size_bytes());
}

/// A quantized weight's few-row product (a decode step: read in its blocks by `xwt_q`), its
/// input as given, RMS-normalised or SwiGLU-gated first (GeGLU-gated for the first format only:
/// each gate is another shader for every format), with its bias and a residual added,
/// against an f64 reference over ggml's dequantized values, in every format and for a matrix
/// stacked from two formats (one launch a part), on the row counts of
/// [`few_row_products_match_a_reference`]; more rows than the kernel takes dequantize the
/// matrix on the device for Burn's matmul and must agree too.
#[test]
fn quantized_products_match_a_reference() {
    use llaisys_model::layers::{Linear, Pre, linear};
    use llaisys_model::quant::QuantType;
    use llaisys_model::quant::device::DeviceRows;
    let (spec, device) = device();
    if !blocks_run(spec, &device) {
        return;
    }
    let k = 256;
    let g = values(k, 23, 1.5);
    let norm = RmsNorm { weight: Tensor::from_data(TensorData::new(g.clone(), [k]), &device), eps: 1e-6 };
    let mut cases: Vec<(String, Vec<(QuantType, usize)>)> =
        QuantType::ALL.into_iter().map(|ty| (ty.name().to_string(), vec![(ty, 37)])).collect();
    cases.push(("Q4_K+Q6_K".into(), vec![(QuantType::Q4K, 16), (QuantType::Q6K, 11)]));
    for (case, (name, shape)) in cases.into_iter().enumerate() {
        let mut stored = Vec::new();
        let weights: Vec<_> = shape
            .iter()
            .enumerate()
            .map(|(p, &(ty, rows))| {
                let (bytes, want) = random_blocks(ty, rows, k, 300 + (10 * case + p) as u32);
                stored.extend(want);
                linear::blocks(vec![DeviceRows::upload(ty, rows, k, &bytes, &device).unwrap()], DType::F32)
            })
            .collect();
        let outs = shape.iter().map(|(_, rows)| rows).sum::<usize>();
        let b = values(outs, 22, 1.0);
        let layer = Linear {
            weight: linear::stack(weights),
            bias: Some(Tensor::from_data(TensorData::new(b.clone(), [outs]), &device)),
        };
        assert_eq!(layer.weight.describe(), name);
        let gelu = (case == 0).then_some((Pre::Gated(Activation::GeluTanh), "gelu-gated"));
        for (pre, how) in [(Pre::Plain, "plain"), (norm.pre(), "normed"), (Pre::Gated(Activation::Silu), "gated")]
            .into_iter()
            .chain(gelu)
        {
            let width = if how.ends_with("gated") { 2 * k } else { k };
            for n in few_rows() {
                let xs = values(n * (width + 3), n as u32, 2.0);
                let x =
                    Tensor::<2>::from_data(TensorData::new(xs.clone(), [n, width + 3]), &device).narrow(1, 0, width);
                let r = values(n * outs, 40 + n as u32, 1.0);
                let residual = Tensor::<2>::from_data(TensorData::new(r.clone(), [n, outs]), &device);
                let kernel = if n <= gpu_fused_rows() { "xwt_q" } else { "dequantize" };
                let got = ran(spec, kernel, || host(layer.forward_with(x.clone(), pre, Some(residual))));
                let mut want = Vec::with_capacity(n * outs);
                for (i, row) in xs.chunks(width + 3).enumerate() {
                    let input = product_input(row, how, k, &g);
                    for o in 0..outs {
                        let dot: f64 = input.iter().zip(&stored[o * k..(o + 1) * k]).map(|(a, &w)| a * w as f64).sum();
                        want.push(dot + b[o] as f64 + r[i * outs + o] as f64);
                    }
                }
                assert_close(&got, &want, 1e-4, &format!("{name} weight, {how} input, {n} rows, plus a residual"));
            }
        }
    }
}

/// Greedy decoding's pick on the device (`output::argmax_rows`; on a GPU the two-launch kernel)
/// against the host's `argmax`: rows shorter than a chunk, and long enough that a merging unit
/// takes several chunks; the maximum at the first and the last index, repeated across chunks
/// and within one unit's stride (the first wins), beside NaN and −∞; a strided view.
#[test]
fn argmax_rows_take_the_first_largest_value() {
    use llaisys_model::output::argmax_rows;
    let (spec, device) = device();
    for (n, vocab) in [(1, 7), (3, 1000), (3, 151_936), (2, 1024 * 130 + 5)] {
        let mut x = values(n * (vocab + 2), vocab as u32, 4.0);
        // Where index i of row r is in x: the view starts at column 1 of rows of vocab + 2.
        let at = |r: usize, i: usize| r * (vocab + 2) + 1 + i;
        // Row 0: its largest value first; row 1: last and, as large, in the middle twice (one
        // unit's stride apart); row 2: in two chunks, twice in one unit's stride and at two
        // units of the first chunk, with NaN and −∞ before.
        x[at(0, 0)] = 9.0;
        if n > 1 {
            x[at(1, vocab - 1)] = 9.5;
            x[at(1, vocab / 2)] = 9.5;
            x[at(1, vocab / 2 + 128)] = 9.5;
        }
        if n > 2 {
            x[at(2, 10)] = f32::NAN;
            x[at(2, 20)] = f32::NEG_INFINITY;
            for i in [vocab - 3, 900, 514, 130].into_iter().chain((vocab > 1100).then_some(1026)) {
                x[at(2, i)] = 8.0;
            }
        }
        let input = Tensor::<2>::from_data(TensorData::new(x.clone(), [n, vocab + 2]), &device).narrow(1, 1, vocab);
        let got: Vec<i64> =
            ran(spec, "argmax_chunks", || argmax_rows(&input)).into_data().convert::<i64>().try_into_vec().unwrap();
        let want: Vec<i64> =
            (0..n).map(|r| llaisys_model::argmax(&x[at(r, 0)..at(r, vocab)]).unwrap() as i64).collect();
        assert_eq!(got, want, "{n} rows of {vocab}");
    }
}

/// Sampling's candidates on the device (`kernels::gpu_top_k`, two launches) against a sort on
/// the host: each row's k largest values best first, the smaller index first among equal ones
/// (the test values repeat: a row of 151,936 holds each about 76 times), NaN and −∞ never, +∞
/// first; k past the row's values padded with (−f32::MAX, 1e30); rows shorter than a chunk and
/// over several; a strided view. With a temperature a row, the same candidates and each row's
/// mass Σ exp((l − max) / t) (0 at t = 0, not finite where the row holds +∞). No kernel on the
/// CPU (its rows are in memory already).
#[test]
fn top_k_rows_take_the_largest_values_best_first() {
    use llaisys_model::kernels::gpu_top_k;
    let (spec, device) = device();
    for (n, vocab, k) in [(1, 7, 10), (3, 1000, 5), (3, 151_936, 64), (2, 4096 * 3 + 5, 20)] {
        let mut x = values(n * (vocab + 2), vocab as u32, 4.0);
        let at = |r: usize, i: usize| r * (vocab + 2) + 1 + i;
        x[at(0, vocab / 2)] = f32::NAN;
        x[at(0, vocab - 1)] = f32::NEG_INFINITY;
        if n > 1 {
            x[at(1, vocab - 1)] = f32::INFINITY;
            x[at(1, 3)] = 100.0;
            x[at(1, vocab / 3)] = 100.0;
        }
        let input = Tensor::<2>::from_data(TensorData::new(x.clone(), [n, vocab + 2]), &device).narrow(1, 1, vocab);
        let Some(top) = ran(spec, "top_k", || gpu_top_k(&input, k, None)) else {
            assert_eq!(spec, DeviceSpec::Cpu, "no top-k kernel ran on {spec}");
            return;
        };
        assert_eq!(top.dims(), [n, k, 2]);
        let got = host(top);
        for r in 0..n {
            let row = &x[at(r, 0)..at(r, vocab)];
            let mut order: Vec<usize> = (0..vocab).filter(|&i| row[i] > f32::NEG_INFINITY).collect();
            order.sort_by(|a, b| row[*b].total_cmp(&row[*a]).then(a.cmp(b)));
            let want: Vec<f32> = (0..k)
                .flat_map(|t| match order.get(t) {
                    Some(&i) => [row[i], i as f32],
                    None => [f32::MIN, 1.0e30],
                })
                .collect();
            assert_eq!(got[r * k * 2..(r + 1) * k * 2], want[..], "row {r} of {n} × {vocab}, k = {k}");
        }
        let temps: Vec<f32> = (0..n).map(|r| [0.7, 1.0, 0.0][r % 3]).collect();
        let with_mass = host(gpu_top_k(&input, k, Some(&temps)).expect("the kernel ran without a mass"));
        assert_eq!(with_mass.len(), n * (k + 1) * 2);
        for r in 0..n {
            let pairs = &with_mass[r * (k + 1) * 2..(r + 1) * (k + 1) * 2];
            assert_eq!(pairs[..k * 2], got[r * k * 2..(r + 1) * k * 2], "row {r}: the candidates with a mass");
            let (mass, row) = (pairs[k * 2], &x[at(r, 0)..at(r, vocab)]);
            let max = row.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
            let what = format!("row {r} of {n} × {vocab} at t = {}: mass {mass}", temps[r]);
            if temps[r] == 0.0 {
                assert_eq!(mass, 0.0, "{what}");
            } else if max == f32::INFINITY {
                assert!(!mass.is_finite(), "{what}");
            } else {
                let want: f64 =
                    row.iter().filter(|v| !v.is_nan()).map(|&v| f64::from((v - max) / temps[r]).exp()).sum();
                assert!((f64::from(mass) - want).abs() <= 1e-4 * want, "{what}, want {want}");
            }
        }
    }
}

/// A mixture of experts' feed-forward against an f64 reference: each row's top-k experts by the
/// router's softmax (renormalised or not), their SwiGLU outputs weighed and summed, a shared
/// expert scaled by its sigmoid gate, the layer's norm before and a residual after. On a GPU
/// the experts are stacked and a decode step's rows are routed and run there, nothing read
/// back: one pair an expert or fewer a pair at a time (`moe_route`, `xwt_experts`,
/// `moe_combine`), more grouped by expert (`moe_group`, `moe_gather`, `xwt_grouped`), a
/// prompt's many rows on the host; over dense f32, f16 and bf16 experts (the 16-bit types where
/// the device computes in them) and quantized ones (Q8_0, and Q4_K with Q6_K down products).
#[test]
fn experts_routed_on_the_device_match_a_reference() {
    use burn::tensor::FloatDType;
    use llaisys_model::layers::{Choice, Expert, ExpertStacks, Linear, Moe, Pre, linear};
    use llaisys_model::quant::QuantType;
    use llaisys_model::quant::device::DeviceRows;
    let (spec, device) = device();
    let on_gpu = llaisys_model::kernels::blocks_run_on(&device);
    // (name, hidden, width, experts, top_k, gate/up storage, down storage): None is dense f32.
    type Storage = Option<Result<FloatDType, QuantType>>;
    let mut cases: Vec<(&str, usize, usize, usize, usize, Storage, Storage)> =
        vec![("f32, 7 experts, top 2", 40, 24, 7, 2, None, None), ("f32, 9 experts, top 3", 72, 40, 9, 3, None, None)];
    // More experts than the grouping kernel's units, and a router that sends most rows to one
    // expert (many chunks of it).
    cases.push(("f32, 300 experts, top 2", 32, 16, 300, 2, None, None));
    cases.push(("f32, 6 experts, top 2, skewed", 32, 16, 6, 2, None, None));
    // More pairs a row than a cube's groups: the down products sum a row's pairs in passes.
    cases.push(("f32, 24 experts, top 10", 32, 16, 24, 10, None, None));
    if on_gpu {
        cases.push(("bf16, 8 experts, top 2", 64, 48, 8, 2, Some(Ok(FloatDType::BF16)), Some(Ok(FloatDType::BF16))));
        cases.push(("f16, 4 experts, top 2", 48, 64, 4, 2, Some(Ok(FloatDType::F16)), Some(Ok(FloatDType::F16))));
        cases.push(("Q8_0, 6 experts, top 2", 64, 96, 6, 2, Some(Err(QuantType::Q8_0)), Some(Err(QuantType::Q8_0))));
        cases.push((
            "Q4_K/Q6_K, 5 experts, top 1",
            256,
            256,
            5,
            1,
            Some(Err(QuantType::Q4K)),
            Some(Err(QuantType::Q6K)),
        ));
    }
    for (case, &(name, hidden, width, experts, top_k, gu_storage, d_storage)) in cases.iter().enumerate() {
        let sixteen = match gu_storage {
            Some(Ok(dtype)) if dtype != FloatDType::F32 => Some(dtype),
            _ => None,
        };
        if sixteen.is_some_and(|dtype| !device.supports_dtype(DType::from(dtype))) {
            eprintln!("{spec} does not compute in {sixteen:?}: {name} is not checked here");
            continue;
        }
        let seed = 1000 * (case as u32 + 1);
        // A matrix in its storage, and the values it holds (as the kernels read them).
        let matrix =
            |rows: usize, k: usize, seed: u32, storage: Storage| -> (llaisys_model::layers::Weight, Vec<f32>) {
                match storage {
                    None | Some(Ok(FloatDType::F32)) => {
                        let v = values(rows * k, seed, 0.3);
                        (linear::dense(Tensor::from_data(TensorData::new(v.clone(), [rows, k]), &device)), v)
                    }
                    Some(Ok(dtype)) => {
                        let v = rounded(&values(rows * k, seed, 0.3), dtype, &device);
                        let t = Tensor::<2>::from_data(TensorData::new(v.clone(), [rows, k]), &device).cast(dtype);
                        (linear::dense(t), v)
                    }
                    Some(Err(ty)) => {
                        let (bytes, v) = random_blocks(ty, rows, k, seed);
                        let part = DeviceRows::upload(ty, rows, k, &bytes, &device).unwrap();
                        (linear::blocks(vec![part], DType::F32), v)
                    }
                }
            };
        let mut reference = Vec::new();
        let expert = |e: u32, (gate, up, down): &mut (Vec<f32>, Vec<f32>, Vec<f32>)| {
            let (g, gv) = matrix(width, hidden, seed + 3 * e, gu_storage);
            let (u, uv) = matrix(width, hidden, seed + 3 * e + 1, gu_storage);
            let (d, dv) = matrix(hidden, width, seed + 3 * e + 2, d_storage);
            (*gate, *up, *down) = (gv, uv, dv);
            Expert {
                gate_up: Linear { weight: linear::stack(vec![g, u]), bias: None },
                down: Linear { weight: d, bias: None },
                activation: Activation::Silu,
            }
        };
        let mut all = Vec::new();
        for e in 0..experts as u32 {
            let mut m = Default::default();
            all.push(expert(e, &mut m));
            reference.push(m);
        }
        let mut shared_ref = Default::default();
        let shared_expert = expert(99, &mut shared_ref);
        let (mut router, mut router_v) = matrix(experts, hidden, seed + 500, None);
        if name.ends_with("skewed") {
            // Expert 0's logit is 3 · Σx: far above the others' (about ±1) for about half the
            // rows.
            router_v[..hidden].iter_mut().for_each(|w| *w = 3.0);
            let t = Tensor::<2>::from_data(TensorData::new(router_v.clone(), [experts, hidden]), &device);
            router = linear::dense(t);
        }
        let (_, gate_v) = matrix(1, hidden, seed + 501, None);
        // With a shared expert, its gate's row after the router's.
        let gated =
            Tensor::<2>::from_data(TensorData::new([&router_v[..], &gate_v].concat(), [experts + 1, hidden]), &device);
        let gated = linear::dense(gated);
        let watch = llaisys_model::launches::watch(false);
        let (all, stacks) = ExpertStacks::build(all);
        assert_eq!(stacks.is_some(), on_gpu, "{name}: the experts are stacked where the device routes them");
        if let Some(watch) = watch.filter(|_| on_gpu) {
            // Each expert's matrices (whole multiples of 256 bytes here, as a real model's are:
            // the device's buffer alignment divides that) are views of its rows of the stacks:
            // the stacking copies, no slice does (an expert of 8,200 bytes is copied on
            // llvmpipe).
            let launched = watch.take();
            let copies: Vec<_> =
                launched.by_kernel.keys().filter(|k| k.to_ascii_lowercase().contains("slicekernel")).collect();
            assert!(copies.is_empty(), "{name}: the experts' views were copied: {copies:?}");
        }
        // The layer's RMSNorm before the experts, inside their products where they run on the
        // device (with the residual, in the cases without the router's renormalisation).
        let g = values(hidden, seed + 88, 1.5);
        let rms = RmsNorm { weight: Tensor::from_data(TensorData::new(g.clone(), [hidden]), &device), eps: 1e-6 };
        for norm in [true, false] {
            let moe = Moe {
                router: Linear { weight: if norm { router.clone() } else { gated.clone() }, bias: None },
                experts: all.clone(),
                top_k,
                norm_topk_prob: norm,
                choice: Choice::Softmax,
                routed_scale: 1.0,
                shared: (!norm).then(|| shared_expert.clone()),
                shared_gated: true,
                stacks: stacks.clone(),
            };
            // 13 rows group on the device in every case, 60 on the host where that is more
            // than 16 pairs an expert (`LLAISYS_GPU_MOE_GROUPED` unset).
            let rows: &[usize] = match experts {
                // Up to 16 pairs an expert: grouped on the device.
                300 => &[1, 13, 200, 2400],
                _ if name.ends_with("skewed") => &[5, 13, 40],
                _ => &[1, 2, 5, 13, 60],
            };
            for &n in rows {
                let xs = values(n * hidden, seed + n as u32, 2.0);
                let x = Tensor::<2>::from_data(TensorData::new(xs.clone(), [n, hidden]), &device);
                // The residual connection in the same pass, in the cases with the layer's norm.
                let r = values(n * hidden, seed + 77, 1.0);
                let residual =
                    (!norm).then(|| Tensor::<2>::from_data(TensorData::new(r.clone(), [n, hidden]), &device));
                let pairs = n * top_k;
                let grouped = llaisys_model::kernels::gpu_moe_pairs_per_expert();
                let routed_here = on_gpu && pairs <= grouped * experts;
                assert_eq!(moe.routes_on_device(n), routed_here, "{name}, {n} rows");
                let pre = if norm { Pre::Plain } else { rms.pre() };
                let run = || host(moe.forward_with(x, pre, residual));
                let got = match pairs <= experts {
                    _ if !routed_here => run(),
                    true => ran_all(spec, &["moe_route", "experts", "experts_sum"], run),
                    false => ran_all(spec, &["moe_route", "moe_group", "moe_gather", "grouped", "moe_combine"], run),
                };
                let mut want = Vec::with_capacity(n * hidden);
                for row in xs.chunks(hidden) {
                    let dot = |m: &[f32], o: usize, input: &[f64]| -> f64 {
                        input.iter().zip(&m[o * input.len()..(o + 1) * input.len()]).map(|(a, &w)| a * w as f64).sum()
                    };
                    let x64 = product_input(row, if norm { "plain" } else { "normed" }, hidden, &g);
                    let run = |(gv, uv, dv): &(Vec<f32>, Vec<f32>, Vec<f32>)| -> Vec<f64> {
                        let h: Vec<f64> = (0..width)
                            .map(|i| {
                                let (g, u) = (dot(gv, i, &x64), dot(uv, i, &x64));
                                g / (1.0 + (-g).exp()) * u
                            })
                            .collect();
                        (0..hidden).map(|o| dot(dv, o, &h)).collect()
                    };
                    let logits: Vec<f64> = (0..experts).map(|e| dot(&router_v, e, &x64)).collect();
                    let max = logits.iter().copied().fold(f64::MIN, f64::max);
                    let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                    let mut order: Vec<usize> = (0..experts).collect();
                    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
                    let p = |e: usize| (logits[e] - max).exp() / sum;
                    let picked: f64 = order[..top_k].iter().map(|&e| p(e)).sum();
                    let mut out = vec![0.0f64; hidden];
                    for &e in &order[..top_k] {
                        let w = if norm { p(e) / picked } else { p(e) };
                        out.iter_mut().zip(run(&reference[e])).for_each(|(o, y)| *o += w * y);
                    }
                    if !norm {
                        let g = dot(&gate_v, 0, &x64);
                        out.iter_mut().zip(run(&shared_ref)).for_each(|(o, y)| *o += y / (1.0 + (-g).exp()));
                    }
                    want.extend(out);
                }
                if !norm {
                    want.iter_mut().zip(&r).for_each(|(w, r)| *w += *r as f64);
                }
                let how = match pairs <= experts {
                    _ if !routed_here => "on the host",
                    true => "on the device, a pair at a time",
                    false => "on the device, grouped by expert",
                };
                // Within f32's rounding of the largest output (the quantized experts' outputs
                // reach 1e6 and cancel to values near 0); the host's many-row products round the
                // activations to a 16-bit weight's type.
                let tol = if sixteen.is_some() && !routed_here { 3e-2 } else { 1e-5 };
                let scale = want.iter().fold(1.0f64, |m, w| m.max(w.abs()));
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let what = format!("{name}, norm {norm}, {n} rows routed {how}");
                    assert!((*g as f64 - w).abs() <= tol * scale, "{what}[{i}]: {g} vs {w} (largest {scale})");
                }
            }
        }
    }
}
