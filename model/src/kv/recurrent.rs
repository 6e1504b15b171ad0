//! The recurrent state of linear-attention layers (Qwen3.5's gated DeltaNet), per sequence,
//! beside the cells of the full-attention layers. A state holds everything a sequence's tokens
//! left behind, so unlike cells it cannot be cut back to an earlier position: the sequence
//! operations keep, copy or drop whole states, and refuse (changing nothing) what would need
//! part of one: removing a sequence's tokens short of all of them, copying less than all of
//! them, or moving their positions.

use std::collections::BTreeMap;

use super::cells::{Pos, PosRange, SeqId, SeqSet};
use crate::error::{DecodeError, KvError};

/// What one sequence's state holds in each linear-attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentLayout {
    /// Linear-attention layers.
    pub layers: usize,
    /// Floats of a layer's convolution state (its last inputs).
    pub conv: usize,
    /// Floats of a layer's memory (each value head's [key_dim, value_dim]).
    pub memory: usize,
}

/// One sequence's state: the tokens it took in, and every layer's convolution state and memory.
#[derive(Debug, Clone)]
struct SeqState {
    /// Positions `[0, len)` are in it.
    len: Pos,
    /// [layers × conv]
    conv: Vec<f32>,
    /// [layers × memory]
    memory: Vec<f32>,
}

/// One sequence's state in one layer, with the batch rows it takes in, in order.
pub struct LayerState<'a> {
    pub rows: &'a [usize],
    pub conv: &'a mut [f32],
    pub memory: &'a mut [f32],
}

/// A batch's rows by sequence, checked against the states: each sequence's rows continue its
/// state's positions one by one.
#[derive(Debug)]
pub struct RowGroups(Vec<(SeqId, Vec<usize>)>);

/// Every sequence's state, made zero at its first token.
#[derive(Debug)]
pub struct Recurrent {
    layout: RecurrentLayout,
    states: BTreeMap<SeqId, SeqState>,
}

impl Recurrent {
    pub fn new(layout: RecurrentLayout) -> Self {
        Self { layout, states: BTreeMap::new() }
    }

    /// Bytes the states of the sequences now held take.
    pub fn size_bytes(&self) -> usize {
        self.states.len() * self.layout.layers * (self.layout.conv + self.layout.memory) * 4
    }

    /// Groups a batch's rows (each in one sequence, at `pos`) by sequence, checking that each
    /// sequence's rows continue its state (a new sequence starts at 0); makes the states of new
    /// sequences. On an error nothing changed.
    pub fn rows(&mut self, seqs: &[SeqSet], pos: &[Pos]) -> Result<RowGroups, DecodeError> {
        let mut groups: Vec<(SeqId, Vec<usize>)> = Vec::new();
        for (row, set) in seqs.iter().enumerate() {
            let mut ids = set.iter();
            let (Some(seq), None) = (ids.next(), ids.next()) else {
                let reason = format!("row {row}: a token of a model with linear attention belongs to one sequence");
                return Err(DecodeError::InvalidInput(reason));
            };
            match groups.iter_mut().find(|(s, _)| *s == seq) {
                Some((_, rows)) => rows.push(row),
                None => groups.push((seq, vec![row])),
            }
        }
        for (seq, rows) in &groups {
            let len = self.states.get(seq).map_or(0, |s| s.len);
            for (k, &row) in rows.iter().enumerate() {
                if pos[row] != len + k as Pos {
                    let reason = format!(
                        "sequence {seq}: position {} does not follow the {len} tokens its linear-attention state holds",
                        pos[row]
                    );
                    return Err(DecodeError::InvalidInput(reason));
                }
            }
        }
        let l = self.layout;
        for (seq, _) in &groups {
            self.states.entry(*seq).or_insert_with(|| SeqState {
                len: 0,
                conv: vec![0.0; l.layers * l.conv],
                memory: vec![0.0; l.layers * l.memory],
            });
        }
        Ok(RowGroups(groups))
    }

    /// Layer `layer`'s state of each group's sequence.
    pub fn layer<'a>(&'a mut self, layer: usize, groups: &'a RowGroups) -> Vec<LayerState<'a>> {
        let l = self.layout;
        let mut by_seq: BTreeMap<SeqId, &'a mut SeqState> = self
            .states
            .iter_mut()
            .filter(|(s, _)| groups.0.iter().any(|(g, _)| g == *s))
            .map(|(s, st)| (*s, st))
            .collect();
        groups
            .0
            .iter()
            .filter_map(|(seq, rows)| {
                let state = by_seq.remove(seq)?;
                Some(LayerState {
                    rows,
                    conv: &mut state.conv[layer * l.conv..(layer + 1) * l.conv],
                    memory: &mut state.memory[layer * l.memory..(layer + 1) * l.memory],
                })
            })
            .collect()
    }

    /// The pass took the groups' rows in: their sequences' states now hold them.
    pub fn advance(&mut self, groups: &RowGroups) {
        for (seq, rows) in &groups.0 {
            if let Some(s) = self.states.get_mut(seq) {
                s.len += rows.len() as Pos;
            }
        }
    }

    /// Whether removing `range` of `seq` is possible: all of its tokens, or none of them.
    /// `Ok(true)`: the state goes.
    pub fn check_rm(&self, seq: SeqId, range: PosRange) -> Result<bool, KvError> {
        let Some(s) = self.states.get(&seq) else { return Ok(false) };
        let start = range.start.unwrap_or(0).max(0);
        let end = range.end.unwrap_or(Pos::MAX);
        if start >= s.len || end <= start {
            Ok(false)
        } else if start == 0 && end >= s.len {
            Ok(true)
        } else {
            Err(KvError::PartialState)
        }
    }

    pub fn remove(&mut self, seq: SeqId) {
        self.states.remove(&seq);
    }

    /// Whether copying `range` of `src` is possible: all of its tokens (or it has none).
    pub fn check_cp(&self, src: SeqId, range: PosRange) -> Result<(), KvError> {
        let Some(s) = self.states.get(&src) else { return Ok(()) };
        let covers = range.start.unwrap_or(0) <= 0 && range.end.is_none_or(|e| e >= s.len);
        if covers { Ok(()) } else { Err(KvError::PartialState) }
    }

    /// `dst` continues from `src`'s state (a copy).
    pub fn copy(&mut self, src: SeqId, dst: SeqId) {
        match self.states.get(&src).cloned() {
            Some(s) if src != dst => drop(self.states.insert(dst, s)),
            _ => {}
        }
    }

    /// Moving positions: refused where the sequence has a state (its tokens cannot be dropped
    /// from it, and a context shift drops the oldest).
    pub fn check_add(&self, seq: SeqId) -> Result<(), KvError> {
        if self.states.contains_key(&seq) { Err(KvError::PartialState) } else { Ok(()) }
    }

    /// Keeps only `seq`'s state.
    pub fn keep(&mut self, seq: SeqId) {
        self.states.retain(|s, _| *s == seq);
    }

    pub fn clear(&mut self) {
        self.states.clear();
    }
}
