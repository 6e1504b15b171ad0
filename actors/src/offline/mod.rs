//! Offline generation (E9): `Llm`, the blocking engine for batch jobs, over the same scheduler
//! and executor the actors use.

mod llm;

pub use llm::{Completion, Llm};
