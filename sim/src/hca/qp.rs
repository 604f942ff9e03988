//! The queue pair: its requester and responder state, its send queue, the verbs state
//! machine and posting.
//!
//! A queue pair validates what the host asks of it here ([`QpObj::transition`],
//! [`QpObj::post_send`], [`QpObj::post_recv`]); what follows from it in other blocks (a
//! transmission, a flush completion, a woken peer) is the caller's to route
//! (`hca/mod.rs`). Its requester (`requester.rs`) and responder (`responder.rs`) work on
//! the state kept here.
//!
//! Its work queues are in `wq.rs`; where its receive queue lives, in `rq.rs`.
//!
//! Map (one file: posting, the transitions and the responder's state guard one object):
//! the responder's state and its atomic cache; [`QpObj`] and its accessors; the verbs
//! state machine (`transition`); posting (`post_send`, `post_recv`, `queue_send`) and the
//! checks each post makes.

use core::num::NonZeroU32;

use super::mem::{copy, Dst, Spans, Src};
use super::net::Net;
use super::rq::RqHome;
pub(crate) use super::wq::{SendHead, SendQueue, SqEntry};
use crate::config::{Personality, ROCE_ROUTE_HOP_LIMIT};
use crate::counters::QpCounters;
use crate::gate::LaneCell;
use crate::trace::TraceKind;
use crate::types::*;

/// Number of the first queue pair; QPN = `QPN_BASE` + slab index.
pub(crate) const QPN_BASE: u32 = 0x11;
/// Largest 24-bit value (PSNs, QPNs).
pub(crate) const MAX_24: u32 = (1 << 24) - 1;
/// The largest GRH flow label (20 bits).
pub(crate) const MAX_FLOW_LABEL: u32 = (1 << 20) - 1;

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
    /// SQ entries `0..sent` are on the wire, awaiting their response (at most
    /// `MAX_QP_WR`: a u32, as every count a queue pair keeps).
    pub(crate) sent: u32,
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
#[derive(Clone, Debug)]
pub(crate) struct RespState {
    /// Expected PSN.
    pub(crate) epsn: u32,
    /// `COMM_EST` was raised: a request arrived while the queue pair was in RTR.
    pub(crate) established: bool,
    /// (PSN, old value) of recent atomics. Allocated with the queue pair, or (lazy queues)
    /// at its first atomic, so that a queue pair that never serves one carries a pointer,
    /// not an empty `Vec`'s three words.
    atomics: Option<Box<AtomicCache>>,
}

/// The last [`ATOMIC_CACHE`] atomic results, a ring once full.
#[derive(Clone, Debug, Default)]
struct AtomicCache {
    entries: [(u32, u64); ATOMIC_CACHE],
    /// Entries filled.
    len: usize,
    /// The entry the next one takes.
    next: usize,
}

impl RespState {
    pub(crate) fn new(lazy: bool) -> RespState {
        RespState {
            epsn: 0,
            established: false,
            atomics: (!lazy).then(Box::default),
        }
    }

    /// Back to a fresh queue pair's state, keeping the cache's room (no allocation).
    pub(crate) fn reset(&mut self) {
        self.epsn = 0;
        self.established = false;
        if let Some(c) = &mut self.atomics {
            **c = AtomicCache::default();
        }
    }

    #[inline]
    pub(crate) fn remember(&mut self, psn: u32, old: u64) {
        let c = self.atomics.get_or_insert_with(Box::default);
        c.entries[c.next] = (psn, old);
        c.len = (c.len + 1).min(ATOMIC_CACHE);
        c.next = (c.next + 1) % ATOMIC_CACHE;
    }

    pub(crate) fn recall(&self, psn: u32) -> Option<u64> {
        let c = self.atomics.as_ref()?;
        c.entries[..c.len].iter().find(|a| a.0 == psn).map(|a| a.1)
    }
}

