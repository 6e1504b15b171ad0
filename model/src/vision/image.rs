//! An image as a vision tower takes it: decoded, resized to a multiple of the merged patch size
//! within the processor's pixel bounds (Qwen2-VL's `smart_resize`) or to the processor's one size
//! (SigLIP's, Gemma 3's), rescaled, normalised and cut into patches in the tower's order
//! (transformers' `Qwen2VLImageProcessor` and `Gemma3ImageProcessor`, whose default torchvision
//! backend this follows: antialiased bicubic or bilinear, the rows' pass before the columns',
//! each rounded to 8 bits).

use std::hash::{Hash, Hasher};
use std::io::Cursor;
use std::path::Path;

use serde_json::Value;

use crate::error::LoadError;

/// Why an image could not be taken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageError {
    #[error("the image could not be decoded: {0}")]
    Decode(String),
    #[error("the image is {width}x{height}: {reason}")]
    Size { width: u32, height: u32, reason: String },
}

/// The largest side and pixel count decoded (a larger file is refused before it is decoded).
const MAX_SIDE: u32 = 16_384;
const MAX_DECODED_BYTES: u64 = 512 << 20;

/// How a model's processor prepares images (its `preprocessor_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    pub patch_size: usize,
    /// Frames a patch spans (an image is its one frame repeated).
    pub temporal_patch_size: usize,
    /// Patches merged into one token per side.
    pub merge_size: usize,
    pub min_pixels: usize,
    pub max_pixels: usize,
    /// Every image resized to this height and width, its aspect not kept (`size.height` and
    /// `size.width`: SigLIP's processors); `None`: within the pixel bounds, near its aspect.
    pub fixed: Option<(usize, usize)>,
    pub filter: Filter,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub rescale: f32,
}

/// The resampling filter (`resample`, in PIL's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// 2: a triangle of one pixel's reach (stretched when shrinking).
    Bilinear,
    /// 3: Keys' cubic of two pixels' reach.
    Bicubic,
}

impl Filter {
    /// How far the kernel reaches, in input pixels at scale 1.
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Bilinear => (1.0 - x.abs()).max(0.0),
            Filter::Bicubic => cubic(x),
        }
    }
}

impl Default for ImageProcessor {
    /// Qwen2-VL's.
    fn default() -> Self {
        Self {
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            fixed: None,
            filter: Filter::Bicubic,
            mean: [0.481_454_66, 0.457_827_5, 0.408_210_73],
            std: [0.268_629_54, 0.261_302_6, 0.275_777_1],
            rescale: 1.0 / 255.0,
        }
    }
}

/// One image, ready for the tower.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Image {
    /// Temporal, height and width in patches.
    pub grid: [usize; 3],
    /// Patches merged into one token per side.
    pub merge: usize,
    /// [t·h·w, channels · temporal · patch²]: each merge window's patches together, row by row.
    pub patches: Vec<f32>,
    /// The decoded pixels' hash: what tells two images apart where their tokens are the same.
    pub hash: u64,
}

/// Patches are finite numbers (decoded pixels, normalised): equality is an equivalence.
impl Eq for Image {}

impl Image {
    /// The tokens it takes in a prompt (its features' rows).
    pub fn tokens(&self) -> usize {
        self.grid.iter().product::<usize>() / (self.merge * self.merge)
    }
}

impl ImageProcessor {
    /// SigLIP's (Gemma 3's processor's defaults): every image `side` pixels square, bilinear,
    /// normalised to [−1, 1], one frame, patches of `patch` pixels pooled `merge` a side.
    pub fn siglip(side: usize, patch: usize, merge: usize) -> Self {
        Self {
            patch_size: patch,
            temporal_patch_size: 1,
            merge_size: merge,
            min_pixels: side * side,
            max_pixels: side * side,
            fixed: Some((side, side)),
            filter: Filter::Bilinear,
            mean: [0.5; 3],
            std: [0.5; 3],
            rescale: 1.0 / 255.0,
        }
    }

