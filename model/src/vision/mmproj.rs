//! A GGUF model's vision tower in llama.cpp's projector file (`mmproj-*.gguf`, written by
//! `convert_hf_to_gguf.py --mmproj`; architecture `clip`): Qwen2-VL's (`qwen2vl_merger`),
//! Qwen2.5-VL's (`qwen2.5vl_merger`), Qwen3-VL's and Qwen3.5's (`qwen3vl_merger`) and Gemma 3's
//! (`gemma3`). The file's `clip.vision.*` keys give the tower's shape, and its tensors load under
//! the checkpoint's names ([`Projector`]), so the one tower of `tower.rs` runs both.
//!
//! What the converter changes, undone here:
//! - the patch embedding's 3-D kernel is cut into one 2-D kernel per frame (`v.patch_embd.weight`,
//!   `.weight.1`), put back together;
//! - Qwen2-VL's and Qwen2.5-VL's attention `qkv` is cut into `attn_q`, `attn_k`, `attn_v`,
//!   stacked again (Qwen3-VL's stays `attn_qkv`);
//! - the deepstack mergers are named by the block they follow, not by their place in the list;
//! - Qwen2.5-VL's full-attention blocks are a period (`n_wa_pattern`: every n-th block), its
//!   window `clip.vision.window_size` pixels (112 where the file says none, as llama.cpp reads it);
//! - older files hold a block's MLP matrices under each other's names (`ffn_up` for `ffn_down`),
//!   which their shapes tell, as llama.cpp tells them;
//! - Gemma 3's projector norm is written with the one Gemma's RMSNorm adds to its scale already
//!   added (`mm.soft_emb_norm.weight`), and its pooling as `clip.vision.projector.scale_factor`
//!   (4 where the file says none).
//!
//! The image processor is the model's as llama.cpp runs it: the file's patch, merge, mean and
//! standard deviation, and between 8 and 4,096 tokens an image (`clip.vision.image_min_pixels`
//! and `image_max_pixels` where the file has them); the server's `limits.max_image_pixels` bounds
//! it further. Gemma 3's images are resized to the file's `image_size` square, bilinear.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use burn::tensor::{DType, TensorData};

use super::tower::{Family, TowerConfig, check_heads};
use super::{Framing, ImageProcessor, VisionInfo};
use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::gguf::{GgufFile, Value};
use crate::quant::QuantType;
use crate::tensors::{Naming, Stored, TensorSource, convert};

/// llama.cpp's bounds on a Qwen image, in merged tokens (its `set_limit_image_tokens(8, 4096)`).
const MIN_TOKENS: usize = 8;
const MAX_TOKENS: usize = 4096;

/// The tower of projector file `mmproj` for the language model of GGUF file `model`: what
/// callers need, the tower's shape, and its tensors under the checkpoint's names.
pub(super) fn probe(
    model: &Path,
    mmproj: &Path,
    config: &ModelConfig,
) -> Result<(VisionInfo, TowerConfig, Box<dyn TensorSource>), LoadError> {
    let file = GgufFile::open(mmproj)?;
    let tower = tower_config(&file)?;
    if tower.rotates() && config.mrope.is_none() {
        return Err(LoadError::Config {
            field: format!("{}.rope.dimension_sections", config.arch.gguf),
            reason: format!(
                "missing: this {} model's file has no M-RoPE sections, so it takes no images",
                config.arch.name
            ),
        });
    }
    let processor = processor(&file, &tower)?;
    let model = GgufFile::open(model)?;
    let info = match tower.family {
        Family::Gemma3 { .. } => VisionInfo {
            processor,
            image_token: token(&model, config, "<image_soft_token>")?,
            framing: Some(Framing {
                start: token(&model, config, "<start_of_image>")?,
                end: token(&model, config, "<end_of_image>")?,
            }),
            mrope: false,
            bidirectional: true,
        },
        _ => VisionInfo::qwen(processor, token(&model, config, "<|image_pad|>")?),
    };
    let projector = Projector::new(file, &tower)?;
    Ok((info, tower, Box::new(projector)))
}

