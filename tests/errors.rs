//! Error handling other than completion statuses, through the public API on the
//! simulator: typed errors before posting, queue limits, timeouts, partial doorbell chains,
//! failed transitions, device lookups. One test per RC completion status lives in
//! `tests/wc_status.rs`.
#![cfg(feature = "sim")]

mod common;

use std::time::Duration;

use common::{default_pair, pair, ALL};
use zverbs::provider::sim::Sim;
use zverbs::qp::{InitOptions, QpConfig, QueuePair, RtrOptions, RtsOptions};
use zverbs::testing::Loopback;
use zverbs::{
    CompletionQueue, Context, Error, ErrorKind, QpState, RecvWr, RemoteRegion, SendFlags, SendOp,
    SendWr, Sge, WcStatus, WorkCompletion,
};

#[test]
fn remote_range_is_checked_before_posting_when_known() {
    let (mut a, _b) = default_pair();
    let mut src = [1u8; 16];
    let src_mr = a.pd.register(&mut src).unwrap();
    let small = RemoteRegion {
        addr: 0x1000,
        len: 8,
        rkey: 1,
    };
    let e = a.ch.write([src_mr.slice(..).unwrap()], &small).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds(_)), "{e}");
    assert_eq!(
        a.ch.queue_pair().state().unwrap(),
        QpState::ReadyToSend,
        "nothing was posted"
    );
}

#[test]
fn too_many_sges_is_a_typed_error() {
    let (mut a, _b) = default_pair();
    let mut src = [0u8; 8];
    let mr = a.pd.register(&mut src).unwrap();
    let five = [(); 5].map(|_| mr.slice(..1).unwrap());
    let e = a.ch.send(five).unwrap_err();
    assert_eq!(e, Error::TooManySges { given: 5, max: 4 });
    assert_eq!(a.ch.in_flight(), (0, 0));
}

#[test]
fn send_queue_full_is_a_typed_error_not_a_panic() {
    let (mut a, mut b) = pair::<4>(Duration::from_secs(10));
    let mut src = [7u8; 4];
    let mut dst = [0u8; 16];
    let src_mr = a.pd.register(&mut src).unwrap();
    let mut dst_mr = b.pd.register(&mut dst).unwrap();
    let sge = src_mr.slice(..).unwrap().sge();
    // No receive at the peer: the sends wait in the send queue.
    // SAFETY: `src` outlives every wait below.
    let pending: Vec<_> = (0..4)
        .map(|_| {
            unsafe {
                a.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
            }
            .unwrap()
        })
        .collect();
    // SAFETY: as above.
    let e = unsafe {
        a.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
    }
    .unwrap_err();
    assert_eq!(e, Error::QueueFull { capacity: 4 });
    assert_eq!(e.kind(), ErrorKind::QueueFull);
    b.ch.scope(|s| {
        let mut rest = dst_mr.slice_mut(..)?;
        for _ in 0..4 {
            let (chunk, tail) = rest.split_at(4)?;
            s.post_receive([chunk])?;
            rest = tail;
        }
        Ok(())
    })
    .unwrap();
    for p in pending {
        a.ch.wait(p).unwrap();
    }
    assert_eq!(dst_mr.as_slice(), &[7u8; 16]);
}

#[test]
fn timeout_aborts_and_flushes_instead_of_leaving_work_in_flight() {
    let (mut a, _b) = pair::<4>(Duration::from_millis(50));
    let mut dst = [0u8; 8];
    let mut dst_mr = a.pd.register(&mut dst).unwrap();
    let e = a.ch.receive([dst_mr.slice_mut(..).unwrap()]).unwrap_err();
    assert_eq!(e, Error::Timeout);
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(a.ch.queue_pair().state().unwrap(), QpState::Error);
    assert_eq!(
        a.ch.in_flight(),
        (0, 0),
        "the receive was flushed and retired"
    );
}

/// A raw queue pair on one device, looped back to itself.
fn raw_pair() -> Loopback {
    let caps = zverbs::QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    Loopback::new(caps, 64).unwrap()
}

