//! The responder: the receive side of the RC transport. In-order execution, duplicates,
//! NAKs, and the checks and effects of executing a request.
//!
//! The responder executes requests in PSN order: the expected PSN executes and is answered
//! (ACK, read or atomic response, RNR NAK, or an error NAK); a PSN ahead of it is dropped
//! (the requester's go-back-N recovers it); a PSN behind it is a duplicate: sends and
//! writes are re-acknowledged without executing, reads execute again, atomics replay their
//! cached result.
//!
//! [`World::execute`] runs a request that arrived in order. Work is checked completely
//! before any byte moves, so a failing work request changes no memory.
//!
//! In-process shortcut: a read or atomic copies its result straight into the requester's
//! scatter list when it executes at the responder; the requester's completion still waits
//! for the response packet (and a lost response makes the read execute again).

use super::mem::{self, Dst, Src};
use super::qp::{QpObj, SqEntry};
use super::requester::{msg_len, rd_atomic};
use super::{sg_len, World};
use crate::config::Personality;
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

impl World {
    /// A request arrives at responder `p`.
    pub(crate) fn on_request(&mut self, p: usize, pkt: Packet) {
        let peer = self.tables.qps.get(p).expect("live QP");
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
            .tables
            .qp_index(pkt.src_qpn)
            .filter(|&r| self.tables.qps.get(r).is_some_and(|r| r.epoch == pkt.epoch))
            .and_then(|r| {
                let sq = &self.tables.qps.get(r)?.sq;
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
        let req = self.tables.qps.get(r).expect("live QP");
        let e = req.sq.get(i).expect("queued entry");
        let (op, wr_id, len) = (e.wr.op, e.wr.wr_id, msg_len(&e.wr));
        let ex = self.execute(
            req,
            &e.wr,
            &e.inline,
            self.tables.qps.get(p).expect("live QP"),
        );
        self.trace(
            dev,
            qpn,
            TraceKind::Execute { dup: false },
            psn,
            Some(wr_id),
        );
        if ex.rnr {
            let timer = self
                .tables
                .qps
                .get(p)
                .and_then(|q| q.rtr)
                .map_or(0, |r| r.min_rnr_timer);
            self.trace(dev, qpn, TraceKind::RnrNak(timer), psn, Some(wr_id));
            return self.respond(&pkt, pkt.psn, PacketKind::Rnr(timer), HEADER_BYTES);
        }
        if ex.status == WcStatus::Success {
            let resp = &mut self.tables.qps.get_mut(p).expect("live QP").resp;
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
        let peer = self.tables.qps.get(p).expect("live QP");
        let (dev, qpn, psn) = (peer.dev, peer.qpn, Some(pkt.psn));
        let Some((r, i)) = found else {
            return self.respond(pkt, last, PacketKind::Ack, HEADER_BYTES);
        };
        let req = self.tables.qps.get(r).expect("live QP");
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
        self.net.send(pkt, bytes);
    }

    /// Executes request `wr` (with its INLINE payload `inline`) of requester `qp` at
    /// responder `peer`: checks, then effects. Nothing but the memory it writes on success
    /// changes, so a failed or RNR outcome can be recomputed later with the same result.
    pub(crate) fn execute(&self, qp: &QpObj, wr: &SendWr, inline: &[u8], peer: &QpObj) -> Exec {
        use SendOp::*;
        let sges = &wr.sg_list[..wr.num_sge];
        let total = sg_len(sges);
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
        let mut src = [Src::EMPTY; MAX_SGE];
        let mut dst = [Dst::EMPTY; MAX_SGE];
        let local_ok = match wr.op {
            Read { .. } | CompareSwap { .. } | FetchAdd { .. } => {
                self.tables.mrs.scatter(qp.pd, sges, len, &mut dst)
            }
            _ if wr.flags.contains(SendFlags::INLINE) => {
                src[0] = Src::slice(&inline[..len]);
                true
            }
            _ => self.tables.mrs.gather(qp.pd, sges, &mut src),
        };
        if !local_ok {
            return fail(out, WcStatus::RemOpErr);
        }

        // Responder checks, in rxe's order: opcode vs QP access, resources (RQ, read/
        // atomic credits), then rkey and receive buffers.
        let need = match wr.op {
            Send | SendWithImm { .. } => Access::empty(),
            Write { .. } | WriteWithImm { .. } => Access::REMOTE_WRITE,
            Read { .. } => Access::REMOTE_READ,
            CompareSwap { .. } | FetchAdd { .. } => Access::REMOTE_ATOMIC,
        };
        let (access, max_rd) = match (peer.init, peer.rtr) {
            (Some(i), Some(r)) => (i.access, r.max_dest_rd_atomic),
            _ => (Access::empty(), 0),
        };
        if !access.contains(need) || (rd_atomic(&wr.op) && max_rd == 0) {
            return fail(out, WcStatus::RemInvReqErr);
        }
        let rwr = match wr.op {
            Send | SendWithImm { .. } | WriteWithImm { .. } => match peer.rq.front() {
                Some(r) => Some(r),
                None => return Exec { rnr: true, ..out },
            },
            _ => None,
        };
        let remote = |rkey: u32, addr: u64, n: usize| {
            self.tables
                .mrs
                .lookup(rkey, true, peer.pd)
                .filter(|m| m.access.contains(need))
                .map(|m| &m.region)
                .filter(|r| r.contains(addr, n))
        };

        // Effects (everything is checked before a byte moves), responder completion.
        match (wr.op, rwr) {
            (Send | SendWithImm { .. }, Some(rwr)) => {
                let imm = match wr.op {
                    SendWithImm { imm } => Some(imm),
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
                let rsges = &rwr.sg_list[..rwr.num_sge];
                if sg_len(rsges) < total {
                    let (recv, req) = match self.net.cfg.personality {
                        Personality::Hca => (WcStatus::LocLenErr, WcStatus::RemInvReqErr),
                        Personality::Rxe => (WcStatus::LocQpOpErr, WcStatus::RemOpErr),
                    };
                    done.status = recv;
                    out.recv = Some(done);
                    return fail(out, req);
                }
                if !self.tables.mrs.scatter(peer.pd, rsges, len, &mut dst) {
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
                    let target = remote(rkey, remote_addr, len);
                    let Some(d) = target.and_then(|r| r.dst(remote_addr, len)) else {
                        // IB: the receive of a failed WRITE_WITH_IMM completes with a
                        // local access error (when so configured; else it is flushed).
                        // rxe completes it with REM_ACCESS_ERR.
                        let (consumed, status) = match self.net.cfg.personality {
                            Personality::Hca => {
                                (self.net.cfg.loc_access_err, WcStatus::LocAccessErr)
                            }
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
                    let Some(s) = remote(rkey, remote_addr, len) else {
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
                    remote_addr, rkey, ..
                }
                | FetchAdd {
                    remote_addr, rkey, ..
                },
                _,
            ) => {
                if remote_addr % 8 != 0 {
                    return fail(out, WcStatus::RemInvReqErr);
                }
                let target = remote(rkey, remote_addr, 8).and_then(|r| r.dst(remote_addr, 8));
                let Some(r) = target else {
                    return fail(out, WcStatus::RemAccessErr);
                };
                let old = mem::atomic(&r, |v| match wr.op {
                    CompareSwap { compare, swap, .. } if v == compare => swap,
                    FetchAdd { add, .. } => v.wrapping_add(add),
                    _ => v,
                });
                mem::copy(&[Src::slice(&old.to_ne_bytes())], &dst, 8);
                out.old = Some(old);
            }
            (Send | SendWithImm { .. }, None) => unreachable!("sends take a receive"),
        }
        out
    }

    /// Replays an atomic's cached `old` value into the requester's 8-byte scatter list
    /// (a duplicate atomic is never applied twice).
    pub(crate) fn replay_atomic(&self, qp: &QpObj, e: &SqEntry, old: u64) {
        let mut dst = [Dst::EMPTY; MAX_SGE];
        if self
            .tables
            .mrs
            .scatter(qp.pd, &e.wr.sg_list[..e.wr.num_sge], 8, &mut dst)
        {
            mem::copy(&[Src::slice(&old.to_ne_bytes())], &dst, 8);
        }
    }
}
