use burn::tensor::{Tensor, activation::softmax};

pub use crate::kernels::Sinks;

/// Grouped-query attention of a batch's tokens over the cache cells `[0, extent)`.
///
/// # Shapes
/// - q: [n, heads, head_dim] (rotated)
/// - k, v: [kv_heads, extent, head_dim] (keys rotated)
/// - mask: [n, extent] additive, 0 = visible, −∞ = hidden; every row has a visible cell;
///   `None` when every row sees every cell (one kernel launch fewer on a GPU)
/// - returns [n, heads · head_dim]
///
/// With `softcap`, each scaled score s becomes `cap · tanh(s / cap)` before the softmax (Gemma
/// 2's). With `sinks`, each head's sink logit joins its softmax as a score with no value.
pub fn attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    mask: Option<Tensor<2>>,
    softcap: Option<f64>,
    sinks: Option<&Sinks>,
) -> Tensor<2> {
    let [n, heads, d] = q.dims();
    let [kv_heads, extent, _] = k.dims();
    let group = heads / kv_heads;
    // Query head h reads kv head h / group: [heads, n, d] = [kv_heads, group, n, d].
    let q = q.swap_dims(0, 1).reshape([kv_heads, group * n, d]);
    let scores = q.matmul(k.swap_dims(1, 2)); // [kv_heads, group·n, extent]
    let scale = 1.0 / (d as f64).sqrt();
    // Scaled, masked and normalised in one kernel (six of Burn's ops otherwise).
    let ops = |scores: Tensor<3>| {
        let scores = match softcap {
            Some(cap) => scores.mul_scalar(scale / cap).tanh().mul_scalar(cap),
            None => scores.mul_scalar(scale),
        };
        let scores = match &mask {
            Some(mask) => (scores.reshape([kv_heads, group, n, extent]) + mask.clone().reshape([1, 1, n, extent]))
                .reshape([kv_heads, group * n, extent]),
            None => scores,
        };
        match sinks {
            // The sink as one more column of every row of its head, dropped after the softmax.
            Some(s) => {
                let column = s.device.clone().reshape([kv_heads, group, 1, 1]).expand([kv_heads, group, n, 1]);
                let with = Tensor::cat(vec![scores, column.reshape([kv_heads, group * n, 1])], 2);
                softmax(with, 2).narrow(2, 0, extent)
            }
            None => softmax(scores, 2),
        }
    };
    let probs = match softcap.is_none() && sinks.is_none() {
        true => crate::kernels::softmax(scores, scale, mask.as_ref(), ops),
        false => ops(scores),
    };
    probs
        .matmul(v) // [kv_heads, group·n, d]
        .reshape([heads, n, d])
        .swap_dims(0, 1) // [n, heads, d]
        .reshape([n, heads * d])
}
