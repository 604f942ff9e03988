//! The packet header: 24 bytes, little-endian, checked before anything reads it.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0 | magic | [`MAGIC`] (`0xE5`) |
//! | 1 | version | [`VERSION`] (1) |
//! | 2 | packet type | [`PktType`] as a byte, 1..=8 |
//! | 3 | `req_type` | data packets: the application's request type; connect response: its [`status`](Header::req_type); else 0 |
//! | 4..6 | `dest_session` | the receiver's session number; 0 in a connect request |
//! | 6..8 | `src_session` | the sender's session number |
//! | 8..12 | `msg_size` | data packets: the whole message's bytes; connect request: the sender's MTU; else 0 |
//! | 12..14 | `pkt_num` | data packets: the packet's index in its message; CR: the request packet acknowledged; RFR: the response packet asked for (from 1); else 0 |
//! | 14..16 | `payload_len` | bytes after the header: exactly the datagram's length less 24; 0 but for data packets |
//! | 16..24 | `req_num` | data, CR, RFR: the request number; session packets: the client's token |
//!
//! Bytes 0..8 keep their meaning in every version, so that a server can refuse a connect
//! request of another version by its packet type and source session.
//!
//! [`Header::decode`] checks what the bytes alone can tell (the order of its checks is the
//! order of the [`HeaderError`] variants up to `PktNum`); [`Header::validate`] checks them
//! against the receiver's [`Limits`].

use core::fmt;

/// Bytes in a header.
pub const HEADER_LEN: usize = 24;
/// The first byte of every packet.
pub const MAGIC: u8 = 0xE5;
/// The header version this code reads and writes.
pub const VERSION: u8 = 1;

/// What a packet is. eRPC's packet types, plus session management.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PktType {
    /// Client to server: open a session.
    ConnectReq = 1,
    /// Server to client: the session's number on the server, or a refusal.
    ConnectResp = 2,
    /// Client to server: close a session.
    DisconnectReq = 3,
    /// Server to client: the session is closed.
    DisconnectResp = 4,
    /// One packet of a request message.
    Req = 5,
    /// One packet of a response message.
    Resp = 6,
    /// Credit return: the server has request packets `0..=pkt_num` (not sent for the last).
    CreditReturn = 7,
    /// Request for response: the client asks for response packet `pkt_num`.
    Rfr = 8,
}

impl PktType {
    /// The type with wire value `b`.
    pub const fn from_byte(b: u8) -> Option<PktType> {
        Some(match b {
            1 => PktType::ConnectReq,
            2 => PktType::ConnectResp,
            3 => PktType::DisconnectReq,
            4 => PktType::DisconnectResp,
            5 => PktType::Req,
            6 => PktType::Resp,
            7 => PktType::CreditReturn,
            8 => PktType::Rfr,
            _ => return None,
        })
    }

    /// Whether packets of this type carry message bytes (`Req`, `Resp`).
    pub const fn is_data(self) -> bool {
        matches!(self, PktType::Req | PktType::Resp)
    }
}

/// The highest status byte a connect response may carry (see [`Refusal`](super::Refusal)).
pub const MAX_STATUS: u8 = 3;

/// A decoded header. The payload is the datagram's bytes after [`HEADER_LEN`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the packet is.
    pub pkt_type: PktType,
    /// The application's request type (data packets) or the connect status (connect
    /// response: 0 accepted, else a [`Refusal`](super::Refusal)).
    pub req_type: u8,
    /// The receiver's session number.
    pub dest_session: u16,
    /// The sender's session number.
    pub src_session: u16,
    /// The message's size (data packets), or the sender's MTU (connect request).
    pub msg_size: u32,
    /// The packet's index in its message, or the packet acknowledged or asked for.
    pub pkt_num: u16,
    /// Bytes after the header.
    pub payload_len: u16,
    /// The request number, or the client's token in session packets.
    pub req_num: u64,
}

/// What the receiver accepts, from its [`Config`](super::Config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest message, in bytes.
    pub max_msg_size: usize,
    /// Message bytes per packet (the MTU less [`HEADER_LEN`]), at least 1.
    pub data_per_pkt: usize,
    /// Session numbers are below this.
    pub max_sessions: usize,
}

/// Packets needed for a message of `size` bytes at `per` bytes a packet (at least one).
pub(crate) fn num_pkts(size: usize, per: usize) -> usize {
    if size <= per {
        1 // no division for the common one-packet message
    } else {
        size.div_ceil(per.max(1))
    }
}

