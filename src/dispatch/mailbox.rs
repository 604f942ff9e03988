//! One inbox: a bounded single-producer single-consumer ring of completions, plus the
//! attachment word that says whose it is.
//!
//! Invariants:
//! - `head` is written only by the producer (the poll-right holder), `tail` only by the
//!   consumer (the owner of the `Inbox` token); `tail <= head <= tail + cells.get().len()`.
//! - A cell at `i % len` with `tail <= i < head` is written (before `head` passes it, with
//!   a release store) and not yet read; the consumer reads it after an acquire load of
//!   `head` and frees it with a release store of `tail`, which the producer loads with
//!   acquire before writing the cell again.
//! - `owner` is `generation << 1 | attached`. Only attach sets the bit; only detach, with
//!   the poll right held, clears it, bumps the generation and empties the ring.

use crate::sync::{AtomicU64, AtomicUsize, Ordering, UnsafeCell};
use crate::types::WorkCompletion;

pub(super) type Boxes = std::boxed::Box<[Mailbox]>;

pub(super) fn boxes(inboxes: usize, capacity: usize) -> Boxes {
    (0..inboxes).map(|_| Mailbox::new(capacity)).collect()
}

/// Aligned to a cache-line pair: inboxes consumed by different threads share no line.
#[repr(align(128))]
pub(super) struct Mailbox {
    owner: AtomicU64,
    head: AtomicUsize,
    tail: AtomicUsize,
    cells: Cells,
}

/// A mailbox's ring of completions. A shallow one (at most `INLINE`, as the channels of a
/// node of a large world are) fits in the room the mailbox's alignment leaves anyway, so
/// it needs no allocation of its own.
enum Cells {
    Inline([UnsafeCell<WorkCompletion>; INLINE], usize),
    Heap(std::boxed::Box<[UnsafeCell<WorkCompletion>]>),
}

/// Completions a mailbox holds without an allocation.
const INLINE: usize = 2;

impl Cells {
    fn new(capacity: usize) -> Self {
        let blank = || UnsafeCell::new(WorkCompletion::EMPTY);
        if capacity <= INLINE {
            return Cells::Inline([blank(), blank()], capacity);
        }
        Cells::Heap((0..capacity).map(|_| blank()).collect())
    }

    /// The ring's cells (at least one).
    #[inline]
    fn get(&self) -> &[UnsafeCell<WorkCompletion>] {
        match self {
            Cells::Inline(cells, len) => &cells[..*len],
            Cells::Heap(cells) => cells,
        }
    }
}

// SAFETY: see the module invariants: a cell is written only by the one producer while it is
// outside `tail..head`, and read only by the one consumer while inside; the release/acquire
// pairs on `head` and `tail` order each write before its read and each read before the next
// write of the same cell.
unsafe impl Sync for Mailbox {}
// SAFETY: plain data; moving it moves no borrowed state.
unsafe impl Send for Mailbox {}

const ATTACHED: u64 = 1;

impl Mailbox {
    fn new(capacity: usize) -> Self {
        Mailbox {
            owner: AtomicU64::new(0),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            cells: Cells::new(capacity.max(1)),
        }
    }

    /// Marks the inbox attached; its generation, or `None` if it was attached already.
    pub(super) fn try_attach(&self) -> Option<u8> {
        let s = self.owner.load(Ordering::Acquire);
        if s & ATTACHED != 0 {
            return None;
        }
        self.owner
            .compare_exchange(s, s | ATTACHED, Ordering::AcqRel, Ordering::Relaxed)
            .ok()
            .map(|_| (s >> 1) as u8)
    }

    /// Whether the inbox is attached with `generation`. Producer side.
    #[inline]
    pub(super) fn is_attached_as(&self, generation: u8) -> bool {
        let s = self.owner.load(Ordering::Acquire);
        s & ATTACHED != 0 && (s >> 1) as u8 == generation
    }

    /// Detaches: a new generation, not attached, empty. Returns how many completions it
    /// dropped. Only with the poll right held (no producer) and by the inbox's owner (no
    /// consumer).
    pub(super) fn detach(&self) -> usize {
        let s = self.owner.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        self.tail.store(head, Ordering::Release);
        let generation = ((s >> 1) + 1) & 0xff;
        self.owner.store(generation << 1, Ordering::Release);
        head.wrapping_sub(tail)
    }

    /// Appends `wc`; `false` if the ring is full. Producer side (poll right held).
    #[inline]
    pub(super) fn push(&self, wc: &WorkCompletion) -> bool {
        // Only producers write `head`, and the poll right orders them: relaxed sees ours.
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        let cells = self.cells.get();
        if head.wrapping_sub(tail) >= cells.len() {
            return false;
        }
        // SAFETY: the cell at `head` is outside `tail..head`: the consumer does not read it
        // until the release store below, and is done with its last read (the acquire load
        // of `tail` above saw that read's release).
        cells[head % cells.len()].with_mut(|p| unsafe { *p = *wc });
        self.head.store(head.wrapping_add(1), Ordering::Release);
        true
    }

    /// Whether completions wait to be taken. Consumer side.
    #[inline]
    pub(super) fn has_mail(&self) -> bool {
        self.head.load(Ordering::Acquire) != self.tail.load(Ordering::Relaxed)
    }

    /// Moves up to `out.len()` completions into `out`. Consumer side.
    #[inline]
    pub(super) fn pop(&self, out: &mut [WorkCompletion]) -> usize {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        let n = head.wrapping_sub(tail).min(out.len());
        let cells = self.cells.get();
        for (k, slot) in out[..n].iter_mut().enumerate() {
            let i = tail.wrapping_add(k) % cells.len();
            // SAFETY: `tail + k < head`: the producer wrote this cell before its release
            // store of `head`, which the acquire load above saw, and does not write it again
            // until our release store of `tail` below frees it.
            *slot = cells[i].with(|p| unsafe { *p });
        }
        if n > 0 {
            self.tail.store(tail.wrapping_add(n), Ordering::Release);
        }
        n
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_shallow_mailbox_keeps_its_cells_in_its_own_room() {
        assert!(core::mem::size_of::<Mailbox>() <= 128);
        for capacity in [1, 2, 3, 64] {
            let m = Mailbox::new(capacity);
            assert_eq!(m.cells.get().len(), capacity);
            assert_eq!(matches!(m.cells, Cells::Inline(..)), capacity <= INLINE);
            // Fill it, overflow it, and drain it twice around the ring.
            for round in 0..2u64 {
                for k in 0..capacity as u64 {
                    let wc = WorkCompletion {
                        wr_id: round * 100 + k,
                        ..WorkCompletion::EMPTY
                    };
                    assert!(m.push(&wc));
                }
                assert!(!m.push(&WorkCompletion::EMPTY), "full at {capacity}");
                let mut out = [WorkCompletion::EMPTY; 64];
                assert_eq!(m.pop(&mut out), capacity);
                let ids: Vec<u64> = out[..capacity].iter().map(|w| w.wr_id).collect();
                assert_eq!(
                    ids,
                    (0..capacity as u64)
                        .map(|k| round * 100 + k)
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}
