//! Host↔device transfers of the model's passes on a GPU, counted where they are made: every
//! upload of a pass's inputs (token ids, write slots, cell tables, RoPE tables, row indices, a
//! MoE's routed rows) and every readback of its outputs (picked ids, logits rows, hidden
//! states, a MoE router's scores) goes through [`upload`] and [`read`], which count those whose
//! tensor is not on the CPU, process-wide. `bench --device ...` reports them per decode step
//! beside the kernel launches (`launches`), and a test keeps them to their budget. Loading's
//! uploads are not counted (they are not per step), nor are the small arguments the runtime
//! passes with each launch (they travel with the launch, which `launches` counts).

use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::kind::Basic;
use burn::tensor::{Device, Element, Tensor, TensorData, TensorReadError};

static UPLOADS: AtomicU64 = AtomicU64::new(0);
static UPLOAD_BYTES: AtomicU64 = AtomicU64::new(0);
static READBACKS: AtomicU64 = AtomicU64::new(0);
static READBACK_BYTES: AtomicU64 = AtomicU64::new(0);

/// Transfers counted since the last [`take`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfers {
    pub uploads: u64,
    pub upload_bytes: u64,
    pub readbacks: u64,
    pub readback_bytes: u64,
}

impl Transfers {
    /// These and `other`'s, added.
    pub fn plus(self, other: Transfers) -> Transfers {
        Transfers {
            uploads: self.uploads + other.uploads,
            upload_bytes: self.upload_bytes + other.upload_bytes,
            readbacks: self.readbacks + other.readbacks,
            readback_bytes: self.readback_bytes + other.readback_bytes,
        }
    }
    /// These less `other`'s (down to none): what a measured window moved beyond a part of it
    /// measured apart.
    pub fn minus(self, other: Transfers) -> Transfers {
        Transfers {
            uploads: self.uploads.saturating_sub(other.uploads),
            upload_bytes: self.upload_bytes.saturating_sub(other.upload_bytes),
            readbacks: self.readbacks.saturating_sub(other.readbacks),
            readback_bytes: self.readback_bytes.saturating_sub(other.readback_bytes),
        }
    }
}

/// The transfers counted so far, and resets the counts.
pub fn take() -> Transfers {
    let swap = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
    Transfers {
        uploads: swap(&UPLOADS),
        upload_bytes: swap(&UPLOAD_BYTES),
        readbacks: swap(&READBACKS),
        readback_bytes: swap(&READBACK_BYTES),
    }
}

thread_local! {
    /// Transfers this thread made (uploads and readbacks): a recorded step checks it made none.
    static HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many transfers this thread has made so far.
pub(crate) fn on_this_thread() -> u64 {
    HERE.with(|c| c.get())
}

/// Counts an upload of `bytes` written into a buffer in place (a replayed step's inputs).
pub(crate) fn wrote(bytes: usize) {
    UPLOADS.fetch_add(1, Ordering::Relaxed);
    UPLOAD_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    HERE.with(|c| c.set(c.get() + 1));
}

fn on_gpu(device: &Device) -> bool {
    *device != Device::flex()
}

/// `data` as a tensor on `device`: an upload when that is not the CPU.
pub fn upload<const D: usize, K: Basic>(data: TensorData, device: &Device) -> Tensor<D, K> {
    if on_gpu(device) {
        wrote(data.bytes().len());
    }
    Tensor::from_data(data, device)
}

/// A tensor's values on the host, as `E`: a readback when it is not on the CPU.
pub fn read<const D: usize, K: Basic, E: Element>(tensor: Tensor<D, K>) -> Result<Vec<E>, TensorReadError> {
    let gpu = on_gpu(&tensor.device());
    let values = tensor.try_into_vec_as::<E>()?;
    if gpu {
        READBACKS.fetch_add(1, Ordering::Relaxed);
        HERE.with(|c| c.set(c.get() + 1));
        READBACK_BYTES.fetch_add(std::mem::size_of_val(values.as_slice()) as u64, Ordering::Relaxed);
    }
    Ok(values)
}
