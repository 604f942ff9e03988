//! Unreliable datagrams: address handles, and the UD queue pair's send and receive.
//!
//! A UD queue pair sends each request as one packet to the queue pair its work request
//! names (an address handle for the device, a QPN and a Q_Key), with no acknowledgement
//! and no retransmission. What hardware does, the simulator does (rxe's paths named where
//! the personalities differ):
//!
//! - **Send.** The message is gathered as the request is taken, copied into the wire's
//!   datagram store (the packet carries its index), and the request completes at once:
//!   leaving is as far as a UD send is followed, so it succeeds whatever happens after.
//!   A message longer than the port's MTU emits nothing and still succeeds, with its whole
//!   length as `byte_len` (IBTA C10-93.1.1; rxe's `rxe_requester`). A gather entry outside
//!   the PD's memory fails it with `LocProtErr`, and an RDMA operation (which only rxe's
//!   personality accepts at post, as its user-space provider does) with `LocQpOpErr`; both
//!   move the queue pair to ERR. An address handle whose GID (without a global route, LID)
//!   no device holds loses the packet on the wire (`Hca`), or fails the request with `LocQpOpErr` (`Rxe`: "host not
//!   reachable"). A `remote_qkey` with the high bit set sends the queue pair's own Q_Key
//!   (`Hca`, IBTA C10-15), or is sent as it is (`Rxe`).
//! - **Wire.** The fault model applies as to any packet (loss, delay, duplication;
//!   reordering follows from delays); nothing is retransmitted.
//! - **Receive.** A datagram is dropped, and the drop traced, when its destination is not a
//!   UD queue pair in RTR or RTS on that device, its Q_Key is not the queue pair's, no
//!   receive is posted (UD has no RNR), or the head receive is shorter than 40 bytes of
//!   global route header plus the message (the receive stays posted; rxe since 2024).
//!   (`Rxe`, as rxe of Linux 6.1 does: the receive completes with `LocQpOpErr` and the
//!   queue pair moves to ERR.) Otherwise the head receive takes both: its completion has
//!   `byte_len` = 40 + the message, the sender's QPN (`src_qp`), service level and LID
//!   (`sl`, `slid`; both 0 with `Rxe`: RoCE has no LIDs and rxe keeps no service level)
//!   and `grh` set. A datagram sent without a global route (an address handle by LID
//!   alone, which only `Hca` accepts: a RoCE port refuses it at creation) leaves the 40
//!   bytes as they were, `grh` clear, and `byte_len` still counts them. A receive whose
//!   scatter list leaves the PD's memory completes with `LocProtErr`, the queue pair to
//!   ERR.
//!
//! The global route header is what RoCE v2 delivers (rxe's `execute`): for IPv4-mapped
//! GIDs 20 zero bytes then the IPv4 header (with its checksum), otherwise the 40-byte IPv6
//! header, with the sender's and the destination's GIDs as addresses.
//!
//! UD takes the packet path on every fabric (the direct path is RC's): on the untimed
//! fabric a datagram is an event due at once, delivered before its post returns.

use super::mem::{self, Dst, Spans, Src};
use super::net::Net;
use super::qp::{sg_len, MAX_FLOW_LABEL};
use super::responder::RecvDone;
use super::tables::AhObj;
use super::tables::Tables;
use super::World;
use crate::config::Personality;
use crate::trace::TraceKind;
use crate::types::*;
use crate::wire::{DropReason, Packet, PacketKind, HEADER_BYTES};

/// Bytes of global route header at the start of every UD receive buffer.
pub(crate) use crate::wire::GRH_BYTES;
/// The Q_Key bit that, in a send's `remote_qkey`, asks for the queue pair's own Q_Key.
const QKEY_OWN: u32 = 0x8000_0000;

impl Tables {
    /// Creates an address handle in PD `pd` (see `Pd::create_ah`).
    pub(crate) fn create_ah(
        &mut self,
        pd: usize,
        attr: &AhAttr,
        personality: Personality,
    ) -> Result<AhKey, SimError> {
        if attr.port != 1 || usize::from(attr.sgid_index) >= 2 {
            return Err(SimError::Invalid("port must be 1 and sgid_index 0 or 1"));
        }
        if attr.sl > 15 || attr.flow_label > MAX_FLOW_LABEL {
            return Err(SimError::Invalid(
                "sl exceeds 15 or flow_label exceeds 20 bits",
            ));
        }
        if attr.static_rate > MAX_STATIC_RATE {
            return Err(SimError::Invalid("static_rate is no ibv_rate"));
        }
        if attr.dgid.is_none() && personality == Personality::Rxe {
            // `rdma_check_ah_attr`: a RoCE port needs the global route.
            return Err(SimError::Invalid("RoCE needs a global route (is_global)"));
        }
        let ah = AhObj {
            pd,
            attr: *attr,
            dst_dev: self.route(attr.dgid, attr.dlid),
        };
        let key = self.ahs.insert_keyed(ah);
        self.pd_ref(pd);
        Ok(key)
    }

