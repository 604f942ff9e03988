#![cfg(feature = "sim")]
//! Liveness under faults: every wait returns within its timeout plus the grace,
//! with a typed error, also when the local device dies; a call's timeout bounds the whole
//! call; a final barrier strands no peer; connected means ready.
//!
//! Each test bounds wall time generously (many times the timeout): the point is that the
//! call returns at all, and within one timeout rather than one per request or per peer.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{pair, pair_on};
use zverbs::node::{Node, NodeConfig, PreparedNode};
use zverbs::provider::sim::Sim;
use zverbs::{
    Channel, ChannelConfig, Context, Endpoint, Error, ErrorKind, MultiChannel, SendFlags, SendOp,
    WcStatus,
};
use zverbs_sim::FabricConfig;

const TIMEOUT: Duration = Duration::from_millis(200);

/// Runs `f` on a thread and fails the test unless it returns within `bound`.
fn within<T: Send + 'static>(bound: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(bound)
        .unwrap_or_else(|_| panic!("did not return within {bound:?}"))
}

fn cfg(timeout: Duration) -> ChannelConfig {
    ChannelConfig {
        timeout: Some(timeout),
        ..ChannelConfig::default()
    }
}

// ---- 1. A dead local device never hangs a wait ----

/// A send stuck on RNR (the peer posts no receive, `rnr_retry` 7 retries forever) is in
/// flight when its own device dies: the wait gives up after its timeout, cannot flush a
/// dead device, discards the work through RESET and reports the device dead.
#[test]
fn dead_local_device_ends_a_blocking_wait() {
    let e = within(TIMEOUT * 10, || {
        let sim = Sim::with_devices(2);
        let (mut a, _b) = pair_on::<8>(&sim, &cfg(TIMEOUT), &cfg(TIMEOUT));
        let mut buf = *b"doomed";
        let mr = a.pd.register(&mut buf).unwrap();
        // SAFETY: the buffer outlives the wait below, which ends the work.
        let p = unsafe {
            a.ch.post_send_unpolled(
                &[mr.slice(..).unwrap().sge()],
                SendOp::Send,
                SendFlags::empty(),
            )
        }
        .unwrap();
        sim.fabric().crash(0).unwrap();
        let e = a.ch.wait(p).unwrap_err();
        // The work is over: nothing in flight, the ring's slot is free again.
        assert_eq!(a.ch.in_flight(), (0, 0));
        e
    });
    assert_eq!(e.kind(), ErrorKind::DeviceFatal, "{e}");
}

/// A wait does not run to its timeout when its device dies: the device's queues fail
/// every poll from its death on, and a sleeping wait is woken, so a receive that would
/// wait ten seconds returns with the device's fatal error at once (well under a second
/// here; about 0.1 ms measured, BENCHMARKS.md), its work ended.
#[test]
fn a_dead_device_ends_a_wait_at_once_not_at_its_timeout() {
    use zverbs::WaitPolicy;
    for wait in [WaitPolicy::Spin, WaitPolicy::SpinSleep] {
        let long = ChannelConfig {
            wait,
            ..cfg(Duration::from_secs(10))
        };
        let after = within(Duration::from_secs(20), move || {
            let sim = Sim::with_devices(2);
            let (_a, mut b) = pair_on::<8>(&sim, &long, &long);
            let mut inbox = [0u8; 8];
            let mut inbox = b.pd.register(&mut inbox).unwrap();
            let fabric = sim.fabric().clone();
            let killer = thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                fabric.crash(1).unwrap();
                Instant::now()
            });
            let e = b.ch.receive([inbox.slice_mut(..).unwrap()]).unwrap_err();
            let after = killer.join().unwrap().elapsed();
            assert_eq!(e.kind(), ErrorKind::DeviceFatal, "{wait:?}: {e}");
            assert_eq!(b.ch.in_flight(), (0, 0), "{wait:?}");
            after
        });
        assert!(
            after < Duration::from_secs(1),
            "{wait:?}: {after:?} after the death"
        );
    }
}

