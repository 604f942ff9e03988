//! The completion engine's cost on a two-thread ping-pong of 64 B over the (untimed)
//! simulator, every variant in one run so the ratios are fair:
//!
//! ```text
//! cargo bench --features sim --bench completion          # add `-- --quick` for a rougher run
//! ```
//!
//! - `pingpong_64B/own_cqs/{spin_yield,spin}`: each channel on completion queues of its own
//!   (the layout before shared queues; `spin_yield` is the default policy);
//! - `pingpong_64B/shared_cqs/spin`: each channel's sends on one `SharedCompletionQueue`
//!   and its receives on another (as a `MultiChannel` lays them out), through the
//!   dispatcher;
//! - `pingpong_64B/{own,shared}_cqs/sleep`: `WaitPolicy::SpinSleep`, the event-driven round
//!   trip (after 128 empty polls a waiter arms its queue, polls again and sleeps on the
//!   completion channel).
//! - With `--features sim,tokio`: `pingpong_64B/async/*` (the same round trip through
//!   `AsyncChannel`), `pingpong_64B/async_shared/*` (one side's channel on an
//!   `AsyncQueue`), `write_64B/*` and `send_64B/*` (message rates, blocking against
//!   async, on one thread).
//!
//! Criterion runs the variants one after another, and this machine drifts between a fast
//! and a ~3× slower mode over seconds, so a ratio of two criterion figures can be off by
//! more than the difference measured. For the layout ratio that matters (shared against
//! own queues, spin policy) set `INTERLEAVED=<rounds>`: the bench then alternates blocks of
//! 100,000 round trips on the two layouts (own first, then shared, `rounds` times) and
//! prints each layout's median, the median of the per-round ratios, and the ratio over the
//! rounds where both blocks ran in the fast mode:
//!
//! ```text
//! INTERLEAVED=30 cargo bench --features sim --bench completion
//! ```
//!
//! One iteration is one round trip: A posts its receive, sends, and waits for the echo; B
//! waits for the message, posts its next receive, then echoes (so no message ever meets a
//! missing receive). Both threads run with their allocations counted and panic if a round
//! trip allocated. This machine has 2 cores: one per thread.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use zverbs::dispatch::SharedCompletionQueue;
use zverbs::provider::sim::Sim;
use zverbs::{Channel, ChannelConfig, Context, MemoryRegion, SendFlags, SendOp, WaitPolicy};

use common::{assert_no_allocs, count_allocs, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const MSG: usize = 64;
type Ch = Channel<Sim, 16, 1>;

/// A buffer that lives for the whole run, so regions can be `'static`.
/// Page-aligned, so the two sides' buffers never share a cache line, whatever else was
/// allocated between them (the layouts allocate differently; without this the placement
/// moved the shared/own ratio by ±10 %).
fn buffer(len: usize) -> &'static mut [u8] {
    let whole = Box::leak(vec![0u8; len + 8192].into_boxed_slice());
    let skip = whole.as_ptr().align_offset(4096);
    &mut whole[skip..skip + len]
}

struct Side {
    ch: Ch,
    buf: MemoryRegion<'static, Sim>,
    /// The receive posted ahead (B only, between iterations).
    ahead: Option<zverbs::Pending>,
}

/// Two connected channels on sim0 and sim1, on queues of their own or shared ones.
fn pair(shared: bool, wait: WaitPolicy) -> (Side, Side) {
    let sim = Sim::with_devices(2);
    let cfg = ChannelConfig {
        wait,
        ..ChannelConfig::default()
    };
    let side = |dev: &str| {
        let ctx = Box::leak(Box::new(Context::open(&sim, dev).unwrap()));
        let pd = Box::leak(Box::new(ctx.alloc_pd().unwrap()));
        let ch = if shared {
            let make = if wait == WaitPolicy::SpinSleep {
                SharedCompletionQueue::create_with_events
            } else {
                SharedCompletionQueue::create
            };
            // One send and one receive queue, as a MultiChannel lays them out.
            let send = Arc::new(make(ctx, 1, 16).unwrap());
            let recv = Arc::new(make(ctx, 1, 16).unwrap());
            Ch::prepare_shared(ctx, pd, &cfg, &send, &recv).unwrap()
        } else {
            Ch::prepare(ctx, pd, &cfg).unwrap()
        };
        let buf = pd.register(buffer(MSG)).unwrap();
        (ch, buf)
    };
    let ((a, abuf), (b, bbuf)) = (side("sim0"), side("sim1"));
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    (
        Side {
            ch: a,
            buf: abuf,
            ahead: None,
        },
        Side {
            ch: b,
            buf: bbuf,
            ahead: None,
        },
    )
}

