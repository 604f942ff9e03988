//! The simulator backend: [`Provider`] over the `zverbs-sim` crate (feature `sim`).
//!
//! This adapter is the mirror of the verbs one: it maps each verb onto the simulated HCA.
//! The simulator speaks zverbs's own data types (`zverbs-types`): work requests are read
//! where they lie in the caller's slice, with no conversion. The simulated [`Fabric`] is
//! reachable through [`Sim::fabric`] for simulator-only controls: simulated time, faults,
//! the trace.
//!
//! ```
//! use zverbs::provider::{sim::Sim, Provider};
//! let sim = Sim::with_devices(2);
//! let mut names = Vec::new();
//! sim.for_each_device(&mut |n| names.push(n.to_string()));
//! assert_eq!(names, ["sim0", "sim1"]);
//! ```
//!
//! [`Sim::with_devices`] is the untimed simulator: work completes inside the call that
//! makes it possible. For simulated time, link latency, faults and a trace, build the
//! fabric from a [`FabricConfig`]. In [`Mode::Stepped`] time moves only when the fabric is
//! stepped, or when a poll finds nothing ([`FabricConfig::auto_step`]), so blocking calls
//! still make progress on one thread:
//!
//! ```
//! use zverbs::provider::sim::{FabricConfig, Faults, Sim};
//! use zverbs::{Channel, ChannelConfig, Context};
//!
//! let cfg = FabricConfig {
//!     faults: Faults { drop: 0.2, ..Faults::none() }, // RC retransmits hide the losses
//!     trace: true,
//!     ..FabricConfig::stepped(42)
//! };
//! let sim = Sim::with_config(cfg, 2);
//! let (ca, cb) = (Context::open(&sim, "sim0")?, Context::open(&sim, "sim1")?);
//! let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
//! let a = Channel::<Sim>::prepare(&ca, &pa, &ChannelConfig::default())?;
//! let b = Channel::<Sim>::prepare(&cb, &pb, &ChannelConfig::default())?;
//! let (ea, eb) = (a.endpoint(), b.endpoint());
//! let (mut a, b) = (a.connect(&eb)?, b.connect(&ea)?);
//! let mut target = [0u8; 8];
//! // SAFETY: `target` is read only after the write completed.
//! let target = unsafe {
//!     pb.register_with_access(&mut target, zverbs::AccessFlags::all())?
//! };
//! let mut msg = *b"8 bytes!";
//! let msg = pa.register(&mut msg)?;
//! a.write([msg.slice(..)?], &target.remote())?; // steps the fabric until acknowledged
//! assert_eq!(target.as_slice(), b"8 bytes!");
//! assert!(sim.fabric().now() >= std::time::Duration::from_micros(2)); // one round trip
//! # drop(b);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use zverbs_sim as s;

pub use zverbs_sim::{
    ack_timeout_ns, rnr_timer_ns, DropReason, Fabric, FabricConfig, Faults, LinkModel, Mode,
    PacketKind, QpCounters, SimError, TraceEvent, TraceKind,
};

use std::net::{IpAddr, SocketAddr};

use super::cm::{CmEvent, CmPath, ConnParam, ConnectionManager, PortSpace};
use super::AhAttr;
use super::{PathAttr, PostError, Provider, Transition};
use crate::error::{ErrorKind, ProviderError};
use crate::types::{
    AccessFlags, AhKey, AsyncEvent, Gid, PortAttr, QpCaps, QpState, QpType, RecvWr, SendWr,
    SrqAttr, WorkCompletion,
};

/// The simulator provider: a handle to one simulated fabric.
#[derive(Clone, Default)]
pub struct Sim {
    fabric: s::Fabric,
}

impl From<Fabric> for Sim {
    fn from(fabric: Fabric) -> Sim {
        Sim::new(fabric)
    }
}

impl Sim {
    /// A provider over an existing fabric.
    pub fn new(fabric: s::Fabric) -> Sim {
        Sim { fabric }
    }

    /// A provider over a new untimed fabric ([`Fabric::with_devices`]) with devices
    /// `sim0` .. `sim{n-1}`.
    pub fn with_devices(n: usize) -> Sim {
        Sim::new(s::Fabric::with_devices(n))
    }

