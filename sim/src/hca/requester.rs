//! The requester: the send queue's side of the RC transport. Transmission, the local ACK
//! timer, retries, RNR waits, and the responses that complete requests.
//!
//! One packet carries one whole message; its PSNs are `psn .. psn + npkts` where `npkts`
//! is the number of path-MTU segments (at least 1). The requester sends every queued
//! request at once (reads and atomics limited by `max_rd_atomic`), each once it passes its
//! local checks ([`World::local_check`]); acknowledgements are cumulative. It runs one
//! timer per queue pair, and on a timeout goes back to the oldest unacknowledged request,
//! spending one of `retry_cnt`.
//!
//! The timer (the local ACK timeout or an RNR wait) is kept in the event queue's indexed
//! timer heap. Arming moves it, disarming removes it: a cancelled timer leaves no event
//! behind, so `run_until_idle` ends as soon as no work remains and simulated time never
//! jumps to a deadline that no longer matters.

use super::qp::{QpObj, SqEntry, TimerKind};
use super::{sg_len, World};
use crate::config::{ack_timeout_ns, rnr_timer_ns, Personality};
use crate::trace::TraceKind;
use crate::types::*;
use crate::wire::{psn_diff, DropReason, Packet, PacketKind, HEADER_BYTES, PSN_MASK};

fn mtu_bytes(m: Mtu) -> u64 {
    128 << (m as u8)
}

/// Whether `op` is a read or an atomic (uses a read/atomic credit).
pub(crate) fn rd_atomic(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
    )
}

/// Message length of a request (atomics: 8).
pub(crate) fn msg_len(wr: &SendWr) -> u64 {
    match wr.op {
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 8,
        _ => sg_len(&wr.sg_list[..wr.num_sge]),
    }
}

/// The requester's checks of `wr` (gathering `total` bytes) that need no memory lookup:
/// the message length, and whether the QP may issue reads/atomics. Together with the
/// local half of [`World::execute`] they make [`World::local_check`].
pub(crate) fn local_limits(qp: &QpObj, wr: &SendWr, total: u64) -> Result<(), WcStatus> {
    let atomic = matches!(wr.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. });
    if total > MAX_MSG || (atomic && total != 8) {
        return Err(WcStatus::LocLenErr);
    }
    if rd_atomic(&wr.op) && qp.rts.is_some_and(|r| r.max_rd_atomic == 0) {
        return Err(WcStatus::LocQpOpErr);
    }
    Ok(())
}

impl World {
    /// Transmits the send-queue entries of QP `q` not yet on the wire, in order. A request
    /// failing its local checks stops transmission; it completes with its error once it
    /// is the oldest (all before it completed).
    pub(crate) fn pump(&mut self, q: usize) {
        loop {
            let Some(qp) = self.tables.qps.get(q) else {
                return;
            };
            if qp.state != QpState::Rts || qp.req.rnr_wait {
                return;
            }
            let i = qp.req.sent;
            let Some(e) = qp.sq.get(i) else { return };
            if let Err(status) = self.local_check(qp, &e.wr) {
                if i == 0 {
                    self.fail_front(q, status);
                }
                return;
            }
            let (Some(rtr), Some(rts)) = (qp.rtr, qp.rts) else {
                return;
            };
            let rd = rd_atomic(&e.wr.op);
            if rd && qp.req.rd_inflight >= rts.max_rd_atomic {
                return;
            }
            let len = msg_len(&e.wr);
            let npkts = len.div_ceil(mtu_bytes(rtr.path_mtu)).max(1) as u32;
            let wire = match e.wr.op {
                SendOp::Read { .. } => HEADER_BYTES + 16,
                SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => HEADER_BYTES + 28,
                _ => len + u64::from(npkts) * HEADER_BYTES,
            };
            let (retx, wr_id) = (e.sent_once, e.wr.wr_id);
            let qp = self.tables.qps.get_mut(q).expect("live QP");
            let psn = qp.req.next_psn;
            let e = qp.sq.get_mut(i).expect("queued entry");
            (e.psn, e.npkts, e.sent_once) = (psn, npkts, true);
            qp.req.next_psn = psn.wrapping_add(npkts) & PSN_MASK;
            qp.req.sent += 1;
            qp.req.rd_inflight += u8::from(rd);
            let (dev, qpn, armed) = (qp.dev, qp.qpn, qp.req.timer.is_some());
            let pkt = Packet {
                src_dev: dev as u32,
                dst_dev: qp.peer_dev.unwrap_or(0) as u32,
                src_qpn: qpn,
                dst_qpn: rtr.dest_qp_num,
                psn,
                npkts,
                epoch: qp.epoch,
                kind: PacketKind::Request,
            };
            let peer_dev = qp.peer_dev;
            let what = if retx {
                TraceKind::Retransmit
            } else {
                TraceKind::Send(PacketKind::Request)
            };
            self.trace(dev, qpn, what, Some(psn), Some(wr_id));
            match peer_dev {
                Some(_) => self.net.send(pkt, wire),
                None => {
                    let why = TraceKind::Drop(PacketKind::Request, DropReason::NoRoute);
                    self.trace(dev, qpn, why, Some(psn), Some(wr_id));
                }
            }
            if !armed {
                self.arm_ack(q);
            }
        }
    }

