//! Faults on the wire and how RC hides or reports them: random drops, duplicates and
//! delays, scripted drops, partitions, crashes, corrupted responses; determinism of the
//! trace under all of them.

mod common;

use std::time::Duration;

use common::*;
use zverbs_sim::*;
use WcStatus::*;

/// RTS attributes with `timeout`, `retry_cnt` and `rnr_retry`.
fn rts(timeout: u8, retry_cnt: u8, rnr_retry: u8) -> RtsAttr {
    RtsAttr {
        timeout,
        retry_cnt,
        rnr_retry,
        ..rts_attr()
    }
}

/// Deep queues for the workloads below.
fn deep() -> Cfg {
    Cfg {
        cap: QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        },
        cq_depth: 256,
        ..Cfg::default()
    }
}

/// A workload: 16 receives at b, then 16 sends, 16 writes, 8 reads and 8 fetch-adds from
/// a, all signaled. Returns what each side completed and the memory of both sides.
struct Outcome {
    a: Vec<(u64, WcStatus)>,
    b: Vec<(u64, WcStatus)>,
    a_mem: Vec<u8>,
    b_mem: Vec<u8>,
    trace: String,
}

fn workload(f: Fabric) -> Outcome {
    let p = pair_in(f, deep(), rts(10, 7, 7));
    let (a_buf, b_buf) = (Buf::new(1024, 0), Buf::new(1024, 0));
    let a_init: Vec<u8> = (0..1024).map(|i| (i * 7 % 251) as u8).collect();
    a_buf.set(0, &a_init);
    b_buf.set(768, &[0x5a; 256]);
    let ma = a_buf.reg(&p.a.pd, all_access());
    let mb = b_buf.reg(&p.b.pd, all_access());
    let recvs: Vec<RecvWr<MAX_SGE>> = (0..16)
        .map(|i| rwr(100 + i, &[sge(&mb, i as usize * 16, 16)]))
        .collect();
    p.b.qp.post_recv(&recvs).unwrap();
    let mut wrs = Vec::new();
    for i in 0..16u64 {
        let off = i as usize * 16;
        wrs.push(sig(i, SendOp::Send, &[sge(&ma, off, 16)]));
        let op = SendOp::Write {
            remote_addr: b_buf.addr(256 + off),
            rkey: mb.rkey(),
        };
        wrs.push(sig(16 + i, op, &[sge(&ma, 256 + off, 16)]));
    }
    for i in 0..8u64 {
        let off = i as usize * 16;
        let read = SendOp::Read {
            remote_addr: b_buf.addr(768 + off),
            rkey: mb.rkey(),
        };
        wrs.push(sig(32 + i, read, &[sge(&ma, 512 + off, 16)]));
        let fadd = SendOp::FetchAdd {
            remote_addr: b_buf.addr(640),
            rkey: mb.rkey(),
            add: 1,
        };
        wrs.push(sig(40 + i, fadd, &[sge(&ma, 640 + off, 8)]));
    }
    p.a.qp.post_send(&wrs).unwrap();
    p.fabric.run_until_idle_max(1_000_000);
    let mut a = ids(&drain(&p.a.cq));
    a.sort_by_key(|x| x.0);
    Outcome {
        a,
        b: ids(&drain(&p.b.cq)),
        a_mem: a_buf.get(),
        b_mem: b_buf.get(),
        trace: trace_json(&p.fabric),
    }
}

