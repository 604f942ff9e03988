//! Shared receive queues (`ibv_create_srq`): one queue of receives that every queue pair
//! attached to it consumes, oldest first, whichever queue pair's request arrives.
//!
//! As rxe has it:
//!
//! - an empty SRQ answers every attached sender's request with an RNR NAK; a receive
//!   posted wakes every requester asleep on one ([`World::post_srq_recvs`]);
//! - the limit (`srq_limit`, armed at creation or by [`World::arm_srq`]): when a request
//!   takes a receive and leaves fewer than the limit, `SRQ_LIMIT_REACHED` is raised once
//!   and the limit is disarmed (rxe's `get_srq_wqe`);
//! - a queue pair moved to ERR flushes none of the SRQ's receives (a request takes its
//!   receive whole when it executes, so none is ever in progress in a queue pair), and
//!   `QP_LAST_WQE_REACHED` follows ([`World::last_wqe_reached`]; not in the rxe
//!   personality: rxe of Linux 6.1 raises none);
//! - an SRQ is freed once its handle and its last queue pair are gone.
//!
//! The queue is a [`SharedRq`] in threaded mode and stepped mode alike (several queue
//! pairs hold it). In threaded mode the SRQ's handle posts to it without the world while it
//! is open, as a queue pair's handle does (`rq.rs`); the direct path serves no queue pair
//! on an SRQ, so every consumer holds the world exclusively, and the limit is checked
//! right after the request that took a receive.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::rq::SharedRq;
use super::tables::{Holders, Tables};
use super::wq::RecvQueue;
use super::World;
use crate::config::Personality;
use crate::padded::Padded;
use crate::trace::TraceKind;
use crate::types::*;

/// A shared receive queue.
#[derive(Debug)]
pub(crate) struct SrqObj {
    pub(crate) dev: usize,
    pd: usize,
    pub(crate) q: Arc<SharedRq>,
    /// What its events name it by (`srq_context`).
    key: u64,
    /// Receives it holds at most, and scatter entries per receive.
    max_wr: u32,
    max_sge: u32,
    /// The armed limit; 0 when not armed.
    limit: u32,
    /// The queue pairs attached (their slots): the requesters to wake when a receive is
    /// posted.
    attached: Vec<u32>,
    held: Holders,
}

/// What a new SRQ's handle holds: its slot, its key, and in threaded mode its queue to
/// post to.
pub(crate) type NewSrq = (usize, u64, Option<Arc<SharedRq>>);

impl Tables {
    /// Creates an SRQ in PD `pd`, armed at `attr.srq_limit` if not 0 (as rxe does).
    fn create_srq(
        &mut self,
        pd: usize,
        attr: &SrqAttr,
        events: Arc<Padded<AtomicBool>>,
        traced: bool,
        lazy: bool,
    ) -> Result<(usize, u64, Arc<SharedRq>), SimError> {
        if !(1..=MAX_SRQ_WR).contains(&attr.max_wr) {
            return Err(SimError::Invalid("SRQ max_wr must be 1..=MAX_SRQ_WR"));
        }
        if !(1..=MAX_SGE as u32).contains(&attr.max_sge) {
            return Err(SimError::Invalid("SRQ max_sge must be 1..=MAX_SGE"));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(SimError::Invalid("srq_limit exceeds max_wr"));
        }
        let dev = self.pds.get(pd).expect("live PD").dev;
        if self.devices[dev].srqs >= MAX_SRQ {
            return Err(SimError::QueueFull);
        }
        let rq = RecvQueue::new(attr.max_wr as usize, attr.max_sge as usize, lazy);
        let index = |i: usize| u32::try_from(i).expect("table indices fit in u32");
        let home = Some((index(self.srqs.next_index()), index(pd)));
        let q = Arc::new(SharedRq::new(rq, home, events, traced));
        let key = self.notifier.next_key();
        let srq = SrqObj {
            dev,
            pd,
            q: q.clone(),
            key,
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            limit: attr.srq_limit,
            attached: Vec::new(),
            held: Holders::new(),
        };
        let (s, _) = self.srqs.insert(srq);
        self.devices[dev].srqs += 1;
        self.pds.get_mut(pd).expect("live PD").held.refs += 1;
        Ok((s, key, q))
    }

    /// Attaches the new queue pair in slot `qp` of device `dev` to SRQ `s`: its receive
    /// queue (the SRQ's, with its PD).
    pub(crate) fn attach_srq(
        &mut self,
        s: usize,
        dev: usize,
        qp: usize,
    ) -> Result<super::rq::RqHome, SimError> {
        let srq = self.srqs.get_mut(s).expect("live SRQ");
        if srq.dev != dev {
            return Err(SimError::Invalid("SRQ of another device"));
        }
        srq.held.refs += 1;
        srq.attached.push(qp as u32);
        Ok(super::rq::RqHome::Shared(srq.q.clone()))
    }

