//! The decoder's weight slots: one declarative table from checkpoint names (Hugging Face's and
//! GGUF's, the same for every served family) to slots, which of them a config calls for (biases,
//! q/k norms), the expected shape of each, and their loading and validation.

use std::ops::Range;

use burn::tensor::{DType, Device, Tensor, TensorData};

use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::layers::{Linear, RmsNorm, Weight, linear};
use crate::tensors::{Naming, Stored, TensorSource, WeightDtype, load_f32, load_matrix};

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
    MlpNorm,
    MlpGate,
    MlpUp,
    MlpDown,
}

/// Model-level slots and their names: Hugging Face's, then GGUF's.
pub const GLOBAL_SLOTS: [(Slot, &str, &str); 3] = [
    (Slot::InEmbed, "model.embed_tokens.weight", "token_embd.weight"),
    (Slot::OutNorm, "model.norm.weight", "output_norm.weight"),
    (Slot::OutEmbed, "lm_head.weight", "output.weight"),
];

/// Per-layer slots and their names: under `model.layers.{i}.` (Hugging Face) and `blk.{i}.` (GGUF).
pub const LAYER_SLOTS: [(Slot, &str, &str); 15] = [
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
            Slot::MlpNorm => "mlp_norm_w",
            Slot::MlpGate => "mlp_gate_w",
            Slot::MlpUp => "mlp_up_w",
            Slot::MlpDown => "mlp_down_w",
        }
    }

    /// Whether a model of config `c` has this slot.
    pub fn present(self, c: &ModelConfig) -> bool {
        match self {
            Slot::OutEmbed => !c.tie_word_embeddings,
            Slot::AttnQBias | Slot::AttnKBias | Slot::AttnVBias => c.qkv_bias,
            Slot::AttnOBias => c.o_bias,
            Slot::AttnQNorm | Slot::AttnKNorm => c.qk_norm,
            _ => true,
        }
    }

    /// Expected shape; linear weights are `[out, in]`.
    pub fn shape(self, c: &ModelConfig) -> Vec<usize> {
        let (h, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let (q, kv) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        match self {
            Slot::InEmbed | Slot::OutEmbed => vec![v, h],
            Slot::OutNorm | Slot::AttnNorm | Slot::MlpNorm | Slot::AttnOBias => vec![h],
            Slot::AttnQBias => vec![q],
            Slot::AttnQNorm | Slot::AttnKNorm => vec![c.head_dim],
            Slot::AttnQ => vec![q, h],
            Slot::AttnO => vec![h, q],
            Slot::AttnK | Slot::AttnV => vec![kv, h],
            Slot::AttnKBias | Slot::AttnVBias => vec![kv],
            Slot::MlpGate | Slot::MlpUp => vec![i, h],
            Slot::MlpDown => vec![h, i],
        }
    }
}

/// The name of `slot` (of `layer` for per-layer slots) in `naming`, from the tables above.
pub fn name_of(slot: Slot, layer: Option<usize>, naming: Naming) -> String {
    let table: &[(Slot, &str, &str)] = if layer.is_some() { &LAYER_SLOTS } else { &GLOBAL_SLOTS };
    let (_, hf, gguf) = table.iter().find(|(s, _, _)| *s == slot).copied().unwrap_or((slot, "", ""));
    match (layer, naming) {
        (Some(l), Naming::Hf) => format!("model.layers.{l}.{hf}"),
        (Some(l), Naming::Gguf) => format!("blk.{l}.{gguf}"),
        (None, Naming::Hf) => hf.to_string(),
        (None, Naming::Gguf) => gguf.to_string(),
    }
}

