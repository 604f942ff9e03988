//! The fabric's state: object tables, the queue pair state machine and posting.
//!
//! Everything lives in one [`World`] behind the fabric's mutex. Objects sit in slabs indexed
//! by small integers (no hashing, so iteration order is deterministic). Queues are
//! preallocated at creation and never grow: posting, executing and polling do not allocate.

use std::collections::VecDeque;

use crate::mem::{copy, Dst, RawInline, Region};
use crate::types::*;

/// Number of the first queue pair; QPN = `QPN_BASE` + slab index.
pub(crate) const QPN_BASE: u32 = 0x11;
/// Largest 24-bit value (PSNs, QPNs).
const MAX_24: u32 = (1 << 24) - 1;
/// Key bit that marks an rkey (lkeys have it clear), so a swapped key never validates.
const RKEY_BIT: u32 = 0x80;
/// Key bits holding the MR slot's generation (1..=127), so stale keys do not validate.
const GEN_MASK: u32 = 0x7f;

/// A vector of optional objects with slot generations.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    slots: Vec<(u8, Option<T>)>,
}

impl<T> Slab<T> {
    const fn new() -> Self {
        Slab { slots: Vec::new() }
    }

    /// Stores `v` in the first free slot; returns its index and generation (1..=127).
    fn insert(&mut self, v: T) -> (usize, u8) {
        let i = match self.slots.iter().position(|s| s.1.is_none()) {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[i];
        slot.0 = slot.0 % GEN_MASK as u8 + 1;
        slot.1 = Some(v);
        (i, slot.0)
    }

    /// Index the next `insert` uses.
    fn next_index(&self) -> usize {
        let free = self.slots.iter().position(|s| s.1.is_none());
        free.unwrap_or(self.slots.len())
    }

    pub(crate) fn remove(&mut self, i: usize) -> Option<T> {
        self.slots.get_mut(i)?.1.take()
    }

    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.slots.get(i)?.1.as_ref()
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.slots.get_mut(i)?.1.as_mut()
    }

    /// The live object at `i` if its generation is `gen`.
    fn get_gen(&self, i: usize, gen: u8) -> Option<&T> {
        self.slots.get(i).filter(|s| s.0 == gen)?.1.as_ref()
    }

    /// Number of slots (live or free); valid indices are below it.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.1.as_ref())
    }
}

/// A simulated HCA with one port.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) lid: u16,
    pub(crate) gids: [Gid; 2],
}

/// A protection domain; freed once its handle is gone and nothing refers to it.
#[derive(Debug)]
pub(crate) struct PdObj {
    pub(crate) dev: usize,
    refs: u32,
    open: bool,
}

/// A registered memory region.
#[derive(Debug)]
pub(crate) struct MrObj {
    pub(crate) pd: usize,
    pub(crate) access: Access,
    pub(crate) region: Region,
}

/// A completion queue; freed once its handle is gone and no QP uses it.
#[derive(Debug)]
pub(crate) struct CqObj {
    pub(crate) dev: usize,
    pub(crate) depth: usize,
    pub(crate) entries: VecDeque<Wc>,
    pub(crate) overflowed: bool,
    refs: u32,
    open: bool,
}

/// A queued send work request, with its inline payload copied at post time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqEntry {
    pub(crate) wr: SendWr,
    pub(crate) inline: [u8; MAX_INLINE],
}

/// A reliable-connected queue pair.
#[derive(Debug)]
pub(crate) struct QpObj {
    pub(crate) qpn: u32,
    pub(crate) pd: usize,
    pub(crate) send_cq: usize,
    pub(crate) recv_cq: usize,
    pub(crate) cap: QpCap,
    pub(crate) sig_all: bool,
    pub(crate) state: QpState,
    pub(crate) init: Option<InitAttr>,
    pub(crate) rtr: Option<RtrAttr>,
    /// Stored for the next issue's retry/timeout model.
    pub(crate) rts: Option<RtsAttr>,
    /// Send WRs not yet executed, oldest first.
    pub(crate) sq: VecDeque<SqEntry>,
    /// Receive WRs not yet consumed, oldest first.
    pub(crate) rq: VecDeque<RecvWr>,
    /// Executed unsignaled WRs still holding SQ slots (released by the next send CQE).
    pub(crate) unsig_done: usize,
}

