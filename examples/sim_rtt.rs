//! The simulator ping-pong of `benches/data_path.rs` (`pingpong_64B/sim_channel`) on ONE
//! thread: both sides' calls in the order a round trip makes them, so the figure is the
//! software cost of a round trip without any cross-core traffic.
//!
//! ```text
//! cargo run --release --features sim --example sim_rtt [-- ROUND_TRIPS]
//! ```
//!
//! With `--features sim,tokio` and a second argument `async`, the same round trip through
//! two `AsyncChannel`s on one current-thread runtime, in the order of the async ping-pong
//! bench (`pingpong_64B/async/*`): what the async layer adds to a round trip's software.
//!
//! With `threads`, the two sides on two threads as the bench runs them, in blocks of
//! 10,000 round trips: prints the fastest block and the median (the host's speed drifts,
//! so compare builds by alternating runs of this).
//!
//! With `both`, the two sides on two threads each write `ROUND_TRIPS` batches of 32
//! writes of 64 B to the other at once (a `Channel` scope per batch) and print the total
//! rate: two threads sending both ways over one connection, which take turns only where
//! they share something (their CQs' writer locks, `sim/src/hca/direct.rs`).
//!
//! Prints `ns_per_round_trip=<mean>`. Under `valgrind --tool=callgrind`, two runs with
//! different `ROUND_TRIPS` give instructions per round trip (setup cancels out); post +
//! poll alone is counted by `benches/instructions.rs`. Compare with the two-thread bench: the
//! difference is what the two cores' sharing of the simulator costs.

use std::time::Instant;

use zverbs::provider::sim::Sim;
use zverbs::{Channel, ChannelConfig, Context, SendFlags, SendOp};

const MSG: usize = 64;

fn buffer(len: usize) -> &'static mut [u8] {
    Box::leak(vec![0u8; len].into_boxed_slice())
}

/// Two connected channels on sim0 and sim1 (the contexts, domains and regions leaked, so
/// that the rest can be `'static`), A's message, A's inbox and B's buffer.
struct Pair {
    a: Channel<Sim, 64, 4>,
    b: Channel<Sim, 64, 4>,
    src: zverbs::LocalSlice<'static>,
    a_dst: [zverbs::Sge; 1],
    b_buf: [zverbs::Sge; 1],
    /// B's message, and the regions each side writes into at the other (`both`).
    b_src: zverbs::LocalSlice<'static>,
    into_b: zverbs::RemoteRegion,
    into_a: zverbs::RemoteRegion,
}

fn pair(cfg: ChannelConfig) -> Pair {
    let sim = Sim::with_devices(2);
    let open = |dev| &*Box::leak(Box::new(Context::open(&sim, dev).unwrap()));
    let (ca, cb) = (open("sim0"), open("sim1"));
    let (pa, pb) = (
        &*Box::leak(Box::new(ca.alloc_pd().unwrap())),
        &*Box::leak(Box::new(cb.alloc_pd().unwrap())),
    );
    let a = Channel::<Sim, 64, 4>::prepare(ca, pa, &cfg).unwrap();
    let b = Channel::<Sim, 64, 4>::prepare(cb, pb, &cfg).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    let region = |pd: &'static zverbs::ProtectionDomain<Sim>| {
        Box::leak(Box::new(pd.register(buffer(MSG)).unwrap()))
    };
    let (out, a_in, b_in, b_out) = (region(pa), region(pa), region(pb), region(pb));
    let writable = |pd: &'static zverbs::ProtectionDomain<Sim>| {
        // SAFETY: leaked, and never touched through Rust references.
        let mr = unsafe { pd.register_with_access(buffer(MSG), zverbs::AccessFlags::all()) };
        Box::leak(Box::new(mr.unwrap())).remote()
    };
    Pair {
        a,
        b,
        src: out.slice(..).unwrap(),
        a_dst: [a_in.slice_mut(..).unwrap().sge()],
        b_buf: [b_in.slice_mut(..).unwrap().sge()],
        b_src: b_out.slice(..).unwrap(),
        into_b: writable(pb),
        into_a: writable(pa),
    }
}

