//! Model checks of the lock-free completion dispatch with loom:
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom`.
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
