//! Barrier algorithms at scale on the simulator's stepped mode: N = 2, 4, ..., 1024
//! simulated nodes on one thread, no OS thread per node.
//!
//! ```sh
//! cargo run --release --features sim --example barrier_scale [-- --max-nodes 1024 --seed 1]
//! ```
//!
//! Each node is one simulated device running the library's sans-IO [`BarrierMachine`];
//! its messages are zero-length RC SEND_WITH_IMM on [`Channel`]s, one per pair of nodes
//! that the algorithm makes talk (found by a dry run of the machines), so a 1024-node
//! dissemination barrier needs ~20 queue pairs per node, not 1023; a node's channels share
//! one send and one receive completion queue (`zverbs::dispatch`). The driver advances the
//! fabric to each next event time (`Fabric::next_event_at`), then polls every node: a
//! completion is seen at the simulated instant it happens and CPU time counts as zero, so
//! the figure is the network's share of a barrier.
//!
//! Printed per algorithm and N: the simulated barrier latency (all nodes start at 0; the
//! last one released), the `⌈log2 N⌉ × one-way latency` bound and the ratio to it, the
//! algorithm's own critical path (`rounds(alg, N)` one-way latencies: centralized 2,
//! dissemination ⌈log2 N⌉, tree 2⌊log2 N⌋; the centralized root also serialises N - 1
//! arrivals on its link), the messages sent, and the wall-clock time the simulation took
//! (setup excluded). After each algorithm's sweep a line checks its growth and fails the
//! run if it is off: dissemination and tree must add a constant per doubling of N (log2 N)
//! and end within 10 % of their critical path at the largest N (the tree's path is twice
//! the `⌈log2 N⌉` bound by construction: ARRIVE up, RELEASE down); centralized must grow
//! linearly.

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zverbs::dispatch::SharedCompletionQueue;
use zverbs::node::barrier::{rounds, Algorithm, BarrierMachine, Msg};
use zverbs::provider::sim::{FabricConfig, Sim};
use zverbs::{Channel, ChannelConfig, Context, Pending, SendFlags, SendOp};

/// Largest world; also the machines' capacity.
const MAX: usize = 1024;
/// Receives kept posted per channel (the most messages one peer sends in one barrier).
const RECVS: usize = 2;

type Result<T> = core::result::Result<T, Box<dyn StdError>>;
type Chan = Channel<Sim, 4, 1>;

/// One end of a pair: the channel to `peer`, its posted receives and unreaped sends.
struct Link {
    peer: u16,
    ch: Chan,
    recvs: VecDeque<Pending>,
    sends: VecDeque<Pending>,
}

struct SimNode {
    machine: BarrierMachine<MAX>,
    links: Vec<Link>, // sorted by peer
    released_at: Option<Duration>,
}

/// A message in 32 bits of immediate data: `[0, 0, kind, round]`; the epoch is implied
/// (one barrier per world).
fn to_imm(msg: &Msg) -> u32 {
    let b = msg.encode();
    u32::from_be_bytes([0, 0, b[0], b[1]])
}

fn from_imm(imm: u32, epoch: u32) -> Result<Msg> {
    let [_, _, kind, round] = imm.to_be_bytes();
    let e = epoch.to_be_bytes();
    Ok(Msg::decode(&[kind, round, 0, 0, e[0], e[1], e[2], e[3]])?)
}

