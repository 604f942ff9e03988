//! Work requests and what they carry: access rights, send flags, scatter/gather entries,
//! operations, and the error of a post that stopped part way.
//!
//! A request owns its scatter/gather list in a fixed array of `SGES` entries, so a ring of
//! them is allocated once and posting never allocates; zverbs's rings hold them and its
//! providers, the simulator included, read them where they lie.

use core::fmt;

use crate::WcOpcode;

bitflags::bitflags! {
    /// Access rights of a memory region or a queue pair (`ibv_access_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The HCA may write this memory for local work (receives, read and atomic results).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write this memory (requires `LOCAL_WRITE`).
        const REMOTE_WRITE = 1 << 1;
        /// Peers may RDMA-read this memory.
        const REMOTE_READ = 1 << 2;
        /// Peers may run atomics on this memory (requires `LOCAL_WRITE`).
        const REMOTE_ATOMIC = 1 << 3;
    }
}

bitflags::bitflags! {
    /// Flags of a send work request (`ibv_send_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for prior RDMA reads and atomics before this request.
        const FENCE = 1;
        /// Generate a completion on success (errors always complete).
        const SIGNALED = 1 << 1;
        /// Raise a solicited event at the responder.
        const SOLICITED = 1 << 2;
        /// Copy the payload at post time; lkeys are not checked.
        const INLINE = 1 << 3;
    }
}

/// One scatter/gather entry (`ibv_sge`): a byte range of registered memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region that covers the range.
    pub lkey: u32,
}

impl Sge {
    /// An entry naming no bytes: what a request's unused entries hold.
    pub const EMPTY: Sge = Sge {
        addr: 0,
        length: 0,
        lkey: 0,
    };
}

/// What a send work request does, with the operation's own fields (`ibv_wr_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// Two-sided send; consumes a receive at the peer.
    Send,
    /// Send with 32 bits of immediate data for the receiver.
    SendWithImm(u32),
    /// One-sided write to `remote_addr`.
    Write {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Write that also consumes a receive at the peer and hands it `imm`.
    WriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// One-sided read from `remote_addr` into the local scatter list.
    Read {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 64-bit compare-and-swap; the previous remote value lands in the local 8 bytes.
    CompareSwap {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Expected value.
        compare: u64,
        /// New value, written if the remote value equals `compare`.
        swap: u64,
    },
    /// 64-bit fetch-and-add; the previous remote value lands in the local 8 bytes.
    FetchAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
    /// A datagram on an unreliable-datagram queue pair: consumes a receive at the
    /// destination, if there is one (else it is dropped there, as is any datagram the
    /// destination does not accept). The whole message must fit one packet of the path
    /// MTU.
    Datagram {
        /// Where it goes (`ibv_send_wr.wr.ud`).
        dest: UdDest,
        /// Immediate data for the receiver (`IBV_WR_SEND_WITH_IMM`).
        imm: Option<u32>,
    },
}

/// Where a datagram goes: an address handle and the queue pair behind it
/// (`ibv_send_wr.wr.ud`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// The address handle (the provider's key for it, from its `create_ah`).
    pub ah: AhKey,
    /// The destination queue pair's number.
    pub remote_qpn: u32,
    /// The Q_Key the destination checks. With the high bit set, the sending queue pair's
    /// own Q_Key is sent instead (IBTA 10.2.5).
    pub remote_qkey: u32,
}

/// A provider's name for an address handle (`ibv_ah *`): what a datagram's work request
/// carries. Only the provider that made it can tell what it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AhKey(pub u64);

impl SendOp {
    /// The completion opcode this operation produces.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::Datagram { .. } => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompareSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }

    /// Whether the operation consumes a receive at its responder on a connected queue
    /// pair (a send, or a write with immediate data); a datagram consumes one at its
    /// destination's queue pair instead.
    ///
    /// ```
    /// use zverbs_types::SendOp;
    /// assert!(SendOp::SendWithImm(7).consumes_receive());
    /// assert!(!SendOp::Write { remote_addr: 0, rkey: 1 }.consumes_receive());
    /// ```
    pub const fn consumes_receive(&self) -> bool {
        matches!(
            self,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::WriteWithImm { .. }
        )
    }
}

/// A send work request with room for `SGES` gather entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr<const SGES: usize> {
    /// Identifier returned in the completion.
    pub wr_id: u64,
    /// Gather list; the first `num_sge` entries are used.
    pub sg_list: [Sge; SGES],
    /// Number of valid entries in `sg_list`, at most `SGES` (a larger count is refused when
    /// posted).
    pub num_sge: u8,
    /// Operation.
    pub op: SendOp,
    /// Flags.
    pub flags: SendFlags,
}

impl<const SGES: usize> SendWr<SGES> {
    /// A request with an empty gather list.
    pub const fn new(wr_id: u64, op: SendOp, flags: SendFlags) -> Self {
        SendWr {
            wr_id,
            sg_list: [Sge::EMPTY; SGES],
            num_sge: 0,
            op,
            flags,
        }
    }

    /// The used part of the gather list: the first `num_sge` entries. A `num_sge` above
    /// `SGES` names entries that do not exist: this gives the `SGES` there are, and providers
    /// refuse to post such a request (see [`sges_fit`](Self::sges_fit)).
    pub fn sges(&self) -> &[Sge] {
        &self.sg_list[..usize::from(self.num_sge).min(SGES)]
    }

    /// Whether `num_sge` is at most `SGES`, the entries `sg_list` holds.
    pub fn sges_fit(&self) -> bool {
        usize::from(self.num_sge) <= SGES
    }
}

/// A receive work request with room for `SGES` scatter entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr<const SGES: usize> {
    /// Identifier returned in the completion.
    pub wr_id: u64,
    /// Scatter list; the first `num_sge` entries are used.
    pub sg_list: [Sge; SGES],
    /// Number of valid entries in `sg_list`, at most `SGES` (a larger count is refused when
    /// posted).
    pub num_sge: u8,
}

impl<const SGES: usize> RecvWr<SGES> {
    /// A request with an empty scatter list.
    pub const fn new(wr_id: u64) -> Self {
        RecvWr {
            wr_id,
            sg_list: [Sge::EMPTY; SGES],
            num_sge: 0,
        }
    }

    /// The used part of the scatter list: the first `num_sge` entries, at most `SGES` (as
    /// [`SendWr::sges`]; providers refuse a request whose `num_sge` exceeds `SGES`).
    pub fn sges(&self) -> &[Sge] {
        &self.sg_list[..usize::from(self.num_sge).min(SGES)]
    }

    /// Whether `num_sge` is at most `SGES`, the entries `sg_list` holds.
    pub fn sges_fit(&self) -> bool {
        usize::from(self.num_sge) <= SGES
    }
}

/// A post that stopped at work request `index` (the verbs `bad_wr`): requests before it
/// were posted, it and those after were not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostError<E> {
    /// Position of the first request that was not posted.
    pub index: usize,
    /// Why.
    pub error: E,
}

impl<E: fmt::Display> fmt::Display for PostError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work request {} not posted: {}", self.index, self.error)
    }
}

#[cfg(feature = "std")]
impl<E: std::error::Error + 'static> std::error::Error for PostError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
