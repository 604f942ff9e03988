//! The scenarios, and (in [`expected`]) the outcome the verbs specification requires of each.
//!
//! Side A is the requester, side B the responder, unless a scenario says otherwise.
//! wr_ids: A's sends 1.., A's receives 11.., B's receives 101...
//!
//! The error paths (bad keys, rights, lengths, flush, RNR exhaustion) are in `errors.rs`,
//! the multi-node scenarios (`MultiChannel` scatter/gather, `Node` barriers) in
//! `collective.rs`.

use std::thread;
use std::time::Duration;

use super::*;
use zverbs::{Channel, ChannelConfig};

pub(super) const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
pub(super) const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
pub(super) const RR: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_READ);
pub(super) const RA: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_ATOMIC);
pub(super) const SIG: SendFlags = SendFlags::SIGNALED;
pub(super) const NONE: SendFlags = SendFlags::empty();
/// A key no registration has: the top bit flipped (rxe and the simulator both reject it).
pub(super) const fn bad_key(k: u32) -> u32 {
    k ^ 0x8000_0000
}

pub(super) fn filled<P: Provider>(
    pd: &ProtectionDomain<P>,
    len: usize,
    access: AccessFlags,
    seed: u8,
) -> Run<MemoryRegion<'static, P>> {
    let mut mr = region(pd, len, access, 0)?;
    mr.as_mut_slice().copy_from_slice(&pattern(len, seed));
    Ok(mr)
}

pub(super) fn u64_at<P: Provider>(mr: &MemoryRegion<'_, P>, off: usize) -> u64 {
    u64::from_ne_bytes(mr.as_slice()[off..off + 8].try_into().unwrap())
}

pub(super) fn untouched(bytes: &[u8], fill: u8) -> bool {
    bytes.iter().all(|&b| b == fill)
}

/// A two-sided transfer of `len` bytes into a receive of `cap` bytes, with `op`.
pub(super) fn two_sided<E: Env>(env: &E, op: SendOp, len: usize, cap: usize) -> Run<Outcome> {
    let (a, b) = pair(env, &PairOptions::default())?;
    let src = filled(&a.pd, len, LW, 1)?;
    let dst = region(&b.pd, cap + 16, LW, 0xEE)?;
    // SAFETY: leaked regions, read only after the completions below.
    unsafe {
        post_recv(&b, &[rwr(101, &[sge(&dst, 0, cap)])])?;
        post_send(&a, &[swr(1, op, SIG, &[sge(&src, 0, len)])])?;
    }
    let (aw, bw) = (wait(env, &a.scq, 1)?, wait(env, &b.rcq, 1)?);
    let mut o = Outcome::default();
    o.wcs("a", &aw).wcs("b", &bw);
    if bw.first().map(|w| w.status) == Some(WcStatus::Success) {
        let d = dst.as_slice();
        o.check(
            "bytes",
            d[..len] == pattern(len, 1)[..] && untouched(&d[len..], 0xEE),
        );
    } else {
        o.state("a.state", &a).state("b.state", &b);
    }
    Ok(o)
}

pub fn send<E: Env>(env: &E) -> Run<Outcome> {
    two_sided(env, SendOp::Send, 64, 64)
}

pub fn send_imm<E: Env>(env: &E) -> Run<Outcome> {
    two_sided(env, SendOp::SendWithImm(0x1234_abcd), 48, 64)
}

/// A one-sided write/read/atomic from A to B's region; returns the pair, the regions and A's
/// completions for the caller to inspect.
type OneSided<P> = (
    Side<P>,
    Side<P>,
    MemoryRegion<'static, P>,
    MemoryRegion<'static, P>,
);

pub(super) fn one_sided<E: Env>(
    env: &E,
    o: &PairOptions,
    b_access: AccessFlags,
    b_len: usize,
    a_len: usize,
) -> Run<OneSided<E::P>> {
    let (a, b) = pair(env, o)?;
    let local = filled(&a.pd, a_len, LW, 1)?;
    let remote = filled(&b.pd, b_len, b_access, 2)?;
    Ok((a, b, local, remote))
}

