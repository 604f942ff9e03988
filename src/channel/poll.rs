//! Polling: completions from the completion queues into the rings, and the waits built on
//! it (blocking calls, unpolled handles, scopes, reset).

use super::*;
use crate::error::{ErrorKind, ProviderError};
use crate::types::WcStatus;

/// Polls `cq` and records what it returns in `ring`: one completion first, and only if
/// there was one, a batch. The completions land on the stack: a channel keeps none of
/// its own (a node holds a channel per peer and direction, and `POLL_BATCH` completions
/// are 640 bytes), and a poll that finds nothing, the usual one of a spinning wait or an
/// idle pass, sets up 40 bytes, not 640.
fn poll_into<P: Provider, W: WorkRequest, const DEPTH: usize>(
    cq: &mut Completions<P>,
    ring: &mut Ring<W, DEPTH>,
) -> Result<usize, Error<P::Error>> {
    let mut first = [WorkCompletion::EMPTY];
    if cq.poll(ring, &mut first)? == 0 {
        return Ok(0);
    }
    record::<P, W, DEPTH>(ring, &first)?;
    Ok(1 + poll_batch_into(cq, ring)?)
}

/// [`poll_into`]'s batch, after its first completion.
#[inline(never)]
fn poll_batch_into<P: Provider, W: WorkRequest, const DEPTH: usize>(
    cq: &mut Completions<P>,
    ring: &mut Ring<W, DEPTH>,
) -> Result<usize, Error<P::Error>> {
    let mut wcs = [WorkCompletion::EMPTY; POLL_BATCH];
    let n = cq.poll(ring, &mut wcs)?;
    record::<P, W, DEPTH>(ring, &wcs[..n])?;
    Ok(n)
}

/// What one poll brought for an awaited request.
pub(super) enum Polled {
    /// No completion.
    Nothing,
    /// Completions, recorded in the ring; the awaited one may be among them.
    Recorded,
    /// The awaited request was the oldest and is retired: its completion is the first of
    /// the poll's batch.
    Retired,
}

/// What a poll for one completion brought for an awaited request: as [`Polled`], with the
/// completion of a retired request where the poll left it. That may be in the channel (a
/// shared queue's), so a caller reads a success from it and copies a failure out before it
/// uses the channel again.
pub(super) enum PolledOne<'a, P: Provider> {
    Nothing,
    Recorded,
    Retired(Record<'a, P>),
}

impl<P: Provider> PolledOne<'_, P> {
    /// As a [`Polled`], without the completion.
    pub(super) fn forget(self) -> Polled {
        match self {
            PolledOne::Nothing => Polled::Nothing,
            PolledOne::Recorded => Polled::Recorded,
            PolledOne::Retired(_) => Polled::Retired,
        }
    }
}

/// Polls `cq` for one completion and records it in `ring`, unless it retires `want` at
/// once: if `want` is the oldest request ([`Ring::retire_oldest`]; the usual case), or
/// with `THROUGH`, if it is a batch's signaled last request ([`Ring::retire_through`]).
/// The completion lands in `slot`, in the provider's layout, from a queue of the
/// channel's own, in `shared` from a shared queue's inbox, and is read where it landed:
/// its `wr_id` and status to retire it, the rest only by a caller that wants it (a
/// scope's settle wants none of it, so none of it is converted).
#[inline(always)]
fn poll_one_for<'a, P: Provider, W: WorkRequest, const DEPTH: usize, const THROUGH: bool>(
    cq: &mut Completions<P>,
    ring: &mut Ring<W, DEPTH>,
    want: u64,
    slot: &'a mut OneWc<P>,
    shared: &'a mut WorkCompletion,
) -> Result<PolledOne<'a, P>, Error<P::Error>> {
    let Some(wc) = cq.poll_one(ring, slot, shared)? else {
        return Ok(PolledOne::Nothing);
    };
    let retired = match THROUGH {
        false => ring.retire_oldest(wc.wr_id(), want),
        true => ring.retire_through(wc.wr_id(), want),
    };
    if retired {
        return Ok(PolledOne::Retired(wc));
    }
    record::<P, W, DEPTH>(ring, &[wc.completion()])?;
    Ok(PolledOne::Recorded)
}

