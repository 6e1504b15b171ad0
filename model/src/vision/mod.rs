//! Images in: a model that sees them turns each image into rows of its language model's input.
//! The caller prepares an image ([`ImageProcessor::prepare`]: decoded, resized, cut into
//! patches), repeats the model's image token once per feature row where the chat template put it
//! ([`VisionInfo::image_token`]), and sends the prompt with its images; the worker encodes each
//! image once ([`crate::Context::encode_image`]) and gives its rows in place of those tokens'
//! embeddings, each turned by its place in the image ([`positions`], M-RoPE).
//!
//! Served: Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's and Qwen3.5's towers and Gemma 3's (`tower`), from
//! a checkpoint's tensors (`visual.`; `vision_tower.` and `multi_modal_projector.`) or, beside a
//! GGUF model, llama.cpp's projector file (`mmproj`); Qwen3-VL's deepstack features ride with its
//! image rows ([`Features::deepstack`]). Gemma 3's images are framed in text by the processor
//! ([`Framing`]), turn by their positions (not M-RoPE), and their rows attend to each other both
//! ways ([`PromptImages::sees`]).

mod image;
mod mmproj;
mod tower;

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
    /// writes it once per image (or [`Framing`] puts it there), which the caller repeats
    /// [`Image::tokens`] times.
    pub image_token: u32,
    pub framing: Option<Framing>,
    /// Whether the language model turns an image's rows by their rows and columns (Qwen's
    /// M-RoPE, [`positions`]), not by their places in the prompt.
    pub mrope: bool,
    /// Whether an image's rows attend to each other both ways (Gemma 3's), not only to those
    /// before them.
    pub bidirectional: bool,
}

impl VisionInfo {
    /// Qwen's: the template writes the image token; M-RoPE; causal.
    fn qwen(processor: ImageProcessor, image_token: u32) -> Self {
        Self { processor, image_token, framing: None, mrope: true, bidirectional: false }
    }
}

/// Where the chat template writes an image's start token rather than its image token (Gemma 3's
/// `<start_of_image>`): the processor puts two newlines, the start token, the image token, the
/// end token and two newlines in its place, in the text, before it is tokenized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub start: u32,
    pub end: u32,
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
    tower: tower::Tower,
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
        let tower = tower::Tower::load(tower_config, src.as_ref(), device)?;
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

type Probed = (VisionInfo, tower::TowerConfig, Box<dyn TensorSource>);

