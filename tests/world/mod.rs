//! Shared set-up: a world of `Node`s on one simulated fabric, connected in-process.
#![allow(dead_code)]

use std::time::Duration;

use zverbs::node::{barrier::Algorithm, NodeConfig};
use zverbs::provider::sim::Sim;
use zverbs::testing::{Rank, World};

pub const ALGORITHMS: [Algorithm; 3] = [
    Algorithm::Centralized,
    Algorithm::Dissemination,
    Algorithm::BinaryTree,
];

pub fn config(alg: Algorithm, timeout: Duration) -> NodeConfig {
    NodeConfig {
        algorithm: alg,
        barrier_timeout: Some(timeout),
        ..NodeConfig::default()
    }
}

/// `n` connected nodes, rank `i` on device `sim{i}`, each with its protection domain.
pub fn world<const N: usize>(n: usize, cfg: &NodeConfig) -> Vec<Rank<N, 16, 2>> {
    World::connected(n, cfg).unwrap().ranks
}

/// As [`world`], on `sim` (which has at least `n` devices), so that a test can reach its
/// fabric.
pub fn world_in<const N: usize>(sim: &Sim, n: usize, cfg: &NodeConfig) -> Vec<Rank<N, 16, 2>> {
    World::connected_on(sim, n, cfg).unwrap().ranks
}
