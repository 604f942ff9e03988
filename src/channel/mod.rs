//! `Channel`: one reliable-connected peer, at three levels; or, over an
//! unreliable-datagram queue pair (`Channel<P, DEPTH, SGES, Ud>`, made by
//! [`Channel::datagram`]), any peer per message, at the same levels ([`Op::datagram`]).
//!
//! - **Blocking**: [`send`](Channel::send), [`receive`](Channel::receive),
//!   [`write`](Channel::write), [`read`](Channel::read), the `_with_imm` forms and the
//!   atomics post one work request and wait for its completion.
//! - **Scoped**: [`scope`](Channel::scope) posts many work requests as doorbell batches,
//!   borrows their buffers, and does not return before all of them completed; the first
//!   error of any of them is returned. A [`Batch`] of requests built and checked once is
//!   posted there as one chain, again and again ([`Scope::post_batch`]).
//! - **Unpolled** (`unsafe`): [`post_send_unpolled`](Channel::post_send_unpolled) and
//!   friends return a [`Pending`] handle; the caller keeps the buffers alive until the
//!   handle is redeemed, once, by [`wait`](Channel::wait) or a successful
//!   [`try_complete`](Channel::try_complete) on the channel that posted it (another
//!   channel refuses it with [`Error::ForeignPending`]).
//!
//! Each channel owns a queue pair, a send and a receive completion queue, and two rings of
//! `DEPTH` slots whose work requests hold `SGES` scatter/gather entries. After setup nothing on
//! these paths allocates.
//!
//! ```
//! use zverbs::provider::sim::Sim;
//! use zverbs::{Channel, ChannelConfig, Context};
//! let sim = Sim::with_devices(2);
//! let (ca, cb) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
//! let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
//! let a = Channel::<Sim>::prepare(&ca, &pa, &ChannelConfig::default()).unwrap();
//! let b = Channel::<Sim>::prepare(&cb, &pb, &ChannelConfig::default()).unwrap();
//! let (ea, eb) = (a.endpoint(), b.endpoint());
//! let (mut a, mut b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
//!
//! let (mut src, mut dst) = (*b"hello, rdma!", [0u8; 16]);
//! let src = pa.register(&mut src).unwrap();
//! let mut dst = pb.register(&mut dst).unwrap();
//! std::thread::scope(|t| {
//!     t.spawn(|| a.send([src.slice(..).unwrap()]).unwrap());
//!     let got = b.receive([dst.slice_mut(..).unwrap()]).unwrap();
//!     assert_eq!(got.byte_len, 12);
//! });
//! assert_eq!(&dst.as_slice()[..12], b"hello, rdma!");
//! ```
//!
//! A complete two-thread exchange is in `examples/pingpong.rs`.

mod batch;
mod blocking;
mod datagram;
#[cfg(all(feature = "tokio", unix))]
mod event_loop;
mod op;
mod path;
mod poll;
mod post;
mod prepared;
mod rx;
mod scope;
mod source;
mod unpolled;
pub(crate) mod wait;

pub use wait::WaitPolicy;

pub use batch::Batch;
#[cfg(feature = "tokio")]
pub(crate) use op::Lent;
pub use op::{AtomicResult, Destination, Inline, Local, Op, Owned, Slices};
pub use prepared::PreparedChannel;
pub use rx::{ChannelTransport, HasOwnRx, OwnRx, RxSide, SrqRx};
pub use scope::{PostedReceive, Scope};

use core::sync::atomic::{AtomicUsize, Ordering};
use core::time::Duration;

use crate::device::{Context, ProtectionDomain};
#[cfg(feature = "std")]
use crate::dispatch::SharedCompletionQueue;
use crate::error::{CompletionError, Error};
use crate::mr::{LocalSlice, LocalSliceMut, RemoteRegion};
use crate::provider::Provider;
use crate::qp::{
    Connected, InitOptions, QpConfig, QueuePair, Rc, ReadyToSend, RtrOptions, RtsOptions,
};
use crate::ring::{Completion, Ring, WorkRequest};
use crate::types::{RecvWr, SendFlags, SendOp, Sge, WorkCompletion};
use source::{Completions, OneWc, Record};
#[cfg(feature = "std")]
use std::sync::Arc;
use wait::Waiter;

