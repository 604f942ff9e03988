//! The out-of-band exchange: TCP exchanges on 127.0.0.1 with real and misbehaving peers
//! (the configuration's checks are in `network_config.rs`).
//!
//! Ports: most tests bind `127.0.0.1:0` listeners first, build the configuration from
//! them, and hand them to `exchange_with_listener`, so parallel tests never collide. A
//! port that must stay unbound for a while (a rank that binds for itself, starts late or
//! never starts) is never a released port-0 port, which the kernel could hand to another
//! test's listener at once: it is a random free port below the ephemeral range instead
//! ([`spare_addrs`]).
#![cfg(feature = "std")]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use zverbs::bootstrap::{
    encode_frame, exchange, exchange_with_listener, read_frame, ExchangeError, NetworkConfig,
    FRAME_HEADER_LEN, FRAME_MAGIC, MAX_PAYLOAD,
};

/// Records the largest single allocation, to show that a peer's length claim is never
/// allocated.
#[global_allocator]
static ALLOC: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

const LONG: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- helpers

/// `n` listeners on free loopback ports, and the configuration naming them.
fn listeners(n: usize) -> (NetworkConfig, Vec<TcpListener>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (NetworkConfig::from_addrs(addrs).unwrap(), ls)
}

/// `n` loopback addresses on ports that are free now, outside the ephemeral port range
/// (32768 and up on Linux, 49152 and up elsewhere), so no port-0 bind or outgoing
/// connection of a parallel test takes them. Left unbound.
fn spare_addrs(n: usize) -> Vec<SocketAddr> {
    let mut picked: Vec<SocketAddr> = Vec::new();
    while picked.len() < n {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(picked.len());
        let port = 10_000 + (h.finish() % 20_000) as u16;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        if !picked.contains(&addr) && TcpListener::bind(addr).is_ok() {
            picked.push(addr);
        }
    }
    picked
}

/// A configuration of listeners (kept bound) and spare addresses (left unbound), in rank
/// order: `spare[r]` says whether rank `r` gets a spare address.
fn mixed(spare: &[bool]) -> (NetworkConfig, Vec<Option<TcpListener>>) {
    let mut spares = spare_addrs(spare.iter().filter(|&&s| s).count()).into_iter();
    let mut addrs = Vec::new();
    let mut ls = Vec::new();
    for &s in spare {
        if s {
            addrs.push(spares.next().unwrap());
            ls.push(None);
        } else {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            addrs.push(l.local_addr().unwrap());
            ls.push(Some(l));
        }
    }
    (NetworkConfig::from_addrs(addrs).unwrap(), ls)
}

fn payload_of(rank: u32) -> Vec<u8> {
    // Different lengths per rank, one of them the largest allowed.
    match rank {
        3 => vec![0xa5; MAX_PAYLOAD],
        r => format!("endpoint of rank {r}")
            .repeat(r as usize + 1)
            .into_bytes(),
    }
}

fn frame(rank: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    encode_frame(rank, payload, &mut b).unwrap();
    b
}

/// Header bytes: magic, version, rank, claimed length.
fn header(magic: [u8; 4], version: u16, rank: u32, len: u32) -> Vec<u8> {
    let mut b = magic.to_vec();
    b.extend_from_slice(&version.to_be_bytes());
    b.extend_from_slice(&rank.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// What a rank's thread returns: its result and how long it took.
type Outcome = (Result<Vec<Vec<u8>>, ExchangeError>, Duration);

/// Runs the real rank `rank` on its own thread.
fn spawn_rank(
    cfg: &NetworkConfig,
    rank: u32,
    listener: TcpListener,
    timeout: Duration,
) -> thread::JoinHandle<Outcome> {
    let cfg = cfg.clone();
    thread::spawn(move || {
        let t = Instant::now();
        let r = exchange_with_listener(&cfg, rank, &listener, &payload_of(rank), timeout);
        (r, t.elapsed())
    })
}

/// A fake rank that accepts one connection, reads the real dialer's frame, and answers
/// with `reply`.
fn fake_acceptor(listener: TcpListener, reply: Vec<u8>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        let (rank, payload) = read_frame(&mut s).unwrap();
        assert_eq!((rank, payload), (0, payload_of(0)));
        let _ = s.write_all(&reply);
        // Wait for the real side to hang up.
        let _ = s.read(&mut [0u8; 1]);
    })
}

