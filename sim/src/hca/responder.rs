//! The responder: the receive side of the RC transport. In-order execution, duplicates,
//! NAKs, and the checks and effects of executing a request.
//!
//! The responder executes requests in PSN order: the expected PSN executes and is answered
//! (ACK, read or atomic response, RNR NAK, or an error NAK); a PSN ahead of it is dropped
//! (the requester's go-back-N recovers it); a PSN behind it is a duplicate: sends and
//! writes are re-acknowledged without executing, reads execute again, atomics replay their
//! cached result.
//!
//! A request is handled in two halves. [`answer`] reads: it judges the request against the
//! responder's state and executes it ([`execute`]), which moves bytes but changes no queue
//! pair. [`World::on_request`] then applies what the answer says to the responder (its
//! expected PSN, atomic cache, consumed receive, or its move to ERR) and sends the
//! response. Work is checked completely before any byte moves, so a failing work request
//! changes no memory.
//!
//! In-process shortcut: a request carries no payload; the responder reads it from the
//! requester's send queue entry. A read or atomic copies its result straight into the
//! requester's scatter list when it executes at the responder; the requester's completion
//! still waits for the response packet (and a lost response makes the read execute again).

use super::mem::{self, Spans, Src};
use super::net::Net;
use super::qp::{rd_atomic, sg_len, QpObj, SendHead};
use super::rq::RqRead;
use super::tables::{MrObj, Slab, Tables};
use super::World;
use crate::config::{FabricConfig, Personality};
use crate::trace::TraceKind;
use crate::types::*;
use crate::wire::{psn_diff, DropReason, Packet, PacketKind, HEADER_BYTES, PSN_MASK};

/// PSN distances from here on (half the space) count as "behind": duplicates.
const HALF: u32 = 1 << 23;

/// The receive completion a transfer generates at the responder.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvDone {
    pub(crate) wr_id: u64,
    pub(crate) status: WcStatus,
    pub(crate) opcode: WcOpcode,
    pub(crate) byte_len: u32,
    pub(crate) imm: Option<u32>,
    /// The request asked for a solicited event (`SendFlags::SOLICITED`).
    pub(crate) solicited: bool,
}
/// What executing a request at the responder did (its bytes have already moved).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Exec {
    /// Requester's completion status (`Success` or a remote error).
    pub(crate) status: WcStatus,
    /// Receive WR consumed at the responder (always the head of its RQ).
    pub(crate) recv: Option<RecvDone>,
    /// The responder's RQ is empty: answer with an RNR NAK.
    pub(crate) rnr: bool,
    /// Old value of an executed atomic.
    pub(crate) old: Option<u64>,
}

/// What the responder makes of a request, before anything but memory changes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Answer {
    /// Lost: not for this queue pair now, ahead of the expected PSN, or about work that
    /// no longer exists.
    Drop(DropReason),
    /// A duplicate, answered without executing anew: `kind` at `psn` with `bytes` on the
    /// wire. `executed` names the work request of a read executed again or an atomic
    /// replayed.
    Again {
        executed: Option<u64>,
        psn: u32,
        kind: PacketKind,
        bytes: u64,
    },
    /// The expected request, executed: work request `wr_id`, its operation and message
    /// length, and the outcome.
    Executed {
        wr_id: u64,
        op: SendOp,
        len: u64,
        ex: Exec,
    },
}

