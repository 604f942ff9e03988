//! Scoped posting: many work requests, doorbell batches, buffers borrowed until all
//! complete.

use core::marker::PhantomData;

use super::op::{Local, Op};
use super::wait::Waiter;
use super::{Channel, Queue};
use super::{ChannelTransport, HasOwnRx};
use crate::error::Error;
use crate::mr::{LocalSlice, LocalSliceMut, RemoteRegion};
use crate::provider::Provider;
use crate::qp::Rc;
use crate::ring::Completion;
use crate::types::WcStatus;

/// A receive staged in a [`Scope`]: redeem it, once, with [`Scope::wait_receive`] for its
/// completion.
#[derive(Debug, PartialEq, Eq)]
pub struct PostedReceive {
    pub(super) seq: u64,
}

impl PostedReceive {
    /// The receive's `wr_id`.
    pub fn wr_id(&self) -> u64 {
        self.seq
    }
}

/// Posts work inside [`Channel::scope`] (or [`PreparedChannel::connect_scope`]). It holds
/// the channel for `'ch`; every buffer handed to it stays borrowed for `'env`, which
/// outlives the scope, so the buffers cannot be touched or freed before all posted work
/// has completed.
///
/// [`PreparedChannel::connect_scope`]: super::PreparedChannel::connect_scope
///
/// Posts are staged and go out as doorbell batches: receives first, then sends, when the
/// closure calls [`ring_doorbell`](Scope::ring_doorbell) or returns, or when the ring is
/// full. Sends are unsignaled except the last of each batch (selective signaling): one
/// completion per batch unless a request fails.
pub struct Scope<
    'ch,
    'env,
    P: Provider,
    const DEPTH: usize,
    const SGES: usize,
    T: ChannelTransport = Rc,
> {
    pub(super) ch: &'ch mut Channel<P, DEPTH, SGES, T>,
    send_from: u64,
    recv_from: u64,
    first_error: Option<Error<P::Error>>,
    /// One bound for every wait of the scope: it returns within one timeout plus the grace.
    pub(super) waiter: Waiter,
    // Invariant in 'env: a scope cannot be shrunk to accept shorter borrows.
    _env: PhantomData<&'env mut &'env ()>,
}

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Channel<P, DEPTH, SGES, T>
{
    /// Runs `f` with a [`Scope`] to post work on; returns once every work request posted in
    /// the scope has completed (also if `f` panics). Its waits together take at most one
    /// [`timeout`](crate::ChannelConfig::timeout) plus the
    /// [`flush_grace`](crate::ChannelConfig::flush_grace), however many requests it posted.
    /// The first error wins: `f`'s own, then
    /// the first post or completion error, in posting order.
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{Channel, ChannelConfig, Context};
    /// # let p = zverbs::testing::Pair::<64, 4>::connected(&ChannelConfig::default()).unwrap();
    /// # let (pa, pb, mut a, mut b) = (p.a.pd, p.b.pd, p.a.ch, p.b.ch);
    /// let mut inbox = [0u8; 8];
    /// let mut inbox = pb.register(&mut inbox).unwrap();
    /// let mut outbox = *b"abcdefgh";
    /// let outbox = pa.register(&mut outbox).unwrap();
    /// std::thread::scope(|t| {
    ///     // Two receives in one doorbell...
    ///     t.spawn(|| {
    ///         b.scope(|s| {
    ///             let (first, second) = inbox.slice_mut(..)?.split_at(4)?;
    ///             s.post_receive([first])?;
    ///             s.post_receive([second])?;
    ///             Ok(())
    ///         })
    ///         .unwrap()
    ///     });
    ///     // ...two sends in another, one completion for both.
    ///     a.scope(|s| {
    ///         let (x, y) = outbox.slice(..)?.split_at(4)?;
    ///         s.post_send([y])?;
    ///         s.post_send([x])?;
    ///         Ok(())
    ///     })
    ///     .unwrap();
    /// });
    /// assert_eq!(inbox.as_slice(), b"efghabcd");
    /// ```
    pub fn scope<'env, R>(
        &'env mut self,
        f: impl FnOnce(&mut Scope<'env, 'env, P, DEPTH, SGES, T>) -> Result<R, Error<P::Error>>,
    ) -> Result<R, Error<P::Error>> {
        let recv_from = self.next_seq(Queue::Recv);
        run(self, recv_from, f)
    }
}

