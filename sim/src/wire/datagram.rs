//! The bytes of unreliable datagrams on the wire.
//!
//! An RC packet carries no bytes: its responder reads the request from the requester's
//! send queue, which keeps it until acknowledged. A datagram's send completes as it leaves,
//! so its message travels apart: gathered into a slot here when sent, the packet carrying
//! the slot's index ([`Packet::dgram`](super::Packet)), and the slot freed when the last
//! packet carrying it (a duplicate is a second) is delivered or lost.

/// Bytes of global route header at the start of every UD receive buffer.
pub const GRH_BYTES: usize = 40;

/// One datagram on the wire: its message and what the receiver learns with it.
#[derive(Debug)]
pub(crate) struct Dgram {
    /// Packets (a duplicate is a second) still carrying it; the slot is free at 0.
    pub(crate) refs: u8,
    pub(crate) qkey: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) solicited: bool,
    /// The global route header the receive starts with; none when the sender's address
    /// handle had no global route.
    pub(crate) grh: Option<[u8; GRH_BYTES]>,
    /// The sender's service level and LID, as the receiver's completion reports them.
    pub(crate) sl: u8,
    pub(crate) slid: u16,
    /// The message; its capacity is kept when the slot is reused, so a fabric that keeps
    /// sending allocates nothing once its datagrams in flight stop growing.
    pub(crate) data: Vec<u8>,
}

/// The messages of datagrams in flight, by the index their packets carry.
#[derive(Debug, Default)]
pub(crate) struct Datagrams {
    pub(crate) slots: Vec<Dgram>,
    pub(crate) free: Vec<u32>,
}

impl Datagrams {
    /// A free slot, cleared, and its index.
    pub(crate) fn take(&mut self) -> (u32, &mut Dgram) {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Dgram {
                    refs: 0,
                    qkey: 0,
                    imm: None,
                    solicited: false,
                    grh: None,
                    sl: 0,
                    slid: 0,
                    data: Vec::new(),
                });
                (self.slots.len() - 1) as u32
            }
        };
        let d = &mut self.slots[i as usize];
        d.data.clear();
        (i, d)
    }

    /// One packet carrying slot `i` is gone; the slot is free after the last.
    pub(crate) fn release(&mut self, i: u32) {
        if let Some(d) = self.slots.get_mut(i as usize) {
            d.refs = d.refs.saturating_sub(1);
            if d.refs == 0 {
                self.free.push(i);
            }
        }
    }

    /// Datagrams in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}
