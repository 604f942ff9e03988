//! The wire: what travels between devices, and how.
//!
//! - [`packet`]: a packet (one whole message of a queue pair: its PSN range, its kind), why
//!   one is lost, and PSN arithmetic;
//! - [`datagram`]: the messages of unreliable datagrams in flight;
//! - [`link`]: the links: timing, packet faults, partitions, and delivery (whether a packet
//!   arrives, and when).

pub(crate) mod datagram;
pub(crate) mod link;
pub(crate) mod packet;

pub(crate) use datagram::{Datagrams, GRH_BYTES};
pub(crate) use link::{Transit, Wire, HEADER_BYTES};
pub(crate) use packet::{psn_diff, Packet, PSN_MASK};
pub use packet::{DropReason, PacketKind};
