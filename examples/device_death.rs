//! How long after its device dies a blocking wait returns, on the simulator: a receive
//! that would wait ten seconds for a message, its device crashed 20 ms in by another
//! thread; the time from the crash to the receive's return (an error of kind
//! `DeviceFatal`), per wait policy, over `--trials` runs (default 20). Built with
//! `tokio`, the same for an async receive asleep on its reactor.
//!
//! ```text
//! cargo run --release --features sim,tokio --example device_death
//! ```

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use zverbs::testing::Pair;
use zverbs::{ChannelConfig, ErrorKind, WaitPolicy};

/// How long a blocking wait takes to return once its local device dies, per wait policy.
#[derive(clap::Parser)]
#[command(name = "device_death")]
struct Cli {
    /// Crashes per policy
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    trials: usize,
}

fn main() -> ExitCode {
    let trials = <Cli as clap::Parser>::parse().trials;
    println!("policy      median        max   (crash to return, {trials} trials, 10 s timeout)");
    for wait in [
        WaitPolicy::Spin,
        WaitPolicy::SpinYield,
        WaitPolicy::SpinSleep,
    ] {
        let mut after = Vec::with_capacity(trials);
        for _ in 0..trials {
            match trial(wait) {
                Ok(d) => after.push(d),
                Err(e) => {
                    eprintln!("device_death: {wait:?}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        report(&format!("{wait:?}"), after);
    }
    #[cfg(feature = "tokio")]
    {
        let mut after = Vec::with_capacity(trials);
        for _ in 0..trials {
            match async_trial() {
                Ok(d) => after.push(d),
                Err(e) => {
                    eprintln!("device_death: async: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        report("async", after);
    }
    ExitCode::SUCCESS
}

/// Prints the median and the largest of `after`.
fn report(what: &str, mut after: Vec<Duration>) {
    after.sort();
    let (median, max) = (after[after.len() / 2], after[after.len() - 1]);
    println!("{what:<10} {median:>8.1?} {max:>10.1?}");
}

/// The time from `crashed` to `returned`, if `r` is the device's fatal error.
fn verdict<T>(
    r: Result<T, zverbs::Error<zverbs::provider::sim::SimError>>,
    returned: Instant,
    crashed: Instant,
) -> Result<Duration, String> {
    match r {
        Err(e) if e.kind() == ErrorKind::DeviceFatal => Ok(returned.duration_since(crashed)),
        Err(e) => Err(format!("the receive failed otherwise: {e}")),
        Ok(_) => Err("the receive completed on a dead device".into()),
    }
}

/// Crashes `pair`'s device `sim1` 20 ms from now, from another thread; the instant.
fn crash_soon(pair: &Pair<16, 4>) -> thread::JoinHandle<Result<Instant, String>> {
    let fabric = pair.sim.fabric().clone();
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        let at = Instant::now();
        fabric
            .crash(1)
            .map(|()| at)
            .map_err(|e| format!("crash: {e:?}"))
    })
}

/// An async receive (asleep on its reactor, `SpinSleep`) on a device that dies under it.
#[cfg(feature = "tokio")]
fn async_trial() -> Result<Duration, String> {
    use zverbs::tokio::AsyncChannel;
    let cfg = ChannelConfig {
        timeout: Some(Duration::from_secs(10)),
        wait: WaitPolicy::SpinSleep,
        ..ChannelConfig::default()
    };
    let p = Pair::<16, 4>::connected_for_async(&cfg).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let pool = zverbs::MrPool::new(&p.b.pd, 1 << 12).map_err(|e| e.to_string())?;
    let killer = crash_soon(&p);
    let (r, returned) = rt
        .block_on(async {
            let ch = AsyncChannel::<_, _, 16, 4>::new(p.b.ch)?;
            let (r, _buf) = ch.receive(pool.alloc(8).expect("room")).await;
            Ok::<_, zverbs::Error<_>>((r, Instant::now()))
        })
        .map_err(|e| e.to_string())?;
    let crashed = killer
        .join()
        .map_err(|_| "the crashing thread panicked".to_owned())??;
    verdict(r, returned, crashed)
}

/// One receive on a device that dies under it: the time from the death to the return.
fn trial(wait: WaitPolicy) -> Result<Duration, String> {
    let cfg = ChannelConfig {
        timeout: Some(Duration::from_secs(10)),
        wait,
        ..ChannelConfig::default()
    };
    let mut p = Pair::<16, 4>::connected(&cfg).map_err(|e| e.to_string())?;
    let mut inbox = [0u8; 8];
    let mut inbox = p.b.pd.register(&mut inbox).map_err(|e| e.to_string())?;
    let killer = crash_soon(&p);
    let slice = inbox.slice_mut(..).map_err(|e| e.to_string())?;
    let r = p.b.ch.receive([slice]);
    let returned = Instant::now();
    let crashed = killer
        .join()
        .map_err(|_| "the crashing thread panicked".to_owned())??;
    verdict(r, returned, crashed)
}
