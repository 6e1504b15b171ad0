//! The decoder's weight slots: one declarative table from checkpoint names (Hugging Face's and
//! GGUF's, the same for every served family) to slots, which of them a config calls for (biases,
//! q/k norms, dense or mixture-of-experts feed-forwards), the expected shape of each, and their
//! loading and validation.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ops::Range;

use burn::tensor::{DType, Device, Tensor, TensorData};

use super::split_experts;
use crate::config::{Activation, ModelConfig, Routing};
use crate::error::LoadError;
use crate::layers::{
    Choice, DeltaNet, Expert, ExpertStacks, LatentAttention, Linear, Moe, Pre, RmsNorm, Sinks, Weight, linear,
};
use crate::quant::{Imatrix, QuantType};
use crate::tensors::{Naming, Stored, TensorSource, WeightDtype, load_experts, load_f32, load_matrix};

/// A weight slot (the names of the original C interface's `LlaisysQwen2Weights`, and the
/// slots later families add).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    InEmbed,
    OutNorm,
    OutEmbed,
    AttnNorm,
    AttnQ,
    AttnQBias,
    AttnQNorm,
    AttnK,
    AttnKBias,
    AttnKNorm,
    AttnV,
    AttnVBias,
    AttnO,
    AttnOBias,
    /// Each attention head's sink logit (gpt-oss): \[heads\].
    AttnSinks,
    MlpNorm,
    MlpGate,
    MlpUp,
    MlpDown,
    /// The norms of the attention's and the feed-forward's outputs (Gemma 2 and 3).
    PostAttnNorm,
    PostFfnNorm,
    /// A MoE block's router: [experts, hidden], and its bias (gpt-oss).
    MoeRouter,
    MoeRouterBias,
    /// A sigmoid router's per-expert bias on its choice, not on the weights (GLM-4.5's
    /// `e_score_correction_bias`): \[experts\].
    MoeChoiceBias,
    /// Each expert's matrices (one per expert in a Hugging Face checkpoint, one 3-D tensor of
    /// all experts in a GGUF file).
    ExpertGate,
    ExpertUp,
    ExpertDown,
    /// Each expert's biases (gpt-oss; a GGUF file's are [experts, width] each).
    ExpertGateBias,
    ExpertUpBias,
    ExpertDownBias,
    /// The shared expert (Qwen2-MoE's, GLM-4.5's) and its sigmoid gate (Qwen2-MoE's).
    SharedGate,
    SharedUp,
    SharedDown,
    SharedRouter,
    /// A gated DeltaNet layer's (Qwen3.5's linear attention): its stacked q, k, v projection
    /// (before the convolution), the output gate z's, β's and α's projections, the depthwise
    /// convolution ([channels, 1, width]), the time step's bias, log A, the gated norm's weight
    /// (one head's width) and the output projection.
    LinQkv,
    LinZ,
    LinBeta,
    LinAlpha,
    LinConv,
    LinDtBias,
    LinALog,
    LinNorm,
    LinOut,
    /// Latent attention's (DeepSeek's, GLM-4.7-Flash's; `config::LatentAttention`): the
    /// low-rank query pair and the norm between, the latent and shared rotated key's projection
    /// and the latent's norm, and each head's key and value rows over the latent (a Hugging Face
    /// checkpoint's `kv_b_proj`, split as llama.cpp's converter splits it: `attn_k_b` holds each
    /// head's key rows transposed, [heads, kv_rank, nope]).
    AttnQA,
    AttnQANorm,
    AttnQB,
    AttnKvA,
    AttnKvANorm,
    AttnKB,
    AttnVB,
}

/// Model-level slots and their names: Hugging Face's, then GGUF's.
pub const GLOBAL_SLOTS: [(Slot, &str, &str); 3] = [
    (Slot::InEmbed, "model.embed_tokens.weight", "token_embd.weight"),
    (Slot::OutNorm, "model.norm.weight", "output_norm.weight"),
    (Slot::OutEmbed, "lm_head.weight", "output.weight"),
];

