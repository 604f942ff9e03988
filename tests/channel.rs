//! Channel operations on the simulator: every opcode at the blocking, scoped and unpolled
//! levels, asserting status, byte count, immediate data and memory.
#![cfg(feature = "sim")]

mod common;

use std::thread;

use common::{default_pair, pattern, ALL};
use zverbs::{AccessFlags, Error, ErrorKind, QpState, WcOpcode};

#[test]
fn send_and_receive_deliver_bytes_and_length() {
    let (mut a, mut b) = default_pair();
    let mut src = pattern(100, 1);
    let mut dst = vec![0xEEu8; 128];
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut dst_mr = b.pd.register(&mut dst).unwrap();
    thread::scope(|t| {
        t.spawn(|| a.ch.send([src_mr.slice(..).unwrap()]).unwrap());
        let got = b.ch.receive([dst_mr.slice_mut(..).unwrap()]).unwrap();
        assert_eq!(got.byte_len, 100);
        assert_eq!(got.imm, None);
        assert_eq!(got.opcode, WcOpcode::Recv);
    });
    assert_eq!(&dst_mr.as_slice()[..100], &pattern(100, 1)[..]);
    assert_eq!(
        &dst_mr.as_slice()[100..],
        &[0xEE; 28][..],
        "bytes past the message untouched"
    );
}

#[test]
fn send_with_imm_delivers_immediate() {
    let (mut a, mut b) = default_pair();
    let mut src = *b"imm!";
    let mut dst = [0u8; 4];
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut dst_mr = b.pd.register(&mut dst).unwrap();
    thread::scope(|t| {
        t.spawn(|| {
            a.ch.send_with_imm([src_mr.slice(..).unwrap()], 0xDEAD_BEEF)
                .unwrap()
        });
        let got = b.ch.receive([dst_mr.slice_mut(..).unwrap()]).unwrap();
        assert_eq!((got.byte_len, got.imm), (4, Some(0xDEAD_BEEF)));
    });
    assert_eq!(dst_mr.as_slice(), b"imm!");
}

#[test]
fn inline_send_needs_no_registration() {
    let (mut a, mut b) = default_pair();
    let mut dst = [0u8; 32];
    let mut dst_mr = b.pd.register(&mut dst).unwrap();
    let unregistered = pattern(20, 9);
    thread::scope(|t| {
        t.spawn(|| a.ch.send_inline(&unregistered).unwrap());
        assert_eq!(
            b.ch.receive([dst_mr.slice_mut(..).unwrap()])
                .unwrap()
                .byte_len,
            20
        );
    });
    assert_eq!(&dst_mr.as_slice()[..20], &unregistered[..]);
    assert_eq!(&dst_mr.as_slice()[20..], &[0; 12]);
}

#[test]
fn inline_send_longer_than_the_queue_pair_allows_is_refused() {
    let (mut a, _b) = default_pair();
    let too_long = vec![1u8; 65]; // QpConfig::default() allows 64 inline bytes
    let err = a.ch.send_inline(&too_long).unwrap_err();
    assert_eq!(err.kind(), zverbs::ErrorKind::InvalidArgument, "{err}");
    assert_eq!(
        a.ch.in_flight(),
        (0, 0),
        "the refused request gave its slot back"
    );
}

