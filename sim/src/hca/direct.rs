//! The untimed fabric's direct path: a send work request executed inside its post, on
//! the queue pair's own lane.
//!
//! On a fabric where time cannot matter (threaded, [`LinkModel::INSTANT`], instant timers,
//! no random faults, no trace) the transport's whole exchange for one request is fixed:
//! the request packet is delivered at once, executes at the responder, and its ACK (or
//! read or atomic response) completes it at the requester before the post returns. When
//! nothing else is in flight and nothing scripted can intervene, [`World::run_direct`]
//! performs those effects in the same order without packets, the event heap or timers, for
//! each request from the head of the send queue once the whole list is posted. A list
//! read where it lies (`post_send_raw`, the form the library's provider uses; or a single
//! request) on an empty send queue skips the queue altogether where that changes nothing
//! ([`World::post_direct`]: every post's checks first, no inline request): its requests
//! execute from the caller's list, read in place. [`plan`] decides and executes (memory
//! only), reading the tables; `apply` then applies:
//!
//! 1. the responder's effects (memory, expected PSN, atomic replay cache, the consumed
//!    receive and its completion), as `on_request` applies them;
//! 2. the requester's (PSN, retry counters, its completion or held unsignaled slot), as
//!    `on_response` and `complete_front` apply them.
//!
//! Anything else (a local or remote error, an RNR NAK, a full or armed CQ, a scripted drop
//! or corruption, a link down, a partition, a crash, a QP not in a plain connected state)
//! declines *before any effect*, and the request takes the packet path, which computes the
//! same outcome again (the responder's `execute` changes nothing but the memory of a
//! successful request). `tests/model.rs` runs its reference model on this fabric and on the stepped
//! one, and the conformance suite runs on both, so the two paths stay equivalent.
//!
//! **Lanes.** `post_direct` runs without the world held exclusively: on the queue pair's
//! [`SendLane`], beside the lanes of other queue pairs (`gate.rs`), so that two threads
//! driving the two ends of one connection never wait for a fabric-wide lock. What the lane
//! of A (connected to B) writes is its own: A's requester cells and B's responder cell
//! (`LaneCell`s: only A sends to B here, since `path` requires the two to name each
//! other), the head of B's receive queue (under that queue's lock), and the two CQs,
//! under their writer locks, taken in index order and held over the list, so that the
//! room a request counts is there when it writes. Everything else it only reads, and only
//! the exclusive side changes it, after draining the lanes. A list the lane executes in
//! part leaves its rest to the exclusive side (`World::post_queued`), which checks each
//! request again as its post would: the world may have changed in between, as it may
//! between two posts.
//!
//! **What may run beside a lane, and why that is sound** (each with the test that shows it):
//!
//! | beside a lane | what both touch | what makes it sound |
//! |---|---|---|
//! | another lane's RDMA WRITE, READ or SEND into the same bytes | target memory | every access is a relaxed atomic load or store (`mem.rs`): each byte (each aligned word) ends from one writer, a reader sees each old or new; no data race in Rust's model, no order between bytes promised, as with racing DMA (`tests/lanes_differential.rs`) |
//! | another lane's atomic on the same word | the word | one `AtomicU64` read-modify-write instruction (`mem::atomic`): `IBV_ATOMIC_HCA` and more (`tests/atomics_concurrent.rs`; loom: `tests/loom_collectives.rs`) |
//! | a duplicate atomic's replay | the responder's replay cache | only the exclusive side replays (duplicates exist only on the packet path), and a lane owns its peer's responder cell: no two writers |
//! | the peer's own receive posts, or another lane's SEND to it | B's receive queue | its lock; a lane takes the head, a handle posts at the tail (loom: `rq.rs`) |
//! | polls, or another lane completing into a shared CQ | the CQs | per-CQ writer locks held over the list, polls read the ring lock-free (loom: `cq_buf.rs`, `gate.rs`) |
//! | a deregistration, a queue pair destroyed or reset, a transition, a link down, a crash | the tables the lane reads | all run exclusively, and the exclusive side closes the gate and drains every lane first (loom: `gate.rs`; `tests/loom_collectives.rs`, a lane's atomic racing its target's deregistration) |
//!
//! [`LinkModel::INSTANT`]: crate::LinkModel::INSTANT