/// The projector's type, where the file is a vision projector.
fn projector_type(file: &GgufFile) -> Result<&str, LoadError> {
    let arch = crate::gguf::architecture(file)?;
    if arch != "clip" {
        return Err(file.error(format!("not a projector (mmproj) file: its architecture is `{arch}`, not `clip`")));
    }
    if file.get("clip.has_vision_encoder").and_then(Value::as_bool) != Some(true) {
        return Err(file.error("clip.has_vision_encoder: this projector has no vision tower"));
    }
    // A file of several encoders names the vision one's type apart.
    let ty = file.get("clip.vision.projector_type").or_else(|| file.get("clip.projector_type"));
    ty.and_then(Value::as_str).ok_or_else(|| file.error("clip.projector_type: missing"))
}

/// A count under `clip.vision.`: positive, as the tower needs it.
fn count(file: &GgufFile, key: &str, default: Option<usize>) -> Result<usize, LoadError> {
    let full = format!("clip.vision.{key}");
    match file.get(&full) {
        None => default.ok_or_else(|| file.error(format!("{full}: missing"))),
        Some(v) => v
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| file.error(format!("{full}: expected a positive integer, found {v:?}"))),
    }
}

fn tower_config(file: &GgufFile) -> Result<TowerConfig, LoadError> {
    let ty = projector_type(file)?;
    let depth = count(file, "block_count", None)?;
    let patch_size = count(file, "patch_size", None)?;
    let mut merge_size = count(file, "spatial_merge_size", Some(2))?;
    let family = match ty {
        "qwen2vl_merger" => Family::Qwen2,
        "qwen2.5vl_merger" => {
            let window_size = count(file, "window_size", Some(112))?;
            let window = window_size / merge_size / patch_size;
            if window == 0 {
                return Err(
                    file.error(format!("clip.vision.window_size: {window_size} px is less than one merged token"))
                );
            }
            // Every n-th block attends over the whole image (none: all of them do).
            let period = file.get("clip.vision.n_wa_pattern").and_then(Value::as_u64).unwrap_or(0) as usize;
            let full_blocks = match period {
                0 => (0..depth).collect(),
                n => (0..depth).filter(|i| (i + 1) % n == 0).collect(),
            };
            Family::Qwen25 { window, full_blocks }
        }
        "qwen3vl_merger" => {
            let positions = tensor_shape(file, "v.position_embd.weight")?;
            let rows = positions.first().copied().unwrap_or(0);
            let grid = rows.isqrt();
            if grid * grid != rows {
                return Err(file.error(format!("v.position_embd.weight: {rows} positions are not a square grid")));
            }
            let flags = file.get("clip.vision.is_deepstack_layers").and_then(Value::as_array).unwrap_or(&[]);
            if flags.len() > depth {
                return Err(file.error(format!("clip.vision.is_deepstack_layers: more than the {depth} blocks")));
            }
            let deepstack = flags.iter().enumerate().filter(|(_, f)| f.as_bool() == Some(true)).map(|(i, _)| i);
            Family::Qwen3 { deepstack: deepstack.collect(), grid }
        }
        "gemma3" => {
            let image = count(file, "image_size", None)?;
            let grid = image / patch_size;
            merge_size = count(file, "projector.scale_factor", Some(4))?;
            if grid * patch_size != image || !grid.is_multiple_of(merge_size) {
                return Err(file.error(format!(
                    "clip.vision.image_size: {image} px is not patches of {patch_size} pooled {merge_size} a side"
                )));
            }
            Family::Gemma3 { grid }
        }
        other => {
            return Err(file.error(format!(
                "clip.projector_type `{other}`: served projectors are Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's and \
                 Gemma 3's (qwen2vl_merger, qwen2.5vl_merger, qwen3vl_merger, gemma3)"
            )));
        }
    };
    let gemma3 = matches!(family, Family::Gemma3 { .. });
    let embed_dim = count(file, "embedding_length", None)?;
    let heads = count(file, "attention.head_count", None)?;
    // Only a rotating tower's heads need quarters.
    check_heads(embed_dim, heads, !gemma3)
        .map_err(|reason| file.error(format!("clip.vision.attention.head_count: {reason}")))?;
    // The MLP's width from its matrices: the converter writes Qwen2-VL's `feed_forward_length`
    // as the language model's width.
    let (up, down) = mlp_names(file, &family, embed_dim)?;
    let mlp_dim = tensor_shape(file, &format!("v.blk.0.{up}.weight"))?.first().copied().unwrap_or(0);
    let down_shape = tensor_shape(file, &format!("v.blk.0.{down}.weight"))?;
    if mlp_dim == 0 || down_shape != [embed_dim, mlp_dim] {
        return Err(file.error(format!(
            "v.blk.0.{down}.weight: shape {down_shape:?}, expected [{embed_dim}, {mlp_dim}] (the tower's width, its MLP's)"
        )));
    }
    // The patch embedding's kernel: one 2-D kernel per frame of two (the converter's only).
    let kernel = tensor_shape(file, "v.patch_embd.weight")?;
    let channels = kernel.get(1).copied().unwrap_or(0);
    if kernel != [embed_dim, channels, patch_size, patch_size] || channels == 0 {
        return Err(file.error(format!(
            "v.patch_embd.weight: shape {kernel:?}, expected [{embed_dim}, channels, {patch_size}, {patch_size}]"
        )));
    }
    Ok(TowerConfig {
        family,
        embed_dim,
        depth,
        heads,
        mlp_dim,
        out_dim: count(file, "projection_dim", None)?,
        patch_size,
        temporal_patch_size: if gemma3 { 1 } else { 2 },
        merge_size,
        channels,
        rope_theta: 10_000.0,
        norm_eps: file.get("clip.vision.attention.layer_norm_epsilon").and_then(Value::as_f64).unwrap_or(1e-6),
    })
}