/// The same on the stepped fabric (simulated time, auto-stepping polls): the bound is the
/// wall clock's, whatever simulated time does.
#[test]
fn dead_local_device_ends_a_wait_on_the_stepped_fabric() {
    const SEED: u64 = 13;
    let e = within(TIMEOUT * 10, || {
        let sim = Sim::with_config(FabricConfig::stepped(SEED), 2);
        let (mut a, _b) = pair_on::<8>(&sim, &cfg(TIMEOUT), &cfg(TIMEOUT));
        let mut buf = *b"doomed";
        let mr = a.pd.register(&mut buf).unwrap();
        let sge = mr.slice(..).unwrap().sge();
        // SAFETY: the buffer outlives the wait below, which ends the work.
        let p = unsafe {
            a.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
        };
        let p = p.unwrap();
        sim.fabric().crash(0).unwrap();
        let e = a.ch.wait(p).unwrap_err();
        assert_eq!(a.ch.in_flight(), (0, 0), "seed {SEED}");
        e
    });
    assert_eq!(e.kind(), ErrorKind::DeviceFatal, "seed {SEED}: {e}");
}

/// The same from inside a scope with 32 requests outstanding, then `reset` and drop on
/// the dead device: each returns, with a typed error.
#[test]
fn dead_local_device_ends_scope_reset_and_drop() {
    within(TIMEOUT * 10, || {
        let sim = Sim::with_devices(2);
        let (mut a, _b) = pair_on::<32>(&sim, &cfg(TIMEOUT), &cfg(TIMEOUT));
        let mut buf = [7u8; 32];
        let mr = a.pd.register(&mut buf).unwrap();
        let fabric = sim.fabric().clone();
        let start = Instant::now();
        let r = a.ch.scope(|s| {
            for i in 0..32 {
                s.post_send([mr.slice(i..i + 1)?])?;
            }
            s.ring_doorbell()?;
            fabric.crash(0).unwrap();
            Ok(())
        });
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DeviceFatal, "{e}");
        assert!(start.elapsed() < TIMEOUT * 5, "{:?}", start.elapsed());
        assert_eq!(a.ch.in_flight(), (0, 0));
        let e = a.ch.reset().map(drop).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DeviceFatal, "{e}");
    });
}

/// A blocking receive that nobody answers on a device that dies mid-wait (from another
/// thread).
#[test]
fn dead_local_device_mid_wait() {
    let e = within(TIMEOUT * 10, || {
        let sim = Sim::with_devices(2);
        let (mut a, _b) = pair_on::<8>(&sim, &cfg(TIMEOUT), &cfg(TIMEOUT));
        let fabric = sim.fabric().clone();
        let killer = thread::spawn(move || {
            thread::sleep(TIMEOUT / 4);
            fabric.crash(0).unwrap();
        });
        let mut buf = [0u8; 8];
        let mut mr = a.pd.register(&mut buf).unwrap();
        let e = a.ch.receive([mr.slice_mut(..).unwrap()]).unwrap_err();
        killer.join().unwrap();
        e
    });
    assert_eq!(e.kind(), ErrorKind::DeviceFatal, "{e}");
}

// ---- 8, 9. A call's timeout bounds the whole call; errors keep what succeeded ----

const PEERS: usize = 1000;

