//! `Node`: rank, world size, a [`MultiChannel`] to its peers, and barriers.
//!
//! A node of rank `r` in a world of `W` ranks holds one RC channel per peer
//! ([`channels`](Node::channels)), for the caller's data and its barriers alike: a barrier
//! message is an RDMA WRITE of 8 bytes into a flag array the receiving node registered
//! (`flags`), so barrier traffic never consumes a user receive and needs no queue pair,
//! receive or completion queue of its own. Its peers are
//! every other rank ([`Node::prepare`], `W` at most `PEERS`) or ranks it chooses
//! ([`Node::prepare_with_peers`], `W` up to 2^32 - 1): with the partners
//! [`barrier::neighbours`] names, a node of a 65,536-rank world runs whole-world
//! dissemination barriers over 31 peers. A barrier blocks
//! ([`Node::barrier_all`]) or is started and polled without waiting
//! ([`Node::start_barrier_all`], [`Node::poll_barrier`]), so one thread can drive many
//! nodes. Barriers run one of the sans-IO algorithms of
//! [`barrier`] (chosen at build time) over any subset of ranks, with a timeout; a barrier
//! that fails poisons the node's barriers, so later calls fail fast instead of hanging.
//! A barrier allocates nothing. Its writes take one slot of the data channel's send ring
//! while in flight; a barrier returns only once they are acknowledged.
//!
//! The peers' channels may share one receive queue (`Node<P, PEERS, DEPTH, SGES, RcOnSrq>`,
//! its slots in [`NodeConfig::receive_slots`]): then a node keeps no receive ring, inbox or
//! queue per peer, and messages from any peer arrive through
//! [`channels`](Node::channels)`().gather_receive` (see [`MultiChannel`]'s SRQ form).
//!
//! The flag array accepts writes from every peer under one remote key (one region, as any
//! RDMA window): every message read from it is checked (its kind, round and the pair's
//! barrier count; anything else is [`NodeError::Protocol`]; a word whose two halves
//! disagree is a write still landing, not yet a message), but a peer that holds the key
//! could write in another peer's slots. Peers are trusted that far, as the ranks of one
//! job are.
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
// A node's flag array is heap memory that must not move: `Node` needs `std`. The barrier
// machines, the configuration and the errors do not.
#[cfg(feature = "std")]
mod flags;
#[cfg(feature = "std")]
mod peers;
#[cfg(feature = "std")]
mod run;
#[cfg(feature = "std")]
mod wire;

use core::fmt;
use core::time::Duration;

use crate::channel::ChannelConfig;
use crate::error::{Error, ErrorKind, ProviderError};
use crate::srq::SlotsConfig;
use barrier::{Algorithm, BarrierError};
#[cfg(feature = "std")]
use {
    crate::channel::wait::Waiter,
    crate::device::{Context, ProtectionDomain},
    crate::mr::RemoteRegion,
    crate::multi_channel::{MultiChannel, PeerTransport, PreparedMultiChannel},
    crate::provider::Provider,
    crate::qp::Endpoint,
    crate::qp::Rc,
    crate::types::AccessFlags,
    barrier::BarrierMachine,
    flags::Flags,
    peers::{PeerMap, PeersRefused, MAX_WORLD},
};

