//! `zverbs-perf`: perftest-style latency and bandwidth tests over zverbs `Channel`s.
//!
//! ```text
//! cargo run --release --features sim --example zverbs_perf -- [OPTIONS]
//! cargo run --release --features verbs --example zverbs_perf -- --backend verbs [OPTIONS]
//! cargo run --release --features sim --example zverbs_perf -- --help
//! ```
//!
//! Options (clap; `--help` documents each): `--test send|write|read|all` (a comma list),
//! `--kind lat|bw|both`, `--size BYTES` / `--sizes A,B,..` / `--all`, `--iters N`,
//! `--tx-depth N`, `--post-list N`, `--histogram PATH.svg`, `--json`, `--backend sim|verbs`,
//! `--device NAME`, `--vs-perftest [--rounds N]`.
//!
//! The tests follow perftest's:
//!
//! - `send` latency: ping-pong of SENDs (receives posted ahead); one sample is half a
//!   round trip, as `ib_send_lat` reports.
//! - `write` latency: ping-pong of RDMA WRITEs, each side polling the last byte of its
//!   buffer for the peer's write (memory polling, as `ib_write_lat`); half a round trip.
//! - `read` latency: one RDMA READ posted and its completion polled; the full time, as
//!   `ib_read_lat`.
//! - bandwidth (`send`/`write`/`read`): `--iters` messages kept in flight `--tx-depth` at
//!   a time (unpolled posts; the oldest is waited for before the next post), as perftest's
//!   `ib_*_bw`. BW average = bytes / total time; BW peak = the best `--tx-depth`
//!   consecutive messages; MsgRate = messages / time. MB = 2^20 bytes, Mpps = 10^6
//!   messages per second (perftest's units). With `--post-list N` (perftest's
//!   `--post_list`; sends and writes), `N` requests built once into a `zverbs::Batch` go
//!   out as one chain with one doorbell, the last signaled, in one `Channel` scope, as
//!   many lists in flight as fill the window (at least one); the iterations round up to
//!   whole lists. On the untimed simulator a sender of lists of SENDs outruns the server,
//!   which reposts its 512 receives one at a time: its sends meet no receive and wait out
//!   RNR timers, and the rate falls far below one post per request (no wire paces the
//!   sender there).
//!
//! The ping-pongs and the bandwidth test post at the unpolled level
//! (`post_*_unpolled`) and wait by busy-polling `try_complete`, as perftest busy-polls its
//! completion queue; a send's or write's own completion is reaped after the peer's answer
//! arrived, as perftest does (the blocking `Channel::wait` spins, then yields the core on
//! every poll: right for shared cores, a system call per poll in a latency test). The
//! read latency test uses the blocking `Channel::read`.
//!
//! Latency columns: `#bytes #iterations t_min[usec] t_max[usec] t_typical[usec]
//! t_avg[usec] t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec]`; `t_typical` is
//! the median. The samples go into an HDR histogram (`hdrhistogram`, three significant
//! digits: each figure within 0.1 % of a sample), which `--histogram` draws with
//! `plotters`. Bandwidth columns: `#bytes #iterations BW peak[MB/sec] BW average[MB/sec]
//! MsgRate[Mpps]`. `--json` prints one object per row instead, with the same figures.
//!
//! # Backends
//!
//! Every test is generic over the [`Provider`]; a backend supplies two opened device
//! contexts and a channel configuration (trait [`backend::Backend`]). `sim` is the untimed
//! in-process simulator: both ends run in this process, one thread each, so the figures
//! are software cost, not a wire. `verbs` (feature `verbs`) runs both ends on one device
//! in loopback, as perftest's server and client on one host; the GID index comes from
//! `ZVERBS_GID_INDEX`, else the RoCE v2 IPv4-mapped entry.
//!
//! # Against perftest
//!
//! `--backend verbs --vs-perftest` runs perftest's `ib_send_lat`, `ib_write_lat` and
//! `ib_write_bw` (server and client on 127.0.0.1, on the same device) and this tool's
//! equivalents, interleaved (each round alternates which goes first), and prints a ratio
//! table zverbs/perftest. `scripts/rxe-perf.sh` runs it on soft-RoCE in a qemu guest.

// A build with neither backend only says which feature to enable.
#![cfg_attr(
    not(any(feature = "sim", feature = "verbs")),
    allow(dead_code, unused_imports)
)]

mod backend;
mod cli;
mod report;
mod svg;
mod tests;
#[cfg(feature = "verbs")]
mod vs_perftest;

use std::error::Error as StdError;

use zverbs::provider::Provider;

use backend::Backend;
use cli::{Kind, Op, Opts};
use report::{LatStats, LINE};
use tests::Rig;

/// Errors of this tool.
pub type Res<T> = Result<T, Box<dyn StdError + Send + Sync>>;

