//! The RPC protocol core between two endpoints over a simulated network (`Pair`): a
//! client, a server whose handler answers `answer(request)`, a queue of datagrams in
//! between that can lose, duplicate, delay and reorder them by a seeded RNG, and a
//! simulated clock that jumps to the next delivery or timer. Nothing here needs a NIC.
//!
//! The property test runs random workloads (1-3 sessions, up to 40 requests of 0..=2048
//! bytes, up to 20 packets each way) under random loss, duplication and reordering:
//! every request gets exactly one outcome, a response, with the bytes the handler wrote
//! for that request; each handler runs exactly once. Responses are not checked for order:
//! the core, like eRPC, promises none (see `zverbs::rpc`).
#![cfg(feature = "std")]

use std::collections::HashSet;

use proptest::prelude::*;
use zverbs::rpc::{Config, Event, Header, PktType, Refusal, RpcCore, RpcError, HEADER_LEN};
use zverbs::ErrorKind;

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

#[path = "rpc_core/pair.rs"]
mod pair;

use pair::{answer, Faults, Pair, Rng, CLIENT, MS, SERVER};

fn cfg() -> Config {
    Config {
        idle_timeout_ns: u64::MAX, // as `Pair` sets it (see there)
        max_sessions: 4,
        max_msg_size: 16 * 1024,
        session_timeout_ns: 50 * MS,
        ..Config::default()
    }
}

#[test]
fn single_small_request() {
    let (mut p, s) = Pair::connected(cfg(), 1);
    let h = p.request(s, b"ping");
    p.drive();
    assert_eq!(p.response(h), p.expected(h));
    assert_eq!(p.runs.values().copied().collect::<Vec<_>>(), [1]);
    assert_eq!(p.client.in_flight(s), Some(0));
    assert_eq!(
        p.client.next_timeout(),
        None,
        "an idle session runs no timer"
    );
}

#[test]
fn multi_packet_request_and_response() {
    let cfg = Config {
        max_msg_size: 10_000,
        ..cfg()
    };
    let (mut p, s) = Pair::connected(cfg, 2);
    let before = (p.client.stats().tx_packets, p.server.stats().tx_packets);
    // Find a request whose answer is 10,000 bytes too: 10 packets of 1000 each way.
    let msg = (0u32..)
        .map(|i| {
            let mut m = vec![0x5a; 10_000];
            m[..4].copy_from_slice(&i.to_le_bytes());
            m
        })
        .find(|m| answer(m, 10_000).len() > 9_000)
        .unwrap();
    let resp_pkts = answer(&msg, 10_000).len().div_ceil(1000) as u64;
    let h = p.request(s, &msg);
    p.drive();
    assert_eq!(p.response(h), p.expected(h));
    // Client: 10 request packets and an RFR for each response packet after the first.
    // Server: a CR for each request packet but the last, and the response packets.
    let sent = (p.client.stats().tx_packets, p.server.stats().tx_packets);
    assert_eq!(sent.0 - before.0, 10 + resp_pkts - 1);
    assert_eq!(sent.1 - before.1, 9 + resp_pkts);
    assert_eq!(p.client.stats().retransmits, 0);
}

#[test]
fn window_and_credits_are_respected() {
    let (mut p, s) = Pair::connected(cfg(), 3);
    let big = vec![7u8; 10_000]; // 11 packets of 1000 at 1024-byte datagrams
    let handles: Vec<_> = (0..8u8)
        .map(|i| p.request(s, &[&big[..], &[i]].concat()))
        .collect();
    assert_eq!(
        p.client.enqueue_request(s, 0, b"ninth"),
        Err(RpcError::WindowFull { window: 8 })
    );
    // 88 packets to send, 32 credits: 32 go out, then nothing until replies come.
    p.flush();
    assert_eq!(p.net.len(), 32);
    assert_eq!(p.client.in_flight(s), Some(32));
    while p.step() {
        assert!(p.net.len() <= 32, "{} packets in flight", p.net.len());
        assert!(p.client.in_flight(s).unwrap() <= 32);
    }
    for h in handles {
        assert_eq!(p.response(h), p.expected(h));
    }
    assert_eq!(p.client.stats().retransmits, 0);
    p.request(s, b"ninth");
    p.drive();
    assert_eq!(p.outcomes.len(), 9);
}

