//! The control messages of a [`Connection`](super::Connection): fixed-size, versioned,
//! checked frames on a queue pair of their own, so they never mix with the user's sends
//! and receives.
//!
//! Layout (40 bytes, big-endian): magic `"ZVRX"`, version (1 byte), kind (1), status (2),
//! request id (4), lease (4), address (8), length (8), rkey (4), access flags (4). Decoding
//! is total: every field is checked, a length is never used to size anything, and an
//! unknown kind, version or access bit is an error.

use crate::types::AccessFlags;

/// Bytes of one control message.
pub(crate) const MSG_LEN: usize = 40;
/// Its first four bytes.
pub(crate) const MAGIC: [u8; 4] = *b"ZVRX";
/// The version this build speaks.
pub(crate) const VERSION: u8 = 1;

/// What a control message says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// "Lend me `len` bytes with `access`" (`Connection::request_remote`).
    Request {
        id: u32,
        len: u64,
        access: AccessFlags,
    },
    /// The answer: lease `lease` over `len` bytes at `addr`, key `rkey`.
    Grant {
        id: u32,
        lease: u32,
        addr: u64,
        len: u64,
        rkey: u32,
    },
    /// The answer: no (`status` says why: [`REFUSED_EXHAUSTED`] or [`REFUSED_BAD`]).
    Refuse { id: u32, status: u16 },
    /// A lease offered unasked (`Connection::send_local`).
    Give {
        lease: u32,
        addr: u64,
        len: u64,
        rkey: u32,
    },
    /// "I am done with lease `lease`; the buffer is yours again" (`send_remote`).
    Return { lease: u32 },
    /// "I dropped lease `lease`" (a `RemoteBuf` dropped): the owner frees it.
    Release { lease: u32 },
}

/// [`Msg::Refuse`]: the owner's pool had no room (or too many leases were out).
pub(crate) const REFUSED_EXHAUSTED: u16 = 1;
/// [`Msg::Refuse`]: the request was malformed (zero or oversized length, bad rights).
pub(crate) const REFUSED_BAD: u16 = 2;

/// Why bytes are not a control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Not 40 bytes.
    Length(usize),
    /// The magic is not `"ZVRX"`.
    Magic([u8; 4]),
    /// A version this build does not speak.
    Version(u8),
    /// An unknown message kind.
    Kind(u8),
    /// Access bits this build does not know, or none a peer may use.
    Access(u32),
    /// A message naming a lease that does not exist (or is over).
    Lease(u32),
    /// A message of this kind was not expected now (a grant or refusal nobody asked for,
    /// more offers than leases).
    Unexpected(u8),
    /// A grant of another length than the request asked for.
    Granted {
        /// Bytes asked for.
        asked: u64,
        /// Bytes the grant claims.
        granted: u64,
    },
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WireError::Length(n) => write!(f, "control message of {n} bytes, not {MSG_LEN}"),
            WireError::Magic(m) => write!(f, "control message magic {m:02x?}"),
            WireError::Version(v) => write!(f, "control message version {v}, not {VERSION}"),
            WireError::Kind(k) => write!(f, "unknown control message kind {k}"),
            WireError::Access(a) => write!(f, "bad access flags {a:#x} in a request"),
            WireError::Lease(l) => write!(f, "control message names lease {l}, which is not out"),
            WireError::Unexpected(k) => write!(f, "control message of kind {k} not expected now"),
            WireError::Granted { asked, granted } => {
                write!(f, "a grant of {granted} bytes for a request of {asked}")
            }
        }
    }
}

impl std::error::Error for WireError {}

const REQUEST: u8 = 1;
/// The kind byte of [`Msg::Grant`] (what [`WireError::Unexpected`] names).
pub(crate) const GRANT: u8 = 2;
/// The kind byte of [`Msg::Refuse`].
pub(crate) const REFUSE: u8 = 3;
const GIVE: u8 = 4;
const RETURN: u8 = 5;
const RELEASE: u8 = 6;

/// The rights a peer may ask for.
pub(crate) const REMOTE_RIGHTS: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