/// Work requests in flight per direction, and so the largest `--tx-depth`.
pub const RING: usize = 128;
/// The largest message.
pub const MAX_SIZE: usize = 1 << 20;

fn main() {
    if let Err(e) = real_main() {
        eprintln!("zverbs_perf: {e}");
        std::process::exit(1);
    }
}

fn real_main() -> Res<()> {
    let opts = cli::parse_args();
    if opts.vs_perftest && opts.backend != cli::Backend::Verbs {
        return Err("--vs-perftest needs --backend verbs (perftest runs on a device)".into());
    }
    if opts.post_list > 1 && opts.kinds.contains(&Kind::Bw) && opts.ops.contains(&Op::Read) {
        return Err(tests::READS_IN_LISTS.into());
    }
    match opts.backend {
        #[cfg(feature = "sim")]
        cli::Backend::Sim => run_all(
            &backend::SimBackend(zverbs::provider::sim::Sim::with_devices(2)),
            &opts,
        ),
        #[cfg(feature = "verbs")]
        cli::Backend::Verbs => {
            let b = backend::VerbsBackend::new(opts.device.as_deref())?;
            if opts.vs_perftest {
                vs_perftest::run(&b, &opts)
            } else {
                run_all(&b, &opts)
            }
        }
        #[allow(unreachable_patterns)]
        b => {
            let b = b.name();
            Err(format!(
                "backend `{b}` is not built into this zverbs_perf: build it with \
                 `--features {b}` (cargo run --release --features {b} --example zverbs_perf \
                 -- --backend {b})"
            )
            .into())
        }
    }
}

/// Runs the chosen tests and prints their tables. The provider's errors must cross
/// threads (the server end runs on its own).
fn run_all<B: Backend>(backend: &B, opts: &Opts) -> Res<()>
where
    <B::P as Provider>::Error: Send + Sync + 'static,
{
    tests::with_rig(backend, |rig| {
        for &kind in &opts.kinds {
            for &op in &opts.ops {
                run_one(&backend.describe(), rig, opts, kind, op)?;
            }
        }
        Ok(())
    })
}

fn run_one<P: Provider<Error: Send + Sync + 'static>>(
    describe: &str,
    rig: &mut Rig<'_, P>,
    opts: &Opts,
    kind: Kind,
    op: Op,
) -> Res<()> {
    let sizes = opts.sizes.clone().unwrap_or(match kind {
        Kind::Lat => vec![2],
        Kind::Bw => vec![65536],
    });
    let iters = opts.iters.unwrap_or(match kind {
        Kind::Lat => 1000,
        Kind::Bw => 5000,
    });
    if !opts.json {
        report::header(describe, op, kind, opts.tx_depth, iters);
    }
    let backend = opts.backend.name();
    for &size in &sizes {
        match kind {
            Kind::Lat => {
                let hist = report::histogram(&lat(rig, op, size, iters)?);
                let stats = LatStats::new(&hist);
                if opts.json {
                    println!("{}", stats.json(op, size, iters, backend));
                } else {
                    stats.print_row(size, iters);
                }
                if let Some(path) = &opts.histogram {
                    let path = histogram_path(path, op, size, opts, &sizes);
                    let title = format!(
                        "zverbs-perf {} latency, {size} B, {iters} iterations, backend {backend}",
                        op.name(),
                    );
                    std::fs::write(&path, svg::histogram_svg(&hist, &stats, &title)?)?;
                    eprintln!("histogram: {path}");
                }
            }
            Kind::Bw => {
                let r = tests::bw(rig, op, size, iters, opts.tx_depth, opts.post_list)?;
                if opts.json {
                    println!("{}", r.json(op, iters, opts.tx_depth, backend));
                } else {
                    r.print_row(iters);
                }
            }
        }
    }
    if !opts.json {
        println!("{}", "-".repeat(LINE));
    }
    Ok(())
}

/// The latency samples (nanoseconds) of `op`.
fn lat<P: Provider<Error: Send + Sync + 'static>>(
    rig: &mut Rig<'_, P>,
    op: Op,
    size: usize,
    iters: usize,
) -> Res<Vec<u64>> {
    match op {
        Op::Send => tests::send_lat(rig, size, iters),
        Op::Write => tests::write_lat(rig, size, iters),
        Op::Read => tests::read_lat(rig, size, iters),
    }
}

/// The histogram's file: `PATH` for one test of one size, else `STEM-OP-SIZE.svg`.
fn histogram_path(path: &str, op: Op, size: usize, opts: &Opts, sizes: &[usize]) -> String {
    if opts.ops.len() == 1 && sizes.len() == 1 {
        return path.to_string();
    }
    let stem = path.strip_suffix(".svg").unwrap_or(path);
    format!("{stem}-{}-{size}.svg", op.name())
}
