//! `Node`: rank, world size, a [`MultiChannel`] to its peers, and barriers.
//!
//! A node of rank `r` in a world of `W` ranks holds two RC queue pairs per peer: one for
//! the caller's data ([`channels`](Node::channels)) and one the barriers use, so barrier
//! traffic never meets user receives. A barrier queue pair is lean: no channel, no
//! buffers, its completions on two queues the node polls itself (`ctrl`). Its peers are
//! every other rank ([`Node::prepare`], `W` at most `PEERS`) or ranks it chooses
//! ([`Node::prepare_with_peers`], `W` up to 2^32 - 1): with the partners
//! [`barrier::neighbours`] names, a node of a 65,536-rank world runs whole-world
//! dissemination barriers over 31 peers. A barrier blocks
//! ([`Node::barrier_all`]) or is started and polled without waiting
//! ([`Node::start_barrier_all`], [`Node::poll_barrier`]), so one thread can drive many
//! nodes. Barriers run one of the sans-IO algorithms of
//! [`barrier`] (chosen at build time) over any subset of ranks, with a timeout; a barrier
//! that fails poisons the node's barriers, so later calls fail fast instead of hanging.
//! Barrier messages are zero-length sends with 32 bits of immediate data: no registered
//! memory and no allocation.
//!
//! Endpoints are exchanged out of band: in-process through
//! [`PreparedNode::connect`], or over TCP from a JSON network configuration
//! ([`bootstrap`](crate::bootstrap), std only) with `PreparedNode::connect_tcp`.
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
mod ctrl;
mod peers;
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
use barrier::{Algorithm, BarrierError, BarrierMachine};
use ctrl::{Ctrl, PreparedCtrl};
use peers::{PeerMap, PeersRefused, MAX_WORLD};

/// Send queue depth of a barrier queue pair: a barrier sends a peer at most one message
/// and reaps its sends before it completes, so one is in flight at most. Small, because a
/// node of a large world holds one such queue pair per peer.
const CTRL_DEPTH: usize = 2;
/// Receives kept posted per peer for barrier messages: exactly enough. A barrier brings at
/// most one message per peer, and a peer runs at most one barrier ahead (it cannot finish
/// a barrier this node has not reached), so at most two messages from a peer wait at
/// once: the current barrier's and the next's (kept in `early`). Each is reposted as it is
/// taken.
const CTRL_RECVS: usize = 2;

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
    /// most 2^32 - 1 (and, for a node connected to every rank, at most `PEERS`).
    InvalidRank {
        /// The rank.
        rank: usize,
        /// The world size.
        world: usize,
    },
    /// A node with chosen peers was given more than `PEERS` of them.
    TooManyPeers {
        /// The capacity.
        capacity: usize,
    },
    /// A barrier needs a rank this node has no channel to (a node with chosen peers).
    NotConnected {
        /// The rank.
        rank: usize,
    },
    /// The out-of-band endpoint exchange failed.
    #[cfg(feature = "std")]
    Exchange(crate::bootstrap::ExchangeError),
    /// Connecting through the connection manager failed (with `peer`, where one is to
    /// blame).
    #[cfg(all(feature = "std", unix))]
    Cm {
        /// The peer.
        peer: Option<usize>,
        /// What went wrong.
        error: crate::cm::CmError<E>,
    },
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
            NodeError::InvalidRank { .. }
            | NodeError::TooManyPeers { .. }
            | NodeError::NotConnected { .. } => ErrorKind::InvalidArgument,
            #[cfg(feature = "std")]
            NodeError::Exchange(e) => e.kind(),
            #[cfg(all(feature = "std", unix))]
            NodeError::Cm { error, .. } => error.kind(),
        }
    }
}

impl<E> From<Error<E>> for NodeError<E> {
    fn from(e: Error<E>) -> Self {
        NodeError::Channel(e)
    }
}

