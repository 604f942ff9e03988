//! The operation future ([`OpFuture`]): posting, busy polling, sleeping until the
//! reactor wakes it, and leaving its buffer with the channel when dropped ([`InFlight`]).

use crate::types::{SendFlags, SendOp};

use super::*;

/// An operation under way: what [`send`](AsyncChannel::send), [`write`](AsyncChannel::write)
/// and the others return. Posted when called; it ends with the outcome and the buffer.
/// Dropped once posted, it leaves the buffer with the channel until the device is done
/// with it ([`InFlight`]).
///
/// Written by hand rather than as an `async` block: it holds no timer (a sleeping
/// operation leaves its deadline with the reactor) and no intrusive list node (operations
/// waiting for room leave their waker with the channel), so nothing in it is pinned, and
/// it is small: futures are moved by value at every `.await` and `join!`.
pub(super) struct OpFuture<'a, P: Provider, B: IoBuf, F, const DEPTH: usize, const SGES: usize> {
    pub(super) shared: &'a Shared<P, B, DEPTH, SGES>,
    pub(super) stage: Stage<'a, P, B, DEPTH, SGES>,
    pub(super) clock: Clock,
    /// Turns the completion into the operation's value (a function without state).
    pub(super) finish: F,
}

/// Where an operation is, with its buffer's gather entry.
pub(super) enum Stage<'a, P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    /// Refused, or finished within its post: the outcome and the buffer.
    Ended(Result<Completion, Error<P::Error>>, B, Sge),
    /// The queue was full: posting is tried again once there is room.
    Full(B, Sge, Post),
    /// Posted: its outcome is awaited, within the channel's timeout.
    Posted(InFlight<'a, P, B, DEPTH, SGES>, Sge),
    /// Timed out: the queue pair is in the error state, and the flush is awaited until the
    /// clock's deadline (now the grace's), after which what is left is discarded.
    Flushing(InFlight<'a, P, B, DEPTH, SGES>, Sge),
    /// The outcome was handed out.
    Done,
}

// No field of an `Op` is ever pinned (it holds no timer and no list node), so it may move.
impl<P: Provider, B: IoBuf, F, const DEPTH: usize, const SGES: usize> Unpin
    for OpFuture<'_, P, B, F, DEPTH, SGES>
{
}

impl<P: Provider, B: IoBuf, T, F, const DEPTH: usize, const SGES: usize> Future
    for OpFuture<'_, P, B, F, DEPTH, SGES>
where
    F: FnOnce(Completion, Sge) -> Result<T, Error<P::Error>> + Copy,
{
    type Output = BufResult<T, B, P::Error>;

    #[inline(always)]
    fn poll(self: core::pin::Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // The two common ends here, the rest (room, time-outs, flushes) out of line.
        let OpFuture {
            shared,
            stage,
            clock,
            ..
        } = this;
        match stage {
            // Finished within its post (as a send on an idle link often is).
            Stage::Ended(..) => {
                if let Stage::Ended(r, buf, sge) = core::mem::replace(stage, Stage::Done) {
                    return Poll::Ready(this.hand_out(r, buf, sge));
                }
                unreachable!("the stage was Ended")
            }
            Stage::Posted(op, sge) => match op.step(cx, &mut || clock.deadline(shared)) {
                Poll::Pending => Poll::Pending,
                // The buffer out of the in-flight record, which then holds nothing (its
                // outcome was taken): forgotten, it leaks nothing, and the drop glue of
                // the whole stage is skipped.
                Poll::Ready(Some(r)) => {
                    let (buf, sge) = (op.give_back(), *sge);
                    core::mem::forget(core::mem::replace(stage, Stage::Done));
                    Poll::Ready(this.hand_out(r, buf, sge))
                }
                Poll::Ready(None) => this.poll_rest(cx, Some(Event::Late)),
            },
            _ => this.poll_rest(cx, None),
        }
    }
}

impl<P: Provider, B: IoBuf, T, F, const DEPTH: usize, const SGES: usize>
    OpFuture<'_, P, B, F, DEPTH, SGES>
where
    F: FnOnce(Completion, Sge) -> Result<T, Error<P::Error>> + Copy,
{
    /// [`poll`](Future::poll) past its two common ends: waiting for room, the time-out
    /// and the flush. `first` is what moved the current stage on, if the caller knows.
    #[inline(never)]
    pub(super) fn poll_rest(
        &mut self,
        cx: &mut TaskContext<'_>,
        mut first: Option<Event<P::Error>>,
    ) -> Poll<BufResult<T, B, P::Error>> {
        loop {
            let OpFuture {
                shared,
                stage,
                clock,
                ..
            } = self;
            let event = match first.take() {
                Some(event) => event,
                None => match stage {
                    Stage::Ended(..) | Stage::Done => Event::Now,
                    Stage::Full(_, sge, what) => match room(shared, clock, what, *sge, cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(p)) => Event::Posted(p),
                        Poll::Ready(Err(e)) => Event::Ended(Err(e.unwrap_or(Error::Timeout))),
                    },
                    Stage::Posted(op, _) => match op.step(cx, &mut || clock.deadline(shared)) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Some(r)) => Event::Ended(r),
                        Poll::Ready(None) => Event::Late,
                    },
                    Stage::Flushing(op, _) => {
                        match op.step(cx, &mut || clock.deadline(shared)) {
                            Poll::Pending => return Poll::Pending,
                            // Flushed (or finished after all): the bound was missed all
                            // the same.
                            Poll::Ready(Some(_)) => Event::Ended(Err(Error::Timeout)),
                            Poll::Ready(None) => Event::Late,
                        }
                    }
                },
            };
            match (core::mem::replace(stage, Stage::Done), event) {
                (Stage::Ended(r, buf, sge), _) => return Poll::Ready(self.hand_out(r, buf, sge)),
                (Stage::Done, _) => panic!("an operation polled after its outcome"),
                (Stage::Full(buf, sge, _), Event::Posted(p)) => {
                    *stage = Stage::Posted(InFlight::new(shared, p, buf), sge);
                }
                (Stage::Full(buf, sge, _), Event::Ended(r)) => {
                    return Poll::Ready(self.hand_out(r, buf, sge));
                }
                (Stage::Posted(mut op, sge) | Stage::Flushing(mut op, sge), Event::Ended(r)) => {
                    return Poll::Ready(self.hand_out(r, op.give_back(), sge));
                }
                (Stage::Posted(op, sge), Event::Late) => {
                    // Timed out: error state, the flush awaited for the grace, then
                    // whatever is left discarded through RESET; the outcome is `Timeout`,
                    // the buffer free again. A grace past what `Instant` holds is no
                    // bound (as for the blocking calls).
                    let _ = shared.lock().ch.abort();
                    clock.restart(Instant::now().checked_add(shared.config.flush_grace));
                    *stage = Stage::Flushing(op, sge);
                }
                (Stage::Flushing(mut op, sge), Event::Late) => {
                    let e = op.discard().unwrap_or(Error::Timeout);
                    return Poll::Ready(self.hand_out(Err(e), op.give_back(), sge));
                }
                (Stage::Full(..) | Stage::Posted(..) | Stage::Flushing(..), _) => {
                    unreachable!("a waiting stage met an event of another stage")
                }
            }
        }
    }
}

