//! Async RDMA on tokio (feature `tokio`): operations that take **owned** buffers and give
//! them back with the result, woken by completion events.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::provider::sim::Sim;
//! use zverbs::tokio::AsyncChannel;
//! use zverbs::{ChannelConfig, Context, MrPool};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let sim = Sim::with_devices(2);
//! let (ca, cb) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
//! let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
//! let cfg = ChannelConfig::default();
//! let a = AsyncChannel::<Sim>::prepare(&ca, &pa, &cfg).unwrap();
//! let b = AsyncChannel::<Sim>::prepare(&cb, &pb, &cfg).unwrap();
//! let (ea, eb) = (a.endpoint(), b.endpoint());
//! let a = AsyncChannel::new(a.connect(&eb).unwrap()).unwrap();
//! let b = AsyncChannel::new(b.connect(&ea).unwrap()).unwrap();
//!
//! let (pool_a, pool_b) = (MrPool::new(&pa, 1 << 16).unwrap(), MrPool::new(&pb, 1 << 16).unwrap());
//! let inbox = pool_b.alloc(16).unwrap();
//! let mut msg = pool_a.alloc(5).unwrap();
//! msg.copy_from_slice(b"hello");
//! let (received, sent) = tokio::join!(b.receive(inbox), a.send(msg));
//! assert!(sent.0.is_ok());
//! let (done, inbox) = received;
//! assert_eq!(done.unwrap().byte_len, 5);
//! assert_eq!(&inbox[..5], b"hello");
//! # });
//! # }
//! ```
//!
//! **Why owned buffers.** A future can be dropped at any `.await` (a `select!`, a timeout,
//! a cancelled task). If it had borrowed the buffer, the borrow would end with the future
//! while the device still reads or writes the memory. So each operation takes its buffer
//! ([`IoBuf`], e.g. a [`LocalBuf`](crate::pool::LocalBuf) from an
//! [`MrPool`](crate::pool::MrPool)) and returns it with the result, as tokio-uring and
//! monoio do; a future dropped after its request was posted leaves the buffer with the
//! channel, which drops it (back to its pool) once the request completed or was flushed.
//!
//! **How completions wake tasks.** Both completion queues of an [`AsyncChannel`] raise
//! events on completion channels of their own; one reactor task per channel sleeps on their
//! descriptors (tokio `AsyncFd`, readiness cleared only after the descriptor said
//! would-block), and each pass arms the queues, polls them (arm, then poll: no completion
//! slips between), and wakes the tasks whose requests finished. There is no polling timer.
//! A task also polls once itself before it sleeps (and, with
//! [`WaitPolicy::Spin`](crate::WaitPolicy), keeps polling for a few microseconds), so a
//! completion that is already there costs no trip through the reactor.
//!
//! **Bounds.** Every operation returns within the channel's
//! [`timeout`](crate::ChannelConfig::timeout) plus its
//! [`flush_grace`](crate::ChannelConfig::flush_grace): on timeout the queue pair is moved
//! to the error state, the flush is awaited for the grace, and what is left is discarded
//! through RESET, so the buffer comes back with [`Error::Timeout`] and the device no longer
//! touches it. As with the blocking calls, the channel is then broken (reconnect it).
//!
//! `AsyncChannel` is `Clone` (a handle): many tasks may use one channel at once, on a
//! current-thread or a multi-thread runtime. Dropping the last handle moves the queue pair
//! to the error state; the reactor keeps the buffers of unfinished requests until they are
//! flushed (at most the grace), then ends.

mod buf;
mod reactor;

pub use buf::IoBuf;

use core::future::poll_fn;
use core::pin::pin;
use core::task::{Context as TaskContext, Poll, Waker};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::channel::{Channel, ChannelConfig, Pending, PreparedChannel, WaitPolicy};
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::mr::RemoteRegion;
use crate::provider::Provider;
use crate::ring::Completion;
use crate::types::{SendFlags, SendOp};

/// What an operation returns: its result, and the buffer it took.
pub type BufResult<T, B, E> = (Result<T, Error<E>>, B);

/// A connected channel driven by async operations on owned buffers of type `B`. See the
/// [module docs](self).
pub struct AsyncChannel<
    P: Provider,
    B: IoBuf = crate::pool::LocalBuf<P>,
    const DEPTH: usize = 64,
    const SGES: usize = 4,
> {
    handle: Arc<Handle<P, B, DEPTH, SGES>>,
}

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Clone
    for AsyncChannel<P, B, DEPTH, SGES>
{
    fn clone(&self) -> Self {
        AsyncChannel {
            handle: self.handle.clone(),
        }
    }
}

