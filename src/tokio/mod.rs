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
mod connect;
mod group;
mod queue;
mod reactor;
mod remote;
mod rpc;
mod wire;

pub use buf::IoBuf;
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

use crate::channel::{Channel, ChannelConfig, Pending, PreparedChannel, WaitPolicy};
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::mr::RemoteRegion;
use crate::provider::Provider;
use crate::ring::Completion;
use crate::types::{SendFlags, SendOp, Sge};

use tokio::time::Instant;

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
    config: ChannelConfig,
}

pub(crate) struct Inner<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    ch: Channel<P, DEPTH, SGES>,
    /// Per queue (send, receive), by sequence number modulo `DEPTH`: who waits for the
    /// request there, and the buffer of a request whose future was dropped.
    slots: [[Slot<B>; DEPTH]; 2],
    /// The reactor's waker, while it sleeps.
    reactor: Option<Waker>,
    /// Operations waiting for a free slot: whoever takes an outcome wakes them. At most
    /// [`SPACE_WAITERS`] of them (room reserved at set-up, so waiting never allocates); one
    /// that finds the list full tries again at the runtime's next turn.
    space: Vec<Waker>,
    /// The earliest deadline of an operation waiting for a free slot: when it passes, the
    /// reactor wakes them all (each looks at its own deadline).
    space_until: Option<Instant>,
    /// The instant the reactor's deadline timer is set to, while it sleeps (`None`: no
    /// deadline to keep). An operation that goes to sleep with an earlier deadline wakes
    /// the reactor, which sets its timer again.
    timer_at: Option<Instant>,
    /// The last handle is gone.
    closing: bool,
    /// The queues were armed and no event was taken since. Armed only while someone
    /// sleeps (a task, an orphaned buffer, the close): busy-polling tasks need no events,
    /// and an armed queue costs a write to the descriptor per completion.
    armed: bool,
    /// The queues are shared, led by their reactors (which run while the channel is
    /// attached): the channel's reactor sleeps on its inboxes, and "arming" registers it
    /// there.
    on_queues: bool,
    /// A slot may hold a sleeping operation or an orphan: set when one is left there,
    /// recomputed by [`wake_finished`](Self::wake_finished).
    parked: bool,
}

struct Slot<B> {
    waiting: Option<Waiting>,
    orphan: Option<(Pending, B)>,
}

/// An operation asleep until its request finishes or `until` passes (the reactor wakes it
/// at whichever comes first).
struct Waiting {
    pending: Pending,
    waker: Waker,
    until: Option<Instant>,
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
                reactor::Wakeup::Fds(reactor::Fds::new(send_fd, recv_fd).map_err(|_| {
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

    /// Sends the whole of `buf` (a two-sided send: it consumes a receive at the peer).
    ///
    /// Posted when called, as every operation here (see [the module docs](self)).
    pub fn send(&self, buf: B) -> impl Future<Output = BufResult<(), B, P::Error>> + '_ {
        self.run(buf, Post::Send(SendOp::Send, None), done)
    }

    /// Sends `buf` with 32 bits of immediate data for the receiver.
    pub fn send_with_imm(
        &self,
        buf: B,
        imm: u32,
    ) -> impl Future<Output = BufResult<(), B, P::Error>> + '_ {
        self.run(buf, Post::Send(SendOp::SendWithImm(imm), None), done)
    }

    /// Posts a receive into `buf` and waits for a message: its byte count and immediate
    /// data. If the future is dropped after the receive was posted, the receive stays
    /// posted: the next message the peer sends lands in `buf` and is lost with it.
    pub fn receive(&self, buf: B) -> impl Future<Output = BufResult<Completion, B, P::Error>> + '_ {
        self.run(buf, Post::Receive, |c, _| Ok(c))
    }

