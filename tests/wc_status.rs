//! Every completion status an RC queue pair can produce, one test each, through the public
//! API on the simulator. Each test asserts the status, the queue pair states after it
//! (both sides where meaningful), and that no byte outside the permitted range changed
//! (buffers start filled with a pattern and are compared afterwards).
//!
//! The tests run single-threaded on a stepped fabric (`FabricConfig::stepped(seed)`):
//! blocking calls make progress because a poll that finds nothing steps the fabric. The
//! seed is `ZVERBS_SIM_SEED` if set, else a fixed default; a failing test prints it.
//!
//! How each status is provoked:
//!
//! | status | provoked by | requester QP | responder QP |
//! |---|---|---|---|
//! | `SUCCESS` | every opcode over a lossy, duplicating, reordering wire | RTS | RTS |
//! | `LOC_LEN_ERR` | a receive shorter than the message (responder); an atomic with a 4-byte local buffer (requester) | ERR | ERR / RTS |
//! | `LOC_QP_OP_ERR` | a read posted on a QP whose RTS `max_rd_atomic` is 0 | ERR | RTS |
//! | `LOC_PROT_ERR` | a send from memory of another PD; a read into memory without LOCAL_WRITE | ERR | RTS |
//! | `WR_FLUSH_ERR` | posting on an ERR QP; receives outstanding when a QP enters ERR; requests behind a failed one | ERR | ERR |
//! | `BAD_RESP_ERR` | `Fabric::corrupt_next_response` on the responder's device | ERR | RTS |
//! | `LOC_ACCESS_ERR` | the receive consumed by a WRITE_WITH_IMM whose rkey check fails | ERR | ERR |
//! | `REM_INV_REQ_ERR` | a misaligned atomic; an opcode the responder QP does not allow; a read to `max_dest_rd_atomic` 0 | ERR | ERR |
//! | `REM_ACCESS_ERR` | bad rkey, lkey as rkey, a region without the right, a range past the region | ERR | ERR |
//! | `REM_OP_ERR` | a send whose receive names memory of another PD at the responder | ERR | ERR |
//! | `RETRY_EXC_ERR` | link down, partition, crash of the responder's device | ERR | RTS / gone |
//! | `RNR_RETRY_EXC_ERR` | a send with no receive posted and `rnr_retry` 2 | ERR | RTS |
//! | `FATAL_ERR` | `Fabric::corrupt_next_response` on the responder's device, rxe personality | ERR | RTS |
//!
//! `LOC_ACCESS_ERR` follows the verbs documentation of `IBV_WC_LOC_ACCESS_ERR` ("a
//! protection error occurred on a local data buffer during the processing of a RDMA Write
//! with Immediate operation sent from the remote node") and IB responder class C errors;
//! rxe reports `REM_ACCESS_ERR` on that receive instead. The untimed `Sim::with_devices`
//! fabric flushes that receive (`WR_FLUSH_ERR`), as the simulator did before timing; a
//! fabric built from a `FabricConfig` reports `LOC_ACCESS_ERR`.
//!
//! `FATAL_ERR` is provoked as soft-RoCE reports it, on a fabric with the rxe personality:
//! rxe's completer fails a request answered by an RDMA READ response when the request is
//! not a read (`check_ack` in the kernel's `drivers/infiniband/sw/rxe/rxe_comp.c`); the same
//! corrupted response gives `BAD_RESP_ERR` on the default (HCA) personality. Other devices
//! report `FATAL_ERR` for catastrophic queue pair or device errors (irdma, bnxt_re, cxgb4);
//! mlx5 never does.
//!
//! The statuses no test provokes, and why (the full argument, with citations, is in the
//! `zverbs::WcStatus` docs); `raw_values_of_statuses_rc_never_reports` pins their verbs values:
//!
//! | status | why no RC test provokes it |
//! |---|---|
//! | `LOC_EEC_OP_ERR`, `LOC_RDD_VIOL_ERR`, `REM_INV_RD_REQ_ERR`, `INV_EECN_ERR`, `INV_EEC_STATE_ERR` | Reliable Datagram only (EE contexts, RD domains); Linux verbs has no RD queue pair (`enum ibv_qp_type`, rdma-core `libibverbs/verbs.h`) |
//! | `MW_BIND_ERR` | completes only a memory-window bind, local invalidate or fast registration request (mlx5 `mlx5_handle_error_cqe`); zverbs has no `ibv_alloc_mw` / `ibv_bind_mw` and no such `SendOp`, so no zverbs program can post one |
//! | `REM_ABORT_ERR` | defined for UD or UC receives from an SRQ (RDMAmojo's `ibv_poll_cq` reference, in `ibverbs-sys`'s `ibv_wc::error` docs); no AETH NAK code means "aborted", so an RC requester never gets it; mlx5 reports it on a shared-receive-queue receive whose message was abandoned half-way (lost middle packet, ODP fault; UCX `uct_rc_mlx5_iface_check_rx_completion`): zverbs has no SRQ or ODP, and the simulator moves messages whole |
//! | `RESP_TIMEOUT_ERR` | not an RC status: an unanswered RC request ends in `RETRY_EXC_ERR`; only EFA's SRD (`providers/efa/verbs.c`) and the kernel's MAD layer (UD, `timeout_sends`) report it |
//! | `GENERAL_ERR` | a provider's catch-all for vendor syndromes without a verbs name (`default:` in `mlx5_handle_error_cqe`); no RC error of mlx5 or rxe maps to it, and zverbs keeps an unknown value as `WcStatus::Unknown` instead |
//! | `TM_ERR`, `TM_RNDV_INCOMPLETE` | tag-matching shared receive queues only (mlx5 `handle_tag_matching`); zverbs has no SRQ |
#![cfg(feature = "sim")]

