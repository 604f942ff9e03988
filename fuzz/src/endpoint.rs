//! Target `endpoint_decode`: the endpoint wire format.
//!
//! Invariants, for any input bytes:
//! - `Endpoint::decode` does not panic, and agrees exactly (value or error) with an
//!   independent reference decoder written from the format table in `src/qp/endpoint.rs`;
//! - an accepted input re-encodes to exactly the input bytes;
//! - every error and endpoint displays without panicking;
//! - an arbitrary *valid* endpoint built from the input round-trips:
//!   `decode(encode(ep)) == ep`, and its encoding is accepted by the reference decoder.

use arbitrary::{Arbitrary, Unstructured};
use zverbs::qp::{ENDPOINT_LEN, ENDPOINT_MAGIC, ENDPOINT_VERSION, MAX_24BIT};
use zverbs::{Endpoint, EndpointError, Gid, Mtu};

/// Decodes by the spec, field by field, in the documented order of checks.
pub fn reference_decode(b: &[u8]) -> Result<Endpoint, EndpointError> {
    if b.len() != 34 {
        return Err(EndpointError::Length { got: b.len() });
    }
    let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let magic = [b[0], b[1], b[2], b[3]];
    if &magic != b"ZVEP" {
        return Err(EndpointError::BadMagic(magic));
    }
    let version = u16::from_be_bytes([b[4], b[5]]);
    if version != 1 {
        return Err(EndpointError::UnsupportedVersion(version));
    }
    let mtu = match b[6] {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        m => return Err(EndpointError::BadMtu(m)),
    };
    if b[7] != 0 {
        return Err(EndpointError::ReservedNotZero(b[7]));
    }
    let qp_num = be32(8);
    if qp_num >= 1 << 24 {
        return Err(EndpointError::QpNumOutOfRange(qp_num));
    }
    let psn = be32(12);
    if psn >= 1 << 24 {
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

/// A valid endpoint built from fuzz input.
#[derive(Debug, Arbitrary)]
struct ValidEndpoint {
    qp_num: u32,
    psn: u32,
    lid: u16,
    gid: [u8; 16],
    mtu: u8,
}

impl ValidEndpoint {
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            qp_num: self.qp_num & MAX_24BIT,
            psn: self.psn & MAX_24BIT,
            lid: self.lid,
            gid: Gid(self.gid),
            mtu: Mtu::from_raw(self.mtu % 5 + 1).expect("1..=5 is a verbs MTU"),
        }
    }
}

/// Runs every invariant on `data`. Panics on a violation.
pub fn check(data: &[u8]) {
    assert_eq!(ENDPOINT_LEN, 34, "the documented length");
    assert_eq!(&ENDPOINT_MAGIC, b"ZVEP");
    assert_eq!(ENDPOINT_VERSION, 1);

    let got = Endpoint::decode(data);
    assert_eq!(
        got,
        reference_decode(data),
        "decode disagrees with the spec on {data:02x?}"
    );
    match got {
        Ok(ep) => {
            assert_eq!(
                &ep.encode()[..],
                data,
                "accepted bytes do not re-encode to themselves"
            );
            let _ = format!("{ep:?} {}", ep.gid);
        }
        Err(e) => {
            let _ = format!("{e} {e:?}");
        }
    }

    // Any valid endpoint survives a round trip.
    if let Ok(v) = ValidEndpoint::arbitrary(&mut Unstructured::new(data)) {
        let ep = v.endpoint();
        let bytes = ep.encode();
        assert_eq!(bytes.len(), ENDPOINT_LEN);
        assert_eq!(Endpoint::decode(&bytes), Ok(ep), "round trip of {ep:?}");
        assert_eq!(
            reference_decode(&bytes),
            Ok(ep),
            "encoding of {ep:?} breaks the spec"
        );
        // Any single-byte change either is rejected or decodes to a different endpoint
        // that re-encodes to the changed bytes: the format has no redundant bits.
        let i = data.first().map_or(0, |&b| usize::from(b) % ENDPOINT_LEN);
        let mut changed = bytes;
        changed[i] ^= data.get(1).copied().unwrap_or(0x01) | 1;
        if let Ok(other) = Endpoint::decode(&changed) {
            assert_ne!(other, ep, "byte {i} is ignored by decode");
            assert_eq!(other.encode(), changed);
        }
    }
}
