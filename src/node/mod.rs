//! `Node`: rank, world size, a [`MultiChannel`] to every other rank, and barriers.
//!
//! A node of rank `r` in a world of `W` ranks holds two RC queue pairs per peer: one for
//! the caller's data ([`channels`](Node::channels)) and one the barriers use, so barrier
//! traffic never meets user receives. Barriers run one of the sans-IO algorithms of
//! [`barrier`] (chosen at build time) over any subset of ranks, with a timeout; a barrier
//! that fails poisons the node's barriers, so later calls fail fast instead of hanging.
//! Barrier messages are zero-length sends with 32 bits of immediate data: no registered
//! memory and no allocation.
//!
//! Endpoints are exchanged out of band: in-process through
//! [`PreparedNode::connect`], or over TCP from a JSON network configuration
//! ([`exchange`], std only) with `PreparedNode::connect_tcp`.
//!
//! ```
//! use zverbs::node::{barrier::Algorithm, Node, NodeConfig};
//! use zverbs::provider::sim::Sim;
//! use zverbs::Context;
//! let sim = Sim::with_devices(3);
//! let cfg = NodeConfig { algorithm: Algorithm::Dissemination, ..NodeConfig::default() };
//! let ctx: Vec<_> = (0..3).map(|i| Context::open(&sim, &format!("sim{i}")).unwrap()).collect();
//! let pd: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
//! let prepared: Vec<_> = (0..3)
//!     .map(|r| Node::<Sim, 4>::prepare(&ctx[r], &pd[r], r, 3, &cfg).unwrap())
//!     .collect();
//! // Each rank needs, from each peer, the endpoints that peer made for it.
//! let eps: Vec<Vec<_>> = prepared
//!     .iter()
//!     .map(|p| (0..3).map(|peer| p.endpoints(peer).ok()).collect())
//!     .collect();
//! let nodes: Vec<_> = prepared
//!     .into_iter()
//!     .enumerate()
//!     .map(|(r, p)| p.connect(|peer| eps[peer][r]).unwrap())
//!     .collect();
//! std::thread::scope(|t| {
//!     for mut node in nodes {
//!         t.spawn(move || {
//!             let r = node.rank();
//!             node.barrier_all().unwrap();
//!             node.barrier(&[0, 2]).unwrap_or_else(|e| assert_eq!(r, 1, "{e}"));
//!         });
//!     }
//! });
//! ```

pub mod barrier;
#[cfg(feature = "std")]
pub mod exchange;
mod run;
mod wire;

use core::fmt;
use core::time::Duration;

use crate::channel::wait::Waiter;
use crate::channel::ChannelConfig;
use crate::device::{Context, ProtectionDomain};
use crate::error::{Error, ErrorKind, ProviderError};
use crate::multi_channel::{MultiChannel, PreparedMultiChannel};
use crate::provider::Provider;
use crate::qp::Endpoint;
use barrier::{Algorithm, BarrierError};

/// Work requests in flight per peer on the barrier queue pairs.
const CTRL_DEPTH: usize = 8;
/// Receives kept posted per peer for barrier messages. At most one message per peer per
/// barrier, and a peer runs at most one barrier ahead: two would do; four leaves slack.
const CTRL_RECVS: u64 = 4;

/// Settings of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    /// Settings of every channel (data and barrier).
    pub channel: ChannelConfig,
    /// The barrier algorithm.
    pub algorithm: Algorithm,
    /// How long a barrier waits before it fails and poisons the node; `None` waits forever.
    pub barrier_timeout: Option<Duration>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            channel: ChannelConfig::default(),
            algorithm: Algorithm::Dissemination,
            barrier_timeout: Some(Duration::from_secs(10)),
        }
    }
}

