//! Simulated time: the clock ([`Sched`]), the event queue (packets in flight and timers)
//! and its order.
//!
//! Packets in flight sit in a binary heap, timers (at most one per queue pair) in an
//! indexed heap that moves or cancels a timer in place. Events run in (time, class,
//! sequence) order: at equal times packets (class 0) before timers (class 1), so an
//! instant timer fires only once the packets of that instant have settled. Both heaps are
//! preallocated as queue pairs are created: per queue pair
//! `(max_send_wr + max_recv_wr) * 2 + 2` packets and one timer. Only faults (duplicates, retransmissions of many requests
//! at once) can push the packet heap past that bound, and then it grows.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::atomic::{self, AtomicBool};
use std::sync::Arc;
use std::time::Instant;

use crate::wire::packet::Packet;

/// Simulated time and what is scheduled in it.
#[derive(Debug)]
pub(crate) struct Sched {
    /// Threaded mode: time zero (simulated time follows the wall clock from it).
    start: Instant,
    /// Simulated time, ns.
    pub(crate) now: u64,
    pub(crate) events: Events,
}

impl Sched {
    pub(crate) fn new() -> Sched {
        Sched {
            start: Instant::now(),
            now: 0,
            events: Events::new(),
        }
    }

    /// Wall-clock nanoseconds since the fabric was created.
    pub(crate) fn wall(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// What happens at an event.
#[derive(Clone, Copy, Debug)]
pub(crate) enum EvKind {
    /// A packet arrives at `dst_dev`.
    Deliver(Packet),
    /// The timer of QP slot `qp` is due.
    Timer { qp: u32 },
}

/// A packet in flight.
#[derive(Clone, Copy, Debug)]
struct Flight {
    time: u64,
    seq: u64,
    pkt: Packet,
}

impl PartialEq for Flight {
    fn eq(&self, o: &Self) -> bool {
        (self.time, self.seq) == (o.time, o.seq)
    }
}

impl Eq for Flight {}

impl PartialOrd for Flight {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Flight {
    /// Reversed, so the max-heap pops the earliest packet.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.time, o.seq).cmp(&(self.time, self.seq))
    }
}

/// One armed timer: (deadline, arming sequence, QP slot).
type Armed = (u64, u64, u32);

/// Slot position meaning "not armed".
const UNARMED: u32 = u32::MAX;

/// A binary min-heap of at most one timer per QP slot, indexed by slot so that a timer can
/// be moved or cancelled in O(log n): cancelled timers leave nothing behind.
#[derive(Debug, Default)]
struct Timers {
    heap: Vec<Armed>,
    /// Heap position of each slot's timer, or `UNARMED`.
    pos: Vec<u32>,
}

impl Timers {
    fn swap(&mut self, i: usize, j: usize) {
        self.heap.swap(i, j);
        self.pos[self.heap[i].2 as usize] = i as u32;
        self.pos[self.heap[j].2 as usize] = j as u32;
    }

    fn up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent] <= self.heap[i] {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut min = i;
            if l < self.heap.len() && self.heap[l] < self.heap[min] {
                min = l;
            }
            if r < self.heap.len() && self.heap[r] < self.heap[min] {
                min = r;
            }
            if min == i {
                return;
            }
            self.swap(i, min);
            i = min;
        }
    }

    /// Makes room for slot `slot` (called as queue pairs are created).
    /// A position for `slot`'s timer, and with `heap` room for every slot's timer armed at
    /// once (else the heap grows as timers are armed).
    fn reserve(&mut self, slot: usize, heap: bool) {
        if self.pos.len() <= slot {
            self.pos.resize(slot + 1, UNARMED);
        }
        let want = self.pos.len();
        if heap && self.heap.capacity() < want {
            self.heap.reserve(want - self.heap.len());
        }
    }

    fn set(&mut self, slot: u32, time: u64, seq: u64) {
        self.reserve(slot as usize, false);
        match self.pos[slot as usize] {
            UNARMED => {
                self.heap.push((time, seq, slot));
                let i = self.heap.len() - 1;
                self.pos[slot as usize] = i as u32;
                self.up(i);
            }
            p => {
                let i = p as usize;
                self.heap[i] = (time, seq, slot);
                self.up(i);
                let i = self.pos[slot as usize] as usize;
                self.down(i);
            }
        }
    }

