//! Connections through the connection manager, on every backend: connect and accept with
//! private data both ways, then a send and a write over the channel they made; a reject
//! with a reason (and the listener serving the next request); a connect to a port nobody
//! listens on; a disconnect seen by the peer. Each side's address is the IPv4 of its GID
//! (rxe: the netdev's address; the simulator: `10.0.0.<i + 1>`); the ports differ per
//! scenario, as the kernel's port space is shared by the tests running at once.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::thread;

use zverbs::cm::{Answer, CmConnection, CmError, CmListener};
use zverbs::provider::cm::ConnectionManager;
use zverbs::ChannelConfig;

use super::*;

const HELLO: &[u8] = b"zverbs conformance: hello";
const WELCOME: &[u8] = b"welcome";

/// Each side's context, domain and address.
struct Sides<P: Provider> {
    ca: Context<P>,
    cb: Context<P>,
    pa: ProtectionDomain<P>,
    pb: ProtectionDomain<P>,
    ia: IpAddr,
    ib: IpAddr,
}

fn sides<E: Env>(env: &E) -> Run<Sides<E::P>> {
    let (da, db) = env.devices();
    let ca = Context::open(env.provider(), da).map_err(err("open a"))?;
    let cb = Context::open(env.provider(), db).map_err(err("open b"))?;
    let (pa, pb) = (
        ca.alloc_pd().map_err(err("pd a"))?,
        cb.alloc_pd().map_err(err("pd b"))?,
    );
    let (ia, ib) = (address(env, &ca)?, address(env, &cb)?);
    Ok(Sides {
        ca,
        cb,
        pa,
        pb,
        ia,
        ib,
    })
}

/// The IPv4 address of `ctx`'s port: its GID the suite addresses by if that is
/// IPv4-mapped (rxe's RoCE v2 entry), else the first that is (the simulator's index 1).
fn address<E: Env>(env: &E, ctx: &Context<E::P>) -> Run<IpAddr> {
    let first = env.qp_config(ctx).gid_index;
    let len = E::P::query_port(ctx.raw(), 1)
        .map_err(|e| format!("query_port: {e:?}"))?
        .gid_table_len;
    let indices = std::iter::once(first).chain((0..len.min(256)).map(|i| i as u8));
    for index in indices {
        if let Ok(gid) = E::P::query_gid(ctx.raw(), 1, index) {
            if let Some(v4) = Ipv6Addr::from(gid.0).to_ipv4_mapped() {
                return Ok(IpAddr::V4(v4));
            }
        }
    }
    Err("no IPv4-mapped GID on port 1".into())
}

fn config<E: Env>(env: &E, ctx: &Context<E::P>) -> ChannelConfig {
    ChannelConfig {
        qp: env.qp_config(ctx),
        timeout: Some(env.timeout()),
        ..ChannelConfig::default()
    }
}

