//! Datagram peers through the connection manager, as rdma-core's `udaddy` finds them: a
//! service request to an address and port, answered with the listener's queue pair
//! number and Q_Key, and the address handle attributes of the path to it. There is no
//! connection to keep: the ids end with the calls.
//!
//! Over IP (`RDMA_PS_UDP`) the manager gives every datagram service one Q_Key,
//! [`UD_QKEY`]: the queue pairs on both sides use it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::wait::{next_event, Deadline};
use super::{fits, resolved, Answer, CmError, CmListener};
use crate::device::Context;
use crate::provider::cm::{
    private_data_limit, CmEventKind, ConnParam, ConnectionManager, PortSpace, PrivateData, UdPeer,
    UD_QKEY,
};

/// A datagram peer the manager resolved: where to send ([`UdPeer`]) and what its answer
/// carried (padded with zeros to 136 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmDatagramPeer {
    /// Its queue pair, Q_Key and the address handle attributes of the path to it.
    pub peer: UdPeer,
    /// Its answer's private data.
    pub reply: PrivateData,
}

/// Asks the datagram service at `dst` for its queue pair (`udaddy`'s client), from `ctx`
/// (from `src`'s address when given), with `data` (at most
/// [`private_data_limit::UD_CONNECT`] bytes), by `timeout`.
///
/// # Errors
/// As [`CmConnection::connect`](super::CmConnection::connect).
pub fn resolve_datagram<P: ConnectionManager>(
    provider: &P,
    ctx: &Context<P>,
    src: Option<IpAddr>,
    dst: SocketAddr,
    data: &[u8],
    timeout: Duration,
) -> Result<CmDatagramPeer, CmError<P::Error>> {
    let deadline = Deadline::after(timeout);
    fits(data, private_data_limit::UD_CONNECT)?;
    let link = resolved(provider, PortSpace::Ud, ctx, src, dst, deadline)?;
    let (id, events) = (&link.id, &link.events);
    P::cm_connect(id, &ConnParam::default(), data).map_err(CmError::Verbs)?;
    let ev = next_event::<P>(events, deadline).map_err(|e| match e {
        CmError::Timeout { .. } => CmError::Timeout {
            waiting_for: CmEventKind::Established,
        },
        e => e,
    })?;
    match (ev.kind, ev.ud) {
        (CmEventKind::Established, Some(peer)) => Ok(CmDatagramPeer {
            peer,
            reply: ev.private_data,
        }),
        (CmEventKind::Rejected, _) => Err(CmError::Rejected {
            status: ev.status,
            private_data: ev.private_data.as_slice().to_vec(),
        }),
        (CmEventKind::Unreachable, _) => Err(CmError::Unreachable { status: ev.status }),
        (kind, _) => Err(CmError::Unexpected {
            kind,
            status: ev.status,
        }),
    }
}

impl<P: ConnectionManager> CmListener<P> {
    /// A listener for datagram service requests ([`resolve_datagram`]) on `addr`.
    ///
    /// # Errors
    /// As [`bind`](Self::bind).
    pub fn bind_datagram(provider: &P, addr: SocketAddr) -> Result<Self, CmError<P::Error>> {
        Self::bind_as(provider, addr, PortSpace::Ud)
    }

    /// Answers the next service request with `qp_num` (a datagram queue pair on
    /// [`UD_QKEY`]) and `reply` (at most [`private_data_limit::UD_ACCEPT`] bytes), by
    /// `timeout`; the request's private data. The requester learns this side's queue
    /// pair and path; this side learns the requester's queue pair from its first
    /// datagram's completion (`src_qp`).
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`]; [`CmError::Timeout`] when no request came; a
    /// verb's error.
    pub fn answer_datagram(
        &self,
        qp_num: u32,
        reply: &[u8],
        timeout: Duration,
    ) -> Result<PrivateData, CmError<P::Error>> {
        fits(reply, private_data_limit::UD_ACCEPT)?;
        self.answer_datagram_with(qp_num, timeout, |_| Answer::accept(reply))
    }

    /// As [`answer_datagram`](Self::answer_datagram), with `answer` deciding on each
    /// request (from its private data): the first accepted one ends the call; a rejected
    /// one is refused with the reason (the requester sees [`CmError::Unreachable`] with
    /// status [`SIDR_REJECT`](crate::provider::cm::SIDR_REJECT)).
    ///
    /// # Errors
    /// [`CmError::PrivateDataTooLong`] for a reply or a reason past
    /// [`private_data_limit::UD_ACCEPT`] (that request is refused); as
    /// [`answer_datagram`](Self::answer_datagram).
    pub fn answer_datagram_with(
        &self,
        qp_num: u32,
        timeout: Duration,
        mut answer: impl FnMut(&[u8]) -> Answer,
    ) -> Result<PrivateData, CmError<P::Error>> {
        // A service reply carries either.
        let limits = (private_data_limit::UD_ACCEPT, private_data_limit::UD_ACCEPT);
        let (request, reply, theirs) =
            self.next_accepted(Deadline::after(timeout), limits, &mut answer)?;
        let param = ConnParam {
            qp_num,
            qkey: UD_QKEY,
            ..ConnParam::default()
        };
        P::cm_accept(&request, &param, reply.as_slice()).map_err(CmError::Verbs)?;
        Ok(theirs)
    }
}