/// Settings of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    /// Settings of every channel. Their queue pairs accept remote writes whatever
    /// `channel.init.access` says: barrier messages are writes.
    pub channel: ChannelConfig,
    /// The barrier algorithm.
    pub algorithm: Algorithm,
    /// How long a barrier waits before it fails and poisons the node; `None` waits forever.
    pub barrier_timeout: Option<Duration>,
    /// The receive slots of a node whose peers share one receive queue
    /// (`Node<P, PEERS, DEPTH, SGES, RcOnSrq>`; see [`MultiChannel::prepare_on_srq`]).
    /// Unused by a node whose channels have receive queues of their own (the default).
    ///
    /// [`MultiChannel::prepare_on_srq`]: crate::MultiChannel::prepare_on_srq
    pub receive_slots: SlotsConfig,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            channel: ChannelConfig::default(),
            algorithm: Algorithm::Dissemination,
            barrier_timeout: Some(Duration::from_secs(10)),
            receive_slots: SlotsConfig::default(),
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
    /// A barrier message that cannot be decoded, or not of the running barrier.
    Protocol {
        /// The sending rank.
        from: usize,
        /// The word read from its slot.
        word: u64,
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
            NodeError::Protocol { from, word } => {
                write!(f, "bad barrier message {word:#018x} from rank {from}")
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
#[cfg(feature = "std")]
pub struct PreparedNode<
    P: Provider,
    const PEERS: usize,
    const DEPTH: usize = 64,
    const SGES: usize = 4,
    T: PeerTransport = Rc,
> {
    map: PeerMap<PEERS>,
    config: NodeConfig,
    data: PreparedMultiChannel<P, PEERS, DEPTH, SGES, T>,
    flags: Flags<P, PEERS>,
}

#[cfg(feature = "std")]
impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    PreparedNode<P, PEERS, DEPTH, SGES, T>
{
    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.map.rank
    }

    /// The ranks this node connects to, in increasing order.
    pub fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        self.map.indices().map(|i| self.map.rank_of(i))
    }

    /// What this node made for rank `peer`: the endpoint of its data channel, and where
    /// `peer` writes its barrier messages (16 bytes of this node's flag array).
    pub fn endpoints(&self, peer: usize) -> Result<(Endpoint, RemoteRegion), NodeError<P::Error>> {
        let i = self
            .map
            .index(peer)
            .ok_or(NodeError::NotConnected { rank: peer })?;
        Ok((self.data.endpoint(i)?, self.flags.window(i)))
    }

    /// Connects to every peer with what `remote(rank)` gives: what that rank's
    /// [`endpoints`](Self::endpoints) made for this node. A barrier window shorter than
    /// 16 bytes is an [`NodeError::EndpointTable`]; nothing is connected then.
    pub fn connect(
        mut self,
        mut remote: impl FnMut(usize) -> Option<(Endpoint, RemoteRegion)>,
    ) -> Result<Node<P, PEERS, DEPTH, SGES, T>, NodeError<P::Error>> {
        crate::trace::span!(
            INFO,
            "node_connect",
            rank = self.map.rank,
            world = self.map.world
        );
        let mut eps = [None; PEERS];
        for i in self.map.indices() {
            let peer = self.map.rank_of(i);
            eps[i] = remote(peer).map(|(data, window)| (data, window, peer));
        }
        for (i, e) in eps.iter().enumerate() {
            if let Some((_, window, peer)) = e {
                self.flags
                    .connect(i, window)
                    .map_err(|why| NodeError::EndpointTable { peer: *peer, why })?;
            }
        }
        let data = self.data.connect(|i| eps[i].map(|e| e.0))?;
        Ok(Node {
            map: self.map,
            barrier: BarrierSettings {
                algorithm: self.config.algorithm,
                timeout: self.config.barrier_timeout,
                flush_grace: self.config.channel.flush_grace,
            },
            data,
            flags: self.flags,
            running: None,
            partners: heapless::Vec::new(),
            pair_epoch: [0; PEERS],
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

/// What a connected node keeps of its [`NodeConfig`] (its channels keep their own
/// settings): a node of a large world is one of many.
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug)]
struct BarrierSettings {
    algorithm: Algorithm,
    timeout: Option<Duration>,
    /// The channels' [`ChannelConfig::flush_grace`], for the node's own waits.
    flush_grace: Duration,
}

/// A rank of a world: data channels to every peer, and barriers. See the module docs.
#[cfg(feature = "std")]
pub struct Node<
    P: Provider,
    const PEERS: usize,
    const DEPTH: usize = 64,
    const SGES: usize = 4,
    T: PeerTransport = Rc,
> {
    map: PeerMap<PEERS>,
    barrier: BarrierSettings,
    /// Dropped before `flags`: no queue pair is left to write the array when it is freed.
    data: MultiChannel<P, PEERS, DEPTH, SGES, T>,
    flags: Flags<P, PEERS>,
    /// The barrier running, from its start until it completes or fails.
    running: Option<BarrierMachine<PEERS>>,
    /// The peer indices the running (or last) barrier exchanges messages with.
    partners: heapless::Vec<u32, PEERS>,
    /// Per peer: barriers taken part in together.
    pair_epoch: [u32; PEERS],
    poisoned: bool,
}

#[cfg(feature = "std")]
impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    Node<P, PEERS, DEPTH, SGES, T>
{
    /// Creates the queue pairs of rank `rank` in a world of `world` ranks, to every other
    /// rank (`world` at most `PEERS`); peer index = rank.
    pub fn prepare(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        rank: usize,
        world: usize,
        config: &NodeConfig,
    ) -> Result<PreparedNode<P, PEERS, DEPTH, SGES, T>, NodeError<P::Error>> {
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
    ) -> Result<PreparedNode<P, PEERS, DEPTH, SGES, T>, NodeError<P::Error>> {
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
    ) -> Result<PreparedNode<P, PEERS, DEPTH, SGES, T>, NodeError<P::Error>> {
        let mut config = *config;
        config.channel.init.access |= AccessFlags::REMOTE_WRITE;
        let (channel, slots) = (&config.channel, &config.receive_slots);
        let data = T::prepare::<P, PEERS, DEPTH, SGES>(ctx, pd, map.indices(), channel, slots)?;
        let flags = Flags::new(pd)?;
        Ok(PreparedNode {
            map,
            config,
            data,
            flags,
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
        self.barrier.algorithm
    }

    /// The data channels to the peers, by peer index ([`peer_index`](Self::peer_index):
    /// the rank, for a node of every rank).
    pub fn channels(&mut self) -> &mut MultiChannel<P, PEERS, DEPTH, SGES, T> {
        &mut self.data
    }

    /// Leaves the world, lingering at most `timeout` in all (plus the grace) until every
    /// message this rank already sent is acknowledged (see [`Channel::close`](crate::Channel::close)); then the
    /// queue pairs are destroyed. Barriers need none of it: a barrier returns only once its
    /// own messages are acknowledged, so a rank may drop its node right after its last
    /// barrier without stranding a peer. `close` is for data sent unpolled.
    pub fn close(mut self, timeout: Duration) -> Result<(), NodeError<P::Error>> {
        let mut waiter = Waiter::new(Some(timeout), self.barrier.flush_grace);
        let drained = self.data.drain_sends(&mut waiter).map_err(|e| e.error);
        // The outcomes of barrier writes of a barrier given up: one that failed was not
        // acknowledged either.
        let mut written = Ok(());
        for p in self.map.indices() {
            let reaped = self.data.peer(p).and_then(|ch| self.flags.reap(ch, p));
            written = written.and(reaped.map(drop));
        }
        drained.and(written).map_err(NodeError::Channel)
    }

    /// Whether a failed barrier poisoned this node's barriers.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }
}
