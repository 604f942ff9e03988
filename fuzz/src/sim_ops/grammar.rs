//! The input grammar of `sim_ops`: what a fuzz input decodes to (the operations, their
//! sides, places, keys and lengths); the rig in `mod.rs` runs it.

use arbitrary::Arbitrary;

/// Which channel initiates.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Side {
    /// Channel A (on `sim0`).
    A,
    /// Channel B (on `sim1`).
    B,
}

impl Side {
    pub(super) fn ix(self) -> usize {
        self as usize
    }
}

/// A safe local slice: mapped into the region's bounds.
#[derive(Arbitrary, Debug, Clone)]
pub struct Local {
    /// Region index (mod `R`).
    pub region: u8,
    /// Start (mod length + 1).
    pub start: u8,
    /// Length (mod what is left + 1).
    pub len: u8,
}

/// The 8-byte result slice of an atomic; `wrong_len` makes it another length.
#[derive(Arbitrary, Debug, Clone)]
pub struct Local8 {
    /// Region index.
    pub region: u8,
    /// Start.
    pub start: u8,
    /// A length other than 8.
    pub wrong_len: Option<u8>,
}

/// How a raw SGE's lkey is made.
#[derive(Arbitrary, Debug, Clone)]
pub enum LKey {
    /// The region's lkey.
    Own,
    /// The region's rkey.
    Rkey,
    /// The lkey with bits flipped.
    Xor(u32),
    /// The peer's region's lkey (another protection domain).
    Peer,
    /// Any value.
    Raw(u32),
}

/// Where a raw scatter/gather entry points.
#[derive(Arbitrary, Debug, Clone)]
pub enum Place {
    /// Inside the region (start and length mapped into its bounds).
    In {
        /// Start (mod length + 1).
        start: u8,
        /// Length (mod what is left + 1).
        len: u8,
    },
    /// Any offset from the region's start and any length (may leave it).
    Raw {
        /// Offset.
        off: u8,
        /// Length.
        len: u8,
        /// Adds 2^31 to the length.
        huge: bool,
    },
}

/// A raw scatter/gather entry: any place and key.
#[derive(Arbitrary, Debug, Clone)]
pub struct RawSge {
    /// Region index.
    pub region: u8,
    /// Offset and length.
    pub place: Place,
    /// Key.
    pub key: LKey,
}

/// How a remote region's rkey is made.
#[derive(Arbitrary, Debug, Clone)]
pub enum RKey {
    /// The peer region's rkey.
    Own,
    /// The peer region's lkey.
    Lkey,
    /// The rkey with bits flipped.
    Xor(u32),
    /// The initiator's own region's rkey (wrong protection domain).
    Mine,
    /// Any value.
    Raw(u32),
}

/// The length a remote region claims.
#[derive(Arbitrary, Debug, Clone)]
pub enum RLen {
    /// From the offset to the region's end.
    Rest,
    /// Exactly the data's length.
    Exact,
    /// Any length.
    Raw(u8),
}

/// Where in the peer's region a remote access starts.
#[derive(Arbitrary, Debug, Clone)]
pub enum Off {
    /// Inside (mod length + 1).
    In(u8),
    /// Inside, 8-byte aligned (for atomics).
    Aligned(u8),
    /// Any offset (may leave the region).
    Raw(u8),
}

/// A remote region in the peer's memory, possibly forged.
#[derive(Arbitrary, Debug, Clone)]
pub struct Remote {
    /// Peer region index.
    pub region: u8,
    /// Offset from its start.
    pub off: Off,
    /// Claimed length.
    pub len: RLen,
    /// Key.
    pub key: RKey,
    /// Build it with the bounds-checked `RemoteRegion::slice` instead of literally.
    pub via_slice: bool,
}

/// The compare value of a compare-and-swap.
#[derive(Arbitrary, Debug, Clone)]
pub enum Cmp {
    /// The value the target word holds now (if the model knows it).
    Current,
    /// Any value.
    Value(u64),
}

/// The opcode of an unpolled send.
#[derive(Arbitrary, Debug, Clone)]
pub enum RawKind {
    /// Send.
    Send,
    /// Send with immediate.
    SendImm(u32),
    /// RDMA write.
    Write,
    /// RDMA write with immediate.
    WriteImm(u32),
    /// RDMA read.
    Read,
    /// Compare-and-swap.
    CompareSwap {
        /// Compare value.
        compare: Cmp,
        /// Swap value.
        swap: u64,
    },
    /// Fetch-and-add.
    FetchAdd(u64),
}

