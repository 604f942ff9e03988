//! [`SrqGroup`]: reliable connections to many peers that receive through one shared receive
//! queue and complete on one completion queue, driven from one thread without `unsafe`
//! (what rdma-core's `ibv_srq_pingpong` does with 16 queue pairs).
//!
//! The group owns its memory, registered once: `slots` receive buffers of `size` bytes,
//! all posted to the SRQ, and one send buffer of `size` bytes per peer.
//!
//! - A message from any peer lands in the oldest posted slot; [`poll`](SrqGroup::poll)
//!   reports it as [`GroupEvent::Received`], naming the peer (by its completion's
//!   `qp_num`) and the slot, which the caller reads ([`received`](SrqGroup::received))
//!   and hands back ([`release`](SrqGroup::release)).
//! - Slots handed back are posted again in one batch once no more than
//!   [`refill_at`](SlotsConfig::refill_at) remain posted, or when the device says the
//!   SRQ runs low ([`limit`](SlotsConfig::limit), the limit event handed to
//!   [`on_async_event`](SrqGroup::on_async_event)). If the caller holds slots until the
//!   SRQ runs dry, senders wait on RNR NAKs: nothing is lost.
//! - [`send_buf`](SrqGroup::send_buf) lends a peer's send buffer while no send from it is
//!   in flight; [`send`](SrqGroup::send) posts it; [`GroupEvent::Sent`] frees it again.
//!
//! **Soundness.** The device writes only posted slots and reads only in-flight send
//! buffers; the group lends neither (a slot is readable once its receive completed, a send
//! buffer writable once its send completed). Dropping the group destroys its queue pairs
//! first (nothing consumes the SRQ or sends any more), then its queues, then deregisters
//! and frees the memory. Nothing is allocated after [`prepare`](SrqGroup::prepare).
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::provider::sim::Sim;
//! use zverbs::qp::{RtrOptions, RtsOptions};
//! use zverbs::srq::{GroupEvent, SlotsConfig, SrqGroup, SrqGroupConfig};
//! use zverbs::Context;
//! let sim = Sim::with_devices(2);
//! let (ca, cb) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
//! let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
//! let receive = SlotsConfig { slots: 8, size: 64, refill_at: 2, ..SlotsConfig::default() };
//! let cfg = SrqGroupConfig { receive, ..SrqGroupConfig::default() };
//! // Two peers on each side, queue pair i of one connected to queue pair i of the other.
//! let a = SrqGroup::prepare(&ca, &pa, 2, &cfg).unwrap();
//! let b = SrqGroup::prepare(&cb, &pb, 2, &cfg).unwrap();
//! let (ea, eb) = (a.endpoints(), b.endpoints());
//! let (rtr, rts) = (RtrOptions::default(), RtsOptions::default());
//! let mut a = a.connect(&eb, &rtr, &rts).unwrap();
//! let mut b = b.connect(&ea, &rtr, &rts).unwrap();
//! a.send_buf(1).unwrap()[..5].copy_from_slice(b"hello");
//! a.send(1, 5).unwrap();
//! let mut ev = [GroupEvent::None; 4];
//! let n = b.wait(&mut ev, std::time::Duration::from_secs(1)).unwrap();
//! let GroupEvent::Received { peer: 1, slot } = ev[..n][0] else { panic!("{ev:?}") };
//! assert_eq!(b.received(slot).unwrap(), b"hello");
//! b.release(slot).unwrap();
//! # }
//! ```

use core::time::Duration;
use std::time::Instant;

use super::slots::{Memory, RecvSlot, SlotPool};
use super::SlotsConfig;
use crate::device::{Context, ProtectionDomain};
use crate::error::{verb, Error};
use crate::provider::Provider;
use crate::qp::{
    Endpoint, Init, QpConfig, QueuePair, RcOnSrq, ReadyToSend, RtrOptions, RtsOptions,
};
use crate::types::{AsyncEvent, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};
use crate::wr_id::GroupId;

