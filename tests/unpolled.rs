//! Channel operations on the simulator at the unpolled level: handles, their owners, and
//! how unpolled work and blocking calls share a queue.
#![cfg(feature = "sim")]

mod common;

use std::thread;

use common::{default_pair, pattern, ALL};
use zverbs::provider::sim::Sim;
use zverbs::{Error, ErrorKind, QpState, WcOpcode};

#[test]
fn unpolled_work_completes_through_its_handle() {
    let (mut a, mut b) = default_pair();
    let mut src = pattern(12, 4);
    let mut dst = [0u8; 12];
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut dst_mr = b.pd.register(&mut dst).unwrap();
    let recv_sge = dst_mr.slice_mut(..).unwrap().sge();
    // SAFETY: `dst` is not touched until `wait` below returned.
    let recv = unsafe { b.ch.post_receive_unpolled(&[recv_sge]) }.unwrap();
    let recv =
        b.ch.try_complete(recv)
            .unwrap()
            .expect_err("nothing sent yet");
    // SAFETY: `src` is not written until the send completed.
    let send = unsafe {
        a.ch.post_send_unpolled(
            &[src_mr.slice(..).unwrap().sge()],
            zverbs::SendOp::Send,
            zverbs::SendFlags::empty(),
        )
    }
    .unwrap();
    assert_eq!(a.ch.wait(send).unwrap().opcode, WcOpcode::Send);
    assert_eq!(b.ch.wait(recv).unwrap().byte_len, 12);
    assert_eq!(dst_mr.as_slice(), &pattern(12, 4)[..]);
}

/// A's 8 bytes of `pattern(8, 6)` and B's 16-byte target for writes: the regions, and a
/// write of all of A's bytes to the target's start.
struct Writes {
    src: zverbs::MemoryRegion<'static, zverbs::provider::sim::Sim>,
    target: zverbs::MemoryRegion<'static, zverbs::provider::sim::Sim>,
    remote: zverbs::RemoteRegion,
    sge: zverbs::Sge,
    op: zverbs::SendOp,
}

fn writes(a: &common::Side<16>, b: &common::Side<16>) -> Writes {
    let src =
        a.pd.register(Box::leak(pattern(8, 6).into_boxed_slice()))
            .unwrap();
    let target = Box::leak(Box::new([0u8; 16]));
    // SAFETY: the test reads `target` only after the writes into it have completed.
    let target = unsafe { b.pd.register_with_access(target, ALL) }.unwrap();
    let remote = target.remote();
    let op = zverbs::SendOp::Write {
        remote_addr: remote.addr,
        rkey: remote.rkey,
    };
    let sge = src.slice(..).unwrap().sge();
    Writes {
        src,
        target,
        remote,
        sge,
        op,
    }
}

#[test]
fn blocking_call_behind_unpolled_work_leaves_its_outcome_to_its_handle() {
    let (mut a, b) = default_pair();
    let Writes {
        src: src_mr,
        target: target_mr,
        remote,
        sge,
        op,
    } = writes(&a, &b);
    // SAFETY: `src` is never written.
    let first = unsafe {
        a.ch.post_send_unpolled(&[sge], op, zverbs::SendFlags::empty())
    }
    .unwrap();
    // The blocking write's wait polls the unpolled write's completion too (first, not its
    // own): it records it for the handle and still takes its own.
    a.ch.write([src_mr.slice(..).unwrap()], &remote.slice(8..).unwrap())
        .unwrap();
    assert_eq!(
        a.ch.in_flight(),
        (2, 0),
        "the handle's outcome waits for it, and slots retire in order"
    );
    assert_eq!(a.ch.wait(first).unwrap().opcode, WcOpcode::RdmaWrite);
    assert_eq!(a.ch.in_flight(), (0, 0));
    assert_eq!(&target_mr.as_slice()[..8], &pattern(8, 6)[..]);
    assert_eq!(&target_mr.as_slice()[8..], &pattern(8, 6)[..]);
}

