//! Qwen3.5-MoE (`Qwen3_5MoeForConditionalGeneration`'s language model, or
//! `Qwen3_5MoeForCausalLM`): Qwen3.5's layers (`qwen35.rs`: gated DeltaNet linear attention
//! among gated full attention, zero-centred norms) with a mixture of experts in every layer: a
//! softmax router whose top-k weights are always renormalised, and a shared expert scaled by the
//! sigmoid of its own gate (Qwen2-MoE's block, under the same names).

use super::qwen35::QWEN3_5;
use super::{Architecture, Experts, Shared};

pub const QWEN3_5_MOE: Architecture = Architecture {
    name: "qwen3_5_moe",
    gguf: "qwen35moe",
    hf_class: "Qwen3_5MoeForConditionalGeneration",
    experts: Some(Experts {
        shared: Shared::Gated,
        sigmoid_router: false,
        gguf_norm_topk_prob: true,
        norm_topk_always: true,
        width: "moe_intermediate_size",
        biases: false,
        fused_3d: None,
    }),
    ..QWEN3_5
};
