use super::*;
use crate::error::ErrorKind;
use Algorithm::*;
use BarrierError as E;
use MsgKind::{Arrive, Release, Round};

const ALGS: [Algorithm; 3] = [Centralized, Dissemination, BinaryTree];

type M = BarrierMachine<8>;
type Sent = heapless::Vec<(u32, Msg), 16>;

fn m(alg: Algorithm, me: u32, parts: &[u32]) -> M {
    M::new(alg, me, parts).unwrap()
}

fn start(b: &mut M) -> Sent {
    let mut v = Sent::new();
    b.start(&mut |to, msg| v.push((to, msg)).unwrap()).unwrap();
    v
}

fn recv(b: &mut M, from: u32, msg: Msg) -> Result<Sent, E> {
    let mut v = Sent::new();
    b.on_message(from, msg, &mut |to, msg| v.push((to, msg)).unwrap())?;
    Ok(v)
}

/// Feeds a message that must be refused, and checks the machine did not change.
fn refuse(b: &mut M, from: u32, msg: Msg) -> E {
    let (epoch, done) = (b.epoch(), b.is_complete());
    let e = recv(b, from, msg).unwrap_err();
    assert_eq!((b.epoch(), b.is_complete()), (epoch, done));
    e
}

const fn mk(kind: MsgKind, epoch: u32, round: u8) -> Msg {
    Msg { epoch, round, kind }
}

