use burn::tensor::{DType, FloatDType, Tensor};

/// `y = x·Wᵀ + b` with the checkpoint's `[out, in]` weight layout (faster than a pre-transposed
/// weight for the few-row products of decoding on the CPU backend).
#[derive(Debug, Clone)]
pub struct Linear {
    /// [out, in]; f32, or f16 to halve the bytes streamed per decode step.
    pub weight: Tensor<2>,
    /// [out]
    pub bias: Option<Tensor<1>>,
}

impl Linear {
    /// # Shapes
    /// x: [n, in] (f32) → [n, out] (f32)
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let y = match self.weight.dtype() {
            DType::F32 => x.matmul(self.weight.clone().transpose()),
            _ => x.cast(FloatDType::F16).matmul(self.weight.clone().transpose()).cast(FloatDType::F32),
        };
        match &self.bias {
            Some(b) => y + b.clone().unsqueeze::<2>(),
            None => y,
        }
    }

    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
}
