//! eRPC-style RPC: the protocol core as a sans-IO state machine (feature `std`).
//!
//! An [`RpcCore`] is one side of many RPC sessions, client and server at once. It owns
//! no socket, queue pair or clock: the caller hands it datagrams
//! ([`handle_packet`](RpcCore::handle_packet)), asks it for datagrams to send
//! ([`poll_transmit`](RpcCore::poll_transmit)), fires its timers
//! ([`next_timeout`](RpcCore::next_timeout), [`handle_timeout`](RpcCore::handle_timeout))
//! and reads what happened ([`poll_event`](RpcCore::poll_event)), in the shape of
//! quinn-proto. Time is a `u64` of nanoseconds since any fixed start, passed as `now`;
//! peers are named by a `u64` the caller chooses (for a UD engine, an index into its
//! address handles). A later engine moves the datagrams over a UD queue pair.
//!
//! The protocol is eRPC's (Kalia et al., NSDI'19):
//!
//! - A client opens a session with a connect request carrying its session number, its
//!   token ([`Config::endpoint_id`] and the session's generation) and its MTU; the server
//!   answers with its own session number, or refuses ([`Refusal`]). Connect and disconnect
//!   requests are resent every [`rto_ns`](Config::rto_ns) and give up after
//!   [`handshake_tries`](Config::handshake_tries) sends. A resent connect request gets
//!   the session it already has.
//! - Each session has a window of [`window`](Config::window) slots (8): at most that many
//!   requests outstanding. Slot `w` carries request numbers `w, w + window, w + 2·window…`,
//!   so a slot's current request is known by its number.
//! - Messages longer than one packet ([`mtu`](Config::mtu) less the 24-byte header) go as
//!   several. The server returns a credit (CR) for each request packet but the last,
//!   answers the last with the first response packet, and the client pulls each further
//!   response packet with a request-for-response (RFR). A session has
//!   [`credits`](Config::credits) (32) packets in flight at most.
//! - Packets are accepted in order only (go-back-N). A CR acknowledges every request
//!   packet up to its own, the first response packet the whole request; the other
//!   response packets must come in order. A slot that hears nothing for
//!   [`rto_ns`](Config::rto_ns) (5 ms) resends from its first unacknowledged packet.
//! - The server keeps each slot's last response and answers a resent request from it: a
//!   handler runs **at most once** per request. While a handler runs, a resent last
//!   request packet is answered with a CR for it, which tells the client the server lives.
//! - A session that hears nothing for [`session_timeout_ns`](Config::session_timeout_ns)
//!   while it has requests outstanding fails each of them once with
//!   [`RpcError::TimedOut`] and is left [failed](RpcError::SessionFailed) until
//!   [`disconnect`](RpcCore::disconnect)ed.
//!
//! Responses complete in whatever order they complete; eRPC promises no order among the
//! requests of a session, and neither does this core. What it promises: every request
//! enqueued ends in exactly one [`Event::Response`] or [`Event::Failed`]; every request a
//! server receives whole is delivered as one [`Event::Request`] (duplicates never again);
//! a response's bytes are those the server gave for that request.
//!
//! Nothing from a peer is trusted. Every header is decoded and checked ([`Header`]);
//! malformed packets, packets for sessions that do not exist or from the wrong peer, and
//! packets that fit no current state are counted in [`Stats`] and dropped.
//!
//! Dropped, not fatal to the session: unlike a connection's control protocol (where the
//! first message out of protocol ends the connection, `zverbs::tokio::Connection`), a
//! session runs over unreliable datagrams, where late retransmissions and duplicates are
//! normal, and where any stranger on the fabric can send a datagram naming a session. If
//! such a packet ended the session, a stranger could end anyone's sessions; dropped, it
//! costs its sender's sessions nothing and the others nothing either. A peer that sends
//! only such packets is a peer that says nothing: its requests fail with
//! [`RpcError::TimedOut`], and a serving session it holds closes at
//! [`idle_timeout_ns`](Config::idle_timeout_ns).
//!
//! # Memory
//!
//! [`RpcCore::new`] allocates everything: the session and slot tables, one arena of
//! message buffers (two of [`max_msg_size`](Config::max_msg_size) bytes per slot, the
//! request and the response, `max_sessions × window × 2 × max_msg_size` bytes in all,
//! zeroed; an allocator without room is an [`RpcError::InvalidConfig`]), and fixed-capacity queues for replies and events. After that
//! the data path allocates nothing. Sizes come from [`Config`] at run time rather than
//! const generics: a session count or message size is a deployment choice, and a
//! 64 KiB-per-slot array in a type would be unwieldy. Requests are copied into the arena
//! on [`enqueue_request`](RpcCore::enqueue_request), responses on
//! [`respond`](RpcCore::respond) (or written in place with
//! [`respond_with`](RpcCore::respond_with)); the caller reads received messages in place
//! ([`response`](RpcCore::response), [`request`](RpcCore::request)). The arena is one
//! contiguous allocation, addressed only through slot-buffer accessors, so that an engine
//! can later register it and post packets straight from it.
//!
//! ```
//! use zverbs::rpc::{Config, RpcCore, Event};
//! let cfg = Config { max_sessions: 2, max_msg_size: 4096, ..Config::default() };
//! let (mut client, mut server) = (RpcCore::new(cfg.clone())?, RpcCore::new(cfg)?);
//! let (c_addr, s_addr) = (1, 2); // how each names the other
//! let session = client.connect(s_addr)?;
//! let mut buf = [0u8; 1024];
//! let mut now = 0;
//! let mut handle = None;
//! let mut answer = Vec::new();
//! while answer.is_empty() {
//!     now += 1_000; // 1 µs a round
//!     while let Some(t) = client.poll_transmit(now, &mut buf) {
//!         assert_eq!(t.to, s_addr);
//!         server.handle_packet(now, c_addr, &buf[..t.len]);
//!     }
//!     while let Some(t) = server.poll_transmit(now, &mut buf) {
//!         client.handle_packet(now, s_addr, &buf[..t.len]);
//!     }
//!     while let Some(ev) = server.poll_event() {
//!         if let Event::Request { handle, req_type } = ev {
//!             let reply: Vec<u8> = server.request(handle)?.iter().rev().copied().collect();
//!             server.respond(handle, &reply)?; // the handler: reverse the bytes
//!             assert_eq!(req_type, 7);
//!         }
//!     }
//!     while let Some(ev) = client.poll_event() {
//!         match ev {
//!             Event::Connected(s) => handle = Some(client.enqueue_request(s, 7, b"hello")?),
//!             Event::Response { handle, .. } => {
//!                 answer = client.response(handle)?.to_vec();
//!                 client.release(handle)?;
//!             }
//!             other => panic!("{other:?}"),
//!         }
//!     }
//! }
//! assert_eq!(answer, b"olleh");
//! assert_eq!(handle.unwrap().session(), session);
//! # Ok::<(), zverbs::rpc::RpcError>(())
//! ```

