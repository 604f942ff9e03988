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
//! **Posted when called.** An operation posts its request when it is *called*, as
//! tokio-uring submits at call time; the future waits for the outcome (or, if the queue
//! was full, for room first). So `join!(ch.receive(inbox), ch.send(msg))` has both posted
//! before either is polled, and the receive's first poll can already look for the reply.
//! A future dropped unpolled has posted all the same: its buffer comes back as above.
//!
//! **How completions wake tasks.** Both completion queues of an [`AsyncChannel`] raise
//! events on completion channels of their own; one reactor task per channel sleeps on their
//! descriptors (tokio `AsyncFd`, readiness cleared only after the descriptor said
//! would-block), and each pass arms the queues, polls them (arm, then poll: no completion
//! slips between), and wakes the tasks whose requests finished. There is no polling timer.
//! Channels on shared completion queues ([`AsyncQueue`], made with
//! [`prepare_shared`](AsyncChannel::prepare_shared)) go through the lock-free dispatcher
//! instead: one reactor per queue sleeps on its descriptor, routes each completion to its
//! channel's inbox and so wakes that channel's reactor, which sleeps on its inboxes.
//! A waiting operation polls the queues itself first, once per turn of the runtime (busy
//! polling that still lets other tasks and the I/O driver run): with
//! [`WaitPolicy::Spin`](crate::WaitPolicy) until it is done, with `SpinYield` (the
//! default) for two turns (1,024 polls each, some tens of microseconds), with
//! `SpinSleep` not at all; then it sleeps until the reactor
//! wakes it. A completion that comes while it polls costs no trip through the reactor.
//! A sleeping operation leaves its deadline with the channel: the reactor keeps one timer,
//! set to the earliest deadline, and wakes the operations whose deadline passed (one timer
//! per channel rather than one per operation: an operation's future holds no timer).
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
mod cm;
mod connect;
mod future;
mod group;
mod mesh;
mod queue;
mod reactor;
mod remote;
mod rpc;
mod shared;
mod wire;

pub use buf::{HostBuf, IoBuf};
pub use connect::ConnectError;
pub use group::AsyncGroup;
pub use queue::AsyncQueue;
pub use remote::{Connection, RemoteBuf, RemoteError};
pub use rpc::{AsyncRpc, BulkAnswer};
pub use wire::WireError;

use core::future::Future;
use core::task::{Context as TaskContext, Poll, Waker};
use parking_lot::{Mutex, MutexGuard};
use std::sync::Arc;

use crate::channel::{
    Channel, ChannelConfig, Lent, Op, Owned, Pending, PreparedChannel, WaitPolicy,
};
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::mr::RemoteRegion;
use crate::provider::Provider;
use crate::ring::Completion;
use crate::types::Sge;

use tokio::time::Instant;

