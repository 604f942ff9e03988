//! [`SrqGroup`]: reliable connections to many peers that receive through one shared receive
//! queue and complete on one completion queue, driven from one thread without `unsafe`
//! (what rdma-core's `ibv_srq_pingpong` does with 16 queue pairs).
//!
//! The group owns its memory, registered once: `slots` receive buffers of `size` bytes,
//! all posted to the SRQ, and one send buffer of `size` bytes per peer.
//!
//! - A message from any peer lands in the oldest posted slot; [`poll`](SrqGroup::poll)
//!   reports it as [`GroupEvent::Received`], naming the peer (by its completion's
//!   `qp_num`) and the slot, which the caller reads ([`received`](SrqGroup::received))
//!   and hands back ([`release`](SrqGroup::release)).
//! - Slots handed back are posted again in one batch once no more than
//!   [`refill_at`](SrqGroupConfig::refill_at) remain posted, or when the device says the
//!   SRQ runs low ([`limit`](SrqGroupConfig::limit), the limit event handed to
//!   [`on_async_event`](SrqGroup::on_async_event)). If the caller holds slots until the
//!   SRQ runs dry, senders wait on RNR NAKs: nothing is lost.
//! - [`send_buf`](SrqGroup::send_buf) lends a peer's send buffer while no send from it is
//!   in flight; [`send`](SrqGroup::send) posts it; [`GroupEvent::Sent`] frees it again.
//!
//! **Soundness.** The device writes only posted slots and reads only in-flight send
//! buffers; the group lends neither (a slot is readable once its receive completed, a send
//! buffer writable once its send completed). Dropping the group destroys its queue pairs
//! first (nothing consumes the SRQ or sends any more), then its queues, then deregisters
//! and frees the memory. Nothing is allocated after [`prepare`](SrqGroup::prepare).
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::provider::sim::Sim;
//! use zverbs::qp::{RtrOptions, RtsOptions};
//! use zverbs::srq::{GroupEvent, SrqGroup, SrqGroupConfig};
//! use zverbs::Context;
//! let sim = Sim::with_devices(2);
//! let (ca, cb) = (Context::open(&sim, "sim0").unwrap(), Context::open(&sim, "sim1").unwrap());
//! let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
//! let cfg = SrqGroupConfig { slots: 8, size: 64, refill_at: 2, ..SrqGroupConfig::default() };
//! // Two peers on each side, queue pair i of one connected to queue pair i of the other.
//! let a = SrqGroup::prepare(&ca, &pa, 2, &cfg).unwrap();
//! let b = SrqGroup::prepare(&cb, &pb, 2, &cfg).unwrap();
//! let (ea, eb) = (a.endpoints(), b.endpoints());
//! let (rtr, rts) = (RtrOptions::default(), RtsOptions::default());
//! let mut a = a.connect(&eb, &rtr, &rts).unwrap();
//! let mut b = b.connect(&ea, &rtr, &rts).unwrap();
//! a.send_buf(1).unwrap()[..5].copy_from_slice(b"hello");
//! a.send(1, 5).unwrap();
//! let mut ev = [GroupEvent::None; 4];
//! let n = b.wait(&mut ev, std::time::Duration::from_secs(1)).unwrap();
//! let GroupEvent::Received { peer: 1, slot } = ev[..n][0] else { panic!("{ev:?}") };
//! assert_eq!(b.received(slot).unwrap(), b"hello");
//! b.release(slot).unwrap();
//! # }
//! ```

use core::mem::ManuallyDrop;
use core::ptr::NonNull;
use core::time::Duration;
use std::collections::VecDeque;
use std::time::Instant;

use super::SharedReceiveQueue;
use crate::cq::CompletionQueue;
use crate::device::{Context, ProtectionDomain};
use crate::error::{verb, Error};
use crate::provider::Provider;
use crate::qp::{
    Endpoint, Init, QpConfig, QueuePair, RcOnSrq, ReadyToSend, RtrOptions, RtsOptions,
};
use crate::types::{
    AccessFlags, AsyncEvent, AsyncEventKind, EventElement, RecvWr, SendFlags, SendOp, SendWr, Sge,
    SrqAttr, WcStatus, WorkCompletion,
};
use crate::wr_id::GroupId;

