//! Running a barrier: the sans-IO machine of [`super::barrier`] driven over the barrier
//! queue pairs. Blocking ([`Node::barrier`], [`Node::barrier_all`]), or split into a start
//! and polls that never wait ([`Node::start_barrier_all`], [`Node::poll_barrier`]), so one
//! thread can drive many nodes, as the stepped simulator does with 65,536 of them.

use super::barrier::{neighbours, BarrierError, BarrierMachine, Msg, Rank};
use super::ctrl::Ctrl;
use super::{wire, Node, NodeError};
use crate::channel::wait::Waiter;
use crate::provider::Provider;
use crate::types::WorkCompletion;

impl<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    Node<P, PEERS, DEPTH, SGES>
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
        let (alg, world) = (self.config.algorithm, self.map.world);
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
        let mut waiter = Waiter::new(self.config.barrier_timeout, self.config.channel.flush_grace);
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
        let m = BarrierMachine::new(self.config.algorithm, me, participants)
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

    /// The first moves of a started barrier: epochs counted, the machine started, early
    /// messages handed in.
    fn open(&mut self, m: &mut BarrierMachine<PEERS>) -> Result<(), NodeError<P::Error>> {
        let Node {
            map,
            ctrl,
            pair_epoch,
            early,
            partners,
            ..
        } = self;
        for &p in partners.iter() {
            let p = p as usize;
            pair_epoch[p] = pair_epoch[p].wrapping_add(1);
        }
        let mut out = Out {
            ctrl,
            map,
            pair_epoch,
            failed: None,
        };
        m.start(&mut |to, msg| out.send(to, msg))
            .map_err(NodeError::Barrier)?;
        out.check()?;
        for &p in partners.iter() {
            let p = p as usize;
            if let Some(msg) = early[p].take() {
                let from = out.map.rank_of(p) as Rank;
                m.on_message(from, msg, &mut |to, msg| out.send(to, msg))
                    .map_err(NodeError::Barrier)?;
                out.check()?;
            }
        }
        Ok(())
    }

    /// One pass: the messages received handed in (and the machine's answers sent), and
    /// once complete, this node's sends reaped. Returns (complete, anything happened).
    fn step(&mut self) -> Result<(bool, bool), NodeError<P::Error>> {
        let Node {
            map,
            ctrl,
            running,
            pair_epoch,
            early,
            partners,
            ..
        } = self;
        let Some(m) = running.as_mut() else {
            return Ok((true, false));
        };
        let mut progress = false;
        let mut batch = [WorkCompletion::EMPTY; RECV_BATCH];
        // Messages are taken while the barrier runs, also once it is complete: any left
        // are for the next barrier with their sender (kept in `early`), and the receive
        // queue has room for them all meanwhile.
        while !m.is_complete() {
            let n = ctrl.receive(&mut batch)?;
            for wc in &batch[..n] {
                progress = true;
                let p = wc.wr_id as usize;
                let from = map.rank_of(p);
                let Some(msg) = classify(from, wc.imm.unwrap_or(0), pair_epoch[p], &mut early[p])?
                else {
                    continue; // for the next barrier with p: kept
                };
                let mut out = Out {
                    ctrl,
                    map,
                    pair_epoch,
                    failed: None,
                };
                m.on_message(from as Rank, msg, &mut |to, msg| out.send(to, msg))
                    .map_err(NodeError::Barrier)?;
                out.check()?;
            }
            if n < batch.len() {
                break;
            }
        }
        if !m.is_complete() {
            return Ok((false, progress));
        }
        // Complete only once this rank's own messages are acknowledged: a rank that leaves
        // (drops its node) right after the barrier cannot take with it a message a peer
        // still needs, such as one lost once on the wire and waiting for its retransmission.
        ctrl.reap()?;
        if partners.iter().any(|&p| ctrl.sending(p as usize)) {
            return Ok((false, progress));
        }
        *running = None;
        Ok((true, progress))
    }
}

/// A received message from rank `from`: `Some` if it belongs to the running barrier,
/// `None` after keeping it in `early` for the next barrier with that rank.
fn classify<E>(
    from: usize,
    imm: u32,
    pair_epoch: u32,
    early: &mut Option<Msg>,
) -> Result<Option<Msg>, NodeError<E>> {
    let bad = NodeError::Protocol { from, imm };
    let Some((kind, round, epoch)) = wire::decode(imm) else {
        return Err(bad);
    };
    let msg = wire::to_msg(kind, round);
    let current = pair_epoch & wire::EPOCH_MASK;
    if epoch == current {
        return Ok(Some(msg));
    }
    if epoch == (current + 1) & wire::EPOCH_MASK && early.is_none() {
        *early = Some(msg);
        return Ok(None);
    }
    Err(bad)
}

/// Where a machine's messages go: the barrier queue pairs. Errors wait in `failed` (the
/// machine's callback cannot return one).
struct Out<'a, P: Provider, const PEERS: usize> {
    ctrl: &'a mut Ctrl<P, PEERS>,
    map: &'a super::PeerMap<PEERS>,
    pair_epoch: &'a [u32; PEERS],
    failed: Option<NodeError<P::Error>>,
}

impl<P: Provider, const PEERS: usize> Out<'_, P, PEERS> {
    /// Sends `msg` to rank `to` as a zero-length send with immediate data.
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
        let imm = wire::encode(msg.kind, msg.round, self.pair_epoch[p]);
        if let Err(e) = self.ctrl.send(p, imm) {
            self.failed = Some(e.into());
        }
    }

    fn check(&mut self) -> Result<(), NodeError<P::Error>> {
        self.failed.take().map_or(Ok(()), Err)
    }
}

/// Barrier messages taken from the receive queue per poll.
const RECV_BATCH: usize = 16;