    /// Writes the whole of `buf` to the start of `remote` (which must hold it).
    pub fn write<'a>(
        &'a self,
        buf: B,
        remote: &'a RemoteRegion,
    ) -> impl Future<Output = BufResult<(), B, P::Error>> + 'a {
        self.run(buf, Post::Send(remote.write_op(), Some(remote)), done)
    }

    /// Writes `buf` to `remote` and hands `imm` to a receive the peer posted.
    pub fn write_with_imm<'a>(
        &'a self,
        buf: B,
        remote: &'a RemoteRegion,
        imm: u32,
    ) -> impl Future<Output = BufResult<(), B, P::Error>> + 'a {
        let op = remote.write_with_imm_op(imm);
        self.run(buf, Post::Send(op, Some(remote)), done)
    }

    /// Reads the start of `remote` into the whole of `buf`.
    pub fn read<'a>(
        &'a self,
        buf: B,
        remote: &'a RemoteRegion,
    ) -> impl Future<Output = BufResult<(), B, P::Error>> + 'a {
        self.run(buf, Post::Send(remote.read_op(), Some(remote)), done)
    }

    /// Adds `add` to the 8 bytes at the start of `remote`; their value before lands in
    /// `buf` (8 bytes) and is returned.
    pub fn fetch_add<'a>(
        &'a self,
        buf: B,
        remote: &'a RemoteRegion,
        add: u64,
    ) -> impl Future<Output = BufResult<u64, B, P::Error>> + 'a {
        let op = remote.fetch_add_op(add);
        self.run(buf, Post::Atomic(op, remote), old_value)
    }

    /// Compares the 8 bytes at the start of `remote` with `compare` and, if equal, writes
    /// `swap`; their value before lands in `buf` (8 bytes) and is returned.
    pub fn compare_swap<'a>(
        &'a self,
        buf: B,
        remote: &'a RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> impl Future<Output = BufResult<u64, B, P::Error>> + 'a {
        let op = remote.compare_swap_op(compare, swap);
        self.run(buf, Post::Atomic(op, remote), old_value)
    }

    /// Posts now (see [`begin`](Self::begin)); the future waits for a free slot if the
    /// queue was full, then for the outcome, within the channel's timeout plus grace.
    fn run<'a, T: 'a>(
        &'a self,
        buf: B,
        what: Post<'a>,
        finish: impl FnOnce(Completion, Sge) -> Result<T, Error<P::Error>> + Copy + 'a,
    ) -> impl Future<Output = BufResult<T, B, P::Error>> + 'a {
        let shared = &*self.handle.shared;
        Op {
            shared,
            stage: self.begin(buf, what),
            clock: Clock::default(),
            finish,
        }
    }

    /// The part of an operation done when it is called: the buffer's checks and one
    /// attempt to post (with the request's outcome, if it finished within its post).
    /// A posted request is held by an [`InFlight`] from here on, so a future dropped
    /// before its first poll leaves the buffer with the channel until the device is done.
    #[inline(always)]
    fn begin<'a>(&'a self, buf: B, what: Post<'a>) -> Stage<'a, P, B, DEPTH, SGES> {
        let sge = match buf.sge() {
            Ok(sge) => sge,
            Err(e) => return Stage::Ended(Err(e.into()), buf, Sge::default()),
        };
        if matches!(what, Post::Atomic(..)) && sge.length != 8 {
            let why = "an atomic's local buffer is 8 bytes";
            return Stage::Ended(Err(Error::InvalidAttribute(why)), buf, sge);
        }
        let shared = &*self.handle.shared;
        let mut inner = shared.lock();
        let p = match what.post(&mut inner.ch, sge) {
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

/// An operation under way: what [`send`](AsyncChannel::send), [`write`](AsyncChannel::write)
/// and the others return. Posted when called; it ends with the outcome and the buffer.
/// Dropped once posted, it leaves the buffer with the channel until the device is done
/// with it ([`InFlight`]).
///
/// Written by hand rather than as an `async` block: it holds no timer (a sleeping
/// operation leaves its deadline with the reactor) and no intrusive list node (operations
/// waiting for room leave their waker with the channel), so nothing in it is pinned, and
/// it is small: futures are moved by value at every `.await` and `join!`.
struct Op<'a, P: Provider, B: IoBuf, F, const DEPTH: usize, const SGES: usize> {
    shared: &'a Shared<P, B, DEPTH, SGES>,
    stage: Stage<'a, P, B, DEPTH, SGES>,
    clock: Clock,
    /// Turns the completion into the operation's value (a function without state).
    finish: F,
}

/// Where an operation is, with its buffer's gather entry.
enum Stage<'a, P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    /// Refused, or finished within its post: the outcome and the buffer.
    Ended(Result<Completion, Error<P::Error>>, B, Sge),
    /// The queue was full: posting is tried again once there is room.
    Full(B, Sge, Post<'a>),
    /// Posted: its outcome is awaited, within the channel's timeout.
    Posted(InFlight<'a, P, B, DEPTH, SGES>, Sge),
    /// Timed out: the queue pair is in the error state, and the flush is awaited until the
    /// clock's deadline (now the grace's), after which what is left is discarded.
    Flushing(InFlight<'a, P, B, DEPTH, SGES>, Sge),
    /// The outcome was handed out.
    Done,
}

// No field of an `Op` is ever pinned (it holds no timer and no list node), so it may move.
impl<P: Provider, B: IoBuf, F, const DEPTH: usize, const SGES: usize> Unpin
    for Op<'_, P, B, F, DEPTH, SGES>
{
}

impl<P: Provider, B: IoBuf, T, F, const DEPTH: usize, const SGES: usize> Future
    for Op<'_, P, B, F, DEPTH, SGES>
where
    F: FnOnce(Completion, Sge) -> Result<T, Error<P::Error>> + Copy,
{
    type Output = BufResult<T, B, P::Error>;

    fn poll(self: core::pin::Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // The two common ends here, the rest (room, time-outs, flushes) out of line.
        let Op {
            shared,
            stage,
            clock,
            ..
        } = this;
        match stage {
            // Finished within its post (as a send on an idle link often is).
            Stage::Ended(..) => {
                if let Stage::Ended(r, buf, sge) = core::mem::replace(stage, Stage::Done) {
                    return Poll::Ready(this.hand_out(r, buf, sge));
                }
                unreachable!("the stage was Ended")
            }
            Stage::Posted(op, sge) => match op.step(cx, &mut || clock.deadline(shared)) {
                Poll::Pending => Poll::Pending,
                // The buffer out of the in-flight record, which then holds nothing (its
                // outcome was taken): forgotten, it leaks nothing, and the drop glue of
                // the whole stage is skipped.
                Poll::Ready(Some(r)) => {
                    let (buf, sge) = (op.give_back(), *sge);
                    core::mem::forget(core::mem::replace(stage, Stage::Done));
                    Poll::Ready(this.hand_out(r, buf, sge))
                }
                Poll::Ready(None) => this.poll_rest(cx, Some(Event::Late)),
            },
            _ => this.poll_rest(cx, None),
        }
    }
}

impl<P: Provider, B: IoBuf, T, F, const DEPTH: usize, const SGES: usize>
    Op<'_, P, B, F, DEPTH, SGES>
where
    F: FnOnce(Completion, Sge) -> Result<T, Error<P::Error>> + Copy,
{
    /// [`poll`](Future::poll) past its two common ends: waiting for room, the time-out
    /// and the flush. `first` is what moved the current stage on, if the caller knows.
    #[inline(never)]
    fn poll_rest(
        &mut self,
        cx: &mut TaskContext<'_>,
        mut first: Option<Event<P::Error>>,
    ) -> Poll<BufResult<T, B, P::Error>> {
        loop {
            let Op {
                shared,
                stage,
                clock,
                ..
            } = self;
            let event = match first.take() {
                Some(event) => event,
                None => match stage {
                    Stage::Ended(..) | Stage::Done => Event::Now,
                    Stage::Full(_, sge, what) => match room(shared, clock, *sge, *what, cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(p)) => Event::Posted(p),
                        Poll::Ready(Err(e)) => Event::Ended(Err(e.unwrap_or(Error::Timeout))),
                    },
                    Stage::Posted(op, _) => match op.step(cx, &mut || clock.deadline(shared)) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Some(r)) => Event::Ended(r),
                        Poll::Ready(None) => Event::Late,
                    },
                    Stage::Flushing(op, _) => {
                        match op.step(cx, &mut || clock.deadline(shared)) {
                            Poll::Pending => return Poll::Pending,
                            // Flushed (or finished after all): the bound was missed all
                            // the same.
                            Poll::Ready(Some(_)) => Event::Ended(Err(Error::Timeout)),
                            Poll::Ready(None) => Event::Late,
                        }
                    }
                },
            };
            match (core::mem::replace(stage, Stage::Done), event) {
                (Stage::Ended(r, buf, sge), _) => return Poll::Ready(self.hand_out(r, buf, sge)),
                (Stage::Done, _) => panic!("an operation polled after its outcome"),
                (Stage::Full(buf, sge, _), Event::Posted(p)) => {
                    *stage = Stage::Posted(InFlight::new(shared, p, buf), sge);
                }
                (Stage::Full(buf, sge, _), Event::Ended(r)) => {
                    return Poll::Ready(self.hand_out(r, buf, sge));
                }
                (Stage::Posted(mut op, sge) | Stage::Flushing(mut op, sge), Event::Ended(r)) => {
                    return Poll::Ready(self.hand_out(r, op.give_back(), sge));
                }
                (Stage::Posted(op, sge), Event::Late) => {
                    // Timed out: error state, the flush awaited for the grace, then
                    // whatever is left discarded through RESET; the outcome is `Timeout`,
                    // the buffer free again. A grace past what `Instant` holds is no
                    // bound (as for the blocking calls).
                    let _ = shared.lock().ch.abort();
                    clock.restart(Instant::now().checked_add(shared.config.flush_grace));
                    *stage = Stage::Flushing(op, sge);
                }
                (Stage::Flushing(mut op, sge), Event::Late) => {
                    let e = op.discard().unwrap_or(Error::Timeout);
                    return Poll::Ready(self.hand_out(Err(e), op.give_back(), sge));
                }
                (Stage::Full(..) | Stage::Posted(..) | Stage::Flushing(..), _) => {
                    unreachable!("a waiting stage met an event of another stage")
                }
            }
        }
    }
}

