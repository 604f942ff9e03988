//! A reference model of two connected RC queue pairs on the simulator, written from the
//! documented semantics (verbs, as the simulator's docs describe them): what each work
//! request does to memory, which completion it gets, and when a queue pair errors.
//!
//! It is deliberately small and direct: plain byte vectors for memory, queues of posted work,
//! and one `execute` that follows the documented order of checks. The harness runs every
//! operation on the model and on the real stack and compares.

use std::collections::{HashMap, VecDeque};

use zverbs::{AccessFlags, SendFlags, SendOp, Sge, WcOpcode, WcStatus};

/// Largest RC message (2^31 bytes, as in the verbs spec).
pub const MAX_MSG: u64 = 1 << 31;

/// Which queue of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Q {
    /// Send queue.
    Send,
    /// Receive queue.
    Recv,
}

/// A registered region: where it is, its keys and rights, and its expected bytes.
#[derive(Clone, Debug)]
pub struct MRegion {
    /// Protection domain id (model numbering).
    pub pd: usize,
    /// Start address.
    pub base: u64,
    /// Length.
    pub len: usize,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// Access rights.
    pub access: AccessFlags,
    /// Expected contents.
    pub mem: Vec<u8>,
}

impl MRegion {
    /// Offset of `addr..addr + len` inside the region, if it lies fully inside.
    pub fn offset(&self, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(self.base)?;
        (off.checked_add(len)? <= self.len as u64).then_some(off as usize)
    }

    fn writable(&self) -> bool {
        self.access.contains(AccessFlags::LOCAL_WRITE)
    }
}

/// A posted send work request.
#[derive(Clone, Debug)]
pub struct MSend {
    /// Its `wr_id` (the channel's ring sequence number).
    pub seq: u64,
    /// What it does.
    pub op: SendOp,
    /// Gather / scatter list.
    pub sges: Vec<Sge>,
    /// Flags as posted (`SIGNALED` decides selective signaling).
    pub flags: SendFlags,
    /// Inline payload, captured at post time.
    pub inline: Option<Vec<u8>>,
}

/// A posted receive work request.
#[derive(Clone, Debug)]
pub struct MRecv {
    /// Its `wr_id`.
    pub seq: u64,
    /// Scatter list.
    pub sges: Vec<Sge>,
}

/// The expected outcome of one work request, as the channel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Status.
    pub status: WcStatus,
    /// Opcode: the completion's on success, the posted one on error.
    pub opcode: WcOpcode,
    /// Bytes (compared on success only).
    pub byte_len: u32,
    /// Immediate data (receives).
    pub imm: Option<u32>,
    /// The previous remote value of a successful atomic.
    pub old: Option<u64>,
}

impl Outcome {
    fn flush(opcode: WcOpcode) -> Outcome {
        Outcome {
            status: WcStatus::WrFlushErr,
            opcode,
            byte_len: 0,
            imm: None,
            old: None,
        }
    }
}

/// Why the simulator refuses a post synchronously.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostRefusal {
    /// `SimError::Invalid`.
    Invalid,
    /// `SimError::QueueFull`.
    QueueFull,
}

/// One side's queue pair.
#[derive(Clone, Debug)]
pub struct MSide {
    /// Its protection domain id.
    pub pd: usize,
    /// In the error state.
    pub err: bool,
    /// Posted sends not executed yet.
    pub sq: VecDeque<MSend>,
    /// Posted receives not consumed yet.
    pub rq: VecDeque<MRecv>,
    /// Executed unsignaled sends still holding a send-queue slot.
    pub unsig_done: usize,
    /// Next ring sequence number per queue (send, receive).
    pub next_seq: [u64; 2],
}

impl MSide {
    /// A healthy side in protection domain `pd`.
    pub fn new(pd: usize) -> MSide {
        MSide {
            pd,
            err: false,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            unsig_done: 0,
            next_seq: [0; 2],
        }
    }
}

/// The whole model.
#[derive(Clone, Debug)]
pub struct Model {
    /// Every registered region of both sides.
    pub regions: Vec<MRegion>,
    /// Side A (0) and B (1).
    pub sides: [MSide; 2],
    /// Outcomes of completed work not yet observed, by (side, queue, wr_id).
    pub done: HashMap<(usize, Q, u64), Outcome>,
    /// Queue depth (`max_send_wr` = `max_recv_wr` = ring size).
    pub depth: usize,
    /// `max_inline_data`.
    pub max_inline: u64,
}