mod common;

use std::time::Duration;

use common::{pair_on, pattern, Side, ALL};
use zverbs::provider::sim::{
    ack_timeout_ns, rnr_timer_ns, FabricConfig, Faults, Sim, SimError, TraceKind,
};
use zverbs::qp::{InitOptions, RtrOptions, RtsOptions};
use zverbs::{
    AccessFlags, ChannelConfig, Error, ErrorKind, QpState, RemoteRegion, SendFlags, SendOp,
    WcOpcode, WcStatus,
};
use zverbs_sim::Personality;

/// The seed of this run; prints itself if the test fails.
struct Seed(u64);

impl Seed {
    fn new() -> Seed {
        let env = std::env::var("ZVERBS_SIM_SEED").ok();
        Seed(env.and_then(|s| s.parse().ok()).unwrap_or(0x5EED))
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "failed with seed {0}; rerun with ZVERBS_SIM_SEED={0}",
                self.0
            );
        }
    }
}

type S = Side<16>;

/// A stepped two-device fabric with `faults` and the trace on.
fn fabric(seed: &Seed, faults: Faults) -> Sim {
    let cfg = FabricConfig {
        faults,
        trace: true,
        ..FabricConfig::stepped(seed.0)
    };
    Sim::with_config(cfg, 2)
}

/// Short timers so the simulated time of failures stays small: ACK timeout code 10
/// (4.2 ms), 3 retries, 2 RNR retries.
fn rts() -> RtsOptions {
    RtsOptions {
        timeout: 10,
        retry_cnt: 3,
        rnr_retry: 2,
        ..RtsOptions::default()
    }
}

fn config(rts: RtsOptions) -> ChannelConfig {
    ChannelConfig {
        rts,
        ..ChannelConfig::default()
    }
}

/// A connected pair on a fault-free stepped fabric, both sides with [`rts`].
fn pair(seed: &Seed) -> (Sim, S, S) {
    pair_with(seed, config(rts()), config(rts()))
}

fn pair_with(seed: &Seed, a: ChannelConfig, b: ChannelConfig) -> (Sim, S, S) {
    let sim = fabric(seed, Faults::none());
    let (sa, sb) = pair_on(&sim, &a, &b);
    (sim, sa, sb)
}

fn status(e: &Error<SimError>) -> WcStatus {
    assert_eq!(e.kind(), ErrorKind::Completion, "{e}");
    e.completion().expect("a completion error").status
}

fn states(a: &S, b: &S) -> (QpState, QpState) {
    let st = |s: &S| s.ch.queue_pair().state().unwrap();
    (st(a), st(b))
}

use QpState::{Error as Err, ReadyToSend as Rts};

