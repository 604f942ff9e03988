//! The barrier plane: barrier messages as RDMA writes into a registered flag array, over
//! the data channels. No queue pair, receive or completion queue of its own.
//!
//! The node registers one array of 8-byte words (`LOCAL_WRITE | REMOTE_WRITE`). Per peer
//! index `p` it holds three words: an **inbox** of two slots, where `p` writes its
//! messages (slot = parity of the pair's barrier count), and an **outbox**, the word this
//! node's write to `p` reads from. Each peer learns where its inbox slots are in this
//! node's array as a [`RemoteRegion`] of 16 bytes ([`Flags::window`]), exchanged with the
//! data endpoint.
//!
//! A message is the word `!imm << 32 | imm` (`imm`: [`super::wire`]'s 32 bits), written by
//! a signaled RDMA WRITE on the data channel to that peer. The receiver finds it by
//! reading its slot and clears the slot as it takes it.
//!
//! **Torn writes.** Nothing orders the bytes of a write as they land (soft-RoCE copies
//! them a few at a time), so a read may catch a word half written: each of its bytes the
//! new one or the 0 it was cleared to. Such a read is taken for nothing yet, and the slot
//! left alone, unless its halves agree (`hi == !lo`), and they agree only once every byte
//! has landed: a byte of `lo` still 0 where the message's is not would need the same byte
//! of `hi` to be 0xFF, which makes the message's byte of `lo` 0; a byte of `hi` still 0
//! where the message's is not would need the byte of `lo` to be 0xFF, which makes the
//! message's byte of `hi` 0. The word is never 0 (`!0` is not). A peer that writes a word
//! whose halves never agree is taken for a write still landing: the barrier times out. Two slots are exactly enough: a pair exchanges at
//! most one message each way per barrier, and a peer runs at most one barrier ahead (it
//! cannot finish a barrier this node has not entered), so the next barrier's message
//! lands in the other slot while this one's waits. A slot is written again only two
//! barriers later, after this node took its message (it cannot finish a barrier before).
//!
//! Invariants:
//! - `sent[p]` is the ring sequence number of the write to `p` not yet redeemed, or
//!   `NONE`; at most one is in flight per peer (a barrier redeems its writes before it
//!   completes, and one barrier runs at a time), and the outbox word of `p` is written
//!   only while none is.
//! - `_mr` is dropped before `words` (field order): the array outlives its registration.
//!   The node drops its data channels (the only queue pairs that write it) first.
//!
//! Every word is an `AtomicU64`, 8-byte aligned, read and cleared by the host with atomic
//! operations (the simulator's copies are atomic too), so no access races in Rust's sense;
//! what a read may see of a write in progress is the torn word above.

use std::boxed::Box;

use core::sync::atomic::{AtomicU64, Ordering};

use crate::channel::{Channel, ChannelTransport};
use crate::device::ProtectionDomain;
use crate::error::{verb, Error};
use crate::mr::RemoteRegion;
use crate::provider::Provider;
use crate::types::{AccessFlags, SendFlags, Sge};

/// Words per peer: two inbox slots and the outbox.
const WORDS: usize = 3;
/// Bytes of a peer's window: its two inbox slots.
const WINDOW: u64 = 16;
/// No write in flight.
const NONE: u64 = u64::MAX;

/// The word of message `imm`: its complement above it (never 0).
pub(super) fn word_of(imm: u32) -> u64 {
    u64::from(!imm) << 32 | u64::from(imm)
}

/// The node's flag array, its registration, and where its messages to each peer go.
pub(super) struct Flags<P: Provider, const PEERS: usize> {
    /// The registration, kept for its drop, which comes first: it ends before the array
    /// is freed.
    _mr: P::Mr,
    words: Box<[AtomicU64]>,
    lkey: u32,
    rkey: u32,
    /// Where the barrier messages to peer `p` go: its inbox for this node, in its array,
    /// under its key (apart, not in one padded pair per peer).
    remote_addr: [u64; PEERS],
    remote_rkey: [u32; PEERS],
    sent: [u64; PEERS],
}

impl<P: Provider, const PEERS: usize> Flags<P, PEERS> {
    /// A zeroed array for `PEERS` peer indices, registered in `pd` for remote writes.
    pub(super) fn new(pd: &ProtectionDomain<P>) -> Result<Self, Error<P::Error>> {
        let words: Box<[AtomicU64]> = (0..PEERS * WORDS).map(|_| AtomicU64::new(0)).collect();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let len = core::mem::size_of_val(&*words);
        // SAFETY: the array is this value's and is freed only after the registration ends
        // (field order). The device writes it only through 8-byte aligned words while the
        // host reads and clears them with atomic operations (module docs), and reads an
        // outbox word only while no host store to it can happen (`sent`).
        let mr = unsafe { P::register_mr(&pd.raw, words.as_ptr().cast_mut().cast(), len, access) };
        let mr = verb("ibv_reg_mr", mr)?;
        let (lkey, rkey) = P::mr_keys(&mr);
        Ok(Flags {
            _mr: mr,
            words,
            lkey,
            rkey,
            remote_addr: [0; PEERS],
            remote_rkey: [0; PEERS],
            sent: [NONE; PEERS],
        })
    }

