//! The simulator's send lanes against its locked path, under concurrency: several threads,
//! each with its own device and queue pair to one target device, post random operations
//! at once (fetch-and-add and compare-and-swap on shared words, writes into a region of
//! their own, reads of every region), on the untimed fabric with send lanes and with
//! lanes off ([`FabricConfig::send_lanes`]), same inputs and seed. Afterwards, on both:
//!
//! - each word holds the sum of the adds made to it, and the old values the requesters saw
//!   chain into one serial order (sorted by old value, each is the previous plus its add);
//! - every byte of a thread's region holds what its last completed write put there, and
//!   a read saw its own writes and, of another thread's region, only bytes written there;
//! - every operation completed successfully.
//!
//! `PROPTEST_CASES` sets the number of cases (default 64); a failure prints the minimal
//! input and its fabric seed.
#![cfg(feature = "sim")]

use std::time::Duration;

use proptest::prelude::*;
use zverbs::provider::sim::{FabricConfig, Sim};
use zverbs::{AccessFlags, Channel, ChannelConfig, Context, RemoteRegion};

const THREADS: usize = 3;
const WORDS: usize = 4;
/// Bytes of each thread's write region.
const REGION: usize = 64;

#[derive(Clone, Copy, Debug)]
enum Op {
    /// `fetch_add(add)` on word `word`.
    Add { word: usize, add: u64 },
    /// One increment by `add` with a compare-and-swap loop.
    Cas { word: usize, add: u64 },
    /// Writes `len` bytes of `byte` at `off` of the thread's own region.
    Write { off: usize, len: usize, byte: u8 },
    /// Reads `len` bytes at `off` of thread `of`'s region.
    Read { of: usize, off: usize, len: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let span = (0..REGION).prop_flat_map(|off| (Just(off), 1..=REGION - off));
    prop_oneof![
        (0..WORDS, 1..1000u64).prop_map(|(word, add)| Op::Add { word, add }),
        (0..WORDS, 1..1000u64).prop_map(|(word, add)| Op::Cas { word, add }),
        (span.clone(), 1..=255u8).prop_map(|((off, len), byte)| Op::Write { off, len, byte }),
        (0..THREADS, span).prop_map(|(of, (off, len))| Op::Read { of, off, len }),
    ]
}

/// What one thread saw: `(word, old, add)` of each successful atomic, and its reads.
#[derive(Default)]
struct Seen {
    atomics: Vec<(usize, u64, u64)>,
    reads: Vec<(usize, usize, Vec<u8>)>,
}

#[repr(C, align(8))]
struct Target {
    words: [u8; 8 * WORDS],
    regions: [u8; REGION * THREADS],
}

/// Runs `ops` (one list per thread) on a fresh fabric; the target's final bytes and what
/// each thread saw.
fn run(seed: u64, lanes: bool, ops: &[Vec<Op>]) -> Result<(Target, Vec<Seen>), String> {
    let cfg = FabricConfig {
        seed,
        send_lanes: lanes,
        ..FabricConfig::instant()
    };
    let sim = Sim::with_config(cfg, THREADS + 1);
    let config = ChannelConfig {
        timeout: Some(Duration::from_secs(10)),
        ..ChannelConfig::default()
    };
    let dev = format!("sim{THREADS}");
    let tctx = Context::open(&sim, &dev).unwrap();
    let tpd = tctx.alloc_pd().unwrap();
    let mut target = Target {
        words: [0; 8 * WORDS],
        regions: [0; REGION * THREADS],
    };
    // SAFETY: the target is read only after every thread joined and the regions are
    // dropped, with no work in flight.
    let words = unsafe { tpd.register_with_access(&mut target.words, AccessFlags::all()) }
        .map_err(|e| e.to_string())?;
    let regions = unsafe { tpd.register_with_access(&mut target.regions, AccessFlags::all()) }
        .map_err(|e| e.to_string())?;
    let (wr, rr) = (words.remote(), regions.remote());
    let mut sides = Vec::new();
    let mut far = Vec::new();
    for t in 0..THREADS {
        let ctx = Context::open(&sim, &format!("sim{t}")).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let a = Channel::<Sim, 8, 1>::prepare(&ctx, &pd, &config).unwrap();
        let b = Channel::<Sim, 8, 1>::prepare(&tctx, &tpd, &config).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
        sides.push((ctx, pd, a));
        far.push(b);
    }
    let seen: Vec<Result<Seen, String>> = std::thread::scope(|s| {
        let threads: Vec<_> = sides
            .iter_mut()
            .zip(ops)
            .enumerate()
            .map(|(t, ((_, pd, ch), ops))| s.spawn(move || drive(t, pd, ch, ops, wr, rr)))
            .collect();
        threads.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop((far, sides, words, regions));
    let seen = seen.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok((target, seen))
}

/// One thread's operations, in order.
fn drive(
    t: usize,
    pd: &zverbs::ProtectionDomain<Sim>,
    ch: &mut Channel<Sim, 8, 1>,
    ops: &[Op],
    words: RemoteRegion,
    regions: RemoteRegion,
) -> Result<Seen, String> {
    let e = |what: &str, e: zverbs::Error<_>| format!("thread {t}: {what}: {e}");
    let mut result = [0u8; 8];
    let mut result = pd.register(&mut result).unwrap();
    let mut buf = [0u8; REGION];
    let mut buf = pd.register(&mut buf).unwrap();
    let word = |w: usize| words.slice(8 * w as u64..8 * w as u64 + 8).unwrap();
    let span = |of: usize, off: usize, len: usize| {
        let at = (REGION * of + off) as u64;
        regions.slice(at..at + len as u64).unwrap()
    };
    let mut seen = Seen::default();
    for &op in ops {
        match op {
            Op::Add { word: w, add } => {
                let slot = result.slice_mut(..).unwrap();
                let old = ch
                    .fetch_add(slot, &word(w), add)
                    .map_err(|x| e("fetch_add", x))?;
                seen.atomics.push((w, old, add));
            }
            Op::Cas { word: w, add } => {
                let mut expect = 0;
                loop {
                    let slot = result.slice_mut(..).unwrap();
                    let old = ch
                        .compare_swap(slot, &word(w), expect, expect.wrapping_add(add))
                        .map_err(|x| e("compare_swap", x))?;
                    if old == expect {
                        seen.atomics.push((w, old, add));
                        break;
                    }
                    expect = old;
                }
            }
            Op::Write { off, len, byte } => {
                buf.as_mut_slice()[..len].fill(byte);
                let data = buf.slice(..len).unwrap();
                ch.write([data], &span(t, off, len))
                    .map_err(|x| e("write", x))?;
            }
            Op::Read { of, off, len } => {
                let into = buf.slice_mut(..len).unwrap();
                ch.read([into], &span(of, off, len))
                    .map_err(|x| e("read", x))?;
                seen.reads.push((of, off, buf.as_slice()[..len].to_vec()));
            }
        }
    }
    Ok(seen)
}

/// Checks the invariants of the module docs.
fn check(ops: &[Vec<Op>], target: &Target, seen: &[Seen]) -> Result<(), String> {
    for w in 0..WORDS {
        let mut chain: Vec<(u64, u64)> = seen
            .iter()
            .flat_map(|s| s.atomics.iter())
            .filter(|a| a.0 == w)
            .map(|&(_, old, add)| (old, add))
            .collect();
        chain.sort_unstable();
        let mut at = 0u64;
        for &(old, add) in &chain {
            if old != at {
                return Err(format!("word {w}: an old value {old} where {at} was due"));
            }
            at = at.wrapping_add(add);
        }
        let last = u64::from_ne_bytes(target.words[8 * w..8 * w + 8].try_into().unwrap());
        if last != at {
            return Err(format!("word {w}: holds {last}, the adds sum to {at}"));
        }
    }
    for (t, ops) in ops.iter().enumerate() {
        // The model of thread t's region: its writes, in order; and every byte ever
        // written at each position (what another thread's read may see).
        let mut model = [0u8; REGION];
        let mut ever: Vec<Vec<u8>> = vec![vec![0]; REGION];
        let mut reads = seen[t].reads.iter();
        for op in ops {
            match *op {
                Op::Write { off, len, byte } => {
                    model[off..off + len].fill(byte);
                }
                Op::Read { of, off, len } => {
                    let (_, _, got) = reads.next().unwrap();
                    if of == t && got[..] != model[off..off + len] {
                        return Err(format!(
                            "thread {t} read {got:?} of its own region at {off}, wrote {:?}",
                            &model[off..off + len]
                        ));
                    }
                }
                _ => {}
            }
        }
        for op in ops {
            if let Op::Write { off, len, byte } = *op {
                for e in &mut ever[off..off + len] {
                    e.push(byte);
                }
            }
        }
        let region = &target.regions[REGION * t..REGION * (t + 1)];
        if region != model {
            return Err(format!(
                "thread {t}'s region holds {region:?}, its writes {model:?}"
            ));
        }
        for (r, s) in seen.iter().enumerate() {
            for (of, off, got) in &s.reads {
                if *of != t {
                    continue;
                }
                if let Some(i) = (0..got.len()).find(|&i| !ever[off + i].contains(&got[i])) {
                    return Err(format!(
                        "thread {r} read byte {} of thread {t}'s region as {}, never written there",
                        off + i,
                        got[i]
                    ));
                }
            }
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn lanes_and_the_locked_path_keep_the_same_invariants(
        seed in any::<u64>(),
        ops in prop::collection::vec(prop::collection::vec(op(), 1..40), THREADS),
    ) {
        for lanes in [true, false] {
            let (target, seen) = run(seed, lanes, &ops)
                .map_err(|e| TestCaseError::fail(format!("seed {seed}, lanes {lanes}: {e}")))?;
            check(&ops, &target, &seen)
                .map_err(|e| TestCaseError::fail(format!("seed {seed}, lanes {lanes}: {e}")))?;
        }
    }
}