/// What moved an operation on.
pub(super) enum Event<E> {
    /// Nothing to wait for: the stage holds the outcome (or there is none).
    Now,
    /// Its request was posted (it had waited for room).
    Posted(Pending),
    /// Its outcome.
    Ended(Result<Completion, Error<E>>),
    /// Its deadline passed.
    Late,
}

impl<P: Provider, B: IoBuf, T, F, const DEPTH: usize, const SGES: usize>
    OpFuture<'_, P, B, F, DEPTH, SGES>
where
    F: FnOnce(Completion, Sge) -> Result<T, Error<P::Error>> + Copy,
{
    pub(super) fn hand_out(
        &mut self,
        r: Result<Completion, Error<P::Error>>,
        buf: B,
        sge: Sge,
    ) -> BufResult<T, B, P::Error> {
        let finish = self.finish;
        (r.and_then(|c| finish(c, sge)), buf)
    }
}

/// One attempt of an operation that found the queue full: its request posted (`Ok`),
/// refused (`Err(Some)`) or out of time (`Err(None)`), or `Pending` with its waker left
/// with the channel (takers wake it; the reactor wakes it at its deadline). The attempt
/// and the registration are made under one lock, so a slot freed in between is not missed.
pub(super) fn room<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize>(
    shared: &Shared<P, B, DEPTH, SGES>,
    clock: &mut Clock,
    what: &Post,
    sge: Sge,
    cx: &mut TaskContext<'_>,
) -> Poll<Result<Pending, Option<Error<P::Error>>>> {
    let end = clock.deadline(shared);
    let mut inner = shared.lock();
    match what.post(&mut inner.ch, sge) {
        Ok(p) => return Poll::Ready(Ok(p)),
        Err(Error::QueueFull { .. }) => {}
        Err(e) => return Poll::Ready(Err(Some(e))),
    }
    if end.is_some_and(|end| Instant::now() >= end) {
        return Poll::Ready(Err(None));
    }
    if inner.wait_for_space(cx.waker()) {
        if let Some(end) = end {
            inner.space_until = Some(inner.space_until.map_or(end, |u| u.min(end)));
            inner.deadline_set(end);
        }
    } else {
        // The list is full: try again at the runtime's next turn.
        cx.waker().wake_by_ref();
    }
    Poll::Pending
}