/// A reliable-connected queue pair.
///
/// Laid out in three groups (`repr(C)`, in this order), because on the threaded fabric
/// two threads work on it at once: what its own posts write (the requester side), what
/// both only read between control operations (its attributes), and what the peer's
/// requests write (the responder side), so that a send does not dirty the lines the
/// peer's next request reads. (It is not line-aligned: a group's edge may share a line.)
#[derive(Debug)]
#[repr(C)]
pub(crate) struct QpObj {
    // Written by its own posts (in `LaneCell`s: by its send lane too, `direct.rs`).
    /// Send WRs not yet executed, oldest first.
    pub(crate) sq: SendQueue,
    /// Doorbells, posts and send completions (`Qp::counters`).
    pub(crate) counters: LaneCell<QpCounters>,
    /// Send WRs of this QP completed on the direct path (kept here, not in the shared
    /// world header, so that counting dirties only a line the post writes anyway).
    pub(crate) direct_count: LaneCell<u64>,
    pub(crate) req: LaneCell<ReqState>,
    /// Executed unsignaled WRs still holding SQ slots (released by the next send CQE).
    pub(crate) unsig_done: LaneCell<u32>,

    // Read by both between control operations.
    pub(crate) qpn: u32,
    /// Its device, PD and CQs are table indices kept as u32 (a world of 65,536 nodes has
    /// millions of queue pairs); [`QpObj::dev`] and the others read them as `usize`.
    pub(super) dev_: u32,
    pub(super) pd_: u32,
    pub(super) send_cq_: u32,
    pub(super) recv_cq_: u32,
    /// Incarnation, fabric-unique; changes on RESET, ERR and crash.
    pub(crate) epoch: u32,
    /// UD: the Q_Key its receives accept, from INIT (0 before).
    pub(crate) qkey: u32,
    /// One more than the device the RTR path resolves to (read with
    /// [`QpObj::peer_dev`] and [`QpObj::leads_to`]): a device index as a u32 made
    /// non-zero, so that the `Option` takes no tag and the queue pair, of which a large
    /// world has millions, stays small.
    pub(super) peer_dev: Option<NonZeroU32>,
    /// Its device crashed: the QP is gone but for its handle.
    pub(crate) dead: bool,
    pub(crate) sig_all: bool,
    /// Its transport: RC uses the requester and responder state; UD only its
    /// queues, `qkey` and `req.next_psn` (`ud.rs`).
    pub(crate) ty: QpType,
    pub(crate) state: QpState,
    /// What the INIT transition granted the responder (nothing before it, nor after a
    /// reset): all the simulator keeps of its `InitAttr`, whose port and P_Key index it
    /// checks and has one of each.
    pub(crate) access: AccessFlags,
    pub(crate) rtr: Option<RtrAttr>,
    pub(crate) rts: Option<RtsAttr>,
    /// Receive WRs not yet consumed, oldest first (shared with the handle in threaded
    /// mode: `rq.rs`).
    pub(crate) rq: RqHome,

    // Written by the peer's requests (by the peer's send lane too, `direct.rs`).
    pub(crate) resp: LaneCell<RespState>,
}

impl QpObj {
    /// Its capacities (exactly those asked), as its queues were made with them.
    #[inline]
    pub(crate) fn cap(&self) -> QpCaps {
        let (max_send_wr, max_send_sge, max_inline_data) = self.sq.limits();
        let (max_recv_wr, max_recv_sge) = self.rq.read().limits();
        QpCaps {
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data,
        }
    }

    /// Its device.
    #[inline]
    pub(crate) fn dev(&self) -> usize {
        self.dev_ as usize
    }

    /// Its protection domain.
    #[inline]
    pub(crate) fn pd(&self) -> usize {
        self.pd_ as usize
    }

    /// The PD its receives' memory is checked against: its shared receive queue's, if it
    /// has one.
    #[inline]
    pub(crate) fn recv_pd(&self) -> usize {
        self.rq.srq().map_or(self.pd(), |(_, pd)| pd)
    }

