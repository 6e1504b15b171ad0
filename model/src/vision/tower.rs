//! The vision towers: Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's (transformers'
//! `Qwen2VisionTransformerPretrainedModel`, `Qwen2_5_VisionTransformerPretrainedModel`,
//! `Qwen3VLVisionModel`) and Gemma 3's (`SiglipVisionModel` and `Gemma3MultiModalProjector`):
//! patches → a linear patch embedding (its convolution, whose stride is its kernel) → N × [norm →
//! attention, q and k turned by 2-D RoPE (each head's first half of pairs by the patch's row, the
//! second by its column) → residual → norm → MLP → residual] → the merger: norm, each 2×2 window's
//! patches side by side, Linear → GELU → Linear to the language model's width: one row per merged
//! window, the image's tokens.
//!
//! - Qwen2-VL's blocks have LayerNorm and fc1 → QuickGELU → fc2, and attend over the whole image.
//! - Qwen2.5-VL's have RMSNorm and a gated silu MLP, and most attend only within windows of
//!   `window_size` pixels a side (a few, `fullatt_block_indexes`, over the whole image): the
//!   patches go through the blocks in the windows' order, each window's rows together, and the
//!   merged rows come back to the image's order at the end.
//! - Qwen3-VL's (and Qwen3.5's, without the deepstack) patch embedding has a bias and adds a
//!   learned position table (a square grid, bilinearly resampled to the image's), its MLP is fc1
//!   → GELU (tanh) → fc2, and some blocks' outputs go through mergers of their own (normed after
//!   the 2×2 shuffle): the deepstack features, added to the language model's first layers'
//!   outputs at the image's rows.
//! - Gemma 3's (SigLIP's blocks) turns nothing: its patch embedding has a bias and adds a learned
//!   position per patch of its one image size, its attention has q, k and v of their own, its MLP
//!   is fc1 → GELU (tanh) → fc2, and after a last LayerNorm the merger averages each window of
//!   patches (4×4 at 896 px, 256 tokens), norms the averages by Gemma's RMSNorm and projects them.

use std::ops::Range;

use burn::tensor::activation::{gelu, sigmoid};
use burn::tensor::{DType, Device, Tensor, TensorData};
use serde_json::Value;

use super::Features;
use super::image::Image;
use crate::config::Activation;
use crate::error::{DecodeError, LoadError};
use crate::kernels::{self, GELU_CUBE, GELU_SCALE};
use crate::kv::Pos;
use crate::layers::{Linear, RmsNorm, Rope, RopeTables, attention, linear, swiglu};
use crate::tensors::{Storage, TensorSource, WeightDtype, load_matrix};

/// Most bytes of one slice of attention scores ([heads, rows, patches] f32): an image attends in
/// slices of query rows (Qwen's largest images have 65,536 patches). Small enough that the
/// allocator reuses a slice's memory for the next (a score matrix of 64 MB, a fresh mapping
/// each time, spent a third of Qwen2-VL's attention faulting its pages in).
const SCORE_BYTES: usize = 8 << 20;

