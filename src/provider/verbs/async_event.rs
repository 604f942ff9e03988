//! A context's asynchronous events (`ibv_get_async_event`), and what they tell the data
//! path: whether the device is dead.
//!
//! A device that dies (`IBV_EVENT_DEVICE_FATAL`) says so only on this queue: its completion
//! queues just stay empty, so a wait would run to its timeout. So the library looks at the
//! queue itself: a poll of a completion queue that finds nothing looks at most once per
//! [`LOOK_EVERY_NS`] (a coarse clock read, on one empty poll in [`LOOK_POLLS`] of each
//! queue; a counter otherwise), takes what the device queued into
//! [`Events::queue`], and from a `DEVICE_FATAL` on fails every empty poll with
//! [`VerbsError::DeviceFatal`]. Sleeping waits also watch the device's descriptor
//! ([`Events::device_fd`]) and look when it wakes them. Events taken so wait in order for
//! [`get`], which serves them first.
//!
//! Invariants:
//! - The device's `async_fd` is non-blocking, and read only with `queue` locked, so events
//!   reach callers in the device's order.
//! - `ready` (an eventfd) counts 1 exactly while `queue` is non-empty, kept so under the
//!   lock; the descriptor callers sleep on ([`Events::fd`]) is an epoll set of `async_fd`
//!   and `ready`, readable while an event waits in either place. A caller sleeping on it
//!   so misses no event another thread moved into the queue.
//! - Each event is acknowledged (`ibv_ack_async_event`) as soon as it is copied: what it
//!   names is read first, so no object waits on it.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use ibverbs_sys as ffi;

use super::error::{errno, VerbsError};
use super::{Context, ContextInner};
use crate::types::{AsyncEvent, AsyncEventKind, EventElement};

/// How often an empty poll looks at the device's events: once a millisecond (the coarse
/// clock's resolution is 1 to 4 ms), so a dead device ends a wait within a few ms.
const LOOK_EVERY_NS: u64 = 1_000_000;
/// Empty polls of one queue per clock read (the clock costs about as much as the poll):
/// a spinning or yielding wait polls far more often than once a millisecond, so a dead
/// device still ends it within a few ms; a caller that sleeps between polls of its own
/// learns of it within this many of them.
pub(super) const LOOK_POLLS: u32 = 16;
/// Events kept for [`get`] at most; past it the oldest is dropped (a program that never
/// reads its events must not grow without bound). `DEVICE_FATAL` is remembered apart.
const KEPT: usize = 256;

/// A context's event state (in `ContextInner`).
pub(super) struct Events {
    /// The device's own `async_fd`: readable while the kernel holds events the library has
    /// not read. What the library's sleepers watch (not `epoll`, which stays readable while
    /// events wait in `queue` for a program that may never read them).
    device: RawFd,
    /// An eventfd: 1 while `queue` holds events.
    ready: OwnedFd,
    /// Readable while the device or `queue` holds events: `device` and `ready`.
    epoll: OwnedFd,
    queue: Mutex<VecDeque<AsyncEvent>>,
    dead: AtomicBool,
    /// When an empty poll next looks at the device (coarse monotonic clock, ns).
    next_look: AtomicU64,
}

