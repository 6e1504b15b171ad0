//! Qwen2-VL's vision tower (transformers' `Qwen2VisionTransformerPretrainedModel`): patches →
//! a linear patch embedding (its 3-D convolution, whose stride is its kernel) → N × [LayerNorm →
//! attention over the image's patches, q and k turned by 2-D RoPE (each head's first half of
//! pairs by the patch's row, the second by its column) → residual → LayerNorm → fc1 → QuickGELU
//! → fc2 → residual] → the merger: LayerNorm, each 2×2 window's patches side by side, Linear →
//! GELU → Linear to the language model's width: one row per merged window, the image's tokens.

use burn::tensor::activation::{gelu, sigmoid};
use burn::tensor::{DType, Device, Tensor, TensorData};
use serde_json::Value;

use super::image::Image;
use crate::checkpoint::Checkpoint;
use crate::error::{DecodeError, LoadError};
use crate::kv::Pos;
use crate::layers::{Linear, Rope, RopeTables, attention, linear};
use crate::tensors::{Stored, TensorSource};

/// Most bytes of one slice of attention scores ([heads, rows, patches] f32): an image of
/// thousands of patches attends in slices of query rows (Qwen's largest images have 65,536).
const SCORE_BYTES: usize = 256 << 20;

#[derive(Debug, Clone, PartialEq)]
pub struct TowerConfig {
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
}

impl TowerConfig {
    /// From `config.json`'s `vision_config`.
    pub fn from_value(v: &Value) -> Result<Self, LoadError> {
        let field = |name: &str| LoadError::Config {
            field: format!("vision_config.{name}"),
            reason: "expected a positive integer".into(),
        };
        let count = |names: &[&str], default: Option<usize>| -> Result<usize, LoadError> {
            for name in names {
                match v.get(*name) {
                    None | Some(Value::Null) => continue,
                    Some(x) => return x.as_u64().filter(|&n| n > 0).map(|n| n as usize).ok_or_else(|| field(name)),
                }
            }
            default.ok_or_else(|| LoadError::Config {
                field: format!("vision_config.{}", names[0]),
                reason: "missing".into(),
            })
        };
        let embed_dim = count(&["embed_dim"], None)?;
        let ratio = v.get("mlp_ratio").and_then(Value::as_f64).unwrap_or(4.0);
        let act = v.get("hidden_act").and_then(Value::as_str).unwrap_or("quick_gelu");
        if act != "quick_gelu" {
            return Err(LoadError::Config {
                field: "vision_config.hidden_act".into(),
                reason: format!("{act:?}: Qwen2-VL's tower has quick_gelu"),
            });
        }
        let heads = count(&["num_heads"], None)?;
        if !embed_dim.is_multiple_of(heads) || !(embed_dim / heads).is_multiple_of(4) {
            return Err(LoadError::Config {
                field: "vision_config.num_heads".into(),
                reason: format!("{heads} heads do not split {embed_dim} into heads of a multiple of 4"),
            });
        }
        let rope_theta = v.pointer("/rope_parameters/rope_theta").and_then(Value::as_f64).unwrap_or(10_000.0);
        Ok(Self {
            embed_dim,
            depth: count(&["depth"], None)?,
            heads,
            mlp_dim: (embed_dim as f64 * ratio) as usize,
            out_dim: count(&["hidden_size"], None)?,
            patch_size: count(&["patch_size"], Some(14))?,
            temporal_patch_size: count(&["temporal_patch_size"], Some(2))?,
            merge_size: count(&["spatial_merge_size"], Some(2))?,
            channels: count(&["in_chans", "in_channels"], Some(3))?,
            rope_theta,
        })
    }

