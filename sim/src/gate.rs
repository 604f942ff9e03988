//! The fabric's gate: one thread at a time holds the whole world, or any number of
//! connection lanes run beside each other without it.
//!
//! A real HCA has no lock around the whole fabric: two hosts posting on the two ends of
//! one connection never wait for each other. The simulator keeps one world (`hca/mod.rs`)
//! and gives it two kinds of access:
//!
//! - **exclusive** ([`Gate::lock`]): a mutex, then the gate closed to lanes and every lane
//!   drained. Everything that changes the world's shape (a verb that creates, modifies or
//!   destroys, an event, a packet, a flush, an arming) runs so;
//! - **a lane** ([`Gate::lane`]): one queue pair's send lane, its busy flag taken, with the
//!   world shared (`&T`). A lane changes only what it owns, through [`LaneCell`]s, its CQ
//!   writer locks and its receive queue's lock (`hca/direct.rs` says what a lane owns),
//!   so two lanes never touch the same data, and a lane never changes what another reads.
//!
//! Running lanes are counted in [`SHARDS`] counters, a lane in the one its queue pair's
//! slot picks, each on its own lines: the exclusive side drains a fixed number of
//! counters however many queue pairs there are, and two threads' lanes share a counter
//! (a line, not a wait) only when their slots fall in one shard (the two ends of a
//! connection, created one after the other, do not).
//!
//! The two sides meet in a Dekker pair: a lane counts itself in, then looks at the gate;
//! the exclusive side closes the gate, then looks at every counter. All four accesses
//! are `SeqCst`, so at least one side sees the other's: either the lane sees the gate
//! closed and backs off (to the exclusive side, which it then waits for), or the
//! exclusive side sees the count and waits for the lane to count itself out (Release, so
//! its writes are seen). Under loom, which models `SeqCst` accesses as acquire/release
//! only (tokio-rs/loom#180), the pair is written with `SeqCst` fences instead, which it
//! does model; on x86 the accesses are cheaper (a locked instruction is a barrier
//! already, where a fence would add one more to every post). A lane is never waited for
//! long: it runs one post call and takes no other lock than its CQ writer locks and
//! receive queue lock, which no exclusive holder holds when it lets go. A gate without
//! lanes (a stepped fabric: one thread drives it) skips the pair. `loom_model` below
//! checks it.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering::*;
use std::sync::PoisonError;

use crate::padded::Padded;
use std::sync::atomic::Ordering;

/// The Dekker pair's accesses: `SeqCst`, or under loom acquire/release with a `SeqCst`
/// fence between (see the module docs).
const DEKKER: Ordering = if cfg!(loom) { Acquire } else { SeqCst };
const DEKKER_STORE: Ordering = if cfg!(loom) { Relaxed } else { SeqCst };

/// Between the two halves of each side of the pair, under loom.
#[inline(always)]
fn dekker_fence() {
    if cfg!(loom) {
        fence(SeqCst);
    }
}
use crate::sync::{fence, spin, AtomicBool, AtomicUsize, Mutex, MutexGuard};

/// Running lanes are counted in this many counters (two under loom, which explores every
/// counter's load in every drain).
pub(crate) const SHARDS: usize = if cfg!(loom) { 2 } else { 16 };

/// A lane's busy flag: taken while the lane runs, by one thread at a time.
#[derive(Debug)]
pub(crate) struct LaneFlag(Padded<AtomicBool>);

impl LaneFlag {
    pub(crate) fn new() -> LaneFlag {
        LaneFlag(Padded(AtomicBool::new(false)))
    }
}

/// The world `T` behind the gate.
#[derive(Debug)]
pub(crate) struct Gate<T> {
    lock: Mutex<()>,
    /// Whether lanes may run at all (fixed: a stepped fabric has none).
    lanes: bool,
    /// Closed (true) while an exclusive holder has, or is about to have, the world.
    closed: Padded<AtomicBool>,
    /// Lanes running, by shard.
    running: [Padded<AtomicUsize>; SHARDS],
    world: UnsafeCell<T>,
}

