//! A queue pair's work queues: the send queue and the receive queue, rings of work request
//! slots written in place.
//!
//! A `VecDeque` of whole send entries would copy each entry (a request with 16 gather
//! entries and 256 bytes of inline room, over 500 bytes) on every push and pop. Here a post
//! writes only the fields and bytes it uses into the next slot, and retiring the head moves
//! an index. A send slot's gather list and inline room are as large as the queue pair
//! allows (`max_send_sge`, `max_inline_data`, kept beside the slots), not the most a
//! device allows ([`MAX_SGE`], [`MAX_INLINE`]); a receive slot holds its work request id
//! and as many scatter entries as the queue pair allows (`max_recv_sge`).
//!
//! Both rings are allocated whole when the queue pair is created, so posting never
//! allocates; or, with [`FabricConfig::lazy_queues`](crate::FabricConfig::lazy_queues),
//! they grow (doubling, up to their capacity) as work is posted, so a world of a million
//! mostly idle queue pairs costs what they hold at their busiest, not what they could.

use crate::types::*;

/// A queued send work request: its fields but the gather list ([`SendQueue::gathers`])
/// and the inline payload ([`SendQueue::inline`]), which are beside it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqEntry {
    pub(crate) wr: SendHead,
    /// First PSN, once transmitted.
    pub(crate) psn: u32,
    /// PSNs the message uses (path-MTU segments, at least 1) once transmitted; 0 before.
    pub(crate) npkts: u32,
}

impl SqEntry {
    /// Transmitted at least once (later transmissions are retransmissions).
    #[inline]
    pub(crate) fn sent_once(&self) -> bool {
        self.npkts != 0
    }
}

/// A send work request as the HCA reads it: what was posted, but the gather list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendHead {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) flags: SendFlags,
    /// Entries in the gather list.
    pub(crate) num_sge: u8,
    /// Bytes the gather list names (summed at post).
    pub(crate) total: u64,
}

impl SendHead {
    /// The head of `wr`, whose gather list names `total` bytes.
    #[inline]
    pub(crate) fn of<const SGES: usize>(wr: &SendWr<SGES>, total: u64) -> SendHead {
        SendHead {
            wr_id: wr.wr_id,
            op: wr.op,
            flags: wr.flags,
            // At most `MAX_SGE` (checked against `max_send_sge` at post).
            num_sge: wr.sges().len().min(MAX_SGE) as u8,
            total,
        }
    }

    /// Message length (atomics: 8).
    #[inline]
    pub(crate) fn msg_len(&self) -> u64 {
        match self.op {
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 8,
            _ => self.total,
        }
    }
}

const BLANK: SqEntry = SqEntry {
    wr: SendHead {
        wr_id: 0,
        op: SendOp::Send,
        flags: SendFlags::empty(),
        num_sge: 0,
        total: 0,
    },
    psn: 0,
    npkts: 0,
};

/// A ring of at most `capacity` entries, each slot with `stride` side entries beside it
/// (a send slot's gather list, a receive slot's scatter list) and, in `room`, what else a
/// slot holds beside it (a send slot's inline bytes; nothing for a receive).
#[derive(Debug)]
struct Slots<T, U, R> {
    // Boxed slices, not `Vec`s: the room is always exactly what is allocated (growth is
    // exact), so a capacity word would repeat the length, in every queue of every queue pair.
    slots: Box<[T]>,
    /// Slot `s`'s side entries: `side[s * stride..][..stride]`.
    side: Box<[U]>,
    room: R,
    // Counts as u16 (a queue holds at most `MAX_QP_WR` or `MAX_SRQ_WR` requests of at
    // most `MAX_SGE` entries, all below 2^16): a queue pair is two of these, and a world of
    // 65,536 nodes has millions of queue pairs.
    stride: u16,
    head: u16,
    len: u16,
    capacity: u16,
}

const _: () = assert!(
    MAX_QP_WR <= u16::MAX as u32 && MAX_SRQ_WR <= u16::MAX as u32 && MAX_SGE < u16::MAX as usize
);

/// What a ring's slots hold beside their entries and side entries, laid out by slot and
/// kept in step with them as the ring grows.
trait Room {
    /// Unwraps the ring: slot `head` moves to the front.
    fn rotate_left(&mut self, head: usize);
    /// Room for `slots` slots.
    fn grow(&mut self, slots: usize);
}