#[test]
fn foreign_handle_is_refused_and_both_channels_work_completes() {
    let (mut a, mut b) = default_pair();
    let (a_qpn, b_qpn) = (a.ch.queue_pair().qp_num(), b.ch.queue_pair().qp_num());
    let mut a_buf = [0u8; 16];
    let mut b_buf = [0u8; 8];
    let mut a_mr = a.pd.register(&mut a_buf).unwrap();
    let mut b_mr = b.pd.register(&mut b_buf).unwrap();
    let (a_lost, a_kept) = a_mr.slice_mut(..).unwrap().split_at(8).unwrap();
    let (a_lost, a_kept) = (a_lost.sge(), a_kept.sge());
    let b_sge = b_mr.slice_mut(..).unwrap().sge();
    // Receive #0 on each side, then #1 on a: the same wr_ids on both channels.
    // SAFETY: no buffer is touched before its receive completed (or the test ends).
    let (lost, kept, own) = unsafe {
        (
            a.ch.post_receive_unpolled(&[a_lost]).unwrap(),
            a.ch.post_receive_unpolled(&[a_kept]).unwrap(),
            b.ch.post_receive_unpolled(&[b_sge]).unwrap(),
        )
    };
    assert_eq!((lost.wr_id(), own.wr_id()), (0, 0));
    assert_eq!((lost.qp_num(), own.qp_num()), (a_qpn, b_qpn));
    assert!(a.ch.owns(&lost) && a.ch.owns(&kept) && !b.ch.owns(&lost) && !b.ch.owns(&kept));
    assert!(b.ch.owns(&own) && !a.ch.owns(&own));

    // b's receive #0 completes...
    let mut msg = *b"to b";
    a.ch.send([a.pd.register(&mut msg).unwrap().slice(..).unwrap()])
        .unwrap();
    // ...and a's receive #0 handed to b must not take it.
    let e = b.ch.wait(lost).unwrap_err();
    assert_eq!(
        e,
        Error::ForeignPending {
            owner_qp_num: a_qpn,
            qp_num: b_qpn
        }
    );
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("another channel"), "{e}");
    assert_eq!(b.ch.in_flight(), (0, 1), "b's own receive still held");
    // Polling is refused the same way (a handle that exists only on a: wr_id 1).
    let e = b.ch.try_complete(kept).unwrap_err();
    assert!(matches!(e, Error::ForeignPending { .. }), "{e}");
    assert_eq!(b.ch.queue_pair().state().unwrap(), QpState::ReadyToSend);

    // b's own handle still completes with its own outcome.
    let got = b.ch.wait(own).unwrap();
    assert_eq!((got.opcode, got.byte_len), (WcOpcode::Recv, 4));
    assert_eq!(&b_mr.as_slice()[..4], b"to b");
    assert_eq!(b.ch.in_flight(), (0, 0));
    // a's receives were not disturbed either: b's messages land in them, in order.
    let mut first = *b"first";
    let mut second = *b"second";
    b.ch.send([b.pd.register(&mut first).unwrap().slice(..).unwrap()])
        .unwrap();
    b.ch.send([b.pd.register(&mut second).unwrap().slice(..).unwrap()])
        .unwrap();
    assert_eq!(&a_mr.as_slice()[..5], b"first");
    assert_eq!(&a_mr.as_slice()[8..14], b"second");
    assert_eq!(a.ch.queue_pair().state().unwrap(), QpState::ReadyToSend);
}

