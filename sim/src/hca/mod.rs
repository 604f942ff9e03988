//! The HCAs: everything a device does between the host's doorbell and the wire.
//!
//! The whole fabric is one [`World`] behind the fabric's mutex, in two parts that are
//! borrowed apart: the [`Tables`] of objects the HCAs hold (looked up by index, key or
//! number), and the [`Net`] they all share (the configuration, simulated time and its
//! events, the wire, the trace), which no lookup reaches. A block that holds a queue pair
//! from the tables can still send, arm its timer and trace through the `Net`.
//!
//! The blocks, where a NIC engineer would look for them:
//!
//! - [`tables`]: the object tables (devices, PDs, MRs, CQs, QPs) and their lookups;
//! - [`qp`]: the queue pair: its state, its send queue, the verbs state machine and posting;
//! - [`requester`]: transmission, the ACK timer, retries, RNR waits, responses;
//! - [`responder`]: in-order execution, duplicates, NAKs, the checks and effects;
//! - [`cq`]: completions, flushes, error transitions, completion channels;
//! - [`direct`]: the untimed fabric's fast path (a request executed inside its post);
//! - [`mem`]: raw access to registered memory (the only `unsafe` module).
//!
//! Here: the world itself, a packet's arrival at a device, a device's crash, and the event
//! loop (processing events in order, and how simulated time follows the wall clock in
//! threaded mode).

use std::sync::atomic::Ordering;

use crate::config::{FabricConfig, Mode};
use crate::sched::{EvKind, Sched};
use crate::trace::{Trace, TraceKind};
use crate::types::*;
use crate::wire::{DropReason, Packet, PacketKind, Transit, Wire};

pub(crate) mod cq;
pub(crate) mod direct;
pub(crate) mod mem;
pub(crate) mod qp;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod tables;

use qp::{ReqState, RespState};
pub(crate) use tables::Tables;

/// The whole simulated fabric.
#[derive(Debug)]
pub(crate) struct World {
    /// What the HCAs hold: devices, PDs, MRs, CQs with their channels, QPs.
    pub(crate) tables: Tables,
    /// What they share: configuration, time and events, the wire, the trace.
    pub(crate) net: Net,
}

/// What every HCA block shares, apart from the object tables.
#[derive(Debug)]
pub(crate) struct Net {
    pub(crate) cfg: FabricConfig,
    /// `cfg` is untimed: requests may complete on the direct path (`direct.rs`).
    pub(crate) untimed: bool,
    /// Simulated time, packets in flight and timers.
    pub(crate) sched: Sched,
    /// Ports, partitions and the fault generator.
    pub(crate) wire: Wire,
    pub(crate) trace: Trace,
}

pub(crate) fn invalid<T>(why: &'static str) -> Result<T, SimError> {
    Err(SimError::Invalid(why))
}

/// Total byte length of a scatter/gather list.
pub(crate) fn sg_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

impl Net {
    /// Records a trace event at the current time (when tracing).
    pub(crate) fn trace(
        &mut self,
        dev: usize,
        qpn: u32,
        kind: TraceKind,
        psn: Option<u32>,
        wr_id: Option<u64>,
    ) {
        let now = self.sched.now;
        self.trace.record(now, dev, qpn, kind, psn, wr_id);
    }

    /// Puts `pkt` (`bytes` on the wire) on the link: schedules its arrival (twice when
    /// duplicated), or traces its loss.
    pub(crate) fn send(&mut self, mut pkt: Packet, bytes: u64) {
        let (src, qpn, psn) = (pkt.src_dev as usize, pkt.src_qpn, Some(pkt.psn));
        match self
            .wire
            .transmit(&mut pkt, bytes, self.sched.now, &self.cfg)
        {
            Transit::Lost(why) => self.trace(src, qpn, TraceKind::Drop(pkt.kind, why), psn, None),
            Transit::Arrives { at, delay, twice } => {
                if let Some(extra) = delay {
                    self.trace(src, qpn, TraceKind::Delay(pkt.kind, extra), psn, None);
                }
                self.sched.events.push_packet(at, pkt);
                if twice {
                    self.trace(src, qpn, TraceKind::Duplicate(pkt.kind), psn, None);
                    self.sched.events.push_packet(at, pkt);
                }
            }
        }
    }
}

impl World {
    pub(crate) fn new(cfg: FabricConfig) -> World {
        World {
            tables: Tables::new(),
            net: Net {
                cfg,
                untimed: cfg.untimed(),
                sched: Sched::new(),
                wire: Wire::new(cfg.seed),
                trace: Trace::new(cfg.trace),
            },
        }
    }

    /// Records a trace event at the current time (when tracing).
    pub(crate) fn trace(
        &mut self,
        dev: usize,
        qpn: u32,
        kind: TraceKind,
        psn: Option<u32>,
        wr_id: Option<u64>,
    ) {
        self.net.trace(dev, qpn, kind, psn, wr_id);
    }

    /// Every CQ's poll must lock again (the fabric stopped being untimed).
    pub(crate) fn wake_polls(&self) {
        for cq in self.tables.cqs.iter() {
            cq.ready.store(true, Ordering::Release);
        }
    }

    /// A packet arrives: hands it to its queue pair, or loses it.
    pub(crate) fn deliver(&mut self, pkt: Packet) {
        let dst = pkt.dst_dev as usize;
        let (qpn, psn) = (pkt.dst_qpn, Some(pkt.psn));
        let why = self.net.wire.arrival(dst);
        let qps = &self.tables.qps;
        let q = self
            .tables
            .qp_index(pkt.dst_qpn)
            .filter(|&q| qps.get(q).is_some_and(|qp| qp.dev == dst && !qp.dead));
        match (why, q) {
            (Some(why), _) => self.trace(dst, qpn, TraceKind::Drop(pkt.kind, why), psn, None),
            (None, None) => self.trace(
                dst,
                qpn,
                TraceKind::Drop(pkt.kind, DropReason::NoQp),
                psn,
                None,
            ),
            (None, Some(q)) => {
                self.trace(dst, qpn, TraceKind::Deliver(pkt.kind), psn, None);
                match pkt.kind {
                    PacketKind::Request => self.on_request(q, pkt),
                    _ => self.on_response(q, pkt),
                }
            }
        }
    }

    /// Crashes device `dev`: its queue pairs vanish without completions, its CQs empty,
    /// and packets to or from it are lost from now on.
    pub(crate) fn crash(&mut self, dev: usize) {
        self.net.wire.ports[dev].crashed = true;
        for q in 0..self.tables.qps.slots() {
            let epoch = self.tables.next_epoch();
            let Some(qp) = self.tables.qps.get_mut(q).filter(|qp| qp.dev == dev) else {
                continue;
            };
            qp.sq.clear();
            qp.rq.clear();
            qp.unsig_done = 0;
            (qp.req, qp.resp, qp.dead, qp.epoch) =
                (ReqState::default(), RespState::default(), true, epoch);
            self.net.sched.events.cancel_timer(q);
            self.set_state(q, QpState::Err);
        }
        for c in 0..self.tables.cqs.slots() {
            if let Some(cq) = self.tables.cqs.get_mut(c).filter(|c| c.dev == dev) {
                cq.entries.clear();
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
