//! Unreliable datagrams: what a UD receive holds (40 bytes of global route header, then the
//! message; the sender's QPN), and what the destination drops without a word (no receive
//! posted, a wrong Q_Key, a message longer than the port's MTU or than the receive) while
//! the sender's request succeeds. wr_ids as in `scenarios.rs`: A's sends 1.., B's receives
//! 101...

use super::liveness::{channel_config, open};
use super::scenarios::{filled, LW, SIG};
use super::*;
use zverbs::qp::{AddressHandle, Ud, UdOptions};
use zverbs::{AhAttr, Channel, Destination, Op, UdDest};

/// The Q_Key of the suite's UD queue pairs.
const QKEY: u32 = 0x0205;

/// One side of a UD pair. Fields drop in order: the handle and the queue pair first.
pub struct UdSide<P: Provider> {
    /// Side A's handle to B (unused on B).
    pub ah: Option<AddressHandle<P>>,
    pub qp: QueuePair<P, ReadyToSend, Ud>,
    pub cq: CompletionQueue<P>,
    pub pd: ProtectionDomain<P>,
    pub ctx: Context<P>,
}

/// Sides A and B of a UD pair.
type UdPair<P> = (UdSide<P>, UdSide<P>);

/// Two UD queue pairs, A on the first device, B on the second with Q_Key `b_qkey`; A holds
/// an address handle to B's device.
fn ud_pair<E: Env>(env: &E, b_qkey: u32) -> Run<UdPair<E::P>> {
    let (da, db) = env.devices();
    let (mut a, b) = (ud_side(env, da, QKEY, 64)?, ud_side(env, db, b_qkey, 64)?);
    a.ah = Some(ah_to(&a, &b)?);
    Ok((a, b))
}

/// A UD queue pair at RTS on device `name` with Q_Key `qkey`, on one completion queue of
/// `cq_depth` entries for both its queues; no address handle yet.
fn ud_side<E: Env>(env: &E, name: &str, qkey: u32, cq_depth: u32) -> Run<UdSide<E::P>> {
    let ctx = Context::open(env.provider(), name).map_err(err("open device"))?;
    let pd = ctx.alloc_pd().map_err(err("alloc pd"))?;
    let cq = CompletionQueue::create(&ctx, cq_depth).map_err(err("create cq"))?;
    let qp = QueuePair::create_ud(&ctx, &pd, &cq, &cq, &env.qp_config(&ctx))
        .map_err(err("create ud qp"))?;
    let opts = UdOptions {
        qkey,
        pkey_index: 0,
    };
    let qp = qp
        .into_init(&opts)
        .map_err(|e| format!("init: {}", e.error))?;
    let qp = qp.into_rtr().map_err(|e| format!("rtr: {}", e.error))?;
    let qp = qp.into_rts().map_err(|e| format!("rts: {}", e.error))?;
    Ok(UdSide {
        ah: None,
        qp,
        cq,
        pd,
        ctx,
    })
}

/// An address handle in `from`'s domain with a global route to `to`'s queue pair.
fn ah_to<P: Provider>(from: &UdSide<P>, to: &UdSide<P>) -> Run<AddressHandle<P>> {
    let ep = to.qp.endpoint();
    let attr = AhAttr::new(from.qp.port(), ep.gid, from.qp.gid_index(), ep.lid);
    AddressHandle::create(&from.pd, &attr).map_err(err("create ah"))
}

/// A datagram of `len` bytes of `src` from A to B, signaled, with `imm`.
fn datagram<P: Provider>(
    a: &UdSide<P>,
    b: &UdSide<P>,
    wr_id: u64,
    src: &MemoryRegion<'_, P>,
    len: usize,
    imm: Option<u32>,
) -> SendWr<SGES> {
    let dest = UdDest {
        ah: a.ah.as_ref().expect("A's handle").key(),
        remote_qpn: b.qp.qp_num(),
        remote_qkey: QKEY,
    };
    swr(
        wr_id,
        SendOp::Datagram { dest, imm },
        SIG,
        &[sge(src, 0, len)],
    )
}

/// Posts `wrs` on A, and `recvs` on B first.
///
/// # Safety
/// As [`post_send`]; A's handle lives in `a` until the sends complete.
unsafe fn exchange<P: Provider>(
    a: &UdSide<P>,
    b: &UdSide<P>,
    recvs: &[RecvWr<SGES>],
    wrs: &[SendWr<SGES>],
) -> Run<()> {
    // SAFETY: forwarded to the caller.
    unsafe {
        b.qp.post_recv(recvs)
            .map_err(|e| format!("post_recv: {e}"))?;
        a.qp.post_send(wrs).map_err(|e| format!("post_send: {e}"))
    }
}

