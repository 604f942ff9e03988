//! Model-based property test: random operation sequences run against the simulator through
//! the public API and against a small reference model of an RC connection. After every
//! operation both completion queues must hold exactly the completions the model predicts,
//! in order, and memory must equal the model's.
//!
//! This checks: every signaled request completes exactly once; failed unsignaled requests
//! still complete; no completion overtakes its predecessors; send-queue occupancy with
//! selective signaling; memory effects of every opcode; which side an error moves to ERR;
//! flushes.
//!
//! Cases: 10,000 by default (about 20 s in a debug build); the soak run is
//! `PROPTEST_CASES=1000000 cargo test --release --features sim --test model`.
#![cfg(feature = "sim")]

use std::collections::VecDeque;

use proptest::prelude::*;
use zverbs::provider::sim::Sim;
use zverbs::qp::{InitOptions, QpConfig, QueuePair, ReadyToSend, RtrOptions, RtsOptions};
use zverbs::{
    AccessFlags, CompletionQueue, Context, QpCaps, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion,
};

const LEN: usize = 128;
const SQ: usize = 8;
const RQ: usize = 8;

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
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        Just(Kind::Send),
        Just(Kind::SendImm),
        Just(Kind::Write),
        Just(Kind::WriteImm),
        Just(Kind::Read),
        Just(Kind::Cas),
        Just(Kind::Faa)
    ];
    let fault = prop_oneof![8 => Just(KeyFault::None), 1 => Just(KeyFault::BadLkey), 1 => Just(KeyFault::BadRkey)];
    let len = prop_oneof![3 => Just(8usize), 4 => 0usize..=48, 1 => 100usize..=140];
    let off = prop_oneof![4 => (0usize..16).prop_map(|x| x * 8), 1 => 0usize..=LEN];
    prop_oneof![
        3 => (kind, any::<bool>(), off.clone(), len.clone(), off.clone(), fault, any::<bool>()).prop_map(
            |(kind, readonly_src, off, len, roff, fault, signaled)| Op::Send { kind, readonly_src, off, len, roff, fault, signaled }
        ),
        2 => (off, len, prop::bool::weighted(0.1)).prop_map(|(off, len, bad_lkey)| Op::Recv { off, len, bad_lkey }),
    ]
}

/// Expected completion: (wr_id, status, byte_len if checked).
type Exp = (u64, WcStatus, Option<u32>);

struct Model {
    local: [u8; LEN],
    target: [u8; LEN],
    inbox: [u8; LEN],
    target_access: AccessFlags,
    a_err: bool,
    b_err: bool,
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
        if self.rq.len() >= RQ {
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
            } else if self.b_err {
                status = WcStatus::RetryExcErr; // the peer is not in RTR/RTS
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
                            self.local[off..off + len]
                                .copy_from_slice(&self.target[roff..roff + len]);
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

fn connect(sim: &Sim) -> Rig {
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
    let a = a
        .into_rtr(&eb, &RtrOptions::default())
        .unwrap()
        .into_rts(&RtsOptions::default())
        .unwrap();
    let b = b
        .into_rtr(&ea, &RtrOptions::default())
        .unwrap()
        .into_rts(&RtsOptions::default())
        .unwrap();
    Rig {
        _ctxs: ctxs,
        pds,
        cqs,
        qps: [a, b],
    }
}

fn drain(cq: &CompletionQueue<Sim>) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::EMPTY; 16];
    loop {
        let n = cq.poll(&mut wcs).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wcs[..n]);
    }
}

fn check(
    got: &[WorkCompletion],
    want: &mut VecDeque<Exp>,
    side: &str,
) -> Result<(), TestCaseError> {
    let want: Vec<Exp> = want.drain(..).collect();
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

fn run(access_bits: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let sim = Sim::with_devices(2);
    let Rig {
        _ctxs,
        pds,
        cqs,
        qps: [qa, qb],
    } = connect(&sim);
    let target_access =
        AccessFlags::LOCAL_WRITE | AccessFlags::from_bits_truncate(access_bits << 1);
    let mut local = Buf(std::array::from_fn(|i| i as u8));
    let mut readonly = Buf([0u8; LEN]);
    let mut target = Buf(std::array::from_fn(|i| (i as u8).wrapping_mul(7)));
    let mut inbox = Buf([0xEE; LEN]);
    let mut model = Model {
        local: local.0,
        target: target.0,
        inbox: inbox.0,
        target_access,
        a_err: false,
        b_err: false,
        sq: VecDeque::new(),
        unsig_done: 0,
        rq: VecDeque::new(),
        cq_a: VecDeque::new(),
        cq_b: VecDeque::new(),
    };
    // SAFETY (all four): the buffers are only read through the regions after every
    // request that could touch them completed (the connection is drained at the end), and
    // while requests are in flight Rust code does not access them.
    let local_mr = pds[0].register(&mut local.0).unwrap();
    let ro_mr =
        unsafe { pds[0].register_with_access(&mut readonly.0, AccessFlags::empty()) }.unwrap();
    let target_mr = unsafe { pds[1].register_with_access(&mut target.0, target_access) }.unwrap();
    let inbox_mr = pds[1].register(&mut inbox.0).unwrap();
    let (la, ra) = (local_mr.remote().addr, ro_mr.remote().addr);
    let (ta, ia) = (target_mr.remote().addr, inbox_mr.remote().addr);

    for (i, op) in ops.into_iter().enumerate() {
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
                let rkey = if matches!(fault, KeyFault::BadRkey) {
                    target_mr.rkey() ^ 0x40
                } else {
                    target_mr.rkey()
                };
                let remote_addr = ta + roff as u64;
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
                prop_assert_eq!(got, model.post_send(id, op), "post_send #{} accepted?", i);
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
        }
        check(&drain(&cqs[0]), &mut model.cq_a, "A")?;
        check(&drain(&cqs[1]), &mut model.cq_b, "B")?;
        let (sa, sb) = (qa.state().unwrap(), qb.state().unwrap());
        prop_assert_eq!(sa == QpState::Error, model.a_err, "A in ERR?");
        prop_assert_eq!(sb == QpState::Error, model.b_err, "B in ERR?");
    }
    // End: error both sides; every outstanding request completes exactly once, flushed.
    qa.set_error().unwrap();
    qb.set_error().unwrap();
    model.set_a_err();
    model.set_b_err();
    check(&drain(&cqs[0]), &mut model.cq_a, "A at the end")?;
    check(&drain(&cqs[1]), &mut model.cq_b, "B at the end")?;
    prop_assert_eq!(local_mr.as_slice(), &model.local[..]);
    prop_assert_eq!(target_mr.as_slice(), &model.target[..]);
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

proptest! {
    #![proptest_config(config())]

    #[test]
    fn simulator_matches_the_reference_model(access in 0u32..8, ops in prop::collection::vec(op(), 1..40)) {
        run(access, ops)?;
    }
}
