//! The root rendezvous (`zverbs::bootstrap::Rendezvous`) on 127.0.0.1: worlds of 2 to
//! 1,024 ranks in one process, and the peers it must survive or refuse — strangers that
//! send garbage, say nothing or belong to another run; ranks of this run that claim a
//! taken rank, a rank out of range or another world; a root that never comes up; a rank
//! that never comes.
#![cfg(feature = "std")]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use zverbs::bootstrap::{encode_frame, ExchangeError, Rendezvous};

const LONG: Duration = Duration::from_secs(30);
const ID: u64 = 0x5eed_cafe;

/// A listener for the root on a free loopback port, and the rendezvous naming it.
fn root(world: u32) -> (TcpListener, Rendezvous) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let rv = Rendezvous {
        root: listener.local_addr().unwrap(),
        id: ID,
        world,
    };
    (listener, rv)
}

fn payload_of(rank: u32) -> Vec<u8> {
    format!("endpoints of rank {rank}").into_bytes()
}

/// Runs rank 0 on `listener` and ranks `1..world` (but `absent`) on threads; each rank's
/// result, by rank (an absent rank's `None`), after `meanwhile` ran beside them.
fn run(
    listener: &TcpListener,
    rv: Rendezvous,
    timeout: Duration,
    absent: &[u32],
    meanwhile: impl FnOnce(SocketAddr) + Send,
) -> Vec<Option<Result<Vec<Vec<u8>>, ExchangeError>>> {
    thread::scope(|s| {
        let root = s.spawn(move || rv.all_gather_on(listener, &payload_of(0), timeout));
        let ranks: Vec<_> = (1..rv.world)
            .map(|r| {
                (!absent.contains(&r)).then(|| {
                    thread::Builder::new()
                        .stack_size(256 << 10)
                        .spawn_scoped(s, move || rv.all_gather(r, &payload_of(r), timeout))
                        .unwrap()
                })
            })
            .collect();
        let other = s.spawn(move || meanwhile(rv.root));
        let mut all = vec![Some(root.join().unwrap())];
        all.extend(ranks.into_iter().map(|h| h.map(|h| h.join().unwrap())));
        other.join().unwrap();
        all
    })
}

fn table(world: u32) -> Vec<Vec<u8>> {
    (0..world).map(payload_of).collect()
}

/// A hello of this run (or another, by `id`) claiming `rank` in a world of `world`.
fn hello(rank: u32, id: u64, world: u32) -> Vec<u8> {
    let mut body = id.to_be_bytes().to_vec();
    body.extend_from_slice(&world.to_be_bytes());
    body.extend_from_slice(b"forged");
    let mut frame = Vec::new();
    encode_frame(rank, &body, &mut frame).unwrap();
    frame
}

/// Connects to `root` (retrying while it is not up) and writes `bytes`; holds the
/// connection open for `hold`.
fn stranger(root: SocketAddr, bytes: &[u8], hold: Duration) {
    let end = Instant::now() + Duration::from_secs(5);
    let mut s = loop {
        match TcpStream::connect(root) {
            Ok(s) => break s,
            Err(_) if Instant::now() < end => thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("{e}"),
        }
    };
    let _ = s.write_all(bytes);
    thread::sleep(hold);
}

#[test]
fn worlds_of_2_to_1024_ranks_gather_every_payload() {
    for world in [2, 3, 16, 128, 1024] {
        let (l, rv) = root(world);
        let all = run(&l, rv, LONG, &[], |_| {});
        for (rank, r) in all.into_iter().enumerate() {
            let t = r
                .unwrap()
                .unwrap_or_else(|e| panic!("world {world} rank {rank}: {e}"));
            assert!(
                t == table(world),
                "world {world} rank {rank}: a different table"
            );
        }
    }
}

#[test]
fn strangers_that_send_garbage_nothing_or_another_runs_hello_hold_nothing_up() {
    let (l, rv) = root(4);
    let start = Instant::now();
    let all = run(&l, rv, LONG, &[], |root| {
        thread::scope(|s| {
            s.spawn(|| stranger(root, b"GET / HTTP/1.1\r\n\r\n", Duration::ZERO));
            s.spawn(|| stranger(root, &[], Duration::from_secs(3)));
            s.spawn(|| stranger(root, b"ZVEX", Duration::from_secs(3))); // trickles, stops
            s.spawn(|| stranger(root, &hello(1, ID + 1, 4), Duration::ZERO));
            // A frame that claims a payload far over the limit: refused unread.
            let mut huge = b"ZVEX".to_vec();
            huge.extend_from_slice(&1u16.to_be_bytes());
            huge.extend_from_slice(&2u32.to_be_bytes());
            huge.extend_from_slice(&u32::MAX.to_be_bytes());
            s.spawn(move || stranger(root, &huge, Duration::ZERO));
        });
    });
    for r in all {
        assert_eq!(r.unwrap().unwrap(), table(4));
    }
    // The silent ones were cut off when the last rank came, not at their 3 s.
    assert!(start.elapsed() < LONG);
}