/// How an [`SrqGroup`] is made.
#[derive(Clone, Copy, Debug, Default)]
pub struct SrqGroupConfig {
    /// The receive slots (their count, size and refill policy); each peer's send buffer
    /// is `receive.size` bytes too.
    pub receive: SlotsConfig,
    /// The queue pairs' settings (port, GID index, send depth; their own receive
    /// capacities are not used).
    pub qp: QpConfig,
}

/// What [`SrqGroup::poll`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupEvent {
    /// Nothing (the value out-arrays start with).
    None,
    /// A message from `peer`, in `slot`.
    Received {
        /// The peer whose queue pair consumed the receive.
        peer: usize,
        /// Where it is.
        slot: RecvSlot,
    },
    /// `peer`'s send completed: its buffer is free again.
    Sent {
        /// The peer.
        peer: usize,
    },
    /// A send to `peer` (`send`), or a receive of a message from it, failed with
    /// `status`; the buffer or slot is free again, and the peer's queue pair is in error.
    Failed {
        /// The peer.
        peer: usize,
        /// Whether it was a send.
        send: bool,
        /// Why.
        status: WcStatus,
    },
}

/// An [`SrqGroup`] whose queue pairs are not connected yet: their
/// [`endpoints`](Self::endpoints) go to the peers.
pub struct PreparedSrqGroup<P: Provider> {
    qps: Vec<QueuePair<P, Init, RcOnSrq>>,
    parts: Parts<P>,
}

/// What both the prepared and the connected group hold besides the queue pairs (which,
/// held beside this, drop first): the receive slots, then the send buffers.
struct Parts<P: Provider> {
    pool: SlotPool<P>,
    /// One send buffer of `size` bytes per peer.
    sends: Memory<P>,
    /// Per peer: a send from its buffer is in flight.
    sending: Vec<bool>,
    size: usize,
}

/// Connections to `peers` peers receiving through one SRQ (see the module docs).
pub struct SrqGroup<P: Provider> {
    qps: Vec<QueuePair<P, ReadyToSend, RcOnSrq>>,
    /// `(qp_num, peer)` for every peer, sorted: a completion's peer in O(log peers).
    by_qpn: Vec<(u32, usize)>,
    parts: Parts<P>,
}

impl<P: Provider> SrqGroup<P> {
    /// Creates the queue, the SRQ, the memory and `peers` queue pairs (in INIT), and posts
    /// every slot.
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for no peers, slots or size, or fewer slots than
    /// `refill_at`; the errors of [`SharedReceiveQueue::create`](super::SharedReceiveQueue::create) and
    /// [`QueuePair::create_on_srq`].
    pub fn prepare(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        peers: usize,
        cfg: &SrqGroupConfig,
    ) -> Result<PreparedSrqGroup<P>, Error<P::Error>> {
        let rcv = &cfg.receive;
        if peers == 0 || peers > u32::MAX as usize {
            return Err(Error::InvalidAttribute("an SRQ group needs peers"));
        }
        let Some(len) = peers.checked_mul(rcv.size) else {
            return Err(Error::InvalidAttribute("peers times size overflow"));
        };
        let depth = (rcv.slots as usize + peers).min(u32::MAX as usize) as u32;
        let pool = SlotPool::new(ctx, pd, rcv, depth)?;
        let sends = Memory::new(pd, len)?;
        let (cq, srq) = (&pool.backend().cq, &pool.backend().srq);
        let mut qps = Vec::with_capacity(peers);
        for _ in 0..peers {
            let qp = QueuePair::create_on_srq(ctx, pd, cq, cq, srq, &cfg.qp)?;
            let qp = qp.into_init(&Default::default()).map_err(|e| e.error)?;
            qps.push(qp);
        }
        let parts = Parts {
            pool,
            sends,
            sending: vec![false; peers],
            size: rcv.size,
        };
        Ok(PreparedSrqGroup { qps, parts })
    }
}

