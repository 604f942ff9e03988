//! Lock-free completion dispatch: many channels, one shared completion queue, no mutex.
//!
//! The queue pairs of a [`MultiChannel`](crate::MultiChannel) or a [`Node`](crate::node::Node)
//! share one send and one receive completion queue ([`SharedCompletionQueue`]). Each
//! channel attaches an [`Inbox`] to the queue's [`Dispatcher`] and posts its work requests
//! with a `wr_id` that names the inbox ([`WrId`]: inbox, attachment generation, sequence).
//! Whoever holds the *poll right* (taken with one compare-and-swap, or with none by a thread
//! it is biased to, see `right.rs`; never waited for on the data path) drains the queue
//! and routes each completion to its inbox; a channel takes only from its own inbox. So a
//! completion for peer 7 found while peer 3's channel polls is recorded for peer 7, never
//! lost or misattributed, and threads driving different peers' channels never take a lock.
//!
//! An inbox is a single-producer single-consumer ring: the producer is whoever holds the
//! poll right (one thread at a time; the right's release at the end of a turn and the
//! acquire at the start of the next order successive holders), the consumer the channel
//! that owns the [`Inbox`] token (`&mut`, not `Clone`). A
//! completion whose inbox is not attached, or attached again since (its generation
//! differs), is counted as stale and dropped: a queue pair destroyed with completions still
//! in the shared queue cannot reach the channel that reuses its inbox.
//!
//! Shared receive queues: a receive posted on one names a buffer
//! ([`WrId::shared_recv`](crate::wr_id::WrId::shared_recv)), not a channel, and is consumed
//! by whichever queue pair's message comes first. A dispatcher made
//! [`with_qp_routes`](Dispatcher::with_qp_routes) routes such a completion by its `qp_num`
//! to the inbox that queue pair is bound to ([`Dispatcher::bind_qp`]); the `wr_id` still
//! names the buffer. The table is read and written only with the poll right held, so it
//! needs no lock either (`by_qp.rs`).
//!
//! Sleeping: channels with [`WaitPolicy::SpinSleep`](crate::WaitPolicy) on one shared
//! queue sleep by a leader/follower scheme (one sleeps on the completion channel, the
//! others park until a completion is routed to them); see `sleep.rs` for why no wake-up
//! is lost. Async channels sleep by the same scheme, as tasks, with the queue's reactor
//! leading for good (`zverbs::tokio::AsyncQueue`, feature `tokio`).
//!
//! Capacity: a channel never has more requests in flight than its ring holds, and its
//! inbox holds at least that many (checked at attach), so an inbox cannot overflow; the
//! completion queue itself is sized for every inbox at once
//! ([`SharedCompletionQueue::create`]).
//!
//! `RUSTFLAGS="--cfg loom" cargo test --release --features sim --test loom` model-checks
//! the dispatcher alone and as channels over the simulator use it.
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
//! let d = Dispatcher::new(2, 8);
//! let (mut a, mut b) = (d.attach(8).unwrap(), d.attach(8).unwrap());
//! let cq = Fake(Mutex::new(Vec::new()));
//! // The device completes b's request first, then a's.
//! cq.0.lock().unwrap().push(WorkCompletion { wr_id: b.wr_id(0), ..WorkCompletion::EMPTY });
//! cq.0.lock().unwrap().push(WorkCompletion { wr_id: a.wr_id(0), byte_len: 5, ..WorkCompletion::EMPTY });
//! assert_eq!(d.poll(&cq), Ok(2)); // whoever polls routes both
//! let mut out = [WorkCompletion::EMPTY; 4];
//! assert_eq!(d.take(&mut a, &mut out), 1);
//! assert_eq!(out[0].byte_len, 5);
//! assert_eq!(d.take(&mut b, &mut out), 1);
//! ```

mod by_qp;
mod mailbox;
mod right;
#[cfg(feature = "std")]
mod shared;
mod sleep;

#[cfg(feature = "std")]
pub use shared::SharedCompletionQueue;

use core::fmt;

use crate::cq::CompletionQueue;
use crate::provider::Provider;
use crate::sync::{AtomicU64, Ordering};
use crate::types::WorkCompletion;
use crate::wr_id::{WrId, SEQ_BITS, SEQ_MASK, SHARED_RECV_INBOX};

