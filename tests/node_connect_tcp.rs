//! `Node::connect_tcp` and `connect_rendezvous` on 127.0.0.1: the endpoints gathered, then
//! a readiness round, so that no rank returns before every rank's queue pairs are at RTS;
//! a rank that reports it cannot connect fails the others at once, and ranks not ready by
//! the deadline are named.
#![cfg(feature = "sim")]

use std::io::Write;
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use zverbs::bootstrap::{encode_frame, read_frame, ExchangeError, NetworkConfig, Rendezvous};
use zverbs::node::barrier::{neighbours, Algorithm};

const LONG: Duration = Duration::from_secs(10);

/// `n` listeners on free loopback ports, and the configuration naming them.
fn listeners(n: usize) -> (NetworkConfig, Vec<TcpListener>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (NetworkConfig::from_addrs(addrs).unwrap(), ls)
}

use std::sync::Barrier;

use zverbs::node::{Node, NodeConfig, NodeError, PreparedNode};
use zverbs::provider::sim::{FabricConfig, Sim, TraceKind};
use zverbs::{Context, ProtectionDomain};
use zverbs_sim::QpState;

type SimNode = Node<Sim, 4, 16, 2>;

/// Rank `rank` of a world of `n`, on device `sim{rank}` of `sim`.
fn prepare(
    sim: &Sim,
    rank: usize,
    n: usize,
) -> (ProtectionDomain<Sim>, PreparedNode<Sim, 4, 16, 2>) {
    let ctx = Context::open(sim, &format!("sim{rank}")).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cfg = NodeConfig {
        barrier_timeout: Some(LONG),
        ..NodeConfig::default()
    };
    let prepared = SimNode::prepare(&ctx, &pd, rank, n, &cfg).unwrap();
    (pd, prepared)
}

#[test]
fn every_rank_can_send_and_barrier_right_after_connect_tcp() {
    // When any rank's connect_tcp returns, every queue pair of every rank is at RTS
    // (the fabric's trace shows each transition); a send and a barrier right after it
    // work (on the untimed fabric a send to a queue pair not yet at RTR would fail).
    // Several worlds, to give the scheduler chances to make one rank slow; sends first
    // in some, barriers first in the others.
    let n = 4;
    let qps = n * (n - 1); // a queue pair per ordered pair
    let timeout = Duration::from_secs(5);
    for round in 0..8 {
        let traced = FabricConfig {
            trace: true,
            ..FabricConfig::instant()
        };
        let sim = Sim::with_config(traced, n);
        let (cfg, ls) = listeners(n);
        let done = Barrier::new(n);
        thread::scope(|t| {
            for (rank, l) in ls.into_iter().enumerate() {
                let (sim, cfg, done) = (&sim, &cfg, &done);
                t.spawn(move || {
                    let what =
                        |e: &dyn std::fmt::Display| format!("round {round} rank {rank}: {e}");
                    let (pd, prepared) = prepare(sim, rank, n);
                    let mut out = [rank as u8; 8];
                    let mut inbox = [0u8; 8];
                    let out_mr = pd.register(&mut out).unwrap();
                    let mut inbox_mr = pd.register(&mut inbox).unwrap();
                    let start = Instant::now();
                    let (mut node, apps) = prepared
                        .connect_tcp_with_listener(cfg, &l, &[rank as u8], timeout)
                        .unwrap_or_else(|e| panic!("{}", what(&e)));
                    let at_rts = sim
                        .fabric()
                        .trace_events()
                        .iter()
                        .filter(|e| matches!(e.kind, TraceKind::State(_, QpState::ReadyToSend)))
                        .count();
                    assert_eq!(at_rts, qps, "{}", what(&"queue pairs at RTS on return"));
                    if round % 2 == 1 {
                        node.barrier_all()
                            .unwrap_or_else(|e| panic!("{}", what(&e)));
                    }
                    // Partners 0-1 and 2-3: the even rank sends first.
                    let partner = rank ^ 1;
                    let ch = node.channels().peer(partner).unwrap();
                    let send = [out_mr.slice(..).unwrap()];
                    let recv = [inbox_mr.slice_mut(..).unwrap()];
                    let r = if rank % 2 == 0 {
                        ch.send(send).and_then(|()| ch.receive(recv).map(drop))
                    } else {
                        ch.receive(recv).and_then(|_| ch.send(send))
                    };
                    r.unwrap_or_else(|e| panic!("{}", what(&e)));
                    node.barrier_all()
                        .unwrap_or_else(|e| panic!("{}", what(&e)));
                    let took = start.elapsed();
                    assert!(took < timeout, "{}", what(&format!("{took:?}")));
                    drop(inbox_mr);
                    assert_eq!(inbox, [partner as u8; 8], "{}", what(&"inbox"));
                    assert_eq!(apps, (0..n as u8).map(|r| vec![r]).collect::<Vec<_>>());
                    // Nobody drops its node while a peer may still be using it.
                    done.wait();
                });
            }
        });
    }
}

