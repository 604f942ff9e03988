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
//! directly on the data path. An RC queue pair is created with the provider's send
//! builders where it has them (`ibv_create_qp_ex`), and a channel's sends go through them
//! (`builder`): cheaper for the provider than `ibv_post_send` (on rxe by about a quarter).
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
//! Map: this file is `impl Provider for Verbs`, verb by verb in the trait's order, with
//! the data path (posting, the one-completion poll) inline here, where it is checked
//! against the verbs API. In `verbs/`: `handles` (the owned objects, `ContextInner` …
//! `Ah`, each destroyed once by `Drop`, with their `Send`/`Sync` contracts), `device` (the
//! device list, opening, device and port queries), `qp_attr` (the typestate's
//! transitions as `ibv_modify_qp`, and `ibv_query_qp`), `builder` (an RC queue pair's
//! sends through the provider's `ibv_wr_*` builders), `chain` and `entry` (chains of
//! requests through `ibv_post_send`: `well_formed`, `link`, `bad_index`), `wr` (work
//! requests and completions translated), `error`, `event` (completion channels),
//! `async_event`, `gid` (GID selection) and `cm` (the connection manager).

mod async_event;
mod builder;
mod chain;
mod cm;
mod device;
mod entry;
mod error;
mod event;
mod gid;
mod handles;
mod qp_attr;
mod wr;

pub use cm::{CmChannel, CmId};
pub use error::{NoSuchDevice, VerbsError};
pub use event::CompChannel;
pub use gid::{GidEntry, GidSelect, GidType};
pub use handles::{Ah, Context, Cq, Mr, Pd, Qp, Srq};

use handles::{ContextInner, CqInner, PdInner, PostFn, SrqInner};

use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use ibverbs_sys as ffi;

use super::{AhAttr, PathAttr, PostError, Provider, Transition};
use std::os::fd::RawFd;

use crate::types::{
    AccessFlags, AhKey, AsyncEvent, Gid, Mtu, PortAttr, QpCaps, QpState, QpType, RecvWr, SendWr,
    SrqAttr, WorkCompletion,
};
use device::{device_name, with_device_list};
use error::check;

/// The verbs provider. A unit value: the device list is libibverbs' own.
#[derive(Clone, Copy, Debug, Default)]
pub struct Verbs;

impl Verbs {
    /// The names of the devices present (empty when there are none or libibverbs cannot
    /// list them).
    pub fn devices() -> Vec<String> {
        with_device_list(|l| l.iter().map(|d| device_name(d).to_owned()).collect())
            .unwrap_or_default()
    }
}

