//! Prepared batches on the simulator: built and checked once, posted many times, refused
//! where they do not fit, and failing as a scope's own requests fail.
#![cfg(feature = "sim")]

mod common;

use std::ops::Range;
use std::time::Duration;

use common::{default_pair, pattern, ALL};
use zverbs::provider::sim::Sim;
use zverbs::{Batch, Error, MemoryRegion, Op, QpState, RemoteRegion, WcOpcode, WcStatus};

/// Pushes a write of `src[at]` into `remote` at the same offset; returns its index.
fn push_write<'a, const N: usize>(
    batch: &mut Batch<'a, Sim, N>,
    src: &'a MemoryRegion<'_, Sim>,
    remote: &RemoteRegion,
    at: Range<usize>,
) -> usize {
    let to = remote.slice(at.start as u64..).unwrap();
    batch
        .push(Op::write([src.slice(at).unwrap()], &to))
        .unwrap()
}

#[test]
fn a_batch_posted_again_and_again_repeats_its_requests_and_leaves_nothing_in_flight() {
    // A ring of 4 and a batch of 3: every second post needs room made first.
    let (mut a, b) = common::pair::<4>(Duration::from_secs(10));
    let mut counter = [0u8; 8];
    let mut olds = [0u8; 8];
    let mut src = pattern(8, 3);
    // SAFETY: read after the scopes.
    let counter_mr = unsafe { b.pd.register_with_access(&mut counter, ALL) }.unwrap();
    let mut target = [0u8; 8];
    // SAFETY: read after the scopes.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let mut olds_mr = a.pd.register(&mut olds).unwrap();
    let src_mr = a.pd.register(&mut src).unwrap();
    let (word, remote) = (counter_mr.remote(), target_mr.remote());
    let mut batch: Batch<_, 3> = a.ch.batch();
    assert!(batch.is_empty());
    assert_eq!(
        batch
            .push(Op::fetch_add(olds_mr.slice_mut(..).unwrap(), &word, 5))
            .unwrap(),
        0
    );
    assert_eq!(push_write(&mut batch, &src_mr, &remote, 0..4), 1);
    assert_eq!(push_write(&mut batch, &src_mr, &remote, 4..8), 2);
    assert_eq!(batch.len(), 3);
    assert_eq!(format!("{batch:?}"), "Batch { len: 3, capacity: 3, .. }");

    let mut posted = Vec::new();
    for _ in 0..3 {
        a.ch.scope(|s| {
            posted.push(s.post_batch(&mut batch)?);
            posted.push(s.post_batch(&mut batch)?);
            Ok(())
        })
        .unwrap();
        assert_eq!(a.ch.in_flight(), (0, 0));
    }
    let starts: Vec<u64> = posted.iter().map(|r| r.start).collect();
    assert_eq!(starts, [0, 3, 6, 9, 12, 15], "consecutive sequence numbers");
    assert!(posted.iter().all(|r| r.end - r.start == 3));
    assert_eq!(
        u64::from_ne_bytes(counter_mr.as_slice().try_into().unwrap()),
        30
    );
    assert_eq!(
        u64::from_ne_bytes(olds_mr.as_slice().try_into().unwrap()),
        25,
        "the last old value"
    );
    assert_eq!(target_mr.as_slice(), &pattern(8, 3)[..]);
}

