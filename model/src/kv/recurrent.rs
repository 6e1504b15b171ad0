//! The recurrent state of linear-attention layers (Qwen3.5's gated DeltaNet), per sequence,
//! beside the cells of the full-attention layers. A state holds everything a sequence's tokens
//! left behind, so unlike cells it cannot be cut back to an arbitrary position: it can go back
//! only to a checkpoint, a copy of the state kept when asked (`checkpoint`, now or on the way
//! through the pass that gets there; the scheduler asks for one a token short of each prompt's
//! end, so the same prompt again, or the next turn of a conversation, goes on from there). The
//! sequence operations keep, copy or drop whole states, cut or copy a sequence back to one of its
//! checkpoints, and refuse (changing nothing) what would need any other part of one: removing a
//! sequence's tokens from a position that is not a checkpoint, copying fewer than all of them up
//! to one that is not, or moving their positions.

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

/// Most checkpoints a sequence keeps: a new one beyond them replaces the earliest
/// (`push_checkpoint`, the rule the scheduler plans with too).
pub const MAX_CHECKPOINTS: usize = 4;

/// Adds a checkpoint at `pos` to a sequence's list (in the order they were taken): one at the
/// same position is replaced, and beyond `MAX_CHECKPOINTS` the earliest goes. The one rule for
/// the states here and for the scheduler's record of them.
pub fn push_checkpoint<T, P: PartialEq>(list: &mut Vec<T>, item: T, pos: impl Fn(&T) -> P) {
    let at = pos(&item);
    list.retain(|c| pos(c) != at);
    list.push(item);
    if list.len() > MAX_CHECKPOINTS {
        list.remove(0);
    }
}

/// A state: the tokens it took in, and every layer's convolution state and memory.
#[derive(Debug, Clone)]
struct State {
    /// Positions `[0, len)` are in it.
    len: Pos,
    /// [layers × conv]
    conv: Vec<f32>,
    /// [layers × memory]
    memory: Vec<f32>,
}

/// One sequence's state, and the earlier states it can go back to.
#[derive(Debug, Clone)]
struct SeqState {
    live: State,
    /// Taken in this order, each at a position at most `live.len`.
    checkpoints: Vec<State>,
    /// The checkpoint the pass in progress fills on its way (`Recurrent::rows`).
    taking: Option<State>,
}

impl SeqState {
    /// Its state after `len` tokens: the live one or a checkpoint.
    fn at(&self, len: Pos) -> Option<&State> {
        std::iter::once(&self.live).chain(&self.checkpoints).find(|s| s.len == len)
    }

    fn floats(&self) -> usize {
        std::iter::once(&self.live).chain(&self.checkpoints).map(|s| s.conv.len() + s.memory.len()).sum()
    }
}

/// What removing a range of a sequence does to its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateCut {
    /// The range holds none of its tokens.
    Keep,
    /// All of them: the state goes.
    Drop,
    /// Those from a checkpoint on: the state goes back to it.
    Restore(Pos),
}

/// One sequence's state in one layer, with the batch rows it takes in, in order.
pub struct LayerState<'a> {
    pub rows: &'a [usize],
    pub conv: &'a mut [f32],
    pub memory: &'a mut [f32],
    /// A checkpoint to fill on the way: a copy of the state once it took the first `after`
    /// rows in (1 ≤ `after` ≤ the rows).
    pub keep: Option<Keep<'a>>,
}

/// Where a layer's state goes when it reaches a checkpoint part way through a pass.
pub struct Keep<'a> {
    pub after: usize,
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
    /// Checkpoints asked for ahead of a sequence's state: the lengths to keep it at when a pass
    /// gets it there.
    pending: BTreeMap<SeqId, Pos>,
}

impl Recurrent {
    pub fn new(layout: RecurrentLayout) -> Self {
        Self { layout, states: BTreeMap::new(), pending: BTreeMap::new() }
    }

    /// Bytes the states of the sequences now held take, with their checkpoints.
    pub fn size_bytes(&self) -> usize {
        self.states.values().map(|s| s.floats() * 4).sum()
    }