impl<E: fmt::Display + fmt::Debug> fmt::Display for NodeError<E> {
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
            NodeError::TooManyPeers { capacity } => {
                write!(f, "more peers than the node's capacity of {capacity}")
            }
            NodeError::NotConnected { rank } => {
                write!(
                    f,
                    "the barrier needs rank {rank}, which this node has no channel to"
                )
            }
            #[cfg(feature = "std")]
            NodeError::Exchange(e) => write!(f, "endpoint exchange: {e}"),
            #[cfg(all(feature = "std", unix))]
            NodeError::Cm {
                peer: Some(p),
                error,
            } => write!(f, "with rank {p}: {error}"),
            #[cfg(all(feature = "std", unix))]
            NodeError::Cm { peer: None, error } => error.fmt(f),
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
    map: PeerMap<PEERS>,
    config: NodeConfig,
    data: PreparedMultiChannel<P, PEERS, DEPTH, SGES>,
    ctrl: PreparedCtrl<P, PEERS>,
}

impl<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    PreparedNode<P, PEERS, DEPTH, SGES>
{
    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.map.rank
    }

    /// The ranks this node connects to, in increasing order.
    pub fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        self.map.indices().map(|i| self.map.rank_of(i))
    }

    /// The endpoints (data, barrier) this node made for rank `peer`.
    pub fn endpoints(&self, peer: usize) -> Result<(Endpoint, Endpoint), NodeError<P::Error>> {
        let i = self
            .map
            .index(peer)
            .ok_or(NodeError::NotConnected { rank: peer })?;
        let ctrl = self
            .ctrl
            .endpoint(i)
            .ok_or(NodeError::NotConnected { rank: peer })?;
        Ok((self.data.endpoint(i)?, ctrl))
    }

    /// Connects to every peer with the endpoints `remote(rank)` gives: the ones that rank
    /// made for this node. Then posts the barrier receives.
    pub fn connect(
        self,
        mut remote: impl FnMut(usize) -> Option<(Endpoint, Endpoint)>,
    ) -> Result<Node<P, PEERS, DEPTH, SGES>, NodeError<P::Error>> {
        crate::trace::span!(
            INFO,
            "node_connect",
            rank = self.map.rank,
            world = self.map.world
        );
        let mut eps = [None; PEERS];
        for i in self.map.indices() {
            eps[i] = remote(self.map.rank_of(i));
        }
        let data = self.data.connect(|i| eps[i].map(|e| e.0))?;
        let ctrl = self
            .ctrl
            .connect(|i| eps[i].map(|e| e.1), &self.config.channel)?;
        Ok(Node {
            map: self.map,
            config: self.config,
            data,
            ctrl,
            running: None,
            partners: heapless::Vec::new(),
            pair_epoch: [0; PEERS],
            early: [None; PEERS],
            poisoned: false,
        })
    }
}

#[cfg(all(feature = "std", unix))]
mod cm;
#[cfg(feature = "std")]
mod tables;
#[cfg(all(feature = "std", unix))]
pub use cm::{CmConnected, CmLinks};
#[cfg(feature = "std")]
pub use tables::Connected;

/// A rank of a world: data channels to every peer, and barriers. See the module docs.
pub struct Node<P: Provider, const PEERS: usize, const DEPTH: usize = 64, const SGES: usize = 4> {
    map: PeerMap<PEERS>,
    config: NodeConfig,
    data: MultiChannel<P, PEERS, DEPTH, SGES>,
    ctrl: Ctrl<P, PEERS>,
    /// The barrier running, from its start until it completes or fails.
    running: Option<BarrierMachine<PEERS>>,
    /// The peer indices the running (or last) barrier exchanges messages with.
    partners: heapless::Vec<u32, PEERS>,
    /// Per peer: barriers taken part in together.
    pair_epoch: [u32; PEERS],
    /// Per peer: a message for the next barrier with that peer, received early.
    early: [Option<barrier::Msg>; PEERS],
    poisoned: bool,
}

