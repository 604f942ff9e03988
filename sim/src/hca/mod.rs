//! The HCAs: everything a device does between the host's doorbell and the wire.
//!
//! Everything lives in one [`World`] behind the fabric's mutex. Objects sit in slabs indexed
//! by small integers (no hashing, so iteration order is deterministic). Queues are
//! preallocated at creation and never grow: posting, executing and polling do not allocate.
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
//! Here: the world itself, and the event loop (processing events in order, and how
//! simulated time follows the wall clock in threaded mode).

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::config::{FabricConfig, Mode};
use crate::rng::Rng;
use crate::sched::{EvKind, Events};
use crate::trace::{TraceEvent, TraceKind};
use crate::types::*;

pub(crate) mod cq;
pub(crate) mod direct;
pub(crate) mod mem;
pub(crate) mod qp;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod tables;

use qp::{QpObj, ReqState, RespState};
use tables::{CqObj, Device, MrObj, PdObj, Slab};

/// The whole simulated fabric.
#[derive(Debug)]
pub(crate) struct World {
    pub(crate) devices: Vec<Device>,
    pub(crate) pds: Slab<PdObj>,
    pub(crate) mrs: Slab<MrObj>,
    pub(crate) cqs: Slab<CqObj>,
    pub(crate) qps: Slab<QpObj>,
    pub(crate) cfg: FabricConfig,
    /// Threaded mode: time zero.
    pub(crate) start: Instant,
    /// Simulated time, ns.
    pub(crate) now: u64,
    pub(crate) events: Events,
    pub(crate) rng: Rng,
    /// Partitioned device pairs, `(low, high)`.
    pub(crate) partitions: Vec<(usize, usize)>,
    pub(crate) trace: Vec<TraceEvent>,
    /// Last epoch handed out.
    pub(crate) epochs: u32,
    /// `cfg` is untimed: requests may complete on the direct path (`direct.rs`).
    pub(crate) untimed: bool,
    /// Send WRs completed on the direct path by QPs since destroyed.
    pub(crate) direct_retired: u64,
    /// Completion channels and their events.
    pub(crate) notifier: cq::Notifier,
}

pub(crate) fn invalid<T>(why: &'static str) -> Result<T, SimError> {
    Err(SimError::Invalid(why))
}

/// Total byte length of a scatter/gather list.
pub(crate) fn sg_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

impl World {
    pub(crate) fn new(cfg: FabricConfig) -> World {
        World {
            devices: Vec::new(),
            pds: Slab::new(),
            mrs: Slab::new(),
            cqs: Slab::new(),
            qps: Slab::new(),
            cfg,
            start: Instant::now(),
            now: 0,
            events: Events::new(),
            rng: Rng::new(cfg.seed),
            partitions: Vec::new(),
            trace: Vec::new(),
            epochs: 0,
            untimed: cfg.untimed(),
            direct_retired: 0,
            notifier: Default::default(),
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
        if self.cfg.trace {
            let t = self.now;
            self.trace.push(TraceEvent {
                time_ns: t,
                device: dev as u32,
                qpn,
                psn,
                wr_id,
                kind,
            });
        }
    }

    /// Every CQ's poll must lock again (the fabric stopped being untimed).
    pub(crate) fn wake_polls(&self) {
        for cq in self.cqs.iter() {
            cq.ready.store(true, Ordering::Release);
        }
    }

    /// A fresh QP incarnation number.
    pub(crate) fn next_epoch(&mut self) -> u32 {
        self.epochs = self.epochs.wrapping_add(1);
        self.epochs
    }

    /// Crashes device `dev`: its queue pairs vanish without completions, its CQs empty,
    /// and packets to or from it are lost from now on.
    pub(crate) fn crash(&mut self, dev: usize) {
        self.devices[dev].crashed = true;
        for q in 0..self.qps.slots() {
            let epoch = self.next_epoch();
            let Some(qp) = self.qps.get_mut(q).filter(|qp| qp.dev == dev) else {
                continue;
            };
            qp.sq.clear();
            qp.rq.clear();
            qp.unsig_done = 0;
            (qp.req, qp.resp, qp.dead, qp.epoch) =
                (ReqState::default(), RespState::default(), true, epoch);
            self.events.cancel_timer(q);
            self.set_state(q, QpState::Err);
        }
        for c in 0..self.cqs.slots() {
            if let Some(cq) = self.cqs.get_mut(c).filter(|c| c.dev == dev) {
                cq.entries.clear();
            }
        }
        // Peers asleep on an RNR NAK from a queue pair that just vanished.
        self.wake_unreachable();
    }

    /// Processes the next event, advancing simulated time to it; false if there is none.
    pub(crate) fn step(&mut self) -> bool {
        let Some(ev) = self.events.pop() else {
            return false;
        };
        self.now = self.now.max(ev.time);
        match ev.kind {
            EvKind::Deliver(pkt) => self.deliver(pkt),
            EvKind::Timer { qp } => self.on_timer(qp as usize),
        }
        true
    }

    /// Wall-clock nanoseconds since the fabric was created.
    pub(crate) fn wall(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Threaded mode: processes the next event if the wall clock has reached it (at its
    /// own time, so responses leave when they would have); false if none is due.
    pub(crate) fn run_due_one(&mut self) -> bool {
        let wall = self.wall();
        if self.events.next_time().is_some_and(|t| t <= wall) {
            return self.step();
        }
        self.now = self.now.max(wall);
        false
    }

    /// Threaded mode: processes, in order and each at its own time, every event the wall
    /// clock has reached, then moves simulated time to the wall clock. Returns how many
    /// ran. Does nothing in stepped mode.
    pub(crate) fn run_due(&mut self) -> usize {
        if self.cfg.mode != Mode::Threaded {
            return 0;
        }
        if self.untimed && self.events.is_empty() {
            // Nothing to run, and on an untimed fabric nothing reads the time: skip the
            // clock (two thirds of an idle poll's cost). `Fabric::now` reads it itself.
            return 0;
        }
        let wall = self.wall();
        let mut n = 0;
        while self.events.next_time().is_some_and(|t| t <= wall) {
            self.step();
            n += 1;
        }
        self.now = self.now.max(wall);
        n
    }
}
