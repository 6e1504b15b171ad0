//! 16-bit KV caches (f16, the CPU's default, and bf16): half the cache's bytes, logits close to
//! the f32 cache's, greedy tokens identical on every fixture, and the sequence operations
//! (copies, shifts, removal and recomputation) behave as on an f32 cache.

use llaisys_model::generate::{greedy, one_sequence};
use llaisys_model::{Context, Device, DeviceSpec, KvDtype, LoadOptions, ModelSource, argmax, load_model};
use llaisys_tests::{FIXTURES, Reference, fixture_dir, max_abs_diff, test_device};

const SIXTEEN: [KvDtype; 2] = [KvDtype::F16, KvDtype::BF16];

fn device() -> Device {
    test_device().parse::<DeviceSpec>().unwrap().device().unwrap()
}

fn context(name: &str, capacity: usize, dtype: KvDtype) -> Context {
    let model =
        load_model(None, Some(&ModelSource::Dir(fixture_dir(name))), &LoadOptions::default(), &device()).unwrap();
    Context::with_kv_dtype(model, capacity, dtype)
}

/// The largest logit error allowed, as a share of the logit scale: f16 keeps 11 significant
/// bits, bf16 8. Measured over every fixture's prompts: at most 0.08% (f16) and 0.75% (bf16).
fn tolerance(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::F32 => 1e-4,
        KvDtype::F16 => 4e-3,
        KvDtype::BF16 => 3e-2,
    }
}

fn scale(logits: &[f32]) -> f32 {
    logits.iter().fold(0f32, |m, v| m.max(v.abs()))
}

#[test]
fn the_cpu_default_is_f16_and_takes_half_the_bytes_of_f32() {
    let model = |dtype| context("tiny-tied-f32", 100, dtype);
    let (f32_cache, f16_cache) = (model(KvDtype::F32), model(KvDtype::F16));
    assert_eq!(f16_cache.kv().size_bytes() * 2, f32_cache.kv().size_bytes());
    assert_eq!(model(KvDtype::BF16).kv().size_bytes(), f16_cache.kv().size_bytes());
    assert_eq!(KvDtype::default_for(&Device::flex()), KvDtype::F16);
    for dtype in KvDtype::ALL {
        assert_eq!(dtype.name().parse::<KvDtype>(), Ok(dtype));
    }
    assert!("q4".parse::<KvDtype>().unwrap_err().contains("f32, f16, bf16"));
}

/// Every fixture's prompts: logits within the dtype's share of the scale of the f32 reference,
/// and the reference's greedy tokens.
#[test]
fn sixteen_bit_caches_keep_every_fixtures_logits_close_and_greedy_tokens_identical() {
    for name in FIXTURES {
        for dtype in SIXTEEN {
            let mut ctx = context(name, 256, dtype);
            for (s, p) in Reference::load(name).prompts.iter().enumerate() {
                ctx.decode(&one_sequence(&p.ids, s as u32, 0)).unwrap();
                let row = ctx.outputs().row(0).unwrap();
                let (err, scale) = (max_abs_diff(row, &p.last_logits), scale(&p.last_logits));
                assert!(err < tolerance(dtype) * scale, "{name} {dtype} prompt {s}: error {err}, scale {scale}");
                let tokens = greedy(&mut ctx, 100 + s as u32, &p.ids, p.greedy.len(), &[]).unwrap().tokens;
                assert_eq!(tokens, p.greedy, "{name} {dtype} prompt {s}: greedy tokens");
            }
        }
    }
}

/// A copied sequence and its source continue alike; a shifted cache (keys re-rotated through
/// the 16-bit store) decodes like the prompt computed at the shifted positions; a removed tail
/// recomputes to the same logits.
#[test]
fn sequence_operations_work_on_sixteen_bit_caches() {
    let name = "tiny-tied-f32";
    let p = &Reference::load(name).prompts[0];
    let n = p.ids.len() as i64;
    for dtype in SIXTEEN {
        let tol = tolerance(dtype) * scale(&p.last_logits);
        // Copy.
        let mut ctx = context(name, 128, dtype);
        ctx.decode(&one_sequence(&p.ids, 0, 0)).unwrap();
        ctx.kv_mut().seq_cp(0, 1, ..).unwrap();
        let next = argmax(ctx.outputs().row(0).unwrap()).unwrap();
        let mut rows = Vec::new();
        for seq in [0, 1] {
            ctx.decode(&one_sequence(&[next], seq, n)).unwrap();
            rows.push(ctx.outputs().row(0).unwrap().to_vec());
        }
        assert_eq!(rows[0], rows[1], "{dtype}: a copy reads the same cells");
        // Shift by +17.
        let mut shifted = context(name, 128, dtype);
        shifted.decode(&one_sequence(&p.ids, 0, 0)).unwrap();
        shifted.kv_mut().seq_add(0, .., 17).unwrap();
        let mut fresh = context(name, 128, dtype);
        fresh.decode(&one_sequence(&p.ids, 0, 17)).unwrap();
        for c in [&mut shifted, &mut fresh] {
            c.decode(&one_sequence(&[next], 0, n + 17)).unwrap();
        }
        let err = max_abs_diff(shifted.outputs().row(0).unwrap(), fresh.outputs().row(0).unwrap());
        assert!(err < tol, "{dtype}: decode after a shift differs by {err}");
        // Remove the last three positions and recompute them.
        let mut ctx = context(name, 128, dtype);
        ctx.decode(&one_sequence(&p.ids, 0, 0)).unwrap();
        let before = ctx.outputs().row(0).unwrap().to_vec();
        ctx.kv_mut().seq_rm(0, n - 3..).unwrap();
        assert_eq!(ctx.kv().used(), p.ids.len() - 3);
        ctx.decode(&one_sequence(&p.ids[p.ids.len() - 3..], 0, n - 3)).unwrap();
        let err = max_abs_diff(ctx.outputs().row(0).unwrap(), &before);
        assert!(err < tol, "{dtype}: a recomputed tail differs by {err}");
    }
}