/// The model's vision settings, checked against its language model, and its tower's tensors,
/// where it has a served tower.
fn probe(source: &ModelSource, config: &ModelConfig) -> Result<Option<Probed>, LoadError> {
    let probed = match source {
        ModelSource::Dir(dir) => probe_dir(dir, config)?,
        ModelSource::Gguf { mmproj: None, .. } => None,
        ModelSource::Gguf { path, mmproj: Some(mmproj) } => Some(mmproj::probe(path, mmproj, config)?),
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
    if model_type == "gemma3" {
        return probe_gemma3(dir, &top, vision, config);
    }
    let Some(tower_config) = tower::TowerConfig::from_value(vision, model_type)? else {
        tracing::info!(model_type, "this model's vision tower is not served: text only");
        return Ok(None);
    };
    if config.mrope.is_none() {
        return Ok(None);
    }
    let Some(src) = Checkpoint::vision(dir, &[("model.visual.", ""), ("visual.", "")])? else {
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
    Ok(Some((VisionInfo::qwen(processor, image_token), tower_config, Box::new(src))))
}

/// Gemma 3's tower (`vision_tower.`, SigLIP's) and projector (`multi_modal_projector.`, as
/// `projector.`), its processor, and its start, end and image tokens.
fn probe_gemma3(dir: &Path, top: &Value, vision: &Value, config: &ModelConfig) -> Result<Option<Probed>, LoadError> {
    let id = |field: &str, default: u64| -> Result<u32, LoadError> {
        match top.get(field).map(Value::as_u64).unwrap_or(Some(default)) {
            Some(id) if (id as usize) < config.vocab_size => Ok(id as u32),
            _ => Err(LoadError::Config { field: field.into(), reason: "not a token of the vocabulary".into() }),
        }
    };
    let tokens = match top.get("mm_tokens_per_image") {
        None => 256,
        Some(v) => v.as_u64().filter(|&n| n > 0).ok_or_else(|| LoadError::Config {
            field: "mm_tokens_per_image".into(),
            reason: "expected a positive integer".into(),
        })? as usize,
    };
    let tower_config = tower::TowerConfig::gemma3(vision, tokens, config.hidden_size)?;
    const PREFIXES: [(&str, &str); 6] = [
        ("model.vision_tower.vision_model.", ""),
        ("vision_tower.vision_model.", ""),
        ("model.vision_tower.", ""),
        ("vision_tower.", ""),
        ("model.multi_modal_projector.", "projector."),
        ("multi_modal_projector.", "projector."),
    ];
    let Some(src) = Checkpoint::vision(dir, &PREFIXES)? else {
        return Ok(None);
    };
    let (patch, merge) = (tower_config.patch_size, tower_config.merge_size);
    let tower::Family::Gemma3 { grid } = tower_config.family else { unreachable!("a Gemma 3 tower") };
    let side = grid * patch;
    let processor = ImageProcessor::siglip(side, patch, merge).read_dir(dir)?;
    if processor.fixed != Some((side, side)) {
        return Err(LoadError::Config {
            field: "preprocessor_config.size".into(),
            reason: format!("the tower takes images of {side}x{side} pixels"),
        });
    }
    let info = VisionInfo {
        processor: ImageProcessor { patch_size: patch, temporal_patch_size: 1, merge_size: merge, ..processor },
        image_token: id("image_token_index", 262_144)?,
        framing: Some(Framing { start: id("boi_token_index", 255_999)?, end: id("eoi_token_index", 256_000)? }),
        mrope: false,
        bidirectional: true,
    };
    Ok(Some((info, tower_config, Box::new(src))))
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
    /// Whether an image's rows attend to each other both ways ([`VisionInfo::bidirectional`]).
    #[serde(default)]
    pub bidirectional: bool,
}

impl PromptImages {
    /// The images of `tokens`, whose runs of the model's image token are the images' tokens in
    /// order (the chat template's one per image, repeated [`Image::tokens`] times). Each run's
    /// tokens become ids drawn from its image's hash and its place in the run, below
    /// `vocab_size`: the model reads those rows' embeddings from the image, and two prompts share
    /// a prefix through an image only where it is the same image. M-RoPE's positions where the
    /// model turns images so ([`VisionInfo::mrope`]), else none: every row turns by its place.
    pub fn new(
        tokens: &mut [u32],
        vision: &VisionInfo,
        images: Vec<Arc<Image>>,
        vocab_size: usize,
    ) -> Result<Self, String> {
        let image_token = vision.image_token;
        let (rope, delta) = match positions(tokens, image_token, &images)? {
            _ if !vision.mrope => (Vec::new(), 0),
            turned => turned,
        };
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
        Ok(Self { images, rows, rope, delta, image_token, bidirectional: vision.bidirectional })
    }

    /// Whether the prompt's rows turn by M-RoPE's positions ([`Self::rope_at`]), not by their
    /// places.
    pub fn mrope(&self) -> bool {
        !self.rope.is_empty()
    }

    /// Each image's prompt rows.
    fn spans(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.images.iter().zip(&self.rows).map(|(image, &row)| row..row + image.tokens())
    }

    /// The last position row `pos` of the sequence attends to: the last of its image where the
    /// image's rows see each other both ways, else its own.
    pub fn sees(&self, pos: Pos) -> Pos {
        let within = |s: &Range<usize>| self.bidirectional && s.contains(&(pos as usize));
        self.spans().find(within).map_or(pos, |s| s.end as Pos - 1)
    }

    /// Where a prefill chunk of prompt rows `[start, end)` ends so that no image whose rows see
    /// each other both ways is cut: before an image the chunk would cut, or, where the chunk
    /// starts at (or within) it, past its end (over the step's budget: an image is computed in
    /// one pass).
    pub fn chunk_end(&self, start: usize, end: usize) -> usize {
        let cut = |s: &Range<usize>| self.bidirectional && s.start < end && end < s.end;
        match self.spans().find(cut) {
            Some(s) if s.start > start => s.start,
            Some(s) => s.end,
            None => end,
        }
    }

    /// A reused prefix of `len` rows, cut back to the start of an image whose rows see each other
    /// both ways where it ends within one (those rows were computed seeing the rest of it).
    pub fn prefix_end(&self, len: usize) -> usize {
        let cut = |s: &Range<usize>| self.bidirectional && s.start < len && len < s.end;
        self.spans().find(cut).map_or(len, |s| s.start)
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

    fn vision(image_token: u32, gemma: bool) -> VisionInfo {
        VisionInfo {
            processor: ImageProcessor::default(),
            image_token,
            framing: None,
            mrope: !gemma,
            bidirectional: gemma,
        }
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
        let pa = PromptImages::new(&mut a, &vision(9, false), vec![with(1)], 100).unwrap();
        let mut b = vec![5, 9, 9, 9, 9, 6];
        PromptImages::new(&mut b, &vision(9, false), vec![with(1)], 100).unwrap();
        let mut c = vec![5, 9, 9, 9, 9, 6];
        PromptImages::new(&mut c, &vision(9, false), vec![with(2)], 100).unwrap();
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
        // Causal: each row sees up to itself, any chunk and prefix stand.
        assert!(pa.mrope() && !pa.bidirectional);
        assert_eq!((pa.sees(2), pa.chunk_end(0, 3), pa.prefix_end(3)), (2, 3, 3));
    }

    #[test]
    fn a_bidirectional_image_is_seen_whole_and_never_cut() {
        // Text, an image of 4 tokens at rows 2..6, text, an image at rows 7..11, text.
        let with = |hash| Arc::new(Image { hash, ..image(4, 4) });
        let mut t = vec![5, 6, 9, 9, 9, 9, 7, 9, 9, 9, 9, 8];
        let p = PromptImages::new(&mut t, &vision(9, true), vec![with(1), with(2)], 100).unwrap();
        assert!(!p.mrope(), "turned by their places");
        assert_eq!((p.rope_at(3), p.rope_at(20)), ([3; 3], [20; 3]));
        let sees: Vec<Pos> = (0..12).map(|pos| p.sees(pos)).collect();
        assert_eq!(sees, [0, 1, 5, 5, 5, 5, 6, 10, 10, 10, 10, 11]);
        // A chunk ending within an image stops before it, or, starting at it, takes it whole.
        assert_eq!((p.chunk_end(0, 4), p.chunk_end(0, 6), p.chunk_end(0, 8)), (2, 6, 7));
        assert_eq!((p.chunk_end(2, 3), p.chunk_end(7, 8), p.chunk_end(6, 12)), (6, 11, 12));
        // A prefix ending within an image is reused up to its start.
        assert_eq!((p.prefix_end(4), p.prefix_end(6), p.prefix_end(9), p.prefix_end(11)), (2, 6, 7, 11));
    }

    #[test]
    fn image_tokens_and_images_must_agree() {
        assert!(positions(&[9, 9, 9], 9, &[image(2, 2)]).is_err());
        assert!(positions(&[9, 1], 9, &[image(2, 2), image(2, 2)]).is_err());
        assert!(positions(&[1, 2], 9, &[image(2, 2)]).is_err());
    }
}