pub fn write<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b, local, remote) = one_sided(env, &PairOptions::default(), RW, 64, 64)?;
    let r = remote.remote();
    let op = SendOp::Write {
        remote_addr: r.addr + 8,
        rkey: r.rkey,
    };
    // SAFETY: leaked regions, read only after completion.
    unsafe { post_send(&a, &[swr(1, op, SIG, &[sge(&local, 0, 48)])])? };
    let aw = wait(env, &a.scq, 1)?;
    let bw = settle(env, &b.rcq)?;
    let d = remote.as_slice();
    let (p1, p2) = (pattern(48, 1), pattern(64, 2));
    let mut o = Outcome::default();
    o.wcs("a", &aw).wcs("b", &bw).check(
        "bytes",
        d[8..56] == p1[..] && d[..8] == p2[..8] && d[56..] == p2[56..],
    );
    Ok(o)
}

pub fn write_imm<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b, local, remote) = one_sided(env, &PairOptions::default(), RW, 64, 64)?;
    let r = remote.remote();
    let op = SendOp::WriteWithImm {
        remote_addr: r.addr,
        rkey: r.rkey,
        imm: 0xfeed_0001,
    };
    // SAFETY: as in `write`; the receive has no scatter entries (write-with-imm needs none).
    unsafe {
        post_recv(&b, &[rwr(101, &[])])?;
        post_send(&a, &[swr(1, op, SIG, &[sge(&local, 0, 64)])])?;
    }
    let (aw, bw) = (wait(env, &a.scq, 1)?, wait(env, &b.rcq, 1)?);
    let mut o = Outcome::default();
    o.wcs("a", &aw)
        .wcs("b", &bw)
        .check("bytes", remote.as_slice() == &pattern(64, 1)[..]);
    Ok(o)
}

pub fn read<E: Env>(env: &E) -> Run<Outcome> {
    let (a, _b, local, remote) = one_sided(env, &PairOptions::default(), RR, 64, 64)?;
    let r = remote.remote();
    let op = SendOp::Read {
        remote_addr: r.addr + 16,
        rkey: r.rkey,
    };
    // SAFETY: as in `write`.
    unsafe { post_send(&a, &[swr(1, op, SIG, &[sge(&local, 0, 40)])])? };
    let aw = wait(env, &a.scq, 1)?;
    let l = local.as_slice();
    let mut o = Outcome::default();
    o.wcs("a", &aw).check(
        "bytes",
        l[..40] == pattern(64, 2)[16..56] && l[40..] == pattern(64, 1)[40..],
    );
    Ok(o)
}

pub fn cmp_swap<E: Env>(env: &E) -> Run<Outcome> {
    let (a, _b, local, mut remote) = one_sided(env, &PairOptions::default(), RA, 16, 16)?;
    remote.as_mut_slice()[8..].copy_from_slice(&5u64.to_ne_bytes());
    let r = remote.remote();
    let cs = |compare, swap| SendOp::CompareSwap {
        remote_addr: r.addr + 8,
        rkey: r.rkey,
        compare,
        swap,
    };
    let wrs = [
        swr(1, cs(5, 9), SIG, &[sge(&local, 0, 8)]),
        swr(2, cs(5, 11), SIG, &[sge(&local, 8, 8)]),
    ];
    // SAFETY: as in `write`.
    unsafe { post_send(&a, &wrs)? };
    let aw = wait(env, &a.scq, 2)?;
    let mut o = Outcome::default();
    o.wcs("a", &aw)
        .item(
            "old",
            format_args!("{},{}", u64_at(&local, 0), u64_at(&local, 8)),
        )
        .item("remote", u64_at(&remote, 8));
    Ok(o)
}

