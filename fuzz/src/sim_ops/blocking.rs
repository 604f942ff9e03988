//! The blocking operations of the rig: each predicted by the model, run, and checked
//! against the prediction (writes, reads, atomics, sends, inline sends, receives).

use super::*;

impl<'a> Rig<'a> {
    /// Predicts a blocking send-queue call on `x` and commits the model; `None` to skip it
    /// (it would wait for nothing and the run has no timeout left).
    pub(super) fn blocking_send_want(
        &mut self,
        x: usize,
        op: SendOp,
        sges: Vec<Sge>,
        flags: SendFlags,
        inline: Option<Vec<u8>>,
    ) -> Option<Want> {
        if in_flight(&self.held, &self.model, x, Q::Send, &[]) == N {
            return Some(Want::QueueFull);
        }
        let mut m = self.model.clone();
        let seq = m.take_seq(x, Q::Send);
        let e = MSend {
            seq,
            op,
            sges,
            flags: flags | SendFlags::SIGNALED,
            inline,
        };
        if let Err(r) = m.post_send(x, e) {
            m.untake_seq(x, Q::Send);
            m.progress();
            self.model = m;
            return Some(Want::Refused(r, "ibv_post_send"));
        }
        self.finish_blocking(m, x, Q::Send, seq)
    }

    /// As `blocking_send_want`, for a blocking receive.
    pub(super) fn blocking_recv_want(&mut self, x: usize, sges: Vec<Sge>) -> Option<Want> {
        if in_flight(&self.held, &self.model, x, Q::Recv, &[]) == N {
            return Some(Want::QueueFull);
        }
        let mut m = self.model.clone();
        let seq = m.take_seq(x, Q::Recv);
        if let Err(r) = m.post_recv(x, MRecv { seq, sges }) {
            m.untake_seq(x, Q::Recv);
            m.progress();
            self.model = m;
            return Some(Want::Refused(r, "ibv_post_recv"));
        }
        self.finish_blocking(m, x, Q::Recv, seq)
    }

    pub(super) fn finish_blocking(
        &mut self,
        mut m: Model,
        x: usize,
        q: Q,
        seq: u64,
    ) -> Option<Want> {
        m.progress();
        let want = match m.done.remove(&(x, q, seq)) {
            Some(o) => Want::Done(seq, o),
            None => {
                if self.timeouts_left == 0 {
                    return None;
                }
                self.timeouts_left -= 1;
                // The wait times out: the channel moves the queue pair to the error state
                // and waits for the flush, whose outcome it discards.
                m.set_err(x);
                m.progress();
                m.done.remove(&(x, q, seq)).expect("flushed");
                Want::Timeout
            }
        };
        self.model = m;
        Some(want)
    }

    /// Predicts an RDMA write or read on `x` over `locals` against `remote`, the operation
    /// being what `op` makes of the remote region; `None` to skip it (as
    /// [`blocking_send_want`](Self::blocking_send_want)). The region, or why there is none.
    fn rdma_want(
        &mut self,
        x: usize,
        locals: &[(usize, usize, usize)],
        remote: &Remote,
        op: impl FnOnce(&RemoteRegion) -> SendOp,
    ) -> Option<(Want, Result<RemoteRegion, BoundsError>)> {
        let sges = self.sges_of(x, locals);
        let rr = self.remote_region(x, remote, total(&sges));
        let want = match rr {
            Err(_) => Want::OutOfBounds,
            Ok(_) if sges.len() > S => Want::TooManySges(sges.len()),
            Ok(rr) if total(&sges) > rr.len => Want::OutOfBounds,
            Ok(rr) => self.blocking_send_want(x, op(&rr), sges, SendFlags::empty(), None)?,
        };
        Some((want, rr))
    }

    pub(super) fn write(&mut self, x: usize, data: &[Local], remote: &Remote) {
        let locals = self.locals(x, data, false);
        let write = |rr: &RemoteRegion| SendOp::Write {
            remote_addr: rr.addr,
            rkey: rr.rkey,
        };
        let Some((want, rr)) = self.rdma_want(x, &locals, remote, write) else {
            return;
        };
        let slices: Vec<LocalSlice<'_>> = locals
            .iter()
            .map(|&(i, st, n)| self.mrs[x][i].slice(st..st + n).expect("in bounds"))
            .collect();
        let res = match rr {
            Ok(rr) => self.ch[x].write(slices, &rr),
            Err(b) => Err(Error::OutOfBounds(b)),
        };
        self.check(res, &want, x, "write");
    }