/// Checks that the workload completed and moved exactly the right bytes.
fn check_workload(o: &Outcome, what: &str) {
    let want_a: Vec<_> = (0..48).map(|i| (i, Success)).collect();
    assert_eq!(o.a, want_a, "{what}: requester completions");
    let want_b: Vec<_> = (100..116).map(|i| (i, Success)).collect();
    assert_eq!(
        o.b, want_b,
        "{what}: exactly one receive completion each, in order"
    );
    let a_init: Vec<u8> = (0..1024).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(
        o.b_mem[..512],
        a_init[..512],
        "{what}: sends and writes landed"
    );
    // Eight fetch-adds of 1, each applied exactly once.
    let counter = u64::from_ne_bytes(o.b_mem[640..648].try_into().unwrap());
    assert_eq!(counter, 8, "{what}: atomics applied once each");
    let mut olds: Vec<u64> = (0..8)
        .map(|i| u64::from_ne_bytes(o.a_mem[640 + i * 16..648 + i * 16].try_into().unwrap()))
        .collect();
    olds.sort_unstable();
    assert_eq!(
        olds,
        (0..8).collect::<Vec<_>>(),
        "{what}: each old value once"
    );
    assert_eq!(o.a_mem[512..640], [0x5a; 128], "{what}: reads landed");
    assert_eq!(o.b_mem[648..768], [0; 120], "{what}: nothing else written");
}

fn faulty(seed: u64, faults: Faults) -> Outcome {
    workload(stepped(seed, faults, 2))
}

#[test]
fn no_faults_baseline() {
    let o = faulty(0, Faults::none());
    check_workload(&o, "no faults");
    assert_eq!(count(&o.trace, "retransmit"), 0);
}

#[test]
fn retransmission_hides_thirty_percent_drops() {
    let drops = Faults {
        drop: 0.3,
        ..Faults::none()
    };
    for seed in 0..5 {
        let o = faulty(seed, drops);
        check_workload(&o, &format!("seed {seed}"));
        assert!(count(&o.trace, "retransmit") > 0, "seed {seed}");
        assert!(o.trace.contains("\"reason\":\"random\""), "seed {seed}");
    }
}

#[test]
fn duplicates_never_apply_twice() {
    let dup = Faults {
        duplicate: 1.0,
        ..Faults::none()
    };
    for seed in 0..3 {
        let o = faulty(seed, dup);
        check_workload(&o, &format!("seed {seed}"));
        assert!(count(&o.trace, "duplicate") > 0);
    }
}

#[test]
fn delays_reorder_and_are_recovered() {
    let delay = Faults {
        delay: 0.5,
        max_extra_delay_ns: 20_000,
        ..Faults::none()
    };
    for seed in 0..3 {
        let o = faulty(seed, delay);
        check_workload(&o, &format!("seed {seed}"));
        assert!(
            o.trace.contains("\"reason\":\"out of order\""),
            "seed {seed}"
        );
    }
}

#[test]
fn everything_at_once() {
    let all = Faults {
        drop: 0.1,
        duplicate: 0.1,
        delay: 0.2,
        max_extra_delay_ns: 5_000,
    };
    for seed in 0..5 {
        check_workload(&faulty(seed, all), &format!("seed {seed}"));
    }
}

#[test]
fn same_seed_same_trace_bytes_different_seed_differs() {
    let all = Faults {
        drop: 0.15,
        duplicate: 0.1,
        delay: 0.2,
        max_extra_delay_ns: 5_000,
    };
    let (one, two, other) = (faulty(7, all), faulty(7, all), faulty(8, all));
    assert!(one.trace.len() > 10_000, "a substantial trace");
    assert!(one.trace == two.trace, "same seed, same bytes");
    assert!(one.trace != other.trace, "another seed, another trace");
    check_workload(&other, "seed 8");
}

#[test]
fn drop_next_is_scripted_and_counted() {
    let f = stepped(0, Faults::none(), 2);
    f.drop_next(0, 2).unwrap();
    assert_eq!(f.drop_next(5, 1), Err(SimError::NotFound));
    let o = workload(f);
    check_workload(&o, "drop_next");
    assert_eq!(o.trace.matches("\"reason\":\"scripted\"").count(), 2);
}

