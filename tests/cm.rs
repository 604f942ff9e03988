//! Connections through the connection manager on the simulator (`zverbs::cm`): connect
//! and accept with private data both ways, then data over the channel; and every way it
//! goes wrong — an unknown address, a route over a port that is down, nobody listening, a
//! reject with a reason, a listener that never answers or is dropped with requests
//! pending, private data past the limit, a stranger's garbage, a peer that disconnects —
//! each a typed error within the call's timeout (bounded here at ten times it), the
//! listener still serving the others, and no id left behind.
#![cfg(feature = "sim")]

use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use zverbs::cm::{Answer, CmConnection, CmError, CmListener};
use zverbs::provider::cm::{REJECT_CONSUMER, REJECT_NO_LISTENER};
use zverbs::provider::sim::Sim;
use zverbs::{AccessFlags, ChannelConfig, Context, ProtectionDomain};

const T: Duration = Duration::from_secs(2);

/// Two devices: sim0 (10.0.0.1) and sim1 (10.0.0.2, where the listener is).
struct Two {
    sim: Sim,
    ctx: [Context<Sim>; 2],
    pd: [ProtectionDomain<Sim>; 2],
}

fn two() -> Two {
    let sim = Sim::with_devices(2);
    let ctx = [0, 1].map(|i| Context::open(&sim, &format!("sim{i}")).unwrap());
    let pd = [0, 1].map(|i| ctx[i].alloc_pd().unwrap());
    Two { sim, ctx, pd }
}

fn ip(i: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, i + 1])
}

fn at(i: u8, port: u16) -> SocketAddr {
    SocketAddr::new(ip(i), port)
}

fn cfg() -> ChannelConfig {
    ChannelConfig {
        timeout: Some(T),
        ..ChannelConfig::default()
    }
}

/// Sim0's connect to `dst` with `data`, bounded; its result.
fn connect(
    w: &Two,
    dst: SocketAddr,
    data: &[u8],
) -> Result<CmConnection<Sim>, CmError<zverbs::provider::sim::SimError>> {
    let start = Instant::now();
    let r = CmConnection::<Sim>::connect(
        &w.sim,
        &w.ctx[0],
        &w.pd[0],
        Some(ip(0)),
        dst,
        data,
        &cfg(),
        T,
    );
    assert!(start.elapsed() < 10 * T, "bounded: {:?}", start.elapsed());
    r
}

#[test]
fn connect_and_accept_carry_private_data_and_the_channel_moves_bytes() {
    let w = two();
    let listener = CmListener::bind(&w.sim, at(1, 7471)).unwrap();
    thread::scope(|s| {
        let server = s.spawn(|| {
            let mut conn = listener
                .accept_with::<64, 4>(&w.ctx[1], &w.pd[1], &cfg(), T, |hello| {
                    assert_eq!(hello.len(), 56, "a connect request's whole field");
                    assert!(hello.starts_with(b"client hello"));
                    Answer::accept(b"server hello")
                })
                .unwrap();
            assert!(conn.peer_data().starts_with(b"client hello"));
            let mut buf = [0u8; 16];
            let mut mr = w.pd[1].register(&mut buf).unwrap();
            let c = conn.channel().receive([mr.slice_mut(..).unwrap()]).unwrap();
            let n = c.byte_len as usize;
            (n, mr.as_slice()[..n].to_vec())
        });
        let mut client = connect(&w, at(1, 7471), b"client hello").unwrap();
        assert_eq!(client.peer_data().len(), 196, "an accept's whole field");
        assert!(client.peer_data().starts_with(b"server hello"));
        let mut msg = *b"over CM!";
        let mr = w.pd[0].register(&mut msg).unwrap();
        client.channel().send([mr.slice(..).unwrap()]).unwrap();
        let (n, got) = server.join().unwrap();
        assert_eq!((n, &got[..]), (8, &b"over CM!"[..]));
    });
    assert_eq!(w.sim.fabric().cm_ids(), 1, "only the listener's id is left");
}

#[test]
fn an_address_nobody_has_and_a_port_that_is_down_do_not_resolve() {
    let w = two();
    assert!(matches!(
        connect(&w, at(9, 7471), b""),
        Err(CmError::AddrError { .. })
    ));
    w.sim.fabric().link_down(1).unwrap();
    assert!(matches!(
        connect(&w, at(1, 7471), b""),
        Err(CmError::RouteError { .. })
    ));
    assert_eq!(w.sim.fabric().cm_ids(), 0);
}

