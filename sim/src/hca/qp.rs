//! The queue pair: its requester and responder state, its send queue, the verbs state
//! machine (`modify`) and posting.
//!
//! The send queue is a fixed ring of work request slots, written in place. A `VecDeque` of
//! whole entries copies each entry (a request with 16 gather entries and 256 bytes of
//! inline room, over 500 bytes) on every push and pop. Here a post writes only the fields
//! and bytes it uses into the next slot, and retiring the head moves an index.

use std::collections::VecDeque;

use super::cq::{flush_wc, send_opcode};
use super::mem::{copy, Dst, RawInline, Src};
use super::{invalid, sg_len, Tables, World};
use crate::config::{Personality, ROCE_ROUTE_HOP_LIMIT};
use crate::trace::TraceKind;
use crate::types::*;

/// Largest 24-bit value (PSNs, QPNs).
pub(crate) const MAX_24: u32 = (1 << 24) - 1;
/// The largest GRH flow label (20 bits).
pub(crate) const MAX_FLOW_LABEL: u32 = (1 << 20) - 1;

/// Which timer a requester runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimerKind {
    /// Local ACK timeout.
    Ack,
    /// Waiting out an RNR NAK.
    Rnr,
}

/// Requester side of a queue pair (the transport state of its send queue).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReqState {
    /// PSN of the next packet sent.
    pub(crate) next_psn: u32,
    /// SQ entries `0..sent` are on the wire, awaiting their response.
    pub(crate) sent: usize,
    /// Reads and atomics among them.
    pub(crate) rd_inflight: u8,
    /// Transport retries left (reset on progress).
    pub(crate) retries: u8,
    /// RNR retries left (reset on progress; unused when `rnr_retry` is 7).
    pub(crate) rnr_left: u8,
    /// Waiting out an RNR NAK: nothing is sent.
    pub(crate) rnr_wait: bool,
    /// Instant timers: asleep on RNR until the responder posts a receive, leaves RTR/RTS
    /// or becomes unreachable (`wake_parked`, `wake_unreachable`).
    pub(crate) parked: bool,
    /// Instant timers: its responder is not yet in RTR (a start-up race). Instead of
    /// spending every retry at once, it waits the time its retries would take on hardware
    /// (its timer), and is woken the moment the responder reaches RTR (`wake_not_ready`).
    pub(crate) not_ready: bool,
    /// The armed timer: deadline and kind (mirrored in the event queue's timer heap).
    pub(crate) timer: Option<(u64, TimerKind)>,
}

/// Atomic results a responder remembers for replay (as many as `max_dest_rd_atomic`).
pub(crate) const ATOMIC_CACHE: usize = 16;

/// Responder side of a queue pair.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RespState {
    /// Expected PSN.
    pub(crate) epsn: u32,
    /// (PSN, old value) of recent atomics, a ring.
    pub(crate) atomics: [(u32, u64); ATOMIC_CACHE],
    pub(crate) next_atomic: usize,
}

impl RespState {
    pub(crate) fn remember(&mut self, psn: u32, old: u64) {
        self.atomics[self.next_atomic] = (psn, old);
        self.next_atomic = (self.next_atomic + 1) % ATOMIC_CACHE;
    }

    pub(crate) fn recall(&self, psn: u32) -> Option<u64> {
        self.atomics.iter().find(|a| a.0 == psn).map(|a| a.1)
    }
}

/// A reliable-connected queue pair.
#[derive(Debug)]
pub(crate) struct QpObj {
    pub(crate) qpn: u32,
    pub(crate) dev: usize,
    /// Incarnation, fabric-unique; changes on RESET, ERR and crash.
    pub(crate) epoch: u32,
    /// Its device crashed: the QP is gone but for its handle.
    pub(crate) dead: bool,
    /// Device the RTR path resolves to.
    pub(crate) peer_dev: Option<usize>,
    pub(crate) req: ReqState,
    pub(crate) resp: RespState,
    pub(crate) pd: usize,
    pub(crate) send_cq: usize,
    pub(crate) recv_cq: usize,
    pub(crate) cap: QpCap,
    pub(crate) sig_all: bool,
    pub(crate) state: QpState,
    pub(crate) init: Option<InitAttr>,
    pub(crate) rtr: Option<RtrAttr>,
    pub(crate) rts: Option<RtsAttr>,
    /// Send WRs not yet executed, oldest first.
    pub(crate) sq: SendQueue,
    /// Receive WRs not yet consumed, oldest first.
    pub(crate) rq: VecDeque<RecvWr>,
    /// Executed unsignaled WRs still holding SQ slots (released by the next send CQE).
    pub(crate) unsig_done: usize,
    /// Send WRs of this QP completed on the direct path (kept here, not in the shared
    /// world header, so that counting dirties only a line the post writes anyway).
    pub(crate) direct_count: u64,
    /// Doorbells, posts and send completions (`Qp::counters`).
    pub(crate) counters: crate::counters::QpCounters,
}

