//! The provider's work request builders (`ibv_wr_*` on an extended queue pair,
//! `ibv_qp_ex`): how an RC queue pair's send entries are posted where the provider has
//! them. A request is one builder call (its opcode and operands) and one setter call (its
//! data), inside one `ibv_wr_start` … `ibv_wr_complete` region per chain: the provider
//! writes its own queue entry from the arguments, with no `ibv_send_wr` to walk and
//! translate. On rxe this costs the provider about a quarter fewer instructions per
//! request than `ibv_post_send` (BENCHMARKS.md, section 9).
//!
//! A chain the builders cannot express as this backend uses them goes to `ibv_post_send`
//! instead, whole: one with a request of more than one gather entry (rxe before rdma-core
//! 64 miscounts a gather list's length in `ibv_wr_set_sge_list`), of an opcode without a
//! builder here, or an inline read or atomic. A queue pair the provider will not create
//! with builders (no `create_qp_ex`, or the send operations refused), and every UD queue
//! pair, posts every chain through `ibv_post_send`.

use core::ffi::c_void;
use core::mem::offset_of;
use core::ptr::NonNull;

use ibverbs_sys as ffi;

use super::entry::Entry;
use super::error::VerbsError;
use crate::provider::PostError;

type CreateQpExFn =
    unsafe extern "C" fn(*mut ffi::ibv_context, *mut ffi::ibv_qp_init_attr_ex) -> *mut ffi::ibv_qp;

/// The end of libibverbs' `struct verbs_context`, from `create_qp_ex` on: the extended
/// context grows at its front, so the distance from an op to the `ibv_context` at its end
/// is the same in every version that has the op (`verbs.h`, `verbs_get_ctx_op`).
#[repr(C)]
struct VerbsContextTail {
    create_qp_ex: Option<CreateQpExFn>,
    _get_srq_num: *const c_void,
    _create_srq_ex: *const c_void,
    _open_xrcd: *const c_void,
    _close_xrcd: *const c_void,
    _abi_placeholder3: u64,
    /// The extended context's size, from its first op to its end.
    sz: usize,
    context: ffi::ibv_context,
}

/// `verbs.h`'s `__VERBS_ABI_IS_EXTENDED`: an `abi_compat` that says the context is the
/// end of a `verbs_context`.
const ABI_IS_EXTENDED: usize = usize::MAX;