    /// A provider over a new fabric configured by `cfg` ([`Fabric::with_config`]) with
    /// devices `sim0` .. `sim{n-1}`.
    ///
    /// ```
    /// use zverbs::provider::sim::{FabricConfig, Mode, Sim};
    /// let sim = Sim::with_config(FabricConfig::stepped(7), 3);
    /// assert_eq!(sim.fabric().config().mode, Mode::Stepped);
    /// assert_eq!(sim.fabric().device_index("sim2"), Some(2));
    /// ```
    pub fn with_config(cfg: FabricConfig, n: usize) -> Sim {
        Sim::new(s::Fabric::with_config(cfg, n))
    }

    /// The simulated fabric, for simulator-only controls.
    pub fn fabric(&self) -> &s::Fabric {
        &self.fabric
    }
}

impl ProviderError for s::SimError {
    fn kind(&self) -> ErrorKind {
        match self {
            s::SimError::Invalid(_) => ErrorKind::InvalidArgument,
            s::SimError::QueueFull => ErrorKind::QueueFull,
            s::SimError::NotFound => ErrorKind::NotFound,
            s::SimError::Busy => ErrorKind::Busy,
            s::SimError::CqOverflow => ErrorKind::CqOverflow,
            s::SimError::DeviceFatal => ErrorKind::DeviceFatal,
            s::SimError::Unsupported => ErrorKind::Unsupported,
            _ => ErrorKind::Other,
        }
    }
}

impl Provider for Sim {
    type Error = s::SimError;
    type Context = s::Context;
    type Pd = s::Pd;
    type Mr = s::Mr;
    type Cq = s::Cq;
    type Qp = s::Qp;
    type CompChannel = s::CompChannel;
    type Ah = s::Ah;
    type Srq = s::Srq;
    type Wc = WorkCompletion;

    fn for_each_device(&self, f: &mut dyn FnMut(&str)) {
        self.fabric.for_each_device(f)
    }

    fn open_device(&self, name: &str) -> Result<s::Context, s::SimError> {
        self.fabric.open_device(name)
    }

    fn query_device(ctx: &s::Context) -> Result<crate::types::DeviceAttr, s::SimError> {
        Ok(ctx.query_device())
    }

    fn query_port(ctx: &s::Context, port: u8) -> Result<PortAttr, s::SimError> {
        ctx.query_port(port)
    }

    fn query_gid(ctx: &s::Context, port: u8, index: u8) -> Result<Gid, s::SimError> {
        ctx.query_gid(port, index)
    }

    fn alloc_pd(ctx: &s::Context) -> Result<s::Pd, s::SimError> {
        ctx.alloc_pd()
    }

    unsafe fn register_mr(
        pd: &s::Pd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<s::Mr, s::SimError> {
        // SAFETY: the caller upholds `Provider::register_mr`'s contract, which is the
        // simulator's contract word for word.
        unsafe { pd.register_mr(addr, len, access) }
    }

    fn register_dmabuf_mr(
        pd: &s::Pd,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<s::Mr, s::SimError> {
        pd.register_dmabuf_mr(offset, len, iova, fd, access)
    }

    fn mr_keys(mr: &s::Mr) -> (u32, u32) {
        (mr.lkey(), mr.rkey())
    }

    fn create_cq(
        ctx: &s::Context,
        depth: u32,
        channel: Option<&s::CompChannel>,
    ) -> Result<s::Cq, s::SimError> {
        match channel {
            Some(ch) => ctx.create_cq_on(depth, ch),
            None => ctx.create_cq(depth),
        }
    }

    fn poll_cq(cq: &s::Cq, out: &mut [WorkCompletion]) -> Result<usize, s::SimError> {
        cq.poll(out)
    }

    #[inline(always)]
    fn poll_cq_one<'a>(
        cq: &s::Cq,
        out: &'a mut core::mem::MaybeUninit<WorkCompletion>,
    ) -> Result<Option<&'a WorkCompletion>, s::SimError> {
        let wc = out.write(WorkCompletion::EMPTY);
        Ok(match cq.poll(core::slice::from_mut(wc))? {
            0 => None,
            _ => Some(wc),
        })
    }

