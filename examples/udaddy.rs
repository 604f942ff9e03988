//! rdma-core's `udaddy` client (`librdmacm/examples/udaddy.c`) on zverbs' public API:
//! resolves the datagram service at an address through the connection manager, sends it
//! ten 100-byte datagrams with the sending queue pair's number as immediate data (as
//! `udaddy` does), and receives its ten replies, each after its 40-byte header.
//!
//! ```text
//! cargo run --features sim --example udaddy                        # a server thread on the simulator
//! udaddy --backend verbs --client 169.254.77.1                     # against `udaddy -s 169.254.77.1`
//! ```
//!
//! Port 7174 (udaddy's), `--count` datagrams (its `-C`, default 10) of 100 bytes (`-S`).

mod backend;

use std::process::ExitCode;

use backend::{Args, Backend};

#[cfg(any(feature = "sim", feature = "verbs"))]
const PORT: u16 = 7174;
#[cfg(any(feature = "sim", feature = "verbs"))]
const SIZE: usize = 100;

fn main() -> ExitCode {
    backend::exit("udaddy", run())
}

fn run() -> Result<(), String> {
    let args = Args::parse(&["--client", "--count"])?;
    // Unused in a build without a backend, which only says which feature to enable.
    #[cfg_attr(not(any(feature = "sim", feature = "verbs")), allow(unused_variables))]
    let count = args.number("--count", 10)?;
    let backend: Backend = args.backend()?;
    match backend {
        #[cfg(feature = "sim")]
        Backend::Sim => {
            use zverbs::provider::sim::Sim;
            let sim = Sim::with_devices(2);
            let at = std::net::SocketAddr::new([10, 0, 0, 2].into(), PORT);
            std::thread::scope(|s| {
                let server = s.spawn(|| udp::serve(&sim, "sim1", at, count));
                let client = udp::client(&sim, "sim0", Some([10, 0, 0, 1].into()), at, count);
                client.and(
                    server
                        .join()
                        .unwrap_or_else(|_| Err("the server panicked".into())),
                )
            })
        }
        #[cfg(feature = "verbs")]
        Backend::Verbs => {
            use zverbs::provider::verbs::Verbs;
            let device = backend::verbs::device(args.value("--device"))?;
            let to = args.value("--client").ok_or("give --client ADDR")?;
            let to = to
                .parse::<std::net::IpAddr>()
                .map_err(|e| format!("{to}: {e}"))?;
            udp::client(
                &Verbs,
                &device,
                None,
                std::net::SocketAddr::new(to, PORT),
                count,
            )
        }
        #[allow(unreachable_patterns)]
        other => Err(other.not_compiled_in("udaddy")),
    }
}

#[cfg(any(feature = "sim", feature = "verbs"))]
mod udp {
    use std::net::{IpAddr, SocketAddr};
    use std::time::{Duration, Instant};

    use zverbs::channel::{PostedReceive, Scope};
    use zverbs::cm::resolve_datagram;
    #[cfg(feature = "sim")]
    use zverbs::cm::CmListener;
    use zverbs::provider::cm::{ConnectionManager, UD_QKEY};
    use zverbs::qp::{Ud, UdOptions};
    use zverbs::{AddressHandle, Channel, ChannelConfig, Context, Destination, LocalSliceMut, Op};

    use super::SIZE;

    const STEP: Duration = Duration::from_secs(20);
    /// Each received datagram lands after its 40-byte header.
    const GRH: usize = 40;
    /// Datagrams in flight at most (udaddy's `-C` up to this).
    const DEPTH: usize = 64;

    fn config() -> ChannelConfig {
        ChannelConfig {
            timeout: Some(STEP),
            ..ChannelConfig::default()
        }
    }

    fn opts() -> UdOptions {
        UdOptions {
            qkey: UD_QKEY,
            pkey_index: 0,
        }
    }

