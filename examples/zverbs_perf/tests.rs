//! The latency and bandwidth tests, generic over the provider.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use zverbs::provider::Provider;
use zverbs::{AccessFlags, Batch, Channel, MemoryRegion, Pending, SendFlags, SendOp};

use crate::backend::Backend;
use crate::cli::Op;
use crate::{Res, MAX_SIZE, RING};

/// The client's channel: `RING` requests in flight per direction.
pub type Ch<P> = Channel<P, RING, 1>;
/// The server's channel: room for `RX_DEPTH` receives, more than the client's window, as
/// perftest's server posts 512 receives for a send bandwidth test (else a send may find no
/// receive posted and wait out an RNR timer).
pub type Srv<P> = Channel<P, RX_DEPTH, 1>;
/// Receives the server keeps posted in the send bandwidth test.
const RX_DEPTH: usize = 512;

/// Both ends of one connection and their buffers.
pub struct Rig<'a, P: Provider> {
    pub client: Ch<P>,
    pub server: Srv<P>,
    /// Client: source of sends and writes.
    pub c_out: MemoryRegion<'a, P>,
    /// Client: target of receives, of the server's writes, and of reads.
    pub c_in: MemoryRegion<'a, P>,
    /// Server: source of its sends and writes.
    pub s_out: MemoryRegion<'a, P>,
    /// Server: target of receives and writes; source of reads.
    pub s_in: MemoryRegion<'a, P>,
}

/// Connects a client and a server channel of `backend`, registers four 1 MiB buffers and
/// runs `f` on them.
pub fn with_rig<B: Backend, R>(backend: &B, f: impl FnOnce(&mut Rig<'_, B::P>) -> Res<R>) -> Res<R>
where
    <B::P as Provider>::Error: Send + Sync + 'static,
{
    let (cc, sc) = backend.open()?;
    let (cp, sp) = (cc.alloc_pd()?, sc.alloc_pd()?);
    let client = Ch::<B::P>::prepare(&cc, &cp, &backend.channel_config(&cc)?)?;
    let server = Srv::<B::P>::prepare(&sc, &sp, &backend.channel_config(&sc)?)?;
    let (ec, es) = (client.endpoint(), server.endpoint());
    let (client, server) = (client.connect(&es)?, server.connect(&ec)?);

    let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; MAX_SIZE]).collect();
    let [b0, b1, b2, b3] = &mut bufs[..] else {
        unreachable!()
    };
    let all = AccessFlags::all();
    // SAFETY (the two `register_with_access` calls with remote rights): the tests order
    // every access by a completion (the ping-pong protocol) except the write-latency poll,
    // which watches one byte with atomic loads as perftest polls it (see `write_lat`).
    let mut rig = Rig {
        client,
        server,
        c_out: cp.register(b0)?,
        c_in: unsafe { cp.register_with_access(b1, all)? },
        s_out: sp.register(b2)?,
        s_in: unsafe { sp.register_with_access(b3, all)? },
    };
    rig.c_out.as_mut_slice().fill(0xC5);
    rig.s_out.as_mut_slice().fill(0x5C);
    f(&mut rig)
}

/// Waits for `p` by busy-polling [`Channel::try_complete`], as perftest busy-polls its
/// completion queue. ([`Channel::wait`] spins briefly, then yields the core on every poll,
/// which suits shared cores but adds a system call per poll to a latency test.) Gives up
/// after a minute.
fn spin<P: Provider<Error: Send + Sync + 'static>, const N: usize>(
    ch: &mut Channel<P, N, 1>,
    mut p: Pending,
) -> Res<zverbs::Completion> {
    let mut deadline = None;
    let mut polls = 0u32;
    loop {
        p = match ch.try_complete(p)? {
            Ok(done) => return Ok(done),
            Err(p) => p,
        };
        polls = polls.wrapping_add(1);
        if polls % 4096 == 0 {
            let now = Instant::now();
            if now > *deadline.get_or_insert(now + Duration::from_secs(60)) {
                // The request stays in flight: its buffers stay lent to the device until
                // the channel is dropped, which `with_rig` does before freeing them.
                let _ = p;
                return Err("no completion within 60 s".into());
            }
        }
        std::hint::spin_loop();
    }
}