/// A fake peer that dials `addr`, sends `bytes` and waits for the other side to hang up.
fn fake_dialer(addr: SocketAddr, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    s.write_all(bytes).unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
}

// ---------------------------------------------------------------- exchanges

fn check_all(results: Vec<Result<Vec<Vec<u8>>, ExchangeError>>, n: u32) {
    for (rank, r) in results.into_iter().enumerate() {
        let all = r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(all.len(), n as usize);
        for (from, p) in (0..n).zip(&all) {
            assert_eq!(p, &payload_of(from), "rank {rank}'s copy of rank {from}");
        }
    }
}

#[test]
fn four_ranks_exchange() {
    let (cfg, ls) = listeners(4);
    let handles: Vec<_> = (0u32..)
        .zip(ls)
        .map(|(rank, l)| spawn_rank(&cfg, rank, l, LONG))
        .collect();
    let results = handles.into_iter().map(|h| h.join().unwrap().0).collect();
    check_all(results, 4);
}

#[test]
fn four_ranks_exchange_binding_themselves() {
    // `exchange` binds for itself.
    let cfg = NetworkConfig::from_addrs(spare_addrs(4)).unwrap();
    let handles: Vec<_> = (0..4u32)
        .map(|rank| {
            let cfg = cfg.clone();
            thread::spawn(move || exchange(&cfg, rank, &payload_of(rank), LONG))
        })
        .collect();
    let results = handles.into_iter().map(|h| h.join().unwrap()).collect();
    check_all(results, 4);
}

