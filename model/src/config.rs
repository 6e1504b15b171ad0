//! C1: the Hugging Face `config.json` of a checkpoint of a family the decoder serves
//! (`crate::arch`), validated before anything is allocated. Every error names the offending field.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::arch::{self, Architecture, Bias, Shared};
use crate::error::LoadError;
use crate::lm::Pooling;

/// The element type of a checkpoint's tensors (`torch_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointDtype {
    F32,
    F16,
    Bf16,
}

/// How the rotary embedding's frequencies are stretched for contexts longer than training's
/// (`rope_scaling`, or `rope_parameters` in transformers ≥ 5).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Every frequency divided by `factor` (positions interpolated).
    Linear {
        factor: f64,
    },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, a smooth blend between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// YaRN: frequencies blended between interpolated and kept by a ramp over the dimensions,
    /// cos and sin scaled by `attention_factor` (0.1 · ln(factor) + 1 when not given).
    Yarn {
        factor: f64,
        /// `None`: the config's `max_position_embeddings`.
        original_max_position_embeddings: Option<usize>,
        attention_factor: Option<f64>,
        beta_fast: f64,
        beta_slow: f64,
        /// The ramp's ends are rounded to whole dimensions (transformers' `truncate`, true but for
        /// gpt-oss; llama.cpp always rounds).
        truncate: bool,
    },
    /// Each frequency divided by its own factor: a GGUF file's `rope_freqs.weight` (llama.cpp
    /// writes Llama 3's scaling this way), \[head_dim / 2\].
    Factors(Vec<f32>),
    /// LongRoPE (Phi-3's `longrope`): each frequency divided by its own factor, `short` while a
    /// pass stays within `original` positions, `long` once it reaches past them (transformers'
    /// rule, by the pass's last position), \[rotary_dim / 2\] each; cos and sin scaled by
    /// `attention_factor` (√(1 + ln(factor) / ln(original)) when not given).
    LongRope {
        short: Vec<f32>,
        long: Vec<f32>,
        original: usize,
        attention_factor: f64,
    },
}

/// YaRN's attention factor for stretch `factor` with multiplier `mscale` (transformers'
/// `get_mscale`): 0.1 · mscale · ln(factor) + 1, 1 for a factor of at most 1. With multiplier 1
/// it is the factor a config that gives none gets.
pub fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 { 1.0 } else { 0.1 * mscale * factor.ln() + 1.0 }
}

/// Llama 4's attention temperature (Ministral 3's `llama_4_scaling_beta`): each query, after the
/// M-RoPE: each rotated pair turned by one of three position streams (temporal, height, width).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MRope {
    /// Pairs per stream: the first `t` pairs temporal, the next `h` height, the last `w` width
    /// (Qwen2-VL's); interleaved, pair `i` is height's where `i % 3 == 1` and `i < 3h`,
    /// width's where `i % 3 == 2` and `i < 3w`, else temporal (Qwen3-VL's).
    pub sections: [usize; 3],
    pub interleaved: bool,
}

impl MRope {
    /// The stream (0 temporal, 1 height, 2 width) that turns pair `i`.
    pub fn stream(&self, i: usize) -> usize {
        let [t, h, w] = self.sections;
        match self.interleaved {
            false if i < t => 0,
            false if i < t + h => 1,
            false => 2,
            true if i % 3 == 1 && i < 3 * h => 1,
            true if i % 3 == 2 && i < 3 * w => 2,
            true => 0,
        }
    }
}

/// rotary embedding, multiplied by 1 + β · ln(1 + ⌊position / original⌋): 1 below `original`
/// (the YaRN scaling's `original_max_position_embeddings`), more the further past it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryScaling {
    pub beta: f64,
    pub original: usize,
}

impl QueryScaling {
    /// The factor at `position`, in transformers' f32 arithmetic.
    pub fn at(&self, position: crate::kv::Pos) -> f32 {
        let steps = (position.max(0) as f32 / self.original as f32).floor();
        1.0 + self.beta as f32 * (1.0 + steps).ln()
    }
}

/// The feed-forward's gate: `act(gate) · up` (`hidden_act`; Gemma's `hidden_activation`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up` (`silu`).
    Silu,
    /// GeGLU with GELU's tanh approximation (`gelu_pytorch_tanh`, Gemma's).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: with g = min(gate, limit) and u = clamp(up, −limit, limit),
    /// `g · σ(alpha · g) · (u + 1)` (`swiglu_alpha`, `swiglu_limit`).
    ClampedSwiglu { alpha: f32, limit: f32 },
}

impl Activation {
    /// The config's name for it.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "silu" | "swish" => Some(Self::Silu),
            "gelu_pytorch_tanh" | "gelu_tanh" => Some(Self::GeluTanh),
            _ => None,
        }
    }
}

/// Local layers (Gemma's, gpt-oss's): attention over the last `window` positions only (a token
/// sees the keys of positions p with `pos − window < p ≤ pos`).
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// Per layer: whether it is a local layer.
    pub layers: Vec<bool>,
    /// The local layers' own rotary base, unscaled (Gemma 3's `rope_local_base_freq`); `None`:
    /// they rotate as the global layers do.
    pub rope_theta: Option<f64>,
}

/// How a mixture of experts' router scores and chooses its experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// A softmax over the router's logits: the top-k by probability, weighed by it.
    Softmax,
    /// A sigmoid of each logit: the top-k by score plus the layer's selection bias, among the
    /// experts of the best `groups_used` of `groups` equal groups (a group ranked by the sum of
    /// its two best biased scores), weighed by their scores (DeepSeek V3's, GLM-4.5's: `n_group`,
    /// `topk_group`).
    Sigmoid { groups: usize, groups_used: usize },
}

/// A mixture-of-experts feed-forward (`num_experts`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub experts: usize,
    /// Experts each token goes through (top-k of the router's softmax).
    pub experts_per_token: usize,
    /// Each expert's SwiGLU width (`moe_intermediate_size`).
    pub intermediate_size: usize,
    /// The top-k weights are renormalised to sum to 1.
    pub norm_topk_prob: bool,
    /// How the router scores and chooses experts.
    pub routing: Routing,
    /// The chosen experts' weights are multiplied by this (`routed_scaling_factor`; 1 for most).
    pub routed_scale: f32,
    /// The shared expert's width, for families that have one.
    pub shared_intermediate_size: Option<usize>,
    /// The shared expert's output is scaled by a sigmoid gate of its own (Qwen2-MoE's), not
    /// added as it is (GLM-4.5's).
    pub shared_gated: bool,
    /// Layers whose feed-forward is a dense SwiGLU of `intermediate_size` instead.
    pub dense_layers: Vec<usize>,
    /// The router and every expert's matrices have biases (gpt-oss).
    pub biases: bool,
}

/// Qwen3.5's gated DeltaNet linear attention (`linear_*` fields, `layer_types`).
#[derive(Debug, Clone, PartialEq)]
pub struct LinearAttention {
    /// Per layer: whether it is a linear-attention layer (the others attend in full).
    pub layers: Vec<bool>,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    /// The causal convolution's width over q, k and v (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// The tensors are as llama.cpp's converter writes them (a GGUF file): `A` stored as
    /// −exp(A_log), and for the families it reorders (`Architecture::gguf_tiled_value_heads`)
    /// value heads in tiled order (head `h` reads key head `h % key_heads`, not
    /// `h / (value_heads / key_heads)`) in every tensor that has them.
    pub gguf_layout: bool,
}

impl LinearAttention {
    /// The channels the convolution runs over: q's and k's heads, then v's.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// The floats one sequence's state holds in each linear layer: the convolution's last
    /// `conv_kernel - 1` inputs and each value head's [key_dim, value_dim] memory.
    pub fn state_floats(&self) -> (usize, usize) {
        (self.conv_dim() * (self.conv_kernel - 1), self.value_heads * self.key_dim * self.value_dim)
    }
}

/// Multi-head latent attention (DeepSeek V2's and V3's, GLM-4.7-Flash's: `kv_lora_rank`, ...).
/// Each token's keys and values come from one latent of `kv_rank` (RMS-normed) and a key part of
/// `rope_dim` that is rotated and shared by every head; each head's key is its own `nope_dim`
/// rows of `kv_b_proj` times the latent beside that part, its value its `v_dim` rows times it.
///
/// The decoder attends in the latent space, as llama.cpp does: the cache holds one key-value
/// head of [rotated part, latent] (`ModelConfig::head_dim` = `rope_dim + kv_rank`, one KV head),
/// each head's query is its rotated part beside its unrotated part taken into the latent space
/// (by its key rows), and each head's output is taken from the latent space to its values (by
/// its value rows): the same scores and outputs as the expanded heads, from a cache of one latent
/// a token.
#[derive(Debug, Clone, PartialEq)]
pub struct LatentAttention {
    /// Queries through a [q_rank, hidden] product, an RMSNorm and a [heads · (nope + rope),
    /// q_rank] product (`q_lora_rank`); `None`: one [heads · (nope + rope), hidden] product.
    pub q_rank: Option<usize>,
    /// The latent's width (`kv_lora_rank`).
    pub kv_rank: usize,
    /// Each head's unrotated query and key width (`qk_nope_head_dim`).
    pub nope_dim: usize,
    /// The rotated width, each head's and the shared key's (`qk_rope_head_dim`).
    pub rope_dim: usize,
    /// Each head's value width (`v_head_dim`).
    pub v_dim: usize,
    /// The rotation turns adjacent pairs (`rope_interleave`; DeepSeek V2's always): the rotated
    /// rows are loaded in the order of pairs half the part apart, as the one RoPE turns them.
    pub interleaved: bool,
}

impl LatentAttention {
    /// Each head's query and key width before the latent space (the scores' scale is its root).
    pub fn qk_dim(&self) -> usize {
        self.nope_dim + self.rope_dim
    }
}

