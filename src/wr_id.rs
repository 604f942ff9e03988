//! The `wr_id` layouts: what the library writes into a work request's 64-bit id and reads
//! back from its completion. Every layer that posts on a completion queue it shares with
//! another names its requests here, so that the layouts are read side by side and cannot
//! collide:
//!
//! - [`WrId`]: channels on a shared completion queue (the dispatcher routes by it);
//! - `RpcId`: the RPC engine's queue pairs on its one completion queue (datagram sends
//!   and receives, the bulk path's reads and release messages);
//! - `GroupId`: an [`SrqGroup`](crate::srq::SrqGroup)'s receive slots and peers' sends on
//!   its one completion queue.
//!
//! A channel on completion queues of its own uses its plain sequence number.

use core::fmt;

/// Bits of a [`WrId`] that carry the channel's sequence number.
pub const SEQ_BITS: u32 = 40;
/// The sequence part of a [`WrId`].
pub const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const INBOX_SHIFT: u32 = SEQ_BITS;
const GEN_SHIFT: u32 = 56;

/// A `wr_id` posted over a shared completion queue: bits 56..64 the inbox's attachment
/// generation, 40..56 the inbox index, 0..40 the low bits of the channel's sequence number
/// (a channel has at most its ring depth in flight, far below 2^40, so the low bits name
/// the request exactly; [`Ring`](crate::ring::Ring) widens them back).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WrId(pub u64);

impl WrId {
    /// Packs the three fields (`seq` is cut to its low [`SEQ_BITS`]).
    pub const fn new(inbox: u16, generation: u8, seq: u64) -> WrId {
        WrId(
            ((generation as u64) << GEN_SHIFT) | ((inbox as u64) << INBOX_SHIFT) | (seq & SEQ_MASK),
        )
    }
    /// The inbox (channel) index.
    pub const fn inbox(self) -> u16 {
        (self.0 >> INBOX_SHIFT) as u16
    }
    /// The inbox's attachment generation when the request was posted.
    pub const fn generation(self) -> u8 {
        (self.0 >> GEN_SHIFT) as u8
    }
    /// The low bits of the sequence number.
    pub const fn seq(self) -> u64 {
        self.0 & SEQ_MASK
    }
    /// The `wr_id` of a receive buffer posted on a shared receive queue: the inbox index no
    /// channel gets ([`SHARED_RECV_INBOX`]) and the buffer's number (cut to its low
    /// [`SEQ_BITS`]) as the sequence. The dispatcher routes its completion by the queue
    /// pair that consumed it ([`Dispatcher::bind_qp`](crate::dispatch::Dispatcher::bind_qp)).
    pub const fn shared_recv(buffer: u64) -> WrId {
        WrId::new(SHARED_RECV_INBOX, 0, buffer)
    }
    /// Whether this names a receive buffer of a shared receive queue.
    pub const fn is_shared_recv(self) -> bool {
        self.inbox() == SHARED_RECV_INBOX
    }
}

/// The inbox index a [`Dispatcher`](crate::dispatch::Dispatcher) never attaches: a
/// [`WrId`] with it is a [shared receive](WrId::shared_recv).
pub const SHARED_RECV_INBOX: u16 = u16::MAX;

impl fmt::Debug for WrId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WrId(inbox {}, gen {}, seq {})",
            self.inbox(),
            self.generation(),
            self.seq()
        )
    }
}

/// A `wr_id` of the RPC engine, whose datagram queue pair and bulk-path connections share
/// one completion queue:
///
/// | bits | meaning |
/// |---|---|
/// | 63 set | a datagram send; bits 0..63 its sequence number |
/// | 63 clear, 62 clear | a datagram receive; the id is its receive slot |
/// | 62 set, 61 set | a bulk release message sent by a client |
/// | 62 set, 60 set | a bulk receive for a release message (on the bulk path's shared receive queue: the completion's `qp_num` names the session) |
/// | 62 set, 61 and 60 clear | a bulk read; bits 32..60 the slot's generation, 0..32 the slot |
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RpcId {
    /// A datagram send with this sequence number (below 2^63).
    DatagramSend(u64),
    /// A datagram receive into this slot (below 2^62).
    DatagramRecv(u64),
    /// A bulk read for `slot`, posted while the slot had generation `gen`.
    BulkRead {
        /// The bulk slot.
        slot: u32,
        /// The slot's generation, cut to [`RpcId::GEN_MASK`].
        gen: u32,
    },
    /// A release message a client sent.
    ReleaseSend,
    /// A receive for a release message, on the queue the sessions' connections share.
    ReleaseRecv,
}

