//! The requester: the send queue's side of the RC transport. Transmission, the local ACK
//! timer, retries, RNR waits, and the responses that complete requests.
//!
//! One packet carries one whole message; its PSNs are `psn .. psn + npkts` where `npkts`
//! is the number of path-MTU segments (at least 1). The requester sends every queued
//! request at once (reads and atomics limited by `max_rd_atomic`), each once it passes its
//! local checks ([`QpObj::local_check`]); acknowledgements are cumulative. It runs one
//! timer per queue pair, and on a timeout goes back to the oldest unacknowledged request,
//! spending one of `retry_cnt`.
//!
//! The timer (the local ACK timeout or an RNR wait) is kept in the event queue's indexed
//! timer heap. Arming moves it, disarming removes it: a cancelled timer leaves no event
//! behind, so `run_until_idle` ends as soon as no work remains and simulated time never
//! jumps to a deadline that no longer matters.
//!
//! The engine is the queue pair's own ([`QpObj::transmit`], its timer, its RNR waits):
//! it takes the queue pair, the MR table its local checks read and the [`Net`] it sends,
//! arms and traces through. Completing a request is the CQ block's (`cq.rs`); the
//! `World` entry points here route between the two (a response, a timer, a wake-up).

use super::mem::Spans;
use super::net::Net;
use super::qp::{rd_atomic, QpObj, SendHead, SqEntry, TimerKind};
use super::tables::{MrObj, Slab, Tables};
use super::World;
use crate::config::{ack_timeout_ns, rnr_timer_ns, Personality};
use crate::trace::TraceKind;
use crate::types::*;
use crate::wire::{psn_diff, DropReason, Packet, PacketKind, HEADER_BYTES, PSN_MASK};

fn mtu_bytes(m: Mtu) -> u64 {
    128 << (m as u8)
}

/// The requester's checks of `wr` that need no memory lookup:
/// the message length, and whether the QP may issue reads/atomics. Together with the
/// local half of the responder's `execute` they make [`QpObj::local_check`].
#[inline]
pub(crate) fn local_limits(qp: &QpObj, wr: &SendHead) -> Result<(), WcStatus> {
    let atomic = matches!(wr.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. });
    if wr.total > MAX_MSG || (atomic && wr.total != 8) {
        return Err(WcStatus::LocLenErr);
    }
    if rd_atomic(&wr.op) && qp.rts.is_some_and(|r| r.max_rd_atomic == 0) {
        return Err(WcStatus::LocQpOpErr);
    }
    Ok(())
}

/// The status of the oldest request `front` when its response arrives with an opcode the
/// requester does not expect (`Fabric::corrupt_next_response`).
///
/// The IB spec's answer, and mlx5's (syndrome `BAD_RESP_ERR` in `mlx5_handle_error_cqe`),
/// is `BadRespErr`. rxe's completer checks the response opcode against the request
/// (`check_ack` in `drivers/infiniband/sw/rxe/rxe_comp.c`): an RDMA READ response to a
/// request that is not a read fails it with `FatalErr`, so with the rxe personality the
/// corrupted response is a read response and a send, write or atomic completes with
/// `FatalErr`. A read has no error status there (a wrong response can even complete it),
/// so it keeps the spec's `BadRespErr`.
fn bad_response_status(front: Option<&SqEntry>, personality: Personality) -> WcStatus {
    let read = front.is_some_and(|e| matches!(e.wr.op, SendOp::Read { .. }));
    match personality {
        Personality::Rxe if !read => WcStatus::FatalErr,
        _ => WcStatus::BadRespErr,
    }
}

/// What an expired timer asks of its requester.
enum Expiry {
    /// Nothing (stale, or waiting on).
    Nothing,
    /// Go back to the oldest unacknowledged request and send again.
    Resend,
    /// Give up: the oldest request fails with this status.
    Fail(WcStatus),
}