    /// The CQ its sends complete on.
    #[inline]
    pub(crate) fn send_cq(&self) -> usize {
        self.send_cq_ as usize
    }

    /// The CQ its receives complete on.
    #[inline]
    pub(crate) fn recv_cq(&self) -> usize {
        self.recv_cq_ as usize
    }

    /// Device the RTR path resolves to.
    #[inline]
    pub(crate) fn peer_dev(&self) -> Option<usize> {
        self.peer_dev.map(|d| (d.get() - 1) as usize)
    }

    /// Whether the RTR path leads to device `dev`.
    #[inline]
    pub(crate) fn leads_to(&self, dev: u32) -> bool {
        self.peer_dev.map(NonZeroU32::get) == Some(dev.wrapping_add(1))
    }
}

pub(crate) fn invalid<T>(why: &'static str) -> Result<T, SimError> {
    Err(SimError::Invalid(why))
}

/// Total byte length of a scatter/gather list.
#[inline]
pub(crate) fn sg_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Whether `op` is a read or an atomic (uses a read/atomic credit).
#[inline]
pub(crate) fn rd_atomic(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
    )
}

/// A `WrFlushErr` completion.
pub(crate) fn flush_wc(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode,
        byte_len: 0,
        imm: None,
        qp_num,
        src_qp: 0,
        grh: false,
        sl: 0,
        slid: 0,
        pkey_index: 0,
    }
}

/// What a post's checks decided for a work request they accept.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Admitted {
    /// To be queued: its gather list names this many bytes.
    Queue(u64),
    /// To complete at once with `WrFlushErr` (the queue pair is in ERR).
    Flush,
}

/// What a post did with a work request it accepted.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Posted {
    /// Queued: the requester (or, for a receive, the responder) takes it from here.
    Queued,
    /// Completed at once with `WrFlushErr` (the queue pair is in ERR): the caller writes
    /// this completion to the queue's CQ.
    Flushed(WorkCompletion),
}

impl QpObj {
    /// Its slab index (QPN = `QPN_BASE` + index), which names its timer in the event queue.
    #[inline]
    pub(crate) fn slot(&self) -> usize {
        (self.qpn - QPN_BASE) as usize
    }

    /// Sets the state, tracing the change.
    pub(crate) fn set_state(&mut self, to: QpState, net: &mut Net) {
        let from = self.state;
        self.state = to;
        self.rq.set_accepting(self.accepts_receives());
        if from != to {
            net.trace(self.dev(), self.qpn, TraceKind::State(from, to), None, None);
        }
    }

