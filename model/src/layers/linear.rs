use std::ops::Range;
use std::sync::Arc;

use burn::tensor::{DType, Device, FloatDType, Int, Tensor, TensorData};

use crate::quant::{PackedMatrix, QuantType};

/// A weight matrix [out, in] (the checkpoint's layout): a dense Burn tensor (f32, f16 or bf16)
/// on any backend, or a packed quantized matrix for the CPU kernels. Clones share the storage.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant, reason = "a model holds a few hundred of these; a Tensor handle is 256 bytes")]
pub enum Weight {
    Dense(Tensor<2>),
    Packed(Arc<PackedMatrix>),
}

/// Quantized format for a dense part stacked with packed ones, or for replacing rows of a
/// K-quant part (K-quants are not made at load).
const FALLBACK_QUANT: QuantType = QuantType::Q8_0;

impl Weight {
    /// [out, in]
    pub fn dims(&self) -> [usize; 2] {
        match self {
            Weight::Dense(w) => w.dims(),
            Weight::Packed(w) => [w.rows(), w.k()],
        }
    }

    /// How it is stored, for logs: `bf16`, `Q5_0+Q8_0`.
    pub fn describe(&self) -> String {
        match self {
            Weight::Dense(w) => format!("{:?}", w.dtype()).to_ascii_lowercase(),
            Weight::Packed(w) => {
                let mut names: Vec<&str> = w.formats().iter().map(|(q, _)| q.name()).collect();
                names.dedup();
                names.join("+")
            }
        }
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        match self {
            Weight::Dense(w) => w.shape().num_elements() * w.dtype().size(),
            Weight::Packed(w) => w.size_bytes(),
        }
    }

    /// Rows `ids` as f32 (an embedding lookup).
    ///
    /// # Shapes
    /// ids: \[n\] → [n, in]
    pub fn rows(&self, ids: &[u32], device: &Device) -> Tensor<2> {
        let n = ids.len();
        match self {
            Weight::Dense(w) => {
                let ids: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
                let ids = Tensor::<1, Int>::from_data(TensorData::new(ids, [n]), device);
                w.clone().select(0, ids).cast(FloatDType::F32)
            }
            Weight::Packed(w) => {
                let k = w.k();
                let mut out = vec![0.0f32; n * k];
                for (row, &id) in out.chunks_exact_mut(k.max(1)).zip(ids) {
                    w.dequantize_row(id as usize, row);
                }
                Tensor::from_data(TensorData::new(out, [n, k]), device)
            }
        }
    }

    /// The matrices stacked row-wise (one product per shared input). Dense ones stay one dense
    /// tensor; packed ones keep their formats as parts; a dense matrix stacked with packed ones
    /// is quantized to Q8_0.
    pub fn stack(weights: Vec<Weight>) -> Weight {
        if weights.iter().all(|w| matches!(w, Weight::Dense(_))) {
            let dense = weights.into_iter().map(|w| match w {
                Weight::Dense(t) => t,
                Weight::Packed(_) => unreachable!("all dense"),
            });
            return Weight::Dense(Tensor::cat(dense.collect(), 0));
        }
        let packed = weights.into_iter().map(|w| match w {
            Weight::Packed(p) => Arc::unwrap_or_clone(p),
            Weight::Dense(t) => quantize_dense(t, FALLBACK_QUANT),
        });
        Weight::Packed(Arc::new(
            PackedMatrix::stack(packed.collect()).expect("stacked weights share their input width"),
        ))
    }

    /// A matrix of the same kind as `self` holding `data` ([out, in]): dense in `self`'s dtype,
    /// or packed in the format of `self`'s first part.
    pub fn like(&self, data: TensorData, device: &Device) -> Weight {
        match self {
            Weight::Dense(w) => Weight::Dense(Tensor::from_data(data, (device, w.dtype()))),
            Weight::Packed(w) => {
                let ty = w.formats().first().map_or(FALLBACK_QUANT, |(q, _)| *q);
                Weight::Packed(Arc::new(quantize_dense(Tensor::from_data(data, device), ty)))
            }
        }
    }

