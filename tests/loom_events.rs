//! The arm, poll-again, sleep order on the simulator's completion channel, model-checked
//! with loom: `RUSTFLAGS="--cfg loom" cargo test --release --features sim --test
//! loom_events`. Under `--cfg loom` the simulator's lock is loom's, so loom explores every
//! order of the consumer's poll, arm and second poll against the producer's post (whose
//! completion, and event if armed, are written under that lock).
//!
//! Asserted in every interleaving: a consumer that found nothing after arming (and would
//! now sleep) has an event pending by the time the producer is done, so its sleep ends;
//! and the completion is found exactly once. The naive order (poll, sleep, arm) is shown
//! to lose the wake-up in some interleaving.
//!
//! Bound: two threads, preemption bound 2 (LOOM_MAX_PREEMPTIONS overrides); the whole
//! space is explored (a few hundred executions, seconds).
#![cfg(all(loom, feature = "sim"))]

use std::sync::atomic::{AtomicBool, Ordering};

use loom::sync::Arc;
use loom::thread;
use zverbs::provider::sim::Sim;
use zverbs::testing::EventedPair;
use zverbs::{CompletionQueue, RecvWr, SendFlags, SendOp, SendWr, WorkCompletion};

/// A sender `a` connected to a receiver `b` whose CQ reports to `ch`; `b` has a receive
/// posted.
fn ends() -> EventedPair {
    let e = EventedPair::connected_on(&Sim::with_devices(2), 4).unwrap();
    // SAFETY: no scatter entries: the receive names no memory.
    unsafe { e.b.post_recv(&[RecvWr::<1>::new(7)]) }.unwrap();
    e
}

fn poll(cq: &CompletionQueue<Sim>) -> usize {
    let mut wcs = [WorkCompletion::EMPTY; 4];
    cq.poll(&mut wcs).unwrap()
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound.get_or_insert(2);
    b.check(f);
}

/// How the consumer's protocol ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The first poll found the completion.
    First,
    /// The poll after the arm found it.
    AfterArm,
    /// Nothing found: the consumer would sleep now.
    Sleeps,
}

/// Runs the consumer's `protocol` against a producer posting one send; returns how the
/// protocol ended, whether an event is pending once both are done, and what a poll finds
/// then.
fn race(protocol: fn(&EventedPair) -> Stage) -> (Stage, bool, usize) {
    let e = Arc::new(ends());
    let producer = {
        let e = e.clone();
        thread::spawn(move || {
            // SAFETY: no gather entries: the send names no memory.
            unsafe {
                e.a.post_send(&[SendWr::<1>::new(1, SendOp::Send, SendFlags::empty())])
            }
            .unwrap();
        })
    };
    let stage = protocol(&e);
    producer.join().unwrap();
    let event = match e.ch.try_get_event().unwrap() {
        Some(ev) => {
            e.b_cq.ack_event(ev).unwrap();
            true
        }
        None => false,
    };
    (stage, event, poll(&e.b_cq))
}

#[test]
fn arm_then_poll_again_loses_no_wake_up() {
    // Which ends the explored interleavings reached (outside the model: std atomics).
    let reached: std::sync::Arc<[AtomicBool; 3]> = std::sync::Arc::new(Default::default());
    let r = reached.clone();
    model(move || {
        let (stage, event, after) = race(|e| {
            if poll(&e.b_cq) == 1 {
                return Stage::First;
            }
            e.b_cq.arm(false).unwrap();
            if poll(&e.b_cq) == 1 {
                return Stage::AfterArm;
            }
            Stage::Sleeps
        });
        if stage == Stage::Sleeps {
            assert!(event, "slept after arm + empty poll, and no event came");
            assert_eq!(after, 1, "the event's completion is there");
        } else {
            assert_eq!(after, 0, "the completion is found exactly once");
        }
        r[stage as usize].store(true, Ordering::Relaxed);
    });
    let reached: Vec<bool> = reached.iter().map(|b| b.load(Ordering::Relaxed)).collect();
    assert_eq!(reached, [true, true, true], "every end was explored");
}

#[test]
fn the_naive_order_loses_a_wake_up_in_some_interleaving() {
    // Outside the model: a plain std flag.
    let lost = std::sync::Arc::new(AtomicBool::new(false));
    let seen = lost.clone();
    model(move || {
        let (stage, event, _) = race(|e| {
            // Poll, then arm and sleep without looking again.
            if poll(&e.b_cq) == 1 {
                return Stage::First;
            }
            e.b_cq.arm(false).unwrap();
            Stage::Sleeps
        });
        if stage == Stage::Sleeps && !event {
            seen.store(true, Ordering::Relaxed);
        }
    });
    assert!(
        lost.load(Ordering::Relaxed),
        "loom found no interleaving where the naive order sleeps forever"
    );
}
