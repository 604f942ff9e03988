//! Simulated time: the stepped mode, link timing, ACK timeouts and retries, RNR waits.

mod common;

use std::time::{Duration, Instant};

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

/// A stepped pair (no faults) with `rts` and a 64-byte buffer on each side.
struct Env {
    p: Pair,
    _a_buf: Buf,
    b_buf: Buf,
    a_mr: Mr,
    b_mr: Mr,
}

fn env(rts: RtsAttr) -> Env {
    env_on(stepped(1, Faults::none(), 2), Cfg::default(), rts)
}

fn env_on(f: Fabric, cfg: Cfg, rts: RtsAttr) -> Env {
    let p = pair_in(f, cfg, rts);
    let (a_buf, b_buf) = (Buf::new(64, 1), Buf::new(64, 0));
    let a_mr = a_buf.reg(&p.a.pd, all_access());
    let b_mr = b_buf.reg(&p.b.pd, all_access());
    Env {
        p,
        _a_buf: a_buf,
        b_buf,
        a_mr,
        b_mr,
    }
}

impl Env {
    fn write(&self, id: u64, off: usize, len: u32) -> SendWr<MAX_SGE> {
        let op = SendOp::Write {
            remote_addr: self.b_buf.addr(off),
            rkey: self.b_mr.rkey(),
        };
        sig(id, op, &[sge(&self.a_mr, off, len)])
    }

    fn send(&self, id: u64) -> SendWr<MAX_SGE> {
        sig(id, SendOp::Send, &[sge(&self.a_mr, 0, 4)])
    }
}

#[test]
fn stepped_time_moves_only_when_stepped() {
    let e = env(rts_attr());
    let f = &e.p.fabric;
    e.p.a.qp.post_send(&[e.write(1, 0, 8)]).unwrap();
    // Posting does not advance time; the request is on the wire.
    assert_eq!(f.now(), Duration::ZERO);
    assert!(f.pending_events() >= 1);
    assert_eq!(e.b_buf.get()[..8], [0; 8]);
    assert!(f.step()); // the request arrives and executes
    let (lat, ser) = (1_000, LinkModel::default().serialisation_ns(8 + 64));
    assert_eq!(f.now(), Duration::from_nanos(ser + lat));
    assert_eq!(e.b_buf.get()[..8], [1; 8]);
    // The requester completes only when the ACK is back.
    let cfg = FabricConfig {
        auto_step: false,
        ..FabricConfig::stepped(1)
    };
    assert!(cfg.auto_step != e.p.fabric.config().auto_step);
    assert!(f.step());
    let ack = LinkModel::default().serialisation_ns(64) + lat;
    assert_eq!(f.now(), Duration::from_nanos(ser + lat + ack));
    assert_eq!(ids(&drain(&e.p.a.cq)), [(1, Success)]);
    // The ACK stopped the ACK timer: no event is left, and time stays put.
    assert_eq!(f.pending_events(), 0);
    assert_eq!(f.run_until_idle(), 0);
    assert_eq!(f.now(), Duration::from_nanos(ser + lat + ack));
    assert_eq!(e.p.a.qp.state(), QpState::ReadyToSend);
}

#[test]
fn auto_step_poll_progresses_single_threaded_code() {
    let e = env(rts_attr());
    e.p.b
        .qp
        .post_recv(&[rwr(7, &[sge(&e.b_mr, 0, 16)])])
        .unwrap();
    e.p.a.qp.post_send(&[e.send(1)]).unwrap();
    // No explicit stepping: polling b's CQ runs the engine until the receive completes.
    let got = drain(&e.p.b.cq);
    assert_eq!(ids(&got), [(7, Success)]);
    assert_eq!(got[0].byte_len, 4);
    assert!(e.p.fabric.now() >= Duration::from_nanos(1_000));
    assert_eq!(ids(&drain(&e.p.a.cq)), [(1, Success)]);
    // Without auto-step a poll finds nothing until the engine is stepped.
    let cfg = FabricConfig {
        auto_step: false,
        ..FabricConfig::stepped(1)
    };
    let e = env_on(Fabric::with_config(cfg, 2), Cfg::default(), rts_attr());
    e.p.a.qp.post_send(&[e.write(2, 0, 8)]).unwrap();
    assert!(drain(&e.p.a.cq).is_empty());
    e.p.fabric.run_until_idle();
    assert_eq!(ids(&drain(&e.p.a.cq)), [(2, Success)]);
}

