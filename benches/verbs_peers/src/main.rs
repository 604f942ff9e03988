//! One post + poll loop per library on a verbs device, for user-space instruction counts
//! (`scripts/verbs-instructions.sh` runs it under callgrind in the rxe guest).
//!
//! ```text
//! verbs_loop LIB MODE N     LIB: zverbs | raw | raw_wr | ibverbs | sideway
//!                            MODE: send | empty | batch | scope | prepared | blocking
//!                            (the last three zverbs only)
//! ```
//!
//! Each library builds two RC queue pairs on `ZVERBS_DEVICE` (default `rxe0`), GID index
//! `ZVERBS_GID_INDEX` (default 1), A connected to B. `send`: `N` times, a receive is posted
//! at B (not measured), A posts one signaled 64-byte SEND (`measured_post`), the loop sleeps
//! 200 µs (not measured, so that the completion is usually there at the first poll), then
//! polls A's send queue (`measured_poll`) until the completion is taken; B's receive
//! completions are then taken (not measured). `empty`: `N` polls of A's idle send queue
//! (`measured_poll`), the cost of a poll that finds nothing. `batch`: `N` times, A posts
//! [`BATCH`] RDMA WRITEs of 64 bytes into B's buffer with one doorbell, only the last
//! signaled (`measured_batch`), then as `send` (sleep, poll until its completion is taken);
//! zverbs has no unpolled batch, so its `measured_batch` is a `Channel` scope that stages
//! the writes, rings the doorbell, pauses 200 µs (`unmeasured_pause`, not collected) and
//! returns once the scope has taken the completion. `prepared` (zverbs only): the same
//! writes as a `Batch` built once before the loop (as raw verbs' chain is), posted and
//! waited for by the blocking `Channel::execute_batch`, with no pause (rxe runs the
//! requests and their acknowledgements inside the post's system call, so its first poll
//! takes the completion). `scope` (zverbs only): the SEND of `send` through a scope, as
//! `batch`. `blocking` (zverbs only): the SEND of `send` as the blocking `Channel::send`,
//! with no pause, as `prepared`. It prints `ops=.. empty_polls=..`.
//!
//! Callgrind collects only inside `measured_*` (`--toggle-collect`), so per operation:
//! `(Ir(send, N₂) − Ir(send, N₁) − (E₂ − E₁) · Ir(empty, K) / K) / (N₂ − N₁)`, with `E` the
//! empty polls each run reports: set-up and first calls cancel out, and so does the
//! timing-dependent number of polls that found nothing. A scope's or a blocking call's own
//! polls are not counted here: the completion is there at its first poll, which the calls
//! to the provider's `poll_cq` in the callgrind output confirm (one per operation).

mod peer_ibverbs;
mod peer_sideway;
mod raw_wr;

use std::time::Duration;

use zverbs::provider::verbs::Verbs;

