//! rdma-core's `udaddy` (`librdmacm/examples/udaddy.c`) on zverbs' public API. The client
//! resolves the datagram service at an address through the connection manager, sends it
//! ten 100-byte datagrams with the sending queue pair's number as immediate data (as
//! `udaddy` does), and receives its ten replies, each after its 40-byte header. The
//! server answers the service request with its queue pair, receives the ten and replies
//! to each where it came from: the sender's GID in the datagram's header, its queue pair
//! in the immediate data (`udaddy`'s `ibv_create_ah_from_wc`).
//!
//! ```text
//! cargo run --features sim --example udaddy                        # both, on the simulator
//! udaddy --backend verbs --client 169.254.77.1                     # against `udaddy -b 169.254.77.1`
//! udaddy --backend verbs --server 169.254.77.1                     # for `udaddy -s 169.254.77.1`
//! ```
//!
//! Port 7174 (udaddy's), `--count` datagrams (its `-C`, default 10) of 100 bytes (`-S`).

mod backend;

use std::process::ExitCode;

use backend::ClientServer;

#[cfg(any(feature = "sim", feature = "verbs"))]
const SIZE: usize = 100;

fn main() -> ExitCode {
    backend::run::<Udaddy>()
}

struct Udaddy;

impl ClientServer for Udaddy {
    const NAME: &'static str = "udaddy";
    const ABOUT: &'static str = "rdma-core's udaddy on zverbs: a datagram service resolved \
        through the connection manager, 100-byte datagrams sent and answered";
    const PORT: u16 = 7174;

    #[cfg(feature = "sim")]
    fn sim(at: &backend::SimRoles<'_>, count: usize) -> Result<(), String> {
        backend::side_by_side(
            || udp::serve(at.sim, "sim1", at.server, count),
            || udp::client(at.sim, "sim0", Some(at.from), at.server, count),
        )
    }

    #[cfg(feature = "verbs")]
    fn verbs(device: &str, role: backend::Role, count: usize) -> Result<(), String> {
        use zverbs::provider::verbs::Verbs;
        match role {
            backend::Role::Client(to) => udp::client(&Verbs, device, None, to, count),
            backend::Role::Server(at) => udp::serve(&Verbs, device, at, count),
        }
    }
}

#[cfg(any(feature = "sim", feature = "verbs"))]
mod udp {
    use std::net::{IpAddr, SocketAddr};
    use std::time::{Duration, Instant};

    use zverbs::channel::{PostedReceive, Scope};
    use zverbs::cm::resolve_datagram;
    use zverbs::cm::CmListener;
    use zverbs::provider::cm::{ConnectionManager, UD_QKEY};
    use zverbs::qp::{reply_path, Ud, UdOptions, GRH_BYTES as GRH};
    use zverbs::{AddressHandle, Channel, ChannelConfig, Completion, Context, Destination};
    use zverbs::{LocalSliceMut, Op};

    use super::SIZE;

    const STEP: Duration = Duration::from_secs(20);
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

    /// The server: answers the service request at `at`, receives `count` datagrams and
    /// replies to each where it came from (its header's source GID, or the sender's LID
    /// without one; the queue pair in its immediate data, else its source).
    pub fn serve<P: ConnectionManager>(
        provider: &P,
        device: &str,
        at: SocketAddr,
        count: usize,
    ) -> Result<(), String> {
        let ctx = Context::open(provider, device).map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let listener = CmListener::bind_datagram(provider, at).map_err(|e| e.to_string())?;
        println!("udaddy: serving {at}");
        let mut ch = Channel::<P, DEPTH, 1, Ud>::datagram(&ctx, &pd, &config(), &opts())
            .map_err(|e| e.to_string())?;
        let mut inbox = vec![0u8; count * (GRH + SIZE)];
        let mut inbox = pd.register(&mut inbox).map_err(|e| e.to_string())?;
        let mut reply = [b'r'; SIZE];
        let reply = pd.register(&mut reply).map_err(|e| e.to_string())?;
        let qpn = ch.queue_pair().qp_num();
        let got: Vec<Completion> = ch
            .scope(|s| {
                let posted = receives(s, inbox.slice_mut(..)?, count)?;
                listener
                    .answer_datagram(qpn, b"", STEP)
                    .map_err(|_| zverbs::Error::InvalidAttribute("no service request"))?;
                posted.into_iter().map(|r| s.wait_receive(r)).collect()
            })
            .map_err(|e| format!("server: {e}"))?;
        let port = ch.queue_pair().port();
        let headers = inbox.as_slice().chunks(GRH + SIZE);
        let mut back = Vec::with_capacity(count);
        for (c, slot) in got.iter().zip(headers) {
            let grh = slot.first_chunk::<GRH>().filter(|_| c.grh);
            let path = reply_path(&ctx, port, grh, c.slid, c.sl).map_err(|e| e.to_string())?;
            let ah = AddressHandle::create(&pd, &path).map_err(|e| e.to_string())?;
            back.push((ah, c.imm.unwrap_or(c.src_qp)));
        }
        ch.scope(|s| {
            for (ah, to) in &back {
                let dest = Destination::new(ah, *to, UD_QKEY);
                s.post(Op::datagram([reply.slice(..)?], &dest))?;
            }
            s.ring_doorbell()?;
            Ok(())
        })
        .map_err(|e| format!("replies: {e}"))?;
        println!("udaddy: {count} datagrams received, {count} replies sent");
        Ok(())
    }
}
