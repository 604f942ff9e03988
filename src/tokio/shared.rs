//! The state an async channel's handles, its operations and its reactor share
//! ([`Shared`], under one lock: [`Inner`]): who waits on which slot, the buffers of
//! dropped operations, the reactor's waker and deadline, arming.

use super::*;

/// The channel, shared by its handles, the operations under way and the reactor.
pub(crate) struct Shared<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    pub(super) inner: Mutex<Inner<P, B, DEPTH, SGES>>,
    pub(super) config: ChannelConfig,
}

pub(crate) struct Inner<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    pub(super) ch: Channel<P, DEPTH, SGES>,
    /// Per queue (send, receive), by sequence number modulo `DEPTH`: who waits for the
    /// request there, and the buffer of a request whose future was dropped.
    pub(super) slots: [[Slot<B>; DEPTH]; 2],
    /// The reactor's waker, while it sleeps.
    pub(super) reactor: Option<Waker>,
    /// Operations waiting for a free slot: whoever takes an outcome wakes them. At most
    /// [`SPACE_WAITERS`] of them (room reserved at set-up, so waiting never allocates); one
    /// that finds the list full tries again at the runtime's next turn.
    pub(super) space: Vec<Waker>,
    /// The earliest deadline of an operation waiting for a free slot: when it passes, the
    /// reactor wakes them all (each looks at its own deadline).
    pub(super) space_until: Option<Instant>,
    /// The instant the reactor's deadline timer is set to, while it sleeps (`None`: no
    /// deadline to keep). An operation that goes to sleep with an earlier deadline wakes
    /// the reactor, which sets its timer again.
    pub(super) timer_at: Option<Instant>,
    /// The last handle is gone.
    pub(super) closing: bool,
    /// The queues were armed and no event was taken since. Armed only while someone
    /// sleeps (a task, an orphaned buffer, the close): busy-polling tasks need no events,
    /// and an armed queue costs a write to the descriptor per completion.
    pub(super) armed: bool,
    /// The queues are shared, led by their reactors (which run while the channel is
    /// attached): the channel's reactor sleeps on its inboxes, and "arming" registers it
    /// there.
    pub(super) on_queues: bool,
    /// A slot may hold a sleeping operation or an orphan: set when one is left there,
    /// recomputed by [`wake_finished`](Self::wake_finished).
    pub(super) parked: bool,
    /// The device is dead: a pass of the reactor polled a queue and it failed with the
    /// device's fatal error. Operations end at once (as at their deadline, then the
    /// discard reports the fatal error), not at their timeout.
    pub(super) dead: bool,
}

pub(super) struct Slot<B> {
    pub(super) waiting: Option<Waiting>,
    pub(super) orphan: Option<(Pending, B)>,
}

/// An operation asleep until its request finishes or `until` passes (the reactor wakes it
/// at whichever comes first).
pub(super) struct Waiting {
    pub(super) pending: Pending,
    pub(super) waker: Waker,
    pub(super) until: Option<Instant>,
}

