//! Shared completion queues on the data path: the channels of a
//! `MultiChannel` complete on one send and one receive queue, and the dispatcher routes
//! every completion to its own channel, exactly once, whoever polls.
#![cfg(feature = "sim")]

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use zverbs::dispatch::SharedCompletionQueue;
use zverbs::provider::sim::{FabricConfig, Faults, Sim};
use zverbs::{
    AccessFlags, Channel, ChannelConfig, Context, CqLayout, SendFlags, SendOp, WaitPolicy,
};

const LEAVES: usize = 3;

/// Rank 0 holds a multi-channel to ranks 1..=3; each of them a channel to rank 0.
type Star = zverbs::testing::Star<4, 16, 1>;

fn star(sim: &Sim, layout: CqLayout) -> Star {
    star_waiting(sim, layout, WaitPolicy::default())
}

fn star_waiting(sim: &Sim, layout: CqLayout, wait: WaitPolicy) -> Star {
    let cfg = ChannelConfig {
        timeout: Some(Duration::from_secs(10)),
        completion_queues: layout,
        wait,
        ..ChannelConfig::default()
    };
    Star::connected_on(sim, LEAVES, &cfg).unwrap()
}

#[test]
fn a_multi_channel_shares_its_completion_queues_by_default() {
    let mut s = star(&Sim::with_devices(LEAVES + 1), CqLayout::default());
    assert!(s
        .root
        .channels_mut()
        .all(|(_, c)| c.shares_completion_queues()));
    let mut s2 = star(&Sim::with_devices(LEAVES + 1), CqLayout::PerChannel);
    assert!(s2
        .root
        .channels_mut()
        .all(|(_, c)| !c.shares_completion_queues()));
    assert!(!s.leaves[0].shares_completion_queues());
}

#[test]
fn a_completion_found_while_waiting_for_another_peer_is_kept_for_its_own() {
    let mut s = star(&Sim::with_devices(LEAVES + 1), CqLayout::Shared);
    let (mut m1, mut m3) = (*b"to peer one", *b"to peer three!");
    let m1 = s.pd[0].register(&mut m1).unwrap();
    let m3 = s.pd[0].register(&mut m3).unwrap();
    let mut inbox: Vec<_> = (0..LEAVES).map(|_| [0u8; 32]).collect();
    let mut regions: Vec<_> = inbox
        .iter_mut()
        .zip(&s.pd[1..])
        .map(|(b, pd)| pd.register(b).unwrap())
        .collect();
    let mut recvs = Vec::new();
    for (leaf, r) in s.leaves.iter_mut().zip(regions.iter_mut()) {
        // SAFETY: the region is not touched until the receive is waited for below.
        recvs.push(
            unsafe { leaf.post_receive_unpolled(&[r.slice_mut(..).unwrap().sge()]) }.unwrap(),
        );
    }
    // Peer 1's send completes on the shared queue while the root waits for peer 3's.
    // SAFETY: `m1` outlives the wait below.
    let first = unsafe {
        s.root.peer(1).unwrap().post_send_unpolled(
            &[m1.slice(..).unwrap().sge()],
            SendOp::Send,
            SendFlags::empty(),
        )
    }
    .unwrap();
    s.root
        .peer(3)
        .unwrap()
        .send([m3.slice(..).unwrap()])
        .unwrap();
    let c = s.root.peer(1).unwrap().wait(first).unwrap();
    assert_eq!(c.status, zverbs::WcStatus::Success);
    assert_eq!(s.root.peer(1).unwrap().in_flight(), (0, 0));
    let mut recvs = recvs.into_iter();
    let (r1, r2) = (recvs.next().unwrap(), recvs.next().unwrap());
    assert_eq!(s.leaves[0].wait(r1).unwrap().byte_len, 11);
    assert_eq!(
        s.leaves[2].wait(recvs.next().unwrap()).unwrap().byte_len,
        14
    );
    let r2 = s.leaves[1].try_complete(r2).unwrap();
    assert!(r2.is_err(), "peer two was sent nothing");
    drop(regions);
    assert_eq!(&inbox[0][..11], b"to peer one");
    assert_eq!(&inbox[2][..14], b"to peer three!");
}

#[test]
fn threads_drive_their_own_peers_over_the_shared_queues() {
    threads_drive_their_own_peers(WaitPolicy::SpinYield);
}

/// The same with every waiter asleep on the shared queues' completion channels: a lost
/// wake-up would end a wait with `Timeout` after 10 s.
#[test]
fn threads_sleeping_on_the_shared_queues_lose_no_wake_up() {
    threads_drive_their_own_peers(WaitPolicy::SpinSleep);
}

