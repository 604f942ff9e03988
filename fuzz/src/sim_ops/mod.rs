//! Target `sim_ops`: sequences of channel operations on one connected pair of channels
//! (A, B) on the simulator, run single-threaded and checked against [`crate::model`].
//!
//! Set-up: each side registers eight regions with different rights (one with every remote
//! right, read-only, write-only, atomic-only, local-only, no rights at all, one in a second
//! protection domain, and an empty one). Operations: blocking write / read / fetch-add /
//! compare-swap / send / inline send / receive with arbitrary offsets, lengths, forged
//! remote regions and corrupted rkeys; unpolled sends (any opcode) and receives with raw
//! scatter/gather entries (corrupted lkeys, out-of-bounds, huge lengths, inline); waits and
//! polls of their handles; scopes of several writes with doorbells in between; `set_error`.
//!
//! Invariants checked after every operation:
//! - no panic; every call returns exactly the `Ok` or typed `Error` the model predicts
//!   (completion status, `wr_id`, opcode, byte count, immediate data, atomic's old value);
//! - every `Pending` is redeemed (at the latest at the end) exactly once: `try_complete`
//!   hands it back while in flight and consumes it with the outcome, and no model
//!   completion is left unobserved;
//! - handles are tied to their channel: each is [`owns`](Channel::owns)-ed by its own
//!   channel only, and before every wait or poll the channel is first handed a handle of a
//!   decoy channel, which it must refuse with `Error::ForeignPending` without polling or
//!   taking anything (its ring occupancy is unchanged, and the real call that follows
//!   still gets the model's outcome);
//! - queue pair states match the model (after an error completion: `Error`, and later work
//!   completes with `WR_FLUSH_ERR` or is refused);
//! - `in_flight()` matches the handles held (no leaked ring slots);
//! - every registered byte on both sides equals the model: successful writes and atomics
//!   land exactly in range, failed ones and bytes outside change nothing.
//!
//! Operations that would wait for something that cannot happen (a send without a receive
//! at the peer) are skipped, except for one per run if the input allows it, which must time
//! out ([`TIMEOUT`]) and move the queue pair to the error state.
//!
//! Set `ZVERBS_FUZZ_TRACE=1` to print the input and each operation's expectation.
//!
//! Here: the rig (its set-up, what the grammar's values name on each side, the checks, the
//! dispatch of one operation, the end of a run). The input grammar is `grammar.rs`; the
//! operations by level are `blocking.rs`, `unpolled.rs` (with the foreign-handle checks)
//! and `scope.rs`.

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use zverbs::provider::sim::{Sim, SimError};
use zverbs::{
    AccessFlags, BoundsError, Channel, ChannelConfig, Completion, Context, Error, LocalSlice,
    LocalSliceMut, MemoryRegion, Pending, ProtectionDomain, QpState, RemoteRegion, SendFlags,
    SendOp, Sge, WcStatus,
};

use crate::model::{MRecv, MRegion, MSend, MSide, Model, Outcome, PostRefusal, Q};

/// Ring size (work requests in flight per queue).
pub const N: usize = 8;
/// Scatter/gather entries per work request.
pub const S: usize = 4;
/// Regions per side.
pub const R: usize = 8;
/// Most operations run per input.
pub const MAX_OPS: usize = 64;
/// Channel timeout. Short, because the one wait per run that must time out dominated the
/// run time (at 20 ms, about 85% of it: ~260 runs/s under libFuzzer). It cannot cut short
/// a wait that would succeed: the rig is single-threaded on the instant fabric, where work
/// completes inside the call that makes it possible, so a wait's first poll already finds
/// all it ever will (and the clock starts only after a wait's spinning polls).
pub const TIMEOUT: Duration = Duration::from_millis(2);
/// Ring size of the decoy channel whose handles are handed to A and B (each refusal loses
/// one decoy handle, and so one decoy slot for good: at most one per wait or poll).
pub const DECOY_N: usize = 128;

type Ch = Channel<Sim, N, S>;
type Decoy = Channel<Sim, DECOY_N, 1>;

mod blocking;
mod grammar;
mod scope;
mod unpolled;

pub use grammar::*;