    fn patch_dim(&self) -> usize {
        self.channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

struct LayerNorm {
    weight: Tensor<1>,
    bias: Tensor<1>,
}

impl LayerNorm {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let [n, d] = x.dims();
        let mean = x.clone().mean_dim(1);
        let centred = x - mean;
        let var = centred.clone().powi_scalar(2).mean_dim(1);
        let normed = centred / var.add_scalar(1e-6).sqrt();
        normed * self.weight.clone().reshape([1, d]).expand([n, d]) + self.bias.clone().reshape([1, d]).expand([n, d])
    }
}

struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

pub struct Tower {
    config: TowerConfig,
    patch_embed: Linear,
    blocks: Vec<Block>,
    merge_norm: LayerNorm,
    merge_in: Linear,
    merge_out: Linear,
    device: Device,
}

impl Tower {
    /// The tower's weights (`visual.` of the checkpoint, named without it): its matrices in the
    /// 16-bit type the checkpoint stores them in (else f32), the rest f32.
    pub fn load(config: TowerConfig, src: &Checkpoint, device: &Device) -> Result<Self, LoadError> {
        let tensor = |name: &str, shape: &[usize]| -> Result<TensorData, LoadError> {
            let found = src.shape(name).ok_or_else(|| LoadError::MissingTensors(vec![format!("visual.{name}")]))?;
            if found.iter().product::<usize>() != shape.iter().product::<usize>() {
                return Err(LoadError::Tensor {
                    name: format!("visual.{name}"),
                    reason: format!("shape {found:?}, expected {shape:?}"),
                });
            }
            let data = src.data(name, DType::F32)?;
            let values = data
                .try_into_vec::<f32>()
                .map_err(|e| LoadError::Tensor { name: name.into(), reason: format!("{e:?}") })?;
            Ok(TensorData::new(values, shape.to_vec()))
        };
        let vector = |name: &str, len: usize| -> Result<Tensor<1>, LoadError> {
            Ok(Tensor::from_data(tensor(name, &[len])?, device))
        };
        let matrix = |name: &str, out: usize, inp: usize| -> Result<linear::Weight, LoadError> {
            let dtype = match src.stored(name) {
                Some(Ok(Stored::Bf16)) => DType::BF16,
                Some(Ok(Stored::F16)) => DType::F16,
                _ => DType::F32,
            };
            Ok(linear::dense_fitting(tensor(name, &[out, inp])?, dtype, device))
        };
        let lin = |prefix: &str, out: usize, inp: usize| -> Result<Linear, LoadError> {
            Ok(Linear {
                weight: matrix(&format!("{prefix}.weight"), out, inp)?,
                bias: Some(vector(&format!("{prefix}.bias"), out)?),
            })
        };
        let norm = |prefix: &str, d: usize| -> Result<LayerNorm, LoadError> {
            Ok(LayerNorm {
                weight: vector(&format!("{prefix}.weight"), d)?,
                bias: vector(&format!("{prefix}.bias"), d)?,
            })
        };
        let c = &config;
        let e = c.embed_dim;
        let blocks = (0..c.depth)
            .map(|i| {
                let b = format!("blocks.{i}");
                Ok(Block {
                    norm1: norm(&format!("{b}.norm1"), e)?,
                    norm2: norm(&format!("{b}.norm2"), e)?,
                    qkv: lin(&format!("{b}.attn.qkv"), 3 * e, e)?,
                    proj: lin(&format!("{b}.attn.proj"), e, e)?,
                    fc1: lin(&format!("{b}.mlp.fc1"), c.mlp_dim, e)?,
                    fc2: lin(&format!("{b}.mlp.fc2"), e, c.mlp_dim)?,
                })
            })
            .collect::<Result<Vec<_>, LoadError>>()?;
        let merged = e * c.merge_size * c.merge_size;
        Ok(Self {
            patch_embed: Linear { weight: matrix("patch_embed.proj.weight", e, c.patch_dim())?, bias: None },
            blocks,
            merge_norm: norm("merger.ln_q", e)?,
            merge_in: lin("merger.mlp.0", merged, merged)?,
            merge_out: lin("merger.mlp.2", c.out_dim, merged)?,
            device: device.clone(),
            config,
        })
    }

