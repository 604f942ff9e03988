//! Shared set-up: a world of `Node`s on one simulated fabric, connected in-process.
#![allow(dead_code)]

use std::time::Duration;

use zverbs::node::{barrier::Algorithm, Node, NodeConfig};
use zverbs::provider::sim::Sim;
use zverbs::{Context, ProtectionDomain};

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
pub fn world<const N: usize>(
    n: usize,
    cfg: &NodeConfig,
) -> Vec<(ProtectionDomain<Sim>, Node<Sim, N, 16, 2>)> {
    world_in(&Sim::with_devices(n), n, cfg)
}

/// As [`world`], on `sim` (which has at least `n` devices), so that a test can reach its
/// fabric.
pub fn world_in<const N: usize>(
    sim: &Sim,
    n: usize,
    cfg: &NodeConfig,
) -> Vec<(ProtectionDomain<Sim>, Node<Sim, N, 16, 2>)> {
    let mut pds = Vec::new();
    let mut prepared = Vec::new();
    for r in 0..n {
        let ctx = Context::open(sim, &format!("sim{r}")).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        prepared.push(Node::<Sim, N, 16, 2>::prepare(&ctx, &pd, r, n, cfg).unwrap());
        pds.push(pd);
    }
    let eps: Vec<Vec<_>> = prepared
        .iter()
        .map(|p| (0..n).map(|peer| p.endpoints(peer).ok()).collect())
        .collect();
    pds.into_iter()
        .zip(prepared)
        .enumerate()
        .map(|(r, (pd, p))| (pd, p.connect(|peer| eps[peer][r]).unwrap()))
        .collect()
}