    /// Destroys the address handle `key` names.
    pub(crate) fn destroy_ah(&mut self, key: AhKey) {
        if let Some(ah) = self.ahs.remove_keyed(key) {
            self.release_pd(ah.pd, false);
        }
    }
}

impl World {
    /// Sends the UD queue pair `q`'s queued requests, oldest first, each completing as it
    /// leaves (see the module docs).
    pub(crate) fn send_datagrams(&mut self, q: usize) {
        loop {
            let status = match self.send_front(q) {
                Some(status) => status,
                None => return,
            };
            if status == WcStatus::Success {
                self.complete_front(q, status);
            } else {
                self.fail_front(q, status);
            }
        }
    }

    /// Puts the head request of `q`'s send queue on the wire; its completion status, or
    /// `None` when there is nothing to send.
    fn send_front(&mut self, q: usize) -> Option<WcStatus> {
        let World { tables, net, .. } = self;
        let qp = tables.qps.get_mut(q)?;
        if qp.state != QpState::ReadyToSend {
            return None;
        }
        let e = qp.sq.front()?;
        let SendOp::Datagram { dest, imm } = e.wr.op else {
            return Some(WcStatus::LocQpOpErr); // refused at post (`QpObj::post_send`)
        };
        let (src_dev, src_qpn, pd) = (qp.dev(), qp.qpn, qp.pd());
        let sges = qp.sq.gathers(0);
        let len = e.wr.total as usize;
        let mut src = Spans::new();
        let inline = e.wr.flags.contains(SendFlags::INLINE);
        let local_ok = if inline {
            src.push(Src::slice(&qp.sq.inline(0)[..len])).is_ok()
        } else {
            tables.mrs.gather(pd, sges, &mut src)
        };
        if !local_ok {
            return Some(WcStatus::LocProtErr);
        }
        let ah = tables.ahs.by_key(dest.ah).filter(|ah| ah.pd == pd);
        let Some(ah) = ah else {
            return Some(WcStatus::LocQpOpErr); // checked at post (`World::post_send`)
        };
        let psn = qp.req.next_psn;
        qp.req.next_psn = (psn + 1) & crate::wire::PSN_MASK;
        let trace =
            |net: &mut Net, kind| net.trace(src_dev, src_qpn, kind, Some(psn), Some(e.wr.wr_id));
        let rxe = net.cfg.personality == Personality::Rxe;
        let mtu = 128usize << (crate::config::PORT_MTU as u8);
        let Some(dst_dev) = ah.dst_dev.filter(|_| len <= mtu) else {
            if len <= mtu && rxe {
                return Some(WcStatus::LocQpOpErr);
            }
            let why = if len > mtu {
                DropReason::OverMtu
            } else {
                DropReason::NoRoute
            };
            trace(net, TraceKind::Drop(PacketKind::Datagram, why));
            return Some(WcStatus::Success);
        };
        let qkey = match dest.remote_qkey & QKEY_OWN {
            QKEY_OWN if !rxe => qp.qkey,
            _ => dest.remote_qkey,
        };
        let sgid = tables.devices[src_dev].gids[usize::from(ah.attr.sgid_index)];
        let (i, d) = net.datagrams.take();
        d.data.resize(len, 0);
        mem::copy(&src, &[Dst::slice(&mut d.data)], len);
        (d.qkey, d.imm) = (qkey, imm);
        d.solicited = e.wr.flags.contains(SendFlags::SOLICITED);
        d.grh = ah.attr.dgid.map(|dgid| grh(&ah.attr, dgid, sgid, len));
        // rxe keeps no service level and RoCE has no LIDs (its completions say 0).
        (d.sl, d.slid) = match rxe {
            true => (0, 0),
            false => (ah.attr.sl, tables.devices[src_dev].lid),
        };
        let pkt = Packet {
            src_dev: src_dev as u32,
            dst_dev: dst_dev as u32,
            src_qpn,
            dst_qpn: dest.remote_qpn,
            psn,
            npkts: 1,
            epoch: 0,
            kind: PacketKind::Datagram,
            dgram: i,
        };
        trace(net, TraceKind::Send(PacketKind::Datagram));
        let copies = net.send(pkt, HEADER_BYTES + len as u64);
        net.datagrams.slots[i as usize].refs = copies;
        if copies == 0 {
            net.datagrams.free.push(i);
        }
        Some(WcStatus::Success)
    }

