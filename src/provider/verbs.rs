//! The verbs backend: [`Provider`] over libibverbs (`ibverbs-sys`, feature `verbs`).
//!
//! This is the only FFI in the crate. It runs on any device libibverbs drives: an
//! InfiniBand or RoCE NIC, or soft-RoCE (`rxe`), which is how the project tests it (see
//! `scripts/rxe-test.sh`). Devices are chosen by name; [`Verbs::select_gid`] picks the GID
//! index for RoCE (the RoCE v2 entry of an IPv4 address unless told otherwise).
//!
//! Handles own their verbs object and release it on drop; children hold their parents
//! (`Arc`), so a queue pair keeps its PD, its CQs and the device context open.
//!
//! The inline verbs of `verbs.h` (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`) are not symbols of the library: they are calls through the
//! context's op table, which this module reads once per queue (at creation) and calls
//! directly on the data path.
//!
//! ```no_run
//! use zverbs::provider::verbs::{GidSelect, Verbs};
//! use zverbs::qp::QpConfig;
//! use zverbs::{Channel, ChannelConfig, Context};
//! let ctx = Context::open(&Verbs, "rxe0")?; // the error lists the devices present
//! let pd = ctx.alloc_pd()?;
//! let gid = Verbs::select_gid(ctx.raw(), 1, GidSelect::default())?;
//! let config = ChannelConfig {
//!     qp: QpConfig { gid_index: gid.index, ..QpConfig::default() },
//!     ..ChannelConfig::default()
//! };
//! let prepared = Channel::<Verbs>::prepare(&ctx, &pd, &config)?;
//! // ... exchange `prepared.endpoint()` with the peer, then `prepared.connect(&theirs)`.
//! # let _ = prepared;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Map (one file: the `Provider` impl must be read whole to check it against the verbs
//! API): the device list; the owned handles (`ContextInner` … `Ah`, each destroyed once
//! by `Drop`, with their `Send`/`Sync` contracts); `impl Provider for Verbs`, verb by verb
//! in the trait's order; the posting helpers (`well_formed`, `link`, `bad_index`).
//! Errors, completion channels, GID selection and work-request translation are in
//! `verbs/`.

mod async_event;
mod chain;
mod cm;
mod entry;
mod error;
mod event;
mod gid;
mod wr;

pub use cm::{CmChannel, CmId};
pub use error::{NoSuchDevice, VerbsError};
pub use event::CompChannel;
pub use gid::{GidEntry, GidSelect, GidType};

use core::ffi::CStr;
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use ibverbs_sys as ffi;

use super::{AhAttr, PathAttr, PostError, Provider, Transition};
use std::os::fd::RawFd;

use crate::types::{
    AccessFlags, AhKey, AsyncEvent, Gid, Mtu, PortAttr, PortState, QpCaps, QpState, QpType, RecvWr,
    SendWr, SrqAttr, WorkCompletion,
};
use error::check;

/// The verbs provider. A unit value: the device list is libibverbs' own.
#[derive(Clone, Copy, Debug, Default)]
pub struct Verbs;

/// Calls `f` with each device of a fresh device list; the list is freed afterwards.
fn with_device_list<R>(f: impl FnOnce(&[*mut ffi::ibv_device]) -> R) -> Result<R, VerbsError> {
    let mut n = 0i32;
    // SAFETY: `n` is a valid out-pointer; the call allocates and returns the list or NULL.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(VerbsError::last_os("ibv_get_device_list"));
    }
    // SAFETY: on success `list` holds `n` device pointers (NULL-terminated after them).
    let devices = unsafe { core::slice::from_raw_parts(list, usize::try_from(n).unwrap_or(0)) };
    let r = f(devices);
    // SAFETY: `list` came from `ibv_get_device_list` and is freed once; devices opened from
    // it stay valid after the free (libibverbs keeps opened devices referenced).
    unsafe { ffi::ibv_free_device_list(list) };
    Ok(r)
}

/// The name of a device of a live device list; the borrow of the list's element keeps the
/// name from outliving the list.
fn device_name(dev: &*mut ffi::ibv_device) -> &str {
    // SAFETY: `*dev` is an element of a live device list; the name is a NUL-terminated
    // array inside the device struct, valid while the list is.
    let name = unsafe { ffi::ibv_get_device_name(*dev) };
    if name.is_null() {
        return "";
    }
    // SAFETY: `name` is non-null and NUL-terminated, inside the device struct of a live
    // list, which outlives the `&str` (tied to `dev`'s borrow).
    unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("")
}

