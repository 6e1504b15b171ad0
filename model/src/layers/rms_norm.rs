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
}
