//! What an event loop needs from a channel (the async layer, [`crate::tokio`]): queues on
//! completion channels, their descriptors, arming, taking events, polling with no request
//! in view, posting an [`Op`] or a receive as a [`Pending`] request, and whether and how
//! it finished.

use super::poll::PolledOne;
use super::*;

impl<P: Provider, const DEPTH: usize, const SGES: usize> Channel<P, DEPTH, SGES> {
    /// As [`prepare`](Self::prepare), with each completion queue on a completion channel of
    /// its own whatever the wait policy: an event loop sleeps on their descriptors.
    pub(crate) fn prepare_with_events(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        config: &ChannelConfig,
    ) -> Result<PreparedChannel<P, DEPTH, SGES>, Error<P::Error>> {
        let depth = Self::depth()?;
        let send_cq = Completions::own(ctx, depth, true)?;
        let recv_cq = Completions::own(ctx, depth, true)?;
        let (sq, rq) = (Ring::new(), Ring::new());
        Self::prepare_on(ctx, pd, config_of(config), send_cq, recv_cq, sq, rq)
    }

    /// The descriptors of the send and the receive queue's completion channels (readable
    /// when an armed queue got a completion); `None` for a queue without one.
    pub(crate) fn event_fds(&self) -> [Option<std::os::fd::RawFd>; 2] {
        [self.send_cq.event_fd(), self.rx.cq.event_fd()]
    }

    /// The descriptor of the device's asynchronous events, when the backend has one and
    /// the receive queue a completion channel of its own.
    pub(crate) fn device_fd(&self) -> Option<std::os::fd::RawFd> {
        self.rx.cq.device_fd()
    }

    /// Looks at the device's asynchronous events now: its fatal error, if it died.
    pub(crate) fn check_device(&self) -> Result<(), Error<P::Error>> {
        crate::error::verb(
            "ibv_get_async_event",
            P::check_device(self.rx.cq.queue().raw()),
        )
    }

    /// Whether both queues are shared and led by reactor tasks, which run while the
    /// channel is attached: an event loop then sleeps on the channel's inboxes
    /// ([`sleep_task`](Self::sleep_task)) instead of descriptors.
    pub(crate) fn on_led_queues(&self) -> bool {
        self.send_cq.reactor_led() && self.rx.cq.reactor_led()
    }

    /// On led shared queues: `waker` is woken when a completion is routed to either of the
    /// channel's inboxes; `true` if one already waits (then poll instead of sleeping).
    /// Undone by [`awake`](Self::awake).
    pub(crate) fn sleep_task(&self, waker: &core::task::Waker) -> Result<bool, Error<P::Error>> {
        Ok(self.send_cq.sleep_task(waker)? | self.rx.cq.sleep_task(waker)?)
    }

    /// The event loop is awake: routing no longer wakes it.
    pub(crate) fn awake(&self) {
        self.send_cq.awake();
        self.rx.cq.awake();
    }

    /// Arms both queues for their next completion. Arm, then poll: a completion that came
    /// before the arm raises no event, and only the poll after it finds it.
    pub(crate) fn arm_events(&mut self) -> Result<(), Error<P::Error>> {
        self.send_cq.arm_events()?;
        self.rx.cq.arm_events()
    }

    /// Takes (and acknowledges) every event waiting on both completion channels; whether
    /// there was one.
    pub(crate) fn take_events(&mut self) -> Result<bool, Error<P::Error>> {
        Ok(self.send_cq.take_events()? | self.rx.cq.take_events()?)
    }