pub fn fetch_add<E: Env>(env: &E) -> Run<Outcome> {
    let (a, _b, local, mut remote) = one_sided(env, &PairOptions::default(), RA, 8, 8)?;
    remote.as_mut_slice().copy_from_slice(&40u64.to_ne_bytes());
    let r = remote.remote();
    let op = SendOp::FetchAdd {
        remote_addr: r.addr,
        rkey: r.rkey,
        add: 2,
    };
    // SAFETY: as in `write`.
    unsafe { post_send(&a, &[swr(1, op, SIG, &[sge(&local, 0, 8)])])? };
    let aw = wait(env, &a.scq, 1)?;
    let mut o = Outcome::default();
    o.wcs("a", &aw)
        .item("old", u64_at(&local, 0))
        .item("remote", u64_at(&remote, 0));
    Ok(o)
}

pub fn inline<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b) = pair(env, &PairOptions::default())?;
    let mut msg = pattern(32, 3); // not registered: inline data is copied at post time
    let dst = region(&b.pd, 64, LW, 0xEE)?;
    let wr = swr(
        1,
        SendOp::Send,
        SIG | SendFlags::INLINE,
        &[Sge {
            addr: msg.as_ptr() as u64,
            length: 32,
            lkey: 0,
        }],
    );
    // SAFETY: `msg` is readable during the call, which copies it (INLINE); `dst` is leaked.
    unsafe {
        post_recv(&b, &[rwr(101, &[sge(&dst, 0, 64)])])?;
        post_send(&a, &[wr])?;
    }
    msg.fill(0); // the device must not read it after the post
    let (aw, bw) = (wait(env, &a.scq, 1)?, wait(env, &b.rcq, 1)?);
    let d = dst.as_slice();
    let mut o = Outcome::default();
    o.wcs("a", &aw).wcs("b", &bw).check(
        "bytes",
        d[..32] == pattern(32, 3)[..] && untouched(&d[32..], 0xEE),
    );
    Ok(o)
}

pub fn multi_sge<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b) = pair(env, &PairOptions::default())?;
    let (s1, s2) = (filled(&a.pd, 32, LW, 1)?, filled(&a.pd, 32, LW, 2)?);
    let gather = [sge(&s1, 0, 16), sge(&s2, 4, 8), sge(&s1, 16, 16)];
    let mut want = pattern(32, 1)[..16].to_vec();
    want.extend_from_slice(&pattern(32, 2)[4..12]);
    want.extend_from_slice(&pattern(32, 1)[16..]);
    // Send: gather 3 entries, scatter into 3 (10 + 20 + rest).
    let (d1, d2) = (region(&b.pd, 64, LW, 0xEE)?, region(&b.pd, 64, LW, 0xEE)?);
    // Write: gather 3 entries into one remote range; read: scatter one range into 2 entries.
    let wt = filled(&b.pd, 64, RW.union(AccessFlags::REMOTE_READ), 5)?;
    let rd = region(&a.pd, 64, LW, 0xEE)?;
    let w = wt.remote();
    let wrs = [
        swr(1, SendOp::Send, SIG, &gather),
        swr(
            2,
            SendOp::Write {
                remote_addr: w.addr,
                rkey: w.rkey,
            },
            SIG,
            &gather,
        ),
        swr(
            3,
            SendOp::Read {
                remote_addr: w.addr,
                rkey: w.rkey,
            },
            SIG,
            &[sge(&rd, 0, 12), sge(&rd, 32, 28)],
        ),
    ];
    // SAFETY: leaked regions, read only after the completions below.
    unsafe {
        post_recv(
            &b,
            &[rwr(
                101,
                &[sge(&d1, 0, 10), sge(&d2, 0, 20), sge(&d1, 32, 32)],
            )],
        )?;
        post_send(&a, &wrs)?;
    }
    let (aw, bw) = (wait(env, &a.scq, 3)?, wait(env, &b.rcq, 1)?);
    let (x1, x2, t, r) = (d1.as_slice(), d2.as_slice(), wt.as_slice(), rd.as_slice());
    let recv_ok = x1[..10] == want[..10]
        && untouched(&x1[10..32], 0xEE)
        && x2[..20] == want[10..30]
        && untouched(&x2[20..], 0xEE)
        && x1[32..42] == want[30..]
        && untouched(&x1[42..], 0xEE);
    let write_ok = t[..40] == want[..] && t[40..] == pattern(64, 5)[40..];
    let read_ok = r[..12] == want[..12]
        && untouched(&r[12..32], 0xEE)
        && r[32..60] == want[12..]
        && untouched(&r[60..], 0xEE);
    let mut o = Outcome::default();
    o.wcs("a", &aw)
        .wcs("b", &bw)
        .check("recv_bytes", recv_ok)
        .check("write_bytes", write_ok)
        .check("read_bytes", read_ok);
    Ok(o)
}

