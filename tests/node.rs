//! `Node` barriers over the simulator: release only when all have arrived, subsets,
//! consecutive barriers, refused lists, timeouts and poisoning, words out of protocol in
//! a barrier slot, and barriers beside the data channels' own receives.
#![cfg(feature = "sim")]

mod world;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier as StdBarrier;
use std::time::{Duration, Instant};

use world::{config, world, world_in, ALGORITHMS};
use zverbs::node::barrier::BarrierError;
use zverbs::node::{Node, NodeConfig, NodeError};
use zverbs::provider::sim::{FabricConfig, Sim, SimError};
use zverbs::{Context, ErrorKind, RemoteRegion};

#[test]
fn barrier_releases_only_after_everyone_arrived() {
    for alg in ALGORITHMS {
        for n in 1..=6 {
            let nodes = world::<8>(n, &config(alg, Duration::from_secs(20)));
            let rounds = 25;
            // arrivals[k]: nodes that entered barrier k.
            let arrivals: Vec<AtomicUsize> = (0..rounds).map(|_| AtomicUsize::new(0)).collect();
            std::thread::scope(|t| {
                for (_pd, mut node) in nodes {
                    let arrivals = &arrivals;
                    t.spawn(move || {
                        for (k, a) in arrivals.iter().enumerate() {
                            if (node.rank() + k) % 3 == 0 {
                                std::thread::yield_now(); // vary who comes last
                            }
                            a.fetch_add(1, Ordering::SeqCst);
                            node.barrier_all().unwrap();
                            let seen = a.load(Ordering::SeqCst);
                            assert_eq!(seen, n, "{alg:?} n={n} barrier {k}: released early");
                        }
                        assert!(!node.is_poisoned());
                    });
                }
            });
        }
    }
}

#[test]
fn subset_barriers_leave_the_others_alone_and_interleave_with_full_ones() {
    for alg in ALGORITHMS {
        let nodes = world::<8>(5, &config(alg, Duration::from_secs(20)));
        let evens = [0usize, 2, 4];
        let count = AtomicUsize::new(0);
        std::thread::scope(|t| {
            for (_pd, mut node) in nodes {
                let count = &count;
                t.spawn(move || {
                    let r = node.rank();
                    for _ in 0..10 {
                        if r % 2 == 0 {
                            count.fetch_add(1, Ordering::SeqCst);
                            node.barrier(&evens).unwrap();
                            assert!(count.load(Ordering::SeqCst) >= 3);
                        }
                        node.barrier_all().unwrap();
                    }
                    // Odd ranks between themselves, then everyone once more.
                    if r % 2 == 1 {
                        node.barrier(&[1, 3]).unwrap();
                    }
                    node.barrier_all().unwrap();
                });
            }
        });
        assert_eq!(count.load(Ordering::SeqCst), 30);
    }
}

#[test]
fn refused_participant_lists_do_not_poison() {
    let mut nodes = world::<4>(3, &config(ALGORITHMS[0], Duration::from_secs(5)));
    let (_pd, node) = &mut nodes[1];
    let kind = |e: NodeError<_>| e.kind();
    assert!(matches!(
        node.barrier(&[0, 2]),
        Err(NodeError::Barrier(BarrierError::NotMember(1)))
    ));
    assert!(matches!(
        node.barrier(&[1, 0]),
        Err(NodeError::Barrier(BarrierError::Unsorted { index: 1 }))
    ));
    assert!(matches!(
        node.barrier(&[1, 1]),
        Err(NodeError::Barrier(BarrierError::DuplicateRank(1)))
    ));
    assert!(matches!(
        node.barrier(&[1, 7]),
        Err(NodeError::InvalidRank { rank: 7, world: 3 })
    ));
    assert_eq!(
        kind(node.barrier(&[0, 1, 2, 3, 4]).unwrap_err()),
        ErrorKind::InvalidArgument
    );
    assert!(!node.is_poisoned());
    // A barrier of one is immediate.
    node.barrier(&[1]).unwrap();
}

#[test]
fn a_dead_participant_times_out_and_poisons_instead_of_hanging() {
    for alg in ALGORITHMS {
        let nodes = world::<4>(4, &config(alg, Duration::from_millis(300)));
        let gate = StdBarrier::new(3);
        std::thread::scope(|t| {
            for (_pd, mut node) in nodes {
                if node.rank() == 2 {
                    continue; // rank 2 never arrives (its node is dropped: queue pairs gone)
                }
                let gate = &gate;
                t.spawn(move || {
                    gate.wait();
                    let start = Instant::now();
                    let e = node.barrier_all().unwrap_err();
                    assert!(
                        matches!(
                            e,
                            NodeError::Timeout { participants: 4 } | NodeError::Channel(_)
                        ),
                        "{alg:?} rank {}: {e}",
                        node.rank()
                    );
                    assert!(start.elapsed() < Duration::from_secs(10));
                    assert!(node.is_poisoned());
                    let start = Instant::now();
                    assert!(matches!(node.barrier_all(), Err(NodeError::Poisoned)));
                    assert!(start.elapsed() < Duration::from_millis(50), "fails fast");
                });
            }
        });
    }
}

