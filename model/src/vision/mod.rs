//! Images in: a model that sees them turns each image into rows of its language model's input.
//! The caller prepares an image ([`ImageProcessor::prepare`]: decoded, resized, cut into
//! patches), repeats the model's image token once per feature row where the chat template put it
//! ([`VisionInfo::image_token`]), and sends the prompt with its images; the worker encodes each
//! image once ([`crate::Context::encode_image`]) and gives its rows in place of those tokens'
//! embeddings, each turned by its place in the image ([`positions`], M-RoPE).
//!
//! Served: Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's and Qwen3.5's towers (`qwen`), from a checkpoint's
//! `visual.` tensors or, beside a GGUF model, llama.cpp's projector file (`mmproj`); Qwen3-VL's
//! deepstack features ride with its image rows ([`Features::deepstack`]).

mod image;
mod mmproj;
mod qwen;

use std::borrow::Borrow;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

pub use image::{Image, ImageError, ImageProcessor};

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::error::{DecodeError, LoadError};
use crate::kv::Pos;
use crate::source::ModelSource;
use crate::tensors::TensorSource;

/// What a caller needs to send a model images (its [`crate::ModelInfo::vision`]).
#[derive(Debug, Clone, PartialEq)]
pub struct VisionInfo {
    pub processor: ImageProcessor,
    /// The token an image's feature rows stand in for (`<|image_pad|>`): the chat template
    /// writes it once per image, which the caller repeats [`Image::tokens`] times.
    pub image_token: u32,
}

/// An image's features as its tower gives them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Features {
    /// \[tokens, hidden\] row-major: the rows that take the image tokens' embeddings' place.
    pub rows: Vec<f32>,
    /// Qwen3-VL's deepstack: per language-model layer from the first, \[tokens, hidden\] added
    /// to the image rows' hidden states after that layer.
    pub deepstack: Vec<Vec<f32>>,
}

impl Features {
    /// Tokens `tokens` of an image of `count` tokens as a batch's embedded rows from batch row
    /// `row`.
    pub fn embedded(&self, count: usize, tokens: Range<usize>, row: usize) -> crate::Embedded {
        let width = self.rows.len().checked_div(count).unwrap_or(0);
        let part = |values: &Vec<f32>| values[tokens.start * width..tokens.end * width].to_vec();
        crate::Embedded { row, values: part(&self.rows), deepstack: self.deepstack.iter().map(part).collect() }
    }
}

/// A loaded vision tower.
pub struct Vision {
    pub info: VisionInfo,
    tower: qwen::Tower,
}

impl Vision {
    /// The model's vision tower, where its family's tower is served (Qwen2-VL's, Qwen2.5-VL's,
    /// Qwen3-VL's, Qwen3.5's) and the model has one (a checkpoint's, or a GGUF model's projector
    /// file); `None` for any other model, which takes text only.
    pub fn load(
        source: &ModelSource,
        config: &ModelConfig,
        device: &burn::tensor::Device,
    ) -> Result<Option<Self>, LoadError> {
        let Some((info, tower_config, src)) = probe(source, config)? else {
            return Ok(None);
        };
        let tower = qwen::Tower::load(tower_config, src.as_ref(), device)?;
        Ok(Some(Self { info, tower }))
    }

    /// The image's features.
    pub fn encode(&self, image: &Image) -> Result<Features, DecodeError> {
        self.tower.encode(image)
    }
}

/// What [`Vision::load`] would give callers, without reading the tower's weights.
pub fn info(source: &ModelSource, config: &ModelConfig) -> Result<Option<VisionInfo>, LoadError> {
    Ok(probe(source, config)?.map(|(info, _, _)| info))
}

type Probed = (VisionInfo, qwen::TowerConfig, Box<dyn TensorSource>);

/// The model's vision settings, checked against its language model, and its tower's tensors,
/// where it has a served tower.
fn probe(source: &ModelSource, config: &ModelConfig) -> Result<Option<Probed>, LoadError> {
    let probed = match source {
        ModelSource::Dir(dir) if config.mrope.is_some() => probe_dir(dir, config)?,
        ModelSource::Dir(_) | ModelSource::Gguf { mmproj: None, .. } => None,
        ModelSource::Gguf { path, mmproj: Some(mmproj) } => {
            if config.mrope.is_none() {
                return Err(LoadError::Config {
                    field: format!("{}.rope.dimension_sections", config.arch.gguf),
                    reason: format!(
                        "missing: this {} model's file has no M-RoPE sections, so it takes no images",
                        config.arch.name
                    ),
                });
            }
            Some(mmproj::probe(path, mmproj, config)?)
        }
    };
    let Some((info, tower_config, src)) = probed else {
        return Ok(None);
    };
    if tower_config.deepstack() > config.num_hidden_layers {
        return Err(LoadError::Config {
            field: "vision_config.deepstack_visual_indexes".into(),
            reason: format!("more than the language model's {} layers", config.num_hidden_layers),
        });
    }
    if tower_config.out_dim != config.hidden_size {
        return Err(LoadError::Config {
            field: "vision_config.hidden_size".into(),
            reason: format!("{} is not the language model's width {}", tower_config.out_dim, config.hidden_size),
        });
    }
    Ok(Some((info, tower_config, src)))
}