/// Anything that yields completions: a completion queue, or a fake in tests.
pub trait CompletionSource {
    /// Why polling failed.
    type Error;
    /// Moves up to `out.len()` completions into `out`; returns how many.
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Self::Error>;
    /// Moves at most one completion into `out`; whether there was one.
    #[inline]
    fn poll_one(&self, out: &mut WorkCompletion) -> Result<bool, Self::Error> {
        Ok(self.poll(core::slice::from_mut(out))? == 1)
    }
}

impl<P: Provider> CompletionSource for CompletionQueue<P> {
    type Error = crate::error::Error<P::Error>;
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Self::Error> {
        CompletionQueue::poll(self, out)
    }
    #[inline(always)]
    fn poll_one(&self, out: &mut WorkCompletion) -> Result<bool, Self::Error> {
        self.poll_into(out)
    }
}

/// Why [`Dispatcher::attach`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachError {
    /// Every inbox is attached.
    NoFreeInbox,
    /// The channel may have more requests in flight than an inbox holds.
    TooDeep {
        /// The depth asked for.
        depth: usize,
        /// What an inbox holds.
        capacity: usize,
    },
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::NoFreeInbox => f.write_str("every inbox of the shared queue is in use"),
            AttachError::TooDeep { depth, capacity } => write!(
                f,
                "a ring of {depth} requests does not fit an inbox of {capacity} completions"
            ),
        }
    }
}

/// What an [`Inbox`] bound to no queue pair holds for one: all 24 bits of a queue pair
/// number set, which names no queue pair a channel has (`0xFFFFFF` is InfiniBand's
/// multicast QP).
const NO_QP: u32 = 0xFF_FFFF;

/// Why [`Dispatcher::bind_qp`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindQpError {
    /// The dispatcher was made without [`with_qp_routes`](Dispatcher::with_qp_routes).
    NoQpRoutes,
    /// Not the number of a queue pair a channel can have: more than 24 bits, or
    /// `0xFFFFFF`.
    NotAQpNumber(u32),
}

impl fmt::Display for BindQpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindQpError::NoQpRoutes => {
                f.write_str("the dispatcher routes no completions by queue pair")
            }
            BindQpError::NotAQpNumber(n) => write!(f, "{n:#x} is no queue pair number"),
        }
    }
}

/// One channel's right to its inbox: the `wr_id`s it posts with and the completions routed
/// to it. Not `Clone`: exactly one consumer per inbox. Give it back with
/// [`Dispatcher::detach`].
#[must_use = "an attached inbox stays in use until it is detached"]
#[derive(Debug, PartialEq, Eq)]
pub struct Inbox {
    /// Every `wr_id` of the inbox shifted down by [`SEQ_BITS`]: the attachment generation
    /// above the index ([`WrId`]). One word, so a completion is told to be the inbox's by
    /// one shift and one compare.
    key: u32,
    /// The queue pair on a shared receive queue whose receive completions come here
    /// ([`Dispatcher::bind_qp`]), or [`NO_QP`]: 24 bits, little-endian. Three bytes, not
    /// an `Option<u32>`: the token stays 8 bytes, as every channel on a shared queue holds
    /// one per direction.
    qp_num: [u8; 3],
    /// Attached while a reactor task led the queue (`zverbs::tokio::AsyncQueue`): the
    /// reactor runs until the inbox is detached. Its spare values also tell a channel's
    /// completion source, an inbox or a queue of its own, with one byte compare.
    joined: bool,
}

impl Inbox {
    /// The `wr_id` to post the request with sequence number `seq` with.
    #[inline]
    pub fn wr_id(&self, seq: u64) -> u64 {
        self.tag() | (seq & SEQ_MASK)
    }
    /// The high bits every `wr_id` of this inbox carries: `wr_id(seq) == tag() | (seq &
    /// SEQ_MASK)`.
    #[inline]
    pub fn tag(&self) -> u64 {
        u64::from(self.key) << SEQ_BITS
    }
    /// The inbox index.
    pub fn index(&self) -> u16 {
        WrId(self.tag()).inbox()
    }
    fn generation(&self) -> u8 {
        WrId(self.tag()).generation()
    }
    /// Whether `wr_id` is one of this inbox's.
    #[inline]
    fn owns(&self, wr_id: u64) -> bool {
        wr_id >> SEQ_BITS == u64::from(self.key)
    }
    /// The queue pair whose shared receives are routed here, if one is bound.
    pub fn bound_qp(&self) -> Option<u32> {
        let qp_num = self.qp_num();
        (qp_num != NO_QP).then_some(qp_num)
    }
    /// The bound queue pair, or [`NO_QP`].
    fn qp_num(&self) -> u32 {
        let [a, b, c] = self.qp_num;
        u32::from_le_bytes([a, b, c, 0])
    }
    /// Whether a reactor task leads the queue and runs until the inbox is detached.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn reactor_led(&self) -> bool {
        self.joined
    }
}

