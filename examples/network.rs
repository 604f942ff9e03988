//! A world of ranks exchanging endpoints over real TCP, then a scatter/gather round (bytes
//! checked) and timed barriers for each algorithm, over the simulator or a verbs device.
//!
//! ```text
//! cargo run --release --features sim --example network -- --nodes 4 [--barriers 2000]
//! cargo run --release --features verbs --example network -- --backend verbs \
//!     [--device NAME] --nodes 2 [--barriers 2000]
//! mpirun -n 4 -x ZVERBS_ROOT=127.0.0.1:29600 target/release/examples/network \
//!     --backend verbs --bootstrap env
//! srun -n 4 target/release/examples/network --backend verbs --bootstrap env
//! network --backend verbs --bootstrap config ranks.json [--rank R]
//! ```
//!
//! `--bootstrap` says how the ranks meet:
//!
//! - `threads` (the default): `--nodes` ranks as threads of this process, each with a
//!   listener bound on an ephemeral 127.0.0.1 port; the configuration naming them is written
//!   as JSON (the format a deployment reads from a file) and parsed back.
//! - `env`: this process is one rank; its launcher (`srun`, `mpirun`, `mpiexec`, torchrun,
//!   or `ZVERBS_RANK`/`ZVERBS_WORLD_SIZE`/`ZVERBS_ROOT`) gives its rank, the world and the
//!   rendezvous root ([`Bootstrap::from_env`](zverbs::bootstrap::Bootstrap::from_env)).
//! - `config FILE`: this process is rank `--rank` (else the launcher's rank) of the world
//!   the JSON configuration `FILE` lists; ranks meet all-to-all.
//!
//! `--backend sim|verbs` (default `sim`) needs the matching cargo feature; the simulator
//! lives in one process, so it runs `threads` only. On verbs every rank opens the same
//! device (`--device`, else `ZVERBS_DEVICE`, else the first device); `ZVERBS_GID_INDEX`
//! overrides the GID choice.

mod backend;

use std::process::ExitCode;

// `Backend` names the arms of backends built in.
#[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_imports))]
use backend::{Backend, BackendArgs};

/// Capacity of a node. Nodes hold their channels inline (`CAP` × two channels), so rank
/// threads get a roomy stack below.
const CAP: usize = 16;

fn main() -> ExitCode {
    backend::main("network", run)
}

/// Ranks connected over TCP from a JSON network configuration: a scatter_write, a
/// barrier and a gather_read (bytes checked), then timed barriers, for each algorithm.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    backend: BackendArgs,
    /// How the ranks meet: as threads of this process, from a launcher's environment
    /// (mpirun, srun, ...; verbs only), or from a network configuration FILE (verbs only)
    #[arg(long, value_enum, default_value = "threads")]
    bootstrap: MeetArg,
    /// The network configuration of `--bootstrap config`
    #[arg(value_name = "FILE", required_if_eq("bootstrap", "config"))]
    file: Option<String>,
    /// This process's rank in a configuration [default: the launcher's]
    #[arg(long, value_name = "R")]
    rank: Option<usize>,
    /// Ranks, as threads
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=CAP as u64))]
    nodes: u64,
    /// Timed barriers per algorithm
    #[arg(long, value_name = "B", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    barriers: u64,
}

/// `--bootstrap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum MeetArg {
    Threads,
    Env,
    Config,
}