#[test]
fn a_batch_goes_out_after_what_the_scope_staged_and_its_requests_can_be_waited_for() {
    let (mut a, b) = default_pair();
    let mut src = pattern(12, 5);
    let mut target = [0u8; 12];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the scope.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let remote = target_mr.remote();
    let mut batch: Batch<_, 2> = a.ch.batch();
    push_write(&mut batch, &src_mr, &remote, 4..8);
    push_write(&mut batch, &src_mr, &remote, 8..12);
    let (staged, posted, first, last) =
        a.ch.scope(|s| {
            let staged = s.post_write([src_mr.slice(..4)?], &remote)?;
            let posted = s.post_batch(&mut batch)?;
            let first = s.wait_send(posted.start)?;
            let last = s.wait_send(posted.end - 1)?;
            Ok((staged, posted, first, last))
        })
        .unwrap();
    assert_eq!((staged, posted), (0, 1..3));
    assert_eq!(
        (first.status, first.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(
        (last.status, last.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(target_mr.as_slice(), &pattern(12, 5)[..]);
}

#[test]
fn a_batch_refuses_more_requests_than_it_or_the_ring_holds() {
    let (a, b) = common::pair::<4>(Duration::from_secs(10));
    let mut src = [0u8; 4];
    let mut target = [0u8; 4];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: never read while a peer could write it.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let (slice, remote) = (src_mr.slice(..).unwrap(), target_mr.remote());
    let mut small: Batch<_, 2> = a.ch.batch();
    let mut large: Batch<_, 8> = a.ch.batch();
    for _ in 0..2 {
        small.push(Op::write([slice], &remote)).unwrap();
    }
    for _ in 0..4 {
        large.push(Op::write([slice], &remote)).unwrap();
    }
    let err = small.push(Op::write([slice], &remote)).unwrap_err();
    assert!(matches!(err, Error::InvalidAttribute(_)), "{err}");
    let err = large.push(Op::write([slice], &remote)).unwrap_err();
    assert!(
        matches!(err, Error::InvalidAttribute(_)),
        "the ring's DEPTH bounds it: {err}"
    );
    assert_eq!((small.len(), large.len()), (2, 4));
}

#[test]
fn a_batch_checks_each_operation_when_pushed_and_keeps_only_those_that_pass() {
    let (mut a, b) = default_pair();
    let mut src = pattern(16, 7);
    let mut result = [0u8; 4];
    let mut target = [0u8; 8];
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut result_mr = a.pd.register(&mut result).unwrap();
    // SAFETY: read after the scope.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let remote = target_mr.remote();
    let s = |r: core::ops::Range<usize>| src_mr.slice(r).unwrap();
    let mut batch: Batch<_, 4> = a.ch.batch();
    batch.push(Op::write([s(0..4)], &remote)).unwrap();

    let err = batch.push(Op::write([s(0..16)], &remote)).unwrap_err();
    assert!(
        matches!(err, Error::OutOfBounds(_)),
        "16 bytes into 8: {err}"
    );
    let five = [s(0..1), s(1..2), s(2..3), s(3..4), s(4..5)];
    let err = batch.push(Op::write(five, &remote)).unwrap_err();
    assert!(
        matches!(err, Error::TooManySges { given: 5, max: 4 }),
        "{err}"
    );
    let err = batch
        .push(Op::fetch_add(result_mr.slice_mut(..).unwrap(), &remote, 1))
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidAttribute(_)),
        "a 4-byte atomic result: {err}"
    );
    assert_eq!(batch.len(), 1, "refused operations are not kept");

    push_write(&mut batch, &src_mr, &remote, 4..8);
    a.ch.scope(|s| s.post_batch(&mut batch).map(drop)).unwrap();
    assert_eq!(a.ch.in_flight(), (0, 0));
    assert_eq!(target_mr.as_slice(), &pattern(16, 7)[..8]);
}

#[test]
fn a_batch_is_posted_only_on_the_channel_that_made_it() {
    let (mut a, b) = default_pair();
    let (mut c, _d) = default_pair();
    let mut src = [1u8; 4];
    let mut target = [0u8; 4];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the scopes.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let mut batch: Batch<_, 1> = a.ch.batch();
    batch
        .push(Op::write([src_mr.slice(..).unwrap()], &target_mr.remote()))
        .unwrap();
    let err = c.ch.scope(|s| s.post_batch(&mut batch)).unwrap_err();
    assert!(matches!(err, Error::InvalidAttribute(_)), "{err}");
    assert_eq!(c.ch.in_flight(), (0, 0));
    let mut empty: Batch<_, 1> = a.ch.batch();
    let posted = a.ch.scope(|s| s.post_batch(&mut empty)).unwrap();
    assert!(posted.is_empty(), "an empty batch posts nothing");
    assert_eq!(a.ch.in_flight(), (0, 0));
    a.ch.scope(|s| s.post_batch(&mut batch).map(drop)).unwrap();
    assert_eq!(target_mr.as_slice(), &[1; 4], "posted where it was made");
}

#[test]
fn a_request_of_a_batch_that_fails_ends_the_scope_with_its_error_after_the_rest() {
    let (mut a, b) = default_pair();
    let mut src = pattern(8, 1);
    let mut target = [0u8; 8];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the scope.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let good = target_mr.remote();
    let bad = zverbs::RemoteRegion {
        rkey: good.rkey ^ 0x5555,
        ..good
    };
    let mut batch: Batch<_, 3> = a.ch.batch();
    push_write(&mut batch, &src_mr, &good, 0..4);
    batch
        .push(Op::write([src_mr.slice(4..).unwrap()], &bad))
        .unwrap();
    push_write(&mut batch, &src_mr, &good, 4..8);
    let mut posted = 0..0;
    let err =
        a.ch.scope(|s| {
            posted = s.post_batch(&mut batch)?;
            Ok(())
        })
        .unwrap_err();
    let c = err.completion().expect("a completion error");
    assert_eq!(
        (c.status, c.wr_id),
        (WcStatus::RemAccessErr, posted.start + 1)
    );
    assert_eq!(c.opcode, WcOpcode::RdmaWrite);
    assert_eq!(
        a.ch.in_flight(),
        (0, 0),
        "the flushed third write was waited for"
    );
    assert_eq!(a.ch.queue_pair().state().unwrap(), QpState::Error);
    assert_eq!(&target_mr.as_slice()[..4], &pattern(8, 1)[..4]);
    assert_eq!(
        &target_mr.as_slice()[4..],
        &[0; 4],
        "failed and flushed writes did not land"
    );
}

#[test]
fn a_datagram_channel_posts_a_batch_of_datagrams() {
    use zverbs::qp::{AddressHandle, Ud, UdOptions};
    use zverbs::{AhAttr, Channel, ChannelConfig, Context, Destination};

    let sim = Sim::with_devices(2);
    let opts = UdOptions {
        qkey: 0x1111,
        pkey_index: 0,
    };
    let (ca, cb) = (
        Context::open(&sim, "sim0").unwrap(),
        Context::open(&sim, "sim1").unwrap(),
    );
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let cfg = ChannelConfig::default();
    let mut a = Channel::<Sim, 16, 1, Ud>::datagram(&ca, &pa, &cfg, &opts).unwrap();
    let mut b = Channel::<Sim, 16, 1, Ud>::datagram(&cb, &pb, &cfg, &opts).unwrap();
    let to = b.queue_pair().endpoint();
    let ah = AddressHandle::create(&pa, &AhAttr::new(1, to.gid, 0, to.lid)).unwrap();
    let dest = Destination::new(&ah, to.qp_num, 0x1111);
    let mut msg = *b"onetwo";
    let msg = pa.register(&mut msg).unwrap();
    let (mut first, mut second) = ([0u8; 40 + 3], [0u8; 40 + 3]);
    let mut first = pb.register(&mut first).unwrap();
    let mut second = pb.register(&mut second).unwrap();
    let mut batch: Batch<Sim, 2, 1, Ud> = a.batch();
    batch
        .push(Op::datagram([msg.slice(..3).unwrap()], &dest))
        .unwrap();
    batch
        .push(Op::datagram([msg.slice(3..).unwrap()], &dest))
        .unwrap();
    let lens = b
        .scope(|s| {
            let got = [
                s.post_receive([first.slice_mut(..)?])?,
                s.post_receive([second.slice_mut(..)?])?,
            ];
            s.ring_doorbell()?; // posted now: a datagram that finds no receive is lost
            a.scope(|s| s.post_batch(&mut batch).map(drop))?;
            let [one, two] = got;
            Ok([s.wait_receive(one)?.byte_len, s.wait_receive(two)?.byte_len])
        })
        .unwrap();
    assert_eq!(lens, [43, 43]);
    assert_eq!(&first.as_slice()[40..], b"one");
    assert_eq!(&second.as_slice()[40..], b"two");
}

#[test]
fn a_batch_the_ring_has_no_room_for_beside_unpolled_work_is_refused_as_a_full_queue_at_both_levels()
{
    let (mut a, b) = common::pair::<4>(Duration::from_secs(10));
    let mut src = [9u8; 4];
    let mut target = [0u8; 4];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after every write completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let remote = target_mr.remote();
    let write = zverbs::SendOp::Write {
        remote_addr: remote.addr,
        rkey: remote.rkey,
    };
    let sge = src_mr.slice(..).unwrap().sge();
    // SAFETY: `src` is not written until both are redeemed below.
    let early = unsafe {
        [
            a.ch.post_send_unpolled(&[sge], write, zverbs::SendFlags::SIGNALED),
            a.ch.post_send_unpolled(&[sge], write, zverbs::SendFlags::SIGNALED),
        ]
    };
    let mut batch: Batch<_, 3> = a.ch.batch();
    for _ in 0..3 {
        batch
            .push(Op::write([src_mr.slice(..).unwrap()], &remote))
            .unwrap();
    }
    let err = a.ch.scope(|s| s.post_batch(&mut batch)).unwrap_err();
    assert!(matches!(err, Error::QueueFull { capacity: 4 }), "{err}");
    let err = a.ch.execute_batch(&mut batch).unwrap_err();
    assert!(matches!(err, Error::QueueFull { capacity: 4 }), "{err}");
    assert_eq!(a.ch.in_flight(), (2, 0), "nothing of the batch posted");
    for p in early {
        a.ch.wait(p.unwrap()).unwrap();
    }
    a.ch.scope(|s| s.post_batch(&mut batch).map(drop)).unwrap();
    a.ch.execute_batch(&mut batch).unwrap();
    assert_eq!(a.ch.in_flight(), (0, 0));
    assert_eq!(target_mr.as_slice(), &[9; 4]);
}

#[test]
fn a_multi_peer_scope_posts_a_peers_batch_after_what_it_staged_and_refuses_another_channels() {
    use zverbs::{ChannelConfig, Context, MultiChannel};

    let sim = Sim::with_devices(2);
    let (c0, c1) = (
        Context::open(&sim, "sim0").unwrap(),
        Context::open(&sim, "sim1").unwrap(),
    );
    let (p0, p1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let cfg = ChannelConfig::default();
    let a = MultiChannel::<Sim, 2, 4>::prepare(&c0, &p0, [1], &cfg).unwrap();
    let b = MultiChannel::<Sim, 2, 4>::prepare(&c1, &p1, [0], &cfg).unwrap();
    let (ea, eb) = (a.endpoint(1).unwrap(), b.endpoint(0).unwrap());
    let mut a = a.connect(|_| Some(eb)).unwrap();
    let _b = b.connect(|_| Some(ea)).unwrap();
    let mut target = [0u8; 12];
    // SAFETY: read after the scope.
    let target_mr = unsafe { p1.register_with_access(&mut target, ALL) }.unwrap();
    let mut src = pattern(12, 9);
    let src_mr = p0.register(&mut src).unwrap();
    let remote = target_mr.remote();
    let mut batch: Batch<Sim, 2> = a.peer(1).unwrap().batch();
    push_write(&mut batch, &src_mr, &remote, 4..8);
    push_write(&mut batch, &src_mr, &remote, 8..12);
    let (other_a, _other_b) = default_pair();
    let mut foreign: Batch<Sim, 1> = other_a.ch.batch();
    let mut one = [0u8; 4];
    let one = other_a.pd.register(&mut one).unwrap();
    foreign
        .push(Op::write([one.slice(..).unwrap()], &remote))
        .unwrap();

    let posted = a
        .scope(|s| {
            let staged = s.post_write(1, [src_mr.slice(..4)?], &remote)?;
            let refused = s.post_batch(1, &mut foreign).unwrap_err();
            assert!(matches!(refused, Error::InvalidAttribute(_)), "{refused}");
            // The ring of 4 holds the staged write and one batch: the second waits for room.
            let first = s.post_batch(1, &mut batch)?;
            let second = s.post_batch(1, &mut batch)?;
            Ok((staged, first, second))
        })
        .unwrap();
    assert_eq!(posted, (0, 1..3, 3..5));
    assert_eq!(a.peer(1).unwrap().in_flight(), (0, 0));
    assert_eq!(target_mr.as_slice(), &pattern(12, 9)[..]);
    assert!(
        a.scope(|s| s.post_batch(0, &mut batch)).is_err(),
        "no peer 0"
    );
}

#[test]
fn an_executed_batch_is_waited_for_whole_and_leaves_earlier_unpolled_work_to_its_handle() {
    // A ring of 4 and a batch of 3: each execution takes the ring's room and gives it back.
    let (mut a, b) = common::pair::<4>(Duration::from_secs(10));
    let mut src = pattern(12, 5);
    let mut target = [0u8; 12];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after every write completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let remote = target_mr.remote();
    let mut batch: Batch<_, 3> = a.ch.batch();
    for at in [0..4, 4..8, 8..12] {
        push_write(&mut batch, &src_mr, &remote, at);
    }
    for _ in 0..5 {
        a.ch.execute_batch(&mut batch).unwrap();
        assert_eq!(a.ch.in_flight(), (0, 0));
    }
    // Behind a request posted unpolled, whose completion the execution's first poll
    // brings: recorded for its handle, and the batch waited for all the same.
    let (sge, to) = (src_mr.slice(..4).unwrap().sge(), remote.slice(0..).unwrap());
    let write = zverbs::SendOp::Write {
        remote_addr: to.addr,
        rkey: to.rkey,
    };
    // SAFETY: `src` is not written until the handle is redeemed below.
    let early = unsafe {
        a.ch.post_send_unpolled(&[sge], write, zverbs::SendFlags::SIGNALED)
    };
    let early = early.unwrap();
    a.ch.execute_batch(&mut batch).unwrap();
    assert_eq!(
        a.ch.in_flight(),
        (4, 0),
        "the batch's slots wait behind the untaken outcome"
    );
    let done =
        a.ch.try_complete(early)
            .unwrap()
            .expect("its outcome was recorded");
    assert_eq!(done.opcode, WcOpcode::RdmaWrite);
    assert_eq!(a.ch.in_flight(), (0, 0));
    assert_eq!(target_mr.as_slice(), &pattern(12, 5)[..]);
}

#[test]
fn an_executed_batch_reports_its_first_failure_after_the_rest_and_refuses_what_it_must() {
    let (mut a, b) = default_pair();
    let (mut c, _d) = default_pair();
    let mut src = pattern(8, 2);
    let mut target = [0u8; 8];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the executions.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let good = target_mr.remote();
    let bad = RemoteRegion {
        rkey: good.rkey ^ 0x5555,
        ..good
    };
    let mut empty: Batch<_, 1> = a.ch.batch();
    a.ch.execute_batch(&mut empty).unwrap();
    assert_eq!(a.ch.in_flight(), (0, 0), "an empty batch posts nothing");
    let mut batch: Batch<_, 3> = a.ch.batch();
    push_write(&mut batch, &src_mr, &good, 0..4);
    batch
        .push(Op::write([src_mr.slice(4..).unwrap()], &bad))
        .unwrap();
    push_write(&mut batch, &src_mr, &good, 4..8);
    let err = c.ch.execute_batch(&mut batch).unwrap_err();
    assert!(matches!(err, Error::InvalidAttribute(_)), "{err}");
    assert_eq!(
        c.ch.in_flight(),
        (0, 0),
        "nothing posted on another channel"
    );
    let err = a.ch.execute_batch(&mut batch).unwrap_err();
    let failed = err.completion().expect("a completion error");
    assert_eq!((failed.status, failed.wr_id), (WcStatus::RemAccessErr, 1));
    assert_eq!(failed.opcode, WcOpcode::RdmaWrite);
    assert_eq!(a.ch.in_flight(), (0, 0), "the flushed third was waited for");
    assert_eq!(a.ch.queue_pair().state().unwrap(), QpState::Error);
    assert_eq!(&target_mr.as_slice()[..4], &pattern(8, 2)[..4]);
    assert_eq!(
        &target_mr.as_slice()[4..],
        &[0; 4],
        "nothing after the failure"
    );
}
