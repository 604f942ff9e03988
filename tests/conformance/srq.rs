//! Shared receive queues: queue pairs on one SRQ consume its receives in post order, an
//! empty SRQ answers every sender with RNR NAKs, the limit event fires once per arm, and a
//! queue pair moved to ERR leaves the SRQ's receives alone and is followed by
//! `QP_LAST_WQE_REACHED`.

use super::*;
use zverbs::qp::{Rc, RcOnSrq};
use zverbs::{AsyncEventKind, EventElement, SharedReceiveQueue, SrqAttr};

/// `n` RC queue pairs on A's device, each connected to one of `n` queue pairs on B's
/// device that share one SRQ and one receive CQ. Fields drop in order: queue pairs, then
/// CQs and the SRQ, then PDs and contexts.
pub struct Hub<P: Provider> {
    pub a: Vec<QueuePair<P, ReadyToSend, Rc>>,
    pub b: Vec<QueuePair<P, ReadyToSend, RcOnSrq>>,
    pub srq: SharedReceiveQueue<P>,
    /// A's device (its queue is the senders') and B's (the receive side's queue).
    ends: [Device<P>; 2],
}

/// A hub of `n` pairs whose senders retry RNR `rnr_retry` times, on an SRQ of `max_wr`
/// receives armed at `limit`.
pub fn hub<E: Env>(env: &E, n: usize, rnr_retry: u8, max_wr: u32, limit: u32) -> Run<Hub<E::P>> {
    let ends = two_devices(env, 64)?;
    let [a_, b_] = &ends;
    let attr = SrqAttr {
        max_wr,
        max_sge: 1,
        srq_limit: limit,
    };
    let srq = SharedReceiveQueue::create(&b_.ctx, &b_.pd, &attr).map_err(err("create srq"))?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let rtr = RtrOptions {
        min_rnr_timer: 1,
        ..RtrOptions::default()
    };
    let rts = RtsOptions {
        rnr_retry,
        ..RtsOptions::default()
    };
    let init = InitOptions::default();
    for _ in 0..n {
        let qa = QueuePair::create(&a_.ctx, &a_.pd, &a_.cq, &a_.cq, &env.qp_config(&a_.ctx));
        let qa = qa.map_err(err("create qp"))?;
        let cfg = env.qp_config(&b_.ctx);
        let qb = QueuePair::create_on_srq(&b_.ctx, &b_.pd, &b_.cq, &b_.cq, &srq, &cfg);
        let qb = qb.map_err(err("create qp on srq"))?;
        let qa = qa
            .into_init(&init)
            .map_err(|e| format!("init: {}", e.error))?;
        let qb = qb
            .into_init(&init)
            .map_err(|e| format!("init: {}", e.error))?;
        let (ea, eb) = (qa.endpoint(), qb.endpoint());
        let qa = qa
            .into_rtr(&eb, &rtr)
            .map_err(|e| format!("rtr: {}", e.error))?;
        let qb = qb
            .into_rtr(&ea, &rtr)
            .map_err(|e| format!("rtr: {}", e.error))?;
        a.push(qa.into_rts(&rts).map_err(|e| format!("rts: {}", e.error))?);
        b.push(qb.into_rts(&rts).map_err(|e| format!("rts: {}", e.error))?);
    }
    // What came before (a port event at the device's start, say) is not the scenario's.
    let cb = &b_.ctx;
    while cb.next_async_event().map_err(err("async event"))?.is_some() {}
    Ok(Hub { a, b, srq, ends })
}

impl<P: Provider> Hub<P> {
    /// Posts receives `ids` to the SRQ, each of `len` bytes at `len * k` of `mr`.
    fn post(&self, mr: &MemoryRegion<'static, P>, len: usize, ids: &[u64]) -> Run<()> {
        let wrs: Vec<_> = ids
            .iter()
            .map(|&id| rwr(id, &[sge(mr, (id % 100) as usize * len, len)]))
            .collect();
        // SAFETY: the region is leaked and read only after the receives completed.
        unsafe { self.srq.post_recv(&wrs) }.map_err(|e| format!("post_srq_recv: {e}"))
    }

    /// Sends `len` bytes of `mr` at `off` from A's queue pair `i` (signaled, id `id`) and
    /// waits for its completion.
    fn send<E: Env<P = P>>(
        &self,
        env: &E,
        i: usize,
        id: u64,
        mr: &MemoryRegion<'static, P>,
        off: usize,
        len: usize,
    ) -> Run<WorkCompletion> {
        let wr = swr(id, SendOp::Send, SendFlags::SIGNALED, &[sge(mr, off, len)]);
        // SAFETY: the region is leaked and not written while the send is in flight.
        unsafe { self.a[i].post_send(&[wr]) }.map_err(|e| format!("post_send: {e}"))?;
        let wc = wait(env, &self.ends[0].cq, 1)?;
        wc.first()
            .copied()
            .ok_or_else(|| format!("send {id}: no completion"))
    }