/// A checkpoint's tower: its `vision_config`, processor and `visual.` tensors.
fn probe_dir(dir: &Path, config: &ModelConfig) -> Result<Option<Probed>, LoadError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Io { path: path.clone(), source })?;
    let top: Value =
        serde_json::from_str(&text).map_err(|e| LoadError::Json { path: path.clone(), reason: e.to_string() })?;
    let (Some(model_type), Some(vision)) = (top.get("model_type").and_then(Value::as_str), top.get("vision_config"))
    else {
        return Ok(None);
    };
    let Some(tower_config) = qwen::TowerConfig::from_value(vision, model_type)? else {
        tracing::info!(model_type, "this model's vision tower is not served: text only");
        return Ok(None);
    };
    let Some(src) = Checkpoint::vision(dir)? else {
        return Ok(None);
    };
    let processor = ImageProcessor::from_dir(dir)?;
    if (processor.patch_size, processor.temporal_patch_size, processor.merge_size)
        != (tower_config.patch_size, tower_config.temporal_patch_size, tower_config.merge_size)
    {
        return Err(LoadError::Config {
            field: "preprocessor_config.patch_size".into(),
            reason: "the processor's patch, frames or merge differ from vision_config's".into(),
        });
    }
    let image_token = match top.get("image_token_id").and_then(Value::as_u64) {
        Some(id) if (id as usize) < config.vocab_size => id as u32,
        _ => {
            return Err(LoadError::Config {
                field: "image_token_id".into(),
                reason: "missing, or not in the vocabulary".into(),
            });
        }
    };
    Ok(Some((VisionInfo { processor, image_token }, tower_config, Box::new(src))))
}

/// A prompt's images as a model takes them: each image, the first prompt row of its tokens, and
/// the prompt's M-RoPE positions. The prompt's image tokens are ids drawn from each image's hash
/// ([`PromptImages::new`]), so that a cached prefix is reused only where its images are the same.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PromptImages {
    pub images: Vec<Arc<Image>>,
    /// Per image: the prompt row its tokens start at.
    pub rows: Vec<usize>,
    /// \[prompt tokens\] M-RoPE's positions.
    pub rope: Vec<[Pos; 3]>,
    /// What a row after the prompt adds to its index for its position ([`positions`]).
    pub delta: Pos,
    /// The token the images' rows stand in for, as the processor writes them.
    pub image_token: u32,
}

impl PromptImages {
    /// The images of `tokens`, whose runs of `image_token` are the images' tokens in order (the
    /// chat template's one per image, repeated [`Image::tokens`] times). Each run's tokens become
    /// ids drawn from its image's hash and its place in the run, below `vocab_size`: the model
    /// reads those rows' embeddings from the image, and two prompts share a prefix through an
    /// image only where it is the same image.
    pub fn new(
        tokens: &mut [u32],
        image_token: u32,
        images: Vec<Arc<Image>>,
        vocab_size: usize,
    ) -> Result<Self, String> {
        let (rope, delta) = positions(tokens, image_token, &images)?;
        let mut rows = Vec::with_capacity(images.len());
        let mut at = 0;
        for image in &images {
            at += tokens[at..].iter().position(|&t| t == image_token).ok_or("an image without its tokens")?;
            rows.push(at);
            for (k, t) in tokens[at..at + image.tokens()].iter_mut().enumerate() {
                let mixed = image.hash ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                *t = (splitmix(mixed) % vocab_size as u64) as u32;
            }
            at += image.tokens();
        }
        Ok(Self { images, rows, rope, delta, image_token })
    }

    /// `tokens` (the prompt these images were made with) with each image's rows as the image
    /// token again, as the model's processor writes them.
    pub fn restore(&self, tokens: &mut [u32]) {
        for (image, &row) in self.images.iter().zip(&self.rows) {
            if let Some(rows) = tokens.get_mut(row..row + image.tokens()) {
                rows.fill(self.image_token);
            }
        }
    }

    /// The prompt `tokens` as the processor writes it ([`Self::restore`]): what reads the prompt
    /// as text (a reasoning model's open think block, the sampler's penalties) reads this, never
    /// the ids drawn for the cache, which may be any token (a `<think>` among them).
    pub fn shown(&self, tokens: &[u32]) -> Vec<u32> {
        let mut shown = tokens.to_vec();
        self.restore(&mut shown);
        shown
    }

    /// The M-RoPE position of the sequence's row `pos`: the prompt's, or past it, `pos + delta`
    /// in all three streams.
    pub fn rope_at(&self, pos: Pos) -> [Pos; 3] {
        match self.rope.get(pos as usize) {
            Some(&p) => p,
            None => [pos + self.delta; 3],
        }
    }

    /// The images whose tokens prompt rows `rows` reach: each one's index and the rows it has
    /// among them, counted from its first token.
    pub fn reached(&self, rows: Range<usize>) -> impl Iterator<Item = (usize, Range<usize>)> + '_ {
        self.images.iter().zip(&self.rows).enumerate().filter_map(move |(k, (image, &start))| {
            let (lo, hi) = (start.max(rows.start), (start + image.tokens()).min(rows.end));
            (lo < hi).then(|| (k, lo - start..hi - start))
        })
    }
}