#[test]
fn close_waits_for_barrier_messages_within_its_bound() {
    // Healthy: a barrier returns with its messages acknowledged, so closing has nothing
    // to wait for.
    let nodes = world::<2>(2, &config(ALGORITHMS[1], Duration::from_secs(20)));
    std::thread::scope(|t| {
        for (_pd, mut node) in nodes {
            t.spawn(move || {
                node.barrier_all().unwrap();
                let start = Instant::now();
                node.close(Duration::from_secs(5)).unwrap();
                assert!(start.elapsed() < Duration::from_secs(1));
            });
        }
    });
    // A barrier message to a rank that is gone is never acknowledged: closing a node whose
    // barrier was given up reports it within its timeout (plus the grace) with a typed
    // error, instead of hanging.
    let gone_peer = || {
        let mut nodes = world::<2>(2, &config(ALGORITHMS[1], Duration::from_secs(20)));
        let (_pd, gone) = nodes.pop().unwrap();
        drop(gone);
        let (_pd0, mut node) = nodes.pop().unwrap();
        node.start_barrier_all().unwrap();
        node
    };
    // A barrier that polls learns it at once: its write failed.
    let mut node = gone_peer();
    let start = Instant::now();
    let e = loop {
        match node.poll_barrier() {
            Ok(done) => assert!(!done, "the peer never arrives"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), ErrorKind::Completion, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(node.is_poisoned());
    let mut node = gone_peer();
    node.abandon_barrier();
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let e = node.close(timeout).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::Timeout | ErrorKind::Completion | ErrorKind::DeviceFatal
        ),
        "{e}"
    );
    assert!(start.elapsed() < timeout * 10, "{:?}", start.elapsed());
}

#[test]
fn close_gives_up_on_a_partitioned_peer_at_its_timeout() {
    // Nothing answers across a partition: with timers that take their time, the message is
    // retried for ~0.5 s (7 retries of a 67 ms timeout), longer than the close's bound,
    // which ends it with a timeout.
    let cfg = FabricConfig {
        instant_timers: false,
        ..FabricConfig::default()
    };
    let sim = Sim::with_config(cfg, 2);
    let mut nodes = world_in::<2>(&sim, 2, &config(ALGORITHMS[1], Duration::from_secs(20)));
    sim.fabric().partition(0, 1).unwrap();
    let (_pd1, _far) = nodes.pop().unwrap();
    let (_pd0, mut node) = nodes.pop().unwrap();
    node.start_barrier_all().unwrap();
    assert!(!node.poll_barrier().unwrap());
    node.abandon_barrier();
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let e = node.close(timeout).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let took = start.elapsed();
    assert!(took >= timeout && took < timeout * 10, "{took:?}");
}

/// Two ranks connected by hand, and what rank 0 made for rank 1: where rank 1 writes its
/// barrier messages.
fn pair(cfg: &NodeConfig) -> (Vec<zverbs::testing::Rank<2, 16, 2>>, RemoteRegion) {
    let sim = Sim::with_devices(2);
    let prepared: Vec<_> = (0..2)
        .map(|r| {
            let ctx = Context::open(&sim, &format!("sim{r}")).unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let node = Node::<Sim, 2, 16, 2>::prepare(&ctx, &pd, r, 2, cfg).unwrap();
            (pd, node)
        })
        .collect();
    let eps: Vec<Vec<_>> = prepared
        .iter()
        .map(|(_, p)| (0..2).map(|peer| p.endpoints(peer).ok()).collect())
        .collect();
    let window = eps[0][1].unwrap().1;
    let ranks = prepared
        .into_iter()
        .enumerate()
        .map(|(r, (pd, p))| (pd, p.connect(|peer| eps[peer][r]).unwrap()))
        .collect();
    (ranks, window)
}

/// What a node writes into a barrier slot for message `imm`: its complement above it.
fn word(imm: u32) -> u64 {
    u64::from(!imm) << 32 | u64::from(imm)
}

/// Writes `word` into the slot of the first barrier (count 1: the second slot) that rank
/// 0 keeps for rank 1, as rank 1; then runs a dissemination barrier at rank 0 alone.
fn barrier_after_writing(word: u64, timeout: Duration) -> (Result<(), NodeError<SimError>>, bool) {
    let (mut ranks, window) = pair(&config(ALGORITHMS[1], timeout));
    let (pd1, mut peer) = ranks.pop().unwrap();
    let (_pd0, mut node) = ranks.pop().unwrap();
    let mut bytes = word.to_ne_bytes();
    let src = pd1.register(&mut bytes).unwrap();
    let ch = peer.channels().peer(0).unwrap();
    ch.write([src.slice(..).unwrap()], &window.slice(8..16).unwrap())
        .unwrap();
    let r = node.barrier_all();
    (r, node.is_poisoned())
}