// SAFETY: the world is reached only through the guards: `&mut T` by one exclusive holder,
// with every lane drained; `&T` by lanes, which change only their own cells (`LaneCell`'s
// contract). T: Sync because lanes on several threads share `&T`.
unsafe impl<T: Send + Sync> Sync for Gate<T> {}

/// The world held exclusively.
pub(crate) struct Exclusive<'a, T> {
    gate: &'a Gate<T>,
    _lock: MutexGuard<'a, ()>,
}

/// A lane running: the world shared with the other lanes.
pub(crate) struct Lane<'a, T> {
    gate: &'a Gate<T>,
    flag: &'a LaneFlag,
    running: &'a AtomicUsize,
}

impl<T> Gate<T> {
    /// A gate around `world`; lanes run only if `lanes`.
    pub(crate) fn new(world: T, lanes: bool) -> Gate<T> {
        Gate {
            lock: Mutex::new(()),
            lanes,
            closed: Padded(AtomicBool::new(false)),
            running: core::array::from_fn(|_| Padded(AtomicUsize::new(0))),
            world: UnsafeCell::new(world),
        }
    }

    /// Takes the world exclusively: waits for the mutex, closes the gate, then waits for
    /// every running lane to finish. A panic in another holder does not poison it.
    pub(crate) fn lock(&self) -> Exclusive<'_, T> {
        let lock = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        if self.lanes {
            self.closed.store(true, DEKKER_STORE);
            dekker_fence();
            for running in &self.running {
                let mut turns = 0;
                while running.load(DEKKER) != 0 {
                    spin(&mut turns);
                }
            }
        }
        Exclusive {
            gate: self,
            _lock: lock,
        }
    }

    /// Runs the lane with busy flag `flag` in shard `shard` (any number; its queue pair's
    /// slot), if the gate is open and no other thread runs that lane: `None` then, and the
    /// caller takes the exclusive side instead.
    #[inline]
    pub(crate) fn lane<'a>(&'a self, flag: &'a LaneFlag, shard: usize) -> Option<Lane<'a, T>> {
        if !self.lanes || flag.0.swap(true, Acquire) {
            return None;
        }
        let running = &*self.running[shard % SHARDS];
        running.fetch_add(1, DEKKER);
        dekker_fence();
        if self.closed.load(DEKKER) {
            running.fetch_sub(1, Release);
            flag.0.store(false, Release);
            return None;
        }
        Some(Lane {
            gate: self,
            flag,
            running,
        })
    }
}

impl<T> Deref for Exclusive<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: held exclusively (see `Gate::lock`).
        unsafe { &*self.gate.world.get() }
    }
}

impl<T> DerefMut for Exclusive<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: held exclusively (see `Gate::lock`): no lane runs, the mutex keeps out
        // every other exclusive holder.
        unsafe { &mut *self.gate.world.get() }
    }
}

impl<T> Drop for Exclusive<'_, T> {
    fn drop(&mut self) {
        // Before the mutex (a field, dropped after this): lanes see the world as left.
        if self.gate.lanes {
            self.gate.closed.store(false, Release);
        }
    }
}

impl<T> Deref for Lane<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the gate was open after this lane counted itself in, so no exclusive
        // holder has the world until it counts itself out (see the module docs).
        unsafe { &*self.gate.world.get() }
    }
}

impl<T> Drop for Lane<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.running.fetch_sub(1, Release);
        self.flag.0.store(false, Release);
    }
}

/// State one lane changes while other lanes share the world: a queue pair's requester
/// state (its lane's) or its responder state (its peer's lane's).
///
/// Read and written through `Deref`/`DerefMut` by the exclusive side and by the lane that
/// owns it; [`LaneCell::lane_mut`] gives that lane `&mut` from the shared world.
#[repr(transparent)]
#[derive(Default)]
pub(crate) struct LaneCell<T>(UnsafeCell<T>);

