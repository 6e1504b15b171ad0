//! Qwen3.5's gated DeltaNet, the token mixer of its linear-attention layers, after the stacked
//! input projection and before the output projection. Per token of a sequence: a causal
//! depthwise convolution (width 4) over q, k and v with SiLU; q and k L2-normalised per head, q
//! scaled by 1/√key_dim; then each value head's memory S ([key_dim, value_dim], its key head's q
//! and k shared by `value_heads / key_heads` of them) decays by exp(−exp(A_log) ·
//! softplus(α + dt_bias)) and learns v by the delta rule with rate β = sigmoid(β):
//! S ← S·decay + k ⊗ β(v − Sᵀk), o = Sᵀq; o is RMS-normalised per head and gated by silu(z).
//!
//! The recurrence runs on the host, in f32, sequence by sequence in token order and in parallel
//! over sequences and value heads, compiled for AVX-512 or AVX2 where the CPU has them; its
//! state lives in the cache (`kv::Recurrent`). On a GPU the projection's rows come back for it
//! and its output goes up again (counted transfers).

use burn::tensor::{Tensor, TensorData};
use pulp::x86::V4;
use rayon::prelude::*;

use crate::kernels::plain::Plain;

use crate::error::DecodeError;
use crate::kv::LayerState;

/// One linear-attention layer's weights besides its projections.
#[derive(Debug, Clone)]
pub struct DeltaNet {
    pub key_heads: usize,
    pub value_heads: usize,
    /// Value heads in llama.cpp's tiled order (head `h` reads key head `h % key_heads`), as
    /// its converter writes every tensor that has them; else grouped by key head (head `h`
    /// reads key head `h / (value_heads / key_heads)`), as Hugging Face's checkpoints are.
    pub tiled: bool,
    pub key_dim: usize,
    pub value_dim: usize,
    /// The convolution's width.
    pub kernel: usize,
    /// [channels, kernel]: each channel's weights, the oldest input's first.
    pub conv: Vec<f32>,
    /// \[value_heads\]
    pub dt_bias: Vec<f32>,
    /// \[value_heads\] −exp(A_log): the log-decay per unit of time step.
    pub decay_rate: Vec<f32>,
    /// \[value_dim\] the gated norm's weight.
    pub norm: Vec<f32>,
    pub eps: f32,
}

impl DeltaNet {
    /// Channels of the convolution: q's and k's heads, then v's.
    fn channels(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.values()
    }

    fn values(&self) -> usize {
        self.value_heads * self.value_dim
    }

    /// The mixer's output for a pass's rows, each sequence's state taking in its rows in order.
    ///
    /// # Shapes
    /// proj: [n, channels + values + 2 · value_heads] (q, k, v | z | β | α) → [n, values]
    pub fn forward(&self, proj: Tensor<2>, states: Vec<LayerState<'_>>) -> Result<Tensor<2>, DecodeError> {
        let device = proj.device();
        let [n, width] = proj.dims();
        let x: Vec<f32> = crate::transfers::read(proj).map_err(|e| DecodeError::Internal(format!("{e:?}")))?;
        let out = self.run(&x, width, n, states);
        Ok(crate::transfers::upload(TensorData::new(out, [n, self.values()]), &device))
    }

    /// [`Self::forward`] over host rows `x` ([n, width]).
    fn run(&self, x: &[f32], width: usize, n: usize, mut states: Vec<LayerState<'_>>) -> Vec<f32> {
        let (c, vd, dk, dv) = (self.channels(), self.values(), self.key_dim, self.value_dim);
        // The convolution, in token order per sequence: q, k (normalised), v per row.
        let mixed: Vec<Vec<f32>> = states
            .par_iter_mut()
            .map(|s| {
                let mut out = Vec::with_capacity(s.rows.len() * c);
                for (t, &row) in s.rows.iter().enumerate() {
                    let start = out.len();
                    out.resize(start + c, 0.0);
                    self.convolve(&x[row * width..row * width + c], s.conv, &mut out[start..]);
                    self.normalise_qk(&mut out[start..]);
                    if let Some(keep) = s.keep.as_mut().filter(|k| k.after == t + 1) {
                        keep.conv.copy_from_slice(s.conv);
                    }
                }
                out
            })
            .collect();
        // The recurrence, per (sequence, value head).
        let group = self.value_heads / self.key_heads;
        let mut tasks = Vec::new();
        for (i, s) in states.iter_mut().enumerate() {
            // Each head's part of a checkpoint to fill on the way, and after which row.
            let mut keep: Vec<(usize, Option<&mut [f32]>)> = match &mut s.keep {
                Some(k) => k.memory.chunks_mut(dk * dv).map(|m| (k.after, Some(m))).collect(),
                None => Vec::new(),
            };
            keep.resize_with(self.value_heads, || (0, None));
            for ((h, memory), keep) in s.memory.chunks_mut(dk * dv).enumerate().zip(keep) {
                tasks.push((i, h, s.rows, memory, keep));
            }
        }
        let (v4, plain) = (V4::try_new(), Plain::new());
        let heads: Vec<(usize, usize, Vec<f32>)> = tasks
            .into_par_iter()
            .map(|(i, h, rows, memory, (after, keep))| {
                let kh = if self.tiled { h % self.key_heads } else { h / group };
                let mut o = vec![0.0f32; rows.len() * dv];
                let run = HeadTokens {
                    net: self,
                    mixed: &mixed[i],
                    x,
                    width,
                    rows,
                    head: (h, kh),
                    memory,
                    keep: keep.map(|k| (after, k)),
                    o: &mut o,
                };
                match v4 {
                    Some(simd) => simd.vectorize(run),
                    None => plain.vectorize(run),
                }
                (i, h, o)
            })
            .collect();
        // The gated norm, into each row's head.
        let mut out = vec![0.0f32; n * vd];
        for (i, h, o) in heads {
            for (t, &row) in states[i].rows.iter().enumerate() {
                let z = &x[row * width + c + h * dv..row * width + c + (h + 1) * dv];
                let dst = &mut out[row * vd + h * dv..row * vd + (h + 1) * dv];
                self.gated_norm(&o[t * dv..(t + 1) * dv], z, dst);
            }
        }
        out
    }