/// A connects to B's listener with [`HELLO`]; B accepts with its region's address, length
/// and key after [`WELCOME`] (as `rping` hands its buffer over); A writes 8 bytes there,
/// then sends 8 more; B receives the send and reads the write.
pub fn cm_connect_accept<E: Env>(env: &E) -> Run<Outcome>
where
    E::P: ConnectionManager,
{
    let s = sides(env)?;
    let t = env.timeout();
    let listener =
        CmListener::bind(env.provider(), SocketAddr::new(s.ib, 7471)).map_err(err("listen"))?;
    let target = region(
        &s.pb,
        8,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        0,
    )?;
    let remote = target.remote();
    let mut reply = WELCOME.to_vec();
    reply.extend_from_slice(&remote.addr.to_le_bytes());
    reply.extend_from_slice(&remote.len.to_le_bytes());
    reply.extend_from_slice(&remote.rkey.to_le_bytes());
    let mut inbox = region(&s.pb, 16, AccessFlags::LOCAL_WRITE, 0)?;
    let (cfg_a, cfg_b) = (config(env, &s.ca), config(env, &s.cb));
    let (server, client) = thread::scope(|th| {
        let server = th.spawn(|| -> Run<(usize, bool, u32)> {
            let mut hello = (0, false);
            let mut conn = listener
                .accept_with::<64, SGES>(&s.cb, &s.pb, &cfg_b, t, |data| {
                    hello = (data.len(), data.starts_with(HELLO));
                    Answer::accept(&reply)
                })
                .map_err(err("accept"))?;
            let c = conn
                .channel()
                .receive([inbox.slice_mut(..).map_err(err("slice"))?])
                .map_err(err("receive"))?;
            Ok((hello.0, hello.1, c.byte_len))
        });
        let client = || -> Run<(usize, bool)> {
            let mut conn = CmConnection::<E::P, 64, SGES>::connect(
                env.provider(),
                &s.ca,
                &s.pa,
                Some(s.ia),
                SocketAddr::new(s.ib, 7471),
                HELLO,
                &cfg_a,
                t,
            )
            .map_err(err("connect"))?;
            let data = conn.peer_data();
            let (len, ok) = (data.len(), data.starts_with(WELCOME));
            let theirs = region_in(data.get(WELCOME.len()..).unwrap_or_default())
                .ok_or("the reply holds no region")?;
            let written = region(&s.pa, 8, AccessFlags::LOCAL_WRITE, b'w')?;
            let sent = region(&s.pa, 8, AccessFlags::LOCAL_WRITE, b's')?;
            conn.channel()
                .write([written.slice(..).map_err(err("slice"))?], &theirs)
                .map_err(err("write"))?;
            conn.channel()
                .send([sent.slice(..).map_err(err("slice"))?])
                .map_err(err("send"))?;
            Ok((len, ok))
        };
        let client = client();
        let server = server
            .join()
            .unwrap_or_else(|_| Err("server panicked".into()));
        (server, client)
    });
    let (req_len, hello_ok, received) = server?;
    let (reply_len, reply_ok) = client?;
    let mut o = Outcome::default();
    o.item("request_len", req_len)
        .check("hello", hello_ok)
        .item("reply_len", reply_len)
        .check("reply", reply_ok)
        .item("received", received)
        .check("send", inbox.as_slice()[..8] == [b's'; 8])
        .check("write", target.as_slice() == [b'w'; 8]);
    Ok(o)
}

/// A region's address, length and key as B's reply carries them (little-endian).
fn region_in(b: &[u8]) -> Option<zverbs::RemoteRegion> {
    Some(zverbs::RemoteRegion {
        addr: u64::from_le_bytes(b.get(0..8)?.try_into().ok()?),
        len: u64::from_le_bytes(b.get(8..16)?.try_into().ok()?),
        rkey: u32::from_le_bytes(b.get(16..20)?.try_into().ok()?),
    })
}

/// B rejects the first request with a reason; A sees `Rejected` with it (reason 28, the
/// consumer's), connects again, and B accepts that one.
pub fn cm_reject<E: Env>(env: &E) -> Run<Outcome>
where
    E::P: ConnectionManager,
{
    let s = sides(env)?;
    let t = env.timeout();
    let dst = SocketAddr::new(s.ib, 7472);
    let listener = CmListener::bind(env.provider(), dst).map_err(err("listen"))?;
    let (cfg_a, cfg_b) = (config(env, &s.ca), config(env, &s.cb));
    let (first, second) = thread::scope(|th| {
        let server = th.spawn(|| {
            let mut seen = 0;
            listener
                .accept_with::<64, SGES>(&s.cb, &s.pb, &cfg_b, t, |_| {
                    seen += 1;
                    if seen == 1 {
                        Answer::reject(b"no thanks")
                    } else {
                        Answer::accept(b"")
                    }
                })
                .map(drop)
                .map_err(err("accept"))
        });
        let connect = || {
            CmConnection::<E::P, 64, SGES>::connect(
                env.provider(),
                &s.ca,
                &s.pa,
                Some(s.ia),
                dst,
                HELLO,
                &cfg_a,
                t,
            )
        };
        let first = match connect() {
            Err(CmError::Rejected {
                status,
                private_data,
            }) => Ok(format!(
                "rejected status={status} len={} reason={}",
                private_data.len(),
                if private_data.starts_with(b"no thanks") {
                    "ok"
                } else {
                    "WRONG"
                }
            )),
            Err(e) => Err(format!("first connect: {e}")),
            Ok(_) => Err("first connect: accepted".into()),
        };
        let second = connect().map(drop).map_err(err("second connect"));
        let served = server
            .join()
            .unwrap_or_else(|_| Err("server panicked".into()));
        (first, second.and(served))
    });
    let mut o = Outcome::default();
    o.item("first", first?)
        .item("second", second.map(|()| "accepted")?);
    Ok(o)
}