/// A queued send work request, with its inline payload copied at post time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqEntry {
    pub(crate) wr: SendWr,
    pub(crate) inline: [u8; MAX_INLINE],
    /// First PSN, once transmitted.
    pub(crate) psn: u32,
    /// PSNs the message uses (path-MTU segments, at least 1).
    pub(crate) npkts: u32,
    /// Transmitted at least once (later transmissions are retransmissions).
    pub(crate) sent_once: bool,
}

/// Send work requests not yet executed, oldest first, at most `capacity` of them.
#[derive(Debug)]
pub(crate) struct SendQueue {
    slots: Vec<SqEntry>,
    head: usize,
    len: usize,
}

impl SendQueue {
    /// An empty queue of `capacity` (at least 1) slots, allocated now.
    pub(crate) fn new(capacity: usize) -> SendQueue {
        let blank = SqEntry {
            wr: SendWr {
                wr_id: 0,
                sg_list: [Sge::default(); MAX_SGE],
                num_sge: 0,
                op: SendOp::Send,
                flags: SendFlags::empty(),
            },
            inline: [0; MAX_INLINE],
            psn: 0,
            npkts: 1,
            sent_once: false,
        };
        SendQueue {
            slots: vec![blank; capacity.max(1)],
            head: 0,
            len: 0,
        }
    }