fn run() -> Result<(), String> {
    let args: Cli = backend::parse("network");
    // Unused in a build without a backend, which only says which feature to enable.
    #[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_variables))]
    let meet = match (args.bootstrap, &args.file) {
        (MeetArg::Threads, None) => Meet::Threads,
        (MeetArg::Env, None) => Meet::Env,
        (MeetArg::Config, Some(file)) => Meet::Config(file.clone()),
        (_, Some(file)) => return Err(format!("unexpected argument {file:?}")),
        (MeetArg::Config, None) => return Err("--bootstrap config needs a FILE".into()),
    };
    #[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_variables))]
    let (n, barriers) = (args.nodes as usize, args.barriers as usize);
    match args.backend.backend {
        #[cfg(feature = "sim")]
        Backend::Sim => {
            use zverbs::provider::sim::{FabricConfig, Sim};
            if meet != Meet::Threads {
                return Err("the simulator lives in one process: --bootstrap threads".into());
            }
            // Real timers and the 1 µs / 100 Gb/s link: ranks connect at slightly different
            // moments, and RC retransmission covers a peer that is not ready yet, as on
            // hardware.
            let sim = Sim::with_config(FabricConfig::default(), n);
            world::threads(&sim, |r| format!("sim{r}"), None, n, barriers)
        }
        #[cfg(feature = "verbs")]
        Backend::Verbs => {
            use zverbs::provider::verbs::Verbs;
            let device = backend::verbs::device(args.backend.device.as_deref())?;
            let ctx = zverbs::Context::open(&Verbs, &device).map_err(|e| e.to_string())?;
            let qp = backend::verbs::qp_config(&ctx)?;
            println!("network: verbs device {device}, GID index {}", qp.gid_index);
            match meet {
                Meet::Threads => world::threads(&Verbs, |_| device.clone(), Some(qp), n, barriers),
                _ => world::process(&ctx, bootstrap(&meet, args.rank)?, qp, barriers),
            }
        }
        #[allow(unreachable_patterns)]
        other => Err(other.not_compiled_in("network")),
    }
}

/// How the ranks meet (`--bootstrap`).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Meet {
    Threads,
    Env,
    Config(String),
}

/// This process's place for `--bootstrap env` or `config FILE`, with `--rank` (`rank`)
/// overriding the launcher's for a configuration.
#[cfg(feature = "verbs")]
fn bootstrap(meet: &Meet, rank: Option<usize>) -> Result<zverbs::bootstrap::Bootstrap, String> {
    use zverbs::bootstrap::{launch, Bootstrap, NetworkConfig};
    let rank = || match rank {
        Some(r) => u32::try_from(r).map_err(|_| format!("--rank {r} is past 32 bits")),
        None => launch::from_process()
            .map(|p| p.rank)
            .map_err(|e| format!("no --rank and {e}")),
    };
    match meet {
        Meet::Env => Bootstrap::from_env().map_err(|e| e.to_string()),
        Meet::Config(file) => {
            let config = NetworkConfig::from_file(file).map_err(|e| format!("{file}: {e}"))?;
            Bootstrap::from_config(config, rank()?).map_err(|e| e.to_string())
        }
        Meet::Threads => Err("threads need no bootstrap".into()),
    }
}

/// The ranks, generic over the backend.
#[cfg(any(feature = "sim", feature = "verbs"))]
mod world {
    use std::net::TcpListener;
    use std::sync::Barrier;
    use std::time::{Duration, Instant};

    use zverbs::bootstrap::{exchange, Bootstrap, Meeting, NetworkConfig};
    use zverbs::node::barrier::Algorithm;
    use zverbs::node::{Connected, Node, NodeConfig, PreparedNode};
    use zverbs::provider::Provider;
    use zverbs::qp::QpConfig;
    use zverbs::{AccessFlags, ChannelConfig, Context, MemoryRegion, RemoteRegion};

    use super::CAP;

    const CHUNK: usize = 4096;
    const TIMEOUT: Duration = Duration::from_secs(20);

    /// What a rank gives back: per algorithm its barrier latencies, and its nodes (dropped
    /// only once every rank is done).
    type RankResult<P> = (Vec<(Algorithm, Vec<Duration>)>, Vec<Node<P, CAP, 16, 1>>);

    type Prepared<P> = PreparedNode<P, CAP, 16, 1>;

