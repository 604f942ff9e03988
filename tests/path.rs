//! The address vector of RTR (service level, traffic class, flow label, hop limit) and the
//! path the device applied, read back with `path()`: on the simulator.
#![cfg(feature = "sim")]

mod common;

use common::pair_on;
use zverbs::provider::sim::Sim;
use zverbs::qp::{
    Init, InitOptions, PathAttr, QpConfig, QueuePair, RtrOptions, RtsOptions, MAX_FLOW_LABEL,
    MAX_SL,
};
use zverbs::{
    ChannelConfig, CompletionQueue, Context, Endpoint, Error, ErrorKind, Mtu, ProtectionDomain,
    QpCaps,
};

/// A queue pair in INIT on `dev` of `sim`, with what keeps it alive (fields drop in order).
struct Side {
    qp: QueuePair<Sim, Init>,
    _cq: CompletionQueue<Sim>,
    _pd: ProtectionDomain<Sim>,
    _ctx: Context<Sim>,
}

fn side(sim: &Sim, dev: &str, config: &QpConfig) -> Side {
    let ctx = Context::open(sim, dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 16).unwrap();
    let qp = QueuePair::create(&ctx, &pd, &cq, &cq, config).unwrap();
    Side {
        qp: qp.into_init(&InitOptions::default()).unwrap(),
        _cq: cq,
        _pd: pd,
        _ctx: ctx,
    }
}

/// Queue pairs on sim0 and sim1, in INIT.
fn two(config: &QpConfig) -> (Sim, Side, Side) {
    let sim = Sim::with_devices(2);
    let (a, b) = (side(&sim, "sim0", config), side(&sim, "sim1", config));
    (sim, a, b)
}

#[test]
fn address_vector_reaches_the_device() {
    let (_sim, a, b) = two(&QpConfig::default());
    let (ea, eb) = (a.qp.endpoint(), b.qp.endpoint());
    let opts = RtrOptions {
        sl: MAX_SL,
        traffic_class: 0xb8,
        flow_label: MAX_FLOW_LABEL,
        hop_limit: 7,
        ..RtrOptions::default()
    };
    let qa = a.qp.into_rtr(&eb, &opts).unwrap();
    let p = qa.path().unwrap();
    assert_eq!(
        (p.sl, p.traffic_class, p.flow_label, p.hop_limit),
        (15, 0xb8, MAX_FLOW_LABEL, 7)
    );
    assert_eq!(p.dest_qp_num, eb.qp_num);
    assert_eq!(p.rq_psn, eb.psn);
    assert_eq!(p.dgid, Some(eb.gid));
    assert_eq!(p.min_rnr_timer, opts.min_rnr_timer);
    // The defaults: SL 0, no traffic class or flow label, hop limit 64.
    let qb = b.qp.into_rtr(&ea, &RtrOptions::default()).unwrap();
    let p = qb.path().unwrap();
    assert_eq!(
        (p.sl, p.traffic_class, p.flow_label, p.hop_limit),
        (0, 0, 0, 64)
    );
}

#[test]
fn rts_attributes_and_psns() {
    let config = QpConfig {
        psn: Some(0x00ab_cdef),
        ..QpConfig::default()
    };
    let (_sim, a, b) = two(&config);
    let eb = b.qp.endpoint();
    let rts = RtsOptions {
        timeout: 9,
        retry_cnt: 3,
        rnr_retry: 5,
        ..RtsOptions::default()
    };
    let qa = a.qp.into_rtr(&eb, &RtrOptions::default()).unwrap();
    let qa = qa.into_rts(&rts).unwrap();
    let p = qa.path().unwrap();
    assert_eq!((p.timeout, p.retry_cnt, p.rnr_retry), (9, 3, 5));
    // Nothing sent yet: the next PSN to send is the initial one.
    assert_eq!(p.sq_psn, 0x00ab_cdef);
    assert_eq!(p.rq_psn, 0x00ab_cdef);
    // The error state keeps the path (the PSNs in it are the device's business).
    qa.set_error().unwrap();
    let after = qa.path().unwrap();
    assert_eq!(
        PathAttr {
            sq_psn: p.sq_psn,
            rq_psn: p.rq_psn,
            ..after
        },
        p
    );
}

