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

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use zverbs::rpc::{
    Config, Endpoint, Event, Header, PktType, Refusal, RequestHandle, RpcError, ServerHandle,
    SessionId, HEADER_LEN,
};
use zverbs::ErrorKind;

#[path = "common/counting.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

const CLIENT: u64 = 1;
const SERVER: u64 = 2;
const MS: u64 = 1_000_000;

/// The server's handler: a response of a length and contents that depend on every byte
/// of the request, 0..=`max` bytes.
fn answer(req: &[u8], max: usize) -> Vec<u8> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in req {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let len = (h % (max as u64 + 1)) as usize;
    (0..len)
        .map(|i| (h >> (i % 8 * 8)) as u8 ^ i as u8)
        .collect()
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn percent(&mut self, p: u32) -> bool {
        self.below(100) < u64::from(p)
    }
}

/// What the network does to each datagram.
#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    /// Percent lost.
    loss: u32,
    /// Percent delivered twice.
    dup: u32,
    /// Every delivery takes this long…
    latency: u64,
    /// …plus up to this much more, so that datagrams overtake each other.
    jitter: u64,
}

struct Packet {
    at: u64,
    to_server: bool,
    bytes: Vec<u8>,
}

/// A client and a server endpoint and the network between them.
struct Pair {
    client: Endpoint,
    server: Endpoint,
    cfg: Config,
    now: u64,
    net: Vec<Packet>,
    rng: Rng,
    faults: Faults,
    /// Everything to or from the server is lost.
    server_down: bool,
    /// The server keeps requests in `held` instead of answering them.
    hold: bool,
    held: Vec<ServerHandle>,
    /// Handler runs per request, as the server saw them.
    runs: HashMap<ServerHandle, u32>,
    /// What the client sent, and what became of it.
    sent: HashMap<RequestHandle, Vec<u8>>,
    outcomes: HashMap<RequestHandle, Result<Vec<u8>, RpcError>>,
    /// The order of outcomes, with their times.
    log: Vec<(u64, RequestHandle)>,
    client_events: Vec<Event>,
    server_events: Vec<Event>,
}

impl Pair {
    fn new(cfg: Config, seed: u64) -> Pair {
        Pair {
            client: Endpoint::new(cfg.clone()).unwrap(),
            server: Endpoint::new(cfg.clone()).unwrap(),
            cfg,
            now: 0,
            net: Vec::new(),
            rng: Rng(seed),
            faults: Faults {
                latency: 2_000,
                ..Faults::default()
            },
            server_down: false,
            hold: false,
            held: Vec::new(),
            runs: HashMap::new(),
            sent: HashMap::new(),
            outcomes: HashMap::new(),
            log: Vec::new(),
            client_events: Vec::new(),
            server_events: Vec::new(),
        }
    }

    /// A pair with one connected session.
    fn connected(cfg: Config, seed: u64) -> (Pair, SessionId) {
        let mut p = Pair::new(cfg, seed);
        let s = p.connect();
        (p, s)
    }

    /// Opens one more session and drives until it is connected.
    fn connect(&mut self) -> SessionId {
        let s = self.client.connect(SERVER).unwrap();
        self.drive_until(|p| p.client.is_connected(s));
        s
    }

    fn request(&mut self, s: SessionId, msg: &[u8]) -> RequestHandle {
        let h = self.client.enqueue_request(s, 3, msg).unwrap();
        assert!(self.sent.insert(h, msg.to_vec()).is_none(), "handle reused");
        h
    }

    fn send(&mut self, to_server: bool, bytes: &[u8]) {
        let f = self.faults;
        if self.server_down || self.rng.percent(f.loss) {
            return;
        }
        let copies = if self.rng.percent(f.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let at = self.now + f.latency + self.rng.below(f.jitter + 1);
            self.net.push(Packet {
                at,
                to_server,
                bytes: bytes.to_vec(),
            });
        }
    }