/// The users' share of a channel: when the last handle goes, the channel closes.
struct Handle<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    shared: Arc<Shared<P, B, DEPTH, SGES>>,
}

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Drop
    for Handle<P, B, DEPTH, SGES>
{
    fn drop(&mut self) {
        self.shared.close();
    }
}

/// The channel, shared by its handles, the operations under way and the reactor.
pub(crate) struct Shared<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    inner: Mutex<Inner<P, B, DEPTH, SGES>>,
    /// Wakes posters waiting for a free slot; notified whenever an outcome is taken.
    space: tokio::sync::Notify,
    config: ChannelConfig,
}

pub(crate) struct Inner<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    ch: Channel<P, DEPTH, SGES>,
    /// Per queue (send, receive), by sequence number modulo `DEPTH`: who waits for the
    /// request there, and the buffer of a request whose future was dropped.
    slots: [[Slot<B>; DEPTH]; 2],
    /// The reactor's waker, while it sleeps.
    reactor: Option<Waker>,
    /// The last handle is gone.
    closing: bool,
}

struct Slot<B> {
    waiting: Option<(Pending, Waker)>,
    orphan: Option<(Pending, B)>,
}

impl<B> Default for Slot<B> {
    fn default() -> Self {
        Slot {
            waiting: None,
            orphan: None,
        }
    }
}