#[test]
fn success() {
    let seed = Seed::new();
    let faults = Faults {
        drop: 0.1,
        duplicate: 0.1,
        delay: 0.2,
        max_extra_delay_ns: 3_000,
    };
    let sim = fabric(&seed, faults);
    let (mut a, mut b): (S, S) = pair_on(&sim, &config(rts()), &config(rts()));
    let (mut src, mut inbox) = (pattern(32, 1), vec![0xEE; 32]);
    let (mut target, mut local) = (pattern(64, 50), vec![0xAA; 24]);
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut inbox_mr = b.pd.register(&mut inbox).unwrap();
    // SAFETY: `target` is read only after the operations on it completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let mut local_mr = a.pd.register(&mut local).unwrap();
    let remote = |r: std::ops::Range<u64>| target_mr.remote().slice(r).unwrap();

    let sge = inbox_mr.slice_mut(8..24).unwrap().sge();
    // SAFETY: `inbox` is not accessed until the receive is redeemed below.
    let recv = unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap();
    a.ch.send([src_mr.slice(..16).unwrap()]).unwrap();
    let got = b.ch.wait(recv).unwrap();
    assert_eq!(
        (got.status, got.opcode, got.byte_len),
        (WcStatus::Success, WcOpcode::Recv, 16)
    );
    a.ch.write([src_mr.slice(16..24).unwrap()], &remote(16..24))
        .unwrap();
    a.ch.read([local_mr.slice_mut(..8).unwrap()], &remote(32..40))
        .unwrap();
    let old =
        a.ch.fetch_add(local_mr.slice_mut(8..16).unwrap(), &remote(48..56), 5);
    let old = old.unwrap();
    assert_eq!(states(&a, &b), (Rts, Rts));

    let (p1, p50) = (pattern(32, 1), pattern(64, 50));
    assert_eq!(src_mr.as_slice(), &p1[..], "the source is only read");
    let mut want = [0xEE; 32];
    want[8..24].copy_from_slice(&p1[..16]);
    assert_eq!(inbox_mr.as_slice(), &want[..]);
    let mut want = p50.clone();
    want[16..24].copy_from_slice(&p1[16..24]);
    assert_eq!(old, u64::from_ne_bytes(p50[48..56].try_into().unwrap()));
    want[48..56].copy_from_slice(&old.wrapping_add(5).to_ne_bytes());
    assert_eq!(target_mr.as_slice(), &want[..]);
    let mut want = [0xAA; 24];
    want[..8].copy_from_slice(&p50[32..40]);
    want[8..16].copy_from_slice(&old.to_ne_bytes());
    assert_eq!(local_mr.as_slice(), &want[..]);
}

#[test]
fn loc_len_err() {
    let seed = Seed::new();
    // Responder: the receive is shorter than the message.
    let (_sim, mut a, mut b) = pair(&seed);
    let (mut src, mut inbox) = (pattern(32, 1), [0x77u8; 32]);
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut inbox_mr = b.pd.register(&mut inbox).unwrap();
    let sge = inbox_mr.slice_mut(..16).unwrap().sge();
    // SAFETY: `inbox` is not accessed until the receive is redeemed.
    let recv = unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap();
    let e = a.ch.send([src_mr.slice(..).unwrap()]).unwrap_err();
    assert_eq!(status(&e), WcStatus::RemInvReqErr);
    let r = b.ch.wait(recv).unwrap_err();
    assert_eq!(status(&r), WcStatus::LocLenErr);
    assert_eq!(r.completion().unwrap().opcode, WcOpcode::Recv);
    assert_eq!(states(&a, &b), (Err, Err));
    assert_eq!(
        &inbox_mr.as_slice()[16..],
        &[0x77; 16],
        "nothing past the receive"
    );
    assert_eq!(src_mr.as_slice(), &pattern(32, 1)[..]);

    // Requester: an atomic's local buffer must be 8 bytes.
    let (_sim, mut a, b) = pair(&seed);
    let (mut local, mut target) = ([0xAAu8; 8], [3u8; 8]);
    let local_mr = a.pd.register(&mut local).unwrap();
    // SAFETY: read after the failed atomic.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let op = SendOp::FetchAdd {
        remote_addr: target_mr.remote().addr,
        rkey: target_mr.rkey(),
        add: 1,
    };
    let sge = local_mr.slice(..4).unwrap().sge();
    // SAFETY: `local` is not accessed until the wait returned.
    let p = unsafe { a.ch.post_send_unpolled(&[sge], op, SendFlags::empty()) }.unwrap();
    assert_eq!(status(&a.ch.wait(p).unwrap_err()), WcStatus::LocLenErr);
    assert_eq!(states(&a, &b), (Err, Rts), "nothing reached the responder");
    assert_eq!(
        (local_mr.as_slice(), target_mr.as_slice()),
        (&[0xAA; 8][..], &[3; 8][..])
    );
}

