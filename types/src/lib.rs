//! `zverbs-types`: the plain verbs data of zverbs and its simulator, in one place.
//!
//! These are the values that cross the provider seam, mirroring the C verbs structures
//! (`ibv_access_flags`, `ibv_sge`, `ibv_wc`, `ibv_qp_attr`, ...): flags, GIDs, MTUs,
//! port and queue pair states, capacities, scatter/gather entries, send operations, work
//! completions and the attributes of queue pair transitions. `zverbs` re-exports them
//! where users find them (`zverbs::types`, `zverbs::provider`); `zverbs-sim` speaks them
//! directly, so the simulator's values are the provider's without a conversion.
//!
//! The connection manager's values are in [`cm`]: port spaces, connect parameters,
//! private data, events and the path a manager decides.
//!
//! Work requests are here too (`SendWr<SGES>`, `RecvWr<SGES>`, `PostError`): a channel's
//! ring holds them, and every provider, the simulator included, reads them where they lie.
//!
//! The crate is `no_std` (feature `std` adds `std::error::Error` for `PostError`),
//! allocates nothing and depends only on `bitflags`.

#![no_std]
#![deny(missing_docs, unsafe_code)]

#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod cm;
mod device;
mod event;
mod port;
mod qp;
mod wc;
mod wr;

pub use device::{AtomicCap, DeviceAttr};
pub use event::{AsyncEvent, AsyncEventKind, EventElement};
pub use port::{Gid, Mtu, PortAttr, PortState};
pub use qp::{
    AhAttr, InitAttr, QpCaps, QpState, QpType, RtrAttr, RtsAttr, SrqAttr, Transition, UdInitAttr,
    MAX_STATIC_RATE,
};
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
pub use wr::{AccessFlags, AhKey, PostError, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};