/// What responder `peer` makes of request `pkt`, the request itself read from its
/// requester's send queue in the tables `t`. Executing it moves its bytes (see
/// [`execute`]); no queue pair changes.
pub(crate) fn answer(t: &Tables, cfg: &FabricConfig, peer: &QpObj, pkt: &Packet) -> Answer {
    let from_peer =
        peer.rtr.is_some_and(|r| r.dest_qp_num == pkt.src_qpn) && peer.leads_to(pkt.src_dev);
    if !matches!(peer.state, QpState::ReadyToReceive | QpState::ReadyToSend) {
        return Answer::Drop(DropReason::NotReady);
    }
    if !from_peer {
        return Answer::Drop(DropReason::WrongSource);
    }
    let diff = psn_diff(pkt.psn, peer.resp.epsn);
    // The request: its requester's entry of that PSN, if that incarnation still has it.
    let found = t
        .qp_by_num(pkt.src_qpn)
        .map(|(_, r)| r)
        .filter(|r| r.epoch == pkt.epoch)
        .and_then(|r| {
            let i =
                r.sq.iter()
                    .position(|e| e.sent_once() && e.psn == pkt.psn)?;
            Some((r, r.sq.get(i)?, r.sq.gathers(i), r.sq.inline(i)))
        });
    let last = pkt.psn.wrapping_add(pkt.npkts - 1) & PSN_MASK;
    let ack = Answer::Again {
        executed: None,
        psn: last,
        kind: PacketKind::Ack,
        bytes: HEADER_BYTES,
    };
    if diff >= HALF {
        // Behind the expected PSN: re-acknowledge, re-read, or replay an atomic.
        let Some((req, e, sges, inline)) = found else {
            return ack;
        };
        let (kind, bytes) = match e.wr.op {
            SendOp::Read { .. } => {
                let ex = execute(&t.mrs, cfg, req, &e.wr, sges, inline, peer, &mut None);
                let bytes = e.wr.msg_len() + u64::from(pkt.npkts) * HEADER_BYTES;
                match ex.status {
                    WcStatus::Success => (PacketKind::ReadResp, bytes),
                    st => (PacketKind::Nak(st), HEADER_BYTES),
                }
            }
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                let Some(old) = peer.resp.recall(pkt.psn) else {
                    return Answer::Drop(DropReason::Stale);
                };
                replay_atomic(&t.mrs, req, sges, old);
                (PacketKind::AtomicResp, HEADER_BYTES + 8)
            }
            _ => return ack,
        };
        let executed = Some(e.wr.wr_id);
        return Answer::Again {
            executed,
            psn: last,
            kind,
            bytes,
        };
    }
    let Some((req, e, sges, inline)) = found.filter(|_| diff == 0) else {
        return Answer::Drop(match diff {
            0 => DropReason::Stale,
            _ => DropReason::OutOfOrder,
        });
    };
    Answer::Executed {
        wr_id: e.wr.wr_id,
        op: e.wr.op,
        len: e.wr.msg_len(),
        ex: execute(&t.mrs, cfg, req, &e.wr, sges, inline, peer, &mut None),
    }
}

/// Sends a response from the responder of request `req` back to its requester.
fn respond(net: &mut Net, req: &Packet, psn: u32, kind: PacketKind, bytes: u64) {
    let pkt = Packet {
        src_dev: req.dst_dev,
        dst_dev: req.src_dev,
        src_qpn: req.dst_qpn,
        dst_qpn: req.src_qpn,
        psn,
        npkts: 1,
        epoch: 0,
        kind,
        dgram: 0,
    };
    let (dev, qpn) = (req.dst_dev as usize, req.dst_qpn);
    net.trace(dev, qpn, TraceKind::Send(kind), Some(psn), None);
    let _copies = net.send(pkt, bytes);
}