/// What moved an operation on.
enum Event<E> {
    /// Nothing to wait for: the stage holds the outcome (or there is none).
    Now,
    /// Its request was posted (it had waited for room).
    Posted(Pending),
    /// Its outcome.
    Ended(Result<Completion, Error<E>>),
    /// Its deadline passed.
    Late,
}

impl<P: Provider, B: IoBuf, T, F, const DEPTH: usize, const SGES: usize>
    Op<'_, P, B, F, DEPTH, SGES>
where
    F: FnOnce(Completion, Sge) -> Result<T, Error<P::Error>> + Copy,
{
    fn hand_out(
        &mut self,
        r: Result<Completion, Error<P::Error>>,
        buf: B,
        sge: Sge,
    ) -> BufResult<T, B, P::Error> {
        let finish = self.finish;
        (r.and_then(|c| finish(c, sge)), buf)
    }
}

/// One attempt of an operation that found the queue full: its request posted (`Ok`),
/// refused (`Err(Some)`) or out of time (`Err(None)`), or `Pending` with its waker left
/// with the channel (takers wake it; the reactor wakes it at its deadline). The attempt
/// and the registration are made under one lock, so a slot freed in between is not missed.
fn room<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize>(
    shared: &Shared<P, B, DEPTH, SGES>,
    clock: &mut Clock,
    sge: Sge,
    what: Post<'_>,
    cx: &mut TaskContext<'_>,
) -> Poll<Result<Pending, Option<Error<P::Error>>>> {
    let end = clock.deadline(shared);
    let mut inner = shared.lock();
    match what.post(&mut inner.ch, sge) {
        Ok(p) => return Poll::Ready(Ok(p)),
        Err(Error::QueueFull { .. }) => {}
        Err(e) => return Poll::Ready(Err(Some(e))),
    }
    if end.is_some_and(|end| Instant::now() >= end) {
        return Poll::Ready(Err(None));
    }
    if inner.wait_for_space(cx.waker()) {
        if let Some(end) = end {
            inner.space_until = Some(inner.space_until.map_or(end, |u| u.min(end)));
            inner.deadline_set(end);
        }
    } else {
        // The list is full: try again at the runtime's next turn.
        cx.waker().wake_by_ref();
    }
    Poll::Pending
}