#[test]
fn loc_qp_op_err() {
    let seed = Seed::new();
    let no_reads = RtsOptions {
        max_rd_atomic: 0,
        ..rts()
    };
    let (_sim, mut a, b) = pair_with(&seed, config(no_reads), config(rts()));
    let (mut local, mut target) = ([0xAAu8; 8], [4u8; 8]);
    let mut local_mr = a.pd.register(&mut local).unwrap();
    // SAFETY: read after the failed read.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let dst = local_mr.slice_mut(..).unwrap();
    let e = a.ch.read([dst], &target_mr.remote()).unwrap_err();
    assert_eq!(status(&e), WcStatus::LocQpOpErr);
    assert_eq!(states(&a, &b), (Err, Rts), "nothing reached the responder");
    assert_eq!(
        (local_mr.as_slice(), target_mr.as_slice()),
        (&[0xAA; 8][..], &[4; 8][..])
    );
}

#[test]
fn loc_prot_err() {
    let seed = Seed::new();
    // A send from memory registered in another protection domain.
    let (_sim, mut a, b) = pair(&seed);
    let other_pd = a.ctx.alloc_pd().unwrap();
    let mut foreign = [1u8; 8];
    let foreign_mr = other_pd.register(&mut foreign).unwrap();
    let sge = foreign_mr.slice(..).unwrap().sge();
    // SAFETY: `foreign` outlives the wait below.
    let p = unsafe {
        a.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
    };
    let e = a.ch.wait(p.unwrap()).unwrap_err();
    assert_eq!(status(&e), WcStatus::LocProtErr);
    assert_eq!(states(&a, &b), (Err, Rts));
    assert_eq!(foreign_mr.as_slice(), &[1; 8]);

    // A read into memory the device may not write (no LOCAL_WRITE).
    let (_sim, mut a, b) = pair(&seed);
    let (mut remote_buf, mut local) = ([4u8; 8], [0u8; 8]);
    // SAFETY: only read by the peer.
    let remote_mr = unsafe {
        b.pd.register_with_access(&mut remote_buf, AccessFlags::REMOTE_READ)
    }
    .unwrap();
    // SAFETY: no remote rights; `local` is read after the wait.
    let local_mr = unsafe { a.pd.register_with_access(&mut local, AccessFlags::empty()) }.unwrap();
    let sge = local_mr.slice(..).unwrap().sge();
    let op = SendOp::Read {
        remote_addr: remote_mr.remote().addr,
        rkey: remote_mr.rkey(),
    };
    // SAFETY: `local` is not accessed until the wait returned.
    let p = unsafe { a.ch.post_send_unpolled(&[sge], op, SendFlags::empty()) }.unwrap();
    assert_eq!(status(&a.ch.wait(p).unwrap_err()), WcStatus::LocProtErr);
    assert_eq!(states(&a, &b), (Err, Rts));
    assert_eq!(
        (local_mr.as_slice(), remote_mr.as_slice()),
        (&[0; 8][..], &[4; 8][..])
    );
}

#[test]
fn wr_flush_err() {
    let seed = Seed::new();
    // Posting on a queue pair in the error state.
    let (_sim, mut a, b) = pair(&seed);
    a.ch.queue_pair().set_error().unwrap();
    let mut src = [9u8; 8];
    let mr = a.pd.register(&mut src).unwrap();
    let e = a.ch.send([mr.slice(..).unwrap()]).unwrap_err();
    assert_eq!(status(&e), WcStatus::WrFlushErr);
    assert!(e.to_string().contains("flushed"), "{e}");
    assert_eq!(states(&a, &b), (Err, Rts));

    // Receives outstanding when the queue pair enters the error state: flushed in order.
    let (_sim, a, mut b) = pair(&seed);
    let mut inbox = [0x55u8; 24];
    let mut inbox_mr = b.pd.register(&mut inbox).unwrap();
    let sges: Vec<_> = (0..3)
        .map(|i| inbox_mr.slice_mut(i * 8..i * 8 + 8).unwrap().sge())
        // SAFETY: `inbox` is not accessed until every receive is redeemed.
        .map(|s| unsafe { b.ch.post_receive_unpolled(&[s]) }.unwrap())
        .collect();
    b.ch.queue_pair().set_error().unwrap();
    for p in sges {
        let e = b.ch.wait(p).unwrap_err();
        assert_eq!(
            (status(&e), e.completion().unwrap().opcode),
            (WcStatus::WrFlushErr, WcOpcode::Recv)
        );
    }
    assert_eq!(states(&a, &b), (Rts, Err));
    assert_eq!(inbox_mr.as_slice(), &[0x55; 24]);

    // Requests behind a failed one.
    let (_sim, mut a, b) = pair(&seed);
    let (mut src, mut target) = ([1u8; 16], [0x33u8; 16]);
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after both writes completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let write = |rkey: u32, off: u64| SendOp::Write {
        remote_addr: target_mr.remote().addr + off,
        rkey,
    };
    let sge = src_mr.slice(..8).unwrap().sge();
    let bad = write(target_mr.rkey() ^ 1, 0);
    // SAFETY: `src` outlives both waits.
    let p1 = unsafe { a.ch.post_send_unpolled(&[sge], bad, SendFlags::empty()) }.unwrap();
    let good = write(target_mr.rkey(), 8);
    // SAFETY: as above.
    let p2 = unsafe { a.ch.post_send_unpolled(&[sge], good, SendFlags::empty()) }.unwrap();
    assert_eq!(status(&a.ch.wait(p1).unwrap_err()), WcStatus::RemAccessErr);
    assert_eq!(status(&a.ch.wait(p2).unwrap_err()), WcStatus::WrFlushErr);
    assert_eq!(states(&a, &b), (Err, Err));
    assert_eq!(
        target_mr.as_slice(),
        &[0x33; 16],
        "the flushed write never ran"
    );
}

