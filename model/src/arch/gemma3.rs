//! Gemma 3's text model (`Gemma3ForCausalLM`, and the language model of
//! `Gemma3ForConditionalGeneration`; GGUF `gemma3`): Llama's attention with q/k norms, a head
//! size of its own (256 when the config has none) and queries scaled by
//! `query_pre_attn_scalar`^−½ rather than head_dim's; five local layers attending over a
//! `sliding_window` of positions for each global one (`layer_types`, else every sixth layer
//! global), the local ones rotated by their own base (`rope_local_base_freq`, 10,000) without the
//! global layers' scaling; zero-centred RMSNorms, also after the attention and after the
//! feed-forward (before their residual sums); a GELU-gated feed-forward (`gelu_pytorch_tanh`);
//! embeddings times √hidden_size, tied to the output. Its GGUF files hold the norms with 1
//! added, the feed-forward's input norm as `ffn_norm` and the others as `post_attention_norm` and
//! `post_ffw_norm`.

use super::{Activation, Architecture, Bias, LocalLayers};

pub const GEMMA3: Architecture = Architecture {
    name: "gemma3",
    gguf: "gemma3",
    hf_class: "Gemma3ForCausalLM",
    qkv_bias: Bias::Config { field: "attention_bias", default: false },
    o_bias_with_qkv: true,
    qk_norm: true,
    default_head_dim: Some(256),
    // Gemma3TextConfig's.
    config_defaults: &[
        ("vocab_size", 262_208.0),
        ("num_attention_heads", 8.0),
        ("num_key_value_heads", 4.0),
        ("max_position_embeddings", 131_072.0),
        ("rms_norm_eps", 1e-6),
        ("rope_theta", 1_000_000.0),
        ("query_pre_attn_scalar", 256.0),
        ("sliding_window", 4096.0),
    ],
    gguf_pre: &["default"],
    gguf_qk_interleaved: false,
    end_of_generation: &["<end_of_turn>", "<eos>"],
    gguf_aliases: &[],
    // Gemma's `post_attention_layernorm` follows the attention; its feed-forward's input norm
    // (the decoder's `post_attention_layernorm`, Llama's name) is `pre_feedforward_layernorm`.
    hf_aliases: &[
        ("post_attention_layernorm.weight", "pre_feedforward_layernorm.weight"),
        ("post_attention_norm.weight", "post_attention_layernorm.weight"),
    ],
    experts: None,
    gated_delta_net: false,
    fused_linear_projections: false,
    fused_qkv: false,
    fused_gate_up: false,
    interleaved_rope: false,
    gguf_tiled_value_heads: false,
    window_caps_context: false,
    gguf_mrope_interleaved: false,
    zero_centred_norms: true,
    scaled_embedding: true,
    tied_embeddings: true,
    sandwich_norms: true,
    no_input_norms: false,
    whole_qk_norms: false,
    activation: Activation::GeluTanh,
    local_layers: Some(LocalLayers { pattern: 6, rope_theta: Some(10_000.0), unscaled: false }),
    unrotated_interval: None,
    attention_sinks: false,
    latent_attention: false,
    yarn_truncate: true,
};
