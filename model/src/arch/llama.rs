//! Llama 3.x (`LlamaForCausalLM`, GGUF `llama`): no biases unless `attention_bias`, `llama3`
//! rope scaling (in GGUF files as a `rope_freqs.weight` tensor of per-frequency divisors), q and
//! k interleaved per head by llama.cpp's converter, and the `llama-bpe` pre-tokenizer with a BOS
//! token before every prompt.

use super::{Activation, Architecture, Bias};

pub const LLAMA: Architecture = Architecture {
    name: "llama",
    gguf: "llama",
    hf_class: "LlamaForCausalLM",
    qkv_bias: Bias::Config { field: "attention_bias", default: false },
    o_bias_with_qkv: true,
    qk_norm: false,
    default_head_dim: None,
    config_defaults: &[],
    gguf_pre: &["llama-bpe"],
    gguf_qk_interleaved: true,
    end_of_generation: &["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
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