/// The whole simulated fabric.
#[derive(Debug)]
pub(crate) struct World {
    pub(crate) devices: Vec<Device>,
    pub(crate) pds: Slab<PdObj>,
    pub(crate) mrs: Slab<MrObj>,
    pub(crate) cqs: Slab<CqObj>,
    pub(crate) qps: Slab<QpObj>,
}

fn invalid<T>(why: &'static str) -> Result<T, SimError> {
    Err(SimError::Invalid(why))
}

/// Total byte length of a scatter/gather list.
pub(crate) fn sg_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

impl World {
    pub(crate) const fn new() -> World {
        World {
            devices: Vec::new(),
            pds: Slab::new(),
            mrs: Slab::new(),
            cqs: Slab::new(),
            qps: Slab::new(),
        }
    }

    pub(crate) fn add_device(&mut self, name: &str) -> Result<(), SimError> {
        if name.is_empty() || self.devices.iter().any(|d| d.name == name) {
            return invalid("device name empty or taken");
        }
        let n = self.devices.len() + 1;
        let lid = match u16::try_from(n) {
            Ok(lid) if lid <= 0xbfff => lid, // unicast LIDs end at 0xbfff
            _ => return Err(SimError::QueueFull),
        };
        let mut link_local = [0u8; 16];
        link_local[..2].copy_from_slice(&[0xfe, 0x80]);
        link_local[14..].copy_from_slice(&lid.to_be_bytes());
        let mut v4 = [0u8; 16];
        v4[10..12].copy_from_slice(&[0xff, 0xff]);
        v4[12] = 10;
        v4[13..].copy_from_slice(&(n as u32).to_be_bytes()[1..]);
        self.devices.push(Device {
            name: name.to_owned(),
            lid,
            gids: [link_local, v4],
        });
        Ok(())
    }

    pub(crate) fn alloc_pd(&mut self, dev: usize) -> usize {
        let pd = PdObj {
            dev,
            refs: 0,
            open: true,
        };
        self.pds.insert(pd).0
    }

    /// Drops one reference to (or the handle of) PD `pd`; frees it when unused.
    pub(crate) fn release_pd(&mut self, pd: usize, handle: bool) {
        let Some(p) = self.pds.get_mut(pd) else {
            return;
        };
        if handle {
            p.open = false;
        } else {
            p.refs -= 1;
        }
        if !p.open && p.refs == 0 {
            self.pds.remove(pd);
        }
    }

    pub(crate) fn create_cq(&mut self, dev: usize, depth: u32) -> Result<usize, SimError> {
        if !(1..=MAX_CQE).contains(&depth) {
            return invalid("CQ depth must be 1..=MAX_CQE");
        }
        let cq = CqObj {
            dev,
            depth: depth as usize,
            entries: VecDeque::with_capacity(depth as usize),
            overflowed: false,
            refs: 0,
            open: true,
        };
        Ok(self.cqs.insert(cq).0)
    }

    /// Drops one reference to (or the handle of) CQ `cq`; frees it when unused.
    pub(crate) fn release_cq(&mut self, cq: usize, handle: bool) {
        let Some(c) = self.cqs.get_mut(cq) else {
            return;
        };
        if handle {
            c.open = false;
        } else {
            c.refs -= 1;
        }
        if !c.open && c.refs == 0 {
            self.cqs.remove(cq);
        }
    }

    /// Registers `region` in `pd`; returns (slot, lkey, rkey).
    pub(crate) fn register_mr(
        &mut self,
        pd: usize,
        region: Region,
        access: Access,
    ) -> Result<(usize, u32, u32), SimError> {
        let remote = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if access.intersects(remote) && !access.contains(Access::LOCAL_WRITE) {
            return invalid("REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE");
        }
        if self.mrs.next_index() > (u32::MAX >> 8) as usize {
            return Err(SimError::QueueFull);
        }
        let (i, gen) = self.mrs.insert(MrObj { pd, access, region });
        self.pds.get_mut(pd).expect("live PD").refs += 1;
        let lkey = (i as u32) << 8 | u32::from(gen);
        Ok((i, lkey, lkey | RKEY_BIT))
    }

