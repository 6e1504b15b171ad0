//! Keeps the rayon pool awake through a forward pass. A pass runs about a hundred parallel loops
//! (the products) with short serial stretches between them (norms, rotary embedding, residual
//! adds); left alone, the pool's other threads fall asleep in every stretch and each loop pays
//! for waking them with a futex call. Here they spin instead, stealing work as soon as a loop
//! offers it, as llama.cpp's threads do between the ops of its graph, and sleep again only when
//! the pass is over.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::Device;
use rayon::Yield;

/// Runs `f`, a forward pass on `device`, with the pool's other threads spinning for its work.
/// Only for the CPU and on a thread of the pool (the engine runs its steps there); elsewhere it
/// just runs `f`: a GPU's pass leaves the pool idle, and spinning threads would take the cores
/// that the launching thread and the GPU runtime's own threads need.
pub fn with_awake_pool<R>(device: &Device, f: impl FnOnce() -> R) -> R {
    let owner = rayon::current_thread_index();
    if owner.is_none() || rayon::current_num_threads() < 2 || *device != Device::flex() {
        return f();
    }
    let stop = AtomicBool::new(false);
    /// Ends the spinning however `f` ends, a panic included (the scope waits for the spinners).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    rayon::in_place_scope(|scope| {
        for _ in 1..rayon::current_num_threads() {
            scope.spawn(|_| {
                // The pass's own thread may pick a spinner up while it waits inside a loop: it
                // must not spin there, or the pass would never end.
                if rayon::current_thread_index() == owner {
                    return;
                }
                while !stop.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        let _stop = Stop(&stop);
        f()
    })
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use rayon::prelude::*;

    use super::*;

    /// Parallel loops inside a pass run on the awake pool, a panic ends the pass (and the
    /// spinning) instead of hanging it, and the pool keeps working afterwards.
    #[test]
    fn passes_run_their_loops_and_a_panic_ends_the_spinning() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for _ in 0..50 {
            let sum = pool.install(|| with_awake_pool(&Device::flex(), || (0..10_000u64).into_par_iter().sum::<u64>()));
            assert_eq!(sum, 49_995_000);
        }
        let result =
            pool.install(|| catch_unwind(AssertUnwindSafe(|| with_awake_pool(&Device::flex(), || panic!("boom")))));
        assert!(result.is_err());
        assert_eq!(pool.install(|| with_awake_pool(&Device::flex(), || 7)), 7);
        assert_eq!(with_awake_pool(&Device::flex(), || 8), 8, "outside the pool it just runs");
    }
}
