//! A global allocator that counts, per thread, the allocations of threads that ask it to
//! (other tests run in parallel on other threads). A test file installs it:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: common::counting::Counting = common::counting::Counting;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    /// `Some(n)`: this thread counts, `n` so far.
    static COUNT: Cell<Option<usize>> = const { Cell::new(None) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get().map(|n| n + 1)));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
}

/// Runs `f` with this thread's allocations counted: its value and how many there were.
pub fn count_allocs<R>(f: impl FnOnce() -> R) -> (R, usize) {
    COUNT.with(|c| c.set(Some(0)));
    let r = f();
    let n = COUNT.with(|c| c.take()).unwrap_or(0);
    (r, n)
}