impl QpObj {
    /// The requester's checks before `wr` goes on the wire: lengths, local keys and bounds
    /// in the MR table `mrs`, and whether the QP may issue reads/atomics (`max_rd_atomic`
    /// > 0, else `LocQpOpErr`).
    pub(crate) fn local_check(
        &self,
        mrs: &Slab<MrObj>,
        personality: Personality,
        wr: &SendHead,
        sges: &[Sge],
    ) -> Result<(), WcStatus> {
        use SendOp::*;
        let total = wr.total;
        local_limits(self, wr)?;
        let local_ok = match wr.op {
            Read { .. } | CompareSwap { .. } | FetchAdd { .. } => {
                mrs.scatter(self.pd(), sges, total as usize, &mut Spans::new())
            }
            _ if wr.flags.contains(SendFlags::INLINE) => true,
            _ => mrs.gather(self.pd(), sges, &mut Spans::new()),
        };
        if !local_ok {
            let writes = matches!(wr.op, Read { .. } | CompareSwap { .. } | FetchAdd { .. });
            let unusable_key = |s: &Sge| {
                s.length > 0
                    && !matches!(mrs.lookup(s.lkey, false, self.pd()),
                        Some(m) if !writes || m.access.contains(AccessFlags::LOCAL_WRITE))
            };
            let inline = wr.flags.contains(SendFlags::INLINE);
            if personality == Personality::Rxe && !inline && sges.iter().any(unusable_key) {
                return Err(WcStatus::LocQpOpErr); // rxe: copy_data's -EINVAL
            }
            return Err(WcStatus::LocProtErr);
        }
        Ok(())
    }

    /// Transmits the send-queue entries not yet on the wire, in order. A request failing
    /// its local checks stops transmission; once it is the oldest (all before it
    /// completed) its status is returned: the caller completes it with that error.
    #[inline]
    pub(crate) fn transmit(&mut self, mrs: &Slab<MrObj>, net: &mut Net) -> Result<(), WcStatus> {
        // Nothing unsent (as after the direct path): no call.
        if self.req.sent as usize >= self.sq.len() {
            return Ok(());
        }
        self.transmit_unsent(mrs, net)
    }

    /// [`QpObj::transmit`] with requests to send.
    fn transmit_unsent(&mut self, mrs: &Slab<MrObj>, net: &mut Net) -> Result<(), WcStatus> {
        loop {
            if self.state != QpState::ReadyToSend || self.req.rnr_wait {
                return Ok(());
            }
            let i = self.req.sent as usize;
            let Some(e) = self.sq.get(i) else {
                return Ok(());
            };
            let sges = self.sq.gathers(i);
            if let Err(status) = self.local_check(mrs, net.cfg.personality, &e.wr, sges) {
                return if i == 0 { Err(status) } else { Ok(()) };
            }
            let (Some(rtr), Some(rts)) = (self.rtr, self.rts) else {
                return Ok(());
            };
            let rd = rd_atomic(&e.wr.op);
            if rd && self.req.rd_inflight >= rts.max_rd_atomic {
                return Ok(());
            }
            let len = e.wr.msg_len();
            let npkts = len.div_ceil(mtu_bytes(rtr.path_mtu)).max(1) as u32;
            let wire = match e.wr.op {
                SendOp::Read { .. } => HEADER_BYTES + 16,
                SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => HEADER_BYTES + 28,
                _ => len + u64::from(npkts) * HEADER_BYTES,
            };
            let (retx, wr_id) = (e.sent_once(), e.wr.wr_id);
            let psn = self.req.next_psn;
            let e = self.sq.get_mut(i).expect("queued entry");
            (e.psn, e.npkts) = (psn, npkts);
            self.req.next_psn = psn.wrapping_add(npkts) & PSN_MASK;
            self.req.sent += 1;
            self.req.rd_inflight += u8::from(rd);
            let (dev, qpn, armed) = (self.dev(), self.qpn, self.req.timer.is_some());
            let pkt = Packet {
                src_dev: dev as u32,
                dst_dev: self.peer_dev().map_or(0, |d| d as u32),
                src_qpn: qpn,
                dst_qpn: rtr.dest_qp_num,
                psn,
                npkts,
                epoch: self.epoch,
                kind: PacketKind::Request,
                dgram: 0,
            };
            let what = if retx {
                TraceKind::Retransmit
            } else {
                TraceKind::Send(PacketKind::Request)
            };
            net.trace(dev, qpn, what, Some(psn), Some(wr_id));
            match self.peer_dev() {
                Some(_) => {
                    net.send(pkt, wire);
                }
                None => {
                    let why = TraceKind::Drop(PacketKind::Request, DropReason::NoRoute);
                    net.trace(dev, qpn, why, Some(psn), Some(wr_id));
                }
            }
            if !armed {
                self.arm_ack(net);
            }
        }
    }

