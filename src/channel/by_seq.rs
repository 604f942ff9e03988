//! Crate-internal posting by sequence number, for the layers built on [`Channel`]
//! (`MultiChannel`, `Node`). They post on many channels first and wait afterwards, so they
//! need the post/wait halves of the blocking calls separately. Each caller keeps the
//! memory named by what it posts borrowed until the matching wait returned.

use super::wait::Waiter;
use super::{Channel, Queue};
use crate::error::Error;
use crate::mr::RemoteRegion;
use crate::provider::Provider;
use crate::ring::Completion;
use crate::types::{RecvWr, SendFlags, SendOp, Sge};

impl<P: Provider, const DEPTH: usize, const SGES: usize> Channel<P, DEPTH, SGES> {
    /// Posts one signaled send work request; returns its sequence number. For RDMA and
    /// atomic operations, `remote` is checked to hold the gathered bytes first.
    ///
    /// The caller must keep the memory named by `sges` borrowed (shared for sends and
    /// writes, exclusive for reads and atomics) until [`wait_posted`](Self::wait_posted)
    /// returned for the sequence number.
    #[inline(always)]
    pub(crate) fn post_send_seq(
        &mut self,
        sges: impl IntoIterator<Item = Sge>,
        op: SendOp,
        flags: SendFlags,
        remote: Option<&RemoteRegion>,
    ) -> Result<u64, Error<P::Error>> {
        let (num_sge, len) = self.sges_in_place(sges)?;
        if let Some(remote) = remote {
            fits(remote, len)?;
        }
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
        send: bool,
        seq: u64,
        waiter: &mut Waiter,
    ) -> Result<Completion, Error<P::Error>> {
        self.wait_seq_within(queue(send), seq, waiter)
    }
}

fn queue(send: bool) -> Queue {
    if send {
        Queue::Send
    } else {
        Queue::Recv
    }
}

/// Whether `remote` holds `len` bytes from its start. The error (as
/// [`RemoteRegion::slice`] reports it) is built out of line, so the check inlines small.
#[inline]
pub(crate) fn fits<E>(remote: &RemoteRegion, len: u64) -> Result<(), Error<E>> {
    // A peer's region whose end wraps past the top of the address space holds nothing
    // there: refused before posting, as `RemoteRegion::slice` refuses it.
    if len <= remote.len && remote.addr.checked_add(len).is_some() {
        return Ok(());
    }
    too_short(remote, len)
}

#[cold]
#[inline(never)]
fn too_short<E>(remote: &RemoteRegion, len: u64) -> Result<(), Error<E>> {
    remote.slice(..len)?;
    Ok(())
}
