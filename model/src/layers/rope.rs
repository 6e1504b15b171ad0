use std::cell::OnceCell;
use std::ops::Range;

use burn::tensor::{Device, Tensor, TensorData};

use super::RmsNorm;
use crate::config::{MRope, ModelConfig, RopeScaling, yarn_mscale};
use crate::kv::{Pos, SeqSet};

/// Rotary position embedding in the "rotate half" layout of Hugging Face's models: dimension
/// `i` of the first half pairs with `i + head_dim/2`.
#[derive(Debug, Clone)]
pub struct Rope {
    /// [head_dim / 2] `theta^(−2i/head_dim)`, stretched as the config's scaling says, computed
    /// in f32 as transformers does.
    inv_freq: Vec<f32>,
    /// cos and sin are scaled by this (YaRN's attention factor; 1 otherwise).
    attention_factor: f32,
    /// LongRoPE's frequencies past the original context, and that context: a sequence whose last
    /// position in a pass reaches it turns that pass's rows by these instead (`tables_in`).
    long: Option<(Vec<f32>, Pos)>,
    /// M-RoPE's streams, where the model has it ([`Self::tables_streams`]).
    mrope: Option<MRope>,
}

/// cos and sin of every (token, frequency): [n, head_dim/2] each, on the host (for the CPU
/// kernel), and for the Burn ops as [n, 1, head_dim] tensors `[cos, cos]` and `[−sin, sin]`.
pub struct RopeTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
    shape: [usize; 3],
    device: Device,
    /// The tensors, made on the Burn path's first use and shared by every layer of the pass
    /// (the CPU kernel reads the vectors and never makes them).
    tensors: OnceCell<(Tensor<3>, Tensor<3>)>,
    /// [2, n, head_dim/2]: cos, then sin, for the GPU kernel (one upload a pass, at its first use).
    stacked: OnceCell<Tensor<3>>,
}

/// cos and sin of frequency `f` at position `p`, scaled by `scale`. The dimensions a partial
/// rotary embedding leaves alone (frequency 0) pass through unscaled: the attention factor
/// scales the rotated part only.
fn turn(f: f32, p: Pos, scale: f32) -> (f32, f32) {
    if f == 0.0 {
        return (1.0, 0.0);
    }
    let angle = (p as f32 * f) as f64; // the f32 product, as transformers computes it
    (angle.cos() as f32 * scale, angle.sin() as f32 * scale)
}

impl RopeTables {
    /// Pair `i` of row `r` turned by `frequencies[i]` at position `positions[r][streams[i]]`
    /// (M-RoPE's streams; a vision tower's 2-D rows), cos and sin scaled by `scale`.
    pub fn of_streams(
        frequencies: &[f32],
        streams: &[usize],
        positions: &[[Pos; 3]],
        scale: f32,
        device: &Device,
    ) -> Self {
        let half = frequencies.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for p in positions {
            for (&f, &s) in frequencies.iter().zip(streams) {
                let (c, s) = turn(f, p[s], scale);
                cos.push(c);
                sin.push(s);
            }
        }
        Self::from_parts(cos, sin, positions.len(), half, device)
    }

    fn from_parts(cos: Vec<f32>, sin: Vec<f32>, n: usize, half: usize, device: &Device) -> Self {
        Self {
            cos,
            sin,
            shape: [n, 1, half],
            device: device.clone(),
            tensors: OnceCell::new(),
            stacked: OnceCell::new(),
        }
    }

    fn tensors(&self) -> (Tensor<3>, Tensor<3>) {
        let [n, _, half] = self.shape;
        let make = |v: &[f32], lo_sign: f32| {
            let mut full = Vec::with_capacity(2 * v.len());
            for row in v.chunks(half) {
                full.extend(row.iter().map(|x| lo_sign * x));
                full.extend_from_slice(row);
            }
            crate::transfers::upload(TensorData::new(full, [n, 1, 2 * half]), &self.device)
        };
        self.tensors.get_or_init(|| (make(&self.cos, 1.0), make(&self.sin, -1.0))).clone()
    }

