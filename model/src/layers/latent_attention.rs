//! Multi-head latent attention's own steps around the shared attention (DeepSeek V2's and V3's,
//! GLM-4.7-Flash's; `crate::config::LatentAttention` says the layout): the queries and the
//! cached row before it, each head's values after it. The attention itself is the decoder's,
//! over one key-value head whose keys and values are both the cached row [rotated part, latent]:
//! a head's scores against it are its expanded scores, and its weighted sum of rows, past the
//! rotated part, is the latent its values are taken from.

use burn::tensor::{DType, Device, Tensor, TensorData};

use super::{Linear, RmsNorm, Rope, RopeTables};

#[derive(Debug, Clone)]
pub struct LatentAttention {
    /// The low-rank queries' norm and second product (`q_a_layernorm`, `q_b_proj`), applied to
    /// the stacked projection's first part; `None`: that part is the queries (`q_proj`).
    pub q_b: Option<(RmsNorm, Linear)>,
    /// The latent's norm (`kv_a_layernorm`).
    pub kv_norm: RmsNorm,
    /// Each head's key rows over the latent: [heads, nope, kv_rank].
    pub k_b: Tensor<3>,
    /// Each head's value rows over the latent, transposed: [heads, kv_rank, v].
    pub v_b: Tensor<3>,
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

    /// Each head's key rows ([heads, nope, kv_rank]) from `data`: [heads · nope, kv_rank] (a
    /// Hugging Face checkpoint's, split from `kv_b_proj`) or [heads, kv_rank, nope] (a GGUF
    /// file's `attn_k_b`).
    pub fn key_rows(data: TensorData, heads: usize, nope: usize, rank: usize, device: &Device) -> Tensor<3> {
        let transposed = data.shape().as_slice().len() == 3;
        let t = Tensor::<2>::from_data(flat(data), (device, DType::F32));
        match transposed {
            true => t.reshape([heads, rank, nope]).swap_dims(1, 2),
            false => t.reshape([heads, nope, rank]),
        }
    }

    /// Each head's value rows, transposed ([heads, kv_rank, v]), from `data`: [heads · v,
    /// kv_rank] (a checkpoint's) or [heads, v, kv_rank] (a GGUF file's `attn_v_b`).
    pub fn value_rows(data: TensorData, heads: usize, v: usize, rank: usize, device: &Device) -> Tensor<3> {
        let t = Tensor::<2>::from_data(flat(data), (device, DType::F32));
        t.reshape([heads, v, rank]).swap_dims(1, 2)
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
        let taken = q.narrow(2, 0, nope).swap_dims(0, 1).matmul(self.k_b.clone()).swap_dims(0, 1); // [n, heads, rank]
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
        latent.swap_dims(0, 1).matmul(self.v_b.clone()).swap_dims(0, 1).reshape([n, self.heads * self.v])
    }
}

/// `data` as f32 in two dimensions, its first ones folded.
fn flat(data: TensorData) -> TensorData {
    let shape = data.shape().as_slice().to_vec();
    let last = shape.last().copied().unwrap_or(1);
    let values = data.convert::<f32>().try_into_vec::<f32>().unwrap_or_default();
    let rows = values.len() / last.max(1);
    TensorData::new(values, [rows, last])
}