impl<P: Provider> PreparedSrqGroup<P> {
    /// Each queue pair's endpoint, by peer index.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.qps.iter().map(QueuePair::endpoint).collect()
    }

    /// Connects queue pair `i` to `remotes[i]`, for every peer.
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] when `remotes` does not have one endpoint per peer; a
    /// transition's error.
    pub fn connect(
        self,
        remotes: &[Endpoint],
        rtr: &RtrOptions,
        rts: &RtsOptions,
    ) -> Result<SrqGroup<P>, Error<P::Error>> {
        if remotes.len() != self.qps.len() {
            return Err(Error::InvalidAttribute("one remote endpoint per peer"));
        }
        let mut qps = Vec::with_capacity(self.qps.len());
        for (qp, remote) in self.qps.into_iter().zip(remotes) {
            let qp = qp.into_rtr(remote, rtr).map_err(|e| e.error)?;
            qps.push(qp.into_rts(rts).map_err(|e| e.error)?);
        }
        let mut by_qpn: Vec<_> = qps
            .iter()
            .enumerate()
            .map(|(p, q)| (q.qp_num(), p))
            .collect();
        by_qpn.sort_unstable();
        Ok(SrqGroup {
            qps,
            by_qpn,
            parts: self.parts,
        })
    }
}

impl<P: Provider> SrqGroup<P> {
    /// Its number of peers.
    pub fn peers(&self) -> usize {
        self.qps.len()
    }

    /// Takes what the completion queue holds, up to `out.len()` events, without waiting;
    /// posts handed-back slots again if the SRQ runs low. Returns how many.
    ///
    /// # Errors
    /// [`Error::UnexpectedCompletion`] for a completion this group did not post for; the
    /// provider's error.
    pub fn poll(&mut self, out: &mut [GroupEvent]) -> Result<usize, Error<P::Error>> {
        let mut wcs = [WorkCompletion::EMPTY; 16];
        let want = out.len().min(wcs.len());
        let n = self.parts.pool.cq().poll(&mut wcs[..want])?;
        for (wc, ev) in wcs[..n].iter().zip(out.iter_mut()) {
            *ev = self.take(wc)?;
        }
        self.parts.pool.refill_if_low()?;
        Ok(n)
    }

    /// Hands the group an asynchronous event of its device (from
    /// [`Context::next_async_event`](crate::Context::next_async_event) in the program's
    /// event loop): `SRQ_LIMIT_REACHED` for the group's SRQ (fewer than
    /// [`limit`](SlotsConfig::limit) receives posted) refills it with every slot handed
    /// back and arms the limit again; returns whether the event was the group's. The
    /// event may come late, after a refill by [`poll`](Self::poll) or
    /// [`release`](Self::release): then it only arms again (posting twice is impossible:
    /// only free slots are posted).
    ///
    /// # Errors
    /// The provider's error from the refill or the arm.
    pub fn on_async_event(&mut self, ev: &AsyncEvent) -> Result<bool, Error<P::Error>> {
        self.parts.pool.on_async_event(ev)
    }

    /// [`poll`](Self::poll) until it finds something or `timeout` passes (then `Ok(0)`).
    pub fn wait(
        &mut self,
        out: &mut [GroupEvent],
        timeout: Duration,
    ) -> Result<usize, Error<P::Error>> {
        let start = Instant::now();
        loop {
            let n = self.poll(out)?;
            if n > 0 || out.is_empty() || start.elapsed() >= timeout {
                return Ok(n);
            }
            std::thread::yield_now();
        }
    }

