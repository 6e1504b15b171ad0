use burn::tensor::Tensor;

use crate::config::Activation;
use crate::kernels::{GELU_CUBE, GELU_SCALE};

/// The feed-forward's gate, `act(gate) · up` (SwiGLU's silu, GeGLU's tanh-approximated GELU),
/// over the stacked gate/up projection's output: the CPU kernel where it runs, else the Burn ops.
///
/// # Shapes
/// gate_up: [n, 2 · i], gate in the first half of each row → [n, i]
pub fn swiglu(gate_up: Tensor<2>, act: Activation) -> Tensor<2> {
    crate::kernels::swiglu(&gate_up, act).unwrap_or_else(|| swiglu_ops(gate_up, act))
}

/// [`swiglu`] through Burn's ops as `gate · up / (1 + e^−t)`, t = gate for silu and
/// 2√(2/π) · (gate + 0.044715 gate³) for GELU (½(1 + tanh z) = σ(2z)): five kernels on a GPU for
/// silu, where Burn's `silu` (its sigmoid a chain through log and exp) and the product take eight.
fn swiglu_ops(gate_up: Tensor<2>, act: Activation) -> Tensor<2> {
    let [_, width] = gate_up.dims();
    let i = width / 2;
    let (mut gate, mut up) = (gate_up.clone().narrow(1, 0, i), gate_up.narrow(1, i, i));
    let t = match act {
        Activation::Silu => gate.clone(),
        Activation::GeluTanh => {
            let cubed = gate.clone().powi_scalar(3).mul_scalar(GELU_CUBE);
            (cubed + gate.clone()).mul_scalar(GELU_SCALE)
        }
        // gpt-oss's: the gate clamped above, the up on both sides and shifted by 1.
        Activation::ClampedSwiglu { alpha, limit } => {
            gate = gate.clamp_max(limit);
            up = up.clamp(-limit, limit).add_scalar(1.0);
            gate.clone().mul_scalar(alpha)
        }
    };
    (gate * up) / t.neg().exp().add_scalar(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::silu;
    use burn::tensor::{Device, TensorData};

    /// The kernel, these Burn ops and Burn's own silu and tanh agree on a stacked [gate | up]
    /// input, for both gates.
    #[test]
    fn the_kernel_and_the_burn_ops_agree() {
        for act in [Activation::Silu, Activation::GeluTanh, Activation::ClampedSwiglu { alpha: 1.702, limit: 3.0 }] {
            agree(act);
        }
    }

    fn agree(act: Activation) {
        let device = Device::flex();
        let (n, i) = (3, 40);
        let values: Vec<f32> = crate::kernels::test_values(n * 2 * i, 9).iter().map(|v| v * 8.0).collect();
        let gate_up = Tensor::<2>::from_data(TensorData::new(values, [n, 2 * i]), &device);
        let got = swiglu(gate_up.clone(), act).into_data().try_to_vec::<f32>().unwrap();
        let ops = swiglu_ops(gate_up.clone(), act).into_data().try_to_vec::<f32>().unwrap();
        let (g, mut up) = (gate_up.clone().narrow(1, 0, i), gate_up.clone().narrow(1, i, i));
        let gated = match act {
            Activation::Silu => silu(g),
            Activation::ClampedSwiglu { alpha, limit } => {
                up = up.clamp(-limit, limit).add_scalar(1.0);
                let g = g.clamp_max(limit);
                g.clone() * burn::tensor::activation::sigmoid(g.mul_scalar(alpha))
            }
            // transformers' `gelu_pytorch_tanh`: ½ g (1 + tanh(√(2/π) (g + 0.044715 g³))).
            Activation::GeluTanh => {
                let z = (g.clone().powi_scalar(3).mul_scalar(0.044715) + g.clone())
                    .mul_scalar((2.0 / std::f64::consts::PI).sqrt());
                g.mul_scalar(0.5) * z.tanh().add_scalar(1.0)
            }
        };
        let want = (gated * up).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!((got.len(), ops.len()), (n * i, n * i));
        for ((g, o), w) in got.iter().zip(&ops).zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "kernel {g} vs {w}");
            assert!((o - w).abs() <= 1e-5 * w.abs().max(1.0), "ops {o} vs {w}");
        }
    }
}
