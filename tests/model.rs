//! Model-based property test: random operation sequences run against the simulator through
//! the raw queue-pair API and against a small reference model of an RC connection (A sends,
//! B receives and is the target of RDMA). After every operation both completion queues
//! must hold exactly the completions the model predicts, in order, and at the end memory
//! must equal the model's.
//!
//! This checks: every signaled request completes exactly once; failed unsignaled requests
//! still complete; no completion overtakes its predecessors; send-queue occupancy with
//! selective signaling; memory effects of every opcode; which side an error moves to ERR;
//! flushes; and what faults do.
//!
//! # Faults
//!
//! | op | effect in the model |
//! |---|---|
//! | `Send` with no receive at B | RNR: waits (`rnr_retry` 7 retries forever) until a receive comes |
//! | `DropBurst { n }` (1..=3): the next `n` packets A sends are lost | none (retransmission hides it) |
//! | `Flap { dev, dur }`: a device's link down for `dur` < 2 ACK timeouts | stepped: none; instant: see below |
//! | `Cut`: a link down, or A and B partitioned, until `Heal` | A's next executable request, or the one waiting on RNR: `RETRY_EXC_ERR`, then A flushes |
//! | `Crash`: B's device crashes | B's queue pair vanishes (receives gone without completions, its CQ's polls fail with the device's fatal error, posts refused, reads as ERR); A as for `Cut` |
//! | `ErrB`: B moved to ERR | B's receives flushed; A as for `Cut` (a requester asleep on RNR must wake and time out) |
//!
//! Recoverable faults have "no visible effect except time" only within the retry budget:
//! each lost packet costs at most one of `retry_cnt` (7) retries (the timeout that recovers
//! it) and a flap of `d` at most `d / timeout + 2`. The recoverable faults of a case
//! together never cost more than `retry_cnt` (one that would is skipped, by the model too),
//! so none can exhaust the retries. That is conservative: progress restores them.
//!
//! # Cases and fabrics
//!
//! A case is wild or clean. Wild cases probe every error path (bad keys and rights, short
//! receives, misaligned atomics, ...), so A usually dies within a few operations; clean
//! cases post only well-formed work, so that faults meet a live connection. Each case runs
//! on one of two fabrics, chosen by the case:
//!
//! - Instant (`Sim::with_devices`): zero latency and instant timers, so everything an
//!   operation makes possible happens inside the call and the outcome is a function of the
//!   operations. Its retry window is zero: a flap is never shorter than it, so a flap kills
//!   a request waiting on RNR (it retries at once and finds nobody) like a `Cut`; an idle
//!   connection does not notice.
//! - Stepped (`FabricConfig::stepped(seed)`, 1 µs links, 5% of packets duplicated, ACK
//!   timeout 131 µs, RNR timer 0.64 ms). The harness steps it: before every post and every
//!   comparison it runs simulated time on by `settle()`, longer than any recovery or retry
//!   exhaustion, so the outcome is a function of the operations and the seed. (`auto_step`
//!   is off: an empty poll would otherwise step through a requester's endless RNR retries
//!   until the poll's event budget ran out.) Recoverable faults strike mid-traffic, `lead`
//!   ns after the previous post, with packets in flight; completions seen before things
//!   settle must be a prefix of the model's. Unrecoverable faults strike only when things
//!   have settled: with packets in flight, whether a request executed before an outage is
//!   timing the untimed model does not know (a write that executed but whose ACK was lost
//!   completes with `RETRY_EXC_ERR` although its bytes landed, on hardware too). This
//!   fabric also completes the receive of a WRITE_WITH_IMM failing B's rkey check with
//!   `LOC_ACCESS_ERR` (IB); the instant one flushes it.
//!
//! Lost responses (stepped flaps) have two effects the model cannot time, both faithful to
//! hardware, which the harness therefore avoids: a read whose response is lost executes
//! again and may see writes posted after it (the reason for `IBV_SEND_FENCE`), so cases
//! with flaps read from a region nothing writes; and an error NAK lost after B entered ERR
//! is never answered again (A completes with `RETRY_EXC_ERR`, not the remote error), so no
//! flap strikes while B's entry into ERR may be in flight. For the same reason drop bursts
//! hit A's requests only: a burst on B's egress would wait, armed, for B's next packet,
//! which may be an error NAK many operations later.
//!
//! # Running
//!
//! 10,000 cases by default, about 20 s in a debug build on two cores (set `PROPTEST_CASES`
//! to change it). Soak: `PROPTEST_CASES=1000000 cargo test --release --features sim --test
//! model`. A failure prints the minimal input, including the fabric and its seed.
#![cfg(feature = "sim")]

