//! Liveness scenarios that every backend can show: a wait on a silent peer
//! returns within its timeout plus the grace and leaves nothing in flight; a side that
//! sends before its peer connected is delivered; ranks that barrier the moment their
//! connect returns, and leave the moment their last barrier returns, strand nobody.
//!
//! A dead local device cannot be provoked on rxe (no verbs call makes a device fatal);
//! that case runs on the simulator only (`tests/liveness.rs`). What rxe can do is take its
//! link down (`ip link set <netdev> down`): [`link_down_bounded`].

use std::thread;

use super::*;
use zverbs::node::{Node, NodeConfig};
use zverbs::{Channel, ChannelConfig, Error, PreparedChannel};

/// The timeout of the bounded waits here: short, so the scenarios stay quick.
const SHORT: Duration = Duration::from_millis(300);

pub(super) fn channel_config<E: Env>(
    env: &E,
    ctx: &Context<E::P>,
    timeout: Duration,
) -> ChannelConfig {
    ChannelConfig {
        qp: env.qp_config(ctx),
        timeout: Some(timeout),
        ..ChannelConfig::default()
    }
}

/// A device opened with a protection domain (which drops first).
pub(super) type Opened<P> = (ProtectionDomain<P>, Context<P>);

pub(super) fn open<E: Env>(env: &E, name: &str) -> Run<Opened<E::P>> {
    let ctx = Context::open(env.provider(), name).map_err(err("open device"))?;
    let pd = ctx.alloc_pd().map_err(err("alloc pd"))?;
    Ok((pd, ctx))
}

/// Two channels, side A on the first device and B on the second, prepared (not connected)
/// with `timeout`. Fields drop in order: the channels before their PDs and contexts.
pub(super) struct Ends<P: Provider> {
    pub(super) a: PreparedChannel<P, 4, 1>,
    pub(super) b: PreparedChannel<P, 4, 1>,
    pub(super) pa: ProtectionDomain<P>,
    pub(super) pb: ProtectionDomain<P>,
    ca: Context<P>,
    _cb: Context<P>,
}

pub(super) fn prepare_pair<E: Env>(env: &E, timeout: Duration) -> Run<Ends<E::P>> {
    let (da, db) = env.devices();
    let (pa, ca) = open(env, da)?;
    let (pb, cb) = open(env, db)?;
    let a = Channel::prepare(&ca, &pa, &channel_config(env, &ca, timeout));
    let b = Channel::prepare(&cb, &pb, &channel_config(env, &cb, timeout));
    Ok(Ends {
        a: a.map_err(err("prepare"))?,
        b: b.map_err(err("prepare"))?,
        pa,
        pb,
        ca,
        _cb: cb,
    })
}

/// A blocking receive that nobody answers: `Timeout` within the timeout plus the grace
/// (asserted at 10×), the queue pair in ERR (flushed, or discarded through RESET), nothing
/// left in flight.
pub fn wait_bounded_on_silent_peer<E: Env>(env: &E) -> Run<Outcome> {
    let ends = prepare_pair(env, SHORT)?;
    let (ea, eb) = (ends.a.endpoint(), ends.b.endpoint());
    let mut a = ends.a.connect(&eb).map_err(err("connect"))?;
    let _b = ends.b.connect(&ea).map_err(err("connect"))?;
    let pa = &ends.pa;
    let mut inbox = region(pa, 8, AccessFlags::LOCAL_WRITE, 0)?;
    let start = Instant::now();
    let r = a.receive([inbox.slice_mut(..).map_err(err("slice"))?]);
    let took = start.elapsed();
    let mut o = Outcome::default();
    o.item(
        "receive",
        match r {
            Err(Error::Timeout) => "Timeout".to_string(),
            other => format!("{other:?}"),
        },
    );
    let bound = SHORT + ChannelConfig::default().flush_grace;
    o.check("bounded", took < bound * 10);
    o.item("in_flight", format_args!("{:?}", a.in_flight()));
    Ok(o)
}

/// Side A connects and sends at once; side B connects only 50 ms later. On hardware the
/// retries of A's send cover the gap; the simulator must not fail it either.
pub fn send_before_peer_connects<E: Env>(env: &E) -> Run<Outcome> {
    let ends = prepare_pair(env, env.timeout())?;
    let (a, b) = (ends.a, ends.b);
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.connect(&eb).map_err(err("connect a"))?;
    let outbox = region(&ends.pa, 5, AccessFlags::LOCAL_WRITE, b'e')?;
    let mut inbox = region(&ends.pb, 8, AccessFlags::LOCAL_WRITE, 0)?;
    let (sent, got) = thread::scope(|t| {
        let sender = t.spawn(|| {
            let slice = outbox.slice(..).map_err(err("slice"))?;
            a.send([slice]).map_err(err("send"))
        });
        thread::sleep(Duration::from_millis(50));
        let got = b.connect(&ea).map_err(err("connect b")).and_then(|mut b| {
            let slice = inbox.slice_mut(..).map_err(err("slice"))?;
            b.receive([slice]).map_err(err("receive"))
        });
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err("sender panicked".into()));
        (sent, got)
    });
    let mut o = Outcome::default();
    o.item(
        "send",
        if sent.is_ok() {
            "ok".into()
        } else {
            format!("{sent:?}")
        },
    );
    o.item("received", got.map(|c| c.byte_len)?);
    o.check("bytes", &inbox.as_slice()[..5] == b"eeeee");
    Ok(o)
}

