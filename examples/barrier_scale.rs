//! Barriers and a scatter at scale on the simulator's stepped mode: worlds of N = 2, 4, ...
//! up to 65,536 [`Node`]s on one thread, no OS thread per node; the binary tree up to
//! 262,144 (ranks are 32 bits), dissemination up to 65,536. `--only ALG` runs one sweep.
//!
//! ```sh
//! cargo run --release --features sim --example barrier_scale [-- --max-nodes 65536 --seed 1]
//! cargo run --release --features sim --example barrier_scale -- --max-nodes 262144 --only tree
//! ```
//!
//! Each rank is one simulated device with one [`Node`], prepared with the peers its
//! algorithm talks to ([`Node::prepare_with_peers`] with [`barrier::neighbours`]): 31 for
//! dissemination at 65,536 ranks, 3 for the tree, the centralized root everyone. Every
//! node starts a whole-world barrier ([`Node::start_barrier_all`]); the driver then
//! advances the fabric to its next event ([`Fabric::next_event_at`]) and polls the nodes
//! not yet done ([`Node::poll_barrier`]), so a completion is seen at the simulated instant
//! it happens and CPU time counts as zero: the figure is the network's share of a barrier.
//! A node is done when it is released *and* its own messages are acknowledged (what
//! `barrier_all` waits for), one one-way latency after the release at most.
//!
//! Printed per algorithm and N: the simulated time until the last node was done, the
//! `⌈log2 N⌉ × one-way latency` bound and the ratio to it, the algorithm's critical path
//! (`rounds(alg, N)` one-way latencies, plus one for the last acknowledgement), the
//! simulator's events and events per second of wall time, the wall time (setup excluded),
//! and the peak heap during the run per node and per queue pair (every queue pair: one per
//! peer of every node, which carries its data and its barrier messages). After each sweep a line checks the growth and
//! fails the run if it is off: dissemination and tree must add a constant per doubling of N
//! (log2 N), end within 10 % of their critical path, and process O(N log N) events (events
//! per node growing by a constant per doubling); centralized must grow linearly. The
//! centralized sweep stops at 4,096 ranks unless `--max-centralized` says otherwise (at
//! most 8,192): its root takes N - 1 arrivals one after another on one link, N distinct
//! instants at which this driver polls every node (O(N²) polls).
//!
//! The fabric sizes its queues as work arrives ([`FabricConfig::lazy_queues`]): a queue
//! pair costs what it holds at its busiest, here one or two requests, and the timer heap
//! what is armed at once.
//!
//! Last, a scatter on the dissemination world: every node writes 64 bytes to each of its
//! `⌈log2 N⌉` partners `rank + 2^k` over its data channels, and every byte is checked.

use std::error::Error as StdError;
use std::time::{Duration, Instant};

use zverbs::multi_channel::PeerTransport;
use zverbs::node::barrier::{self, rounds, Algorithm};
use zverbs::node::{Node, NodeConfig, NodeError, PreparedNode};
use zverbs::provider::sim::{FabricConfig, Sim, SimError};
use zverbs::qp::{Rc, RcOnSrq};
use zverbs::srq::SlotsConfig;
use zverbs::{AccessFlags, Context, Endpoint, Pending, ProtectionDomain, SendFlags, Sge};

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

type Result<T> = core::result::Result<T, Box<dyn StdError>>;

