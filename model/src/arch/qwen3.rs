//! Qwen3 dense (`Qwen3ForCausalLM`, GGUF `qwen3`): no biases unless `attention_bias`, a
//! per-head RMSNorm of q and k before the rotary embedding, and a head size of its own (128 by
//! default, not hidden / heads).

use super::{Activation, Architecture, Bias};

pub const QWEN3: Architecture = Architecture {
    name: "qwen3",
    gguf: "qwen3",
    hf_class: "Qwen3ForCausalLM",
    qkv_bias: Bias::Config { field: "attention_bias", default: false },
    o_bias_with_qkv: true,
    qk_norm: true,
    default_head_dim: Some(128),
    config_defaults: &[],
    gguf_pre: &["qwen2"],
    gguf_qk_interleaved: false,
    end_of_generation: &["<|im_end|>", "<|endoftext|>"],
    gguf_aliases: &[],
    hf_aliases: &[],
    experts: None,
    gated_delta_net: false,
    fused_linear_projections: false,
    fused_qkv: false,
    fused_gate_up: false,
    interleaved_rope: false,
    gguf_tiled_value_heads: false,
    window_caps_context: false,
    gguf_mrope_interleaved: false,
    zero_centred_norms: false,
    scaled_embedding: false,
    tied_embeddings: false,
    sandwich_norms: false,
    no_input_norms: false,
    whole_qk_norms: false,
    activation: Activation::Silu,
    local_layers: None,
    unrotated_interval: None,
    attention_sinks: false,
    latent_attention: false,
    yarn_truncate: true,
};