/// The (unordered) pairs of ranks that exchange messages in one barrier of `alg` over
/// `0..n`, found by running the machines with instant delivery.
fn pairs(alg: Algorithm, n: usize) -> Result<Vec<(u16, u16)>> {
    let parts: Vec<u16> = (0..n as u16).collect();
    let mut ms = parts
        .iter()
        .map(|&r| BarrierMachine::<MAX>::new(alg, r, &parts))
        .collect::<core::result::Result<Vec<_>, _>>()?;
    let mut queue = VecDeque::new();
    let mut out = Vec::new();
    for (r, m) in ms.iter_mut().enumerate() {
        m.start(&mut |to, msg| queue.push_back((r as u16, to, msg)))?;
    }
    while let Some((from, to, msg)) = queue.pop_front() {
        out.push((from.min(to), from.max(to)));
        ms[usize::from(to)].on_message(from, msg, &mut |t, m| queue.push_back((to, t, m)))?;
    }
    if !ms.iter().all(|m| m.is_complete()) {
        return Err(format!("{alg:?} with {n}: dry run did not complete").into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Sends `msg` from `node` to `to`, reaping finished sends first.
fn send(node: &mut SimNode, to: u16, msg: Msg, sent: &mut u64) -> Result<()> {
    let i = node
        .links
        .binary_search_by_key(&to, |l| l.peer)
        .map_err(|_| format!("no link to {to}"))?;
    let l = &mut node.links[i];
    reap(l)?;
    // SAFETY: a zero-length send names no memory.
    let p = unsafe {
        l.ch.post_send_unpolled(&[], SendOp::SendWithImm(to_imm(&msg)), SendFlags::empty())
    }?;
    l.sends.push_back(p);
    *sent += 1;
    Ok(())
}

/// Redeems the sends of `l` that have completed (the ring has 4 slots).
fn reap(l: &mut Link) -> Result<()> {
    while let Some(p) = l.sends.pop_front() {
        if let Err(p) = l.ch.try_complete(p)? {
            l.sends.push_front(p);
            break;
        }
    }
    Ok(())
}

struct Run {
    latency: Duration,
    messages: u64,
    wall: Duration,
}

fn run(alg: Algorithm, n: usize, seed: u64) -> Result<Run> {
    let sim = Sim::with_config(
        FabricConfig {
            auto_step: false,
            ..FabricConfig::stepped(seed)
        },
        n,
    );
    let ctxs = (0..n)
        .map(|r| Context::open(&sim, &format!("sim{r}")))
        .collect::<core::result::Result<Vec<_>, _>>()?;
    let pds = ctxs
        .iter()
        .map(|c| c.alloc_pd())
        .collect::<core::result::Result<Vec<_>, _>>()?;
    let parts: Vec<u16> = (0..n as u16).collect();
    let mut nodes = parts
        .iter()
        .map(|&r| {
            Ok(SimNode {
                machine: BarrierMachine::new(alg, r, &parts)?,
                links: Vec::new(),
                released_at: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let cfg = ChannelConfig::default();
    let pairs = pairs(alg, n)?;
    // Every node's channels share one send and one receive completion queue.
    let mut links_of = vec![0usize; n];
    for &(a, b) in &pairs {
        links_of[usize::from(a)] += 1;
        links_of[usize::from(b)] += 1;
    }
    let cqs = ctxs
        .iter()
        .zip(&links_of)
        .map(|(ctx, &links)| {
            let links = links.max(1);
            Ok((
                Arc::new(SharedCompletionQueue::create(ctx, links, 4)?),
                Arc::new(SharedCompletionQueue::create(ctx, links, 4)?),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    for (a, b) in pairs {
        let (a, b) = (usize::from(a), usize::from(b));
        let pa = Chan::prepare_shared(&ctxs[a], &pds[a], &cfg, &cqs[a].0, &cqs[a].1)?;
        let pb = Chan::prepare_shared(&ctxs[b], &pds[b], &cfg, &cqs[b].0, &cqs[b].1)?;
        let (ea, eb) = (pa.endpoint(), pb.endpoint());
        for (me, peer, ch) in [(a, b, pa.connect(&eb)?), (b, a, pb.connect(&ea)?)] {
            let mut l = Link {
                peer: peer as u16,
                ch,
                recvs: VecDeque::new(),
                sends: VecDeque::new(),
            };
            for _ in 0..RECVS {
                // SAFETY: a zero-length receive names no memory.
                l.recvs
                    .push_back(unsafe { l.ch.post_receive_unpolled(&[]) }?);
            }
            nodes[me].links.push(l); // pairs are sorted: links stay sorted by peer
        }
    }
    sim.fabric().run_until_idle(); // nothing should be in flight before the start
    let t0 = sim.fabric().now();
    let wall = Instant::now();
    let mut messages = 0;
    let mut outbox = Vec::new();
    for node in nodes.iter_mut() {
        node.machine.start(&mut |to, msg| outbox.push((to, msg)))?;
        for (to, msg) in outbox.drain(..) {
            send(node, to, msg, &mut messages)?;
        }
    }
    let mut left = nodes.iter().filter(|n| !n.machine.is_complete()).count();
    while left > 0 {
        let f = sim.fabric();
        let Some(next) = f.next_event_at() else {
            return Err(format!("{alg:?} with {n}: stalled, {left} nodes not released").into());
        };
        f.run_for(next.saturating_sub(f.now()));
        let now = f.now();
        for node in nodes.iter_mut().filter(|n| n.released_at.is_none()) {
            let epoch = node.machine.epoch();
            for i in 0..node.links.len() {
                let l = &mut node.links[i];
                let Some(p) = l.recvs.pop_front() else {
                    continue;
                };
                let c = match l.ch.try_complete(p)? {
                    Ok(c) => c,
                    Err(p) => {
                        l.recvs.push_front(p);
                        continue;
                    }
                };
                // SAFETY: as above, no memory.
                l.recvs
                    .push_back(unsafe { l.ch.post_receive_unpolled(&[]) }?);
                let from = l.peer;
                let msg = from_imm(c.imm.ok_or("a barrier message without imm")?, epoch)?;
                node.machine
                    .on_message(from, msg, &mut |to, m| outbox.push((to, m)))?;
                for (to, msg) in outbox.drain(..) {
                    send(node, to, msg, &mut messages)?;
                }
            }
            if node.machine.is_complete() {
                node.released_at = Some(now - t0);
                left -= 1;
            }
        }
    }
    let wall = wall.elapsed();
    let latency = nodes
        .iter()
        .filter_map(|n| n.released_at)
        .max()
        .unwrap_or_default();
    Ok(Run {
        latency,
        messages,
        wall,
    })
}

fn ceil_log2(n: usize) -> u32 {
    usize::BITS - (n.max(1) - 1).leading_zeros()
}

fn arg(args: &[String], name: &str, default: u64) -> Result<u64> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => Ok(args
            .get(i + 1)
            .ok_or(format!("{name} needs a value"))?
            .parse()?),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let max = arg(&args, "--max-nodes", MAX as u64)? as usize;
    let seed = arg(&args, "--seed", 1)?;
    if !(2..=MAX).contains(&max) {
        return Err(format!("--max-nodes must be in 2..={MAX}").into());
    }
    let one_way = Duration::from_nanos(FabricConfig::default().link.latency_ns);
    println!("barrier_scale: stepped simulator, seed {seed}, one-way latency {one_way:?}");
    println!(
        "{:<14} {:>5} {:>12} {:>12} {:>7} {:>14} {:>9} {:>10}",
        "algorithm",
        "N",
        "sim latency",
        "log2N bound",
        "ratio",
        "critical path",
        "messages",
        "wall"
    );
    for alg in [
        Algorithm::Centralized,
        Algorithm::Dissemination,
        Algorithm::BinaryTree,
    ] {
        let mut n = 2;
        let mut sweep = Vec::new();
        while n <= max {
            let r = run(alg, n, seed).map_err(|e| format!("{alg:?}, N = {n}, seed {seed}: {e}"))?;
            sweep.push((n, r.latency));
            let bound = one_way * ceil_log2(n);
            let critical = one_way * rounds(alg, n);
            if r.latency < critical {
                return Err(format!(
                    "{alg:?}, N = {n}, seed {seed}: released after {:?}, before its critical path {critical:?}",
                    r.latency
                )
                .into());
            }
            println!(
                "{:<14} {:>5} {:>12} {:>12} {:>7.2} {:>14} {:>9} {:>10}",
                format!("{alg:?}"),
                n,
                format!("{:.2?}", r.latency),
                format!("{bound:.2?}"),
                r.latency.as_secs_f64() / bound.as_secs_f64(),
                format!("{critical:.2?}"),
                r.messages,
                format!("{:.1?}", r.wall),
            );
            n *= 2;
        }
        println!("  {}", growth(alg, &sweep, one_way)?);
    }
    Ok(())
}

/// Checks and describes how the latency grows over the sweep (N doubling each step):
/// dissemination and tree by a constant per doubling (log2 N) and within 10 % of their
/// critical path at the largest N; centralized linearly in N (the root's link serialises
/// the N - 1 arrivals and releases), so its increment per doubling doubles.
fn growth(alg: Algorithm, sweep: &[(usize, Duration)], one_way: Duration) -> Result<String> {
    let (&(n_max, l_max), Some(&(_, l_prev)), Some(&(_, l_prev2))) = (
        sweep.last().ok_or("empty sweep")?,
        sweep.iter().rev().nth(1),
        sweep.iter().rev().nth(2),
    ) else {
        return Ok("(sweep too short to judge growth)".into());
    };
    let ns = |d: Duration| d.as_secs_f64() * 1e9;
    let (step, step_prev) = (ns(l_max) - ns(l_prev), ns(l_prev) - ns(l_prev2));
    let critical = ns(one_way * rounds(alg, n_max));
    let off = ns(l_max) / critical - 1.0;
    let verdict = match alg {
        Algorithm::Centralized => {
            let r = step / step_prev;
            if !(1.8..=2.2).contains(&r) {
                return Err(format!(
                    "centralized: last increments {step_prev:.0} ns, {step:.0} ns: not linear"
                )
                .into());
            }
            format!(
                "linear in N: the last doubling added {step:.0} ns, the one before {step_prev:.0} ns (x{r:.2}); {:.1} ns per participant at the root",
                (ns(l_max) - critical) / (n_max - 1) as f64
            )
        }
        _ => {
            if off > 0.10 || (step - step_prev).abs() > 0.10 * step_prev {
                return Err(format!(
                    "{alg:?}: {:.2?} at N = {n_max} is {:.1} % over its critical path, increments {step_prev:.0} / {step:.0} ns: not log2 N",
                    l_max,
                    off * 100.0
                )
                .into());
            }
            format!(
                "log2 N: {step:.0} ns per doubling; at N = {n_max}, {:.1} % over its critical path of {} one-way latencies",
                off * 100.0,
                rounds(alg, n_max)
            )
        }
    };
    Ok(verdict)
}
