//! # zverbs
//!
//! RDMA verbs for latency-critical systems: one typestate queue-pair machinery over a
//! [`Provider`](provider::Provider) seam with two backends — the real verbs library and an
//! in-process, deterministic simulator (`zverbs-sim`, feature `sim`).
//!
//! Layers, bottom to top; each imports only from the layers above it in this list:
//!
//! - [`types`] (crate `zverbs-types`): the verbs vocabulary both backends share, work
//!   requests included.
//! - [`provider`]: the seam: the verbs a real HCA offers (`sim`, `verbs`).
//! - [`device`], [`cq`], [`event`], [`mr`], [`dmabuf`], [`qp`]: contexts and protection
//!   domains, completion queues and channels, memory regions (the process's, and device
//!   memory registered from a dmabuf), typestate queue pairs (RC, UD).
//! - `ring`, [`wr_id`]: a queue's work-request slots; what the library writes in a
//!   `wr_id`.
//! - [`dispatch`]: completion queues shared by many channels, routed lock-free.
//! - [`pool`]: a registered slab carved into owned buffers ([`LocalBuf`]).
//! - [`bootstrap`]: getting started with peers: the network configuration, endpoint
//!   frames, the TCP exchanger.
//! - [`channel`]: one RC peer, or datagrams to any, at three levels: blocking, scoped,
//!   unpolled; one operation value ([`Op`]) posted by all of them; requests built once
//!   and posted again and again ([`Batch`]).
//! - [`multi_channel`]: one channel per peer on shared completion queues; scatter/gather,
//!   multicast.
//! - [`node`]: rank, world, barriers.
//! - [`rpc`]: eRPC-style RPC: a sans-IO protocol core ([`rpc::RpcCore`]) and an engine
//!   over UD queue pairs, with a bulk path over RC.
//! - `tokio` (feature `tokio`): async operations on owned buffers woken by completion
//!   events, connections that lend and borrow registered memory, async RPC.
//! - `testing` (feature `sim`): set-ups in one call for tests on the simulator: a
//!   connected pair, a world of nodes, a loopback queue pair, an RPC client and server.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::provider::sim::Sim;
//! use zverbs::{ChannelConfig, Context, SimChannel};
//!
//! let sim = Sim::with_devices(2);
//! let (ca, cb) = (Context::open(&sim, "sim0")?, Context::open(&sim, "sim1")?);
//! let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
//! let a = SimChannel::<64, 4>::prepare(&ca, &pa, &ChannelConfig::default())?;
//! let b = SimChannel::<64, 4>::prepare(&cb, &pb, &ChannelConfig::default())?;
//! let (ea, eb) = (a.endpoint(), b.endpoint()); // exchanged out of band in real life
//! let (mut a, mut b) = (a.connect(&eb)?, b.connect(&ea)?);
//!
//! // One-sided: a writes into b's region without b's CPU.
//! let mut target = [0u8; 16];
//! // SAFETY: b does not touch `target` until a's write has completed (below).
//! let target = unsafe {
//!     pb.register_with_access(&mut target, zverbs::AccessFlags::LOCAL_WRITE | zverbs::AccessFlags::REMOTE_WRITE)?
//! };
//! let mut msg = *b"written remotely";
//! let msg = pa.register(&mut msg)?;
//! a.write([msg.slice(..)?], &target.remote())?;
//! assert_eq!(target.as_slice(), b"written remotely");
//! # let _ = &mut b;
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(missing_docs, unsafe_op_in_unsafe_fn)]

// Unit tests use std (collections, threads) also when the library is built without it.
#[cfg(all(test, not(feature = "std")))]
extern crate std;

#[cfg(feature = "std")]
pub mod bootstrap;
pub mod channel;
#[cfg(all(feature = "std", unix))]
pub mod cm;
pub mod cq;
#[cfg(all(feature = "cuda", unix))]
pub mod cuda;
pub mod device;
#[cfg(feature = "std")]
pub mod dispatch;
#[cfg(all(feature = "std", unix))]
pub mod dmabuf;
pub mod error;
pub mod event;
pub mod mr;
pub mod multi_channel;
pub mod node;
#[cfg(feature = "std")]
pub mod pool;
pub mod provider;
pub mod qp;
// Public, unlisted, for `benches/primitives.rs` only (it times a slot's round trip): the
// ring is the channels' bookkeeping, not an API.
#[doc(hidden)]
pub mod ring;
#[cfg(feature = "std")]
pub mod rpc;
pub mod srq;
mod sync;
#[cfg(feature = "sim")]
pub mod testing;
#[cfg(all(feature = "tokio", unix))]
pub mod tokio;
mod trace;
pub mod types;
pub mod wr_id;

pub use channel::{
    Batch, Channel, ChannelConfig, CqLayout, Destination, Op, Owned, Pending, PostedReceive,
    PreparedChannel, Scope, WaitPolicy,
};
pub use cq::CompletionQueue;
pub use device::{Context, ProtectionDomain};
pub use error::{BoundsError, CompletionError, Error, ErrorKind, ProviderError};
pub use event::{CompletionChannel, CqEvent};
pub use mr::{LocalSlice, LocalSliceMut, MemoryRegion, RemoteRegion};
pub use multi_channel::{
    MultiChannel, MultiScope, Outcome, PeerError, PeerPending, PreparedMultiChannel,
};
#[cfg(all(feature = "std", unix))]
pub use pool::{DeviceBuf, DevicePool};
#[cfg(feature = "std")]
pub use pool::{LocalBuf, MrPool, PoolError, PoolStats};
pub use qp::{AddressHandle, Endpoint, EndpointError, QueuePair};
pub use ring::Completion;
pub use srq::SharedReceiveQueue;
pub use types::*;

/// A [`Channel`] on the simulator: `DEPTH` requests in flight per direction, `SGES`
/// scatter/gather entries per request.
#[cfg(feature = "sim")]
pub type SimChannel<const DEPTH: usize = 64, const SGES: usize = 4> =
    Channel<provider::sim::Sim, DEPTH, SGES>;
/// A [`MultiChannel`] on the simulator, to at most `PEERS` peers.
#[cfg(feature = "sim")]
pub type SimMultiChannel<const PEERS: usize, const DEPTH: usize = 64, const SGES: usize = 4> =
    MultiChannel<provider::sim::Sim, PEERS, DEPTH, SGES>;
/// A [`Node`](node::Node) on the simulator, in a world of at most `PEERS` ranks.
#[cfg(feature = "sim")]
pub type SimNode<const PEERS: usize, const DEPTH: usize = 64, const SGES: usize = 4> =
    node::Node<provider::sim::Sim, PEERS, DEPTH, SGES>;
/// A [`Channel`] on a verbs device (a NIC or soft-RoCE).
#[cfg(feature = "verbs")]
pub type VerbsChannel<const DEPTH: usize = 64, const SGES: usize = 4> =
    Channel<provider::verbs::Verbs, DEPTH, SGES>;
/// A [`MultiChannel`] on a verbs device.
#[cfg(feature = "verbs")]
pub type VerbsMultiChannel<const PEERS: usize, const DEPTH: usize = 64, const SGES: usize = 4> =
    MultiChannel<provider::verbs::Verbs, PEERS, DEPTH, SGES>;
/// A [`Node`](node::Node) on a verbs device.
#[cfg(feature = "verbs")]
pub type VerbsNode<const PEERS: usize, const DEPTH: usize = 64, const SGES: usize = 4> =
    node::Node<provider::verbs::Verbs, PEERS, DEPTH, SGES>;
