//! gpt-oss (`GptOssForCausalLM`, GGUF `gpt-oss`): OpenAI's open-weight mixture of experts. Its
//! layers alternate local (a sliding window of 128, the first local) and global attention, both
//! rotated by one YaRN-scaled embedding; each attention head has a learned sink (a logit in its
//! softmax with no value), q, k, v and o have biases; a softmax router with a bias picks each
//! token's top-k experts (renormalised), whose matrices have biases too and gate by a clamped
//! SwiGLU, `min(g, 7) · σ(1.702 · min(g, 7)) · (clamp(u, ±7) + 1)`. Its checkpoints keep each
//! layer's experts in 3-D tensors (`mlp.experts.gate_up_proj`, gate and up interleaved column
//! by column), in MXFP4 where released (`*_blocks`, `*_scales`): `decoder::fused_experts` reads
//! them as one matrix per expert. Its chat format is OpenAI's harmony (`<|channel|>` …).

use super::{Activation, Architecture, Bias, Experts, Fused3d, LocalLayers, Shared};

pub const GPT_OSS: Architecture = Architecture {
    name: "gpt_oss",
    gguf: "gpt-oss",
    hf_class: "GptOssForCausalLM",
    qkv_bias: Bias::Config { field: "attention_bias", default: true },
    o_bias_with_qkv: true,
    qk_norm: false,
    default_head_dim: Some(64),
    config_defaults: &[],
    gguf_pre: &["gpt-4o"],
    gguf_qk_interleaved: false,
    // `<|end|>` closes a message the model goes on after (its analysis before its answer).
    end_of_generation: &["<|return|>", "<|call|>", "<|endoftext|>"],
    // llama.cpp's converter names the feed-forward's input norm after Hugging Face's.
    gguf_aliases: &[("ffn_norm.weight", "post_attention_norm.weight")],
    hf_aliases: &[("mlp.gate.weight", "mlp.router.weight"), ("mlp.gate.bias", "mlp.router.bias")],
    experts: Some(Experts {
        shared: Shared::None,
        sigmoid_router: false,
        gguf_norm_topk_prob: true,
        norm_topk_always: true,
        width: "intermediate_size",
        biases: true,
        fused_3d: Some(Fused3d::Interleaved),
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
    activation: Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 },
    local_layers: Some(LocalLayers { pattern: 2, rope_theta: None, unscaled: false }),
    unrotated_interval: None,
    attention_sinks: true,
    latent_attention: false,
    // Its YaRN ramp runs between unrounded dimensions (transformers' `truncate: false`, which its
    // configs say and its GGUF files do not; llama.cpp rounds them).
    yarn_truncate: false,
};
