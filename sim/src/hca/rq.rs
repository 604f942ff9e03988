//! Where a queue pair's receive queue lives, and the receive post that does not take the
//! fabric's lock.
//!
//! In threaded mode a receive queue is shared by the world (whose responder consumes it)
//! and the queue pair's handle (which posts to it), under a lock of its own. A post then
//! takes only that lock while the queue is **open** for it: the queue pair in a state that
//! accepts receives without completing them at once (INIT to SQE, not dead), no trace to
//! write, and no requester that an earlier request found this queue empty for (it may
//! sleep on its RNR NAK until a receive is posted, and only the world can wake it). The
//! world opens and closes the queue under the same lock as it changes those, so a post
//! either sees the change or comes before it. Everything else a post checks (entry count,
//! room) is the queue's own, so an open post gives exactly the outcome the world's would,
//! and a closed one goes to the world with nothing done.
//!
//! Why: on the untimed fabric the world's lock is held for a whole request's execution,
//! and a thread re-posting its receive under it would wait behind the peer's send (in the
//! two-thread ping-pong, `examples/sim_rtt.rs threads`, most round trips would meet the
//! lock held). The consumer's side is the world held exclusively, or the send lane of
//! the queue pair connected to this one (`direct.rs`); either takes this lock too.
//!
//! In stepped mode (one thread drives the world; a world of 65,536 nodes has four million
//! queue pairs) the queue stays in the queue pair: no allocation and no lock of its own.

use std::sync::Arc;

use super::wq::{RecvQueue, RecvRef};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::counters::QpCounters;
use crate::padded::Padded;
use crate::sync::{Mutex, MutexGuard};
use crate::types::*;

/// A queue pair's receive queue: in the queue pair, shared with its handle, or a shared
/// receive queue (`srq.rs`) it takes its receives from.
#[derive(Debug)]
pub(crate) enum RqHome {
    /// Stepped mode: under the world's lock only. Boxed: in a queue pair on a shared
    /// receive queue (as a large world's are), the 48 bytes of an inline queue would be
    /// idle.
    Local(Box<RecvQueue>),
    /// Threaded mode: shared with the handle, under its own lock. Or, in either mode, a
    /// shared receive queue (`srq.rs`; [`SharedRq::srq`] says which), whose receives any
    /// queue pair attached to it consumes, under the queue's lock (a request takes one
    /// whole when it executes, so none is ever in progress in a queue pair: a move to ERR
    /// or RESET leaves the queue alone). Posts go to the SRQ, never to the queue pair.
    Shared(Arc<SharedRq>),
}

/// A receive queue shared by the world and a handle.
#[derive(Debug)]
pub(crate) struct SharedRq {
    state: Mutex<RqState>,
    /// True while the world has events scheduled (`Events::pending_flag`): a post then
    /// goes through the world, which runs those that are due first (one may move the
    /// queue pair to ERR, say).
    events: Arc<Padded<AtomicBool>>,
    /// A shared receive queue's slot in the tables and its PD (`None`: a queue pair's
    /// own queue, open while the queue pair accepts receives).
    pub(crate) srq: Option<(u32, u32)>,
}

/// What the lock of a [`SharedRq`] guards.
#[derive(Debug)]
pub(crate) struct RqState {
    q: RecvQueue,
    /// The queue pair accepts receives without completing them at once (and is not dead).
    accepting: bool,
    /// A request found the queue empty: the next post goes through the world, which wakes
    /// a requester asleep on its RNR NAK.
    found_empty: bool,
    /// The world records a trace (every post is an event in it).
    traced: bool,
    /// Receive doorbells and requests posted without the world, added to the queue pair's
    /// counters when they are read.
    doorbells: u64,
    posted: u64,
}

impl RqHome {
    /// An empty queue of `capacity` receives of at most `stride` entries, allocated now
    /// unless `lazy`, in the queue pair.
    pub(crate) fn new(capacity: usize, stride: usize, lazy: bool) -> RqHome {
        RqHome::Local(Box::new(RecvQueue::new(capacity, stride, lazy)))
    }

    /// Shares the queue (a new queue pair's, in RESET) with its handle; the handle's
    /// share. `events` is the world's flag of scheduled events; with `traced`, every post
    /// goes through the world.
    pub(crate) fn share(&mut self, events: Arc<Padded<AtomicBool>>, traced: bool) -> Arc<SharedRq> {
        let q = match self {
            RqHome::Local(q) => core::mem::replace(&mut **q, RecvQueue::new(1, 1, true)),
            RqHome::Shared(s) => return s.clone(),
        };
        let shared = Arc::new(SharedRq::new(q, None, events, traced));
        *self = RqHome::Shared(shared.clone());
        shared
    }