impl Verbs {
    /// The names of the devices present (empty when there are none or libibverbs cannot
    /// list them).
    pub fn devices() -> Vec<String> {
        with_device_list(|l| l.iter().map(|d| device_name(d).to_owned()).collect())
            .unwrap_or_default()
    }
}

struct ContextInner {
    ctx: NonNull<ffi::ibv_context>,
    name: String,
    /// Its asynchronous events, and whether the device is dead.
    events: async_event::Events,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: opened by `ibv_open_device`, closed once, after every child (they hold
        // this `Arc`).
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// An open device (`ibv_context`).
pub struct Context(Arc<ContextInner>);

impl Context {
    fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.0.ctx.as_ptr()
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
}

struct PdInner {
    pd: NonNull<ffi::ibv_pd>,
    _ctx: Arc<ContextInner>,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_pd`, freed once, after its MRs and QPs (they
        // hold this `Arc`).
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// A protection domain (`ibv_pd`).
pub struct Pd(Arc<PdInner>);

/// A memory registration (`ibv_mr`).
pub struct Mr {
    mr: NonNull<ffi::ibv_mr>,
    lkey: u32,
    rkey: u32,
    _pd: Arc<PdInner>,
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by `ibv_reg_mr`, deregistered once.
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

type PollFn = unsafe extern "C" fn(*mut ffi::ibv_cq, i32, *mut ffi::ibv_wc) -> i32;
/// A verb from a queue pair's op table that posts a chain of `C` requests.
type PostFn<C, T = ffi::ibv_qp> = unsafe extern "C" fn(*mut T, *mut C, *mut *mut C) -> i32;

struct CqInner {
    cq: NonNull<ffi::ibv_cq>,
    poll: PollFn,
    req_notify: event::ReqNotifyFn,
    /// Its `cq_context`, which its events carry.
    key: u64,
    ctx: Arc<ContextInner>,
    /// Polls that found nothing, counted to space out looks at the device's events
    /// ([`async_event::device_dead`]).
    empty_polls: AtomicU32,
    /// Destroyed after the CQ (fields drop after `drop`).
    _channel: Option<Arc<event::ChannelInner>>,
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
pub struct Cq(Arc<CqInner>);

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
    qp: NonNull<ffi::ibv_qp>,
    qp_num: u32,
    post_send: PostFn<ffi::ibv_send_wr>,
    post_recv: PostFn<ffi::ibv_recv_wr>,
    _pd: Arc<PdInner>,
    _cqs: [Arc<CqInner>; 2],
    /// Destroyed after the QP (fields drop after `drop`).
    _srq: Option<Arc<SrqInner>>,
}

struct SrqInner {
    srq: NonNull<ffi::ibv_srq>,
    post_recv: PostFn<ffi::ibv_recv_wr, ffi::ibv_srq>,
    /// Its `srq_context`, which its events carry.
    key: u64,
    _pd: Arc<PdInner>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_srq`, destroyed once, after the QPs on it (they
        // hold this `Arc`).
        unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
    }
}

/// A shared receive queue (`ibv_srq`).
pub struct Srq(Arc<SrqInner>);

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_qp`, destroyed once, before its PD and CQs.
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

/// An address handle (`ibv_ah`).
pub struct Ah {
    ah: NonNull<ffi::ibv_ah>,
    _pd: Arc<PdInner>,
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
// SAFETY: `ibv_post_send`/`ibv_post_recv`/`ibv_modify_qp` may run on any thread.
unsafe impl Send for Qp {}
// SAFETY: concurrent posts on one QP are serialised by the provider's queue locks.
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

fn mtu(v: ffi::ibv_mtu) -> Mtu {
    Mtu::from_raw(u8::try_from(v).unwrap_or(0)).unwrap_or(Mtu::Mtu256)
}

fn non_null<T>(p: *mut T, verb: &'static str) -> Result<NonNull<T>, VerbsError> {
    NonNull::new(p).ok_or_else(|| VerbsError::last_os(verb))
}

/// Whether `ctx`'s provider library registers dmabufs: verbs has no attribute for it, so
/// this asks with a descriptor that cannot be one (-1). A provider without the verb fails
/// at once with `EOPNOTSUPP` (rdma-core's dummy op; rxe, siw); one with it passes the call
/// to the kernel, which refuses the descriptor (`EBADF`).
fn dmabuf_supported(ctx: &Context) -> Result<bool, VerbsError> {
    // SAFETY: open context.
    let pd = non_null(unsafe { ffi::ibv_alloc_pd(ctx.as_ptr()) }, "ibv_alloc_pd")?;
    let access = AccessFlags::LOCAL_WRITE.bits() as i32;
    // SAFETY: live PD; the descriptor -1 names no memory, so nothing is registered.
    let mr = unsafe { ffi::ibv_reg_dmabuf_mr(pd.as_ptr(), 0, 4096, 0, -1, access) };
    let unsupported = mr.is_null() && {
        use crate::error::{ErrorKind, ProviderError};
        VerbsError::last_os("ibv_reg_dmabuf_mr").kind() == ErrorKind::Unsupported
    };
    if !mr.is_null() {
        // SAFETY: registered just now (which no provider does for -1), deregistered once.
        unsafe { ffi::ibv_dereg_mr(mr) };
    }
    // SAFETY: allocated above, nothing on it any more.
    unsafe { ffi::ibv_dealloc_pd(pd.as_ptr()) };
    Ok(!unsupported)
}

impl Provider for Verbs {
    type Error = VerbsError;
    type Context = Context;
    type Pd = Pd;
    type Mr = Mr;
    type Cq = Cq;
    type Qp = Qp;
    type CompChannel = CompChannel;
    type Ah = Ah;
    type Srq = Srq;

    fn for_each_device(&self, f: &mut dyn FnMut(&str)) {
        let _ = with_device_list(|l| l.iter().for_each(|d| f(device_name(d))));
    }

    fn open_device(&self, name: &str) -> Result<Context, VerbsError> {
        let mut present = Vec::new();
        let opened = with_device_list(|l| {
            for d in l {
                if device_name(d) == name {
                    // SAFETY: `d` is an element of the live device list.
                    return Some(non_null(
                        unsafe { ffi::ibv_open_device(*d) },
                        "ibv_open_device",
                    ));
                }
                present.push(device_name(d).to_owned());
            }
            None
        })?;
        match opened {
            Some(ctx) => {
                let ctx = ctx?;
                // SAFETY: an open context; `async_fd` is a plain field set by the library
                // and fixed.
                let events = async_event::Events::new(unsafe { (*ctx.as_ptr()).async_fd });
                match events {
                    Ok(events) => Ok(Context(Arc::new(ContextInner {
                        ctx,
                        name: name.to_owned(),
                        events,
                    }))),
                    Err(e) => {
                        // SAFETY: opened above and owned by nothing else yet.
                        unsafe { ffi::ibv_close_device(ctx.as_ptr()) };
                        Err(e)
                    }
                }
            }
            None => Err(VerbsError::NoSuchDevice(Box::new(error::NoSuchDevice {
                name: name.to_owned(),
                present,
            }))),
        }
    }

    fn query_device(ctx: &Context) -> Result<crate::types::DeviceAttr, VerbsError> {
        let mut a = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
        // SAFETY: open context; `a` is a writable `ibv_device_attr` the call fills.
        let ret = unsafe { ffi::ibv_query_device(ctx.as_ptr(), a.as_mut_ptr()) };
        check("ibv_query_device", ret)?;
        // SAFETY: zero-initialised plain C data (integers and byte arrays), filled above.
        let a = unsafe { a.assume_init() };
        let count = |n: i32| u32::try_from(n).unwrap_or(0);
        Ok(crate::types::DeviceAttr {
            max_qp_wr: count(a.max_qp_wr),
            max_sge: count(a.max_sge),
            max_cqe: count(a.max_cqe),
            max_qp_rd_atom: count(a.max_qp_rd_atom),
            max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
            max_mr_size: a.max_mr_size,
            atomic_cap: match a.atomic_cap {
                ffi::IBV_ATOMIC_HCA => crate::types::AtomicCap::Hca,
                ffi::IBV_ATOMIC_GLOB => crate::types::AtomicCap::Glob,
                _ => crate::types::AtomicCap::None,
            },
            max_srq: count(a.max_srq),
            max_srq_wr: count(a.max_srq_wr),
            max_srq_sge: count(a.max_srq_sge),
            dmabuf: dmabuf_supported(ctx)?,
        })
    }

    fn query_port(ctx: &Context, port: u8) -> Result<PortAttr, VerbsError> {
        let mut a = ffi::ibv_port_attr::default();
        // SAFETY: open context; `a` is a full `ibv_port_attr`, larger than the compat
        // struct the exported symbol fills, so every write lands inside it.
        let ret = unsafe { ffi::ibv_query_port(ctx.as_ptr(), port, ptr::addr_of_mut!(a).cast()) };
        check("ibv_query_port", ret)?;
        Ok(PortAttr {
            state: if a.state == ffi::ibv_port_state::IBV_PORT_ACTIVE {
                PortState::Active
            } else {
                PortState::Down
            },
            lid: a.lid,
            max_mtu: mtu(a.max_mtu),
            active_mtu: mtu(a.active_mtu),
            gid_table_len: u16::try_from(a.gid_tbl_len).unwrap_or(u16::MAX),
        })
    }

    fn query_gid(ctx: &Context, port: u8, index: u8) -> Result<Gid, VerbsError> {
        let mut g = ffi::ibv_gid::default();
        // SAFETY: open context; `g` is a valid out-pointer to a 16-byte GID.
        let ret = unsafe { ffi::ibv_query_gid(ctx.as_ptr(), port, index.into(), &mut g) };
        check("ibv_query_gid", ret)?;
        // SAFETY: `raw` is the byte view of the GID union; every bit pattern is valid.
        Ok(Gid(unsafe { g.raw }))
    }

    fn alloc_pd(ctx: &Context) -> Result<Pd, VerbsError> {
        // SAFETY: open context.
        let pd = non_null(unsafe { ffi::ibv_alloc_pd(ctx.as_ptr()) }, "ibv_alloc_pd")?;
        Ok(Pd(Arc::new(PdInner {
            pd,
            _ctx: ctx.0.clone(),
        })))
    }

    unsafe fn register_mr(
        pd: &Pd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr, VerbsError> {
        // SAFETY: live PD; the caller guarantees `addr..addr+len` stays valid for the
        // registration's lifetime (the trait's contract). The access bits are the verbs
        // values (asserted in `wr`).
        let mr =
            unsafe { ffi::ibv_reg_mr(pd.0.pd.as_ptr(), addr.cast(), len, access.bits() as i32) };
        let mr = non_null(mr, "ibv_reg_mr")?;
        // SAFETY: a registered MR; its keys are plain fields set by the library.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(Mr {
            mr,
            lkey,
            rkey,
            _pd: pd.0.clone(),
        })
    }

    fn register_dmabuf_mr(
        pd: &Pd,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr, VerbsError> {
        use std::os::fd::AsRawFd;
        let (pd_ptr, fd, bits) = (pd.0.pd.as_ptr(), fd.as_raw_fd(), access.bits() as i32);
        // SAFETY: live PD and an open descriptor (borrowed for the call); the memory is the
        // dmabuf's, which the kernel holds for the registration's life, never the
        // process's. Providers without the verb fail it with EOPNOTSUPP.
        let mr = unsafe { ffi::ibv_reg_dmabuf_mr(pd_ptr, offset, len, iova, fd, bits) };
        let mr = non_null(mr, "ibv_reg_dmabuf_mr")?;
        // SAFETY: a registered MR; its keys are plain fields set by the library.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(Mr {
            mr,
            lkey,
            rkey,
            _pd: pd.0.clone(),
        })
    }

    fn mr_keys(mr: &Mr) -> (u32, u32) {
        (mr.lkey, mr.rkey)
    }

    fn create_cq(
        ctx: &Context,
        depth: u32,
        channel: Option<&CompChannel>,
    ) -> Result<Cq, VerbsError> {
        let depth =
            i32::try_from(depth).map_err(|_| VerbsError::Invalid("CQ depth above i32::MAX"))?;
        let key = event::next_key();
        let ch = channel.map_or(ptr::null_mut(), |c| c.0.ch.as_ptr());
        // SAFETY: open context; `ch` is NULL or a live channel of the same process (kept
        // alive below as long as the CQ); vector 0 is always valid. `cq_context` is an
        // integer key, never dereferenced.
        let cq = unsafe { ffi::ibv_create_cq(ctx.as_ptr(), depth, key as *mut _, ch, 0) };
        let cq = non_null(cq, "ibv_create_cq")?;
        // SAFETY: the context outlives the CQ (held below); its op table is fixed after open.
        let (poll, req_notify) = unsafe {
            (
                (*ctx.as_ptr()).ops.poll_cq,
                (*ctx.as_ptr()).ops.req_notify_cq,
            )
        };
        let (Some(poll), Some(req_notify)) = (poll, req_notify) else {
            // SAFETY: just created, not shared.
            unsafe { ffi::ibv_destroy_cq(cq.as_ptr()) };
            return Err(VerbsError::Unsupported("ibv_poll_cq/ibv_req_notify_cq"));
        };
        Ok(Cq(Arc::new(CqInner {
            cq,
            poll,
            req_notify,
            key,
            ctx: ctx.0.clone(),
            empty_polls: AtomicU32::new(0),
            _channel: channel.map(|c| c.0.clone()),
        })))
    }

    fn create_comp_channel(ctx: &Context) -> Result<CompChannel, VerbsError> {
        event::create(&ctx.0)
    }

    fn comp_channel_fd(ch: &CompChannel) -> std::os::fd::RawFd {
        event::fd(ch)
    }

    fn comp_channel_device_fd(ch: &CompChannel) -> Option<std::os::fd::RawFd> {
        Some(ch.0.ctx.events.device_fd())
    }

    fn check_device(cq: &Cq) -> Result<(), VerbsError> {
        match async_event::device_dead_now(&cq.0.ctx) {
            true => Err(VerbsError::DeviceFatal),
            false => Ok(()),
        }
    }

    fn cq_key(cq: &Cq) -> u64 {
        cq.0.key
    }

    fn async_event_fd(ctx: &Context) -> RawFd {
        async_event::fd(ctx)
    }

    fn get_async_event(ctx: &Context) -> Result<Option<AsyncEvent>, VerbsError> {
        async_event::get(ctx)
    }

    fn req_notify_cq(cq: &Cq, solicited_only: bool) -> Result<(), VerbsError> {
        event::req_notify(cq.0.req_notify, cq.0.cq, solicited_only)
    }

    fn get_cq_event(ch: &CompChannel) -> Result<Option<u64>, VerbsError> {
        event::get(ch)
    }

    fn ack_cq_events(cq: &Cq, n: u32) {
        // SAFETY: live CQ; acknowledging is a counter update under the CQ's lock.
        unsafe { ffi::ibv_ack_cq_events(cq.0.cq.as_ptr(), n) };
    }

    #[inline(always)]
    fn poll_cq(cq: &Cq, out: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        // One completion, the usual poll of a wait: inline, no batch loop.
        if let [o] = out {
            let mut wc = MaybeUninit::<ffi::ibv_wc>::uninit();
            // SAFETY: `poll` is this CQ's `poll_cq` from its context's op table (as
            // `ibv_poll_cq` calls it); `wc` has room for the one entry asked for.
            let n = unsafe { (cq.0.poll)(cq.0.cq.as_ptr(), 1, wc.as_mut_ptr()) };
            if n > 0 {
                // SAFETY: the provider initialised the one entry it was given.
                *o = wr::work_completion(unsafe { wc.assume_init_ref() });
                return Ok(1);
            }
            // Nothing, the usual poll of a spinning wait: inline too. A dead device's
            // queues just stay empty, so an empty poll asks about the device's events (at
            // most once a millisecond, on one empty poll in `LOOK_POLLS`), and a wait ends
            // at the death, not at its timeout.
            if n == 0 {
                return match async_event::device_dead(&cq.0.ctx, &cq.0.empty_polls) {
                    false => Ok(0),
                    true => Err(VerbsError::DeviceFatal),
                };
            }
            return Err(poll_failed(n));
        }
        poll_batch(cq, out)
    }

    fn create_qp(
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        caps: &QpCaps,
        ty: QpType,
    ) -> Result<Qp, VerbsError> {
        let mut attr = ffi::ibv_qp_init_attr {
            send_cq: send_cq.0.cq.as_ptr(),
            recv_cq: recv_cq.0.cq.as_ptr(),
            srq: srq.map_or(ptr::null_mut(), |s| s.0.srq.as_ptr()),
            cap: ffi::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: caps.max_recv_sge,
                max_inline_data: caps.max_inline_data,
            },
            qp_type: match ty {
                QpType::Rc => ffi::ibv_qp_type::IBV_QPT_RC,
                QpType::Ud => ffi::ibv_qp_type::IBV_QPT_UD,
            },
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: live PD, CQs and SRQ (kept alive by the returned handle); `attr` is valid and
        // the library may write the granted capabilities back into it.
        let qp = non_null(
            unsafe { ffi::ibv_create_qp(pd.0.pd.as_ptr(), &mut attr) },
            "ibv_create_qp",
        )?;
        // SAFETY: a created QP; `context` and `qp_num` are set by the library and fixed.
        let (ctx, qp_num) = unsafe { ((*qp.as_ptr()).context, (*qp.as_ptr()).qp_num) };
        // SAFETY: the QP's context is open (the PD holds it); its op table is fixed.
        let (post_send, post_recv) = unsafe { ((*ctx).ops.post_send, (*ctx).ops.post_recv) };
        let (Some(post_send), Some(post_recv)) = (post_send, post_recv) else {
            // SAFETY: just created, not shared.
            unsafe { ffi::ibv_destroy_qp(qp.as_ptr()) };
            return Err(VerbsError::Unsupported("ibv_post_send/ibv_post_recv"));
        };
        Ok(Qp {
            qp,
            qp_num,
            post_send,
            post_recv,
            _pd: pd.0.clone(),
            _cqs: [send_cq.0.clone(), recv_cq.0.clone()],
            _srq: srq.map(|s| s.0.clone()),
        })
    }

    fn create_srq(pd: &Pd, max_wr: u32, max_sge: u32) -> Result<Srq, VerbsError> {
        let key = event::next_key();
        let mut attr = ffi::ibv_srq_init_attr {
            srq_context: key as usize as *mut core::ffi::c_void,
            attr: ffi::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: live PD (kept alive by the returned handle); `attr` is valid and the
        // library writes the granted sizes back into it. `srq_context` is a key, never
        // dereferenced.
        let srq = non_null(
            unsafe { ffi::ibv_create_srq(pd.0.pd.as_ptr(), &mut attr) },
            "ibv_create_srq",
        )?;
        // SAFETY: a created SRQ; its context is open (the PD holds it) and its op table fixed.
        let post_recv = unsafe { (*(*srq.as_ptr()).context).ops.post_srq_recv };
        let Some(post_recv) = post_recv else {
            // SAFETY: just created, not shared.
            unsafe { ffi::ibv_destroy_srq(srq.as_ptr()) };
            return Err(VerbsError::Unsupported("ibv_post_srq_recv"));
        };
        Ok(Srq(Arc::new(SrqInner {
            srq,
            post_recv,
            key,
            _pd: pd.0.clone(),
        })))
    }

    fn arm_srq(srq: &Srq, limit: u32) -> Result<(), VerbsError> {
        let mut attr = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        let mask = ffi::IBV_SRQ_LIMIT as i32;
        // SAFETY: live SRQ; `attr` is a valid `ibv_srq_attr` the call reads.
        let ret = unsafe { ffi::ibv_modify_srq(srq.0.srq.as_ptr(), &mut attr, mask) };
        check("ibv_modify_srq", ret)
    }

    fn query_srq(srq: &Srq) -> Result<SrqAttr, VerbsError> {
        let mut a = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: 0,
        };
        // SAFETY: live SRQ; `a` is a writable `ibv_srq_attr` the call fills.
        let ret = unsafe { ffi::ibv_query_srq(srq.0.srq.as_ptr(), &mut a) };
        check("ibv_query_srq", ret)?;
        Ok(SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        })
    }

    fn srq_key(srq: &Srq) -> u64 {
        srq.0.key
    }

    unsafe fn post_srq_recv<const SGES: usize>(
        srq: &Srq,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<VerbsError>> {
        let s = &srq.0;
        // SAFETY: `post_recv` is the SRQ's `ibv_post_srq_recv`; the caller upholds the
        // trait's contract on the memory the requests name.
        unsafe { chain::post_chains::<_, ffi::ibv_recv_wr, _>(s.srq.as_ptr(), s.post_recv, wrs) }
    }

    fn create_ah(pd: &Pd, attr: &AhAttr) -> Result<Ah, VerbsError> {
        let mut a = ffi::ibv_ah_attr {
            grh: ffi::ibv_global_route {
                dgid: ffi::ibv_gid {
                    raw: attr.dgid.map_or([0; 16], |g| g.0),
                },
                flow_label: attr.flow_label,
                sgid_index: attr.sgid_index,
                hop_limit: attr.hop_limit,
                traffic_class: attr.traffic_class,
            },
            dlid: attr.dlid,
            sl: attr.sl,
            src_path_bits: 0,
            static_rate: attr.static_rate,
            // RoCE needs the global route (`rdma_check_ah_attr` refuses a handle without
            // one with EINVAL); InfiniBand routes by the LID alone.
            is_global: u8::from(attr.dgid.is_some()),
            port_num: attr.port,
        };
        // SAFETY: live PD (kept alive by the returned handle); `a` is a valid attribute
        // struct the library only reads.
        let ah = non_null(
            unsafe { ffi::ibv_create_ah(pd.0.pd.as_ptr(), &mut a) },
            "ibv_create_ah",
        )?;
        Ok(Ah {
            ah,
            _pd: pd.0.clone(),
        })
    }

    fn ah_key(ah: &Ah) -> AhKey {
        // The pointer itself: `wr::send_wr` turns it back into the `ibv_ah *` of a
        // datagram's work request.
        AhKey(ah.ah.as_ptr() as usize as u64)
    }

    fn qp_num(qp: &Qp) -> u32 {
        qp.qp_num
    }

    fn modify_qp(qp: &Qp, t: &Transition) -> Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as m;
        use ffi::ibv_qp_state as s;
        let mut a = ffi::ibv_qp_attr::default();
        let mask = match *t {
            Transition::Reset => {
                a.qp_state = s::IBV_QPS_RESET;
                m::IBV_QP_STATE
            }
            Transition::Error => {
                a.qp_state = s::IBV_QPS_ERR;
                m::IBV_QP_STATE
            }
            Transition::Init(i) => {
                a.qp_state = s::IBV_QPS_INIT;
                a.pkey_index = i.pkey_index;
                a.port_num = i.port;
                a.qp_access_flags = i.access.bits();
                m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS
            }
            Transition::Rtr(r) => {
                a.qp_state = s::IBV_QPS_RTR;
                a.path_mtu = r.path_mtu as ffi::ibv_mtu;
                a.dest_qp_num = r.dest_qp_num;
                a.rq_psn = r.rq_psn;
                a.max_dest_rd_atomic = r.max_dest_rd_atomic;
                a.min_rnr_timer = r.min_rnr_timer;
                a.ah_attr.dlid = r.dlid;
                a.ah_attr.sl = r.sl;
                a.ah_attr.port_num = r.port;
                if let Some(dgid) = r.dgid {
                    a.ah_attr.is_global = 1;
                    a.ah_attr.grh = ffi::ibv_global_route {
                        dgid: ffi::ibv_gid { raw: dgid.0 },
                        flow_label: r.flow_label,
                        sgid_index: r.sgid_index,
                        hop_limit: r.hop_limit,
                        traffic_class: r.traffic_class,
                    };
                }
                m::IBV_QP_STATE
                    | m::IBV_QP_AV
                    | m::IBV_QP_PATH_MTU
                    | m::IBV_QP_DEST_QPN
                    | m::IBV_QP_RQ_PSN
                    | m::IBV_QP_MAX_DEST_RD_ATOMIC
                    | m::IBV_QP_MIN_RNR_TIMER
            }
            Transition::InitUd(i) => {
                a.qp_state = s::IBV_QPS_INIT;
                a.pkey_index = i.pkey_index;
                a.port_num = i.port;
                a.qkey = i.qkey;
                m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY
            }
            Transition::RtrUd => {
                a.qp_state = s::IBV_QPS_RTR;
                m::IBV_QP_STATE
            }
            Transition::RtsUd { sq_psn } => {
                a.qp_state = s::IBV_QPS_RTS;
                a.sq_psn = sq_psn;
                m::IBV_QP_STATE | m::IBV_QP_SQ_PSN
            }
            Transition::Rts(r) => {
                a.qp_state = s::IBV_QPS_RTS;
                a.sq_psn = r.sq_psn;
                a.timeout = r.timeout;
                a.retry_cnt = r.retry_cnt;
                a.rnr_retry = r.rnr_retry;
                a.max_rd_atomic = r.max_rd_atomic;
                m::IBV_QP_STATE
                    | m::IBV_QP_SQ_PSN
                    | m::IBV_QP_TIMEOUT
                    | m::IBV_QP_RETRY_CNT
                    | m::IBV_QP_RNR_RETRY
                    | m::IBV_QP_MAX_QP_RD_ATOMIC
            }
        };
        // SAFETY: live QP; `a` is a valid attribute struct whose masked fields are set.
        let ret = unsafe { ffi::ibv_modify_qp(qp.qp.as_ptr(), &mut a, mask.0 as i32) };
        check("ibv_modify_qp", ret)
    }

    fn query_qp_state(qp: &Qp) -> Result<QpState, VerbsError> {
        let a = query_qp(qp, ffi::ibv_qp_attr_mask::IBV_QP_STATE)?;
        Ok(qp_state(a.qp_state))
    }

    fn query_path(qp: &Qp) -> Result<PathAttr, VerbsError> {
        use ffi::ibv_qp_attr_mask as m;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MIN_RNR_TIMER
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY;
        let a = query_qp(qp, mask)?;
        // Before RTR (and after a reset) the device holds no path, or a stale one.
        if matches!(qp_state(a.qp_state), QpState::Reset | QpState::Init) {
            return Err(VerbsError::Invalid("the queue pair has no path before RTR"));
        }
        let path_mtu = u8::try_from(a.path_mtu)
            .ok()
            .and_then(Mtu::from_raw)
            .ok_or(VerbsError::Invalid("ibv_query_qp gave no valid path MTU"))?;
        let (ah, grh) = (&a.ah_attr, &a.ah_attr.grh);
        let global = ah.is_global != 0;
        // SAFETY: `raw` is the byte view of the GID union; every bit pattern is valid.
        let dgid = Gid(unsafe { grh.dgid.raw });
        Ok(PathAttr {
            path_mtu,
            dest_qp_num: a.dest_qp_num,
            sq_psn: a.sq_psn,
            rq_psn: a.rq_psn,
            dlid: ah.dlid,
            dgid: global.then_some(dgid),
            sgid_index: if global { grh.sgid_index } else { 0 },
            sl: ah.sl,
            traffic_class: if global { grh.traffic_class } else { 0 },
            flow_label: if global { grh.flow_label } else { 0 },
            hop_limit: if global { grh.hop_limit } else { 0 },
            min_rnr_timer: a.min_rnr_timer,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
        })
    }

    unsafe fn post_send<const SGES: usize>(
        qp: &Qp,
        wrs: &[SendWr<SGES>],
    ) -> Result<(), PostError<VerbsError>> {
        // SAFETY: the caller upholds the trait's contract on the memory the requests name.
        unsafe { chain::post_chains::<_, ffi::ibv_send_wr, _>(qp.qp.as_ptr(), qp.post_send, wrs) }
    }

    type SendEntry<const SGES: usize> = entry::Entry<SGES>;

    #[inline(always)]
    unsafe fn post_send_entries<const SGES: usize>(
        qp: &Qp,
        entries: &mut [entry::Entry<SGES>],
    ) -> Result<(), PostError<VerbsError>> {
        // SAFETY: `post_send` is the queue pair's own; the caller upholds the trait's
        // contract on the memory the entries name.
        unsafe { entry::post_entries(qp.qp.as_ptr(), qp.post_send, entries) }
    }

    unsafe fn post_recv<const SGES: usize>(
        qp: &Qp,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<VerbsError>> {
        // SAFETY: the caller upholds the trait's contract on the memory the requests name.
        unsafe { chain::post_chains::<_, ffi::ibv_recv_wr, _>(qp.qp.as_ptr(), qp.post_recv, wrs) }
    }
}

/// [`Verbs::poll_cq`] that failed (`n` < 0), out of line.
#[cold]
#[inline(never)]
fn poll_failed(n: i32) -> VerbsError {
    VerbsError::from_ret("ibv_poll_cq", n)
}

/// [`Verbs::poll_cq`] of a batch: up to `out.len()` completions, 16 at a time.
#[inline(never)]
fn poll_batch(cq: &Cq, out: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
    const BATCH: usize = 16;
    let mut buf = [MaybeUninit::<ffi::ibv_wc>::uninit(); BATCH];
    let mut done = 0;
    while done < out.len() {
        let want = (out.len() - done).min(BATCH);
        // SAFETY: `ibv_poll_cq` is `cq->context->ops.poll_cq(cq, n, wc)`; the pointer was
        // read from this CQ's context. `buf` has room for `want` entries.
        let n = unsafe { (cq.0.poll)(cq.0.cq.as_ptr(), want as i32, buf.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(VerbsError::from_ret("ibv_poll_cq", n));
        }
        let n = n as usize;
        for (o, wc) in out[done..].iter_mut().zip(&buf[..n]) {
            // SAFETY: the provider initialised the first `n` entries.
            *o = wr::work_completion(unsafe { wc.assume_init_ref() });
        }
        done += n;
        if n < want {
            break;
        }
    }
    // A dead device's queues just stay empty: an empty poll asks its events (at most
    // once a millisecond, on one empty poll in `LOOK_POLLS`) so a wait ends at the
    // death, not at its timeout.
    if done == 0 && !out.is_empty() && async_event::device_dead(&cq.0.ctx, &cq.0.empty_polls) {
        return Err(VerbsError::DeviceFatal);
    }
    Ok(done)
}

/// `ibv_query_qp` of the attributes in `mask`.
fn query_qp(qp: &Qp, mask: ffi::ibv_qp_attr_mask) -> Result<ffi::ibv_qp_attr, VerbsError> {
    let mut a = ffi::ibv_qp_attr::default();
    let mut init = ffi::ibv_qp_init_attr::default();
    // SAFETY: live QP; `a` and `init` are valid, writable out-structs of the library's
    // layout; the call writes only them.
    let ret = unsafe { ffi::ibv_query_qp(qp.qp.as_ptr(), &mut a, mask.0 as i32, &mut init) };
    check("ibv_query_qp", ret)?;
    Ok(a)
}

fn qp_state(state: ffi::ibv_qp_state::Type) -> QpState {
    use ffi::ibv_qp_state as s;
    match state {
        s::IBV_QPS_RESET => QpState::Reset,
        s::IBV_QPS_INIT => QpState::Init,
        s::IBV_QPS_RTR => QpState::ReadyToReceive,
        s::IBV_QPS_RTS => QpState::ReadyToSend,
        s::IBV_QPS_SQD => QpState::SendQueueDrained,
        s::IBV_QPS_SQE => QpState::SendQueueError,
        _ => QpState::Error,
    }
}
