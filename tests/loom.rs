//! Model checks of the lock-free completion dispatch with loom:
//! `RUSTFLAGS="--cfg loom" cargo test --release --features sim --test loom` (without
//! `sim`, only the dispatch tests run). A barrier soak over the simulator:
//! `LOOM_MAX_PERMUTATIONS=200000` with the same command.
//!
//! Threads claim slots, "post" (the fake device pushes their completion into a shared
//! completion queue), and wait; loom explores every interleaving of polls, publications
//! and takes. Asserted: each waiter receives exactly its own completion, none is lost, a
//! stale completion for a recycled slot is never delivered.
#![cfg(loom)]

use loom::sync::{Arc, Mutex};
use loom::thread;
use zverbs::dispatch::{CompletionSource, Dispatcher, WrId};
use zverbs::WorkCompletion;

/// The device's completion queue. A mutex is fine here: it stands for hardware.
struct FakeCq(Mutex<Vec<WorkCompletion>>);

impl FakeCq {
    fn new() -> Self {
        FakeCq(Mutex::new(Vec::new()))
    }
    fn complete(&self, wr_id: u64, byte_len: u32) {
        self.0.lock().unwrap().push(WorkCompletion {
            wr_id,
            byte_len,
            ..WorkCompletion::EMPTY
        });
    }
}

impl CompletionSource for FakeCq {
    type Error = ();
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
        let mut q = self.0.lock().unwrap();
        let n = q.len().min(out.len());
        out[..n].copy_from_slice(&q[..n]);
        q.drain(..n);
        Ok(n)
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(2, f)
}

fn model_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    // Waiters spin (with loom yields) until their completion is published; give the
    // explorer room for those loops, and bound preemptions so the run takes minutes at most
    // (LOOM_MAX_PREEMPTIONS overrides).
    b.max_branches = 100_000;
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(preemptions);
    }
    b.check(f);
}

