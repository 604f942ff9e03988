//! The fabric's state: object tables, the queue pair state machine and posting.
//!
//! Everything lives in one [`World`] behind the fabric's mutex. Objects sit in slabs indexed
//! by small integers (no hashing, so iteration order is deterministic). Queues are
//! preallocated at creation and never grow: posting, executing and polling do not allocate.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::config::FabricConfig;
use crate::mem::Region;
use crate::rng::Rng;
use crate::sched::Events;
use crate::trace::{TraceEvent, TraceKind};
use crate::types::*;

/// Number of the first queue pair; QPN = `QPN_BASE` + slab index.
pub(crate) const QPN_BASE: u32 = 0x11;
/// Largest 24-bit value (PSNs, QPNs).
pub(crate) const MAX_24: u32 = (1 << 24) - 1;
/// The largest GRH flow label (20 bits).
pub(crate) const MAX_FLOW_LABEL: u32 = (1 << 20) - 1;
/// Key bit that marks an rkey (lkeys have it clear), so a swapped key never validates.
const RKEY_BIT: u32 = 0x80;
/// Key bits holding the MR slot's generation (1..=127), so stale keys do not validate.
const GEN_MASK: u32 = 0x7f;

/// A vector of optional objects with slot generations.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<(u8, Option<T>)>,
}

impl<T> Slab<T> {
    const fn new() -> Self {
        Slab { slots: Vec::new() }
    }

    /// Stores `v` in the first free slot; returns its index and generation (1..=127).
    fn insert(&mut self, v: T) -> (usize, u8) {
        let i = match self.slots.iter().position(|s| s.1.is_none()) {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[i];
        slot.0 = slot.0 % GEN_MASK as u8 + 1;
        slot.1 = Some(v);
        (i, slot.0)
    }

    /// Index the next `insert` uses.
    fn next_index(&self) -> usize {
        let free = self.slots.iter().position(|s| s.1.is_none());
        free.unwrap_or(self.slots.len())
    }

    pub(crate) fn remove(&mut self, i: usize) -> Option<T> {
        self.slots.get_mut(i)?.1.take()
    }

    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.slots.get(i)?.1.as_ref()
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.slots.get_mut(i)?.1.as_mut()
    }

    /// The live object at `i` if its generation is `gen`.
    fn get_gen(&self, i: usize, gen: u8) -> Option<&T> {
        self.slots.get(i).filter(|s| s.0 == gen)?.1.as_ref()
    }

    /// Number of slots (live or free); valid indices are below it.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.1.as_ref())
    }
}

/// A simulated HCA with one port.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) lid: u16,
    pub(crate) gids: [Gid; 2],
    /// The port's link is up (`Fabric::link_down` / `link_up`).
    pub(crate) link_up: bool,
    /// The device crashed (for good).
    pub(crate) crashed: bool,
    /// Packets leaving the device still to drop (`Fabric::drop_next`).
    pub(crate) drop_next: u32,
    /// Responses leaving the device still to corrupt (`Fabric::corrupt_next_response`).
    pub(crate) corrupt_next: u32,
    /// The egress port is busy serialising until this time.
    pub(crate) busy_until: u64,
}

/// A protection domain; freed once its handle is gone and nothing refers to it.
#[derive(Debug)]
pub(crate) struct PdObj {
    pub(crate) dev: usize,
    refs: u32,
    open: bool,
}

/// A registered memory region.
#[derive(Debug)]
pub(crate) struct MrObj {
    pub(crate) pd: usize,
    pub(crate) access: Access,
    pub(crate) region: Region,
}

/// A completion queue; freed once its handle is gone and no QP uses it.
#[derive(Debug)]
pub(crate) struct CqObj {
    pub(crate) dev: usize,
    pub(crate) depth: usize,
    pub(crate) entries: VecDeque<Wc>,
    pub(crate) overflowed: bool,
    /// Shared with the handle: false only while a poll has nothing to return and nothing
    /// to run (see `Cq::poll_map`). Set under the world's lock by every push.
    pub(crate) ready: Arc<crate::padded::Padded<AtomicBool>>,
    /// Its completion channel, arming and events (`comp_channel.rs`).
    pub(crate) notify: crate::comp_channel::CqNotify,
    refs: u32,
    open: bool,
}

