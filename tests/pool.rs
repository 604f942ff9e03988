//! `MrPool` on the simulator: alloc, free and reuse through the real pool, typed errors,
//! buffers in real RDMA operations, a model test of the buddy allocator, no allocation
//! after set-up, and (feature `tokio`) waiters woken by frees.
#![cfg(feature = "sim")]

mod common;

use std::time::Duration;

use proptest::prelude::*;
use zverbs::provider::sim::Sim;
use zverbs::{Context, Error, ErrorKind, LocalBuf, MrPool, PoolError, PoolStats};

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

static_assertions::assert_impl_all!(MrPool<Sim>: Clone, Send, Sync);
static_assertions::assert_impl_all!(LocalBuf<Sim>: Send, Sync);
static_assertions::assert_not_impl_any!(LocalBuf<Sim>: Clone);

/// A pool of `capacity` bytes; its device and protection domain are dropped at once (the
/// registration keeps them alive).
fn pool(capacity: usize) -> MrPool<Sim> {
    let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    MrPool::new(&pd, capacity).unwrap()
}

fn stats(capacity: usize, free: usize, largest_free: usize, allocations: usize) -> PoolStats {
    PoolStats {
        capacity,
        free,
        largest_free,
        allocations,
    }
}

#[test]
fn capacity_rounds_up_and_absurd_ones_are_errors() {
    assert_eq!(pool(1).capacity(), 64);
    assert_eq!(pool(4096).capacity(), 4096);
    assert_eq!(pool(4097).capacity(), 8192);
    let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    for bad in [0, usize::MAX, usize::MAX / 2 + 2, (64 << 31) + 1] {
        let e = MrPool::new(&pd, bad).unwrap_err();
        assert!(matches!(e, Error::InvalidAttribute(_)), "{bad}: {e}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
}

#[test]
fn alloc_free_and_reuse() {
    let pool = pool(4096);
    assert_eq!(pool.stats(), stats(4096, 4096, 4096, 0));
    let a = pool.alloc(100).unwrap();
    assert_eq!((a.len(), a.capacity(), a.lkey()), (100, 128, pool.lkey()));
    assert_eq!(a.addr() % 128, 0);
    let b = pool.alloc(64).unwrap();
    assert_eq!(pool.stats(), stats(4096, 4096 - 192, 2048, 2));
    let a_addr = a.addr();
    drop(a);
    // The freed block is the first choice for the same size again.
    let c = pool.alloc(128).unwrap();
    assert_eq!(c.addr(), a_addr);
    drop((b, c));
    assert_eq!(pool.stats(), stats(4096, 4096, 4096, 0));
    let whole = pool.alloc(4096).unwrap();
    assert_eq!(whole.capacity(), 4096);
}

#[test]
fn exhausted_too_large_and_zero_length() {
    let pool = pool(1024);
    assert_eq!(
        pool.alloc(1025).unwrap_err(),
        PoolError::TooLarge {
            requested: 1025,
            capacity: 1024
        }
    );
    assert_eq!(
        pool.alloc(usize::MAX).unwrap_err(),
        PoolError::TooLarge {
            requested: usize::MAX,
            capacity: 1024
        }
    );
    assert_eq!(pool.alloc(0).unwrap_err(), PoolError::ZeroLength);
    let _half = pool.alloc(512).unwrap();
    let _quarter = pool.alloc(200).unwrap();
    let e = pool.alloc(300).unwrap_err();
    assert_eq!(
        e,
        PoolError::Exhausted {
            requested: 300,
            largest_free: 256
        }
    );
    assert_eq!(e.kind(), ErrorKind::OutOfResources);
    let _rest = pool.alloc(256).unwrap();
    let e = pool.alloc(1).unwrap_err();
    assert_eq!(
        e,
        PoolError::Exhausted {
            requested: 1,
            largest_free: 0
        }
    );
    assert_eq!(
        e.to_string(),
        "pool exhausted: 1 bytes asked for, largest free block 0"
    );
}

/// What a buffer holds: zeros when the slab is fresh; afterwards whatever the block's last
/// owner wrote. The pool promises initialized bytes, not zeroed ones, and never lets two
/// live buffers see each other's bytes.
#[test]
fn contents_are_initialized_and_private_not_zeroed() {
    let pool = pool(1024);
    let mut a = pool.alloc(256).unwrap();
    let mut b = pool.alloc(256).unwrap();
    assert!(a.iter().chain(b.iter()).all(|&x| x == 0));
    a.fill(0xaa);
    b.fill(0xbb);
    assert!(a.iter().all(|&x| x == 0xaa) && b.iter().all(|&x| x == 0xbb));
    let a_addr = a.addr();
    drop(a);
    let again = pool.alloc(256).unwrap();
    assert_eq!(again.addr(), a_addr);
    // Readable; may show 0xaa (it does today), which callers must not rely on either way.
    assert_eq!(again.len(), 256);
    assert!(b.iter().all(|&x| x == 0xbb));
}

#[test]
fn slices_are_bounds_checked_entries_of_the_buffer() {
    let pool = pool(4096);
    let mut buf = pool.alloc(100).unwrap();
    let s = buf.slice(10..30).unwrap().sge();
    assert_eq!(
        (s.addr, s.length, s.lkey),
        (buf.addr() + 10, 20, pool.lkey())
    );
    // Bounds are the length asked for, not the block.
    assert!(buf.slice(..101).is_err());
    assert!(buf.slice(100..).unwrap().is_empty());
    let e = buf.slice_mut(90..120).unwrap_err();
    assert_eq!((e.offset, e.len, e.region_len), (90, 30, 100));
    let (h, t) = buf.slice_mut(..).unwrap().split_at(40).unwrap();
    assert_eq!((h.len(), t.len(), t.sge().addr), (40, 60, buf.addr() + 40));
}

#[test]
fn buffers_know_their_pool() {
    let (p, q) = (pool(1024), pool(1024));
    let buf = p.alloc(10).unwrap();
    assert!(buf.belongs_to(&p) && buf.belongs_to(&p.clone()) && !buf.belongs_to(&q));
    assert!(buf.pool().alloc(10).unwrap().belongs_to(&p));
    // The buffer keeps the slab alive after every pool handle is gone.
    drop((p, q));
    assert_eq!(buf.pool().stats().allocations, 1);
    let moved = std::thread::spawn(move || buf.len()).join().unwrap();
    assert_eq!(moved, 10);
}

/// Pool buffers as the local side of real operations: a write from one, a read into one.
#[test]
fn buffers_carry_rdma_operations() {
    let (mut a, b) = common::pair::<16>(Duration::from_secs(5));
    let pool = MrPool::new(&a.pd, 8192).unwrap();
    let mut target = [0u8; 64];
    // SAFETY: the test reads `target` only after the write that fills it has completed.
    let target = unsafe { b.pd.register_with_access(&mut target, common::ALL).unwrap() };
    let mut src = pool.alloc(64).unwrap();
    src.copy_from_slice(&[7u8; 64]);
    a.ch.write([src.slice(..).unwrap()], &target.remote())
        .unwrap();
    assert_eq!(target.as_slice(), &[7u8; 64]);
    let mut dst = pool.alloc(32).unwrap();
    a.ch.read(
        [dst.slice_mut(..).unwrap()],
        &target.remote().slice(..32).unwrap(),
    )
    .unwrap();
    assert_eq!(&dst[..], &[7u8; 32]);
}

#[test]
fn alloc_and_free_allocate_nothing_after_set_up() {
    let pool = pool(1 << 20);
    let keep = pool.alloc(3000).unwrap(); // some splitting on every round
    let ((), allocs) = zverbs_testkit::measure(|| {
        for i in 0..1000usize {
            let a = pool.alloc(64 << (i % 8)).unwrap();
            let b = pool.alloc(1 + i % 5000).unwrap();
            assert!(pool.alloc(2 << 20).is_err());
            drop(a);
            drop(b);
        }
        let full = pool.alloc(512 << 10).unwrap();
        assert!(matches!(
            pool.alloc(512 << 10),
            Err(PoolError::Exhausted { .. })
        ));
        drop(full);
        let _ = pool.stats();
    });
    assert_eq!(allocs.count, 0);
    drop(keep);
}

mod model {
    use super::*;

    /// The model: which 64-byte units are live. A buddy allocator that coalesces eagerly
    /// can serve order `k` exactly when some `64 << k`-aligned range of that size has no
    /// live unit.
    struct Model {
        used: Vec<bool>,
    }

    impl Model {
        fn fits(&self, k: u32) -> bool {
            let n = 1usize << k;
            n <= self.used.len() && self.used.chunks(n).any(|c| c.iter().all(|u| !u))
        }

        fn largest_free(&self) -> usize {
            (0..=self.used.len().trailing_zeros())
                .rev()
                .find(|&k| self.fits(k))
                .map_or(0, |k| 64 << k)
        }

        fn free(&self) -> usize {
            self.used.iter().filter(|u| !**u).count() * 64
        }

        fn mark(&mut self, unit: usize, k: u32, live: bool) {
            for (i, u) in self.used[unit..unit + (1 << k)].iter_mut().enumerate() {
                assert_ne!(*u, live, "unit {} marked live={live} twice", unit + i);
                *u = live;
            }
        }
    }

    /// The order of the block for `len` bytes.
    fn order(len: usize) -> u32 {
        len.div_ceil(64).next_power_of_two().trailing_zeros()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc(usize),
        Free(usize),
    }

    fn ops(capacity: usize) -> impl Strategy<Value = Vec<Op>> {
        let len = prop_oneof![
            4 => 1..=256usize,
            2 => 1..=capacity,
            1 => Just(0usize),
            1 => capacity..=capacity * 2,
        ];
        proptest::collection::vec(
            prop_oneof![
                3 => len.prop_map(Op::Alloc),
                2 => any::<usize>().prop_map(Op::Free),
            ],
            0..120,
        )
    }

    fn pattern(addr: u64, i: usize) -> u8 {
        (addr as usize / 64 + i) as u8
    }

    fn run(shift: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let capacity = 64usize << shift;
        let pool = pool(capacity);
        let base = pool.alloc(capacity).unwrap().addr();
        let mut model = Model {
            used: vec![false; capacity / 64],
        };
        let mut live: Vec<LocalBuf<Sim>> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(len) => match pool.alloc(len) {
                    Ok(mut buf) => {
                        let k = order(len);
                        prop_assert!(model.fits(k), "alloc({len}) succeeded, model full");
                        prop_assert_eq!(buf.capacity(), 64 << k);
                        let off = buf.addr().checked_sub(base).unwrap() as usize;
                        prop_assert!(off % buf.capacity() == 0 && off + buf.capacity() <= capacity);
                        model.mark(off / 64, k, true); // panics on an overlap
                        let addr = buf.addr();
                        for (i, x) in buf.iter_mut().enumerate() {
                            *x = pattern(addr, i);
                        }
                        live.push(buf);
                    }
                    Err(PoolError::ZeroLength) => prop_assert_eq!(len, 0),
                    Err(PoolError::TooLarge {
                        requested,
                        capacity: c,
                    }) => {
                        prop_assert_eq!((requested, c), (len, capacity));
                        prop_assert!(len > capacity);
                    }
                    Err(PoolError::Exhausted {
                        requested,
                        largest_free,
                    }) => {
                        prop_assert!(len != 0 && len <= capacity);
                        prop_assert!(!model.fits(order(len)), "alloc({len}) failed, model fits");
                        prop_assert_eq!((requested, largest_free), (len, model.largest_free()));
                    }
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                },
                Op::Free(i) if !live.is_empty() => {
                    let buf = live.swap_remove(i % live.len());
                    // Nobody else wrote into it while it was live.
                    let addr = buf.addr();
                    prop_assert!(buf.iter().enumerate().all(|(i, &x)| x == pattern(addr, i)));
                    let off = (addr - base) as usize;
                    model.mark(off / 64, order(buf.len()), false);
                }
                Op::Free(_) => {}
            }
            prop_assert_eq!(
                pool.stats(),
                stats(capacity, model.free(), model.largest_free(), live.len())
            );
        }
        drop(live);
        // No leak: the slab is one free block again, every byte of it reusable.
        prop_assert_eq!(pool.stats(), stats(capacity, capacity, capacity, 0));
        let mut whole = pool.alloc(capacity).unwrap();
        prop_assert_eq!(whole.addr(), base);
        whole.fill(1);
        Ok(())
    }

    proptest! {
        #[test]
        fn pool_agrees_with_the_model((shift, ops) in (0u32..11).prop_flat_map(|s| (Just(s), ops(64 << s)))) {
            run(shift, ops)?;
        }
    }
}

