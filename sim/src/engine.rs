//! The event loop: processing events in order, the requesters' timers, and how simulated
//! time follows the wall clock in threaded mode.
//!
//! Each queue pair has at most one timer (the local ACK timeout or an RNR wait), kept in
//! the event queue's indexed timer heap. Arming moves it, disarming removes it: a cancelled
//! timer leaves no event behind, so `run_until_idle` ends as soon as no work remains and
//! simulated time never jumps to a deadline that no longer matters.

use crate::config::{ack_timeout_ns, Mode};
use crate::sched::EvKind;
use crate::state::{TimerKind, World};
use crate::trace::TraceKind;
use crate::types::{QpState, WcStatus};

impl World {
    /// (Re)starts the local ACK timer of QP `q` (none with timeout code 0).
    pub(crate) fn arm_ack(&mut self, q: usize) {
        let code = self
            .qps
            .get(q)
            .and_then(|qp| qp.rts)
            .map_or(0, |r| r.timeout);
        match ack_timeout_ns(code) {
            Some(ns) => {
                let after = if self.cfg.instant_timers { 0 } else { ns };
                self.arm(q, self.now.saturating_add(after), TimerKind::Ack);
            }
            None => self.disarm(q),
        }
    }

    /// Sets QP `q`'s timer to fire at `at`, replacing any other.
    pub(crate) fn arm(&mut self, q: usize, at: u64, kind: TimerKind) {
        let Some(qp) = self.qps.get_mut(q) else {
            return;
        };
        qp.req.timer = Some((at, kind));
        self.events.set_timer(q, at);
    }

    /// Stops QP `q`'s timer.
    pub(crate) fn disarm(&mut self, q: usize) {
        if let Some(qp) = self.qps.get_mut(q) {
            qp.req.timer = None;
        }
        self.events.cancel_timer(q);
    }

    /// The timer of QP `q` fires.
    fn on_timer(&mut self, q: usize) {
        let not_ready = self.cfg.instant_timers && self.responder_not_ready(q);
        let Some(qp) = self.qps.get_mut(q) else {
            return;
        };
        let Some((_, kind)) = qp.req.timer.take() else {
            return;
        };
        if qp.state != QpState::Rts {
            return;
        }
        let (dev, qpn) = (qp.dev, qp.qpn);
        match kind {
            TimerKind::Ack => {
                let Some(head) = qp.sq.front().filter(|_| qp.req.sent > 0) else {
                    return;
                };
                let (psn, id) = (Some(head.psn), Some(head.wr.wr_id));
                if not_ready && !qp.req.not_ready && qp.req.retries > 0 {
                    // Hardware would retry into silence for `retries` more timeouts while
                    // the peer finishes connecting: wait that long, or until it is ready.
                    let code = qp.rts.map_or(0, |r| r.timeout);
                    let budget =
                        ack_timeout_ns(code).map(|ns| ns.saturating_mul(u64::from(qp.req.retries)));
                    (qp.req.not_ready, qp.req.retries) = (true, 0);
                    self.trace(dev, qpn, TraceKind::Timeout, psn, id);
                    if let Some(budget) = budget {
                        self.arm(q, self.now.saturating_add(budget), TimerKind::Ack);
                    }
                    return;
                }
                qp.req.not_ready = false;
                let exhausted = qp.req.retries == 0;
                qp.req.retries = qp.req.retries.saturating_sub(1);
                self.trace(dev, qpn, TraceKind::Timeout, psn, id);
                if exhausted {
                    return self.fail_front(q, WcStatus::RetryExcErr);
                }
            }
            TimerKind::Rnr => qp.req.rnr_wait = false,
        }
        self.go_back(q);
        self.pump(q);
    }

    /// Whether requester `q` talks to a live, reachable responder that is not yet in RTR
    /// but on its way (INIT: prepared, its endpoint handed out, not yet connected): a
    /// connection whose other side has not finished connecting. A responder in RESET is
    /// gone, not coming: the requester's retries run out at once, as before.
    fn responder_not_ready(&self, q: usize) -> bool {
        let Some(qp) = self.qps.get(q) else {
            return false;
        };
        let (Some(rtr), Some(dev)) = (qp.rtr, qp.peer_dev) else {
            return false;
        };
        if self.blocked(qp.dev, dev).is_some() {
            return false;
        }
        self.qp_index(rtr.dest_qp_num)
            .and_then(|r| self.qps.get(r))
            .is_some_and(|r| !r.dead && r.dev == dev && r.state == QpState::Init)
    }

    /// Responder `p` reached RTR: wakes the requester its RTR attributes name if it waits
    /// for `p` to become ready; it retransmits at once.
    pub(crate) fn wake_not_ready(&mut self, p: usize) {
        let Some(r) = self.requester_of(p) else {
            return;
        };
        let req = self.qps.get_mut(r).expect("live QP");
        if req.req.not_ready {
            req.req.not_ready = false;
            req.req.retries = req.rts.map_or(0, |a| a.retry_cnt).saturating_add(1);
            self.arm(r, self.now, TimerKind::Ack);
        }
    }

    /// Processes the next event, advancing simulated time to it; false if there is none.
    pub(crate) fn step(&mut self) -> bool {
        let Some(ev) = self.events.pop() else {
            return false;
        };
        self.now = self.now.max(ev.time);
        match ev.kind {
            EvKind::Deliver(pkt) => self.deliver(pkt),
            EvKind::Timer { qp } => self.on_timer(qp as usize),
        }
        true
    }

    /// Wall-clock nanoseconds since the fabric was created.
    pub(crate) fn wall(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Threaded mode: processes the next event if the wall clock has reached it (at its
    /// own time, so responses leave when they would have); false if none is due.
    pub(crate) fn run_due_one(&mut self) -> bool {
        let wall = self.wall();
        if self.events.next_time().is_some_and(|t| t <= wall) {
            return self.step();
        }
        self.now = self.now.max(wall);
        false
    }

    /// Threaded mode: processes, in order and each at its own time, every event the wall
    /// clock has reached, then moves simulated time to the wall clock. Returns how many
    /// ran. Does nothing in stepped mode.
    pub(crate) fn run_due(&mut self) -> usize {
        if self.cfg.mode != Mode::Threaded {
            return 0;
        }
        if self.untimed && self.events.is_empty() {
            // Nothing to run, and on an untimed fabric nothing reads the time: skip the
            // clock (two thirds of an idle poll's cost). `Fabric::now` reads it itself.
            return 0;
        }
        let wall = self.wall();
        let mut n = 0;
        while self.events.next_time().is_some_and(|t| t <= wall) {
            self.step();
            n += 1;
        }
        self.now = self.now.max(wall);
        n
    }
}
