//! Completion events (`ibv_comp_channel`): arming, the event, one-shot arms, the poll
//! after the arm, and solicited-only arms, with outcomes that do not depend on timing.
//!
//! Side B's receive queue reports to a completion channel; A sends to it.

use super::scenarios::{filled, LW, NONE};
use super::*;

/// How long a late event (the device's interrupt path, after the completion is visible)
/// may take to reach the channel.
const LATE: Duration = Duration::from_millis(200);

/// Takes every pending event of `ch` and hands it to `cq`; how many there were, or an
/// error naming an event of another queue.
fn take_events<P: Provider>(ch: &CompletionChannel<P>, cq: &CompletionQueue<P>) -> Run<usize> {
    let mut n = 0;
    while let Some(ev) = ch.try_get_event().map_err(err("get event"))? {
        cq.ack_event(ev)
            .map_err(|ev| format!("event of an unknown queue {:#x}", ev.key()))?;
        n += 1;
    }
    Ok(n)
}

/// Notify, event, poll again:
///
/// 1. armed with nothing completed: the poll after the arm is empty and the descriptor
///    silent;
/// 2. a receive completes: the sleeper wakes, one event names B's queue;
/// 3. without a new arm, the next receive raises nothing (one-shot);
/// 4. a receive completed before the arm (A's send completion proves the message was
///    received) is found by the poll after the arm; whatever event it raised is taken,
///    and once armed again over an empty queue the descriptor is silent;
/// 5. armed solicited-only, a plain receive raises nothing and a SOLICITED one wakes the
///    sleeper.
pub fn cq_events<E: Env>(env: &E) -> Run<Outcome> {
    let (a, b) = pair(
        env,
        &PairOptions {
            b_events: true,
            ..PairOptions::default()
        },
    )?;
    let ch = b.events.as_ref().ok_or("no completion channel")?;
    let src = filled(&a.pd, 32, LW, 3)?;
    let dst = region(&b.pd, 6 * 32, LW, 0)?;
    let readable = |t| ch.wait_readable(t).map_err(err("poll(2)"));
    // Nothing raised an event within the grace period (zero on the simulator).
    let silent = || readable(Some(env.grace())).map(|r| !r);
    // A send of message `id` (1..=6) into slot `id - 1` of `dst`, and its receive.
    let send = |id: u64, flags: SendFlags| -> Run<()> {
        let slot = (id as usize - 1) * 32;
        // SAFETY: leaked regions, read only after the completions below.
        unsafe {
            post_recv(&b, &[rwr(100 + id, &[sge(&dst, slot, 32)])])?;
            post_send(&a, &[swr(id, SendOp::Send, flags, &[sge(&src, 0, 32)])])
        }
    };
    let mut o = Outcome::default();

    b.rcq.arm(false).map_err(err("arm"))?;
    o.wcs("armed", &settle(env, &b.rcq)?);
    o.item("silent", silent()?);

    send(1, SendFlags::SIGNALED)?;
    o.item("woken", readable(Some(env.timeout()))?);
    o.item("events", take_events(ch, &b.rcq)?);
    o.wcs("b", &wait(env, &b.rcq, 1)?);

    send(2, SendFlags::SIGNALED)?;
    let unarmed = wait(env, &b.rcq, 1)?;
    o.wcs("unarmed", &unarmed);
    o.item("unarmed_silent", silent()?);

    send(3, SendFlags::SIGNALED)?;
    wait(env, &a.scq, 3)?; // A's three sends, the last acknowledged: B received it
    b.rcq.arm(false).map_err(err("arm"))?;
    o.wcs("repoll", &wait(env, &b.rcq, 1)?);
    // One event if the receive completed after the arm, none if before; a device may
    // raise it just after the completion became visible.
    if take_events(ch, &b.rcq)? == 0 && readable(Some(LATE))? {
        take_events(ch, &b.rcq)?;
    }
    b.rcq.arm(false).map_err(err("arm"))?;
    o.wcs("rearmed", &settle(env, &b.rcq)?);
    o.item("rearmed_silent", silent()?);

    // Still armed (for any completion): one plain receive spends that arm.
    send(4, NONE)?;
    o.item("next_woken", readable(Some(env.timeout()))?);
    o.item("next_events", take_events(ch, &b.rcq)?);
    o.wcs("next", &wait(env, &b.rcq, 1)?);

    b.rcq.arm(true).map_err(err("arm"))?;
    send(5, NONE)?;
    o.wcs("unsolicited", &wait(env, &b.rcq, 1)?);
    o.item("unsolicited_silent", silent()?);
    send(6, SendFlags::SOLICITED)?;
    o.item("solicited_woken", readable(Some(env.timeout()))?);
    o.item("solicited_events", take_events(ch, &b.rcq)?);
    o.wcs("solicited", &wait(env, &b.rcq, 1)?);
    o.check(
        "bytes",
        dst.as_slice().chunks(32).all(|c| c == pattern(32, 3)),
    );
    Ok(o)
}

