//! Stepped mode at scale: a thousand simulated devices on one thread.
//!
//! Run with `--nocapture` to see the wall time; the test does not assert it (machines
//! differ), but it is well under a second in the debug profile.

mod common;

use std::time::Instant;

use common::*;
use zverbs_sim::*;
use WcStatus::*;

/// Device `i` sends one message to device `i + 1` (mod N) over RC; all arrive.
#[test]
fn thousand_devices_stepped() {
    const N: usize = 1_000;
    let t0 = Instant::now();
    let f = Fabric::with_config(FabricConfig::stepped(3), N);
    let cfg = Cfg {
        cap: QpCaps {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        cq_depth: 4,
        ..Cfg::default()
    };
    // Device i sends on `right[i]` to `left[(i + 1) % N]`.
    let names: Vec<String> = (0..N).map(|i| format!("sim{i}")).collect();
    let right: Vec<Side> = names.iter().map(|n| side(&f, n, &cfg)).collect();
    let left: Vec<Side> = names.iter().map(|n| side(&f, n, &cfg)).collect();
    for (i, r) in right.iter().enumerate() {
        let l = &left[(i + 1) % N];
        connect(&r.qp, cfg.access, rtr_attr(l.qp.qp_num(), lid(l), 1));
        connect(&l.qp, cfg.access, rtr_attr(r.qp.qp_num(), lid(r), 1));
    }
    let bufs: Vec<Buf> = (0..N).map(|i| Buf::new(8, i as u8)).collect();
    let mrs: Vec<(Mr, Mr)> = (bufs.iter().zip(&right).zip(&left))
        .map(|((b, r), l)| (b.reg(&r.pd, all_access()), b.reg(&l.pd, all_access())))
        .collect();
    let setup = t0.elapsed();
    let t1 = Instant::now();
    for (i, ((r, l), (mr, ml))) in right.iter().zip(&left).zip(&mrs).enumerate() {
        l.qp.post_recv(&[rwr(i as u64, &[sge(ml, 4, 4)])]).unwrap();
        let send = sig(i as u64, SendOp::Send, &[sge(mr, 0, 4)]);
        r.qp.post_send(&[send]).unwrap();
    }
    let events = f.run_until_idle();
    let run = t1.elapsed();
    for (i, ((r, l), b)) in right.iter().zip(&left).zip(&bufs).enumerate() {
        assert_eq!(ids(&drain(&r.cq)), [(i as u64, Success)]);
        assert_eq!(ids(&drain(&l.cq)), [(i as u64, Success)]);
        let prev = ((i + N - 1) % N) as u8;
        assert_eq!(b.get(), [[i as u8; 4], [prev; 4]].concat(), "device {i}");
    }
    // Every device both sent and received: 2 packets each, and no timer is left.
    assert!(events >= 2 * N, "{events} events");
    assert_eq!(f.pending_events(), 0);
    println!(
        "{N} devices: setup {setup:?}, {events} events in {run:?} ({:?} simulated), total {:?}",
        f.now(),
        t0.elapsed()
    );
}
