//! OLMo 2 (`Olmo2ForCausalLM`, GGUF `olmo2`): Llama's attention and feed-forward with their
//! norms moved: nothing normalises their inputs, RMSNorms normalise their outputs before the
//! residual sums (`post_attention_layernorm`, `post_feedforward_layernorm`; in GGUF files
//! `post_attention_norm` and `post_ffw_norm`), and q and k are RMS-normalised over their whole
//! projections (all heads at once) before the rotary embedding. Its tokenizer is cl100k's
//! (`dbrx` in GGUF files). OLMo 3 (`olmo3`; its GGUF files say `olmo2`) is these layers with
//! three of every four local (`layer_types`, a `sliding_window`), which rotate by the global
//! base without the global layers' YaRN scaling.

use super::llama::LLAMA;
use super::{Architecture, LocalLayers};

pub const OLMO2: Architecture = Architecture {
    name: "olmo2",
    gguf: "olmo2",
    hf_class: "Olmo2ForCausalLM",
    qk_norm: true,
    gguf_pre: &["dbrx"],
    gguf_qk_interleaved: false,
    end_of_generation: &["<|endoftext|>", "<|im_end|>"],
    // The norm after the attention is its `post_attention_layernorm` (Llama's name for the
    // feed-forward's input norm, which it does not have).
    hf_aliases: &[("post_attention_norm.weight", "post_attention_layernorm.weight")],
    sandwich_norms: true,
    no_input_norms: true,
    whole_qk_norms: true,
    // OLMo 3's: three local layers for each global one, rotated by the global base unscaled.
    local_layers: Some(LocalLayers { pattern: 4, rope_theta: None, unscaled: true }),
    ..LLAMA
};