/// A validated transformer configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family (`model_type`).
    pub arch: &'static Architecture,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// `head_dim`, or the family's default (`hidden_size / num_attention_heads` for most).
    pub head_dim: usize,
    /// q, k and v have biases.
    pub qkv_bias: bool,
    /// The attention's output projection has a bias.
    pub o_bias: bool,
    /// q and k are RMS-normalised per head before the rotary embedding.
    pub qk_norm: bool,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    /// The context length: the largest position + 1 a sequence may use.
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// Queries scaled by their position past the original context (Ministral 3).
    pub query_scaling: Option<QueryScaling>,
    /// M-RoPE (Qwen2-VL's, Qwen3-VL's): which position stream (temporal, height, width) turns
    /// each rotated pair, where the family has it. Text turns all three as one position.
    pub mrope: Option<MRope>,
    /// The leading dimensions of each head the rotary embedding turns (`partial_rotary_factor`
    /// of `head_dim`; all of them for most families).
    pub rotary_dim: usize,
    /// Each full-attention head's output is multiplied by a sigmoid gate, its rows after the
    /// head's query rows in `q_proj` (Qwen3.5).
    pub attn_output_gate: bool,
    /// RMSNorm weights are stored less 1: the norm multiplies by 1 + weight (Qwen3.5's
    /// checkpoints; llama.cpp's converter adds the 1, so a reader of its files leaves this false).
    pub zero_centred_norms: bool,
    /// Qwen3.5's linear-attention layers, where the family has them.
    pub linear: Option<LinearAttention>,
    /// Multi-head latent attention (DeepSeek's, GLM-4.7-Flash's), where the family has it: then
    /// `head_dim` is the cached latent's width and `num_key_value_heads` 1.
    pub latent: Option<LatentAttention>,
    /// The feed-forward's gate.
    pub activation: Activation,
    /// The embeddings' factor before the first layer (Gemma's √hidden_size, Granite's
    /// `embedding_multiplier`).
    pub embedding_scale: Option<f32>,
    /// Embeddings given as input are scaled too (Granite's multiplier applies to whatever
    /// enters its first layer); Gemma's scale belongs to its token embedding, so given rows are
    /// taken as they are (as transformers does for each).
    pub scale_given_embeddings: bool,
    /// Each block's attention and feed-forward outputs are RMS-normalised before their residual
    /// sums (Gemma 2 and 3, OLMo 2).
    pub sandwich_norms: bool,
    /// Each block's attention and feed-forward inputs are RMS-normalised (all but OLMo 2).
    pub input_norms: bool,
    /// q's and k's norms (`qk_norm`) span all their heads at once (OLMo 2), not each head.
    pub whole_qk_norms: bool,
    /// Local layers (Gemma's, gpt-oss's, OLMo 3's).
    pub sliding: Option<SlidingWindow>,
    /// Per layer: whether it has no rotary embedding (SmolLM3's NoPE layers, where its queries
    /// and keys go unturned); `None`: every layer turns them.
    pub unrotated: Option<Vec<bool>>,
    /// Attention scores are scaled by this (`query_pre_attn_scalar`)^−½ instead of head_dim^−½.
    pub attention_scalar: Option<f64>,
    /// Attention scores `s` become `cap · tanh(s / cap)` before the softmax (Gemma 2's
    /// `attn_logit_softcapping`).
    pub attention_softcap: Option<f64>,
    /// The output logits likewise (`final_logit_softcapping`).
    pub logit_softcap: Option<f64>,
    /// The attention's and the feed-forward's outputs are multiplied by this before their
    /// residual sums (Granite's `residual_multiplier`).
    pub residual_scale: Option<f32>,
    /// The output logits are divided by this (Granite's `logits_scaling`).
    pub logit_scale: Option<f64>,
    /// Each attention head has a learned sink: a logit in its softmax's denominator that no
    /// value goes with (gpt-oss's `sinks`).
    pub attention_sinks: bool,
    pub tie_word_embeddings: bool,
    /// The mixture of experts of a MoE family.
    pub moe: Option<MoeConfig>,
    /// Multi-token-prediction layers a checkpoint keeps after the model's
    /// (`num_nextn_predict_layers`: GLM-4.5's `model.layers.{num_hidden_layers}.`): not read.
    pub nextn_layers: usize,
    pub torch_dtype: Option<CheckpointDtype>,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` may be one id or a list in the file.
    pub eos_token_ids: Vec<u32>,
    /// How embeddings pool (`pooling`: from a sentence-transformers `1_Pooling/config.json`, or
    /// a GGUF's `pooling_type`); `None`: not said.
    pub pooling: Option<Pooling>,
}

impl ModelConfig {
    /// Reads and validates `DIR/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let mut value = read_json(&dir.join("config.json"))?;
        // sentence-transformers says how its embeddings pool beside the checkpoint.
        let pooling = dir.join("1_Pooling/config.json");
        if pooling.exists() {
            let modes = read_json(&pooling)?;
            let on = |mode: &str| modes.get(mode).and_then(Value::as_bool) == Some(true);
            let name = if on("pooling_mode_lasttoken") {
                Some("last")
            } else if on("pooling_mode_mean_tokens") {
                Some("mean")
            } else {
                None
            };
            if let (Some(name), Value::Object(obj)) = (name, &mut value) {
                obj.entry("pooling").or_insert(name.into());
            }
        }
        Self::from_value(value)
    }

    /// Parses and validates the text of a `config.json`.
    pub fn from_json_str(text: &str) -> Result<Self, LoadError> {
        let value = serde_json::from_str(text)
            .map_err(|e| LoadError::Json { path: "config.json".into(), reason: e.to_string() })?;
        Self::from_value(value)
    }

    fn from_value(value: Value) -> Result<Self, LoadError> {
        let Value::Object(top) = value else {
            return Err(LoadError::Json { path: "config.json".into(), reason: "not a JSON object".into() });
        };
        let arch = Fields(&top).arch()?;
        // A multimodal checkpoint's language model has its own config (`text_config`), and is
        // served as its own family where that is another we serve (Mistral 3's checkpoints
        // wrap Mistral's, Ministral 3's or Mistral 4's layers).
        let text_arch = match top.get("text_config") {
            Some(Value::Object(text)) => Fields(text).opt_str("model_type")?.and_then(|name| arch::find(&name)),
            _ => None,
        };
        let arch = text_arch.unwrap_or(arch);
        let obj = match top.get("text_config") {
            Some(Value::Object(text)) => {
                let mut text = text.clone();
                for field in ["tie_word_embeddings", "torch_dtype", "dtype"] {
                    if let (false, Some(v)) = (text.contains_key(field), top.get(field)) {
                        text.insert(field.into(), v.clone());
                    }
                }
                text
            }
            Some(other) => return Err(Fields::err("text_config", "an object", other)),
            None => top.clone(),
        };
        // The family's defaults for fields its configs leave out.
        let mut obj = obj;
        for &(field, value) in arch.config_defaults {
            if !obj.contains_key(field) {
                let number = if value.fract() == 0.0 && value >= 0.0 { json!(value as u64) } else { json!(value) };
                obj.insert(field.into(), number);
            }
        }
        let f = Fields(&obj);
        f.refuse_features()?;
        let hidden_size = f.usize("hidden_size")?;
        let num_attention_heads = f.usize("num_attention_heads")?;
        let latent = f.latent(arch)?;
        let head_dim = match (f.opt_usize("head_dim")?, arch.default_head_dim) {
            // The cached latent beside the rotated key part (its configs' `head_dim` is the
            // rotated part's).
            _ if latent.is_some() => latent.as_ref().map_or(0, |l| l.rope_dim + l.kv_rank),
            (Some(d), _) | (None, Some(d)) => d,
            // Without a head_dim the heads split the hidden size (no heads: `validate` names it).
            (None, None) if num_attention_heads == 0 => 0,
            (None, None)
                if hidden_size.is_multiple_of(num_attention_heads)
                    && (hidden_size / num_attention_heads).is_multiple_of(2) =>
            {
                hidden_size / num_attention_heads
            }
            (None, None) => {
                return Err(LoadError::Config {
                    field: "hidden_size".into(),
                    reason: format!(
                        "{hidden_size} is not num_attention_heads ({num_attention_heads}) × an even head_dim"
                    ),
                });
            }
        };
        let qkv_bias = match arch.qkv_bias {
            Bias::Always => true,
            Bias::Config { field, default } => f.opt_bool(field)?.unwrap_or(default),
        };
        let (rope_theta, rope_scaling, partial_rotary, query_scaling) = f.rope(arch)?;
        let moe = f.moe(arch)?;
        // Latent attention's scores are scaled by (nope + rope)^−½ times YaRN's mscale², where
        // the kernels scale by the cached latent's width^−½.
        let latent_scalar = match &latent {
            Some(l) => Some(l.qk_dim() as f64 / f.latent_mscale()?.powi(4)),
            None => None,
        };
        let rotary_dim = match &latent {
            Some(l) => l.rope_dim,
            None => ((head_dim as f64 * partial_rotary).round() as usize) & !1,
        };
        if let RopeScaling::LongRope { short, long, .. } = &rope_scaling
            && (short.len() != rotary_dim / 2 || long.len() != rotary_dim / 2)
        {
            let reason = format!(
                "{} short and {} long factors, expected {} (one per rotated frequency)",
                short.len(),
                long.len(),
                rotary_dim / 2
            );
            let section = if obj.contains_key("rope_parameters") { "rope_parameters" } else { "rope_scaling" };
            return Err(LoadError::Config { field: format!("{section}.short_factor"), reason });
        }
        // OLMo 3's local layers rotate by the global base without the global layers' scaling.
        let mut sliding = f.sliding(arch)?;
        if let (Some(s), Some(local)) = (&mut sliding, &arch.local_layers)
            && s.rope_theta.is_none()
            && local.unscaled
            && !matches!(rope_scaling, RopeScaling::None)
        {
            s.rope_theta = Some(rope_theta);
        }
        let config = Self {
            arch,
            hidden_size,
            num_hidden_layers: f.usize("num_hidden_layers")?,
            num_attention_heads,
            // One latent a token, which every head reads.
            num_key_value_heads: match &latent {
                Some(_) => 1,
                None => f.opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads),
            },
            head_dim,
            qkv_bias,
            o_bias: qkv_bias && arch.o_bias_with_qkv,
            // GLM-4.5's configs say (`use_qk_norm`); its smaller models have none.
            qk_norm: arch.qk_norm || f.opt_bool("use_qk_norm")?.unwrap_or(false),
            // A model whose every layer is a mixture of experts has no dense width (Qwen3.5-MoE).
            intermediate_size: match (f.opt_usize("intermediate_size")?, &moe) {
                (Some(n), _) => n,
                (None, Some(m)) if m.dense_layers.is_empty() => 0,
                (None, _) => {
                    return Err(LoadError::Config { field: "intermediate_size".into(), reason: "missing".into() });
                }
            },
            vocab_size: f.usize("vocab_size")?,
            max_position_embeddings: f.context(arch)?,
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            query_scaling,
            mrope: f.mrope(rotary_dim)?,
            rotary_dim,
            attn_output_gate: arch.gated_delta_net && f.opt_bool("attn_output_gate")?.unwrap_or(true),
            zero_centred_norms: arch.zero_centred_norms,
            linear: f.linear(arch)?,
            latent,
            activation: f.activation(arch)?,
            // Gemma's √hidden_size, or Granite's `embedding_multiplier`.
            embedding_scale: match arch.scaled_embedding {
                true => Some((hidden_size as f32).sqrt()),
                false => f.positive("embedding_multiplier")?.filter(|&m| m != 1.0).map(|m| m as f32),
            },
            scale_given_embeddings: !arch.scaled_embedding,
            sandwich_norms: arch.sandwich_norms,
            input_norms: !arch.no_input_norms,
            whole_qk_norms: arch.whole_qk_norms,
            sliding,
            unrotated: f.unrotated(arch)?,
            // Granite's scores are scaled by `attention_multiplier` itself: the scalar whose
            // inverse root it is.
            attention_scalar: match (f.positive("query_pre_attn_scalar")?, latent_scalar) {
                (Some(s), _) | (None, Some(s)) => Some(s),
                (None, None) => f.positive("attention_multiplier")?.map(|m| 1.0 / (m * m)),
            },
            attention_softcap: f.positive("attn_logit_softcapping")?,
            logit_softcap: f.positive("final_logit_softcapping")?,
            residual_scale: f.positive("residual_multiplier")?.filter(|&m| m != 1.0).map(|m| m as f32),
            logit_scale: f.positive("logits_scaling")?.filter(|&s| s != 1.0),
            attention_sinks: arch.attention_sinks,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(arch.tied_embeddings),
            moe,
            nextn_layers: f.opt_usize("num_nextn_predict_layers")?.unwrap_or(0),
            // transformers ≥ 5 writes `dtype`, earlier versions `torch_dtype`.
            torch_dtype: match f.get("torch_dtype") {
                Some(_) => f.dtype("torch_dtype")?,
                None => f.dtype("dtype")?,
            },
            bos_token_id: f.opt_token("bos_token_id")?,
            eos_token_ids: f.token_list("eos_token_id")?,
            pooling: match f.get("pooling") {
                None => None,
                Some(Value::String(name)) if Pooling::parse(name).is_some() => Pooling::parse(name),
                Some(other) => {
                    return Err(LoadError::Config {
                        field: "pooling".into(),
                        reason: format!("expected \"last\" or \"mean\", found {other}"),
                    });
                }
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// What a loaded RMSNorm weight gets added: 1 where the checkpoint stores it less 1
    /// (`zero_centred_norms`), else 0.
    pub fn norm_offset(&self) -> f32 {
        if self.zero_centred_norms { 1.0 } else { 0.0 }
    }

    /// Whether layer `l` is a local layer (Gemma's: attention over the sliding window only).
    pub fn is_local_layer(&self, l: usize) -> bool {
        self.sliding.as_ref().is_some_and(|s| s.layers.get(l) == Some(&true))
    }

    /// Whether layer `l` has no rotary embedding (SmolLM3's NoPE layers).
    pub fn is_unrotated_layer(&self, l: usize) -> bool {
        self.unrotated.as_ref().is_some_and(|u| u.get(l) == Some(&true))
    }

    /// Whether layer `l` is a linear-attention layer (Qwen3.5's gated DeltaNet).
    pub fn is_linear_layer(&self, l: usize) -> bool {
        self.linear.as_ref().is_some_and(|a| a.layers.get(l) == Some(&true))
    }

    /// The layers that attend in full, in order: those with keys and values in the cache.
    pub fn attention_layers(&self) -> usize {
        (0..self.num_hidden_layers).filter(|&l| !self.is_linear_layer(l)).count()
    }

    /// Whether layer `l`'s feed-forward is a mixture of experts.
    pub fn is_moe_layer(&self, l: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| !m.dense_layers.contains(&l))
    }

    fn validate(&self) -> Result<(), LoadError> {
        let bad = |field: &str, reason: String| Err(LoadError::Config { field: field.into(), reason });
        if self.num_hidden_layers == 0 {
            return bad("num_hidden_layers", "must be > 0".into());
        }
        if self.num_attention_heads == 0 {
            return bad("num_attention_heads", "must be > 0".into());
        }
        if self.hidden_size == 0 {
            return bad("hidden_size", "must be > 0".into());
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("head_dim", format!("{} must be even for rotary embeddings", self.head_dim));
        }
        let (heads, kv) = (self.num_attention_heads, self.num_key_value_heads);
        if kv == 0 || kv > heads || !heads.is_multiple_of(kv) {
            return bad(
                "num_key_value_heads",
                format!("{kv} must be > 0, ≤ num_attention_heads ({heads}) and divide it"),
            );
        }
        for (field, value) in
            [("vocab_size", self.vocab_size), ("max_position_embeddings", self.max_position_embeddings)]
        {
            if value == 0 {
                return bad(field, "must be > 0".into());
            }
        }
        if self.intermediate_size == 0 && (0..self.num_hidden_layers).any(|l| !self.is_moe_layer(l)) {
            return bad("intermediate_size", "must be > 0".into());
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return bad("rms_norm_eps", format!("{} must be a positive number", self.rms_norm_eps));
        }
        if self.rotary_dim == 0 || self.rotary_dim > self.head_dim {
            return bad("partial_rotary_factor", format!("turns {} of head_dim {}", self.rotary_dim, self.head_dim));
        }
        if let Some(a) = &self.linear {
            if a.layers.len() != self.num_hidden_layers {
                let reason = format!("{} entries for {} layers", a.layers.len(), self.num_hidden_layers);
                return bad("layer_types", reason);
            }
            if a.key_heads == 0 || a.value_heads == 0 || !a.value_heads.is_multiple_of(a.key_heads) {
                let reason =
                    format!("{} must be > 0 and a multiple of linear_num_key_heads ({})", a.value_heads, a.key_heads);
                return bad("linear_num_value_heads", reason);
            }
            for (field, value) in [
                ("linear_key_head_dim", a.key_dim),
                ("linear_value_head_dim", a.value_dim),
                ("linear_conv_kernel_dim", a.conv_kernel),
            ] {
                if value == 0 {
                    return bad(field, "must be > 0".into());
                }
            }
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad("rope_theta", format!("{} must be a positive number", self.rope_theta));
        }
        if let Some(s) = &self.sliding {
            if s.layers.len() != self.num_hidden_layers {
                return bad("layer_types", format!("{} entries for {} layers", s.layers.len(), self.num_hidden_layers));
            }
            if let Some(theta) = s.rope_theta.filter(|t| !(t.is_finite() && *t > 0.0)) {
                return bad("rope_local_base_freq", format!("{theta} must be a positive number"));
            }
        }
        if self.activation == Activation::GeluTanh && self.moe.is_some() {
            return bad("hidden_act", "experts gate by SwiGLU only (`silu`)".into());
        }
        if let Activation::ClampedSwiglu { alpha, limit } = self.activation {
            if !(alpha.is_finite() && alpha > 0.0) {
                return bad("swiglu_alpha", format!("{alpha} must be a positive number"));
            }
            if !(limit.is_finite() && limit > 0.0) {
                return bad("swiglu_limit", format!("{limit} must be a positive number"));
            }
        }
        if let Some(m) = &self.moe {
            if m.experts == 0 {
                return bad("num_experts", "must be > 0".into());
            }
            if m.experts_per_token == 0 || m.experts_per_token > m.experts {
                let reason = format!("{} must be between 1 and num_experts ({})", m.experts_per_token, m.experts);
                return bad("num_experts_per_tok", reason);
            }
            if m.intermediate_size == 0 || m.shared_intermediate_size == Some(0) {
                return bad("moe_intermediate_size", "expert widths must be > 0".into());
            }
            if !(m.routed_scale.is_finite() && m.routed_scale > 0.0) {
                return bad("routed_scaling_factor", format!("{} must be a positive number", m.routed_scale));
            }
            if let Routing::Sigmoid { groups, groups_used } = m.routing {
                if groups == 0 || !m.experts.is_multiple_of(groups) {
                    return bad(
                        "n_group",
                        format!("{groups} must divide num_experts ({}) into equal groups", m.experts),
                    );
                }
                // A group is ranked by its two best experts.
                if groups > 1 && m.experts / groups < 2 {
                    return bad("n_group", format!("{groups} groups of {} experts: each needs two", m.experts));
                }
                if groups_used == 0 || groups_used > groups {
                    return bad("topk_group", format!("{groups_used} must be between 1 and n_group ({groups})"));
                }
                if m.experts_per_token > groups_used * (m.experts / groups) {
                    let reason = format!(
                        "{} experts a token, more than the {} in its best {groups_used} groups",
                        m.experts_per_token,
                        groups_used * (m.experts / groups)
                    );
                    return bad("num_experts_per_tok", reason);
                }
            }
        }
        let vocab = self.vocab_size;
        for (field, id) in self
            .bos_token_id
            .iter()
            .map(|id| ("bos_token_id", id))
            .chain(self.eos_token_ids.iter().map(|id| ("eos_token_id", id)))
        {
            if *id as usize >= vocab {
                return bad(field, format!("token id {id} is not below vocab_size {vocab}"));
            }
        }
        Ok(())
    }
}