impl<P: Provider + 'static, B: IoBuf, const DEPTH: usize, const SGES: usize>
    AsyncChannel<P, B, DEPTH, SGES>
{
    /// Prepares the channel as [`Channel::prepare`] does, with its completion queues on
    /// completion channels (the reactor sleeps on them). Exchange endpoints, `connect`,
    /// then [`new`](Self::new).
    pub fn prepare(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: &ChannelConfig,
    ) -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>> {
        Channel::prepare_with_events(ctx, pd, config)
    }

    /// Drives `channel` asynchronously: spawns its reactor on the current tokio runtime.
    /// The channel must come from [`prepare`](Self::prepare) (its queues raise events),
    /// else [`Error::InvalidAttribute`]; outside a runtime, the same.
    pub fn new(channel: Channel<P, DEPTH, SGES>) -> Result<Self, Error<P::Error>> {
        let [Some(send_fd), Some(recv_fd)] = channel.event_fds() else {
            return Err(Error::InvalidAttribute(
                "an async channel needs completion channels: prepare it with AsyncChannel::prepare",
            ));
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(Error::InvalidAttribute(
                "an async channel is made inside a tokio runtime",
            ));
        };
        let fds = reactor::Fds::new(send_fd, recv_fd).map_err(|_| {
            Error::InvalidAttribute("the completion channels cannot join the tokio reactor")
        })?;
        let config = *channel.config();
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                ch: channel,
                slots: [
                    core::array::from_fn(|_| Slot::default()),
                    core::array::from_fn(|_| Slot::default()),
                ],
                reactor: None,
                closing: false,
            }),
            space: tokio::sync::Notify::new(),
            config,
        });
        runtime.spawn(reactor::run(reactor::Reactor {
            fds,
            shared: shared.clone(),
        }));
        Ok(AsyncChannel {
            handle: Arc::new(Handle { shared }),
        })
    }

    /// Sends the whole of `buf` (a two-sided send: it consumes a receive at the peer).
    pub async fn send(&self, buf: B) -> BufResult<(), B, P::Error> {
        self.post_send(buf, SendOp::Send, None).await
    }

    /// Sends `buf` with 32 bits of immediate data for the receiver.
    pub async fn send_with_imm(&self, buf: B, imm: u32) -> BufResult<(), B, P::Error> {
        self.post_send(buf, SendOp::SendWithImm(imm), None).await
    }

    /// Posts a receive into `buf` and waits for a message: its byte count and immediate
    /// data. If the future is dropped after the receive was posted, the receive stays
    /// posted: the next message the peer sends lands in `buf` and is lost with it.
    pub async fn receive(&self, buf: B) -> BufResult<Completion, B, P::Error> {
        let sge = match buf.sge() {
            Ok(sge) => sge,
            Err(e) => return (Err(e.into()), buf),
        };
        self.run(buf, |ch| ch.post_receive_pending(sge)).await
    }

    /// Writes the whole of `buf` to the start of `remote` (which must hold it).
    pub async fn write(&self, buf: B, remote: &RemoteRegion) -> BufResult<(), B, P::Error> {
        self.post_send(buf, remote.write_op(), Some(remote)).await
    }

    /// Writes `buf` to `remote` and hands `imm` to a receive the peer posted.
    pub async fn write_with_imm(
        &self,
        buf: B,
        remote: &RemoteRegion,
        imm: u32,
    ) -> BufResult<(), B, P::Error> {
        self.post_send(buf, remote.write_with_imm_op(imm), Some(remote))
            .await
    }

    /// Reads the start of `remote` into the whole of `buf`.
    pub async fn read(&self, buf: B, remote: &RemoteRegion) -> BufResult<(), B, P::Error> {
        self.post_send(buf, remote.read_op(), Some(remote)).await
    }

    /// Adds `add` to the 8 bytes at the start of `remote`; their value before lands in
    /// `buf` (8 bytes) and is returned.
    pub async fn fetch_add(
        &self,
        buf: B,
        remote: &RemoteRegion,
        add: u64,
    ) -> BufResult<u64, B, P::Error> {
        self.atomic(buf, remote, remote.fetch_add_op(add)).await
    }

    /// Compares the 8 bytes at the start of `remote` with `compare` and, if equal, writes
    /// `swap`; their value before lands in `buf` (8 bytes) and is returned.
    pub async fn compare_swap(
        &self,
        buf: B,
        remote: &RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> BufResult<u64, B, P::Error> {
        self.atomic(buf, remote, remote.compare_swap_op(compare, swap))
            .await
    }

    async fn atomic(
        &self,
        buf: B,
        remote: &RemoteRegion,
        op: SendOp,
    ) -> BufResult<u64, B, P::Error> {
        let sge = match buf.sge() {
            Ok(sge) => sge,
            Err(e) => return (Err(e.into()), buf),
        };
        if sge.length != 8 {
            return (
                Err(Error::InvalidAttribute(
                    "an atomic's local buffer is 8 bytes",
                )),
                buf,
            );
        }
        let (r, buf) = self.post_send(buf, op, Some(remote)).await;
        // SAFETY: the operation finished, so the device wrote the 8 bytes `sge` names and
        // touches them no more; `buf` owns that memory and is not borrowed elsewhere
        // (`IoBuf`'s contract), so reading them through a shared pointer is sound. The read
        // is unaligned-safe.
        let value = r.map(|()| unsafe { (sge.addr as *const u64).read_unaligned() });
        (value, buf)
    }

    async fn post_send(
        &self,
        buf: B,
        op: SendOp,
        remote: Option<&RemoteRegion>,
    ) -> BufResult<(), B, P::Error> {
        let sge = match buf.sge() {
            Ok(sge) => sge,
            Err(e) => return (Err(e.into()), buf),
        };
        let (r, buf) = self
            .run(buf, |ch| {
                ch.post_send_pending(sge, op, SendFlags::empty(), remote)
            })
            .await;
        (r.map(|_| ()), buf)
    }

    /// Posts with `post` (waiting for a free slot), then waits for the outcome, within the
    /// channel's timeout plus grace.
    async fn run(
        &self,
        buf: B,
        mut post: impl FnMut(&mut Channel<P, DEPTH, SGES>) -> Result<Pending, Error<P::Error>>,
    ) -> BufResult<Completion, B, P::Error> {
        let shared = &*self.handle.shared;
        let pending = loop {
            let notified = shared.space.notified();
            let mut notified = pin!(notified);
            notified.as_mut().enable();
            let posted = post(&mut shared.lock().ch);
            match posted {
                Ok(p) => break p,
                Err(Error::QueueFull { .. }) => notified.await,
                Err(e) => return (Err(e), buf),
            }
        };
        let mut op = InFlight {
            shared,
            pending: Some(pending),
            buf: Some(buf),
        };
        let r = match shared.config.timeout {
            None => poll_fn(|cx| op.poll(cx)).await,
            Some(t) => match tokio::time::timeout(t, poll_fn(|cx| op.poll(cx))).await {
                Ok(r) => r,
                Err(_) => op.time_out().await,
            },
        };
        (r, op.give_back())
    }
}