    #[inline(always)]
    fn poll_cq_into(cq: &s::Cq, out: &mut WorkCompletion) -> Result<bool, s::SimError> {
        Ok(cq.poll(core::slice::from_mut(out))? == 1)
    }

    fn create_comp_channel(ctx: &s::Context) -> Result<s::CompChannel, s::SimError> {
        ctx.create_comp_channel()
    }

    fn comp_channel_fd(ch: &s::CompChannel) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(ch)
    }

    #[cfg(unix)]
    fn async_event_fd(ctx: &s::Context) -> std::os::fd::RawFd {
        // A descriptor that cannot be made reads as -1, which `poll(2)` skips.
        ctx.async_fd().unwrap_or(-1)
    }

    fn get_async_event(ctx: &s::Context) -> Result<Option<AsyncEvent>, s::SimError> {
        ctx.get_async_event()
    }

    fn cq_key(cq: &s::Cq) -> u64 {
        cq.key()
    }

    fn req_notify_cq(cq: &s::Cq, solicited_only: bool) -> Result<(), s::SimError> {
        cq.req_notify(solicited_only)
    }

    fn get_cq_event(ch: &s::CompChannel) -> Result<Option<u64>, s::SimError> {
        Ok(ch.get_event())
    }

    fn ack_cq_events(cq: &s::Cq, n: u32) {
        cq.ack_events(n)
    }

    fn create_qp(
        pd: &s::Pd,
        send_cq: &s::Cq,
        recv_cq: &s::Cq,
        srq: Option<&s::Srq>,
        caps: &QpCaps,
        ty: QpType,
    ) -> Result<s::Qp, s::SimError> {
        let attr = s::QpInitAttr {
            send_cq,
            recv_cq,
            cap: *caps,
            sq_sig_all: false,
        };
        match (ty, srq) {
            (QpType::Rc, None) => pd.create_qp(&attr),
            (QpType::Rc, Some(srq)) => pd.create_srq_qp(&attr, srq),
            (QpType::Ud, None) => pd.create_ud_qp(&attr),
            (QpType::Ud, Some(_)) => Err(s::SimError::Invalid("an SRQ serves RC queue pairs")),
        }
    }

    fn create_srq(pd: &s::Pd, max_wr: u32, max_sge: u32) -> Result<s::Srq, s::SimError> {
        pd.create_srq(&SrqAttr {
            max_wr,
            max_sge,
            srq_limit: 0,
        })
    }

    fn arm_srq(srq: &s::Srq, limit: u32) -> Result<(), s::SimError> {
        srq.arm(limit)
    }

    fn query_srq(srq: &s::Srq) -> Result<SrqAttr, s::SimError> {
        Ok(srq.query())
    }

    fn srq_key(srq: &s::Srq) -> u64 {
        srq.key()
    }

    unsafe fn post_srq_recv<const SGES: usize>(
        srq: &s::Srq,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<s::SimError>> {
        srq.post_recv(wrs)
    }

    fn create_ah(pd: &s::Pd, attr: &AhAttr) -> Result<s::Ah, s::SimError> {
        pd.create_ah(attr)
    }

    fn ah_key(ah: &s::Ah) -> AhKey {
        ah.key()
    }

    fn qp_num(qp: &s::Qp) -> u32 {
        qp.qp_num()
    }

    fn modify_qp(qp: &s::Qp, t: &Transition) -> Result<(), s::SimError> {
        qp.modify(t)
    }

    fn query_qp_state(qp: &s::Qp) -> Result<QpState, s::SimError> {
        Ok(qp.state())
    }

    fn query_path(qp: &s::Qp) -> Result<PathAttr, s::SimError> {
        let q = qp.query();
        // RESET forgets the RTR attributes, so only a queue pair past RTR has them.
        let r = q.rtr.ok_or(s::SimError::Invalid(
            "the queue pair has no path before RTR",
        ))?;
        let rts = q.rts;
        Ok(PathAttr {
            path_mtu: r.path_mtu,
            dest_qp_num: r.dest_qp_num,
            sq_psn: q.sq_psn,
            rq_psn: q.rq_psn,
            dlid: r.dlid,
            dgid: r.dgid,
            sgid_index: r.sgid_index,
            sl: r.sl,
            traffic_class: r.traffic_class,
            flow_label: r.flow_label,
            hop_limit: r.hop_limit,
            min_rnr_timer: r.min_rnr_timer,
            timeout: rts.map_or(0, |a| a.timeout),
            retry_cnt: rts.map_or(0, |a| a.retry_cnt),
            rnr_retry: rts.map_or(0, |a| a.rnr_retry),
        })
    }

    unsafe fn post_send<const SGES: usize>(
        qp: &s::Qp,
        wrs: &[SendWr<SGES>],
    ) -> Result<(), PostError<s::SimError>> {
        // SAFETY: the caller upholds `Provider::post_send`, which includes that inline
        // gather entries are readable for the duration of this call.
        unsafe { qp.post_send_raw(wrs) }
    }

    type SendEntry<const SGES: usize> = SendWr<SGES>;

    unsafe fn post_send_entries<const SGES: usize>(
        qp: &s::Qp,
        entries: &mut [SendWr<SGES>],
    ) -> Result<(), PostError<s::SimError>> {
        // SAFETY: the simulator's entries are `SendWr`s, which `post_send` takes; the caller
        // upholds its contract on the memory they name.
        unsafe { Self::post_send(qp, entries) }
    }

    unsafe fn post_recv<const SGES: usize>(
        qp: &s::Qp,
        wrs: &[RecvWr<SGES>],
    ) -> Result<(), PostError<s::SimError>> {
        qp.post_recv(wrs)
    }
}

