//! Rings of work-request slots: const capacity, no allocation, generation-checked ids.
//!
//! A [`Ring`] tracks the work requests of one queue from post to completion. Each post
//! takes the next sequence number; the `wr_id` *is* that number, so slot = `seq % DEPTH` and
//! the generation is `seq / DEPTH`: a completion for a recycled slot is detected, never
//! misdelivered. Completions of one RC queue arrive in posting order, and a completion for
//! `seq` also retires every earlier *unsignaled* request (selective signaling: unsignaled
//! work that succeeds produces no completion of its own).
//!
//! The ring also stages a doorbell batch: requests are built in place in preallocated
//! entries with fixed-size SGE arrays ([`Ring::stage_next`]), and the caller posts
//! [`Ring::staged`] as one chain. A request
//! posted by itself is built in the same entry, the next one the batch would use
//! ([`Ring::lone_entry`]), so no request is copied on its way to the provider. A chain
//! built outside the ring, once, and posted again and again (a [`Batch`](crate::Batch))
//! takes a run of slots and its `wr_id`s at each post ([`Ring::reserve_chain`]).
//!
//! The ring is the channels' bookkeeping, not an API (public and hidden only for the
//! benches): completions reach users as [`Completion`]s.

mod completion;
mod slot;

pub use completion::Completion;
pub use slot::Slot;
use slot::{any_stops, free_run, SlotState};

pub use crate::provider::WorkRequest;
use crate::types::{WcOpcode, WcStatus, WorkCompletion};
use completion::outcome;

/// No free slot: `capacity` requests are in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFull {
    /// The ring's capacity.
    pub capacity: usize,
}

/// A completion that matches no request in flight (stale generation, unknown id, or out of
/// order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownCompletion {
    /// Its `wr_id`.
    pub wr_id: u64,
}

/// A ring of `DEPTH` slots of work requests `W`. See the module docs.
pub struct Ring<W, const DEPTH: usize> {
    head: u64,
    tail: u64,
    /// A request's `wr_id` is `(seq & id_mask) | id_tag`: the sequence number itself on a
    /// queue of its own, its low bits and the inbox's tag on a shared one.
    id_mask: u64,
    id_tag: u64,
    slots: [Slot; DEPTH],
    /// The outcome of the request in `slots[i]` while its state is `Done`.
    outcomes: [Completion; DEPTH],
    /// Entries `..staged` are the staged batch; entry `staged` is where the next request
    /// is built. `staged <= in_flight()`: a staged request holds a slot, so a free slot
    /// means a free entry.
    stage: [W; DEPTH],
    staged: usize,
}

impl<W: WorkRequest, const DEPTH: usize> Default for Ring<W, DEPTH> {
    fn default() -> Self {
        Self::new()
    }
}

impl<W: WorkRequest, const DEPTH: usize> Ring<W, DEPTH> {
    const CHECK: () = assert!(DEPTH > 0, "a ring needs at least one slot");

