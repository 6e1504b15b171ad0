//! The Qwen2 / Qwen2.5 model type (`Qwen2ForCausalLM` checkpoints).

mod model;
mod weights;

pub use model::{Qwen2, info, load};
