//! What work requests carry: access rights, send flags, scatter/gather entries and
//! operations.

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