    fn slot(&self, i: usize) -> usize {
        let at = self.head + i;
        if at >= self.slots.len() {
            at - self.slots.len()
        } else {
            at
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Entry `i` from the head.
    pub(crate) fn get(&self, i: usize) -> Option<&SqEntry> {
        (i < self.len).then(|| &self.slots[self.slot(i)])
    }

    /// Entry `i` from the head, mutably.
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut SqEntry> {
        let at = self.slot(i);
        (i < self.len).then(|| &mut self.slots[at])
    }

    pub(crate) fn front(&self) -> Option<&SqEntry> {
        self.get(0)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &SqEntry> {
        (0..self.len).map(|i| &self.slots[self.slot(i)])
    }

    /// Appends an entry written in place by `fill` into a slot that holds a stale entry:
    /// `fill` must set every field a reader uses (`wr` but the gather entries past its
    /// `num_sge`, the inline bytes it uses, `psn`, `npkts`, `sent_once`).
    ///
    /// # Panics
    /// If the queue is full (callers check `max_send_wr` first).
    pub(crate) fn push_with(&mut self, fill: impl FnOnce(&mut SqEntry)) {
        assert!(self.len < self.slots.len(), "send queue overflow");
        let at = self.slot(self.len);
        fill(&mut self.slots[at]);
        self.len += 1;
    }

    /// Removes the head and returns a copy of it.
    pub(crate) fn pop_front(&mut self) -> Option<SqEntry> {
        let e = *self.front()?;
        self.drop_front();
        Some(e)
    }

    /// Removes the head, if any, without copying it.
    pub(crate) fn drop_front(&mut self) {
        if self.len > 0 {
            self.head = self.slot(1);
            self.len -= 1;
        }
    }

    pub(crate) fn clear(&mut self) {
        (self.head, self.len) = (0, 0);
    }
}

impl World {
    /// Sets QP `q`'s state, tracing the change.
    pub(crate) fn set_state(&mut self, q: usize, to: QpState) {
        let Some(qp) = self.tables.qps.get_mut(q) else {
            return;
        };
        let (from, dev, qpn) = (qp.state, qp.dev, qp.qpn);
        qp.state = to;
        if from != to {
            self.trace(dev, qpn, TraceKind::State(from, to), None, None);
        }
    }

    /// Applies a state transition (see [`Modify`]).
    pub(crate) fn modify(&mut self, q: usize, m: &Modify) -> Result<(), SimError> {
        use QpState::*;
        let epoch = self.tables.next_epoch();
        let peer_dev = match m {
            Modify::Rtr(a) => self.route(a),
            _ => None,
        };
        if matches!(m, Modify::Reset) && self.tables.qps.get(q).is_some_and(|qp| !qp.dead) {
            // A responder in RESET answers nothing (and forgets its RTR attributes, which
            // name the requester that may sleep on its RNR NAK): wake that requester.
            self.wake_parked(q);
        }
        let qp = self.tables.qps.get_mut(q).expect("live QP");
        if qp.dead {
            return core::result::Result::Err(SimError::DeviceFatal);
        }
        let to = match *m {
            Modify::Reset => {
                qp.sq.clear();
                qp.rq.clear();
                qp.unsig_done = 0;
                (qp.init, qp.rtr, qp.rts) = (None, None, None);
                (qp.req, qp.resp, qp.peer_dev) = (ReqState::default(), RespState::default(), None);
                qp.epoch = epoch;
                self.net.sched.events.cancel_timer(q);
                Reset
            }
            Modify::Err => {
                self.set_err(q);
                return Ok(());
            }
            Modify::Init(a) => {
                if !matches!(qp.state, Reset | Init) {
                    return invalid("INIT only from RESET or INIT");
                }
                if a.port != 1 || a.pkey_index != 0 {
                    return invalid("port must be 1 and pkey_index 0");
                }
                qp.init = Some(a);
                Init
            }
            Modify::Rtr(a) => {
                if qp.state != Init {
                    return invalid("RTR only from INIT");
                }
                if a.port != 1 || a.dest_qp_num > MAX_24 || a.rq_psn > MAX_24 {
                    return invalid("bad port, dest_qp_num or rq_psn");
                }
                if a.min_rnr_timer > 31 || usize::from(a.sgid_index) >= 2 {
                    return invalid("bad min_rnr_timer or sgid_index");
                }
                if a.sl > 15 || a.flow_label > MAX_FLOW_LABEL {
                    return invalid("sl exceeds 15 or flow_label exceeds 20 bits");
                }
                // The port's active MTU is 4096, the largest there is: any path_mtu fits.
                let a = match self.net.cfg.personality {
                    Personality::Hca => a,
                    Personality::Rxe => RtrAttr {
                        sl: 0,
                        hop_limit: match a.dgid {
                            Some(_) => ROCE_ROUTE_HOP_LIMIT,
                            None => a.hop_limit,
                        },
                        ..a
                    },
                };
                qp.rtr = Some(a);
                qp.resp.epsn = a.rq_psn;
                qp.peer_dev = peer_dev;
                Rtr
            }
            Modify::Rts(a) => {
                if !matches!(qp.state, Rtr | Rts) {
                    return invalid("RTS only from RTR or RTS");
                }
                if a.sq_psn > MAX_24 || a.timeout > 31 || a.retry_cnt > 7 || a.rnr_retry > 7 {
                    return invalid("bad sq_psn, timeout, retry_cnt or rnr_retry");
                }
                if qp.state == Rtr {
                    qp.req.next_psn = a.sq_psn;
                }
                (qp.req.retries, qp.req.rnr_left) = (a.retry_cnt, a.rnr_retry);
                qp.rts = Some(a);
                Rts
            }
        };
        self.set_state(q, to);
        if to == Rtr {
            self.wake_not_ready(q);
        }
        if to == Rts {
            self.pump(q);
        }
        Ok(())
    }

    /// The device an RTR path leads to: by GID when it has one, else by LID.
    fn route(&self, a: &RtrAttr) -> Option<usize> {
        match a.dgid {
            Some(gid) => self
                .tables
                .devices
                .iter()
                .position(|d| d.gids.contains(&gid)),
            None => {
                let i = usize::from(a.dlid).checked_sub(1)?;
                (i < self.tables.devices.len()).then_some(i)
            }
        }
    }

    /// Posts send WRs in order (see `Qp::post_send`); the error names the first refused
    /// (those before it stay posted). `next` writes the next request into the scratch
    /// `SendWr` it is given (whose entries past `num_sge` are stale) and returns true, or
    /// returns false when there is none.
    ///
    /// On an untimed fabric nothing executes before the whole list is posted (INLINE data
    /// is captured at post, before earlier requests of the list could change it, and all of
    /// them hold send queue slots), as on the packet path, where execution waits for the
    /// events run at the end of the call; then the direct path takes what it can.
    pub(crate) fn post_send_list(
        &mut self,
        q: usize,
        mut next: impl FnMut(&mut SendWr) -> bool,
        raw: Option<&RawInline>,
    ) -> Result<(), (usize, SimError)> {
        let mut wr = SendWr {
            wr_id: 0,
            sg_list: [Sge::default(); MAX_SGE],
            num_sge: 0,
            op: SendOp::Send,
            flags: SendFlags::empty(),
        };
        let mut res = Ok(());
        let mut posted = 0;
        for index in 0.. {
            if !next(&mut wr) {
                break;
            }
            if self.net.untimed && index > 0 {
                self.fail_head_now(q);
            }
            if let Err(error) = self.post_send(q, &wr, raw) {
                res = Err((index, error));
                break;
            }
            posted += 1;
        }
        self.count_posts(q, true, posted);
        if self.net.untimed {
            self.run_direct(q);
            self.pump(q);
        }
        res
    }

    /// Validates and queues one send WR (see `Qp::post_send`). With `raw`, inline SGEs are
    /// read from their addresses; otherwise they must lie in memory registered in the PD.
    /// On an untimed fabric transmission waits for the end of the list (`post_send_list`).
    fn post_send(
        &mut self,
        q: usize,
        wr: &SendWr,
        raw: Option<&RawInline>,
    ) -> Result<(), SimError> {
        let (Tables { qps, mrs, .. }, cfg) = (&mut self.tables, &self.net.cfg);
        let qp = qps.get_mut(q).expect("live QP");
        if qp.dead {
            return Err(SimError::DeviceFatal);
        }
        if !matches!(qp.state, QpState::Rts | QpState::Err) {
            return invalid("QP not in RTS");
        }
        if wr.num_sge > qp.cap.max_send_sge as usize {
            return invalid("num_sge exceeds max_send_sge");
        }
        if let (
            Personality::Rxe,
            SendOp::CompareSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. },
        ) = (cfg.personality, wr.op)
        {
            if remote_addr % 8 != 0 {
                return invalid("atomic remote address not 8-byte aligned (rxe)");
            }
        }
        let sges = &wr.sg_list[..wr.num_sge];
        let inline = wr.flags.contains(SendFlags::INLINE);
        if inline {
            use SendOp::*;
            let ok_op = matches!(
                wr.op,
                Send | SendWithImm { .. } | Write { .. } | WriteWithImm { .. }
            );
            if !ok_op {
                return invalid("INLINE on an operation without payload to send");
            }
            if sg_len(sges) > u64::from(qp.cap.max_inline_data) {
                return invalid("inline data exceeds max_inline_data");
            }
        }
        if qp.sq.len() + qp.unsig_done >= qp.cap.max_send_wr as usize {
            return Err(SimError::QueueFull);
        }
        if qp.state == QpState::Err {
            let wc = flush_wc(wr.wr_id, send_opcode(&wr.op), qp.qpn);
            let cq = qp.send_cq;
            self.push_cqe(cq, wc);
            self.count_send_end(q, true);
            return Ok(());
        }
        // Inline data is resolved before anything is queued (a bad source refuses the
        // post) and copied into the entry's slot.
        let mut spans = [Src::EMPTY; MAX_SGE];
        let mut inline_len = 0;
        if inline {
            for (s, span) in sges.iter().filter(|s| s.length > 0).zip(&mut spans) {
                let n = s.length as usize;
                let pd = qp.pd;
                let src = match raw {
                    Some(r) => r.src(s.addr, n),
                    None => mrs
                        .iter()
                        .find(|m| m.pd == pd && m.region.contains(s.addr, n))
                        .and_then(|m| m.region.src(s.addr, n)),
                };
                let Some(src) = src else {
                    return invalid("inline data outside registered memory");
                };
                *span = src;
                inline_len += n;
            }
        }
        qp.sq.push_with(|e| {
            e.wr.wr_id = wr.wr_id;
            e.wr.sg_list[..sges.len()].copy_from_slice(sges);
            (e.wr.num_sge, e.wr.op, e.wr.flags) = (wr.num_sge, wr.op, wr.flags);
            (e.psn, e.npkts, e.sent_once) = (0, 1, false);
            if inline_len > 0 {
                copy(
                    &spans,
                    &[Dst::slice(&mut e.inline[..inline_len])],
                    inline_len,
                );
            }
        });
        let (dev, qpn) = (qp.dev, qp.qpn);
        self.trace(
            dev,
            qpn,
            TraceKind::PostSend(send_opcode(&wr.op)),
            None,
            Some(wr.wr_id),
        );
        if !self.net.untimed {
            self.pump(q);
        }
        Ok(())
    }

    /// Untimed fabric, before the next request of a list: the packet path transmits each
    /// request as it is posted, which fails one at the head of the queue at once when its
    /// local checks fail (so the QP is in ERR for the rest of the list, whose requests are
    /// flushed rather than refused as `QueueFull`). Nothing else it does is visible before
    /// the list is posted.
    fn fail_head_now(&mut self, q: usize) {
        let qp = self.tables.qps.get(q).expect("live QP");
        let head = qp
            .sq
            .front()
            .filter(|_| qp.sq.len() == 1 && qp.req.sent == 0);
        if head.is_some_and(|e| self.local_check(qp, &e.wr).is_err()) {
            self.pump(q);
        }
    }

    /// Validates and queues one receive WR (see `Qp::post_recv`).
    pub(crate) fn post_recv(&mut self, q: usize, wr: &RecvWr) -> Result<(), SimError> {
        let qp = self.tables.qps.get_mut(q).expect("live QP");
        if qp.dead {
            return Err(SimError::DeviceFatal);
        }
        if qp.state == QpState::Reset {
            return invalid("QP in RESET");
        }
        if wr.num_sge > qp.cap.max_recv_sge as usize {
            return invalid("num_sge exceeds max_recv_sge");
        }
        if qp.rq.len() >= qp.cap.max_recv_wr as usize {
            return Err(SimError::QueueFull);
        }
        if qp.state == QpState::Err {
            let wc = flush_wc(wr.wr_id, WcOpcode::Recv, qp.qpn);
            let cq = qp.recv_cq;
            self.push_cqe(cq, wc);
        } else {
            qp.rq.push_back(*wr);
            let (dev, qpn) = (qp.dev, qp.qpn);
            self.trace(dev, qpn, TraceKind::PostRecv, None, Some(wr.wr_id));
            self.wake_parked(q);
        }
        Ok(())
    }

    /// Counts one post call on QP `q` that posted `n` work requests.
    pub(crate) fn count_posts(&mut self, q: usize, send: bool, n: usize) {
        let (Some(qp), true) = (self.tables.qps.get_mut(q), n > 0) else {
            return;
        };
        let c = &mut qp.counters;
        let n = n as u64;
        if send {
            c.send_doorbells += 1;
            c.sends_posted += n;
        } else {
            c.recv_doorbells += 1;
            c.recvs_posted += n;
        }
    }

    /// Counts the end of one send work request on QP `q`: with a completion written for
    /// it, or silently (unsignaled and successful).
    pub(crate) fn count_send_end(&mut self, q: usize, completion: bool) {
        if let Some(qp) = self.tables.qps.get_mut(q) {
            if completion {
                qp.counters.send_completions += 1;
            } else {
                qp.counters.silent_sends += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(q: &mut SendQueue, id: u64) {
        q.push_with(|e| e.wr.wr_id = id);
    }

    #[test]
    fn fifo_across_the_wrap() {
        let mut q = SendQueue::new(3);
        for round in 0..5u64 {
            push(&mut q, round * 10);
            push(&mut q, round * 10 + 1);
            assert_eq!(q.len(), 2);
            let ids: Vec<u64> = q.iter().map(|e| e.wr.wr_id).collect();
            assert_eq!(ids, [round * 10, round * 10 + 1]);
            assert_eq!(q.get(1).map(|e| e.wr.wr_id), Some(round * 10 + 1));
            assert!(q.get(2).is_none());
            assert_eq!(q.pop_front().map(|e| e.wr.wr_id), Some(round * 10));
            q.drop_front();
            assert!(q.len() == 0 && q.front().is_none() && q.pop_front().is_none());
        }
    }

    #[test]
    #[should_panic(expected = "send queue overflow")]
    fn refuses_past_capacity() {
        let mut q = SendQueue::new(1);
        push(&mut q, 1);
        push(&mut q, 2);
    }
}
