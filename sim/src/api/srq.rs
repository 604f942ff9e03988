//! The shared receive queue handle (`ibv_srq`) and the queue pairs created on one.

use super::qp::{Qp, QpInitAttr};
use super::*;
use crate::hca::rq::SharedRq;

impl Pd {
    /// Creates a shared receive queue of exactly `attr.max_wr` receives of at most
    /// `attr.max_sge` entries, armed at `attr.srq_limit` if it is not 0 (as rxe does;
    /// `ibv_create_srq(3)` calls the limit irrelevant at creation, so portable code arms
    /// it with [`Srq::arm`]). Receives posted to it are consumed in post order by every
    /// queue pair created on it ([`Pd::create_srq_qp`]).
    ///
    /// ```
    /// # use zverbs_sim::*;
    /// let f = Fabric::with_devices(1);
    /// let ctx = f.open_device("sim0").unwrap();
    /// let pd = ctx.alloc_pd().unwrap();
    /// let srq = pd.create_srq(&SrqAttr { max_wr: 8, max_sge: 1, srq_limit: 0 }).unwrap();
    /// srq.arm(2).unwrap();
    /// assert_eq!(srq.query().srq_limit, 2);
    /// assert!(srq.arm(9).is_err()); // past max_wr
    /// ```
    ///
    /// # Errors
    /// [`SimError::Invalid`] for `max_wr` outside `1..=`[`MAX_SRQ_WR`], `max_sge` outside
    /// `1..=`[`MAX_SGE`] or a limit past `max_wr`; [`SimError::QueueFull`] past
    /// [`MAX_SRQ`] on the device.
    pub fn create_srq(&self, attr: &SrqAttr) -> Result<Srq, SimError> {
        let (id, key, fast) = enter(&self.world).create_srq(self.id, attr)?;
        Ok(Srq {
            world: self.world.clone(),
            id,
            key,
            fast,
        })
    }

    /// Creates a reliable-connected queue pair in the RESET state that takes its receives
    /// from `srq` (whose PD checks their memory); its own receive capacities are
    /// ignored, and a receive posted to it is refused.
    ///
    /// # Errors
    /// As [`Pd::create_qp`]; [`SimError::Invalid`] for an SRQ of another device.
    pub fn create_srq_qp(&self, attr: &QpInitAttr<'_>, srq: &Srq) -> Result<Qp, SimError> {
        if !Arc::ptr_eq(&srq.world, &self.world) {
            return Err(SimError::Invalid("SRQ of another fabric"));
        }
        self.create_qp_on(attr, QpType::Rc, Some(srq.id))
    }
}

/// A shared receive queue (`ibv_srq`); dropping it destroys it once no queue pair uses it.
#[derive(Debug)]
pub struct Srq {
    world: Shared,
    id: usize,
    key: u64,
    /// Its queue, which it posts to without the world's lock while it may (threaded mode:
    /// `hca/rq.rs`).
    fast: Option<std::sync::Arc<SharedRq>>,
}

impl Srq {
    /// What its asynchronous events name it by ([`EventElement::Srq`]).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Posts receives, consumed in this order by whichever attached queue pair's request
    /// arrives first; a receive posted wakes the senders waiting on its RNR NAKs.
    ///
    /// # Errors
    /// The first request refused, and why: [`SimError::Invalid`] for too many SGEs,
    /// [`SimError::QueueFull`] when `max_wr` receives are queued, [`SimError::DeviceFatal`]
    /// on a dead device.
    pub fn post_recv<const SGES: usize>(
        &self,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<SimError>> {
        let id = self.id;
        super::qp::post_receives(&self.world, self.fast.as_deref(), wrs, |w| {
            w.post_srq_recvs(id, wrs)
        })
    }

    /// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): `SRQ_LIMIT_REACHED` is
    /// raised once when a request takes a receive and leaves fewer than `limit`; 0
    /// disarms.
    ///
    /// # Errors
    /// [`SimError::Invalid`] for a limit past `max_wr`.
    pub fn arm(&self, limit: u32) -> Result<(), SimError> {
        enter(&self.world).arm_srq(self.id, limit)
    }

    /// Its size and armed limit (`ibv_query_srq`; 0 once the limit event has fired).
    pub fn query(&self) -> SrqAttr {
        enter(&self.world).query_srq(self.id)
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        enter(&self.world).destroy_srq(self.id);
    }
}