use super::cq_buf::CqWrite;
use super::net::Net;
use super::qp::{sg_len, SendHead};
use super::requester::local_limits;
use super::responder::{execute, Exec};
use super::rq::RqRead;
use super::tables::Tables;
use super::World;
use crate::gate::LaneFlag;
use crate::types::*;
use crate::wire::PSN_MASK;

/// A queue pair's send lane (threaded mode, RC), which its handle holds: the busy flag
/// that lets one thread at a time run its direct path beside the other lanes (`gate.rs`).
///
/// What the lane of queue pair A, connected to B, owns while it runs: A's requester
/// state, counters and held unsignaled slots, B's responder state (no other queue pair
/// sends to B on the direct path: `path` checks that A and B name each other), the head
/// of B's receive queue (under its own lock; B's handle posts at the tail), and, under
/// their writer locks, the CQs it writes. It only reads the rest of the world.
#[derive(Debug)]
pub(crate) struct SendLane {
    pub(crate) flag: LaneFlag,
}

impl SendLane {
    pub(crate) fn new() -> SendLane {
        SendLane {
            flag: LaneFlag::new(),
        }
    }
}

/// A request the direct path takes, executed: what is left to apply.
struct Direct<'w> {
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
    /// The responder's receive queue, held since `execute` when the request consumes a
    /// receive.
    rq: Option<RqRead<'w>>,
}

/// What [`World::post_direct`] did with a list it took: requests `..done` executed, and
/// `done..admitted` still to post one by one, with the world held exclusively
/// (`World::post_queued`); `res` is the outcome of the posts' checks.
pub(crate) struct Taken {
    pub(crate) done: usize,
    pub(crate) admitted: usize,
    pub(crate) res: Result<(), (usize, SimError)>,
}

impl World {
    /// Executes the send queue of QP `q` from its head on the direct path, as far as it
    /// may go; the rest is left to the packet path (`pump`).
    pub(crate) fn run_direct(&mut self, q: usize) {
        // What cannot change while requests execute here (the fabric, the link, the
        // connection and its states) is checked once for the whole send queue; the
        // executed entries leave it at the end.
        let w = &*self;
        let Some(path) = path(&w.tables, &w.net, q) else {
            return;
        };
        let Some(cqs) = CqPair::lock(&w.tables, &path, true) else {
            return;
        };
        let mut done = 0;
        while direct_one(w, q, &path, &cqs, done) {
            done += 1;
        }
        drop(cqs);
        let sq = &mut self.tables.qps.get_mut(q).expect("live QP").sq;
        for _ in 0..done {
            sq.drop_front();
        }
    }

    /// Posts the send work requests `wrs`, read where they lie, on the direct path without
    /// queueing them, when that gives what posting them one by one (`post_queued`) and
    /// running the queue would: every request is checked first (as the posts would check
    /// them, each counting those before it as queued), none is inline (an inline request's
    /// bytes are read at its post, so executing an earlier one first could change them),
    /// and the first executes here. Those from the first the direct path declines are left
    /// to post one by one ([`Taken`]). `None`, having changed nothing, when the list must
    /// be posted one by one instead.
    ///
    /// Runs on QP `q`'s send lane, or with the world held exclusively.
    pub(crate) fn post_direct<const SGES: usize>(
        &self,
        q: usize,
        wrs: &[SendWr<SGES>],
    ) -> Option<Taken> {
        let n = wrs.len();
        let qp = self.tables.qps.get(q)?;
        if qp.ty != QpType::Rc || qp.sq.len() != 0 || n == 0 {
            return None;
        }
        let path = path(&self.tables, &self.net, q)?;
        // The posts' checks, the queue pair's once (it is in RTS: `path`), then each
        // request's: the first refused ends the list (those before it are posted).
        if qp.admits_sends() != Ok(false) {
            return None;
        }
        let held = *qp.unsig_done as usize;
        let (mut admitted, mut res, mut recv) = (n, Ok(()), false);
        for (i, wr) in wrs.iter().enumerate() {
            recv |= wr.op.consumes_receive();
            match qp.admits_wr(wr, &self.net, held + i) {
                Ok(_) if !wr.flags.contains(SendFlags::INLINE) => {}
                Ok(_) => return None,
                Err(e) => {
                    (admitted, res) = (i, Err((i, e)));
                    break;
                }
            }
        }
        let cqs = CqPair::lock(&self.tables, &path, recv)?;
        // Executed in order; the first declined, if it is the first of the list, is posted
        // one by one after all (its post may fail it at once: `fail_head_now`).
        let mut done = 0;
        while let Some(wr) = wrs.get(done).filter(|_| done < admitted) {
            // As admitted: `num_sge` of its entries.
            let sges = wr.sges();
            let head = SendHead::of(wr, sg_len(sges));
            let Some(d) = plan(self, q, &path, &cqs, &head, sges, &[]) else {
                break;
            };
            apply(self, q, d, &cqs);
            done += 1;
        }
        if done == 0 {
            return None;
        }
        // SAFETY: the lane of `q`, or the world held exclusively (the caller's).
        unsafe { qp.counters.lane_mut() }.posts(true, done);
        Some(Taken {
            done,
            admitted,
            res,
        })
    }
}