/// An operation's deadline: the channel's timeout from the first time it is asked for
/// (the clock is read then), or the flush grace's end once it timed out.
#[derive(Default)]
pub(super) struct Clock {
    /// `None` until first asked for; then the deadline (`None`: no bound, also for a
    /// timeout past what `Instant` holds).
    pub(super) deadline: Option<Option<Instant>>,
}

impl Clock {
    pub(super) fn deadline<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize>(
        &mut self,
        shared: &Shared<P, B, DEPTH, SGES>,
    ) -> Option<Instant> {
        *self.deadline.get_or_insert_with(|| {
            let timeout = shared.config.timeout?;
            Instant::now().checked_add(timeout)
        })
    }

    /// From now on the deadline is `end`.
    pub(super) fn restart(&mut self, end: Option<Instant>) {
        self.deadline = Some(end);
    }
}

/// Operations that may wait for room at once with their waker left with the channel.
pub(super) const SPACE_WAITERS: usize = 64;

/// How often a busy-polling operation reads the clock for its timeout (in turns).
pub(super) const CLOCK_EVERY: u32 = 16;

/// Polls per turn of the runtime while busy polling (a microsecond or two; the lock is
/// let go between them).
pub(super) const SPINS_PER_TURN: u32 = 1024;

/// Polls at an operation's first poll before it lets the task go on: long enough for a
/// simulated round trip.
pub(super) const FIRST_SPINS: u32 = 64;

/// What an operation that found its queue full posts over its buffer's entry once there
/// is room: only what the work request needs. Its checks (the remote region's room, an
/// atomic's size and the device's support) were passed at the first attempt, which found
/// the queue full only after them; a future holding this is as small as one that posted.
#[derive(Clone, Copy)]
pub(super) enum Post {
    /// A receive into the entry.
    Receive,
    /// A send-queue operation, the entry its local memory.
    Send(SendOp, SendFlags),
}

impl Post {
    /// Posts it over `sge` on `ch`.
    #[inline(always)]
    pub(super) fn post<P: Provider, const DEPTH: usize, const SGES: usize>(
        &self,
        ch: &mut Channel<P, DEPTH, SGES>,
        sge: Sge,
    ) -> Result<Pending, Error<P::Error>> {
        match *self {
            Post::Receive => ch.post_receive_pending([sge]),
            Post::Send(op, flags) => ch.post_admitted_pending(sge, op, flags),
        }
    }
}

