//! Loom models of the sleep on a shared completion queue ([`sleep`](super::sleep)): no
//! wake-up is lost, whether a resigning leader, the queue's event or a router owes it.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --features sim --lib loom_sleep
//! ```
//!
//! The device is a fake queue that raises its one event when a completion comes while it
//! is armed (as a completion channel does), and the leader sleeps on that event. Each
//! sleeper runs what a channel's wait with the sleep policy runs: take from its inbox,
//! else [`Dispatcher::sleep_on`], again until its completion is taken. A lost wake-up
//! leaves a thread parked or waiting for an event that never comes: loom reports the
//! deadlock.

use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use super::{CompletionSource, Dispatcher, Inbox};
use crate::types::WorkCompletion;

/// The device's completion queue and its completion channel. A mutex is fine here: it
/// stands for hardware.
struct FakeCq {
    state: Mutex<Device>,
    event: Condvar,
}

#[derive(Default)]
struct Device {
    queue: Vec<WorkCompletion>,
    /// The next completion raises the event.
    armed: bool,
    /// An event waits on the channel.
    event: bool,
}

impl FakeCq {
    fn new() -> Self {
        FakeCq {
            state: Mutex::new(Device::default()),
            event: Condvar::new(),
        }
    }

    /// The device completes a request: an event if the queue was armed.
    fn complete(&self, wr_id: u64) {
        let mut d = self.state.lock().unwrap();
        d.queue.push(WorkCompletion {
            wr_id,
            ..WorkCompletion::EMPTY
        });
        if d.armed {
            (d.armed, d.event) = (false, true);
            self.event.notify_all();
        }
    }

    /// A leader's sleep without the descriptor: arm, route what came before the arm, look
    /// at the inbox, wait for the event and take it.
    fn lead(&self, d: &Dispatcher, inbox: &Inbox) -> Result<(), ()> {
        self.state.lock().unwrap().armed = true;
        d.drain(self)?;
        if d.has_mail(inbox) {
            return Ok(());
        }
        let mut s = self.state.lock().unwrap();
        while !s.event {
            s = self.event.wait(s).unwrap();
        }
        s.event = false;
        Ok(())
    }
}

impl CompletionSource for FakeCq {
    type Error = ();
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, ()> {
        let mut d = self.state.lock().unwrap();
        let n = d.queue.len().min(out.len());
        out[..n].copy_from_slice(&d.queue[..n]);
        d.queue.drain(..n);
        Ok(n)
    }
}

/// Waits as a channel with the sleep policy does until `inbox` has its completion.
fn wait(d: &Dispatcher, cq: &FakeCq, inbox: &mut Inbox) -> u64 {
    let mut out = [WorkCompletion::EMPTY; 1];
    loop {
        if d.take(inbox, &mut out) == 1 {
            return out[0].wr_id;
        }
        let lead = || cq.lead(d, inbox);
        d.sleep_on(cq, inbox, thread::current(), thread::park, lead)
            .unwrap();
    }
}

/// Explores `f` with preemption bound `bound` (`LOOM_MAX_PREEMPTIONS` overrides), the first
/// `cap` interleavings if given (`LOOM_MAX_PERMUTATIONS` overrides), with room for the
/// waits for the poll right (yield loops) as in `tests/loom.rs`.
fn model(bound: usize, cap: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(b.preemption_bound.unwrap_or(bound));
    b.max_permutations = b.max_permutations.or(cap);
    b.checkpoint_interval = b.checkpoint_interval.min(1_000);
    b.max_branches = 100_000;
    b.check(f);
}

/// Two sleepers, each waiting for its own completion, which the device writes while they
/// sleep: one leads (on the event) while the other parks, and whichever completion comes,
/// the one it is for gets it (the leader routes it on the event, or resigns and so wakes
/// the follower, which routes it).
#[test]
fn loom_sleep_two_sleepers_each_get_their_completion() {
    model(3, None, || {
        let d = Arc::new(Dispatcher::new(2, 2));
        let cq = Arc::new(FakeCq::new());
        let (a, b) = (d.attach(1).unwrap(), d.attach(1).unwrap());
        let (ida, idb) = (a.wr_id(1), b.wr_id(1));
        let sleeper = |mut inbox: Inbox| {
            let (d, cq) = (d.clone(), cq.clone());
            thread::spawn(move || wait(&d, &cq, &mut inbox))
        };
        let (ta, tb) = (sleeper(a), sleeper(b));
        cq.complete(ida);
        cq.complete(idb);
        assert_eq!(ta.join().unwrap(), ida);
        assert_eq!(tb.join().unwrap(), idb);
    });
}

/// Two sleepers and a router (a busy channel polling the same queue, which routes their
/// completions for them): routing to a follower's inbox unparks it, or the leader's event
/// does, or the sleeper sees the mail before it parks.
///
/// (A model with the lead held by a thread that never arms the queue deadlocks, and
/// rightly: a router that finds the poll right taken leaves the completion in the queue,
/// where only the armed leader's event finds it. A follower parks only while a leader
/// leads, and a leader arms before it sleeps.)
#[test]
fn loom_sleep_routed_completions_wake_their_sleepers() {
    model(2, Some(20_000), || {
        let d = Arc::new(Dispatcher::new(3, 2));
        let cq = Arc::new(FakeCq::new());
        let (a, b, mut c) = (
            d.attach(1).unwrap(),
            d.attach(1).unwrap(),
            d.attach(1).unwrap(),
        );
        let (ida, idb) = (a.wr_id(1), b.wr_id(1));
        let sleeper = |mut inbox: Inbox| {
            let (d, cq) = (d.clone(), cq.clone());
            thread::spawn(move || wait(&d, &cq, &mut inbox))
        };
        let (ta, tb) = (sleeper(a), sleeper(b));
        let mut out = [WorkCompletion::EMPTY; 1];
        for id in [ida, idb] {
            cq.complete(id);
            assert_eq!(d.poll_for(&*cq, &mut c, &mut out).unwrap(), 0);
        }
        assert_eq!(ta.join().unwrap(), ida);
        assert_eq!(tb.join().unwrap(), idb);
    });
}