/// Routes completions from one shared completion queue to the inboxes of the channels
/// attached to it. See the module docs.
///
/// Aligned to a cache-line pair (the adjacent-line prefetcher fetches two), so the poll
/// right, written at every turn, shares no line with a neighbour's data.
#[repr(align(128))]
pub struct Dispatcher {
    boxes: mailbox::Boxes,
    capacity: usize,
    right: right::PollRight,
    by_qp: by_qp::ByQp,
    stale: AtomicU64,
    overflow: AtomicU64,
    sleepers: sleep::Sleepers,
}

/// Completions taken from the queue per turn of the poll right.
const BATCH: usize = 16;

impl Dispatcher {
    /// `inboxes` inboxes (at most 65,535: the last index is
    /// [`SHARED_RECV_INBOX`]) of `capacity` completions
    /// each. Allocates once, here.
    pub fn new(inboxes: usize, capacity: usize) -> Self {
        Self::build(inboxes, capacity, true)
    }

    /// As [`new`](Self::new), for a queue no owner sleeps on (one without a completion
    /// channel): no sleeper slots, 40 bytes less per inbox.
    pub(crate) fn without_sleepers(inboxes: usize, capacity: usize) -> Self {
        Self::build(inboxes, capacity, false)
    }

    fn build(inboxes: usize, capacity: usize, sleepers: bool) -> Self {
        let inboxes = inboxes.min(SHARED_RECV_INBOX as usize);
        Dispatcher {
            boxes: mailbox::boxes(inboxes, capacity),
            capacity,
            right: right::PollRight::new(),
            by_qp: by_qp::ByQp::none(),
            stale: AtomicU64::new(0),
            overflow: AtomicU64::new(0),
            sleepers: sleep::Sleepers::new(if sleepers { inboxes } else { 0 }),
        }
    }

    /// The same dispatcher, also routing the receive completions of queue pairs on a shared
    /// receive queue by their `qp_num` ([`bind_qp`](Self::bind_qp)): a table of two slots
    /// per inbox (16 bytes per inbox), allocated here.
    ///
    /// ```
    /// use zverbs::dispatch::{CompletionSource, Dispatcher};
    /// use zverbs::wr_id::WrId;
    /// use zverbs::WorkCompletion;
    ///
    /// struct Fake(std::cell::RefCell<Vec<WorkCompletion>>);
    /// impl CompletionSource for Fake {
    ///     type Error = ();
    ///     fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
    ///         let mut q = self.0.borrow_mut();
    ///         let n = q.len().min(out.len());
    ///         out[..n].copy_from_slice(&q[..n]);
    ///         q.drain(..n);
    ///         Ok(n)
    ///     }
    /// }
    ///
    /// let d = Dispatcher::new(2, 4).with_qp_routes();
    /// let (mut a, mut b) = (d.attach(4).unwrap(), d.attach(4).unwrap());
    /// // Queue pairs 0x11 and 0x22 share a receive queue; bound before they can receive.
    /// d.bind_qp(&mut a, 0x11).unwrap();
    /// d.bind_qp(&mut b, 0x22).unwrap();
    /// // Buffer 7 was consumed by 0x22's message, buffer 3 by 0x11's.
    /// let recv = |buffer, qp_num| WorkCompletion {
    ///     wr_id: WrId::shared_recv(buffer).0,
    ///     qp_num,
    ///     ..WorkCompletion::EMPTY
    /// };
    /// let cq = Fake(vec![recv(7, 0x22), recv(3, 0x11)].into());
    /// assert_eq!(d.poll(&cq), Ok(2));
    /// let mut out = [WorkCompletion::EMPTY; 4];
    /// assert_eq!(d.take(&mut b, &mut out), 1);
    /// assert_eq!(WrId(out[0].wr_id).seq(), 7); // the wr_id still names the buffer
    /// assert_eq!(d.take(&mut a, &mut out), 1);
    /// assert_eq!(WrId(out[0].wr_id).seq(), 3);
    /// ```
    pub fn with_qp_routes(mut self) -> Self {
        self.by_qp = by_qp::ByQp::for_inboxes(self.boxes.len());
        self
    }

