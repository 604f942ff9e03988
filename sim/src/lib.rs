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
//! Both speak the plain verbs data of `zverbs-types` ([`AccessFlags`], [`QpState`],
//! [`WorkCompletion`], [`Transition`], ...), re-exported here.
//! It is thread-safe: two threads may drive the two ends of a connection, and on the
//! untimed fabric they do so without a fabric-wide lock (each queue pair's sends run on its
//! own lane beside the others', polls and receive posts touch only their own queues; the
//! locked path remains for armed CQs, errors, RNR, a full CQ and UD). Remote atomics are
//! one read-modify-write of the word, atomic against every other atomic on it (devices
//! report `IBV_ATOMIC_HCA`, [`Context::query_device`]), and copies into registered memory
//! are atomic word by word, so racing RDMA into the same bytes is no data race.
//!
//! ```
//! use zverbs_sim::*;
//! let fabric = Fabric::with_devices(1);
//! let ctx = fabric.open_device("sim0").unwrap();
//! assert_eq!(ctx.query_port(1).unwrap().state, PortState::Active);
//! ```
//!
//! # Time, the wire and faults
//!
//! Requests and responses travel as packets over links with a latency and bandwidth
//! ([`LinkModel`]); the RC transport numbers them with PSNs, acknowledges them, retransmits
//! on timeouts up to `retry_cnt` (then `RetryExcErr`), waits out RNR NAKs up to `rnr_retry`
//! (then `RnrRetryExcErr`; 7 waits forever), and executes duplicates at most once.
//! [`FabricConfig`] chooses the mode and one `u64` seed decides every random fault:
//!
//! - [`Fabric::with_devices`] / [`Fabric::new`]: threaded, instant links and timers: work
//!   completes inside the call that makes it possible (the untimed simulator). Without
//!   random faults or the trace, requests on an idle connection even skip the packets:
//!   they execute inside their post, with the outcome the packet path computes (see
//!   [`FabricConfig::instant`] and `tests/direct.rs`).
//! - [`Mode::Threaded`] with a [`LinkModel`]: simulated time is the wall clock.
//! - [`Mode::Stepped`]: simulated time moves only through [`Fabric::step`],
//!   [`Fabric::run_until_idle`], [`Fabric::run_for`] or an auto-stepping [`Cq::poll`];
//!   thousands of devices run on one thread, and the same seed gives the same trace, byte
//!   for byte.
//!
//! Faults: random drop, duplication and delay per packet ([`Faults`]); scripted drops
//! ([`Fabric::drop_next`]), corrupted responses ([`Fabric::corrupt_next_response`]), link
//! down and up, partitions, crashes; what they do to a port, a device or a completion
//! queue, and what happens to shared receive queues ([`Srq`]) and queue pairs (a limit
//! reached, the last receive taken, communication established), reaches its contexts as
//! asynchronous events ([`Context::get_async_event`],
//! on a descriptor: [`Context::async_fd`]). With [`FabricConfig::trace`] every post, packet, drop,
//! retransmission, RNR NAK, execution, completion and state change is recorded
//! ([`Fabric::trace_events`]) and can be written as Chrome trace-event JSON
//! ([`Fabric::write_chrome_trace`]) for Perfetto.
//!
//! ```
//! use std::time::Duration;
//! use zverbs_sim::*;
//! let cfg = FabricConfig { trace: true, ..FabricConfig::stepped(42) };
//! let fabric = Fabric::with_config(cfg, 2);
//! fabric.link_down(1).unwrap(); // packets to or from sim1 are lost from now on
//! assert_eq!(fabric.run_for(Duration::from_micros(5)), 0); // nothing to do yet
//! assert_eq!(fabric.now(), Duration::from_micros(5));
//! ```
//!
//! # Provoking every RC completion status
//!
//! Besides the checks a real HCA makes (lengths, keys, bounds, rights, alignment), some
//! statuses need a deterministic trigger:
//!
//! - `RetryExcErr`: [`Fabric::link_down`], [`Fabric::partition`] or [`Fabric::crash`] the
//!   responder's device (or connect to a peer that is not there): the requester retries
//!   `retry_cnt` times, one ACK timeout (4.096 µs × 2^`timeout`) each, then gives up.
//! - `RnrRetryExcErr`: a SEND or WRITE_WITH_IMM with no receive posted and `rnr_retry` < 7.
//! - `BadRespErr`: [`Fabric::corrupt_next_response`] on the responder's device.
//! - `FatalErr`: the same with [`Personality::Rxe`], for a request that is not a read
//!   (rxe fails a request answered by an RDMA READ response with it; a read keeps
//!   `BadRespErr`).
//! - `LocQpOpErr`: an RDMA read or atomic posted on a queue pair whose RTS
//!   `max_rd_atomic` is 0 (it may issue none).
//! - `LocAccessErr`: the receive consumed by a WRITE_WITH_IMM whose rkey check fails (the
//!   requester gets `RemAccessErr`), on a fabric with [`FabricConfig::loc_access_err`]
//!   (every configured fabric; the untimed one flushes that receive instead).
//! - `RemOpErr`: a SEND whose receive names memory the responder may not write.
//! - `MwBindErr`: never; memory windows are not modelled (there is no bind operation).
//! - `RemAbortErr`, `RespTimeoutErr`, `GeneralErr` and the RD-only statuses: never; no
//!   queue pair the simulator models meets them (`zverbs::WcStatus` says why).

#![deny(missing_docs, unsafe_op_in_unsafe_fn)]

mod api;
pub mod cm;
mod config;
mod counters;
mod fd_queue;
mod gate;
#[cfg(feature = "cuda")]
mod gpu;
mod hca;
mod padded;
mod rng;
mod sched;
mod sync;
mod trace;
mod types;
mod wire;

pub use api::comp_channel::CompChannel;
pub use api::device_mem::{DeviceMemory, DMABUF_PAGE};
pub use api::qp::{Ah, Qp, QpInitAttr};
pub use api::srq::Srq;
pub use api::{Context, Cq, Fabric, Mr, Pd};
pub use config::{
    ack_timeout_ns, rnr_timer_ns, FabricConfig, Faults, LinkModel, Mode, Personality,
    ROCE_ROUTE_HOP_LIMIT,
};
pub use counters::QpCounters;
pub use trace::{TraceEvent, TraceKind};
pub use types::*;
pub use wire::{DropReason, PacketKind};