    /// `count` receives of a header and a datagram each, posted in `s` over `inbox`.
    fn receives<'env, P: ConnectionManager>(
        s: &mut Scope<'env, 'env, P, DEPTH, 1, Ud>,
        mut inbox: LocalSliceMut<'env>,
        count: usize,
    ) -> Result<Vec<PostedReceive>, zverbs::Error<P::Error>> {
        let mut posted = Vec::with_capacity(count);
        for _ in 0..count {
            let (one, rest) = inbox.split_at(GRH + SIZE)?;
            posted.push(s.post_receive([one])?);
            inbox = rest;
        }
        s.ring_doorbell()?;
        Ok(posted)
    }

    /// The client: `count` datagrams to the service at `to`, then its `count` replies.
    pub fn client<P: ConnectionManager>(
        provider: &P,
        device: &str,
        from: Option<IpAddr>,
        to: SocketAddr,
        count: usize,
    ) -> Result<(), String> {
        if count > DEPTH {
            return Err(format!("--count {count}: at most {DEPTH}"));
        }
        let ctx = Context::open(provider, device).map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let mut ch = Channel::<P, DEPTH, 1, Ud>::datagram(&ctx, &pd, &config(), &opts())
            .map_err(|e| e.to_string())?;
        let me = ch.queue_pair().qp_num();
        // A server started at the same moment may not listen yet: ask again while nobody
        // does.
        let since = Instant::now();
        let peer = loop {
            match resolve_datagram(provider, &ctx, from, to, b"", STEP) {
                Err(e) if e.nobody_listens() && since.elapsed() < STEP => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                r => break r.map_err(|e| format!("resolve {to}: {e}"))?,
            }
        };
        println!(
            "udaddy: resolved {to}: queue pair {}, Q_Key {:#x}",
            peer.peer.qp_num, peer.peer.qkey
        );
        let ah = AddressHandle::create(&pd, &peer.peer.ah).map_err(|e| e.to_string())?;
        let dest = Destination::new(&ah, peer.peer.qp_num, peer.peer.qkey);
        let mut msg = [b'u'; SIZE];
        let msg = pd.register(&mut msg).map_err(|e| e.to_string())?;
        let mut inbox = vec![0u8; count * (GRH + SIZE)];
        let mut inbox = pd.register(&mut inbox).map_err(|e| e.to_string())?;
        let got = ch
            .scope(|s| {
                // Every reply's receive first, then the datagrams.
                let posted = receives(s, inbox.slice_mut(..)?, count)?;
                for _ in 0..count {
                    s.post(Op::datagram_with_imm([msg.slice(..)?], &dest, me))?;
                }
                s.ring_doorbell()?;
                let mut got = 0;
                for r in posted {
                    let c = s.wait_receive(r)?;
                    if c.byte_len as usize == GRH + SIZE {
                        got += 1;
                    }
                }
                Ok(got)
            })
            .map_err(|e| format!("data transfers: {e}"))?;
        if got != count {
            return Err(format!("{got} of {count} replies were whole"));
        }
        println!("udaddy: {count} datagrams sent, {count} replies received");
        Ok(())
    }

    /// The server side on the simulator: answers the service request, receives `count`
    /// datagrams and replies to each sender (its queue pair in the immediate data).
    #[cfg(feature = "sim")]
    pub fn serve<P: ConnectionManager>(
        provider: &P,
        device: &str,
        at: SocketAddr,
        count: usize,
    ) -> Result<(), String> {
        let ctx = Context::open(provider, device).map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let listener = CmListener::bind_datagram(provider, at).map_err(|e| e.to_string())?;
        let mut ch = Channel::<P, DEPTH, 1, Ud>::datagram(&ctx, &pd, &config(), &opts())
            .map_err(|e| e.to_string())?;
        let mut inbox = vec![0u8; count * (GRH + SIZE)];
        let mut inbox = pd.register(&mut inbox).map_err(|e| e.to_string())?;
        let mut reply = [b'r'; SIZE];
        let reply = pd.register(&mut reply).map_err(|e| e.to_string())?;
        let qpn = ch.queue_pair().qp_num();
        ch.scope(|s| {
            let posted = receives(s, inbox.slice_mut(..)?, count)?;
            listener
                .answer_datagram(qpn, b"", STEP)
                .map_err(|_| zverbs::Error::InvalidAttribute("no service request"))?;
            let mut senders = Vec::with_capacity(count);
            for r in posted {
                let c = s.wait_receive(r)?;
                senders.push(c.imm.unwrap_or(c.src_qp));
            }
            Ok(senders)
        })
        .map_err(|e| format!("server: {e}"))
        .and_then(|senders| {
            // The path back to the client's device, sim0: LID 1, `::ffff:10.0.0.1`.
            let gid = zverbs::Gid(
                std::net::Ipv4Addr::new(10, 0, 0, 1)
                    .to_ipv6_mapped()
                    .octets(),
            );
            let back = zverbs::AhAttr::new(1, gid, 1, 1);
            let ah = AddressHandle::create(&pd, &back).map_err(|e| e.to_string())?;
            ch.scope(|s| {
                for &to in &senders {
                    let dest = Destination::new(&ah, to, UD_QKEY);
                    s.post(Op::datagram([reply.slice(..)?], &dest))?;
                }
                s.ring_doorbell()?;
                Ok(())
            })
            .map_err(|e| format!("replies: {e}"))
        })
    }
}
