//! C6: the cell metadata of the slot/cell KV cache, with llama.cpp semantics
//! (`llama-kv-cells.h`). Parallel arrays per cell (position, pending shift, owning sequences)
//! plus derived indexes (used count, per-sequence position counts). The indexes change only
//! through the private helpers `own`, `disown` and `move_pos`, so the invariants live there.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::{Range, RangeFrom, RangeFull, RangeTo};

use crate::error::KvError;

/// A token position within a sequence.
pub type Pos = i64;
/// A sequence id, below [`MAX_SEQ`].
pub type SeqId = u32;
/// How many sequence ids a cache tracks.
pub const MAX_SEQ: usize = 256;

/// A set of sequence ids (a 256-bit set, like llama.cpp's `std::bitset<LLAMA_MAX_SEQ>`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SeqSet([u64; MAX_SEQ / 64]);

impl SeqSet {
    pub fn single(seq: SeqId) -> Self {
        let mut s = Self::default();
        s.insert(seq);
        s
    }
    /// Precondition: `seq < MAX_SEQ` (checked by callers that take user input).
    pub fn insert(&mut self, seq: SeqId) {
        self.0[seq as usize / 64] |= 1 << (seq % 64);
    }
    pub fn remove(&mut self, seq: SeqId) {
        self.0[seq as usize / 64] &= !(1 << (seq % 64));
    }
    pub fn contains(&self, seq: SeqId) -> bool {
        (seq as usize) < MAX_SEQ && self.0[seq as usize / 64] & (1 << (seq % 64)) != 0
    }
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }
    pub fn intersects(&self, other: &SeqSet) -> bool {
        self.0.iter().zip(other.0.iter()).any(|(a, b)| a & b != 0)
    }
    pub fn iter(&self) -> impl Iterator<Item = SeqId> + '_ {
        (0..MAX_SEQ as SeqId).filter(|s| self.contains(*s))
    }
}

impl std::fmt::Debug for SeqSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// A half-open position range `[start, end)`; `None` is an open end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PosRange {
    pub start: Option<Pos>,
    pub end: Option<Pos>,
}

impl PosRange {
    pub const ALL: PosRange = PosRange { start: None, end: None };

    /// The C interface's convention: a negative bound is an open end.
    pub fn from_raw(p0: i64, p1: i64) -> Self {
        Self { start: (p0 >= 0).then_some(p0), end: (p1 >= 0).then_some(p1) }
    }

    fn contains(&self, pos: Pos) -> bool {
        self.start.is_none_or(|s| pos >= s) && self.end.is_none_or(|e| pos < e)
    }
}

impl From<Range<Pos>> for PosRange {
    fn from(r: Range<Pos>) -> Self {
        Self::from_raw(r.start, r.end)
    }
}
impl From<RangeFrom<Pos>> for PosRange {
    fn from(r: RangeFrom<Pos>) -> Self {
        Self::from_raw(r.start, -1)
    }
}
impl From<RangeTo<Pos>> for PosRange {
    fn from(r: RangeTo<Pos>) -> Self {
        Self::from_raw(-1, r.end)
    }
}
impl From<RangeFull> for PosRange {
    fn from(_: RangeFull) -> Self {
        Self::ALL
    }
}

/// Where a batch's tokens go: one cell per token, grouped into runs of consecutive cells so
/// keys and values are written with one slice assignment per run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// \[n_tokens\] the cell of each token.
    pub cells: Vec<usize>,
}

impl Placement {
    /// Runs of consecutive cells as `(first_cell, first_token, len)`.
    pub fn runs(&self) -> Vec<(usize, usize, usize)> {
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        for (token, &cell) in self.cells.iter().enumerate() {
            match runs.last_mut() {
                Some((c0, _, len)) if *c0 + *len == cell => *len += 1,
                _ => runs.push((cell, token, 1)),
            }
        }
        runs
    }
}

/// The metadata of every cell of one KV cache.
#[derive(Debug, Clone)]
pub struct KvCells {
    /// [capacity] position of each cell; meaningful only while the cell has owners.
    pos: Vec<Pos>,
    /// [capacity] shift accumulated by `seq_add` and not yet applied to the cached keys.
    shift: Vec<Pos>,
    /// [capacity] sequences that own each cell; empty = free.
    seq: Vec<SeqSet>,
    /// Derived: number of cells with at least one owner.
    used: usize,
    /// Derived: per sequence, how many of its cells sit at each position.
    seq_pos: Vec<BTreeMap<Pos, u32>>,
    /// Positions must stay below this (the model's context length).
    n_pos: Pos,
    /// Where the next slot search starts.
    head: usize,
}

