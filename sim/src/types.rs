//! The simulator's own types: its limits, its errors, its work requests and what a queue
//! pair query reports.
//!
//! The plain verbs data (flags, GIDs, MTUs, states, scatter/gather entries, operations,
//! completions, transitions) is `zverbs-types`'s, the vocabulary zverbs speaks too,
//! re-exported here. A work request carries its scatter/gather list in a fixed array, so
//! posting never allocates.

use core::fmt;

pub use zverbs_types::{
    AccessFlags, AhAttr, AhKey, AtomicCap, DeviceAttr, Gid, InitAttr, Mtu, PortAttr, PortState,
    QpCaps, QpState, QpType, RtrAttr, RtsAttr, SendFlags, SendOp, Sge, Transition, UdDest,
    UdInitAttr, WcOpcode, WcStatus, WorkCompletion,
};

/// Most scatter/gather entries one work request may carry in the simulator.
pub const MAX_SGE: usize = 16;
/// Most bytes of inline data one send may carry in the simulator.
pub const MAX_INLINE: usize = 256;
/// Deepest completion queue the simulator creates.
pub const MAX_CQE: u32 = 1 << 16;
/// Most work requests one queue of a queue pair may hold.
pub const MAX_QP_WR: u32 = 1 << 14;
/// Most RDMA READs and atomics a queue pair may have outstanding, as requester
/// (`max_rd_atomic`) and as responder (`max_dest_rd_atomic`).
pub const MAX_QP_RD_ATOM: u8 = 16;
/// Largest message an RC queue pair carries (2^31 bytes, as in the verbs spec).
pub const MAX_MSG: u64 = 1 << 31;

/// Errors a simulated verb returns synchronously (the `errno` of the C API).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SimError {
    /// `EINVAL`: an attribute or argument is invalid, or the call is illegal in this state.
    Invalid(&'static str),
    /// `ENOMEM`: the queue is full (post) or a resource limit was reached (create).
    QueueFull,
    /// `ENODEV`/`ENOENT`: no such device, port or GID index.
    NotFound,
    /// `EBUSY`: the object is still in use.
    Busy,
    /// The completion queue overflowed and is in the error state (`IBV_EVENT_CQ_ERR`).
    CqOverflow,
    /// `EIO`: the device is dead ([`Fabric::crash`](crate::Fabric::crash)); it does no more
    /// DMA and completes nothing, and its objects can only be destroyed.
    DeviceFatal,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Invalid(why) => write!(f, "invalid argument: {why}"),
            SimError::QueueFull => f.write_str("queue full"),
            SimError::NotFound => f.write_str("not found"),
            SimError::Busy => f.write_str("resource busy"),
            SimError::CqOverflow => f.write_str("completion queue overflowed"),
            SimError::DeviceFatal => f.write_str("device is dead (fatal error)"),
        }
    }
}

impl std::error::Error for SimError {}

/// A send work request (`ibv_send_wr`), owning its scatter/gather list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Gather list; only the first `num_sge` entries are used.
    pub sg_list: [Sge; MAX_SGE],
    /// Number of valid entries in `sg_list`.
    pub num_sge: usize,
    /// Operation.
    pub op: SendOp,
    /// Flags.
    pub flags: SendFlags,
}

/// A send work request as a post reads it, in place: [`SendWr`], or an adapter's own
/// request type (the library's), so that [`Qp::post_send_raw`](crate::Qp::post_send_raw)
/// reads a list where it lies instead of a copy of each request.
///
/// A post reads each request more than once (its checks, then its execution) and
/// requires the same answers each time. It reads the first `num_sge()` entries of
/// `sges()`; a request whose `sges()` holds fewer is refused, as one naming more entries
/// than its queue pair's `max_send_sge` is.
pub trait SendRequest {
    /// Caller's identifier, returned in the completion.
    fn wr_id(&self) -> u64;
    /// Operation.
    fn op(&self) -> SendOp;
    /// Flags.
    fn flags(&self) -> SendFlags;
    /// The number of gather entries it names.
    fn num_sge(&self) -> usize;
    /// The gather entries it holds, of which the first `num_sge()` are read.
    fn sges(&self) -> &[Sge];
}

impl SendRequest for SendWr {
    #[inline(always)]
    fn wr_id(&self) -> u64 {
        self.wr_id
    }
    #[inline(always)]
    fn op(&self) -> SendOp {
        self.op
    }
    #[inline(always)]
    fn flags(&self) -> SendFlags {
        self.flags
    }
    #[inline(always)]
    fn num_sge(&self) -> usize {
        self.num_sge
    }
    #[inline(always)]
    fn sges(&self) -> &[Sge] {
        &self.sg_list
    }
}

impl SendWr {
    /// `wr` as a `SendWr`, written over this one: only the entries it names are copied
    /// (the rest are left as they were, and not read); one naming more than it holds, or
    /// than a `SendWr` holds, keeps a count that every queue pair refuses.
    #[inline]
    pub(crate) fn set_from(&mut self, wr: &impl SendRequest) {
        let (n, sges) = (wr.num_sge(), wr.sges());
        match sges.get(..n).filter(|s| s.len() <= MAX_SGE) {
            Some([e]) => self.sg_list[0] = *e,
            Some(s) => self.sg_list[..s.len()].copy_from_slice(s),
            None => {}
        }
        self.num_sge = if n <= sges.len() { n } else { usize::MAX };
        (self.wr_id, self.op, self.flags) = (wr.wr_id(), wr.op(), wr.flags());
    }
}

/// A receive work request (`ibv_recv_wr`), owning its scatter list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Scatter list; only the first `num_sge` entries are used.
    pub sg_list: [Sge; MAX_SGE],
    /// Number of valid entries in `sg_list`.
    pub num_sge: usize,
}

/// What [`Qp::query`](crate::Qp::query) reports (`ibv_query_qp`): the state, the
/// attributes the RTR and RTS transitions set (`None` before them and after RESET), and the
/// packet sequence numbers in use now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttr {
    /// Current state.
    pub state: QpState,
    /// The path and responder attributes of the last RTR transition.
    pub rtr: Option<RtrAttr>,
    /// The requester attributes of the last RTS transition.
    pub rts: Option<RtsAttr>,
    /// The next PSN the requester sends.
    pub sq_psn: u32,
    /// The next PSN the responder expects.
    pub rq_psn: u32,
}