/// The largest world this driver builds (ranks are 32 bits; the tree's nodes are small
/// enough for 262,144 of them in memory).
const MAX: usize = 1 << 18;
/// The largest dissemination world: its node type holds 31 peers, enough for 65,536
/// ranks (2 × 18 - 1 = 35 would be needed at 262,144, and every node would pay for them).
const MAX_DISSEMINATION: usize = 1 << 16;
/// Data channel depth and SGEs: the barriers and the scatter keep one write per peer in
/// flight, so the channels are one request deep (a second slot would add 96 bytes per
/// peer: BENCHMARKS.md, section 6).
const DEPTH: usize = 1;
const SGES: usize = 1;
/// Peer capacities: dissemination has at most 2 × 16 - 1 partners (`rank ± 2^k` for
/// `k < 16`; the sweep's N are powers of two, where `+2^15` and `-2^15` meet), the tree 3,
/// a centralized leaf 1 and its root everyone (the centralized sweep stops at
/// `ROOT_PEERS`). A node's per-peer slots are sized by these.
const DISSEMINATION_PEERS: usize = 31;
const TREE_PEERS: usize = 3;
const ROOT_PEERS: usize = 8192;
/// Bytes each scatter write carries.
const PIECE: usize = 64;
/// With `--receives srq` (the default): each node's receive slots, shared by its peers (what a node that
/// takes small messages from any peer might hold; the barriers and the scatter are writes
/// and use none).
const SRQ_SLOTS: SlotsConfig = SlotsConfig {
    slots: 16,
    size: 64,
    refill_at: 4,
    limit: 0,
};

type NodeResult<T> = core::result::Result<T, NodeError<SimError>>;
/// The data and barrier endpoints one rank made for another.
type Eps = (Endpoint, zverbs::RemoteRegion);

/// One rank, whatever its peer capacity (the centralized root's differs from its leaves').
trait Rank {
    fn start(&mut self) -> NodeResult<()>;
    fn poll(&mut self) -> NodeResult<bool>;
    /// Posts a write of `sge` to `target` on the data channel to `rank`, unpolled.
    ///
    /// # Safety
    /// As `Channel::post_send_unpolled`.
    unsafe fn write(
        &mut self,
        rank: usize,
        sge: Sge,
        target: &zverbs::RemoteRegion,
    ) -> Result<Pending>;
    /// `Channel::try_complete` on the data channel to `rank`: `None` when done.
    fn try_complete(&mut self, rank: usize, p: Pending) -> Result<Option<Pending>>;
    fn peers(&self) -> usize;
}

impl<const PEERS: usize, T: PeerTransport> Rank for Node<Sim, PEERS, DEPTH, SGES, T> {
    fn start(&mut self) -> NodeResult<()> {
        self.start_barrier_all()
    }
    fn poll(&mut self) -> NodeResult<bool> {
        self.poll_barrier()
    }
    unsafe fn write(
        &mut self,
        rank: usize,
        sge: Sge,
        target: &zverbs::RemoteRegion,
    ) -> Result<Pending> {
        let i = self
            .peer_index(rank)
            .ok_or("no data channel to a partner")?;
        let ch = self.channels().peer(i)?;
        // SAFETY: the caller's contract.
        Ok(unsafe { ch.post_send_unpolled(&[sge], target.write_op(), SendFlags::empty()) }?)
    }
    fn try_complete(&mut self, rank: usize, p: Pending) -> Result<Option<Pending>> {
        let i = self.peer_index(rank).ok_or("no data channel")?;
        Ok(self.channels().peer(i)?.try_complete(p)?.err())
    }
    fn peers(&self) -> usize {
        Node::peers(self).count()
    }
}

/// A world of `n` ranks on a stepped fabric, each node connected to its partners.
struct World {
    sim: Sim,
    pds: Vec<ProtectionDomain<Sim>>,
    nodes: Vec<Box<dyn Rank>>,
    queue_pairs: usize,
}

fn prepared<const PEERS: usize, T: PeerTransport>(
    ctx: &Context<Sim>,
    pd: &ProtectionDomain<Sim>,
    alg: Algorithm,
    r: usize,
    n: usize,
) -> Result<PreparedNode<Sim, PEERS, DEPTH, SGES, T>> {
    let cfg = NodeConfig {
        algorithm: alg,
        barrier_timeout: None,
        receive_slots: SRQ_SLOTS,
        ..NodeConfig::default()
    };
    let peers = barrier::neighbours(alg, r, n);
    Ok(Node::prepare_with_peers(ctx, pd, r, n, peers, &cfg)?)
}