#[cfg(feature = "tokio")]
mod waiting {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_waiter_wakes_when_another_task_frees() {
        let pool = pool(1024);
        let all = pool.alloc(1024).unwrap();
        let p = pool.clone();
        let waiter = tokio::spawn(async move { p.alloc_wait(512).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        tokio::spawn(async move { drop(all) }).await.unwrap();
        let buf = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("waiter not woken")
            .unwrap()
            .unwrap();
        assert_eq!(buf.capacity(), 512);
    }

    #[tokio::test]
    async fn too_large_and_zero_fail_at_once() {
        let pool = pool(1024);
        let _all = pool.alloc(1024).unwrap();
        assert!(matches!(
            pool.alloc_wait(2048).await,
            Err(PoolError::TooLarge { .. })
        ));
        assert_eq!(pool.alloc_wait(0).await.unwrap_err(), PoolError::ZeroLength);
    }

    /// A cancelled wait takes nothing; a later free still wakes the other waiters.
    #[tokio::test]
    async fn cancelled_waits_take_nothing() {
        let pool = pool(1024);
        let all = pool.alloc(1024).unwrap();
        let timed_out = tokio::time::timeout(Duration::from_millis(10), pool.alloc_wait(64)).await;
        assert!(timed_out.is_err());
        assert_eq!(pool.stats().allocations, 1);
        let p = pool.clone();
        let waiter = tokio::spawn(async move { p.alloc_wait(64).await.map(|b| b.capacity()) });
        tokio::task::yield_now().await;
        drop(all);
        assert_eq!(waiter.await.unwrap(), Ok(64));
        assert_eq!(pool.stats(), stats(1024, 1024, 1024, 0));
    }

    /// Many tasks on two worker threads take turns with blocks that do not all fit: with a
    /// lost wake-up some task would sleep forever and the timeout would fire.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn contended_waiters_all_finish() {
        let pool = pool(4096);
        let done = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let (pool, done) = (pool.clone(), done.clone());
                tokio::spawn(async move {
                    for i in 0..200 {
                        let len = if (t + i) % 3 == 0 { 2048 } else { 1000 };
                        let buf = pool.alloc_wait(len).await.unwrap();
                        if i % 7 == 0 {
                            tokio::task::yield_now().await;
                        }
                        drop(buf);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        let all = async {
            for t in tasks {
                t.await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .expect("a waiter was never woken");
        assert_eq!(done.load(Ordering::Relaxed), 8);
        assert_eq!(pool.stats(), stats(4096, 4096, 4096, 0));
    }
}
