//! `tokio::Connection::bootstrap` on the simulator: a world of ranks (tasks of one runtime)
//! connects each rank to its neighbours in one call, meeting through a root rendezvous or
//! all-to-all over a configuration, then lends and writes memory around the ring; a rank
//! that names a peer who does not name it back, and peers that are no ranks, are typed
//! errors within the timeout.
#![cfg(all(feature = "sim", feature = "tokio"))]

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::rt::{config, multi_thread};
use zverbs::bootstrap::{Bootstrap, ExchangeError, NetworkConfig};
use zverbs::provider::sim::Sim;
use zverbs::tokio::{ConnectError, Connection};
use zverbs::{AccessFlags, ChannelConfig};

const POOL: usize = 1 << 16;
const TIMEOUT: Duration = Duration::from_secs(10);

fn cfg() -> ChannelConfig {
    config(TIMEOUT)
}

/// A free loopback address (bound, then let go).
fn free() -> std::net::SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Each rank's bootstrap of a world of `n`: from its `ZVERBS_*` environment (a
/// rendezvous), or from one configuration.
fn world(n: u32, by_env: bool) -> Vec<Bootstrap> {
    let root = free().to_string();
    let config = NetworkConfig::from_addrs((0..n).map(|_| free()).collect()).unwrap();
    (0..n)
        .map(|rank| {
            if by_env {
                let env = |v: &str| match v {
                    "ZVERBS_RANK" => Some(rank.to_string()),
                    "ZVERBS_WORLD_SIZE" => Some(n.to_string()),
                    "ZVERBS_ROOT" => Some(root.clone()),
                    _ => None,
                };
                Bootstrap::from_env_of(&env).unwrap()
            } else {
                Bootstrap::from_config(config.clone(), rank).unwrap()
            }
        })
        .collect()
}

/// Runs `f(sim, bootstrap, peers(rank))` for every rank of `world` as tasks; each rank's
/// result, by rank.
async fn each_rank<T: Send + 'static, F>(
    world: Vec<Bootstrap>,
    peers: impl Fn(u32) -> Vec<u32>,
    f: impl Fn(Sim, Bootstrap, Vec<u32>) -> F,
) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
{
    let sim = Sim::with_devices(world.len());
    let tasks: Vec<_> = world
        .into_iter()
        .map(|b| tokio::spawn(f(sim.clone(), b.clone(), peers(b.rank))))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// A ring of 4, both ways of meeting: each rank leases 8 bytes of its right neighbour,
/// writes its rank there and hands the lease back; each rank receives its own buffer with
/// its left neighbour's rank in it.
#[test]
fn a_ring_connects_in_one_call_and_writes_around() {
    multi_thread().block_on(async {
        for by_env in [true, false] {
            let n = 4;
            let ring = |r: u32| vec![(r + n - 1) % n, (r + 1) % n];
            let got = each_rank(world(n, by_env), ring, |sim, b, peers| async move {
                let device = format!("sim{}", b.rank);
                let conns = Connection::bootstrap(&sim, &device, &b, &peers, POOL, &cfg())
                    .await
                    .unwrap();
                // In ascending rank order.
                let mut order = peers.clone();
                order.sort_unstable();
                let at = |p| order.iter().position(|&q| q == p).unwrap();
                let right = &conns[at((b.rank + 1) % n)];
                let left = &conns[at((b.rank + n - 1) % n)];
                let remote = right
                    .request_remote(8, AccessFlags::REMOTE_WRITE)
                    .await
                    .unwrap();
                let mut local = right.pool().alloc(8).unwrap();
                local.copy_from_slice(&u64::from(b.rank).to_le_bytes());
                let (r, _local) = right
                    .channel()
                    .write(local, &remote.region().slice(0..8).unwrap())
                    .await;
                r.unwrap();
                right.send_remote(remote).await.unwrap();
                let back = left.receive_local().await.unwrap();
                let from_left = u64::from_le_bytes(back[..8].try_into().unwrap());
                (b.rank, from_left, conns)
            })
            .await;
            for (rank, from_left, _) in &got {
                assert_eq!(*from_left, u64::from((rank + n - 1) % n), "by_env {by_env}");
            }
        }
    });
}

/// Rank 0 names rank 1, which names nobody: rank 0 fails with `Unpaired`, and every other
/// rank learns in the readiness round that rank 0 is not ready — each within the timeout.
#[test]
fn a_peer_that_does_not_name_this_rank_back_is_unpaired() {
    multi_thread().block_on(async {
        let t0 = Instant::now();
        let peers = |r: u32| if r == 0 { vec![1] } else { vec![] };
        let got = each_rank(world(3, true), peers, |sim, b, peers| async move {
            let device = format!("sim{}", b.rank);
            Connection::bootstrap(&sim, &device, &b, &peers, POOL, &cfg())
                .await
                .map(drop)
        })
        .await;
        assert!(t0.elapsed() < 10 * TIMEOUT);
        assert!(matches!(got[0], Err(ConnectError::Unpaired { peer: 1 })));
        for r in &got[1..] {
            assert!(
                matches!(r, Err(ConnectError::Exchange(ExchangeError::NotReady { failed, .. })) if failed == &[0]),
                "{r:?}"
            );
        }
    });
}

/// This rank, or a rank past the world, as a peer: refused before any meeting.
#[test]
fn peers_that_are_no_ranks_are_refused_at_once() {
    multi_thread().block_on(async {
        let sim = Sim::with_devices(1);
        let b = &world(2, true)[0];
        for bad in [0, 2] {
            let r = Connection::bootstrap(&sim, "sim0", b, &[bad], POOL, &cfg()).await;
            assert!(
                matches!(r, Err(ConnectError::Exchange(ExchangeError::NoSuchRank { rank, len: 2 })) if rank == bad),
                "{:?}",
                r.map(drop)
            );
        }
    });
}
