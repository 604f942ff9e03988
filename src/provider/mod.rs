//! The provider seam: the verbs operations a real HCA offers, as one trait.
//!
//! Everything above this module is generic over [`Provider`]; two backends implement it:
//! the simulator (`sim::Sim`, feature `sim`) and libibverbs through `ibverbs-sys`
//! (`verbs::Verbs`, feature `verbs`; a NIC or soft-RoCE). The trait is small and honest: only what a real HCA does. Simulator-only
//! controls (faults, clock, stepping) live on the simulator's own types.
//!
//! Handles own their resource and free it on drop. A backend keeps parents alive as long as
//! children need them (a queue pair keeps its PD and CQs), so the layers above need no
//! lifetimes between handles.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::provider::{sim::Sim, Provider};
//! let sim = Sim::with_devices(1);
//! let ctx = sim.open_device("sim0").unwrap();
//! let port = Sim::query_port(&ctx, 1).unwrap();
//! assert_eq!(port.state, zverbs::PortState::Active);
//! # }
//! ```

#[cfg(all(feature = "std", unix))]
pub mod cm;
mod entry;
#[cfg(feature = "sim")]
pub mod sim;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use entry::{CompletionRecord, SendEntry, WorkRequest};

use crate::error::ProviderError;
use crate::types::{
    AccessFlags, AhKey, AsyncEvent, DeviceAttr, Gid, Mtu, PortAttr, QpCaps, QpState, RecvWr,
    SendWr, SrqAttr, WorkCompletion,
};
pub use zverbs_types::{
    AhAttr, InitAttr, PostError, QpType, RtrAttr, RtsAttr, Transition, UdInitAttr,
};

/// A connected queue pair's path and connection attributes as the device applied them
/// (`ibv_query_qp`): what a C program reads back from `ibv_qp_attr` after RTR and RTS.
///
/// The PSNs are the device's current ones (the next to send, the next expected), not the
/// initial values given at the transitions. Fields set by RTS (`timeout`, `retry_cnt`,
/// `rnr_retry`) read as zero before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathAttr {
    /// The path MTU in use: the smallest of the one asked for, the local port's and the
    /// peer's.
    pub path_mtu: Mtu,
    /// The peer's queue pair number.
    pub dest_qp_num: u32,
    /// The next packet sequence number the requester sends.
    pub sq_psn: u32,
    /// The next packet sequence number the responder expects.
    pub rq_psn: u32,
    /// The peer's LID.
    pub dlid: u16,
    /// The peer's GID, when the path is routed by GID (a GRH is sent).
    pub dgid: Option<Gid>,
    /// Local GID index of the path.
    pub sgid_index: u8,
    /// Service level.
    pub sl: u8,
    /// Traffic class of the GRH.
    pub traffic_class: u8,
    /// Flow label of the GRH.
    pub flow_label: u32,
    /// Hop limit of the GRH.
    pub hop_limit: u8,
    /// RNR NAK timer code sent to the peer.
    pub min_rnr_timer: u8,
    /// ACK timeout code.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
}

/// The verbs operations of an RDMA device. See the module docs.
///
/// Only [`open_device`](Provider::open_device) and
/// [`for_each_device`](Provider::for_each_device) need the provider value; every other verb
/// acts on a handle.
pub trait Provider: Sized {
    /// The backend's error.
    type Error: ProviderError + Clone + Send + Sync;
    /// An open device (`ibv_context`).
    type Context: Send + Sync;
    /// A protection domain (`ibv_pd`).
    type Pd: Send + Sync;
    /// A memory registration (`ibv_mr`).
    type Mr: Send + Sync;
    /// A completion queue (`ibv_cq`).
    type Cq: Send + Sync;
    /// A queue pair (`ibv_qp`).
    type Qp: Send + Sync;
    /// A completion channel (`ibv_comp_channel`): a file descriptor that becomes readable
    /// when an armed CQ on it gets a completion.
    type CompChannel: Send + Sync;
    /// An address handle (`ibv_ah`): a destination of unreliable datagrams.
    type Ah: Send + Sync;
    /// A shared receive queue (`ibv_srq`). It stays alive while a queue pair created on it
    /// does (the queue pair's handle holds it).
    type Srq: Send + Sync;
    /// A completion as the provider's one-completion poll leaves it
    /// ([`poll_cq_one`](Provider::poll_cq_one)), read in place.
    type Wc: CompletionRecord;

