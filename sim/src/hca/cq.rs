//! Completion queues: completions written (an overflow moves every queue pair using the CQ
//! to ERR), the completions a queue pair hands them (a retired request or receive, a
//! flush), and a queue pair's move to ERR.
//!
//! A queue pair retires its work ([`QpObj::retire_front`], [`QpObj::retire_recv`]) and
//! hands back the completion; the CQ block writes it ([`World::push_cqe`]), raising the
//! CQ's event on its completion channel when it is armed for it (`comp_channel.rs`). The
//! two are apart because a write can overflow the CQ, which moves other queue pairs (and
//! possibly the one completing) to ERR.

use super::net::Net;
use super::qp::{flush_wc, rd_atomic, QpObj, ReqState};
use super::responder::RecvDone;
use super::tables::Tables;
use super::World;
use crate::trace::TraceKind;
use crate::types::*;

impl QpObj {
    /// Retires the oldest send queue entry with `status`: it leaves the wire's count,
    /// and its completion is returned when it is signaled or failed (releasing the slots
    /// held by earlier unsignaled requests); otherwise it holds its slot until then.
    #[inline]
    pub(crate) fn retire_front(&mut self, status: WcStatus) -> Option<WorkCompletion> {
        let e = self.sq.pop_front()?;
        if self.req.sent > 0 {
            self.req.sent -= 1;
            if rd_atomic(&e.wr.op) {
                self.req.rd_inflight = self.req.rd_inflight.saturating_sub(1);
            }
        }
        let signaled = self.sig_all || e.wr.flags.contains(SendFlags::SIGNALED);
        let written = signaled || status != WcStatus::Success;
        self.counters.send_end(written);
        if !written {
            *self.unsig_done += 1;
            return None;
        }
        *self.unsig_done = 0;
        Some(WorkCompletion {
            wr_id: e.wr.wr_id,
            status,
            opcode: e.wr.op.wc_opcode(),
            byte_len: e.wr.msg_len() as u32,
            imm: None,
            qp_num: self.qpn,
            src_qp: 0,
            grh: false,
            sl: 0,
            slid: 0,
            pkey_index: 0,
        })
    }

    /// Retires the head of the receive queue, which the transfer `rd` consumed; returns
    /// its completion (for `recv_cq`).
    #[inline]
    pub(crate) fn retire_recv(&mut self, rd: &RecvDone) -> WorkCompletion {
        self.rq.with(|q| q.pop_front());
        self.recv_wc(rd)
    }

    /// The completion of the receive `rd` consumed.
    #[inline]
    pub(crate) fn recv_wc(&self, rd: &RecvDone) -> WorkCompletion {
        WorkCompletion {
            wr_id: rd.wr_id,
            status: rd.status,
            opcode: rd.opcode,
            byte_len: rd.byte_len,
            imm: rd.imm,
            qp_num: self.qpn,
            src_qp: 0,
            grh: false,
            sl: 0,
            slid: 0,
            pkey_index: 0,
        }
    }

    /// Takes the next work request to flush, the send queue's before the receive
    /// queue's, in posting order: its CQ and its `WrFlushErr` completion.
    fn flush_one(&mut self) -> Option<(usize, WorkCompletion)> {
        if let Some(e) = self.sq.pop_front() {
            self.counters.send_end(true);
            let wc = flush_wc(e.wr.wr_id, e.wr.op.wc_opcode(), self.qpn);
            return Some((self.send_cq(), wc));
        }
        let wr_id = self.rq.pop_own()?;
        Some((self.recv_cq(), flush_wc(wr_id, WcOpcode::Recv, self.qpn)))
    }
}

impl Tables {
    /// Writes completion `wc` into CQ `cq` and raises the CQ's event if it is armed for
    /// it (`se`: the request asked for a solicited event, which raises the event of a CQ
    /// armed solicited-only, as does any completion in error, `ibv_req_notify_cq(3)`).
    /// False when it does not fit: the CQ has just overflowed, and the queue pairs using
    /// it must move to ERR (`World::push_cqe_se`).
    #[inline]
    fn write_cqe(&mut self, net: &mut Net, cq: usize, wc: WorkCompletion, se: bool) -> bool {
        let Some(c) = self.cqs.get_mut(cq) else {
            return true;
        };
        if c.buf.overflowed() {
            return true;
        }
        if c.buf.push(wc) {
            let kind = TraceKind::Complete(wc.status, wc.opcode);
            net.trace(c.dev, wc.qp_num, kind, None, Some(wc.wr_id));
            let solicited = se || wc.status != WcStatus::Success;
            self.notifier.notify(cq, &mut c.notify, solicited);
            return true;
        }
        let overflow = AsyncEvent {
            kind: AsyncEventKind::CqErr,
            element: EventElement::Cq(c.notify.key),
        };
        self.async_events.raise(c.dev, overflow);
        false
    }

