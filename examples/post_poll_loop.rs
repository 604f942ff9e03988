//! The post+poll loop alone, for instruction counting (`scripts/callgrind.sh`).
//!
//! ```text
//! cargo run --release --features sim --example post_poll_loop -- PATH OP ITERS [BATCH]
//! ```
//!
//! `PATH` is `channel` (the library: blocking `Channel::send` / `Channel::write`),
//! `shared` (the same on a `SharedCompletionQueue`, through the dispatcher) or `raw`
//! (`Provider::post_send` + `Provider::poll_cq` on the queue pair and CQ handles); `OP` is
//! `send` or `write`; each iteration posts one signaled 64-byte work request and polls its
//! completion. A send needs a receive at the peer: the peer is a raw queue pair that keeps
//! 512 receives posted and reaps/reposts 256 at a time, the same for both paths, so it
//! cancels out of their difference. Setup is the same for any `ITERS`, so
//! `(Ir(ITERS₂) − Ir(ITERS₁)) / (ITERS₂ − ITERS₁)` is the cost of one iteration.
//!
//! With `BATCH` > 1 (writes only), an iteration posts `BATCH` writes with one doorbell,
//! only the last signaled (a `Channel` scope, or one raw chain), and polls one completion.
//!
//! Built with `--features sim,tokio`, `PATH` may also be `async`: the same sends or writes
//! through `AsyncChannel` on a current-thread runtime, each awaited before the next, with
//! a pooled buffer (`BATCH` 1 only).

use std::process::ExitCode;

use zverbs::dispatch::SharedCompletionQueue;
use zverbs::provider::sim::Sim;
use zverbs::provider::Provider;
use zverbs::qp::{InitOptions, QpConfig, QueuePair, RtrOptions, RtsOptions};
use zverbs::testing::{PreparedSink, Sink};
use zverbs::{
    Channel, ChannelConfig, CompletionQueue, Context, SendFlags, SendOp, SendWr, WcStatus,
    WorkCompletion,
};

const MSG: usize = 64;
const S: usize = 4;

fn leak(len: usize) -> &'static mut [u8] {
    Box::leak(vec![0u8; len].into_boxed_slice())
}

/// The library path: `iters` blocking sends or writes (or scopes of `batch` writes) on a
/// `Channel`.
#[inline(never)]
fn run_channel(iters: u64, write: bool, batch: usize, shared: bool) {
    let sim = Sim::with_devices(2);
    let ca = Context::open(&sim, "sim0").unwrap();
    let pa = ca.alloc_pd().unwrap();
    let cfg = ChannelConfig::default();
    let prepared = if shared {
        let cq = std::sync::Arc::new(SharedCompletionQueue::create(&ca, 2, 64).unwrap());
        Channel::<Sim, 64, S>::prepare_shared(&ca, &pa, &cfg, &cq, &cq).unwrap()
    } else {
        Channel::<Sim, 64, S>::prepare(&ca, &pa, &cfg).unwrap()
    };
    let (mut sink, sink_ep, region) = sink(&sim, &prepared.endpoint());
    let mut ch = prepared.connect(&sink_ep).unwrap();
    let src = pa.register(leak(MSG)).unwrap();
    let src = src.slice(..).unwrap();
    let remote = region.slice(..MSG as u64).unwrap();
    if batch > 1 {
        channel_batch_loop(&mut ch, src, &remote, iters, batch);
    } else if write {
        channel_write_loop(&mut ch, src, &remote, iters);
    } else {
        channel_send_loop(&mut ch, src, &mut sink, iters);
    }
}

#[inline(never)]
fn channel_send_loop(
    ch: &mut Channel<Sim, 64, S>,
    src: zverbs::LocalSlice<'_>,
    sink: &mut Sink,
    iters: u64,
) {
    for _ in 0..iters {
        ch.send([src]).expect("send");
        sink.after_send().expect("sink");
    }
}

