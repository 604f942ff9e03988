//! Polling: completions from the completion queues into the rings, and the waits built on
//! it (blocking calls, unpolled handles, scopes, reset).

use super::*;

/// Polls `cq` once into `wcs` and records what it returns in `ring`.
fn poll_into<P: Provider, W: WorkRequest, const N: usize>(
    cq: &CompletionQueue<P>,
    ring: &mut Ring<W, N>,
    wcs: &mut [WorkCompletion; POLL_BATCH],
) -> Result<usize, Error<P::Error>> {
    let n = cq.poll(wcs)?;
    for wc in &wcs[..n] {
        ring.complete(wc)
            .map_err(|u| Error::UnexpectedCompletion { wr_id: u.wr_id })?;
    }
    Ok(n)
}

/// What one poll brought for an awaited request.
enum Polled {
    /// No completion.
    Nothing,
    /// Completions, recorded in the ring; the awaited one may be among them.
    Recorded,
    /// The awaited request was the oldest and is retired: its completion is `wcs[0]`.
    Retired,
}

/// Polls `cq` once for up to `max` completions into `wcs` and records what it returns in
/// `ring`, retiring `want` at once if its completion comes first and it is the oldest
/// request (the usual case).
#[inline(always)]
fn poll_for<P: Provider, W: WorkRequest, const N: usize>(
    cq: &CompletionQueue<P>,
    ring: &mut Ring<W, N>,
    wcs: &mut [WorkCompletion; POLL_BATCH],
    want: u64,
    max: usize,
) -> Result<Polled, Error<P::Error>> {
    let max = max.min(POLL_BATCH);
    let n = cq.poll(&mut wcs[..max])?;
    if n == 0 {
        return Ok(Polled::Nothing);
    }
    if ring.retire_oldest(&wcs[0], want) {
        if n > 1 {
            record::<P, W, N>(ring, &wcs[1..n.min(max)])?;
        }
        return Ok(Polled::Retired);
    }
    record::<P, W, N>(ring, &wcs[..n.min(max)])?;
    Ok(Polled::Recorded)
}

/// Records `wcs` in `ring` (out of line: the usual poll brings one completion).
#[inline(never)]
fn record<P: Provider, W: WorkRequest, const N: usize>(
    ring: &mut Ring<W, N>,
    wcs: &[WorkCompletion],
) -> Result<(), Error<P::Error>> {
    for wc in wcs {
        ring.complete(wc)
            .map_err(|u| Error::UnexpectedCompletion { wr_id: u.wr_id })?;
    }
    Ok(())
}

impl<P: Provider, const N: usize, const S: usize> Channel<P, N, S> {
    pub(super) fn poll(&mut self, queue: Queue) -> Result<usize, Error<P::Error>> {
        match queue {
            Queue::Send => poll_into(&self.send_cq, &mut self.sq, &mut self.wcs),
            Queue::Recv => poll_into(&self.recv_cq, &mut self.rq, &mut self.wcs),
        }
    }

    pub(super) fn take(
        &mut self,
        queue: Queue,
        seq: u64,
    ) -> Option<Result<Completion, Error<P::Error>>> {
        let r = match queue {
            Queue::Send => self.sq.take(seq),
            Queue::Recv => self.rq.take(seq),
        }?;
        Some(r.map_err(|c| self.completion_error(seq, c)))
    }

    pub(super) fn completion_error(&self, seq: u64, c: Completion) -> Error<P::Error> {
        Error::Completion(CompletionError {
            status: c.status,
            wr_id: seq,
            opcode: c.opcode,
            qp_num: self.qp.qp_num(),
            peer_qp_num: Some(self.peer),
        })
    }

    pub(super) fn is_pending(&self, queue: Queue, seq: u64) -> bool {
        match queue {
            Queue::Send => self.sq.is_pending(seq),
            Queue::Recv => self.rq.is_pending(seq),
        }
    }

