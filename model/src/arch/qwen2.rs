//! Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`, GGUF `qwen2`): q, k and v with biases, no output
//! bias, head size hidden / heads. Reasoning models distilled onto it (DeepSeek-R1-Distill-Qwen,
//! QwQ) load as this family.

use super::{Activation, Architecture, Bias};

pub const QWEN2: Architecture = Architecture {
    name: "qwen2",
    gguf: "qwen2",
    hf_class: "Qwen2ForCausalLM",
    qkv_bias: Bias::Always,
    o_bias_with_qkv: false,
    qk_norm: false,
    default_head_dim: None,
    config_defaults: &[],
    gguf_pre: &["qwen2"],
    gguf_qk_interleaved: false,
    end_of_generation: &["<|im_end|>", "<|endoftext|>", "<｜end▁of▁sentence｜>"],
    gguf_aliases: &[],
    hf_aliases: &[],
    experts: None,
    gated_delta_net: false,
    fused_linear_projections: false,
    fused_qkv_gate_up: false,
    gguf_tiled_value_heads: false,
    window_caps_context: false,
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
    yarn_truncate: true,
};