    /// Go-back-N: everything outstanding will be sent again, from the oldest.
    pub(crate) fn go_back(&mut self) {
        (self.req.sent, self.req.rd_inflight) = (0, 0);
        if let Some(e) = self.sq.front().filter(|e| e.sent_once()) {
            self.req.next_psn = e.psn;
        }
    }

    /// (Re)starts the local ACK timer (none with timeout code 0).
    pub(crate) fn arm_ack(&mut self, net: &mut Net) {
        let code = self.rts.map_or(0, |r| r.timeout);
        match ack_timeout_ns(code) {
            Some(ns) => {
                let after = if net.cfg.instant_timers { 0 } else { ns };
                let at = net.now().saturating_add(after);
                self.arm(net, at, TimerKind::Ack);
            }
            None => self.disarm(net),
        }
    }

    /// Sets the timer to fire at `at`, replacing any other.
    #[inline]
    pub(crate) fn arm(&mut self, net: &mut Net, at: u64, kind: TimerKind) {
        self.req.timer = Some((at, kind));
        net.sched.events.set_timer(self.slot(), at);
    }

    /// Stops the timer.
    #[inline]
    pub(crate) fn disarm(&mut self, net: &mut Net) {
        self.req.timer = None;
        net.sched.events.cancel_timer(self.slot());
    }

    /// Which request on the wire response `pkt` answers (its index from the oldest), or
    /// why the response is dropped.
    fn answered(&self, pkt: &Packet) -> Result<usize, DropReason> {
        let from_peer =
            self.rtr.is_some_and(|r| r.dest_qp_num == pkt.src_qpn) && self.leads_to(pkt.src_dev);
        if self.state != QpState::ReadyToSend {
            return Err(DropReason::NotReady);
        }
        if !from_peer {
            return Err(DropReason::WrongSource);
        }
        if self.req.rnr_wait && matches!(pkt.kind, PacketKind::Rnr(_)) {
            // A second RNR NAK for the request already being waited out (a duplicate).
            return Err(DropReason::Stale);
        }
        let covers = |e: &SqEntry| psn_diff(pkt.psn, e.psn) < e.npkts;
        let i = self.sq.iter().take(self.req.sent as usize).position(covers);
        i.ok_or(DropReason::Stale)
    }

    /// The oldest request met an empty receive queue: wait and retry, or give up
    /// (`RnrRetryExcErr`, for the caller to complete it with).
    fn on_rnr(&mut self, code: u8, net: &mut Net) -> Result<(), WcStatus> {
        let infinite = self.rts.is_some_and(|r| r.rnr_retry == 7);
        if !infinite {
            if self.req.rnr_left == 0 {
                return Err(WcStatus::RnrRetryExcErr);
            }
            self.req.rnr_left -= 1;
        }
        self.req.rnr_wait = true;
        let head = self.sq.front().map(|e| (e.psn, e.wr.wr_id));
        let (psn, id) = (head.map(|h| h.0), head.map(|h| h.1));
        let park = net.cfg.instant_timers && infinite;
        self.req.parked = park;
        let wait = if net.cfg.instant_timers {
            0
        } else {
            rnr_timer_ns(code)
        };
        net.trace(self.dev(), self.qpn, TraceKind::RnrWait(wait), psn, id);
        match park {
            true => self.disarm(net),
            false => {
                let at = net.now().saturating_add(wait);
                self.arm(net, at, TimerKind::Rnr);
            }
        }
        Ok(())
    }