/// The send operations an RC queue pair asks builders for: every [`SendOp`](crate::SendOp).
const RC_SEND_OPS: u64 = (ffi::IBV_QP_EX_WITH_SEND
    | ffi::IBV_QP_EX_WITH_SEND_WITH_IMM
    | ffi::IBV_QP_EX_WITH_RDMA_WRITE
    | ffi::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | ffi::IBV_QP_EX_WITH_RDMA_READ
    | ffi::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | ffi::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;

/// The context's `create_qp_ex`, as `verbs_get_ctx_op` finds it: `None` if the context is
/// not extended or its provider has no such op.
///
/// # Safety
/// `ctx` is an open device context.
unsafe fn create_qp_ex_op(ctx: *mut ffi::ibv_context) -> Option<CreateQpExFn> {
    // SAFETY: `ctx` is open (this function's contract); `abi_compat` is set at its opening.
    if unsafe { (*ctx).abi_compat } as usize != ABI_IS_EXTENDED {
        return None;
    }
    let tail = ctx
        .cast::<u8>()
        .wrapping_sub(offset_of!(VerbsContextTail, context))
        .cast::<VerbsContextTail>();
    // SAFETY: an extended context (`abi_compat`) is the last member of a `verbs_context`,
    // whose last members from `create_qp_ex` on are `VerbsContextTail`'s, in its order;
    // `sz` says the provider's struct reaches back that far (it is read first, and lies
    // just before `context`, in every version).
    unsafe {
        if (*tail).sz < core::mem::size_of::<VerbsContextTail>() {
            return None;
        }
        (*tail).create_qp_ex
    }
}

/// Creates an RC queue pair as `attr` says, with builders for every send operation:
/// the queue pair and its builders, or `None` if the provider will not (then create it
/// with `ibv_create_qp`; errno is not meaningful).
///
/// # Safety
/// As `ibv_create_qp`: `pd` and the CQs and SRQ `attr` names are live.
pub(super) unsafe fn create_rc(
    pd: *mut ffi::ibv_pd,
    attr: &ffi::ibv_qp_init_attr,
) -> Option<(NonNull<ffi::ibv_qp>, Builders)> {
    // SAFETY: a live PD's context is open (this function's contract).
    let ctx = unsafe { (*pd).context };
    // SAFETY: as above.
    let create = unsafe { create_qp_ex_op(ctx) }?;
    // SAFETY: integers and raw pointers: all zeroes is a valid value (no SRQ, XRC domain
    // or indirection table; no flags).
    let mut ex: ffi::ibv_qp_init_attr_ex = unsafe { core::mem::zeroed() };
    ex.send_cq = attr.send_cq;
    ex.recv_cq = attr.recv_cq;
    ex.srq = attr.srq;
    ex.cap = attr.cap;
    ex.qp_type = attr.qp_type;
    ex.sq_sig_all = attr.sq_sig_all;
    ex.comp_mask = ffi::IBV_QP_INIT_ATTR_PD | ffi::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ex.pd = pd;
    ex.send_ops_flags = RC_SEND_OPS;
    // SAFETY: the provider's own op, called as `ibv_create_qp_ex` calls it, on a valid
    // `ex` naming live objects (this function's contract).
    let qp = NonNull::new(unsafe { create(ctx, &mut ex) })?;
    // SAFETY: created with send operations, so it is an extended queue pair.
    match NonNull::new(unsafe { ffi::ibv_qp_to_qp_ex(qp.as_ptr()) }).and_then(Builders::of) {
        Some(b) => Some((qp, b)),
        None => {
            // SAFETY: just created, not shared.
            unsafe { ffi::ibv_destroy_qp(qp.as_ptr()) };
            None
        }
    }
}

/// An extended RC queue pair's builders and setters, read once from it (the provider sets
/// them at its creation), every one present.
pub(super) struct Builders {
    qpx: NonNull<ffi::ibv_qp_ex>,
    start: unsafe extern "C" fn(*mut ffi::ibv_qp_ex),
    complete: unsafe extern "C" fn(*mut ffi::ibv_qp_ex) -> i32,
    abort: unsafe extern "C" fn(*mut ffi::ibv_qp_ex),
    send: unsafe extern "C" fn(*mut ffi::ibv_qp_ex),
    send_imm: unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32),
    write: unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64),
    write_imm: unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u32),
    read: unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64),
    compare_swap: unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u64, u64),
    fetch_add: unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u64),
    set_sge: unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u32),
    set_sge_list: unsafe extern "C" fn(*mut ffi::ibv_qp_ex, usize, *const ffi::ibv_sge),
    set_inline: unsafe extern "C" fn(*mut ffi::ibv_qp_ex, *mut c_void, usize),
}

impl Builders {
    /// The builders of the extended queue pair `qpx`, if it has all of them.
    fn of(qpx: NonNull<ffi::ibv_qp_ex>) -> Option<Builders> {
        // SAFETY: a live extended queue pair, not yet shared; its function pointers are
        // fixed.
        let q = unsafe { qpx.as_ref() };
        Some(Builders {
            qpx,
            start: q.wr_start?,
            complete: q.wr_complete?,
            abort: q.wr_abort?,
            send: q.wr_send?,
            send_imm: q.wr_send_imm?,
            write: q.wr_rdma_write?,
            write_imm: q.wr_rdma_write_imm?,
            read: q.wr_rdma_read?,
            compare_swap: q.wr_atomic_cmp_swp?,
            fetch_add: q.wr_atomic_fetch_add?,
            set_sge: q.wr_set_sge?,
            set_sge_list: q.wr_set_sge_list?,
            set_inline: q.wr_set_inline_data?,
        })
    }