    fn cancel(&mut self, slot: u32) {
        let Some(&p) = self.pos.get(slot as usize) else {
            return;
        };
        if p == UNARMED {
            return;
        }
        let i = p as usize;
        let last = self.heap.len() - 1;
        self.swap(i, last);
        self.heap.pop();
        self.pos[slot as usize] = UNARMED;
        if i < self.heap.len() {
            self.up(i);
            let i = self.pos[self.heap[i].2 as usize] as usize;
            self.down(i);
        }
    }

    fn peek(&self) -> Option<Armed> {
        self.heap.first().copied()
    }

    fn pop(&mut self) -> Option<Armed> {
        let top = self.peek()?;
        self.cancel(top.2);
        Some(top)
    }
}

/// A due event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    pub(crate) time: u64,
    pub(crate) kind: EvKind,
}

/// The event queue: packets in flight (a binary heap) and one timer per queue pair (an
/// indexed heap, so re-arming or cancelling a timer leaves no stale event behind).
///
/// Events run in (time, class, sequence) order: at equal times packets before timers,
/// then in the order they were scheduled (a timer's place is its latest arming).
#[derive(Debug)]
pub(crate) struct Events {
    packets: BinaryHeap<Flight>,
    timers: Timers,
    seq: u64,
    reserved: usize,
    /// Mirrors `!is_empty()` for lock-free readers (`Cq::poll`); written under the
    /// world's lock.
    pending: Arc<crate::padded::Padded<AtomicBool>>,
    /// Never set: the flag of readers for whom nothing would run on the lock's side
    /// (stepped mode without auto-step), so that they never lock.
    quiet: Arc<crate::padded::Padded<AtomicBool>>,
    /// The clock thread, while it sleeps until `wake_at` (threaded mode, timed):
    /// an event scheduled earlier wakes it (`api/comp_channel.rs`).
    pub(crate) clock: Option<ClockWake>,
}

/// A sleeping clock thread and the time it wakes at by itself.
#[derive(Debug)]
pub(crate) struct ClockWake {
    pub(crate) thread: std::thread::Thread,
    pub(crate) wake_at: u64,
}

impl Drop for ClockWake {
    /// The fabric is gone (or the thread stops sleeping): wake it, so that it sees so.
    fn drop(&mut self) {
        self.thread.unpark();
    }
}

impl Events {
    pub(crate) fn new() -> Events {
        Events {
            packets: BinaryHeap::new(),
            timers: Timers::default(),
            seq: 0,
            reserved: 0,
            pending: Arc::new(crate::padded::Padded(AtomicBool::new(false))),
            quiet: Arc::new(crate::padded::Padded(AtomicBool::new(false))),
            clock: None,
        }
    }