    /// The timer fires; `not_ready` when the responder is on its way to RTR (instant
    /// timers: see `World::responder_not_ready`).
    fn expire(&mut self, not_ready: bool, net: &mut Net) -> Expiry {
        let Some((_, kind)) = self.req.timer.take() else {
            return Expiry::Nothing;
        };
        if self.state != QpState::ReadyToSend {
            return Expiry::Nothing;
        }
        let (dev, qpn) = (self.dev(), self.qpn);
        match kind {
            TimerKind::Ack => {
                let Some(head) = self.sq.front().filter(|_| self.req.sent > 0) else {
                    return Expiry::Nothing;
                };
                let (psn, id) = (Some(head.psn), Some(head.wr.wr_id));
                if not_ready && !self.req.not_ready && self.req.retries > 0 {
                    // Hardware would retry into silence for `retries` more timeouts while
                    // the peer finishes connecting: wait that long, or until it is ready.
                    let code = self.rts.map_or(0, |r| r.timeout);
                    let budget = ack_timeout_ns(code)
                        .map(|ns| ns.saturating_mul(u64::from(self.req.retries)));
                    (self.req.not_ready, self.req.retries) = (true, 0);
                    net.trace(dev, qpn, TraceKind::Timeout, psn, id);
                    if let Some(budget) = budget {
                        let at = net.now().saturating_add(budget);
                        self.arm(net, at, TimerKind::Ack);
                    }
                    return Expiry::Nothing;
                }
                self.req.not_ready = false;
                let exhausted = self.req.retries == 0;
                self.req.retries = self.req.retries.saturating_sub(1);
                net.trace(dev, qpn, TraceKind::Timeout, psn, id);
                if exhausted {
                    return Expiry::Fail(WcStatus::RetryExcErr);
                }
            }
            TimerKind::Rnr => self.req.rnr_wait = false,
        }
        Expiry::Resend
    }
}

impl World {
    /// Transmits what QP `q` has not yet sent (see [`QpObj::transmit`]); the oldest
    /// request fails if its local checks do.
    #[inline]
    pub(crate) fn pump(&mut self, q: usize) {
        let Tables { qps, mrs, .. } = &mut self.tables;
        let Some(qp) = qps.get_mut(q) else {
            return;
        };
        if let Err(status) = qp.transmit(mrs, &mut self.net) {
            self.fail_front(q, status);
        }
    }

