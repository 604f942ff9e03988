//! The engine: executing send work requests, completions, flushes and error transitions.
//!
//! All execution happens in [`World::progress`], called with the world lock held at the end
//! of every post and poll. Work is checked completely before any byte moves, so a failing
//! work request changes no memory.

use crate::mem::{self, Dst, Src};
use crate::state::{sg_len, QpObj, SqEntry, World};
use crate::types::*;

/// The receive completion a transfer generates at the responder.
#[derive(Clone, Copy, Debug)]
struct RecvDone {
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
}

/// What executing the head of a send queue did (its bytes have already moved).
#[derive(Clone, Copy, Debug)]
struct Outcome {
    /// Requester's completion status.
    status: WcStatus,
    /// Requester's `byte_len`.
    byte_len: u32,
    /// Responder QP slot, once found.
    peer: Option<usize>,
    /// Receive WR consumed at the responder (always the head of its RQ).
    recv: Option<RecvDone>,
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

/// Errors the responder detects; they move the responder QP to ERR too.
fn responder_error(s: WcStatus) -> bool {
    matches!(
        s,
        WcStatus::RemInvReqErr | WcStatus::RemAccessErr | WcStatus::RemOpErr
    )
}

impl World {
    /// Runs every queue pair's send queue as far as it can go.
    ///
    /// Engine hook: the next issue replaces this sweep by an event queue on a simulated
    /// clock (latency model, packet faults, RNR and retry timers, a stepped mode). Today a
    /// work request executes entirely at the first sweep after it can: RNR waits (empty
    /// responder RQ) simply stay at the SQ head until a receive is posted.
    pub(crate) fn progress(&mut self) {
        for q in 0..self.qps.slots() {
            while let Some(out) = self.execute(q) {
                self.complete(q, out);
            }
        }
    }

    /// Executes the SQ head of QP `q` if it is in RTS and can progress; `None` otherwise.
    fn execute(&self, q: usize) -> Option<Outcome> {
        let qp = self.qps.get(q).filter(|qp| qp.state == QpState::Rts)?;
        self.transfer(qp, qp.sq.front()?)
    }

