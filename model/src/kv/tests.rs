//! Cell-metadata tests in the style of llama.cpp's semantics. Tensor-level behaviour (decode after
//! copy, shift, failed placement) is tested with a real model in `model/tests/kv_cache.rs`.

use super::cells::{KvCells, MAX_SEQ, Placement, Pos, PosRange, SeqSet};
use crate::error::{KvError, kv_status_code};

/// Places `n` tokens of `seq` at positions `p0..p0+n`.
fn fill(cells: &mut KvCells, seq: u32, p0: Pos, n: usize) -> Placement {
    let placement = cells.find_slots(n).expect("room");
    let pos: Vec<Pos> = (p0..p0 + n as Pos).collect();
    cells.occupy(&placement, &pos, &vec![SeqSet::single(seq); n]);
    assert!(cells.check_invariants());
    placement
}

#[test]
fn find_slots_prefers_a_contiguous_run_and_changes_nothing() {
    let mut cells = KvCells::new(8, 64);
    fill(&mut cells, 0, 0, 3);
    cells.seq_rm(0, 1..2).unwrap();
    let p = cells.find_slots(3).unwrap();
    assert_eq!(p.cells, vec![3, 4, 5]);
    assert_eq!(cells.used(), 2);
    assert!(cells.find_slots(7).is_none());
    assert_eq!(cells.find_slots(6).unwrap().cells.len(), 6, "scattered cells when no run is long enough");
}

#[test]
fn placement_runs_group_consecutive_cells() {
    let p = Placement { cells: vec![4, 5, 6, 1, 2, 9] };
    assert_eq!(p.runs(), vec![(4, 0, 3), (1, 3, 2), (9, 5, 1)]);
}

#[test]
fn pos_max_and_min_track_each_sequence() {
    let mut cells = KvCells::new(16, 64);
    assert_eq!(cells.seq_pos_max(0), None);
    fill(&mut cells, 0, 0, 5);
    fill(&mut cells, 1, 10, 2);
    assert_eq!((cells.seq_pos_min(0), cells.seq_pos_max(0)), (Some(0), Some(4)));
    assert_eq!((cells.seq_pos_min(1), cells.seq_pos_max(1)), (Some(10), Some(11)));
}

#[test]
fn seq_cp_shares_cells_without_using_more() {
    let mut cells = KvCells::new(16, 64);
    fill(&mut cells, 0, 0, 4);
    cells.seq_cp(0, 1, ..).unwrap();
    assert_eq!(cells.used(), 4);
    assert_eq!(cells.seq_pos_max(1), Some(3));
    // Removing the source keeps the cells alive for the copy.
    cells.seq_rm(0, ..).unwrap();
    assert_eq!((cells.used(), cells.seq_pos_max(0), cells.seq_len(1)), (4, None, 4));
    assert!(cells.check_invariants());
}

#[test]
fn seq_cp_of_a_range_copies_only_that_range() {
    let mut cells = KvCells::new(16, 64);
    fill(&mut cells, 0, 0, 6);
    cells.seq_cp(0, 2, 0..3).unwrap();
    assert_eq!((cells.seq_len(2), cells.seq_pos_max(2)), (3, Some(2)));
}

#[test]
fn seq_rm_frees_cells_for_reuse() {
    let mut cells = KvCells::new(4, 64);
    fill(&mut cells, 0, 0, 4);
    assert!(cells.find_slots(1).is_none());
    cells.seq_rm(0, 2..).unwrap();
    assert_eq!((cells.used(), cells.seq_pos_max(0)), (2, Some(1)));
    assert_eq!(cells.find_slots(2).unwrap().cells, vec![2, 3]);
}

#[test]
fn seq_keep_drops_every_other_sequence() {
    let mut cells = KvCells::new(16, 64);
    fill(&mut cells, 0, 0, 3);
    fill(&mut cells, 1, 0, 2);
    cells.seq_cp(0, 2, ..).unwrap();
    cells.seq_keep(2).unwrap();
    assert_eq!((cells.used(), cells.seq_len(0), cells.seq_len(1), cells.seq_len(2)), (3, 0, 0, 3));
    assert!(cells.check_invariants());
}

#[test]
fn seq_add_shifts_positions_and_records_the_shift() {
    let mut cells = KvCells::new(16, 64);
    fill(&mut cells, 0, 0, 5);
    cells.seq_add(0, 2.., 10).unwrap();
    assert_eq!(cells.seq_pos_max(0), Some(14));
    let shifts = cells.take_shifts().expect("pending shifts");
    assert_eq!(shifts, vec![0, 0, 10, 10, 10]);
    assert_eq!(cells.take_shifts(), None, "shifts are taken once");
    assert!(cells.check_invariants());
}