    /// Lets go of SRQ `s` by its handle (`handle`) or by the queue pair in slot `qp`.
    pub(crate) fn release_srq(&mut self, s: usize, handle: bool, qp: usize) {
        let Some(srq) = self.srqs.get_mut(s) else {
            return;
        };
        if !handle {
            srq.attached.retain(|&a| a as usize != qp);
        }
        if srq.held.release(handle) {
            let (pd, dev) = (srq.pd, srq.dev);
            self.srqs.remove(s);
            self.devices[dev].srqs -= 1;
            self.release_pd(pd, false);
        }
    }
}

impl World {
    /// Creates an SRQ (see [`SrqObj`]).
    pub(crate) fn create_srq(&mut self, pd: usize, attr: &SrqAttr) -> Result<NewSrq, SimError> {
        let (events, traced) = (self.net.sched.events.pending_flag(), self.net.cfg.trace);
        let lazy = self.net.cfg.lazy_queues;
        let (s, key, q) = self.tables.create_srq(pd, attr, events, traced, lazy)?;
        let threaded = self.net.cfg.mode == crate::config::Mode::Threaded;
        Ok((s, key, threaded.then_some(q)))
    }

    /// Posts receives to SRQ `s` through the world: the index of the first refused, and
    /// why. A receive posted wakes every attached queue pair's requester asleep on its
    /// RNR NAK.
    pub(crate) fn post_srq_recvs<const SGES: usize>(
        &mut self,
        s: usize,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), (usize, SimError)> {
        let srq = self.tables.srqs.get(s).expect("live SRQ");
        if self.net.wire.ports[srq.dev].crashed {
            return Err((0, SimError::DeviceFatal));
        }
        let (dev, q) = (srq.dev, srq.q.clone());
        let mut res = Ok(());
        let mut n = 0;
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = q.with(|q| q.admits(wr).map(|()| q.push_back(wr))) {
                res = Err((i, e));
                break;
            }
            self.net
                .trace(dev, 0, TraceKind::PostRecv, None, Some(wr.wr_id));
            n += 1;
        }
        if n > 0 {
            // By index: waking changes no SRQ, and a post must not allocate.
            let attached = |w: &World, k: usize| w.tables.srqs.get(s)?.attached.get(k).copied();
            let mut k = 0;
            while let Some(qp) = attached(self, k) {
                self.wake_parked(qp as usize);
                k += 1;
            }
            q.woke_requesters();
        }
        res
    }

    /// Arms SRQ `s`'s limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`; 0 disarms).
    pub(crate) fn arm_srq(&mut self, s: usize, limit: u32) -> Result<(), SimError> {
        let srq = self.tables.srqs.get_mut(s).expect("live SRQ");
        if limit > srq.max_wr {
            return Err(SimError::Invalid("srq_limit exceeds max_wr"));
        }
        srq.limit = limit;
        Ok(())
    }

    /// SRQ `s`'s size and armed limit (`ibv_query_srq`).
    pub(crate) fn query_srq(&self, s: usize) -> SrqAttr {
        let srq = self.tables.srqs.get(s).expect("live SRQ");
        SrqAttr {
            max_wr: srq.max_wr,
            max_sge: srq.max_sge,
            srq_limit: srq.limit,
        }
    }

    /// Destroys SRQ `s`'s handle: the SRQ goes with its last queue pair.
    pub(crate) fn destroy_srq(&mut self, s: usize) {
        self.tables.release_srq(s, true, 0);
    }

    /// A request at queue pair `q` took a receive: if `q` is on an SRQ whose limit is
    /// armed and fewer receives than the limit are left, `SRQ_LIMIT_REACHED`, once.
    pub(crate) fn srq_consumed(&mut self, q: usize) {
        let Some((s, _)) = self.tables.qps.get(q).and_then(|qp| qp.rq.srq()) else {
            return;
        };
        let srq = self.tables.srqs.get_mut(s).expect("live SRQ");
        if srq.limit == 0 || srq.q.len() >= srq.limit as usize {
            return;
        }
        srq.limit = 0;
        let ev = AsyncEvent {
            kind: AsyncEventKind::SrqLimitReached,
            element: EventElement::Srq(srq.key),
        };
        let dev = srq.dev;
        self.tables.async_events.raise(dev, ev);
    }

    /// Queue pair `q` has just moved to ERR and flushed: on an SRQ, it will take no more
    /// of its receives (`QP_LAST_WQE_REACHED`, which the verbs spec asks for before such a
    /// queue pair is destroyed). The rxe personality raises none, as rxe of Linux 6.1.
    pub(crate) fn last_wqe_reached(&mut self, q: usize) {
        if self.net.cfg.personality == Personality::Rxe {
            return;
        }
        let Some(qp) = self.tables.qps.get(q).filter(|qp| qp.rq.srq().is_some()) else {
            return;
        };
        let (dev, qpn) = (qp.dev(), qp.qpn);
        let kind = AsyncEventKind::QpLastWqeReached;
        self.tables.async_events.raise_qp(dev, qpn, kind);
    }

    /// Device `dev` crashed: its SRQs take posts through the world only (which refuses
    /// them).
    pub(crate) fn close_srqs(&mut self, dev: usize) {
        for s in 0..self.tables.srqs.slots() {
            if let Some(srq) = self.tables.srqs.get(s).filter(|s| s.dev == dev) {
                srq.q.close();
            }
        }
    }
}