    /// Where peer `p` writes its messages to this node: its two inbox slots.
    pub(super) fn window(&self, p: usize) -> RemoteRegion {
        RemoteRegion {
            addr: self.word(p, 0).as_ptr() as u64,
            len: WINDOW,
            rkey: self.rkey,
        }
    }

    /// Sends this node's messages to `p` into `window` (what `p` made for this node),
    /// refused if shorter than two slots.
    pub(super) fn connect(&mut self, p: usize, window: &RemoteRegion) -> Result<(), &'static str> {
        let ok = window.len >= WINDOW && window.addr.checked_add(WINDOW).is_some();
        if p >= PEERS {
            return Err("peer index out of range");
        }
        if !ok {
            return Err("barrier window shorter than two slots");
        }
        (self.remote_addr[p], self.remote_rkey[p]) = (window.addr, window.rkey);
        Ok(())
    }

    /// Takes the message in `p`'s inbox slot for a barrier of parity `epoch & 1`,
    /// clearing the slot; `None` while there is none, or only part of one (module docs).
    pub(super) fn take(&self, p: usize, epoch: u32) -> Option<u32> {
        let slot = self.word(p, (epoch & 1) as usize);
        let v = slot.load(Ordering::Acquire);
        let imm = v as u32;
        if v != word_of(imm) {
            return None;
        }
        slot.store(0, Ordering::Relaxed);
        Some(imm)
    }

    /// Writes message `imm` of a barrier of parity `epoch & 1` to peer `p` over `ch`,
    /// `p`'s data channel. One write is in flight per peer at most.
    pub(super) fn send<T: ChannelTransport, const DEPTH: usize, const SGES: usize>(
        &mut self,
        ch: &mut Channel<P, DEPTH, SGES, T>,
        p: usize,
        epoch: u32,
        imm: u32,
    ) -> Result<(), Error<P::Error>> {
        if self.in_flight(p) {
            return Err(Error::QueueFull { capacity: 1 });
        }
        let out = self.word(p, 2);
        out.store(word_of(imm), Ordering::Relaxed);
        let sge = Sge {
            addr: out.as_ptr() as u64,
            length: 8,
            lkey: self.lkey,
        };
        let to = RemoteRegion {
            addr: self.remote_addr[p] + u64::from(epoch & 1) * 8,
            len: 8,
            rkey: self.remote_rkey[p],
        };
        // The outbox word is not stored to again until this write is redeemed (`sent`),
        // and the array outlives the channel's queue pair (module docs).
        let seq = ch.post_sges_seq([sge], to.write_op(), SendFlags::empty(), Some(to), false)?;
        self.sent[p] = seq;
        Ok(())
    }

    /// Redeems the write to `p` over `ch` if it completed: `Ok(true)` when none is in
    /// flight any more.
    pub(super) fn reap<T: ChannelTransport, const DEPTH: usize, const SGES: usize>(
        &mut self,
        ch: &mut Channel<P, DEPTH, SGES, T>,
        p: usize,
    ) -> Result<bool, Error<P::Error>> {
        if !self.in_flight(p) {
            return Ok(true);
        }
        match ch.try_complete_send(self.sent[p]) {
            Ok(None) => Ok(false),
            done => {
                self.sent[p] = NONE;
                done.map(|_| true)
            }
        }
    }

    /// Whether a write to `p` is in flight.
    pub(super) fn in_flight(&self, p: usize) -> bool {
        self.sent[p] != NONE
    }

    fn word(&self, p: usize, i: usize) -> &AtomicU64 {
        &self.words[p * WORDS + i]
    }
}

#[cfg(test)]
mod tests {
    use super::word_of;

    /// Every torn read of a message (each byte the message's or the 0 the slot was
    /// cleared to) is taken for the message exactly when it is the whole message.
    #[test]
    fn a_torn_word_is_never_taken_for_a_message() {
        let mut imms = vec![
            0,
            1,
            0xff,
            0xffff_ffff,
            0x00ff_00ff,
            0xff00_ff00,
            0x8000_0001,
        ];
        let mut x: u32 = 0x9e37_79b9;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            imms.push(x);
        }
        for imm in imms {
            let word = word_of(imm);
            for mask in 0u32..256 {
                let keep = (0..8).fold(0u64, |m, b| {
                    m | (u64::from(mask >> b & 1) * 0xff) << (8 * b)
                });
                let torn = word & keep;
                let taken = torn == word_of(torn as u32);
                assert_eq!(taken, torn == word, "imm {imm:#x} mask {mask:#04x}");
            }
        }
    }
}
