//! The connection manager (`librdmacm` over the kernel's `rdma_cm`): how programs on a RoCE
//! fabric find each other by IP address and agree on their queue pairs' attributes,
//! without a side channel of their own.
//!
//! Each device answers to the IPv4 address of its IPv4-mapped GID (device `i`:
//! `10.0.0.<i + 1>`), and every device is an interface of this host. An id
//! ([`CmId`], `rdma_cm_id`) is made on an event channel ([`CmChannel`],
//! `rdma_event_channel`, whose descriptor is readable while events are queued); it
//! resolves an address and a route, then connects with private data to a listener
//! (bound to an address and port), which gets a connect request bringing a new id, and
//! accepts or rejects it. The manager does not own the queue pairs: each side gives its
//! queue pair's number in the [`ConnParam`], learns the peer's in [`CmId::path`], and
//! moves its own queue pair (RC: the active side on the connect response, then
//! [`CmId::establish`]).
//!
//! What goes wrong, as the verbs stack says it: an address no device has,
//! [`CmEventKind::AddrError`]; a route over a port that is down, `RouteError`; nobody
//! listening, `Rejected` with status [`REJECT_NO_LISTENER`]; a reject, or a request whose
//! id is destroyed unanswered (with its listener, say), `Rejected` with
//! [`REJECT_CONSUMER`]; for a datagram service request, both are `Unreachable`, with
//! [`SIDR_NO_LISTENER`] and [`SIDR_REJECT`] (the service reply's statuses); a disconnect, or a peer's id destroyed, `Disconnected` on both
//! sides. Private data past each message's limit is refused at the call; what arrives is
//! padded with zeros to the message's whole field, as the verbs stack delivers it (a
//! connect request's 56 bytes, an accept's 196, a reject's 148). Every operation
//! queues its events at once, in call order; a peer that never answers raises nothing
//! (the caller's timeout bounds the wait).
//!
//! ```
//! use zverbs_sim::cm::{CmEventKind, ConnParam, PortSpace};
//! use zverbs_sim::Fabric;
//!
//! let f = Fabric::with_devices(2);
//! let (server_ch, client_ch) = (f.create_cm_channel().unwrap(), f.create_cm_channel().unwrap());
//! let listener = server_ch.create_id(PortSpace::Rc).unwrap();
//! listener.bind("10.0.0.2:7471".parse().unwrap()).unwrap();
//! listener.listen().unwrap();
//! let client = client_ch.create_id(PortSpace::Rc).unwrap();
//! client.resolve_addr(None, "10.0.0.2:7471".parse().unwrap()).unwrap();
//! assert_eq!(client_ch.get_event().unwrap().kind, CmEventKind::AddrResolved);
//! client.resolve_route().unwrap();
//! assert_eq!(client_ch.get_event().unwrap().kind, CmEventKind::RouteResolved);
//! client.connect(&ConnParam { qp_num: 17, ..ConnParam::default() }, b"hello").unwrap();
//! let req = server_ch.get_event().unwrap();
//! assert_eq!(req.kind, CmEventKind::ConnectRequest);
//! assert_eq!(&req.private_data.as_slice()[..5], b"hello"); // then zeros, to 56 bytes
//! let conn = req.request.unwrap();
//! assert_eq!(conn.path().unwrap().remote_qp_num, 17);
//! conn.reject(b"busy").unwrap();
//! let ev = client_ch.get_event().unwrap();
//! assert_eq!((ev.kind, ev.status), (CmEventKind::Rejected, zverbs_sim::cm::REJECT_CONSUMER));
//! ```

mod path;
mod tables;

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;

pub(crate) use path::Devices;
pub(crate) use tables::CmTables;
pub use tables::{STATUS_NO_ADDRESS, STATUS_PORT_DOWN};
pub use zverbs_types::cm::{
    private_data_limit, CmEventKind, CmPath, ConnParam, PortSpace, PrivateData, UdPeer,
    MAX_PRIVATE_DATA, REJECT_CONSUMER, REJECT_NO_LISTENER, SIDR_NO_LISTENER, SIDR_REJECT, UD_QKEY,
};

use crate::api::{enter, Fabric, Shared};
use crate::types::SimError;
#[cfg(loom)]
use loom::sync::Arc;
#[cfg(not(loom))]
use std::sync::Arc;