#[test]
fn a_taken_rank_is_refused_naming_it() {
    let (l, rv) = root(3);
    let all = run(&l, rv, Duration::from_secs(5), &[2], |root| {
        stranger(root, &hello(1, ID, 3), Duration::from_millis(500));
        stranger(root, &hello(1, ID, 3), Duration::from_millis(500));
    });
    match &all[0] {
        Some(Err(ExchangeError::DuplicatePeer { rank: 1, .. })) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_rank_out_of_range_or_of_another_world_fails_the_rendezvous() {
    for (bytes, check) in [
        (
            hello(7, ID, 3),
            (|e: &ExchangeError| matches!(e, ExchangeError::UnexpectedRank { got: 7, .. }))
                as fn(&ExchangeError) -> bool,
        ),
        (hello(0, ID, 3), |e| {
            matches!(e, ExchangeError::UnexpectedRank { got: 0, .. })
        }),
        (hello(1, ID, 5), |e| {
            matches!(
                e,
                ExchangeError::WorldMismatch {
                    expected: 3,
                    got: 5,
                    ..
                }
            )
        }),
    ] {
        let (l, rv) = root(3);
        let all = run(&l, rv, Duration::from_secs(5), &[1, 2], move |root| {
            stranger(root, &bytes, Duration::from_millis(200));
        });
        match &all[0] {
            Some(Err(e)) if check(e) => {}
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_rank_that_never_comes_is_named_and_a_root_that_never_comes_is_a_timeout() {
    let short = Duration::from_millis(600);
    let (l, rv) = root(4);
    let start = Instant::now();
    let all = run(&l, rv, short, &[2], |_| {});
    let took = start.elapsed();
    match &all[0] {
        Some(Err(ExchangeError::Timeout { waiting_for })) => assert_eq!(waiting_for, &[2]),
        other => panic!("{other:?}"),
    }
    // The others wait for the root's table, which never comes: the root's end of their
    // connection closes when it gives up (or their deadline passes first).
    for r in [1, 3] {
        assert!(
            matches!(
                &all[r],
                Some(Err(ExchangeError::Timeout { .. }
                    | ExchangeError::Truncated { .. }
                    | ExchangeError::Io { .. }))
            ),
            "rank {r}: {:?}",
            all[r]
        );
    }
    assert!(took < short * 10, "bounded: {took:?}");

    // Nobody listens at the root.
    let (l, rv) = root(2);
    drop(l);
    let start = Instant::now();
    let r = rv.all_gather(1, b"x", short);
    assert!(matches!(r, Err(ExchangeError::Timeout { ref waiting_for }) if waiting_for == &[0]));
    assert!(start.elapsed() < short * 10);
}

#[test]
fn bad_arguments_are_refused_before_any_connection() {
    let (_l, rv) = root(2);
    assert!(matches!(
        rv.all_gather(2, b"x", LONG),
        Err(ExchangeError::NoSuchRank { rank: 2, len: 2 })
    ));
    let big = vec![0u8; zverbs::bootstrap::MAX_RENDEZVOUS_PAYLOAD + 1];
    assert!(matches!(
        rv.all_gather(1, &big, LONG),
        Err(ExchangeError::PayloadTooLarge { .. })
    ));
}

/// Parcels reach only their addressees, from every sender, in sender order.
#[test]
fn parcels_reach_their_addressees_only() {
    let world = 64u32;
    let (l, rv) = root(world);
    // Rank r sends a parcel to r - 1 and r + 1 (around the ring), in ascending order.
    let parcels_of = |r: u32| {
        let mut to = [(r + world - 1) % world, (r + 1) % world];
        to.sort_unstable();
        to.map(|t| (t, format!("{r} to {t}").into_bytes()))
    };
    let results = thread::scope(|s| {
        let l = &l;
        let root = s.spawn(move || {
            let mine = parcels_of(0);
            let refs: Vec<(u32, &[u8])> = mine.iter().map(|(t, p)| (*t, &p[..])).collect();
            rv.route_on(l, b"root", &refs, LONG)
        });
        let ranks: Vec<_> = (1..world)
            .map(|r| {
                s.spawn(move || {
                    let mine = parcels_of(r);
                    let refs: Vec<(u32, &[u8])> = mine.iter().map(|(t, p)| (*t, &p[..])).collect();
                    rv.route(r, &[r as u8], &refs, LONG)
                })
            })
            .collect();
        let mut all = vec![root.join().unwrap()];
        all.extend(ranks.into_iter().map(|h| h.join().unwrap()));
        all
    });
    for (r, got) in (0u32..).zip(results) {
        let got = got.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(got.all.len(), world as usize);
        let mut from = [(r + world - 1) % world, (r + 1) % world];
        from.sort_unstable();
        let want: Vec<(u32, Vec<u8>)> = from
            .iter()
            .map(|&f| (f, format!("{f} to {r}").into_bytes()))
            .collect();
        assert_eq!(got.parcels, want, "rank {r}");
    }
}

/// Parcels out of protocol: refused before sending when they are this rank's own, and
/// failing the rendezvous when a peer's are (out of order, to itself, past the world).
#[test]
fn parcels_out_of_protocol_are_refused() {
    let (_l, rv) = root(4);
    for bad in [
        vec![(2, &b"x"[..]), (1, b"y")],
        vec![(1, &b"x"[..])],
        vec![(4, &b"x"[..])],
        vec![(2, &b"x"[..]), (2, b"y")],
    ] {
        assert!(
            matches!(
                rv.route(1, b"", &bad, LONG),
                Err(ExchangeError::UnexpectedRank { .. })
            ),
            "{bad:?}"
        );
    }
    // A peer of this run whose parcels run backwards.
    let (l, rv) = root(3);
    let all = run(&l, rv, Duration::from_secs(5), &[1, 2], |root| {
        let mut bytes = hello(1, ID, 3);
        for to in [2u32, 0] {
            encode_frame(to, b"parcel", &mut bytes).unwrap();
        }
        stranger(root, &bytes, Duration::from_millis(200));
    });
    match &all[0] {
        Some(Err(ExchangeError::UnexpectedRank { got: 0, .. })) => {}
        other => panic!("{other:?}"),
    }
}

/// Rounds back to back: a rank done with one round dials for the next while the root may
/// still be answering the others. With the root on one listener for all rounds
/// (`Rendezvous::listen`), the connection waits there for the next round; with the root
/// binding the port each round (`all_gather` at rank 0), it may be queued on the last
/// round's listener and reset when that closes: the rank dials again.
#[test]
fn rounds_back_to_back_on_one_root_listener_or_one_per_round() {
    for once in [true, false] {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let world = 48;
        let rv = Rendezvous {
            root: port,
            id: ID,
            world,
        };
        thread::scope(|s| {
            let ranks: Vec<_> = (0..world)
                .map(|r| {
                    thread::Builder::new()
                        .stack_size(256 << 10)
                        .spawn_scoped(s, move || {
                            let listener = (r == 0 && once).then(|| rv.listen().unwrap());
                            for round in 0..20u8 {
                                let mine = [round, r as u8];
                                let all = match &listener {
                                    Some(l) => rv.all_gather_on(l, &mine, LONG),
                                    None => rv.all_gather(r, &mine, LONG),
                                };
                                let all =
                                    all.map_err(|e| format!("rank {r}, round {round}: {e}"))?;
                                let want: Vec<Vec<u8>> =
                                    (0..world).map(|p| vec![round, p as u8]).collect();
                                if all != want {
                                    return Err(format!("rank {r}, round {round}: {all:?}"));
                                }
                            }
                            Ok::<(), String>(())
                        })
                        .unwrap()
                })
                .collect();
            for h in ranks {
                h.join().unwrap().unwrap();
            }
        });
    }
}

/// A rank that says its hello and dies: the rendezvous ends within the deadline either way.
/// The root delivered before it could tell (every live rank has the whole table, the dead
/// rank's payload in it), or it names the rank it lost and stops: then a live rank has the
/// table, or sees the root end their connection.
#[test]
fn a_rank_that_dies_after_its_hello_is_named_or_harmless() {
    for _ in 0..10 {
        let (l, rv) = root(4);
        let start = Instant::now();
        let all = run(&l, rv, LONG, &[2], |root| {
            let mut whole = hello(2, ID, 4);
            encode_frame(4, &[], &mut whole).unwrap();
            stranger(root, &whole, Duration::ZERO)
        });
        assert!(start.elapsed() < LONG, "bounded: {all:?}");
        let mut want = table(4);
        want[2] = b"forged".to_vec();
        let lost = match all[0].as_ref().unwrap() {
            Ok(got) => {
                assert_eq!(got, &want);
                false
            }
            Err(ExchangeError::Lost { rank: 2, .. }) => true,
            Err(e) => panic!("root: {e}"),
        };
        for r in [1, 3] {
            match all[r].as_ref().unwrap() {
                Ok(got) => assert_eq!(got, &want, "rank {r}"),
                Err(ExchangeError::Truncated { .. } | ExchangeError::Io { .. }) if lost => {}
                Err(e) => panic!("rank {r}: {e}"),
            }
        }
    }
}