    /// Polls both queues until they are empty, recording every completion in its slot.
    pub(crate) fn poll_queues(&mut self) -> Result<usize, Error<P::Error>> {
        let mut total = 0;
        for queue in [Queue::Send, Queue::Recv] {
            loop {
                let n = self.poll(queue)?;
                total += n;
                if n < POLL_BATCH {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// Whether `pending`'s request has finished (its outcome waits to be taken), without
    /// polling.
    pub(crate) fn has_finished(&self, pending: &Pending) -> bool {
        !self.is_pending(pending.queue, pending.seq)
    }

    /// The channel's configuration.
    pub(crate) fn config(&self) -> &ChannelConfig {
        &self.config
    }

    /// Whether any posted request is still on the device.
    pub(crate) fn busy(&self) -> bool {
        self.awaits_device()
    }

    /// Posts `op` signaled, checked as every level checks it. The caller keeps the memory
    /// it names lent to the device until the returned request has finished.
    #[inline(always)]
    pub(crate) fn post_pending<L: Iterator<Item: Local>>(
        &mut self,
        op: Op<'_, L>,
    ) -> Result<Pending, Error<P::Error>> {
        let seq = self.post_send_seq(op)?;
        Ok(self.pending(Queue::Send, seq))
    }

    /// Posts a send-queue request over `sge` whose checks an earlier attempt of the same
    /// operation passed (it found the queue full after them); as
    /// [`post_pending`](Self::post_pending).
    pub(crate) fn post_admitted_pending(
        &mut self,
        sge: Sge,
        op: SendOp,
        flags: SendFlags,
    ) -> Result<Pending, Error<P::Error>> {
        let seq = self.post_sges_seq([sge], op, flags, None, false)?;
        Ok(self.pending(Queue::Send, seq))
    }

    /// Posts one receive work request over `sges`; as [`post_pending`](Self::post_pending).
    pub(crate) fn post_receive_pending(
        &mut self,
        sges: impl IntoIterator<Item = Sge>,
    ) -> Result<Pending, Error<P::Error>> {
        let seq = self.post_recv_seq(sges)?;
        Ok(self.pending(Queue::Recv, seq))
    }

    /// The outcome of `pending`'s request if it has finished (taken: asked again, `None`),
    /// without polling.
    pub(crate) fn take_finished(
        &mut self,
        pending: &Pending,
    ) -> Option<Result<Completion, Error<P::Error>>> {
        self.take(pending.queue, pending.seq)
    }

    /// `pending`'s outcome if it has finished, polling its queue if it is not known yet;
    /// `None` while it is in flight, or if the poll failed (the caller's next pass over
    /// the queues meets the failure again).
    ///
    /// The first poll asks for one completion, retired in place when it is `pending`'s
    /// (as a blocking wait's first poll does, with no buffer to set up); another's first
    /// means more may wait, and they are taken in one batch.
    #[inline]
    pub(crate) fn try_finish(
        &mut self,
        pending: &Pending,
    ) -> Option<Result<Completion, Error<P::Error>>> {
        if let Some(r) = self.take(pending.queue, pending.seq) {
            return Some(r);
        }
        self.try_finish_posted(pending)
    }

    /// As [`try_finish`](Self::try_finish), for a request posted under the same borrow of
    /// the channel: nothing polled since, so its outcome cannot be recorded yet, and only
    /// the queue is polled.
    #[inline(always)]
    pub(crate) fn try_finish_posted(
        &mut self,
        pending: &Pending,
    ) -> Option<Result<Completion, Error<P::Error>>> {
        let (queue, seq) = (pending.queue, pending.seq);
        let mut wc = OneWc::new();
        match self.poll_for(queue, seq, &mut wc) {
            Ok(PolledOne::Retired(wc)) if wc.succeeded() => Some(Ok(wc.success())),
            Ok(PolledOne::Retired(wc)) => {
                let wc = wc.completion();
                Some(Err(self.retired_failed(queue, seq, wc)))
            }
            Ok(PolledOne::Recorded) => {
                if let Some(r) = self.take(queue, seq) {
                    return Some(r);
                }
                let _ = self.poll(queue);
                self.take(queue, seq)
            }
            Ok(PolledOne::Nothing) | Err(_) => None,
        }
    }

    /// Moves the queue pair to the error state, so the device flushes everything in flight.
    pub(crate) fn abort(&mut self) -> Result<(), Error<P::Error>> {
        crate::trace::event!(debug, qp = self.qp.qp_num(), "abort: the queue pair to ERR");
        self.qp.set_error()
    }
}

impl Pending {
    /// A second handle to the same request, for a table of who waits for what. Only one
    /// of the two may be redeemed.
    pub(crate) fn duplicate(&self) -> Pending {
        Pending {
            seq: self.seq,
            queue: self.queue,
            by: self.by,
        }
    }

    /// Whether the request is a receive.
    pub(crate) fn is_receive(&self) -> bool {
        self.queue == Queue::Recv
    }

    /// Its slot in a table of `depth` per queue: the sequence number modulo `depth`.
    pub(crate) fn slot(&self, depth: usize) -> usize {
        (self.seq % depth as u64) as usize
    }
}