use std::collections::VecDeque;
use std::time::Duration;

use proptest::prelude::*;
use zverbs::provider::sim::{ack_timeout_ns, rnr_timer_ns, Fabric, FabricConfig, Faults, Sim};
use zverbs::qp::{InitOptions, QpConfig, QueuePair, ReadyToSend, RtrOptions, RtsOptions};
use zverbs::{
    AccessFlags, CompletionQueue, Context, QpCaps, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion,
};

const LEN: usize = 128;
const SQ: usize = 8;
const RQ: usize = 8;
/// `retry_cnt` of A: the retries recoverable faults may cost per case.
const RETRY_CNT: u8 = 7;
/// Stepped fabric: ACK timeout code (4.096 µs × 2^5 ≈ 131 µs) and its length.
const TIMEOUT: u8 = 5;
const TIMEOUT_NS: u64 = 4_096 << TIMEOUT;
/// B's RNR NAK timer code (0.64 ms, the default).
const MIN_RNR_TIMER: u8 = 12;

/// Simulated time after which everything an operation set off has happened: an RNR wait,
/// then retransmissions for a whole retry budget, then retry exhaustion.
fn settle() -> Duration {
    let retries = 2 * (u64::from(RETRY_CNT) + 1) * TIMEOUT_NS;
    Duration::from_nanos(rnr_timer_ns(MIN_RNR_TIMER) + retries + 100_000)
}

#[repr(align(8))]
struct Buf([u8; LEN]);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Cas,
    Faa,
}

#[derive(Clone, Copy, Debug)]
enum KeyFault {
    None,
    BadLkey,
    BadRkey,
}

/// Device 0 (A, the requester) or 1 (B, the responder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dev {
    A,
    B,
}

impl Dev {
    fn index(self) -> usize {
        match self {
            Dev::A => 0,
            Dev::B => 1,
        }
    }
}

/// A long outage.
#[derive(Clone, Copy, Debug)]
enum Cut {
    LinkDown(Dev),
    Partition,
}

/// Which fabric a case runs on.
#[derive(Clone, Copy, Debug)]
enum Fab {
    /// `Sim::with_devices(2)`.
    Instant,
    /// `FabricConfig::stepped(seed)` with duplicated packets.
    Stepped { seed: u64 },
}

#[derive(Clone, Debug)]
enum Op {
    Send {
        kind: Kind,
        readonly_src: bool,
        off: usize,
        len: usize,
        roff: usize,
        fault: KeyFault,
        signaled: bool,
    },
    Recv {
        off: usize,
        len: usize,
        bad_lkey: bool,
    },
    /// The next `n` packets A sends are lost (`lead_ns` after the previous operation).
    DropBurst { n: u32, lead_ns: u64 },
    /// `dev`'s link is down for `dur_ns`, from `lead_ns` after the previous operation.
    Flap { dev: Dev, dur_ns: u64, lead_ns: u64 },
    /// An outage until `Heal`.
    Cut(Cut),
    /// Links up, partition healed.
    Heal,
    /// B's device crashes.
    Crash,
    /// B's queue pair is moved to ERR.
    ErrB,
}

impl Op {
    /// Strikes while the previous operation's packets are in flight (stepped fabric).
    fn mid_traffic(&self) -> bool {
        matches!(self, Op::DropBurst { .. } | Op::Flap { .. })
    }
}

