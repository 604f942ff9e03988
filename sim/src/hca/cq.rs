//! Completion queues: completions pushed (an overflow moves every queue pair using the CQ
//! to ERR), flush completions, a queue pair's move to ERR, and the CQ's side of completion
//! channels (arming, and the events a completion raises).
//!
//! A CQ created on a channel can be armed (`ibv_req_notify_cq`). Arming is one-shot, as on
//! hardware: the next completion pushed into the CQ (armed solicited-only: the next
//! *solicited* one, a receive of a request sent with `SOLICITED`, or any completion in
//! error) queues one event on the channel and disarms the CQ. Events are raised under the
//! world's lock, in the order of the completions that raise them, and enter neither the
//! trace nor any random choice, so a seed still gives the same trace. The channel's handle
//! and its file descriptor are in `api/comp_channel.rs`.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;

use super::qp::ReqState;
use super::requester::msg_len;
use super::requester::rd_atomic;
use super::responder::RecvDone;
use super::World;
use crate::trace::TraceKind;
use crate::types::*;

/// The completion opcode of a send operation.
pub(crate) fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
        SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::Read { .. } => WcOpcode::RdmaRead,
        SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
    }
}

/// A `WrFlushErr` completion.
pub(crate) fn flush_wc(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> Wc {
    Wc {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode,
        byte_len: 0,
        imm_data: None,
        qp_num,
    }
}

impl World {
    /// Retires the head of responder `p`'s receive queue, which the transfer `rd` consumed,
    /// with its completion.
    pub(crate) fn complete_recv(&mut self, p: usize, rd: RecvDone) {
        let peer = self.tables.qps.get_mut(p).expect("live QP");
        peer.rq.pop_front();
        let wc = Wc {
            wr_id: rd.wr_id,
            status: rd.status,
            opcode: rd.opcode,
            byte_len: rd.byte_len,
            imm_data: rd.imm,
            qp_num: peer.qpn,
        };
        let cq = peer.recv_cq;
        self.push_cqe_se(cq, wc, rd.solicited);
    }

    /// Completes the oldest SQ entry of QP `q` with `status`: a CQE when signaled or
    /// failed (releasing earlier unsignaled slots), else the slot stays held.
    pub(crate) fn complete_front(&mut self, q: usize, status: WcStatus) {
        let Some(qp) = self.tables.qps.get_mut(q) else {
            return;
        };
        let Some(e) = qp.sq.pop_front() else {
            return;
        };
        if qp.req.sent > 0 {
            qp.req.sent -= 1;
            if rd_atomic(&e.wr.op) {
                qp.req.rd_inflight = qp.req.rd_inflight.saturating_sub(1);
            }
        }
        let signaled = qp.sig_all || e.wr.flags.contains(SendFlags::SIGNALED);
        if signaled || status != WcStatus::Success {
            qp.unsig_done = 0;
            let wc = Wc {
                wr_id: e.wr.wr_id,
                status,
                opcode: send_opcode(&e.wr.op),
                byte_len: msg_len(&e.wr) as u32,
                imm_data: None,
                qp_num: qp.qpn,
            };
            let cq = qp.send_cq;
            self.push_cqe(cq, wc);
        } else {
            qp.unsig_done += 1;
        }
        self.count_send_end(q, signaled || status != WcStatus::Success);
    }

    /// Completes the oldest SQ entry of QP `q` with error `status` and moves `q` to ERR.
    pub(crate) fn fail_front(&mut self, q: usize, status: WcStatus) {
        self.complete_front(q, status);
        self.set_err(q);
    }

    /// Pushes a completion; on overflow the CQ enters its error state and every QP using it
    /// moves to ERR (completions it can no longer take are dropped).
    pub(crate) fn push_cqe(&mut self, cq: usize, wc: Wc) {
        self.push_cqe_se(cq, wc, false);
    }

    /// [`World::push_cqe`] for a receive whose request asked for a solicited event
    /// (`se`): it raises the event of a CQ armed solicited-only, as does any completion
    /// in error (`ibv_req_notify_cq(3)`).
    pub(crate) fn push_cqe_se(&mut self, cq: usize, wc: Wc, se: bool) {
        let Some(c) = self.tables.cqs.get_mut(cq) else {
            return;
        };
        if c.overflowed {
            return;
        }
        let dev = c.dev;
        c.ready.store(true, Ordering::Release);
        if c.entries.len() < c.depth {
            c.entries.push_back(wc);
            let kind = TraceKind::Complete(wc.status, wc.opcode);
            self.trace(dev, wc.qp_num, kind, None, Some(wc.wr_id));
            self.notify_cq(cq, se || wc.status != WcStatus::Success);
            return;
        }
        c.overflowed = true;
        for q in 0..self.tables.qps.slots() {
            let uses = self
                .tables
                .qps
                .get(q)
                .is_some_and(|qp| qp.send_cq == cq || qp.recv_cq == cq);
            if uses {
                self.set_err(q);
            }
        }
    }

    /// Moves QP `q` to ERR, flushing its SQ then its RQ in posting order (once).
    pub(crate) fn set_err(&mut self, q: usize) {
        let Some(qp) = self.tables.qps.get_mut(q) else {
            return;
        };
        if qp.state == QpState::Err {
            return;
        }
        // A responder in ERR answers nothing: a requester asleep on its RNR NAK must wake
        // and find that out by retrying.
        self.wake_parked(q);
        let qp = self.tables.qps.get_mut(q).expect("live QP");
        qp.unsig_done = 0;
        // Timers and packets of the old incarnation become stale.
        qp.req = ReqState::default();
        self.tables.epochs = self.tables.epochs.wrapping_add(1);
        qp.epoch = self.tables.epochs;
        self.net.sched.events.cancel_timer(q);
        self.set_state(q, QpState::Err);
        // Pop one at a time: a flush CQE may overflow a CQ, which re-enters `set_err`.
        while let Some(qp) = self.tables.qps.get_mut(q) {
            let Some(e) = qp.sq.pop_front() else { break };
            let (wc, cq) = (
                flush_wc(e.wr.wr_id, send_opcode(&e.wr.op), qp.qpn),
                qp.send_cq,
            );
            self.push_cqe(cq, wc);
            self.count_send_end(q, true);
        }
        while let Some(qp) = self.tables.qps.get_mut(q) {
            let Some(r) = qp.rq.pop_front() else { break };
            let (wc, cq) = (flush_wc(r.wr_id, WcOpcode::Recv, qp.qpn), qp.recv_cq);
            self.push_cqe(cq, wc);
        }
    }
}

/// How a CQ is armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    /// For the next completion.
    Next,
    /// For the next solicited completion (or one in error).
    Solicited,
}

