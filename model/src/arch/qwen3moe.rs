//! Qwen3-MoE (`Qwen3MoeForCausalLM`, GGUF `qwen3moe`): Qwen3's attention (q/k norms, its own
//! head size) with mixture-of-experts feed-forward blocks: a softmax router, the top-k experts
//! of each token (their weights renormalised where `norm_topk_prob` says; llama.cpp always does
//! for this architecture), no shared expert. Layers in `mlp_only_layers` keep a dense block.

use super::{Activation, Architecture, Bias, Experts, Shared};

pub const QWEN3_MOE: Architecture = Architecture {
    name: "qwen3_moe",
    gguf: "qwen3moe",
    hf_class: "Qwen3MoeForCausalLM",
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
    experts: Some(Experts {
        shared: Shared::None,
        sigmoid_router: false,
        gguf_norm_topk_prob: true,
        norm_topk_always: false,
        width: "moe_intermediate_size",
        biases: false,
        fused_3d: None,
    }),
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
