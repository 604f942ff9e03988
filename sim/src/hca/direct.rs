//! The untimed fabric's direct path: a send work request executed inside its post.
//!
//! On a fabric where time cannot matter (threaded, [`LinkModel::INSTANT`], instant timers,
//! no random faults, no trace) the transport's whole exchange for one request is fixed:
//! the request packet is delivered at once, executes at the responder, and its ACK (or
//! read or atomic response) completes it at the requester before the post returns. When
//! nothing else is in flight and nothing scripted can intervene, [`World::run_direct`]
//! performs those effects in the same order without packets, the event heap or timers, for
//! each request from the head of the send queue once the whole list is posted. [`plan`]
//! decides and executes (memory only), reading the tables; `direct_one` then applies:
//!
//! 1. the responder's effects (memory, expected PSN, atomic replay cache, the consumed
//!    receive and its completion), as `on_request` applies them;
//! 2. the requester's (PSN, retry counters, its completion or held unsignaled slot), as
//!    `on_response` and `complete_front` apply them.
//!
//! Anything else (a local or remote error, an RNR NAK, a full CQ, a scripted drop or
//! corruption, a link down, a partition, a crash, a QP not in a plain connected state)
//! declines *before any effect*, and the request takes the packet path, which computes the
//! same outcome again (the responder's `execute` changes nothing but the memory of a
//! successful request). `tests/model.rs` runs its reference model on this fabric and on the stepped
//! one, and the conformance suite runs on both, so the two paths stay equivalent.
//!
//! [`LinkModel::INSTANT`]: crate::LinkModel::INSTANT

use super::net::Net;
use super::requester::local_limits;
use super::responder::{execute, Exec};
use super::tables::Tables;
use super::World;
use crate::types::*;
use crate::wire::PSN_MASK;

/// A request the direct path takes, executed: what is left to apply.
struct Direct {
    /// The responder's slot.
    p: usize,
    /// The request's first PSN, and the next after it.
    psn: u32,
    next: u32,
    /// Its outcome at the responder (success, without an RNR NAK).
    ex: Exec,
    /// The requester's RTS attributes (its retry counters start again).
    rts: RtsAttr,
    /// The requester's completion, when the request is signaled.
    wc: Option<WorkCompletion>,
}

impl World {
    /// Executes the send queue of QP `q` from its head on the direct path, as far as it
    /// may go; the rest is left to the packet path (`pump`).
    pub(crate) fn run_direct(&mut self, q: usize) {
        // What cannot change while requests execute here (the fabric, the link, the
        // connection and its states) is checked once for the whole send queue.
        let Some(path) = path(&self.tables, &self.net, q) else {
            return;
        };
        while self.direct_one(q, &path) {}
    }

    /// Executes the head of QP `q`'s send queue at once, as the packet path would on this
    /// fabric; false, having changed nothing, when it must take the packet path instead.
    fn direct_one(&mut self, q: usize, path: &Path) -> bool {
        let Some(d) = plan(&self.tables, &self.net, q, path) else {
            return false;
        };
        // The queue pairs are looked up again to change them: the plan read the whole
        // table (and the responder may be the requester itself).

        // The responder, as `on_request` leaves it.
        let peer = self.tables.qps.get_mut(d.p).expect("live QP");
        peer.resp.epsn = d.next;
        if let Some(old) = d.ex.old {
            peer.resp.remember(d.psn, old);
        }
        if let Some(rd) = d.ex.recv {
            let (cq, wc) = (peer.recv_cq(), peer.retire_recv(&rd));
            self.push_cqe_se(cq, wc, rd.solicited);
        }

        // The requester, as `on_response` and `complete_front` leave it.
        let qp = self.tables.qps.get_mut(q).expect("live QP");
        qp.sq.drop_front();
        qp.req.next_psn = d.next;
        (qp.req.retries, qp.req.rnr_left) = (d.rts.retry_cnt, d.rts.rnr_retry);
        qp.direct_count += 1;
        qp.counters.send_end(d.wc.is_some());
        match d.wc {
            Some(wc) => {
                qp.unsig_done = 0;
                let cq = qp.send_cq();
                self.push_cqe(cq, wc);
            }
            None => qp.unsig_done += 1,
        }
        true
    }
}