#[test]
fn multi_sge_gathers_on_send_and_scatters_on_receive() {
    let (mut a, mut b) = default_pair();
    let mut src = pattern(30, 3);
    let mut dst = [0u8; 40];
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut dst_mr = b.pd.register(&mut dst).unwrap();
    thread::scope(|t| {
        // Gather [20..30] ++ [0..5] ++ [10..20]: 25 bytes.
        t.spawn(|| {
            let parts = [
                src_mr.slice(20..30).unwrap(),
                src_mr.slice(0..5).unwrap(),
                src_mr.slice(10..20).unwrap(),
            ];
            a.ch.send(parts).unwrap()
        });
        // Scatter into [30..40] then [0..20].
        let (head, tail) = dst_mr.slice_mut(..).unwrap().split_at(30).unwrap();
        let (head, _) = head.split_at(20).unwrap();
        assert_eq!(b.ch.receive([tail, head]).unwrap().byte_len, 25);
    });
    let p = pattern(30, 3);
    let mut expect = [0u8; 40];
    expect[30..40].copy_from_slice(&p[20..30]);
    expect[0..5].copy_from_slice(&p[0..5]);
    expect[5..15].copy_from_slice(&p[10..20]);
    assert_eq!(dst_mr.as_slice(), &expect[..]);
}

#[test]
fn write_lands_in_range_and_nowhere_else() {
    let (mut a, b) = default_pair();
    let mut src = pattern(16, 5);
    let mut target = [0x11u8; 64];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: nothing reads `target` until the write has completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let remote = target_mr.remote().slice(24..40).unwrap();
    a.ch.write([src_mr.slice(..).unwrap()], &remote).unwrap();
    assert_eq!(&target_mr.as_slice()[24..40], &pattern(16, 5)[..]);
    assert_eq!(&target_mr.as_slice()[..24], &[0x11; 24]);
    assert_eq!(&target_mr.as_slice()[40..], &[0x11; 24]);
}

#[test]
fn write_with_imm_consumes_a_receive() {
    let (mut a, mut b) = default_pair();
    let mut src = pattern(8, 7);
    let mut target = [0u8; 8];
    let mut scratch = [0u8; 4];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: `target` is read only after the receive completed, i.e. after the write.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let mut scratch_mr = b.pd.register(&mut scratch).unwrap();
    let remote = target_mr.remote();
    thread::scope(|t| {
        t.spawn(|| {
            a.ch.write_with_imm([src_mr.slice(..).unwrap()], &remote, 77)
                .unwrap()
        });
        let got = b.ch.receive([scratch_mr.slice_mut(..).unwrap()]).unwrap();
        assert_eq!(
            (got.opcode, got.byte_len, got.imm),
            (WcOpcode::RecvRdmaWithImm, 8, Some(77))
        );
    });
    assert_eq!(target_mr.as_slice(), &pattern(8, 7)[..]);
    assert_eq!(
        scratch_mr.as_slice(),
        &[0; 4],
        "write-with-imm does not use the receive buffer"
    );
}

#[test]
fn read_fetches_remote_bytes() {
    let (mut a, b) = default_pair();
    let mut remote_buf = pattern(32, 11);
    let mut local = [0u8; 16];
    // SAFETY: the remote buffer is only read by the peer.
    let remote_mr = unsafe {
        b.pd.register_with_access(&mut remote_buf, AccessFlags::REMOTE_READ)
    }
    .unwrap();
    let mut local_mr = a.pd.register(&mut local).unwrap();
    let remote = remote_mr.remote().slice(8..24).unwrap();
    a.ch.read([local_mr.slice_mut(..).unwrap()], &remote)
        .unwrap();
    assert_eq!(local_mr.as_slice(), &pattern(32, 11)[8..24]);
}

#[test]
fn atomics_return_the_old_value_and_update_remote() {
    let (mut a, b) = default_pair();
    let mut counter = [0u8; 16];
    counter[8..].copy_from_slice(&40u64.to_ne_bytes());
    let mut result = [0u8; 8];
    // SAFETY: `counter` is read only after the atomics completed.
    let counter_mr = unsafe { b.pd.register_with_access(&mut counter, ALL) }.unwrap();
    let mut result_mr = a.pd.register(&mut result).unwrap();
    let word = counter_mr.remote().slice(8..16).unwrap();

    assert_eq!(
        a.ch.fetch_add(result_mr.slice_mut(..).unwrap(), &word, 2)
            .unwrap(),
        40
    );
    assert_eq!(
        a.ch.compare_swap(result_mr.slice_mut(..).unwrap(), &word, 41, 7)
            .unwrap(),
        42,
        "no swap"
    );
    assert_eq!(
        a.ch.compare_swap(result_mr.slice_mut(..).unwrap(), &word, 42, 7)
            .unwrap(),
        42,
        "swap"
    );
    assert_eq!(
        u64::from_ne_bytes(result_mr.as_slice().try_into().unwrap()),
        42
    );
    assert_eq!(
        u64::from_ne_bytes(counter_mr.as_slice()[8..].try_into().unwrap()),
        7
    );
    assert_eq!(&counter_mr.as_slice()[..8], &[0; 8]);
}

