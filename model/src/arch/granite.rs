//! Granite 3.x (`GraniteForCausalLM`, GGUF `granite`): Llama's layers under four scalar
//! multipliers: the embeddings' (`embedding_multiplier`), the attention's and the
//! feed-forward's outputs before their residual sums (`residual_multiplier`), the attention
//! scores' in place of head_dim^−½ (`attention_multiplier`) and the logits' divisor
//! (`logits_scaling`); in GGUF files `embedding_scale`, `residual_scale`, `attention.scale` and
//! `logit_scale`, q and k interleaved as Llama's. Its tokenizer is the StarCoder family's
//! (`refact` in GGUF files: each digit apart, then GPT-2's split).

use super::Architecture;
use super::llama::LLAMA;

pub const GRANITE: Architecture = Architecture {
    name: "granite",
    gguf: "granite",
    hf_class: "GraniteForCausalLM",
    gguf_pre: &["refact", "starcoder"],
    end_of_generation: &["<|end_of_text|>"],
    ..LLAMA
};