    /// Removes CQ `cq` from the event path (its handle is gone): disarmed, its queued
    /// events withdrawn, its channel released.
    pub(crate) fn detach_cq(&mut self, cq: usize) {
        if let Some(c) = self.cqs.get_mut(cq) {
            self.notifier.detach(cq, &mut c.notify);
        }
    }

    /// Puts CQ `cq` (new) on completion channel `id`.
    pub(crate) fn attach_channel(&mut self, cq: usize, id: usize) {
        let c = self.cqs.get_mut(cq).expect("new CQ");
        self.notifier.attach(&mut c.notify, id);
    }

    /// Takes the oldest event of channel `id` (`ibv_get_cq_event`): the key of the CQ
    /// that raised it, which counts it as unacknowledged.
    pub(crate) fn take_channel_event(&mut self, id: usize) -> Option<u64> {
        let (cq, key) = self.notifier.take(id)?;
        if let Some(c) = self.cqs.get_mut(cq) {
            c.notify.took_event();
        }
        Some(key)
    }
}

impl World {
    /// Pushes a completion; on overflow the CQ enters its error state and every QP using it
    /// moves to ERR (completions it can no longer take are dropped).
    pub(crate) fn push_cqe(&mut self, cq: usize, wc: WorkCompletion) {
        self.push_cqe_se(cq, wc, false);
    }

    /// [`World::push_cqe`] for a receive whose request asked for a solicited event
    /// (`se`): it raises the event of a CQ armed solicited-only, as does any completion
    /// in error (`ibv_req_notify_cq(3)`).
    pub(crate) fn push_cqe_se(&mut self, cq: usize, wc: WorkCompletion, se: bool) {
        if self.tables.write_cqe(&mut self.net, cq, wc, se) {
            return;
        }
        for q in 0..self.tables.qps.slots() {
            let uses = self
                .tables
                .qps
                .get(q)
                .is_some_and(|qp| qp.send_cq() == cq || qp.recv_cq() == cq);
            if uses {
                self.set_err(q);
            }
        }
    }

    /// Completes the oldest SQ entry of QP `q` with `status` (see
    /// [`QpObj::retire_front`]).
    pub(crate) fn complete_front(&mut self, q: usize, status: WcStatus) {
        let Some(qp) = self.tables.qps.get_mut(q) else {
            return;
        };
        if let Some(wc) = qp.retire_front(status) {
            let cq = qp.send_cq();
            self.push_cqe(cq, wc);
        }
    }

    /// Completes the oldest SQ entry of QP `q` with error `status` and moves `q` to ERR.
    pub(crate) fn fail_front(&mut self, q: usize, status: WcStatus) {
        self.complete_front(q, status);
        self.set_err(q);
    }

    /// Moves QP `q` to ERR, flushing its SQ then its RQ in posting order (once).
    pub(crate) fn set_err(&mut self, q: usize) {
        if !self
            .tables
            .qps
            .get(q)
            .is_some_and(|qp| qp.state != QpState::Error)
        {
            return;
        }
        // A responder in ERR answers nothing: a requester asleep on its RNR NAK must wake
        // and find that out by retrying.
        self.wake_parked(q);
        let World { tables, net, .. } = self;
        // Timers and packets of the old incarnation become stale.
        let epoch = tables.next_epoch();
        // Looked up again: the requester just woken may be `q` itself (a queue pair
        // connected to itself).
        let qp = tables.qps.get_mut(q).expect("live QP");
        *qp.unsig_done = 0;
        (*qp.req, qp.epoch) = (ReqState::default(), epoch);
        net.sched.events.cancel_timer(q);
        qp.set_state(QpState::Error, net);
        // One at a time: a flush completion may overflow a CQ, which re-enters `set_err`.
        while let Some((cq, wc)) = self.tables.qps.get_mut(q).and_then(QpObj::flush_one) {
            self.push_cqe(cq, wc);
        }
        self.last_wqe_reached(q);
    }
}
