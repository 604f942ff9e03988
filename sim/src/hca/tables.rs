//! The object tables: devices, protection domains, memory regions, completion queues and
//! queue pairs; their creation and destruction, and the lookups by index, key and number.
//!
//! Objects sit in slabs indexed by small integers (no hashing, so iteration order is
//! deterministic); a memory key carries its slot's generation, so a stale key does not
//! validate. Queues are preallocated at creation and never grow.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::comp_channel::{CqNotify, Notifier};
use super::cq_buf::CqWriter;
use super::mem::{Dst, Region, Spans, Src};
use super::qp::{invalid, QpObj, RespState, SendQueue, MAX_24, QPN_BASE};
use super::rq::RqHome;
use crate::gate::LaneCell;
use crate::types::*;

/// Key bit that marks an rkey (lkeys have it clear), so a swapped key never validates.
const RKEY_BIT: u32 = 0x80;
/// Key bits holding the MR slot's generation (1..=127), so stale keys do not validate.
const GEN_MASK: u32 = 0x7f;

/// A vector of optional objects with slot generations. A freed slot is reused lowest
/// index first (so numbering does not depend on how it is stored), found in O(log n).
#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<Option<T>>,
    /// Each slot's generation, beside the slots rather than in each (where a byte would
    /// cost an object's alignment: 7 bytes of padding in every queue pair's slot).
    gens: Vec<u8>,
    /// The free slots below `slots.len()`; room for every slot is reserved as the slab
    /// grows, so that freeing never allocates (a destroy may run on a data-path thread).
    free: BinaryHeap<Reverse<u32>>,
}

impl<T> Slab<T> {
    pub(crate) const fn new() -> Self {
        Slab {
            slots: Vec::new(),
            gens: Vec::new(),
            free: BinaryHeap::new(),
        }
    }

    /// Stores `v` in the lowest free slot; returns its index and generation (1..=127).
    pub(super) fn insert(&mut self, v: T) -> (usize, u8) {
        let i = match self.free.pop() {
            Some(Reverse(i)) => i as usize,
            None => {
                self.slots.push(None);
                self.gens.push(0);
                // `reserve` grows by doubling: amortised O(1).
                let more = self.slots.len() - self.free.len();
                self.free.reserve(more);
                self.slots.len() - 1
            }
        };
        let gen = &mut self.gens[i];
        *gen = *gen % GEN_MASK as u8 + 1;
        self.slots[i] = Some(v);
        (i, *gen)
    }

    /// Index the next `insert` uses.
    pub(super) fn next_index(&self) -> usize {
        self.free.peek().map_or(self.slots.len(), |r| r.0 as usize)
    }

    pub(crate) fn remove(&mut self, i: usize) -> Option<T> {
        let v = self.slots.get_mut(i)?.take();
        if v.is_some() {
            // Below `slots.len()`, which the callers keep within u32 (24-bit QPNs, keys).
            self.free.push(Reverse(i as u32));
        }
        v
    }

    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.slots.get(i)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.slots.get_mut(i)?.as_mut()
    }

    /// The live object at `i` if its generation is `gen`.
    #[inline]
    fn get_gen(&self, i: usize, gen: u8) -> Option<&T> {
        self.slots
            .get(i)
            .filter(|_| self.gens.get(i) == Some(&gen))?
            .as_ref()
    }

    /// Number of slots (live or free); valid indices are below it.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.as_ref())
    }
}

/// A simulated HCA: its name and addresses (its one port's state is the wire's:
/// `wire/link.rs`).
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) lid: u16,
    pub(crate) gids: [Gid; 2],
    /// Its SRQs in the tables (at most `MAX_SRQ`): counted, not found by a scan of every
    /// device's, which made a world's set-up quadratic.
    pub(crate) srqs: u32,
}

/// Who holds an object: its handle, and the objects made in it or on it. It is freed once
/// the handle is gone and nothing refers to it.
#[derive(Debug)]
pub(crate) struct Holders {
    pub(super) refs: u32,
    open: bool,
}