/// The names a block's MLP matrices have in this file (up, down): the converter's, or each
/// other's in older files, whose `ffn_down` takes the tower's width in.
fn mlp_names(file: &GgufFile, family: &Family, embed_dim: usize) -> Result<(&'static str, &'static str), LoadError> {
    let swapped = matches!(family, Family::Qwen2 | Family::Qwen25 { .. })
        && tensor_shape(file, "v.blk.0.ffn_down.weight")?.last() == Some(&embed_dim)
        && tensor_shape(file, "v.blk.0.ffn_up.weight")?.first() == Some(&embed_dim);
    Ok(if swapped { ("ffn_down", "ffn_up") } else { ("ffn_up", "ffn_down") })
}

fn tensor_shape(file: &GgufFile, name: &str) -> Result<Vec<usize>, LoadError> {
    file.tensor(name).map(|t| t.shape()).ok_or_else(|| LoadError::MissingTensors(vec![name.into()]))
}

fn processor(file: &GgufFile, tower: &TowerConfig) -> Result<ImageProcessor, LoadError> {
    let triple = |key: &str| -> Result<[f32; 3], LoadError> {
        let full = format!("clip.vision.{key}");
        let values = file.get(&full).and_then(Value::as_array).unwrap_or(&[]);
        let numbers: Vec<f32> = values.iter().filter_map(Value::as_f64).map(|x| x as f32).collect();
        match numbers[..] {
            [a, b, c] => Ok([a, b, c]),
            _ => Err(file.error(format!("{full}: expected three numbers"))),
        }
    };
    let std = triple("image_std")?;
    if std.iter().any(|&s| !(s.is_finite() && s > 0.0)) {
        return Err(file.error("clip.vision.image_std: expected positive numbers"));
    }
    if let Family::Gemma3 { grid } = tower.family {
        let side = grid * tower.patch_size;
        let siglip = ImageProcessor::siglip(side, tower.patch_size, tower.merge_size);
        return Ok(ImageProcessor { mean: triple("image_mean")?, std, ..siglip });
    }
    let token = (tower.patch_size * tower.merge_size).pow(2);
    let min_pixels = count(file, "image_min_pixels", Some(MIN_TOKENS * token))?;
    let max_pixels = count(file, "image_max_pixels", Some(MAX_TOKENS * token))?.max(min_pixels);
    Ok(ImageProcessor {
        patch_size: tower.patch_size,
        temporal_patch_size: tower.temporal_patch_size,
        merge_size: tower.merge_size,
        min_pixels,
        max_pixels,
        fixed: None,
        filter: super::image::Filter::Bicubic,
        mean: triple("image_mean")?,
        std,
        rescale: 1.0 / 255.0,
    })
}

