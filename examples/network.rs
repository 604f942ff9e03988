//! N nodes as threads, each with its own rank, exchanging endpoints over real TCP on
//! 127.0.0.1 from a JSON network configuration; then a scatter/gather round and timed
//! barriers for each algorithm, over the simulator or a verbs device.
//!
//! ```text
//! cargo run --release --features sim --example network -- --nodes 4 [--barriers 2000]
//! cargo run --release --features verbs --example network -- --backend verbs \
//!     [--device NAME] --nodes 2 [--barriers 2000]
//! ```
//!
//! `--backend sim|verbs` (default `sim`) needs the matching cargo feature. On verbs every
//! rank opens the same device (`--device`, else `ZVERBS_DEVICE`, else the first device), so
//! ranks talk in loopback; `ZVERBS_GID_INDEX` overrides the GID choice.
//!
//! Each rank binds a listener on an ephemeral port first; the configuration is then
//! written as JSON (the format a real deployment reads from a file) and parsed back.

mod backend;

use std::process::ExitCode;

use backend::{Args, Backend};

/// Capacity of a node. Nodes hold their channels inline (`CAP` × two channels), so rank
/// threads get a roomy stack below.
const CAP: usize = 16;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("network: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args = Args::parse(&["--nodes", "--barriers"])?;
    if let Some(extra) = args.positional().first() {
        return Err(format!(
            "unexpected argument {extra:?}; usage: network [--backend sim|verbs] \
             [--device NAME] [--nodes N] [--barriers B]"
        ));
    }
    let n = args.number("--nodes", 4)?;
    let barriers = args.number("--barriers", 2000)?;
    if !(1..=CAP).contains(&n) {
        return Err(format!("--nodes must be in 1..={CAP}"));
    }
    if barriers == 0 {
        return Err("--barriers must be at least 1".into());
    }
    let backend: Backend = args.backend()?;
    match backend {
        #[cfg(feature = "sim")]
        Backend::Sim => {
            use zverbs::provider::sim::{FabricConfig, Sim};
            // Real timers and the 1 µs / 100 Gb/s link: ranks connect at slightly different
            // moments, and RC retransmission covers a peer that is not ready yet, as on
            // hardware.
            let sim = Sim::with_config(FabricConfig::default(), n);
            world::run(&sim, |r| format!("sim{r}"), None, n, barriers)
        }
        #[cfg(feature = "verbs")]
        Backend::Verbs => {
            use zverbs::provider::verbs::Verbs;
            let device = backend::verbs::device(args.value("--device"))?;
            let ctx = zverbs::Context::open(&Verbs, &device).map_err(|e| e.to_string())?;
            let qp = backend::verbs::qp_config(&ctx)?;
            println!(
                "network: verbs device {device}, GID index {}, every rank on it (loopback)",
                qp.gid_index
            );
            world::run(&Verbs, |_| device.clone(), Some(qp), n, barriers)
        }
        #[allow(unreachable_patterns)]
        other => Err(other.not_compiled_in("network")),
    }
}

/// The ranks, generic over the backend.
#[cfg(any(feature = "sim", feature = "verbs"))]
mod world {
    use std::net::TcpListener;
    use std::sync::Barrier;
    use std::time::{Duration, Instant};

    use zverbs::bootstrap::NetworkConfig;
    use zverbs::node::barrier::Algorithm;
    use zverbs::node::{Node, NodeConfig};
    use zverbs::provider::Provider;
    use zverbs::qp::QpConfig;
    use zverbs::{AccessFlags, ChannelConfig, Context, MemoryRegion, RemoteRegion};

    use super::CAP;

    const CHUNK: usize = 4096;
    const TIMEOUT: Duration = Duration::from_secs(20);

    /// What a rank gives back: per algorithm its barrier latencies, and its nodes (dropped
    /// only once every rank is done).
    type RankResult<P> = (Vec<(Algorithm, Vec<Duration>)>, Vec<Node<P, CAP, 16, 1>>);