    /// The shared receive queue this queue pair takes its receives from: its slot and PD.
    #[inline]
    pub(crate) fn srq(&self) -> Option<(usize, usize)> {
        match self {
            RqHome::Shared(s) => s.srq.map(|(srq, pd)| (srq as usize, pd as usize)),
            RqHome::Local(_) => None,
        }
    }

    /// Takes the oldest receive of the queue pair's own queue, to flush it (`None` on a
    /// shared receive queue, whose receives are not the queue pair's).
    pub(crate) fn pop_own(&mut self) -> Option<u64> {
        match self.srq() {
            Some(_) => None,
            None => self.with(|q| q.pop_front()),
        }
    }

    /// The queue, locked if shared, for reading (the responder's look at its head).
    #[inline]
    pub(crate) fn read(&self) -> RqRead<'_> {
        match self {
            RqHome::Local(q) => RqRead::Local(q),
            RqHome::Shared(s) => RqRead::Shared(s.lock()),
        }
    }

    /// `f` on the queue, locked if shared.
    #[inline]
    pub(crate) fn with<R>(&mut self, f: impl FnOnce(&mut RecvQueue) -> R) -> R {
        match self {
            RqHome::Local(q) => f(q),
            RqHome::Shared(s) => f(&mut s.lock().q),
        }
    }

    /// Whether the queue is the queue pair's own, shared with its handle (threaded mode):
    /// the direct path's condition (which serves no shared receive queue).
    #[inline]
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, RqHome::Shared(s) if s.srq.is_none())
    }

    /// The queue pair's state changed: whether it now accepts receives without completing
    /// them at once (`Local`: nothing to do).
    pub(crate) fn set_accepting(&mut self, accepting: bool) {
        if let Some(s) = self.own_shared() {
            s.lock().accepting = accepting;
        }
    }

    /// Empties the queue and closes it (a reset or a crash), under one hold of its lock:
    /// a post cannot slip in between and outlive the reset (it is refused, or comes first
    /// and is discarded with the rest).
    pub(crate) fn clear_closed(&mut self) {
        match self {
            RqHome::Local(q) => q.clear(),
            RqHome::Shared(s) if s.srq.is_some() => {}
            RqHome::Shared(s) => {
                let mut s = s.lock();
                s.q.clear();
                s.accepting = false;
            }
        }
    }

    /// A receive was posted through the world, which woke any requester asleep on this
    /// queue's RNR NAK: posts may skip the world again.
    pub(crate) fn woke_requester(&mut self) {
        if let Some(s) = self.own_shared() {
            s.lock().found_empty = false;
        }
    }

    /// The queue pair's own queue shared with its handle (not a shared receive queue,
    /// whose posts and wake-ups are the SRQ's).
    fn own_shared(&self) -> Option<&SharedRq> {
        match self {
            RqHome::Shared(s) if s.srq.is_none() => Some(s),
            _ => None,
        }
    }

    /// `c` with the receive posts made without the world added.
    pub(crate) fn counted(&self, mut c: QpCounters) -> QpCounters {
        if let Some(s) = self.own_shared() {
            let s = s.lock();
            c.recv_doorbells += s.doorbells;
            c.recvs_posted += s.posted;
        }
        c
    }
}

impl SharedRq {
    /// `q` under a lock of its own: a queue pair's (closed until its state opens it), or
    /// the shared receive queue in slot `srq.0` with PD `srq.1` (open).
    pub(crate) fn new(
        q: RecvQueue,
        srq: Option<(u32, u32)>,
        events: Arc<Padded<AtomicBool>>,
        traced: bool,
    ) -> SharedRq {
        SharedRq {
            state: Mutex::new(RqState {
                q,
                accepting: srq.is_some(),
                found_empty: false,
                traced,
                doorbells: 0,
                posted: 0,
            }),
            events,
            srq,
        }
    }

    /// How many receives it holds.
    pub(crate) fn len(&self) -> usize {
        self.lock().q.len()
    }