/// A `partial_rotary_factor` (1 when not given), in (0, 1].
fn partial_factor(value: Option<f64>, field: &str) -> Result<f64, LoadError> {
    match value {
        None => Ok(1.0),
        Some(p) if p > 0.0 && p <= 1.0 => Ok(p),
        Some(p) => Err(LoadError::Config { field: field.into(), reason: format!("{p} must be in (0, 1]") }),
    }
}

/// Reads and parses a JSON file (config.json, tokenizer_config.json, a shard index).
pub(crate) fn read_json(path: &Path) -> Result<Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io { path: path.into(), source })?;
    serde_json::from_str(&text).map_err(|e| LoadError::Json { path: path.into(), reason: e.to_string() })
}

/// Typed access to the fields of a JSON object, each error naming its field.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, field: &str) -> Option<&Value> {
        self.0.get(field).filter(|v| !v.is_null())
    }

    fn err(field: &str, expected: &str, found: &Value) -> LoadError {
        LoadError::Config { field: field.into(), reason: format!("expected {expected}, found {found}") }
    }

    fn opt_usize(&self, field: &str) -> Result<Option<usize>, LoadError> {
        self.get(field)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| Self::err(field, "a non-negative integer", v))
            })
            .transpose()
    }

    fn usize(&self, field: &str) -> Result<usize, LoadError> {
        self.opt_usize(field)?.ok_or_else(|| LoadError::Config { field: field.into(), reason: "missing".into() })
    }

    fn opt_f64(&self, field: &str) -> Result<Option<f64>, LoadError> {
        self.get(field).map(|v| v.as_f64().ok_or_else(|| Self::err(field, "a number", v))).transpose()
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>, LoadError> {
        self.get(field).map(|v| v.as_bool().ok_or_else(|| Self::err(field, "true or false", v))).transpose()
    }

    fn opt_str(&self, field: &str) -> Result<Option<String>, LoadError> {
        self.get(field)
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| Self::err(field, "a string", v)))
            .transpose()
    }

    fn opt_token(&self, field: &str) -> Result<Option<u32>, LoadError> {
        self.get(field)
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| Self::err(field, "a token id", v)))
            .transpose()
    }

    fn token_list(&self, field: &str) -> Result<Vec<u32>, LoadError> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| Self::err(field, "token ids", v)))
                .collect(),
            Some(_) => Ok(self.opt_token(field)?.into_iter().collect()),
        }
    }

    /// The family: `model_type` (Qwen2 when missing, as older Qwen2 exports leave it out).
    fn arch(&self) -> Result<&'static Architecture, LoadError> {
        let name = self.opt_str("model_type")?.unwrap_or_else(|| "qwen2".into());
        arch::find(&name).ok_or_else(|| LoadError::Config {
            field: "model_type".into(),
            reason: match arch::unsupported(&name) {
                Some(needs) => format!("`{name}` needs {needs}, which llaisys does not implement yet"),
                None => format!("`{name}` is not a family llaisys serves ({})", arch::names()),
            },
        })
    }

    /// A MoE family's experts: `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
    /// `norm_topk_prob`, the routing (`n_group`, `topk_group`, `routed_scaling_factor`), the
    /// shared expert's width, and the dense layers (`mlp_only_layers`, those `decoder_sparse_step`
    /// skips, and the first `first_k_dense_replace`).
    fn moe(&self, arch: &Architecture) -> Result<Option<MoeConfig>, LoadError> {
        let Some(experts) = &arch.experts else { return Ok(None) };
        let layers = self.usize("num_hidden_layers")?;
        let step = self.opt_usize("decoder_sparse_step")?.unwrap_or(1);
        if step == 0 {
            return Err(LoadError::Config { field: "decoder_sparse_step".into(), reason: "must be > 0".into() });
        }
        let listed: Vec<usize> = match self.get("mlp_only_layers") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().map(|l| l as usize).ok_or_else(|| Self::err("mlp_only_layers", "layer indices", v)))
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(Self::err("mlp_only_layers", "a list of layer indices", other)),
        };
        if let Some(l) = listed.iter().find(|&&l| l >= layers) {
            let reason = format!("layer {l} is beyond num_hidden_layers");
            return Err(LoadError::Config { field: "mlp_only_layers".into(), reason });
        }
        let leading = self.opt_usize("first_k_dense_replace")?.unwrap_or(0);
        // GLM-4.7-Flash's configs list each layer's kind (`mlp_layer_types`).
        let kinds = match self.get("mlp_layer_types") {
            None => None,
            Some(Value::Array(items)) if items.len() == layers => Some(
                items
                    .iter()
                    .map(|v| match v.as_str() {
                        Some("dense") => Ok(true),
                        Some("sparse") => Ok(false),
                        _ => Err(Self::err("mlp_layer_types", "\"dense\" or \"sparse\"", v)),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(other) => return Err(Self::err("mlp_layer_types", "a kind per layer", other)),
        };
        let dense_layers = (0..layers)
            .filter(|&l| match &kinds {
                Some(dense) => dense[l],
                None => l < leading || listed.contains(&l) || !(l + 1).is_multiple_of(step),
            })
            .collect();
        let width = self.usize(experts.width)?;
        Ok(Some(MoeConfig {
            // transformers ≥ 5 writes `num_local_experts`, the Hub's checkpoints `num_experts`
            // (GLM-4.5's and DeepSeek's `n_routed_experts`).
            experts: match (self.opt_usize("num_local_experts")?, self.opt_usize("n_routed_experts")?) {
                (Some(n), _) | (None, Some(n)) => n,
                (None, None) => self.usize("num_experts")?,
            },
            experts_per_token: self.usize("num_experts_per_tok")?,
            intermediate_size: width,
            norm_topk_prob: experts.norm_topk_always || self.opt_bool("norm_topk_prob")?.unwrap_or(false),
            routing: match self.sigmoid_router(arch, experts)? {
                true => Routing::Sigmoid {
                    groups: self.opt_usize("n_group")?.unwrap_or(1),
                    groups_used: self.opt_usize("topk_group")?.unwrap_or(1),
                },
                false => Routing::Softmax,
            },
            routed_scale: self.opt_f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
            shared_intermediate_size: match experts.shared {
                Shared::None => None,
                Shared::Gated => Some(self.usize("shared_expert_intermediate_size")?),
                // No shared expert where the config says none.
                Shared::Plain => match self.opt_usize("n_shared_experts")?.unwrap_or(1) {
                    0 => None,
                    n => Some(n * width),
                },
            },
            shared_gated: experts.shared == Shared::Gated,
            dense_layers,
            biases: experts.biases,
        }))
    }

    /// Multi-head latent attention's sizes, where the family has it: `q_lora_rank` (null: no
    /// low-rank queries), `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`,
    /// `rope_interleave` (true where not given, as transformers' default). q, k and v biases
    /// (`attention_bias`) are refused: no released model has them.
    fn latent(&self, arch: &Architecture) -> Result<Option<LatentAttention>, LoadError> {
        if !arch.latent_attention {
            return Ok(None);
        }
        if self.opt_bool("attention_bias")? == Some(true) {
            let reason = "biases on latent attention's projections are not supported".into();
            return Err(LoadError::Config { field: "attention_bias".into(), reason });
        }
        let latent = LatentAttention {
            q_rank: self.opt_usize("q_lora_rank")?,
            kv_rank: self.usize("kv_lora_rank")?,
            nope_dim: self.usize("qk_nope_head_dim")?,
            rope_dim: self.usize("qk_rope_head_dim")?,
            v_dim: self.usize("v_head_dim")?,
            interleaved: self.opt_bool("rope_interleave")?.unwrap_or(true),
        };
        let bad = |field: &str, reason: &str| Err(LoadError::Config { field: field.into(), reason: reason.into() });
        if latent.q_rank == Some(0) {
            return bad("q_lora_rank", "must be > 0 (or null: no low-rank queries)");
        }
        for (field, value) in
            [("kv_lora_rank", latent.kv_rank), ("qk_nope_head_dim", latent.nope_dim), ("v_head_dim", latent.v_dim)]
        {
            if value == 0 {
                return bad(field, "must be > 0");
            }
        }
        if latent.rope_dim == 0 || !latent.rope_dim.is_multiple_of(2) {
            return bad("qk_rope_head_dim", "must be even and > 0 for the rotary embedding");
        }
        Ok(Some(latent))
    }

    /// YaRN's `0.1 · mscale_all_dim · ln(factor) + 1` where the rotation is stretched and the
    /// config gives `mscale_all_dim`, else 1: latent attention's scores are scaled by its square
    /// besides (nope + rope)^−½ (transformers' `yarn_apply_mscale`).
    fn latent_mscale(&self) -> Result<f64, LoadError> {
        let section = ["rope_parameters", "rope_scaling"].into_iter().find_map(|k| match self.get(k) {
            Some(Value::Object(o)) => Some(o),
            _ => None,
        });
        let Some(section) = section else { return Ok(1.0) };
        let rope = Fields(section);
        let kind = match rope.opt_str("rope_type")? {
            Some(kind) => Some(kind),
            None => rope.opt_str("type")?,
        };
        let all_dim = rope.opt_f64("mscale_all_dim")?.unwrap_or(0.0);
        if matches!(kind.as_deref(), None | Some("default")) || all_dim == 0.0 {
            return Ok(1.0);
        }
        let factor = rope.opt_f64("factor")?.unwrap_or(1.0);
        Ok(yarn_mscale(factor, all_dim))
    }

    /// Whether a family's router is a sigmoid's: the family's where its configs do not say;
    /// DeepSeek's say (`scoring_func`: V2's `softmax`, V3's `sigmoid`), and V2's grouped choice
    /// among softmax scores (`topk_method: group_limited_greedy` over several groups) is refused.
    fn sigmoid_router(&self, arch: &Architecture, experts: &crate::arch::Experts) -> Result<bool, LoadError> {
        if !arch.latent_attention {
            return Ok(experts.sigmoid_router);
        }
        let sigmoid = match self.opt_str("scoring_func")?.as_deref() {
            None => experts.sigmoid_router,
            Some("sigmoid") => true,
            Some("softmax") => false,
            Some(other) => {
                let reason = format!("`{other}` is not supported (softmax, sigmoid)");
                return Err(LoadError::Config { field: "scoring_func".into(), reason });
            }
        };
        // A softmax router choosing within its best groups (DeepSeek V2 236B's
        // `group_limited_greedy`; Mistral 4's routers wherever `topk_group` < `n_group`).
        let groups = self.opt_usize("n_group")?.unwrap_or(1);
        let grouped = groups > 1 && self.opt_usize("topk_group")?.unwrap_or(groups) < groups;
        let method = self.opt_str("topk_method")?;
        if !sigmoid && grouped && method.as_deref() != Some("greedy") {
            let reason = "a softmax router's choice within groups (DeepSeek V2's 236B) is not supported".into();
            let field = if method.is_some() { "topk_method" } else { "topk_group" };
            return Err(LoadError::Config { field: field.into(), reason });
        }
        Ok(sigmoid)
    }

    /// Qwen3.5's linear attention: `layer_types` (or every `full_attention_interval`-th layer in
    /// full, 4 when neither is given) and the `linear_*` sizes, with transformers' defaults.
    fn linear(&self, arch: &Architecture) -> Result<Option<LinearAttention>, LoadError> {
        if !arch.gated_delta_net {
            return Ok(None);
        }
        let layers = self.usize("num_hidden_layers")?;
        let kinds = match self.get("layer_types") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v.as_str() {
                    Some("linear_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(Self::err("layer_types", "\"linear_attention\" or \"full_attention\"", v)),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => return Err(Self::err("layer_types", "a list", other)),
            None => {
                let every = self.opt_usize("full_attention_interval")?.unwrap_or(4).max(1);
                (0..layers).map(|l| !(l + 1).is_multiple_of(every)).collect()
            }
        };
        let size = |field: &str, default: usize| Ok::<_, LoadError>(self.opt_usize(field)?.unwrap_or(default));
        Ok(Some(LinearAttention {
            layers: kinds,
            key_heads: size("linear_num_key_heads", 16)?,
            value_heads: size("linear_num_value_heads", 32)?,
            key_dim: size("linear_key_head_dim", 128)?,
            value_dim: size("linear_value_head_dim", 128)?,
            conv_kernel: size("linear_conv_kernel_dim", 4)?,
            gguf_layout: false,
        }))
    }

    /// The context: `max_position_embeddings`, capped at `sliding_window` for a family whose
    /// attention keeps to it (within the window that is full attention; a warning says so).
    fn context(&self, arch: &Architecture) -> Result<usize, LoadError> {
        let context = self.usize("max_position_embeddings")?;
        let window = if arch.window_caps_context { self.opt_usize("sliding_window")? } else { None };
        match window.filter(|&w| w > 0 && w < context) {
            Some(window) => {
                tracing::warn!(window, context, "sliding-window attention: the context is capped at the window");
                Ok(window)
            }
            None => Ok(context),
        }
    }

    /// Options of these families that the decoder does not implement, refused by name.
    fn refuse_features(&self) -> Result<(), LoadError> {
        let refuse = |field: &str, reason: &str| Err(LoadError::Config { field: field.into(), reason: reason.into() });
        if self.opt_bool("mlp_bias")? == Some(true) {
            return refuse("mlp_bias", "feed-forward biases are not supported");
        }
        if self.opt_bool("use_sliding_window")? == Some(true) {
            return refuse("use_sliding_window", "sliding-window attention is not supported");
        }
        if self.opt_bool("use_bidirectional_attention")? == Some(true) {
            return refuse(
                "use_bidirectional_attention",
                "bidirectional attention (EmbeddingGemma's) is not supported",
            );
        }
        Ok(())
    }

    /// The feed-forward's gate: `hidden_activation` (Gemma's field, which transformers reads for
    /// it), else `hidden_act`, else the family's; gpt-oss's clamped SwiGLU with its
    /// `swiglu_alpha` and `swiglu_limit` (its configs' `hidden_act: silu` says nothing of it).
    fn activation(&self, arch: &Architecture) -> Result<Activation, LoadError> {
        if let Activation::ClampedSwiglu { alpha, limit } = arch.activation {
            return Ok(Activation::ClampedSwiglu {
                alpha: self.opt_f64("swiglu_alpha")?.map_or(alpha, |a| a as f32),
                limit: self.opt_f64("swiglu_limit")?.map_or(limit, |l| l as f32),
            });
        }
        let (field, name) = match (self.opt_str("hidden_activation")?, self.opt_str("hidden_act")?) {
            (Some(name), _) => ("hidden_activation", name),
            (None, Some(name)) => ("hidden_act", name),
            (None, None) => return Ok(arch.activation),
        };
        Activation::parse(&name).ok_or_else(|| LoadError::Config {
            field: field.into(),
            reason: format!("`{name}` is not supported (silu: SwiGLU; gelu_pytorch_tanh: GeGLU)"),
        })
    }

    /// A positive number, `None` when missing.
    fn positive(&self, field: &str) -> Result<Option<f64>, LoadError> {
        match self.opt_f64(field)? {
            Some(x) if !(x.is_finite() && x > 0.0) => {
                Err(LoadError::Config { field: field.into(), reason: format!("{x} must be a positive number") })
            }
            x => Ok(x),
        }
    }

    /// SmolLM3's NoPE layers, for a family that has them: `no_rope_layers` (a flag per layer, 1
    /// where it turns q and k, 0 where not), else every `no_rope_layer_interval`-th layer (the
    /// family's interval when not given: its GGUF files say nothing, llama.cpp fixes it so).
    fn unrotated(&self, arch: &Architecture) -> Result<Option<Vec<bool>>, LoadError> {
        let Some(interval) = arch.unrotated_interval else { return Ok(None) };
        let layers = self.usize("num_hidden_layers")?;
        let unrotated: Vec<bool> = match self.get("no_rope_layers") {
            Some(Value::Array(flags)) if flags.len() == layers => flags
                .iter()
                .map(|v| match v.as_u64() {
                    Some(1) => Ok(false),
                    Some(0) => Ok(true),
                    _ => Err(Self::err("no_rope_layers", "1 (rotary) or 0 (none) per layer", v)),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(Self::err("no_rope_layers", &format!("a list of {layers} flags"), other));
            }
            None => {
                let every = self.opt_usize("no_rope_layer_interval")?.unwrap_or(interval);
                if every == 0 {
                    let reason = "must be > 0".into();
                    return Err(LoadError::Config { field: "no_rope_layer_interval".into(), reason });
                }
                (0..layers).map(|l| (l + 1).is_multiple_of(every)).collect()
            }
        };
        Ok(unrotated.contains(&true).then_some(unrotated))
    }

    /// Gemma's local layers, for a family that has them and a config with a `sliding_window`:
    /// `layer_types` (`sliding_attention` or `full_attention`), else all but every
    /// `sliding_window_pattern`-th layer (the family's pattern when not given); their rotary base
    /// from `rope_parameters.sliding_attention` (transformers ≥ 5), else `rope_local_base_freq`,
    /// else the family's or the global layers'.
    fn sliding(&self, arch: &Architecture) -> Result<Option<SlidingWindow>, LoadError> {
        let Some(local) = &arch.local_layers else { return Ok(None) };
        let Some(window) = self.opt_usize("sliding_window")?.filter(|&w| w > 0) else { return Ok(None) };
        let layers = match self.get("layer_types") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(Self::err("layer_types", "\"sliding_attention\" or \"full_attention\"", v)),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => return Err(Self::err("layer_types", "a list", other)),
            None => {
                let every = self.opt_usize("sliding_window_pattern")?.unwrap_or(local.pattern);
                if every == 0 {
                    let reason = "must be > 0".into();
                    return Err(LoadError::Config { field: "sliding_window_pattern".into(), reason });
                }
                (0..self.usize("num_hidden_layers")?).map(|l| !(l + 1).is_multiple_of(every)).collect()
            }
        };
        let own = match self.get("rope_parameters").and_then(|p| p.get("sliding_attention")) {
            None => None,
            Some(Value::Object(params)) => {
                let params = Fields(params);
                let named = |e: LoadError| match e {
                    LoadError::Config { field, reason } => {
                        LoadError::Config { field: format!("rope_parameters.sliding_attention.{field}"), reason }
                    }
                    other => other,
                };
                if let Some(kind) = params.opt_str("rope_type").map_err(named)?
                    && kind != "default"
                {
                    let reason = format!("`{kind}`: the local layers' rotary embedding is not scaled");
                    return Err(named(LoadError::Config { field: "rope_type".into(), reason }));
                }
                params.opt_f64("rope_theta").map_err(named)?
            }
            Some(other) => return Err(Self::err("rope_parameters.sliding_attention", "an object", other)),
        };
        let rope_theta = own.or(self.opt_f64("rope_local_base_freq")?).or(local.rope_theta);
        Ok(Some(SlidingWindow { window, layers, rope_theta }))
    }

    /// The rotary base and scaling: `rope_theta` and `rope_scaling` at the top level
    /// (transformers < 5), or both in `rope_parameters`. Errors name the field as written.
    /// `mrope_section` (and `mrope_interleaved`) of `rope_parameters` or `rope_scaling`: pairs
    /// per stream, which must add up to the rotated pairs where the streams take them in turn
    /// (as transformers splits them); interleaved, the pairs past the sections are temporal.
    fn mrope(&self, rotary_dim: usize) -> Result<Option<MRope>, LoadError> {
        let (section, Some(Value::Object(params))) = (match self.get("rope_parameters") {
            Some(p) => ("rope_parameters", Some(p)),
            None => ("rope_scaling", self.get("rope_scaling")),
        }) else {
            return Ok(None);
        };
        let nested = Fields(params);
        let Some(value) = nested.get("mrope_section") else {
            return Ok(None);
        };
        let field = format!("{section}.mrope_section");
        let pairs: Option<Vec<usize>> =
            value.as_array().and_then(|a| a.iter().map(|v| v.as_u64().map(|n| n as usize)).collect());
        let interleaved = nested.opt_bool("mrope_interleaved")?.unwrap_or(false);
        let sections = match pairs.as_deref() {
            Some(&[t, h, w]) if interleaved || t + h + w == rotary_dim / 2 => [t, h, w],
            _ => {
                let reason = format!("expected three pair counts adding up to {} (the rotated pairs)", rotary_dim / 2);
                return Err(LoadError::Config { field, reason: format!("{value}: {reason}") });
            }
        };
        Ok(Some(MRope { sections, interleaved }))
    }

    fn rope(&self, arch: &Architecture) -> Result<(f64, RopeScaling, f64, Option<QueryScaling>), LoadError> {
        let top_partial = self.opt_f64("partial_rotary_factor")?;
        let (section, params) = match (self.get("rope_parameters"), self.get("rope_scaling")) {
            // Per kind of layer (Gemma 3's, transformers ≥ 5): the global layers' (`sliding`
            // reads the local ones').
            (Some(p), _) if p.get("full_attention").is_some() => {
                ("rope_parameters.full_attention", &p["full_attention"])
            }
            (Some(p), _) => ("rope_parameters", p),
            (None, Some(p)) => ("rope_scaling", p),
            (None, None) => {
                let theta = self.opt_f64("rope_theta")?.unwrap_or(10_000.0);
                return Ok((theta, RopeScaling::None, partial_factor(top_partial, "partial_rotary_factor")?, None));
            }
        };
        let Value::Object(params) = params else {
            return Err(Self::err(section, "an object", params));
        };
        let nested = Fields(params);
        let named = |e: LoadError| match e {
            LoadError::Config { field, reason } => LoadError::Config { field: format!("{section}.{field}"), reason },
            other => other,
        };
        let theta = nested.opt_f64("rope_theta").map_err(named)?.or(self.opt_f64("rope_theta")?).unwrap_or(10_000.0);
        let partial = match nested.opt_f64("partial_rotary_factor").map_err(named)? {
            Some(p) => partial_factor(Some(p), &format!("{section}.partial_rotary_factor"))?,
            None => partial_factor(top_partial, "partial_rotary_factor")?,
        };
        // `type` in older configs, `rope_type` in newer ones.
        let kind = match nested.opt_str("rope_type").map_err(named)? {
            Some(kind) => Some(kind),
            None => nested.opt_str("type").map_err(named)?,
        };
        let factor = || -> Result<f64, LoadError> {
            let factor = nested.opt_f64("factor").map_err(named)?;
            match factor {
                Some(f) if f.is_finite() && f >= 1.0 => Ok(f),
                Some(f) => {
                    Err(named(LoadError::Config { field: "factor".into(), reason: format!("{f} must be ≥ 1") }))
                }
                None => Err(named(LoadError::Config { field: "factor".into(), reason: "missing".into() })),
            }
        };
        let original = || -> Result<Option<usize>, LoadError> {
            nested.opt_usize("original_max_position_embeddings").map_err(named)
        };
        let scaling = match kind.as_deref() {
            // Qwen2-VL's and Qwen2.5-VL's released configs name M-RoPE (`mrope_section`) as a
            // kind: the default frequencies, which text turns as one position stream.
            None | Some("default" | "mrope") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear { factor: factor()? },
            Some("llama3") => {
                let number = |field: &str, default: f64| -> Result<f64, LoadError> {
                    Ok(nested.opt_f64(field).map_err(named)?.unwrap_or(default))
                };
                let (low, high) = (number("low_freq_factor", 1.0)?, number("high_freq_factor", 4.0)?);
                if !(low.is_finite() && high.is_finite() && low > 0.0 && high > low) {
                    return Err(named(LoadError::Config {
                        field: "high_freq_factor".into(),
                        reason: format!("{high} must be above low_freq_factor ({low}), which must be > 0"),
                    }));
                }
                RopeScaling::Llama3 {
                    factor: factor()?,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: original()?.unwrap_or(8192),
                }
            }
            Some("yarn") => RopeScaling::Yarn {
                factor: factor()?,
                original_max_position_embeddings: original()?,
                // Given, or from `mscale` and `mscale_all_dim` where both are (DeepSeek's,
                // Ministral 3's): the ratio of their attention factors (transformers' rule).
                attention_factor: match nested.opt_f64("attention_factor").map_err(named)? {
                    Some(a) => Some(a),
                    None => {
                        let (m, all) = (
                            nested.opt_f64("mscale").map_err(named)?,
                            nested.opt_f64("mscale_all_dim").map_err(named)?,
                        );
                        match (m, all) {
                            (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                                Some(yarn_mscale(factor()?, m) / yarn_mscale(factor()?, all))
                            }
                            _ => None,
                        }
                    }
                },
                beta_fast: nested.opt_f64("beta_fast").map_err(named)?.unwrap_or(32.0),
                beta_slow: nested.opt_f64("beta_slow").map_err(named)?.unwrap_or(1.0),
                truncate: nested.opt_bool("truncate").map_err(named)?.unwrap_or(arch.yarn_truncate),
            },
            Some("longrope" | "su") => {
                let factors = |field: &str| -> Result<Vec<f32>, LoadError> {
                    let bad = |reason: String| named(LoadError::Config { field: field.into(), reason });
                    let Some(Value::Array(items)) = nested.get(field) else {
                        return Err(bad("missing: LongRoPE needs a list of factors".into()));
                    };
                    items
                        .iter()
                        .map(|v| match v.as_f64() {
                            Some(f) if f.is_finite() && f > 0.0 => Ok(f as f32),
                            _ => Err(bad(format!("{v} is not a positive number"))),
                        })
                        .collect()
                };
                let original = match original()? {
                    Some(o) => o,
                    None => self.opt_usize("original_max_position_embeddings")?.ok_or_else(|| {
                        named(LoadError::Config {
                            field: "original_max_position_embeddings".into(),
                            reason: "missing: LongRoPE switches its factors past it".into(),
                        })
                    })?,
                };
                if original < 2 {
                    let reason = format!("{original} must be at least 2");
                    return Err(named(LoadError::Config { field: "original_max_position_embeddings".into(), reason }));
                }
                let factor = match nested.opt_f64("factor").map_err(named)? {
                    Some(f) => f,
                    None => self.usize("max_position_embeddings")? as f64 / original as f64,
                };
                let attention_factor = match nested.opt_f64("attention_factor").map_err(named)? {
                    Some(a) => a,
                    None if factor <= 1.0 => 1.0,
                    None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
                };
                RopeScaling::LongRope {
                    short: factors("short_factor")?,
                    long: factors("long_factor")?,
                    original,
                    attention_factor,
                }
            }
            Some(other) => {
                return Err(named(LoadError::Config {
                    field: "rope_type".into(),
                    reason: format!("`{other}` is not supported (default, linear, llama3, yarn, longrope)"),
                }));
            }
        };
        let query = match nested.opt_f64("llama_4_scaling_beta").map_err(named)? {
            Some(beta) if beta != 0.0 => {
                let missing = || LoadError::Config {
                    field: format!("{section}.original_max_position_embeddings"),
                    reason: "missing: llama_4_scaling_beta scales queries past it".into(),
                };
                let original = original()?.filter(|&o| o > 0).ok_or_else(missing)?;
                if !beta.is_finite() {
                    let reason = format!("{beta} must be a finite number");
                    return Err(named(LoadError::Config { field: "llama_4_scaling_beta".into(), reason }));
                }
                Some(QueryScaling { beta, original })
            }
            _ => None,
        };
        Ok((theta, scaling, partial, query))
    }

    fn dtype(&self, field: &str) -> Result<Option<CheckpointDtype>, LoadError> {
        Ok(match self.opt_str(field)?.as_deref() {
            None => None,
            Some("float32") => Some(CheckpointDtype::F32),
            Some("float16") => Some(CheckpointDtype::F16),
            Some("bfloat16") => Some(CheckpointDtype::Bf16),
            Some(other) => {
                return Err(LoadError::Config {
                    field: field.into(),
                    reason: format!("unsupported dtype `{other}` (float32, float16, bfloat16)"),
                });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"{"model_type":"qwen2","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"intermediate_size":128,"vocab_size":1024,"max_position_embeddings":256,
        "rms_norm_eps":1e-6,"rope_theta":10000.0,"tie_word_embeddings":true,"torch_dtype":"float32",
        "bos_token_id":956,"eos_token_id":958}"#;

    fn with(field: &str, value: &str) -> String {
        let mut v: Value = serde_json::from_str(TINY).unwrap();
        v[field] = serde_json::from_str(value).unwrap();
        v.to_string()
    }

    fn field_of(err: LoadError) -> String {
        match err {
            LoadError::Config { field, .. } => field,
            other => panic!("expected a config error, got {other}"),
        }
    }

    #[test]
    fn parses_a_valid_config_and_derives_head_dim() {
        let c = ModelConfig::from_json_str(TINY).unwrap();
        assert_eq!((c.head_dim, c.num_key_value_heads, c.eos_token_ids.clone()), (16, 2, vec![958]));
        assert!(c.tie_word_embeddings);
    }

    #[test]
    fn eos_may_be_a_list() {
        let c = ModelConfig::from_json_str(&with("eos_token_id", "[958, 956]")).unwrap();
        assert_eq!(c.eos_token_ids, vec![958, 956]);
    }

    #[test]
    fn inconsistent_head_size_names_hidden_size() {
        let err = ModelConfig::from_json_str(&with("hidden_size", "66")).unwrap_err();
        assert_eq!(field_of(err), "hidden_size");
    }

    #[test]
    fn kv_heads_must_divide_heads() {
        for kv in ["3", "8", "0"] {
            let err = ModelConfig::from_json_str(&with("num_key_value_heads", kv)).unwrap_err();
            assert_eq!(field_of(err), "num_key_value_heads", "kv heads {kv}");
        }
    }

    #[test]
    fn zero_sizes_are_rejected_by_name() {
        for field in ["num_hidden_layers", "vocab_size", "max_position_embeddings", "intermediate_size"] {
            let err = ModelConfig::from_json_str(&with(field, "0")).unwrap_err();
            assert_eq!(field_of(err), field);
        }
    }

    #[test]
    fn wrong_types_name_the_field() {
        let err = ModelConfig::from_json_str(&with("num_attention_heads", "\"four\"")).unwrap_err();
        assert!(err.to_string().contains("num_attention_heads"), "{err}");
        let err = ModelConfig::from_json_str(&with("rope_theta", "[]")).unwrap_err();
        assert_eq!(field_of(err), "rope_theta");
        let err = ModelConfig::from_json_str(&with("torch_dtype", "\"int8\"")).unwrap_err();
        assert_eq!(field_of(err), "torch_dtype");
    }

    #[test]
    fn special_ids_must_be_in_the_vocabulary() {
        let err = ModelConfig::from_json_str(&with("eos_token_id", "151645")).unwrap_err();
        assert_eq!(field_of(err), "eos_token_id");
    }

    #[test]
    fn missing_required_field_is_named() {
        let mut v: Value = serde_json::from_str(TINY).unwrap();
        v.as_object_mut().unwrap().remove("vocab_size");
        let err = ModelConfig::from_json_str(&v.to_string()).unwrap_err();
        assert_eq!(field_of(err), "vocab_size");
    }

    #[test]
    fn transformers_5_layout_is_read() {
        let mut v: Value = serde_json::from_str(TINY).unwrap();
        let obj = v.as_object_mut().unwrap();
        obj.remove("rope_theta");
        obj.remove("torch_dtype");
        obj.insert("dtype".into(), "bfloat16".into());
        obj.insert("rope_parameters".into(), serde_json::json!({"rope_theta": 1e6, "rope_type": "default"}));
        let c = ModelConfig::from_json_str(&v.to_string()).unwrap();
        assert_eq!((c.rope_theta, c.torch_dtype), (1e6, Some(CheckpointDtype::Bf16)));
    }

    #[test]
    fn yarn_mscales_and_llama4_query_scaling_are_read() {
        let p = r#"{"rope_type":"yarn","factor":16.0,"original_max_position_embeddings":32,"mscale":1.0,
                    "mscale_all_dim":0.5,"llama_4_scaling_beta":0.1}"#;
        let c = ModelConfig::from_json_str(&with("rope_parameters", p)).unwrap();
        let want = (0.1 * 16f64.ln() + 1.0) / (0.05 * 16f64.ln() + 1.0);
        assert!(
            matches!(c.rope_scaling, RopeScaling::Yarn { attention_factor: Some(a), .. } if (a - want).abs() < 1e-12)
        );
        let q = c.query_scaling.unwrap();
        assert_eq!((q.at(0), q.at(31)), (1.0, 1.0));
        assert!(
            (q.at(32) - (1.0 + 0.1 * 2f32.ln())).abs() < 1e-6 && (q.at(100) - (1.0 + 0.1 * 4f32.ln())).abs() < 1e-6
        );
        // Without both mscales, YaRN's own factor; without an original context, no query scaling.
        let p = r#"{"rope_type":"yarn","factor":16.0,"mscale":1.0,"llama_4_scaling_beta":0.1}"#;
        let err = ModelConfig::from_json_str(&with("rope_parameters", p)).unwrap_err();
        assert_eq!(field_of(err), "rope_parameters.original_max_position_embeddings");
        let p = r#"{"rope_type":"yarn","factor":16.0,"mscale":1.0}"#;
        let c = ModelConfig::from_json_str(&with("rope_parameters", p)).unwrap();
        assert!(
            matches!(c.rope_scaling, RopeScaling::Yarn { attention_factor: None, .. }) && c.query_scaling.is_none()
        );
    }

    #[test]
    fn rope_scaling_is_read_and_unknown_kinds_are_refused_by_name() {
        let c = ModelConfig::from_json_str(&with("rope_scaling", r#"{"type":"yarn","factor":4.0}"#)).unwrap();
        assert!(matches!(
            c.rope_scaling,
            RopeScaling::Yarn { factor: 4.0, original_max_position_embeddings: None, .. }
        ));
        let llama3 = r#"{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_theta":500000.0}"#;
        let c = ModelConfig::from_json_str(&with("rope_parameters", llama3)).unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert!(matches!(
            c.rope_scaling,
            RopeScaling::Llama3 { factor: 32.0, original_max_position_embeddings: 8192, .. }
        ));
        let err = ModelConfig::from_json_str(&with("rope_scaling", r#"{"type":"dynamic","factor":4.0}"#)).unwrap_err();
        assert_eq!(field_of(err), "rope_scaling.rope_type");
        // LongRoPE needs its original context and one factor per rotated frequency (8 here).
        let err = ModelConfig::from_json_str(&with("rope_scaling", r#"{"type":"longrope","factor":4.0}"#)).unwrap_err();
        assert_eq!(field_of(err), "rope_scaling.original_max_position_embeddings");
        let factors = |n: usize| format!("[{}]", vec!["1.5"; n].join(","));
        let longrope = |n: usize| {
            format!(
                r#"{{"type":"longrope","original_max_position_embeddings":64,"short_factor":{},"long_factor":{}}}"#,
                factors(n),
                factors(n)
            )
        };
        let err = ModelConfig::from_json_str(&with("rope_scaling", &longrope(5))).unwrap_err();
        assert_eq!(field_of(err), "rope_scaling.short_factor");
        let c = ModelConfig::from_json_str(&with("rope_scaling", &longrope(8))).unwrap();
        let want = (1.0 + 4f64.ln() / 64f64.ln()).sqrt(); // 256 / 64
        assert!(
            matches!(c.rope_scaling, RopeScaling::LongRope { original: 64, attention_factor, .. } if (attention_factor - want).abs() < 1e-12)
        );
        let err = ModelConfig::from_json_str(&with("rope_parameters", r#"{"rope_type":"yarn"}"#)).unwrap_err();
        assert_eq!(field_of(err), "rope_parameters.factor");
        let err =
            ModelConfig::from_json_str(&with("rope_parameters", r#"{"rope_type":"linear","factor":0.5}"#)).unwrap_err();
        assert_eq!(field_of(err), "rope_parameters.factor");
        let bad_llama3 = r#"{"rope_type":"llama3","factor":8.0,"low_freq_factor":4.0,"high_freq_factor":4.0}"#;
        let err = ModelConfig::from_json_str(&with("rope_parameters", bad_llama3)).unwrap_err();
        assert_eq!(field_of(err), "rope_parameters.high_freq_factor");
    }

    #[test]
    fn families_differ_in_biases_head_size_and_norms() {
        let qwen2 = ModelConfig::from_json_str(TINY).unwrap();
        assert!(qwen2.qkv_bias && !qwen2.o_bias && !qwen2.qk_norm);
        let qwen3 = ModelConfig::from_json_str(&with("model_type", r#""qwen3""#)).unwrap();
        assert_eq!((qwen3.head_dim, qwen3.qkv_bias, qwen3.qk_norm), (128, false, true));
        let mut v: Value = serde_json::from_str(TINY).unwrap();
        v["model_type"] = "llama".into();
        v["attention_bias"] = true.into();
        v["head_dim"] = 32.into();
        let llama = ModelConfig::from_json_str(&v.to_string()).unwrap();
        assert_eq!((llama.head_dim, llama.qkv_bias, llama.o_bias, llama.qk_norm), (32, true, true, false));
    }

    #[test]
    fn moe_families_read_their_experts_and_dense_layers() {
        let mut v: Value = serde_json::from_str(TINY).unwrap();
        v["model_type"] = "qwen3_moe".into();
        v["num_experts"] = 8.into();
        v["num_experts_per_tok"] = 2.into();
        v["moe_intermediate_size"] = 32.into();
        v["norm_topk_prob"] = true.into();
        v["mlp_only_layers"] = serde_json::json!([1]);
        let c = ModelConfig::from_json_str(&v.to_string()).unwrap();
        let m = c.moe.clone().unwrap();
        assert_eq!((m.experts, m.experts_per_token, m.intermediate_size, m.shared_intermediate_size), (8, 2, 32, None));
        assert!(m.norm_topk_prob && c.is_moe_layer(0) && !c.is_moe_layer(1));
        v["num_experts_per_tok"] = 9.into();
        assert_eq!(field_of(ModelConfig::from_json_str(&v.to_string()).unwrap_err()), "num_experts_per_tok");
        v["num_experts_per_tok"] = 2.into();
        v["mlp_only_layers"] = serde_json::json!([5]);
        assert_eq!(field_of(ModelConfig::from_json_str(&v.to_string()).unwrap_err()), "mlp_only_layers");
        // Qwen2-MoE: a shared expert, q/k/v biases unless qkv_bias is false, every other layer
        // sparse with decoder_sparse_step 2.
        v["model_type"] = "qwen2_moe".into();
        v["mlp_only_layers"] = serde_json::json!([]);
        v["decoder_sparse_step"] = 2.into();
        assert_eq!(
            field_of(ModelConfig::from_json_str(&v.to_string()).unwrap_err()),
            "shared_expert_intermediate_size"
        );
        v["shared_expert_intermediate_size"] = 48.into();
        let c = ModelConfig::from_json_str(&v.to_string()).unwrap();
        assert_eq!(c.moe.as_ref().unwrap().shared_intermediate_size, Some(48));
        assert!(c.qkv_bias && !c.is_moe_layer(0) && c.is_moe_layer(1));
    }

    /// Latent attention's sizes, its cache's one head of [rotated part, latent], the scores'
    /// scale (YaRN's mscale² where `mscale_all_dim` says), the router each model type's configs
    /// choose, and what is refused by name.
    #[test]
    fn latent_attention_is_read_and_its_unsupported_variants_are_named() {
        let text = |extra: &str| {
            format!(
                r#"{{"model_type":"deepseek_v2","hidden_size":64,"num_hidden_layers":3,"num_attention_heads":4,
                "num_key_value_heads":4,"intermediate_size":128,"vocab_size":64,"moe_intermediate_size":32,
                "n_routed_experts":8,"num_experts_per_tok":2,"q_lora_rank":null,"kv_lora_rank":32,
                "qk_nope_head_dim":24,"qk_rope_head_dim":16,"v_head_dim":20,"head_dim":16,
                "max_position_embeddings":256{extra}}}"#
            )
        };
        let c = ModelConfig::from_json_str(&text(r#","scoring_func":"softmax","first_k_dense_replace":1"#)).unwrap();
        let l = c.latent.clone().unwrap();
        assert_eq!((l.q_rank, l.kv_rank, l.qk_dim(), l.v_dim, l.interleaved), (None, 32, 40, 20, true));
        assert_eq!((c.head_dim, c.num_key_value_heads, c.rotary_dim, c.attention_scalar), (48, 1, 16, Some(40.0)));
        let m = c.moe.clone().unwrap();
        assert_eq!((m.routing, m.dense_layers), (Routing::Softmax, vec![0]));
        // V3's and GLM-4.7-Flash's router where the config does not say; GLM's list of layer kinds.
        let c = ModelConfig::from_json_str(&text(r#","mlp_layer_types":["dense","sparse","dense"]"#)).unwrap();
        let m = c.moe.unwrap();
        assert_eq!((m.routing, m.dense_layers), (Routing::Sigmoid { groups: 1, groups_used: 1 }, vec![0, 2]));
        let yarn = r#","rope_scaling":{"type":"yarn","factor":4.0,"original_max_position_embeddings":64,
                    "mscale":0.707,"mscale_all_dim":0.707}"#;
        let c = ModelConfig::from_json_str(&text(yarn)).unwrap();
        let mscale = 0.1 * 0.707 * 4f64.ln() + 1.0;
        assert!((c.attention_scalar.unwrap() - 40.0 / mscale.powi(4)).abs() < 1e-9, "{:?}", c.attention_scalar);
        for (extra, field) in [
            (r#","attention_bias":true"#, "attention_bias"),
            (r#","scoring_func":"sqrtsoftplus""#, "scoring_func"),
            (
                r#","scoring_func":"softmax","topk_method":"group_limited_greedy","n_group":2,"topk_group":1"#,
                "topk_method",
            ),
            (r#","mlp_layer_types":["dense"]"#, "mlp_layer_types"),
            (r#","qk_rope_head_dim":15"#, "qk_rope_head_dim"),
        ] {
            let err = ModelConfig::from_json_str(&text(extra).replacen(
                r#""qk_rope_head_dim":16,"#,
                "",
                usize::from(field == "qk_rope_head_dim"),
            ))
            .unwrap_err();
            assert_eq!(field_of(err), field, "{extra}");
        }
    }

    /// Mistral 4's language model: latent attention, a softmax router (its top-k renormalised),
    /// Llama 4's query scaling; read so as a Mistral 3 checkpoint's `text_config` too, whose
    /// wrapper names another family (as Mistral Small 3.1's, whose layers are Mistral's). Its
    /// router choosing within groups is refused by name.
    #[test]
    fn mistral4_is_read_alone_and_as_mistral3s_language_model() {
        let text = r#"{"model_type":"mistral4","hidden_size":64,"num_hidden_layers":3,"num_attention_heads":4,
            "num_key_value_heads":4,"intermediate_size":128,"vocab_size":64,"moe_intermediate_size":24,
            "n_routed_experts":8,"num_experts_per_tok":2,"n_shared_experts":1,"q_lora_rank":24,"kv_lora_rank":32,
            "qk_nope_head_dim":24,"qk_rope_head_dim":32,"v_head_dim":20,"first_k_dense_replace":1,
            "norm_topk_prob":true,"n_group":1,"topk_group":1,"max_position_embeddings":256,
            "rope_parameters":{"rope_type":"yarn","rope_theta":10000.0,"factor":16.0,
            "original_max_position_embeddings":32,"mscale":1.0,"mscale_all_dim":1.0,"llama_4_scaling_beta":0.5}}"#;
        let alone = ModelConfig::from_json_str(text).unwrap();
        assert_eq!(alone.arch.name, "mistral4");
        assert_eq!((alone.head_dim, alone.num_key_value_heads, alone.rotary_dim), (64, 1, 32));
        let m = alone.moe.clone().unwrap();
        assert_eq!((m.routing, m.norm_topk_prob, m.dense_layers.clone()), (Routing::Softmax, true, vec![0]));
        assert_eq!(alone.query_scaling.map(|q| (q.beta, q.original)), Some((0.5, 32)));
        let wrapped = format!(r#"{{"model_type":"mistral3","text_config":{text}}}"#);
        assert_eq!(ModelConfig::from_json_str(&wrapped).unwrap(), alone);
        let small31 = with("model_type", r#""mistral""#);
        let wrapped = format!(r#"{{"model_type":"mistral3","text_config":{small31}}}"#);
        assert_eq!(ModelConfig::from_json_str(&wrapped).unwrap().arch.name, "mistral");
        let grouped = text.replace(r#""n_group":1,"topk_group":1"#, r#""n_group":4,"topk_group":2"#);
        assert_eq!(field_of(ModelConfig::from_json_str(&grouped).unwrap_err()), "topk_group");
    }

    /// Qwen3-VL's checkpoints: the language model's config under `text_config` (`qwen3_vl_text`,
    /// `qwen3_vl_moe_text`) with its interleaved M-RoPE sections, read as Qwen3's and Qwen3-MoE's
    /// layers (the MoE's top-k always renormalised, its head size hidden / heads by default).
    #[test]
    fn qwen3_vl_configs_are_their_language_models() {
        let text = |model_type: &str, extra: &str| {
            format!(
                r#"{{"model_type":"{model_type}","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
                "num_key_value_heads":2,"intermediate_size":128,"vocab_size":64,"max_position_embeddings":256,
                "rope_parameters":{{"rope_type":"default","rope_theta":5000000.0,"mrope_section":[6,5,5],
                "mrope_interleaved":true}}{extra}}}"#
            )
        };
        let wrapped = |top: &str, text: String| {
            format!(
                r#"{{"model_type":"{top}","tie_word_embeddings":true,"text_config":{text},"vision_config":{{"depth":1}}}}"#
            )
        };
        let dense =
            ModelConfig::from_json_str(&wrapped("qwen3_vl", text("qwen3_vl_text", r#","head_dim":32"#))).unwrap();
        assert_eq!(
            (dense.arch.name, dense.head_dim, dense.qk_norm, dense.tie_word_embeddings),
            ("qwen3_vl", 32, true, true)
        );
        assert_eq!((dense.rotary_dim, dense.rope_theta), (32, 5000000.0));
        let mrope = dense.mrope.unwrap();
        assert_eq!(mrope, MRope { sections: [6, 5, 5], interleaved: true });
        // Interleaved: t h w t h w …, the pairs past 3 × a section temporal.
        let streams: Vec<usize> = (0..16).map(|i| mrope.stream(i)).collect();
        assert_eq!(streams, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        let split = MRope { sections: [2, 3, 3], interleaved: false };
        assert_eq!((0..8).map(|i| split.stream(i)).collect::<Vec<_>>(), [0, 0, 1, 1, 1, 2, 2, 2]);
        // Taken in turn, the sections must cover the rotated pairs.
        let split = text("qwen3_vl_text", r#","head_dim":16"#).replace(r#""mrope_interleaved":true"#, r#""x":0"#);
        let err = ModelConfig::from_json_str(&wrapped("qwen3_vl", split)).unwrap_err();
        assert!(err.to_string().contains("mrope_section"), "{err}");
        let moe_text =
            text("qwen3_vl_moe_text", r#","num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":24"#);
        let moe = ModelConfig::from_json_str(&wrapped("qwen3_vl_moe", moe_text)).unwrap();
        assert_eq!((moe.arch.name, moe.head_dim), ("qwen3_vl_moe", 16));
        let m = moe.moe.unwrap();
        assert_eq!((m.experts, m.experts_per_token, m.intermediate_size, m.norm_topk_prob), (8, 2, 24, true));
    }

    #[test]
    fn unsupported_families_and_features_are_named() {
        let err = ModelConfig::from_json_str(&with("model_type", r#""deepseek_v32""#)).unwrap_err();
        assert!(err.to_string().contains("sparse attention"), "{err}");
        let err = ModelConfig::from_json_str(&with("model_type", r#""bert""#)).unwrap_err();
        assert!(err.to_string().contains("qwen2, qwen3, llama, qwen2_moe, qwen3_moe"), "{err}");
        for (field, value) in [
            ("mlp_bias", "true"),
            ("use_sliding_window", "true"),
            ("hidden_act", r#""gelu""#),
            ("use_bidirectional_attention", "true"),
        ] {
            let err = ModelConfig::from_json_str(&with(field, value)).unwrap_err();
            assert_eq!(field_of(err), field);
        }
        let err = ModelConfig::from_json_str(&with("head_dim", "15")).unwrap_err();
        assert_eq!(field_of(err), "head_dim");
    }

    /// Gemma 3's local layers, their rotary base and the global layers' scaling, as its released
    /// configs and transformers ≥ 5 write them; Gemma 2's alternating layers and soft-caps; bad
    /// values are errors naming their field.
    #[test]
    fn gemma_configs_are_read_as_the_hub_and_transformers_5_write_them() {
        // Gemma 3 4B's text config as released: a local base, linear scaling, a window and its
        // pattern, no `layer_types`.
        let hub = r#"{"model_type":"gemma3_text","hidden_size":2560,"num_hidden_layers":34,"num_attention_heads":8,
            "num_key_value_heads":4,"head_dim":256,"intermediate_size":10240,"vocab_size":262208,
            "max_position_embeddings":131072,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,
            "rope_scaling":{"factor":8.0,"rope_type":"linear"},"sliding_window":1024,"sliding_window_pattern":6,
            "query_pre_attn_scalar":256,"hidden_activation":"gelu_pytorch_tanh","final_logit_softcapping":null,
            "attn_logit_softcapping":null}"#;
        let c = ModelConfig::from_json_str(hub).unwrap();
        assert_eq!(
            (c.arch.name, c.rope_theta, c.rope_scaling.clone()),
            ("gemma3", 1e6, RopeScaling::Linear { factor: 8.0 })
        );
        let s = c.sliding.as_ref().unwrap();
        assert_eq!((s.window, s.rope_theta), (1024, Some(10_000.0)));
        assert_eq!(s.layers.iter().filter(|&&l| !l).count(), 5, "layers 5, 11, …, 29 are global");
        assert!(s.layers[4] && !s.layers[5] && s.layers[6] && c.is_local_layer(33) && !c.is_local_layer(29));
        assert_eq!(
            (c.activation, c.attention_scalar, c.attention_softcap, c.logit_softcap),
            (Activation::GeluTanh, Some(256.0), None, None)
        );
        assert_eq!(c.embedding_scale, Some(2560f32.sqrt()));
        assert!(c.zero_centred_norms && c.sandwich_norms && c.qk_norm && c.tie_word_embeddings);
        // transformers ≥ 5: per kind of layer.
        let v5 = hub.replace(r#""rope_theta":1000000.0,"rope_local_base_freq":10000.0,"#, "").replace(
            r#""rope_scaling":{"factor":8.0,"rope_type":"linear"}"#,
            r#""rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":1000000.0},
                    "sliding_attention":{"rope_type":"default","rope_theta":10000.0}}"#,
        );
        assert_eq!(ModelConfig::from_json_str(&v5).unwrap(), c);
        let local_scaled =
            v5.replace(r#""rope_type":"default","rope_theta":10000.0"#, r#""rope_type":"linear","factor":2.0"#);
        let err = ModelConfig::from_json_str(&local_scaled).unwrap_err();
        assert_eq!(field_of(err), "rope_parameters.sliding_attention.rope_type");
        let listed =
            hub.replace(r#""sliding_window_pattern":6"#, r#""layer_types":["full_attention","sliding_attention"]"#);
        assert_eq!(field_of(ModelConfig::from_json_str(&listed).unwrap_err()), "layer_types");
        // Gemma 2: layers alternate, the first local; one rotary base; soft-capping.
        let gemma2 = r#"{"model_type":"gemma2","hidden_size":3584,"num_hidden_layers":42,"num_attention_heads":16,
            "num_key_value_heads":8,"head_dim":256,"intermediate_size":14336,"vocab_size":256000,
            "max_position_embeddings":8192,"rope_theta":10000.0,"sliding_window":4096,"query_pre_attn_scalar":256,
            "hidden_act":"gelu_pytorch_tanh","hidden_activation":"gelu_pytorch_tanh",
            "final_logit_softcapping":30.0,"attn_logit_softcapping":50.0}"#;
        let c = ModelConfig::from_json_str(gemma2).unwrap();
        // Gemma 3 4B's multimodal config as released: its text model's sizes, transformers'
        // defaults for the rest.
        let released = r#"{"architectures":["Gemma3ForConditionalGeneration"],"model_type":"gemma3",
            "text_config":{"hidden_size":2560,"intermediate_size":10240,"model_type":"gemma3_text",
            "num_hidden_layers":34,"rope_scaling":{"factor":8.0,"rope_type":"linear"},"sliding_window":1024},
            "vision_config":{"model_type":"siglip_vision_model"},"torch_dtype":"bfloat16"}"#;
        let r = ModelConfig::from_json_str(released).unwrap();
        assert_eq!((r.num_attention_heads, r.num_key_value_heads, r.head_dim, r.vocab_size), (8, 4, 256, 262_208));
        assert_eq!((r.max_position_embeddings, r.rope_theta, r.attention_scalar), (131_072, 1e6, Some(256.0)));
        assert_eq!((r.sliding.as_ref().unwrap().rope_theta, r.tie_word_embeddings), (Some(10_000.0), true));
        // An explicit null is kept: no soft-cap.
        let uncapped = gemma2.replace("\"final_logit_softcapping\":30.0", "\"final_logit_softcapping\":null");
        assert_eq!(ModelConfig::from_json_str(&uncapped).unwrap().logit_softcap, None);
        let s = c.sliding.as_ref().unwrap();
        assert_eq!(
            (s.window, s.rope_theta, s.layers[0], s.layers[1], s.layers[40]),
            // Gemma 2's local layers rotate as its global ones.
            (4096, None, true, false, true)
        );
        assert_eq!((c.attention_softcap, c.logit_softcap, c.qk_norm), (Some(50.0), Some(30.0), false));
        let err = ModelConfig::from_json_str(
            &gemma2.replace("\"attn_logit_softcapping\":50.0", "\"attn_logit_softcapping\":-1"),
        )
        .unwrap_err();
        assert_eq!(field_of(err), "attn_logit_softcapping");
        let err = ModelConfig::from_json_str(
            &gemma2.replace("\"hidden_activation\":\"gelu_pytorch_tanh\"", "\"hidden_activation\":\"relu\""),
        )
        .unwrap_err();
        assert_eq!(field_of(err), "hidden_activation");
    }

    /// Mistral's sliding window caps its context (within it attention is full); none, or a
    /// family that does not keep to its window (Qwen2 without `use_sliding_window`), leaves it.
    #[test]
    fn a_mistral_sliding_window_caps_the_context() {
        let config = |model_type: &str, window: &str| {
            let json = format!(
                r#"{{"model_type":"{model_type}","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
                "intermediate_size":128,"vocab_size":100,"max_position_embeddings":32768,"sliding_window":{window}}}"#
            );
            ModelConfig::from_json_str(&json).unwrap().max_position_embeddings
        };
        assert_eq!(config("mistral", "4096"), 4096);
        assert_eq!(config("mistral", "null"), 32768);
        assert_eq!(config("mistral", "65536"), 32768);
        assert_eq!(config("qwen2", "4096"), 32768);
    }

    /// Qwen3.5's released layout: the language model's config under `text_config` (its own
    /// `model_type` `qwen3_5_text` also names the family), rotary on a quarter of each head,
    /// every fourth layer in full attention when `layer_types` is not given; bad linear sizes
    /// are errors naming their field.
    #[test]
    fn a_qwen35_config_is_read_from_its_text_config() {
        let text = r#""model_type":"qwen3_5_text","hidden_size":64,"num_hidden_layers":8,"num_attention_heads":4,
            "num_key_value_heads":2,"head_dim":32,"intermediate_size":8,"vocab_size":8,"max_position_embeddings":256,
            "linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":16,"linear_value_head_dim":16,
            "rope_parameters":{"rope_type":"default","rope_theta":1e7,"partial_rotary_factor":0.25,
            "mrope_section":[2,1,1],"mrope_interleaved":true}"#;
        let nested = format!(r#"{{"model_type":"qwen3_5","tie_word_embeddings":true,"text_config":{{{text}}}}}"#);
        for json in [nested, format!("{{{text}}}")] {
            let c = ModelConfig::from_json_str(&json).unwrap();
            assert_eq!(
                (c.arch.name, c.rotary_dim, c.attn_output_gate, c.zero_centred_norms),
                ("qwen3_5", 8, true, true)
            );
            let a = c.linear.as_ref().unwrap();
            assert_eq!(a.layers, [true, true, true, false, true, true, true, false]);
            assert_eq!((a.conv_dim(), a.state_floats()), (128, (128 * 3, 4 * 16 * 16)));
            assert_eq!((c.attention_layers(), c.is_linear_layer(3), c.is_linear_layer(4)), (2, false, true));
        }
        let c = ModelConfig::from_json_str(&format!(r#"{{"model_type":"qwen3_5","text_config":{{{text}}}}}"#)).unwrap();
        assert!(!c.tie_word_embeddings);
        let bad = text.replace(r#""linear_num_value_heads":4"#, r#""linear_num_value_heads":3"#);
        let err = ModelConfig::from_json_str(&format!("{{{bad}}}")).unwrap_err();
        assert!(matches!(&err, LoadError::Config { field, .. } if field == "linear_num_value_heads"), "{err}");
        let bad = text.replace(r#""num_hidden_layers":8"#, r#""num_hidden_layers":8,"layer_types":["full_attention"]"#);
        let err = ModelConfig::from_json_str(&format!("{{{bad}}}")).unwrap_err();
        assert!(matches!(&err, LoadError::Config { field, .. } if field == "layer_types"), "{err}");
        let bad = text.replace("0.25", "1.5");
        let err = ModelConfig::from_json_str(&format!("{{{bad}}}")).unwrap_err();
        assert!(err.to_string().contains("partial_rotary_factor"), "{err}");
    }

    /// SmolLM3's NoPE layers: listed per layer (`no_rope_layers`, 1 where q and k turn), else
    /// every `no_rope_layer_interval`-th (4 when not given, as its GGUF files are read); a
    /// list of another length or a flag other than 0 or 1 is refused by name. Llama's layers all
    /// turn.
    #[test]
    fn smollm3s_unrotated_layers_are_listed_or_every_fourth() {
        let layers = |l: &str| {
            format!(
                r#"{{"model_type":"smollm3","hidden_size":2048,"num_hidden_layers":8,"num_attention_heads":16,
                "num_key_value_heads":4,"intermediate_size":11008,"vocab_size":128256,"rope_theta":5000000.0,
                "max_position_embeddings":65536{l}}}"#
            )
        };
        let every_fourth = Some(vec![false, false, false, true, false, false, false, true]);
        let c = ModelConfig::from_json_str(&layers("")).unwrap();
        assert_eq!((c.arch.name, c.unrotated.clone(), c.tie_word_embeddings), ("smollm3", every_fourth.clone(), true));
        assert!(c.is_unrotated_layer(7) && !c.is_unrotated_layer(6) && !c.is_unrotated_layer(8));
        let listed = ModelConfig::from_json_str(&layers(r#","no_rope_layers":[1,1,1,0,1,1,1,0]"#)).unwrap();
        assert_eq!(listed.unrotated, every_fourth);
        let other = ModelConfig::from_json_str(&layers(r#","no_rope_layers":[0,1,1,1,1,1,1,1]"#)).unwrap();
        assert_eq!(other.unrotated.unwrap().iter().filter(|&&u| u).count(), 1);
        let all = ModelConfig::from_json_str(&layers(r#","no_rope_layers":[1,1,1,1,1,1,1,1]"#)).unwrap();
        assert_eq!(all.unrotated, None);
        let second = ModelConfig::from_json_str(&layers(r#","no_rope_layer_interval":2"#)).unwrap();
        assert_eq!(second.unrotated.unwrap().iter().filter(|&&u| u).count(), 4);
        for (bad, field) in [
            (r#","no_rope_layers":[1,1,1,0]"#, "no_rope_layers"),
            (r#","no_rope_layers":[1,1,1,2,1,1,1,0]"#, "no_rope_layers"),
            (r#","no_rope_layer_interval":0"#, "no_rope_layer_interval"),
        ] {
            assert_eq!(field_of(ModelConfig::from_json_str(&layers(bad)).unwrap_err()), field, "{bad}");
        }
        let llama = layers(r#","no_rope_layers":[1,1,1,0,1,1,1,0]"#).replace("smollm3", "llama");
        assert_eq!(ModelConfig::from_json_str(&llama).unwrap().unrotated, None);
    }

    /// OLMo 2's blocks: no input norms, the outputs normed, q and k normed over all their
    /// heads. OLMo 3's config as released (transformers 4.x: `rope_scaling` at the top) has its
    /// local layers listed; they rotate by the global base without the YaRN stretch.
    #[test]
    fn olmo2_norms_its_outputs_and_whole_queries_and_keys() {
        let olmo2 = r#"{"model_type":"olmo2","hidden_size":2048,"num_hidden_layers":16,"num_attention_heads":16,
            "num_key_value_heads":16,"intermediate_size":8192,"vocab_size":100352,"rope_theta":500000,
            "max_position_embeddings":4096,"rms_norm_eps":1e-6,"attention_bias":false}"#;
        let c = ModelConfig::from_json_str(olmo2).unwrap();
        assert_eq!(c.arch.name, "olmo2");
        assert!(!c.input_norms && c.sandwich_norms && c.qk_norm && c.whole_qk_norms && !c.tie_word_embeddings);
        let llama = ModelConfig::from_json_str(&olmo2.replace("olmo2", "llama")).unwrap();
        assert!(llama.input_norms && !llama.sandwich_norms && !llama.whole_qk_norms);
        assert_eq!(ModelConfig::from_json_str(&olmo2.replace("olmo2", "olmo3")).unwrap().sliding, None);
        let olmo3 = olmo2.replace("olmo2", "olmo3").replace(
            r#""attention_bias":false"#,
            r#""attention_bias":false,"sliding_window":4096,"rope_scaling":{"rope_type":"yarn","factor":8.0,
            "original_max_position_embeddings":8192,"attention_factor":1.2079},"layer_types":["sliding_attention",
            "sliding_attention","sliding_attention","full_attention","sliding_attention","sliding_attention",
            "sliding_attention","full_attention","sliding_attention","sliding_attention","sliding_attention",
            "full_attention","sliding_attention","sliding_attention","sliding_attention","full_attention"]"#,
        );
        let c = ModelConfig::from_json_str(&olmo3).unwrap();
        assert!(matches!(c.rope_scaling, RopeScaling::Yarn { .. }), "{:?}", c.rope_scaling);
        let s = c.sliding.as_ref().unwrap();
        assert_eq!((c.arch.name, s.window, s.rope_theta), ("olmo2", 4096, Some(500_000.0)));
        assert!(c.is_local_layer(0) && !c.is_local_layer(3) && c.is_local_layer(14) && !c.is_local_layer(15));
    }

    #[test]
    fn malformed_json_is_an_error() {
        assert!(matches!(ModelConfig::from_json_str("{\"hidden_size\": "), Err(LoadError::Json { .. })));
    }
}