/// Runs `f` in a scope on `ch` that holds the receives from `recv_from` on (those posted
/// before it, by the caller, under the same borrow of their memory) and everything `f`
/// posts; returns once all of it has completed.
pub(super) fn run<'ch, 'env, P, T, R, const DEPTH: usize, const SGES: usize>(
    ch: &'ch mut Channel<P, DEPTH, SGES, T>,
    recv_from: u64,
    f: impl FnOnce(&mut Scope<'ch, 'env, P, DEPTH, SGES, T>) -> Result<R, Error<P::Error>>,
) -> Result<R, Error<P::Error>>
where
    P: Provider,
    T: ChannelTransport,
{
    let send_from = ch.sq.next_seq();
    let waiter = ch.waiter();
    let mut scope = Scope {
        ch,
        send_from,
        recv_from,
        first_error: None,
        waiter,
        _env: PhantomData,
    };
    let value = f(&mut scope);
    let pending_error = scope.finish();
    // Finished, its error taken: nothing is left for its `Drop` (which settles a scope
    // that `f` unwound out of) to do.
    core::mem::forget(scope);
    let value = value?;
    match pending_error {
        Some(e) => Err(e),
        None => Ok(value),
    }
}

impl<'env, P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize>
    Scope<'_, 'env, P, DEPTH, SGES, T>
{
    /// Stages `op`; returns its `wr_id`. The scope's one way to post a request built on the
    /// spot: the named methods below are sugar over it (requests built once and posted
    /// again and again: [`post_batch`](Self::post_batch)). Always inlined: a loop of posts is the
    /// batch's hot path, and a call per request cost 16 instructions of register saves.
    #[inline(always)]
    pub fn post<L: Iterator<Item: Local>>(
        &mut self,
        op: Op<'env, L, T::Ops>,
    ) -> Result<u64, Error<P::Error>> {
        // Room first: the request is built where it is staged.
        if self.ch.is_full(Queue::Send) {
            self.make_room(Queue::Send)?;
        }
        self.ch.stage_send(op)
    }

    /// Waits for the send-queue operation `wr_id` staged in this scope (what
    /// [`post`](Self::post) returned) and returns its completion, as
    /// [`wait_receive`](Self::wait_receive) does for a receive: rings the doorbell first,
    /// takes the outcome (the scope's end does not report it again), shares the scope's
    /// one bound. An operation that was not its batch's signaled last completes when a
    /// later one does (selective signaling): its completion then says success with its
    /// opcode, and no byte count (the device reported none for it).
    ///
    /// An id that is not a send of this scope still to be waited for is an
    /// [`Error::InvalidAttribute`].
    pub fn wait_send(&mut self, wr_id: u64) -> Result<Completion, Error<P::Error>> {
        if wr_id < self.send_from || !self.ch.holds(Queue::Send, wr_id) {
            return Err(Error::InvalidAttribute(
                "not a send of this scope still to be waited for",
            ));
        }
        let opcode = self.ch.sq.opcode(wr_id);
        self.ring_doorbell()?;
        self.ch.wait_quiet(Queue::Send, wr_id, &mut self.waiter)?;
        match self.ch.take(Queue::Send, wr_id) {
            Some(r) => r,
            // Retired by a later request's completion: it succeeded (a send queue completes
            // in order, and an error completes the request that failed, signaled or not).
            None => Ok(Completion::bare(WcStatus::Success, opcode)),
        }
    }

    /// Posts everything staged: receives as one chain, then sends as one chain whose last
    /// request is signaled.
    pub fn ring_doorbell(&mut self) -> Result<(), Error<P::Error>> {
        self.ch.ring_doorbell(&mut self.waiter)
    }

    /// The ring is full: post what is staged and wait for this scope's work so far. Work
    /// posted before the scope (unpolled) is not ours to take: if that is what fills the
    /// ring, the ring stays full.
    ///
    /// Out of line: staging checks for this first, and the common case inlines.
    #[inline(never)]
    pub(super) fn make_room(&mut self, queue: Queue) -> Result<(), Error<P::Error>> {
        self.ring_doorbell()?;
        self.drain(queue);
        Ok(())
    }

    /// Waits for every request this scope posted on `queue` and takes its outcome,
    /// keeping the first error. Inlined: its first poll is the scope's usual end
    /// ([`Channel::settle_scope`]).
    #[inline(always)]
    fn drain(&mut self, queue: Queue) {
        let from = match queue {
            Queue::Send => self.send_from,
            Queue::Recv => self.recv_from,
        };
        let first_error = &mut self.first_error;
        let to = self
            .ch
            .settle_scope(queue, from, Some(&mut self.waiter), |r| {
                if let Err(e) = r {
                    first_error.get_or_insert(e);
                }
            });
        match queue {
            Queue::Send => self.send_from = to,
            Queue::Recv => self.recv_from = to,
        }
    }

    /// Posts what is staged, then waits for everything; returns the first error.
    fn finish(&mut self) -> Option<Error<P::Error>> {
        // A closure that rang the doorbell itself left nothing staged: no call for it.
        if self.ch.has_staged() {
            if let Err(e) = self.ring_doorbell() {
                self.first_error.get_or_insert(e);
            }
            // Anything still staged was refused by the device: give its slots back.
            self.ch.unstage_all();
        }
        self.drain_all()
    }

    /// [`finish`](Self::finish) for a scope unwound out of: what was staged is not posted.
    fn settle(&mut self) -> Option<Error<P::Error>> {
        self.ch.unstage_all();
        self.drain_all()
    }

    fn drain_all(&mut self) -> Option<Error<P::Error>> {
        self.drain(Queue::Recv);
        self.drain(Queue::Send);
        self.first_error.take()
    }
}

