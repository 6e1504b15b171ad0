//! C6: the llama.cpp-style slot/cell KV cache.

mod cache;
mod cells;
mod recurrent;
#[cfg(test)]
mod tests;

pub use cache::{KvCache, KvDtype, KvLayout};
pub use cells::{KvCells, MAX_SEQ, Placement, Pos, PosRange, SeqId, SeqSet};
pub use recurrent::{
    Keep, LayerState, MAX_CHECKPOINTS, Recurrent, RecurrentLayout, RowGroups, StateCut, push_checkpoint,
};