impl Limits {
    /// Packets needed for a message of `size` bytes (at least one).
    pub fn num_pkts(&self, size: usize) -> usize {
        num_pkts(size, self.data_per_pkt)
    }

    /// The payload bytes of packet `pkt` of a message of `size` bytes (the message must
    /// have that packet).
    pub fn pkt_len(&self, size: usize, pkt: usize) -> usize {
        let start = pkt.saturating_mul(self.data_per_pkt);
        size.saturating_sub(start).min(self.data_per_pkt)
    }
}

/// Bytes that are not an acceptable header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderError {
    /// Fewer than [`HEADER_LEN`] bytes (decoding), or an output buffer that short
    /// (encoding).
    Truncated {
        /// Bytes given.
        len: usize,
    },
    /// Byte 0 is not [`MAGIC`].
    Magic(u8),
    /// Byte 1 is not [`VERSION`].
    Version(u8),
    /// Byte 2 is no [`PktType`].
    PktType(u8),
    /// `payload_len` is not the number of bytes after the header.
    PayloadLength {
        /// The header's claim.
        claimed: u16,
        /// Bytes after the header.
        actual: usize,
    },
    /// A field this packet type does not use is not zero.
    Reserved {
        /// The field.
        field: &'static str,
    },
    /// A connect response's status byte is above [`MAX_STATUS`].
    Status(u8),
    /// A data packet's payload is larger than its message.
    PayloadOverMessage {
        /// `payload_len`.
        payload_len: u16,
        /// `msg_size`.
        msg_size: u32,
    },
    /// A packet number that cannot be: past the message's last packet, past the largest
    /// message's, or 0 in a request for response.
    PktNum(u16),
    /// A message larger than the receiver's `max_msg_size`.
    TooLarge {
        /// The header's `msg_size`.
        size: u32,
        /// The receiver's limit.
        max: usize,
    },
    /// A data packet whose payload is not the size its packet number and message size
    /// give at the receiver's MTU.
    PktLength {
        /// What the packet should carry.
        expected: usize,
        /// What it carries.
        got: u16,
    },
    /// A destination session number at or above the receiver's `max_sessions`.
    Session(u16),
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Truncated { len } => {
                write!(f, "{len} bytes, an RPC header needs {HEADER_LEN}")
            }
            HeaderError::Magic(m) => write!(f, "RPC magic {m:#04x}, expected {MAGIC:#04x}"),
            HeaderError::Version(v) => write!(f, "RPC header version {v}, expected {VERSION}"),
            HeaderError::PktType(t) => write!(f, "unknown RPC packet type {t}"),
            HeaderError::PayloadLength { claimed, actual } => write!(
                f,
                "RPC header claims {claimed} payload bytes, {actual} follow"
            ),
            HeaderError::Reserved { field } => {
                write!(
                    f,
                    "RPC header field {field} unused by this packet type is not zero"
                )
            }
            HeaderError::Status(s) => write!(f, "unknown RPC connect status {s}"),
            HeaderError::PayloadOverMessage {
                payload_len,
                msg_size,
            } => write!(
                f,
                "RPC packet of {payload_len} bytes in a message of {msg_size}"
            ),
            HeaderError::PktNum(n) => write!(f, "RPC packet number {n} out of range"),
            HeaderError::TooLarge { size, max } => {
                write!(f, "RPC message of {size} bytes, at most {max} accepted")
            }
            HeaderError::PktLength { expected, got } => {
                write!(
                    f,
                    "RPC packet carries {got} bytes, its position says {expected}"
                )
            }
            HeaderError::Session(s) => write!(f, "RPC session number {s} out of range"),
        }
    }
}

impl core::error::Error for HeaderError {}