#[test]
fn bad_resp_err() {
    let seed = Seed::new();
    let (sim, mut a, b) = pair(&seed);
    let (mut src, mut target) = (pattern(8, 2), [0x33u8; 24]);
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the write completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    sim.fabric().corrupt_next_response(1).unwrap();
    let dst = target_mr.remote().slice(8..16).unwrap();
    let e = a.ch.write([src_mr.slice(..).unwrap()], &dst).unwrap_err();
    assert_eq!(status(&e), WcStatus::BadRespErr);
    assert_eq!(
        states(&a, &b),
        (Err, Rts),
        "the responder did nothing wrong"
    );
    // The write executed (its ACK was corrupted on the way back): only its range changed.
    let t = target_mr.as_slice();
    assert_eq!((&t[..8], &t[16..]), (&[0x33; 8][..], &[0x33; 8][..]));
    assert_eq!(&t[8..16], &pattern(8, 2)[..]);
}

#[test]
fn fatal_err() {
    let seed = Seed::new();
    // Soft-RoCE's completer: a response of the wrong kind (an RDMA READ response) to a
    // request that is not a read.
    let rxe = || {
        let cfg = FabricConfig {
            trace: true,
            personality: Personality::Rxe,
            ..FabricConfig::stepped(seed.0)
        };
        let sim = Sim::with_config(cfg, 2);
        let (a, b): (S, S) = pair_on(&sim, &config(rts()), &config(rts()));
        (sim, a, b)
    };

    // A write: it executed (its ACK was corrupted on the way back).
    let (sim, mut a, b) = rxe();
    let (mut src, mut target) = (pattern(8, 7), [0x33u8; 24]);
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the write completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    sim.fabric().corrupt_next_response(1).unwrap();
    let dst = target_mr.remote().slice(8..16).unwrap();
    let e = a.ch.write([src_mr.slice(..).unwrap()], &dst).unwrap_err();
    assert_eq!(status(&e), WcStatus::FatalErr);
    assert!(e.to_string().contains("IBV_WC_FATAL_ERR"), "{e}");
    assert_eq!(
        states(&a, &b),
        (Err, Rts),
        "the responder did nothing wrong"
    );
    let t = target_mr.as_slice();
    assert_eq!((&t[..8], &t[16..]), (&[0x33; 8][..], &[0x33; 8][..]));
    assert_eq!(&t[8..16], &pattern(8, 7)[..]);

    // A send: the responder received it; only the requester fails.
    let (sim, mut a, mut b) = rxe();
    let (mut src, mut inbox) = (pattern(16, 8), [0x44u8; 24]);
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut inbox_mr = b.pd.register(&mut inbox).unwrap();
    let sge = inbox_mr.slice_mut(..).unwrap().sge();
    // SAFETY: `inbox` is not accessed until the receive is redeemed.
    let recv = unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap();
    sim.fabric().corrupt_next_response(1).unwrap();
    let e = a.ch.send([src_mr.slice(..).unwrap()]).unwrap_err();
    assert_eq!(status(&e), WcStatus::FatalErr);
    let got = b.ch.wait(recv).unwrap();
    assert_eq!((got.status, got.byte_len), (WcStatus::Success, 16));
    assert_eq!(states(&a, &b), (Err, Rts));
    let mut want = [0x44; 24];
    want[..16].copy_from_slice(&pattern(16, 8));
    assert_eq!(inbox_mr.as_slice(), &want[..]);

    // A read: rxe has no error status for it, so it keeps the spec's BAD_RESP_ERR.
    let (sim, mut a, b) = rxe();
    let (mut local, mut target) = ([0xAAu8; 8], pattern(8, 9));
    let mut local_mr = a.pd.register(&mut local).unwrap();
    // SAFETY: read after the read completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    sim.fabric().corrupt_next_response(1).unwrap();
    let dst = local_mr.slice_mut(..).unwrap();
    let e = a.ch.read([dst], &target_mr.remote()).unwrap_err();
    assert_eq!(status(&e), WcStatus::BadRespErr);
    assert_eq!(states(&a, &b), (Err, Rts));
    assert_eq!(
        target_mr.as_slice(),
        &pattern(8, 9)[..],
        "a read writes nothing remote"
    );
}

