//! The harness of `tests/rpc_core.rs`: a client and a server endpoint, and the network
//! and clock between them.

use std::collections::HashMap;

use zverbs::rpc::{Config, Event, RequestHandle, RpcCore, RpcError, ServerHandle, SessionId};

pub const CLIENT: u64 = 1;
pub const SERVER: u64 = 2;
pub const MS: u64 = 1_000_000;

/// The server's handler: a response of a length and contents that depend on every byte
/// of the request, 0..=`max` bytes.
pub fn answer(req: &[u8], max: usize) -> Vec<u8> {
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
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    pub fn percent(&mut self, p: u32) -> bool {
        self.below(100) < u64::from(p)
    }
}

/// What the network does to each datagram.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Percent lost.
    pub loss: u32,
    /// Percent delivered twice.
    pub dup: u32,
    /// Every delivery takes this long…
    pub latency: u64,
    /// …plus up to this much more, so that datagrams overtake each other.
    pub jitter: u64,
}

pub struct Packet {
    pub at: u64,
    pub to_server: bool,
    pub bytes: Vec<u8>,
}

/// A client and a server endpoint and the network between them.
pub struct Pair {
    pub client: RpcCore,
    pub server: RpcCore,
    pub cfg: Config,
    pub now: u64,
    pub net: Vec<Packet>,
    pub rng: Rng,
    pub faults: Faults,
    /// Everything to or from the server is lost.
    pub server_down: bool,
    /// The server keeps requests in `held` instead of answering them.
    pub hold: bool,
    pub held: Vec<ServerHandle>,
    /// Handler runs per request, as the server saw them.
    pub runs: HashMap<ServerHandle, u32>,
    /// What the client sent, and what became of it.
    pub sent: HashMap<RequestHandle, Vec<u8>>,
    pub outcomes: HashMap<RequestHandle, Result<Vec<u8>, RpcError>>,
    /// The order of outcomes, with their times.
    pub log: Vec<(u64, RequestHandle)>,
    pub client_events: Vec<Event>,
    pub server_events: Vec<Event>,
}

impl Pair {
    /// A client and a server with `cfg`, the server's idle timeout off: a run ends when
    /// nothing is left to happen, and an idle serving session would always have its timer
    /// left (the idle timeout has its own test in `src/rpc/tests.rs`).
    pub fn new(cfg: Config, seed: u64) -> Pair {
        let cfg = Config {
            idle_timeout_ns: u64::MAX,
            ..cfg
        };
        Pair {
            client: RpcCore::new(cfg.clone()).unwrap(),
            server: RpcCore::new(cfg.clone()).unwrap(),
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
    pub fn connected(cfg: Config, seed: u64) -> (Pair, SessionId) {
        let mut p = Pair::new(cfg, seed);
        let s = p.connect();
        (p, s)
    }

    /// Opens one more session and drives until it is connected.
    pub fn connect(&mut self) -> SessionId {
        let s = self.client.connect(SERVER).unwrap();
        self.drive_until(|p| p.client.is_connected(s));
        s
    }

    pub fn request(&mut self, s: SessionId, msg: &[u8]) -> RequestHandle {
        let h = self.client.enqueue_request(s, 3, msg).unwrap();
        assert!(self.sent.insert(h, msg.to_vec()).is_none(), "handle reused");
        h
    }

    pub fn send(&mut self, to_server: bool, bytes: &[u8]) {
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
    pub fn flush(&mut self) {
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

    pub fn respond(&mut self, handle: ServerHandle) {
        let resp = answer(self.server.request(handle).unwrap(), self.cfg.max_msg_size);
        self.server.respond(handle, &resp).unwrap();
    }

    /// One step: flush, jump to the next delivery or timer, deliver and fire what is due.
    /// False when nothing is left to happen.
    pub fn step(&mut self) -> bool {
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
    pub fn drive_until(&mut self, done: impl Fn(&Pair) -> bool) {
        while !done(self) && self.step() {
            assert!(self.now < 60_000 * MS, "no end in sight");
        }
        self.flush();
    }

    pub fn drive(&mut self) {
        self.drive_until(|_| false);
    }

    /// The response the client got for `h`.
    pub fn response(&self, h: RequestHandle) -> &[u8] {
        self.outcomes[&h].as_deref().expect("a response")
    }

    pub fn expected(&self, h: RequestHandle) -> Vec<u8> {
        answer(&self.sent[&h], self.cfg.max_msg_size)
    }
}

impl Pair {
    /// The server's session numbered `i` as the server last reported it.
    pub fn server_session(&self, i: u16) -> SessionId {
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