#[test]
fn atomic_result_slice_must_be_eight_bytes() {
    let (mut a, b) = default_pair();
    let mut counter = [0u8; 8];
    let mut result = [0u8; 16];
    // SAFETY: never read while a peer could write it.
    let counter_mr = unsafe { b.pd.register_with_access(&mut counter, ALL) }.unwrap();
    let mut result_mr = a.pd.register(&mut result).unwrap();
    let err =
        a.ch.fetch_add(result_mr.slice_mut(..).unwrap(), &counter_mr.remote(), 1)
            .unwrap_err();
    assert!(matches!(err, Error::InvalidAttribute(_)), "{err}");
}

#[test]
fn scope_batches_many_sends_and_receives() {
    let (mut a, mut b) = default_pair();
    let mut src = pattern(64, 13);
    let mut dst = [0u8; 64];
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut dst_mr = b.pd.register(&mut dst).unwrap();
    thread::scope(|t| {
        t.spawn(|| {
            b.ch.scope(|s| {
                let mut rest = dst_mr.slice_mut(..)?;
                for _ in 0..8 {
                    let (chunk, tail) = rest.split_at(8)?;
                    s.post_receive([chunk])?;
                    rest = tail;
                }
                Ok(())
            })
            .unwrap()
        });
        a.ch.scope(|s| {
            for i in 0..8 {
                s.post_send([src_mr.slice(i * 8..i * 8 + 8)?])?;
            }
            Ok(())
        })
        .unwrap();
    });
    assert_eq!(dst_mr.as_slice(), &pattern(64, 13)[..]);
    assert_eq!(a.ch.in_flight(), (0, 0));
    assert_eq!(b.ch.in_flight(), (0, 0));
}

