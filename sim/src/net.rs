//! The wire: link timing and packet faults.
//!
//! A packet is judged once when it leaves (link state, partition, scripted and random
//! faults, in that order, each drawing from the seeded generator only when its probability
//! is non-zero) and once when it arrives (crash and link state of the destination).

use crate::hca::World;
use crate::trace::{DropReason, TraceKind};
use crate::wire::{Packet, PacketKind};

/// Bytes of headers per packet (per path-MTU segment) on the wire.
pub(crate) const HEADER_BYTES: u64 = 64;

impl World {
    /// Whether packets between `a` and `b` are lost on the way.
    pub(crate) fn blocked(&self, a: usize, b: usize) -> Option<DropReason> {
        let (da, db) = (&self.devices[a], &self.devices[b]);
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

    /// Puts `pkt` (`bytes` on the wire) on the link, or loses it.
    pub(crate) fn send_pkt(&mut self, mut pkt: Packet, bytes: u64) {
        let (src, dst) = (pkt.src_dev as usize, pkt.dst_dev as usize);
        let (qpn, psn) = (pkt.src_qpn, Some(pkt.psn));
        let lose =
            |w: &mut World, kind, why| w.trace(src, qpn, TraceKind::Drop(kind, why), psn, None);
        if let Some(why) = self.blocked(src, dst) {
            return lose(self, pkt.kind, why);
        }
        let d = &mut self.devices[src];
        if d.drop_next > 0 {
            d.drop_next -= 1;
            return lose(self, pkt.kind, DropReason::Scripted);
        }
        if pkt.kind != PacketKind::Request && d.corrupt_next > 0 {
            d.corrupt_next -= 1;
            pkt.kind = PacketKind::Bad;
        }
        let faults = self.cfg.faults;
        if self.rng.chance(faults.drop) {
            return lose(self, pkt.kind, DropReason::Random);
        }
        let link = self.cfg.link;
        let d = &mut self.devices[src];
        let start = d.busy_until.max(self.now);
        d.busy_until = start.saturating_add(link.serialisation_ns(bytes));
        let mut at = d.busy_until.saturating_add(link.latency_ns);
        if self.rng.chance(faults.delay) {
            let extra = self.rng.upto(faults.max_extra_delay_ns);
            self.trace(src, qpn, TraceKind::Delay(pkt.kind, extra), psn, None);
            at = at.saturating_add(extra);
        }
        self.events.push_packet(at, pkt);
        if self.rng.chance(faults.duplicate) {
            self.trace(src, qpn, TraceKind::Duplicate(pkt.kind), psn, None);
            self.events.push_packet(at, pkt);
        }
    }

    /// A packet arrives: hands it to its queue pair, or loses it.
    pub(crate) fn deliver(&mut self, pkt: Packet) {
        let dst = pkt.dst_dev as usize;
        let (qpn, psn) = (pkt.dst_qpn, Some(pkt.psn));
        let dev = &self.devices[dst];
        let why = if dev.crashed {
            Some(DropReason::Crash)
        } else if !dev.link_up {
            Some(DropReason::LinkDown)
        } else {
            None
        };
        let q = self
            .qp_index(pkt.dst_qpn)
            .filter(|&q| self.qps.get(q).is_some_and(|qp| qp.dev == dst && !qp.dead));
        match (why, q) {
            (Some(why), _) => self.trace(dst, qpn, TraceKind::Drop(pkt.kind, why), psn, None),
            (None, None) => self.trace(
                dst,
                qpn,
                TraceKind::Drop(pkt.kind, DropReason::NoQp),
                psn,
                None,
            ),
            (None, Some(q)) => {
                self.trace(dst, qpn, TraceKind::Deliver(pkt.kind), psn, None);
                match pkt.kind {
                    PacketKind::Request => self.on_request(q, pkt),
                    _ => self.on_response(q, pkt),
                }
            }
        }
    }
}