    /// Groups a batch's rows (each in one sequence, at `pos`) by sequence, checking that each
    /// sequence's rows continue its state (a new sequence starts at 0); makes the states of new
    /// sequences, and the checkpoints asked for within the rows. On an error nothing changed.
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
            let len = self.states.get(seq).map_or(0, |s| s.live.len);
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
        let zero = |len| State { len, conv: vec![0.0; l.layers * l.conv], memory: vec![0.0; l.layers * l.memory] };
        for (seq, rows) in &groups {
            let s = self.states.entry(*seq).or_insert_with(|| SeqState {
                live: zero(0),
                checkpoints: Vec::new(),
                taking: None,
            });
            let (start, end) = (s.live.len, s.live.len + rows.len() as Pos);
            s.taking = match self.pending.get(seq) {
                Some(&at) if at > start && at <= end => {
                    self.pending.remove(seq);
                    Some(zero(at))
                }
                _ => None,
            };
        }
        Ok(RowGroups(groups))
    }

    /// Layer `layer`'s state of each group's sequence.
    pub fn layer<'a>(&'a mut self, layer: usize, groups: &'a RowGroups) -> Vec<LayerState<'a>> {
        let l = self.layout;
        let (conv, memory) = (layer * l.conv..(layer + 1) * l.conv, layer * l.memory..(layer + 1) * l.memory);
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
                let SeqState { live, taking, .. } = by_seq.remove(seq)?;
                let keep = taking.as_mut().map(|t| Keep {
                    after: (t.len - live.len) as usize,
                    conv: &mut t.conv[conv.clone()],
                    memory: &mut t.memory[memory.clone()],
                });
                Some(LayerState {
                    rows,
                    conv: &mut live.conv[conv.clone()],
                    memory: &mut live.memory[memory.clone()],
                    keep,
                })
            })
            .collect()
    }

    /// The pass took the groups' rows in: their sequences' states now hold them, and the
    /// checkpoints filled on the way are kept.
    pub fn advance(&mut self, groups: &RowGroups) {
        for (seq, rows) in &groups.0 {
            if let Some(s) = self.states.get_mut(seq) {
                s.live.len += rows.len() as Pos;
                if let Some(taken) = s.taking.take() {
                    push_checkpoint(&mut s.checkpoints, taken, |c| c.len);
                }
            }
        }
    }

    /// Keeps a copy of `seq`'s state once it holds `len` tokens, to go back to
    /// (`push_checkpoint`'s rule): now if it does, else on the way through the pass that gets it
    /// there (the next one whose rows reach `len`). Nothing for a length the state is past, or 0.
    pub fn checkpoint(&mut self, seq: SeqId, len: Pos) {
        let held = self.states.get(&seq).map_or(0, |s| s.live.len);
        if len > held {
            self.pending.insert(seq, len);
        } else if len == held
            && let Some(s) = self.states.get_mut(&seq)
        {
            push_checkpoint(&mut s.checkpoints, s.live.clone(), |c| c.len);
        }
    }

    /// What removing `range` of `seq` does to its state: nothing if the range holds none of its
    /// tokens, drop it if all of them, go back to a checkpoint where the range starts at one and
    /// runs to the end; anything else would need part of a state.
    pub fn check_rm(&self, seq: SeqId, range: PosRange) -> Result<StateCut, KvError> {
        let start = range.start.unwrap_or(0).max(0);
        let end = range.end.unwrap_or(Pos::MAX);
        let Some(s) = self.states.get(&seq) else {
            // No state yet; a checkpoint asked for ahead of one goes with the whole sequence.
            return Ok(if start == 0 && end == Pos::MAX { StateCut::Drop } else { StateCut::Keep });
        };
        let len = s.live.len;
        if start >= len || end <= start {
            Ok(StateCut::Keep)
        } else if start == 0 && end >= len {
            Ok(StateCut::Drop)
        } else if end >= len && s.at(start).is_some() {
            Ok(StateCut::Restore(start))
        } else {
            Err(KvError::PartialState)
        }
    }

    /// Applies a checked cut.
    pub fn cut(&mut self, seq: SeqId, cut: StateCut) {
        if cut != StateCut::Keep {
            self.pending.remove(&seq);
        }
        match cut {
            StateCut::Keep => {}
            StateCut::Drop => drop(self.states.remove(&seq)),
            StateCut::Restore(len) => {
                if let Some(s) = self.states.get_mut(&seq)
                    && let Some(back) = s.at(len).cloned()
                {
                    s.live = back;
                    s.checkpoints.retain(|c| c.len <= len);
                }
            }
        }
    }

    /// Whether copying `range` of `src` is possible: from its start, and to its end or to one of
    /// its checkpoints (or it has no state). `Ok(len)`: the tokens the copy's state holds.
    pub fn check_cp(&self, src: SeqId, range: PosRange) -> Result<Option<Pos>, KvError> {
        let Some(s) = self.states.get(&src) else { return Ok(None) };
        let end = range.end.map_or(s.live.len, |e| e.min(s.live.len));
        if range.start.unwrap_or(0) <= 0 && s.at(end).is_some() { Ok(Some(end)) } else { Err(KvError::PartialState) }
    }

    /// `dst` continues from `src`'s state after `len` tokens (checked by `check_cp`), with the
    /// checkpoints up to there.
    pub fn copy(&mut self, src: SeqId, dst: SeqId, len: Pos) {
        let Some(s) = self.states.get(&src).filter(|_| src != dst) else { return };
        let Some(live) = s.at(len).cloned() else { return };
        let checkpoints = s.checkpoints.iter().filter(|c| c.len <= len).cloned().collect();
        self.states.insert(dst, SeqState { live, checkpoints, taking: None });
        self.pending.remove(&dst);
    }

    /// Moving positions: refused where the sequence has a state (its tokens cannot be dropped
    /// from it, and a context shift drops the oldest).
    pub fn check_add(&self, seq: SeqId) -> Result<(), KvError> {
        if self.states.contains_key(&seq) { Err(KvError::PartialState) } else { Ok(()) }
    }

    /// Keeps only `seq`'s state.
    pub fn keep(&mut self, seq: SeqId) {
        self.states.retain(|s, _| *s == seq);
        self.pending.retain(|s, _| *s == seq);
    }

    pub fn clear(&mut self) {
        self.states.clear();
        self.pending.clear();
    }
}
