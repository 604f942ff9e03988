//! Why a connection through the manager failed.

use core::fmt;

use crate::error::{Error, ErrorKind, ProviderError};
use crate::provider::cm::{
    CmEventKind, REJECT_CONSUMER, REJECT_NO_LISTENER, SIDR_NO_LISTENER, SIDR_REJECT,
};

/// Why a connection through the manager failed; [`kind`](Self::kind) says what it means.
#[derive(Debug)]
#[non_exhaustive]
pub enum CmError<E> {
    /// A manager call failed.
    Verbs(E),
    /// Preparing or connecting the channel failed.
    Channel(Error<E>),
    /// Private data past the message's limit.
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The address resolves to no device (`status`: a negative errno).
    AddrError {
        /// What the manager said.
        status: i32,
    },
    /// No route to it.
    RouteError {
        /// What the manager said.
        status: i32,
    },
    /// The route leaves from another device than the channel's context.
    WrongDevice,
    /// The peer refused (`status` 28, with its reason), or nobody listens (`status` 8).
    Rejected {
        /// The reject reason.
        status: i32,
        /// What the peer's reject carried (its whole field, at most 148 bytes).
        private_data: Vec<u8>,
    },
    /// The peer did not answer; or, to a datagram service request, nobody listens
    /// (`status` 1, [`SIDR_NO_LISTENER`]) or the service refused (`status` 2,
    /// [`SIDR_REJECT`]).
    Unreachable {
        /// What the manager said.
        status: i32,
    },
    /// The peer disconnected before the connection was up.
    Disconnected,
    /// An event out of place.
    Unexpected {
        /// Its kind.
        kind: CmEventKind,
        /// Its status.
        status: i32,
    },
    /// The deadline passed waiting for this event.
    Timeout {
        /// The event waited for.
        waiting_for: CmEventKind,
    },
}

impl<E> CmError<E> {
    /// Whether the peer's manager said that nobody listens on the port: a reliable
    /// connect's `Rejected` with [`REJECT_NO_LISTENER`], a datagram service request's
    /// `Unreachable` with [`SIDR_NO_LISTENER`]. A client started with its server may
    /// ask again while this holds.
    pub fn nobody_listens(&self) -> bool {
        matches!(
            self,
            CmError::Rejected {
                status: REJECT_NO_LISTENER,
                ..
            } | CmError::Unreachable {
                status: SIDR_NO_LISTENER
            }
        )
    }
}

impl<E: ProviderError> CmError<E> {
    /// What the error means.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CmError::Verbs(e) => e.kind(),
            CmError::Channel(e) => e.kind(),
            CmError::PrivateDataTooLong { .. } => ErrorKind::InvalidArgument,
            CmError::AddrError { .. } | CmError::RouteError { .. } => ErrorKind::NotFound,
            CmError::WrongDevice => ErrorKind::InvalidArgument,
            CmError::Rejected { .. }
            | CmError::Unreachable {
                status: SIDR_NO_LISTENER | SIDR_REJECT,
            } => ErrorKind::PermissionDenied,
            CmError::Timeout { .. } | CmError::Unreachable { .. } => ErrorKind::Timeout,
            CmError::Disconnected | CmError::Unexpected { .. } => ErrorKind::Other,
        }
    }
}

impl<E: fmt::Debug> fmt::Display for CmError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::Verbs(e) => write!(f, "connection manager: {e:?}"),
            CmError::Channel(e) => write!(f, "connection manager: the channel: {e:?}"),
            CmError::PrivateDataTooLong { len, max } => {
                write!(f, "private data of {len} bytes, past the limit of {max}")
            }
            CmError::AddrError { status } => write!(f, "the address does not resolve ({status})"),
            CmError::RouteError { status } => write!(f, "no route to the address ({status})"),
            CmError::WrongDevice => {
                f.write_str("the route leaves from another device than the context's")
            }
            CmError::Rejected {
                status,
                private_data,
            } => write!(
                f,
                "rejected (reason {status}{}), with {:?}",
                match *status {
                    REJECT_NO_LISTENER => ": nobody listens",
                    REJECT_CONSUMER => ": by the peer",
                    _ => "",
                },
                private_data
            ),
            CmError::Unreachable {
                status: SIDR_NO_LISTENER,
            } => f.write_str("nobody serves the port (1)"),
            CmError::Unreachable {
                status: SIDR_REJECT,
            } => f.write_str("the service refused (2)"),
            CmError::Unreachable { status } => write!(f, "the peer is unreachable ({status})"),
            CmError::Disconnected => f.write_str("the peer disconnected"),
            CmError::Unexpected { kind, status } => {
                write!(f, "unexpected connection manager event {kind:?} ({status})")
            }
            CmError::Timeout { waiting_for } => write!(f, "timed out waiting for {waiting_for:?}"),
        }
    }
}

impl<E: fmt::Debug> std::error::Error for CmError<E> {}