/// Connects `prep` with the endpoints its peers made for it.
fn connect<const PEERS: usize, T: PeerTransport + 'static>(
    prep: PreparedNode<Sim, PEERS, DEPTH, SGES, T>,
    eps: impl Fn(usize) -> Option<Eps>,
) -> Result<Box<dyn Rank>> {
    Ok(Box::new(prep.connect(eps)?))
}

/// Prepared nodes of every capacity in one list (the centralized root and a dissemination
/// node are big).
enum Prep<T: PeerTransport> {
    Dissemination(Box<PreparedNode<Sim, DISSEMINATION_PEERS, DEPTH, SGES, T>>),
    Tree(PreparedNode<Sim, TREE_PEERS, DEPTH, SGES, T>),
    Root(Box<PreparedNode<Sim, ROOT_PEERS, DEPTH, SGES, T>>),
    Leaf(PreparedNode<Sim, 1, DEPTH, SGES, T>),
}

impl<T: PeerTransport> Prep<T> {
    fn endpoints(&self, peer: usize) -> Option<Eps> {
        match self {
            Prep::Dissemination(p) => p.endpoints(peer).ok(),
            Prep::Tree(p) => p.endpoints(peer).ok(),
            Prep::Root(p) => p.endpoints(peer).ok(),
            Prep::Leaf(p) => p.endpoints(peer).ok(),
        }
    }
}

fn build<T: PeerTransport + 'static>(alg: Algorithm, n: usize, seed: u64) -> Result<World> {
    let sim = Sim::with_config(
        FabricConfig {
            auto_step: false,
            lazy_queues: true,
            ..FabricConfig::stepped(seed)
        },
        n,
    );
    let mut pds = Vec::with_capacity(n);
    let mut preps = Vec::<Prep<T>>::with_capacity(n);
    for r in 0..n {
        let ctx = Context::open(&sim, &format!("sim{r}"))?;
        let pd = ctx.alloc_pd()?;
        preps.push(match alg {
            Algorithm::Dissemination => {
                Prep::Dissemination(Box::new(prepared(&ctx, &pd, alg, r, n)?))
            }
            Algorithm::BinaryTree => Prep::Tree(prepared(&ctx, &pd, alg, r, n)?),
            Algorithm::Centralized if r == 0 => {
                Prep::Root(Box::new(prepared(&ctx, &pd, alg, r, n)?))
            }
            Algorithm::Centralized => Prep::Leaf(prepared(&ctx, &pd, alg, r, n)?),
        });
        pds.push(pd);
    }
    // Per rank, the endpoints its partners made for it (read before any node is consumed),
    // in increasing partner order.
    let table: Vec<Vec<(usize, Eps)>> = (0..n)
        .map(|me| {
            barrier::neighbours(alg, me, n)
                .filter_map(|peer| preps[peer].endpoints(me).map(|e| (peer, e)))
                .collect()
        })
        .collect();
    let mut nodes = Vec::with_capacity(n);
    let mut queue_pairs = 0;
    // A rank's row goes as soon as the rank is connected: the table is an exchange, not
    // state a node keeps.
    for (prep, mine) in preps.into_iter().zip(table) {
        let eps = |peer: usize| {
            let i = mine.binary_search_by_key(&peer, |e| e.0).ok()?;
            Some(mine[i].1)
        };
        let node = match prep {
            Prep::Dissemination(p) => connect(*p, eps)?,
            Prep::Tree(p) => connect(p, eps)?,
            Prep::Root(p) => connect(*p, eps)?,
            Prep::Leaf(p) => connect(p, eps)?,
        };
        queue_pairs += node.peers();
        nodes.push(node);
    }
    sim.fabric().run_until_idle(); // nothing in flight before the start
    Ok(World {
        sim,
        pds,
        nodes,
        queue_pairs,
    })
}

struct Run {
    /// Simulated time until the last node was done.
    latency: Duration,
    events: usize,
    wall: Duration,
}