/// An event channel (`rdma_event_channel`): its descriptor ([`AsFd`]) is readable while
/// events are queued. Dropping it refuses the connect requests still queued on it.
#[derive(Debug)]
pub struct CmChannel {
    world: Shared,
    ch: usize,
    rx: UnixStream,
}

/// A connection manager id (`rdma_cm_id`). Dropping it destroys it: a connection it holds
/// ends (the peer gets `Disconnected`), a request it has not answered is refused, and a
/// listener's requests not yet taken from its channel are refused with it.
#[derive(Debug)]
pub struct CmId {
    world: Shared,
    id: usize,
    key: u64,
}

/// What happened (`rdma_cm_event`).
#[derive(Debug)]
pub struct CmEvent {
    /// What.
    pub kind: CmEventKind,
    /// The [key](CmId::key) of the id it happened to (a connect request's: the new id's).
    pub id: u64,
    /// A connect request's listener's key.
    pub listen_id: Option<u64>,
    /// The reject reason of `Rejected`; a negative errno for the errors; else 0.
    pub status: i32,
    /// What the peer's connect, accept or reject carried.
    pub private_data: PrivateData,
    /// A connect request's new id, to accept or reject.
    pub request: Option<CmId>,
    /// A datagram service's answer (`Established` of a datagram id): the peer.
    pub ud: Option<UdPeer>,
}

impl Fabric {
    /// Creates an event channel (`rdma_create_event_channel`).
    ///
    /// # Errors
    /// [`SimError::Invalid`] when the host cannot make a socket pair.
    pub fn create_cm_channel(&self) -> Result<CmChannel, SimError> {
        let (ch, rx) = enter(&self.world).cm.create_channel()?;
        Ok(CmChannel {
            world: self.world.clone(),
            ch,
            rx,
        })
    }
}

impl CmChannel {
    /// Creates an id whose events come to this channel (`rdma_create_id`).
    ///
    /// # Errors
    /// None today; the `Result` mirrors `rdma_create_id`.
    pub fn create_id(&self, ps: PortSpace) -> Result<CmId, SimError> {
        let (id, key) = enter(&self.world).cm.create_id(self.ch, ps);
        Ok(CmId {
            world: self.world.clone(),
            id,
            key,
        })
    }

    /// Takes the oldest event without blocking (`rdma_get_cm_event` on a non-blocking
    /// descriptor).
    pub fn get_event(&self) -> Option<CmEvent> {
        let mut w = enter(&self.world);
        let q = w.cm.take_event(self.ch)?;
        let ud = match q.kind {
            CmEventKind::Established => {
                let (devs, cm) = w.cm_parts();
                cm.ud_peer(&devs, q.id)
            }
            _ => None,
        };
        let key = |i: usize| w.cm.ids[i].as_ref().map_or(0, |s| s.key);
        let request = (q.kind == CmEventKind::ConnectRequest).then(|| CmId {
            world: self.world.clone(),
            id: q.id,
            key: key(q.id),
        });
        Some(CmEvent {
            kind: q.kind,
            id: key(q.id),
            listen_id: q.listen_id.map(key),
            status: q.status,
            private_data: q.private_data,
            request,
            ud,
        })
    }

    /// Events queued.
    pub fn pending(&self) -> usize {
        enter(&self.world).cm.pending(self.ch)
    }
}

impl AsFd for CmChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

impl AsRawFd for CmChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }
}

impl Drop for CmChannel {
    fn drop(&mut self) {
        enter(&self.world).cm.close_channel(self.ch);
    }
}

impl CmId {
    /// What events name this id by.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Binds the id to `addr` (`rdma_bind_addr`): an unspecified address binds every
    /// device; port 0 picks a free one. The address bound, with its port.
    ///
    /// # Errors
    /// [`SimError::NotFound`] for an address no device has; [`SimError::Busy`] for a port
    /// taken on it; [`SimError::Invalid`] for an id bound already.
    pub fn bind(&self, addr: SocketAddr) -> Result<SocketAddr, SimError> {
        let mut w = enter(&self.world);
        let (devs, cm) = w.cm_parts();
        cm.bind(&devs, self.id, addr)
    }

    /// Listens for connect requests (`rdma_listen`) on the bound address.
    ///
    /// # Errors
    /// [`SimError::Invalid`] for an id not bound.
    pub fn listen(&self) -> Result<(), SimError> {
        enter(&self.world).cm.listen(self.id)
    }