    /// Moves every datagram the endpoints have to send onto the network, and handles
    /// every event, until neither has more.
    fn flush(&mut self) {
        let mut buf = vec![0u8; self.cfg.mtu];
        loop {
            let mut busy = false;
            while let Some(t) = self.client.poll_transmit(self.now, &mut buf) {
                assert_eq!(t.to, SERVER);
                self.send(true, &buf[..t.len]);
                busy = true;
            }
            while let Some(t) = self.server.poll_transmit(self.now, &mut buf) {
                assert_eq!(t.to, CLIENT);
                self.send(false, &buf[..t.len]);
                busy = true;
            }
            while let Some(ev) = self.server.poll_event() {
                busy = true;
                self.server_events.push(ev);
                if let Event::Request { handle, .. } = ev {
                    *self.runs.entry(handle).or_default() += 1;
                    if self.hold {
                        self.held.push(handle);
                    } else {
                        self.respond(handle);
                    }
                }
            }
            while let Some(ev) = self.client.poll_event() {
                busy = true;
                self.client_events.push(ev);
                let (handle, outcome) = match ev {
                    Event::Response { handle, .. } => {
                        let bytes = self.client.response(handle).unwrap().to_vec();
                        self.client.release(handle).unwrap();
                        (handle, Ok(bytes))
                    }
                    Event::Failed { handle, error } => (handle, Err(error)),
                    _ => continue,
                };
                assert!(
                    self.sent.contains_key(&handle),
                    "outcome of a request never sent"
                );
                let before = self.outcomes.insert(handle, outcome);
                assert!(before.is_none(), "second outcome for {handle:?}");
                self.log.push((self.now, handle));
            }
            if !busy {
                return;
            }
        }
    }

    fn respond(&mut self, handle: ServerHandle) {
        let resp = answer(self.server.request(handle).unwrap(), self.cfg.max_msg_size);
        self.server.respond(handle, &resp).unwrap();
    }

    /// One step: flush, jump to the next delivery or timer, deliver and fire what is due.
    /// False when nothing is left to happen.
    fn step(&mut self) -> bool {
        self.flush();
        let next = [
            self.net.iter().map(|p| p.at).min(),
            self.client.next_timeout(),
            self.server.next_timeout(),
        ];
        let Some(next) = next.into_iter().flatten().min() else {
            return false;
        };
        self.now = self.now.max(next);
        while let Some(i) = (0..self.net.len())
            .filter(|&i| self.net[i].at <= self.now)
            .min_by_key(|&i| self.net[i].at)
        {
            let p = self.net.remove(i);
            if p.to_server {
                if !self.server_down {
                    self.server.handle_packet(self.now, CLIENT, &p.bytes);
                }
            } else {
                self.client.handle_packet(self.now, SERVER, &p.bytes);
            }
        }
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
        true
    }

    /// Steps until `done` or nothing is left to happen; at most 60 simulated seconds.
    fn drive_until(&mut self, done: impl Fn(&Pair) -> bool) {
        while !done(self) && self.step() {
            assert!(self.now < 60_000 * MS, "no end in sight");
        }
        self.flush();
    }

    fn drive(&mut self) {
        self.drive_until(|_| false);
    }

    /// The response the client got for `h`.
    fn response(&self, h: RequestHandle) -> &[u8] {
        self.outcomes[&h].as_deref().expect("a response")
    }

    fn expected(&self, h: RequestHandle) -> Vec<u8> {
        answer(&self.sent[&h], self.cfg.max_msg_size)
    }
}

fn cfg() -> Config {
    Config {
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
    p.server = Endpoint::new(p.cfg.clone()).unwrap(); // restarted: knows no session
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
    p.server = Endpoint::new(Config {
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

impl Pair {
    /// The server's session numbered `i` as the server last reported it.
    fn server_session(&self, i: u16) -> SessionId {
        self.server_events
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::Accepted { session, .. } if session.index() == i => Some(*session),
                _ => None,
            })
            .unwrap()
    }
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
        Endpoint::new(cfg.clone()).unwrap(),
        Endpoint::new(cfg).unwrap(),
    );
    let session = c.connect(SERVER).unwrap();
    let (mut buf, mut resp) = ([0u8; 1024], [0u8; 4000]);
    let mut done = 0;
    let ((), allocs) = counting::count_allocs(|| {
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
    assert_eq!(allocs, 0);
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
