use burn::tensor::{Tensor, activation::softmax};

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
/// 2's).
pub fn attention(q: Tensor<3>, k: Tensor<3>, v: Tensor<3>, mask: Option<Tensor<2>>, softcap: Option<f64>) -> Tensor<2> {
    let [n, heads, d] = q.dims();
    let [kv_heads, extent, _] = k.dims();
    let group = heads / kv_heads;
    // Query head h reads kv head h / group: [heads, n, d] = [kv_heads, group, n, d].
    let q = q.swap_dims(0, 1).reshape([kv_heads, group * n, d]);
    let scores = q.matmul(k.swap_dims(1, 2)); // [kv_heads, group·n, extent]
    let scale = 1.0 / (d as f64).sqrt();
    // Scaled, masked and normalised in one kernel on a GPU (six of Burn's ops otherwise).
    let fused = || crate::kernels::softmax(&scores, scale, mask.as_ref());
    let probs = softcap.is_none().then(fused).flatten().unwrap_or_else(|| {
        let scores = match softcap {
            Some(cap) => scores.mul_scalar(scale / cap).tanh().mul_scalar(cap),
            None => scores.mul_scalar(scale),
        };
        match mask {
            Some(mask) => softmax(scores.reshape([kv_heads, group, n, extent]) + mask.reshape([1, 1, n, extent]), 3)
                .reshape([kv_heads, group * n, extent]),
            None => softmax(scores, 2),
        }
    });
    probs
        .matmul(v) // [kv_heads, group·n, d]
        .reshape([heads, n, d])
        .swap_dims(0, 1) // [n, heads, d]
        .reshape([n, heads * d])
}