    /// An empty ring.
    pub const fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        Ring {
            head: 0,
            tail: 0,
            id_mask: u64::MAX,
            id_tag: 0,
            slots: [Slot {
                opcode: WcOpcode::Send,
                state: SlotState::Free,
            }; DEPTH],
            outcomes: [Completion::bare(WcStatus::Success, WcOpcode::Send); DEPTH],
            stage: [W::BLANK; DEPTH],
            staged: 0,
        }
    }

    /// Requests taken and not yet retired (staged, in flight, or completed but not taken).
    pub fn in_flight(&self) -> usize {
        (self.head - self.tail) as usize
    }

    /// Whether every slot is free.
    pub fn is_idle(&self) -> bool {
        self.head == self.tail
    }

    /// The sequence number the next request will get.
    pub fn next_seq(&self) -> u64 {
        self.head
    }

    /// Takes a slot for `wr`, sets its `wr_id`, and appends it to the staged batch.
    /// Returns its sequence number. (A copy of `wr`: callers on the data path build in
    /// the entry [`stage_next`](Self::stage_next) gives instead.)
    pub fn stage(&mut self, mut wr: W, signaled: bool) -> Result<u64, QueueFull> {
        let (seq, entry) = self.stage_next(wr.opcode(), signaled)?;
        wr.set_wr_id(entry.wr_id());
        *entry = wr;
        Ok(seq)
    }

    /// Appends a request of completion opcode `opcode` to the staged batch: takes the
    /// head's slot (the one check for room) and returns the request's sequence number and
    /// the entry to build it in, the next of the batch. Its `wr_id` is set; its other
    /// fields are what the last request built there left: a builder writes every field a
    /// provider reads (the gather entries up to the count it sets). A request that cannot
    /// be built is given back with [`unstage_last`](Self::unstage_last).
    #[inline]
    pub fn stage_next(
        &mut self,
        opcode: WcOpcode,
        signaled: bool,
    ) -> Result<(u64, &mut W), QueueFull> {
        let full = QueueFull { capacity: DEPTH };
        if self.in_flight() == DEPTH {
            return Err(full);
        }
        let seq = self.head;
        let id = self.wr_id(seq);
        // A free slot means a free entry (`staged <= in_flight()`): this never refuses.
        let wr = self.stage.get_mut(self.staged).ok_or(full)?;
        wr.set_wr_id(id);
        self.staged += 1;
        self.slots[(seq % DEPTH as u64) as usize] = Slot {
            opcode,
            state: SlotState::posted(signaled),
        };
        self.head += 1;
        Ok((seq, wr))
    }

    /// Gives back the request [`stage_next`](Self::stage_next) staged last (it could not
    /// be built): its slot and its entry.
    pub fn unstage_last(&mut self) {
        if self.staged > 0 {
            self.staged -= 1;
            self.head -= 1;
            self.slots[(self.head % DEPTH as u64) as usize].state = SlotState::Free;
        }
    }

    /// The entry a request posted by itself is built in: the first, the next entry while
    /// nothing is staged. Its fields are what the last request built there left, as
    /// [`stage_next`](Self::stage_next)'s. For the channels' callers nothing is staged whenever they post a
    /// request by itself: a batch is staged only inside a scope, which holds the channel
    /// exclusively and, however it ends (a panic included: its `Drop`), posts its batch or
    /// gives it back. Entry 0 needs no index arithmetic and no check on the data path.
    /// Its `wr_id` is set already: the next sequence number's.
    #[inline]
    pub fn lone_entry(&mut self) -> &mut W {
        debug_assert_eq!(
            self.staged, 0,
            "a request posted by itself while a batch is staged"
        );
        let id = self.wr_id(self.head);
        let wr = &mut self.stage[0];
        wr.set_wr_id(id);
        wr
    }

    /// Takes a slot for the request built in [`lone_entry`](Self::lone_entry), of
    /// completion opcode `opcode`, which the caller posts by itself, outside the staged
    /// batch. Returns its sequence number and the request to post. If the post fails, give
    /// the slot back with [`unreserve`](Self::unreserve) before anything else is taken.
    #[inline]
    pub fn reserve_lone(
        &mut self,
        opcode: WcOpcode,
        signaled: bool,
    ) -> Result<(u64, &mut W), QueueFull> {
        let seq = self.claim(opcode, signaled)?;
        Ok((seq, &mut self.stage[0]))
    }

    /// Takes the head's slot for a request of completion opcode `opcode`; returns its
    /// sequence number.
    #[inline]
    fn claim(&mut self, opcode: WcOpcode, signaled: bool) -> Result<u64, QueueFull> {
        if self.in_flight() == DEPTH {
            return Err(QueueFull { capacity: DEPTH });
        }
        let seq = self.head;
        self.take_slot(opcode, signaled);
        Ok(seq)
    }

    /// Takes a slot for `wr`, which the caller posts by itself, outside the staged batch,
    /// and sets its `wr_id`. Returns its sequence number. If the post fails, give the slot
    /// back with [`unreserve`](Self::unreserve) before anything else is taken.
    #[inline]
    pub fn reserve(&mut self, wr: &mut W, signaled: bool) -> Result<u64, QueueFull> {
        let seq = self.claim(wr.opcode(), signaled)?;
        wr.set_wr_id(self.wr_id(seq));
        Ok(seq)
    }

    /// Posts with `wr_id`s that carry `tag` in the bits above `mask` (a shared completion
    /// queue's inbox, [`crate::dispatch`]); completions then come back through
    /// [`widen`](Self::widen).
    #[cfg_attr(not(feature = "std"), allow(dead_code))]
    pub(crate) fn set_id_tag(&mut self, tag: u64, mask: u64) {
        self.id_tag = tag;
        self.id_mask = mask;
    }

    /// The `wr_id` of the request with sequence number `seq`.
    #[inline]
    pub(crate) fn wr_id(&self, seq: u64) -> u64 {
        (seq & self.id_mask) | self.id_tag
    }

    /// The sequence number a tagged `wr_id` stands for: the one at or after the tail with
    /// the same low bits (requests in flight span fewer than `mask + 1` numbers). Others
    /// land far above the head and are refused as unknown.
    #[inline]
    #[cfg_attr(not(feature = "std"), allow(dead_code))]
    pub(crate) fn widen(&self, wr_id: u64) -> u64 {
        self.tail
            .wrapping_add(wr_id.wrapping_sub(self.tail) & self.id_mask)
    }

    /// Gives back the slot of the request [`reserve`](Self::reserve) took last (it was not
    /// posted).
    pub fn unreserve(&mut self) {
        self.unreserve_run(1);
    }

    /// Takes a slot for each request of `chain`, built outside the ring and posted by the
    /// caller as one chain (a prepared batch), and sets their `wr_id`s; `slots` are what
    /// their slots hold, one each ([`Slot::posted`]). Nothing may be staged. Returns the
    /// first one's sequence number (the `i`th has that plus `i`). If the post fails, give
    /// back the slots of those not posted with [`unreserve_run`](Self::unreserve_run)
    /// before anything else is taken.
    #[inline]
    pub fn reserve_chain(&mut self, chain: &mut [W], slots: &[Slot]) -> Result<u64, QueueFull> {
        debug_assert_eq!(self.staged, 0, "a chain reserved while a batch is staged");
        let n = chain.len();
        if DEPTH - self.in_flight() < n {
            return Err(QueueFull { capacity: DEPTH });
        }
        let first = self.head;
        // The run of slots from the head's, wrapping once at most (`n <= DEPTH`): copied.
        let start = (first % DEPTH as u64) as usize;
        let (to_end, wrapped) = slots[..n].split_at(n.min(DEPTH - start));
        self.slots[start..start + to_end.len()].copy_from_slice(to_end);
        if !wrapped.is_empty() {
            self.slots[..wrapped.len()].copy_from_slice(wrapped);
        }
        // The ids count up from the first's unless its low bits wrap within the chain (a
        // tagged id's tag lies above them): one add each.
        let id = self.wr_id(first);
        if (n as u64).saturating_sub(1) <= self.id_mask - (first & self.id_mask) {
            for (wr, id) in chain.iter_mut().zip(id..) {
                wr.set_wr_id(id);
            }
        } else {
            for (i, wr) in chain.iter_mut().enumerate() {
                wr.set_wr_id(self.wr_id(first + i as u64));
            }
        }
        self.head += n as u64;
        Ok(first)
    }

    /// Gives back the slots of the last `count` requests reserved (they were not posted).
    pub fn unreserve_run(&mut self, count: usize) {
        self.free_last(count.min(self.in_flight()));
    }

    /// Frees the slots of the last `count` requests taken (`count <= in_flight()`).
    #[inline]
    fn free_last(&mut self, count: usize) {
        for _ in 0..count {
            self.head -= 1;
            self.slots[(self.head % DEPTH as u64) as usize].state = SlotState::Free;
        }
    }

    #[inline]
    fn take_slot(&mut self, opcode: WcOpcode, signaled: bool) {
        let seq = self.head;
        self.slots[(seq % DEPTH as u64) as usize] = Slot {
            opcode,
            state: SlotState::posted(signaled),
        };
        self.head += 1;
    }

    /// The staged batch, to post as one chain.
    pub fn staged(&self) -> &[W] {
        &self.stage[..self.staged]
    }

    /// The staged batch, to post as one chain where the provider links it in place.
    pub fn staged_mut(&mut self) -> &mut [W] {
        &mut self.stage[..self.staged]
    }

    /// Makes the last staged request signaled, so its completion retires the whole batch.
    pub fn signal_last_staged(&mut self) {
        if let Some(wr) = self.stage[..self.staged].last_mut() {
            wr.set_signaled(true);
            let seq = self.head - 1;
            self.slots[(seq % DEPTH as u64) as usize].state = SlotState::PostedSignaled;
        }
    }

    /// Marks the staged batch posted.
    pub fn clear_staged(&mut self) {
        self.staged = 0;
    }

    /// Gives back the slots of the last `count` staged requests (they were not posted) and
    /// clears the staged batch.
    pub fn unstage(&mut self, count: usize) {
        // Staged requests are the last taken (`staged <= in_flight()`).
        self.free_last(count.min(self.staged));
        self.staged = 0;
    }

    /// Records a completion. Earlier unsignaled requests are retired as successful.
    #[inline]
    pub fn complete(&mut self, wc: &WorkCompletion) -> Result<(), UnknownCompletion> {
        let seq = wc.wr_id;
        // The usual case: the oldest request in flight completes. Nothing earlier is left to
        // retire, and its slot stays the oldest, so the tail does not move.
        if seq == self.tail && seq < self.head {
            let idx = (seq % DEPTH as u64) as usize;
            if let SlotState::Posted | SlotState::PostedSignaled = self.slots[idx].state {
                self.done(idx, outcome(wc, self.slots[idx].opcode));
                return Ok(());
            }
        }
        self.complete_slow(wc)
    }

    /// If `wr_id` is that of a completion `wc` of `want` and `want` is the oldest request in
    /// flight, retires it at once (as [`complete`](Self::complete) then
    /// [`take`](Self::take) would) and returns `true`: its outcome is `wc` from its status
    /// on if it succeeded, else [`retired_failure`](Self::retired_failure)`(wc)`. Otherwise
    /// changes nothing and returns `false`: record `wc` with `complete`.
    #[inline(always)]
    pub fn retire_oldest(&mut self, wr_id: u64, want: u64) -> bool {
        let seq = wr_id;
        // Each miss is unlikely, so each is a branch of its own (not one combined test).
        if want != self.tail {
            return unlikely_false();
        }
        if seq != want {
            return unlikely_false();
        }
        // At the tail: below the head, or the ring is empty and the slot free (the type's
        // invariant), which the state test below refuses.
        let slot = &mut self.slots[(seq % DEPTH as u64) as usize];
        if let SlotState::Posted | SlotState::PostedSignaled = slot.state {
            slot.state = SlotState::Free;
            self.tail += 1;
            self.advance();
            return true;
        }
        unlikely_false()
    }

    /// For when [`retire_oldest`](Self::retire_oldest) refused: if `wr_id` is that of a
    /// completion of `want` and every request before it is unsignaled (a doorbell batch's
    /// signaled last request, whose completion retires the batch), retires them and `want` at
    /// once, as [`complete`](Self::complete) then [`take`](Self::take) would, and returns
    /// `true`, its outcome as [`retire_oldest`](Self::retire_oldest)'s. Otherwise changes
    /// nothing and returns `false`.
    #[inline(never)]
    pub fn retire_through(&mut self, wr_id: u64, want: u64) -> bool {
        if wr_id != want || want < self.tail || want >= self.head {
            return false;
        }
        let idx = (want % DEPTH as u64) as usize;
        if !matches!(
            self.slots[idx].state,
            SlotState::Posted | SlotState::PostedSignaled
        ) || !self.retire_unsignaled_before(want)
        {
            return false;
        }
        self.slots[idx].state = SlotState::Free;
        self.tail = want + 1;
        self.advance();
        true
    }

    /// If no request from the tail up to `seq` stops a retirement (each is unsignaled and
    /// still posted, or taken already), frees their slots and returns `true`; otherwise
    /// changes nothing. The tail is the caller's to move. The range is read as at most two
    /// contiguous runs of slots (it may wrap), each in blocks of [`SLOT_BLOCK`] (the
    /// last one overlapping the one before it), so a run is a few vector operations:
    /// one OR over it finds whether a state that stops it is there; then it is freed, no
    /// test.
    #[inline(always)]
    fn retire_unsignaled_before(&mut self, seq: u64) -> bool {
        let runs = |from: u64| {
            let start = (from % DEPTH as u64) as usize;
            start..start + ((seq - from) as usize).min(DEPTH - start)
        };
        let mut from = self.tail;
        while from < seq {
            let run = runs(from);
            from += run.len() as u64;
            if any_stops(&self.slots[run]) {
                return false;
            }
        }
        let mut from = self.tail;
        while from < seq {
            let run = runs(from);
            from += run.len() as u64;
            // A freed slot's opcode is read again only for the request a completion
            // names, never one retired unsignaled here.
            free_run(&mut self.slots[run]);
        }
        true
    }

    /// The outcome of the failed request [`retire_oldest`](Self::retire_oldest) just
    /// retired for `wc`.
    #[cold]
    #[inline(never)]
    pub fn retired_failure(&self, wc: &WorkCompletion) -> Completion {
        // The slot keeps the request's opcode until it is taken again.
        outcome(wc, self.slots[(wc.wr_id % DEPTH as u64) as usize].opcode)
    }

    #[inline(never)]
    fn complete_slow(&mut self, wc: &WorkCompletion) -> Result<(), UnknownCompletion> {
        let seq = wc.wr_id;
        let unknown = UnknownCompletion { wr_id: seq };
        if seq < self.tail || seq >= self.head {
            return Err(unknown);
        }
        let idx = (seq % DEPTH as u64) as usize;
        if !matches!(
            self.slots[idx].state,
            SlotState::Posted | SlotState::PostedSignaled
        ) {
            return Err(unknown);
        }
        // Every earlier request still posted must be unsignaled: RC completes in order.
        // Those succeeded without a completion of their own and are retired: the tail moves
        // up to the first outcome still to be taken, or to `seq`, and their slots are freed
        // (no slot behind the tail reads as posted). Usually every one of them is unsignaled
        // or taken already: one quick look finds that.
        let mut done = self.tail;
        if self.retire_unsignaled_before(seq) {
            done = seq;
        }
        // Otherwise a pass over contiguous slices of slots (at most two: the range may
        // wrap), not slot by slot through `% DEPTH`.
        while done < seq {
            let start = (done % DEPTH as u64) as usize;
            let run = ((seq - done) as usize).min(DEPTH - start);
            // Each slot passed is retired (freed) as the pass reads it: also when the
            // completion is refused below, for a signaled request before it still posted
            // (the requests before that one completed all the same: RC completes in order).
            let stop = self.slots[start..start + run]
                .iter_mut()
                .position(|s| match s.state {
                    SlotState::Posted | SlotState::Free => {
                        s.state = SlotState::Free;
                        false
                    }
                    _ => true,
                });
            if let Some(k) = stop {
                done += k as u64;
                break;
            }
            done += run as u64;
        }
        if done < seq {
            // `done` is signaled (refused below) or has an outcome to be taken; the rest
            // must be unsignaled too, and stay in the ring behind it, retired.
            for s in done..seq {
                if let SlotState::PostedSignaled = self.slots[(s % DEPTH as u64) as usize].state {
                    return Err(unknown);
                }
            }
            for s in done..seq {
                let slot = &mut self.slots[(s % DEPTH as u64) as usize];
                if let SlotState::Posted = slot.state {
                    slot.state = SlotState::Free;
                }
            }
        }
        self.tail = done;
        // The tail rests on an outcome to be taken (`done`'s or `seq`'s): where `advance`
        // would leave it.
        self.done(idx, outcome(wc, self.slots[idx].opcode));
        Ok(())
    }

    /// The outcome of `seq` once it completed, freeing its slot. `None` while in flight
    /// (or if `seq` was retired already).
    pub fn take(&mut self, seq: u64) -> Option<Result<Completion, Completion>> {
        if seq < self.tail || seq >= self.head {
            return None;
        }
        let idx = (seq % DEPTH as u64) as usize;
        if self.slots[idx].state != SlotState::Done {
            return None;
        }
        let done = self.outcomes[idx];
        self.slots[idx].state = SlotState::Free;
        // Only the oldest slot holds the tail back: a younger one leaves it where it is.
        if seq == self.tail {
            self.advance();
        }
        Some(split(done))
    }

    /// The completion opcode of the request with sequence number `seq`, as its slot holds
    /// it (a slot keeps it until it is reused).
    pub fn opcode(&self, seq: u64) -> WcOpcode {
        self.slots[(seq % DEPTH as u64) as usize].opcode
    }

    /// Whether `seq` is in the ring: waiting for its completion, or completed with its
    /// outcome not yet taken.
    pub fn holds(&self, seq: u64) -> bool {
        seq >= self.tail
            && seq < self.head
            && !matches!(
                self.slots[(seq % DEPTH as u64) as usize].state,
                SlotState::Free
            )
    }

    /// Whether `seq` is still waiting for its completion. Not `pending(seq).is_some()`:
    /// its two-state test costs the unpolled level's empty poll one instruction less.
    pub fn is_pending(&self, seq: u64) -> bool {
        seq >= self.tail
            && seq < self.head
            && matches!(
                self.slots[(seq % DEPTH as u64) as usize].state,
                SlotState::Posted | SlotState::PostedSignaled
            )
    }

    /// Whether `seq` was posted signaled, if it is still waiting for its completion.
    #[inline]
    pub fn pending(&self, seq: u64) -> Option<bool> {
        if seq < self.tail || seq >= self.head {
            return None;
        }
        match self.slots[(seq % DEPTH as u64) as usize].state {
            SlotState::Posted => Some(false),
            SlotState::PostedSignaled => Some(true),
            SlotState::Free | SlotState::Done => None,
        }
    }

    /// Gives every posted request still waiting for its completion the outcome `status`, as
    /// a flush would: for work the device discarded without completions (a queue pair moved
    /// to RESET, a dead device). Staged requests are not posted and keep their slots.
    /// Returns how many requests it completed.
    pub(crate) fn discard_in_flight(&mut self, status: WcStatus) -> usize {
        let posted_end = self.head - self.staged as u64;
        let mut n = 0;
        for seq in self.tail..posted_end {
            let idx = (seq % DEPTH as u64) as usize;
            if let SlotState::Posted | SlotState::PostedSignaled = self.slots[idx].state {
                self.done(idx, Completion::bare(status, self.slots[idx].opcode));
                n += 1;
            }
        }
        n
    }

    /// Whether any posted request still waits for its completion.
    pub(crate) fn has_pending(&self) -> bool {
        let posted_end = self.head - self.staged as u64;
        (self.tail..posted_end).any(|seq| self.is_pending(seq))
    }

    /// How many posted requests still wait for their completion.
    pub(crate) fn pending_count(&self) -> usize {
        let posted_end = self.head - self.staged as u64;
        (self.tail..posted_end)
            .filter(|&seq| self.is_pending(seq))
            .count()
    }

    /// The oldest request not yet retired.
    pub fn oldest(&self) -> Option<u64> {
        (!self.is_idle()).then_some(self.tail)
    }

    /// Records the outcome of the request in slot `idx`.
    #[inline]
    fn done(&mut self, idx: usize, outcome: Completion) {
        self.outcomes[idx] = outcome;
        self.slots[idx].state = SlotState::Done;
    }

    fn advance(&mut self) {
        while self.tail < self.head
            && matches!(
                self.slots[(self.tail % DEPTH as u64) as usize].state,
                SlotState::Free
            )
        {
            self.tail += 1;
        }
    }
}

#[cold]
#[inline]
fn unlikely_false() -> bool {
    false
}

#[inline]
fn split(done: Completion) -> Result<Completion, Completion> {
    if done.status == WcStatus::Success {
        Ok(done)
    } else {
        Err(done)
    }
}

#[cfg(test)]
mod tests;
