//! Posting, for every level: a request is built from an [`Op`] (or raw entries, for the
//! unpolled and crate-internal callers) and checked once ([`admit`]), then
//! either posted by itself with one doorbell (the blocking level, and the layers that post
//! on many channels first and wait afterwards: `post_*_seq`) or staged in the ring and
//! posted with its batch ([`stage_send`](Channel::stage_send),
//! [`ring_doorbell`](Channel::ring_doorbell): one chain per queue, the last send
//! signaled). A caller keeps the memory named by what it posts borrowed until the matching
//! wait or settle returned. Completing is in `poll.rs` and `wait.rs`.

use super::op::{Local, Op};
use super::poll::PolledOne;
use super::source::OneWc;
use super::wait::Waiter;
use super::{Channel, Queue};
use super::{ChannelTransport, HasOwnRx, RxSide};
use crate::error::Error;
use crate::mr::RemoteRegion;
use crate::provider::SendEntry;
use crate::provider::{PostError, Provider};
use crate::ring::{Completion, Ring, WorkRequest};
use crate::types::{RecvWr, SendFlags, SendOp, Sge, WcOpcode};

/// Takes a slot of `rq` for `wr` and posts it by itself with `post` (outside a staged
/// batch; one doorbell); gives the slot back if the post fails. Returns the `wr_id`.
pub(crate) fn post_recv_one<E, const DEPTH: usize, const SGES: usize>(
    rq: &mut Ring<RecvWr<SGES>, DEPTH>,
    mut wr: RecvWr<SGES>,
    post: impl FnOnce(&[RecvWr<SGES>]) -> Result<(), crate::provider::PostError<E>>,
) -> Result<u64, Error<E>> {
    let seq = rq.reserve(&mut wr, true).map_err(|f| Error::QueueFull {
        capacity: f.capacity,
    })?;
    if let Err(e) = post(core::slice::from_ref(&wr)) {
        rq.unreserve();
        return Err(Error::Provider {
            op: "ibv_post_recv",
            source: e.error,
        });
    }
    Ok(seq)
}

/// Collects up to `SGES` entries from `it`, or says how many were given.
pub(crate) fn collect_sges<const SGES: usize>(
    it: impl IntoIterator<Item = Sge>,
) -> Result<([Sge; SGES], u8), (usize, usize)> {
    gather(it).map(|(list, n, _)| (list, n))
}

/// As [`collect_sges`], with the total length of the entries (summed as they come, not
/// in a second pass).
#[inline]
fn gather<const SGES: usize>(
    it: impl IntoIterator<Item = Sge>,
) -> Result<([Sge; SGES], u8, u64), (usize, usize)> {
    let mut out = [Sge::default(); SGES];
    gather_into(&mut out, it).map(|(n, len)| (out, n, len))
}