/// Executes request `wr` (with its gather list `sges` and INLINE payload `inline`) of
/// requester `qp` at responder `peer`, resolving keys in the MR table `mrs`: checks, then
/// effects. Nothing but the memory it writes on success changes, so a failed or RNR
/// outcome can be recomputed later with the same result. A request that consumes a
/// receive leaves `peer`'s receive queue held in `rq` (locked if shared), so that the
/// caller may retire the receive under the same hold (`direct.rs`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn execute<'p>(
    mrs: &Slab<MrObj>,
    cfg: &FabricConfig,
    qp: &QpObj,
    wr: &SendHead,
    sges: &[Sge],
    inline: &[u8],
    peer: &'p QpObj,
    rq: &mut Option<RqRead<'p>>,
) -> Exec {
    use SendOp::*;
    let total = wr.total;
    let len = total as usize;
    let mut out = Exec {
        status: WcStatus::Success,
        recv: None,
        rnr: false,
        old: None,
    };
    let fail = |out: Exec, status| Exec { status, ..out };
    // The requester's side again (an MR may have gone since the local check: the
    // request is then answered as a remote operation error).
    let mut src = Spans::new();
    let mut dst = Spans::new();
    let local_ok = match wr.op {
        Read { .. } | CompareSwap { .. } | FetchAdd { .. } => {
            mrs.scatter(qp.pd(), sges, len, &mut dst)
        }
        _ if wr.flags.contains(SendFlags::INLINE) => src.push(Src::slice(&inline[..len])).is_ok(),
        _ => mrs.gather(qp.pd(), sges, &mut src),
    };
    if !local_ok {
        return fail(out, WcStatus::RemOpErr);
    }

    // Responder checks, in rxe's order: opcode vs QP access, resources (RQ, read/
    // atomic credits), then rkey and receive buffers.
    let need = match wr.op {
        Send | SendWithImm(_) => AccessFlags::empty(),
        // An RC queue pair never posts one (`QpObj::post_send`); were it to arrive, it is
        // an opcode the responder does not serve.
        Datagram { .. } => return fail(out, WcStatus::RemInvReqErr),
        Write { .. } | WriteWithImm { .. } => AccessFlags::REMOTE_WRITE,
        Read { .. } => AccessFlags::REMOTE_READ,
        CompareSwap { .. } | FetchAdd { .. } => AccessFlags::REMOTE_ATOMIC,
    };
    let (access, max_rd) = match peer.rtr {
        Some(r) => (peer.access, r.max_dest_rd_atomic),
        None => (AccessFlags::empty(), 0),
    };
    if !access.contains(need) || (rd_atomic(&wr.op) && max_rd == 0) {
        return fail(out, WcStatus::RemInvReqErr);
    }
    // Held to the end (and after, in `rq`) by a request that consumes a receive: a shared
    // receive queue stays locked while its head is written (and is not locked by the
    // others).
    let held = wr.op.consumes_receive().then(|| rq.insert(peer.rq.read()));
    let rwr = match held {
        Some(rq) => match rq.front_for_request() {
            Some(r) => Some(r),
            None => return Exec { rnr: true, ..out },
        },
        None => None,
    };
    // The region `rkey` names, if it grants `need`; the span's bounds are the caller's
    // to check (`Region::src`, `Region::dst`).
    let remote = |rkey: u32| {
        mrs.lookup(rkey, true, peer.pd())
            .filter(|m| m.access.contains(need))
            .map(|m| &m.region)
    };
    // A remote atomic: the word's read-modify-write, its old value scattered to `dst`.
    let atomic = |out: Exec, remote_addr: u64, rkey: u32, rmw: mem::Rmw| {
        if remote_addr % 8 != 0 {
            return fail(out, WcStatus::RemInvReqErr);
        }
        let Some(word) = remote(rkey).and_then(|r| r.dst(remote_addr, 8)) else {
            return fail(out, WcStatus::RemAccessErr);
        };
        let old = mem::atomic(&word, rmw);
        mem::copy(&[Src::slice(&old.to_ne_bytes())], &dst, 8);
        Exec {
            old: Some(old),
            ..out
        }
    };

    // Effects (everything is checked before a byte moves), responder completion.
    match (wr.op, rwr) {
        (Send | SendWithImm(_), Some(rwr)) => {
            let imm = match wr.op {
                SendWithImm(imm) => Some(imm),
                _ => None,
            };
            let mut done = RecvDone {
                wr_id: rwr.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                byte_len: len as u32,
                imm,
                solicited: wr.flags.contains(SendFlags::SOLICITED),
            };
            let rsges = rwr.sges;
            if sg_len(rsges) < total {
                let (recv, req) = match cfg.personality {
                    Personality::Hca => (WcStatus::LocLenErr, WcStatus::RemInvReqErr),
                    Personality::Rxe => (WcStatus::LocQpOpErr, WcStatus::RemOpErr),
                };
                done.status = recv;
                out.recv = Some(done);
                return fail(out, req);
            }
            if !mrs.scatter(peer.recv_pd(), rsges, len, &mut dst) {
                done.status = WcStatus::LocProtErr;
                out.recv = Some(done);
                return fail(out, WcStatus::RemOpErr);
            }
            mem::copy(&src, &dst, len);
            out.recv = Some(done);
        }
        (
            Write { remote_addr, rkey }
            | WriteWithImm {
                remote_addr, rkey, ..
            },
            rwr,
        ) => {
            let mut done = rwr.map(|rwr| RecvDone {
                wr_id: rwr.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: len as u32,
                imm: match wr.op {
                    WriteWithImm { imm, .. } => Some(imm),
                    _ => None,
                },
                solicited: wr.flags.contains(SendFlags::SOLICITED),
            });
            if len > 0 {
                let target = remote(rkey);
                let Some(d) = target.and_then(|r| r.dst(remote_addr, len)) else {
                    // IB: the receive of a failed WRITE_WITH_IMM completes with a
                    // local access error (when so configured; else it is flushed).
                    // rxe completes it with REM_ACCESS_ERR.
                    let (consumed, status) = match cfg.personality {
                        Personality::Hca => (cfg.loc_access_err, WcStatus::LocAccessErr),
                        Personality::Rxe => (true, WcStatus::RemAccessErr),
                    };
                    done = done.filter(|_| consumed).map(|d| RecvDone {
                        status,
                        byte_len: 0,
                        imm: None,
                        ..d
                    });
                    return Exec {
                        recv: done,
                        ..fail(out, WcStatus::RemAccessErr)
                    };
                };
                mem::copy(&src, &[d], len);
            }
            out.recv = done;
        }
        (Read { remote_addr, rkey }, _) => {
            if len > 0 {
                let Some(s) = remote(rkey) else {
                    return fail(out, WcStatus::RemAccessErr);
                };
                let Some(s) = s.src(remote_addr, len) else {
                    return fail(out, WcStatus::RemAccessErr);
                };
                mem::copy(&[s], &dst, len);
            }
        }
        (
            CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            },
            _,
        ) => return atomic(out, remote_addr, rkey, mem::Rmw::Cas { compare, swap }),
        (
            FetchAdd {
                remote_addr,
                rkey,
                add,
            },
            _,
        ) => return atomic(out, remote_addr, rkey, mem::Rmw::Add(add)),
        (Send | SendWithImm(_), None) => unreachable!("sends take a receive"),
        (Datagram { .. }, _) => unreachable!("refused above"),
    }
    out
}

