//! `MultiChannel`: one reliable-connected [`Channel`] per peer, over one protection domain.
//!
//! `PEERS` is the capacity: peers are indexed `0..PEERS`, and any subset of the indices may be set
//! up (a node's own rank is simply left out). A region registered once in the shared
//! protection domain serves every peer. Per-peer work goes through
//! [`peer`](MultiChannel::peer), which gives the peer's [`Channel`] with all of its blocking,
//! scoped and unpolled calls. The collective calls post to every peer named first and then
//! wait for all, so the transfers overlap:
//!
//! | call | what |
//! |---|---|
//! | [`scatter_send`](MultiChannel::scatter_send) | one buffer per peer, sent |
//! | [`gather_receive`](MultiChannel::gather_receive) | one receive per peer |
//! | [`scatter_write`](MultiChannel::scatter_write) | one buffer per peer, written to its remote region |
//! | [`gather_read`](MultiChannel::gather_read) | one remote region per peer, read into a local buffer |
//! | [`multicast_send`](MultiChannel::multicast_send) | the same buffer to a chosen set of peers |
//!
//! These are blocking calls. A [`scope`](MultiChannel::scope) posts any mix of per-peer work
//! (and [`multicast_send`](MultiChannel::multicast_send)'s scoped form), all complete before
//! it returns. At the unpolled level work is posted peer by peer (`unsafe`
//! [`post_send_unpolled`](MultiChannel::post_send_unpolled) returning a [`PeerPending`]);
//! there is no unpolled collective.
//! Nothing here allocates after setup. A peer index out of range or not set up is
//! [`Error::NoSuchPeer`].
//!
//! The peers may instead share one receive queue (`MultiChannel<P, PEERS, DEPTH, SGES,
//! RcOnSrq>`, made by [`prepare_on_srq`](MultiChannel::prepare_on_srq)): their channels
//! keep no receive state of their own, and messages from any peer land in receive slots
//! the multi-channel owns ([`gather_receive`](MultiChannel::gather_receive) returns
//! [`Received`]s). See `on_srq.rs`.
//!
//! ```
//! use zverbs::provider::sim::Sim;
//! use zverbs::{ChannelConfig, Context, MultiChannel};
//! let sim = Sim::with_devices(3);
//! let ctx: Vec<_> = (0..3).map(|i| Context::open(&sim, &format!("sim{i}")).unwrap()).collect();
//! let pd: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
//! let cfg = ChannelConfig::default();
//! // Rank 0 talks to ranks 1 and 2; they talk to rank 0.
//! let root = MultiChannel::<Sim, 4>::prepare(&ctx[0], &pd[0], [1, 2], &cfg).unwrap();
//! let l1 = MultiChannel::<Sim, 4>::prepare(&ctx[1], &pd[1], [0], &cfg).unwrap();
//! let l2 = MultiChannel::<Sim, 4>::prepare(&ctx[2], &pd[2], [0], &cfg).unwrap();
//! let (e1, e2) = (l1.endpoint(0).unwrap(), l2.endpoint(0).unwrap());
//! let (r1, r2) = (root.endpoint(1).unwrap(), root.endpoint(2).unwrap());
//! let mut root = root.connect(|p| [None, Some(e1), Some(e2)].get(p).copied().flatten()).unwrap();
//! let mut l1 = l1.connect(|p| (p == 0).then_some(r1)).unwrap();
//! let mut l2 = l2.connect(|p| (p == 0).then_some(r2)).unwrap();
//!
//! let mut data = *b"to-one..to-two..";
//! let data = pd[0].register(&mut data).unwrap();
//! let (mut in1, mut in2) = ([0u8; 8], [0u8; 8]);
//! let mut in1 = pd[1].register(&mut in1).unwrap();
//! let mut in2 = pd[2].register(&mut in2).unwrap();
//! std::thread::scope(|t| {
//!     t.spawn(|| l1.peer(0).unwrap().receive([in1.slice_mut(..).unwrap()]).unwrap());
//!     t.spawn(|| l2.peer(0).unwrap().receive([in2.slice_mut(..).unwrap()]).unwrap());
//!     let (one, two) = data.slice(..).unwrap().split_at(8).unwrap();
//!     root.scatter_send([(1, one), (2, two)]).unwrap();
//! });
//! assert_eq!(in1.as_slice(), b"to-one..");
//! assert_eq!(in2.as_slice(), b"to-two..");
//! ```
//!
//! Map: here the prepared and connected types, `Posted`, set-up and access (`prepare`,
//! `peer`, `channels_mut`) and the collectives (`scatter_*`, `gather_*`,
//! `multicast_send`) over one `collective` and `wait_all`, which share the
//! post-all-then-wait-all machinery; the outcomes ([`PeerError`]) in `outcome.rs`; the
//! unpolled level (`post_*_unpolled`, `wait`, [`PeerPending`]) in `unpolled.rs`; the
//! scope in `scope.rs`; the peers on one SRQ in `on_srq.rs` and `transport.rs`.