/// Advances the fabric to its next event; the events run (0: nothing scheduled).
fn step(sim: &Sim) -> usize {
    let f = sim.fabric();
    match f.next_event_at() {
        Some(next) => f.run_for(next.saturating_sub(f.now())).max(1),
        None => 0,
    }
}

fn barrier_run(w: &mut World) -> Result<Run> {
    let t0 = w.sim.fabric().now();
    let wall = Instant::now();
    for node in w.nodes.iter_mut() {
        node.start()?;
    }
    let mut waiting: Vec<usize> = (0..w.nodes.len()).collect();
    let mut events = 0;
    let mut last = t0;
    loop {
        let now = w.sim.fabric().now();
        let before = waiting.len();
        let mut i = 0;
        while i < waiting.len() {
            if w.nodes[waiting[i]].poll()? {
                waiting.swap_remove(i);
            } else {
                i += 1;
            }
        }
        if waiting.len() < before {
            last = now;
        }
        if waiting.is_empty() {
            break;
        }
        match step(&w.sim) {
            0 => return Err(format!("stalled, {} nodes not done", waiting.len()).into()),
            n => events += n,
        }
    }
    Ok(Run {
        latency: last - t0,
        events,
        wall: wall.elapsed(),
    })
}

/// Every node writes `PIECE` bytes to each partner `rank + 2^k` (slot `k` of the target's
/// region); checks every byte once all writes completed.
fn scatter_run(w: &mut World) -> Result<Run> {
    let n = w.nodes.len();
    let r = ceil_log2(n) as usize;
    let mut memory = vec![0u8; n * (r + 1) * PIECE];
    let mut regions = Vec::with_capacity(n);
    for (rank, (chunk, pd)) in memory.chunks_mut((r + 1) * PIECE).zip(&w.pds).enumerate() {
        chunk[..PIECE].fill(rank as u8); // the source: this rank's byte
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // SAFETY: no Rust code touches `memory` until every write completed and the
        // regions are dropped (below).
        regions.push(unsafe { pd.register_with_access(chunk, access) }?);
    }
    let remotes: Vec<_> = regions.iter().map(|m| m.remote()).collect();
    let t0 = w.sim.fabric().now();
    let wall = Instant::now();
    let mut pending: Vec<(usize, usize, Pending)> = Vec::with_capacity(n * r);
    for (rank, region) in regions.iter().enumerate() {
        let sge = region.slice(..PIECE)?.sge();
        for k in 0..r {
            let to = (rank + (1 << k)) % n;
            let at = ((k + 1) * PIECE) as u64;
            let target = remotes[to].slice(at..at + PIECE as u64)?;
            // SAFETY: the source lives in `memory`, which outlives every write (all are
            // completed below before it is dropped) and is not written meanwhile.
            let p = unsafe { w.nodes[rank].write(to, sge, &target) }?;
            pending.push((rank, to, p));
        }
    }
    let mut events = 0;
    while !pending.is_empty() {
        let mut left = Vec::with_capacity(pending.len());
        for (rank, to, p) in pending.drain(..) {
            if let Some(p) = w.nodes[rank].try_complete(to, p)? {
                left.push((rank, to, p));
            }
        }
        pending = left;
        if pending.is_empty() {
            break;
        }
        match step(&w.sim) {
            0 => return Err(format!("scatter stalled, {} writes pending", pending.len()).into()),
            e => events += e,
        }
    }
    let latency = w.sim.fabric().now() - t0;
    let wall = wall.elapsed();
    drop(regions);
    for (rank, chunk) in memory.chunks((r + 1) * PIECE).enumerate() {
        for k in 0..r {
            let from = (rank + n - (1 << k) % n) % n;
            let piece = &chunk[(k + 1) * PIECE..(k + 2) * PIECE];
            if piece.iter().any(|&b| b != from as u8) {
                return Err(format!("rank {rank} slot {k}: not rank {from}'s bytes").into());
            }
        }
    }
    Ok(Run {
        latency,
        events,
        wall,
    })
}