/// A round trip's software on the simulator: both ends on one thread (default), on two
/// threads, both writing at once, or awaited.
#[derive(clap::Parser)]
#[command(name = "sim_rtt")]
struct Cli {
    /// Round trips
    #[arg(default_value_t = 200_000)]
    round_trips: u64,
    /// Where the ends run
    #[arg(value_enum, default_value = "one")]
    how: How,
}

/// The second argument.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum How {
    /// Both ends' calls on one thread
    One,
    /// One thread per end, in blocks of 10,000
    Threads,
    /// Two threads writing to each other at once
    Both,
    /// Awaited on one thread (feature tokio)
    Async,
}

fn main() {
    let Cli {
        round_trips: iters,
        how,
    } = clap::Parser::parse();
    match how {
        How::One => {}
        How::Threads => return run_threads(iters),
        How::Both => return run_both(iters),
        #[cfg(feature = "tokio")]
        How::Async => return run_async(iters),
        #[cfg(not(feature = "tokio"))]
        How::Async => {
            eprintln!("sim_rtt: the async round trip needs --features sim,tokio");
            std::process::exit(2);
        }
    }
    let Pair {
        mut a,
        mut b,
        src,
        a_dst,
        b_buf,
        ..
    } = pair(ChannelConfig::default());
    let start = Instant::now();
    for _ in 0..iters {
        // SAFETY (both receives): the buffer is written by the device only until the
        // receive is redeemed in this iteration, and read by nobody.
        let ra = unsafe { a.post_receive_unpolled(&a_dst) }.unwrap();
        let rb = unsafe { b.post_receive_unpolled(&b_buf) }.unwrap();
        a.send([src]).unwrap();
        b.wait(rb).unwrap();
        // SAFETY: the echo only reads `b_in`, which is not reused before it completes.
        let p = unsafe { b.post_send_unpolled(&b_buf, SendOp::Send, SendFlags::empty()) }.unwrap();
        b.wait(p).unwrap();
        let got = a.wait(ra).unwrap();
        assert_eq!(got.byte_len as usize, MSG);
    }
    let ns = start.elapsed().as_nanos() as f64 / iters.max(1) as f64;
    println!("ns_per_round_trip={ns:.0}");
}

/// Both sides of the async ping-pong, one task: A posts its receive and sends; B takes
/// the message, posts its next receive and echoes; A takes the echo.
#[cfg(feature = "tokio")]
fn run_async(iters: u64) {
    use zverbs::tokio::AsyncChannel;
    use zverbs::{LocalBuf, MrPool};
    type ACh = AsyncChannel<Sim, LocalBuf<Sim>, 64, 4>;
    let sim = Sim::with_devices(2);
    let (ca, cb) = (
        Context::open(&sim, "sim0").unwrap(),
        Context::open(&sim, "sim1").unwrap(),
    );
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cfg = ChannelConfig::default();
    let a = ACh::prepare(&ca, &pa, &cfg).unwrap();
    let b = ACh::prepare(&cb, &pb, &cfg).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.connect(&eb).unwrap(), b.connect(&ea).unwrap());
    let (a, b) = {
        let _in = rt.enter();
        (ACh::new(a).unwrap(), ACh::new(b).unwrap())
    };
    let (qa, qb) = (
        MrPool::new(&pa, 1 << 16).unwrap(),
        MrPool::new(&pb, 1 << 16).unwrap(),
    );
    let (msg, inbox) = (qa.alloc(MSG).unwrap(), qa.alloc(MSG).unwrap());
    let (first, spare) = (qb.alloc(MSG).unwrap(), qb.alloc(MSG).unwrap());
    let ns = rt.block_on(round_trips(&a, &b, (msg, inbox), (first, spare), iters));
    println!("ns_per_round_trip={ns:.0}");
}