#[test]
fn bandwidth_serialises_packets_on_the_egress_port() {
    let e = env(rts_attr());
    let big = 32;
    e.p.a
        .qp
        .post_send(&[e.write(1, 0, big), e.write(2, 32, big)])
        .unwrap();
    e.p.fabric.step();
    let ser = LinkModel::default().serialisation_ns(u64::from(big) + 64);
    assert_eq!(e.p.fabric.now(), Duration::from_nanos(ser + 1_000));
    e.p.fabric.step();
    assert_eq!(e.p.fabric.now(), Duration::from_nanos(2 * ser + 1_000));
}

#[test]
fn messages_use_one_psn_per_mtu_segment() {
    let f = stepped(1, Faults::none(), 2);
    let mut cfg = Cfg::default();
    cfg.cap.max_send_sge = 1;
    let p = pair_in(f, cfg, rts_attr());
    // Reconnect with a 256-byte path MTU on both sides.
    for (qp, dest, dlid) in [(&p.a.qp, p.b.qp.qp_num(), 2), (&p.b.qp, p.a.qp.qp_num(), 1)] {
        qp.modify(&Transition::Reset).unwrap();
        let rtr = RtrAttr {
            path_mtu: Mtu::Mtu256,
            ..rtr_attr(dest, dlid, 4)
        };
        connect_with(qp, all_access(), rtr, rts_attr());
    }
    let (src, dst) = (Buf::new(1000, 9), Buf::new(1000, 0));
    let ms = src.reg(&p.a.pd, all_access());
    let md = dst.reg(&p.b.pd, all_access());
    let w = |id, len| {
        let op = SendOp::Write {
            remote_addr: dst.addr(0),
            rkey: md.rkey(),
        };
        sig(id, op, &[sge(&ms, 0, len)])
    };
    p.a.qp.post_send(&[w(1, 1000), w(2, 10), w(3, 0)]).unwrap();
    p.fabric.run_until_idle();
    assert_eq!(
        ids(&drain(&p.a.cq)),
        [(1, Success), (2, Success), (3, Success)]
    );
    assert_eq!(dst.get(), vec![9; 1000]);
    let json = trace_json(&p.fabric);
    // 1000 bytes = 4 segments: PSNs 0..=3, then 4, then 5.
    for (psn, id) in [(0, 1), (4, 2), (5, 3)] {
        let want = format!("\"packet\":\"request\",\"psn\":{psn},\"wr_id\":{id}}}");
        assert!(json.contains(&want), "{want} missing");
    }
    assert!(json.contains("\"packet\":\"ack\",\"psn\":3}"));
}

