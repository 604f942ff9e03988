//! The device's asynchronous events on the simulator, through `Context`: a port going
//! down and up, a device dying, a completion queue overflowing — each queued for every
//! context of the device that asked for its events, in order, on a descriptor readable
//! exactly while one is queued.
#![cfg(feature = "sim")]

use std::time::{Duration, Instant};

use zverbs::provider::sim::Sim;
use zverbs::testing::Loopback;
use zverbs::{AsyncEvent, AsyncEventKind as K, Context, EventElement, QpCaps};
use zverbs::{RecvWr, SendFlags, SendOp, SendWr};

const NOW: Option<Duration> = Some(Duration::ZERO);

fn port(kind: K) -> AsyncEvent {
    AsyncEvent {
        kind,
        element: EventElement::Port(1),
    }
}

/// Every event queued now.
fn drain(ctx: &Context<Sim>) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| ctx.wait_async_event(NOW).unwrap()).collect()
}

fn readable(ctx: &Context<Sim>) -> bool {
    let mut pfd = libc::pollfd {
        fd: ctx.async_event_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call; poll(2) writes only its `revents`.
    unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
}

#[test]
fn a_port_going_down_and_up_reaches_every_context_in_order() {
    let sim = Sim::with_devices(2);
    let (a, b) = (
        Context::open(&sim, "sim0").unwrap(),
        Context::open(&sim, "sim0").unwrap(),
    );
    let other = Context::open(&sim, "sim1").unwrap();
    for ctx in [&a, &b, &other] {
        assert_eq!(ctx.next_async_event().unwrap(), None);
        assert!(!readable(ctx));
    }
    sim.fabric().link_down(0).unwrap();
    sim.fabric().link_down(0).unwrap(); // already down: nothing new
    sim.fabric().link_up(0).unwrap();
    assert!(readable(&a));
    let both = [port(K::PortErr), port(K::PortActive)];
    assert_eq!(drain(&a), both);
    assert!(!readable(&a), "readable only while an event is queued");
    assert_eq!(drain(&b), both);
    assert_eq!(drain(&other), []);
}

#[test]
fn a_crash_is_device_fatal() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    assert_eq!(ctx.next_async_event().unwrap(), None);
    sim.fabric().crash(0).unwrap();
    let fatal = AsyncEvent {
        kind: K::DeviceFatal,
        element: EventElement::Device,
    };
    assert_eq!(drain(&ctx), [fatal]);
    // Nothing more: a dead device's port does not come back.
    sim.fabric().link_up(0).unwrap();
    assert_eq!(drain(&ctx), []);
}

/// Two sends to itself with their receives: four completions for a queue of one entry.
#[test]
fn an_overflowing_completion_queue_is_named_by_its_key() {
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let lb = Loopback::new(caps, 1).unwrap();
    assert_eq!(lb.ctx.next_async_event().unwrap(), None);
    let depth = lb.cq.depth();
    let n = depth as u64 + 1;
    for id in 0..n {
        // SAFETY: no scatter or gather entries: the requests name no memory.
        unsafe {
            lb.qp.post_recv(&[RecvWr::<1>::new(id)]).unwrap();
            lb.qp
                .post_send(&[SendWr::<1>::new(id, SendOp::Send, SendFlags::SIGNALED)])
                .unwrap();
        }
    }
    let overflow = AsyncEvent {
        kind: K::CqErr,
        element: EventElement::Cq(lb.cq.key()),
    };
    assert_eq!(drain(&lb.ctx), [overflow]);
}

#[test]
fn a_wait_with_nothing_to_come_ends_at_its_timeout() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let t = Duration::from_millis(50);
    let start = Instant::now();
    assert_eq!(ctx.wait_async_event(Some(t)).unwrap(), None);
    let took = start.elapsed();
    assert!(took >= t && took < 10 * t, "{took:?}");
}
