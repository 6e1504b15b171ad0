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
    /// Adds `other`'s launches and times to these.
    pub fn add(&mut self, other: Launches) {
        for (kernel, (n, t)) in other.by_kernel {
            let e = self.by_kernel.entry(kernel).or_default();
            e.0 += n;
            e.1 += t;
        }
    }
    /// Takes `other`'s launches and times from these (down to none), dropping the kernels left
    /// with no launch: what a measured window launched beyond a part of it measured apart.
    pub fn subtract(&mut self, other: &Launches) {
        for (kernel, (n, t)) in &other.by_kernel {
            if let Some(e) = self.by_kernel.get_mut(kernel) {
                e.0 = e.0.saturating_sub(*n);
                e.1 = e.1.saturating_sub(*t);
            }
        }
        self.by_kernel.retain(|_, (n, _)| *n > 0);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn launches(rows: &[(&str, u64)]) -> Launches {
        Launches { by_kernel: rows.iter().map(|&(k, n)| (k.to_string(), (n, Duration::from_micros(n)))).collect() }
    }

    /// A window's launches less a part of it measured apart (bench's decode steps without their
    /// prompt's prefill): each kernel's count and time taken down to none, the kernels the part
    /// alone launched dropped; runs added kernel by kernel.
    #[test]
    fn windows_add_and_subtract_by_kernel() {
        let mut total = launches(&[("Xwt", 10), ("Matmul", 3)]);
        total.add(launches(&[("Xwt", 5), ("Rope", 2)]));
        assert_eq!(total.total(), 20);
        total.subtract(&launches(&[("Matmul", 3), ("Rope", 1), ("Dequantize", 4)]));
        let mut rows = total.ranked();
        rows.sort();
        assert_eq!(rows, [("Rope", 1, Duration::from_micros(1)), ("Xwt", 15, Duration::from_micros(15))]);
    }
}