/// How an [`SrqGroup`] is made.
#[derive(Clone, Copy, Debug)]
pub struct SrqGroupConfig {
    /// Receive slots: the SRQ's size (and how many receives it holds at most).
    pub slots: u32,
    /// Bytes of each receive slot and of each peer's send buffer.
    pub size: usize,
    /// Handed-back slots are posted again once no more than this many remain posted
    /// (`ibv_srq_pingpong` refills at its number of queue pairs).
    pub refill_at: u32,
    /// Arms the SRQ's limit at this many receives (0: not armed): the device raises
    /// `SRQ_LIMIT_REACHED` when fewer remain posted, and
    /// [`on_async_event`](SrqGroup::on_async_event) refills at once and arms it again.
    pub limit: u32,
    /// The queue pairs' settings (port, GID index, send depth; their own receive
    /// capacities are not used).
    pub qp: QpConfig,
}

impl Default for SrqGroupConfig {
    fn default() -> Self {
        SrqGroupConfig {
            slots: 64,
            size: 4096,
            refill_at: 16,
            limit: 0,
            qp: QpConfig::default(),
        }
    }
}

/// A receive slot holding a message: what [`GroupEvent::Received`] hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvSlot {
    index: u32,
    /// Bytes the message carried.
    pub len: u32,
    /// Its immediate data, if it was sent with some.
    pub imm: Option<u32>,
}

/// What [`SrqGroup::poll`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupEvent {
    /// Nothing (the value out-arrays start with).
    None,
    /// A message from `peer`, in `slot`.
    Received {
        /// The peer whose queue pair consumed the receive.
        peer: usize,
        /// Where it is.
        slot: RecvSlot,
    },
    /// `peer`'s send completed: its buffer is free again.
    Sent {
        /// The peer.
        peer: usize,
    },
    /// A send to `peer` (`send`), or a receive of a message from it, failed with
    /// `status`; the buffer or slot is free again, and the peer's queue pair is in error.
    Failed {
        /// The peer.
        peer: usize,
        /// Whether it was a send.
        send: bool,
        /// Why.
        status: WcStatus,
    },
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

/// The group's registered memory: the receive slots, then one send buffer per peer.
struct Memory<P: Provider> {
    /// Deregistered before the memory is freed (`Drop`).
    mr: ManuallyDrop<P::Mr>,
    ptr: NonNull<u8>,
    len: usize,
    lkey: u32,
}

impl<P: Provider> Memory<P> {
    fn new(pd: &ProtectionDomain<P>, len: usize) -> Result<Self, Error<P::Error>> {
        let ptr = NonNull::from(Box::leak(vec![0u8; len].into_boxed_slice())).cast::<u8>();
        // SAFETY: the allocation is this value's, freed in `Drop` only after the
        // registration ends; the group lends no part of it that the device may touch.
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
    fn sge(&self, at: usize, len: usize) -> Sge {
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
    unsafe fn bytes(&self, at: usize, len: usize) -> &[u8] {
        debug_assert!(at + len <= self.len);
        // SAFETY: inside the allocation; the caller vouches for the device.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr().add(at), len) }
    }

    /// `len` bytes at `at`, written.
    ///
    /// # Safety
    /// The device neither reads nor writes them now nor until the borrow ends.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, at: usize, len: usize) -> &mut [u8] {
        debug_assert!(at + len <= self.len);
        // SAFETY: inside the allocation; the caller vouches for the device, and the group
        // lends each range once at a time (`&mut SrqGroup`).
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr().add(at), len) }
    }
}

impl<P: Provider> Drop for Memory<P> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here; deregistered before the memory goes.
        unsafe { ManuallyDrop::drop(&mut self.mr) };
        let raw = core::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: the allocation leaked in `new`, freed once; the device no longer
        // reaches it (deregistered, and the queue pairs and SRQ dropped before this).
        drop(unsafe { Box::from_raw(raw) });
    }
}

// SAFETY: the memory is a plain byte allocation owned by the value; the registration is a
// provider handle, Send + Sync by the trait's bounds.
unsafe impl<P: Provider> Send for Memory<P> {}

