//! Receive slots on a shared receive queue: registered memory cut into `slots` buffers
//! of `size` bytes, all posted to one SRQ, their receive completions on one queue; the
//! refill policy; the states a slot goes through. What [`SrqGroup`](super::SrqGroup) and
//! a [`MultiChannel`](crate::MultiChannel) on an SRQ receive into.
//!
//! A slot is `Posted` (the device may write it), `Delivered` (its receive completed: the
//! caller may read it) or `Free` (handed back, to be posted again). Handed-back slots are
//! posted again in one batch once no more than `refill_at` remain posted, or when the
//! device says the SRQ runs low (the limit event). If the caller holds slots until the SRQ
//! runs dry, senders wait on RNR NAKs: nothing is lost.
//!
//! **Soundness.** The device writes only posted slots; the pool lends only delivered ones.
//! The SRQ, the queue and the memory live in one [`Backend`] behind an `Arc` that every
//! queue pair on the SRQ keeps alive (a channel on the SRQ holds a clone), so the memory is
//! freed only once no queue pair can deliver into it, wherever its holders moved.

use core::mem::ManuallyDrop;
use core::ptr::NonNull;
use std::collections::VecDeque;
use std::sync::Arc;

use super::{SharedReceiveQueue, SlotsConfig};
use crate::cq::CompletionQueue;
use crate::device::{Context, ProtectionDomain};
use crate::error::Error;
use crate::provider::Provider;
use crate::types::{AccessFlags, AsyncEvent, AsyncEventKind, EventElement, RecvWr, Sge, SrqAttr};
use crate::types::{WcStatus, WorkCompletion};
use crate::wr_id::GroupId;

/// A receive slot holding a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvSlot {
    pub(crate) index: u32,
    /// Bytes the message carried.
    pub len: u32,
    /// Its immediate data, if it was sent with some.
    pub imm: Option<u32>,
}

/// Where a receive slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Handed back: to be posted.
    Free,
    /// Posted to the SRQ: the device may write it.
    Posted,
    /// Its receive completed: the caller may read it.
    Delivered,
}

/// Registered memory the value owns.
pub(crate) struct Memory<P: Provider> {
    /// Deregistered before the memory is freed (`Drop`).
    mr: ManuallyDrop<P::Mr>,
    ptr: NonNull<u8>,
    len: usize,
    lkey: u32,
}

impl<P: Provider> Memory<P> {
    /// `len` zeroed bytes, registered for local writes.
    pub(crate) fn new(pd: &ProtectionDomain<P>, len: usize) -> Result<Self, Error<P::Error>> {
        let ptr = NonNull::from(Box::leak(vec![0u8; len].into_boxed_slice())).cast::<u8>();
        // SAFETY: the allocation is this value's, freed in `Drop` only after the
        // registration ends; its owner lends no part of it that the device may touch.
        let mr = unsafe { P::register_mr(&pd.raw, ptr.as_ptr(), len, AccessFlags::LOCAL_WRITE) };
        let mr = match mr {
            Ok(mr) => mr,
            Err(e) => {
                // SAFETY: leaked above, never registered, not lent.
                drop(unsafe {
                    Box::from_raw(core::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len))
                });
                return Err(Error::Provider {
                    op: "ibv_reg_mr",
                    source: e,
                });
            }
        };
        let lkey = P::mr_keys(&mr).0;
        Ok(Memory {
            mr: ManuallyDrop::new(mr),
            ptr,
            len,
            lkey,
        })
    }

    /// `len` bytes at `at`, as a gather or scatter entry.
    pub(crate) fn sge(&self, at: usize, len: usize) -> Sge {
        Sge {
            addr: self.ptr.as_ptr() as u64 + at as u64,
            length: len as u32,
            lkey: self.lkey,
        }
    }

    /// `len` bytes at `at`, read.
    ///
    /// # Safety
    /// The device neither writes them now nor until the borrow ends.
    pub(crate) unsafe fn bytes(&self, at: usize, len: usize) -> &[u8] {
        debug_assert!(at + len <= self.len);
        // SAFETY: inside the allocation; the caller vouches for the device.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr().add(at), len) }
    }

    /// `len` bytes at `at`, written.
    ///
    /// # Safety
    /// The device neither reads nor writes them now nor until the borrow ends, and no
    /// other borrow of them lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, at: usize, len: usize) -> &mut [u8] {
        debug_assert!(at + len <= self.len);
        // SAFETY: inside the allocation; the caller vouches for the device and for the
        // borrow being the only one.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr().add(at), len) }
    }
}

