//! Qwen3.5 dense (`Qwen3_5ForConditionalGeneration`'s language model, or `Qwen3_5ForCausalLM`):
//! Qwen3's attention with a sigmoid output gate per head (stored after each head's query rows
//! in `q_proj`) and rotary on part of each head, between gated DeltaNet linear-attention layers
//! (`layer_types`), with zero-centred RMSNorms (they multiply by 1 + weight). Its released
//! checkpoints nest the text model's config under `text_config` and its tensors under
//! `model.language_model.`, beside a vision tower (`crate::vision`'s; in a GGUF model's projector
//! file) and a multi-token-prediction head, which is not read. Its GGUF files (llama.cpp's `qwen35`) hold the linear attention in the
//! converter's layout (`LinearAttention::gguf_layout`), the norms with 1 added, the
//! post-attention norm as `post_attention_norm`, and the multi-token-prediction head as blocks
//! after the model's (`nextn_predict_layers`), which are not read.

use super::{Activation, Architecture, Bias};

pub const QWEN3_5: Architecture = Architecture {
    name: "qwen3_5",
    gguf: "qwen35",
    hf_class: "Qwen3_5ForConditionalGeneration",
    qkv_bias: Bias::Config { field: "attention_bias", default: false },
    o_bias_with_qkv: true,
    qk_norm: true,
    default_head_dim: Some(256),
    config_defaults: &[],
    gguf_pre: &["qwen35"],
    gguf_qk_interleaved: false,
    end_of_generation: &["<|im_end|>", "<|endoftext|>"],
    gguf_aliases: &[("ffn_norm.weight", "post_attention_norm.weight")],
    hf_aliases: &[],
    experts: None,
    gated_delta_net: true,
    fused_linear_projections: false,
    fused_qkv: false,
    fused_gate_up: false,
    interleaved_rope: false,
    gguf_tiled_value_heads: true,
    window_caps_context: false,
    gguf_mrope_interleaved: true,
    zero_centred_norms: true,
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
