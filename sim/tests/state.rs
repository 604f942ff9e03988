//! The QP state machine, attribute validation, posting rules and object creation.

mod common;

use common::*;
use zverbs_sim::*;

fn invalid<T: std::fmt::Debug>(r: Result<T, SimError>) -> bool {
    matches!(r, Err(SimError::Invalid(_)))
}

#[test]
fn legal_and_illegal_transitions() {
    let f = Fabric::with_devices(1);
    let s = side(&f, "sim0", &Cfg::default());
    let qp = &s.qp;
    let init = Transition::Init(init_attr(AccessFlags::REMOTE_WRITE));
    let rtr = Transition::Rtr(rtr_attr(qp.qp_num(), 1, 1));
    let rts = Transition::Rts(rts_attr());
    assert_eq!(qp.state(), QpState::Reset);
    // From RESET only INIT, RESET and ERR are legal.
    for m in [rtr, rts] {
        assert!(invalid(qp.modify(&m)));
        assert_eq!(qp.state(), QpState::Reset);
    }
    qp.modify(&Transition::Reset).unwrap();
    qp.modify(&init).unwrap();
    qp.modify(&init).unwrap();
    assert!(invalid(qp.modify(&rts)));
    assert_eq!(qp.state(), QpState::Init);
    qp.modify(&rtr).unwrap();
    for m in [init, rtr] {
        assert!(invalid(qp.modify(&m)));
        assert_eq!(qp.state(), QpState::ReadyToReceive);
    }
    qp.modify(&rts).unwrap();
    qp.modify(&rts).unwrap();
    for m in [init, rtr] {
        assert!(invalid(qp.modify(&m)));
        assert_eq!(qp.state(), QpState::ReadyToSend);
    }
    qp.modify(&Transition::Error).unwrap();
    for m in [init, rtr, rts] {
        assert!(invalid(qp.modify(&m)));
        assert_eq!(qp.state(), QpState::Error);
    }
    qp.modify(&Transition::Reset).unwrap();
    assert_eq!(qp.state(), QpState::Reset);
    qp.modify(&Transition::Error).unwrap();
    assert_eq!(qp.state(), QpState::Error);
}

#[test]
fn attribute_validation() {
    let f = Fabric::with_devices(1);
    let s = side(&f, "sim0", &Cfg::default());
    let qp = &s.qp;
    let good = init_attr(AccessFlags::empty());
    for bad in [
        InitAttr { port: 2, ..good },
        InitAttr {
            pkey_index: 1,
            ..good
        },
    ] {
        assert!(invalid(qp.modify(&Transition::Init(bad))));
        assert_eq!(qp.state(), QpState::Reset);
    }
    qp.modify(&Transition::Init(good)).unwrap();
    let good = rtr_attr(5, 1, 1);
    let bads = [
        RtrAttr { port: 0, ..good },
        RtrAttr {
            dest_qp_num: 1 << 24,
            ..good
        },
        RtrAttr {
            rq_psn: 1 << 24,
            ..good
        },
        RtrAttr {
            min_rnr_timer: 32,
            ..good
        },
        RtrAttr {
            sgid_index: 2,
            ..good
        },
        RtrAttr { sl: 16, ..good },
        RtrAttr {
            flow_label: 1 << 20,
            ..good
        },
    ];
    for bad in bads {
        assert!(invalid(qp.modify(&Transition::Rtr(bad))));
        assert_eq!(qp.state(), QpState::Init);
    }
    qp.modify(&Transition::Rtr(RtrAttr {
        path_mtu: Mtu::Mtu256,
        ..good
    }))
    .unwrap();
    let good = rts_attr();
    let bads = [
        RtsAttr {
            sq_psn: 1 << 24,
            ..good
        },
        RtsAttr {
            timeout: 32,
            ..good
        },
        RtsAttr {
            retry_cnt: 8,
            ..good
        },
        RtsAttr {
            rnr_retry: 8,
            ..good
        },
    ];
    for bad in bads {
        assert!(invalid(qp.modify(&Transition::Rts(bad))));
        assert_eq!(qp.state(), QpState::ReadyToReceive);
    }
    let edge = RtsAttr {
        sq_psn: (1 << 24) - 1,
        timeout: 31,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 0,
    };
    qp.modify(&Transition::Rts(edge)).unwrap();
}