/// Per-layer slots and their names: under `model.layers.{i}.` (Hugging Face) and `blk.{i}.` (GGUF).
pub const LAYER_SLOTS: [(Slot, &str, &str); 18] = [
    (Slot::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    (Slot::AttnQ, "self_attn.q_proj.weight", "attn_q.weight"),
    (Slot::AttnQBias, "self_attn.q_proj.bias", "attn_q.bias"),
    (Slot::AttnQNorm, "self_attn.q_norm.weight", "attn_q_norm.weight"),
    (Slot::AttnK, "self_attn.k_proj.weight", "attn_k.weight"),
    (Slot::AttnKBias, "self_attn.k_proj.bias", "attn_k.bias"),
    (Slot::AttnKNorm, "self_attn.k_norm.weight", "attn_k_norm.weight"),
    (Slot::AttnV, "self_attn.v_proj.weight", "attn_v.weight"),
    (Slot::AttnVBias, "self_attn.v_proj.bias", "attn_v.bias"),
    (Slot::AttnO, "self_attn.o_proj.weight", "attn_output.weight"),
    (Slot::AttnOBias, "self_attn.o_proj.bias", "attn_output.bias"),
    (Slot::MlpNorm, "post_attention_layernorm.weight", "ffn_norm.weight"),
    (Slot::MlpGate, "mlp.gate_proj.weight", "ffn_gate.weight"),
    (Slot::MlpUp, "mlp.up_proj.weight", "ffn_up.weight"),
    (Slot::MlpDown, "mlp.down_proj.weight", "ffn_down.weight"),
    // Gemma's `post_attention_layernorm` is served under this name (`Architecture::hf_aliases`):
    // Llama's, the MLP's input norm, holds its `pre_feedforward_layernorm`.
    (Slot::PostAttnNorm, "post_attention_norm.weight", "post_attention_norm.weight"),
    (Slot::PostFfnNorm, "post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
    (Slot::AttnSinks, "self_attn.sinks", "attn_sinks.weight"),
];

/// A linear-attention layer's slots in place of the attention's (Qwen3.5): Hugging Face's names,
/// then GGUF's.
pub const LINEAR_SLOTS: [(Slot, &str, &str); 9] = [
    (Slot::LinQkv, "linear_attn.in_proj_qkv.weight", "attn_qkv.weight"),
    (Slot::LinZ, "linear_attn.in_proj_z.weight", "attn_gate.weight"),
    (Slot::LinBeta, "linear_attn.in_proj_b.weight", "ssm_beta.weight"),
    (Slot::LinAlpha, "linear_attn.in_proj_a.weight", "ssm_alpha.weight"),
    (Slot::LinConv, "linear_attn.conv1d.weight", "ssm_conv1d.weight"),
    (Slot::LinDtBias, "linear_attn.dt_bias", "ssm_dt.bias"),
    (Slot::LinALog, "linear_attn.A_log", "ssm_a"),
    (Slot::LinNorm, "linear_attn.norm.weight", "ssm_norm.weight"),
    (Slot::LinOut, "linear_attn.out_proj.weight", "ssm_out.weight"),
];

/// Latent attention's slots in place of k's and v's (`Slot::AttnQA`...): Hugging Face's names,
/// then GGUF's. A checkpoint's `kv_b_proj` is read as the first two of its rows' parts
/// (`split_rows`).
pub const LATENT_SLOTS: [(Slot, &str, &str); 7] = [
    (Slot::AttnQA, "self_attn.q_a_proj.weight", "attn_q_a.weight"),
    (Slot::AttnQANorm, "self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"),
    (Slot::AttnQB, "self_attn.q_b_proj.weight", "attn_q_b.weight"),
    (Slot::AttnKvA, "self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"),
    (Slot::AttnKvANorm, "self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"),
    (Slot::AttnKB, "self_attn.k_b_proj.weight", "attn_k_b.weight"),
    (Slot::AttnVB, "self_attn.v_b_proj.weight", "attn_v_b.weight"),
];

/// Mixture-of-experts slots under a layer: Hugging Face's names (`{e}`: the expert's index), then
/// GGUF's.
pub const MOE_SLOTS: [(Slot, &str, &str); 13] = [
    (Slot::MoeRouter, "mlp.gate.weight", "ffn_gate_inp.weight"),
    (Slot::MoeRouterBias, "mlp.gate.bias", "ffn_gate_inp.bias"),
    (Slot::MoeChoiceBias, "mlp.gate.e_score_correction_bias", "exp_probs_b.bias"),
    (Slot::ExpertGate, "mlp.experts.{e}.gate_proj.weight", "ffn_gate_exps.weight"),
    (Slot::ExpertUp, "mlp.experts.{e}.up_proj.weight", "ffn_up_exps.weight"),
    (Slot::ExpertDown, "mlp.experts.{e}.down_proj.weight", "ffn_down_exps.weight"),
    (Slot::ExpertGateBias, "mlp.experts.{e}.gate_proj.bias", "ffn_gate_exps.bias"),
    (Slot::ExpertUpBias, "mlp.experts.{e}.up_proj.bias", "ffn_up_exps.bias"),
    (Slot::ExpertDownBias, "mlp.experts.{e}.down_proj.bias", "ffn_down_exps.bias"),
    (Slot::SharedGate, "mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
    (Slot::SharedUp, "mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
    (Slot::SharedDown, "mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"),
    (Slot::SharedRouter, "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
];

impl Slot {
    pub fn label(self) -> &'static str {
        match self {
            Slot::InEmbed => "in_embed",
            Slot::OutNorm => "out_norm_w",
            Slot::OutEmbed => "out_embed",
            Slot::AttnNorm => "attn_norm_w",
            Slot::AttnQ => "attn_q_w",
            Slot::AttnQBias => "attn_q_b",
            Slot::AttnQNorm => "attn_q_norm_w",
            Slot::AttnK => "attn_k_w",
            Slot::AttnKBias => "attn_k_b",
            Slot::AttnKNorm => "attn_k_norm_w",
            Slot::AttnV => "attn_v_w",
            Slot::AttnVBias => "attn_v_b",
            Slot::AttnO => "attn_o_w",
            Slot::AttnOBias => "attn_o_b",
            Slot::AttnSinks => "attn_sinks",
            Slot::MlpNorm => "mlp_norm_w",
            Slot::MlpGate => "mlp_gate_w",
            Slot::MlpUp => "mlp_up_w",
            Slot::MlpDown => "mlp_down_w",
            Slot::PostAttnNorm => "attn_post_norm_w",
            Slot::PostFfnNorm => "mlp_post_norm_w",
            Slot::MoeRouter => "moe_router_w",
            Slot::MoeRouterBias => "moe_router_b",
            Slot::MoeChoiceBias => "moe_choice_b",
            Slot::ExpertGate => "expert_gate_w",
            Slot::ExpertUp => "expert_up_w",
            Slot::ExpertDown => "expert_down_w",
            Slot::ExpertGateBias => "expert_gate_b",
            Slot::ExpertUpBias => "expert_up_b",
            Slot::ExpertDownBias => "expert_down_b",
            Slot::SharedGate => "shared_gate_w",
            Slot::SharedUp => "shared_up_w",
            Slot::SharedDown => "shared_down_w",
            Slot::SharedRouter => "shared_router_w",
            Slot::LinQkv => "lin_qkv_w",
            Slot::LinZ => "lin_z_w",
            Slot::LinBeta => "lin_beta_w",
            Slot::LinAlpha => "lin_alpha_w",
            Slot::LinConv => "lin_conv_w",
            Slot::LinDtBias => "lin_dt_b",
            Slot::LinALog => "lin_a_log",
            Slot::LinNorm => "lin_norm_w",
            Slot::LinOut => "lin_out_w",
            Slot::AttnQA => "attn_q_a_w",
            Slot::AttnQANorm => "attn_q_a_norm_w",
            Slot::AttnQB => "attn_q_b_w",
            Slot::AttnKvA => "attn_kv_a_w",
            Slot::AttnKvANorm => "attn_kv_a_norm_w",
            Slot::AttnKB => "attn_k_b_w",
            Slot::AttnVB => "attn_v_b_w",
        }
    }

    /// Whether a model of config `c` has this slot.
    pub fn present(self, c: &ModelConfig) -> bool {
        let low_rank_q = c.latent.as_ref().is_some_and(|l| l.q_rank.is_some());
        match self {
            Slot::AttnQA | Slot::AttnQANorm | Slot::AttnQB => low_rank_q,
            Slot::AttnKvA | Slot::AttnKvANorm | Slot::AttnKB | Slot::AttnVB => c.latent.is_some(),
            Slot::AttnQ => !low_rank_q,
            Slot::AttnK | Slot::AttnV => c.latent.is_none(),
            Slot::OutEmbed => !c.tie_word_embeddings,
            Slot::AttnQBias | Slot::AttnKBias | Slot::AttnVBias => c.qkv_bias,
            Slot::AttnOBias => c.o_bias,
            Slot::AttnQNorm | Slot::AttnKNorm => c.qk_norm,
            Slot::AttnNorm | Slot::MlpNorm => c.input_norms,
            Slot::PostAttnNorm | Slot::PostFfnNorm => c.sandwich_norms,
            Slot::AttnSinks => c.attention_sinks,
            Slot::MoeRouter | Slot::ExpertGate | Slot::ExpertUp | Slot::ExpertDown => c.moe.is_some(),
            Slot::MoeRouterBias | Slot::ExpertGateBias | Slot::ExpertUpBias | Slot::ExpertDownBias => {
                c.moe.as_ref().is_some_and(|m| m.biases)
            }
            Slot::MoeChoiceBias => c.moe.as_ref().is_some_and(|m| matches!(m.routing, Routing::Sigmoid { .. })),
            Slot::SharedGate | Slot::SharedUp | Slot::SharedDown => {
                c.moe.as_ref().is_some_and(|m| m.shared_intermediate_size.is_some())
            }
            Slot::SharedRouter => {
                c.moe.as_ref().is_some_and(|m| m.shared_intermediate_size.is_some() && m.shared_gated)
            }
            _ if self.is_linear() => c.linear.is_some(),
            _ => true,
        }
    }

    /// Whether layer `l` of a model of config `c` has this slot (a MoE layer has no dense
    /// feed-forward, a dense one no experts).
    pub fn present_in(self, c: &ModelConfig, l: usize) -> bool {
        let moe_slot = MOE_SLOTS.iter().any(|(s, _, _)| *s == self);
        let dense_slot = matches!(self, Slot::MlpGate | Slot::MlpUp | Slot::MlpDown);
        let moe_layer = c.is_moe_layer(l);
        // A linear-attention layer has its slots instead of the attention's.
        let attention_slot =
            LAYER_SLOTS[1..11].iter().chain(&LATENT_SLOTS).any(|(s, _, _)| *s == self) || self == Slot::AttnSinks;
        let mixer = if c.is_linear_layer(l) { !attention_slot } else { !self.is_linear() };
        self.present(c) && (moe_layer || !moe_slot) && !(dense_slot && moe_layer) && mixer
    }

    /// A linear-attention layer's slot.
    fn is_linear(self) -> bool {
        LINEAR_SLOTS.iter().any(|(s, _, _)| *s == self)
    }

    /// The shape in checkpoints named `naming`: a GGUF file keeps all experts of a matrix in one
    /// 3-D tensor, may store the shared expert's gate as a vector, and stores the linear
    /// attention's convolution as [channels, kernel].
    pub fn shape_in(self, c: &ModelConfig, naming: Naming) -> Vec<usize> {
        let experts = c.moe.as_ref().map_or(0, |m| m.experts);
        match (self, naming) {
            (_, Naming::Gguf) if is_expert(self) => [vec![experts], self.shape(c)].concat(),
            // llama.cpp's converter squeezes the convolution's middle dimension.
            (Slot::LinConv, Naming::Gguf) => self.shape(c).into_iter().filter(|&d| d != 1).collect(),
            // llama.cpp's converter writes each head's rows apart, its key rows transposed.
            (Slot::AttnKB | Slot::AttnVB, Naming::Gguf) => {
                let (heads, l) = (c.num_attention_heads, c.latent.as_ref());
                let (kv, nope, v) = l.map_or((0, 0, 0), |l| (l.kv_rank, l.nope_dim, l.v_dim));
                if self == Slot::AttnKB { vec![heads, kv, nope] } else { vec![heads, v, kv] }
            }
            _ => self.shape(c),
        }
    }

    /// Expected shape; linear weights are `[out, in]`.
    pub fn shape(self, c: &ModelConfig) -> Vec<usize> {
        let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let (q, kv) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        let lin = c.linear.as_ref();
        let (conv, width) = lin.map_or((0, 0), |a| (a.conv_dim(), a.conv_kernel));
        let (value_heads, values) = lin.map_or((0, 0), |a| (a.value_heads, a.value_heads * a.value_dim));
        let heads = c.num_attention_heads;
        if let Some(l) = &c.latent {
            let q_rank = l.q_rank.unwrap_or(0);
            match self {
                Slot::AttnQA => return vec![q_rank, h],
                Slot::AttnQANorm => return vec![q_rank],
                Slot::AttnQB => return vec![heads * l.qk_dim(), q_rank],
                Slot::AttnQ => return vec![heads * l.qk_dim(), h],
                Slot::AttnKvA => return vec![l.kv_rank + l.rope_dim, h],
                Slot::AttnKvANorm => return vec![l.kv_rank],
                Slot::AttnKB => return vec![heads * l.nope_dim, l.kv_rank],
                Slot::AttnVB => return vec![heads * l.v_dim, l.kv_rank],
                Slot::AttnO => return vec![h, heads * l.v_dim],
                _ => {}
            }
        }
        match self {
            Slot::AttnQA
            | Slot::AttnQANorm
            | Slot::AttnQB
            | Slot::AttnKvA
            | Slot::AttnKvANorm
            | Slot::AttnKB
            | Slot::AttnVB => Vec::new(),
            Slot::LinQkv => vec![conv, h],
            Slot::LinZ => vec![values, h],
            Slot::LinBeta | Slot::LinAlpha => vec![value_heads, h],
            Slot::LinConv => vec![conv, 1, width],
            Slot::LinDtBias | Slot::LinALog => vec![value_heads],
            Slot::LinNorm => vec![lin.map_or(0, |a| a.value_dim)],
            Slot::LinOut => vec![h, values],
            // With an output gate, each head's gate rows follow its query rows.
            Slot::AttnQ if c.attn_output_gate => vec![2 * q, h],
            Slot::AttnQBias if c.attn_output_gate => vec![2 * q],
            Slot::InEmbed | Slot::OutEmbed => vec![v, h],
            Slot::OutNorm | Slot::AttnNorm | Slot::MlpNorm | Slot::AttnOBias => vec![h],
            Slot::AttnSinks => vec![c.num_attention_heads],
            Slot::PostAttnNorm | Slot::PostFfnNorm => vec![h],
            Slot::AttnQBias => vec![q],
            // Over all heads at once (OLMo 2's), else each head's.
            Slot::AttnQNorm if c.whole_qk_norms => vec![c.num_attention_heads * c.head_dim],
            Slot::AttnKNorm if c.whole_qk_norms => vec![c.num_key_value_heads * c.head_dim],
            Slot::AttnQNorm | Slot::AttnKNorm => vec![c.head_dim],
            Slot::AttnQ => vec![q, h],
            Slot::AttnO => vec![h, q],
            Slot::AttnK | Slot::AttnV => vec![kv, h],
            Slot::AttnKBias | Slot::AttnVBias => vec![kv],
            Slot::MlpGate | Slot::MlpUp => vec![i, h],
            Slot::MlpDown => vec![h, i],
            Slot::MoeRouter => vec![c.moe.as_ref().map_or(0, |m| m.experts), h],
            Slot::MoeRouterBias | Slot::MoeChoiceBias => vec![c.moe.as_ref().map_or(0, |m| m.experts)],
            Slot::ExpertGateBias | Slot::ExpertUpBias => vec![c.moe.as_ref().map_or(0, |m| m.intermediate_size)],
            Slot::ExpertDownBias => vec![h],
            Slot::ExpertGate | Slot::ExpertUp => vec![c.moe.as_ref().map_or(0, |m| m.intermediate_size), h],
            Slot::ExpertDown => vec![h, c.moe.as_ref().map_or(0, |m| m.intermediate_size)],
            Slot::SharedGate | Slot::SharedUp => vec![shared_width(c), h],
            Slot::SharedDown => vec![h, shared_width(c)],
            Slot::SharedRouter => vec![1, h],
        }
    }

    /// The weight type of this slot's matrix (in `layer`) under `dtype`: a mix's per-matrix
    /// choice, `dtype` itself otherwise.
    pub fn dtype(self, dtype: WeightDtype, layer: Option<usize>, c: &ModelConfig) -> WeightDtype {
        match dtype {
            WeightDtype::Mixed(base) => WeightDtype::Quant(self.mixed(base, layer, c)),
            other => other,
        }
    }

    /// `llama-quantize`'s choice for this slot's matrix in its `Q3_K_M` / `Q4_K_M` / `Q5_K_M` mix
    /// of base `base`: Q6_K for the output head (the embedding where it is tied); with eight
    /// experts, Q8_0 for the key and value projections and (`Q3_K_M`, `Q4_K_M`) Q5_K for the
    /// output one. `Q4_K_M` and `Q5_K_M`: Q6_K for the value and down projections (every
    /// expert's and the shared one's) of the first and last eighth of the layers and every third
    /// between. `Q3_K_M`: Q5_K for the value projections of the first two layers and the down
    /// projections of the first sixteenth, Q4_K for the other value and down projections and the
    /// output projection. `base` for the rest. A K-quant that does not fit a matrix's rows falls
    /// back as `WeightDtype::storage` says.
    fn mixed(self, base: QuantType, layer: Option<usize>, c: &ModelConfig) -> QuantType {
        let layers = c.num_hidden_layers;
        // Which layers get more bits (llama.cpp's `use_more_bits`).
        let more_bits = |l: usize| l < layers / 8 || l >= 7 * layers / 8 || (l - layers / 8) % 3 == 2;
        let eight_experts = c.moe.as_ref().is_some_and(|m| m.experts == 8);
        match (self, layer) {
            (Slot::OutEmbed, _) => QuantType::Q6K,
            (Slot::InEmbed, _) if c.tie_word_embeddings => QuantType::Q6K,
            (Slot::AttnK | Slot::AttnV, _) if eight_experts => QuantType::Q8_0,
            (Slot::AttnV, Some(l)) if base == QuantType::Q3K => {
                if l < 2 {
                    QuantType::Q5K
                } else {
                    QuantType::Q4K
                }
            }
            (Slot::MlpDown | Slot::ExpertDown | Slot::SharedDown, Some(l)) if base == QuantType::Q3K => {
                if l < layers / 16 { QuantType::Q5K } else { QuantType::Q4K }
            }
            (Slot::AttnO, _) if base == QuantType::Q3K => {
                if eight_experts {
                    QuantType::Q5K
                } else {
                    QuantType::Q4K
                }
            }
            (Slot::AttnV | Slot::MlpDown | Slot::ExpertDown | Slot::SharedDown, Some(l)) if more_bits(l) => {
                QuantType::Q6K
            }
            (Slot::AttnO, _) if eight_experts && base == QuantType::Q4K => QuantType::Q5K,
            _ => base,
        }
    }
}

/// A linear-attention layer's log-decay rates from its `A` tensor: −exp(A_log) in a Hugging
/// Face checkpoint, stored so in a GGUF file.
fn decay_rate(a: &crate::config::LinearAttention, stored: Vec<f32>) -> Vec<f32> {
    if a.gguf_layout { stored } else { stored.into_iter().map(|a| -a.exp()).collect() }
}

fn shared_width(c: &ModelConfig) -> usize {
    c.moe.as_ref().and_then(|m| m.shared_intermediate_size).unwrap_or(0)
}

/// The name of `slot` (of `layer` for per-layer slots) in `naming`, from the tables above (an
/// expert's Hugging Face name keeps `{e}`: `expert_name` fills it).
pub fn name_of(slot: Slot, layer: Option<usize>, naming: Naming) -> String {
    let found = match layer {
        Some(_) => {
            LAYER_SLOTS.iter().chain(&MOE_SLOTS).chain(&LINEAR_SLOTS).chain(&LATENT_SLOTS).find(|(s, _, _)| *s == slot)
        }
        None => GLOBAL_SLOTS.iter().find(|(s, _, _)| *s == slot),
    };
    let (_, hf, gguf) = found.copied().unwrap_or((slot, "", ""));
    match (layer, naming) {
        (Some(l), Naming::Hf) => format!("model.layers.{l}.{hf}"),
        (Some(l), Naming::Gguf) => format!("blk.{l}.{gguf}"),
        (None, Naming::Hf) => hf.to_string(),
        (None, Naming::Gguf) => gguf.to_string(),
    }
}

/// Expert `e`'s Hugging Face name of an expert slot of layer `l`.
pub fn expert_name(slot: Slot, l: usize, e: usize) -> String {
    name_of(slot, Some(l), Naming::Hf).replace("{e}", &e.to_string())
}

/// An expert's slot: one tensor per expert in a Hugging Face checkpoint, one of all of them in a
/// GGUF file.
pub fn is_expert(slot: Slot) -> bool {
    matches!(
        slot,
        Slot::ExpertGate
            | Slot::ExpertUp
            | Slot::ExpertDown
            | Slot::ExpertGateBias
            | Slot::ExpertUpBias
            | Slot::ExpertDownBias
    )
}

/// Every tensor name the config calls for in `naming`, with its slot and layer.
pub fn expected(c: &ModelConfig, naming: Naming) -> Vec<(String, Slot, Option<usize>)> {
    let global = GLOBAL_SLOTS
        .iter()
        .filter(|(slot, _, _)| slot.present(c))
        .map(move |(slot, _, _)| (name_of(*slot, None, naming), *slot, None));
    let experts = c.moe.as_ref().map_or(0, |m| m.experts);
    let layers = (0..c.num_hidden_layers).flat_map(move |l| {
        LAYER_SLOTS
            .iter()
            .chain(&MOE_SLOTS)
            .chain(&LINEAR_SLOTS)
            .chain(&LATENT_SLOTS)
            .filter(move |(slot, _, _)| slot.present_in(c, l))
            .flat_map(move |(slot, _, _)| match (is_expert(*slot), naming) {
                (true, Naming::Hf) => (0..experts).map(|e| (expert_name(*slot, l, e), *slot, Some(l))).collect(),
                _ => vec![(name_of(*slot, Some(l), naming), *slot, Some(l))],
            })
    });
    global.chain(layers).collect()
}

/// The slot and layer of tensor `name` (in either naming), if the config has one.
pub fn slot_of(c: &ModelConfig, name: &str) -> Option<(Slot, Option<usize>)> {
    [Naming::Hf, Naming::Gguf]
        .into_iter()
        .flat_map(|naming| expected(c, naming))
        .find(|(n, _, _)| n == name)
        .map(|(_, s, l)| (s, l))
}

/// The entries of `imatrix` that name no matrix of a model of config `c` (as a GGUF file names
/// them, its experts stacked or one tensor each), in order: reported at load rather than
/// silently unused.
fn unmatched<'a>(c: &ModelConfig, imatrix: &'a Imatrix) -> Vec<&'a str> {
    let mut known: BTreeSet<String> = expected(c, Naming::Gguf).into_iter().map(|(name, _, _)| name).collect();
    let experts = c.moe.as_ref().map_or(0, |m| m.experts);
    for l in (0..c.num_hidden_layers).filter(|&l| c.is_moe_layer(l)) {
        for slot in [Slot::ExpertGate, Slot::ExpertUp, Slot::ExpertDown] {
            known.extend((0..experts).filter_map(|e| split_experts::expert_tensor(slot, l, e)));
        }
    }
    let mut unmatched: Vec<&str> = imatrix.names().filter(|n| !known.contains(*n)).collect();
    unmatched.sort_unstable();
    unmatched
}

/// Checks every slot before anything is loaded: present, no strangers, shape and type right.
pub fn check(c: &ModelConfig, src: &dyn TensorSource) -> Result<(), LoadError> {
    let naming = src.naming();
    let names = src.names();
    // Every layer has several tensors: a layer count beyond the tensors there are is an error
    // before millions of names are listed (a fuzzed GGUF took a minute here).
    if c.num_hidden_layers > names.len() {
        let reason = format!("{} layers, but the checkpoint holds {} tensors", c.num_hidden_layers, names.len());
        return Err(LoadError::Config { field: "num_hidden_layers".into(), reason });
    }
    let want = expected(c, naming);
    let missing: Vec<String> =
        want.iter().filter(|(n, _, _)| !names.contains(n.as_str())).map(|(n, _, _)| n.clone()).collect();
    if !missing.is_empty() {
        return Err(LoadError::MissingTensors(missing));
    }
    let tied_head = name_of(Slot::OutEmbed, None, naming);
    let unexpected: Vec<String> = names
        .iter()
        .filter(|n| !want.iter().any(|(w, _, _)| w == *n))
        // A tied checkpoint may still carry its (identical) output matrix; it is not used.
        .filter(|n| !(c.tie_word_embeddings && **n == tied_head))
        // Llama 3's and Phi-3's rope scaling in a GGUF file, read with the config.
        .filter(|n| !(naming == Naming::Gguf && [ROPE_FREQS, ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT].contains(n)))
        .map(|n| n.to_string())
        .collect();
    if !unexpected.is_empty() {
        return Err(LoadError::UnexpectedTensors(unexpected));
    }
    for (name, slot, layer) in &want {
        let found = src.shape(name).unwrap_or_default();
        // A GGUF file may store the shared expert's gate as a vector, and latent attention's
        // per-head products as rows of the whole `attn_kv_b` (files from before its split).
        let vector_gate = *slot == Slot::SharedRouter && found == [c.hidden_size];
        let whole_kv_b = matches!(slot, Slot::AttnKB | Slot::AttnVB) && found == slot.shape(c);
        let expected = slot.shape_in(c, naming);
        if found != expected && !vector_gate && !whole_kv_b {
            return Err(LoadError::Shape { slot: slot.label(), layer: *layer, expected, found });
        }
        if let Some(Err(dtype)) = src.stored(name) {
            return Err(LoadError::Dtype { tensor: name.clone(), slot: slot.label(), layer: *layer, dtype });
        }
    }
    Ok(())
}

pub fn check_one(c: &ModelConfig, slot: Slot, layer: Option<usize>, found: &[usize]) -> Result<(), LoadError> {
    let expected = slot.shape(c);
    if found != expected.as_slice() && found != slot.shape_in(c, Naming::Gguf).as_slice() {
        return Err(LoadError::Shape { slot: slot.label(), layer, expected, found: found.to_vec() });
    }
    Ok(())
}

/// Where each of a head's dimensions comes from (new index → checkpoint's) so that a rotary
/// embedding's pairs among the first `rotary` dimensions, `i` and `i + rotary/2` (or `2i` and
/// `2i + 1` where `interleaved`: GLM-4's), become `i` and `i + head_dim/2` (the layout the RoPE
/// kernels turn); the unturned dimensions fill the rest in order. q and k are reordered alike,
/// so their products are unchanged.
pub fn rotary_order(head_dim: usize, rotary: usize, interleaved: bool) -> Vec<usize> {
    let (half, r) = (head_dim / 2, rotary / 2);
    let pair = |i: usize, second: usize| if interleaved { 2 * i + second } else { i + second * r };
    let mut rest = rotary..head_dim;
    (0..head_dim)
        .map(|d| match d {
            d if d < r => pair(d, 0),
            d if d >= half && d < half + r => pair(d - half, 1),
            _ => rest.next().unwrap_or(0),
        })
        .collect()
}

/// The tensors (named as in `naming`) whose rows a checkpoint of config `c` holds in another
/// order than the kernels take, with the order (new row → stored row): q and k (and their
/// biases and norms) for a partial or interleaved rotary embedding (`rotary_order`), and `q_proj`'s rows with
/// an output gate, where each head's gate rows follow its query rows: all gates first, then the
/// queries. A GGUF file holds them as the Hugging Face checkpoint it was converted from does.
pub fn row_orders(c: &ModelConfig, naming: Naming) -> Vec<(String, Vec<usize>)> {
    if let Some(l) = &c.latent {
        return latent_row_orders(c, l, naming);
    }
    if c.rotary_dim == c.head_dim && !c.attn_output_gate && !c.arch.interleaved_rope {
        return Vec::new();
    }
    let (hd, heads, kv_heads) = (c.head_dim, c.num_attention_heads, c.num_key_value_heads);
    let dims = rotary_order(hd, c.rotary_dim, c.arch.interleaved_rope);
    let per_head = if c.attn_output_gate { 2 * hd } else { hd };
    let mut q: Vec<usize> = Vec::with_capacity(heads * per_head);
    if c.attn_output_gate {
        q.extend((0..heads).flat_map(|h| (0..hd).map(move |d| h * per_head + hd + d)));
    }
    q.extend((0..heads).flat_map(|h| dims.iter().map(move |&d| h * per_head + d)));
    let k: Vec<usize> = (0..kv_heads).flat_map(|h| dims.iter().map(move |&d| h * hd + d)).collect();
    // Norms over all heads at once (OLMo 2's) are reordered as the queries' and keys' rows.
    let (q_norm, k_norm) = match c.whole_qk_norms {
        true => ((0..heads).flat_map(|h| dims.iter().map(move |&d| h * hd + d)).collect(), k.clone()),
        false => (dims.clone(), dims.clone()),
    };
    let mut orders = Vec::new();
    for l in (0..c.num_hidden_layers).filter(|&l| !c.is_linear_layer(l)) {
        let l = Some(l);
        for (slot, order) in [
            (Slot::AttnQ, &q),
            (Slot::AttnQBias, &q),
            (Slot::AttnK, &k),
            (Slot::AttnKBias, &k),
            (Slot::AttnQNorm, &q_norm),
            (Slot::AttnKNorm, &k_norm),
        ] {
            if slot.present(c) {
                orders.push((name_of(slot, l, naming), order.clone()));
            }
        }
    }
    orders
}

/// Latent attention's rows in the rotation's order where it turns adjacent pairs
/// (`LatentAttention::interleaved`): the rotated rows of each head's query (after its unrotated
/// ones) and of the shared key (after the latent's), as `rotary_order` puts a head's.
fn latent_row_orders(c: &ModelConfig, l: &crate::config::LatentAttention, naming: Naming) -> Vec<(String, Vec<usize>)> {
    if !l.interleaved {
        return Vec::new();
    }
    let pairs = rotary_order(l.rope_dim, l.rope_dim, true);
    let (qk, nope) = (l.qk_dim(), l.nope_dim);
    let q: Vec<usize> = (0..c.num_attention_heads)
        .flat_map(|h| (0..nope).map(move |d| h * qk + d).chain(pairs.iter().map(move |&d| h * qk + nope + d)))
        .collect();
    let kv: Vec<usize> = (0..l.kv_rank).chain(pairs.iter().map(|&d| l.kv_rank + d)).collect();
    let query = if l.q_rank.is_some() { Slot::AttnQB } else { Slot::AttnQ };
    let layers = (0..c.num_hidden_layers).map(Some);
    layers
        .flat_map(|l| [(name_of(query, l, naming), q.clone()), (name_of(Slot::AttnKvA, l, naming), kv.clone())])
        .collect()
}

/// `data`'s rows (its first dimension) in `order` (new row → old row).
/// Where a tensor of `shape`'s reordered rows lie: (how many groups of them, the axis an order
/// indexes). A 3-D tensor (a GGUF file's experts) is reordered within each of its first
/// dimension's, the same order for each; any other along its first axis.
fn row_axis(shape: &[usize]) -> (usize, usize) {
    if shape.len() == 3 { (shape[0], 1) } else { (1, 0) }
}

pub fn reorder_rows(name: &str, data: TensorData, order: &[usize]) -> Result<TensorData, LoadError> {
    let mut shape = data.shape().as_slice().to_vec();
    let dtype = data.dtype();
    let values = data
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| LoadError::Tensor { name: name.into(), reason: format!("reading values: {e:?}") })?;
    let (groups, axis) = row_axis(&shape);
    let stored = shape.get(axis).copied().unwrap_or(0);
    let width = values.len() / (groups * stored).max(1);
    if order.iter().any(|&r| r >= stored) {
        return Err(LoadError::Tensor {
            name: name.into(),
            reason: format!("has {stored} rows, fewer than its layout"),
        });
    }
    let rows: Vec<f32> = (0..groups)
        .flat_map(|g| order.iter().map(move |&r| g * stored + r))
        .flat_map(|r| values[r * width..(r + 1) * width].iter().copied())
        .collect();
    shape[axis] = order.len();
    Ok(crate::tensors::convert(rows, shape, dtype))
}

/// Every tensor read from other rows than its own ([`Reordered`]'s orders): `row_orders` and
/// `split_rows`, a tensor in both taken from the fused one in the reordered order (Phi-4-mini's
/// q and k: fused, and partly rotated).
pub fn reorderings(c: &ModelConfig, naming: Naming) -> Vec<(String, String, Vec<usize>)> {
    let splits = split_rows(c, naming);
    let mut out: Vec<(String, String, Vec<usize>)> = row_orders(c, naming)
        .into_iter()
        .map(|(name, order)| match splits.iter().find(|(n, _, _)| *n == name) {
            Some((_, from, rows)) => {
                let composed = order.iter().map(|&r| rows.get(r).copied().unwrap_or(usize::MAX)).collect();
                (name, from.clone(), composed)
            }
            None => (name.clone(), name, order),
        })
        .collect();
    let split_only: Vec<_> = splits.into_iter().filter(|(n, _, _)| !out.iter().any(|(o, _, _)| o == n)).collect();
    out.extend(split_only);
    out
}

/// The tensors (named as in `naming`) that a checkpoint of config `c` fuses, as (the decoder's
/// tensor, the stored one, its rows: new row → stored row; a 3-D tensor's within each expert):
/// those of `projection_splits`, and a GGUF file's experts' gate and up in one tensor each layer.
pub fn split_rows(c: &ModelConfig, naming: Naming) -> Vec<(String, String, Vec<usize>)> {
    let mut out = projection_splits(c, naming);
    out.extend(gate_up_experts(c, naming));
    out
}

/// A GGUF file's experts' gate and up matrices in one tensor a layer (`ffn_gate_up_exps`, each
/// expert's gate rows then its up rows: llama.cpp's converter keeps transformers' fused experts
/// so, Mistral 4's), read as `ffn_gate_exps` and `ffn_up_exps`.
fn gate_up_experts(c: &ModelConfig, naming: Naming) -> Vec<(String, String, Vec<usize>)> {
    let (Some(m), Naming::Gguf) = (&c.moe, naming) else { return Vec::new() };
    let w = m.intermediate_size;
    (0..c.num_hidden_layers)
        .filter(|&l| c.is_moe_layer(l))
        .flat_map(|l| {
            let fused = format!("blk.{l}.ffn_gate_up_exps.weight");
            [
                (name_of(Slot::ExpertGate, Some(l), naming), fused.clone(), (0..w).collect()),
                (name_of(Slot::ExpertUp, Some(l), naming), fused, (w..2 * w).collect()),
            ]
        })
        .collect()
}

/// The tensors (named as in `naming`) that a checkpoint of config `c` fuses, as (the decoder's
/// tensor, the stored one, its rows: new row → stored row): Qwen3-Next's linear attention keeps
/// per key head its q, k rows and its value heads' v and z rows in `in_proj_qkvz`, their β and α
/// rows in `in_proj_ba` (a GGUF file splits q, k, v and z, and keeps `ssm_ba`); Phi-3 keeps q, k
/// and v in `qkv_proj` (GGUF `attn_qkv`), Phi-3 and GLM-4 gate and up in `gate_up_proj` (GGUF
/// `ffn_up`).
fn projection_splits(c: &ModelConfig, naming: Naming) -> Vec<(String, String, Vec<usize>)> {
    if let Some(l) = &c.latent {
        // Each head's key rows, then its value rows, in `kv_b_proj` (GGUF `attn_kv_b`: files
        // from before llama.cpp's converter split it per head; later files hold the parts).
        let per = l.nope_dim + l.v_dim;
        let heads = 0..c.num_attention_heads;
        let keys: Vec<usize> = heads.clone().flat_map(|h| (0..l.nope_dim).map(move |d| h * per + d)).collect();
        let values: Vec<usize> = heads.flat_map(|h| (l.nope_dim..per).map(move |d| h * per + d)).collect();
        return (0..c.num_hidden_layers)
            .flat_map(|i| {
                let fused = match naming {
                    Naming::Hf => format!("model.layers.{i}.self_attn.kv_b_proj.weight"),
                    Naming::Gguf => format!("blk.{i}.attn_kv_b.weight"),
                };
                [
                    (name_of(Slot::AttnKB, Some(i), naming), fused.clone(), keys.clone()),
                    (name_of(Slot::AttnVB, Some(i), naming), fused, values.clone()),
                ]
            })
            .collect();
    }
    if c.arch.fused_qkv || c.arch.fused_gate_up {
        return fused_projections(c, naming);
    }
    let Some(a) = c.linear.as_ref().filter(|_| c.arch.fused_linear_projections) else { return Vec::new() };
    let (nk, dk, dv) = (a.key_heads, a.key_dim, a.value_dim);
    let per = a.value_heads / nk.max(1);
    let group = 2 * dk + 2 * per * dv;
    let part = |start: usize, len: usize, stride: usize| -> Vec<usize> {
        (0..nk).flat_map(|g| (0..len).map(move |i| g * stride + start + i)).collect()
    };
    let qkv = [part(0, dk, group), part(dk, dk, group), part(2 * dk, per * dv, group)].concat();
    let z = part(2 * dk + per * dv, per * dv, group);
    let (beta, alpha) = (part(0, per, 2 * per), part(per, per, 2 * per));
    let mut out = Vec::new();
    for l in (0..c.num_hidden_layers).filter(|&l| c.is_linear_layer(l)) {
        let name = |slot| name_of(slot, Some(l), naming);
        let (qkvz, ba) = match naming {
            Naming::Hf => (
                Some(format!("model.layers.{l}.linear_attn.in_proj_qkvz.weight")),
                format!("model.layers.{l}.linear_attn.in_proj_ba.weight"),
            ),
            Naming::Gguf => (None, format!("blk.{l}.ssm_ba.weight")),
        };
        if let Some(qkvz) = qkvz {
            out.push((name(Slot::LinQkv), qkvz.clone(), qkv.clone()));
            out.push((name(Slot::LinZ), qkvz, z.clone()));
        }
        out.push((name(Slot::LinBeta), ba.clone(), beta.clone()));
        out.push((name(Slot::LinAlpha), ba, alpha.clone()));
    }
    out
}

/// The fused projections of Phi-3 (q, k and v one after another in `qkv_proj`) and of Phi-3 and
/// GLM-4 (gate then up in `gate_up_proj`), as the family's flags say.
fn fused_projections(c: &ModelConfig, naming: Naming) -> Vec<(String, String, Vec<usize>)> {
    let (q, kv) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
    let ff = c.intermediate_size;
    let mut out = Vec::new();
    for l in 0..c.num_hidden_layers {
        let name = |slot| name_of(slot, Some(l), naming);
        let (qkv, gate_up) = match naming {
            Naming::Hf => (
                format!("model.layers.{l}.self_attn.qkv_proj.weight"),
                format!("model.layers.{l}.mlp.gate_up_proj.weight"),
            ),
            Naming::Gguf => (format!("blk.{l}.attn_qkv.weight"), format!("blk.{l}.ffn_up.weight")),
        };
        if c.arch.fused_qkv {
            out.push((name(Slot::AttnQ), qkv.clone(), (0..q).collect()));
            out.push((name(Slot::AttnK), qkv.clone(), (q..q + kv).collect()));
            out.push((name(Slot::AttnV), qkv, (q + kv..q + 2 * kv).collect()));
        }
        if c.arch.fused_gate_up {
            out.push((name(Slot::MlpGate), gate_up.clone(), (0..ff).collect()));
            out.push((name(Slot::MlpUp), gate_up, (ff..2 * ff).collect()));
        }
    }
    out
}

/// A checkpoint read with some tensors made of another's rows: a tensor's rows in another order
/// (`row_orders`), or part of a fused tensor (`split_rows`), which then is not listed itself.
pub struct Reordered {
    pub inner: Box<dyn TensorSource>,
    /// (the tensor, the stored tensor its rows come from, which: new row → stored row)
    pub orders: Vec<(String, String, Vec<usize>)>,
}

impl Reordered {
    fn find(&self, name: &str) -> Option<(&str, &[usize])> {
        self.orders.iter().find(|(n, _, _)| n == name).map(|(_, from, order)| (from.as_str(), order.as_slice()))
    }
}

impl TensorSource for Reordered {
    fn naming(&self) -> Naming {
        self.inner.naming()
    }
    fn names(&self) -> std::collections::BTreeSet<&str> {
        let stored = self.inner.names();
        let mut names = stored.clone();
        // A part of a fused tensor is listed where the fused one is, in its place (a part may
        // have the fused tensor's name: Phi-3's GGUF `ffn_up`, gate and up).
        for (name, from, _) in &self.orders {
            if name != from && stored.contains(from.as_str()) {
                names.remove(from.as_str());
            }
        }
        for (name, from, _) in &self.orders {
            if stored.contains(from.as_str()) {
                names.insert(name.as_str());
            }
        }
        names
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.find(name) {
            Some((from, order)) => {
                let mut shape = self.inner.shape(from)?;
                let (_, axis) = row_axis(&shape);
                *shape.get_mut(axis)? = order.len();
                Some(shape)
            }
            None => self.inner.shape(name),
        }
    }
    fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
        self.inner.stored(self.find(name).map_or(name, |(from, _)| from))
    }
    fn data(&self, name: &str, dtype: DType) -> Result<TensorData, LoadError> {
        match self.find(name) {
            Some((from, order)) => reorder_rows(name, self.inner.data(from, dtype)?, order),
            None => self.inner.data(name, dtype),
        }
    }
    /// A quantized matrix's rows move whole (a row is whole blocks).
    fn blocks(&self, name: &str) -> Option<(QuantType, std::borrow::Cow<'_, [u8]>)> {
        let Some((from, order)) = self.find(name) else { return self.inner.blocks(name) };
        let (q, bytes) = self.inner.blocks(from)?;
        let shape = self.inner.shape(from)?;
        let (groups, axis) = row_axis(&shape);
        let rows = *shape.get(axis)?;
        let row = bytes.len().checked_div(groups * rows)?;
        if row * groups * rows != bytes.len() || order.iter().any(|&r| r >= rows) {
            return None;
        }
        let moved = (0..groups)
            .flat_map(|g| order.iter().map(move |&r| g * rows + r))
            .flat_map(|r| &bytes[r * row..(r + 1) * row])
            .copied()
            .collect();
        Some((q, std::borrow::Cow::Owned(moved)))
    }
    fn done(&self, name: &str) {
        // A fused tensor is read more than once; it is released with the whole checkpoint.
        let fused = |stored: &str| self.orders.iter().any(|(n, from, _)| from == stored && n != from);
        match self.find(name) {
            Some((from, _)) if from != name || fused(from) => {}
            _ => self.inner.done(name),
        }
    }
}