impl<P: Provider> Drop for Memory<P> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here; deregistered before the memory goes.
        unsafe { ManuallyDrop::drop(&mut self.mr) };
        let raw = core::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: the allocation leaked in `new`, freed once; the device no longer
        // reaches it (deregistered, and its owner outlives every queue pair using it).
        drop(unsafe { Box::from_raw(raw) });
    }
}

// SAFETY: the memory is a plain byte allocation owned by the value; the registration is a
// provider handle, Send + Sync by the trait's bounds.
unsafe impl<P: Provider> Send for Memory<P> {}
// SAFETY: through `&Memory` only the key and address are read, and the bytes by the
// `unsafe` accessors, whose callers vouch that no other borrow or the device conflicts.
unsafe impl<P: Provider> Sync for Memory<P> {}

/// What the device reaches: the SRQ, the queue its receives complete on, the memory they
/// land in. Fields drop in order: the SRQ and the queue are destroyed before the memory
/// is deregistered and freed. Shared (`Arc`) with every queue pair on the SRQ, so none
/// outlives it.
pub(crate) struct Backend<P: Provider> {
    pub(crate) srq: SharedReceiveQueue<P>,
    pub(crate) cq: CompletionQueue<P>,
    mem: Memory<P>,
}

/// Receive slots on an SRQ (see the module docs).
pub(crate) struct SlotPool<P: Provider> {
    backend: Arc<Backend<P>>,
    slots: Vec<Slot>,
    /// Slots handed back, oldest first (room for every slot: pushing never allocates).
    free: VecDeque<u32>,
    posted: u32,
    size: usize,
    refill_at: u32,
    /// The SRQ limit armed (0: none).
    limit: u32,
}

impl<P: Provider> SlotPool<P> {
    /// Creates the SRQ, a queue of `cq_depth` completions and the slots' memory, and posts
    /// every slot.
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for no slots or size, `refill_at` or `limit` not below
    /// `slots`, or a size past 4 GiB; the errors of [`SharedReceiveQueue::create`] and the
    /// provider's.
    pub(crate) fn new(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        cfg: &SlotsConfig,
        cq_depth: u32,
    ) -> Result<Self, Error<P::Error>> {
        let bad = |why| Err(Error::InvalidAttribute(why));
        if cfg.slots == 0 || cfg.size == 0 {
            return bad("receive slots need a count and a size");
        }
        if cfg.refill_at >= cfg.slots || cfg.limit >= cfg.slots {
            return bad("refill_at and limit must be below slots");
        }
        if u32::try_from(cfg.size).is_err() {
            return bad("a receive slot larger than one work request can fill");
        }
        let Some(len) = (cfg.slots as usize).checked_mul(cfg.size) else {
            return bad("slots times size overflow");
        };
        let cq = CompletionQueue::create(ctx, cq_depth)?;
        let attr = SrqAttr {
            max_wr: cfg.slots,
            max_sge: 1,
            srq_limit: 0,
        };
        let srq = SharedReceiveQueue::create(ctx, pd, &attr)?;
        let mem = Memory::new(pd, len)?;
        let mut pool = SlotPool {
            backend: Arc::new(Backend { srq, cq, mem }),
            slots: vec![Slot::Free; cfg.slots as usize],
            free: (0..cfg.slots).collect(),
            posted: 0,
            size: cfg.size,
            refill_at: cfg.refill_at,
            limit: cfg.limit,
        };
        pool.refill()?;
        pool.arm()?;
        Ok(pool)
    }

    /// The SRQ, its queue and memory, to be kept alive by the queue pairs on it.
    pub(crate) fn backend(&self) -> &Arc<Backend<P>> {
        &self.backend
    }

    /// The queue the receives complete on.
    pub(crate) fn cq(&self) -> &CompletionQueue<P> {
        &self.backend.cq
    }

    /// Arms the SRQ's limit, if the pool has one.
    fn arm(&self) -> Result<(), Error<P::Error>> {
        match self.limit {
            0 => Ok(()),
            limit => self.backend.srq.arm_limit(limit),
        }
    }

