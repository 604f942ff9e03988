//! Error completions: status on both sides, QP states, untouched memory, flushes.

mod common;

use common::*;
use zverbs_sim::*;
use WcStatus::*;

/// A pair with a 16-byte buffer on each side, registered with all access, patterned.
struct Env {
    p: Pair,
    a_buf: Buf,
    b_buf: Buf,
    a_mr: Mr,
    b_mr: Mr,
}

fn env_with(cfg: Cfg) -> Env {
    let p = pair_with(cfg);
    let (a_buf, b_buf) = (Buf::new(16, 0xaa), Buf::new(16, 0x55));
    a_buf.set(0, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let a_mr = a_buf.reg(&p.a.pd, all_access());
    let b_mr = b_buf.reg(&p.b.pd, all_access());
    Env {
        p,
        a_buf,
        b_buf,
        a_mr,
        b_mr,
    }
}

fn env() -> Env {
    env_with(Cfg::default())
}

impl Env {
    fn write(&self, off: usize, rkey: u32) -> SendOp {
        SendOp::Write {
            remote_addr: self.b_buf.addr(off),
            rkey,
        }
    }

    fn read(&self, off: usize, rkey: u32) -> SendOp {
        SendOp::Read {
            remote_addr: self.b_buf.addr(off),
            rkey,
        }
    }

    fn fadd(&self, off: usize, rkey: u32) -> SendOp {
        SendOp::FetchAdd {
            remote_addr: self.b_buf.addr(off),
            rkey,
            add: 1,
        }
    }

    /// Posts `wr` (signaled) then an unsignaled send, and returns both sides' completions.
    fn run(&self, wr: SendWr<MAX_SGE>) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
        let next = swr(99, SendOp::Send, &[], SendFlags::empty());
        self.p.a.qp.post_send(&[wr, next]).unwrap();
        (drain(&self.p.a.cq), drain(&self.p.b.cq))
    }

    /// Asserts the requester's error (and the flush of the next WR), both states, and that
    /// no byte changed.
    fn check(
        &self,
        got: &(Vec<WorkCompletion>, Vec<WorkCompletion>),
        status: WcStatus,
        b_state: QpState,
    ) {
        let (a, b) = got;
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!((a[0].wr_id, a[0].status), (1, status));
        assert_eq!(a[0].qp_num, self.p.a.qp.qp_num());
        assert_eq!(
            (a[1].wr_id, a[1].status, a[1].opcode),
            (99, WrFlushErr, WcOpcode::Send)
        );
        assert!(b.is_empty(), "{b:?}");
        assert_eq!(self.p.a.qp.state(), QpState::Error);
        assert_eq!(self.p.b.qp.state(), b_state);
        self.unchanged();
    }

    fn unchanged(&self) {
        let mut a = vec![0xaa; 16];
        a[..8].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(self.a_buf.get(), a);
        assert_eq!(self.b_buf.get(), [0x55; 16]);
    }
}

#[test]
fn local_protection_errors() {
    type Case = fn(&Env, &Buf, &Mr) -> Sge;
    let cases: [Case; 5] = [
        |e, _, _| Sge {
            lkey: e.a_mr.rkey(),
            ..sge(&e.a_mr, 0, 4)
        }, // swapped key
        |e, _, _| sge(&e.a_mr, 12, 5), // past the end
        |e, _, _| Sge {
            addr: e.a_buf.addr(0) - 1,
            ..sge(&e.a_mr, 0, 4)
        }, // before start
        |_, _, other| sge(other, 0, 4), // MR of another PD
        |e, _, _| Sge {
            lkey: e.a_mr.lkey() ^ 1,
            ..sge(&e.a_mr, 0, 4)
        }, // stale generation
    ];
    for case in cases {
        let e = env();
        let other_pd = e.p.a.ctx.alloc_pd().unwrap();
        let other_buf = Buf::new(8, 0);
        let other = other_buf.reg(&other_pd, all_access());
        let s = case(&e, &other_buf, &other);
        let got = e.run(sig(1, e.write(0, e.b_mr.rkey()), &[s]));
        assert_eq!(got.0[0].opcode, WcOpcode::RdmaWrite);
        e.check(&got, LocProtErr, QpState::ReadyToSend);
    }
}

