//! Decode steps replayed on a GPU (issue 31): a step of a shape seen before is recorded once as
//! a graph of its launches (`kernels::graph`), and each later step of that shape writes its
//! inputs (token ids, write slots, the cell table, the RoPE table) into the graph's own buffers
//! and replays it. Batch-1 decode on a GPU is bound by the host's cost per launch, which a
//! replay pays once, at the recording.
//!
//! A shape is the step's rows (one to [`MAX_ROWS`], every row's logits wanted: a decode step;
//! up to the few-row products' four where a matrix is in quantized blocks, whose products of
//! more rows dequantize it each step, memory a graph would keep),
//! its cell table's width (rounded up to a power of two from 64, so a sequence's steps share a
//! graph until its cells pass the next one) and its KV cache. Every step runs on the model's own
//! stream (`DeviceStream`), whichever thread runs it, so a graph replays on the stream it was
//! recorded on. A step is recorded only when its warm-up run (the step itself, run plainly just
//! before) made no transfer besides its inputs: a read-back inside a step (a mixture of experts
//! routed on the host, a q8_0 KV cache) or an upload (a mask) cannot be recorded, and its shape
//! is not tried again; one the runtime refused to record is tried again, up to three times. A
//! cache's graphs are dropped when its buffers may have moved ([`KvCache::buffers`]), all of
//! them when a weight is replaced (`Decoder::replace_weight`).
//!
//! A replay writes the buffers the recording was given, so none may have been handed to
//! something else since: CubeCL guards every page a recording touched for the graph's life
//! (nothing new is carved from it, nothing on it moves), whichever op allocated there (our
//! kernels, Burn's matmul past the few-row products' rows), and the recording holds what our
//! kernels allocate besides (`kernels::graph`).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::batch::ValidBatch;
use crate::kernels::CellTable;
use crate::kernels::graph::{self, Captured, Recorder};
use crate::kv::KvCache;
use crate::layers::RopeTables;
use crate::transfers;

/// The most graphs kept (each holds its step's buffers, the logits' [rows, vocab] among them).
const MAX_GRAPHS: usize = 16;

/// The most rows of a recorded step (a graph holds its step's memory: at 64 rows the demo
/// model's logits are 39 MB of it).
pub(super) const MAX_ROWS: usize = 64;

/// The runtime's failures to record a shape before it is run plainly for good.
const TRIES: u8 = 3;

/// The most shapes remembered (their graphs aside).
const MAX_SHAPES: usize = 256;

/// The narrowest cell table a graph is recorded for (its width less the count column).
const MIN_CELLS: usize = 64;

