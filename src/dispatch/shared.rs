//! A completion queue shared by many channels, with its dispatcher.

use super::{AttachError, Dispatcher, Inbox};
use crate::cq::CompletionQueue;
use crate::device::Context;
use crate::error::Error;
use crate::event::CompletionChannel;
use crate::provider::Provider;
use crate::types::WorkCompletion;

/// One completion queue and the [`Dispatcher`] that routes its completions to the channels
/// on it. Shared by `Arc`: every channel on it holds one.
///
/// ```
/// use std::sync::Arc;
/// use zverbs::dispatch::SharedCompletionQueue;
/// use zverbs::provider::sim::Sim;
/// use zverbs::{Channel, ChannelConfig, Context};
/// let sim = Sim::with_devices(2);
/// let (ca, cb) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
/// let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
/// // Room for two channels of depth 64 on a's side.
/// let cq = Arc::new(SharedCompletionQueue::create(&ca, 2, 64).unwrap());
/// let cfg = ChannelConfig::default();
/// let a = Channel::<Sim>::prepare_shared(&ca, &pa, &cfg, &cq, &cq).unwrap();
/// let b = Channel::<Sim>::prepare(&cb, &pb, &cfg).unwrap();
/// let (ea, eb) = (a.endpoint(), b.endpoint());
/// let (mut a, _b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
/// # let _ = &mut a;
/// assert_eq!(cq.queue().depth(), 2 * 2 * 64);
/// ```
pub struct SharedCompletionQueue<P: Provider> {
    cq: CompletionQueue<P>,
    dispatch: Dispatcher,
    events: Option<CompletionChannel<P>>,
}

impl<P: Provider> SharedCompletionQueue<P> {
    /// A queue for up to `channels` channels of up to `depth` requests in flight each. Its
    /// depth is `channels × depth × 2`, so that it holds every completion that can be
    /// outstanding at once (one per request in flight), plus as many again for requests of
    /// queue pairs destroyed or reset whose completions are still in it: it does not
    /// overflow. (An overflowing queue is an error the device reports, as hardware does.)
    pub fn create(ctx: &Context<P>, channels: usize, depth: u32) -> Result<Self, Error<P::Error>> {
        Self::create_with(ctx, channels, depth, false)
    }

    /// As [`create`](Self::create), on a completion channel of its own, so that channels
    /// with [`WaitPolicy::SpinSleep`](crate::channel::WaitPolicy) can sleep on it.
    pub fn create_with_events(
        ctx: &Context<P>,
        channels: usize,
        depth: u32,
    ) -> Result<Self, Error<P::Error>> {
        Self::create_with(ctx, channels, depth, true)
    }

    fn create_with(
        ctx: &Context<P>,
        channels: usize,
        depth: u32,
        events: bool,
    ) -> Result<Self, Error<P::Error>> {
        let total = u32::try_from(channels)
            .ok()
            .filter(|&c| c <= 1 << 16)
            .and_then(|c| c.checked_mul(depth))
            .and_then(|d| d.checked_mul(2))
            .ok_or(Error::InvalidAttribute(
                "shared completion queue too large (channels × depth × 2 exceeds u32)",
            ))?;
        let (cq, events) = if events {
            let ch = CompletionChannel::create(ctx)?;
            (CompletionQueue::create_on(ctx, total, &ch)?, Some(ch))
        } else {
            (CompletionQueue::create(ctx, total)?, None)
        };
        Ok(SharedCompletionQueue {
            cq,
            dispatch: match events {
                Some(_) => Dispatcher::new(channels, depth as usize),
                None => Dispatcher::without_sleepers(channels, depth as usize),
            },
            events,
        })
    }

    /// The completion queue, to create queue pairs on.
    pub fn queue(&self) -> &CompletionQueue<P> {
        &self.cq
    }

    /// The completion channel the queue raises events on, if it was made with one.
    pub fn events(&self) -> Option<&CompletionChannel<P>> {
        self.events.as_ref()
    }

