//! Multi-head latent attention's own steps around the shared attention (DeepSeek V2's and V3's,
//! GLM-4.7-Flash's; `crate::config::LatentAttention` says the layout): the queries and the
//! cached row before it, each head's values after it. The attention itself is the decoder's,
//! over one key-value head whose keys and values are both the cached row [rotated part, latent]:
//! a head's scores against it are its expanded scores, and its weighted sum of rows, past the
//! rotated part, is the latent its values are taken from.

use burn::tensor::{DType, Device, Tensor, TensorData};

use super::{Linear, RmsNorm, Rope, RopeTables, linear};

#[derive(Debug, Clone)]
pub struct LatentAttention {
    /// The low-rank queries' norm and second product (`q_a_layernorm`, `q_b_proj`), applied to
    /// the stacked projection's first part; `None`: that part is the queries (`q_proj`).
    pub q_b: Option<(RmsNorm, Linear)>,
    /// The latent's norm (`kv_a_layernorm`).
    pub kv_norm: RmsNorm,
    /// Each head's key rows, as the product that takes its unrotated query into the latent
    /// space: [kv_rank, nope] each (a GGUF file's `attn_k_b` as stored, quantized or not; a
    /// checkpoint's rows of `kv_b_proj` transposed).
    pub k_b: Vec<Linear>,
    /// Each head's value rows, the product out of the latent space: [v, kv_rank] each.
    pub v_b: Vec<Linear>,
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub kv_rank: usize,
    pub v: usize,
}

impl LatentAttention {
    /// The low-rank norms' epsilon: their modules' default, whatever the config's `rms_norm_eps`
    /// (transformers' DeepSeek V2, V3 and GLM-4.7-Flash build them without it; llama.cpp uses the
    /// config's, the same for DeepSeek's 1e-6 and not for GLM-4.7-Flash's 1e-5).
    pub const NORM_EPS: f64 = 1e-6;

    /// Each head's key products (dense f32) from a checkpoint's key rows, [heads · nope,
    /// kv_rank], or a GGUF file's `attn_k_b`, [heads, kv_rank, nope].
    pub fn key_heads(data: TensorData, heads: usize, nope: usize, rank: usize, device: &Device) -> Vec<Linear> {
        let stored_transposed = data.shape().as_slice().len() == 3;
        let values = host_values(data);
        let per = (nope * rank).max(1);
        let head = |h: usize| -> Vec<f32> {
            let rows = &values[h * per..(h + 1) * per];
            match stored_transposed {
                true => rows.to_vec(),
                // [nope, rank] → [rank, nope]
                false => (0..rank).flat_map(|r| (0..nope).map(move |d| rows[d * rank + r])).collect(),
            }
        };
        (0..heads).map(|h| dense_head(head(h), [rank, nope], device)).collect()
    }

    /// Each head's value products (dense f32) from [heads · v, kv_rank] (a checkpoint's) or
    /// [heads, v, kv_rank] (a GGUF file's `attn_v_b`).
    pub fn value_heads(data: TensorData, heads: usize, v: usize, rank: usize, device: &Device) -> Vec<Linear> {
        let values = host_values(data);
        let per = (v * rank).max(1);
        (0..heads).map(|h| dense_head(values[h * per..(h + 1) * per].to_vec(), [v, rank], device)).collect()
    }

    /// The queries in the latent space and the row to cache, both rotated by `tables` (the
    /// rotated part's), from the stacked projection `proj`: [n, q part + kv_rank + rope] (the
    /// query part first: `q_a_proj`'s or `q_proj`'s rows, then `kv_a_proj_with_mqa`'s).
    ///
    /// # Shapes
    /// → queries [n, heads, rope + kv_rank], row [n, 1, rope + kv_rank]
    pub fn project(&self, proj: Tensor<2>, tables: &RopeTables) -> (Tensor<3>, Tensor<3>) {
        let [n, width] = proj.dims();
        let (heads, nope, rope, rank) = (self.heads, self.nope, self.rope, self.kv_rank);
        let q_width = width - rank - rope;
        let q = proj.clone().narrow(1, 0, q_width);
        let q = match &self.q_b {
            Some((norm, q_b)) => q_b.forward_with(q, norm.pre(), None),
            None => q,
        };
        let q = q.reshape([n, heads, nope + rope]);
        let kv = proj.narrow(1, q_width, rank + rope);
        let latent = self.kv_norm.forward(kv.clone().narrow(1, 0, rank)).reshape([n, 1, rank]);
        // Every head's rotated part and the shared key's, turned as one block.
        let parts =
            Tensor::cat(vec![q.clone().narrow(2, nope, rope), kv.narrow(1, rank, rope).reshape([n, 1, rope])], 1);
        let turned = Rope::apply(parts, tables);
        // A head's unrotated query scores the latent as its key rows' product with it would.
        let taken = per_head(&self.k_b, q.narrow(2, 0, nope)); // [n, heads, rank]
        let queries = Tensor::cat(vec![turned.clone().narrow(1, 0, heads), taken], 2);
        let row = Tensor::cat(vec![turned.narrow(1, heads, 1), latent], 2);
        (queries, row)
    }

