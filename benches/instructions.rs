//! Instructions per operation on the simulator's data path, counted by callgrind through
//! gungraun, with a budget per bench that fails the run when exceeded.
//!
//! ```sh
//! cargo install gungraun-runner --version 0.20.0 --locked   # once: the runner of this version
//! cargo bench --features sim,tokio --bench instructions
//! ```
//!
//! Each bench counts [`ITERS`] iterations of one loop. A set-up, not counted, builds the
//! fabric, connects a queue pair to a sink on a second device and runs [`WARM_UP`]
//! iterations, so that the counted loop is in its steady state; the fixture is boxed, so
//! that handing it to the bench and back costs a pointer, not a copy of its rings. An
//! iteration posts one signaled 64-byte work request and polls its completion (`send`,
//! `write`), or posts [`BATCH`] writes behind one doorbell, only the last signaled, and
//! polls one completion (`write_batch`). A send needs a receive at the sink: the sink
//! keeps 512 posted and reaps and reposts 256 at a time, the same for every path, so it
//! cancels out of their difference. A bench's count divided by [`ITERS`] is one iteration
//! to within a tenth of an instruction (the bench function's own few dozen are all that
//! is added).
//!
//! The paths, compared by id (gungraun prints each bench against the others of its id):
//!
//! - `raw_calls`: `Provider::post_send` and `Provider::poll_cq` on the queue pair's and
//!   the completion queue's handles, what a C program would call;
//! - `channel`: the blocking `Channel::send` / `Channel::write` on queues of the
//!   channel's own, and a `Channel` scope for the batch, which builds its writes;
//! - `prepared_batch` (`write_batch` only): the same writes as a `Batch` built once,
//!   posted and waited for by `Channel::execute_batch`, as the raw loop posts a chain
//!   built once and polls its completion;
//! - `shared_queue`: the same channel on a `SharedCompletionQueue` (the dispatcher's
//!   share);
//! - `unpolled_level` (`send` only): `Channel::post_send_unpolled`, then
//!   `Channel::try_complete` until the send is done, the calls the verbs-path comparison
//!   with raw verbs and the peer crates measures (`scripts/verbs-instructions.sh`);
//! - `awaited_ops` (feature `tokio`): `AsyncChannel` on a current-thread runtime, each
//!   operation awaited before the next, with a pooled buffer.
//!
//! The library's share per operation is (`channel` − `raw_calls`) / [`ITERS`];
//! BENCHMARKS.md holds the figures. Each bench has a budget ([`budget`]): the count
//! measured when it was set, plus [`SLACK`] instructions per operation. The count is
//! deterministic for a build, so a run over budget is a regression of at least that much
//! (gungraun then exits with an error), or a deliberate change that sets the budget anew.

use std::hint::black_box;

use gungraun::{
    library_benchmark, library_benchmark_group, main, Callgrind, EventKind, LibraryBenchmarkConfig,
};
use zverbs::dispatch::SharedCompletionQueue;
use zverbs::provider::sim::Sim;
use zverbs::provider::Provider;
use zverbs::qp::{InitOptions, QpConfig, QueuePair, ReadyToSend, RtrOptions, RtsOptions};
use zverbs::testing::{PreparedSink, Sink};
#[cfg(feature = "tokio")]
use zverbs::{tokio::AsyncChannel, LocalBuf, MrPool};
use zverbs::{
    Batch, Channel, ChannelConfig, CompletionQueue, Context, LocalSlice, RemoteRegion, SendFlags,
    SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};

/// Bytes each work request moves.
const MSG: usize = 64;
/// Gather entries per request (the channel's `SGES`).
const S: usize = 4;
/// Ring depth of the channels.
const DEPTH: usize = 64;
/// Iterations counted per bench.
const ITERS: u64 = 3000;
/// Iterations run, uncounted, before them.
const WARM_UP: u64 = 64;
/// Writes per doorbell in `write_batch`.
const BATCH: usize = 32;
/// Instructions per operation a bench may exceed its measured count by.
const SLACK: u64 = 5;