#[inline(never)]
fn channel_write_loop(
    ch: &mut Channel<Sim, 64, S>,
    src: zverbs::LocalSlice<'_>,
    remote: &zverbs::RemoteRegion,
    iters: u64,
) {
    for _ in 0..iters {
        ch.write([src], remote).expect("write");
    }
}

#[inline(never)]
fn channel_batch_loop(
    ch: &mut Channel<Sim, 64, S>,
    src: zverbs::LocalSlice<'_>,
    remote: &zverbs::RemoteRegion,
    iters: u64,
    batch: usize,
) {
    for _ in 0..iters {
        ch.scope(|s| {
            for _ in 0..batch {
                s.post_write([src], remote)?;
            }
            Ok(())
        })
        .expect("scope");
    }
}

/// The async path: `iters` sends or writes through an `AsyncChannel`, one at a time.
#[cfg(feature = "tokio")]
#[inline(never)]
fn run_async(iters: u64, write: bool) {
    use zverbs::tokio::AsyncChannel;
    let sim = Sim::with_devices(2);
    let ca = Context::open(&sim, "sim0").unwrap();
    let pa = ca.alloc_pd().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let prepared = AsyncChannel::<Sim, zverbs::LocalBuf<Sim>, 64, S>::prepare(
        &ca,
        &pa,
        &ChannelConfig::default(),
    )
    .unwrap();
    let (mut sink, sink_ep, region) = sink(&sim, &prepared.endpoint());
    let ch = prepared.connect(&sink_ep).unwrap();
    let ch = {
        let _in = rt.enter();
        AsyncChannel::new(ch).unwrap()
    };
    let pool = zverbs::MrPool::new(&pa, 1 << 16).unwrap();
    let buf = pool.alloc(MSG).unwrap();
    let remote = region.slice(..MSG as u64).unwrap();
    rt.block_on(async_loop(
        &ch,
        buf,
        (!write).then_some(&mut sink),
        &remote,
        iters,
    ));
}

#[cfg(feature = "tokio")]
#[inline(never)]
async fn async_loop(
    ch: &zverbs::tokio::AsyncChannel<Sim, zverbs::LocalBuf<Sim>, 64, S>,
    mut buf: zverbs::LocalBuf<Sim>,
    mut sink: Option<&mut Sink>,
    remote: &zverbs::RemoteRegion,
    iters: u64,
) {
    for _ in 0..iters {
        let (r, back) = match sink.as_deref_mut() {
            Some(sink) => {
                let out = ch.send(buf).await;
                sink.after_send().expect("sink");
                out
            }
            None => ch.write(buf, remote).await,
        };
        r.expect("async operation");
        buf = back;
    }
}

/// The raw path: `iters` posts (of chains of `batch`) and polls through the provider trait.
#[inline(never)]
fn run_raw(iters: u64, write: bool, batch: usize) {
    let sim = Sim::with_devices(2);
    let ca = Context::open(&sim, "sim0").unwrap();
    let pa = ca.alloc_pd().unwrap();
    let cq = CompletionQueue::create(&ca, 128).unwrap();
    let qp = QueuePair::create(&ca, &pa, &cq, &cq, &caps(64))
        .unwrap()
        .into_init(&InitOptions::default())
        .unwrap();
    let (mut sink, sink_ep, region) = sink(&sim, &qp.endpoint());
    let qp = qp
        .into_rtr(&sink_ep, &RtrOptions::default())
        .unwrap()
        .into_rts(&RtsOptions::default())
        .unwrap();
    let src = pa.register(leak(MSG)).unwrap();
    let op = if write {
        SendOp::Write {
            remote_addr: region.addr,
            rkey: region.rkey,
        }
    } else {
        SendOp::Send
    };
    let mut wr = SendWr::<S>::new(0, op, SendFlags::SIGNALED);
    wr.sg_list[0] = src.slice(..).unwrap().sge();
    wr.num_sge = 1;
    if batch > 1 {
        let mut chain = [wr; 64];
        for (i, w) in chain.iter_mut().enumerate() {
            w.wr_id = i as u64;
            if i + 1 != batch {
                w.flags = SendFlags::empty();
            }
        }
        raw_batch_loop(qp.raw(), cq.raw(), &chain[..batch], iters);
    } else {
        raw_loop(qp.raw(), cq.raw(), wr, (!write).then_some(&mut sink), iters);
    }
}