#[test]
fn server_crash_fails_outstanding_requests_once() {
    let (mut p, s) = Pair::connected(cfg(), 4);
    let hs: Vec<_> = (0..3).map(|i| p.request(s, &[i; 3000])).collect();
    let t0 = p.now;
    p.server = RpcCore::new(p.cfg.clone()).unwrap(); // restarted: knows no session
    p.drive();
    for h in &hs {
        assert_eq!(p.outcomes[h], Err(RpcError::TimedOut));
    }
    let (first, last) = (p.log[0].0, p.log[2].0);
    assert!(
        first == last && last - t0 >= 50 * MS && last - t0 < 60 * MS,
        "{t0} {last}"
    );
    assert_eq!(p.client.stats().session_timeouts, 1);
    assert!(p.server.stats().unknown_session >= 3);
    assert_eq!(p.server.stats().malformed, 0);
    assert_eq!(
        p.client.enqueue_request(s, 0, b"x"),
        Err(RpcError::SessionFailed)
    );
    p.client.disconnect(s).unwrap();
    p.flush();
    assert_eq!(p.client_events.last(), Some(&Event::Disconnected(s)));
}

#[test]
fn server_that_stops_answering_mid_message() {
    let cfg = Config {
        credits: 4,
        ..cfg()
    };
    let (mut p, s) = Pair::connected(cfg, 5);
    let h = p.request(s, &[1; 16 * 1024]);
    let h2 = p.request(s, b"small");
    p.step(); // 4 of the 17 request packets reach the server
    p.server_down = true;
    p.drive();
    assert_eq!(p.outcomes[&h], Err(RpcError::TimedOut));
    assert_eq!(p.outcomes[&h2], Err(RpcError::TimedOut));
    assert_eq!(RpcError::TimedOut.kind(), ErrorKind::Timeout);
    assert!(p.client.stats().retransmits > 0);
    assert_eq!(p.outcomes.len(), 2);
}

#[test]
fn slow_handler_keeps_the_session_alive() {
    let (mut p, s) = Pair::connected(cfg(), 6);
    p.hold = true;
    let h = p.request(s, &[9; 2500]);
    let t0 = p.now;
    p.drive_until(|p| p.now > t0 + 200 * MS); // 4 session timeouts
    assert!(p.outcomes.is_empty() && p.held.len() == 1);
    let held = p.held.pop().unwrap();
    p.respond(held);
    p.drive();
    assert_eq!(p.response(h), p.expected(h));
    assert!(p.server.stats().duplicate_requests > 0);
    assert_eq!(p.runs[&held], 1);
}

#[test]
fn garbage_and_unknown_sessions_are_counted() {
    let (mut p, s) = Pair::connected(cfg(), 7);
    let mut rng = Rng(7);
    let mut n = 0;
    for len in 0..200 {
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        p.server.handle_packet(p.now, CLIENT, &bytes);
        p.client.handle_packet(p.now, SERVER, &bytes);
        n += 1;
    }
    assert_eq!(p.server.stats().malformed, n);
    // Well formed, but for a session that does not exist, or from the wrong peer.
    let mut buf = [0u8; HEADER_LEN + 4];
    let mut req = Header {
        pkt_type: PktType::Req,
        req_type: 0,
        dest_session: 3,
        src_session: s.index(),
        msg_size: 4,
        pkt_num: 0,
        payload_len: 4,
        req_num: 0,
    };
    req.encode(&mut buf).unwrap();
    p.server.handle_packet(p.now, CLIENT, &buf);
    req.dest_session = 0;
    req.encode(&mut buf).unwrap();
    p.server.handle_packet(p.now, 99, &buf);
    assert_eq!(p.server.stats().unknown_session, 2);
    req.dest_session = 4; // beyond max_sessions
    req.encode(&mut buf).unwrap();
    p.server.handle_packet(p.now, CLIENT, &buf);
    assert_eq!(p.server.stats().malformed, n + 1);
    assert!(p.runs.is_empty());
    // The session still works.
    let h = p.request(s, b"after");
    p.drive();
    assert_eq!(p.response(h), p.expected(h));
}

#[test]
fn connect_refused_when_the_server_is_full() {
    let mut p = Pair::new(cfg(), 8);
    p.server = RpcCore::new(Config {
        max_sessions: 1,
        ..cfg()
    })
    .unwrap();
    let a = p.connect();
    let b = p.client.connect(SERVER).unwrap();
    p.drive();
    let refused = Event::ConnectFailed {
        session: b,
        error: RpcError::Refused(Refusal::NoFreeSession),
    };
    assert!(p.client_events.contains(&refused));
    assert_eq!(p.server.stats().refused_connects, 1);
    // Once the first session is closed, there is room.
    let on_server = p.server_session(0);
    p.client.disconnect(a).unwrap();
    p.drive();
    assert!(p.server_events.contains(&Event::Disconnected(on_server)));
    let c = p.connect();
    assert!(p.client.is_connected(c));
}