    /// Overwrites `rows` with `data` ([rows.len(), in]), in the matrix's own dtype; for a packed
    /// matrix the rows must be one stacked part, requantized to its format.
    pub fn replace_rows(&mut self, rows: Range<usize>, data: TensorData, device: &Device) {
        match self {
            Weight::Dense(w) => {
                let all = 0..w.dims()[1];
                *w = w.clone().slice_assign([rows, all], Tensor::from_data(data, (device, w.dtype())));
            }
            Weight::Packed(w) => {
                let (mut start, mut ty) = (0, FALLBACK_QUANT);
                for (q, n) in w.formats() {
                    if start == rows.start {
                        ty = q;
                    }
                    start += n;
                }
                let part = quantize_dense(Tensor::from_data(data, device), ty);
                let mut updated = Arc::unwrap_or_clone(w.clone());
                assert!(updated.replace_rows(rows.start, part), "replaced rows are one stacked part");
                *w = Arc::new(updated);
            }
        }
    }
}

/// A dense matrix quantized to `ty` (Q8_0 when `ty` is a K-quant, which is not made at load).
fn quantize_dense(t: Tensor<2>, ty: QuantType) -> PackedMatrix {
    let ty = if ty.is_k() { FALLBACK_QUANT } else { ty };
    let [rows, k] = t.dims();
    let values = t.cast(FloatDType::F32).into_data().try_into_vec::<f32>().expect("f32 after the cast");
    PackedMatrix::quantize(ty, rows, k, &values).expect("rows of a stacked or replaced matrix fit the format")
}

/// `y = x·Wᵀ + b` with the checkpoint's `[out, in]` weight layout (faster than a pre-transposed
/// weight for the few-row products of decoding on the CPU backend).
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Weight,
    /// \[out\]
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
        let weight = match &self.weight {
            Weight::Packed(w) => return crate::kernels::quantized_linear(&x, w, self.bias.as_ref()),
            Weight::Dense(w) => w,
        };
        if let Some(y) = crate::kernels::linear(&x, weight, self.bias.as_ref()) {
            return y;
        }
        let [rows, _] = x.dims();
        let [out, _] = weight.dims();
        let y = if rows <= SPLIT_MAX_ROWS
            && out >= SPLIT_MIN_OUT
            && rayon::current_num_threads() > 1
            && x.device() == Device::flex()
        {
            // Without the kernel (no AVX-512), the CPU backend runs few-row products on one
            // thread, which streams the weight at one core's memory bandwidth. Two halves of the
            // rows on two threads stream it at the machine's.
            let half = out / 2;
            let (a, b) = rayon::join(
                || product(x.clone(), weight.clone().narrow(0, 0, half)),
                || product(x.clone(), weight.clone().narrow(0, half, out - half)),
            );
            Tensor::cat(vec![a, b], 1)
        } else {
            product(x, weight.clone())
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
            let linear =
                Linear { weight: Weight::Dense(weight), bias: Some(tensor(1, out, 3, &device).reshape([out])) };
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

    /// Stacking a dense matrix with a packed one, and replacing one stacked part's rows: the
    /// outputs of each part land in their own columns.
    #[test]
    fn packed_stacks_and_replaced_rows_stay_in_their_columns() {
        let device = Device::flex();
        let (k, a_rows, b_rows) = (64, 20, 12);
        let a = tensor(a_rows, k, 1, &device);
        let b = tensor(b_rows, k, 2, &device);
        let packed_a = Weight::Packed(Arc::new(quantize_dense(a.clone(), QuantType::Q8_0)));
        let mut stacked = Weight::stack(vec![packed_a, Weight::Dense(b.clone())]);
        assert_eq!(stacked.dims(), [a_rows + b_rows, k]);
        assert_eq!(stacked.describe(), "Q8_0");
        let x = tensor(3, k, 9, &device);
        let product = |w: &Weight| Linear { weight: w.clone(), bias: None }.forward(x.clone());
        let dense = |t: Tensor<2>| product(&Weight::Dense(t)).into_data().try_into_vec::<f32>().unwrap();
        let close = |got: &[f32], want: &[f32]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 0.05);
        let got = product(&stacked);
        let (ya, yb) = (dense(a.clone()), dense(b.clone()));
        let part = |y: &Tensor<2>, r: Range<usize>| {
            y.clone().narrow(1, r.start, r.len()).into_data().try_into_vec::<f32>().unwrap()
        };
        assert!(close(&part(&got, 0..a_rows), &ya) && close(&part(&got, a_rows..a_rows + b_rows), &yb));
        // Replace b's rows by a's first 12: its columns now give a's outputs.
        let replacement = a.clone().narrow(0, 0, b_rows);
        stacked.replace_rows(a_rows..a_rows + b_rows, replacement.clone().into_data(), &device);
        let got = product(&stacked);
        assert!(close(&part(&got, a_rows..a_rows + b_rows), &dense(replacement)));
        assert!(close(&part(&got, 0..a_rows), &ya));
    }
}
