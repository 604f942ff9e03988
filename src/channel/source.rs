//! Where a channel's completions come from: a completion queue of its own, or its inbox on
//! a queue shared with other channels ([`crate::dispatch`]).

use crate::cq::CompletionQueue;
#[cfg(feature = "std")]
use crate::dispatch::{Inbox, SharedCompletionQueue, SEQ_MASK};
use crate::error::Error;
use crate::provider::Provider;
use crate::ring::{Ring, WorkRequest};
use crate::types::WorkCompletion;
#[cfg(feature = "std")]
use std::sync::Arc;

/// One direction's completions (send or receive).
pub(crate) enum Completions<P: Provider> {
    /// A queue of the channel's own: completions carry the ring's sequence numbers.
    Own(CompletionQueue<P>),
    /// An inbox on a shared queue: completions carry the inbox's tag and the low bits of
    /// the sequence numbers.
    #[cfg(feature = "std")]
    Shared(Attached<P>),
}

/// An inbox on a shared queue, detached when the channel goes.
#[cfg(feature = "std")]
pub(crate) struct Attached<P: Provider> {
    cq: Arc<SharedCompletionQueue<P>>,
    /// `Some` until dropped.
    inbox: Option<Inbox>,
}

#[cfg(feature = "std")]
impl<P: Provider> Drop for Attached<P> {
    fn drop(&mut self) {
        if let Some(inbox) = self.inbox.take() {
            self.cq.detach(inbox);
        }
    }
}

impl<P: Provider> Completions<P> {
    /// An inbox on `cq` for a ring of `depth`, with `ring` set to post tagged `wr_id`s.
    #[cfg(feature = "std")]
    pub(crate) fn attach<W: WorkRequest, const N: usize>(
        cq: &Arc<SharedCompletionQueue<P>>,
        ring: &mut Ring<W, N>,
    ) -> Result<Self, Error<P::Error>> {
        let inbox = cq.attach(N)?;
        ring.set_id_tag(inbox.tag(), SEQ_MASK);
        Ok(Completions::Shared(Attached {
            cq: cq.clone(),
            inbox: Some(inbox),
        }))
    }

    /// The completion queue, to create the queue pair on.
    pub(crate) fn queue(&self) -> &CompletionQueue<P> {
        match self {
            Completions::Own(cq) => cq,
            #[cfg(feature = "std")]
            Completions::Shared(a) => a.cq.queue(),
        }
    }

    /// Whether the queue is shared with other channels.
    pub(crate) fn is_shared(&self) -> bool {
        !matches!(self, Completions::Own(_))
    }

    /// Polls up to `out.len()` of this channel's completions into `out`, with `wr_id`s that
    /// are `ring`'s sequence numbers.
    #[inline(always)]
    pub(crate) fn poll<W: WorkRequest, const N: usize>(
        &mut self,
        ring: &Ring<W, N>,
        out: &mut [WorkCompletion],
    ) -> Result<usize, Error<P::Error>> {
        match self {
            Completions::Own(cq) => cq.poll(out),
            #[cfg(feature = "std")]
            Completions::Shared(a) => {
                let Some(inbox) = a.inbox.as_mut() else {
                    return Ok(0);
                };
                let n = a.cq.poll(inbox, out)?;
                widen(ring, &mut out[..n]);
                Ok(n)
            }
        }
    }

    /// As [`poll`](Self::poll), after every completion the device wrote so far has been
    /// routed (on a shared queue, waiting for the poll right): after a queue pair is reset,
    /// none of its completions is left behind in another thread's batch.
    pub(crate) fn poll_all<W: WorkRequest, const N: usize>(
        &mut self,
        ring: &Ring<W, N>,
        out: &mut [WorkCompletion],
    ) -> Result<usize, Error<P::Error>> {
        match self {
            Completions::Own(cq) => cq.poll(out),
            #[cfg(feature = "std")]
            Completions::Shared(a) => {
                let Some(inbox) = a.inbox.as_mut() else {
                    return Ok(0);
                };
                let n = a.cq.drain(inbox, out)?;
                widen(ring, &mut out[..n]);
                Ok(n)
            }
        }
    }
}

#[cfg(feature = "std")]
#[inline]
fn widen<W: WorkRequest, const N: usize>(ring: &Ring<W, N>, wcs: &mut [WorkCompletion]) {
    for wc in wcs {
        wc.wr_id = ring.widen(wc.wr_id);
    }
}