/// The same loop over any library's rig.
macro_rules! run {
    ($lib:ident, $mode:expr, $n:expr, $dev:expr, $gid:expr) => {{
        let mut rig = $lib::setup($dev, $gid);
        match $mode {
            "send" => {
                let mut empties = 0u64;
                for _ in 0..$n {
                    rig.refill();
                    $lib::measured_post(&mut rig);
                    std::thread::sleep(Duration::from_micros(200));
                    while !$lib::measured_poll(&mut rig) {
                        empties += 1;
                        if empties == 100_000 {
                            panic!("a send never completed ({} received at B)", rig.drain());
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    let mut got = 0;
                    while got == 0 {
                        got = rig.drain();
                    }
                }
                println!("ops={} empty_polls={}", $n, empties);
            }
            "empty" => {
                for _ in 0..$n {
                    assert!(
                        !$lib::measured_poll(&mut rig),
                        "an idle queue completed something"
                    );
                }
                println!("ops=0 empty_polls={}", $n);
            }
            "batch" | "scope" | "prepared" | "blocking" => {
                let mut empties = 0u64;
                for _ in 0..$n {
                    if $mode == "scope" || $mode == "blocking" {
                        rig.refill();
                    }
                    let settled = match $mode {
                        "batch" => $lib::measured_batch(&mut rig),
                        "prepared" => $lib::measured_prepared(&mut rig),
                        "blocking" => $lib::measured_blocking(&mut rig),
                        _ => $lib::measured_scope(&mut rig),
                    };
                    if !settled {
                        std::thread::sleep(Duration::from_micros(200));
                        while !$lib::measured_poll(&mut rig) {
                            empties += 1;
                            assert!(empties < 100_000, "a batch never completed");
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                    if $mode == "scope" || $mode == "blocking" {
                        let mut got = 0;
                        while got == 0 {
                            got = rig.drain();
                        }
                    }
                }
                println!("ops={} empty_polls={}", $n, empties);
            }
            other => {
                panic!("MODE is send, empty, batch, scope, prepared or blocking, not {other:?}")
            }
        }
    }};
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [lib, mode, n] = &args[..] else {
        eprintln!("usage: verbs_loop zverbs|raw|raw_wr|ibverbs|sideway send|empty|batch|scope|prepared|blocking N");
        std::process::exit(2);
    };
    let n: u64 = n.parse().expect("N is a number");
    let dev = std::env::var("ZVERBS_DEVICE").unwrap_or_else(|_| "rxe0".into());
    let gid: u8 = std::env::var("ZVERBS_GID_INDEX").map_or(1, |g| g.parse().expect("a GID index"));
    let mode = mode.as_str();
    match lib.as_str() {
        "zverbs" => run!(zverbs_path, mode, n, &dev, gid),
        "raw" => run!(raw, mode, n, &dev, gid),
        "raw_wr" => run!(raw_wr, mode, n, &dev, gid),
        "ibverbs" => run!(peer_ibverbs, mode, n, &dev, gid),
        "sideway" => run!(peer_sideway, mode, n, &dev, gid),
        other => panic!("LIB is zverbs, raw, raw_wr, ibverbs or sideway, not {other:?}"),
    }
}

/// Bytes in each queue pair's registered buffer, and in the SEND.
const BUF_LEN: usize = 64;
/// Entries asked for in each completion queue.
const CQ_ENTRIES: usize = 64;
/// Outstanding send and receive work requests each queue pair takes (room for a batch).
const DEPTH: u32 = 64;
/// RDMA WRITEs per doorbell in `batch`.
const BATCH: usize = 32;
/// `wr_id` of the measured SEND.
const SEND_WR_ID: u64 = 1;
/// `wr_id` of B's receives.
const RECV_WR_ID: u64 = 2;

/// A buffer of `BUF_LEN` bytes that lives as long as the process.
fn leak() -> &'static mut [u8] {
    Box::leak(vec![0u8; BUF_LEN].into_boxed_slice())
}

/// Sleeps 200 µs inside a measured function, for a scope's completion to arrive before it
/// polls; its name matches callgrind's `--toggle-collect='*measured_*'`, so collection is
/// off while it runs.
#[inline(never)]
fn unmeasured_pause() {
    std::thread::sleep(Duration::from_micros(200));
}

/// The device and a protection domain on it (zverbs' set-up, for its rig and the raw one).
fn open(dev: &str) -> (zverbs::Context<Verbs>, zverbs::ProtectionDomain<Verbs>) {
    let ctx = zverbs::Context::open(&Verbs, dev).expect("open the device");
    let pd = ctx.alloc_pd().expect("a protection domain");
    (ctx, pd)
}

/// zverbs: a `Channel`'s unpolled level, a post and `try_complete` (what a scope and the
/// blocking calls run on, without their waiting); batches and `scope` through a scope.
mod zverbs_path {
    use zverbs::provider::verbs::Verbs;
    use zverbs::qp::QpConfig;
    use zverbs::{
        AccessFlags, Batch, Channel, ChannelConfig, Context, LocalSlice, MemoryRegion, Op,
        Pending, ProtectionDomain, RemoteRegion, SendFlags, SendOp, Sge,
    };

    type Ch = Channel<Verbs, { super::DEPTH as usize }, 1>;

    pub struct Rig {
        a: Ch,
        b: Ch,
        src: Sge,
        dst: Sge,
        /// B's buffer, for A's writes.
        remote: RemoteRegion,
        sent: Option<Pending>,
        /// A receive on A that nothing completes (`empty`).
        idle: Option<Pending>,
        recvs: Vec<Pending>,
        /// The writes of `batch`, built once (`prepared`).
        prepared: Batch<'static, Verbs, { super::BATCH }, 1>,
        /// A's buffer (leaked) as a slice, made once, as `src` and raw verbs' SGE are: for
        /// the blocking call, the scope and the batch.
        whole: LocalSlice<'static>,
        _dst: MemoryRegion<'static, Verbs>,
        _pd: ProtectionDomain<Verbs>,
        _ctx: Context<Verbs>,
    }

    pub fn setup(dev: &str, gid_index: u8) -> Rig {
        let (ctx, pd) = super::open(dev);
        let cfg = ChannelConfig {
            qp: QpConfig {
                gid_index,
                ..QpConfig::default()
            },
            ..ChannelConfig::default()
        };
        let a = Ch::prepare(&ctx, &pd, &cfg).expect("channel A");
        let b = Ch::prepare(&ctx, &pd, &cfg).expect("channel B");
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (a, b) = (
            a.connect(&eb).expect("A to B"),
            b.connect(&ea).expect("B to A"),
        );
        let src = Box::leak(Box::new(pd.register(super::leak()).expect("A's buffer")));
        let whole = src.slice(..).unwrap();
        let remote_write = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // SAFETY: B's buffer is leaked and never read or written by the program.
        let mut dst =
            unsafe { pd.register_with_access(super::leak(), remote_write) }.expect("B's buffer");
        let (s, d) = (
            src.slice(..).unwrap().sge(),
            dst.slice_mut(..).unwrap().sge(),
        );
        let remote = dst.remote();
        let mut a = a;
        let idle_buf = Box::leak(Box::new(pd.register(super::leak()).expect("A's inbox")));
        let idle_sge = idle_buf.slice_mut(..).unwrap().sge();
        // SAFETY: A's inbox is leaked and never touched by the program.
        let idle = unsafe { a.post_receive_unpolled(&[idle_sge]) }.expect("A's receive");
        let batch_src = Box::leak(Box::new(pd.register(super::leak()).expect("A's source")));
        let mut prepared = a.batch();
        for _ in 0..super::BATCH {
            let write = Op::write([batch_src.slice(..).unwrap()], &remote);
            prepared.push(write).expect("a prepared write");
        }
        Rig {
            a,
            b,
            src: s,
            dst: d,
            remote,
            sent: None,
            idle: Some(idle),
            recvs: Vec::with_capacity(16),
            prepared,
            whole,
            _dst: dst,
            _pd: pd,
            _ctx: ctx,
        }
    }

    impl Rig {
        pub fn refill(&mut self) {
            // SAFETY: B's buffer is never read or written by the program; it is registered
            // for the process's life.
            let p = unsafe { self.b.post_receive_unpolled(&[self.dst]) }.expect("post_recv");
            self.recvs.push(p);
        }

        pub fn drain(&mut self) -> usize {
            let mut taken = 0;
            for p in std::mem::take(&mut self.recvs) {
                match self.b.try_complete(p).expect("poll B") {
                    Ok(_) => taken += 1,
                    Err(p) => self.recvs.push(p),
                }
            }
            taken
        }
    }

    #[inline(never)]
    pub fn measured_post(rig: &mut Rig) {
        // SAFETY: A's buffer is never written; it is registered for the process's life.
        let p = unsafe {
            rig.a
                .post_send_unpolled(&[rig.src], SendOp::Send, SendFlags::SIGNALED)
        };
        rig.sent = Some(p.expect("post_send"));
    }

    /// [`super::BATCH`] writes of A's buffer into B's through a scope, one doorbell; returns
    /// once the scope took the completion (so: settled).
    #[inline(never)]
    pub fn measured_batch(rig: &mut Rig) -> bool {
        let (src, remote) = (rig.whole, &rig.remote);
        rig.a
            .scope(|s| {
                for _ in 0..super::BATCH {
                    s.post_write([src], remote)?;
                }
                s.ring_doorbell()?;
                super::unmeasured_pause();
                Ok(())
            })
            .expect("batch");
        true
    }

    /// The writes of `batch` as a `Batch` built once, posted by the blocking
    /// `Channel::execute_batch` (no pause: as `measured_blocking`).
    #[inline(never)]
    pub fn measured_prepared(rig: &mut Rig) -> bool {
        rig.a
            .execute_batch(&mut rig.prepared)
            .expect("prepared batch");
        true
    }

    /// The SEND of `send` as the blocking call (`Channel::send`): posted, then waited for
    /// with the default policy. No pause: on rxe the SEND and its acknowledgement run in
    /// the post's system call, so the completion is there at the first poll (the calls to
    /// the provider's `poll_cq` in the callgrind output, one per operation, say so).
    #[inline(never)]
    pub fn measured_blocking(rig: &mut Rig) -> bool {
        let src = rig.whole;
        rig.a.send([src]).expect("send");
        true
    }

    /// The SEND of `send` through a scope: staged, the doorbell rung, then the scope's wait.
    #[inline(never)]
    pub fn measured_scope(rig: &mut Rig) -> bool {
        let src = rig.whole;
        rig.a
            .scope(|s| {
                s.post_send([src])?;
                s.ring_doorbell()?;
                super::unmeasured_pause();
                Ok(())
            })
            .expect("scope");
        true
    }

    #[inline(never)]
    pub fn measured_poll(rig: &mut Rig) -> bool {
        let Some(p) = rig.sent.take() else {
            // `empty`: the same call on a receive nobody sends to (A's receive queue; the
            // provider's poll of an empty queue costs the same on either).
            let p = rig.idle.take().expect("an idle receive");
            let done = rig.a.try_complete(p).expect("poll A");
            return match done {
                Ok(_) => true,
                Err(p) => {
                    rig.idle = Some(p);
                    false
                }
            };
        };
        match rig.a.try_complete(p).expect("poll A") {
            Ok(_) => true,
            Err(p) => {
                rig.sent = Some(p);
                false
            }
        }
    }
}

/// Raw verbs: `ibv_post_send` and `ibv_poll_cq` as `verbs.h` defines them (the provider's
/// op table), on queue pairs set up through zverbs' typestate (set-up is not measured).
mod raw {
    use ibverbs_sys as ffi;
    use zverbs::provider::verbs::Verbs;
    use zverbs::qp::{InitOptions, QpConfig, QueuePair, ReadyToSend, RtrOptions, RtsOptions};
    use zverbs::{CompletionQueue, Context, MemoryRegion, ProtectionDomain};

    pub struct Rig {
        a: QueuePair<Verbs, ReadyToSend>,
        b: QueuePair<Verbs, ReadyToSend>,
        a_cq: CompletionQueue<Verbs>,
        b_cq: CompletionQueue<Verbs>,
        pub(crate) src: ffi::ibv_sge,
        dst: ffi::ibv_sge,
        wc: ffi::ibv_wc,
        /// A's queue pair as an extended one (`raw_wr`'s builders).
        pub(crate) a_qpx: *mut ffi::ibv_qp_ex,
        /// B's buffer: its address and rkey (`raw_wr`'s batch).
        pub(crate) remote: (u64, u32),
        /// `BATCH` linked RDMA WRITEs of A's buffer into B's, the last signaled: built once,
        /// as perftest builds its chains, posted by `measured_batch` (the floor: a program
        /// that builds its requests per post pays for that too).
        batch: Box<[ffi::ibv_send_wr]>,
        /// The SGE the batch's requests point to (on the heap: the rig moves).
        _batch_sge: Box<ffi::ibv_sge>,
        _mrs: (MemoryRegion<'static, Verbs>, MemoryRegion<'static, Verbs>),
        _pd: ProtectionDomain<Verbs>,
        _ctx: Context<Verbs>,
    }

    pub fn setup(dev: &str, gid_index: u8) -> Rig {
        let (ctx, pd) = super::open(dev);
        let (a_cq, b_cq) = (
            CompletionQueue::create(&ctx, super::CQ_ENTRIES as u32).expect("A's CQ"),
            CompletionQueue::create(&ctx, super::CQ_ENTRIES as u32).expect("B's CQ"),
        );
        let mut cfg = QpConfig {
            gid_index,
            ..QpConfig::default()
        };
        (cfg.caps.max_send_wr, cfg.caps.max_recv_wr) = (super::DEPTH, super::DEPTH);
        (cfg.caps.max_send_sge, cfg.caps.max_recv_sge) = (1, 1);
        let init = InitOptions::default();
        let a = QueuePair::create(&ctx, &pd, &a_cq, &a_cq, &cfg).expect("QP A");
        let b = QueuePair::create(&ctx, &pd, &b_cq, &b_cq, &cfg).expect("QP B");
        let (a, b) = (a.into_init(&init).unwrap(), b.into_init(&init).unwrap());
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (rtr, rts) = (RtrOptions::default(), RtsOptions::default());
        let a = a.into_rtr(&eb, &rtr).unwrap().into_rts(&rts).unwrap();
        let b = b.into_rtr(&ea, &rtr).unwrap().into_rts(&rts).unwrap();
        let src = pd.register(super::leak()).expect("A's buffer");
        let remote_write = zverbs::AccessFlags::LOCAL_WRITE | zverbs::AccessFlags::REMOTE_WRITE;
        // SAFETY: B's buffer is leaked and never read or written by the program.
        let mut dst =
            unsafe { pd.register_with_access(super::leak(), remote_write) }.expect("B's buffer");
        let sge = |s: zverbs::Sge| ffi::ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
        let (s, d) = (
            sge(src.slice(..).unwrap().sge()),
            sge(dst.slice_mut(..).unwrap().sge()),
        );
        let remote = dst.remote();
        let mut batch_sge = Box::new(s);
        let mut batch: Box<[ffi::ibv_send_wr]> = (0..super::BATCH)
            .map(|i| {
                // SAFETY: a plain C struct; all zeroes is a valid value.
                let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
                wr.wr_id = i as u64;
                wr.sg_list = &mut *batch_sge;
                wr.num_sge = 1;
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                wr.wr.rdma.remote_addr = remote.addr;
                wr.wr.rdma.rkey = remote.rkey;
                wr
            })
            .collect();
        for i in 1..super::BATCH {
            let next: *mut ffi::ibv_send_wr = &mut batch[i];
            batch[i - 1].next = next;
        }
        batch[super::BATCH - 1].send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        // SAFETY: A is live; zverbs creates an RC queue pair extended where it can (NULL
        // if not: `raw_wr` checks).
        let a_qpx = unsafe { ffi::ibv_qp_to_qp_ex(a.raw().as_ptr()) };
        Rig {
            a,
            b,
            a_cq,
            b_cq,
            src: s,
            dst: d,
            // SAFETY: a plain C struct; all zeroes is a valid value.
            wc: unsafe { std::mem::zeroed() },
            a_qpx,
            remote: (remote.addr, remote.rkey),
            batch,
            _batch_sge: batch_sge,
            _mrs: (src, dst),
            _pd: pd,
            _ctx: ctx,
        }
    }

    impl Rig {
        pub fn refill(&mut self) {
            let qp = self.b.raw().as_ptr();
            // SAFETY: a plain C struct; all zeroes is a valid value.
            let mut wr: ffi::ibv_recv_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = 2;
            wr.sg_list = &mut self.dst;
            wr.num_sge = 1;
            let mut bad = std::ptr::null_mut();
            // SAFETY: `qp` lives in `self.b`; B's buffer is registered for the process's
            // life and never touched by the program.
            let rc = unsafe { (*(*qp).context).ops.post_recv.unwrap()(qp, &mut wr, &mut bad) };
            assert_eq!(rc, 0, "ibv_post_recv");
        }

        pub fn drain(&mut self) -> usize {
            let cq = self.b_cq.raw().as_ptr();
            // SAFETY: `cq` lives in `self.b_cq`; `wc` has room for one completion.
            let n = unsafe { (*(*cq).context).ops.poll_cq.unwrap()(cq, 1, &mut self.wc) };
            assert!(n >= 0 && (n == 0 || self.wc.is_valid()));
            n as usize
        }
    }

    #[inline(never)]
    pub fn measured_post(rig: &mut Rig) {
        let qp = rig.a.raw().as_ptr();
        // SAFETY: a plain C struct; all zeroes is a valid value.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = 1;
        wr.sg_list = &mut rig.src;
        wr.num_sge = 1;
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = std::ptr::null_mut();
        // SAFETY: `qp` lives in `rig.a`; A's buffer is registered for the process's life
        // and never written.
        let rc = unsafe { (*(*qp).context).ops.post_send.unwrap()(qp, &mut wr, &mut bad) };
        assert_eq!(rc, 0, "ibv_post_send");
    }

    /// No scopes in raw verbs.
    pub fn measured_scope(_: &mut Rig) -> bool {
        panic!("scope: zverbs only")
    }

    /// No blocking calls in raw verbs.
    pub fn measured_blocking(_: &mut Rig) -> bool {
        panic!("blocking: zverbs only")
    }

    /// Raw verbs' `batch` is its chain built once.
    pub fn measured_prepared(_: &mut Rig) -> bool {
        panic!("prepared: zverbs only (raw verbs' batch is a chain built once)")
    }

    /// Posts the prebuilt chain of `BATCH` writes with one call.
    #[inline(never)]
    pub fn measured_batch(rig: &mut Rig) -> bool {
        let qp = rig.a.raw().as_ptr();
        let mut bad = std::ptr::null_mut();
        // SAFETY: `qp` lives in `rig.a`; the chain's SGE names A's buffer, registered for
        // the process's life and never written, and its remote B's, registered likewise.
        let rc = unsafe {
            (*(*qp).context).ops.post_send.unwrap()(qp, rig.batch.as_mut_ptr(), &mut bad)
        };
        assert_eq!(rc, 0, "ibv_post_send");
        false
    }

    #[inline(never)]
    pub fn measured_poll(rig: &mut Rig) -> bool {
        let cq = rig.a_cq.raw().as_ptr();
        // SAFETY: `cq` lives in `rig.a_cq`; `wc` has room for one completion.
        let n = unsafe { (*(*cq).context).ops.poll_cq.unwrap()(cq, 1, &mut rig.wc) };
        assert!(n >= 0, "ibv_poll_cq");
        assert!(n == 0 || rig.wc.is_valid());
        n == 1
    }
}
