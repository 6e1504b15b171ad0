//! The committed test fixtures: tiny random Qwen2 checkpoints in Hugging Face layout with
//! reference outputs from transformers (made by `scripts/make_fixtures.py`), and helpers to
//! compare against them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// The fixture models (directory names).
pub const FIXTURES: [&str; 30] = [
    "tiny-tied-f32",
    "tiny-untied-f32",
    "tiny-bf16",
    "tiny-qwen3-f32",
    "tiny-llama-f32",
    "tiny-qwen3moe-f32",
    "tiny-qwen2moe-f32",
    "tiny-qwen35-f32",
    "tiny-qwen35moe-f32",
    "tiny-qwen3next-f32",
    "tiny-mistral-f32",
    "tiny-mixtral-f32",
    "tiny-ministral3-f32",
    "tiny-phi3-f32",
    "tiny-gemma3-f32",
    "tiny-gemma2-f32",
    "tiny-gptoss-f32",
    "tiny-smollm3-f32",
    "tiny-olmo2-f32",
    "tiny-olmo3-f32",
    "tiny-granite-f32",
    "tiny-glm4moe-f32",
    "tiny-glm4-f32",
    "tiny-glm4moelite-f32",
    "tiny-deepseekv2-f32",
    "tiny-mistral4-f32",
    "tiny-qwen3vl-f32",
    "tiny-qwen3vlmoe-f32",
    "tiny-qwen25vl-f32",
    "tiny-qwen2vl-f32",
];

/// The device the model-level tests run on, as `--device` spells it: `LLAISYS_TEST_DEVICE`,
/// else `cpu`. `scripts/test-wgpu.sh` sets `gl` (Mesa's llvmpipe) in a build with the `wgpu`
/// feature.
pub fn test_device() -> String {
    std::env::var("LLAISYS_TEST_DEVICE").unwrap_or_else(|_| "cpu".into())
}

/// The demo model named by `LLAISYS_TEST_MODEL` (the GGUF `scripts/fetch_demo_model.sh` makes,
/// or a Hugging Face directory), for the tests that are `#[ignore]`d without it. Panics with how
/// to get it when it is not set.
pub fn demo_model() -> String {
    std::env::var("LLAISYS_TEST_MODEL").expect(
        "LLAISYS_TEST_MODEL names the demo model: scripts/fetch_demo_model.sh, then \
         LLAISYS_TEST_MODEL=models/qwen2.5-coder-0.5b-instruct.gguf",
    )
}

/// Absolute path of fixture `name`.
pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

/// A changed copy of a fixture in a directory of its own, removed when dropped.
pub struct FixtureCopy(PathBuf);

impl FixtureCopy {
    /// A copy of fixture `name` whose context is `context` tokens (a tool-describing system
    /// prompt in a tiny vocabulary needs more than 256), a sliding window as long (Mistral's).
    pub fn long_context(name: &str, context: usize) -> Self {
        Self::edited(name, &format!("{context}"), |dir| widen_context(dir, context))
    }

    /// As `long_context`, with `from` in the chat template replaced by `to` (it must be there).
    pub fn template_edited(name: &str, context: usize, from: &str, to: &str) -> Self {
        Self::edited(name, "template", |dir| {
            widen_context(dir, context);
            edit_json(&dir.join("tokenizer_config.json"), |config| {
                let template = config["chat_template"].as_str().expect("a chat template");
                assert!(template.contains(from), "{from:?} is not in {name}'s template");
                config["chat_template"] = template.replace(from, to).into();
            })
        })
    }

    /// A copy of fixture `name` in a directory named as a reranker's (`…-Reranker-…`), whose
    /// vocabulary has "yes" and "no" as tokens of their own (added ones, in the logits' padding
    /// rows 1000 and 1001): what a yes/no reranker needs, on random weights; its context is 1024
    /// tokens, room for the judging prompt.
    pub fn reranker(name: &str) -> Self {
        Self::edited(name, "Reranker", |dir| {
            edit_json(&dir.join("config.json"), |config| config["max_position_embeddings"] = 1024.into());
            edit_json(&dir.join("tokenizer.json"), |tokenizer| {
                let added = tokenizer["added_tokens"].as_array_mut().expect("added tokens");
                for (id, word) in [(1000, "yes"), (1001, "no")] {
                    added.push(serde_json::json!({"id": id, "content": word, "single_word": false, "lstrip": false,
                                                  "rstrip": false, "normalized": false, "special": false}));
                }
            })
        })
    }

    /// A copy of fixture `name` (told apart by `tag`) with the Qwen3 chat template's generation
    /// prompt opening the think block, as DeepSeek-R1's and Qwen3-Thinking's templates do: the
    /// model's whole output is then reasoning until it writes `</think>`. Its context is 1024
    /// tokens, room for a tool's description.
    pub fn thinking(name: &str) -> Self {
        Self::edited(name, "thinking", |dir| {
            edit_json(&dir.join("config.json"), |config| config["max_position_embeddings"] = 1024.into());
            edit_json(&dir.join("tokenizer_config.json"), |config| {
                let template = config["chat_template"].as_str().expect("a chat template");
                let opened = template
                    .replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}");
                assert_ne!(opened, template, "the template's generation prompt was not found");
                config["chat_template"] = opened.into();
            })
        })
    }

    /// A copy of fixture `name` in a fresh directory, changed by `edit`.
    fn edited(name: &str, tag: &str, edit: impl FnOnce(&std::path::Path)) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("llaisys-{name}-{tag}-{}-{n}", std::process::id()));
        copy_dir(&fixture_dir(name), &dir);
        edit(&dir);
        Self(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

/// `from`'s files and folders (a fixture's `images/`) copied into `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("temp dir");
    for entry in std::fs::read_dir(from).expect("fixture") {
        let entry = entry.expect("fixture entry");
        if entry.file_type().expect("fixture entry").is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
        }
    }
}

