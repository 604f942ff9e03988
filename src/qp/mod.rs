//! Typestate queue pairs: RESET → INIT → RTR → RTS, checked by the compiler.
//!
//! `QueuePair<P, St>` carries its state `St` in the type. Transitions consume the queue pair
//! and hand it back in the new state, or, on failure, in the old state together with the
//! error ([`TransitionError`]). Sends can be posted only on [`ReadyToSend`]; receives from
//! [`Init`] on. The device may still move a queue pair to the error state at any time: that
//! is visible at run time through [`QueuePair::state`] and errors on post and poll, and
//! [`QueuePair::reset`] leads back to [`Reset`].
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::provider::sim::Sim;
//! use zverbs::qp::{QpConfig, QueuePair, InitOptions, RtrOptions, RtsOptions};
//! use zverbs::{CompletionQueue, Context, QpState};
//! let sim = Sim::with_devices(2);
//! let make = |name| {
//!     let ctx = Context::open(&sim, name).unwrap();
//!     let pd = ctx.alloc_pd().unwrap();
//!     let cq = CompletionQueue::create(&ctx, 16).unwrap();
//!     let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
//!     (ctx, pd, cq, qp.into_init(&InitOptions::default()).unwrap())
//! };
//! let (_c1, _p1, _q1, a) = make("sim0");
//! let (_c2, _p2, _q2, b) = make("sim1");
//! let (ea, eb) = (a.endpoint(), b.endpoint());
//! let a = a.into_rtr(&eb, &RtrOptions::default()).unwrap().into_rts(&RtsOptions::default()).unwrap();
//! let b = b.into_rtr(&ea, &RtrOptions::default()).unwrap();
//! assert_eq!(a.state().unwrap(), QpState::ReadyToSend);
//! assert_eq!(b.state().unwrap(), QpState::ReadyToReceive);
//! // Where its path starts: `QpConfig::default()`'s port and GID index.
//! assert_eq!((a.port(), a.gid_index()), (1, 0));
//! // The peer it is connected to (the rest of the path lives in the device: `path()`).
//! assert_eq!(a.peer_qp_num(), Some(eb.qp_num));
//! # }
//! ```

mod endpoint;
mod options;
mod ud;

pub use endpoint::{
    Endpoint, EndpointError, ENDPOINT_LEN, ENDPOINT_MAGIC, ENDPOINT_VERSION, MAX_24BIT,
};
pub use options::{InitOptions, QpConfig, RtrOptions, RtsOptions, MAX_FLOW_LABEL, MAX_SL};
pub use ud::{reply_path, sender_gid, AddressHandle, UdOptions, GRH_BYTES};

use core::fmt;
use core::marker::PhantomData;

use crate::cq::CompletionQueue;
use crate::device::{Context, ProtectionDomain};
use crate::error::{verb, within, Error};
pub use crate::provider::PathAttr;
use crate::provider::{InitAttr, PostError, Provider, RtrAttr, RtsAttr, Transition};
use crate::srq::SharedReceiveQueue;
use crate::types::{AtomicCap, QpState, QpType, RecvWr, SendWr};

mod sealed {
    pub trait Sealed {}
}

/// A queue pair state known at compile time. Sealed: the four below are all there is.
pub trait State: sealed::Sealed {}

/// Just created or reset.
#[derive(Debug)]
pub enum Reset {}
/// Initialised: receives may be posted.
#[derive(Debug)]
pub enum Init {}
/// Ready to receive: connected to a peer.
#[derive(Debug)]
pub enum ReadyToReceive {}
/// Ready to send.
#[derive(Debug)]
pub enum ReadyToSend {}

impl sealed::Sealed for Reset {}
impl sealed::Sealed for Init {}
impl sealed::Sealed for ReadyToReceive {}
impl sealed::Sealed for ReadyToSend {}
impl State for Reset {}
impl State for Init {}
impl State for ReadyToReceive {}
impl State for ReadyToSend {}

/// A state in which receives may be posted: [`Init`] and after. Sealed.
pub trait Receiving: State {}
impl Receiving for Init {}
impl Receiving for ReadyToReceive {}
impl Receiving for ReadyToSend {}

