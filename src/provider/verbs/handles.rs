//! The verbs backend's handles: each owns one libibverbs object and the handles of the
//! objects it depends on (so a queue pair outlives neither its protection domain nor its
//! completion queues), destroys it once on drop, and says why it may cross threads.

use core::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use ibverbs_sys as ffi;

use super::builder::Builders;

pub(super) struct ContextInner {
    pub(super) ctx: NonNull<ffi::ibv_context>,
    pub(super) name: String,
    /// Its asynchronous events, and whether the device is dead.
    pub(super) events: super::async_event::Events,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: opened by `ibv_open_device`, closed once, after every child (they hold
        // this `Arc`).
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// An open device (`ibv_context`).
pub struct Context(pub(super) Arc<ContextInner>);

impl Context {
    pub(super) fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.0.ctx.as_ptr()
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
}

pub(super) struct PdInner {
    pub(super) pd: NonNull<ffi::ibv_pd>,
    pub(super) _ctx: Arc<ContextInner>,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_pd`, freed once, after its MRs and QPs (they
        // hold this `Arc`).
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// A protection domain (`ibv_pd`).
pub struct Pd(pub(super) Arc<PdInner>);

/// A memory registration (`ibv_mr`).
pub struct Mr {
    pub(super) mr: NonNull<ffi::ibv_mr>,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) _pd: Arc<PdInner>,
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by `ibv_reg_mr`, deregistered once.
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

pub(super) type PollFn = unsafe extern "C" fn(*mut ffi::ibv_cq, i32, *mut ffi::ibv_wc) -> i32;
/// A verb from a queue pair's op table that posts a chain of `C` requests.
pub(super) type PostFn<C, T = ffi::ibv_qp> =
    unsafe extern "C" fn(*mut T, *mut C, *mut *mut C) -> i32;

pub(super) struct CqInner {
    pub(super) cq: NonNull<ffi::ibv_cq>,
    pub(super) poll: PollFn,
    pub(super) req_notify: super::event::ReqNotifyFn,
    /// Its `cq_context`, which its events carry.
    pub(super) key: u64,
    pub(super) ctx: Arc<ContextInner>,
    /// Polls that found nothing, counted to space out looks at the device's events
    /// ([`super::async_event::device_dead`]).
    pub(super) empty_polls: AtomicU32,
    /// Destroyed after the CQ (fields drop after `drop`).
    pub(super) _channel: Option<Arc<super::event::ChannelInner>>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_cq`, destroyed once, after the QPs using it. It
        // returns once every event taken for it is acknowledged (`zverbs::CompletionQueue`
        // acknowledges on drop what it was handed).
        unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// A completion queue (`ibv_cq`).
pub struct Cq(pub(super) Arc<CqInner>);

impl Cq {
    /// The library's `ibv_cq`, for verbs zverbs does not wrap (or to measure it against
    /// raw calls); valid while this handle lives.
    pub fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.0.cq.as_ptr()
    }
}

impl Qp {
    /// The library's `ibv_qp`, as [`Cq::as_ptr`]; valid while this handle lives.
    pub fn as_ptr(&self) -> *mut ffi::ibv_qp {
        self.qp.as_ptr()
    }
}

/// A queue pair (`ibv_qp`).
pub struct Qp {
    pub(super) qp: NonNull<ffi::ibv_qp>,
    pub(super) qp_num: u32,
    pub(super) post_send: PostFn<ffi::ibv_send_wr>,
    pub(super) post_recv: PostFn<ffi::ibv_recv_wr>,
    /// Its send builders, if the provider created it with them (RC only); else sends go
    /// through `post_send`.
    pub(super) builders: Option<Builders>,
    pub(super) _pd: Arc<PdInner>,
    pub(super) _cqs: [Arc<CqInner>; 2],
    /// Destroyed after the QP (fields drop after `drop`).
    pub(super) _srq: Option<Arc<SrqInner>>,
}

pub(super) struct SrqInner {
    pub(super) srq: NonNull<ffi::ibv_srq>,
    pub(super) post_recv: PostFn<ffi::ibv_recv_wr, ffi::ibv_srq>,
    /// Its `srq_context`, which its events carry.
    pub(super) key: u64,
    pub(super) _pd: Arc<PdInner>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_srq`, destroyed once, after the QPs on it (they
        // hold this `Arc`).
        unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
    }
}

/// A shared receive queue (`ibv_srq`).
pub struct Srq(pub(super) Arc<SrqInner>);

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_qp`, destroyed once, before its PD and CQs.
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

/// An address handle (`ibv_ah`).
pub struct Ah {
    pub(super) ah: NonNull<ffi::ibv_ah>,
    pub(super) _pd: Arc<PdInner>,
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_ah`, destroyed once, before its PD.
        unsafe { ffi::ibv_destroy_ah(self.ah.as_ptr()) };
    }
}

// libibverbs objects may be used from any thread, and concurrently: the verbs library and
// its providers serialise access to each object with their own locks, and the handles
// are immutable after creation. Each line below names what its object's users do.
//
// SAFETY: the context is only passed to verbs calls (open/query/alloc/create), thread-safe,
// and to `ibv_get_async_event` with its events' queue locked; the rest is `Send` itself.
unsafe impl Send for ContextInner {}
// SAFETY: shared use only passes the context pointer to thread-safe verbs calls (the
// events' reads serialised by their lock).
unsafe impl Sync for ContextInner {}
// SAFETY: the PD is only passed to `ibv_reg_mr`/`ibv_create_qp`/`ibv_create_ah`, thread-safe.
unsafe impl Send for PdInner {}
// SAFETY: shared use only passes the PD pointer to those calls.
unsafe impl Sync for PdInner {}
// SAFETY: the registration holds keys and a pointer it never dereferences; the memory is
// the caller's (its contract with `register` says who may touch it).
unsafe impl Send for Mr {}
// SAFETY: shared use only reads the keys and the address.
unsafe impl Sync for Mr {}
// SAFETY: `ibv_poll_cq`, `ibv_req_notify_cq` and destroy may run on any thread.
unsafe impl Send for CqInner {}
// SAFETY: concurrent `ibv_poll_cq` calls on one CQ are serialised by the provider's CQ lock.
unsafe impl Sync for CqInner {}
// SAFETY: `ibv_post_send`/`ibv_post_recv`/`ibv_modify_qp` and the send builders may run
// on any thread.
unsafe impl Send for Qp {}
// SAFETY: concurrent posts on one QP are serialised by the provider's queue locks (the
// builders' from `ibv_wr_start` to `ibv_wr_complete`).
unsafe impl Sync for Qp {}
// SAFETY: `ibv_post_srq_recv`, `ibv_modify_srq`, `ibv_query_srq` and destroy may run on
// any thread.
unsafe impl Send for SrqInner {}
// SAFETY: concurrent posts to one SRQ are serialised by the provider's SRQ lock.
unsafe impl Sync for SrqInner {}
// SAFETY: an address handle is immutable after creation; only destroy touches it.
unsafe impl Send for Ah {}
// SAFETY: shared use only passes the handle's pointer into datagram work requests.
unsafe impl Sync for Ah {}