/// The step shapes of one model, and their graphs.
pub(super) struct StepGraphs {
    on: bool,
    /// The most rows of a step recorded.
    max_rows: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The KV caches the graphs read: each one's buffers, as [`KvCache::buffers`] last named
    /// them.
    caches: HashMap<u64, u64>,
    shapes: HashMap<Shape, Entry>,
    /// Graphs recorded so far: the oldest goes first past [`MAX_GRAPHS`].
    recorded: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Shape {
    rows: usize,
    width: usize,
    /// The KV cache's number ([`KvCache::buffers`]).
    cache: u64,
}

enum Entry {
    /// Run plainly: the next step of this shape is recorded. The runtime's failures to record
    /// or replay it so far.
    Seen(u8),
    /// Recorded (the number says when).
    Ready(Box<Step>, u64),
    /// Not recordable: run plainly from now on.
    Refused,
}

/// The device buffers a recorded step reads its inputs from.
pub(super) struct Inputs {
    pub ids: Tensor<1, Int>,
    pub slots: Tensor<1, Int>,
    pub table: Tensor<2, Int>,
    pub rope: Tensor<3>,
}

struct Step {
    captured: Captured,
    inputs: Inputs,
    /// [rows, vocab] logits, written by each replay.
    output: Tensor<2>,
}

/// What [`StepGraphs::begin`] says to do with a step.
pub(super) enum Plan {
    /// Run it plainly.
    Plain,
    /// Its logits, replayed.
    Replayed(Box<Tensor<2>>),
    /// Record it: run it with these inputs, through [`StepGraphs::record`].
    Record(Box<Inputs>, Key),
}

/// A shape being recorded, and its failures so far.
pub(super) struct Key(Shape, u8);

impl StepGraphs {
    /// Graphs of steps of up to `max_rows` rows (at most [`MAX_ROWS`]), where `on`.
    pub fn new(on: bool, max_rows: usize) -> Self {
        Self { on, max_rows: max_rows.min(MAX_ROWS), state: Mutex::new(State::default()) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops every graph (the weights they read were replaced).
    pub fn clear(&mut self) {
        *self.state.get_mut().unwrap_or_else(|e| e.into_inner()) = State::default();
    }

    /// What to do with `batch`, a step whose ids are `ids`, placed as `cells` says, on `device`,
    /// over `cache`; a step of a recorded shape is replayed here.
    pub fn begin(
        &self,
        ids: &[u32],
        batch: &ValidBatch<'_>,
        cells: &CellTable,
        tables: &RopeTables,
        cache: &KvCache,
        device: &Device,
    ) -> Plan {
        let rows = ids.len();
        if !self.on || !(1..=self.max_rows).contains(&rows) || !cells.on_gpu() || batch.out_rows.len() != rows {
            return Plan::Plain;
        }
        let width = 1 + (cells.width() - 1).max(MIN_CELLS).next_power_of_two();
        let (cache_id, generation) = cache.buffers();
        let shape = Shape { rows, width, cache: cache_id };
        let mut state = self.state();
        if state.caches.insert(cache_id, generation).is_some_and(|g| g != generation) {
            state.shapes.retain(|s, _| s.cache != cache_id);
        }
        if state.shapes.len() > MAX_SHAPES {
            // Shapes of caches gone, most likely: the graphs stay, to their limit.
            state.shapes.retain(|_, e| matches!(e, Entry::Ready(..)));
        }
        let values = || Values::of(ids, cells, tables, width);
        match state.shapes.get(&shape) {
            None => {
                state.shapes.insert(shape, Entry::Seen(0));
                Plan::Plain
            }
            Some(Entry::Refused) => Plan::Plain,
            Some(&Entry::Seen(failures)) => {
                let values = values();
                let inputs = Inputs {
                    ids: transfers::upload(TensorData::new(values.ids, [rows]), device),
                    slots: transfers::upload(TensorData::new(values.slots, [rows]), device),
                    table: transfers::upload(TensorData::new(values.table, [rows, width]), device),
                    rope: transfers::upload(TensorData::new(values.rope, [2, rows, tables.half()]), device),
                };
                Plan::Record(Box::new(inputs), Key(shape, failures))
            }
            Some(Entry::Ready(step, _)) => {
                let written = values().write(&step.inputs);
                // SAFETY: the graph's buffers are held by `step`, the weights' and the cache's by
                // the model and the caller (unchanged, or `cache.buffers()` or `clear` would
                // have dropped the graph), and every step runs on the model's stream, the
                // recording's (`Decoder::forward`), its input writes and its outputs' reads too.
                #[allow(unsafe_code)]
                let replayed = match written {
                    true => unsafe { step.captured.replay() },
                    false => Err("its inputs could not be written".into()),
                };
                match replayed {
                    Ok(()) => Plan::Replayed(Box::new(step.output.clone())),
                    Err(why) => {
                        tracing::debug!(
                            rows,
                            width,
                            why,
                            "a decode step's graph did not replay; run plainly from now on"
                        );
                        state.shapes.insert(shape, Entry::Refused);
                        Plan::Plain
                    }
                }
            }
        }
    }

    /// Records the step of `key` (see [`Plan::Record`]): `run` runs it with `inputs` (the trunk
    /// and the output projection), once plainly (the warm-up), once recorded; then the graph
    /// replays. Its logits, from the replay, or from a plain run where recording was refused.
    pub fn record<E>(
        &self,
        key: Key,
        inputs: Box<Inputs>,
        mut run: impl FnMut(&Inputs) -> Result<Tensor<2>, E>,
    ) -> Result<Tensor<2>, E> {
        let Key(shape, failures) = key;
        // The runtime's refusals may pass (an allocation the pool could not serve then): the
        // shape is tried again, up to `TRIES` times. A step that moves data is refused for good.
        let refuse = |state: &mut State, why: &str, again: bool| {
            tracing::debug!(rows = shape.rows, width = shape.width, why, "a decode step's graph was not recorded");
            let entry = match failures + 1 {
                f if again && f < TRIES => Entry::Seen(f),
                _ => Entry::Refused,
            };
            state.shapes.insert(shape, entry);
        };
        let mut recorder = match Recorder::prepare(&inputs.rope) {
            Ok(recorder) => recorder,
            Err(e) => {
                refuse(&mut self.state(), &format!("the runtime records no graph: {e}"), true);
                return run(&inputs);
            }
        };
        let before = transfers::on_this_thread();
        let warm = run(&inputs)?;
        if transfers::on_this_thread() != before {
            recorder.discard();
            refuse(&mut self.state(), "the step moves data to or from the host", false);
            return Ok(warm);
        }
        drop(warm);
        let recorded = match recorder.record() {
            Ok(()) => run(&inputs)?,
            Err(e) => {
                recorder.discard();
                refuse(&mut self.state(), &format!("the recording did not start: {e}"), true);
                return run(&inputs);
            }
        };
        let mut state = self.state();
        let captured = match recorder.finish() {
            Ok(captured) => captured,
            Err(e) => {
                refuse(&mut state, &format!("the runtime did not seal the recording: {e}"), true);
                drop(state);
                return run(&inputs);
            }
        };
        // SAFETY: as in `begin`; the recording's buffers are held by `captured`.
        #[allow(unsafe_code)]
        if let Err(e) = unsafe { captured.replay() } {
            refuse(&mut state, &format!("the first replay failed: {e}"), true);
            drop(state);
            return run(&inputs);
        }
        state.recorded += 1;
        let at = state.recorded;
        if state.shapes.values().filter(|e| matches!(e, Entry::Ready(..))).count() >= MAX_GRAPHS {
            let oldest = state
                .shapes
                .iter()
                .filter_map(|(s, e)| if let Entry::Ready(_, at) = e { Some((*at, *s)) } else { None })
                .min_by_key(|(at, _)| *at);
            if let Some((_, s)) = oldest {
                state.shapes.insert(s, Entry::Seen(0));
            }
        }
        state
            .shapes
            .insert(shape, Entry::Ready(Box::new(Step { captured, inputs: *inputs, output: recorded.clone() }), at));
        Ok(recorded)
    }
}

/// A step's inputs on the host, as the kernels read them.
struct Values {
    ids: Vec<i32>,
    slots: Vec<i32>,
    table: Vec<i32>,
    rope: Vec<f32>,
}

impl Values {
    fn of(ids: &[u32], cells: &CellTable, tables: &RopeTables, width: usize) -> Values {
        Values {
            ids: ids.iter().map(|&t| t as i32).collect(),
            slots: cells.slot_values(),
            table: cells.table_values(width),
            rope: tables.stacked_values(),
        }
    }

    /// Writes these into `inputs`' buffers: false where one does not take them.
    fn write(&self, inputs: &Inputs) -> bool {
        let written = [
            graph::write_ints(&inputs.ids, &self.ids),
            graph::write_ints(&inputs.slots, &self.slots),
            graph::write_ints(&inputs.table, &self.table),
            graph::write_f32(&inputs.rope, &self.rope),
        ];
        for values in [self.ids.len(), self.slots.len(), self.table.len(), self.rope.len()] {
            transfers::wrote(values * 4);
        }
        written.iter().all(|&w| w)
    }
}