pub fn selective_signaling<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b) = pair(env, &PairOptions::default())?;
    let src = filled(&a.pd, 64, LW, 1)?;
    let dst = region(&b.pd, 64, LW, 0xEE)?;
    let recvs: Vec<_> = (0..4)
        .map(|i| rwr(101 + i as u64, &[sge(&dst, 16 * i, 16)]))
        .collect();
    // One doorbell for four sends; only the last is signaled.
    let sends: Vec<_> = (0..4)
        .map(|i| {
            let flags = if i == 3 { SIG } else { NONE };
            swr(1 + i as u64, SendOp::Send, flags, &[sge(&src, 16 * i, 16)])
        })
        .collect();
    // SAFETY: leaked regions, read only after the completions below.
    unsafe {
        post_recv(&b, &recvs)?;
        post_send(&a, &sends)?;
    }
    let mut aw = wait(env, &a.scq, 1)?;
    let bw = wait(env, &b.rcq, 4)?;
    aw.extend(settle(env, &a.scq)?);
    let mut o = Outcome::default();
    o.wcs("a", &aw)
        .wcs("b", &bw)
        .check("bytes", dst.as_slice() == &pattern(64, 1)[..]);
    Ok(o)
}

pub fn rnr_then_recv<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b) = pair(env, &PairOptions::default())?; // rnr_retry 7: retry forever
    let src = filled(&a.pd, 16, LW, 1)?;
    let dst = region(&b.pd, 16, LW, 0)?;
    // SAFETY: leaked regions, read only after the completions below.
    unsafe { post_send(&a, &[swr(1, SendOp::Send, SIG, &[sge(&src, 0, 16)])])? };
    thread::sleep(Duration::from_millis(20));
    let before = settle(env, &a.scq)?;
    // SAFETY: as above.
    unsafe { post_recv(&b, &[rwr(101, &[sge(&dst, 0, 16)])])? };
    let (aw, bw) = (wait(env, &a.scq, 1)?, wait(env, &b.rcq, 1)?);
    let mut o = Outcome::default();
    o.wcs("a_before_recv", &before)
        .wcs("a", &aw)
        .wcs("b", &bw)
        .check("bytes", dst.as_slice() == &pattern(16, 1)[..]);
    Ok(o)
}

