//! Lock-free completion dispatch: many waiters, one shared completion queue, no mutex.
//!
//! Work requests posted through a [`Dispatcher`] carry a [`WrId`] that encodes
//! `(peer, slot, generation)`. A waiter claims a slot ([`Dispatcher::claim`]), posts with the
//! ticket's `wr_id`, and waits on its own slot. Whoever holds the *poll right* (taken with
//! one compare-and-swap, never waited for) drains the completion queue and publishes each
//! completion into its slot with a release store; the waiter reads it after an acquire
//! load. A completion whose generation does not match its slot (a duplicate, or one for a
//! recycled slot) is counted as stale and never delivered.
//!
//! Slot state is one atomic word: `generation << 2 | phase`, phase ∈ {free, waiting, done}.
//! Only the claimer moves free → waiting, only the poll-right holder moves waiting → done,
//! only the ticket owner moves done → free: every transition has exactly one actor.
//!
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom` model-checks it.
//!
//! ```
//! use zverbs::dispatch::{CompletionSource, Dispatcher};
//! use zverbs::WorkCompletion;
//! use std::sync::Mutex;
//!
//! // A stand-in completion queue.
//! struct Fake(Mutex<Vec<WorkCompletion>>);
//! impl CompletionSource for Fake {
//!     type Error = ();
//!     fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
//!         let mut q = self.0.lock().unwrap();
//!         let n = q.len().min(out.len());
//!         out[..n].copy_from_slice(&q[..n]);
//!         q.drain(..n);
//!         Ok(n)
//!     }
//! }
//!
//! let d: Dispatcher<4> = Dispatcher::new();
//! let cq = Fake(Mutex::new(Vec::new()));
//! let t = d.claim(7).unwrap();
//! assert_eq!(t.id().peer(), 7);
//! // ... post with t.wr_id(); the device completes it:
//! cq.0.lock().unwrap().push(WorkCompletion { wr_id: t.wr_id(), ..WorkCompletion::EMPTY });
//! let wc = d.wait(&cq, t).unwrap();
//! assert_eq!(wc.status, zverbs::WcStatus::Success);
//! ```

use core::fmt;

use crate::cq::CompletionQueue;
use crate::provider::Provider;
use crate::sync::{spin, AtomicU64, AtomicUsize, Ordering, UnsafeCell};
use crate::types::WorkCompletion;

const FREE: u64 = 0;
const WAITING: u64 = 1;
const DONE: u64 = 2;
const PHASE: u64 = 3;

/// A `wr_id` that names a peer, a slot and the slot's generation:
/// bits 48..64 peer, 16..48 generation, 0..16 slot.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WrId(pub u64);

impl WrId {
    /// Packs the three fields.
    pub const fn new(peer: u16, slot: u16, generation: u32) -> WrId {
        WrId(((peer as u64) << 48) | ((generation as u64) << 16) | slot as u64)
    }
    /// The peer index.
    pub const fn peer(self) -> u16 {
        (self.0 >> 48) as u16
    }
    /// The slot index.
    pub const fn slot(self) -> u16 {
        self.0 as u16
    }
    /// The slot's generation when the request was posted.
    pub const fn generation(self) -> u32 {
        (self.0 >> 16) as u32
    }
}

impl fmt::Debug for WrId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WrId(peer {}, slot {}, gen {})",
            self.peer(),
            self.slot(),
            self.generation()
        )
    }
}

/// Anything that yields completions: a completion queue, or a fake in tests.
pub trait CompletionSource {
    /// Why polling failed.
    type Error;
    /// Moves up to `out.len()` completions into `out`; returns how many.
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Self::Error>;
}

impl<P: Provider> CompletionSource for CompletionQueue<P> {
    type Error = crate::error::Error<P::Error>;
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Self::Error> {
        CompletionQueue::poll(self, out)
    }
}

/// Every slot is waiting for a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoFreeSlot;

/// The right to one slot's completion. Not `Clone`: exactly one waiter per slot.
#[must_use = "a claimed slot stays busy until its completion is taken"]
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    id: WrId,
}

impl Ticket {
    /// The `wr_id` to post the work request with.
    pub fn wr_id(&self) -> u64 {
        self.id.0
    }
    /// The decoded `wr_id`.
    pub fn id(&self) -> WrId {
        self.id
    }
}

struct Slot {
    state: AtomicU64,
    wc: UnsafeCell<WorkCompletion>,
}