#[cfg(feature = "std")]
mod bulk;
mod client;
#[cfg(feature = "std")]
mod clock;
#[cfg(feature = "std")]
mod engine;
pub mod header;
#[cfg(feature = "std")]
mod peers;
mod protocol;
mod server;
mod session;

use core::fmt;

use crate::error::ErrorKind;

#[cfg(feature = "std")]
pub use bulk::BulkConfig;
pub use engine::{EngineConfig, EngineError, EngineStats, Handler, MsgBuf, Notice, Rpc};
pub use header::{Header, HeaderError, Limits, PktType, HEADER_LEN};
pub use protocol::RpcCore;

/// An endpoint's configuration. Both ends of a session must use the same
/// [`mtu`](Self::mtu) (checked at connect) and should use the same
/// [`max_msg_size`](Self::max_msg_size) (a larger message is dropped by its receiver).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This endpoint's identity, part of each connect request's token. Default 0.
    pub endpoint_id: u32,
    /// Sessions, client and server together: 1..=65,536. Default 16.
    pub max_sessions: usize,
    /// Requests outstanding per session: 1..=64. Default 8.
    pub window: usize,
    /// Packets in flight per client session: 1..=65,535. Default 32.
    pub credits: usize,
    /// The largest datagram, header included: 25..=65,559 bytes. Default 1024 (a UD
    /// payload on a 1024-byte RoCE MTU; the 40-byte GRH is not counted).
    pub mtu: usize,
    /// The largest request or response: at most `u32::MAX` bytes and 65,536 packets.
    /// Default 64 KiB.
    pub max_msg_size: usize,
    /// Retransmission timeout, nanoseconds. Default 5 ms.
    pub rto_ns: u64,
    /// A session with requests outstanding that hears nothing for this long fails,
    /// nanoseconds. Default 1 s.
    pub session_timeout_ns: u64,
    /// Sends of a connect or disconnect request before it gives up. Default 10.
    pub handshake_tries: u32,
    /// A serving session whose client has sent nothing for this long, with none of its
    /// requests in a handler, is closed ([`Event::Disconnected`]): a client that vanished,
    /// or a stranger that connected and said nothing, does not hold a session forever.
    /// The client's next request on it then goes unanswered and fails with
    /// [`RpcError::TimedOut`]; it reconnects. Nanoseconds; default 60 s; `u64::MAX`: never.
    pub idle_timeout_ns: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            endpoint_id: 0,
            max_sessions: 16,
            window: 8,
            credits: 32,
            mtu: 1024,
            max_msg_size: 64 * 1024,
            rto_ns: 5_000_000,
            session_timeout_ns: 1_000_000_000,
            handshake_tries: 10,
            idle_timeout_ns: 60_000_000_000,
        }
    }
}