/// What the verbs specification requires.
/// The device's asynchronous events of its port: `PORT_ERR` when the link goes down
/// (rxe: its netdev set down), `PORT_ACTIVE` when it comes back, each naming port 1.
/// Between the two, empty polls of a queue on the device (which look at its events for a
/// fatal one on verbs: on one empty poll in 16, at most once a millisecond) take nothing
/// away: the events still
/// come, in order, from the context.
pub fn port_down_event<E: Env>(env: &E) -> Run<Outcome> {
    use zverbs::{AsyncEventKind, EventElement};
    let ctx = Context::open(env.provider(), env.devices().1).map_err(err("open device"))?;
    // What came before (an earlier scenario's port events, say) is not this one's.
    while ctx
        .next_async_event()
        .map_err(err("async event"))?
        .is_some()
    {}
    let next = |want| Ok::<_, String>(wait_event(&ctx, want, env.timeout())?.map(|e| e.element));
    let mut o = Outcome::default();
    let cq = CompletionQueue::create(&ctx, 4).map_err(err("create cq"))?;
    env.set_link(false)?;
    std::thread::sleep(Duration::from_millis(20));
    let mut wcs = [WorkCompletion::EMPTY; 1];
    // Enough polls, far enough apart, for several looks.
    for _ in 0..64 {
        if cq.poll(&mut wcs).map_err(err("poll an empty queue"))? != 0 {
            return Err("a completion on a queue with no work".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let down = next(AsyncEventKind::PortErr);
    env.set_link(true)?;
    let up = next(AsyncEventKind::PortActive)?;
    let port = |e: Option<EventElement>| match e {
        Some(EventElement::Port(p)) => format!("port{p}"),
        Some(other) => format!("{other:?}"),
        None => "none".into(),
    };
    o.item("down", port(down?)).item("up", port(up));
    Ok(o)
}

/// A request reaching a queue pair still in RTR raises `COMM_EST` naming it, once: the
/// receive completes, and a second message raises nothing more.
pub fn comm_est_event<E: Env>(env: &E) -> Run<Outcome> {
    use zverbs::{AsyncEventKind, EventElement};
    let [a, b] = &two_devices(env, 16)?;
    let (ca, cb, pa, pb, acq, bcq) = (&a.ctx, &b.ctx, &a.pd, &b.pd, &a.cq, &b.cq);
    let qa = QueuePair::create(ca, pa, acq, acq, &env.qp_config(ca));
    let qb = QueuePair::create(cb, pb, bcq, bcq, &env.qp_config(cb));
    let init = InitOptions::default();
    let qa = qa.map_err(err("create qp"))?.into_init(&init);
    let qb = qb.map_err(err("create qp"))?.into_init(&init);
    let qa = qa.map_err(|e| format!("init: {}", e.error))?;
    let qb = qb.map_err(|e| format!("init: {}", e.error))?;
    let (ea, eb) = (qa.endpoint(), qb.endpoint());
    let rtr = RtrOptions::default();
    let qa = qa
        .into_rtr(&eb, &rtr)
        .map_err(|e| format!("rtr: {}", e.error))?;
    let qa = qa.into_rts(&RtsOptions::default());
    let qa = qa.map_err(|e| format!("rts: {}", e.error))?;
    // B stays in RTR: it receives, and never sends.
    let qb = qb
        .into_rtr(&ea, &rtr)
        .map_err(|e| format!("rtr: {}", e.error))?;
    while cb.next_async_event().map_err(err("async event"))?.is_some() {}
    let src = region(pa, 8, AccessFlags::empty(), 5)?;
    let dst = region(pb, 16, AccessFlags::LOCAL_WRITE, 0)?;
    let recvs = [rwr(101, &[sge(&dst, 0, 8)]), rwr(102, &[sge(&dst, 8, 8)])];
    // SAFETY: the regions are leaked and read only after the work completed.
    unsafe { qb.post_recv(&recvs) }.map_err(|e| format!("post_recv: {e}"))?;
    let mut o = Outcome::default();
    let mut events = Vec::new();
    for id in [1, 2] {
        let wr = swr(id, SendOp::Send, SendFlags::SIGNALED, &[sge(&src, 0, 8)]);
        // SAFETY: as above.
        unsafe { qa.post_send(&[wr]) }.map_err(|e| format!("post_send: {e}"))?;
        o.wcs(&format!("a{id}"), &wait(env, acq, 1)?);
        o.wcs(&format!("b{id}"), &wait(env, bcq, 1)?);
        let mut these = Vec::new();
        while let Some(ev) = cb.next_async_event().map_err(err("async event"))? {
            let names_b = ev.element == EventElement::Qp(qb.qp_num());
            let kind = match ev.kind {
                AsyncEventKind::CommEst => "COMM_EST",
                _ => "other",
            };
            these.push(format!("{kind}{}", if names_b { "(b)" } else { "" }));
        }
        events.push(if these.is_empty() {
            "-".into()
        } else {
            these.join("+")
        });
    }
    o.item("events", events.join(","));
    Ok(o)
}

/// A dmabuf registration (`ibv_reg_dmabuf_mr`): what the device's attributes say, and
/// what it does with a registration of an exported buffer: a region, named by the
/// `iova` asked for, that a peer may address.
pub fn dmabuf_registration<E: Env>(env: &E) -> Run<Outcome> {
    let ctx = Context::open(env.provider(), env.devices().1).map_err(err("open device"))?;
    let attr = ctx.query_device().map_err(err("query device"))?;
    let pd = ctx.alloc_pd().map_err(err("alloc pd"))?;
    let buf = env.dmabuf(&ctx, 8192)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut o = Outcome::default();
    o.item("dmabuf", attr.dmabuf);
    match pd.register_dmabuf(buf.as_fd(), 4096, 4096, 0x10_1000, access) {
        Ok(region) => {
            let r = region.remote();
            o.item("register", "ok")
                .check("iova", (r.addr, r.len) == (0x10_1000, 4096))
        }
        Err(e) => o.item("register", format_args!("{:?}", e.kind())),
    };
    Ok(o)
}

pub mod expected {
    #![allow(non_upper_case_globals)]
    pub const comm_est_event: &str = "a1=[1:SUCCESS Send]; b1=[101:SUCCESS Recv len=8]; \
        a2=[2:SUCCESS Send]; b2=[102:SUCCESS Recv len=8]; events=COMM_EST(b),-";
    pub const port_down_event: &str = "down=port1; up=port1";
    pub const dmabuf_registration: &str = "dmabuf=true; register=ok; iova=ok";
    pub const cq_events: &str = "armed=[]; silent=true; woken=true; events=1; \
        b=[101:SUCCESS Recv len=32]; unarmed=[102:SUCCESS Recv len=32]; \
        unarmed_silent=true; repoll=[103:SUCCESS Recv len=32]; rearmed=[]; \
        rearmed_silent=true; next_woken=true; next_events=1; \
        next=[104:SUCCESS Recv len=32]; unsolicited=[105:SUCCESS Recv len=32]; \
        unsolicited_silent=true; solicited_woken=true; solicited_events=1; \
        solicited=[106:SUCCESS Recv len=32]; bytes=ok";
}