#[test]
fn link_down_gives_retry_exceeded_after_exact_retransmissions() {
    let e = env(rts(1, 2, 7)); // timeout 8.192 µs, 2 retries
    let f = &e.p.fabric;
    f.link_down(1).unwrap();
    assert_eq!(e.p.b.ctx.query_port(1).unwrap().state, PortState::Down);
    e.p.a.qp.post_send(&[e.write(1, 0, 8), e.send(2)]).unwrap();
    e.p.b.qp.post_recv(&[rwr(3, &[])]).unwrap();
    f.run_until_idle();
    let got = drain(&e.p.a.cq);
    assert_eq!(ids(&got), [(1, RetryExcErr), (2, WrFlushErr)]);
    assert_eq!(got[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(e.p.a.qp.state(), QpState::Error);
    assert_eq!(e.p.b.qp.state(), QpState::ReadyToSend);
    assert!(drain(&e.p.b.cq).is_empty());
    assert_eq!(e.b_buf.get(), [0; 64]);
    let json = trace_json(f);
    // Both requests go back twice (go-back-N), after each of three timeouts but the last.
    assert_eq!(count(&json, "timeout"), 3);
    assert_eq!(count(&json, "retransmit"), 2 * 2);
    assert_eq!(json.matches("\"reason\":\"link down\"").count(), 2 * 3);
    // Three timeouts of 8.192 µs each, measured from the first transmission.
    assert!(f.now() >= Duration::from_nanos(3 * 8_192), "{:?}", f.now());
    assert!(f.now() < Duration::from_nanos(4 * 8_192), "{:?}", f.now());
}

#[test]
fn link_up_in_time_recovers_by_retransmission() {
    let e = env(rts(1, 2, 7));
    let f = &e.p.fabric;
    f.link_down(0).unwrap();
    e.p.a.qp.post_send(&[e.write(1, 0, 8)]).unwrap();
    f.run_for(Duration::from_micros(10)); // one timeout, one lost retransmission
    f.link_up(0).unwrap();
    f.run_until_idle();
    assert_eq!(ids(&drain(&e.p.a.cq)), [(1, Success)]);
    assert_eq!(e.b_buf.get()[..8], [1; 8]);
}

#[test]
fn missing_peer_times_out_with_real_timing() {
    // Peer QP in RESET: packets are dropped at it, the requester retries, then gives up.
    let e = env(rts(2, 3, 7));
    e.p.b.qp.modify(&Transition::Reset).unwrap();
    e.p.a.qp.post_send(&[e.write(1, 0, 8)]).unwrap();
    e.p.fabric.run_until_idle();
    assert_eq!(ids(&drain(&e.p.a.cq)), [(1, RetryExcErr)]);
    let t = e.p.fabric.now();
    assert!(t >= Duration::from_nanos(4 * 16_384) && t < Duration::from_nanos(5 * 16_384));
    let json = trace_json(&e.p.fabric);
    assert_eq!(count(&json, "retransmit"), 3);
    assert_eq!(json.matches("\"reason\":\"QP not ready\"").count(), 4);
}

#[test]
fn rnr_retry_finite_gives_up() {
    for rnr_retry in 0..=3u8 {
        let e = env(rts(14, 7, rnr_retry));
        e.p.a.qp.post_send(&[e.send(1), e.write(2, 0, 8)]).unwrap();
        e.p.fabric.run_until_idle();
        let got = drain(&e.p.a.cq);
        assert_eq!(
            ids(&got),
            [(1, RnrRetryExcErr), (2, WrFlushErr)],
            "{rnr_retry}"
        );
        assert_eq!(e.p.a.qp.state(), QpState::Error);
        // The responder is fine and executed nothing.
        assert_eq!(e.p.b.qp.state(), QpState::ReadyToSend);
        assert_eq!(e.b_buf.get(), [0; 64]);
        let json = trace_json(&e.p.fabric);
        assert_eq!(count(&json, "rnr_nak"), usize::from(rnr_retry) + 1);
        // Each wait is the responder's min_rnr_timer (code 12 = 0.64 ms).
        let waited = u64::from(rnr_retry) * 640_000;
        let t = e.p.fabric.now();
        assert!(t >= Duration::from_nanos(waited), "{t:?}");
        assert!(t < Duration::from_nanos(waited + 100_000), "{t:?}");
    }
}

#[test]
fn rnr_wait_ends_when_a_receive_arrives_in_time() {
    // Without auto-step: a poll of the empty CQ must not run the RNR wait out.
    let cfg = FabricConfig {
        auto_step: false,
        trace: true,
        ..FabricConfig::stepped(1)
    };
    let e = env_on(Fabric::with_config(cfg, 2), Cfg::default(), rts(14, 7, 1));
    let f = &e.p.fabric;
    e.p.a.qp.post_send(&[e.send(1), e.write(2, 8, 8)]).unwrap();
    f.run_for(Duration::from_micros(100)); // RNR NAK received, waiting 0.64 ms
    assert_eq!(count(&trace_json(f), "rnr_nak"), 1);
    assert!(drain(&e.p.a.cq).is_empty());
    e.p.b
        .qp
        .post_recv(&[rwr(9, &[sge(&e.b_mr, 0, 8)])])
        .unwrap();
    f.run_until_idle();
    assert_eq!(ids(&drain(&e.p.a.cq)), [(1, Success), (2, Success)]);
    assert_eq!(ids(&drain(&e.p.b.cq)), [(9, Success)]);
    // The 4-byte send landed at 0..4, the write at 8..16; nothing else changed.
    let b = e.b_buf.get();
    assert_eq!(
        (&b[..4], &b[4..8], &b[8..16]),
        (&[1; 4][..], &[0; 4][..], &[1; 8][..])
    );
    assert_eq!(b[16..], [0; 48]);
    assert!(f.now() >= Duration::from_nanos(640_000));
}

#[test]
fn rnr_retry_7_waits_forever() {
    let e = env(rts(14, 7, 7));
    let f = &e.p.fabric;
    e.p.a.qp.post_send(&[e.send(1)]).unwrap();
    assert_eq!(f.run_until_idle_max(1_000), 1_000);
    assert!(f.now() > Duration::from_millis(200)); // ~330 waits of 0.64 ms
    assert_eq!(e.p.a.qp.state(), QpState::ReadyToSend);
    let cfg = FabricConfig {
        auto_step: true,
        ..f.config()
    };
    assert!(cfg.auto_step);
    e.p.b
        .qp
        .post_recv(&[rwr(2, &[sge(&e.b_mr, 0, 8)])])
        .unwrap();
    assert_eq!(ids(&drain(&e.p.a.cq)), [(1, Success)]);
    assert!(f.run_until_idle() < 10);
}

#[test]
fn instant_fabric_keeps_untimed_rnr_semantics() {
    // with_devices: an RNR wait with rnr_retry 7 sleeps until a receive is posted, and a
    // finite rnr_retry gives up at once.
    let p = pair();
    let buf = Buf::new(8, 0);
    let mb = buf.reg(&p.b.pd, all_access());
    p.a.qp.post_send(&[sig(1, SendOp::Send, &[])]).unwrap();
    assert!(drain(&p.a.cq).is_empty());
    assert_eq!(p.fabric.pending_events(), 0);
    p.b.qp.post_recv(&[rwr(2, &[sge(&mb, 0, 8)])]).unwrap();
    assert_eq!(ids(&drain(&p.a.cq)), [(1, Success)]);

    let f = Fabric::with_devices(2);
    let p = pair_in(f, Cfg::default(), rts(14, 7, 2));
    p.a.qp.post_send(&[sig(1, SendOp::Send, &[])]).unwrap();
    assert_eq!(ids(&drain(&p.a.cq)), [(1, RnrRetryExcErr)]);
}

#[test]
fn threaded_mode_runs_on_the_wall_clock() {
    let cfg = FabricConfig {
        link: LinkModel {
            latency_ns: 50_000,
            bandwidth_gbps: 100,
        },
        ..FabricConfig::default()
    };
    // ACK timeout code 6 = 262 µs, longer than the 100 µs round trip.
    let e = env_on(Fabric::with_config(cfg, 2), Cfg::default(), rts(6, 1, 7));
    let t0 = Instant::now();
    e.p.a.qp.post_send(&[e.write(1, 0, 8)]).unwrap();
    let mut wc = Vec::new();
    while wc.is_empty() {
        wc = drain(&e.p.a.cq);
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
    // Request and ACK each take 50 µs: the completion cannot come earlier.
    assert!(t0.elapsed() >= Duration::from_micros(100));
    assert_eq!(ids(&wc), [(1, Success)]);
    // A missing peer: two timeouts of 262 µs (one retry), on the wall clock.
    e.p.b.qp.modify(&Transition::Error).unwrap();
    let t1 = Instant::now();
    e.p.a.qp.post_send(&[e.write(2, 0, 8)]).unwrap();
    let mut wc = Vec::new();
    while wc.is_empty() {
        wc = drain(&e.p.a.cq);
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
    assert_eq!(ids(&wc), [(2, RetryExcErr)]);
    assert!(t1.elapsed() >= Duration::from_nanos(2 * 262_144));
}
