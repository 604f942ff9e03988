//! `SrqGroup`: many peers, one shared receive queue, one completion queue, no `unsafe`.
#![cfg(feature = "sim")]

use std::time::Duration;

use zverbs::provider::sim::Sim;
use zverbs::qp::{RtrOptions, RtsOptions};
use zverbs::srq::{GroupEvent, RecvSlot, SlotsConfig, SrqGroup, SrqGroupConfig};
use zverbs::{Context, Error, ErrorKind};

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

const STEP: Duration = Duration::from_secs(5);

struct Two {
    a: SrqGroup<Sim>,
    b: SrqGroup<Sim>,
    _ctx: [Context<Sim>; 2],
}

/// Groups of `peers` on two devices, queue pair i of one connected to i of the other.
fn two(peers: usize, cfg: &SrqGroupConfig) -> Two {
    let sim = Sim::with_devices(2);
    let ca = Context::open(&sim, "sim0").unwrap();
    let cb = Context::open(&sim, "sim1").unwrap();
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let a = SrqGroup::prepare(&ca, &pa, peers, cfg).unwrap();
    let b = SrqGroup::prepare(&cb, &pb, peers, cfg).unwrap();
    let (ea, eb) = (a.endpoints(), b.endpoints());
    let (rtr, rts) = (RtrOptions::default(), RtsOptions::default());
    Two {
        a: a.connect(&eb, &rtr, &rts).unwrap(),
        b: b.connect(&ea, &rtr, &rts).unwrap(),
        _ctx: [ca, cb],
    }
}

fn cfg(slots: u32, refill_at: u32) -> SrqGroupConfig {
    let receive = SlotsConfig {
        slots,
        size: 32,
        refill_at,
        ..SlotsConfig::default()
    };
    SrqGroupConfig {
        receive,
        ..SrqGroupConfig::default()
    }
}

/// Sends `msg` from `g`'s buffer for `peer`.
fn send(g: &mut SrqGroup<Sim>, peer: usize, msg: &[u8]) {
    g.send_buf(peer).unwrap()[..msg.len()].copy_from_slice(msg);
    g.send(peer, msg.len()).unwrap();
}

/// The next event of `g`, waiting up to [`STEP`].
fn next(g: &mut SrqGroup<Sim>) -> GroupEvent {
    let mut ev = [GroupEvent::None; 1];
    let n = g.wait(&mut ev, STEP).unwrap();
    assert_eq!(n, 1, "no event within {STEP:?}");
    ev[0]
}

/// Waits for `peer`'s send to complete.
fn sent(g: &mut SrqGroup<Sim>, peer: usize) {
    assert_eq!(next(g), GroupEvent::Sent { peer });
}

/// The next message at `g`: its peer, bytes and slot.
fn received(g: &mut SrqGroup<Sim>) -> (usize, Vec<u8>, RecvSlot) {
    match next(g) {
        GroupEvent::Received { peer, slot } => (peer, g.received(slot).unwrap().to_vec(), slot),
        other => panic!("expected a message, got {other:?}"),
    }
}

#[test]
fn messages_from_every_peer_arrive_named_by_their_peer() {
    let mut t = two(4, &cfg(8, 2));
    for p in [3, 0, 2, 1] {
        send(&mut t.a, p, format!("from {p}").as_bytes());
        sent(&mut t.a, p);
        let (peer, bytes, slot) = received(&mut t.b);
        assert_eq!((peer, bytes), (p, format!("from {p}").into_bytes()));
        t.b.release(slot).unwrap();
    }
    // And back: B answers each peer.
    for p in 0..4 {
        send(&mut t.b, p, &[p as u8; 3]);
        sent(&mut t.b, p);
        let (peer, bytes, slot) = received(&mut t.a);
        assert_eq!((peer, bytes), (p, vec![p as u8; 3]));
        t.a.release(slot).unwrap();
    }
}

#[test]
fn a_flooding_peer_does_not_starve_the_quiet_ones() {
    // Four slots; the receiver holds every message peer 0 sends until the SRQ is dry.
    let mut t = two(2, &cfg(4, 0));
    let mut held = Vec::new();
    for i in 0..4u8 {
        send(&mut t.a, 0, &[i]);
        sent(&mut t.a, 0);
        let (peer, bytes, slot) = received(&mut t.b);
        assert_eq!((peer, bytes), (0, vec![i]));
        held.push(slot);
    }
    // The SRQ is empty: both senders now wait on RNR NAKs, losing nothing.
    send(&mut t.a, 0, b"flood");
    send(&mut t.a, 1, b"quiet");
    let mut ev = [GroupEvent::None; 2];
    assert_eq!(
        t.b.poll(&mut ev).unwrap(),
        0,
        "nothing can land in a dry SRQ"
    );
    for slot in held {
        t.b.release(slot).unwrap();
    }
    let mut got: Vec<_> = (0..2)
        .map(|_| received(&mut t.b))
        .map(|(p, b, _)| (p, b))
        .collect();
    got.sort();
    assert_eq!(got, [(0, b"flood".to_vec()), (1, b"quiet".to_vec())]);
    let mut done: Vec<_> = (0..2).map(|_| next(&mut t.a)).collect();
    done.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(
        done,
        [GroupEvent::Sent { peer: 0 }, GroupEvent::Sent { peer: 1 }]
    );
}

