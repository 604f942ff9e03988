//! Connection management next to the provider seam: the RDMA connection manager
//! (`librdmacm` on verbs, the simulator's own manager on the simulator) as one small
//! trait.
//!
//! An id is made on an event channel whose descriptor is readable while events are
//! queued; it resolves an IP address to a local device and a route, connects to a
//! listener with private data, or listens and accepts or rejects what comes. The manager
//! never owns a queue pair: each side names its own in the [`ConnParam`], reads the
//! attributes the manager decided ([`CmPath`], `rdma_init_qp_attr`) and makes the
//! transitions on its own [`QueuePair`](crate::qp::QueuePair), so nothing bypasses the
//! state machine.

use std::net::{IpAddr, SocketAddr};

pub use zverbs_types::cm::{
    private_data_limit, CmEventKind, CmPath, ConnParam, PortSpace, PrivateData, UdPeer,
    MAX_PRIVATE_DATA, REJECT_CONSUMER, REJECT_NO_LISTENER, SIDR_NO_LISTENER, SIDR_REJECT, UD_QKEY,
};

use super::Provider;

/// An event taken from a channel, copied out (and, on verbs, acknowledged).
#[derive(Debug)]
pub struct CmEvent<P: ConnectionManager> {
    /// What happened.
    pub kind: CmEventKind,
    /// The [key](ConnectionManager::cm_id_key) of the id it happened to (a connect
    /// request's: the new id's).
    pub id: u64,
    /// The reject reason of `Rejected`; a negative errno for the errors; else 0.
    pub status: i32,
    /// What the peer's connect, accept or reject carried.
    pub private_data: PrivateData,
    /// A connect request's new id, the caller's to accept or reject (dropping it refuses).
    pub request: Option<P::CmId>,
    /// A datagram service's answer (`Established` of a datagram id): the peer.
    pub ud: Option<UdPeer>,
}

/// The connection manager of a provider. See the module docs.
pub trait ConnectionManager: Provider + Clone + Send + Sync {
    /// An event channel (`rdma_event_channel`).
    type CmChannel: Send + Sync;
    /// An id (`rdma_cm_id`); dropping it destroys it (a connection it holds ends).
    type CmId: Send + Sync;

    /// Creates an event channel whose descriptor is in non-blocking mode.
    fn create_cm_channel(&self) -> Result<Self::CmChannel, Self::Error>;
    /// The channel's descriptor: readable while events are queued.
    fn cm_channel_fd(ch: &Self::CmChannel) -> std::os::fd::RawFd;
    /// Takes the oldest event without blocking, or `None`.
    fn get_cm_event(ch: &Self::CmChannel) -> Result<Option<CmEvent<Self>>, Self::Error>;

    /// Creates an id of `ps` on `ch`.
    fn create_cm_id(ch: &Self::CmChannel, ps: PortSpace) -> Result<Self::CmId, Self::Error>;
    /// What events name `id` by.
    fn cm_id_key(id: &Self::CmId) -> u64;
    /// Moves `id`'s events to `ch` (`rdma_migrate_id`).
    fn cm_migrate(id: &Self::CmId, ch: &Self::CmChannel) -> Result<(), Self::Error>;
    /// Whether `id`'s device (bound or resolved) is `ctx`'s.
    fn cm_on_device(id: &Self::CmId, ctx: &Self::Context) -> bool;

    /// Binds `id` to `addr` (port 0: a free one); the address bound.
    fn cm_bind(id: &Self::CmId, addr: SocketAddr) -> Result<SocketAddr, Self::Error>;
    /// Listens on the bound address.
    fn cm_listen(id: &Self::CmId, backlog: u32) -> Result<(), Self::Error>;
    /// Resolves `dst` (from `src`'s device if given): `AddrResolved` or `AddrError`.
    fn cm_resolve_addr(
        id: &Self::CmId,
        src: Option<IpAddr>,
        dst: SocketAddr,
        timeout_ms: u32,
    ) -> Result<(), Self::Error>;
    /// Resolves the route: `RouteResolved` or `RouteError`.
    fn cm_resolve_route(id: &Self::CmId, timeout_ms: u32) -> Result<(), Self::Error>;

    /// Connects with `param` and `data` (at most [`private_data_limit::CONNECT`], UD:
    /// `UD_CONNECT`).
    fn cm_connect(id: &Self::CmId, param: &ConnParam, data: &[u8]) -> Result<(), Self::Error>;
    /// Accepts `id`'s request.
    fn cm_accept(id: &Self::CmId, param: &ConnParam, data: &[u8]) -> Result<(), Self::Error>;
    /// Refuses `id`'s request with `data`.
    fn cm_reject(id: &Self::CmId, data: &[u8]) -> Result<(), Self::Error>;
    /// After the connect response, the queue pair at RTS (`rdma_establish`).
    fn cm_establish(id: &Self::CmId) -> Result<(), Self::Error>;
    /// Ends the connection.
    fn cm_disconnect(id: &Self::CmId) -> Result<(), Self::Error>;
    /// The queue pair attributes the manager decided, once the peer's connect or accept
    /// is known.
    fn cm_path(id: &Self::CmId) -> Result<CmPath, Self::Error>;
}