    /// A response (ACK, NAK, read/atomic response) arrives at requester `q`.
    pub(crate) fn on_response(&mut self, q: usize, pkt: Packet) {
        let Some(qp) = self.tables.qps.get(q) else {
            return;
        };
        let i = match qp.answered(&pkt) {
            Ok(i) => i,
            Err(why) => {
                let (dev, qpn, kind) = (qp.dev(), qp.qpn, TraceKind::Drop(pkt.kind, why));
                return self.net.trace(dev, qpn, kind, Some(pkt.psn), None);
            }
        };
        // Everything before the PSN this answers is implicitly acknowledged. Each
        // completion may overflow a CQ and so move `q` to ERR.
        for _ in 0..i {
            self.complete_front(q, WcStatus::Success);
        }
        let alive = |w: &World| {
            w.tables
                .qps
                .get(q)
                .is_some_and(|qp| qp.state == QpState::ReadyToSend)
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
                let front = self.tables.qps.get(q).and_then(|qp| qp.sq.front());
                let status = bad_response_status(front, self.net.cfg.personality);
                return self.fail_front(q, status);
            }
            PacketKind::Rnr(_) => {}
            // Taken by the UD block before any queue pair sees it (`World::deliver`).
            PacketKind::Datagram => return,
        }
        let Tables { qps, mrs, .. } = &mut self.tables;
        let net = &mut self.net;
        let Some(qp) = qps.get_mut(q).filter(|qp| qp.state == QpState::ReadyToSend) else {
            return;
        };
        // Forward progress (unless an RNR NAK answered the oldest request itself).
        let rts = qp.rts.expect("RTS attributes");
        if i > 0 || !matches!(pkt.kind, PacketKind::Rnr(_)) {
            (qp.req.retries, qp.req.rnr_left) = (rts.retry_cnt, rts.rnr_retry);
        }
        let res = match pkt.kind {
            PacketKind::Rnr(code) => qp.on_rnr(code, net),
            _ => {
                if qp.req.sent > 0 {
                    qp.arm_ack(net);
                } else {
                    qp.disarm(net);
                }
                qp.transmit(mrs, net)
            }
        };
        if let Err(status) = res {
            self.fail_front(q, status);
        }
    }

    /// The timer of QP `q` fires.
    pub(crate) fn on_timer(&mut self, q: usize) {
        let not_ready = self.net.cfg.instant_timers && self.responder_not_ready(q);
        let Tables { qps, mrs, .. } = &mut self.tables;
        let net = &mut self.net;
        let Some(qp) = qps.get_mut(q) else {
            return;
        };
        let res = match qp.expire(not_ready, net) {
            Expiry::Nothing => Ok(()),
            Expiry::Fail(status) => Err(status),
            Expiry::Resend => {
                qp.go_back();
                qp.transmit(mrs, net)
            }
        };
        if let Err(status) = res {
            self.fail_front(q, status);
        }
    }

    /// Whether requester `q` talks to a live, reachable responder that is not yet in RTR
    /// but on its way (INIT: prepared, its endpoint handed out, not yet connected): a
    /// connection whose other side has not finished connecting. A responder in RESET is
    /// gone, not coming: the requester's retries run out at once, as before.
    fn responder_not_ready(&self, q: usize) -> bool {
        let Some(qp) = self.tables.qps.get(q) else {
            return false;
        };
        let (Some(rtr), Some(dev)) = (qp.rtr, qp.peer_dev()) else {
            return false;
        };
        if self.net.wire.blocked(qp.dev(), dev).is_some() {
            return false;
        }
        self.tables
            .qp_by_num(rtr.dest_qp_num)
            .is_some_and(|(_, r)| !r.dead && r.dev() == dev && r.state == QpState::Init)
    }

    /// Responder `p` reached RTR: wakes the requester its RTR attributes name if it waits
    /// for `p` to become ready; it retransmits at once.
    pub(crate) fn wake_not_ready(&mut self, p: usize) {
        let net = &mut self.net;
        let Some(req) = self.tables.requester_mut(p) else {
            return;
        };
        if req.req.not_ready {
            req.req.not_ready = false;
            req.req.retries = req.rts.map_or(0, |a| a.retry_cnt).saturating_add(1);
            let now = net.now();
            req.arm(net, now, TimerKind::Ack);
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
        let net = &mut self.net;
        let Some(req) = self.tables.requester_mut(p) else {
            return;
        };
        if req.req.parked {
            req.req.parked = false;
            let now = net.now();
            req.arm(net, now, TimerKind::Rnr);
        }
    }

    /// Wakes every requester sleeping on RNR whose responder it can no longer reach (link
    /// down, partition, crash): on hardware its next retry would go unanswered.
    pub(crate) fn wake_unreachable(&mut self) {
        let net = &mut self.net;
        for r in 0..self.tables.qps.slots() {
            let Some(qp) = self.tables.qps.get_mut(r).filter(|qp| qp.req.parked) else {
                continue;
            };
            let cut = qp
                .peer_dev()
                .map_or(true, |d| net.wire.blocked(qp.dev(), d).is_some());
            if cut {
                qp.req.parked = false;
                let now = net.now();
                qp.arm(net, now, TimerKind::Rnr);
            }
        }
    }
}
