//! Building blocks shared by the model types: shape-documented tensor functions over Burn.

mod attention;
mod delta_net;
mod latent_attention;
pub mod linear;
mod moe;
mod rms_norm;
mod rope;
mod swiglu;

pub use attention::{Sinks, attention};
pub use delta_net::DeltaNet;
pub use latent_attention::LatentAttention;
pub use linear::{Linear, LinearWeight, Pre, Weight};
pub use moe::{Choice, Expert, ExpertStacks, Moe, expert_stats};
pub use rms_norm::RmsNorm;
pub use rope::{Rope, RopeTables};
pub use swiglu::swiglu;