/// As [`gather`], into `out`; entries past the count returned are left as they were (on
/// error, some may have been overwritten).
#[inline(always)]
fn gather_into<const SGES: usize>(
    out: &mut [Sge; SGES],
    it: impl IntoIterator<Item = Sge>,
) -> Result<(u8, u64), (usize, usize)> {
    let mut n = 0usize;
    let mut len = 0u64;
    for sge in it {
        // Only entries that fit are summed: at most SGES < 2^32 lengths below 2^32 each, so
        // the total cannot overflow however long the iterator (an error then anyway).
        if n < SGES {
            out[n] = sge;
            len += u64::from(sge.length);
        }
        n = n.saturating_add(1);
    }
    if n > SGES || n > u8::MAX as usize {
        return Err((n, SGES.min(u8::MAX as usize)));
    }
    Ok((n as u8, len))
}

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Posts `op` signaled; returns its sequence number. The caller keeps `op`'s borrow of
    /// its memory until [`wait_posted_within`](Self::wait_posted_within) returned for the
    /// sequence number.
    #[inline(always)]
    pub(crate) fn post_send_seq<L: Iterator<Item: Local>>(
        &mut self,
        op: Op<'_, L, T::Ops>,
    ) -> Result<u64, Error<P::Error>> {
        let opcode = self.build_send(op, SendFlags::SIGNALED)?;
        self.post_send_now(opcode)
    }

    /// Posts one signaled send work request of raw entries, checked as an [`Op`] is
    /// ([`admit`]); returns its sequence number.
    ///
    /// The caller must keep the memory named by `sges` borrowed (shared for sends and
    /// writes, exclusive for reads and atomics) until
    /// [`wait_posted_within`](Self::wait_posted_within) returned for the sequence number.
    #[inline(always)]
    pub(crate) fn post_sges_seq(
        &mut self,
        sges: impl IntoIterator<Item = Sge>,
        op: SendOp,
        flags: SendFlags,
        remote: Option<RemoteRegion>,
        atomic: bool,
    ) -> Result<u64, Error<P::Error>> {
        let (opcode, flags) = (op.wc_opcode(), flags | SendFlags::SIGNALED);
        let room = super::op::room(remote);
        fill::<P, SGES>(
            self.sq.lone_entry(),
            &self.qp,
            sges,
            op,
            flags,
            room,
            remote,
            atomic,
        )?;
        self.post_send_now(opcode)
    }

    /// Stages `op` unsignaled in the send ring (the doorbell signals the last of its
    /// batch), built in place and checked as every level checks it
    /// ([`admit`]); returns its sequence number. Needs a free slot
    /// ([`is_full`](Self::is_full)). Always inlined, as [`Scope::post`](super::Scope::post).
    #[inline(always)]
    pub(crate) fn stage_send<L: Iterator<Item: Local>>(
        &mut self,
        op: Op<'_, L, T::Ops>,
    ) -> Result<u64, Error<P::Error>> {
        let (seq, wr) =
            self.sq
                .stage_next(op.op.wc_opcode(), false)
                .map_err(|f| Error::QueueFull {
                    capacity: f.capacity,
                })?;
        if let Err(e) = fill_send::<P, _, _, SGES>(wr, &self.qp, op, SendFlags::empty()) {
            self.sq.unstage_last();
            return Err(e);
        }
        Ok(seq)
    }

    /// Builds `op`, with `flags` added to its own, in the entry of a request posted by
    /// itself ([`Ring::lone_entry`]), checked as every level checks it ([`admit`]);
    /// returns its completion opcode.
    #[inline(always)]
    fn build_send<L: Iterator<Item: Local>>(
        &mut self,
        op: Op<'_, L, T::Ops>,
        flags: SendFlags,
    ) -> Result<WcOpcode, Error<P::Error>> {
        let opcode = op.op.wc_opcode();
        fill_send::<P, _, _, SGES>(self.sq.lone_entry(), &self.qp, op, flags)?;
        Ok(opcode)
    }

    /// Waits for a request posted by `post_*_seq` and takes its outcome, within the bound
    /// of the caller's `waiter` (on timeout the channel's work is ended, as in the blocking
    /// calls).
    pub(crate) fn wait_posted_within(
        &mut self,
        queue: Queue,
        seq: u64,
        waiter: &mut Waiter,
    ) -> Result<Completion, Error<P::Error>> {
        self.wait_seq_within(queue, seq, waiter)
    }
}

/// Whether a device does atomics, asked when an atomic is built: of its queue pair, or of
/// what a [`Batch`](super::Batch) noted of it.
pub(super) trait Atomics<E> {
    fn check_atomics(&self) -> Result<(), Error<E>>;
}

impl<P: Provider, St: crate::qp::State, T: crate::qp::Transport> Atomics<P::Error>
    for crate::qp::QueuePair<P, St, T>
{
    #[inline(always)]
    fn check_atomics(&self) -> Result<(), Error<P::Error>> {
        crate::qp::QueuePair::check_atomics(self)
    }
}

impl<E> Atomics<E> for bool {
    #[inline(always)]
    fn check_atomics(&self) -> Result<(), Error<E>> {
        match self {
            true => Ok(()),
            false => Err(Error::Unsupported(crate::qp::NO_ATOMICS)),
        }
    }
}

