//! Plain data types of the simulated verbs interface.
//!
//! They mirror the C verbs structures (`ibv_sge`, `ibv_send_wr`, `ibv_wc`, ...) closely
//! enough that an adapter maps them field by field, but they are owned Rust values: a work
//! request carries its scatter/gather list in a fixed array, so posting never allocates.

use core::fmt;

/// Most scatter/gather entries one work request may carry in the simulator.
pub const MAX_SGE: usize = 16;
/// Most bytes of inline data one send may carry in the simulator.
pub const MAX_INLINE: usize = 256;
/// Deepest completion queue the simulator creates.
pub const MAX_CQE: u32 = 1 << 16;
/// Most work requests one queue of a queue pair may hold.
pub const MAX_QP_WR: u32 = 1 << 14;
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

bitflags::bitflags! {
    /// Access rights of a memory region or a queue pair (`ibv_access_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// The HCA may write this memory on behalf of local work (receives, read results).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write this memory.
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA-read this memory.
        const REMOTE_READ = 1 << 2;
        /// Peers may run atomics on this memory.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

bitflags::bitflags! {
    /// Flags of a send work request (`ibv_send_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for prior RDMA reads and atomics before this one.
        const FENCE = 1;
        /// Generate a completion when this request completes successfully.
        const SIGNALED = 1 << 1;
        /// Ask the responder to raise a solicited event.
        const SOLICITED = 1 << 2;
        /// Copy the payload at post time; the lkeys are not checked.
        const INLINE = 1 << 3;
    }
}

/// One scatter/gather entry (`ibv_sge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Start address in the registered memory.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region covering `addr..addr+length`.
    pub lkey: u32,
}

/// The operation of a send work request, with its operation-specific fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// Two-sided send, consumes one receive at the peer.
    Send,
    /// Send carrying 32 bits of immediate data.
    SendWithImm {
        /// Immediate data delivered in the receive completion.
        imm: u32,
    },
    /// One-sided write into the peer's memory.
    Write {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Write that also consumes a receive at the peer and delivers immediate data.
    WriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data delivered in the receive completion.
        imm: u32,
    },
    /// One-sided read from the peer's memory into the local scatter list.
    Read {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 64-bit compare and swap at an 8-byte aligned remote address; the old value lands in
    /// the local 8-byte SGE.
    CompareSwap {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value written when equal.
        swap: u64,
    },
    /// 64-bit fetch and add at an 8-byte aligned remote address; the old value lands in the
    /// local 8-byte SGE.
    FetchAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value added.
        add: u64,
    },
}

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

/// Completion status (`ibv_wc_status`, same numeric values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

/// Completion opcode (`ibv_wc_opcode`, same numeric values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[allow(missing_docs)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// A work completion (`ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The `wr_id` of the completed work request.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// What completed. For error completions the simulator still reports the opcode of the
    /// work request (hardware leaves it undefined).
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: message length; reads: bytes read; atomics: 8).
    pub byte_len: u32,
    /// Immediate data of a SEND_WITH_IMM or RDMA_WRITE_WITH_IMM receive.
    pub imm_data: Option<u32>,
    /// Number of the local queue pair the work request was posted on.
    pub qp_num: u32,
}

/// Path MTU (`ibv_mtu`, same numeric values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

/// Queue pair state (`ibv_qp_state`, same numeric values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Sqd = 4,
    Sqe = 5,
    Err = 6,
}

/// A 128-bit global identifier.
pub type Gid = [u8; 16];

/// Port state (`ibv_port_state`, subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortState {
    /// The link is down.
    Down,
    /// The link is up and usable.
    Active,
}

/// Port attributes (`ibv_port_attr`, subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Link state.
    pub state: PortState,
    /// Local identifier.
    pub lid: u16,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_table_len: u16,
}

/// Capacities asked of a new queue pair (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth (1..=MAX_QP_WR).
    pub max_send_wr: u32,
    /// Receive queue depth (1..=MAX_QP_WR).
    pub max_recv_wr: u32,
    /// Gather entries per send (1..=MAX_SGE).
    pub max_send_sge: u32,
    /// Scatter entries per receive (1..=MAX_SGE).
    pub max_recv_sge: u32,
    /// Inline bytes per send (0..=MAX_INLINE).
    pub max_inline_data: u32,
}

/// Attributes of the INIT transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitAttr {
    /// Physical port (the simulator has port 1 only).
    pub port: u8,
    /// P_Key index (must be 0).
    pub pkey_index: u16,
    /// Remote operations this queue pair accepts as responder.
    pub access: Access,
}

/// Attributes of the RTR transition (the path to the peer and receive-side limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    /// Path MTU (must not exceed the port's active MTU).
    pub path_mtu: Mtu,
    /// Remote queue pair number (< 2^24).
    pub dest_qp_num: u32,
    /// Expected first packet sequence number (< 2^24).
    pub rq_psn: u32,
    /// RDMA reads and atomics this queue pair accepts in flight as responder (0 refuses them).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (0..=31).
    pub min_rnr_timer: u8,
    /// Remote LID.
    pub dlid: u16,
    /// Remote GID, when routed by GID (RoCE).
    pub dgid: Option<Gid>,
    /// Local GID index used for this path.
    pub sgid_index: u8,
    /// Local port.
    pub port: u8,
    /// Service level (0..=15).
    pub sl: u8,
    /// Traffic class of the GRH (the IP DSCP and ECN bits on RoCE v2).
    pub traffic_class: u8,
    /// Flow label of the GRH (20 bits).
    pub flow_label: u32,
    /// Hop limit of the GRH (the IP TTL on RoCE v2).
    pub hop_limit: u8,
}

/// Attributes of the RTS transition (requester-side reliability).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsAttr {
    /// First packet sequence number sent (< 2^24).
    pub sq_psn: u32,
    /// Local ACK timeout code: 4.096 µs × 2^timeout (0..=31, 0 = infinite).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// RDMA reads and atomics in flight as requester.
    pub max_rd_atomic: u8,
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

/// A queue pair state transition (`ibv_modify_qp` with the attribute mask it implies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Modify {
    /// Any state → RESET: discards all queued work without completions.
    Reset,
    /// RESET or INIT → INIT.
    Init(InitAttr),
    /// INIT → RTR.
    Rtr(RtrAttr),
    /// RTR or RTS → RTS.
    Rts(RtsAttr),
    /// Any state → ERR: flushes all outstanding work with `WrFlushErr`.
    Err,
}
