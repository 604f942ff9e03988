//! The barrier plane: one queue pair per peer that carries barrier messages only, on one
//! send and one receive completion queue that the node alone polls.
//!
//! A barrier message is a zero-length SEND_WITH_IMM ([`super::wire`]) into a receive
//! without buffers, so the plane lends no memory and needs none of a data channel's
//! machinery: no request rings or templates, and no dispatcher inboxes, since its
//! completions have one reader, the node, which routes each by its `wr_id`. Per peer it
//! holds the backend's queue pair handle, the two queue pair numbers (for errors) and a
//! count of sends in flight: once connected, a barrier queue pair needs nothing else of
//! [`QueuePair`], which keeps its endpoints and configuration for users.
//!
//! Invariants:
//! - Every request's `wr_id` is its peer index.
//! - `CTRL_RECVS` receives per peer are posted from INIT on, and each one consumed is
//!   reposted before its message is handed on, so a peer's message always finds one.
//! - `sends[p]` counts the signaled sends to `p` not yet reaped, at most `CTRL_DEPTH`.
//! - The queues have room for every request that can be in flight (`CTRL_RECVS` receives
//!   and `CTRL_DEPTH` sends per peer), so neither overflows.

use super::{CTRL_DEPTH, CTRL_RECVS};
use crate::channel::wait::Waiter;
use crate::channel::ChannelConfig;
use crate::cq::CompletionQueue;
use crate::device::{Context, ProtectionDomain};
use crate::error::{verb, CompletionError, Error};
use crate::multi_channel::{new_slots, no_such_peer, Slots};
use crate::provider::Provider;
use crate::qp::{Endpoint, Init, QueuePair, ReadyToSend};
use crate::types::{RecvWr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};

/// Barrier queue pairs created and in INIT, with their receives posted.
pub(super) struct PreparedCtrl<P: Provider, const PEERS: usize> {
    /// Dropped before the queues they complete on.
    qps: Slots<QueuePair<P, Init>, PEERS>,
    send_cq: CompletionQueue<P>,
    recv_cq: CompletionQueue<P>,
}

/// A connected barrier queue pair: the backend's handle (which destroys it when dropped),
/// its number and its peer's.
struct Connected<P: Provider> {
    raw: P::Qp,
    qp_num: u32,
    peer_qp_num: u32,
}

/// Connected barrier queue pairs.
pub(super) struct Ctrl<P: Provider, const PEERS: usize> {
    /// Dropped before the queues they complete on.
    qps: Slots<Connected<P>, PEERS>,
    sends: [u8; PEERS],
    send_cq: CompletionQueue<P>,
    recv_cq: CompletionQueue<P>,
}

/// Completions taken per poll.
const BATCH: usize = 16;

impl<P: Provider, const PEERS: usize> PreparedCtrl<P, PEERS> {
    /// A queue pair for each peer index in `peers` (distinct, below `PEERS`: the node's
    /// peer map), each with its receives posted.
    pub(super) fn prepare(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        peers: impl Iterator<Item = usize> + Clone,
        config: &ChannelConfig,
    ) -> Result<Self, Error<P::Error>> {
        let count = peers.clone().count().max(1);
        let depth = |per: usize| {
            count
                .checked_mul(per)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(Error::InvalidAttribute(
                    "too many peers for one completion queue",
                ))
        };
        let send_cq = CompletionQueue::create(ctx, depth(CTRL_DEPTH)?)?;
        let recv_cq = CompletionQueue::create(ctx, depth(CTRL_RECVS)?)?;
        let mut qp_cfg = config.qp;
        qp_cfg.caps.max_send_wr = CTRL_DEPTH as u32;
        qp_cfg.caps.max_recv_wr = CTRL_RECVS as u32;
        qp_cfg.caps.max_send_sge = 1;
        qp_cfg.caps.max_recv_sge = 1;
        qp_cfg.caps.max_inline_data = 0;
        let mut qps = new_slots::<QueuePair<P, Init>, PEERS>();
        for p in peers {
            let qp = QueuePair::create(ctx, pd, &send_cq, &recv_cq, &qp_cfg)?;
            let qp = qp.into_init(&config.init).map_err(|e| e.error)?;
            let recvs = [RecvWr::<0>::new(p as u64); CTRL_RECVS];
            // SAFETY: the receives have no scatter entries: the device writes no memory.
            verb(
                "ibv_post_recv",
                unsafe { qp.post_recv(&recvs) }.map_err(|e| e.error),
            )?;
            *qps.get_mut(p).ok_or(no_such_peer::<P, PEERS>(p))? = Some(qp);
        }
        Ok(PreparedCtrl {
            qps,
            send_cq,
            recv_cq,
        })
    }

    /// The endpoint of peer `p`'s queue pair, if it has one.
    pub(super) fn endpoint(&self, p: usize) -> Option<Endpoint> {
        self.qps.get(p)?.as_ref().map(QueuePair::endpoint)
    }