/// One operation of a wild or a clean case (see the module docs).
fn op(clean: bool) -> BoxedStrategy<Op> {
    let kind = prop_oneof![
        Just(Kind::Send),
        Just(Kind::SendImm),
        Just(Kind::Write),
        Just(Kind::WriteImm),
        Just(Kind::Read),
        Just(Kind::Cas),
        Just(Kind::Faa)
    ];
    let send = if clean {
        // In bounds, right keys and rights, 8-byte atomics, receives long enough.
        let len = prop_oneof![Just(8usize), 0usize..=48];
        let off = (0usize..=10).prop_map(|x| x * 8);
        (kind, off.clone(), len, off, any::<bool>())
            .prop_map(|(kind, off, len, roff, signaled)| {
                let len = if matches!(kind, Kind::Cas | Kind::Faa) {
                    8
                } else {
                    len
                };
                Op::Send {
                    kind,
                    readonly_src: false,
                    off,
                    len,
                    roff,
                    fault: KeyFault::None,
                    signaled,
                }
            })
            .boxed()
    } else {
        let fault = prop_oneof![8 => Just(KeyFault::None), 1 => Just(KeyFault::BadLkey), 1 => Just(KeyFault::BadRkey)];
        let len = prop_oneof![3 => Just(8usize), 4 => 0usize..=48, 1 => 100usize..=140];
        let off = prop_oneof![4 => (0usize..16).prop_map(|x| x * 8), 1 => 0usize..=LEN];
        (
            kind,
            any::<bool>(),
            off.clone(),
            len,
            off,
            fault,
            any::<bool>(),
        )
            .prop_map(
                |(kind, readonly_src, off, len, roff, fault, signaled)| Op::Send {
                    kind,
                    readonly_src,
                    off,
                    len,
                    roff,
                    fault,
                    signaled,
                },
            )
            .boxed()
    };
    let recv = if clean {
        (0usize..=10)
            .prop_map(|x| Op::Recv {
                off: x * 8,
                len: 48,
                bad_lkey: false,
            })
            .boxed()
    } else {
        let len = prop_oneof![3 => Just(8usize), 4 => 0usize..=48, 1 => 100usize..=140];
        let off = prop_oneof![4 => (0usize..16).prop_map(|x| x * 8), 1 => 0usize..=LEN];
        (off, len, prop::bool::weighted(0.1))
            .prop_map(|(off, len, bad_lkey)| Op::Recv { off, len, bad_lkey })
            .boxed()
    };
    let dev = prop_oneof![Just(Dev::A), Just(Dev::B)];
    let lead = 0u64..=2_500;
    let cut = prop_oneof![
        Just(Cut::LinkDown(Dev::A)),
        Just(Cut::LinkDown(Dev::B)),
        Just(Cut::Partition)
    ];
    prop_oneof![
        36 => send,
        24 => recv,
        3 => (1u32..=3, lead.clone()).prop_map(|(n, lead_ns)| Op::DropBurst { n, lead_ns }),
        3 => (dev, 1_000..=2 * TIMEOUT_NS, lead).prop_map(|(dev, dur_ns, lead_ns)| Op::Flap { dev, dur_ns, lead_ns }),
        1 => cut.prop_map(Op::Cut),
        1 => Just(Op::Heal),
        1 => Just(Op::Crash),
        1 => Just(Op::ErrB),
    ]
    .boxed()
}

/// A case: B's target access bits, the fabric, the operations.
fn case() -> impl Strategy<Value = (u32, Fab, Vec<Op>)> {
    any::<bool>().prop_flat_map(|clean| {
        let access = if clean {
            Just(7).boxed()
        } else {
            (0u32..8).boxed()
        };
        (access, fab(), prop::collection::vec(op(clean), 1..40))
    })
}

/// Expected completion: (wr_id, status, byte_len if checked).
type Exp = (u64, WcStatus, Option<u32>);

struct Model {
    local: [u8; LEN],
    target: [u8; LEN],
    /// What reads read in cases that can lose responses (nothing writes it).
    rtarget: [u8; LEN],
    /// Reads go to `rtarget` instead of `target`.
    split_reads: bool,
    inbox: [u8; LEN],
    target_access: AccessFlags,
    a_err: bool,
    b_err: bool,
    /// The receive of a WRITE_WITH_IMM failing B's rkey check completes with
    /// `LOC_ACCESS_ERR` (IB; `FabricConfig::loc_access_err`) instead of being flushed (the
    /// instant fabric).
    loc_access_err: bool,
    /// B's device crashed: its queue pair is gone.
    b_dead: bool,
    /// A and B cannot reach each other (link down or partition).
    cut: bool,
    /// Retries the case's recoverable faults may still cost.
    budget: u64,
    sq: VecDeque<(u64, Op)>,
    unsig_done: usize,
    rq: VecDeque<(u64, usize, usize, bool)>,
    cq_a: VecDeque<Exp>,
    cq_b: VecDeque<Exp>,
}