/// The connection a send queue's requests take on the direct path: what a request
/// executed there leaves as it was (the fabric untimed and idle, the link up and nothing
/// scripted on it, both queue pairs connected to each other in a sending and a receiving
/// state, the requester quiet), checked once per `run_direct`.
struct Path {
    /// The responder's slot.
    p: usize,
    rtr: RtrAttr,
    rts: RtsAttr,
}

#[inline]
fn path(t: &Tables, net: &Net, q: usize) -> Option<Path> {
    if !net.untimed || !net.sched.events.is_empty() {
        return None;
    }
    let qp = t.qps.get(q)?;
    let r = &qp.req;
    let quiet = r.sent == 0 && !r.rnr_wait && !r.parked && r.timer.is_none();
    if !quiet || qp.state != QpState::ReadyToSend {
        return None;
    }
    let (rtr, rts, pdev) = (qp.rtr?, qp.rts?, qp.peer_dev()?);
    let (dev, qpn) = (qp.dev(), qp.qpn);
    let wire = &net.wire;
    if wire.blocked(dev, pdev).is_some() || wire.scripted(dev) || wire.scripted(pdev) {
        return None;
    }
    let (p, peer) = t.qp_by_num(rtr.dest_qp_num)?;
    let connected = peer.rtr.is_some_and(|a| a.dest_qp_num == qpn)
        && peer.peer_dev() == Some(dev)
        && peer.dev() == pdev
        && !peer.dead
        && matches!(peer.state, QpState::ReadyToReceive | QpState::ReadyToSend);
    connected.then_some(Path { p, rtr, rts })
}

/// Whether the head of QP `q`'s send queue may take the direct path on `path`; if so,
/// executes it at its responder (which moves its bytes and changes nothing else) and
/// returns what is left to apply.
#[inline]
fn plan(t: &Tables, net: &Net, q: usize, path: &Path) -> Option<Direct> {
    let qp = t.qps.get(q)?;
    let e = qp.sq.front()?;
    let (p, rtr, rts, qpn, psn) = (path.p, path.rtr, path.rts, qp.qpn, qp.req.next_psn);
    let peer = t.qps.get(p)?;
    // In step with the requester (a packet path request left both where they were).
    let connected = peer.resp.epsn == psn;
    // The requester's local checks: the limits here, the memory in `execute` (its
    // local half fails exactly where `local_check` would). An atomic passes only with
    // 8 bytes, so `len` is the message length of every request that passes.
    let wr = &e.wr;
    let len = wr.total;
    if !connected || local_limits(qp, wr).is_err() {
        return None;
    }
    // Room for both completions, so that neither can overflow a CQ here.
    let room = |c: usize, n: usize| t.cqs.get(c).is_some_and(|c| c.buf.has_room(n));
    let signaled = qp.sig_all || wr.flags.contains(SendFlags::SIGNALED);
    let takes_recv = wr.op.consumes_receive();
    let (need_send, need_recv) = (usize::from(signaled), usize::from(takes_recv));
    let fits = if qp.send_cq() == peer.recv_cq() {
        room(qp.send_cq(), need_send + need_recv)
    } else {
        room(qp.send_cq(), need_send) && room(peer.recv_cq(), need_recv)
    };
    if !fits {
        return None;
    }
    // The inline room is looked at only by an inline request.
    let inline = if wr.flags.contains(SendFlags::INLINE) {
        qp.sq.inline(0)
    } else {
        &[]
    };
    let ex = execute(&t.mrs, &net.cfg, qp, wr, qp.sq.gathers(0), inline, peer);
    if ex.rnr || ex.status != WcStatus::Success {
        return None;
    }
    let npkts = len.div_ceil(128u64 << (rtr.path_mtu as u8)).max(1) as u32;
    let wc = signaled.then(|| WorkCompletion {
        wr_id: wr.wr_id,
        status: WcStatus::Success,
        opcode: wr.op.wc_opcode(),
        byte_len: len as u32,
        imm: None,
        qp_num: qpn,
        src_qp: 0,
        grh: false,
    });
    Some(Direct {
        p,
        psn,
        next: psn.wrapping_add(npkts) & PSN_MASK,
        ex,
        rts,
        wc,
    })
}
