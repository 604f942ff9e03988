//! Completion queues, polled into caller-owned arrays, and armed for completion events.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::{provider::sim::Sim, CompletionQueue, Context, WorkCompletion};
//! let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
//! let cq = CompletionQueue::create(&ctx, 16).unwrap();
//! let mut wcs = [WorkCompletion::EMPTY; 8];
//! assert_eq!(cq.poll(&mut wcs).unwrap(), 0);
//! # }
//! ```
//!
//! A queue created on a [`CompletionChannel`] can be [armed](CompletionQueue::arm) to
//! raise an event on it; see [`event`](crate::event) for the order that loses no wake-up.

use crate::device::Context;
use crate::error::{verb, within, Error};
use crate::event::{CompletionChannel, CqEvent};
use crate::provider::Provider;
use crate::sync::{AtomicUsize, Ordering};
use crate::types::WorkCompletion;

/// Events acknowledged to the device at once (`ibv_ack_cq_events` takes a lock).
const ACK_BATCH: usize = 16;

/// A completion queue of fixed depth.
pub struct CompletionQueue<P: Provider> {
    pub(crate) raw: P::Cq,
    depth: u32,
    /// The key its events carry, read once at creation.
    key: u64,
    /// Events handed to [`ack_event`](Self::ack_event) and not yet acknowledged.
    unacked: AtomicUsize,
}

impl<P: Provider> CompletionQueue<P> {
    /// Creates a queue with room for `depth` completions: 1 up to the device's `max_cqe`
    /// (more is [`Error::ExceedsDevice`]).
    pub fn create(ctx: &Context<P>, depth: u32) -> Result<Self, Error<P::Error>> {
        Self::create_with(ctx, depth, None)
    }

    /// Creates a queue with room for `depth` completions whose events go to `channel`.
    /// The queue keeps the channel alive.
    pub fn create_on(
        ctx: &Context<P>,
        depth: u32,
        channel: &CompletionChannel<P>,
    ) -> Result<Self, Error<P::Error>> {
        Self::create_with(ctx, depth, Some(&channel.raw))
    }

    fn create_with(
        ctx: &Context<P>,
        depth: u32,
        channel: Option<&P::CompChannel>,
    ) -> Result<Self, Error<P::Error>> {
        if depth == 0 {
            return Err(Error::InvalidAttribute(
                "completion queue depth must be at least 1",
            ));
        }
        within("depth", depth.into(), ctx.query_device()?.max_cqe.into())?;
        let raw = verb("ibv_create_cq", P::create_cq(&ctx.raw, depth, channel))?;
        Ok(CompletionQueue {
            key: P::cq_key(&raw),
            raw,
            depth,
            unacked: AtomicUsize::new(0),
        })
    }

    /// Polls up to `out.len()` completions into `out`, oldest first; returns how many.
    /// Never blocks, never allocates.
    #[inline]
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Error<P::Error>> {
        verb("ibv_poll_cq", P::poll_cq(&self.raw, out))
    }

    /// Polls for at most one completion into `out`, in the library's layout
    /// ([`Provider::poll_cq_into`]); whether there was one. The dispatcher's poll (with
    /// `std`).
    #[inline(always)]
    #[cfg(feature = "std")]
    pub(crate) fn poll_into(&self, out: &mut WorkCompletion) -> Result<bool, Error<P::Error>> {
        verb("ibv_poll_cq", P::poll_cq_into(&self.raw, out))
    }

    /// Polls for at most one completion, into `out`, read in place
    /// ([`Provider::poll_cq_one`]).
    #[inline(always)]
    pub(crate) fn poll_one<'a>(
        &self,
        out: &'a mut core::mem::MaybeUninit<P::Wc>,
    ) -> Result<Option<&'a P::Wc>, Error<P::Error>> {
        verb("ibv_poll_cq", P::poll_cq_one(&self.raw, out))
    }

    /// Arms the queue (`ibv_req_notify_cq`): its next completion (with `solicited_only`,
    /// its next solicited one: a receive of a request sent with
    /// [`SendFlags::SOLICITED`](crate::SendFlags::SOLICITED), or any completion in error)
    /// raises one event on its channel. One-shot: arm again after each event.
    ///
    /// Completions already in the queue raise nothing: **poll again after arming**, and
    /// sleep only if that finds nothing (see [`event`](crate::event)). A queue created
    /// without a channel may be armed; its events go nowhere.
    pub fn arm(&self, solicited_only: bool) -> Result<(), Error<P::Error>> {
        verb(
            "ibv_req_notify_cq",
            P::req_notify_cq(&self.raw, solicited_only),
        )
    }

    /// The key this queue's events carry ([`CqEvent::key`]).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Whether `event` was raised by this queue.
    pub fn owns(&self, event: &CqEvent) -> bool {
        event.key == self.key
    }

    /// Takes `event`, raised by this queue, for acknowledgement: the queue acknowledges
    /// events to the device 16 at a time (`ibv_ack_cq_events`) and the rest when dropped.
    /// Gives the event back if another queue raised it.
    #[allow(clippy::result_large_err)] // the "error" is the event itself, 8 bytes
    pub fn ack_event(&self, event: CqEvent) -> Result<(), CqEvent> {
        if !self.owns(&event) {
            return Err(event);
        }
        let mut n = self.unacked.fetch_add(1, Ordering::AcqRel) + 1;
        // Whoever takes a batch out of the count acknowledges it; the count never goes
        // below what was handed in and not yet acknowledged.
        while n >= ACK_BATCH {
            match self.unacked.compare_exchange(
                n,
                n - ACK_BATCH,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    P::ack_cq_events(&self.raw, ACK_BATCH as u32);
                    break;
                }
                Err(now) => n = now,
            }
        }
        Ok(())
    }

    /// The depth asked at creation.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The backend's handle.
    pub fn raw(&self) -> &P::Cq {
        &self.raw
    }
}

impl<P: Provider> Drop for CompletionQueue<P> {
    fn drop(&mut self) {
        // Verbs: `ibv_destroy_cq` waits until every event taken is acknowledged.
        let n = self.unacked.load(Ordering::Acquire);
        if n > 0 {
            P::ack_cq_events(&self.raw, u32::try_from(n).unwrap_or(u32::MAX));
        }
    }
}