fn fits(off: usize, len: usize) -> bool {
    off + len <= LEN
}

impl Model {
    fn post_send(&mut self, id: u64, op: Op) -> Result<(), ()> {
        if self.sq.len() + self.unsig_done >= SQ {
            return Err(());
        }
        if self.a_err {
            self.cq_a.push_back((id, WcStatus::WrFlushErr, None));
            return Ok(());
        }
        self.sq.push_back((id, op));
        self.progress();
        Ok(())
    }

    fn post_recv(&mut self, id: u64, off: usize, len: usize, bad: bool) -> Result<(), ()> {
        if self.b_dead || self.rq.len() >= RQ {
            return Err(());
        }
        if self.b_err {
            self.cq_b.push_back((id, WcStatus::WrFlushErr, None));
            return Ok(());
        }
        self.rq.push_back((id, off, len, bad));
        self.progress();
        Ok(())
    }

    /// Takes `cost` retries from the budget if it has them.
    fn spend(&mut self, cost: u64) -> bool {
        let ok = cost <= self.budget;
        if ok {
            self.budget -= cost;
        }
        ok
    }

    /// A long outage begins: A's next request to go out meets silence.
    fn cut(&mut self) {
        self.cut = true;
        self.progress();
    }

    fn heal(&mut self) {
        self.cut = false;
    }

    /// B's device crashes: its receives vanish without completions.
    fn crash_b(&mut self) {
        self.b_dead = true;
        self.b_err = true;
        self.rq.clear();
        self.progress();
    }

    /// B is moved to ERR.
    fn err_b(&mut self) {
        self.set_b_err();
        self.progress();
    }