/// Whether the 40-byte header names A's GID as source and B's as destination: the IPv6
/// header's addresses, or for IPv4-mapped GIDs those of the IPv4 header at byte 20.
fn grh_names<P: Provider>(grh: &[u8], a: &UdSide<P>, b: &UdSide<P>) -> bool {
    let (s, d) = (a.qp.endpoint().gid.0, b.qp.endpoint().gid.0);
    let v4 = s[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
    if v4 {
        grh[20] >> 4 == 4 && grh[32..36] == s[12..] && grh[36..40] == d[12..]
    } else {
        grh[0] >> 4 == 6 && grh[8..24] == s && grh[24..40] == d
    }
}

pub fn ud_send<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b) = ud_pair(env, QKEY)?;
    let src = filled(&a.pd, 64, LW, 3)?;
    let dst = region(&b.pd, 128, LW, 0xEE)?;
    // SAFETY: leaked regions, read after the completions; `a` holds the handle.
    unsafe {
        let recv = rwr(101, &[sge(&dst, 0, 128)]);
        exchange(
            &a,
            &b,
            &[recv],
            &[datagram(&a, &b, 1, &src, 64, Some(0xabc))],
        )?;
    }
    let (aw, bw) = (wait(env, &a.cq, 1)?, wait(env, &b.cq, 1)?);
    let d = dst.as_slice();
    let mut o = Outcome::default();
    o.wcs("a", &aw).wcs("b", &bw);
    if let Some(w) = bw.first() {
        o.check("b.src_qp", w.src_qp == a.qp.qp_num())
            .check("b.grh", w.grh)
            .check("grh_addresses", grh_names(&d[..40], &a, &b));
    }
    o.check("bytes", d[40..104] == pattern(64, 3)[..]);
    Ok(o)
}

/// The first datagram finds no receive, the second a wrong Q_Key, the third a receive too
/// short for it: all three dropped. The fourth fits the receive the others left posted.
pub fn ud_silent_drops<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b) = ud_pair(env, QKEY)?;
    let src = filled(&a.pd, 64, LW, 5)?;
    let dst = region(&b.pd, 128, LW, 0xEE)?;
    let mut wrong = datagram(&a, &b, 2, &src, 8, Some(2));
    if let SendOp::Datagram { dest, .. } = &mut wrong.op {
        dest.remote_qkey = QKEY + 1;
    }
    // SAFETY: leaked regions, read after the completions; `a` holds the handle.
    unsafe {
        exchange(&a, &b, &[], &[datagram(&a, &b, 1, &src, 8, Some(1))])?;
        let first = wait(env, &a.cq, 1)?;
        // Sent is not arrived (rxe receives on another context): let it reach B first.
        let _ = settle(env, &b.cq)?;
        let recv = rwr(101, &[sge(&dst, 0, 40 + 16)]);
        let sends = [wrong, datagram(&a, &b, 3, &src, 64, Some(3))];
        exchange(&a, &b, &[recv], &sends)?;
        let rest = wait(env, &a.cq, 2)?;
        a.qp.post_send(&[datagram(&a, &b, 4, &src, 16, Some(4))])
            .map_err(|e| format!("post_send: {e}"))?;
        let last = wait(env, &a.cq, 1)?;
        let bw = wait(env, &b.cq, 1)?;
        let late = settle(env, &b.cq)?;
        let aw: Vec<_> = first.into_iter().chain(rest).chain(last).collect();
        let mut o = Outcome::default();
        o.wcs("a", &aw).wcs("b", &bw).wcs("b.late", &late);
        o.check("bytes", dst.as_slice()[40..56] == pattern(16, 5)[..]);
        match b.qp.state() {
            Ok(s) => o.item("b.state", format_args!("{s:?}")),
            Err(e) => o.item("b.state", format_args!("query failed: {e}")),
        };
        Ok(o)
    }
}

