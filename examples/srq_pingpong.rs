//! rdma-core's `ibv_srq_pingpong` on zverbs' public API, wire-compatible with the C program:
//! 16 RC queue pairs sharing one shared receive queue and one completion queue, driven
//! from one thread, without `unsafe` ([`SrqGroup`](zverbs::srq::SrqGroup)).
//!
//! ```text
//! cargo run --features sim --example srq_pingpong                        # both roles, simulator
//! ibv_srq_pingpong -d rxe0 -g 1 &                                         # C server, then:
//! cargo run --features verbs --example srq_pingpong -- --backend verbs --client 127.0.0.1
//! cargo run --features verbs --example srq_pingpong -- --backend verbs --server 0.0.0.0
//! ibv_srq_pingpong -d rxe0 -g 1 127.0.0.1                                 # C client
//! ```
//!
//! The protocol, as `srq_pingpong.c` has it: over TCP (port 18515), the client writes 256
//! addresses of 52 bytes (`"%04x:%06x:%06x:%s"`: LID, QPN, PSN and the GID as 32 hex
//! digits, NUL-padded; the first `--qps` real), reads the server's 256 (the server connects
//! its queue pairs before writing them), and writes `"done"`. The client sends first on
//! every queue pair; each side sends again on a queue pair once both its last send and a
//! receive on it completed, until `--count` sends and receives completed in all. Messages
//! are `--size` bytes (4096), the SRQ holds `--rx-depth` receives (500) and is refilled
//! once no more than `--qps` remain.

mod backend;

use std::process::ExitCode;

// `Backend` names the arms of backends built in.
#[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_imports))]
use backend::{Backend, ClientServerArgs};

/// rdma-core's ibv_srq_pingpong on an SrqGroup, wire-compatible: queue pairs sharing one
/// SRQ and one completion queue, ping-ponging from one thread.
#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    common: ClientServerArgs,
    /// Sends (and receives) to complete in all
    #[arg(long, value_name = "N", default_value_t = 1000)]
    count: usize,
    /// Queue pairs
    #[arg(long, value_name = "N", default_value_t = 16)]
    qps: usize,
    /// Receives kept posted to the SRQ
    #[arg(long, value_name = "N", default_value_t = 500)]
    rx_depth: usize,
    /// Message size in bytes
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    size: usize,
}

fn main() -> ExitCode {
    backend::main("srq_pingpong", run)
}

fn run() -> Result<(), String> {
    let args: Cli = backend::parse("srq_pingpong");
    // Unused in a build without a backend, which only says which feature to enable.
    #[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_variables))]
    let opts = (args.count, args.qps, args.rx_depth, args.size);
    match args.common.backend.backend {
        #[cfg(feature = "sim")]
        Backend::Sim => {
            use zverbs::provider::sim::Sim;
            let sim = Sim::with_devices(2);
            let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            let at = listener.local_addr().map_err(|e| e.to_string())?;
            let cfg = zverbs::qp::QpConfig::default();
            backend::side_by_side(
                || pp::run(&sim, "sim1", cfg, pp::Role::Server(listener), opts),
                || pp::run(&sim, "sim0", cfg, pp::Role::Client(at), opts),
            )
        }
        #[cfg(feature = "verbs")]
        Backend::Verbs => {
            use zverbs::provider::verbs::Verbs;
            let device = backend::verbs::device(args.common.backend.device.as_deref())?;
            let ctx = zverbs::Context::open(&Verbs, &device).map_err(|e| e.to_string())?;
            let cfg = backend::verbs::qp_config(&ctx)?;
            drop(ctx);
            let role = match args.common.role(pp::PORT)? {
                backend::Role::Server(at) => {
                    let l = std::net::TcpListener::bind(at).map_err(|e| format!("{at}: {e}"))?;
                    println!("srq_pingpong: serving at {at}");
                    pp::Role::Server(l)
                }
                backend::Role::Client(to) => pp::Role::Client(to),
            };
            pp::run(&Verbs, &device, cfg, role, opts)
        }
        #[allow(unreachable_patterns)]
        other => Err(other.not_compiled_in("srq_pingpong")),
    }
}

#[cfg(any(feature = "sim", feature = "verbs"))]
mod pp {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use zverbs::provider::Provider;
    use zverbs::qp::{Endpoint, QpConfig, RtrOptions, RtsOptions};
    use zverbs::srq::{GroupEvent, SlotsConfig, SrqGroup, SrqGroupConfig};
    use zverbs::{Context, Gid, Mtu};