    /// Checks and performs one transfer; `None` when it must wait for a receive.
    fn transfer(&self, qp: &QpObj, e: &SqEntry) -> Option<Outcome> {
        use SendOp::*;
        let wr = &e.wr;
        let sges = &wr.sg_list[..wr.num_sge];
        let total = sg_len(sges);
        let atomic = matches!(wr.op, CompareSwap { .. } | FetchAdd { .. });
        let mut out = Outcome {
            status: WcStatus::Success,
            byte_len: if atomic { 8 } else { total as u32 },
            peer: None,
            recv: None,
        };
        let fail = |out: Outcome, status| Some(Outcome { status, ..out });

        // 1. Requester-local checks.
        if total > MAX_MSG || (atomic && total != 8) {
            return fail(out, WcStatus::LocLenErr);
        }
        let len = total as usize;
        let mut src = [Src::EMPTY; MAX_SGE];
        let mut dst = [Dst::EMPTY; MAX_SGE];
        let local_ok = match wr.op {
            Read { .. } | CompareSwap { .. } | FetchAdd { .. } => {
                self.scatter(qp.pd, sges, len, &mut dst)
            }
            _ if wr.flags.contains(SendFlags::INLINE) => {
                src[0] = Src::slice(&e.inline[..len]);
                true
            }
            _ => self.gather(qp.pd, sges, &mut src),
        };
        if !local_ok {
            return fail(out, WcStatus::LocProtErr);
        }

        // 2. The peer (the next issue turns a missing peer into timeouts and retries).
        let Some(p) = self.peer_of(qp) else {
            return fail(out, WcStatus::RetryExcErr);
        };
        out.peer = Some(p);
        let peer = self.qps.get(p)?;

        // 3. Responder checks, in rxe's order: opcode vs QP access, resources (RQ, read/
        // atomic credits), then rkey and receive buffers.
        let (need, rd_atomic) = match wr.op {
            Send | SendWithImm { .. } => (Access::empty(), false),
            Write { .. } | WriteWithImm { .. } => (Access::REMOTE_WRITE, false),
            Read { .. } => (Access::REMOTE_READ, true),
            CompareSwap { .. } | FetchAdd { .. } => (Access::REMOTE_ATOMIC, true),
        };
        let (access, max_rd) = match (peer.init, peer.rtr) {
            (Some(i), Some(r)) => (i.access, r.max_dest_rd_atomic),
            _ => (Access::empty(), 0),
        };
        if !access.contains(need) || (rd_atomic && max_rd == 0) {
            return fail(out, WcStatus::RemInvReqErr);
        }
        let rwr = match wr.op {
            Send | SendWithImm { .. } | WriteWithImm { .. } => Some(peer.rq.front()?),
            _ => None,
        };
        let remote = |rkey: u32, addr: u64, n: usize| {
            self.mr(rkey, true, peer.pd)
                .filter(|m| m.access.contains(need))
                .map(|m| &m.region)
                .filter(|r| r.contains(addr, n))
        };

        // 4. Effects (everything is checked before a byte moves), 5. responder completion.
        match wr.op {
            Send | SendWithImm { .. } => {
                let rwr = rwr?;
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
                };
                let rsges = &rwr.sg_list[..rwr.num_sge];
                if sg_len(rsges) < total {
                    done.status = WcStatus::LocLenErr;
                    out.recv = Some(done);
                    return fail(out, WcStatus::RemInvReqErr);
                }
                if !self.scatter(peer.pd, rsges, len, &mut dst) {
                    done.status = WcStatus::LocProtErr;
                    out.recv = Some(done);
                    return fail(out, WcStatus::RemOpErr);
                }
                mem::copy(&src, &dst, len);
                out.recv = Some(done);
            }
            Write { remote_addr, rkey }
            | WriteWithImm {
                remote_addr, rkey, ..
            } => {
                if len > 0 {
                    let Some(d) = remote(rkey, remote_addr, len) else {
                        return fail(out, WcStatus::RemAccessErr);
                    };
                    mem::copy(&src, &[d.dst(remote_addr, len)?], len);
                }
                if let (WriteWithImm { imm, .. }, Some(rwr)) = (wr.op, rwr) {
                    out.recv = Some(RecvDone {
                        wr_id: rwr.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: len as u32,
                        imm: Some(imm),
                    });
                }
            }
            Read { remote_addr, rkey } => {
                if len > 0 {
                    let Some(s) = remote(rkey, remote_addr, len) else {
                        return fail(out, WcStatus::RemAccessErr);
                    };
                    mem::copy(&[s.src(remote_addr, len)?], &dst, len);
                }
            }
            CompareSwap {
                remote_addr, rkey, ..
            }
            | FetchAdd {
                remote_addr, rkey, ..
            } => {
                if remote_addr % 8 != 0 {
                    return fail(out, WcStatus::RemInvReqErr);
                }
                let Some(r) = remote(rkey, remote_addr, 8) else {
                    return fail(out, WcStatus::RemAccessErr);
                };
                let old = mem::atomic(&r.dst(remote_addr, 8)?, |v| match wr.op {
                    CompareSwap { compare, swap, .. } if v == compare => swap,
                    FetchAdd { add, .. } => v.wrapping_add(add),
                    _ => v,
                });
                mem::copy(&[Src::slice(&old.to_ne_bytes())], &dst, 8);
            }
        }
        Some(out)
    }

    /// Resolves a local gather list in `pd` into `out`; false on a protection error.
    /// Zero-length entries are skipped unchecked, as rxe does.
    fn gather<'w>(&'w self, pd: usize, sges: &[Sge], out: &mut [Src<'w>]) -> bool {
        sges.iter().zip(out).all(|(s, o)| {
            s.length == 0 || {
                let src = self.mr(s.lkey, false, pd);
                src.and_then(|m| m.region.src(s.addr, s.length as usize))
                    .map(|span| *o = span)
                    .is_some()
            }
        })
    }