    /// Go-back-N: everything outstanding will be sent again, from the oldest.
    pub(crate) fn go_back(&mut self, q: usize) {
        let Some(qp) = self.tables.qps.get_mut(q) else {
            return;
        };
        (qp.req.sent, qp.req.rd_inflight) = (0, 0);
        if let Some(e) = qp.sq.front().filter(|e| e.sent_once) {
            qp.req.next_psn = e.psn;
        }
    }

    /// A response (ACK, NAK, read/atomic response) arrives at requester `q`.
    pub(crate) fn on_response(&mut self, q: usize, pkt: Packet) {
        let qp = self.tables.qps.get(q).expect("live QP");
        let (dev, qpn, psn) = (qp.dev, qp.qpn, Some(pkt.psn));
        let from_peer = qp.rtr.is_some_and(|r| r.dest_qp_num == pkt.src_qpn)
            && qp.peer_dev == Some(pkt.src_dev as usize);
        let why = if qp.state != QpState::Rts {
            Some(DropReason::NotReady)
        } else if !from_peer {
            Some(DropReason::WrongSource)
        } else if qp.req.rnr_wait && matches!(pkt.kind, PacketKind::Rnr(_)) {
            // A second RNR NAK for the request already being waited out (a duplicate).
            Some(DropReason::Stale)
        } else {
            None
        };
        let covers = |e: &SqEntry| psn_diff(pkt.psn, e.psn) < e.npkts;
        let i = qp.sq.iter().take(qp.req.sent).position(covers);
        let (Some(i), None) = (i, why) else {
            let why = why.unwrap_or(DropReason::Stale);
            return self.trace(dev, qpn, TraceKind::Drop(pkt.kind, why), psn, None);
        };
        // Everything before the PSN this answers is implicitly acknowledged.
        for _ in 0..i {
            self.complete_front(q, WcStatus::Success);
        }
        let alive = |w: &World| {
            w.tables
                .qps
                .get(q)
                .is_some_and(|qp| qp.state == QpState::Rts)
        };
        if !alive(self) {
            return;
        }
        match pkt.kind {
            PacketKind::Ack | PacketKind::ReadResp | PacketKind::AtomicResp => {
                self.complete_front(q, WcStatus::Success);
            }
            PacketKind::Nak(status) => return self.fail_front(q, status),
            PacketKind::Bad | PacketKind::Request => {
                return self.fail_front(q, self.bad_response_status(q))
            }
            PacketKind::Rnr(_) => {}
        }
        if !alive(self) {
            return;
        }
        // Forward progress (unless an RNR NAK answered the oldest request itself).
        let qp = self.tables.qps.get_mut(q).expect("live QP");
        let rts = qp.rts.expect("RTS attributes");
        if i > 0 || !matches!(pkt.kind, PacketKind::Rnr(_)) {
            (qp.req.retries, qp.req.rnr_left) = (rts.retry_cnt, rts.rnr_retry);
        }
        if let PacketKind::Rnr(code) = pkt.kind {
            return self.on_rnr(q, code);
        }
        if qp.req.sent > 0 {
            self.arm_ack(q);
        } else {
            self.disarm(q);
        }
        self.pump(q);
    }

    /// The oldest request of `q` met an empty receive queue: wait and retry, or give up.
    fn on_rnr(&mut self, q: usize, code: u8) {
        let qp = self.tables.qps.get_mut(q).expect("live QP");
        let (dev, qpn) = (qp.dev, qp.qpn);
        let infinite = qp.rts.is_some_and(|r| r.rnr_retry == 7);
        if !infinite {
            if qp.req.rnr_left == 0 {
                return self.fail_front(q, WcStatus::RnrRetryExcErr);
            }
            qp.req.rnr_left -= 1;
        }
        qp.req.rnr_wait = true;
        let head = qp.sq.front().map(|e| (e.psn, e.wr.wr_id));
        let (psn, id) = (head.map(|h| h.0), head.map(|h| h.1));
        let park = self.net.cfg.instant_timers && infinite;
        qp.req.parked = park;
        let wait = if self.net.cfg.instant_timers {
            0
        } else {
            rnr_timer_ns(code)
        };
        self.trace(dev, qpn, TraceKind::RnrWait(wait), psn, id);
        match park {
            true => self.disarm(q),
            false => self.arm(q, self.net.sched.now.saturating_add(wait), TimerKind::Rnr),
        }
    }

