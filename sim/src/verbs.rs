//! Queue pair verbs: the state machine (`modify`) and posting.

use crate::config::{Personality, ROCE_ROUTE_HOP_LIMIT};
use crate::exec::{flush_wc, send_opcode};
use crate::mem::{copy, Dst, RawInline, Src};
use crate::state::{invalid, sg_len, ReqState, RespState, World, MAX_24, MAX_FLOW_LABEL};
use crate::trace::TraceKind;
use crate::types::*;

impl World {
    /// Applies a state transition (see [`Modify`]).
    pub(crate) fn modify(&mut self, q: usize, m: &Modify) -> Result<(), SimError> {
        use QpState::*;
        let epoch = self.next_epoch();
        let peer_dev = match m {
            Modify::Rtr(a) => self.route(a),
            _ => None,
        };
        if matches!(m, Modify::Reset) && self.qps.get(q).is_some_and(|qp| !qp.dead) {
            // A responder in RESET answers nothing (and forgets its RTR attributes, which
            // name the requester that may sleep on its RNR NAK): wake that requester.
            self.wake_parked(q);
        }
        let qp = self.qps.get_mut(q).expect("live QP");
        if qp.dead {
            return core::result::Result::Err(SimError::DeviceFatal);
        }
        let to = match *m {
            Modify::Reset => {
                qp.sq.clear();
                qp.rq.clear();
                qp.unsig_done = 0;
                (qp.init, qp.rtr, qp.rts) = (None, None, None);
                (qp.req, qp.resp, qp.peer_dev) = (ReqState::default(), RespState::default(), None);
                qp.epoch = epoch;
                self.events.cancel_timer(q);
                Reset
            }
            Modify::Err => {
                self.set_err(q);
                return Ok(());
            }
            Modify::Init(a) => {
                if !matches!(qp.state, Reset | Init) {
                    return invalid("INIT only from RESET or INIT");
                }
                if a.port != 1 || a.pkey_index != 0 {
                    return invalid("port must be 1 and pkey_index 0");
                }
                qp.init = Some(a);
                Init
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
                if a.sl > 15 || a.flow_label > MAX_FLOW_LABEL {
                    return invalid("sl exceeds 15 or flow_label exceeds 20 bits");
                }
                // The port's active MTU is 4096, the largest there is: any path_mtu fits.
                let a = match self.cfg.personality {
                    Personality::Hca => a,
                    Personality::Rxe => RtrAttr {
                        sl: 0,
                        hop_limit: match a.dgid {
                            Some(_) => ROCE_ROUTE_HOP_LIMIT,
                            None => a.hop_limit,
                        },
                        ..a
                    },
                };
                qp.rtr = Some(a);
                qp.resp.epsn = a.rq_psn;
                qp.peer_dev = peer_dev;
                Rtr
            }
            Modify::Rts(a) => {
                if !matches!(qp.state, Rtr | Rts) {
                    return invalid("RTS only from RTR or RTS");
                }
                if a.sq_psn > MAX_24 || a.timeout > 31 || a.retry_cnt > 7 || a.rnr_retry > 7 {
                    return invalid("bad sq_psn, timeout, retry_cnt or rnr_retry");
                }
                if qp.state == Rtr {
                    qp.req.next_psn = a.sq_psn;
                }
                (qp.req.retries, qp.req.rnr_left) = (a.retry_cnt, a.rnr_retry);
                qp.rts = Some(a);
                Rts
            }
        };
        self.set_state(q, to);
        if to == Rtr {
            self.wake_not_ready(q);
        }
        if to == Rts {
            self.pump(q);
        }
        Ok(())
    }

    /// The device an RTR path leads to: by GID when it has one, else by LID.
    fn route(&self, a: &RtrAttr) -> Option<usize> {
        match a.dgid {
            Some(gid) => self.devices.iter().position(|d| d.gids.contains(&gid)),
            None => {
                let i = usize::from(a.dlid).checked_sub(1)?;
                (i < self.devices.len()).then_some(i)
            }
        }
    }

    /// Crashes device `dev`: its queue pairs vanish without completions, its CQs empty,
    /// and packets to or from it are lost from now on.
    pub(crate) fn crash(&mut self, dev: usize) {
        self.devices[dev].crashed = true;
        for q in 0..self.qps.slots() {
            let epoch = self.next_epoch();
            let Some(qp) = self.qps.get_mut(q).filter(|qp| qp.dev == dev) else {
                continue;
            };
            qp.sq.clear();
            qp.rq.clear();
            qp.unsig_done = 0;
            (qp.req, qp.resp, qp.dead, qp.epoch) =
                (ReqState::default(), RespState::default(), true, epoch);
            self.events.cancel_timer(q);
            self.set_state(q, QpState::Err);
        }
        for c in 0..self.cqs.slots() {
            if let Some(cq) = self.cqs.get_mut(c).filter(|c| c.dev == dev) {
                cq.entries.clear();
            }
        }
        // Peers asleep on an RNR NAK from a queue pair that just vanished.
        self.wake_unreachable();
    }