/// `iters` round trips; returns A's time for them.
fn round_trips(a: &mut Side, b: &mut Side, iters: u64) -> Duration {
    let start = Barrier::new(2);
    std::thread::scope(|t| {
        let echo = t.spawn(|| {
            start.wait();
            let ((), allocs) = count_allocs(|| {
                let sge = b.buf.slice_mut(..).unwrap().sge();
                for _ in 0..iters {
                    let got = match b.ahead.take() {
                        Some(p) => p,
                        // SAFETY: the buffer is leaked and touched only by the device.
                        None => unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap(),
                    };
                    b.ch.wait(got).unwrap();
                    // SAFETY: as above; the next message lands after the echo below.
                    b.ahead = Some(unsafe { b.ch.post_receive_unpolled(&[sge]) }.unwrap());
                    // SAFETY: as above.
                    let echo = unsafe {
                        b.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
                    };
                    b.ch.wait(echo.unwrap()).unwrap();
                }
            });
            allocs
        });
        start.wait();
        let (elapsed, allocs) = count_allocs(|| {
            let sge = a.buf.slice_mut(..).unwrap().sge();
            let t0 = Instant::now();
            for _ in 0..iters {
                // SAFETY: the buffer is leaked and touched only by the device.
                let reply = unsafe { a.ch.post_receive_unpolled(&[sge]) }.unwrap();
                // SAFETY: as above.
                let sent = unsafe {
                    a.ch.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
                };
                a.ch.wait(sent.unwrap()).unwrap();
                a.ch.wait(reply).unwrap();
            }
            t0.elapsed()
        });
        assert_no_allocs("ping", allocs);
        assert_no_allocs("echo", echo.join().expect("echo thread panicked"));
        elapsed
    })
}

fn pingpong(c: &mut Criterion) {
    let mut g = c.benchmark_group("pingpong_64B");
    g.throughput(Throughput::Elements(1));
    let variants = [
        ("own_cqs", "spin_yield", false, WaitPolicy::SpinYield),
        ("own_cqs", "spin", false, WaitPolicy::Spin),
        ("shared_cqs", "spin", true, WaitPolicy::Spin),
        ("own_cqs", "sleep", false, WaitPolicy::SpinSleep),
        ("shared_cqs", "sleep", true, WaitPolicy::SpinSleep),
    ];
    for (layout, policy, shared, wait) in variants {
        let (mut a, mut b) = pair(shared, wait);
        g.bench_function(BenchmarkId::new(layout, policy), |bch| {
            bch.iter_custom(|iters| round_trips(&mut a, &mut b, iters))
        });
    }
    g.finish();
}

/// The async channel (`zverbs::tokio`, feature `tokio`) on the same ping-pong: each side a
/// current-thread runtime on its own thread (its reactor task with it), so the counting
/// allocator sees every allocation of a side, reactor included.
#[cfg(feature = "tokio")]
mod async_pingpong {
    use super::*;
    use tokio::runtime::Runtime;
    use zverbs::tokio::{AsyncChannel, AsyncQueue};
    use zverbs::{LocalBuf, MrPool};

    type ACh = AsyncChannel<Sim, LocalBuf<Sim>, 16, 1>;

    /// The first byte of the message that ends the echo.
    const STOP: u8 = 0xff;

    /// A's side, and B's echo running on its own thread until [`Ping::stop`].
    pub struct Ping {
        rt: Runtime,
        ch: ACh,
        /// The message and the inbox.
        bufs: Option<(LocalBuf<Sim>, LocalBuf<Sim>)>,
        echo: Option<std::thread::JoinHandle<u64>>,
    }

