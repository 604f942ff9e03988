//! Running a barrier: the sans-IO machine of [`super::barrier`] driven over the flag
//! array and the data channels ([`super::flags`]). Blocking ([`Node::barrier`], [`Node::barrier_all`]), or split into a start
//! and polls that never wait ([`Node::start_barrier_all`], [`Node::poll_barrier`]), so one
//! thread can drive many nodes, as the stepped simulator does with 65,536 of them.

use super::barrier::{neighbours, BarrierError, BarrierMachine, Msg, Rank};
use super::flags::{word_of, Flags};
use super::{wire, Node, NodeError};
use crate::channel::wait::Waiter;
use crate::multi_channel::MultiChannel;
use crate::multi_channel::PeerTransport;
use crate::provider::Provider;

impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    Node<P, PEERS, DEPTH, SGES, T>
{
    /// A barrier among all ranks.
    pub fn barrier_all(&mut self) -> Result<(), NodeError<P::Error>> {
        self.start_barrier_all()?;
        self.finish()
    }

    /// A barrier among `participants`: ranks of this world in increasing order, including
    /// this node's. Every participant must call it, with the same list, and the barriers a
    /// pair of ranks share must come in the same order on both. Returns once every
    /// participant has entered it.
    ///
    /// A refused list is an error that leaves the node as it was; a barrier that fails
    /// (timeout, a peer gone, a message out of protocol) poisons the node's barriers.
    pub fn barrier(&mut self, participants: &[usize]) -> Result<(), NodeError<P::Error>> {
        self.start_barrier(participants)?;
        self.finish()
    }

    /// [`barrier`](Self::barrier) on a list of `Rank` ranks, for hot paths that built the
    /// list once.
    ///
    /// What it skips is only work: converting each `usize` rank and copying the list into
    /// a stack array of `PEERS`. It still checks, in one O(len) pass, every rank against the
    /// world ([`NodeError::InvalidRank`], like `barrier`), and the barrier machine still
    /// checks that the list is non-empty, at most `PEERS` long, strictly increasing (sorted,
    /// no duplicates) and holds this node's rank ([`NodeError::Barrier`]). Those checks
    /// cost a few comparisons per rank; without them a bad list would index the per-peer
    /// tables out of bounds or hang the protocol. A refused list leaves the node as it
    /// was: it does not poison its barriers.
    pub fn barrier_unchecked(&mut self, participants: &[Rank]) -> Result<(), NodeError<P::Error>> {
        self.start_list(participants)?;
        self.finish()
    }

    /// Starts a barrier among all ranks and returns at once; [`poll_barrier`] drives it.
    ///
    /// [`poll_barrier`]: Self::poll_barrier
    pub fn start_barrier_all(&mut self) -> Result<(), NodeError<P::Error>> {
        self.check_idle()?;
        let (alg, world) = (self.barrier.algorithm, self.map.world);
        let m = BarrierMachine::new_world(alg, self.map.rank as Rank, world)
            .map_err(NodeError::Barrier)?;
        self.begin(m)
    }

    /// Starts a barrier among `participants` (as [`barrier`](Self::barrier) takes them) and
    /// returns at once; [`poll_barrier`](Self::poll_barrier) drives it.
    pub fn start_barrier(&mut self, participants: &[usize]) -> Result<(), NodeError<P::Error>> {
        if participants.len() > PEERS {
            return Err(NodeError::Barrier(BarrierError::TooMany {
                given: participants.len(),
                capacity: PEERS,
            }));
        }
        let mut parts = [0 as Rank; PEERS];
        for (slot, &p) in parts.iter_mut().zip(participants) {
            if p >= self.map.world {
                return Err(NodeError::InvalidRank {
                    rank: p,
                    world: self.map.world,
                });
            }
            *slot = p as Rank;
        }
        self.start_list(&parts[..participants.len()])
    }

    /// Drives the running barrier as far as the completions already there allow, without
    /// waiting: `Ok(true)` once it is complete and this node's own messages are
    /// acknowledged (also when no barrier runs), `Ok(false)` while it still needs peers.
    /// Nothing bounds a polled barrier but its caller: to give up, call
    /// [`abandon_barrier`](Self::abandon_barrier). An error poisons the node's barriers.
    ///
    /// One thread driving a whole world on the stepped simulator:
    ///
    /// ```
    /// use zverbs::node::{barrier::neighbours, Node, NodeConfig};
    /// use zverbs::provider::sim::{FabricConfig, Sim};
    /// use zverbs::Context;
    /// let n = 8;
    /// let sim = Sim::with_config(FabricConfig { auto_step: false, ..FabricConfig::stepped(1) }, n);
    /// let cfg = NodeConfig::default();
    /// let ctxs: Vec<_> = (0..n).map(|r| Context::open(&sim, &format!("sim{r}")).unwrap()).collect();
    /// let pds: Vec<_> = ctxs.iter().map(|c| c.alloc_pd().unwrap()).collect();
    /// let prepared: Vec<_> = (0..n)
    ///     .map(|r| {
    ///         let peers = neighbours(cfg.algorithm, r, n);
    ///         Node::<Sim, 8, 2, 1>::prepare_with_peers(&ctxs[r], &pds[r], r, n, peers, &cfg).unwrap()
    ///     })
    ///     .collect();
    /// let eps: Vec<Vec<_>> =
    ///     prepared.iter().map(|p| (0..n).map(|peer| p.endpoints(peer).ok()).collect()).collect();
    /// let mut nodes: Vec<_> = prepared
    ///     .into_iter()
    ///     .enumerate()
    ///     .map(|(r, p)| p.connect(|peer| eps[peer][r]).unwrap())
    ///     .collect();
    /// for node in &mut nodes {
    ///     node.start_barrier_all().unwrap();
    /// }
    /// let fabric = sim.fabric();
    /// loop {
    ///     // Every node is polled on every pass (a node not polled forwards nothing).
    ///     let done = nodes.iter_mut().fold(true, |all, node| node.poll_barrier().unwrap() & all);
    ///     if done {
    ///         break;
    ///     }
    ///     let next = fabric.next_event_at().expect("a barrier in flight has events");
    ///     fabric.run_for(next.saturating_sub(fabric.now()));
    /// }
    /// ```
    pub fn poll_barrier(&mut self) -> Result<bool, NodeError<P::Error>> {
        if self.poisoned {
            return Err(NodeError::Poisoned);
        }
        self.step()
            .map(|(done, _)| done)
            .inspect_err(|_| self.fail())
    }

    /// Gives up the running barrier, if any: the node's barriers are poisoned (its peers
    /// may be waiting for messages it will not send).
    pub fn abandon_barrier(&mut self) {
        if self.running.is_some() {
            self.fail();
        }
    }

    /// Waits for the running barrier, within the barrier timeout.
    fn finish(&mut self) -> Result<(), NodeError<P::Error>> {
        let count = self.running.as_ref().map_or(0, BarrierMachine::count);
        let mut waiter = Waiter::new(self.barrier.timeout, self.barrier.flush_grace);
        loop {
            match self.step() {
                Ok((true, _)) => return Ok(()),
                Ok((false, progress)) => {
                    if !progress && !waiter.pause() {
                        crate::trace::event!(
                            warn,
                            participants = count,
                            "a barrier timed out; the node is poisoned"
                        );
                        self.fail();
                        return Err(NodeError::Timeout {
                            participants: count,
                        });
                    }
                }
                Err(e) => {
                    crate::trace::event!(warn, error = %e, "a barrier failed; the node is poisoned");
                    self.fail();
                    return Err(e);
                }
            }
        }
    }

    fn fail(&mut self) {
        self.poisoned = true;
        self.running = None;
    }

    fn check_idle(&self) -> Result<(), NodeError<P::Error>> {
        if self.poisoned {
            return Err(NodeError::Poisoned);
        }
        match &self.running {
            Some(m) => Err(NodeError::Barrier(BarrierError::InProgress {
                epoch: m.epoch(),
            })),
            None => Ok(()),
        }
    }

    fn start_list(&mut self, participants: &[Rank]) -> Result<(), NodeError<P::Error>> {
        if let Some(&p) = participants.iter().find(|&&p| p as usize >= self.map.world) {
            return Err(NodeError::InvalidRank {
                rank: p as usize,
                world: self.map.world,
            });
        }
        self.check_idle()?;
        let me = self.map.rank as Rank;
        let m = BarrierMachine::new(self.barrier.algorithm, me, participants)
            .map_err(NodeError::Barrier)?;
        self.begin(m)
    }

    /// Starts `m`: its partners (the peers it exchanges messages with) must all have
    /// channels, else the barrier is refused and the node left as it was.
    fn begin(&mut self, mut m: BarrierMachine<PEERS>) -> Result<(), NodeError<P::Error>> {
        let mut partners = heapless::Vec::new();
        for j in neighbours(m.algorithm(), m.index(), m.count()) {
            let rank = m.participant(j).map_or(usize::MAX, |r| r as usize);
            let p = self
                .map
                .index(rank)
                .ok_or(NodeError::NotConnected { rank })?;
            // Distinct ranks have distinct peer indices, below `PEERS`: it always fits.
            partners
                .push(p as u32)
                .map_err(|_| NodeError::TooManyPeers { capacity: PEERS })?;
        }
        self.partners = partners;
        let r = self.open(&mut m);
        match r {
            Ok(()) => self.running = Some(m),
            Err(_) => self.fail(),
        }
        r
    }

    /// The first moves of a started barrier: epochs counted, the machine started. Messages
    /// that came early are in their slots, for the first step.
    fn open(&mut self, m: &mut BarrierMachine<PEERS>) -> Result<(), NodeError<P::Error>> {
        let Node {
            map,
            data,
            flags,
            pair_epoch,
            partners,
            ..
        } = self;
        for &p in partners.iter() {
            let p = p as usize;
            pair_epoch[p] = pair_epoch[p].wrapping_add(1);
        }
        let mut out = Out::new(data, flags, map, pair_epoch);
        m.start(&mut |to, msg| out.send(to, msg))
            .map_err(NodeError::Barrier)?;
        out.check()
    }

    /// One pass: the partners' slots read and their messages handed in (and the machine's
    /// answers sent), and once complete, this node's writes redeemed. Returns (complete,
    /// anything happened).
    fn step(&mut self) -> Result<(bool, bool), NodeError<P::Error>> {
        let Node {
            map,
            data,
            flags,
            running,
            pair_epoch,
            partners,
            ..
        } = self;
        let Some(m) = running.as_mut() else {
            return Ok((true, false));
        };
        let mut progress = false;
        // Only the running barrier's slots are read: a partner's message for the next
        // barrier waits in its other slot.
        for &p in partners.iter() {
            if m.is_complete() {
                break;
            }
            let p = p as usize;
            let from = map.rank_of(p);
            let Some(imm) = flags.take(p, pair_epoch[p]) else {
                continue;
            };
            progress = true;
            let msg = classify(from, imm, pair_epoch[p])?;
            let mut out = Out::new(data, flags, map, pair_epoch);
            m.on_message(from as Rank, msg, &mut |to, msg| out.send(to, msg))
                .map_err(NodeError::Barrier)?;
            out.check()?;
        }
        if !m.is_complete() {
            if !progress {
                // Nothing arrived: the oldest write in flight is polled (or, with none,
                // one channel's queue), so that a write that failed (a peer gone) or a
                // dead local device fails the barrier now, not at its timeout. One poll a
                // pass: those acknowledged make way for the next in the passes after.
                match partners
                    .iter()
                    .map(|&p| p as usize)
                    .find(|&p| flags.in_flight(p))
                {
                    Some(p) => {
                        flags.reap(data.peer(p)?, p)?;
                    }
                    None => {
                        if let Some(&p) = partners.first() {
                            data.peer(p as usize)?.poll_sends()?;
                        }
                    }
                }
            }
            return Ok((false, progress));
        }
        // Complete only once this rank's own messages are acknowledged: a rank that leaves
        // (drops its node) right after the barrier cannot take with it a message a peer
        // still needs, such as one lost once on the wire and waiting for its retransmission.
        for &p in partners.iter() {
            let p = p as usize;
            if !flags.reap(data.peer(p)?, p)? {
                return Ok((false, progress));
            }
        }
        *running = None;
        Ok((true, progress))
    }
}

