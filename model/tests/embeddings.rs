//! Embeddings (`Context::embeddings`) against transformers' float64 last hidden states, pooled by
//! the last token and by the mean (`scripts/make_embedding_reference.py` wrote the reference),
//! and the same whether an input runs alone or in a batch; the context's own cache is untouched.

use llaisys_model::{Batch, Context, Device, DeviceSpec, KvDtype, LoadOptions, ModelSource, Pooling, load_model};
use llaisys_tests::{fixture_dir, test_device};
use serde_json::Value;

fn context(name: &str) -> Context {
    let device: Device = test_device().parse::<DeviceSpec>().unwrap().device().unwrap();
    let model = load_model(None, Some(&ModelSource::Dir(fixture_dir(name))), &LoadOptions::default(), &device).unwrap();
    Context::with_kv_dtype(model, 256, KvDtype::F32)
}

fn normalised(v: &[f32]) -> Vec<f64> {
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    v.iter().map(|x| f64::from(*x) / norm).collect()
}

#[test]
fn embeddings_match_transformers_in_float64_pooled_by_last_token_and_mean() {
    for name in ["tiny-untied-f32", "tiny-qwen3-f32"] {
        let reference: Value =
            serde_json::from_str(&std::fs::read_to_string(fixture_dir(name).join("embeddings.json")).unwrap()).unwrap();
        let inputs = reference["inputs"].as_array().unwrap();
        let ids: Vec<Vec<u32>> = inputs
            .iter()
            .map(|i| i["ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect())
            .collect();
        let ctx = context(name);
        for (pooling, key) in [(Pooling::Last, "last"), (Pooling::Mean, "mean")] {
            let got = ctx.embeddings(&ids, pooling).unwrap();
            for (i, (g, r)) in got.iter().zip(inputs).enumerate() {
                let want: Vec<f64> = r[key].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
                let err = normalised(g).iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(err < 1e-4, "{name} {key} input {i}: max error {err}");
            }
        }
    }
}

#[test]
fn an_input_embeds_the_same_alone_and_in_a_batch_of_sixteen_and_the_cache_is_untouched() {
    let ctx = context("tiny-untied-f32");
    let inputs: Vec<Vec<u32>> =
        (0..16u32).map(|i| (0..(3 + i * 5)).map(|t| (t * 37 + i * 11) % 900 + 5).collect()).collect();
    for pooling in [Pooling::Last, Pooling::Mean] {
        let together = ctx.embeddings(&inputs, pooling).unwrap();
        for (i, input) in inputs.iter().enumerate() {
            let alone = ctx.embeddings(std::slice::from_ref(input), pooling).unwrap();
            let (a, b) = (normalised(&alone[0]), normalised(&together[i]));
            let err = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(err < 1e-5, "{pooling:?} input {i}: alone and batched differ by {err}");
        }
    }
    assert_eq!(ctx.kv().used(), 0, "no cell of the context's cache was used");
    let mut ctx = ctx;
    ctx.decode(&Batch::one(vec![5, 6, 7])).unwrap();
    let before = ctx.kv().used();
    ctx.embeddings(&inputs[..2], Pooling::Last).unwrap();
    assert_eq!(ctx.kv().used(), before, "a running sequence's cells stay as they were");
    assert!(ctx.embeddings(&[vec![]], Pooling::Last).is_err(), "an empty input is refused");
}