/// Replays an atomic's cached `old` value into the requester's 8-byte scatter list `sges`
/// (a duplicate atomic is never applied twice).
fn replay_atomic(mrs: &Slab<MrObj>, qp: &QpObj, sges: &[Sge], old: u64) {
    let mut dst = Spans::new();
    if mrs.scatter(qp.pd(), sges, 8, &mut dst) {
        mem::copy(&[Src::slice(&old.to_ne_bytes())], &dst, 8);
    }
}

impl World {
    /// A request arrives at queue pair `q`: the first while it is in RTR raises
    /// `COMM_EST` (communication established before the RTU, which a connection manager
    /// may wait for). The rxe personality raises none, as rxe of Linux 6.1.
    pub(crate) fn comm_est(&mut self, q: usize) {
        let Some(qp) = self.tables.qps.get_mut(q) else {
            return;
        };
        if qp.state != QpState::ReadyToReceive || qp.resp.established {
            return;
        }
        qp.resp.established = true;
        if self.net.cfg.personality == Personality::Rxe {
            return;
        }
        let (dev, qpn) = (qp.dev(), qp.qpn);
        let kind = AsyncEventKind::CommEst;
        self.tables.async_events.raise_qp(dev, qpn, kind);
    }

    /// Responder `p` detected an error no receive of its own can carry (the request
    /// consumes none: an RDMA write without immediate data, a read, an atomic), so its
    /// owner learns of it from an affiliated asynchronous error (IBA C9-222.1.1):
    /// `QP_ACCESS_ERR` for a remote access error, `QP_REQ_ERR` for an invalid request,
    /// `QP_FATAL` for a remote operational error. rxe (Linux 6.1) raises none.
    fn affiliated_error(&mut self, p: usize, status: WcStatus) {
        let kind = match status {
            WcStatus::RemAccessErr => AsyncEventKind::QpAccessErr,
            WcStatus::RemInvReqErr => AsyncEventKind::QpReqErr,
            _ => AsyncEventKind::QpFatal,
        };
        let Some(qp) = self.tables.qps.get(p) else {
            return;
        };
        if self.net.cfg.personality == Personality::Rxe {
            return;
        }
        let (dev, qpn) = (qp.dev(), qp.qpn);
        self.tables.async_events.raise_qp(dev, qpn, kind);
    }

