//! Data-path benchmarks over the simulator, each beside its baseline in the same run.
//!
//! ```text
//! cargo bench --features sim --bench data_path             # or `-- pingpong` (a filter), `-- --quick`
//! ```
//!
//! - `post_poll/*`: one signaled work request posted and its completion polled, through
//!   `Channel` (blocking `send` / `write`) and through raw provider calls
//!   (`Provider::post_send` + `Provider::poll_cq` on the queue pair and CQ handles). The
//!   difference is the library's overhead.
//! - `doorbell/*`: batches of 1, 8, 32, 64 RDMA writes posted with one doorbell and
//!   selective signaling (one completion per batch), through a `Channel` scope and raw;
//!   throughput in elements = work requests.
//! - `pingpong_64B/*`: two threads bouncing 64 bytes: over a bare lock-free SPSC ring (the
//!   in-process floor), over the least a software RC SEND moves between two threads
//!   (`rc_floor`: a receive queue, a completion queue and buffers per end, nothing else;
//!   the floor of any simulator that keeps those), and over two simulator `Channel`s. The
//!   figure is the interquartile mean round trip of each sample (see `two_threads`).
//! - `dispatch_sim/threads/{1,2,4}`: a `MultiChannel` on sim0 with 1, 2, 4 peers on its
//!   shared completion queues (the default layout) to as many channels on sim1; each
//!   thread drives its own peer's channel (`channels_mut`) with a blocking signaled 64-byte
//!   `write` per iteration, so the threads route each other's completions through the
//!   lock-free dispatcher. The figure is the time per write completed by all threads
//!   together. This machine has 2 cores: 4 threads are oversubscribed and partly measure
//!   the scheduler, and the 2- and 4-thread figures swing by up to 4× between runs with
//!   where the threads land.
//!
//! Every measured loop runs with its thread's allocations counted (see `common`) and
//! panics if the data path allocated.

mod common;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use zverbs::provider::sim::Sim;
use zverbs::provider::Provider;
use zverbs::qp::{Init, InitOptions, QpConfig, QueuePair, ReadyToSend};
use zverbs::qp::{RtrOptions, RtsOptions};
use zverbs::testing::{PreparedSink, Sink};
use zverbs::{
    AccessFlags, Channel, ChannelConfig, CompletionQueue, Context, LocalSlice, MemoryRegion,
    MultiChannel, ProtectionDomain, SendFlags, SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};

use common::{assert_no_allocs, count_allocs, rc_floor, spsc, timed_no_alloc, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Message size of the latency benches.
const MSG: usize = 64;
/// Gather entries per work request: the `Channel` default; the raw path posts the same
/// `SendWr<S>` so both hand the provider identical requests.
const S: usize = 4;
/// Ring capacity of the channels (the `Channel` default).
const DEPTH: usize = 64;

type Ch = Channel<Sim, DEPTH, S>;

/// A buffer that lives for the whole run, so regions can sit in structs.
fn buffer(len: usize) -> &'static mut [u8] {
    Box::leak(vec![0u8; len].into_boxed_slice())
}

/// An opened device with a protection domain and one completion queue.
struct End {
    ctx: Context<Sim>,
    pd: ProtectionDomain<Sim>,
    cq: CompletionQueue<Sim>,
}

impl End {
    fn open(sim: &Sim, dev: &str, cq_depth: u32) -> End {
        let ctx = Context::open(sim, dev).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = CompletionQueue::create(&ctx, cq_depth).unwrap();
        End { ctx, pd, cq }
    }

    /// A queue pair on this end's CQ, in INIT.
    fn qp(&self, depth: usize) -> QueuePair<Sim, Init> {
        let mut cfg = QpConfig::default();
        cfg.caps.max_send_wr = depth as u32;
        cfg.caps.max_recv_wr = depth as u32;
        cfg.caps.max_send_sge = S as u32;
        cfg.caps.max_recv_sge = S as u32;
        QueuePair::create(&self.ctx, &self.pd, &self.cq, &self.cq, &cfg)
            .unwrap()
            .into_init(&InitOptions::default())
            .unwrap()
    }

    fn register_remote(&self, len: usize) -> MemoryRegion<'static, Sim> {
        // SAFETY: the buffer is leaked (lives forever) and never touched through Rust
        // references: only the device reads and writes it.
        unsafe {
            self.pd
                .register_with_access(buffer(len), AccessFlags::all())
        }
        .unwrap()
    }
}