#[test]
fn handshake_gives_up() {
    let mut p = Pair::new(cfg(), 9);
    p.server_down = true;
    let s = p.client.connect(SERVER).unwrap();
    p.drive();
    assert_eq!(
        p.client_events,
        [Event::ConnectFailed {
            session: s,
            error: RpcError::HandshakeTimedOut
        }]
    );
    assert_eq!(p.now, 10 * 5 * MS); // ten tries, 5 ms apart
    assert_eq!(p.client.stats().tx_packets, 10);
}

#[test]
fn connect_of_another_version_is_refused() {
    let mut p = Pair::new(cfg(), 10);
    let s = p.client.connect(SERVER).unwrap();
    let mut buf = [0u8; 1024];
    let t = p.client.poll_transmit(0, &mut buf).unwrap();
    buf[1] = 2; // a newer header version
    p.server.handle_packet(0, CLIENT, &buf[..t.len]);
    let t = p.server.poll_transmit(0, &mut buf).unwrap();
    p.client.handle_packet(0, SERVER, &buf[..t.len]);
    assert_eq!(
        p.client.poll_event(),
        Some(Event::ConnectFailed {
            session: s,
            error: RpcError::Refused(Refusal::Version)
        })
    );
    assert_eq!(p.server.stats().malformed, 1);
}

#[test]
fn disconnect_frees_both_ends() {
    let (mut p, s) = Pair::connected(cfg(), 11);
    let h = p.request(s, b"one");
    assert_eq!(
        p.client.disconnect(s),
        Err(RpcError::Busy { outstanding: 1 })
    );
    p.drive();
    assert_eq!(p.response(h), p.expected(h));
    p.client.disconnect(s).unwrap();
    p.drive();
    assert_eq!(p.client_events.last(), Some(&Event::Disconnected(s)));
    assert!(matches!(
        p.server_events.last(),
        Some(Event::Disconnected(_))
    ));
    assert_eq!(
        p.client.enqueue_request(s, 0, b"x"),
        Err(RpcError::UnknownSession)
    );
}

#[test]
fn the_data_path_does_not_allocate() {
    let cfg = cfg();
    let (mut c, mut s) = (
        RpcCore::new(cfg.clone()).unwrap(),
        RpcCore::new(cfg).unwrap(),
    );
    let session = c.connect(SERVER).unwrap();
    let (mut buf, mut resp) = ([0u8; 1024], [0u8; 4000]);
    let mut done = 0;
    let ((), allocs) = zverbs_testkit::measure(|| {
        for now in 1..10_000u64 {
            while let Some(t) = c.poll_transmit(now, &mut buf) {
                s.handle_packet(now, CLIENT, &buf[..t.len]);
            }
            while let Some(t) = s.poll_transmit(now, &mut buf) {
                c.handle_packet(now, SERVER, &buf[..t.len]);
            }
            while let Some(ev) = s.poll_event() {
                if let Event::Request { handle, .. } = ev {
                    let n = s.request(handle).unwrap().len();
                    resp[..n].copy_from_slice(s.request(handle).unwrap());
                    s.respond(handle, &resp[..n]).unwrap();
                }
            }
            while let Some(ev) = c.poll_event() {
                match ev {
                    Event::Connected(_) => {}
                    Event::Response { handle, .. } => {
                        assert_eq!(c.response(handle).unwrap().len(), 3000);
                        c.release(handle).unwrap();
                        done += 1;
                    }
                    e => panic!("{e:?}"),
                }
            }
            if c.is_connected(session) && now % 3 == 0 {
                let _ = c.enqueue_request(session, 1, &resp[..3000]);
            }
        }
    });
    assert!(done > 1000, "{done}");
    assert_eq!(allocs.count, 0);
}

// --- random workloads under random faults ---

#[derive(Clone, Debug)]
struct Workload {
    seed: u64,
    sessions: usize,
    /// (session, request size)
    requests: Vec<(usize, usize)>,
    loss: u32,
    dup: u32,
    jitter: u64,
}

const MAX_MSG: usize = 2048;