/// Nothing (a receive queue's slots).
impl Room for () {
    fn rotate_left(&mut self, _: usize) {}
    fn grow(&mut self, _: usize) {}
}

/// A send slot's inline room: `bytes[s * stride..][..stride]`. A lazy queue makes it at
/// its first inline request (empty until then: a queue pair that never posts inline, as
/// most do not, keeps no room for it); from then on it grows with the slots.
#[derive(Debug)]
struct Inline {
    bytes: Box<[u8]>,
    stride: u32,
}

impl Inline {
    fn new(slots: usize, stride: usize) -> Inline {
        Inline {
            bytes: vec![0; slots * stride].into_boxed_slice(),
            stride: u32::try_from(stride).expect("a queue's sizes fit in u32"),
        }
    }

    fn stride(&self) -> usize {
        self.stride as usize
    }
}

impl Room for Inline {
    fn rotate_left(&mut self, head: usize) {
        if !self.bytes.is_empty() {
            self.bytes.rotate_left(head * self.stride());
        }
    }

    fn grow(&mut self, slots: usize) {
        if !self.bytes.is_empty() {
            let to = slots * self.stride();
            grow(&mut self.bytes, to);
        }
    }
}

/// Extends `b` to exactly `to` entries (blank), keeping its contents at the front.
fn grow<T: Blank>(b: &mut Box<[T]>, to: usize) {
    let mut v = core::mem::take(b).into_vec();
    // Exact: `Vec`'s own growth would round a first push up to 4 slots.
    v.reserve_exact(to - v.len());
    v.resize(to, T::BLANK);
    *b = v.into_boxed_slice();
}

/// What a slot or a side entry holds before its first use.
trait Blank: Copy {
    const BLANK: Self;
}

impl Blank for SqEntry {
    const BLANK: Self = BLANK;
}

impl Blank for u8 {
    const BLANK: Self = 0;
}

impl Blank for () {
    const BLANK: Self = ();
}

impl Blank for Sge {
    const BLANK: Self = Sge {
        addr: 0,
        length: 0,
        lkey: 0,
    };
}

impl<T: Blank, U: Blank, R: Room> Slots<T, U, R> {
    /// Empty; all `capacity` (at least 1) slots allocated now unless `lazy`, with `room`
    /// made for as many slots by `room_for`.
    fn new(capacity: usize, stride: usize, lazy: bool, room_for: impl FnOnce(usize) -> R) -> Self {
        let capacity = capacity.max(1);
        let n = if lazy { 0 } else { capacity };
        let count = |n: usize| u16::try_from(n).expect("a queue's sizes fit in u16");
        Slots {
            slots: vec![T::BLANK; n].into_boxed_slice(),
            side: vec![U::BLANK; n * stride].into_boxed_slice(),
            room: room_for(n),
            stride: count(stride),
            head: 0,
            len: 0,
            capacity: count(capacity),
        }
    }

    /// Entries held.
    fn len(&self) -> usize {
        self.len as usize
    }

    /// Side entries per slot.
    fn stride(&self) -> usize {
        self.stride as usize
    }

    fn slot(&self, i: usize) -> usize {
        let at = self.head as usize + i;
        if at >= self.slots.len() {
            at - self.slots.len()
        } else {
            at
        }
    }

    fn get(&self, i: usize) -> Option<&T> {
        (i < self.len()).then(|| &self.slots[self.slot(i)])
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let at = self.slot(i);
        (i < self.len()).then(|| &mut self.slots[at])
    }

    /// Makes room for one more entry and counts it in; its slot (physical index into
    /// `slots`, side entries at `slot * stride`, the same slot of `room`), which holds a
    /// stale entry for the caller to overwrite.
    ///
    /// # Panics
    /// With `what` in the message, if the ring is at capacity (callers check first).
    fn push(&mut self, what: &str) -> usize {
        let len = self.len();
        if len == self.slots.len() {
            assert!(len < self.capacity as usize, "{what} overflow");
            let to = (len * 2).clamp(1, self.capacity as usize);
            let (head, stride) = (self.head as usize, self.stride());
            // Unwrapped to the front, so the new slots extend the ring at its end.
            self.slots.rotate_left(head);
            self.side.rotate_left(head * stride);
            self.room.rotate_left(head);
            self.head = 0;
            grow(&mut self.slots, to);
            grow(&mut self.side, to * stride);
            self.room.grow(to);
        }
        let at = self.slot(len);
        self.len += 1;
        at
    }