/// The passive side of every sender bench, on `sim1`: the same sink serves the `Channel`
/// sender and the raw one, so its cost cancels out of their difference.
fn sink(sim: &Sim) -> PreparedSink {
    PreparedSink::open(sim, "sim1", MSG, MSG * 64).unwrap()
}

/// A sender through the library: a `Channel`, connected to a sink.
fn channel_rig(sim: &Sim) -> (Ch, LocalSlice<'static>, Sink) {
    let a = End::open(sim, "sim0", 1);
    let prepared = Ch::prepare(&a.ctx, &a.pd, &ChannelConfig::default()).unwrap();
    let sink = sink(sim);
    let sink_ep = sink.endpoint();
    let sink = sink.connect(&prepared.endpoint(), MSG).unwrap();
    let ch = prepared.connect(&sink_ep).unwrap();
    let src: &'static MemoryRegion<'static, Sim> =
        Box::leak(Box::new(a.pd.register(buffer(MSG)).unwrap()));
    (ch, src.slice(..).unwrap(), sink)
}

/// A sender through raw provider calls: a queue pair in RTS and its CQ.
struct RawSender {
    qp: QueuePair<Sim, ReadyToSend>,
    end: End,
    src: Sge,
    _region: MemoryRegion<'static, Sim>,
}

fn raw_rig(sim: &Sim) -> (RawSender, Sink) {
    let a = End::open(sim, "sim0", 2 * DEPTH as u32);
    let qp = a.qp(DEPTH);
    let sink = sink(sim);
    let sink_ep = sink.endpoint();
    let sink = sink.connect(&qp.endpoint(), MSG).unwrap();
    let qp = qp
        .into_rtr(&sink_ep, &RtrOptions::default())
        .unwrap()
        .into_rts(&RtsOptions::default())
        .unwrap();
    let region = a.pd.register(buffer(MSG)).unwrap();
    let src = region.slice(..).unwrap().sge();
    (
        RawSender {
            qp,
            end: a,
            src,
            _region: region,
        },
        sink,
    )
}

impl RawSender {
    fn wr(&self, op: SendOp, flags: SendFlags) -> SendWr<S> {
        let mut wr = SendWr::<S>::new(0, op, flags);
        wr.sg_list[0] = self.src;
        wr.num_sge = 1;
        wr
    }

    /// Posts `wrs` as one chain and polls until one completion arrives; checks it.
    #[inline]
    fn post_and_poll_one(&self, wrs: &[SendWr<S>]) {
        // SAFETY: the gather entries name the sender's leaked region, which stays valid and
        // is never written through Rust references.
        unsafe { Sim::post_send(self.qp.raw(), wrs) }.unwrap();
        let mut wc = [WorkCompletion::EMPTY; 1];
        while Sim::poll_cq(self.end.cq.raw(), &mut wc).unwrap() == 0 {}
        assert_eq!(wc[0].status, WcStatus::Success);
    }
}

fn post_poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("post_poll");
    g.throughput(Throughput::Elements(1));

    let sim = Sim::with_devices(2);
    let (mut ch, src, mut sink) = channel_rig(&sim);
    let remote = sink.remote().slice(..MSG as u64).unwrap();
    g.bench_function("channel_send_64B", |b| {
        b.iter_custom(|iters| {
            timed_no_alloc("channel send", iters, |n| {
                for _ in 0..n {
                    ch.send([src]).unwrap();
                    sink.after_send().unwrap();
                }
            })
        })
    });
    g.bench_function("channel_write_64B", |b| {
        b.iter_custom(|iters| {
            timed_no_alloc("channel write", iters, |n| {
                for _ in 0..n {
                    ch.write([src], &remote).unwrap();
                }
            })
        })
    });
    drop((ch, sink));

    let sim = Sim::with_devices(2);
    let (raw, mut sink) = raw_rig(&sim);
    let remote = sink.remote();
    let mut send = raw.wr(SendOp::Send, SendFlags::SIGNALED);
    g.bench_function("raw_send_64B", |b| {
        b.iter_custom(|iters| {
            timed_no_alloc("raw send", iters, |n| {
                for i in 0..n {
                    send.wr_id = i;
                    raw.post_and_poll_one(std::slice::from_ref(&send));
                    sink.after_send().unwrap();
                }
            })
        })
    });
    let write = SendOp::Write {
        remote_addr: remote.addr,
        rkey: remote.rkey,
    };
    let mut write = raw.wr(write, SendFlags::SIGNALED);
    g.bench_function("raw_write_64B", |b| {
        b.iter_custom(|iters| {
            timed_no_alloc("raw write", iters, |n| {
                for i in 0..n {
                    write.wr_id = i;
                    raw.post_and_poll_one(std::slice::from_ref(&write));
                }
            })
        })
    });
    g.finish();
}

