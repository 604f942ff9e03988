//! The unpolled operations of the rig: raw sends and receives posted for handles, their
//! waits and polls, and the checks that a handle is refused by a channel that did not post
//! it.

use super::*;

impl<'a> Rig<'a> {
    pub(super) fn post_send(
        &mut self,
        x: usize,
        kind: &RawKind,
        raw: &[RawSge],
        remote: &Remote,
        flags: u8,
    ) {
        let sges: Vec<Sge> = raw.iter().take(S + 2).map(|s| self.raw_sge(x, s)).collect();
        let i = usize::from(remote.region) % R;
        let addr = self.region(1 - x, i).base + self.remote_off(x, remote);
        let rkey = self.rkey(x, remote);
        let op = match kind {
            RawKind::Send => SendOp::Send,
            RawKind::SendImm(imm) => SendOp::SendWithImm(*imm),
            RawKind::Write => SendOp::Write {
                remote_addr: addr,
                rkey,
            },
            RawKind::WriteImm(imm) => SendOp::WriteWithImm {
                remote_addr: addr,
                rkey,
                imm: *imm,
            },
            RawKind::Read => SendOp::Read {
                remote_addr: addr,
                rkey,
            },
            RawKind::CompareSwap { compare, swap } => SendOp::CompareSwap {
                remote_addr: addr,
                rkey,
                compare: self.compare_value(x, remote, compare),
                swap: *swap,
            },
            RawKind::FetchAdd(add) => SendOp::FetchAdd {
                remote_addr: addr,
                rkey,
                add: *add,
            },
        };
        let mut flags = SendFlags::from_bits_truncate(u32::from(flags))
            & (SendFlags::FENCE | SendFlags::SOLICITED | SendFlags::INLINE);
        let mut inline = None;
        if flags.contains(SendFlags::INLINE) {
            let payload = matches!(
                op,
                SendOp::Send
                    | SendOp::SendWithImm(_)
                    | SendOp::Write { .. }
                    | SendOp::WriteWithImm { .. }
            );
            if payload && total(&sges) <= self.model.max_inline {
                // Inline entries are read at post time: only memory we own may be named.
                inline = self.inline_bytes(x, &sges);
                if inline.is_none() {
                    flags.remove(SendFlags::INLINE);
                }
            }
        }
        let want = if sges.len() > S {
            Want::TooManySges(sges.len())
        } else if in_flight(&self.held, &self.model, x, Q::Send, &[]) == N {
            Want::QueueFull
        } else {
            let seq = self.model.take_seq(x, Q::Send);
            let e = MSend {
                seq,
                op,
                sges: sges.clone(),
                flags: flags | SendFlags::SIGNALED,
                inline,
            };
            let r = self.model.post_send(x, e);
            if r.is_err() {
                self.model.untake_seq(x, Q::Send);
            }
            self.model.progress();
            match r {
                Ok(()) => Want::Posted(seq),
                Err(r) => Want::Refused(r, "ibv_post_send"),
            }
        };
        // SAFETY: inline entries name our own live buffers (checked above); other entries
        // are only dereferenced by the simulator after it validated them against a live
        // registration; all buffers outlive every handle, which is waited before the end.
        let res = unsafe { self.ch[x].post_send_unpolled(&sges, op, flags) };
        if let Some(p) = self.check(res, &want, x, "post_send_unpolled") {
            let Want::Posted(seq) = want else {
                unreachable!()
            };
            assert_eq!(p.wr_id(), seq, "post_send_unpolled: wr_id");
            self.held.push(Held {
                x,
                q: Q::Send,
                seq,
                p,
            });
        }
    }

    pub(super) fn post_recv(&mut self, x: usize, raw: &[RawSge]) {
        let sges: Vec<Sge> = raw.iter().take(S + 2).map(|s| self.raw_sge(x, s)).collect();
        let want = if sges.len() > S {
            Want::TooManySges(sges.len())
        } else if in_flight(&self.held, &self.model, x, Q::Recv, &[]) == N {
            Want::QueueFull
        } else {
            let seq = self.model.take_seq(x, Q::Recv);
            let r = self.model.post_recv(
                x,
                MRecv {
                    seq,
                    sges: sges.clone(),
                },
            );
            if r.is_err() {
                self.model.untake_seq(x, Q::Recv);
            }
            self.model.progress();
            match r {
                Ok(()) => Want::Posted(seq),
                Err(r) => Want::Refused(r, "ibv_post_recv"),
            }
        };
        // SAFETY: the simulator writes only into live registrations of this channel's
        // protection domain, after validating each entry; buffers outlive every handle.
        let res = unsafe { self.ch[x].post_receive_unpolled(&sges) };
        if let Some(p) = self.check(res, &want, x, "post_receive_unpolled") {
            let Want::Posted(seq) = want else {
                unreachable!()
            };
            assert_eq!(p.wr_id(), seq, "post_receive_unpolled: wr_id");
            self.held.push(Held {
                x,
                q: Q::Recv,
                seq,
                p,
            });
        }
    }

