//! Loom models over the simulator's provider, three threads each: the collectives of a
//! `MultiChannel` not covered by `tests/loom.rs` (`gather_receive`, `scatter_write`,
//! `gather_read`, `multicast_send`), and the simulator's send lanes where two of them meet
//! on one word of memory: two atomics on it, and an atomic racing the word's
//! deregistration.
//!
//! `RUSTFLAGS="--cfg loom" cargo test --release --features sim --test loom_collectives`.
//! Each model explores the whole space at preemption bound 1, then the first 2,000
//! executions at bound 2 (`explore` in `tests/loom_support`; `LOOM_MAX_PREEMPTIONS` and
//! `LOOM_MAX_PERMUTATIONS` override). Under `--cfg loom` the simulator's fabric gate, lane
//! flags, CQ writer locks and receive queues are loom's, so a lane that touched what
//! another lane or the exclusive side touches at the same time would be reported.
#![cfg(all(loom, feature = "sim"))]

mod loom_support;

use loom_support::{explore, leaves_receive, scoped, star};
use zverbs::{AccessFlags, ErrorKind, WcStatus};

const PASSES: &[(usize, Option<usize>)] = &[(1, None), (2, Some(2_000))];

/// The root gathers one receive from each leaf while each leaf sends in its own thread.
#[test]
fn gather_receive_from_two_leaves_sending_in_their_own_threads() {
    explore(PASSES, || {
        let mut s = star();
        let (mut m1, mut m2) = (*b"one1", *b"two2");
        let m1 = s.pds[1].register(&mut m1).unwrap();
        let m2 = s.pds[2].register(&mut m2).unwrap();
        let mut into = [0u8; 8];
        let mut into = s.pds[0].register(&mut into).unwrap();
        let (leaf1, leaf2) = s.leaves.split_at_mut(1);
        let (leaf1, leaf2) = (&mut leaf1[0], &mut leaf2[0]);
        let (m1, m2) = (&m1, &m2);
        scoped::scope(|t| {
            t.spawn(move || leaf1.send([m1.slice(..).unwrap()]).unwrap());
            t.spawn(move || leaf2.send([m2.slice(..).unwrap()]).unwrap());
            let (a, b) = into.slice_mut(..).unwrap().split_at(4).unwrap();
            let got = s.root.gather_receive([(1, a), (2, b)]).unwrap();
            assert_eq!(got[1].map(|c| c.byte_len), Some(4));
            assert_eq!(got[2].map(|c| c.byte_len), Some(4));
        });
        assert_eq!(into.as_slice(), b"one1two2");
        assert!(s.root.channels_mut().all(|(_, c)| c.in_flight() == (0, 0)));
    });
}

/// The root writes one part into each leaf's region, and reads each leaf's region back,
/// while each leaf writes into the root's region in its own thread (lanes in both
/// directions at once).
#[test]
fn scatter_write_and_gather_read_while_the_leaves_write_back() {
    explore(PASSES, || {
        let mut s = star();
        let mut parts = *b"to-1to-2";
        let parts = s.pds[0].register(&mut parts).unwrap();
        let mut back = [0u8; 8];
        let mut back = s.pds[0].register(&mut back).unwrap();
        let mut at_root = [0u8; 8];
        // SAFETY: read only after every thread joined and the registration is dropped.
        let root_reg =
            unsafe { s.pds[0].register_with_access(&mut at_root, AccessFlags::all()) }.unwrap();
        let root_remote = root_reg.remote();
        let (mut t1, mut t2) = ([0u8; 4], [0u8; 4]);
        // SAFETY: as above.
        let r1 = unsafe { s.pds[1].register_with_access(&mut t1, AccessFlags::all()) }.unwrap();
        let r2 = unsafe { s.pds[2].register_with_access(&mut t2, AccessFlags::all()) }.unwrap();
        let (rem1, rem2) = (r1.remote(), r2.remote());
        let (mut f1, mut f2) = (*b"from", *b"leaf");
        let f1 = s.pds[1].register(&mut f1).unwrap();
        let f2 = s.pds[2].register(&mut f2).unwrap();
        let (leaf1, leaf2) = s.leaves.split_at_mut(1);
        let (leaf1, leaf2) = (&mut leaf1[0], &mut leaf2[0]);
        let (f1, f2) = (&f1, &f2);
        let (at1, at2) = (
            root_remote.slice(0..4).unwrap(),
            root_remote.slice(4..8).unwrap(),
        );
        scoped::scope(|t| {
            t.spawn(move || leaf1.write([f1.slice(..).unwrap()], &at1).unwrap());
            t.spawn(move || leaf2.write([f2.slice(..).unwrap()], &at2).unwrap());
            let (one, two) = parts.slice(..).unwrap().split_at(4).unwrap();
            s.root
                .scatter_write([(1, one, &rem1), (2, two, &rem2)])
                .unwrap();
            let (a, b) = back.slice_mut(..).unwrap().split_at(4).unwrap();
            s.root.gather_read([(1, a, &rem1), (2, b, &rem2)]).unwrap();
        });
        assert_eq!(back.as_slice(), b"to-1to-2", "read back what was written");
        drop((root_reg, r1, r2));
        assert_eq!((&t1, &t2), (b"to-1", b"to-2"));
        assert_eq!(&at_root, b"fromleaf");
    });
}

