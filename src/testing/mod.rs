//! Set-ups for tests on the simulator (feature `sim`), quinn's `Pair` as the model: two
//! connected channels, a world of connected nodes, a root with a multi-channel to leaves
//! ([`Star`]), a queue pair looped back to itself ([`Loopback`]), two queue pairs with the
//! receiver's completions on a completion channel ([`EventedPair`]), the passive peer of
//! a sender's measurement ([`Sink`]), or an RPC client
//! and server with a session ([`RpcPair`]), in one call, so that a test reads
//! as its story. The crate's own tests, benches and examples use them, and so can yours.
//!
//! ```
//! use zverbs::testing::Pair;
//! use zverbs::ChannelConfig;
//!
//! let mut p = Pair::<16, 4>::connected(&ChannelConfig::default())?;
//! let mut msg = *b"hello";
//! let msg = p.a.pd.register(&mut msg)?;
//! let mut inbox = [0u8; 8];
//! let mut inbox = p.b.pd.register(&mut inbox)?;
//! std::thread::scope(|t| -> Result<(), zverbs::Error<_>> {
//!     let got = t.spawn(|| p.b.ch.receive([inbox.slice_mut(..)?]));
//!     p.a.ch.send([msg.slice(..)?])?;
//!     assert_eq!(got.join().unwrap()?.byte_len, 5);
//!     Ok(())
//! })?;
//! assert_eq!(&inbox.as_slice()[..5], b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod raw;
mod rpc;
mod sink;
mod star;

pub use raw::{EventedPair, Loopback};
pub use rpc::{RpcOutcome, RpcPair};
pub use sink::{PreparedSink, Sink, REFILL, SINK_DEPTH};
pub use star::Star;

use std::format;
use std::vec::Vec;

use crate::channel::{Channel, ChannelConfig};
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::node::{Node, NodeConfig, NodeError};
use crate::provider::sim::{Sim, SimError};

/// One end of a [`Pair`]: its device context, protection domain and connected channel.
pub struct Side<const DEPTH: usize = 16, const SGES: usize = 4> {
    /// The device (`sim0` for `a`, `sim1` for `b`).
    pub ctx: Context<Sim>,
    /// The protection domain the channel and the test's memory share.
    pub pd: ProtectionDomain<Sim>,
    /// The channel, connected to the other side's.
    pub ch: Channel<Sim, DEPTH, SGES>,
}

/// Two channels on devices `sim0` (`a`) and `sim1` (`b`) of one fabric, connected to each
/// other.
pub struct Pair<const DEPTH: usize = 16, const SGES: usize = 4> {
    /// The fabric, for simulator-only controls (faults, time, the trace).
    pub sim: Sim,
    /// The channel on `sim0`.
    pub a: Side<DEPTH, SGES>,
    /// The channel on `sim1`.
    pub b: Side<DEPTH, SGES>,
}

impl<const DEPTH: usize, const SGES: usize> Pair<DEPTH, SGES> {
    /// Both ends configured by `cfg`, on a new fabric of two devices.
    pub fn connected(cfg: &ChannelConfig) -> Result<Self, Error<SimError>> {
        Self::connected_on(&Sim::with_devices(2), cfg, cfg)
    }

    /// `a` configured by `a_cfg` on `sim0` of `sim`, `b` by `b_cfg` on `sim1`.
    pub fn connected_on(
        sim: &Sim,
        a_cfg: &ChannelConfig,
        b_cfg: &ChannelConfig,
    ) -> Result<Self, Error<SimError>> {
        Self::connect(sim, a_cfg, b_cfg, false)
    }

    /// As [`connected`](Self::connected), with each channel's completion queues on
    /// completion channels of their own, as an async channel needs: make one of each end
    /// with `AsyncChannel::new(p.a.ch)` inside a tokio runtime.
    #[cfg(feature = "tokio")]
    pub fn connected_for_async(cfg: &ChannelConfig) -> Result<Self, Error<SimError>> {
        Self::connect(&Sim::with_devices(2), cfg, cfg, true)
    }

    fn connect(
        sim: &Sim,
        a_cfg: &ChannelConfig,
        b_cfg: &ChannelConfig,
        events: bool,
    ) -> Result<Self, Error<SimError>> {
        let prepare = |name: &str, cfg: &ChannelConfig| -> Result<_, Error<SimError>> {
            let ctx = Context::open(sim, name)?;
            let pd = ctx.alloc_pd()?;
            let ch = match events {
                #[cfg(feature = "tokio")]
                true => Channel::<Sim, DEPTH, SGES>::prepare_with_events(&ctx, &pd, cfg)?,
                _ => Channel::<Sim, DEPTH, SGES>::prepare(&ctx, &pd, cfg)?,
            };
            Ok((ctx, pd, ch))
        };
        let (ca, pa, a) = prepare("sim0", a_cfg)?;
        let (cb, pb, b) = prepare("sim1", b_cfg)?;
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (a, b) = (a.connect(&eb)?, b.connect(&ea)?);
        Ok(Pair {
            sim: sim.clone(),
            a: Side {
                ctx: ca,
                pd: pa,
                ch: a,
            },
            b: Side {
                ctx: cb,
                pd: pb,
                ch: b,
            },
        })
    }
}

/// A rank of a [`World`]: its protection domain and its connected node.
pub type Rank<const PEERS: usize, const DEPTH: usize, const SGES: usize> =
    (ProtectionDomain<Sim>, Node<Sim, PEERS, DEPTH, SGES>);

/// `n` nodes connected in-process, rank `i` on device `sim{i}` of one fabric.
pub struct World<const PEERS: usize, const DEPTH: usize = 16, const SGES: usize = 2> {
    /// The fabric.
    pub sim: Sim,
    /// Every rank, by rank.
    pub ranks: Vec<Rank<PEERS, DEPTH, SGES>>,
}

impl<const PEERS: usize, const DEPTH: usize, const SGES: usize> World<PEERS, DEPTH, SGES> {
    /// `n` ranks configured by `cfg`, on a new fabric of `n` devices.
    pub fn connected(n: usize, cfg: &NodeConfig) -> Result<Self, NodeError<SimError>> {
        Self::connected_on(&Sim::with_devices(n), n, cfg)
    }

    /// `n` ranks on devices `sim0..sim{n-1}` of `sim`.
    pub fn connected_on(
        sim: &Sim,
        n: usize,
        cfg: &NodeConfig,
    ) -> Result<Self, NodeError<SimError>> {
        let mut prepared = Vec::with_capacity(n);
        for r in 0..n {
            let ctx = Context::open(sim, &format!("sim{r}")).map_err(NodeError::Channel)?;
            let pd = ctx.alloc_pd().map_err(NodeError::Channel)?;
            let node = Node::<Sim, PEERS, DEPTH, SGES>::prepare(&ctx, &pd, r, n, cfg)?;
            prepared.push((pd, node));
        }
        // What rank `r` made for each peer, by peer.
        let eps: Vec<Vec<_>> = prepared
            .iter()
            .map(|(_, p)| (0..n).map(|peer| p.endpoints(peer).ok()).collect())
            .collect();
        let mut ranks = Vec::with_capacity(n);
        for (r, (pd, p)) in prepared.into_iter().enumerate() {
            ranks.push((pd, p.connect(|peer| eps[peer][r])?));
        }
        Ok(World {
            sim: sim.clone(),
            ranks,
        })
    }
}