/// The limit event drives a refill: with the count-driven refill off (`refill_at` 0), the
/// receiver holds five of eight slots and hands them back; the device's
/// `SRQ_LIMIT_REACHED` (fewer than four posted) handed to `on_async_event` posts them
/// again and arms the limit anew, so eight more messages land. A late event, after a
/// refill already happened, only arms again.
#[test]
fn the_limit_event_refills_and_a_late_one_only_rearms() {
    use zverbs::{AsyncEventKind, Context};
    let sim = Sim::with_devices(2);
    let (ca, cb) = (
        Context::open(&sim, "sim0").unwrap(),
        Context::open(&sim, "sim1").unwrap(),
    );
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    assert_eq!(
        cb.next_async_event().unwrap(),
        None,
        "the queue of events opens"
    );
    let mut b_cfg = cfg(8, 0);
    b_cfg.receive.limit = 4;
    let a = SrqGroup::prepare(&ca, &pa, 1, &cfg(8, 0)).unwrap();
    let b = SrqGroup::prepare(&cb, &pb, 1, &b_cfg).unwrap();
    let (ea, eb) = (a.endpoints(), b.endpoints());
    let (rtr, rts) = (RtrOptions::default(), RtsOptions::default());
    let (mut a, mut b) = (
        a.connect(&eb, &rtr, &rts).unwrap(),
        b.connect(&ea, &rtr, &rts).unwrap(),
    );
    let take = |a: &mut SrqGroup<Sim>, b: &mut SrqGroup<Sim>, n: u8| {
        let mut slots = Vec::new();
        for i in 0..n {
            send(a, 0, &[i]);
            sent(a, 0);
            let (peer, bytes, slot) = received(b);
            assert_eq!((peer, bytes), (0, vec![i]));
            slots.push(slot);
        }
        slots
    };
    for slot in take(&mut a, &mut b, 5) {
        b.release(slot).unwrap(); // free, not posted: three remain posted
    }
    let ev = cb
        .wait_async_event(Some(STEP))
        .unwrap()
        .expect("the limit event");
    assert_eq!(ev.kind, AsyncEventKind::SrqLimitReached);
    assert!(b.on_async_event(&ev).unwrap(), "the group's event");
    // Eight posted again: eight messages land without a release in between.
    let held = take(&mut a, &mut b, 8);
    assert_eq!(held.len(), 8);
    // Posted fell below four again, so the limit (armed anew) raised a second event. The
    // releases refill first (posted had reached 0, `refill_at`): the event, handed in
    // late, finds nothing to post and only arms again.
    for slot in held {
        b.release(slot).unwrap();
    }
    let ev = cb
        .wait_async_event(Some(STEP))
        .unwrap()
        .expect("armed again");
    assert_eq!(ev.kind, AsyncEventKind::SrqLimitReached);
    assert!(b.on_async_event(&ev).unwrap());
    assert!(
        b.on_async_event(&ev).unwrap(),
        "a late copy only arms again"
    );
    let other = zverbs::AsyncEvent {
        kind: AsyncEventKind::PortErr,
        element: zverbs::EventElement::Port(1),
    };
    assert!(!b.on_async_event(&other).unwrap(), "not the group's");
    assert_eq!(take(&mut a, &mut b, 8).len(), 8);
}

#[test]
fn the_data_path_does_not_allocate() {
    let mut t = two(2, &cfg(8, 2));
    let mut ev = [GroupEvent::None; 4];
    let ((), allocs) = zverbs_testkit::measure(|| {
        for i in 0..64u8 {
            let p = usize::from(i % 2);
            t.a.send_buf(p).unwrap()[0] = i;
            t.a.send(p, 1).unwrap();
            loop {
                let n = t.b.wait(&mut ev, STEP).unwrap();
                if let Some(GroupEvent::Received { slot, .. }) = ev[..n].first() {
                    assert_eq!(t.b.received(*slot).unwrap(), [i]);
                    t.b.release(*slot).unwrap();
                    break;
                }
            }
            assert_eq!(t.a.wait(&mut ev, STEP).unwrap(), 1);
        }
    });
    assert_eq!(allocs.count, 0, "allocations on the data path");
}

#[test]
fn bad_calls_are_typed_errors() {
    let mut t = two(2, &cfg(4, 1));
    assert!(matches!(
        t.a.send(2, 1),
        Err(Error::NoSuchPeer {
            peer: 2,
            capacity: 2
        })
    ));
    assert!(matches!(t.a.send(0, 33), Err(Error::InvalidAttribute(_))));
    send(&mut t.a, 0, b"x");
    assert!(
        matches!(t.a.send_buf(0), Err(Error::QueueFull { .. })),
        "in flight"
    );
    assert!(matches!(t.a.send(0, 1), Err(Error::QueueFull { .. })));
    sent(&mut t.a, 0);
    let (_, _, slot) = received(&mut t.b);
    t.b.release(slot).unwrap();
    assert!(
        matches!(t.b.received(slot), Err(Error::InvalidAttribute(_))),
        "handed back"
    );
    assert!(
        matches!(t.b.release(slot), Err(Error::InvalidAttribute(_))),
        "twice"
    );

    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    for (peers, c) in [(0, cfg(4, 1)), (1, cfg(0, 0)), (1, cfg(4, 4))] {
        let e = SrqGroup::prepare(&ctx, &pd, peers, &c)
            .err()
            .expect("refused");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{peers} {c:?}: {e}");
    }
    let huge = cfg(1 << 15, 1); // within max_cqe, past max_srq_wr
    let e = SrqGroup::prepare(&ctx, &pd, 1, &huge)
        .err()
        .expect("past max_srq_wr");
    assert!(
        matches!(
            e,
            Error::ExceedsDevice {
                field: "srq.max_wr",
                ..
            }
        ),
        "{e}"
    );
}