/// A GGUF file's per-frequency rope divisors (llama.cpp writes Llama 3's scaling as this tensor).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// A GGUF file's LongRoPE factors (Phi-3's), past and within the original context.
pub const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
pub const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";

/// One decoder layer's weights. The projections that read the same input are stacked into one
/// matrix each (q, k, v; gate, up): one product per input instead of three or two, each streaming
/// a longer run of weight rows.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// The norm of the attention's input (none in OLMo 2).
    pub attn_norm: Option<RmsNorm>,
    /// q, k, v stacked (rows as `qkv_rows`): [(heads + 2 · kv_heads) · head_dim, hidden], with
    /// their biases if the family has them.
    pub qkv: Linear,
    /// Per-head norms of q and k (\[head_dim\] each), or norms over all their heads
    /// (`ModelConfig::whole_qk_norms`), applied before the rotary embedding.
    pub qk_norm: Option<[RmsNorm; 2]>,
    /// [hidden, heads · head_dim], with its bias if the family has one.
    pub o: Linear,
    /// The norm of the feed-forward's input (none in OLMo 2).
    pub mlp_norm: Option<RmsNorm>,
    /// The norms of the attention's and the feed-forward's outputs, before their residual sums
    /// (Gemma 2 and 3, OLMo 2).
    pub post_norms: Option<[RmsNorm; 2]>,
    pub ffn: Ffn,
    /// A linear-attention layer's token mixer (Qwen3.5): then `qkv` is its stacked input
    /// projection (q, k, v | z | β | α: `stacked_rows`), `o` its output projection, and
    /// `qk_norm` none.
    pub delta: Option<Box<DeltaNet>>,
    /// Each attention head's sink (gpt-oss).
    pub sinks: Option<Sinks>,
    /// Latent attention's own weights (DeepSeek's, GLM-4.7-Flash's): then `qkv` is the stacked
    /// query (`q_a_proj` or `q_proj`) and latent (`kv_a_proj_with_mqa`) projection, and `qk_norm`
    /// none.
    pub latent: Option<Box<LatentAttention>>,
}