/// An operation's deadline: the channel's timeout from the first time it is asked for
/// (the clock is read then), or the flush grace's end once it timed out.
#[derive(Default)]
struct Clock {
    /// `None` until first asked for; then the deadline (`None`: no bound, also for a
    /// timeout past what `Instant` holds).
    deadline: Option<Option<Instant>>,
}

impl Clock {
    fn deadline<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize>(
        &mut self,
        shared: &Shared<P, B, DEPTH, SGES>,
    ) -> Option<Instant> {
        *self.deadline.get_or_insert_with(|| {
            let timeout = shared.config.timeout?;
            Instant::now().checked_add(timeout)
        })
    }

    /// From now on the deadline is `end`.
    fn restart(&mut self, end: Option<Instant>) {
        self.deadline = Some(end);
    }
}

/// Operations that may wait for room at once with their waker left with the channel.
const SPACE_WAITERS: usize = 64;

/// How often a busy-polling operation reads the clock for its timeout (in turns).
const CLOCK_EVERY: u32 = 16;

/// Polls per turn of the runtime while busy polling (a microsecond or two; the lock is
/// let go between them).
const SPINS_PER_TURN: u32 = 1024;

/// Polls at an operation's first poll before it lets the task go on (~2 µs here: a
/// simulated round trip is 0.5–1 µs).
const FIRST_SPINS: u32 = 64;