/// `SLOTS` completion slots shared by any number of threads. See the module docs.
pub struct Dispatcher<const SLOTS: usize> {
    slots: [Slot; SLOTS],
    poll_right: AtomicUsize,
    next: AtomicUsize,
    stale: AtomicU64,
}

// SAFETY: a slot's cell is written only by the poll-right holder while the slot is
// `waiting` (no reader can look at it then), and read only by the ticket owner after an
// acquire load saw `done`; the release store of `done` orders the write before the read.
unsafe impl<const SLOTS: usize> Sync for Dispatcher<SLOTS> {}
// SAFETY: the dispatcher owns plain data; moving it moves no borrowed state.
unsafe impl<const SLOTS: usize> Send for Dispatcher<SLOTS> {}

impl<const SLOTS: usize> Default for Dispatcher<SLOTS> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const SLOTS: usize> Dispatcher<SLOTS> {
    const CHECK: () = assert!(SLOTS > 0 && SLOTS <= 1 << 16, "1..=65536 slots");

    /// All slots free.
    pub fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        Dispatcher {
            slots: core::array::from_fn(|_| Slot {
                state: AtomicU64::new(FREE),
                wc: UnsafeCell::new(WorkCompletion::EMPTY),
            }),
            poll_right: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            stale: AtomicU64::new(0),
        }
    }

    /// Claims a free slot for a work request to `peer`.
    pub fn claim(&self, peer: u16) -> Result<Ticket, NoFreeSlot> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for k in 0..SLOTS {
            let i = (start + k) % SLOTS;
            let slot = &self.slots[i];
            let s = slot.state.load(Ordering::Acquire);
            if s & PHASE != FREE {
                continue;
            }
            let generation = ((s >> 2) as u32).wrapping_add(1) & 0x3fff_ffff;
            let waiting = (u64::from(generation) << 2) | WAITING;
            if slot
                .state
                .compare_exchange(s, waiting, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(Ticket {
                    id: WrId::new(peer, i as u16, generation),
                });
            }
        }
        Err(NoFreeSlot)
    }

    /// Takes the completion if it has arrived; gives the ticket back otherwise.
    pub fn try_take(&self, ticket: Ticket) -> Result<WorkCompletion, Ticket> {
        let slot = &self.slots[ticket.id.slot() as usize];
        let generation = u64::from(ticket.id.generation());
        if slot.state.load(Ordering::Acquire) != (generation << 2) | DONE {
            return Err(ticket);
        }
        // SAFETY: `done` with our generation was published with release after the write;
        // the acquire load above orders this read after it, and nobody writes the cell
        // again before we free the slot below.
        let wc = slot.wc.with(|p| unsafe { *p });
        slot.state
            .store((generation << 2) | FREE, Ordering::Release);
        Ok(wc)
    }

    /// If nobody else is polling, drains up to 16 completions from `cq` into their slots.
    /// Returns how many were drained (0 if another thread holds the poll right).
    pub fn poll<C: CompletionSource + ?Sized>(&self, cq: &C) -> Result<usize, C::Error> {
        if self
            .poll_right
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Ok(0);
        }
        let mut wcs = [WorkCompletion::EMPTY; 16];
        let polled = cq.poll(&mut wcs);
        if let Ok(n) = polled {
            for wc in &wcs[..n] {
                self.publish(wc);
            }
        }
        self.poll_right.store(0, Ordering::Release);
        polled
    }

    /// Polls (when it can) until the ticket's completion arrives.
    pub fn wait<C: CompletionSource + ?Sized>(
        &self,
        cq: &C,
        mut ticket: Ticket,
    ) -> Result<WorkCompletion, C::Error> {
        loop {
            match self.try_take(ticket) {
                Ok(wc) => return Ok(wc),
                Err(t) => ticket = t,
            }
            if self.poll(cq)? == 0 {
                spin();
            }
        }
    }

    /// Completions seen whose slot or generation matched no waiting request.
    pub fn stale_completions(&self) -> u64 {
        self.stale.load(Ordering::Relaxed)
    }

    /// Publishes one completion; called only by the poll-right holder.
    fn publish(&self, wc: &WorkCompletion) {
        let id = WrId(wc.wr_id);
        let Some(slot) = self.slots.get(id.slot() as usize) else {
            self.stale.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let generation = u64::from(id.generation());
        if slot.state.load(Ordering::Acquire) != (generation << 2) | WAITING {
            self.stale.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // SAFETY: the slot is `waiting` with this generation, so its owner does not read the
        // cell until we store `done` below, and only the poll-right holder (us) writes it.
        slot.wc.with_mut(|p| unsafe { *p = *wc });
        slot.state
            .store((generation << 2) | DONE, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use core::cell::RefCell;

    struct Fake(RefCell<heapless::Deque<WorkCompletion, 64>>);
    impl CompletionSource for Fake {
        type Error = ();
        fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
            let mut q = self.0.borrow_mut();
            let mut n = 0;
            while n < out.len() {
                let Some(wc) = q.pop_front() else { break };
                out[n] = wc;
                n += 1;
            }
            Ok(n)
        }
    }

    fn wc(id: u64, byte_len: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            byte_len,
            ..WorkCompletion::EMPTY
        }
    }

    #[test]
    fn wr_id_round_trips() {
        let id = WrId::new(0xBEEF, 0x1234, 0x3fff_ffff);
        assert_eq!(
            (id.peer(), id.slot(), id.generation()),
            (0xBEEF, 0x1234, 0x3fff_ffff)
        );
    }

    #[test]
    fn completions_reach_their_own_waiters_in_any_order() {
        let d: Dispatcher<4> = Dispatcher::new();
        let cq = Fake(RefCell::new(heapless::Deque::new()));
        let a = d.claim(1).unwrap();
        let b = d.claim(2).unwrap();
        cq.0.borrow_mut().push_back(wc(b.wr_id(), 22)).unwrap();
        cq.0.borrow_mut().push_back(wc(a.wr_id(), 11)).unwrap();
        let a = d.try_take(a).unwrap_err(); // nothing polled yet
        assert_eq!(d.poll(&cq), Ok(2));
        assert_eq!(d.try_take(a).unwrap().byte_len, 11);
        assert_eq!(d.try_take(b).unwrap().byte_len, 22);
    }

    #[test]
    fn full_dispatcher_refuses_and_recycled_slots_ignore_stale_completions() {
        let d: Dispatcher<2> = Dispatcher::new();
        let cq = Fake(RefCell::new(heapless::Deque::new()));
        let a = d.claim(0).unwrap();
        let b = d.claim(0).unwrap();
        assert_eq!(d.claim(0), Err(NoFreeSlot));
        let old = a.wr_id();
        cq.0.borrow_mut().push_back(wc(old, 1)).unwrap();
        assert_eq!(d.wait(&cq, a).unwrap().byte_len, 1);
        // The slot is reused with a new generation; a duplicate of the old completion must
        // not complete the new request.
        let c = d.claim(0).unwrap();
        assert_eq!(c.id().slot(), WrId(old).slot());
        assert_ne!(c.id().generation(), WrId(old).generation());
        cq.0.borrow_mut().push_back(wc(old, 99)).unwrap();
        d.poll(&cq).unwrap();
        assert_eq!(d.stale_completions(), 1);
        let c = d.try_take(c).unwrap_err();
        cq.0.borrow_mut().push_back(wc(c.wr_id(), 3)).unwrap();
        cq.0.borrow_mut()
            .push_back(wc(u64::from(u16::MAX), 0))
            .unwrap(); // slot out of range
        assert_eq!(d.wait(&cq, c).unwrap().byte_len, 3);
        d.poll(&cq).unwrap();
        assert_eq!(d.stale_completions(), 2);
        drop(b);
    }

    #[test]
    fn threads_share_one_queue() {
        use std::sync::{Arc, Mutex};
        struct Shared(Mutex<Vec<WorkCompletion>>);
        impl CompletionSource for Shared {
            type Error = ();
            fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
                let mut q = self.0.lock().unwrap();
                let n = q.len().min(out.len());
                out[..n].copy_from_slice(&q[..n]);
                q.drain(..n);
                Ok(n)
            }
        }
        let d: Arc<Dispatcher<8>> = Arc::new(Dispatcher::new());
        let cq = Arc::new(Shared(Mutex::new(Vec::new())));
        let handles: Vec<_> = (0..4u16)
            .map(|t| {
                let (d, cq) = (d.clone(), cq.clone());
                std::thread::spawn(move || {
                    for i in 0..2000u32 {
                        let ticket = loop {
                            if let Ok(t) = d.claim(t) {
                                break t;
                            }
                            std::thread::yield_now();
                        };
                        cq.0.lock().unwrap().push(wc(ticket.wr_id(), i));
                        let got = d.wait(&*cq, ticket).unwrap();
                        assert_eq!(got.byte_len, i);
                        assert_eq!(WrId(got.wr_id).peer(), t);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(d.stale_completions(), 0);
    }
}
