//! DeepSeek V3 (`DeepseekV3ForCausalLM`), and as its layers DeepSeek V2 (`deepseek_v2`) and
//! GLM-4.7-Flash (`glm4_moe_lite`); GGUF `deepseek2` for all three, as llama.cpp's converter
//! writes them. Multi-head latent attention (`config::LatentAttention`): queries through a
//! low-rank pair with a norm between (`q_lora_rank`; one product where it is null: V2-Lite),
//! keys and values from one normed latent per token plus a rotated key part every head shares,
//! the rotation over adjacent pairs (`rope_interleave`), the scores scaled by YaRN's
//! `mscale_all_dim` where the rotation is stretched. From layer `first_k_dense_replace` on
//! (`mlp_layer_types` where a config lists them), mixture-of-experts blocks with a shared expert
//! added as it is: V3's and GLM-4.7-Flash's router a sigmoid choosing by score plus a per-expert
//! bias within its best groups, V2's a softmax (`scoring_func`; a GGUF file's
//! `expert_gating_func`), the weights times `routed_scaling_factor`. Multi-token-prediction
//! layers after the model's are not read.

use super::glm4moe::GLM4_MOE;
use super::llama::LLAMA;
use super::{Architecture, Experts, Shared};

pub const DEEPSEEK_V3: Architecture = Architecture {
    name: "deepseek_v3",
    gguf: "deepseek2",
    hf_class: "DeepseekV3ForCausalLM",
    default_head_dim: None,
    config_defaults: &[],
    // DeepSeek V3's and R1's files say `deepseek-v3`, V2's `deepseek-llm`, GLM-4.7-Flash's `glm4`.
    gguf_pre: &["deepseek-v3", "deepseek-llm", "glm4", "glm5"],
    gguf_qk_interleaved: false,
    // GLM-4.7-Flash's ends of a turn; DeepSeek's files end at their eos.
    end_of_generation: &["<|user|>", "<|observation|>", "<|endoftext|>"],
    // The shared expert is GLM-4.5's (`shared_experts`).
    hf_aliases: GLM4_MOE.hf_aliases,
    experts: Some(Experts {
        shared: Shared::Plain,
        sigmoid_router: true,
        gguf_norm_topk_prob: false,
        norm_topk_always: false,
        width: "moe_intermediate_size",
        biases: false,
        fused_3d: None,
    }),
    latent_attention: true,
    ..LLAMA
};