/// What an iteration does.
#[derive(Clone, Copy)]
enum Op {
    Send,
    Write,
    WriteBatch,
}

/// A bench's configuration: callgrind without the cache simulation (instructions are the
/// figure), failing the run above `measured + SLACK` per operation (one per iteration).
fn budget(measured: u64) -> LibraryBenchmarkConfig {
    budget_of(measured, 1)
}

/// As [`budget`], for `ops` operations per iteration (the work requests of a batch).
fn budget_of(measured: u64, ops: u64) -> LibraryBenchmarkConfig {
    let mut config = LibraryBenchmarkConfig::default();
    config.tool(
        Callgrind::with_args(["--cache-sim=no"])
            .hard_limits([(EventKind::Ir, measured + SLACK * ITERS * ops)]),
    );
    config
}

/// A registered 64-byte source nobody writes, for the whole process (each bench runs in
/// a process of its own).
fn source(pd: &zverbs::ProtectionDomain<Sim>) -> LocalSlice<'static> {
    let buf: &'static mut [u8] = Box::leak(vec![0u8; MSG].into_boxed_slice());
    let mr = Box::leak(Box::new(pd.register(buf).expect("register")));
    mr.slice(..).expect("slice")
}

/// The peer on `sim1`, connected to `peer`: the sink, its endpoint and its region.
fn sink(sim: &Sim, peer: &zverbs::Endpoint) -> (Sink, zverbs::Endpoint, RemoteRegion) {
    let sink = PreparedSink::open(sim, "sim1", MSG, MSG).expect("sink");
    let ep = sink.endpoint();
    let sink = sink.connect(peer, MSG).expect("sink connect");
    let region = sink.remote();
    (sink, ep, region)
}

/// A connected channel and what its loop needs.
struct ChannelFixture {
    ch: Channel<Sim, DEPTH, S>,
    sink: Sink,
    src: LocalSlice<'static>,
    remote: RemoteRegion,
    op: Op,
    /// The `BATCH` writes, built once (`prepared_batch`).
    batch: Option<Batch<'static, Sim, BATCH, S>>,
    _sim: Sim,
}

impl ChannelFixture {
    /// `iters` iterations, in a loop of the operation's own (nothing else in it).
    fn run(&mut self, iters: u64) {
        let (ch, src, remote) = (&mut self.ch, self.src, &self.remote);
        match self.op {
            Op::Send => channel_sends(ch, src, &mut self.sink, iters),
            Op::Write => channel_writes(ch, src, remote, iters),
            Op::WriteBatch => channel_batches(ch, src, remote, iters),
        }
    }
}

#[inline(never)]
fn channel_sends(ch: &mut Channel<Sim, DEPTH, S>, src: LocalSlice<'_>, sink: &mut Sink, n: u64) {
    for _ in 0..n {
        ch.send([src]).expect("send");
        sink.after_send().expect("sink");
    }
}

#[inline(never)]
fn channel_writes(ch: &mut Channel<Sim, DEPTH, S>, src: LocalSlice<'_>, to: &RemoteRegion, n: u64) {
    for _ in 0..n {
        ch.write([src], to).expect("write");
    }
}

#[inline(never)]
fn channel_batches(
    ch: &mut Channel<Sim, DEPTH, S>,
    src: LocalSlice<'_>,
    to: &RemoteRegion,
    n: u64,
) {
    for _ in 0..n {
        ch.scope(|s| {
            for _ in 0..BATCH {
                s.post_write([src], to)?;
            }
            Ok(())
        })
        .expect("scope");
    }
}

#[inline(never)]
fn prepared_batches(
    ch: &mut Channel<Sim, DEPTH, S>,
    batch: &mut Batch<'static, Sim, BATCH, S>,
    n: u64,
) {
    for _ in 0..n {
        ch.execute_batch(batch).expect("batch");
    }
}