    /// Runs `n` ranks on `provider`, rank `r` on device `device(r)`, with queue pair settings
    /// `qp` (default if `None`), and prints rank 0's barrier latencies.
    pub fn run<P: Provider + Send + Sync>(
        provider: &P,
        device: impl Fn(usize) -> String,
        qp: Option<QpConfig>,
        n: usize,
        barriers: usize,
    ) -> Result<(), String> {
        let listeners: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("bind: {e}"))?;
        let entries: Vec<String> = listeners
            .iter()
            .enumerate()
            .map(|(r, l)| {
                let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
                format!(r#"{{"rank": {r}, "address": "127.0.0.1", "port": {port}}}"#)
            })
            .collect();
        let json = format!(r#"{{"nodes": [{}]}}"#, entries.join(", "));
        let config = NetworkConfig::from_json(&json).map_err(|e| e.to_string())?;
        println!("network: {n} ranks, config {json}");

        let channel = ChannelConfig {
            qp: qp.unwrap_or_default(),
            ..ChannelConfig::default()
        };
        let start = Barrier::new(n);
        let results: Vec<RankResult<P>> = std::thread::scope(|t| {
            let handles: Vec<_> = listeners
                .into_iter()
                .enumerate()
                .map(|(rank, listener)| {
                    let (config, start, channel) = (&config, &start, &channel);
                    let device = device(rank);
                    std::thread::Builder::new()
                        .stack_size(64 << 20)
                        .spawn_scoped(t, move || {
                            let ctx = Context::open(provider, &device)
                                .map_err(|e| format!("rank {rank}: {e}"))?;
                            rank_main(&ctx, channel, config, &listener, rank, barriers, start)
                        })
                        .map_err(|e| format!("spawn: {e}"))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h?.join().unwrap_or_else(|_| Err("a rank panicked".into())))
                .collect::<Result<_, String>>()
        })?;

        println!("\nper-barrier latency over {barriers} barriers, {n} ranks (rank 0's view):");
        println!(
            "{:<14} {:>10} {:>10} {:>10}",
            "algorithm", "median", "p99", "max"
        );
        let rank0 = results.into_iter().next().map(|r| r.0).unwrap_or_default();
        for (alg, mut lat) in rank0 {
            lat.sort();
            let pick = |q: f64| {
                let i = (lat.len().saturating_sub(1) as f64 * q) as usize;
                lat.get(i).copied().unwrap_or_default()
            };
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
    fn rank_main<P: Provider>(
        ctx: &Context<P>,
        channel: &ChannelConfig,
        config: &NetworkConfig,
        listener: &TcpListener,
        rank: usize,
        barriers: usize,
        start: &Barrier,
    ) -> Result<RankResult<P>, String> {
        let n = config.len();
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let mut inbox = vec![0u8; n * CHUNK];
        let mut outbox: Vec<u8> = (0..n * CHUNK)
            .map(|i| (i / CHUNK * 16 + rank) as u8)
            .collect();
        let mut gathered = vec![0u8; n * CHUNK];
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        // SAFETY: `inbox` is read only after the barriers that end every remote access.
        let inbox_mr: MemoryRegion<P> =
            unsafe { pd.register_with_access(&mut inbox, access) }.map_err(|e| e.to_string())?;
        let outbox_mr = pd.register(&mut outbox).map_err(|e| e.to_string())?;
        let mut gathered_mr = pd.register(&mut gathered).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let mut nodes = Vec::new();
        for alg in [
            Algorithm::Centralized,
            Algorithm::Dissemination,
            Algorithm::BinaryTree,
        ] {
            let cfg = NodeConfig {
                algorithm: alg,
                barrier_timeout: Some(TIMEOUT),
                channel: *channel,
            };
            let prepared = Node::<P, CAP, 16, 1>::prepare(ctx, &pd, rank, n, &cfg)
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
            // Kept until every rank is done: dropping a node destroys its queue pairs, maybe
            // before its last barrier message went out.
            nodes.push(node);
        }
        Ok((out, nodes))
    }

    fn decode_region(b: &[u8]) -> Option<RemoteRegion> {
        let addr = u64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
        let len = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
        let rkey = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?);
        Some(RemoteRegion { addr, len, rkey })
    }
}