#[cfg(feature = "std")]
mod on_srq;
mod outcome;
mod scope;
mod transport;
mod unpolled;

#[cfg(feature = "std")]
pub use on_srq::Received;
pub use outcome::{Outcome, PeerError};
pub use scope::MultiScope;
pub use transport::PeerTransport;
pub use unpolled::PeerPending;

use crate::channel::wait::Waiter;
use crate::channel::Queue;
use crate::channel::{Channel, ChannelConfig, PreparedChannel};
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::mr::{LocalSlice, LocalSliceMut, RemoteRegion};
use crate::provider::Provider;
use crate::qp::{Endpoint, Rc};
use crate::ring::Completion;
use crate::types::{SendFlags, SendOp, Sge};
use core::time::Duration;

/// Channels created for a set of peers, not yet connected. Hand each
/// [`endpoint`](Self::endpoint) to its peer, then [`connect`](Self::connect).
pub struct PreparedMultiChannel<
    P: Provider,
    const PEERS: usize,
    const DEPTH: usize = 64,
    const SGES: usize = 4,
    T: PeerTransport = Rc,
> {
    peers: Slots<PreparedChannel<P, DEPTH, SGES, T>, PEERS>,
    /// Where the peers' receives go besides their own queues: nothing, or the shared
    /// receive queue and its slots (dropped after the queue pairs on it).
    receives: T::Receives<P>,
}

impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    PreparedMultiChannel<P, PEERS, DEPTH, SGES, T>
{
    /// The endpoint of the channel for `peer`.
    pub fn endpoint(&self, peer: usize) -> Result<Endpoint, Error<P::Error>> {
        match self.peers.get(peer) {
            Some(Some(ch)) => Ok(ch.endpoint()),
            _ => Err(no_such_peer::<P, PEERS>(peer)),
        }
    }

    /// Takes what a connection manager decided for the channel of `peer` (see
    /// [`QueuePair::take_path`](crate::qp::QueuePair)).
    #[cfg(all(feature = "std", unix))]
    pub(crate) fn take_path(&mut self, peer: usize, sgid_index: u8, psn: u32) {
        if let Some(Some(ch)) = self.peers.get_mut(peer) {
            ch.take_path(sgid_index, psn);
        }
    }

    /// The peers set up, in increasing order.
    pub fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..PEERS).filter(|&p| self.peers[p].is_some())
    }

    /// Connects every channel to the endpoint `remote(peer)` gives for it. A peer for which
    /// it gives `None` is an [`Error::NoSuchPeer`]; nothing is connected then.
    pub fn connect(
        mut self,
        mut remote: impl FnMut(usize) -> Option<Endpoint>,
    ) -> Result<MultiChannel<P, PEERS, DEPTH, SGES, T>, Error<P::Error>> {
        crate::trace::span!(DEBUG, "multi_channel_connect", capacity = PEERS);
        let mut eps = [None; PEERS];
        for (p, ep) in eps.iter_mut().enumerate() {
            if self.peers[p].is_some() {
                *ep = Some(remote(p).ok_or(no_such_peer::<P, PEERS>(p))?);
            }
        }
        let mut peers = new_slots::<Channel<P, DEPTH, SGES, T>, PEERS>();
        for (p, slot) in peers.iter_mut().enumerate() {
            if let (Some(ch), Some(ep)) = (self.peers[p].take(), eps[p]) {
                *slot = Some(ch.connect(&ep)?);
            }
        }
        Ok(MultiChannel {
            peers,
            outcomes: new_slots(),
            receives: self.receives,
        })
    }
}