// SAFETY: the cell is accessed by one thread at a time: the exclusive holder, or the
// thread running the lane that owns it (`lane_mut`'s contract; the lane's busy flag keeps
// other threads out of it), never both (the gate).
unsafe impl<T: Send> Sync for LaneCell<T> {}

impl<T> LaneCell<T> {
    pub(crate) fn new(v: T) -> LaneCell<T> {
        LaneCell(UnsafeCell::new(v))
    }

    /// The value, for the lane that owns it.
    ///
    /// # Safety
    /// The caller runs the one lane that owns this cell (entered by [`Gate::lane`]), or
    /// holds the world exclusively; it keeps no other reference to
    /// the cell while the returned one lives. Every other lane leaves the cell alone.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub(crate) unsafe fn lane_mut(&self) -> &mut T {
        // SAFETY: the caller's contract: no other access to the cell now.
        unsafe { &mut *self.0.get() }
    }
}

impl<T> Deref for LaneCell<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: reads come from the exclusive holder or the owning lane, and no
        // `lane_mut` reference is alive then (its contract).
        unsafe { &*self.0.get() }
    }
}

impl<T> DerefMut for LaneCell<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        self.0.get_mut()
    }
}

impl<T: core::fmt::Debug> core::fmt::Debug for LaneCell<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: Clone> Clone for LaneCell<T> {
    fn clone(&self) -> Self {
        LaneCell::new((**self).clone())
    }
}

/// `RUSTFLAGS="--cfg loom" cargo test --release -p zverbs-sim --lib gate::loom_model`
#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    /// Two lanes' data and a word only the exclusive side writes; loom's cells report any
    /// access the gate fails to order.
    struct World {
        own: [UnsafeCell<u32>; 2],
        shape: UnsafeCell<u32>,
    }

    // SAFETY: as `Gate`'s: the cells are accessed as the gate allows (what loom checks).
    unsafe impl Sync for World {}

    /// Two lanes in shards `shards` and an exclusive holder: each lane runs before the
    /// exclusive holder's change, after it, or (finding the gate closed) not at all.
    fn model(shards: [usize; 2]) {
        // Three preemptions (an unbounded run takes minutes): at this bound the model
        // fails without the lane's look at the gate, without the drain, without the
        // fences, and without the lane's count.
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(move || {
            let g = Arc::new(Gate::new(
                World {
                    own: [UnsafeCell::new(0), UnsafeCell::new(0)],
                    shape: UnsafeCell::new(0),
                },
                true,
            ));
            let flags = Arc::new([LaneFlag::new(), LaneFlag::new()]);
            let lanes: Vec<_> = (0..2)
                .map(|i| {
                    let (g, flags) = (g.clone(), flags.clone());
                    thread::spawn(move || {
                        if let Some(lane) = g.lane(&flags[i], shards[i]) {
                            let shape = lane.shape.with(|p| unsafe { *p });
                            lane.own[i].with_mut(|p| unsafe { *p += shape + 1 });
                        }
                    })
                })
                .collect();
            {
                let w = g.lock();
                w.shape.with_mut(|p| unsafe { *p = 7 });
                w.own[0].with(|p| unsafe { *p });
                w.own[1].with(|p| unsafe { *p });
            }
            for t in lanes {
                t.join().unwrap();
            }
            let w = g.lock();
            for i in 0..2 {
                let v = w.own[i].with(|p| unsafe { *p });
                assert!(matches!(v, 0 | 1 | 8), "lane {i} ran at most once: {v}");
            }
        });
    }

    #[test]
    fn lanes_in_two_shards_never_run_beside_the_exclusive_side() {
        model([0, 1]);
    }

    #[test]
    fn lanes_in_one_shard_never_run_beside_the_exclusive_side() {
        model([3, 3 + SHARDS]);
    }
}