#[test]
fn raw_values_of_statuses_rc_never_reports() {
    use WcStatus::*;
    // The verbs values (rdma-core `enum ibv_wc_status`) of the statuses no test above
    // provokes, each with the reason in the module docs.
    let never = [
        (LocEecOpErr, 3, "IBV_WC_LOC_EEC_OP_ERR"),
        (MwBindErr, 6, "IBV_WC_MW_BIND_ERR"),
        (LocRddViolErr, 14, "IBV_WC_LOC_RDD_VIOL_ERR"),
        (RemInvRdReqErr, 15, "IBV_WC_REM_INV_RD_REQ_ERR"),
        (RemAbortErr, 16, "IBV_WC_REM_ABORT_ERR"),
        (InvEecnErr, 17, "IBV_WC_INV_EECN_ERR"),
        (InvEecStateErr, 18, "IBV_WC_INV_EEC_STATE_ERR"),
        (RespTimeoutErr, 20, "IBV_WC_RESP_TIMEOUT_ERR"),
        (GeneralErr, 21, "IBV_WC_GENERAL_ERR"),
        (TmErr, 22, "IBV_WC_TM_ERR"),
        (TmRndvIncomplete, 23, "IBV_WC_TM_RNDV_INCOMPLETE"),
    ];
    for (s, raw, name) in never {
        assert_eq!((WcStatus::from_raw(raw), s.raw(), s.name()), (s, raw, name));
        assert!(s.to_string().starts_with(name), "{s}");
    }
    // Every status the simulator can report reaches zverbs under its own name.
    for raw in 0..=21 {
        let ours = WcStatus::from_raw(raw);
        assert!(!matches!(ours, Unknown(_)), "{raw}");
        assert_eq!(ours.raw(), raw);
    }
    // A value no version of rdma-core zverbs knows is kept, not folded into GENERAL_ERR.
    let unknown = WcStatus::from_raw(99);
    assert_eq!((unknown, unknown.raw()), (Unknown(99), 99));
    assert_ne!(unknown, GeneralErr);
    assert!(
        unknown.to_string().contains("unknown completion status 99"),
        "{unknown}"
    );
}

#[test]
fn loc_access_err() {
    let seed = Seed::new();
    let (_sim, mut a, mut b) = pair(&seed);
    let (mut src, mut target, mut inbox) = (pattern(8, 3), [0x33u8; 8], [0x44u8; 8]);
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the failed write.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let mut inbox_mr = b.pd.register(&mut inbox).unwrap();
    let sge = inbox_mr.slice_mut(..).unwrap().sge();
    // SAFETY: `inbox` is not accessed until the receive is redeemed.
    let recv = unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap();
    let bad = RemoteRegion {
        rkey: target_mr.rkey() ^ 1,
        ..target_mr.remote()
    };
    let e =
        a.ch.write_with_imm([src_mr.slice(..).unwrap()], &bad, 7)
            .unwrap_err();
    assert_eq!(status(&e), WcStatus::RemAccessErr);
    let r = b.ch.wait(recv).unwrap_err();
    assert_eq!(status(&r), WcStatus::LocAccessErr);
    assert_eq!(states(&a, &b), (Err, Err));
    assert_eq!(
        (target_mr.as_slice(), inbox_mr.as_slice()),
        (&[0x33; 8][..], &[0x44; 8][..])
    );
}

