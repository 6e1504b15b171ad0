//! Mistral 4 (`Mistral4ForCausalLM`, the language model of its `Mistral3ForConditionalGeneration`
//! checkpoints; GGUF `mistral4`): DeepSeek V3's layers under Mistral's tokenizer and chat format.
//! Multi-head latent attention with low-rank queries (`config::LatentAttention`), each query
//! multiplied by Llama 4's 1 + β · ln(1 + ⌊position / original context⌋) where its rope section
//! gives `llama_4_scaling_beta` (as Ministral 3's); from `first_k_dense_replace` on, mixtures of
//! experts routed by a softmax (its top-k renormalised where `norm_topk_prob`, times
//! `routed_scaling_factor`) with a shared expert added as it is. Its checkpoints keep a layer's
//! experts in 3-D tensors (`mlp.experts.gate_up_proj`, the gate's rows then the up's, and
//! `down_proj`), its GGUF files in `ffn_gate_up_exps` and `ffn_down_exps`. llama.cpp's converter
//! writes no query scaling into its files, so llama.cpp's reading has none, nor does ours of them.

use super::deepseek_v3::DEEPSEEK_V3;
use super::mistral::MISTRAL;
use super::{Architecture, Experts, Fused3d, Shared};

pub const MISTRAL4: Architecture = Architecture {
    name: "mistral4",
    gguf: "mistral4",
    hf_class: "Mistral4ForCausalLM",
    gguf_pre: &["tekken"],
    end_of_generation: MISTRAL.end_of_generation,
    experts: Some(Experts {
        shared: Shared::Plain,
        sigmoid_router: false,
        gguf_norm_topk_prob: false,
        norm_topk_always: false,
        width: "moe_intermediate_size",
        biases: false,
        fused_3d: Some(Fused3d::RowHalves),
    }),
    ..DEEPSEEK_V3
};