/// What both the prepared and the connected group hold. Fields drop in order: the queue,
/// the SRQ, then the memory (the queue pairs, held beside this, go first).
struct Parts<P: Provider> {
    cq: CompletionQueue<P>,
    srq: SharedReceiveQueue<P>,
    mem: Memory<P>,
    slots: Vec<Slot>,
    /// Slots handed back, oldest first (room for every slot: pushing never allocates).
    free: VecDeque<u32>,
    posted: u32,
    /// Per peer: a send from its buffer is in flight.
    sending: Vec<bool>,
    size: usize,
    refill_at: u32,
    /// The SRQ limit the group arms (0: none).
    limit: u32,
}

/// An [`SrqGroup`] whose queue pairs are not connected yet: their
/// [`endpoints`](Self::endpoints) go to the peers.
pub struct PreparedSrqGroup<P: Provider> {
    qps: Vec<QueuePair<P, Init, RcOnSrq>>,
    parts: Parts<P>,
}

/// Connections to `peers` peers receiving through one SRQ (see the module docs).
pub struct SrqGroup<P: Provider> {
    qps: Vec<QueuePair<P, ReadyToSend, RcOnSrq>>,
    /// `(qp_num, peer)` for every peer, sorted: a completion's peer in O(log peers).
    by_qpn: Vec<(u32, usize)>,
    parts: Parts<P>,
}

impl<P: Provider> SrqGroup<P> {
    /// Creates the queue, the SRQ, the memory and `peers` queue pairs (in INIT), and posts
    /// every slot.
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for no peers, slots or size, or fewer slots than
    /// `refill_at`; the errors of [`SharedReceiveQueue::create`] and
    /// [`QueuePair::create_on_srq`].
    pub fn prepare(
        ctx: &Context<P>,
        pd: &ProtectionDomain<P>,
        peers: usize,
        cfg: &SrqGroupConfig,
    ) -> Result<PreparedSrqGroup<P>, Error<P::Error>> {
        let bad = |why| Err(Error::InvalidAttribute(why));
        if peers == 0 || cfg.slots == 0 || cfg.size == 0 {
            return bad("an SRQ group needs peers, slots and a size");
        }
        if cfg.refill_at >= cfg.slots || cfg.limit >= cfg.slots || peers > u32::MAX as usize {
            return bad("refill_at and limit must be below slots");
        }
        let Some(len) = (cfg.slots as usize + peers).checked_mul(cfg.size) else {
            return bad("slots and peers times size overflow");
        };
        let depth = (cfg.slots as usize + peers).min(u32::MAX as usize) as u32;
        let cq = CompletionQueue::create(ctx, depth)?;
        let attr = SrqAttr {
            max_wr: cfg.slots,
            max_sge: 1,
            srq_limit: 0,
        };
        let srq = SharedReceiveQueue::create(ctx, pd, &attr)?;
        let mem = Memory::new(pd, len)?;
        let mut qps = Vec::with_capacity(peers);
        for _ in 0..peers {
            let qp = QueuePair::create_on_srq(ctx, pd, &cq, &cq, &srq, &cfg.qp)?;
            let qp = qp.into_init(&Default::default()).map_err(|e| e.error)?;
            qps.push(qp);
        }
        let mut parts = Parts {
            cq,
            srq,
            mem,
            slots: vec![Slot::Free; cfg.slots as usize],
            free: (0..cfg.slots).collect(),
            posted: 0,
            sending: vec![false; peers],
            size: cfg.size,
            refill_at: cfg.refill_at,
            limit: cfg.limit,
        };
        parts.refill()?;
        parts.arm()?;
        Ok(PreparedSrqGroup { qps, parts })
    }
}

impl<P: Provider> PreparedSrqGroup<P> {
    /// Each queue pair's endpoint, by peer index.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.qps.iter().map(QueuePair::endpoint).collect()
    }

    /// Connects queue pair `i` to `remotes[i]`, for every peer.
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] when `remotes` does not have one endpoint per peer; a
    /// transition's error.
    pub fn connect(
        self,
        remotes: &[Endpoint],
        rtr: &RtrOptions,
        rts: &RtsOptions,
    ) -> Result<SrqGroup<P>, Error<P::Error>> {
        if remotes.len() != self.qps.len() {
            return Err(Error::InvalidAttribute("one remote endpoint per peer"));
        }
        let mut qps = Vec::with_capacity(self.qps.len());
        for (qp, remote) in self.qps.into_iter().zip(remotes) {
            let qp = qp.into_rtr(remote, rtr).map_err(|e| e.error)?;
            qps.push(qp.into_rts(rts).map_err(|e| e.error)?);
        }
        let mut by_qpn: Vec<_> = qps
            .iter()
            .enumerate()
            .map(|(p, q)| (q.qp_num(), p))
            .collect();
        by_qpn.sort_unstable();
        Ok(SrqGroup {
            qps,
            by_qpn,
            parts: self.parts,
        })
    }
}

