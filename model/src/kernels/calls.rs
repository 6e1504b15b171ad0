//! How many products each kernel ran, process-wide: which kernel serves a model is observable
//! (`llaisys_kernel_calls_total` in `/metrics`, `bench`'s report) and asserted in tests. One
//! relaxed atomic add per product.

use std::sync::atomic::{AtomicU64, Ordering};

/// The kernels a linear layer's product runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelCall {
    /// AVX-512 few-row x·Wᵀ over f32, f16 or bf16 weights.
    Xwt,
    /// AVX2 many-row x·Wᵀ over f32, f16 or bf16 weights.
    GemmAvx2,
    /// AVX-512 many-row x·Wᵀ over f16 or bf16 weights.
    GemmAvx512,
    /// AVX512-BF16 many-row x·Wᵀ over bf16 weights.
    Bf16Dot,
    /// Burn's matmul (the CPU backend's GEMM for many rows, or another backend's).
    Burn,
    /// The GPU's few-row x·Wᵀ (CubeCL) over f32, f16 or bf16 weights, bias and residual fused.
    CubeXwt,
    /// The GPU's few-row x·Wᵀ (CubeCL) over quantized weights read in their ggml blocks.
    CubeXwtQ,
    /// The GPU's products of a mixture of experts' chosen experts, routed on the device (two a
    /// layer: the gate/up and the down products of every row's experts).
    CubeExperts,
    /// Burn's matmul split over two threads (few rows on a CPU without AVX-512).
    BurnSplit,
    /// The quantized product on AVX-512 VNNI.
    QuantVnni,
    /// The quantized product on AVX2.
    QuantAvx2,
    /// The quantized product in portable Rust.
    QuantPortable,
    /// A kernel refused the input its weight chose it for (a bug): Burn's matmul ran instead.
    Fallback,
}

const ALL: [KernelCall; 13] = [
    KernelCall::Xwt,
    KernelCall::GemmAvx2,
    KernelCall::GemmAvx512,
    KernelCall::Bf16Dot,
    KernelCall::Burn,
    KernelCall::CubeXwt,
    KernelCall::CubeXwtQ,
    KernelCall::CubeExperts,
    KernelCall::BurnSplit,
    KernelCall::QuantVnni,
    KernelCall::QuantAvx2,
    KernelCall::QuantPortable,
    KernelCall::Fallback,
];

static CALLS: [AtomicU64; ALL.len()] = [const { AtomicU64::new(0) }; ALL.len()];

impl KernelCall {
    pub fn name(self) -> &'static str {
        match self {
            Self::Xwt => "xwt",
            Self::GemmAvx2 => "gemm_avx2",
            Self::GemmAvx512 => "gemm_avx512",
            Self::Bf16Dot => "bf16dot",
            Self::Burn => "burn",
            Self::CubeXwt => "cube_xwt",
            Self::CubeXwtQ => "cube_xwt_q",
            Self::CubeExperts => "cube_experts",
            Self::BurnSplit => "burn_split",
            Self::QuantVnni => "quant_vnni",
            Self::QuantAvx2 => "quant_avx2",
            Self::QuantPortable => "quant_portable",
            Self::Fallback => "fallback",
        }
    }

    /// One more product on this kernel.
    pub fn count(self) {
        CALLS[self as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Every kernel's products so far in this process, by name.
pub fn calls() -> Vec<(&'static str, u64)> {
    ALL.iter().map(|k| (k.name(), CALLS[*k as usize].load(Ordering::Relaxed))).collect()
}
