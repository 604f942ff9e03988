//! Completion events through the seam: the arm-then-poll-again order loses no wake-up,
//! spurious events are harmless, the descriptor is readable exactly while an event is
//! pending, solicited-only arms, and batched acknowledgement.
#![cfg(feature = "sim")]

use std::time::Duration;

use zverbs::provider::sim::{FabricConfig, Sim};
use zverbs::qp::{InitOptions, QpConfig, QueuePair};
use zverbs::testing::EventedPair;
use zverbs::{CompletionQueue, RecvWr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};

const NOW: Option<Duration> = Some(Duration::ZERO);

/// A sender (`a`) connected to a receiver (`b`) whose one CQ reports to `ch`.
struct Ends(EventedPair);

impl std::ops::Deref for Ends {
    type Target = EventedPair;
    fn deref(&self) -> &EventedPair {
        &self.0
    }
}

fn ends(sim: &Sim) -> Ends {
    Ends(EventedPair::connected_on(sim, 64).unwrap())
}

/// A stepped fabric whose polls do not step: time moves only when the test says so.
fn stepped(seed: u64) -> Sim {
    let cfg = FabricConfig {
        auto_step: false,
        ..FabricConfig::stepped(seed)
    };
    Sim::with_config(cfg, 2)
}

impl Ends {
    /// `b` posts a receive and `a` an empty send with `flags`.
    fn send(&self, id: u64, flags: SendFlags) {
        // SAFETY: no scatter or gather entries: the requests name no memory.
        unsafe {
            self.b.post_recv(&[RecvWr::<1>::new(id)]).unwrap();
            self.a
                .post_send(&[SendWr::<1>::new(id, SendOp::Send, flags)])
                .unwrap();
        }
    }

    /// Everything in `b`'s CQ now.
    fn poll_b(&self) -> Vec<WorkCompletion> {
        let mut wcs = [WorkCompletion::EMPTY; 8];
        let n = self.b_cq.poll(&mut wcs).unwrap();
        wcs[..n].to_vec()
    }

    /// Takes every pending event and hands it to `b`'s CQ; how many there were.
    fn take_events(&self) -> usize {
        let mut n = 0;
        while let Some(ev) = self.ch.try_get_event().unwrap() {
            self.b_cq.ack_event(ev).unwrap();
            n += 1;
        }
        n
    }
}

/// The race the order exists for, placed deterministically: the completion lands after
/// the consumer's empty poll and before its arm. An arm does not look back, so the
/// descriptor stays silent (the naive order, poll-arm-sleep, would sleep forever); the
/// poll after the arm finds the completion.
#[test]
fn a_completion_between_the_empty_poll_and_the_arm_is_found_by_polling_again() {
    let sim = stepped(11);
    let e = ends(&sim);
    e.send(1, SendFlags::empty());
    assert!(e.poll_b().is_empty(), "nothing has moved yet");
    // The completion arrives now, between the poll and the arm.
    sim.fabric().run_until_idle();
    e.b_cq.arm(false).unwrap();
    assert!(
        !e.ch.wait_readable(NOW).unwrap(),
        "no event: a consumer sleeping now would never wake"
    );
    let wcs = e.poll_b();
    assert_eq!(
        wcs.len(),
        1,
        "the poll after the arm finds it: no wake-up lost"
    );
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));

    // Nothing left: the consumer may sleep, and the next completion wakes it.
    assert!(e.poll_b().is_empty());
    e.send(2, SendFlags::empty());
    assert!(!e.ch.wait_readable(NOW).unwrap());
    sim.fabric().run_until_idle();
    assert!(e.ch.wait_readable(NOW).unwrap());
    assert_eq!(e.take_events(), 1);
    assert_eq!(e.poll_b().len(), 1);
}

/// An event whose completions were already taken (by the poll after the arm, or another
/// thread) costs one empty poll.
#[test]
fn a_spurious_event_is_handled() {
    let sim = stepped(12);
    let e = ends(&sim);
    e.b_cq.arm(false).unwrap();
    e.send(1, SendFlags::empty());
    sim.fabric().run_until_idle();
    // The consumer's poll after arming races the completion and wins it.
    assert_eq!(e.poll_b().len(), 1);
    // The event is still pending: spurious now.
    assert!(e.ch.wait_readable(NOW).unwrap());
    assert_eq!(e.take_events(), 1);
    assert!(e.poll_b().is_empty(), "nothing behind the event");
    e.b_cq.arm(false).unwrap();
    assert!(e.poll_b().is_empty());
    assert!(!e.ch.wait_readable(NOW).unwrap(), "back to sleep, safely");
    drop(e);
    assert_eq!(sim.fabric().unacked_events_destroyed(), 0);
}