impl Config {
    /// The limits a receiver with this configuration checks headers against.
    pub fn limits(&self) -> Limits {
        Limits {
            max_msg_size: self.max_msg_size,
            data_per_pkt: self.mtu.saturating_sub(HEADER_LEN).max(1),
            max_sessions: self.max_sessions,
        }
    }

    /// Checks every field's range; returns the message arena's size in bytes.
    fn validate(&self) -> Result<usize, RpcError> {
        let bad = |why| Err(RpcError::InvalidConfig(why));
        if !(1..=usize::from(u16::MAX) + 1).contains(&self.max_sessions) {
            return bad("max_sessions must be 1..=65536");
        }
        if !(1..=64).contains(&self.window) {
            return bad("window must be 1..=64");
        }
        if !(1..=usize::from(u16::MAX)).contains(&self.credits) {
            return bad("credits must be 1..=65535");
        }
        if !(HEADER_LEN + 1..=HEADER_LEN + usize::from(u16::MAX)).contains(&self.mtu) {
            return bad("mtu must be 25..=65559");
        }
        if u32::try_from(self.max_msg_size).is_err()
            || self.limits().num_pkts(self.max_msg_size) > usize::from(u16::MAX) + 1
        {
            return bad("max_msg_size must fit in u32 and 65536 packets");
        }
        if self.rto_ns == 0 || self.session_timeout_ns == 0 || self.handshake_tries == 0 {
            return bad("rto_ns, session_timeout_ns and handshake_tries must be positive");
        }
        self.max_sessions
            .checked_mul(self.window)
            .and_then(|n| n.checked_mul(2))
            .and_then(|n| n.checked_mul(self.max_msg_size))
            .filter(|&n| isize::try_from(n).is_ok())
            .map_or(bad("the message buffers do not fit in memory"), Ok)
    }
}

/// Why a server refused a connect request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// Every session of the server is in use.
    NoFreeSession,
    /// The client speaks another header version.
    Version,
    /// The client's MTU is not the server's.
    Mtu,
}

impl Refusal {
    /// The connect response's status byte.
    pub(crate) const fn to_status(self) -> u8 {
        match self {
            Refusal::NoFreeSession => 1,
            Refusal::Version => 2,
            Refusal::Mtu => 3,
        }
    }