impl<B> Default for Slot<B> {
    fn default() -> Self {
        Slot {
            waiting: None,
            orphan: None,
        }
    }
}

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Shared<P, B, DEPTH, SGES> {
    /// The lock on the channel. Never held across an `.await` (the guard is not `Send`).
    /// It is not poisoned: a panic while it was held (a bug) leaves the state as it was.
    #[inline(always)]
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner<P, B, DEPTH, SGES>> {
        self.inner.lock()
    }

    /// Slots came free (outcomes were taken) under `inner`: wakes the operations waiting
    /// for room, if any, and unlocks.
    #[inline(always)]
    pub(super) fn freed(&self, mut inner: MutexGuard<'_, Inner<P, B, DEPTH, SGES>>) {
        inner.wake_space();
    }

    /// The last handle went: flush what is in flight and let the reactor end.
    pub(super) fn close(&self) {
        let mut inner = self.lock();
        inner.closing = true;
        if inner.ch.busy() {
            inner.arm();
            let _ = inner.ch.abort();
        }
        if let Some(w) = inner.reactor.take() {
            w.wake();
        }
    }
}

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Inner<P, B, DEPTH, SGES> {
    /// Arms the queues unless they are; whether it armed them now (then the caller polls
    /// again). An arm that fails is reported by the next poll.
    pub(super) fn arm(&mut self) -> bool {
        if self.on_queues {
            // The channel's reactor, if it sleeps, is woken when a completion is routed to
            // an inbox (one that is awake registers before it sleeps: `needs_events`).
            // Everything pending was routed: the caller polls again.
            if let Some(w) = &self.reactor {
                let _ = self.ch.sleep_task(w);
            }
            return true;
        }
        if self.armed {
            return false;
        }
        self.armed = self.ch.arm_events().is_ok();
        true
    }

    /// Whether anyone waits for an event: a sleeping task, an orphaned buffer, the close.
    pub(super) fn needs_events(&self) -> bool {
        self.closing
            || self
                .slots
                .iter()
                .flatten()
                .any(|s| s.waiting.is_some() || s.orphan.is_some())
    }

    pub(super) fn slot(&mut self, p: &Pending) -> &mut Slot<B> {
        &mut self.slots[usize::from(p.is_receive())][p.slot(DEPTH)]
    }

    /// `p`'s outcome if it finished (polling once if not yet).
    #[inline(always)]
    pub(super) fn finish(&mut self, p: &Pending) -> Option<Result<Completion, Error<P::Error>>> {
        // A failed poll (a dead device) is reported by the reactor's pass and bounded by
        // the timeout: the request is still lent to the device.
        let r = self.ch.try_finish(p);
        if r.is_some() {
            self.slot(p).waiting = None;
        }
        self.polled();
        r
    }

    /// After an operation polled the queues: on shared queues, the completions it took
    /// for other operations of the channel (recorded, not routed through an inbox, so
    /// nothing else wakes them) wake those now. On queues of its own the reactor is woken
    /// by the event every completion after an arm raises, whoever polls it.
    #[inline]
    pub(super) fn polled(&mut self) {
        if self.on_queues && self.parked && self.wake_finished() {
            self.wake_space();
        }
    }

    /// Wakes the tasks whose requests finished; drops the buffers of orphans that did.
    /// Returns whether an orphan was released (a slot came free).
    pub(super) fn wake_finished(&mut self) -> bool {
        let Inner { ch, slots, .. } = self;
        let mut parked = false;
        for slot in slots.iter_mut().flatten() {
            if let Some(w) = &slot.waiting {
                if ch.has_finished(&w.pending) {
                    if let Some(w) = slot.waiting.take() {
                        w.waker.wake();
                    }
                } else {
                    parked = true;
                }
            }
            parked |= slot.orphan.is_some();
        }
        self.parked = parked;
        self.release_orphans()
    }

    /// A sleeping operation's deadline: the reactor is woken to set its timer again if
    /// `until` comes before the instant its timer is set to (or it has none). The reactor
    /// reads the deadlines under the same lock before it sleeps, so either it sees this
    /// one or its waker is here to be woken.
    pub(super) fn deadline_set(&mut self, until: Instant) {
        if self.timer_at.map_or(true, |at| until < at) {
            if let Some(w) = self.reactor.take() {
                w.wake();
            }
        }
    }

    /// Leaves `waker` with the channel until room comes free (once: a waker that would
    /// wake the same task is not added again); false if the list is full.
    pub(super) fn wait_for_space(&mut self, waker: &Waker) -> bool {
        if self.space.iter().any(|w| w.will_wake(waker)) {
            return true;
        }
        if self.space.len() == SPACE_WAITERS {
            return false;
        }
        self.space.push(waker.clone());
        true
    }

    /// Wakes every operation waiting for room (each tries to post again). Under the lock:
    /// a waker only schedules its task (tokio's never run it in `wake`).
    #[inline]
    /// Records that a poll failed with `kind`: a dead device wakes every sleeping
    /// operation, which then ends (`InFlight::poll`).
    pub(super) fn poll_failed(&mut self, kind: crate::error::ErrorKind) {
        if kind != crate::error::ErrorKind::DeviceFatal || self.dead {
            return;
        }
        self.dead = true;
        for slot in self.slots.iter_mut().flatten() {
            if let Some(w) = slot.waiting.take() {
                w.waker.wake();
            }
        }
        self.wake_space();
    }

    /// Wakes the operations waiting for space. Inline: the usual call finds none.
    #[inline]
    pub(super) fn wake_space(&mut self) {
        if !self.space.is_empty() {
            self.wake_space_now();
        }
    }

    #[inline(never)]
    fn wake_space_now(&mut self) {
        for w in self.space.drain(..) {
            w.wake();
        }
    }

    /// The earliest deadline of a sleeping operation (in a slot, or waiting for space).
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let slots = self.slots.iter().flatten();
        let untils = slots.filter_map(|s| s.waiting.as_ref().and_then(|w| w.until));
        untils.chain(self.space_until).min()
    }

    /// Wakes the operations whose deadline passed by `now`: sleepers in slots, and, once
    /// the earliest of their deadlines passed, every operation waiting for space (each
    /// looks at its own deadline and at the queue; those not late wait again).
    pub(super) fn wake_late(&mut self, now: Instant) {
        for slot in self.slots.iter_mut().flatten() {
            if slot
                .waiting
                .as_ref()
                .is_some_and(|w| w.until.is_some_and(|u| u <= now))
            {
                if let Some(w) = slot.waiting.take() {
                    w.waker.wake();
                }
            }
        }
        if self.space_until.is_some_and(|u| u <= now) {
            self.space_until = None;
            self.wake_space();
        }
    }

    pub(super) fn release_orphans(&mut self) -> bool {
        let Inner { ch, slots, .. } = self;
        let mut released = false;
        for slot in slots.iter_mut().flatten() {
            if let Some((p, _)) = &slot.orphan {
                if ch.take_finished(p).is_some() {
                    slot.orphan = None;
                    released = true;
                }
            }
        }
        released
    }

    pub(super) fn has_orphans(&self) -> bool {
        self.slots.iter().flatten().any(|s| s.orphan.is_some())
    }
}