impl LayerWeights {
    /// The attention's input as its products take it: normalised, or as it is (OLMo 2).
    pub fn attn_pre(&self) -> Pre<'_> {
        self.attn_norm.as_ref().map_or(Pre::Plain, RmsNorm::pre)
    }

    /// The feed-forward's input likewise.
    pub fn mlp_pre(&self) -> Pre<'_> {
        self.mlp_norm.as_ref().map_or(Pre::Plain, RmsNorm::pre)
    }
}

/// A layer's feed-forward block.
#[derive(Debug, Clone)]
pub enum Ffn {
    /// SwiGLU: gate, up stacked ([2 · intermediate, hidden]), then down.
    Dense(Box<Expert>),
    Moe(Box<Moe>),
}

impl Ffn {
    /// `x + ffn(norm(x))`: the layer's feed-forward and its residual connection, the norm and
    /// the sum fused into the products where their kernels can.
    ///
    /// # Shapes
    /// x: [n, hidden] → [n, hidden]
    pub fn forward_residual(&self, norm: Pre<'_>, x: Tensor<2>) -> Tensor<2> {
        self.forward_with(norm, x.clone(), Some(x))
    }

    /// `residual + ffn(norm(x))`, the norm and the sum fused into the products where their
    /// kernels can.
    ///
    /// # Shapes
    /// x: [n, hidden], residual: [n, hidden] → [n, hidden]
    pub fn forward_with(&self, norm: Pre<'_>, x: Tensor<2>, residual: Option<Tensor<2>>) -> Tensor<2> {
        match self {
            Ffn::Dense(mlp) => mlp.forward_with(x, norm, residual),
            Ffn::Moe(moe) => moe.forward_with(x, norm, residual),
        }
    }