    /// The requester's checks before `e` goes on the wire: lengths, local keys and
    /// bounds, and whether the QP may issue reads/atomics (`max_rd_atomic` > 0, else
    /// `LocQpOpErr`).
    pub(crate) fn local_check(&self, qp: &QpObj, wr: &SendWr) -> Result<(), WcStatus> {
        use SendOp::*;
        let sges = &wr.sg_list[..wr.num_sge];
        let total = sg_len(sges);
        local_limits(qp, wr, total)?;
        let local_ok = match wr.op {
            Read { .. } | CompareSwap { .. } | FetchAdd { .. } => {
                self.tables
                    .mrs
                    .scatter(qp.pd, sges, total as usize, &mut [])
            }
            _ if wr.flags.contains(SendFlags::INLINE) => true,
            _ => self.tables.mrs.gather(qp.pd, sges, &mut []),
        };
        if !local_ok {
            let writes = matches!(wr.op, Read { .. } | CompareSwap { .. } | FetchAdd { .. });
            let unusable_key = |s: &Sge| {
                s.length > 0
                    && !matches!(self.tables.mrs.lookup(s.lkey, false, qp.pd),
                        Some(m) if !writes || m.access.contains(Access::LOCAL_WRITE))
            };
            let inline = wr.flags.contains(SendFlags::INLINE);
            if self.net.cfg.personality == Personality::Rxe
                && !inline
                && sges.iter().any(unusable_key)
            {
                return Err(WcStatus::LocQpOpErr); // rxe: copy_data's -EINVAL
            }
            return Err(WcStatus::LocProtErr);
        }
        Ok(())
    }

    /// The status of QP `q`'s oldest request when its response arrives with an opcode the
    /// requester does not expect (`Fabric::corrupt_next_response`).
    ///
    /// The IB spec's answer, and mlx5's (syndrome `BAD_RESP_ERR` in `mlx5_handle_error_cqe`),
    /// is `BadRespErr`. rxe's completer checks the response opcode against the request
    /// (`check_ack` in `drivers/infiniband/sw/rxe/rxe_comp.c`): an RDMA READ response to a
    /// request that is not a read fails it with `FatalErr`, so with the rxe personality the
    /// corrupted response is a read response and a send, write or atomic completes with
    /// `FatalErr`. A read has no error status there (a wrong response can even complete it),
    /// so it keeps the spec's `BadRespErr`.
    pub(crate) fn bad_response_status(&self, q: usize) -> WcStatus {
        let front = self.tables.qps.get(q).and_then(|qp| qp.sq.front());
        let read = front.is_some_and(|e| matches!(e.wr.op, SendOp::Read { .. }));
        match self.net.cfg.personality {
            Personality::Rxe if !read => WcStatus::FatalErr,
            _ => WcStatus::BadRespErr,
        }
    }

    /// (Re)starts the local ACK timer of QP `q` (none with timeout code 0).
    pub(crate) fn arm_ack(&mut self, q: usize) {
        let code = self
            .tables
            .qps
            .get(q)
            .and_then(|qp| qp.rts)
            .map_or(0, |r| r.timeout);
        match ack_timeout_ns(code) {
            Some(ns) => {
                let after = if self.net.cfg.instant_timers { 0 } else { ns };
                self.arm(q, self.net.sched.now.saturating_add(after), TimerKind::Ack);
            }
            None => self.disarm(q),
        }
    }

    /// Sets QP `q`'s timer to fire at `at`, replacing any other.
    pub(crate) fn arm(&mut self, q: usize, at: u64, kind: TimerKind) {
        let Some(qp) = self.tables.qps.get_mut(q) else {
            return;
        };
        qp.req.timer = Some((at, kind));
        self.net.sched.events.set_timer(q, at);
    }

    /// Stops QP `q`'s timer.
    pub(crate) fn disarm(&mut self, q: usize) {
        if let Some(qp) = self.tables.qps.get_mut(q) {
            qp.req.timer = None;
        }
        self.net.sched.events.cancel_timer(q);
    }

