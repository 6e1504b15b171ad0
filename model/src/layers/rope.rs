use burn::tensor::{Device, Tensor, TensorData};

use crate::kv::Pos;

/// Rotary position embedding in the "rotate half" layout of Hugging Face's Qwen2: dimension
/// `i` of the first half pairs with `i + head_dim/2`.
#[derive(Debug, Clone)]
pub struct Rope {
    /// [head_dim / 2] `theta^(−2i/head_dim)`, computed in f32 as transformers does.
    inv_freq: Vec<f32>,
}

/// cos and sin of every (token, frequency): [n, 1, head_dim/2] each.
pub struct RopeTables {
    cos: Tensor<3>,
    sin: Tensor<3>,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64) -> Self {
        let inv_freq = (0..head_dim / 2).map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32)).collect();
        Self { inv_freq }
    }

    /// Tables for rotating by each of `positions` (a delta works too: rotations compose).
    pub fn tables(&self, positions: &[Pos], device: &Device) -> RopeTables {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = (p as f32 * f) as f64; // the f32 product, as transformers computes it
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let shape = [positions.len(), 1, half];
        RopeTables {
            cos: Tensor::from_data(TensorData::new(cos, shape), device),
            sin: Tensor::from_data(TensorData::new(sin, shape), device),
        }
    }

    /// # Shapes
    /// x: [n, heads, head_dim] → [n, heads, head_dim]; tables for the same n tokens.
    pub fn apply(x: Tensor<3>, t: &RopeTables) -> Tensor<3> {
        let [n, h, d] = x.dims();
        let half = d / 2;
        let x1 = x.clone().slice([0..n, 0..h, 0..half]);
        let x2 = x.slice([0..n, 0..h, half..d]);
        let (cos, sin) = (t.cos.clone(), t.sin.clone());
        let lo = x1.clone() * cos.clone() - x2.clone() * sin.clone();
        let hi = x2 * cos + x1 * sin;
        Tensor::cat(vec![lo, hi], 2)
    }
}