fn workload() -> impl Strategy<Value = Workload> {
    (
        any::<u64>(),
        1..=3usize,
        prop::collection::vec((0..3usize, 0..=MAX_MSG), 1..40),
        0..20u32,
        0..20u32,
        0..20_000u64,
    )
        .prop_map(|(seed, sessions, requests, loss, dup, jitter)| Workload {
            seed,
            sessions,
            requests: requests
                .into_iter()
                .map(|(s, len)| (s % sessions, len))
                .collect(),
            loss,
            dup,
            jitter,
        })
}

fn run(w: &Workload) -> Result<(), TestCaseError> {
    run_pair(w).map(drop)
}

fn run_pair(w: &Workload) -> Result<Pair, TestCaseError> {
    let cfg = Config {
        max_sessions: 4,
        mtu: 128, // 104 bytes a packet: up to 20 packets a message
        max_msg_size: MAX_MSG,
        ..Config::default() // window 8, 32 credits, 5 ms RTO, 1 s session timeout
    };
    let mut p = Pair::new(cfg, w.seed);
    let sessions: Vec<_> = (0..w.sessions).map(|_| p.connect()).collect();
    p.faults = Faults {
        loss: w.loss,
        dup: w.dup,
        latency: 2_000,
        jitter: w.jitter,
    };
    let mut rng = Rng(w.seed ^ 0xfeed);
    let mut backlog: Vec<Vec<Vec<u8>>> = vec![Vec::new(); w.sessions];
    for (i, &(s, len)) in w.requests.iter().enumerate() {
        let mut msg: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let id = (i as u64).to_le_bytes();
        let n = len.min(8);
        msg[..n].copy_from_slice(&id[..n]);
        backlog[s].push(msg);
    }
    for b in &mut backlog {
        b.reverse();
    }
    // Enqueue as the windows allow, until every request has its outcome.
    loop {
        for (s, b) in sessions.iter().zip(&mut backlog) {
            while let Some(msg) = b.last() {
                match p.client.enqueue_request(*s, 3, msg) {
                    Ok(h) => {
                        p.sent.insert(h, b.pop().unwrap());
                    }
                    Err(RpcError::WindowFull { .. }) => break,
                    Err(e) => return Err(TestCaseError::fail(format!("enqueue: {e}"))),
                }
            }
        }
        if !p.step() {
            break;
        }
        prop_assert!(p.now < 60_000 * MS, "no end in sight");
    }
    let seed = w.seed;
    prop_assert!(
        backlog.iter().all(Vec::is_empty),
        "seed {seed}: requests left"
    );
    prop_assert_eq!(p.outcomes.len(), w.requests.len(), "seed {}", seed);
    for (h, outcome) in &p.outcomes {
        // One session timeout is 200 RTOs: at under 20% loss each way, never.
        let got = outcome
            .as_ref()
            .map_err(|e| TestCaseError::fail(format!("seed {seed}: {e}")))?;
        prop_assert_eq!(got, &p.expected(*h), "seed {}: wrong response", seed);
    }
    // The server ran each request's handler exactly once.
    prop_assert_eq!(p.runs.len(), w.requests.len(), "seed {}", seed);
    prop_assert!(
        p.runs.values().all(|&n| n == 1),
        "seed {seed}: a handler ran twice"
    );
    let distinct: HashSet<_> = p.runs.keys().map(|h| (h.session(), h.req_num())).collect();
    prop_assert_eq!(distinct.len(), p.runs.len());
    Ok(p)
}

#[test]
fn faults_exercise_every_recovery_path() {
    let w = Workload {
        seed: 42,
        sessions: 3,
        requests: (0..60).map(|i| (i % 3, i * 97 % (MAX_MSG + 1))).collect(),
        loss: 15,
        dup: 15,
        jitter: 20_000,
    };
    let p = run_pair(&w).unwrap();
    let (c, s) = (p.client.stats(), p.server.stats());
    eprintln!("client {c:?}\nserver {s:?}");
    assert!(c.retransmits > 0 && s.duplicate_requests > 0);
    assert!(c.stale > 0 && s.stale > 0);
    assert_eq!(
        c.malformed + s.malformed + s.unknown_session + c.unknown_session,
        0
    );
}

/// 256 cases (about 3 s in a debug build) unless `PROPTEST_CASES` says otherwise. A
/// failure prints its `Workload`, seed included; `run` on it reproduces the case.
fn proptest_config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    ProptestConfig::with_cases(cases)
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn every_request_gets_one_answer_under_faults(w in workload()) {
        run(&w)?;
    }
}
