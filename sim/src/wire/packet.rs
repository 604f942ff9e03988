//! A packet on the wire, why one is lost, and 24-bit PSN arithmetic.

use crate::types::WcStatus;

/// PSNs are 24-bit.
pub(crate) const PSN_MASK: u32 = (1 << 24) - 1;

/// `a - b` in 24-bit PSN space.
pub(crate) fn psn_diff(a: u32, b: u32) -> u32 {
    a.wrapping_sub(b) & PSN_MASK
}

/// What a packet says (as the trace reports it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PacketKind {
    /// A request (the operation is the requester's send-queue entry with this PSN).
    Request,
    /// Positive acknowledgement of every PSN up to this one.
    Ack,
    /// Read response. (In-process shortcut: the data lands when the read executes at the
    /// responder; the requester completes the read when this arrives.)
    ReadResp,
    /// Atomic response (the old value already landed).
    AtomicResp,
    /// RNR NAK carrying the responder's timer code.
    Rnr(u8),
    /// NAK with the requester's completion status.
    Nak(WcStatus),
    /// A response corrupted into an opcode the requester does not expect.
    Bad,
    /// An unreliable datagram: one whole message, no response.
    Datagram,
}

impl PacketKind {
    /// The name the Chrome trace uses (`"request"`, `"ack"`, `"rnr_nak"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            PacketKind::Request => "request",
            PacketKind::Ack => "ack",
            PacketKind::ReadResp => "read_response",
            PacketKind::AtomicResp => "atomic_response",
            PacketKind::Rnr(_) => "rnr_nak",
            PacketKind::Nak(_) => "nak",
            PacketKind::Bad => "bad_response",
            PacketKind::Datagram => "datagram",
        }
    }
}

/// Why a packet was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// A random fault ([`Faults::drop`](crate::Faults::drop)).
    Random,
    /// [`Fabric::drop_next`](crate::Fabric::drop_next).
    Scripted,
    /// A link on the way is down.
    LinkDown,
    /// The two devices are partitioned.
    Partition,
    /// An end device crashed.
    Crash,
    /// The path names no device.
    NoRoute,
    /// No live queue pair has the destination number on that device.
    NoQp,
    /// The destination queue pair is not in a state that accepts the packet.
    NotReady,
    /// The packet does not come from the queue pair's connected peer.
    WrongSource,
    /// A request ahead of the expected PSN.
    OutOfOrder,
    /// A packet about work that no longer exists (flushed, reset, completed).
    Stale,
    /// A datagram for a queue pair with no receive posted (UD has no RNR).
    NoReceive,
    /// A datagram whose Q_Key is not the destination queue pair's.
    QKey,
    /// A datagram for a queue pair that is not unreliable-datagram, or an RC packet for
    /// one that is.
    WrongTransport,
    /// A datagram longer than the port's MTU: the sender emits nothing and completes the
    /// request successfully (IBTA C10-93.1.1).
    OverMtu,
    /// A datagram longer than the receive at the head of the queue (the global route
    /// header included): dropped, the receive kept (IBTA: silently dropped by the
    /// responder).
    ShortReceive,
}

impl DropReason {
    /// The reason as the Chrome trace writes it (`"random"`, `"link down"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Random => "random",
            DropReason::Scripted => "scripted",
            DropReason::LinkDown => "link down",
            DropReason::Partition => "partition",
            DropReason::Crash => "crash",
            DropReason::NoRoute => "no route",
            DropReason::NoQp => "no QP",
            DropReason::NotReady => "QP not ready",
            DropReason::WrongSource => "wrong source",
            DropReason::OutOfOrder => "out of order",
            DropReason::Stale => "stale",
            DropReason::NoReceive => "no receive",
            DropReason::QKey => "wrong Q_Key",
            DropReason::WrongTransport => "wrong transport",
            DropReason::OverMtu => "over MTU",
            DropReason::ShortReceive => "receive too short",
        }
    }
}

/// One packet (a whole message: PSNs `psn .. psn + npkts`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packet {
    pub(crate) src_dev: u32,
    pub(crate) dst_dev: u32,
    pub(crate) src_qpn: u32,
    pub(crate) dst_qpn: u32,
    pub(crate) psn: u32,
    pub(crate) npkts: u32,
    /// Requests: the requester QP's incarnation, so stale packets are recognised.
    pub(crate) epoch: u32,
    pub(crate) kind: PacketKind,
    /// A datagram: where its bytes wait in the net's store (`hca/ud.rs`); 0 otherwise.
    pub(crate) dgram: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psns_wrap() {
        assert_eq!(psn_diff(1, PSN_MASK), 2);
        assert_eq!(psn_diff(0, 1), PSN_MASK);
    }
}