    pub(super) fn wait(&mut self, idx: u8) {
        if self.held.is_empty() {
            return;
        }
        let k = usize::from(idx) % self.held.len();
        let (x, q, seq) = (self.held[k].x, self.held[k].q, self.held[k].seq);
        let want = match self.model.done.remove(&(x, q, seq)) {
            Some(o) => Want::Done(seq, o),
            None if self.timeouts_left == 0 => return,
            None => {
                self.timeouts_left -= 1;
                self.model.set_err(x);
                self.model.progress();
                self.model.done.remove(&(x, q, seq)).expect("flushed");
                Want::Timeout
            }
        };
        let h = self.held.remove(k);
        self.check_owner(&h);
        self.foreign_refused(x, q, false);
        let res = self.ch[x].wait(h.p);
        self.check_completion(res, &want, x, "wait");
    }

    pub(super) fn try_complete(&mut self, idx: u8) {
        if self.held.is_empty() {
            return;
        }
        let k = usize::from(idx) % self.held.len();
        let h = self.held.remove(k);
        let (x, q, seq) = (h.x, h.q, h.seq);
        self.check_owner(&h);
        self.foreign_refused(x, q, true);
        let res = self.ch[x].try_complete(h.p);
        match self.model.done.remove(&(x, q, seq)) {
            None => match res {
                // Still in flight: the same handle comes back, and is held again.
                Ok(Err(p)) => {
                    assert_eq!(p.wr_id(), seq, "try_complete on side {x}: handle changed");
                    self.held.insert(k, Held { x, q, seq, p });
                }
                res => panic!(
                    "try_complete on side {x} ({q:?} {seq}): expected the handle back, got {res:?}"
                ),
            },
            Some(o) => {
                // Completed: the handle is consumed with the outcome (exactly once, by type).
                let want = Want::Done(seq, o);
                let res = res.map(|r| r.expect("try_complete: completed work not reported"));
                self.check_completion(res, &want, x, "try_complete");
            }
        }
    }

    /// A held handle belongs to its own channel and to no other.
    pub(super) fn check_owner(&self, h: &Held) {
        assert!(
            self.ch[h.x].owns(&h.p) && !self.ch[1 - h.x].owns(&h.p) && !self.decoy.owns(&h.p),
            "side {}: handle {:?} owned by the wrong channel",
            h.x,
            h.p
        );
    }

    /// Hands side `x` a decoy handle on queue `q` (via `try_complete` or `wait`): it must be
    /// refused with `ForeignPending` before anything is polled or taken. The call on the
    /// side's own handle that follows checks that its outcome was not disturbed.
    pub(super) fn foreign_refused(&mut self, x: usize, q: Q, via_try: bool) {
        // Work the decoy's peer never answers: a receive stays in flight; a zero-length
        // write completes, untaken. Either way the decoy's slot is lost with the handle.
        let (sends, recvs) = self.decoy.in_flight();
        let posted = match q {
            Q::Send if sends + 1 < DECOY_N => {
                let op = SendOp::Write {
                    remote_addr: 0,
                    rkey: 0,
                };
                // SAFETY: names no memory.
                unsafe { self.decoy.post_send_unpolled(&[], op, SendFlags::empty()) }
            }
            Q::Recv if recvs + 1 < DECOY_N => {
                // SAFETY: names no memory.
                unsafe { self.decoy.post_receive_unpolled(&[]) }
            }
            _ => return,
        };
        let p = posted.expect("decoy post");
        assert!(!self.ch[x].owns(&p) && self.decoy.owns(&p));
        let decoy_qpn = p.qp_num();
        let before = self.ch[x].in_flight();
        let res = if via_try {
            self.ch[x]
                .try_complete(p)
                .map(|r| r.map(|_| ()).map_err(|p| p.wr_id()))
        } else {
            self.ch[x].wait(p).map(|_| Ok(()))
        };
        if self.trace {
            eprintln!("   foreign handle on {x} ({q:?}): {res:?}");
        }
        match res {
            Err(Error::ForeignPending {
                owner_qp_num,
                qp_num,
            }) => assert_eq!(
                (owner_qp_num, qp_num),
                (decoy_qpn, self.qpn[x]),
                "side {x}: ForeignPending names the wrong queue pairs"
            ),
            res => panic!("side {x}: a foreign handle ({q:?}) was not refused: {res:?}"),
        }
        assert_eq!(
            self.ch[x].in_flight(),
            before,
            "side {x}: refusing a foreign handle changed the ring"
        );
    }
}
