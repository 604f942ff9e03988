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
//! - **a lane** ([`Gate::lane`]): one queue pair's send lane, a flag of its own raised,
//!   with the world shared (`&T`). A lane changes only what it owns, through
//!   [`LaneCell`]s, its CQ writer locks and its receive queue's lock (`hca/direct.rs` says
//!   what a lane owns), so two lanes never touch the same data, and a lane never changes
//!   what another reads.
//!
//! The two sides meet in a Dekker pair: a lane raises its flag, then looks at the gate;
//! the exclusive side closes the gate, then looks at every lane's flag. All four accesses
//! are `SeqCst`, so at least one side sees the other's store: either the lane sees the
//! gate closed and backs off (to the exclusive side, which it then waits for), or the
//! exclusive side sees the flag and waits for the lane to lower it (Release, so its writes
//! are seen). Under loom, which models `SeqCst` accesses as acquire/release only
//! (tokio-rs/loom#180), the pair is written with `SeqCst` fences instead, which it does
//! model; on x86 the accesses are cheaper (the flag's exchange is a barrier already,
//! where a fence would add an `mfence` to every post). A lane is never waited for long: it runs one post call and takes no other
//! lock than its CQ writer locks and receive queue lock, which no exclusive holder holds
//! when it lets go. `loom_model` below checks the pair.

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
use crate::sync::{fence, spin, AtomicBool, Mutex, MutexGuard};

/// What the exclusive side must drain: every lane that can run.
pub(crate) trait Lanes {
    /// Each lane's flag, in any order.
    fn lane_flags(&self) -> impl Iterator<Item = &LaneFlag>;
}

/// A lane's flag: raised while the lane runs, by one thread at a time.
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
    /// Closed (true) while an exclusive holder has, or is about to have, the world.
    closed: Padded<AtomicBool>,
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
}

impl<T: Lanes> Gate<T> {
    pub(crate) fn new(world: T) -> Gate<T> {
        Gate {
            lock: Mutex::new(()),
            closed: Padded(AtomicBool::new(false)),
            world: UnsafeCell::new(world),
        }
    }

    /// Takes the world exclusively: waits for the mutex, closes the gate, then waits for
    /// every running lane to finish. A panic in another holder does not poison it.
    pub(crate) fn lock(&self) -> Exclusive<'_, T> {
        let lock = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.closed.store(true, DEKKER_STORE);
        dekker_fence();
        // SAFETY: shared access, as the lanes have: the lane list changes only under the
        // exclusive side, which this thread is (the mutex), and lanes do not change it.
        let world = unsafe { &*self.world.get() };
        for flag in world.lane_flags() {
            let mut turns = 0;
            while flag.0.load(DEKKER) {
                spin(&mut turns);
            }
        }
        Exclusive {
            gate: self,
            _lock: lock,
        }
    }

    /// Runs lane `flag`, if the gate is open and no other thread runs it: `None` then,
    /// and the caller takes the exclusive side instead.
    #[inline]
    pub(crate) fn lane<'a>(&'a self, flag: &'a LaneFlag) -> Option<Lane<'a, T>> {
        if flag.0.swap(true, DEKKER) {
            return None;
        }
        dekker_fence();
        if self.closed.load(DEKKER) {
            flag.0.store(false, Release);
            return None;
        }
        Some(Lane { gate: self, flag })
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
        self.gate.closed.store(false, Release);
    }
}

impl<T> Deref for Lane<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the gate was open after this lane's flag was raised, so no exclusive
        // holder has the world until the flag is lowered (see the module docs).
        unsafe { &*self.gate.world.get() }
    }
}

impl<T> Drop for Lane<'_, T> {
    #[inline]
    fn drop(&mut self) {
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
// thread running the lane that owns it (`lane_mut`'s contract), never both (the gate).
unsafe impl<T: Send> Sync for LaneCell<T> {}

impl<T> LaneCell<T> {
    pub(crate) fn new(v: T) -> LaneCell<T> {
        LaneCell(UnsafeCell::new(v))
    }

    /// The value, for the lane that owns it.
    ///
    /// # Safety
    /// The caller runs the one lane that owns this cell (its flag raised by
    /// [`Gate::lane`]), or holds the world exclusively; it keeps no other reference to
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

    /// Two lanes' data and a shared word only the exclusive side writes; loom's cells
    /// report any access the gate fails to order.
    struct World {
        flags: [LaneFlag; 2],
        own: [UnsafeCell<u32>; 2],
        shape: UnsafeCell<u32>,
    }

    impl Lanes for World {
        fn lane_flags(&self) -> impl Iterator<Item = &LaneFlag> {
            self.flags.iter()
        }
    }

    // SAFETY: as `Gate`'s: the cells are accessed as the gate allows (what loom checks).
    unsafe impl Sync for World {}

    fn run_lane(g: &Gate<World>, i: usize) -> bool {
        let Some(lane) = g.lane(g_flag(g, i)) else {
            return false;
        };
        let shape = lane.shape.with(|p| unsafe { *p });
        lane.own[i].with_mut(|p| unsafe { *p += shape + 1 });
        true
    }

    fn g_flag(g: &Gate<World>, i: usize) -> &LaneFlag {
        // SAFETY: the flags never change; reading them needs no access to the world.
        unsafe { &(*g.world.get()).flags[i] }
    }

    #[test]
    fn lanes_run_beside_each_other_and_never_beside_the_exclusive_side() {
        loom::model(|| {
            let g = Arc::new(Gate::new(World {
                flags: [LaneFlag::new(), LaneFlag::new()],
                own: [UnsafeCell::new(0), UnsafeCell::new(0)],
                shape: UnsafeCell::new(0),
            }));
            let lanes: Vec<_> = (0..2)
                .map(|i| {
                    let g = g.clone();
                    thread::spawn(move || {
                        // A lane that finds the gate closed goes to the exclusive side.
                        if !run_lane(&g, i) {
                            let w = g.lock();
                            w.own[i].with_mut(|p| unsafe { *p += 1 });
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
                assert!(v == 1 || v == 8, "lane {i} ran once: {v}");
            }
        });
    }
}
