//! Barrier messages on the wire between nodes: 32 bits of immediate data on a zero-length
//! SEND_WITH_IMM, so a barrier needs no registered memory at all.
//!
//! Layout (most significant first): `kind` 2 bits (1 ARRIVE, 2 RELEASE, 3 ROUND), `round`
//! 5 bits, `epoch` 25 bits. The epoch is the count of barriers the two nodes took part in
//! together, modulo 2^25; a receiver only ever compares it with its own count for that
//! peer and the one after, so the wrap is harmless.

use super::barrier::{Msg, MsgKind};

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
}