/// Which of the towers: their blocks differ (the module's doc).
#[derive(Debug, Clone, PartialEq)]
pub enum Family {
    Qwen2,
    Qwen25 {
        /// A window's side in merged tokens (`window_size` pixels).
        window: usize,
        /// The blocks that attend over the whole image.
        full_blocks: Vec<usize>,
    },
    Qwen3 {
        /// The blocks whose outputs give deepstack features, in the language model's layers' order.
        deepstack: Vec<usize>,
        /// The learned position table's side (`num_position_embeddings`' root).
        grid: usize,
    },
    Gemma3 {
        /// Patches a side of the one image size, and of the position table.
        grid: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct TowerConfig {
    pub family: Family,
    pub embed_dim: usize,
    pub depth: usize,
    pub heads: usize,
    pub mlp_dim: usize,
    /// The language model's width (the merger's output).
    pub out_dim: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    pub channels: usize,
    pub rope_theta: f64,
    /// The LayerNorms' (and Gemma 3's projector norm's) epsilon.
    pub norm_eps: f64,
}

/// Whether `heads` split a tower `embed_dim` wide: where it `rotates`, into heads whose 2-D
/// rotation has quarters.
pub(super) fn check_heads(embed_dim: usize, heads: usize, rotates: bool) -> Result<(), String> {
    let quarters = if rotates { 4 } else { 1 };
    match heads > 0 && embed_dim.is_multiple_of(heads) && (embed_dim / heads).is_multiple_of(quarters) {
        true => Ok(()),
        false if rotates => Err(format!("{heads} heads do not split {embed_dim} into heads of a multiple of 4")),
        false => Err(format!("{heads} heads do not split {embed_dim}")),
    }
}

/// A positive count of a `vision_config`: the first of `names` it has, else `default`.
fn count(v: &Value, names: &[&str], default: Option<usize>) -> Result<usize, LoadError> {
    let bad =
        |name: &str, reason: &str| LoadError::Config { field: format!("vision_config.{name}"), reason: reason.into() };
    for name in names {
        match v.get(*name) {
            None | Some(Value::Null) => continue,
            Some(x) => {
                return x
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(name, "expected a positive integer"));
            }
        }
    }
    default.ok_or_else(|| bad(names[0], "missing"))
}

impl TowerConfig {
    /// From `config.json`'s `vision_config`, for a checkpoint of `model_type` `qwen2_vl`,
    /// `qwen2_5_vl`, `qwen3_vl`, `qwen3_vl_moe`, `qwen3_5` or `qwen3_5_moe`; `None` for another.
    pub fn from_value(v: &Value, model_type: &str) -> Result<Option<Self>, LoadError> {
        let bad = |name: &str, reason: String| LoadError::Config { field: format!("vision_config.{name}"), reason };
        let count = |names: &[&str], default| count(v, names, default);
        let (qwen25, qwen3) = match model_type {
            "qwen2_vl" => (false, false),
            "qwen2_5_vl" => (true, false),
            // Qwen3.5's is Qwen3-VL's without the deepstack.
            "qwen3_vl" | "qwen3_vl_moe" | "qwen3_5" | "qwen3_5_moe" => (false, true),
            _ => return Ok(None),
        };
        let expected_act = match (qwen25, qwen3) {
            (true, _) => "silu",
            (_, true) => "gelu_pytorch_tanh",
            _ => "quick_gelu",
        };
        let act = v.get("hidden_act").and_then(Value::as_str).unwrap_or(expected_act);
        if act != expected_act {
            return Err(bad("hidden_act", format!("{act:?}: this tower has {expected_act}")));
        }
        let depth = count(&["depth"], None)?;
        let patch_size = count(&["patch_size"], Some(if qwen3 { 16 } else { 14 }))?;
        let merge_size = count(&["spatial_merge_size"], Some(2))?;
        // A list of block indices below the depth.
        let blocks = |name: &str, default: &[usize]| -> Result<Vec<usize>, LoadError> {
            match v.get(name) {
                None | Some(Value::Null) => Ok(default.to_vec()),
                Some(Value::Array(list)) => list
                    .iter()
                    .map(|x| x.as_u64().map(|n| n as usize).filter(|&n| n < depth))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad(name, format!("expected block indices below {depth}"))),
                Some(_) => Err(bad(name, "expected a list".into())),
            }
        };
        let (family, embed_dim, mlp_dim, out_dim) = if qwen25 || qwen3 {
            let family = if qwen25 {
                let window_size = count(&["window_size"], Some(112))?;
                let window = window_size / merge_size / patch_size;
                if window == 0 {
                    return Err(bad("window_size", format!("{window_size} px is less than one merged token")));
                }
                Family::Qwen25 { window, full_blocks: blocks("fullatt_block_indexes", &[7, 15, 23, 31])? }
            } else {
                let positions = count(&["num_position_embeddings"], Some(2304))?;
                let grid = positions.isqrt();
                if grid * grid != positions {
                    return Err(bad("num_position_embeddings", format!("{positions} is not a square grid")));
                }
                let deepstack = match model_type {
                    "qwen3_5" | "qwen3_5_moe" => Vec::new(),
                    _ => blocks("deepstack_visual_indexes", &[8, 16, 24])?,
                };
                Family::Qwen3 { deepstack, grid }
            };
            let embed_dim = count(&["hidden_size"], None)?;
            (family, embed_dim, count(&["intermediate_size"], None)?, count(&["out_hidden_size"], None)?)
        } else {
            let embed_dim = count(&["embed_dim"], None)?;
            let ratio = v.get("mlp_ratio").and_then(Value::as_f64).unwrap_or(4.0);
            (Family::Qwen2, embed_dim, (embed_dim as f64 * ratio) as usize, count(&["hidden_size"], None)?)
        };
        let heads = count(&["num_heads"], None)?;
        check_heads(embed_dim, heads, true).map_err(|reason| bad("num_heads", reason))?;
        let rope_theta = v.pointer("/rope_parameters/rope_theta").and_then(Value::as_f64).unwrap_or(10_000.0);
        Ok(Some(Self {
            family,
            embed_dim,
            depth,
            heads,
            mlp_dim,
            out_dim,
            patch_size,
            temporal_patch_size: count(&["temporal_patch_size"], Some(2))?,
            merge_size,
            channels: count(&["in_chans", "in_channels"], Some(3))?,
            rope_theta,
            norm_eps: 1e-6,
        }))
    }