/// A connect to a port nobody listens on: rejected by the peer's manager (reason 8, an
/// invalid service id).
pub fn cm_nobody<E: Env>(env: &E) -> Run<Outcome>
where
    E::P: ConnectionManager,
{
    let s = sides(env)?;
    let cfg = config(env, &s.ca);
    let r = CmConnection::<E::P, 64, SGES>::connect(
        env.provider(),
        &s.ca,
        &s.pa,
        Some(s.ia),
        SocketAddr::new(s.ib, 7479),
        HELLO,
        &cfg,
        env.timeout(),
    );
    let mut o = Outcome::default();
    match r {
        Err(CmError::Rejected { status, .. }) => o.item("rejected", status),
        Err(e) => o.item("error", e),
        Ok(_) => o.item("connected", "WRONG"),
    };
    Ok(o)
}

/// B disconnects a connection A made: B's own disconnect completes, and A sees the
/// peer's within the timeout.
pub fn cm_disconnect<E: Env>(env: &E) -> Run<Outcome>
where
    E::P: ConnectionManager,
{
    let s = sides(env)?;
    let t = env.timeout();
    let dst = SocketAddr::new(s.ib, 7473);
    let listener = CmListener::bind(env.provider(), dst).map_err(err("listen"))?;
    let (cfg_a, cfg_b) = (config(env, &s.ca), config(env, &s.cb));
    let (b_done, a_saw) = thread::scope(|th| {
        let server = th.spawn(|| -> Run<&'static str> {
            let conn = listener
                .accept::<64, SGES>(&s.cb, &s.pb, &cfg_b, t)
                .map_err(err("accept"))?;
            conn.disconnect(t).map(|_| "ok").map_err(err("disconnect"))
        });
        let client = CmConnection::<E::P, 64, SGES>::connect(
            env.provider(),
            &s.ca,
            &s.pa,
            Some(s.ia),
            dst,
            HELLO,
            &cfg_a,
            t,
        )
        .map_err(err("connect"));
        let saw = client.and_then(|c| {
            let start = Instant::now();
            while start.elapsed() < t {
                if c.peer_disconnected().map_err(err("events"))? {
                    return Ok("yes");
                }
                thread::sleep(Duration::from_millis(2));
            }
            Ok("no")
        });
        let done = server
            .join()
            .unwrap_or_else(|_| Err("server panicked".into()));
        (done, saw)
    });
    let mut o = Outcome::default();
    o.item("b_disconnect", b_done?).item("a_sees_it", a_saw?);
    Ok(o)
}