/// Settings of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    /// Queue pair settings. The queue depths and SGE counts are set from the channel's `DEPTH`
    /// and `SGES`; the rest is used as given.
    pub qp: QpConfig,
    /// RESET → INIT attributes.
    pub init: InitOptions,
    /// INIT → RTR attributes.
    pub rtr: RtrOptions,
    /// RTR → RTS attributes.
    pub rts: RtsOptions,
    /// How long one call (a blocking call, a scope, a collective) waits for completions in
    /// all; `None` waits forever.
    pub timeout: Option<Duration>,
    /// After a timeout, how much longer the call waits for the device to flush the work it
    /// gave up before it discards that work by moving the queue pair to RESET. A call
    /// returns within `timeout + flush_grace` (plus the time of the verbs it calls), also
    /// when the local device died.
    pub flush_grace: Duration,
    /// How the channels of a [`MultiChannel`](crate::MultiChannel) (and so of a
    /// [`Node`](crate::node::Node)) get their completion queues. A channel made alone with
    /// [`Channel::prepare`] has its own; [`Channel::prepare_shared`] names the shared ones.
    pub completion_queues: CqLayout,
    /// What a waiting thread does once its first polls found nothing: spin, yield
    /// (default), or sleep on a completion channel. Every policy is bounded by `timeout`
    /// plus `flush_grace`.
    pub wait: WaitPolicy,
}

/// Where the channels of a multi-peer object take their completions from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CqLayout {
    /// One send and one receive completion queue for all peers, routed to each channel by
    /// the lock-free [dispatcher](crate::dispatch) (with `std`; without it, per channel).
    #[default]
    Shared,
    /// Two completion queues per channel.
    PerChannel,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            qp: QpConfig::default(),
            init: InitOptions::default(),
            rtr: RtrOptions::default(),
            rts: RtsOptions::default(),
            timeout: Some(Duration::from_secs(10)),
            flush_grace: Duration::from_millis(100),
            completion_queues: CqLayout::Shared,
            wait: WaitPolicy::SpinYield,
        }
    }
}

/// A channel's configuration as it keeps it: with `std`, one copy shared by the channels of
/// a [`MultiChannel`](crate::MultiChannel) (a node of many peers holds it once, not once
/// per peer); without, inline.
#[cfg(feature = "std")]
pub(crate) type Config = std::sync::Arc<ChannelConfig>;
#[cfg(not(feature = "std"))]
pub(crate) type Config = ChannelConfig;

/// `config` as a channel keeps it ([`Config`]).
pub(crate) fn config_of(config: &ChannelConfig) -> Config {
    #[cfg(feature = "std")]
    return std::sync::Arc::new(*config);
    #[cfg(not(feature = "std"))]
    *config
}

/// One RC peer (or, with `T` = [`Ud`](crate::qp::Ud), datagrams to any). `DEPTH` work
/// requests may be in flight per direction; each holds up to `SGES` scatter/gather
/// entries. See the module docs.
pub struct Channel<
    P: Provider,
    const DEPTH: usize = 64,
    const SGES: usize = 4,
    T: ChannelTransport = Rc,
> {
    owner: Owner,
    qp: QueuePair<P, ReadyToSend, T>,
    send_cq: Completions<P>,
    sq: Ring<P::SendEntry<SGES>, DEPTH>,
    /// The receive ring and its completions; nothing on a shared receive queue.
    rx: T::Rx<P, DEPTH, SGES>,
    config: Config,
    /// Where a poll for one completion from a shared queue's inbox lands (a queue of the
    /// channel's own: on the poller's stack, in the provider's layout).
    wc: WorkCompletion,
}

/// Completions taken from a completion queue per poll.
const POLL_BATCH: usize = 16;

