//! Completion channels (`ibv_comp_channel`), the HCA's side: a CQ's arming, and the events
//! its completions raise on its channel.
//!
//! A CQ created on a channel can be armed (`ibv_req_notify_cq`). Arming is one-shot, as on
//! hardware: the next completion pushed into the CQ (armed solicited-only: the next
//! *solicited* one, a receive of a request sent with `SOLICITED`, or any completion in
//! error) queues one event on the channel and disarms the CQ. Completions already in the CQ
//! when it is armed raise nothing.
//!
//! The channel's file descriptor is readable exactly while events are queued: one byte
//! sits in a socket pair whenever the queue is not empty. Events are raised under the
//! world's lock, in the order of the completions that raise them (`cq.rs`), and enter
//! neither the trace nor any random choice, so a seed still gives the same trace. The
//! channel's handle, its descriptor and the clock thread that wakes sleepers on a timed
//! fabric are in `api/comp_channel.rs`.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

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

    /// Whether the CQ is armed (its next completion may raise an event).
    #[inline]
    pub(crate) fn armed(&self) -> bool {
        self.armed.is_some()
    }

    /// One more event was taken for this CQ.
    pub(crate) fn took_event(&mut self) {
        self.unacked += 1;
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

    /// Puts a new CQ, whose part is `n`, on channel `id`.
    pub(crate) fn attach(&mut self, n: &mut CqNotify, id: usize) {
        n.channel = Some(id);
        let ch = self.chans[id].as_mut().expect("live channel");
        ch.refs += 1;
        ch.events.reserve(4);
    }

    /// A completion of CQ `cq` (whose part is `n`) was pushed; `solicited` when it counts
    /// for a solicited-only arm. Raises the CQ's event if it is armed for it.
    #[inline]
    pub(crate) fn notify(&mut self, cq: usize, n: &mut CqNotify, solicited: bool) {
        match n.armed {
            Some(Arm::Next) => {}
            Some(Arm::Solicited) if solicited => {}
            _ => return,
        }
        n.armed = None;
        let (key, ch) = (n.key, n.channel);
        if let Some(ch) = ch.and_then(|i| self.chans.get_mut(i)?.as_mut()) {
            if ch.events.is_empty() {
                // Cannot fail short of a full socket buffer, and it holds at most one byte.
                let _ = ch.tx.write(&[1]);
            }
            ch.events.push_back((cq, key));
        }
    }

    /// Takes the oldest event of channel `id` (`ibv_get_cq_event`): the CQ that raised it
    /// and its key.
    pub(crate) fn take(&mut self, id: usize) -> Option<(usize, u64)> {
        let ch = self.chans[id].as_mut().expect("live channel");
        let (cq, key) = ch.events.pop_front()?;
        if ch.events.is_empty() {
            drain(&mut ch.rx);
        }
        Some((cq, key))
    }

    /// Removes CQ `cq` (whose part is `n`) from the event path (its handle is gone):
    /// disarmed, its queued events withdrawn (as the kernel does at `ibv_destroy_cq`), its
    /// channel released.
    pub(crate) fn detach(&mut self, cq: usize, n: &mut CqNotify) {
        n.armed = None;
        self.destroyed_unacked += u64::from(n.unacked);
        n.unacked = 0;
        let Some(i) = n.channel.take() else {
            return;
        };
        if let Some(ch) = self.chans[i].as_mut() {
            let before = ch.events.len();
            ch.events.retain(|&(c, _)| c != cq);
            if before > 0 && ch.events.is_empty() {
                drain(&mut ch.rx);
            }
            ch.refs -= 1;
        }
        self.free(i);
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

/// Takes back the byte that marks a non-empty queue.
fn drain(rx: &mut UnixStream) {
    let mut b = [0u8; 1];
    let _ = rx.read(&mut b);
}
