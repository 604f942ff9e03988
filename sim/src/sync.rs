//! The synchronisation primitives of the lock-free parts, loom's under `--cfg loom` so
//! that loom explores them (the CQ buffer, `hca/cq_buf.rs`; the shared receive queue,
//! `hca/rq.rs`).

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// `core::cell::UnsafeCell` with loom's access API: every access goes through `with` or
/// `with_mut`, so that loom can check that no write races another access.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(v: T) -> Self {
        UnsafeCell(core::cell::UnsafeCell::new(v))
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// One turn of a wait for another thread that holds something briefly (a lane, a CQ
/// writer lock): a spin hint, and every 64 turns the processor given up, in case the
/// holder is not running.
#[cfg(not(loom))]
#[inline]
pub(crate) fn spin(turns: &mut u32) {
    *turns = turns.wrapping_add(1);
    if *turns % 64 == 0 {
        std::thread::yield_now();
    } else {
        core::hint::spin_loop();
    }
}

/// Loom's: every turn yields, so that the model moves the holder on.
#[cfg(loom)]
pub(crate) fn spin(_turns: &mut u32) {
    loom::thread::yield_now();
}
