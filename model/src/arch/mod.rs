//! Architectures: what tells one decoder-only family from another, as data the shared decoder
//! (`crate::decoder`) reads. Each family is one file of tables (its `config.json` and GGUF names,
//! the defaults its configs leave out, its tokenizer's pre-tokenizers) and one entry in
//! `ARCHITECTURES`; families we know of but do not serve are named in `UNSUPPORTED`, so a file of
//! one gets an error that says so instead of "unknown".

mod deepseek_v3;
mod gemma2;
mod gemma3;
mod glm4;
mod glm4moe;
mod gptoss;
mod granite;
mod llama;
mod ministral3;
mod mistral;
mod mistral4;
mod mixtral;
mod olmo2;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen2vl;
mod qwen3;
mod qwen35;
mod qwen35moe;
mod qwen3moe;
mod qwen3next;
mod qwen3vl;
mod qwen3vlmoe;
mod smollm3;

pub use crate::config::Activation;

/// A decoder-only family the shared decoder serves.
#[derive(Debug, PartialEq)]
pub struct Architecture {
    /// Our name, the `model_type` of its `config.json` and the model type it reports.
    pub name: &'static str,
    /// Its GGUF `general.architecture`.
    pub gguf: &'static str,
    /// Its `architectures` class in `config.json`.
    pub hf_class: &'static str,
    /// Whether q, k and v have biases when the config does not say (`attention_bias`).
    pub qkv_bias: Bias,
    /// Whether the output projection has a bias when q, k and v have one.
    pub o_bias_with_qkv: bool,
    /// A per-head RMSNorm of q and k before the rotary embedding (Qwen3).
    pub qk_norm: bool,
    /// `head_dim` when `config.json` has none; `None`: hidden size / heads.
    pub default_head_dim: Option<usize>,
    /// Fields its configs may leave out, with transformers' defaults for them (Gemma 3's
    /// multimodal checkpoints give their text model's sizes and little else).
    pub config_defaults: &'static [(&'static str, f64)],
    /// The `tokenizer.ggml.pre` values of its GGUF files (the first is assumed when a file has none).
    pub gguf_pre: &'static [&'static str],
    /// llama.cpp's converter interleaves each head's q and k rows for this family (its RoPE
    /// rotates adjacent pairs); loading a GGUF file restores Hugging Face's order, so one RoPE
    /// serves every family.
    pub gguf_qk_interleaved: bool,
    /// Control tokens that end a generation in its chat formats, by text (GGUF files list only
    /// one eos id; llama.cpp matches these the same way).
    pub end_of_generation: &'static [&'static str],
    /// Its GGUF files' names for tensors the decoder knows by another GGUF name: (the decoder's
    /// name in a block, the family's), e.g. Qwen3.5's `post_attention_norm.weight` for
    /// `ffn_norm.weight`.
    pub gguf_aliases: &'static [(&'static str, &'static str)],
    /// Its checkpoints' names for tensors the decoder knows by another Hugging Face name, under
    /// `model.layers.{l}.`: (the decoder's, the family's), `{e}` standing for an expert's index
    /// (Mixtral's `block_sparse_moe.experts.{e}.w1.weight` for `mlp.experts.{e}.gate_proj.weight`).
    pub hf_aliases: &'static [(&'static str, &'static str)],
    /// Its feed-forward blocks are mixtures of experts (`None`: dense SwiGLU).
    pub experts: Option<Experts>,
    /// Qwen3.5's hybrid: gated DeltaNet linear-attention layers among full-attention ones
    /// (`layer_types`), an output gate on the full attention, zero-centred RMSNorms.
    pub gated_delta_net: bool,
    /// Its checkpoints fuse the linear attention's input projections per key head (Qwen3-Next's
    /// `in_proj_qkvz`, `in_proj_ba`; its GGUF files keep `ssm_ba`): read as the separate
    /// projections (`weights::split_rows`).
    pub fused_linear_projections: bool,
    /// Its checkpoints fuse q, k and v in `qkv_proj` (Phi-3; its GGUF files keep `attn_qkv`):
    /// read as the separate projections.
    pub fused_qkv: bool,
    /// Its checkpoints fuse gate and up in `gate_up_proj`, gate first (Phi-3, GLM-4; their GGUF
    /// files keep both in `ffn_up`): read as the separate projections.
    pub fused_gate_up: bool,
    /// Its rotary embedding turns adjacent pairs of each head's dimensions (GLM-4's, as its
    /// checkpoints and GGUF files hold q and k): q's and k's rows are loaded in the order of
    /// pairs half a head apart, which the one RoPE turns (`weights::rotary_order`).
    pub interleaved_rope: bool,
    /// Its GGUF files hold the linear attention's value heads in llama.cpp's tiled order (its
    /// converter reorders Qwen3.5's, not Qwen3-Next's).
    pub gguf_tiled_value_heads: bool,
    /// Its attention always keeps to the config's `sliding_window` when one is set (Mistral):
    /// the context is capped at the window, within which that is full attention.
    pub window_caps_context: bool,
    /// Its GGUF files' M-RoPE sections (`rope.dimension_sections`) take the rotated pairs in
    /// turn (llama.cpp's interleaved M-RoPE, transformers' `mrope_interleaved`), not in runs.
    pub gguf_mrope_interleaved: bool,
    /// Its checkpoints store RMSNorm weights less 1: the norm multiplies by 1 + weight (Qwen3.5's,
    /// Gemma's; llama.cpp's converter adds the 1 back).
    pub zero_centred_norms: bool,
    /// The token embeddings are multiplied by √hidden_size before the first layer (Gemma).
    pub scaled_embedding: bool,
    /// The output projection is the embedding when the config does not say
    /// (`tie_word_embeddings`: transformers' default for the family).
    pub tied_embeddings: bool,
    /// The attention's and the feed-forward's outputs are RMS-normalised before their residual
    /// sums (Gemma 2 and 3's `post_attention_layernorm` and `post_feedforward_layernorm`; the
    /// feed-forward's input norm is then `pre_feedforward_layernorm`).
    pub sandwich_norms: bool,
    /// The attention's and the feed-forward's inputs are not normalised: only their outputs are,
    /// before the residual sums (OLMo 2's `post_attention_layernorm` and
    /// `post_feedforward_layernorm`; `sandwich_norms` then holds those).
    pub no_input_norms: bool,
    /// q's and k's norms span all their heads at once (OLMo 2's, over q's and k's whole
    /// projections), where `qk_norm` has them; otherwise each head is normalised alone.
    pub whole_qk_norms: bool,
    /// The feed-forward's gate when the config names none (`hidden_act`; Gemma's
    /// `hidden_activation`).
    pub activation: Activation,
    /// Local layers, which attend over a sliding window only, where the family has them (Gemma's,
    /// gpt-oss's).
    pub local_layers: Option<LocalLayers>,
    /// Every n-th layer (the n-th, the 2n-th, ...) has no rotary embedding when the config does
    /// not list them (SmolLM3's NoPE layers: `no_rope_layer_interval`, 4).
    pub unrotated_interval: Option<usize>,
    /// Each attention head has a learned sink logit in its softmax (gpt-oss's `sinks`).
    pub attention_sinks: bool,
    /// Multi-head latent attention (DeepSeek V2's and V3's, GLM-4.7-Flash's): keys and values
    /// come from one compressed latent per token (`kv_lora_rank`) plus a shared rotated key part
    /// (`qk_rope_head_dim`), queries through a low-rank pair where `q_lora_rank` says
    /// (`crate::config::LatentAttention`).
    pub latent_attention: bool,
    /// A YaRN scaling's ramp ends are rounded to whole dimensions when the config does not say
    /// (`rope_parameters.truncate`; transformers' default, false for gpt-oss).
    pub yarn_truncate: bool,
}