/// Polls both of the channel's queues (for a busy operation, which polls only its own):
/// whether they failed because the device died (then the channel is marked dead).
#[cold]
#[inline(never)]
fn meets_dead_device<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize>(
    inner: &mut Inner<P, B, DEPTH, SGES>,
) -> bool {
    if let Err(e) = inner.ch.poll_queues() {
        inner.poll_failed(e.kind());
    }
    inner.wake_finished();
    inner.dead
}

/// The outcome of a send, write or read: done.
pub(super) fn done<E>(_: Completion, _: Sge) -> Result<(), Error<E>> {
    Ok(())
}

/// The outcome of an atomic: the remote value before, which the device wrote into the
/// buffer `sge` names.
pub(super) fn old_value<E>(_: Completion, sge: Sge) -> Result<u64, Error<E>> {
    // SAFETY: the operation finished, so the device wrote the 8 bytes `sge` names and
    // touches them no more; the buffer owns that memory and nothing else borrows it
    // (`IoBuf`'s contract), so reading them is sound. The read is unaligned-safe.
    Ok(unsafe { (sge.addr as *const u64).read_unaligned() })
}

/// What one poll of an [`InFlight`] found.
pub(super) enum Step<T> {
    /// The outcome.
    Done(T),
    /// Not yet: poll again at the runtime's next turn (no wake-up is arranged).
    Busy,
    /// Not yet: the reactor wakes the task (its waker and deadline are in the request's
    /// slot).
    Asleep,
    /// Not yet, and the deadline passed.
    Late,
}

/// A posted request and its buffer; dropped unfinished, it leaves the buffer with the
/// channel until the device is done with it.
pub(super) struct InFlight<'a, P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> {
    pub(super) shared: &'a Shared<P, B, DEPTH, SGES>,
    /// `Some` until the outcome was taken.
    pub(super) pending: Option<Pending>,
    /// `Some` until given back or left with the channel.
    pub(super) buf: Option<B>,
    /// Polls that found it unfinished.
    pub(super) polls: u32,
}