    fn progress(&mut self) {
        while !self.a_err {
            let Some((
                id,
                Op::Send {
                    kind,
                    readonly_src,
                    off,
                    len,
                    roff,
                    fault,
                    signaled,
                },
            )) = self.sq.front().cloned()
            else {
                return;
            };
            let atomic = matches!(kind, Kind::Cas | Kind::Faa);
            let needs_recv = matches!(kind, Kind::Send | Kind::SendImm | Kind::WriteImm);
            let bad_l = matches!(fault, KeyFault::BadLkey);
            let bad_r = matches!(fault, KeyFault::BadRkey);
            // Requester-local checks.
            let mut status = WcStatus::Success;
            let mut recv_done: Option<Exp> = None;
            let writes_local = matches!(kind, Kind::Read) || atomic;
            if atomic && len != 8 {
                status = WcStatus::LocLenErr;
            } else if len > 0 && (bad_l || !fits(off, len) || (writes_local && readonly_src)) {
                status = WcStatus::LocProtErr;
            } else if self.b_err || self.cut {
                // Nobody answers: the peer is not in RTR/RTS, gone, or cut off.
                status = WcStatus::RetryExcErr;
            } else {
                if needs_recv && self.rq.is_empty() {
                    return; // waits for a receive (RNR, retried forever)
                }
                let access_ok = |need: AccessFlags, n: usize| {
                    !bad_r && self.target_access.contains(need) && fits(roff, n)
                };
                match kind {
                    Kind::Send | Kind::SendImm => {
                        let &(rid, roff_r, rlen, rbad) = self.rq.front().unwrap();
                        let mut rstatus = WcStatus::Success;
                        if rlen < len {
                            rstatus = WcStatus::LocLenErr;
                            status = WcStatus::RemInvReqErr;
                        } else if len > 0 && rlen > 0 && (rbad || !fits(roff_r, rlen)) {
                            rstatus = WcStatus::LocProtErr;
                            status = WcStatus::RemOpErr;
                        } else {
                            let src = if readonly_src { [0u8; LEN] } else { self.local };
                            self.inbox[roff_r..roff_r + len].copy_from_slice(&src[off..off + len]);
                        }
                        self.rq.pop_front();
                        recv_done = Some((rid, rstatus, Some(len as u32)));
                    }
                    Kind::Write | Kind::WriteImm => {
                        if len > 0 && !access_ok(AccessFlags::REMOTE_WRITE, len) {
                            status = WcStatus::RemAccessErr;
                            if kind == Kind::WriteImm && self.loc_access_err {
                                let (rid, ..) = self.rq.pop_front().unwrap();
                                recv_done = Some((rid, WcStatus::LocAccessErr, Some(0)));
                            }
                        } else {
                            let src = if readonly_src { [0u8; LEN] } else { self.local };
                            self.target[roff..roff + len].copy_from_slice(&src[off..off + len]);
                            if kind == Kind::WriteImm {
                                let (rid, ..) = self.rq.pop_front().unwrap();
                                recv_done = Some((rid, WcStatus::Success, Some(len as u32)));
                            }
                        }
                    }
                    Kind::Read => {
                        if len > 0 && !access_ok(AccessFlags::REMOTE_READ, len) {
                            status = WcStatus::RemAccessErr;
                        } else {
                            let src = if self.split_reads {
                                self.rtarget
                            } else {
                                self.target
                            };
                            self.local[off..off + len].copy_from_slice(&src[roff..roff + len]);
                        }
                    }
                    Kind::Cas | Kind::Faa => {
                        if roff % 8 != 0 {
                            status = WcStatus::RemInvReqErr;
                        } else if !access_ok(AccessFlags::REMOTE_ATOMIC, 8) {
                            status = WcStatus::RemAccessErr;
                        } else {
                            let old =
                                u64::from_ne_bytes(self.target[roff..roff + 8].try_into().unwrap());
                            let new = if kind == Kind::Faa {
                                old.wrapping_add(ADD)
                            } else if old == CMP {
                                SWAP
                            } else {
                                old
                            };
                            self.target[roff..roff + 8].copy_from_slice(&new.to_ne_bytes());
                            self.local[off..off + 8].copy_from_slice(&old.to_ne_bytes());
                        }
                    }
                }
            }
            self.sq.pop_front();
            if let Some(r) = recv_done {
                self.cq_b.push_back(r);
            }
            if signaled || status != WcStatus::Success {
                self.unsig_done = 0;
                self.cq_a.push_back((id, status, None));
            } else {
                self.unsig_done += 1;
            }
            if status != WcStatus::Success {
                self.set_a_err();
                if matches!(
                    status,
                    WcStatus::RemInvReqErr | WcStatus::RemAccessErr | WcStatus::RemOpErr
                ) {
                    self.set_b_err();
                }
            }
        }
    }

    fn set_a_err(&mut self) {
        self.a_err = true;
        self.unsig_done = 0;
        for (id, _) in self.sq.drain(..) {
            self.cq_a.push_back((id, WcStatus::WrFlushErr, None));
        }
    }

    fn set_b_err(&mut self) {
        self.b_err = true;
        for (id, ..) in self.rq.drain(..) {
            self.cq_b.push_back((id, WcStatus::WrFlushErr, None));
        }
    }
}

const ADD: u64 = 3;
const CMP: u64 = 0;
const SWAP: u64 = 0x1111_2222_3333_4444;

/// Two devices' worth of objects: contexts, PDs, CQs, and two connected queue pairs.
struct Rig {
    _ctxs: Vec<Context<Sim>>,
    pds: [zverbs::ProtectionDomain<Sim>; 2],
    cqs: [CompletionQueue<Sim>; 2],
    qps: [QueuePair<Sim, ReadyToSend>; 2],
}