/// The id of an image's token (the one its features take the place of: `<|image_pad|>`,
/// `<image_soft_token>`; Gemma 3's start and end), from the model file's vocabulary.
fn token(model: &GgufFile, config: &ModelConfig, piece: &str) -> Result<u32, LoadError> {
    let tokens = model.get("tokenizer.ggml.tokens").and_then(Value::as_array).unwrap_or(&[]);
    match tokens.iter().position(|t| t.as_str() == Some(piece)) {
        Some(id) if id < config.vocab_size => Ok(id as u32),
        _ => Err(model.error(format!("tokenizer.ggml.tokens: no {piece} token, which this projector's images need"))),
    }
}

/// How a checkpoint tensor is made of the file's.
#[derive(Debug)]
enum Parts {
    /// One tensor as it is.
    One(String),
    /// Tensors' rows stacked (q's, k's and v's as `qkv`).
    Rows(Vec<String>),
    /// One 2-D kernel per frame, as the 3-D kernel \[out, channels, frames, h, w\].
    Frames(Vec<String>),
    /// Gemma's RMSNorm scale as the checkpoint has it: the file's, which the converter wrote
    /// with one added, less one.
    NormScale(String),
}

impl Parts {
    fn names(&self) -> &[String] {
        match self {
            Self::One(name) | Self::NormScale(name) => std::slice::from_ref(name),
            Self::Rows(names) | Self::Frames(names) => names,
        }
    }
}

/// A projector file's tensors under the names of a checkpoint's tower (`visual.` left off).
pub(super) struct Projector {
    file: GgufFile,
    parts: BTreeMap<String, Parts>,
}

impl Projector {
    fn new(file: GgufFile, tower: &TowerConfig) -> Result<Self, LoadError> {
        let parts = match tower.family {
            Family::Gemma3 { .. } => gemma3_parts(tower.depth),
            _ => qwen_parts(&file, tower)?,
        };
        let mut parts: BTreeMap<String, Parts> = parts.into_iter().collect();
        // Only what the file holds (a bias a family has not is not asked for).
        parts.retain(|_, p| p.names().iter().all(|n| file.tensor(n).is_some()));
        Ok(Self { file, parts })
    }

    fn part(&self, name: &str) -> Result<&Parts, LoadError> {
        self.parts.get(name).ok_or_else(|| LoadError::MissingTensors(vec![format!("visual.{name}")]))
    }

    /// The values of a tensor of the file, f32.
    fn values(&self, name: &str) -> Result<Vec<f32>, LoadError> {
        let data = self.file.data(name, DType::F32)?;
        data.try_into_vec::<f32>().map_err(|e| self.file.error(format!("{name}: {e:?}")))
    }
}

/// A layer's weight and bias under our name `ours`, as the file's `theirs`.
fn both(parts: &mut Vec<(String, Parts)>, ours: &str, theirs: &str) {
    for end in ["weight", "bias"] {
        parts.push((format!("{ours}.{end}"), Parts::One(format!("{theirs}.{end}"))));
    }
}

