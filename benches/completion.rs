//! The completion engine's cost on a two-thread ping-pong of 64 B over the (untimed)
//! simulator, every variant in one run so the ratios are fair:
//!
//! ```text
//! cargo bench --features sim --bench completion          # add `-- --quick` for a rougher run
//! ```
//!
//! - `pingpong_64B/own_cqs/{spin_yield,spin}`: each channel on completion queues of its own
//!   (the layout before shared queues; `spin_yield` is the default policy);
//! - `pingpong_64B/shared_cqs/spin`: each channel's sends on one `SharedCompletionQueue`
//!   and its receives on another (as a `MultiChannel` lays them out), through the
//!   dispatcher;
//! - `pingpong_64B/{own,shared}_cqs/sleep`: `WaitPolicy::SpinSleep`, the event-driven round
//!   trip (after 128 empty polls a waiter arms its queue, polls again and sleeps on the
//!   completion channel).
//!
//! Criterion runs the variants one after another, and this machine drifts between a fast
//! and a ~3× slower mode over seconds, so a ratio of two criterion figures can be off by
//! more than the difference measured. For the layout ratio that matters (shared against
//! own queues, spin policy) set `INTERLEAVED=<rounds>`: the bench then alternates blocks of
//! 100,000 round trips on the two layouts (own first, then shared, `rounds` times) and
//! prints each layout's median, the median of the per-round ratios, and the ratio over the
//! rounds where both blocks ran in the fast mode:
//!
//! ```text
//! INTERLEAVED=30 cargo bench --features sim --bench completion
//! ```
//!
//! One iteration is one round trip: A posts its receive, sends, and waits for the echo; B
//! waits for the message, posts its next receive, then echoes (so no message ever meets a
//! missing receive). Both threads run with their allocations counted and panic if a round
//! trip allocated. This machine has 2 cores: one per thread.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use zverbs::dispatch::SharedCompletionQueue;
use zverbs::provider::sim::Sim;
use zverbs::{Channel, ChannelConfig, Context, MemoryRegion, SendFlags, SendOp, WaitPolicy};

use common::{assert_no_allocs, count_allocs, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const MSG: usize = 64;
type Ch = Channel<Sim, 16, 1>;

/// A buffer that lives for the whole run, so regions can be `'static`.
/// Page-aligned, so the two sides' buffers never share a cache line, whatever else was
/// allocated between them (the layouts allocate differently; without this the placement
/// moved the shared/own ratio by ±10 %).
fn buffer(len: usize) -> &'static mut [u8] {
    let whole = Box::leak(vec![0u8; len + 8192].into_boxed_slice());
    let skip = whole.as_ptr().align_offset(4096);
    &mut whole[skip..skip + len]
}

struct Side {
    ch: Ch,
    buf: MemoryRegion<'static, Sim>,
    /// The receive posted ahead (B only, between iterations).
    ahead: Option<zverbs::Pending>,
}

/// Two connected channels on sim0 and sim1, on queues of their own or shared ones.
fn pair(shared: bool, wait: WaitPolicy) -> (Side, Side) {
    let sim = Sim::with_devices(2);
    let cfg = ChannelConfig {
        wait,
        ..ChannelConfig::default()
    };
    let side = |dev: &str| {
        let ctx = Box::leak(Box::new(Context::open(&sim, dev).unwrap()));
        let pd = Box::leak(Box::new(ctx.alloc_pd().unwrap()));
        let ch = if shared {
            let make = if wait == WaitPolicy::SpinSleep {
                SharedCompletionQueue::create_with_events
            } else {
                SharedCompletionQueue::create
            };
            // One send and one receive queue, as a MultiChannel lays them out.
            let send = Arc::new(make(ctx, 1, 16).unwrap());
            let recv = Arc::new(make(ctx, 1, 16).unwrap());
            Ch::prepare_shared(ctx, pd, &cfg, &send, &recv).unwrap()
        } else {
            Ch::prepare(ctx, pd, &cfg).unwrap()
        };
        let buf = pd.register(buffer(MSG)).unwrap();
        (ch, buf)
    };
    let ((a, abuf), (b, bbuf)) = (side("sim0"), side("sim1"));
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    (
        Side {
            ch: a,
            buf: abuf,
            ahead: None,
        },
        Side {
            ch: b,
            buf: bbuf,
            ahead: None,
        },
    )
}

