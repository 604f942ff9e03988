//! Crate-internal posting by sequence number, for the layers built on [`Channel`]
//! (`MultiChannel`, `Node`). They post on many channels first and wait afterwards, so they
//! need the post/wait halves of the blocking calls separately. Each caller keeps the
//! memory named by what it posts borrowed until the matching wait returned.

use super::op::{Local, Op};
use super::wait::Waiter;
use super::{Channel, Queue};
use crate::error::Error;
use crate::mr::RemoteRegion;
use crate::provider::Provider;
use crate::ring::Completion;
use crate::types::{RecvWr, SendFlags, SendOp, Sge};

impl<P: Provider, const DEPTH: usize, const SGES: usize> Channel<P, DEPTH, SGES> {
    /// Posts `op` signaled; returns its sequence number. The caller keeps `op`'s borrow of
    /// its memory until [`wait_posted_within`](Self::wait_posted_within) returned for the
    /// sequence number.
    #[inline(always)]
    pub(crate) fn post_send_seq<L: Iterator<Item: Local>>(
        &mut self,
        op: Op<'_, L>,
    ) -> Result<u64, Error<P::Error>> {
        let Op {
            local,
            op,
            flags,
            room,
            remote,
            atomic,
            ..
        } = op;
        let (num_sge, len) = self.sges_in_place(local.map(|l| l.entry()))?;
        self.admit(room, remote, atomic, len)?;
        self.post_staged_wr(num_sge, op, flags)
    }

    /// Posts one signaled send work request of raw entries, checked as an [`Op`] is
    /// ([`admit`](Self::admit)); returns its sequence number.
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
        let (num_sge, len) = self.sges_in_place(sges)?;
        self.admit(super::op::room(remote), remote, atomic, len)?;
        self.post_staged_wr(num_sge, op, flags)
    }

    /// Posts [`wr`](Channel::wr), whose first `num_sge` entries were gathered, signaled.
    #[inline(always)]
    fn post_staged_wr(
        &mut self,
        num_sge: u8,
        op: SendOp,
        flags: SendFlags,
    ) -> Result<u64, Error<P::Error>> {
        self.wr.num_sge = num_sge;
        self.wr.op = op;
        self.wr.flags = flags | SendFlags::SIGNALED;
        self.post_send_now()
    }

    /// Posts one receive work request; returns its sequence number. Same borrowing rule as
    /// [`post_send_seq`](Self::post_send_seq), exclusive.
    pub(crate) fn post_recv_seq(
        &mut self,
        sges: impl IntoIterator<Item = Sge>,
    ) -> Result<u64, Error<P::Error>> {
        let (sg_list, num_sge, _) = self.sges(sges)?;
        self.post_recv_now(RecvWr {
            wr_id: 0,
            sg_list,
            num_sge,
        })
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

impl<P: Provider, const DEPTH: usize, const SGES: usize> Channel<P, DEPTH, SGES> {
    /// The checks every level makes before posting a send whose local entries hold `len`
    /// bytes: an atomic's result is 8 bytes and the device does atomics; a remote region
    /// holds the bytes from its start.
    #[inline(always)]
    pub(crate) fn admit(
        &self,
        room: u64,
        remote: Option<RemoteRegion>,
        atomic: bool,
        len: u64,
    ) -> Result<(), Error<P::Error>> {
        if atomic {
            if len != 8 {
                return Err(Error::InvalidAttribute(
                    "an atomic's result slice must be 8 bytes",
                ));
            }
            self.qp.check_atomics()?;
        }
        if len <= room {
            return Ok(());
        }
        match remote {
            Some(remote) => too_short(&remote, len),
            None => Ok(()),
        }
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