/// Every tensor name the config calls for in `naming`, with its slot and layer.
pub fn expected(c: &ModelConfig, naming: Naming) -> Vec<(String, Slot, Option<usize>)> {
    let global = GLOBAL_SLOTS
        .iter()
        .filter(|(slot, _, _)| slot.present(c))
        .map(move |(slot, _, _)| (name_of(*slot, None, naming), *slot, None));
    let layers = (0..c.num_hidden_layers).flat_map(move |l| {
        LAYER_SLOTS
            .iter()
            .filter(|(slot, _, _)| slot.present(c))
            .map(move |(slot, _, _)| (name_of(*slot, Some(l), naming), *slot, Some(l)))
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

/// Checks every slot before anything is loaded: present, no strangers, shape and type right.
pub fn check(c: &ModelConfig, src: &dyn TensorSource) -> Result<(), LoadError> {
    let naming = src.naming();
    let want = expected(c, naming);
    let names = src.names();
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
        // Llama 3's rope scaling in a GGUF file, read with the config.
        .filter(|n| !(naming == Naming::Gguf && **n == ROPE_FREQS))
        .map(|n| n.to_string())
        .collect();
    if !unexpected.is_empty() {
        return Err(LoadError::UnexpectedTensors(unexpected));
    }
    for (name, slot, layer) in &want {
        check_one(c, *slot, *layer, &src.shape(name).unwrap_or_default())?;
        if let Some(Err(dtype)) = src.stored(name) {
            return Err(LoadError::Dtype { tensor: name.clone(), slot: slot.label(), layer: *layer, dtype });
        }
    }
    Ok(())
}

pub fn check_one(c: &ModelConfig, slot: Slot, layer: Option<usize>, found: &[usize]) -> Result<(), LoadError> {
    let expected = slot.shape(c);
    if found != expected.as_slice() {
        return Err(LoadError::Shape { slot: slot.label(), layer, expected, found: found.to_vec() });
    }
    Ok(())
}

/// A GGUF file's per-frequency rope divisors (llama.cpp writes Llama 3's scaling as this tensor).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// One decoder layer's weights. The projections that read the same input are stacked into one
/// matrix each (q, k, v; gate, up): one product per input instead of three or two, each streaming
/// a longer run of weight rows.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: RmsNorm,
    /// q, k, v stacked (rows as `qkv_rows`): [(heads + 2 · kv_heads) · head_dim, hidden], with
    /// their biases if the family has them.
    pub qkv: Linear,
    /// Per-head norms of q and k (\[head_dim\] each), applied before the rotary embedding.
    pub qk_norm: Option<[RmsNorm; 2]>,
    /// [hidden, heads · head_dim], with its bias if the family has one.
    pub o: Linear,
    pub mlp_norm: RmsNorm,
    /// gate, up stacked: [2 · intermediate, hidden].
    pub gate_up: Linear,
    pub down: Linear,
}

/// The rows of q, k and v in the stacked `qkv` matrix (and its bias), in load order.
pub fn qkv_rows(c: &ModelConfig) -> [Range<usize>; 3] {
    let (q, kv) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
    [0..q, q..q + kv, q + kv..q + 2 * kv]
}

/// The rows of a stacked matrix (or of its bias) that hold `slot`, for the slots that are stacked.
pub fn stacked_rows(c: &ModelConfig, slot: Slot) -> Option<Range<usize>> {
    let [q, k, v] = qkv_rows(c);
    let i = c.intermediate_size;
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
    /// Loads every slot, each matrix kept as `dtype` decides for it. Precondition: `check` passed.
    pub fn load(
        c: &ModelConfig,
        src: &dyn TensorSource,
        dtype: WeightDtype,
        device: &Device,
    ) -> Result<Self, LoadError> {
        let eps = c.rms_norm_eps;
        let naming = src.naming();
        let mat = |slot: Slot, l: Option<usize>| -> Result<Weight, LoadError> {
            let name = name_of(slot, l, naming);
            let stored = src.stored(&name).and_then(Result::ok).unwrap_or(Stored::F32);
            let k = src.shape(&name).and_then(|s| s.get(1).copied()).unwrap_or(0);
            load_matrix(src, &name, dtype.storage(&name, stored, k, device)?, device)
        };
        let vec = |slot: Slot, l: Option<usize>| load_f32::<1>(src, &name_of(slot, l, naming), device);
        let norm =
            |slot: Slot, l: Option<usize>| -> Result<RmsNorm, LoadError> { Ok(RmsNorm { weight: vec(slot, l)?, eps }) };
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
            .map(|l| {
                let l = Some(l);
                Ok(LayerWeights {
                    attn_norm: norm(Slot::AttnNorm, l)?,
                    qkv: stacked(
                        &[Slot::AttnQ, Slot::AttnK, Slot::AttnV],
                        &[Slot::AttnQBias, Slot::AttnKBias, Slot::AttnVBias],
                        l,
                    )?,
                    qk_norm: c
                        .qk_norm
                        .then(|| Ok::<_, LoadError>([norm(Slot::AttnQNorm, l)?, norm(Slot::AttnKNorm, l)?]))
                        .transpose()?,
                    o: linear(Slot::AttnO, Slot::AttnOBias, l)?,
                    mlp_norm: norm(Slot::MlpNorm, l)?,
                    gate_up: stacked(&[Slot::MlpGate, Slot::MlpUp], &[], l)?,
                    down: Linear { weight: mat(Slot::MlpDown, l)?, bias: None },
                })
            })
            .collect::<Result<Vec<_>, LoadError>>()?;
        Ok(Self {
            embed: mat(Slot::InEmbed, None)?,
            norm: norm(Slot::OutNorm, None)?,
            lm_head: (!c.tie_word_embeddings).then(|| mat(Slot::OutEmbed, None)).transpose()?,
            layers,
        })
    }

    /// How the matrices are kept, for logs: `bf16`, or `Q5_0+Q8_0 …` by distinct kind.
    pub fn describe(&self) -> String {
        let mut kinds: Vec<String> = Vec::new();
        let all = self.layers.iter().flat_map(|l| [&l.qkv.weight, &l.o.weight, &l.gate_up.weight, &l.down.weight]);
        for w in std::iter::once(&self.embed).chain(self.lm_head.as_ref()).chain(all) {
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
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.weight.size_bytes()
                    + l.o.weight.size_bytes()
                    + l.gate_up.weight.size_bytes()
                    + l.down.weight.size_bytes()
            })
            .sum();
        layers + self.embed.size_bytes() + self.lm_head.as_ref().map_or(0, |w| w.size_bytes())
    }

    /// Puts `data` into `slot` of `layer`, releasing the old tensor (or, for a stacked slot,
    /// overwriting its rows of the stacked matrix). A matrix keeps its kind: dense in its dtype,
    /// or quantized to its format.
    /// Precondition: the shape was checked against the config.
    pub fn replace(&mut self, c: &ModelConfig, slot: Slot, layer: Option<usize>, data: TensorData, device: &Device) {
        let vec = || Tensor::<1>::from_data(data.clone(), (device, DType::F32));
        let Some(l) = layer else {
            match slot {
                Slot::InEmbed => self.embed = linear::like(&self.embed, data, device),
                Slot::OutNorm => self.norm.weight = vec(),
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
                Slot::MlpGate | Slot::MlpUp => {
                    w.gate_up.weight = linear::replace_rows(&w.gate_up.weight, rows, data, device)
                }
                _ => w.qkv.weight = linear::replace_rows(&w.qkv.weight, rows, data, device),
            }
            return;
        }
        match slot {
            Slot::AttnNorm => w.attn_norm.weight = vec(),
            Slot::AttnO => w.o.weight = linear::like(&w.o.weight, data, device),
            Slot::AttnOBias => w.o.bias = Some(vec()),
            Slot::MlpNorm => w.mlp_norm.weight = vec(),
            Slot::AttnQNorm | Slot::AttnKNorm => {
                if let Some(norms) = &mut w.qk_norm {
                    norms[usize::from(slot == Slot::AttnKNorm)].weight = vec();
                }
            }
            _ => w.down.weight = linear::like(&w.down.weight, data, device),
        }
    }
}