/// What one work request of a scope does.
#[derive(Arbitrary, Debug, Clone)]
pub enum ScopeKind {
    /// `post_write`.
    Write {
        /// Gather list.
        data: Vec<Local>,
        /// Target.
        remote: Remote,
    },
    /// `post_write_with_imm`.
    WriteImm {
        /// Gather list.
        data: Vec<Local>,
        /// Target.
        remote: Remote,
        /// Immediate data.
        imm: u32,
    },
    /// `post_read` into one slice.
    Read {
        /// Destination (its region is borrowed exclusively for the scope).
        into: Local,
        /// Source.
        remote: Remote,
    },
    /// `post_send` / `post_send_with_imm`.
    Send {
        /// Gather list.
        data: Vec<Local>,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// `post_receive` into one slice.
    Recv {
        /// Destination (its region is borrowed exclusively for the scope).
        into: Local,
    },
}

/// One work request of a scope.
#[derive(Arbitrary, Debug, Clone)]
pub struct ScopeItem {
    /// What it does.
    pub kind: ScopeKind,
    /// Ring the doorbell after staging it.
    pub doorbell: bool,
}

/// One operation.
#[derive(Arbitrary, Debug, Clone)]
pub enum Op {
    /// Blocking RDMA write.
    Write {
        /// Initiator.
        side: Side,
        /// Gather list.
        data: Vec<Local>,
        /// Target.
        remote: Remote,
    },
    /// Blocking RDMA read.
    Read {
        /// Initiator.
        side: Side,
        /// Scatter list (one slice per region).
        into: Vec<Local>,
        /// Source.
        remote: Remote,
    },
    /// Blocking fetch-and-add.
    FetchAdd {
        /// Initiator.
        side: Side,
        /// Result slice.
        result: Local8,
        /// Target word.
        remote: Remote,
        /// Addend.
        add: u64,
    },
    /// Blocking compare-and-swap.
    CompareSwap {
        /// Initiator.
        side: Side,
        /// Result slice.
        result: Local8,
        /// Target word.
        remote: Remote,
        /// Compare value.
        compare: Cmp,
        /// Swap value.
        swap: u64,
    },
    /// Blocking send (with immediate).
    Send {
        /// Sender.
        side: Side,
        /// Gather list.
        data: Vec<Local>,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// Blocking inline send of unregistered bytes.
    SendInline {
        /// Sender.
        side: Side,
        /// Byte count (mod 80; 64 fit).
        len: u8,
    },
    /// Blocking receive.
    Receive {
        /// Receiver.
        side: Side,
        /// Scatter list (one slice per region).
        into: Vec<Local>,
    },
    /// Unpolled send of any opcode with raw entries.
    PostSend {
        /// Initiator.
        side: Side,
        /// Opcode.
        kind: RawKind,
        /// Raw entries.
        sges: Vec<RawSge>,
        /// Target (RDMA and atomics).
        remote: Remote,
        /// `FENCE` | `SOLICITED` | `INLINE` bits.
        flags: u8,
    },
    /// Unpolled receive with raw entries.
    PostRecv {
        /// Receiver.
        side: Side,
        /// Raw entries.
        sges: Vec<RawSge>,
    },
    /// Waits for a held handle.
    Wait {
        /// Which (mod count).
        idx: u8,
    },
    /// Polls a held handle once.
    TryComplete {
        /// Which (mod count).
        idx: u8,
    },
    /// Several work requests in one scope.
    Scope {
        /// Initiator.
        side: Side,
        /// The work.
        items: Vec<ScopeItem>,
    },
    /// Moves a queue pair to the error state.
    SetError {
        /// Which.
        side: Side,
    },
    /// Runs the previous operation again, `count % 12` times (fills rings and queues).
    Repeat {
        /// How often.
        count: u8,
    },
}

/// A whole fuzz input.
#[derive(Arbitrary, Debug, Clone)]
pub struct SimOpsInput {
    /// Seeds the initial memory contents.
    pub seed: u8,
    /// One operation that can only time out may run (costs the [`TIMEOUT`](super::TIMEOUT)).
    pub allow_timeout: bool,
    /// Operations (the first `MAX_OPS` run).
    pub ops: Vec<Op>,
}