/// The root sends one buffer to both leaves, each receiving in its own thread.
#[test]
fn multicast_send_to_two_leaves_receiving_in_their_own_threads() {
    explore(PASSES, || {
        let got = leaves_receive(&mut star(), |root, pd| {
            let mut msg = *b"all!";
            let msg = pd.register(&mut msg).unwrap();
            root.multicast_send([1, 2], msg.slice(..).unwrap()).unwrap();
        });
        assert_eq!(got, [*b"all!", *b"all!"]);
    });
}

/// An 8-byte-aligned word.
#[repr(align(8))]
struct Word([u8; 8]);

/// Two leaves' lanes run a fetch-and-add each on one word of the root's, at once: the
/// word ends at 2 and the two old values are 0 and 1 (one serial order).
#[test]
fn two_lanes_add_to_one_word() {
    explore(PASSES, || {
        let mut s = star();
        let mut word = Word([0; 8]);
        // SAFETY: read only after every thread joined and the registration is dropped.
        let reg =
            unsafe { s.pds[0].register_with_access(&mut word.0, AccessFlags::all()) }.unwrap();
        let remote = reg.remote();
        let (mut o1, mut o2) = (Word([0; 8]), Word([0; 8]));
        let mut o1 = s.pds[1].register(&mut o1.0).unwrap();
        let mut o2 = s.pds[2].register(&mut o2.0).unwrap();
        let (leaf1, leaf2) = s.leaves.split_at_mut(1);
        let (leaf1, leaf2) = (&mut leaf1[0], &mut leaf2[0]);
        let (mut old1, mut old2) = (None, None);
        let (r1, r2, remote) = (&mut o1, &mut o2, &remote);
        let (v1, v2) = (&mut old1, &mut old2);
        scoped::scope(|t| {
            t.spawn(move || {
                *v1 = Some(
                    leaf1
                        .fetch_add(r1.slice_mut(..).unwrap(), remote, 1)
                        .unwrap(),
                )
            });
            t.spawn(move || {
                *v2 = Some(
                    leaf2
                        .fetch_add(r2.slice_mut(..).unwrap(), remote, 1)
                        .unwrap(),
                )
            });
        });
        drop(reg);
        let mut olds = [old1.unwrap(), old2.unwrap()];
        olds.sort_unstable();
        assert_eq!(olds, [0, 1]);
        assert_eq!(u64::from_ne_bytes(word.0), 2);
    });
}

/// A leaf's lane runs a fetch-and-add on a word of the root's while the root deregisters
/// the word (the exclusive side, after draining the lanes): the atomic lands before the
/// deregistration (old value 0, the word 1), or finds no registration and fails with
/// `REM_ACCESS_ERR` (the word untouched). Never a write into memory no longer registered.
#[test]
fn a_lane_and_the_deregistration_of_its_target() {
    explore(PASSES, || {
        let mut s = star();
        let mut word = Word([0; 8]);
        // SAFETY: read only after every thread joined and the registration is dropped.
        let reg =
            unsafe { s.pds[0].register_with_access(&mut word.0, AccessFlags::all()) }.unwrap();
        let remote = reg.remote();
        let mut o1 = Word([0; 8]);
        let mut o1 = s.pds[1].register(&mut o1.0).unwrap();
        let leaf1 = &mut s.leaves[0];
        let mut outcome = None;
        let (r1, remote, out) = (&mut o1, &remote, &mut outcome);
        scoped::scope(|t| {
            t.spawn(move || *out = Some(leaf1.fetch_add(r1.slice_mut(..).unwrap(), remote, 1)));
            drop(reg);
        });
        let last = u64::from_ne_bytes(word.0);
        match outcome.unwrap() {
            Ok(old) => assert_eq!((old, last), (0, 1)),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Completion, "{e}");
                assert_eq!(
                    e.completion().map(|c| c.status),
                    Some(WcStatus::RemAccessErr)
                );
                assert_eq!(last, 0, "nothing written after the deregistration");
            }
        }
    });
}
