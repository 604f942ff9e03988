//! A CQ's buffer: the ring of completions the HCA writes and pollers read.
//!
//! As a real CQ's ring lives in host memory, written by the device and read by the driver
//! without a system call, this one is written by the HCA (the world held exclusively, or a
//! send lane under the writer lock) and read by [`Cq::poll`](crate::Cq::poll) without
//! either: a thread spinning on its CQ touches only this buffer, never what another thread
//! needs to post the work it waits for.
//!
//! One writer at a time: the CQ object in the tables owns the only [`CqWriter`], written
//! through `&mut` by the world's exclusive holder, or through its writer lock
//! ([`CqWriter::lock`]) by connection lanes sharing the world (`gate.rs`), which may
//! write one CQ from two threads. Readers serialise on the buffer's own poll lock.
//! Completions are numbered from the CQ's creation; the invariants:
//!
//! - `head <= tail` and `tail - head <= depth`; completion `i` for `head <= i < tail` lies
//!   in slot `i & (slots.len() - 1)` (the slot count is a power of two, or zero);
//! - `tail` is stored only by the writer, after writing the slot it publishes (Release),
//!   and a reader reads only slots below a `tail` it loaded (Acquire);
//! - `head` is stored only under the poll lock, after the slots below it were read
//!   (Release); the writer reuses a slot only below `head + slots.len()` for a `head` it
//!   loaded (Acquire), so that read happened before its write;
//! - the slot array is replaced (a lazily sized CQ growing) only by the writer with the
//!   poll lock held, so no access to it is concurrent with that.

use std::sync::PoisonError;

use crate::padded::Padded;
use crate::sync::{AtomicBool, AtomicUsize, Mutex, UnsafeCell};
use crate::types::*;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// What an unused slot holds (never read as a completion).
const BLANK: WorkCompletion = WorkCompletion::EMPTY;

/// The reader's side, alone on its lines.
struct ReadEnd {
    head: AtomicUsize,
    poll: Mutex<()>,
}

/// A CQ's ring (see the module docs for its invariants).
pub(crate) struct CqBuf {
    /// Next completion to write; the writer's line.
    tail: Padded<AtomicUsize>,
    read: Padded<ReadEnd>,
    /// Read-mostly: set once, when a completion did not fit or the device died (`dead`
    /// says which): every poll after fails. One flag, so that a poll pays one load for
    /// both.
    overflowed: AtomicBool,
    /// Set (before `overflowed`) when the device died.
    dead: AtomicBool,
    depth: usize,
    slots: UnsafeCell<Box<[UnsafeCell<WorkCompletion>]>>,
}

impl core::fmt::Debug for CqBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CqBuf")
            .field("tail", &self.tail.load(Relaxed))
            .field("head", &self.read.head.load(Relaxed))
            .field("depth", &self.depth)
            .finish_non_exhaustive()
    }
}

// SAFETY: the slots are accessed only as the module's invariants allow: a slot is written
// by the one writer only while no reader may read it, and the slot array is replaced only
// with both locks held (no other access can run then).
unsafe impl Sync for CqBuf {}
// SAFETY: all the fields are owned data; WorkCompletion is plain data.
unsafe impl Send for CqBuf {}

fn slots(n: usize) -> Box<[UnsafeCell<WorkCompletion>]> {
    (0..n).map(|_| UnsafeCell::new(BLANK)).collect()
}

impl CqBuf {
    /// Moves up to `out.len()` completions, oldest first, into `out`; returns how many.
    ///
    /// # Errors
    /// [`SimError::CqOverflow`] once the CQ has overflowed; [`SimError::DeviceFatal`] once
    /// its device died.
    #[inline]
    pub(crate) fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, SimError> {
        if self.overflowed.load(Acquire) {
            return Err(match self.dead.load(Relaxed) {
                true => SimError::DeviceFatal,
                false => SimError::CqOverflow,
            });
        }
        // Empty at the instant of this load pair (`head` can only grow, under the lock):
        // no need to take the lock.
        if self.tail.load(Acquire) == self.read.head.load(Relaxed) || out.is_empty() {
            return Ok(0);
        }
        let _g = self
            .read
            .poll
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let head = self.read.head.load(Relaxed);
        let n = out.len().min(self.tail.load(Acquire) - head);
        self.slots.with(|s| {
            // SAFETY: no `with_mut` of the array runs now (it needs the poll lock).
            let s = unsafe { &*s };
            let mask = s.len().wrapping_sub(1);
            for (k, wc) in out[..n].iter_mut().enumerate() {
                // SAFETY: completion `head + k` is below the loaded tail: written and
                // published, and not rewritten before `head` passes it.
                *wc = s[(head + k) & mask].with(|p| unsafe { *p });
            }
        });
        self.read.head.store(head + n, Release);
        Ok(n)
    }