/// Where a family's local layers are when its config does not list them, and how they rotate.
#[derive(Debug, PartialEq)]
pub struct LocalLayers {
    /// With a `sliding_window` and no `layer_types`, every layer but each `pattern`-th is local
    /// (transformers' `sliding_window_pattern`, which a config may give).
    pub pattern: usize,
    /// Their own rotary base, unscaled, when the config gives none (`rope_local_base_freq`);
    /// `None`: they rotate as the global layers, or by their base unscaled where `unscaled`.
    pub rope_theta: Option<f64>,
    /// With no base of their own, they rotate by the global layers' base without its scaling
    /// (OLMo 3's: YaRN stretches its global layers only).
    pub unscaled: bool,
}

/// Families served as another's layers, by `config.json` `model_type`: (its name, the family's).
pub const ALIASES: &[(&str, &str)] = &[
    ("olmo3", "olmo2"),
    // DeepSeek V2's layers are V3's with a softmax router (its configs' `scoring_func`);
    // GLM-4.7-Flash's are V3's (llama.cpp converts all three to `deepseek2`).
    ("deepseek_v2", "deepseek_v3"),
    ("glm4_moe_lite", "deepseek_v3"),
    // Qwen2.5-VL's language model is Qwen2-VL's.
    ("qwen2_5_vl", "qwen2_vl"),
];