/// Three ranks connect (in-process) each on its own thread at its own time, run two
/// barriers the moment their connect returns, and drop their node the moment the last one
/// returns; nobody may time out.
pub fn barrier_at_connect_and_exit<E: Env>(env: &E) -> Run<Outcome> {
    const W: usize = 3;
    let (da, db) = env.devices();
    let ranks = (0..W)
        .map(|r| open(env, if r % 2 == 0 { da } else { db }))
        .collect::<Run<Vec<_>>>()?;
    let prepared = ranks
        .iter()
        .enumerate()
        .map(|(me, (pd, ctx))| {
            let cfg = NodeConfig {
                channel: channel_config(env, ctx, env.timeout()),
                barrier_timeout: Some(env.timeout()),
                ..NodeConfig::default()
            };
            Node::<E::P, W, 4, 1>::prepare(ctx, pd, me, W, &cfg).map_err(err("prepare node"))
        })
        .collect::<Run<Vec<_>>>()?;
    let eps: Vec<Vec<_>> = prepared
        .iter()
        .map(|n| (0..W).map(|p| n.endpoints(p).ok()).collect())
        .collect();
    let results: Vec<Run<()>> = thread::scope(|t| {
        let handles: Vec<_> = prepared
            .into_iter()
            .enumerate()
            .map(|(me, n)| {
                let eps = &eps;
                t.spawn(move || -> Run<()> {
                    thread::sleep(Duration::from_millis(20 * me as u64));
                    let mut node = n.connect(|p| eps[p][me]).map_err(err("connect node"))?;
                    let fail = |e| format!("rank {me}: {e}");
                    node.barrier_all().map_err(fail)?;
                    node.barrier_all().map_err(fail)?;
                    drop(node); // leave at once
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("rank panicked".into())))
            .collect()
    });
    let failed: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    let mut o = Outcome::default();
    o.item("ranks", W);
    o.item("failed", format_args!("{failed:?}"));
    Ok(o)
}

/// The link goes down under a connected pair: a send returns within its timeout plus the
/// grace (asserted at 10×) with nothing left in flight, whatever the backend reports for
/// it (retry exhaustion, a timeout, or delivery where rxe's loopback ignores the link).
/// Then the link comes back, both sides reset and reconnect, and a send works again.
pub fn link_down_bounded<E: Env>(env: &E) -> Run<Outcome> {
    let ends = prepare_pair(env, SHORT)?;
    let (ea, eb) = (ends.a.endpoint(), ends.b.endpoint());
    let mut a = ends.a.connect(&eb).map_err(err("connect"))?;
    let b = ends.b.connect(&ea).map_err(err("connect"))?;
    let ca = &ends.ca;
    let outbox = region(&ends.pa, 4, AccessFlags::LOCAL_WRITE, b'l')?;
    let mut inbox = region(&ends.pb, 8, AccessFlags::LOCAL_WRITE, 0)?;

    env.set_link(false)?;
    let start = Instant::now();
    let sent = a.send([outbox.slice(..).map_err(err("slice"))?]);
    let took = start.elapsed();
    let in_flight = a.in_flight();
    env.set_link(true)?;
    let mut o = Outcome::default();
    let bound = SHORT + ChannelConfig::default().flush_grace;
    o.check("bounded", took < bound * 10);
    o.item("in_flight", format_args!("{in_flight:?}"));
    let _ = sent; // its error (or success) is the backend's own

    // Back up: the port must be active again before the queue pairs reconnect.
    let deadline = Instant::now() + env.timeout();
    while ca.query_port(1).map_err(err("query port"))?.state != zverbs::PortState::Active {
        if Instant::now() >= deadline {
            return Err("port did not come back up".into());
        }
        thread::sleep(Duration::from_millis(10));
    }
    let (a, b) = (
        a.reset().map_err(err("reset"))?,
        b.reset().map_err(err("reset"))?,
    );
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.connect(&eb).map_err(err("reconnect"))?;
    let mut b = b.connect(&ea).map_err(err("reconnect"))?;
    let got = thread::scope(|t| {
        let receiver = t.spawn(|| {
            let slice = inbox.slice_mut(..).map_err(err("slice"))?;
            b.receive([slice]).map_err(err("receive"))
        });
        let slice = outbox.slice(..).map_err(err("slice"))?;
        a.send([slice]).map_err(err("send after link up"))?;
        receiver
            .join()
            .unwrap_or_else(|_| Err("receiver panicked".into()))
    })?;
    o.item("after_link_up", got.byte_len);
    Ok(o)
}

/// What every backend must give.
pub mod expected {
    #![allow(non_upper_case_globals)]
    pub const wait_bounded_on_silent_peer: &str = "receive=Timeout; bounded=ok; in_flight=(0, 0)";
    pub const send_before_peer_connects: &str = "send=ok; received=5; bytes=ok";
    pub const barrier_at_connect_and_exit: &str = "ranks=3; failed=[]";
    pub const link_down_bounded: &str = "bounded=ok; in_flight=(0, 0); after_link_up=4";
}
