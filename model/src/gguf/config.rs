//! C1 from a GGUF file: the `{arch}.*` keys become the Hugging Face config fields they were
//! converted from, validated by the same code as a `config.json`. Errors name the GGUF key.
//! What a file says only through its tensors is read from them: the attention biases, and
//! Llama 3's rope scaling (`rope_freqs.weight`).

use serde_json::{Map, Value as Json, json};

use super::GgufFile;
use crate::arch::Architecture;
use crate::config::{ModelConfig, RopeScaling};
use crate::decoder::{ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT, ROPE_FREQS};
use crate::error::LoadError;
use crate::tensors::TensorSource;

/// Hugging Face field ← GGUF key under `{arch}.`.
const FIELDS: [(&str, &str); 28] = [
    ("hidden_size", "embedding_length"),
    ("num_hidden_layers", "block_count"),
    ("num_attention_heads", "attention.head_count"),
    ("num_key_value_heads", "attention.head_count_kv"),
    ("head_dim", "attention.key_length"),
    ("intermediate_size", "feed_forward_length"),
    ("max_position_embeddings", "context_length"),
    ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
    ("rope_theta", "rope.freq_base"),
    ("num_experts", "expert_count"),
    ("num_experts_per_tok", "expert_used_count"),
    ("moe_intermediate_size", "expert_feed_forward_length"),
    ("shared_expert_intermediate_size", "expert_shared_feed_forward_length"),
    // GLM-4.5's experts and routing.
    ("n_shared_experts", "expert_shared_count"),
    ("first_k_dense_replace", "leading_dense_block_count"),
    ("routed_scaling_factor", "expert_weights_scale"),
    ("n_group", "expert_group_count"),
    ("topk_group", "expert_group_used_count"),
    // Qwen3.5's and Qwen3-Next's linear attention (`linear_attention` derives the rest).
    ("linear_conv_kernel_dim", "ssm.conv_kernel"),
    ("linear_key_head_dim", "ssm.state_size"),
    ("linear_num_key_heads", "ssm.group_count"),
    ("linear_num_value_heads", "ssm.time_step_rank"),
    ("full_attention_interval", "full_attention_interval"),
    // Phi-3's (0: none).
    ("sliding_window", "attention.sliding_window"),
    // Granite's multipliers.
    ("embedding_multiplier", "embedding_scale"),
    ("residual_multiplier", "residual_scale"),
    ("attention_multiplier", "attention.scale"),
    ("logits_scaling", "logit_scale"),
];

/// The fields of `FIELDS` that are real numbers (f32 in the file).
const FLOATS: [&str; 7] = [
    "rms_norm_eps",
    "routed_scaling_factor",
    "rope_theta",
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
];

/// Rope scaling keys under `{arch}.rope.scaling.`, as `rope_parameters` fields.
const ROPE_SCALING: [(&str, &str); 7] = [
    ("rope_type", "type"),
    ("factor", "factor"),
    ("original_max_position_embeddings", "original_context_length"),
    ("attention_factor", "attn_factor"),
    // YaRN's `mscale_all_dim` (llama.cpp takes `mscale` as 1 beside it, as its converter does).
    ("mscale_all_dim", "yarn_log_multiplier"),
    ("beta_fast", "yarn_beta_fast"),
    ("beta_slow", "yarn_beta_slow"),
];

/// The architecture (`general.architecture`).
pub fn architecture(file: &GgufFile) -> Result<String, LoadError> {
    file.get("general.architecture")
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .ok_or_else(|| file.error("general.architecture: missing, or not a string"))
}

/// The family the file is served as: its architecture's, or for a `llama` file with experts
/// (`llama.expert_count`), Mixtral's; `None` for an architecture not served.
pub fn family(file: &GgufFile) -> Option<&'static Architecture> {
    let arch = architecture(file).ok()?;
    let experts = file.get(&format!("{arch}.expert_count")).and_then(|v| v.as_u64()).is_some_and(|n| n > 0);
    crate::arch::find_gguf(&arch, experts)
}

/// The model type the file is loaded as: its family's name (`mixtral` for a `llama` file with
/// experts), else its architecture as written.
pub fn model_type(file: &GgufFile) -> Result<String, LoadError> {
    Ok(family(file).map_or(architecture(file)?, |f| f.name.to_string()))
}