use future::*;
pub(crate) use shared::Shared;
use shared::*;

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

    /// Prepares the channel on shared completion queues, as
    /// [`Channel::prepare_shared`] does: `send`'s reactor wakes the channel's send
    /// completions, `recv`'s its receives (they may be one queue). Exchange endpoints,
    /// `connect`, then [`new`](Self::new).
    pub fn prepare_shared(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: &ChannelConfig,
        send: &AsyncQueue<P>,
        recv: &AsyncQueue<P>,
    ) -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>> {
        Channel::prepare_shared(ctx, pd, config, send.queue(), recv.queue())
    }

    /// Drives `channel` asynchronously: spawns its reactor on the current tokio runtime.
    /// The channel must come from [`prepare`](Self::prepare) (its queues raise events) or
    /// [`prepare_shared`](Self::prepare_shared) (its queues' reactors run), else
    /// [`Error::InvalidAttribute`]; outside a runtime, the same.
    pub fn new(channel: Channel<P, DEPTH, SGES>) -> Result<Self, Error<P::Error>> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(Error::InvalidAttribute(
                "an async channel is made inside a tokio runtime",
            ));
        };
        let wakeup = match channel.event_fds() {
            [Some(send_fd), Some(recv_fd)] => {
                let device_fd = channel.device_fd();
                reactor::Wakeup::Fds(reactor::Fds::new(send_fd, recv_fd, device_fd).map_err(|_| {
                    Error::InvalidAttribute(
                        "the completion channels cannot join the tokio reactor",
                    )
                })?)
            }
            _ if channel.on_led_queues() => reactor::Wakeup::Inboxes,
            _ => {
                return Err(Error::InvalidAttribute(
                    "an async channel needs completion channels or async queues: prepare it with AsyncChannel::prepare or prepare_shared",
                ))
            }
        };
        let config = *channel.config();
        let on_queues = matches!(wakeup, reactor::Wakeup::Inboxes);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                ch: channel,
                slots: [
                    core::array::from_fn(|_| Slot::default()),
                    core::array::from_fn(|_| Slot::default()),
                ],
                reactor: None,
                space: Vec::with_capacity(SPACE_WAITERS),
                space_until: None,
                timer_at: None,
                closing: false,
                armed: false,
                on_queues,
                parked: false,
                dead: false,
            }),
            config,
        });
        runtime.spawn(reactor::run(reactor::Reactor {
            wakeup,
            shared: shared.clone(),
        }));
        Ok(AsyncChannel {
            handle: Arc::new(Handle { shared }),
        })
    }

    /// Posts `op` over its owned buffer and waits for its completion; the future gives the
    /// buffer back with it. The named operations below are this, with the completion
    /// turned into their value.
    ///
    /// Posted when called, as every operation here (see [the module docs](self)).
    ///
    /// ```
    /// # #[cfg(feature = "sim")] {
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::tokio::AsyncChannel;
    /// # use zverbs::{AccessFlags, ChannelConfig, MrPool};
    /// use zverbs::{Op, Owned};
    /// # let p = zverbs::testing::Pair::<64, 4>::connected_for_async(&ChannelConfig::default()).unwrap();
    /// # let (pa, pb, ch) = (p.a.pd, p.b.pd, p.a.ch);
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let a = AsyncChannel::new(ch).unwrap();
    /// let mut target = [0u8; 8];
    /// // SAFETY: nothing reads `target` until the write has completed.
    /// let target = unsafe { pb.register_with_access(&mut target, AccessFlags::all()) }.unwrap();
    /// let pool = MrPool::new(&pa, 1 << 12).unwrap();
    /// let mut buf = pool.alloc(8).unwrap();
    /// buf.copy_from_slice(b"8 bytes!");
    /// let (done, buf) = a.post(Op::write(Owned(buf), &target.remote())).await;
    /// assert_eq!(done.unwrap().byte_len, 8);
    /// assert_eq!((&buf[..], target.as_slice()), (&b"8 bytes!"[..], &b"8 bytes!"[..]));
    /// # });
    /// # }
    /// ```
    #[inline(always)]
    pub fn post<'a>(
        &'a self,
        op: Op<'_, Owned<B>>,
    ) -> impl Future<Output = BufResult<Completion, B, P::Error>> + 'a {
        self.run_op(op, |c, _| Ok(c))
    }

    /// Sends the whole of `buf` (a two-sided send: it consumes a receive at the peer).
    #[inline(always)]
    pub fn send(&self, buf: B) -> impl Future<Output = BufResult<(), B, P::Error>> + '_ {
        self.run_op(Op::send(Owned(buf)), done)
    }

    /// Sends `buf` with 32 bits of immediate data for the receiver.
    #[inline(always)]
    pub fn send_with_imm(
        &self,
        buf: B,
        imm: u32,
    ) -> impl Future<Output = BufResult<(), B, P::Error>> + '_ {
        self.run_op(Op::send_with_imm(Owned(buf), imm), done)
    }

    /// Posts a receive into `buf` and waits for a message: its byte count and immediate
    /// data. If the future is dropped after the receive was posted, the receive stays
    /// posted: the next message the peer sends lands in `buf` and is lost with it.
    #[inline(always)]
    pub fn receive(&self, buf: B) -> impl Future<Output = BufResult<Completion, B, P::Error>> + '_ {
        self.run(buf, None, |c, _| Ok(c))
    }

    /// Writes the whole of `buf` to the start of `remote` (which must hold it).
    #[inline(always)]
    pub fn write(
        &self,
        buf: B,
        remote: &RemoteRegion,
    ) -> impl Future<Output = BufResult<(), B, P::Error>> + '_ {
        self.run_op(Op::write(Owned(buf), remote), done)
    }

    /// Writes `buf` to `remote` and hands `imm` to a receive the peer posted.
    #[inline(always)]
    pub fn write_with_imm(
        &self,
        buf: B,
        remote: &RemoteRegion,
        imm: u32,
    ) -> impl Future<Output = BufResult<(), B, P::Error>> + '_ {
        self.run_op(Op::write_with_imm(Owned(buf), remote, imm), done)
    }

    /// Reads the start of `remote` into the whole of `buf`.
    #[inline(always)]
    pub fn read(
        &self,
        buf: B,
        remote: &RemoteRegion,
    ) -> impl Future<Output = BufResult<(), B, P::Error>> + '_ {
        self.run_op(Op::read(Owned(buf), remote), done)
    }

    /// [`run`](Self::run) for a send-queue operation.
    #[inline(always)]
    fn run_op<'a, T: 'a>(
        &'a self,
        op: Op<'_, Owned<B>>,
        finish: impl FnOnce(Completion, Sge) -> Result<T, Error<P::Error>> + Copy + 'a,
    ) -> impl Future<Output = BufResult<T, B, P::Error>> + 'a {
        let (Owned(buf), op) = op.relocate(());
        self.run(buf, Some(op), finish)
    }

    /// Posts now (see [`begin`](Self::begin)) `op` over `buf`, or a receive into it
    /// (`None`); the future waits for a free slot if the queue was full, then for the
    /// outcome, within the channel's timeout plus grace.
    #[inline(always)]
    fn run<'a, T: 'a>(
        &'a self,
        buf: B,
        op: Option<Op<'a, ()>>,
        finish: impl FnOnce(Completion, Sge) -> Result<T, Error<P::Error>> + Copy + 'a,
    ) -> impl Future<Output = BufResult<T, B, P::Error>> + 'a {
        let shared = &*self.handle.shared;
        OpFuture {
            shared,
            stage: self.begin(buf, op),
            clock: Clock::default(),
            finish,
        }
    }

    /// The part of an operation done when it is called: the buffer's entry and one
    /// attempt to post (with the request's outcome, if it finished within its post).
    /// A posted request is held by an [`InFlight`] from here on, so a future dropped
    /// before its first poll leaves the buffer with the channel until the device is done.
    #[inline(always)]
    fn begin<'a>(&'a self, buf: B, op: Option<Op<'a, ()>>) -> Stage<'a, P, B, DEPTH, SGES> {
        let sge = match buf.sge() {
            Ok(sge) => sge,
            Err(e) => return Stage::Ended(Err(e.into()), buf, Sge::default()),
        };
        let what = match &op {
            Some(op) => Post::Send(op.op, op.flags),
            None => Post::Receive,
        };
        let shared = &*self.handle.shared;
        let mut inner = shared.lock();
        // The first attempt with the whole operation, checked; a retry needs only `what`.
        let posted = match op {
            Some(op) => inner
                .ch
                .post_pending(op.relocate(core::iter::once(Lent(sge))).1),
            None => what.post(&mut inner.ch, sge),
        };
        let p = match posted {
            Ok(p) => p,
            Err(Error::QueueFull { .. }) => return Stage::Full(buf, sge, what),
            Err(e) => return Stage::Ended(Err(e), buf, sge),
        };
        // Done at once (as a send on an idle link often is): no second trip through the
        // lock. A receive just posted cannot have finished yet. Nothing polled since the
        // post, and its slot has no waiter yet.
        if !matches!(what, Post::Receive) {
            let r = inner.ch.try_finish_posted(&p);
            inner.polled();
            if let Some(r) = r {
                shared.freed(inner);
                return Stage::Ended(r, buf, sge);
            }
        }
        drop(inner);
        Stage::Posted(InFlight::new(shared, p, buf), sge)
    }
}