/// Parses `data` and runs it. Inputs that do not parse are ignored.
pub fn run_bytes(data: &[u8]) {
    if let Ok(input) = SimOpsInput::arbitrary_take_rest(Unstructured::new(data)) {
        run(&input);
    }
}

/// How a region is registered.
struct RegionSpec {
    len: usize,
    access: AccessFlags,
    other_pd: bool,
    safe_register: bool,
}

fn region_specs() -> [RegionSpec; R] {
    let lw = AccessFlags::LOCAL_WRITE;
    let spec = |len, access, other_pd, safe_register| RegionSpec {
        len,
        access,
        other_pd,
        safe_register,
    };
    [
        spec(64, AccessFlags::all(), false, false),
        spec(32, AccessFlags::REMOTE_READ, false, false),
        spec(32, lw | AccessFlags::REMOTE_WRITE, false, false),
        spec(24, lw | AccessFlags::REMOTE_ATOMIC, false, false),
        spec(48, lw, false, true),
        spec(16, AccessFlags::empty(), false, false),
        spec(32, AccessFlags::all(), true, false),
        spec(0, AccessFlags::all(), false, false),
    ]
}

/// Backing memory of one region: 64-byte aligned so that alignment is reproducible.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block([u8; 64]);

/// A handle of unpolled work and what it is.
#[derive(Debug)]
struct Held {
    x: usize,
    q: Q,
    seq: u64,
    p: Pending,
}

/// A resolved scope item.
struct Planned {
    kind: ScopeKind,
    locals: Vec<(usize, usize, usize)>,
    q: Q,
    remote: Option<Result<RemoteRegion, BoundsError>>,
    doorbell: bool,
}

/// What a call must return.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    /// Completion (success or error) of the request `seq`.
    Done(u64, Outcome),
    /// Unpolled work posted as `seq`.
    Posted(u64),
    /// A scope whose work all succeeded.
    ScopeOk,
    TooManySges(usize),
    OutOfBounds,
    QueueFull,
    Refused(PostRefusal, &'static str),
    Timeout,
    InvalidAttribute,
}

fn in_flight(held: &[Held], m: &Model, x: usize, q: Q, extra: &[u64]) -> usize {
    let oldest = held
        .iter()
        .filter(|h| h.x == x && h.q == q)
        .map(|h| h.seq)
        .chain(extra.iter().copied())
        .min();
    oldest.map_or(0, |o| (m.next_seq(x, q) - o) as usize)
}

struct Rig<'a> {
    ch: [Ch; 2],
    /// A second connected pair on the same fabric: a blocking zero-length write on it runs
    /// the simulator's engine (every post and poll does), so that work of A and B that can
    /// move has moved before states are compared.
    pump: Channel<Sim, 2, 1>,
    _pump_peer: Channel<Sim, 2, 1>,
    /// A third connected channel (on `sim0`): its handles are handed to A and B, which must
    /// refuse them.
    decoy: Decoy,
    _decoy_peer: Decoy,
    mrs: [Vec<MemoryRegion<'a, Sim>>; 2],
    _pds: Vec<ProtectionDomain<Sim>>,
    _ctx: [Context<Sim>; 2],
    model: Model,
    held: Vec<Held>,
    timeouts_left: u32,
    qpn: [u32; 2],
    seed: u8,
    trace: bool,
}

fn local_sge(r: &MRegion, start: usize, len: usize) -> Sge {
    Sge {
        addr: r.base + start as u64,
        length: len as u32,
        lkey: r.lkey,
    }
}

fn total(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Slices of distinct regions, mutably, in the order of `locals`.
fn mut_slices<'m>(
    mrs: &'m mut [MemoryRegion<'_, Sim>],
    locals: &[(usize, usize, usize)],
) -> Vec<LocalSliceMut<'m>> {
    let mut by_region: Vec<Option<LocalSliceMut<'m>>> = mrs
        .iter_mut()
        .enumerate()
        .map(|(i, mr)| {
            let l = locals.iter().find(|l| l.0 == i)?;
            Some(mr.slice_mut(l.1..l.1 + l.2).expect("mapped into bounds"))
        })
        .collect();
    locals
        .iter()
        .map(|l| by_region[l.0].take().expect("one slice per region"))
        .collect()
}

