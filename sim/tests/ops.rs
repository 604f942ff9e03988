//! Successful operations: bytes moved, completions, selective signaling.

mod common;

use common::*;
use zverbs_sim::*;

fn ok(wr_id: u64, opcode: WcOpcode, byte_len: u32, imm: Option<u32>, qp: &Qp) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::Success,
        opcode,
        byte_len,
        imm,
        qp_num: qp.qp_num(),
        ..WorkCompletion::EMPTY
    }
}

/// What a write's target is registered with.
const WRITABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

/// A write to `dst` at `off`, registered as `md`.
fn write_into(dst: &Buf, off: usize, md: &Mr) -> SendOp {
    SendOp::Write {
        remote_addr: dst.addr(off),
        rkey: md.rkey(),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

#[test]
fn handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Fabric>();
    assert_send_sync::<Context>();
    assert_send_sync::<Pd>();
    assert_send_sync::<Mr>();
    assert_send_sync::<Cq>();
    assert_send_sync::<Qp>();
    assert_send_sync::<PostError<SimError>>();
}

#[test]
fn no_hashmap_in_sources() {
    let sources = [
        include_str!("../src/lib.rs"),
        include_str!("../src/types.rs"),
        include_str!("../src/api/mod.rs"),
        include_str!("../src/api/qp.rs"),
        include_str!("../src/api/fabric.rs"),
        include_str!("../src/api/comp_channel.rs"),
        include_str!("../src/hca/mod.rs"),
        include_str!("../src/hca/net.rs"),
        include_str!("../src/hca/comp_channel.rs"),
        include_str!("../src/hca/tables.rs"),
        include_str!("../src/hca/qp.rs"),
        include_str!("../src/hca/requester.rs"),
        include_str!("../src/hca/responder.rs"),
        include_str!("../src/hca/cq.rs"),
        include_str!("../src/hca/direct.rs"),
        include_str!("../src/hca/mem.rs"),
        include_str!("../src/sched.rs"),
        include_str!("../src/wire/link.rs"),
    ];
    for s in sources {
        assert!(!s.contains("HashMap") && !s.contains("HashSet") && !s.contains("RandomState"));
    }
}

#[test]
fn devices_ports_and_gids() {
    let f = Fabric::with_devices(2);
    let mut names = Vec::new();
    f.for_each_device(&mut |n| names.push(n.to_owned()));
    assert_eq!(names, ["sim0", "sim1"]);
    assert_eq!(
        f.add_device("sim1"),
        Err(SimError::Invalid("device name empty or taken"))
    );
    assert!(matches!(f.add_device(""), Err(SimError::Invalid(_))));
    f.add_device("extra").unwrap();
    assert!(matches!(f.open_device("nope"), Err(SimError::NotFound)));
    let ctx = f.open_device("sim1").unwrap();
    assert_eq!(ctx.name(), "sim1");
    let port = ctx.query_port(1).unwrap();
    assert_eq!(
        port,
        PortAttr {
            state: PortState::Active,
            lid: 2,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            gid_table_len: 2
        }
    );
    assert!(matches!(ctx.query_port(2), Err(SimError::NotFound)));
    let mut ll = [0u8; 16];
    ll[0] = 0xfe;
    ll[1] = 0x80;
    ll[15] = 2;
    assert_eq!(ctx.query_gid(1, 0).unwrap(), Gid(ll));
    let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
    assert_eq!(ctx.query_gid(1, 1).unwrap(), Gid(v4));
    assert!(matches!(ctx.query_gid(1, 2), Err(SimError::NotFound)));
    assert!(matches!(ctx.query_gid(2, 0), Err(SimError::NotFound)));
    assert_eq!(
        f.open_device("extra").unwrap().query_port(1).unwrap().lid,
        3
    );
    assert!(matches!(ctx.create_cq(0), Err(SimError::Invalid(_))));
    assert!(matches!(
        ctx.create_cq(MAX_CQE + 1),
        Err(SimError::Invalid(_))
    ));
    assert_eq!(ctx.create_cq(MAX_CQE).unwrap().depth(), MAX_CQE);
}

#[test]
fn keys_are_distinct_and_qpns_unique() {
    let p = pair();
    let buf = Buf::new(16, 0);
    let m1 = buf.reg(&p.a.pd, AccessFlags::LOCAL_WRITE);
    let m2 = buf.reg(&p.a.pd, AccessFlags::LOCAL_WRITE);
    assert_ne!(m1.lkey(), m1.rkey());
    let keys = [m1.lkey(), m1.rkey(), m2.lkey(), m2.rkey()];
    for (i, k) in keys.iter().enumerate() {
        assert!(!keys[i + 1..].contains(k));
    }
    assert_eq!(
        (m1.addr(), m1.len(), m1.is_empty()),
        (buf.addr(0), 16, false)
    );
    assert_ne!(p.a.qp.qp_num(), p.b.qp.qp_num());
    assert!(p.a.qp.qp_num() >= 0x11 && p.b.qp.qp_num() < 1 << 24);
    // SAFETY: a zero-length region names no memory.
    let empty = unsafe {
        p.a.pd
            .register_mr(buf.addr(16) as *mut u8, 0, AccessFlags::empty())
    };
    assert!(empty.unwrap().is_empty());
}

#[test]
fn send_and_send_with_imm() {
    let p = pair();
    let (src, dst) = (Buf::new(64, 0xaa), Buf::new(64, 0x55));
    src.set(0, &pattern(64, 1));
    let ms = src.reg(&p.a.pd, AccessFlags::empty());
    let md = dst.reg(&p.b.pd, AccessFlags::LOCAL_WRITE);
    p.b.qp
        .post_recv(&[rwr(1, &[sge(&md, 8, 32)]), rwr(2, &[sge(&md, 40, 24)])])
        .unwrap();
    p.a.qp
        .post_send(&[sig(10, SendOp::Send, &[sge(&ms, 0, 20)])])
        .unwrap();
    let imm = SendOp::SendWithImm(0xdead_beef);
    p.a.qp
        .post_send(&[sig(11, imm, &[sge(&ms, 20, 4)])])
        .unwrap();
    let send = |id| {
        ok(
            id,
            WcOpcode::Send,
            if id == 10 { 20 } else { 4 },
            None,
            &p.a.qp,
        )
    };
    assert_eq!(drain(&p.a.cq), [send(10), send(11)]);
    assert_eq!(
        drain(&p.b.cq),
        [
            ok(1, WcOpcode::Recv, 20, None, &p.b.qp),
            ok(2, WcOpcode::Recv, 4, Some(0xdead_beef), &p.b.qp)
        ]
    );
    let mut want = vec![0x55; 64];
    want[8..28].copy_from_slice(&pattern(64, 1)[..20]);
    want[40..44].copy_from_slice(&pattern(64, 1)[20..24]);
    assert_eq!(dst.get(), want);
    assert_eq!(src.get()[..], pattern(64, 1)[..]);
    assert_eq!(
        (p.a.qp.state(), p.b.qp.state()),
        (QpState::ReadyToSend, QpState::ReadyToSend)
    );
}

#[test]
fn zero_length_send_consumes_a_receive() {
    let p = pair();
    let dst = Buf::new(8, 7);
    let md = dst.reg(&p.b.pd, AccessFlags::LOCAL_WRITE);
    p.b.qp.post_recv(&[rwr(1, &[sge(&md, 0, 8)])]).unwrap();
    p.a.qp.post_send(&[sig(2, SendOp::Send, &[])]).unwrap();
    assert_eq!(one(&p.a.cq), ok(2, WcOpcode::Send, 0, None, &p.a.qp));
    assert_eq!(one(&p.b.cq), ok(1, WcOpcode::Recv, 0, None, &p.b.qp));
    assert_eq!(dst.get(), [7; 8]);
}

#[test]
fn write_and_write_with_imm() {
    let p = pair();
    let (src, dst) = (Buf::new(32, 0), Buf::new(32, 0x55));
    src.set(0, &pattern(32, 9));
    let ms = src.reg(&p.a.pd, AccessFlags::empty());
    let md = dst.reg(&p.b.pd, WRITABLE);
    let op = write_into(&dst, 4, &md);
    p.a.qp.post_send(&[sig(1, op, &[sge(&ms, 0, 8)])]).unwrap();
    assert_eq!(one(&p.a.cq), ok(1, WcOpcode::RdmaWrite, 8, None, &p.a.qp));
    assert!(drain(&p.b.cq).is_empty());
    let op = SendOp::WriteWithImm {
        remote_addr: dst.addr(20),
        rkey: md.rkey(),
        imm: 77,
    };
    p.a.qp.post_send(&[sig(2, op, &[sge(&ms, 8, 6)])]).unwrap();
    // Waits for a receive, whose scatter list is not used.
    assert!(drain(&p.a.cq).is_empty());
    assert_eq!(dst.get()[20..26], [0x55; 6]);
    p.b.qp.post_recv(&[rwr(3, &[])]).unwrap();
    assert_eq!(one(&p.a.cq), ok(2, WcOpcode::RdmaWrite, 6, None, &p.a.qp));
    assert_eq!(
        one(&p.b.cq),
        ok(3, WcOpcode::RecvRdmaWithImm, 6, Some(77), &p.b.qp)
    );
    let mut want = vec![0x55; 32];
    want[4..12].copy_from_slice(&pattern(32, 9)[..8]);
    want[20..26].copy_from_slice(&pattern(32, 9)[8..14]);
    assert_eq!(dst.get(), want);
}

#[test]
fn read_scatters_into_several_sges() {
    let p = pair();
    let (local, remote) = (Buf::new(32, 0xaa), Buf::new(32, 0));
    remote.set(0, &pattern(32, 100));
    let ml = local.reg(&p.a.pd, AccessFlags::LOCAL_WRITE);
    let mr = remote.reg(&p.b.pd, AccessFlags::REMOTE_READ);
    let op = SendOp::Read {
        remote_addr: remote.addr(2),
        rkey: mr.rkey(),
    };
    let sges = [sge(&ml, 0, 3), sge(&ml, 10, 0), sge(&ml, 16, 5)];
    p.a.qp.post_send(&[sig(1, op, &sges)]).unwrap();
    assert_eq!(one(&p.a.cq), ok(1, WcOpcode::RdmaRead, 8, None, &p.a.qp));
    assert!(drain(&p.b.cq).is_empty());
    let mut want = vec![0xaa; 32];
    want[0..3].copy_from_slice(&pattern(32, 100)[2..5]);
    want[16..21].copy_from_slice(&pattern(32, 100)[5..10]);
    assert_eq!(local.get(), want);
    assert_eq!(remote.get(), pattern(32, 100));
}

#[test]
fn send_gathers_and_scatters_across_sges() {
    let p = pair();
    let (src, dst) = (Buf::new(32, 0), Buf::new(32, 0x55));
    src.set(0, &pattern(32, 50));
    let ms = src.reg(&p.a.pd, AccessFlags::empty());
    let md = dst.reg(&p.b.pd, AccessFlags::LOCAL_WRITE);
    let gather = [sge(&ms, 0, 2), sge(&ms, 10, 3), sge(&ms, 20, 4)];
    let scatter = [sge(&md, 0, 4), sge(&md, 8, 4), sge(&md, 16, 8)];
    p.b.qp.post_recv(&[rwr(1, &scatter)]).unwrap();
    p.a.qp.post_send(&[sig(2, SendOp::Send, &gather)]).unwrap();
    assert_eq!(one(&p.a.cq).status, WcStatus::Success);
    assert_eq!(one(&p.b.cq), ok(1, WcOpcode::Recv, 9, None, &p.b.qp));
    let s = pattern(32, 50);
    let msg: Vec<u8> = [&s[0..2], &s[10..13], &s[20..24]].concat();
    let mut want = vec![0x55; 32];
    want[0..4].copy_from_slice(&msg[0..4]);
    want[8..12].copy_from_slice(&msg[4..8]);
    want[16] = msg[8];
    assert_eq!(dst.get(), want);
}

#[test]
fn atomics() {
    let p = pair();
    let (local, remote) = (Buf::new(24, 0xaa), Buf::new(24, 0x55));
    remote.set(8, &5u64.to_ne_bytes());
    let ml = local.reg(&p.a.pd, AccessFlags::LOCAL_WRITE);
    let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    let mr = remote.reg(&p.b.pd, acc);
    let (remote_addr, rkey) = (remote.addr(8), mr.rkey());
    let cas = |compare, swap| SendOp::CompareSwap {
        remote_addr,
        rkey,
        compare,
        swap,
    };
    // Unequal compare: no swap, old value returned (split over two local SGEs).
    let split = [sge(&ml, 1, 3), sge(&ml, 12, 5)];
    p.a.qp.post_send(&[sig(1, cas(4, 9), &split)]).unwrap();
    assert_eq!(one(&p.a.cq), ok(1, WcOpcode::CompareSwap, 8, None, &p.a.qp));
    assert_eq!(remote.get()[8..16], 5u64.to_ne_bytes());
    let got = local.get();
    assert_eq!([&got[1..4], &got[12..17]].concat(), 5u64.to_ne_bytes());
    assert_eq!((got[0], got[4], got[11], got[17]), (0xaa, 0xaa, 0xaa, 0xaa));
    // Equal compare swaps.
    p.a.qp
        .post_send(&[sig(2, cas(5, 9), &[sge(&ml, 0, 8)])])
        .unwrap();
    assert_eq!(one(&p.a.cq), ok(2, WcOpcode::CompareSwap, 8, None, &p.a.qp));
    assert_eq!(remote.get()[8..16], 9u64.to_ne_bytes());
    assert_eq!(local.get()[0..8], 5u64.to_ne_bytes());
    // Fetch and add (wrapping).
    let fa = SendOp::FetchAdd {
        remote_addr,
        rkey,
        add: u64::MAX,
    };
    p.a.qp.post_send(&[sig(3, fa, &[sge(&ml, 16, 8)])]).unwrap();
    assert_eq!(one(&p.a.cq), ok(3, WcOpcode::FetchAdd, 8, None, &p.a.qp));
    assert_eq!(remote.get()[8..16], 8u64.to_ne_bytes());
    assert_eq!(local.get()[16..24], 9u64.to_ne_bytes());
    let r = remote.get();
    assert!(r[..8].iter().chain(&r[16..]).all(|&b| b == 0x55));
    assert!(drain(&p.b.cq).is_empty());
}

#[test]
fn inline_copies_at_post_time() {
    let p = pair();
    let (src, dst) = (Buf::new(16, 1), Buf::new(16, 0x55));
    let ms = src.reg(&p.a.pd, AccessFlags::empty());
    let md = dst.reg(&p.b.pd, WRITABLE);
    // No receive posted: the send waits, with its payload already copied.
    let inline = SendFlags::INLINE | SendFlags::SIGNALED;
    let bogus_lkey = Sge {
        lkey: 0xdead,
        ..sge(&ms, 0, 4)
    };
    p.a.qp
        .post_send(&[swr(1, SendOp::Send, &[bogus_lkey], inline)])
        .unwrap();
    src.set(0, &[9; 16]);
    p.b.qp.post_recv(&[rwr(2, &[sge(&md, 0, 16)])]).unwrap();
    assert_eq!(one(&p.a.cq), ok(1, WcOpcode::Send, 4, None, &p.a.qp));
    assert_eq!(one(&p.b.cq), ok(2, WcOpcode::Recv, 4, None, &p.b.qp));
    assert_eq!(dst.get()[..8], [1, 1, 1, 1, 0x55, 0x55, 0x55, 0x55]);
    // Raw inline from unregistered memory.
    let stack = [3u8, 4, 5];
    let raw = Sge {
        addr: stack.as_ptr() as u64,
        length: 3,
        lkey: 0,
    };
    let op = write_into(&dst, 10, &md);
    // Unregistered inline memory is refused by the safe call ...
    let err = p.a.qp.post_send(&[swr(3, op, &[raw], inline)]).unwrap_err();
    assert_eq!((err.index, p.a.qp.state()), (0, QpState::ReadyToSend));
    // ... and read directly by the raw one.
    // SAFETY: `stack` is readable for the whole call.
    unsafe { p.a.qp.post_send_raw(&[swr(3, op, &[raw], inline)]) }.unwrap();
    assert_eq!(one(&p.a.cq), ok(3, WcOpcode::RdmaWrite, 3, None, &p.a.qp));
    assert_eq!(dst.get()[8..16], [0x55, 0x55, 3, 4, 5, 0x55, 0x55, 0x55]);
}

#[test]
fn unsignaled_work_completes_silently() {
    let p = pair();
    let (src, dst) = (Buf::new(8, 4), Buf::new(8, 0));
    let ms = src.reg(&p.a.pd, AccessFlags::empty());
    let md = dst.reg(&p.b.pd, WRITABLE);
    let op = write_into(&dst, 0, &md);
    p.a.qp
        .post_send(&[swr(1, op, &[sge(&ms, 0, 8)], SendFlags::empty())])
        .unwrap();
    assert!(drain(&p.a.cq).is_empty());
    assert_eq!(dst.get(), [4; 8]);
}

#[test]
fn sq_sig_all_signals_everything() {
    let p = pair_with(Cfg {
        sig_all: true,
        ..Cfg::default()
    });
    let src = Buf::new(8, 4);
    let ms = src.reg(&p.a.pd, AccessFlags::empty());
    p.b.qp.post_recv(&[rwr(1, &[])]).unwrap();
    p.a.qp
        .post_send(&[swr(7, SendOp::Send, &[sge(&ms, 0, 0)], SendFlags::empty())])
        .unwrap();
    assert_eq!(one(&p.a.cq), ok(7, WcOpcode::Send, 0, None, &p.a.qp));
}

#[test]
fn unsignaled_work_holds_sq_slots_until_a_later_completion() {
    let p = pair(); // max_send_wr = 8
    let src = Buf::new(8, 4);
    let ms = src.reg(&p.a.pd, AccessFlags::LOCAL_WRITE);
    let op = SendOp::Read {
        remote_addr: 0,
        rkey: 0,
    };
    let quiet = |id| swr(id, op, &[sge(&ms, 0, 0)], SendFlags::empty());
    p.a.qp
        .post_send(&(0..7).map(quiet).collect::<Vec<_>>())
        .unwrap();
    assert!(drain(&p.a.cq).is_empty());
    // A signaled one releases all earlier slots when it completes.
    p.a.qp.post_send(&[sig(7, op, &[])]).unwrap();
    assert_eq!(one(&p.a.cq).wr_id, 7);
    p.a.qp
        .post_send(&(10..18).map(quiet).collect::<Vec<_>>())
        .unwrap();
    // All 8 slots now held for good, though all work has executed.
    let err = p.a.qp.post_send(&[sig(20, op, &[])]).unwrap_err();
    assert_eq!(
        err,
        PostError {
            index: 0,
            error: SimError::QueueFull
        }
    );
    assert!(drain(&p.a.cq).is_empty());
    assert_eq!(p.a.qp.state(), QpState::ReadyToSend);
}

#[test]
fn send_waits_for_a_receive_in_order() {
    let p = pair();
    let (src, dst) = (Buf::new(8, 4), Buf::new(8, 0));
    let ms = src.reg(&p.a.pd, AccessFlags::empty());
    let md = dst.reg(&p.b.pd, WRITABLE);
    let write = write_into(&dst, 0, &md);
    p.a.qp
        .post_send(&[sig(1, SendOp::Send, &[sge(&ms, 0, 2)]), sig(2, write, &[])])
        .unwrap();
    // The write queues behind the waiting send.
    assert!(drain(&p.a.cq).is_empty());
    p.b.qp.post_recv(&[rwr(3, &[sge(&md, 4, 4)])]).unwrap();
    let ids: Vec<u64> = drain(&p.a.cq).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2]);
    assert_eq!(dst.get(), [0, 0, 0, 0, 4, 4, 0, 0]);
}

#[test]
fn gid_routed_path_and_loopback() {
    let f = Fabric::with_devices(1);
    let cfg = Cfg::default();
    let s = side(&f, "sim0", &cfg);
    let t = side(&f, "sim0", &cfg);
    let gid = s.ctx.query_gid(1, 1).unwrap();
    let via_gid = |dest| RtrAttr {
        dlid: 0,
        dgid: Some(gid),
        sgid_index: 1,
        ..rtr_attr(dest, 0, 1)
    };
    connect(&s.qp, cfg.access, via_gid(t.qp.qp_num()));
    connect(&t.qp, cfg.access, via_gid(s.qp.qp_num()));
    let buf = Buf::new(8, 0);
    buf.set(0, &[1, 2]);
    let m = buf.reg(&s.pd, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    let mt = buf.reg(&t.pd, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    let op = SendOp::Write {
        remote_addr: buf.addr(4),
        rkey: mt.rkey(),
    };
    s.qp.post_send(&[sig(1, op, &[sge(&m, 0, 2)])]).unwrap();
    assert_eq!(one(&s.cq), ok(1, WcOpcode::RdmaWrite, 2, None, &s.qp));
    assert_eq!(buf.get(), [1, 2, 0, 0, 1, 2, 0, 0]);
}