    /// Runs `n` ranks as threads on `provider`, rank `r` on device `device(r)`, with queue
    /// pair settings `qp` (default if `None`), and prints rank 0's barrier latencies.
    pub fn threads<P: Provider + Send + Sync>(
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
        println!("network: {n} ranks as threads, config {json}");

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
                            let connect = |prepared: Prepared<P>, app: &[u8]| {
                                prepared.connect_tcp_with_listener(config, &listener, app, TIMEOUT)
                            };
                            let world = (rank, n);
                            rank_main(&ctx, channel, world, connect, barriers, Some(start))
                        })
                        .map_err(|e| format!("spawn: {e}"))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h?.join().unwrap_or_else(|_| Err("a rank panicked".into())))
                .collect::<Result<_, String>>()
        })?;
        let rank0 = results.into_iter().next().map(|r| r.0).unwrap_or_default();
        report(rank0, n, barriers);
        Ok(())
    }

    /// Runs this process as rank `bootstrap.rank` on `ctx`, meeting the others where
    /// `bootstrap` says; rank 0 prints its barrier latencies. (Verbs only: simulated devices
    /// live in one process.)
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub fn process<P: Provider>(
        ctx: &Context<P>,
        bootstrap: Bootstrap,
        qp: QpConfig,
        barriers: usize,
    ) -> Result<(), String> {
        let (rank, n) = (bootstrap.rank as usize, bootstrap.world as usize);
        if n > CAP {
            return Err(format!("a world of {n} ranks: this example holds {CAP}"));
        }
        println!(
            "network: rank {rank} of {n}, meeting at {:?}",
            bootstrap.meeting
        );
        let channel = ChannelConfig {
            qp,
            ..ChannelConfig::default()
        };
        let connect = |prepared: Prepared<P>, app: &[u8]| {
            prepared.connect_bootstrap(&bootstrap, app, TIMEOUT)
        };
        let (lat, nodes) = rank_main(ctx, &channel, (rank, n), connect, barriers, None)?;
        // Every rank past its last barrier before any node is dropped (a node's queue pairs
        // may still carry its last barrier message out): one more round out of band.
        let rank32 = bootstrap.rank;
        let done = match &bootstrap.meeting {
            Meeting::Rendezvous(rv) => rv.all_gather(rank32, &[], TIMEOUT).map(drop),
            Meeting::Config(config) => exchange(config, rank32, &[], TIMEOUT).map(drop),
        };
        done.map_err(|e| format!("rank {rank}: the closing round: {e}"))?;
        drop(nodes);
        if rank == 0 {
            report(lat, n, barriers);
        } else {
            println!("rank {rank}: every algorithm checked");
        }
        Ok(())
    }

    /// Prints rank 0's barrier latencies.
    fn report(rank0: Vec<(Algorithm, Vec<Duration>)>, n: usize, barriers: usize) {
        println!("\nper-barrier latency over {barriers} barriers, {n} ranks (rank 0's view):");
        println!(
            "{:<14} {:>10} {:>10} {:>10}",
            "algorithm", "median", "p99", "max"
        );
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
    }

    /// One rank of `(rank, n)`: for each algorithm, a node connected by `connect` (which
    /// gets the prepared node and the app bytes to hand every rank); a scatter/gather
    /// round; timed barriers, started together (`start`, for threads; else after a barrier).
    fn rank_main<P: Provider>(
        ctx: &Context<P>,
        channel: &ChannelConfig,
        (rank, n): (usize, usize),
        connect: impl Fn(Prepared<P>, &[u8]) -> Connected<P, CAP, 16, 1>,
        barriers: usize,
        start: Option<&Barrier>,
    ) -> Result<RankResult<P>, String> {
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
                ..NodeConfig::default()
            };
            let prepared = Node::<P, CAP, 16, 1>::prepare(ctx, &pd, rank, n, &cfg)
                .map_err(|e| e.to_string())?;
            // One TCP exchange: endpoints, plus everyone's inbox region (addr, len, rkey).
            let mine = inbox_mr.remote();
            let mut app = Vec::new();
            app.extend_from_slice(&mine.addr.to_le_bytes());
            app.extend_from_slice(&mine.len.to_le_bytes());
            app.extend_from_slice(&mine.rkey.to_le_bytes());
            let (mut node, apps) =
                connect(prepared, &app).map_err(|e| format!("rank {rank}: {e}"))?;
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

            match start {
                Some(threads) => drop(threads.wait()),
                None => node.barrier_all().map_err(|e| e.to_string())?,
            }
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