#[cfg(feature = "tokio")]
#[inline(never)]
async fn round_trips(
    a: &zverbs::tokio::AsyncChannel<Sim, zverbs::LocalBuf<Sim>, 64, 4>,
    b: &zverbs::tokio::AsyncChannel<Sim, zverbs::LocalBuf<Sim>, 64, 4>,
    (mut msg, mut inbox): (zverbs::LocalBuf<Sim>, zverbs::LocalBuf<Sim>),
    (first, mut spare): (zverbs::LocalBuf<Sim>, zverbs::LocalBuf<Sim>),
    iters: u64,
) -> f64 {
    let mut b_recv = b.receive(first);
    let start = Instant::now();
    for _ in 0..iters {
        let a_recv = a.receive(inbox);
        let (s, sent) = a.send(msg).await;
        s.unwrap();
        let (r, got) = b_recv.await;
        r.unwrap();
        b_recv = b.receive(spare);
        let (s, echoed) = b.send(got).await;
        s.unwrap();
        let (r, back) = a_recv.await;
        assert_eq!(r.unwrap().byte_len as usize, MSG);
        (msg, inbox, spare) = (sent, back, echoed);
    }
    let ns = start.elapsed().as_nanos() as f64 / iters.max(1) as f64;
    drop(b_recv);
    ns
}

/// The ping-pong on two threads (receives posted ahead, as `pingpong_64B/sim_channel`),
/// `iters` round trips in blocks of 10,000: the fastest block and the median, per trip.
fn run_threads(iters: u64) {
    const BLOCK: u64 = 10_000;
    let Pair {
        mut a,
        mut b,
        src,
        a_dst,
        b_buf,
        ..
    } = pair(ChannelConfig {
        wait: zverbs::WaitPolicy::Spin,
        ..ChannelConfig::default()
    });
    let blocks = (iters / BLOCK).max(1);
    let mut times: Vec<f64> = std::thread::scope(|t| {
        t.spawn(move || {
            // SAFETY (every receive): `b_in` is written by the device only until the
            // receive is redeemed, and read by the device only for the echo, which
            // completes before the next receive is posted on it.
            let mut r = unsafe { b.post_receive_unpolled(&b_buf) }.unwrap();
            for _ in 0..blocks * BLOCK {
                b.wait(r).unwrap();
                let p = unsafe { b.post_send_unpolled(&b_buf, SendOp::Send, SendFlags::empty()) };
                b.wait(p.unwrap()).unwrap();
                r = unsafe { b.post_receive_unpolled(&b_buf) }.unwrap();
            }
            drop(r);
        });
        (0..blocks)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..BLOCK {
                    // SAFETY: `a_in` is written by the device only until this receive is
                    // redeemed below, and read by nobody.
                    let r = unsafe { a.post_receive_unpolled(&a_dst) }.unwrap();
                    a.send([src]).unwrap();
                    a.wait(r).unwrap();
                }
                start.elapsed().as_nanos() as f64 / BLOCK as f64
            })
            .collect()
    });
    times.sort_by(f64::total_cmp);
    println!(
        "ns_per_round_trip fastest={:.0} median={:.0}",
        times[0],
        times[times.len() / 2]
    );
}

/// `batches` scopes of 32 writes of `src` into `dst`.
fn stream(
    ch: &mut Channel<Sim, 64, 4>,
    src: zverbs::LocalSlice<'_>,
    dst: &zverbs::RemoteRegion,
    batches: u64,
) {
    for _ in 0..batches {
        ch.scope(|s| {
            for _ in 0..32 {
                s.post_write([src], dst)?;
            }
            Ok(())
        })
        .expect("scope");
    }
}

/// Both sides write to each other at once, each on its own thread.
fn run_both(batches: u64) {
    let Pair {
        mut a,
        mut b,
        src,
        b_src,
        into_b,
        into_a,
        ..
    } = pair(ChannelConfig::default());
    let start = Instant::now();
    // Both channels live until both sides are done (a destroyed peer answers nothing).
    std::thread::scope(|t| {
        t.spawn(|| stream(&mut b, b_src, &into_a, batches));
        stream(&mut a, src, &into_b, batches);
    });
    let writes = 2 * 32 * batches;
    let secs = start.elapsed().as_secs_f64();
    println!("M_writes_per_s={:.1}", writes as f64 / secs / 1e6);
}
