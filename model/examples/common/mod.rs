//! What the benchmark examples share.

use std::time::Instant;

use half::f16;
use llaisys_model::quant::{self, QuantType};

/// Seconds per call of `f`: one warm-up call, then as many as fit in half a second.
#[allow(dead_code)] // not every example uses it
pub fn time(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut runs = 0;
    while start.elapsed().as_secs_f64() < 0.5 {
        f();
        runs += 1;
    }
    start.elapsed().as_secs_f64() / runs as f64
}

/// Random blocks of `ty` whose scales are small finite values (random bytes elsewhere).
#[allow(dead_code)] // not every example uses it
pub fn random_blocks(ty: QuantType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ seed.wrapping_mul(0x2545_F491_4F6C_DD1D);
    let mut bytes: Vec<u8> = (0..rows * quant::row_bytes(ty, k))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 56) as u8
        })
        .collect();
    let fields = ty.f16_fields();
    let scale = f16::from_f32(0.001).to_le_bytes();
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        for &at in fields {
            block[at..at + 2].copy_from_slice(&scale);
        }
        if ty == QuantType::Mxfp4 {
            block[0] = 118; // an E8M0 scale of 2^-10
        }
    }
    bytes
}
