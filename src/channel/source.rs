//! Where a channel's completions come from: a completion queue of its own, or its inbox on
//! a queue shared with other channels ([`crate::dispatch`]).

use crate::cq::CompletionQueue;
use crate::device::Context;
#[cfg(feature = "std")]
use crate::dispatch::{Inbox, SharedCompletionQueue};
use crate::error::Error;
use crate::event::CompletionChannel;
use crate::provider::{CompletionRecord, Provider};
use crate::ring::{Completion, Ring, WorkRequest};
use crate::types::WorkCompletion;
#[cfg(feature = "std")]
use crate::wr_id::SEQ_MASK;
#[cfg(feature = "std")]
use core::mem::ManuallyDrop;
#[cfg(feature = "std")]
use std::sync::Arc;

#[cfg(all(feature = "std", unix))]
use super::wait::Waiter;

/// One direction's completions (send or receive): a queue of the channel's own, or an
/// inbox on a shared one. `pub` only so that the sealed [`RxSide`](super::RxSide) can name
/// it; nothing outside the crate reaches it.
pub struct Completions<P: Provider> {
    source: Source<P>,
}

enum Source<P: Provider> {
    /// A queue of the channel's own (and the completion channel it raises events on):
    /// completions carry the ring's sequence numbers. Boxed with `std`: most channels of
    /// a large node are on shared queues, and an inline queue would make every channel
    /// 128 bytes larger.
    Own(Owned<OwnQueue<P>>),
    /// An inbox on a shared queue: completions carry the inbox's tag and the low bits of
    /// the sequence numbers.
    #[cfg(feature = "std")]
    Shared(Attached<P>),
}

/// A queue of a channel's own.
struct OwnQueue<P: Provider> {
    cq: CompletionQueue<P>,
    /// Where `cq` raises its events (read by sleeping waits, which need `std`).
    #[cfg_attr(not(all(feature = "std", unix)), allow(dead_code))]
    events: Option<CompletionChannel<P>>,
    /// `cq` is armed for an event: a sleeping wait arms, polls again, then sleeps.
    #[cfg_attr(not(all(feature = "std", unix)), allow(dead_code))]
    armed: bool,
}

#[cfg(feature = "std")]
type Owned<T> = std::boxed::Box<T>;
#[cfg(not(feature = "std"))]
type Owned<T> = T;

fn owned<T>(t: T) -> Owned<T> {
    #[cfg(feature = "std")]
    return std::boxed::Box::new(t);
    #[cfg(not(feature = "std"))]
    t
}

/// An inbox on a shared queue, detached when the channel goes.
#[cfg(feature = "std")]
pub(crate) struct Attached<P: Provider> {
    cq: Arc<SharedCompletionQueue<P>>,
    /// Attached until dropped. Not an `Option`: without the `None` a channel's poll tells
    /// its two sources apart with one compare, not two.
    inbox: ManuallyDrop<Inbox>,
}

#[cfg(feature = "std")]
impl<P: Provider> Drop for Attached<P> {
    fn drop(&mut self) {
        // SAFETY: `inbox` is taken once, here, and not used after: the value is being
        // dropped.
        let inbox = unsafe { ManuallyDrop::take(&mut self.inbox) };
        self.cq.detach(inbox);
    }
}

impl<P: Provider> Completions<P> {
    /// A queue of `depth` of its own; with `events`, on a completion channel of its own.
    pub(crate) fn own(ctx: &Context<P>, depth: u32, events: bool) -> Result<Self, Error<P::Error>> {
        let own = if events {
            let ch = CompletionChannel::create(ctx)?;
            OwnQueue {
                cq: CompletionQueue::create_on(ctx, depth, &ch)?,
                events: Some(ch),
                armed: false,
            }
        } else {
            OwnQueue {
                cq: CompletionQueue::create(ctx, depth)?,
                events: None,
                armed: false,
            }
        };
        Ok(Completions {
            source: Source::Own(owned(own)),
        })
    }

    /// An inbox on `cq` for a ring of `depth`, with `ring` set to post tagged `wr_id`s.
    #[cfg(feature = "std")]
    pub(crate) fn attach<W: WorkRequest, const DEPTH: usize>(
        cq: &Arc<SharedCompletionQueue<P>>,
        ring: &mut Ring<W, DEPTH>,
    ) -> Result<Self, Error<P::Error>> {
        let inbox = cq.attach(DEPTH)?;
        ring.set_id_tag(inbox.tag(), SEQ_MASK);
        Ok(Completions {
            source: Source::Shared(Attached {
                cq: cq.clone(),
                inbox: ManuallyDrop::new(inbox),
            }),
        })
    }

    /// The completion queue, to create the queue pair on.
    pub(crate) fn queue(&self) -> &CompletionQueue<P> {
        match &self.source {
            Source::Own(o) => &o.cq,
            #[cfg(feature = "std")]
            Source::Shared(a) => a.cq.queue(),
        }
    }

    /// Whether the queue is shared with other channels.
    pub(crate) fn is_shared(&self) -> bool {
        !matches!(self.source, Source::Own(..))
    }