#[test]
fn scope_larger_than_the_ring_waits_for_room() {
    let (mut a, b) = common::pair::<4>(std::time::Duration::from_secs(10));
    let mut src = pattern(40, 2);
    let mut target = [0u8; 40];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the scope.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let remote = target_mr.remote();
    a.ch.scope(|s| {
        for i in 0..10u64 {
            s.post_write(
                [src_mr.slice(i as usize * 4..i as usize * 4 + 4)?],
                &remote.slice(i * 4..)?,
            )?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(target_mr.as_slice(), &pattern(40, 2)[..]);
}

#[test]
fn scope_returns_the_first_failure_and_waits_for_all() {
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
    let mut ids = Vec::new();
    let err =
        a.ch.scope(|s| {
            ids.push(s.post_write([src_mr.slice(..4)?], &good)?);
            ids.push(s.post_write([src_mr.slice(4..)?], &bad)?);
            ids.push(s.post_write([src_mr.slice(4..)?], &good.slice(4..)?)?);
            Ok(())
        })
        .unwrap_err();
    let c = err.completion().expect("a completion error");
    assert_eq!(c.status, zverbs::WcStatus::RemAccessErr);
    assert_eq!(c.wr_id, ids[1]);
    assert_eq!(c.opcode, WcOpcode::RdmaWrite);
    assert!(err.to_string().contains("IBV_WC_REM_ACCESS_ERR"), "{err}");
    assert_eq!(
        a.ch.in_flight(),
        (0, 0),
        "the flushed third write was waited for"
    );
    assert_eq!(
        &target_mr.as_slice()[..4],
        &pattern(8, 1)[..4],
        "first write landed"
    );
    assert_eq!(
        &target_mr.as_slice()[4..],
        &[0; 4],
        "failed and flushed writes did not"
    );
    assert_eq!(a.ch.queue_pair().state().unwrap(), QpState::Error);
}

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

#[test]
fn blocking_call_behind_unpolled_work_leaves_its_outcome_to_its_handle() {
    let (mut a, b) = default_pair();
    let mut src = pattern(8, 6);
    let mut target = [0u8; 16];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: nothing reads `target` until both writes have completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let remote = target_mr.remote();
    let op = zverbs::SendOp::Write {
        remote_addr: remote.addr,
        rkey: remote.rkey,
    };
    let sge = src_mr.slice(..).unwrap().sge();
    // SAFETY: `src` is not written before both writes completed.
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

#[test]
fn ten_thousand_round_trips_across_threads() {
    let (mut a, mut b) = default_pair();
    let (mut abuf, mut bbuf) = ([0u8; 16], [0u8; 16]);
    let mut a_mr = a.pd.register(&mut abuf).unwrap();
    let mut b_mr = b.pd.register(&mut bbuf).unwrap();
    thread::scope(|t| {
        t.spawn(|| {
            for _ in 0..10_000 {
                b.ch.receive([b_mr.slice_mut(..8).unwrap()]).unwrap();
                let v = u64::from_ne_bytes(b_mr.as_slice()[..8].try_into().unwrap());
                b_mr.as_mut_slice()[8..].copy_from_slice(&(v + 1).to_ne_bytes());
                b.ch.send([b_mr.slice(8..).unwrap()]).unwrap();
            }
        });
        for i in 0..10_000u64 {
            a_mr.as_mut_slice()[..8].copy_from_slice(&i.to_ne_bytes());
            a.ch.send([a_mr.slice(..8).unwrap()]).unwrap();
            a.ch.receive([a_mr.slice_mut(8..).unwrap()]).unwrap();
            assert_eq!(
                u64::from_ne_bytes(a_mr.as_slice()[8..].try_into().unwrap()),
                i + 1
            );
        }
    });
}

#[test]
fn reset_and_reconnect_after_a_failure() {
    let (a, b) = default_pair();
    let (mut ach, bch) = (a.ch, b.ch);
    let mut src = pattern(8, 21);
    let mut target = [0u8; 8];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the writes complete.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let bad = zverbs::RemoteRegion {
        rkey: target_mr.rkey() ^ 1,
        ..target_mr.remote()
    };
    // A receive left outstanding across the failure keeps its handle usable.
    let mut spare = [0u8; 4];
    let mut spare_mr = a.pd.register(&mut spare).unwrap();
    let spare_sge = spare_mr.slice_mut(..).unwrap().sge();
    // SAFETY: `spare` is not touched before `wait` returned.
    let pending = unsafe { ach.post_receive_unpolled(&[spare_sge]) }.unwrap();
    assert!(ach.write([src_mr.slice(..).unwrap()], &bad).is_err());
    assert_eq!(ach.queue_pair().state().unwrap(), QpState::Error);

    let (a2, b2) = (ach.reset().unwrap(), bch.reset().unwrap());
    let (ea, eb) = (a2.endpoint(), b2.endpoint());
    let (mut ach, _bch) = (a2.connect(&eb).unwrap(), b2.connect(&ea).unwrap());
    let flushed = ach.wait(pending).unwrap_err();
    assert_eq!(
        flushed.completion().unwrap().status,
        zverbs::WcStatus::WrFlushErr
    );
    ach.write([src_mr.slice(..).unwrap()], &target_mr.remote())
        .unwrap();
    assert_eq!(target_mr.as_slice(), &pattern(8, 21)[..]);
    assert_eq!(ach.in_flight(), (0, 0));
}
