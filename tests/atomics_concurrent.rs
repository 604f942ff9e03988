//! Remote atomics from two requesters on one word of a third device are atomic: on the
//! untimed fabric (whose send lanes run the two requesters' queue pairs beside each other),
//! the timed fabric and the stepped one.
//!
//! Two threads, each with its own device and `Channel` to the target, each make
//! `OPS` increments of the same 8-byte word: with `fetch_add(1)`, and with a
//! compare-and-swap loop (retry with the value the failed swap returned). Afterwards the
//! word holds `2 × OPS`, and the old values the successful operations returned are
//! exactly `0..2 × OPS`: one serial order of all of them. Each scenario runs `RUNS`
//! times per fabric, with the run's seed in every failure message
//! (`ZVERBS_ATOMIC_RUNS` changes the count).
#![cfg(feature = "sim")]

use std::time::Duration;

use zverbs::provider::sim::{FabricConfig, Sim};
use zverbs::{AccessFlags, Channel, ChannelConfig, Context, RemoteRegion};

/// Increments per thread.
const OPS: u64 = 10_000;

fn runs() -> u64 {
    std::env::var("ZVERBS_ATOMIC_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

#[derive(Clone, Copy, Debug)]
enum Scenario {
    FetchAdd,
    CasLoop,
}

/// An 8-byte-aligned word to register.
#[repr(align(8))]
struct Word([u8; 8]);

/// Runs `scenario` once on a three-device fabric made from `cfg`; `Err` says what broke.
fn run(cfg: FabricConfig, scenario: Scenario) -> Result<(), String> {
    let sim = Sim::with_config(cfg, 3);
    let config = ChannelConfig {
        timeout: Some(Duration::from_secs(10)),
        ..ChannelConfig::default()
    };
    let target_ctx = Context::open(&sim, "sim2").unwrap();
    let target_pd = target_ctx.alloc_pd().unwrap();
    let mut word = Word([0; 8]);
    // SAFETY: `word` is read only after both threads joined and the regions are dropped
    // below, when no work is in flight.
    let target = unsafe { target_pd.register_with_access(&mut word.0, AccessFlags::all()) }
        .map_err(|e| e.to_string())?;
    let remote = target.remote();
    let mut requesters = Vec::new();
    let mut responders = Vec::new();
    for dev in ["sim0", "sim1"] {
        let ctx = Context::open(&sim, dev).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let a = Channel::<Sim, 4, 1>::prepare(&ctx, &pd, &config).unwrap();
        let b = Channel::<Sim, 4, 1>::prepare(&target_ctx, &target_pd, &config).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
        requesters.push((ctx, pd, a));
        responders.push(b);
    }
    let seen: Vec<Result<Vec<u64>, String>> = std::thread::scope(|s| {
        let threads: Vec<_> = requesters
            .iter_mut()
            .map(|(_, pd, ch)| s.spawn(|| increments(pd, ch, &remote, scenario)))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    drop(responders);
    drop(requesters);
    drop(target);
    let mut olds = Vec::new();
    for s in seen {
        olds.extend(s?);
    }
    let last = u64::from_ne_bytes(word.0);
    if last != 2 * OPS {
        return Err(format!("final value {last}, not {}", 2 * OPS));
    }
    olds.sort_unstable();
    if let Some((i, &v)) = olds.iter().enumerate().find(|&(i, &v)| v != i as u64) {
        return Err(format!(
            "old values not one serial order: position {i} holds {v}"
        ));
    }
    Ok(())
}

/// One thread's `OPS` increments; the old value of each successful one.
fn increments(
    pd: &zverbs::ProtectionDomain<Sim>,
    ch: &mut Channel<Sim, 4, 1>,
    remote: &RemoteRegion,
    scenario: Scenario,
) -> Result<Vec<u64>, String> {
    let mut result = Word([0; 8]);
    let mut result = pd.register(&mut result.0).map_err(|e| e.to_string())?;
    let mut olds = Vec::with_capacity(OPS as usize);
    let mut expect = 0;
    while (olds.len() as u64) < OPS {
        let slot = result.slice_mut(..).map_err(|e| e.to_string())?;
        match scenario {
            Scenario::FetchAdd => {
                let old = ch.fetch_add(slot, remote, 1).map_err(|e| e.to_string())?;
                olds.push(old);
            }
            Scenario::CasLoop => {
                let old = ch
                    .compare_swap(slot, remote, expect, expect + 1)
                    .map_err(|e| e.to_string())?;
                if old == expect {
                    olds.push(old);
                    expect += 1;
                } else {
                    expect = old;
                }
            }
        }
    }
    Ok(olds)
}

fn check(name: &str, cfg: impl Fn(u64) -> FabricConfig) {
    for scenario in [Scenario::FetchAdd, Scenario::CasLoop] {
        for seed in 0..runs() {
            if let Err(why) = run(cfg(seed), scenario) {
                panic!("{name} fabric, {scenario:?}, seed {seed}: {why}");
            }
        }
    }
}

#[test]
fn untimed_fabric_with_lanes() {
    check("untimed", |seed| FabricConfig {
        seed,
        ..FabricConfig::instant()
    });
}

#[test]
fn timed_fabric() {
    check("timed", |seed| FabricConfig {
        seed,
        ..FabricConfig::default()
    });
}

#[test]
fn stepped_fabric() {
    check("stepped", FabricConfig::stepped);
}

/// A device whose `atomic_cap` is `NONE` refuses atomics before anything is posted, with a
/// typed error, at the blocking and the scoped level; other operations still work.
#[test]
fn a_device_without_atomics_refuses_them_before_posting() {
    use zverbs::{AtomicCap, Error, ErrorKind};
    let cfg = FabricConfig {
        atomic_cap: AtomicCap::None,
        ..FabricConfig::instant()
    };
    let sim = Sim::with_config(cfg, 2);
    let (ca, cb) = (
        Context::open(&sim, "sim0").unwrap(),
        Context::open(&sim, "sim1").unwrap(),
    );
    assert_eq!(ca.query_device().unwrap().atomic_cap, AtomicCap::None);
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let c = ChannelConfig::default();
    let a = Channel::<Sim, 4, 1>::prepare(&ca, &pa, &c).unwrap();
    let b = Channel::<Sim, 4, 1>::prepare(&cb, &pb, &c).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (mut a, _b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    assert_eq!(a.queue_pair().atomic_cap(), AtomicCap::None);
    let mut word = Word([0; 8]);
    // SAFETY: read only after the region is dropped, with nothing in flight.
    let target = unsafe { pb.register_with_access(&mut word.0, AccessFlags::all()) }.unwrap();
    let remote = target.remote();
    let mut result = Word([0; 8]);
    let mut result = pa.register(&mut result.0).unwrap();
    let unsupported =
        |e: Error<_>| matches!(e, Error::Unsupported(_)) && e.kind() == ErrorKind::Unsupported;
    let e = a
        .fetch_add(result.slice_mut(..).unwrap(), &remote, 1)
        .unwrap_err();
    assert!(unsupported(e));
    let e = a
        .compare_swap(result.slice_mut(..).unwrap(), &remote, 0, 1)
        .unwrap_err();
    assert!(unsupported(e));
    let slot = result.slice_mut(..).unwrap();
    let e = a
        .scope(|s| s.post_fetch_add(slot, &remote, 1).map(drop))
        .unwrap_err();
    assert!(unsupported(e));
    assert_eq!(a.in_flight(), (0, 0), "nothing was posted");
    result.as_mut_slice().fill(7);
    a.write([result.slice(..).unwrap()], &remote).unwrap();
    drop(target);
    assert_eq!(word.0, [7; 8], "a write still works");
}