    /// One pause of a sleeping wait, after a poll that found nothing; `false` once
    /// `waiter`'s bound passed. A queue of its own: the first pause arms it and returns at
    /// once, so the caller polls again (a completion that came before the arm raises no
    /// event, and that poll finds it); the next sleeps on the completion channel until an
    /// event or the bound. A shared queue: the dispatcher's leader/follower sleep
    /// ([`crate::dispatch`]). A queue without a completion channel pauses as `waiter` does.
    #[cfg(all(feature = "std", unix))]
    #[cold]
    pub(crate) fn sleep(&mut self, waiter: &mut Waiter) -> bool {
        let left = waiter.remaining();
        if left.is_some_and(|l| l.is_zero()) {
            if let Source::Own(o) = &mut self.source {
                o.armed = false;
            }
            return false;
        }
        match &mut self.source {
            Source::Own(o) => {
                let Some(events) = &o.events else {
                    return waiter.pause();
                };
                if !o.armed {
                    // On failure the next poll reports the broken queue.
                    o.armed = o.cq.arm(false).is_ok();
                    return true;
                }
                let _ = events.wait_readable(left);
                while let Ok(Some(ev)) = events.try_get_event() {
                    let _ = o.cq.ack_event(ev);
                }
                o.armed = false;
                true
            }
            Source::Shared(a) if a.cq.events().is_some() => {
                let _ = a.cq.sleep(&a.inbox, left);
                true
            }
            _ => waiter.pause(),
        }
    }

    /// Polls up to `out.len()` of this channel's completions into `out`, with `wr_id`s that
    /// are `ring`'s sequence numbers.
    #[inline(always)]
    pub(crate) fn poll<W: WorkRequest, const DEPTH: usize>(
        &mut self,
        ring: &Ring<W, DEPTH>,
        out: &mut [WorkCompletion],
    ) -> Result<usize, Error<P::Error>> {
        self.poll_with(ring, out, Shared::Poll)
    }

    /// As [`poll`](Self::poll), for at most one completion: from a queue of the channel's
    /// own into `slot` ([`Provider::poll_cq_one`]), from a shared queue's inbox into
    /// `shared`.
    #[inline(always)]
    #[cfg_attr(not(feature = "std"), allow(unused_variables))]
    pub(crate) fn poll_one<'a, W: WorkRequest, const DEPTH: usize>(
        &mut self,
        ring: &Ring<W, DEPTH>,
        slot: &'a mut OneWc<P>,
        shared: &'a mut WorkCompletion,
    ) -> Result<Option<Record<'a, P>>, Error<P::Error>> {
        match &mut self.source {
            Source::Own(o) => Ok(o.cq.poll_one(&mut slot.0)?.map(Record::Own)),
            #[cfg(feature = "std")]
            Source::Shared(_) => {
                let wc = shared;
                if self.poll(ring, core::slice::from_mut(wc))? == 0 {
                    return Ok(None);
                }
                // One kind of record where the provider's layout is ours: no test of which
                // it is when it is read.
                Ok(Some(match P::Wc::from_ours(wc) {
                    Some(wc) => Record::Own(wc),
                    None => Record::Shared(wc),
                }))
            }
        }
    }

    /// As [`poll`](Self::poll), after every completion the device wrote so far has been
    /// routed (on a shared queue, waiting for the poll right): after a queue pair is reset,
    /// none of its completions is left behind in another thread's batch.
    pub(crate) fn poll_all<W: WorkRequest, const DEPTH: usize>(
        &mut self,
        ring: &Ring<W, DEPTH>,
        out: &mut [WorkCompletion],
    ) -> Result<usize, Error<P::Error>> {
        self.poll_with(ring, out, Shared::Drain)
    }

    /// The descriptor of the queue's completion channel, if it has one of its own.
    #[cfg(all(feature = "tokio", unix))]
    pub(crate) fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.source {
            Source::Own(o) => o.events.as_ref().map(std::os::fd::AsRawFd::as_raw_fd),
            _ => None,
        }
    }

    /// The descriptor of the device's asynchronous events that a sleeper on the queue's
    /// own completion channel watches too, if the backend has one.
    #[cfg(all(feature = "tokio", unix))]
    pub(crate) fn device_fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.source {
            Source::Own(o) => o.events.as_ref().and_then(CompletionChannel::device_fd),
            _ => None,
        }
    }

    /// Whether the queue is shared and led by a reactor task ([`crate::tokio::AsyncQueue`],
    /// which wakes a sleeping task through its inbox) that runs while the inbox is
    /// attached.
    #[cfg(all(feature = "tokio", unix))]
    pub(crate) fn reactor_led(&self) -> bool {
        match &self.source {
            Source::Shared(a) => a.inbox.reactor_led(),
            Source::Own(_) => false,
        }
    }

    /// On a shared queue: `waker` is woken when a completion is routed to this channel's
    /// inbox; `true` if completions already wait there (then poll instead of sleeping).
    /// Undone by [`awake`](Self::awake). A queue of its own: nothing (`false`).
    #[cfg(all(feature = "tokio", unix))]
    pub(crate) fn sleep_task(&self, waker: &core::task::Waker) -> Result<bool, Error<P::Error>> {
        match &self.source {
            Source::Shared(Attached { cq, inbox }) => cq.sleep_task(inbox, waker),
            Source::Own(_) => Ok(false),
        }
    }

    /// The owner is awake: routing no longer wakes it.
    #[cfg(all(feature = "tokio", unix))]
    pub(crate) fn awake(&self) {
        if let Source::Shared(Attached { cq, inbox }) = &self.source {
            cq.awake(inbox);
        }
    }

    /// Arms a queue of its own on a completion channel for its next completion.
    #[cfg(all(feature = "tokio", unix))]
    pub(crate) fn arm_events(&mut self) -> Result<(), Error<P::Error>> {
        match &self.source {
            Source::Own(o) if o.events.is_some() => o.cq.arm(false),
            _ => Ok(()),
        }
    }

    /// Takes and acknowledges the events waiting on the queue's completion channel;
    /// whether there was one.
    #[cfg(all(feature = "tokio", unix))]
    pub(crate) fn take_events(&mut self) -> Result<bool, Error<P::Error>> {
        let Source::Own(o) = &self.source else {
            return Ok(false);
        };
        let (cq, Some(events)) = (&o.cq, &o.events) else {
            return Ok(false);
        };
        let mut any = false;
        while let Some(ev) = events.try_get_event()? {
            // An event of another queue cannot come on this queue's own channel.
            let _ = cq.ack_event(ev);
            any = true;
        }
        Ok(any)
    }

    /// The one polling body: a queue of its own is polled; on a shared queue, `how` says
    /// what is done before the inbox is taken from.
    #[inline(always)]
    #[cfg_attr(not(feature = "std"), allow(unused_variables))]
    fn poll_with<W: WorkRequest, const DEPTH: usize>(
        &mut self,
        ring: &Ring<W, DEPTH>,
        out: &mut [WorkCompletion],
        how: Shared,
    ) -> Result<usize, Error<P::Error>> {
        match &mut self.source {
            Source::Own(o) => o.cq.poll(out),
            #[cfg(feature = "std")]
            Source::Shared(a) => {
                let n = match how {
                    Shared::Poll => a.cq.poll(&mut a.inbox, out)?,
                    Shared::Drain => a.cq.drain(&mut a.inbox, out)?,
                };
                widen(ring, &mut out[..n]);
                Ok(n)
            }
        }
    }
}

