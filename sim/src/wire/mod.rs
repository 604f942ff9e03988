//! The wire: what travels between devices.
//!
//! - [`packet`]: a packet (one whole message of a queue pair: its PSN range, its kind) and
//!   PSN arithmetic.

pub(crate) mod packet;

pub use packet::PacketKind;
pub(crate) use packet::{psn_diff, Packet, PSN_MASK};
