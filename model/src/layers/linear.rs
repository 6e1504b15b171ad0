use burn::tensor::{DType, FloatDType, Tensor};

/// `y = x·Wᵀ + b` with the checkpoint's `[out, in]` weight layout (faster than a pre-transposed
/// weight for the few-row products of decoding on the CPU backend).
#[derive(Debug, Clone)]
pub struct Linear {
    /// [out, in]; f32, or f16 / bf16 to halve the bytes streamed per decode step.
    pub weight: Tensor<2>,
    /// [out]
    pub bias: Option<Tensor<1>>,
}

/// Few-row products (decode steps) with at least this many outputs are split across threads.
const SPLIT_MAX_ROWS: usize = 4;
const SPLIT_MIN_OUT: usize = 256;

/// x·Wᵀ in f32, or in the weight's 16-bit type for 16-bit weights.
fn product(x: Tensor<2>, weight: Tensor<2>) -> Tensor<2> {
    match weight.dtype() {
        DType::F16 => x.cast(FloatDType::F16).matmul(weight.transpose()).cast(FloatDType::F32),
        DType::BF16 => x.cast(FloatDType::BF16).matmul(weight.transpose()).cast(FloatDType::F32),
        _ => x.matmul(weight.transpose()),
    }
}

impl Linear {
    /// # Shapes
    /// x: [n, in] (f32) → [n, out] (f32)
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        if let Some(y) = crate::kernels::linear(&x, &self.weight, self.bias.as_ref()) {
            return y;
        }
        let [rows, _] = x.dims();
        let [out, _] = self.weight.dims();
        let y = if rows <= SPLIT_MAX_ROWS && out >= SPLIT_MIN_OUT && rayon::current_num_threads() > 1 {
            // Without the kernel (no AVX-512), the CPU backend runs few-row products on one
            // thread, which streams the weight at one core's memory bandwidth. Two halves of the
            // rows on two threads stream it at the machine's.
            let half = out / 2;
            let (a, b) = rayon::join(
                || product(x.clone(), self.weight.clone().narrow(0, 0, half)),
                || product(x.clone(), self.weight.clone().narrow(0, half, out - half)),
            );
            Tensor::cat(vec![a, b], 1)
        } else {
            product(x, self.weight.clone())
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    fn tensor(rows: usize, cols: usize, seed: u32, device: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(crate::kernels::test_values(rows * cols, seed), [rows, cols]), device)
    }

    /// A one-row product (the few-row kernel, or the split across threads without AVX-512)
    /// equals that row of a product with more rows than the kernel takes (the backend's GEMM).
    #[test]
    fn one_row_products_equal_their_row_of_a_many_row_product() {
        let device = Device::flex();
        let (out, input) = (601, 48);
        let f32_weight = tensor(out, input, 7, &device);
        for (weight, tolerance) in [(f32_weight.clone(), 1e-4), (f32_weight.cast(FloatDType::F16), 2e-2)] {
            let linear = Linear { weight, bias: Some(tensor(1, out, 3, &device).reshape([out])) };
            let x = tensor(crate::kernels::XWT_MAX_ROWS + 3, input, 11, &device);
            let whole = linear.forward(x.clone()).into_data().try_to_vec::<f32>().unwrap();
            for row in [0, 5, crate::kernels::XWT_MAX_ROWS + 2] {
                let one = linear.forward(x.clone().narrow(0, row, 1)).into_data().try_to_vec::<f32>().unwrap();
                assert_eq!(one.len(), out);
                let expected = &whole[row * out..(row + 1) * out];
                let err = one.iter().zip(expected).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(err < tolerance, "row {row}: max difference {err}");
            }
        }
    }
}