/// Qwen's tensors (the checkpoint's names, `visual.` left off) as the file has them.
fn qwen_parts(file: &GgufFile, tower: &TowerConfig) -> Result<Vec<(String, Parts)>, LoadError> {
    let (up, down) = mlp_names(file, &tower.family, tower.embed_dim)?;
    let (qwen25, qwen3) = (matches!(tower.family, Family::Qwen25 { .. }), matches!(tower.family, Family::Qwen3 { .. }));
    let mut parts = vec![
        (
            "patch_embed.proj.weight".into(),
            Parts::Frames(vec!["v.patch_embd.weight".into(), "v.patch_embd.weight.1".into()]),
        ),
        ("patch_embed.proj.bias".into(), Parts::One("v.patch_embd.bias".into())),
        ("pos_embed.weight".into(), Parts::One("v.position_embd.weight".into())),
    ];
    for i in 0..tower.depth {
        let (b, v) = (format!("blocks.{i}"), format!("v.blk.{i}"));
        both(&mut parts, &format!("{b}.norm1"), &format!("{v}.ln1"));
        both(&mut parts, &format!("{b}.norm2"), &format!("{v}.ln2"));
        both(&mut parts, &format!("{b}.attn.proj"), &format!("{v}.attn_out"));
        for end in ["weight", "bias"] {
            let qkv = match file.tensor(&format!("{v}.attn_qkv.{end}")) {
                Some(_) => Parts::One(format!("{v}.attn_qkv.{end}")),
                None => Parts::Rows(["q", "k", "v"].iter().map(|x| format!("{v}.attn_{x}.{end}")).collect()),
            };
            parts.push((format!("{b}.attn.qkv.{end}"), qkv));
        }
        let (fc1, fc2) = match (qwen25, qwen3) {
            (true, _) => {
                both(&mut parts, &format!("{b}.mlp.gate_proj"), &format!("{v}.ffn_gate"));
                ("up_proj", "down_proj")
            }
            (_, true) => ("linear_fc1", "linear_fc2"),
            _ => ("fc1", "fc2"),
        };
        both(&mut parts, &format!("{b}.mlp.{fc1}"), &format!("{v}.{up}"));
        both(&mut parts, &format!("{b}.mlp.{fc2}"), &format!("{v}.{down}"));
    }
    let (norm, fc1, fc2) = match qwen3 {
        true => ("norm", "linear_fc1", "linear_fc2"),
        false => ("ln_q", "mlp.0", "mlp.2"),
    };
    both(&mut parts, &format!("merger.{norm}"), "v.post_ln");
    both(&mut parts, &format!("merger.{fc1}"), "mm.0");
    both(&mut parts, &format!("merger.{fc2}"), "mm.2");
    if let Family::Qwen3 { deepstack, .. } = &tower.family {
        for (k, block) in deepstack.iter().enumerate() {
            let (ours, theirs) = (format!("deepstack_merger_list.{k}"), format!("v.deepstack.{block}"));
            both(&mut parts, &format!("{ours}.norm"), &format!("{theirs}.norm"));
            both(&mut parts, &format!("{ours}.linear_fc1"), &format!("{theirs}.fc1"));
            both(&mut parts, &format!("{ours}.linear_fc2"), &format!("{theirs}.fc2"));
        }
    }
    Ok(parts)
}