/// The model's own blocks where the file has a multi-token-prediction head's after them
/// (`{arch}.nextn_predict_layers` > 0: Qwen3.5's, GLM-4.5's), which are not layers of the model:
/// `block_count` less those; `None` where it has none.
pub fn model_blocks(file: &GgufFile) -> Result<Option<u64>, LoadError> {
    let arch = architecture(file)?;
    let key = format!("{arch}.nextn_predict_layers");
    let Some(value) = file.get(&key) else { return Ok(None) };
    let nextn = value.as_u64().ok_or_else(|| file.error(format!("{key}: expected a number, found {value:?}")))?;
    let blocks = file.get(&format!("{arch}.block_count")).and_then(|v| v.as_u64());
    match blocks {
        Some(blocks) if nextn > 0 => blocks
            .checked_sub(nextn)
            .map(Some)
            .ok_or_else(|| file.error(format!("{key}: {nextn}, more than the {blocks} blocks"))),
        _ => Ok(None),
    }
}

/// The model's configuration.
pub fn model_config(file: &GgufFile) -> Result<ModelConfig, LoadError> {
    let arch = architecture(file)?;
    let family = family(file);
    let mut obj = Map::new();
    // The family's `config.json` name (a GGUF architecture may be spelled differently).
    obj.insert("model_type".into(), json!(family.map_or(arch.as_str(), |f| f.name)));
    for (field, key) in FIELDS {
        let key = format!("{arch}.{key}");
        let Some(v) = file.get(&key) else { continue };
        let number = if FLOATS.contains(&field) {
            // f32 in the file: its shortest decimal, as the converter read it (1e-6, not 9.99e-7).
            v.as_f64().map(|x| json!((x as f32).to_string().parse::<f64>().unwrap_or(x)))
        } else {
            v.as_u64().map(|x| json!(x))
        };
        obj.insert(field.into(), number.ok_or_else(|| file.error(format!("{key}: expected a number, found {v:?}")))?);
    }
    if let Some(layers) = model_blocks(file)? {
        obj.insert("num_hidden_layers".into(), json!(layers));
    }
    if family.is_some_and(|f| f.local_layers.is_some()) {
        local_layers(file, &arch, &mut obj)?;
    }
    if family.is_some_and(|f| f.gated_delta_net) {
        linear_attention(file, &arch, &mut obj)?;
    } else if family.is_some_and(|f| !f.gguf_qk_interleaved) {
        // A partial rotary embedding (Phi-4-mini's): the rotated part of each head.
        let rotated = file.get(&format!("{arch}.rope.dimension_count")).and_then(|v| v.as_u64());
        let number = |k: &str| obj.get(k).and_then(Json::as_u64);
        let head_dim =
            number("head_dim").or_else(|| Some(number("hidden_size")? / number("num_attention_heads")?.max(1)));
        if let (Some(rotated), Some(head_dim)) = (rotated, head_dim.filter(|&d| d > 0))
            && rotated <= head_dim
        {
            obj.insert("partial_rotary_factor".into(), json!(rotated as f64 / head_dim as f64));
        }
    }
    // llama.cpp's pooling types: 1 mean, 3 last (0 none, 2 cls and 4 rank are not decoder poolings).
    match file.get(&format!("{arch}.pooling_type")).and_then(|v| v.as_u64()) {
        Some(1) => drop(obj.insert("pooling".into(), json!("mean"))),
        Some(3) => drop(obj.insert("pooling".into(), json!("last"))),
        _ => {}
    }
    let embed = file.tensor("token_embd.weight").ok_or_else(|| file.error("no token_embd.weight tensor"))?;
    obj.insert("vocab_size".into(), json!(embed.shape()[0]));
    obj.insert("tie_word_embeddings".into(), json!(file.tensor("output.weight").is_none()));
    let biased = file.tensor("blk.0.attn_q.bias").is_some();
    obj.insert("attention_bias".into(), json!(biased));
    obj.insert("qkv_bias".into(), json!(biased));
    // GLM-4.5's q/k norms, where its files have them.
    obj.insert("use_qk_norm".into(), json!(file.tensor("blk.0.attn_q_norm.weight").is_some()));
    if let Some(experts) = family.and_then(|f| f.experts.as_ref()) {
        // The file's word where it says (GLM-4.5's), else llama.cpp's for the architecture.
        let norm = file.get(&format!("{arch}.expert_weights_norm")).and_then(|v| v.as_bool());
        obj.insert("norm_topk_prob".into(), json!(norm.unwrap_or(experts.gguf_norm_topk_prob)));
        // Which layers are MoE is said by their router tensors.
        let layers = obj.get("num_hidden_layers").and_then(Json::as_u64).unwrap_or(0);
        let dense: Vec<u64> =
            (0..layers).filter(|l| file.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_none()).collect();
        obj.insert("mlp_only_layers".into(), json!(dense));
        if !obj.contains_key("intermediate_size") {
            let width = obj.get("moe_intermediate_size").cloned().unwrap_or(json!(0));
            obj.insert("intermediate_size".into(), width);
        }
    }
    if let Some(rope) = rope_parameters(file, &arch)? {
        obj.insert("rope_parameters".into(), rope);
    }
    if let Some(sections) = mrope_sections(file, &arch)? {
        let rope = obj.entry("rope_parameters").or_insert_with(|| json!({"rope_type": "default"}));
        if let Json::Object(rope) = rope {
            rope.insert("mrope_section".into(), json!(sections));
            rope.insert("mrope_interleaved".into(), json!(family.is_some_and(|f| f.gguf_mrope_interleaved)));
        }
    }
    if family.is_some_and(|f| f.latent_attention) {
        latent_attention(file, &arch, &mut obj)?;
    }

    let id = |key: &str| file.get(key).and_then(|v| v.as_u64());
    if let Some(bos) = id("tokenizer.ggml.bos_token_id") {
        obj.insert("bos_token_id".into(), json!(bos));
    }
    let end_of_generation = family.map_or(&[][..], |f| f.end_of_generation);
    obj.insert("eos_token_id".into(), json!(eos_ids(file, end_of_generation)));
    let mut config = ModelConfig::from_json_str(&Json::Object(obj).to_string()).map_err(|e| match e {
        LoadError::Config { field, reason } => {
            let rope = field.strip_prefix("rope_parameters.");
            let key = match rope.and_then(|f| ROPE_SCALING.iter().find(|(name, _)| *name == f)) {
                Some((_, k)) => format!("{arch}.rope.scaling.{k}"),
                None => FIELDS.iter().find(|(f, _)| *f == field).map_or(field, |(_, k)| format!("{arch}.{k}")),
            };
            file.error(format!("{key}: {reason}"))
        }
        other => other,
    })?;
    if let Some(factors) = rope_freqs(file, config.head_dim)? {
        config.rope_scaling = RopeScaling::Factors(factors);
    }
    if let Some(longrope) = long_rope(file, &arch, &config)? {
        config.rope_scaling = longrope;
    }
    let rotated = file.get(&format!("{arch}.rope.dimension_count")).and_then(|v| v.as_u64());
    if let Some(dims) = rotated.filter(|&d| d as usize != config.rotary_dim) {
        let head_dim = config.head_dim;
        return Err(file.error(format!(
            "{arch}.rope.dimension_count: {dims} (partial rotary embeddings of head size {head_dim} are not supported \
             for this family)"
        )));
    }
    // The converter added 1 to the zero-centred norms, and wrote the linear attention's tensors
    // in its own layout.
    config.zero_centred_norms = false;
    if let Some(linear) = &mut config.linear {
        linear.gguf_layout = true;
    }
    Ok(config)
}