    /// Routes the receive completions of queue pair `qp_num` (24 bits, as every queue pair
    /// number), posted on a shared receive
    /// queue with [`WrId::shared_recv`] ids, to `inbox` (replacing an earlier binding of
    /// the inbox). Bind before the queue pair can receive (before RTR): a completion of a
    /// queue pair bound to no inbox is counted stale. [`detach`](Self::detach) unbinds it.
    /// Waits for the poll right, as `detach` does.
    pub fn bind_qp(&self, inbox: &mut Inbox, qp_num: u32) -> Result<(), BindQpError> {
        if !self.by_qp.is_enabled() {
            return Err(BindQpError::NoQpRoutes);
        }
        if qp_num >= NO_QP {
            return Err(BindQpError::NotAQpNumber(qp_num));
        }
        self.with_poll_right(|| {
            if let Some(old) = inbox.bound_qp() {
                self.by_qp.unbind(old);
            }
            self.by_qp.bind(qp_num, inbox.index(), inbox.generation());
        });
        let [a, b, c, _] = qp_num.to_le_bytes();
        inbox.qp_num = [a, b, c];
        Ok(())
    }

    /// How many inboxes there are.
    pub fn inboxes(&self) -> usize {
        self.boxes.len()
    }

    /// Attaches a free inbox for a channel with at most `depth` requests in flight.
    pub fn attach(&self, depth: usize) -> Result<Inbox, AttachError> {
        if depth > self.capacity {
            return Err(AttachError::TooDeep {
                depth,
                capacity: self.capacity,
            });
        }
        for (i, b) in self.boxes.iter().enumerate() {
            if let Some(generation) = b.try_attach() {
                let [q0, q1, q2, _] = NO_QP.to_le_bytes();
                return Ok(Inbox {
                    key: (WrId::new(i as u16, generation, 0).0 >> SEQ_BITS) as u32,
                    qp_num: [q0, q1, q2],
                    joined: self.sleepers.join_reactor(),
                });
            }
        }
        Err(AttachError::NoFreeInbox)
    }

    /// Gives an inbox back, and unbinds its queue pair. Completions still routed to it are
    /// dropped (counted as stale), now and later. Waits for the poll right (held for one
    /// batch at a time), so no routing to the inbox is under way when it is emptied.
    pub fn detach(&self, inbox: Inbox) {
        let joined = inbox.reactor_led();
        let dropped = self.with_poll_right(|| {
            if let Some(qp_num) = inbox.bound_qp() {
                self.by_qp.unbind(qp_num);
            }
            self.boxes[inbox.index() as usize].detach()
        });
        self.stale.fetch_add(dropped as u64, Ordering::Relaxed);
        if joined {
            self.sleepers.leave_reactor();
        }
    }

    /// If nobody else is polling, moves up to one batch of completions from `cq` to their
    /// inboxes. Returns how many were taken from `cq` (0 if another thread holds the poll
    /// right: it is routing for everyone).
    pub fn poll<C: CompletionSource + ?Sized>(&self, cq: &C) -> Result<usize, C::Error> {
        let Some(_turn) = self.right.try_turn() else {
            return Ok(0);
        };
        self.route_batch(cq)
    }

    /// What a channel's poll does: takes `inbox`'s completions into `out`; if there are
    /// none and nobody else is polling, polls `cq` straight into `out`, keeps `inbox`'s own
    /// completions there (in queue order, compacted to the front) and routes the others to
    /// their inboxes. Returns how many of `inbox`'s completions are in `out`.
    ///
    /// Taking the inbox again with the poll right held keeps the order: every completion
    /// routed to `inbox` before is taken before any polled now, and nobody routes while we
    /// hold the right. The common case (one thread, its own completion) so costs one queue
    /// poll and no trip through the inbox.
    #[inline(always)]
    pub fn poll_for<C: CompletionSource + ?Sized>(
        &self,
        cq: &C,
        inbox: &mut Inbox,
        out: &mut [WorkCompletion],
    ) -> Result<usize, C::Error> {
        let b = &self.boxes[inbox.index() as usize];
        // Mail is looked for before a turn only when the turn is not biased to this
        // thread: while it is, nobody else took one, so nothing was routed here since.
        let _turn = match self.right.try_biased_turn() {
            Ok(turn) => turn,
            Err(me) => {
                if b.has_mail() {
                    return Ok(b.pop(out));
                }
                match self.right.exclusive_turn(me) {
                    Some(turn) => turn,
                    None => return Ok(0),
                }
            }
        };
        if b.has_mail() {
            Ok(b.pop(out))
        } else {
            self.poll_mine(cq, inbox, out)
        }
    }