    /// Posts `entries` as one region of builder calls (one doorbell), all or nothing
    /// (a refusal's index is 0), or, if one of them is not buildable here (the module's
    /// doc says which), with `legacy` (`ibv_post_send`). Links and `sg_list`s are not
    /// read.
    ///
    /// # Safety
    /// The queue pair is live; the caller upholds the provider trait's contract on the
    /// memory the entries name.
    #[inline(always)]
    pub(super) unsafe fn post<const SGES: usize>(
        &self,
        entries: &mut [Entry<SGES>],
        legacy: impl FnOnce(&mut [Entry<SGES>]) -> Result<(), PostError<VerbsError>>,
    ) -> Result<(), PostError<VerbsError>> {
        if let [e] = entries {
            // One request is checked before its region is opened; `build`'s own answer
            // still decides (the two agree: `builder/tests.rs`), so a request is never
            // left out of a region that completes.
            if buildable(e) {
                let q = self.qpx.as_ptr();
                // SAFETY: as in `post_region`.
                unsafe {
                    (self.start)(q);
                    if self.build(q, e) {
                        let ret = (self.complete)(q);
                        return if ret == 0 { Ok(()) } else { Err(refused(ret)) };
                    }
                    (self.abort)(q);
                }
            }
            return not_built(entries, legacy);
        }
        // SAFETY: forwarded contract.
        match unsafe { self.post_chain(entries) } {
            Some(ret) => ret,
            None => not_built(entries, legacy),
        }
    }

    /// [`post`](Self::post)'s region of a chain, out of line.
    ///
    /// # Safety
    /// As [`post`](Self::post).
    #[inline(never)]
    unsafe fn post_chain<const SGES: usize>(
        &self,
        entries: &[Entry<SGES>],
    ) -> Option<Result<(), PostError<VerbsError>>> {
        // SAFETY: forwarded contract.
        unsafe { self.post_region(entries) }
    }

    /// [`post`](Self::post)'s region: `None` (nothing done) if an entry is not buildable.
    ///
    /// # Safety
    /// As [`post`](Self::post).
    #[inline(always)]
    unsafe fn post_region<const SGES: usize>(
        &self,
        entries: &[Entry<SGES>],
    ) -> Option<Result<(), PostError<VerbsError>>> {
        let q = self.qpx.as_ptr();
        // SAFETY: the queue pair's own builders (read at its creation), called as
        // `verbs.h`'s `ibv_wr_*` call them: `start`, then per request `wr_id` and
        // `wr_flags` written inside the region (the provider's lock holds them ours),
        // one builder and one data setter, then `complete` (or `abort`, which discards
        // the region). An inline setter copies its bytes during the call; other memory is
        // the caller's contract.
        unsafe {
            (self.start)(q);
            for e in entries {
                if !self.build(q, e) {
                    (self.abort)(q);
                    return None;
                }
            }
            let ret = (self.complete)(q);
            if ret != 0 {
                return Some(Err(refused(ret)));
            }
        }
        Some(Ok(()))
    }

    /// Builds `e` in the open region of `q`; `false` (nothing built) if it is not
    /// buildable here. The usual request, one gather entry and not inline, a write or a
    /// send, is tested first, with the rest out of line.
    ///
    /// # Safety
    /// As [`post`](Self::post), inside its region.
    #[inline(always)]
    unsafe fn build<const SGES: usize>(&self, q: *mut ffi::ibv_qp_ex, e: &Entry<SGES>) -> bool {
        use ffi::ibv_wr_opcode as op;
        let wr = e.wr();
        let Some(sge) = e.sges().first() else {
            // SAFETY: forwarded contract.
            return unsafe { self.build_other(q, e) };
        };
        if wr.num_sge != 1 || wr.send_flags & INLINE != 0 {
            // SAFETY: forwarded contract.
            return unsafe { self.build_other(q, e) };
        }
        // SAFETY: the region is open (this function's contract); the union members read
        // are the ones `set_op` wrote for the opcode.
        unsafe {
            (*q).wr_id = wr.wr_id;
            (*q).wr_flags = wr.send_flags;
            if wr.opcode == op::IBV_WR_RDMA_WRITE {
                (self.write)(q, wr.wr.rdma.rkey, wr.wr.rdma.remote_addr);
            } else if wr.opcode == op::IBV_WR_SEND {
                (self.send)(q);
            } else if !self.build_op(q, wr, false) {
                return false;
            }
            (self.set_sge)(q, sge.lkey, sge.addr, sge.length);
        }
        true
    }