#[test]
fn two_waiters_each_get_their_own_completion() {
    model(|| {
        let d: Arc<Dispatcher<2>> = Arc::new(Dispatcher::new());
        let cq = Arc::new(FakeCq::new());
        let handles: Vec<_> = (0..2u16)
            .map(|peer| {
                let (d, cq) = (d.clone(), cq.clone());
                thread::spawn(move || {
                    let t = d.claim(peer).unwrap();
                    cq.complete(t.wr_id(), 100 + u32::from(peer));
                    let wc = d.wait(&*cq, t).unwrap();
                    assert_eq!(WrId(wc.wr_id).peer(), peer);
                    assert_eq!(wc.byte_len, 100 + u32::from(peer));
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(d.stale_completions(), 0);
        assert!(cq.0.lock().unwrap().is_empty(), "nothing left undelivered");
    });
}

#[test]
fn three_threads_one_polls_for_all() {
    // The device has completed both requests (out of order); two waiters and a third
    // polling thread race for the poll right and the publications. Three threads with
    // spin loops: one preemption keeps the exploration to seconds.
    model_bounded(1, || {
        let d: Arc<Dispatcher<2>> = Arc::new(Dispatcher::new());
        let cq = Arc::new(FakeCq::new());
        let (t0, t1) = (d.claim(0).unwrap(), d.claim(1).unwrap());
        cq.complete(t1.wr_id(), 11);
        cq.complete(t0.wr_id(), 10);
        let waiter = |t, len| {
            let (d, cq) = (d.clone(), cq.clone());
            thread::spawn(move || assert_eq!(d.wait(&*cq, t).unwrap().byte_len, len))
        };
        let w0 = waiter(t0, 10);
        let w1 = waiter(t1, 11);
        let _ = d.poll(&*cq);
        w0.join().unwrap();
        w1.join().unwrap();
        assert_eq!(d.stale_completions(), 0);
        assert!(cq.0.lock().unwrap().is_empty(), "nothing left undelivered");
    });
}

#[test]
fn stale_completion_for_a_recycled_slot_is_not_delivered() {
    model(|| {
        let d: Arc<Dispatcher<1>> = Arc::new(Dispatcher::new());
        let cq = Arc::new(FakeCq::new());
        let first = d.claim(0).unwrap();
        let old = first.wr_id();
        cq.complete(old, 1);
        assert_eq!(d.wait(&*cq, first).unwrap().byte_len, 1);

        let second = d.claim(0).unwrap();
        let new = second.wr_id();
        let dup = {
            let cq = cq.clone();
            thread::spawn(move || cq.complete(old, 666)) // a duplicate of the first
        };
        let real = {
            let cq = cq.clone();
            thread::spawn(move || cq.complete(new, 2))
        };
        assert_eq!(d.wait(&*cq, second).unwrap().byte_len, 2);
        dup.join().unwrap();
        real.join().unwrap();
        while !cq.0.lock().unwrap().is_empty() {
            let _ = d.poll(&*cq);
        }
        assert_eq!(d.stale_completions(), 1);
    });
}

/// A barrier among three threads over the simulator's provider: three `Node`s on one
/// simulated fabric (whose lock is loom's under `--cfg loom`), each thread runs two
/// consecutive barriers; loom explores the interleavings of their posts and polls.
/// Asserted: every node completes both, none before all three have entered (a shared
/// arrival counter), and a message that arrives early for the next barrier is kept.
///
/// The waits spin (a loom yield per empty poll) and every post and poll takes the
/// fabric's lock, so the full space at preemption bound 1 is large: more than 250,000
/// executions for the centralized barrier alone did not finish in 20 minutes. The test
/// explores the first `LOOM_MAX_PERMUTATIONS` (default 5,000) per algorithm, depth-first
/// from the non-preemptive schedule; a soak sets it higher (see README).
#[cfg(feature = "sim")]
fn barrier_over_the_simulator(alg: zverbs::node::barrier::Algorithm) {
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use zverbs::node::{Node, NodeConfig};
    use zverbs::provider::sim::Sim;
    use zverbs::{ChannelConfig, Context};

    let mut b = loom::model::Builder::new();
    b.max_branches = 100_000;
    b.preemption_bound.get_or_insert(1);
    b.max_permutations.get_or_insert(5_000);
    b.check(move || {
        let sim = Sim::with_devices(3);
        let cfg = NodeConfig {
            algorithm: alg,
            barrier_timeout: None, // loom has no clock
            channel: ChannelConfig {
                timeout: None,
                ..ChannelConfig::default()
            },
        };
        let prepared: Vec<_> = (0..3)
            .map(|r| {
                let ctx = Context::open(&sim, &format!("sim{r}")).unwrap();
                let pd = ctx.alloc_pd().unwrap();
                Node::<Sim, 3, 4, 1>::prepare(&ctx, &pd, r, 3, &cfg).unwrap()
            })
            .collect();
        let eps: Vec<Vec<_>> = prepared
            .iter()
            .map(|p| (0..3).map(|peer| p.endpoints(peer).ok()).collect())
            .collect();
        let arrived = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = prepared
            .into_iter()
            .enumerate()
            .map(|(r, p)| p.connect(|peer| eps[peer][r]).unwrap())
            .map(|mut node| {
                let arrived = arrived.clone();
                thread::spawn(move || {
                    // Two consecutive barriers: a fast peer's message for the second may
                    // arrive while a slow one is still in the first.
                    for round in 1..=2 {
                        arrived.fetch_add(1, Ordering::SeqCst);
                        node.barrier_all().unwrap();
                        let n = arrived.load(Ordering::SeqCst);
                        assert!(
                            n >= 3 * round,
                            "barrier {round} released after {n} arrivals"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

#[cfg(feature = "sim")]
#[test]
fn centralized_barrier_among_three_threads_over_the_simulator() {
    barrier_over_the_simulator(zverbs::node::barrier::Algorithm::Centralized);
}

#[cfg(feature = "sim")]
#[test]
fn dissemination_barrier_among_three_threads_over_the_simulator() {
    barrier_over_the_simulator(zverbs::node::barrier::Algorithm::Dissemination);
}

#[cfg(feature = "sim")]
#[test]
fn tree_barrier_among_three_threads_over_the_simulator() {
    barrier_over_the_simulator(zverbs::node::barrier::Algorithm::BinaryTree);
}
