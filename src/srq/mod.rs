//! Shared receive queues: one queue of receives for many RC queue pairs, so that receive
//! memory does not grow with the number of peers.
//!
//! A [`SharedReceiveQueue`] holds receives that every queue pair created on it
//! ([`QueuePair::create_on_srq`]) consumes, oldest first, whichever peer's message comes
//! first. Such a queue pair has no receive queue of its own: its type
//! ([`RcOnSrq`]) has no `post_recv`. Each receive completion still arrives on the queue
//! pair's receive CQ, and its `qp_num` names the queue pair that consumed it, while its
//! `wr_id` names the buffer posted.
//!
//! When fewer receives remain than an armed limit ([`arm_limit`](SharedReceiveQueue::arm_limit)),
//! the device raises `SRQ_LIMIT_REACHED` once ([`Context::next_async_event`]) naming
//! [`key`](SharedReceiveQueue::key); an empty queue answers senders with RNR NAKs until
//! receives are posted. A queue pair on it moved to ERR is followed by
//! `QP_LAST_WQE_REACHED`, after which it takes no more of the queue's receives.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::provider::sim::Sim;
//! use zverbs::srq::SharedReceiveQueue;
//! use zverbs::{Context, SrqAttr};
//! let sim = Sim::with_devices(1);
//! let ctx = Context::open(&sim, "sim0").unwrap();
//! let pd = ctx.alloc_pd().unwrap();
//! let srq = SharedReceiveQueue::create(&ctx, &pd, &SrqAttr { max_wr: 64, max_sge: 1, srq_limit: 8 }).unwrap();
//! assert_eq!((srq.max_wr(), srq.query().unwrap().srq_limit), (64, 8));
//! assert!(srq.arm_limit(65).is_err()); // past its size
//! # }
//! ```
//!
//! [`SrqGroup`] is the level above: connections to many peers that share one SRQ and one
//! completion queue, with receive memory the group owns, and no `unsafe`.
//!
//! [`QueuePair::create_on_srq`]: crate::QueuePair::create_on_srq
//! [`RcOnSrq`]: crate::qp::RcOnSrq
//! [`Context::next_async_event`]: crate::Context::next_async_event

#[cfg(feature = "std")]
mod group;
#[cfg(feature = "std")]
mod slots;

#[cfg(feature = "std")]
pub use group::{GroupEvent, PreparedSrqGroup, SrqGroup, SrqGroupConfig};
#[cfg(feature = "std")]
pub use slots::RecvSlot;
#[cfg(feature = "std")]
pub(crate) use slots::{Backend, SlotPool};

use core::fmt;

use crate::device::{Context, ProtectionDomain};
use crate::error::{verb, within, Error};
use crate::provider::{PostError, Provider};
use crate::types::{RecvWr, SrqAttr};

/// How receive slots on a shared receive queue are made and refilled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotsConfig {
    /// Receive slots: the SRQ's size (and how many receives it holds at most).
    pub slots: u32,
    /// Bytes of each slot.
    pub size: usize,
    /// Handed-back slots are posted again once no more than this many remain posted
    /// (`ibv_srq_pingpong` refills at its number of queue pairs).
    pub refill_at: u32,
    /// Arms the SRQ's limit at this many receives (0: not armed): the device raises
    /// `SRQ_LIMIT_REACHED` when fewer remain posted; handed to the owner's
    /// `on_async_event`, it refills at once and arms the limit again.
    pub limit: u32,
}

impl Default for SlotsConfig {
    fn default() -> Self {
        SlotsConfig {
            slots: 64,
            size: 4096,
            refill_at: 16,
            limit: 0,
        }
    }
}

/// A shared receive queue (`ibv_srq`). Dropping it destroys it once no queue pair created
/// on it is left (each holds it).
pub struct SharedReceiveQueue<P: Provider> {
    raw: P::Srq,
    /// Receives it holds at most (as granted) and scatter entries per receive.
    max_wr: u32,
    max_sge: u32,
}

