//! Qwen3-Next (`Qwen3NextForCausalLM`): Qwen3.5-MoE's layers (gated DeltaNet linear attention
//! among gated full attention with rotary on a quarter of each head, zero-centred norms, experts
//! with a shared expert in every layer, `qwen35moe.rs`) in a plain checkpoint, with the linear
//! attention's input projections fused per key head: `in_proj_qkvz` holds each key head's q, k,
//! and its value heads' v and z rows, `in_proj_ba` their β and α rows (read as the separate
//! projections). Its router renormalises the top-k weights as `norm_topk_prob` says. Its GGUF
//! files (llama.cpp's `qwen3next`) split q, k, v and z, keep `ssm_ba` fused, and leave the value
//! heads grouped by key head.

use super::qwen35moe::QWEN3_5_MOE;
use super::{Architecture, Experts, Shared};

pub const QWEN3_NEXT: Architecture = Architecture {
    name: "qwen3_next",
    gguf: "qwen3next",
    hf_class: "Qwen3NextForCausalLM",
    gguf_pre: &["qwen2"],
    experts: Some(Experts {
        shared: Shared::Gated,
        sigmoid_router: false,
        gguf_norm_topk_prob: true,
        norm_topk_always: false,
        width: "moe_intermediate_size",
        biases: false,
        fused_3d: None,
    }),
    fused_linear_projections: true,
    fused_qkv: false,
    fused_gate_up: false,
    interleaved_rope: false,
    gguf_tiled_value_heads: false,
    ..QWEN3_5_MOE
};