/// What executing the head of a send queue did.
struct Step {
    status: WcStatus,
    byte_len: u32,
    old: Option<u64>,
    /// The responder took part (it was reachable).
    peer: bool,
    /// The receive consumed at the responder and its outcome.
    recv: Option<(u64, Outcome)>,
}

fn total_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

fn responder_error(s: WcStatus) -> bool {
    matches!(
        s,
        WcStatus::RemInvReqErr | WcStatus::RemAccessErr | WcStatus::RemOpErr
    )
}

impl Model {
    fn qix(q: Q) -> usize {
        match q {
            Q::Send => 0,
            Q::Recv => 1,
        }
    }

    /// Takes the next sequence number of `x`'s `q` ring.
    pub fn take_seq(&mut self, x: usize, q: Q) -> u64 {
        let s = &mut self.sides[x].next_seq[Self::qix(q)];
        *s += 1;
        *s - 1
    }

    /// Gives back the last sequence number (the post was refused).
    pub fn untake_seq(&mut self, x: usize, q: Q) {
        self.sides[x].next_seq[Self::qix(q)] -= 1;
    }

    /// The next sequence number of `x`'s `q` ring.
    pub fn next_seq(&self, x: usize, q: Q) -> u64 {
        self.sides[x].next_seq[Self::qix(q)]
    }

    /// The region a local key names in `pd`.
    fn local_mr(&self, key: u32, pd: usize) -> Option<usize> {
        self.regions
            .iter()
            .position(|r| r.lkey == key && r.pd == pd)
    }

    /// The region a remote key names in `pd`.
    fn remote_mr(&self, key: u32, pd: usize) -> Option<usize> {
        self.regions
            .iter()
            .position(|r| r.rkey == key && r.pd == pd)
    }

    /// Gathers the bytes of a local list in `pd`; `None` on a protection error.
    fn gather(&self, pd: usize, sges: &[Sge]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        for s in sges.iter().filter(|s| s.length > 0) {
            let r = &self.regions[self.local_mr(s.lkey, pd)?];
            let off = r.offset(s.addr, u64::from(s.length))?;
            out.extend_from_slice(&r.mem[off..off + s.length as usize]);
        }
        Some(out)
    }

    /// Resolves the entries of a scatter list that the first `len` bytes reach, as
    /// (region, offset, entry length); `None` on a protection error.
    fn scatter(&self, pd: usize, sges: &[Sge], len: u64) -> Option<Vec<(usize, usize, usize)>> {
        let mut left = len;
        let mut spans = Vec::new();
        for s in sges {
            if left == 0 {
                break;
            }
            if s.length == 0 {
                continue;
            }
            let ri = self.local_mr(s.lkey, pd)?;
            let r = &self.regions[ri];
            if !r.writable() {
                return None;
            }
            spans.push((
                ri,
                r.offset(s.addr, u64::from(s.length))?,
                s.length as usize,
            ));
            left -= left.min(u64::from(s.length));
        }
        Some(spans)
    }

