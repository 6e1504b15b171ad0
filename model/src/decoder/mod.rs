//! The decoder every served family runs (`crate::arch` says how each differs): Qwen2/2.5,
//! Qwen3 dense and Llama 3.x checkpoints.

mod fused_experts;
mod model;
mod replay;
mod split_experts;
mod weights;

pub use model::{Decoder, info, load};
pub use weights::{ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT, ROPE_FREQS};