impl<P: Provider> Parts<P> {
    /// Arms the SRQ's limit, if the group has one.
    fn arm(&self) -> Result<(), Error<P::Error>> {
        match self.limit {
            0 => Ok(()),
            limit => self.srq.arm_limit(limit),
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
                wr.sg_list[0] = self.mem.sge(slot as usize * self.size, self.size);
                wr.num_sge = 1;
            }
            // SAFETY: the slots are free (no borrow of them is lent: `received` lends only
            // delivered ones), inside the group's memory, which outlives the SRQ.
            let posted = unsafe { self.srq.post_recv(&wrs[..n]) };
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
}

impl<P: Provider> SrqGroup<P> {
    /// Its number of peers.
    pub fn peers(&self) -> usize {
        self.qps.len()
    }

    /// Takes what the completion queue holds, up to `out.len()` events, without waiting;
    /// posts handed-back slots again if the SRQ runs low. Returns how many.
    ///
    /// # Errors
    /// [`Error::UnexpectedCompletion`] for a completion this group did not post for; the
    /// provider's error.
    pub fn poll(&mut self, out: &mut [GroupEvent]) -> Result<usize, Error<P::Error>> {
        let mut wcs = [WorkCompletion::EMPTY; 16];
        let want = out.len().min(wcs.len());
        let n = self.parts.cq.poll(&mut wcs[..want])?;
        for (wc, ev) in wcs[..n].iter().zip(out.iter_mut()) {
            *ev = self.take(wc)?;
        }
        if self.parts.posted <= self.parts.refill_at {
            self.parts.refill()?;
        }
        Ok(n)
    }

    /// Hands the group an asynchronous event of its device (from
    /// [`Context::next_async_event`](crate::Context::next_async_event) in the program's
    /// event loop): `SRQ_LIMIT_REACHED` for the group's SRQ (fewer than
    /// [`limit`](SrqGroupConfig::limit) receives posted) refills it with every slot handed
    /// back and arms the limit again; returns whether the event was the group's. The
    /// event may come late, after a refill by [`poll`](Self::poll) or
    /// [`release`](Self::release): then it only arms again (posting twice is impossible:
    /// only free slots are posted).
    ///
    /// # Errors
    /// The provider's error from the refill or the arm.
    pub fn on_async_event(&mut self, ev: &AsyncEvent) -> Result<bool, Error<P::Error>> {
        let mine = EventElement::Srq(self.parts.srq.key());
        if ev.kind != AsyncEventKind::SrqLimitReached || ev.element != mine {
            return Ok(false);
        }
        self.parts.refill()?;
        self.parts.arm()?;
        Ok(true)
    }

    /// [`poll`](Self::poll) until it finds something or `timeout` passes (then `Ok(0)`).
    pub fn wait(
        &mut self,
        out: &mut [GroupEvent],
        timeout: Duration,
    ) -> Result<usize, Error<P::Error>> {
        let start = Instant::now();
        loop {
            let n = self.poll(out)?;
            if n > 0 || out.is_empty() || start.elapsed() >= timeout {
                return Ok(n);
            }
            std::thread::yield_now();
        }
    }

    /// What completion `wc` means.
    fn take(&mut self, wc: &WorkCompletion) -> Result<GroupEvent, Error<P::Error>> {
        let unexpected = Error::UnexpectedCompletion { wr_id: wc.wr_id };
        let ok = wc.status == WcStatus::Success;
        let at = self
            .by_qpn
            .binary_search_by_key(&wc.qp_num, |&(qpn, _)| qpn);
        let peer = at.ok().map(|i| self.by_qpn[i].1);
        let p = &mut self.parts;
        match (GroupId::decode(wc.wr_id), peer) {
            (Some(GroupId::Send(i)), Some(peer)) if i as usize == peer && p.sending[peer] => {
                p.sending[peer] = false;
                Ok(match ok {
                    true => GroupEvent::Sent { peer },
                    false => GroupEvent::Failed {
                        peer,
                        send: true,
                        status: wc.status,
                    },
                })
            }
            (Some(GroupId::Recv(s)), Some(peer))
                if p.slots.get(s as usize) == Some(&Slot::Posted) =>
            {
                p.posted -= 1;
                if !ok {
                    p.slots[s as usize] = Slot::Free;
                    p.free.push_back(s);
                    return Ok(GroupEvent::Failed {
                        peer,
                        send: false,
                        status: wc.status,
                    });
                }
                p.slots[s as usize] = Slot::Delivered;
                let len = wc.byte_len.min(p.size as u32);
                Ok(GroupEvent::Received {
                    peer,
                    slot: RecvSlot {
                        index: s,
                        len,
                        imm: wc.imm,
                    },
                })
            }
            _ => Err(unexpected),
        }
    }