    /// What completion `wc` means.
    fn take(&mut self, wc: &WorkCompletion) -> Result<GroupEvent, Error<P::Error>> {
        let unexpected = Error::UnexpectedCompletion { wr_id: wc.wr_id };
        let ok = wc.status == WcStatus::Success;
        let at = self
            .by_qpn
            .binary_search_by_key(&wc.qp_num, |&(qpn, _)| qpn);
        let peer = at.ok().map(|i| self.by_qpn[i].1);
        let p = &mut self.parts;
        match (GroupId::decode(wc.wr_id), peer) {
            (Some(GroupId::Send(i)), Some(peer)) if i as usize == peer && p.sending[peer] => {
                p.sending[peer] = false;
                Ok(match ok {
                    true => GroupEvent::Sent { peer },
                    false => GroupEvent::Failed {
                        peer,
                        send: true,
                        status: wc.status,
                    },
                })
            }
            (Some(GroupId::Recv(s)), Some(peer)) => match p.pool.complete(s, wc) {
                Some(Ok(slot)) => Ok(GroupEvent::Received { peer, slot }),
                Some(Err(status)) => Ok(GroupEvent::Failed {
                    peer,
                    send: false,
                    status,
                }),
                None => Err(unexpected),
            },
            _ => Err(unexpected),
        }
    }

    /// The message in `slot` (its `len` bytes).
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for a slot not holding a message (handed back already).
    pub fn received(&self, slot: RecvSlot) -> Result<&[u8], Error<P::Error>> {
        self.parts.pool.received(slot)
    }

    /// Hands `slot` back, to be posted again (at once if the SRQ runs low).
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for a slot not holding a message; the provider's error
    /// from the refill.
    pub fn release(&mut self, slot: RecvSlot) -> Result<(), Error<P::Error>> {
        self.parts.pool.release(slot)
    }

    /// `peer`'s send buffer, while no send from it is in flight.
    ///
    /// # Errors
    /// [`Error::NoSuchPeer`]; [`Error::QueueFull`] while its send is in flight.
    pub fn send_buf(&mut self, peer: usize) -> Result<&mut [u8], Error<P::Error>> {
        let at = self.send_at(peer)?;
        // SAFETY: no send from this buffer is in flight (checked), so the device does not
        // read it; it is lent once (`&mut self`).
        Ok(unsafe { self.parts.sends.bytes_mut(at, self.parts.size) })
    }

    /// Sends the first `len` bytes of `peer`'s send buffer (signaled);
    /// [`GroupEvent::Sent`] says when the buffer is free again.
    ///
    /// # Errors
    /// [`Error::NoSuchPeer`]; [`Error::QueueFull`] while its last send is in flight;
    /// [`Error::InvalidAttribute`] for more than `size` bytes; the provider's error.
    pub fn send(&mut self, peer: usize, len: usize) -> Result<(), Error<P::Error>> {
        let at = self.send_at(peer)?;
        if len > self.parts.size {
            return Err(Error::InvalidAttribute(
                "a send longer than the send buffer",
            ));
        }
        let mut wr = SendWr::<1>::new(
            GroupId::Send(peer as u32).encode(),
            SendOp::Send,
            SendFlags::SIGNALED,
        );
        wr.sg_list[0] = self.parts.sends.sge(at, len);
        wr.num_sge = 1;
        // SAFETY: the buffer lies in the group's memory, which outlives the queue pair, and
        // is not lent while the send is in flight (`sending`, set below).
        let posted = unsafe { self.qps[peer].post_send(&[wr]) };
        verb("ibv_post_send", posted.map_err(|e| e.error))?;
        self.parts.sending[peer] = true;
        Ok(())
    }

    /// Where `peer`'s send buffer starts, if it is free.
    fn send_at(&self, peer: usize) -> Result<usize, Error<P::Error>> {
        let p = &self.parts;
        match p.sending.get(peer) {
            None => Err(Error::NoSuchPeer {
                peer,
                capacity: self.qps.len(),
            }),
            Some(true) => Err(Error::QueueFull { capacity: 1 }),
            Some(false) => Ok(peer * p.size),
        }
    }
}