#[test]
fn a_word_out_of_protocol_in_a_barrier_slot_fails_the_barrier_at_once() {
    let round = |epoch: u32| 3 << 30 | epoch; // a dissemination message of round 0
    for imm in [
        0x1,      /* kind 0 */
        round(2), /* a later barrier's count */
    ] {
        let start = Instant::now();
        let (r, poisoned) = barrier_after_writing(word(imm), Duration::from_secs(20));
        let e = r.unwrap_err();
        assert!(
            matches!(e, NodeError::Protocol { from: 1, word: w } if w == word(imm)),
            "{imm:#x}: {e}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "at once, not at the timeout"
        );
        assert!(poisoned);
    }
    // A word whose halves disagree is a write still landing (its bytes arrive in any
    // order): not taken, and the barrier runs into its timeout.
    let (r, poisoned) = barrier_after_writing(0xdead_beef_0000_0000, Duration::from_millis(200));
    assert!(
        matches!(r, Err(NodeError::Timeout { participants: 2 })),
        "{r:?}"
    );
    assert!(poisoned);
    // The word of the right message is a barrier message like any other: rank 0
    // completes without rank 1 taking part (rank 1 wrote its message by hand).
    let (r, poisoned) = barrier_after_writing(word(round(1)), Duration::from_secs(20));
    r.unwrap();
    assert!(!poisoned);
}

#[test]
fn a_barrier_window_shorter_than_two_slots_is_refused_at_connect() {
    let cfg = config(ALGORITHMS[1], Duration::from_secs(20));
    let sim = Sim::with_devices(2);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let other = Context::open(&sim, "sim1").unwrap();
    let other_pd = other.alloc_pd().unwrap();
    let a = Node::<Sim, 2>::prepare(&ctx, &pd, 0, 2, &cfg).unwrap();
    let b = Node::<Sim, 2>::prepare(&other, &other_pd, 1, 2, &cfg).unwrap();
    let (data, mut window) = b.endpoints(0).unwrap();
    window.len = 8;
    let e = a.connect(|_| Some((data, window))).err().unwrap();
    assert!(
        matches!(e, NodeError::EndpointTable { peer: 1, why } if why.contains("window")),
        "{e}"
    );
}

#[test]
fn barriers_leave_the_data_channels_receives_alone() {
    let (ranks, _) = pair(&config(ALGORITHMS[1], Duration::from_secs(20)));
    std::thread::scope(|t| {
        for (pd, mut node) in ranks {
            t.spawn(move || {
                let mut inbox = [0u8; 8];
                let mut inbox = pd.register(&mut inbox).unwrap();
                let mut msg = *b"after";
                let msg = pd.register(&mut msg).unwrap();
                if node.rank() == 1 {
                    let sge = inbox.slice_mut(..).unwrap().sge();
                    let ch = node.channels().peer(0).unwrap();
                    // SAFETY: `inbox` is not touched until the receive completed (below).
                    let recv = unsafe { ch.post_receive_unpolled(&[sge]) }.unwrap();
                    for _ in 0..5 {
                        node.barrier_all().unwrap();
                    }
                    let got = node.channels().peer(0).unwrap().wait(recv).unwrap();
                    assert_eq!(&inbox.as_slice()[..got.byte_len as usize], b"after");
                } else {
                    for _ in 0..5 {
                        node.barrier_all().unwrap();
                    }
                    let ch = node.channels().peer(1).unwrap();
                    ch.send([msg.slice(..).unwrap()]).unwrap();
                }
            });
        }
    });
}

#[test]
fn a_dead_local_device_ends_a_barrier_at_once_not_at_its_timeout() {
    // Rank 1 never enters: rank 0's write is acknowledged, and it waits on its flags with
    // nothing in flight when its own device dies.
    let sim = Sim::with_devices(2);
    let timeout = Duration::from_secs(20);
    let mut ranks = world_in::<2>(&sim, 2, &config(ALGORITHMS[1], timeout));
    let (_pd1, _quiet) = ranks.pop().unwrap();
    let (_pd0, mut node) = ranks.pop().unwrap();
    let fabric = sim.fabric();
    let start = Instant::now();
    let e = std::thread::scope(|t| {
        t.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            fabric.crash(0).unwrap();
        });
        node.barrier_all().unwrap_err()
    });
    assert_eq!(e.kind(), ErrorKind::DeviceFatal, "{e}");
    assert!(start.elapsed() < timeout / 10, "{:?}", start.elapsed());
    assert!(node.is_poisoned());
}
