//! Images through Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's and Gemma 3's vision towers, against what
//! transformers' own processor and model give for the same files (each fixture's
//! image_reference.json, written by scripts/make_image_fixtures.py): the processor's patches, the
//! tower's features (Qwen2.5-VL's through window attention: images of one window and of several
//! cut by the image's edges; Qwen3-VL's learned positions resampled to each grid, and its
//! deepstack features; Gemma 3's pooled), and a chat's logits and greedy tokens with the features
//! in place of the image tokens, each turned by M-RoPE (Qwen3-VL's deepstack added after its first
//! layers), or by its place with the image's rows seeing each other both ways (Gemma 3's).
//! The same towers and chats through the fixtures as llama.cpp's converter writes them: a GGUF
//! language model and its projector file (`--mmproj`).

use std::path::PathBuf;
use std::sync::Arc;

use llaisys_model::error::LoadError;
use llaisys_model::gguf::{self, GgufFile};
use llaisys_model::vision::PromptImages;
use llaisys_model::{
    Batch, Context, Device, DeviceSpec, Image, ImageProcessor, KvDtype, LoadOptions, ModelConfig, ModelSource, argmax,
    load_model,
};
use llaisys_tests::{converted_fixture, fixture_dir, max_abs_diff, test_device};
use serde::Deserialize;

/// Qwen2-VL and Gemma 3 as transformers saves them; Qwen2.5-VL, Qwen3-VL and Qwen3.5 (dense and
/// MoE) as Qwen releases them.
const FIXTURES: [&str; 7] = [
    "tiny-qwen2vl-f32",
    "tiny-qwen25vl-f32",
    "tiny-qwen3vl-f32",
    "tiny-qwen3vlmoe-f32",
    "tiny-qwen35-f32",
    "tiny-qwen35moe-f32",
    "tiny-gemma3vl-f32",
];

#[derive(Deserialize)]
struct Reference {
    images: Vec<ImageRef>,
    prompts: Vec<PromptRef>,
}

#[derive(Deserialize)]
struct ImageRef {
    file: String,
    grid: [usize; 3],
    /// The processor's `pixel_values` shape: [patches, values] (Qwen's), [1, 3, h, w] (Gemma's).
    patches: Vec<usize>,
    first_values: Vec<f32>,
    sum: f64,
    abs_sum: f64,
    features: Vec<Vec<f32>>,
    /// Qwen3-VL's: per deepstack layer, rows as `features`.
    deepstack: Vec<Vec<Vec<f32>>>,
}

#[derive(Deserialize)]
struct PromptRef {
    images: Vec<String>,
    ids: Vec<u32>,
    last_logits: Vec<f32>,
    greedy: Vec<u32>,
}