#[test]
fn doorbell_chain_stops_at_the_first_bad_request() {
    let Loopback { qp, cq, pd, .. } = raw_pair();
    let mut buf = [0u8; 32];
    // SAFETY: the loop-back writes finish before `buf` is read or dropped.
    let mr = unsafe { pd.register_with_access(&mut buf, ALL) }.unwrap();
    let sge = mr.slice(..4).unwrap().sge();
    let mut wrs = [SendWr::<3>::new(
        0,
        SendOp::Write {
            remote_addr: 0,
            rkey: 0,
        },
        SendFlags::SIGNALED,
    ); 3];
    for (i, wr) in wrs.iter_mut().enumerate() {
        wr.wr_id = i as u64;
        wr.op = SendOp::Write {
            remote_addr: sge.addr + 16,
            rkey: mr.rkey(),
        };
        wr.sg_list[0] = sge;
        wr.num_sge = 1;
    }
    wrs[2].num_sge = 3; // the queue pair allows 2
                        // SAFETY: the loop-back writes stay inside `buf`, which outlives the polls below.
    let e = unsafe { qp.post_send(&wrs) }.unwrap_err();
    assert_eq!(e.index, 2);
    let mut wcs = [WorkCompletion::EMPTY; 8];
    let n = cq.poll(&mut wcs).unwrap();
    assert_eq!(n, 2, "the two requests before the bad one were posted");
    assert_eq!(wcs[..2].iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1]);
    assert!(wcs[..2].iter().all(|w| w.status == WcStatus::Success));
}

#[test]
fn selective_signaling_completes_only_signaled_requests() {
    let Loopback { qp, cq, pd, .. } = raw_pair();
    let mut buf = [0u8; 32];
    // SAFETY: the loop-back writes finish before `buf` is read or dropped.
    let mr = unsafe { pd.register_with_access(&mut buf, ALL) }.unwrap();
    let sge = mr.slice(..4).unwrap().sge();
    let mut wrs = [SendWr::<1>::new(
        0,
        SendOp::Write {
            remote_addr: sge.addr + 8,
            rkey: mr.rkey(),
        },
        SendFlags::empty(),
    ); 4];
    for (i, wr) in wrs.iter_mut().enumerate() {
        wr.wr_id = i as u64;
        wr.sg_list[0] = sge;
        wr.num_sge = 1;
    }
    wrs[3].flags = SendFlags::SIGNALED;
    // SAFETY: the writes stay inside `buf`, which outlives the poll.
    unsafe { qp.post_send(&wrs) }.unwrap();
    let mut wcs = [WorkCompletion::EMPTY; 8];
    assert_eq!(cq.poll(&mut wcs).unwrap(), 1);
    assert_eq!(wcs[0].wr_id, 3);
}

#[test]
fn receive_on_raw_queue_pair_with_too_many_sges_is_refused() {
    let Loopback { qp, pd, .. } = raw_pair();
    let mut buf = [0u8; 8];
    let mr = pd.register(&mut buf).unwrap();
    let mut wr = RecvWr::<3>::new(9);
    wr.sg_list = [mr.slice(..).unwrap().sge(); 3];
    wr.num_sge = 3;
    // SAFETY: refused, so never touches `buf`.
    let e = unsafe { qp.post_recv(&[wr]) }.unwrap_err();
    assert_eq!(
        (e.index, zverbs::ProviderError::kind(&e.error)),
        (0, ErrorKind::InvalidArgument)
    );
}

#[test]
fn failed_transition_hands_the_queue_pair_back() {
    let sim = Sim::with_devices(1);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 8).unwrap();
    let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &QpConfig::default()).unwrap();
    let qp = qp.into_init(&InitOptions::default()).unwrap();
    let mut ep = qp.endpoint();
    ep.qp_num = 1 << 24;
    let err = qp.into_rtr(&ep, &RtrOptions::default()).unwrap_err();
    assert!(matches!(err.error, Error::InvalidAttribute(_)), "{err}");
    let qp = err.qp;
    assert_eq!(qp.state().unwrap(), QpState::Init, "unchanged");
    let ep = qp.endpoint();
    let qp = qp.into_rtr(&ep, &RtrOptions::default()).unwrap();
    let bad = RtsOptions {
        retry_cnt: 8,
        ..RtsOptions::default()
    };
    let err = qp.into_rts(&bad).unwrap_err();
    let qp = err.qp.into_rts(&RtsOptions::default()).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::ReadyToSend);
    // And back to RESET, then around again.
    let qp = qp.reset().unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    assert!(qp.into_init(&InitOptions::default()).is_ok());
}

#[test]
fn device_errors_are_typed() {
    let sim = Sim::with_devices(1);
    let e = Context::open(&sim, "mlx5_0").err().unwrap();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let ctx = Context::open(&sim, "sim0").unwrap();
    assert_eq!(ctx.query_port(2).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(
        ctx.query_gid(1, 255).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        CompletionQueue::create(&ctx, 0).err().unwrap().kind(),
        ErrorKind::InvalidArgument
    );
    let _ = Sge::default();
}