fn connect(sim: &Sim, rts: &RtsOptions) -> Rig {
    let ctxs = vec![
        Context::open(sim, "sim0").unwrap(),
        Context::open(sim, "sim1").unwrap(),
    ];
    let pds = [ctxs[0].alloc_pd().unwrap(), ctxs[1].alloc_pd().unwrap()];
    let cqs = [
        CompletionQueue::create(&ctxs[0], 64).unwrap(),
        CompletionQueue::create(&ctxs[1], 64).unwrap(),
    ];
    let caps = QpCaps {
        max_send_wr: SQ as u32,
        max_recv_wr: RQ as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let cfg = QpConfig {
        caps,
        ..QpConfig::default()
    };
    let mk = |i: usize| {
        QueuePair::create(&ctxs[i], &pds[i], &cqs[i], &cqs[i], &cfg)
            .unwrap()
            .into_init(&InitOptions::default())
            .unwrap()
    };
    let (a, b) = (mk(0), mk(1));
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let rtr = RtrOptions {
        min_rnr_timer: MIN_RNR_TIMER,
        ..RtrOptions::default()
    };
    let a = a.into_rtr(&eb, &rtr).unwrap().into_rts(rts).unwrap();
    let b = b.into_rtr(&ea, &rtr).unwrap().into_rts(rts).unwrap();
    Rig {
        _ctxs: ctxs,
        pds,
        cqs,
        qps: [a, b],
    }
}

/// Every completion in `cq`; none from a queue of a `dead` device, whose polls fail with
/// the device's fatal error (and only there).
fn drain(cq: &CompletionQueue<Sim>, dead: bool) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::EMPTY; 16];
    loop {
        let n = match cq.poll(&mut wcs) {
            Err(e) if dead && e.kind() == zverbs::ErrorKind::DeviceFatal => 0,
            r => r.unwrap(),
        };
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wcs[..n]);
    }
}

/// The completions in `cq` must be the first ones `want` expects, in order; with `all`,
/// exactly all of them. Removes the ones seen from `want`.
fn check(
    cq: &CompletionQueue<Sim>,
    want: &mut VecDeque<Exp>,
    (all, dead): (bool, bool),
    side: &str,
) -> Result<(), TestCaseError> {
    let got = drain(cq, dead);
    let n = if all { want.len() } else { got.len() };
    let want: Vec<Exp> = want.drain(..n.min(want.len())).collect();
    let got: Vec<Exp> = got
        .iter()
        .zip(
            want.iter()
                .map(|w| w.2.is_some())
                .chain(std::iter::repeat(false)),
        )
        .map(|(w, with_len)| (w.wr_id, w.status, with_len.then_some(w.byte_len)))
        .collect();
    prop_assert_eq!(got, want, "completions on {}", side);
    Ok(())
}

fn ns(n: u64) -> Duration {
    Duration::from_nanos(n)
}

/// Links up and partitions healed.
fn heal(f: &Fabric) {
    f.link_up(0).unwrap();
    f.link_up(1).unwrap();
    f.heal(0, 1).unwrap();
}

