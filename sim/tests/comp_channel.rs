//! Completion channels: one-shot arming, solicited-only arms, events withdrawn at destroy,
//! and a sleeper woken in threaded mode with a timed link.

mod common;

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use zverbs_sim::*;

/// One end whose CQ reports to its own channel.
struct Evented {
    side: Side,
    ch: CompChannel,
}

fn evented(fabric: &Fabric, dev: &str, cfg: &Cfg) -> Evented {
    let ctx = fabric.open_device(dev).unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_on(cfg.cq_depth, &ch).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: cfg.cap,
            sq_sig_all: false,
        })
        .unwrap();
    Evented {
        side: Side { ctx, pd, cq, qp },
        ch,
    }
}

/// Two connected ends on `fabric`, each CQ on its own channel.
fn evented_pair(fabric: &Fabric) -> (Evented, Evented) {
    let cfg = Cfg::default();
    let (a, b) = (evented(fabric, "sim0", &cfg), evented(fabric, "sim1", &cfg));
    let (la, lb) = (lid(&a.side), lid(&b.side));
    let (qa, qb) = (a.side.qp.qp_num(), b.side.qp.qp_num());
    connect(&a.side.qp, cfg.access, rtr_attr(qb, lb, 4));
    connect(&b.side.qp, cfg.access, rtr_attr(qa, la, 4));
    (a, b)
}

/// Posts one receive on `b` and a send with `flags` from `a`.
fn send(a: &Evented, b: &Evented, id: u64, flags: SendFlags) {
    b.side.qp.post_recv(&[rwr(id, &[])]).unwrap();
    a.side
        .qp
        .post_send(&[swr(id, SendOp::Send, &[], flags)])
        .unwrap();
}

#[test]
fn an_arm_raises_one_event_for_the_next_completion() {
    let f = Fabric::with_devices(2);
    let (a, b) = evented_pair(&f);
    let cq = &b.side.cq;
    send(&a, &b, 1, SendFlags::empty());
    cq.req_notify(false).unwrap();
    // The completion was there before the arm: no event, it must be found by polling.
    assert_eq!(b.ch.pending(), 0);
    assert_eq!(drain(cq).len(), 1);
    send(&a, &b, 2, SendFlags::empty());
    send(&a, &b, 3, SendFlags::empty());
    // One-shot: two completions, one event.
    assert_eq!(b.ch.pending(), 1);
    assert_eq!(b.ch.get_event(), Some(cq.key()));
    assert_eq!(b.ch.get_event(), None);
    assert_eq!(cq.unacked_events(), 1);
    cq.ack_events(1);
    assert_eq!(cq.unacked_events(), 0);
    assert_eq!(drain(cq).len(), 2);
    // Nothing on the sender's channel: its CQ was never armed.
    assert_eq!(a.ch.pending(), 0);
}

#[test]
fn solicited_only_arms_wait_for_a_solicited_receive_or_an_error() {
    let f = Fabric::with_devices(2);
    let (a, b) = evented_pair(&f);
    b.side.cq.req_notify(true).unwrap();
    send(&a, &b, 1, SendFlags::SIGNALED);
    assert_eq!(b.ch.pending(), 0, "an unsolicited receive raises nothing");
    send(&a, &b, 2, SendFlags::SOLICITED);
    assert_eq!(b.ch.get_event(), Some(b.side.cq.key()));
    b.side.cq.ack_events(1);

    // A successful send completion is never solicited; an error always is.
    a.side.cq.req_notify(true).unwrap();
    send(&a, &b, 3, SendFlags::SIGNALED | SendFlags::SOLICITED);
    assert_eq!(a.ch.pending(), 0);
    a.side.qp.post_recv(&[rwr(9, &[])]).unwrap();
    a.side.qp.modify(&Transition::Error).unwrap(); // flushes the receive
    assert_eq!(a.ch.get_event(), Some(a.side.cq.key()));
    a.side.cq.ack_events(1);
}