/// A datagram one byte longer than the port's MTU: nothing is sent, the send succeeds
/// (IBTA C10-93.1.1); one of exactly the MTU lands.
pub fn ud_over_mtu<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b) = ud_pair(env, QKEY)?;
    let mtu = 128usize << (a.qp.endpoint().mtu as u32);
    let src = filled(&a.pd, mtu + 1, LW, 7)?;
    let dst = region(&b.pd, 40 + mtu + 1, LW, 0xEE)?;
    // SAFETY: leaked regions, read after the completions; `a` holds the handle.
    unsafe {
        let recv = rwr(101, &[sge(&dst, 0, 40 + mtu + 1)]);
        exchange(&a, &b, &[recv], &[datagram(&a, &b, 1, &src, mtu + 1, None)])?;
        let first = wait(env, &a.cq, 1)?;
        let early = settle(env, &b.cq)?;
        a.qp.post_send(&[datagram(&a, &b, 2, &src, mtu, None)])
            .map_err(|e| format!("post_send: {e}"))?;
        let second = wait(env, &a.cq, 1)?;
        let bw = wait(env, &b.cq, 1)?;
        let mut o = Outcome::default();
        o.check(
            "a.over_mtu_len",
            first
                .first()
                .is_some_and(|w| w.byte_len as usize == mtu + 1),
        )
        .wcs("a", &[first, second].concat())
        .wcs("b.early", &early)
        .check(
            "b.len",
            bw.first().is_some_and(|w| w.byte_len as usize == 40 + mtu),
        )
        .item("b", bw.len());
        Ok(o)
    }
}

/// rdma-core's `ibv_ud_pingpong`, its loop on datagram channels and without `unsafe`: each
/// round, both sides post a receive ahead in a scope (rung before a datagram can arrive),
/// A sends a ping to B, and B answers with a pong to the queue pair the ping came from
/// (its completion's `src_qp`). Every message arrives after its 40-byte header.
pub fn ud_pingpong<E: Env>(env: &E) -> Run<Outcome> {
    const ROUNDS: usize = 8;
    const LEN: usize = 64;
    let (da, db) = env.devices();
    let ((pa, ca), (pb, cb)) = (open(env, da)?, open(env, db)?);
    let opts = UdOptions {
        qkey: QKEY,
        pkey_index: 0,
    };
    let datagram_channel = |ctx: &Context<E::P>, pd| {
        let cfg = channel_config(env, ctx, env.timeout());
        Channel::<E::P, 4, 1, Ud>::datagram(ctx, pd, &cfg, &opts).map_err(err("datagram channel"))
    };
    let (mut a, mut b) = (datagram_channel(&ca, &pa)?, datagram_channel(&cb, &pb)?);
    let route = |from: &Channel<E::P, 4, 1, Ud>, pd, to: &Channel<E::P, 4, 1, Ud>| {
        let (qp, peer) = (from.queue_pair(), to.queue_pair().endpoint());
        let attr = AhAttr::new(qp.port(), peer.gid, qp.gid_index(), peer.lid);
        AddressHandle::create(pd, &attr).map_err(err("create ah"))
    };
    let (a_to_b, b_to_a) = (route(&a, &pa, &b)?, route(&b, &pb, &a)?);
    let (ping, pong) = (filled(&pa, LEN, LW, 11)?, filled(&pb, LEN, LW, 12)?);
    let mut a_in = region(&pa, 40 + LEN, LW, 0)?;
    let mut b_in = region(&pb, 40 + LEN, LW, 0)?;
    let to_b = Destination::new(&a_to_b, b.queue_pair().qp_num(), QKEY);
    let a_qpn = a.queue_pair().qp_num();
    let (mut rounds, mut lens, mut sources, mut bytes) = (0, true, true, true);
    for _ in 0..ROUNDS {
        b.scope(|sb| {
            let got_ping = sb.post_receive([b_in.slice_mut(..)?])?;
            sb.ring_doorbell()?;
            a.scope(|sa| {
                let got_pong = sa.post_receive([a_in.slice_mut(..)?])?;
                sa.ring_doorbell()?;
                sa.post(Op::datagram([ping.slice(..)?], &to_b))?;
                sa.ring_doorbell()?;
                let c = sb.wait_receive(got_ping)?;
                (lens, sources) = (
                    lens && c.byte_len as usize == 40 + LEN,
                    sources && c.src_qp == a_qpn,
                );
                let back = Destination::new(&b_to_a, c.src_qp, QKEY);
                sb.post(Op::datagram([pong.slice(..)?], &back))?;
                sb.ring_doorbell()?;
                let c = sa.wait_receive(got_pong)?;
                lens &= c.byte_len as usize == 40 + LEN;
                Ok(())
            })
        })
        .map_err(err("round"))?;
        bytes &= a_in.as_slice()[40..] == pattern(LEN, 12)[..]
            && b_in.as_slice()[40..] == pattern(LEN, 11)[..];
        rounds += 1;
    }
    let mut o = Outcome::default();
    o.item("rounds", rounds)
        .check("lengths", lens)
        .check("src_qp", sources)
        .check("bytes", bytes);
    Ok(o)
}

