//! Scoped posting across peers: post any mix, everything completes before the scope ends,
//! in one doorbell batch per peer and queue, one completion per batch of sends.

use core::marker::PhantomData;
use core::ops::Range;

use super::{MultiChannel, PeerTransport};
use crate::channel::wait::Waiter;
use crate::channel::{Batch, Local, Op, Queue};
use crate::error::Error;
use crate::mr::{LocalSlice, LocalSliceMut, RemoteRegion};
use crate::provider::Provider;
use crate::qp::Rc;

/// Posts work to many peers inside [`MultiChannel::scope`]. Every buffer handed to it
/// stays borrowed for `'env`, which outlives the scope, so buffers cannot be touched or
/// freed before all posted work has completed.
///
/// Posts are staged in each peer's rings, as in a single-peer [`Scope`](crate::Scope),
/// and go out as doorbell batches: per peer, its receives as one chain and its sends as
/// another, when the closure returns or when a peer's ring is full (then every peer's
/// doorbell rings, and the scope waits for its own work on the full queue before staging
/// more). Sends are unsignaled except the last of each batch (selective signaling): one
/// completion per batch and peer unless a request fails. So a scope that posts `k <= DEPTH`
/// requests to each of its peers rings one doorbell per peer and queue, and waits for
/// one send completion per peer. Post errors of the device come with the doorbell: they
/// become the scope's error (if first) and the peer's [outcome](MultiChannel::outcome).
pub struct MultiScope<
    'env,
    P: Provider,
    const PEERS: usize,
    const DEPTH: usize,
    const SGES: usize,
    T: PeerTransport = Rc,
> {
    mc: &'env mut MultiChannel<P, PEERS, DEPTH, SGES, T>,
    /// Where each peer's queues start with this scope's work not yet settled.
    from: Marks<PEERS>,
    first_error: Option<Error<P::Error>>,
    /// One bound for every wait of the scope.
    waiter: Waiter,
    // Invariant in 'env: a scope cannot be shrunk to accept shorter borrows.
    _env: PhantomData<&'env mut &'env ()>,
}

impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    MultiChannel<P, PEERS, DEPTH, SGES, T>
{
    /// Runs `f` with a [`MultiScope`]; returns once every work request posted in it has
    /// completed (also if `f` panics: what is still staged then is not posted), its waits
    /// together within one timeout plus the grace. The first error wins: `f`'s own, then
    /// the first refused doorbell or completion error (at the end, peers are waited for in
    /// index order); every peer's outcome, successes included, is then readable with
    /// [`outcome`](MultiChannel::outcome), and [`failed_peers`](MultiChannel::failed_peers)
    /// names every peer that failed.
    ///
    /// ```
    /// # use zverbs::provider::sim::Sim;
    /// # use zverbs::{ChannelConfig, Context, MultiChannel};
    /// # let sim = Sim::with_devices(2);
    /// # let (c0, c1) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
    /// # let (p0, p1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    /// # let cfg = ChannelConfig::default();
    /// # let a = MultiChannel::<Sim, 2>::prepare(&c0, &p0, [1], &cfg).unwrap();
    /// # let b = MultiChannel::<Sim, 2>::prepare(&c1, &p1, [0], &cfg).unwrap();
    /// # let (ea, eb) = (a.endpoint(1).unwrap(), b.endpoint(0).unwrap());
    /// # let mut a = a.connect(|_| Some(eb)).unwrap();
    /// # let _b = b.connect(|_| Some(ea)).unwrap();
    /// let mut remote = [0u8; 8];
    /// let remote = unsafe { p1.register_with_access(&mut remote, zverbs::AccessFlags::LOCAL_WRITE
    ///     | zverbs::AccessFlags::REMOTE_WRITE) }.unwrap();
    /// let region = remote.remote();
    /// let mut local = *b"abcdefgh";
    /// let local = p0.register(&mut local).unwrap();
    /// a.scope(|s| {
    ///     let (x, y) = local.slice(..)?.split_at(4)?;
    ///     s.post_write(1, [x], &region.slice(..4)?)?;
    ///     s.post_write(1, [y], &region.slice(4..)?)?;
    ///     Ok(())
    /// })
    /// .unwrap();
    /// assert_eq!(remote.as_slice(), b"abcdefgh");
    /// // The simulator counts: one doorbell for both writes, one completion for both.
    /// let c = a.peer(1).unwrap().queue_pair().raw().counters();
    /// assert_eq!((c.send_doorbells, c.sends_posted, c.send_completions), (1, 2, 1));
    /// ```
    pub fn scope<'env, R>(
        &'env mut self,
        f: impl FnOnce(&mut MultiScope<'env, P, PEERS, DEPTH, SGES, T>) -> Result<R, Error<P::Error>>,
    ) -> Result<R, Error<P::Error>> {
        self.outcomes.iter_mut().for_each(|o| *o = None);
        let waiter = self.waiter();
        let mut scope = MultiScope {
            waiter,
            mc: self,
            from: Marks::new(),
            first_error: None,
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
}

impl<
        'env,
        P: Provider,
        T: PeerTransport,
        const PEERS: usize,
        const DEPTH: usize,
        const SGES: usize,
    > MultiScope<'env, P, PEERS, DEPTH, SGES, T>
{
    /// Posts `op` to `peer`; returns its `wr_id`. The scope's one way to post on a send
    /// queue: the named methods below are sugar over it.
    pub fn post<L: Iterator<Item: Local>>(
        &mut self,
        peer: usize,
        op: Op<'env, L>,
    ) -> Result<u64, Error<P::Error>> {
        // Room first: the request is built where it is staged.
        if self.mc.peer(peer)?.is_full(Queue::Send) {
            self.make_room(peer, Queue::Send)?;
        }
        let seq = self.mc.peer(peer)?.stage_send(op)?;
        self.from.at(Queue::Send, peer).get_or_insert(seq);
        Ok(seq)
    }

    /// Posts a send of the concatenation of `data` to `peer`. Returns its `wr_id`.
    pub fn post_send(
        &mut self,
        peer: usize,
        data: impl IntoIterator<Item = LocalSlice<'env>>,
    ) -> Result<u64, Error<P::Error>> {
        self.post(peer, Op::send(data))
    }

    /// Posts a send with immediate data to `peer`.
    pub fn post_send_with_imm(
        &mut self,
        peer: usize,
        data: impl IntoIterator<Item = LocalSlice<'env>>,
        imm: u32,
    ) -> Result<u64, Error<P::Error>> {
        self.post(peer, Op::send_with_imm(data, imm))
    }

    /// Posts the same `data` to every peer in `peers`.
    pub fn multicast_send(
        &mut self,
        peers: impl IntoIterator<Item = usize>,
        data: LocalSlice<'env>,
    ) -> Result<(), Error<P::Error>> {
        for p in peers {
            self.post_send(p, [data])?;
        }
        Ok(())
    }

    /// Posts an RDMA write of `data` to the start of `remote` at `peer`.
    pub fn post_write(
        &mut self,
        peer: usize,
        data: impl IntoIterator<Item = LocalSlice<'env>>,
        remote: &RemoteRegion,
    ) -> Result<u64, Error<P::Error>> {
        self.post(peer, Op::write(data, remote))
    }

    /// Posts an RDMA read from the start of `remote` at `peer` into `data`.
    pub fn post_read(
        &mut self,
        peer: usize,
        data: impl IntoIterator<Item = LocalSliceMut<'env>>,
        remote: &RemoteRegion,
    ) -> Result<u64, Error<P::Error>> {
        self.post(peer, Op::read(data, remote))
    }

    /// Posts `batch`, built by `peer`'s channel ([`Channel::batch`](crate::Channel::batch) of
    /// [`MultiChannel::peer`]), to `peer` as one chain with one doorbell, after what is
    /// staged (every peer's doorbell rings first if `peer` has staged work); returns the
    /// sequence numbers of its requests. As [`Scope::post_batch`](crate::Scope::post_batch)
    /// otherwise: this scope's work on the peer's send queue is waited for first if its
    /// ring lacks room; a batch of another channel is an [`Error::InvalidAttribute`].
    pub fn post_batch<'b: 'env, const N: usize>(
        &mut self,
        peer: usize,
        batch: &mut Batch<'b, P, N, SGES>,
    ) -> Result<Range<u64>, Error<P::Error>> {
        let ch = self.mc.peer(peer)?;
        let len = ch.batch_len(batch)?;
        if ch.has_staged() {
            if let Some(e) = self.flush(Some(peer)) {
                return Err(e);
            }
        }
        if self.mc.peer(peer)?.send_room() < len {
            self.make_room(peer, Queue::Send)?;
        }
        let ch = self.mc.peer(peer)?;
        // Settled from here on, whatever the post takes.
        let next = ch.next_seq(Queue::Send);
        self.from.at(Queue::Send, peer).get_or_insert(next);
        ch.post_batch(batch, Some(&mut self.waiter))
    }

    /// `peer`'s ring for `queue` is full: ring every peer's doorbell (nothing staged stays
    /// behind while the scope waits), then wait for this scope's work on that queue.
    /// Work posted there before the scope (unpolled) is not ours to take: if that is what
    /// fills the ring, it stays full. A refused doorbell of `peer` is returned at once.
    ///
    /// Out of line: staging checks for this first, and the common case inlines.
    #[inline(never)]
    fn make_room(&mut self, peer: usize, queue: Queue) -> Result<(), Error<P::Error>> {
        if let Some(e) = self.flush(Some(peer)) {
            return Err(e);
        }
        self.settle(peer, queue);
        Ok(())
    }

    /// Rings the doorbell of every peer with staged work: one chain of receives and one of
    /// sends each, the last send signaled. A refusal becomes that peer's outcome (and the
    /// scope's error, if first); the one of `peer`, if any, is returned as well.
    fn flush(&mut self, peer: Option<usize>) -> Option<Error<P::Error>> {
        let mut refused = None;
        for (p, (slot, outcome)) in self
            .mc
            .peers
            .iter_mut()
            .zip(self.mc.outcomes.iter_mut())
            .enumerate()
        {
            let Some(ch) = slot.as_mut().filter(|_| self.from.touched(p)) else {
                continue;
            };
            if let Err(e) = ch.ring_doorbell(&mut self.waiter) {
                ch.unstage_all();
                if Some(p) == peer {
                    refused = Some(e.clone());
                }
                self.first_error.get_or_insert_with(|| e.clone());
                if !matches!(outcome, Some(Err(_))) {
                    *outcome = Some(Err(e));
                }
            }
        }
        refused
    }

    /// Waits for this scope's work on `peer`'s `queue` and records its outcomes: the
    /// peer's last receive completion, or its first error (also the scope's, if first).
    fn settle(&mut self, peer: usize, queue: Queue) {
        let Some(from) = *self.from.at(queue, peer) else {
            return;
        };
        let (Some(Some(ch)), Some(outcome)) =
            (self.mc.peers.get_mut(peer), self.mc.outcomes.get_mut(peer))
        else {
            return;
        };
        // Anything still staged was refused by the device: give its slots back.
        ch.unstage_all();
        let outcome = outcome.get_or_insert(Ok(None));
        let first_error = &mut self.first_error;
        let to = ch.settle_scope(queue, from, Some(&mut self.waiter), |r| {
            match (r, &mut *outcome) {
                (Ok(c), Ok(got)) if queue == Queue::Recv => *got = Some(c),
                (Ok(_), _) | (Err(_), Err(_)) => {}
                (Err(e), o @ Ok(_)) => {
                    first_error.get_or_insert_with(|| e.clone());
                    *o = Err(e);
                }
            }
        });
        *self.from.at(queue, peer) = Some(to);
    }

    /// Waits for everything posted, peer by peer; returns the first error.
    fn settle_all(&mut self) -> Option<Error<P::Error>> {
        for p in 0..PEERS {
            self.settle(p, Queue::Send);
            self.settle(p, Queue::Recv);
        }
        self.first_error.take()
    }

    /// Rings every doorbell, then waits for everything; returns the first error.
    fn finish(&mut self) -> Option<Error<P::Error>> {
        self.flush(None);
        self.settle_all()
    }
}

/// Per peer and queue, the first of a scope's requests not yet settled; `None` until the
/// scope stages something there.
struct Marks<const PEERS: usize> {
    send: [Option<u64>; PEERS],
    recv: [Option<u64>; PEERS],
}

impl<const PEERS: usize> Marks<PEERS> {
    const fn new() -> Self {
        Marks {
            send: [None; PEERS],
            recv: [None; PEERS],
        }
    }

    fn at(&mut self, queue: Queue, peer: usize) -> &mut Option<u64> {
        match queue {
            Queue::Send => &mut self.send[peer],
            Queue::Recv => &mut self.recv[peer],
        }
    }

    /// Whether the scope staged anything for `peer`.
    fn touched(&self, peer: usize) -> bool {
        self.send[peer].is_some() || self.recv[peer].is_some()
    }
}

impl<'env, P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    MultiScope<'env, P, PEERS, DEPTH, SGES>
{
    /// Posts a receive into `data` from `peer`.
    pub fn post_receive(
        &mut self,
        peer: usize,
        data: impl IntoIterator<Item = LocalSliceMut<'env>>,
    ) -> Result<u64, Error<P::Error>> {
        let ch = self.mc.peer(peer)?;
        let wr = ch.recv_wr(data.into_iter().map(|s| s.sge()))?;
        if ch.is_full(Queue::Recv) {
            self.make_room(peer, Queue::Recv)?;
        }
        let seq = self.mc.peer(peer)?.stage_recv(wr)?;
        self.from.at(Queue::Recv, peer).get_or_insert(seq);
        Ok(seq)
    }
}

impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize> Drop
    for MultiScope<'_, P, PEERS, DEPTH, SGES, T>
{
    fn drop(&mut self) {
        // Unwinding out of the closure (a scope that finished is forgotten, not dropped):
        // posted work may still use the borrowed buffers. What is staged is not posted any
        // more (settling gives its slots back).
        self.settle_all();
    }
}
