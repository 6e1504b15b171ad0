use std::ops::Range;

use burn::tensor::Tensor;

/// Root-mean-square layer norm: `x / sqrt(mean(x²) + eps) · w`, in f32 (one pass on the CPU
/// kernel where it runs).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// \[hidden\]
    pub weight: Tensor<1>,
    pub eps: f64,
}

impl RmsNorm {
    /// # Shapes
    /// x: [n, hidden] → [n, hidden]
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        if let Some(y) = crate::kernels::rms_norm(&x, &self.weight, self.eps) {
            return y;
        }
        let rms = x.clone().square().mean_dim(1).add_scalar(self.eps).sqrt(); // [n, 1]
        (x / rms) * self.weight.clone().unsqueeze::<2>()
    }

    /// This norm as a product's input step ([`crate::layers::Linear::forward_with`]).
    pub fn pre(&self) -> crate::kernels::Pre<'_> {
        crate::kernels::Pre::Norm { weight: &self.weight, eps: self.eps }
    }

    /// q's and k's per-head norms as the kernels take them.
    pub fn qk(norms: &[RmsNorm; 2]) -> crate::kernels::QkNorms<'_> {
        let [q, k] = norms;
        ([&q.weight, &k.weight], q.eps)
    }

    /// Norms of column ranges (q's and k's): each of `parts`' ranges of `x` normalised by that
    /// part's norm in groups as long as its weight: a head at a time (Qwen3's, weight
    /// \[head_dim\]), or the whole range at once (OLMo 2's); the other columns unchanged.
    ///
    /// # Shapes
    /// x: [n, width], every range a multiple of its norm's weight within it → [n, width]
    pub fn forward_parts<const P: usize>(x: Tensor<2>, parts: [(&RmsNorm, Range<usize>); P]) -> Tensor<2> {
        let [n, width] = x.dims();
        let mut parts = parts.to_vec();
        parts.sort_by_key(|(_, cols)| cols.start);
        let mut pieces = Vec::with_capacity(2 * P + 1);
        let mut at = 0;
        for (norm, cols) in parts {
            if cols.start > at {
                pieces.push(x.clone().narrow(1, at, cols.start - at));
            }
            let group = norm.weight.dims()[0];
            let heads = x.clone().narrow(1, cols.start, cols.len()).reshape([n * cols.len() / group, group]);
            pieces.push(norm.forward(heads).reshape([n, cols.len()]));
            at = cols.end;
        }
        if at < width {
            pieces.push(x.narrow(1, at, width - at));
        }
        Tensor::cat(pieces, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    /// Each head of each part is normalised on its own; columns outside the parts are kept.
    /// A part whose norm spans it is normalised as one.
    #[test]
    fn heads_are_normalised_one_by_one() {
        let device = Device::flex();
        let (n, d) = (2, 4);
        let values: Vec<f32> = crate::kernels::test_values(n * 5 * d, 3).iter().map(|v| v * 3.0).collect();
        let x = Tensor::<2>::from_data(TensorData::new(values.clone(), [n, 5 * d]), &device);
        let weight = |w: Vec<f32>| RmsNorm { weight: Tensor::from_data(TensorData::new(w, [d]), &device), eps: 1e-6 };
        let (a, b) = (weight(vec![1.0, 2.0, 0.5, -1.0]), weight(vec![0.25; 4]));
        let got =
            RmsNorm::forward_parts(x, [(&b, 3 * d..4 * d), (&a, 0..2 * d)]).into_data().try_to_vec::<f32>().unwrap();
        for row in 0..n {
            for head in 0..5 {
                let at = row * 5 * d + head * d;
                let x = &values[at..at + d];
                let scale = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / d as f32 + 1e-6).sqrt();
                for i in 0..d {
                    let want = match head {
                        0 | 1 => x[i] * scale * a.weight.clone().into_data().try_to_vec::<f32>().unwrap()[i],
                        3 => x[i] * scale * 0.25,
                        _ => x[i],
                    };
                    assert!(
                        (got[at + i] - want).abs() < 1e-5,
                        "row {row} head {head} dim {i}: {} vs {want}",
                        got[at + i]
                    );
                }
            }
        }
        // A norm as long as its range (OLMo 2's over all of q's heads) takes the range at once.
        let x = Tensor::<2>::from_data(TensorData::new(values.clone(), [n, 5 * d]), &device);
        let whole =
            RmsNorm { weight: Tensor::from_data(TensorData::new(vec![0.5; 2 * d], [2 * d]), &device), eps: 1e-6 };
        let got = RmsNorm::forward_parts(x, [(&whole, d..3 * d)]).into_data().try_to_vec::<f32>().unwrap();
        for row in 0..n {
            let at = row * 5 * d;
            let part = &values[at + d..at + 3 * d];
            let scale = 1.0 / (part.iter().map(|v| v * v).sum::<f32>() / (2 * d) as f32 + 1e-6).sqrt();
            for i in 0..5 * d {
                let want = if (d..3 * d).contains(&i) { values[at + i] * scale * 0.5 } else { values[at + i] };
                assert!((got[at + i] - want).abs() < 1e-5, "row {row} column {i}: {} vs {want}", got[at + i]);
            }
        }
    }
}
