//! Scopes in the rig: several writes with doorbells in between, predicted as one batch,
//! and settling what the model says is still to come.

use super::*;

impl<'a> Rig<'a> {
    pub(super) fn scope(&mut self, x: usize, items: &[ScopeItem]) {
        // Plan: resolve every item; a region read or received into is borrowed exclusively
        // for the whole scope, so later items touching it are dropped.
        let mut excl = [false; R];
        let mut shared = [false; R];
        let mut plan: Vec<Planned> = Vec::new();
        for item in items.iter().take(2 * N + 2) {
            let (locals, mutable) = match &item.kind {
                ScopeKind::Write { data, .. }
                | ScopeKind::WriteImm { data, .. }
                | ScopeKind::Send { data, .. } => (self.locals(x, data, false), false),
                ScopeKind::Read { into, .. } | ScopeKind::Recv { into } => {
                    (vec![self.map_local(x, into)], true)
                }
            };
            let clash = locals.iter().any(|l| excl[l.0] || (mutable && shared[l.0]));
            if clash {
                continue;
            }
            for l in &locals {
                if mutable {
                    excl[l.0] = true;
                } else {
                    shared[l.0] = true;
                }
            }
            let t = total(&self.sges_of(x, &locals));
            let (q, remote) = match &item.kind {
                ScopeKind::Write { remote, .. }
                | ScopeKind::WriteImm { remote, .. }
                | ScopeKind::Read { remote, .. } => {
                    (Q::Send, Some(self.remote_region(x, remote, t)))
                }
                ScopeKind::Send { .. } => (Q::Send, None),
                ScopeKind::Recv { .. } => (Q::Recv, None),
            };
            plan.push(Planned {
                kind: item.kind.clone(),
                locals,
                q,
                remote,
                doorbell: item.doorbell,
            });
        }

        // The model: stage, make room when a ring is full, doorbells, drains.
        let Some((want, ids)) = self.scope_model(x, &plan) else {
            return;
        };

        // The real scope.
        let mut sh: Vec<Option<&MemoryRegion<'a, Sim>>> = Vec::new();
        let mut ex: Vec<Option<&mut MemoryRegion<'a, Sim>>> = Vec::new();
        for (i, mr) in self.mrs[x].iter_mut().enumerate() {
            if excl[i] {
                sh.push(None);
                ex.push(Some(mr));
            } else {
                sh.push(Some(&*mr));
                ex.push(None);
            }
        }
        let mut got_ids = Vec::new();
        let res = self.ch[x].scope(|s| {
            for p in &plan {
                let shared = || -> Result<Vec<LocalSlice<'_>>, BoundsError> {
                    p.locals
                        .iter()
                        .map(|&(i, st, n)| sh[i].expect("shared region").slice(st..st + n))
                        .collect()
                };
                let mut one_mut = || {
                    let (i, st, n) = p.locals[0];
                    ex[i]
                        .take()
                        .expect("exclusive region")
                        .slice_mut(st..st + n)
                };
                let id = match &p.kind {
                    ScopeKind::Write { .. } => {
                        s.post_write(shared()?, &p.remote.expect("remote")?)?
                    }
                    ScopeKind::WriteImm { imm, .. } => {
                        s.post_write_with_imm(shared()?, &p.remote.expect("remote")?, *imm)?
                    }
                    ScopeKind::Read { .. } => {
                        let into = one_mut()?;
                        s.post_read([into], &p.remote.expect("remote")?)?
                    }
                    ScopeKind::Send { imm: Some(imm), .. } => {
                        s.post_send_with_imm(shared()?, *imm)?
                    }
                    ScopeKind::Send { imm: None, .. } => s.post_send(shared()?)?,
                    ScopeKind::Recv { .. } => s.post_receive([one_mut()?])?.wr_id(),
                };
                got_ids.push((p.q, id));
                if p.doorbell {
                    s.ring_doorbell()?;
                }
            }
            Ok(())
        });
        self.check(res, &want, x, "scope");
        assert_eq!(got_ids, ids, "scope on side {x}: wr_ids");
    }

    /// Predicts a scope on `x`; `None` if some of its work would wait for nothing (the
    /// scope would time out), in which case it is skipped.
    pub(super) fn scope_model(
        &mut self,
        x: usize,
        plan: &[Planned],
    ) -> Option<(Want, Vec<(Q, u64)>)> {
        let mut m = self.model.clone();
        let mut staged: Vec<MSend> = Vec::new();
        let mut staged_recv: Vec<MRecv> = Vec::new();
        let mut ours: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        let mut ids = Vec::new();
        let mut first: Option<Want> = None;
        let mut closure_err = None;
        let qi = |q: Q| usize::from(q == Q::Recv);

        // ring_doorbell: receives as one chain, then sends as one chain, last signaled.
        let doorbell = |m: &mut Model, staged: &mut Vec<MSend>, staged_recv: &mut Vec<MRecv>| {
            for r in staged_recv.drain(..) {
                m.post_recv(x, r).expect("model: a scope's receive refused");
            }
            m.progress();
            if let Some(last) = staged.last_mut() {
                last.flags |= SendFlags::SIGNALED;
            }
            for e in staged.drain(..) {
                m.post_send(x, e).expect("model: a scope's send refused");
            }
            m.progress();
        };
        // drain(q): every request of ours on q, in order; the first error is kept.
        let drain =
            |m: &mut Model, ours: &mut Vec<u64>, q: Q, first: &mut Option<Want>| -> Option<()> {
                for seq in ours.drain(..) {
                    let o = m.done.remove(&(x, q, seq))?;
                    if o.status != WcStatus::Success && first.is_none() {
                        *first = Some(Want::Done(seq, o));
                    }
                }
                Some(())
            };
        for p in plan {
            let sges = self.sges_of(x, &p.locals);
            let op = match (&p.kind, p.remote) {
                (_, Some(Err(_))) => {
                    closure_err = Some(Want::OutOfBounds);
                    break;
                }
                _ if sges.len() > S => {
                    closure_err = Some(Want::TooManySges(sges.len()));
                    break;
                }
                (_, Some(Ok(rr))) if total(&sges) > rr.len => {
                    closure_err = Some(Want::OutOfBounds);
                    break;
                }
                (ScopeKind::Write { .. }, Some(Ok(rr))) => Some(SendOp::Write {
                    remote_addr: rr.addr,
                    rkey: rr.rkey,
                }),
                (ScopeKind::WriteImm { imm, .. }, Some(Ok(rr))) => Some(SendOp::WriteWithImm {
                    remote_addr: rr.addr,
                    rkey: rr.rkey,
                    imm: *imm,
                }),
                (ScopeKind::Read { .. }, Some(Ok(rr))) => Some(SendOp::Read {
                    remote_addr: rr.addr,
                    rkey: rr.rkey,
                }),
                (ScopeKind::Send { imm, .. }, None) => {
                    Some(imm.map_or(SendOp::Send, SendOp::SendWithImm))
                }
                (ScopeKind::Recv { .. }, None) => None,
                _ => unreachable!("planned with the wrong remote"),
            };
            let q = p.q;
            if in_flight(&self.held, &m, x, q, &ours[qi(q)]) == N {
                // make_room(q): post everything staged, then drain q.
                doorbell(&mut m, &mut staged, &mut staged_recv);
                drain(&mut m, &mut ours[qi(q)], q, &mut first)?;
                if in_flight(&self.held, &m, x, q, &ours[qi(q)]) == N {
                    closure_err = Some(Want::QueueFull);
                    break;
                }
            }
            let seq = m.take_seq(x, q);
            match op {
                Some(op) => staged.push(MSend {
                    seq,
                    op,
                    sges,
                    flags: SendFlags::empty(),
                    inline: None,
                }),
                None => staged_recv.push(MRecv { seq, sges }),
            }
            ours[qi(q)].push(seq);
            ids.push((q, seq));
            if p.doorbell {
                doorbell(&mut m, &mut staged, &mut staged_recv);
            }
        }
        // finish: doorbell, then drain receives, then sends.
        doorbell(&mut m, &mut staged, &mut staged_recv);
        drain(&mut m, &mut ours[1], Q::Recv, &mut first)?;
        drain(&mut m, &mut ours[0], Q::Send, &mut first)?;
        self.model = m;
        Some((closure_err.or(first).unwrap_or(Want::ScopeOk), ids))
    }

    /// Runs the engine, then compares states, ring occupancy and memory with the model.
    pub(super) fn settle(&mut self, n: usize) {
        self.pump
            .write(
                std::iter::empty::<LocalSlice<'_>>(),
                &RemoteRegion {
                    addr: 0,
                    len: 0,
                    rkey: 0,
                },
            )
            .expect("pump");
        self.model.progress();
        for x in 0..2 {
            let want = if self.model.sides[x].err {
                QpState::Error
            } else {
                QpState::ReadyToSend
            };
            let got = self.ch[x].queue_pair().state().expect("query state");
            assert_eq!(got, want, "after op {n}: state of side {x}");
            let occupied = (
                in_flight(&self.held, &self.model, x, Q::Send, &[]),
                in_flight(&self.held, &self.model, x, Q::Recv, &[]),
            );
            assert_eq!(
                self.ch[x].in_flight(),
                occupied,
                "after op {n}: in_flight of side {x}"
            );
            for i in 0..R {
                let real = self.mrs[x][i].as_slice();
                let want = &self.model.regions[x * R + i].mem;
                assert!(real == &want[..], "after op {n}: memory of side {x} region {i}:\n real {real:02x?}\n want {want:02x?}");
            }
        }
    }
}