    /// Waits for `seq` and takes its outcome. On timeout the queue pair is moved to the
    /// error state and the request waited for until flushed, so no work stays in flight
    /// on a buffer the caller gets back.
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
        match self.poll_for(queue, seq, 1)? {
            Polled::Retired => self.retired(queue, seq, ok),
            polled => self.wait_polled(queue, seq, polled, ok),
        }
    }

    /// The rest of [`wait_fresh`](Self::wait_fresh), after a poll that brought `polled`.
    #[inline(never)]
    fn wait_polled<R>(
        &mut self,
        queue: Queue,
        seq: u64,
        mut polled: Polled,
        ok: impl FnOnce(Completion) -> R,
    ) -> Result<R, Error<P::Error>> {
        let mut waiter = Waiter::new(self.config.timeout);
        loop {
            match polled {
                Polled::Retired => return self.retired(queue, seq, ok),
                Polled::Recorded => {
                    if let Some(r) = self.take(queue, seq) {
                        return r.map(ok);
                    }
                }
                Polled::Nothing => {
                    if !waiter.pause() {
                        self.abort_until_done(queue, seq)?;
                        let _ = self.take(queue, seq);
                        return Err(Error::Timeout);
                    }
                }
            }
            polled = self.poll_for(queue, seq, POLL_BATCH)?;
        }
    }

    #[inline(always)]
    fn poll_for(&mut self, queue: Queue, seq: u64, max: usize) -> Result<Polled, Error<P::Error>> {
        match queue {
            Queue::Send => poll_for(&self.send_cq, &mut self.sq, &mut self.wcs, seq, max),
            Queue::Recv => poll_for(&self.recv_cq, &mut self.rq, &mut self.wcs, seq, max),
        }
    }

    /// The outcome of `seq`, which [`poll_for`] retired from `wcs[0]`.
    #[inline(always)]
    fn retired<R>(
        &self,
        queue: Queue,
        seq: u64,
        ok: impl FnOnce(Completion) -> R,
    ) -> Result<R, Error<P::Error>> {
        let wc = &self.wcs[0];
        let r = match queue {
            Queue::Send => self.sq.retired_outcome(wc),
            Queue::Recv => self.rq.retired_outcome(wc),
        };
        r.map(ok).map_err(|c| self.completion_error(seq, c))
    }

    /// Waits until `seq` is no longer in flight, without taking its outcome. On timeout the
    /// queue pair is aborted as in `wait_seq`.
    pub(crate) fn wait_quiet(&mut self, queue: Queue, seq: u64) -> Result<(), Error<P::Error>> {
        let mut waiter = Waiter::new(self.config.timeout);
        while self.is_pending(queue, seq) {
            if self.poll(queue)? == 0 && !waiter.pause() {
                self.abort_until_done(queue, seq)?;
                return Err(Error::Timeout);
            }
        }
        Ok(())
    }

    /// Moves the queue pair to the error state and polls until `seq` is no longer in
    /// flight (its flush completion arrives). Waits without a deadline: the device flushes
    /// everything once the queue pair is in the error state.
    pub(crate) fn abort_until_done(
        &mut self,
        queue: Queue,
        seq: u64,
    ) -> Result<(), Error<P::Error>> {
        // If this fails the queue pair is already in the error state or gone; either way
        // the device is flushing, so keep polling.
        let _ = self.qp.set_error();
        self.settle(queue, seq)
    }

    /// Polls, without a deadline, until `seq` is no longer in flight. Only for queue pairs
    /// in the error state, where the device flushes everything.
    pub(super) fn settle(&mut self, queue: Queue, seq: u64) -> Result<(), Error<P::Error>> {
        let mut waiter = Waiter::new(None);
        while self.is_pending(queue, seq) {
            if self.poll(queue)? == 0 {
                waiter.pause();
            }
        }
        Ok(())
    }
}