    /// Gemma 3's tower from its `vision_config` (SigLIP's) and the top level's
    /// `mm_tokens_per_image`, projecting to a language model `out_dim` wide.
    pub fn gemma3(v: &Value, tokens_per_image: usize, out_dim: usize) -> Result<Self, LoadError> {
        let bad = |name: &str, reason: String| LoadError::Config { field: format!("vision_config.{name}"), reason };
        let count = |name: &str, default| count(v, &[name], default);
        let act = v.get("hidden_act").and_then(Value::as_str).unwrap_or("gelu_pytorch_tanh");
        if act != "gelu_pytorch_tanh" {
            return Err(bad("hidden_act", format!("{act:?}: this tower has gelu_pytorch_tanh")));
        }
        if v.get("vision_use_head").and_then(Value::as_bool) == Some(true) {
            return Err(bad("vision_use_head", "a pooling head is not served (Gemma 3's tower has none)".into()));
        }
        let (image, patch_size) = (count("image_size", Some(224))?, count("patch_size", Some(16))?);
        let grid = image / patch_size;
        let side = tokens_per_image.isqrt();
        if grid * patch_size != image || side == 0 || side * side != tokens_per_image || !grid.is_multiple_of(side) {
            return Err(LoadError::Config {
                field: "mm_tokens_per_image".into(),
                reason: format!(
                    "{tokens_per_image} tokens do not pool a grid of {grid}x{grid} patches ({image} px of {patch_size})"
                ),
            });
        }
        let (embed_dim, heads) = (count("hidden_size", Some(768))?, count("num_attention_heads", Some(12))?);
        check_heads(embed_dim, heads, false).map_err(|reason| bad("num_attention_heads", reason))?;
        let norm_eps = v.get("layer_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6);
        Ok(Self {
            family: Family::Gemma3 { grid },
            embed_dim,
            depth: count("num_hidden_layers", Some(12))?,
            heads,
            mlp_dim: count("intermediate_size", Some(3072))?,
            out_dim,
            patch_size,
            temporal_patch_size: 1,
            merge_size: grid / side,
            channels: count("num_channels", Some(3))?,
            rope_theta: 0.0,
            norm_eps,
        })
    }

    fn patch_dim(&self) -> usize {
        self.channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// The learned position table's side, where the tower has one.
    fn position_grid(&self) -> Option<usize> {
        match self.family {
            Family::Qwen3 { grid, .. } | Family::Gemma3 { grid } => Some(grid),
            Family::Qwen2 | Family::Qwen25 { .. } => None,
        }
    }

    /// Whether its attention turns q and k by the patches' rows and columns.
    pub(super) fn rotates(&self) -> bool {
        !matches!(self.family, Family::Gemma3 { .. })
    }

    /// How many deepstack features the tower gives (the language model's layers they reach).
    pub fn deepstack(&self) -> usize {
        match &self.family {
            Family::Qwen3 { deepstack, .. } => deepstack.len(),
            _ => 0,
        }
    }

    /// The order the blocks see an image of `grid` patches in, as merged tokens' indices, and
    /// the runs of patch rows in that order that attend together in a windowed block and in a
    /// full one: Qwen2.5-VL's windows tile each frame from its top left in rows (the last ones
    /// cut short by the image's edges), a window's tokens in rows; a full block's runs are the
    /// frames (an image is one).
    fn layout(&self, grid: [usize; 3]) -> (Vec<usize>, Vec<Range<usize>>, Vec<Range<usize>>) {
        let [t, gh, gw] = grid;
        let m = self.merge_size;
        let (h, w, unit) = (gh / m, gw / m, m * m);
        let frames = (0..t).map(|f| f * h * w * unit..(f + 1) * h * w * unit).collect();
        let Family::Qwen25 { window, .. } = self.family else {
            return ((0..t * h * w).collect(), Vec::new(), frames);
        };
        let mut order = Vec::with_capacity(t * h * w);
        let mut windows = Vec::new();
        for f in 0..t {
            for wy in (0..h).step_by(window) {
                for wx in (0..w).step_by(window) {
                    let start = order.len();
                    for y in wy..(wy + window).min(h) {
                        order.extend((wx..(wx + window).min(w)).map(|x| f * h * w + y * w + x));
                    }
                    windows.push(start * unit..order.len() * unit);
                }
            }
        }
        (order, windows, frames)
    }
}

struct LayerNorm {
    weight: Tensor<1>,
    bias: Tensor<1>,
    eps: f64,
}

impl LayerNorm {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let [n, d] = x.dims();
        let mean = x.clone().mean_dim(1);
        let centred = x - mean;
        // Products, not powers: Burn's CPU power is a libm powf per value.
        let var = (centred.clone() * centred.clone()).mean_dim(1);
        let normed = centred / var.add_scalar(self.eps).sqrt();
        normed * self.weight.clone().reshape([1, d]).expand([n, d]) + self.bias.clone().reshape([1, d]).expand([n, d])
    }
}

/// LayerNorm (Qwen2-VL's, Qwen3-VL's, Gemma 3's) or RMSNorm (Qwen2.5-VL's).
#[allow(clippy::large_enum_variant)] // two per block, built once
enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms(n) => n.forward(x),
        }
    }
}

/// fc1 → QuickGELU (Qwen2-VL's) or GELU's tanh form (Qwen3-VL's) → fc2, or Qwen2.5-VL's
/// silu(gate) · up → down (gate and up stacked).
enum Mlp {
    Plain { fc1: Linear, fc2: Linear, tanh: bool },
    Gated { gate_up: Linear, down: Linear },
}

impl Mlp {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Mlp::Plain { fc1, fc2, tanh } => {
                // x·σ(1.702x), or x·σ(2√(2/π)(x + 0.044715x³)) = ½x(1 + tanh(√(2/π)(x + 0.044715x³))):
                // in place in one pass on the CPU, Burn's ops elsewhere.
                let h = kernels::gelu(fc1.forward(x), *tanh, |h| {
                    let t = match tanh {
                        false => h.clone().mul_scalar(1.702),
                        true => {
                            let cubed = h.clone() * h.clone() * h.clone();
                            (cubed.mul_scalar(GELU_CUBE) + h.clone()).mul_scalar(GELU_SCALE)
                        }
                    };
                    h * sigmoid(t)
                });
                fc2.forward(h)
            }
            Mlp::Gated { gate_up, down } => down.forward(swiglu(gate_up.forward(x), Activation::Silu)),
        }
    }
}

/// Each window's patches into one row of the language model's width.
enum Merger {
    /// Qwen's: a norm, the window's patches side by side, Linear → GELU → Linear; normed before
    /// the shuffle (each patch), or after it (each window: Qwen3-VL's deepstack mergers).
    Mlp { norm: Norm, after_shuffle: bool, fc1: Linear, fc2: Linear },
    /// Gemma 3's: the tower's last LayerNorm, the window's patches averaged, Gemma's RMSNorm (its
    /// scale plus one), a product without bias.
    Pool { post: Norm, norm: RmsNorm, proj: Linear },
}