/// Runs one input.
pub fn run(input: &SimOpsInput) {
    let trace = std::env::var_os("ZVERBS_FUZZ_TRACE").is_some();
    if trace {
        eprintln!("{input:#?}");
    }
    let mut storage = Box::new([[Block([0; 64]); R]; 2]);
    for (x, side) in storage.iter_mut().enumerate() {
        for (i, block) in side.iter_mut().enumerate() {
            for (k, b) in block.0.iter_mut().enumerate() {
                *b = (k as u8).wrapping_mul(13).wrapping_add(
                    input.seed ^ (x as u8).wrapping_mul(101) ^ (i as u8).wrapping_mul(37),
                );
            }
        }
    }
    let [sa, sb] = &mut *storage;
    let mut rig = Rig::new(input.seed, [sa, sb], trace);
    rig.timeouts_left = u32::from(input.allow_timeout);
    let mut n = 0;
    let mut last: Option<&Op> = None;
    for op in &input.ops {
        let (op, times) = match (op, last) {
            (Op::Repeat { count }, Some(prev)) => (prev, usize::from(*count) % 12),
            (Op::Repeat { .. }, None) => continue,
            (op, _) => (op, 1),
        };
        last = Some(op);
        for _ in 0..times {
            if n == MAX_OPS {
                break;
            }
            if trace {
                eprintln!("-- op {n}: {op:?}");
            }
            rig.op(op);
            rig.settle(n);
            n += 1;
        }
    }
    rig.finish();
}

