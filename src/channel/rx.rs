//! A channel's receive side, chosen by its transport: a receive ring and the completions
//! that retire it ([`OwnRx`], for [`Rc`] and [`Ud`]), or none of its own ([`SrqRx`], for
//! [`RcOnSrq`]: its queue pair takes receives from a shared receive queue, whose owner
//! posts and completes them). A channel on an SRQ so holds no receive ring, no receive
//! inbox and no receive queue of its own: what lets a node's receive memory stop growing
//! with its peers.
//!
//! The code common to every channel reaches the receive side through [`RxSide`], which
//! answers "nothing there" for [`SrqRx`]; the receive calls are written for [`OwnRx`] only
//! ([`HasOwnRx`]), so a receive on a channel without one does not compile.

use super::source::Completions;
use crate::provider::{PostError, Provider};
use crate::qp::{OwnReceiveQueue, QueuePair, Rc, RcOnSrq, ReadyToSend, Transport, Ud};
use crate::ring::Ring;
use crate::types::RecvWr;

/// The receive side of a channel whose queue pair has a receive queue of its own.
pub struct OwnRx<P: Provider, const DEPTH: usize, const SGES: usize> {
    pub(super) cq: Completions<P>,
    pub(super) ring: Ring<RecvWr<SGES>, DEPTH>,
}

/// The receive side of a channel on a shared receive queue: none of its own, only a hold
/// on what the SRQ's receives need (the SRQ, the queue they complete on, the memory they
/// land in), so that none of it goes while this channel's queue pair can still deliver
/// into it, wherever the channel was moved.
pub struct SrqRx<P: Provider> {
    #[cfg(feature = "std")]
    pub(super) _keep: std::sync::Arc<crate::srq::Backend<P>>,
    #[cfg(not(feature = "std"))]
    pub(super) _keep: core::marker::PhantomData<P>,
}

/// The receive side's ring and completions, if the channel has them. Sealed with
/// [`ChannelTransport`].
pub trait RxSide<P: Provider, const DEPTH: usize, const SGES: usize> {
    #[doc(hidden)]
    fn parts(&mut self) -> Option<(&mut Completions<P>, &mut Ring<RecvWr<SGES>, DEPTH>)>;
    #[doc(hidden)]
    fn ring(&self) -> Option<&Ring<RecvWr<SGES>, DEPTH>>;
}

impl<P: Provider, const DEPTH: usize, const SGES: usize> RxSide<P, DEPTH, SGES>
    for OwnRx<P, DEPTH, SGES>
{
    #[inline(always)]
    fn parts(&mut self) -> Option<(&mut Completions<P>, &mut Ring<RecvWr<SGES>, DEPTH>)> {
        Some((&mut self.cq, &mut self.ring))
    }
    #[inline(always)]
    fn ring(&self) -> Option<&Ring<RecvWr<SGES>, DEPTH>> {
        Some(&self.ring)
    }
}

impl<P: Provider, const DEPTH: usize, const SGES: usize> RxSide<P, DEPTH, SGES> for SrqRx<P> {
    #[inline(always)]
    fn parts(&mut self) -> Option<(&mut Completions<P>, &mut Ring<RecvWr<SGES>, DEPTH>)> {
        None
    }
    #[inline(always)]
    fn ring(&self) -> Option<&Ring<RecvWr<SGES>, DEPTH>> {
        None
    }
}

/// A transport a [`Channel`](super::Channel) runs on, and the receive side it gives the
/// channel. Sealed: [`Rc`], [`Ud`] (their own receive queue) and [`RcOnSrq`] (none).
pub trait ChannelTransport: Transport + Sized {
    /// The transport of the [`Op`](super::Op)s it posts: [`Rc`] for both connected
    /// transports (an operation does not care where receives come from), [`Ud`] for
    /// datagrams.
    type Ops: Transport;
    /// What the channel keeps for receives.
    type Rx<P: Provider, const DEPTH: usize, const SGES: usize>: RxSide<P, DEPTH, SGES>;

    /// Posts the chain `wrs` (staged in the receive side's ring) to `qp`'s receive queue.
    ///
    /// # Safety
    /// As [`QueuePair::post_recv`].
    #[doc(hidden)]
    unsafe fn post_recvs<P: Provider, const SGES: usize>(
        qp: &QueuePair<P, ReadyToSend, Self>,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<P::Error>>;
}

/// Rc and Ud: a receive queue of their own, posted to as the queue pair's.
macro_rules! own_rx {
    ($($t:ident),*) => {$(
        impl ChannelTransport for $t {
            type Ops = $t;
            type Rx<P: Provider, const DEPTH: usize, const SGES: usize> = OwnRx<P, DEPTH, SGES>;
            #[inline(always)]
            unsafe fn post_recvs<P: Provider, const SGES: usize>(
                qp: &QueuePair<P, ReadyToSend, Self>,
                wrs: &[RecvWr<SGES>],
            ) -> Result<(), PostError<P::Error>> {
                // SAFETY: the caller's contract is `post_recv`'s.
                unsafe { qp.post_recv(wrs) }
            }
        }
    )*};
}
own_rx!(Rc, Ud);

impl ChannelTransport for RcOnSrq {
    type Ops = Rc;
    type Rx<P: Provider, const DEPTH: usize, const SGES: usize> = SrqRx<P>;
    /// Never called with a request: [`SrqRx`] has no ring to stage one in.
    #[inline(always)]
    unsafe fn post_recvs<P: Provider, const SGES: usize>(
        _qp: &QueuePair<P, ReadyToSend, Self>,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<P::Error>> {
        debug_assert!(wrs.is_empty());
        Ok(())
    }
}

/// A transport whose channels post and complete their own receives: [`Rc`] and [`Ud`].
pub trait HasOwnRx<P: Provider, const DEPTH: usize, const SGES: usize>:
    OwnReceiveQueue + ChannelTransport<Rx<P, DEPTH, SGES> = OwnRx<P, DEPTH, SGES>>
{
}

impl<T, P: Provider, const DEPTH: usize, const SGES: usize> HasOwnRx<P, DEPTH, SGES> for T where
    T: OwnReceiveQueue + ChannelTransport<Rx<P, DEPTH, SGES> = OwnRx<P, DEPTH, SGES>>
{
}