/// Warm-up iterations, excluded from the samples.
fn warmup(iters: usize) -> usize {
    (iters / 10).clamp(1, 100)
}

/// A bandwidth loop's clock: started as unit `warm` (a message, or a list) is posted;
/// the best rate over `span` consecutive units, `span_bytes` bytes in all, each span
/// ending when its last unit's completion is taken.
struct Clock {
    warm: usize,
    span: usize,
    span_bytes: f64,
    start: Option<Instant>,
    /// Where the current span started: the time and the unit.
    span_start: Option<(Instant, usize)>,
    best: f64,
}

impl Clock {
    fn new(warm: usize, span: usize, span_bytes: f64) -> Self {
        Clock {
            warm,
            span,
            span_bytes,
            start: None,
            span_start: None,
            best: 0.0,
        }
    }

    /// Unit `i` is about to be posted.
    fn posting(&mut self, i: usize) {
        if i == self.warm {
            let now = Instant::now();
            self.start = Some(now);
            self.span_start = Some((now, i));
        }
    }

    /// The oldest unit in flight completed, before unit `i` is posted.
    fn completed(&mut self, i: usize) {
        let Some((t0, at)) = self.span_start else {
            return;
        };
        if i - at == self.span {
            let now = Instant::now();
            let dt = (now - t0).as_secs_f64();
            if dt > 0.0 {
                self.best = self.best.max(self.span_bytes / dt);
            }
            self.span_start = Some((now, i));
        }
    }

    /// The result of `messages` timed messages of `size` bytes.
    fn result(&self, messages: usize, size: usize) -> BwResult {
        BwResult {
            total: self.start.map_or(Duration::ZERO, |s| s.elapsed()),
            best_window: self.best,
            bytes: (messages * size) as u64,
            size,
        }
    }
}

/// Bandwidth with lists (perftest's `--post_list`): `batch`, built once, posted `lists`
/// times in one scope, `window` lists in flight; the oldest list's last request (the one
/// signaled, whose completion retires the list) is waited for before the next post. The
/// first `warm` lists are not timed.
fn bw_lists<P: Provider<Error: Send + Sync + 'static>>(
    client: &mut Ch<P>,
    batch: &mut Batch<'_, P, RING, 1>,
    lists: usize,
    warm: usize,
    window: usize,
    size: usize,
) -> Res<BwResult> {
    let per_list = batch.len();
    let r = client.scope(|s| {
        let mut inflight = VecDeque::with_capacity(window);
        let mut clock = Clock::new(warm, window, (window * per_list * size) as f64);
        for i in 0..lists {
            clock.posting(i);
            if inflight.len() == window {
                let oldest: core::ops::Range<u64> = inflight.pop_front().expect("window is full");
                s.wait_send(oldest.end - 1)?;
                clock.completed(i);
            }
            inflight.push_back(s.post_batch(batch)?);
        }
        while let Some(list) = inflight.pop_front() {
            s.wait_send(list.end - 1)?;
        }
        Ok(clock.result((lists - warm) * per_list, size))
    })?;
    Ok(r)
}