/// Which timer a requester runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimerKind {
    /// Local ACK timeout.
    Ack,
    /// Waiting out an RNR NAK.
    Rnr,
}

/// Requester side of a queue pair (the transport state of its send queue).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReqState {
    /// PSN of the next packet sent.
    pub(crate) next_psn: u32,
    /// SQ entries `0..sent` are on the wire, awaiting their response.
    pub(crate) sent: usize,
    /// Reads and atomics among them.
    pub(crate) rd_inflight: u8,
    /// Transport retries left (reset on progress).
    pub(crate) retries: u8,
    /// RNR retries left (reset on progress; unused when `rnr_retry` is 7).
    pub(crate) rnr_left: u8,
    /// Waiting out an RNR NAK: nothing is sent.
    pub(crate) rnr_wait: bool,
    /// Instant timers: asleep on RNR until the responder posts a receive, leaves RTR/RTS
    /// or becomes unreachable (`wake_parked`, `wake_unreachable`).
    pub(crate) parked: bool,
    /// Instant timers: its responder is not yet in RTR (a start-up race). Instead of
    /// spending every retry at once, it waits the time its retries would take on hardware
    /// (its timer), and is woken the moment the responder reaches RTR (`wake_not_ready`).
    pub(crate) not_ready: bool,
    /// The armed timer: deadline and kind (mirrored in the event queue's timer heap).
    pub(crate) timer: Option<(u64, TimerKind)>,
}

/// Atomic results a responder remembers for replay (as many as `max_dest_rd_atomic`).
pub(crate) const ATOMIC_CACHE: usize = 16;

/// Responder side of a queue pair.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RespState {
    /// Expected PSN.
    pub(crate) epsn: u32,
    /// (PSN, old value) of recent atomics, a ring.
    pub(crate) atomics: [(u32, u64); ATOMIC_CACHE],
    pub(crate) next_atomic: usize,
}

impl RespState {
    pub(crate) fn remember(&mut self, psn: u32, old: u64) {
        self.atomics[self.next_atomic] = (psn, old);
        self.next_atomic = (self.next_atomic + 1) % ATOMIC_CACHE;
    }

    pub(crate) fn recall(&self, psn: u32) -> Option<u64> {
        self.atomics.iter().find(|a| a.0 == psn).map(|a| a.1)
    }
}

