//! Test support shared by the zverbs workspace's tests, benches, examples and fuzz targets:
//! one counting global allocator, so that every claim of "allocates nothing" or "never
//! allocates what a peer claims" is checked the same way.
//!
//! A binary installs it once:
//!
//! ```
//! #[global_allocator]
//! static ALLOC: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;
//!
//! // This thread only: what a closure allocated.
//! let (v, stats) = zverbs_testkit::measure(|| vec![0u8; 100]);
//! assert_eq!((stats.count, stats.largest), (1, 100));
//! # drop(v);
//! ```
//!
//! Two views of the same allocations:
//!
//! - [`measure`]: one thread's allocations inside a closure (tests run in parallel on
//!   other threads, which it does not see);
//! - [`process`]: every thread's, since the last [`process::reset`] (work that runs on
//!   threads of its own: a simulator's clock, an exchange's connections), with the live and
//!   peak heap bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// What was allocated: allocations and reallocations (each with its new size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Allocations and reallocations.
    pub count: u64,
    /// Bytes requested, summed.
    pub bytes: u64,
    /// The largest single request.
    pub largest: usize,
}

impl AllocStats {
    const ZERO: AllocStats = AllocStats {
        count: 0,
        bytes: 0,
        largest: 0,
    };

    fn add(&mut self, size: usize) {
        self.count += 1;
        self.bytes = self.bytes.saturating_add(size as u64);
        self.largest = self.largest.max(size);
    }
}

thread_local! {
    // Const-initialised and without a destructor: touching them never allocates.
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    static THREAD: Cell<AllocStats> = const { Cell::new(AllocStats::ZERO) };
}

static COUNT: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Set while [`process::reset`] zeroes the counters (a reset racing an allocation may
/// lose that allocation; callers reset while quiet).
static RESETTING: AtomicBool = AtomicBool::new(false);

/// Notes a request of `size` bytes that adds `grew` bytes to the heap.
fn record(size: usize, grew: usize) {
    // `try_with`: the thread may be shutting down.
    if MEASURING.try_with(Cell::get).unwrap_or(false) {
        let _ = THREAD.try_with(|s| {
            let mut v = s.get();
            v.add(size);
            s.set(v);
        });
    }
    if !RESETTING.load(Relaxed) {
        COUNT.fetch_add(1, Relaxed);
        BYTES.fetch_add(size as u64, Relaxed);
        LARGEST.fetch_max(size, Relaxed);
    }
    let live = LIVE.fetch_add(grew, Relaxed).wrapping_add(grew);
    PEAK.fetch_max(live, Relaxed);
}

/// Forwards every call to [`System`] unchanged and counts it (see the crate docs).
pub struct CountingAlloc;

// SAFETY: every call forwards to `System` with the caller's arguments unchanged; the
// counting touches only atomics and const-initialised thread-locals, and never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size(), layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size(), layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            record(new_size, new_size - layout.size());
        } else {
            record(new_size, 0);
            LIVE.fetch_sub(layout.size() - new_size, Relaxed);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns what it allocated on this thread. Not reentrant: a nested call
/// ends the outer one's count.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, AllocStats) {
    THREAD.with(|s| s.set(AllocStats::ZERO));
    MEASURING.with(|m| m.set(true));
    let r = f();
    MEASURING.with(|m| m.set(false));
    (r, THREAD.with(Cell::get))
}

/// Every thread's allocations.
pub mod process {
    use super::*;

    /// What every thread allocated since the last [`reset`] (or the start).
    pub fn stats() -> AllocStats {
        AllocStats {
            count: COUNT.load(Relaxed),
            bytes: BYTES.load(Relaxed),
            largest: LARGEST.load(Relaxed),
        }
    }

    /// Zeroes [`stats`] and starts the peak of [`peak_bytes`] again from the live bytes.
    pub fn reset() {
        RESETTING.store(true, Relaxed);
        COUNT.store(0, Relaxed);
        BYTES.store(0, Relaxed);
        LARGEST.store(0, Relaxed);
        PEAK.store(LIVE.load(Relaxed), Relaxed);
        RESETTING.store(false, Relaxed);
    }

    /// Heap bytes allocated and not yet freed.
    pub fn live_bytes() -> usize {
        LIVE.load(Relaxed)
    }

    /// The most heap bytes live at once since the last [`reset`].
    pub fn peak_bytes() -> usize {
        PEAK.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOC: CountingAlloc = CountingAlloc;

    #[test]
    fn counts_inside_measure_only() {
        let (v, s) = measure(|| vec![0u8; 1000]);
        assert_eq!((s.count, s.bytes, s.largest), (1, 1000, 1000));
        drop(v);
        let ((), s) = measure(|| ());
        assert_eq!(s, AllocStats::default());
    }

    #[test]
    fn the_process_sees_other_threads() {
        let before = process::stats();
        // `black_box`: a release build may otherwise elide an allocation it never reads.
        std::thread::spawn(|| drop(std::hint::black_box(vec![0u8; 1 << 20])))
            .join()
            .unwrap();
        let after = process::stats();
        assert!(after.count > before.count);
        assert!(after.largest >= 1 << 20);
        assert!(process::peak_bytes() >= 1 << 20);
    }

    #[test]
    fn a_reallocation_counts_with_its_new_size() {
        let (v, s) = measure(|| {
            let mut v = Vec::<u8>::with_capacity(10);
            v.reserve_exact(4000);
            v
        });
        assert_eq!(s.count, 2);
        assert!(s.largest >= 4000, "{s:?}");
        drop(v);
    }
}