    fn runtime() -> Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// With `shared`, A's channel is on one shared queue ([`AsyncQueue`], both
    /// directions); else on queues of its own.
    pub fn pair(wait: WaitPolicy, shared: bool) -> Ping {
        let sim = Sim::with_devices(2);
        let cfg = ChannelConfig {
            wait,
            ..ChannelConfig::default()
        };
        let (rt_a, rt_b) = (runtime(), runtime());
        let prep = |dev: &str, rt: &Runtime, shared: bool| {
            let ctx = Box::leak(Box::new(Context::open(&sim, dev).unwrap()));
            let pd = Box::leak(Box::new(ctx.alloc_pd().unwrap()));
            let pool = MrPool::new(pd, 1 << 16).unwrap();
            let bufs = (pool.alloc(MSG).unwrap(), pool.alloc(MSG).unwrap());
            let ch = if shared {
                let _in = rt.enter();
                let q = AsyncQueue::create(ctx, 2, 16).unwrap();
                ACh::prepare_shared(ctx, pd, &cfg, &q, &q).unwrap()
            } else {
                ACh::prepare(ctx, pd, &cfg).unwrap()
            };
            (ch, bufs)
        };
        let ((a, abufs), (b, bbufs)) = (prep("sim0", &rt_a, shared), prep("sim1", &rt_b, false));
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
        let a = {
            let _in = rt_a.enter();
            ACh::new(a).unwrap()
        };
        let b = {
            let _in = rt_b.enter();
            ACh::new(b).unwrap()
        };
        // B: echoes each message after posting the next receive (one `join!`, polled in
        // that order, so a message never meets a missing receive), until the stop message.
        let echo = std::thread::spawn(move || {
            let (first, mut spare) = bbufs;
            let ((), allocs) = count_allocs(|| {
                rt_b.block_on(async {
                    let (r, mut got) = b.receive(first).await;
                    r.unwrap();
                    while got[0] != STOP {
                        let ((r, next), (s, sent)) = tokio::join!(b.receive(spare), b.send(got));
                        s.unwrap();
                        r.unwrap();
                        (got, spare) = (next, sent);
                    }
                })
            });
            allocs
        });
        Ping {
            rt: rt_a,
            ch: a,
            bufs: Some(abufs),
            echo: Some(echo),
        }
    }

    impl Ping {
        /// `iters` round trips: post the receive and send (one `join!`), both finished.
        pub fn round_trips(&mut self, iters: u64) -> Duration {
            let (msg, inbox) = self.bufs.take().unwrap();
            let ch = &self.ch;
            let ((elapsed, bufs), allocs) = count_allocs(|| {
                self.rt.block_on(async move {
                    let (mut msg, mut inbox) = (msg, inbox);
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        let ((r, back), (s, sent)) = tokio::join!(ch.receive(inbox), ch.send(msg));
                        s.unwrap();
                        r.unwrap();
                        (inbox, msg) = (back, sent);
                    }
                    (t0.elapsed(), (msg, inbox))
                })
            });
            self.bufs = Some(bufs);
            assert_no_allocs("async ping", allocs);
            elapsed
        }

        /// Ends the echo; checks it never allocated.
        pub fn stop(mut self) {
            let (mut msg, _) = self.bufs.take().unwrap();
            msg[0] = STOP;
            let ch = &self.ch;
            self.rt
                .block_on(async move { ch.send(msg).await.0.unwrap() });
            let allocs = self.echo.take().unwrap().join().expect("echo panicked");
            assert_no_allocs("async echo", allocs);
        }
    }
}

/// A context and its protection domain, leaked so that regions and channels can be
/// `'static`.
#[cfg(feature = "tokio")]
type Device = (
    &'static Context<Sim>,
    &'static zverbs::ProtectionDomain<Sim>,
);

/// A [`Device`] on each of two simulated devices of one fabric.
#[cfg(feature = "tokio")]
fn two_devices() -> (Device, Device) {
    let sim = Sim::with_devices(2);
    let open = |dev: &str| {
        let ctx: &'static _ = Box::leak(Box::new(Context::open(&sim, dev).unwrap()));
        let pd: &'static _ = Box::leak(Box::new(ctx.alloc_pd().unwrap()));
        (ctx, pd)
    };
    (open("sim0"), open("sim1"))
}