    /// The message in `slot` (its `len` bytes).
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for a slot not holding a message (handed back already).
    pub fn received(&self, slot: RecvSlot) -> Result<&[u8], Error<P::Error>> {
        let p = &self.parts;
        if p.slots.get(slot.index as usize) != Some(&Slot::Delivered) {
            return Err(Error::InvalidAttribute("the slot holds no message"));
        }
        // SAFETY: a delivered slot is not posted: the device does not write it until it is
        // handed back (`release`, which takes `&mut self`, so not while this borrow lives).
        Ok(unsafe { p.mem.bytes(slot.index as usize * p.size, slot.len as usize) })
    }

    /// Hands `slot` back, to be posted again (at once if the SRQ runs low).
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for a slot not holding a message; the provider's error
    /// from the refill.
    pub fn release(&mut self, slot: RecvSlot) -> Result<(), Error<P::Error>> {
        let p = &mut self.parts;
        let s = p.slots.get_mut(slot.index as usize);
        let Some(s @ Slot::Delivered) = s else {
            return Err(Error::InvalidAttribute("the slot holds no message"));
        };
        *s = Slot::Free;
        p.free.push_back(slot.index);
        if p.posted <= p.refill_at {
            p.refill()?;
        }
        Ok(())
    }

    /// `peer`'s send buffer, while no send from it is in flight.
    ///
    /// # Errors
    /// [`Error::NoSuchPeer`]; [`Error::QueueFull`] while its send is in flight.
    pub fn send_buf(&mut self, peer: usize) -> Result<&mut [u8], Error<P::Error>> {
        let at = self.send_at(peer)?;
        // SAFETY: no send from this buffer is in flight (checked), so the device does not
        // read it; it is lent once (`&mut self`).
        Ok(unsafe { self.parts.mem.bytes_mut(at, self.parts.size) })
    }

    /// Sends the first `len` bytes of `peer`'s send buffer (signaled);
    /// [`GroupEvent::Sent`] says when the buffer is free again.
    ///
    /// # Errors
    /// [`Error::NoSuchPeer`]; [`Error::QueueFull`] while its last send is in flight;
    /// [`Error::InvalidAttribute`] for more than `size` bytes; the provider's error.
    pub fn send(&mut self, peer: usize, len: usize) -> Result<(), Error<P::Error>> {
        let at = self.send_at(peer)?;
        if len > self.parts.size {
            return Err(Error::InvalidAttribute(
                "a send longer than the send buffer",
            ));
        }
        let mut wr = SendWr::<1>::new(
            GroupId::Send(peer as u32).encode(),
            SendOp::Send,
            SendFlags::SIGNALED,
        );
        wr.sg_list[0] = self.parts.mem.sge(at, len);
        wr.num_sge = 1;
        // SAFETY: the buffer lies in the group's memory, which outlives the queue pair, and
        // is not lent while the send is in flight (`sending`, set below).
        let posted = unsafe { self.qps[peer].post_send(&[wr]) };
        verb("ibv_post_send", posted.map_err(|e| e.error))?;
        self.parts.sending[peer] = true;
        Ok(())
    }

    /// Where `peer`'s send buffer starts, if it is free.
    fn send_at(&self, peer: usize) -> Result<usize, Error<P::Error>> {
        let p = &self.parts;
        match p.sending.get(peer) {
            None => Err(Error::NoSuchPeer {
                peer,
                capacity: self.qps.len(),
            }),
            Some(true) => Err(Error::QueueFull { capacity: 1 }),
            Some(false) => Ok((p.slots.len() + peer) * p.size),
        }
    }
}