/// A CQ's part in the event path.
#[derive(Debug)]
pub(crate) struct CqNotify {
    /// What its events carry (`cq_context`): unique in the fabric, never reused.
    pub(crate) key: u64,
    /// The channel its events go to.
    channel: Option<usize>,
    armed: Option<Arm>,
    /// Events taken from the channel and not yet acknowledged.
    unacked: u32,
}

impl CqNotify {
    pub(crate) fn new(key: u64) -> CqNotify {
        CqNotify {
            key,
            channel: None,
            armed: None,
            unacked: 0,
        }
    }

    /// Arms the CQ (`ibv_req_notify_cq`) for its next completion, or its next solicited
    /// one; true when the CQ is on a channel (its events go somewhere).
    pub(crate) fn arm(&mut self, solicited_only: bool) -> bool {
        self.armed = Some(if solicited_only {
            Arm::Solicited
        } else {
            Arm::Next
        });
        self.channel.is_some()
    }

    /// Acknowledges `n` events taken (as many as there are).
    pub(crate) fn ack(&mut self, n: u32) {
        self.unacked = self.unacked.saturating_sub(n);
    }

    /// Events taken and not yet acknowledged.
    pub(crate) fn unacked(&self) -> u32 {
        self.unacked
    }
}

/// A channel in the world.
#[derive(Debug)]
struct ChanObj {
    dev: usize,
    /// `(cq slab index, key)`, oldest first.
    events: VecDeque<(usize, u64)>,
    /// Holds one byte while `events` is not empty.
    tx: UnixStream,
    /// The same socket as the handle's, to take that byte back.
    rx: UnixStream,
    /// CQs on this channel.
    refs: u32,
    open: bool,
}

/// The world's completion channels.
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    chans: Vec<Option<ChanObj>>,
    /// Last CQ key handed out.
    keys: u64,
    /// Events taken for CQs destroyed before they were acknowledged.
    pub(crate) destroyed_unacked: u64,
    /// A clock thread runs (threaded mode with a timed link).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) clock: bool,
}

impl Notifier {
    /// A fresh CQ key (from 1).
    pub(crate) fn next_key(&mut self) -> u64 {
        self.keys += 1;
        self.keys
    }