/// Gemma 3's tensors (SigLIP's names, the projector's under `projector.`) as the file has them.
fn gemma3_parts(depth: usize) -> Vec<(String, Parts)> {
    let mut parts = Vec::new();
    both(&mut parts, "embeddings.patch_embedding", "v.patch_embd");
    for i in 0..depth {
        let (b, v) = (format!("encoder.layers.{i}"), format!("v.blk.{i}"));
        for (ours, theirs) in [
            ("layer_norm1", "ln1"),
            ("layer_norm2", "ln2"),
            ("self_attn.q_proj", "attn_q"),
            ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"),
            ("self_attn.out_proj", "attn_out"),
            ("mlp.fc1", "ffn_up"),
            ("mlp.fc2", "ffn_down"),
        ] {
            both(&mut parts, &format!("{b}.{ours}"), &format!("{v}.{theirs}"));
        }
    }
    both(&mut parts, "post_layernorm", "v.post_ln");
    parts.extend([
        ("embeddings.position_embedding.weight".into(), Parts::One("v.position_embd.weight".into())),
        ("projector.mm_input_projection_weight".into(), Parts::One("mm.input_projection.weight".into())),
        ("projector.mm_soft_emb_norm.weight".into(), Parts::NormScale("mm.soft_emb_norm.weight".into())),
    ]);
    parts
}

impl TensorSource for Projector {
    fn naming(&self) -> Naming {
        Naming::Hf
    }

    fn names(&self) -> BTreeSet<&str> {
        self.parts.keys().map(String::as_str).collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let part = self.parts.get(name)?;
        let shapes: Vec<Vec<usize>> =
            part.names().iter().map(|n| self.file.tensor(n).map(|t| t.shape())).collect::<Option<_>>()?;
        match part {
            Parts::One(_) | Parts::NormScale(_) => shapes.into_iter().next(),
            Parts::Rows(_) => {
                let mut shape = shapes[0].clone();
                shape[0] = shapes.iter().map(|s| s[0]).sum();
                Some(shape)
            }
            Parts::Frames(_) => {
                let mut shape = shapes[0].clone();
                shape.insert(2, shapes.len());
                Some(shape)
            }
        }
    }

    fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
        let first = self.parts.get(name)?.names().first()?;
        self.file.stored(first)
    }

    /// A quantized matrix's blocks as the file has them: one tensor's, or stacked ones' rows of
    /// blocks one after the other where they share a format.
    fn blocks(&self, name: &str) -> Option<(QuantType, Cow<'_, [u8]>)> {
        match self.parts.get(name)? {
            Parts::One(n) => self.file.blocks(n),
            Parts::Rows(names) => {
                let (mut format, mut all) = (None, Vec::new());
                for n in names {
                    let (q, bytes) = self.file.blocks(n)?;
                    if *format.get_or_insert(q) != q {
                        return None;
                    }
                    all.extend_from_slice(&bytes);
                }
                Some((format?, Cow::Owned(all)))
            }
            Parts::Frames(_) | Parts::NormScale(_) => None,
        }
    }

    fn data(&self, name: &str, dtype: DType) -> Result<TensorData, LoadError> {
        let shape = self.shape(name).ok_or_else(|| LoadError::MissingTensors(vec![format!("visual.{name}")]))?;
        let values = match self.part(name)? {
            Parts::One(n) => return self.file.data(n, dtype),
            Parts::NormScale(n) => self.values(n)?.into_iter().map(|x| x - 1.0).collect(),
            Parts::Rows(names) => {
                let mut all = Vec::new();
                for n in names {
                    all.extend(self.values(n)?);
                }
                all
            }
            Parts::Frames(names) => {
                // Per output row and channel, each frame's kernel in turn.
                let frames: Vec<Vec<f32>> = names.iter().map(|n| self.values(n)).collect::<Result<_, _>>()?;
                let plane = shape[3..].iter().product::<usize>();
                let mut all = Vec::with_capacity(frames.len() * frames[0].len());
                for at in (0..frames[0].len()).step_by(plane) {
                    for frame in &frames {
                        all.extend_from_slice(&frame[at..at + plane]);
                    }
                }
                all
            }
        };
        Ok(convert(values, shape, dtype))
    }

    fn done(&self, name: &str) {
        if let Some(part) = self.parts.get(name) {
            for n in part.names() {
                self.file.done(n);
            }
        }
    }
}