/// Makes the fixture copy in `dir` a model of `context` tokens, a sliding window as long.
fn widen_context(dir: &std::path::Path, context: usize) {
    edit_json(&dir.join("config.json"), |config| {
        // A multimodal checkpoint's language model has its own config (Qwen3.5's).
        let text = if config.get("text_config").is_some() { &mut config["text_config"] } else { config };
        text["max_position_embeddings"] = context.into();
        if text.get("sliding_window").is_some_and(|w| !w.is_null()) {
            text["sliding_window"] = context.into();
        }
    })
}

/// Rewrites the JSON file at `path` with `edit`.
fn edit_json(path: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut value: serde_json::Value = serde_json::from_slice(&std::fs::read(path).expect("read")).expect("json");
    edit(&mut value);
    std::fs::write(path, value.to_string()).expect("write");
}

impl Drop for FixtureCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct TopK {
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
}

/// transformers' outputs for one prompt.
#[derive(Debug, Clone, Deserialize)]
pub struct PromptRef {
    pub text: String,
    pub ids: Vec<u32>,
    /// \[n_prompt\] the top-k logits of every position.
    pub topk: Vec<TopK>,
    /// \[vocab\] the full logits of the last prompt position.
    pub last_logits: Vec<f32>,
    /// Greedy continuation.
    pub greedy: Vec<u32>,
    pub greedy_text: String,
    pub min_margin: f32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Reference {
    pub model: String,
    pub prompts: Vec<PromptRef>,
}

impl Reference {
    pub fn load(name: &str) -> Reference {
        let path = fixture_dir(name).join("reference.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

/// Largest absolute difference between a logits row and the reference's top-k entries.
/// Panics if the row's argmax differs from the reference's top-1.
pub fn topk_error(row: &[f32], reference: &TopK) -> f32 {
    let best = row.iter().enumerate().fold(0, |b, (i, v)| if *v > row[b] { i } else { b });
    assert_eq!(best as u32, reference.ids[0], "argmax differs from the reference");
    reference.ids.iter().zip(&reference.logits).map(|(&id, &l)| (row[id as usize] - l).abs()).fold(0.0, f32::max)
}

/// Largest absolute difference between two rows of equal length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "row lengths differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// An importance matrix in llama.cpp's older `.dat` format (what `llama-imatrix` wrote before
/// GGUF): a count of entries, then per entry its name, its number of calls and its values, as
/// little-endian `i32` lengths and `f32` values.
pub fn imatrix_dat<N: AsRef<str>, V: AsRef<[f32]>>(entries: &[(N, i32, V)]) -> Vec<u8> {
    let mut b = (entries.len() as i32).to_le_bytes().to_vec();
    for (name, calls, values) in entries {
        let (name, values) = (name.as_ref(), values.as_ref());
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(name.as_bytes());
        b.extend(calls.to_le_bytes());
        b.extend((values.len() as i32).to_le_bytes());
        values.iter().for_each(|v| b.extend(v.to_le_bytes()));
    }
    b
}

/// A GGUF fixture (`fixtures/gguf/NAME.gguf`, made by `scripts/make_gguf_fixtures.py`).
pub fn gguf_fixture(name: &str) -> PathBuf {
    fixture_dir("gguf").join(format!("{name}.gguf"))
}

/// Fixture `name` as llama.cpp's own converter writes it (`fixtures/gguf/converted/NAME.gguf`,
/// made by `scripts/convert_fixtures_with_llamacpp.sh`).
pub fn converted_fixture(name: &str) -> PathBuf {
    fixture_dir("gguf").join("converted").join(format!("{name}.gguf"))
}

/// A float64 numpy forward pass's outputs for one prompt, over a GGUF fixture's dequantized
/// weights.
#[derive(Debug, Clone, Deserialize)]
pub struct GgufPromptRef {
    pub ids: Vec<u32>,
    /// \[vocab\] the logits of the last prompt position.
    pub last_logits: Vec<f32>,
    /// Greedy continuation.
    pub greedy: Vec<u32>,
    /// The smallest gap between the two best logits along the greedy path.
    pub min_margin: f32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GgufReference {
    pub file: String,
    pub prompts: Vec<GgufPromptRef>,
}

/// The references of every Qwen2 GGUF model fixture, by name (float64 numpy, from
/// scripts/make_gguf_fixtures.py).
pub fn gguf_references() -> BTreeMap<String, GgufReference> {
    read_gguf_references("reference.json")
}

/// The references of the GGUF fixtures of the other families, by name (transformers in f32 over
/// each file's dequantized weights, from scripts/make_family_fixtures.py).
pub fn gguf_family_references() -> BTreeMap<String, GgufReference> {
    read_gguf_references("family-reference.json")
}

fn read_gguf_references(file: &str) -> BTreeMap<String, GgufReference> {
    let path = fixture_dir("gguf").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
