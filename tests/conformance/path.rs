//! The address vector of RTR reaches the device: service level, traffic class, flow label
//! and hop limit set in `RtrOptions` read back from `ibv_query_qp` (`QueuePair::path`),
//! with the effective path MTU, and a send takes that path.

use super::scenarios::{filled, untouched, LW, SIG};
use super::*;
use zverbs::Mtu;

/// A's RTR: every address-vector field away from its default, the MTU asked as 1024 (rxe's ports over a 1500-byte Ethernet run 1024).
fn a_rtr() -> RtrOptions {
    RtrOptions {
        mtu: Some(Mtu::Mtu1024),
        sl: 3,
        traffic_class: 0x68,
        flow_label: 0x1_2345,
        hop_limit: 9,
        ..RtrOptions::default()
    }
}

pub fn path_attributes<E: Env>(env: &E) -> Run<Outcome> {
    let o = PairOptions {
        a_rtr: a_rtr(),
        ..PairOptions::default()
    };
    let (a, b) = pair(env, &o)?;
    let src = filled(&a.pd, 64, LW, 1)?;
    let dst = region(&b.pd, 80, LW, 0xEE)?;
    // SAFETY: leaked regions, read only after the completions below.
    unsafe {
        post_recv(&b, &[rwr(101, &[sge(&dst, 0, 64)])])?;
        post_send(&a, &[swr(1, SendOp::Send, SIG, &[sge(&src, 0, 64)])])?;
    }
    let (aw, bw) = (wait(env, &a.scq, 1)?, wait(env, &b.rcq, 1)?);
    let pa = a.qp.path().map_err(err("path of a"))?;
    let pb = b.qp.path().map_err(err("path of b"))?;
    // A's as asked; B's (none asked) the smaller of the two ports'.
    let (ea, eb) = (a.qp.endpoint(), b.qp.endpoint());
    let d = dst.as_slice();
    let mut o = Outcome::default();
    o.wcs("a", &aw)
        .wcs("b", &bw)
        .check(
            "bytes",
            d[..64] == pattern(64, 1)[..] && untouched(&d[64..], 0xEE),
        )
        .item("a.sl", pa.sl)
        .item("a.traffic_class", format_args!("{:#x}", pa.traffic_class))
        .item("a.flow_label", format_args!("{:#x}", pa.flow_label))
        .item("a.hop_limit", pa.hop_limit)
        .check("a.path_mtu", pa.path_mtu == Mtu::Mtu1024)
        .check("a.dest_qp_num", pa.dest_qp_num == eb.qp_num)
        .check("a.dgid", pa.dgid == Some(eb.gid))
        .item("b.sl", pb.sl)
        .item("b.traffic_class", format_args!("{:#x}", pb.traffic_class))
        .item("b.hop_limit", pb.hop_limit)
        .check("b.path_mtu", pb.path_mtu == ea.mtu.min(eb.mtu));
    Ok(o)
}

/// What the device reports of itself (`ibv_query_device`): how it executes atomics
/// (`HCA` on hardware HCAs, on rxe and on the simulator), and room for the queue pair
/// defaults (`RtrOptions`/`RtsOptions` ask for 16 reads and atomics in flight; `QpConfig`
/// for 4 gather entries).
pub fn device_attributes<E: Env>(env: &E) -> Run<Outcome> {
    let ctx = Context::open(env.provider(), env.devices().0).map_err(err("open"))?;
    let d = ctx.query_device().map_err(err("query_device"))?;
    let mut o = Outcome::default();
    o.item("atomic_cap", format_args!("{:?}", d.atomic_cap))
        .check(
            "rd_atom",
            d.max_qp_rd_atom >= 16 && d.max_qp_init_rd_atom >= 16,
        )
        .check("sge", d.max_sge >= 4)
        .check("wr", d.max_qp_wr >= 64 && d.max_cqe >= 64);
    Ok(o)
}

pub mod expected {
    #![allow(non_upper_case_globals)]
    pub const device_attributes: &str = "atomic_cap=Hca; rd_atom=ok; sge=ok; wr=ok";
    pub const path_attributes: &str = "a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=64]; \
         bytes=ok; a.sl=3; a.traffic_class=0x68; a.flow_label=0x12345; a.hop_limit=9; \
         a.path_mtu=ok; a.dest_qp_num=ok; a.dgid=ok; b.sl=0; b.traffic_class=0x0; \
         b.hop_limit=64; b.path_mtu=ok";
}