fn threads_drive_their_own_peers(wait: WaitPolicy) {
    const ROUNDS: u64 = 200;
    let mut s = star_waiting(&Sim::with_devices(LEAVES + 1), CqLayout::Shared, wait);
    let mut root_bufs: Vec<_> = (0..LEAVES).map(|_| [0u8; 8]).collect();
    let mut leaf_bufs: Vec<_> = (0..LEAVES).map(|_| [0u8; 8]).collect();
    let mut targets: Vec<_> = (0..LEAVES).map(|_| [0u8; 8]).collect();
    let root_regs: Vec<_> = root_bufs
        .iter_mut()
        .map(|b| s.pd[0].register(b).unwrap())
        .collect();
    let leaf_regs: Vec<_> = leaf_bufs
        .iter_mut()
        .zip(&s.pd[1..])
        .map(|(b, pd)| pd.register(b).unwrap())
        .collect();
    let target_regs: Vec<_> = targets
        .iter_mut()
        .zip(&s.pd[1..])
        // SAFETY: the targets are read only after every thread joined.
        .map(|(b, pd)| unsafe {
            pd.register_with_access(b, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                .unwrap()
        })
        .collect();
    let remotes: Vec<_> = target_regs.iter().map(|t| t.remote()).collect();
    // Per peer, one thread drives the root's channel (a send, a write, and the receive of
    // the leaf's echo, per round) and one the leaf's (a receive, checked, and the echo,
    // now and then late so that the root's waiters go to sleep).
    std::thread::scope(|t| {
        let leaves = s.leaves.iter_mut().zip(leaf_regs);
        for (((peer, ch), mut reg), (leaf, mut lreg)) in
            s.root.channels_mut().zip(root_regs).zip(leaves)
        {
            let remote = remotes[peer - 1];
            t.spawn(move || {
                for i in 0..ROUNDS {
                    let word = i << 8 | peer as u64;
                    reg.as_mut_slice().copy_from_slice(&word.to_le_bytes());
                    ch.send([reg.slice(..).unwrap()]).unwrap();
                    ch.write([reg.slice(..).unwrap()], &remote).unwrap();
                    let c = ch.receive([reg.slice_mut(..).unwrap()]).unwrap();
                    assert_eq!(c.imm, Some(word as u32), "peer {peer} round {i}");
                }
            });
            t.spawn(move || {
                for i in 0..ROUNDS {
                    let c = leaf.receive([lreg.slice_mut(..).unwrap()]).unwrap();
                    assert_eq!(c.byte_len, 8);
                    let got = u64::from_le_bytes(lreg.as_slice().try_into().unwrap());
                    assert_eq!(got, i << 8 | peer as u64, "peer {peer} round {i}");
                    if i % 8 == peer as u64 {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    leaf.send_with_imm([lreg.slice(..0).unwrap()], got as u32)
                        .unwrap();
                }
            });
        }
    });
    drop(target_regs);
    for (p, t) in targets.iter().enumerate() {
        assert_eq!(u64::from_le_bytes(*t), (ROUNDS - 1) << 8 | (p + 1) as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random posts on random peers over the shared queues, waited for in a random order,
    /// on a fabric that drops and duplicates packets: every completion reaches exactly its
    /// own channel, once (each receive gets the length its peer sent, in order).
    #[test]
    fn every_completion_reaches_its_owner_once(
        seed in any::<u64>(),
        ops in proptest::collection::vec((1usize..=LEAVES, 1u32..64), 1..16),
        order in any::<u64>(),
    ) {
        let cfg = FabricConfig {
            seed,
            faults: Faults { drop: 0.05, duplicate: 0.05, ..Faults::none() },
            ..FabricConfig::instant()
        };
        eprintln!("seed {seed}");
        let mut s = star(&Sim::with_config(cfg, LEAVES + 1), CqLayout::Shared);
        let mut dst = vec![[0u8; 64]; ops.len()];
        let mut leaf_src: Vec<_> = (0..LEAVES).map(|_| [7u8; 64]).collect();
        let leaf_regs: Vec<_> = leaf_src.iter_mut().zip(&s.pd[1..]).map(|(b, pd)| pd.register(b).unwrap()).collect();
        let mut dst_regs: Vec<_> = dst.iter_mut().map(|b| s.pd[0].register(b).unwrap()).collect();
        // The root posts one receive per op, on the op's peer; the peer sends `len` bytes.
        let mut pendings = Vec::new();
        for ((peer, len), reg) in ops.iter().zip(dst_regs.iter_mut()) {
            // SAFETY: the regions outlive the waits below.
            let p = unsafe { s.root.peer(*peer).unwrap().post_receive_unpolled(&[reg.slice_mut(..).unwrap().sge()]) }.unwrap();
            pendings.push(Some((*peer, *len, p)));
        }
        for (peer, len) in &ops {
            let leaf = &mut s.leaves[peer - 1];
            leaf.send([leaf_regs[peer - 1].slice(..*len as usize).unwrap()]).unwrap();
        }
        // Wait in a random order: completions of other peers are routed meanwhile.
        let mut rng = order;
        let mut left = pendings.len();
        while left > 0 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let i = (rng >> 33) as usize % pendings.len();
            let Some((peer, len, p)) = pendings[i].take() else { continue };
            let c = s.root.peer(peer).unwrap().wait(p).unwrap();
            prop_assert_eq!(c.byte_len, len, "op {} on peer {} (seed {})", i, peer, seed);
            left -= 1;
        }
        prop_assert!(s.root.channels_mut().all(|(_, c)| c.in_flight() == (0, 0)));
        drop(dst_regs);
        drop(leaf_regs);
    }
}

#[test]
fn a_full_ring_on_every_peer_does_not_overflow_the_shared_queue() {
    let sim = Sim::with_devices(LEAVES + 1);
    let mut s = star(&sim, CqLayout::Shared);
    let mut buf = [1u8; 8];
    let reg = s.pd[0].register(&mut buf).unwrap();
    let mut landing: Vec<_> = (0..LEAVES * 16).map(|_| [0u8; 8]).collect();
    let mut regs: Vec<_> = landing
        .chunks_mut(16)
        .zip(&s.pd[1..])
        .flat_map(|(c, pd)| c.iter_mut().map(move |b| pd.register(b).unwrap()))
        .collect();
    let mut regs_iter = regs.iter_mut();
    let mut recvs = Vec::new();
    for (i, leaf) in s.leaves.iter_mut().enumerate() {
        for _ in 0..16 {
            let r = regs_iter.next().unwrap();
            // SAFETY: the regions outlive the waits below.
            let p = unsafe { leaf.post_receive_unpolled(&[r.slice_mut(..).unwrap().sge()]) };
            recvs.push((i, p.unwrap()));
        }
    }
    // Sixteen signaled sends to every peer before anyone polls: 48 completions at once.
    let mut pending = Vec::new();
    for peer in 1..=LEAVES {
        for _ in 0..16 {
            // SAFETY: `reg` outlives the waits below.
            let p = unsafe {
                s.root.peer(peer).unwrap().post_send_unpolled(
                    &[reg.slice(..).unwrap().sge()],
                    SendOp::Send,
                    SendFlags::empty(),
                )
            }
            .unwrap();
            pending.push((peer, p));
        }
    }
    for (peer, p) in pending.into_iter().rev() {
        let c = s.root.peer(peer).unwrap().wait(p).unwrap();
        assert_eq!(c.status, zverbs::WcStatus::Success);
    }
    for (i, p) in recvs {
        assert_eq!(s.leaves[i].wait(p).unwrap().byte_len, 8);
    }
    drop(regs);
}

#[test]
fn a_shared_queue_refuses_a_channel_it_has_no_room_for() {
    let sim = Sim::with_devices(2);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = Arc::new(SharedCompletionQueue::create(&ctx, 2, 8).unwrap());
    let cfg = ChannelConfig::default();
    // Deeper than the queue was made for.
    let deep = Channel::<Sim, 16, 1>::prepare_shared(&ctx, &pd, &cfg, &cq, &cq);
    assert!(matches!(deep, Err(zverbs::Error::InvalidAttribute(_))));
    // Two inboxes: one channel (a send and a receive inbox) fits, a second does not.
    let one = Channel::<Sim, 8, 1>::prepare_shared(&ctx, &pd, &cfg, &cq, &cq).unwrap();
    let two = Channel::<Sim, 8, 1>::prepare_shared(&ctx, &pd, &cfg, &cq, &cq);
    assert!(matches!(two, Err(zverbs::Error::InvalidAttribute(_))));
    drop(one); // its inboxes are free again
    Channel::<Sim, 8, 1>::prepare_shared(&ctx, &pd, &cfg, &cq, &cq).unwrap();
    // Sizes that do not fit a completion queue are refused, not wrapped.
    assert!(SharedCompletionQueue::create(&ctx, 1 << 20, u32::MAX).is_err());
}

// Channels move to the thread that drives them; shared queues are shared by `Arc`.
static_assertions::assert_impl_all!(zverbs::SimChannel: Send);
static_assertions::assert_impl_all!(zverbs::SimMultiChannel<4>: Send);
static_assertions::assert_impl_all!(SharedCompletionQueue<Sim>: Send, Sync);
static_assertions::assert_impl_all!(zverbs::dispatch::Dispatcher: Send, Sync);
