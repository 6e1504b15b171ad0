use std::cell::OnceCell;
use std::ops::Range;

use burn::tensor::{Device, Tensor, TensorData};

use crate::kv::Pos;

/// Rotary position embedding in the "rotate half" layout of Hugging Face's Qwen2: dimension
/// `i` of the first half pairs with `i + head_dim/2`.
#[derive(Debug, Clone)]
pub struct Rope {
    /// [head_dim / 2] `theta^(−2i/head_dim)`, computed in f32 as transformers does.
    inv_freq: Vec<f32>,
}

/// cos and sin of every (token, frequency): [n, head_dim/2] each, on the host (for the CPU
/// kernel) and as [n, 1, head_dim/2] tensors (for the Burn ops).
pub struct RopeTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
    shape: [usize; 3],
    device: Device,
    /// The tensors, made on the Burn path's first use and shared by every layer of the pass
    /// (the CPU kernel reads the vectors and never makes them).
    tensors: OnceCell<(Tensor<3>, Tensor<3>)>,
}

impl RopeTables {
    fn tensors(&self) -> (Tensor<3>, Tensor<3>) {
        let make = |v: &Vec<f32>| Tensor::from_data(TensorData::new(v.clone(), self.shape), &self.device);
        self.tensors.get_or_init(|| (make(&self.cos), make(&self.sin))).clone()
    }
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
        RopeTables { cos, sin, shape: [positions.len(), 1, half], device: device.clone(), tensors: OnceCell::new() }
    }

    /// # Shapes
    /// x: [n, heads, head_dim] → [n, heads, head_dim]; tables for the same n tokens.
    pub fn apply(x: Tensor<3>, t: &RopeTables) -> Tensor<3> {
        let [n, h, d] = x.dims();
        let half = d / 2;
        let x1 = x.clone().slice([0..n, 0..h, 0..half]);
        let x2 = x.slice([0..n, 0..h, half..d]);
        let (cos, sin) = t.tensors();
        let lo = x1.clone() * cos.clone() - x2.clone() * sin.clone();
        let hi = x2 * cos + x1 * sin;
        Tensor::cat(vec![lo, hi], 2)
    }

    /// The stacked q/k/v projection's output with q's heads (columns `q`) and k's (columns `k`)
    /// rotated, v's columns as they were.
    ///
    /// # Shapes
    /// qkv: [n, width] → [n, width]; tables for the same n tokens.
    pub fn apply_qk(qkv: Tensor<2>, q: Range<usize>, k: Range<usize>, t: &RopeTables) -> Tensor<2> {
        let d = 2 * t.shape[2];
        if let Some(y) = crate::kernels::rope_qk(&qkv, q.clone(), k.clone(), d, &t.cos, &t.sin) {
            return y;
        }
        let [n, width] = qkv.dims();
        let part = |cols: &Range<usize>| qkv.clone().narrow(1, cols.start, cols.len());
        let rotate =
            |cols: &Range<usize>| Rope::apply(part(cols).reshape([n, cols.len() / d, d]), t).reshape([n, cols.len()]);
        let v = q.end.max(k.end)..width;
        Tensor::cat(vec![rotate(&q), rotate(&k), part(&v)], 1)
    }
}
