//! The simulator's own types: its limits, its errors and what a queue pair query reports.
//!
//! The verbs data (flags, GIDs, MTUs, states, work requests, operations, completions,
//! transitions) is `zverbs-types`'s, the vocabulary zverbs speaks too, re-exported here. A
//! work request carries its scatter/gather list in a fixed array of `SGES` entries, and a
//! post reads it where it lies, so posting never allocates.

use core::fmt;

pub use zverbs_types::{
    AccessFlags, AhAttr, AhKey, AsyncEvent, AsyncEventKind, AtomicCap, DeviceAttr, EventElement,
    Gid, InitAttr, Mtu, PortAttr, PortState, PostError, QpCaps, QpState, QpType, RecvWr, RtrAttr,
    RtsAttr, SendFlags, SendOp, SendWr, Sge, SrqAttr, Transition, UdDest, UdInitAttr, WcOpcode,
    WcStatus, WorkCompletion, MAX_STATIC_RATE,
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
/// Most shared receive queues a device holds.
pub const MAX_SRQ: u32 = 1 << 12;
/// Most receives one shared receive queue may hold.
pub const MAX_SRQ_WR: u32 = 1 << 14;
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
    /// `EOPNOTSUPP`: the device does not do this (a dmabuf registration on a device of
    /// the rxe personality).
    Unsupported,
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
            SimError::Unsupported => f.write_str("operation not supported by the device"),
        }
    }
}

impl std::error::Error for SimError {}

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