impl<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    Node<P, PEERS, DEPTH, SGES>
{
    /// Creates the queue pairs of rank `rank` in a world of `world` ranks, to every other
    /// rank (`world` at most `PEERS`); peer index = rank.
    pub fn prepare(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        rank: usize,
        world: usize,
        config: &NodeConfig,
    ) -> Result<PreparedNode<P, PEERS, DEPTH, SGES>, NodeError<P::Error>> {
        if rank >= world || world > PEERS || world > MAX_WORLD {
            return Err(NodeError::InvalidRank { rank, world });
        }
        Self::prepare_map(ctx, pd, PeerMap::full(rank, world), config)
    }

    /// Creates the queue pairs of rank `rank` in a world of `world` ranks (at most 2^32 - 1)
    /// to the ranks `peers` only (any order, repeats ignored, at most `PEERS`); peer index
    /// = position in increasing rank order ([`Node::peer_index`]). Barriers work among
    /// ranks whose messages stay between connected pairs: with the peers
    /// [`barrier::neighbours`] names for this node's algorithm, whole-world barriers
    /// ([`barrier_all`](Node::barrier_all)) work, which is how a world of 65,536 nodes runs
    /// dissemination with 31 peers each.
    ///
    /// ```
    /// use zverbs::node::{barrier::{neighbours, Algorithm}, Node, NodeConfig};
    /// use zverbs::provider::sim::Sim;
    /// use zverbs::Context;
    /// let (sim, world, rank) = (Sim::with_devices(1), 1 << 16, 5);
    /// let ctx = Context::open(&sim, "sim0").unwrap();
    /// let pd = ctx.alloc_pd().unwrap();
    /// let cfg = NodeConfig { algorithm: Algorithm::Dissemination, ..NodeConfig::default() };
    /// let partners = neighbours(cfg.algorithm, rank, world);
    /// let node = Node::<Sim, 32, 4, 1>::prepare_with_peers(&ctx, &pd, rank, world, partners, &cfg)
    ///     .unwrap();
    /// assert_eq!(node.peers().count(), 31);
    /// assert!(node.endpoints(6).is_ok() && node.endpoints(8).is_err()); // 5 + 1; 5 ± 3 is none
    /// ```
    pub fn prepare_with_peers(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        rank: usize,
        world: usize,
        peers: impl IntoIterator<Item = usize>,
        config: &NodeConfig,
    ) -> Result<PreparedNode<P, PEERS, DEPTH, SGES>, NodeError<P::Error>> {
        if rank >= world || world > MAX_WORLD {
            return Err(NodeError::InvalidRank { rank, world });
        }
        let map = PeerMap::chosen(rank, world, peers).map_err(|e| match e {
            PeersRefused::Rank(rank) => NodeError::InvalidRank { rank, world },
            PeersRefused::TooMany => NodeError::TooManyPeers { capacity: PEERS },
        })?;
        Self::prepare_map(ctx, pd, map, config)
    }

    fn prepare_map(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        map: PeerMap<PEERS>,
        config: &NodeConfig,
    ) -> Result<PreparedNode<P, PEERS, DEPTH, SGES>, NodeError<P::Error>> {
        let data = MultiChannel::prepare(ctx, pd, map.indices(), &config.channel)?;
        let ctrl = PreparedCtrl::prepare(ctx, pd, map.indices(), &config.channel)?;
        Ok(PreparedNode {
            map,
            config: *config,
            data,
            ctrl,
        })
    }

    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.map.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.map.world
    }

    /// The peer index of rank `rank` in [`channels`](Self::channels), if this node has a
    /// channel to it: the rank itself for a node of every rank ([`Node::prepare`]).
    pub fn peer_index(&self, rank: usize) -> Option<usize> {
        self.map.index(rank)
    }

    /// The ranks this node has channels to, in increasing order.
    pub fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        self.map.indices().map(|i| self.map.rank_of(i))
    }

    /// The barrier algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.config.algorithm
    }

    /// The data channels to the peers, by peer index ([`peer_index`](Self::peer_index):
    /// the rank, for a node of every rank).
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
        let data = self.data.drain_sends(&mut waiter).map_err(|e| e.error);
        let ctrl = self.ctrl.drain(&mut waiter);
        data.and(ctrl).map_err(NodeError::Channel)
    }

    /// Whether a failed barrier poisoned this node's barriers.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }
}
