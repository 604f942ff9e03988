//! The engine's vocabulary: its settings, errors, what a pass reports, what it counts.

use crate::error::{Error, ErrorKind};
use crate::pool::{DeviceBuf, LocalBuf, PoolError};
use crate::provider::Provider;
use crate::qp::QpConfig;
use crate::rpc::BulkConfig;
use crate::rpc::{Config, Event, RpcError};

/// Settings of an [`Rpc`](super::Rpc).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The protocol core's settings; its `mtu` is the largest datagram payload (header
    /// included), at most the port's active MTU ([`Rpc::new`](super::Rpc::new) refuses
    /// more with `Error::ExceedsDevice`).
    pub core: Config,
    /// The UD queue pair's port, GID index and first PSN (its capacities are set here).
    pub qp: QpConfig,
    /// The Q_Key of every `Rpc` that talks to this one.
    pub qkey: u32,
    /// Receives kept posted (1..=16,384): datagrams that can arrive between two passes.
    pub recv_slots: usize,
    /// Datagrams in flight on the send queue (1..=16,384).
    pub send_slots: usize,
    /// The completion queue raises events on a completion channel of its own, so that a
    /// thread or task can sleep until a datagram comes (`zverbs::tokio::AsyncRpc` does).
    pub events: bool,
    /// The zero-copy path for large messages over reliable connections (see
    /// [`Rpc::enqueue_bulk`](super::Rpc::enqueue_bulk)): a queue pair per session and a registered pool, made by
    /// [`Rpc::new`](super::Rpc::new). Off (`None`) by default.
    pub bulk: Option<BulkConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            core: Config::default(),
            qp: QpConfig::default(),
            qkey: 0x0205,
            recv_slots: 256,
            send_slots: 64,
            events: false,
            bulk: None,
        }
    }
}

/// Why an [`Rpc`](super::Rpc) call failed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum EngineError<E> {
    /// The device refused a verb.
    Device(Error<E>),
    /// The protocol core refused.
    Rpc(RpcError),
    /// Every peer entry is in use (at most `max_sessions` peers).
    TooManyPeers,
    /// A setting out of range.
    InvalidConfig(&'static str),
    /// No buffer for a large message ([`Rpc::alloc_msg`](super::Rpc::alloc_msg)).
    Pool(PoolError),
}

impl<E: crate::error::ProviderError> EngineError<E> {
    /// What the error means in the crate-wide classification.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::Device(e) => e.kind(),
            EngineError::Rpc(e) => e.kind(),
            EngineError::TooManyPeers => ErrorKind::OutOfResources,
            EngineError::InvalidConfig(_) => ErrorKind::InvalidArgument,
            EngineError::Pool(e) => e.kind(),
        }
    }
}

impl<E: core::fmt::Display> core::fmt::Display for EngineError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EngineError::Device(e) => e.fmt(f),
            EngineError::Rpc(e) => e.fmt(f),
            EngineError::TooManyPeers => f.write_str("every RPC peer entry is in use"),
            EngineError::InvalidConfig(why) => write!(f, "invalid RPC engine setting: {why}"),
            EngineError::Pool(e) => e.fmt(f),
        }
    }
}

impl<E: core::fmt::Debug + core::fmt::Display> core::error::Error for EngineError<E> {}

impl<E> From<Error<E>> for EngineError<E> {
    fn from(e: Error<E>) -> Self {
        EngineError::Device(e)
    }
}

impl<E> From<RpcError> for EngineError<E> {
    fn from(e: RpcError) -> Self {
        EngineError::Rpc(e)
    }
}

/// What a pass has for the caller (requests go to the handlers).
pub enum Notice<'a, P: Provider> {
    /// The response to the request enqueued with `tag`.
    Response {
        /// The caller's tag.
        tag: u64,
        /// The response's bytes, valid for the call.
        bytes: &'a [u8],
        /// A large request's buffer ([`Rpc::enqueue_bulk`](super::Rpc::enqueue_bulk),
        /// [`Rpc::enqueue_bulk_device`](super::Rpc::enqueue_bulk_device)), back to the
        /// caller.
        msg: Option<MsgBuf<P>>,
    },
    /// The request enqueued with `tag` failed (session timeout, session failed, a large
    /// message's transfer).
    Failed {
        /// The caller's tag.
        tag: u64,
        /// Why.
        error: RpcError,
        /// A large request's buffer ([`Rpc::enqueue_bulk`](super::Rpc::enqueue_bulk),
        /// [`Rpc::enqueue_bulk_device`](super::Rpc::enqueue_bulk_device)), back to the
        /// caller.
        msg: Option<MsgBuf<P>>,
    },
    /// A session event of the core: connected, refused, accepted, disconnected.
    Session(Event),
}

/// A large request's buffer, held by the engine while the server reads it and given back
/// in the request's [`Notice`]: host memory of the bulk path's pool
/// ([`Rpc::enqueue_bulk`](super::Rpc::enqueue_bulk)) or device memory ([`Rpc::enqueue_bulk_device`](super::Rpc::enqueue_bulk_device)).
pub enum MsgBuf<P: Provider> {
    /// From [`Rpc::alloc_msg`](super::Rpc::alloc_msg).
    Host(LocalBuf<P>),
    /// From a [`DevicePool`](crate::pool::DevicePool) on the engine's protection domain.
    Device(DeviceBuf<P>),
}

impl<P: Provider> MsgBuf<P> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            MsgBuf::Host(b) => b.len(),
            MsgBuf::Device(b) => b.len(),
        }
    }

    /// Whether it has no bytes (never: a large request has some).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The host buffer, if it is one.
    pub fn into_host(self) -> Option<LocalBuf<P>> {
        match self {
            MsgBuf::Host(b) => Some(b),
            MsgBuf::Device(_) => None,
        }
    }

    /// The device buffer, if it is one.
    pub fn into_device(self) -> Option<DeviceBuf<P>> {
        match self {
            MsgBuf::Device(b) => Some(b),
            MsgBuf::Host(_) => None,
        }
    }
}

impl<P: Provider> core::fmt::Debug for MsgBuf<P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MsgBuf::Host(b) => f.debug_tuple("Host").field(b).finish(),
            MsgBuf::Device(b) => f.debug_tuple("Device").field(b).finish(),
        }
    }
}

impl<P: Provider> core::fmt::Debug for Notice<'_, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Notice::Response { tag, bytes, msg } => f
                .debug_struct("Response")
                .field("tag", tag)
                .field("len", &bytes.len())
                .field("msg", &msg.as_ref().map(MsgBuf::len))
                .finish(),
            Notice::Failed { tag, error, msg } => f
                .debug_struct("Failed")
                .field("tag", tag)
                .field("error", error)
                .field("msg", &msg.as_ref().map(MsgBuf::len))
                .finish(),
            Notice::Session(ev) => f.debug_tuple("Session").field(ev).finish(),
        }
    }
}

/// What the engine counted besides the core's [`Stats`](crate::rpc::Stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Datagrams from a sender with no session that were not connect requests.
    pub unknown_sender: u64,
    /// Receives completed in error (the queue pair stops receiving then).
    pub recv_errors: u64,
    /// Requests of a type with no handler (answered with an empty response).
    pub no_handler: u64,
    /// Doorbells rung for sends.
    pub send_doorbells: u64,
    /// Sends posted signaled (the rest complete silently: selective signaling).
    pub signaled_sends: u64,
}

/// A request handler: reads the request, writes the response into the slice it is
/// given (the core's largest message), returns the response's length.
pub type Handler = Box<dyn FnMut(&[u8], &mut [u8]) -> usize + Send>;
