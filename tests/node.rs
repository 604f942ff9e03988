//! `Node` barriers over the simulator: release only when all have arrived, subsets,
//! consecutive barriers, refused lists, timeouts and poisoning.
#![cfg(feature = "sim")]

mod world;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier as StdBarrier;
use std::time::{Duration, Instant};

use world::{config, world, world_in, ALGORITHMS};
use zverbs::node::barrier::BarrierError;
use zverbs::node::NodeError;
use zverbs::provider::sim::{FabricConfig, Sim};
use zverbs::ErrorKind;

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
    // A barrier message to a rank that is gone is never acknowledged: closing gives up
    // within its timeout (plus the grace) with a typed error, instead of hanging.
    let mut nodes = world::<2>(2, &config(ALGORITHMS[1], Duration::from_secs(20)));
    let (_pd, mut gone) = nodes.pop().unwrap();
    let (_pd0, mut node) = nodes.pop().unwrap();
    gone.abandon_barrier();
    drop(gone);
    node.start_barrier_all().unwrap();
    // Its message is refused (the peer's queue pair is gone) or still retried.
    match node.poll_barrier() {
        Ok(done) => assert!(!done, "the peer never arrives"),
        Err(e) => assert!(node.is_poisoned(), "{e}"),
    }
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
