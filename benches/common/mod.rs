//! Shared by the bench binaries: the workspace's counting allocator and small helpers.
//!
//! Every bench binary installs [`CountingAlloc`] as its global allocator. A thread turns
//! counting on for itself around its measured loop ([`count_allocs`]); the count is
//! per thread, so criterion's own bookkeeping on other threads (and this thread outside the
//! loop) is never charged to the code under test. The check adds nothing to the timed
//! loop unless that loop allocates.
#![allow(dead_code)]

pub mod rc_floor;
pub mod spsc;

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

pub use zverbs_testkit::CountingAlloc;

/// Runs `f` with this thread's allocations counted; returns its value and the count.
pub fn count_allocs<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let (r, stats) = zverbs_testkit::measure(f);
    (r, stats.count)
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