#[test]
fn path_mtu_is_negotiated_or_exact() {
    let (_sim, a, b) = two(&QpConfig::default());
    let eb = b.qp.endpoint();
    // The simulated ports run 4096.
    assert_eq!(a.qp.endpoint().mtu, Mtu::Mtu4096);
    let rtr = |qp: QueuePair<Sim, Init>, remote: Mtu, asked: Option<Mtu>| {
        let remote = Endpoint { mtu: remote, ..eb };
        let opts = RtrOptions {
            mtu: asked,
            ..RtrOptions::default()
        };
        match qp.into_rtr(&remote, &opts) {
            Ok(qp) => {
                let got = qp.path().unwrap().path_mtu;
                (qp.reset().unwrap(), Ok(got))
            }
            Err(e) => (e.qp.reset().unwrap(), Err(e.error)),
        }
    };
    let init =
        |qp: QueuePair<Sim, zverbs::qp::Reset>| qp.into_init(&InitOptions::default()).unwrap();
    let (qp, got) = rtr(a.qp, Mtu::Mtu4096, None);
    assert_eq!(got.unwrap(), Mtu::Mtu4096);
    let (qp, got) = rtr(init(qp), Mtu::Mtu1024, None);
    assert_eq!(
        got.unwrap(),
        Mtu::Mtu1024,
        "by default the smaller port wins"
    );
    let (qp, got) = rtr(init(qp), Mtu::Mtu2048, Some(Mtu::Mtu512));
    assert_eq!(got.unwrap(), Mtu::Mtu512, "an MTU asked is used as asked");
    // Asked above the peer's port: refused, not lowered (the peer would run another).
    let (qp, got) = rtr(init(qp), Mtu::Mtu1024, Some(Mtu::Mtu4096));
    match got.unwrap_err() {
        Error::ExceedsDevice { value, limit, .. } => assert_eq!((value, limit), (4096, 1024)),
        e => panic!("expected ExceedsDevice, got {e:?}"),
    }
    let (_qp, got) = rtr(init(qp), Mtu::Mtu256, None);
    assert_eq!(got.unwrap(), Mtu::Mtu256);
}

#[test]
fn device_limits_are_checked_where_configs_are_made() {
    let sim = Sim::with_devices(2);
    let ctx = Context::open(&sim, "sim0").unwrap();
    let dev = ctx.query_device().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 16).unwrap();
    let over = |caps: QpCaps| QpConfig {
        caps,
        ..QpConfig::default()
    };
    let caps = QpConfig::default().caps;
    for (cfg, field, limit) in [
        (
            over(QpCaps {
                max_send_wr: dev.max_qp_wr + 1,
                ..caps
            }),
            "caps.max_send_wr",
            dev.max_qp_wr,
        ),
        (
            over(QpCaps {
                max_recv_sge: dev.max_sge + 1,
                ..caps
            }),
            "caps.max_recv_sge",
            dev.max_sge,
        ),
    ] {
        match QueuePair::create(&ctx, &pd, &cq, &cq, &cfg).unwrap_err() {
            Error::ExceedsDevice {
                field: f, limit: l, ..
            } => assert_eq!((f, l), (field, u64::from(limit))),
            e => panic!("{field}: expected ExceedsDevice, got {e:?}"),
        }
    }
    match CompletionQueue::create(&ctx, dev.max_cqe + 1).err() {
        Some(Error::ExceedsDevice { field, limit, .. }) => {
            assert_eq!((field, limit), ("depth", u64::from(dev.max_cqe)))
        }
        e => panic!("a CQ deeper than max_cqe: {e:?}"),
    }
    let (_sim, a, b) = two(&QpConfig::default());
    let over_rd = RtrOptions {
        max_dest_rd_atomic: u8::try_from(dev.max_qp_rd_atom + 1).unwrap(),
        ..RtrOptions::default()
    };
    let e = a.qp.into_rtr(&b.qp.endpoint(), &over_rd).unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::ExceedsDevice {
                field: "rtr.max_dest_rd_atomic",
                ..
            }
        ),
        "{:?}",
        e.error
    );
}

