//! The HCAs: everything a device does between the host's doorbell and the wire.
//!
//! The whole fabric is one [`World`] behind the fabric's gate (`gate.rs`: held
//! exclusively, or shared by the queue pairs' send lanes of the direct path), in two
//! parts that are borrowed apart: the [`Tables`] of objects the HCAs hold (looked up by index, key or
//! number), and the [`Net`] they all share (the configuration, simulated time and its
//! events, the wire, the trace), which no lookup reaches. A block that holds a queue pair
//! from the tables can still send, arm its timer and trace through the `Net`.
//!
//! The blocks, where a NIC engineer would look for them, each importing only from blocks
//! listed before it (and those from `requester` on from here too: the `World` they add
//! entry points to):
//!
//! - [`mem`]: raw access to registered memory, the process's or a device's own (the
//!   memory behind a dmabuf registration) (`unsafe`, as is the next);
//! - [`cq_buf`]: a CQ's ring of completions, written by the exclusive side or under its
//!   writer lock, and read by polls without either (loom-checked);
//! - [`net`]: what the blocks share: configuration, time and events, the wire, the trace;
//! - [`comp_channel`]: completion channels: a CQ's arming and the events it raises;
//! - [`rq`]: where a receive queue lives, and the receive post without the world's lock;
//! - [`qp`]: the queue pair: its state, its send queue, the verbs state machine and posting;
//! - [`tables`]: the object tables (devices, PDs, MRs, CQs, QPs) and their lookups;
//! - [`requester`]: transmission, the ACK timer, retries, RNR waits, responses;
//! - [`responder`]: in-order execution, duplicates, NAKs, the checks and effects;
//! - [`cq`]: completions written, flushes, a queue pair's move to ERR;
//! - [`direct`]: the untimed fabric's fast path (a request executed inside its post, on
//!   the queue pair's send lane);
//! - [`ud`]: unreliable datagrams: address handles, sends and receives;
//! - [`srq`]: shared receive queues: posts, the limit, the queue pairs attached.
//!
//! Here: the world itself and the entry points that route work between the blocks: the
//! verbs a handle calls (each looks up its object once, lets it do its part, then hands
//! what follows to the other blocks: a send to the requester or the direct path, a flush
//! completion to its CQ, a wake-up to a peer), a packet's arrival at a device, a device's
//! crash, and the event loop (processing events in order, and how simulated time follows
//! the wall clock in threaded mode).

use crate::config::{FabricConfig, Mode};
use crate::sched::EvKind;
use crate::trace::TraceKind;
use crate::types::*;
use crate::wire::{DropReason, Packet, PacketKind};

pub(crate) mod async_events;
mod comp_channel;
mod cq;
pub(crate) mod cq_buf;
mod direct;
pub(crate) mod mem;
mod net;
mod qp;
mod requester;
mod responder;
pub(crate) mod rq;
mod srq;
mod tables;
mod ud;
mod wq;

use std::sync::Arc;

pub(crate) use direct::{SendLane, Taken};
use mem::RawInline;
use net::Net;
pub(crate) use qp::QPN_BASE;
use qp::{Posted, ReqState};
use rq::SharedRq;
use tables::Tables;

/// The whole simulated fabric.
#[derive(Debug)]
pub(crate) struct World {
    /// What the HCAs hold: devices, PDs, MRs, CQs with their channels, QPs.
    pub(crate) tables: Tables,
    /// What they share: configuration, time and events, the wire, the trace.
    pub(crate) net: Net,
    /// The connection manager: its event channels and ids.
    pub(crate) cm: crate::cm::CmTables,
}

/// What a new queue pair's handle holds: its number, and in threaded mode its receive
/// queue and (RC) its send lane.
pub(crate) type NewQp = (u32, Option<Arc<SharedRq>>, Option<Arc<SendLane>>);

/// The fabric's devices as the connection manager sees them.
pub(crate) struct DeviceView<'a> {
    tables: &'a Tables,
    net: &'a Net,
}