#[test]
fn query_reports_the_applied_attributes() {
    let f = Fabric::with_devices(1);
    let s = side(&f, "sim0", &Cfg::default());
    let qp = &s.qp;
    let q = qp.query();
    assert_eq!((q.state, q.rtr, q.rts), (QpState::Reset, None, None));
    qp.modify(&Transition::Init(init_attr(AccessFlags::empty())))
        .unwrap();
    let rtr = RtrAttr {
        path_mtu: Mtu::Mtu1024,
        rq_psn: 77,
        sl: 15,
        traffic_class: 0xb8,
        flow_label: (1 << 20) - 1,
        hop_limit: 3,
        ..rtr_attr(qp.qp_num(), 1, 1)
    };
    qp.modify(&Transition::Rtr(rtr)).unwrap();
    let rts = RtsAttr {
        sq_psn: 1234,
        ..rts_attr()
    };
    qp.modify(&Transition::Rts(rts)).unwrap();
    let q = qp.query();
    assert_eq!(q.state, QpState::ReadyToSend);
    assert_eq!((q.rtr, q.rts), (Some(rtr), Some(rts)));
    assert_eq!((q.sq_psn, q.rq_psn), (1234, 77));
    // RESET forgets the connection.
    qp.modify(&Transition::Reset).unwrap();
    let q = qp.query();
    assert_eq!((q.state, q.rtr, q.rts), (QpState::Reset, None, None));
}

#[test]
fn rxe_keeps_no_service_level_and_takes_the_routes_hop_limit() {
    let cfg = FabricConfig {
        personality: Personality::Rxe,
        ..FabricConfig::default()
    };
    let f = Fabric::with_config(cfg, 1);
    let s = side(&f, "sim0", &Cfg::default());
    let qp = &s.qp;
    qp.modify(&Transition::Init(init_attr(AccessFlags::empty())))
        .unwrap();
    let rtr = RtrAttr {
        sl: 7,
        traffic_class: 0x68,
        flow_label: 0x1_2345,
        hop_limit: 9,
        dgid: Some(s.ctx.query_gid(1, 1).unwrap()),
        ..rtr_attr(qp.qp_num(), 0, 1)
    };
    qp.modify(&Transition::Rtr(rtr)).unwrap();
    let kept = qp.query().rtr.unwrap();
    assert_eq!(
        (kept.sl, kept.traffic_class, kept.flow_label, kept.hop_limit),
        (0, 0x68, 0x1_2345, ROCE_ROUTE_HOP_LIMIT)
    );
}

#[test]
fn posting_in_wrong_states() {
    let f = Fabric::with_devices(1);
    let s = side(&f, "sim0", &Cfg::default());
    let qp = &s.qp;
    let send = || [sig(1, SendOp::Send, &[])];
    let recv = || [rwr(2, &[])];
    let bad = |r: Result<(), PostError<SimError>>| {
        matches!(
            r,
            Err(PostError {
                index: 0,
                error: SimError::Invalid(_)
            })
        )
    };
    assert!(bad(qp.post_send(&send())) && bad(qp.post_recv(&recv())));
    qp.modify(&Transition::Init(init_attr(AccessFlags::empty())))
        .unwrap();
    assert!(bad(qp.post_send(&send())));
    qp.post_recv(&recv()).unwrap(); // receives may be posted from INIT
    qp.modify(&Transition::Rtr(rtr_attr(qp.qp_num(), 1, 0)))
        .unwrap();
    assert!(bad(qp.post_send(&send())));
    qp.post_recv(&recv()).unwrap();
    assert!(drain(&s.cq).is_empty());
    assert_eq!(qp.state(), QpState::ReadyToReceive);
}

#[test]
fn post_validation_and_bad_wr_index() {
    let p = pair(); // 4 SGEs, 64 inline bytes, 8 WRs each way
    let buf = Buf::new(128, 0);
    let m = buf.reg(&p.a.pd, all_access());
    let qp = &p.a.qp;
    let five = [sge(&m, 0, 1); 5];
    let e = qp
        .post_send(&[sig(1, SendOp::Send, &[]), sig(2, SendOp::Send, &five)])
        .unwrap_err();
    assert!(matches!(
        e,
        PostError {
            index: 1,
            error: SimError::Invalid(_)
        }
    ));
    assert!(e.to_string().contains("work request 1"));
    let inline = SendFlags::INLINE;
    let big = swr(3, SendOp::Send, &[sge(&m, 0, 65)], inline);
    assert!(matches!(
        qp.post_send(&[big]),
        Err(PostError { index: 0, .. })
    ));
    let read = SendOp::Read {
        remote_addr: 0,
        rkey: 0,
    };
    let inline_read = swr(4, read, &[sge(&m, 0, 8)], inline);
    assert!(matches!(
        qp.post_send(&[inline_read]),
        Err(PostError { index: 0, .. })
    ));
    let e = p.a.qp.post_recv(&[rwr(5, &[]), rwr(6, &five)]).unwrap_err();
    assert!(matches!(
        e,
        PostError {
            index: 1,
            error: SimError::Invalid(_)
        }
    ));
    // WR 1 was posted and waits for a receive at b; the rest were refused.
    p.b.qp.post_recv(&[rwr(7, &[])]).unwrap();
    assert_eq!(
        drain(&p.a.cq).iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [1]
    );
    assert_eq!(
        drain(&p.b.cq).iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [7]
    );
    assert_eq!(qp.state(), QpState::ReadyToSend);
}

