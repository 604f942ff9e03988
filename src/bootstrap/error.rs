//! Why an exchange failed: one error type for the frames, the connections and the
//! protocol, each variant naming the peer and what it got wrong.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::ops::Range;

use crate::error::ErrorKind;

/// Why an exchange failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The caller's rank is not in the configuration.
    NoSuchRank {
        /// The rank given.
        rank: u32,
        /// Number of ranks configured.
        len: usize,
    },
    /// The caller's payload is longer than [`MAX_PAYLOAD`](super::MAX_PAYLOAD).
    PayloadTooLarge {
        /// Its length.
        len: usize,
        /// [`MAX_PAYLOAD`](super::MAX_PAYLOAD).
        max: usize,
    },
    /// The configured address could not be bound.
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        source: io::Error,
    },
    /// [`exchange_with_listener`](super::exchange_with_listener): the listener is not on the configured port.
    ListenerMismatch {
        /// The configured address.
        configured: SocketAddr,
        /// The address the listener is bound to.
        bound: SocketAddr,
    },
    /// The deadline passed before these ranks had completed their exchange.
    Timeout {
        /// The ranks not heard from, ascending.
        waiting_for: Vec<u32>,
    },
    /// A peer's frame does not open with the right magic.
    WrongMagic {
        /// The peer's address.
        peer: SocketAddr,
        /// The magic it sent.
        got: [u8; 4],
    },
    /// A peer's frame has a version this library does not read.
    WrongVersion {
        /// The peer's address.
        peer: SocketAddr,
        /// The version it sent.
        got: u16,
    },
    /// A peer claims a rank it may not have: not the rank it was dialled as, or (on an
    /// accepted connection) not one of the lower ranks that dial this one.
    UnexpectedRank {
        /// The peer's address.
        peer: SocketAddr,
        /// The ranks that were acceptable.
        expected: Range<u32>,
        /// The rank it claimed.
        got: u32,
    },
    /// A second connection claims a rank already heard from.
    DuplicatePeer {
        /// The rank.
        rank: u32,
        /// The address of the second connection.
        peer: SocketAddr,
    },
    /// A rank heard from went away before everything it was owed reached it.
    Lost {
        /// The rank.
        rank: u32,
        /// Its address.
        peer: SocketAddr,
        /// What the connection said.
        source: io::Error,
    },
    /// The environment gives no place in a world (see
    /// [`launch`](super::launch)).
    Launch(super::launch::LaunchError),
    /// The launcher named no rendezvous root (and `ZVERBS_ROOT` is not set).
    NoRoot,
    /// The root's host name does not resolve.
    Unresolved {
        /// The root as named (`host:port`).
        root: String,
        /// What the resolver said.
        source: io::Error,
    },
    /// A rank of the same rendezvous (its id matches) names another world size.
    WorldMismatch {
        /// The peer's address.
        peer: SocketAddr,
        /// This rank's world size.
        expected: u32,
        /// The peer's.
        got: u32,
    },
    /// A peer claims a payload longer than [`MAX_PAYLOAD`](super::MAX_PAYLOAD) (nothing was allocated for it).
    Oversized {
        /// The peer's address.
        peer: SocketAddr,
        /// The length it claimed.
        claimed: u64,
        /// [`MAX_PAYLOAD`](super::MAX_PAYLOAD).
        max: usize,
    },
    /// A peer closed the connection inside its frame.
    Truncated {
        /// The peer's address.
        peer: SocketAddr,
        /// Bytes its frame needs, as far as known.
        needed: usize,
        /// Bytes it sent.
        got: usize,
    },
    /// The readiness round after the exchange (see [`tcp`](super::tcp#readiness-round))
    /// did not end with every rank ready.
    NotReady {
        /// Ranks that reported they could not connect their queue pairs, ascending.
        failed: Vec<u32>,
        /// Ranks not heard from when the round ended (at the deadline, or at once after a
        /// failure report), ascending.
        waiting_for: Vec<u32>,
    },
    /// A socket operation failed.
    Io {
        /// The peer's address, when the failure concerns one connection.
        peer: Option<SocketAddr>,
        /// What the OS said.
        source: io::Error,
    },
}

