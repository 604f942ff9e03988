//! A prepared batch: send-queue requests built and checked once, then posted any number of
//! times, each time as one chain with one doorbell ([`Channel::execute_batch`],
//! [`Scope::post_batch`]). The loop of
//! perftest's bandwidth tests, a reader's fixed set of reads from one peer each round: the
//! same requests on one connection again and again, of which a post rewrites only the
//! `wr_id`s.

use core::marker::PhantomData;
use core::ops::Range;

use super::op::{Local, Op};
use super::post::fill_send;
use super::scope::Scope;
use super::wait::Waiter;
use super::{Channel, ChannelTransport, Owner, Queue};
use crate::error::Error;
use crate::provider::{Provider, WorkRequest};
use crate::qp::{Rc, Transport};
use crate::ring::Slot;
use crate::types::{SendFlags, WcOpcode};

/// Up to `N` send-queue operations, each checked when [pushed](Batch::push) as
/// [`Scope::post`] checks it, for the channel that made the batch ([`Channel::batch`]);
/// posted there by [`Channel::execute_batch`] (which waits for it), [`Scope::post_batch`]
/// (or, for a peer's channel, [`MultiScope::post_batch`](crate::MultiScope::post_batch))
/// as one chain, its last request signaled, as often as wanted. The local memory the
/// operations name stays borrowed for `'a`, as long as the batch lives.
///
/// ```
/// # use zverbs::provider::sim::Sim;
/// # use zverbs::{AccessFlags, ChannelConfig};
/// # let p = zverbs::testing::Pair::<64, 4>::connected(&ChannelConfig::default())?;
/// # let (pa, pb, mut a, _b) = (p.a.pd, p.b.pd, p.a.ch, p.b.ch);
/// use zverbs::{Batch, Op};
///
/// let mut target = [0u8; 16];
/// // SAFETY: nothing reads `target` until the writes below have completed.
/// let target = unsafe { pb.register_with_access(&mut target, AccessFlags::all())? };
/// let mut source = *b"abcdefghijklmnop";
/// let source = pa.register(&mut source)?;
/// let remote = target.remote();
/// // Four writes of four bytes each, checked once.
/// let mut quarters: Batch<Sim, 4> = a.batch();
/// for at in (0..16).step_by(4) {
///     quarters.push(Op::write([source.slice(at..at + 4)?], &remote.slice(at as u64..)?))?;
/// }
/// for _ in 0..3 {
///     a.scope(|s| s.post_batch(&mut quarters).map(drop))?;
/// }
/// assert_eq!(target.as_slice(), b"abcdefghijklmnop");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Batch<'a, P: Provider, const N: usize, const SGES: usize = 4, T: Transport = Rc> {
    /// Entries `..len` are the requests in posting order, the last one signaled; their
    /// `wr_id`s are rewritten by each post.
    entries: [P::SendEntry<SGES>; N],
    /// What each request's ring slot holds while it is in flight.
    slots: [Slot; N],
    len: usize,
    /// The most requests it takes: `N`, or the channel's `DEPTH` if smaller (a batch is
    /// posted whole).
    capacity: usize,
    /// Whether the channel's device does atomics.
    atomics: bool,
    /// The channel that made it, the only one that posts it.
    owner: Owner,
    /// Where `entries` lay when a post of them last succeeded, if nothing but their
    /// `wr_id`s was written since (a push clears it); 0 if not. A provider that links the
    /// entries of a chain finds them linked when they still lie there.
    posted_from: usize,
    /// The borrow of the local memory (and of a datagram's address handle).
    _marker: PhantomData<(&'a (), T)>,
}