    /// [`build`](Self::build) of a request with no gather entry, or inline, or more than
    /// one gather entry (not buildable).
    ///
    /// # Safety
    /// As [`build`](Self::build).
    #[cold]
    #[inline(never)]
    unsafe fn build_other<const SGES: usize>(
        &self,
        q: *mut ffi::ibv_qp_ex,
        e: &Entry<SGES>,
    ) -> bool {
        let wr = e.wr();
        let inline = wr.send_flags & INLINE != 0;
        let sge = match (wr.num_sge, e.sges().first()) {
            (0, _) => None,
            (1, Some(s)) => Some(s),
            _ => return false,
        };
        // SAFETY: the region is open (this function's contract).
        unsafe {
            (*q).wr_id = wr.wr_id;
            (*q).wr_flags = wr.send_flags;
            if !self.build_op(q, wr, inline) {
                return false;
            }
            match sge {
                Some(s) if inline => (self.set_inline)(q, s.addr as *mut c_void, s.length as usize),
                Some(s) => (self.set_sge)(q, s.lkey, s.addr, s.length),
                None => (self.set_sge_list)(q, 0, e.sges().as_ptr().cast()),
            }
        }
        true
    }

    /// Calls `wr`'s builder; `false` (nothing built) if it has none here, or it is
    /// `inline` and not a send or a write.
    ///
    /// # Safety
    /// As [`build`](Self::build), with `wr_id` and `wr_flags` written.
    #[inline]
    unsafe fn build_op(&self, q: *mut ffi::ibv_qp_ex, wr: &ffi::ibv_send_wr, inline: bool) -> bool {
        use ffi::ibv_wr_opcode as op;
        // SAFETY: the region is open (this function's contract); the union members read
        // are the ones `set_op` wrote for the opcode.
        unsafe {
            let (rdma, atomic, imm) = (wr.wr.rdma, wr.wr.atomic, wr.__bindgen_anon_1.imm_data);
            match wr.opcode {
                op::IBV_WR_SEND => (self.send)(q),
                op::IBV_WR_RDMA_WRITE => (self.write)(q, rdma.rkey, rdma.remote_addr),
                op::IBV_WR_SEND_WITH_IMM => (self.send_imm)(q, imm),
                op::IBV_WR_RDMA_WRITE_WITH_IMM => {
                    (self.write_imm)(q, rdma.rkey, rdma.remote_addr, imm)
                }
                _ if inline => return false,
                op::IBV_WR_RDMA_READ => (self.read)(q, rdma.rkey, rdma.remote_addr),
                op::IBV_WR_ATOMIC_CMP_AND_SWP => (self.compare_swap)(
                    q,
                    atomic.rkey,
                    atomic.remote_addr,
                    atomic.compare_add,
                    atomic.swap,
                ),
                op::IBV_WR_ATOMIC_FETCH_AND_ADD => {
                    (self.fetch_add)(q, atomic.rkey, atomic.remote_addr, atomic.compare_add)
                }
                _ => return false,
            }
        }
        true
    }
}

/// Whether [`Builders::build`] builds `e`.
#[inline(always)]
fn buildable<const SGES: usize>(e: &Entry<SGES>) -> bool {
    use ffi::ibv_wr_opcode as op;
    let wr = e.wr();
    let inline = wr.send_flags & INLINE != 0;
    let sges = match wr.num_sge {
        0 => true,
        1 => SGES > 0,
        _ => false,
    };
    sges && match wr.opcode {
        op::IBV_WR_SEND
        | op::IBV_WR_RDMA_WRITE
        | op::IBV_WR_SEND_WITH_IMM
        | op::IBV_WR_RDMA_WRITE_WITH_IMM => true,
        op::IBV_WR_RDMA_READ | op::IBV_WR_ATOMIC_CMP_AND_SWP | op::IBV_WR_ATOMIC_FETCH_AND_ADD => {
            !inline
        }
        _ => false,
    }
}

/// `IBV_SEND_INLINE`.
const INLINE: u32 = ffi::ibv_send_flags::IBV_SEND_INLINE.0;

/// A region `ibv_wr_complete` refused (nothing posted).
#[cold]
#[inline(never)]
fn refused(ret: i32) -> PostError<VerbsError> {
    PostError {
        index: 0,
        error: VerbsError::from_ret("ibv_wr_complete", ret),
    }
}

/// A chain the builders do not express, posted with `legacy`.
#[cold]
#[inline(never)]
fn not_built<const SGES: usize>(
    entries: &mut [Entry<SGES>],
    legacy: impl FnOnce(&mut [Entry<SGES>]) -> Result<(), PostError<VerbsError>>,
) -> Result<(), PostError<VerbsError>> {
    legacy(entries)
}

#[cfg(test)]
mod tests;