/// Polls `cq` into `wcs` and records what it returns in `ring`, retiring `want` at once
/// if its completion comes first and it is the oldest request: its completion is then
/// `wcs[0]`.
#[inline(always)]
fn poll_for_into<P: Provider, W: WorkRequest, const DEPTH: usize>(
    cq: &mut Completions<P>,
    ring: &mut Ring<W, DEPTH>,
    want: u64,
    wcs: &mut [WorkCompletion],
) -> Result<Polled, Error<P::Error>> {
    let n = cq.poll(ring, wcs)?;
    if n == 0 {
        return Ok(Polled::Nothing);
    }
    if ring.retire_oldest(wcs[0].wr_id, want) {
        if n > 1 {
            record::<P, W, DEPTH>(ring, &wcs[1..n])?;
        }
        return Ok(Polled::Retired);
    }
    record::<P, W, DEPTH>(ring, &wcs[..n])?;
    Ok(Polled::Recorded)
}

/// Routes everything `cq`'s shared queue holds and records what is `ring`'s in it.
/// Completions of requests already given up are ignored.
fn poll_all_into<P: Provider, W: WorkRequest, const DEPTH: usize>(
    cq: &mut Completions<P>,
    ring: &mut Ring<W, DEPTH>,
    wcs: &mut [WorkCompletion; POLL_BATCH],
) -> Result<usize, Error<P::Error>> {
    let n = cq.poll_all(ring, wcs)?;
    for wc in &wcs[..n] {
        let _ = ring.complete(wc);
    }
    Ok(n)
}