/// Which queue a [`Pending`] work request is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queue {
    Send,
    Recv,
}

/// Which channel posted a [`Pending`]: unique among the channels of this process (a
/// counter drawn at [`Channel::prepare`], kept across [`Channel::reset`]). Queue pair
/// numbers are not enough: two devices, or a queue pair destroyed and created again, may
/// give the same number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner(usize);

impl Owner {
    fn next() -> Owner {
        // Identity only, not synchronization: any ordering gives distinct values.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Owner(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Work posted by an unpolled call, redeemable once, on the channel that posted it.
///
/// Redeem it with [`Channel::wait`], or poll with [`Channel::try_complete`], which hands it
/// back while the work is still in flight. Both consume the handle, so completed work
/// cannot be waited for again. Given to another channel, the handle is refused with
/// [`Error::ForeignPending`] and that channel's own work is left alone; check with
/// [`Channel::owns`] first if handles of several channels are mixed.
///
/// A handle that is dropped unredeemed (or refused by a channel that did not post it)
/// keeps its ring slot busy: the ring retires slots in order, so its queue fills up after
/// at most `DEPTH` more posts. Its buffers stay lent to the device.
#[must_use = "unpolled work must be waited for; its slot stays busy until then"]
#[derive(Debug, PartialEq, Eq)]
pub struct Pending {
    seq: u64,
    queue: Queue,
    by: PostedBy,
}

/// Who posted a [`Pending`]: the channel, and its local queue pair then (for messages: a
/// channel's may change on reset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PostedBy {
    owner: Owner,
    qp_num: u32,
}

impl Pending {
    /// The `wr_id` of the work request.
    pub fn wr_id(&self) -> u64 {
        self.seq
    }

    /// The number of the local queue pair the work was posted on.
    pub fn qp_num(&self) -> u32 {
        self.by.qp_num
    }
}

impl<P: Provider, const DEPTH: usize, const SGES: usize> Channel<P, DEPTH, SGES> {
    /// Creates the queue pair and two completion queues of its own, and moves the queue
    /// pair to INIT.
    pub fn prepare(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: &ChannelConfig,
    ) -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>> {
        Self::prepare_with(ctx, pd, config_of(config))
    }

    /// As [`prepare`](Self::prepare), keeping `config` as given (shared).
    pub(crate) fn prepare_with(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: Config,
    ) -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>> {
        let depth = Self::depth()?;
        let events = config.wait == WaitPolicy::SpinSleep;
        let send_cq = Completions::own(ctx, depth, events)?;
        let recv_cq = Completions::own(ctx, depth, events)?;
        Self::prepare_on(ctx, pd, config, send_cq, recv_cq, Ring::new(), Ring::new())
    }

    /// Creates the queue pair on completion queues shared with other channels (sends
    /// complete on `send`, receives on `recv`; the two may be one queue), and moves it to
    /// INIT. The channel takes one inbox of each queue for as long as it lives; a queue
    /// with no free inbox, or made for shallower channels than `DEPTH`, is an
    /// [`Error::InvalidAttribute`]. See [`crate::dispatch`].
    #[cfg(feature = "std")]
    pub fn prepare_shared(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: &ChannelConfig,
        send: &Arc<SharedCompletionQueue<P>>,
        recv: &Arc<SharedCompletionQueue<P>>,
    ) -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>> {
        Self::prepare_shared_with(ctx, pd, config_of(config), send, recv)
    }

    /// As [`prepare_shared`](Self::prepare_shared), keeping `config` as given (shared).
    #[cfg(feature = "std")]
    pub(crate) fn prepare_shared_with(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: Config,
        send: &Arc<SharedCompletionQueue<P>>,
        recv: &Arc<SharedCompletionQueue<P>>,
    ) -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>> {
        Self::depth()?;
        let (mut sq, mut rq) = (Ring::new(), Ring::new());
        let send_cq = Completions::attach(send, &mut sq)?;
        let recv_cq = Completions::attach(recv, &mut rq)?;
        Self::prepare_on(ctx, pd, config, send_cq, recv_cq, sq, rq)
    }

