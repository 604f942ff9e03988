//! The endpoint: what two queue pairs exchange out of band to connect, and its wire format.
//!
//! Wire format, version 1, 34 bytes, integers big-endian:
//!
//! | offset | size | field                                   |
//! |-------:|-----:|-----------------------------------------|
//! | 0      | 4    | magic `"ZVEP"`                          |
//! | 4      | 2    | version (1)                             |
//! | 6      | 1    | MTU (verbs value 1..=5)                 |
//! | 7      | 1    | reserved, zero                          |
//! | 8      | 4    | queue pair number (< 2^24)              |
//! | 12     | 4    | first packet sequence number (< 2^24)   |
//! | 16     | 2    | LID                                     |
//! | 18     | 16   | GID                                     |
//!
//! Decoding checks every field and rejects bad bytes with a typed [`EndpointError`].
//!
//! ```
//! use zverbs::{Endpoint, Gid, Mtu};
//! let ep = Endpoint { qp_num: 0x11, psn: 42, lid: 1, gid: Gid([0; 16]), mtu: Mtu::Mtu4096 };
//! let bytes = ep.encode();
//! assert_eq!(Endpoint::decode(&bytes), Ok(ep));
//! assert!(Endpoint::decode(&bytes[..10]).is_err());
//! ```

use core::fmt;

use crate::types::{Gid, Mtu};

/// Magic bytes that open an encoded endpoint.
pub const ENDPOINT_MAGIC: [u8; 4] = *b"ZVEP";
/// The wire format version this library writes and reads.
pub const ENDPOINT_VERSION: u16 = 1;
/// Length of an encoded endpoint.
pub const ENDPOINT_LEN: usize = 34;
/// Largest queue pair number or packet sequence number (24 bits).
pub const MAX_24BIT: u32 = (1 << 24) - 1;

/// How to reach a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Queue pair number.
    pub qp_num: u32,
    /// First packet sequence number the queue pair sends.
    pub psn: u32,
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Port GID.
    pub gid: Gid,
    /// Largest MTU the side can use.
    pub mtu: Mtu,
}

/// Why bytes are not a valid endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointError {
    /// Wrong length.
    Length {
        /// Bytes given.
        got: usize,
    },
    /// The magic is not `"ZVEP"`.
    BadMagic([u8; 4]),
    /// A version this library does not read.
    UnsupportedVersion(u16),
    /// Not a verbs MTU value.
    BadMtu(u8),
    /// The reserved byte is not zero.
    ReservedNotZero(u8),
    /// The queue pair number does not fit in 24 bits.
    QpNumOutOfRange(u32),
    /// The packet sequence number does not fit in 24 bits.
    PsnOutOfRange(u32),
}

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointError::Length { got } => {
                write!(f, "endpoint is {ENDPOINT_LEN} bytes, got {got}")
            }
            EndpointError::BadMagic(m) => write!(f, "bad endpoint magic {m:02x?}"),
            EndpointError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "endpoint version {v} unsupported (this library reads {ENDPOINT_VERSION})"
                )
            }
            EndpointError::BadMtu(m) => write!(f, "endpoint MTU value {m} is not 1..=5"),
            EndpointError::ReservedNotZero(b) => write!(f, "endpoint reserved byte is {b:#x}"),
            EndpointError::QpNumOutOfRange(q) => write!(f, "QP number {q:#x} exceeds 24 bits"),
            EndpointError::PsnOutOfRange(p) => write!(f, "PSN {p:#x} exceeds 24 bits"),
        }
    }
}

impl core::error::Error for EndpointError {}

impl Endpoint {
    /// Encodes into the wire format.
    pub fn encode(&self) -> [u8; ENDPOINT_LEN] {
        let mut b = [0u8; ENDPOINT_LEN];
        b[0..4].copy_from_slice(&ENDPOINT_MAGIC);
        b[4..6].copy_from_slice(&ENDPOINT_VERSION.to_be_bytes());
        b[6] = self.mtu as u8;
        b[8..12].copy_from_slice(&self.qp_num.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..18].copy_from_slice(&self.lid.to_be_bytes());
        b[18..34].copy_from_slice(&self.gid.0);
        b
    }