impl<'env, P: Provider, T: HasOwnRx<P, DEPTH, SGES>, const DEPTH: usize, const SGES: usize>
    Scope<'_, 'env, P, DEPTH, SGES, T>
{
    /// Stages a receive into `data`. The handle may be given to
    /// [`wait_receive`](Self::wait_receive) for the receive's completion; ignored, the
    /// scope waits for the receive when it ends.
    #[inline]
    pub fn post_receive(
        &mut self,
        data: impl IntoIterator<Item = LocalSliceMut<'env>>,
    ) -> Result<PostedReceive, Error<P::Error>> {
        let wr = self.ch.recv_wr(data.into_iter().map(|s| s.sge()))?;
        if self.ch.is_full(Queue::Recv) {
            self.make_room(Queue::Recv)?;
        }
        self.ch.stage_recv(wr).map(|seq| PostedReceive { seq })
    }

    /// Waits for the receive `wr_id` posted in this scope and returns its completion (the
    /// byte count, the immediate data), as C programs read a receive's work completion
    /// after "post a receive, then send". Rings the doorbell first, so the receive and any
    /// staged sends go out. The receive's buffer stays borrowed until the scope ends (read
    /// it after); its outcome is taken here, so the scope's end does not report it again.
    /// Shares the scope's one bound.
    ///
    /// A handle of another scope is an [`Error::InvalidAttribute`].
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{Channel, ChannelConfig, Context};
    /// # let p = zverbs::testing::Pair::<64, 4>::connected(&ChannelConfig::default()).unwrap();
    /// # let (pa, pb, mut a, mut b) = (p.a.pd, p.b.pd, p.a.ch, p.b.ch);
    /// let (mut ask, mut answer) = (*b"ping", [0u8; 16]);
    /// let ask = pa.register(&mut ask).unwrap();
    /// let mut answer = pa.register(&mut answer).unwrap();
    /// std::thread::scope(|t| {
    ///     t.spawn(|| {
    ///         let mut buf = [0u8; 16];
    ///         let mut buf = pb.register(&mut buf).unwrap();
    ///         let n = b.receive([buf.slice_mut(..).unwrap()]).unwrap().byte_len as usize;
    ///         b.send_with_imm([buf.slice(..n).unwrap()], 7).unwrap(); // echo, tagged
    ///     });
    ///     // Post a receive, then send, then read the receive's completion.
    ///     let got = a.scope(|s| {
    ///         let reply = s.post_receive([answer.slice_mut(..)?])?;
    ///         s.post_send([ask.slice(..)?])?;
    ///         s.wait_receive(reply)
    ///     })
    ///     .unwrap();
    ///     assert_eq!((got.byte_len, got.imm), (4, Some(7)));
    /// });
    /// assert_eq!(&answer.as_slice()[..4], b"ping");
    /// ```
    pub fn wait_receive(&mut self, posted: PostedReceive) -> Result<Completion, Error<P::Error>> {
        let wr_id = posted.seq;
        if wr_id < self.recv_from || !self.ch.holds(Queue::Recv, wr_id) {
            return Err(Error::InvalidAttribute(
                "not a receive of this scope still to be waited for",
            ));
        }
        self.ring_doorbell()?;
        self.ch
            .wait_seq_within(Queue::Recv, wr_id, &mut self.waiter)
    }
}

