//! RPC over unreliable datagrams: a server thread with two handlers (echo and reverse) and
//! a client thread issuing 32 B and 1 MiB requests, on the simulator or a verbs device.
//!
//! ```text
//! cargo run --release --features sim --example rpc_echo [-- --calls N --secs S]
//! cargo run --release --features verbs --example rpc_echo -- --backend verbs [--device NAME]
//! ```
//!
//! Prints, for 32 B requests one at a time, the round-trip percentiles (p50, p99, p99.9);
//! the rate of 32 B requests with a window of 8 outstanding for `--secs` (default 1); and the
//! time and throughput of 1 MiB requests (reversed back whole), both as eRPC moves them
//! (1,024-byte datagrams) and on the bulk path (`EngineConfig::bulk`: one RDMA read each
//! way over the session's reliable connection, from and into registered buffers). The last
//! line, `allocations_after_setup=<n>`, counts heap allocations in the client's measured
//! loops (a global allocator wrapper). On verbs both endpoints live on one device, in loopback
//! (`--device`, else `ZVERBS_DEVICE`, else the first device).

mod backend;

use std::process::ExitCode;

// `Backend` names the arms of backends built in.
#[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_imports))]
use backend::{Backend, BackendArgs};

/// RPC over unreliable datagrams: a server with an echo and a reverse handler, a client
/// issuing 32 B and 1 MiB requests; percentiles, rate, throughput and the allocations
/// counted after setup.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    backend: BackendArgs,
    /// 32 B requests timed one at a time (the percentiles)
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    calls: usize,
    /// Seconds of the rate run (32 B, a window of 8)
    #[arg(long, value_name = "S", default_value_t = 1)]
    secs: usize,
}

#[global_allocator]
static GLOBAL: zverbs_testkit::CountingAlloc = zverbs_testkit::CountingAlloc;

fn main() -> ExitCode {
    backend::main("rpc_echo", run)
}

fn run() -> Result<(), String> {
    let args: Cli = backend::parse("rpc_echo");
    let (calls, secs) = (args.calls, args.secs);
    match args.backend.backend {
        #[cfg(feature = "sim")]
        Backend::Sim => {
            use zverbs::provider::sim::Sim;
            let sim = Sim::with_devices(2);
            let open = |name| zverbs::Context::open(&sim, name).map_err(|e| e.to_string());
            let (ca, cb) = (open("sim0")?, open("sim1")?);
            let cfg = zverbs::rpc::EngineConfig::default();
            measured::run(&ca, &cb, cfg, calls, secs, "the simulator")
        }
        #[cfg(feature = "verbs")]
        Backend::Verbs => {
            use zverbs::provider::verbs::Verbs;
            let device = backend::verbs::device(args.backend.device.as_deref())?;
            let open = || zverbs::Context::open(&Verbs, &device).map_err(|e| e.to_string());
            let (ca, cb) = (open()?, open()?);
            let cfg = zverbs::rpc::EngineConfig {
                qp: backend::verbs::qp_config(&ca)?,
                ..zverbs::rpc::EngineConfig::default()
            };
            let what = format!("verbs device {device} (loopback)");
            measured::run(&ca, &cb, cfg, calls, secs, &what)
        }
        #[allow(unreachable_patterns)]
        other => {
            let _ = (calls, secs);
            Err(other.not_compiled_in("rpc_echo"))
        }
    }
}

#[cfg(any(feature = "sim", feature = "verbs"))]
mod measured {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use zverbs::pool::LocalBuf;
    use zverbs::provider::Provider;
    use zverbs::rpc::{BulkConfig, Config, EngineConfig, Event, MsgBuf, Notice, Rpc, SessionId};
    use zverbs::Context;

    use std::sync::atomic::AtomicU64;

    /// Every thread's allocations in the measured part, for the report.
    static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

    const ECHO: u8 = 1;
    const REVERSE: u8 = 2;
    const SMALL: usize = 32;
    const BIG: usize = 1 << 20;
    const WINDOW: usize = 8;

    /// The client's side of the measurement: its engine and what came back.
    struct Client<P: Provider> {
        rpc: Rpc<P>,
        session: SessionId,
        done: usize,
        failed: Option<String>,
        last: Vec<u8>,
        /// A large request's buffer, back from the engine.
        msg: Option<LocalBuf<P>>,
    }

