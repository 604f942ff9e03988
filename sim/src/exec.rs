//! Executing work requests: the requester's local checks, the responder's checks and
//! effects, completions, flushes and error transitions.
//!
//! The transport (`transport.rs`) calls [`World::local_check`] before a request goes on
//! the wire and [`World::execute`] when it arrives in order at the responder. Work is
//! checked completely before any byte moves, so a failing work request changes no memory.
//!
//! In-process shortcut: a read or atomic copies its result straight into the requester's
//! scatter list when it executes at the responder; the requester's completion still waits
//! for the response packet (and a lost response makes the read execute again).

use std::sync::atomic::Ordering;

use crate::config::Personality;
use crate::mem::{self, Dst, Src};
use crate::sq::SqEntry;
use crate::state::{sg_len, QpObj, ReqState, World};
use crate::trace::TraceKind;
use crate::types::*;

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

/// The completion opcode of a send operation.
pub(crate) fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
        SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::Read { .. } => WcOpcode::RdmaRead,
        SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
    }
}

/// A `WrFlushErr` completion.
pub(crate) fn flush_wc(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> Wc {
    Wc {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode,
        byte_len: 0,
        imm_data: None,
        qp_num,
    }
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
                self.scatter(qp.pd, sges, total as usize, &mut [])
            }
            _ if wr.flags.contains(SendFlags::INLINE) => true,
            _ => self.gather(qp.pd, sges, &mut []),
        };
        if !local_ok {
            let writes = matches!(wr.op, Read { .. } | CompareSwap { .. } | FetchAdd { .. });
            let unusable_key = |s: &Sge| {
                s.length > 0
                    && !matches!(self.mr(s.lkey, false, qp.pd),
                        Some(m) if !writes || m.access.contains(Access::LOCAL_WRITE))
            };
            let inline = wr.flags.contains(SendFlags::INLINE);
            if self.cfg.personality == Personality::Rxe && !inline && sges.iter().any(unusable_key)
            {
                return Err(WcStatus::LocQpOpErr); // rxe: copy_data's -EINVAL
            }
            return Err(WcStatus::LocProtErr);
        }
        Ok(())
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
                self.scatter(qp.pd, sges, len, &mut dst)
            }
            _ if wr.flags.contains(SendFlags::INLINE) => {
                src[0] = Src::slice(&inline[..len]);
                true
            }
            _ => self.gather(qp.pd, sges, &mut src),
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
            self.mr(rkey, true, peer.pd)
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
                    let (recv, req) = match self.cfg.personality {
                        Personality::Hca => (WcStatus::LocLenErr, WcStatus::RemInvReqErr),
                        Personality::Rxe => (WcStatus::LocQpOpErr, WcStatus::RemOpErr),
                    };
                    done.status = recv;
                    out.recv = Some(done);
                    return fail(out, req);
                }
                if !self.scatter(peer.pd, rsges, len, &mut dst) {
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
                        let (consumed, status) = match self.cfg.personality {
                            Personality::Hca => (self.cfg.loc_access_err, WcStatus::LocAccessErr),
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
        if self.scatter(qp.pd, &e.wr.sg_list[..e.wr.num_sge], 8, &mut dst) {
            mem::copy(&[Src::slice(&old.to_ne_bytes())], &dst, 8);
        }
    }

    /// Resolves a local gather list in `pd` into `out`; false on a protection error.
    /// Zero-length entries are skipped unchecked, as rxe does.
    ///
    /// `out` may be shorter than `sges` (even empty, to check only): spans past its end
    /// are checked and not stored.
    fn gather<'w>(&'w self, pd: usize, sges: &[Sge], out: &mut [Src<'w>]) -> bool {
        sges.iter().enumerate().all(|(i, s)| {
            s.length == 0 || {
                let src = self.mr(s.lkey, false, pd);
                let span = src.and_then(|m| m.region.src(s.addr, s.length as usize));
                if let (Some(span), Some(o)) = (span, out.get_mut(i)) {
                    *o = span;
                }
                span.is_some()
            }
        })
    }

    /// Resolves the entries of a scatter list in `pd` that the first `len` bytes reach into
    /// `out`; false if one names no MR of `pd`, leaves it, or lacks LOCAL_WRITE.
    /// `out` may be shorter than `sges` (even empty, to check only), as for `gather`.
    fn scatter<'w>(&'w self, pd: usize, sges: &[Sge], len: usize, out: &mut [Dst<'w>]) -> bool {
        let mut left = len;
        for (i, s) in sges.iter().enumerate() {
            if left == 0 {
                break;
            }
            if s.length == 0 {
                continue;
            }
            let dst = self.mr(s.lkey, false, pd);
            match dst.and_then(|m| m.region.dst(s.addr, s.length as usize)) {
                Some(span) => {
                    if let Some(o) = out.get_mut(i) {
                        *o = span;
                    }
                }
                None => return false,
            }
            left -= left.min(s.length as usize);
        }
        true
    }

    /// Retires the head of responder `p`'s receive queue, which the transfer `rd` consumed,
    /// with its completion.
    pub(crate) fn complete_recv(&mut self, p: usize, rd: RecvDone) {
        let peer = self.qps.get_mut(p).expect("live QP");
        peer.rq.pop_front();
        let wc = Wc {
            wr_id: rd.wr_id,
            status: rd.status,
            opcode: rd.opcode,
            byte_len: rd.byte_len,
            imm_data: rd.imm,
            qp_num: peer.qpn,
        };
        let cq = peer.recv_cq;
        self.push_cqe_se(cq, wc, rd.solicited);
    }

    /// Completes the oldest SQ entry of QP `q` with `status`: a CQE when signaled or
    /// failed (releasing earlier unsignaled slots), else the slot stays held.
    pub(crate) fn complete_front(&mut self, q: usize, status: WcStatus) {
        let Some(qp) = self.qps.get_mut(q) else {
            return;
        };
        let Some(e) = qp.sq.pop_front() else {
            return;
        };
        if qp.req.sent > 0 {
            qp.req.sent -= 1;
            if rd_atomic(&e.wr.op) {
                qp.req.rd_inflight = qp.req.rd_inflight.saturating_sub(1);
            }
        }
        let signaled = qp.sig_all || e.wr.flags.contains(SendFlags::SIGNALED);
        if signaled || status != WcStatus::Success {
            qp.unsig_done = 0;
            let wc = Wc {
                wr_id: e.wr.wr_id,
                status,
                opcode: send_opcode(&e.wr.op),
                byte_len: msg_len(&e.wr) as u32,
                imm_data: None,
                qp_num: qp.qpn,
            };
            let cq = qp.send_cq;
            self.push_cqe(cq, wc);
        } else {
            qp.unsig_done += 1;
        }
        self.count_send_end(q, signaled || status != WcStatus::Success);
    }

    /// Completes the oldest SQ entry of QP `q` with error `status` and moves `q` to ERR.
    pub(crate) fn fail_front(&mut self, q: usize, status: WcStatus) {
        self.complete_front(q, status);
        self.set_err(q);
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
        let front = self.qps.get(q).and_then(|qp| qp.sq.front());
        let read = front.is_some_and(|e| matches!(e.wr.op, SendOp::Read { .. }));
        match self.cfg.personality {
            Personality::Rxe if !read => WcStatus::FatalErr,
            _ => WcStatus::BadRespErr,
        }
    }

    /// Pushes a completion; on overflow the CQ enters its error state and every QP using it
    /// moves to ERR (completions it can no longer take are dropped).
    pub(crate) fn push_cqe(&mut self, cq: usize, wc: Wc) {
        self.push_cqe_se(cq, wc, false);
    }

    /// [`World::push_cqe`] for a receive whose request asked for a solicited event
    /// (`se`): it raises the event of a CQ armed solicited-only, as does any completion
    /// in error (`ibv_req_notify_cq(3)`).
    pub(crate) fn push_cqe_se(&mut self, cq: usize, wc: Wc, se: bool) {
        let Some(c) = self.cqs.get_mut(cq) else {
            return;
        };
        if c.overflowed {
            return;
        }
        let dev = c.dev;
        c.ready.store(true, Ordering::Release);
        if c.entries.len() < c.depth {
            c.entries.push_back(wc);
            let kind = TraceKind::Complete(wc.status, wc.opcode);
            self.trace(dev, wc.qp_num, kind, None, Some(wc.wr_id));
            self.notify_cq(cq, se || wc.status != WcStatus::Success);
            return;
        }
        c.overflowed = true;
        for q in 0..self.qps.slots() {
            let uses = self
                .qps
                .get(q)
                .is_some_and(|qp| qp.send_cq == cq || qp.recv_cq == cq);
            if uses {
                self.set_err(q);
            }
        }
    }

    /// Moves QP `q` to ERR, flushing its SQ then its RQ in posting order (once).
    pub(crate) fn set_err(&mut self, q: usize) {
        let Some(qp) = self.qps.get_mut(q) else {
            return;
        };
        if qp.state == QpState::Err {
            return;
        }
        // A responder in ERR answers nothing: a requester asleep on its RNR NAK must wake
        // and find that out by retrying.
        self.wake_parked(q);
        let qp = self.qps.get_mut(q).expect("live QP");
        qp.unsig_done = 0;
        // Timers and packets of the old incarnation become stale.
        qp.req = ReqState::default();
        self.epochs = self.epochs.wrapping_add(1);
        qp.epoch = self.epochs;
        self.events.cancel_timer(q);
        self.set_state(q, QpState::Err);
        // Pop one at a time: a flush CQE may overflow a CQ, which re-enters `set_err`.
        while let Some(qp) = self.qps.get_mut(q) {
            let Some(e) = qp.sq.pop_front() else { break };
            let (wc, cq) = (
                flush_wc(e.wr.wr_id, send_opcode(&e.wr.op), qp.qpn),
                qp.send_cq,
            );
            self.push_cqe(cq, wc);
            self.count_send_end(q, true);
        }
        while let Some(qp) = self.qps.get_mut(q) {
            let Some(r) = qp.rq.pop_front() else { break };
            let (wc, cq) = (flush_wc(r.wr_id, WcOpcode::Recv, qp.qpn), qp.recv_cq);
            self.push_cqe(cq, wc);
        }
    }
}