impl<'env, P: Provider, T: ChannelTransport<Ops = Rc>, const DEPTH: usize, const SGES: usize>
    Scope<'_, 'env, P, DEPTH, SGES, T>
{
    /// Stages a send of the concatenation of `data`. Returns its `wr_id`.
    #[inline]
    pub fn post_send(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'env>>,
    ) -> Result<u64, Error<P::Error>> {
        self.post(Op::send(data))
    }

    /// Stages a send with immediate data.
    #[inline]
    pub fn post_send_with_imm(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'env>>,
        imm: u32,
    ) -> Result<u64, Error<P::Error>> {
        self.post(Op::send_with_imm(data, imm))
    }

    /// Stages an RDMA write of `data` to the start of `remote`.
    #[inline]
    pub fn post_write(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'env>>,
        remote: &RemoteRegion,
    ) -> Result<u64, Error<P::Error>> {
        self.post(Op::write(data, remote))
    }

    /// Stages an RDMA write with immediate data.
    #[inline]
    pub fn post_write_with_imm(
        &mut self,
        data: impl IntoIterator<Item = LocalSlice<'env>>,
        remote: &RemoteRegion,
        imm: u32,
    ) -> Result<u64, Error<P::Error>> {
        self.post(Op::write_with_imm(data, remote, imm))
    }

    /// Stages an RDMA read from the start of `remote` into `data`.
    #[inline]
    pub fn post_read(
        &mut self,
        data: impl IntoIterator<Item = LocalSliceMut<'env>>,
        remote: &RemoteRegion,
    ) -> Result<u64, Error<P::Error>> {
        self.post(Op::read(data, remote))
    }

    /// Stages a fetch-and-add; the previous value lands in `result` (8 bytes).
    #[inline]
    pub fn post_fetch_add(
        &mut self,
        result: LocalSliceMut<'env>,
        remote: &RemoteRegion,
        add: u64,
    ) -> Result<u64, Error<P::Error>> {
        self.post(Op::fetch_add(result, remote, add))
    }

    /// Stages a compare-and-swap; the previous value lands in `result` (8 bytes).
    #[inline]
    pub fn post_compare_swap(
        &mut self,
        result: LocalSliceMut<'env>,
        remote: &RemoteRegion,
        compare: u64,
        swap: u64,
    ) -> Result<u64, Error<P::Error>> {
        self.post(Op::compare_swap(result, remote, compare, swap))
    }
}

impl<P: Provider, T: ChannelTransport, const DEPTH: usize, const SGES: usize> Drop
    for Scope<'_, '_, P, DEPTH, SGES, T>
{
    fn drop(&mut self) {
        // Unwinding out of the closure (a scope that finished is forgotten, not dropped):
        // posted work may still use the borrowed buffers.
        self.settle();
    }
}