/// Executes the request `i` entries past the head of QP `q`'s send queue (those before it
/// executed) at once, as the packet path would on this fabric; false, having changed
/// nothing, when it must take the packet path instead. The world is held exclusively.
fn direct_one(w: &World, q: usize, path: &Path, cqs: &CqPair<'_>, i: usize) -> bool {
    let Some(qp) = w.tables.qps.get(q) else {
        return false;
    };
    let Some(e) = qp.sq.get(i) else {
        return false;
    };
    // The inline room is looked at only by an inline request.
    let inline = if e.wr.flags.contains(SendFlags::INLINE) {
        qp.sq.inline(i)
    } else {
        &[]
    };
    let Some(d) = plan(w, q, path, cqs, &e.wr, qp.sq.gathers(i), inline) else {
        return false;
    };
    apply(w, q, d, cqs);
    true
}

/// Applies an executed request `d` of QP `q`, as `on_request`, `on_response` and
/// `complete_front` leave the two queue pairs (but the send queue entry, which the caller
/// retires if there is one).
#[inline]
fn apply(w: &World, q: usize, d: Direct<'_>, cqs: &CqPair<'_>) {
    let t = &w.tables;
    // The responder, as `on_request` leaves it.
    let peer = t.qps.get(d.p).expect("live QP");
    {
        // SAFETY: `q`'s lane (or the exclusive holder) owns its connected responder's
        // state: no other lane sends to `peer` (`path`).
        let resp = unsafe { peer.resp.lane_mut() };
        resp.epsn = d.next;
        if let Some(old) = d.ex.old {
            resp.remember(d.psn, old);
        }
    }
    if let Some(rd) = d.ex.recv {
        // Retired under the hold `execute` took (the path's receive queue is shared).
        debug_assert!(matches!(d.rq, Some(RqRead::Shared(_))), "held shared");
        if let Some(mut rq) = d.rq {
            rq.pop_shared();
        }
        let wc = peer.recv_wc(&rd);
        // Locked and with room: the plan checked.
        let pushed = cqs.recv().is_some_and(|c| c.push(wc));
        debug_assert!(pushed, "room was checked");
    }

    // The requester, as `on_response` and `complete_front` leave it.
    let qp = t.qps.get(q).expect("live QP");
    // SAFETY (each `lane_mut`): `q`'s lane (or the exclusive holder) owns its requester
    // state; no other reference to these cells is alive here.
    let req = unsafe { qp.req.lane_mut() };
    req.next_psn = d.next;
    (req.retries, req.rnr_left) = (d.rts.retry_cnt, d.rts.rnr_retry);
    *unsafe { qp.direct_count.lane_mut() } += 1;
    unsafe { qp.counters.lane_mut() }.send_end(d.wc.is_some());
    let unsig_done = unsafe { qp.unsig_done.lane_mut() };
    match d.wc {
        Some(wc) => {
            *unsig_done = 0;
            let pushed = cqs.send().push(wc);
            debug_assert!(pushed, "room was checked");
        }
        None => *unsig_done += 1,
    }
}