impl Merger {
    /// x: [patches, embed] → [patches / unit, out]
    fn forward(&self, x: Tensor<2>, unit: usize) -> Tensor<2> {
        let [n, e] = x.dims();
        match self {
            Merger::Mlp { norm, after_shuffle, fc1, fc2 } => {
                let shuffled = match after_shuffle {
                    false => norm.forward(x).reshape([n / unit, e * unit]),
                    true => norm.forward(x.reshape([n / unit, e * unit])),
                };
                fc2.forward(gelu(fc1.forward(shuffled)))
            }
            Merger::Pool { post, norm, proj } => {
                let pooled = post.forward(x).reshape([n / unit, unit, e]).mean_dim(1).reshape([n / unit, e]);
                proj.forward(norm.forward(pooled))
            }
        }
    }
}

struct Block {
    norm1: Norm,
    norm2: Norm,
    qkv: Linear,
    proj: Linear,
    mlp: Mlp,
    /// Attends over the whole image, not within windows.
    full: bool,
    /// Gives deepstack features through this merger.
    deepstack: Option<Merger>,
}

pub struct Tower {
    config: TowerConfig,
    patch_embed: Linear,
    /// Qwen3-VL's learned positions: [grid², embed] row-major, kept here to be resampled.
    positions: Option<Vec<f32>>,
    blocks: Vec<Block>,
    merger: Merger,
    device: Device,
}

