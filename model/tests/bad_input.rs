//! Bad input gets an error that names the problem, never a panic: broken configs and
//! checkpoints (each a corrupted copy of a fixture) and malformed batches.

use std::path::Path;

use llaisys_model::generate::one_sequence;
use llaisys_model::{Batch, Context, DecodeError, Device, LoadError, LoadOptions, ModelSource, load_model};
use llaisys_tests::fixture_dir;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

const FIXTURE: &str = "tiny-tied-f32";

/// A copy of the fixture in a temporary directory.
fn copy_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture_dir(FIXTURE)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

fn load(dir: &Path) -> Result<Context, LoadError> {
    Ok(Context::new(
        load_model(None, Some(&ModelSource::Dir(dir.into())), &LoadOptions::default(), &Device::flex())?,
        64,
    ))
}

/// Rewrites `model.safetensors`, letting `edit` change the list of (name, dtype, shape, bytes).
fn rewrite_weights(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> =
        st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    edit(&mut tensors);
    let views: Vec<(String, TensorView<'_>)> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
}

fn edit_config(dir: &Path, field: &str, value: serde_json::Value) {
    let path = dir.join("config.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json[field] = value;
    std::fs::write(path, json.to_string()).unwrap();
}

fn load_err(dir: &Path) -> LoadError {
    match load(dir) {
        Ok(_) => panic!("expected a load error"),
        Err(e) => e,
    }
}

#[test]
fn an_inconsistent_head_size_names_the_field() {
    let dir = copy_fixture();
    edit_config(dir.path(), "hidden_size", 60.into());
    let err = load_err(dir.path());
    assert!(matches!(&err, LoadError::Config { field, .. } if field == "hidden_size"), "{err}");
}

#[test]
fn a_config_value_of_the_wrong_type_names_the_field() {
    let dir = copy_fixture();
    edit_config(dir.path(), "num_hidden_layers", "two".into());
    assert!(load_err(dir.path()).to_string().contains("num_hidden_layers"));
}

#[test]
fn a_missing_tensor_is_listed() {
    let dir = copy_fixture();
    rewrite_weights(dir.path(), |t| t.retain(|(n, ..)| n != "model.layers.1.self_attn.k_proj.bias"));
    let err = load_err(dir.path());
    assert!(
        matches!(&err, LoadError::MissingTensors(names) if names == &["model.layers.1.self_attn.k_proj.bias"]),
        "{err}"
    );
}

#[test]
fn an_unexpected_tensor_is_listed() {
    let dir = copy_fixture();
    rewrite_weights(dir.path(), |t| t.push(("model.layers.5.mystery.weight".into(), Dtype::F32, vec![1], vec![0; 4])));
    let err = load_err(dir.path());
    assert!(err.to_string().contains("model.layers.5.mystery.weight"), "{err}");
}

#[test]
fn a_tensor_of_the_wrong_shape_names_slot_and_layer() {
    let dir = copy_fixture();
    rewrite_weights(dir.path(), |t| {
        let q = t.iter_mut().find(|(n, ..)| n == "model.layers.1.self_attn.q_proj.weight").unwrap();
        q.2 = vec![32, 128];
    });
    let err = load_err(dir.path());
    assert_eq!(err.to_string(), "slot attn_q_w of layer 1: expected shape [64, 64], found [32, 128]");
}

#[test]
fn an_unsupported_dtype_names_the_slot() {
    let dir = copy_fixture();
    rewrite_weights(dir.path(), |t| {
        let norm = t.iter_mut().find(|(n, ..)| n == "model.norm.weight").unwrap();
        norm.1 = Dtype::I32;
    });
    let err = load_err(dir.path());
    assert!(matches!(&err, LoadError::Dtype { slot: "out_norm_w", layer: None, .. }), "{err}");
}

#[test]
fn a_truncated_safetensors_file_names_the_file() {
    let dir = copy_fixture();
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(dir.path());
    assert!(matches!(&err, LoadError::Safetensors { path, .. } if path.ends_with("model.safetensors")), "{err}");
}

#[test]
fn a_missing_directory_and_an_unknown_model_type_are_errors() {
    assert!(matches!(load_err(Path::new("/nonexistent/model")), LoadError::Io { .. }));
    let dir = copy_fixture();
    edit_config(dir.path(), "model_type", "bert".into());
    let err = load_err(dir.path());
    assert!(
        err.to_string().contains(
            "unknown model type `bert`; known types: qwen2, qwen3, llama, qwen2_moe, qwen3_moe, qwen3_5, qwen3_5_moe, qwen3_next, mistral, mixtral, ministral3, phi3, gemma3, gemma2, gpt_oss, smollm3, olmo2, granite, glm4_moe, glm4, deepseek_v3, mistral4, qwen3_vl, qwen3_vl_moe, qwen2_vl, mock"
        ),
        "{err}"
    );
    edit_config(dir.path(), "model_type", "deepseek_v32".into());
    let err = load_err(dir.path());
    assert!(matches!(&err, LoadError::UnsupportedArchitecture { name, .. } if name == "deepseek_v32"), "{err}");
    assert!(err.to_string().contains("sparse attention"), "{err}");
}

#[test]
fn malformed_batches_are_invalid_input_and_change_nothing() {
    let mut ctx = load(&fixture_dir(FIXTURE)).unwrap();
    ctx.decode(&one_sequence(&[10, 11, 12], 0, 0)).unwrap();
    let before = ctx.kv().dump();
    let mut backwards = Batch::new();
    backwards.push(1, 5, &[0], true);
    backwards.push(2, 4, &[0], true);
    let cases = [
        (Batch::one(vec![1, 1024]), "id 1024"),
        (backwards, "does not follow"),
        (one_sequence(&[1], 0, 1), "does not follow its last position 2"),
        (Batch::one(vec![]), "empty batch"),
        (one_sequence(&[1], 1, 256), "outside the context"),
    ];
    for (batch, expected) in cases {
        match ctx.decode(&batch) {
            Err(DecodeError::InvalidInput(msg)) => assert!(msg.contains(expected), "{msg}"),
            other => panic!("expected invalid input containing {expected:?}, got {other:?}"),
        }
        assert_eq!(ctx.kv().dump(), before);
    }
}