impl ConnectionManager for Sim {
    type CmChannel = s::cm::CmChannel;
    type CmId = s::cm::CmId;

    fn create_cm_channel(&self) -> Result<Self::CmChannel, SimError> {
        self.fabric.create_cm_channel()
    }
    fn cm_channel_fd(ch: &Self::CmChannel) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(ch)
    }
    fn get_cm_event(ch: &Self::CmChannel) -> Result<Option<CmEvent<Self>>, SimError> {
        Ok(ch.get_event().map(|e| CmEvent {
            kind: e.kind,
            id: e.id,
            status: e.status,
            private_data: e.private_data,
            request: e.request,
            ud: e.ud,
        }))
    }
    fn create_cm_id(ch: &Self::CmChannel, ps: PortSpace) -> Result<Self::CmId, SimError> {
        ch.create_id(ps)
    }
    fn cm_id_key(id: &Self::CmId) -> u64 {
        id.key()
    }
    fn cm_migrate(id: &Self::CmId, ch: &Self::CmChannel) -> Result<(), SimError> {
        id.migrate(ch)
    }
    fn cm_on_device(id: &Self::CmId, ctx: &Self::Context) -> bool {
        id.device_index() == Some(ctx.device_index())
    }
    fn cm_bind(id: &Self::CmId, addr: SocketAddr) -> Result<SocketAddr, SimError> {
        id.bind(addr)
    }
    fn cm_listen(id: &Self::CmId, _backlog: u32) -> Result<(), SimError> {
        id.listen()
    }
    fn cm_resolve_addr(
        id: &Self::CmId,
        src: Option<IpAddr>,
        dst: SocketAddr,
        _timeout_ms: u32,
    ) -> Result<(), SimError> {
        id.resolve_addr(src, dst)
    }
    fn cm_resolve_route(id: &Self::CmId, _timeout_ms: u32) -> Result<(), SimError> {
        id.resolve_route()
    }
    fn cm_connect(id: &Self::CmId, param: &ConnParam, data: &[u8]) -> Result<(), SimError> {
        id.connect(param, data)
    }
    fn cm_accept(id: &Self::CmId, param: &ConnParam, data: &[u8]) -> Result<(), SimError> {
        id.accept(param, data)
    }
    fn cm_reject(id: &Self::CmId, data: &[u8]) -> Result<(), SimError> {
        id.reject(data)
    }
    fn cm_establish(id: &Self::CmId) -> Result<(), SimError> {
        id.establish()
    }
    fn cm_disconnect(id: &Self::CmId) -> Result<(), SimError> {
        id.disconnect()
    }
    fn cm_path(id: &Self::CmId) -> Result<CmPath, SimError> {
        id.path()
    }
}