/// Send latency: client sends, server answers, receives posted ahead on both sides.
/// Samples are half round trips, in nanoseconds (as `ib_send_lat` reports).
///
/// Sends are posted unpolled and their own completions (the peer's acknowledgements) reaped
/// after the answer arrived, as perftest does: waiting for the acknowledgement before
/// polling for the answer would put an extra wait on the critical path. Each sample still
/// covers the whole iteration, send completion included.
pub fn send_lat<P: Provider<Error: Send + Sync + 'static>>(
    rig: &mut Rig<'_, P>,
    size: usize,
    iters: usize,
) -> Res<Vec<u64>> {
    let total = iters + warmup(iters);
    let c_src = rig.c_out.slice(..size)?.sge();
    let c_dst = rig.c_in.slice_mut(..size)?.sge();
    let s_src = rig.s_out.slice(..size)?.sge();
    let s_dst = rig.s_in.slice_mut(..size)?.sge();
    let (client, server) = (&mut rig.client, &mut rig.server);
    let mut samples = Vec::with_capacity(total);
    let ready = Barrier::new(2);
    std::thread::scope(|t| -> Res<()> {
        let ready = &ready;
        let echo = t.spawn(move || -> Res<()> {
            // SAFETY (every unpolled post below): `s_in` is used by the device only until
            // each receive is redeemed, and `s_out` is never written; every handle is
            // redeemed before the scope ends.
            let first = unsafe { server.post_receive_unpolled(&[s_dst]) };
            ready.wait();
            let (mut next, mut answer) = (Some(first?), None);
            for i in 0..total {
                if let Some(r) = next.take() {
                    spin(server, r)?;
                }
                if let Some(p) = answer.take() {
                    spin(server, p)?;
                }
                if i + 1 < total {
                    // Posted before the answer, so the client's next send finds it.
                    next = Some(unsafe { server.post_receive_unpolled(&[s_dst]) }?);
                }
                answer = Some(unsafe {
                    server.post_send_unpolled(&[s_src], SendOp::Send, SendFlags::empty())
                }?);
            }
            if let Some(p) = answer {
                spin(server, p)?;
            }
            Ok(())
        });
        ready.wait();
        let mut run = || -> Res<()> {
            for _ in 0..total {
                let t0 = Instant::now();
                // SAFETY: `c_in` is used by the device only until the receive is redeemed,
                // `c_out` is never written; both are redeemed in this iteration.
                let r = unsafe { client.post_receive_unpolled(&[c_dst]) }?;
                let p = unsafe {
                    client.post_send_unpolled(&[c_src], SendOp::Send, SendFlags::empty())
                }?;
                spin(client, r)?;
                spin(client, p)?;
                samples.push(t0.elapsed().as_nanos() as u64 / 2);
            }
            Ok(())
        };
        let mine = run();
        let theirs = echo.join().map_err(|_| "server thread panicked")?;
        mine.and(theirs)
    })?;
    samples.drain(..total - iters);
    Ok(samples)
}

/// The last byte of a region of `size` bytes, watched with atomic loads.
///
/// # Safety
/// `mr` must be at least `size` bytes and outlive the returned reference.
unsafe fn last_byte<'a, P: Provider>(mr: &mut MemoryRegion<'_, P>, size: usize) -> &'a AtomicU8 {
    let p = mr.as_mut_slice()[..size].as_mut_ptr();
    // SAFETY: in bounds (size ≥ 1), aligned (1), valid for the region's life (the
    // caller's promise). Memory polling as perftest does it: the peer's device writes the
    // byte while this thread loads it. A device's DMA is outside Rust's memory model; the
    // simulator's write is a plain copy from the peer's thread, which Rust formally calls a
    // race with this atomic load. Byte loads cannot tear; this tool accepts that, as every
    // RDMA memory-polling loop does. The library's safe API never does this.
    unsafe { AtomicU8::from_ptr(p.add(size - 1)) }
}

/// The value written in the last byte at iteration `i` (never 0, never the previous one).
fn mark(i: usize) -> u8 {
    (i % 255) as u8 + 1
}