impl<P: Provider> fmt::Debug for SharedReceiveQueue<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("key", &self.key())
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .finish()
    }
}

impl<P: Provider> SharedReceiveQueue<P> {
    /// Creates a shared receive queue of at least `attr.max_wr` receives of `attr.max_sge`
    /// entries, armed at `attr.srq_limit` unless it is 0 (on every device alike: the limit
    /// is set after creation, which `ibv_create_srq(3)` leaves to each device).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device has no shared receive queues;
    /// [`Error::ExceedsDevice`] for a size past `max_srq_wr` / `max_srq_sge`, or a limit
    /// past the size; [`Error::InvalidAttribute`] for a size of 0; the provider's error.
    pub fn create(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        attr: &SrqAttr,
    ) -> Result<Self, Error<P::Error>> {
        let dev = ctx.query_device()?;
        if dev.max_srq == 0 {
            return Err(Error::Unsupported("shared receive queues (max_srq is 0)"));
        }
        if attr.max_wr == 0 || attr.max_sge == 0 {
            return Err(Error::InvalidAttribute(
                "SRQ max_wr and max_sge must be at least 1",
            ));
        }
        within("srq.max_wr", attr.max_wr.into(), dev.max_srq_wr.into())?;
        within("srq.max_sge", attr.max_sge.into(), dev.max_srq_sge.into())?;
        within("srq.srq_limit", attr.srq_limit.into(), attr.max_wr.into())?;
        let raw = verb(
            "ibv_create_srq",
            P::create_srq(&pd.raw, attr.max_wr, attr.max_sge),
        )?;
        let granted = verb("ibv_query_srq", P::query_srq(&raw))?;
        let srq = SharedReceiveQueue {
            raw,
            max_wr: granted.max_wr,
            max_sge: granted.max_sge,
        };
        if attr.srq_limit > 0 {
            srq.arm_limit(attr.srq_limit)?;
        }
        Ok(srq)
    }

    /// Posts a chain of receives with one doorbell; the queue pairs on it consume them in
    /// this order.
    ///
    /// # Safety
    /// As [`Provider::post_recv`]: the scatter memory stays valid and untouched by Rust
    /// references until each receive completes (on the receive CQ of the queue pair that
    /// consumed it), or until every queue pair on this queue is gone and the queue with
    /// them.
    #[inline]
    pub unsafe fn post_recv<const SGES: usize>(
        &self,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<P::Error>> {
        // SAFETY: forwarded contract.
        unsafe { P::post_srq_recv(&self.raw, wrs) }
    }

    /// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): `SRQ_LIMIT_REACHED` is
    /// raised once when a receive taken leaves fewer than `limit`, and the limit is then
    /// disarmed (arm it again to hear of the next time); 0 disarms.
    ///
    /// # Errors
    /// [`Error::ExceedsDevice`] for a limit past [`max_wr`](Self::max_wr); the provider's
    /// error.
    pub fn arm_limit(&self, limit: u32) -> Result<(), Error<P::Error>> {
        within("srq.srq_limit", limit.into(), self.max_wr.into())?;
        verb("ibv_modify_srq", P::arm_srq(&self.raw, limit))
    }

    /// Its size and the limit armed now (0: not armed, or fired since).
    pub fn query(&self) -> Result<SrqAttr, Error<P::Error>> {
        verb("ibv_query_srq", P::query_srq(&self.raw))
    }

    /// Receives it holds at most (the device may have granted more than asked).
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Scatter entries per receive.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// What its asynchronous events name it by
    /// ([`EventElement::Srq`](crate::EventElement::Srq)).
    pub fn key(&self) -> u64 {
        P::srq_key(&self.raw)
    }

    /// The backend's handle.
    pub fn raw(&self) -> &P::Srq {
        &self.raw
    }
}