    /// `f` on the queue, locked.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut RecvQueue) -> R) -> R {
        f(&mut self.lock().q)
    }

    /// A receive was posted through the world, which woke the requesters asleep on this
    /// queue's RNR NAKs: posts may skip the world again.
    pub(crate) fn woke_requesters(&self) {
        self.lock().found_empty = false;
    }

    /// Closes the queue to posts without the world (its device died).
    pub(crate) fn close(&self) {
        self.lock().accepting = false;
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, RqState> {
        // A panic under this lock (a bug) leaves the queue as it was.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts the requests `wrs` (see `Qp::post_recv`) without the world's lock, if the
    /// queue is open: `Some` with the outcome the world would give (the index of the first
    /// refused, and why), or `None`, having posted nothing, when the call must go through
    /// the world.
    pub(crate) fn post<const SGES: usize>(
        &self,
        wrs: &[RecvWr<SGES>],
    ) -> Option<Result<(), (usize, SimError)>> {
        if self.events.load(Ordering::Acquire) {
            return None;
        }
        let mut g = self.lock();
        let s = &mut *g;
        if !s.accepting || s.found_empty || s.traced {
            return None;
        }
        let mut res = Ok(());
        let mut posted = 0;
        for (i, wr) in wrs.iter().enumerate() {
            // The checks of `QpObj::post_recv` that an open queue can fail.
            if let Err(e) = s.q.admits(wr) {
                res = Err((i, e));
                break;
            }
            s.q.push_back(wr);
            posted += 1;
        }
        if posted > 0 {
            s.doorbells += 1;
            s.posted += posted;
        }
        Some(res)
    }
}

/// A receive queue held for reading.
pub(crate) enum RqRead<'a> {
    Local(&'a RecvQueue),
    Shared(MutexGuard<'a, RqState>),
}

impl core::ops::Deref for RqRead<'_> {
    type Target = RecvQueue;
    #[inline]
    fn deref(&self) -> &RecvQueue {
        match self {
            RqRead::Local(q) => q,
            RqRead::Shared(s) => &s.q,
        }
    }
}

impl RqRead<'_> {
    /// Retires the oldest receive of a shared queue held so (a lane sending to this queue
    /// pair holds no `&mut` to it); a local queue is never reached so (only the exclusive
    /// side, through [`RqHome::with`], consumes it).
    #[inline]
    pub(crate) fn pop_shared(&mut self) {
        if let RqRead::Shared(s) = self {
            s.q.pop_front();
        }
    }

    /// The oldest receive, for a request that consumes one; if there is none, the next
    /// post goes through the world (to wake the requester, which waits for it on an RNR
    /// NAK).
    #[inline]
    pub(crate) fn front_for_request(&mut self) -> Option<RecvRef<'_>> {
        match self {
            RqRead::Local(q) => q.front(),
            RqRead::Shared(s) => {
                if s.q.len() == 0 {
                    s.found_empty = true;
                    return None;
                }
                s.q.front()
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    use super::*;
    use loom::thread;

    /// A shared queue of four one-entry receives, open for posts: the world's end and
    /// the handle's.
    fn open_queue() -> (RqHome, Arc<SharedRq>) {
        let mut home = RqHome::new(4, 1, false);
        let shared = home.share(Arc::new(Padded(AtomicBool::new(false))), false);
        home.set_accepting(true);
        (home, shared)
    }

    fn recv(wr_id: u64) -> [RecvWr<1>; 1] {
        [RecvWr::new(wr_id)]
    }

    /// A handle posts while the world consumes one receive and then moves the queue pair
    /// to ERR (closing the queue, flushing what is left): every receive the handle posted
    /// is consumed or flushed, and a post after the close goes to the world.
    #[test]
    fn posts_race_consumption_and_close() {
        loom::model(|| {
            let (mut home, shared) = open_queue();
            let poster = thread::spawn(move || {
                let mut taken = 0;
                for id in 0..2 {
                    match shared.post(&recv(id)) {
                        Some(Ok(())) => taken += 1,
                        Some(Err((_, e))) => panic!("refused: {e:?}"),
                        None => {}
                    }
                }
                taken
            });
            let consumed = home.with(|q| q.pop_front()).is_some() as u64;
            // The world's move to ERR: closed, then flushed, under the queue's lock.
            home.set_accepting(false);
            let flushed = home.with(|q| {
                let mut n = 0;
                while q.pop_front().is_some() {
                    n += 1;
                }
                n
            });
            let taken = poster.join().unwrap();
            assert_eq!(consumed + flushed, taken, "a posted receive was lost");
            assert!(
                home.read().front().is_none(),
                "a receive outlived the close"
            );
            let c = home.counted(QpCounters::default());
            assert_eq!(c.recvs_posted, taken);
        });
    }

    /// A post racing a reset (or a crash) is refused or discarded with the rest: no
    /// receive is left in the queue of a queue pair in RESET.
    #[test]
    fn a_post_does_not_outlive_a_reset() {
        loom::model(|| {
            let (mut home, shared) = open_queue();
            let poster = thread::spawn(move || shared.post(&recv(7)).is_some());
            home.clear_closed();
            poster.join().unwrap();
            assert!(
                home.read().front().is_none(),
                "a receive outlived the reset"
            );
        });
    }
}
