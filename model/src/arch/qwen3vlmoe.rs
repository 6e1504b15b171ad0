//! Qwen3-VL-MoE (the language model of `Qwen3VLMoeForConditionalGeneration` checkpoints, its
//! `text_config` `qwen3_vl_moe_text`; GGUF `qwen3vlmoe`): Qwen3-MoE's layers, the top-k always
//! renormalised (its configs have no `norm_topk_prob`), the head size hidden / heads where a
//! config gives none. Its checkpoints keep a layer's experts in 3-D tensors
//! (`mlp.experts.gate_up_proj` [experts, hidden, 2 · width], the gate's columns then the up's;
//! `down_proj` [experts, width, hidden]); llama.cpp's converter splits them. Text only, as
//! Qwen3-VL's (`qwen3vl`).

use super::qwen3moe::QWEN3_MOE;
use super::{Architecture, Experts, Fused3d, Shared};

pub const QWEN3_VL_MOE: Architecture = Architecture {
    name: "qwen3_vl_moe",
    gguf: "qwen3vlmoe",
    hf_class: "Qwen3VLMoeForConditionalGeneration",
    default_head_dim: None,
    gguf_mrope_interleaved: true,
    experts: Some(Experts {
        shared: Shared::None,
        sigmoid_router: false,
        gguf_norm_topk_prob: true,
        norm_topk_always: true,
        width: "moe_intermediate_size",
        biases: false,
        fused_3d: Some(Fused3d::Halves),
    }),
    ..QWEN3_MOE
};