/// B's reply to the datagram `w` it received into `inbox`, through the path back that
/// `reply_path` finds; whether A, with a receive posted, got it whole.
fn reply<E: Env>(
    env: &E,
    a: &UdSide<E::P>,
    b: &UdSide<E::P>,
    w: &WorkCompletion,
    inbox: &MemoryRegion<'_, E::P>,
) -> Run<bool> {
    use zverbs::qp::{reply_path, GRH_BYTES};
    let grh = inbox
        .as_slice()
        .first_chunk::<GRH_BYTES>()
        .filter(|_| w.grh);
    let port = b.qp.port();
    let back = reply_path(&b.ctx, port, grh, w.slid, w.sl).map_err(err("reply_path"))?;
    let ah = AddressHandle::create(&b.pd, &back).map_err(err("create reply ah"))?;
    let src = filled(&b.pd, 8, LW, 9)?;
    let dst = region(&a.pd, 48, LW, 0)?;
    let dest = UdDest {
        ah: ah.key(),
        remote_qpn: w.src_qp,
        remote_qkey: QKEY,
    };
    let op = SendOp::Datagram { dest, imm: None };
    // SAFETY: leaked regions, read after the completions; `ah` lives past them.
    unsafe {
        a.qp.post_recv(&[rwr(201, &[sge(&dst, 0, 48)])])
            .map_err(|e| format!("post_recv: {e}"))?;
        b.qp.post_send(&[swr(2, op, SIG, &[sge(&src, 0, 8)])])
            .map_err(|e| format!("post_send: {e}"))?;
    }
    let (bw, aw) = (wait(env, &b.cq, 1)?, wait(env, &a.cq, 1)?);
    let ok = |w: &[WorkCompletion]| w.first().is_some_and(|w| w.status == WcStatus::Success);
    Ok(ok(&bw) && ok(&aw) && dst.as_slice()[40..48] == pattern(8, 9)[..])
}

/// A datagram through a handle with service level 5 and a static rate (40 Gb/s): B's
/// completion names A's queue pair, the service level and the LID A sent from, and says
/// the buffer starts with the global route header; the P_Key index is 0 (it is valid for
/// the general services queue pair only).
pub fn ud_source<E: Env>(env: &E) -> Run<Outcome> {
    let (mut a, b) = ud_pair(env, QKEY)?;
    let to = b.qp.endpoint();
    let mut attr = AhAttr::new(a.qp.port(), to.gid, a.qp.gid_index(), to.lid);
    (attr.sl, attr.static_rate) = (5, 7);
    a.ah = Some(AddressHandle::create(&a.pd, &attr).map_err(err("create ah"))?);
    let src = filled(&a.pd, 16, LW, 4)?;
    let dst = region(&b.pd, 64, LW, 0xEE)?;
    // SAFETY: leaked regions, read after the completions; `a` holds the handle.
    unsafe {
        let recv = rwr(101, &[sge(&dst, 0, 64)]);
        exchange(&a, &b, &[recv], &[datagram(&a, &b, 1, &src, 16, None)])?;
    }
    let (aw, bw) = (wait(env, &a.cq, 1)?, wait(env, &b.cq, 1)?);
    let a_lid = a.qp.endpoint().lid;
    let mut o = Outcome::default();
    o.wcs("a", &aw).wcs("b", &bw);
    if let Some(w) = bw.first() {
        let slid = match w.slid {
            s if s == a_lid && s != 0 => "a.lid".to_string(),
            s => s.to_string(),
        };
        o.check("b.src_qp", w.src_qp == a.qp.qp_num())
            .item("b.sl", w.sl)
            .item("b.slid", slid)
            .check("b.grh", w.grh)
            .item("b.pkey_index", w.pkey_index)
            .check("reply", reply(env, &a, &b, w, &dst)?);
    }
    o.check("bytes", dst.as_slice()[40..56] == pattern(16, 4)[..]);
    Ok(o)
}