    /// `srq_pingpong.c`'s TCP port.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub const PORT: u16 = 18515;
    /// Its address message: `sizeof "0000:000000:000000:" + 32 hex digits`, with the NUL.
    const MSG: usize = 52;
    /// Addresses each side writes, whatever its number of queue pairs (`MAX_QP`).
    const MAX_QP: usize = 256;
    /// One wait for the peer: long enough for an emulated guest.
    const STEP: Duration = Duration::from_secs(20);
    /// The path MTU `ibv_srq_pingpong` uses by default (`-m 1024`).
    const MTU: Mtu = Mtu::Mtu1024;
    const SEND: u8 = 2;
    const RECV: u8 = 1;

    pub enum Role {
        /// Serves one client, accepted on this listener.
        Server(TcpListener),
        /// Asks the server at this address.
        Client(SocketAddr),
    }

    /// Count, queue pairs, receive depth, message size.
    type Opts = (usize, usize, usize, usize);

    fn encode(e: Option<&Endpoint>) -> [u8; MSG] {
        let (lid, qpn, psn, gid) =
            e.map_or((0, 0, 0, [0; 16]), |e| (e.lid, e.qp_num, e.psn, e.gid.0));
        let hex: String = gid.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!("{lid:04x}:{qpn:06x}:{psn:06x}:{hex}");
        let mut m = [0u8; MSG];
        m[..text.len()].copy_from_slice(text.as_bytes());
        m
    }