/// A fake last rank (it only accepts): exchanges a real endpoint table made on `sim`,
/// then sends `status` as its readiness on every connection (nothing if `None`) and
/// holds the connections open for `hold`.
fn fake_last_rank(
    sim: &Sim,
    listener: TcpListener,
    n: usize,
    status: Option<u8>,
    hold: Duration,
) -> thread::JoinHandle<()> {
    let sim = sim.clone();
    thread::spawn(move || {
        let (_pd, prepared) = prepare(&sim, n - 1, n);
        let table = prepared.endpoint_table();
        let me = (n - 1) as u32;
        let mut conns = Vec::new();
        for _ in 0..n - 1 {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(LONG)).unwrap();
            read_frame(&mut s).unwrap();
            s.write_all(&frame(me, &table)).unwrap();
            conns.push(s);
        }
        if let Some(status) = status {
            for s in &mut conns {
                s.write_all(&frame(me, &[status])).unwrap();
            }
        }
        thread::sleep(hold);
    })
}

/// Runs the real ranks `0..n-1` of `cfg` on `sim`; each one's result and time taken.
fn real_ranks(
    sim: &Sim,
    cfg: &NetworkConfig,
    ls: Vec<TcpListener>,
    timeout: Duration,
) -> Vec<(
    Result<(), NodeError<zverbs::provider::sim::SimError>>,
    Duration,
)> {
    let n = cfg.len();
    thread::scope(|t| {
        let handles: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                t.spawn(move || {
                    let (_pd, prepared) = prepare(sim, rank, n);
                    let start = Instant::now();
                    let r = prepared.connect_tcp_with_listener(cfg, &l, &[], timeout);
                    (r.map(drop), start.elapsed())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_rank_that_cannot_connect_fails_the_others_fast() {
    let timeout = Duration::from_secs(5);
    let sim = Sim::with_devices(3);
    let (cfg, mut ls) = listeners(3);
    let fake = fake_last_rank(&sim, ls.pop().unwrap(), 3, Some(0), Duration::from_secs(3));
    for (rank, (r, took)) in real_ranks(&sim, &cfg, ls, timeout).into_iter().enumerate() {
        let e = r.unwrap_err();
        assert!(
            matches!(&e, NodeError::Exchange(ExchangeError::NotReady { failed, .. }) if failed == &[2]),
            "rank {rank}: {e:?}"
        );
        assert!(e.to_string().contains("ranks [2] could not connect"), "{e}");
        assert!(took < timeout / 2, "rank {rank} took {took:?}");
    }
    fake.join().unwrap();
}

#[test]
fn ranks_not_ready_by_the_deadline_are_named() {
    let timeout = Duration::from_secs(1);
    let sim = Sim::with_devices(3);
    let (cfg, mut ls) = listeners(3);
    let fake = fake_last_rank(&sim, ls.pop().unwrap(), 3, None, Duration::from_secs(2));
    for (rank, (r, took)) in real_ranks(&sim, &cfg, ls, timeout).into_iter().enumerate() {
        let e = r.unwrap_err();
        assert!(
            matches!(
                &e,
                NodeError::Exchange(ExchangeError::NotReady { failed, waiting_for })
                    if failed.is_empty() && waiting_for == &[2]
            ),
            "rank {rank}: {e:?}"
        );
        assert!(e.to_string().contains("[2] to report"), "{e}");
        assert_eq!(e.kind(), zverbs::ErrorKind::Timeout, "{e}");
        assert!(took >= timeout, "rank {rank} took {took:?}");
        assert!(
            took < timeout + Duration::from_millis(900),
            "rank {rank} took {took:?}"
        );
    }
    fake.join().unwrap();
}

/// A frame from `rank` carrying `payload`.
fn frame(rank: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    encode_frame(rank, payload, &mut b).unwrap();
    b
}

/// Runs `rank_main(sim, rank, rendezvous, listener)` for every rank of a world of `n` on
/// its own thread (rank 0 gets the root's listener); their results, by rank.
fn on_rendezvous<T: Send>(
    n: usize,
    rank_main: impl Fn(&Sim, usize, &Rendezvous, Option<&TcpListener>) -> T + Sync,
) -> Vec<T> {
    let sim = Sim::with_devices(n);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let rv = Rendezvous {
        root: listener.local_addr().unwrap(),
        id: n as u64,
        world: n as u32,
    };
    let (sim, rv, listener, rank_main) = (&sim, &rv, &listener, &rank_main);
    thread::scope(|s| {
        let ranks: Vec<_> = (0..n)
            .map(|rank| {
                let root = (rank == 0).then_some(listener);
                thread::Builder::new()
                    .stack_size(4 << 20)
                    .spawn_scoped(s, move || rank_main(sim, rank, rv, root))
                    .unwrap()
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A node's `connect_rendezvous`, or rank 0's `connect_rendezvous_on` its listener.
fn connect<const PEERS: usize>(
    node: PreparedNode<Sim, PEERS, 16, 2>,
    rv: &Rendezvous,
    root: Option<&TcpListener>,
    app: &[u8],
) -> (Node<Sim, PEERS, 16, 2>, Vec<Vec<u8>>) {
    match root {
        Some(l) => node.connect_rendezvous_on(rv, l, app, LONG),
        None => node.connect_rendezvous(rv, app, LONG),
    }
    .unwrap()
}

/// The same through a root rendezvous: every rank's app bytes come back, and a barrier
/// right after the call finds every peer connected.
#[test]
fn a_world_connects_through_a_root_rendezvous() {
    let n = 4;
    let apps = on_rendezvous(n, |sim, rank, rv, root| {
        let (_pd, node) = prepare(sim, rank, n);
        let (mut node, apps) = connect(node, rv, root, &[rank as u8; 3]);
        node.barrier_all().unwrap();
        apps
    });
    for got in apps {
        assert_eq!(got, (0..n as u8).map(|r| vec![r; 3]).collect::<Vec<_>>());
    }
}

/// Nodes of few peers in a larger world: each rank hands its endpoints to its dissemination
/// partners only, through the root, and the whole world barriers.
#[test]
fn sparse_nodes_connect_through_a_rendezvous_and_barrier() {
    let n = 32;
    on_rendezvous(n, |sim, rank, rv, root| {
        let ctx = Context::open(sim, &format!("sim{rank}")).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cfg = NodeConfig {
            algorithm: Algorithm::Dissemination,
            barrier_timeout: Some(LONG),
            ..NodeConfig::default()
        };
        let peers = neighbours(Algorithm::Dissemination, rank, n);
        let node =
            Node::<Sim, 10, 16, 2>::prepare_with_peers(&ctx, &pd, rank, n, peers, &cfg).unwrap();
        let (mut node, _) = connect(node, rv, root, &[]);
        node.barrier_all().unwrap();
        node.barrier_all().unwrap();
    });
}

/// `Node::bootstrap`: each rank's `Bootstrap` from its own (recorded) environment, or
/// from one configuration, then one call; every rank's app bytes come back and the world
/// barriers. A bootstrap of another rank is refused before any connection.
#[test]
fn a_world_bootstraps_from_the_environment_or_a_configuration_in_one_call() {
    use zverbs::bootstrap::Bootstrap;
    let n = 4;
    let free = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (config, ls) = listeners(n);
    drop(ls);
    let sim = Sim::with_devices(n);
    let cfg = NodeConfig {
        barrier_timeout: Some(LONG),
        ..NodeConfig::default()
    };
    for by_env in [true, false] {
        let all: Vec<Vec<Vec<u8>>> = thread::scope(|s| {
            let ranks: Vec<_> = (0..n)
                .map(|rank| {
                    let (sim, cfg, config) = (&sim, &cfg, &config);
                    s.spawn(move || {
                        let b = if by_env {
                            let env = |v: &str| match v {
                                "ZVERBS_RANK" => Some(rank.to_string()),
                                "ZVERBS_WORLD_SIZE" => Some(n.to_string()),
                                "ZVERBS_ROOT" => Some(free.to_string()),
                                _ => None,
                            };
                            Bootstrap::from_env_of(&env).unwrap()
                        } else {
                            Bootstrap::from_config(config.clone(), rank as u32).unwrap()
                        };
                        let ctx = Context::open(sim, &format!("sim{rank}")).unwrap();
                        let pd = ctx.alloc_pd().unwrap();
                        let other = Bootstrap {
                            rank: (b.rank + 1) % n as u32,
                            ..b.clone()
                        };
                        let refused = SimNode::prepare(&ctx, &pd, rank, n, cfg)
                            .unwrap()
                            .connect_bootstrap(&other, &[], LONG);
                        assert!(matches!(refused, Err(NodeError::InvalidRank { .. })));
                        let (mut node, apps) =
                            SimNode::bootstrap(&ctx, &pd, &b, cfg, &[rank as u8; 2], LONG).unwrap();
                        node.barrier_all().unwrap();
                        apps
                    })
                })
                .collect();
            ranks.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for apps in all {
            assert_eq!(apps, (0..n as u8).map(|r| vec![r; 2]).collect::<Vec<_>>());
        }
    }
}