    /// Polls `cq` into `out` (poll right held), keeps `inbox`'s completions there (tagged
    /// with its tag, or shared receives of its bound queue pair), in order at the front,
    /// and routes the others; returns how many it kept.
    #[inline(always)]
    fn poll_mine<C: CompletionSource + ?Sized>(
        &self,
        cq: &C,
        inbox: &Inbox,
        out: &mut [WorkCompletion],
    ) -> Result<usize, C::Error> {
        // Never more than asked for: a poll for one is then one test, not a loop. A poll
        // for one takes the queue's one-completion entry, as a queue of a channel's own.
        let polled = match out {
            [one] => usize::from(cq.poll_one(one)?),
            _ => cq.poll(out)?.min(out.len()),
        };
        let mut mine = 0;
        for i in 0..polled {
            let wc = &out[i];
            if inbox.owns(wc.wr_id)
                || (wc.qp_num == inbox.qp_num() && WrId(wc.wr_id).is_shared_recv())
            {
                if mine != i {
                    out[mine] = out[i];
                }
                mine += 1;
            } else {
                self.route(&out[i]);
            }
        }
        Ok(mine)
    }

    /// Takes the poll right (waiting for it) and routes everything `cq` holds now. After it
    /// returns, every completion the device wrote before the call is in its inbox: used
    /// after a queue pair is reset, so its last completions are not left behind in
    /// another thread's batch.
    pub fn drain<C: CompletionSource + ?Sized>(&self, cq: &C) -> Result<(), C::Error> {
        self.with_poll_right(|| loop {
            match self.route_batch(cq) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        })
    }

    /// Moves the completions routed to `inbox` into `out`, oldest first; returns how many.
    #[inline]
    pub fn take(&self, inbox: &mut Inbox, out: &mut [WorkCompletion]) -> usize {
        // The `&mut Inbox` makes this thread the inbox's only consumer.
        self.boxes[inbox.index() as usize].pop(out)
    }

    /// Completions dropped because their inbox was not attached (or attached again since),
    /// or was detached before its channel took them.
    pub fn stale_completions(&self) -> u64 {
        self.stale.load(Ordering::Relaxed)
    }

    /// Completions dropped because their inbox was full. Zero unless a channel had more
    /// requests in flight than the depth it attached with.
    pub fn overflowed_completions(&self) -> u64 {
        self.overflow.load(Ordering::Relaxed)
    }

    /// Whether completions wait in `inbox` (consumer side).
    pub(crate) fn has_mail(&self, inbox: &Inbox) -> bool {
        self.boxes[inbox.index() as usize].has_mail()
    }

    #[cfg(feature = "tokio")]
    pub(crate) fn sleepers(&self) -> &sleep::Sleepers {
        &self.sleepers
    }

    fn with_poll_right<R>(&self, f: impl FnOnce() -> R) -> R {
        let _turn = self.right.turn();
        f()
    }

    /// Whether the poll right is biased to one thread: a thread that took 256 turns in a
    /// row takes its next ones with no locked instruction, until another thread takes one
    /// (which revokes the bias with one `membarrier`). Never on systems without
    /// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (Linux ≥ 4.14).
    pub fn is_biased(&self) -> bool {
        self.right.is_biased()
    }

    /// One batch from `cq` to the inboxes; only with the poll right held.
    fn route_batch<C: CompletionSource + ?Sized>(&self, cq: &C) -> Result<usize, C::Error> {
        let mut wcs = [WorkCompletion::EMPTY; BATCH];
        let n = cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            self.route(wc);
        }
        Ok(n)
    }

    fn route(&self, wc: &WorkCompletion) {
        let id = WrId(wc.wr_id);
        let (index, generation) = match id.is_shared_recv() {
            false => (id.inbox(), id.generation()),
            true => match self.by_qp.find(wc.qp_num) {
                Some(to) => to,
                None => {
                    self.stale.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            },
        };
        let Some(b) = self.boxes.get(index as usize) else {
            self.stale.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if !b.is_attached_as(generation) {
            self.stale.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if b.push(wc) {
            self.sleepers.routed(index as usize);
        } else {
            self.overflow.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatcher")
            .field("inboxes", &self.boxes.len())
            .field("capacity", &self.capacity)
            .field("stale", &self.stale_completions())
            .finish()
    }
}

#[cfg(all(test, loom))]
mod loom_sleep;
#[cfg(all(test, not(loom)))]
mod tests;
