//! N nodes as threads, each with its own rank, exchanging endpoints over real TCP on
//! 127.0.0.1 from a JSON network configuration; then a scatter/gather round and timed
//! barriers for each algorithm, over the simulator.
//!
//! ```text
//! cargo run --release --features sim --example network -- --nodes 4 [--barriers 2000]
//! ```
//!
//! Each rank binds a listener on an ephemeral port first; the configuration is then
//! written as JSON (the format a real deployment reads from a file) and parsed back.

use std::net::TcpListener;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use zverbs::node::barrier::Algorithm;
use zverbs::node::exchange::NetworkConfig;
use zverbs::node::{Node, NodeConfig};
use zverbs::provider::sim::{FabricConfig, Sim};
use zverbs::{AccessFlags, Context, MemoryRegion, RemoteRegion};

/// Capacity of a node. Nodes hold their channels inline (`CAP` × two channels), so rank
/// threads get a roomy stack below.
const CAP: usize = 16;
const CHUNK: usize = 4096;
const TIMEOUT: Duration = Duration::from_secs(20);

fn arg(name: &str, default: usize) -> Result<usize, String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or(format!("{name} needs a number")),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = arg("--nodes", 4)?;
    let barriers = arg("--barriers", 2000)?;
    if !(1..=CAP).contains(&n) {
        return Err(format!("--nodes must be in 1..={CAP}").into());
    }
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    let entries: Vec<String> = listeners
        .iter()
        .enumerate()
        .map(|(r, l)| {
            let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
            format!(r#"{{"rank": {r}, "address": "127.0.0.1", "port": {port}}}"#)
        })
        .collect();
    let json = format!(r#"{{"nodes": [{}]}}"#, entries.join(", "));
    let config = NetworkConfig::from_json(&json)?;
    println!("network: {n} ranks, config {json}");

    // Real timers and the 1 µs / 100 Gb/s link: ranks connect at slightly different
    // moments, and RC retransmission covers a peer that is not ready yet, as on hardware.
    let sim = Sim::with_config(FabricConfig::default(), n);
    let start = Barrier::new(n);
    let results: Vec<Vec<(Algorithm, Vec<Duration>)>> = std::thread::scope(|t| {
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                let (sim, config, start) = (&sim, &config, &start);
                std::thread::Builder::new()
                    .stack_size(64 << 20)
                    .spawn_scoped(t, move || {
                        rank_main(sim, config, &listener, rank, barriers, start)
                    })
                    .expect("spawn")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect::<Result<_, String>>()
    })?;

    println!("\nper-barrier latency over {barriers} barriers, {n} ranks (rank 0's view):");
    println!(
        "{:<14} {:>10} {:>10} {:>10}",
        "algorithm", "median", "p99", "max"
    );
    for (alg, mut lat) in results.into_iter().next().unwrap_or_default() {
        lat.sort();
        let pick = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
        println!(
            "{:<14} {:>10.2?} {:>10.2?} {:>10.2?}",
            format!("{alg:?}"),
            pick(0.5),
            pick(0.99),
            pick(1.0)
        );
    }
    Ok(())
}

/// One rank: for each algorithm, a node connected over TCP; a scatter/gather round; timed
/// barriers.
fn rank_main(
    sim: &Sim,
    config: &NetworkConfig,
    listener: &TcpListener,
    rank: usize,
    barriers: usize,
    start: &Barrier,
) -> Result<Vec<(Algorithm, Vec<Duration>)>, String> {
    let n = config.len();
    let ctx = Context::open(sim, &format!("sim{rank}")).map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let mut inbox = vec![0u8; n * CHUNK];
    let mut outbox: Vec<u8> = (0..n * CHUNK)
        .map(|i| (i / CHUNK * 16 + rank) as u8)
        .collect();
    let mut gathered = vec![0u8; n * CHUNK];
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // SAFETY: `inbox` is read only after the barriers that end every remote access.
    let inbox_mr: MemoryRegion<Sim> =
        unsafe { pd.register_with_access(&mut inbox, access) }.map_err(|e| e.to_string())?;
    let outbox_mr = pd.register(&mut outbox).map_err(|e| e.to_string())?;
    let mut gathered_mr = pd.register(&mut gathered).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for alg in [
        Algorithm::Centralized,
        Algorithm::Dissemination,
        Algorithm::BinaryTree,
    ] {
        let cfg = NodeConfig {
            algorithm: alg,
            barrier_timeout: Some(TIMEOUT),
            ..NodeConfig::default()
        };
        let prepared = Node::<Sim, CAP, 16, 1>::prepare(&ctx, &pd, rank, n, &cfg)
            .map_err(|e| e.to_string())?;
        // One TCP exchange: endpoints, plus everyone's inbox region (addr, len, rkey).
        let mine = inbox_mr.remote();
        let mut app = Vec::new();
        app.extend_from_slice(&mine.addr.to_le_bytes());
        app.extend_from_slice(&mine.len.to_le_bytes());
        app.extend_from_slice(&mine.rkey.to_le_bytes());
        let (mut node, apps) = prepared
            .connect_tcp_with_listener(config, listener, &app, TIMEOUT)
            .map_err(|e| format!("rank {rank}: {e}"))?;
        let regions: Vec<RemoteRegion> = apps
            .iter()
            .map(|t| decode_region(t))
            .collect::<Option<_>>()
            .ok_or("bad region payload")?;

        // Scatter: chunk p of my outbox into slot `rank` of p's inbox. Barrier. Gather: read
        // slot p' = (p + 1) % n of each peer p's inbox back. Check.
        let peers: Vec<usize> = (0..n).filter(|&p| p != rank).collect();
        let slots: Vec<RemoteRegion> = peers
            .iter()
            .map(|&p| regions[p].slice((rank * CHUNK) as u64..((rank + 1) * CHUNK) as u64))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let writes = peers.iter().zip(&slots).map(|(&p, r)| {
            (
                p,
                outbox_mr
                    .slice(p * CHUNK..(p + 1) * CHUNK)
                    .expect("in range"),
                r,
            )
        });
        node.channels()
            .scatter_write(writes)
            .map_err(|e| e.to_string())?;
        node.barrier_all().map_err(|e| e.to_string())?;
        let sources: Vec<RemoteRegion> = peers
            .iter()
            .map(|&p| {
                let w = (p + 1) % n;
                regions[p].slice((w * CHUNK) as u64..((w + 1) * CHUNK) as u64)
            })
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        {
            let mut rest = gathered_mr.slice_mut(..).map_err(|e| e.to_string())?;
            let mut locals = Vec::new();
            for k in 0..n {
                let (head, tail) = rest.split_at(CHUNK).map_err(|e| e.to_string())?;
                if k != rank {
                    locals.push((k, head));
                }
                rest = tail;
            }
            let reads = locals
                .into_iter()
                .zip(&sources)
                .map(|((p, s), r)| (p, s, r));
            node.channels()
                .gather_read(reads)
                .map_err(|e| e.to_string())?;
        }
        for &p in &peers {
            let w = (p + 1) % n;
            let got = &gathered_mr.as_slice()[p * CHUNK..(p + 1) * CHUNK];
            let want = if w == p { 0 } else { (p * 16 + w) as u8 };
            if got.iter().any(|&b| b != want) {
                return Err(format!(
                    "rank {rank}: gathered slot {w} of rank {p} is wrong"
                ));
            }
        }
        node.barrier_all().map_err(|e| e.to_string())?;
        if rank == 0 {
            println!("{alg:?}: endpoints exchanged over TCP, scatter_write + barrier + gather_read checked");
        }

        start.wait();
        let mut lat = Vec::with_capacity(barriers);
        for _ in 0..barriers {
            let t0 = Instant::now();
            node.barrier_all()
                .map_err(|e| format!("rank {rank}: {e}"))?;
            lat.push(t0.elapsed());
        }
        out.push((alg, lat));
    }
    Ok(out)
}

fn decode_region(b: &[u8]) -> Option<RemoteRegion> {
    let addr = u64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
    let len = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
    let rkey = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?);
    Some(RemoteRegion { addr, len, rkey })
}