    /// Calls `f` with the name of every device present.
    fn for_each_device(&self, f: &mut dyn FnMut(&str));
    /// Opens a device by name.
    fn open_device(&self, name: &str) -> Result<Self::Context, Self::Error>;
    /// Queries the device's limits and capabilities (`ibv_query_device`).
    fn query_device(ctx: &Self::Context) -> Result<DeviceAttr, Self::Error>;
    /// Queries a port (1-based).
    fn query_port(ctx: &Self::Context, port: u8) -> Result<PortAttr, Self::Error>;
    /// Reads one entry of a port's GID table.
    fn query_gid(ctx: &Self::Context, port: u8, index: u8) -> Result<Gid, Self::Error>;
    /// Allocates a protection domain.
    fn alloc_pd(ctx: &Self::Context) -> Result<Self::Pd, Self::Error>;

    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// The memory must stay valid (for writes too, if `access` has any write right) until the
    /// returned handle is dropped, and must not be accessed through Rust references while
    /// the device may access it (work in flight, or remote rights granted to a peer that
    /// uses them).
    unsafe fn register_mr(
        pd: &Self::Pd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self::Mr, Self::Error>;
    /// Registers `len` bytes at `offset` of the dmabuf `fd` (an accelerator's memory),
    /// named by the addresses `iova..iova + len` in work requests and by peers
    /// (`ibv_reg_dmabuf_mr`). Safe: the memory is not the process's, so no Rust reference
    /// can alias what the device reads or writes; the kernel checks the descriptor and
    /// holds the dmabuf for the registration's life. A device that cannot register dmabufs
    /// fails with an error of kind [`Unsupported`](crate::error::ErrorKind::Unsupported).
    #[cfg(all(feature = "std", unix))]
    fn register_dmabuf_mr(
        pd: &Self::Pd,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Self::Mr, Self::Error>;
    /// The local and remote keys of a registration: `(lkey, rkey)`.
    fn mr_keys(mr: &Self::Mr) -> (u32, u32);

    /// Creates a completion queue of at least `depth` entries, reporting its events to
    /// `channel` if one is given. The queue keeps its channel alive.
    fn create_cq(
        ctx: &Self::Context,
        depth: u32,
        channel: Option<&Self::CompChannel>,
    ) -> Result<Self::Cq, Self::Error>;
    /// Polls up to `out.len()` completions into `out`, oldest first; returns how many.
    fn poll_cq(cq: &Self::Cq, out: &mut [WorkCompletion]) -> Result<usize, Self::Error>;
    /// Polls for at most one completion, into `out`; returns it there, if there was one.
    /// The usual poll of a wait: the caller reads the `wr_id` and the status in place and
    /// converts the rest only if it wants it ([`CompletionRecord`]).
    fn poll_cq_one<'a>(
        cq: &Self::Cq,
        out: &'a mut core::mem::MaybeUninit<Self::Wc>,
    ) -> Result<Option<&'a Self::Wc>, Self::Error>;
    /// Polls for at most one completion into `out`, in the library's layout; whether there
    /// was one. A shared queue's poll for one channel's completion, which routes it by its
    /// `wr_id`. By default, [`poll_cq_one`](Provider::poll_cq_one) converted; a provider
    /// whose layout is the library's polls straight into `out`.
    #[inline]
    fn poll_cq_into(cq: &Self::Cq, out: &mut WorkCompletion) -> Result<bool, Self::Error> {
        let mut slot = core::mem::MaybeUninit::uninit();
        Ok(match Self::poll_cq_one(cq, &mut slot)? {
            Some(wc) => {
                *out = wc.completion();
                true
            }
            None => false,
        })
    }

    /// Creates a completion channel (`ibv_create_comp_channel`) whose descriptor is in
    /// non-blocking mode.
    fn create_comp_channel(ctx: &Self::Context) -> Result<Self::CompChannel, Self::Error>;
    /// The channel's file descriptor: readable while an event is pending.
    #[cfg(all(feature = "std", unix))]
    fn comp_channel_fd(ch: &Self::CompChannel) -> std::os::fd::RawFd;
    /// A second descriptor a thread asleep on `ch` watches, readable while the device has
    /// asynchronous events, so that a dead device wakes the waits asleep on its queues
    /// (verbs: the context's event descriptor). `None` where the backend wakes them itself
    /// (the simulator's crash fails and wakes its queues).
    #[cfg(all(feature = "std", unix))]
    fn comp_channel_device_fd(ch: &Self::CompChannel) -> Option<std::os::fd::RawFd> {
        let _ = ch;
        None
    }
    /// Looks at the asynchronous events of `cq`'s device now (what woke a sleeper on
    /// [`comp_channel_device_fd`](Provider::comp_channel_device_fd)), and fails with the
    /// device's fatal error if it died. The simulator: nothing to look at (its crash fails
    /// the polls themselves).
    fn check_device(cq: &Self::Cq) -> Result<(), Self::Error> {
        let _ = cq;
        Ok(())
    }
    /// The key the events of `cq` carry (verbs: its `cq_context`). No two queues of one
    /// provider share a key.
    fn cq_key(cq: &Self::Cq) -> u64;

    /// The descriptor of the device's asynchronous events (`async_fd`, non-blocking):
    /// readable while events are queued for `ctx`.
    #[cfg(all(feature = "std", unix))]
    fn async_event_fd(ctx: &Self::Context) -> std::os::fd::RawFd;
    /// Takes `ctx`'s oldest asynchronous event without blocking (`ibv_get_async_event`,
    /// acknowledged at once), or `None` when none is queued.
    fn get_async_event(ctx: &Self::Context) -> Result<Option<AsyncEvent>, Self::Error>;
    /// Arms `cq` (`ibv_req_notify_cq`): the next completion added to it (with
    /// `solicited_only`, the next solicited one: a receive of a request sent with
    /// `SOLICITED`, or any completion in error) queues one event on its channel. One-shot:
    /// after an event the queue must be armed again. Completions already in the queue
    /// raise nothing, so a consumer arms, then polls again, then sleeps.
    fn req_notify_cq(cq: &Self::Cq, solicited_only: bool) -> Result<(), Self::Error>;
    /// Takes the oldest event from `ch` without blocking (`ibv_get_cq_event` on a
    /// non-blocking descriptor): the [key](Provider::cq_key) of the queue that raised it,
    /// or `None` when no event is pending. Every event taken must be acknowledged on its
    /// queue ([`ack_cq_events`](Provider::ack_cq_events)) before the queue is destroyed:
    /// on verbs the destroy waits for that forever.
    fn get_cq_event(ch: &Self::CompChannel) -> Result<Option<u64>, Self::Error>;
    /// Acknowledges `n` events taken for `cq` (`ibv_ack_cq_events`; it takes a lock, so
    /// callers batch).
    fn ack_cq_events(cq: &Self::Cq, n: u32);

    /// Creates a queue pair of transport `ty` in the RESET state; with `srq` (RC only), it
    /// takes its receives from that shared receive queue, and its own receive capacities
    /// are ignored.
    fn create_qp(
        pd: &Self::Pd,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        srq: Option<&Self::Srq>,
        caps: &QpCaps,
        ty: QpType,
    ) -> Result<Self::Qp, Self::Error>;

    /// Creates a shared receive queue (`ibv_create_srq`) of at least `max_wr` receives of
    /// `max_sge` entries, not armed (`srq_limit` is not passed: `ibv_create_srq(3)` calls it
    /// irrelevant at creation, and devices differ).
    fn create_srq(pd: &Self::Pd, max_wr: u32, max_sge: u32) -> Result<Self::Srq, Self::Error>;
    /// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): `SRQ_LIMIT_REACHED` once when
    /// a receive taken leaves fewer than `limit`; 0 disarms.
    fn arm_srq(srq: &Self::Srq, limit: u32) -> Result<(), Self::Error>;
    /// The size granted and the armed limit (`ibv_query_srq`).
    fn query_srq(srq: &Self::Srq) -> Result<SrqAttr, Self::Error>;
    /// What the asynchronous events of `srq` name it by ([`EventElement::Srq`]).
    ///
    /// [`EventElement::Srq`]: crate::types::EventElement::Srq
    fn srq_key(srq: &Self::Srq) -> u64;
    /// Posts a chain of receives to a shared receive queue with one doorbell.
    ///
    /// # Safety
    /// As [`post_recv`](Provider::post_recv).
    unsafe fn post_srq_recv<const SGES: usize>(
        srq: &Self::Srq,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<Self::Error>>;

    /// Creates an address handle (`ibv_create_ah`): where the datagrams that name its
    /// [key](Provider::ah_key) go.
    fn create_ah(pd: &Self::Pd, attr: &AhAttr) -> Result<Self::Ah, Self::Error>;
    /// What a datagram's [`UdDest`](crate::types::UdDest) names `ah` by.
    fn ah_key(ah: &Self::Ah) -> AhKey;
    /// The queue pair number.
    fn qp_num(qp: &Self::Qp) -> u32;
    /// Moves the queue pair to another state.
    fn modify_qp(qp: &Self::Qp, t: &Transition) -> Result<(), Self::Error>;
    /// The current state (the device may have moved it to the error state).
    fn query_qp_state(qp: &Self::Qp) -> Result<QpState, Self::Error>;
    /// The path and connection attributes of a queue pair that has been through RTR
    /// (`ibv_query_qp`). A queue pair without a path (RESET, INIT) gives an invalid-argument
    /// error.
    fn query_path(qp: &Self::Qp) -> Result<PathAttr, Self::Error>;

    /// Posts a chain of send work requests with one doorbell.
    ///
    /// # Safety
    /// Every gather entry must lie in memory registered with the entry's lkey (or be inline),
    /// and that memory must stay valid, and not be written through Rust references (nor
    /// read, for reads and atomics that write it), until the request completes.
    /// Every datagram's `dest.ah` must be the [key](Provider::ah_key) of an address handle
    /// of this provider, alive until the request completes (rxe looks it up as it
    /// transmits).
    unsafe fn post_send<const SGES: usize>(
        qp: &Self::Qp,
        wrs: &[SendWr<SGES>],
    ) -> Result<(), PostError<Self::Error>>;

    /// A send work request in this provider's own layout, built where it is posted from
    /// (a channel's ring entry): see [`SendEntry`].
    type SendEntry<const SGES: usize>: SendEntry<SGES>;

    /// Posts `entries` as one chain with one doorbell, as [`post_send`](Provider::post_send)
    /// posts requests: up to the first refused, whose index the error gives. The entries
    /// may be written (a provider links them where they lie).
    ///
    /// # Safety
    /// As [`post_send`](Provider::post_send).
    unsafe fn post_send_entries<const SGES: usize>(
        qp: &Self::Qp,
        entries: &mut [Self::SendEntry<SGES>],
    ) -> Result<(), PostError<Self::Error>>;

    /// Posts `entries` as [`post_send_entries`](Provider::post_send_entries) does. With
    /// `linked`, an earlier successful call of either posted these entries where they lie
    /// now, and nothing but their `wr_id`s was written since (a chain built once and posted
    /// again, a [`Batch`](crate::Batch)): a provider that links entries posts them as they
    /// are.
    ///
    /// # Safety
    /// As [`post_send`](Provider::post_send); and `linked` only as said.
    #[inline(always)]
    unsafe fn post_send_chain<const SGES: usize>(
        qp: &Self::Qp,
        entries: &mut [Self::SendEntry<SGES>],
        linked: bool,
    ) -> Result<(), PostError<Self::Error>> {
        let _ = linked;
        // SAFETY: forwarded contract.
        unsafe { Self::post_send_entries(qp, entries) }
    }

    /// Posts a chain of receive work requests with one doorbell.
    ///
    /// # Safety
    /// Every scatter entry's memory must stay valid and not be accessed through Rust
    /// references until the request completes.
    unsafe fn post_recv<const SGES: usize>(
        qp: &Self::Qp,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<Self::Error>>;
}
