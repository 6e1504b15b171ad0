//! Gemma 2 (`Gemma2ForCausalLM`, GGUF `gemma2`): Gemma 3's layers without q/k norms, local and
//! global layers alternating (the first local) with one rotary base, and tanh soft-capping of the
//! attention scores (`attn_logit_softcapping`, 50) and of the output logits
//! (`final_logit_softcapping`, 30).

use super::gemma3::GEMMA3;
use super::{Architecture, LocalLayers};

pub const GEMMA2: Architecture = Architecture {
    name: "gemma2",
    gguf: "gemma2",
    hf_class: "Gemma2ForCausalLM",
    qk_norm: false,
    // Gemma2Config's.
    config_defaults: &[
        ("vocab_size", 256_000.0),
        ("num_attention_heads", 8.0),
        ("num_key_value_heads", 4.0),
        ("max_position_embeddings", 8192.0),
        ("rms_norm_eps", 1e-6),
        ("rope_theta", 10_000.0),
        ("query_pre_attn_scalar", 256.0),
        ("sliding_window", 4096.0),
        ("attn_logit_softcapping", 50.0),
        ("final_logit_softcapping", 30.0),
    ],
    local_layers: Some(LocalLayers { pattern: 2, rope_theta: None, unscaled: false }),
    ..GEMMA3
};
