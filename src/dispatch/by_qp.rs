//! Which inbox a queue pair on a shared receive queue routes to.
//!
//! A receive posted on a shared receive queue names a buffer, not a channel: whichever
//! queue pair's message arrives consumes it. Its completion carries the `wr_id` of the
//! buffer ([`WrId::shared_recv`](crate::wr_id::WrId::shared_recv)) and the `qp_num` of the
//! queue pair that consumed it, so the dispatcher routes it by `qp_num`, through this
//! table.
//!
//! An open-addressing table with linear probing, twice as many slots as inboxes (at most
//! one queue pair is bound per inbox, so it is never more than half full and every probe
//! ends at an empty slot). A slot is 0 when empty, else `BOUND | qp_num << 24 |
//! generation << 16 | inbox`.
//!
//! Invariant: the table is written (bind, unbind) and read (route) only with the poll
//! right held, whose release at the end of a turn and acquire at the start of the next
//! order every access; its atomics are relaxed and exist only because the table is reached
//! through `&self`.

use crate::sync::{AtomicU64, Ordering};

const BOUND: u64 = 1 << 63;

/// The qp_num → inbox table; empty (no slots) on a dispatcher made without it.
pub(super) struct ByQp {
    slots: std::boxed::Box<[AtomicU64]>,
}

impl ByQp {
    /// A table with no slots: every lookup misses, every bind is refused.
    pub(super) fn none() -> Self {
        ByQp {
            slots: std::boxed::Box::new([]),
        }
    }

    /// Room for one queue pair per inbox.
    pub(super) fn for_inboxes(inboxes: usize) -> Self {
        let len = (2 * inboxes).next_power_of_two().max(2);
        ByQp {
            slots: (0..len).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(super) fn is_enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    /// The inbox and generation `qp_num` is bound to. Poll right held.
    #[inline]
    pub(super) fn find(&self, qp_num: u32) -> Option<(u16, u8)> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(qp_num);
        loop {
            let e = self.load(i);
            if e == 0 {
                return None;
            }
            if qp_of(e) == qp_num {
                return Some((e as u16, (e >> 16) as u8));
            }
            i = self.next(i);
        }
    }

    /// Binds `qp_num` to the inbox `index` attached as `generation`, replacing an earlier
    /// binding of the same queue pair. Poll right held; the table enabled and at most one
    /// queue pair bound per inbox (the caller's checks), so an empty slot is always found.
    pub(super) fn bind(&self, qp_num: u32, index: u16, generation: u8) {
        let e = BOUND | (qp_num as u64) << 24 | (generation as u64) << 16 | index as u64;
        let mut i = self.home(qp_num);
        while self.load(i) != 0 && qp_of(self.load(i)) != qp_num {
            i = self.next(i);
        }
        self.slots[i].store(e, Ordering::Relaxed);
    }

    /// Removes `qp_num`'s binding, if any. Poll right held. Backward-shift deletion: the
    /// entries after it that probed past its slot move back, so no probe stops early.
    pub(super) fn unbind(&self, qp_num: u32) {
        if self.slots.is_empty() {
            return;
        }
        let mut hole = self.home(qp_num);
        loop {
            match self.load(hole) {
                0 => return,
                e if qp_of(e) == qp_num => break,
                _ => hole = self.next(hole),
            }
        }
        let mut j = hole;
        loop {
            j = self.next(j);
            let e = self.load(j);
            if e == 0 {
                break;
            }
            // `e` may fill the hole unless its home lies cyclically in (hole, j].
            let home = self.home(qp_of(e));
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole].store(e, Ordering::Relaxed);
                hole = j;
            }
        }
        self.slots[hole].store(0, Ordering::Relaxed);
    }

    #[inline]
    fn load(&self, i: usize) -> u64 {
        self.slots[i].load(Ordering::Relaxed)
    }

    /// Fibonacci hashing: consecutive queue pair numbers spread over the table.
    #[inline]
    fn home(&self, qp_num: u32) -> usize {
        (qp_num.wrapping_mul(0x9E37_79B9) as usize) & (self.slots.len() - 1)
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        (i + 1) & (self.slots.len() - 1)
    }
}

#[inline]
fn qp_of(e: u64) -> u32 {
    (e >> 24) as u32
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Binds, rebinds and unbinds in a table with collisions everywhere (8 slots, many
    /// queue pairs), checked against a plain map after every step.
    #[test]
    fn the_table_agrees_with_a_map_through_binds_and_unbinds() {
        let t = ByQp::for_inboxes(4);
        let mut model = std::collections::HashMap::new();
        let mut x = 12345u64;
        for step in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let qp = (x % 12) as u32 * 8; // many share a home
            if model.len() < 4 && x & 0x100 != 0 {
                let (inbox, generation) = ((x >> 20) as u16 % 4, (x >> 30) as u8);
                t.bind(qp, inbox, generation);
                model.insert(qp, (inbox, generation));
            } else {
                t.unbind(qp);
                model.remove(&qp);
            }
            for q in 0..12u32 {
                let q = q * 8;
                assert_eq!(t.find(q), model.get(&q).copied(), "step {step}, qp {q}");
            }
        }
    }

    #[test]
    fn a_table_without_slots_finds_nothing() {
        let t = ByQp::none();
        assert!(!t.is_enabled());
        assert_eq!(t.find(7), None);
        t.unbind(7);
    }
}
