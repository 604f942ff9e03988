//! Nodes with chosen peers (`Node::prepare_with_peers`) and polled barriers
//! (`start_barrier_all` / `poll_barrier`), driven on one thread over the stepped simulator:
//! whole-world barriers with each node connected to its barrier partners only, refusals
//! that leave a node usable, and poisoning.
#![cfg(feature = "sim")]

mod world;

use zverbs::node::barrier::{neighbours, Algorithm, BarrierError};
use zverbs::node::{Node, NodeConfig, NodeError};
use zverbs::provider::sim::{FabricConfig, Sim};
use zverbs::{Context, ProtectionDomain};

use world::ALGORITHMS;

/// Peer capacity: the centralized root of the largest world here has 99 peers.
const PEERS: usize = 128;
type SparseNode = Node<Sim, PEERS, 2, 1>;

fn cfg(alg: Algorithm) -> NodeConfig {
    NodeConfig {
        algorithm: alg,
        barrier_timeout: None,
        ..NodeConfig::default()
    }
}

/// `n` nodes on a stepped fabric, each connected to the partners its algorithm names.
fn sparse_world(
    alg: Algorithm,
    n: usize,
    seed: u64,
) -> (Sim, Vec<(ProtectionDomain<Sim>, SparseNode)>) {
    sparse_world_with(n, seed, &cfg(alg))
}

/// As [`sparse_world`], with the nodes' settings given.
fn sparse_world_with(
    n: usize,
    seed: u64,
    config: &NodeConfig,
) -> (Sim, Vec<(ProtectionDomain<Sim>, SparseNode)>) {
    let alg = config.algorithm;
    let sim = Sim::with_config(
        FabricConfig {
            auto_step: false,
            ..FabricConfig::stepped(seed)
        },
        n,
    );
    let mut pds = Vec::new();
    let mut prepared = Vec::new();
    for r in 0..n {
        let ctx = Context::open(&sim, &format!("sim{r}")).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let peers = neighbours(alg, r, n);
        prepared.push(SparseNode::prepare_with_peers(&ctx, &pd, r, n, peers, config).unwrap());
        pds.push(pd);
    }
    let eps: Vec<Vec<_>> = prepared
        .iter()
        .map(|p| (0..n).map(|peer| p.endpoints(peer).ok()).collect())
        .collect();
    let nodes = pds
        .into_iter()
        .zip(prepared)
        .enumerate()
        .map(|(r, (pd, p))| (pd, p.connect(|peer| eps[peer][r]).unwrap()))
        .collect();
    sim.fabric().run_until_idle();
    (sim, nodes)
}

