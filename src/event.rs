//! Completion events: sleeping until a completion queue has work, instead of spinning.
//!
//! A [`CompletionChannel`] is a file descriptor (`ibv_comp_channel`) shared by any number
//! of completion queues created on it ([`CompletionQueue::create_on`]). A queue that is
//! *armed* ([`CompletionQueue::arm`]) queues one event on its channel when its next
//! completion arrives; the descriptor is readable while events are pending, so a thread
//! can sleep in [`wait_readable`](CompletionChannel::wait_readable) (`poll(2)`) or an event
//! loop can watch it ([`AsRawFd`](std::os::fd::AsRawFd)).
//!
//! # The only race-free order: arm, poll again, then sleep
//!
//! Arming is one-shot and does not look back: a completion that arrived *before* the arm
//! raises no event. A consumer that polls, finds nothing, then arms and sleeps loses the
//! wake-up of a completion that lands between its poll and its arm, and may sleep forever.
//! So:
//!
//! 1. poll until the queue is empty;
//! 2. arm the queue;
//! 3. poll **again**: anything found here arrived before the arm; handle it and go to 2
//!    (or 1);
//! 4. only now sleep on the channel; when it wakes, take the events
//!    ([`try_get_event`](CompletionChannel::try_get_event)) and hand each to its queue
//!    ([`CompletionQueue::ack_event`]), then go to 1.
//!
//! An event may be spurious: its completions may already have been taken by step 3 or by
//! another thread. Polling an empty queue is the whole cost.
//!
//! Every event taken must reach its queue's [`ack_event`](CompletionQueue::ack_event):
//! the queue acknowledges them to the device in batches and the rest when it is dropped,
//! and on verbs destroying a queue with unacknowledged events waits forever.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use std::time::Duration;
//! use zverbs::provider::sim::Sim;
//! use zverbs::qp::{InitOptions, QpConfig, QueuePair};
//! use zverbs::{CompletionChannel, CompletionQueue, Context, RecvWr, WorkCompletion};
//!
//! let ctx = Context::open(&Sim::with_devices(1), "sim0")?;
//! let channel = CompletionChannel::create(&ctx)?;
//! let cq = CompletionQueue::create_on(&ctx, 16, &channel)?;
//! let pd = ctx.alloc_pd()?;
//! let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &QpConfig::default())?;
//! let qp = qp.into_init(&InitOptions::default()).map_err(|e| e.error)?;
//! // SAFETY: a receive with no scatter entries names no memory.
//! unsafe { qp.post_recv(&[RecvWr::<1>::new(7)]) }.map_err(|e| e.error)?;
//!
//! let mut wcs = [WorkCompletion::EMPTY; 8];
//! assert_eq!(cq.poll(&mut wcs)?, 0);
//! cq.arm(false)?; // 2. arm
//! assert_eq!(cq.poll(&mut wcs)?, 0); // 3. poll again: still nothing, so sleeping is safe
//! assert!(!channel.wait_readable(Some(Duration::ZERO))?);
//!
//! qp.set_error()?; // the receive is flushed: a completion, so an event
//! assert!(channel.wait_readable(Some(Duration::from_secs(1)))?); // 4. sleep
//! while let Some(event) = channel.try_get_event()? {
//!     cq.ack_event(event).expect("the only queue on this channel");
//! }
//! assert_eq!(cq.poll(&mut wcs)?, 1);
//! assert_eq!(wcs[0].wr_id, 7);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::device::Context;
use crate::error::{verb, Error};
use crate::provider::Provider;
#[cfg(doc)]
use crate::CompletionQueue;

/// An event taken from a [`CompletionChannel`]: the queue named by
/// [`key`](CqEvent::key) was armed and got a completion.
///
/// Hand it to that queue's [`ack_event`](crate::CompletionQueue::ack_event), which
/// acknowledges it to the device; on verbs a queue with unacknowledged events cannot be
/// destroyed (the destroy waits forever).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an event must reach its queue's `ack_event`, or destroying the queue hangs on verbs"]
pub struct CqEvent {
    pub(crate) key: u64,
}

impl CqEvent {
    /// The key of the queue that raised it ([`CompletionQueue::key`](crate::CompletionQueue::key)).
    pub fn key(&self) -> u64 {
        self.key
    }
}