/// Three nodes connect through the manager at the addresses a bootstrap would give them
/// (rank 0 on A's device, ranks 1 and 2 on B's, each on a port of its own) and run ten
/// dissemination barriers.
pub fn cm_node_barrier<E: Env + Sync>(env: &E) -> Run<Outcome>
where
    E::P: ConnectionManager,
{
    use zverbs::node::barrier::Algorithm;
    use zverbs::node::{Node, NodeConfig};
    let s = sides(env)?;
    let t = env.timeout();
    let addrs: Vec<SocketAddr> = [s.ia, s.ib, s.ib]
        .iter()
        .zip(7610..)
        .map(|(&ip, port)| SocketAddr::new(ip, port))
        .collect();
    let (da, db) = env.devices();
    let devices = [da, db, db];
    let results: Vec<Run<usize>> = thread::scope(|th| {
        let ranks: Vec<_> = (0..3)
            .map(|rank| {
                let addrs = &addrs;
                let device = devices[rank];
                th.spawn(move || -> Run<usize> {
                    let ctx = Context::open(env.provider(), device).map_err(err("open"))?;
                    let pd = ctx.alloc_pd().map_err(err("pd"))?;
                    let listener =
                        CmListener::bind(env.provider(), addrs[rank]).map_err(err("listen"))?;
                    let cfg = NodeConfig {
                        algorithm: Algorithm::Dissemination,
                        barrier_timeout: Some(t),
                        channel: config(env, &ctx),
                        ..NodeConfig::default()
                    };
                    let node = Node::<E::P, 4, 16, SGES>::prepare(&ctx, &pd, rank, 3, &cfg)
                        .map_err(err("prepare"))?;
                    let (mut node, links) = node
                        .connect_cm(&ctx, &listener, addrs, Some(addrs[rank].ip()), t)
                        .map_err(err("connect_cm"))?;
                    let mut done = 0;
                    for _ in 0..10 {
                        node.barrier_all().map_err(err("barrier"))?;
                        done += 1;
                    }
                    // Every rank past its barriers before any node goes.
                    node.barrier_all().map_err(err("last barrier"))?;
                    thread::sleep(Duration::from_millis(50));
                    drop((node, links));
                    Ok(done)
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let mut o = Outcome::default();
    for (rank, r) in results.into_iter().enumerate() {
        o.item(&format!("rank{rank}"), r?);
    }
    Ok(o)
}

/// `udaddy`'s exchange: A asks B's datagram service (port 7475) for its queue pair; B
/// answers with its datagram channel's; A sends a datagram to what the manager resolved,
/// and B receives it from A's queue pair.
pub fn cm_ud<E: Env + Sync>(env: &E) -> Run<Outcome>
where
    E::P: ConnectionManager,
{
    use zverbs::cm::resolve_datagram;
    use zverbs::provider::cm::UD_QKEY;
    use zverbs::qp::{Ud, UdOptions};
    use zverbs::{AddressHandle, Channel, Destination, Op};
    const LEN: usize = 32;
    let s = sides(env)?;
    let t = env.timeout();
    let dst = SocketAddr::new(s.ib, 7475);
    let listener = CmListener::bind_datagram(env.provider(), dst).map_err(err("listen"))?;
    let opts = UdOptions {
        qkey: UD_QKEY,
        pkey_index: 0,
    };
    let mut a = Channel::<E::P, 4, 1, Ud>::datagram(&s.ca, &s.pa, &config(env, &s.ca), &opts)
        .map_err(err("datagram a"))?;
    let mut b = Channel::<E::P, 4, 1, Ud>::datagram(&s.cb, &s.pb, &config(env, &s.cb), &opts)
        .map_err(err("datagram b"))?;
    let (a_qpn, b_qpn) = (a.queue_pair().qp_num(), b.queue_pair().qp_num());
    let ping = region(&s.pa, LEN, AccessFlags::LOCAL_WRITE, b'u')?;
    let mut inbox = region(&s.pb, 40 + LEN, AccessFlags::LOCAL_WRITE, 0)?;
    let (request, peer, got) = thread::scope(|th| {
        let server = th.spawn(|| listener.answer_datagram(b_qpn, b"ud welcome", t));
        let peer = resolve_datagram(env.provider(), &s.ca, Some(s.ia), dst, b"ud hello", t)
            .map_err(err("resolve"));
        let request = server
            .join()
            .unwrap_or_else(|_| Err(CmError::Disconnected))
            .map_err(err("answer"));
        let got = peer.as_ref().map_err(Clone::clone).and_then(|p| {
            let ah = AddressHandle::create(&s.pa, &p.peer.ah).map_err(err("create ah"))?;
            let to = Destination::new(&ah, p.peer.qp_num, p.peer.qkey);
            b.scope(|sb| {
                let got = sb.post_receive([inbox.slice_mut(..)?])?;
                sb.ring_doorbell()?;
                a.scope(|sa| {
                    sa.post(Op::datagram([ping.slice(..)?], &to))?;
                    sa.ring_doorbell()?;
                    Ok(())
                })?;
                sb.wait_receive(got)
            })
            .map_err(err("datagram"))
        });
        (request, peer, got)
    });
    let (request, peer, got) = (request?, peer?, got?);
    let mut o = Outcome::default();
    o.item("request_len", request.as_slice().len())
        .check("request", request.as_slice().starts_with(b"ud hello"))
        .item("reply_len", peer.reply.as_slice().len())
        .check("reply", peer.reply.as_slice().starts_with(b"ud welcome"))
        .check("qp_num", peer.peer.qp_num == b_qpn)
        .item("qkey", format_args!("{:#x}", peer.peer.qkey))
        .check("src_qp", got.src_qp == a_qpn)
        .check("bytes", inbox.as_slice()[40..] == [b'u'; LEN]);
    Ok(o)
}

/// A datagram service request to a port nobody serves (7478), then to B's service there,
/// which refuses the first request it hears and answers the second: `Unreachable` with
/// the service reply's status, 1 then 2 (not the reliable connect's `Rejected`).
pub fn cm_ud_refused<E: Env + Sync>(env: &E) -> Run<Outcome>
where
    E::P: ConnectionManager,
{
    use zverbs::cm::resolve_datagram;
    let s = sides(env)?;
    let t = env.timeout();
    let dst = SocketAddr::new(s.ib, 7478);
    let ask = || resolve_datagram(env.provider(), &s.ca, Some(s.ia), dst, b"ud hello", t);
    let said = |r: Result<_, CmError<_>>| match r {
        Err(CmError::Unreachable { status }) => format!("unreachable {status}"),
        Err(e) => format!("error {e}"),
        Ok(_) => "answered".into(),
    };
    let nobody = said(ask());
    let listener = CmListener::bind_datagram(env.provider(), dst).map_err(err("listen"))?;
    let (refused, second, served) = thread::scope(|th| {
        let server = th.spawn(|| {
            let mut seen = 0;
            listener.answer_datagram_with(7, t, |_| {
                seen += 1;
                if seen == 1 {
                    Answer::reject(b"no thanks")
                } else {
                    Answer::accept(b"")
                }
            })
        });
        let (refused, second) = (said(ask()), said(ask()));
        let served = server
            .join()
            .unwrap_or_else(|_| Err(CmError::Disconnected))
            .map_err(err("answer"));
        (refused, second, served)
    });
    served?;
    let mut o = Outcome::default();
    o.item("nobody", nobody)
        .item("refused", refused)
        .item("second", second);
    Ok(o)
}

#[allow(non_upper_case_globals)]
pub mod expected {
    pub const cm_ud_refused: &str = "nobody=unreachable 1; refused=unreachable 2; second=answered";
    pub const cm_ud: &str = "request_len=180; request=ok; reply_len=136; reply=ok; qp_num=ok; \
         qkey=0x1234567; src_qp=ok; bytes=ok";
    pub const cm_node_barrier: &str = "rank0=10; rank1=10; rank2=10";
    pub const cm_connect_accept: &str =
        "request_len=56; hello=ok; reply_len=196; reply=ok; received=8; send=ok; write=ok";
    pub const cm_reject: &str = "first=rejected status=28 len=148 reason=ok; second=accepted";
    pub const cm_nobody: &str = "rejected=8";
    pub const cm_disconnect: &str = "b_disconnect=ok; a_sees_it=yes";
}