/// `poll(2)` with a zero timeout says readable exactly while an event is pending.
#[test]
fn the_descriptor_is_readable_exactly_while_an_event_is_pending() {
    let sim = stepped(13);
    let e = ends(&sim);
    let readable = || e.ch.wait_readable(NOW).unwrap();
    assert!(!readable());
    e.send(1, SendFlags::empty());
    sim.fabric().run_until_idle();
    assert!(!readable(), "a completion without an arm raises nothing");
    e.b_cq.arm(false).unwrap();
    e.send(2, SendFlags::empty());
    e.send(3, SendFlags::empty());
    sim.fabric().run_until_idle();
    assert!(readable());
    assert_eq!(
        e.take_events(),
        1,
        "one arm, one event, however many completions"
    );
    assert!(!readable());
    // Two arms with the events left pending: readable until both are taken.
    for id in [4, 5] {
        e.b_cq.arm(false).unwrap();
        e.send(id, SendFlags::empty());
        sim.fabric().run_until_idle();
        assert!(readable());
    }
    let ev = e.ch.try_get_event().unwrap().unwrap();
    e.b_cq.ack_event(ev).unwrap();
    assert!(readable(), "one event still pending");
    assert_eq!(e.take_events(), 1);
    assert!(!readable());
    assert_eq!(e.poll_b().len(), 5);
}

/// A solicited-only arm ignores plain receives and send completions, and fires for a
/// receive of a request sent with SOLICITED.
#[test]
fn a_solicited_only_arm_waits_for_a_solicited_receive() {
    let sim = stepped(14);
    let e = ends(&sim);
    e.b_cq.arm(true).unwrap();
    e.send(1, SendFlags::SIGNALED);
    sim.fabric().run_until_idle();
    assert!(!e.ch.wait_readable(NOW).unwrap());
    assert_eq!(e.poll_b().len(), 1, "the receive is there, unannounced");
    e.send(2, SendFlags::SOLICITED);
    sim.fabric().run_until_idle();
    assert!(e.ch.wait_readable(NOW).unwrap());
    assert_eq!(e.take_events(), 1);
    assert_eq!(e.poll_b()[0].wr_id, 2);
}

/// A thread asleep on the descriptor of the untimed fabric is woken by a completion
/// another thread's post makes.
#[test]
fn a_sleeper_is_woken_by_another_threads_post() {
    let sim = Sim::with_devices(2);
    let e = ends(&sim);
    e.b_cq.arm(false).unwrap();
    assert!(e.poll_b().is_empty());
    std::thread::scope(|s| {
        let sleeper = s.spawn(|| e.ch.wait_readable(Some(Duration::from_secs(10))));
        std::thread::sleep(Duration::from_millis(20));
        e.send(1, SendFlags::empty());
        assert!(sleeper.join().unwrap().unwrap());
    });
    assert_eq!(e.take_events(), 1);
    assert_eq!(e.poll_b().len(), 1);
}

/// Events are acknowledged 16 at a time, the rest when the queue is dropped; an event of
/// another queue is handed back.
#[test]
fn events_are_acknowledged_in_batches_and_on_drop() {
    let sim = Sim::with_devices(2);
    let e = ends(&sim);
    e.b.set_error().unwrap(); // every receive now completes at once (flushed)
    for id in 0..20 {
        e.b_cq.arm(false).unwrap();
        // SAFETY: no scatter entries.
        unsafe { e.b.post_recv(&[RecvWr::<1>::new(id)]) }.unwrap();
        let ev = e.ch.try_get_event().unwrap().expect("one event per arm");
        assert!(e.b_cq.owns(&ev));
        assert_eq!(ev.key(), e.b_cq.key());
        e.b_cq.ack_event(ev).unwrap();
    }
    assert_eq!(
        e.b_cq.raw().unacked_events(),
        4,
        "16 acknowledged, 4 held back"
    );

    let other = CompletionQueue::create_on(&e.ctx[1], 4, &e.ch).unwrap();
    other.arm(false).unwrap();
    let qp = QueuePair::create(&e.ctx[1], &e.pd[1], &other, &other, &QpConfig::default());
    let qp = qp.unwrap().into_init(&InitOptions::default()).ok().unwrap();
    // SAFETY: no scatter entries.
    unsafe { qp.post_recv(&[RecvWr::<1>::new(99)]) }.unwrap();
    qp.set_error().unwrap();
    let ev = e.ch.try_get_event().unwrap().unwrap();
    let ev = e
        .b_cq
        .ack_event(ev)
        .expect_err("another queue's event is handed back");
    other.ack_event(ev).unwrap();
    drop((qp, other));
    drop(e);
    assert_eq!(sim.fabric().unacked_events_destroyed(), 0);
}
