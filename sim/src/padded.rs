//! A value alone on its cache lines.
//!
//! The flags a poll reads without the world's lock (`Cq::poll`) are small shared
//! allocations; side by side in the heap, the flag one thread spins on and the flag another
//! thread's pushes write would share a line, and every push would take the line from the
//! spinning thread. Padded, each flag owns its line pair (the adjacent-line prefetcher
//! fetches two).

use core::ops::Deref;

/// `T`, aligned (and so padded) to 128 bytes.
#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