impl Holders {
    /// Held by its new handle only.
    pub(super) const fn new() -> Holders {
        Holders {
            refs: 0,
            open: true,
        }
    }

    /// Lets go of the handle (`handle`) or of one referring object; whether the object is
    /// now held by nothing.
    pub(super) fn release(&mut self, handle: bool) -> bool {
        if handle {
            self.open = false;
        } else {
            self.refs -= 1;
        }
        !self.open && self.refs == 0
    }
}

/// A protection domain; freed once its handle is gone and nothing refers to it.
#[derive(Debug)]
pub(crate) struct PdObj {
    pub(crate) dev: usize,
    pub(super) held: Holders,
}

/// A registered memory region.
#[derive(Debug)]
pub(crate) struct MrObj {
    pub(crate) pd: usize,
    pub(crate) access: AccessFlags,
    pub(crate) region: Region,
}

/// A completion queue; freed once its handle is gone and no QP uses it.
#[derive(Debug)]
pub(crate) struct CqObj {
    pub(crate) dev: usize,
    /// Its completions; the handle holds the reading end.
    pub(crate) buf: CqWriter,
    /// Its completion channel, arming and events (`comp_channel.rs`).
    pub(crate) notify: CqNotify,
    held: Holders,
}

/// An address handle: where datagrams sent with it go.
#[derive(Debug)]
pub(crate) struct AhObj {
    pub(crate) pd: usize,
    pub(crate) attr: AhAttr,
    /// The device `attr` leads to (by its GID, else its LID), found at creation (none:
    /// every datagram is lost).
    pub(crate) dst_dev: Option<usize>,
}

/// The objects the HCAs hold, by index.
#[derive(Debug)]
pub(crate) struct Tables {
    pub(crate) devices: Vec<Device>,
    /// Device index by name and by GID (its bytes: `Gid` has no order).
    by_name: BTreeMap<String, usize>,
    by_gid: BTreeMap<[u8; 16], usize>,
    pub(crate) pds: Slab<PdObj>,
    pub(crate) mrs: Slab<MrObj>,
    pub(crate) cqs: Slab<CqObj>,
    pub(crate) qps: Slab<QpObj>,
    /// Address handles (`ud.rs`).
    pub(crate) ahs: Slab<AhObj>,
    /// Shared receive queues (`srq.rs`).
    pub(crate) srqs: Slab<super::srq::SrqObj>,
    /// Completion channels and their events.
    pub(crate) notifier: Notifier,
    /// The contexts' asynchronous events (`async_events.rs`).
    pub(crate) async_events: super::async_events::AsyncQueues,
    /// Device memory exported as dmabufs, by the file behind the descriptor (device and
    /// inode): the device whose machine holds it, and the memory.
    pub(crate) dmabufs: BTreeMap<(u64, u64), (usize, std::sync::Arc<super::mem::DeviceBlock>)>,
    /// Last epoch handed out.
    pub(crate) epochs: u32,
    /// Send WRs completed on the direct path by QPs since destroyed.
    pub(crate) direct_retired: u64,
}

impl Tables {
    pub(crate) fn new() -> Tables {
        Tables {
            devices: Vec::new(),
            by_name: BTreeMap::new(),
            by_gid: BTreeMap::new(),
            pds: Slab::new(),
            mrs: Slab::new(),
            cqs: Slab::new(),
            qps: Slab::new(),
            ahs: Slab::new(),
            srqs: Slab::new(),
            notifier: Default::default(),
            async_events: Default::default(),
            dmabufs: BTreeMap::new(),
            epochs: 0,
            direct_retired: 0,
        }
    }

    /// A fresh QP incarnation number.
    pub(crate) fn next_epoch(&mut self) -> u32 {
        self.epochs = self.epochs.wrapping_add(1);
        self.epochs
    }