/// Builds `op`, with `flags` added to its own, in `wr`, checked as every level checks it
/// ([`admit`]); `atomics` says whether the device does atomics (asked of atomics only).
#[inline(always)]
pub(super) fn fill_send<P: Provider, T: crate::qp::Transport, L, const SGES: usize>(
    wr: &mut P::SendEntry<SGES>,
    atomics: &impl Atomics<P::Error>,
    op: Op<'_, L, T>,
    flags: SendFlags,
) -> Result<(), Error<P::Error>>
where
    L: Iterator<Item: Local>,
{
    let Op {
        local,
        op,
        flags: own,
        room,
        remote,
        atomic,
        ..
    } = op;
    let sges = local.map(|l| l.entry());
    fill::<P, SGES>(wr, atomics, sges, op, own | flags, room, remote, atomic)
}

/// Builds a send of the entries `sges` in `wr`, checked as every level checks it
/// ([`admit`]). Gather entries past the count keep what earlier requests left: providers
/// read only the first `num_sge`, so they need no zeroing.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn fill<P: Provider, const SGES: usize>(
    wr: &mut P::SendEntry<SGES>,
    atomics: &impl Atomics<P::Error>,
    sges: impl IntoIterator<Item = Sge>,
    op: SendOp,
    flags: SendFlags,
    room: u64,
    remote: Option<RemoteRegion>,
    atomic: bool,
) -> Result<(), Error<P::Error>> {
    let (num_sge, len) = gather_into(wr.sges_mut(), sges)
        .map_err(|(given, max)| Error::TooManySges { given, max })?;
    wr.set_num_sge(num_sge);
    wr.set_op(op, flags);
    admit(atomics, room, remote, atomic, len)
}

/// The checks every level makes before posting a send whose local entries hold `len`
/// bytes: an atomic's result is 8 bytes and the device does atomics (`atomics`); a remote
/// region holds the bytes from its start.
#[inline(always)]
fn admit<E>(
    atomics: &impl Atomics<E>,
    room: u64,
    remote: Option<RemoteRegion>,
    atomic: bool,
    len: u64,
) -> Result<(), Error<E>> {
    if atomic {
        if len != 8 {
            return Err(Error::InvalidAttribute(
                "an atomic's result slice must be 8 bytes",
            ));
        }
        atomics.check_atomics()?;
    }
    if len <= room {
        return Ok(());
    }
    match remote {
        Some(remote) => too_short(&remote, len),
        None => Ok(()),
    }
}