/// `iters` round trips; returns A's time for them.
fn round_trips(a: &mut Side, b: &mut Side, iters: u64) -> Duration {
    let start = Barrier::new(2);
    std::thread::scope(|t| {
        let echo = t.spawn(|| {
            start.wait();
            let ((), allocs) = count_allocs(|| {
                let sge = b.buf.slice_mut(..).unwrap().sge();
                for _ in 0..iters {
                    let got = match b.ahead.take() {
                        Some(p) => p,
                        // SAFETY: the buffer is leaked and touched only by the device.
                        None => unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap(),
                    };
                    b.ch.wait(got).unwrap();
                    // SAFETY: as above; the next message lands after the echo below.
                    b.ahead = Some(unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap());
                    // SAFETY: as above.
                    let echo = unsafe {
                        b.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
                    };
                    b.ch.wait(echo.unwrap()).unwrap();
                }
            });
            allocs
        });
        start.wait();
        let (elapsed, allocs) = count_allocs(|| {
            let sge = a.buf.slice_mut(..).unwrap().sge();
            let t0 = Instant::now();
            for _ in 0..iters {
                // SAFETY: the buffer is leaked and touched only by the device.
                let reply = unsafe { a.ch.post_receive_unpolled(&[sge]) }.unwrap();
                // SAFETY: as above.
                let sent = unsafe {
                    a.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
                };
                a.ch.wait(sent.unwrap()).unwrap();
                a.ch.wait(reply).unwrap();
            }
            t0.elapsed()
        });
        assert_no_allocs("ping", allocs);
        assert_no_allocs("echo", echo.join().expect("echo thread panicked"));
        elapsed
    })
}

fn pingpong(c: &mut Criterion) {
    let mut g = c.benchmark_group("pingpong_64B");
    g.throughput(Throughput::Elements(1));
    let variants = [
        ("own_cqs", "spin_yield", false, WaitPolicy::SpinYield),
        ("own_cqs", "spin", false, WaitPolicy::Spin),
        ("shared_cqs", "spin", true, WaitPolicy::Spin),
        ("own_cqs", "sleep", false, WaitPolicy::SpinSleep),
        ("shared_cqs", "sleep", true, WaitPolicy::SpinSleep),
    ];
    for (layout, policy, shared, wait) in variants {
        let (mut a, mut b) = pair(shared, wait);
        g.bench_function(BenchmarkId::new(layout, policy), |bch| {
            bch.iter_custom(|iters| round_trips(&mut a, &mut b, iters))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = pingpong
}
fn main() {
    match std::env::var("INTERLEAVED")
        .ok()
        .and_then(|r| r.parse().ok())
    {
        Some(rounds) => interleaved(rounds),
        None => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}

/// Alternating blocks of round trips on own and shared queues (spin policy): the medians
/// and ratios described in the module docs.
fn interleaved(rounds: usize) {
    const BLOCK: u64 = 100_000;
    let (mut oa, mut ob) = pair(false, WaitPolicy::Spin);
    let (mut sa, mut sb) = pair(true, WaitPolicy::Spin);
    let per_op = |d: Duration| d.as_nanos() as f64 / BLOCK as f64;
    let blocks: Vec<(f64, f64)> = (0..rounds.max(1))
        .map(|_| {
            let own = per_op(round_trips(&mut oa, &mut ob, BLOCK));
            (own, per_op(round_trips(&mut sa, &mut sb, BLOCK)))
        })
        .collect();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let own = median(blocks.iter().map(|b| b.0).collect());
    let shared = median(blocks.iter().map(|b| b.1).collect());
    let ratio = median(blocks.iter().map(|b| b.1 / b.0).collect());
    // A block is fast-mode when it is within 1.5× of its layout's fastest block.
    let fastest = |f: fn(&(f64, f64)) -> f64| blocks.iter().map(f).fold(f64::MAX, f64::min);
    let (own_min, shared_min) = (fastest(|b| b.0), fastest(|b| b.1));
    let fast: Vec<f64> = blocks
        .iter()
        .filter(|b| b.0 < 1.5 * own_min && b.1 < 1.5 * shared_min)
        .map(|b| b.1 / b.0)
        .collect();
    println!("pingpong_64B spin, {rounds} rounds of {BLOCK} round trips per layout");
    println!("  own_cqs    median {own:7.1} ns  fastest {own_min:7.1} ns");
    println!("  shared_cqs median {shared:7.1} ns  fastest {shared_min:7.1} ns");
    println!("  shared/own median of per-round ratios {ratio:.3}");
    if !fast.is_empty() {
        let n = fast.len();
        println!(
            "  shared/own over the {n} fast-mode rounds {:.3}",
            median(fast)
        );
    }
}