    /// Every matrix it multiplies by.
    fn matrices(&self) -> Vec<&Weight> {
        fn expert(e: &Expert) -> [&Weight; 2] {
            [&e.gate_up.weight, &e.down.weight]
        }
        match self {
            Ffn::Dense(mlp) => expert(mlp).to_vec(),
            Ffn::Moe(moe) => {
                let shared = moe.shared.iter().flat_map(expert);
                moe.experts.iter().flat_map(expert).chain(shared).chain([&moe.router.weight]).collect()
            }
        }
    }
}

/// The rows of q, k and v in the stacked `qkv` matrix (and its bias), in load order, after the
/// output gate's rows where the family has one (`gate_rows`).
pub fn qkv_rows(c: &ModelConfig) -> [Range<usize>; 3] {
    let (q, kv) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
    [0..q, q..q + kv, q + kv..q + 2 * kv]
}

/// The output gate's rows, first in the stacked `qkv` (their `q_proj` rows loaded first:
/// `row_orders`); 0 without a gate.
pub fn gate_rows(c: &ModelConfig) -> usize {
    if c.attn_output_gate { c.num_attention_heads * c.head_dim } else { 0 }
}

/// The rows of a stacked matrix (or of its bias) that hold `slot`, for the slots that are stacked.
pub fn stacked_rows(c: &ModelConfig, slot: Slot) -> Option<Range<usize>> {
    let shift = |r: Range<usize>| r.start + gate_rows(c)..r.end + gate_rows(c);
    let [q, k, v] = qkv_rows(c).map(shift);
    let q = q.start - gate_rows(c)..q.end;
    let i = c.intermediate_size;
    if let Some(l) = &c.latent {
        let q_width = l.q_rank.unwrap_or(c.num_attention_heads * l.qk_dim());
        match slot {
            Slot::AttnQA | Slot::AttnQ => return Some(0..q_width),
            Slot::AttnKvA => return Some(q_width..q_width + l.kv_rank + l.rope_dim),
            _ => {}
        }
    }
    if let Some(a) = &c.linear {
        let (conv, values, heads) = (a.conv_dim(), a.value_heads * a.value_dim, a.value_heads);
        let at = |start: usize, len: usize| Some(start..start + len);
        match slot {
            Slot::LinQkv => return at(0, conv),
            Slot::LinZ => return at(conv, values),
            Slot::LinBeta => return at(conv + values, heads),
            Slot::LinAlpha => return at(conv + values + heads, heads),
            _ => {}
        }
    }
    match slot {
        Slot::AttnQ | Slot::AttnQBias => Some(q),
        Slot::AttnK | Slot::AttnKBias => Some(k),
        Slot::AttnV | Slot::AttnVBias => Some(v),
        Slot::MlpGate => Some(0..i),
        Slot::MlpUp => Some(i..2 * i),
        _ => None,
    }
}