    /// Whether no completion waits (a snapshot).
    pub(crate) fn is_empty(&self) -> bool {
        self.tail.load(Acquire) == self.read.head.load(Acquire)
    }
}

/// The writing end of a CQ's ring: the HCA's, owned by the CQ object (one writer).
pub(crate) struct CqWriter {
    buf: std::sync::Arc<CqBuf>,
    /// The reader's `head` as last loaded: at most the real one (readers only advance it),
    /// so room counted from it is at most the real room. The writer reloads it only when
    /// that count says full (or, lazily sized, time to grow), so a push does not take the
    /// line each poll writes from the polling thread. The writer's alone (an atomic only
    /// so that the writer may change from one thread to another).
    head_seen: core::sync::atomic::AtomicUsize,
    /// Held by a lane writing here (`CqWriter::lock`).
    write: AtomicBool,
}

/// The writer's side held by a lane: [`CqWriter::lock`].
pub(crate) struct CqWrite<'a>(&'a CqWriter);

impl CqWrite<'_> {
    /// Whether `n` more completions fit (see [`CqWriter::has_room`]).
    #[inline(always)]
    pub(crate) fn has_room(&self, n: usize) -> bool {
        self.0.has_room(n)
    }

    /// Writes `wc` (see [`CqWriter::push`]).
    #[inline]
    pub(crate) fn push(&self, wc: WorkCompletion) -> bool {
        // SAFETY: this guard holds the writer lock.
        unsafe { self.0.push_shared(wc) }
    }
}

impl Drop for CqWrite<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.write.store(false, Release);
    }
}

impl core::fmt::Debug for CqWriter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.buf.fmt(f)
    }
}

impl CqWriter {
    /// A CQ of `depth` completions, its slots allocated now unless `lazy` (then they grow
    /// by doubling as completions arrive, up to the busiest the CQ gets).
    pub(crate) fn new(depth: usize, lazy: bool) -> CqWriter {
        let n = if lazy { 0 } else { depth.next_power_of_two() };
        let buf = std::sync::Arc::new(CqBuf {
            tail: Padded(AtomicUsize::new(0)),
            read: Padded(ReadEnd {
                head: AtomicUsize::new(0),
                poll: Mutex::new(()),
            }),
            overflowed: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            depth,
            slots: UnsafeCell::new(slots(n)),
        });
        CqWriter {
            buf,
            head_seen: core::sync::atomic::AtomicUsize::new(0),
            write: AtomicBool::new(false),
        }
    }

    /// The reading end, for the CQ's handle.
    pub(crate) fn reader(&self) -> std::sync::Arc<CqBuf> {
        self.buf.clone()
    }

    /// Completions written and not yet polled, at most (readers only take them away):
    /// counted from `head_seen` if that shows room for `n` more, else reloaded.
    #[inline(always)]
    fn len_for(&self, n: usize) -> usize {
        let seen = self.buf.tail.load(Relaxed) - self.head_seen.load(Relaxed);
        if seen + n <= self.buf.depth {
            return seen;
        }
        self.len_now()
    }

    /// Completions written and not yet polled, from the head loaded now (kept as seen).
    #[cold]
    #[inline(never)]
    fn len_now(&self) -> usize {
        let head = self.buf.read.head.load(Acquire);
        self.head_seen.store(head, Relaxed);
        self.buf.tail.load(Relaxed) - head
    }

    /// The device died: every later poll fails with [`SimError::DeviceFatal`], and
    /// nothing more is written.
    pub(crate) fn kill(&mut self) {
        self.buf.dead.store(true, Relaxed);
        self.buf.overflowed.store(true, Release);
    }

    /// Whether the CQ takes no more completions: it overflowed, or its device died.
    #[inline]
    pub(crate) fn overflowed(&self) -> bool {
        self.buf.overflowed.load(Relaxed)
    }

    /// Whether `n` more completions fit.
    #[inline(always)]
    pub(crate) fn has_room(&self, n: usize) -> bool {
        !self.overflowed() && (n == 0 || self.len_for(n) + n <= self.buf.depth)
    }