/// What llama.cpp assumes of a Gemma file where it says nothing (its `load_arch_hparams`), where
/// that is not the config's default (`Architecture::config_defaults`, which also give Gemma 2's
/// soft-caps): by architecture, the sliding window (0: no local layers, where transformers'
/// Gemma 3 default is 4,096), and the block count of its 27B model, whose queries are scaled by
/// (hidden / heads)^−½ where the others' are by head_dim^−½ (the configs'
/// `query_pre_attn_scalar`, which GGUF files do not carry).
const GEMMA_DEFAULTS: [(&str, u64, u64); 2] = [("gemma2", 4096, 46), ("gemma3", 0, 62)];

/// What local layers (Gemma's, gpt-oss's, OLMo 3's) need beyond the keys `FIELDS` maps: which
/// layers are local (`attention.sliding_window_pattern`, a period or a flag per layer, else the
/// family's period), their rotary base (`rope.freq_base_swa`); Gemma's soft-caps and query scale.
fn local_layers(file: &GgufFile, arch: &str, obj: &mut Map<String, Json>) -> Result<(), LoadError> {
    let gemma = GEMMA_DEFAULTS.iter().find(|d| d.0 == arch);
    let key = |k: &str| format!("{arch}.{k}");
    let float = |k: &str| -> Result<Option<f64>, LoadError> {
        file.get(&key(k))
            .map(|v| v.as_f64().ok_or_else(|| file.error(format!("{}: expected a number, found {v:?}", key(k)))))
            .transpose()
    };
    if let Some(&(_, window, _)) = gemma {
        obj.entry("sliding_window").or_insert(json!(window));
    }
    match file.get(&key("attention.sliding_window_pattern")) {
        None => {}
        Some(v) => match (v.as_u64(), v.as_array()) {
            (Some(period), _) => drop(obj.insert("sliding_window_pattern".into(), json!(period))),
            (None, Some(flags)) => {
                let kinds = flags
                    .iter()
                    .map(|f| match f.as_bool() {
                        Some(true) => Ok("sliding_attention"),
                        Some(false) => Ok("full_attention"),
                        None => {
                            Err(file.error(format!("{}: holds a non-boolean", key("attention.sliding_window_pattern"))))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                obj.insert("layer_types".into(), json!(kinds));
            }
            _ => {
                return Err(file.error(format!(
                    "{}: expected a number or flags, found {v:?}",
                    key("attention.sliding_window_pattern")
                )));
            }
        },
    }
    if let Some(theta) = float("rope.freq_base_swa")? {
        obj.insert("rope_local_base_freq".into(), json!((theta as f32).to_string().parse::<f64>().unwrap_or(theta)));
    }
    let Some(&(_, _, blocks_27b)) = gemma else { return Ok(()) };
    for cap in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if let Some(value) = float(cap)?.filter(|&v| v > 0.0) {
            obj.insert(cap.into(), json!(value));
        }
    }
    let number = |k: &str| obj.get(k).and_then(Json::as_u64);
    let per_head = number("hidden_size").zip(number("num_attention_heads")).and_then(|(h, n)| h.checked_div(n));
    let scalar = match number("num_hidden_layers") {
        Some(blocks) if blocks == blocks_27b => per_head,
        _ => number("head_dim").or(per_head),
    };
    if let Some(scalar) = scalar.filter(|&s| s > 0) {
        obj.insert("query_pre_attn_scalar".into(), json!(scalar));
    }
    Ok(())
}

/// `{arch}.{key}` as a whole number, `None` where the file has no such key.
fn whole_number(file: &GgufFile, arch: &str, key: &str) -> Result<Option<u64>, LoadError> {
    let key = format!("{arch}.{key}");
    file.get(&key)
        .map(|v| v.as_u64().ok_or_else(|| file.error(format!("{key}: expected a number, found {v:?}"))))
        .transpose()
}

/// What Qwen3.5's linear attention needs beyond the keys `FIELDS` maps: each value head's size
/// from `ssm.inner_size` over the value heads, the rotated part of each head from
/// `rope.dimension_count`.
fn linear_attention(file: &GgufFile, arch: &str, obj: &mut Map<String, Json>) -> Result<(), LoadError> {
    let number = |key: &str| whole_number(file, arch, key);
    let value_heads = obj.get("linear_num_value_heads").and_then(Json::as_u64);
    if let Some(dim) = number("ssm.inner_size")?.zip(value_heads).and_then(|(i, h)| i.checked_div(h)) {
        obj.insert("linear_value_head_dim".into(), json!(dim));
    }
    let head_dim = obj.get("head_dim").and_then(Json::as_u64);
    if let (Some(rotated), Some(head_dim)) = (number("rope.dimension_count")?, head_dim.filter(|&d| d > 0)) {
        obj.insert("partial_rotary_factor".into(), json!(rotated as f64 / head_dim as f64));
    }
    Ok(())
}

/// What latent attention (`deepseek2`) needs beyond the keys `FIELDS` maps, as llama.cpp's
/// converter writes it: the ranks (`attention.q_lora_rank`, absent for V2-Lite's one query
/// product; `attention.kv_lora_rank`), the rotated part (`rope.dimension_count`), each head's
/// query and value widths (`attention.key_length_mla`, `attention.value_length_mla`; the file's
/// `key_length` is the cached latent's), rotation by adjacent pairs (the converter keeps the
/// checkpoint's rows), the router's gate (`expert_gating_func`: 1 softmax, 2 sigmoid; where a file
/// does not say, llama.cpp's rule: a sigmoid for GLM-4.7-Flash's shape, else DeepSeek V2's softmax),
/// and YaRN's `mscale_all_dim`, written as a tenth of it, which is also its `mscale` (V2's configs).
fn latent_attention(file: &GgufFile, arch: &str, obj: &mut Map<String, Json>) -> Result<(), LoadError> {
    let number = |key: &str| whole_number(file, arch, key);
    let required = |key: &str| -> Result<u64, LoadError> {
        number(key)?.ok_or_else(|| file.error(format!("{arch}.{key}: missing (latent attention needs it)")))
    };
    let rope = required("rope.dimension_count")?;
    let (key, value) = match (number("attention.key_length_mla")?, number("attention.value_length_mla")?) {
        (Some(k), Some(v)) => (k, v),
        // Files converted before the split of `attn_kv_b` give the heads' widths as these.
        _ => (required("attention.key_length")?, required("attention.value_length")?),
    };
    let nope = key.checked_sub(rope).filter(|&n| n > 0).ok_or_else(|| {
        file.error(format!("{arch}.attention.key_length_mla: {key}, not more than the rotated part ({rope})"))
    })?;
    obj.insert("q_lora_rank".into(), json!(number("attention.q_lora_rank")?));
    obj.insert("kv_lora_rank".into(), json!(required("attention.kv_lora_rank")?));
    obj.insert("qk_rope_head_dim".into(), json!(rope));
    obj.insert("qk_nope_head_dim".into(), json!(nope));
    obj.insert("v_head_dim".into(), json!(value));
    obj.insert("rope_interleave".into(), json!(true));
    let layers = obj.get("num_hidden_layers").and_then(Json::as_u64);
    let vocab = obj.get("vocab_size").and_then(Json::as_u64);
    let sigmoid = match number("expert_gating_func")? {
        Some(2) => true,
        Some(1) => false,
        Some(other) => {
            return Err(
                file.error(format!("{arch}.expert_gating_func: {other} is not supported (1 softmax, 2 sigmoid)"))
            );
        }
        None => matches!(layers, Some(47 | 48)) && vocab == Some(154_880),
    };
    obj.insert("scoring_func".into(), json!(if sigmoid { "sigmoid" } else { "softmax" }));
    if let Some(Json::Object(rope)) = obj.get_mut("rope_parameters")
        && let Some(tenth) = rope.get("mscale_all_dim").and_then(Json::as_f64)
    {
        let all = (tenth as f32 / 0.1).to_string().parse::<f64>().unwrap_or(tenth / 0.1);
        rope.insert("mscale_all_dim".into(), json!(all));
        rope.insert("mscale".into(), json!(all));
    }
    Ok(())
}

/// `{arch}.rope.scaling.*` as `rope_parameters`, `None` without a scaling type (or `none`).
fn rope_parameters(file: &GgufFile, arch: &str) -> Result<Option<Json>, LoadError> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    match file.get(&key("type")).map(|v| v.as_str()) {
        None | Some(Some("none")) => return Ok(None),
        Some(None) => return Err(file.error(format!("{}: not a string", key("type")))),
        Some(Some(_)) => {}
    }
    let mut params = Map::new();
    for (field, k) in ROPE_SCALING {
        let Some(v) = file.get(&key(k)) else { continue };
        let value = match field {
            "rope_type" => v.as_str().map(|s| json!(s)),
            "original_max_position_embeddings" => v.as_u64().map(|x| json!(x)),
            _ => v.as_f64().map(|x| json!(x)),
        };
        params.insert(field.into(), value.ok_or_else(|| file.error(format!("{}: unexpected {v:?}", key(k))))?);
    }
    if params.contains_key("mscale_all_dim") {
        params.insert("mscale".into(), json!(1.0));
    }
    // Ministral 3's query scaling past the original context (`llama_4_scaling_beta`).
    let temperature = format!("{arch}.attention.temperature_scale");
    if let Some(v) = file.get(&temperature) {
        let beta = v.as_f64().ok_or_else(|| file.error(format!("{temperature}: expected a number, found {v:?}")))?;
        params.insert("llama_4_scaling_beta".into(), json!(beta));
    }
    Ok(Some(Json::Object(params)))
}

/// M-RoPE's pairs per position stream (temporal, height, width): the first three of
/// `rope.dimension_sections` (llama.cpp's fourth is its vision encoder's).
fn mrope_sections(file: &GgufFile, arch: &str) -> Result<Option<[u64; 3]>, LoadError> {
    let key = format!("{arch}.rope.dimension_sections");
    let Some(v) = file.get(&key) else { return Ok(None) };
    let counts: Option<Vec<u64>> = v.as_array().and_then(|a| a.iter().map(|x| x.as_u64()).collect());
    match counts.as_deref() {
        Some([t, h, w, ..]) => Ok(Some([*t, *h, *w])),
        _ => Err(file.error(format!("{key}: expected at least three pair counts, found {v:?}"))),
    }
}

/// Phi-3's LongRoPE: `rope_factors_long.weight` and `rope_factors_short.weight`, \[rotary_dim /
/// 2\] each, switched past `rope.scaling.original_context_length`, cos and sin scaled by
/// `rope.scaling.attn_factor` (the converter writes √(1 + ln(factor) / ln(original)) there).
fn long_rope(file: &GgufFile, arch: &str, c: &ModelConfig) -> Result<Option<RopeScaling>, LoadError> {
    let half = c.rotary_dim / 2;
    let (Some(short), Some(long)) = (factors(file, ROPE_FACTORS_SHORT, half)?, factors(file, ROPE_FACTORS_LONG, half)?)
    else {
        return Ok(None);
    };
    let key = format!("{arch}.rope.scaling.original_context_length");
    let original = file.get(&key).and_then(|v| v.as_u64()).filter(|&o| o >= 2);
    let original =
        original.ok_or_else(|| file.error(format!("{key}: missing, or below 2 (LongRoPE needs it)")))? as usize;
    let attention_factor =
        file.get(&format!("{arch}.rope.scaling.attn_factor")).and_then(|v| v.as_f64()).unwrap_or(1.0);
    Ok(Some(RopeScaling::LongRope { short, long, original, attention_factor }))
}

/// `rope_freqs.weight`: one divisor per rotary frequency, \[head_dim / 2\].
fn rope_freqs(file: &GgufFile, head_dim: usize) -> Result<Option<Vec<f32>>, LoadError> {
    factors(file, ROPE_FREQS, head_dim / 2)
}

/// Tensor `name` of `len` positive factors, if the file has it.
fn factors(file: &GgufFile, name: &str, len: usize) -> Result<Option<Vec<f32>>, LoadError> {
    let Some(t) = file.tensor(name) else { return Ok(None) };
    if t.shape() != [len] {
        return Err(file.error(format!("{name}: shape {:?}, expected [{len}]", t.shape())));
    }
    let values = file
        .data(name, burn::tensor::DType::F32)?
        .try_to_vec::<f32>()
        .map_err(|e| file.error(format!("{name}: {e:?}")))?;
    if values.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
        return Err(file.error(format!("{name}: every factor must be a positive number")));
    }
    Ok(Some(values))
}

/// End-of-generation ids: eos, eot, and the control tokens the family ends turns with (or
/// user-defined ones of that text: llama.cpp takes them as control tokens, as some Gemma files
/// type `<end_of_turn>` so).
fn eos_ids(file: &GgufFile, end_of_generation: &[&str]) -> Vec<u64> {
    let mut ids: Vec<u64> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|k| file.get(k)?.as_u64())
        .collect();
    let tokens = file.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).unwrap_or_default();
    let types = file.get("tokenizer.ggml.token_type").and_then(|v| v.as_array()).unwrap_or_default();
    for (i, (t, ty)) in tokens.iter().zip(types).enumerate() {
        if matches!(ty.as_i64(), Some(3 | 4)) && t.as_str().is_some_and(|t| end_of_generation.contains(&t)) {
            ids.push(i as u64);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|id| seen.insert(*id));
    ids
}