    /// [2, n, head_dim/2]: cos, then sin (the GPU kernels' table).
    pub fn stacked(&self) -> &Tensor<3> {
        let [n, _, half] = self.shape;
        self.stacked.get_or_init(|| {
            crate::transfers::upload(TensorData::new(self.stacked_values(), [2, n, half]), &self.device)
        })
    }

    /// Half a head's dimensions: the tables' last dimension.
    pub fn half(&self) -> usize {
        self.shape[2]
    }

    /// [`Self::stacked`]'s values: cos, then sin.
    pub fn stacked_values(&self) -> Vec<f32> {
        [self.cos.as_slice(), &self.sin].concat()
    }

    /// These tables with [`Self::stacked`] given (a replayed step's buffer, written already with
    /// [`Self::stacked_values`]) instead of uploaded.
    pub fn preset(self, stacked: Tensor<3>) -> Self {
        let _ = self.stacked.set(stacked);
        self
    }
}

impl Rope {
    /// Unscaled: `theta^(−2i/head_dim)`.
    pub fn new(head_dim: usize, theta: f64) -> Self {
        let inv_freq = (0..head_dim / 2).map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32)).collect();
        Self { inv_freq, attention_factor: 1.0, long: None, mrope: None }
    }

    /// The config's rotary embedding, scaled as its `rope_scaling` says (transformers'
    /// `modeling_rope_utils`, in the same f32 arithmetic).
    ///
    /// With a partial rotary embedding (Qwen3.5's), the loaded q and k rows are ordered so the
    /// turned dimensions' pairs are `i` and `i + head_dim/2` (`decoder::weights::rotary_order`),
    /// and the other dimensions get frequency 0: cos 1, sin 0, the same kernels either way.
    ///
    /// Latent attention turns its rotated part alone (`LatentAttention::project`): tables of
    /// that part's width.
    pub fn from_config(c: &ModelConfig) -> Self {
        match &c.latent {
            Some(l) => Self::scaled(&ModelConfig { head_dim: l.rope_dim, ..c.clone() }),
            None => Self::scaled(c),
        }
    }

    /// The local layers' own rotary embedding (Gemma 3's sliding-window layers), where the model
    /// has them: their own base, unscaled. `None` where they rotate as the global layers.
    pub fn local(c: &ModelConfig) -> Option<Self> {
        let theta = c.sliding.as_ref()?.rope_theta?;
        Some(Self::scaled(&ModelConfig { rope_theta: theta, rope_scaling: RopeScaling::None, ..c.clone() }))
    }

    fn scaled(c: &ModelConfig) -> Self {
        let mut rope = Self::new(c.rotary_dim, c.rope_theta);
        rope.inv_freq.resize(c.head_dim / 2, 0.0);
        rope.mrope = c.mrope;
        let d = c.rotary_dim as f32;
        match &c.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => rope.inv_freq.iter_mut().for_each(|f| *f /= *factor as f32),
            RopeScaling::Factors(factors) => rope.inv_freq.iter_mut().zip(factors).for_each(|(f, by)| *f /= by),
            &RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let (factor, low, high) = (factor as f32, low_freq_factor as f32, high_freq_factor as f32);
                let old = original_max_position_embeddings as f32;
                let (low_wavelen, high_wavelen) = (old / low, old / high);
                for f in &mut rope.inv_freq {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    let scaled = if wavelen > low_wavelen { *f / factor } else { *f };
                    let medium = (high_wavelen..=low_wavelen).contains(&wavelen);
                    let smooth = (old / wavelen - low) / (high - low);
                    *f = if medium { (1.0 - smooth) * scaled / factor + smooth * scaled } else { scaled };
                }
            }
            RopeScaling::LongRope { short, long, original, attention_factor } => {
                // 1 / (factor · θ^(2i/d)), in f32 as transformers computes it.
                let theta = c.rope_theta as f32;
                let scaled = |factors: &[f32]| -> Vec<f32> {
                    let mut f: Vec<f32> =
                        factors.iter().enumerate().map(|(i, by)| 1.0 / (by * theta.powf((2 * i) as f32 / d))).collect();
                    f.resize(c.head_dim / 2, 0.0);
                    f
                };
                rope.inv_freq = scaled(short);
                rope.long = Some((scaled(long), *original as Pos));
                rope.attention_factor = *attention_factor as f32;
            }
            &RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                attention_factor,
                beta_fast,
                beta_slow,
                truncate,
            } => {
                let base = c.rope_theta;
                let original = original_max_position_embeddings.unwrap_or(c.max_position_embeddings) as f64;
                let correction = |rotations: f64| {
                    (d as f64 * (original / (rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln())
                };
                let (low, high) = (correction(beta_fast), correction(beta_slow));
                let (low, high) = if truncate { (low.floor(), high.ceil()) } else { (low, high) };
                let low = low.max(0.0) as f32;
                let mut high = high.min(d as f64 - 1.0) as f32;
                if low == high {
                    high += 0.001;
                }
                for (i, f) in rope.inv_freq.iter_mut().enumerate().take(c.rotary_dim / 2) {
                    let pos_freq = (base as f32).powf((2 * i) as f32 / d);
                    let (extrapolation, interpolation) = (1.0 / pos_freq, 1.0 / (factor as f32 * pos_freq));
                    let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp;
                    *f = interpolation * (1.0 - keep) + extrapolation * keep;
                }
                rope.attention_factor = attention_factor.unwrap_or_else(|| yarn_mscale(factor, 1.0)) as f32;
            }
        }
        rope
    }

    /// Tables for rotating to each of `positions`.
    pub fn tables(&self, positions: &[Pos], device: &Device) -> RopeTables {
        self.tables_in(positions, &[], device)
    }

    /// Tables for rotating to each of `positions`, the rows of sequences `seqs` (one set a row;
    /// empty: one sequence): with LongRoPE, a sequence's rows turn by the long frequencies when
    /// its last position in the pass reaches past the original context (transformers' rule for
    /// a forward of one sequence, decided per sequence so a row's rotation does not depend on
    /// the other sequences of its batch).
    pub fn tables_in(&self, positions: &[Pos], seqs: &[SeqSet], device: &Device) -> RopeTables {
        let Some((long, original)) = &self.long else {
            return Self::tables_of(&[&self.inv_freq], &[], positions, self.attention_factor, device);
        };
        let mut last: Vec<(SeqSet, Pos)> = Vec::new();
        for (i, &p) in positions.iter().enumerate() {
            let set = seqs.get(i).copied().unwrap_or_default();
            match last.iter_mut().find(|(s, _)| *s == set) {
                Some((_, max)) => *max = (*max).max(p),
                None => last.push((set, p)),
            }
        }
        let choice: Vec<usize> = (0..positions.len())
            .map(|i| {
                let set = seqs.get(i).copied().unwrap_or_default();
                let max = last.iter().find(|(s, _)| *s == set).map_or(0, |(_, m)| *m);
                usize::from(max >= *original)
            })
            .collect();
        Self::tables_of(&[&self.inv_freq, long], &choice, positions, self.attention_factor, device)
    }

    /// Tables for rotating to each of `positions` by M-RoPE's three streams (temporal, height,
    /// width): an image's tokens turn by their place in its grid. A model without M-RoPE turns
    /// by the first stream. A row whose three are one turns as [`Self::tables`] turns it.
    pub fn tables_streams(&self, positions: &[[Pos; 3]], device: &Device) -> RopeTables {
        let streams: Vec<usize> = match &self.mrope {
            Some(m) => (0..self.inv_freq.len()).map(|i| m.stream(i)).collect(),
            None => vec![0; self.inv_freq.len()],
        };
        RopeTables::of_streams(&self.inv_freq, &streams, positions, self.attention_factor, device)
    }

    /// Tables for rotating cached keys by each of `deltas` (rotations compose; the attention
    /// factor was applied when the keys were written).
    pub fn shift_tables(&self, deltas: &[Pos], device: &Device) -> RopeTables {
        self.tables_scaled(deltas, 1.0, device)
    }

    /// Tables that turn nothing (cos 1, sin 0) for `n` tokens: a layer without the rotary
    /// embedding (SmolLM3's NoPE layers) in a pass whose other layers have it.
    pub fn unturned_tables(&self, n: usize, device: &Device) -> RopeTables {
        Self::tables_of(&[&vec![0.0; self.inv_freq.len()]], &[], &vec![0; n], 1.0, device)
    }

    fn tables_scaled(&self, positions: &[Pos], scale: f32, device: &Device) -> RopeTables {
        Self::tables_of(&[&self.inv_freq], &[], positions, scale, device)
    }

    /// Row `i` turns by `frequencies[choice[i]]` (the first when `choice` is empty).
    fn tables_of(
        frequencies: &[&[f32]],
        choice: &[usize],
        positions: &[Pos],
        scale: f32,
        device: &Device,
    ) -> RopeTables {
        let half = frequencies[0].len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for (i, &p) in positions.iter().enumerate() {
            for &f in frequencies[choice.get(i).copied().unwrap_or(0)] {
                let (c, s) = turn(f, p, scale);
                cos.push(c);
                sin.push(s);
            }
        }
        RopeTables::from_parts(cos, sin, positions.len(), half, device)
    }

    /// # Shapes
    /// x: [n, heads, head_dim] → [n, heads, head_dim]; tables for the same n tokens.
    pub fn apply(x: Tensor<3>, t: &RopeTables) -> Tensor<3> {
        let [n, h, d] = x.dims();
        let half = d / 2;
        // [x1·cos − x2·sin, x2·cos + x1·sin] as x·[cos, cos] + [x2, x1]·[−sin, sin], the halves
        // swapped by one flip: four kernels on a GPU instead of eight, the same products and sums.
        let swapped = x.clone().reshape([n, h, 2, half]).flip([2]).reshape([n, h, d]);
        let (cos, sin) = t.tensors();
        x * cos + swapped * sin
    }

    /// q, k and v from the stacked q/k/v projection's output: q's heads (columns `q`, first) and
    /// k's (columns `k`, right after q's) rotated, v (the columns after k's) as it was; with
    /// `norms`, q's and k's heads RMS-normalised by them first (Qwen3), in the same pass where
    /// the CPU kernel runs.
    ///
    /// # Shapes
    /// qkv: [n, width] → [n, q.len()], [n, k.len()], [n, width − k.end]; tables for the same n
    /// tokens.
    pub fn apply_qk(
        qkv: Tensor<2>,
        q: Range<usize>,
        k: Range<usize>,
        t: &RopeTables,
        norms: Option<&[RmsNorm; 2]>,
    ) -> [Tensor<2>; 3] {
        assert!(q.start == 0 && q.end == k.start, "apply_qk: q's heads come first, then k's");
        let d = 2 * t.shape[2];
        let weights = norms.map(RmsNorm::qk);
        let (qk, v) = match crate::kernels::rope_qk(&qkv, q.clone(), k.clone(), d, (&t.cos, &t.sin), weights) {
            Some(y) => (y.clone().narrow(1, 0, k.end), y),
            None => (Self::apply_qk_ops(qkv.clone(), q.clone(), k.clone(), t, norms), qkv),
        };
        let width = v.dims()[1];
        [qk.clone().narrow(1, 0, q.end), qk.narrow(1, k.start, k.len()), v.narrow(1, k.end, width - k.end)]
    }

    /// q's and k's heads of [`Self::apply_qk`], rotated through Burn's ops (any backend):
    /// [n, k.end].
    fn apply_qk_ops(
        qkv: Tensor<2>,
        q: Range<usize>,
        k: Range<usize>,
        t: &RopeTables,
        norms: Option<&[RmsNorm; 2]>,
    ) -> Tensor<2> {
        let d = 2 * t.shape[2];
        let qkv = match norms {
            Some([nq, nk]) => RmsNorm::forward_parts(qkv, [(nq, q.clone()), (nk, k.clone())]),
            None => qkv,
        };
        // q's heads and k's, side by side, rotated as one block: one kernel on a GPU, else half
        // the launches of rotating each (a GPU pays host time per launch); v is never copied
        // back beside them.
        if let Some(qk) = crate::kernels::rope(&qkv, k.end, d, t.stacked()) {
            return qk;
        }
        let n = qkv.dims()[0];
        let qk = qkv.narrow(1, 0, k.end).reshape([n, k.end / d, d]);
        Rope::apply(qk, t).reshape([n, k.end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(scaling: &str) -> ModelConfig {
        let text = format!(
            r#"{{"model_type":"llama","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,
            "intermediate_size":8,"vocab_size":8,"max_position_embeddings":256,"rope_theta":10000.0,
            "rope_scaling":{scaling}}}"#
        );
        ModelConfig::from_json_str(&text).unwrap()
    }

    /// Linear scaling divides every frequency; Llama 3's keeps the high ones and divides the low
    /// ones; YaRN's cos and sin carry 0.1 · ln(factor) + 1 (transformers' values for these).
    #[test]
    fn scalings_stretch_the_frequencies_they_should() {
        let plain = Rope::new(16, 10_000.0);
        let linear = Rope::from_config(&config(r#"{"type":"linear","factor":4.0}"#));
        for (a, b) in plain.inv_freq.iter().zip(&linear.inv_freq) {
            assert_eq!(*b, a / 4.0);
        }
        let llama3 = Rope::from_config(&config(
            r#"{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}"#,
        ));
        assert_eq!(llama3.inv_freq[0], plain.inv_freq[0], "the highest frequency is kept");
        assert_eq!(llama3.inv_freq[7], plain.inv_freq[7] / 8.0, "the lowest is divided by the factor");
        let yarn =
            Rope::from_config(&config(r#"{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":64}"#));
        assert!((yarn.attention_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
        let t = yarn.tables(&[0], &Device::flex());
        assert!((t.cos[0] - yarn.attention_factor).abs() < 1e-6, "cos(0) carries the attention factor");
        let shift = yarn.shift_tables(&[0], &Device::flex());
        assert_eq!(shift.cos[0], 1.0, "a shift rotates keys that already carry it");
    }

    /// The Burn ops' rotation (the GPU path) is the rotate-half formula, head by head, with
    /// each token's own angles; the stacked q/k/v form rotates q's and k's heads and keeps v's.
    #[test]
    fn the_burn_rotation_is_rotate_half() {
        let (n, heads, d) = (3, 2, 8);
        let device = Device::flex();
        let rope = Rope::new(d, 10_000.0);
        let t = rope.tables(&[0, 5, 17], &device);
        let x: Vec<f32> = crate::kernels::test_values(n * heads * d, 4).iter().map(|v| v * 3.0).collect();
        let got = Rope::apply(Tensor::from_data(TensorData::new(x.clone(), [n, heads, d]), &device), &t)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let half = d / 2;
        for (at, (x, y)) in x.chunks(d).zip(got.chunks(d)).enumerate() {
            let token = at / heads;
            for i in 0..half {
                let (cos, sin) = (t.cos[token * half + i], t.sin[token * half + i]);
                assert_eq!(y[i], x[i] * cos - x[i + half] * sin, "head {at} dim {i}");
                assert_eq!(y[i + half], x[i + half] * cos + x[i] * sin, "head {at} dim {}", i + half);
            }
        }
        // q: 2 heads, k: 1, v: 1. The Burn ops rotate q's and k's heads as `apply` does; the CPU
        // kernel's q, k and v (what `apply_qk` gives on this backend) agree, v unchanged.
        let qkv: Vec<f32> = crate::kernels::test_values(n * 4 * d, 5);
        let stacked = Tensor::<2>::from_data(TensorData::new(qkv.clone(), [n, 4 * d]), &device);
        let values = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        let ops = values(Rope::apply_qk_ops(stacked.clone(), 0..2 * d, 2 * d..3 * d, &t, None));
        let heads = Tensor::<3>::from_data(TensorData::new(qkv.clone(), [n, 4, d]), &device).slice([0..n, 0..3, 0..d]);
        let want = values(Rope::apply(heads, &t).reshape([n, 3 * d]));
        assert_eq!(ops, want);
        let [q, k, v] = Rope::apply_qk(stacked, 0..2 * d, 2 * d..3 * d, &t, None).map(values);
        for token in 0..n {
            let (row, cols) = (&want[token * 3 * d..(token + 1) * 3 * d], |w: usize| token * w..(token + 1) * w);
            for (g, w) in q[cols(2 * d)].iter().chain(&k[cols(d)]).zip(row) {
                assert!((g - w).abs() < 1e-5, "the CPU kernel {g}, the Burn ops {w}");
            }
            assert_eq!(v[cols(d)], qkv[token * 4 * d + 3 * d..(token + 1) * 4 * d], "v is kept");
        }
    }
}