    /// `DIR/preprocessor_config.json`'s settings, Qwen2-VL's defaults for those it leaves out
    /// (and for all without the file).
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        Self::default().read_dir(dir)
    }

    /// `DIR/preprocessor_config.json`'s settings over these (these without the file).
    pub fn read_dir(self, dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("preprocessor_config.json");
        if !path.exists() {
            return Ok(self);
        }
        let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Io { path: path.clone(), source })?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| LoadError::Json { path: path.clone(), reason: e.to_string() })?;
        self.read(&value)
    }

    /// A `preprocessor_config.json`'s settings, Qwen2-VL's defaults for those it leaves out.
    pub fn from_value(v: &Value) -> Result<Self, LoadError> {
        Self::default().read(v)
    }

    /// The settings `v` gives, over these.
    fn read(self, v: &Value) -> Result<Self, LoadError> {
        let mut p = self;
        let bad = |field: &str, reason: &str| LoadError::Config {
            field: format!("preprocessor_config.{field}"),
            reason: reason.into(),
        };
        let count = |field: &str, value: Option<&Value>| -> Result<Option<usize>, LoadError> {
            match value {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if n > 0 => Ok(Some(n as usize)),
                    _ => Err(bad(field, "expected a positive integer")),
                },
            }
        };
        let triple = |field: &str| -> Result<Option<[f32; 3]>, LoadError> {
            match v.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_number) => {
                    Ok(Some(std::array::from_fn(|i| a[i].as_f64().unwrap_or(0.0) as f32)))
                }
                Some(_) => Err(bad(field, "expected three numbers")),
            }
        };
        let size = v.get("size");
        p.patch_size = count("patch_size", v.get("patch_size"))?.unwrap_or(p.patch_size);
        p.temporal_patch_size =
            count("temporal_patch_size", v.get("temporal_patch_size"))?.unwrap_or(p.temporal_patch_size);
        p.merge_size = count("merge_size", v.get("merge_size"))?.unwrap_or(p.merge_size);
        // transformers 5 writes the bounds into `size`; earlier processors beside it.
        p.min_pixels = count("min_pixels", v.get("min_pixels"))?
            .or(count("size.shortest_edge", size.and_then(|s| s.get("shortest_edge")))?)
            .unwrap_or(p.min_pixels);
        p.max_pixels = count("max_pixels", v.get("max_pixels"))?
            .or(count("size.longest_edge", size.and_then(|s| s.get("longest_edge")))?)
            .unwrap_or(p.max_pixels);
        let side = |name: &str| count(&format!("size.{name}"), size.and_then(|s| s.get(name)));
        p.fixed = match (side("height")?, side("width")?) {
            (Some(h), Some(w)) => Some((h, w)),
            (None, None) => p.fixed,
            _ => return Err(bad("size", "expected both height and width")),
        };
        p.filter = match v.get("resample").and_then(Value::as_u64) {
            None => p.filter,
            Some(2) => Filter::Bilinear,
            Some(3) => Filter::Bicubic,
            Some(other) => {
                return Err(bad("resample", &format!("{other}: only bilinear (2) and bicubic (3) are served")));
            }
        };
        if v.get("do_pan_and_scan").and_then(Value::as_bool) == Some(true) {
            tracing::warn!("preprocessor_config.do_pan_and_scan: images are not cut into crops, each is taken whole");
        }
        p.mean = triple("image_mean")?.unwrap_or(p.mean);
        p.std = triple("image_std")?.unwrap_or(p.std);
        if p.std.iter().any(|&s| s <= 0.0 || !s.is_finite()) {
            return Err(bad("image_std", "expected positive numbers"));
        }
        p.rescale = match v.get("rescale_factor").and_then(Value::as_f64) {
            Some(r) if r > 0.0 && r.is_finite() => r as f32,
            Some(_) => return Err(bad("rescale_factor", "expected a positive number")),
            None => p.rescale,
        };
        if p.min_pixels > p.max_pixels {
            return Err(bad("min_pixels", "larger than max_pixels"));
        }
        Ok(p)
    }

    /// The side every resized dimension is a multiple of.
    fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// Decodes an image file (PNG, JPEG, WebP) and prepares it.
    pub fn prepare(&self, bytes: &[u8]) -> Result<Image, ImageError> {
        let decode = |e: image::ImageError| ImageError::Decode(e.to_string());
        let mut reader = image::ImageReader::new(Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| ImageError::Decode(e.to_string()))?;
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(MAX_SIDE);
        limits.max_image_height = Some(MAX_SIDE);
        limits.max_alloc = Some(MAX_DECODED_BYTES);
        reader.limits(limits);
        let rgb = reader.decode().map_err(decode)?.to_rgb8();
        let (width, height) = rgb.dimensions();
        self.prepare_rgb(rgb.as_raw(), width as usize, height as usize)
    }

    /// Prepares `width`×`height` RGB pixels (row-major, 3 bytes a pixel).
    pub fn prepare_rgb(&self, rgb: &[u8], width: usize, height: usize) -> Result<Image, ImageError> {
        let size_error = |reason: String| ImageError::Size { width: width as u32, height: height as u32, reason };
        let (h, w) = self.resized(height, width).map_err(size_error)?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (width, height).hash(&mut hasher);
        rgb.hash(&mut hasher);
        let hash = hasher.finish();
        let pixels = resize(rgb, width, height, w, h, self.filter);
        Ok(Image {
            grid: [1, h / self.patch_size, w / self.patch_size],
            merge: self.merge_size,
            patches: self.patchify(&pixels, w, h),
            hash,
        })
    }

    /// The size an image of `height`×`width` is resized to: the processor's one size, or each
    /// side a multiple of `patch_size · merge_size`, near the original aspect, with the pixels
    /// within bounds.
    pub fn resized(&self, height: usize, width: usize) -> Result<(usize, usize), String> {
        if height == 0 || width == 0 {
            return Err("an empty image".into());
        }
        if let Some(fixed) = self.fixed {
            return Ok(fixed);
        }
        let (hf, wf) = (height as f64, width as f64);
        if hf.max(wf) / hf.min(wf) > 200.0 {
            return Err("its aspect ratio is past 200".into());
        }
        let factor = self.factor() as f64;
        // Python's round: halves to even.
        let round = |x: f64| (x / factor).round_ties_even() * factor;
        let (mut h, mut w) = (round(hf).max(factor), round(wf).max(factor));
        let (min, max) = (self.min_pixels as f64, self.max_pixels as f64);
        if h * w > max {
            let beta = (hf * wf / max).sqrt();
            h = factor.max((hf / beta / factor).floor() * factor);
            w = factor.max((wf / beta / factor).floor() * factor);
        } else if h * w < min {
            let beta = (min / (hf * wf)).sqrt();
            h = (hf * beta / factor).ceil() * factor;
            w = (wf * beta / factor).ceil() * factor;
        }
        Ok((h as usize, w as usize))
    }

    /// Normalised patches of `pixels` (`w`×`h` RGB, each side a multiple of the merged patch):
    /// merge windows row by row, each window's patches row by row, a patch's values by channel,
    /// then frame (the image repeated), then row and column.
    fn patchify(&self, pixels: &[u8], w: usize, h: usize) -> Vec<f32> {
        let (p, t, m) = (self.patch_size, self.temporal_patch_size, self.merge_size);
        let (gh, gw) = (h / p, w / p);
        let mut out = Vec::with_capacity(gh * gw * 3 * t * p * p);
        let value = |c: usize, y: usize, x: usize| {
            (pixels[(y * w + x) * 3 + c] as f32 * self.rescale - self.mean[c]) / self.std[c]
        };
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for mh in 0..m {
                    for mw in 0..m {
                        let (row, col) = ((bh * m + mh) * p, (bw * m + mw) * p);
                        for c in 0..3 {
                            for _ in 0..t {
                                for y in 0..p {
                                    out.extend((0..p).map(|x| value(c, row + y, col + x)));
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// Keys' bicubic (a = −0.5), as PIL and torch's antialiased resize weigh.
fn cubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// For each output index along one side: its first input index and weights (antialiased: the
/// kernel stretched by the scale when shrinking), in fixed point as torch's 8-bit resize has
/// them: 16-bit integers of as many fraction bits as the largest weight leaves room for, and
/// those bits.
fn weights(input: usize, output: usize, filter: Filter) -> (Vec<(usize, Vec<i32>)>, u32) {
    let float = float_weights(input, output, filter);
    let max = float.iter().flat_map(|(_, w)| w.iter().copied()).fold(0.0, f64::max);
    let mut bits = 0;
    while bits < 22 && ((0.5 + max * (1u64 << (bits + 1)) as f64) as i64) < 1 << 15 {
        bits += 1;
    }
    let scale = (1u64 << bits) as f64;
    let fixed = float
        .into_iter()
        .map(|(lo, w)| {
            let w = w.iter().map(|&x| x * scale).map(|v| (if v < 0.0 { v - 0.5 } else { v + 0.5 }) as i32).collect();
            (lo, w)
        })
        .collect();
    (fixed, bits)
}

fn float_weights(input: usize, output: usize, filter: Filter) -> Vec<(usize, Vec<f64>)> {
    let scale = input as f64 / output as f64;
    let stretch = scale.max(1.0);
    let support = filter.support() * stretch;
    (0..output)
        .map(|i| {
            let centre = (i as f64 + 0.5) * scale;
            let lo = ((centre - support + 0.5).floor().max(0.0)) as usize;
            let hi = ((centre + support + 0.5).floor() as usize).min(input);
            let mut w: Vec<f64> = (lo..hi).map(|j| filter.weight((j as f64 - centre + 0.5) / stretch)).collect();
            let sum: f64 = w.iter().sum();
            if sum != 0.0 {
                w.iter_mut().for_each(|x| *x /= sum);
            }
            (lo, w)
        })
        .collect()
}

/// A fixed-point sum of `bits` fraction bits, rounded half up, as 8 bits.
fn to_u8(sum: i64, bits: u32) -> u8 {
    let half = if bits == 0 { 0 } else { 1i64 << (bits - 1) };
    ((sum + half) >> bits).clamp(0, 255) as u8
}

/// Antialiased resize of RGB pixels: along rows first, then along columns, each pass rounded to
/// 8 bits (what torchvision's uint8 resize does; the same size: a copy).
fn resize(rgb: &[u8], w: usize, h: usize, out_w: usize, out_h: usize, filter: Filter) -> Vec<u8> {
    let across = if out_w == w {
        rgb.to_vec()
    } else {
        let (cols, bits) = weights(w, out_w, filter);
        let mut out = vec![0u8; h * out_w * 3];
        for y in 0..h {
            let row = &rgb[y * w * 3..(y + 1) * w * 3];
            for (x, (lo, ws)) in cols.iter().enumerate() {
                for c in 0..3 {
                    let v: i64 = ws.iter().enumerate().map(|(k, &wt)| wt as i64 * row[(lo + k) * 3 + c] as i64).sum();
                    out[(y * out_w + x) * 3 + c] = to_u8(v, bits);
                }
            }
        }
        out
    };
    if out_h == h {
        return across;
    }
    let (rows, bits) = weights(h, out_h, filter);
    let mut out = vec![0u8; out_h * out_w * 3];
    for (y, (lo, ws)) in rows.iter().enumerate() {
        for x in 0..out_w * 3 {
            let v: i64 =
                ws.iter().enumerate().map(|(k, &wt)| wt as i64 * across[(lo + k) * out_w * 3 + x] as i64).sum();
            out[y * out_w * 3 + x] = to_u8(v, bits);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_rounded_to_the_merged_patch_within_the_bounds() {
        let p = ImageProcessor { max_pixels: 28 * 28 * 16, ..ImageProcessor::default() };
        assert_eq!(p.resized(56, 56), Ok((56, 56)));
        assert_eq!(p.resized(60, 100), Ok((56, 112)));
        // Past max_pixels: scaled down, each side floored to a multiple of 28.
        assert_eq!(p.resized(130, 150), Ok((84, 112)));
        // Below min_pixels: scaled up.
        assert_eq!(p.resized(10, 10), Ok((56, 56)));
        assert!(p.resized(1, 500).is_err());
        assert!(p.resized(0, 5).is_err());
    }

    #[test]
    fn resizing_keeps_a_flat_image_flat_and_a_same_size_image_as_it_is() {
        let flat = vec![77u8; 30 * 20 * 3];
        let noisy: Vec<u8> = (0..12 * 9 * 3).map(|i| (i * 37 % 251) as u8).collect();
        for filter in [Filter::Bicubic, Filter::Bilinear] {
            assert!(resize(&flat, 30, 20, 56, 28, filter).iter().all(|&v| v == 77));
            assert!(resize(&flat, 30, 20, 7, 5, filter).iter().all(|&v| v == 77));
            assert_eq!(resize(&noisy, 12, 9, 12, 9, filter), noisy);
        }
    }

    #[test]
    fn bad_files_and_processor_settings_are_refused_by_name() {
        let p = ImageProcessor::default();
        assert!(matches!(p.prepare(b"not an image"), Err(ImageError::Decode(_))));
        let bad = serde_json::json!({"image_std": [0.5, 0.0, 0.5]});
        let err = ImageProcessor::from_value(&bad).unwrap_err();
        assert!(err.to_string().contains("image_std"), "{err}");
        let v2 = serde_json::json!({"size": {"shortest_edge": 100, "longest_edge": 200_000}});
        let p = ImageProcessor::from_value(&v2).unwrap();
        assert_eq!((p.min_pixels, p.max_pixels, p.fixed, p.filter), (100, 200_000, None, Filter::Bicubic));
        // SigLIP's (Gemma 3's): one size whatever the image, bilinear.
        let siglip = serde_json::json!({"size": {"height": 896, "width": 896}, "resample": 2});
        let p = ImageProcessor::from_value(&siglip).unwrap();
        assert_eq!((p.fixed, p.filter, p.resized(300, 40)), (Some((896, 896)), Filter::Bilinear, Ok((896, 896))));
        // A file that leaves the size out keeps the defaults' (SigLIP's one size).
        let p = ImageProcessor::siglip(896, 14, 4).read(&serde_json::json!({"image_mean": [0.5, 0.5, 0.5]})).unwrap();
        assert_eq!((p.fixed, p.filter), (Some((896, 896)), Filter::Bilinear));
        for bad in [serde_json::json!({"resample": 1}), serde_json::json!({"size": {"height": 896}})] {
            let err = ImageProcessor::from_value(&bad).unwrap_err().to_string();
            assert!(err.contains("resample") || err.contains("size"), "{err}");
        }
    }
}