/// What an operation posts.
#[derive(Clone, Copy)]
enum Post<'a> {
    Receive,
    /// A send, write or read (`remote` checked to hold the buffer first).
    Send(SendOp, Option<&'a RemoteRegion>),
    /// An atomic: the local buffer is 8 bytes.
    Atomic(SendOp, &'a RemoteRegion),
}

impl Post<'_> {
    /// Posts it on `ch` for the buffer `sge` names.
    fn post<P: Provider, const DEPTH: usize, const SGES: usize>(
        self,
        ch: &mut Channel<P, DEPTH, SGES>,
        sge: Sge,
    ) -> Result<Pending, Error<P::Error>> {
        match self {
            Post::Receive => ch.post_receive_pending(sge),
            Post::Send(op, remote) => ch.post_send_pending(sge, op, SendFlags::empty(), remote),
            Post::Atomic(op, remote) => {
                ch.queue_pair().check_atomics()?;
                ch.post_send_pending(sge, op, SendFlags::empty(), Some(remote))
            }
        }
    }
}

/// The outcome of a send, write or read: done.
fn done<E>(_: Completion, _: Sge) -> Result<(), Error<E>> {
    Ok(())
}

/// The outcome of an atomic: the remote value before, which the device wrote into the
/// buffer `sge` names.
fn old_value<E>(_: Completion, sge: Sge) -> Result<u64, Error<E>> {
    // SAFETY: the operation finished, so the device wrote the 8 bytes `sge` names and
    // touches them no more; the buffer owns that memory and nothing else borrows it
    // (`IoBuf`'s contract), so reading them is sound. The read is unaligned-safe.
    Ok(unsafe { (sge.addr as *const u64).read_unaligned() })
}