impl Tower {
    /// The tower's weights (`visual.` of the checkpoint, named without it): its matrices in the
    /// 16-bit type the checkpoint stores them in (else f32), the rest f32.
    pub fn load(config: TowerConfig, src: &dyn TensorSource, device: &Device) -> Result<Self, LoadError> {
        let values = |name: &str, shape: &[usize]| -> Result<Vec<f32>, LoadError> {
            let found = src.shape(name).ok_or_else(|| LoadError::MissingTensors(vec![format!("visual.{name}")]))?;
            if found.iter().product::<usize>() != shape.iter().product::<usize>() {
                return Err(LoadError::Tensor {
                    name: format!("visual.{name}"),
                    reason: format!("shape {found:?}, expected {shape:?}"),
                });
            }
            src.data(name, DType::F32)?
                .try_into_vec::<f32>()
                .map_err(|e| LoadError::Tensor { name: name.into(), reason: format!("{e:?}") })
        };
        // Stacked rows of several same-shaped tensors (gate's and up's).
        let stacked = |names: &[String], rows: usize, cols: usize| -> Result<TensorData, LoadError> {
            let mut all = Vec::with_capacity(names.len() * rows * cols);
            for name in names {
                all.extend(values(name, &[rows, cols])?);
            }
            Ok(TensorData::new(all, [names.len() * rows, cols]))
        };
        let vector = |name: &str, len: usize| -> Result<Tensor<1>, LoadError> {
            Ok(Tensor::from_data(TensorData::new(values(name, &[len])?, [len]), device))
        };
        // A matrix as the language model keeps the checkpoint's (`WeightDtype::Auto`): 16-bit
        // where it is stored so and the device computes in it, a projector file's quantized
        // blocks kept (several stacked as the language model stacks them).
        let matrix = |names: &[String], out: usize, inp: usize| -> Result<linear::Weight, LoadError> {
            let storage = match src.stored(&names[0]).and_then(Result::ok) {
                Some(stored) => WeightDtype::Auto.storage(&names[0], stored, inp, device)?,
                None => Storage::Dense(DType::F32),
            };
            let matrices = names.iter().all(|n| src.shape(n).is_some_and(|s| s == [out, inp]));
            match storage {
                Storage::Packed(_) | Storage::Blocks(_) if matrices => {
                    let mut parts: Vec<linear::Weight> =
                        names.iter().map(|n| load_matrix(src, n, storage, None, device)).collect::<Result<_, _>>()?;
                    Ok(if parts.len() == 1 { parts.remove(0) } else { linear::stack(parts) })
                }
                Storage::Dense(dtype) => Ok(linear::dense_fitting(stacked(names, out, inp)?, dtype, device)),
                // A kernel of more than two dimensions (a patch embedding's): dense.
                Storage::Packed(_) | Storage::Blocks(_) => {
                    Ok(linear::dense_fitting(stacked(names, out, inp)?, DType::F32, device))
                }
            }
        };
        let lin_stacked = |prefixes: &[String], out: usize, inp: usize| -> Result<Linear, LoadError> {
            let weights: Vec<String> = prefixes.iter().map(|p| format!("{p}.weight")).collect();
            let biases: Vec<String> = prefixes.iter().map(|p| format!("{p}.bias")).collect();
            let bias = stacked(&biases, out, 1)?;
            Ok(Linear {
                weight: matrix(&weights, out, inp)?,
                bias: Some(Tensor::<2>::from_data(bias, device).reshape([prefixes.len() * out])),
            })
        };
        let lin = |prefix: &str, out: usize, inp: usize| lin_stacked(&[prefix.to_string()], out, inp);
        let c = &config;
        let (qwen25, qwen3) = (matches!(c.family, Family::Qwen25 { .. }), matches!(c.family, Family::Qwen3 { .. }));
        let gemma3 = matches!(c.family, Family::Gemma3 { .. });
        let norm = |prefix: &str, d: usize| -> Result<Norm, LoadError> {
            let weight = vector(&format!("{prefix}.weight"), d)?;
            Ok(if qwen25 {
                Norm::Rms(RmsNorm { weight, eps: 1e-6 })
            } else {
                Norm::Layer(LayerNorm { weight, bias: vector(&format!("{prefix}.bias"), d)?, eps: c.norm_eps })
            })
        };
        let (e, unit) = (c.embed_dim, c.merge_size * c.merge_size);
        let merged = e * unit;
        let merger = |prefix: &str, after_shuffle: bool| -> Result<Merger, LoadError> {
            let (norm_name, fc1, fc2) = match qwen3 {
                true => ("norm", "linear_fc1", "linear_fc2"),
                false => ("ln_q", "mlp.0", "mlp.2"),
            };
            Ok(Merger::Mlp {
                norm: norm(&format!("{prefix}.{norm_name}"), if after_shuffle { merged } else { e })?,
                after_shuffle,
                fc1: lin(&format!("{prefix}.{fc1}"), merged, merged)?,
                fc2: lin(&format!("{prefix}.{fc2}"), c.out_dim, merged)?,
            })
        };
        // Gemma 3's: `x · W` with W [embed, out], kept as the [out, embed] other products have.
        let pool = || -> Result<Merger, LoadError> {
            let w = values("projector.mm_input_projection_weight", &[e, c.out_dim])?;
            let transposed: Vec<f32> =
                (0..c.out_dim).flat_map(|o| (0..e).map(move |i| (i, o))).map(|(i, o)| w[i * c.out_dim + o]).collect();
            let weight = linear::dense_fitting(TensorData::new(transposed, [c.out_dim, e]), DType::F32, device);
            let scale = vector("projector.mm_soft_emb_norm.weight", e)?.add_scalar(1.0);
            Ok(Merger::Pool {
                post: norm("post_layernorm", e)?,
                norm: RmsNorm { weight: scale, eps: c.norm_eps },
                proj: Linear { weight, bias: None },
            })
        };
        let blocks = (0..c.depth)
            .map(|i| {
                if gemma3 {
                    let b = format!("encoder.layers.{i}");
                    let attn = |name: &str| format!("{b}.self_attn.{name}");
                    return Ok(Block {
                        norm1: norm(&format!("{b}.layer_norm1"), e)?,
                        norm2: norm(&format!("{b}.layer_norm2"), e)?,
                        qkv: lin_stacked(&[attn("q_proj"), attn("k_proj"), attn("v_proj")], e, e)?,
                        proj: lin(&attn("out_proj"), e, e)?,
                        mlp: Mlp::Plain {
                            fc1: lin(&format!("{b}.mlp.fc1"), c.mlp_dim, e)?,
                            fc2: lin(&format!("{b}.mlp.fc2"), e, c.mlp_dim)?,
                            tanh: true,
                        },
                        full: true,
                        deepstack: None,
                    });
                }
                let b = format!("blocks.{i}");
                let mlp = match (qwen25, qwen3) {
                    (true, _) => Mlp::Gated {
                        gate_up: lin_stacked(
                            &[format!("{b}.mlp.gate_proj"), format!("{b}.mlp.up_proj")],
                            c.mlp_dim,
                            e,
                        )?,
                        down: lin(&format!("{b}.mlp.down_proj"), e, c.mlp_dim)?,
                    },
                    (_, true) => Mlp::Plain {
                        fc1: lin(&format!("{b}.mlp.linear_fc1"), c.mlp_dim, e)?,
                        fc2: lin(&format!("{b}.mlp.linear_fc2"), e, c.mlp_dim)?,
                        tanh: true,
                    },
                    _ => Mlp::Plain {
                        fc1: lin(&format!("{b}.mlp.fc1"), c.mlp_dim, e)?,
                        fc2: lin(&format!("{b}.mlp.fc2"), e, c.mlp_dim)?,
                        tanh: false,
                    },
                };
                let (full, deepstack) = match &c.family {
                    Family::Qwen2 | Family::Gemma3 { .. } => (true, None),
                    Family::Qwen25 { full_blocks, .. } => (full_blocks.contains(&i), None),
                    Family::Qwen3 { deepstack, .. } => {
                        let k = deepstack.iter().position(|&d| d == i);
                        (true, k.map(|k| merger(&format!("deepstack_merger_list.{k}"), true)).transpose()?)
                    }
                };
                Ok(Block {
                    norm1: norm(&format!("{b}.norm1"), e)?,
                    norm2: norm(&format!("{b}.norm2"), e)?,
                    qkv: lin(&format!("{b}.attn.qkv"), 3 * e, e)?,
                    proj: lin(&format!("{b}.attn.proj"), e, e)?,
                    mlp,
                    full,
                    deepstack,
                })
            })
            .collect::<Result<Vec<_>, LoadError>>()?;
        let (patch, positions) = match gemma3 {
            true => ("embeddings.patch_embedding", "embeddings.position_embedding.weight"),
            false => ("patch_embed.proj", "pos_embed.weight"),
        };
        let positions = match c.position_grid() {
            Some(grid) => Some(values(positions, &[grid * grid, e])?),
            None => None,
        };
        Ok(Self {
            patch_embed: Linear {
                weight: matrix(&[format!("{patch}.weight")], e, c.patch_dim())?,
                bias: (qwen3 || gemma3).then(|| vector(&format!("{patch}.bias"), e)).transpose()?,
            },
            positions,
            blocks,
            merger: if gemma3 { pool()? } else { merger("merger", false)? },
            device: device.clone(),
            config,
        })
    }