#[test]
fn dropped_mr_key_is_stale() {
    let e = env();
    let buf = Buf::new(8, 0);
    let mr = buf.reg(&e.p.a.pd, all_access());
    let s = sge(&mr, 0, 4);
    drop(mr);
    let again = buf.reg(&e.p.a.pd, all_access()); // likely reuses the slot
    assert_ne!(again.lkey(), s.lkey);
    let got = e.run(sig(1, e.write(0, e.b_mr.rkey()), &[s]));
    e.check(&got, LocProtErr, QpState::ReadyToSend);
}

#[test]
fn read_into_memory_without_local_write() {
    let e = env();
    let ro = e.a_buf.reg(&e.p.a.pd, AccessFlags::REMOTE_READ);
    let got = e.run(sig(1, e.read(0, e.b_mr.rkey()), &[sge(&ro, 0, 8)]));
    assert_eq!(got.0[0].opcode, WcOpcode::RdmaRead);
    e.check(&got, LocProtErr, QpState::ReadyToSend);
}

#[test]
fn atomic_local_length_must_be_8() {
    let e = env();
    let got = e.run(sig(1, e.fadd(0, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 4)]));
    assert_eq!(got.0[0].opcode, WcOpcode::FetchAdd);
    e.check(&got, LocLenErr, QpState::ReadyToSend);
}

#[test]
fn unreachable_peer_is_retry_exceeded() {
    // Peer in RESET.
    let e = env();
    e.p.b.qp.modify(&Transition::Reset).unwrap();
    let got = e.run(sig(1, e.write(0, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 4)]));
    e.check(&got, RetryExcErr, QpState::Reset);

    // Wrong LID, wrong QPN, and a peer that points elsewhere.
    type Paths = fn(&Pair) -> (RtrAttr, Option<RtrAttr>);
    let wrong: [Paths; 3] = [
        |p| (rtr_attr(p.b.qp.qp_num(), 77, 4), None),
        |p| (rtr_attr(p.b.qp.qp_num() + 100, lid(&p.b), 4), None),
        |p| {
            let a = rtr_attr(p.b.qp.qp_num(), lid(&p.b), 4);
            (a, Some(rtr_attr(p.a.qp.qp_num() + 1, lid(&p.a), 4)))
        },
    ];
    for w in wrong {
        let e = env();
        let (a_rtr, b_rtr) = w(&e.p);
        for (qp, rtr) in [(&e.p.a.qp, Some(a_rtr)), (&e.p.b.qp, b_rtr)] {
            if let Some(rtr) = rtr {
                qp.modify(&Transition::Reset).unwrap();
                connect(qp, all_access(), rtr);
            }
        }
        let got = e.run(sig(1, e.write(0, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 4)]));
        e.check(&got, RetryExcErr, QpState::ReadyToSend);
    }
}

#[test]
fn remote_invalid_request() {
    // The responder QP does not grant the operation.
    let e = env_with(Cfg {
        access: AccessFlags::REMOTE_READ,
        ..Cfg::default()
    });
    let got = e.run(sig(1, e.write(0, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 4)]));
    e.check(&got, RemInvReqErr, QpState::Error);

    let e = env_with(Cfg {
        access: AccessFlags::REMOTE_WRITE,
        ..Cfg::default()
    });
    let got = e.run(sig(1, e.read(0, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 4)]));
    e.check(&got, RemInvReqErr, QpState::Error);
    let e = env_with(Cfg {
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..Cfg::default()
    });
    let got = e.run(sig(1, e.fadd(0, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 8)]));
    e.check(&got, RemInvReqErr, QpState::Error);

    // Reads and atomics refused with max_dest_rd_atomic = 0.
    let no_rd = Cfg {
        max_dest_rd_atomic: 0,
        ..Cfg::default()
    };
    let e = env_with(no_rd);
    let got = e.run(sig(1, e.read(0, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 4)]));
    e.check(&got, RemInvReqErr, QpState::Error);
    let e = env_with(no_rd);
    let got = e.run(sig(1, e.fadd(0, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 8)]));
    e.check(&got, RemInvReqErr, QpState::Error);

    // Misaligned atomic.
    let e = env();
    let got = e.run(sig(1, e.fadd(4, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 8)]));
    e.check(&got, RemInvReqErr, QpState::Error);
}