fn doorbell(c: &mut Criterion) {
    let mut g = c.benchmark_group("doorbell");
    let sim = Sim::with_devices(2);
    let (mut ch, src, sink) = channel_rig(&sim);
    let remote = sink.remote().slice(..MSG as u64).unwrap();
    for batch in [1usize, 8, 32, 64] {
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::new("channel_scope", batch), &batch, |b, &k| {
            b.iter_custom(|iters| {
                timed_no_alloc("channel scope batch", iters, |n| {
                    for _ in 0..n {
                        ch.scope(|s| {
                            for _ in 0..k {
                                s.post_write([src], &remote)?;
                            }
                            Ok(())
                        })
                        .unwrap();
                    }
                })
            })
        });
    }
    drop((ch, sink));

    let sim = Sim::with_devices(2);
    let (raw, sink) = raw_rig(&sim);
    let remote = sink.remote();
    let op = SendOp::Write {
        remote_addr: remote.addr,
        rkey: remote.rkey,
    };
    let mut chain = [raw.wr(op, SendFlags::empty()); DEPTH];
    for batch in [1usize, 8, 32, 64] {
        g.throughput(Throughput::Elements(batch as u64));
        for (i, wr) in chain.iter_mut().enumerate() {
            wr.wr_id = i as u64;
            wr.flags = if i + 1 == batch {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
        }
        g.bench_with_input(BenchmarkId::new("raw", batch), &batch, |b, &k| {
            b.iter_custom(|iters| {
                timed_no_alloc("raw batch", iters, |n| {
                    for _ in 0..n {
                        raw.post_and_poll_one(&chain[..k]);
                    }
                })
            })
        });
    }
    g.finish();
}

/// Runs `iters` round trips: `ping` on this thread, `pong` on a scoped thread; both loops
/// run with allocations counted. `ping` calls its `tick` after each round trip.
///
/// Returns `iters` × the **interquartile mean** round trip of the sample (the mean of the
/// middle half), not the total time: on this shared 2-core machine a round trip in which
/// either thread was descheduled costs a time slice, and a handful of those would dominate
/// a mean. Dropping the outer quarters keeps the figure about the code (both ping-pongs are
/// measured the same way, so their ratio stays fair).
fn two_threads<A, B>(what: &str, iters: u64, ping: A, pong: B) -> Duration
where
    A: FnOnce(u64, &mut dyn FnMut()),
    B: FnOnce(u64) + Send,
{
    let mut rtts = vec![0u64; iters as usize];
    let start = Barrier::new(2);
    std::thread::scope(|t| {
        let echo = t.spawn(|| {
            start.wait();
            count_allocs(|| pong(iters)).1
        });
        start.wait();
        let (_, allocs) = count_allocs(|| {
            let mut slots = rtts.iter_mut();
            let mut last = Instant::now();
            let mut tick = || {
                let now = Instant::now();
                if let Some(s) = slots.next() {
                    *s = (now - last).as_nanos() as u64;
                }
                last = now;
            };
            ping(iters, &mut tick);
        });
        assert_no_allocs(what, allocs);
        assert_no_allocs(what, echo.join().expect("echo thread panicked"));
    });
    // The interquartile mean: robust to a descheduled round trip like the median, but not
    // quantized to the clock's tick (a run of identical medians has zero variance, which
    // criterion's statistics reject).
    rtts.sort_unstable();
    let mid = &rtts[rtts.len() / 4..(rtts.len() * 3).div_ceil(4)];
    let mean = mid.iter().sum::<u64>() as f64 / mid.len().max(1) as f64;
    Duration::from_secs_f64(mean * 1e-9 * iters as f64)
}

