//! The untimed fabric's direct path against its packet path.
//!
//! On `FabricConfig::instant()` a send work request posted while its connection is idle
//! executes inside the post (the direct path). Turning the trace on changes nothing else
//! and disables the direct path, so the same operations on both fabrics must give the same
//! post results, completions (per CQ, in order), memory and queue pair states. The cases
//! mix every operation with the error paths (bad keys, bounds, short receives, RNR waits,
//! full send queues and CQs, inline data) and scripted drops and link outages.

mod common;

use common::*;
use proptest::prelude::*;
use zverbs_sim::*;

const LOCAL: usize = 0; // bytes 0..256 of each side's buffer are gathered and scattered
const REMOTE: usize = 256; // bytes 256..512 are the peer's RDMA target
const BUF: usize = 512;

/// One work request of a chain.
#[derive(Clone, Copy, Debug)]
struct W {
    kind: u8,
    len: u8,
    off: u8,
    signaled: bool,
    inline: bool,
    bad: u8,
}

#[derive(Clone, Debug)]
enum Op {
    /// `built`: through `post_send_raw` (inline data read where it lies), else
    /// `post_send` (inline data from registered memory).
    Post {
        b: bool,
        wrs: Vec<W>,
        built: bool,
    },
    Recv {
        b: bool,
        n: u8,
        short: bool,
    },
    Poll {
        b: bool,
        max: u8,
    },
    DropNext {
        dev: u8,
    },
    LinkDown {
        dev: u8,
    },
    LinkUp {
        dev: u8,
    },
}

struct Env {
    pair: Pair,
    bufs: [Buf; 2],
    mrs: [Mr; 2],
}

fn env(fabric: Fabric, rnr_retry: u8, cq_depth: u32) -> Env {
    let cfg = Cfg {
        cap: QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        },
        cq_depth,
        access: all_access(),
        max_dest_rd_atomic: 4,
        sig_all: false,
    };
    let rts = RtsAttr {
        rnr_retry,
        ..rts_attr()
    };
    let pair = pair_in(fabric, cfg, rts);
    let bufs = [Buf::new(BUF, 0xa0), Buf::new(BUF, 0xb0)];
    let mrs = [
        bufs[0].reg(&pair.a.pd, all_access()),
        bufs[1].reg(&pair.b.pd, all_access()),
    ];
    Env { pair, bufs, mrs }
}

impl Env {
    fn side(&self, b: bool) -> &Side {
        if b {
            &self.pair.b
        } else {
            &self.pair.a
        }
    }

    fn wr(&self, b: bool, i: usize, w: W) -> SendWr<MAX_SGE> {
        let (me, peer) = (&self.mrs[usize::from(b)], &self.mrs[usize::from(!b)]);
        let atomic = w.kind >= 5;
        let (off, len) = match atomic {
            true => (usize::from(w.off % 32) * 8, 8),
            false => (usize::from(w.off) % 192, u32::from(w.len % 65)),
        };
        let mut local = sge(me, LOCAL + off, len);
        let mut raddr = peer.addr() + (REMOTE + off) as u64;
        let mut rkey = peer.rkey();
        match w.bad % 8 {
            1 => local.lkey ^= 0x100,
            2 => rkey ^= 0x100,
            3 => raddr += BUF as u64,
            4 if atomic => raddr += 4,
            _ => {}
        }
        let op = match w.kind % 7 {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm(i as u32),
            2 => SendOp::Write {
                remote_addr: raddr,
                rkey,
            },
            3 => SendOp::WriteWithImm {
                remote_addr: raddr,
                rkey,
                imm: 7,
            },
            4 => SendOp::Read {
                remote_addr: raddr,
                rkey,
            },
            5 => SendOp::CompareSwap {
                remote_addr: raddr,
                rkey,
                compare: 0xb0b0_b0b0_b0b0_b0b0,
                swap: i as u64,
            },
            _ => SendOp::FetchAdd {
                remote_addr: raddr,
                rkey,
                add: 3,
            },
        };
        let mut flags = SendFlags::empty();
        flags.set(SendFlags::SIGNALED, w.signaled);
        flags.set(SendFlags::INLINE, w.inline);
        swr(100 + i as u64, op, &[local], flags)
    }