    /// Makes room for `n` more packets in flight and a timer for QP slot `slot` (called as
    /// queue pairs are created); `lazy`: the timer heap grows as timers are armed instead
    /// (as the packets do when `n` is 0), so a world of mostly idle queue pairs holds room
    /// for the timers armed at once, not one per queue pair.
    pub(crate) fn reserve(&mut self, n: usize, slot: usize, lazy: bool) {
        self.reserved += n;
        if self.packets.capacity() < self.reserved {
            self.packets.reserve(self.reserved - self.packets.len());
        }
        self.timers.reserve(slot, !lazy);
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Schedules the arrival of `pkt` at `time`.
    pub(crate) fn push_packet(&mut self, time: u64, pkt: Packet) {
        let seq = self.next_seq();
        self.packets.push(Flight { time, seq, pkt });
        self.pending.store(true, atomic::Ordering::Release);
        self.wake_clock(time);
    }

    /// Wakes the sleeping clock thread if an event now falls due before it would wake.
    #[inline]
    fn wake_clock(&mut self, time: u64) {
        if let Some(c) = &mut self.clock {
            if time < c.wake_at {
                c.wake_at = time;
                c.thread.unpark();
            }
        }
    }

    /// Arms (or moves) the timer of QP slot `slot` to `time`.
    pub(crate) fn set_timer(&mut self, slot: usize, time: u64) {
        let seq = self.next_seq();
        self.timers.set(slot as u32, time, seq);
        self.pending.store(true, atomic::Ordering::Release);
        self.wake_clock(time);
    }

    /// Disarms the timer of QP slot `slot`, if armed.
    pub(crate) fn cancel_timer(&mut self, slot: usize) {
        self.timers.cancel(slot as u32);
        self.note_if_empty();
    }

    fn note_if_empty(&self) {
        if self.is_empty() {
            self.pending.store(false, atomic::Ordering::Release);
        }
    }

    /// A flag that is true exactly while events are scheduled, for readers without the
    /// world's lock.
    pub(crate) fn pending_flag(&self) -> Arc<crate::padded::Padded<AtomicBool>> {
        self.pending.clone()
    }

    /// A flag that is never set, for readers that lock only to run what is due, where
    /// nothing is run for them.
    pub(crate) fn quiet_flag(&self) -> Arc<crate::padded::Padded<AtomicBool>> {
        self.quiet.clone()
    }

    /// Whether the next packet runs before the next timer.
    fn packet_first(&self) -> Option<bool> {
        match (self.packets.peek(), self.timers.peek()) {
            (None, None) => None,
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
            (Some(p), Some(t)) => Some(p.time <= t.0),
        }
    }

    /// Time of the next event.
    pub(crate) fn next_time(&self) -> Option<u64> {
        match self.packet_first()? {
            true => self.packets.peek().map(|p| p.time),
            false => self.timers.peek().map(|t| t.0),
        }
    }

    pub(crate) fn pop(&mut self) -> Option<Event> {
        let ev = self.pop_inner();
        self.note_if_empty();
        ev
    }

    fn pop_inner(&mut self) -> Option<Event> {
        if self.packet_first()? {
            let f = self.packets.pop()?;
            Some(Event {
                time: f.time,
                kind: EvKind::Deliver(f.pkt),
            })
        } else {
            let (time, _, qp) = self.timers.pop()?;
            Some(Event {
                time,
                kind: EvKind::Timer { qp },
            })
        }
    }

    /// Whether no event is scheduled.
    pub(crate) fn is_empty(&self) -> bool {
        self.packets.is_empty() && self.timers.heap.is_empty()
    }

    /// Events scheduled (packets in flight and armed timers).
    pub(crate) fn len(&self) -> usize {
        self.packets.len() + self.timers.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::packet::PacketKind;

    fn pkt(psn: u32) -> Packet {
        Packet {
            src_dev: 0,
            dst_dev: 0,
            src_qpn: 0,
            dst_qpn: 0,
            psn,
            npkts: 1,
            epoch: 0,
            kind: PacketKind::Ack,
            dgram: 0,
        }
    }

    fn order(q: &mut Events) -> Vec<(u64, char, u32)> {
        std::iter::from_fn(|| q.pop())
            .map(|e| match e.kind {
                EvKind::Timer { qp } => (e.time, 't', qp),
                EvKind::Deliver(p) => (e.time, 'p', p.psn),
            })
            .collect()
    }

    #[test]
    fn events_pop_by_time_then_class_then_insertion() {
        let mut q = Events::new();
        q.set_timer(1, 5);
        q.set_timer(2, 3);
        q.set_timer(3, 3);
        q.push_packet(3, pkt(7));
        q.push_packet(3, pkt(8));
        assert_eq!(q.len(), 5);
        let want = [
            (3, 'p', 7),
            (3, 'p', 8),
            (3, 't', 2),
            (3, 't', 3),
            (5, 't', 1),
        ];
        assert_eq!(order(&mut q), want);
    }

    #[test]
    fn timers_move_and_cancel_without_leftovers() {
        let mut q = Events::new();
        for slot in 0..50 {
            q.set_timer(slot, 1_000 - slot as u64 * 7 % 13);
        }
        for slot in (0..50).step_by(3) {
            q.cancel_timer(slot);
        }
        q.set_timer(4, 1);
        q.set_timer(5, 2_000);
        q.cancel_timer(99); // never armed
        let got = order(&mut q);
        assert_eq!(got.len(), 50 - 17);
        assert_eq!(got[0], (1, 't', 4));
        assert_eq!(*got.last().unwrap(), (2_000, 't', 5));
        assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "{got:?}");
        assert!(got.iter().all(|g| g.2 % 3 != 0));
        assert_eq!(q.len(), 0);
    }
}