impl crate::cm::Devices for DeviceView<'_> {
    fn count(&self) -> usize {
        self.tables.devices.len()
    }
    fn gids(&self, dev: usize) -> [Gid; 2] {
        self.tables.devices[dev].gids
    }
    fn lid(&self, dev: usize) -> u16 {
        self.tables.devices[dev].lid
    }
    fn mtu(&self, _: usize) -> Mtu {
        crate::config::PORT_MTU
    }
    fn port_up(&self, dev: usize) -> bool {
        let port = &self.net.wire.ports[dev];
        port.link_up && !port.crashed
    }
}

impl World {
    /// The devices, read-only, beside the connection manager.
    pub(crate) fn cm_parts(&mut self) -> (DeviceView<'_>, &mut crate::cm::CmTables) {
        let World { tables, net, cm } = self;
        (DeviceView { tables, net }, cm)
    }

    pub(crate) fn new(cfg: FabricConfig) -> World {
        World {
            tables: Tables::new(),
            net: Net::new(cfg),
            cm: crate::cm::CmTables::default(),
        }
    }

    /// Adds a device and connects its port to the wire.
    pub(crate) fn add_device(&mut self, name: &str) -> Result<(), SimError> {
        self.tables.add_device(name)?;
        self.net.wire.add_port();
        Ok(())
    }

    /// Creates a queue pair in RESET (see [`Tables::create_qp`]): its number (which names
    /// its slot) and, in threaded mode, its receive queue for the handle to post to and
    /// (RC) its send lane.
    pub(crate) fn create_qp(
        &mut self,
        pd: usize,
        cqs: (usize, usize),
        cap: QpCaps,
        sig_all: bool,
        ty: QpType,
        srq: Option<usize>,
    ) -> Result<NewQp, SimError> {
        let lazy = self.net.cfg.lazy_queues;
        let (i, qpn) = self
            .tables
            .create_qp(pd, cqs, cap, sig_all, (ty, srq), lazy)?;
        // Room in the event heap for what it can have in flight: a request and a response
        // per WR, plus its timer (lazy queues: the heap grows as packets fly instead).
        let n = (cap.max_send_wr as usize + cap.max_recv_wr as usize) * 2 + 2;
        self.net
            .sched
            .events
            .reserve(if lazy { 0 } else { n }, i, lazy);
        // Threaded mode: the handle posts its receives without the world's lock while it
        // may (`rq.rs`); a queue pair on an SRQ posts none.
        let threaded = self.net.cfg.mode == Mode::Threaded;
        let rq = (threaded && srq.is_none()).then(|| {
            let (events, traced) = (self.net.sched.events.pending_flag(), self.net.cfg.trace);
            let qp = self.tables.qps.get_mut(i).expect("new QP");
            qp.rq.share(events, traced)
        });
        let lane = (threaded && ty == QpType::Rc).then(|| Arc::new(SendLane::new()));
        Ok((qpn, rq, lane))
    }

    /// Destroys QP `q`, discarding its work without completions.
    pub(crate) fn destroy_qp(&mut self, q: usize) {
        self.wake_parked(q);
        self.net.sched.events.cancel_timer(q);
        let t = &mut self.tables;
        if let Some(qp) = t.qps.remove(q) {
            t.direct_retired += *qp.direct_count;
            if let Some((s, _)) = qp.rq.srq() {
                t.release_srq(s, false, q);
            }
            t.release_cq(qp.send_cq(), false);
            t.release_cq(qp.recv_cq(), false);
            t.release_pd(qp.pd(), false);
        }
    }

