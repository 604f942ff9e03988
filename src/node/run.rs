//! Running a barrier: the sans-IO machine of [`super::barrier`] driven over the barrier
//! queue pairs.

use super::barrier::{BarrierError, BarrierMachine, Msg};
use super::{wire, Node, NodeError, CTRL_RECVS};
use crate::channel::wait::Waiter;
use crate::provider::Provider;
use crate::types::{SendFlags, SendOp};

impl<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    Node<P, PEERS, DEPTH, SGES>
{
    /// A barrier among all ranks.
    pub fn barrier_all(&mut self) -> Result<(), NodeError<P::Error>> {
        let mut parts = [0u16; PEERS];
        for (i, p) in parts.iter_mut().enumerate() {
            *p = i as u16;
        }
        self.run(&parts[..self.world])
    }

    /// A barrier among `participants`: ranks of this world in increasing order, including
    /// this node's. Every participant must call it, with the same list, and the barriers a
    /// pair of ranks share must come in the same order on both. Returns once every
    /// participant has entered it.
    ///
    /// A refused list is an error that leaves the node as it was; a barrier that fails
    /// (timeout, a peer gone, a message out of protocol) poisons the node's barriers.
    pub fn barrier(&mut self, participants: &[usize]) -> Result<(), NodeError<P::Error>> {
        if participants.len() > PEERS {
            return Err(NodeError::Barrier(BarrierError::TooMany {
                given: participants.len(),
                capacity: PEERS,
            }));
        }
        let mut parts = [0u16; PEERS];
        for (slot, &p) in parts.iter_mut().zip(participants) {
            if p >= self.world {
                return Err(NodeError::InvalidRank {
                    rank: p,
                    world: self.world,
                });
            }
            *slot = p as u16;
        }
        self.run(&parts[..participants.len()])
    }

    /// [`barrier`](Self::barrier) on a list of `u16` ranks, for hot paths that built the
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
    pub fn barrier_unchecked(&mut self, participants: &[u16]) -> Result<(), NodeError<P::Error>> {
        if let Some(&p) = participants.iter().find(|&&p| usize::from(p) >= self.world) {
            return Err(NodeError::InvalidRank {
                rank: usize::from(p),
                world: self.world,
            });
        }
        self.run(participants)
    }

    fn run(&mut self, participants: &[u16]) -> Result<(), NodeError<P::Error>> {
        if self.poisoned {
            return Err(NodeError::Poisoned);
        }
        let mut m =
            BarrierMachine::<PEERS>::new(self.config.algorithm, self.rank as u16, participants)
                .map_err(NodeError::Barrier)?;
        let r = self.drive(&mut m, participants);
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    fn drive(
        &mut self,
        m: &mut BarrierMachine<PEERS>,
        participants: &[u16],
    ) -> Result<(), NodeError<P::Error>> {
        let me = self.rank as u16;
        let peers = || {
            participants
                .iter()
                .map(|&p| usize::from(p))
                .filter(|&p| p != usize::from(me))
        };
        // One bound for the whole barrier: the reaping, the rounds and the final acks.
        let mut waiter = Waiter::new(self.config.barrier_timeout, self.config.channel.flush_grace);
        for p in peers() {
            self.reap_sends(p, &mut waiter)?;
            self.pair_epoch[p] = self.pair_epoch[p].wrapping_add(1);
        }
        let mut failed = None;
        m.start(&mut |to, msg| self.send(to, msg, &mut failed))
            .map_err(NodeError::Barrier)?;
        check(&mut failed)?;
        for p in peers() {
            if let Some(msg) = self.early[p].take() {
                m.on_message(p as u16, msg, &mut |to, msg| {
                    self.send(to, msg, &mut failed)
                })
                .map_err(NodeError::Barrier)?;
                check(&mut failed)?;
            }
        }
        while !m.is_complete() {
            let mut progress = false;
            // On shared queues: one poll of the receive queue routes every peer's message,
            // then each peer's inbox is looked at (not the queue again per peer).
            if let Some(p) = peers().next() {
                self.ctrl.peer(p)?.route(false)?;
            }
            for p in peers() {
                let Some(c) = self.ctrl.peer(p)?.try_routed(false, self.recv_next[p])? else {
                    continue;
                };
                progress = true;
                self.recv_next[p] += 1;
                self.ctrl.peer(p)?.post_recv_seq(core::iter::empty())?;
                let imm = c.imm.unwrap_or(0);
                let Some(msg) = self.classify(p, imm)? else {
                    continue; // for the next barrier with p: kept
                };
                m.on_message(p as u16, msg, &mut |to, msg| {
                    self.send(to, msg, &mut failed)
                })
                .map_err(NodeError::Barrier)?;
                check(&mut failed)?;
            }
            if !progress && !waiter.pause() {
                return Err(NodeError::Timeout {
                    participants: participants.len(),
                });
            }
        }
        // Returns only once this rank's own messages are acknowledged: a rank that leaves
        // (drops its node) right after the barrier cannot take with it a message a peer
        // still needs, such as one lost once on the wire and waiting for its retransmission.
        for p in peers() {
            self.reap_sends(p, &mut waiter)?;
        }
        Ok(())
    }

    /// A received message from `p`: `Some` if it belongs to the running barrier, `None`
    /// after keeping it for the next barrier with `p`.
    fn classify(&mut self, p: usize, imm: u32) -> Result<Option<Msg>, NodeError<P::Error>> {
        let bad = NodeError::Protocol { from: p, imm };
        let Some((kind, round, epoch)) = wire::decode(imm) else {
            return Err(bad);
        };
        let msg = wire::to_msg(kind, round);
        let current = self.pair_epoch[p] & wire::EPOCH_MASK;
        if epoch == current {
            return Ok(Some(msg));
        }
        if epoch == (current + 1) & wire::EPOCH_MASK && self.early[p].is_none() {
            self.early[p] = Some(msg);
            return Ok(None);
        }
        Err(bad)
    }

    /// Posts `msg` to rank `to` as a zero-length send with immediate data. Errors land in
    /// `failed` (the machine's callback cannot return one).
    fn send(&mut self, to: u16, msg: Msg, failed: &mut Option<NodeError<P::Error>>) {
        if failed.is_some() {
            return;
        }
        let to = usize::from(to);
        let imm = wire::encode(
            msg.kind,
            msg.round,
            self.pair_epoch.get(to).copied().unwrap_or(0),
        );
        let r = self.ctrl.peer(to).and_then(|ch| {
            ch.post_send_seq(
                core::iter::empty(),
                SendOp::SendWithImm(imm),
                SendFlags::empty(),
                None,
            )
        });
        match r {
            Ok(seq) => {
                let span = &mut self.sends[to];
                if span.0 == span.1 {
                    span.0 = seq;
                }
                span.1 = seq + 1;
            }
            Err(e) => *failed = Some(e.into()),
        }
    }

    /// Takes the outcomes of the barrier sends to `p` (acknowledged already, normally),
    /// within the barrier's bound.
    fn reap_sends(&mut self, p: usize, waiter: &mut Waiter) -> Result<(), NodeError<P::Error>> {
        let (first, next) = self.sends[p];
        for seq in first..next {
            self.sends[p].0 = seq + 1;
            self.ctrl.peer(p)?.wait_posted_within(true, seq, waiter)?;
        }
        Ok(())
    }
}

fn check<E>(failed: &mut Option<NodeError<E>>) -> Result<(), NodeError<E>> {
    failed.take().map_or(Ok(()), Err)
}

const _: () = assert!(CTRL_RECVS >= 2, "a peer may be one barrier ahead");