impl KvCells {
    pub fn new(capacity: usize, n_pos: usize) -> Self {
        Self {
            pos: vec![0; capacity],
            shift: vec![0; capacity],
            seq: vec![SeqSet::default(); capacity],
            used: 0,
            seq_pos: vec![BTreeMap::new(); MAX_SEQ],
            n_pos: n_pos as Pos,
            head: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.pos.len()
    }
    pub fn used(&self) -> usize {
        self.used
    }
    pub fn free(&self) -> usize {
        self.capacity() - self.used
    }
    /// One past the highest used cell: attention only looks at cells below it.
    pub fn extent(&self) -> usize {
        self.seq.iter().rposition(|s| !s.is_empty()).map_or(0, |i| i + 1)
    }
    /// The owners and position of cell `i`, or `None` when it is free.
    pub fn cell(&self, i: usize) -> Option<(SeqSet, Pos)> {
        let seqs = *self.seq.get(i)?;
        (!seqs.is_empty()).then(|| (seqs, self.pos[i]))
    }
    /// Whether a token in `seqs` at `pos` attends to cell `i`.
    pub fn is_visible(&self, i: usize, seqs: &SeqSet, pos: Pos) -> bool {
        self.seq[i].intersects(seqs) && self.pos[i] <= pos
    }
    /// Whether a token at `pos` of a layer that attends over its last `window` positions only
    /// (a local layer's sliding window) sees cell `i`, which it would see in full
    /// ([`Self::is_visible`]): the cell's position is one of them.
    pub fn in_window(&self, i: usize, pos: Pos, window: usize) -> bool {
        self.pos[i] > pos.saturating_sub(window as Pos)
    }

    /// Largest position of `seq`, `None` when it owns no cell (the C interface's −1).
    pub fn seq_pos_max(&self, seq: SeqId) -> Option<Pos> {
        self.seq_pos.get(seq as usize)?.keys().next_back().copied()
    }
    /// Smallest position of `seq`, `None` when it owns no cell.
    pub fn seq_pos_min(&self, seq: SeqId) -> Option<Pos> {
        self.seq_pos.get(seq as usize)?.keys().next().copied()
    }
    /// Number of cells owned by `seq`.
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seq_pos.get(seq as usize).map_or(0, |m| m.values().map(|n| *n as usize).sum())
    }

    /// Finds `n` free cells, preferring one contiguous run; `None` when fewer than `n` are free.
    /// Changes nothing.
    pub fn find_slots(&self, n: usize) -> Option<Placement> {
        let cap = self.capacity();
        if n == 0 || n > self.free() {
            return None;
        }
        let start = if self.head + n <= cap { self.head } else { 0 };
        let mut run = 0;
        for i in (start..cap).chain(0..start) {
            if i == 0 {
                run = 0;
            }
            run = if self.seq[i].is_empty() { run + 1 } else { 0 };
            if run == n {
                return Some(Placement { cells: (i + 1 - n..=i).collect() });
            }
        }
        let cells: Vec<usize> = (start..cap).chain(0..start).filter(|&i| self.seq[i].is_empty()).take(n).collect();
        Some(Placement { cells })
    }

    /// Gives each placed cell its token's position and sequences.
    /// Precondition: every cell of `placement` is free; `pos` and `seqs` are [n_tokens].
    pub(crate) fn occupy(&mut self, placement: &Placement, pos: &[Pos], seqs: &[SeqSet]) {
        for ((&i, &p), set) in placement.cells.iter().zip(pos).zip(seqs) {
            assert!(self.seq[i].is_empty(), "occupy: cell {i} is not free");
            self.pos[i] = p;
            self.shift[i] = 0;
            for s in set.iter() {
                self.own(i, s);
            }
        }
        if let Some(&last) = placement.cells.last() {
            self.head = (last + 1) % self.capacity();
        }
    }

    /// Frees the placed cells again (the undo of `occupy` after a failed forward pass).
    pub(crate) fn release(&mut self, placement: &Placement) {
        for &i in &placement.cells {
            for s in self.seq[i].iter().collect::<Vec<_>>() {
                self.disown(i, s);
            }
        }
        if let Some(&first) = placement.cells.first() {
            self.head = first;
        }
    }

    /// Frees every cell.
    pub fn clear(&mut self) {
        *self = Self::new(self.capacity(), self.n_pos as usize);
    }

    /// Removes `seq`'s ownership of its cells in `range`; a cell no one owns becomes free.
    pub fn seq_rm(&mut self, seq: SeqId, range: impl Into<PosRange>) -> Result<(), KvError> {
        let range = self.check(seq, range.into())?;
        for i in self.cells_of(seq, range) {
            self.disown(i, seq);
        }
        Ok(())
    }