#[test]
fn bad_address_vectors_are_typed_errors() {
    let (_sim, a, b) = two(&QpConfig::default());
    let eb = b.qp.endpoint();
    let mut qp = a.qp;
    for (bad, why) in [
        (
            RtrOptions {
                sl: MAX_SL + 1,
                ..RtrOptions::default()
            },
            "sl exceeds 15",
        ),
        (
            RtrOptions {
                flow_label: MAX_FLOW_LABEL + 1,
                ..RtrOptions::default()
            },
            "flow_label exceeds 20 bits",
        ),
        (
            RtrOptions {
                flow_label: u32::MAX,
                ..RtrOptions::default()
            },
            "flow_label exceeds 20 bits",
        ),
    ] {
        let e = qp.into_rtr(&eb, &bad).unwrap_err();
        assert_eq!(e.error, Error::InvalidAttribute(why));
        assert_eq!(e.error.kind(), ErrorKind::InvalidArgument);
        qp = e.qp;
        // Handed back unchanged: still in INIT on the device too.
        assert_eq!(qp.state().unwrap(), zverbs::QpState::Init);
    }
    qp.into_rtr(&eb, &RtrOptions::default()).unwrap();
}

#[test]
fn gid_index_is_the_paths_sgid_index() {
    let config = QpConfig {
        gid_index: 1,
        ..QpConfig::default()
    };
    let (sim, a, b) = two(&config);
    let ctx = Context::open(&sim, "sim0").unwrap();
    // The local endpoint carries the GID the index names.
    assert_eq!(a.qp.endpoint().gid, ctx.query_gid(1, 1).unwrap());
    let qa = a.qp.into_rtr(&b.qp.endpoint(), &RtrOptions::default());
    assert_eq!(qa.unwrap().path().unwrap().sgid_index, 1);
    // An index past the table fails at creation, typed.
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ctx, 4).unwrap();
    let bad = QpConfig {
        gid_index: u8::MAX,
        ..QpConfig::default()
    };
    let e = QueuePair::create(&ctx, &pd, &cq, &cq, &bad).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
}

#[test]
fn channel_path() {
    let rtr = RtrOptions {
        mtu: Some(Mtu::Mtu1024),
        sl: 4,
        traffic_class: 0x60,
        flow_label: 0x1_2345,
        hop_limit: 2,
        ..RtrOptions::default()
    };
    let a_cfg = ChannelConfig {
        rtr,
        ..ChannelConfig::default()
    };
    let (a, b) = pair_on::<16>(&Sim::with_devices(2), &a_cfg, &ChannelConfig::default());
    let p = a.ch.path().unwrap();
    assert_eq!(p.path_mtu, Mtu::Mtu1024);
    assert_eq!(
        (p.sl, p.traffic_class, p.flow_label, p.hop_limit),
        (4, 0x60, 0x1_2345, 2)
    );
    assert_eq!(p.dest_qp_num, b.ch.queue_pair().qp_num());
    // B's path is its own: default address vector, the largest MTU both ports run.
    let p = b.ch.path().unwrap();
    assert_eq!((p.path_mtu, p.sl, p.hop_limit), (Mtu::Mtu4096, 0, 64));
}

#[test]
fn the_peers_queue_pair_number_is_kept_from_rtr_until_reset() {
    let (_sim, a, b) = two(&QpConfig::default());
    let eb = b.qp.endpoint();
    assert_eq!(a.qp.peer_qp_num(), None);
    let rtr = a.qp.into_rtr(&eb, &RtrOptions::default()).unwrap();
    assert_eq!(rtr.peer_qp_num(), Some(eb.qp_num));
    let rts = rtr.into_rts(&RtsOptions::default()).unwrap();
    assert_eq!(rts.peer_qp_num(), Some(eb.qp_num));
    assert_eq!(rts.path().unwrap().dest_qp_num, eb.qp_num);
    let reset = rts.reset().unwrap();
    assert_eq!(reset.peer_qp_num(), None);
}