impl<P: Provider, const N: usize, const SGES: usize, T: Transport> core::fmt::Debug
    for Batch<'_, P, N, SGES, T>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Batch")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl<'a, P: Provider, const N: usize, const SGES: usize, T: Transport> Batch<'a, P, N, SGES, T> {
    /// Builds `op` as the batch's last request, checked as [`Scope::post`] checks it
    /// (gather entries, the remote region's room, atomics); returns its index, which a
    /// post of the batch adds to the first sequence number it returns. A batch holding its
    /// capacity already (`N`, or the channel's `DEPTH` if smaller) refuses it with
    /// [`Error::InvalidAttribute`].
    pub fn push<L: Iterator<Item: Local>>(
        &mut self,
        op: Op<'a, L, T>,
    ) -> Result<usize, Error<P::Error>> {
        let i = self.len;
        if i == self.capacity {
            return Err(Error::InvalidAttribute(
                "a batch holds at most its N, and its channel's DEPTH, requests",
            ));
        }
        let slot = Slot::posted(op.op.wc_opcode(), true);
        let entry = &mut self.entries[i];
        fill_send::<P, T, L, SGES>(entry, &self.atomics, op, SendFlags::SIGNALED)?;
        if let Some(was_last) = i.checked_sub(1) {
            self.entries[was_last].set_signaled(false);
            self.slots[was_last] = self.slots[was_last].signaled(false);
        }
        self.slots[i] = slot;
        self.len += 1;
        self.posted_from = 0;
        Ok(i)
    }

    /// How many requests one post of it posts.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no request (a post of it posts nothing).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// An empty [`Batch`] of up to `N` requests (and no more than `DEPTH`) for this
    /// channel, to [`push`](Batch::push) operations into.
    pub fn batch<'a, const N: usize>(&self) -> Batch<'a, P, N, SGES, T::Ops> {
        Batch {
            entries: [<P::SendEntry<SGES> as WorkRequest>::BLANK; N],
            slots: [Slot::posted(WcOpcode::Send, false); N],
            len: 0,
            capacity: N.min(DEPTH),
            atomics: self.qp.check_atomics().is_ok(),
            owner: self.owner,
            posted_from: 0,
            _marker: PhantomData,
        }
    }

    /// Posts the chain `entries`, whose ring slots hold `slots`, built by a
    /// [`Batch`], its last signaled, and `linked` by an earlier post
    /// ([`Provider::post_send_chain`]); returns their sequence numbers. Nothing
    /// may be staged. A chain the device took in part is ended as a refused doorbell is
    /// ([`ring_doorbell`](Self::ring_doorbell)).
    fn post_chain(
        &mut self,
        entries: &mut [P::SendEntry<SGES>],
        slots: &[Slot],
        linked: bool,
        waiter: Option<&mut Waiter>,
    ) -> Result<Range<u64>, Error<P::Error>> {
        let first = self
            .sq
            .reserve_chain(entries, slots)
            .map_err(|f| Error::QueueFull {
                capacity: f.capacity,
            })?;
        let posted = first..first + entries.len() as u64;
        if entries.is_empty() {
            return Ok(posted);
        }
        // SAFETY: the requests were built from slices that borrow their memory for the
        // batch's lifetime, which outlives the scope posting them; the scope waits for
        // them before it returns. `linked` is the caller's, as `post_send_chain` says.
        match unsafe { self.qp.post_send_chain(entries, linked) } {
            Ok(()) => Ok(posted),
            Err(e) => {
                self.sq.unreserve_run(entries.len() - e.index);
                let err = Error::Provider {
                    op: "ibv_post_send",
                    source: e.error,
                };
                // Unsignaled requests the device took, with no signaled one behind them.
                Err(if e.index > 0 {
                    match waiter {
                        Some(waiter) => self.quiesce(waiter, err),
                        None => self.quiesce(&mut self.waiter(), err),
                    }
                } else {
                    err
                })
            }
        }
    }

    /// Posts `batch` as one chain with one doorbell and waits until all of it completed:
    /// the blocking level's [`Scope::post_batch`], as [`execute`](Self::execute) is
    /// [`Scope::post`]'s. Its last request's completion retires the whole batch; the first
    /// request that failed is reported ([`Error::Completion`]), after the rest were
    /// flushed. A timeout ends the channel's work, as for [`execute`](Self::execute).
    ///
    /// A batch built for another channel is an [`Error::InvalidAttribute`]; a ring whose
    /// room unpolled work holds, [`Error::QueueFull`] (nothing posted).
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{AccessFlags, ChannelConfig};
    /// # let p = zverbs::testing::Pair::<64, 4>::connected(&ChannelConfig::default())?;
    /// # let (pa, pb, mut a, _b) = (p.a.pd, p.b.pd, p.a.ch, p.b.ch);
    /// use zverbs::{Batch, Op};
    ///
    /// let mut target = [0u8; 8];
    /// // SAFETY: nothing reads `target` until the writes below have completed.
    /// let target = unsafe { pb.register_with_access(&mut target, AccessFlags::all())? };
    /// let mut source = *b"abcdefgh";
    /// let source = pa.register(&mut source)?;
    /// let remote = target.remote();
    /// let mut halves: Batch<Sim, 2> = a.batch();
    /// halves.push(Op::write([source.slice(..4)?], &remote))?;
    /// halves.push(Op::write([source.slice(4..)?], &remote.slice(4..)?))?;
    /// a.execute_batch(&mut halves)?;
    /// assert_eq!(target.as_slice(), b"abcdefgh");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execute_batch<const N: usize>(
        &mut self,
        batch: &mut Batch<'_, P, N, SGES, T::Ops>,
    ) -> Result<(), Error<P::Error>> {
        self.batch_len(batch)?;
        let posted = self.post_batch(batch, None)?;
        // The last request's completion usually retires the batch at once: a scope's end.
        let mut first = Ok(());
        self.settle_scope(Queue::Send, posted.start, None, |r| {
            if let (Err(e), Ok(())) = (r, &first) {
                first = Err(e);
            }
        });
        first
    }

    /// How many requests `batch` posts, if this channel made it; a batch of another is an
    /// [`Error::InvalidAttribute`]. A scope asks this first, then posts what it staged and
    /// makes room ([`send_room`](Self::send_room)), then [`post_batch`](Self::post_batch).
    pub(crate) fn batch_len<const N: usize>(
        &self,
        batch: &Batch<'_, P, N, SGES, T::Ops>,
    ) -> Result<usize, Error<P::Error>> {
        if batch.owner != self.owner {
            return Err(Error::InvalidAttribute("a batch built for another channel"));
        }
        Ok(batch.len)
    }

    /// How many requests the send ring takes now.
    pub(crate) fn send_room(&self) -> usize {
        DEPTH - self.sq.in_flight()
    }

    /// Posts `batch`, which this channel made ([`batch_len`](Self::batch_len)), with
    /// nothing staged; returns the sequence numbers of its requests. The caller waits for
    /// them before the memory `'b` borrows is released (a scope of `'env` where `'b:
    /// 'env`). A chain the device took in part is ended within `waiter`'s bound (`None`:
    /// the channel's).
    pub(crate) fn post_batch<const N: usize>(
        &mut self,
        batch: &mut Batch<'_, P, N, SGES, T::Ops>,
        waiter: Option<&mut Waiter>,
    ) -> Result<Range<u64>, Error<P::Error>> {
        let len = batch.len;
        let (entries, slots) = (&mut batch.entries[..len], &batch.slots[..len]);
        let from = entries.as_ptr() as usize;
        // Linked if the last post succeeded from here: entries move with the batch, and
        // only pushes (which clear `posted_from`) and `wr_id`s write them.
        let linked = batch.posted_from == from;
        let posted = self.post_chain(entries, slots, linked, waiter);
        batch.posted_from = if posted.is_ok() { from } else { 0 };
        posted
    }
}