    /// Adds a device (its port is the wire's: `World::add_device`). Device `n` (from 1)
    /// has LID `n` up to the last unicast LID (0xbfff, 49,151 devices); later ones have
    /// none (LID 0: reachable by GID only, as on RoCE). Its GIDs are `fe80::n` and the
    /// IPv4-mapped `::ffff:10.x.y.z` with `n` in the last three bytes, so up to 2^24 - 1
    /// devices.
    pub(crate) fn add_device(&mut self, name: &str) -> Result<(), SimError> {
        if name.is_empty() || self.by_name.contains_key(name) {
            return invalid("device name empty or taken");
        }
        let n = self.devices.len() + 1;
        if n >= 1 << 24 {
            return Err(SimError::QueueFull);
        }
        let lid = u16::try_from(n).ok().filter(|&l| l <= 0xbfff).unwrap_or(0);
        let mut link_local = [0u8; 16];
        link_local[..2].copy_from_slice(&[0xfe, 0x80]);
        link_local[12..].copy_from_slice(&(n as u32).to_be_bytes());
        let mut v4 = [0u8; 16];
        v4[10..12].copy_from_slice(&[0xff, 0xff]);
        v4[12] = 10;
        v4[13..].copy_from_slice(&(n as u32).to_be_bytes()[1..]);
        let i = self.devices.len();
        self.by_name.insert(name.to_owned(), i);
        self.by_gid.insert(link_local, i);
        self.by_gid.insert(v4, i);
        self.devices.push(Device {
            name: name.to_owned(),
            lid,
            gids: [Gid(link_local), Gid(v4)],
            srqs: 0,
        });
        Ok(())
    }

