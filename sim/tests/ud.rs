//! Unreliable datagrams on the simulator: what a UD receive holds, what is dropped and
//! why, and the personalities' differences (rxe's paths are named in `hca/ud.rs`).

mod common;

use common::*;
use zverbs_sim::*;

const QKEY: u32 = 0x0205;

/// A UD queue pair with its PD, CQ and a registered buffer of 8 KiB.
struct Node {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    buf: Buf,
    mr: Mr,
}

fn node(f: &Fabric, dev: &str, qkey: u32) -> Node {
    let ctx = f.open_device(dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let cap = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let attr = QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap,
        sq_sig_all: true,
    };
    let qp = pd.create_ud_qp(&attr).unwrap();
    let init = UdInitAttr {
        port: 1,
        pkey_index: 0,
        qkey,
    };
    qp.modify(&Transition::InitUd(init)).unwrap();
    qp.modify(&Transition::RtrUd).unwrap();
    qp.modify(&Transition::RtsUd { sq_psn: 0 }).unwrap();
    let buf = Buf::new(8192, 0);
    let mr = buf.reg(&pd, AccessFlags::LOCAL_WRITE);
    Node {
        ctx,
        pd,
        cq,
        qp,
        buf,
        mr,
    }
}

impl Node {
    /// An address handle to `to`'s device, from GID index `gid`.
    fn ah_to(&self, to: &Node, gid: u8) -> Ah {
        let attr = AhAttr::new(1, to.ctx.query_gid(1, gid).unwrap(), gid, 0);
        self.pd.create_ah(&attr).unwrap()
    }

    /// Posts a receive of `len` bytes at offset `off` of the buffer.
    fn recv(&self, wr_id: u64, off: usize, len: u32) {
        self.qp
            .post_recv(&[rwr(wr_id, &[sge(&self.mr, off, len)])])
            .unwrap();
    }

    /// Sends `len` bytes from offset `off` to `to` with `ah`.
    fn send(&self, wr_id: u64, ah: &Ah, to: &Node, off: usize, len: u32, imm: Option<u32>) {
        let dest = UdDest {
            ah: ah.key(),
            remote_qpn: to.qp.qp_num(),
            remote_qkey: QKEY,
        };
        let op = SendOp::Datagram { dest, imm };
        self.qp
            .post_send(&[sig(wr_id, op, &[sge(&self.mr, off, len)])])
            .unwrap();
    }
}

/// Two UD nodes on sim0 and sim1 of a fabric configured by `cfg`, stepped whatever `cfg`
/// says: a datagram lands a link latency after its post, so on a threaded fabric a poll
/// right after the post finds it only if the test ran slowly enough (these tests passed
/// in debug builds and failed in release ones). Stepped, a poll that finds nothing runs
/// the fabric until its queue has an entry or nothing is left to run.
fn two(cfg: FabricConfig) -> (Fabric, Node, Node) {
    let cfg = FabricConfig {
        mode: Mode::Stepped,
        auto_step: true,
        ..cfg
    };
    let f = Fabric::with_config(cfg, 2);
    let (a, b) = (node(&f, "sim0", QKEY), node(&f, "sim1", QKEY));
    (f, a, b)
}

fn dropped(f: &Fabric) -> Vec<DropReason> {
    f.trace_events()
        .iter()
        .filter_map(|e| match e.kind {
            TraceKind::Drop(PacketKind::Datagram, why) => Some(why),
            _ => None,
        })
        .collect()
}

fn traced() -> FabricConfig {
    FabricConfig {
        trace: true,
        ..FabricConfig::default()
    }
}

