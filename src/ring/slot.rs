//! A ring's slots: where each request is, two bytes each, and the passes over a run of
//! them that retire a batch at once.

use crate::types::WcOpcode;

/// Where a slot's request is. Signaled and unsignaled posted requests are two states, so
/// that one store marks a slot posted and one compare finds a signaled one; the two posted
/// states are the two highest, so one compare finds a posted one; and the two states that
/// stop a retirement pass (`Done`, `PostedSignaled`) are the odd ones, so one bit finds
/// them in a whole run of slots ([`STOPS_RETIREMENT`]).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum SlotState {
    Free,
    /// Completed; the outcome, in the ring's `outcomes`, is still to be taken.
    Done,
    Posted,
    PostedSignaled,
}

/// The bit of a [`SlotState`] that `Done` and `PostedSignaled` have, and `Free` and
/// `Posted` have not.
pub(super) const STOPS_RETIREMENT: u8 = 1;
const _: () = {
    assert!(SlotState::Done as u8 & STOPS_RETIREMENT != 0);
    assert!(SlotState::PostedSignaled as u8 & STOPS_RETIREMENT != 0);
    assert!(SlotState::Free as u8 & STOPS_RETIREMENT == 0);
    assert!(SlotState::Posted as u8 & STOPS_RETIREMENT == 0);
    assert!(Slot::FREE.opcode as u8 == 0 && Slot::FREE.state as u8 == 0);
};

impl SlotState {
    #[inline]
    pub(super) fn posted(signaled: bool) -> SlotState {
        if signaled {
            SlotState::PostedSignaled
        } else {
            SlotState::Posted
        }
    }
}

/// The slot of the request with sequence number `seq` is `slots[seq % DEPTH]`, and it belongs
/// to `seq` exactly while `tail <= seq < head`: that range is the generation check (an
/// older generation is below the tail, an id never issued at or above the head). Every
/// slot outside that range is free: so the slot at the tail of an empty ring is free.
/// Two bytes, so that a slot is found by an address mode (no multiply) and its request
/// posted with one store, and a retirement pass reads a run of slots as `u16`s, a vector
/// at a time (`Slot::bits`); outcomes are kept apart, in `outcomes`. A chain built
/// outside the ring keeps its requests' slots, so that a post copies them
/// ([`Ring::reserve_chain`](super::Ring::reserve_chain)).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Slot {
    pub(super) opcode: WcOpcode,
    pub(super) state: SlotState,
}

impl Slot {
    /// The slot of a posted request of completion opcode `opcode`, `signaled` or not.
    #[inline]
    pub fn posted(opcode: WcOpcode, signaled: bool) -> Slot {
        Slot {
            opcode,
            state: SlotState::posted(signaled),
        }
    }

    /// The same slot, `signaled` or not.
    #[inline]
    pub fn signaled(self, signaled: bool) -> Slot {
        Slot::posted(self.opcode, signaled)
    }

    /// A free slot, all zero bits.
    pub(super) const FREE: Slot = Slot {
        opcode: WcOpcode::Send,
        state: SlotState::Free,
    };

    /// The slot as one number, its state in bits 8 to 15 (two adjacent bytes: one load).
    #[inline]
    pub(super) fn bits(self) -> u16 {
        u16::from_le_bytes([self.opcode as u8, self.state as u8])
    }
}

/// Slots a run is read and freed in at a time (16 bytes: one vector).
const SLOT_BLOCK: usize = 8;

/// Whether a slot of `run` holds a state that stops a retirement: one OR over its slots
/// read as `u16`s, whole blocks, the last one overlapping the one before it (an OR does
/// not mind a slot read twice), so no slot is read one at a time unless the run is
/// shorter than a block.
#[inline]
pub(super) fn any_stops(run: &[Slot]) -> bool {
    let n = run.len();
    let any = if n < SLOT_BLOCK {
        run.iter().fold(0, |any, s| any | s.bits())
    } else {
        // Lane by lane, so the blocks are ORed as vectors and reduced once.
        let mut lanes = [0u16; SLOT_BLOCK];
        let mut or_in = |block: &[Slot]| {
            for (lane, s) in lanes.iter_mut().zip(block) {
                *lane |= s.bits();
            }
        };
        run.chunks_exact(SLOT_BLOCK).for_each(&mut or_in);
        or_in(&run[n - SLOT_BLOCK..]);
        lanes.iter().fold(0, |any, lane| any | lane)
    };
    any & (STOPS_RETIREMENT as u16) << 8 != 0
}

/// Frees every slot of `run`: whole blocks of one constant, all zero bits, the last one
/// overlapping the one before it, as [`any_stops`] reads them.
#[inline]
pub(super) fn free_run(run: &mut [Slot]) {
    let n = run.len();
    if n < SLOT_BLOCK {
        run.fill(Slot::FREE);
        return;
    }
    for block in run.chunks_exact_mut(SLOT_BLOCK) {
        block.fill(Slot::FREE);
    }
    run[n - SLOT_BLOCK..].fill(Slot::FREE);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every run length, shorter and longer than a block, with a stop at every place
    /// (the overlapped tail of the last block included), and freed whole.
    #[test]
    fn a_run_is_read_and_freed_whole_at_every_length() {
        const MOST: usize = 3 * SLOT_BLOCK + 1;
        for n in 0..=MOST {
            let unsignaled = [Slot::posted(WcOpcode::RdmaWrite, false); MOST];
            assert!(!any_stops(&unsignaled[..n]), "no stop in {n}");
            for at in 0..n {
                let mut all = unsignaled;
                let run = &mut all[..n];
                run[at] = run[at].signaled(true);
                assert!(any_stops(run), "a signaled slot at {at} of {n}");
                run[at].state = SlotState::Done;
                assert!(any_stops(run), "a done slot at {at} of {n}");
                free_run(run);
                assert!(run.iter().all(|s| s.bits() == 0), "freed whole: {n}");
            }
        }
    }
}
