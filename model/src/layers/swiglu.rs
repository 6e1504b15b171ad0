use burn::tensor::Tensor;

/// SwiGLU's gate, `silu(gate) · up`, over the stacked gate/up projection's output: the CPU
/// kernel where it runs, else the Burn ops.
///
/// # Shapes
/// gate_up: [n, 2 · i], gate in the first half of each row → [n, i]
pub fn swiglu(gate_up: Tensor<2>) -> Tensor<2> {
    crate::kernels::swiglu(&gate_up).unwrap_or_else(|| swiglu_ops(gate_up))
}

/// [`swiglu`] through Burn's ops as `gate · up / (1 + e^−gate)`: five kernels on a GPU, where
/// Burn's `silu` (its sigmoid a chain through log and exp) and the product take eight.
fn swiglu_ops(gate_up: Tensor<2>) -> Tensor<2> {
    let [_, width] = gate_up.dims();
    let i = width / 2;
    let gate = gate_up.clone().narrow(1, 0, i);
    (gate.clone() * gate_up.narrow(1, i, i)) / gate.neg().exp().add_scalar(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::silu;
    use burn::tensor::{Device, TensorData};

    /// The kernel, these Burn ops and Burn's own silu agree on a stacked [gate | up] input.
    #[test]
    fn the_kernel_and_the_burn_ops_agree() {
        let device = Device::flex();
        let (n, i) = (3, 40);
        let values: Vec<f32> = crate::kernels::test_values(n * 2 * i, 9).iter().map(|v| v * 8.0).collect();
        let gate_up = Tensor::<2>::from_data(TensorData::new(values, [n, 2 * i]), &device);
        let got = swiglu(gate_up.clone()).into_data().try_to_vec::<f32>().unwrap();
        let ops = swiglu_ops(gate_up.clone()).into_data().try_to_vec::<f32>().unwrap();
        let want =
            (silu(gate_up.clone().narrow(1, 0, i)) * gate_up.narrow(1, i, i)).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!((got.len(), ops.len()), (n * i, n * i));
        for ((g, o), w) in got.iter().zip(&ops).zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "kernel {g} vs {w}");
            assert!((o - w).abs() <= 1e-5 * w.abs().max(1.0), "ops {o} vs {w}");
        }
    }
}