/// A reliable-connected queue pair.
#[derive(Debug)]
pub(crate) struct QpObj {
    pub(crate) qpn: u32,
    pub(crate) dev: usize,
    /// Incarnation, fabric-unique; changes on RESET, ERR and crash.
    pub(crate) epoch: u32,
    /// Its device crashed: the QP is gone but for its handle.
    pub(crate) dead: bool,
    /// Device the RTR path resolves to.
    pub(crate) peer_dev: Option<usize>,
    pub(crate) req: ReqState,
    pub(crate) resp: RespState,
    pub(crate) pd: usize,
    pub(crate) send_cq: usize,
    pub(crate) recv_cq: usize,
    pub(crate) cap: QpCap,
    pub(crate) sig_all: bool,
    pub(crate) state: QpState,
    pub(crate) init: Option<InitAttr>,
    pub(crate) rtr: Option<RtrAttr>,
    pub(crate) rts: Option<RtsAttr>,
    /// Send WRs not yet executed, oldest first.
    pub(crate) sq: crate::sq::SendQueue,
    /// Receive WRs not yet consumed, oldest first.
    pub(crate) rq: VecDeque<RecvWr>,
    /// Executed unsignaled WRs still holding SQ slots (released by the next send CQE).
    pub(crate) unsig_done: usize,
    /// Send WRs of this QP completed on the direct path (kept here, not in the shared
    /// world header, so that counting dirties only a line the post writes anyway).
    pub(crate) direct_count: u64,
    /// Doorbells, posts and send completions (`Qp::counters`).
    pub(crate) counters: crate::counters::QpCounters,
}

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
    pub(crate) notifier: crate::comp_channel::Notifier,
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

    /// Sets QP `q`'s state, tracing the change.
    pub(crate) fn set_state(&mut self, q: usize, to: QpState) {
        let Some(qp) = self.qps.get_mut(q) else {
            return;
        };
        let (from, dev, qpn) = (qp.state, qp.dev, qp.qpn);
        qp.state = to;
        if from != to {
            self.trace(dev, qpn, TraceKind::State(from, to), None, None);
        }
    }

    pub(crate) fn add_device(&mut self, name: &str) -> Result<(), SimError> {
        if name.is_empty() || self.devices.iter().any(|d| d.name == name) {
            return invalid("device name empty or taken");
        }
        let n = self.devices.len() + 1;
        let lid = match u16::try_from(n) {
            Ok(lid) if lid <= 0xbfff => lid, // unicast LIDs end at 0xbfff
            _ => return Err(SimError::QueueFull),
        };
        let mut link_local = [0u8; 16];
        link_local[..2].copy_from_slice(&[0xfe, 0x80]);
        link_local[14..].copy_from_slice(&lid.to_be_bytes());
        let mut v4 = [0u8; 16];
        v4[10..12].copy_from_slice(&[0xff, 0xff]);
        v4[12] = 10;
        v4[13..].copy_from_slice(&(n as u32).to_be_bytes()[1..]);
        self.devices.push(Device {
            name: name.to_owned(),
            lid,
            gids: [link_local, v4],
            link_up: true,
            crashed: false,
            drop_next: 0,
            corrupt_next: 0,
            busy_until: 0,
        });
        Ok(())
    }

    pub(crate) fn alloc_pd(&mut self, dev: usize) -> usize {
        let pd = PdObj {
            dev,
            refs: 0,
            open: true,
        };
        self.pds.insert(pd).0
    }

    /// Drops one reference to (or the handle of) PD `pd`; frees it when unused.
    pub(crate) fn release_pd(&mut self, pd: usize, handle: bool) {
        let Some(p) = self.pds.get_mut(pd) else {
            return;
        };
        if handle {
            p.open = false;
        } else {
            p.refs -= 1;
        }
        if !p.open && p.refs == 0 {
            self.pds.remove(pd);
        }
    }

    pub(crate) fn create_cq(&mut self, dev: usize, depth: u32) -> Result<usize, SimError> {
        if !(1..=MAX_CQE).contains(&depth) {
            return invalid("CQ depth must be 1..=MAX_CQE");
        }
        let cq = CqObj {
            dev,
            depth: depth as usize,
            entries: VecDeque::with_capacity(depth as usize),
            overflowed: false,
            ready: Arc::new(crate::padded::Padded(AtomicBool::new(true))),
            notify: crate::comp_channel::CqNotify::new(self.notifier.next_key()),
            refs: 0,
            open: true,
        };
        Ok(self.cqs.insert(cq).0)
    }

    /// Drops one reference to (or the handle of) CQ `cq`; frees it when unused.
    pub(crate) fn release_cq(&mut self, cq: usize, handle: bool) {
        let Some(c) = self.cqs.get_mut(cq) else {
            return;
        };
        if handle {
            c.open = false;
        } else {
            c.refs -= 1;
        }
        if !c.open && c.refs == 0 {
            self.cqs.remove(cq);
        }
    }

    /// Registers `region` in `pd`; returns (slot, lkey, rkey).
    pub(crate) fn register_mr(
        &mut self,
        pd: usize,
        region: Region,
        access: Access,
    ) -> Result<(usize, u32, u32), SimError> {
        let remote = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if access.intersects(remote) && !access.contains(Access::LOCAL_WRITE) {
            return invalid("REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE");
        }
        if self.mrs.next_index() > (u32::MAX >> 8) as usize {
            return Err(SimError::QueueFull);
        }
        let (i, gen) = self.mrs.insert(MrObj { pd, access, region });
        self.pds.get_mut(pd).expect("live PD").refs += 1;
        let lkey = (i as u32) << 8 | u32::from(gen);
        Ok((i, lkey, lkey | RKEY_BIT))
    }

    pub(crate) fn deregister_mr(&mut self, mr: usize) {
        if let Some(m) = self.mrs.remove(mr) {
            self.release_pd(m.pd, false);
        }
    }

    /// The live MR named by `key` (an rkey when `remote`) in `pd`.
    pub(crate) fn mr(&self, key: u32, remote: bool, pd: usize) -> Option<&MrObj> {
        if (key & RKEY_BIT != 0) != remote {
            return None;
        }
        let m = self
            .mrs
            .get_gen((key >> 8) as usize, (key & GEN_MASK) as u8)?;
        (m.pd == pd).then_some(m)
    }

    pub(crate) fn create_qp(
        &mut self,
        pd: usize,
        cqs: (usize, usize),
        cap: QpCap,
        sig_all: bool,
    ) -> Result<(usize, u32), SimError> {
        let wr_ok = |n: u32| (1..=MAX_QP_WR).contains(&n);
        let sge_ok = |n: u32| (1..=MAX_SGE as u32).contains(&n);
        if !(wr_ok(cap.max_send_wr) && wr_ok(cap.max_recv_wr)) {
            return invalid("max_send_wr/max_recv_wr must be 1..=MAX_QP_WR");
        }
        if !(sge_ok(cap.max_send_sge) && sge_ok(cap.max_recv_sge)) {
            return invalid("max_send_sge/max_recv_sge must be 1..=MAX_SGE");
        }
        if cap.max_inline_data > MAX_INLINE as u32 {
            return invalid("max_inline_data exceeds MAX_INLINE");
        }
        let dev = self.pds.get(pd).expect("live PD").dev;
        let cq_dev = |c| self.cqs.get(c).map(|c: &CqObj| c.dev);
        if cq_dev(cqs.0) != Some(dev) || cq_dev(cqs.1) != Some(dev) {
            return invalid("CQs must belong to the PD's device");
        }
        let qpn = QPN_BASE + self.qps.next_index() as u32;
        if qpn > MAX_24 {
            return Err(SimError::QueueFull);
        }
        let epoch = self.next_epoch();
        let qp = QpObj {
            qpn,
            dev,
            epoch,
            dead: false,
            peer_dev: None,
            req: ReqState::default(),
            resp: RespState::default(),
            pd,
            send_cq: cqs.0,
            recv_cq: cqs.1,
            cap,
            sig_all,
            state: QpState::Reset,
            init: None,
            rtr: None,
            rts: None,
            sq: crate::sq::SendQueue::new(cap.max_send_wr as usize),
            rq: VecDeque::with_capacity(cap.max_recv_wr as usize),
            unsig_done: 0,
            direct_count: 0,
            counters: Default::default(),
        };
        let (i, _) = self.qps.insert(qp);
        // Bound on events in flight per QP: a request and a response per WR, plus timers.
        let events = (cap.max_send_wr as usize + cap.max_recv_wr as usize) * 2 + 2;
        self.events.reserve(events, i);
        self.pds.get_mut(pd).expect("live PD").refs += 1;
        for c in [cqs.0, cqs.1] {
            self.cqs.get_mut(c).expect("live CQ").refs += 1;
        }
        Ok((i, qpn))
    }

    /// Destroys QP `q`, discarding its work without completions.
    pub(crate) fn destroy_qp(&mut self, q: usize) {
        self.wake_parked(q);
        self.disarm(q);
        if let Some(qp) = self.qps.remove(q) {
            self.direct_retired += qp.direct_count;
            self.release_cq(qp.send_cq, false);
            self.release_cq(qp.recv_cq, false);
            self.release_pd(qp.pd, false);
        }
    }

    /// Slab index of the QP numbered `qpn`, if live.
    pub(crate) fn qp_index(&self, qpn: u32) -> Option<usize> {
        let i = qpn.checked_sub(QPN_BASE)? as usize;
        self.qps.get(i).filter(|q| q.qpn == qpn).map(|_| i)
    }
}
