//! Phi-3 and Phi-4 (`Phi3ForCausalLM`, GGUF `phi3`: Phi-3-mini/medium, Phi-3.5-mini, Phi-4,
//! Phi-4-mini): Llama's layers with q, k and v fused in `qkv_proj` and gate and up in
//! `gate_up_proj` (read as the separate projections), LongRoPE scaling (`longrope`: per-frequency
//! factors, short ones while a pass stays within the original context, long ones past it, and
//! cos and sin scaled by √(1 + ln(factor) / ln(original))), a partial rotary embedding on some
//! (Phi-4-mini's 0.75), and a `sliding_window` that caps the context as Mistral's does. Its GGUF
//! files keep `attn_qkv` and `ffn_up` fused, the factors as `rope_factors_long`/`_short`.

use super::Architecture;
use super::mistral::MISTRAL;

pub const PHI3: Architecture = Architecture {
    name: "phi3",
    gguf: "phi3",
    hf_class: "Phi3ForCausalLM",
    gguf_pre: &["default"],
    gguf_qk_interleaved: false,
    end_of_generation: &["<|end|>", "<|endoftext|>"],
    fused_qkv: true,
    fused_gate_up: true,
    interleaved_rope: false,
    ..MISTRAL
};