/// The error for local bytes the remote region cannot hold, as [`RemoteRegion::slice`]
/// reports it; out of line, so the check inlines small.
#[cold]
#[inline(never)]
fn too_short<E>(remote: &RemoteRegion, len: u64) -> Result<(), Error<E>> {
    remote.slice(..len)?;
    Ok(())
}

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Collects the entries of one work request and their total length.
    #[allow(clippy::type_complexity)]
    fn sges(
        &self,
        it: impl IntoIterator<Item = Sge>,
    ) -> Result<([Sge; SGES], u8, u64), Error<P::Error>> {
        gather(it).map_err(|(given, max)| Error::TooManySges { given, max })
    }

    /// Posts the request built in the send ring's lone entry ([`Ring::lone_entry`]) by
    /// itself, outside the staged batch.
    #[inline(always)]
    fn post_send_now(&mut self, opcode: WcOpcode) -> Result<u64, Error<P::Error>> {
        let (seq, wr) = self
            .sq
            .reserve_lone(opcode, true)
            .map_err(|f| Error::QueueFull {
                capacity: f.capacity,
            })?;
        // SAFETY: the request was built from slices that borrow their memory regions until
        // the caller has waited for it (blocking callers wait before returning; the
        // `post_*_seq` callers promised to).
        if let Err(e) = unsafe { self.qp.post_send_entries(core::slice::from_mut(wr)) } {
            self.sq.unreserve();
            return Err(Error::Provider {
                op: "ibv_post_send",
                source: e.error,
            });
        }
        Ok(seq)
    }

    /// Posts the staged sends as one chain (one doorbell).
    pub(crate) fn flush_sends(&mut self) -> Result<(), Error<P::Error>> {
        let qp = &self.qp;
        flush(&mut self.sq, "ibv_post_send", |staged| {
            // SAFETY: every staged request was built from slices that borrow their memory
            // regions for at least as long as the caller waits for the request (blocking
            // calls and scopes wait before returning; unpolled callers promised to).
            unsafe { qp.post_send_entries(staged) }
        })
    }

    /// Posts one receive work request; returns its sequence number. Same borrowing rule as
    /// [`post_send_seq`](Self::post_send_seq), exclusive. A channel on a shared receive
    /// queue has no receive queue to post to: [`Error::InvalidAttribute`].
    pub(crate) fn post_recv_seq(
        &mut self,
        sges: impl IntoIterator<Item = Sge>,
    ) -> Result<u64, Error<P::Error>> {
        let (sg_list, num_sge, _) = self.sges(sges)?;
        let wr = RecvWr {
            wr_id: 0,
            sg_list,
            num_sge,
        };
        let Some((_, rq)) = self.rx.parts() else {
            return Err(Error::InvalidAttribute(
                "a queue pair on a shared receive queue takes no receives of its own",
            ));
        };
        let qp = &self.qp;
        // SAFETY: `wr` was built from slices that borrow their memory exclusively until the
        // caller has waited for the receive.
        post_recv_one(rq, wr, |wr| unsafe { T::post_recvs(qp, wr) })
    }

    /// Posts the staged receives as one chain (one doorbell).
    pub(crate) fn flush_recvs(&mut self) -> Result<(), Error<P::Error>> {
        let Some((_, rq)) = self.rx.parts() else {
            return Ok(());
        };
        let qp = &self.qp;
        flush(rq, "ibv_post_recv", |staged| {
            // SAFETY: every staged receive was built from exclusive slices that stay
            // borrowed until the caller waits for it (blocking calls and scopes wait
            // before returning; unpolled callers promised to).
            unsafe { T::post_recvs(qp, staged) }
        })
    }
}

/// Posts `ring`'s staged batch with `post`, one doorbell: on success the batch leaves the
/// stage; when the provider refuses the request at `index`, that one and those after it
/// give their slots back and the error is returned (those before it were posted).
#[inline]
fn flush<W: WorkRequest, E, const DEPTH: usize>(
    ring: &mut Ring<W, DEPTH>,
    op: &'static str,
    post: impl FnOnce(&mut [W]) -> Result<(), PostError<E>>,
) -> Result<(), Error<E>> {
    let staged = ring.staged_mut();
    let len = staged.len();
    if len == 0 {
        return Ok(());
    }
    match post(staged) {
        Ok(()) => {
            ring.clear_staged();
            Ok(())
        }
        Err(e) => {
            let unposted = len - e.index;
            ring.unstage(unposted);
            Err(Error::Provider {
                op,
                source: e.error,
            })
        }
    }
}