    pub(crate) fn deregister_mr(&mut self, mr: usize) {
        if let Some(m) = self.mrs.remove(mr) {
            self.release_pd(m.pd, false);
        }
    }

    /// The live MR named by `key` (an rkey when `remote`) in `pd`.
    pub(crate) fn mr(&self, key: u32, remote: bool, pd: usize) -> Option<&MrObj> {
        if (key & RKEY_BIT != 0) != remote {
            return None;
        }
        let m = self
            .mrs
            .get_gen((key >> 8) as usize, (key & GEN_MASK) as u8)?;
        (m.pd == pd).then_some(m)
    }

    pub(crate) fn create_qp(
        &mut self,
        pd: usize,
        cqs: (usize, usize),
        cap: QpCap,
        sig_all: bool,
    ) -> Result<(usize, u32), SimError> {
        let wr_ok = |n: u32| (1..=MAX_QP_WR).contains(&n);
        let sge_ok = |n: u32| (1..=MAX_SGE as u32).contains(&n);
        if !(wr_ok(cap.max_send_wr) && wr_ok(cap.max_recv_wr)) {
            return invalid("max_send_wr/max_recv_wr must be 1..=MAX_QP_WR");
        }
        if !(sge_ok(cap.max_send_sge) && sge_ok(cap.max_recv_sge)) {
            return invalid("max_send_sge/max_recv_sge must be 1..=MAX_SGE");
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
        let qp = QpObj {
            qpn,
            pd,
            send_cq: cqs.0,
            recv_cq: cqs.1,
            cap,
            sig_all,
            state: QpState::Reset,
            init: None,
            rtr: None,
            rts: None,
            sq: VecDeque::with_capacity(cap.max_send_wr as usize),
            rq: VecDeque::with_capacity(cap.max_recv_wr as usize),
            unsig_done: 0,
        };
        let (i, _) = self.qps.insert(qp);
        self.pds.get_mut(pd).expect("live PD").refs += 1;
        for c in [cqs.0, cqs.1] {
            self.cqs.get_mut(c).expect("live CQ").refs += 1;
        }
        Ok((i, qpn))
    }

    /// Destroys QP `q`, discarding its work without completions.
    pub(crate) fn destroy_qp(&mut self, q: usize) {
        if let Some(qp) = self.qps.remove(q) {
            self.release_cq(qp.send_cq, false);
            self.release_cq(qp.recv_cq, false);
            self.release_pd(qp.pd, false);
        }
    }

    /// Slab index of the QP numbered `qpn`, if live.
    pub(crate) fn qp_index(&self, qpn: u32) -> Option<usize> {
        let i = qpn.checked_sub(QPN_BASE)? as usize;
        self.qps.get(i).filter(|q| q.qpn == qpn).map(|_| i)
    }

    pub(crate) fn modify(&mut self, q: usize, m: &Modify) -> Result<(), SimError> {
        use QpState::*;
        let qp = self.qps.get_mut(q).expect("live QP");
        match *m {
            Modify::Reset => {
                qp.sq.clear();
                qp.rq.clear();
                qp.unsig_done = 0;
                (qp.init, qp.rtr, qp.rts) = (None, None, None);
                qp.state = Reset;
            }
            Modify::Err => self.set_err(q),
            Modify::Init(a) => {
                if !matches!(qp.state, Reset | Init) {
                    return invalid("INIT only from RESET or INIT");
                }
                if a.port != 1 || a.pkey_index != 0 {
                    return invalid("port must be 1 and pkey_index 0");
                }
                qp.init = Some(a);
                qp.state = Init;
            }
            Modify::Rtr(a) => {
                if qp.state != Init {
                    return invalid("RTR only from INIT");
                }
                if a.port != 1 || a.dest_qp_num > MAX_24 || a.rq_psn > MAX_24 {
                    return invalid("bad port, dest_qp_num or rq_psn");
                }
                if a.min_rnr_timer > 31 || usize::from(a.sgid_index) >= 2 {
                    return invalid("bad min_rnr_timer or sgid_index");
                }
                // The port's active MTU is 4096, the largest there is: any path_mtu fits.
                qp.rtr = Some(a);
                qp.state = Rtr;
            }
            Modify::Rts(a) => {
                if !matches!(qp.state, Rtr | Rts) {
                    return invalid("RTS only from RTR or RTS");
                }
                if a.sq_psn > MAX_24 || a.timeout > 31 || a.retry_cnt > 7 || a.rnr_retry > 7 {
                    return invalid("bad sq_psn, timeout, retry_cnt or rnr_retry");
                }
                qp.rts = Some(a);
                qp.state = Rts;
            }
        }
        Ok(())
    }

    /// Validates and queues one send WR (see `Qp::post_send`). With `raw`, inline SGEs are
    /// read from their addresses; otherwise they must lie in memory registered in the PD.
    pub(crate) fn post_send(
        &mut self,
        q: usize,
        wr: SendWr,
        raw: Option<&RawInline>,
    ) -> Result<(), SimError> {
        let World { qps, mrs, .. } = self;
        let qp = qps.get_mut(q).expect("live QP");
        if !matches!(qp.state, QpState::Rts | QpState::Err) {
            return invalid("QP not in RTS");
        }
        if wr.num_sge > qp.cap.max_send_sge as usize {
            return invalid("num_sge exceeds max_send_sge");
        }
        let sges = &wr.sg_list[..wr.num_sge];
        let inline = wr.flags.contains(SendFlags::INLINE);
        if inline {
            use SendOp::*;
            let ok_op = matches!(
                wr.op,
                Send | SendWithImm { .. } | Write { .. } | WriteWithImm { .. }
            );
            if !ok_op {
                return invalid("INLINE on an operation without payload to send");
            }
            if sg_len(sges) > u64::from(qp.cap.max_inline_data) {
                return invalid("inline data exceeds max_inline_data");
            }
        }
        if qp.sq.len() + qp.unsig_done >= qp.cap.max_send_wr as usize {
            return Err(SimError::QueueFull);
        }
        if qp.state == QpState::Err {
            let wc = crate::exec::flush_wc(wr.wr_id, crate::exec::send_opcode(&wr.op), qp.qpn);
            let cq = qp.send_cq;
            self.push_cqe(cq, wc);
            return Ok(());
        }
        let mut entry = SqEntry {
            wr,
            inline: [0; MAX_INLINE],
        };
        if inline {
            let mut off = 0;
            for s in sges.iter().filter(|s| s.length > 0) {
                let n = s.length as usize;
                let pd = qp.pd;
                let src = match raw {
                    Some(r) => r.src(s.addr, n),
                    None => mrs
                        .iter()
                        .find(|m| m.pd == pd && m.region.contains(s.addr, n))
                        .and_then(|m| m.region.src(s.addr, n)),
                };
                let Some(src) = src else {
                    return invalid("inline data outside registered memory");
                };
                copy(&[src], &[Dst::slice(&mut entry.inline[off..off + n])], n);
                off += n;
            }
        }
        qp.sq.push_back(entry);
        Ok(())
    }

    /// Validates and queues one receive WR (see `Qp::post_recv`).
    pub(crate) fn post_recv(&mut self, q: usize, wr: RecvWr) -> Result<(), SimError> {
        let qp = self.qps.get_mut(q).expect("live QP");
        if qp.state == QpState::Reset {
            return invalid("QP in RESET");
        }
        if wr.num_sge > qp.cap.max_recv_sge as usize {
            return invalid("num_sge exceeds max_recv_sge");
        }
        if qp.rq.len() >= qp.cap.max_recv_wr as usize {
            return Err(SimError::QueueFull);
        }
        if qp.state == QpState::Err {
            let wc = crate::exec::flush_wc(wr.wr_id, WcOpcode::Recv, qp.qpn);
            let cq = qp.recv_cq;
            self.push_cqe(cq, wc);
        } else {
            qp.rq.push_back(wr);
        }
        Ok(())
    }
}
