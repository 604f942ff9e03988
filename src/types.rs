//! Verbs data types shared by every layer and every provider.
//!
//! The plain data (flags, GIDs, MTUs, states, scatter/gather entries, operations,
//! completions) is the `zverbs-types` crate's, the one vocabulary of zverbs and its
//! simulator, re-exported here. Work requests are zverbs's own: they own their
//! scatter/gather list in a fixed array of `SGES` entries, so a ring of them is allocated once
//! and posting never allocates.

pub use zverbs_types::{
    AccessFlags, AhAttr, AhKey, AtomicCap, DeviceAttr, Gid, Mtu, PortAttr, PortState, QpCaps,
    QpState, QpType, SendFlags, SendOp, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion,
};

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
            sg_list: [Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; SGES],
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
            sg_list: [Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; SGES],
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
