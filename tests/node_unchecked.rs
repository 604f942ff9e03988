//! `Node::barrier_unchecked` skips validation work, not memory safety: ranks outside the
//! world (or past the node's capacity `N`) are a typed error that leaves the node usable,
//! never an index out of bounds or a poisoned node.
#![cfg(feature = "sim")]

mod world;

use std::time::Duration;

use world::{config, world, ALGORITHMS};
use zverbs::node::barrier::BarrierError;
use zverbs::node::NodeError;
use zverbs::ErrorKind;

#[test]
fn unchecked_ranks_outside_the_world_are_refused_and_the_node_still_works() {
    for alg in ALGORITHMS {
        // Capacity 4, world 3: rank 3 is inside the capacity but outside the world; 4, 9
        // and u32::MAX are past the capacity (they would index the per-peer tables).
        let nodes = world::<4>(3, &config(alg, Duration::from_secs(10)));
        std::thread::scope(|t| {
            for (_pd, mut node) in nodes {
                t.spawn(move || {
                    let me = node.rank() as u32;
                    for bad in [3u32, 4, 9, u32::MAX] {
                        let mut list = [0u32, 1, 2, bad];
                        list.sort_unstable();
                        let e = node.barrier_unchecked(&list).unwrap_err();
                        assert!(
                            matches!(e, NodeError::InvalidRank { rank, world: 3 } if rank == bad as usize),
                            "{alg:?} rank {me}, bad rank {bad}: {e}"
                        );
                        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                        // Unsorted, and a bad rank that is not the last.
                        let e = node.barrier_unchecked(&[bad, me]).unwrap_err();
                        assert!(matches!(e, NodeError::InvalidRank { .. }), "{e}");
                        assert!(!node.is_poisoned(), "a refused list does not poison");
                    }
                    // The machine's checks still apply.
                    assert!(matches!(
                        node.barrier_unchecked(&[]),
                        Err(NodeError::Barrier(BarrierError::Empty))
                    ));
                    assert!(matches!(
                        node.barrier_unchecked(&[me, me]),
                        Err(NodeError::Barrier(BarrierError::DuplicateRank(_)))
                    ));
                    assert!(!node.is_poisoned());
                    // Valid barriers afterwards: alone, then all three, twice.
                    node.barrier_unchecked(&[me]).unwrap();
                    node.barrier_unchecked(&[0, 1, 2]).unwrap();
                    node.barrier_all().unwrap();
                    assert!(!node.is_poisoned());
                });
            }
        });
    }
}