/// Polls every node and steps the fabric until all of `nodes` completed; panics on a stall.
fn drive(sim: &Sim, nodes: &mut [(ProtectionDomain<Sim>, SparseNode)], what: &str) {
    loop {
        let mut done = true;
        for (_, node) in nodes.iter_mut() {
            done &= node
                .poll_barrier()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        if done {
            return;
        }
        let f = sim.fabric();
        let next = f
            .next_event_at()
            .unwrap_or_else(|| panic!("{what}: stalled"));
        f.run_for(next.saturating_sub(f.now()));
    }
}

#[test]
fn whole_world_barriers_over_chosen_peers_release_only_when_all_started() {
    for alg in ALGORITHMS {
        for n in [1, 2, 3, 7, 64, 100] {
            let seed = n as u64;
            let what = format!("{alg:?} n={n} seed={seed}");
            let (sim, mut nodes) = sparse_world(alg, n, seed);
            for (r, (_, node)) in nodes.iter().enumerate() {
                let expected: Vec<usize> = neighbours(alg, r, n).collect();
                assert_eq!(node.peers().collect::<Vec<_>>(), expected, "{what}");
                assert!(expected.len() < n.max(2));
            }
            for round in 0..3 {
                // All but the last rank start and run to quiescence: none may finish.
                for (_, node) in nodes.iter_mut().take(n - 1) {
                    node.start_barrier_all().unwrap();
                }
                sim.fabric().run_until_idle();
                for (r, (_, node)) in nodes.iter_mut().enumerate().take(n - 1) {
                    for _ in 0..3 {
                        let done = node.poll_barrier().unwrap();
                        assert!(!done, "{what} round {round}: rank {r} released early");
                        sim.fabric().run_until_idle();
                    }
                }
                nodes[n - 1].1.start_barrier_all().unwrap();
                drive(&sim, &mut nodes, &what);
            }
            assert!(nodes.iter().all(|(_, node)| !node.is_poisoned()), "{what}");
        }
    }
}

/// A node keeps exactly two barrier slots per peer: a peer may be one barrier ahead, never
/// two. A laggard that polls only when nobody else can move lets every message the
/// protocol allows pile up at it (the current barrier's and the next's); a message written
/// over one not yet taken would stall the barriers or fail one as out of protocol.
#[test]
fn a_laggard_finds_every_barrier_message_in_its_slot() {
    for alg in ALGORITHMS {
        for n in [2, 3, 7, 64] {
            let seed = 100 + n as u64;
            let what = format!("{alg:?} n={n} seed={seed}");
            let (sim, mut nodes) = sparse_world_with(n, seed, &cfg(alg));
            let laggard = n / 2;
            let rounds = 4;
            let mut done = vec![0usize; n];
            for (_, node) in nodes.iter_mut() {
                node.start_barrier_all().unwrap();
            }
            // A node that completes a barrier starts the next at once.
            let step = |node: &mut SparseNode, done: &mut usize| {
                let finished = node
                    .poll_barrier()
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                if finished {
                    *done += 1;
                    if *done < rounds {
                        node.start_barrier_all().unwrap();
                    }
                }
                finished
            };
            while done.iter().any(|&d| d < rounds) {
                // Everyone but the laggard runs as far as it can.
                loop {
                    let mut moved = false;
                    for (r, (_, node)) in nodes.iter_mut().enumerate() {
                        if r != laggard && done[r] < rounds {
                            moved |= step(node, &mut done[r]);
                        }
                    }
                    let f = sim.fabric();
                    match f.next_event_at() {
                        Some(next) => {
                            f.run_for(next.saturating_sub(f.now()));
                        }
                        None if !moved => break,
                        None => {}
                    }
                }
                // Then the laggard takes one step.
                if done[laggard] < rounds {
                    step(&mut nodes[laggard].1, &mut done[laggard]);
                }
            }
            assert!(nodes.iter().all(|(_, node)| !node.is_poisoned()), "{what}");
        }
    }
}

#[test]
fn a_barrier_needing_an_unconnected_rank_is_refused_and_leaves_the_node_usable() {
    let alg = Algorithm::Dissemination;
    let (sim, mut nodes) = sparse_world(alg, 16, 3);
    // Rank 0's partners are 1, 2, 4, 8, 12, 14, 15; a barrier among 0, 3, 5 needs 3 or 5.
    let node = &mut nodes[0].1;
    assert_eq!(node.peer_index(3), None);
    assert_eq!(node.peer_index(4), Some(2));
    let e = node.start_barrier(&[0, 3, 5]).unwrap_err();
    assert!(matches!(e, NodeError::NotConnected { rank: 3 | 5 }), "{e}");
    assert!(!node.is_poisoned());
    // A second start while one runs is refused too, without poisoning.
    node.start_barrier_all().unwrap();
    let e = node.start_barrier_all().unwrap_err();
    assert!(
        matches!(e, NodeError::Barrier(BarrierError::InProgress { .. })),
        "{e}"
    );
    assert!(!node.is_poisoned());
    for (_, other) in nodes.iter_mut().skip(1) {
        other.start_barrier_all().unwrap();
    }
    drive(&sim, &mut nodes, "dissemination after refusals");
    // Polling with no barrier running says complete.
    assert!(nodes[0].1.poll_barrier().unwrap());
}

#[test]
fn an_abandoned_barrier_poisons_the_node() {
    let (_sim, mut nodes) = sparse_world(Algorithm::BinaryTree, 4, 9);
    let node = &mut nodes[1].1;
    node.abandon_barrier(); // nothing running: nothing happens
    assert!(!node.is_poisoned());
    node.start_barrier_all().unwrap();
    node.abandon_barrier();
    assert!(node.is_poisoned());
    assert!(matches!(node.poll_barrier(), Err(NodeError::Poisoned)));
    assert!(matches!(node.start_barrier_all(), Err(NodeError::Poisoned)));
}

#[test]
fn chosen_peer_lists_are_checked() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let c = cfg(Algorithm::Dissemination);
    let prep = |rank, world, peers: &[usize]| {
        Node::<Sim, 4, 2, 1>::prepare_with_peers(&ctx, &pd, rank, world, peers.iter().copied(), &c)
            .map(drop)
    };
    assert!(matches!(
        prep(2, 10, &[2]),
        Err(NodeError::InvalidRank { rank: 2, world: 10 })
    ));
    assert!(matches!(
        prep(2, 10, &[10]),
        Err(NodeError::InvalidRank {
            rank: 10,
            world: 10
        })
    ));
    assert!(matches!(
        prep(10, 10, &[1]),
        Err(NodeError::InvalidRank {
            rank: 10,
            world: 10
        })
    ));
    // Ranks are 32 bits: a world past 65,536 is fine, one past 2^32 - 1 is not.
    assert!(matches!(
        prep(0, u32::MAX as usize + 1, &[1]),
        Err(NodeError::InvalidRank { .. })
    ));
    assert!(prep(0, 262_144, &[262_143, 1, 131_072]).is_ok());
    let e = prep(0, 10, &[1, 2, 3, 4, 5]).unwrap_err();
    assert!(matches!(e, NodeError::TooManyPeers { capacity: 4 }), "{e}");
    assert!(prep(0, 65536, &[65535, 1, 1, 32768]).is_ok());
    // A node of every rank still refuses a world past its capacity.
    let full = Node::<Sim, 4, 2, 1>::prepare(&ctx, &pd, 0, 5, &c).map(drop);
    assert!(matches!(
        full,
        Err(NodeError::InvalidRank { rank: 0, world: 5 })
    ));
}