#[test]
fn rem_inv_req_err() {
    let seed = Seed::new();
    let check = |a: &S, b: &S, e: Error<SimError>, what: &str| {
        assert_eq!(status(&e), WcStatus::RemInvReqErr, "{what}");
        assert_eq!(states(a, b), (Err, Err), "{what}");
    };
    // A misaligned atomic.
    let (_sim, mut a, b) = pair(&seed);
    let (mut target, mut result) = ([0u8; 16], [0xAAu8; 8]);
    // SAFETY: read after the failed atomic.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let mut result_mr = a.pd.register(&mut result).unwrap();
    let misaligned = target_mr.remote().slice(4..12).unwrap();
    let e =
        a.ch.fetch_add(result_mr.slice_mut(..).unwrap(), &misaligned, 1);
    check(&a, &b, e.unwrap_err(), "misaligned");
    assert_eq!(
        (target_mr.as_slice(), result_mr.as_slice()),
        (&[0; 16][..], &[0xAA; 8][..])
    );

    // An opcode the responder queue pair does not accept, and a read to a responder that
    // takes no reads in flight.
    let no_write = ChannelConfig {
        init: InitOptions {
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            ..InitOptions::default()
        },
        ..config(rts())
    };
    let no_reads = ChannelConfig {
        rtr: RtrOptions {
            max_dest_rd_atomic: 0,
            ..RtrOptions::default()
        },
        ..config(rts())
    };
    for (what, b_cfg) in [
        ("QP without REMOTE_WRITE", no_write),
        ("max_dest_rd_atomic 0", no_reads),
    ] {
        let (_sim, mut a, b) = pair_with(&seed, config(rts()), b_cfg);
        let (mut local, mut target) = ([1u8; 8], [2u8; 8]);
        let mut local_mr = a.pd.register(&mut local).unwrap();
        // SAFETY: read after the failed operation.
        let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
        let e = match what {
            "max_dest_rd_atomic 0" => {
                a.ch.read([local_mr.slice_mut(..).unwrap()], &target_mr.remote())
            }
            _ => {
                a.ch.write([local_mr.slice(..).unwrap()], &target_mr.remote())
            }
        };
        check(&a, &b, e.unwrap_err(), what);
        assert_eq!(
            (local_mr.as_slice(), target_mr.as_slice()),
            (&[1; 8][..], &[2; 8][..])
        );
    }
}