#[test]
fn nobody_listening_is_rejected_by_the_manager() {
    let w = two();
    match connect(&w, at(1, 7471), b"anyone?") {
        Err(CmError::Rejected { status, .. }) => assert_eq!(status, REJECT_NO_LISTENER),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// A request whose private data is garbage is rejected with a reason; the listener goes
/// on and accepts the next.
#[test]
fn a_rejected_request_gets_the_reason_and_the_listener_serves_the_next() {
    let w = two();
    let listener = CmListener::bind(&w.sim, at(1, 0)).unwrap();
    let dst = listener.local_addr();
    thread::scope(|s| {
        let server = s.spawn(|| {
            listener.accept_with::<64, 4>(&w.ctx[1], &w.pd[1], &cfg(), T, |hello| {
                if hello.starts_with(b"ZV1") {
                    Answer::accept(b"")
                } else {
                    Answer::reject(b"bad magic")
                }
            })
        });
        match connect(&w, dst, &[0xff; 56]) {
            Err(CmError::Rejected {
                status,
                private_data,
            }) => {
                assert_eq!(status, REJECT_CONSUMER);
                assert!(private_data.starts_with(b"bad magic"));
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        let client = connect(&w, dst, b"ZV1 rank 3").unwrap();
        let server = server.join().unwrap().unwrap();
        assert!(server.peer_data().starts_with(b"ZV1 rank 3"));
        drop(client);
    });
}

#[test]
fn private_data_past_the_limit_is_refused_before_anything_is_sent() {
    let w = two();
    let _listener = CmListener::bind(&w.sim, at(1, 7471)).unwrap();
    match connect(&w, at(1, 7471), &[0; 57]) {
        Err(CmError::PrivateDataTooLong { len: 57, max: 56 }) => {}
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// An answer whose reply or reason is past its message's limit is not cut: the listener
/// refuses that request, its call fails with the limit, and the requester is rejected.
#[test]
fn an_answer_past_the_limit_fails_the_accept_and_refuses_the_request() {
    let w = two();
    let listener = CmListener::bind(&w.sim, at(1, 7471)).unwrap();
    let (ctx, pd) = (&w.ctx[1], &w.pd[1]);
    for (answer, max) in [
        (Answer::accept(&[1; 197]), 196),
        (Answer::reject(&[2; 149]), 148),
    ] {
        thread::scope(|s| {
            let server = s.spawn(|| listener.accept_with::<16, 4>(ctx, pd, &cfg(), T, |_| answer));
            match connect(&w, at(1, 7471), b"hi") {
                Err(CmError::Rejected { status, .. }) => assert_eq!(status, REJECT_CONSUMER),
                other => panic!("{:?}", other.map(|_| ())),
            }
            match server.join().unwrap() {
                Err(CmError::PrivateDataTooLong { len, max: m }) => {
                    assert_eq!((len, m), (max + 1, max))
                }
                other => panic!("{:?}", other.map(|_| ())),
            }
        });
    }
    drop(listener);
    assert_eq!(w.sim.fabric().cm_ids(), 0);
}

#[test]
fn a_listener_that_never_answers_is_a_timeout_and_one_dropped_rejects() {
    let w = two();
    let listener = CmListener::bind(&w.sim, at(1, 7471)).unwrap();
    match connect(&w, at(1, 7471), b"") {
        Err(CmError::Timeout { .. }) => {}
        other => panic!("{:?}", other.map(|_| ())),
    }
    // A request made while the listener goes: refused at once, by the listener's end if
    // the request was queued there (REJECT_CONSUMER), by the manager if it came after
    // (REJECT_NO_LISTENER). The id count cannot tell which: the first request's id may
    // still be queued at the listener.
    thread::scope(|s| {
        let client = s.spawn(|| connect(&w, at(1, 7471), b""));
        while w.sim.fabric().cm_ids() < 3 {
            thread::sleep(Duration::from_millis(1));
        }
        drop(listener);
        match client.join().unwrap() {
            Err(CmError::Rejected { status, .. }) => {
                assert!(
                    [REJECT_CONSUMER, REJECT_NO_LISTENER].contains(&status),
                    "{status}"
                )
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    });
    assert_eq!(w.sim.fabric().cm_ids(), 0);
}

#[test]
fn a_context_on_another_device_than_the_route_is_refused() {
    let w = two();
    let _listener = CmListener::bind(&w.sim, at(1, 7471)).unwrap();
    // No source: the route leaves from the destination's own device (sim1), not sim0.
    let r = CmConnection::<Sim>::connect(
        &w.sim,
        &w.ctx[0],
        &w.pd[0],
        None,
        at(1, 7471),
        b"",
        &cfg(),
        T,
    );
    assert!(
        matches!(r, Err(CmError::WrongDevice)),
        "{:?}",
        r.map(|_| ())
    );
}

/// The peer disconnects: this side sees it, and a write to its memory fails with a typed
/// error within the channel's timeout.
#[test]
fn a_disconnect_is_seen_by_the_peer_and_later_work_fails() {
    let w = two();
    let listener = CmListener::bind(&w.sim, at(1, 7471)).unwrap();
    let mut target = [0u8; 8];
    // SAFETY: `target` is not read while the peer may write it.
    let target = unsafe { w.pd[1].register_with_access(&mut target, AccessFlags::all()) }.unwrap();
    thread::scope(|s| {
        let server = s.spawn(|| {
            listener
                .accept::<64, 4>(&w.ctx[1], &w.pd[1], &cfg(), T)
                .unwrap()
        });
        let mut client = connect(&w, at(1, 7471), b"").unwrap();
        let server = server.join().unwrap();
        let mut msg = *b"8 bytes!";
        let mr = w.pd[0].register(&mut msg).unwrap();
        client
            .channel()
            .write([mr.slice(..).unwrap()], &target.remote())
            .unwrap();
        let _channel = server.disconnect(T).unwrap();
        let start = Instant::now();
        while !client.peer_disconnected().unwrap() {
            assert!(start.elapsed() < T, "the disconnect reaches the peer");
            thread::sleep(Duration::from_millis(1));
        }
        drop(_channel);
        let start = Instant::now();
        let r = client
            .channel()
            .write([mr.slice(..).unwrap()], &target.remote());
        assert!(r.is_err());
        assert!(start.elapsed() < 10 * T);
    });
}

/// A datagram service (`udaddy`'s exchange): the requester learns the answerer's queue
/// pair, the manager's Q_Key and the path; private data past the service request's limit
/// is refused; nobody listening is the manager's `Unreachable` (a service reply's
/// status 1), which [`CmError::nobody_listens`] names.
#[test]
fn a_datagram_service_is_resolved_and_its_limits_hold() {
    use zverbs::cm::resolve_datagram;
    use zverbs::provider::cm::UD_QKEY;
    let w = two();
    let listener = CmListener::bind_datagram(&w.sim, at(1, 7476)).unwrap();
    thread::scope(|s| {
        let server = s.spawn(|| listener.answer_datagram(4242, b"here", T).unwrap());
        let peer =
            resolve_datagram(&w.sim, &w.ctx[0], Some(ip(0)), at(1, 7476), b"where?", T).unwrap();
        assert!(server.join().unwrap().as_slice().starts_with(b"where?"));
        assert_eq!((peer.peer.qp_num, peer.peer.qkey), (4242, UD_QKEY));
        assert!(peer.reply.as_slice().starts_with(b"here"));
        assert_eq!(peer.peer.ah.dgid.unwrap().0[12..], [10, 0, 0, 2]);
    });
    let r = resolve_datagram(&w.sim, &w.ctx[0], Some(ip(0)), at(1, 7476), &[0; 181], T);
    assert!(matches!(
        r,
        Err(CmError::PrivateDataTooLong { len: 181, max: 180 })
    ));
    drop(listener);
    let r = resolve_datagram(&w.sim, &w.ctx[0], Some(ip(0)), at(1, 7476), b"", T);
    match r {
        Err(e @ CmError::Unreachable { status: 1 }) => assert!(e.nobody_listens()),
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert_eq!(w.sim.fabric().cm_ids(), 0);
}

/// A datagram service request that nobody serves, that its service refuses, or whose id
/// the service destroys unanswered ends as the verbs stack ends it: `Unreachable` with
/// the service reply's status (1, 2, 2) and its 136 bytes of private data; a reason past
/// those 136 is refused at the call.
#[test]
fn a_datagram_request_nobody_serves_or_its_service_refuses_is_unreachable() {
    use zverbs_sim::cm::{CmEventKind, ConnParam, PortSpace, SIDR_NO_LISTENER, SIDR_REJECT};
    let f = zverbs_sim::Fabric::with_devices(2);
    let (server, client) = (
        f.create_cm_channel().unwrap(),
        f.create_cm_channel().unwrap(),
    );
    let ask = || {
        let id = client.create_id(PortSpace::Ud).unwrap();
        id.resolve_addr(None, at(1, 7477)).unwrap();
        assert_eq!(client.get_event().unwrap().kind, CmEventKind::AddrResolved);
        id.resolve_route().unwrap();
        assert_eq!(client.get_event().unwrap().kind, CmEventKind::RouteResolved);
        id.connect(&ConnParam::default(), b"anyone?").unwrap();
        id
    };
    let outcome = || {
        let ev = client.get_event().unwrap();
        let data = ev.private_data.as_slice();
        (ev.kind, ev.status, data.len(), data.starts_with(b"go away"))
    };
    let _nobody = ask();
    assert_eq!(
        outcome(),
        (CmEventKind::Unreachable, SIDR_NO_LISTENER, 136, false)
    );
    let listener = server.create_id(PortSpace::Ud).unwrap();
    listener.bind(at(1, 7477)).unwrap();
    listener.listen().unwrap();
    let _refused = ask();
    let request = server.get_event().unwrap().request.unwrap();
    assert!(request.reject(&[0; 137]).is_err());
    request.reject(b"go away").unwrap();
    assert_eq!(
        outcome(),
        (CmEventKind::Unreachable, SIDR_REJECT, 136, true)
    );
    let _orphaned = ask();
    drop(server.get_event().unwrap().request.unwrap());
    assert_eq!(
        outcome(),
        (CmEventKind::Unreachable, SIDR_REJECT, 136, false)
    );
}