/// Records `wcs` in `ring` (out of line: the usual poll brings one completion).
#[inline(never)]
fn record<P: Provider, W: WorkRequest, const DEPTH: usize>(
    ring: &mut Ring<W, DEPTH>,
    wcs: &[WorkCompletion],
) -> Result<(), Error<P::Error>> {
    for wc in wcs {
        ring.complete(wc)
            .map_err(|u| Error::UnexpectedCompletion { wr_id: u.wr_id })?;
    }
    Ok(())
}

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    pub(super) fn poll(&mut self, queue: Queue) -> Result<usize, Error<P::Error>> {
        match queue {
            Queue::Send => poll_into(&mut self.send_cq, &mut self.sq),
            Queue::Recv => match self.rx.parts() {
                Some((cq, ring)) => poll_into(cq, ring),
                None => Ok(0),
            },
        }
    }

    /// As [`poll`](Self::poll), after routing everything the shared queue holds.
    /// Completions of requests already given up are ignored.
    pub(super) fn poll_all(&mut self, queue: Queue) -> Result<usize, Error<P::Error>> {
        let mut wcs = [WorkCompletion::EMPTY; POLL_BATCH];
        match queue {
            Queue::Send => poll_all_into(&mut self.send_cq, &mut self.sq, &mut wcs),
            Queue::Recv => match self.rx.parts() {
                Some((cq, ring)) => poll_all_into(cq, ring, &mut wcs),
                None => Ok(0),
            },
        }
    }

    pub(super) fn take(
        &mut self,
        queue: Queue,
        seq: u64,
    ) -> Option<Result<Completion, Error<P::Error>>> {
        let r = match queue {
            Queue::Send => self.sq.take(seq),
            Queue::Recv => self.rx.parts()?.1.take(seq),
        }?;
        Some(r.map_err(|c| self.completion_error(seq, c)))
    }

    pub(super) fn completion_error(&self, seq: u64, c: Completion) -> Error<P::Error> {
        Error::Completion(CompletionError {
            status: c.status,
            wr_id: seq,
            opcode: c.opcode,
            qp_num: self.qp.qp_num(),
            // The connected peer's (none on a datagram channel).
            peer_qp_num: self.qp.peer_qp_num(),
        })
    }

    /// Whether `seq` is in flight or completed and not yet taken.
    pub(crate) fn holds(&self, queue: Queue, seq: u64) -> bool {
        match queue {
            Queue::Send => self.sq.holds(seq),
            Queue::Recv => self.rx.ring().is_some_and(|r| r.holds(seq)),
        }
    }

    /// Whether `seq` was posted signaled, if it is still waiting for its completion.
    pub(super) fn waiting(&self, queue: Queue, seq: u64) -> Option<bool> {
        match queue {
            Queue::Send => self.sq.pending(seq),
            Queue::Recv => self.rx.ring().and_then(|r| r.pending(seq)),
        }
    }

    pub(super) fn is_pending(&self, queue: Queue, seq: u64) -> bool {
        match queue {
            Queue::Send => self.sq.is_pending(seq),
            Queue::Recv => self.rx.ring().is_some_and(|r| r.is_pending(seq)),
        }
    }

    /// Waits for `seq` and takes its outcome, within one channel timeout plus the grace.
    /// On timeout the work in flight is ended ([`quiesce`](Self::quiesce)), so no request
    /// stays in flight on a buffer the caller gets back.
    pub(super) fn wait_seq(
        &mut self,
        queue: Queue,
        seq: u64,
    ) -> Result<Completion, Error<P::Error>> {
        match self.take(queue, seq) {
            Some(r) => r,
            None => self.wait_fresh(queue, seq, |c| c),
        }
    }

    /// As [`wait_seq`](Self::wait_seq), within the bound of `waiter`, shared with the
    /// caller's other waits (a collective, a scope, a barrier).
    pub(crate) fn wait_seq_within(
        &mut self,
        queue: Queue,
        seq: u64,
        waiter: &mut Waiter,
    ) -> Result<Completion, Error<P::Error>> {
        if let Some(r) = self.take(queue, seq) {
            return r;
        }
        waiter.rearm();
        let mut wcs = [WorkCompletion::EMPTY; POLL_BATCH];
        let polled = self.poll_batch_for(queue, seq, &mut wcs);
        self.wait_polled_within(queue, seq, polled, |c| c, waiter, &mut wcs)
    }

    /// A fresh [`Waiter`] for one call on this channel: its timeout and grace.
    #[inline]
    pub(crate) fn waiter(&self) -> Waiter {
        Waiter::new(self.config.timeout, self.config.flush_grace).with_policy(self.config.wait)
    }

    /// One pause of a wait on `queue` after a poll found nothing, by the channel's
    /// [`WaitPolicy`](super::WaitPolicy); `false` once `waiter`'s bound passed.
    #[inline]
    pub(crate) fn pause(&mut self, queue: Queue, waiter: &mut Waiter) -> bool {
        #[cfg(all(feature = "std", unix))]
        if waiter.wants_sleep() {
            return match queue {
                Queue::Send => self.send_cq.sleep(waiter),
                Queue::Recv => match self.rx.parts() {
                    Some((cq, _)) => cq.sleep(waiter),
                    None => waiter.pause(),
                },
            };
        }
        let _ = queue;
        waiter.pause()
    }

    /// As [`wait_seq`](Self::wait_seq), for a request whose outcome is not in its slot (one
    /// just posted: only a poll completes it), so it polls before it looks.
    /// Success is handed to `ok`, so callers that want less than the whole completion
    /// get code that does not gather it. Inlined into the blocking calls: its own frame
    /// (saved registers, argument moves, returned result) cost more than its body.
    #[inline(always)]
    pub(super) fn wait_fresh<R>(
        &mut self,
        queue: Queue,
        seq: u64,
        ok: impl FnOnce(Completion) -> R,
    ) -> Result<R, Error<P::Error>> {
        // The first poll usually retires the request; the rest is out of line. It asks for
        // one completion: the one awaited is usually the only one there.
        let mut wc = OneWc::new();
        match self.poll_for(queue, seq, &mut wc) {
            // A success needs nothing of the channel; a failure, a copy of its completion.
            Ok(PolledOne::Retired(wc)) if wc.succeeded() => Ok(ok(wc.success())),
            Ok(PolledOne::Retired(wc)) => {
                let wc = wc.completion();
                Err(self.retired_failed(queue, seq, wc))
            }
            Ok(PolledOne::Recorded) => self.wait_polled(queue, seq, Polled::Recorded, ok),
            Ok(PolledOne::Nothing) => self.wait_polled(queue, seq, Polled::Nothing, ok),
            Err(e) => Err(self.poll_failed(queue, seq, e)),
        }
    }

    /// The rest of [`wait_fresh`](Self::wait_fresh), after a poll that brought `polled`.
    #[inline(never)]
    fn wait_polled<R>(
        &mut self,
        queue: Queue,
        seq: u64,
        polled: Polled,
        ok: impl FnOnce(Completion) -> R,
    ) -> Result<R, Error<P::Error>> {
        let mut waiter = self.waiter();
        let mut wcs = [WorkCompletion::EMPTY; POLL_BATCH];
        self.wait_polled_within(queue, seq, Ok(polled), ok, &mut waiter, &mut wcs)
    }

    /// A poll failed with `seq` in flight: end that work (the outcome of `seq` is the
    /// error, its slot taken) before reporting `e`.
    #[cold]
    #[inline(never)]
    fn poll_failed(&mut self, queue: Queue, seq: u64, e: Error<P::Error>) -> Error<P::Error> {
        let mut waiter = self.waiter();
        let e = self.quiesce(&mut waiter, e);
        let _ = self.take(queue, seq);
        e
    }

    /// Polls on (into `wcs`, set up once by the caller rather than at every poll of a
    /// spinning wait) until `seq` completes, `waiter`'s bound passes, or a poll fails.
    fn wait_polled_within<R>(
        &mut self,
        queue: Queue,
        seq: u64,
        mut polled: Result<Polled, Error<P::Error>>,
        ok: impl FnOnce(Completion) -> R,
        waiter: &mut Waiter,
        wcs: &mut [WorkCompletion; POLL_BATCH],
    ) -> Result<R, Error<P::Error>> {
        loop {
            match polled {
                Ok(Polled::Retired) => {
                    return self.retired(queue, seq, Record::Shared(&wcs[0]), ok)
                }
                Ok(Polled::Recorded) => {
                    if let Some(r) = self.take(queue, seq) {
                        return r.map(ok);
                    }
                }
                Ok(Polled::Nothing) => {
                    if !self.pause(queue, waiter) {
                        // Whatever `seq` became within the grace, the call timed out.
                        let e = self.quiesce(waiter, Error::Timeout);
                        let _ = self.take(queue, seq);
                        return Err(e);
                    }
                }
                Err(e) => {
                    let e = self.quiesce(waiter, e);
                    let _ = self.take(queue, seq);
                    return Err(e);
                }
            }
            polled = self.poll_batch_for(queue, seq, wcs);
        }
    }

    /// Polls for `seq` ([`poll_one_for`]): one completion, into `wc` (the caller's) or the
    /// channel's own `wc`.
    #[inline(always)]
    pub(super) fn poll_for<'a>(
        &'a mut self,
        queue: Queue,
        seq: u64,
        wc: &'a mut OneWc<P>,
    ) -> Result<PolledOne<'a, P>, Error<P::Error>> {
        match queue {
            Queue::Send => poll_one_for::<P, _, DEPTH, false>(
                &mut self.send_cq,
                &mut self.sq,
                seq,
                wc,
                &mut self.wc,
            ),
            Queue::Recv => match self.rx.parts() {
                Some((cq, ring)) => {
                    poll_one_for::<P, _, DEPTH, false>(cq, ring, seq, wc, &mut self.wc)
                }
                None => Ok(PolledOne::Nothing),
            },
        }
    }

    /// As [`poll_for`](Self::poll_for), into `wcs` (a buffer on the caller's stack, set up
    /// once per wait): a retired request's completion is `wcs[0]`.
    pub(super) fn poll_batch_for(
        &mut self,
        queue: Queue,
        seq: u64,
        wcs: &mut [WorkCompletion; POLL_BATCH],
    ) -> Result<Polled, Error<P::Error>> {
        match queue {
            Queue::Send => poll_for_into(&mut self.send_cq, &mut self.sq, seq, wcs),
            Queue::Recv => match self.rx.parts() {
                Some((cq, ring)) => poll_for_into(cq, ring, seq, wcs),
                None => Ok(Polled::Nothing),
            },
        }
    }

    /// As [`poll_for`](Self::poll_for), for `want`, the signaled last request of a batch of
    /// unsignaled ones: its completion retires the batch at once
    /// ([`Ring::retire_through`]).
    #[inline(always)]
    pub(super) fn poll_through<'a>(
        &'a mut self,
        queue: Queue,
        want: u64,
        wc: &'a mut OneWc<P>,
    ) -> Result<PolledOne<'a, P>, Error<P::Error>> {
        match queue {
            Queue::Send => poll_one_for::<P, _, DEPTH, true>(
                &mut self.send_cq,
                &mut self.sq,
                want,
                wc,
                &mut self.wc,
            ),
            Queue::Recv => match self.rx.parts() {
                Some((cq, ring)) => {
                    poll_one_for::<P, _, DEPTH, true>(cq, ring, want, wc, &mut self.wc)
                }
                None => Ok(PolledOne::Nothing),
            },
        }
    }

    /// The outcome of `seq`, which a poll retired with the completion `wc`. A success is
    /// built straight from `wc` into the caller's result: it needs nothing of the ring (one
    /// intermediate `Result` cost about twenty instructions of copies).
    #[inline(always)]
    pub(super) fn retired<R>(
        &self,
        queue: Queue,
        seq: u64,
        wc: Record<'_, P>,
        ok: impl FnOnce(Completion) -> R,
    ) -> Result<R, Error<P::Error>> {
        if wc.succeeded() {
            return Ok(ok(wc.success()));
        }
        Err(self.retired_failed(queue, seq, wc.completion()))
    }

    /// [`retired`](Self::retired) for a request that failed: its slot kept the opcode.
    /// `wc` by value: a copy, so the caller's never leaves its frame.
    #[cold]
    #[inline(never)]
    pub(super) fn retired_failed(
        &self,
        queue: Queue,
        seq: u64,
        wc: WorkCompletion,
    ) -> Error<P::Error> {
        let c = match (queue, self.rx.ring()) {
            (Queue::Send, _) => self.sq.retired_failure(&wc),
            (Queue::Recv, Some(ring)) => ring.retired_failure(&wc),
            // Nothing is posted to a receive side that is not there, so nothing retires.
            (Queue::Recv, None) => return Error::UnexpectedCompletion { wr_id: seq },
        };
        self.completion_error(seq, c)
    }

    /// Waits until `seq` is no longer in flight, without taking its outcome, within the
    /// bound of `waiter`. On timeout the work in flight is ended as in `wait_seq`.
    pub(crate) fn wait_quiet(
        &mut self,
        queue: Queue,
        seq: u64,
        waiter: &mut Waiter,
    ) -> Result<(), Error<P::Error>> {
        waiter.rearm();
        while self.is_pending(queue, seq) {
            match self.poll(queue) {
                Ok(0) if !self.pause(queue, waiter) => {
                    return Err(self.quiesce(waiter, Error::Timeout))
                }
                Ok(_) => {}
                Err(e) => return Err(self.quiesce(waiter, e)),
            }
        }
        Ok(())
    }

    /// Ends all work in flight on this channel, so that no buffer is handed back while the
    /// device may still use it, within `waiter`'s bound plus one grace
    /// ([`ChannelConfig::flush_grace`]). Returns the error the caller reports: `cause`, or
    /// the device's fatal error if it turns out dead.
    ///
    /// 1. Move the queue pair to ERR: the device completes every outstanding request with
    ///    `WR_FLUSH_ERR` "when possible" (IBA 1.3 §10.3.1 and Table 91, "Any State to
    ///    Error"; `ibv_modify_qp(3)`). Poll for those flushes until the grace ends.
    /// 2. If they did not all come, or the device is dead: move the queue pair to RESET. A
    ///    queue pair in RESET has empty work queues, processes no request and sends or
    ///    accepts no packet (IBA §10.3.1, "Reset"; `ibv_modify_qp(3)`: work requests and
    ///    completions are removed), so once the verb returns the device no longer touches
    ///    the memory those requests named. What the queues still held is given a
    ///    `WR_FLUSH_ERR` outcome here, in the device's place.
    /// 3. A device known dead (the simulator's crash; `EIO` or `IBV_EVENT_DEVICE_FATAL` on
    ///    verbs) does no DMA at all, whether or not RESET succeeds: its work is given up the
    ///    same way.
    ///
    /// Only a live device that neither flushes nor accepts RESET, which the specification
    /// rules out, is polled without a bound: no other choice keeps the buffers sound.
    #[cold]
    #[inline(never)]
    pub(crate) fn quiesce(
        &mut self,
        waiter: &mut Waiter,
        cause: Error<P::Error>,
    ) -> Error<P::Error> {
        crate::trace::event!(debug, qp = self.qp.qp_num(), cause = %cause, "quiesce: ERR, the flush, then RESET");
        let mut fatal = self.qp.set_error().err().filter(is_fatal);
        if fatal.is_none() {
            waiter.enter_grace();
            while self.awaits_device() {
                match (self.poll(Queue::Send), self.poll(Queue::Recv)) {
                    (Ok(0), Ok(0)) if !waiter.pause() => break,
                    (Ok(_), Ok(_)) => {}
                    (Err(e), _) | (_, Err(e)) => {
                        fatal = Some(e).filter(is_fatal);
                        break;
                    }
                }
            }
            if !self.awaits_device() {
                return fatal.unwrap_or(cause);
            }
        }
        self.discard(&mut fatal);
        fatal.unwrap_or(cause)
    }

    /// Ends the work still in flight through RESET (after the error state's flush was
    /// waited for, or given up): afterwards the device touches none of its buffers, and
    /// every request in flight has an outcome (flushed). A fatal error met on the way is
    /// put in `fatal`, unless one is there already.
    pub(crate) fn discard(&mut self, fatal: &mut Option<Error<P::Error>>) {
        match self.qp.discard_work() {
            Ok(()) => {}
            Err(e) if is_fatal(&e) => *fatal = Some(e),
            Err(_) if fatal.is_some() => {}
            Err(_) => self.settle(),
        }
        // Completions the device wrote before RESET are real outcomes; none come after. On
        // a shared queue, some may sit in another channel's poll batch: routing everything
        // first (poll right held) brings them to this channel's inbox.
        while matches!(self.poll_all(Queue::Send), Ok(n) if n > 0) {}
        while matches!(self.poll_all(Queue::Recv), Ok(n) if n > 0) {}
        self.sq.discard_in_flight(WcStatus::WrFlushErr);
        if let Some((_, ring)) = self.rx.parts() {
            ring.discard_in_flight(WcStatus::WrFlushErr);
        }
    }

    /// Whether any posted request still waits for a completion from the device.
    pub(super) fn awaits_device(&self) -> bool {
        self.sq.has_pending() || self.rx.ring().is_some_and(|r| r.has_pending())
    }

    /// Polls, without a deadline, until nothing is in flight. Only for a queue pair in the
    /// error state on a live device, which flushes everything.
    fn settle(&mut self) {
        let mut waiter = Waiter::new(None, Duration::ZERO);
        while self.awaits_device() {
            let n = self.poll(Queue::Send).unwrap_or(0) + self.poll(Queue::Recv).unwrap_or(0);
            if n == 0 {
                waiter.pause();
            }
        }
    }
}

fn is_fatal<E: ProviderError>(e: &Error<E>) -> bool {
    e.kind() == ErrorKind::DeviceFatal
}
