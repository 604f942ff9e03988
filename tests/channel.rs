//! Channel operations on the simulator: every opcode at the blocking and scoped levels,
//! asserting status, byte count, immediate data and memory. The unpolled level is in
//! `unpolled.rs`.
#![cfg(feature = "sim")]

mod common;

use std::thread;

use common::{default_pair, pattern, ALL};
use zverbs::{AccessFlags, Error, QpState, WcOpcode};

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
fn each_request_uses_only_its_own_gather_entries() {
    // Requests are built in place: a shorter one after a longer (or a refused) one must not
    // pick up the earlier entries.
    let (mut a, b) = default_pair();
    let mut src = pattern(30, 7);
    let mut target = [0u8; 64];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: nothing reads `target` until the writes have completed.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let remote = target_mr.remote();
    let thirds = [0..10, 10..20, 20..30].map(|r| src_mr.slice(r).unwrap());
    a.ch.write(thirds, &remote.slice(..30).unwrap()).unwrap();
    let five = [0..6, 6..12, 12..18, 18..24, 24..30].map(|r| src_mr.slice(r).unwrap());
    let err = a.ch.write(five, &remote).unwrap_err();
    assert!(matches!(err, Error::TooManySges { given: 5, .. }), "{err}");
    a.ch.write(
        [src_mr.slice(20..30).unwrap()],
        &remote.slice(32..).unwrap(),
    )
    .unwrap();
    let p = pattern(30, 7);
    assert_eq!(&target_mr.as_slice()[..30], &p[..]);
    assert_eq!(&target_mr.as_slice()[32..42], &p[20..30]);
    assert_eq!(
        &target_mr.as_slice()[42..],
        &[0; 22],
        "only one entry gathered"
    );
    assert_eq!(a.ch.in_flight(), (0, 0));
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
fn a_scope_unwound_out_of_settles_what_it_posted_and_gives_back_what_it_staged() {
    let (mut a, b) = default_pair();
    let mut src = *b"wxyz";
    let mut target = [0u8; 8];
    let src_mr = a.pd.register(&mut src).unwrap();
    // SAFETY: read after the scope.
    let target_mr = unsafe { b.pd.register_with_access(&mut target, ALL) }.unwrap();
    let remote = target_mr.remote();
    let second_half = remote.slice(4..).unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        a.ch.scope(|s| {
            s.post_write([src_mr.slice(..)?], &remote)?;
            s.ring_doorbell()?;
            s.post_write([src_mr.slice(..)?], &second_half)?;
            if s.wait_send(u64::MAX).is_err() {
                panic!("the closure fails between a doorbell and the next");
            }
            Ok(())
        })
    }));
    assert!(unwound.is_err(), "the closure's panic goes on unwinding");
    assert_eq!(
        a.ch.in_flight(),
        (0, 0),
        "the posted write was settled, the staged one given back"
    );
    assert_eq!(&target_mr.as_slice()[..4], b"wxyz");
    assert_eq!(
        &target_mr.as_slice()[4..],
        &[0; 4],
        "the staged write never went out"
    );
    a.ch.write([src_mr.slice(..).unwrap()], &second_half)
        .unwrap();
    assert_eq!(target_mr.as_slice(), b"wxyzwxyz", "the channel works on");
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