    /// Resolves the entries of a scatter list in `pd` that the first `len` bytes reach into
    /// `out`; false if one names no MR of `pd`, leaves it, or lacks LOCAL_WRITE.
    fn scatter<'w>(&'w self, pd: usize, sges: &[Sge], len: usize, out: &mut [Dst<'w>]) -> bool {
        let mut left = len;
        for (s, o) in sges.iter().zip(out) {
            if left == 0 {
                break;
            }
            if s.length == 0 {
                continue;
            }
            let dst = self.mr(s.lkey, false, pd);
            match dst.and_then(|m| m.region.dst(s.addr, s.length as usize)) {
                Some(span) => *o = span,
                None => return false,
            }
            left -= left.min(s.length as usize);
        }
        true
    }

    /// The connected responder of `qp`: the QP its path names, in RTR or RTS, pointing back.
    fn peer_of(&self, qp: &QpObj) -> Option<usize> {
        let path = qp.rtr.as_ref()?;
        let p = self.qp_index(path.dest_qp_num)?;
        let peer = self.qps.get(p)?;
        let dev = &self.devices[self.pds.get(peer.pd)?.dev];
        let routed = match path.dgid {
            Some(gid) => dev.gids.contains(&gid),
            None => path.dlid == dev.lid,
        };
        let back = peer.rtr.as_ref()?.dest_qp_num == qp.qpn;
        (matches!(peer.state, QpState::Rtr | QpState::Rts) && routed && back).then_some(p)
    }

    /// Applies the bookkeeping of an executed transfer: completions, SQ slots, errors.
    fn complete(&mut self, q: usize, out: Outcome) {
        if let (Some(p), Some(r)) = (out.peer, out.recv) {
            let peer = self.qps.get_mut(p).expect("live peer");
            peer.rq.pop_front();
            let wc = Wc {
                wr_id: r.wr_id,
                status: r.status,
                opcode: r.opcode,
                byte_len: r.byte_len,
                imm_data: r.imm,
                qp_num: peer.qpn,
            };
            let cq = peer.recv_cq;
            self.push_cqe(cq, wc);
        }
        // A CQ overflow above may have moved `q` to ERR, flushing this WR already.
        let qp = self.qps.get_mut(q).expect("live QP");
        if qp.state == QpState::Rts {
            let e = qp.sq.pop_front().expect("executed WR");
            let signaled = qp.sig_all || e.wr.flags.contains(SendFlags::SIGNALED);
            if signaled || out.status != WcStatus::Success {
                // A CQE releases the slots of all earlier unsignaled WRs.
                qp.unsig_done = 0;
                let wc = Wc {
                    wr_id: e.wr.wr_id,
                    status: out.status,
                    opcode: send_opcode(&e.wr.op),
                    byte_len: out.byte_len,
                    imm_data: None,
                    qp_num: qp.qpn,
                };
                let cq = qp.send_cq;
                self.push_cqe(cq, wc);
            } else {
                qp.unsig_done += 1;
            }
        }
        if out.status != WcStatus::Success {
            self.set_err(q);
            match out.peer {
                Some(p) if responder_error(out.status) => self.set_err(p),
                _ => {}
            }
        }
    }

    /// Pushes a completion; on overflow the CQ enters its error state and every QP using it
    /// moves to ERR (completions it can no longer take are dropped).
    pub(crate) fn push_cqe(&mut self, cq: usize, wc: Wc) {
        let Some(c) = self.cqs.get_mut(cq) else {
            return;
        };
        if c.overflowed {
            return;
        }
        if c.entries.len() < c.depth {
            c.entries.push_back(wc);
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
        qp.state = QpState::Err;
        qp.unsig_done = 0;
        // Pop one at a time: a flush CQE may overflow a CQ, which re-enters `set_err`.
        while let Some(qp) = self.qps.get_mut(q) {
            let Some(e) = qp.sq.pop_front() else { break };
            let (wc, cq) = (
                flush_wc(e.wr.wr_id, send_opcode(&e.wr.op), qp.qpn),
                qp.send_cq,
            );
            self.push_cqe(cq, wc);
        }
        while let Some(qp) = self.qps.get_mut(q) {
            let Some(r) = qp.rq.pop_front() else { break };
            let (wc, cq) = (flush_wc(r.wr_id, WcOpcode::Recv, qp.qpn), qp.recv_cq);
            self.push_cqe(cq, wc);
        }
    }
}