    /// The refusal a non-zero status byte names (`1..=`[`header::MAX_STATUS`]).
    pub(crate) const fn from_status(s: u8) -> Option<Refusal> {
        match s {
            1 => Some(Refusal::NoFreeSession),
            2 => Some(Refusal::Version),
            3 => Some(Refusal::Mtu),
            _ => None,
        }
    }
}

/// An RPC call that was refused, or a request or session that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RpcError {
    /// A [`Config`] field is out of range.
    InvalidConfig(&'static str),
    /// No free session in this endpoint's table.
    NoFreeSession,
    /// The session does not exist (any more), or is not of the role the call needs.
    UnknownSession,
    /// The session is not connected yet (or is disconnecting).
    NotConnected,
    /// The session timed out earlier; [`disconnect`](RpcCore::disconnect) it.
    SessionFailed,
    /// Every slot of the session's window is in use.
    WindowFull {
        /// The window.
        window: usize,
    },
    /// A message larger than [`Config::max_msg_size`].
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The handle names no request in the state the call needs: already released or
    /// answered, not complete yet, or of a session since closed.
    StaleHandle,
    /// Disconnect refused: requests are outstanding or responses unreleased.
    Busy {
        /// Slots in use.
        outstanding: usize,
    },
    /// The server heard nothing from for [`Config::session_timeout_ns`].
    TimedOut,
    /// A connect or disconnect request went unanswered [`Config::handshake_tries`] times.
    HandshakeTimedOut,
    /// The server refused the session.
    Refused(Refusal),
    /// A large message on the engine's bulk path failed.
    Bulk(BulkFailure),
}

/// Why a large message on the engine's bulk path failed (`EngineConfig::bulk`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BulkFailure {
    /// The session has no reliable connection: the server has no bulk path or no free
    /// queue pair, or setting the connection up failed, or it was reset.
    NoLink,
    /// No room in a registered pool: the server's (for the request or its response) or
    /// this endpoint's (for the response).
    NoMemory,
    /// An RDMA read failed with this status: the server's read of the request or this
    /// endpoint's read of the response.
    Read(crate::types::WcStatus),
    /// A length beyond the receiver's limit, or a malformed internal message.
    Rejected,
}

impl RpcError {
    /// What the error means in the crate-wide classification.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RpcError::InvalidConfig(_)
            | RpcError::UnknownSession
            | RpcError::TooLarge { .. }
            | RpcError::StaleHandle => ErrorKind::InvalidArgument,
            RpcError::NoFreeSession => ErrorKind::OutOfResources,
            RpcError::WindowFull { .. } => ErrorKind::QueueFull,
            RpcError::NotConnected | RpcError::SessionFailed => ErrorKind::InvalidState,
            RpcError::Busy { .. } => ErrorKind::Busy,
            RpcError::TimedOut | RpcError::HandshakeTimedOut => ErrorKind::Timeout,
            RpcError::Refused(Refusal::NoFreeSession) => ErrorKind::OutOfResources,
            RpcError::Refused(_) => ErrorKind::Unsupported,
            RpcError::Bulk(BulkFailure::NoLink) => ErrorKind::InvalidState,
            RpcError::Bulk(BulkFailure::NoMemory) => ErrorKind::OutOfResources,
            RpcError::Bulk(BulkFailure::Read(_)) => ErrorKind::Completion,
            RpcError::Bulk(_) => ErrorKind::InvalidArgument,
        }
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RpcError::InvalidConfig(why) => write!(f, "invalid RPC configuration: {why}"),
            RpcError::NoFreeSession => f.write_str("no free RPC session"),
            RpcError::UnknownSession => f.write_str("no such RPC session"),
            RpcError::NotConnected => f.write_str("RPC session not connected"),
            RpcError::SessionFailed => f.write_str("RPC session failed earlier"),
            RpcError::WindowFull { window } => {
                write!(f, "all {window} request slots of the RPC session in use")
            }
            RpcError::TooLarge { len, max } => {
                write!(f, "RPC message of {len} bytes, at most {max}")
            }
            RpcError::StaleHandle => f.write_str("stale RPC request handle"),
            RpcError::Busy { outstanding } => {
                write!(f, "RPC session has {outstanding} requests outstanding")
            }
            RpcError::TimedOut => f.write_str("RPC session timed out"),
            RpcError::HandshakeTimedOut => f.write_str("RPC session handshake timed out"),
            RpcError::Refused(r) => write!(f, "RPC session refused by the server: {r:?}"),
            RpcError::Bulk(b) => write!(f, "large RPC message failed: {b:?}"),
        }
    }
}