/// A posted request and its buffer; dropped unfinished, it leaves the buffer with the
/// channel until the device is done with it.
struct InFlight<'a, P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    shared: &'a Shared<P, B, DEPTH, SGES>,
    /// `Some` until the outcome was taken.
    pending: Option<Pending>,
    /// `Some` until given back or left with the channel.
    buf: Option<B>,
}

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> InFlight<'_, P, B, DEPTH, SGES> {
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<Completion, Error<P::Error>>> {
        let Some(pending) = self.pending.as_ref() else {
            return Poll::Ready(Err(Error::InvalidAttribute("polled after completion")));
        };
        let mut spins = if self.shared.config.wait == WaitPolicy::Spin {
            SPIN_POLLS
        } else {
            0
        };
        loop {
            let mut inner = self.shared.lock();
            if let Some(r) = inner.finish(pending) {
                drop(inner);
                self.pending = None;
                self.shared.space.notify_waiters();
                return Poll::Ready(r);
            }
            if spins == 0 {
                let slot = inner.slot(pending);
                slot.waiting = Some((pending.duplicate(), cx.waker().clone()));
                return Poll::Pending;
            }
            drop(inner);
            spins -= 1;
            core::hint::spin_loop();
        }
    }

    /// After the timeout: error state, the flush awaited for the grace, then whatever is
    /// left discarded through RESET; the outcome is `Timeout`, the buffer free again.
    async fn time_out(&mut self) -> Result<Completion, Error<P::Error>> {
        let _ = self.shared.lock().ch.abort();
        let grace = self.shared.config.flush_grace;
        if tokio::time::timeout(grace, poll_fn(|cx| self.poll(cx)))
            .await
            .is_err()
        {
            let mut inner = self.shared.lock();
            let mut fatal = None;
            inner.ch.discard(&mut fatal);
            inner.release_orphans();
            if let Some(p) = self.pending.take() {
                let _ = inner.ch.take_finished(&p);
            }
            drop(inner);
            self.shared.space.notify_waiters();
            return Err(fatal.unwrap_or(Error::Timeout));
        }
        self.pending = None;
        Err(Error::Timeout)
    }

    fn give_back(&mut self) -> B {
        self.buf
            .take()
            .expect("an in-flight buffer is given back once (InFlight invariant)")
    }
}

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Drop
    for InFlight<'_, P, B, DEPTH, SGES>
{
    fn drop(&mut self) {
        let (Some(pending), Some(buf)) = (self.pending.take(), self.buf.take()) else {
            return;
        };
        let mut inner = self.shared.lock();
        inner.slot(&pending).waiting = None;
        if inner.ch.take_finished(&pending).is_some() {
            drop(inner);
            self.shared.space.notify_waiters();
            drop(buf);
        } else {
            let slot = inner.slot(&pending);
            slot.orphan = Some((pending, buf));
        }
    }
}

/// Polls a task makes before it sleeps, with [`WaitPolicy::Spin`].
const SPIN_POLLS: u32 = 128;

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Shared<P, B, DEPTH, SGES> {
    /// The lock on the channel. Never held across an `.await`; a panic while it was held
    /// (a bug) leaves the state as it was, so the lock is taken anyway.
    fn lock(&self) -> MutexGuard<'_, Inner<P, B, DEPTH, SGES>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The last handle went: flush what is in flight and let the reactor end.
    fn close(&self) {
        let mut inner = self.lock();
        inner.closing = true;
        if inner.ch.busy() {
            let _ = inner.ch.abort();
        }
        if let Some(w) = inner.reactor.take() {
            w.wake();
        }
    }
}

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Inner<P, B, DEPTH, SGES> {
    fn slot(&mut self, p: &Pending) -> &mut Slot<B> {
        &mut self.slots[usize::from(p.is_receive())][p.slot(DEPTH)]
    }

    /// `p`'s outcome if it finished (polling once if not yet).
    fn finish(&mut self, p: &Pending) -> Option<Result<Completion, Error<P::Error>>> {
        if let Some(r) = self.ch.take_finished(p) {
            self.slot(p).waiting = None;
            return Some(r);
        }
        // A failed poll (a dead device) is reported by the reactor's pass and bounded by
        // the timeout: the request is still lent to the device.
        let _ = self.ch.poll_queues();
        let r = self.ch.take_finished(p)?;
        self.slot(p).waiting = None;
        Some(r)
    }

    /// Wakes the tasks whose requests finished; drops the buffers of orphans that did.
    /// Returns whether an orphan was released (a slot came free).
    fn wake_finished(&mut self) -> bool {
        let Inner { ch, slots, .. } = self;
        for slot in slots.iter_mut().flatten() {
            if let Some((p, _)) = &slot.waiting {
                if ch.has_finished(p) {
                    if let Some((_, w)) = slot.waiting.take() {
                        w.wake();
                    }
                }
            }
        }
        self.release_orphans()
    }

    fn release_orphans(&mut self) -> bool {
        let Inner { ch, slots, .. } = self;
        let mut released = false;
        for slot in slots.iter_mut().flatten() {
            if let Some((p, _)) = &slot.orphan {
                if ch.take_finished(p).is_some() {
                    slot.orphan = None;
                    released = true;
                }
            }
        }
        released
    }

    fn has_orphans(&self) -> bool {
        self.slots.iter().flatten().any(|s| s.orphan.is_some())
    }
}

// The channel is driven only under `Shared::inner`'s lock; buffers are `Send`.
#[cfg(feature = "sim")]
static_assertions::assert_impl_all!(
    AsyncChannel<crate::provider::sim::Sim, crate::pool::LocalBuf<crate::provider::sim::Sim>>: Send, Sync
);
