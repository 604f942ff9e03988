//! The untimed fabric's direct path: a send work request executed inside its post.
//!
//! On a fabric where time cannot matter (threaded, [`LinkModel::INSTANT`], instant timers,
//! no random faults, no trace) the transport's whole exchange for one request is fixed:
//! the request packet is delivered at once, executes at the responder, and its ACK (or
//! read or atomic response) completes it at the requester before the post returns. When
//! nothing else is in flight and nothing scripted can intervene, [`World::run_direct`]
//! performs those effects in the same order without packets, the event heap or timers, for
//! each request from the head of the send queue once the whole list is posted. A list
//! built in place (`post_send_raw_with`, the form the library's provider uses) on an empty
//! send queue skips the queue altogether where that changes nothing
//! ([`World::post_direct`]: every post's checks first, no inline request): its requests
//! execute from the scratch request they were built in. [`plan`] decides and executes
//! (memory only), reading the tables; `apply` then applies:
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
use super::qp::{sg_len, Admitted, SendHead};
use super::requester::local_limits;
use super::responder::{execute, Exec};
use super::tables::Tables;
use super::{Scratch, World};
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
        let t = &self.tables;
        let Some(qp) = t.qps.get(q) else {
            return false;
        };
        let Some(e) = qp.sq.front() else {
            return false;
        };
        // The inline room is looked at only by an inline request.
        let inline = if e.wr.flags.contains(SendFlags::INLINE) {
            qp.sq.inline(0)
        } else {
            &[]
        };
        let Some(d) = plan(t, &self.net, q, path, &e.wr, qp.sq.gathers(0), inline) else {
            return false;
        };
        self.apply(q, d, true);
        true
    }

    /// Posts `n` send work requests, `fill(i, wr)` writing request `i`, on the direct path
    /// without queueing them, when that gives what posting them one by one
    /// (`post_send_list`) and running the queue would: every request is checked first
    /// (as the posts would check them, each counting those before it as queued), none is
    /// inline (an inline request's bytes are read at its post, so executing an earlier one
    /// first could change them), and the first executes here. Those from the first the
    /// direct path declines are then queued, as their posts would have queued them. `None`,
    /// having changed nothing, when the list must be posted one by one instead.
    pub(crate) fn post_direct(
        &mut self,
        q: usize,
        n: usize,
        fill: &mut impl FnMut(usize, &mut SendWr),
    ) -> Option<Result<(), (usize, SimError)>> {
        let qp = self.tables.qps.get(q)?;
        if qp.ty != QpType::Rc || qp.sq.len() != 0 || n == 0 {
            return None;
        }
        let path = path(&self.tables, &self.net, q)?;
        let mut scratch = self.scratch.take().unwrap_or_else(Scratch::new);
        let wr = &mut scratch.send;
        // The posts' checks: the first refused ends the list (those before it are posted).
        let held = qp.unsig_done as usize;
        let (mut admitted, mut res) = (n, Ok(()));
        for i in 0..n {
            fill(i, wr);
            match qp.admits_send(wr, &self.net, held + i) {
                Ok(Admitted::Queue(_)) if !wr.flags.contains(SendFlags::INLINE) => {}
                Ok(_) => {
                    self.scratch = Some(scratch);
                    return None;
                }
                Err(e) => {
                    (admitted, res) = (i, Err((i, e)));
                    break;
                }
            }
        }
        // Executed in order; the first declined, if it is the first of the list, is posted
        // one by one after all (its post may fail it at once: `fail_head_now`). A list of
        // one is still in the scratch request.
        let mut done = 0;
        while done < admitted {
            if n > 1 {
                fill(done, wr);
            }
            let sges = &wr.sg_list[..wr.num_sge];
            let head = SendHead::of(wr, sg_len(sges));
            let Some(d) = plan(&self.tables, &self.net, q, &path, &head, sges, &[]) else {
                break;
            };
            self.apply(q, d, false);
            done += 1;
        }
        if done == 0 {
            self.scratch = Some(scratch);
            return None;
        }
        let qp = self.tables.qps.get_mut(q).expect("live QP");
        for i in done..admitted {
            fill(i, wr);
            let total = sg_len(&wr.sg_list[..wr.num_sge]);
            qp.queue_send(wr, total, &mut self.net);
        }
        self.scratch = Some(scratch);
        self.count_posts(q, true, admitted);
        if done < admitted {
            self.run_direct(q);
            self.pump(q);
        }
        Some(res)
    }

    /// Applies an executed request `d` of QP `q` (`queued`: the head of its send queue).
    fn apply(&mut self, q: usize, d: Direct, queued: bool) {
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
        if queued {
            qp.sq.drop_front();
        }
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

/// Whether QP `q`'s request `wr` (gather list `sges`, inline payload `inline`), next in
/// its send queue, may take the direct path on `path`; if so, executes it at its
/// responder (which moves its bytes and changes nothing else) and returns what is left to
/// apply.
#[inline]
fn plan(
    t: &Tables,
    net: &Net,
    q: usize,
    path: &Path,
    wr: &SendHead,
    sges: &[Sge],
    inline: &[u8],
) -> Option<Direct> {
    let qp = t.qps.get(q)?;
    let (p, rtr, rts, qpn, psn) = (path.p, path.rtr, path.rts, qp.qpn, qp.req.next_psn);
    let peer = t.qps.get(p)?;
    // In step with the requester (a packet path request left both where they were).
    let connected = peer.resp.epsn == psn;
    // The requester's local checks: the limits here, the memory in `execute` (its
    // local half fails exactly where `local_check` would). An atomic passes only with
    // 8 bytes, so `len` is the message length of every request that passes.
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
    let ex = execute(&t.mrs, &net.cfg, qp, wr, sges, inline, peer);
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