    /// Applies a state transition (see [`Transition`] and `QpObj::transition`).
    pub(crate) fn modify(&mut self, q: usize, m: &Transition) -> Result<(), SimError> {
        let epoch = self.tables.next_epoch();
        let peer_dev = match m {
            Transition::Rtr(a) => self.tables.route(a.dgid, a.dlid),
            _ => None,
        };
        if matches!(m, Transition::Reset) && self.tables.qps.get(q).is_some_and(|qp| !qp.dead) {
            // A responder in RESET answers nothing (and forgets its RTR attributes, which
            // name the requester that may sleep on its RNR NAK): wake that requester.
            self.wake_parked(q);
        }
        let World { tables, net, .. } = self;
        let qp = tables.qps.get_mut(q).expect("live QP");
        if qp.dead {
            return Err(SimError::DeviceFatal);
        }
        if let Transition::Error = m {
            self.set_err(q);
            return Ok(());
        }
        match qp.transition(m, epoch, peer_dev, net)? {
            QpState::ReadyToReceive => self.wake_not_ready(q),
            QpState::ReadyToSend => self.pump(q),
            _ => {}
        }
        Ok(())
    }

    /// Posts the send WRs `wrs` (see `Qp::post_send`), read where they lie: the intake,
    /// with the world held exclusively. The direct path executes what it may of the list
    /// at once (`post_direct`, which takes a list only where executing it there gives what
    /// the packet path would); the rest is queued for the packet path (`post_queued`).
    pub(crate) fn post_sends<const SGES: usize>(
        &mut self,
        q: usize,
        wrs: &[SendWr<SGES>],
        raw: Option<&RawInline>,
    ) -> Result<(), (usize, SimError)> {
        let taken = self.post_direct(q, wrs).unwrap_or(Taken {
            done: 0,
            admitted: wrs.len(),
            res: Ok(()),
        });
        self.post_queued(q, taken, wrs, raw)
    }

    /// Ends a post call whose requests `..taken.done` the direct path executed (none when
    /// it declined the list): the requests up to `taken.admitted` are queued one by one,
    /// each checked again (on a lane, the world may have changed since), the first refused
    /// ending the list; then the queue runs. The error names the first refused.
    ///
    /// On an untimed fabric nothing executes before the whole list is posted (INLINE data
    /// is captured at post, before earlier requests of the list could change it, and all of
    /// them hold send queue slots), as on the packet path, where execution waits for the
    /// events run at the end of the call.
    pub(crate) fn post_queued<const SGES: usize>(
        &mut self,
        q: usize,
        taken: Taken,
        wrs: &[SendWr<SGES>],
        raw: Option<&RawInline>,
    ) -> Result<(), (usize, SimError)> {
        let Taken {
            done,
            admitted,
            res,
        } = taken;
        if done > 0 && done == admitted {
            return res;
        }
        let mut posted = Ok(());
        let mut n = 0;
        for (i, wr) in wrs.iter().enumerate().take(admitted).skip(done) {
            // After the direct path executed some, the packet path would still hold them
            // ahead of this list's head: no head to fail now.
            if self.net.untimed && i > 0 && done == 0 {
                self.fail_head_now(q);
            }
            if let Err(e) = self.post_send(q, wr, raw) {
                posted = Err((i, e));
                break;
            }
            n += 1;
        }
        match self.tables.qps.get_mut(q) {
            // The direct path counted the call's doorbell.
            Some(qp) if done > 0 => qp.counters.more_sends(n),
            Some(qp) => qp.counters.posts(true, n),
            None => {}
        }
        if self.tables.qps.get(q).is_some_and(|qp| qp.ty == QpType::Ud) {
            self.send_datagrams(q);
        } else if self.net.untimed {
            self.run_direct(q);
            self.pump(q);
        }
        posted.and(res)
    }