impl ChannelFixture {
    /// `iters` posts of the prepared batch.
    fn run_prepared(&mut self, iters: u64) {
        let batch = self.batch.as_mut().expect("a prepared fixture");
        prepared_batches(&mut self.ch, batch, iters);
    }

    /// `iters` signaled sends at the unpolled level.
    fn run_unpolled(&mut self, iters: u64) {
        unpolled_sends(&mut self.ch, self.src.sge(), &mut self.sink, iters);
    }
}

#[inline(never)]
fn unpolled_sends(ch: &mut Channel<Sim, DEPTH, S>, src: Sge, sink: &mut Sink, n: u64) {
    for _ in 0..n {
        // SAFETY: `src` names the leaked registered source, which nobody writes.
        let mut p = unsafe { ch.post_send_unpolled(&[src], SendOp::Send, SendFlags::SIGNALED) }
            .expect("post");
        loop {
            match ch.try_complete(p).expect("poll") {
                Ok(c) => {
                    assert_eq!(c.status, WcStatus::Success);
                    break;
                }
                Err(back) => p = back,
            }
        }
        sink.after_send().expect("sink");
    }
}

/// A channel on queues of its own (`shared`: on one shared completion queue).
fn channel_fixture(op: Op, shared: bool) -> Box<ChannelFixture> {
    let sim = Sim::with_devices(2);
    let ctx = Context::open(&sim, "sim0").expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let cfg = ChannelConfig::default();
    let prepared = if shared {
        let cq = std::sync::Arc::new(SharedCompletionQueue::create(&ctx, 2, 64).expect("cq"));
        Channel::<Sim, DEPTH, S>::prepare_shared(&ctx, &pd, &cfg, &cq, &cq)
    } else {
        Channel::<Sim, DEPTH, S>::prepare(&ctx, &pd, &cfg)
    }
    .expect("prepare");
    let (sink, sink_ep, remote) = sink(&sim, &prepared.endpoint());
    let mut f = Box::new(ChannelFixture {
        ch: prepared.connect(&sink_ep).expect("connect"),
        sink,
        src: source(&pd),
        remote: remote.slice(..MSG as u64).expect("remote"),
        op,
        batch: None,
        _sim: sim,
    });
    f.run(WARM_UP);
    f
}

fn own(op: Op) -> Box<ChannelFixture> {
    channel_fixture(op, false)
}

fn shared(op: Op) -> Box<ChannelFixture> {
    channel_fixture(op, true)
}

fn prepared(op: Op) -> Box<ChannelFixture> {
    let mut f = channel_fixture(op, false);
    let mut batch = f.ch.batch();
    for _ in 0..BATCH {
        batch
            .push(zverbs::Op::write([f.src], &f.remote))
            .expect("push");
    }
    f.batch = Some(batch);
    f.run_prepared(WARM_UP);
    f
}

fn unpolled(op: Op) -> Box<ChannelFixture> {
    let mut f = channel_fixture(op, false);
    f.run_unpolled(WARM_UP);
    f
}

/// A queue pair driven through the provider's calls.
struct RawFixture {
    qp: QueuePair<Sim, ReadyToSend>,
    cq: CompletionQueue<Sim>,
    /// The request, or the chain of `BATCH` (only the last signaled).
    chain: Vec<SendWr<S>>,
    /// The sink, reposting its receives after sends (`send`) or only kept connected.
    sink: Sink,
    send: bool,
    _sim: Sim,
}

impl RawFixture {
    fn run(&mut self, iters: u64) {
        let (qp, cq) = (self.qp.raw(), self.cq.raw());
        let sink = self.send.then_some(&mut self.sink);
        raw_loop(qp, cq, &self.chain, sink, iters);
    }
}