#[test]
fn rem_access_err() {
    let seed = Seed::new();
    type Op = fn(&mut S, &mut zverbs::MemoryRegion<'_, Sim>, &RemoteRegion) -> Error<SimError>;
    let write: Op = |a, l, r| a.ch.write([l.slice(..8).unwrap()], r).unwrap_err();
    let read: Op = |a, l, r| a.ch.read([l.slice_mut(..8).unwrap()], r).unwrap_err();
    let atomic: Op = |a, l, r| a.ch.fetch_add(l.slice_mut(..8).unwrap(), r, 1).unwrap_err();
    type Target = fn(&RemoteRegion, u32) -> RemoteRegion;
    let bad_rkey: Target = |r, _| RemoteRegion {
        rkey: r.rkey ^ 1,
        ..*r
    };
    let lkey: Target = |r, lkey| RemoteRegion { rkey: lkey, ..*r };
    // A forged region claiming more than was registered: the device's bounds check.
    let past_end: Target = |r, _| RemoteRegion {
        addr: r.addr + 12,
        len: 16,
        ..*r
    };
    let same: Target = |r, _| *r;
    let cases = [
        ("write, bad rkey", write, bad_rkey, ALL),
        ("write, lkey as rkey", write, lkey, ALL),
        ("write, past the region", write, past_end, ALL),
        (
            "write without REMOTE_WRITE",
            write,
            same,
            ALL - AccessFlags::REMOTE_WRITE,
        ),
        (
            "read without REMOTE_READ",
            read,
            same,
            ALL - AccessFlags::REMOTE_READ,
        ),
        (
            "atomic without REMOTE_ATOMIC",
            atomic,
            same,
            ALL - AccessFlags::REMOTE_ATOMIC,
        ),
    ];
    for (what, op, target_of, rights) in cases {
        let (_sim, mut a, b) = pair(&seed);
        let (mut local, mut target) = ([5u8; 8], [9u8; 16]);
        let mut local_mr = a.pd.register(&mut local).unwrap();
        // SAFETY: read after the failed operation.
        let target_mr = unsafe { b.pd.register_with_access(&mut target, rights) }.unwrap();
        let remote = target_of(&target_mr.remote().slice(..8).unwrap(), target_mr.lkey());
        let e = op(&mut a, &mut local_mr, &remote);
        assert_eq!(status(&e), WcStatus::RemAccessErr, "{what}");
        assert_eq!(states(&a, &b), (Err, Err), "{what}");
        assert_eq!(target_mr.as_slice(), &[9; 16], "{what}: remote untouched");
        assert_eq!(local_mr.as_slice(), &[5; 8], "{what}: local untouched");
    }
}

#[test]
fn rem_op_err() {
    let seed = Seed::new();
    let (_sim, mut a, mut b) = pair(&seed);
    let (mut src, mut foreign) = (pattern(8, 4), [0x66u8; 8]);
    let src_mr = a.pd.register(&mut src).unwrap();
    let other_pd = b.ctx.alloc_pd().unwrap();
    let mut foreign_mr = other_pd.register(&mut foreign).unwrap();
    let sge = foreign_mr.slice_mut(..).unwrap().sge();
    // SAFETY: `foreign` is not accessed until the receive is redeemed.
    let recv = unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap();
    let e = a.ch.send([src_mr.slice(..).unwrap()]).unwrap_err();
    assert_eq!(status(&e), WcStatus::RemOpErr);
    assert_eq!(status(&b.ch.wait(recv).unwrap_err()), WcStatus::LocProtErr);
    assert_eq!(states(&a, &b), (Err, Err));
    assert_eq!(foreign_mr.as_slice(), &[0x66; 8]);
}

#[test]
fn retry_exc_err() {
    let seed = Seed::new();
    type Fault = fn(&Sim);
    let cases: [(&str, Fault); 3] = [
        ("link down", |s| s.fabric().link_down(1).unwrap()),
        ("partition", |s| s.fabric().partition(0, 1).unwrap()),
        ("crash", |s| s.fabric().crash(1).unwrap()),
    ];
    for (what, fault) in cases {
        let (sim, mut a, b) = pair(&seed);
        let (mut src, mut target) = ([1u8; 8], [0x33u8; 8]);
        let src_mr = a.pd.register(&mut src).unwrap();
        // SAFETY: read after the failed write.
        let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
        fault(&sim);
        let e =
            a.ch.write([src_mr.slice(..).unwrap()], &target_mr.remote())
                .unwrap_err();
        assert_eq!(status(&e), WcStatus::RetryExcErr, "{what}");
        // A crashed device's queue pairs are gone and read as ERR; otherwise the responder
        // never heard of the failed request.
        let b_state = if what == "crash" { Err } else { Rts };
        assert_eq!(states(&a, &b), (Err, b_state), "{what}");
        assert_eq!(target_mr.as_slice(), &[0x33; 8], "{what}");
        // The first transmission and 3 retransmissions, each after a 4.2 ms timeout.
        let trace = sim.fabric().trace_events();
        let n = |k: TraceKind| trace.iter().filter(|e| e.kind == k).count();
        assert_eq!(
            (n(TraceKind::Timeout), n(TraceKind::Retransmit)),
            (4, 3),
            "{what}"
        );
        let timeout = ack_timeout_ns(rts().timeout).unwrap();
        assert!(
            sim.fabric().now() >= Duration::from_nanos(4 * timeout),
            "{what}"
        );
    }
}

#[test]
fn rnr_retry_exc_err() {
    let seed = Seed::new();
    let (sim, mut a, b) = pair(&seed);
    let mut src = pattern(8, 6);
    let src_mr = a.pd.register(&mut src).unwrap();
    let e = a.ch.send([src_mr.slice(..).unwrap()]).unwrap_err();
    assert_eq!(status(&e), WcStatus::RnrRetryExcErr);
    assert_eq!(
        states(&a, &b),
        (Err, Rts),
        "the responder only said 'not ready'"
    );
    assert_eq!(b.ch.in_flight(), (0, 0));
    assert_eq!(src_mr.as_slice(), &pattern(8, 6)[..]);
    // The first try and 2 retries, each answered by an RNR NAK, 2 waits of min_rnr_timer.
    let trace = sim.fabric().trace_events();
    let naks = trace
        .iter()
        .filter(|e| matches!(e.kind, TraceKind::RnrNak(_)))
        .count();
    assert_eq!(naks, 3);
    let wait = rnr_timer_ns(RtrOptions::default().min_rnr_timer);
    assert!(sim.fabric().now() >= Duration::from_nanos(2 * wait));
}
