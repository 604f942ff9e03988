//! The RC transport: requester (transmission, ACK timer, retries, RNR waits), responder
//! (in-order execution, duplicates, NAKs) and the event loop.
//!
//! One packet carries one whole message; its PSNs are `psn .. psn + npkts` where `npkts`
//! is the number of path-MTU segments (at least 1). The responder executes requests in PSN
//! order: the expected PSN executes and is answered (ACK, read or atomic response, RNR NAK,
//! or an error NAK); a PSN ahead of it is dropped (the requester's go-back-N recovers it); a
//! PSN behind it is a duplicate: sends and writes are re-acknowledged without executing,
//! reads execute again, atomics replay their cached result. Acknowledgements are
//! cumulative. The requester sends every queued request at once (reads and atomics limited
//! by `max_rd_atomic`), runs one timer per queue pair, and on a timeout goes back to the
//! oldest unacknowledged request, spending one of `retry_cnt`.

use crate::config::rnr_timer_ns;
use crate::exec::{msg_len, rd_atomic};
use crate::net::HEADER_BYTES;
use crate::state::{TimerKind, World};
use crate::trace::{DropReason, TraceKind};
use crate::types::*;
use crate::wire::{psn_diff, Packet, PacketKind, PSN_MASK};

/// PSN distances from here on (half the space) count as "behind": duplicates.
const HALF: u32 = 1 << 23;

fn mtu_bytes(m: Mtu) -> u64 {
    128 << (m as u8)
}