/// What one poll of an [`InFlight`] found.
enum Step<T> {
    /// The outcome.
    Done(T),
    /// Not yet: poll again at the runtime's next turn (no wake-up is arranged).
    Busy,
    /// Not yet: the reactor wakes the task (its waker and deadline are in the request's
    /// slot).
    Asleep,
    /// Not yet, and the deadline passed.
    Late,
}

/// A posted request and its buffer; dropped unfinished, it leaves the buffer with the
/// channel until the device is done with it.
struct InFlight<'a, P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    shared: &'a Shared<P, B, DEPTH, SGES>,
    /// `Some` until the outcome was taken.
    pending: Option<Pending>,
    /// `Some` until given back or left with the channel.
    buf: Option<B>,
    /// Polls that found it unfinished.
    polls: u32,
}

impl<'a, P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize>
    InFlight<'a, P, B, DEPTH, SGES>
{
    fn new(shared: &'a Shared<P, B, DEPTH, SGES>, pending: Pending, buf: B) -> Self {
        InFlight {
            shared,
            pending: Some(pending),
            buf: Some(buf),
            polls: 0,
        }
    }

    /// The outcome, or `None` once the instant `end` gives (asked at the first poll that
    /// needs it; `None`: no bound) has passed.
    ///
    /// Busy polling comes back at the runtime's next turn by waking its own task
    /// (`wake_by_ref`), not through [`yield_now`](tokio::task::yield_now), whose deferred
    /// wake-up parks the runtime on the I/O driver first.
    fn step(
        &mut self,
        cx: &mut TaskContext<'_>,
        end: &mut impl FnMut() -> Option<Instant>,
    ) -> Poll<Option<Result<Completion, Error<P::Error>>>> {
        let late = match self.poll(cx, end) {
            Step::Done(r) => return Poll::Ready(Some(r)),
            // Busy: the clock every few turns (the first read starts the bound, a few
            // microseconds after the post).
            Step::Busy => {
                let late =
                    self.polls % CLOCK_EVERY == 0 && end().is_some_and(|end| Instant::now() >= end);
                if !late {
                    cx.waker().wake_by_ref();
                }
                late
            }
            Step::Asleep => false,
            Step::Late => true,
        };
        if late {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    fn poll(
        &mut self,
        cx: &mut TaskContext<'_>,
        end: &mut impl FnMut() -> Option<Instant>,
    ) -> Step<Result<Completion, Error<P::Error>>> {
        let Some(pending) = self.pending.as_ref() else {
            return Step::Done(Err(Error::InvalidAttribute("polled after completion")));
        };
        // Busy: a few polls here, then again at the runtime's next turn (busy polling
        // that lets other tasks and the I/O driver run); fewer at the first poll, whose
        // task may have more to post (in a future it has not called yet) before this
        // request can finish. Sleeping: one poll, then the reactor wakes us.
        let spins = match (self.sleeping(), self.polls) {
            (true, _) => 1,
            (false, 0) => FIRST_SPINS,
            (false, _) => SPINS_PER_TURN,
        };
        let mut inner = self.shared.lock();
        for spin in 1..=spins {
            if let Some(r) = inner.finish(pending) {
                self.shared.freed(inner);
                self.pending = None;
                return Step::Done(r);
            }
            if spin < spins {
                drop(inner);
                core::hint::spin_loop();
                inner = self.shared.lock();
            }
        }
        if !self.sleeping() {
            self.polls += 1;
            return Step::Busy;
        }
        // Arm, then poll again: a completion before the arm raises no event.
        if inner.arm() {
            if let Some(r) = inner.finish(pending) {
                self.shared.freed(inner);
                self.pending = None;
                return Step::Done(r);
            }
        }
        // Asleep until the reactor wakes us: on the outcome, or at the deadline.
        let until = end();
        if until.is_some_and(|until| Instant::now() >= until) {
            return Step::Late;
        }
        inner.parked = true;
        inner.slot(pending).waiting = Some(Waiting {
            pending: pending.duplicate(),
            waker: cx.waker().clone(),
            until,
        });
        if let Some(until) = until {
            inner.deadline_set(until);
        }
        Step::Asleep
    }

    /// Whether the operation waits for the reactor now (rather than polling at every turn
    /// of the runtime), by the channel's wait policy.
    fn sleeping(&self) -> bool {
        match self.shared.config.wait {
            WaitPolicy::Spin => false,
            WaitPolicy::SpinYield => self.polls >= BUSY_POLLS,
            _ => true,
        }
    }

    /// After the flush grace: discards what the device still holds through RESET, so the
    /// buffer is free; a fatal error met on the way.
    fn discard(&mut self) -> Option<Error<P::Error>> {
        let mut inner = self.shared.lock();
        let mut fatal = None;
        inner.ch.discard(&mut fatal);
        inner.release_orphans();
        if let Some(p) = self.pending.take() {
            let _ = inner.ch.take_finished(&p);
        }
        // The others' requests ended with this one's (flushed or discarded).
        inner.polled();
        self.shared.freed(inner);
        fatal
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
        // Given back (the common end): nothing is left with the channel.
        if self.buf.is_none() {
            return;
        }
        let (Some(pending), Some(buf)) = (self.pending.take(), self.buf.take()) else {
            return;
        };
        let mut inner = self.shared.lock();
        inner.slot(&pending).waiting = None;
        // The reactor releases the buffer on an event: arm, then look.
        inner.arm();
        let _ = inner.ch.poll_queues();
        inner.polled();
        if inner.ch.take_finished(&pending).is_some() {
            self.shared.freed(inner);
            drop(buf);
        } else {
            inner.parked = true;
            let slot = inner.slot(&pending);
            slot.orphan = Some((pending, buf));
        }
    }
}

/// Polls an operation makes, one per turn of the runtime, before it sleeps until the
/// reactor wakes it, with [`WaitPolicy::SpinYield`] (a few tens of microseconds; with
/// [`WaitPolicy::Spin`] it never sleeps, with [`WaitPolicy::SpinSleep`] at once).
const BUSY_POLLS: u32 = 2;

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Shared<P, B, DEPTH, SGES> {
    /// The lock on the channel. Never held across an `.await` (the guard is not `Send`).
    /// It is not poisoned: a panic while it was held (a bug) leaves the state as it was.
    #[inline(always)]
    fn lock(&self) -> MutexGuard<'_, Inner<P, B, DEPTH, SGES>> {
        self.inner.lock()
    }

    /// Slots came free (outcomes were taken) under `inner`: wakes the operations waiting
    /// for room, if any, and unlocks.
    #[inline(always)]
    fn freed(&self, mut inner: MutexGuard<'_, Inner<P, B, DEPTH, SGES>>) {
        inner.wake_space();
    }

    /// The last handle went: flush what is in flight and let the reactor end.
    fn close(&self) {
        let mut inner = self.lock();
        inner.closing = true;
        if inner.ch.busy() {
            inner.arm();
            let _ = inner.ch.abort();
        }
        if let Some(w) = inner.reactor.take() {
            w.wake();
        }
    }
}

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Inner<P, B, DEPTH, SGES> {
    /// Arms the queues unless they are; whether it armed them now (then the caller polls
    /// again). An arm that fails is reported by the next poll.
    fn arm(&mut self) -> bool {
        if self.on_queues {
            // The channel's reactor, if it sleeps, is woken when a completion is routed to
            // an inbox (one that is awake registers before it sleeps: `needs_events`).
            // Everything pending was routed: the caller polls again.
            if let Some(w) = &self.reactor {
                let _ = self.ch.sleep_task(w);
            }
            return true;
        }
        if self.armed {
            return false;
        }
        self.armed = self.ch.arm_events().is_ok();
        true
    }

    /// Whether anyone waits for an event: a sleeping task, an orphaned buffer, the close.
    fn needs_events(&self) -> bool {
        self.closing
            || self
                .slots
                .iter()
                .flatten()
                .any(|s| s.waiting.is_some() || s.orphan.is_some())
    }

    fn slot(&mut self, p: &Pending) -> &mut Slot<B> {
        &mut self.slots[usize::from(p.is_receive())][p.slot(DEPTH)]
    }

    /// `p`'s outcome if it finished (polling once if not yet).
    #[inline(always)]
    fn finish(&mut self, p: &Pending) -> Option<Result<Completion, Error<P::Error>>> {
        // A failed poll (a dead device) is reported by the reactor's pass and bounded by
        // the timeout: the request is still lent to the device.
        let r = self.ch.try_finish(p);
        if r.is_some() {
            self.slot(p).waiting = None;
        }
        self.polled();
        r
    }

    /// After an operation polled the queues: on shared queues, the completions it took
    /// for other operations of the channel (recorded, not routed through an inbox, so
    /// nothing else wakes them) wake those now. On queues of its own the reactor is woken
    /// by the event every completion after an arm raises, whoever polls it.
    #[inline]
    fn polled(&mut self) {
        if self.on_queues && self.parked && self.wake_finished() {
            self.wake_space();
        }
    }

    /// Wakes the tasks whose requests finished; drops the buffers of orphans that did.
    /// Returns whether an orphan was released (a slot came free).
    fn wake_finished(&mut self) -> bool {
        let Inner { ch, slots, .. } = self;
        let mut parked = false;
        for slot in slots.iter_mut().flatten() {
            if let Some(w) = &slot.waiting {
                if ch.has_finished(&w.pending) {
                    if let Some(w) = slot.waiting.take() {
                        w.waker.wake();
                    }
                } else {
                    parked = true;
                }
            }
            parked |= slot.orphan.is_some();
        }
        self.parked = parked;
        self.release_orphans()
    }

    /// A sleeping operation's deadline: the reactor is woken to set its timer again if
    /// `until` comes before the instant its timer is set to (or it has none). The reactor
    /// reads the deadlines under the same lock before it sleeps, so either it sees this
    /// one or its waker is here to be woken.
    fn deadline_set(&mut self, until: Instant) {
        if self.timer_at.map_or(true, |at| until < at) {
            if let Some(w) = self.reactor.take() {
                w.wake();
            }
        }
    }

    /// Leaves `waker` with the channel until room comes free (once: a waker that would
    /// wake the same task is not added again); false if the list is full.
    fn wait_for_space(&mut self, waker: &Waker) -> bool {
        if self.space.iter().any(|w| w.will_wake(waker)) {
            return true;
        }
        if self.space.len() == SPACE_WAITERS {
            return false;
        }
        self.space.push(waker.clone());
        true
    }

    /// Wakes every operation waiting for room (each tries to post again). Under the lock:
    /// a waker only schedules its task (tokio's never run it in `wake`).
    #[inline]
    fn wake_space(&mut self) {
        if self.space.is_empty() {
            return;
        }
        for w in self.space.drain(..) {
            w.wake();
        }
    }

    /// The earliest deadline of a sleeping operation (in a slot, or waiting for space).
    fn next_deadline(&self) -> Option<Instant> {
        let slots = self.slots.iter().flatten();
        let untils = slots.filter_map(|s| s.waiting.as_ref().and_then(|w| w.until));
        untils.chain(self.space_until).min()
    }

    /// Wakes the operations whose deadline passed by `now`: sleepers in slots, and, once
    /// the earliest of their deadlines passed, every operation waiting for space (each
    /// looks at its own deadline and at the queue; those not late wait again).
    fn wake_late(&mut self, now: Instant) {
        for slot in self.slots.iter_mut().flatten() {
            if slot
                .waiting
                .as_ref()
                .is_some_and(|w| w.until.is_some_and(|u| u <= now))
            {
                if let Some(w) = slot.waiting.take() {
                    w.waker.wake();
                }
            }
        }
        if self.space_until.is_some_and(|u| u <= now) {
            self.space_until = None;
            self.wake_space();
        }
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