/// SplitMix64's finaliser: a hash's bits spread over every bit.
fn splitmix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// M-RoPE's positions (temporal, height, width) of a prompt whose images' tokens are the runs of
/// `image_token` (each image's [`Image::tokens`] in a row, in order), and the delta from a
/// token's index to its position past the prompt (the rows generated after it turn by their
/// index plus this, all three streams alike). Text turns by one position that counts up; an
/// image's tokens by its start, its merged row and column added to the last two; the text after
/// an image from its start plus its larger side (transformers' `get_rope_index`).
pub fn positions<I: Borrow<Image>>(
    tokens: &[u32],
    image_token: u32,
    images: &[I],
) -> Result<(Vec<[Pos; 3]>, Pos), String> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut images = images.iter();
    let mut next: Pos = 0;
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] != image_token {
            out.push([next; 3]);
            next += 1;
            i += 1;
            continue;
        }
        let image: &Image = images.next().ok_or("more image tokens than the images' features")?.borrow();
        let [t, h, w] = image.grid;
        let (h, w) = (h / image.merge, w / image.merge);
        let n = image.tokens();
        if tokens.get(i..i + n).is_none_or(|run| run.iter().any(|&t| t != image_token)) {
            return Err(format!("an image of {n} tokens is not {n} image tokens in a row"));
        }
        for tt in 0..t {
            for hh in 0..h {
                for ww in 0..w {
                    out.push([next + tt as Pos, next + hh as Pos, next + ww as Pos]);
                }
            }
        }
        next += h.max(w) as Pos;
        i += n;
    }
    if images.next().is_some() {
        return Err("fewer image tokens than images".into());
    }
    Ok((out, next - tokens.len() as Pos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(h: usize, w: usize) -> Image {
        Image { grid: [1, h, w], merge: 2, patches: Vec::new(), hash: 0 }
    }

    #[test]
    fn an_image_turns_by_its_grid_and_the_text_after_it_by_its_larger_side() {
        // text, an image of 2×3 merged tokens, text.
        let tokens = [5, 6, 9, 9, 9, 9, 9, 9, 7];
        let (pos, delta) = positions(&tokens, 9, &[image(4, 6)]).unwrap();
        assert_eq!(&pos[..2], &[[0; 3], [1; 3]]);
        assert_eq!(&pos[2..5], &[[2, 2, 2], [2, 2, 3], [2, 2, 4]]);
        assert_eq!(pos[7], [2, 3, 4]);
        // After the image: its start (2) plus its larger side (3).
        assert_eq!(pos[8], [5; 3]);
        assert_eq!(delta, 6 - 9);
        // Text only: positions are the indices, no delta.
        let (pos, delta) = positions::<Image>(&[1, 2, 3], 9, &[]).unwrap();
        assert_eq!((pos, delta), (vec![[0; 3], [1; 3], [2; 3]], 0));
    }

    #[test]
    fn an_images_tokens_are_drawn_from_its_hash_and_found_by_row() {
        let with = |hash| Arc::new(Image { hash, ..image(4, 4) });
        let mut a = vec![5, 9, 9, 9, 9, 6];
        let pa = PromptImages::new(&mut a, 9, vec![with(1)], 100).unwrap();
        let mut b = vec![5, 9, 9, 9, 9, 6];
        PromptImages::new(&mut b, 9, vec![with(1)], 100).unwrap();
        let mut c = vec![5, 9, 9, 9, 9, 6];
        PromptImages::new(&mut c, 9, vec![with(2)], 100).unwrap();
        assert_eq!(a, b, "the same image, the same ids");
        let mut shown = a.clone();
        pa.restore(&mut shown);
        assert_eq!(pa.shown(&a), shown);
        assert_eq!(shown, [5, 9, 9, 9, 9, 6], "the processor's ids again");
        assert_ne!(a[1..5], c[1..5], "another image, other ids");
        assert!(a.iter().all(|&t| t < 100) && a[0] == 5 && a[5] == 6);
        assert_eq!(pa.rows, [1]);
        let reached = |rows| pa.reached(rows).collect::<Vec<_>>();
        assert_eq!((reached(0..1), reached(5..6)), (vec![], vec![]));
        assert_eq!((reached(1..2), reached(4..6), reached(0..9)), (vec![(0, 0..1)], vec![(0, 3..4)], vec![(0, 0..4)]));
        // Past the prompt: the index plus the delta (the image's 2×2 tokens take 2 positions).
        assert_eq!((pa.rope_at(5), pa.rope_at(6)), ([3; 3], [4; 3]));
    }

    #[test]
    fn image_tokens_and_images_must_agree() {
        assert!(positions(&[9, 9, 9], 9, &[image(2, 2)]).is_err());
        assert!(positions(&[9, 1], 9, &[image(2, 2), image(2, 2)]).is_err());
        assert!(positions(&[1, 2], 9, &[image(2, 2)]).is_err());
    }
}