impl World {
    /// Transmits the send-queue entries of QP `q` not yet on the wire, in order. A request
    /// failing its local checks stops transmission; it completes with its error once it
    /// is the oldest (all before it completed).
    pub(crate) fn pump(&mut self, q: usize) {
        loop {
            let Some(qp) = self.qps.get(q) else { return };
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
            let qp = self.qps.get_mut(q).expect("live QP");
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
                Some(_) => self.send_pkt(pkt, wire),
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
        let Some(qp) = self.qps.get_mut(q) else {
            return;
        };
        (qp.req.sent, qp.req.rd_inflight) = (0, 0);
        if let Some(e) = qp.sq.front().filter(|e| e.sent_once) {
            qp.req.next_psn = e.psn;
        }
    }

    /// A response (ACK, NAK, read/atomic response) arrives at requester `q`.
    pub(crate) fn on_response(&mut self, q: usize, pkt: Packet) {
        let qp = self.qps.get(q).expect("live QP");
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
        let covers = |e: &crate::sq::SqEntry| psn_diff(pkt.psn, e.psn) < e.npkts;
        let i = qp.sq.iter().take(qp.req.sent).position(covers);
        let (Some(i), None) = (i, why) else {
            let why = why.unwrap_or(DropReason::Stale);
            return self.trace(dev, qpn, TraceKind::Drop(pkt.kind, why), psn, None);
        };
        // Everything before the PSN this answers is implicitly acknowledged.
        for _ in 0..i {
            self.complete_front(q, WcStatus::Success);
        }
        let alive = |w: &World| w.qps.get(q).is_some_and(|qp| qp.state == QpState::Rts);
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
        let qp = self.qps.get_mut(q).expect("live QP");
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
        let qp = self.qps.get_mut(q).expect("live QP");
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
        let park = self.cfg.instant_timers && infinite;
        qp.req.parked = park;
        let wait = if self.cfg.instant_timers {
            0
        } else {
            rnr_timer_ns(code)
        };
        self.trace(dev, qpn, TraceKind::RnrWait(wait), psn, id);
        match park {
            true => self.disarm(q),
            false => self.arm(q, self.now.saturating_add(wait), TimerKind::Rnr),
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
        let req = self.qps.get_mut(r).expect("live QP");
        if req.req.parked {
            req.req.parked = false;
            self.arm(r, self.now, TimerKind::Rnr);
        }
    }

    /// The requester connected to responder `p`: the queue pair `p`'s RTR attributes name,
    /// if its own RTR attributes name `p` back.
    pub(crate) fn requester_of(&self, p: usize) -> Option<usize> {
        let peer = self.qps.get(p)?;
        let (rtr, qpn) = (peer.rtr?, peer.qpn);
        let r = self.qp_index(rtr.dest_qp_num)?;
        let req = self.qps.get(r)?;
        req.rtr.is_some_and(|a| a.dest_qp_num == qpn).then_some(r)
    }

    /// Wakes every requester sleeping on RNR whose responder it can no longer reach (link
    /// down, partition, crash): on hardware its next retry would go unanswered.
    pub(crate) fn wake_unreachable(&mut self) {
        for r in 0..self.qps.slots() {
            let Some(qp) = self.qps.get(r).filter(|qp| qp.req.parked) else {
                continue;
            };
            let cut = qp
                .peer_dev
                .map_or(true, |d| self.blocked(qp.dev, d).is_some());
            if cut {
                self.qps.get_mut(r).expect("live QP").req.parked = false;
                self.arm(r, self.now, TimerKind::Rnr);
            }
        }
    }

    /// Sends a response from responder `p` back to the requester of `req`.
    fn respond(&mut self, req: &Packet, psn: u32, kind: PacketKind, bytes: u64) {
        let pkt = Packet {
            src_dev: req.dst_dev,
            dst_dev: req.src_dev,
            src_qpn: req.dst_qpn,
            dst_qpn: req.src_qpn,
            psn,
            npkts: 1,
            epoch: 0,
            kind,
        };
        self.trace(
            req.dst_dev as usize,
            req.dst_qpn,
            TraceKind::Send(kind),
            Some(psn),
            None,
        );
        self.send_pkt(pkt, bytes);
    }

    /// A request arrives at responder `p`.
    pub(crate) fn on_request(&mut self, p: usize, pkt: Packet) {
        let peer = self.qps.get(p).expect("live QP");
        let (dev, qpn, psn) = (peer.dev, peer.qpn, Some(pkt.psn));
        let from_peer = peer.rtr.is_some_and(|r| r.dest_qp_num == pkt.src_qpn)
            && peer.peer_dev == Some(pkt.src_dev as usize);
        let why = if !matches!(peer.state, QpState::Rtr | QpState::Rts) {
            Some(DropReason::NotReady)
        } else if !from_peer {
            Some(DropReason::WrongSource)
        } else {
            None
        };
        if let Some(why) = why {
            return self.trace(dev, qpn, TraceKind::Drop(pkt.kind, why), psn, None);
        }
        let diff = psn_diff(pkt.psn, peer.resp.epsn);
        let found = self
            .qp_index(pkt.src_qpn)
            .filter(|&r| self.qps.get(r).is_some_and(|r| r.epoch == pkt.epoch))
            .and_then(|r| {
                let sq = &self.qps.get(r)?.sq;
                let i = sq.iter().position(|e| e.sent_once && e.psn == pkt.psn)?;
                Some((r, i))
            });
        let last = pkt.psn.wrapping_add(pkt.npkts - 1) & PSN_MASK;
        if diff >= HALF {
            return self.duplicate(p, &pkt, found, last);
        }
        let Some((r, i)) = found.filter(|_| diff == 0) else {
            let why = if diff == 0 {
                DropReason::Stale
            } else {
                DropReason::OutOfOrder
            };
            return self.trace(dev, qpn, TraceKind::Drop(pkt.kind, why), psn, None);
        };
        let req = self.qps.get(r).expect("live QP");
        let e = req.sq.get(i).expect("queued entry");
        let (op, wr_id, len) = (e.wr.op, e.wr.wr_id, msg_len(&e.wr));
        let ex = self.execute(req, &e.wr, &e.inline, self.qps.get(p).expect("live QP"));
        self.trace(
            dev,
            qpn,
            TraceKind::Execute { dup: false },
            psn,
            Some(wr_id),
        );
        if ex.rnr {
            let timer = self
                .qps
                .get(p)
                .and_then(|q| q.rtr)
                .map_or(0, |r| r.min_rnr_timer);
            self.trace(dev, qpn, TraceKind::RnrNak(timer), psn, Some(wr_id));
            return self.respond(&pkt, pkt.psn, PacketKind::Rnr(timer), HEADER_BYTES);
        }
        if ex.status == WcStatus::Success {
            let resp = &mut self.qps.get_mut(p).expect("live QP").resp;
            resp.epsn = pkt.psn.wrapping_add(pkt.npkts) & PSN_MASK;
            if let Some(old) = ex.old {
                resp.remember(pkt.psn, old);
            }
        }
        if let Some(rd) = ex.recv {
            self.complete_recv(p, rd);
        }
        if ex.status != WcStatus::Success {
            // Every error the responder detects moves it to ERR too.
            self.set_err(p);
            return self.respond(&pkt, pkt.psn, PacketKind::Nak(ex.status), HEADER_BYTES);
        }
        let (kind, bytes) = match op {
            SendOp::Read { .. } => (
                PacketKind::ReadResp,
                len + u64::from(pkt.npkts) * HEADER_BYTES,
            ),
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                (PacketKind::AtomicResp, HEADER_BYTES + 8)
            }
            _ => (PacketKind::Ack, HEADER_BYTES),
        };
        self.respond(&pkt, last, kind, bytes);
    }

    /// A request behind the expected PSN: re-acknowledge, re-read, or replay an atomic.
    fn duplicate(&mut self, p: usize, pkt: &Packet, found: Option<(usize, usize)>, last: u32) {
        let peer = self.qps.get(p).expect("live QP");
        let (dev, qpn, psn) = (peer.dev, peer.qpn, Some(pkt.psn));
        let Some((r, i)) = found else {
            return self.respond(pkt, last, PacketKind::Ack, HEADER_BYTES);
        };
        let req = self.qps.get(r).expect("live QP");
        let e = req.sq.get(i).expect("queued entry");
        let (reply, bytes) = match e.wr.op {
            SendOp::Read { .. } => {
                let ex = self.execute(req, &e.wr, &e.inline, peer);
                let bytes = msg_len(&e.wr) + u64::from(pkt.npkts) * HEADER_BYTES;
                match ex.status {
                    WcStatus::Success => (PacketKind::ReadResp, bytes),
                    st => (PacketKind::Nak(st), HEADER_BYTES),
                }
            }
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                let Some(old) = peer.resp.recall(pkt.psn) else {
                    return self.trace(
                        dev,
                        qpn,
                        TraceKind::Drop(pkt.kind, DropReason::Stale),
                        psn,
                        None,
                    );
                };
                self.replay_atomic(req, e, old);
                (PacketKind::AtomicResp, HEADER_BYTES + 8)
            }
            _ => return self.respond(pkt, last, PacketKind::Ack, HEADER_BYTES),
        };
        let id = Some(e.wr.wr_id);
        self.trace(dev, qpn, TraceKind::Execute { dup: true }, psn, id);
        self.respond(pkt, last, reply, bytes);
    }
}