impl ExchangeError {
    /// What the error means in the crate-wide classification: a deadline that passed is
    /// [`Timeout`](ErrorKind::Timeout) (also a readiness round that only waited), bad
    /// arguments are [`InvalidArgument`](ErrorKind::InvalidArgument), anything a peer got
    /// wrong or the OS refused is [`Other`](ErrorKind::Other).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ExchangeError::Timeout { .. } => ErrorKind::Timeout,
            ExchangeError::NotReady { failed, .. } if failed.is_empty() => ErrorKind::Timeout,
            ExchangeError::NoSuchRank { .. }
            | ExchangeError::PayloadTooLarge { .. }
            | ExchangeError::ListenerMismatch { .. }
            | ExchangeError::NoRoot
            | ExchangeError::Launch(_) => ErrorKind::InvalidArgument,
            _ => ErrorKind::Other,
        }
    }
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExchangeError::NoSuchRank { rank, len } => {
                write!(f, "rank {rank} is not in a network of {len} ranks")
            }
            ExchangeError::PayloadTooLarge { len, max } => {
                write!(f, "payload of {len} bytes exceeds the {max}-byte limit")
            }
            ExchangeError::Bind { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
            ExchangeError::ListenerMismatch { configured, bound } => {
                write!(
                    f,
                    "listener is bound to {bound}, but the config says {configured}"
                )
            }
            ExchangeError::Timeout { waiting_for } => {
                write!(f, "exchange timed out waiting for ranks {waiting_for:?}")
            }
            ExchangeError::WrongMagic { peer, got } => {
                write!(f, "peer {peer} sent bad frame magic {got:02x?}")
            }
            ExchangeError::WrongVersion { peer, got } => write!(
                f,
                "peer {peer} sent frame version {got} (this library reads {})",
                super::frame::FRAME_VERSION
            ),
            ExchangeError::UnexpectedRank {
                peer,
                expected,
                got,
            } => {
                if expected.len() == 1 {
                    write!(
                        f,
                        "peer {peer} claims rank {got}, expected rank {}",
                        expected.start
                    )
                } else {
                    write!(
                        f,
                        "peer {peer} claims rank {got}, expected a rank in {}..{}",
                        expected.start, expected.end
                    )
                }
            }
            ExchangeError::DuplicatePeer { rank, peer } => {
                write!(f, "peer {peer} claims rank {rank}, which already connected")
            }
            ExchangeError::Launch(e) => write!(f, "{e}"),
            ExchangeError::Lost { rank, peer, source } => {
                write!(
                    f,
                    "rank {rank} ({peer}) went away before its reply reached it: {source}"
                )
            }
            ExchangeError::NoRoot => f.write_str(
                "no rendezvous root: the launcher names none; set ZVERBS_ROOT=host:port",
            ),
            ExchangeError::Unresolved { root, source } => {
                write!(f, "cannot resolve the rendezvous root {root}: {source}")
            }
            ExchangeError::WorldMismatch {
                peer,
                expected,
                got,
            } => write!(
                f,
                "peer {peer} is in a world of {got} ranks, this rank in one of {expected}"
            ),
            ExchangeError::Oversized { peer, claimed, max } => write!(
                f,
                "peer {peer} claims a {claimed}-byte payload, over the {max}-byte limit"
            ),
            ExchangeError::Truncated { peer, needed, got } => write!(
                f,
                "peer {peer} closed the connection after {got} of {needed} frame bytes"
            ),
            ExchangeError::NotReady {
                failed,
                waiting_for,
            } => {
                if failed.is_empty() {
                    write!(
                        f,
                        "timed out waiting for ranks {waiting_for:?} to report their queue pairs ready"
                    )
                } else {
                    write!(
                        f,
                        "ranks {failed:?} could not connect their queue pairs \
                         (not heard from: {waiting_for:?})"
                    )
                }
            }
            ExchangeError::Io {
                peer: Some(peer),
                source,
            } => write!(f, "exchange with {peer} failed: {source}"),
            ExchangeError::Io { peer: None, source } => write!(f, "exchange failed: {source}"),
        }
    }
}

impl std::error::Error for ExchangeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExchangeError::Bind { source, .. }
            | ExchangeError::Io { source, .. }
            | ExchangeError::Unresolved { source, .. }
            | ExchangeError::Lost { source, .. } => Some(source),
            ExchangeError::Launch(e) => Some(e),
            _ => None,
        }
    }
}
