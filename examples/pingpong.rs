//! Ping-pong over two connected channels, one thread per side, on the simulator or on a
//! verbs device.
//!
//! ```text
//! cargo run --release --features sim --example pingpong [-- ROUND_TRIPS]
//! cargo run --release --features verbs --example pingpong -- --backend verbs \
//!     [--device NAME] [ROUND_TRIPS]
//! ```
//!
//! `--backend sim|verbs` (default `sim`) needs the matching cargo feature. On verbs both
//! channels live on one device (`--device`, else `ZVERBS_DEVICE`, else the first device),
//! connected in loopback; `ZVERBS_GID_INDEX` overrides the GID choice.
//!
//! Prints the median and p99 round-trip time, and on its last line
//! `allocations_after_setup=<n>`: heap allocations counted by a global allocator wrapper
//! over the round-trip loops of both threads.

mod backend;

use std::process::ExitCode;

// `Backend` names the arms of backends built in.
#[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_imports))]
use backend::{Backend, BackendArgs};

/// Ping-pong over two connected channels, one thread per side; prints the median and p99
/// round trip and the allocations counted over the loops.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    backend: BackendArgs,
    /// Round trips
    #[arg(value_name = "ROUND_TRIPS", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
}

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

fn main() -> ExitCode {
    backend::main("pingpong", run)
}

fn run() -> Result<(), String> {
    let args: Cli = backend::parse("pingpong");
    let rounds = usize::try_from(args.rounds).map_err(|e| e.to_string())?;
    match args.backend.backend {
        #[cfg(feature = "sim")]
        Backend::Sim => {
            use zverbs::provider::sim::Sim;
            use zverbs::{ChannelConfig, Context};
            let sim = Sim::with_devices(2);
            let open = |name| Context::open(&sim, name).map_err(|e| e.to_string());
            let (ca, cb) = (open("sim0")?, open("sim1")?);
            let rtts = measured::pingpong(&ca, &cb, &ChannelConfig::default(), rounds)?;
            let what = "over the simulator";
            measured::report(rounds, what, rtts);
            Ok(())
        }
        #[cfg(feature = "verbs")]
        Backend::Verbs => {
            use zverbs::provider::verbs::Verbs;
            use zverbs::{ChannelConfig, Context};
            let device = backend::verbs::device(args.backend.device.as_deref())?;
            let open = || Context::open(&Verbs, &device).map_err(|e| e.to_string());
            let (ca, cb) = (open()?, open()?);
            let cfg = ChannelConfig {
                qp: backend::verbs::qp_config(&ca)?,
                ..ChannelConfig::default()
            };
            let rtts = measured::pingpong(&ca, &cb, &cfg, rounds)?;
            let what = format!("over verbs device {device} (loopback)");
            measured::report(rounds, &what, rtts);
            Ok(())
        }
        #[allow(unreachable_patterns)]
        other => {
            let _ = rounds;
            Err(other.not_compiled_in("pingpong"))
        }
    }
}

/// The measured part, generic over the backend.
#[cfg(any(feature = "sim", feature = "verbs"))]
mod measured {
    use std::sync::atomic::Ordering;
    use std::sync::Barrier;
    use std::time::{Duration, Instant};

    use zverbs::provider::Provider;
    use zverbs::{Channel, ChannelConfig, Context};

    use std::sync::atomic::AtomicU64;

    /// Every thread's allocations in the measured part, for the report.
    static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

    /// Bytes per message.
    const MSG: usize = 64;

    /// `rounds` round trips of `MSG` bytes between a channel on `ca` and one on `cb`; the
    /// round-trip times, sorted. Allocations are counted over both threads' loops.
    pub fn pingpong<P: Provider>(
        ca: &Context<P>,
        cb: &Context<P>,
        cfg: &ChannelConfig,
        rounds: usize,
    ) -> Result<Vec<Duration>, String> {
        let s = |e: zverbs::Error<P::Error>| e.to_string();
        let (pa, pb) = (ca.alloc_pd().map_err(s)?, cb.alloc_pd().map_err(s)?);
        let a = Channel::<P>::prepare(ca, &pa, cfg).map_err(s)?;
        let b = Channel::<P>::prepare(cb, &pb, cfg).map_err(s)?;
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (mut a, mut b) = (a.connect(&eb).map_err(s)?, b.connect(&ea).map_err(s)?);

        let (mut a_buf, mut b_buf) = ([0u8; 2 * MSG], [0u8; 2 * MSG]);
        let mut a_mr = pa.register(&mut a_buf).map_err(s)?;
        let mut b_mr = pb.register(&mut b_buf).map_err(s)?;
        a_mr.as_mut_slice()[..MSG].fill(0xA5);

        let mut rtts: Vec<Duration> = Vec::with_capacity(rounds);
        let start_line = Barrier::new(2);

        std::thread::scope(|t| -> Result<(), String> {
            let echo = t.spawn(|| -> Result<(), String> {
                start_line.wait();
                let mut serve = || -> Result<(), zverbs::Error<P::Error>> {
                    for _ in 0..rounds {
                        // b: receive into the upper half, echo it back from there.
                        let (_, inbox) = b_mr.slice_mut(..)?.split_at(MSG)?;
                        let got = b.receive([inbox])?;
                        debug_assert_eq!(got.byte_len as usize, MSG);
                        b.send([b_mr.slice(MSG..2 * MSG)?])?;
                    }
                    Ok(())
                };
                serve().map_err(|e| format!("echo side: {e}"))
            });

            zverbs_testkit::process::reset();
            start_line.wait();
            let ping = (|| -> Result<(), zverbs::Error<P::Error>> {
                for _ in 0..rounds {
                    let t0 = Instant::now();
                    a.send([a_mr.slice(..MSG)?])?;
                    let (_, inbox) = a_mr.slice_mut(..)?.split_at(MSG)?;
                    a.receive([inbox])?;
                    rtts.push(t0.elapsed());
                }
                Ok(())
            })();
            let echoed = echo
                .join()
                .unwrap_or_else(|_| Err("echo thread panicked".into()));
            ALLOCATIONS.fetch_add(zverbs_testkit::process::stats().count, Ordering::SeqCst);
            ping.map_err(|e| format!("ping side: {e}"))?;
            echoed
        })?;

        if a_mr.as_slice()[MSG..] != [0xA5; MSG][..] {
            return Err("the echo came back altered".into());
        }
        rtts.sort_unstable();
        Ok(rtts)
    }

    /// Prints the summary; the last line is `allocations_after_setup=<n>`.
    pub fn report(rounds: usize, what: &str, rtts: Vec<Duration>) {
        let pct = |p: f64| {
            let i = ((rtts.len() as f64 * p) as usize).min(rtts.len().saturating_sub(1));
            rtts.get(i).copied().unwrap_or_default()
        };
        println!("pingpong: {rounds} round trips of {MSG} B {what}, two threads");
        println!("median_rtt_ns={}", pct(0.50).as_nanos());
        println!("p99_rtt_ns={}", pct(0.99).as_nanos());
        println!(
            "allocations_after_setup={}",
            ALLOCATIONS.load(Ordering::SeqCst)
        );
    }
}
