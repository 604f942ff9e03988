//! A bounded single-producer single-consumer ring of `M`-byte messages: the bare
//! in-process floor a two-thread ping-pong can reach (two cache-line handoffs per trip).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

const CAP: usize = 8;

#[repr(align(128))]
struct Padded(AtomicUsize);

/// The ring: one producer thread calls `push`, one consumer thread calls `pop`.
pub struct Ring<const M: usize> {
    head: Padded, // next slot to read; written by the consumer
    tail: Padded, // next slot to write; written by the producer
    slots: [UnsafeCell<[u8; M]>; CAP],
}

// SAFETY: a slot is written only by the producer while it is outside `head..tail`, and
// read only by the consumer while it is inside; the release store of `tail` (resp.
// `head`) orders the write (resp. read) before the other side's acquire load sees it.
unsafe impl<const M: usize> Sync for Ring<M> {}

impl<const M: usize> Ring<M> {
    pub fn new() -> Ring<M> {
        Ring {
            head: Padded(AtomicUsize::new(0)),
            tail: Padded(AtomicUsize::new(0)),
            slots: std::array::from_fn(|_| UnsafeCell::new([0; M])),
        }
    }

    /// Producer only.
    pub fn push(&self, msg: &[u8; M]) {
        let t = self.tail.0.load(Ordering::Relaxed);
        let mut spins = 0u32;
        while t - self.head.0.load(Ordering::Acquire) == CAP {
            backoff(&mut spins);
        }
        // SAFETY: slot `t % CAP` is outside `head..tail`: the consumer does not read it.
        unsafe { *self.slots[t % CAP].get() = *msg };
        self.tail.0.store(t + 1, Ordering::Release);
    }

    /// Consumer only.
    pub fn pop(&self, out: &mut [u8; M]) {
        let h = self.head.0.load(Ordering::Relaxed);
        let mut spins = 0u32;
        while self.tail.0.load(Ordering::Acquire) == h {
            backoff(&mut spins);
        }
        // SAFETY: slot `h % CAP` is inside `head..tail`: the producer does not write it.
        *out = unsafe { *self.slots[h % CAP].get() };
        self.head.0.store(h + 1, Ordering::Release);
    }
}

/// Spins, then yields (the same shape as the library's waits), so a descheduled peer
/// on this shared 2-core machine does not cost a whole time slice of spinning.
#[inline]
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 1 << 10 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}