#[test]
fn scripted_fault_counts_saturate_instead_of_overflowing() {
    let f = stepped(0, Faults::none(), 2);
    f.drop_next(0, u32::MAX).unwrap();
    f.drop_next(0, u32::MAX).unwrap();
    f.drop_next(0, 1).unwrap();
}

/// A stepped pair with `rts` and one 64-byte buffer per side (a: 1s, b: 0s).
fn small(rts: RtsAttr) -> (Pair, Buf, Buf, Mr, Mr) {
    let p = pair_in(stepped(1, Faults::none(), 2), Cfg::default(), rts);
    let (a_buf, b_buf) = (Buf::new(64, 1), Buf::new(64, 0));
    let ma = a_buf.reg(&p.a.pd, all_access());
    let mb = b_buf.reg(&p.b.pd, all_access());
    (p, a_buf, b_buf, ma, mb)
}

fn write(id: u64, ma: &Mr, mb: &Mr, off: usize) -> SendWr<MAX_SGE> {
    let op = SendOp::Write {
        remote_addr: mb.addr() + off as u64,
        rkey: mb.rkey(),
    };
    sig(id, op, &[sge(ma, off, 8)])
}

#[test]
fn partition_heal_in_time_recovers_too_long_gives_up() {
    let (p, _a, b_buf, ma, mb) = small(rts(3, 3, 7)); // 32.8 µs timeouts
    let f = &p.fabric;
    f.partition(0, 1).unwrap();
    p.a.qp.post_send(&[write(1, &ma, &mb, 0)]).unwrap();
    f.run_for(Duration::from_micros(50)); // one timeout, one retransmission lost
    assert!(f
        .trace_events()
        .iter()
        .any(|e| e.kind == TraceKind::Drop(PacketKind::Request, DropReason::Partition)));
    f.heal(0, 1).unwrap();
    f.run_until_idle();
    assert_eq!(ids(&drain(&p.a.cq)), [(1, Success)]);
    assert_eq!(b_buf.get()[..8], [1; 8]);

    f.partition(1, 0).unwrap();
    p.a.qp
        .post_send(&[write(2, &ma, &mb, 8), write(3, &ma, &mb, 16)])
        .unwrap();
    f.run_until_idle();
    assert_eq!(ids(&drain(&p.a.cq)), [(2, RetryExcErr), (3, WrFlushErr)]);
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_eq!(
        p.b.qp.state(),
        QpState::ReadyToSend,
        "the responder never heard a thing"
    );
    assert_eq!(b_buf.get()[8..], [0; 56]);
}

#[test]
fn crash_vanishes_the_device_and_peers_time_out() {
    let (p, _a, b_buf, ma, mb) = small(rts(3, 2, 7));
    let f = &p.fabric;
    p.b.qp.post_recv(&[rwr(9, &[sge(&mb, 32, 8)])]).unwrap();
    f.crash(1).unwrap();
    assert_eq!(p.b.ctx.query_port(1).unwrap().state, PortState::Down);
    assert_eq!(p.b.qp.state(), QpState::Error);
    let refused = p.b.qp.post_send(&[write(5, &mb, &ma, 0)]).unwrap_err();
    assert!(matches!(refused.error, SimError::DeviceFatal));
    assert!(p.b.qp.post_recv(&[rwr(6, &[])]).is_err());
    p.a.qp
        .post_send(&[write(1, &ma, &mb, 0), sig(2, SendOp::Send, &[])])
        .unwrap();
    f.run_until_idle();
    assert_eq!(ids(&drain(&p.a.cq)), [(1, RetryExcErr), (2, WrFlushErr)]);
    // No completions on the crashed side: its queue fails every poll as the device's.
    let mut wc = [WorkCompletion::EMPTY; 4];
    assert_eq!(p.b.cq.poll(&mut wc), Err(SimError::DeviceFatal));
    assert_eq!(b_buf.get(), [0; 64]);
    let json = trace_json(f);
    assert_eq!(count(&json, "timeout"), 3);
    assert!(json.contains("\"reason\":\"crash\""));
}

