//! Queue pairs without channels, for tests of the verbs level: one looped back to itself,
//! or two connected with the receiver's completions reported on a completion channel.

use crate::cq::CompletionQueue;
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::event::CompletionChannel;
use crate::provider::sim::{Sim, SimError};
use crate::qp::RtsOptions;
use crate::qp::{Endpoint, Init, InitOptions, QpConfig, QueuePair, ReadyToSend, RtrOptions};
use crate::types::QpCaps;

/// One queue pair at RTS connected to itself (its own endpoint as the peer's), on device
/// `sim0` of a new fabric, with one completion queue for both its queues: what raw
/// queue-pair tests post on. Fields drop in order: the queue pair before its queue, its
/// protection domain and its device.
pub struct Loopback {
    /// The queue pair.
    pub qp: QueuePair<Sim, ReadyToSend>,
    /// Its send and receive completion queue.
    pub cq: CompletionQueue<Sim>,
    /// Its protection domain.
    pub pd: ProtectionDomain<Sim>,
    /// The device.
    pub ctx: Context<Sim>,
}

impl Loopback {
    /// A loopback queue pair with `caps` on a completion queue of `cq_depth` entries.
    pub fn new(caps: QpCaps, cq_depth: u32) -> Result<Self, Error<SimError>> {
        let ctx = Context::open(&Sim::with_devices(1), "sim0")?;
        let pd = ctx.alloc_pd()?;
        let cq = CompletionQueue::create(&ctx, cq_depth)?;
        let cfg = QpConfig {
            caps,
            ..QpConfig::default()
        };
        let qp = init(&ctx, &pd, &cq, &cfg)?;
        let me = qp.endpoint();
        let qp = to_rts(qp, &me)?;
        Ok(Loopback { qp, cq, pd, ctx })
    }
}

/// Two queue pairs at RTS connected to each other, `a` on device `sim0` and `b` on
/// `sim1` of one fabric, each with one completion queue for both its queues; `b`'s
/// reports to the completion channel `ch`, as a receiver that sleeps on events has it.
/// Fields drop in order: queue pairs before their queues, the channel, domains, devices.
pub struct EventedPair {
    /// The sender's queue pair.
    pub a: QueuePair<Sim, ReadyToSend>,
    /// The receiver's queue pair.
    pub b: QueuePair<Sim, ReadyToSend>,
    /// `a`'s completion queue.
    pub a_cq: CompletionQueue<Sim>,
    /// `b`'s completion queue, on `ch`.
    pub b_cq: CompletionQueue<Sim>,
    /// The completion channel `b_cq` reports to.
    pub ch: CompletionChannel<Sim>,
    /// The protection domains of `a` and `b`.
    pub pd: [ProtectionDomain<Sim>; 2],
    /// The devices of `a` and `b`.
    pub ctx: [Context<Sim>; 2],
}

impl EventedPair {
    /// The pair on devices `sim0` and `sim1` of `sim`, with completion queues of
    /// `cq_depth` entries.
    pub fn connected_on(sim: &Sim, cq_depth: u32) -> Result<Self, Error<SimError>> {
        let ctx = [Context::open(sim, "sim0")?, Context::open(sim, "sim1")?];
        let pd = [ctx[0].alloc_pd()?, ctx[1].alloc_pd()?];
        let ch = CompletionChannel::create(&ctx[1])?;
        let a_cq = CompletionQueue::create(&ctx[0], cq_depth)?;
        let b_cq = CompletionQueue::create_on(&ctx[1], cq_depth, &ch)?;
        let cfg = QpConfig::default();
        let a = init(&ctx[0], &pd[0], &a_cq, &cfg)?;
        let b = init(&ctx[1], &pd[1], &b_cq, &cfg)?;
        let (ea, eb) = (a.endpoint(), b.endpoint());
        Ok(EventedPair {
            a: to_rts(a, &eb)?,
            b: to_rts(b, &ea)?,
            a_cq,
            b_cq,
            ch,
            pd,
            ctx,
        })
    }
}

/// An RC queue pair at INIT on `cq` for both its queues.
fn init(
    ctx: &Context<Sim>,
    pd: &ProtectionDomain<Sim>,
    cq: &CompletionQueue<Sim>,
    cfg: &QpConfig,
) -> Result<QueuePair<Sim, Init>, Error<SimError>> {
    QueuePair::create(ctx, pd, cq, cq, cfg)?
        .into_init(&InitOptions::default())
        .map_err(|e| e.error)
}

/// `qp` connected to `peer` and at RTS, with default options.
fn to_rts(
    qp: QueuePair<Sim, Init>,
    peer: &Endpoint,
) -> Result<QueuePair<Sim, ReadyToSend>, Error<SimError>> {
    qp.into_rtr(peer, &RtrOptions::default())
        .map_err(|e| e.error)?
        .into_rts(&RtsOptions::default())
        .map_err(|e| e.error)
}
