//! Verbs data types shared by every layer and every provider.
//!
//! All of it is the `zverbs-types` crate's, the one vocabulary of zverbs and its
//! simulator, re-exported here: flags, GIDs, MTUs, states, scatter/gather entries,
//! operations, completions, and the work requests, which own their scatter/gather list in
//! a fixed array of `SGES` entries, so that a ring of them is allocated once and posting
//! never allocates.

pub use zverbs_types::{
    AccessFlags, AhAttr, AhKey, AsyncEvent, AsyncEventKind, AtomicCap, DeviceAttr, EventElement,
    Gid, Mtu, PortAttr, PortState, QpCaps, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge,
    SrqAttr, UdDest, WcOpcode, WcStatus, WorkCompletion, MAX_STATIC_RATE,
};