/// What a poll of a shared queue does before it takes from the channel's inbox.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "std"), allow(dead_code))]
enum Shared {
    /// Poll the queue (if nobody else is), keeping this channel's completions.
    Poll,
    /// Route everything the queue holds, waiting for the poll right.
    Drain,
}

#[cfg(feature = "std")]
#[inline]
fn widen<W: WorkRequest, const DEPTH: usize>(ring: &Ring<W, DEPTH>, wcs: &mut [WorkCompletion]) {
    for wc in wcs {
        wc.wr_id = ring.widen(wc.wr_id);
    }
}

/// Where a poll for one completion from a queue of the channel's own lands, in the
/// provider's layout, on the caller's stack: nothing until a poll writes it, then read in
/// place. (From a shared queue's inbox, a completion lands in ours, in the channel's
/// `wc`, kept so that no poll sets it up.)
pub(crate) struct OneWc<P: Provider>(core::mem::MaybeUninit<P::Wc>);

impl<P: Provider> OneWc<P> {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        OneWc(core::mem::MaybeUninit::uninit())
    }
}

/// A completion a poll for one brought, where it landed.
pub(crate) enum Record<'a, P: Provider> {
    /// In the provider's layout ([`OneWc`]; a shared queue's too, where that is ours).
    Own(&'a P::Wc),
    /// In ours, from a shared queue's inbox, where the provider's layout is another.
    Shared(&'a WorkCompletion),
}

/// Each reads a shared queue's completion as our layout's [`CompletionRecord`] reads it.
impl<P: Provider> Record<'_, P> {
    #[inline(always)]
    pub(crate) fn wr_id(&self) -> u64 {
        match self {
            Record::Own(w) => w.wr_id(),
            Record::Shared(w) => w.wr_id(),
        }
    }
    #[inline(always)]
    pub(crate) fn succeeded(&self) -> bool {
        match self {
            Record::Own(w) => w.succeeded(),
            Record::Shared(w) => w.succeeded(),
        }
    }
    /// The completion of a request that succeeded, read in place from a completion in our
    /// layout, converted field by field from a provider's own.
    #[inline(always)]
    pub(crate) fn success(&self) -> Completion {
        match self {
            Record::Own(w) => match w.as_ours() {
                Some(wc) => Completion::succeeded(wc),
                None => Completion::succeeded_from(w.completion()),
            },
            Record::Shared(w) => Completion::succeeded(w),
        }
    }
    #[inline(always)]
    pub(crate) fn completion(&self) -> WorkCompletion {
        match self {
            Record::Own(w) => w.completion(),
            Record::Shared(w) => w.completion(),
        }
    }
}