#[test]
fn queue_full() {
    let p = pair(); // 8 WRs each way
    let wrs: Vec<_> = (0..9).map(|i| sig(i, SendOp::Send, &[])).collect();
    let e = p.a.qp.post_send(&wrs).unwrap_err();
    assert_eq!(
        e,
        PostError {
            index: 8,
            error: SimError::QueueFull
        }
    );
    let e =
        p.a.qp
            .post_recv(&(0..10).map(|i| rwr(i, &[])).collect::<Vec<_>>())
            .unwrap_err();
    assert_eq!(
        e,
        PostError {
            index: 8,
            error: SimError::QueueFull
        }
    );
    // Receives at b let the 8 sends complete, freeing the SQ.
    p.b.qp
        .post_recv(&(0..8).map(|i| rwr(i, &[])).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(drain(&p.a.cq).len(), 8);
    p.a.qp
        .post_send(
            &(0..8)
                .map(|i| sig(i, SendOp::Send, &[]))
                .collect::<Vec<_>>(),
        )
        .unwrap();
}

#[test]
fn create_qp_validation() {
    let f = Fabric::with_devices(2);
    let c0 = f.open_device("sim0").unwrap();
    let c1 = f.open_device("sim1").unwrap();
    let pd = c0.alloc_pd().unwrap();
    let (cq, far_cq) = (c0.create_cq(4).unwrap(), c1.create_cq(4).unwrap());
    let good = Cfg::default().cap;
    let attr = |cap, recv_cq| QpInitAttr {
        send_cq: &cq,
        recv_cq,
        cap,
        sq_sig_all: false,
    };
    let bads = [
        QpCaps {
            max_send_wr: 0,
            ..good
        },
        QpCaps {
            max_recv_wr: MAX_QP_WR + 1,
            ..good
        },
        QpCaps {
            max_send_sge: 0,
            ..good
        },
        QpCaps {
            max_recv_sge: MAX_SGE as u32 + 1,
            ..good
        },
        QpCaps {
            max_inline_data: MAX_INLINE as u32 + 1,
            ..good
        },
    ];
    for bad in bads {
        assert!(invalid(pd.create_qp(&attr(bad, &cq))));
    }
    assert!(invalid(pd.create_qp(&attr(good, &far_cq))));
    let other = Fabric::with_devices(1).open_device("sim0").unwrap();
    let alien = other.create_cq(4).unwrap();
    assert!(invalid(pd.create_qp(&attr(good, &alien))));
    let qp = pd.create_qp(&attr(good, &cq)).unwrap();
    assert_eq!(qp.cap(), good);
    let q2 = pd.create_qp(&attr(good, &cq)).unwrap();
    assert_ne!(qp.qp_num(), q2.qp_num());
}

#[test]
fn register_mr_access_rules() {
    let f = Fabric::with_devices(1);
    let pd = f.open_device("sim0").unwrap().alloc_pd().unwrap();
    let buf = Buf::new(8, 0);
    for a in [
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ,
    ] {
        // SAFETY: `buf` outlives the attempt.
        assert!(invalid(unsafe {
            pd.register_mr(buf.addr(0) as *mut u8, 8, a)
        }));
    }
    let m = buf.reg(&pd, AccessFlags::REMOTE_READ);
    assert_eq!(m.len(), 8);
}

#[test]
fn objects_outlive_their_handles_while_used() {
    // Dropping the PD and CQ handles before the QP and MR keeps everything working.
    let p = pair();
    let Pair { a, b, fabric } = p;
    let (src, dst) = (Buf::new(8, 3), Buf::new(8, 0));
    let ms = src.reg(&a.pd, AccessFlags::empty());
    let md = dst.reg(&b.pd, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    drop(a.pd);
    drop(b.pd);
    let op = SendOp::Write {
        remote_addr: dst.addr(0),
        rkey: md.rkey(),
    };
    a.qp.post_send(&[sig(1, op, &[sge(&ms, 0, 8)])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(dst.get(), [3; 8]);
    drop((a.qp, b.qp, ms, md, a.cq, b.cq, fabric));
}
