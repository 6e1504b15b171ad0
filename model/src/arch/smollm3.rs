//! SmolLM3 (`SmolLM3ForCausalLM`, GGUF `smollm3`): Llama's layers, tied embeddings, and every
//! fourth layer without the rotary embedding (NoPE: its queries and keys go unturned;
//! `no_rope_layers` lists them, a GGUF file says nothing and llama.cpp fixes the interval at 4);
//! Llama 3's tokenizer, its turns ended by `<|im_end|>`.

use super::Architecture;
use super::llama::LLAMA;

pub const SMOLLM3: Architecture = Architecture {
    name: "smollm3",
    gguf: "smollm3",
    hf_class: "SmolLM3ForCausalLM",
    gguf_pre: &["llama-bpe"],
    end_of_generation: &["<|im_end|>", "<|eot_id|>", "<|end_of_text|>"],
    tied_embeddings: true,
    unrotated_interval: Some(4),
    ..LLAMA
};