/// The message `imm` from rank `from`, read from the slot of the running barrier: it must
/// carry that barrier's count for the pair.
fn classify<E>(from: usize, imm: u32, pair_epoch: u32) -> Result<Msg, NodeError<E>> {
    match wire::decode(imm) {
        Some((kind, round, epoch)) if epoch == pair_epoch & wire::EPOCH_MASK => {
            Ok(wire::to_msg(kind, round))
        }
        _ => Err(NodeError::Protocol {
            from,
            word: word_of(imm),
        }),
    }
}

/// Where a machine's messages go: writes into the partners' flag arrays over the data
/// channels. Errors wait in `failed` (the machine's callback cannot return one).
struct Out<
    'a,
    P: Provider,
    const PEERS: usize,
    const DEPTH: usize,
    const SGES: usize,
    T: PeerTransport,
> {
    data: &'a mut MultiChannel<P, PEERS, DEPTH, SGES, T>,
    flags: &'a mut Flags<P, PEERS>,
    map: &'a super::PeerMap<PEERS>,
    pair_epoch: &'a [u32; PEERS],
    failed: Option<NodeError<P::Error>>,
}

impl<
        'a,
        P: Provider,
        T: PeerTransport,
        const PEERS: usize,
        const DEPTH: usize,
        const SGES: usize,
    > Out<'a, P, PEERS, DEPTH, SGES, T>
{
    fn new(
        data: &'a mut MultiChannel<P, PEERS, DEPTH, SGES, T>,
        flags: &'a mut Flags<P, PEERS>,
        map: &'a super::PeerMap<PEERS>,
        pair_epoch: &'a [u32; PEERS],
    ) -> Self {
        Out {
            data,
            flags,
            map,
            pair_epoch,
            failed: None,
        }
    }

    /// Writes `msg` into rank `to`'s slot for this node.
    fn send(&mut self, to: Rank, msg: Msg) {
        if self.failed.is_some() {
            return;
        }
        let rank = to as usize;
        // `begin` checked that every partner has a queue pair.
        let Some(p) = self.map.index(rank) else {
            self.failed = Some(NodeError::NotConnected { rank });
            return;
        };
        let epoch = self.pair_epoch[p];
        let imm = wire::encode(msg.kind, msg.round, epoch);
        let flags = &mut *self.flags;
        let sent = (self.data.peer(p)).and_then(|ch| flags.send(ch, p, epoch, imm));
        if let Err(e) = sent {
            self.failed = Some(e.into());
        }
    }

    fn check(&mut self) -> Result<(), NodeError<P::Error>> {
        self.failed.take().map_or(Ok(()), Err)
    }
}