    /// Posts one send WR (see `QpObj::post_send`). With `raw`, inline SGEs are read from
    /// their addresses; otherwise they must lie in memory registered in the PD. The
    /// requester transmits it at once, but on an untimed fabric, where transmission waits
    /// for the end of the list (`post_queued`).
    fn post_send<const SGES: usize>(
        &mut self,
        q: usize,
        wr: &SendWr<SGES>,
        raw: Option<&RawInline>,
    ) -> Result<(), SimError> {
        let Tables { qps, mrs, ahs, .. } = &mut self.tables;
        let net = &mut self.net;
        let qp = qps.get_mut(q).expect("live QP");
        let pd = qp.pd();
        let inline_src = |addr, n| match raw {
            Some(r) => r.src(addr, n),
            None => mrs
                .iter()
                .find(|m| m.pd == pd && m.region.is_host() && m.region.contains(addr, n))
                .and_then(|m| m.region.src(addr, n)),
        };
        if let SendOp::Datagram { dest, .. } = wr.op {
            if !ahs.by_key(dest.ah).is_some_and(|ah| ah.pd == pd) {
                return Err(SimError::Invalid(
                    "no address handle of this PD has that key",
                ));
            }
        }
        let sent = match qp.post_send(wr, net, inline_src)? {
            Posted::Flushed(wc) => {
                let cq = qp.send_cq();
                self.push_cqe(cq, wc);
                return Ok(());
            }
            Posted::Queued if net.untimed => return Ok(()),
            Posted::Queued => qp.transmit(mrs, net),
        };
        if let Err(status) = sent {
            self.fail_front(q, status);
        }
        Ok(())
    }

    /// Untimed fabric, before the next request of a list: the packet path transmits each
    /// request as it is posted, which fails one at the head of the queue at once when its
    /// local checks fail (so the QP is in ERR for the rest of the list, whose requests are
    /// flushed rather than refused as `QueueFull`). Nothing else it does is visible before
    /// the list is posted.
    #[inline]
    fn fail_head_now(&mut self, q: usize) {
        let qp = self.tables.qps.get(q).expect("live QP");
        let head = qp
            .sq
            .front()
            .filter(|_| qp.sq.len() == 1 && qp.req.sent == 0);
        let personality = self.net.cfg.personality;
        if head.is_some_and(|e| {
            qp.local_check(&self.tables.mrs, personality, &e.wr, qp.sq.gathers(0))
                .is_err()
        }) {
            self.pump(q);
        }
    }