#[test]
fn remote_access_errors() {
    let acc = |a: AccessFlags| AccessFlags::LOCAL_WRITE | a;
    type Case = fn(&Env, &Mr, &Mr) -> (SendOp, u32);
    let cases: [Case; 8] = [
        |e, _, _| (e.write(0, e.b_mr.lkey()), 4),     // lkey as rkey
        |e, _, _| (e.write(14, e.b_mr.rkey()), 4),    // past the end
        |e, _, _| (e.write(0, e.b_mr.rkey() ^ 1), 4), // stale generation
        |e, no_rights, _| (e.write(0, no_rights.rkey()), 4), // MR without REMOTE_WRITE
        |e, _, other| (e.write(0, other.rkey()), 4),  // MR of another PD
        |e, no_rights, _| (e.read(0, no_rights.rkey()), 4), // MR without REMOTE_READ
        |e, no_rights, _| (e.fadd(0, no_rights.rkey()), 8), // MR without REMOTE_ATOMIC
        |e, _, _| (e.fadd(16, e.b_mr.rkey()), 8),     // atomic past the end
    ];
    for case in cases {
        let e = env();
        let no_rights = e.b_buf.reg(&e.p.b.pd, acc(AccessFlags::empty()));
        let other_pd = e.p.b.ctx.alloc_pd().unwrap();
        let other = e.b_buf.reg(&other_pd, all_access());
        let (op, len) = case(&e, &no_rights, &other);
        let got = e.run(sig(1, op, &[sge(&e.a_mr, 0, len)]));
        e.check(&got, RemAccessErr, QpState::Error);
    }
}

#[test]
fn zero_length_rdma_skips_the_rkey() {
    let e = env();
    e.p.a
        .qp
        .post_send(&[sig(1, e.write(0, 0xbad), &[]), sig(2, e.read(0, 0), &[])])
        .unwrap();
    let st: Vec<_> = drain(&e.p.a.cq)
        .iter()
        .map(|w| (w.status, w.byte_len))
        .collect();
    assert_eq!(st, [(Success, 0), (Success, 0)]);
    e.unchanged();
}

/// Posts a receive with `recv` on b, then a 6-byte send from a.
fn send_into(e: &Env, recv: &[Sge]) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
    e.p.b
        .qp
        .post_recv(&[rwr(5, recv), rwr(6, &[sge(&e.b_mr, 0, 16)])])
        .unwrap();
    e.run(sig(1, SendOp::Send, &[sge(&e.a_mr, 0, 6)]))
}

/// Checks a responder-detected send error: recv CQE `recv` then the flush of the second
/// receive, requester `req`, both in ERR, memory unchanged.
fn check_recv_error(
    e: &Env,
    got: (Vec<WorkCompletion>, Vec<WorkCompletion>),
    recv: WcStatus,
    req: WcStatus,
) {
    let b = &got.1;
    assert_eq!(b.len(), 2, "{b:?}");
    assert_eq!(
        (b[0].wr_id, b[0].status, b[0].opcode),
        (5, recv, WcOpcode::Recv)
    );
    assert_eq!(b[0].qp_num, e.p.b.qp.qp_num());
    assert_eq!(
        (b[1].wr_id, b[1].status, b[1].opcode),
        (6, WrFlushErr, WcOpcode::Recv)
    );
    e.check(&(got.0, Vec::new()), req, QpState::Error);
}