fn run(access_bits: u32, fab: Fab, ops: Vec<Op>) -> Result<(), TestCaseError> {
    assert_eq!(ack_timeout_ns(TIMEOUT), Some(TIMEOUT_NS));
    let retries = RtsOptions {
        retry_cnt: RETRY_CNT,
        rnr_retry: 7,
        ..RtsOptions::default()
    };
    let (sim, rts, stepped) = match fab {
        Fab::Instant => (Sim::with_devices(2), retries, false),
        Fab::Stepped { seed } => {
            let cfg = FabricConfig {
                faults: Faults {
                    duplicate: 0.05,
                    ..Faults::none()
                },
                auto_step: false,
                ..FabricConfig::stepped(seed)
            };
            let rts = RtsOptions {
                timeout: TIMEOUT,
                ..retries
            };
            (Sim::with_config(cfg, 2), rts, true)
        }
    };
    let f = sim.fabric().clone();
    let Rig {
        _ctxs,
        pds,
        cqs,
        qps: [qa, qb],
    } = connect(&sim, &rts);
    let target_access =
        AccessFlags::LOCAL_WRITE | AccessFlags::from_bits_truncate(access_bits << 1);
    let split_reads = ops.iter().any(|o| matches!(o, Op::Flap { .. }));
    let mut local = Buf(std::array::from_fn(|i| i as u8));
    let mut readonly = Buf([0u8; LEN]);
    let mut target = Buf(std::array::from_fn(|i| (i as u8).wrapping_mul(7)));
    let mut rtarget = Buf(std::array::from_fn(|i| (i as u8).wrapping_mul(13) ^ 0x5a));
    let mut inbox = Buf([0xEE; LEN]);
    let mut model = Model {
        local: local.0,
        target: target.0,
        rtarget: rtarget.0,
        split_reads,
        inbox: inbox.0,
        target_access,
        a_err: false,
        b_err: false,
        loc_access_err: stepped,
        b_dead: false,
        cut: false,
        budget: u64::from(RETRY_CNT),
        sq: VecDeque::new(),
        unsig_done: 0,
        rq: VecDeque::new(),
        cq_a: VecDeque::new(),
        cq_b: VecDeque::new(),
    };
    // SAFETY (all five): the buffers are only read through the regions after every
    // request that could touch them completed (the connection is drained at the end), and
    // while requests are in flight Rust code does not access them.
    let local_mr = pds[0].register(&mut local.0).unwrap();
    let ro_mr =
        unsafe { pds[0].register_with_access(&mut readonly.0, AccessFlags::empty()) }.unwrap();
    let target_mr = unsafe { pds[1].register_with_access(&mut target.0, target_access) }.unwrap();
    let rtarget_mr = unsafe { pds[1].register_with_access(&mut rtarget.0, target_access) }.unwrap();
    let inbox_mr = pds[1].register(&mut inbox.0).unwrap();
    let (la, ra) = (local_mr.remote().addr, ro_mr.remote().addr);
    let (ta, ia) = (target_mr.remote().addr, inbox_mr.remote().addr);
    let rta = rtarget_mr.remote().addr;
    // Whether B was in ERR when things last settled (see the module docs on lost NAKs).
    let mut b_err_settled = false;

    for (i, op) in ops.iter().enumerate() {
        let id = i as u64;
        match op.clone() {
            Op::Send {
                kind,
                readonly_src,
                off,
                len,
                roff,
                fault,
                signaled,
            } => {
                let (base, key) = if readonly_src {
                    (ra, ro_mr.lkey())
                } else {
                    (la, local_mr.lkey())
                };
                let lkey = if matches!(fault, KeyFault::BadLkey) {
                    key ^ 0x40
                } else {
                    key
                };
                let (tbase, tkey) = if kind == Kind::Read && split_reads {
                    (rta, rtarget_mr.rkey())
                } else {
                    (ta, target_mr.rkey())
                };
                let rkey = if matches!(fault, KeyFault::BadRkey) {
                    tkey ^ 0x40
                } else {
                    tkey
                };
                let remote_addr = tbase + roff as u64;
                let sop = match kind {
                    Kind::Send => SendOp::Send,
                    Kind::SendImm => SendOp::SendWithImm(id as u32),
                    Kind::Write => SendOp::Write { remote_addr, rkey },
                    Kind::WriteImm => SendOp::WriteWithImm {
                        remote_addr,
                        rkey,
                        imm: id as u32,
                    },
                    Kind::Read => SendOp::Read { remote_addr, rkey },
                    Kind::Cas => SendOp::CompareSwap {
                        remote_addr,
                        rkey,
                        compare: CMP,
                        swap: SWAP,
                    },
                    Kind::Faa => SendOp::FetchAdd {
                        remote_addr,
                        rkey,
                        add: ADD,
                    },
                };
                let flags = if signaled {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                };
                let mut wr = SendWr::<1>::new(id, sop, flags);
                wr.sg_list[0] = Sge {
                    addr: base + off as u64,
                    length: len as u32,
                    lkey,
                };
                wr.num_sge = 1;
                // SAFETY: see above; bad ranges are refused by the device's checks.
                let got = unsafe { qa.post_send(&[wr]) }.map_err(|_| ());
                prop_assert_eq!(
                    got,
                    model.post_send(id, op.clone()),
                    "post_send #{} accepted?",
                    i
                );
            }
            Op::Recv { off, len, bad_lkey } => {
                let key = if bad_lkey {
                    inbox_mr.lkey() ^ 0x40
                } else {
                    inbox_mr.lkey()
                };
                let mut wr = RecvWr::<1>::new(id);
                wr.sg_list[0] = Sge {
                    addr: ia + off as u64,
                    length: len as u32,
                    lkey: key,
                };
                wr.num_sge = 1;
                // SAFETY: see above.
                let got = unsafe { qb.post_recv(&[wr]) }.map_err(|_| ());
                prop_assert_eq!(
                    got,
                    model.post_recv(id, off, len, bad_lkey),
                    "post_recv #{} accepted?",
                    i
                );
            }
            Op::DropBurst { n, lead_ns } => {
                if model.spend(u64::from(n)) {
                    if stepped {
                        f.run_for(ns(lead_ns));
                    }
                    f.drop_next(Dev::A.index(), n).unwrap();
                }
            }
            Op::Flap {
                dev,
                dur_ns,
                lead_ns,
            } => {
                // Not while an outage lasts (the flap would end it), nor while B's entry
                // into ERR may be in flight (a lost NAK is never answered again).
                let calm = !model.cut && (b_err_settled || !model.b_err);
                if calm && model.spend(dur_ns / TIMEOUT_NS + 2) {
                    let d = dev.index();
                    if stepped {
                        f.run_for(ns(lead_ns));
                        f.link_down(d).unwrap();
                        f.run_for(ns(dur_ns));
                        f.link_up(d).unwrap();
                    } else {
                        // The instant fabric's retry window is zero: longer than any flap.
                        f.link_down(d).unwrap();
                        f.link_up(d).unwrap();
                        model.cut();
                        model.heal();
                    }
                }
            }
            Op::Cut(c) => {
                match c {
                    Cut::LinkDown(dev) => f.link_down(dev.index()).unwrap(),
                    Cut::Partition => f.partition(0, 1).unwrap(),
                }
                model.cut();
            }
            Op::Heal => {
                heal(&f);
                model.heal();
            }
            Op::Crash => {
                f.crash(Dev::B.index()).unwrap();
                model.crash_b();
            }
            Op::ErrB => {
                let got = qb.set_error().is_ok();
                prop_assert_eq!(got, !model.b_dead, "set_error on B #{} accepted?", i);
                if !model.b_dead {
                    model.err_b();
                }
            }
        }
        // Stepped: settle unless a fault is to strike the traffic in flight.
        let settled = !stepped || !ops.get(i + 1).is_some_and(Op::mid_traffic);
        if stepped && settled {
            f.run_for(settle());
        }
        check(&cqs[0], &mut model.cq_a, (settled, false), "A")?;
        check(&cqs[1], &mut model.cq_b, (settled, model.b_dead), "B")?;
        if settled {
            b_err_settled = model.b_err;
            let (sa, sb) = (qa.state().unwrap(), qb.state().unwrap());
            prop_assert_eq!(sa == QpState::Error, model.a_err, "A in ERR after #{}?", i);
            prop_assert_eq!(sb == QpState::Error, model.b_err, "B in ERR after #{}?", i);
        }
    }
    // End: error both sides; every outstanding request completes exactly once, flushed.
    qa.set_error().unwrap();
    prop_assert_eq!(qb.set_error().is_ok(), !model.b_dead);
    model.set_a_err();
    model.set_b_err();
    check(&cqs[0], &mut model.cq_a, (true, false), "A at the end")?;
    check(
        &cqs[1],
        &mut model.cq_b,
        (true, model.b_dead),
        "B at the end",
    )?;
    prop_assert_eq!(local_mr.as_slice(), &model.local[..]);
    prop_assert_eq!(target_mr.as_slice(), &model.target[..]);
    prop_assert_eq!(rtarget_mr.as_slice(), &model.rtarget[..]);
    prop_assert_eq!(inbox_mr.as_slice(), &model.inbox[..]);
    prop_assert_eq!(ro_mr.as_slice(), &[0u8; LEN][..]);
    Ok(())
}

/// 10,000 cases unless `PROPTEST_CASES` says otherwise.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig::with_cases(cases)
}

fn fab() -> impl Strategy<Value = Fab> {
    prop_oneof![
        Just(Fab::Instant),
        any::<u64>().prop_map(|seed| Fab::Stepped { seed })
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn simulator_matches_the_reference_model(
        (access, fab, ops) in case(),
    ) {
        run(access, fab, ops).map_err(|e| match (e, fab) {
            (TestCaseError::Fail(why), Fab::Stepped { seed }) => {
                TestCaseError::fail(format!("{why} (stepped fabric, seed {seed})"))
            }
            (e, _) => e,
        })?;
    }
}