    /// One token's convolution of `input` ([channels]) with the state's last `kernel − 1`
    /// inputs ([kernel − 1, channels], oldest first), SiLU applied, into `out`; the state moves
    /// on by the token.
    fn convolve(&self, input: &[f32], state: &mut [f32], out: &mut [f32]) {
        let (c, w) = (input.len(), self.kernel);
        for (ch, o) in out.iter_mut().enumerate() {
            let weights = &self.conv[ch * w..(ch + 1) * w];
            let mut y = weights[w - 1] * input[ch];
            for j in 0..w - 1 {
                y += weights[j] * state[j * c + ch];
            }
            *o = y / (1.0 + (-y).exp());
        }
        if w > 1 {
            state.copy_within(c.., 0);
            state[(w - 2) * c..].copy_from_slice(input);
        }
    }

    /// q's and k's heads of a convolved row L2-normalised (ε 1e-6 under the root, as
    /// transformers and the FLA kernels), q's scaled by 1/√key_dim.
    fn normalise_qk(&self, row: &mut [f32]) {
        let dk = self.key_dim;
        let scale = 1.0 / (dk as f32).sqrt();
        for (i, head) in row[..2 * self.key_heads * dk].chunks_mut(dk).enumerate() {
            let sum: f32 = head.iter().map(|v| v * v).sum();
            let inv = 1.0 / (sum + 1e-6).sqrt() * if i < self.key_heads { scale } else { 1.0 };
            head.iter_mut().for_each(|v| *v *= inv);
        }
    }

    /// `o` RMS-normalised, times the norm's weight and silu(z), into `out`.
    fn gated_norm(&self, o: &[f32], z: &[f32], out: &mut [f32]) {
        let mean = o.iter().map(|v| v * v).sum::<f32>() / o.len() as f32;
        let inv = 1.0 / (mean + self.eps).sqrt();
        for (((dst, &v), &w), &g) in out.iter_mut().zip(o).zip(&self.norm).zip(z) {
            *dst = v * inv * w * (g / (1.0 + (-g).exp()));
        }
    }
}

/// One value head's tokens of one sequence, as a callable that the vectorizing functions
/// (`V4::vectorize`, `Plain::vectorize`) inline: the steps' loops run along a memory row, which
/// LLVM turns into the widest vectors the CPU has (the same operations in the same order on
/// any CPU, so the same result).
struct HeadTokens<'a> {
    net: &'a DeltaNet,
    /// The sequence's convolved rows ([tokens, channels]).
    mixed: &'a [f32],
    /// The projection's rows ([n, width]) and the sequence's rows among them.
    x: &'a [f32],
    width: usize,
    rows: &'a [usize],
    /// The value head and its key head.
    head: (usize, usize),
    memory: &'a mut [f32],
    /// A checkpoint of the memory to fill after that many tokens.
    keep: Option<(usize, &'a mut [f32])>,
    /// [tokens, value_dim]
    o: &'a mut [f32],
}