/// One RC channel per peer; see the module docs. `PEERS` peers at most, `DEPTH` work requests in
/// flight per direction per peer, `SGES` scatter/gather entries per request.
pub struct MultiChannel<
    P: Provider,
    const PEERS: usize,
    const DEPTH: usize = 64,
    const SGES: usize = 4,
    T: PeerTransport = Rc,
> {
    peers: Slots<Channel<P, DEPTH, SGES, T>, PEERS>,
    /// Per peer, the outcome of the last collective or scope that named it.
    outcomes: Slots<Outcome<P::Error>, PEERS>,
    /// Nothing, or the shared receive queue and its slots (dropped after the channels).
    #[cfg_attr(not(feature = "std"), allow(dead_code))]
    receives: T::Receives<P>,
}

/// One optional channel per peer. Channels hold their rings inline (kilobytes each), so
/// with `std` the slots live on the heap, allocated once at setup, and a multi-channel stays
/// small to move; without `std` they are inline.
#[cfg(feature = "std")]
pub(crate) type Slots<T, const PEERS: usize> = std::boxed::Box<[Option<T>; PEERS]>;
#[cfg(not(feature = "std"))]
pub(crate) type Slots<T, const PEERS: usize> = [Option<T>; PEERS];

pub(crate) fn new_slots<T, const PEERS: usize>() -> Slots<T, PEERS> {
    #[cfg(feature = "std")]
    {
        // Built element by element: never a whole array on the stack.
        let v: std::vec::Vec<Option<T>> = (0..PEERS).map(|_| None).collect();
        match v.into_boxed_slice().try_into() {
            Ok(b) => b,
            Err(_) => unreachable!("exactly PEERS elements"),
        }
    }
    #[cfg(not(feature = "std"))]
    {
        core::array::from_fn(|_| None)
    }
}

pub(crate) fn no_such_peer<P: Provider, const PEERS: usize>(peer: usize) -> Error<P::Error> {
    Error::NoSuchPeer {
        peer,
        capacity: PEERS,
    }
}

/// A completion queue shared by `count` channels of depth `DEPTH`, with events when the
/// channels' wait policy sleeps.
#[cfg(feature = "std")]
pub(crate) fn shared_queue<P: Provider, const DEPTH: usize>(
    ctx: &Context<P>,
    config: &ChannelConfig,
    count: usize,
) -> Result<std::sync::Arc<crate::dispatch::SharedCompletionQueue<P>>, Error<P::Error>> {
    use crate::dispatch::SharedCompletionQueue;
    let depth =
        u32::try_from(DEPTH).map_err(|_| Error::InvalidAttribute("channel capacity too large"))?;
    let create = if config.wait == crate::channel::WaitPolicy::SpinSleep {
        SharedCompletionQueue::create_with_events
    } else {
        SharedCompletionQueue::create
    };
    Ok(std::sync::Arc::new(create(ctx, count, depth)?))
}

/// Which of the indices `0..PEERS` `peers` names; each at most once.
pub(crate) fn named_peers<P: Provider, const PEERS: usize>(
    peers: impl IntoIterator<Item = usize>,
) -> Result<[bool; PEERS], Error<P::Error>> {
    let mut named = [false; PEERS];
    for p in peers {
        let slot = named.get_mut(p).ok_or(no_such_peer::<P, PEERS>(p))?;
        if *slot {
            return Err(Error::InvalidAttribute("peer index listed twice"));
        }
        *slot = true;
    }
    Ok(named)
}