#[cfg(feature = "std")]
impl RpcId {
    /// The bits that say which: a datagram send, the bulk path, a release message sent, a
    /// release receive.
    const SEND_BIT: u64 = 1 << 63;
    const BULK_BIT: u64 = 1 << 62;
    const RELEASE_SEND: u64 = 1 << 61;
    const RELEASE_RECV: u64 = 1 << 60;

    /// The bits of a bulk slot's generation that an id carries.
    pub(crate) const GEN_MASK: u32 = 0x0fff_ffff;

    /// The id to post.
    #[inline]
    pub(crate) const fn encode(self) -> u64 {
        match self {
            RpcId::DatagramSend(seq) => seq | Self::SEND_BIT,
            RpcId::DatagramRecv(slot) => slot,
            RpcId::BulkRead { slot, gen } => {
                Self::BULK_BIT | ((gen & RpcId::GEN_MASK) as u64) << 32 | slot as u64
            }
            RpcId::ReleaseSend => Self::BULK_BIT | Self::RELEASE_SEND,
            RpcId::ReleaseRecv => Self::BULK_BIT | Self::RELEASE_RECV,
        }
    }

    /// What a completion's id names.
    #[inline]
    pub(crate) const fn decode(id: u64) -> RpcId {
        if id & Self::SEND_BIT != 0 {
            RpcId::DatagramSend(id & !Self::SEND_BIT)
        } else if id & Self::BULK_BIT == 0 {
            RpcId::DatagramRecv(id)
        } else if id & Self::RELEASE_SEND != 0 {
            RpcId::ReleaseSend
        } else if id & Self::RELEASE_RECV != 0 {
            RpcId::ReleaseRecv
        } else {
            RpcId::BulkRead {
                slot: id as u32,
                gen: (id >> 32) as u32 & RpcId::GEN_MASK,
            }
        }
    }
}

/// A `wr_id` of an [`SrqGroup`](crate::srq::SrqGroup): bit 63 set, a send from the peer in
/// bits 0..32; clear, a receive into the slot in bits 0..32. (A completion in error has
/// no defined opcode: the id alone must say which.)
#[cfg(feature = "std")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GroupId {
    /// A receive into this slot.
    Recv(u32),
    /// A send from this peer's buffer.
    Send(u32),
}

#[cfg(feature = "std")]
impl GroupId {
    const SEND_BIT: u64 = 1 << 63;

    /// The id to post.
    #[inline]
    pub(crate) const fn encode(self) -> u64 {
        match self {
            GroupId::Recv(slot) => slot as u64,
            GroupId::Send(peer) => Self::SEND_BIT | peer as u64,
        }
    }

    /// What a completion's id names, if it is one this layout makes.
    #[inline]
    pub(crate) fn decode(id: u64) -> Option<GroupId> {
        let low = u32::try_from(id & !Self::SEND_BIT).ok()?;
        Some(match id & Self::SEND_BIT {
            0 => GroupId::Recv(low),
            _ => GroupId::Send(low),
        })
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    #[test]
    fn rpc_ids_round_trip() {
        let ids = [
            RpcId::DatagramSend(0),
            RpcId::DatagramSend((1 << 63) - 1),
            RpcId::DatagramRecv(0),
            RpcId::DatagramRecv(4095),
            RpcId::BulkRead { slot: 0, gen: 0 },
            RpcId::BulkRead {
                slot: u32::MAX,
                gen: RpcId::GEN_MASK,
            },
            RpcId::ReleaseSend,
            RpcId::ReleaseRecv,
        ];
        for id in ids {
            assert_eq!(RpcId::decode(id.encode()), id, "{id:?}");
        }
    }

    #[test]
    fn group_ids_round_trip() {
        let ids = [
            GroupId::Recv(0),
            GroupId::Recv(u32::MAX),
            GroupId::Send(0),
            GroupId::Send(15),
        ];
        for id in ids {
            assert_eq!(GroupId::decode(id.encode()), Some(id));
        }
        assert_eq!(GroupId::decode(1 << 40), None, "no slot past 32 bits");
    }
}