    /// Which of B's queue pairs `wc` names.
    fn consumer(&self, wc: &WorkCompletion) -> String {
        let i = self.b.iter().position(|q| q.qp_num() == wc.qp_num);
        i.map_or("?".into(), |i| i.to_string())
    }

    /// B's asynchronous events queued now, by kind.
    fn events(&self) -> Run<Vec<(AsyncEventKind, EventElement)>> {
        let mut out = Vec::new();
        while let Some(ev) = self.ends[1]
            .ctx
            .next_async_event()
            .map_err(err("async event"))?
        {
            out.push((ev.kind, ev.element));
        }
        Ok(out)
    }
}

fn kinds(evs: &[(AsyncEventKind, EventElement)]) -> String {
    if evs.is_empty() {
        return "-".into();
    }
    let names: Vec<_> = evs.iter().map(|e| format!("{:?}", e.0)).collect();
    names.join("+")
}

/// Three senders, one SRQ of three receives: the receives are consumed in post order by
/// whichever queue pair's message arrives, and each completion names that queue pair.
pub fn srq_shared_order<E: Env>(env: &E) -> Run<Outcome> {
    const LEN: usize = 16;
    let h = hub(env, 3, 7, 16, 0)?;
    let dst = region(&h.ends[1].pd, 3 * LEN, AccessFlags::LOCAL_WRITE, 0)?;
    // Sender i's message: LEN bytes of i + 1.
    let srcs = (0..3u8)
        .map(|i| region(&h.ends[0].pd, LEN, AccessFlags::empty(), i + 1))
        .collect::<Run<Vec<_>>>()?;
    h.post(&dst, LEN, &[100, 101, 102])?;
    let mut o = Outcome::default();
    let mut consumers = Vec::new();
    for (k, i) in [2usize, 0, 1].into_iter().enumerate() {
        h.send(env, i, k as u64 + 1, &srcs[i], 0, LEN)?;
        let wc = wait(env, &h.ends[1].cq, 1)?;
        consumers.extend(wc.iter().map(|w| h.consumer(w)));
        o.wcs(&format!("b{k}"), &wc);
    }
    let d = dst.as_slice();
    let bytes = [3u8, 1, 2]
        .iter()
        .enumerate()
        .all(|(k, &fill)| d[k * LEN..][..LEN] == [fill; LEN]);
    o.item("consumers", consumers.join(","))
        .check("bytes", bytes);
    Ok(o)
}

/// An empty SRQ answers every attached queue pair's sender with RNR NAKs (retry count 0:
/// the send fails); a receive posted then serves the next sender.
pub fn srq_rnr_when_empty<E: Env>(env: &E) -> Run<Outcome> {
    let h = hub(env, 3, 0, 16, 0)?;
    let dst = region(&h.ends[1].pd, 8, AccessFlags::LOCAL_WRITE, 0)?;
    let src = region(&h.ends[0].pd, 8, AccessFlags::empty(), 7)?;
    let mut o = Outcome::default();
    for i in 0..2 {
        let wc = h.send(env, i, i as u64 + 1, &src, 0, 8)?;
        o.wcs(&format!("a{i}"), &[wc]);
    }
    h.post(&dst, 8, &[100])?;
    let wc = h.send(env, 2, 3, &src, 0, 8)?;
    o.wcs("a2", &[wc]);
    let bw = wait(env, &h.ends[1].cq, 1)?;
    o.wcs("b", &bw)
        .item("consumer", bw.first().map_or("-".into(), |w| h.consumer(w)))
        .check("bytes", dst.as_slice() == [7; 8]);
    Ok(o)
}

/// The limit event fires once when a receive taken leaves fewer than the limit, naming
/// the SRQ, and disarms it; armed again, it fires again.
pub fn srq_limit_once<E: Env>(env: &E) -> Run<Outcome> {
    let h = hub(env, 1, 7, 8, 2)?;
    let dst = region(&h.ends[1].pd, 8 * 8, AccessFlags::LOCAL_WRITE, 0)?;
    let src = region(&h.ends[0].pd, 8, AccessFlags::empty(), 1)?;
    let mut o = Outcome::default();
    let armed = h.srq.query().map_err(err("query srq"))?.srq_limit;
    o.item("armed", armed);
    h.post(&dst, 8, &[100, 101, 102, 103])?;
    let mut seen = Vec::new();
    let mut named = true;
    let mut take = |h: &Hub<E::P>, id: u64| -> Run<()> {
        h.send(env, 0, id, &src, 0, 8)?;
        wait(env, &h.ends[1].cq, 1)?;
        let evs = h.events()?;
        named &= evs.iter().all(|e| e.1 == EventElement::Srq(h.srq.key()));
        seen.push(kinds(&evs));
        Ok(())
    };
    for id in 1..=4 {
        take(&h, id)?;
    }
    let after = h.srq.query().map_err(err("query srq"))?.srq_limit;
    h.post(&dst, 8, &[104, 105])?;
    h.srq.arm_limit(1).map_err(err("arm"))?;
    for id in 5..=6 {
        take(&h, id)?;
    }
    o.item("events", seen.join(","))
        .check("names_the_srq", named)
        .item("limit_after", after);
    Ok(o)
}