impl<'env, P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Scope<'_, 'env, P, DEPTH, SGES, T>
{
    /// Posts `batch` as one chain with one doorbell, after anything staged (which goes out
    /// first); returns the sequence numbers of its requests, which
    /// [`wait_send`](Self::wait_send) takes, as [`post`](Self::post)'s. The scope waits for
    /// them as for the rest of its work. If the ring has no room for the whole batch, this
    /// scope's work so far is waited for first; if work posted before the scope (unpolled)
    /// still holds the room, [`Error::QueueFull`].
    ///
    /// A batch built for another channel is an [`Error::InvalidAttribute`].
    pub fn post_batch<'b: 'env, const N: usize>(
        &mut self,
        batch: &mut Batch<'b, P, N, SGES, T::Ops>,
    ) -> Result<Range<u64>, Error<P::Error>> {
        let len = self.ch.batch_len(batch)?;
        if self.ch.has_staged() {
            self.ring_doorbell()?;
        }
        if self.ch.send_room() < len {
            self.make_room(Queue::Send)?;
        }
        self.ch.post_batch(batch, Some(&mut self.waiter))
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use crate::mr::RemoteRegion;
    use crate::types::SendFlags;
    use crate::{ChannelConfig, Op};

    /// Selective signaling as a scope's doorbell does it: one completion per post of the
    /// batch, from its last request, however the batch grew.
    #[test]
    fn only_the_last_request_is_signaled() {
        let p = crate::testing::Pair::<8, 1>::connected(&ChannelConfig::default()).unwrap();
        let mut src = [0u8; 4];
        let src = p.a.pd.register(&mut src).unwrap();
        let remote = RemoteRegion {
            addr: 0x1000,
            len: 4,
            rkey: 1,
        };
        let mut batch = p.a.ch.batch::<3>();
        let signaled = |b: &super::Batch<'_, crate::provider::sim::Sim, 3, 1>| -> Vec<bool> {
            let entries = &b.entries[..b.len];
            entries
                .iter()
                .map(|e| e.flags.contains(SendFlags::SIGNALED))
                .collect()
        };
        for n in 1..=3 {
            batch
                .push(Op::write([src.slice(..).unwrap()], &remote))
                .unwrap();
            let mut want = vec![false; n];
            want[n - 1] = true;
            assert_eq!(signaled(&batch), want);
        }
    }
}