impl Events {
    /// The state for a context whose `async_fd` is `device`; switches it to non-blocking.
    pub(super) fn new(device: RawFd) -> Result<Events, VerbsError> {
        super::event::nonblocking(device)?;
        let ready = owned(
            // SAFETY: creates a descriptor; no pointers.
            unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) },
            "eventfd",
        )?;
        // SAFETY: creates a descriptor; no pointers.
        let epoll = owned(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            "epoll_create1",
        )?;
        for fd in [device, ready.as_raw_fd()] {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: fd as u64,
            };
            // SAFETY: both descriptors are open; `ev` is a valid event the call copies.
            let ret =
                unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
            if ret != 0 {
                return Err(VerbsError::last_os("epoll_ctl"));
            }
        }
        Ok(Events {
            device,
            ready,
            epoll,
            queue: Mutex::new(VecDeque::new()),
            dead: AtomicBool::new(false),
            next_look: AtomicU64::new(0),
        })
    }

    /// The descriptor a program sleeps on: readable while an event waits for it.
    pub(super) fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// The descriptor the library's sleepers watch: readable while the kernel holds events
    /// not looked at yet.
    pub(super) fn device_fd(&self) -> RawFd {
        self.device
    }

    /// Whether the device reported `DEVICE_FATAL`; looks for new events on one call in
    /// [`LOOK_POLLS`] of those counted by `empty_polls` (a queue's), at most once per
    /// [`LOOK_EVERY_NS`], and not while another thread reads them. For empty polls.
    #[inline(always)]
    pub(super) fn device_dead(&self, ctx: *mut ffi::ibv_context, empty_polls: &AtomicU32) -> bool {
        if self.dead.load(Ordering::Relaxed) {
            return true;
        }
        // A count, not synchronization: load and store, no locked read-modify-write (a
        // count lost to a race only delays a look by a poll).
        let n = empty_polls.load(Ordering::Relaxed).wrapping_add(1);
        empty_polls.store(n, Ordering::Relaxed);
        n % LOOK_POLLS == 0 && self.look(ctx)
    }

    /// [`device_dead`](Self::device_dead)'s look, if [`LOOK_EVERY_NS`] has passed since
    /// the last.
    #[cold]
    #[inline(never)]
    fn look(&self, ctx: *mut ffi::ibv_context) -> bool {
        let now = coarse_now_ns();
        if now < self.next_look.load(Ordering::Relaxed) {
            return false;
        }
        self.next_look.store(now + LOOK_EVERY_NS, Ordering::Relaxed);
        let Ok(mut queue) = self.queue.try_lock() else {
            return false; // another thread reads them now
        };
        self.drain(ctx, &mut queue);
        self.dead.load(Ordering::Relaxed)
    }

    /// As [`device_dead`](Self::device_dead), looking at once (waiting for a reader in
    /// another thread, not skipping): for a sleeper the device's descriptor just woke.
    pub(super) fn device_dead_now(&self, ctx: *mut ffi::ibv_context) -> bool {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        self.drain(ctx, &mut queue);
        self.dead.load(Ordering::Relaxed)
    }

    /// Moves what the device queued into `queue` (locked by the caller), the oldest
    /// dropped past [`KEPT`]. A failed read (other than EAGAIN) is not a verdict: the next
    /// look reads again.
    fn drain(&self, ctx: *mut ffi::ibv_context, queue: &mut VecDeque<AsyncEvent>) {
        while let Ok(Some(ev)) = self.read(ctx) {
            if queue.len() == KEPT {
                queue.pop_front();
            }
            queue.push_back(ev);
        }
        self.set_ready(!queue.is_empty());
    }

    /// The oldest event: a kept one first, then the device's.
    fn take(&self, ctx: *mut ffi::ibv_context) -> Result<Option<AsyncEvent>, VerbsError> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ev) = queue.pop_front() {
            self.set_ready(!queue.is_empty());
            return Ok(Some(ev));
        }
        self.read(ctx)
    }

    /// `ibv_get_async_event` on the non-blocking descriptor, then its acknowledgement: the
    /// event, or `None` (`EAGAIN`). Only with `queue` locked.
    fn read(&self, ctx: *mut ffi::ibv_context) -> Result<Option<AsyncEvent>, VerbsError> {
        // SAFETY: all-zero is a valid `ibv_async_event` (a null pointer in the union, type 0).
        let mut ev: ffi::ibv_async_event = unsafe { core::mem::zeroed() };
        // SAFETY: `ctx` is the open context this state belongs to; `ev` is a valid
        // out-pointer.
        if unsafe { ffi::ibv_get_async_event(ctx, &mut ev) } != 0 {
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
        if kind == AsyncEventKind::DeviceFatal {
            crate::trace::event!(error, "the device raised DEVICE_FATAL: every wait ends");
            self.dead.store(true, Ordering::Relaxed);
        }
        Ok(Some(AsyncEvent { kind, element }))
    }

    /// Makes `ready` count 1 if `events`, else 0. Only with `queue` locked.
    fn set_ready(&self, events: bool) {
        let fd = self.ready.as_raw_fd();
        let mut count = 0u64;
        // SAFETY: an open non-blocking eventfd; `count` is 8 writable bytes. Reading
        // resets the count to 0 (or fails with EAGAIN when it is 0 already).
        let _ = unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) };
        if events {
            let one = 1u64;
            // SAFETY: as above; 8 readable bytes. The count was 0, so it cannot overflow.
            let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
        }
    }
}

/// The context's descriptor for sleeping on its events (an epoll set: see the module).
pub(super) fn fd(ctx: &Context) -> RawFd {
    ctx.0.events.fd()
}

/// The oldest event, or `None` when none is queued.
pub(super) fn get(ctx: &Context) -> Result<Option<AsyncEvent>, VerbsError> {
    ctx.0.events.take(ctx.as_ptr())
}

/// Whether `ctx`'s device is dead, looking at its events now.
pub(super) fn device_dead_now(ctx: &ContextInner) -> bool {
    ctx.events.device_dead_now(ctx.ctx.as_ptr())
}

/// Whether `ctx`'s device is known dead, for an empty poll of the queue whose count of
/// them is `empty_polls` (see [`Events::device_dead`]).
#[inline(always)]
pub(super) fn device_dead(ctx: &ContextInner, empty_polls: &AtomicU32) -> bool {
    ctx.events.device_dead(ctx.ctx.as_ptr(), empty_polls)
}

fn owned(fd: RawFd, verb: &'static str) -> Result<OwnedFd, VerbsError> {
    if fd < 0 {
        return Err(VerbsError::last_os(verb));
    }
    // SAFETY: a descriptor just created and owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `CLOCK_MONOTONIC_COARSE` in ns: a read of the vDSO's page, no system call.
fn coarse_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; the clock exists on every Linux since 2.6.32.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        unsafe { libc::poll(&mut p, 1, 0) > 0 }
    }

    /// The descriptor a program sleeps on is readable exactly while the device (a pipe
    /// standing for its `async_fd`) or the library's queue holds events; the library's
    /// own sleepers watch the device alone.
    #[test]
    fn the_descriptor_is_readable_while_the_device_or_the_queue_holds_events() {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both are new and owned here.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let ev = Events::new(r.as_raw_fd()).unwrap();
        assert!(!readable(ev.fd()) && !readable(ev.device_fd()));
        // SAFETY: one byte from a valid buffer to an open pipe.
        let wrote = unsafe { libc::write(w.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        assert_eq!(wrote, 1);
        let both = readable(ev.fd()) && readable(ev.device_fd());
        assert!(both, "the device has one");
        let mut b = [0u8; 1];
        // SAFETY: one byte into a valid buffer from an open pipe.
        let took = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        assert_eq!(took, 1);
        assert!(!readable(ev.fd()), "taken");
        ev.set_ready(true);
        ev.set_ready(true);
        assert!(readable(ev.fd()), "the queue holds events");
        assert!(!readable(ev.device_fd()), "not the device");
        ev.set_ready(false);
        assert!(!readable(ev.fd()), "the queue is empty again");
    }
}