/// Why a node call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum NodeError<E> {
    /// A channel call failed.
    Channel(Error<E>),
    /// The barrier's participants were refused, or a peer sent a message the algorithm
    /// does not allow (the node is poisoned then).
    Barrier(BarrierError),
    /// A barrier message that cannot be decoded, or from a barrier neither current nor next.
    Protocol {
        /// The sending rank.
        from: usize,
        /// The immediate data received.
        imm: u32,
    },
    /// The barrier did not complete in time; the node is poisoned.
    Timeout {
        /// How many ranks took part.
        participants: usize,
    },
    /// An earlier barrier failed; barriers on this node fail fast from now on.
    Poisoned,
    /// A rank or world size out of range: `rank` must be below `world`, and `world` at
    /// most the capacity `PEERS` (and 65536).
    InvalidRank {
        /// The rank.
        rank: usize,
        /// The world size.
        world: usize,
    },
    /// The out-of-band endpoint exchange failed.
    #[cfg(feature = "std")]
    Exchange(exchange::ExchangeError),
    /// A peer's endpoint table is malformed.
    EndpointTable {
        /// The peer whose table it is.
        peer: usize,
        /// What is wrong.
        why: &'static str,
    },
}

impl<E: ProviderError> NodeError<E> {
    /// What the error means in the crate-wide classification.
    pub fn kind(&self) -> ErrorKind {
        match self {
            NodeError::Channel(e) => e.kind(),
            NodeError::Barrier(b) => b.kind(),
            NodeError::Protocol { .. } | NodeError::EndpointTable { .. } => ErrorKind::Other,
            NodeError::Timeout { .. } => ErrorKind::Timeout,
            NodeError::Poisoned => ErrorKind::InvalidState,
            NodeError::InvalidRank { .. } => ErrorKind::InvalidArgument,
            #[cfg(feature = "std")]
            NodeError::Exchange(e) => e.kind(),
        }
    }
}

impl<E> From<Error<E>> for NodeError<E> {
    fn from(e: Error<E>) -> Self {
        NodeError::Channel(e)
    }
}

