//! The RPC engine ([`Rpc`]) over UD queue pairs on the simulator: echo of small and large
//! messages, batching (doorbells and signaled sends against packets), loss, a server that
//! vanishes, strangers, and no allocation per RPC after set-up.
#![cfg(feature = "sim")]

use std::time::{Duration, Instant};

use zverbs::provider::sim::{FabricConfig, Faults, Sim};
use zverbs::rpc::{Config, EngineConfig, Event, Notice, Rpc, RpcError};
use zverbs::testing::{RpcOutcome, RpcPair};
use zverbs::{Context, ErrorKind};

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

const ECHO: u8 = 1;
const REVERSE: u8 = 2;
const MS: u64 = 1_000_000;

fn engine_cfg(max_msg_size: usize) -> EngineConfig {
    EngineConfig {
        core: Config {
            max_sessions: 2,
            window: 4,
            max_msg_size,
            session_timeout_ns: 100 * MS,
            ..Config::default()
        },
        ..EngineConfig::default()
    }
}

fn rpc(sim: &Sim, dev: &str, cfg: EngineConfig) -> Rpc<Sim> {
    let ctx = Context::open(sim, dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    Rpc::new(&ctx, pd, cfg).unwrap()
}

/// A server with an echo and a reverse handler, and a client with a session to it.
fn world(sim: &Sim, cfg: EngineConfig) -> RpcPair {
    RpcPair::connected(sim, cfg.clone(), cfg, |server| {
        server.register_handler(ECHO, |req, out| {
            out[..req.len()].copy_from_slice(req);
            req.len()
        })?;
        server.register_handler(REVERSE, |req, out| {
            for (o, b) in out.iter_mut().zip(req.iter().rev()) {
                *o = *b;
            }
            req.len()
        })
    })
    .unwrap()
}

/// Enqueues `req` of type `req_type`, tagged `tag`.
fn call(w: &mut RpcPair, req_type: u8, req: &[u8], tag: u64) {
    w.client
        .enqueue_request(w.session, req_type, req, tag)
        .unwrap();
}

/// Runs until `n` outcomes in all.
fn wait_for(w: &mut RpcPair, n: usize) {
    let ok = w.wait_for(n, Duration::from_secs(10));
    let ids: Vec<_> = w.done.iter().map(|d| (d.tag, d.result.is_ok())).collect();
    assert!(ok, "outcomes: {ids:?}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

#[test]
fn echo_32_bytes_and_1_mib() {
    let sim = Sim::with_devices(2);
    // Nothing is lost here: with a retransmission timeout far above any run's length (a
    // slow machine, valgrind), a retransmission would be a bug, not the clock.
    let mut cfg = engine_cfg(1 << 20);
    (cfg.core.rto_ns, cfg.core.session_timeout_ns) = (30_000 * MS, 60_000 * MS);
    let mut w = world(&sim, cfg);
    let small = pattern(32, 1);
    let big = pattern(1 << 20, 2);
    call(&mut w, ECHO, &small, 1);
    call(&mut w, REVERSE, &big, 2);
    wait_for(&mut w, 2);
    w.done.sort_by_key(|d| d.tag);
    assert_eq!(w.done[0].result.as_deref().unwrap(), &small[..]);
    let reversed: Vec<u8> = big.iter().rev().copied().collect();
    assert_eq!(w.done[1].result.as_deref().unwrap(), &reversed[..]);
    let stats = w.client.core().stats();
    assert_eq!(stats.retransmits, 0);
    assert!(
        stats.tx_packets > 1000,
        "1 MiB goes as ~1,000 packets of 1 KiB"
    );
}

/// A pass sends what the core has in one doorbell: far fewer doorbells than packets, and
/// fewer signaled sends still (one per half ring of 64 send slots).
#[test]
fn a_window_of_requests_rings_few_doorbells() {
    let sim = Sim::with_devices(2);
    let mut w = world(&sim, engine_cfg(16 << 10));
    let before = w.client.stats().send_doorbells;
    let signaled = w.client.stats().signaled_sends;
    let packets = w.client.core().stats().tx_packets;
    for tag in 0..4 {
        call(&mut w, ECHO, &pattern(8 << 10, tag as u8), tag);
    }
    wait_for(&mut w, 4);
    assert!(w.done.iter().all(|d| d.result.is_ok()));
    let doorbells = w.client.stats().send_doorbells - before;
    let sent = w.client.core().stats().tx_packets - packets;
    assert!(sent >= 32, "4 × 8 KiB in ~1 KiB packets: {sent}");
    assert!(
        doorbells * 4 <= sent,
        "{doorbells} doorbells for {sent} packets"
    );
    let signaled = w.client.stats().signaled_sends - signaled;
    assert!(signaled * 16 <= sent, "{signaled} signaled of {sent}");
    // Small calls one at a time: a doorbell each, a completion per 32 sends.
    let (sent, signaled) = (
        w.client.core().stats().tx_packets,
        w.client.stats().signaled_sends,
    );
    for tag in 4..260 {
        call(&mut w, ECHO, b"ping", tag);
        wait_for(&mut w, tag as usize + 1);
    }
    let sent = w.client.core().stats().tx_packets - sent;
    let signaled = w.client.stats().signaled_sends - signaled;
    assert!(
        sent >= 256 && signaled <= sent / 32 + 1,
        "{signaled} of {sent}"
    );
}

/// A send ring smaller than a chain and of odd size wraps around many times, and a
/// window of odd size maps request numbers to slots (and tags) without a mask.
#[test]
fn odd_send_ring_and_window() {
    let sim = Sim::with_devices(2);
    let mut cfg = engine_cfg(8 << 10);
    cfg.send_slots = 3;
    cfg.core.window = 3;
    let mut w = world(&sim, cfg);
    let mut tag = 0;
    for round in 0..20 {
        for k in 0..3 {
            let len = [32, 3000, 8 << 10][k];
            call(&mut w, ECHO, &pattern(len, tag as u8), tag);
            tag += 1;
        }
        wait_for(&mut w, 3 * (round + 1));
    }
    w.done.sort_by_key(|d| d.tag);
    for RpcOutcome {
        tag: t, result: r, ..
    } in &w.done
    {
        let len = [32, 3000, 8 << 10][*t as usize % 3];
        assert_eq!(
            r.as_deref().unwrap(),
            &pattern(len, *t as u8)[..],
            "tag {t}"
        );
    }
    assert_eq!(w.client.core().stats().retransmits, 0);
}

/// Lost datagrams are sent again by the core; every request still gets its answer, once.
#[test]
fn lossy_fabric_every_request_answered_once() {
    let mut resent = 0;
    for seed in [1u64, 2, 3] {
        let cfg = FabricConfig {
            faults: Faults {
                drop: 0.05,
                duplicate: 0.05,
                ..Faults::none()
            },
            seed,
            ..FabricConfig::default()
        };
        let sim = Sim::with_config(cfg, 2);
        let mut w = world(&sim, engine_cfg(8 << 10));
        let n = 12;
        let mut sent = 0;
        while w.done.len() < n {
            while sent < n && sent - w.done.len() < 4 {
                call(&mut w, ECHO, &pattern(3000, sent as u8), sent as u64);
                sent += 1;
            }
            let target = w.done.len() + 1;
            let mut seen = w.done.len();
            w.run_until(Duration::from_secs(10), |nt| {
                seen += usize::from(!matches!(nt, Notice::Session(_)));
                seen >= target
            });
        }
        let mut tags: Vec<u64> = w.done.iter().map(|d| d.tag).collect();
        tags.sort_unstable();
        assert_eq!(tags, (0..n as u64).collect::<Vec<_>>(), "seed {seed}");
        for RpcOutcome { tag, result: r, .. } in &w.done {
            assert_eq!(
                r.as_deref().unwrap(),
                &pattern(3000, *tag as u8)[..],
                "seed {seed}"
            );
        }
        resent += w.client.core().stats().retransmits + w.server.core().stats().retransmits;
    }
    assert!(
        resent > 0,
        "the faults cost packets, which the core sent again"
    );
}

/// The server vanishes mid-request: the client's requests fail with `TimedOut`, once each,
/// within the session timeout and a grace.
#[test]
fn a_vanished_server_fails_outstanding_requests() {
    let sim = Sim::with_devices(2);
    let mut w = world(&sim, engine_cfg(8 << 10));
    sim.fabric().crash(1).unwrap();
    call(&mut w, ECHO, b"anyone?", 7);
    call(&mut w, ECHO, b"hello?", 8);
    let start = Instant::now();
    wait_for(&mut w, 2);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "bounded by the 100 ms timeout"
    );
    for RpcOutcome { result: r, .. } in &w.done {
        let e = r.as_ref().unwrap_err();
        assert_eq!((*e, e.kind()), (RpcError::TimedOut, ErrorKind::Timeout));
    }
}

/// No allocation per RPC once the engines are set up and the session open.
#[test]
fn no_allocation_per_rpc() {
    let sim = Sim::with_devices(2);
    let mut w = world(&sim, engine_cfg(4 << 10));
    let req = pattern(32, 9);
    w.done.reserve(1000);
    call(&mut w, ECHO, &req, 0);
    wait_for(&mut w, 1); // warm: every slot and queue at its working size
    let ((), allocs) = zverbs_testkit::measure(|| {
        for tag in 1..=200 {
            call(&mut w, ECHO, &req, tag);
            let target = w.done.len() + 1;
            while w.done.len() < target {
                w.server.run_event_loop_once(&mut |_| {}).unwrap();
                let done = &mut w.done;
                w.client
                    .run_event_loop_once(&mut |n| {
                        if let Notice::Response { tag, .. } = n {
                            done.push(RpcOutcome {
                                tag,
                                result: Ok(Vec::new()),
                                msg: None,
                            });
                        }
                    })
                    .unwrap();
            }
        }
    });
    assert_eq!(allocs.count, 0, "allocations in 200 RPCs");
}

/// A stranger's datagrams (garbage, and a well-formed request for a session it never
/// opened) are counted and dropped; the server keeps serving its client.
#[test]
fn strangers_are_counted_and_dropped() {
    let sim = Sim::with_devices(3);
    let mut w = world(&sim, engine_cfg(4 << 10));
    let before = w.server.stats().unknown_sender;
    // A well-formed request for a session it never opened, and 7 bytes of junk.
    stranger(
        &sim,
        "sim2",
        &w.server.addr(),
        &[valid_request_packet(), vec![0xA5; 7]],
    );
    call(&mut w, ECHO, b"still here", 1);
    wait_for(&mut w, 1);
    assert_eq!(w.done[0].result.as_deref().unwrap(), b"still here");
    assert_eq!(w.server.stats().unknown_sender - before, 2);
}

/// A request packet as a real client's core sends it on its session.
fn valid_request_packet() -> Vec<u8> {
    let mut ep = zverbs::rpc::RpcCore::new(Config::default()).unwrap();
    let mut server = zverbs::rpc::RpcCore::new(Config::default()).unwrap();
    let s = ep.connect(1).unwrap();
    let mut buf = [0u8; 1024];
    for _ in 0..4 {
        while let Some(t) = ep.poll_transmit(0, &mut buf) {
            server.handle_packet(0, 2, &buf[..t.len]);
        }
        while let Some(t) = server.poll_transmit(0, &mut buf) {
            ep.handle_packet(0, 1, &buf[..t.len]);
        }
        while ep.poll_event().is_some() {}
        while server.poll_event().is_some() {}
    }
    ep.enqueue_request(s, ECHO, b"x").unwrap();
    let t = ep.poll_transmit(0, &mut buf).unwrap();
    buf[..t.len].to_vec()
}

/// A session closed by the client ends on both sides, and a new one opens after it.
#[test]
fn disconnect_then_reconnect() {
    let sim = Sim::with_devices(2);
    let mut w = world(&sim, engine_cfg(4 << 10));
    call(&mut w, ECHO, b"one", 1);
    wait_for(&mut w, 1);
    let old = w.session;
    w.client.disconnect(old).unwrap();
    let closed = w.run_until(
        Duration::from_secs(5),
        |n| matches!(n, Notice::Session(Event::Disconnected(s)) if s == &old),
    );
    assert!(closed, "the client saw its session end");
    assert!(!w.client.core().is_connected(old));
    w.session = w.client.create_session(&w.server.addr()).unwrap();
    let up = w.run_until(Duration::from_secs(5), |n| {
        matches!(n, Notice::Session(Event::Connected(_)))
    });
    assert!(up, "a new session opened");
    call(&mut w, REVERSE, b"two", 2);
    wait_for(&mut w, 2);
    assert_eq!(w.done[1].result.as_deref().unwrap(), b"owt");
}

mod faults {
    //! Random workloads over the simulator's own faults (loss, duplication, delay), seeded:
    //! every request ends exactly once, with the bytes its handler wrote, and each handler
    //! runs exactly once per request.
    use super::*;
    use proptest::prelude::*;
    use std::sync::{Arc, Mutex};

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn every_request_ends_once(
            seed in any::<u64>(),
            drop in 0.0f64..0.15,
            dup in 0.0f64..0.15,
            sizes in proptest::collection::vec(0usize..6000, 1..16),
        ) {
            let cfg = FabricConfig {
                faults: Faults { drop, duplicate: dup, delay: 0.1, max_extra_delay_ns: 50_000 },
                seed,
                ..FabricConfig::default()
            };
            let sim = Sim::with_config(cfg, 2);
            let runs = Arc::new(Mutex::new(vec![0u32; sizes.len()]));
            let mut w = world(&sim, engine_cfg(8 << 10));
            let counted = runs.clone();
            // Requests carry their index in the first two bytes; the answer is the request
            // reversed.
            w.server.register_handler(3, move |req, out| {
                let i = usize::from(u16::from_le_bytes([req[0], req[1]]));
                counted.lock().unwrap()[i] += 1;
                for (o, b) in out.iter_mut().zip(req.iter().rev()) {
                    *o = *b;
                }
                req.len()
            }).unwrap();
            let request = |i: usize, len: usize| {
                let mut r = pattern(len.max(2), i as u8);
                r[..2].copy_from_slice(&(i as u16).to_le_bytes());
                r
            };
            let mut sent = 0;
            while w.done.len() < sizes.len() {
                while sent < sizes.len() && sent - w.done.len() < 4 {
                    let r = request(sent, sizes[sent]);
                    call(&mut w, 3, &r, sent as u64);
                    sent += 1;
                }
                let target = w.done.len() + 1;
                let mut seen = w.done.len();
                let ok = w.run_until(Duration::from_secs(20), |n| {
                    seen += usize::from(!matches!(n, Notice::Session(_)));
                    seen >= target
                });
                prop_assert!(ok, "seed {seed}: stuck with {} of {} done", w.done.len(), sizes.len());
            }
            let mut tags: Vec<u64> = w.done.iter().map(|d| d.tag).collect();
            tags.sort_unstable();
            prop_assert_eq!(tags, (0..sizes.len() as u64).collect::<Vec<_>>(), "seed {}", seed);
            for RpcOutcome { tag, result: r, .. } in &w.done {
                let want: Vec<u8> = request(*tag as usize, sizes[*tag as usize]).into_iter().rev().collect();
                prop_assert_eq!(r.as_deref().ok(), Some(&want[..]), "seed {}, request {}", seed, tag);
            }
            prop_assert!(runs.lock().unwrap().iter().all(|&n| n == 1), "seed {}: handler runs {:?}", seed, runs.lock().unwrap());
        }
    }
}

/// Clients that come and go do not fill the server's peer table: five in turn, each
/// connecting, calling and leaving, on a server with room for two peers.
#[test]
fn peers_that_leave_are_released() {
    let sim = Sim::with_devices(6);
    let mut server = rpc(&sim, "sim0", engine_cfg(4 << 10));
    server
        .register_handler(ECHO, |req, out| {
            out[..req.len()].copy_from_slice(req);
            req.len()
        })
        .unwrap();
    for k in 1..=5u8 {
        let mut client = rpc(&sim, &format!("sim{k}"), engine_cfg(4 << 10));
        let s = client.create_session(&server.addr()).unwrap();
        let mut phase = 0; // 0 connecting, 1 calling, 2 closing, 3 closed
        let end = Instant::now() + Duration::from_secs(5);
        while phase < 3 && Instant::now() < end {
            server.run_event_loop_once(&mut |_| {}).unwrap();
            let mut seen = None;
            client
                .run_event_loop_once(&mut |n| match n {
                    Notice::Session(Event::Connected(_)) => seen = Some(1),
                    Notice::Response { bytes, .. } => {
                        assert_eq!(bytes, [k; 8]);
                        seen = Some(2);
                    }
                    Notice::Session(Event::Disconnected(_)) => seen = Some(3),
                    _ => {}
                })
                .unwrap();
            match seen {
                Some(1) => client
                    .enqueue_request(s, ECHO, &[k; 8], 0)
                    .map(drop)
                    .unwrap(),
                Some(2) => client.disconnect(s).unwrap(),
                _ => {}
            }
            phase = seen.unwrap_or(phase).max(phase);
        }
        assert_eq!(phase, 3, "client {k} went through");
        // The last datagrams leave; then nothing names either peer.
        for _ in 0..64 {
            server.run_event_loop_once(&mut |_| {}).unwrap();
            client.run_event_loop_once(&mut |_| {}).unwrap();
        }
        assert_eq!(client.peer_count(), 0, "client {k}");
        assert!(
            server.peer_count() <= 1,
            "server after client {k}: {}",
            server.peer_count()
        );
    }
}

/// Sends `packets` to `to` from a UD queue pair of its own on `dev`, as a stranger would.
fn stranger(sim: &Sim, dev: &str, to: &zverbs::Endpoint, packets: &[Vec<u8>]) {
    use zverbs::qp::{AddressHandle, QpConfig, QueuePair, UdOptions};
    use zverbs::{AhAttr, CompletionQueue, SendFlags, SendOp, SendWr, UdDest, WorkCompletion};
    let ctx = Context::open(sim, dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 16).unwrap();
    let qkey = EngineConfig::default().qkey;
    let qp = QueuePair::create_ud(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
    let opts = UdOptions {
        qkey,
        pkey_index: 0,
    };
    let qp = qp
        .into_init(&opts)
        .unwrap()
        .into_rtr()
        .unwrap()
        .into_rts()
        .unwrap();
    let attr = AhAttr::new(1, to.gid, 0, to.lid);
    let ah = AddressHandle::create(&pd, &attr).unwrap();
    for p in packets {
        let mut bytes = p.clone();
        let mr = pd.register(&mut bytes).unwrap();
        let dest = UdDest {
            ah: ah.key(),
            remote_qpn: to.qp_num,
            remote_qkey: qkey,
        };
        let mut wr = SendWr::<1>::new(1, SendOp::Datagram { dest, imm: None }, SendFlags::SIGNALED);
        (wr.sg_list[0], wr.num_sge) = (mr.slice(..).unwrap().sge(), 1);
        // SAFETY: `bytes` is registered and untouched until the completion below.
        unsafe { qp.post_send(&[wr]) }.unwrap();
        let mut wc = [WorkCompletion::EMPTY; 1];
        while cq.poll(&mut wc).unwrap() == 0 {}
    }
}

/// A stranger that connects and then says nothing holds the server's only session for the
/// idle timeout, no longer: then its session and its address handle go, and a real client
/// gets the session.
#[test]
fn a_silent_stranger_is_let_go() {
    let sim = Sim::with_devices(3);
    let mut cfg = engine_cfg(4 << 10);
    cfg.core.max_sessions = 1;
    cfg.core.idle_timeout_ns = 20 * MS;
    let mut server = rpc(&sim, "sim0", cfg.clone());
    let connect = {
        let mut ep = zverbs::rpc::RpcCore::new(cfg.core.clone()).unwrap();
        ep.connect(1).unwrap();
        let mut buf = [0u8; 1024];
        let t = ep.poll_transmit(0, &mut buf).unwrap();
        buf[..t.len].to_vec()
    };
    stranger(&sim, "sim2", &server.addr(), &[connect]);
    let mut accepted = false;
    let mut closed = false;
    let t0 = Instant::now();
    while !closed && t0.elapsed() < Duration::from_secs(2) {
        server
            .run_event_loop_once(&mut |n| match n {
                Notice::Session(Event::Accepted { .. }) => accepted = true,
                Notice::Session(Event::Disconnected(_)) => closed = true,
                _ => {}
            })
            .unwrap();
    }
    assert!(accepted && closed, "accepted {accepted}, closed {closed}");
    assert!(
        t0.elapsed() >= Duration::from_millis(20),
        "not before the idle timeout"
    );
    for _ in 0..64 {
        server.run_event_loop_once(&mut |_| {}).unwrap();
    }
    assert_eq!(
        server.peer_count(),
        0,
        "the stranger's address handle is gone"
    );
    let mut client = rpc(&sim, "sim1", cfg);
    client.create_session(&server.addr()).unwrap();
    let mut up = false;
    let t0 = Instant::now();
    while !up && t0.elapsed() < Duration::from_secs(2) {
        server.run_event_loop_once(&mut |_| {}).unwrap();
        client
            .run_event_loop_once(&mut |n| up |= matches!(n, Notice::Session(Event::Connected(_))))
            .unwrap();
    }
    assert!(up, "the freed session serves a real client");
}

/// A datagram size over the port's active MTU is refused where the engine is made (the
/// device would drop every full datagram), naming the field and the port's limit.
#[test]
fn an_mtu_over_the_port_is_refused_at_creation() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let port = ctx.query_port(1).unwrap().active_mtu.bytes();
    let cfg = |mtu: usize| EngineConfig {
        core: Config {
            mtu,
            ..Config::default()
        },
        ..EngineConfig::default()
    };
    match Rpc::new(&ctx, ctx.alloc_pd().unwrap(), cfg(port as usize + 1)) {
        Err(zverbs::rpc::EngineError::Device(zverbs::Error::ExceedsDevice {
            field,
            value,
            limit,
        })) => assert_eq!(
            (field, value, limit),
            ("core.mtu", u64::from(port) + 1, port.into())
        ),
        Err(e) => panic!("expected ExceedsDevice, got {e}"),
        Ok(_) => panic!("an MTU over the port's was accepted"),
    }
    let e = Rpc::new(&ctx, ctx.alloc_pd().unwrap(), cfg(port as usize + 1)).err();
    assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::InvalidArgument));
    assert!(Rpc::new(&ctx, ctx.alloc_pd().unwrap(), cfg(port as usize)).is_ok());
}