    /// Decodes and validates the wire format.
    pub fn decode(b: &[u8]) -> Result<Endpoint, EndpointError> {
        let b: &[u8; ENDPOINT_LEN] = b
            .try_into()
            .map_err(|_| EndpointError::Length { got: b.len() })?;
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != ENDPOINT_MAGIC {
            return Err(EndpointError::BadMagic(magic));
        }
        let version = u16::from_be_bytes([b[4], b[5]]);
        if version != ENDPOINT_VERSION {
            return Err(EndpointError::UnsupportedVersion(version));
        }
        let mtu = Mtu::from_raw(b[6]).ok_or(EndpointError::BadMtu(b[6]))?;
        if b[7] != 0 {
            return Err(EndpointError::ReservedNotZero(b[7]));
        }
        let qp_num = u32::from_be_bytes([b[8], b[9], b[10], b[11]]);
        if qp_num > MAX_24BIT {
            return Err(EndpointError::QpNumOutOfRange(qp_num));
        }
        let psn = u32::from_be_bytes([b[12], b[13], b[14], b[15]]);
        if psn > MAX_24BIT {
            return Err(EndpointError::PsnOutOfRange(psn));
        }
        let lid = u16::from_be_bytes([b[16], b[17]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[18..34]);
        Ok(Endpoint {
            qp_num,
            psn,
            lid,
            gid: Gid(gid),
            mtu,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Endpoint {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[15] = 9;
        Endpoint {
            qp_num: 0xabcdef,
            psn: 0x123456,
            lid: 0x0102,
            gid: Gid(g),
            mtu: Mtu::Mtu2048,
        }
    }

    #[test]
    fn layout_is_pinned() {
        let b = sample().encode();
        assert_eq!(&b[0..4], b"ZVEP");
        assert_eq!(&b[4..6], &[0, 1]);
        assert_eq!(b[6], 4);
        assert_eq!(&b[8..12], &[0, 0xab, 0xcd, 0xef]);
        assert_eq!(&b[12..16], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(&b[16..18], &[1, 2]);
        assert_eq!(b[18], 0xfe);
        assert_eq!(b[33], 9);
    }

    #[test]
    fn each_bad_field_has_its_error() {
        let good = sample().encode();
        let with = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            Endpoint::decode(&b)
        };
        assert_eq!(
            Endpoint::decode(&good[..33]),
            Err(EndpointError::Length { got: 33 })
        );
        assert_eq!(
            Endpoint::decode(&[0u8; 35]),
            Err(EndpointError::Length { got: 35 })
        );
        assert_eq!(with(0, b'X'), Err(EndpointError::BadMagic(*b"XVEP")));
        assert_eq!(with(5, 2), Err(EndpointError::UnsupportedVersion(2)));
        assert_eq!(with(6, 0), Err(EndpointError::BadMtu(0)));
        assert_eq!(with(6, 6), Err(EndpointError::BadMtu(6)));
        assert_eq!(with(7, 1), Err(EndpointError::ReservedNotZero(1)));
        assert_eq!(with(8, 1), Err(EndpointError::QpNumOutOfRange(0x01ab_cdef)));
        assert_eq!(
            with(12, 0x80),
            Err(EndpointError::PsnOutOfRange(0x8012_3456))
        );
    }

    proptest! {
        #[test]
        fn valid_endpoints_round_trip(qp in 0..=MAX_24BIT, psn in 0..=MAX_24BIT, lid: u16,
                                      gid: [u8; 16], mtu in 1u8..=5) {
            let ep = Endpoint { qp_num: qp, psn, lid, gid: Gid(gid), mtu: Mtu::from_raw(mtu).unwrap() };
            prop_assert_eq!(Endpoint::decode(&ep.encode()), Ok(ep));
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_accepted_ones_reencode(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(ep) = Endpoint::decode(&b) {
                prop_assert_eq!(&ep.encode()[..], &b[..]);
            }
        }
    }
}