    fn depth() -> Result<u32, Error<P::Error>> {
        match (u32::try_from(DEPTH), u32::try_from(SGES)) {
            (Ok(depth), Ok(_)) => Ok(depth),
            _ => Err(Error::InvalidAttribute("channel capacity too large")),
        }
    }

    /// The queue pair settings of `config`, with the depths and SGE counts the channel's.
    fn qp_config(config: &ChannelConfig) -> QpConfig {
        let mut qp_cfg = config.qp;
        qp_cfg.caps.max_send_wr = DEPTH as u32;
        qp_cfg.caps.max_recv_wr = DEPTH as u32;
        qp_cfg.caps.max_send_sge = SGES as u32;
        qp_cfg.caps.max_recv_sge = SGES as u32;
        qp_cfg
    }

    fn prepare_on(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: Config,
        send_cq: Completions<P>,
        recv_cq: Completions<P>,
        sq: Ring<P::SendEntry<SGES>, DEPTH>,
        rq: Ring<RecvWr<SGES>, DEPTH>,
    ) -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>> {
        let qp_cfg = Self::qp_config(&config);
        let qp = QueuePair::create(ctx, pd, send_cq.queue(), recv_cq.queue(), &qp_cfg)?;
        let qp = qp.into_init(&config.init).map_err(|e| e.error)?;
        Ok(PreparedChannel {
            owner: Owner::next(),
            qp,
            send_cq,
            sq,
            rx: OwnRx {
                cq: recv_cq,
                ring: rq,
            },
            config,
        })
    }
}

#[cfg(feature = "std")]
impl<P: Provider, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, crate::qp::RcOnSrq>
{
    /// Creates a queue pair that takes its receives from `srq`'s SRQ (completing on its
    /// queue) and its sends' completions from the inbox it takes on `send`, or from a queue
    /// of its own; moves it to INIT. The channel holds `srq` for as long as its queue pair
    /// lives.
    pub(crate) fn prepare_on_srq_with(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: Config,
        send: Option<&Arc<SharedCompletionQueue<P>>>,
        srq: &Arc<crate::srq::Backend<P>>,
    ) -> Result<PreparedChannel<P, DEPTH, SGES, crate::qp::RcOnSrq>, Error<P::Error>> {
        let depth = Channel::<P, DEPTH, SGES>::depth()?;
        let mut sq = Ring::new();
        let send_cq = match send {
            Some(send) => Completions::attach(send, &mut sq)?,
            None => Completions::own(ctx, depth, config.wait == WaitPolicy::SpinSleep)?,
        };
        let qp_cfg = Channel::<P, DEPTH, SGES>::qp_config(&config);
        let qp = QueuePair::create_on_srq(ctx, pd, send_cq.queue(), &srq.cq, &srq.srq, &qp_cfg)?;
        let qp = qp.into_init(&config.init).map_err(|e| e.error)?;
        Ok(PreparedChannel {
            owner: Owner::next(),
            qp,
            send_cq,
            sq,
            rx: SrqRx { _keep: srq.clone() },
            config,
        })
    }
}

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Whether the channel's completion queues are shared with other channels.
    pub fn shares_completion_queues(&self) -> bool {
        self.send_cq.is_shared()
    }

    /// The queue pair.
    pub fn queue_pair(&self) -> &QueuePair<P, ReadyToSend, T> {
        &self.qp
    }

    /// Work requests not yet retired on the send and receive queues: in flight, or
    /// finished with an outcome not yet taken, and every request posted after the oldest
    /// of those (a ring gives its slots back in order). Their ring slots are taken; a
    /// ring of `DEPTH` has room for `DEPTH` minus this.
    pub fn in_flight(&self) -> (usize, usize) {
        (
            self.sq.in_flight(),
            self.rx.ring().map_or(0, |r| r.in_flight()),
        )
    }

