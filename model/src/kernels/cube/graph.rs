//! CubeCL's graph capture, for replaying a decode step (issue 31): a step's launches recorded
//! once and re-run from prebuilt state, so the host's cost per launch (pipeline lookup, binding,
//! the launch's uniforms; about 25 µs each through wgpu on an H100) is paid at capture, not on
//! every step. The step's inputs live in persistent buffers written in place between replays
//! ([`write_ints`], [`write_f32`]).
//!
//! A replay re-runs the recorded kernels on the raw buffers they were captured with, so no
//! buffer the step was given may be handed to anything else while the graph lives. CubeCL sees
//! to the memory of its pools: a sealed graph guards every page its recording touched, and
//! nothing new is carved from a guarded page nor anything on it moved (`PageGuard`), whichever
//! op allocated there (Burn's matmul in a step of many rows among them); `tests/replay.rs`
//! checks it end to end with tensors made between replays. Besides, while a [`Recorder`] runs,
//! every tensor the kernels here allocate (`empty_as`), and every tensor the caller passes to
//! [`hold`] (the embedding's gather), is held by the graph, as `Graph::replay`'s liveness
//! contract words it.

use std::cell::RefCell;

use burn::backend::Cube;
use burn::cubecl::bytes::Bytes;
use burn::cubecl::client::Graph;
use burn::tensor::kind::Basic;
use burn::tensor::{BackendPrimitive, DType, Tensor};

use super::CubeTensor;

/// A tensor kind (float or int) whose CubeCL primitive is a [`CubeTensor`].
pub trait OnCube: Basic + BackendPrimitive<Cube, Primitive = CubeTensor> {}
impl<K: Basic + BackendPrimitive<Cube, Primitive = CubeTensor>> OnCube for K {}

thread_local! {
    /// The tensors a recording on this thread allocated, while one runs.
    static HELD: RefCell<Option<Vec<CubeTensor>>> = const { RefCell::new(None) };
}

/// Holds `t` for the recording under way on this thread, if any.
pub(super) fn hold_primitive(t: &CubeTensor) {
    HELD.with(|held| {
        if let Some(held) = held.borrow_mut().as_mut() {
            held.push(t.clone());
        }
    });
}

/// Holds `t` (a result of Burn's ops inside a recorded step) for the recording under way on
/// this thread, if any; nothing otherwise.
pub fn hold<const D: usize, K: OnCube>(t: &Tensor<D, K>) {
    let recording = HELD.with(|held| held.borrow().is_some());
    if recording && let Ok(p) = t.clone().try_into_primitive::<Cube>() {
        hold_primitive(&p);
    }
}

fn take_held() -> Vec<CubeTensor> {
    HELD.with(|held| held.borrow_mut().take()).unwrap_or_default()
}

/// A capture in the making on one device, from [`Recorder::prepare`]: the caller runs the step
/// once (the warm-up, which executes), calls [`Recorder::record`], runs it again (recorded, not
/// executed), then [`Recorder::finish`]. Dropped before that, it ends the capture and discards
/// it, so the device's stream is never left capturing.
pub struct Recorder {
    client: burn::cubecl::client::Client,
    /// Prepared or recording, not ended yet.
    open: bool,
}

impl Recorder {
    /// Starts a capture on the device `like` lives on (on the current stream), or says why
    /// not: off CubeCL, or the runtime refused (a backend without graphs, a capture under way).
    pub fn prepare<const D: usize, K: OnCube>(like: &Tensor<D, K>) -> Result<Recorder, String> {
        let client = like.clone().try_into_primitive::<Cube>().map_err(|_| "not a CubeCL tensor".to_string())?.client;
        client.graph_prepare().map_err(|e| format!("{e:?}"))?;
        HELD.with(|held| *held.borrow_mut() = Some(Vec::new()));
        Ok(Recorder { client, open: true })
    }

    /// Opens the recording window after the warm-up: the warm-up's tensors go back to the pool
    /// (the recording takes them again, in the same order), and launches are recorded from here.
    pub fn record(&mut self) -> Result<(), String> {
        // The warm-up's tensors go back to the pool once the window is open: before it, the
        // runtime may release the pages they alone held (a dequantized matrix's own), which
        // the recording, allowed no new page, would then lack.
        let warm = take_held();
        HELD.with(|held| *held.borrow_mut() = Some(Vec::new()));
        let started = self.client.start_capture().map_err(|e| format!("{e:?}"));
        drop(warm);
        started
    }

    /// The recorded graph, with every tensor the recording allocated; or the runtime's reason
    /// for not sealing it (an upload, a readback or an allocation the pool could not serve
    /// inside the window).
    pub fn finish(mut self) -> Result<Captured, String> {
        let held = take_held();
        let graph = self.client.stop_capture();
        self.open = false;
        Ok(Captured { graph: graph.map_err(|e| format!("{e:?}"))?, _held: held })
    }

    /// Ends the capture and discards it (as dropping it does).
    pub fn discard(self) {}
}

impl Drop for Recorder {
    fn drop(&mut self) {
        drop(take_held());
        if self.open {
            // Ends the capture, prepared or recording, and discards it.
            let _ = self.client.stop_capture();
        }
    }
}

/// A recorded step and the buffers it allocated.
pub struct Captured {
    graph: Graph,
    _held: Vec<CubeTensor>,
}

impl Captured {
    /// Re-runs the recorded launches, after their inputs were written ([`write_ints`],
    /// [`write_f32`]).
    ///
    /// # Safety
    /// Every buffer the recording read (the weights, the KV cache, the inputs) is still
    /// allocated and unchanged in place, and this runs on the stream it was recorded on (the current one).
    #[allow(unsafe_code)]
    pub unsafe fn replay(&self) -> Result<(), String> {
        // SAFETY: the caller's guarantees; the recording's own allocations are held here.
        unsafe { self.graph.replay() }.map_err(|e| format!("{e:?}"))
    }
}

/// Writes `values` into `t`'s buffer in place: false where `t` is not a contiguous CubeCL f32
/// tensor of that many values.
pub fn write_f32<const D: usize, K: OnCube>(t: &Tensor<D, K>, values: &[f32]) -> bool {
    write(t, values.len(), |dtype| match dtype {
        DType::F32 => Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        _ => None,
    })
}

/// Writes `values` into `t`'s buffer in place, as its integer type stores them (i32 or i64):
/// false where `t` is not a contiguous CubeCL tensor of that many integers.
pub fn write_ints<const D: usize, K: OnCube>(t: &Tensor<D, K>, values: &[i32]) -> bool {
    write(t, values.len(), |dtype| match dtype {
        DType::I32 => Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I64 => Some(values.iter().flat_map(|&v| i64::from(v).to_le_bytes()).collect()),
        _ => None,
    })
}

/// Writes the bytes `encode` makes for `t`'s dtype (`None`: not one it takes) into `t`'s
/// buffer, where `t` is a contiguous CubeCL tensor of `len` values.
fn write<const D: usize, K: OnCube>(
    t: &Tensor<D, K>,
    len: usize,
    encode: impl FnOnce(DType) -> Option<Vec<u8>>,
) -> bool {
    let Ok(p) = t.clone().try_into_primitive::<Cube>() else {
        return false;
    };
    if p.meta.is_tiled() || p.meta.num_elements() != len || !p.is_contiguous() {
        return false;
    }
    let Some(bytes) = encode(p.dtype) else {
        return false;
    };
    p.client.write(&p.handle, Bytes::from_bytes_vec(bytes));
    true
}