/// The CQs a connection's requests write, the requester's send CQ and (when some request
/// consumes a receive) the responder's receive CQ, held with their writer locks (in index
/// order, so two lanes cannot wait for each other; one lock when they are one CQ). A list
/// of writes to a peer locks only its own CQ, so the peer's lane, writing back, meets no
/// lock of this one. None is armed: a completion into an armed CQ raises an event, which
/// only the exclusive side may (the direct path declines then).
struct CqPair<'a> {
    send: CqWrite<'a>,
    recv: RecvCq<'a>,
}

/// The receive CQ of a [`CqPair`].
enum RecvCq<'a> {
    /// Not locked: no request of the list consumes a receive.
    None,
    /// The send CQ.
    Same,
    Other(CqWrite<'a>),
}

impl<'a> CqPair<'a> {
    /// Locks the send CQ of `path`, and its receive CQ if `recv`; `None` if one is armed.
    #[inline(always)]
    fn lock(t: &'a Tables, path: &Path, recv: bool) -> Option<CqPair<'a>> {
        let (s, r) = (path.send_cq, path.recv_cq);
        let sc = t.cqs.get(s)?;
        if sc.notify.armed() {
            return None;
        }
        if !recv || s == r {
            let recv = if recv { RecvCq::Same } else { RecvCq::None };
            let send = sc.buf.lock();
            return Some(CqPair { send, recv });
        }
        let rc = t.cqs.get(r)?;
        if rc.notify.armed() {
            return None;
        }
        let (send, recv) = if s < r {
            let send = sc.buf.lock();
            (send, rc.buf.lock())
        } else {
            let recv = rc.buf.lock();
            (sc.buf.lock(), recv)
        };
        Some(CqPair {
            send,
            recv: RecvCq::Other(recv),
        })
    }

    #[inline]
    fn send(&self) -> &CqWrite<'a> {
        &self.send
    }

    /// The receive CQ, if locked.
    #[inline]
    fn recv(&self) -> Option<&CqWrite<'a>> {
        match &self.recv {
            RecvCq::None => None,
            RecvCq::Same => Some(&self.send),
            RecvCq::Other(c) => Some(c),
        }
    }

    /// Room for a send and a receive completion (`s`, `r`: 0 or 1); none for a receive
    /// completion when the receive CQ is not locked.
    #[inline(always)]
    fn has_room(&self, s: usize, r: usize) -> bool {
        match &self.recv {
            RecvCq::Same => self.send.has_room(s + r),
            RecvCq::Other(c) => self.send.has_room(s) && c.has_room(r),
            RecvCq::None => r == 0 && self.send.has_room(s),
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
    /// The requester's send CQ and the responder's receive CQ.
    send_cq: usize,
    recv_cq: usize,
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
        && peer.rq.is_shared()
        // The first request to reach a queue pair in RTR raises COMM_EST, on the world's
        // path; those after it may come this way.
        && (peer.state == QpState::ReadyToSend
            || (peer.state == QpState::ReadyToReceive && peer.resp.established));
    connected.then(|| Path {
        p,
        rtr,
        rts,
        send_cq: qp.send_cq(),
        recv_cq: peer.recv_cq(),
    })
}

/// Whether QP `q`'s request `wr` (gather list `sges`, inline payload `inline`), next in
/// its send queue, may take the direct path on `path`; if so, executes it at its
/// responder (which moves its bytes and changes nothing else) and returns what is left to
/// apply.
#[inline]
fn plan<'w>(
    w: &'w World,
    q: usize,
    path: &Path,
    cqs: &CqPair<'_>,
    wr: &SendHead,
    sges: &[Sge],
    inline: &[u8],
) -> Option<Direct<'w>> {
    let t = &w.tables;
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
    let signaled = qp.sig_all || wr.flags.contains(SendFlags::SIGNALED);
    let takes_recv = wr.op.consumes_receive();
    if !cqs.has_room(usize::from(signaled), usize::from(takes_recv)) {
        return None;
    }
    let mut rq = None;
    let ex = execute(&t.mrs, &w.net.cfg, qp, wr, sges, inline, peer, &mut rq);
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
        sl: 0,
        slid: 0,
        pkey_index: 0,
    });
    Some(Direct {
        p,
        psn,
        next: psn.wrapping_add(npkts) & PSN_MASK,
        ex,
        rts,
        wc,
        rq,
    })
}