impl Header {
    /// Writes the header into `out[..HEADER_LEN]`; returns [`HEADER_LEN`]. The payload,
    /// if any, goes after it. Refuses a shorter `out` without writing.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, HeaderError> {
        let Some(b) = out.get_mut(..HEADER_LEN) else {
            return Err(HeaderError::Truncated { len: out.len() });
        };
        b[0] = MAGIC;
        b[1] = VERSION;
        b[2] = self.pkt_type as u8;
        b[3] = self.req_type;
        b[4..6].copy_from_slice(&self.dest_session.to_le_bytes());
        b[6..8].copy_from_slice(&self.src_session.to_le_bytes());
        b[8..12].copy_from_slice(&self.msg_size.to_le_bytes());
        b[12..14].copy_from_slice(&self.pkt_num.to_le_bytes());
        b[14..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.req_num.to_le_bytes());
        Ok(HEADER_LEN)
    }

    /// Reads the header of the datagram `bytes` (header and payload), checking what the
    /// bytes alone can tell: length, magic, version, packet type, that `payload_len` is
    /// what follows, that unused fields are zero, a connect response's status, a data
    /// packet's payload against its message, and that an RFR asks for a packet after
    /// the first.
    #[inline]
    pub fn decode(bytes: &[u8]) -> Result<Header, HeaderError> {
        let Some(b) = bytes.get(..HEADER_LEN) else {
            return Err(HeaderError::Truncated { len: bytes.len() });
        };
        if b[0] != MAGIC {
            return Err(HeaderError::Magic(b[0]));
        }
        if b[1] != VERSION {
            return Err(HeaderError::Version(b[1]));
        }
        let pkt_type = PktType::from_byte(b[2]).ok_or(HeaderError::PktType(b[2]))?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let h = Header {
            pkt_type,
            req_type: b[3],
            dest_session: u16_at(4),
            src_session: u16_at(6),
            msg_size: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            pkt_num: u16_at(12),
            payload_len: u16_at(14),
            req_num: u64::from_le_bytes([b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23]]),
        };
        let actual = bytes.len() - HEADER_LEN;
        if usize::from(h.payload_len) != actual {
            return Err(HeaderError::PayloadLength {
                claimed: h.payload_len,
                actual,
            });
        }
        use PktType::*;
        let zero = |v: u64, field| {
            if v == 0 {
                Ok(())
            } else {
                Err(HeaderError::Reserved { field })
            }
        };
        let t = h.pkt_type;
        if !t.is_data() {
            zero(u64::from(h.payload_len), "payload_len")?;
        }
        if !matches!(t, Req | Resp | ConnectResp) {
            zero(u64::from(h.req_type), "req_type")?;
        }
        if t == ConnectReq {
            zero(u64::from(h.dest_session), "dest_session")?;
        }
        if !matches!(t, Req | Resp | ConnectReq) {
            zero(u64::from(h.msg_size), "msg_size")?;
        }
        if !matches!(t, Req | Resp | CreditReturn | Rfr) {
            zero(u64::from(h.pkt_num), "pkt_num")?;
        }
        if t == ConnectResp && h.req_type > MAX_STATUS {
            return Err(HeaderError::Status(h.req_type));
        }
        if t.is_data() && u32::from(h.payload_len) > h.msg_size {
            return Err(HeaderError::PayloadOverMessage {
                payload_len: h.payload_len,
                msg_size: h.msg_size,
            });
        }
        if t == Rfr && h.pkt_num == 0 {
            return Err(HeaderError::PktNum(0));
        }
        Ok(h)
    }

    /// Checks a decoded header against the receiver's limits: the destination session
    /// number (but in a connect request), a data packet's message size, packet number and
    /// payload size, and that a CR or RFR names a packet the largest message has.
    #[inline]
    pub fn validate(&self, limits: &Limits) -> Result<(), HeaderError> {
        if self.pkt_type != PktType::ConnectReq
            && usize::from(self.dest_session) >= limits.max_sessions
        {
            return Err(HeaderError::Session(self.dest_session));
        }
        let pkt = usize::from(self.pkt_num);
        match self.pkt_type {
            PktType::Req | PktType::Resp => {
                let size = usize::try_from(self.msg_size)
                    .ok()
                    .filter(|&s| s <= limits.max_msg_size)
                    .ok_or(HeaderError::TooLarge {
                        size: self.msg_size,
                        max: limits.max_msg_size,
                    })?;
                if pkt >= limits.num_pkts(size) {
                    return Err(HeaderError::PktNum(self.pkt_num));
                }
                let expected = limits.pkt_len(size, pkt);
                if usize::from(self.payload_len) != expected {
                    return Err(HeaderError::PktLength {
                        expected,
                        got: self.payload_len,
                    });
                }
            }
            PktType::CreditReturn | PktType::Rfr if pkt >= limits.num_pkts(limits.max_msg_size) => {
                return Err(HeaderError::PktNum(self.pkt_num));
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