/// A completion channel (`ibv_comp_channel`): a descriptor that is readable while events
/// of armed queues are pending. See the [module docs](self) for the order of operations.
///
/// Queues created on it keep it alive (the backend holds it), so it may be dropped
/// before them.
pub struct CompletionChannel<P: Provider> {
    pub(crate) raw: P::CompChannel,
}

impl<P: Provider> CompletionChannel<P> {
    /// Creates a channel on `ctx`'s device; its descriptor is non-blocking.
    pub fn create(ctx: &Context<P>) -> Result<Self, Error<P::Error>> {
        Ok(CompletionChannel {
            raw: verb("ibv_create_comp_channel", P::create_comp_channel(&ctx.raw))?,
        })
    }

    /// Takes the oldest pending event without blocking; `None` if there is none.
    pub fn try_get_event(&self) -> Result<Option<CqEvent>, Error<P::Error>> {
        let key = verb("ibv_get_cq_event", P::get_cq_event(&self.raw))?;
        Ok(key.map(|key| CqEvent { key }))
    }

    /// Sleeps until the descriptor is readable (an event is pending), the device has an
    /// asynchronous event (verbs: so a dead device wakes the sleepers on its queues, whose
    /// next poll fails with its fatal error), or `timeout` passes (`None`: no bound);
    /// returns whether either is readable. `Some(Duration::ZERO)` only looks. Interrupted
    /// sleeps resume for the time left.
    ///
    /// Sleep only after arming and polling again (see the [module docs](self)).
    ///
    /// # Errors
    /// The error of `poll(2)`, other than `EINTR`.
    #[cfg(all(feature = "std", unix))]
    pub fn wait_readable(&self, timeout: Option<std::time::Duration>) -> std::io::Result<bool> {
        wait_fds(P::comp_channel_fd(&self.raw), self.device_fd(), timeout)
    }

    /// The device's asynchronous-event descriptor a sleeper on this channel also watches
    /// ([`Provider::comp_channel_device_fd`]).
    #[cfg(all(feature = "std", unix))]
    pub(crate) fn device_fd(&self) -> Option<std::os::fd::RawFd> {
        P::comp_channel_device_fd(&self.raw)
    }

    /// The backend's handle.
    pub fn raw(&self) -> &P::CompChannel {
        &self.raw
    }
}

#[cfg(all(feature = "std", unix))]
impl<P: Provider> std::os::fd::AsRawFd for CompletionChannel<P> {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        P::comp_channel_fd(&self.raw)
    }
}

#[cfg(all(feature = "std", unix))]
impl<P: Provider> std::os::fd::AsFd for CompletionChannel<P> {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the channel handle `self.raw`, which closes it
        // only when dropped; the borrow of `self` keeps it open for the returned lifetime.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(P::comp_channel_fd(&self.raw)) }
    }
}

/// `poll(2)` for `POLLIN` on `fd`, resuming after `EINTR` for the time left. An error
/// or hang-up condition counts as readable: the next read reports it.
#[cfg(all(feature = "std", unix))]
pub(crate) fn wait_fd(
    fd: std::os::fd::RawFd,
    timeout: Option<std::time::Duration>,
) -> std::io::Result<bool> {
    wait_fds(fd, None, timeout)
}

/// As [`wait_fd`], on `fd` and `also` (if any): readable when either is.
#[cfg(all(feature = "std", unix))]
fn wait_fds(
    fd: std::os::fd::RawFd,
    also: Option<std::os::fd::RawFd>,
    timeout: Option<std::time::Duration>,
) -> std::io::Result<bool> {
    use std::time::Instant;
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let ms = match (timeout, deadline) {
            (None, _) => -1,
            (Some(_), None) => i32::MAX, // too far to represent: as good as no bound
            (Some(_), Some(d)) => {
                let left = d.saturating_duration_since(Instant::now());
                // Rounded up, so a short wait does not become a busy look.
                let ms = left.as_nanos().div_ceil(1_000_000);
                i32::try_from(ms).unwrap_or(i32::MAX)
            }
        };
        let pfd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut pfds = [pfd(fd), pfd(also.unwrap_or(-1))];
        let nfds = 1 + also.is_some() as libc::nfds_t;
        // SAFETY: `pfds` holds `nfds` valid `pollfd`s for the duration of the call; `poll`
        // only writes their `revents`.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), nfds, ms) };
        if n > 0 {
            return Ok(true);
        }
        if n == 0 {
            if deadline.is_some_and(|d| Instant::now() < d) {
                continue; // woke early (rounding); sleep the rest
            }
            return Ok(false);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