    /// Posts the free slots, oldest first, in chains of up to 32.
    fn refill(&mut self) -> Result<(), Error<P::Error>> {
        const CHAIN: usize = 32;
        let mut wrs = [RecvWr::<1>::new(0); CHAIN];
        while !self.free.is_empty() {
            let n = self.free.len().min(CHAIN);
            for (wr, &slot) in wrs.iter_mut().zip(self.free.iter()) {
                *wr = RecvWr::new(GroupId::Recv(slot).encode());
                wr.sg_list[0] = self.backend.mem.sge(slot as usize * self.size, self.size);
                wr.num_sge = 1;
            }
            // SAFETY: the slots are free (no borrow of them is lent: `received` lends only
            // delivered ones), inside the backend's memory, which outlives the SRQ and every
            // queue pair on it.
            let posted = unsafe { self.backend.srq.post_recv(&wrs[..n]) };
            let done = posted.as_ref().map_or_else(|e| e.index, |()| n);
            for slot in self.free.drain(..done) {
                self.slots[slot as usize] = Slot::Posted;
            }
            self.posted += done as u32;
            if let Err(e) = posted {
                return Err(Error::Provider {
                    op: "ibv_post_srq_recv",
                    source: e.error,
                });
            }
        }
        Ok(())
    }

    /// Posts the handed-back slots again if no more than `refill_at` remain posted.
    pub(crate) fn refill_if_low(&mut self) -> Result<(), Error<P::Error>> {
        if self.posted <= self.refill_at && !self.free.is_empty() {
            self.refill()?;
        }
        Ok(())
    }

    /// The receive completion `wc` of the posted `slot`: the message it holds, or the
    /// failure's status (the slot is free again then); `None` if `slot` is not posted (not
    /// a completion of this pool).
    pub(crate) fn complete(
        &mut self,
        slot: u32,
        wc: &WorkCompletion,
    ) -> Option<Result<RecvSlot, WcStatus>> {
        let state = self.slots.get_mut(slot as usize)?;
        if *state != Slot::Posted {
            return None;
        }
        self.posted -= 1;
        if wc.status != WcStatus::Success {
            *state = Slot::Free;
            self.free.push_back(slot);
            return Some(Err(wc.status));
        }
        *state = Slot::Delivered;
        Some(Ok(RecvSlot {
            index: slot,
            len: wc.byte_len.min(self.size as u32),
            imm: wc.imm,
        }))
    }

    /// The message in `slot` (its `len` bytes).
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for a slot not holding a message (handed back already).
    pub(crate) fn received(&self, slot: RecvSlot) -> Result<&[u8], Error<P::Error>> {
        if self.slots.get(slot.index as usize) != Some(&Slot::Delivered)
            || slot.len as usize > self.size
        {
            return Err(Error::InvalidAttribute("the slot holds no message"));
        }
        // SAFETY: a delivered slot is not posted: the device does not write it until it is
        // handed back (`release`, which takes `&mut self`, so not while this borrow lives).
        Ok(unsafe {
            self.backend
                .mem
                .bytes(slot.index as usize * self.size, slot.len as usize)
        })
    }

    /// Hands `slot` back, to be posted again (at once if the SRQ runs low).
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for a slot not holding a message; the provider's error
    /// from the refill.
    pub(crate) fn release(&mut self, slot: RecvSlot) -> Result<(), Error<P::Error>> {
        let s = self.slots.get_mut(slot.index as usize);
        let Some(s @ Slot::Delivered) = s else {
            return Err(Error::InvalidAttribute("the slot holds no message"));
        };
        *s = Slot::Free;
        self.free.push_back(slot.index);
        self.refill_if_low()
    }

    /// `SRQ_LIMIT_REACHED` for this pool's SRQ refills it with every slot handed back and
    /// arms the limit again; returns whether the event was the pool's. A late event, after
    /// a refill already happened, only arms again (only free slots are ever posted).
    pub(crate) fn on_async_event(&mut self, ev: &AsyncEvent) -> Result<bool, Error<P::Error>> {
        let mine = EventElement::Srq(self.backend.srq.key());
        if ev.kind != AsyncEventKind::SrqLimitReached || ev.element != mine {
            return Ok(false);
        }
        self.refill()?;
        self.arm()?;
        Ok(true)
    }
}
