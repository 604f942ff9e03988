//! Connection management (`librdmacm`): the values a connection manager and its users
//! exchange — the port space of an id, what a connect or accept carries, the events, and
//! the attributes the manager decides for the queue pair that a connection runs on.

use crate::port::{Gid, Mtu};
use crate::qp::AhAttr;

/// The most private data any CM message carries: an accept's (the CM's REP).
pub const MAX_PRIVATE_DATA: usize = 196;

/// The private data limits of librdmacm over IP (`rdma_connect(3)`, `rdma_accept(3)`,
/// `rdma_reject(3)`): the InfiniBand CM's message limits less the header librdmacm puts in
/// front of a connect's.
pub mod private_data_limit {
    /// A reliable connect request (`RDMA_PS_TCP`).
    pub const CONNECT: usize = 56;
    /// A reliable accept.
    pub const ACCEPT: usize = 196;
    /// A reject.
    pub const REJECT: usize = 148;
    /// A datagram service request (`RDMA_PS_UDP`).
    pub const UD_CONNECT: usize = 180;
    /// A datagram service reply.
    pub const UD_ACCEPT: usize = 136;
}

/// The reject reason a connect to a port nobody listens on gets (the InfiniBand CM's
/// `IB_CM_REJ_INVALID_SERVICE_ID`).
pub const REJECT_NO_LISTENER: i32 = 8;
/// The reject reason of a consumer's reject (`rdma_reject`), and of a request whose id is
/// destroyed unanswered (`IB_CM_REJ_CONSUMER_DEFINED`).
pub const REJECT_CONSUMER: i32 = 28;

/// The status of the `Unreachable` event a datagram service request gets when nobody
/// listens on its port (the service reply's `IB_SIDR_UNSUPPORTED`).
pub const SIDR_NO_LISTENER: i32 = 1;
/// The status of the `Unreachable` event a datagram service request gets when its service
/// rejects it (`rdma_reject`) or destroys its id unanswered (`IB_SIDR_REJECT`).
pub const SIDR_REJECT: i32 = 2;

/// The Q_Key of every datagram service over IP (`RDMA_PS_UDP`): the manager answers with it
/// whatever the acceptor asked (`RDMA_UDP_QKEY`).
pub const UD_QKEY: u32 = 0x0123_4567;

/// A datagram peer as a service reply describes it (`rdma_ud_param`): its queue pair,
/// its Q_Key and the address handle attributes of the path to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdPeer {
    /// Its queue pair.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// The path to it.
    pub ah: AhAttr,
}

/// What kind of queue pair an id connects (`rdma_port_space`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// Reliable connections (`RDMA_PS_TCP`).
    Rc,
    /// Unreliable datagrams (`RDMA_PS_UDP`).
    Ud,
}

/// Bytes carried by a CM message: up to [`MAX_PRIVATE_DATA`], inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    len: u8,
    bytes: [u8; MAX_PRIVATE_DATA],
}

impl PrivateData {
    /// None.
    pub const EMPTY: PrivateData = PrivateData {
        len: 0,
        bytes: [0; MAX_PRIVATE_DATA],
    };

    /// `data`, if it fits `limit` (one of [`private_data_limit`]); else `None`.
    pub fn new(data: &[u8], limit: usize) -> Option<PrivateData> {
        if data.len() > limit.min(MAX_PRIVATE_DATA) {
            return None;
        }
        let mut p = PrivateData::EMPTY;
        p.bytes[..data.len()].copy_from_slice(data);
        p.len = data.len() as u8;
        Some(p)
    }

    /// `data` followed by zeros to `size` bytes, as an event delivers it (the manager's
    /// messages carry their whole private data field: a receiver sees the limit's length,
    /// whatever the sender gave); `None` if `data` is longer than `size`.
    pub fn padded(data: &[u8], size: usize) -> Option<PrivateData> {
        let mut p = PrivateData::new(data, size)?;
        p.len = size.min(MAX_PRIVATE_DATA) as u8;
        Some(p)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl core::fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "PrivateData({:02x?})", self.as_slice())
    }
}

/// What a connect or an accept carries (`rdma_conn_param`) besides its private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// The queue pair this side connects with (the manager does not own it).
    pub qp_num: u32,
    /// Outstanding RDMA reads and atomics this side accepts as responder.
    pub responder_resources: u8,
    /// Outstanding RDMA reads and atomics this side issues as requester.
    pub initiator_depth: u8,
    /// Transport retries (0–7).
    pub retry_count: u8,
    /// RNR retries (0–7; 7: for ever).
    pub rnr_retry_count: u8,
    /// The Q_Key of a datagram queue pair.
    pub qkey: u32,
}

impl Default for ConnParam {
    fn default() -> ConnParam {
        ConnParam {
            qp_num: 0,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            qkey: 0,
        }
    }
}

/// What happened to an id (`rdma_cm_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmEventKind {
    /// The destination address resolved to a local device and port.
    AddrResolved,
    /// It did not (no route to the address, or nobody has it).
    AddrError,
    /// The path to the destination resolved.
    RouteResolved,
    /// It did not.
    RouteError,
    /// A peer asks to connect (on a listener; the event brings the new id).
    ConnectRequest,
    /// The peer accepted (active side; move the queue pair to RTS, then establish).
    ConnectResponse,
    /// The connection could not be made.
    ConnectError,
    /// The peer did not answer.
    Unreachable,
    /// The peer (or its manager, nobody listening) refused; the status says why.
    Rejected,
    /// The connection is up (passive side; datagram ids on the active side).
    Established,
    /// The connection is down (either side disconnected).
    Disconnected,
    /// The device went away.
    DeviceRemoval,
}

/// The queue pair attributes the manager decided for a connection (what
/// `rdma_init_qp_attr` gives): the local port and source GID, this side's first packet
/// sequence number, and the peer's queue pair, sequence number, address and MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmPath {
    /// The local port.
    pub port: u8,
    /// The local GID's index.
    pub sgid_index: u8,
    /// The first packet sequence number this side sends.
    pub local_psn: u32,
    /// The peer's queue pair.
    pub remote_qp_num: u32,
    /// The first packet sequence number the peer sends.
    pub remote_psn: u32,
    /// The peer's LID (0 on RoCE).
    pub remote_lid: u16,
    /// The peer's GID.
    pub remote_gid: Gid,
    /// The path MTU.
    pub mtu: Mtu,
    /// The peer's Q_Key (datagrams).
    pub remote_qkey: u32,
    /// Outstanding RDMA reads and atomics the peer accepts as responder (this side's
    /// `max_rd_atomic` bound).
    pub responder_resources: u8,
    /// Outstanding RDMA reads and atomics the peer issues (this side's
    /// `max_dest_rd_atomic` need).
    pub initiator_depth: u8,
}
