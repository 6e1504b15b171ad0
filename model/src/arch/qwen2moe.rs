//! Qwen2-MoE (`Qwen2MoeForCausalLM`, GGUF `qwen2moe`, e.g. Qwen1.5-MoE-A2.7B): Qwen2's
//! attention (q/k/v biases unless `qkv_bias` is false) with mixture-of-experts blocks: a softmax
//! router, the top-k experts of each token (not renormalised unless `norm_topk_prob`), and a
//! shared expert every token passes through, scaled by the sigmoid of its own gate.

use super::{Activation, Architecture, Bias, Experts, Shared};

pub const QWEN2_MOE: Architecture = Architecture {
    name: "qwen2_moe",
    gguf: "qwen2moe",
    hf_class: "Qwen2MoeForCausalLM",
    qkv_bias: Bias::Config { field: "qkv_bias", default: true },
    o_bias_with_qkv: false,
    qk_norm: false,
    default_head_dim: None,
    config_defaults: &[],
    gguf_pre: &["qwen2"],
    gguf_qk_interleaved: false,
    end_of_generation: &["<|im_end|>", "<|endoftext|>"],
    gguf_aliases: &[],
    hf_aliases: &[],
    experts: Some(Experts {
        shared: Shared::Gated,
        sigmoid_router: false,
        gguf_norm_topk_prob: false,
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
