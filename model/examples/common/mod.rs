//! What the benchmark examples share.

use std::time::Instant;

/// Seconds per call of `f`: one warm-up call, then as many as fit in half a second.
pub fn time(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut runs = 0;
    while start.elapsed().as_secs_f64() < 0.5 {
        f();
        runs += 1;
    }
    start.elapsed().as_secs_f64() / runs as f64
}
