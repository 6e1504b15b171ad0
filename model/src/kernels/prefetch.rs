//! Software prefetch for the weight streams of decode steps. A decode step streams every weight
//! once, one row (or panel) after another; the hardware prefetchers do not run far enough ahead
//! to keep the memory busy, and asking for the bytes a few KiB ahead raised the quantized
//! products from 24.6 to 33 GB/s.
//!
//! `unsafe` (C8: the reason): `_mm_prefetch` is an SSE intrinsic, and Rust asks for an `unsafe`
//! block to call it outside a function that lists SSE in `#[target_feature]`, though SSE is part
//! of every x86-64 CPU. A prefetch only hints at the cache: it never faults and reads nothing
//! into the program, whatever the address.
#![allow(unsafe_code)]

use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};

/// How far ahead of the bytes being read a stream is fetched.
pub const AHEAD: usize = 4096;

/// Asks for the `len` bytes at `p` to be brought into the cache, a cache line at a time.
/// `p` may point anywhere (past the end of the data too): it is never dereferenced.
#[inline(always)]
pub fn prefetch(p: *const u8, len: usize) {
    for line in (0..len).step_by(64) {
        // SAFETY: see the module's note; `wrapping_add` keeps the pointer arithmetic defined.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line).cast()) };
    }
}