#[test]
fn handles_of_channels_with_the_same_queue_pair_number_are_told_apart() {
    // Two fabrics number their queue pairs alike: the number alone does not identify a
    // channel.
    let (mut a, _b) = default_pair();
    let (mut c, mut d) = default_pair();
    assert_eq!(a.ch.queue_pair().qp_num(), c.ch.queue_pair().qp_num());
    let mut buf = [0u8; 4];
    let mut mr = c.pd.register(&mut buf).unwrap();
    let sge = mr.slice_mut(..).unwrap().sge();
    // SAFETY: `buf` is not touched before the receive completed.
    let p = unsafe { c.ch.post_receive_unpolled(&[sge]) }.unwrap();
    assert!(!a.ch.owns(&p));
    // a has receives of the same wr_ids in flight, which must not be disturbed.
    // SAFETY: no memory named.
    let _a_own = unsafe {
        [
            a.ch.post_receive_unpolled(&[]).unwrap(),
            a.ch.post_receive_unpolled(&[]).unwrap(),
        ]
    };
    // SAFETY: no memory named.
    let q = unsafe { c.ch.post_receive_unpolled(&[]) }.unwrap();
    assert_eq!((p.wr_id(), q.wr_id()), (0, 1));
    let e = a.ch.wait(q).unwrap_err();
    assert!(
        matches!(e, Error::ForeignPending { owner_qp_num, qp_num } if owner_qp_num == qp_num),
        "{e}"
    );
    assert_eq!(a.ch.in_flight(), (0, 2));
    let mut msg = *b"abcd";
    d.ch.send([d.pd.register(&mut msg).unwrap().slice(..).unwrap()])
        .unwrap();
    assert_eq!(c.ch.wait(p).unwrap().byte_len, 4);
    assert_eq!(mr.as_slice(), b"abcd");
}

#[test]
fn try_complete_consumes_completed_work_so_nothing_is_left_to_wait_for() {
    // Short timeout: a wait on completed work (possible before try_complete consumed its
    // handle) would time out and kill the queue pair.
    let (mut a, mut b) = common::pair::<16>(std::time::Duration::from_millis(50));
    let mut dst = [0u8; 8];
    let mut dst_mr = b.pd.register(&mut dst).unwrap();
    let sge = dst_mr.slice_mut(..).unwrap().sge();
    // SAFETY: `dst` is read only after the receive completed.
    let mut pending = unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap();
    // Still in flight: the handle comes back, unchanged.
    let wr_id = pending.wr_id();
    pending = b.ch.try_complete(pending).unwrap().unwrap_err();
    assert_eq!(pending.wr_id(), wr_id);
    let mut msg = *b"once";
    a.ch.send([a.pd.register(&mut msg).unwrap().slice(..).unwrap()])
        .unwrap();
    let done = loop {
        pending = match b.ch.try_complete(pending).unwrap() {
            Ok(done) => break done,
            Err(p) => p,
        };
    };
    assert_eq!(done.byte_len, 4);
    // The handle is gone (`b.ch.wait(pending)` does not compile: tests/ui/
    // wait_after_try_complete.rs); the slot is free and the queue pair healthy.
    assert_eq!(b.ch.in_flight(), (0, 0));
    assert_eq!(b.ch.queue_pair().state().unwrap(), QpState::ReadyToSend);
    assert_eq!(&dst_mr.as_slice()[..4], b"once");
    // And the channel goes on working.
    let mut again = *b"more";
    let again = a.pd.register(&mut again).unwrap();
    thread::scope(|t| {
        t.spawn(|| a.ch.send([again.slice(..).unwrap()]).unwrap());
        assert_eq!(
            b.ch.receive([dst_mr.slice_mut(..).unwrap()])
                .unwrap()
                .byte_len,
            4
        );
    });
}