    /// The index of the device called `name`.
    pub(crate) fn device_named(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The index of the device with GID `gid`.
    pub(crate) fn device_with_gid(&self, gid: &Gid) -> Option<usize> {
        self.by_gid.get(&gid.0).copied()
    }

    pub(crate) fn alloc_pd(&mut self, dev: usize) -> usize {
        let pd = PdObj {
            dev,
            held: Holders::new(),
        };
        self.pds.insert(pd).0
    }

    /// Takes a reference to PD `pd` for an object created in it.
    pub(crate) fn pd_ref(&mut self, pd: usize) {
        self.pds.get_mut(pd).expect("live PD").held.refs += 1;
    }

    /// Drops one reference to (or the handle of) PD `pd`; frees it when unused.
    pub(crate) fn release_pd(&mut self, pd: usize, handle: bool) {
        if self.pds.get_mut(pd).is_some_and(|p| p.held.release(handle)) {
            self.pds.remove(pd);
        }
    }

    /// Creates a CQ of `depth` entries, allocated now unless `lazy` (then they grow as
    /// completions arrive, up to the busiest the CQ gets).
    pub(crate) fn create_cq(
        &mut self,
        dev: usize,
        depth: u32,
        lazy: bool,
    ) -> Result<usize, SimError> {
        if !(1..=MAX_CQE).contains(&depth) {
            return invalid("CQ depth must be 1..=MAX_CQE");
        }
        let cq = CqObj {
            dev,
            buf: CqWriter::new(depth as usize, lazy),
            notify: CqNotify::new(self.notifier.next_key()),
            held: Holders::new(),
        };
        Ok(self.cqs.insert(cq).0)
    }

    /// Drops one reference to (or the handle of) CQ `cq`; frees it when unused.
    pub(crate) fn release_cq(&mut self, cq: usize, handle: bool) {
        if self.cqs.get_mut(cq).is_some_and(|c| c.held.release(handle)) {
            self.cqs.remove(cq);
        }
    }

    /// Registers `region` in `pd`; returns (slot, lkey, rkey).
    pub(crate) fn register_mr(
        &mut self,
        pd: usize,
        region: Region,
        access: AccessFlags,
    ) -> Result<(usize, u32, u32), SimError> {
        let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if access.intersects(remote) && !access.contains(AccessFlags::LOCAL_WRITE) {
            return invalid("REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE");
        }
        if self.mrs.next_index() > (u32::MAX >> 8) as usize {
            return Err(SimError::QueueFull);
        }
        let (i, gen) = self.mrs.insert(MrObj { pd, access, region });
        self.pds.get_mut(pd).expect("live PD").held.refs += 1;
        let lkey = (i as u32) << 8 | u32::from(gen);
        Ok((i, lkey, lkey | RKEY_BIT))
    }

    pub(crate) fn deregister_mr(&mut self, mr: usize) {
        if let Some(m) = self.mrs.remove(mr) {
            self.release_pd(m.pd, false);
        }
    }

    /// Creates a queue pair of transport `ty` in RESET, on the SRQ in slot `srq` if one is
    /// given; returns its slot and number.
    pub(crate) fn create_qp(
        &mut self,
        pd: usize,
        cqs: (usize, usize),
        cap: QpCaps,
        sig_all: bool,
        (ty, srq): (QpType, Option<usize>),
        lazy: bool,
    ) -> Result<(usize, u32), SimError> {
        let wr_ok = |n: u32| (1..=MAX_QP_WR).contains(&n);
        let sge_ok = |n: u32| (1..=MAX_SGE as u32).contains(&n);
        // On an SRQ the receive capacities are the SRQ's (verbs ignores these).
        let own_rq = srq.is_none();
        if !(wr_ok(cap.max_send_wr) && (wr_ok(cap.max_recv_wr) || !own_rq)) {
            return invalid("max_send_wr/max_recv_wr must be 1..=MAX_QP_WR");
        }
        if !(sge_ok(cap.max_send_sge) && (sge_ok(cap.max_recv_sge) || !own_rq)) {
            return invalid("max_send_sge/max_recv_sge must be 1..=MAX_SGE");
        }
        if srq.is_some() && ty != QpType::Rc {
            return invalid("an SRQ serves RC queue pairs here");
        }
        if cap.max_inline_data > MAX_INLINE as u32 {
            return invalid("max_inline_data exceeds MAX_INLINE");
        }
        let dev = self.pds.get(pd).expect("live PD").dev;
        let cq_dev = |c| self.cqs.get(c).map(|c: &CqObj| c.dev);
        if cq_dev(cqs.0) != Some(dev) || cq_dev(cqs.1) != Some(dev) {
            return invalid("CQs must belong to the PD's device");
        }
        let qpn = QPN_BASE + self.qps.next_index() as u32;
        if qpn > MAX_24 {
            return Err(SimError::QueueFull);
        }
        let rq = match srq {
            Some(s) => self.attach_srq(s, dev, self.qps.next_index())?,
            None => RqHome::new(cap.max_recv_wr as usize, cap.max_recv_sge as usize, lazy),
        };
        let epoch = self.next_epoch();
        let index = |i: usize| u32::try_from(i).expect("table indices fit in u32");
        let qp = QpObj {
            qpn,
            dev_: index(dev),
            epoch,
            dead: false,
            peer_dev: None,
            req: LaneCell::default(),
            resp: LaneCell::new(RespState::new(lazy)),
            pd_: index(pd),
            send_cq_: index(cqs.0),
            recv_cq_: index(cqs.1),
            sig_all,
            ty,
            qkey: 0,
            state: QpState::Reset,
            access: AccessFlags::empty(),
            rtr: None,
            rts: None,
            sq: SendQueue::new(
                cap.max_send_wr as usize,
                cap.max_send_sge as usize,
                cap.max_inline_data as usize,
                lazy,
            ),
            rq,
            unsig_done: LaneCell::new(0),
            direct_count: LaneCell::new(0),
            counters: Default::default(),
        };
        let (i, _) = self.qps.insert(qp);
        self.pds.get_mut(pd).expect("live PD").held.refs += 1;
        for c in [cqs.0, cqs.1] {
            self.cqs.get_mut(c).expect("live CQ").held.refs += 1;
        }
        Ok((i, qpn))
    }

    /// Slab index of the QP numbered `qpn`, if live.
    pub(crate) fn qp_index(&self, qpn: u32) -> Option<usize> {
        let i = qpn.checked_sub(QPN_BASE)? as usize;
        self.qps.get(i).filter(|q| q.qpn == qpn).map(|_| i)
    }

    /// The live QP numbered `qpn`, and its slab index.
    #[inline]
    pub(crate) fn qp_by_num(&self, qpn: u32) -> Option<(usize, &QpObj)> {
        let i = qpn.checked_sub(QPN_BASE)? as usize;
        self.qps.get(i).filter(|q| q.qpn == qpn).map(|q| (i, q))
    }

    /// The requester connected to responder `p`: the queue pair `p`'s RTR attributes
    /// name, if its own RTR attributes name `p` back.
    pub(crate) fn requester_mut(&mut self, p: usize) -> Option<&mut QpObj> {
        let peer = self.qps.get(p)?;
        let (rtr, qpn) = (peer.rtr?, peer.qpn);
        let r = self.qp_index(rtr.dest_qp_num)?;
        let req = self.qps.get_mut(r)?;
        req.rtr.is_some_and(|a| a.dest_qp_num == qpn).then_some(req)
    }

    /// The device a path leads to: by GID when it has one, else by LID.
    pub(crate) fn route(&self, dgid: Option<Gid>, dlid: u16) -> Option<usize> {
        match dgid {
            Some(gid) => self.device_with_gid(&gid),
            // Device `i` has LID `i + 1`.
            None => {
                let i = usize::from(dlid).checked_sub(1)?;
                (i < self.devices.len()).then_some(i)
            }
        }
    }
}

/// The address handle table: a key is the slot and its generation, so a stale key (its
/// handle destroyed) names nothing.
impl Slab<AhObj> {
    pub(crate) fn insert_keyed(&mut self, ah: AhObj) -> AhKey {
        let (i, gen) = self.insert(ah);
        AhKey((i as u64) << 8 | u64::from(gen))
    }