/// How a family's mixture-of-experts blocks differ.
#[derive(Debug, PartialEq)]
pub struct Experts {
    /// The shared expert every token also goes through, if the family has one.
    pub shared: Shared,
    /// The router scores experts by a sigmoid, not a softmax, and chooses them by those scores
    /// plus a per-expert bias (`e_score_correction_bias`; GGUF `exp_probs_b.bias`) among the
    /// best `topk_group` of `n_group` groups; the chosen experts weigh by their sigmoid scores
    /// (renormalised where `norm_topk_prob`) times `routed_scaling_factor` (DeepSeek V3's
    /// routing, GLM-4.5's).
    pub sigmoid_router: bool,
    /// Whether a GGUF file's top-k weights are renormalised to sum to 1 (GGUF files do not
    /// say; llama.cpp decides by architecture).
    pub gguf_norm_topk_prob: bool,
    /// The router always renormalises its top-k weights, whatever the config says (Qwen3.5-MoE,
    /// whose configs have no `norm_topk_prob`).
    pub norm_topk_always: bool,
    /// The config field of each expert's SwiGLU width (`moe_intermediate_size`; Mixtral's
    /// experts are `intermediate_size` wide).
    pub width: &'static str,
    /// The router and every expert's matrices have biases (gpt-oss).
    pub biases: bool,
    /// Its checkpoints keep a layer's experts in 3-D tensors, one per matrix
    /// (`decoder::fused_experts` reads them as one matrix per expert).
    pub fused_3d: Option<Fused3d>,
}

/// How a family's checkpoints lay out a layer's experts in 3-D tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fused3d {
    /// [experts, inputs, outputs], each expert's gate and up outputs interleaved, dense or in
    /// MXFP4 (gpt-oss's).
    Interleaved,
    /// [experts, inputs, outputs], the gate's outputs then the up's (Qwen3-VL-MoE's).
    Halves,
    /// [experts, outputs, inputs] as transformers keeps them, the gate's rows then the up's
    /// (Mistral 4's).
    RowHalves,
}

/// A family's shared expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    None,
    /// `shared_expert_intermediate_size` wide, its output scaled by `sigmoid(gate · x)`, its gate
    /// a row of its own (Qwen2-MoE's `shared_expert_gate`).
    Gated,
    /// `n_shared_experts` experts' width (`moe_intermediate_size` each) in one SwiGLU, added as
    /// it is (DeepSeek's and GLM-4.5's `shared_experts`).
    Plain,
}

/// Where q, k and v biases come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bias {
    /// Always there (Qwen2's config has no field for it).
    Always,
    /// As config field `field` says, `default` when it is missing.
    Config { field: &'static str, default: bool },
}

/// Every family the decoder serves.
pub const ARCHITECTURES: &[&Architecture] = &[
    &qwen2::QWEN2,
    &qwen3::QWEN3,
    &llama::LLAMA,
    &qwen2moe::QWEN2_MOE,
    &qwen3moe::QWEN3_MOE,
    &qwen35::QWEN3_5,
    &qwen35moe::QWEN3_5_MOE,
    &qwen3next::QWEN3_NEXT,
    &mistral::MISTRAL,
    &mixtral::MIXTRAL,
    &ministral3::MINISTRAL3,
    &phi3::PHI3,
    &gemma3::GEMMA3,
    &gemma2::GEMMA2,
    &gptoss::GPT_OSS,
    &smollm3::SMOLLM3,
    &olmo2::OLMO2,
    &granite::GRANITE,
    &glm4moe::GLM4_MOE,
    &glm4::GLM4,
    &deepseek_v3::DEEPSEEK_V3,
    &mistral4::MISTRAL4,
    &qwen3vl::QWEN3_VL,
    &qwen3vlmoe::QWEN3_VL_MOE,
    &qwen2vl::QWEN2_VL,
];