/// The layer above the seam on the same backend: a blocking ping-pong over two `Channel`s.
pub fn channel_roundtrip<E: Env>(env: &E) -> Run<Outcome> {
    let (da, db) = env.devices();
    let open = |name| -> Run<_> {
        let ctx = Context::open(env.provider(), name).map_err(err("open"))?;
        let pd = ctx.alloc_pd().map_err(err("alloc pd"))?;
        Ok((ctx, pd))
    };
    let ((ca, pa), (cb, pb)) = (open(da)?, open(db)?);
    let cfg = |ctx: &Context<E::P>| ChannelConfig {
        qp: env.qp_config(ctx),
        timeout: Some(env.timeout()),
        ..ChannelConfig::default()
    };
    let a = Channel::<E::P, 8, SGES>::prepare(&ca, &pa, &cfg(&ca)).map_err(err("prepare"))?;
    let b = Channel::<E::P, 8, SGES>::prepare(&cb, &pb, &cfg(&cb)).map_err(err("prepare"))?;
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.connect(&eb).map_err(err("connect"))?;
    let mut b = b.connect(&ea).map_err(err("connect"))?;
    let (mut ping, mut pong) = (pattern(64, 7), vec![0u8; 64]);
    let (mut got_a, mut got_b) = (vec![0u8; 64], vec![0u8; 64]);
    let ping_mr = pa.register(&mut ping).map_err(err("register"))?;
    let mut got_a_mr = pa.register(&mut got_a).map_err(err("register"))?;
    let pong_mr = pb.register(&mut pong).map_err(err("register"))?;
    let mut got_b_mr = pb.register(&mut got_b).map_err(err("register"))?;
    let (ra, rb) = thread::scope(|t| {
        let hb = t.spawn(|| -> Run<u32> {
            let slice = got_b_mr.slice_mut(..).map_err(err("slice"))?;
            let n = b.receive([slice]).map_err(err("b receive"))?.byte_len;
            b.send([pong_mr.slice(..32).map_err(err("slice"))?])
                .map_err(err("b send"))?;
            Ok(n)
        });
        let ra = (|| -> Run<u32> {
            // Receive first, so the reply never meets an empty queue.
            let slice = got_a_mr.slice_mut(..).map_err(err("slice"))?;
            // SAFETY: `got_a` is not touched until `wait` returns.
            let pending = unsafe { a.post_receive_unpolled(&[slice.sge()]) }
                .map_err(err("a post receive"))?;
            a.send([ping_mr.slice(..).map_err(err("slice"))?])
                .map_err(err("a send"))?;
            Ok(a.wait(pending).map_err(err("a receive"))?.byte_len)
        })();
        (ra, hb.join().unwrap_or_else(|_| Err("b panicked".into())))
    });
    let mut o = Outcome::default();
    o.item("a_received", ra?)
        .item("b_received", rb?)
        .check("bytes", got_b_mr.as_slice() == &pattern(64, 7)[..]);
    Ok(o)
}

/// What the verbs specification requires of each scenario.
pub mod expected {
    #![allow(non_upper_case_globals)]
    pub const send: &str = "a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=64]; bytes=ok";
    pub const send_imm: &str =
        "a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=48 imm=0x1234abcd]; bytes=ok";
    pub const write: &str = "a=[1:SUCCESS RdmaWrite]; b=[]; bytes=ok";
    pub const write_imm: &str =
        "a=[1:SUCCESS RdmaWrite]; b=[101:SUCCESS RecvRdmaWithImm len=64 imm=0xfeed0001]; bytes=ok";
    pub const read: &str = "a=[1:SUCCESS RdmaRead len=40]; bytes=ok";
    pub const cmp_swap: &str =
        "a=[1:SUCCESS CompareSwap len=8, 2:SUCCESS CompareSwap len=8]; old=5,9; remote=9";
    pub const fetch_add: &str = "a=[1:SUCCESS FetchAdd len=8]; old=40; remote=42";
    pub const inline: &str = "a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=32]; bytes=ok";
    pub const multi_sge: &str =
        "a=[1:SUCCESS Send, 2:SUCCESS RdmaWrite, 3:SUCCESS RdmaRead len=40]; \
         b=[101:SUCCESS Recv len=40]; recv_bytes=ok; write_bytes=ok; read_bytes=ok";
    pub const selective_signaling: &str = "a=[4:SUCCESS Send]; \
         b=[101:SUCCESS Recv len=16, 102:SUCCESS Recv len=16, 103:SUCCESS Recv len=16, \
         104:SUCCESS Recv len=16]; bytes=ok";
    pub const rnr_then_recv: &str =
        "a_before_recv=[]; a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=16]; bytes=ok";
    pub const channel_roundtrip: &str = "a_received=32; b_received=64; bytes=ok";
}