#[test]
fn corrupted_response_is_a_bad_response_error() {
    let (p, _a, b_buf, ma, mb) = small(rts(14, 7, 7));
    p.fabric.corrupt_next_response(1).unwrap();
    p.a.qp
        .post_send(&[write(1, &ma, &mb, 0), write(2, &ma, &mb, 8)])
        .unwrap();
    p.b.qp.post_recv(&[rwr(7, &[])]).unwrap();
    p.fabric.run_until_idle();
    assert_eq!(ids(&drain(&p.a.cq)), [(1, BadRespErr), (2, WrFlushErr)]);
    assert_eq!(p.a.qp.state(), QpState::Error);
    // The responder executed both writes (the corruption hit the first ACK) and is fine.
    assert_eq!(p.b.qp.state(), QpState::ReadyToSend);
    assert!(drain(&p.b.cq).is_empty());
    assert_eq!(b_buf.get()[..16], [1; 16]);
    assert_eq!(b_buf.get()[16..], [0; 48]);
}

#[test]
fn read_without_max_rd_atomic_is_a_local_qp_operation_error() {
    let (p, a_buf, b_buf, ma, mb) = small(RtsAttr {
        max_rd_atomic: 0,
        ..rts_attr()
    });
    let read = SendOp::Read {
        remote_addr: mb.addr(),
        rkey: mb.rkey(),
    };
    let fadd = SendOp::FetchAdd {
        remote_addr: mb.addr(),
        rkey: mb.rkey(),
        add: 1,
    };
    p.a.qp
        .post_send(&[write(1, &ma, &mb, 0), sig(2, read, &[sge(&ma, 8, 8)])])
        .unwrap();
    p.a.qp
        .post_send(&[sig(3, fadd, &[sge(&ma, 16, 8)])])
        .unwrap();
    p.fabric.run_until_idle();
    assert_eq!(
        ids(&drain(&p.a.cq)),
        [(1, Success), (2, LocQpOpErr), (3, WrFlushErr)]
    );
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_eq!(
        p.b.qp.state(),
        QpState::ReadyToSend,
        "nothing reached the responder"
    );
    assert_eq!(a_buf.get(), [1; 64]);
    assert_eq!(b_buf.get()[..8], [1; 8]);
    assert_eq!(b_buf.get()[8..], [0; 56]);
}