#[test]
fn seq_add_below_zero_removes_cells_like_llama_cpp() {
    let mut cells = KvCells::new(16, 64);
    fill(&mut cells, 0, 0, 5);
    cells.seq_add(0, .., -3).unwrap();
    assert_eq!((cells.used(), cells.seq_pos_min(0), cells.seq_pos_max(0)), (2, Some(0), Some(1)));
    assert!(cells.check_invariants());
}

#[test]
fn seq_add_past_the_context_changes_nothing() {
    let mut cells = KvCells::new(16, 8);
    fill(&mut cells, 0, 0, 5);
    assert_eq!(cells.seq_add(0, .., 4), Err(KvError::InvalidPos));
    assert_eq!(cells.seq_pos_max(0), Some(4));
    assert_eq!(cells.take_shifts(), None);
}

#[test]
fn bad_ranges_and_sequences_give_their_status_codes() {
    let mut cells = KvCells::new(16, 64);
    fill(&mut cells, 0, 0, 4);
    assert_eq!(cells.seq_rm(0, 3..3), Err(KvError::EmptyRange));
    assert_eq!(cells.seq_rm(0, PosRange::from_raw(5, 2)), Err(KvError::EmptyRange));
    assert_eq!(cells.seq_rm(0, 64..), Err(KvError::InvalidPos));
    assert_eq!(cells.seq_rm(MAX_SEQ as u32, ..), Err(KvError::InvalidSeq));
    assert_eq!(cells.seq_cp(0, MAX_SEQ as u32, ..), Err(KvError::InvalidSeq));
    assert_eq!(cells.seq_keep(1000), Err(KvError::InvalidSeq));
    assert_eq!(kv_status_code(cells.seq_rm(0, 3..3)), 4);
    assert_eq!(kv_status_code(cells.seq_rm(999, ..)), 2);
    assert_eq!(kv_status_code(cells.seq_rm(0, 100..)), 3);
    assert_eq!(kv_status_code(Ok(())), 0);
    assert_eq!(cells.used(), 4, "failed operations change nothing");
}

#[test]
fn raw_negative_bounds_are_open_ends() {
    assert_eq!(PosRange::from_raw(-1, -1), PosRange::ALL);
    assert_eq!(PosRange::from_raw(3, -1), PosRange::from(3..));
    let mut cells = KvCells::new(16, 64);
    fill(&mut cells, 0, 0, 6);
    cells.seq_rm(0, PosRange::from_raw(-1, 2)).unwrap();
    assert_eq!(cells.seq_pos_min(0), Some(2));
}

#[test]
fn visibility_needs_a_shared_sequence_and_an_earlier_position() {
    let mut cells = KvCells::new(16, 64);
    fill(&mut cells, 0, 0, 3);
    fill(&mut cells, 1, 0, 3);
    let a = SeqSet::single(0);
    assert!(cells.is_visible(0, &a, 0));
    assert!(!cells.is_visible(2, &a, 1), "a later position is not visible");
    assert!(!cells.is_visible(3, &a, 10), "another sequence's cell is never visible");
    let mut both = SeqSet::single(0);
    both.insert(1);
    assert!(cells.is_visible(3, &both, 0));
}

#[test]
fn release_undoes_occupy() {
    let mut cells = KvCells::new(8, 64);
    fill(&mut cells, 0, 0, 2);
    let before = cells.dump();
    let p = fill(&mut cells, 0, 2, 3);
    cells.release(&p);
    assert_eq!(cells.dump(), before);
    assert!(cells.check_invariants());
}

#[test]
fn dump_lists_cells_with_owners_and_positions() {
    let mut cells = KvCells::new(4, 64);
    fill(&mut cells, 3, 7, 1);
    cells.seq_cp(3, 5, ..).unwrap();
    assert_eq!(cells.dump(), "kv cells: 1/4 used\n0 → ({3, 5}, 7)\n");
}