    pub(crate) fn by_key(&self, key: AhKey) -> Option<&AhObj> {
        let i = usize::try_from(key.0 >> 8).ok()?;
        self.get_gen(i, (key.0 & 0xff) as u8)
    }

    pub(crate) fn remove_keyed(&mut self, key: AhKey) -> Option<AhObj> {
        self.by_key(key)?;
        self.remove((key.0 >> 8) as usize)
    }
}

/// The memory region table: the MR a key names, and scatter/gather lists resolved against
/// it.
impl Slab<MrObj> {
    /// The live MR named by `key` (an rkey when `remote`) in `pd`.
    #[inline(always)]
    pub(crate) fn lookup(&self, key: u32, remote: bool, pd: usize) -> Option<&MrObj> {
        if (key & RKEY_BIT != 0) != remote {
            return None;
        }
        let m = self.get_gen((key >> 8) as usize, (key & GEN_MASK) as u8)?;
        (m.pd == pd).then_some(m)
    }

    /// Resolves a local gather list in `pd` into `out`; false on a protection error.
    /// Zero-length entries are skipped unchecked, as rxe does.
    #[inline(always)]
    pub(crate) fn gather<'w>(&'w self, pd: usize, sges: &[Sge], out: &mut Spans<Src<'w>>) -> bool {
        // A list holds at most `MAX_SGE` entries, so `out` has room for each.
        for s in sges {
            if s.length == 0 {
                continue;
            }
            let src = self.lookup(s.lkey, false, pd);
            match src.and_then(|m| m.region.src(s.addr, s.length as usize)) {
                Some(span) if out.push(span).is_ok() => {}
                _ => return false,
            }
        }
        true
    }

    /// Resolves the entries of a scatter list in `pd` that the first `len` bytes reach into
    /// `out`; false if one names no MR of `pd`, leaves it, or lacks LOCAL_WRITE.
    #[inline(always)]
    pub(crate) fn scatter<'w>(
        &'w self,
        pd: usize,
        sges: &[Sge],
        len: usize,
        out: &mut Spans<Dst<'w>>,
    ) -> bool {
        let mut left = len;
        for s in sges {
            if left == 0 {
                break;
            }
            if s.length == 0 {
                continue;
            }
            let dst = self.lookup(s.lkey, false, pd);
            match dst.and_then(|m| m.region.dst(s.addr, s.length as usize)) {
                Some(span) if out.push(span).is_ok() => {}
                _ => return false,
            }
            left -= left.min(s.length as usize);
        }
        true
    }
}