    /// Closes the channel, lingering like `SO_LINGER`: waits at most `timeout` for every
    /// send already posted (blocking calls and scopes have none left; unpolled ones may) to
    /// be acknowledged by the peer's device or to fail, then destroys the queue pair.
    /// Sends still unacknowledged then are ended as a timed-out wait ends its work (ERR,
    /// the [`flush_grace`](ChannelConfig::flush_grace), RESET) and reported as
    /// [`Error::Undrained`]. Receives still posted are discarded: nothing arrives into
    /// them once the queue pair is gone. Dropping a channel does not linger.
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{Channel, ChannelConfig, Context};
    /// # use std::time::Duration;
    /// # let p = zverbs::testing::Pair::<64, 4>::connected(&ChannelConfig::default()).unwrap();
    /// # let (pa, pb, a, b) = (p.a.pd, p.b.pd, p.a.ch, p.b.ch);
    /// a.close(Duration::from_secs(1)).unwrap(); // nothing in flight: returns at once
    /// # drop(b);
    /// ```
    pub fn close(mut self, timeout: Duration) -> Result<(), Error<P::Error>> {
        let mut waiter = Waiter::new(Some(timeout), self.config.flush_grace);
        self.drain_sends(&mut waiter)
    }

    /// The lingering part of [`close`](Self::close), within the bound of `waiter`.
    pub(crate) fn drain_sends(&mut self, waiter: &mut Waiter) -> Result<(), Error<P::Error>> {
        waiter.rearm();
        while self.sq.has_pending() {
            match self.poll(Queue::Send) {
                Ok(0) if !self.pause(Queue::Send, waiter) => break,
                Ok(_) => {}
                Err(e) => return Err(self.quiesce(waiter, e)),
            }
        }
        match self.sq.pending_count() {
            0 => Ok(()),
            sends => {
                crate::trace::event!(
                    debug,
                    qp = self.qp.qp_num(),
                    sends,
                    "linger: sends unacknowledged at the close's bound"
                );
                Err(self.quiesce(waiter, Error::Undrained { sends }))
            }
        }
    }
}

impl<P: Provider, T: ChannelTransport + Connected, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Tears the connection down so the channel can connect again (to the same peer after
    /// a failure, or to another): moves the queue pair to the error state, waits at most
    /// [`ChannelConfig::flush_grace`] for every outstanding request to be flushed (then
    /// discards the rest through RESET, see the [guarantees](crate#guarantees)), and
    /// resets it to INIT. Outcomes not yet taken stay available to their [`Pending`]
    /// handles. On a dead device it fails with an error of kind
    /// [`DeviceFatal`](crate::ErrorKind::DeviceFatal), after ending the work in flight.
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{Channel, ChannelConfig, Context, QpState};
    /// # let p = zverbs::testing::Pair::<64, 4>::connected(&ChannelConfig::default()).unwrap();
    /// # let (pa, pb, a, b) = (p.a.pd, p.b.pd, p.a.ch, p.b.ch);
    /// a.queue_pair().set_error().unwrap(); // say the link failed
    /// let (a, b) = (a.reset().unwrap(), b.reset().unwrap());
    /// let (ea, eb) = (a.endpoint(), b.endpoint());
    /// let (a, _b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    /// assert_eq!(a.queue_pair().state().unwrap(), QpState::ReadyToSend);
    /// ```
    pub fn reset(mut self) -> Result<PreparedChannel<P, DEPTH, SGES, T>, Error<P::Error>> {
        let mut waiter = Waiter::new(Some(Duration::ZERO), self.config.flush_grace);
        let e = self.quiesce(&mut waiter, Error::Timeout);
        if e.kind() == crate::error::ErrorKind::DeviceFatal {
            return Err(e);
        }
        let qp = self.qp.reset().map_err(|e| e.error)?;
        let qp = qp.into_init(&self.config.init).map_err(|e| e.error)?;
        Ok(PreparedChannel {
            // The same owner: handles posted before the reset stay redeemable here.
            owner: self.owner,
            qp,
            send_cq: self.send_cq,
            sq: self.sq,
            rx: self.rx,
            config: self.config,
        })
    }
}