impl Msg {
    pub(crate) fn encode(&self) -> [u8; MSG_LEN] {
        let (kind, status, id, lease, addr, len, rkey, access) = match *self {
            Msg::Request { id, len, access } => (REQUEST, 0, id, 0, 0, len, 0, access.bits()),
            Msg::Grant {
                id,
                lease,
                addr,
                len,
                rkey,
            } => (GRANT, 0, id, lease, addr, len, rkey, 0),
            Msg::Refuse { id, status } => (REFUSE, status, id, 0, 0, 0, 0, 0),
            Msg::Give {
                lease,
                addr,
                len,
                rkey,
            } => (GIVE, 0, 0, lease, addr, len, rkey, 0),
            Msg::Return { lease } => (RETURN, 0, 0, lease, 0, 0, 0, 0),
            Msg::Release { lease } => (RELEASE, 0, 0, lease, 0, 0, 0, 0),
        };
        let mut b = [0u8; MSG_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = kind;
        b[6..8].copy_from_slice(&status.to_be_bytes());
        b[8..12].copy_from_slice(&id.to_be_bytes());
        b[12..16].copy_from_slice(&lease.to_be_bytes());
        b[16..24].copy_from_slice(&addr.to_be_bytes());
        b[24..32].copy_from_slice(&len.to_be_bytes());
        b[32..36].copy_from_slice(&rkey.to_be_bytes());
        b[36..40].copy_from_slice(&access.to_be_bytes());
        b
    }

    /// Decodes one message; total (no panic, no allocation) over any bytes.
    pub fn decode(b: &[u8]) -> Result<Msg, WireError> {
        let b: &[u8; MSG_LEN] = b.try_into().map_err(|_| WireError::Length(b.len()))?;
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(WireError::Magic(magic));
        }
        if b[4] != VERSION {
            return Err(WireError::Version(b[4]));
        }
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| (u64::from(u32_at(i)) << 32) | u64::from(u32_at(i + 4));
        let (status, id, lease) = (u16_at(6), u32_at(8), u32_at(12));
        let (addr, len, rkey, access) = (u64_at(16), u64_at(24), u32_at(32), u32_at(36));
        Ok(match b[5] {
            REQUEST => {
                let access = AccessFlags::from_bits(access)
                    .filter(|a| !a.is_empty() && REMOTE_RIGHTS.contains(*a))
                    .ok_or(WireError::Access(access))?;
                Msg::Request { id, len, access }
            }
            GRANT => Msg::Grant {
                id,
                lease,
                addr,
                len,
                rkey,
            },
            REFUSE => Msg::Refuse { id, status },
            GIVE => Msg::Give {
                lease,
                addr,
                len,
                rkey,
            },
            RETURN => Msg::Return { lease },
            RELEASE => Msg::Release { lease },
            k => return Err(WireError::Kind(k)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_kind_round_trips() {
        let all = [
            Msg::Request {
                id: 7,
                len: 1 << 40,
                access: AccessFlags::REMOTE_WRITE,
            },
            Msg::Grant {
                id: 7,
                lease: 3,
                addr: u64::MAX,
                len: 64,
                rkey: 0xdead_beef,
            },
            Msg::Refuse {
                id: 9,
                status: REFUSED_EXHAUSTED,
            },
            Msg::Give {
                lease: 1,
                addr: 4096,
                len: 8,
                rkey: 1,
            },
            Msg::Return { lease: 2 },
            Msg::Release { lease: u32::MAX },
        ];
        for m in all {
            assert_eq!(Msg::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn bad_frames_are_typed_errors() {
        let good = Msg::Return { lease: 1 }.encode();
        assert_eq!(Msg::decode(&good[..39]), Err(WireError::Length(39)));
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(Msg::decode(&b), Err(WireError::Magic(_))));
        let mut b = good;
        b[4] = 2;
        assert_eq!(Msg::decode(&b), Err(WireError::Version(2)));
        let mut b = good;
        b[5] = 0;
        assert_eq!(Msg::decode(&b), Err(WireError::Kind(0)));
        // A request for local-only rights, or none, or unknown bits.
        for bits in [0, AccessFlags::LOCAL_WRITE.bits(), 1 << 31] {
            let mut b = Msg::Request {
                id: 1,
                len: 8,
                access: AccessFlags::REMOTE_READ,
            }
            .encode();
            b[36..40].copy_from_slice(&bits.to_be_bytes());
            assert_eq!(Msg::decode(&b), Err(WireError::Access(bits)));
        }
    }

    proptest! {
        #[test]
        fn decode_is_total(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = Msg::decode(&bytes);
        }

        #[test]
        fn decoded_messages_encode_to_the_same_bytes(bytes in prop::array::uniform32(any::<u8>()), tail in any::<[u8; 8]>()) {
            let mut b = [0u8; MSG_LEN];
            b[..32].copy_from_slice(&bytes[..]);
            b[32..].copy_from_slice(&tail);
            b[0..4].copy_from_slice(&MAGIC);
            b[4] = VERSION;
            b[5] = 1 + bytes[5] % 6; // a known kind, mostly
            if let Ok(m) = Msg::decode(&b) {
                // Fields a kind does not use are not kept: compare re-decoded values.
                prop_assert_eq!(Msg::decode(&m.encode()), Ok(m));
            }
        }
    }
}
