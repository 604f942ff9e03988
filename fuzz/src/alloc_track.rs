//! A global allocator that counts, per thread, what a closure allocates: so that a target
//! can assert "allocates nothing" or "never more than `MAX_PAYLOAD`", whatever its input
//! claims. Installed for every binary of this crate (fuzz targets and tests); outside
//! [`measure`] it only forwards to the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// What a closure allocated (reallocations count with their new size).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Number of allocations and reallocations.
    pub count: usize,
    /// Bytes requested, summed.
    pub bytes: usize,
    /// The largest single request.
    pub largest: usize,
}

thread_local! {
    // Const-initialised and without a destructor: using it never allocates.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    static STATS: Cell<AllocStats> = const {
        Cell::new(AllocStats { count: 0, bytes: 0, largest: 0 })
    };
}

fn record(size: usize) {
    // `try_with`: the thread may be shutting down.
    let active = ACTIVE.try_with(Cell::get).unwrap_or(false);
    if active {
        let _ = STATS.try_with(|s| {
            let mut v = s.get();
            v.count += 1;
            v.bytes = v.bytes.saturating_add(size);
            v.largest = v.largest.max(size);
            s.set(v);
        });
    }
}

/// Forwards to [`System`], counting requests made inside [`measure`] on this thread.
pub struct Tracking;

// SAFETY: every call forwards to `System` with the caller's arguments unchanged; the
// counting touches only const-initialised thread-locals and never allocates.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Runs `f` and returns what it allocated on this thread. Not reentrant.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, AllocStats) {
    STATS.with(|s| s.set(AllocStats::default()));
    ACTIVE.with(|a| a.set(true));
    let r = f();
    ACTIVE.with(|a| a.set(false));
    (r, STATS.with(Cell::get))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_inside_measure_only() {
        let (v, s) = measure(|| vec![0u8; 1000]);
        assert_eq!((s.count, s.largest), (1, 1000));
        drop(v);
        let ((), s) = measure(|| ());
        assert_eq!(s, AllocStats::default());
    }
}