    /// Opens a channel of device `dev` whose byte goes through `tx` (and is taken back
    /// through `rx`, the same socket as the handle's); returns its id.
    pub(crate) fn open(&mut self, dev: usize, tx: UnixStream, rx: UnixStream) -> usize {
        let obj = ChanObj {
            dev,
            events: VecDeque::new(),
            tx,
            rx,
            refs: 0,
            open: true,
        };
        let chans = &mut self.chans;
        match chans.iter().position(Option::is_none) {
            Some(i) => {
                chans[i] = Some(obj);
                i
            }
            None => {
                chans.push(Some(obj));
                chans.len() - 1
            }
        }
    }

    /// The device of channel `id`.
    pub(crate) fn dev(&self, id: usize) -> Option<usize> {
        self.chans[id].as_ref().map(|c| c.dev)
    }

    /// Channel `id`'s handle is gone: it is freed once no CQ uses it.
    pub(crate) fn close(&mut self, id: usize) {
        if let Some(c) = self.chans[id].as_mut() {
            c.open = false;
        }
        self.free(id);
    }

    /// Events queued on channel `id`.
    pub(crate) fn pending(&self, id: usize) -> usize {
        self.chans[id].as_ref().map_or(0, |c| c.events.len())
    }

    fn free(&mut self, i: usize) {
        if self.chans[i]
            .as_ref()
            .is_some_and(|c| !c.open && c.refs == 0)
        {
            self.chans[i] = None;
        }
    }
}

impl World {
    /// A completion of CQ `cq` was pushed; `solicited` when it counts for a solicited-only
    /// arm. Raises the CQ's event if it is armed for it.
    pub(crate) fn notify_cq(&mut self, cq: usize, solicited: bool) {
        let Some(c) = self.tables.cqs.get_mut(cq) else {
            return;
        };
        let n = &mut c.notify;
        match n.armed {
            Some(Arm::Next) => {}
            Some(Arm::Solicited) if solicited => {}
            _ => return,
        }
        n.armed = None;
        let (key, ch) = (n.key, n.channel);
        if let Some(ch) = ch.and_then(|i| self.tables.notifier.chans.get_mut(i)?.as_mut()) {
            if ch.events.is_empty() {
                // Cannot fail short of a full socket buffer, and it holds at most one byte.
                let _ = ch.tx.write(&[1]);
            }
            ch.events.push_back((cq, key));
        }
    }

    /// Removes CQ `cq` from the event path (its handle is gone): disarmed, its queued
    /// events withdrawn (as the kernel does at `ibv_destroy_cq`), its channel released.
    pub(crate) fn detach_cq(&mut self, cq: usize) {
        let Some(c) = self.tables.cqs.get_mut(cq) else {
            return;
        };
        let n = &mut c.notify;
        n.armed = None;
        self.tables.notifier.destroyed_unacked += u64::from(n.unacked);
        n.unacked = 0;
        let Some(i) = n.channel.take() else {
            return;
        };
        if let Some(ch) = self.tables.notifier.chans[i].as_mut() {
            let before = ch.events.len();
            ch.events.retain(|&(c, _)| c != cq);
            if before > 0 && ch.events.is_empty() {
                drain(&mut ch.rx);
            }
            ch.refs -= 1;
        }
        self.tables.notifier.free(i);
    }

    /// Puts CQ `cq` (new) on channel `id`.
    pub(crate) fn attach_channel(&mut self, cq: usize, id: usize) {
        self.tables.cqs.get_mut(cq).expect("new CQ").notify.channel = Some(id);
        let ch = self.tables.notifier.chans[id]
            .as_mut()
            .expect("live channel");
        ch.refs += 1;
        ch.events.reserve(4);
    }

    /// Takes the oldest event of channel `id` (`ibv_get_cq_event`): the key of the CQ
    /// that raised it, which counts it as unacknowledged.
    pub(crate) fn take_channel_event(&mut self, id: usize) -> Option<u64> {
        let ch = self.tables.notifier.chans[id]
            .as_mut()
            .expect("live channel");
        let (cq, key) = ch.events.pop_front()?;
        if ch.events.is_empty() {
            drain(&mut ch.rx);
        }
        if let Some(c) = self.tables.cqs.get_mut(cq) {
            c.notify.unacked += 1;
        }
        Some(key)
    }

    /// Whether some CQ on a channel is armed (the clock thread runs while one is).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn any_armed(&self) -> bool {
        self.tables
            .cqs
            .iter()
            .any(|c| c.notify.armed.is_some() && c.notify.channel.is_some())
    }
}

/// Takes back the byte that marks a non-empty queue.
fn drain(rx: &mut UnixStream) {
    let mut b = [0u8; 1];
    let _ = rx.read(&mut b);
}