    /// The image's features: [tokens, out_dim] rows, row-major (and Qwen3-VL's deepstack's).
    pub fn encode(&self, image: &Image) -> Result<Features, DecodeError> {
        let c = &self.config;
        let [t, gh, gw] = image.grid;
        let n = t * gh * gw;
        let m = c.merge_size;
        let pd = c.patch_dim();
        let size_differs = matches!(c.family, Family::Gemma3 { grid } if (t, gh, gw) != (1, grid, grid));
        if image.merge != m
            || image.patches.len() != n * pd
            || !gh.is_multiple_of(m)
            || !gw.is_multiple_of(m)
            || size_differs
        {
            return Err(DecodeError::InvalidInput(format!(
                "an image of {n} patches ({} values, merged by {}) for a tower of {pd}-value patches merged by {m}",
                image.patches.len(),
                image.merge,
            )));
        }
        let (order, windows, frames) = c.layout(image.grid);
        let unit = m * m;
        // The blocks' order, where it is not the image's (Qwen2.5-VL's windows).
        let permuted = order.iter().enumerate().any(|(j, &u)| j != u).then_some(order.as_slice());
        let ordered: Vec<f32> = match permuted {
            None => image.patches.clone(),
            Some(order) => {
                order.iter().flat_map(|&u| &image.patches[u * unit * pd..(u + 1) * unit * pd]).copied().collect()
            }
        };
        let (heads, hd) = (c.heads, c.embed_dim / c.heads);
        let patches = Tensor::<2>::from_data(TensorData::new(ordered, [n, pd]), &self.device);
        let mut x = self.patch_embed.forward(patches);
        if let Some(table) = &self.positions {
            let rows = self.resampled(table, image.grid, &order);
            x = x + Tensor::<2>::from_data(TensorData::new(rows, [n, c.embed_dim]), &self.device);
        }
        let tables = c.rotates().then(|| self.tables(image.grid, &order));
        let mut deepstack = Vec::new();
        for b in &self.blocks {
            let h = b.norm1.forward(x.clone());
            // q and k turned in one pass over the projection where the CPU kernel runs.
            let (e, qkv) = (c.embed_dim, b.qkv.forward(h));
            let [q, k, v] = match &tables {
                Some(tables) => Rope::apply_qk(qkv, 0..e, e..2 * e, tables, None),
                None => [0, 1, 2].map(|k| qkv.clone().narrow(1, k * e, e)),
            };
            let q = q.reshape([n, heads, hd]);
            let k = k.reshape([n, heads, hd]).swap_dims(0, 1); // [heads, n, hd]
            let v = v.reshape([n, heads, hd]).swap_dims(0, 1);
            let a = attend(q, k, v, if b.full { &frames } else { &windows }, SCORE_BYTES);
            x = x + b.proj.forward(a);
            x = x.clone() + b.mlp.forward(b.norm2.forward(x));
            if let Some(merger) = &b.deepstack {
                deepstack.push(self.read(merger.forward(x.clone(), unit), permuted)?);
            }
        }
        let rows = self.read(self.merger.forward(x, unit), permuted)?;
        Ok(Features { rows, deepstack })
    }

    /// Merged rows back on the host, in the image's order (where the blocks' was `permuted`,
    /// the j-th row computed is merged token `permuted[j]`).
    fn read(&self, merged: Tensor<2>, permuted: Option<&[usize]>) -> Result<Vec<f32>, DecodeError> {
        let rows = crate::transfers::read::<2, burn::tensor::Float, f32>(merged)
            .map_err(|e| DecodeError::Internal(format!("reading an image's features: {e:?}")))?;
        let width = self.config.out_dim;
        let Some(order) = permuted else { return Ok(rows) };
        let mut out = vec![0.0; rows.len()];
        for (row, &u) in rows.chunks_exact(width).zip(order) {
            out[u * width..(u + 1) * width].copy_from_slice(row);
        }
        Ok(out)
    }

    /// Each patch's 2-D rotation, the patches in `order` of their merged tokens (each token's
    /// patches in rows): a head's first quarter of dimensions (and third, the rotated halves'
    /// partners) by the patch's row in the image, its second by its column.
    fn tables(&self, grid: [usize; 3], order: &[usize]) -> RopeTables {
        let c = &self.config;
        let hd = c.embed_dim / c.heads;
        let quarter = hd / 4;
        let inv: Vec<f32> =
            (0..quarter).map(|i| 1.0 / (c.rope_theta as f32).powf((2 * i) as f32 / (hd / 2) as f32)).collect();
        let frequencies = [inv.as_slice(), &inv].concat();
        let streams: Vec<usize> = (0..2 * quarter).map(|i| if i < quarter { 1 } else { 2 }).collect();
        let positions: Vec<[Pos; 3]> =
            self.patches(grid, order).map(|(row, col)| [0, row as Pos, col as Pos]).collect();
        RopeTables::of_streams(&frequencies, &streams, &positions, 1.0, &self.device)
    }

    /// Each patch's row and column in the image, the patches in `order` of their merged tokens,
    /// each token's patches in rows.
    fn patches(&self, grid: [usize; 3], order: &[usize]) -> impl Iterator<Item = (usize, usize)> {
        let m = self.config.merge_size;
        let [_, gh, gw] = grid;
        let (h, w) = (gh / m, gw / m);
        order.iter().flat_map(move |&u| {
            let (y, x) = (u % (h * w) / w, u % w);
            (0..m * m).map(move |k| (y * m + k / m, x * m + k % m))
        })
    }

    /// Qwen3-VL's position table resampled to the image's grid, one row a patch (in `order`):
    /// bilinear with the corners aligned (the table's corners on the image's corner patches), as
    /// torch's `interpolate` does it, the four taps summed in its order.
    fn resampled(&self, table: &[f32], grid: [usize; 3], order: &[usize]) -> Vec<f32> {
        let e = self.config.embed_dim;
        let Some(side) = self.config.position_grid() else { return Vec::new() };
        let [_, gh, gw] = grid;
        let taps = |index: usize, size: usize| -> [(usize, f32); 2] {
            let src = index as f32 * (side - 1) as f32 / (size.max(2) - 1) as f32;
            let floor = src.floor();
            let tap = |k: usize| ((floor as usize + k).min(side - 1), (1.0 - (src - floor - k as f32).abs()).max(0.0));
            [tap(0), tap(1)]
        };
        let mut out = Vec::with_capacity(order.len() * self.config.merge_size.pow(2) * e);
        let mut row = vec![0.0f32; e];
        for (r, c) in self.patches(grid, order) {
            row.fill(0.0);
            for (tr, wr) in taps(r, gh) {
                for (tc, wc) in taps(c, gw) {
                    let w = wr * wc;
                    let from = &table[(tr * side + tc) * e..][..e];
                    row.iter_mut().zip(from).for_each(|(o, &v)| *o += v * w);
                }
            }
            out.extend_from_slice(&row);
        }
        out
    }
}