/// A linear-attention state takes a sequence's tokens only in order: a row that skips or repeats
/// a position is refused and makes no state; a row in two sequences is refused.
#[test]
fn recurrent_rows_continue_their_state() {
    use super::{Recurrent, RecurrentLayout};
    let mut r = Recurrent::new(RecurrentLayout { layers: 2, conv: 3, memory: 4 });
    let one = |s| SeqSet::single(s);
    assert!(r.rows(&[one(0), one(0)], &[1, 2]).is_err(), "a new sequence starts at 0");
    assert_eq!(r.size_bytes(), 0);
    let groups = r.rows(&[one(0), one(1), one(0)], &[0, 0, 1]).unwrap();
    assert_eq!(r.layer(1, &groups).iter().map(|s| s.rows.to_vec()).collect::<Vec<_>>(), [vec![0, 2], vec![1]]);
    r.advance(&groups);
    assert!(r.rows(&[one(0)], &[3]).is_err(), "position 2 comes next");
    assert!(r.rows(&[one(0)], &[2]).is_ok());
    let mut both = one(0);
    both.insert(1);
    assert!(r.rows(&[both], &[2]).is_err());
    use super::StateCut;
    assert_eq!(r.check_rm(0, (2..).into()), Ok(StateCut::Keep), "nothing of it there");
    assert_eq!(r.check_rm(0, (1..).into()), Err(KvError::PartialState));
    assert_eq!(r.check_rm(0, (..).into()), Ok(StateCut::Drop));
    assert_eq!(r.check_cp(0, (0..1).into()), Err(KvError::PartialState));
    assert_eq!(r.check_cp(0, (0..2).into()), Ok(Some(2)));
    assert_eq!(r.check_cp(5, (0..1).into()), Ok(None), "no state to copy");
}

/// Checkpoints: a sequence keeps its latest `MAX_CHECKPOINTS`, goes back only to one of them,
/// and a copy takes those up to where it ends.
#[test]
fn recurrent_checkpoints_are_the_points_to_go_back_to() {
    use super::{MAX_CHECKPOINTS, Recurrent, RecurrentLayout, StateCut};
    let mut r = Recurrent::new(RecurrentLayout { layers: 1, conv: 1, memory: 1 });
    let one = SeqSet::single(0);
    let take = |r: &mut Recurrent, pos: Pos| {
        let groups = r.rows(&[one], &[pos]).unwrap();
        r.advance(&groups);
        r.checkpoint(0, pos + 1);
    };
    for pos in 0..MAX_CHECKPOINTS as Pos + 2 {
        take(&mut r, pos);
    }
    // After 6 tokens: checkpoints at 3, 4, 5, 6 (1 and 2 went).
    let len = MAX_CHECKPOINTS as Pos + 2;
    assert_eq!(r.size_bytes(), (1 + MAX_CHECKPOINTS) * 2 * 4);
    assert_eq!(r.check_rm(0, (2..).into()), Err(KvError::PartialState), "replaced by later ones");
    assert_eq!(r.check_rm(0, (3..).into()), Ok(StateCut::Restore(3)));
    assert_eq!(r.check_rm(0, (3..5).into()), Err(KvError::PartialState), "the tokens after it stay");
    assert_eq!(r.check_cp(0, (0..4).into()), Ok(Some(4)));
    assert_eq!(r.check_cp(0, (1..4).into()), Err(KvError::PartialState), "from its start only");
    r.copy(0, 1, 4);
    assert_eq!(r.check_rm(1, (3..).into()), Ok(StateCut::Restore(3)), "inherited");
    assert_eq!(r.check_rm(1, (5..).into()), Ok(StateCut::Keep), "the copy holds 4 tokens");
    r.cut(0, StateCut::Restore(4));
    assert!(r.rows(&[one], &[4]).is_ok(), "position 4 comes next");
    assert_eq!(r.check_cp(0, (0..len).into()), Ok(Some(4)), "the copy ends where the state does");
    assert_eq!(r.check_rm(0, (5..).into()), Ok(StateCut::Keep), "later checkpoints went");
    // Asked ahead: filled by the pass whose rows reach it, handed to each layer with the row
    // after which it is taken.
    r.checkpoint(0, 6);
    let groups = r.rows(&[one, one, one], &[4, 5, 6]).unwrap();
    let keeps: Vec<_> = r.layer(0, &groups).iter().map(|s| s.keep.as_ref().map(|k| k.after)).collect();
    assert_eq!(keeps, [Some(2)]);
    r.advance(&groups);
    assert_eq!(r.check_rm(0, (6..).into()), Ok(StateCut::Restore(6)));
    let groups = r.rows(&[one], &[7]).unwrap();
    assert!(r.layer(0, &groups)[0].keep.is_none(), "taken once");
    r.checkpoint(0, 5);
    assert_eq!(r.check_rm(0, (5..).into()), Err(KvError::PartialState), "a length it is past: nothing kept");
    let mut positions = Vec::new();
    for pos in [1, 2, 2, 3, 4, 5] {
        super::push_checkpoint(&mut positions, pos, |p| *p);
    }
    assert_eq!(positions, [2, 3, 4, 5], "the scheduler's record follows the same rule");
}
