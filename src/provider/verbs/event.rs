//! Completion channels (`ibv_comp_channel`) and the calls on a CQ that use them.
//!
//! The channel's descriptor is switched to non-blocking mode at creation, so
//! `ibv_get_cq_event` returns `EAGAIN` instead of sleeping; callers sleep in `poll(2)`.
//! Each CQ gets a process-unique key as its `cq_context`, which the events carry back.
//! `ibv_req_notify_cq` is inline in `verbs.h`: it is called through the context's op
//! table, read once per CQ.

use core::ptr::{self, NonNull};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ibverbs_sys as ffi;

use super::error::{errno, VerbsError};
use super::{non_null, ContextInner};

pub(super) type ReqNotifyFn = unsafe extern "C" fn(*mut ffi::ibv_cq, i32) -> i32;

pub(super) struct ChannelInner {
    pub(super) ch: NonNull<ffi::ibv_comp_channel>,
    fd: RawFd,
    pub(super) ctx: Arc<ContextInner>,
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_comp_channel`, destroyed once, after every CQ on
        // it (they hold this `Arc`), so the call cannot fail with `EBUSY`.
        unsafe { ffi::ibv_destroy_comp_channel(self.ch.as_ptr()) };
    }
}

// SAFETY: the channel is a descriptor and immutable fields after creation;
// `ibv_get_cq_event` on it may be called from any thread (the kernel serialises reads).
unsafe impl Send for ChannelInner {}
// SAFETY: shared use reads the descriptor and calls `ibv_get_cq_event`, which the kernel
// serialises.
unsafe impl Sync for ChannelInner {}

/// A completion channel (`ibv_comp_channel`) with a non-blocking descriptor.
pub struct CompChannel(pub(super) Arc<ChannelInner>);

/// Keys for `cq_context`: never reused in the process, so an event can never be taken for
/// a later CQ.
static KEYS: AtomicU64 = AtomicU64::new(1);

pub(super) fn next_key() -> u64 {
    KEYS.fetch_add(1, Ordering::Relaxed)
}

pub(super) fn create(ctx: &Arc<ContextInner>) -> Result<CompChannel, VerbsError> {
    // SAFETY: open context.
    let raw = unsafe { ffi::ibv_create_comp_channel(ctx.ctx.as_ptr()) };
    let ch = non_null(raw, "ibv_create_comp_channel")?;
    // SAFETY: a created channel; `fd` is a plain field set by the library and fixed.
    let fd = unsafe { (*ch.as_ptr()).fd };
    // From here on, dropping `inner` destroys the channel.
    let inner = ChannelInner {
        ch,
        fd,
        ctx: ctx.clone(),
    };
    nonblocking(fd)?;
    Ok(CompChannel(Arc::new(inner)))
}

/// Puts descriptor `fd` (a verbs or connection manager channel's, or a context's
/// `async_fd`: open, owned by the library object the caller holds) in non-blocking mode.
pub(super) fn nonblocking(fd: RawFd) -> Result<(), VerbsError> {
    // SAFETY: `fd` is an open descriptor (the caller's contract); F_GETFL and F_SETFL
    // take and return ints and touch only its status flags.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    match ok {
        true => Ok(()),
        false => Err(VerbsError::last_os("fcntl(O_NONBLOCK)")),
    }
}

pub(super) fn fd(ch: &CompChannel) -> RawFd {
    ch.0.fd
}

/// `ibv_get_cq_event` on the non-blocking descriptor: the `cq_context` (our key) of the
/// CQ that fired, or `None` (`EAGAIN`).
pub(super) fn get(ch: &CompChannel) -> Result<Option<u64>, VerbsError> {
    let mut cq: *mut ffi::ibv_cq = ptr::null_mut();
    let mut context: *mut core::ffi::c_void = ptr::null_mut();
    // SAFETY: live channel; `cq` and `context` are valid out-pointers.
    let ret = unsafe { ffi::ibv_get_cq_event(ch.0.ch.as_ptr(), &mut cq, &mut context) };
    if ret == 0 {
        return Ok(Some(context as u64));
    }
    let e = VerbsError::last_os("ibv_get_cq_event");
    match e.errno() {
        Some(errno::EAGAIN) => Ok(None),
        _ => Err(e),
    }
}

/// `ibv_req_notify_cq`: `cq->context->ops.req_notify_cq(cq, solicited_only)`.
pub(super) fn req_notify(
    f: ReqNotifyFn,
    cq: NonNull<ffi::ibv_cq>,
    solicited_only: bool,
) -> Result<(), VerbsError> {
    // SAFETY: `f` was read from this CQ's context's op table; the CQ is live (the caller
    // holds its handle).
    let ret = unsafe { f(cq.as_ptr(), i32::from(solicited_only)) };
    match ret {
        0 => Ok(()),
        // Providers return a positive errno; some -1 with errno set.
        e if e > 0 => Err(VerbsError::os("ibv_req_notify_cq", e)),
        e => Err(VerbsError::from_ret("ibv_req_notify_cq", e)),
    }
}