/// All of a decoder's weights. With tied embeddings `lm_head` is `None`: the embedding is the head.
#[derive(Debug, Clone)]
pub struct Weights {
    /// [vocab, hidden]
    pub embed: Weight,
    pub norm: RmsNorm,
    /// [vocab, hidden]
    pub lm_head: Option<Weight>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// Loads every slot, each matrix kept as `dtype` decides for it; a matrix quantized at load
    /// has its columns weighted by `imatrix`'s entry for it, where it has one. Precondition:
    /// `check` passed.
    pub fn load(
        c: &ModelConfig,
        src: &dyn TensorSource,
        dtype: WeightDtype,
        imatrix: Option<&Imatrix>,
        device: &Device,
    ) -> Result<Self, LoadError> {
        let eps = c.rms_norm_eps;
        let naming = src.naming();
        let storage = |name: &str, slot: Slot, l: Option<usize>| {
            let stored = src.stored(name).and_then(Result::ok).unwrap_or(Stored::F32);
            let k = src.shape(name).and_then(|s| s.last().copied()).unwrap_or(0);
            slot.dtype(dtype, l, c).storage(name, stored, k, device)
        };
        // An importance matrix names matrices as GGUF files do, whatever the source's naming.
        let importance = |slot: Slot, l: Option<usize>| imatrix.and_then(|m| m.get(&name_of(slot, l, Naming::Gguf)));
        // The importances of layer l's experts' matrix `slot`, one expert after another: the
        // stacked matrix's, or each expert's (a matrix made on a file with one tensor per expert).
        let expert_importance = |slot: Slot, l: usize, experts: usize| -> Option<Cow<'_, [f32]>> {
            if let Some(all) = importance(slot, Some(l)) {
                return Some(Cow::Borrowed(all));
            }
            let name = |e: usize| split_experts::expert_tensor(slot, l, e).unwrap_or_default();
            imatrix?.per_expert(name, experts).map(Cow::Owned)
        };
        let named = |name: &str, slot: Slot, l: Option<usize>, importance: Option<&[f32]>| {
            load_matrix(src, name, storage(name, slot, l)?, importance, device)
        };
        let mat = |slot: Slot, l: Option<usize>| named(&name_of(slot, l, naming), slot, l, importance(slot, l));
        let vec = |slot: Slot, l: Option<usize>| load_f32::<1>(src, &name_of(slot, l, naming), device);
        let norm = |slot: Slot, l: Option<usize>| -> Result<RmsNorm, LoadError> {
            Ok(RmsNorm { weight: vec(slot, l)?.add_scalar(c.norm_offset()), eps })
        };
        // A small tensor's values on the host (the linear attention's).
        let host_named = |name: String| -> Result<Vec<f32>, LoadError> {
            let data = src.data(&name, DType::F32)?.try_into_vec::<f32>();
            src.done(&name);
            data.map_err(|e| LoadError::Tensor { name, reason: format!("reading values: {e:?}") })
        };
        let host = |slot: Slot, l: Option<usize>| host_named(name_of(slot, l, naming));
        let linear = |slot: Slot, bias: Slot, l: Option<usize>| -> Result<Linear, LoadError> {
            Ok(Linear { weight: mat(slot, l)?, bias: bias.present(c).then(|| vec(bias, l)).transpose()? })
        };
        // Matrices stacked in the order of `stacked_rows`, and their biases if they have them.
        let stacked = |slots: &[Slot], biases: &[Slot], l: Option<usize>| -> Result<Linear, LoadError> {
            let weights = slots.iter().map(|&s| mat(s, l)).collect::<Result<Vec<_>, _>>()?;
            let biases = biases.iter().filter(|s| s.present(c)).map(|&s| vec(s, l)).collect::<Result<Vec<_>, _>>()?;
            Ok(Linear { weight: linear::stack(weights), bias: (!biases.is_empty()).then(|| Tensor::cat(biases, 0)) })
        };
        let layers = (0..c.num_hidden_layers)
            .map(|layer| {
                let l = Some(layer);
                let attn_norm = c.input_norms.then(|| norm(Slot::AttnNorm, l)).transpose()?;
                let (qkv, qk_norm, o, delta) = match c.linear.as_ref().filter(|_| c.is_linear_layer(layer)) {
                    Some(a) => {
                        let qkv = stacked(&[Slot::LinQkv, Slot::LinZ, Slot::LinBeta, Slot::LinAlpha], &[], l)?;
                        let delta = DeltaNet {
                            key_heads: a.key_heads,
                            value_heads: a.value_heads,
                            key_dim: a.key_dim,
                            value_dim: a.value_dim,
                            kernel: a.conv_kernel,
                            tiled: a.gguf_layout && c.arch.gguf_tiled_value_heads,
                            conv: host(Slot::LinConv, l)?,
                            dt_bias: host(Slot::LinDtBias, l)?,
                            decay_rate: decay_rate(a, host(Slot::LinALog, l)?),
                            norm: host(Slot::LinNorm, l)?,
                            eps: eps as f32,
                        };
                        let o = Linear { weight: mat(Slot::LinOut, l)?, bias: None };
                        (qkv, None, o, Some(Box::new(delta)))
                    }
                    None if c.latent.is_some() => {
                        let query = if Slot::AttnQA.present(c) { Slot::AttnQA } else { Slot::AttnQ };
                        let qkv = stacked(&[query, Slot::AttnKvA], &[], l)?;
                        (qkv, None, linear(Slot::AttnO, Slot::AttnOBias, l)?, None)
                    }
                    None => {
                        let qkv = stacked(
                            &[Slot::AttnQ, Slot::AttnK, Slot::AttnV],
                            &[Slot::AttnQBias, Slot::AttnKBias, Slot::AttnVBias],
                            l,
                        )?;
                        let qk_norm = c
                            .qk_norm
                            .then(|| Ok::<_, LoadError>([norm(Slot::AttnQNorm, l)?, norm(Slot::AttnKNorm, l)?]))
                            .transpose()?;
                        (qkv, qk_norm, linear(Slot::AttnO, Slot::AttnOBias, l)?, None)
                    }
                };
                let sinks = Slot::AttnSinks
                    .present_in(c, layer)
                    .then(|| Ok::<_, LoadError>(Sinks::new(host(Slot::AttnSinks, l)?, device)))
                    .transpose()?;
                let post_norms = c
                    .sandwich_norms
                    .then(|| Ok::<_, LoadError>([norm(Slot::PostAttnNorm, l)?, norm(Slot::PostFfnNorm, l)?]))
                    .transpose()?;
                let latent = match &c.latent {
                    None => None,
                    Some(a) => {
                        let heads = c.num_attention_heads;
                        // Each head's product: a GGUF file's as stored per head (quantized where
                        // it is, as its other matrices); rows of `kv_b_proj` (a checkpoint's, an
                        // older GGUF file's `attn_kv_b`) dense, the key rows transposed.
                        let head_products = |slot: Slot, dense: &dyn Fn(TensorData) -> Vec<Linear>| {
                            let name = name_of(slot, l, naming);
                            let per_head = src.shape(&name).is_some_and(|s| s.len() == 3);
                            let linears = match per_head {
                                true => load_experts(src, &name, storage(&name, slot, l)?, None, device)?
                                    .into_iter()
                                    .map(|weight| Linear { weight, bias: None })
                                    .collect(),
                                false => dense(src.data(&name, DType::F32)?),
                            };
                            src.done(&name);
                            Ok::<Vec<Linear>, LoadError>(linears)
                        };
                        // The low-rank norms keep their module's default epsilon whatever the
                        // config's (transformers' `RMSNorm(q_lora_rank)`, `RMSNorm(kv_lora_rank)`).
                        let rank_norm = |slot: Slot| -> Result<RmsNorm, LoadError> {
                            Ok(RmsNorm { eps: LatentAttention::NORM_EPS, ..norm(slot, l)? })
                        };
                        let q_b = match Slot::AttnQB.present(c) {
                            true => Some((
                                rank_norm(Slot::AttnQANorm)?,
                                Linear { weight: mat(Slot::AttnQB, l)?, bias: None },
                            )),
                            false => None,
                        };
                        Some(Box::new(LatentAttention {
                            q_b,
                            kv_norm: rank_norm(Slot::AttnKvANorm)?,
                            k_b: head_products(Slot::AttnKB, &|data| {
                                LatentAttention::key_heads(data, heads, a.nope_dim, a.kv_rank, device)
                            })?,
                            v_b: head_products(Slot::AttnVB, &|data| {
                                LatentAttention::value_heads(data, heads, a.v_dim, a.kv_rank, device)
                            })?,
                            heads,
                            nope: a.nope_dim,
                            rope: a.rope_dim,
                            kv_rank: a.kv_rank,
                            v: a.v_dim,
                        }))
                    }
                };
                Ok(LayerWeights {
                    attn_norm,
                    qkv,
                    qk_norm,
                    o,
                    delta,
                    sinks,
                    latent,
                    mlp_norm: c.input_norms.then(|| norm(Slot::MlpNorm, l)).transpose()?,
                    post_norms,
                    ffn: match c.moe.as_ref().filter(|_| c.is_moe_layer(layer)) {
                        None => Ffn::Dense(Box::new(Expert {
                            gate_up: stacked(&[Slot::MlpGate, Slot::MlpUp], &[], l)?,
                            down: Linear { weight: mat(Slot::MlpDown, l)?, bias: None },
                            activation: c.activation,
                        })),
                        Some(m) => {
                            let l = layer;
                            // Each expert's gate, up and down, as stored: one matrix per expert, or
                            // one 3-D tensor of all of them.
                            let experts = |slot: Slot| -> Result<Vec<Weight>, LoadError> {
                                match naming {
                                    Naming::Hf => {
                                        // The importances of all the experts, one after another.
                                        let all = expert_importance(slot, l, m.experts);
                                        let all = all.as_deref();
                                        let per = all.map_or(0, |a| a.len() / m.experts);
                                        let of = |e: usize| {
                                            all.map(|a| {
                                                if per * m.experts == a.len() { &a[e * per..(e + 1) * per] } else { a }
                                            })
                                        };
                                        (0..m.experts)
                                            .map(|e| named(&expert_name(slot, l, e), slot, Some(l), of(e)))
                                            .collect()
                                    }
                                    Naming::Gguf => {
                                        let name = name_of(slot, Some(l), naming);
                                        let storage = storage(&name, slot, Some(l))?;
                                        let all = expert_importance(slot, l, m.experts);
                                        load_experts(src, &name, storage, all.as_deref(), device)
                                    }
                                }
                            };
                            let (gates, ups, downs) =
                                (experts(Slot::ExpertGate)?, experts(Slot::ExpertUp)?, experts(Slot::ExpertDown)?);
                            // Each expert's biases (gpt-oss's), as stored: one vector per expert, or
                            // one [experts, width] tensor of all of them.
                            let biases = |slot: Slot| -> Result<Vec<Option<Vec<f32>>>, LoadError> {
                                if !slot.present(c) {
                                    return Ok(vec![None; m.experts]);
                                }
                                match naming {
                                    Naming::Hf => {
                                        (0..m.experts).map(|e| host_named(expert_name(slot, l, e)).map(Some)).collect()
                                    }
                                    Naming::Gguf => {
                                        let all = host(slot, Some(l))?;
                                        let per = all.len() / m.experts.max(1);
                                        Ok(all.chunks_exact(per.max(1)).map(|b| Some(b.to_vec())).collect())
                                    }
                                }
                            };
                            let (gate_b, up_b, down_b) = (
                                biases(Slot::ExpertGateBias)?,
                                biases(Slot::ExpertUpBias)?,
                                biases(Slot::ExpertDownBias)?,
                            );
                            let bias = |values: Vec<f32>| {
                                let len = values.len();
                                Tensor::<1>::from_data(TensorData::new(values, [len]), (device, DType::F32))
                            };
                            let experts = gates
                                .into_iter()
                                .zip(ups)
                                .zip(downs)
                                .zip(gate_b.into_iter().zip(up_b).zip(down_b))
                                .map(|(((gate, up), down), ((gate_b, up_b), down_b))| Expert {
                                    gate_up: Linear {
                                        weight: linear::stack(vec![gate, up]),
                                        bias: gate_b.zip(up_b).map(|(g, u)| bias([g, u].concat())),
                                    },
                                    down: Linear { weight: down, bias: down_b.map(bias) },
                                    activation: c.activation,
                                })
                                .collect();
                            // On a GPU, stacked for routing there.
                            let (experts, stacks) = ExpertStacks::build(experts);
                            // The routers are small: kept dense in f32 (llama.cpp never quantizes them),
                            // the shared expert's gate's row after the router's (one product).
                            let mut routers = vec![Slot::MoeRouter];
                            routers.extend(Slot::SharedRouter.present(c).then_some(Slot::SharedRouter));
                            let mut values = Vec::with_capacity((m.experts + 1) * c.hidden_size);
                            for &slot in &routers {
                                values.extend(host(slot, Some(l))?);
                            }
                            let rows = values.len() / c.hidden_size;
                            let router = TensorData::new(values, [rows, c.hidden_size]);
                            let shared = match m.shared_intermediate_size {
                                None => None,
                                Some(_) => Some(Expert {
                                    gate_up: stacked(&[Slot::SharedGate, Slot::SharedUp], &[], Some(l))?,
                                    down: Linear { weight: mat(Slot::SharedDown, Some(l))?, bias: None },
                                    activation: Activation::Silu,
                                }),
                            };
                            let router_bias = Slot::MoeRouterBias
                                .present(c)
                                .then(|| load_f32::<1>(src, &name_of(Slot::MoeRouterBias, Some(l), naming), device))
                                .transpose()?;
                            Ffn::Moe(Box::new(Moe {
                                router: Linear {
                                    weight: linear::dense(Tensor::from_data(router, (device, DType::F32))),
                                    bias: router_bias,
                                },
                                experts,
                                top_k: m.experts_per_token,
                                norm_topk_prob: m.norm_topk_prob,
                                choice: match m.routing {
                                    Routing::Softmax => Choice::Softmax,
                                    Routing::Sigmoid { groups, groups_used } => Choice::Sigmoid {
                                        bias: host(Slot::MoeChoiceBias, Some(l))?,
                                        groups,
                                        groups_used,
                                    },
                                },
                                routed_scale: m.routed_scale,
                                shared,
                                shared_gated: m.shared_gated,
                                stacks,
                            }))
                        }
                    },
                })
            })
            .collect::<Result<Vec<_>, LoadError>>()?;
        let weights = Self {
            embed: mat(Slot::InEmbed, None)?,
            norm: norm(Slot::OutNorm, None)?,
            lm_head: (!c.tie_word_embeddings).then(|| mat(Slot::OutEmbed, None)).transpose()?,
            layers,
        };
        if let Some(unmatched) = imatrix.map(|m| unmatched(c, m)).filter(|u| !u.is_empty()) {
            tracing::warn!(
                unmatched = unmatched.len(),
                entries = imatrix.map_or(0, Imatrix::len),
                first = %unmatched.iter().take(4).copied().collect::<Vec<_>>().join(", "),
                "importance-matrix entries that name no matrix of this model, unused (was it made for another model?)"
            );
        }
        Ok(weights)
    }

    /// Every matrix.
    fn all(&self) -> impl Iterator<Item = &Weight> {
        let layers = self.layers.iter().flat_map(|l| {
            let latent = l.latent.iter().flat_map(|a| {
                let heads = a.k_b.iter().chain(&a.v_b).map(|p| &p.weight);
                a.q_b.iter().map(|(_, q_b)| &q_b.weight).chain(heads)
            });
            [&l.qkv.weight, &l.o.weight].into_iter().chain(latent).chain(l.ffn.matrices())
        });
        std::iter::once(&self.embed).chain(self.lm_head.as_ref()).chain(layers)
    }

    /// Whether a matrix is kept in quantized blocks on a GPU (whose products of many rows
    /// dequantize it each time).
    pub fn blocks_on_device(&self) -> bool {
        self.all().any(|w| matches!(w.matrix(), linear::Matrix::Blocks(..)))
    }

    /// How the matrices are kept, for logs: `bf16`, or `Q5_0+Q8_0 …` by distinct kind.
    pub fn describe(&self) -> String {
        let mut kinds: Vec<String> = Vec::new();
        for w in self.all() {
            for kind in w.describe().split('+') {
                if !kinds.iter().any(|k| k == kind) {
                    kinds.push(kind.to_string());
                }
            }
        }
        kinds.join(", ")
    }

    /// Bytes held by the weight matrices.
    pub fn matrix_bytes(&self) -> usize {
        self.all().map(|w| w.size_bytes()).sum()
    }

    /// Puts `data` into `slot` of `layer`, releasing the old tensor (or, for a stacked slot,
    /// overwriting its rows of the stacked matrix). A matrix keeps its kind: dense in its dtype,
    /// or quantized to its format.
    /// Precondition: the shape was checked against the config; not a MoE slot (`replace_moe`).
    pub fn replace(&mut self, c: &ModelConfig, slot: Slot, layer: Option<usize>, data: TensorData, device: &Device) {
        let vec = || Tensor::<1>::from_data(data.clone(), (device, DType::F32));
        let Some(l) = layer else {
            match slot {
                Slot::InEmbed => self.embed = linear::like(&self.embed, data, device),
                Slot::OutNorm => self.norm.weight = vec().add_scalar(c.norm_offset()),
                _ => {
                    let like = self.lm_head.as_ref().unwrap_or(&self.embed);
                    self.lm_head = Some(linear::like(like, data, device));
                }
            }
            return;
        };
        let w = &mut self.layers[l];
        if let Some(rows) = stacked_rows(c, slot) {
            match slot {
                // `qkv` is loaded with its biases, so the bias is always there to write into.
                Slot::AttnQBias | Slot::AttnKBias | Slot::AttnVBias => {
                    w.qkv.bias = w.qkv.bias.take().map(|b| b.slice_assign([rows], vec()));
                }
                Slot::LinQkv | Slot::LinZ | Slot::LinBeta | Slot::LinAlpha => {
                    w.qkv.weight = linear::replace_rows(&w.qkv.weight, rows, data, device)
                }
                Slot::MlpGate | Slot::MlpUp => {
                    if let Ffn::Dense(mlp) = &mut w.ffn {
                        mlp.gate_up.weight = linear::replace_rows(&mlp.gate_up.weight, rows, data, device);
                    }
                }
                _ => w.qkv.weight = linear::replace_rows(&w.qkv.weight, rows, data, device),
            }
            return;
        }
        let host = || data.clone().convert::<f32>().try_into_vec::<f32>().unwrap_or_default();
        if let Some(delta) = &mut w.delta {
            match slot {
                Slot::LinConv => delta.conv = host(),
                Slot::LinDtBias => delta.dt_bias = host(),
                Slot::LinALog => {
                    if let Some(a) = &c.linear {
                        delta.decay_rate = decay_rate(a, host());
                    }
                }
                Slot::LinNorm => delta.norm = host(),
                _ => {}
            }
        }
        let centre = c.norm_offset();
        if let (Some(latent), Some(a)) = (&mut w.latent, &c.latent) {
            let heads = c.num_attention_heads;
            match slot {
                Slot::AttnQANorm | Slot::AttnQB => {
                    if let Some((norm, q_b)) = &mut latent.q_b {
                        match slot {
                            Slot::AttnQB => q_b.weight = linear::like(&q_b.weight, data.clone(), device),
                            _ => norm.weight = vec().add_scalar(centre),
                        }
                    }
                }
                Slot::AttnKvANorm => latent.kv_norm.weight = vec().add_scalar(centre),
                Slot::AttnKB => {
                    latent.k_b = LatentAttention::key_heads(data.clone(), heads, a.nope_dim, a.kv_rank, device)
                }
                Slot::AttnVB => {
                    latent.v_b = LatentAttention::value_heads(data.clone(), heads, a.v_dim, a.kv_rank, device)
                }
                _ => {}
            }
        }
        match slot {
            Slot::LinOut => w.o.weight = linear::like(&w.o.weight, data, device),
            Slot::AttnNorm => {
                if let Some(norm) = &mut w.attn_norm {
                    norm.weight = vec().add_scalar(centre);
                }
            }
            Slot::AttnO => w.o.weight = linear::like(&w.o.weight, data, device),
            Slot::AttnOBias => w.o.bias = Some(vec()),
            Slot::AttnSinks => w.sinks = Some(Sinks::new(host(), device)),
            Slot::MlpNorm => {
                if let Some(norm) = &mut w.mlp_norm {
                    norm.weight = vec().add_scalar(centre);
                }
            }
            Slot::PostAttnNorm | Slot::PostFfnNorm => {
                if let Some(norms) = &mut w.post_norms {
                    norms[usize::from(slot == Slot::PostFfnNorm)].weight = vec().add_scalar(centre);
                }
            }
            Slot::AttnQNorm | Slot::AttnKNorm => {
                if let Some(norms) = &mut w.qk_norm {
                    norms[usize::from(slot == Slot::AttnKNorm)].weight = vec().add_scalar(centre);
                }
            }
            Slot::MlpDown => {
                if let Ffn::Dense(mlp) = &mut w.ffn {
                    mlp.down.weight = linear::like(&mlp.down.weight, data, device);
                }
            }
            // A mixture of experts' slots: `replace_moe`.
            _ => {}
        }
    }

    /// Puts `data` ([rows, cols] as `Slot::shape` says) into a mixture-of-experts slot of
    /// `layer`: its router, its shared expert, or expert `expert`'s matrix (gate and up rows of
    /// the stacked gate/up). On a GPU whose kernels route the layer, an expert's matrix is
    /// written into its rows of the layer's stacks, in place ([`ExpertStacks::with_rows`]); where
    /// the stacks cannot take it (blocks of a K-quant format) they are dropped, and the layer
    /// routes on the host until [`Self::restack_moe`]. Precondition: the shape was checked.
    pub fn replace_moe(
        &mut self,
        c: &ModelConfig,
        slot: Slot,
        layer: usize,
        expert: usize,
        data: TensorData,
        device: &Device,
    ) {
        let Ffn::Moe(moe) = &mut self.layers[layer].ffn else { return };
        let width = c.moe.as_ref().map_or(0, |m| m.intermediate_size);
        let vec = || Tensor::<1>::from_data(data.clone(), (device, DType::F32));
        let in_stack = match slot {
            Slot::ExpertGate => Some((false, 2 * width * expert..2 * width * expert + width)),
            Slot::ExpertUp => Some((false, 2 * width * expert + width..2 * width * (expert + 1))),
            Slot::ExpertDown => Some((true, c.hidden_size * expert..c.hidden_size * (expert + 1))),
            _ => None,
        };
        if let Some((down, rows)) = in_stack.filter(|_| expert < moe.experts.len())
            && let Some(stacks) = moe.stacks.take()
        {
            // The experts' views let go of the stacks first, so the rows are written in place.
            let experts = std::mem::take(&mut moe.experts).len();
            match stacks.with_rows(down, rows, data.clone(), device) {
                Ok(stacks) => {
                    moe.experts = stacks.views(experts);
                    moe.stacks = Some(stacks);
                    return;
                }
                // Rows the stack cannot take (a K-quant's): the expert's own matrix changes
                // below, and the layer routes on the host until `restack_moe` stacks it.
                Err(stacks) => moe.experts = stacks.views(experts),
            }
        }
        let shared = shared_width(c);
        let gate_up = |e: &mut Expert, rows: Range<usize>, data| {
            e.gate_up.weight = linear::replace_rows(&e.gate_up.weight, rows, data, device);
        };
        match (slot, moe.experts.get_mut(expert), moe.shared.as_mut()) {
            (Slot::MoeRouter, _, _) => {
                moe.router.weight = linear::replace_rows(&moe.router.weight, 0..moe.experts.len(), data, device);
            }
            (Slot::ExpertGate, Some(e), _) => gate_up(e, 0..width, data),
            (Slot::ExpertUp, Some(e), _) => gate_up(e, width..2 * width, data),
            (Slot::ExpertDown, Some(e), _) => e.down.weight = linear::like(&e.down.weight, data, device),
            (Slot::MoeRouterBias, _, _) => moe.router.bias = Some(vec()),
            (Slot::MoeChoiceBias, _, _) => {
                if let (Choice::Sigmoid { bias, .. }, Ok(values)) =
                    (&mut moe.choice, data.clone().convert::<f32>().try_into_vec::<f32>())
                {
                    *bias = values;
                }
            }
            (Slot::ExpertGateBias | Slot::ExpertUpBias, Some(e), _) => {
                let rows = if slot == Slot::ExpertGateBias { 0..width } else { width..2 * width };
                e.gate_up.bias = e.gate_up.bias.take().map(|b| b.slice_assign([rows], vec()));
            }
            (Slot::ExpertDownBias, Some(e), _) => e.down.bias = Some(vec()),
            (Slot::SharedGate, _, Some(s)) => gate_up(s, 0..shared, data),
            (Slot::SharedUp, _, Some(s)) => gate_up(s, shared..2 * shared, data),
            (Slot::SharedDown, _, Some(s)) => s.down.weight = linear::like(&s.down.weight, data, device),
            (Slot::SharedRouter, _, Some(_)) => {
                let row = moe.experts.len();
                moe.router.weight = linear::replace_rows(&moe.router.weight, row..row + 1, data, device);
            }
            _ => {}
        }
    }

    /// Stacks layer `layer`'s experts again where [`Self::replace_moe`] dropped the stacks (all
    /// of them: a copy of the layer's experts), so a GPU routes them on the device again where
    /// they still share one storage.
    pub fn restack_moe(&mut self, layer: usize) {
        let Ffn::Moe(moe) = &mut self.layers[layer].ffn else { return };
        if moe.stacks.is_none() {
            let (experts, stacks) = ExpertStacks::build(std::mem::take(&mut moe.experts));
            (moe.experts, moe.stacks) = (experts, stacks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partial rotary embedding's pairs land half a head apart; a full one keeps the order.
    #[test]
    fn the_rotary_order_puts_each_pair_half_a_head_apart() {
        assert_eq!(rotary_order(8, 8, false), (0..8).collect::<Vec<_>>());
        // Rotary over 4 of 8: pairs (0, 2) and (1, 3) go to (0, 4) and (1, 5); 4..8 fill the rest.
        assert_eq!(rotary_order(8, 4, false), vec![0, 1, 4, 5, 2, 3, 6, 7]);
        // Interleaved (GLM-4's): pairs (0, 1) and (2, 3) go to (0, 4) and (1, 5).
        assert_eq!(rotary_order(8, 4, true), vec![0, 2, 4, 5, 1, 3, 6, 7]);
        assert_eq!(rotary_order(4, 4, true), vec![0, 2, 1, 3]);
        for interleaved in [false, true] {
            let mut sorted = rotary_order(32, 8, interleaved);
            sorted.sort();
            assert_eq!(sorted, (0..32).collect::<Vec<_>>(), "a permutation");
        }
    }

    /// An importance matrix's entries that name no matrix of the model are the ones reported:
    /// names of stacked experts and of experts one tensor each are the model's, another
    /// layer's or matrix's are not.
    #[test]
    fn the_importance_entries_reported_unused_are_those_naming_no_matrix() {
        let c = config("mixtral", r#","num_local_experts":4,"num_experts_per_tok":2"#);
        let names = [
            "blk.0.attn_q.weight",
            "blk.1.ffn_up_exps.weight",
            "blk.1.ffn_down.3.weight",
            "blk.1.ffn_down.4.weight",
            "blk.24.attn_q.weight",
            "blk.0.attn_qkv.weight",
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("imatrix.dat");
        std::fs::write(&path, llaisys_tests::imatrix_dat(&names.map(|n| (n, 1, [1.0])))).unwrap();
        let imatrix = Imatrix::open(&path).unwrap();
        assert_eq!(
            unmatched(&c, &imatrix),
            ["blk.0.attn_qkv.weight", "blk.1.ffn_down.4.weight", "blk.24.attn_q.weight"]
        );
    }

    fn config(model_type: &str, extra: &str) -> ModelConfig {
        ModelConfig::from_json_str(&format!(
            r#"{{"model_type":"{model_type}","hidden_size":64,"num_hidden_layers":24,"num_attention_heads":4,
            "intermediate_size":8,"vocab_size":8,"max_position_embeddings":256{extra}}}"#
        ))
        .unwrap()
    }

    /// `q4_k_m` gives each matrix of a 24-layer model the type llama-quantize (the peer's
    /// llama.cpp) gave the demo model's F16 GGUF for `Q4_K_M`, before its row fallbacks: Q6_K for
    /// the value and down projections of layers 0-2, 5, 8, ..., 20-23 and for the output head
    /// (the embedding where tied), Q4_K elsewhere; eight experts move k and v to Q8_0 and the
    /// output projection to Q5_K; `q5_k_m` has Q5_K for a base.
    #[test]
    fn a_k_quant_mix_chooses_each_matrix_as_llama_quantize_does() {
        let (q4, q5, q6) = (QuantType::Q4K, QuantType::Q5K, QuantType::Q6K);
        let more_bits = [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23];
        let dense = config("qwen2", r#","tie_word_embeddings":false"#);
        for l in 0..24 {
            let sensitive = if more_bits.contains(&l) { q6 } else { q4 };
            for slot in [Slot::AttnV, Slot::MlpDown] {
                assert_eq!(slot.mixed(q4, Some(l), &dense), sensitive, "{slot:?} of layer {l}");
            }
            for slot in [Slot::AttnQ, Slot::AttnK, Slot::AttnO, Slot::MlpGate, Slot::MlpUp] {
                assert_eq!(slot.mixed(q4, Some(l), &dense), q4, "{slot:?} of layer {l}");
            }
            let sensitive = if more_bits.contains(&l) { q6 } else { q5 };
            assert_eq!(Slot::AttnV.mixed(q5, Some(l), &dense), sensitive);
        }
        assert_eq!(Slot::OutEmbed.mixed(q4, None, &dense), q6);
        assert_eq!(Slot::InEmbed.mixed(q4, None, &dense), q4);
        let tied = config("qwen2", r#","tie_word_embeddings":true"#);
        assert_eq!(Slot::InEmbed.mixed(q4, None, &tied), q6, "a tied embedding is the output head");

        let moe = config("qwen3_moe", r#","num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":8"#);
        assert_eq!(Slot::AttnK.mixed(q4, Some(3), &moe), QuantType::Q8_0);
        assert_eq!(Slot::AttnV.mixed(q4, Some(0), &moe), QuantType::Q8_0);
        assert_eq!(Slot::AttnO.mixed(q4, Some(3), &moe), q5);
        assert_eq!(Slot::ExpertDown.mixed(q4, Some(0), &moe), q6);
        assert_eq!(Slot::ExpertDown.mixed(q4, Some(3), &moe), q4);
        assert_eq!(Slot::ExpertGate.mixed(q4, Some(0), &moe), q4);

        // Q3_K_M (checked against llama-quantize's Q3_K_M of the demo model's F16: ffn_down Q5_K in
        // layer 0 and Q4_K after, attn_v Q5_K in layers 0-1 and Q4_K after, attn_output Q4_K,
        // before the 896-wide rows' fallbacks).
        let q3 = QuantType::Q3K;
        for l in 0..24 {
            let first = |n: usize, hi: QuantType| if l < n { hi } else { q4 };
            assert_eq!(Slot::MlpDown.mixed(q3, Some(l), &dense), first(1, q5), "ffn_down of layer {l}");
            assert_eq!(Slot::AttnV.mixed(q3, Some(l), &dense), first(2, q5), "attn_v of layer {l}");
            assert_eq!(Slot::AttnO.mixed(q3, Some(l), &dense), q4);
            for slot in [Slot::AttnQ, Slot::AttnK, Slot::MlpGate, Slot::MlpUp] {
                assert_eq!(slot.mixed(q3, Some(l), &dense), q3, "{slot:?} of layer {l}");
            }
        }
        assert_eq!(Slot::OutEmbed.mixed(q3, None, &dense), q6);
        assert_eq!(Slot::AttnO.mixed(q3, Some(3), &moe), q5);
        assert_eq!(Slot::AttnK.mixed(q3, Some(3), &moe), QuantType::Q8_0);
        assert_eq!("q3_k_m".parse::<WeightDtype>().unwrap(), WeightDtype::Mixed(q3));

        let dtype: WeightDtype = "Q4_K_M".parse().unwrap();
        assert_eq!(dtype, WeightDtype::Mixed(q4));
        assert_eq!(dtype.to_string(), "q4_k_m");
        assert_eq!(Slot::MlpDown.dtype(dtype, Some(0), &dense), WeightDtype::Quant(q6));
        assert_eq!(Slot::MlpDown.dtype(WeightDtype::Bf16, Some(0), &dense), WeightDtype::Bf16);
    }
}
