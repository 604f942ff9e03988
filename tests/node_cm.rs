//! `PreparedNode::connect_cm` on the simulator: a world whose ranks connect through the
//! connection manager at the addresses a bootstrap gave them, then barrier; a stranger's
//! request is rejected while the world connects; a rank that never comes is a typed error
//! within the timeout; addresses that are not one per rank are refused.
#![cfg(feature = "sim")]

use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use zverbs::cm::{CmConnection, CmError, CmListener};
use zverbs::node::barrier::Algorithm;
use zverbs::node::{Node, NodeConfig, NodeError};
use zverbs::provider::cm::REJECT_CONSUMER;
use zverbs::provider::sim::Sim;
use zverbs::{ChannelConfig, Context};

const T: Duration = Duration::from_secs(5);

fn addrs(n: usize, port: u16) -> Vec<SocketAddr> {
    (0..n)
        .map(|i| SocketAddr::new(IpAddr::from([10, 0, 0, i as u8 + 1]), port))
        .collect()
}

fn cfg(alg: Algorithm) -> NodeConfig {
    NodeConfig {
        algorithm: alg,
        barrier_timeout: Some(T),
        ..NodeConfig::default()
    }
}

/// Rank `rank` of `addrs.len()`, skipping `absent` ranks: its connect's result, after
/// `barriers` barriers if it connected.
fn rank_main(
    sim: &Sim,
    addrs: &[SocketAddr],
    rank: usize,
    alg: Algorithm,
    barriers: usize,
) -> Result<(), NodeError<zverbs::provider::sim::SimError>> {
    let n = addrs.len();
    let ctx = Context::open(sim, &format!("sim{rank}")).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let listener = CmListener::bind(sim, addrs[rank]).unwrap();
    let node = Node::<Sim, 8>::prepare(&ctx, &pd, rank, n, &cfg(alg))?;
    let from = Some(addrs[rank].ip());
    let (mut node, links) = node.connect_cm(&ctx, &listener, addrs, from, T)?;
    for _ in 0..barriers {
        node.barrier_all()?;
    }
    assert_eq!(links.disconnected().unwrap(), None);
    // Every rank past its barriers before any drops its links.
    node.barrier_all()?;
    thread::sleep(Duration::from_millis(20));
    Ok(())
}

#[test]
fn a_world_connects_through_the_manager_and_barriers() {
    for alg in [
        Algorithm::Centralized,
        Algorithm::Dissemination,
        Algorithm::BinaryTree,
    ] {
        let n = 6;
        let sim = Sim::with_devices(n);
        let addrs = addrs(n, 7500);
        thread::scope(|s| {
            let ranks: Vec<_> = (0..n)
                .map(|r| {
                    let (sim, addrs) = (&sim, &addrs);
                    s.spawn(move || rank_main(sim, addrs, r, alg, 20))
                })
                .collect();
            for (r, h) in ranks.into_iter().enumerate() {
                h.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{alg:?}, rank {r}: {e}"));
            }
        });
        assert_eq!(sim.fabric().cm_ids(), 0, "every id destroyed with its node");
    }
}

#[test]
fn a_stranger_is_rejected_while_the_world_connects() {
    let n = 3;
    let sim = Sim::with_devices(n + 1);
    let addrs = addrs(n, 7501);
    thread::scope(|s| {
        let stranger = s.spawn(|| {
            let ctx = Context::open(&sim, &format!("sim{n}")).unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let from = Some(IpAddr::from([10, 0, 0, n as u8 + 1]));
            let start = Instant::now();
            loop {
                let r = CmConnection::<Sim>::connect(
                    &sim,
                    &ctx,
                    &pd,
                    from,
                    addrs[2],
                    b"ZVND garbage",
                    &ChannelConfig::default(),
                    T,
                );
                match r {
                    Err(CmError::Rejected {
                        status: REJECT_CONSUMER,
                        private_data,
                    }) => {
                        return private_data.starts_with(b"ZVND: not a peer");
                    }
                    // Rank 2 not listening yet.
                    Err(CmError::Rejected { .. }) if start.elapsed() < T => {
                        thread::sleep(Duration::from_millis(5))
                    }
                    other => panic!("{:?}", other.map(|_| ())),
                }
            }
        });
        let spawn = |r: usize| {
            let (sim, addrs) = (&sim, &addrs);
            s.spawn(move || rank_main(sim, addrs, r, Algorithm::Dissemination, 5))
        };
        // Rank 2 alone first: it cannot finish connecting (and drop its listener, which
        // would refuse a pending request without the node's reason) before its lower
        // peers exist, so the stranger meets the node mid-connect whatever the timing.
        let last = spawn(n - 1);
        assert!(stranger.join().unwrap(), "rejected with the node's reason");
        let ranks: Vec<_> = (0..n - 1).map(spawn).chain([last]).collect();
        for h in ranks {
            h.join().unwrap().unwrap();
        }
    });
}

#[test]
fn a_rank_that_never_comes_is_a_timeout_and_bad_addresses_are_refused() {
    let n = 3;
    let sim = Sim::with_devices(n);
    let addrs = addrs(n, 7502);
    let start = Instant::now();
    thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                let (sim, addrs) = (&sim, &addrs);
                s.spawn(move || rank_main(sim, addrs, r, Algorithm::Centralized, 1))
            })
            .collect();
        // Rank 1 times out waiting for rank 2; rank 0 too, or first sees rank 1 give up
        // (its request refused when rank 1's node went).
        for h in ranks {
            let r = h.join().unwrap();
            let ok = match &r {
                Err(NodeError::Cm {
                    error: CmError::Timeout { .. },
                    ..
                }) => true,
                Err(NodeError::Cm {
                    peer: Some(1),
                    error: CmError::Rejected { status, .. },
                }) => *status == REJECT_CONSUMER,
                _ => false,
            };
            assert!(ok, "{:?}", r.map_err(|e| e.to_string()));
        }
    });
    assert!(start.elapsed() < 10 * T);

    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let listener = CmListener::bind(&sim, addrs[0]).unwrap();
    let node = Node::<Sim, 8>::prepare(&ctx, &pd, 0, n, &cfg(Algorithm::Centralized)).unwrap();
    let r = node.connect_cm(&ctx, &listener, &addrs[..2], None, T);
    assert!(matches!(
        r,
        Err(NodeError::InvalidRank { rank: 0, world: 2 })
    ));
}
