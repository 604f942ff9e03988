//! The reactor of one async channel: sleeps on the descriptors of its two completion
//! channels (or, on shared queues, on its inboxes: the queues' reactor wakes it, see
//! `queue.rs`) and on one timer (the earliest deadline of a sleeping operation), and each
//! pass arms the queues, polls them, wakes the tasks whose requests finished and those
//! whose deadline passed.

use core::future::{poll_fn, Future};
use core::pin::pin;
use core::task::Poll;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::Instant;

use super::{IoBuf, Shared};
use crate::provider::Provider;

/// A descriptor the channel owns; the reactor only watches it (and is dropped first: the
/// reactor holds the channel alive).
pub(super) struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// The send and the receive queue's completion-channel descriptors, and the device's
/// asynchronous-event descriptor where the backend has one (verbs: a dead device's queues
/// raise nothing, its event queue does), registered with the runtime's I/O driver.
pub(super) struct Fds {
    queues: [AsyncFd<Fd>; 2],
    /// A duplicate of the device's descriptor, its own: every channel on the device
    /// registers one, and the runtime's I/O driver refuses one descriptor twice.
    device: Option<AsyncFd<OwnedFd>>,
}

impl Fds {
    /// Registers the descriptors of `ch`'s completion channels and of its device's events.
    ///
    /// The caller keeps `ch` alive, with those channels and its device open, for as long as
    /// the returned value lives (the reactor holds both, and drops this first: [`Reactor`]).
    pub(super) fn new(send: RawFd, recv: RawFd, device: Option<RawFd>) -> std::io::Result<Fds> {
        // SAFETY: the descriptors belong to completion channels the channel owns, and to
        // the device context its queues hold open, none closed or replaced while it lives;
        // the reactor drops these registrations before its reference to the channel (field
        // order of `Reactor`).
        let device = match device {
            // SAFETY: as above: the device's descriptor is open while the channel lives.
            Some(d) => Some(unsafe { BorrowedFd::borrow_raw(d) }.try_clone_to_owned()?),
            None => None,
        };
        let device = match device {
            // SAFETY: the registration owns the duplicate, which stays open (naming the
            // device's event queue) until the registration is dropped with it.
            Some(d) => Some(
                unsafe { AsyncFd::register_with_interest(d, Interest::READABLE) }
                    .map_err(std::io::Error::from)?,
            ),
            None => None,
        };
        // SAFETY: as above, for the queues' descriptors.
        let queues = unsafe { [register(send)?, register(recv)?] };
        Ok(Fds { queues, device })
    }
}

/// Registers `fd` with the runtime's I/O driver, for reading.
///
/// # Safety
/// `fd` stays open, naming the same file, for as long as the registration lives (else
/// dropping it would deregister whatever file took the number).
pub(super) unsafe fn register(fd: RawFd) -> std::io::Result<AsyncFd<Fd>> {
    // SAFETY: the caller's contract is tokio's (the descriptor outlives the registration).
    unsafe { AsyncFd::register_with_interest(Fd(fd), Interest::READABLE) }
        .map_err(std::io::Error::from)
}

/// What wakes a channel's reactor besides its timer.
pub(super) enum Wakeup {
    /// The descriptors of the channel's own completion channels.
    Fds(Fds),
    /// Its inboxes on shared queues: the queues' reactor routes completions there and
    /// wakes the reactor that sleeps on them.
    Inboxes,
}

/// The reactor's state: the registrations drop before the channel (fields drop in order).
pub(super) struct Reactor<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    pub(super) wakeup: Wakeup,
    pub(super) shared: Arc<Shared<P, B, DEPTH, SGES>>,
}