#[inline(never)]
fn raw_batch_loop(
    qp: &<Sim as Provider>::Qp,
    cq: &<Sim as Provider>::Cq,
    chain: &[SendWr<S>],
    iters: u64,
) {
    let mut wc = [WorkCompletion::EMPTY; 1];
    for _ in 0..iters {
        // SAFETY: the gather entries name a leaked registered buffer that nobody writes.
        unsafe { Sim::post_send(qp, chain) }.expect("post");
        while Sim::poll_cq(cq, &mut wc).expect("poll") == 0 {}
        assert_eq!(wc[0].status, WcStatus::Success);
    }
}

#[inline(never)]
fn raw_loop(
    qp: &<Sim as Provider>::Qp,
    cq: &<Sim as Provider>::Cq,
    mut wr: SendWr<S>,
    mut sink: Option<&mut Sink>,
    iters: u64,
) {
    let mut wc = [WorkCompletion::EMPTY; 1];
    for i in 0..iters {
        wr.wr_id = i;
        // SAFETY: the gather entry names a leaked registered buffer that nobody writes.
        unsafe { Sim::post_send(qp, std::slice::from_ref(&wr)) }.expect("post");
        while Sim::poll_cq(cq, &mut wc).expect("poll") == 0 {}
        assert_eq!(wc[0].status, WcStatus::Success);
        if let Some(s) = sink.as_deref_mut() {
            s.after_send().expect("sink");
        }
    }
}

fn caps(depth: u32) -> QpConfig {
    let mut cfg = QpConfig::default();
    cfg.caps.max_send_wr = depth;
    cfg.caps.max_recv_wr = depth;
    cfg.caps.max_send_sge = S as u32;
    cfg.caps.max_recv_sge = S as u32;
    cfg
}

/// The peer on `sim1`, connected to `peer`: the sink, its endpoint and its region.
fn sink(sim: &Sim, peer: &zverbs::Endpoint) -> (Sink, zverbs::Endpoint, zverbs::RemoteRegion) {
    let sink = PreparedSink::open(sim, "sim1", MSG, MSG).unwrap();
    let ep = sink.endpoint();
    let sink = sink.connect(peer, MSG).unwrap();
    let region = sink.remote();
    (sink, ep, region)
}

/// The instrument of scripts/callgrind.sh: ITERS posts and polls of one path, each loop in
/// a function of its own so that callgrind can collect it alone.
#[derive(clap::Parser)]
#[command(name = "post_poll_loop")]
struct Cli {
    /// Through a Channel (own or shared queues), the provider's raw calls, or (feature
    /// tokio) an awaited AsyncChannel
    #[arg(value_enum)]
    path: PathArg,
    /// The operation (send only one at a time)
    #[arg(value_enum)]
    op: OpArg,
    /// Iterations
    iters: u64,
    /// Work requests per doorbell
    #[arg(default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    batch: usize,
}

/// `PATH`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PathArg {
    Channel,
    Shared,
    Raw,
    Async,
}

/// `OP`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OpArg {
    Send,
    Write,
}

fn main() -> ExitCode {
    let Cli {
        path,
        op,
        iters,
        batch,
    } = clap::Parser::parse();
    let write = match op {
        OpArg::Send if batch == 1 => false,
        OpArg::Write => true,
        OpArg::Send => {
            eprintln!("send only one at a time (BATCH 1)");
            return ExitCode::from(2);
        }
    };
    match path {
        PathArg::Channel => run_channel(iters, write, batch, false),
        PathArg::Shared => run_channel(iters, write, batch, true),
        PathArg::Raw => run_raw(iters, write, batch),
        #[cfg(feature = "tokio")]
        PathArg::Async if batch == 1 => run_async(iters, write),
        PathArg::Async => {
            eprintln!("async needs feature tokio, and BATCH 1");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