/// RDMA writes of 64 B, one at a time, on one thread: the blocking `Channel::write`
/// against `AsyncChannel::write` on a current-thread runtime (the simulator completes a
/// write inside its post, so this is the software cost per operation).
#[cfg(feature = "tokio")]
fn write_rate(c: &mut Criterion) {
    use common::timed_no_alloc;
    use zverbs::tokio::AsyncChannel;
    use zverbs::{AccessFlags, LocalBuf, MrPool};
    let cfg = ChannelConfig::default();
    let ((ca, pa), (cb, pb)) = two_devices();
    let target = buffer(4096);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    // SAFETY: the buffer is leaked and never read.
    let target = unsafe { pb.register_with_access(target, access) }.unwrap();
    let remote = target.remote().slice(..MSG as u64).unwrap();
    let mut g = c.benchmark_group("write_64B");
    g.throughput(Throughput::Elements(1));
    {
        let a = Ch::prepare(ca, pa, &cfg).unwrap();
        let b = Ch::prepare(cb, pb, &cfg).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (mut a, _b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
        let src = pa.register(buffer(MSG)).unwrap();
        g.bench_function("blocking", |bch| {
            bch.iter_custom(|iters| {
                timed_no_alloc("blocking write", iters, |n| {
                    for _ in 0..n {
                        a.write([src.slice(..).unwrap()], &remote).unwrap();
                    }
                })
            })
        });
    }
    {
        type ACh = AsyncChannel<Sim, LocalBuf<Sim>, 16, 1>;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let a = ACh::prepare(ca, pa, &cfg).unwrap();
        let b = Ch::prepare(cb, pb, &cfg).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (a, _b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
        let a = {
            let _in = rt.enter();
            ACh::new(a).unwrap()
        };
        let pool = MrPool::new(pa, 1 << 16).unwrap();
        let mut src = Some(pool.alloc(MSG).unwrap());
        g.bench_function("async", |bch| {
            bch.iter_custom(|iters| {
                timed_no_alloc("async write", iters, |n| {
                    let mut buf = src.take().unwrap();
                    buf = rt.block_on(async {
                        for _ in 0..n {
                            let (r, back) = a.write(buf, &remote).await;
                            r.unwrap();
                            buf = back;
                        }
                        buf
                    });
                    src = Some(buf);
                })
            })
        });
        // Four writes in flight at once from one task (`join!`: no allocation), the
        // message rate of a pipelined async writer.
        let mut four = Some([(); 4].map(|()| pool.alloc(MSG).unwrap()));
        g.throughput(Throughput::Elements(4));
        g.bench_function("async_x4", |bch| {
            bch.iter_custom(|iters| {
                timed_no_alloc("async write x4", iters, |n| {
                    let [b0, b1, b2, b3] = four.take().unwrap();
                    let bufs = rt.block_on(async {
                        let (mut b0, mut b1, mut b2, mut b3) = (b0, b1, b2, b3);
                        for _ in 0..n {
                            let (r0, r1, r2, r3) = tokio::join!(
                                a.write(b0, &remote),
                                a.write(b1, &remote),
                                a.write(b2, &remote),
                                a.write(b3, &remote)
                            );
                            for r in [&r0.0, &r1.0, &r2.0, &r3.0] {
                                r.as_ref().unwrap();
                            }
                            (b0, b1, b2, b3) = (r0.1, r1.1, r2.1, r3.1);
                        }
                        [b0, b1, b2, b3]
                    });
                    four = Some(bufs);
                })
            })
        });
    }
    g.finish();
}

#[cfg(not(feature = "tokio"))]
fn write_rate(_: &mut Criterion) {}

/// The message rate of two-sided sends, 64 B in windows of 4: both channels on
/// one thread, the receiver's receives posted first, then the sends, then
/// every completion reaped. `blocking` posts with `Channel::post_*_unpolled` and waits on
/// each `Pending`; `async` is one `join!` of the same eight operations on a current-thread
/// runtime (both channels on it). One element is one message, both ends' work included.
#[cfg(feature = "tokio")]
fn send_rate(c: &mut Criterion) {
    use common::timed_no_alloc;
    /// Messages in flight per window.
    const WINDOW: usize = 4;
    use zverbs::tokio::AsyncChannel;
    use zverbs::{LocalBuf, MrPool};
    type ACh = AsyncChannel<Sim, LocalBuf<Sim>, 16, 1>;
    let cfg = ChannelConfig::default();
    let ((ca, pa), (cb, pb)) = two_devices();
    let mut g = c.benchmark_group("send_64B");
    g.throughput(Throughput::Elements(WINDOW as u64));
    {
        let a = Ch::prepare(ca, pa, &cfg).unwrap();
        let b = Ch::prepare(cb, pb, &cfg).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (mut a, mut b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
        let src = pa.register(buffer(MSG)).unwrap();
        let mut dst = pb.register(buffer(MSG * WINDOW)).unwrap();
        let sge = src.slice(..).unwrap().sge();
        let slots: [_; WINDOW] =
            core::array::from_fn(|i| dst.slice_mut(i * MSG..(i + 1) * MSG).unwrap().sge());
        g.bench_function("blocking", |bch| {
            bch.iter_custom(|iters| {
                timed_no_alloc("blocking send window", iters, |n| {
                    for _ in 0..n {
                        // SAFETY: both buffers are leaked and only the device touches
                        // them; each receive has a slot of its own.
                        let recvs = slots.map(|s| unsafe { b.post_receive_unpolled(&[s]) });
                        let sends = slots.map(|_| {
                            // SAFETY: as above.
                            unsafe {
                                a.post_send_unpolled(&[sge], SendOp::Send, SendFlags::empty())
                            }
                        });
                        for p in sends {
                            a.wait(p.unwrap()).unwrap();
                        }
                        for p in recvs {
                            b.wait(p.unwrap()).unwrap();
                        }
                    }
                })
            })
        });
    }
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let a = ACh::prepare(ca, pa, &cfg).unwrap();
        let b = ACh::prepare(cb, pb, &cfg).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
        let (a, b) = {
            let _in = rt.enter();
            (ACh::new(a).unwrap(), ACh::new(b).unwrap())
        };
        let (pool_a, pool_b) = (
            MrPool::new(pa, 1 << 16).unwrap(),
            MrPool::new(pb, 1 << 16).unwrap(),
        );
        let mut bufs = Some((
            [(); WINDOW].map(|()| pool_a.alloc(MSG).unwrap()),
            [(); WINDOW].map(|()| pool_b.alloc(MSG).unwrap()),
        ));
        g.bench_function("async", |bch| {
            bch.iter_custom(|iters| {
                timed_no_alloc("async send window", iters, |n| {
                    let ([s0, s1, s2, s3], [r0, r1, r2, r3]) = bufs.take().unwrap();
                    bufs = Some(rt.block_on(async {
                        let (mut s, mut r) = ((s0, s1, s2, s3), (r0, r1, r2, r3));
                        for _ in 0..n {
                            // Polled in order: the receives are posted before the sends.
                            let (g0, g1, g2, g3, t0, t1, t2, t3) = tokio::join!(
                                b.receive(r.0),
                                b.receive(r.1),
                                b.receive(r.2),
                                b.receive(r.3),
                                a.send(s.0),
                                a.send(s.1),
                                a.send(s.2),
                                a.send(s.3)
                            );
                            for (res, _) in [&g0, &g1, &g2, &g3] {
                                res.as_ref().unwrap();
                            }
                            for (res, _) in [&t0, &t1, &t2, &t3] {
                                res.as_ref().unwrap();
                            }
                            r = (g0.1, g1.1, g2.1, g3.1);
                            s = (t0.1, t1.1, t2.1, t3.1);
                        }
                        ([s.0, s.1, s.2, s.3], [r.0, r.1, r.2, r.3])
                    }));
                })
            })
        });
    }
    g.finish();
}

#[cfg(not(feature = "tokio"))]
fn send_rate(_: &mut Criterion) {}

#[cfg(feature = "tokio")]
fn async_pingpong(c: &mut Criterion) {
    let mut g = c.benchmark_group("pingpong_64B");
    g.throughput(Throughput::Elements(1));
    for (policy, wait) in [
        ("spin", WaitPolicy::Spin),
        ("events", WaitPolicy::SpinYield),
    ] {
        let mut ping = async_pingpong::pair(wait, false);
        g.bench_function(BenchmarkId::new("async", policy), |bch| {
            bch.iter_custom(|iters| ping.round_trips(iters))
        });
        ping.stop();
        let mut ping = async_pingpong::pair(wait, true);
        g.bench_function(BenchmarkId::new("async_shared", policy), |bch| {
            bch.iter_custom(|iters| ping.round_trips(iters))
        });
        ping.stop();
    }
    g.finish();
}

#[cfg(not(feature = "tokio"))]
fn async_pingpong(_: &mut Criterion) {
    eprintln!("pingpong_64B/async/*: build with --features sim,tokio");
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = pingpong, async_pingpong, write_rate, send_rate
}
fn main() {
    match std::env::var("INTERLEAVED")
        .ok()
        .and_then(|r| r.parse().ok())
    {
        Some(rounds) => interleaved(rounds),
        None => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}

/// Alternating blocks of round trips: own against shared queues (spin policy), and with
/// `tokio`, the blocking channel against the async one (default policy, spin-yield).
fn interleaved(rounds: usize) {
    let (mut oa, mut ob) = pair(false, WaitPolicy::Spin);
    let (mut sa, mut sb) = pair(true, WaitPolicy::Spin);
    compare(
        rounds,
        "pingpong_64B spin: own_cqs against shared_cqs",
        ("own_cqs", &mut |n| round_trips(&mut oa, &mut ob, n)),
        ("shared_cqs", &mut |n| round_trips(&mut sa, &mut sb, n)),
    );
    #[cfg(feature = "tokio")]
    {
        let (mut ba, mut bb) = pair(false, WaitPolicy::SpinYield);
        let mut ping = async_pingpong::pair(WaitPolicy::SpinYield, false);
        compare(
            rounds,
            "pingpong_64B spin_yield: blocking Channel against AsyncChannel",
            ("blocking", &mut |n| round_trips(&mut ba, &mut bb, n)),
            ("async", &mut |n| ping.round_trips(n)),
        );
        let mut shared = async_pingpong::pair(WaitPolicy::SpinYield, true);
        compare(
            rounds,
            "pingpong_64B spin_yield: AsyncChannel on own queues against on an AsyncQueue",
            ("async", &mut |n| ping.round_trips(n)),
            ("async_shared", &mut |n| shared.round_trips(n)),
        );
        ping.stop();
        shared.stop();
    }
}

/// A round trip bench: `n` round trips, their time.
type Trips<'a> = &'a mut dyn FnMut(u64) -> Duration;

/// Alternates blocks of 100,000 round trips of `base` and `other`, `rounds` times; prints
/// each one's median and fastest block, the median of the per-round ratios, and that
/// median over the rounds where both ran in the host's fast mode (within 1.5× of their
/// fastest block).
fn compare(rounds: usize, title: &str, base: (&str, Trips<'_>), other: (&str, Trips<'_>)) {
    const BLOCK: u64 = 100_000;
    let per_op = |d: Duration| d.as_nanos() as f64 / BLOCK as f64;
    let (base_name, base_run) = base;
    let (other_name, other_run) = other;
    let blocks: Vec<(f64, f64)> = (0..rounds.max(1))
        .map(|_| (per_op(base_run(BLOCK)), per_op(other_run(BLOCK))))
        .collect();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let fastest = |f: fn(&(f64, f64)) -> f64| blocks.iter().map(f).fold(f64::MAX, f64::min);
    let (base_min, other_min) = (fastest(|b| b.0), fastest(|b| b.1));
    let fast: Vec<f64> = blocks
        .iter()
        .filter(|b| b.0 < 1.5 * base_min && b.1 < 1.5 * other_min)
        .map(|b| b.1 / b.0)
        .collect();
    println!("{title}, {rounds} rounds of {BLOCK} round trips each");
    for (name, v, min) in [
        (
            base_name,
            median(blocks.iter().map(|b| b.0).collect()),
            base_min,
        ),
        (
            other_name,
            median(blocks.iter().map(|b| b.1).collect()),
            other_min,
        ),
    ] {
        println!("  {name:<12} median {v:7.1} ns  fastest {min:7.1} ns");
    }
    let ratio = median(blocks.iter().map(|b| b.1 / b.0).collect());
    println!("  {other_name}/{base_name} median of per-round ratios {ratio:.3}");
    if !fast.is_empty() {
        let n = fast.len();
        println!(
            "  {other_name}/{base_name} over the {n} fast-mode rounds {:.3}",
            median(fast)
        );
    }
}