/// Posts `chain` (one request or a chain, its last signaled) and polls its completion,
/// `n` times; after each, the sink reposts its receives (sends only).
#[inline(never)]
fn raw_loop(
    qp: &<Sim as Provider>::Qp,
    cq: &<Sim as Provider>::Cq,
    chain: &[SendWr<S>],
    mut sink: Option<&mut Sink>,
    n: u64,
) {
    let mut wc = [WorkCompletion::EMPTY; 1];
    for _ in 0..n {
        // SAFETY: every gather entry names the leaked registered source, which nobody
        // writes.
        unsafe { Sim::post_send(qp, chain) }.expect("post");
        while Sim::poll_cq(cq, &mut wc).expect("poll") == 0 {}
        assert_eq!(wc[0].status, WcStatus::Success);
        if let Some(s) = sink.as_deref_mut() {
            s.after_send().expect("sink");
        }
    }
}

fn raw(op: Op) -> Box<RawFixture> {
    let sim = Sim::with_devices(2);
    let ctx = Context::open(&sim, "sim0").expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = CompletionQueue::create(&ctx, 128).expect("cq");
    let mut caps = QpConfig::default();
    caps.caps.max_send_wr = DEPTH as u32;
    caps.caps.max_recv_wr = DEPTH as u32;
    caps.caps.max_send_sge = S as u32;
    caps.caps.max_recv_sge = S as u32;
    let qp = QueuePair::create(&ctx, &pd, &cq, &cq, &caps)
        .expect("qp")
        .into_init(&InitOptions::default())
        .expect("init");
    let (sink, sink_ep, region) = sink(&sim, &qp.endpoint());
    let qp = qp
        .into_rtr(&sink_ep, &RtrOptions::default())
        .expect("rtr")
        .into_rts(&RtsOptions::default())
        .expect("rts");
    let wr_op = match op {
        Op::Send => SendOp::Send,
        Op::Write | Op::WriteBatch => SendOp::Write {
            remote_addr: region.addr,
            rkey: region.rkey,
        },
    };
    let len = if matches!(op, Op::WriteBatch) {
        BATCH
    } else {
        1
    };
    let mut wr = SendWr::<S>::new(0, wr_op, SendFlags::empty());
    wr.sg_list[0] = source(&pd).sge();
    wr.num_sge = 1;
    let mut chain = vec![wr; len];
    chain[len - 1].flags = SendFlags::SIGNALED;
    let mut f = Box::new(RawFixture {
        qp,
        cq,
        chain,
        sink,
        send: matches!(op, Op::Send),
        _sim: sim,
    });
    f.run(WARM_UP);
    f
}

/// An `AsyncChannel` on a current-thread runtime, with a pooled buffer.
#[cfg(feature = "tokio")]
struct AwaitedFixture {
    rt: tokio::runtime::Runtime,
    ch: AsyncChannel<Sim, LocalBuf<Sim>, DEPTH, S>,
    buf: Option<LocalBuf<Sim>>,
    sink: Sink,
    remote: RemoteRegion,
    op: Op,
    _pool: MrPool<Sim>,
    _sim: Sim,
}

#[cfg(feature = "tokio")]
impl AwaitedFixture {
    fn run(&mut self, iters: u64) {
        let (ch, sink, remote, op) = (&self.ch, &mut self.sink, &self.remote, self.op);
        let mut buf = self.buf.take().expect("buffer");
        buf = self.rt.block_on(async move {
            for _ in 0..iters {
                let (r, back) = match op {
                    Op::Send => {
                        let out = ch.send(buf).await;
                        sink.after_send().expect("sink");
                        out
                    }
                    Op::Write | Op::WriteBatch => ch.write(buf, remote).await,
                };
                r.expect("async operation");
                buf = back;
            }
            buf
        });
        self.buf = Some(buf);
    }
}