impl<'a, P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize>
    InFlight<'a, P, B, DEPTH, SGES>
{
    pub(super) fn new(shared: &'a Shared<P, B, DEPTH, SGES>, pending: Pending, buf: B) -> Self {
        InFlight {
            shared,
            pending: Some(pending),
            buf: Some(buf),
            polls: 0,
        }
    }

    /// The outcome, or `None` once the instant `end` gives (asked at the first poll that
    /// needs it; `None`: no bound) has passed.
    ///
    /// Busy polling comes back at the runtime's next turn by waking its own task
    /// (`wake_by_ref`), not through [`yield_now`](tokio::task::yield_now), whose deferred
    /// wake-up parks the runtime on the I/O driver first.
    pub(super) fn step(
        &mut self,
        cx: &mut TaskContext<'_>,
        end: &mut impl FnMut() -> Option<Instant>,
    ) -> Poll<Option<Result<Completion, Error<P::Error>>>> {
        let late = match self.poll(cx, end) {
            Step::Done(r) => return Poll::Ready(Some(r)),
            // Busy: the clock every few turns (the first read starts the bound, a few
            // microseconds after the post).
            Step::Busy => {
                let late =
                    self.polls % CLOCK_EVERY == 0 && end().is_some_and(|end| Instant::now() >= end);
                if !late {
                    cx.waker().wake_by_ref();
                }
                late
            }
            Step::Asleep => false,
            Step::Late => true,
        };
        if late {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    pub(super) fn poll(
        &mut self,
        cx: &mut TaskContext<'_>,
        end: &mut impl FnMut() -> Option<Instant>,
    ) -> Step<Result<Completion, Error<P::Error>>> {
        let Some(pending) = self.pending.as_ref() else {
            return Step::Done(Err(Error::InvalidAttribute("polled after completion")));
        };
        // Busy: a few polls here, then again at the runtime's next turn (busy polling
        // that lets other tasks and the I/O driver run); fewer at the first poll, whose
        // task may have more to post (in a future it has not called yet) before this
        // request can finish. Sleeping: one poll, then the reactor wakes us.
        let spins = match (self.sleeping(), self.polls) {
            (true, _) => 1,
            (false, 0) => FIRST_SPINS,
            (false, _) => SPINS_PER_TURN,
        };
        let mut inner = self.shared.lock();
        for spin in 1..=spins {
            if let Some(r) = inner.finish(pending) {
                self.shared.freed(inner);
                self.pending = None;
                return Step::Done(r);
            }
            if spin < spins {
                drop(inner);
                core::hint::spin_loop();
                inner = self.shared.lock();
            }
        }
        if !self.sleeping() {
            // Busy polls see only their own queue's outcome: every few turns (as often as
            // the clock is read, never at the first, which most operations end by) poll
            // both queues, so a dead device is met here too.
            if self.polls % CLOCK_EVERY == CLOCK_EVERY - 1 && meets_dead_device(&mut inner) {
                return Step::Late;
            }
            self.polls += 1;
            return Step::Busy;
        }
        if inner.dead {
            // The device died: end now, as at the deadline (the discard reports it).
            return Step::Late;
        }
        // Arm, then poll again: a completion before the arm raises no event.
        if inner.arm() {
            if let Some(r) = inner.finish(pending) {
                self.shared.freed(inner);
                self.pending = None;
                return Step::Done(r);
            }
        }
        // Asleep until the reactor wakes us: on the outcome, or at the deadline.
        let until = end();
        if until.is_some_and(|until| Instant::now() >= until) {
            return Step::Late;
        }
        inner.parked = true;
        inner.slot(pending).waiting = Some(Waiting {
            pending: pending.duplicate(),
            waker: cx.waker().clone(),
            until,
        });
        if let Some(until) = until {
            inner.deadline_set(until);
        }
        Step::Asleep
    }

    /// Whether the operation waits for the reactor now (rather than polling at every turn
    /// of the runtime), by the channel's wait policy.
    pub(super) fn sleeping(&self) -> bool {
        match self.shared.config.wait {
            WaitPolicy::Spin => false,
            WaitPolicy::SpinYield => self.polls >= BUSY_POLLS,
            _ => true,
        }
    }

    /// After the flush grace: discards what the device still holds through RESET, so the
    /// buffer is free; a fatal error met on the way.
    pub(super) fn discard(&mut self) -> Option<Error<P::Error>> {
        let mut inner = self.shared.lock();
        let mut fatal = None;
        inner.ch.discard(&mut fatal);
        inner.release_orphans();
        if let Some(p) = self.pending.take() {
            let _ = inner.ch.take_finished(&p);
        }
        // The others' requests ended with this one's (flushed or discarded).
        inner.polled();
        self.shared.freed(inner);
        fatal
    }

    pub(super) fn give_back(&mut self) -> B {
        self.buf
            .take()
            .expect("an in-flight buffer is given back once (InFlight invariant)")
    }
}

impl<P: Provider, B: IoBuf, const DEPTH: usize, const SGES: usize> Drop
    for InFlight<'_, P, B, DEPTH, SGES>
{
    fn drop(&mut self) {
        // Given back (the common end): nothing is left with the channel.
        if self.buf.is_none() {
            return;
        }
        let (Some(pending), Some(buf)) = (self.pending.take(), self.buf.take()) else {
            return;
        };
        let mut inner = self.shared.lock();
        inner.slot(&pending).waiting = None;
        // The reactor releases the buffer on an event: arm, then look.
        inner.arm();
        let _ = inner.ch.poll_queues();
        inner.polled();
        if inner.ch.take_finished(&pending).is_some() {
            self.shared.freed(inner);
            drop(buf);
        } else {
            inner.parked = true;
            let slot = inner.slot(&pending);
            slot.orphan = Some((pending, buf));
        }
    }
}

/// Polls an operation makes, one per turn of the runtime, before it sleeps until the
/// reactor wakes it, with [`WaitPolicy::SpinYield`] (a few tens of microseconds; with
/// [`WaitPolicy::Spin`] it never sleeps, with [`WaitPolicy::SpinSleep`] at once).
pub(super) const BUSY_POLLS: u32 = 2;