#[test]
fn validation() {
    let new = |me, parts: &[u32]| BarrierMachine::<4>::new(Centralized, me, parts).map(drop);
    assert_eq!(new(1, &[]), Err(E::Empty));
    let too_many = E::TooMany {
        given: 5,
        capacity: 4,
    };
    assert_eq!(new(1, &[1, 2, 3, 4, 5]), Err(too_many));
    assert_eq!(new(1, &[1, 3, 2]), Err(E::Unsorted { index: 2 }));
    assert_eq!(new(1, &[1, 3, 3]), Err(E::DuplicateRank(3)));
    assert_eq!(new(2, &[1, 3]), Err(E::NotMember(2)));
    assert_eq!(new(3, &[1, 3, 9, 10]), Ok(()));
    let b = BarrierMachine::<4>::new(BinaryTree, 9, &[1, 3, 9]).unwrap();
    assert_eq!((b.participants(), b.index()), (Some(&[1, 3, 9][..]), 2));
    assert!(b.is_complete() && b.epoch() == 0 && b.algorithm() == BinaryTree);
    assert_eq!(E::InProgress { epoch: 1 }.kind(), ErrorKind::InvalidState);
    assert_eq!(E::Empty.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn single_participant_completes_at_start() {
    for alg in ALGS {
        let mut b = m(alg, 5, &[5]);
        for e in 1..=3 {
            assert!(start(&mut b).is_empty());
            assert!(b.is_complete() && b.epoch() == e);
        }
    }
}

#[test]
fn centralized_three() {
    let parts = [2, 4, 6];
    let mut root = m(Centralized, 2, &parts);
    let (mut x, mut y) = (m(Centralized, 4, &parts), m(Centralized, 6, &parts));
    let (a, rel) = (mk(Arrive, 1, 0), mk(Release, 1, 0));
    assert_eq!(&start(&mut x)[..], &[(2, a)]);
    // The root buffers an early ARRIVE before it starts.
    assert!(recv(&mut root, 4, a).unwrap().is_empty());
    assert!(start(&mut root).is_empty() && !root.is_complete());
    assert_eq!(&start(&mut y)[..], &[(2, a)]);
    assert_eq!(&recv(&mut root, 6, a).unwrap()[..], &[(4, rel), (6, rel)]);
    assert!(root.is_complete());
    assert!(recv(&mut x, 2, rel).unwrap().is_empty() && x.is_complete());
    assert!(recv(&mut y, 2, rel).unwrap().is_empty() && y.is_complete());
}

#[test]
fn dissemination_three() {
    // P = 3: two rounds; round 0 to i+1, round 1 to i+2.
    let mut b = m(Dissemination, 1, &[0, 1, 2]);
    let r = |k| mk(Round, 1, k);
    // Round 1 from index 2 (= 1 - 2 mod 3) arrives before start.
    assert!(recv(&mut b, 2, r(1)).unwrap().is_empty());
    assert_eq!(&start(&mut b)[..], &[(2, r(0))]);
    assert_eq!(
        refuse(&mut b, 2, r(0)),
        E::Unexpected { from: 2, msg: r(0) }
    );
    assert_eq!(&recv(&mut b, 0, r(0)).unwrap()[..], &[(0, r(1))]);
    assert!(b.is_complete());
}

#[test]
fn tree_five() {
    // Indices 0..5: 0 -> {1, 2}, 1 -> {3, 4}.
    let parts = [10, 11, 12, 13, 14];
    let (a, rel) = (mk(Arrive, 1, 0), mk(Release, 1, 0));
    let mut one = m(BinaryTree, 11, &parts);
    assert!(start(&mut one).is_empty());
    assert!(recv(&mut one, 13, a).unwrap().is_empty());
    assert_eq!(refuse(&mut one, 12, a), E::Unexpected { from: 12, msg: a });
    assert_eq!(&recv(&mut one, 14, a).unwrap()[..], &[(10, a)]);
    assert_eq!(refuse(&mut one, 13, a), E::Duplicate { from: 13, msg: a });
    assert_eq!(
        &recv(&mut one, 10, rel).unwrap()[..],
        &[(13, rel), (14, rel)]
    );
    assert!(one.is_complete());
    assert_eq!(
        refuse(&mut one, 10, rel),
        E::EpochTooOld { got: 1, current: 1 }
    );
    let mut leaf = m(BinaryTree, 14, &parts);
    assert_eq!(&start(&mut leaf)[..], &[(11, a)]);
}

#[test]
fn double_start_is_refused() {
    for alg in ALGS {
        let mut b = m(alg, 1, &[1, 2]);
        start(&mut b);
        let mut sent = 0;
        assert_eq!(
            b.start(&mut |_, _| sent += 1),
            Err(E::InProgress { epoch: 1 })
        );
        assert_eq!((sent, b.epoch()), (0, 1));
    }
}

#[test]
fn stray_messages() {
    for alg in ALGS {
        let (kind, other) = match alg {
            Dissemination => (Round, Arrive),
            _ => (Arrive, Round),
        };
        let mut b = m(alg, 1, &[1, 2, 3]);
        // Legal at index 0 from rank 2 (index 1); for dissemination round 1 (0 - 2 mod 3).
        let ok = mk(kind, 1, u8::from(alg == Dissemination));
        assert_eq!(refuse(&mut b, 9, ok), E::NotParticipant(9));
        // Before any start, epoch 1 is the next one; 0 is over, 2 is too far.
        let at = |epoch| mk(kind, epoch, 0);
        assert_eq!(
            refuse(&mut b, 2, at(0)),
            E::EpochTooOld { got: 0, current: 0 }
        );
        assert_eq!(
            refuse(&mut b, 2, at(2)),
            E::EpochTooNew { got: 2, current: 0 }
        );
        let far = E::EpochTooOld {
            got: u32::MAX,
            current: 0,
        };
        assert_eq!(refuse(&mut b, 2, at(u32::MAX)), far);
        start(&mut b);
        // Running epoch 1: 2 is early (legal), 3 is too new.
        assert_eq!(
            refuse(&mut b, 2, at(3)),
            E::EpochTooNew { got: 3, current: 1 }
        );
        // From itself, another algorithm's kind, a bad round, RELEASE to the root.
        for (from, msg) in [
            (1, ok),
            (2, mk(other, 1, 0)),
            (2, mk(kind, 1, 9)),
            (2, mk(Release, 1, 0)),
        ] {
            assert_eq!(refuse(&mut b, from, msg), E::Unexpected { from, msg });
        }
        assert!(!b.is_complete());
    }
    // RELEASE before this participant arrived, or for the next epoch.
    for alg in [Centralized, BinaryTree] {
        let mut b = m(alg, 2, &[1, 2]);
        let (rel, rel2) = (mk(Release, 1, 0), mk(Release, 2, 0));
        assert_eq!(refuse(&mut b, 1, rel), E::Unexpected { from: 1, msg: rel });
        start(&mut b);
        assert_eq!(
            refuse(&mut b, 1, rel2),
            E::Unexpected { from: 1, msg: rel2 }
        );
        recv(&mut b, 1, rel).unwrap();
        assert!(b.is_complete());
    }
}

#[test]
fn early_messages_stay_in_their_epoch() {
    // Two participants; the peer is a whole epoch ahead (it completed 1 and started 2).
    let mut b = m(Dissemination, 0, &[0, 1]);
    let (r1, r2) = (mk(Round, 1, 0), mk(Round, 2, 0));
    start(&mut b);
    assert!(recv(&mut b, 1, r2).unwrap().is_empty());
    assert!(!b.is_complete(), "epoch 2's message completed epoch 1");
    assert_eq!(refuse(&mut b, 1, r2), E::Duplicate { from: 1, msg: r2 });
    recv(&mut b, 1, r1).unwrap();
    assert!(b.is_complete());
    assert_eq!(&start(&mut b)[..], &[(1, r2)]);
    assert!(b.is_complete() && b.epoch() == 2);
}

#[test]
fn rounds_formula() {
    let r = |alg, ps: [usize; 7]| ps.map(|p| rounds(alg, p));
    assert_eq!(
        r(Dissemination, [0, 1, 2, 3, 5, 8, 9]),
        [0, 0, 1, 2, 3, 3, 4]
    );
    assert_eq!(r(BinaryTree, [0, 1, 2, 3, 4, 7, 8]), [0, 0, 2, 2, 4, 4, 6]);
    assert_eq!(
        r(Centralized, [0, 1, 2, 3, 4, 7, 64]),
        [0, 0, 2, 2, 2, 2, 2]
    );
}

#[test]
fn errors_display() {
    use core::fmt::Write;
    let mut s = heapless::String::<128>::new();
    let msg = mk(Arrive, 1, 0);
    write!(s, "{}", E::Duplicate { from: 3, msg }).unwrap();
    assert!(s.starts_with("duplicate barrier message"));
}

/// Runs one barrier epoch of `ms` (indexed by rank) to completion, delivering messages in
/// FIFO order; returns every (from, to, msg) in the order sent.
fn run_epoch<const PEERS: usize>(
    ms: &mut [BarrierMachine<PEERS>],
) -> std::vec::Vec<(u32, u32, Msg)> {
    let mut queue = std::collections::VecDeque::new();
    let mut log = std::vec::Vec::new();
    for (r, b) in ms.iter_mut().enumerate() {
        b.start(&mut |to, msg| queue.push_back((r as u32, to, msg)))
            .unwrap();
    }
    while let Some((from, to, msg)) = queue.pop_front() {
        log.push((from, to, msg));
        let dst = &mut ms[to as usize];
        dst.on_message(from, msg, &mut |next, m| queue.push_back((to, next, m)))
            .unwrap();
    }
    assert!(ms.iter().all(BarrierMachine::is_complete));
    log
}

#[test]
fn a_world_machine_is_the_listed_machine_over_every_rank() {
    for alg in ALGS {
        for p in 1..=33u32 {
            let ranks: std::vec::Vec<u32> = (0..p).collect();
            let mut listed: std::vec::Vec<_> = (0..p)
                .map(|r| BarrierMachine::<40>::new(alg, r, &ranks).unwrap())
                .collect();
            let mut world: std::vec::Vec<_> = (0..p)
                .map(|r| BarrierMachine::<40>::new_world(alg, r, p as usize).unwrap())
                .collect();
            assert_eq!(world[0].participants(), None);
            assert_eq!(world[0].count(), p as usize);
            for _ in 0..3 {
                assert_eq!(
                    run_epoch(&mut listed),
                    run_epoch(&mut world),
                    "{alg:?} p={p}"
                );
            }
        }
    }
}

#[test]
fn a_world_machine_needs_capacity_for_its_fan_in_only() {
    let p = 1000;
    for alg in [Dissemination, BinaryTree] {
        let mut ms: std::vec::Vec<_> = (0..p as u32)
            .map(|r| BarrierMachine::<2>::new_world(alg, r, p).unwrap())
            .collect();
        run_epoch(&mut ms);
        run_epoch(&mut ms);
        assert_eq!(ms[0].epoch(), 2);
    }
    let root = BarrierMachine::<2>::new_world(Centralized, 0, p).map(drop);
    let fan_in = E::FanIn {
        children: 999,
        capacity: 2,
    };
    assert_eq!(root, Err(fan_in));
    assert!(BarrierMachine::<2>::new_world(Centralized, 7, p).is_ok());
    assert!(BarrierMachine::<0>::new_world(Dissemination, 7, 65536).is_ok());
    let new = |me, world| BarrierMachine::<4>::new_world(Dissemination, me, world).map(drop);
    assert_eq!(new(0, 0), Err(E::Empty));
    let too_many = E::TooMany {
        given: MAX_WORLD + 1,
        capacity: MAX_WORLD,
    };
    assert_eq!(new(0, MAX_WORLD + 1), Err(too_many));
    assert_eq!(new(5, 5), Err(E::NotMember(5)));
    assert_eq!(new(65535, 65536), Ok(()));
    // Ranks are 32 bits: past 16 bits, up to the last.
    assert_eq!(new(70_000, 262_144), Ok(()));
    assert_eq!(new(u32::MAX - 1, MAX_WORLD), Ok(()));
}

#[test]
fn neighbours_are_exactly_who_a_participant_talks_to() {
    for alg in ALGS {
        for p in 1..=70usize {
            let mut ms: std::vec::Vec<_> = (0..p as u32)
                .map(|r| BarrierMachine::<80>::new_world(alg, r, p).unwrap())
                .collect();
            let log = run_epoch(&mut ms);
            for i in 0..p {
                let mut talked: std::vec::Vec<usize> = log
                    .iter()
                    .filter_map(|&(f, t, _)| match (f as usize, t as usize) {
                        (f, t) if f == i => Some(t),
                        (f, t) if t == i => Some(f),
                        _ => None,
                    })
                    .collect();
                talked.sort_unstable();
                talked.dedup();
                let named: std::vec::Vec<usize> = neighbours(alg, i, p).collect();
                assert_eq!(named, talked, "{alg:?} p={p} i={i}");
            }
        }
    }
    assert_eq!(neighbours(Dissemination, 3, 3).count(), 0);
    assert_eq!(neighbours(Dissemination, 0, MAX_WORLD + 1).count(), 0);
    // 16 rounds each way; ±2^15 is one rank.
    assert_eq!(neighbours(Dissemination, 65535, 65536).count(), 31);
    // Past 16-bit ranks: 18 rounds at 2^18 ranks, ±2^17 one rank.
    assert_eq!(neighbours(Dissemination, 200_000, 1 << 18).count(), 35);
    let tree = |i| neighbours(BinaryTree, i, 1 << 18).collect::<std::vec::Vec<usize>>();
    assert_eq!(tree(100_000), [49_999, 200_001, 200_002]);
    assert_eq!(tree(200_000), [99_999]); // a leaf
}