/// Write latency: each side writes `size` bytes into the other's buffer and polls the last
/// byte of its own for the peer's write (as `ib_write_lat`). Samples are half round trips.
/// As in `send_lat`, a write's own completion is reaped after the peer's write arrived.
pub fn write_lat<P: Provider<Error: Send + Sync + 'static>>(
    rig: &mut Rig<'_, P>,
    size: usize,
    iters: usize,
) -> Res<Vec<u64>> {
    let total = iters + warmup(iters);
    rig.c_in.as_mut_slice()[size - 1] = 0;
    rig.s_in.as_mut_slice()[size - 1] = 0;
    let to_server = rig.s_in.remote().slice(..size as u64)?;
    let to_client = rig.c_in.remote().slice(..size as u64)?;
    let (w_server, w_client) = (
        SendOp::Write {
            remote_addr: to_server.addr,
            rkey: to_server.rkey,
        },
        SendOp::Write {
            remote_addr: to_client.addr,
            rkey: to_client.rkey,
        },
    );
    // SAFETY: both regions outlive the scope below.
    let (c_flag, s_flag) = unsafe {
        (
            last_byte(&mut rig.c_in, size),
            last_byte(&mut rig.s_in, size),
        )
    };
    let (c_out, s_out) = (&mut rig.c_out, &mut rig.s_out);
    let (client, server) = (&mut rig.client, &mut rig.server);
    let mut samples = Vec::with_capacity(total);
    std::thread::scope(|t| -> Res<()> {
        let echo = t.spawn(move || -> Res<()> {
            let mut sent = None;
            for i in 0..total {
                let want = mark(i);
                while s_flag.load(Ordering::Acquire) != want {
                    std::hint::spin_loop();
                }
                if let Some(p) = sent.take() {
                    spin(server, p)?;
                }
                s_out.as_mut_slice()[size - 1] = want;
                let src = s_out.slice(..size)?.sge();
                // SAFETY: `s_out` is not written again before this write is redeemed
                // (above, next iteration, or after the loop).
                sent = Some(unsafe {
                    server.post_send_unpolled(&[src], w_client, SendFlags::empty())
                }?);
            }
            if let Some(p) = sent {
                spin(server, p)?;
            }
            Ok(())
        });
        let mut run = || -> Res<()> {
            for i in 0..total {
                let want = mark(i);
                let t0 = Instant::now();
                c_out.as_mut_slice()[size - 1] = want;
                let src = c_out.slice(..size)?.sge();
                // SAFETY: `c_out` is not written again before the write is redeemed below.
                let p = unsafe { client.post_send_unpolled(&[src], w_server, SendFlags::empty()) }?;
                while c_flag.load(Ordering::Acquire) != want {
                    std::hint::spin_loop();
                }
                spin(client, p)?;
                samples.push(t0.elapsed().as_nanos() as u64 / 2);
            }
            Ok(())
        };
        let mine = run();
        let theirs = echo.join().map_err(|_| "server thread panicked")?;
        mine.and(theirs)
    })?;
    samples.drain(..total - iters);
    Ok(samples)
}

