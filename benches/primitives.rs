//! Benchmarks of the building blocks under the data path, without a device.
//!
//! ```text
//! cargo bench --bench primitives                            # or `-- --quick`
//! ```
//!
//! - `ring/*`: a work-request slot of [`Ring`] taken and given back: stage, post (clear
//!   the staged batch), complete, take; one signaled request, and a batch of 32 retired by
//!   one signaled completion (selective signaling).
//! - `dispatch/*`: the lock-free [`Dispatcher`] that routes a shared completion queue's
//!   completions to per-channel inboxes. `poll_take/single_thread`: one attached inbox;
//!   per iteration the stand-in queue yields one completion, `poll` routes it, `take`
//!   takes it. `threads/{1,2,4}`: each thread its own inbox over one lock-free stand-in
//!   queue; per iteration it completes a request and polls and takes until it has that
//!   completion (any thread may route another's), so the figure is the dispatcher's, not a
//!   device's. This machine has 2 cores: 4 threads are oversubscribed and partly measure
//!   the scheduler, and the 2- and 4-thread figures swing by up to 4× between runs with
//!   where the threads land.
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

/// A lock-free completion queue stand-in for several threads: one mailbox per thread
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

/// Ring depth the inboxes are attached with (the `Channel` default).
const DEPTH: usize = 64;

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    g.throughput(Throughput::Elements(1));

    let d = Dispatcher::new(1, DEPTH);
    let mut inbox = d.attach(DEPTH).unwrap();
    let cq = OneShot(Cell::new(None));
    let mut seq = 0u64;
    g.bench_function("poll_take/single_thread", |b| {
        b.iter_custom(|iters| {
            timed_no_alloc("dispatch single thread", iters, |n| {
                let mut out = [WorkCompletion::EMPTY; 4];
                for _ in 0..n {
                    cq.0.set(Some(WorkCompletion {
                        wr_id: inbox.wr_id(seq),
                        ..WorkCompletion::EMPTY
                    }));
                    seq += 1;
                    assert_eq!(d.poll(black_box(&cq)), Ok(1));
                    assert_eq!(d.take(&mut inbox, &mut out), 1);
                    black_box(&out[0]);
                }
            })
        })
    });
    d.detach(inbox);
    assert_eq!(d.stale_completions(), 0);

    for threads in [1usize, 2, 4] {
        let d = Dispatcher::new(threads, DEPTH);
        let mut inboxes: Vec<_> = (0..threads).map(|_| d.attach(DEPTH).unwrap()).collect();
        let cq = Mailboxes::<4>(Default::default());
        let mut seqs = vec![0u64; threads];
        g.bench_with_input(BenchmarkId::new("threads", threads), &threads, |b, &w| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(w as u64);
                let start = Barrier::new(w);
                let slowest = std::thread::scope(|t| {
                    let hs: Vec<_> = inboxes
                        .iter_mut()
                        .zip(seqs.iter_mut())
                        .enumerate()
                        .map(|(i, (inbox, seq))| {
                            let (d, cq, start) = (&d, &cq, &start);
                            t.spawn(move || {
                                start.wait();
                                timed_no_alloc("dispatch thread", per, |n| {
                                    let mut out = [WorkCompletion::EMPTY; 4];
                                    for _ in 0..n {
                                        cq.0[i].store(inbox.wr_id(*seq) + 1, Ordering::Release);
                                        *seq += 1;
                                        // Poll (or let whoever holds the poll right route
                                        // ours) until our completion is in our inbox.
                                        loop {
                                            d.poll(cq).unwrap();
                                            match d.take(inbox, &mut out) {
                                                0 => std::hint::spin_loop(),
                                                1 => break,
                                                n => panic!("{n} completions for one request"),
                                            }
                                        }
                                        black_box(&out[0]);
                                    }
                                })
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("dispatch thread panicked"))
                        .max()
                        .unwrap_or_default()
                });
                // Time per completion delivered (`per * w` were).
                slowest.mul_f64(iters as f64 / (per * w as u64) as f64)
            })
        });
        for inbox in inboxes {
            d.detach(inbox);
        }
        assert_eq!(d.stale_completions(), 0);
        assert_eq!(d.overflowed_completions(), 0);
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = ring, dispatch
}
criterion_main!(benches);