    /// The dispatcher: stale and overflow counts.
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatch
    }

    pub(crate) fn attach(&self, depth: usize) -> Result<Inbox, Error<P::Error>> {
        self.dispatch.attach(depth).map_err(|e| match e {
            AttachError::NoFreeInbox => {
                Error::InvalidAttribute("every inbox of the shared completion queue is in use")
            }
            AttachError::TooDeep { .. } => Error::InvalidAttribute(
                "ring deeper than the shared completion queue's per-channel depth",
            ),
        })
    }

    pub(crate) fn detach(&self, inbox: Inbox) {
        self.dispatch.detach(inbox);
    }

    /// Takes `inbox`'s completions into `out`; if there are none, routes one batch (when
    /// nobody else is) and looks again.
    #[inline]
    pub(crate) fn poll(
        &self,
        inbox: &mut Inbox,
        out: &mut [WorkCompletion],
    ) -> Result<usize, Error<P::Error>> {
        self.dispatch.poll_for(&self.cq, inbox, out)
    }

    /// Sleeps until a completion may have come for `inbox`, or `left` passes (`None`: no
    /// bound): the leader/follower scheme of [`sleep`](super::sleep). Returns at once if
    /// completions wait in the inbox; the caller polls after it returns, whatever woke it.
    #[cfg(unix)]
    pub(crate) fn sleep(
        &self,
        inbox: &Inbox,
        left: Option<std::time::Duration>,
    ) -> Result<(), Error<P::Error>> {
        let me = crate::sync::current();
        let lead = || self.lead(inbox, left);
        self.dispatch
            .sleep_on(&self.cq, inbox, me, || park(left), lead)
    }

    /// An async channel's reactor sleeps on `inbox` (the queue's own reactor leads, see
    /// [`sleep`](super::sleep)): leaves `waker` to be woken when a completion is routed to
    /// it, then routes everything pending; `true` if completions already wait in the inbox
    /// (then it polls instead of sleeping). Undone by [`awake`](Self::awake).
    #[cfg(feature = "tokio")]
    pub(crate) fn sleep_task(
        &self,
        inbox: &Inbox,
        waker: &core::task::Waker,
    ) -> Result<bool, Error<P::Error>> {
        let wake = super::sleep::Wake::Task(waker.clone());
        self.dispatch
            .sleepers()
            .register(inbox.index() as usize, wake);
        self.dispatch.drain(&self.cq)?;
        Ok(self.dispatch.has_mail(inbox))
    }

    /// `inbox`'s owner is awake (see [`sleep_task`](Self::sleep_task)).
    #[cfg(feature = "tokio")]
    pub(crate) fn awake(&self, inbox: &Inbox) {
        self.dispatch.sleepers().unregister(inbox.index() as usize);
    }

    /// The leader's sleep: arm, route what came before the arm, sleep on the descriptor,
    /// take the events.
    #[cfg(unix)]
    fn lead(
        &self,
        inbox: &Inbox,
        left: Option<std::time::Duration>,
    ) -> Result<(), Error<P::Error>> {
        let Some(events) = &self.events else {
            park(left);
            return Ok(());
        };
        self.cq.arm(false)?;
        self.dispatch.drain(&self.cq)?;
        if self.dispatch.has_mail(inbox) {
            return Ok(());
        }
        let _ = events.wait_readable(left);
        self.take_events()
    }

    /// Takes and acknowledges every event waiting on the queue's completion channel (its
    /// leader's, after a wake-up); none without a channel.
    #[cfg(unix)]
    pub(crate) fn take_events(&self) -> Result<(), Error<P::Error>> {
        if let Some(events) = &self.events {
            while let Some(ev) = events.try_get_event()? {
                let _ = self.cq.ack_event(ev);
            }
        }
        Ok(())
    }

    /// Routes everything the queue holds now (waiting for the poll right), then takes
    /// `inbox`'s completions as [`poll`](Self::poll) does.
    pub(crate) fn drain(
        &self,
        inbox: &mut Inbox,
        out: &mut [WorkCompletion],
    ) -> Result<usize, Error<P::Error>> {
        self.dispatch.drain(&self.cq)?;
        Ok(self.dispatch.take(inbox, out))
    }
}

/// Parks this thread until unparked or `left` passes.
#[cfg(unix)]
fn park(left: Option<std::time::Duration>) {
    match left {
        Some(t) => std::thread::park_timeout(t),
        None => std::thread::park(),
    }
}