/// Read latency: one read posted and its completion polled; the server is passive. The
/// full time, as `ib_read_lat` reports.
pub fn read_lat<P: Provider<Error: Send + Sync + 'static>>(
    rig: &mut Rig<'_, P>,
    size: usize,
    iters: usize,
) -> Res<Vec<u64>> {
    let total = iters + warmup(iters);
    let from = rig.s_in.remote().slice(..size as u64)?;
    let mut samples = Vec::with_capacity(total);
    for _ in 0..total {
        let t0 = Instant::now();
        rig.client.read([rig.c_in.slice_mut(..size)?], &from)?;
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    samples.drain(..total - iters);
    Ok(samples)
}

/// The outcome of a bandwidth test.
pub struct BwResult {
    pub total: Duration,
    /// Bytes per second over the best `depth` consecutive messages.
    pub best_window: f64,
    pub bytes: u64,
    pub size: usize,
}

/// Why `--post-list` refuses reads.
pub const READS_IN_LISTS: &str = "--post-list takes sends and writes: a read's target is one \
                                  buffer, which one request at a time may borrow";

/// Bandwidth: `iters` messages (after a warm-up) kept in flight `depth` at a time, as
/// perftest's bandwidth tests do: unpolled posts, the oldest waited for before each new
/// post; or, with `post_list` above 1, lists of that many ([`bw_lists`]). For sends the
/// server keeps up to `RX_DEPTH` receives posted.
pub fn bw<P: Provider<Error: Send + Sync + 'static>>(
    rig: &mut Rig<'_, P>,
    op: Op,
    size: usize,
    iters: usize,
    depth: usize,
    post_list: usize,
) -> Res<BwResult> {
    if post_list > 1 && op == Op::Read {
        return Err(READS_IN_LISTS.into());
    }
    let remote = rig.s_in.remote().slice(..size as u64)?;
    let s_dst = rig.s_in.slice_mut(..size)?.sge();
    let (client, server) = (&mut rig.client, &mut rig.server);
    let (c_out, c_in) = (&rig.c_out, &mut rig.c_in);
    let (src, read_dst) = (c_out.slice(..size)?.sge(), c_in.slice_mut(..size)?.sge());
    let (send_op, sge) = match op {
        Op::Send => (SendOp::Send, src),
        Op::Write => (
            SendOp::Write {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            src,
        ),
        Op::Read => (
            SendOp::Read {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            read_dst,
        ),
    };
    let warm = warmup(iters).min(depth);
    // Whole lists: the iterations (and the warm-up) round up to them.
    let lists = (iters + warm).div_ceil(post_list);
    let warm_lists = warm.div_ceil(post_list);
    let total = lists * post_list;
    // The list, built once, if requests go out in lists.
    let mut batch: Option<Batch<P, RING, 1>> = None;
    if post_list > 1 {
        let data = c_out.slice(..size)?;
        let list = batch.insert(client.batch());
        for _ in 0..post_list {
            match op {
                Op::Write => list.push(zverbs::Op::write([data], &remote))?,
                _ => list.push(zverbs::Op::send([data]))?,
            };
        }
    }
    let ready = Barrier::new(2);
    std::thread::scope(|t| -> Res<BwResult> {
        let ready = &ready;
        let sink = (op == Op::Send).then(|| {
            t.spawn(move || -> Res<()> {
                let mut posted = VecDeque::with_capacity(RX_DEPTH);
                let mut next = 0;
                let mut first = Ok(());
                while next < total.min(RX_DEPTH) {
                    // SAFETY: the receives scatter into `s_in`, which nobody reads here.
                    match unsafe { server.post_receive_unpolled(&[s_dst]) } {
                        Ok(p) => posted.push_back(p),
                        Err(e) => {
                            first = Err(e);
                            break;
                        }
                    }
                    next += 1;
                }
                ready.wait();
                first?;
                while let Some(p) = posted.pop_front() {
                    // The blocking wait (spin, then yield): the sink is not what is
                    // measured, and yielding leaves the cores to the sender (and, on the
                    // simulator, its lock).
                    server.wait(p)?;
                    if next < total {
                        // SAFETY: as above.
                        posted.push_back(unsafe { server.post_receive_unpolled(&[s_dst]) }?);
                        next += 1;
                    }
                }
                Ok(())
            })
        });
        if sink.is_some() {
            ready.wait();
        }
        let mut run = || -> Res<BwResult> {
            if let Some(list) = batch.as_mut() {
                let window = (depth / post_list).max(1);
                return bw_lists(client, list, lists, warm_lists, window, size);
            }
            let mut inflight = VecDeque::with_capacity(depth);
            let mut clock = Clock::new(warm, depth, (depth * size) as f64);
            for i in 0..total {
                clock.posting(i);
                if inflight.len() == depth {
                    spin(client, inflight.pop_front().expect("window is full"))?;
                    clock.completed(i);
                }
                // SAFETY: the source (or, for reads, the target) buffer is not accessed
                // through Rust references until every request is redeemed below.
                let p = unsafe { client.post_send_unpolled(&[sge], send_op, SendFlags::empty()) }?;
                inflight.push_back(p);
            }
            while let Some(p) = inflight.pop_front() {
                spin(client, p)?;
            }
            Ok(clock.result(total - warm, size))
        };
        let mine = run();
        if let Some(h) = sink {
            h.join().map_err(|_| "server thread panicked")??;
        }
        mine
    })
}
