//! The `sync` shim: atomics and cells from `core`, or from `loom` under `cfg(loom)` so the
//! lock-free code can be model-checked (as tokio and bytes do).
// Without std only the atomics serve (the dispatcher, which needs std, uses the rest).
#![cfg_attr(not(feature = "std"), allow(dead_code, unused_imports))]

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

// The sleep of threads on a shared queue (`dispatch::sleep`): its flags, locks and parking.
#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicBool;
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread::{current, Thread};
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use std::sync::atomic::AtomicBool;
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use std::sync::{Mutex, MutexGuard};
#[cfg(all(feature = "std", not(loom)))]
pub(crate) use std::thread::{current, Thread};

/// `core::cell::UnsafeCell` with loom's closure API, so both builds share one call shape.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(v: T) -> Self {
        UnsafeCell(core::cell::UnsafeCell::new(v))
    }

    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// A pause inside a spin loop (a yield point for loom).
#[inline]
pub(crate) fn spin() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