    /// Connects each queue pair to the endpoint `remote(p)` gives (INIT → RTR → RTS).
    pub(super) fn connect(
        mut self,
        mut remote: impl FnMut(usize) -> Option<Endpoint>,
        config: &ChannelConfig,
    ) -> Result<Ctrl<P, PEERS>, Error<P::Error>> {
        let mut qps = new_slots::<Connected<P>, PEERS>();
        for (p, slot) in qps.iter_mut().enumerate() {
            let Some(qp) = self.qps[p].take() else {
                continue;
            };
            let ep = remote(p).ok_or(no_such_peer::<P, PEERS>(p))?;
            let qp = qp.into_rtr(&ep, &config.rtr).map_err(|e| e.error)?;
            let qp: QueuePair<P, ReadyToSend> = qp.into_rts(&config.rts).map_err(|e| e.error)?;
            *slot = Some(Connected {
                qp_num: qp.qp_num(),
                peer_qp_num: ep.qp_num,
                raw: qp.into_raw(),
            });
        }
        // The emptied slots go first: queue pairs before the queues they complete on.
        drop(self.qps);
        Ok(Ctrl {
            qps,
            sends: [0; PEERS],
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
        })
    }
}

impl<P: Provider, const PEERS: usize> Ctrl<P, PEERS> {
    /// Sends barrier message `imm` to peer `p` (signaled: its completion says the peer's
    /// device has it).
    pub(super) fn send(&mut self, p: usize, imm: u32) -> Result<(), Error<P::Error>> {
        let qp = self.qp(p)?;
        if usize::from(self.sends[p]) >= CTRL_DEPTH {
            return Err(Error::QueueFull {
                capacity: CTRL_DEPTH,
            });
        }
        let wr = SendWr::<0>::new(p as u64, SendOp::SendWithImm(imm), SendFlags::SIGNALED);
        // SAFETY: no gather entries: the device reads no memory.
        let posted = unsafe { P::post_send(&qp.raw, core::slice::from_ref(&wr)) };
        verb("ibv_post_send", posted.map_err(|e| e.error))?;
        self.sends[p] += 1;
        Ok(())
    }

    /// Takes up to `out.len()` received messages into `out` (each completion's `wr_id` its
    /// peer index, `imm` the message) and reposts their receives; returns how many.
    pub(super) fn receive(&mut self, out: &mut [WorkCompletion]) -> Result<usize, Error<P::Error>> {
        let n = self.recv_cq.poll(out)?;
        for wc in &out[..n] {
            let p = wc.wr_id as usize;
            let qp = self.qp(p)?;
            if wc.status != WcStatus::Success {
                // A receive fails when it is flushed (the queue pair went to the error
                // state, and a failed send, if any, says why) or when a peer sent a
                // payload where a barrier message has none.
                let flushed = failed(qp, wc);
                self.reap()?;
                return Err(flushed);
            }
            let wr = RecvWr::<0>::new(wc.wr_id);
            // SAFETY: no scatter entries: the device writes no memory.
            let posted = unsafe { P::post_recv(&qp.raw, core::slice::from_ref(&wr)) };
            verb("ibv_post_recv", posted.map_err(|e| e.error))?;
        }
        Ok(n)
    }

    /// Reaps the send completions there are.
    pub(super) fn reap(&mut self) -> Result<(), Error<P::Error>> {
        let mut batch = [WorkCompletion::EMPTY; BATCH];
        loop {
            let n = self.send_cq.poll(&mut batch)?;
            for wc in &batch[..n] {
                let p = wc.wr_id as usize;
                let qp = self.qp(p)?;
                if wc.status != WcStatus::Success {
                    return Err(failed(qp, wc));
                }
                self.sends[p] = self.sends[p].saturating_sub(1);
            }
            if n < BATCH {
                return Ok(());
            }
        }
    }

    /// Sends to peer `p` not yet reaped.
    pub(super) fn sending(&self, p: usize) -> bool {
        self.sends.get(p).is_some_and(|&n| n > 0)
    }

    /// Waits within `waiter` until every send is reaped.
    pub(super) fn drain(&mut self, waiter: &mut Waiter) -> Result<(), Error<P::Error>> {
        loop {
            self.reap()?;
            if self.sends.iter().all(|&n| n == 0) {
                return Ok(());
            }
            if !waiter.pause() {
                return Err(Error::Timeout);
            }
        }
    }

    fn qp(&self, p: usize) -> Result<&Connected<P>, Error<P::Error>> {
        match self.qps.get(p) {
            Some(Some(qp)) => Ok(qp),
            _ => Err(no_such_peer::<P, PEERS>(p)),
        }
    }
}

fn failed<P: Provider>(qp: &Connected<P>, wc: &WorkCompletion) -> Error<P::Error> {
    Error::Completion(CompletionError {
        status: wc.status,
        wr_id: wc.wr_id,
        opcode: wc.opcode,
        qp_num: qp.qp_num,
        peer_qp_num: Some(qp.peer_qp_num),
    })
}

const _: () = assert!(CTRL_RECVS >= 2, "a peer may be one barrier ahead");
const _: () = assert!(CTRL_DEPTH <= u8::MAX as usize, "sends are counted in a u8");