/// Atomics return the value they fetched, which the library reads from the buffer: only
/// on buffers of host memory ([`HostBuf`]).
impl<P: Provider + 'static, B: HostBuf, const DEPTH: usize, const SGES: usize>
    AsyncChannel<P, B, DEPTH, SGES>
{
    /// Adds `add` to the 8 bytes at the start of `remote`; their value before lands in
    /// `buf` (8 bytes) and is returned.
    pub fn fetch_add(
        &self,
        buf: B,
        remote: &RemoteRegion,
        add: u64,
    ) -> impl Future<Output = BufResult<u64, B, P::Error>> + '_ {
        self.run_op(Op::fetch_add(Owned(buf), remote, add), old_value)
    }

    /// Compares the 8 bytes at the start of `remote` with `compare` and, if equal, writes
    /// `swap`; their value before lands in `buf` (8 bytes) and is returned.
    pub fn compare_swap(
        &self,
        buf: B,
        remote: &RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> impl Future<Output = BufResult<u64, B, P::Error>> + '_ {
        let op = Op::compare_swap(Owned(buf), remote, compare, swap);
        self.run_op(op, old_value)
    }
}

// The channel is driven only under `Shared::inner`'s lock; buffers are `Send`.
#[cfg(feature = "sim")]
static_assertions::assert_impl_all!(
    AsyncChannel<crate::provider::sim::Sim, crate::pool::LocalBuf<crate::provider::sim::Sim>>: Send, Sync
);
