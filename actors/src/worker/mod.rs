//! The worker's work (E1): one model context and the samplers of its sequences.

mod executor;

pub use executor::{Executor, ItemOutput, Lane, outcomes};
