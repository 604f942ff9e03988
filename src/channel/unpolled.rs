//! The unpolled level (`unsafe`): post and return a [`Pending`] handle, redeemed once by
//! [`Channel::wait`] or [`Channel::try_complete`] on the channel that posted it.

use super::poll::{Polled, PolledOne};
use super::*;

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Posts one send work request and returns without waiting.
    ///
    /// # Safety
    /// The memory named by `sges` must stay valid and must not be written (for reads and
    /// atomics: not accessed at all) through Rust references until the work has finished:
    /// the returned [`Pending`] was redeemed on this channel ([`wait`](Self::wait) returned
    /// a completion, a completion error or a timeout, or [`try_complete`](Self::try_complete)
    /// a completion or a completion error). The sges' lkeys must come from this channel's
    /// protection domain for the device to accept them (a wrong key is reported, not
    /// undefined).
    #[inline(always)]
    pub unsafe fn post_send_unpolled(
        &mut self,
        sges: &[Sge],
        op: SendOp,
        flags: SendFlags,
    ) -> Result<Pending, Error<P::Error>> {
        let seq = self.post_sges_seq(sges.iter().copied(), op, flags, None, false)?;
        Ok(self.pending(Queue::Send, seq))
    }

    /// The handle of request `seq` on `queue`, posted on this channel now.
    #[inline(always)]
    pub(super) fn pending(&self, queue: Queue, seq: u64) -> Pending {
        Pending {
            seq,
            queue,
            by: PostedBy {
                owner: self.owner,
                qp_num: self.qp.qp_num(),
            },
        }
    }

    /// Whether `pending` was posted on this channel (and so may be redeemed here).
    pub fn owns(&self, pending: &Pending) -> bool {
        pending.by.owner == self.owner
    }

    /// Polls once: the outcome of `pending` if it has completed (`Ok(Ok(_))`, or
    /// `Err(Error::Completion(_))` if it failed), or the handle back if it is still in
    /// flight (`Ok(Err(pending))`). A completed handle is consumed, so the work cannot be
    /// waited for again; its buffers are the caller's again.
    ///
    /// A handle posted on another channel is refused with [`Error::ForeignPending`] without
    /// polling: this channel's work is untouched. That error, and a failure to poll (a
    /// provider error), consume the handle too, but its work may still be in flight: its
    /// buffers stay lent to the device (see [`Pending`]).
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{Channel, ChannelConfig, Context};
    /// # let p = zverbs::testing::Pair::<64, 4>::connected(&ChannelConfig::default()).unwrap();
    /// # let (pa, pb, mut a, mut b) = (p.a.pd, p.b.pd, p.a.ch, p.b.ch);
    /// let mut inbox = [0u8; 8];
    /// let mut inbox = pb.register(&mut inbox).unwrap();
    /// let sge = inbox.slice_mut(..).unwrap().sge();
    /// // SAFETY: `inbox` is not touched until the receive has completed (below).
    /// let mut pending = unsafe { b.post_receive_unpolled(&[sge]) }.unwrap();
    /// // Nothing sent yet: the handle comes back.
    /// pending = b.try_complete(pending).unwrap().unwrap_err();
    /// let mut msg = *b"ping!";
    /// a.send([pa.register(&mut msg).unwrap().slice(..).unwrap()]).unwrap();
    /// let done = loop {
    ///     pending = match b.try_complete(pending).unwrap() {
    ///         Ok(done) => break done,
    ///         Err(still_pending) => still_pending,
    ///     };
    /// };
    /// // The handle is gone: the completed receive cannot be waited for again.
    /// assert_eq!(done.byte_len, 5);
    /// assert_eq!(&inbox.as_slice()[..5], b"ping!");
    /// ```
    #[inline(always)]
    pub fn try_complete(
        &mut self,
        pending: Pending,
    ) -> Result<Result<Completion, Pending>, Error<P::Error>> {
        self.check_owner(&pending)?;
        let (queue, seq) = (pending.queue, pending.seq);
        // One completion, as a blocking call's first poll: the one polled for is usually
        // the only one there, and is retired at once. An outcome recorded by an earlier
        // poll is looked up only when that is not so.
        let mut wc = OneWc::new();
        let polled = match self.poll_for(queue, seq, &mut wc) {
            Ok(PolledOne::Retired(wc)) if wc.succeeded() => return Ok(Ok(wc.success())),
            Ok(PolledOne::Retired(wc)) => {
                let wc = wc.completion();
                return Err(self.retired_failed(queue, seq, wc));
            }
            polled => polled.map(PolledOne::forget),
        };
        match polled {
            // Still in flight (the usual empty poll): no outcome to look for.
            Ok(Polled::Nothing) if self.is_pending(queue, seq) => Ok(Err(pending)),
            Ok(Polled::Nothing) => match self.take(queue, seq) {
                Some(r) => r.map(Ok),
                None => Ok(Err(pending)),
            },
            polled => self.try_complete_recorded(pending, polled),
        }
    }

    /// [`try_complete`](Self::try_complete) when the first poll brought another request's
    /// completion, or failed: the outcome of `pending` if recorded (by this poll or an
    /// earlier one). Another request's completion came first: a batch poll as well, so
    /// that one call still reports every outcome the device has written (up to a batch).
    /// A failed poll is reported only if the outcome is not already known, so a finished
    /// request is never reported as lent.
    #[inline(never)]
    fn try_complete_recorded(
        &mut self,
        pending: Pending,
        polled: Result<Polled, Error<P::Error>>,
    ) -> Result<Result<Completion, Pending>, Error<P::Error>> {
        let (queue, seq) = (pending.queue, pending.seq);
        let polled = match polled {
            Ok(Polled::Recorded) if self.is_pending(queue, seq) => self.poll(queue).map(drop),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        match (self.take(queue, seq), polled) {
            (Some(r), _) => r.map(Ok),
            (None, Ok(())) => Ok(Err(pending)),
            (None, Err(e)) => Err(e),
        }
    }

    /// Waits for `pending` to complete and returns its outcome; an error completion is
    /// `Err(Error::Completion(_))`. On [`Error::Timeout`] the queue pair was moved to the
    /// error state and the work waited for until flushed. After these outcomes the work is
    /// finished and its buffers are the caller's again.
    ///
    /// A handle posted on another channel is refused with [`Error::ForeignPending`],
    /// without waiting: this channel's work is untouched, and the work the handle names
    /// (on its own channel) may still be in flight, its buffers lent to the device. The
    /// same holds after a failure to poll (a provider error).
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{Channel, ChannelConfig, Context, Error, SendFlags, SendOp};
    /// # let p = zverbs::testing::Pair::<64, 4>::connected(&ChannelConfig::default()).unwrap();
    /// # let (pa, pb, mut a, mut b) = (p.a.pd, p.b.pd, p.a.ch, p.b.ch);
    /// let mut inbox = [0u8; 8];
    /// let mut inbox = pb.register(&mut inbox).unwrap();
    /// let mut msg = *b"pong";
    /// let msg = pa.register(&mut msg).unwrap();
    /// // SAFETY: neither buffer is touched until its work has completed (below).
    /// let recv = unsafe { b.post_receive_unpolled(&[inbox.slice_mut(..).unwrap().sge()]) }.unwrap();
    /// let send = unsafe {
    ///     a.post_send_unpolled(&[msg.slice(..).unwrap().sge()], SendOp::Send, SendFlags::empty())
    /// }
    /// .unwrap();
    /// assert!(a.owns(&send) && !b.owns(&send));
    /// a.wait(send).unwrap();
    /// assert_eq!(b.wait(recv).unwrap().byte_len, 4);
    /// assert_eq!(&inbox.as_slice()[..4], b"pong");
    /// ```
    pub fn wait(&mut self, pending: Pending) -> Result<Completion, Error<P::Error>> {
        self.check_owner(&pending)?;
        self.wait_seq(pending.queue, pending.seq)
    }

    /// Polls the send queue once, recording what it brings: for a caller that waits on
    /// something else (a node's barrier flags) and must still learn of a failed send or a
    /// dead device.
    #[cfg(feature = "std")]
    pub(crate) fn poll_sends(&mut self) -> Result<(), Error<P::Error>> {
        self.poll(Queue::Send).map(drop)
    }

    /// The outcome of send `seq`, posted by the crate itself
    /// ([`post_sges_seq`](Self::post_sges_seq), which keeps only the number), if it has
    /// completed (`None` while in flight), as [`try_complete`](Self::try_complete) gives
    /// it; but a shared queue is first routed whole, batch after batch, so the outcome is
    /// there whenever the device wrote it, also when other channels' completions came
    /// first. For callers that must not leave a written completion unseen (a node's poll
    /// of its barrier).
    #[cfg(feature = "std")]
    pub(crate) fn try_complete_send(
        &mut self,
        seq: u64,
    ) -> Result<Option<Completion>, Error<P::Error>> {
        loop {
            if let Some(r) = self.take(Queue::Send, seq) {
                return r.map(Some);
            }
            if self.poll_all(Queue::Send)? < POLL_BATCH {
                return self.take(Queue::Send, seq).transpose();
            }
        }
    }

    fn check_owner(&self, pending: &Pending) -> Result<(), Error<P::Error>> {
        if self.owns(pending) {
            Ok(())
        } else {
            Err(Error::ForeignPending {
                owner_qp_num: pending.by.qp_num,
                qp_num: self.qp.qp_num(),
            })
        }
    }
}

impl<P: Provider, T: HasOwnRx<P, DEPTH, SGES>, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Posts one receive work request and returns without waiting.
    ///
    /// # Safety
    /// The memory named by `sges` must stay valid and must not be accessed through Rust
    /// references until the work has finished, as for
    /// [`post_send_unpolled`](Self::post_send_unpolled).
    pub unsafe fn post_receive_unpolled(
        &mut self,
        sges: &[Sge],
    ) -> Result<Pending, Error<P::Error>> {
        let seq = self.post_recv_seq(sges.iter().copied())?;
        Ok(self.pending(Queue::Recv, seq))
    }
}