/// Sequence numbers posted on one peer's channel by one collective call: `first..=last`.
#[derive(Clone, Copy)]
pub(crate) struct Span {
    first: u64,
    last: u64,
}

/// What one collective call posted, per peer and direction.
pub(crate) struct Posted<const PEERS: usize> {
    send: [Option<Span>; PEERS],
    recv: [Option<Span>; PEERS],
}

impl<const PEERS: usize> Posted<PEERS> {
    pub(crate) const fn new() -> Self {
        Posted {
            send: [None; PEERS],
            recv: [None; PEERS],
        }
    }

    pub(crate) fn record(&mut self, peer: usize, queue: Queue, seq: u64) {
        let spans = match queue {
            Queue::Send => &mut self.send,
            Queue::Recv => &mut self.recv,
        };
        let span = spans[peer].get_or_insert(Span {
            first: seq,
            last: seq,
        });
        span.last = seq;
    }
}

impl<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    MultiChannel<P, PEERS, DEPTH, SGES>
{
    /// Creates a channel (a queue pair in INIT) for each peer index in `peers`, all in
    /// protection domain `pd`. Indices must be below `PEERS` and distinct. With
    /// [`CqLayout::Shared`](crate::channel::CqLayout) (the default) every channel's sends
    /// complete on one shared queue and its receives on another, sized for all of them
    /// (see [`crate::dispatch`]); with `PerChannel`, each has two of its own.
    pub fn prepare(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        peers: impl IntoIterator<Item = usize>,
        config: &ChannelConfig,
    ) -> Result<PreparedMultiChannel<P, PEERS, DEPTH, SGES>, Error<P::Error>> {
        let named = named_peers::<P, PEERS>(peers)?;
        let mut slots = new_slots::<PreparedChannel<P, DEPTH, SGES>, PEERS>();
        #[cfg_attr(not(feature = "std"), allow(unused_variables))]
        let count = named.iter().filter(|&&n| n).count();
        // One configuration for every peer's channel.
        let shared = crate::channel::config_of(config);
        #[cfg(feature = "std")]
        if config.completion_queues == crate::channel::CqLayout::Shared && count > 0 {
            let send = shared_queue::<P, DEPTH>(ctx, config, count)?;
            let recv = shared_queue::<P, DEPTH>(ctx, config, count)?;
            for (slot, _) in slots.iter_mut().zip(named).filter(|(_, n)| *n) {
                let c = shared.clone();
                *slot = Some(Channel::prepare_shared_with(ctx, pd, c, &send, &recv)?);
            }
            return Ok(PreparedMultiChannel {
                peers: slots,
                receives: (),
            });
        }
        for (slot, _) in slots.iter_mut().zip(named).filter(|(_, n)| *n) {
            // An `Arc` with `std`, the configuration itself without.
            #[allow(clippy::clone_on_copy)]
            let c = shared.clone();
            *slot = Some(Channel::prepare_with(ctx, pd, c)?);
        }
        Ok(PreparedMultiChannel {
            peers: slots,
            receives: (),
        })
    }

    /// Posts one receive per `(peer, slice)` and waits for all. Returns each peer's
    /// completion (length, immediate data) at its index. A peer named twice is refused.
    pub fn gather_receive<'a>(
        &mut self,
        recvs: impl IntoIterator<Item = (usize, LocalSliceMut<'a>)>,
    ) -> Result<[Option<Completion>; PEERS], PeerError<P::Error>> {
        // At most one receive per peer: check them all before posting any.
        let mut sges: [Option<Sge>; PEERS] = [None; PEERS];
        for (p, s) in recvs {
            let error = match sges.get_mut(p) {
                _ if !self.has_peer(p) => no_such_peer::<P, PEERS>(p),
                None => no_such_peer::<P, PEERS>(p),
                Some(Some(_)) => Error::InvalidAttribute("gather_receive names a peer twice"),
                Some(slot) => {
                    *slot = Some(s.sge());
                    continue;
                }
            };
            return Err(self.peer_error(p, error));
        }
        self.collective(
            (0..PEERS).filter_map(|p| sges[p].map(|sge| (p, Queue::Recv, sge, SendOp::Send, None))),
        )
    }
}

impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    MultiChannel<P, PEERS, DEPTH, SGES, T>
{
    /// Every peer's channel, with its index, for driving them from several threads at once
    /// (each thread its own peers' channels: `std::thread::scope` and a split of this
    /// iterator). Channels on shared completion queues route each other's completions
    /// through the lock-free dispatcher; none waits for another.
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{Channel, ChannelConfig, Context, MultiChannel};
    /// let sim = Sim::with_devices(3);
    /// let ctx: Vec<_> = (0..3).map(|i| Context::open(&sim, &format!("sim{i}")).unwrap()).collect();
    /// let pd: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
    /// let cfg = ChannelConfig::default();
    /// let root = MultiChannel::<Sim, 3>::prepare(&ctx[0], &pd[0], [1, 2], &cfg).unwrap();
    /// let leaves: Vec<_> = (1..3).map(|i| Channel::<Sim>::prepare(&ctx[i], &pd[i], &cfg).unwrap()).collect();
    /// let eps: Vec<_> = leaves.iter().map(|l| l.endpoint()).collect();
    /// let (r1, r2) = (root.endpoint(1).unwrap(), root.endpoint(2).unwrap());
    /// let mut root = root.connect(|p| eps.get(p.wrapping_sub(1)).copied()).unwrap();
    /// let mut leaves: Vec<_> = leaves.into_iter().zip([r1, r2]).map(|(l, e)| l.connect(&e).unwrap()).collect();
    /// let mut msgs = [*b"to one", *b"to two"];
    /// let regions: Vec<_> = msgs.iter_mut().map(|m| pd[0].register(m).unwrap()).collect();
    /// std::thread::scope(|t| {
    ///     // One thread per peer of the root, all on the root's two shared queues.
    ///     for ((_peer, ch), msg) in root.channels_mut().zip(&regions) {
    ///         t.spawn(move || ch.send([msg.slice(..).unwrap()]).unwrap());
    ///     }
    ///     for (leaf, pd) in leaves.iter_mut().zip(&pd[1..]) {
    ///         t.spawn(move || {
    ///             let mut buf = [0u8; 8];
    ///             let mut buf = pd.register(&mut buf).unwrap();
    ///             assert_eq!(leaf.receive([buf.slice_mut(..).unwrap()]).unwrap().byte_len, 6);
    ///         });
    ///     }
    /// });
    /// ```
    pub fn channels_mut(
        &mut self,
    ) -> impl Iterator<Item = (usize, &mut Channel<P, DEPTH, SGES, T>)> + '_ {
        self.peers
            .iter_mut()
            .enumerate()
            .filter_map(|(p, c)| c.as_mut().map(|c| (p, c)))
    }

    /// The channel to `peer`, for any per-peer call (blocking, scoped or unpolled).
    pub fn peer(
        &mut self,
        peer: usize,
    ) -> Result<&mut Channel<P, DEPTH, SGES, T>, Error<P::Error>> {
        match self.peers.get_mut(peer) {
            Some(Some(ch)) => Ok(ch),
            _ => Err(no_such_peer::<P, PEERS>(peer)),
        }
    }

    /// Whether `peer` has a channel.
    pub fn has_peer(&self, peer: usize) -> bool {
        matches!(self.peers.get(peer), Some(Some(_)))
    }

    /// The peers with a channel, in increasing order.
    pub fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..PEERS).filter(|&p| self.peers[p].is_some())
    }

    /// How many peers have a channel.
    pub fn len(&self) -> usize {
        self.peers.iter().filter(|c| c.is_some()).count()
    }

    /// Whether no peer has a channel.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    // ---- blocking collectives ----

    /// Sends each `(peer, slice)`; returns once every send completed. The first error (in
    /// the order given) is returned after all posted sends completed.
    pub fn scatter_send<'a>(
        &mut self,
        sends: impl IntoIterator<Item = (usize, LocalSlice<'a>)>,
    ) -> Result<(), PeerError<P::Error>> {
        self.collective(
            sends
                .into_iter()
                .map(|(p, s)| (p, Queue::Send, s.sge(), SendOp::Send, None::<&RemoteRegion>)),
        )
        .map(drop)
    }

    /// Sends the same `data` to every peer in `peers`.
    pub fn multicast_send(
        &mut self,
        peers: impl IntoIterator<Item = usize>,
        data: LocalSlice<'_>,
    ) -> Result<(), PeerError<P::Error>> {
        self.scatter_send(peers.into_iter().map(|p| (p, data)))
    }

    /// Writes each `(peer, slice, remote)`: the slice to the start of the peer's region.
    pub fn scatter_write<'a, 'r>(
        &mut self,
        writes: impl IntoIterator<Item = (usize, LocalSlice<'a>, &'r RemoteRegion)>,
    ) -> Result<(), PeerError<P::Error>> {
        self.collective(writes.into_iter().map(|(p, s, remote)| {
            let op = remote.write_op();
            (p, Queue::Send, s.sge(), op, Some(remote))
        }))
        .map(drop)
    }

    /// Reads each `(peer, slice, remote)`: the start of the peer's region into the slice.
    pub fn gather_read<'a, 'r>(
        &mut self,
        reads: impl IntoIterator<Item = (usize, LocalSliceMut<'a>, &'r RemoteRegion)>,
    ) -> Result<(), PeerError<P::Error>> {
        self.collective(reads.into_iter().map(|(p, s, remote)| {
            let op = remote.read_op();
            (p, Queue::Send, s.sge(), op, Some(remote))
        }))
        .map(drop)
    }

    /// Posts every item (stopping at the first refused post), then waits for everything
    /// posted, within one timeout (plus the grace) for the whole call, recording each
    /// peer's outcome. The first refused post wins, then the lowest failed peer.
    ///
    /// Items are `(peer, queue, sge, op, remote)`; callers hold the borrows of the sges'
    /// memory for the whole call, which returns only after all posted work completed.
    fn collective<'r>(
        &mut self,
        items: impl Iterator<Item = (usize, Queue, Sge, SendOp, Option<&'r RemoteRegion>)>,
    ) -> Result<[Option<Completion>; PEERS], PeerError<P::Error>> {
        self.outcomes.iter_mut().for_each(|o| *o = None);
        let mut posted = Posted::<PEERS>::new();
        let mut refused = None;
        for (p, queue, sge, op, remote) in items {
            let r = self.peer(p).and_then(|ch| match queue {
                Queue::Send => {
                    ch.post_sges_seq([sge], op, SendFlags::empty(), remote.copied(), false)
                }
                Queue::Recv => ch.post_recv_seq([sge]),
            });
            match r {
                Ok(seq) => posted.record(p, queue, seq),
                Err(e) => {
                    refused = Some(self.peer_error(p, e));
                    break;
                }
            }
        }
        let mut waiter = self.waiter();
        let failed = self.wait_all(&posted, &mut waiter);
        if let Some(e) = refused.or(failed) {
            return Err(e);
        }
        let mut got = [None; PEERS];
        for (g, o) in got.iter_mut().zip(self.outcomes.iter()) {
            if let Some(Ok(c)) = o {
                *g = *c;
            }
        }
        Ok(got)
    }

    /// Waits for everything in `posted` within the one bound of `waiter`, and records each
    /// peer's outcome (its last receive completion, or its first error). Returns the
    /// failure of the lowest failed peer.
    pub(crate) fn wait_all(
        &mut self,
        posted: &Posted<PEERS>,
        waiter: &mut Waiter,
    ) -> Option<PeerError<P::Error>> {
        let mut first = None;
        for (p, (slot, outcome)) in self
            .peers
            .iter_mut()
            .zip(self.outcomes.iter_mut())
            .enumerate()
        {
            let Some(ch) = slot.as_mut() else {
                continue;
            };
            for (queue, span) in [(Queue::Send, posted.send[p]), (Queue::Recv, posted.recv[p])] {
                let Some(span) = span else { continue };
                for seq in span.first..=span.last {
                    let r = ch.wait_posted_within(queue, seq, waiter);
                    match (r, outcome.get_or_insert(Ok(None))) {
                        (Ok(c), Ok(got)) if queue == Queue::Recv => *got = Some(c),
                        (Ok(_), _) => {}
                        (Err(e), o @ Ok(_)) => {
                            if first.is_none() {
                                first = Some(PeerError {
                                    peer: p,
                                    qp_num: Some(ch.queue_pair().qp_num()),
                                    error: e.clone(),
                                });
                            }
                            *o = Err(e);
                        }
                        (Err(_), Err(_)) => {}
                    }
                }
            }
        }
        first
    }

    /// The outcome `peer` had in the last collective or scope that named it; `None` if the
    /// last one did not (or it was refused before anything was posted to that peer).
    pub fn outcome(&self, peer: usize) -> Option<&Outcome<P::Error>> {
        self.outcomes.get(peer)?.as_ref()
    }

    /// The peers whose work failed in the last collective or scope, with their errors, in
    /// peer order. After a failed [`scope`](Self::scope), whose error is the first one
    /// met, this names every peer that failed (the others' outcomes are in
    /// [`outcome`](Self::outcome)).
    pub fn failed_peers(&self) -> impl Iterator<Item = (usize, &Error<P::Error>)> + '_ {
        self.outcomes
            .iter()
            .enumerate()
            .filter_map(|(p, o)| match o {
                Some(Err(e)) => Some((p, e)),
                _ => None,
            })
    }

    /// One bound for a whole multi-peer call: the channels' timeout and grace.
    pub(crate) fn waiter(&self) -> Waiter {
        match self.peers.iter().flatten().next() {
            Some(ch) => ch.waiter(),
            None => Waiter::new(None, Duration::ZERO),
        }
    }

    /// `error` at `peer`, named with its queue pair.
    fn peer_error(&self, peer: usize, error: Error<P::Error>) -> PeerError<P::Error> {
        let qp_num = self
            .peers
            .get(peer)
            .and_then(|c| c.as_ref())
            .map(|c| c.queue_pair().qp_num());
        PeerError {
            peer,
            qp_num,
            error,
        }
    }

    /// Closes every peer's channel as [`Channel::close`] does, lingering at most
    /// `timeout` in all (plus the grace) for the sends already posted. The first peer
    /// whose sends did not drain (or failed) is returned.
    pub fn close(mut self, timeout: Duration) -> Result<(), PeerError<P::Error>> {
        let grace = self.waiter().grace();
        let mut waiter = Waiter::new(Some(timeout), grace);
        self.drain_sends(&mut waiter)
    }

    /// The lingering part of [`close`](Self::close), within the bound of `waiter`.
    pub(crate) fn drain_sends(&mut self, waiter: &mut Waiter) -> Result<(), PeerError<P::Error>> {
        let mut first = None;
        for (p, slot) in self.peers.iter_mut().enumerate() {
            let Some(ch) = slot.as_mut() else { continue };
            if let Err(error) = ch.drain_sends(waiter) {
                let qp_num = Some(ch.queue_pair().qp_num());
                first.get_or_insert(PeerError {
                    peer: p,
                    qp_num,
                    error,
                });
            }
        }
        first.map_or(Ok(()), Err)
    }
}