/// A queue pair's transport, known at compile time. Sealed: [`Rc`], [`RcOnSrq`] and
/// [`Ud`] are all there is. The states and posting are the same for all; creation and the
/// transitions differ (a UD queue pair has a Q_Key and no peer), and a queue pair on a
/// shared receive queue has no receive queue of its own.
pub trait Transport: sealed::Sealed {
    /// The provider's name for it.
    const TYPE: QpType;
}

/// A connected transport: one peer, reached through INIT, RTR and RTS with its endpoint.
/// Sealed: [`Rc`] and [`RcOnSrq`].
pub trait Connected: Transport {}

/// A transport whose queue pair has its own receive queue ([`QueuePair::post_recv`]).
/// Sealed: [`Rc`] and [`Ud`].
pub trait OwnReceiveQueue: Transport {}

/// Reliable connected: one peer, acknowledged, in order (the default).
#[derive(Clone, Copy, Debug)]
pub enum Rc {}
/// Reliable connected, taking its receives from a shared receive queue
/// ([`QueuePair::create_on_srq`]): receives are posted to the queue, not to it.
#[derive(Clone, Copy, Debug)]
pub enum RcOnSrq {}
/// Unreliable datagram: any peer per message, one packet each, no acknowledgement.
#[derive(Clone, Copy, Debug)]
pub enum Ud {}

impl sealed::Sealed for Rc {}
impl sealed::Sealed for RcOnSrq {}
impl sealed::Sealed for Ud {}
impl Transport for Rc {
    const TYPE: QpType = QpType::Rc;
}
impl Transport for RcOnSrq {
    const TYPE: QpType = QpType::Rc;
}
impl Transport for Ud {
    const TYPE: QpType = QpType::Ud;
}
impl Connected for Rc {}
impl Connected for RcOnSrq {}
impl OwnReceiveQueue for Rc {}
impl OwnReceiveQueue for Ud {}

/// An unreliable-datagram queue pair in state `St`.
pub type UdQueuePair<P, St> = QueuePair<P, St, Ud>;

/// Why an atomic is refused on a device that does none.
pub(crate) const NO_ATOMICS: &str = "remote atomics (the device's atomic_cap is NONE)";

/// A queue pair of transport `T` (RC unless said) in state `St`. See the module docs.
pub struct QueuePair<P: Provider, St: State, T: Transport = Rc> {
    raw: P::Qp,
    local: Endpoint,
    /// The connected peer's queue pair number, or [`NO_PEER`] before RTR and after a reset.
    /// The rest of the peer's endpoint lives in the device ([`QueuePair::path`]).
    peer_qp_num: u32,
    /// Its physical port and the GID table index of its path, from [`QpConfig`] (a
    /// connection manager may choose the index). The rest of the creation settings lives
    /// in the device, not here: a node of a large world holds many queue pairs.
    port: u8,
    gid_index: u8,
    device: DeviceLimits,
    _state: PhantomData<(St, T)>,
}

/// No connected peer: queue pair numbers are 24 bits ([`into_rtr`](QueuePair::into_rtr)
/// checks the peer's), so this one is never a peer's.
const NO_PEER: u32 = u32::MAX;

/// What a queue pair keeps of its device's attributes, to check its transitions and
/// operations against.
#[derive(Clone, Copy, Debug)]
struct DeviceLimits {
    /// `max_qp_rd_atom`, saturated to the `u8` of `max_dest_rd_atomic`.
    rd_atom: u8,
    /// `max_qp_init_rd_atom`, saturated to the `u8` of `max_rd_atomic`.
    init_rd_atom: u8,
    atomic_cap: AtomicCap,
}

/// A failed transition: the queue pair, still in its old state, and why.
pub struct TransitionError<P: Provider, St: State, T: Transport = Rc> {
    /// The queue pair, unchanged.
    pub qp: QueuePair<P, St, T>,
    /// Why the transition failed.
    pub error: Error<P::Error>,
}

impl<P: Provider, St: State, T: Transport> fmt::Debug for TransitionError<P, St, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransitionError")
            .field("qp", &self.qp)
            .field("error", &self.error)
            .finish()
    }
}