/// Families known but not served, by `config.json` `model_type` or GGUF architecture, with what
/// they would need.
pub const UNSUPPORTED: &[(&str, &str)] = &[
    ("deepseek_v32", "DeepSeek's sparse attention (its lightning indexer)"),
    ("gemma", "Gemma's first layout (served: Gemma 2 and 3)"),
    ("gemma3n", "per-layer inputs, AltUp and shared key-value layers"),
    ("gemma4", "Gemma 4's layers"),
];

/// The family named `name` (a `config.json` `model_type`, the text model's own within a
/// multimodal one, `qwen3_5_text`, or a GGUF architecture: for a GGUF file, `find_gguf`).
pub fn find(name: &str) -> Option<&'static Architecture> {
    let alias = |n: &str| ALIASES.iter().find(|(alias, _)| *alias == n).map(|(_, family)| *family);
    let text = name.strip_suffix("_text").unwrap_or(name);
    let (name, text) = alias(name).or_else(|| alias(text)).map_or((name, text), |family| (family, family));
    let by_name = ARCHITECTURES.iter().copied().find(|a| a.name == name || a.name == text);
    by_name.or_else(|| find_gguf(name, false))
}

/// The family of a GGUF file of architecture `arch`, which has experts or not (`{arch}.expert_count`):
/// Mixtral's files say `llama` too.
pub fn find_gguf(arch: &str, experts: bool) -> Option<&'static Architecture> {
    let of_arch = || ARCHITECTURES.iter().copied().filter(|a| a.gguf == arch);
    of_arch().find(|a| a.experts.is_some() == experts).or_else(|| of_arch().next())
}

/// Why family `name` is not served, if it is one we know.
pub fn unsupported(name: &str) -> Option<&'static str> {
    UNSUPPORTED.iter().find(|(n, _)| *n == name).map(|(_, why)| *why)
}

/// The names of the families served, for errors.
pub fn names() -> String {
    ARCHITECTURES.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_served_families_are_not_listed_as_unsupported() {
        for (i, a) in ARCHITECTURES.iter().enumerate() {
            assert!(unsupported(a.name).is_none() && unsupported(a.gguf).is_none(), "{}", a.name);
            assert!(!a.gguf_pre.is_empty(), "{}: no pre-tokenizer", a.name);
            for b in &ARCHITECTURES[i + 1..] {
                let same_files = a.gguf == b.gguf && a.experts.is_some() == b.experts.is_some();
                assert!(a.name != b.name && !same_files, "{} and {}", a.name, b.name);
            }
        }
        assert_eq!(find("qwen3").map(|a| a.name), Some("qwen3"));
        assert!(find("gemma3n").is_none() && unsupported("gemma3n").is_some());
        // DeepSeek V2's and GLM-4.7-Flash's configs are served as V3's layers, as their GGUF files.
        for name in ["deepseek_v2", "glm4_moe_lite", "deepseek2"] {
            assert_eq!(find(name).map(|a| a.name), Some("deepseek_v3"), "{name}");
        }
        assert_eq!(find("qwen3moe").map(|a| a.name), Some("qwen3_moe"));
        // A `llama` GGUF file is Llama's, or Mixtral's when it has experts.
        assert_eq!(find("llama").map(|a| a.name), Some("llama"));
        assert_eq!(find_gguf("llama", false).map(|a| a.name), Some("llama"));
        assert_eq!(find_gguf("llama", true).map(|a| a.name), Some("mixtral"));
        assert_eq!(find_gguf("qwen3moe", true).map(|a| a.name), Some("qwen3_moe"));
        // Qwen2.5-VL's language model is Qwen2-VL's, by either config's name or its text config's.
        for name in ["qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen2vl"] {
            assert_eq!(find(name).map(|a| a.name), Some("qwen2_vl"), "{name}");
        }
    }
}