fn reference(fixture: &str) -> Reference {
    let path = fixture_dir(fixture).join("image_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn device() -> Device {
    test_device().parse::<DeviceSpec>().unwrap().device().unwrap()
}

fn context(fixture: &str) -> Context {
    load(&ModelSource::Dir(fixture_dir(fixture)))
}

fn load(source: &ModelSource) -> Context {
    let model = load_model(None, Some(source), &LoadOptions::default(), &device()).unwrap();
    Context::with_kv_dtype(model, 512, KvDtype::F32)
}

/// The fixtures llama.cpp's converter wrote as a GGUF model and a projector file.
const CONVERTED: [&str; 6] = [
    "tiny-qwen2vl-f32",
    "tiny-qwen25vl-f32",
    "tiny-qwen3vl-f32",
    "tiny-qwen35-f32",
    "tiny-qwen35moe-f32",
    "tiny-gemma3vl-f32",
];

fn mmproj(fixture: &str) -> PathBuf {
    fixture_dir("gguf").join("converted").join(format!("mmproj-{fixture}.gguf"))
}

fn converted(fixture: &str) -> ModelSource {
    ModelSource::Gguf { path: converted_fixture(fixture), mmproj: Some(mmproj(fixture)) }
}

fn processor(ctx: &Context) -> &ImageProcessor {
    &ctx.info().vision.as_ref().expect("the fixture sees images").processor
}

/// The fixture's image `r` as the checkpoint's processor prepares it.
fn prepare(processor: &ImageProcessor, fixture: &str, r: &ImageRef) -> Image {
    let bytes = std::fs::read(fixture_dir(fixture).join(&r.file)).unwrap();
    processor.prepare(&bytes).unwrap()
}

#[test]
fn the_processor_cuts_images_as_transformers_does() {
    for (fixture, r) in FIXTURES.iter().flat_map(|f| reference(f).images.into_iter().map(move |r| (*f, r))) {
        let ctx = context(fixture);
        let image = prepare(processor(&ctx), fixture, &r);
        assert_eq!(image.grid, r.grid, "{fixture} {}", r.file);
        assert_eq!(image.patches.len(), r.patches.iter().product::<usize>(), "{fixture} {}", r.file);
        let sum: f64 = image.patches.iter().map(|&v| v as f64).sum();
        let abs: f64 = image.patches.iter().map(|&v| (v as f64).abs()).sum();
        // The same 8-bit pixels (a resized image's too: torch's fixed-point resize), normalised
        // in f32: one level of 8 bits would move the sums by 0.015 a value.
        let tol = 1e-5 * r.abs_sum;
        assert!(
            (sum - r.sum).abs() < tol && (abs - r.abs_sum).abs() < tol,
            "{}: sums {sum}, {abs} vs {}, {}",
            r.file,
            r.sum,
            r.abs_sum
        );
        assert!(max_abs_diff(&image.patches[..16], &r.first_values) < 1e-5, "{}", r.file);
    }
}

#[test]
fn the_tower_gives_transformers_features() {
    for fixture in FIXTURES {
        let ctx = context(fixture);
        tower_features(fixture, &ctx, processor(&ctx), 1.0);
    }
}

/// `ctx`'s tower's features of the fixture's images as `processor` prepares them, against
/// transformers', within 1e-4 times `loose`.
fn tower_features(fixture: &str, ctx: &Context, processor: &ImageProcessor, loose: f32) {
    for r in reference(fixture).images {
        let image = prepare(processor, fixture, &r);
        let features = ctx.encode_image(&image).unwrap();
        let expected: Vec<f32> = r.features.concat();
        assert_eq!(features.rows.len(), expected.len(), "{fixture} {}", r.file);
        let err = max_abs_diff(&features.rows, &expected);
        assert!(err < 1e-4 * loose, "{fixture} {}: features off by {err}", r.file);
        assert_eq!(features.deepstack.len(), r.deepstack.len(), "{fixture} {}", r.file);
        for (k, (ours, theirs)) in features.deepstack.iter().zip(&r.deepstack).enumerate() {
            let err = max_abs_diff(ours, &theirs.concat());
            assert!(err < 1e-4 * loose, "{fixture} {}: deepstack {k} off by {err}", r.file);
        }
    }
}

#[test]
fn a_chat_with_images_gives_transformers_logits_and_greedy_tokens() {
    for fixture in FIXTURES {
        let mut ctx = context(fixture);
        let processor = processor(&ctx).clone();
        chat_with_images(fixture, &mut ctx, &processor, 1.0);
    }
}

/// The fixture's chats with images (prepared by `processor`) through `ctx`, against
/// transformers' last logits (within 1e-3 times `loose`) and greedy tokens.
fn chat_with_images(fixture: &str, ctx: &mut Context, processor: &ImageProcessor, loose: f32) {
    let reference = reference(fixture);
    let vision = ctx.info().vision.clone().unwrap();
    for (seq, p) in reference.prompts.iter().enumerate() {
        let images: Vec<Arc<Image>> = p
            .images
            .iter()
            .map(|name| {
                let r = reference.images.iter().find(|r| r.file.contains(name.as_str())).unwrap();
                Arc::new(prepare(processor, fixture, r))
            })
            .collect();
        let mut ids = p.ids.clone();
        let prompt = PromptImages::new(&mut ids, &vision, images, ctx.info().vocab_size).unwrap();
        let mut batch = Batch::new();
        for (i, &t) in ids.iter().enumerate() {
            batch.push(t, i as i64, &[seq as u32], i + 1 == ids.len());
        }
        for (image, &row) in prompt.images.iter().zip(&prompt.rows) {
            batch.embedded.push(ctx.encode_image(image).unwrap().embedded(image.tokens(), 0..image.tokens(), row));
        }
        batch.rope = prompt.mrope().then(|| prompt.rope.clone());
        batch.sees = prompt.bidirectional.then(|| (0..ids.len() as i64).map(|pos| prompt.sees(pos)).collect());
        ctx.decode(&batch).unwrap();
        let logits = ctx.outputs().row(0).unwrap().to_vec();
        let err = max_abs_diff(&logits, &p.last_logits);
        assert!(err < 1e-3 * loose, "{fixture} {:?}: last logits off by {err}", p.images);
        // Generated tokens turn by their index plus the prompt's delta, all three streams alike.
        let mut out = vec![argmax(&logits).unwrap()];
        while out.len() < p.greedy.len() {
            let pos = (p.ids.len() + out.len() - 1) as i64;
            let mut batch = Batch::new();
            batch.push(*out.last().unwrap(), pos, &[seq as u32], true);
            batch.rope = prompt.mrope().then(|| vec![prompt.rope_at(pos)]);
            ctx.decode(&batch).unwrap();
            out.push(argmax(ctx.outputs().row(0).unwrap()).unwrap());
        }
        assert_eq!(out, p.greedy, "{fixture} {:?}", p.images);
    }
}

#[test]
fn a_text_model_refuses_images_by_saying_so() {
    let source = ModelSource::Dir(fixture_dir("tiny-qwen3-f32"));
    let model = load_model(None, Some(&source), &LoadOptions::default(), &device()).unwrap();
    let ctx = Context::with_kv_dtype(model, 16, KvDtype::F32);
    assert!(ctx.info().vision.is_none());
    let image = Image { grid: [1, 2, 2], merge: 2, patches: vec![0.0; 4 * 1176], hash: 0 };
    let err = ctx.encode_image(&image).unwrap_err().to_string();
    assert!(err.contains("text only"), "{err}");
}

#[test]
fn a_gguf_model_with_its_projector_file_gives_transformers_features_and_chats() {
    for fixture in CONVERTED {
        // The checkpoint's processor prepares the images, so that their grids are the reference's.
        let processor = processor(&context(fixture)).clone();
        let mut ctx = load(&converted(fixture));
        // llama.cpp's converter writes Gemma 3's projection in f16, whatever the checkpoint's.
        let loose = if fixture.contains("gemma3") { 20.0 } else { 1.0 };
        tower_features(fixture, &ctx, &processor, loose);
        chat_with_images(fixture, &mut ctx, &processor, loose);
    }
}

/// A projector file in Q8_0 (its matrices kept in their blocks, as the language model keeps a
/// quantized file's) gives transformers' features and chats within Q8_0's rounding.
#[test]
fn a_quantized_projector_file_gives_transformers_features_and_chats() {
    let fixture = "tiny-gemma3vl-f32";
    let processor = processor(&context(fixture)).clone();
    let mmproj = fixture_dir("gguf").join("converted").join("mmproj-tiny-gemma3vl-q8_0.gguf");
    let mut ctx = load(&ModelSource::Gguf { path: converted_fixture(fixture), mmproj: Some(mmproj) });
    // Features off by 0.034 and logits by 0.02 on this machine (8-bit weights, and activations
    // rounded to 8 bits for the integer products).
    tower_features(fixture, &ctx, &processor, 600.0);
    chat_with_images(fixture, &mut ctx, &processor, 50.0);
}

#[test]
fn a_projector_files_processor_is_llama_cpps() {
    for fixture in CONVERTED {
        let ours = processor(&load(&converted(fixture))).clone();
        let checkpoint = processor(&context(fixture)).clone();
        let token = (ours.patch_size * ours.merge_size).pow(2);
        // The file's patch, merge and normalisation; llama.cpp's bounds of 8 to 4,096 tokens, or
        // Gemma 3's one size, one frame, bilinear.
        let (frames, bounds) = match checkpoint.fixed {
            Some(_) => (1, (checkpoint.min_pixels, checkpoint.max_pixels)),
            None => (2, (8 * token, 4096 * token)),
        };
        assert_eq!(
            (ours.patch_size, ours.merge_size, ours.temporal_patch_size, ours.mean, ours.std),
            (checkpoint.patch_size, checkpoint.merge_size, frames, checkpoint.mean, checkpoint.std),
            "{fixture}"
        );
        assert_eq!((ours.fixed, ours.filter), (checkpoint.fixed, checkpoint.filter), "{fixture}");
        assert_eq!((ours.min_pixels, ours.max_pixels), bounds, "{fixture}");
    }
}

#[test]
fn a_gguf_files_m_rope_is_the_checkpoints() {
    for fixture in CONVERTED {
        let hf = ModelConfig::from_dir(&fixture_dir(fixture)).unwrap();
        let file = gguf::model_config(&GgufFile::open(&converted_fixture(fixture)).unwrap()).unwrap();
        // Gemma 3's images turn by their places.
        assert_eq!(hf.mrope.is_some(), !fixture.contains("gemma3"), "{fixture}");
        assert_eq!(file.mrope, hf.mrope, "{fixture}");
    }
}

#[test]
fn a_projector_file_is_refused_where_it_cannot_serve() {
    let refused = |source: Result<ModelSource, LoadError>| -> String {
        let err = match source {
            Err(e) => e,
            Ok(source) => load_model(None, Some(&source), &LoadOptions::default(), &device()).err().unwrap(),
        };
        err.to_string()
    };
    // A checkpoint directory holds its own tower.
    let dir = ModelSource::Dir(fixture_dir("tiny-qwen2vl-f32")).with_mmproj(Some(mmproj("tiny-qwen2vl-f32")));
    let err = refused(dir);
    assert!(err.contains("Hugging Face directory"), "{err}");
    // A language model as the projector.
    let err = refused(
        ModelSource::gguf(converted_fixture("tiny-qwen2vl-f32"))
            .with_mmproj(Some(converted_fixture("tiny-qwen2vl-f32"))),
    );
    assert!(err.contains("not a projector") && err.contains("qwen2vl"), "{err}");
    // A text model's file has no M-RoPE sections for an image's rows.
    let text =
        ModelSource::Gguf { path: converted_fixture("tiny-llama-f32"), mmproj: Some(mmproj("tiny-qwen2vl-f32")) };
    let err = refused(Ok(text));
    assert!(err.contains("rope.dimension_sections"), "{err}");
}

#[test]
fn a_directory_of_a_gguf_model_and_its_projector_file_loads_both() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(converted_fixture("tiny-qwen2vl-f32"), dir.path().join("Model-F32.gguf")).unwrap();
    std::fs::copy(mmproj("tiny-qwen2vl-f32"), dir.path().join("mmproj-Model-F32.gguf")).unwrap();
    let source = ModelSource::resolve(dir.path()).unwrap();
    assert_eq!(
        source,
        ModelSource::Gguf {
            path: dir.path().join("Model-F32.gguf"),
            mmproj: Some(dir.path().join("mmproj-Model-F32.gguf"))
        }
    );
    assert!(load(&source).info().vision.is_some());
    // Two projector files: which one is the user's to say.
    std::fs::copy(mmproj("tiny-qwen2vl-f32"), dir.path().join("mmproj-Model-F16.gguf")).unwrap();
    let err = ModelSource::resolve(dir.path()).unwrap_err().to_string();
    assert!(err.contains("2 projector") && err.contains("--mmproj"), "{err}");
    // Without its projector file, the model takes text only.
    let text = load(&ModelSource::gguf(converted_fixture("tiny-qwen2vl-f32")));
    assert!(text.info().vision.is_none());
}