impl<E: fmt::Display> fmt::Display for NodeError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Channel(e) => e.fmt(f),
            NodeError::Barrier(b) => write!(f, "barrier: {b}"),
            NodeError::Protocol { from, imm } => {
                write!(f, "bad barrier message {imm:#010x} from rank {from}")
            }
            NodeError::Timeout { participants } => {
                write!(f, "barrier among {participants} ranks timed out")
            }
            NodeError::Poisoned => f.write_str("an earlier barrier failed; the node is poisoned"),
            NodeError::InvalidRank { rank, world } => {
                write!(f, "rank {rank} in a world of {world} is out of range")
            }
            #[cfg(feature = "std")]
            NodeError::Exchange(e) => write!(f, "endpoint exchange: {e}"),
            NodeError::EndpointTable { peer, why } => {
                write!(f, "endpoint table from rank {peer}: {why}")
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> core::error::Error for NodeError<E> {}

/// A node whose queue pairs exist but are not connected. Hand each peer its
/// [`endpoints`](Self::endpoints), then [`connect`](Self::connect).
pub struct PreparedNode<
    P: Provider,
    const PEERS: usize,
    const DEPTH: usize = 64,
    const SGES: usize = 4,
> {
    rank: usize,
    world: usize,
    config: NodeConfig,
    data: PreparedMultiChannel<P, PEERS, DEPTH, SGES>,
    ctrl: PreparedMultiChannel<P, PEERS, CTRL_DEPTH, 1>,
}

impl<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    PreparedNode<P, PEERS, DEPTH, SGES>
{
    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The endpoints (data, barrier) this node made for `peer`.
    pub fn endpoints(&self, peer: usize) -> Result<(Endpoint, Endpoint), NodeError<P::Error>> {
        Ok((self.data.endpoint(peer)?, self.ctrl.endpoint(peer)?))
    }

    /// Connects to every peer with the endpoints `remote(peer)` gives: the ones that peer
    /// made for this node. Then posts the barrier receives.
    pub fn connect(
        self,
        mut remote: impl FnMut(usize) -> Option<(Endpoint, Endpoint)>,
    ) -> Result<Node<P, PEERS, DEPTH, SGES>, NodeError<P::Error>> {
        let mut eps = [None; PEERS];
        for (p, ep) in eps.iter_mut().enumerate().take(self.world) {
            if p != self.rank {
                *ep = remote(p);
            }
        }
        let data = self.data.connect(|p| eps[p].map(|e| e.0))?;
        let ctrl = self.ctrl.connect(|p| eps[p].map(|e| e.1))?;
        Node::start(self.rank, self.world, self.config, data, ctrl)
    }
}

#[cfg(feature = "std")]
mod tables;
#[cfg(feature = "std")]
pub use tables::Connected;

/// A rank of a world: data channels to every peer, and barriers. See the module docs.
pub struct Node<P: Provider, const PEERS: usize, const DEPTH: usize = 64, const SGES: usize = 4> {
    rank: usize,
    world: usize,
    config: NodeConfig,
    data: MultiChannel<P, PEERS, DEPTH, SGES>,
    ctrl: MultiChannel<P, PEERS, CTRL_DEPTH, 1>,
    /// Per peer: barriers taken part in together.
    pair_epoch: [u32; PEERS],
    /// Per peer: the oldest barrier receive still posted (`CTRL_RECVS` are posted).
    recv_next: [u64; PEERS],
    /// Per peer: barrier sends not yet reaped, `first..next`.
    sends: [(u64, u64); PEERS],
    /// Per peer: a message for the next barrier with that peer, received early.
    early: [Option<barrier::Msg>; PEERS],
    poisoned: bool,
}

impl<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    Node<P, PEERS, DEPTH, SGES>
{
    /// Creates the queue pairs of rank `rank` in a world of `world` ranks.
    pub fn prepare(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        rank: usize,
        world: usize,
        config: &NodeConfig,
    ) -> Result<PreparedNode<P, PEERS, DEPTH, SGES>, NodeError<P::Error>> {
        if rank >= world || world > PEERS || world > usize::from(u16::MAX) + 1 {
            return Err(NodeError::InvalidRank { rank, world });
        }
        let peers = (0..world).filter(|&p| p != rank);
        let data = MultiChannel::prepare(ctx, pd, peers.clone(), &config.channel)?;
        let ctrl = MultiChannel::prepare(ctx, pd, peers, &config.channel)?;
        Ok(PreparedNode {
            rank,
            world,
            config: *config,
            data,
            ctrl,
        })
    }

    fn start(
        rank: usize,
        world: usize,
        config: NodeConfig,
        data: MultiChannel<P, PEERS, DEPTH, SGES>,
        mut ctrl: MultiChannel<P, PEERS, CTRL_DEPTH, 1>,
    ) -> Result<Self, NodeError<P::Error>> {
        let mut recv_next = [0; PEERS];
        for (p, next) in recv_next.iter_mut().enumerate().take(world) {
            if p == rank {
                continue;
            }
            let ch = ctrl.peer(p)?;
            for i in 0..CTRL_RECVS {
                let seq = ch.post_recv_seq(core::iter::empty())?;
                if i == 0 {
                    *next = seq;
                }
            }
        }
        Ok(Node {
            rank,
            world,
            config,
            data,
            ctrl,
            pair_epoch: [0; PEERS],
            recv_next,
            sends: [(0, 0); PEERS],
            early: [None; PEERS],
            poisoned: false,
        })
    }

    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The barrier algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.config.algorithm
    }

    /// The data channels to every other rank (peer index = rank).
    pub fn channels(&mut self) -> &mut MultiChannel<P, PEERS, DEPTH, SGES> {
        &mut self.data
    }

    /// Leaves the world, lingering at most `timeout` in all (plus the grace) until every
    /// message this rank already sent is acknowledged (see [`Channel::close`](crate::Channel::close)); then the
    /// queue pairs are destroyed. Barriers need none of it: a barrier returns only once its
    /// own messages are acknowledged, so a rank may drop its node right after its last
    /// barrier without stranding a peer. `close` is for data sent unpolled.
    pub fn close(mut self, timeout: Duration) -> Result<(), NodeError<P::Error>> {
        let mut waiter = Waiter::new(Some(timeout), self.config.channel.flush_grace);
        let data = self.data.drain_sends(&mut waiter);
        let ctrl = self.ctrl.drain_sends(&mut waiter);
        data.and(ctrl).map_err(|e| NodeError::Channel(e.error))
    }

    /// Whether a failed barrier poisoned this node's barriers.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }
}