#[test]
fn receive_too_short() {
    let e = env();
    let got = send_into(&e, &[sge(&e.b_mr, 0, 2), sge(&e.b_mr, 8, 3)]);
    check_recv_error(&e, got, LocLenErr, RemInvReqErr);
}

#[test]
fn receive_protection_errors() {
    type Case = fn(&Env, &Mr, &Mr) -> Sge;
    let cases: [Case; 4] = [
        |e, _, _| Sge {
            lkey: e.b_mr.rkey(),
            ..sge(&e.b_mr, 0, 8)
        }, // rkey as lkey
        |e, _, _| sge(&e.b_mr, 12, 8),  // out of bounds
        |_, ro, _| sge(ro, 0, 8),       // no LOCAL_WRITE
        |_, _, other| sge(other, 0, 8), // another PD
    ];
    for case in cases {
        let e = env();
        let ro = e.b_buf.reg(&e.p.b.pd, AccessFlags::REMOTE_READ);
        let other_pd = e.p.b.ctx.alloc_pd().unwrap();
        let other = e.b_buf.reg(&other_pd, all_access());
        let s = case(&e, &ro, &other);
        let got = send_into(&e, &[s]);
        check_recv_error(&e, got, LocProtErr, RemOpErr);
    }
}

#[test]
fn flush_on_err_in_posting_order() {
    let e = env();
    let a = &e.p.a.qp;
    a.post_recv(&[rwr(20, &[]), rwr(21, &[])]).unwrap();
    // b has no receives: the sends wait, and the write queues behind them.
    let w = e.write(0, e.b_mr.rkey());
    let quiet = SendFlags::empty();
    let wrs = [
        sig(10, SendOp::Send, &[]),
        swr(11, SendOp::SendWithImm(1), &[], quiet),
        swr(12, w, &[sge(&e.a_mr, 0, 4)], quiet),
    ];
    a.post_send(&wrs).unwrap();
    assert!(drain(&e.p.a.cq).is_empty());
    a.modify(&Transition::Error).unwrap();
    let got: Vec<_> = drain(&e.p.a.cq)
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    use WcOpcode::*;
    let want = [
        (10, WrFlushErr, Send),
        (11, WrFlushErr, Send),
        (12, WrFlushErr, RdmaWrite),
        (20, WrFlushErr, Recv),
        (21, WrFlushErr, Recv),
    ];
    assert_eq!(got, want);
    // Again: exactly once. Posting in ERR completes at once.
    a.modify(&Transition::Error).unwrap();
    assert!(drain(&e.p.a.cq).is_empty());
    a.post_send(&[swr(30, w, &[], quiet)]).unwrap();
    a.post_recv(&[rwr(31, &[])]).unwrap();
    let got: Vec<_> = drain(&e.p.a.cq)
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    assert_eq!(got, [(30, WrFlushErr, RdmaWrite), (31, WrFlushErr, Recv)]);
    assert_eq!(e.p.b.qp.state(), QpState::ReadyToSend);
    e.unchanged();
}

#[test]
fn reset_discards_without_completions() {
    let e = env();
    e.p.a.qp.post_recv(&[rwr(1, &[])]).unwrap();
    e.p.a.qp.post_send(&[sig(2, SendOp::Send, &[])]).unwrap();
    e.p.a.qp.modify(&Transition::Reset).unwrap();
    e.p.b.qp.post_recv(&[rwr(3, &[])]).unwrap();
    assert!(drain(&e.p.a.cq).is_empty());
    assert!(drain(&e.p.b.cq).is_empty());
    assert_eq!(e.p.a.qp.state(), QpState::Reset);
}

