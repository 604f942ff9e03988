//! Benchmarks of the building blocks under the data path, without a device.
//!
//! ```text
//! cargo bench --bench primitives                            # or `-- --quick`
//! ```
//!
//! - `ring/*`: a work-request slot of [`Ring`] taken and given back: stage, post (clear
//!   the staged batch), complete, take; one signaled request, and a batch of 32 retired by
//!   one signaled completion (selective signaling).
//! - `dispatch/*`: the lock-free [`Dispatcher`]: claim a slot, complete, wait; on one
//!   thread, and with 1, 2, 4 waiter threads sharing it over a lock-free stand-in
//!   completion queue (so the figure is the dispatcher's, not a device's). This machine
//!   has 2 cores: 4 threads are oversubscribed and partly measure the scheduler.
//!
//! Every measured loop runs with its thread's allocations counted and panics if the code
//! under test allocated.

mod common;

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use zverbs::dispatch::{CompletionSource, Dispatcher};
use zverbs::ring::Ring;
use zverbs::{SendFlags, SendOp, SendWr, WorkCompletion};

use common::{assert_no_allocs, count_allocs, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn timed_no_alloc(what: &str, iters: u64, f: impl FnOnce(u64)) -> Duration {
    let (elapsed, allocs) = count_allocs(|| {
        let t0 = Instant::now();
        f(iters);
        t0.elapsed()
    });
    assert_no_allocs(what, allocs);
    elapsed
}

fn ring(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    let wr = SendWr::<4>::new(0, SendOp::Send, SendFlags::empty());

    let mut r: Ring<SendWr<4>, 64> = Ring::new();
    g.throughput(Throughput::Elements(1));
    g.bench_function("acquire_release_1", |b| {
        b.iter_custom(|iters| {
            timed_no_alloc("ring acquire/release", iters, |n| {
                for _ in 0..n {
                    let seq = r.stage(black_box(wr), true).unwrap();
                    r.clear_staged();
                    let wc = WorkCompletion {
                        wr_id: seq,
                        ..WorkCompletion::EMPTY
                    };
                    r.complete(black_box(&wc)).unwrap();
                    black_box(r.take(seq).unwrap().unwrap());
                }
            })
        })
    });

    g.throughput(Throughput::Elements(32));
    g.bench_function("acquire_release_batch32", |b| {
        b.iter_custom(|iters| {
            timed_no_alloc("ring batch", iters, |n| {
                for _ in 0..n {
                    let mut last = 0;
                    for _ in 0..32 {
                        last = r.stage(black_box(wr), false).unwrap();
                    }
                    r.signal_last_staged();
                    black_box(r.staged());
                    r.clear_staged();
                    let wc = WorkCompletion {
                        wr_id: last,
                        ..WorkCompletion::EMPTY
                    };
                    r.complete(black_box(&wc)).unwrap();
                    black_box(r.take(last).unwrap().unwrap());
                }
            })
        })
    });
    assert!(r.is_idle());
    g.finish();
}

/// A completion queue stand-in for one thread: holds at most one completion.
struct OneShot(Cell<Option<WorkCompletion>>);

impl CompletionSource for OneShot {
    type Error = ();
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
        match self.0.take() {
            Some(wc) if !out.is_empty() => {
                out[0] = wc;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

/// A lock-free completion queue stand-in for several threads: one mailbox per waiter
/// holding `wr_id + 1` (0 = empty); polling swaps each mailbox out. The "device"
/// completes a request the moment it is posted.
struct Mailboxes<const W: usize>([AtomicU64; W]);

impl<const W: usize> CompletionSource for Mailboxes<W> {
    type Error = ();
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
        let mut n = 0;
        for m in &self.0 {
            if n == out.len() {
                break;
            }
            if m.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let v = m.swap(0, Ordering::Acquire);
            if v != 0 {
                out[n] = WorkCompletion {
                    wr_id: v - 1,
                    ..WorkCompletion::EMPTY
                };
                n += 1;
            }
        }
        Ok(n)
    }
}

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    g.throughput(Throughput::Elements(1));

    let d: Dispatcher<64> = Dispatcher::new();
    let cq = OneShot(Cell::new(None));
    g.bench_function("claim_complete_wait/single_thread", |b| {
        b.iter_custom(|iters| {
            timed_no_alloc("dispatch single thread", iters, |n| {
                for _ in 0..n {
                    let t = d.claim(0).unwrap();
                    cq.0.set(Some(WorkCompletion {
                        wr_id: t.wr_id(),
                        ..WorkCompletion::EMPTY
                    }));
                    black_box(d.wait(&cq, t).unwrap());
                }
            })
        })
    });

    for waiters in [1usize, 2, 4] {
        let d: Dispatcher<64> = Dispatcher::new();
        let cq = Mailboxes::<4>(Default::default());
        g.bench_with_input(BenchmarkId::new("waiters", waiters), &waiters, |b, &w| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(w as u64);
                let start = Barrier::new(w);
                let slowest = std::thread::scope(|t| {
                    let hs: Vec<_> = (0..w)
                        .map(|i| {
                            let (d, cq, start) = (&d, &cq, &start);
                            t.spawn(move || {
                                start.wait();
                                timed_no_alloc("dispatch waiter", per, |n| {
                                    for _ in 0..n {
                                        let t = loop {
                                            match d.claim(i as u16) {
                                                Ok(t) => break t,
                                                Err(_) => std::hint::spin_loop(),
                                            }
                                        };
                                        cq.0[i].store(t.wr_id() + 1, Ordering::Release);
                                        black_box(d.wait(cq, t).unwrap());
                                    }
                                })
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("waiter panicked"))
                        .max()
                        .unwrap_or_default()
                });
                // Time per completion delivered (`per * w` were).
                slowest.mul_f64(iters as f64 / (per * w as u64) as f64)
            })
        });
        assert_eq!(d.stale_completions(), 0);
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = ring, dispatch
}
criterion_main!(benches);