    impl<P: Provider> Client<P> {
        /// A large request from the buffer the engine gave back.
        fn call_bulk(&mut self, req_type: u8) -> Result<(), String> {
            let msg = self
                .msg
                .take()
                .ok_or("the large buffer did not come back")?;
            let tag = self.done as u64;
            match self.rpc.enqueue_bulk(self.session, req_type, msg, tag) {
                Ok(_) => Ok(()),
                Err((e, msg)) => {
                    self.msg = Some(msg);
                    Err(e.to_string())
                }
            }
        }

        /// Passes until `n` requests finished in all.
        fn until(&mut self, n: usize, keep: bool) -> Result<(), String> {
            let (done, failed, last) = (&mut self.done, &mut self.failed, &mut self.last);
            let back = &mut self.msg;
            let deadline = Instant::now() + Duration::from_secs(30);
            while *done < n {
                self.rpc
                    .run_event_loop_once(&mut |notice| match notice {
                        Notice::Response { bytes, msg, .. } => {
                            *done += 1;
                            if keep {
                                last.clear();
                                last.extend_from_slice(bytes);
                            }
                            *back = msg.and_then(MsgBuf::into_host).or(back.take());
                        }
                        Notice::Failed { error, msg, .. } => {
                            *done += 1;
                            *failed = Some(error.to_string());
                            *back = msg.and_then(MsgBuf::into_host).or(back.take());
                        }
                        Notice::Session(_) => {}
                    })
                    .map_err(|e| e.to_string())?;
                if Instant::now() > deadline {
                    return Err("no response within 30 s".into());
                }
            }
            match failed.take() {
                Some(e) => Err(format!("a request failed: {e}")),
                None => Ok(()),
            }
        }

        fn call(&mut self, req_type: u8, req: &[u8]) -> Result<(), String> {
            let tag = self.done as u64;
            self.rpc
                .enqueue_request(self.session, req_type, req, tag)
                .map(drop)
                .map_err(|e| e.to_string())
        }
    }

