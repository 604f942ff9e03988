//! The passive peer of a sender's measurement: receives kept posted, reaped in batches.

use crate::cq::CompletionQueue;
use crate::device::{Context, ProtectionDomain};
use crate::error::{CompletionError, Error};
use crate::mr::MemoryRegion;
use crate::provider::sim::{Sim, SimError};
use crate::provider::Provider;
use crate::qp::{Endpoint, Init, InitOptions, QpConfig, QueuePair, ReadyToReceive, RtrOptions};
use crate::types::{AccessFlags, RecvWr, WcOpcode, WcStatus, WorkCompletion};
use crate::RemoteRegion;

/// Receives a [`Sink`] reaps and reposts at a time (one chain).
pub const REFILL: usize = 256;
/// Receives a [`Sink`] keeps posted.
pub const SINK_DEPTH: usize = 2 * REFILL;

/// A raw queue pair at RTR on a device of its own that keeps [`SINK_DEPTH`] receives of
/// `msg` bytes posted into a remotely writable region, and reaps and reposts [`REFILL`]
/// of them after every [`REFILL`] sends ([`after_send`](Sink::after_send)). The same sink
/// serves every sender a benchmark compares, so its cost cancels out of their difference.
/// The region is leaked: the device alone reads and writes it. Fields drop in order: the
/// queue pair before its queue, region, domain and device.
pub struct Sink {
    qp: QueuePair<Sim, ReadyToReceive>,
    cq: CompletionQueue<Sim>,
    region: MemoryRegion<'static, Sim>,
    wrs: [RecvWr<1>; REFILL],
    since: usize,
    _pd: ProtectionDomain<Sim>,
    _ctx: Context<Sim>,
}

/// A [`Sink`] before it knows its peer: its queue pair at INIT.
pub struct PreparedSink {
    qp: QueuePair<Sim, Init>,
    cq: CompletionQueue<Sim>,
    region: MemoryRegion<'static, Sim>,
    pd: ProtectionDomain<Sim>,
    ctx: Context<Sim>,
}

impl PreparedSink {
    /// A sink on `device` of `sim` whose receives take `msg` bytes, with a region of
    /// `region_len` bytes (at least `msg`) that peers may write.
    pub fn open(
        sim: &Sim,
        device: &str,
        msg: usize,
        region_len: usize,
    ) -> Result<Self, Error<SimError>> {
        let ctx = Context::open(sim, device)?;
        let pd = ctx.alloc_pd()?;
        let cq = CompletionQueue::create(&ctx, 2 * SINK_DEPTH as u32)?;
        let mut cfg = QpConfig::default();
        cfg.caps.max_recv_wr = SINK_DEPTH as u32;
        let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &cfg)?
            .into_init(&InitOptions::default())
            .map_err(|e| e.error)?;
        let buf = std::vec![0u8; region_len.max(msg)].leak();
        // SAFETY: the buffer is leaked (it lives for ever) and never touched through Rust
        // references again: only the device reads and writes it.
        let region = unsafe { pd.register_with_access(buf, AccessFlags::all()) }?;
        Ok(PreparedSink {
            qp,
            cq,
            region,
            pd,
            ctx,
        })
    }

    /// Its queue pair's endpoint, for the sender.
    pub fn endpoint(&self) -> Endpoint {
        self.qp.endpoint()
    }

    /// Connected to `peer` (to RTR), with its receives posted.
    pub fn connect(self, peer: &Endpoint, msg: usize) -> Result<Sink, Error<SimError>> {
        let qp = self
            .qp
            .into_rtr(peer, &RtrOptions::default())
            .map_err(|e| e.error)?;
        let mut wr = RecvWr::<1>::new(0);
        wr.sg_list[0] = self.region.slice(..msg)?.sge();
        wr.num_sge = 1;
        let sink = Sink {
            qp,
            cq: self.cq,
            region: self.region,
            wrs: [wr; REFILL],
            since: 0,
            _pd: self.pd,
            _ctx: self.ctx,
        };
        for _ in 0..SINK_DEPTH / REFILL {
            sink.post()?;
        }
        Ok(sink)
    }
}

impl Sink {
    /// Its region, for writes.
    pub fn remote(&self) -> RemoteRegion {
        self.region.remote()
    }

    /// Counts a send; every [`REFILL`] of them, reaps their receives and posts as many.
    ///
    /// # Errors
    /// A receive that did not succeed (the sender sent more than `msg` bytes, say).
    #[inline]
    pub fn after_send(&mut self) -> Result<(), Error<SimError>> {
        self.since += 1;
        if self.since == REFILL {
            return self.refill();
        }
        Ok(())
    }

    #[inline(never)]
    fn refill(&mut self) -> Result<(), Error<SimError>> {
        self.since = 0;
        let mut wcs = [WorkCompletion::EMPTY; 32];
        let mut got = 0;
        while got < REFILL {
            let n = Sim::poll_cq(self.cq.raw(), &mut wcs).map_err(|source| Error::Provider {
                op: "poll_cq",
                source,
            })?;
            if let Some(wc) = wcs[..n].iter().find(|w| w.status != WcStatus::Success) {
                return Err(Error::Completion(CompletionError {
                    status: wc.status,
                    wr_id: wc.wr_id,
                    opcode: WcOpcode::Recv,
                    qp_num: wc.qp_num,
                    peer_qp_num: None,
                }));
            }
            got += n;
        }
        self.post()
    }

    fn post(&self) -> Result<(), Error<SimError>> {
        // SAFETY: every receive scatters into the leaked region, which is never read
        // through Rust references.
        unsafe { self.qp.post_recv(&self.wrs) }.map_err(|e| Error::Provider {
            op: "post_recv",
            source: e.error,
        })
    }
}