    fn decode(m: &[u8; MSG]) -> Result<Endpoint, String> {
        let end = m.iter().position(|&b| b == 0).unwrap_or(MSG);
        let text = std::str::from_utf8(&m[..end]).map_err(|_| "an address that is not text")?;
        let bad = || format!("a malformed address {text:?}");
        let mut f = text.split(':');
        let mut num = |max: u32| -> Result<u32, String> {
            let v = u32::from_str_radix(f.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
            if v > max {
                Err(bad())
            } else {
                Ok(v)
            }
        };
        let (lid, qp_num, psn) = (num(0xffff)? as u16, num(0xff_ffff)?, num(0xff_ffff)?);
        let hex = f.next().ok_or_else(bad)?;
        if hex.len() != 32 || f.next().is_some() {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Endpoint {
            qp_num,
            psn,
            lid,
            gid: Gid(gid),
            mtu: MTU,
        })
    }

    fn write_all(s: &mut TcpStream, ours: &[Endpoint]) -> Result<(), String> {
        for i in 0..MAX_QP {
            s.write_all(&encode(ours.get(i)))
                .map_err(|e| format!("write addresses: {e}"))?;
        }
        Ok(())
    }

    /// The peer's 256 addresses, of which the first `n` are used.
    fn read_all(s: &mut TcpStream, n: usize) -> Result<Vec<Endpoint>, String> {
        let mut out = Vec::with_capacity(n);
        for i in 0..MAX_QP {
            let mut m = [0u8; MSG];
            s.read_exact(&mut m)
                .map_err(|e| format!("read address {i}: {e}"))?;
            if i < n {
                out.push(decode(&m)?);
            }
        }
        Ok(out)
    }

    fn dial(to: SocketAddr) -> Result<TcpStream, String> {
        let deadline = Instant::now() + STEP;
        loop {
            match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                Ok(s) => return Ok(s),
                Err(e) if Instant::now() >= deadline => return Err(format!("{to}: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The client's connection, within a few [`STEP`]s (nobody coming is an error, not a
    /// hang).
    fn accept(l: &TcpListener) -> Result<TcpStream, String> {
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + 3 * STEP;
        loop {
            match l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).map_err(|e| e.to_string())?;
                    return Ok(s);
                }
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                    return Err(format!("accept: {e}"))
                }
                Err(_) if Instant::now() >= deadline => {
                    return Err(format!("no client within {:?}", 3 * STEP))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    pub fn run<P: Provider>(
        provider: &P,
        device: &str,
        qp: QpConfig,
        role: Role,
        (iters, qps, rx_depth, size): Opts,
    ) -> Result<(), String> {
        if qps == 0 || qps >= MAX_QP || rx_depth <= qps {
            return Err(format!("--qps must be 1..{MAX_QP} and below --rx-depth"));
        }
        let e = |what: &'static str| move |e: zverbs::Error<P::Error>| format!("{what}: {e}");
        let ctx = Context::open(provider, device).map_err(e("open device"))?;
        let pd = ctx.alloc_pd().map_err(e("alloc pd"))?;
        let receive = SlotsConfig {
            slots: rx_depth as u32,
            size,
            refill_at: qps as u32,
            ..SlotsConfig::default()
        };
        let cfg = SrqGroupConfig { receive, qp };
        let group = SrqGroup::prepare(&ctx, &pd, qps, &cfg).map_err(e("prepare"))?;
        let ours = group.endpoints();
        let rtr = RtrOptions {
            min_rnr_timer: 12,
            max_dest_rd_atomic: 1,
            hop_limit: 1,
            ..RtrOptions::default()
        };
        let rts = RtsOptions {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        };
        let client = matches!(role, Role::Client(_));
        // The stream stays open until the end: see the teardown below.
        let (mut group, mut stream) = match role {
            Role::Server(l) => {
                let mut s = accept(&l)?;
                s.set_read_timeout(Some(STEP)).map_err(|e| e.to_string())?;
                s.set_write_timeout(Some(STEP)).map_err(|e| e.to_string())?;
                let theirs = read_all(&mut s, qps)?;
                let group = group.connect(&theirs, &rtr, &rts).map_err(e("connect"))?;
                write_all(&mut s, &ours)?;
                let mut done = [0u8; 5];
                s.read_exact(&mut done)
                    .map_err(|e| format!("read done: {e}"))?;
                (group, s)
            }
            Role::Client(to) => {
                let mut s = dial(to)?;
                s.set_read_timeout(Some(STEP)).map_err(|e| e.to_string())?;
                s.set_write_timeout(Some(STEP)).map_err(|e| e.to_string())?;
                write_all(&mut s, &ours)?;
                let theirs = read_all(&mut s, qps)?;
                s.write_all(b"done\0")
                    .map_err(|e| format!("write done: {e}"))?;
                (group.connect(&theirs, &rtr, &rts).map_err(e("connect"))?, s)
            }
        };
        let start = Instant::now();
        let mut pending = vec![RECV; qps];
        if client {
            for (p, pending) in pending.iter_mut().enumerate() {
                group.send(p, size).map_err(e("send"))?;
                *pending = SEND | RECV;
            }
        }
        let (mut rcnt, mut scnt) = (0, 0);
        let mut events = [GroupEvent::None; 16];
        while rcnt < iters || scnt < iters {
            let n = group.wait(&mut events, STEP).map_err(e("poll"))?;
            if n == 0 {
                return Err(format!(
                    "no completion in {STEP:?} ({rcnt} received, {scnt} sent)"
                ));
            }
            for ev in &events[..n] {
                let peer = match *ev {
                    GroupEvent::Sent { peer } => {
                        scnt += 1;
                        pending[peer] &= !SEND;
                        peer
                    }
                    GroupEvent::Received { peer, slot } => {
                        if slot.len as usize != size {
                            return Err(format!("a message of {} bytes from {peer}", slot.len));
                        }
                        group.release(slot).map_err(e("release"))?;
                        rcnt += 1;
                        pending[peer] &= !RECV;
                        peer
                    }
                    other => return Err(format!("{other:?}")),
                };
                if scnt < iters && pending[peer] == 0 {
                    group.send(peer, size).map_err(e("send"))?;
                    pending[peer] = SEND | RECV;
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        // Teardown: the peer may still wait for the acknowledgement of a send this side's
        // device received (the last round sends to every ready queue pair, a few past
        // `iters`); destroying the queue pairs now would leave it retrying into nothing
        // (RETRY_EXC_ERR). So the group lives until the peer is done too: each side shuts
        // its half of the stream and waits for the peer's. The C program closed its stream
        // after the exchange, so against it the wait ends at once.
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let _ = stream.read(&mut [0u8; 1]);
        let bytes = (size * iters * 2) as f64;
        println!(
            "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
            bytes * 8.0 / secs / 1e6
        );
        println!(
            "{iters} iters in {secs:.2} seconds = {:.2} usec/iter",
            secs * 1e6 / iters as f64
        );
        Ok(())
    }
}