#[test]
fn a_receive_holds_the_global_route_header_then_the_message() {
    let (f, a, b) = two(FabricConfig::default());
    a.buf.set(0, &[7; 100]);
    for (i, gid) in [0u8, 1].into_iter().enumerate() {
        let ah = a.ah_to(&b, gid);
        let off = i * 1024;
        b.recv(i as u64, off, 40 + 100);
        a.send(10 + i as u64, &ah, &b, 0, 100, Some(0xfeed));
        let sent = one(&a.cq);
        assert_eq!(
            (sent.wr_id, sent.status, sent.byte_len),
            (10 + i as u64, WcStatus::Success, 100)
        );
        let got = one(&b.cq);
        assert_eq!(
            (got.status, got.opcode),
            (WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!((got.byte_len, got.imm), (140, Some(0xfeed)));
        assert_eq!(
            (got.src_qp, got.grh, got.qp_num),
            (a.qp.qp_num(), true, b.qp.qp_num())
        );
        let bytes = b.buf.get();
        let (grh, msg) = (&bytes[off..off + 40], &bytes[off + 40..off + 140]);
        assert_eq!(msg, &[7; 100][..]);
        let (sgid, dgid) = (
            a.ctx.query_gid(1, gid).unwrap(),
            b.ctx.query_gid(1, gid).unwrap(),
        );
        if gid == 0 {
            // IPv6: version 6, payload = UDP + BTH + DETH + message + ICRC, next header UDP.
            assert_eq!(grh[0] >> 4, 6);
            assert_eq!(u16::from_be_bytes([grh[4], grh[5]]), 8 + 12 + 8 + 100 + 4);
            assert_eq!((grh[6], grh[7]), (17, 64));
            assert_eq!((&grh[8..24], &grh[24..40]), (&sgid.0[..], &dgid.0[..]));
        } else {
            // IPv4-mapped GIDs: 20 zero bytes, then an IPv4 header whose checksum holds.
            assert_eq!(&grh[..20], &[0; 20]);
            let ip = &grh[20..];
            assert_eq!((ip[0], ip[8], ip[9]), (0x45, 64, 17));
            assert_eq!(
                u16::from_be_bytes([ip[2], ip[3]]) as usize,
                20 + 8 + 12 + 8 + 100 + 4
            );
            assert_eq!((&ip[12..16], &ip[16..20]), (&sgid.0[12..], &dgid.0[12..]));
            let sum: u32 = ip
                .chunks(2)
                .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                .sum();
            assert_eq!((sum & 0xffff) + (sum >> 16), 0xffff, "IPv4 header checksum");
        }
    }
    assert_eq!(f.datagrams_in_flight(), 0);
}

#[test]
fn datagrams_nobody_takes_are_dropped_silently_and_the_sender_still_succeeds() {
    let (f, a, b) = two(traced());
    let ah = a.ah_to(&b, 0);
    // No receive posted: dropped (UD has no RNR), and the next one lands.
    a.send(1, &ah, &b, 0, 8, None);
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert!(drain(&b.cq).is_empty());
    b.recv(5, 0, 48);
    a.send(2, &ah, &b, 0, 8, None);
    assert_eq!(one(&b.cq).wr_id, 5);
    // A Q_Key of another application.
    let other = node(&f, "sim1", QKEY + 1);
    other.recv(6, 0, 48);
    a.send(3, &ah, &other, 0, 8, None);
    // A receive too short for the header and the message: dropped, the receive kept.
    b.recv(7, 0, 40 + 4);
    a.send(4, &ah, &b, 0, 8, None);
    a.send(5, &ah, &b, 0, 4, None);
    assert_eq!(one(&b.cq).wr_id, 7);
    // A queue pair number nobody has, and a queue pair not yet in RTR.
    let mut gone = UdDest {
        ah: ah.key(),
        remote_qpn: 0xfff_fff,
        remote_qkey: QKEY,
    };
    let op = |dest| SendOp::Datagram { dest, imm: None };
    a.qp.post_send(&[sig(8, op(gone), &[])]).unwrap();
    let fresh =
        b.pd.create_ud_qp(&QpInitAttr {
            send_cq: &b.cq,
            recv_cq: &b.cq,
            cap: b.qp.cap(),
            sq_sig_all: false,
        })
        .unwrap();
    gone.remote_qpn = fresh.qp_num();
    a.qp.post_send(&[sig(9, op(gone), &[])]).unwrap();
    let sent = drain(&a.cq);
    let ok = |ids: &[u64]| {
        ids.iter()
            .map(|&i| (i, WcStatus::Success))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&sent), ok(&[2, 3, 4, 5, 8, 9]));
    assert!(drain(&other.cq).is_empty() && drain(&b.cq).is_empty());
    use DropReason::*;
    assert_eq!(dropped(&f), [NoReceive, QKey, ShortReceive, NoQp, NotReady]);
    assert_eq!(f.datagrams_in_flight(), 0);
}

#[test]
fn a_message_longer_than_the_mtu_emits_nothing_and_succeeds() {
    let (f, a, b) = two(traced());
    let ah = a.ah_to(&b, 0);
    b.recv(1, 0, 8192);
    let mtu = 128 << (a.ctx.query_port(1).unwrap().active_mtu as u32);
    a.send(1, &ah, &b, 0, mtu + 1, None);
    let sent = one(&a.cq);
    assert_eq!((sent.status, sent.byte_len), (WcStatus::Success, mtu + 1));
    assert!(drain(&b.cq).is_empty());
    assert_eq!(dropped(&f), [DropReason::OverMtu]);
    // One MTU exactly goes.
    a.send(2, &ah, &b, 0, mtu, None);
    assert_eq!(one(&b.cq).byte_len, 40 + mtu);
}

#[test]
fn the_high_qkey_bit_sends_the_own_qkey_except_on_rxe() {
    for (personality, lands) in [(Personality::Hca, true), (Personality::Rxe, false)] {
        let (_f, a, b) = two(FabricConfig {
            personality,
            ..FabricConfig::default()
        });
        let ah = a.ah_to(&b, 0);
        b.recv(1, 0, 64);
        let dest = UdDest {
            ah: ah.key(),
            remote_qpn: b.qp.qp_num(),
            remote_qkey: 0x8000_0000,
        };
        let op = SendOp::Datagram { dest, imm: None };
        a.qp.post_send(&[sig(1, op, &[])]).unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
        assert_eq!(drain(&b.cq).len(), usize::from(lands), "{personality:?}");
    }
}

#[test]
fn rdma_operations_are_refused_or_fail_the_queue_pair_as_on_rxe() {
    let write = SendOp::Write {
        remote_addr: 0,
        rkey: 0,
    };
    let (_f, a, _b) = two(FabricConfig::default());
    let err = a.qp.post_send(&[sig(1, write, &[])]).unwrap_err();
    assert!(matches!(err.error, SimError::Invalid(_)), "{err}");
    assert_eq!(a.qp.state(), QpState::ReadyToSend);
    // rxe's user-space provider posts it; its requester fails it.
    let (_f, a, _b) = two(FabricConfig {
        personality: Personality::Rxe,
        ..FabricConfig::default()
    });
    a.qp.post_send(&[sig(1, write, &[])]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::LocQpOpErr);
    assert_eq!(a.qp.state(), QpState::Error);
}

#[test]
fn datagrams_need_a_ud_queue_pair_and_a_live_address_handle_of_its_pd() {
    let p = pair();
    let (f, a, b) = two(FabricConfig::default());
    let ah = a.ah_to(&b, 0);
    let dest = UdDest {
        ah: ah.key(),
        remote_qpn: b.qp.qp_num(),
        remote_qkey: QKEY,
    };
    let dgram = SendOp::Datagram { dest, imm: None };
    let err = p.a.qp.post_send(&[sig(1, dgram, &[])]).unwrap_err();
    assert!(matches!(err.error, SimError::Invalid(_)), "{err}");
    // Another PD's handle, then a destroyed one.
    let other = node(&f, "sim0", QKEY);
    assert!(other.qp.post_send(&[sig(1, dgram, &[])]).is_err());
    drop(ah);
    let err = a.qp.post_send(&[sig(1, dgram, &[])]).unwrap_err();
    assert!(matches!(err.error, SimError::Invalid(_)), "{err}");
    assert!(drain(&a.cq).is_empty());
}

#[test]
fn ud_and_rc_transitions_do_not_mix() {
    let f = Fabric::with_devices(1);
    let ctx = f.open_device("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let attr = QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: Cfg::default().cap,
        sq_sig_all: false,
    };
    let ud = pd.create_ud_qp(&attr).unwrap();
    let rc = pd.create_qp(&attr).unwrap();
    assert_eq!((ud.qp_type(), rc.qp_type()), (QpType::Ud, QpType::Rc));
    let init = UdInitAttr {
        port: 1,
        pkey_index: 0,
        qkey: QKEY,
    };
    assert!(ud
        .modify(&Transition::Init(init_attr(AccessFlags::empty())))
        .is_err());
    assert!(rc.modify(&Transition::InitUd(init)).is_err());
    assert!(ud.modify(&Transition::RtrUd).is_err(), "RTR before INIT");
    ud.modify(&Transition::InitUd(init)).unwrap();
    assert!(
        ud.modify(&Transition::RtsUd { sq_psn: 0 }).is_err(),
        "RTS before RTR"
    );
    ud.modify(&Transition::RtrUd).unwrap();
    assert!(ud.modify(&Transition::RtsUd { sq_psn: 1 << 24 }).is_err());
    ud.modify(&Transition::RtsUd { sq_psn: 5 }).unwrap();
    assert_eq!(ud.state(), QpState::ReadyToSend);
}

#[test]
fn an_unroutable_address_loses_the_datagram_or_fails_on_rxe() {
    for (personality, status) in [
        (Personality::Hca, WcStatus::Success),
        (Personality::Rxe, WcStatus::LocQpOpErr),
    ] {
        let (_f, a, b) = two(FabricConfig {
            personality,
            ..FabricConfig::default()
        });
        let attr = AhAttr::new(1, Gid([0xfe; 16]), 0, 0);
        let ah = a.pd.create_ah(&attr).unwrap();
        a.send(1, &ah, &b, 0, 8, None);
        assert_eq!(one(&a.cq).status, status, "{personality:?}");
    }
}

/// By LID alone (no global route): delivered on an InfiniBand HCA, with no header in the
/// first 40 bytes (left as they were), the sender's LID and service level, and lost when
/// the LID names no device; refused at creation on RoCE (rxe), as is a static rate that
/// is no `ibv_rate`.
#[test]
fn an_address_without_a_global_route_goes_by_lid_on_an_hca_and_is_refused_on_rxe() {
    let (f, a, b) = two(traced());
    b.buf.set(0, &[0xee; 64]);
    let lid = |n: &Node| n.ctx.query_port(1).unwrap().lid;
    let mut attr = AhAttr::local(1, lid(&b));
    attr.sl = 9;
    let ah = a.pd.create_ah(&attr).unwrap();
    a.buf.set(4096, b"by lid");
    b.recv(101, 0, 64);
    a.send(1, &ah, &b, 4096, 6, None);
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let wc = one(&b.cq);
    assert_eq!(
        (wc.status, wc.byte_len, wc.grh),
        (WcStatus::Success, 46, false)
    );
    assert_eq!((wc.src_qp, wc.sl, wc.slid), (a.qp.qp_num(), 9, lid(&a)));
    assert_eq!(b.buf.get()[..40], [0xee; 40]);
    assert_eq!(&b.buf.get()[40..46], b"by lid");
    // A LID no device has: the datagram is lost, the send still succeeds.
    let nowhere = a.pd.create_ah(&AhAttr::local(1, 999)).unwrap();
    a.send(2, &nowhere, &b, 4096, 6, None);
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(dropped(&f), [DropReason::NoRoute]);
    attr.static_rate = MAX_STATIC_RATE + 1;
    assert!(matches!(a.pd.create_ah(&attr), Err(SimError::Invalid(_))));

    let (_f, a, b) = two(FabricConfig {
        personality: Personality::Rxe,
        ..FabricConfig::default()
    });
    let local = AhAttr::local(1, lid(&b));
    assert!(matches!(a.pd.create_ah(&local), Err(SimError::Invalid(_))));
}

#[test]
fn a_bad_receive_key_fails_the_receive_and_the_queue_pair() {
    let (_f, a, b) = two(FabricConfig::default());
    let ah = a.ah_to(&b, 0);
    let mut bad = sge(&b.mr, 0, 64);
    bad.lkey ^= 0x100;
    b.qp.post_recv(&[rwr(1, &[bad])]).unwrap();
    a.send(1, &ah, &b, 0, 8, None);
    assert_eq!(one(&b.cq).status, WcStatus::LocProtErr);
    assert_eq!(b.qp.state(), QpState::Error);
}

/// Loss, duplication and delay from the fault model, no retransmission: every datagram
/// that arrives is one that was sent, whole, at most twice; what is lost stays lost.
#[test]
fn faults_lose_duplicate_and_reorder_datagrams_and_nothing_is_resent() {
    for seed in [1, 7, 42] {
        let faults = Faults {
            drop: 0.3,
            duplicate: 0.2,
            delay: 0.3,
            max_extra_delay_ns: 5_000,
        };
        let f = stepped(seed, faults, 2);
        let (a, b) = (node(&f, "sim0", QKEY), node(&f, "sim1", QKEY));
        let ah = a.ah_to(&b, 0);
        for i in 0..16u8 {
            a.buf.set(64 * usize::from(i), &[i; 64]);
            b.recv(u64::from(i), 128 * usize::from(i), 128);
        }
        for i in 0..16u8 {
            a.send(
                u64::from(i),
                &ah,
                &b,
                64 * usize::from(i),
                64,
                Some(u32::from(i)),
            );
        }
        f.run_until_idle();
        let got = drain(&b.cq);
        let sent = drain(&a.cq);
        assert_eq!(sent.len(), 16, "seed {seed}: every send completes");
        assert!(
            sent.iter().all(|w| w.status == WcStatus::Success),
            "seed {seed}"
        );
        let mut seen = [0u32; 16];
        for (k, wc) in got.iter().enumerate() {
            assert_eq!(
                (wc.status, wc.byte_len),
                (WcStatus::Success, 104),
                "seed {seed}"
            );
            let i = wc.imm.unwrap() as usize;
            seen[i] += 1;
            let slot = &b.buf.get()[128 * k + 40..128 * k + 104];
            assert!(
                slot.iter().all(|&x| x == i as u8),
                "seed {seed}: datagram {i} whole"
            );
        }
        assert!(seen.iter().all(|&n| n <= 2), "seed {seed}: {seen:?}");
        let events = f.trace_events();
        let count = |k: TraceKind| events.iter().filter(|e| e.kind == k).count();
        let lost = count(TraceKind::Drop(PacketKind::Datagram, DropReason::Random));
        let dups = count(TraceKind::Duplicate(PacketKind::Datagram));
        assert_eq!(
            got.len() + lost,
            16 + dups,
            "seed {seed}: arrivals = sends - lost + dups"
        );
        assert!(
            lost > 0 && dups > 0,
            "seed {seed}: the faults fired ({lost} lost, {dups} dups)"
        );
        assert_eq!(count(TraceKind::Retransmit), 0, "seed {seed}");
        assert_eq!(f.datagrams_in_flight(), 0, "seed {seed}");
    }
}

#[test]
fn receivers_tell_senders_apart_by_source_qpn() {
    let f = Fabric::with_devices(3);
    let (a, b, c) = (
        node(&f, "sim0", QKEY),
        node(&f, "sim1", QKEY),
        node(&f, "sim2", QKEY),
    );
    for i in 0..2 {
        c.recv(i, 64 * i as usize, 64);
    }
    a.send(1, &a.ah_to(&c, 1), &c, 0, 8, None);
    b.send(1, &b.ah_to(&c, 1), &c, 0, 8, None);
    let got = drain(&c.cq);
    let src: Vec<u32> = got.iter().map(|w| w.src_qp).collect();
    assert_eq!(src, [a.qp.qp_num(), b.qp.qp_num()]);
}