fn non_null<T>(p: *mut T, verb: &'static str) -> Result<NonNull<T>, VerbsError> {
    NonNull::new(p).ok_or_else(|| VerbsError::last_os(verb))
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
    type Wc = ffi::ibv_wc;

    fn for_each_device(&self, f: &mut dyn FnMut(&str)) {
        let _ = with_device_list(|l| l.iter().for_each(|d| f(device_name(d))));
    }

    fn open_device(&self, name: &str) -> Result<Context, VerbsError> {
        device::open(name)
    }

    fn query_device(ctx: &Context) -> Result<crate::types::DeviceAttr, VerbsError> {
        device::query(ctx)
    }

    fn query_port(ctx: &Context, port: u8) -> Result<PortAttr, VerbsError> {
        device::query_port(ctx, port)
    }

    fn query_gid(ctx: &Context, port: u8, index: u8) -> Result<Gid, VerbsError> {
        device::query_gid(ctx, port, index)
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
            return Ok(match Self::poll_cq_one(cq, &mut wc)? {
                Some(wc) => {
                    *o = wr::work_completion(wc);
                    1
                }
                None => 0,
            });
        }
        poll_batch(cq, out)
    }

    #[inline(always)]
    fn poll_cq_one<'a>(
        cq: &Cq,
        out: &'a mut MaybeUninit<ffi::ibv_wc>,
    ) -> Result<Option<&'a ffi::ibv_wc>, VerbsError> {
        // SAFETY: `poll` is this CQ's `poll_cq` from its context's op table (as
        // `ibv_poll_cq` calls it); `out` has room for the one entry asked for.
        let n = unsafe { (cq.0.poll)(cq.0.cq.as_ptr(), 1, out.as_mut_ptr()) };
        if n > 0 {
            // SAFETY: the provider initialised the one entry it was given.
            return Ok(Some(unsafe { out.assume_init_ref() }));
        }
        // Nothing, the usual poll of a spinning wait: inline too. A dead device's queues
        // just stay empty, so an empty poll asks about the device's events (at most once a
        // millisecond, on one empty poll in `LOOK_POLLS`), and a wait ends at the death,
        // not at its timeout.
        if n == 0 {
            return match async_event::device_dead(&cq.0.ctx, &cq.0.empty_polls) {
                false => Ok(None),
                true => Err(VerbsError::DeviceFatal),
            };
        }
        Err(poll_failed(n))
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
        // An RC queue pair sends through the provider's builders where it has them.
        let built = match ty {
            // SAFETY: live PD, CQs and SRQ (kept alive by the returned handle).
            QpType::Rc => unsafe { builder::create_rc(pd.0.pd.as_ptr(), &attr) },
            QpType::Ud => None,
        };
        let (qp, builders) = match built {
            Some((qp, builders)) => (qp, Some(builders)),
            // SAFETY: live PD, CQs and SRQ (kept alive by the returned handle); `attr` is
            // valid and the library may write the granted capabilities back into it.
            None => (
                non_null(
                    unsafe { ffi::ibv_create_qp(pd.0.pd.as_ptr(), &mut attr) },
                    "ibv_create_qp",
                )?,
                None,
            ),
        };
        // SAFETY: a created QP; `context` and `qp_num` are set by the library and fixed.
        let (ctx, qp_num) = unsafe { ((*qp.as_ptr()).context, (*qp.as_ptr()).qp_num) };
        // SAFETY: the QP's context is open (the PD holds it); its op table is fixed.
        let (post_send, post_recv) = unsafe { ((*ctx).ops.post_send, (*ctx).ops.post_recv) };
        let (Some(post_send), Some(post_recv)) = (post_send, post_recv) else {
            // SAFETY: just created, not shared.
            unsafe { ffi::ibv_destroy_qp(qp.as_ptr()) };
            return Err(VerbsError::Unsupported("ibv_post_send/ibv_post_recv"));
        };
        crate::trace::event!(
            debug,
            qp = qp_num,
            builders = builders.is_some(),
            "a queue pair created: sends through the provider's builders, or ibv_post_send"
        );
        Ok(Qp {
            qp,
            qp_num,
            post_send,
            post_recv,
            builders,
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
        qp_attr::modify(qp, t)
    }

    fn query_qp_state(qp: &Qp) -> Result<QpState, VerbsError> {
        qp_attr::state(qp)
    }

    fn query_path(qp: &Qp) -> Result<PathAttr, VerbsError> {
        qp_attr::path(qp)
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
        // A chain not linked before: as `post_send_chain` posts it.
        // SAFETY: forwarded contract; `linked` false claims nothing.
        unsafe { Self::post_send_chain(qp, entries, false) }
    }

    #[inline(always)]
    unsafe fn post_send_chain<const SGES: usize>(
        qp: &Qp,
        entries: &mut [entry::Entry<SGES>],
        linked: bool,
    ) -> Result<(), PostError<VerbsError>> {
        if let Some(b) = &qp.builders {
            // SAFETY: the queue pair's own builders and `post_send`; the caller upholds
            // the trait's contract on the memory the entries name. The builders' posts
            // link nothing, so a chain they leave to `post_send` is linked again
            // (`linked` is not theirs).
            return unsafe {
                b.post(entries, |e| {
                    entry::post_entries(qp.qp.as_ptr(), qp.post_send, e)
                })
            };
        }
        // SAFETY: `post_send` is the queue pair's own; the caller upholds the trait's
        // contract on the memory the entries name and on `linked`.
        unsafe { entry::post_entries_linked(qp.qp.as_ptr(), qp.post_send, entries, linked) }
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