impl<P: Provider, T: HasOwnRx<P, DEPTH, SGES>, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
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

    /// Stages `wr` (every receive completes); returns its sequence number.
    #[inline]
    pub(crate) fn stage_recv(&mut self, wr: RecvWr<SGES>) -> Result<u64, Error<P::Error>> {
        self.rx.ring.stage(wr, true).map_err(|f| Error::QueueFull {
            capacity: f.capacity,
        })
    }
}

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Whether `queue`'s ring has no free slot: staging there needs room made first.
    #[inline]
    pub(crate) fn is_full(&self, queue: Queue) -> bool {
        match queue {
            Queue::Send => self.sq.in_flight() == DEPTH,
            Queue::Recv => self.rx.ring().map_or(true, |r| r.in_flight() == DEPTH),
        }
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

    /// Whether a request is staged on either queue (not yet posted).
    #[inline]
    pub(crate) fn has_staged(&self) -> bool {
        !self.sq.staged().is_empty() || self.rx.ring().is_some_and(|r| !r.staged().is_empty())
    }

    /// Gives back the slots of every request still staged (a refused doorbell, or a
    /// caller unwinding before it posted them).
    pub(crate) fn unstage_all(&mut self) {
        let s = self.sq.staged().len();
        self.sq.unstage(s);
        if let Some((_, rq)) = self.rx.parts() {
            let r = rq.staged().len();
            rq.unstage(r);
        }
    }

    /// The sequence number the next request staged on `queue` gets.
    #[inline]
    pub(crate) fn next_seq(&self, queue: Queue) -> u64 {
        match queue {
            Queue::Send => self.sq.next_seq(),
            Queue::Recv => self.rx.ring().map_or(0, |r| r.next_seq()),
        }
    }

    /// [`settle_from`](Self::settle_from) with its usual case inline, a scope's end: the
    /// first poll brings the last request's completion, which retires everything from
    /// `from` at once (one doorbell batch, or a single request). Anything else (another
    /// completion, nothing, a failed poll) is `settle_from`'s, which takes what this poll
    /// recorded, within `waiter`'s bound (`None`: the channel's, from then on).
    #[inline(always)]
    pub(crate) fn settle_scope(
        &mut self,
        queue: Queue,
        from: u64,
        waiter: Option<&mut Waiter>,
        mut each: impl FnMut(Result<Completion, Error<P::Error>>),
    ) -> u64 {
        let to = self.next_seq(queue);
        if from == to {
            return to; // nothing posted on it since: no call to settle
        }
        let last = to - 1;
        let mut wc = OneWc::new();
        let polled = match last == from {
            true => self.poll_for(queue, last, &mut wc),
            false => self.poll_through(queue, last, &mut wc),
        };
        match polled {
            Ok(PolledOne::Retired(wc)) if wc.succeeded() => each(Ok(wc.success())),
            Ok(PolledOne::Retired(wc)) => {
                let wc = wc.completion();
                each(Err(self.retired_failed(queue, last, wc)));
            }
            _ => {
                return match waiter {
                    Some(waiter) => self.settle_from(queue, from, waiter, each),
                    None => self.settle_from(queue, from, &mut self.waiter(), each),
                }
            }
        }
        to
    }

    /// Waits, within the bound of `waiter`, for every request posted on `queue` from
    /// sequence number `from` on (all of them the caller's), takes their outcomes in
    /// posting order and hands each to `each`: the completion, or its error. Requests
    /// retired without a completion of their own (unsignaled, succeeded) are skipped. A
    /// wait that fails (timeout, poll error) ends the channel's work, as in the blocking
    /// calls, and hands its error over before the flushed outcomes. Returns where the next
    /// settle starts. Nothing may be staged on `queue`.
    #[inline(never)]
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
                Queue::Recv => self.rx.ring().and_then(|r| r.oldest()),
            };
            seq = seq.max(oldest.unwrap_or(to));
            if seq >= to {
                break;
            }
            if let Some(signaled) = self.waiting(queue, seq) {
                // One completion first, as a blocking call's first poll: usually the one
                // awaited, retired at once. Anything else (another's completion, nothing, a
                // failed poll) is the wait's, which polls again. An unsignaled request has
                // no completion of its own: the one that retires it is usually its batch's
                // signaled last, the last request here, which retires them all at once.
                let mut wc = OneWc::new();
                let (want, polled) = match signaled {
                    true => (seq, self.poll_for(queue, seq, &mut wc)),
                    false => (to - 1, self.poll_through(queue, to - 1, &mut wc)),
                };
                if let Ok(PolledOne::Retired(wc)) = polled {
                    match wc.succeeded() {
                        true => each(Ok(wc.success())),
                        false => {
                            let wc = wc.completion();
                            each(Err(self.retired_failed(queue, want, wc)));
                        }
                    }
                    seq = want + 1;
                    continue;
                }
                if self.is_pending(queue, seq) {
                    if let Err(e) = self.wait_quiet(queue, seq, waiter) {
                        each(Err(e));
                    }
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