    /// A request arrives at responder `p`.
    pub(crate) fn on_request(&mut self, p: usize, pkt: Packet) {
        self.comm_est(p);
        let Some(peer) = self.tables.qps.get(p) else {
            return;
        };
        let (dev, qpn, psn) = (peer.dev(), peer.qpn, Some(pkt.psn));
        let net = &mut self.net;
        let (wr_id, op, len, ex) = match answer(&self.tables, &net.cfg, peer, &pkt) {
            Answer::Drop(why) => {
                return net.trace(dev, qpn, TraceKind::Drop(pkt.kind, why), psn, None);
            }
            Answer::Again {
                executed,
                psn: at,
                kind,
                bytes,
            } => {
                if let Some(id) = executed {
                    net.trace(dev, qpn, TraceKind::Execute { dup: true }, psn, Some(id));
                }
                return respond(net, &pkt, at, kind, bytes);
            }
            Answer::Executed { wr_id, op, len, ex } => (wr_id, op, len, ex),
        };
        let what = TraceKind::Execute { dup: false };
        net.trace(dev, qpn, what, psn, Some(wr_id));
        // The responder again, to change it: the answer read the whole table (the
        // requester may be this very queue pair).
        let peer = self.tables.qps.get_mut(p).expect("live QP");
        if ex.rnr {
            let timer = peer.rtr.map_or(0, |r| r.min_rnr_timer);
            net.trace(dev, qpn, TraceKind::RnrNak(timer), psn, Some(wr_id));
            return respond(net, &pkt, pkt.psn, PacketKind::Rnr(timer), HEADER_BYTES);
        }
        if ex.status == WcStatus::Success {
            peer.resp.epsn = pkt.psn.wrapping_add(pkt.npkts) & PSN_MASK;
            if let Some(old) = ex.old {
                peer.resp.remember(pkt.psn, old);
            }
        }
        if let Some(rd) = ex.recv {
            let (cq, wc) = (peer.recv_cq(), peer.retire_recv(&rd));
            self.push_cqe_se(cq, wc, rd.solicited);
            self.srq_consumed(p);
        }
        if ex.status != WcStatus::Success {
            if !op.consumes_receive() {
                self.affiliated_error(p, ex.status);
            }
            // Every error the responder detects moves it to ERR too.
            self.set_err(p);
            let nak = PacketKind::Nak(ex.status);
            return respond(&mut self.net, &pkt, pkt.psn, nak, HEADER_BYTES);
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
        let last = pkt.psn.wrapping_add(pkt.npkts - 1) & PSN_MASK;
        respond(&mut self.net, &pkt, last, kind, bytes);
    }
}
