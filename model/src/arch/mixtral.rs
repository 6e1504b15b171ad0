//! Mixtral (`MixtralForCausalLM`: Mixtral 8x7B and 8x22B, and models tuned from them): Mistral's
//! layers with a mixture of experts in every layer: a softmax router, each token's top-k experts
//! (two of eight) with their weights renormalised, no shared expert, each expert as wide as
//! `intermediate_size`. Its checkpoints name the block `block_sparse_moe` and an expert's
//! matrices `w1` (gate), `w3` (up) and `w2` (down). Its GGUF files say `llama` with an
//! `llama.expert_count`, and the experts stacked per matrix as every MoE file has them (older
//! files hold one tensor per expert: `decoder::split_experts` stacks them).

use super::mistral::MISTRAL;
use super::{Architecture, Experts, Shared};

pub const MIXTRAL: Architecture = Architecture {
    name: "mixtral",
    gguf: "llama",
    hf_class: "MixtralForCausalLM",
    // Its GGUF files are Llama's: q and k interleaved by the converter.
    gguf_qk_interleaved: true,
    hf_aliases: &[
        ("mlp.gate.weight", "block_sparse_moe.gate.weight"),
        ("mlp.experts.{e}.gate_proj.weight", "block_sparse_moe.experts.{e}.w1.weight"),
        ("mlp.experts.{e}.up_proj.weight", "block_sparse_moe.experts.{e}.w3.weight"),
        ("mlp.experts.{e}.down_proj.weight", "block_sparse_moe.experts.{e}.w2.weight"),
    ],
    experts: Some(Experts {
        shared: Shared::None,
        sigmoid_router: false,
        gguf_norm_topk_prob: true,
        norm_topk_always: true,
        width: "intermediate_size",
        biases: false,
        fused_3d: None,
    }),
    ..MISTRAL
};