    /// Writes `data` over `spans` in order.
    fn put(&mut self, spans: &[(usize, usize, usize)], data: &[u8]) {
        let mut rest = data;
        for &(ri, off, n) in spans {
            let n = n.min(rest.len());
            self.regions[ri].mem[off..off + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
        assert!(rest.is_empty(), "model: scatter list shorter than the data");
    }

    /// A remote region named by `rkey` in `pd` with `need` rights covering `addr..+len`.
    fn remote(
        &self,
        rkey: u32,
        pd: usize,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(usize, usize)> {
        let ri = self.remote_mr(rkey, pd)?;
        let r = &self.regions[ri];
        if !r.access.contains(need) {
            return None;
        }
        Some((ri, r.offset(addr, len)?))
    }

    /// Posts a send on `x` (the simulator's synchronous checks). Does not progress.
    pub fn post_send(&mut self, x: usize, e: MSend) -> Result<(), PostRefusal> {
        let inline = e.flags.contains(SendFlags::INLINE);
        if inline {
            let has_payload = matches!(
                e.op,
                SendOp::Send
                    | SendOp::SendWithImm(_)
                    | SendOp::Write { .. }
                    | SendOp::WriteWithImm { .. }
            );
            if !has_payload || total_len(&e.sges) > self.max_inline {
                return Err(PostRefusal::Invalid);
            }
        }
        let side = &mut self.sides[x];
        if side.sq.len() + side.unsig_done >= self.depth {
            return Err(PostRefusal::QueueFull);
        }
        if side.err {
            self.done
                .insert((x, Q::Send, e.seq), Outcome::flush(e.op.wc_opcode()));
            return Ok(());
        }
        assert!(
            !inline || e.inline.is_some(),
            "model: inline payload not captured"
        );
        side.sq.push_back(e);
        Ok(())
    }

    /// Posts a receive on `x`. Does not progress.
    pub fn post_recv(&mut self, x: usize, r: MRecv) -> Result<(), PostRefusal> {
        let side = &mut self.sides[x];
        if side.rq.len() >= self.depth {
            return Err(PostRefusal::QueueFull);
        }
        if side.err {
            self.done
                .insert((x, Q::Recv, r.seq), Outcome::flush(WcOpcode::Recv));
        } else {
            side.rq.push_back(r);
        }
        Ok(())
    }

    /// Moves `x` to the error state, flushing its queues in posting order.
    pub fn set_err(&mut self, x: usize) {
        let side = &mut self.sides[x];
        if side.err {
            return;
        }
        side.err = true;
        side.unsig_done = 0;
        for e in side.sq.drain(..) {
            self.done
                .insert((x, Q::Send, e.seq), Outcome::flush(e.op.wc_opcode()));
        }
        for r in side.rq.drain(..) {
            self.done
                .insert((x, Q::Recv, r.seq), Outcome::flush(WcOpcode::Recv));
        }
    }

    /// Runs both send queues until nothing can move.
    pub fn progress(&mut self) {
        loop {
            let mut moved = false;
            for x in 0..2 {
                while let Some(step) = self.execute(x) {
                    self.complete(x, step);
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Whether `x`'s send queue head waits (for a receive at the peer).
    pub fn send_stuck(&self, x: usize) -> bool {
        !self.sides[x].err && !self.sides[x].sq.is_empty()
    }

    /// Executes the head of `x`'s send queue; `None` if there is none or it must wait.
    /// Checks everything before any byte moves.
    fn execute(&mut self, x: usize) -> Option<Step> {
        let y = 1 - x;
        if self.sides[x].err {
            return None;
        }
        let e = self.sides[x].sq.front()?.clone();
        let atomic = matches!(e.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. });
        let total = total_len(&e.sges);
        let mut out = Step {
            status: WcStatus::Success,
            byte_len: if atomic { 8 } else { total as u32 },
            old: None,
            peer: false,
            recv: None,
        };
        let fail = |out: Step, status| Some(Step { status, ..out });

        // 1. Requester-local checks.
        if total > MAX_MSG || (atomic && total != 8) {
            return fail(out, WcStatus::LocLenErr);
        }
        let pd = self.sides[x].pd;
        let (mut data, mut dst) = (Vec::new(), Vec::new());
        let local_ok = match e.op {
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                self.scatter(pd, &e.sges, total).map(|d| dst = d).is_some()
            }
            _ if e.flags.contains(SendFlags::INLINE) => {
                data = e.inline.clone().expect("inline payload");
                true
            }
            _ => self.gather(pd, &e.sges).map(|d| data = d).is_some(),
        };
        if !local_ok {
            return fail(out, WcStatus::LocProtErr);
        }

        // 2. The peer must be able to respond.
        if self.sides[y].err {
            return fail(out, WcStatus::RetryExcErr);
        }
        out.peer = true;

        // 3. Responder: the queue pair grants every right (InitOptions::default()) and
        // accepts reads and atomics (max_dest_rd_atomic 16); then a receive if needed.
        let ypd = self.sides[y].pd;
        let needs_recv = matches!(
            e.op,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::WriteWithImm { .. }
        );
        let rwr = if needs_recv {
            Some(self.sides[y].rq.front()?.clone())
        } else {
            None
        };

        // 4. Effects.
        match e.op {
            SendOp::Send | SendOp::SendWithImm(_) => {
                let rwr = rwr.expect("receive");
                let imm = match e.op {
                    SendOp::SendWithImm(i) => Some(i),
                    _ => None,
                };
                let mut done = Outcome {
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: total as u32,
                    imm,
                    old: None,
                };
                if total_len(&rwr.sges) < total {
                    done.status = WcStatus::LocLenErr;
                    out.recv = Some((rwr.seq, done));
                    return fail(out, WcStatus::RemInvReqErr);
                }
                let Some(spans) = self.scatter(ypd, &rwr.sges, total) else {
                    done.status = WcStatus::LocProtErr;
                    out.recv = Some((rwr.seq, done));
                    return fail(out, WcStatus::RemOpErr);
                };
                self.put(&spans, &data);
                out.recv = Some((rwr.seq, done));
            }
            SendOp::Write { remote_addr, rkey }
            | SendOp::WriteWithImm {
                remote_addr, rkey, ..
            } => {
                if total > 0 {
                    let Some((ri, off)) =
                        self.remote(rkey, ypd, remote_addr, total, AccessFlags::REMOTE_WRITE)
                    else {
                        return fail(out, WcStatus::RemAccessErr);
                    };
                    assert!(
                        self.regions[ri].writable(),
                        "model: remote-writable region without LOCAL_WRITE"
                    );
                    self.regions[ri].mem[off..off + data.len()].copy_from_slice(&data);
                }
                if let (SendOp::WriteWithImm { imm, .. }, Some(rwr)) = (e.op, rwr) {
                    let done = Outcome {
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: total as u32,
                        imm: Some(imm),
                        old: None,
                    };
                    out.recv = Some((rwr.seq, done));
                }
            }
            SendOp::Read { remote_addr, rkey } => {
                if total > 0 {
                    let Some((ri, off)) =
                        self.remote(rkey, ypd, remote_addr, total, AccessFlags::REMOTE_READ)
                    else {
                        return fail(out, WcStatus::RemAccessErr);
                    };
                    let bytes = self.regions[ri].mem[off..off + total as usize].to_vec();
                    self.put(&dst, &bytes);
                }
            }
            SendOp::CompareSwap {
                remote_addr, rkey, ..
            }
            | SendOp::FetchAdd {
                remote_addr, rkey, ..
            } => {
                if remote_addr % 8 != 0 {
                    return fail(out, WcStatus::RemInvReqErr);
                }
                let Some((ri, off)) =
                    self.remote(rkey, ypd, remote_addr, 8, AccessFlags::REMOTE_ATOMIC)
                else {
                    return fail(out, WcStatus::RemAccessErr);
                };
                assert!(
                    self.regions[ri].writable(),
                    "model: atomic region without LOCAL_WRITE"
                );
                let word = &mut self.regions[ri].mem[off..off + 8];
                let old = u64::from_ne_bytes(word.try_into().expect("8 bytes"));
                let new = match e.op {
                    SendOp::CompareSwap { compare, swap, .. } if old == compare => swap,
                    SendOp::FetchAdd { add, .. } => old.wrapping_add(add),
                    _ => old,
                };
                word.copy_from_slice(&new.to_ne_bytes());
                self.put(&dst, &old.to_ne_bytes());
                out.old = Some(old);
            }
            // The model's channels are RC, which refuse datagrams at post: none is queued.
            SendOp::Datagram { .. } => unreachable!("model: a datagram on an RC channel"),
        }
        Some(out)
    }

    /// Applies an executed step: completions, queue slots, error states.
    fn complete(&mut self, x: usize, step: Step) {
        let y = 1 - x;
        if let Some((seq, done)) = step.recv {
            let r = self.sides[y].rq.pop_front().expect("consumed receive");
            assert_eq!(r.seq, seq);
            self.done.insert((y, Q::Recv, seq), done);
        }
        let e = self.sides[x].sq.pop_front().expect("executed request");
        let outcome = Outcome {
            status: step.status,
            opcode: e.op.wc_opcode(),
            byte_len: step.byte_len,
            imm: None,
            old: step.old,
        };
        if e.flags.contains(SendFlags::SIGNALED) || step.status != WcStatus::Success {
            self.sides[x].unsig_done = 0;
        } else {
            self.sides[x].unsig_done += 1;
        }
        // Unsignaled successes are retired silently; record them as successes.
        self.done.insert((x, Q::Send, e.seq), outcome);
        if step.status != WcStatus::Success {
            self.set_err(x);
            if step.peer && responder_error(step.status) {
                self.set_err(y);
            }
        }
    }
}