    fn drop_front(&mut self) {
        if self.len > 0 {
            // Below `slots.len()`, which is at most `capacity`: a u16.
            self.head = self.slot(1) as u16;
            self.len -= 1;
        }
    }

    fn clear(&mut self) {
        (self.head, self.len) = (0, 0);
    }
}

/// Send work requests not yet executed, oldest first, at most `capacity` of them, each
/// with room for `sges` gather entries and `inline` bytes of inline payload.
#[derive(Debug)]
pub(crate) struct SendQueue(Slots<SqEntry, Sge, Inline>);

impl SendQueue {
    /// An empty queue of `capacity` (at least 1) slots with `sges` gather entries and
    /// `inline` (at most [`MAX_INLINE`]) inline bytes each, allocated now unless `lazy`.
    pub(crate) fn new(capacity: usize, sges: usize, inline: usize, lazy: bool) -> SendQueue {
        SendQueue(Slots::new(capacity, sges, lazy, |n| Inline::new(n, inline)))
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Its capacities as created: requests, gather entries and inline bytes per request.
    pub(crate) fn limits(&self) -> (u32, u32, u32) {
        (
            self.0.capacity.into(),
            self.0.stride.into(),
            self.0.room.stride,
        )
    }

    /// Entry `i` from the head.
    pub(crate) fn get(&self, i: usize) -> Option<&SqEntry> {
        self.0.get(i)
    }

    /// Entry `i` from the head, mutably.
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut SqEntry> {
        self.0.get_mut(i)
    }

    pub(crate) fn front(&self) -> Option<&SqEntry> {
        self.0.get(0)
    }

    /// Entry `i`'s gather list; empty past the end.
    #[inline]
    pub(crate) fn gathers(&self, i: usize) -> &[Sge] {
        let q = &self.0;
        if i >= q.len() {
            return &[];
        }
        let at = q.slot(i);
        // `num_sge` is at most the stride: `push` copied that many entries into the slot.
        let n = usize::from(q.slots[at].wr.num_sge);
        &q.side[at * q.stride()..][..n]
    }

    /// Entry `i`'s inline room (its payload, if it was posted inline); empty past the end,
    /// and while no request of the queue has been inline.
    pub(crate) fn inline(&self, i: usize) -> &[u8] {
        let q = &self.0;
        if i >= q.len() {
            return &[];
        }
        let n = q.room.stride();
        let from = q.slot(i) * n;
        q.room.bytes.get(from..from + n).unwrap_or(&[])
    }

    /// Entry `i`'s inline room, to write (made now if this is the queue's first inline
    /// request); empty past the end.
    pub(crate) fn inline_mut(&mut self, i: usize) -> &mut [u8] {
        let q = &mut self.0;
        if i >= q.len() {
            return &mut [];
        }
        let (at, n) = (q.slot(i), q.room.stride());
        if q.room.bytes.is_empty() {
            grow(&mut q.room.bytes, q.slots.len() * n);
        }
        &mut q.room.bytes[at * n..][..n]
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &SqEntry> {
        (0..self.0.len()).map(|i| &self.0.slots[self.0.slot(i)])
    }

    /// Appends `wr` (its gather list naming `total` bytes, at most the slot's room:
    /// checked by the caller), not yet transmitted. An inline payload goes into
    /// [`inline_mut`](Self::inline_mut) after.
    ///
    /// # Panics
    /// If the queue is full (callers check `max_send_wr` first), or the gather list is
    /// longer than a slot's room (callers check `max_send_sge`).
    pub(crate) fn push<const SGES: usize>(&mut self, wr: &SendWr<SGES>, total: u64) {
        let sges = wr.sges();
        let at = self.0.push("send queue");
        self.0.slots[at] = SqEntry {
            wr: SendHead::of(wr, total),
            psn: 0,
            npkts: 0,
        };
        let from = at * self.0.stride();
        self.0.side[from..][..sges.len()].copy_from_slice(sges);
    }

    /// Removes the head and returns a copy of it.
    pub(crate) fn pop_front(&mut self) -> Option<SqEntry> {
        let e = *self.front()?;
        self.0.drop_front();
        Some(e)
    }

    /// Removes the head, if any, without copying it.
    pub(crate) fn drop_front(&mut self) {
        self.0.drop_front();
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// A posted receive as the responder reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvRef<'a> {
    pub(crate) wr_id: u64,
    /// Its scatter list.
    pub(crate) sges: &'a [Sge],
}

/// Receive work requests not yet consumed, oldest first, at most `capacity` of them, each
/// in one run of `stride + 1` entries: its head (`addr`: the work request's id, `length`:
/// its entry count), then room for `stride` (`max_recv_sge`) scatter entries. One run,
/// not an id array beside an entry array: the responder that takes a receive reads one
/// line where the poster wrote it (a one-entry receive is 32 bytes), not two.
#[derive(Debug)]
pub(crate) struct RecvQueue(Slots<(), Sge, ()>);

impl RecvQueue {
    /// An empty queue of `capacity` receives of at most `stride` entries, allocated now
    /// unless `lazy`.
    pub(crate) fn new(capacity: usize, stride: usize, lazy: bool) -> RecvQueue {
        RecvQueue(Slots::new(capacity, stride + 1, lazy, |_| ()))
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Its capacities as created: receives, and scatter entries per receive.
    pub(crate) fn limits(&self) -> (u32, u32) {
        (self.0.capacity.into(), u32::from(self.0.stride) - 1)
    }

    /// Whether `wr` may be queued: too many entries (more than a slot holds, or than the
    /// request does), or no room.
    pub(crate) fn admits<const SGES: usize>(&self, wr: &RecvWr<SGES>) -> Result<(), SimError> {
        let (capacity, stride) = self.limits();
        if usize::from(wr.num_sge) > stride as usize {
            return Err(SimError::Invalid("num_sge exceeds max_recv_sge"));
        }
        if !wr.sges_fit() {
            return Err(SimError::Invalid(
                "num_sge exceeds the entries the request holds",
            ));
        }
        if self.len() >= capacity as usize {
            return Err(SimError::QueueFull);
        }
        Ok(())
    }

    /// The oldest receive: its id and scatter entries (the queue is not empty).
    #[inline]
    fn head(&self) -> (u64, &[Sge]) {
        let q = &self.0;
        let from = q.head as usize * q.stride();
        let head = &q.side[from];
        (head.addr, &q.side[from + 1..][..head.length as usize])
    }

    /// The oldest receive.
    #[inline]
    pub(crate) fn front(&self) -> Option<RecvRef<'_>> {
        (self.len() > 0).then(|| {
            let (wr_id, sges) = self.head();
            RecvRef { wr_id, sges }
        })
    }

    /// Appends `wr` (admitted: [`admits`](Self::admits)).
    ///
    /// # Panics
    /// If the queue is full (callers check `max_recv_wr` first) or `wr` has more entries
    /// than a slot holds.
    #[inline]
    pub(crate) fn push_back<const SGES: usize>(&mut self, wr: &RecvWr<SGES>) {
        let sges = wr.sges();
        let n = sges.len();
        assert!(
            n < self.0.stride(),
            "more scatter entries than a slot holds"
        );
        let at = self.0.push("receive queue");
        let from = at * self.0.stride();
        let run = &mut self.0.side[from..][..n + 1];
        run[0] = Sge {
            addr: wr.wr_id,
            // At most `MAX_SGE` (checked against the stride above).
            length: n as u32,
            lkey: 0,
        };
        run[1..].copy_from_slice(sges);
    }

    /// Removes the oldest receive; its id.
    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<u64> {
        let wr_id = (self.len() > 0).then(|| self.head().0)?;
        self.0.drop_front();
        Some(wr_id)
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes a send of id `id` with one gather entry at `id` of `id` bytes, and `id` in
    /// every byte of its inline room.
    fn push(q: &mut SendQueue, id: u64) {
        let mut wr = SendWr::<1>::new(id, SendOp::Send, SendFlags::empty());
        wr.num_sge = 1;
        wr.sg_list[0] = Sge {
            addr: id,
            length: id as u32,
            lkey: 0,
        };
        q.push(&wr, id);
        let last = q.len() - 1;
        q.inline_mut(last).fill(id as u8);
    }

    #[test]
    fn fifo_across_the_wrap() {
        for lazy in [false, true] {
            let mut q = SendQueue::new(3, 1, 2, lazy);
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
    }

    #[test]
    fn a_lazy_send_queue_grows_in_order_up_to_its_capacity() {
        let mut q = SendQueue::new(5, 1, 2, true);
        assert_eq!(q.0.slots.len(), 0);
        push(&mut q, 0);
        push(&mut q, 1);
        q.drop_front(); // head at 1: the next growth must unwrap the ring
        for id in 2..6 {
            push(&mut q, id);
        }
        assert_eq!(q.0.slots.len(), 5);
        // Each entry's gather list and inline room moved with it through the growth.
        for (i, id) in (1..6u8).enumerate() {
            assert_eq!(q.inline(i), [id, id]);
            let g = q.gathers(i);
            assert_eq!(
                (g.len(), g[0].addr, q.get(i).map(|e| e.wr.msg_len())),
                (1, id.into(), Some(id.into()))
            );
        }
        assert_eq!(
            q.iter().map(|e| e.wr.wr_id).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn a_lazy_queue_makes_its_inline_room_at_the_first_inline_request() {
        let mut q = SendQueue::new(8, 1, 2, true);
        let plain = |q: &mut SendQueue, id: u64| {
            q.push(&SendWr::<1>::new(id, SendOp::Send, SendFlags::empty()), 0);
        };
        plain(&mut q, 0);
        plain(&mut q, 1);
        q.drop_front();
        plain(&mut q, 2); // wrapped: head 1 of 2 slots
        assert_eq!((q.0.slots.len(), q.0.room.bytes.len()), (2, 0));
        assert_eq!(q.inline(0), []);
        push(&mut q, 3); // grows the ring to 4 slots (unwrapped), then makes the room
        assert_eq!((q.0.slots.len(), q.0.room.bytes.len()), (4, 8));
        push(&mut q, 4);
        for _ in 0..3 {
            q.drop_front();
        }
        for id in 5..8 {
            push(&mut q, id); // wraps
        }
        push(&mut q, 8); // unwraps and grows: the room moves with its slots
        assert_eq!((q.0.slots.len(), q.0.room.bytes.len()), (8, 16));
        for (i, id) in (4..9u8).enumerate() {
            assert_eq!(q.inline(i), [id, id]);
        }
    }

    #[test]
    #[should_panic(expected = "send queue overflow")]
    fn refuses_past_capacity() {
        let mut q = SendQueue::new(1, 1, 0, false);
        push(&mut q, 1);
        push(&mut q, 2);
    }

    fn rwr(id: u64, n: usize) -> RecvWr<2> {
        let mut wr = RecvWr::new(id);
        wr.num_sge = n as u8;
        for (k, s) in wr.sg_list.iter_mut().enumerate().take(n) {
            s.addr = id * 100 + k as u64;
        }
        wr
    }

    #[test]
    fn receives_keep_their_order_and_scatter_lists_across_growth_and_wrap() {
        for lazy in [false, true] {
            let mut q = RecvQueue::new(4, 2, lazy);
            let mut next = 0;
            let mut expect = std::collections::VecDeque::new();
            for round in 0..20u64 {
                while q.len() < 1 + (round as usize % 4) {
                    let n = (next % 3) as usize; // 0, 1 or 2 entries
                    q.push_back(&rwr(next, n));
                    expect.push_back((next, n));
                    next += 1;
                }
                let (id, n) = expect.pop_front().unwrap();
                let f = q.front().unwrap();
                assert_eq!(
                    (f.wr_id, f.sges.len()),
                    (id, n),
                    "lazy={lazy} round={round}"
                );
                let addrs: Vec<u64> = f.sges.iter().map(|s| s.addr).collect();
                assert_eq!(
                    addrs,
                    (0..n as u64).map(|k| id * 100 + k).collect::<Vec<_>>()
                );
                assert_eq!(q.pop_front(), Some(id));
            }
            q.clear();
            assert!(q.front().is_none() && q.pop_front().is_none());
        }
    }
}
