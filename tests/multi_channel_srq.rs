//! A `MultiChannel` whose peers share one receive queue: messages from any peer into
//! slots it owns, named by the queue pair that took them, refilled by policy or by the
//! limit event; sends, writes and scopes as on any channel.
#![cfg(feature = "sim")]

use std::time::Duration;

use zverbs::multi_channel::Received;
use zverbs::provider::sim::Sim;
use zverbs::qp::RcOnSrq;
use zverbs::srq::SlotsConfig;
use zverbs::{
    AccessFlags, AsyncEventKind, Channel, ChannelConfig, Context, Error, ErrorKind, MultiChannel,
    ProtectionDomain, WcStatus,
};

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

const PEERS: usize = 4;
type Root = MultiChannel<Sim, PEERS, 4, 1, RcOnSrq>;
type Leaf = Channel<Sim, 4, 1>;

/// Rank 0 on an SRQ of `slots`, connected to `leaves` plain channels (ranks 1..).
struct World {
    root: Root,
    leaves: Vec<Leaf>,
    pds: Vec<ProtectionDomain<Sim>>,
    ctx: Vec<Context<Sim>>,
}

fn world(leaves: usize, slots: &SlotsConfig) -> World {
    let sim = Sim::with_devices(leaves + 1);
    let ctx: Vec<_> = (0..=leaves)
        .map(|i| Context::open(&sim, &format!("sim{i}")).unwrap())
        .collect();
    let pds: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
    let cfg = ChannelConfig::default();
    let root = Root::prepare_on_srq(&ctx[0], &pds[0], 1..=leaves, &cfg, slots).unwrap();
    let prepared: Vec<_> = (1..=leaves)
        .map(|i| Leaf::prepare(&ctx[i], &pds[i], &cfg).unwrap())
        .collect();
    let eps: Vec<_> = prepared.iter().map(|l| l.endpoint()).collect();
    let ours: Vec<_> = (1..=leaves).map(|p| root.endpoint(p).unwrap()).collect();
    let root = root
        .connect(|p| eps.get(p.wrapping_sub(1)).copied())
        .unwrap();
    let leaves = prepared
        .into_iter()
        .zip(ours)
        .map(|(l, e)| l.connect(&e).unwrap())
        .collect();
    World {
        root,
        leaves,
        pds,
        ctx,
    }
}

fn slots(slots: u32, size: usize, refill_at: u32) -> SlotsConfig {
    SlotsConfig {
        slots,
        size,
        refill_at,
        ..SlotsConfig::default()
    }
}

/// Sends `msg` from leaf `i` (rank `i + 1`).
fn send(w: &mut World, i: usize, msg: &[u8]) -> Result<(), Error<zverbs::provider::sim::SimError>> {
    let mut buf = msg.to_vec();
    let region = w.pds[i + 1].register(&mut buf).unwrap();
    w.leaves[i].send([region.slice(..).unwrap()])
}

/// The next message at the root, its bytes copied out, its slot handed back.
fn next(root: &mut Root) -> (usize, Vec<u8>) {
    let mut got = [Received::NONE; 1];
    assert_eq!(root.gather_receive(&mut got).unwrap(), 1);
    let bytes = root.received(got[0].slot).unwrap().to_vec();
    root.release(got[0].slot).unwrap();
    (got[0].peer, bytes)
}

#[test]
fn every_message_lands_once_named_by_its_peer_in_each_senders_order() {
    const EACH: u8 = 24;
    // Four slots for three senders' 72 messages: refilled over and over.
    let mut w = world(3, &slots(4, 16, 1));
    let World {
        root, leaves, pds, ..
    } = &mut w;
    let mut next_from = [0u8; PEERS];
    std::thread::scope(|t| {
        for (i, (leaf, pd)) in leaves.iter_mut().zip(&pds[1..]).enumerate() {
            t.spawn(move || {
                for k in 0..EACH {
                    let mut msg = [i as u8 + 1, k];
                    let msg = pd.register(&mut msg).unwrap();
                    leaf.send([msg.slice(..).unwrap()]).unwrap();
                }
            });
        }
        for _ in 0..3 * u32::from(EACH) {
            let (peer, bytes) = next(root);
            assert_eq!(bytes, [peer as u8, next_from[peer]], "peer {peer}");
            next_from[peer] += 1;
        }
    });
    assert_eq!(next_from, [0, EACH, EACH, EACH]);
    let mut none = [Received::NONE; 4];
    assert_eq!(w.root.poll_received(&mut none).unwrap(), 0, "nothing twice");
}