    /// Resolves `dst` to a local device (`rdma_resolve_addr`), from `src`'s device if
    /// given: `AddrResolved`, or `AddrError` when no device has `dst`.
    ///
    /// # Errors
    /// [`SimError::NotFound`] for a `src` no device has; [`SimError::Invalid`] for an id in
    /// use.
    pub fn resolve_addr(&self, src: Option<IpAddr>, dst: SocketAddr) -> Result<(), SimError> {
        let mut w = enter(&self.world);
        let (devs, cm) = w.cm_parts();
        cm.resolve_addr(&devs, self.id, src, dst)
    }

    /// Resolves the path (`rdma_resolve_route`): `RouteResolved`, or `RouteError` when a
    /// port on it is down.
    ///
    /// # Errors
    /// [`SimError::Invalid`] before the address resolved.
    pub fn resolve_route(&self) -> Result<(), SimError> {
        let mut w = enter(&self.world);
        let (devs, cm) = w.cm_parts();
        cm.resolve_route(&devs, self.id)
    }

    /// Moves this id's events, queued and to come, to `ch` (`rdma_migrate_id`).
    ///
    /// # Errors
    /// [`SimError::NotFound`] for a channel of another fabric.
    pub fn migrate(&self, ch: &CmChannel) -> Result<(), SimError> {
        if !Arc::ptr_eq(&self.world, &ch.world) {
            return Err(SimError::NotFound);
        }
        enter(&self.world).cm.migrate(self.id, ch.ch)
    }

    /// The local device's index (bound or resolved).
    pub fn device_index(&self) -> Option<usize> {
        enter(&self.world).cm.id(self.id).dev
    }

    /// The local address, once bound or resolved.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        enter(&self.world).cm.id(self.id).local
    }

    /// Connects (`rdma_connect`; UD: a service request) with `param` and `data`.
    ///
    /// # Errors
    /// [`SimError::Invalid`] before the route resolved, or for `data` past the limit
    /// ([`private_data_limit::CONNECT`], UD: `UD_CONNECT`).
    pub fn connect(&self, param: &ConnParam, data: &[u8]) -> Result<(), SimError> {
        let mut w = enter(&self.world);
        let (devs, cm) = w.cm_parts();
        cm.connect(&devs, self.id, param, data)
    }

    /// Accepts the request this id came with (`rdma_accept`).
    ///
    /// # Errors
    /// [`SimError::Invalid`] with no request to answer, or for `data` past the limit;
    /// [`SimError::NotFound`] when the active side gave up.
    pub fn accept(&self, param: &ConnParam, data: &[u8]) -> Result<(), SimError> {
        enter(&self.world).cm.accept(self.id, param, data)
    }

    /// Refuses the request this id came with (`rdma_reject`): `Rejected` with
    /// [`REJECT_CONSUMER`] and `data` at the active side (a datagram service request:
    /// `Unreachable` with [`SIDR_REJECT`], `data` at most a service reply's 136 bytes).
    ///
    /// # Errors
    /// [`SimError::Invalid`] with no request to answer, or for `data` past the limit.
    pub fn reject(&self, data: &[u8]) -> Result<(), SimError> {
        enter(&self.world).cm.reject(self.id, data)
    }

    /// After the connect response, with the queue pair at RTS (`rdma_establish`): the
    /// passive side gets `Established`.
    ///
    /// # Errors
    /// [`SimError::Invalid`] without an accepted connect.
    pub fn establish(&self) -> Result<(), SimError> {
        enter(&self.world).cm.establish(self.id)
    }

    /// Ends the connection (`rdma_disconnect`): `Disconnected` on both sides.
    ///
    /// # Errors
    /// [`SimError::Invalid`] when not connected.
    pub fn disconnect(&self) -> Result<(), SimError> {
        enter(&self.world).cm.disconnect(self.id)
    }

    /// The queue pair attributes of the connection (`rdma_init_qp_attr`), once the peer's
    /// connect or accept is known.
    ///
    /// # Errors
    /// [`SimError::Invalid`] before that.
    pub fn path(&self) -> Result<CmPath, SimError> {
        let mut w = enter(&self.world);
        let (devs, cm) = w.cm_parts();
        cm.path(&devs, self.id)
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        enter(&self.world).cm.destroy_id(self.id);
    }
}