    /// The image's features: [tokens, out_dim] rows, row-major.
    pub fn encode(&self, image: &Image) -> Result<Vec<f32>, DecodeError> {
        let c = &self.config;
        let [t, gh, gw] = image.grid;
        let n = t * gh * gw;
        let m = c.merge_size;
        if image.merge != m
            || image.patches.len() != n * c.patch_dim()
            || !gh.is_multiple_of(m)
            || !gw.is_multiple_of(m)
        {
            return Err(DecodeError::InvalidInput(format!(
                "an image of {n} patches ({} values, merged by {}) for a tower of {}-value patches merged by {m}",
                image.patches.len(),
                image.merge,
                c.patch_dim()
            )));
        }
        let (heads, hd) = (c.heads, c.embed_dim / c.heads);
        let patches = Tensor::<2>::from_data(TensorData::new(image.patches.clone(), [n, c.patch_dim()]), &self.device);
        let mut x = self.patch_embed.forward(patches);
        let tables = self.tables(image);
        for b in &self.blocks {
            let h = b.norm1.forward(x.clone());
            let qkv = b.qkv.forward(h).reshape([n, 3, heads, hd]);
            let part = |i: usize| qkv.clone().narrow(1, i, 1).reshape([n, heads, hd]);
            let q = Rope::apply(part(0), &tables);
            let k = Rope::apply(part(1), &tables).swap_dims(0, 1); // [heads, n, hd]
            let v = part(2).swap_dims(0, 1);
            let slice = (SCORE_BYTES / (heads * n * 4)).clamp(1, n);
            let mut rows = Vec::with_capacity(n.div_ceil(slice));
            for start in (0..n).step_by(slice) {
                let len = slice.min(n - start);
                rows.push(attention(q.clone().narrow(0, start, len), k.clone(), v.clone(), None, None, None));
            }
            let a = if rows.len() == 1 { rows.remove(0) } else { Tensor::cat(rows, 0) };
            x = x + b.proj.forward(a);
            let h = b.fc1.forward(b.norm2.forward(x.clone()));
            let h = h.clone() * sigmoid(h.mul_scalar(1.702)); // QuickGELU
            x = x + b.fc2.forward(h);
        }
        let merged = self.merge_norm.forward(x).reshape([n / (m * m), c.embed_dim * m * m]);
        let out = self.merge_out.forward(gelu(self.merge_in.forward(merged)));
        crate::transfers::read::<2, burn::tensor::Float, f32>(out)
            .map_err(|e| DecodeError::Internal(format!("reading an image's features: {e:?}")))
    }

    /// Each patch's 2-D rotation: a head's first quarter of dimensions (and third, the rotated
    /// halves' partners) by the patch's row in the image, its second by its column, the patches in
    /// their merge windows' order.
    fn tables(&self, image: &Image) -> RopeTables {
        let c = &self.config;
        let [t, gh, gw] = image.grid;
        let m = c.merge_size;
        let hd = c.embed_dim / c.heads;
        let quarter = hd / 4;
        let inv: Vec<f32> =
            (0..quarter).map(|i| 1.0 / (c.rope_theta as f32).powf((2 * i) as f32 / (hd / 2) as f32)).collect();
        let frequencies = [inv.as_slice(), &inv].concat();
        let streams: Vec<usize> = (0..2 * quarter).map(|i| if i < quarter { 1 } else { 2 }).collect();
        let mut positions = Vec::with_capacity(t * gh * gw);
        for _ in 0..t {
            for bh in 0..gh / m {
                for bw in 0..gw / m {
                    for mh in 0..m {
                        for mw in 0..m {
                            positions.push([0, (bh * m + mh) as Pos, (bw * m + mw) as Pos]);
                        }
                    }
                }
            }
        }
        RopeTables::of_streams(&frequencies, &streams, &positions, 1.0, &self.device)
    }
}