/// Attention of each run of rows over its own rows, in slices of at most `budget` bytes of
/// scores ([`SCORE_BYTES`]): as many query rows as fit for one head, then as many heads as fit. Long slices of rows
/// make few large products (a slice's keys are packed for the product once per slice: at 4,096
/// patches, slices of 32 rows across all 16 heads spent as long packing as multiplying).
///
/// # Shapes
/// q: [n, heads, hd] (rotated); k, v: [heads, n, hd] → [n, heads · hd]
fn attend(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, runs: &[Range<usize>], budget: usize) -> Tensor<2> {
    let heads = q.dims()[1];
    let mut rows = Vec::new();
    for run in runs {
        let len = run.len();
        let (k, v) = (k.clone().narrow(1, run.start, len), v.clone().narrow(1, run.start, len));
        let slice = (budget / (len * 4)).clamp(1, len);
        let group = (budget / (slice * len * 4)).clamp(1, heads);
        for start in (run.start..run.end).step_by(slice) {
            let q = q.clone().narrow(0, start, slice.min(run.end - start));
            let mut parts: Vec<Tensor<2>> = (0..heads)
                .step_by(group)
                .map(|h| {
                    let g = group.min(heads - h);
                    let (k, v) = (k.clone().narrow(0, h, g), v.clone().narrow(0, h, g));
                    attention(q.clone().narrow(1, h, g), k, v, None, None, None)
                })
                .collect();
            rows.push(if parts.len() == 1 { parts.remove(0) } else { Tensor::cat(parts, 1) });
        }
    }
    if rows.len() == 1 { rows.remove(0) } else { Tensor::cat(rows, 0) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen25(window_size: usize) -> TowerConfig {
        let v = json!({"depth": 4, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32,
            "out_hidden_size": 64, "window_size": window_size, "fullatt_block_indexes": [1, 3]});
        TowerConfig::from_value(&v, "qwen2_5_vl").unwrap().unwrap()
    }

    #[test]
    fn windows_tile_the_image_from_its_top_left_and_stop_at_its_edges() {
        // 112 px windows of 14 px patches merged 2×2: 4×4 merged tokens a window.
        let c = qwen25(112);
        assert_eq!(c.family, Family::Qwen25 { window: 4, full_blocks: vec![1, 3] });
        // A 10×10 patch grid: 5×5 merged tokens, windows of 4×4, 4×1, 1×4 and 1×1.
        let (order, windows, frames) = c.layout([1, 10, 10]);
        let sizes: Vec<usize> = windows.iter().map(|w| w.len() / 4).collect();
        assert_eq!(sizes, [16, 4, 4, 1]);
        assert_eq!(&order[..5], &[0, 1, 2, 3, 5]);
        assert_eq!(&order[16..20], &[4, 9, 14, 19]);
        assert_eq!(&order[20..], &[20, 21, 22, 23, 24]);
        assert_eq!(frames, std::iter::once(0..100).collect::<Vec<_>>());
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..25).collect::<Vec<_>>(), "every token once");
        // An image within one window keeps its order; Qwen2-VL's has no windows.
        assert_eq!(c.layout([1, 4, 6]).0, (0..6).collect::<Vec<_>>());
        let qwen2 = json!({"depth": 1, "embed_dim": 16, "num_heads": 2, "hidden_size": 64});
        let (order, windows, frames) = TowerConfig::from_value(&qwen2, "qwen2_vl").unwrap().unwrap().layout([1, 4, 6]);
        assert_eq!((order, windows), ((0..6).collect(), vec![]));
        assert_eq!(frames, std::iter::once(0..24).collect::<Vec<_>>());
    }

    #[test]
    fn a_tower_config_it_cannot_run_is_refused_by_name() {
        let base = json!({"depth": 2, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32,
            "out_hidden_size": 64});
        let refused = |patch: Value| {
            let mut v = base.clone();
            v.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
            TowerConfig::from_value(&v, "qwen2_5_vl").unwrap_err().to_string()
        };
        assert!(refused(json!({"window_size": 20})).contains("window_size"));
        assert!(refused(json!({"fullatt_block_indexes": [2]})).contains("fullatt_block_indexes"));
        assert!(refused(json!({"hidden_act": "gelu"})).contains("hidden_act"));
        assert!(refused(json!({"num_heads": 3})).contains("num_heads"));
        // Released configs' defaults: 112 px windows, full attention every eighth block.
        let v = json!({"depth": 32, "hidden_size": 1280, "num_heads": 16, "intermediate_size": 3420,
            "out_hidden_size": 2048});
        let c = TowerConfig::from_value(&v, "qwen2_5_vl").unwrap().unwrap();
        assert_eq!(c.family, Family::Qwen25 { window: 4, full_blocks: vec![7, 15, 23, 31] });
        assert_eq!((c.embed_dim, c.mlp_dim, c.out_dim), (1280, 3420, 2048));
        // Qwen3-VL's: a square position table, deepstack blocks within the depth; another
        // family's tower is not served.
        let qwen3 = |patch: Value| {
            let mut v = json!({"depth": 4, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32,
                "out_hidden_size": 64, "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 2]});
            v.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
            TowerConfig::from_value(&v, "qwen3_vl_moe")
        };
        let c = qwen3(json!({})).unwrap().unwrap();
        assert_eq!((c.deepstack(), c.family, c.patch_size), (2, Family::Qwen3 { deepstack: vec![0, 2], grid: 4 }, 16));
        let refused = |patch| qwen3(patch).unwrap_err().to_string();
        assert!(refused(json!({"num_position_embeddings": 15})).contains("square"));
        assert!(refused(json!({"deepstack_visual_indexes": [4]})).contains("deepstack_visual_indexes"));
        assert!(refused(json!({"hidden_act": "quick_gelu"})).contains("gelu_pytorch_tanh"));
        assert_eq!(TowerConfig::from_value(&v, "gemma3").unwrap(), None);
        let qwen35 = TowerConfig::from_value(
            &json!({"depth": 2, "hidden_size": 16, "num_heads": 2,
            "intermediate_size": 32, "out_hidden_size": 64, "num_position_embeddings": 16}),
            "qwen3_5_moe",
        );
        assert_eq!(qwen35.unwrap().unwrap().family, Family::Qwen3 { deepstack: vec![], grid: 4 });
    }

    #[test]
    fn attention_in_slices_of_rows_and_heads_equals_it_whole() {
        let device = Device::flex();
        let (n, heads, hd) = (12, 4, 8);
        let values = |seed: usize, len: usize| -> Vec<f32> {
            (0..len).map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0).collect()
        };
        let tensor = |seed, dims: [usize; 3]| {
            Tensor::<3>::from_data(TensorData::new(values(seed, dims.iter().product()), dims), &device)
        };
        let (q, k, v) = (tensor(1, [n, heads, hd]), tensor(2, [heads, n, hd]), tensor(3, [heads, n, hd]));
        // The whole image as one run, or two windows.
        for runs in [std::iter::once(0..n).collect(), vec![0..5, 5..n]] {
            let read = |t: Tensor<2>| t.into_data().try_into_vec::<f32>().unwrap();
            let whole = read(attend(q.clone(), k.clone(), v.clone(), &runs, SCORE_BYTES));
            // Slices of 8 rows of one head, of 2 rows of one head, of all rows of 2 heads.
            for budget in [8 * n * 4, 2 * n * 4, 2 * n * n * 4] {
                let sliced = read(attend(q.clone(), k.clone(), v.clone(), &runs, budget));
                let err = whole.iter().zip(&sliced).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(err < 1e-6, "{runs:?} in slices of {budget} bytes: off by {err}");
            }
        }
    }

    #[test]
    fn a_quantized_projector_files_matrices_stay_in_their_blocks() {
        use crate::layers::linear::Matrix;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf/converted");
        let model = dir.join("tiny-gemma3vl-f32.gguf");
        let config = crate::gguf::model_config(&crate::gguf::GgufFile::open(&model).unwrap()).unwrap();
        let device = Device::flex();
        // Per block: whether q/k/v (stacked), the output, fc1 and fc2 are packed blocks.
        let packed = |mmproj: &str| -> Vec<[bool; 4]> {
            let (_, tower_config, src) = super::super::mmproj::probe(&model, &dir.join(mmproj), &config).unwrap();
            let tower = Tower::load(tower_config, src.as_ref(), &device).unwrap();
            let is = |l: &Linear| matches!(l.weight.matrix(), Matrix::Packed(_));
            let mlp = |m: &Mlp| match m {
                Mlp::Plain { fc1, fc2, .. } => [is(fc1), is(fc2)],
                Mlp::Gated { .. } => unreachable!("Gemma 3's MLP"),
            };
            tower.blocks.iter().map(|b| [is(&b.qkv), is(&b.proj), mlp(&b.mlp)[0], mlp(&b.mlp)[1]]).collect()
        };
        assert_eq!(packed("mmproj-tiny-gemma3vl-q8_0.gguf"), [[true; 4]; 2]);
        assert_eq!(packed("mmproj-tiny-gemma3vl-f32.gguf"), [[false; 4]; 2]);
    }

    #[test]
    fn gemma3s_released_tower_config_reads_with_siglips_defaults() {
        // google/gemma-3-4b-it's vision_config: the rest is SiglipVisionConfig's defaults.
        let v = json!({"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
            "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
            "patch_size": 14, "vision_use_head": false});
        let c = TowerConfig::gemma3(&v, 256, 2560).unwrap();
        assert_eq!(c.family, Family::Gemma3 { grid: 64 });
        assert_eq!((c.embed_dim, c.depth, c.heads, c.mlp_dim, c.out_dim), (1152, 27, 16, 4304, 2560));
        // 64×64 patches pooled 4×4 into 16×16 tokens, one frame of three channels.
        assert_eq!((c.merge_size, c.temporal_patch_size, c.patch_dim(), c.norm_eps), (4, 1, 3 * 14 * 14, 1e-6));
        assert!(!c.rotates() && c.position_grid() == Some(64));
        let refused = |v: &Value, tokens| TowerConfig::gemma3(v, tokens, 2560).unwrap_err().to_string();
        assert!(refused(&v, 255).contains("mm_tokens_per_image"));
        assert!(refused(&v, 9).contains("mm_tokens_per_image"), "3 does not divide 64");
        let mut head = v.clone();
        head["vision_use_head"] = json!(true);
        assert!(refused(&head, 256).contains("vision_use_head"));
    }
}