/// Runs until the last handle is gone and nothing is left in flight (or, after the close,
/// the flush grace passed: then the rest is discarded through RESET).
pub(super) async fn run<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize>(
    reactor: Reactor<P, B, DEPTH, SGES>,
) {
    let Reactor { wakeup, shared } = &reactor;
    let grace = tokio::time::sleep(shared.config.flush_grace);
    let mut grace = pin!(grace);
    // The operations' deadlines: set to the earliest, while there is one.
    let mut timer = pin!(None::<tokio::time::Sleep>);
    // The close was seen by a pass (and the grace set, if it is a bound).
    let mut close_seen = false;
    let mut grace_set = false;
    loop {
        {
            let mut inner = shared.lock();
            if let Wakeup::Inboxes = wakeup {
                inner.ch.awake();
            }
            if let Err(e) = inner.ch.poll_queues() {
                inner.poll_failed(e.kind());
            }
            let mut freed = inner.wake_finished();
            // Arm (only while someone sleeps), then poll again: a completion that came
            // before the arm raises no event, and this poll finds it. (On inboxes the
            // reactor registers to be woken when it sleeps, below.)
            let fds = matches!(wakeup, Wakeup::Fds(_));
            if fds && inner.needs_events() && inner.arm() {
                if let Err(e) = inner.ch.poll_queues() {
                    inner.poll_failed(e.kind());
                }
                freed |= inner.wake_finished();
            }

            if inner.closing && !inner.ch.busy() && !inner.has_orphans() {
                return;
            }
            if inner.closing && !close_seen {
                close_seen = true;
                // A grace past what `Instant` holds: the flush is awaited without a bound.
                if let Some(end) = Instant::now().checked_add(shared.config.flush_grace) {
                    grace.as_mut().reset(end);
                    grace_set = true;
                }
            }
            // Operations whose deadline passed: woken, to time out (the clock is read only
            // while someone has a deadline).
            if inner.next_deadline().is_some() {
                inner.wake_late(Instant::now());
            }
            if freed {
                shared.freed(inner);
            }
        }
        poll_fn(|cx| {
            let next = {
                let mut inner = shared.lock();
                if inner.closing && !close_seen {
                    // Closed since the pass: one more pass sets the grace.
                    return Poll::Ready(());
                }
                inner.reactor = Some(cx.waker().clone());
                // Under the lock: an operation that sleeps after this with an earlier
                // deadline sees `timer_at` and wakes us (`Inner::deadline_set`).
                inner.timer_at = inner.next_deadline();
                // On inboxes: woken when a completion is routed to one (registered, then
                // everything pending routed, then the inboxes looked at: mail means a pass
                // now). A routing failure (a dead device) is left to the deadlines.
                if let Wakeup::Inboxes = wakeup {
                    if inner.needs_events() && inner.ch.sleep_task(cx.waker()).unwrap_or(false) {
                        return Poll::Ready(());
                    }
                }
                inner.timer_at
            };
            if let Some(at) = next {
                match timer.as_mut().as_pin_mut() {
                    Some(t) if t.deadline() == at => {}
                    Some(t) => t.reset(at),
                    None => timer.set(Some(tokio::time::sleep_until(at))),
                }
                if timer
                    .as_mut()
                    .as_pin_mut()
                    .is_some_and(|t| t.poll(cx).is_ready())
                {
                    return Poll::Ready(());
                }
            }
            let (fds, device): (&[AsyncFd<Fd>], _) = match wakeup {
                Wakeup::Fds(fds) => (&fds.queues, fds.device.as_ref()),
                Wakeup::Inboxes => (&[], None),
            };
            for fd in fds {
                if let Poll::Ready(Ok(mut ready)) = fd.poll_read_ready(cx) {
                    // Take every event; readiness is cleared only once the descriptor said
                    // would-block (`take_events` read until it did).
                    let _ = ready.try_io(|_| {
                        let mut inner = shared.lock();
                        // An event disarms its queue: the next pass arms again if needed.
                        inner.armed = false;
                        let _ = inner.ch.take_events();
                        Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
                    });
                    return Poll::Ready(());
                }
            }
            // The device has events: look at them now (a dead device's queues stay empty
            // and raise nothing, so no pass would find it dead before the deadlines).
            if let Some(Poll::Ready(Ok(mut ready))) = device.map(|d| d.poll_read_ready(cx)) {
                ready.clear_ready();
                let mut inner = shared.lock();
                if let Err(e) = inner.ch.check_device() {
                    inner.poll_failed(e.kind());
                }
                return Poll::Ready(());
            }
            if grace_set && grace.as_mut().poll(cx).is_ready() {
                let mut inner = shared.lock();
                let mut fatal = None;
                inner.ch.discard(&mut fatal);
                inner.release_orphans();
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
    }
}
