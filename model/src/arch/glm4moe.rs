//! GLM-4.5, 4.6 and 4.7 (`Glm4MoeForCausalLM`, GGUF `glm4moe`): Llama's pre-norm layers with
//! q, k and v biases (`attention_bias`), per-head q/k norms where `use_qk_norm` says (GLM-4.5's
//! 355B; not the Air's), a rotary embedding over the first half of each head
//! (`partial_rotary_factor`), and from layer `first_k_dense_replace` on mixture-of-experts
//! blocks: a sigmoid router that chooses by score plus a per-expert bias
//! (`e_score_correction_bias`) within its best groups and weighs by score, renormalised and
//! times `routed_scaling_factor`, with a shared expert added as it is (`shared_experts`,
//! `n_shared_experts` experts wide). Its multi-token-prediction layer (`num_nextn_predict_layers`,
//! after the model's) is not read. GGUF files as llama.cpp's converter writes them: the
//! feed-forward's norm as `post_attention_norm`, the bias as `exp_probs_b.bias`, the `glm4`
//! pre-tokenizer (Llama 3's split, no BOS: the chat template begins `[gMASK]<sop>`).

use super::llama::LLAMA;
use super::{Architecture, Bias, Experts, Shared};

pub const GLM4_MOE: Architecture = Architecture {
    name: "glm4_moe",
    gguf: "glm4moe",
    hf_class: "Glm4MoeForCausalLM",
    qkv_bias: Bias::Config { field: "attention_bias", default: false },
    o_bias_with_qkv: false,
    default_head_dim: None,
    // transformers' default for its configs (the released ones give it).
    config_defaults: &[("partial_rotary_factor", 0.5)],
    gguf_pre: &["glm4", "glm5"],
    gguf_qk_interleaved: false,
    end_of_generation: &["<|user|>", "<|observation|>", "<|endoftext|>"],
    gguf_aliases: &[("ffn_norm.weight", "post_attention_norm.weight")],
    hf_aliases: &[
        ("mlp.shared_expert.gate_proj.weight", "mlp.shared_experts.gate_proj.weight"),
        ("mlp.shared_expert.up_proj.weight", "mlp.shared_experts.up_proj.weight"),
        ("mlp.shared_expert.down_proj.weight", "mlp.shared_experts.down_proj.weight"),
    ],
    experts: Some(Experts {
        shared: Shared::Plain,
        sigmoid_router: true,
        gguf_norm_topk_prob: true,
        norm_topk_always: false,
        width: "moe_intermediate_size",
        biases: false,
        fused_3d: None,
    }),
    tied_embeddings: false,
    ..LLAMA
};