    /// A datagram arrives at its device: into the head receive of its queue pair, or
    /// dropped (see the module docs).
    pub(crate) fn deliver_datagram(&mut self, pkt: Packet) {
        let (dst, qpn, psn) = (pkt.dst_dev as usize, pkt.dst_qpn, Some(pkt.psn));
        let World { tables, net, .. } = self;
        let rxe = net.cfg.personality == Personality::Rxe;
        let dgram = net.datagrams.slots.get(pkt.dgram as usize);
        let Some((qkey, len)) = dgram.map(|d| (d.qkey, d.data.len())) else {
            return;
        };
        let target = tables
            .qp_by_num(qpn)
            .filter(|(_, qp)| qp.dev() == dst && !qp.dead);
        let qp_index = target.map_or(0, |t| t.0);
        let q = match (net.wire.arrival(dst), target) {
            (Some(why), _) => Err(why),
            (None, None) => Err(DropReason::NoQp),
            (None, Some((_, qp))) if qp.ty != QpType::Ud => Err(DropReason::WrongTransport),
            (None, Some((_, qp)))
                if !matches!(qp.state, QpState::ReadyToReceive | QpState::ReadyToSend) =>
            {
                Err(DropReason::NotReady)
            }
            (None, Some((_, qp))) if qp.qkey != qkey => Err(DropReason::QKey),
            (None, Some((_, qp))) => match qp.rq.read().front() {
                None => Err(DropReason::NoReceive),
                Some(r) if (sg_len(r.sges) as usize) < GRH_BYTES + len && !rxe => {
                    Err(DropReason::ShortReceive)
                }
                Some(_) => Ok(qp_index),
            },
        };
        let q = match q {
            Ok(q) => q,
            Err(why) => {
                net.trace(
                    dst,
                    qpn,
                    TraceKind::Drop(PacketKind::Datagram, why),
                    psn,
                    None,
                );
                net.datagrams.release(pkt.dgram);
                return;
            }
        };
        net.trace(
            dst,
            qpn,
            TraceKind::Deliver(PacketKind::Datagram),
            psn,
            None,
        );
        let d = &net.datagrams.slots[pkt.dgram as usize];
        let qp = tables.qps.get(q).expect("live QP");
        let rq = qp.rq.read();
        let rwr = rq.front().expect("a receive");
        let total = GRH_BYTES + d.data.len();
        let mut spans = Spans::new();
        let status = if (sg_len(rwr.sges) as usize) < total {
            // rxe of Linux 6.1 (before "RDMA/rxe: Fix responder length checking for UD
            // request packets", 2024): `copy_data` fails, a malformed WQE.
            WcStatus::LocQpOpErr
        } else if !tables.mrs.scatter(qp.pd(), rwr.sges, total, &mut spans) {
            WcStatus::LocProtErr
        } else {
            match &d.grh {
                Some(grh) => mem::copy(&[Src::slice(grh), Src::slice(&d.data)], &spans, total),
                // No global route: its 40 bytes are skipped, left as they were.
                None => mem::copy(
                    &[Src::slice(&d.data)],
                    &mem::skip(&spans, GRH_BYTES),
                    d.data.len(),
                ),
            }
            WcStatus::Success
        };
        let (grh, sl, slid) = (d.grh.is_some(), d.sl, d.slid);
        let done = RecvDone {
            wr_id: rwr.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: if status == WcStatus::Success {
                total as u32
            } else {
                0
            },
            imm: d.imm,
            solicited: d.solicited,
        };
        drop((rq, spans));
        net.datagrams.release(pkt.dgram);
        let qp = tables.qps.get_mut(q).expect("live QP");
        let cq = qp.recv_cq();
        let mut wc = qp.retire_recv(&done);
        (wc.src_qp, wc.grh, wc.sl, wc.slid) = (pkt.src_qpn, grh, sl, slid);
        self.push_cqe_se(cq, wc, done.solicited);
        if status != WcStatus::Success {
            self.set_err(q);
        }
    }
}

/// The 40 bytes a UD receive starts with: what RoCE v2 delivers for a message of `len`
/// bytes sent from `sgid` to `dgid` with `ah` (see the module docs).
fn grh(ah: &AhAttr, dgid: Gid, sgid: Gid, len: usize) -> [u8; GRH_BYTES] {
    // BTH, DETH and ICRC follow the network header; UDP too on RoCE v2.
    const BTH_DETH_ICRC: usize = 12 + 8 + 4;
    const UDP: usize = 8;
    let mut h = [0u8; GRH_BYTES];
    let v4 = |g: &Gid| g.0[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
    if v4(&sgid) && v4(&dgid) {
        let ip = &mut h[20..];
        let total = (20 + UDP + BTH_DETH_ICRC + len) as u16;
        ip[0] = 0x45;
        ip[1] = ah.traffic_class;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[6] = 0x40; // don't fragment
        ip[8] = ah.hop_limit;
        ip[9] = 17; // UDP
        ip[12..16].copy_from_slice(&sgid.0[12..]);
        ip[16..20].copy_from_slice(&dgid.0[12..]);
        let sum = ip
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum::<u32>();
        let folded = (sum & 0xffff) + (sum >> 16);
        let folded = (folded & 0xffff) + (folded >> 16);
        ip[10..12].copy_from_slice(&(!(folded as u16)).to_be_bytes());
    } else {
        let word = 6 << 28 | u32::from(ah.traffic_class) << 20 | ah.flow_label & 0xf_ffff;
        h[0..4].copy_from_slice(&word.to_be_bytes());
        h[4..6].copy_from_slice(&((UDP + BTH_DETH_ICRC + len) as u16).to_be_bytes());
        h[6] = 17; // UDP
        h[7] = ah.hop_limit;
        h[8..24].copy_from_slice(&sgid.0);
        h[24..40].copy_from_slice(&dgid.0);
    }
    h
}
