//! Ping-pong over two connected channels on the simulator, one thread per side.
//!
//! ```text
//! cargo run --release --features sim --example pingpong [-- ROUND_TRIPS]
//! ```
//!
//! Prints the median and p99 round-trip time, and on its last line
//! `allocations_after_setup=<n>`: heap allocations counted by a global allocator wrapper
//! over the round-trip loops of both threads.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use zverbs::provider::sim::Sim;
use zverbs::{Channel, ChannelConfig, Context};

/// Counts allocations while `COUNTING` is set.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const MSG: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);

    let sim = Sim::with_devices(2);
    let (ca, cb) = (Context::open(&sim, "sim0")?, Context::open(&sim, "sim1")?);
    let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
    let cfg = ChannelConfig::default();
    let a = Channel::<Sim>::prepare(&ca, &pa, &cfg)?;
    let b = Channel::<Sim>::prepare(&cb, &pb, &cfg)?;
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (mut a, mut b) = (a.connect(&eb)?, b.connect(&ea)?);

    let (mut a_buf, mut b_buf) = ([0u8; 2 * MSG], [0u8; 2 * MSG]);
    let mut a_mr = pa.register(&mut a_buf)?;
    let mut b_mr = pb.register(&mut b_buf)?;
    a_mr.as_mut_slice()[..MSG].fill(0xA5);

    let mut rtts: Vec<Duration> = Vec::with_capacity(rounds);
    let start_line = Barrier::new(2);

    std::thread::scope(
        |t| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            let echo = t.spawn(
                || -> Result<(), zverbs::Error<zverbs::provider::sim::SimError>> {
                    start_line.wait();
                    for _ in 0..rounds {
                        // b: receive into the upper half, echo it back from there.
                        let (_, inbox) = b_mr.slice_mut(..)?.split_at(MSG)?;
                        let got = b.receive([inbox])?;
                        debug_assert_eq!(got.byte_len as usize, MSG);
                        b.send([b_mr.slice(MSG..2 * MSG)?])?;
                    }
                    Ok(())
                },
            );

            COUNTING.store(true, Ordering::SeqCst);
            start_line.wait();
            for _ in 0..rounds {
                let t0 = Instant::now();
                a.send([a_mr.slice(..MSG)?])?;
                let (_, inbox) = a_mr.slice_mut(..)?.split_at(MSG)?;
                a.receive([inbox])?;
                rtts.push(t0.elapsed());
            }
            echo.join().expect("echo thread panicked")?;
            COUNTING.store(false, Ordering::SeqCst);
            Ok(())
        },
    )
    .map_err(|e| e.to_string())?;

    assert_eq!(
        &a_mr.as_slice()[MSG..],
        &[0xA5; MSG][..],
        "echo came back intact"
    );
    rtts.sort_unstable();
    let pct = |p: f64| rtts[((rtts.len() as f64 * p) as usize).min(rtts.len() - 1)];
    println!("pingpong: {rounds} round trips of {MSG} B over the simulator, two threads");
    println!("median_rtt_ns={}", pct(0.50).as_nanos());
    println!("p99_rtt_ns={}", pct(0.99).as_nanos());
    println!(
        "allocations_after_setup={}",
        ALLOCATIONS.load(Ordering::SeqCst)
    );
    Ok(())
}