#[cfg(feature = "tokio")]
fn awaited(op: Op) -> Box<AwaitedFixture> {
    let sim = Sim::with_devices(2);
    let ctx = Context::open(&sim, "sim0").expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let prepared =
        AsyncChannel::<Sim, LocalBuf<Sim>, DEPTH, S>::prepare(&ctx, &pd, &ChannelConfig::default())
            .expect("prepare");
    let (sink, sink_ep, region) = sink(&sim, &prepared.endpoint());
    let ch = prepared.connect(&sink_ep).expect("connect");
    let ch = {
        let _in = rt.enter();
        AsyncChannel::new(ch).expect("async channel")
    };
    let pool = MrPool::new(&pd, 1 << 16).expect("pool");
    let buf = pool.alloc(MSG).expect("buffer");
    let mut f = Box::new(AwaitedFixture {
        rt,
        ch,
        buf: Some(buf),
        sink,
        remote: region.slice(..MSG as u64).expect("remote"),
        op,
        _pool: pool,
        _sim: sim,
    });
    f.run(WARM_UP);
    f
}

// Budgets: the counts of the build that set them (gungraun's `Instructions:` line).

#[library_benchmark]
#[bench::send(args = (Op::Send), setup = raw, config = budget(3_843_752))]
#[bench::write(args = (Op::Write), setup = raw, config = budget(2_790_401))]
#[bench::write_batch(args = (Op::WriteBatch), setup = raw, config = budget_of(42_222_401, BATCH as u64))]
fn raw_calls(mut f: Box<RawFixture>) -> Box<RawFixture> {
    f.run(black_box(ITERS));
    f
}

#[library_benchmark]
#[bench::send(args = (Op::Send), setup = own, config = budget(3_955_088))]
#[bench::write(args = (Op::Write), setup = own, config = budget(2_928_774))]
#[bench::write_batch(args = (Op::WriteBatch), setup = own, config = budget_of(46_290_749, BATCH as u64))]
fn channel(mut f: Box<ChannelFixture>) -> Box<ChannelFixture> {
    f.run(black_box(ITERS));
    f
}

#[library_benchmark]
#[bench::write_batch(args = (Op::WriteBatch), setup = prepared, config = budget_of(43_170_740, BATCH as u64))]
fn prepared_batch(mut f: Box<ChannelFixture>) -> Box<ChannelFixture> {
    f.run_prepared(black_box(ITERS));
    f
}

#[library_benchmark]
#[bench::send(args = (Op::Send), setup = shared, config = budget(4_062_153))]
#[bench::write(args = (Op::Write), setup = shared, config = budget(3_027_187))]
fn shared_queue(mut f: Box<ChannelFixture>) -> Box<ChannelFixture> {
    f.run(black_box(ITERS));
    f
}

#[library_benchmark]
#[bench::send(args = (Op::Send), setup = unpolled, config = budget(4_066_668))]
fn unpolled_level(mut f: Box<ChannelFixture>) -> Box<ChannelFixture> {
    f.run_unpolled(black_box(ITERS));
    f
}

#[cfg(feature = "tokio")]
#[library_benchmark]
#[bench::send(args = (Op::Send), setup = awaited, config = budget(4_562_083))]
#[bench::write(args = (Op::Write), setup = awaited, config = budget(3_499_766))]
fn awaited_ops(mut f: Box<AwaitedFixture>) -> Box<AwaitedFixture> {
    f.run(black_box(ITERS));
    f
}

#[cfg(not(feature = "tokio"))]
library_benchmark_group!(
    name = post_poll;
    compare_by_id = true;
    benchmarks = raw_calls, channel, prepared_batch, shared_queue, unpolled_level
);

#[cfg(feature = "tokio")]
library_benchmark_group!(
    name = post_poll;
    compare_by_id = true;
    benchmarks = raw_calls, channel, prepared_batch, shared_queue, unpolled_level, awaited_ops
);

main!(library_benchmark_groups = post_poll);