    /// The verbs state machine: applies transition `m` to RESET, INIT, RTR or RTS (a move
    /// to ERR flushes, `World::set_err`) and returns the new state. `epoch` is the
    /// incarnation RESET starts, `peer_dev` the device an RTR path leads to.
    pub(crate) fn transition(
        &mut self,
        m: &Transition,
        epoch: u32,
        peer_dev: Option<usize>,
        net: &mut Net,
    ) -> Result<QpState, SimError> {
        use QpState::*;
        let to = match *m {
            Transition::Reset => {
                self.sq.clear();
                self.rq.clear_closed();
                *self.unsig_done = 0;
                (self.access, self.rtr, self.rts) = (AccessFlags::empty(), None, None);
                self.qkey = 0;
                (*self.req, self.peer_dev) = (ReqState::default(), None);
                self.resp.reset();
                self.epoch = epoch;
                net.sched.events.cancel_timer(self.slot());
                Reset
            }
            Transition::Error => unreachable!("a move to ERR flushes the queues: World::set_err"),
            Transition::Init(_) | Transition::Rtr(_) | Transition::Rts(_)
                if self.ty != QpType::Rc =>
            {
                return invalid("an RC transition on a UD queue pair");
            }
            Transition::InitUd(_) | Transition::RtrUd | Transition::RtsUd { .. }
                if self.ty != QpType::Ud =>
            {
                return invalid("a UD transition on an RC queue pair");
            }
            Transition::InitUd(a) => {
                if !matches!(self.state, Reset | Init) {
                    return invalid("INIT only from RESET or INIT");
                }
                if a.port != 1 || a.pkey_index != 0 {
                    return invalid("port must be 1 and pkey_index 0");
                }
                self.qkey = a.qkey;
                Init
            }
            Transition::RtrUd => {
                if self.state != Init {
                    return invalid("RTR only from INIT");
                }
                ReadyToReceive
            }
            Transition::RtsUd { sq_psn } => {
                if !matches!(self.state, ReadyToReceive | ReadyToSend) {
                    return invalid("RTS only from RTR or RTS");
                }
                if sq_psn > MAX_24 {
                    return invalid("bad sq_psn");
                }
                if self.state == ReadyToReceive {
                    self.req.next_psn = sq_psn;
                }
                ReadyToSend
            }
            Transition::Init(a) => {
                if !matches!(self.state, Reset | Init) {
                    return invalid("INIT only from RESET or INIT");
                }
                if a.port != 1 || a.pkey_index != 0 {
                    return invalid("port must be 1 and pkey_index 0");
                }
                self.access = a.access;
                Init
            }
            Transition::Rtr(a) => {
                if self.state != Init {
                    return invalid("RTR only from INIT");
                }
                if a.port != 1 || a.dest_qp_num > MAX_24 || a.rq_psn > MAX_24 {
                    return invalid("bad port, dest_qp_num or rq_psn");
                }
                if a.min_rnr_timer > 31 || usize::from(a.sgid_index) >= 2 {
                    return invalid("bad min_rnr_timer or sgid_index");
                }
                if a.sl > 15 || a.flow_label > MAX_FLOW_LABEL {
                    return invalid("sl exceeds 15 or flow_label exceeds 20 bits");
                }
                if a.max_dest_rd_atomic > MAX_QP_RD_ATOM {
                    return invalid("max_dest_rd_atomic exceeds the device's max_qp_rd_atom");
                }
                // The port's active MTU is 4096, the largest there is: any path_mtu fits.
                let a = match net.cfg.personality {
                    Personality::Hca => a,
                    Personality::Rxe => RtrAttr {
                        sl: 0,
                        hop_limit: match a.dgid {
                            Some(_) => ROCE_ROUTE_HOP_LIMIT,
                            None => a.hop_limit,
                        },
                        ..a
                    },
                };
                self.rtr = Some(a);
                self.resp.epsn = a.rq_psn;
                self.peer_dev = peer_dev
                    .and_then(|d| u32::try_from(d).ok())
                    .and_then(|d| NonZeroU32::new(d.wrapping_add(1)));
                ReadyToReceive
            }
            Transition::Rts(a) => {
                if !matches!(self.state, ReadyToReceive | ReadyToSend) {
                    return invalid("RTS only from RTR or RTS");
                }
                if a.sq_psn > MAX_24 || a.timeout > 31 || a.retry_cnt > 7 || a.rnr_retry > 7 {
                    return invalid("bad sq_psn, timeout, retry_cnt or rnr_retry");
                }
                if a.max_rd_atomic > MAX_QP_RD_ATOM {
                    return invalid("max_rd_atomic exceeds the device's max_qp_init_rd_atom");
                }
                if self.state == ReadyToReceive {
                    self.req.next_psn = a.sq_psn;
                }
                (self.req.retries, self.req.rnr_left) = (a.retry_cnt, a.rnr_retry);
                self.rts = Some(a);
                ReadyToSend
            }
        };
        self.set_state(to, net);
        Ok(to)
    }