impl core::error::Error for RpcError {}

/// A session of one endpoint: its number (on the wire) and generation (so that a
/// handle outlives no reuse of the number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionId {
    pub(crate) index: u16,
    pub(crate) gen: u32,
}

impl SessionId {
    /// The session's number in this endpoint's table.
    pub fn index(&self) -> u16 {
        self.index
    }
}

/// A request this endpoint sent as a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestHandle {
    pub(crate) session: SessionId,
    pub(crate) req_num: u64,
}

/// A request this endpoint serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServerHandle {
    pub(crate) session: SessionId,
    pub(crate) req_num: u64,
}

macro_rules! handle_accessors {
    ($t:ty) => {
        impl $t {
            /// The session it belongs to.
            pub fn session(&self) -> SessionId {
                self.session
            }
            /// Its request number, unique in its session.
            pub fn req_num(&self) -> u64 {
                self.req_num
            }
        }
    };
}
handle_accessors!(RequestHandle);
handle_accessors!(ServerHandle);

/// Something that happened, from [`RpcCore::poll_event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A client session is open: requests may be enqueued.
    Connected(SessionId),
    /// A client session could not be opened; its number is free again.
    ConnectFailed {
        /// The session.
        session: SessionId,
        /// Why.
        error: RpcError,
    },
    /// A peer opened a session to this endpoint.
    Accepted {
        /// The session.
        session: SessionId,
        /// The peer.
        from: u64,
    },
    /// A session is closed (either role); its number is free again.
    Disconnected(SessionId),
    /// A request arrived whole: read it with [`RpcCore::request`], answer with
    /// [`RpcCore::respond`].
    Request {
        /// The request.
        handle: ServerHandle,
        /// Its application request type.
        req_type: u8,
    },
    /// A response arrived whole: read it with [`RpcCore::response`], then
    /// [`release`](RpcCore::release) the slot.
    Response {
        /// The request it answers.
        handle: RequestHandle,
        /// The request type.
        req_type: u8,
    },
    /// A request failed; its slot is free again.
    Failed {
        /// The request.
        handle: RequestHandle,
        /// Why.
        error: RpcError,
    },
}

/// A datagram [`RpcCore::poll_transmit`] wrote: `out[..len]`, for peer `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The peer.
    pub to: u64,
    /// Bytes written.
    pub len: usize,
}

/// An endpoint's counters, from [`RpcCore::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams given to [`handle_packet`](RpcCore::handle_packet).
    pub rx_packets: u64,
    /// Datagrams written by [`poll_transmit`](RpcCore::poll_transmit).
    pub tx_packets: u64,
    /// Datagrams whose header failed [`Header::decode`] or [`Header::validate`].
    pub malformed: u64,
    /// Packets for a session that does not exist here, is in another state, or belongs
    /// to another peer.
    pub unknown_session: u64,
    /// Packets of a known session that fit no current state: old, out of order, or not
    /// matching the request they name.
    pub stale: u64,
    /// Resent request packets answered from the server's state (no handler run).
    pub duplicate_requests: u64,
    /// Go-back-N rollbacks after a retransmission timeout.
    pub retransmits: u64,
    /// Sessions failed by the session timeout.
    pub session_timeouts: u64,
    /// Connect requests refused.
    pub refused_connects: u64,
    /// Replies not queued because the reply queue was full (the peer resends).
    pub replies_dropped: u64,
    /// Packets not taken in because the event queue was full (the peer resends), and
    /// session events lost to a full queue.
    pub events_dropped: u64,
}

#[cfg(test)]
mod tests;
