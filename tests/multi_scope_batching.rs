//! Doorbell batching and selective signaling in a multi-peer scope, counted by the
//! simulator: one doorbell per peer and queue per flush, one send completion per batch,
//! extra flushes exactly where a peer's ring fills, errors in the middle of a batch
//! reported for the right peer with nothing left in flight, and no allocation.
#![cfg(feature = "sim")]

mod common;

use std::time::{Duration, Instant};

use zverbs::provider::sim::{FabricConfig, Sim};
use zverbs::{
    AccessFlags, ChannelConfig, Error, MemoryRegion, MultiChannel, ProtectionDomain, RemoteRegion,
    WcStatus,
};
use zverbs_sim::{Personality, QpCounters};

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

const PEERS: usize = 4;

/// A root (rank 0) with a `MultiChannel` to leaves `1..=n`, each a plain `Channel` back;
/// rings of `R` slots, one gather entry per request. `pd[i]` is rank `i`'s.
type Star<const R: usize> = zverbs::testing::Star<PEERS, R, 1>;

fn star<const R: usize>(n: usize) -> Star<R> {
    star_on(&Sim::with_devices(n + 1), n)
}

fn star_on<const R: usize>(sim: &Sim, n: usize) -> Star<R> {
    Star::connected_on(sim, n, &ChannelConfig::default()).unwrap()
}

/// What the simulator counted on the root's queue pair to `peer`.
fn counters<const R: usize>(s: &mut Star<R>, peer: usize) -> QpCounters {
    let ch = s.root.peer(peer).unwrap();
    ch.queue_pair().raw().counters()
}

/// (doorbells, posted, completions written, completed silently) of the send queue.
fn sends(c: QpCounters) -> (u64, u64, u64, u64) {
    (
        c.send_doorbells,
        c.sends_posted,
        c.send_completions,
        c.silent_sends,
    )
}

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// A zeroed target of `len` bytes at each leaf, registered for remote writes.
fn targets(n: usize, len: usize) -> Vec<Vec<u8>> {
    vec![vec![0u8; len]; n]
}

/// Registers each leaf's target buffer for remote writes; the regions and their remote
/// tokens. The tests read a target only after the scope that writes it has ended (which
/// waits for every write), or never while writes are in flight.
fn register_targets<'b>(
    pds: &[ProtectionDomain<Sim>],
    bufs: &'b mut [Vec<u8>],
) -> (Vec<MemoryRegion<'b, Sim>>, Vec<RemoteRegion>) {
    let regions: Vec<_> = bufs
        .iter_mut()
        .zip(pds)
        // SAFETY: see above: no target is read through a reference while the device
        // may write it.
        .map(|(b, pd)| unsafe { pd.register_with_access(b, RW) }.unwrap())
        .collect();
    let remotes = regions.iter().map(|m| m.remote()).collect();
    (regions, remotes)
}

#[test]
fn k_writes_to_each_peer_ring_one_doorbell_and_signal_once_per_peer() {
    const K: usize = 8;
    let mut s = star::<16>(3);
    let mut bufs = targets(3, K);
    let (regions, remotes) = register_targets(&s.pd[1..], &mut bufs);
    let mut src: Vec<u8> = (0..(3 * K) as u8).collect();
    let src = s.pd[0].register(&mut src).unwrap();
    s.root
        .scope(|sc| {
            for i in 0..K {
                for (k, remote) in remotes.iter().enumerate() {
                    let at = k * K + i;
                    let dst = remote.slice(i as u64..i as u64 + 1)?;
                    sc.post_write(k + 1, [src.slice(at..at + 1)?], &dst)?;
                }
            }
            Ok(())
        })
        .unwrap();
    for p in 1..=3 {
        let c = counters(&mut s, p);
        assert_eq!(sends(c), (1, K as u64, 1, K as u64 - 1), "peer {p}");
        assert_eq!(c.recv_doorbells, 0);
        assert!(matches!(s.root.outcome(p), Some(Ok(None))));
        assert_eq!(s.root.peer(p).unwrap().in_flight(), (0, 0));
    }
    drop(regions);
    for (k, b) in bufs.iter().enumerate() {
        let want: Vec<u8> = (0..K).map(|i| (k * K + i) as u8).collect();
        assert_eq!(b, &want);
    }
}