fn ceil_log2(n: usize) -> u32 {
    usize::BITS - (n.max(1) - 1).leading_zeros()
}

/// Barriers (and a scatter) over worlds of 2, 4, ... N Nodes on the stepped simulator, one
/// thread; fails if a sweep's growth is off.
#[derive(clap::Parser)]
#[command(name = "barrier_scale")]
struct Cli {
    /// The largest world (a power of two is the last point)
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=MAX as u64))]
    max_nodes: usize,
    /// The largest world of the centralized sweep (its root polls O(N^2))
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=ROOT_PEERS as u64))]
    max_centralized: usize,
    /// One sweep only
    #[arg(long, value_enum, value_name = "ALG")]
    only: Option<Only>,
    /// The fabric's seed
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where a node's peers receive: one shared receive queue per node (16 slots of 64
    /// bytes), or each its own receive queue
    #[arg(long, value_enum, default_value = "srq")]
    receives: Receives,
}

/// `--receives`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Receives {
    Own,
    Srq,
}

/// `--only`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Only {
    Dissemination,
    Tree,
    Centralized,
}

/// One sweep point: what gets printed and checked.
struct Point {
    n: usize,
    latency: Duration,
    events: usize,
}

fn main() -> Result<()> {
    // The centralized root's tables are a few MiB: room for them on the stack. The sweep's
    // error comes back as text (a boxed error is not `Send`).
    let worker = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(|| sweep().map_err(|e| e.to_string()))?;
    Ok(worker.join().map_err(|_| "the sweep panicked")??)
}

fn sweep() -> Result<()> {
    let args = <Cli as clap::Parser>::parse();
    let (max, max_central, seed) = (args.max_nodes, args.max_centralized, args.seed);
    let only = args.only.map(|o| match o {
        Only::Dissemination => Algorithm::Dissemination,
        Only::Tree => Algorithm::BinaryTree,
        Only::Centralized => Algorithm::Centralized,
    });
    let one_way = Duration::from_nanos(FabricConfig::default().link.latency_ns);
    println!(
        "barrier_scale: stepped simulator, seed {seed}, one-way latency {one_way:?}, receives: {:?}",
        args.receives
    );
    println!(
        "{:<14} {:>6} {:>10} {:>6} {:>10} {:>10} {:>10} {:>9} {:>8} {:>8}",
        "algorithm",
        "N",
        "sim time",
        "/log2N",
        "crit+ack",
        "events",
        "events/s",
        "wall",
        "B/node",
        "B/QP"
    );
    for alg in [
        Algorithm::Dissemination,
        Algorithm::BinaryTree,
        Algorithm::Centralized,
    ]
    .into_iter()
    .filter(|a| !matches!(only, Some(o) if o != *a))
    {
        let top = match alg {
            Algorithm::Centralized => max.min(max_central),
            Algorithm::Dissemination => max.min(MAX_DISSEMINATION),
            _ => max,
        };
        let mut sweep = Vec::new();
        let mut n = 2;
        while n <= top {
            zverbs_testkit::process::reset();
            let base = zverbs_testkit::process::live_bytes();
            let w = match args.receives {
                Receives::Own => build::<Rc>(alg, n, seed),
                Receives::Srq => build::<RcOnSrq>(alg, n, seed),
            };
            let mut w = w.map_err(|e| format!("{alg:?}, N = {n}: {e}"))?;
            let r =
                barrier_run(&mut w).map_err(|e| format!("{alg:?}, N = {n}, seed {seed}: {e}"))?;
            let peak = zverbs_testkit::process::peak_bytes() - base;
            let critical = one_way * (rounds(alg, n) + 1);
            let bound = one_way * ceil_log2(n);
            if r.latency < one_way * rounds(alg, n) {
                return Err(format!(
                    "{alg:?}, N = {n}, seed {seed}: done after {:?}, before its critical path",
                    r.latency
                )
                .into());
            }
            println!(
                "{:<14} {:>6} {:>10} {:>6.2} {:>10} {:>10} {:>10.2e} {:>9} {:>8} {:>8}",
                format!("{alg:?}"),
                n,
                format!("{:.2?}", r.latency),
                r.latency.as_secs_f64() / bound.as_secs_f64(),
                format!("{critical:.2?}"),
                r.events,
                r.events as f64 / r.wall.as_secs_f64(),
                format!("{:.1?}", r.wall),
                peak / n,
                peak / w.queue_pairs.max(1),
            );
            sweep.push(Point {
                n,
                latency: r.latency,
                events: r.events,
            });
            if alg == Algorithm::Dissemination && n == top {
                let s = scatter_run(&mut w).map_err(|e| format!("scatter, N = {n}: {e}"))?;
                println!(
                    "  scatter: each of {n} nodes writes {PIECE} B to its {} partners rank + 2^k: {:.2?} simulated ({:.1} one-way latencies), {} events, {:.1?} wall, every byte checked",
                    ceil_log2(n),
                    s.latency,
                    s.latency.as_secs_f64() / one_way.as_secs_f64(),
                    s.events,
                    s.wall
                );
            }
            n *= 2;
        }
        println!("  {}", growth(alg, &sweep, one_way)?);
    }
    Ok(())
}

