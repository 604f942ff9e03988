//! Barrier messages on the wire between nodes: 32 bits, the low half of the word written
//! into the receiver's flag slot ([`super::flags`]); and the barrier window a node tells
//! each peer, in the endpoint exchange.
//!
//! Message layout (most significant first): `kind` 2 bits (1 ARRIVE, 2 RELEASE, 3 ROUND), `round`
//! 5 bits, `epoch` 25 bits. The epoch is the count of barriers the two nodes took part in
//! together, modulo 2^25; a receiver only ever compares it with its own count for that
//! peer and the one after, so the wrap is harmless.

use super::barrier::{Msg, MsgKind};
use crate::mr::RemoteRegion;

/// Bytes of an encoded barrier window: address, length, remote key (big-endian).
pub(crate) const WINDOW_LEN: usize = 20;

/// Encodes a barrier window.
pub(crate) fn encode_window(w: &RemoteRegion) -> [u8; WINDOW_LEN] {
    let mut b = [0u8; WINDOW_LEN];
    b[..8].copy_from_slice(&w.addr.to_be_bytes());
    b[8..16].copy_from_slice(&w.len.to_be_bytes());
    b[16..].copy_from_slice(&w.rkey.to_be_bytes());
    b
}

/// Decodes a barrier window: `None` unless `b` is exactly [`WINDOW_LEN`] bytes. Any values
/// are taken: a node checks the length it needs when it connects, and the peer's device
/// refuses a write outside the peer's region.
pub(crate) fn decode_window(b: &[u8]) -> Option<RemoteRegion> {
    let b: &[u8; WINDOW_LEN] = b.try_into().ok()?;
    let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    Some(RemoteRegion {
        addr: u64_at(0),
        len: u64_at(8),
        rkey: u32::from_be_bytes([b[16], b[17], b[18], b[19]]),
    })
}

/// Bits of the pairwise epoch carried on the wire.
pub(crate) const EPOCH_BITS: u32 = 25;
/// Mask of the pairwise epoch.
pub(crate) const EPOCH_MASK: u32 = (1 << EPOCH_BITS) - 1;

/// Encodes `kind`, `round` and the pairwise epoch `epoch` (truncated to 25 bits).
pub(crate) fn encode(kind: MsgKind, round: u8, epoch: u32) -> u32 {
    let k = match kind {
        MsgKind::Arrive => 1,
        MsgKind::Release => 2,
        MsgKind::Round => 3,
    };
    (k << 30) | (u32::from(round & 0x1f) << EPOCH_BITS) | (epoch & EPOCH_MASK)
}

/// Decodes immediate data into `(kind, round, epoch bits)`; `None` for kind 0.
pub(crate) fn decode(imm: u32) -> Option<(MsgKind, u8, u32)> {
    let kind = match imm >> 30 {
        1 => MsgKind::Arrive,
        2 => MsgKind::Release,
        3 => MsgKind::Round,
        _ => return None,
    };
    Some((kind, ((imm >> EPOCH_BITS) & 0x1f) as u8, imm & EPOCH_MASK))
}

/// The machine-side message for a decoded one (machines of one barrier run epoch 1).
pub(crate) fn to_msg(kind: MsgKind, round: u8) -> Msg {
    Msg {
        epoch: 1,
        round,
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_kind_zero() {
        for kind in [MsgKind::Arrive, MsgKind::Release, MsgKind::Round] {
            for round in [0u8, 1, 15, 31] {
                for epoch in [0u32, 1, EPOCH_MASK, EPOCH_MASK + 5] {
                    let got = decode(encode(kind, round, epoch)).unwrap();
                    assert_eq!(got, (kind, round, epoch & EPOCH_MASK));
                }
            }
        }
        assert_eq!(decode(0x0000_0001), None);
    }

    #[test]
    fn windows_round_trip_and_need_their_length() {
        let w = RemoteRegion {
            addr: 0x0102_0304_0506_0708,
            len: 16,
            rkey: 0xdead_beef,
        };
        assert_eq!(decode_window(&encode_window(&w)), Some(w));
        assert_eq!(decode_window(&encode_window(&w)[..19]), None);
        assert_eq!(decode_window(&[0u8; 21]), None);
    }
}