#[test]
fn a_rank_starting_late_still_exchanges() {
    // The late rank's port is unbound until it starts, so rank 0's connects are refused
    // and retried. (Should something else bind the spare port meanwhile, try again.)
    for attempt in 1.. {
        let (cfg, ls) = mixed(&[false, true, false]);
        let early: Vec<_> = [0, 2]
            .into_iter()
            .map(|rank| {
                let l = ls[rank as usize].as_ref().unwrap().try_clone().unwrap();
                let cfg = cfg.clone();
                thread::spawn(move || {
                    let r = exchange_with_listener(
                        &cfg,
                        rank,
                        &l,
                        &payload_of(rank),
                        Duration::from_secs(5),
                    );
                    (r, Instant::now())
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(300));
        let late_start = Instant::now();
        let late = exchange(&cfg, 1, &payload_of(1), Duration::from_secs(5));
        if matches!(late, Err(ExchangeError::Bind { .. })) && attempt < 3 {
            continue;
        }
        let mut results: Vec<_> = early.into_iter().map(|h| h.join().unwrap()).collect();
        for (_, finished) in &results {
            assert!(*finished >= late_start, "finished before rank 1 started");
        }
        let r2 = results.pop().unwrap().0;
        let r0 = results.pop().unwrap().0;
        check_all(vec![r0, late, r2], 3);
        break;
    }
}

#[test]
fn timeout_lists_the_rank_that_never_started() {
    let (cfg, ls) = mixed(&[false, false, true]); // rank 2 never starts
    let timeout = Duration::from_millis(800);
    let handles: Vec<_> = (0u32..)
        .zip(ls.into_iter().flatten())
        .map(|(rank, l)| spawn_rank(&cfg, rank, l, timeout))
        .collect();
    for h in handles {
        let (r, took) = h.join().unwrap();
        let e = r.unwrap_err();
        assert!(
            matches!(&e, ExchangeError::Timeout { waiting_for } if waiting_for == &[2]),
            "{e:?}"
        );
        assert!(e.to_string().contains("[2]"), "{e}");
        assert!(took >= timeout, "{took:?}");
        assert!(took < timeout + Duration::from_millis(500), "{took:?}");
    }
}

#[test]
fn silent_peers_time_out() {
    // A silent dialer claiming nothing: the real rank 1 keeps waiting for rank 0.
    let (cfg, mut ls) = listeners(2);
    let real = spawn_rank(&cfg, 1, ls.pop().unwrap(), Duration::from_millis(600));
    let silent = TcpStream::connect(cfg.get(1).unwrap()).unwrap();
    let (r, took) = real.join().unwrap();
    drop(silent);
    assert!(
        matches!(&r, Err(ExchangeError::Timeout { waiting_for }) if waiting_for == &[0]),
        "{r:?}"
    );
    assert!(took < Duration::from_millis(1100), "{took:?}");

    // A silent acceptor: the real rank 0's read of the answer is bounded.
    let (cfg, mut ls) = listeners(2);
    let fake = ls.pop().unwrap();
    let real = spawn_rank(&cfg, 0, ls.pop().unwrap(), Duration::from_millis(600));
    let (conn, _) = fake.accept().unwrap();
    let (r, took) = real.join().unwrap();
    drop(conn);
    assert!(
        matches!(&r, Err(ExchangeError::Timeout { waiting_for }) if waiting_for == &[1]),
        "{r:?}"
    );
    assert!(took < Duration::from_millis(1100), "{took:?}");
}

#[test]
fn wrong_magic_from_acceptor_and_dialer() {
    let (cfg, mut ls) = listeners(2);
    let fake = fake_acceptor(ls.pop().unwrap(), header(*b"HTTP", 1, 1, 0));
    let (r, took) = spawn_rank(&cfg, 0, ls.pop().unwrap(), LONG).join().unwrap();
    fake.join().unwrap();
    let e = r.unwrap_err();
    let peer = cfg.get(1).unwrap();
    assert!(
        matches!(&e, ExchangeError::WrongMagic { peer: p, got } if *p == peer && got == b"HTTP"),
        "{e:?}"
    );
    assert!(e.to_string().contains(&peer.to_string()), "{e}");
    assert!(took < Duration::from_secs(2), "fails fast, took {took:?}");

    let (cfg, mut ls) = listeners(2);
    let real = spawn_rank(&cfg, 1, ls.pop().unwrap(), LONG);
    fake_dialer(cfg.get(1).unwrap(), b"GET / HTTP/1.1\r\n\r\n");
    let (r, _) = real.join().unwrap();
    assert!(
        matches!(&r, Err(ExchangeError::WrongMagic { got, .. }) if got == b"GET "),
        "{r:?}"
    );
}

#[test]
fn wrong_version_from_acceptor_and_dialer() {
    let (cfg, mut ls) = listeners(2);
    let fake = fake_acceptor(ls.pop().unwrap(), header(FRAME_MAGIC, 2, 1, 0));
    let (r, _) = spawn_rank(&cfg, 0, ls.pop().unwrap(), LONG).join().unwrap();
    fake.join().unwrap();
    let peer = cfg.get(1).unwrap();
    assert!(
        matches!(&r, Err(ExchangeError::WrongVersion { peer: p, got: 2 }) if *p == peer),
        "{r:?}"
    );

    let (cfg, mut ls) = listeners(2);
    let real = spawn_rank(&cfg, 1, ls.pop().unwrap(), LONG);
    fake_dialer(cfg.get(1).unwrap(), &header(FRAME_MAGIC, 0xffff, 0, 0));
    let (r, _) = real.join().unwrap();
    assert!(
        matches!(&r, Err(ExchangeError::WrongVersion { got: 0xffff, .. })),
        "{r:?}"
    );
}

#[test]
fn oversized_claim_is_rejected_without_allocating() {
    let (cfg, mut ls) = listeners(2);
    let fake = fake_acceptor(ls.pop().unwrap(), header(FRAME_MAGIC, 1, 1, u32::MAX));
    let (r, took) = spawn_rank(&cfg, 0, ls.pop().unwrap(), LONG).join().unwrap();
    fake.join().unwrap();
    assert!(
        matches!(
            &r,
            Err(ExchangeError::Oversized {
                claimed: 0xffff_ffff,
                max: MAX_PAYLOAD,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");

    let (cfg, mut ls) = listeners(2);
    let real = spawn_rank(&cfg, 1, ls.pop().unwrap(), LONG);
    fake_dialer(
        cfg.get(1).unwrap(),
        &header(FRAME_MAGIC, 1, 0, MAX_PAYLOAD as u32 + 1),
    );
    let (r, _) = real.join().unwrap();
    assert!(
        matches!(&r, Err(ExchangeError::Oversized { claimed, .. }) if *claimed == MAX_PAYLOAD as u64 + 1),
        "{r:?}"
    );

    // Nothing in this test binary ever allocated anywhere near a claimed 4 GiB.
    let peak = zverbs_testkit::process::stats().largest;
    assert!(peak < 16 << 20, "largest allocation {peak} bytes");
}

#[test]
fn truncated_frame_is_reported() {
    let (cfg, mut ls) = listeners(2);
    let real = spawn_rank(&cfg, 1, ls.pop().unwrap(), LONG);
    let mut half = frame(0, b"0123456789");
    half.truncate(20);
    let mut s = TcpStream::connect(cfg.get(1).unwrap()).unwrap();
    s.write_all(&half).unwrap();
    drop(s); // closes mid-frame
    let (r, _) = real.join().unwrap();
    assert!(
        matches!(
            &r,
            Err(ExchangeError::Truncated {
                needed: 24,
                got: 20,
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn peer_claiming_the_wrong_rank() {
    // Dialled as rank 1, answers as rank 2.
    let (cfg, mut ls) = mixed(&[false, false, true]);
    ls.pop();
    let fake = fake_acceptor(ls.pop().flatten().unwrap(), frame(2, b"impostor"));
    let (r, _) = spawn_rank(&cfg, 0, ls.pop().flatten().unwrap(), LONG)
        .join()
        .unwrap();
    fake.join().unwrap();
    let e = r.unwrap_err();
    assert!(
        matches!(&e, ExchangeError::UnexpectedRank { expected, got: 2, .. } if *expected == (1..2)),
        "{e:?}"
    );
    assert!(e.to_string().contains("expected rank 1"), "{e}");

    // Dials rank 2 claiming a rank out of range, or its own rank.
    for claim in [7, 2] {
        let (cfg, mut ls) = listeners(3);
        let real = spawn_rank(&cfg, 2, ls.pop().unwrap(), LONG);
        fake_dialer(cfg.get(2).unwrap(), &frame(claim, b"x"));
        let (r, _) = real.join().unwrap();
        let e = r.unwrap_err();
        assert!(
            matches!(&e, ExchangeError::UnexpectedRank { expected, got, .. } if *expected == (0..2) && *got == claim),
            "{e:?}"
        );
        assert!(e.to_string().contains("in 0..2"), "{e}");
    }
}

#[test]
fn duplicate_peer_is_rejected() {
    // World of 3: rank 2 is real; two connections both claim rank 0 (rank 1 never
    // comes, so rank 2 is still accepting when the second claim arrives).
    let (cfg, mut ls) = listeners(3);
    let real = spawn_rank(&cfg, 2, ls.pop().unwrap(), LONG);
    let addr = cfg.get(2).unwrap();
    let mut first = TcpStream::connect(addr).unwrap();
    first.set_read_timeout(Some(LONG)).unwrap();
    first.write_all(&frame(0, &payload_of(0))).unwrap();
    let (rank, payload) = read_frame(&mut first).unwrap();
    assert_eq!((rank, payload), (2, payload_of(2)));
    fake_dialer(addr, &frame(0, b"again"));
    let (r, _) = real.join().unwrap();
    let e = r.unwrap_err();
    assert!(
        matches!(&e, ExchangeError::DuplicatePeer { rank: 0, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("rank 0"), "{e}");
}

#[test]
fn argument_errors_and_a_world_of_one() {
    let cfg = NetworkConfig::localhost(1, 1).unwrap();
    assert_eq!(
        exchange(&cfg, 0, b"solo", Duration::ZERO).unwrap(),
        vec![b"solo".to_vec()]
    );
    let e = exchange(&cfg, 1, b"", LONG).unwrap_err();
    assert!(
        matches!(e, ExchangeError::NoSuchRank { rank: 1, len: 1 }),
        "{e:?}"
    );
    let e = exchange(&cfg, 0, &vec![0; MAX_PAYLOAD + 1], LONG).unwrap_err();
    assert!(matches!(e, ExchangeError::PayloadTooLarge { .. }), "{e:?}");

    let (cfg, ls) = listeners(2);
    let e = exchange_with_listener(&cfg, 0, &ls[1], b"", LONG).unwrap_err();
    assert!(matches!(e, ExchangeError::ListenerMismatch { .. }), "{e:?}");

    // Someone else listens on rank 0's port.
    let e = exchange(&cfg, 0, b"", LONG).unwrap_err();
    assert!(matches!(e, ExchangeError::Bind { .. }), "{e:?}");
    drop(ls);
}

// ---------------------------------------------------------------- strangers

/// A stranger on `addr`: connects, then sends `bytes` one every `every` (never, if
/// `bytes` is empty) until they run out, the other side hangs up, or `stop` is set.
fn stranger(
    addr: SocketAddr,
    bytes: Vec<u8>,
    every: Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> thread::JoinHandle<()> {
    // Connected before the real ranks start: first in the listener's queue.
    let mut s = TcpStream::connect(addr).unwrap();
    thread::spawn(move || {
        let mut bytes = bytes.into_iter();
        while !stop.load(Ordering::Relaxed) {
            thread::sleep(every);
            if let Some(b) = bytes.next() {
                if s.write_all(&[b]).is_err() {
                    return;
                }
            }
        }
    })
}

#[test]
fn strangers_that_send_nothing_or_trickle_do_not_stall_the_exchange() {
    // Rank 2 accepts from ranks 0 and 1, rank 1 from rank 0: a silent stranger on both,
    // and on rank 2 one that trickles a plausible frame (rank 0, 1000 bytes) at 10 bytes
    // a second. Before the exchange ended as soon as every rank was heard from, ranks 1
    // and 2 waited for their strangers until the deadline.
    let timeout = Duration::from_secs(5);
    let (cfg, ls) = listeners(3);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let every = Duration::from_millis(100);
    let mut trickle = header(FRAME_MAGIC, 1, 0, 1000);
    trickle.resize(FRAME_HEADER_LEN + 1000, 0x5a);
    let strangers = vec![
        stranger(cfg.get(2).unwrap(), trickle, every, stop.clone()),
        stranger(cfg.get(2).unwrap(), Vec::new(), every, stop.clone()),
        stranger(cfg.get(1).unwrap(), Vec::new(), every, stop.clone()),
    ];
    let handles: Vec<_> = (0u32..)
        .zip(ls)
        .map(|(rank, l)| spawn_rank(&cfg, rank, l, timeout))
        .collect();
    let (results, took): (Vec<_>, Vec<_>) = handles.into_iter().map(|h| h.join().unwrap()).unzip();
    stop.store(true, Ordering::Relaxed);
    for s in strangers {
        s.join().unwrap();
    }
    check_all(results, 3);
    for (rank, t) in took.iter().enumerate() {
        assert!(*t < timeout / 2, "rank {rank} took {t:?}");
    }
}
