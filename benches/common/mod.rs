//! Shared by the bench binaries: a per-thread counting allocator and small helpers.
//!
//! Every bench binary installs [`CountingAlloc`] as its global allocator. A thread turns
//! counting on for itself around its measured loop ([`count_allocs`]); the count is
//! per thread, so criterion's own bookkeeping on other threads (and this thread outside the
//! loop) is never charged to the code under test. The check adds nothing to the timed
//! loop unless that loop allocates.
#![allow(dead_code)]

pub mod rc_floor;
pub mod spsc;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use criterion::Criterion;

/// The suite's settings: short warm-up and measurement, so `cargo bench --features sim`
/// finishes in a few minutes. Command-line flags (`--warm-up-time`, `--measurement-time`,
/// `--sample-size`, `--quick`) override them; pass them with `--bench NAME` or
/// `--bench '*'` (`cargo bench --features sim --bench '*' -- --quick`), since the
/// library's own libtest bench target does not accept them.
pub fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

/// Counts allocations (and reallocations) of the threads that turned counting on.
pub struct CountingAlloc;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator may run while this thread's locals are being torn down.
    if ON.try_with(Cell::get).unwrap_or(false) {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: forwards every call to `System` unchanged; it only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` with this thread's allocations counted; returns its value and the count.
pub fn count_allocs<R>(f: impl FnOnce() -> R) -> (R, u64) {
    COUNT.with(|c| c.set(0));
    ON.with(|o| o.set(true));
    let r = f();
    ON.with(|o| o.set(false));
    (r, COUNT.with(Cell::get))
}

/// Runs `f(iters)` with allocations counted; panics if it allocated; returns its time.
pub fn timed_no_alloc(what: &str, iters: u64, f: impl FnOnce(u64)) -> Duration {
    let (elapsed, allocs) = count_allocs(|| {
        let t0 = std::time::Instant::now();
        f(iters);
        t0.elapsed()
    });
    assert_no_allocs(what, allocs);
    elapsed
}

/// Panics unless `allocs` is zero: the data path must not allocate after setup.
#[track_caller]
pub fn assert_no_allocs(what: &str, allocs: u64) {
    assert_eq!(
        allocs, 0,
        "{what}: {allocs} heap allocation(s) in the measured loop (the data path must not allocate after setup)"
    );
}
