//! Scoped posting across peers: post any mix, everything completes before the scope ends.

use core::marker::PhantomData;

use super::{MultiChannel, Posted};
use crate::channel::collect_sges;
use crate::channel::wait::Waiter;
use crate::error::Error;
use crate::mr::{LocalSlice, LocalSliceMut, RemoteRegion};
use crate::provider::Provider;
use crate::types::{SendFlags, SendOp, Sge};

/// Posts work to many peers inside [`MultiChannel::scope`]. Every buffer handed to it
/// stays borrowed for `'env`, which outlives the scope, so buffers cannot be touched or
/// freed before all posted work has completed. Each post goes out at once (one doorbell
/// per call); when a peer's ring is full the scope first waits for its own work there.
pub struct MultiScope<'env, P: Provider, const N: usize, const R: usize, const S: usize> {
    mc: &'env mut MultiChannel<P, N, R, S>,
    posted: Posted<N>,
    first_error: Option<Error<P::Error>>,
    finished: bool,
    /// One bound for every wait of the scope.
    waiter: Waiter,
    // Invariant in 'env: a scope cannot be shrunk to accept shorter borrows.
    _env: PhantomData<&'env mut &'env ()>,
}

impl<P: Provider, const N: usize, const R: usize, const S: usize> MultiChannel<P, N, R, S> {
    /// Runs `f` with a [`MultiScope`]; returns once every work request posted in it has
    /// completed (also if `f` panics), its waits together within one timeout plus the
    /// grace. The first error wins: `f`'s own, then the first post or completion error;
    /// every peer's outcome, successes included, is then readable with
    /// [`outcome`](MultiChannel::outcome).
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
    /// ```
    pub fn scope<'env, T>(
        &'env mut self,
        f: impl FnOnce(&mut MultiScope<'env, P, N, R, S>) -> Result<T, Error<P::Error>>,
    ) -> Result<T, Error<P::Error>> {
        self.outcomes.iter_mut().for_each(|o| *o = None);
        let waiter = self.waiter();
        let mut scope = MultiScope {
            waiter,
            mc: self,
            posted: Posted::new(),
            first_error: None,
            finished: false,
            _env: PhantomData,
        };
        let value = f(&mut scope);
        let pending_error = scope.finish();
        let value = value?;
        match pending_error {
            Some(e) => Err(e),
            None => Ok(value),
        }
    }
}

impl<'env, P: Provider, const N: usize, const R: usize, const S: usize>
    MultiScope<'env, P, N, R, S>
{
    /// Posts a send of the concatenation of `data` to `peer`. Returns its `wr_id`.
    pub fn post_send(
        &mut self,
        peer: usize,
        data: impl IntoIterator<Item = LocalSlice<'env>>,
    ) -> Result<u64, Error<P::Error>> {
        self.post(
            peer,
            true,
            data.into_iter().map(|s| s.sge()),
            SendOp::Send,
            None,
        )
    }

    /// Posts a send with immediate data to `peer`.
    pub fn post_send_with_imm(
        &mut self,
        peer: usize,
        data: impl IntoIterator<Item = LocalSlice<'env>>,
        imm: u32,
    ) -> Result<u64, Error<P::Error>> {
        let op = SendOp::SendWithImm(imm);
        self.post(peer, true, data.into_iter().map(|s| s.sge()), op, None)
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
        let op = SendOp::Write {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        self.post(
            peer,
            true,
            data.into_iter().map(|s| s.sge()),
            op,
            Some(remote),
        )
    }

    /// Posts an RDMA read from the start of `remote` at `peer` into `data`.
    pub fn post_read(
        &mut self,
        peer: usize,
        data: impl IntoIterator<Item = LocalSliceMut<'env>>,
        remote: &RemoteRegion,
    ) -> Result<u64, Error<P::Error>> {
        let op = SendOp::Read {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        self.post(
            peer,
            true,
            data.into_iter().map(|s| s.sge()),
            op,
            Some(remote),
        )
    }

    /// Posts a receive into `data` from `peer`.
    pub fn post_receive(
        &mut self,
        peer: usize,
        data: impl IntoIterator<Item = LocalSliceMut<'env>>,
    ) -> Result<u64, Error<P::Error>> {
        self.post(
            peer,
            false,
            data.into_iter().map(|s| s.sge()),
            SendOp::Send,
            None,
        )
    }

    fn post(
        &mut self,
        peer: usize,
        send: bool,
        sges: impl IntoIterator<Item = Sge>,
        op: SendOp,
        remote: Option<&RemoteRegion>,
    ) -> Result<u64, Error<P::Error>> {
        let (list, n) =
            collect_sges::<S>(sges).map_err(|(given, max)| Error::TooManySges { given, max })?;
        let sges = &list[..usize::from(n)];
        let mut room_made = false;
        loop {
            let ch = self.mc.peer(peer)?;
            let r = if send {
                ch.post_send_seq(sges.iter().copied(), op, SendFlags::empty(), remote)
            } else {
                ch.post_recv_seq(sges.iter().copied())
            };
            match r {
                Ok(seq) => {
                    self.posted.record(peer, send, seq);
                    return Ok(seq);
                }
                Err(Error::QueueFull { .. }) if !room_made => {
                    // Wait for this scope's work on that peer, then try once more.
                    let mut just_peer = Posted::new();
                    core::mem::swap(&mut just_peer.send[peer], &mut self.posted.send[peer]);
                    core::mem::swap(&mut just_peer.recv[peer], &mut self.posted.recv[peer]);
                    if let Some(e) = self.mc.wait_all(&just_peer, &mut self.waiter) {
                        self.first_error.get_or_insert(e.error);
                    }
                    room_made = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn finish(&mut self) -> Option<Error<P::Error>> {
        let posted = core::mem::replace(&mut self.posted, Posted::new());
        if let Some(e) = self.mc.wait_all(&posted, &mut self.waiter) {
            self.first_error.get_or_insert(e.error);
        }
        self.finished = true;
        self.first_error.take()
    }
}

impl<P: Provider, const N: usize, const R: usize, const S: usize> Drop
    for MultiScope<'_, P, N, R, S>
{
    fn drop(&mut self) {
        // Unwinding out of the closure: posted work may still use the borrowed buffers.
        if !self.finished {
            self.finish();
        }
    }
}
