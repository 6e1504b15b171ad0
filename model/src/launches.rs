//! Kernel launches on the GPU backends, counted by the runtime itself (CubeCL's launch observer,
//! called on the issuing thread for every kernel, process-wide): what `bench --device ...`
//! reports per decode step, so the launch budget of a pass is measured, not estimated. With
//! `timed`, each launch is also timed on the device and read back before the next one runs
//! (kernels then run one at a time: right for each kernel's own cost, wrong for tok/s).
//! Builds without a GPU backend have nothing to watch: [`watch`] is `None` there.

use std::collections::HashMap;
use std::time::Duration;

/// Launches by kernel, as counted while a [`Watch`] lived.
#[derive(Debug, Clone, Default)]
pub struct Launches {
    /// Kernel name (shortened as CubeCL's profiler does) → launches and device time (zero
    /// unless timed).
    pub by_kernel: HashMap<String, (u64, Duration)>,
}

impl Launches {
    pub fn total(&self) -> u64 {
        self.by_kernel.values().map(|(n, _)| n).sum()
    }
    pub fn time(&self) -> Duration {
        self.by_kernel.values().map(|(_, t)| *t).sum()
    }
    /// Kernels by device time, then by launches, most first.
    pub fn ranked(&self) -> Vec<(&str, u64, Duration)> {
        let mut rows: Vec<_> = self.by_kernel.iter().map(|(k, &(n, t))| (k.as_str(), n, t)).collect();
        rows.sort_by(|a, b| b.2.cmp(&a.2).then(b.1.cmp(&a.1)).then(a.0.cmp(b.0)));
        rows
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod observed {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use burn::cubecl::config::{TypeNameFormatLevel, type_name_format};
    use burn::cubecl::logging::{self, LaunchObservation, LaunchObserver, TimingMethod, TimingRequest};

    use super::Launches;

    #[derive(Default)]
    struct Counter {
        timed: bool,
        by_kernel: Mutex<HashMap<&'static str, (u64, Duration)>>,
    }

    impl LaunchObserver for Counter {
        fn launched(&self, kernel: &'static str) {
            self.by_kernel.lock().unwrap_or_else(|e| e.into_inner()).entry(kernel).or_default().0 += 1;
        }
        fn timing(&self) -> TimingRequest {
            if self.timed { TimingRequest::Resolved } else { TimingRequest::None }
        }
        fn timed(&self, kernel: &'static str, duration: logging::Duration, _method: TimingMethod) {
            let secs = Duration::from_secs_f64(duration.as_secs_f64());
            self.by_kernel.lock().unwrap_or_else(|e| e.into_inner()).entry(kernel).or_default().1 += secs;
        }
    }

    /// Counts launches until dropped (one watch at a time: a second replaces the first while
    /// it lives).
    pub struct Watch {
        counter: Arc<Counter>,
        _observation: LaunchObservation,
    }

    impl Watch {
        /// What was launched so far, and resets the counts.
        pub fn take(&self) -> Launches {
            let counts = std::mem::take(&mut *self.counter.by_kernel.lock().unwrap_or_else(|e| e.into_inner()));
            let mut by_kernel: HashMap<String, (u64, Duration)> = HashMap::new();
            for (kernel, (n, t)) in counts {
                let e = by_kernel.entry(type_name_format(kernel, TypeNameFormatLevel::Short)).or_default();
                e.0 += n;
                e.1 += t;
            }
            Launches { by_kernel }
        }
    }

    pub fn watch(timed: bool) -> Option<Watch> {
        let counter = Arc::new(Counter { timed, ..Counter::default() });
        let _observation = LaunchObservation::new(counter.clone());
        Some(Watch { counter, _observation })
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use observed::{Watch, watch};

/// Nothing to watch in a build without a GPU backend ([`watch`] never makes one).
#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
pub struct Watch(());

#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
impl Watch {
    pub fn take(&self) -> Launches {
        Launches::default()
    }
}

/// A watch over every kernel launch of the process (`None` in a build without a GPU backend).
#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
pub fn watch(_timed: bool) -> Option<Watch> {
    None
}
