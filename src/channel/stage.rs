//! Crate-internal doorbell batching, for the scoped layers ([`Scope`](super::Scope) and
//! `MultiScope`): build and stage requests in the rings, post each queue's staged batch as
//! one chain whose last send is signaled, and settle a caller's requests in posting order.
//! A caller keeps the memory its staged requests name borrowed until it settled them.

use super::op::{Local, Op};
use super::wait::Waiter;
use super::{Channel, Queue};
use crate::error::Error;
use crate::provider::Provider;
use crate::ring::Completion;
use crate::types::{RecvWr, SendWr, Sge};

impl<P: Provider, const DEPTH: usize, const SGES: usize> Channel<P, DEPTH, SGES> {
    /// The send work request (unsignaled) of `op`, checked as every level checks it
    /// ([`admit`](Self::admit)).
    #[inline]
    pub(crate) fn send_wr<L: Iterator<Item: Local>>(
        &self,
        op: Op<'_, L>,
    ) -> Result<SendWr<SGES>, Error<P::Error>> {
        let Op {
            local,
            op,
            flags,
            room,
            remote,
            atomic,
            ..
        } = op;
        let (sg_list, num_sge, len) = self.sges(local.map(|l| l.entry()))?;
        self.admit(room, remote, atomic, len)?;
        Ok(SendWr {
            wr_id: 0,
            sg_list,
            num_sge,
            op,
            flags,
        })
    }

    /// A receive work request into the entries `sges`.
    #[inline]
    pub(crate) fn recv_wr(
        &self,
        sges: impl IntoIterator<Item = Sge>,
    ) -> Result<RecvWr<SGES>, Error<P::Error>> {
        let (sg_list, num_sge, _) = self.sges(sges)?;
        Ok(RecvWr {
            wr_id: 0,
            sg_list,
            num_sge,
        })
    }

    /// Whether `queue`'s ring has no free slot: staging there needs room made first.
    #[inline]
    pub(crate) fn is_full(&self, queue: Queue) -> bool {
        match queue {
            Queue::Send => self.sq.in_flight() == DEPTH,
            Queue::Recv => self.rq.in_flight() == DEPTH,
        }
    }

    /// Stages `wr` unsignaled (the doorbell signals the last of its batch); returns its
    /// sequence number.
    #[inline]
    pub(crate) fn stage_send(&mut self, wr: SendWr<SGES>) -> Result<u64, Error<P::Error>> {
        self.sq.stage(wr, false).map_err(|f| Error::QueueFull {
            capacity: f.capacity,
        })
    }

    /// Stages `wr` (every receive completes); returns its sequence number.
    #[inline]
    pub(crate) fn stage_recv(&mut self, wr: RecvWr<SGES>) -> Result<u64, Error<P::Error>> {
        self.rq.stage(wr, true).map_err(|f| Error::QueueFull {
            capacity: f.capacity,
        })
    }

    /// Posts everything staged: the receives as one chain, then the sends as one chain
    /// whose last request is signaled, so one completion retires the batch. At most one
    /// doorbell per queue; none for a queue with nothing staged.
    ///
    /// A refused chain gives back the slots of the requests not posted. If the device
    /// took some sends of the chain before refusing one, those are unsignaled with no
    /// signaled request behind them: no completion would ever retire them, so the
    /// channel's work is ended at once ([`quiesce`](Self::quiesce), within `waiter`'s
    /// grace) rather than waited for until the timeout. Refused receives leave the sends
    /// staged; [`unstage_all`](Self::unstage_all) gives them back.
    pub(crate) fn ring_doorbell(&mut self, waiter: &mut Waiter) -> Result<(), Error<P::Error>> {
        self.flush_recvs()?;
        self.sq.signal_last_staged();
        let (staged, head) = (self.sq.staged().len() as u64, self.sq.next_seq());
        match self.flush_sends() {
            Ok(()) => Ok(()),
            // `flush_sends` gave back the slots it did not post: what is left of the chain
            // below the head went out.
            Err(e) if self.sq.next_seq() + staged > head => Err(self.quiesce(waiter, e)),
            Err(e) => Err(e),
        }
    }

    /// Gives back the slots of every request still staged (a refused doorbell, or a
    /// caller unwinding before it posted them).
    pub(crate) fn unstage_all(&mut self) {
        let (s, r) = (self.sq.staged().len(), self.rq.staged().len());
        self.sq.unstage(s);
        self.rq.unstage(r);
    }

    /// The sequence number the next request staged on `queue` gets.
    #[inline]
    pub(crate) fn next_seq(&self, queue: Queue) -> u64 {
        match queue {
            Queue::Send => self.sq.next_seq(),
            Queue::Recv => self.rq.next_seq(),
        }
    }

    /// Waits, within the bound of `waiter`, for every request posted on `queue` from
    /// sequence number `from` on (all of them the caller's), takes their outcomes in
    /// posting order and hands each to `each`: the completion, or its error. Requests
    /// retired without a completion of their own (unsignaled, succeeded) are skipped. A
    /// wait that fails (timeout, poll error) ends the channel's work, as in the blocking
    /// calls, and hands its error over before the flushed outcomes. Returns where the next
    /// settle starts. Nothing may be staged on `queue`.
    pub(crate) fn settle_from(
        &mut self,
        queue: Queue,
        from: u64,
        waiter: &mut Waiter,
        mut each: impl FnMut(Result<Completion, Error<P::Error>>),
    ) -> u64 {
        let to = self.next_seq(queue);
        let mut seq = from;
        while seq < to {
            // Requests older than the ring's oldest are retired, with nothing to wait for
            // or take: one completion retires a whole batch, so skip to the oldest.
            let oldest = match queue {
                Queue::Send => self.sq.oldest(),
                Queue::Recv => self.rq.oldest(),
            };
            seq = seq.max(oldest.unwrap_or(to));
            if seq >= to {
                break;
            }
            if self.is_pending(queue, seq) {
                if let Err(e) = self.wait_quiet(queue, seq, waiter) {
                    each(Err(e));
                }
            }
            if let Some(r) = self.take(queue, seq) {
                each(r);
            }
            seq += 1;
        }
        to
    }
}