    /// Posts the receive WRs `wrs` in order (see `Qp::post_recv`), with the world held
    /// exclusively; the error names the first refused.
    pub(crate) fn post_recvs<const SGES: usize>(
        &mut self,
        q: usize,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), (usize, SimError)> {
        let mut res = Ok(());
        let mut n = 0;
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.post_recv(q, wr) {
                res = Err((i, e));
                break;
            }
            n += 1;
        }
        if let Some(qp) = self.tables.qps.get_mut(q) {
            qp.counters.posts(false, n);
        }
        res
    }

    /// Posts one receive WR (see `QpObj::post_recv`); a requester asleep on an RNR NAK
    /// from `q` wakes to meet it.
    fn post_recv<const SGES: usize>(
        &mut self,
        q: usize,
        wr: &RecvWr<SGES>,
    ) -> Result<(), SimError> {
        let qp = self.tables.qps.get_mut(q).expect("live QP");
        match qp.post_recv(wr, &mut self.net)? {
            Posted::Flushed(wc) => {
                let cq = qp.recv_cq();
                self.push_cqe(cq, wc);
            }
            Posted::Queued => {
                self.wake_parked(q);
                if let Some(qp) = self.tables.qps.get_mut(q) {
                    qp.rq.woke_requester();
                }
            }
        }
        Ok(())
    }

    /// A packet arrives: hands it to its queue pair, or loses it.
    pub(crate) fn deliver(&mut self, pkt: Packet) {
        if pkt.kind == PacketKind::Datagram {
            return self.deliver_datagram(pkt);
        }
        let dst = pkt.dst_dev as usize;
        let (qpn, psn) = (pkt.dst_qpn, Some(pkt.psn));
        let why = self.net.wire.arrival(dst);
        let q = self
            .tables
            .qp_by_num(pkt.dst_qpn)
            .filter(|(_, qp)| qp.dev() == dst && !qp.dead)
            .map(|(q, qp)| (q, qp.ty));
        let why = match q {
            Some((_, QpType::Ud)) => why.or(Some(DropReason::WrongTransport)),
            _ => why,
        };
        match (why, q.map(|q| q.0)) {
            (Some(why), _) => self
                .net
                .trace(dst, qpn, TraceKind::Drop(pkt.kind, why), psn, None),
            (None, None) => {
                let why = TraceKind::Drop(pkt.kind, DropReason::NoQp);
                self.net.trace(dst, qpn, why, psn, None);
            }
            (None, Some(q)) => {
                self.net
                    .trace(dst, qpn, TraceKind::Deliver(pkt.kind), psn, None);
                match pkt.kind {
                    PacketKind::Request => self.on_request(q, pkt),
                    _ => self.on_response(q, pkt),
                }
            }
        }
    }

    /// Crashes device `dev`: its queue pairs vanish without completions, its CQs empty and fail every later poll,
    /// and packets to or from it are lost from now on.
    pub(crate) fn crash(&mut self, dev: usize) {
        let World { tables, net, .. } = self;
        if !std::mem::replace(&mut net.wire.ports[dev].crashed, true) {
            let fatal = AsyncEvent {
                kind: AsyncEventKind::DeviceFatal,
                element: EventElement::Device,
            };
            tables.async_events.raise(dev, fatal);
        }
        self.close_srqs(dev);
        let World { tables, net, .. } = self;
        for q in 0..tables.qps.slots() {
            let epoch = tables.next_epoch();
            let Some(qp) = tables.qps.get_mut(q).filter(|qp| qp.dev() == dev) else {
                continue;
            };
            qp.sq.clear();
            qp.rq.clear_closed();
            *qp.unsig_done = 0;
            (*qp.req, qp.dead, qp.epoch) = (ReqState::default(), true, epoch);
            qp.resp.reset();
            net.sched.events.cancel_timer(q);
            qp.set_state(QpState::Error, net);
        }
        // Its queues fail every poll from now on, and whoever sleeps on one wakes.
        for c in 0..self.tables.cqs.slots() {
            if let Some(cq) = self.tables.cqs.get_mut(c).filter(|c| c.dev == dev) {
                cq.buf.clear();
                cq.buf.kill();
                self.tables.notifier.notify(c, &mut cq.notify, true);
            }
        }
        // Peers asleep on an RNR NAK from a queue pair that just vanished.
        self.wake_unreachable();
    }

    /// Processes the next event, advancing simulated time to it; false if there is none.
    pub(crate) fn step(&mut self) -> bool {
        let sched = &mut self.net.sched;
        let Some(ev) = sched.events.pop() else {
            return false;
        };
        sched.now = sched.now.max(ev.time);
        match ev.kind {
            EvKind::Deliver(pkt) => self.deliver(pkt),
            EvKind::Timer { qp } => self.on_timer(qp as usize),
        }
        true
    }

    /// Threaded mode: processes the next event if the wall clock has reached it (at its
    /// own time, so responses leave when they would have); false if none is due.
    pub(crate) fn run_due_one(&mut self) -> bool {
        let sched = &mut self.net.sched;
        let wall = sched.wall();
        if sched.events.next_time().is_some_and(|t| t <= wall) {
            return self.step();
        }
        sched.now = sched.now.max(wall);
        false
    }

    /// Threaded mode: processes, in order and each at its own time, every event the wall
    /// clock has reached, then moves simulated time to the wall clock. Returns how many
    /// ran. Does nothing in stepped mode.
    pub(crate) fn run_due(&mut self) -> usize {
        if self.net.cfg.mode != Mode::Threaded {
            return 0;
        }
        if self.net.untimed && self.net.sched.events.is_empty() {
            // Nothing to run, and on an untimed fabric nothing reads the time: skip the
            // clock (two thirds of an idle poll's cost). `Fabric::now` reads it itself.
            return 0;
        }
        let wall = self.net.sched.wall();
        let mut n = 0;
        while self.net.sched.events.next_time().is_some_and(|t| t <= wall) {
            self.step();
            n += 1;
        }
        self.net.sched.now = self.net.sched.now.max(wall);
        n
    }
}
