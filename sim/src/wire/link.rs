//! The links: timing, packet faults, partitions, and whether a packet arrives.
//!
//! Each device has one port on the wire ([`Port`]): its link state, whether the device
//! crashed, its scripted faults, and when its egress is free again. A packet is judged
//! once when it leaves ([`Wire::transmit`]: link state, partition, scripted and random
//! faults, in that order, each drawing from the seeded generator only when its
//! probability is non-zero) and once when it arrives ([`Wire::arrival`]: crash and link
//! state of the destination). The wire decides and times; the HCA that sent the packet
//! traces the verdict and schedules the arrival.

use super::packet::{DropReason, Packet, PacketKind};
use crate::config::FabricConfig;
use crate::rng::Rng;

/// Bytes of headers per packet (per path-MTU segment) on the wire.
pub(crate) const HEADER_BYTES: u64 = 64;

/// A device's port, as the wire sees it.
#[derive(Debug)]
pub(crate) struct Port {
    /// The port's link is up (`Fabric::link_down` / `link_up`).
    pub(crate) link_up: bool,
    /// The device crashed (for good): nothing leaves or reaches it.
    pub(crate) crashed: bool,
    /// Packets leaving the device still to drop (`Fabric::drop_next`).
    pub(crate) drop_next: u32,
    /// Responses leaving the device still to corrupt (`Fabric::corrupt_next_response`).
    pub(crate) corrupt_next: u32,
    /// The egress port is busy serialising until this time.
    pub(crate) busy_until: u64,
}

/// The wire between the devices: their ports (by device index), the partitions, and the
/// seeded generator that decides random faults.
#[derive(Debug)]
pub(crate) struct Wire {
    pub(crate) ports: Vec<Port>,
    /// Partitioned device pairs, `(low, high)`.
    pub(crate) partitions: Vec<(usize, usize)>,
    rng: Rng,
}

/// What becomes of a packet put on the wire.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Transit {
    /// Lost on the way.
    Lost(DropReason),
    /// Arrives at time `at`, after a random extra `delay` (ns) if one was drawn, and
    /// `twice` when a random duplicate follows it.
    Arrives {
        at: u64,
        delay: Option<u64>,
        twice: bool,
    },
}

impl Wire {
    /// A wire without ports whose random faults `seed` decides.
    pub(crate) fn new(seed: u64) -> Wire {
        Wire {
            ports: Vec::new(),
            partitions: Vec::new(),
            rng: Rng::new(seed),
        }
    }

    /// Connects the port of a new device (the next index), link up.
    pub(crate) fn add_port(&mut self) {
        self.ports.push(Port {
            link_up: true,
            crashed: false,
            drop_next: 0,
            corrupt_next: 0,
            busy_until: 0,
        });
    }

    /// Whether packets between `a` and `b` are lost on the way.
    #[inline(always)]
    pub(crate) fn blocked(&self, a: usize, b: usize) -> Option<DropReason> {
        let (da, db) = (&self.ports[a], &self.ports[b]);
        if da.crashed || db.crashed {
            return Some(DropReason::Crash);
        }
        if !da.link_up || !db.link_up {
            return Some(DropReason::LinkDown);
        }
        let key = (a.min(b), a.max(b));
        self.partitions
            .contains(&key)
            .then_some(DropReason::Partition)
    }

    /// Whether a scripted fault waits on device `dev`'s egress (a drop or a corruption).
    #[inline]
    pub(crate) fn scripted(&self, dev: usize) -> bool {
        let p = &self.ports[dev];
        p.drop_next > 0 || p.corrupt_next > 0
    }

    /// Puts `pkt` (`bytes` on the wire) on the link at time `now`: lost, or when it
    /// arrives. A scripted corruption turns a response into [`PacketKind::Bad`] in place.
    pub(crate) fn transmit(
        &mut self,
        pkt: &mut Packet,
        bytes: u64,
        now: u64,
        cfg: &FabricConfig,
    ) -> Transit {
        let (src, dst) = (pkt.src_dev as usize, pkt.dst_dev as usize);
        if let Some(why) = self.blocked(src, dst) {
            return Transit::Lost(why);
        }
        let d = &mut self.ports[src];
        if d.drop_next > 0 {
            d.drop_next -= 1;
            return Transit::Lost(DropReason::Scripted);
        }
        if pkt.kind != PacketKind::Request && d.corrupt_next > 0 {
            d.corrupt_next -= 1;
            pkt.kind = PacketKind::Bad;
        }
        let faults = cfg.faults;
        if self.rng.chance(faults.drop) {
            return Transit::Lost(DropReason::Random);
        }
        let link = cfg.link;
        let d = &mut self.ports[src];
        let start = d.busy_until.max(now);
        d.busy_until = start.saturating_add(link.serialisation_ns(bytes));
        let mut at = d.busy_until.saturating_add(link.latency_ns);
        let mut delay = None;
        if self.rng.chance(faults.delay) {
            let extra = self.rng.upto(faults.max_extra_delay_ns);
            delay = Some(extra);
            at = at.saturating_add(extra);
        }
        let twice = self.rng.chance(faults.duplicate);
        Transit::Arrives { at, delay, twice }
    }

    /// Whether a packet reaching device `dst` is lost there (it crashed, or its link is
    /// down).
    pub(crate) fn arrival(&self, dst: usize) -> Option<DropReason> {
        let port = &self.ports[dst];
        if port.crashed {
            Some(DropReason::Crash)
        } else if !port.link_up {
            Some(DropReason::LinkDown)
        } else {
            None
        }
    }

    /// Cuts devices `a` and `b` off from each other (both directions).
    pub(crate) fn partition(&mut self, a: usize, b: usize) {
        let key = (a.min(b), a.max(b));
        if !self.partitions.contains(&key) {
            self.partitions.push(key);
        }
    }

    /// Undoes [`Wire::partition`] of `a` and `b`.
    pub(crate) fn heal(&mut self, a: usize, b: usize) {
        self.partitions.retain(|&p| p != (a.min(b), a.max(b)))
    }
}