fn pingpong(c: &mut Criterion) {
    let mut g = c.benchmark_group("pingpong_64B");
    g.throughput(Throughput::Elements(1));

    let (ab, ba) = (spsc::Ring::<MSG>::new(), spsc::Ring::<MSG>::new());
    g.bench_function("spsc_ring", |b| {
        b.iter_custom(|iters| {
            two_threads(
                "spsc",
                iters,
                |n, tick| {
                    let (msg, mut back) = ([0xA5u8; MSG], [0u8; MSG]);
                    for _ in 0..n {
                        ab.push(&msg);
                        ba.pop(&mut back);
                        tick();
                    }
                    assert_eq!(back, msg);
                },
                |n| {
                    let mut buf = [0u8; MSG];
                    for _ in 0..n {
                        ab.pop(&mut buf);
                        ba.push(&buf);
                    }
                },
            )
        })
    });

    // The least an RC SEND between two threads moves (`common/rc_floor.rs`): what is
    // left of `sim_channel` once the simulator's work is gone.
    g.bench_function("rc_floor", |b| {
        b.iter_custom(|iters| {
            let (ea, eb) = (rc_floor::End::<MSG>::new(), rc_floor::End::<MSG>::new());
            two_threads(
                "rc floor",
                iters,
                |n, tick| {
                    let (mut own, mut to_b) = (rc_floor::Owner::default(), Default::default());
                    let (msg, mut back) = ([0xA5u8; MSG], [0u8; MSG]);
                    ea.post_recv(&mut own);
                    for _ in 0..n {
                        eb.send(&mut to_b, &msg);
                        ea.wait(&mut own, &mut back);
                        ea.post_recv(&mut own);
                        tick();
                    }
                    assert_eq!(back, msg);
                },
                |n| {
                    let (mut own, mut to_a) = (rc_floor::Owner::default(), Default::default());
                    let mut got = [0u8; MSG];
                    eb.post_recv(&mut own);
                    for _ in 0..n {
                        eb.wait(&mut own, &mut got);
                        ea.send(&mut to_a, &got);
                        eb.post_recv(&mut own);
                    }
                },
            )
        })
    });

    let sim = Sim::with_devices(2);
    let (ca, cb) = (End::open(&sim, "sim0", 1), End::open(&sim, "sim1", 1));
    let cfg = ChannelConfig::default();
    let a = Ch::prepare(&ca.ctx, &ca.pd, &cfg).unwrap();
    let b = Ch::prepare(&cb.ctx, &cb.pd, &cfg).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (mut a, mut b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    let mut a_out = ca.pd.register(buffer(MSG)).unwrap();
    let mut a_in = ca.pd.register(buffer(2 * MSG)).unwrap();
    let mut b_buf = cb.pd.register(buffer(2 * MSG)).unwrap();
    a_out.as_mut_slice().fill(0xA5);
    let a_src = a_out.slice(..).unwrap();
    // Each side receives into two halves in turn, and keeps a receive posted ahead on the
    // half it is not using, as a latency-critical application (and perftest) pre-posts its
    // receives: reposting happens off the critical path, after the message it answers.
    let halves = |r: &mut MemoryRegion<Sim>| {
        let (lo, hi) = r.slice_mut(..).unwrap().split_at(MSG).unwrap();
        [lo.sge(), hi.sge()]
    };
    let (a_halves, b_halves) = (halves(&mut a_in), halves(&mut b_buf));
    // The receives posted ahead, carried from one sample to the next (those posted last in
    // a sample take the first messages of the next).
    let mut ping_state: Option<(zverbs::Pending, usize)> = None;
    let mut echo_state: Option<([Option<zverbs::Pending>; 2], usize)> = None;

    g.bench_function("sim_channel", |bch| {
        bch.iter_custom(|iters| {
            let (ping_state, echo_state) = (&mut ping_state, &mut echo_state);
            two_threads(
                "sim channel ping-pong",
                iters,
                |n, tick| {
                    // SAFETY (every receive below): its half is written by the device only
                    // until the receive is redeemed, and read by nobody.
                    let (mut r, mut half) = ping_state.take().unwrap_or_else(|| {
                        let r = unsafe { a.post_receive_unpolled(&a_halves[..1]) }.unwrap();
                        (r, 0)
                    });
                    for _ in 0..n {
                        a.send([a_src]).unwrap();
                        // The other half's last receive was redeemed in the round before.
                        let next = half ^ 1;
                        let ahead =
                            unsafe { a.post_receive_unpolled(&a_halves[next..next + 1]) }.unwrap();
                        a.wait(r).unwrap();
                        tick();
                        (r, half) = (ahead, next);
                    }
                    *ping_state = Some((r, half));
                },
                |n| {
                    // SAFETY (every receive below): as on the ping side.
                    let (mut rs, mut half) = echo_state.take().unwrap_or_else(|| {
                        let mut post = |h: usize| {
                            Some(unsafe { b.post_receive_unpolled(&b_halves[h..h + 1]) }.unwrap())
                        };
                        ([post(0), post(1)], 0)
                    });
                    for _ in 0..n {
                        let got = b.wait(rs[half].take().unwrap()).unwrap();
                        debug_assert_eq!(got.byte_len as usize, MSG);
                        // SAFETY: the received half is only read by the device, and is not
                        // reused before this send completed (waited for right here).
                        let p = unsafe {
                            b.post_send_unpolled(
                                &b_halves[half..half + 1],
                                SendOp::Send,
                                SendFlags::empty(),
                            )
                        }
                        .unwrap();
                        b.wait(p).unwrap();
                        rs[half] = Some(
                            unsafe { b.post_receive_unpolled(&b_halves[half..half + 1]) }.unwrap(),
                        );
                        half ^= 1;
                    }
                    *echo_state = Some((rs, half));
                },
            )
        })
    });
    g.finish();
}

/// Peer capacity of the `dispatch_sim` multi-channel (1, 2 or 4 peers are set up).
const PEERS: usize = 4;

fn dispatch_sim(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch_sim");
    g.throughput(Throughput::Elements(1));
    for threads in [1usize, 2, 4] {
        // sim0: a multi-channel to `threads` peers on one shared send and one shared
        // receive completion queue (the default layout); sim1: a plain channel per peer.
        let sim = Sim::with_devices(2);
        let (a, b) = (End::open(&sim, "sim0", 1), End::open(&sim, "sim1", 1));
        let cfg = ChannelConfig::default();
        let root =
            MultiChannel::<Sim, PEERS, DEPTH, S>::prepare(&a.ctx, &a.pd, 0..threads, &cfg).unwrap();
        let leaves: Vec<_> = (0..threads)
            .map(|_| Ch::prepare(&b.ctx, &b.pd, &cfg).unwrap())
            .collect();
        let leaf_eps: Vec<_> = leaves.iter().map(|l| l.endpoint()).collect();
        let root_eps: Vec<_> = (0..threads).map(|p| root.endpoint(p).unwrap()).collect();
        let mut root = root.connect(|p| leaf_eps.get(p).copied()).unwrap();
        let _leaves: Vec<_> = leaves
            .into_iter()
            .zip(&root_eps)
            .map(|(l, e)| l.connect(e).unwrap())
            .collect();
        assert!(root
            .channels_mut()
            .all(|(_, ch)| ch.shares_completion_queues()));
        let target = b.register_remote(MSG * PEERS);
        let remote = target.remote();
        let src = a.pd.register(buffer(MSG)).unwrap();
        let src = src.slice(..).unwrap();
        g.bench_with_input(BenchmarkId::new("threads", threads), &threads, |bch, &w| {
            bch.iter_custom(|iters| {
                let per = iters.div_ceil(w as u64);
                let start = Barrier::new(w);
                let slowest = std::thread::scope(|t| {
                    let hs: Vec<_> = root
                        .channels_mut()
                        .map(|(peer, ch)| {
                            let start = &start;
                            // Each peer writes its own part of the target.
                            let at = (peer * MSG) as u64;
                            let dst = remote.slice(at..at + MSG as u64).unwrap();
                            t.spawn(move || {
                                start.wait();
                                timed_no_alloc("dispatch_sim thread", per, |n| {
                                    for _ in 0..n {
                                        ch.write([src], &dst).unwrap();
                                    }
                                })
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("dispatch_sim thread panicked"))
                        .max()
                        .unwrap_or_default()
                });
                // Time per completion delivered (`per * w` were).
                slowest.mul_f64(iters as f64 / (per * w as u64) as f64)
            })
        });
        assert!(root.channels_mut().all(|(_, ch)| ch.in_flight() == (0, 0)));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = post_poll, doorbell, pingpong, dispatch_sim
}
criterion_main!(benches);
