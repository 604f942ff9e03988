//! The send queue: a fixed ring of work request slots, written in place.
//!
//! A `VecDeque` of whole entries copies each entry (a request with 16 gather entries and
//! 256 bytes of inline room, over 500 bytes) on every push and pop. Here a post writes only
//! the fields and bytes it uses into the next slot, and retiring the head moves an index.

use crate::types::{SendFlags, SendOp, SendWr, Sge, MAX_INLINE, MAX_SGE};

/// A queued send work request, with its inline payload copied at post time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqEntry {
    pub(crate) wr: SendWr,
    pub(crate) inline: [u8; MAX_INLINE],
    /// First PSN, once transmitted.
    pub(crate) psn: u32,
    /// PSNs the message uses (path-MTU segments, at least 1).
    pub(crate) npkts: u32,
    /// Transmitted at least once (later transmissions are retransmissions).
    pub(crate) sent_once: bool,
}

/// Send work requests not yet executed, oldest first, at most `capacity` of them.
#[derive(Debug)]
pub(crate) struct SendQueue {
    slots: Vec<SqEntry>,
    head: usize,
    len: usize,
}

impl SendQueue {
    /// An empty queue of `capacity` (at least 1) slots, allocated now.
    pub(crate) fn new(capacity: usize) -> SendQueue {
        let blank = SqEntry {
            wr: SendWr {
                wr_id: 0,
                sg_list: [Sge::default(); MAX_SGE],
                num_sge: 0,
                op: SendOp::Send,
                flags: SendFlags::empty(),
            },
            inline: [0; MAX_INLINE],
            psn: 0,
            npkts: 1,
            sent_once: false,
        };
        SendQueue {
            slots: vec![blank; capacity.max(1)],
            head: 0,
            len: 0,
        }
    }

    fn slot(&self, i: usize) -> usize {
        let at = self.head + i;
        if at >= self.slots.len() {
            at - self.slots.len()
        } else {
            at
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Entry `i` from the head.
    pub(crate) fn get(&self, i: usize) -> Option<&SqEntry> {
        (i < self.len).then(|| &self.slots[self.slot(i)])
    }

    /// Entry `i` from the head, mutably.
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut SqEntry> {
        let at = self.slot(i);
        (i < self.len).then(|| &mut self.slots[at])
    }

    pub(crate) fn front(&self) -> Option<&SqEntry> {
        self.get(0)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &SqEntry> {
        (0..self.len).map(|i| &self.slots[self.slot(i)])
    }

    /// Appends an entry written in place by `fill` into a slot that holds a stale entry:
    /// `fill` must set every field a reader uses (`wr` but the gather entries past its
    /// `num_sge`, the inline bytes it uses, `psn`, `npkts`, `sent_once`).
    ///
    /// # Panics
    /// If the queue is full (callers check `max_send_wr` first).
    pub(crate) fn push_with(&mut self, fill: impl FnOnce(&mut SqEntry)) {
        assert!(self.len < self.slots.len(), "send queue overflow");
        let at = self.slot(self.len);
        fill(&mut self.slots[at]);
        self.len += 1;
    }

    /// Removes the head and returns a copy of it.
    pub(crate) fn pop_front(&mut self) -> Option<SqEntry> {
        let e = *self.front()?;
        self.drop_front();
        Some(e)
    }

    /// Removes the head, if any, without copying it.
    pub(crate) fn drop_front(&mut self) {
        if self.len > 0 {
            self.head = self.slot(1);
            self.len -= 1;
        }
    }

    pub(crate) fn clear(&mut self) {
        (self.head, self.len) = (0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(q: &mut SendQueue, id: u64) {
        q.push_with(|e| e.wr.wr_id = id);
    }

    #[test]
    fn fifo_across_the_wrap() {
        let mut q = SendQueue::new(3);
        for round in 0..5u64 {
            push(&mut q, round * 10);
            push(&mut q, round * 10 + 1);
            assert_eq!(q.len(), 2);
            let ids: Vec<u64> = q.iter().map(|e| e.wr.wr_id).collect();
            assert_eq!(ids, [round * 10, round * 10 + 1]);
            assert_eq!(q.get(1).map(|e| e.wr.wr_id), Some(round * 10 + 1));
            assert!(q.get(2).is_none());
            assert_eq!(q.pop_front().map(|e| e.wr.wr_id), Some(round * 10));
            q.drop_front();
            assert!(q.len() == 0 && q.front().is_none() && q.pop_front().is_none());
        }
    }

    #[test]
    #[should_panic(expected = "send queue overflow")]
    fn refuses_past_capacity() {
        let mut q = SendQueue::new(1);
        push(&mut q, 1);
        push(&mut q, 2);
    }
}