#[test]
fn a_flooding_peer_holds_the_slots_and_a_quiet_peers_message_lands_once_one_is_back() {
    let mut w = world(2, &slots(4, 16, 0));
    for k in 0..4u8 {
        send(&mut w, 0, &[1, k]).unwrap(); // peer 1 takes every slot
    }
    let World {
        root, leaves, pds, ..
    } = &mut w;
    let mut held = [Received::NONE; 4];
    let mut n = 0;
    while n < 4 {
        n += root.gather_receive(&mut held[n..]).unwrap();
    }
    assert!(held.iter().all(|r| r.peer == 1));
    std::thread::scope(|t| {
        // Peer 2's message finds the SRQ empty: its device retries on RNR NAKs.
        let quiet = t.spawn(|| {
            let mut msg = [2, 0];
            let msg = pds[2].register(&mut msg).unwrap();
            leaves[1].send([msg.slice(..).unwrap()])
        });
        let mut none = [Received::NONE; 1];
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(root.poll_received(&mut none).unwrap(), 0, "no slot posted");
        root.release(held[0].slot).unwrap(); // posted again at once (refill_at 0)
        assert_eq!(root.gather_receive(&mut none).unwrap(), 1);
        assert_eq!(none[0].peer, 2);
        assert_eq!(root.received(none[0].slot).unwrap(), [2, 0]);
        quiet.join().unwrap().unwrap();
    });
    for r in &held[1..] {
        assert_eq!(
            w.root.received(r.slot).unwrap()[0],
            1,
            "held slots unchanged"
        );
    }
}

#[test]
fn a_message_longer_than_a_slot_fails_its_receive_and_names_the_peer() {
    // Refilled whenever a slot is free (`refill_at` 3 of 4).
    let mut w = world(2, &slots(4, 8, 3));
    let sent = send(&mut w, 1, &[7; 16]);
    assert!(sent.is_err(), "the sender learns it too: {sent:?}");
    let mut got = [Received::NONE; 2];
    let e = w.root.gather_receive(&mut got).unwrap_err();
    let Error::Completion(c) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(c.status, WcStatus::LocLenErr);
    assert_eq!(c.qp_num, w.root.peer(2).unwrap().queue_pair().qp_num());
    assert!(matches!(w.root.outcome(2), Some(Err(_))));
    assert_eq!(
        w.root.failed_peers().map(|(p, _)| p).collect::<Vec<_>>(),
        [2]
    );
    // Peer 1 is unaffected, and the failed slot was posted again: four messages land
    // with none handed back in between.
    for k in 0..4u8 {
        send(&mut w, 0, &[k]).unwrap();
    }
    let mut got = [Received::NONE; 4];
    let mut n = 0;
    while n < 4 {
        n += w.root.gather_receive(&mut got[n..]).unwrap();
    }
    assert!(got.iter().all(|r| r.peer == 1));
}

#[test]
fn the_limit_event_refills_the_handed_back_slots() {
    // No refill by policy below 8: only the limit event posts slots again.
    let mut cfg = slots(8, 8, 0);
    cfg.limit = 4;
    let mut w = world(1, &cfg);
    assert_eq!(
        w.ctx[0].next_async_event().unwrap(),
        None,
        "the event queue opens"
    );
    let mut got = [Received::NONE; 5];
    for k in 0..5u8 {
        send(&mut w, 0, &[k]).unwrap();
        assert_eq!(
            w.root
                .gather_receive(&mut got[k as usize..=k as usize])
                .unwrap(),
            1
        );
    }
    let ev = w.ctx[0]
        .wait_async_event(Some(Duration::from_secs(5)))
        .unwrap()
        .expect("fewer than four posted");
    assert_eq!(ev.kind, AsyncEventKind::SrqLimitReached);
    assert!(!w
        .root
        .on_async_event(&zverbs::AsyncEvent {
            kind: AsyncEventKind::PortErr,
            element: zverbs::EventElement::Port(1),
        })
        .unwrap());
    // Handed back with `refill_at` 0 and three still posted: not posted by the release.
    for r in got {
        w.root.release(r.slot).unwrap();
    }
    assert!(w.root.on_async_event(&ev).unwrap(), "its SRQ's event");
    for k in 0..8u8 {
        send(&mut w, 0, &[k]).unwrap(); // eight land: all slots were posted again
    }
}

