//! The least a software RC SEND can cost between two threads: one end's receive queue,
//! completion queue and receive buffers, with nothing else: no checks, no keys, no
//! sequence numbers, no lock. The sender executes its send in its own thread, as the
//! simulator's untimed fabric does (there is no NIC thread): it takes the peer's oldest
//! posted receive, copies the message into its buffer and writes the peer's completion.
//!
//! What that moves between the two cores per message is what any such design must move:
//! the receive entry (written by its owner at post, read by the sender), the buffer
//! (last touched by its owner, written by the sender), the completion (written by the
//! sender, read by the owner), and the message again when the owner reads it. The
//! `pingpong_64B/spsc_ring` bench moves one slot per message; the ratio of this bench to
//! it is the floor of `pingpong_64B/sim_channel`'s ratio that no simulator work can go
//! under while it keeps receive queues and completion queues.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Entries per queue (the ping-pong has one or two in flight).
const CAP: usize = 4;

/// A value alone on its cache lines.
#[repr(align(128))]
struct Line<T>(T);

/// A posted receive: its sequence number (valid once stored, release) and buffer.
struct RecvEntry {
    seq: AtomicUsize,
    buf: UnsafeCell<usize>,
}

/// A completion: its sequence number (valid once stored, release) and byte count.
struct Cqe {
    seq: AtomicUsize,
    len: UnsafeCell<usize>,
}

/// One end: the receive queue its owner posts to and the peer's sends consume, the
/// completion queue the peer's sends write and its owner polls, and the receive buffers.
pub struct End<const M: usize> {
    rq: [Line<RecvEntry>; CAP],
    cq: [Line<Cqe>; CAP],
    bufs: [Line<UnsafeCell<[u8; M]>>; CAP],
}

// SAFETY: an entry's `buf` is written by the owner before the release store of its `seq`
// and read by the sender after the acquire load that sees it; a buffer is written by the
// sender between taking its entry and the release store of the completion's `seq`, and
// read by the owner after the acquire load that sees that, before it posts the entry
// again (the ping-pong keeps fewer than `CAP` of each in flight); a completion's `len`
// likewise. Each side keeps its own counters (`Owner`, `Sender`), so each field has one
// writer at a time.
unsafe impl<const M: usize> Sync for End<M> {}

/// The owner's counters of one end: receives posted, completions taken.
#[derive(Default)]
pub struct Owner {
    posted: usize,
    polled: usize,
}

/// A sender's counter of the receives of the peer's end it consumed.
#[derive(Default)]
pub struct Sender {
    taken: usize,
}

impl<const M: usize> End<M> {
    pub fn new() -> End<M> {
        End {
            rq: std::array::from_fn(|_| {
                Line(RecvEntry {
                    seq: AtomicUsize::new(0),
                    buf: UnsafeCell::new(0),
                })
            }),
            cq: std::array::from_fn(|_| {
                Line(Cqe {
                    seq: AtomicUsize::new(0),
                    len: UnsafeCell::new(0),
                })
            }),
            bufs: std::array::from_fn(|_| Line(UnsafeCell::new([0; M]))),
        }
    }

    /// Owner: posts a receive into the next buffer.
    pub fn post_recv(&self, o: &mut Owner) {
        let i = o.posted % CAP;
        let e = &self.rq[i].0;
        // SAFETY: entry `i` is not posted (its last receive completed, or never was).
        unsafe { *e.buf.get() = i };
        o.posted += 1;
        e.seq.store(o.posted, Ordering::Release);
    }

    /// Sender: executes a SEND of `msg` into this end: takes the oldest posted receive,
    /// fills its buffer, writes the completion.
    pub fn send(&self, s: &mut Sender, msg: &[u8; M]) {
        let i = s.taken % CAP;
        let e = &self.rq[i].0;
        s.taken += 1;
        // Posted ahead by the ping-pong; a real responder would NAK if not.
        while e.seq.load(Ordering::Acquire) != s.taken {
            std::hint::spin_loop();
        }
        // SAFETY: the entry is posted (acquire above): its buffer is the sender's until
        // the completion is stored.
        let buf = unsafe { *e.buf.get() };
        unsafe { *self.bufs[buf].0.get() = *msg };
        let c = &self.cq[i].0;
        unsafe { *c.len.get() = M };
        c.seq.store(s.taken, Ordering::Release);
    }

    /// Owner: waits for the next completion; the message, copied out.
    pub fn wait(&self, o: &mut Owner, out: &mut [u8; M]) {
        let i = o.polled % CAP;
        let c = &self.cq[i].0;
        o.polled += 1;
        while c.seq.load(Ordering::Acquire) != o.polled {
            std::hint::spin_loop();
        }
        // SAFETY: completed (acquire above): the buffer is the owner's until reposted.
        let len = unsafe { *c.len.get() };
        debug_assert_eq!(len, M);
        *out = unsafe { *self.bufs[i].0.get() };
    }
}