/// Checks and describes how time and events grow over the sweep (N doubling each step):
/// dissemination and tree by a constant per doubling (log2 N), within 10 % of their
/// critical path plus the last acknowledgement at the largest N, and O(N log N) events
/// (events per node growing by a constant per doubling, within 25 %); centralized linearly
/// in N (the root's link serialises the N - 1 arrivals and releases).
fn growth(alg: Algorithm, sweep: &[Point], one_way: Duration) -> Result<String> {
    let [.., a, b, c] = sweep else {
        return Ok("(sweep too short to judge growth)".into());
    };
    let ns = |d: Duration| d.as_secs_f64() * 1e9;
    let (step, step_prev) = (ns(c.latency) - ns(b.latency), ns(b.latency) - ns(a.latency));
    let critical = ns(one_way * (rounds(alg, c.n) + 1));
    let off = ns(c.latency) / critical - 1.0;
    if alg == Algorithm::Centralized {
        let r = step / step_prev;
        if !(1.8..=2.2).contains(&r) {
            return Err(format!(
                "centralized: last increments {step_prev:.0} ns, {step:.0} ns: not linear"
            )
            .into());
        }
        return Ok(format!(
            "linear in N: the last doubling added {step:.0} ns, the one before {step_prev:.0} ns (x{r:.2}); {:.1} ns per rank at the root",
            (ns(c.latency) - critical) / (c.n - 1) as f64
        ));
    }
    let per_node = |p: &Point| p.events as f64 / p.n as f64;
    let (e_step, e_prev) = (per_node(c) - per_node(b), per_node(b) - per_node(a));
    if off > 0.10 || (step - step_prev).abs() > 0.10 * step_prev {
        return Err(format!(
            "{alg:?}: {:.2?} at N = {} is {:.1} % over its critical path, increments {step_prev:.0} / {step:.0} ns: not log2 N",
            c.latency,
            c.n,
            off * 100.0
        )
        .into());
    }
    if (e_step - e_prev).abs() > 0.25 * e_prev.abs().max(1.0) {
        return Err(format!(
            "{alg:?}: events per node {:.1} → {:.1} → {:.1}: not O(N log N)",
            per_node(a),
            per_node(b),
            per_node(c)
        )
        .into());
    }
    Ok(format!(
        "log2 N: {step:.0} ns per doubling; at N = {}, {:.1} % over its critical path of {} one-way latencies and the ack; events per node +{e_step:.1} per doubling (O(N log N))",
        c.n,
        off * 100.0,
        rounds(alg, c.n) + 1
    ))
}
