//! A context's asynchronous events (`ibv_get_async_event`). Its `async_fd` is switched to
//! non-blocking mode when the device is opened, so a take returns at once; callers sleep
//! in `poll(2)` on the descriptor. Each event is acknowledged (`ibv_ack_async_event`) as
//! soon as it is copied: what it names is read first, so no object waits on it.

use std::os::fd::RawFd;

use ibverbs_sys as ffi;

use super::error::{errno, VerbsError};
use super::Context;
use crate::types::{AsyncEvent, AsyncEventKind, EventElement};

/// The context's `async_fd`.
pub(super) fn fd(ctx: &Context) -> RawFd {
    // SAFETY: an open context; `async_fd` is a plain field set by the library and fixed.
    unsafe { (*ctx.as_ptr()).async_fd }
}

/// `ibv_get_async_event` on the non-blocking descriptor, then its acknowledgement: the
/// event, or `None` (`EAGAIN`).
pub(super) fn get(ctx: &Context) -> Result<Option<AsyncEvent>, VerbsError> {
    // SAFETY: all-zero is a valid `ibv_async_event` (a null pointer in the union, type 0).
    let mut ev: ffi::ibv_async_event = unsafe { core::mem::zeroed() };
    // SAFETY: open context; `ev` is a valid out-pointer.
    if unsafe { ffi::ibv_get_async_event(ctx.as_ptr(), &mut ev) } != 0 {
        let e = VerbsError::last_os("ibv_get_async_event");
        return match e.errno() {
            Some(errno::EAGAIN) => Ok(None),
            _ => Err(e),
        };
    }
    let kind = AsyncEventKind::from_raw(ev.event_type as u32);
    // SAFETY: the union member read is the one the library set for this kind of event
    // (`ibv_get_async_event(3)`), and the object it points to lives until the event is
    // acknowledged below.
    let element = unsafe { element(kind, &ev.element) };
    // SAFETY: `ev` was filled by `ibv_get_async_event` and is acknowledged once.
    unsafe { ffi::ibv_ack_async_event(&mut ev) };
    Ok(Some(AsyncEvent { kind, element }))
}

/// What the event is about, from the union member its kind sets.
///
/// # Safety
/// `e` is the element of an event of `kind` not yet acknowledged.
unsafe fn element(kind: AsyncEventKind, e: &ffi::ibv_async_event__bindgen_ty_1) -> EventElement {
    use AsyncEventKind as K;
    // SAFETY (each arm): the member the library sets for the kind, pointing to a live
    // object (the caller's contract).
    unsafe {
        match kind {
            K::CqErr => EventElement::Cq((*e.cq).cq_context as u64),
            K::QpFatal
            | K::QpReqErr
            | K::QpAccessErr
            | K::CommEst
            | K::SqDrained
            | K::PathMig
            | K::PathMigErr
            | K::QpLastWqeReached => EventElement::Qp((*e.qp).qp_num),
            K::SrqErr | K::SrqLimitReached => EventElement::Srq((*e.srq).srq_context as u64),
            K::PortActive
            | K::PortErr
            | K::LidChange
            | K::PkeyChange
            | K::SmChange
            | K::ClientReregister
            | K::GidChange => EventElement::Port(u8::try_from(e.port_num).unwrap_or(0)),
            _ => EventElement::Device,
        }
    }
}