impl pulp::NullaryFnOnce for HeadTokens<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let HeadTokens { net, mixed, x, width, rows, head: (h, kh), memory, mut keep, o } = self;
        let (c, vd, dk, dv) = (net.channels(), net.values(), net.key_dim, net.value_dim);
        let kd = net.key_heads * dk;
        let mut kv = vec![0.0f32; dv];
        for (t, &row) in rows.iter().enumerate() {
            let m = &mixed[t * c..(t + 1) * c];
            let (q, k) = (&m[kh * dk..(kh + 1) * dk], &m[kd + kh * dk..kd + (kh + 1) * dk]);
            let v = &m[2 * kd + h * dv..2 * kd + (h + 1) * dv];
            let xr = &x[row * width..(row + 1) * width];
            let (beta, alpha) = (xr[c + vd + h], xr[c + vd + net.value_heads + h]);
            let decay = (net.decay_rate[h] * softplus(alpha + net.dt_bias[h])).exp();
            let beta = 1.0 / (1.0 + (-beta).exp());
            delta_step(memory, q, k, v, decay, beta, &mut kv, &mut o[t * dv..(t + 1) * dv]);
            if let Some((after, keep)) = keep.as_mut()
                && t + 1 == *after
            {
                keep.copy_from_slice(memory);
            }
        }
    }
}

/// torch's softplus: ln(1 + eˣ), x itself above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// One token of one value head: `memory` ([key_dim, value_dim]) decays, learns `v` for key `k`
/// at rate `beta`, and is read by `q` into `o`. `kv`: scratch of value_dim. Inlined into its
/// caller's vectorized function.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn delta_step(
    memory: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    kv: &mut [f32],
    o: &mut [f32],
) {
    let dv = v.len();
    kv.iter_mut().for_each(|x| *x = 0.0);
    for (row, &ki) in memory.chunks_exact_mut(dv).zip(k) {
        for (s, acc) in row.iter_mut().zip(kv.iter_mut()) {
            *s *= decay;
            *acc += *s * ki;
        }
    }
    for (d, &vj) in kv.iter_mut().zip(v) {
        *d = (vj - *d) * beta;
    }
    o.iter_mut().for_each(|x| *x = 0.0);
    for ((row, &ki), &qi) in memory.chunks_exact_mut(dv).zip(k).zip(q) {
        for ((s, &d), acc) in row.iter_mut().zip(kv.iter()).zip(o.iter_mut()) {
            *s += ki * d;
            *acc += *s * qi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recurrence by its definition, with explicit matrices: S ← S·decay; S += k ⊗ β(v − Sᵀk);
    /// o = Sᵀq.
    #[test]
    fn a_step_is_the_delta_rule() {
        let (dk, dv) = (3, 2);
        let mut memory: Vec<f32> = (0..dk * dv).map(|i| 0.1 * i as f32 - 0.2).collect();
        let want_memory = memory.clone();
        let (q, k, v) = ([0.5f32, -1.0, 0.25], [0.2f32, 0.4, -0.6], [1.0f32, -2.0]);
        let (decay, beta) = (0.9f32, 0.7f32);
        let (mut kv, mut o) = (vec![0.0; dv], vec![0.0; dv]);
        delta_step(&mut memory, &q, &k, &v, decay, beta, &mut kv, &mut o);
        let mut s: Vec<f32> = want_memory.iter().map(|x| x * decay).collect();
        let sk: Vec<f32> = (0..dv).map(|j| (0..dk).map(|i| s[i * dv + j] * k[i]).sum()).collect();
        for i in 0..dk {
            for j in 0..dv {
                s[i * dv + j] += k[i] * beta * (v[j] - sk[j]);
            }
        }
        let want_o: Vec<f32> = (0..dv).map(|j| (0..dk).map(|i| s[i * dv + j] * q[i]).sum()).collect();
        for (a, b) in memory.iter().zip(&s).chain(o.iter().zip(&want_o)) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    /// The convolution sees the state's inputs before the token's, oldest first, and moves on.
    #[test]
    fn the_convolution_is_causal_and_keeps_the_last_inputs() {
        let net = DeltaNet {
            key_heads: 1,
            value_heads: 1,
            tiled: false,
            key_dim: 1,
            value_dim: 1,
            kernel: 3,
            conv: vec![1.0, 10.0, 100.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0],
            dt_bias: vec![0.0],
            decay_rate: vec![-1.0],
            norm: vec![1.0],
            eps: 1e-6,
        };
        let silu_inv = |y: f32| y / (1.0 + (-y).exp());
        let mut state = vec![0.0; 2 * 3];
        let mut out = vec![0.0; 3];
        net.convolve(&[0.5, 0.25, 2.0], &mut state, &mut out);
        assert_eq!(out, vec![silu_inv(50.0), silu_inv(0.25), 0.0]);
        net.convolve(&[0.125, 1.0, 3.0], &mut state, &mut out);
        assert_eq!(out, vec![silu_inv(0.5 * 10.0 + 12.5), silu_inv(1.0), silu_inv(2.0)]);
        assert_eq!(state, vec![0.5, 0.25, 2.0, 0.125, 1.0, 3.0]);
    }
}