impl<'a> Rig<'a> {
    fn new(seed: u8, storage: [&'a mut [Block; R]; 2], trace: bool) -> Rig<'a> {
        let sim = Sim::with_devices(2);
        let cfg = ChannelConfig {
            timeout: Some(TIMEOUT),
            ..ChannelConfig::default()
        };
        let ctx = [
            Context::open(&sim, "sim0").expect("sim0"),
            Context::open(&sim, "sim1").expect("sim1"),
        ];
        let pd = |c: &Context<Sim>| c.alloc_pd().expect("alloc_pd");
        let pds = vec![
            pd(&ctx[0]),
            pd(&ctx[0]),
            pd(&ctx[1]),
            pd(&ctx[1]),
            pd(&ctx[0]),
            pd(&ctx[1]),
        ];
        let a = Ch::prepare(&ctx[0], &pds[0], &cfg).expect("prepare A");
        let b = Ch::prepare(&ctx[1], &pds[2], &cfg).expect("prepare B");
        let c = Channel::<Sim, 2, 1>::prepare(&ctx[0], &pds[4], &cfg).expect("prepare pump");
        let d = Channel::<Sim, 2, 1>::prepare(&ctx[1], &pds[5], &cfg).expect("prepare pump peer");
        let e = Decoy::prepare(&ctx[0], &pds[4], &cfg).expect("prepare decoy");
        let f = Decoy::prepare(&ctx[1], &pds[5], &cfg).expect("prepare decoy peer");
        let (ea, eb, ec, ed) = (a.endpoint(), b.endpoint(), c.endpoint(), d.endpoint());
        let (ee, ef) = (e.endpoint(), f.endpoint());
        let (decoy, decoy_peer) = (
            e.connect(&ef).expect("connect decoy"),
            f.connect(&ee).expect("connect decoy peer"),
        );
        let qpn = [ea.qp_num, eb.qp_num];
        let ch = [
            a.connect(&eb).expect("connect A"),
            b.connect(&ea).expect("connect B"),
        ];
        let (pump, pump_peer) = (
            c.connect(&ed).expect("connect pump"),
            d.connect(&ec).expect("connect pump peer"),
        );

        // Remote write or atomic rights without local write are refused at registration.
        let mut scratch = [0u8; 8];
        // SAFETY: refused, so never registered.
        let refused =
            unsafe { pds[0].register_with_access(&mut scratch, AccessFlags::REMOTE_WRITE) };
        assert_eq!(
            refused.err().map(|e| e.kind()),
            Some(zverbs::ErrorKind::InvalidArgument)
        );

        let specs = region_specs();
        let mut regions = Vec::new();
        let mut mrs: [Vec<MemoryRegion<'a, Sim>>; 2] = [Vec::new(), Vec::new()];
        for (x, side) in storage.into_iter().enumerate() {
            for (block, spec) in side.iter_mut().zip(&specs) {
                let pd_ix = 2 * x + usize::from(spec.other_pd);
                let pd = &pds[pd_ix];
                let buf = &mut block.0[..spec.len];
                let mr = if spec.safe_register {
                    pd.register(buf)
                } else {
                    // SAFETY: peers reach this memory only inside posts and polls this
                    // thread makes; the harness reads it (as_slice) only between them.
                    unsafe { pd.register_with_access(buf, spec.access) }
                }
                .expect("register");
                regions.push(MRegion {
                    pd: pd_ix,
                    base: mr.remote().addr,
                    len: mr.len(),
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                    access: spec.access,
                    mem: mr.as_slice().to_vec(),
                });
                mrs[x].push(mr);
            }
        }
        let max_inline = u64::from(cfg.qp.caps.max_inline_data);
        let model = Model {
            regions,
            sides: [MSide::new(0), MSide::new(2)],
            done: Default::default(),
            depth: N,
            max_inline,
        };
        Rig {
            ch,
            pump,
            _pump_peer: pump_peer,
            decoy,
            _decoy_peer: decoy_peer,
            mrs,
            _pds: pds,
            _ctx: ctx,
            model,
            held: Vec::new(),
            timeouts_left: 0,
            qpn,
            seed,
            trace,
        }
    }

    fn region(&self, x: usize, i: usize) -> &MRegion {
        &self.model.regions[x * R + i]
    }

    /// Maps a safe local spec into its region: (region, start, len).
    fn map_local(&self, x: usize, l: &Local) -> (usize, usize, usize) {
        let i = usize::from(l.region) % R;
        let len = self.region(x, i).len;
        let start = usize::from(l.start) % (len + 1);
        (i, start, usize::from(l.len) % (len - start + 1))
    }

    fn locals(&self, x: usize, specs: &[Local], distinct: bool) -> Vec<(usize, usize, usize)> {
        let mut out: Vec<(usize, usize, usize)> = Vec::new();
        for l in specs {
            let l = self.map_local(x, l);
            if !(distinct && out.iter().any(|o| o.0 == l.0)) {
                out.push(l);
            }
        }
        out.truncate(S + 2);
        out
    }

    fn sges_of(&self, x: usize, locals: &[(usize, usize, usize)]) -> Vec<Sge> {
        locals
            .iter()
            .map(|&(i, st, n)| local_sge(self.region(x, i), st, n))
            .collect()
    }

    fn raw_sge(&self, x: usize, s: &RawSge) -> Sge {
        let i = usize::from(s.region) % R;
        let r = self.region(x, i);
        let (off, length) = match s.place {
            Place::In { start, len } => {
                let start = usize::from(start) % (r.len + 1);
                (
                    start as u64,
                    (usize::from(len) % (r.len - start + 1)) as u32,
                )
            }
            Place::Raw { off, len, huge } => (
                u64::from(off),
                u32::from(len) | if huge { 1 << 31 } else { 0 },
            ),
        };
        let lkey = match s.key {
            LKey::Own => r.lkey,
            LKey::Rkey => r.rkey,
            LKey::Xor(v) => r.lkey ^ v,
            LKey::Peer => self.region(1 - x, i).lkey,
            LKey::Raw(v) => v,
        };
        Sge {
            addr: r.base + off,
            length,
            lkey,
        }
    }

    /// Offset of a remote access into peer region `i`.
    fn remote_off(&self, x: usize, r: &Remote) -> u64 {
        let len = self.region(1 - x, usize::from(r.region) % R).len;
        match r.off {
            Off::In(o) => (usize::from(o) % (len + 1)) as u64,
            Off::Aligned(o) => (usize::from(o) % (len / 8 + 1) * 8) as u64,
            Off::Raw(o) => u64::from(o),
        }
    }

    fn rkey(&self, x: usize, r: &Remote) -> u32 {
        let i = usize::from(r.region) % R;
        let reg = self.region(1 - x, i);
        match r.key {
            RKey::Own => reg.rkey,
            RKey::Lkey => reg.lkey,
            RKey::Xor(v) => reg.rkey ^ v,
            RKey::Mine => self.region(x, i).rkey,
            RKey::Raw(v) => v,
        }
    }

    /// The remote region `x` names in its peer for `total` bytes of data.
    fn remote_region(&self, x: usize, r: &Remote, total: u64) -> Result<RemoteRegion, BoundsError> {
        let i = usize::from(r.region) % R;
        let reg = self.region(1 - x, i);
        let off = self.remote_off(x, r);
        let claimed = match r.len {
            RLen::Rest => (reg.len as u64).saturating_sub(off),
            RLen::Exact => total,
            RLen::Raw(n) => u64::from(n),
        };
        let rr = if r.via_slice {
            self.mrs[1 - x][i].remote().slice(off..off + claimed)?
        } else {
            RemoteRegion {
                addr: reg.base + off,
                len: claimed,
                rkey: reg.rkey,
            }
        };
        Ok(RemoteRegion {
            rkey: self.rkey(x, r),
            ..rr
        })
    }

    /// The word a compare-and-swap from `x` to `r` would compare, if the model knows it.
    fn compare_value(&self, x: usize, r: &Remote, cmp: &Cmp) -> u64 {
        match cmp {
            Cmp::Value(v) => *v,
            Cmp::Current => {
                let reg = self.region(1 - x, usize::from(r.region) % R);
                let off = self.remote_off(x, r) as usize;
                reg.mem
                    .get(off..off + 8)
                    .map_or(0, |w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
            }
        }
    }

    /// Inline payload read from `x`'s own memory, if every entry lies in a region of its
    /// main protection domain (valid memory, accepted under either inline rule).
    fn inline_bytes(&self, x: usize, sges: &[Sge]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        for s in sges.iter().filter(|s| s.length > 0) {
            let r = (0..R)
                .map(|i| self.region(x, i))
                .filter(|r| r.pd == 2 * x)
                .find_map(|r| r.offset(s.addr, u64::from(s.length)).map(|off| (r, off)));
            let (r, off) = r?;
            out.extend_from_slice(&r.mem[off..off + s.length as usize]);
        }
        Some(out)
    }

    /// Checks a call's result against `want`; returns the value of a success.
    fn check<T: std::fmt::Debug>(
        &self,
        real: Result<T, Error<SimError>>,
        want: &Want,
        x: usize,
        what: &str,
    ) -> Option<T> {
        if self.trace {
            eprintln!("   {what} on {x}: want {want:?}, got {real:?}");
        }
        let ok = match (want, &real) {
            (Want::Done(_, o), Ok(_)) => o.status == WcStatus::Success,
            (Want::ScopeOk, Ok(_)) | (Want::Posted(_), Ok(_)) => true,
            (Want::Done(seq, o), Err(Error::Completion(c))) => {
                o.status != WcStatus::Success
                    && c.status == o.status
                    && c.wr_id == *seq
                    && c.opcode == o.opcode
                    && c.qp_num == self.qpn[x]
                    && c.peer_qp_num == Some(self.qpn[1 - x])
            }
            (Want::TooManySges(g), Err(Error::TooManySges { given, max })) => {
                given == g && *max == S
            }
            (Want::OutOfBounds, Err(Error::OutOfBounds(_))) => true,
            (Want::QueueFull, Err(Error::QueueFull { capacity })) => *capacity == N,
            (Want::Refused(r, verb), Err(Error::Provider { op, source })) => {
                op == verb
                    && matches!(
                        (r, source),
                        (PostRefusal::Invalid, SimError::Invalid(_))
                            | (PostRefusal::QueueFull, SimError::QueueFull)
                    )
            }
            (Want::Timeout, Err(Error::Timeout))
            | (Want::InvalidAttribute, Err(Error::InvalidAttribute(_))) => true,
            _ => false,
        };
        assert!(ok, "{what} on side {x}: expected {want:?}, got {real:?}");
        if let Err(e) = &real {
            let _ = format!("{e} {:?}", e.kind());
        }
        real.ok()
    }

    /// Checks a returned completion against the expected outcome.
    fn check_completion(
        &self,
        real: Result<Completion, Error<SimError>>,
        want: &Want,
        x: usize,
        what: &str,
    ) {
        if let Some(c) = self.check(real, want, x, what) {
            let Want::Done(_, o) = want else { return };
            assert_eq!(
                (c.status, c.opcode, c.byte_len, c.imm),
                (o.status, o.opcode, o.byte_len, o.imm),
                "{what} on side {x}: completion"
            );
        }
    }

    fn op(&mut self, op: &Op) {
        match op {
            Op::Write { side, data, remote } => self.write(side.ix(), data, remote),
            Op::Read { side, into, remote } => self.read(side.ix(), into, remote),
            Op::FetchAdd {
                side,
                result,
                remote,
                add,
            } => {
                let op = |addr, rkey| SendOp::FetchAdd {
                    remote_addr: addr,
                    rkey,
                    add: *add,
                };
                self.atomic(side.ix(), result, remote, op, None);
            }
            Op::CompareSwap {
                side,
                result,
                remote,
                compare,
                swap,
            } => {
                let compare = self.compare_value(side.ix(), remote, compare);
                let op = |addr, rkey| SendOp::CompareSwap {
                    remote_addr: addr,
                    rkey,
                    compare,
                    swap: *swap,
                };
                self.atomic(side.ix(), result, remote, op, Some((compare, *swap)));
            }
            Op::Send { side, data, imm } => self.send(side.ix(), data, *imm),
            Op::SendInline { side, len } => self.send_inline(side.ix(), *len),
            Op::Receive { side, into } => self.receive(side.ix(), into),
            Op::PostSend {
                side,
                kind,
                sges,
                remote,
                flags,
            } => self.post_send(side.ix(), kind, sges, remote, *flags),
            Op::PostRecv { side, sges } => self.post_recv(side.ix(), sges),
            Op::Wait { idx } => self.wait(*idx),
            Op::TryComplete { idx } => self.try_complete(*idx),
            Op::Scope { side, items } => self.scope(side.ix(), items),
            Op::Repeat { .. } => unreachable!("resolved by run"),
            Op::SetError { side } => {
                let x = side.ix();
                self.ch[x].queue_pair().set_error().expect("set_error");
                self.model.set_err(x);
            }
        }
    }

    /// Waits for every handle still held: completed ones first, then the rest after
    /// moving both queue pairs to the error state. Nothing may be left over.
    fn finish(mut self) {
        let held = std::mem::take(&mut self.held);
        let (done, rest): (Vec<Held>, Vec<Held>) = held
            .into_iter()
            .partition(|h| self.model.done.contains_key(&(h.x, h.q, h.seq)));
        for h in done {
            let o = self.model.done.remove(&(h.x, h.q, h.seq)).expect("done");
            self.check_owner(&h);
            self.foreign_refused(h.x, h.q, false);
            let res = self.ch[h.x].wait(h.p);
            self.check_completion(res, &Want::Done(h.seq, o), h.x, "final wait");
        }
        if !rest.is_empty() {
            for x in 0..2 {
                self.ch[x].queue_pair().set_error().expect("set_error");
                self.model.set_err(x);
                // As after `Op::SetError`: a request of the peer waiting on RNR for this
                // side retries, finds nobody and, with instant timers, exhausts its retries
                // (RETRY_EXC_ERR) before the peer's own `set_error` could flush it.
                self.model.progress();
            }
            for h in rest {
                let o = self.model.done.remove(&(h.x, h.q, h.seq)).expect("flushed");
                self.check_owner(&h);
                self.foreign_refused(h.x, h.q, true);
                let res = self.ch[h.x].wait(h.p);
                self.check_completion(
                    res,
                    &Want::Done(h.seq, o),
                    h.x,
                    "final wait after set_error",
                );
            }
        }
        self.settle(usize::MAX);
        for x in 0..2 {
            assert_eq!(
                self.ch[x].in_flight(),
                (0, 0),
                "side {x}: slots left in flight"
            );
        }
        assert!(
            self.model.done.is_empty(),
            "completions never observed: {:?}",
            self.model.done
        );
    }
}