/// A datagram through a handle without a global route (by LID alone): an InfiniBand HCA
/// delivers it with the receive's first 40 bytes left as they were, `byte_len` still
/// counting them and no GRH flag; a RoCE device refuses such a handle.
pub fn ud_no_grh<E: Env>(env: &E) -> Run<Outcome> {
    let (mut a, b) = ud_pair(env, QKEY)?;
    let mut o = Outcome::default();
    let attr = AhAttr::local(a.qp.port(), b.qp.endpoint().lid);
    match AddressHandle::create(&a.pd, &attr) {
        Ok(ah) => a.ah = Some(ah),
        Err(e) => {
            o.item("create_ah", format_args!("{:?}", e.kind()));
            return Ok(o);
        }
    }
    let src = filled(&a.pd, 16, LW, 6)?;
    let dst = region(&b.pd, 64, LW, 0xEE)?;
    // SAFETY: leaked regions, read after the completions; `a` holds the handle.
    unsafe {
        let recv = rwr(101, &[sge(&dst, 0, 64)]);
        exchange(&a, &b, &[recv], &[datagram(&a, &b, 1, &src, 16, None)])?;
    }
    let (aw, bw) = (wait(env, &a.cq, 1)?, wait(env, &b.cq, 1)?);
    let d = dst.as_slice();
    o.wcs("a", &aw).wcs("b", &bw);
    if let Some(w) = bw.first() {
        o.check("b.src_qp", w.src_qp == a.qp.qp_num())
            .item("b.grh", w.grh)
            .check("reply", reply(env, &a, &b, w, &dst)?);
    }
    o.check("header_untouched", d[..40] == [0xEE; 40])
        .check("bytes", d[40..56] == pattern(16, 6)[..]);
    Ok(o)
}

/// A completion queue asked for one entry takes 16 datagram send completions: it
/// overflows, and the device's asynchronous event `CQ_ERR` names it (rxe: `rxe_cq_post`
/// raises it; the simulator as an HCA does).
pub fn cq_overflow_event<E: Env>(env: &E) -> Run<Outcome> {
    use zverbs::{AsyncEventKind, EventElement};
    const N: u64 = 16;
    let mut a = ud_side(env, env.devices().0, QKEY, 1)?;
    a.ah = Some(ah_to(&a, &a)?);
    let (cq, qp) = (&a.cq, &a.qp);
    // What came before (a port event at the device's start, say) is not this scenario's.
    while a
        .ctx
        .next_async_event()
        .map_err(err("async event"))?
        .is_some()
    {}
    let dest = UdDest {
        ah: a.ah.as_ref().expect("A's handle").key(),
        remote_qpn: qp.qp_num(),
        remote_qkey: QKEY,
    };
    let wrs: Vec<_> = (1..=N)
        .map(|id| swr(id, SendOp::Datagram { dest, imm: None }, SIG, &[]))
        .collect();
    // SAFETY: no gather entries: the requests name no memory; `a` holds the handle.
    unsafe { qp.post_send(&wrs) }.map_err(|e| format!("post_send: {e}"))?;
    let mut o = Outcome::default();
    let event = wait_event(&a.ctx, AsyncEventKind::CqErr, env.timeout())?;
    match event {
        Some(ev) => o
            .item("event", "CQ_ERR")
            .check("names_the_cq", ev.element == EventElement::Cq(cq.key())),
        None => o.item("event", "none"),
    };
    Ok(o)
}

pub mod expected {
    #![allow(non_upper_case_globals)]
    pub const cq_overflow_event: &str = "event=CQ_ERR; names_the_cq=ok";
    pub const ud_source: &str = "a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=56]; \
         b.src_qp=ok; b.sl=5; b.slid=a.lid; b.grh=ok; b.pkey_index=0; reply=ok; bytes=ok";
    pub const ud_no_grh: &str = "a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=56]; \
         b.src_qp=ok; b.grh=false; reply=ok; header_untouched=ok; bytes=ok";
    pub const ud_send: &str = "a=[1:SUCCESS Send]; b=[101:SUCCESS Recv len=104 imm=0xabc]; \
         b.src_qp=ok; b.grh=ok; grh_addresses=ok; bytes=ok";
    pub const ud_silent_drops: &str = "a=[1:SUCCESS Send, 2:SUCCESS Send, 3:SUCCESS Send, \
         4:SUCCESS Send]; b=[101:SUCCESS Recv len=56 imm=0x4]; b.late=[]; bytes=ok; \
         b.state=ReadyToSend";
    pub const ud_pingpong: &str = "rounds=8; lengths=ok; src_qp=ok; bytes=ok";
    pub const ud_over_mtu: &str = "a.over_mtu_len=ok; a=[1:SUCCESS Send, 2:SUCCESS Send]; \
         b.early=[]; b.len=ok; b=1";
}