    /// Applies `op`; what it returned, for comparison.
    fn apply(&self, op: &Op) -> String {
        let f = &self.pair.fabric;
        match *op {
            Op::Post { b, ref wrs, built } => {
                let wrs: Vec<SendWr<MAX_SGE>> = wrs
                    .iter()
                    .enumerate()
                    .map(|(i, &w)| self.wr(b, i, w))
                    .collect();
                let qp = &self.side(b).qp;
                let res = if built {
                    // SAFETY: inline entries name bytes of this side's buffer, which lives
                    // through the call (`wr` moves only keys and remote addresses).
                    unsafe { qp.post_send_raw(&wrs) }
                } else {
                    qp.post_send(&wrs)
                };
                format!("{res:?}")
            }
            Op::Recv { b, n, short } => {
                let me = &self.mrs[usize::from(b)];
                let len = if short { 8 } else { 64 };
                let wrs = (0..n)
                    .map(|i| {
                        rwr(
                            200 + u64::from(i),
                            &[sge(me, REMOTE + 64 * usize::from(i % 4), len)],
                        )
                    })
                    .collect::<Vec<_>>();
                format!("{:?}", self.side(b).qp.post_recv(&wrs))
            }
            Op::Poll { b, max } => {
                let mut wcs = vec![blank_wc(); usize::from(max)];
                let n = self.side(b).cq.poll(&mut wcs);
                format!("{n:?} {:?}", &wcs[..*n.as_ref().unwrap_or(&0)])
            }
            Op::DropNext { dev } => format!("{:?}", f.drop_next(usize::from(dev % 2), 1)),
            Op::LinkDown { dev } => format!("{:?}", f.link_down(usize::from(dev % 2))),
            Op::LinkUp { dev } => format!("{:?}", f.link_up(usize::from(dev % 2))),
        }
    }

    /// Everything observable at the end: completions, memory, states, counters.
    fn end(&self) -> String {
        let (a, b) = (&self.pair.a, &self.pair.b);
        format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            try_drain(&a.cq),
            try_drain(&b.cq),
            self.bufs[0].get(),
            self.bufs[1].get(),
            a.qp.state(),
            b.qp.state(),
            a.qp.counters(),
            b.qp.counters()
        )
    }
}

fn w() -> impl Strategy<Value = W> {
    (
        0..7u8,
        0..=64u8,
        any::<u8>(),
        any::<bool>(),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(kind, len, off, signaled, inline, bad)| W {
            kind,
            len,
            off,
            signaled,
            inline,
            bad: if bad { off % 5 } else { 0 },
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), prop::collection::vec(w(), 1..6), any::<bool>())
            .prop_map(|(b, wrs, built)| Op::Post { b, wrs, built }),
        3 => (any::<bool>(), 1..4u8, prop::bool::weighted(0.1)).prop_map(|(b, n, short)| Op::Recv { b, n, short }),
        2 => (any::<bool>(), 0..8u8).prop_map(|(b, max)| Op::Poll { b, max }),
        1 => any::<u8>().prop_map(|dev| Op::DropNext { dev }),
        1 => any::<u8>().prop_map(|dev| Op::LinkDown { dev }),
        1 => any::<u8>().prop_map(|dev| Op::LinkUp { dev }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn direct_path_matches_packet_path(
        ops in prop::collection::vec(op(), 1..24),
        rnr_retry in prop_oneof![Just(7u8), 0..7u8],
        cq_depth in prop_oneof![Just(64u32), 3..12u32],
    ) {
        let direct = env(Fabric::with_devices(2), rnr_retry, cq_depth);
        let traced = FabricConfig { trace: true, ..FabricConfig::instant() };
        let packets = env(Fabric::with_config(traced, 2), rnr_retry, cq_depth);
        for (i, op) in ops.iter().enumerate() {
            let (x, y) = (direct.apply(op), packets.apply(op));
            prop_assert_eq!(x, y, "op {} {:?}", i, op);
        }
        prop_assert_eq!(direct.end(), packets.end());
        prop_assert_eq!(packets.pair.fabric.direct_executions(), 0);
    }
}

/// The direct path is taken where it may be, and only there.
#[test]
fn direct_path_is_taken_on_the_untimed_fabric_only() {
    let write = |e: &Env| {
        let w = W {
            kind: 2,
            len: 64,
            off: 0,
            signaled: true,
            inline: false,
            bad: 0,
        };
        e.pair.a.qp.post_send(&[e.wr(false, 0, w)]).unwrap();
        assert_eq!(one(&e.pair.a.cq).status, WcStatus::Success);
        e.pair.fabric.direct_executions()
    };
    assert_eq!(write(&env(Fabric::with_devices(2), 7, 8)), 1);
    let traced = FabricConfig {
        trace: true,
        ..FabricConfig::instant()
    };
    assert_eq!(write(&env(Fabric::with_config(traced, 2), 7, 8)), 0);
    // A scripted drop pending on the path: the packet path takes it (and retransmits).
    let e = env(Fabric::with_devices(2), 7, 8);
    e.pair.fabric.drop_next(1, 1).unwrap();
    assert_eq!(write(&e), 0);
    assert_eq!(
        write(&e),
        1,
        "the drop is spent; the next write goes direct"
    );
}