#[test]
fn write_with_imm_bad_rkey_is_a_local_access_error_at_the_responder() {
    let (p, _a, b_buf, ma, mb) = small(rts_attr());
    p.b.qp
        .post_recv(&[rwr(7, &[sge(&mb, 0, 8)]), rwr(8, &[])])
        .unwrap();
    let bad = SendOp::WriteWithImm {
        remote_addr: mb.addr(),
        rkey: mb.rkey() ^ 1,
        imm: 5,
    };
    p.a.qp.post_send(&[sig(1, bad, &[sge(&ma, 0, 8)])]).unwrap();
    p.fabric.run_until_idle();
    assert_eq!(ids(&drain(&p.a.cq)), [(1, RemAccessErr)]);
    let got = drain(&p.b.cq);
    assert_eq!(ids(&got), [(7, LocAccessErr), (8, WrFlushErr)]);
    assert_eq!(got[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(
        (p.a.qp.state(), p.b.qp.state()),
        (QpState::Error, QpState::Error)
    );
    assert_eq!(b_buf.get(), [0; 64]);

    // The untimed fabric keeps its older answer: the receive is flushed.
    let p = pair();
    let mb = b_buf.reg(&p.b.pd, all_access());
    let ma = Buf::new(8, 1);
    let ma = ma.reg(&p.a.pd, all_access());
    p.b.qp.post_recv(&[rwr(7, &[])]).unwrap();
    let bad = SendOp::WriteWithImm {
        remote_addr: mb.addr(),
        rkey: mb.rkey() ^ 1,
        imm: 5,
    };
    p.a.qp.post_send(&[sig(1, bad, &[sge(&ma, 0, 8)])]).unwrap();
    assert_eq!(ids(&drain(&p.b.cq)), [(7, WrFlushErr)]);
}

#[test]
fn cq_overflow_in_stepped_mode_errs_the_queue_pairs() {
    let cfg = Cfg {
        cq_depth: 2,
        ..Cfg::default()
    };
    let p = pair_in(stepped(1, Faults::none(), 2), cfg, rts_attr());
    let (a_buf, b_buf) = (Buf::new(64, 1), Buf::new(64, 0));
    let ma = a_buf.reg(&p.a.pd, all_access());
    let mb = b_buf.reg(&p.b.pd, all_access());
    let wrs: Vec<_> = (0..4).map(|i| write(i, &ma, &mb, i as usize * 8)).collect();
    p.a.qp.post_send(&wrs).unwrap();
    p.fabric.run_until_idle();
    let mut wc = [one_wc(); 4];
    assert_eq!(p.a.cq.poll(&mut wc), Err(SimError::CqOverflow));
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert!(
        p.a.qp.post_send(&[write(9, &ma, &mb, 0)]).is_ok(),
        "accepted, flushed"
    );
    assert_eq!(b_buf.get()[32..], [0; 32]);
}

fn one_wc() -> WorkCompletion {
    WorkCompletion {
        status: GeneralErr,
        ..WorkCompletion::EMPTY
    }
}

/// How each error kind is provoked on requester `a` of a fresh stepped pair; returns the
/// failing work request (wr_id 1).
type Provoke = fn(&Pair, &Mr, &Mr) -> SendWr<MAX_SGE>;

#[test]
fn flush_exactly_once_in_order_after_each_error_kind() {
    let kinds: [(WcStatus, Provoke); 9] = [
        (LocLenErr, |_, ma, mb| {
            sig(
                1,
                SendOp::FetchAdd {
                    remote_addr: mb.addr(),
                    rkey: mb.rkey(),
                    add: 1,
                },
                &[sge(ma, 0, 4)],
            )
        }),
        (LocProtErr, |_, ma, _| {
            let mut s = sge(ma, 0, 8);
            s.lkey ^= 1;
            sig(1, SendOp::Send, &[s])
        }),
        (LocQpOpErr, |p, ma, mb| {
            let no_rd = RtsAttr {
                max_rd_atomic: 0,
                ..rts(3, 1, 0)
            };
            p.a.qp.modify(&Transition::Rts(no_rd)).unwrap();
            let read = SendOp::Read {
                remote_addr: mb.addr(),
                rkey: mb.rkey(),
            };
            sig(1, read, &[sge(ma, 0, 8)])
        }),
        (RemAccessErr, |_, ma, mb| {
            let op = SendOp::Write {
                remote_addr: mb.addr(),
                rkey: mb.rkey() ^ 1,
            };
            sig(1, op, &[sge(ma, 0, 8)])
        }),
        (RemInvReqErr, |_, ma, mb| {
            let op = SendOp::FetchAdd {
                remote_addr: mb.addr() + 4,
                rkey: mb.rkey(),
                add: 1,
            };
            sig(1, op, &[sge(ma, 0, 8)])
        }),
        (RemOpErr, |p, ma, mb| {
            let mut s = sge(mb, 0, 8);
            s.lkey ^= 1;
            p.b.qp.post_recv(&[rwr(50, &[s])]).unwrap();
            sig(1, SendOp::Send, &[sge(ma, 0, 8)])
        }),
        (RetryExcErr, |p, ma, mb| {
            p.fabric.link_down(1).unwrap();
            write(1, ma, mb, 0)
        }),
        (RnrRetryExcErr, |_, ma, _| {
            sig(1, SendOp::Send, &[sge(ma, 0, 8)])
        }),
        (BadRespErr, |p, ma, mb| {
            p.fabric.corrupt_next_response(1).unwrap();
            write(1, ma, mb, 0)
        }),
    ];
    for (status, provoke) in kinds {
        let (p, _a, _b, ma, mb) = small(rts(3, 1, 0));
        p.a.qp
            .post_recv(
                &(100..103)
                    .map(|id| rwr(id, &[sge(&ma, 32, 8)]))
                    .collect::<Vec<_>>(),
            )
            .unwrap();
        let first = provoke(&p, &ma, &mb);
        let rest: Vec<_> = (2..5)
            .map(|id| write(id, &ma, &mb, 8 * id as usize))
            .collect();
        p.a.qp.post_send(&[first]).unwrap();
        p.a.qp.post_send(&rest).unwrap();
        p.fabric.run_until_idle();
        // Each queue completes in posting order, every request exactly once (the two
        // queues' completions may interleave on the shared CQ).
        let got = ids(&drain(&p.a.cq));
        let sq: Vec<_> = got.iter().filter(|c| c.0 < 100).copied().collect();
        let rq: Vec<_> = got.iter().filter(|c| c.0 >= 100).copied().collect();
        let flushed = |ids: std::ops::Range<u64>| ids.map(|i| (i, WrFlushErr)).collect::<Vec<_>>();
        let mut want_sq = vec![(1, status)];
        want_sq.extend(flushed(2..5));
        assert_eq!(sq, want_sq, "{status:?}");
        assert_eq!(rq, flushed(100..103), "{status:?}");
        assert_eq!(p.a.qp.state(), QpState::Error, "{status:?}");
        // Nothing more, ever: the fabric is idle and a later poll finds nothing.
        assert_eq!(p.fabric.run_until_idle(), 0, "{status:?}");
        assert!(drain(&p.a.cq).is_empty(), "{status:?}");
    }
}

#[test]
fn out_of_range_settings_do_not_panic() {
    let cfgs = [
        FabricConfig {
            link: LinkModel {
                latency_ns: u64::MAX,
                bandwidth_gbps: 1,
            },
            faults: Faults {
                drop: f64::NAN,
                duplicate: -1.0,
                delay: 7.0,
                max_extra_delay_ns: u64::MAX,
            },
            ..FabricConfig::stepped(1)
        },
        FabricConfig {
            faults: Faults {
                drop: 2.0,
                ..Faults::none()
            },
            ..FabricConfig::stepped(2)
        },
    ];
    for cfg in cfgs {
        let p = pair_in(Fabric::with_config(cfg, 2), Cfg::default(), rts(1, 0, 0));
        p.a.qp.post_send(&[sig(1, SendOp::Send, &[])]).unwrap();
        p.fabric.run_until_idle_max(100);
        let _ = drain(&p.a.cq);
    }
    assert_eq!(
        LinkModel::default().serialisation_ns(u64::MAX),
        u64::MAX / 100
    );
}

/// Ways a responder stops answering while its peer sleeps on an RNR NAK.
#[derive(Clone, Copy, Debug)]
enum Gone {
    Err,
    Reset,
    Destroy,
    Crash,
    LinkDown,
    Partition,
}

const GONE: [Gone; 6] = [
    Gone::Err,
    Gone::Reset,
    Gone::Destroy,
    Gone::Crash,
    Gone::LinkDown,
    Gone::Partition,
];

/// `a` sends to `b`, which has no receive (RNR, `rnr_retry = 7`); then `b` goes away by
/// `how`. Returns `a`'s completions and state, and the wr_ids `b` completed (its receive
/// posted after the fact is flushed or refused, never consumed).
fn rnr_sleeper_peer_gone(p: Pair, how: Gone, settle: &dyn Fn(&Fabric)) -> Vec<(u64, WcStatus)> {
    let Pair { a, b, fabric: f } = p;
    let (a_buf, b_buf) = (Buf::new(64, 1), Buf::new(64, 0));
    let ma = a_buf.reg(&a.pd, all_access());
    let mb = b_buf.reg(&b.pd, all_access());
    a.qp.post_send(&[sig(1, SendOp::Send, &[sge(&ma, 0, 8)])])
        .unwrap();
    settle(&f);
    assert!(drain(&a.cq).is_empty(), "{how:?}: the send waits on RNR");
    assert_eq!(a.qp.state(), QpState::ReadyToSend);
    match how {
        Gone::Err => b.qp.modify(&Transition::Error).unwrap(),
        Gone::Reset => b.qp.modify(&Transition::Reset).unwrap(),
        Gone::Destroy => drop(b.qp),
        Gone::Crash => f.crash(1).unwrap(),
        Gone::LinkDown => f.link_down(1).unwrap(),
        Gone::Partition => f.partition(0, 1).unwrap(),
    }
    settle(&f);
    let got = ids(&drain(&a.cq));
    assert_eq!(a.qp.state(), QpState::Error, "{how:?}: {got:?}");
    // Later work of the requester is flushed; nothing reached the responder's memory.
    a.qp.post_send(&[sig(2, SendOp::Send, &[])]).unwrap();
    let mut all = got;
    all.extend(ids(&drain(&a.cq)));
    assert_eq!(b_buf.get(), [0; 64], "{how:?}");
    drop(mb);
    all
}

#[test]
fn rnr_sleeper_wakes_when_its_responder_goes_away() {
    // The untimed fabric (instant timers): a requester with rnr_retry = 7 sleeps on the RNR
    // NAK; when the responder leaves RTR/RTS or becomes unreachable it must retry, go
    // unanswered and give up with RETRY_EXC_ERR, as on hardware (regression: it slept on
    // and a wait timed out; fuzz seed crash-rnr-sleeper-peer-error).
    for how in GONE {
        let got = rnr_sleeper_peer_gone(pair(), how, &|_| ());
        assert_eq!(got, [(1, RetryExcErr), (2, WrFlushErr)], "instant, {how:?}");
    }
    // Real timers (stepped) reach the same outcome by polling the responder.
    for how in GONE {
        let p = pair_in(stepped(3, Faults::none(), 2), Cfg::default(), rts(3, 2, 7));
        let settle = |f: &Fabric| {
            f.run_for(Duration::from_millis(2));
        };
        let got = rnr_sleeper_peer_gone(p, how, &settle);
        assert_eq!(got, [(1, RetryExcErr), (2, WrFlushErr)], "stepped, {how:?}");
    }
}

#[test]
fn rnr_sleeper_still_sleeps_through_unrelated_changes_and_wakes_on_a_receive() {
    let p = pair();
    let (a_buf, b_buf) = (Buf::new(64, 1), Buf::new(64, 0));
    let ma = a_buf.reg(&p.a.pd, all_access());
    let mb = b_buf.reg(&p.b.pd, all_access());
    p.a.qp
        .post_send(&[sig(1, SendOp::Send, &[sge(&ma, 0, 8)])])
        .unwrap();
    // A third device going down or being cut off from a is none of this connection's
    // business; neither is healing.
    p.fabric.add_device("sim2").unwrap();
    p.fabric.link_down(2).unwrap();
    p.fabric.partition(0, 2).unwrap();
    p.fabric.heal(0, 2).unwrap();
    assert!(drain(&p.a.cq).is_empty());
    assert_eq!(p.a.qp.state(), QpState::ReadyToSend);
    p.b.qp.post_recv(&[rwr(7, &[sge(&mb, 0, 8)])]).unwrap();
    assert_eq!(ids(&drain(&p.a.cq)), [(1, Success)]);
    assert_eq!(ids(&drain(&p.b.cq)), [(7, Success)]);
    assert_eq!(b_buf.get()[..8], [1; 8]);
}
