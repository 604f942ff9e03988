//! Unit tests of the endpoint's calls; the protocol under loss is in `tests/rpc_core.rs`.

use super::*;

fn small() -> Config {
    Config {
        max_sessions: 2,
        window: 2,
        credits: 4,
        mtu: 64,
        max_msg_size: 200,
        ..Config::default()
    }
}

#[test]
fn config_ranges() {
    let bad = |f: &dyn Fn(&mut Config)| {
        let mut c = small();
        f(&mut c);
        let e = RpcCore::new(c).unwrap_err();
        assert!(matches!(e, RpcError::InvalidConfig(_)), "{e}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    };
    bad(&|c| c.max_sessions = 0);
    bad(&|c| c.max_sessions = 65_537);
    bad(&|c| c.window = 0);
    bad(&|c| c.window = 65);
    bad(&|c| c.credits = 0);
    bad(&|c| c.mtu = HEADER_LEN);
    bad(&|c| c.mtu = HEADER_LEN + 65_536);
    bad(&|c| c.max_msg_size = 40 * 65_536 + 1); // 65,537 packets of 40 bytes
    bad(&|c| c.rto_ns = 0);
    bad(&|c| c.session_timeout_ns = 0);
    bad(&|c| c.handshake_tries = 0);
    bad(&|c| {
        c.max_sessions = 65_536;
        c.window = 64;
        c.max_msg_size = 1 << 31;
        c.mtu = HEADER_LEN + 65_535;
    });
    assert!(RpcCore::new(small()).is_ok());
    assert_eq!(Config::default().limits().data_per_pkt, 1000);
}

#[test]
fn calls_on_wrong_sessions_and_handles() {
    let mut e = RpcCore::new(small()).unwrap();
    let s = e.connect(9).unwrap();
    let t = e.connect(9).unwrap();
    assert_eq!(e.connect(9), Err(RpcError::NoFreeSession));
    assert_eq!(e.enqueue_request(s, 0, b"x"), Err(RpcError::NotConnected));
    assert!(!e.is_connected(s));
    assert_eq!(e.in_flight(s), Some(0));
    let handle = RequestHandle {
        session: s,
        req_num: 0,
    };
    assert_eq!(e.response(handle), Err(RpcError::StaleHandle));
    assert_eq!(e.release(handle), Err(RpcError::StaleHandle));
    let sh = ServerHandle {
        session: s,
        req_num: 0,
    };
    assert_eq!(e.request(sh), Err(RpcError::StaleHandle));
    assert_eq!(e.respond(sh, b"y"), Err(RpcError::StaleHandle));
    // A connecting session closes at once; its number is reused with a new generation.
    e.disconnect(s).unwrap();
    assert_eq!(e.poll_event(), Some(Event::Disconnected(s)));
    assert_eq!(e.disconnect(s), Err(RpcError::UnknownSession));
    let s2 = e.connect(9).unwrap();
    assert_eq!(s2.index(), s.index());
    assert_ne!(s2, s);
    assert_eq!(e.in_flight(s), None);
    let _ = t;
}

/// `respond_with` hands the handler the request and the whole response buffer, caps
/// the length it returns, and answers once.
#[test]
fn respond_with_writes_in_place() {
    let (mut c, mut sv) = (
        RpcCore::new(small()).unwrap(),
        RpcCore::new(small()).unwrap(),
    );
    let s = c.connect(2).unwrap();
    let mut buf = [0; 64];
    let mut pump = |c: &mut RpcCore, sv: &mut RpcCore| {
        while let Some(t) = c.poll_transmit(0, &mut buf) {
            sv.handle_packet(0, 1, &buf[..t.len]);
        }
        while let Some(t) = sv.poll_transmit(0, &mut buf) {
            c.handle_packet(0, 2, &buf[..t.len]);
        }
    };
    pump(&mut c, &mut sv);
    assert_eq!(c.poll_event(), Some(Event::Connected(s)));
    assert!(matches!(
        sv.poll_event(),
        Some(Event::Accepted { from: 1, .. })
    ));
    let mut handles = Vec::new();
    for msg in [&b"abc"[..], b"xy"] {
        let h = c.enqueue_request(s, 4, msg).unwrap();
        pump(&mut c, &mut sv);
        let Some(Event::Request { handle, .. }) = sv.poll_event() else {
            panic!("no request");
        };
        let big = msg.len() == 2; // claims more than the buffer holds
        sv.respond_with(handle, |req, out| {
            assert_eq!((req, out.len()), (msg, 200));
            for (o, b) in out.iter_mut().zip(req.iter().rev()) {
                *o = *b;
            }
            if big {
                usize::MAX
            } else {
                req.len()
            }
        })
        .unwrap();
        assert_eq!(sv.respond(handle, b"again"), Err(RpcError::StaleHandle));
        for _ in 0..10 {
            pump(&mut c, &mut sv); // 200 bytes: five packets pulled by RFRs
        }
        assert!(matches!(c.poll_event(), Some(Event::Response { .. })));
        handles.push(h);
    }
    assert_eq!(c.response(handles[0]).unwrap(), b"cba");
    let long = c.response(handles[1]).unwrap();
    assert_eq!((long.len(), &long[..2]), (200, &b"yx"[..]));
}

#[test]
fn poll_transmit_needs_an_mtu_of_room() {
    let mut e = RpcCore::new(small()).unwrap();
    e.connect(3).unwrap();
    assert_eq!(e.poll_transmit(0, &mut [0; 63]), None);
    let mut buf = [0; 64];
    let t = e.poll_transmit(0, &mut buf).unwrap();
    assert_eq!(
        t,
        Transmit {
            to: 3,
            len: HEADER_LEN
        }
    );
    let h = Header::decode(&buf[..t.len]).unwrap();
    assert_eq!((h.pkt_type, h.msg_size), (PktType::ConnectReq, 64));
    assert_eq!(e.poll_transmit(0, &mut buf), None);
    assert_eq!(e.next_timeout(), Some(5_000_000));
    assert_eq!(e.stats().tx_packets, 1);
}

#[test]
fn error_kinds_and_display() {
    use ErrorKind as K;
    for (e, k) in [
        (RpcError::NoFreeSession, K::OutOfResources),
        (RpcError::UnknownSession, K::InvalidArgument),
        (RpcError::NotConnected, K::InvalidState),
        (RpcError::SessionFailed, K::InvalidState),
        (RpcError::WindowFull { window: 8 }, K::QueueFull),
        (RpcError::TooLarge { len: 9, max: 8 }, K::InvalidArgument),
        (RpcError::StaleHandle, K::InvalidArgument),
        (RpcError::Busy { outstanding: 1 }, K::Busy),
        (RpcError::TimedOut, K::Timeout),
        (RpcError::HandshakeTimedOut, K::Timeout),
        (RpcError::Refused(Refusal::NoFreeSession), K::OutOfResources),
        (RpcError::Refused(Refusal::Version), K::Unsupported),
        (RpcError::Refused(Refusal::Mtu), K::Unsupported),
    ] {
        assert_eq!(e.kind(), k, "{e:?}");
        assert!(!e.to_string().is_empty());
    }
    for r in [Refusal::NoFreeSession, Refusal::Version, Refusal::Mtu] {
        assert_eq!(Refusal::from_status(r.to_status()), Some(r));
        assert!(r.to_status() <= header::MAX_STATUS);
    }
    assert_eq!(Refusal::from_status(0), None);
}

/// Moves every datagram between `a` (named 1) and `b` (named 2) at `now` until quiet;
/// returns each side's events.
fn exchange(a: &mut RpcCore, b: &mut RpcCore, now: u64) -> (Vec<Event>, Vec<Event>) {
    let mut buf = [0u8; 64];
    loop {
        let mut moved = false;
        while let Some(t) = a.poll_transmit(now, &mut buf) {
            b.handle_packet(now, 1, &buf[..t.len]);
            moved = true;
        }
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            a.handle_packet(now, 2, &buf[..t.len]);
            moved = true;
        }
        if !moved {
            break;
        }
    }
    (
        core::iter::from_fn(|| a.poll_event()).collect(),
        core::iter::from_fn(|| b.poll_event()).collect(),
    )
}

/// A client that connects and then says nothing loses its server session after the idle
/// timeout (never while one of its requests is in a handler), and the entry serves the
/// next client.
#[test]
fn idle_serving_sessions_close() {
    const IDLE: u64 = 1_000_000;
    let cfg = Config {
        max_sessions: 1,
        idle_timeout_ns: IDLE,
        ..small()
    };
    let (mut client, mut server) = (
        RpcCore::new(cfg.clone()).unwrap(),
        RpcCore::new(cfg).unwrap(),
    );
    let s = client.connect(2).unwrap();
    let (_, accepted) = exchange(&mut client, &mut server, 0);
    assert!(
        matches!(accepted[..], [Event::Accepted { .. }]),
        "{accepted:?}"
    );
    // A request in a handler holds the session past the idle timeout.
    client.enqueue_request(s, 1, b"x").unwrap();
    let (_, got) = exchange(&mut client, &mut server, 10);
    let Some(Event::Request { handle, .. }) = got.first().copied() else {
        panic!("{got:?}");
    };
    assert_eq!(
        server.next_timeout(),
        None,
        "no idle timer while a handler runs"
    );
    server.handle_timeout(10 + 5 * IDLE);
    assert!(server.poll_event().is_none());
    server.respond(handle, b"y").unwrap();
    let (done, _) = exchange(&mut client, &mut server, 20);
    assert!(matches!(done[..], [Event::Response { .. }]), "{done:?}");
    // Then silence: the session closes one idle timeout after the client was last heard
    // (its request, at 10: the response needs no answer).
    let due = server.next_timeout().expect("the idle timer runs");
    assert_eq!(due, 10 + IDLE);
    server.handle_timeout(due - 1);
    assert!(server.poll_event().is_none());
    server.handle_timeout(due);
    assert!(matches!(server.poll_event(), Some(Event::Disconnected(_))));
    // The entry is free again: a second client (named 1 too) gets it.
    let mut other = RpcCore::new(Config {
        max_sessions: 1,
        ..small()
    })
    .unwrap();
    other.connect(2).unwrap();
    let (ev, accepted) = exchange(&mut other, &mut server, due + 1);
    assert!(matches!(ev[..], [Event::Connected(_)]), "{ev:?}");
    assert!(
        matches!(accepted[..], [Event::Accepted { .. }]),
        "{accepted:?}"
    );
}