    pub fn run<P: Provider>(
        ca: &Context<P>,
        cb: &Context<P>,
        cfg: EngineConfig,
        calls: usize,
        secs: usize,
        what: &str,
    ) -> Result<(), String>
    where
        Rpc<P>: Send,
    {
        let s = |e: zverbs::rpc::EngineError<P::Error>| e.to_string();
        let cfg = EngineConfig {
            core: Config {
                max_sessions: 2,
                max_msg_size: BIG,
                // Connect requests resent for a second (every `rto_ns`, 5 ms): round trips
                // in an emulated rxe guest reach tens of milliseconds, past the default ten
                // tries.
                handshake_tries: 200,
                ..cfg.core.clone()
            },
            bulk: Some(BulkConfig {
                max_msg_size: BIG,
                pool_bytes: 8 * BIG,
            }),
            ..cfg
        };
        let pd = |ctx: &Context<P>| ctx.alloc_pd().map_err(|e| e.to_string());
        let mut server = Rpc::new(cb, pd(cb)?, cfg.clone()).map_err(s)?;
        server
            .register_handler(ECHO, |req, out| {
                out[..req.len()].copy_from_slice(req);
                req.len()
            })
            .map_err(s)?;
        server
            .register_handler(REVERSE, |req, out| {
                for (o, b) in out.iter_mut().zip(req.iter().rev()) {
                    *o = *b;
                }
                req.len()
            })
            .map_err(s)?;
        let rpc = Rpc::new(ca, pd(ca)?, cfg).map_err(s)?;
        let addr = server.addr();
        let stop = AtomicBool::new(false);
        std::thread::scope(|t| {
            let serving = t.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if let Err(e) = server.run_event_loop_once(&mut |_| {}) {
                        return Err(e.to_string());
                    }
                }
                Ok(())
            });
            let result = client(rpc, &addr, calls, secs, what);
            stop.store(true, Ordering::Relaxed);
            let served = serving
                .join()
                .unwrap_or_else(|_| Err("server panicked".into()));
            result.and(served)
        })
    }

    fn client<P: Provider>(
        rpc: Rpc<P>,
        server: &zverbs::Endpoint,
        calls: usize,
        secs: usize,
        what: &str,
    ) -> Result<(), String> {
        let mut rpc = rpc;
        let session = rpc.create_session(server).map_err(|e| e.to_string())?;
        let mut c = Client {
            rpc,
            session,
            done: 0,
            failed: None,
            last: Vec::with_capacity(BIG),
            msg: None,
        };
        // Connect: the session event comes before any response.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut up = false;
        while !up && Instant::now() < deadline {
            c.rpc
                .run_event_loop_once(&mut |n| {
                    up |= matches!(n, Notice::Session(Event::Connected(_)))
                })
                .map_err(|e| e.to_string())?;
        }
        if !up {
            return Err("the session did not connect".into());
        }
        let small = [0x5Au8; SMALL];
        let mut rtts = Vec::with_capacity(calls);
        // Warm up: a full window once, so every queue and the fabric's buffers have their
        // working size before allocations are counted.
        for _ in 0..WINDOW {
            c.call(ECHO, &small)?;
        }
        c.until(WINDOW, false)?;
        let base = c.done;
        zverbs_testkit::process::reset();
        for i in 0..calls {
            let t0 = Instant::now();
            c.call(ECHO, &small)?;
            c.until(base + i + 1, false)?;
            rtts.push(t0.elapsed());
        }
        // The rate: a window of requests kept full for `secs`.
        let base = c.done;
        let t0 = Instant::now();
        let mut issued = base;
        while t0.elapsed() < Duration::from_secs(secs as u64) {
            while issued - c.done < WINDOW {
                c.call(ECHO, &small)?;
                issued += 1;
            }
            c.until(c.done + 1, false)?;
        }
        c.until(issued, false)?;
        let rate = (c.done - base) as f64 / t0.elapsed().as_secs_f64();
        ALLOCATIONS.fetch_add(zverbs_testkit::process::stats().count, Ordering::SeqCst);
        // 1 MiB, reversed: the bytes come back whole.
        let big: Vec<u8> = (0..BIG).map(|i| (i * 7) as u8).collect();
        let rounds = 8;
        let t0 = Instant::now();
        for _ in 0..rounds {
            let n = c.done;
            c.call(REVERSE, &big)?;
            c.until(n + 1, true)?;
        }
        let per = t0.elapsed() / rounds;
        if !c.last.iter().eq(big.iter().rev()) {
            return Err("the 1 MiB response came back altered".into());
        }
        // The same on the bulk path: written once into a registered buffer, which comes
        // back with each response. Allocations counted again.
        let mut msg = c.rpc.alloc_msg(BIG).map_err(|e| e.to_string())?;
        msg.as_mut_slice().copy_from_slice(&big);
        c.msg = Some(msg);
        let n = c.done;
        c.call_bulk(REVERSE)?; // warm: the first use of the reads
        c.until(n + 1, false)?;
        zverbs_testkit::process::reset();
        let t0 = Instant::now();
        for _ in 0..rounds {
            let n = c.done;
            c.call_bulk(REVERSE)?;
            c.until(n + 1, false)?;
        }
        let per_bulk = t0.elapsed() / rounds;
        ALLOCATIONS.fetch_add(zverbs_testkit::process::stats().count, Ordering::SeqCst);
        let n = c.done;
        c.call_bulk(REVERSE)?;
        c.until(n + 1, true)?;
        if !c.last.iter().eq(big.iter().rev()) {
            return Err("the 1 MiB bulk response came back altered".into());
        }
        rtts.sort_unstable();
        let pct = |p: f64| rtts[((rtts.len() as f64 * p) as usize).min(rtts.len() - 1)];
        println!("rpc_echo: over {what}, a server thread and a client thread");
        println!(
            "32 B, one at a time ({calls} calls): p50 {:?}, p99 {:?}, p99.9 {:?}",
            pct(0.5),
            pct(0.99),
            pct(0.999)
        );
        println!("32 B, {WINDOW} outstanding: {:.0} RPCs/s", rate);
        println!(
            "1 MiB reversed, as datagrams: {per:?} per call, {:.2} GB/s each way",
            BIG as f64 / per.as_secs_f64() / 1e9
        );
        println!(
            "1 MiB reversed, bulk (RDMA reads): {per_bulk:?} per call, {:.2} GB/s each way",
            BIG as f64 / per_bulk.as_secs_f64() / 1e9
        );
        println!(
            "allocations_after_setup={}",
            ALLOCATIONS.load(Ordering::SeqCst)
        );
        Ok(())
    }
}
