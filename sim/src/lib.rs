//! `zverbs-sim`: an in-process model of an RDMA fabric.
//!
//! A [`Fabric`] holds simulated HCAs ("devices"), each with one port, a LID and a GID table.
//! On a device you open a [`Context`], allocate protection domains ([`Pd`]), register memory
//! ([`Mr`]), create completion queues ([`Cq`]) and reliable-connected queue pairs ([`Qp`]).
//! Queue pairs follow the verbs state machine and execute SEND, SEND_WITH_IMM, RDMA_WRITE,
//! RDMA_WRITE_WITH_IMM, RDMA_READ and the two 64-bit atomics with the checks a real HCA
//! makes, completing each work request with the status hardware would report.
//!
//! The simulator does not depend on `zverbs`; `zverbs` adapts it behind its `sim` feature.
//! It is thread-safe: two threads may drive the two ends of a connection.
//!
//! ```
//! use zverbs_sim::*;
//! let fabric = Fabric::with_devices(1);
//! let ctx = fabric.open_device("sim0").unwrap();
//! assert_eq!(ctx.query_port(1).unwrap().state, PortState::Active);
//! ```

#![deny(missing_docs, unsafe_op_in_unsafe_fn)]

mod exec;
mod mem;
mod state;
mod types;
mod world;

pub use types::*;
pub use world::{Context, Cq, Fabric, Mr, Pd, PostError, Qp, QpInitAttr};