/// A queue pair on the SRQ moved to ERR flushes none of the SRQ's receives, and
/// `QP_LAST_WQE_REACHED` names it; another queue pair still takes the first receive.
pub fn srq_last_wqe<E: Env>(env: &E) -> Run<Outcome> {
    let h = hub(env, 2, 7, 16, 0)?;
    let dst = region(&h.ends[1].pd, 3 * 8, AccessFlags::LOCAL_WRITE, 0)?;
    let src = region(&h.ends[0].pd, 8, AccessFlags::empty(), 3)?;
    h.post(&dst, 8, &[100, 101, 102])?;
    h.b[0].set_error().map_err(err("set_error"))?;
    // A device raises it at once or never (rxe of Linux 6.1: never).
    let within = env.timeout().min(Duration::from_secs(2));
    let event = wait_event(&h.ends[1].ctx, AsyncEventKind::QpLastWqeReached, within)?;
    let mut o = Outcome::default();
    match event {
        Some(ev) => o.item("event", "QP_LAST_WQE_REACHED").check(
            "names_the_qp",
            ev.element == EventElement::Qp(h.b[0].qp_num()),
        ),
        None => o.item("event", "none"),
    };
    o.wcs("b.flushed", &settle(env, &h.ends[1].cq)?);
    h.send(env, 1, 1, &src, 0, 8)?;
    let bw = wait(env, &h.ends[1].cq, 1)?;
    o.wcs("b", &bw)
        .item("consumer", bw.first().map_or("-".into(), |w| h.consumer(w)));
    Ok(o)
}

/// Posting to an SRQ: a receive with more entries than its `max_sge` is refused, and so
/// is one more receive than the size it was granted; what was refused is named by index.
pub fn srq_post_errors<E: Env>(env: &E) -> Run<Outcome> {
    let h = hub(env, 1, 7, 4, 0)?;
    let dst = region(&h.ends[1].pd, 64, AccessFlags::LOCAL_WRITE, 0)?;
    let granted = h.srq.query().map_err(err("query srq"))?;
    let mut o = Outcome::default();
    o.check(
        "granted_at_least_asked",
        granted.max_wr >= 4 && granted.max_sge >= 1,
    );
    let kind = |r: Result<(), zverbs::provider::PostError<<E::P as Provider>::Error>>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("{}@{:?}", e.index, zverbs::ProviderError::kind(&e.error)),
    };
    // More entries than max_sge: the SRQ was made with one (a device may grant more).
    let sges: Vec<_> = (0..=granted.max_sge as usize)
        .map(|i| sge(&dst, i, 1))
        .collect();
    if sges.len() <= SGES {
        // SAFETY: the region is leaked; a refused receive is not posted.
        let r = unsafe { h.srq.post_recv(&[rwr(1, &sges)]) };
        o.item("too_many_sges", kind(r));
    }
    // One more receive than the granted size: the last is refused.
    let n = granted.max_wr as usize + 1;
    let wrs: Vec<_> = (0..n)
        .map(|i| rwr(100 + i as u64, &[sge(&dst, 0, 8)]))
        .collect();
    // SAFETY: as above; the posted receives land in the leaked region, read by no one.
    let r = unsafe { h.srq.post_recv(&wrs) };
    let full = match r {
        Err(e) if e.index == n - 1 => format!("last@{:?}", zverbs::ProviderError::kind(&e.error)),
        other => kind(other),
    };
    o.item("one_too_many", full);
    Ok(o)
}

pub mod expected {
    #![allow(non_upper_case_globals)]
    pub const srq_shared_order: &str = "b0=[100:SUCCESS Recv len=16]; \
         b1=[101:SUCCESS Recv len=16]; b2=[102:SUCCESS Recv len=16]; consumers=2,0,1; bytes=ok";
    pub const srq_rnr_when_empty: &str = "a0=[1:RNR_RETRY_EXC_ERR]; a1=[2:RNR_RETRY_EXC_ERR]; \
         a2=[3:SUCCESS Send]; b=[100:SUCCESS Recv len=8]; consumer=2; bytes=ok";
    pub const srq_limit_once: &str = "armed=2; events=-,-,SrqLimitReached,-,-,SrqLimitReached; \
         names_the_srq=ok; limit_after=0";
    pub const srq_post_errors: &str =
        "granted_at_least_asked=ok; too_many_sges=0@InvalidArgument; one_too_many=last@QueueFull";
    pub const srq_last_wqe: &str = "event=QP_LAST_WQE_REACHED; names_the_qp=ok; b.flushed=[]; \
         b=[100:SUCCESS Recv len=8]; consumer=1";
}
