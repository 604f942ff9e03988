//! How long after its device dies a blocking wait returns, on the simulator: a receive
//! that would wait ten seconds for a message, its device crashed 20 ms in by another
//! thread; the time from the crash to the receive's return (an error of kind
//! `DeviceFatal`), per wait policy, over `--trials` runs (default 20).
//!
//! ```text
//! cargo run --release --features sim --example device_death
//! ```

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use zverbs::testing::Pair;
use zverbs::{ChannelConfig, ErrorKind, WaitPolicy};

fn main() -> ExitCode {
    let trials = std::env::args()
        .skip_while(|a| a != "--trials")
        .nth(1)
        .map_or(Ok(20), |n| n.parse::<usize>());
    let Ok(trials) = trials.map(|n| n.max(1)) else {
        eprintln!("usage: device_death [--trials N]");
        return ExitCode::from(2);
    };
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
        after.sort();
        let (median, max) = (after[after.len() / 2], after[after.len() - 1]);
        println!(
            "{:<10} {:>8.1?} {:>10.1?}",
            format!("{wait:?}"),
            median,
            max
        );
    }
    ExitCode::SUCCESS
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
    let fabric = p.sim.fabric().clone();
    let killer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        let at = Instant::now();
        fabric.crash(1).map(|()| at)
    });
    let slice = inbox.slice_mut(..).map_err(|e| e.to_string())?;
    let r = p.b.ch.receive([slice]);
    let returned = Instant::now();
    let crashed = killer
        .join()
        .map_err(|_| "the crashing thread panicked".to_owned())?
        .map_err(|e| format!("crash: {e:?}"))?;
    match r {
        Err(e) if e.kind() == ErrorKind::DeviceFatal => Ok(returned.duration_since(crashed)),
        Err(e) => Err(format!("the receive failed otherwise: {e}")),
        Ok(_) => Err("the receive completed on a dead device".into()),
    }
}