/// A gather over 1,000 peers of which every third stays silent returns within one
/// timeout plus the grace (one timeout per silent peer would be over a minute), names the
/// first silent peer and its queue pair, and keeps the completions of the peers that sent.
#[test]
fn one_timeout_bounds_a_gather_over_a_thousand_peers() {
    within(Duration::from_secs(30), || {
        let sim = Sim::with_devices(2);
        let (c0, c1) = (
            Context::open(&sim, "sim0").unwrap(),
            Context::open(&sim, "sim1").unwrap(),
        );
        let (p0, p1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
        let cfg = cfg(TIMEOUT);
        let root = MultiChannel::<Sim, PEERS, 2, 1>::prepare(&c0, &p0, 0..PEERS, &cfg).unwrap();
        let leaves = MultiChannel::<Sim, PEERS, 2, 1>::prepare(&c1, &p1, 0..PEERS, &cfg).unwrap();
        let root_eps: Vec<_> = (0..PEERS).map(|p| root.endpoint(p).unwrap()).collect();
        let leaf_eps: Vec<_> = (0..PEERS).map(|p| leaves.endpoint(p).unwrap()).collect();
        let mut root = root.connect(|p| leaf_eps.get(p).copied()).unwrap();
        let mut leaves = leaves.connect(|p| root_eps.get(p).copied()).unwrap();

        let mut inbox = vec![0u8; PEERS * 4];
        let mut inbox = p0.register(&mut inbox).unwrap();
        let mut outbox = vec![0u8; PEERS * 4];
        for (p, chunk) in outbox.chunks_mut(4).enumerate() {
            chunk.copy_from_slice(&(p as u32).to_le_bytes());
        }
        let outbox = p1.register(&mut outbox).unwrap();
        let silent = |p: usize| p % 3 == 1;
        for p in (0..PEERS).filter(|&p| !silent(p)) {
            // Unpolled: the sends wait at the root's receives, posted by the gather below.
            let sge = outbox.slice(p * 4..p * 4 + 4).unwrap().sge();
            // SAFETY: `outbox` outlives the waits at the end of the test.
            let pending =
                unsafe { leaves.post_send_unpolled(p, &[sge], SendOp::Send, SendFlags::empty()) };
            let _ = pending.unwrap();
        }
        let mut slices = Vec::with_capacity(PEERS);
        let mut rest = inbox.slice_mut(..).unwrap();
        for _ in 0..PEERS - 1 {
            let (head, tail) = rest.split_at(4).unwrap();
            slices.push(head);
            rest = tail;
        }
        slices.push(rest);
        let start = Instant::now();
        let e = root
            .gather_receive(slices.into_iter().enumerate())
            .unwrap_err();
        let took = start.elapsed();
        assert!(
            took < TIMEOUT * 10,
            "one timeout for the whole gather, took {took:?}"
        );
        assert_eq!(e.peer, 1, "{e}");
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert_eq!(e.qp_num, Some(root.peer(1).unwrap().queue_pair().qp_num()));
        assert!(e.to_string().starts_with("peer 1 (QP "), "{e}");
        for p in 0..PEERS {
            match root.outcome(p) {
                Some(Ok(Some(c))) if !silent(p) => assert_eq!(c.byte_len, 4, "peer {p}"),
                Some(Err(e)) if silent(p) => assert_eq!(e.kind(), ErrorKind::Timeout, "peer {p}"),
                other => panic!("peer {p}: {other:?}"),
            }
        }
        for p in (0..PEERS).filter(|&p| !silent(p)) {
            let got = &inbox.as_slice()[p * 4..p * 4 + 4];
            assert_eq!(got, (p as u32).to_le_bytes(), "peer {p}");
        }
    });
}

/// A scope of 64 receives nobody answers waits one timeout, not 64.
#[test]
fn one_timeout_bounds_a_scope() {
    within(TIMEOUT * 10, || {
        let (mut a, _b) = pair::<64>(TIMEOUT);
        let mut buf = [0u8; 64];
        let mut mr = a.pd.register(&mut buf).unwrap();
        let start = Instant::now();
        let e =
            a.ch.scope(|s| {
                let mut rest = mr.slice_mut(..)?;
                for _ in 0..63 {
                    let (one, tail) = rest.split_at(1)?;
                    s.post_receive([one])?;
                    rest = tail;
                }
                s.post_receive([rest])?;
                Ok(())
            })
            .unwrap_err();
        assert_eq!(e, Error::Timeout);
        assert!(start.elapsed() < TIMEOUT * 5, "{:?}", start.elapsed());
        assert_eq!(a.ch.in_flight(), (0, 0));
    });
}

// ---- 2. A final barrier followed by exit does not strand a peer ----

/// Rank 1 enters first; its message is already at rank 0 when rank 0 enters, so rank 0's
/// barrier completes the moment it sends its own message, which is lost once on the wire
/// (real retransmission timers, 4 ms). Rank 0 drops its node the moment its barrier
/// returns. Rank 1 must still pass: a barrier returns only when its own messages are
/// acknowledged, so rank 0 stays until the retransmission got through.
#[test]
fn a_final_barrier_then_exit_strands_no_peer() {
    within(Duration::from_secs(20), || {
        let sim = Sim::with_config(FabricConfig::default(), 2);
        let mut cfg = NodeConfig {
            barrier_timeout: Some(Duration::from_secs(1)),
            ..NodeConfig::default()
        };
        cfg.channel.rts.timeout = 10; // 4 ms per retransmission timeout
        let nodes = connect_nodes::<2>(&sim, &cfg);
        let mut it = nodes.into_iter();
        let (mut n0, mut n1) = (it.next().unwrap(), it.next().unwrap());
        let second = thread::spawn(move || n1.barrier_all());
        // Rank 1's message has arrived and been acknowledged: rank 0's next packet out is
        // its own barrier message.
        thread::sleep(Duration::from_millis(50));
        sim.fabric().drop_next(0, 1).unwrap();
        n0.barrier_all().unwrap();
        drop(n0); // exit at once
        second.join().unwrap().unwrap();
    });
}

/// Endpoints each rank made for each peer: `eps[rank][peer]`.
type Tables = Vec<Vec<Option<(Endpoint, zverbs::RemoteRegion)>>>;

/// Ranks `0..N` of a world on devices `sim0..`, prepared, with their endpoint tables.
fn prepare_nodes<const N: usize>(
    sim: &Sim,
    cfg: &NodeConfig,
) -> (Vec<PreparedNode<Sim, N, 4, 1>>, Tables) {
    let prepared: Vec<_> = (0..N)
        .map(|r| {
            let ctx = Context::open(sim, &format!("sim{r}")).unwrap();
            let pd = ctx.alloc_pd().unwrap();
            Node::<Sim, N, 4, 1>::prepare(&ctx, &pd, r, N, cfg).unwrap()
        })
        .collect();
    let eps = prepared
        .iter()
        .map(|p| (0..N).map(|peer| p.endpoints(peer).ok()).collect())
        .collect();
    (prepared, eps)
}

fn connect_nodes<const N: usize>(sim: &Sim, cfg: &NodeConfig) -> Vec<Node<Sim, N, 4, 1>> {
    let (prepared, eps) = prepare_nodes::<N>(sim, cfg);
    prepared
        .into_iter()
        .enumerate()
        .map(|(r, p)| p.connect(|peer| eps[peer][r]).unwrap())
        .collect()
}

// ---- 3. Connected means ready ----

/// On the untimed fabric, a side that connects and sends at once, before its peer has
/// connected, waits for the peer as hardware's retries would: the message arrives.
#[test]
fn a_send_before_the_peer_connected_arrives() {
    within(TIMEOUT * 10, || {
        let sim = Sim::with_devices(2);
        let (ca, cb) = (
            Context::open(&sim, "sim0").unwrap(),
            Context::open(&sim, "sim1").unwrap(),
        );
        let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
        let cfg = cfg(Duration::from_secs(2));
        let a = Channel::<Sim, 4, 1>::prepare(&ca, &pa, &cfg).unwrap();
        let b = Channel::<Sim, 4, 1>::prepare(&cb, &pb, &cfg).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let mut a = a.connect(&eb).unwrap();
        let sender = thread::spawn(move || a.send_inline(b"early").map(|_| a));
        thread::sleep(Duration::from_millis(20));
        let mut b = b.connect(&ea).unwrap();
        let mut buf = [0u8; 8];
        let mut mr = pb.register(&mut buf).unwrap();
        let got = b.receive([mr.slice_mut(..).unwrap()]).unwrap();
        assert_eq!(got.byte_len, 5);
        sender.join().unwrap().unwrap();
    });
}

/// A peer that never connects still ends the send as hardware would: retry exhaustion,
/// after about the time the retries take (7 × 67 ms by default), not at once.
#[test]
fn a_peer_that_never_connects_exhausts_the_retries() {
    within(Duration::from_secs(20), || {
        let sim = Sim::with_devices(2);
        let (ca, cb) = (
            Context::open(&sim, "sim0").unwrap(),
            Context::open(&sim, "sim1").unwrap(),
        );
        let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
        let mut cfg = cfg(Duration::from_secs(5));
        cfg.rts.timeout = 12; // 16.8 ms
        let a = Channel::<Sim, 4, 1>::prepare(&ca, &pa, &cfg).unwrap();
        let b = Channel::<Sim, 4, 1>::prepare(&cb, &pb, &cfg).unwrap();
        let mut a = a.connect(&b.endpoint()).unwrap();
        let start = Instant::now();
        let e = a.send_inline(b"lonely").unwrap_err();
        assert_eq!(
            e.completion().map(|c| c.status),
            Some(WcStatus::RetryExcErr),
            "{e}"
        );
        // 7 retries of 16.8 ms each.
        assert!(
            start.elapsed() >= Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
        drop(b);
    });
}

/// Every rank connects (in-process) on its own thread, at its own time, and runs a
/// barrier and a send the moment its connect returns.
#[test]
fn ranks_barrier_the_moment_they_connect() {
    const W: usize = 4;
    within(Duration::from_secs(20), || {
        let sim = Sim::with_devices(W);
        let (prepared, eps) = prepare_nodes::<W>(&sim, &NodeConfig::default());
        thread::scope(|t| {
            for (r, p) in prepared.into_iter().enumerate() {
                let eps = &eps;
                t.spawn(move || {
                    thread::sleep(Duration::from_millis(15 * r as u64));
                    let mut node = p.connect(|peer| eps[peer][r]).unwrap();
                    node.barrier_all().unwrap();
                    node.barrier_all().unwrap();
                });
            }
        });
    });
}

/// `close` lingers until unpolled sends are acknowledged: here the peer posts its receive
/// only after the close began.
#[test]
fn close_lingers_until_sends_are_acknowledged() {
    within(TIMEOUT * 10, || {
        let (mut a, mut b) = pair::<8>(TIMEOUT);
        let mut msg = *b"linger";
        let mr = a.pd.register(&mut msg).unwrap();
        let sge = mr.slice(..).unwrap().sge();
        // SAFETY: `msg` outlives the close, which ends the send.
        let p = unsafe {
            a.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
        };
        let _ = p.unwrap();
        let receiver = thread::spawn(move || {
            thread::sleep(TIMEOUT / 4);
            let mut buf = [0u8; 8];
            let mut mr = b.pd.register(&mut buf).unwrap();
            b.ch.receive([mr.slice_mut(..).unwrap()]).unwrap().byte_len
        });
        a.ch.close(TIMEOUT * 2).unwrap();
        assert_eq!(receiver.join().unwrap(), 6);
    });
}

/// A close whose sends cannot drain (the peer never receives) reports them, in time.
#[test]
fn close_reports_what_did_not_drain() {
    within(TIMEOUT * 10, || {
        let (mut a, _b) = pair::<8>(TIMEOUT);
        let mut msg = *b"unheard";
        let mr = a.pd.register(&mut msg).unwrap();
        let sge = mr.slice(..).unwrap().sge();
        for _ in 0..3 {
            // SAFETY: `msg` outlives the close, which ends the sends.
            let p = unsafe {
                a.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
            };
            let _ = p.unwrap();
        }
        let start = Instant::now();
        assert_eq!(a.ch.close(TIMEOUT), Err(Error::Undrained { sends: 3 }));
        assert!(start.elapsed() >= TIMEOUT);
    });
}

/// A multi-peer scope where one peer stays silent: the scope returns the timeout within
/// one bound, `failed_peers` names the silent peer, and the peer that sent keeps its
/// completion.
#[test]
fn a_failed_multi_scope_names_the_peer_and_keeps_the_rest() {
    within(TIMEOUT * 10, || {
        let sim = Sim::with_devices(3);
        let ctx: Vec<_> = (0..3)
            .map(|i| Context::open(&sim, &format!("sim{i}")).unwrap())
            .collect();
        let pd: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
        let cfg = cfg(TIMEOUT);
        let root = MultiChannel::<Sim, 3, 4, 1>::prepare(&ctx[0], &pd[0], [1, 2], &cfg).unwrap();
        let l1 = Channel::<Sim, 4, 1>::prepare(&ctx[1], &pd[1], &cfg).unwrap();
        let l2 = Channel::<Sim, 4, 1>::prepare(&ctx[2], &pd[2], &cfg).unwrap();
        let (r1, r2) = (root.endpoint(1).unwrap(), root.endpoint(2).unwrap());
        let (e1, e2) = (l1.endpoint(), l2.endpoint());
        let mut root = root.connect(|p| [None, Some(e1), Some(e2)][p]).unwrap();
        let mut l1 = l1.connect(&r1).unwrap();
        let _l2 = l2.connect(&r2).unwrap();
        let mut inbox = [0u8; 16];
        let mut inbox = pd[0].register(&mut inbox).unwrap();
        let start = Instant::now();
        let r = thread::scope(|t| {
            t.spawn(|| l1.send_inline(b"one").unwrap());
            root.scope(|s| {
                let (a, b) = inbox.slice_mut(..)?.split_at(8)?;
                s.post_receive(1, [a])?;
                s.post_receive(2, [b])?;
                Ok(())
            })
        });
        assert_eq!(r, Err(Error::Timeout));
        assert!(start.elapsed() < TIMEOUT * 5, "{:?}", start.elapsed());
        let failed: Vec<_> = root.failed_peers().map(|(p, e)| (p, e.kind())).collect();
        assert_eq!(failed, [(2, ErrorKind::Timeout)]);
        assert!(matches!(root.outcome(1), Some(Ok(Some(c))) if c.byte_len == 3));
    });
}