#[test]
fn several_cqs_share_a_channel_and_each_event_names_its_cq() {
    let f = Fabric::with_devices(1);
    let ctx = f.open_device("sim0").unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let (c1, c2) = (
        ctx.create_cq_on(4, &ch).unwrap(),
        ctx.create_cq_on(4, &ch).unwrap(),
    );
    assert_ne!(c1.key(), c2.key());
    let pd = ctx.alloc_pd().unwrap();
    let cap = Cfg::default().cap;
    let qp = |cq: &Cq| {
        let qp = pd
            .create_qp(&QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                cap,
                sq_sig_all: false,
            })
            .unwrap();
        qp.modify(&Transition::Init(init_attr(AccessFlags::empty())))
            .unwrap();
        qp
    };
    let (q1, q2) = (qp(&c1), qp(&c2));
    c1.req_notify(false).unwrap();
    c2.req_notify(false).unwrap();
    q2.post_recv(&[rwr(2, &[])]).unwrap();
    q1.post_recv(&[rwr(1, &[])]).unwrap();
    q2.modify(&Transition::Error).unwrap();
    q1.modify(&Transition::Error).unwrap();
    assert_eq!(ch.get_event(), Some(c2.key()));
    assert_eq!(ch.get_event(), Some(c1.key()));
    c1.ack_events(1);
    c2.ack_events(1);
}

#[test]
fn destroying_a_cq_withdraws_its_events_and_counts_the_unacknowledged() {
    let f = Fabric::with_devices(2);
    let (a, b) = evented_pair(&f);
    b.side.cq.req_notify(false).unwrap();
    send(&a, &b, 1, SendFlags::empty());
    assert_eq!(b.ch.get_event(), Some(b.side.cq.key()));
    b.side.cq.req_notify(false).unwrap();
    send(&a, &b, 2, SendFlags::empty());
    assert_eq!(b.ch.pending(), 1);
    let Evented { side, ch } = b;
    drop(side); // QP, then PD and CQ: one event taken and never acknowledged
    assert_eq!(ch.pending(), 0, "the queued event went with its CQ");
    assert_eq!(f.unacked_events_destroyed(), 1);
}

#[test]
fn a_cq_on_another_devices_channel_is_refused() {
    let f = Fabric::with_devices(2);
    let ch = f
        .open_device("sim0")
        .unwrap()
        .create_comp_channel()
        .unwrap();
    let other = f.open_device("sim1").unwrap();
    assert!(matches!(
        other.create_cq_on(4, &ch),
        Err(SimError::Invalid(_))
    ));
}

/// A byte read from a duplicate of `ch`'s descriptor, blocking up to `timeout`: whether
/// the descriptor became readable (the byte is consumed: the channel's last `get_event`
/// then finds the socket empty, which it tolerates).
fn readable_within(ch: &CompChannel, timeout: Duration) -> bool {
    let fd = ch.as_fd().try_clone_to_owned().unwrap();
    let mut s = UnixStream::from(fd);
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    let got = s.read(&mut [0u8; 1]).is_ok_and(|n| n == 1);
    // The flags are the channel's own (a duplicate shares them): give them back.
    s.set_read_timeout(None).unwrap();
    s.set_nonblocking(true).unwrap();
    got
}

#[test]
fn threaded_timed_fabric_wakes_a_sleeper_without_calls() {
    // 1 µs links and real timers: the ACK arrives while this thread sleeps on the
    // descriptor, with nobody calling into the fabric; the clock thread delivers it.
    let f = Fabric::with_config(FabricConfig::default(), 2);
    let (a, b) = evented_pair(&f);
    a.side.cq.req_notify(false).unwrap();
    send(&a, &b, 1, SendFlags::SIGNALED);
    assert!(readable_within(&a.ch, Duration::from_secs(5)));
}

#[test]
fn stepped_fabric_raises_events_only_as_it_steps() {
    let f = stepped(3, Faults::none(), 2);
    let (a, b) = evented_pair(&f);
    a.side.cq.req_notify(false).unwrap();
    send(&a, &b, 1, SendFlags::SIGNALED);
    assert_eq!(a.ch.pending(), 0);
    f.run_until_idle();
    assert_eq!(a.ch.get_event(), Some(a.side.cq.key()));
    a.side.cq.ack_events(1);
    assert_eq!(drain(&a.side.cq).len(), 1);
}