    /// The timer of QP `q` fires.
    pub(crate) fn on_timer(&mut self, q: usize) {
        let not_ready = self.net.cfg.instant_timers && self.responder_not_ready(q);
        let Some(qp) = self.tables.qps.get_mut(q) else {
            return;
        };
        let Some((_, kind)) = qp.req.timer.take() else {
            return;
        };
        if qp.state != QpState::Rts {
            return;
        }
        let (dev, qpn) = (qp.dev, qp.qpn);
        match kind {
            TimerKind::Ack => {
                let Some(head) = qp.sq.front().filter(|_| qp.req.sent > 0) else {
                    return;
                };
                let (psn, id) = (Some(head.psn), Some(head.wr.wr_id));
                if not_ready && !qp.req.not_ready && qp.req.retries > 0 {
                    // Hardware would retry into silence for `retries` more timeouts while
                    // the peer finishes connecting: wait that long, or until it is ready.
                    let code = qp.rts.map_or(0, |r| r.timeout);
                    let budget =
                        ack_timeout_ns(code).map(|ns| ns.saturating_mul(u64::from(qp.req.retries)));
                    (qp.req.not_ready, qp.req.retries) = (true, 0);
                    self.trace(dev, qpn, TraceKind::Timeout, psn, id);
                    if let Some(budget) = budget {
                        self.arm(q, self.net.sched.now.saturating_add(budget), TimerKind::Ack);
                    }
                    return;
                }
                qp.req.not_ready = false;
                let exhausted = qp.req.retries == 0;
                qp.req.retries = qp.req.retries.saturating_sub(1);
                self.trace(dev, qpn, TraceKind::Timeout, psn, id);
                if exhausted {
                    return self.fail_front(q, WcStatus::RetryExcErr);
                }
            }
            TimerKind::Rnr => qp.req.rnr_wait = false,
        }
        self.go_back(q);
        self.pump(q);
    }

    /// Whether requester `q` talks to a live, reachable responder that is not yet in RTR
    /// but on its way (INIT: prepared, its endpoint handed out, not yet connected): a
    /// connection whose other side has not finished connecting. A responder in RESET is
    /// gone, not coming: the requester's retries run out at once, as before.
    fn responder_not_ready(&self, q: usize) -> bool {
        let Some(qp) = self.tables.qps.get(q) else {
            return false;
        };
        let (Some(rtr), Some(dev)) = (qp.rtr, qp.peer_dev) else {
            return false;
        };
        if self.net.wire.blocked(qp.dev, dev).is_some() {
            return false;
        }
        self.tables
            .qp_index(rtr.dest_qp_num)
            .and_then(|r| self.tables.qps.get(r))
            .is_some_and(|r| !r.dead && r.dev == dev && r.state == QpState::Init)
    }

    /// Responder `p` reached RTR: wakes the requester its RTR attributes name if it waits
    /// for `p` to become ready; it retransmits at once.
    pub(crate) fn wake_not_ready(&mut self, p: usize) {
        let Some(r) = self.requester_of(p) else {
            return;
        };
        let req = self.tables.qps.get_mut(r).expect("live QP");
        if req.req.not_ready {
            req.req.not_ready = false;
            req.req.retries = req.rts.map_or(0, |a| a.retry_cnt).saturating_add(1);
            self.arm(r, self.net.sched.now, TimerKind::Ack);
        }
    }

    /// Wakes the requester connected to responder `p` if it sleeps on RNR (instant timers,
    /// `rnr_retry = 7`): `p` got a receive, or leaves RTR/RTS (ERR, RESET, destroyed), so
    /// the next retry no longer meets an RNR NAK. The requester retransmits at once and
    /// meets the real outcome: the receive, or silence and retry exhaustion.
    ///
    /// Only the QP `p`'s RTR attributes name can be parked on it: a responder answers
    /// (with an RNR NAK) nothing but its own destination, and its RTR attributes change
    /// only through RESET, which wakes it first.
    pub(crate) fn wake_parked(&mut self, p: usize) {
        let Some(r) = self.requester_of(p) else {
            return;
        };
        let req = self.tables.qps.get_mut(r).expect("live QP");
        if req.req.parked {
            req.req.parked = false;
            self.arm(r, self.net.sched.now, TimerKind::Rnr);
        }
    }

    /// The requester connected to responder `p`: the queue pair `p`'s RTR attributes name,
    /// if its own RTR attributes name `p` back.
    pub(crate) fn requester_of(&self, p: usize) -> Option<usize> {
        let peer = self.tables.qps.get(p)?;
        let (rtr, qpn) = (peer.rtr?, peer.qpn);
        let r = self.tables.qp_index(rtr.dest_qp_num)?;
        let req = self.tables.qps.get(r)?;
        req.rtr.is_some_and(|a| a.dest_qp_num == qpn).then_some(r)
    }

    /// Wakes every requester sleeping on RNR whose responder it can no longer reach (link
    /// down, partition, crash): on hardware its next retry would go unanswered.
    pub(crate) fn wake_unreachable(&mut self) {
        for r in 0..self.tables.qps.slots() {
            let Some(qp) = self.tables.qps.get(r).filter(|qp| qp.req.parked) else {
                continue;
            };
            let cut = qp
                .peer_dev
                .map_or(true, |d| self.net.wire.blocked(qp.dev, d).is_some());
            if cut {
                self.tables.qps.get_mut(r).expect("live QP").req.parked = false;
                self.arm(r, self.net.sched.now, TimerKind::Rnr);
            }
        }
    }
}
