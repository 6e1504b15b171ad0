//! GLM-4 (the 0414 models: GLM-4-9B, GLM-4-32B, GLM-Z1; `Glm4ForCausalLM`, GGUF `glm4`): Llama's
//! attention with q, k and v biases (`attention_bias`, true unless the config says), a rotary
//! embedding over the first half of each head (`partial_rotary_factor`) that turns adjacent
//! pairs (`interleaved_rope`), RMSNorms after the attention and after the feed-forward as well as
//! before them (`post_self_attn_layernorm`, `post_mlp_layernorm`; in GGUF files
//! `post_attention_norm` and `post_ffw_norm`), and gate and up fused in `gate_up_proj` (GGUF
//! `ffn_up`). Its tokenizer and chat format are GLM-4.5's: the `glm4` pre-tokenizer, no BOS (the
//! template writes `[gMASK]<sop>`), turns ending at `<|user|>` or `<|observation|>`.

use super::glm4moe::GLM4_MOE;
use super::llama::LLAMA;
use super::{Architecture, Bias};

pub const GLM4: Architecture = Architecture {
    name: "glm4",
    gguf: "glm4",
    hf_class: "Glm4ForCausalLM",
    qkv_bias: Bias::Config { field: "attention_bias", default: true },
    o_bias_with_qkv: false,
    // Glm4Config's (transformers sets the rotary fraction when a config leaves it out).
    default_head_dim: Some(128),
    config_defaults: &[("partial_rotary_factor", 0.5)],
    gguf_pre: GLM4_MOE.gguf_pre,
    gguf_qk_interleaved: false,
    end_of_generation: GLM4_MOE.end_of_generation,
    // Its norm after the attention is the decoder's `post_attention_norm`, the one after the
    // feed-forward its `post_feedforward_layernorm`; its `post_attention_layernorm` is the
    // feed-forward's input norm, as Llama's.
    hf_aliases: &[
        ("post_attention_norm.weight", "post_self_attn_layernorm.weight"),
        ("post_feedforward_layernorm.weight", "post_mlp_layernorm.weight"),
    ],
    fused_gate_up: true,
    interleaved_rope: true,
    sandwich_norms: true,
    tied_embeddings: false,
    ..LLAMA
};