    /// Each head's values from the attention's output over the cached rows.
    ///
    /// # Shapes
    /// a: [n, heads · (rope + kv_rank)] → [n, heads · v]
    pub fn values(&self, a: Tensor<2>) -> Tensor<2> {
        let n = a.dims()[0];
        let latent = a.reshape([n, self.heads, self.rope + self.kv_rank]).narrow(2, self.rope, self.kv_rank);
        per_head(&self.v_b, latent).reshape([n, self.heads * self.v])
    }
}

/// Each head's product `x_h · W_hᵀ`: on the CPU with packed (quantized) matrices and a decode
/// step's rows, all heads in one parallel loop of the packed kernels; else one product a head.
///
/// # Shapes
/// x: [n, heads, in] → [n, heads, out]
fn per_head(products: &[Linear], x: Tensor<3>) -> Tensor<3> {
    let [n, heads, k] = x.dims();
    let device = x.device();
    // A decode step's few rows (a prefill's many go a head at a time, as one matrix's would),
    // read to the host only where every head's matrix is packed (the CPU's quantized weights).
    let packed = products.iter().all(|p| matches!(p.weight.matrix(), linear::Matrix::Packed(_)));
    if packed && n <= crate::kernels::XWT_MAX_ROWS {
        let rows = crate::transfers::read::<3, _, f32>(x.clone().swap_dims(0, 1));
        if let Ok(rows) = rows {
            let inputs: Vec<(&Linear, &[f32])> = products.iter().zip(rows.chunks_exact((n * k).max(1))).collect();
            if let Some(outs) = linear::packed_products(&inputs) {
                let out = outs.first().map_or(0, |o| o.len() / n.max(1));
                let values: Vec<f32> = outs.into_iter().flatten().collect();
                let y: Tensor<3> = crate::transfers::upload(TensorData::new(values, [heads, n, out]), &device);
                return y.swap_dims(0, 1);
            }
        }
    }
    let each = products.iter().enumerate().map(|(h, p)| {
        let y = p.forward(x.clone().narrow(1, h, 1).reshape([n, k]));
        let out = y.dims()[1];
        y.reshape([n, 1, out])
    });
    Tensor::cat(each.collect(), 1)
}

/// A head's dense product from its [out, in] values.
fn dense_head(values: Vec<f32>, shape: [usize; 2], device: &Device) -> Linear {
    Linear {
        weight: linear::dense(Tensor::from_data(TensorData::new(values, shape), (device, DType::F32))),
        bias: None,
    }
}

/// `data`'s values as f32 (validated by the weight check before they are read).
fn host_values(data: TensorData) -> Vec<f32> {
    data.convert::<f32>().try_into_vec::<f32>().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::quant::{PackedMatrix, QuantType};

    /// Three heads' products of two rows: packed in Q8_0 (one loop of the packed kernels) and
    /// dense (one product a head) agree within the activations' and weights' rounding.
    #[test]
    fn packed_heads_in_one_loop_agree_with_dense_heads() {
        let (heads, n, k, out) = (3, 2, 64, 32);
        let device = Device::flex();
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let weights: Vec<Vec<f32>> = (0..heads).map(|_| (0..out * k).map(|_| next()).collect()).collect();
        let packed: Vec<Linear> = weights
            .iter()
            .map(|w| {
                let m = PackedMatrix::quantize(QuantType::Q8_0, out, k, w).unwrap();
                Linear { weight: linear::packed(Arc::new(m)), bias: None }
            })
            .collect();
        let dense: Vec<Linear> = weights.iter().map(|w| dense_head(w.clone(), [out, k], &device)).collect();
        let x: Vec<f32> = (0..n * heads * k).map(|_| next()).collect();
        let x = Tensor::<3>::from_data(TensorData::new(x, [n, heads, k]), (&device, DType::F32));
        let a = crate::transfers::read::<3, _, f32>(per_head(&packed, x.clone())).unwrap();
        let b = crate::transfers::read::<3, _, f32>(per_head(&dense, x)).unwrap();
        assert_eq!((a.len(), b.len()), (n * heads * out, n * heads * out));
        let range = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let err = a.iter().zip(&b).fold(0.0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(err < 0.02 * range, "{err} of {range}");
    }
}
