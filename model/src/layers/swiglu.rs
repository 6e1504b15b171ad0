use burn::tensor::{Tensor, activation::silu};

/// SwiGLU's gate, `silu(gate) · up`, over the stacked gate/up projection's output: the CPU
/// kernel where it runs, else the Burn ops.
///
/// # Shapes
/// gate_up: [n, 2 · i], gate in the first half of each row → [n, i]
pub fn swiglu(gate_up: Tensor<2>) -> Tensor<2> {
    if let Some(y) = crate::kernels::swiglu(&gate_up) {
        return y;
    }
    let [_, width] = gate_up.dims();
    let i = width / 2;
    silu(gate_up.clone().narrow(1, 0, i)) * gate_up.narrow(1, i, i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    /// The kernel and the Burn ops agree on a stacked [gate | up] input.
    #[test]
    fn the_kernel_and_the_burn_ops_agree() {
        let device = Device::flex();
        let (n, i) = (3, 40);
        let values: Vec<f32> = crate::kernels::test_values(n * 2 * i, 9).iter().map(|v| v * 8.0).collect();
        let gate_up = Tensor::<2>::from_data(TensorData::new(values, [n, 2 * i]), &device);
        let got = swiglu(gate_up.clone()).into_data().try_to_vec::<f32>().unwrap();
        let want =
            (silu(gate_up.clone().narrow(1, 0, i)) * gate_up.narrow(1, i, i)).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(got.len(), n * i);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
        }
    }
}