impl<P: Provider, St: State, T: Transport> fmt::Display for TransitionError<P, St, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "queue pair {:#x} transition failed: {}",
            self.local_qp_num(),
            self.error
        )
    }
}

impl<P: Provider, St: State, T: Transport> TransitionError<P, St, T> {
    fn local_qp_num(&self) -> u32 {
        self.qp.local.qp_num
    }
}

impl<P: Provider, St: State, T: Transport> core::error::Error for TransitionError<P, St, T> {}

impl<P: Provider, St: State, T: Transport> fmt::Debug for QueuePair<P, St, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("state", &core::any::type_name::<St>())
            .field("local", &self.local)
            .field("peer_qp_num", &self.peer_qp_num())
            .finish()
    }
}

fn check(ok: bool, why: &'static str) -> Result<(), &'static str> {
    if ok {
        Ok(())
    } else {
        Err(why)
    }
}

impl<P: Provider, T: Transport> QueuePair<P, Reset, T> {
    fn create_of(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        send_cq: &CompletionQueue<P>,
        recv_cq: &CompletionQueue<P>,
        srq: Option<&SharedReceiveQueue<P>>,
        config: &QpConfig,
    ) -> Result<Self, Error<P::Error>> {
        if let Some(psn) = config.psn {
            check(psn <= MAX_24BIT, "psn exceeds 24 bits").map_err(Error::InvalidAttribute)?;
        }
        let dev = ctx.query_device()?;
        let caps = &config.caps;
        let max_wr = u64::from(dev.max_qp_wr);
        within("caps.max_send_wr", caps.max_send_wr.into(), max_wr)?;
        within("caps.max_recv_wr", caps.max_recv_wr.into(), max_wr)?;
        within(
            "caps.max_send_sge",
            caps.max_send_sge.into(),
            dev.max_sge.into(),
        )?;
        within(
            "caps.max_recv_sge",
            caps.max_recv_sge.into(),
            dev.max_sge.into(),
        )?;
        let port = ctx.query_port(config.port)?;
        let gid = ctx.query_gid(config.port, config.gid_index)?;
        let raw = verb(
            "ibv_create_qp",
            P::create_qp(
                &pd.raw,
                &send_cq.raw,
                &recv_cq.raw,
                srq.map(SharedReceiveQueue::raw),
                &config.caps,
                T::TYPE,
            ),
        )?;
        let qp_num = P::qp_num(&raw);
        // A fixed, qpn-derived PSN keeps runs reproducible; users who want random PSNs
        // set `QpConfig::psn`.
        let psn = config
            .psn
            .unwrap_or(qp_num.wrapping_mul(0x9E37_79B1) & MAX_24BIT);
        Ok(QueuePair {
            raw,
            local: Endpoint {
                qp_num,
                psn,
                lid: port.lid,
                gid,
                mtu: port.active_mtu,
            },
            peer_qp_num: NO_PEER,
            port: config.port,
            gid_index: config.gid_index,
            device: DeviceLimits {
                rd_atom: u8::try_from(dev.max_qp_rd_atom).unwrap_or(u8::MAX),
                init_rd_atom: u8::try_from(dev.max_qp_init_rd_atom).unwrap_or(u8::MAX),
                atomic_cap: dev.atomic_cap,
            },
            _state: PhantomData,
        })
    }
}

impl<P: Provider> QueuePair<P, Reset> {
    /// Creates an RC queue pair whose sends complete on `send_cq` and receives on
    /// `recv_cq`.
    pub fn create(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        send_cq: &CompletionQueue<P>,
        recv_cq: &CompletionQueue<P>,
        config: &QpConfig,
    ) -> Result<Self, Error<P::Error>> {
        Self::create_of(ctx, pd, send_cq, recv_cq, None, config)
    }
}

impl<P: Provider> QueuePair<P, Reset, RcOnSrq> {
    /// Creates an RC queue pair that takes its receives from `srq`: its receive
    /// completions arrive on `recv_cq`, naming it by `qp_num`; its own receive capacities
    /// (`config.caps`) are not used. It has no `post_recv`: its receives are posted to
    /// `srq` ([`SharedReceiveQueue::post_recv`]).
    pub fn create_on_srq(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        send_cq: &CompletionQueue<P>,
        recv_cq: &CompletionQueue<P>,
        srq: &SharedReceiveQueue<P>,
        config: &QpConfig,
    ) -> Result<Self, Error<P::Error>> {
        Self::create_of(ctx, pd, send_cq, recv_cq, Some(srq), config)
    }
}

impl<P: Provider, T: Connected> QueuePair<P, Reset, T> {
    /// RESET → INIT.
    pub fn into_init(
        self,
        opts: &InitOptions,
    ) -> Result<QueuePair<P, Init, T>, TransitionError<P, Reset, T>> {
        let attr = InitAttr {
            port: self.port,
            pkey_index: opts.pkey_index,
            access: opts.access,
        };
        self.transition(Ok(Transition::Init(attr)))
    }
}

impl<P: Provider, T: Connected> QueuePair<P, Init, T> {
    /// Takes what a connection manager decided for this side before RTR: the source GID's
    /// index and the first packet sequence number this side sends.
    #[cfg(all(feature = "std", unix))]
    pub(crate) fn take_path(&mut self, sgid_index: u8, psn: u32) {
        self.gid_index = sgid_index;
        self.local.psn = psn & MAX_24BIT;
    }

    /// INIT → RTR: connects to the peer at `remote`.
    pub fn into_rtr(
        self,
        remote: &Endpoint,
        opts: &RtrOptions,
    ) -> Result<QueuePair<P, ReadyToReceive, T>, TransitionError<P, Init, T>> {
        let attr = check(remote.qp_num <= MAX_24BIT, "remote qp_num exceeds 24 bits")
            .and(check(remote.psn <= MAX_24BIT, "remote psn exceeds 24 bits"))
            .and(check(opts.min_rnr_timer <= 31, "min_rnr_timer exceeds 31"))
            .and(check(opts.sl <= MAX_SL, "sl exceeds 15"))
            .and(check(
                opts.flow_label <= MAX_FLOW_LABEL,
                "flow_label exceeds 20 bits",
            ))
            .map_err(Error::InvalidAttribute)
            .and_then(|()| {
                let rd_atom = u64::from(opts.max_dest_rd_atomic);
                within(
                    "rtr.max_dest_rd_atomic",
                    rd_atom,
                    self.device.rd_atom.into(),
                )?;
                // Both ports' active MTUs bound the path (the peer's, as its endpoint says).
                let common = self.local.mtu.min(remote.mtu);
                if let Some(asked) = opts.mtu {
                    within("rtr.mtu", asked.bytes().into(), common.bytes().into())?;
                }
                Ok(Transition::Rtr(RtrAttr {
                    path_mtu: opts.mtu.unwrap_or(common),
                    dest_qp_num: remote.qp_num,
                    rq_psn: remote.psn,
                    max_dest_rd_atomic: opts.max_dest_rd_atomic,
                    min_rnr_timer: opts.min_rnr_timer,
                    dlid: remote.lid,
                    dgid: (remote.gid.0 != [0; 16]).then_some(remote.gid),
                    sgid_index: self.gid_index,
                    port: self.port,
                    sl: opts.sl,
                    traffic_class: opts.traffic_class,
                    flow_label: opts.flow_label,
                    hop_limit: opts.hop_limit,
                }))
            });
        self.transition(attr).map(|mut qp| {
            qp.peer_qp_num = remote.qp_num;
            qp
        })
    }
}

impl<P: Provider, T: Connected> QueuePair<P, ReadyToReceive, T> {
    /// The path and connection attributes the device applied (`ibv_query_qp`): the
    /// effective path MTU, the address vector, the current PSNs.
    pub fn path(&self) -> Result<PathAttr, Error<P::Error>> {
        verb("ibv_query_qp", P::query_path(&self.raw))
    }

    /// RTR → RTS.
    pub fn into_rts(
        self,
        opts: &RtsOptions,
    ) -> Result<QueuePair<P, ReadyToSend, T>, TransitionError<P, ReadyToReceive, T>> {
        let attr = check(opts.timeout <= 31, "timeout exceeds 31")
            .and(check(opts.retry_cnt <= 7, "retry_cnt exceeds 7"))
            .and(check(opts.rnr_retry <= 7, "rnr_retry exceeds 7"))
            .map_err(Error::InvalidAttribute)
            .and_then(|()| {
                let rd_atomic = u64::from(opts.max_rd_atomic);
                within(
                    "rts.max_rd_atomic",
                    rd_atomic,
                    self.device.init_rd_atom.into(),
                )?;
                Ok(Transition::Rts(RtsAttr {
                    sq_psn: self.local.psn,
                    timeout: opts.timeout,
                    retry_cnt: opts.retry_cnt,
                    rnr_retry: opts.rnr_retry,
                    max_rd_atomic: opts.max_rd_atomic,
                }))
            });
        self.transition(attr)
    }
}

impl<P: Provider, St: Receiving, T: OwnReceiveQueue> QueuePair<P, St, T> {
    /// Posts a chain of receive work requests with one doorbell: from [`Init`] on (a
    /// queue pair on a shared receive queue has none: post to the queue).
    ///
    /// # Safety
    /// As [`Provider::post_recv`]: the scatter memory stays valid and untouched by Rust
    /// references until each request completes.
    #[inline]
    pub unsafe fn post_recv<const SGES: usize>(
        &self,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<P::Error>> {
        // SAFETY: forwarded contract.
        unsafe { P::post_recv(&self.raw, wrs) }
    }
}

impl<P: Provider, T: Connected> QueuePair<P, ReadyToSend, T> {
    /// The path and connection attributes the device applied (`ibv_query_qp`): the
    /// effective path MTU, the address vector, the current PSNs, the retry settings.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] {
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::qp::{QpConfig, QueuePair, InitOptions, RtrOptions, RtsOptions};
    /// # use zverbs::{CompletionQueue, Context, Mtu};
    /// # let sim = Sim::with_devices(2);
    /// # let make = |name| {
    /// #     let ctx = Context::open(&sim, name).unwrap();
    /// #     let pd = ctx.alloc_pd().unwrap();
    /// #     let cq = CompletionQueue::create(&ctx, 16).unwrap();
    /// #     let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
    /// #     (ctx, pd, cq, qp.into_init(&InitOptions::default()).unwrap())
    /// # };
    /// # let (_c1, _p1, _q1, a) = make("sim0");
    /// # let (_c2, _p2, _q2, b) = make("sim1");
    /// let opts = RtrOptions { mtu: Some(Mtu::Mtu1024), sl: 5, ..RtrOptions::default() };
    /// let a = a.into_rtr(&b.endpoint(), &opts).unwrap();
    /// let a = a.into_rts(&RtsOptions::default()).unwrap();
    /// let path = a.path().unwrap();
    /// assert_eq!((path.path_mtu, path.sl, path.hop_limit), (Mtu::Mtu1024, 5, 64));
    /// assert_eq!(path.dest_qp_num, b.qp_num());
    /// # }
    /// ```
    pub fn path(&self) -> Result<PathAttr, Error<P::Error>> {
        verb("ibv_query_qp", P::query_path(&self.raw))
    }
}

impl<P: Provider, T: Transport> QueuePair<P, ReadyToSend, T> {
    /// Posts a chain of send work requests with one doorbell.
    ///
    /// # Safety
    /// As [`Provider::post_send`]: the gather memory stays valid (and the memory that reads
    /// and atomics write stays untouched by Rust references) until each request completes.
    #[inline]
    pub unsafe fn post_send<const SGES: usize>(
        &self,
        wrs: &[SendWr<SGES>],
    ) -> Result<(), PostError<P::Error>> {
        // SAFETY: forwarded contract.
        unsafe { P::post_send(&self.raw, wrs) }
    }

    /// Posts `entries`, built in the provider's own layout, as one chain with one doorbell
    /// ([`Provider::post_send_entries`]).
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send).
    #[inline]
    pub(crate) unsafe fn post_send_entries<const SGES: usize>(
        &self,
        entries: &mut [P::SendEntry<SGES>],
    ) -> Result<(), PostError<P::Error>> {
        // SAFETY: forwarded contract.
        unsafe { P::post_send_entries(&self.raw, entries) }
    }

    /// Posts `entries` ([`Provider::post_send_chain`]), `linked` by an earlier post.
    ///
    /// # Safety
    /// As [`Provider::post_send_chain`].
    #[inline]
    pub(crate) unsafe fn post_send_chain<const SGES: usize>(
        &self,
        entries: &mut [P::SendEntry<SGES>],
        linked: bool,
    ) -> Result<(), PostError<P::Error>> {
        // SAFETY: forwarded contract.
        unsafe { P::post_send_chain(&self.raw, entries, linked) }
    }
}

impl<P: Provider, St: State, T: Transport> QueuePair<P, St, T> {
    /// How its device executes remote atomics (`ibv_device_attr.atomic_cap`, read when
    /// the queue pair was created).
    pub fn atomic_cap(&self) -> AtomicCap {
        self.device.atomic_cap
    }

    /// `Ok` when the device executes atomics, else [`Error::Unsupported`]: what the
    /// atomic operations of the levels above check before they post.
    pub(crate) fn check_atomics(&self) -> Result<(), Error<P::Error>> {
        if self.device.atomic_cap.supported() {
            Ok(())
        } else {
            Err(Error::Unsupported(NO_ATOMICS))
        }
    }

    /// This side's endpoint, to send to the peer.
    pub fn endpoint(&self) -> Endpoint {
        self.local
    }

    /// The connected peer's queue pair number (RTR and later; none before, nor after a
    /// reset). The whole path the device applied is [`path`](QueuePair::path).
    pub fn peer_qp_num(&self) -> Option<u32> {
        (self.peer_qp_num != NO_PEER).then_some(self.peer_qp_num)
    }

    /// The queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.local.qp_num
    }

    /// Its physical port (1-based; [`QpConfig::port`]).
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The GID table index its path uses ([`QpConfig::gid_index`], or what a connection
    /// manager chose).
    pub fn gid_index(&self) -> u8 {
        self.gid_index
    }

    /// The state the device reports now: the type says where the queue pair was moved,
    /// this says whether the device has since put it in the error state.
    pub fn state(&self) -> Result<QpState, Error<P::Error>> {
        verb("ibv_query_qp", P::query_qp_state(&self.raw))
    }

    /// Moves the queue pair to the error state: all outstanding work is flushed with
    /// `WR_FLUSH_ERR`. The type stays; posts will fail or flush until [`reset`](Self::reset).
    pub fn set_error(&self) -> Result<(), Error<P::Error>> {
        verb("ibv_modify_qp", P::modify_qp(&self.raw, &Transition::Error))
    }

    /// Moves the queue pair to RESET without changing its type: the device discards its
    /// outstanding work without completions and no longer touches the memory it named
    /// (IBA 1.4 §10.3.1 and `ibv_modify_qp(3)`: in RESET the work queues are empty and
    /// nothing is processed). For the channel's bounded abort; the type is wrong until the
    /// owner resets it properly.
    pub(crate) fn discard_work(&self) -> Result<(), Error<P::Error>> {
        verb("ibv_modify_qp", P::modify_qp(&self.raw, &Transition::Reset))
    }

    /// Back to RESET, from any state: outstanding work is discarded without completions.
    pub fn reset(self) -> Result<QueuePair<P, Reset, T>, TransitionError<P, St, T>> {
        self.transition(Ok(Transition::Reset))
    }

    /// The backend's handle.
    pub fn raw(&self) -> &P::Qp {
        &self.raw
    }

    fn transition<To: State>(
        self,
        t: Result<Transition, Error<P::Error>>,
    ) -> Result<QueuePair<P, To, T>, TransitionError<P, St, T>> {
        let t = match t {
            Err(error) => return Err(TransitionError { qp: self, error }),
            Ok(t) => t,
        };
        let result = verb("ibv_modify_qp", P::modify_qp(&self.raw, &t));
        match result {
            Ok(()) => Ok(QueuePair {
                raw: self.raw,
                local: self.local,
                peer_qp_num: if matches!(t, Transition::Reset) {
                    NO_PEER
                } else {
                    self.peer_qp_num
                },
                port: self.port,
                gid_index: self.gid_index,
                device: self.device,
                _state: PhantomData,
            }),
            Err(error) => Err(TransitionError { qp: self, error }),
        }
    }
}