    /// Posts send WRs in order (see `Qp::post_send`); the error names the first refused
    /// (those before it stay posted). `next` writes the next request into the scratch
    /// `SendWr` it is given (whose entries past `num_sge` are stale) and returns true, or
    /// returns false when there is none.
    ///
    /// On an untimed fabric nothing executes before the whole list is posted (INLINE data
    /// is captured at post, before earlier requests of the list could change it, and all of
    /// them hold send queue slots), as on the packet path, where execution waits for the
    /// events run at the end of the call; then the direct path takes what it can.
    pub(crate) fn post_send_list(
        &mut self,
        q: usize,
        mut next: impl FnMut(&mut SendWr) -> bool,
        raw: Option<&RawInline>,
    ) -> Result<(), (usize, SimError)> {
        let mut wr = SendWr {
            wr_id: 0,
            sg_list: [Sge::default(); MAX_SGE],
            num_sge: 0,
            op: SendOp::Send,
            flags: SendFlags::empty(),
        };
        let mut res = Ok(());
        let mut posted = 0;
        for index in 0.. {
            if !next(&mut wr) {
                break;
            }
            if self.untimed && index > 0 {
                self.fail_head_now(q);
            }
            if let Err(error) = self.post_send(q, &wr, raw) {
                res = Err((index, error));
                break;
            }
            posted += 1;
        }
        self.count_posts(q, true, posted);
        if self.untimed {
            self.run_direct(q);
            self.pump(q);
        }
        res
    }

    /// Validates and queues one send WR (see `Qp::post_send`). With `raw`, inline SGEs are
    /// read from their addresses; otherwise they must lie in memory registered in the PD.
    /// On an untimed fabric transmission waits for the end of the list (`post_send_list`).
    fn post_send(
        &mut self,
        q: usize,
        wr: &SendWr,
        raw: Option<&RawInline>,
    ) -> Result<(), SimError> {
        let World { qps, mrs, cfg, .. } = self;
        let qp = qps.get_mut(q).expect("live QP");
        if qp.dead {
            return Err(SimError::DeviceFatal);
        }
        if !matches!(qp.state, QpState::Rts | QpState::Err) {
            return invalid("QP not in RTS");
        }
        if wr.num_sge > qp.cap.max_send_sge as usize {
            return invalid("num_sge exceeds max_send_sge");
        }
        if let (
            Personality::Rxe,
            SendOp::CompareSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. },
        ) = (cfg.personality, wr.op)
        {
            if remote_addr % 8 != 0 {
                return invalid("atomic remote address not 8-byte aligned (rxe)");
            }
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
            let wc = flush_wc(wr.wr_id, send_opcode(&wr.op), qp.qpn);
            let cq = qp.send_cq;
            self.push_cqe(cq, wc);
            self.count_send_end(q, true);
            return Ok(());
        }
        // Inline data is resolved before anything is queued (a bad source refuses the
        // post) and copied into the entry's slot.
        let mut spans = [Src::EMPTY; MAX_SGE];
        let mut inline_len = 0;
        if inline {
            for (s, span) in sges.iter().filter(|s| s.length > 0).zip(&mut spans) {
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
                *span = src;
                inline_len += n;
            }
        }
        qp.sq.push_with(|e| {
            e.wr.wr_id = wr.wr_id;
            e.wr.sg_list[..sges.len()].copy_from_slice(sges);
            (e.wr.num_sge, e.wr.op, e.wr.flags) = (wr.num_sge, wr.op, wr.flags);
            (e.psn, e.npkts, e.sent_once) = (0, 1, false);
            if inline_len > 0 {
                copy(
                    &spans,
                    &[Dst::slice(&mut e.inline[..inline_len])],
                    inline_len,
                );
            }
        });
        let (dev, qpn) = (qp.dev, qp.qpn);
        self.trace(
            dev,
            qpn,
            TraceKind::PostSend(send_opcode(&wr.op)),
            None,
            Some(wr.wr_id),
        );
        if !self.untimed {
            self.pump(q);
        }
        Ok(())
    }

    /// Untimed fabric, before the next request of a list: the packet path transmits each
    /// request as it is posted, which fails one at the head of the queue at once when its
    /// local checks fail (so the QP is in ERR for the rest of the list, whose requests are
    /// flushed rather than refused as `QueueFull`). Nothing else it does is visible before
    /// the list is posted.
    fn fail_head_now(&mut self, q: usize) {
        let qp = self.qps.get(q).expect("live QP");
        let head = qp
            .sq
            .front()
            .filter(|_| qp.sq.len() == 1 && qp.req.sent == 0);
        if head.is_some_and(|e| self.local_check(qp, &e.wr).is_err()) {
            self.pump(q);
        }
    }

    /// Validates and queues one receive WR (see `Qp::post_recv`).
    pub(crate) fn post_recv(&mut self, q: usize, wr: &RecvWr) -> Result<(), SimError> {
        let qp = self.qps.get_mut(q).expect("live QP");
        if qp.dead {
            return Err(SimError::DeviceFatal);
        }
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
            let wc = flush_wc(wr.wr_id, WcOpcode::Recv, qp.qpn);
            let cq = qp.recv_cq;
            self.push_cqe(cq, wc);
        } else {
            qp.rq.push_back(*wr);
            let (dev, qpn) = (qp.dev, qp.qpn);
            self.trace(dev, qpn, TraceKind::PostRecv, None, Some(wr.wr_id));
            self.wake_parked(q);
        }
        Ok(())
    }
}