#[test]
fn sends_and_receives_go_out_as_one_chain_each_per_peer() {
    const K: usize = 5;
    let mut s = star::<8>(2);
    let Star {
        pd, root, leaves, ..
    } = &mut s;
    let mut out: Vec<u8> = (0..(2 * K) as u8).collect();
    let out = pd[0].register(&mut out).unwrap();
    let mut inbox_bytes = vec![0u8; 2 * K * 2];
    let mut inbox = pd[0].register(&mut inbox_bytes).unwrap();
    let mut leaf_bufs = vec![vec![0u8; K]; 2];
    std::thread::scope(|t| {
        for ((leaf, lpd), buf) in leaves.iter_mut().zip(&pd[1..]).zip(&mut leaf_bufs) {
            t.spawn(move || {
                let mut mr = lpd.register(buf).unwrap();
                // Receive K one-byte messages, then echo each back.
                leaf.scope(|sc| {
                    let mut rest = mr.slice_mut(..)?;
                    for _ in 0..K {
                        let (one, more) = rest.split_at(1)?;
                        sc.post_receive([one])?;
                        rest = more;
                    }
                    Ok(())
                })
                .unwrap();
                leaf.scope(|sc| {
                    for i in 0..K {
                        sc.post_send([mr.slice(i..i + 1)?])?;
                    }
                    Ok(())
                })
                .unwrap();
            });
        }
        root.scope(|sc| {
            let mut rest = inbox.slice_mut(..)?;
            for p in 1..=2 {
                for _ in 0..K {
                    let (one, more) = rest.split_at(2)?;
                    sc.post_receive(p, [one])?;
                    rest = more;
                }
            }
            for i in 0..K {
                for p in 1..=2 {
                    let at = (p - 1) * K + i;
                    sc.post_send(p, [out.slice(at..at + 1)?])?;
                }
            }
            Ok(())
        })
        .unwrap();
    });
    for p in 1..=2 {
        let c = counters(&mut s, p);
        assert_eq!(sends(c), (1, K as u64, 1, K as u64 - 1), "peer {p}");
        assert_eq!(
            (c.recv_doorbells, c.recvs_posted),
            (1, K as u64),
            "peer {p}"
        );
        // The outcome keeps the peer's last receive completion.
        assert!(matches!(s.root.outcome(p), Some(Ok(Some(c))) if c.byte_len == 1));
        // The leaf's two scopes: one doorbell each.
        let leaf = s.leaves[p - 1].queue_pair().raw().counters();
        assert_eq!((leaf.recv_doorbells, leaf.send_doorbells), (1, 1));
    }
    drop((out, inbox));
    for (k, b) in leaf_bufs.iter().enumerate() {
        let want: Vec<u8> = (0..K).map(|i| (k * K + i) as u8).collect();
        assert_eq!(b, &want);
        // Each echo landed in its own two-byte slot at the root, in order.
        let echoed: Vec<u8> = inbox_bytes[k * 2 * K..(k + 1) * 2 * K]
            .chunks(2)
            .map(|c| c[0])
            .collect();
        assert_eq!(echoed, want);
    }
}

#[test]
fn a_full_ring_flushes_every_peer_and_waits_only_for_its_own_queue() {
    // Rings of 4: ten writes to peer 1 go out as 4 + 4 + 2; the one write staged for
    // peer 2 before them goes out with the first flush.
    let mut s = star::<4>(2);
    let mut bufs = targets(2, 10);
    let (regions, remotes) = register_targets(&s.pd[1..], &mut bufs);
    let mut src: Vec<u8> = (1..=10).collect();
    let src = s.pd[0].register(&mut src).unwrap();
    s.root
        .scope(|sc| {
            sc.post_write(2, [src.slice(..1)?], &remotes[1])?;
            for i in 0..10 {
                let dst = remotes[0].slice(i as u64..i as u64 + 1)?;
                sc.post_write(1, [src.slice(i..i + 1)?], &dst)?;
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(sends(counters(&mut s, 1)), (3, 10, 3, 7));
    assert_eq!(sends(counters(&mut s, 2)), (1, 1, 1, 0));
    drop(regions);
    assert_eq!(bufs[0], (1..=10).collect::<Vec<u8>>());
    assert_eq!(bufs[1][0], 1);
    // A ring never holds more than its depth: a second scope starts from empty rings.
    assert_eq!(s.root.peer(1).unwrap().in_flight(), (0, 0));
}

#[test]
fn a_scope_unwound_out_of_settles_each_peers_posted_work_and_gives_back_the_staged() {
    // Rings of 4: the fifth write to peer 1 flushes every peer (peer 2's write goes out)
    // and is staged; then the closure panics.
    let mut s = star::<4>(2);
    let mut bufs = targets(2, 5);
    let (regions, remotes) = register_targets(&s.pd[1..], &mut bufs);
    let mut src: Vec<u8> = (1..=5).collect();
    let src = s.pd[0].register(&mut src).unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        s.root.scope(|sc| {
            sc.post_write(2, [src.slice(..1)?], &remotes[1])?;
            for i in 0..5 {
                let dst = remotes[0].slice(i as u64..i as u64 + 1)?;
                sc.post_write(1, [src.slice(i..i + 1)?], &dst)?;
            }
            if sc.post_write(3, [src.slice(..1)?], &remotes[0]).is_err() {
                panic!("the closure fails with peer 2's write posted and one staged");
            }
            Ok(())
        })
    }));
    assert!(unwound.is_err(), "the closure's panic goes on unwinding");
    for p in 1..=2 {
        assert_eq!(s.root.peer(p).unwrap().in_flight(), (0, 0), "peer {p}");
    }
    assert_eq!(
        sends(counters(&mut s, 1)),
        (1, 4, 1, 3),
        "the fifth never went out"
    );
    assert_eq!(sends(counters(&mut s, 2)), (1, 1, 1, 0));
    drop(regions);
    assert_eq!(bufs[0], [1, 2, 3, 4, 0]);
    assert_eq!(bufs[1][0], 1, "peer 2's write landed and was settled");
}

