//! Benchmarks of the registered-memory pool (`MrPool`) on the simulator.
//!
//! ```text
//! cargo bench --features sim --bench pool                  # or `-- --quick`
//! ```
//!
//! - `pool/warm/{64,4096,65536}`: one `alloc` and one drop of a `LocalBuf` of that size, with
//!   a buffer of the same size kept alive beside it: the free lists hold a block of the
//!   exact order, so neither call splits or merges (the steady state of a busy pool).
//! - `pool/cold/{64,4096,65536}`: the same in an empty 16 MiB pool: every alloc splits the
//!   slab down to the order asked for and every free merges it back (18 levels for 64 B),
//!   the buddy allocator's worst case.
//! - `pool/threads2/{64,4096,65536}`: two threads doing pairs on one pool (with two blocks
//!   of the size kept alive: at most one split and one merge per pair); the figure is wall
//!   time per pair over both threads (so two threads without contention would show half
//!   the single-thread figure).
//! - `baseline/size_class_stack`: what a size-class pool costs at best: the same lock
//!   taken twice, a pop and a push on a preallocated stack of block indices, and the
//!   handle's `Arc` cloned and dropped, as a `LocalBuf` does.
//!
//! Every measured loop runs with its thread's allocations counted and panics if the pool
//! allocated.

mod common;

use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use zverbs::provider::sim::Sim;
use zverbs::{Context, MrPool};

use common::{timed_no_alloc, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const SIZES: [usize; 3] = [64, 4096, 65536];
const CAPACITY: usize = 16 << 20;

fn new_pool() -> MrPool<Sim> {
    let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    MrPool::new(&pd, CAPACITY).unwrap()
}

fn pairs(pool: &MrPool<Sim>, size: usize, n: u64) {
    for _ in 0..n {
        black_box(pool.alloc(black_box(size)).unwrap());
    }
}

fn single_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool");
    g.throughput(Throughput::Elements(1));
    let pool = new_pool();
    for size in SIZES {
        let keep = pool.alloc(size).unwrap();
        g.bench_with_input(BenchmarkId::new("warm", size), &size, |b, &size| {
            b.iter_custom(|iters| timed_no_alloc("pool warm", iters, |n| pairs(&pool, size, n)))
        });
        drop(keep);
        assert_eq!(pool.stats().largest_free, CAPACITY);
        g.bench_with_input(BenchmarkId::new("cold", size), &size, |b, &size| {
            b.iter_custom(|iters| timed_no_alloc("pool cold", iters, |n| pairs(&pool, size, n)))
        });
    }
    for size in SIZES {
        let keep = [pool.alloc(size).unwrap(), pool.alloc(size).unwrap()];
        g.bench_with_input(BenchmarkId::new("threads2", size), &size, |b, &size| {
            b.iter_custom(|iters| {
                let per = iters.div_ceil(2);
                let start = Barrier::new(2);
                let slowest = std::thread::scope(|t| {
                    let hs: Vec<_> = (0..2)
                        .map(|_| {
                            let (pool, start) = (&pool, &start);
                            t.spawn(move || {
                                start.wait();
                                timed_no_alloc("pool thread", per, |n| pairs(pool, size, n))
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("pool thread panicked"))
                        .max()
                        .unwrap_or_default()
                });
                // Time per pair over both threads (`per * 2` were done).
                slowest.mul_f64(iters as f64 / (per * 2) as f64)
            })
        });
        drop(keep);
    }
    g.finish();
    assert_eq!(pool.stats().allocations, 0);
}

fn baseline(c: &mut Criterion) {
    let mut g = c.benchmark_group("baseline");
    g.throughput(Throughput::Elements(1));
    // Free block indices of one size class, preallocated.
    let class = Mutex::new((0..1024u32).collect::<Vec<_>>());
    let handle = Arc::new(0u64);
    g.bench_function("size_class_stack", |b| {
        b.iter_custom(|iters| {
            timed_no_alloc("size class", iters, |n| {
                for _ in 0..n {
                    let i = class.lock().unwrap().pop().unwrap();
                    let h = Arc::clone(&handle);
                    black_box((i, &h));
                    drop(h);
                    class.lock().unwrap().push(black_box(i));
                }
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = single_thread, baseline
}
criterion_main!(benches);