    /// Validates and queues one send WR (see `Qp::post_send`), tracing the post. An
    /// INLINE gather entry's bytes are copied now, from where `inline_src(addr, len)`
    /// finds them (registered memory of the PD, or the caller's raw addresses); one it
    /// does not find refuses the post.
    #[inline]
    pub(crate) fn post_send<'m, const SGES: usize>(
        &mut self,
        wr: &SendWr<SGES>,
        net: &mut Net,
        mut inline_src: impl FnMut(u64, usize) -> Option<Src<'m>>,
    ) -> Result<Posted, SimError> {
        let held = self.sq.len() + *self.unsig_done as usize;
        let total = match self.admits_send(wr, net, held)? {
            Admitted::Queue(total) => total,
            Admitted::Flush => {
                self.counters.send_end(true);
                return Ok(Posted::Flushed(flush_wc(
                    wr.wr_id,
                    wr.op.wc_opcode(),
                    self.qpn,
                )));
            }
        };
        let sges = wr.sges();
        // Inline data is resolved before anything is queued (a bad source refuses the
        // post) and copied into the entry's slot.
        let mut spans = Spans::new();
        let mut inline_len = 0;
        if wr.flags.contains(SendFlags::INLINE) {
            for s in sges.iter().filter(|s| s.length > 0) {
                let n = s.length as usize;
                if !inline_src(s.addr, n).is_some_and(|src| spans.push(src).is_ok()) {
                    return invalid("inline data outside registered memory");
                }
                inline_len += n;
            }
        }
        self.queue_send(wr, total, net);
        if inline_len > 0 {
            // At most `max_inline_data` (checked above): the slot's room holds it.
            let room = self.sq.inline_mut(self.sq.len() - 1);
            copy(&spans, &[Dst::slice(&mut room[..inline_len])], inline_len);
        }
        Ok(Posted::Queued)
    }

    /// The checks of a send WR's post, with `held` send queue slots held (queued, or
    /// completed unsignaled): whether it is refused, queued (with the bytes its gather list
    /// names) or completed at once flushed (in ERR). Changes nothing.
    #[inline]
    pub(crate) fn admits_send<const SGES: usize>(
        &self,
        wr: &SendWr<SGES>,
        net: &Net,
        held: usize,
    ) -> Result<Admitted, SimError> {
        let flush = self.admits_sends()?;
        let total = self.admits_wr(wr, net, held)?;
        Ok(if flush {
            Admitted::Flush
        } else {
            Admitted::Queue(total)
        })
    }

    /// The checks of [`QpObj::admits_send`] that concern the queue pair alone, made first:
    /// whether it posts at all, and if so whether its posts complete at once flushed (in
    /// ERR).
    #[inline]
    pub(crate) fn admits_sends(&self) -> Result<bool, SimError> {
        if self.dead {
            return Err(SimError::DeviceFatal);
        }
        if !matches!(self.state, QpState::ReadyToSend | QpState::Error) {
            return invalid("QP not in RTS");
        }
        Ok(self.state == QpState::Error)
    }

    /// The checks of [`QpObj::admits_send`] that concern the request, with `held` send
    /// queue slots held: the bytes its gather list names, if they pass.
    #[inline]
    pub(crate) fn admits_wr<const SGES: usize>(
        &self,
        wr: &SendWr<SGES>,
        net: &Net,
        held: usize,
    ) -> Result<u64, SimError> {
        if usize::from(wr.num_sge) > self.sq.limits().1 as usize {
            return invalid("num_sge exceeds max_send_sge");
        }
        if !wr.sges_fit() {
            return invalid("num_sge exceeds the entries the request holds");
        }
        let (sges, op, flags) = (wr.sges(), wr.op, wr.flags);
        // An RDMA operation on a UD queue pair is refused (IBTA; the kernel's verbs), but
        // rxe's user-space provider posts it and its requester then fails it with
        // `LocQpOpErr`, the queue pair to ERR (`ud.rs`).
        let datagram = matches!(op, SendOp::Datagram { .. });
        if self.ty == QpType::Rc && datagram {
            return invalid("a datagram on an RC queue pair");
        }
        if self.ty == QpType::Ud && !datagram && net.cfg.personality == Personality::Hca {
            return invalid("a UD queue pair sends datagrams only");
        }
        if let SendOp::CompareSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. } = op {
            if !net.cfg.atomic_cap.supported() {
                return invalid("an atomic on a device without atomics (atomic_cap NONE)");
            }
            if net.cfg.personality == Personality::Rxe && remote_addr % 8 != 0 {
                return invalid("atomic remote address not 8-byte aligned (rxe)");
            }
        }
        let total = sg_len(sges);
        if flags.contains(SendFlags::INLINE) {
            use SendOp::*;
            let ok_op = matches!(
                op,
                Send | SendWithImm(_) | Write { .. } | WriteWithImm { .. } | Datagram { .. }
            );
            if !ok_op {
                return invalid("INLINE on an operation without payload to send");
            }
            if total > u64::from(self.sq.limits().2) {
                return invalid("inline data exceeds max_inline_data");
            }
        }
        if held >= self.sq.limits().0 as usize {
            return Err(SimError::QueueFull);
        }
        Ok(total)
    }

    /// Queues a send WR its post admitted (naming `total` bytes), tracing the post; an
    /// inline payload is the caller's to copy into the slot.
    pub(crate) fn queue_send<const SGES: usize>(
        &mut self,
        wr: &SendWr<SGES>,
        total: u64,
        net: &mut Net,
    ) {
        self.sq.push(wr, total);
        let kind = TraceKind::PostSend(wr.op.wc_opcode());
        net.trace(self.dev(), self.qpn, kind, None, Some(wr.wr_id));
    }

    /// Validates and queues one receive WR (see `Qp::post_recv`), tracing the post.
    #[inline]
    pub(crate) fn post_recv<const SGES: usize>(
        &mut self,
        wr: &RecvWr<SGES>,
        net: &mut Net,
    ) -> Result<Posted, SimError> {
        if self.dead {
            return Err(SimError::DeviceFatal);
        }
        if self.state == QpState::Reset {
            return invalid("QP in RESET");
        }
        if self.rq.srq().is_some() {
            return invalid("the QP takes its receives from an SRQ: post them there");
        }
        let (state, qpn) = (self.state, self.qpn);
        let posted = self.rq.with(|q| {
            q.admits(wr)?;
            if state == QpState::Error {
                return Ok(Posted::Flushed(flush_wc(wr.wr_id, WcOpcode::Recv, qpn)));
            }
            q.push_back(wr);
            Ok(Posted::Queued)
        })?;
        if let Posted::Queued = posted {
            let dev = self.dev();
            net.trace(dev, qpn, TraceKind::PostRecv, None, Some(wr.wr_id));
        }
        Ok(posted)
    }

    /// Whether it accepts receives without completing them at once (a receive posted in
    /// ERR completes flushed; in RESET it is refused; a dead one refuses everything).
    pub(crate) fn accepts_receives(&self) -> bool {
        !self.dead && !matches!(self.state, QpState::Reset | QpState::Error)
    }
}

/// A world of 65,536 nodes holds four million queue pairs (`examples/barrier_scale.rs`):
/// each byte here is 4 MB there.
#[cfg(all(test, target_pointer_width = "64"))]
#[test]
fn a_queue_pair_stays_small() {
    assert!(
        core::mem::size_of::<QpObj>() <= 336,
        "{}",
        core::mem::size_of::<QpObj>()
    );
    assert!(core::mem::size_of::<SqEntry>() <= 72);
    // The handle users hold (a node holds two per peer): the world, the number, the type,
    // the shared receive queue and the send lane (threaded mode).
    let handle = core::mem::size_of::<crate::Qp>();
    assert!(handle <= 32, "{handle}");
}