#[test]
fn an_error_mid_batch_names_its_peer_and_leaves_nothing_in_flight() {
    let mut s = star::<8>(2);
    let mut bufs = targets(2, 5);
    let (regions, remotes) = register_targets(&s.pd[1..], &mut bufs);
    let bad = RemoteRegion {
        rkey: remotes[0].rkey ^ 0x100,
        ..remotes[0]
    };
    let mut src = *b"abcde";
    let src = s.pd[0].register(&mut src).unwrap();
    let e = s
        .root
        .scope(|sc| {
            for i in 0..5u64 {
                let one = src.slice(i as usize..i as usize + 1)?;
                // Peer 1's third write names a key its peer never issued.
                let target = if i == 2 { &bad } else { &remotes[0] };
                sc.post_write(1, [one], &target.slice(i..i + 1)?)?;
                sc.post_write(2, [one], &remotes[1].slice(i..i + 1)?)?;
            }
            Ok(())
        })
        .unwrap_err();
    let Error::Completion(c) = &e else {
        panic!("{e}")
    };
    assert_eq!(c.status, WcStatus::RemAccessErr);
    assert_eq!(c.qp_num, s.root.peer(1).unwrap().queue_pair().qp_num());
    let failed: Vec<_> = s.root.failed_peers().map(|(p, e)| (p, *e)).collect();
    assert_eq!(failed, [(1, e)]);
    assert!(matches!(s.root.outcome(2), Some(Ok(None))));
    for p in 1..=2 {
        assert_eq!(s.root.peer(p).unwrap().in_flight(), (0, 0), "peer {p}");
    }
    // Two writes retired silently, then the failure and two flushes, each completed.
    assert_eq!(sends(counters(&mut s, 1)), (1, 5, 3, 2));
    assert_eq!(sends(counters(&mut s, 2)), (1, 5, 1, 4));
    drop(regions);
    assert_eq!(&bufs[0], b"ab\0\0\0");
    assert_eq!(&bufs[1], b"abcde");
}

#[test]
fn a_batching_scope_does_not_allocate_after_setup() {
    let mut s = star::<8>(3);
    let mut bufs = targets(3, 64);
    let (_regions, remotes) = register_targets(&s.pd[1..], &mut bufs);
    let mut src = [7u8; 64];
    let src = s.pd[0].register(&mut src).unwrap();
    let round = |root: &mut MultiChannel<Sim, PEERS, 8, 1>| {
        // Twelve writes per peer: past the ring of 8, so a flush and a wait inside too.
        root.scope(|sc| {
            for i in 0..12u64 {
                for (k, remote) in remotes.iter().enumerate() {
                    let dst = remote.slice(i * 4..i * 4 + 4)?;
                    sc.post_write(k + 1, [src.slice(..4)?], &dst)?;
                }
            }
            Ok(())
        })
        .unwrap();
    };
    round(&mut s.root); // warm-up
    let ((), allocs) = zverbs_testkit::measure(|| {
        for _ in 0..20 {
            round(&mut s.root);
        }
    });
    assert_eq!(allocs.count, 0, "allocations in a scope");
    assert_eq!(counters(&mut s, 1).sends_posted, 21 * 12);
}

#[test]
fn a_send_chain_refused_part_way_ends_the_batch_within_the_grace() {
    // rxe refuses a misaligned atomic at post: the two writes before it in the chain go
    // out unsignaled, with no signaled request behind them that would retire them. The
    // scope ends the channel's work at once rather than wait out its 10 s timeout.
    let cfg = FabricConfig {
        personality: Personality::Rxe,
        ..FabricConfig::instant()
    };
    let mut s = star_on::<8>(&Sim::with_config(cfg, 2), 1);
    let mut target = [0u8; 32];
    // SAFETY: the target is read only after the scope, which waits for every request.
    let region = unsafe { s.pd[0].register_with_access(&mut target, AccessFlags::all()) }.unwrap();
    let remote = region.remote();
    let mut src = [9u8; 8];
    let src = s.pd[1].register(&mut src).unwrap();
    let mut old = [0u8; 8];
    let mut old = s.pd[1].register(&mut old).unwrap();
    let leaf = &mut s.leaves[0];
    let start = Instant::now();
    let e = leaf
        .scope(|sc| {
            sc.post_write([src.slice(..4)?], &remote.slice(..4)?)?;
            sc.post_write([src.slice(4..)?], &remote.slice(4..8)?)?;
            sc.post_fetch_add(old.slice_mut(..)?, &remote.slice(9..17)?, 1)?;
            Ok(())
        })
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(
        matches!(
            e,
            Error::Provider {
                op: "ibv_post_send",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(leaf.in_flight(), (0, 0));
    let c = leaf.queue_pair().raw().counters();
    assert_eq!(sends(c), (1, 2, 0, 2));
    drop((region, old));
    assert_eq!(target[..8], [9; 8]);
}