    /// `dst` gains ownership of `src`'s cells in `range` (shared; no tensor copy).
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, range: impl Into<PosRange>) -> Result<(), KvError> {
        let range = self.check(src, range.into())?;
        self.check(dst, PosRange::ALL)?;
        if src == dst {
            return Ok(());
        }
        for i in self.cells_of(src, range) {
            if !self.seq[i].contains(dst) {
                self.own(i, dst);
            }
        }
        Ok(())
    }

    /// Drops every sequence but `seq`: cells it owns keep only it, all others are freed.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), KvError> {
        self.check(seq, PosRange::ALL)?;
        for i in 0..self.capacity() {
            for s in self.seq[i].iter().filter(|s| *s != seq).collect::<Vec<_>>() {
                self.disown(i, s);
            }
        }
        Ok(())
    }

    /// Shifts the positions of `seq`'s cells in `range` by `delta`; the shift is recorded so
    /// cached keys are re-rotated before the next forward pass. As in llama.cpp, a cell whose
    /// position would become negative is removed. A position at or past the context length
    /// is `InvalidPos`, and then nothing changes.
    pub fn seq_add(&mut self, seq: SeqId, range: impl Into<PosRange>, delta: Pos) -> Result<(), KvError> {
        let range = self.check(seq, range.into())?;
        let cells = self.cells_of(seq, range);
        if cells.iter().any(|&i| self.pos[i] + delta >= self.n_pos) {
            return Err(KvError::InvalidPos);
        }
        for i in cells {
            let new_pos = self.pos[i] + delta;
            if new_pos < 0 {
                for s in self.seq[i].iter().collect::<Vec<_>>() {
                    self.disown(i, s);
                }
            } else {
                self.move_pos(i, new_pos);
                self.shift[i] += delta;
            }
        }
        Ok(())
    }

    /// The pending shifts of cells `[0, extent)`, cleared on return; `None` when there are none.
    pub(crate) fn take_shifts(&mut self) -> Option<Vec<Pos>> {
        let extent = self.extent();
        if self.shift[..extent].iter().all(|s| *s == 0) {
            return None;
        }
        let shifts = self.shift[..extent].to_vec();
        self.shift.iter_mut().for_each(|s| *s = 0);
        Some(shifts)
    }

    /// One line per used cell: `cell → (seq ids, pos)`.
    pub fn dump(&self) -> String {
        let mut out = format!("kv cells: {}/{} used\n", self.used, self.capacity());
        for i in (0..self.capacity()).filter(|&i| !self.seq[i].is_empty()) {
            let _ = writeln!(out, "{i} → ({:?}, {})", self.seq[i], self.pos[i]);
        }
        out
    }

    /// Recomputes the derived indexes and compares (for tests).
    pub fn check_invariants(&self) -> bool {
        let used = self.seq.iter().filter(|s| !s.is_empty()).count();
        let mut seq_pos = vec![BTreeMap::<Pos, u32>::new(); MAX_SEQ];
        for (i, set) in self.seq.iter().enumerate() {
            for s in set.iter() {
                *seq_pos[s as usize].entry(self.pos[i]).or_default() += 1;
            }
        }
        used == self.used && seq_pos == self.seq_pos
    }

    fn check(&self, seq: SeqId, range: PosRange) -> Result<PosRange, KvError> {
        if seq as usize >= MAX_SEQ {
            return Err(KvError::InvalidSeq);
        }
        if let (Some(s), Some(e)) = (range.start, range.end)
            && s >= e
        {
            return Err(KvError::EmptyRange);
        }
        if range.start.is_some_and(|s| s >= self.n_pos) {
            return Err(KvError::InvalidPos);
        }
        Ok(range)
    }

    fn cells_of(&self, seq: SeqId, range: PosRange) -> Vec<usize> {
        (0..self.capacity()).filter(|&i| self.seq[i].contains(seq) && range.contains(self.pos[i])).collect()
    }

    /// Precondition: `i` is not owned by `seq`.
    fn own(&mut self, i: usize, seq: SeqId) {
        debug_assert!(!self.seq[i].contains(seq));
        if self.seq[i].is_empty() {
            self.used += 1;
        }
        self.seq[i].insert(seq);
        *self.seq_pos[seq as usize].entry(self.pos[i]).or_default() += 1;
    }

    /// Precondition: `i` is owned by `seq`. A cell left without owners becomes free.
    fn disown(&mut self, i: usize, seq: SeqId) {
        debug_assert!(self.seq[i].contains(seq));
        self.seq[i].remove(seq);
        Self::count_down(&mut self.seq_pos[seq as usize], self.pos[i]);
        if self.seq[i].is_empty() {
            self.used -= 1;
            self.shift[i] = 0;
        }
    }

    /// Moves an owned cell to `new_pos`, keeping every owner's position counts right.
    fn move_pos(&mut self, i: usize, new_pos: Pos) {
        for s in self.seq[i].iter().collect::<Vec<_>>() {
            Self::count_down(&mut self.seq_pos[s as usize], self.pos[i]);
            *self.seq_pos[s as usize].entry(new_pos).or_default() += 1;
        }
        self.pos[i] = new_pos;
    }

    fn count_down(counts: &mut BTreeMap<Pos, u32>, pos: Pos) {
        match counts.get_mut(&pos) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                counts.remove(&pos);
            }
            None => debug_assert!(false, "position count missing for pos {pos}"),
        }
    }
}
