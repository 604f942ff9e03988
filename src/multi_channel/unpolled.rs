//! The unpolled level of a [`MultiChannel`]: work posted peer by peer, redeemed with
//! [`wait`](MultiChannel::wait).

use super::{MultiChannel, PeerTransport};
use crate::channel::Pending;
use crate::error::Error;
use crate::provider::Provider;
use crate::ring::Completion;
use crate::types::{SendFlags, SendOp, Sge};

/// Work posted by an unpolled call of a [`MultiChannel`]: the peer and its [`Pending`].
#[must_use = "unpolled work must be waited for; its slot stays busy until then"]
#[derive(Debug)]
pub struct PeerPending {
    /// The peer it was posted to.
    pub peer: usize,
    /// The handle on that peer's channel.
    pub pending: Pending,
}

impl<P: Provider, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    MultiChannel<P, PEERS, DEPTH, SGES>
{
    /// Posts one receive work request to `peer` and returns without waiting.
    ///
    /// # Safety
    /// As [`Channel::post_receive_unpolled`](crate::Channel::post_receive_unpolled): the memory named by `sges` must stay valid
    /// and untouched until the handle has been waited for.
    pub unsafe fn post_receive_unpolled(
        &mut self,
        peer: usize,
        sges: &[Sge],
    ) -> Result<PeerPending, Error<P::Error>> {
        let ch = self.peer(peer)?;
        // SAFETY: the caller upholds the contract, which is the channel's.
        let pending = unsafe { ch.post_receive_unpolled(sges)? };
        Ok(PeerPending { peer, pending })
    }
}

impl<P: Provider, T: PeerTransport, const PEERS: usize, const DEPTH: usize, const SGES: usize>
    MultiChannel<P, PEERS, DEPTH, SGES, T>
{
    /// Posts one send work request to `peer` and returns without waiting.
    ///
    /// # Safety
    /// As [`Channel::post_send_unpolled`](crate::Channel::post_send_unpolled): the memory named by `sges` must stay valid and
    /// unwritten (for reads and atomics: untouched) until the handle has been waited for.
    pub unsafe fn post_send_unpolled(
        &mut self,
        peer: usize,
        sges: &[Sge],
        op: SendOp,
        flags: SendFlags,
    ) -> Result<PeerPending, Error<P::Error>> {
        let ch = self.peer(peer)?;
        // SAFETY: the caller upholds the contract, which is the channel's.
        let pending = unsafe { ch.post_send_unpolled(sges, op, flags)? };
        Ok(PeerPending { peer, pending })
    }

    /// Waits for unpolled work to complete.
    pub fn wait(&mut self, pending: PeerPending) -> Result<Completion, Error<P::Error>> {
        self.peer(pending.peer)?.wait(pending.pending)
    }
}