#[test]
fn try_complete_reports_an_error_completion_and_consumes_the_handle() {
    let (mut a, b) = default_pair();
    let mut src = [1u8; 8];
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut target = [0u8; 8];
    // SAFETY: `target` is read after the write completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let bad = zverbs::RemoteRegion {
        rkey: target_mr.rkey() ^ 1,
        ..target_mr.remote()
    };
    let op = zverbs::SendOp::Write {
        remote_addr: bad.addr,
        rkey: bad.rkey,
    };
    let sge = src_mr.slice(..).unwrap().sge();
    // SAFETY: `src` is not written before the write completed.
    let mut p = unsafe {
        a.ch.post_send_unpolled(&[sge], op, zverbs::SendFlags::empty())
    }
    .unwrap();
    let e = loop {
        p = match a.ch.try_complete(p) {
            Ok(Ok(c)) => panic!("a write with a bad rkey completed: {c:?}"),
            Ok(Err(p)) => p,
            Err(e) => break e,
        };
    };
    assert_eq!(
        e.completion().map(|c| c.status),
        Some(zverbs::WcStatus::RemAccessErr)
    );
    assert_eq!(a.ch.in_flight(), (0, 0));
    assert_eq!(target_mr.as_slice(), &[0; 8]);
}

/// Two writes completed, the later one asked for first: one `try_complete` reports it,
/// though the earlier one's completion comes first off the queue (and is kept for its own
/// handle).
#[test]
fn try_complete_reports_a_later_request_behind_an_earlier_completion() {
    let (mut a, b) = default_pair();
    let w = writes(&a, &b); // its regions stay registered until the end
    let (sge, op) = (w.sge, w.op);
    // SAFETY: `src` is never written.
    let first = unsafe {
        a.ch.post_send_unpolled(&[sge], op, zverbs::SendFlags::empty())
    }
    .unwrap();
    // SAFETY: as above.
    let second = unsafe {
        a.ch.post_send_unpolled(&[sge], op, zverbs::SendFlags::empty())
    }
    .unwrap();
    // Both completions are on the queue, unpolled: the simulator runs a request on an idle
    // connection inside its post; the pause covers a threaded fabric.
    thread::sleep(std::time::Duration::from_millis(50));
    let done = a.ch.try_complete(second).unwrap();
    assert_eq!(done.expect("completed").opcode, WcOpcode::RdmaWrite);
    let done = a.ch.try_complete(first).unwrap();
    assert_eq!(done.expect("completed").opcode, WcOpcode::RdmaWrite);
}

/// An outcome recorded by an earlier poll is the handle's, also once the device has died:
/// the work is finished, so its buffers must not be reported as still lent. Work still in
/// flight on the dead device is not handed back as done.
#[test]
fn try_complete_hands_back_a_recorded_outcome_after_the_device_dies() {
    let sim = Sim::with_devices(2);
    let cfg = zverbs::ChannelConfig {
        timeout: Some(std::time::Duration::from_secs(10)),
        ..zverbs::ChannelConfig::default()
    };
    let (mut a, b) = common::pair_on::<16>(&sim, &cfg, &cfg);
    let w = writes(&a, &b); // its regions stay registered until the end
                            // SAFETY: `src` is never written.
    let first = unsafe {
        a.ch.post_send_unpolled(&[w.sge], w.op, zverbs::SendFlags::empty())
    }
    .unwrap();
    // The blocking write's wait records the unpolled write's completion for its handle.
    a.ch.write([w.src.slice(..).unwrap()], &w.remote.slice(8..).unwrap())
        .unwrap();
    // A send B has posted no receive for: held back by RNR, in flight at the crash.
    // SAFETY: as above.
    let after = unsafe {
        a.ch.post_send_unpolled(&[w.sge], zverbs::SendOp::Send, zverbs::SendFlags::empty())
    }
    .unwrap();
    let after = match a.ch.try_complete(after).unwrap() {
        Ok(done) => panic!("completed before the crash was due: {done:?}"),
        Err(p) => p,
    };
    sim.fabric().crash(0).unwrap();
    let done =
        a.ch.try_complete(first)
            .unwrap()
            .expect("recorded before the crash");
    assert_eq!(done.opcode, WcOpcode::RdmaWrite);
    assert_eq!(&w.target.as_slice()[..8], &pattern(8, 6)[..]);
    assert!(!matches!(a.ch.try_complete(after), Ok(Ok(_))));
}