    pub(super) fn read(&mut self, x: usize, into: &[Local], remote: &Remote) {
        let locals = self.locals(x, into, true);
        let read = |rr: &RemoteRegion| SendOp::Read {
            remote_addr: rr.addr,
            rkey: rr.rkey,
        };
        let Some((want, rr)) = self.rdma_want(x, &locals, remote, read) else {
            return;
        };
        let slices = mut_slices(&mut self.mrs[x], &locals);
        let res = match rr {
            Ok(rr) => self.ch[x].read(slices, &rr),
            Err(b) => Err(Error::OutOfBounds(b)),
        };
        self.check(res, &want, x, "read");
    }

    pub(super) fn atomic(
        &mut self,
        x: usize,
        result: &Local8,
        remote: &Remote,
        op: impl Fn(u64, u32) -> SendOp,
        cas: Option<(u64, u64)>,
    ) {
        let i = usize::from(result.region) % R;
        let len = self.region(x, i).len;
        let start = usize::from(result.start) % (len + 1);
        let n = result.wrong_len.map_or(8, usize::from).min(len - start);
        let sge = local_sge(self.region(x, i), start, n);
        let rr = self.remote_region(x, remote, 8);
        let want = match rr {
            Err(_) => Want::OutOfBounds,
            Ok(_) if n != 8 => Want::InvalidAttribute,
            Ok(rr) if rr.len < 8 => Want::OutOfBounds,
            Ok(rr) => match self.blocking_send_want(
                x,
                op(rr.addr, rr.rkey),
                vec![sge],
                SendFlags::empty(),
                None,
            ) {
                Some(w) => w,
                None => return,
            },
        };
        let slice = self.mrs[x][i]
            .slice_mut(start..start + n)
            .expect("in bounds");
        let res = match (rr, cas) {
            (Err(b), _) => Err(Error::OutOfBounds(b)),
            (Ok(rr), None) => {
                let SendOp::FetchAdd { add, .. } = op(0, 0) else {
                    unreachable!()
                };
                self.ch[x].fetch_add(slice, &rr, add)
            }
            (Ok(rr), Some((compare, swap))) => self.ch[x].compare_swap(slice, &rr, compare, swap),
        };
        if let Some(old) = self.check(res, &want, x, "atomic") {
            let Want::Done(_, o) = &want else {
                unreachable!()
            };
            assert_eq!(Some(old), o.old, "atomic on side {x}: returned old value");
        }
    }

    pub(super) fn send(&mut self, x: usize, data: &[Local], imm: Option<u32>) {
        let locals = self.locals(x, data, false);
        let sges = self.sges_of(x, &locals);
        let want = if sges.len() > S {
            Want::TooManySges(sges.len())
        } else {
            let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
            match self.blocking_send_want(x, op, sges, SendFlags::empty(), None) {
                Some(w) => w,
                None => return,
            }
        };
        let slices: Vec<LocalSlice<'_>> = locals
            .iter()
            .map(|&(i, st, n)| self.mrs[x][i].slice(st..st + n).expect("in bounds"))
            .collect();
        let res = match imm {
            Some(imm) => self.ch[x].send_with_imm(slices, imm),
            None => self.ch[x].send(slices),
        };
        self.check(res, &want, x, "send");
    }

    pub(super) fn send_inline(&mut self, x: usize, len: u8) {
        let bytes: Vec<u8> = (0..len % 80)
            .map(|k| k.wrapping_mul(7) ^ self.seed)
            .collect();
        let sge = Sge {
            addr: bytes.as_ptr() as u64,
            length: bytes.len() as u32,
            lkey: 0,
        };
        let Some(want) = self.blocking_send_want(
            x,
            SendOp::Send,
            vec![sge],
            SendFlags::INLINE,
            Some(bytes.clone()),
        ) else {
            return;
        };
        let res = self.ch[x].send_inline(&bytes);
        self.check(res, &want, x, "send_inline");
    }

    pub(super) fn receive(&mut self, x: usize, into: &[Local]) {
        let locals = self.locals(x, into, true);
        let sges = self.sges_of(x, &locals);
        let want = if sges.len() > S {
            Want::TooManySges(sges.len())
        } else {
            match self.blocking_recv_want(x, sges) {
                Some(w) => w,
                None => return,
            }
        };
        let slices = mut_slices(&mut self.mrs[x], &locals);
        let res = self.ch[x].receive(slices);
        self.check_completion(res, &want, x, "receive");
    }
}