    /// Takes the writer lock, for a lane sharing the world (the exclusive holder writes
    /// through `&mut` instead, and needs none: no lane runs then).
    #[inline]
    pub(crate) fn lock(&self) -> CqWrite<'_> {
        let mut turns = 0;
        while self
            .write
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            crate::sync::spin(&mut turns);
        }
        CqWrite(self)
    }

    /// Writes `wc` after the others; false, writing nothing, when the CQ is full (it has
    /// just overflowed: marked so, every later poll fails).
    #[inline]
    pub(crate) fn push(&mut self, wc: WorkCompletion) -> bool {
        // SAFETY: `&mut`: no other writer.
        unsafe { self.push_shared(wc) }
    }

    /// [`CqWriter::push`] from a shared reference.
    ///
    /// # Safety
    /// The caller is the one writer now: it holds the writer lock, or `&mut` to this.
    #[inline]
    unsafe fn push_shared(&self, wc: WorkCompletion) -> bool {
        let tail = self.buf.tail.load(Relaxed);
        // SAFETY: a read of the array's length; it is replaced only by `grow`, on this
        // (the one writing) end.
        let room = self.buf.slots.with(|s| unsafe { (&*s).len() });
        let mut len = tail - self.head_seen.load(Relaxed);
        if len >= self.buf.depth || len == room {
            // Full or time to grow by the last head seen: look again.
            len = self.len_now();
        }
        if len >= self.buf.depth {
            self.buf.overflowed.store(true, Release);
            return false;
        }
        if len == room {
            // SAFETY: the caller is the one writer.
            unsafe { self.grow() };
        }
        let b = &*self.buf;
        b.slots.with(|s| {
            // SAFETY: no `with_mut` of the array runs now (only `grow`, on this end).
            let s = unsafe { &*s };
            let slot = &s[tail & (s.len() - 1)];
            // SAFETY: `len < s.len()`: readers read only completions from `head` on,
            // which lie in other slots; this one is published by the store below.
            slot.with_mut(|p| unsafe { p.write(wc) });
        });
        b.tail.store(tail + 1, Release);
        true
    }

    /// Doubles the slot array (a lazily sized CQ, full of unpolled completions).
    ///
    /// # Safety
    /// As [`CqWriter::push_shared`].
    #[cold]
    unsafe fn grow(&self) {
        let b = &*self.buf;
        let _g = b.read.poll.lock().unwrap_or_else(PoisonError::into_inner);
        let (head, tail) = (b.read.head.load(Relaxed), b.tail.load(Relaxed));
        b.slots.with_mut(|s| {
            // SAFETY: the one writer, with the poll lock held: no other access to the array or
            // its slots.
            let s = unsafe { &mut *s };
            let n = (s.len() * 2).clamp(1, b.depth.next_power_of_two());
            let bigger = slots(n);
            for i in head..tail {
                // SAFETY: exclusive access (above); completion `i` was written.
                let wc = s[i & (s.len() - 1)].with(|p| unsafe { *p });
                // SAFETY: `bigger` is not shared yet.
                bigger[i & (n - 1)].with_mut(|p| unsafe { p.write(wc) });
            }
            *s = bigger;
        });
    }

    /// Drops every unpolled completion (the device was reset).
    pub(crate) fn clear(&mut self) {
        let b = &*self.buf;
        let _g = b.read.poll.lock().unwrap_or_else(PoisonError::into_inner);
        b.read.head.store(b.tail.load(Relaxed), Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn wc(i: u64) -> WorkCompletion {
        WorkCompletion { wr_id: i, ..BLANK }
    }

    /// The writer counts room from the head it last saw: room the reader made since is
    /// found when the count says full, not missed, and a full ring is still full.
    #[test]
    fn room_made_by_polls_is_seen_when_the_ring_looks_full() {
        let mut w = CqWriter::new(4, false);
        let r = w.reader();
        for i in 0..4 {
            assert!(w.has_room(1) && w.push(wc(i)));
        }
        assert!(!w.has_room(1), "full");
        let mut out = [BLANK; 3];
        assert_eq!(r.poll(&mut out).unwrap(), 3);
        assert!(w.has_room(3) && !w.has_room(4));
        for i in 4..7 {
            assert!(w.push(wc(i)));
        }
        assert!(!w.has_room(1), "full again");
        assert_eq!(r.poll(&mut out).unwrap(), 3);
        assert_eq!(out.map(|c| c.wr_id), [3, 4, 5]);
        assert!(!r.is_empty() && w.has_room(3));
    }

    /// A lazily sized ring grows while it wraps, keeps order, and overflows past `depth`
    /// (the polls that follow fail), whatever the interleaving of pushes and polls.
    #[test]
    fn lazy_ring_keeps_order_across_growth_and_wrap() {
        let mut w = CqWriter::new(5, true);
        let r = w.reader();
        let mut out = [BLANK; 3];
        let (mut next_in, mut next_out) = (0u64, 0u64);
        for round in 0..40u64 {
            for _ in 0..(round % 4) + 1 {
                if w.has_room(1) {
                    assert!(w.push(wc(next_in)));
                    next_in += 1;
                }
            }
            let n = r.poll(&mut out[..(round % 3) as usize + 1]).unwrap();
            for got in &out[..n] {
                assert_eq!(got.wr_id, next_out);
                next_out += 1;
            }
        }
        assert!(next_in > 20 && next_out > 20);
        while !w.has_room(1) {
            r.poll(&mut out).unwrap();
        }
        while w.has_room(1) {
            assert!(w.push(wc(0)));
        }
        assert_eq!(w.len_for(1), 5, "full: counted from a head loaded now");
        assert!(!w.push(wc(0)), "a sixth completion overflows a 5-deep CQ");
        assert_eq!(r.poll(&mut out), Err(SimError::CqOverflow));
    }

    #[test]
    fn clear_drops_unpolled_completions() {
        let mut w = CqWriter::new(4, false);
        let r = w.reader();
        assert!(w.push(wc(1)) && w.push(wc(2)));
        w.clear();
        assert!(r.is_empty());
        assert!(w.push(wc(3)));
        let mut out = [BLANK; 4];
        assert_eq!(r.poll(&mut out), Ok(1));
        assert_eq!(out[0].wr_id, 3);
    }
}

/// `RUSTFLAGS="--cfg loom" cargo test --release -p zverbs-sim --lib cq_buf::loom_model`
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;

    fn wc(i: u64) -> WorkCompletion {
        WorkCompletion { wr_id: i, ..BLANK }
    }

    /// The writer pushes `n` completions (waiting for room, so slots are reused) while
    /// a reader polls: the reader gets each once, in order, whatever the interleaving.
    fn writer_and_reader(depth: usize, lazy: bool, n: u64) {
        ::loom::model(move || {
            let mut w = CqWriter::new(depth, lazy);
            let r = w.reader();
            let t = ::loom::thread::spawn(move || {
                for i in 0..n {
                    while !w.has_room(1) {
                        ::loom::thread::yield_now();
                    }
                    assert!(w.push(wc(i)));
                }
            });
            let (mut next, mut out) = (0, [BLANK; 2]);
            while next < n {
                let got = r.poll(&mut out).unwrap();
                for c in &out[..got] {
                    assert_eq!(c.wr_id, next);
                    next += 1;
                }
                if got == 0 {
                    ::loom::thread::yield_now();
                }
            }
            t.join().unwrap();
        });
    }

    /// Growth (1 -> 2 -> 4 slots) racing the reader.
    #[test]
    fn lazy_growth_races_polls() {
        writer_and_reader(4, true, 3);
    }

    /// Slot reuse: three completions through two slots.
    #[test]
    fn slots_are_reused_only_after_polled() {
        writer_and_reader(2, false, 3);
    }

    /// Two lanes write one (lazily sized) CQ under its writer lock, each checking room
    /// and pushing under one hold, while a reader polls: each completion arrives once,
    /// each writer's in its order, and no room counted is gone by the push.
    #[test]
    fn two_writers_take_turns_under_the_writer_lock() {
        ::loom::model(|| {
            let w = std::sync::Arc::new(CqWriter::new(2, true));
            let r = w.reader();
            let writers: Vec<_> = (0..2u64)
                .map(|k| {
                    let w = w.clone();
                    ::loom::thread::spawn(move || {
                        let g = w.lock();
                        if g.has_room(1) {
                            assert!(g.push(wc(k)), "room counted under the lock");
                        }
                    })
                })
                .collect();
            let mut seen = [0u32; 2];
            let mut out = [BLANK; 2];
            for _ in 0..2 {
                let got = r.poll(&mut out).unwrap();
                for c in &out[..got] {
                    seen[c.wr_id as usize] += 1;
                }
            }
            for t in writers {
                t.join().unwrap();
            }
            let got = r.poll(&mut out).unwrap();
            for c in &out[..got] {
                seen[c.wr_id as usize] += 1;
            }
            assert_eq!(seen, [1, 1]);
        });
    }
}