#[test]
fn cq_overflow_errs_its_qps() {
    let e = env_with(Cfg {
        cq_depth: 2,
        ..Cfg::default()
    });
    let w = |id| sig(id, e.write(0, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 4)]);
    e.p.a.qp.post_send(&[w(1), w(2)]).unwrap();
    assert_eq!(e.p.a.qp.state(), QpState::ReadyToSend);
    e.p.a.qp.post_send(&[w(3)]).unwrap();
    assert_eq!(e.p.a.qp.state(), QpState::Error);
    let mut wc = [one_wc(); 4];
    assert_eq!(e.p.a.cq.poll(&mut wc), Err(SimError::CqOverflow));
    assert_eq!(e.p.a.cq.poll(&mut wc), Err(SimError::CqOverflow));
    assert_eq!(e.p.b.qp.state(), QpState::ReadyToSend);
    assert_eq!(e.b_buf.get()[..4], [1, 2, 3, 4]);
}

fn one_wc() -> WorkCompletion {
    WorkCompletion::EMPTY
}

/// A response of the wrong kind (`corrupt_next_response`): `BadRespErr` as the spec and
/// mlx5 say; with the rxe personality, an RDMA READ response failing a request that is not
/// a read (`FatalErr`, rxe's `check_ack`), while a read keeps `BadRespErr`. The responder
/// executed the request and stays in RTS either way.
#[test]
fn wrong_response_opcode_per_personality() {
    type Op = fn(&Env) -> SendWr<MAX_SGE>;
    let ops: [(&str, Op); 4] = [
        ("write", |e| {
            sig(1, e.write(8, e.b_mr.rkey()), &[sge(&e.a_mr, 0, 8)])
        }),
        ("send", |e| sig(1, SendOp::Send, &[sge(&e.a_mr, 0, 8)])),
        ("fetch_add", |e| {
            sig(1, e.fadd(8, e.b_mr.rkey()), &[sge(&e.a_mr, 8, 8)])
        }),
        ("read", |e| {
            sig(1, e.read(8, e.b_mr.rkey()), &[sge(&e.a_mr, 8, 8)])
        }),
    ];
    for personality in [Personality::Hca, Personality::Rxe] {
        for (what, wr) in ops {
            let cfg = FabricConfig {
                personality,
                ..FabricConfig::instant()
            };
            let fabric = Fabric::with_config(cfg, 2);
            let c = Cfg::default();
            let p = pair_in(fabric, c, rts_attr());
            let (a_buf, b_buf) = (Buf::new(16, 0xaa), Buf::new(16, 0x55));
            a_buf.set(0, &[1, 2, 3, 4, 5, 6, 7, 8]);
            let (a_mr, b_mr) = (
                a_buf.reg(&p.a.pd, all_access()),
                b_buf.reg(&p.b.pd, all_access()),
            );
            let e = Env {
                p,
                a_buf,
                b_buf,
                a_mr,
                b_mr,
            };
            e.p.b
                .qp
                .post_recv(&[rwr(7, &[sge(&e.b_mr, 0, 8)])])
                .unwrap();
            e.p.fabric.corrupt_next_response(1).unwrap();
            e.p.a.qp.post_send(&[wr(&e)]).unwrap();
            e.p.fabric.run_until_idle();
            let want = match (personality, what) {
                (Personality::Rxe, "write" | "send" | "fetch_add") => FatalErr,
                _ => BadRespErr,
            };
            let ctx = format!("{personality:?} {what}");
            assert_eq!(ids(&drain(&e.p.a.cq)), [(1, want)], "{ctx}");
            assert_eq!(e.p.a.qp.state(), QpState::Error, "{ctx}");
            assert_eq!(e.p.b.qp.state(), QpState::ReadyToSend, "{ctx}");
            let recv = drain(&e.p.b.cq);
            match what {
                "send" => assert_eq!(ids(&recv), [(7, Success)], "{ctx}"),
                _ => assert!(recv.is_empty(), "{ctx}"),
            }
        }
    }
}