#[test]
fn forged_or_stale_slots_are_refused() {
    let mut w = world(1, &slots(2, 8, 0));
    send(&mut w, 0, b"abc").unwrap();
    let mut got = [Received::NONE; 1];
    assert_eq!(w.root.gather_receive(&mut got).unwrap(), 1);
    let mut forged = got[0].slot;
    forged.len = 1 << 20;
    let kind = |e: Error<_>| e.kind();
    assert_eq!(
        w.root.received(forged).map_err(kind).unwrap_err(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        w.root
            .received(Received::NONE.slot)
            .map_err(kind)
            .unwrap_err(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(w.root.received(got[0].slot).unwrap(), b"abc");
    w.root.release(got[0].slot).unwrap();
    assert!(w.root.release(got[0].slot).is_err(), "handed back twice");
    assert!(
        w.root.received(got[0].slot).is_err(),
        "read after it was handed back"
    );
}

#[test]
fn channels_on_the_srq_send_write_and_scope_as_any_channel() {
    let mut w = world(2, &slots(4, 16, 1));
    let mut target = [0u8; 8];
    let target = unsafe {
        w.pds[1].register_with_access(
            &mut target,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
    }
    .unwrap();
    let mut src = *b"abcdefgh";
    let src = w.pds[0].register(&mut src).unwrap();
    let region = target.remote();
    w.root
        .peer(1)
        .unwrap()
        .write([src.slice(..4).unwrap()], &region)
        .unwrap();
    w.root
        .scope(|s| {
            s.post_write(1, [src.slice(4..).unwrap()], &region.slice(4..)?)?;
            Ok(())
        })
        .unwrap();
    assert_eq!(target.as_slice(), b"abcdefgh");
    // The root's send reaches leaf 2's own receive queue.
    let mut inbox = [0u8; 8];
    let mut inbox = w.pds[2].register(&mut inbox).unwrap();
    let World { root, leaves, .. } = &mut w;
    std::thread::scope(|t| {
        t.spawn(|| root.scatter_send([(2, src.slice(..3).unwrap())]).unwrap());
        assert_eq!(
            leaves[1]
                .receive([inbox.slice_mut(..).unwrap()])
                .unwrap()
                .byte_len,
            3
        );
    });
    assert_eq!(&inbox.as_slice()[..3], b"abc");
}

#[test]
fn a_channel_moved_out_keeps_the_srq_and_its_memory_alive() {
    // Channels can be swapped between multi-channels (`peer` lends `&mut`): the first
    // dropped must not take the memory its SRQ's receives land in from a queue pair that
    // lives on in the other. Run under valgrind, a use after free here is an error.
    let mut a = world(1, &slots(2, 8, 0));
    let mut b = world(1, &slots(2, 8, 0));
    core::mem::swap(a.root.peer(1).unwrap(), b.root.peer(1).unwrap());
    let World {
        root,
        mut leaves,
        pds,
        ctx: _ctx,
    } = a;
    drop(root);
    // a's leaf is connected to the queue pair now in b, on a's SRQ: the message lands in
    // a's slot memory, which that queue pair keeps.
    let mut msg = *b"late";
    let msg = pds[1].register(&mut msg).unwrap();
    leaves[0].send([msg.slice(..).unwrap()]).unwrap();
    drop(b);
}

#[test]
fn receiving_and_handing_back_does_not_allocate() {
    let mut w = world(2, &slots(4, 8, 1));
    let mut got = [Received::NONE; 2];
    for k in 0..2u8 {
        send(&mut w, k as usize, &[k]).unwrap();
    }
    let (n, allocs) = zverbs_testkit::measure(|| {
        let mut n = 0;
        while n < 2 {
            n += w.root.gather_receive(&mut got[n..]).unwrap();
        }
        for r in got {
            w.root.release(r.slot).unwrap();
        }
        n
    });
    assert_eq!((n, allocs.count), (2, 0), "allocations on the data path");
}

#[test]
fn nodes_on_an_srq_run_barriers_and_take_messages_from_any_peer() {
    use zverbs::node::{Node, NodeConfig};
    const N: usize = 3;
    let sim = Sim::with_devices(N);
    let ctx: Vec<_> = (0..N)
        .map(|i| Context::open(&sim, &format!("sim{i}")).unwrap())
        .collect();
    let pd: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
    let cfg = NodeConfig {
        receive_slots: slots(4, 16, 1),
        ..NodeConfig::default()
    };
    let prepared: Vec<_> = (0..N)
        .map(|r| Node::<Sim, N, 4, 1, RcOnSrq>::prepare(&ctx[r], &pd[r], r, N, &cfg).unwrap())
        .collect();
    let eps: Vec<Vec<_>> = prepared
        .iter()
        .map(|p| (0..N).map(|peer| p.endpoints(peer).ok()).collect())
        .collect();
    let nodes: Vec<_> = prepared
        .into_iter()
        .enumerate()
        .map(|(r, p)| p.connect(|peer| eps[peer][r]).unwrap())
        .collect();
    std::thread::scope(|t| {
        for (mut node, pd) in nodes.into_iter().zip(&pd) {
            t.spawn(move || {
                let r = node.rank();
                node.barrier_all().unwrap();
                if r == 0 {
                    let mut got = [Received::NONE; 2];
                    let mut n = 0;
                    while n < 2 {
                        n += node.channels().gather_receive(&mut got[n..]).unwrap();
                    }
                    let mut from: Vec<_> = got
                        .iter()
                        .map(|m| (m.peer, node.channels().received(m.slot).unwrap().to_vec()))
                        .collect();
                    from.sort();
                    assert_eq!(from, [(1, vec![1]), (2, vec![2])]);
                } else {
                    let mut msg = [r as u8];
                    let msg = pd.register(&mut msg).unwrap();
                    node.channels()
                        .peer(0)
                        .unwrap()
                        .send([msg.slice(..).unwrap()])
                        .unwrap();
                }
                node.barrier_all().unwrap();
            });
        }
    });
}
