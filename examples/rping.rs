//! rdma-core's `rping` (`librdmacm/examples/rping.c`) on zverbs' public API, in either
//! role, talking to the C program or to itself: connection through the connection
//! manager, then per ping the client SENDs its source buffer's address, key and size; the
//! server RDMA READs it and SENDs a go-ahead; the client SENDs its sink buffer's; the
//! server RDMA WRITEs what it read there and SENDs a go-ahead; the client checks that the
//! sink holds the source. The advertisements are rping's `struct rping_rdma_info`: a
//! big-endian 64-bit address, 32-bit key and 32-bit size.
//!
//! ```text
//! cargo run --features sim --example rping                        # both roles, simulator
//! rping --backend verbs --server 169.254.77.1 [--count 10]        # against `rping -c -a ... -V`
//! rping --backend verbs --client 169.254.77.1 [--count 10]        # against `rping -s -a ...`
//! ```
//!
//! Port 7174 (rping's), buffers of 64 bytes (its default `-S`). Each rank prints one line
//! per ping, as `rping -v` does, and exits 0 only if every ping was checked.

mod backend;

use std::process::ExitCode;

use backend::ClientServer;

/// rping's buffer size (its `-S` default; its port, `-p`, is [`Rping::PORT`]).
#[cfg(any(feature = "sim", feature = "verbs"))]
const SIZE: usize = 64;

fn main() -> ExitCode {
    backend::run::<Rping>()
}

struct Rping;

impl ClientServer for Rping {
    const NAME: &'static str = "rping";
    const ABOUT: &'static str = "rdma-core's rping on zverbs: connection through the \
        connection manager, then per ping an RDMA READ of the client's source and an RDMA \
        WRITE into its sink, checked";
    const PORT: u16 = 7174;

    /// The listener is bound before either side starts, so the client finds it.
    #[cfg(feature = "sim")]
    fn sim(at: &backend::SimRoles<'_>, count: usize) -> Result<(), String> {
        let listener =
            zverbs::cm::CmListener::bind(at.sim, at.server).map_err(|e| e.to_string())?;
        backend::side_by_side(
            || ping::serve(at.sim, "sim1", &listener, count),
            || ping::client(at.sim, "sim0", Some(at.from), at.server, count),
        )
    }

    #[cfg(feature = "verbs")]
    fn verbs(device: &str, role: backend::Role, count: usize) -> Result<(), String> {
        use zverbs::provider::verbs::Verbs;
        match role {
            backend::Role::Server(at) => {
                let listener =
                    zverbs::cm::CmListener::bind(&Verbs, at).map_err(|e| e.to_string())?;
                ping::serve(&Verbs, device, &listener, count)
            }
            backend::Role::Client(to) => ping::client(&Verbs, device, None, to, count),
        }
    }
}

#[cfg(any(feature = "sim", feature = "verbs"))]
mod ping {
    use std::net::{IpAddr, SocketAddr};
    use std::time::{Duration, Instant};

    use zverbs::cm::{CmConnection, CmListener};
    use zverbs::provider::cm::ConnectionManager;
    use zverbs::{AccessFlags, ChannelConfig, Context, RemoteRegion};

    use super::SIZE;

    /// One wait for the peer: long enough for an emulated guest.
    const STEP: Duration = Duration::from_secs(20);

    /// `struct rping_rdma_info`: address, key and size, big-endian.
    fn info(r: &RemoteRegion) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&r.addr.to_be_bytes());
        b[8..12].copy_from_slice(&r.rkey.to_be_bytes());
        b[12..].copy_from_slice(&(r.len as u32).to_be_bytes());
        b
    }

    fn region_of(b: &[u8]) -> Result<RemoteRegion, String> {
        let field = |r: std::ops::Range<usize>| b.get(r).ok_or("a short advertisement");
        Ok(RemoteRegion {
            addr: u64::from_be_bytes(field(0..8)?.try_into().map_err(|_| "addr")?),
            rkey: u32::from_be_bytes(field(8..12)?.try_into().map_err(|_| "rkey")?),
            len: u64::from(u32::from_be_bytes(
                field(12..16)?.try_into().map_err(|_| "size")?,
            )),
        })
    }

    /// rping's message for ping `n`: its text, then letters cycling from `start`, the last
    /// byte 0.
    fn message(n: usize, start: u8, out: &mut [u8]) {
        let text = format!("rdma-ping-{n}: ");
        let cc = text.len().min(out.len());
        out[..cc].copy_from_slice(&text.as_bytes()[..cc]);
        let mut c = start;
        for b in &mut out[cc..] {
            *b = c;
            c = if c >= 122 { 65 } else { c + 1 };
        }
        if let Some(last) = out.last_mut() {
            *last = 0;
        }
    }

    fn config() -> ChannelConfig {
        ChannelConfig {
            timeout: Some(STEP),
            ..ChannelConfig::default()
        }
    }

    /// The client: `count` pings to the server at `to`, each checked.
    pub fn client<P: ConnectionManager>(
        provider: &P,
        device: &str,
        from: Option<IpAddr>,
        to: SocketAddr,
        count: usize,
    ) -> Result<(), String> {
        let ctx = Context::open(provider, device).map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let (mut start_buf, mut sink, mut adv, mut ack) =
            ([0u8; SIZE], [0u8; SIZE], [0u8; 16], [0u8; 16]);
        // A server started at the same moment may not listen yet: try again while
        // nobody does.
        let since = Instant::now();
        let mut conn = loop {
            match CmConnection::<P, 64, 4>::connect(
                provider,
                &ctx,
                &pd,
                from,
                to,
                b"",
                &config(),
                STEP,
            ) {
                Err(e) if e.nobody_listens() && since.elapsed() < STEP => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                r => break r.map_err(|e| format!("connect to {to}: {e}"))?,
            }
        };
        // SAFETY: the source is written only between pings, when the server is done
        // reading it (it said go ahead).
        let mut start_mr = unsafe {
            pd.register_with_access(
                &mut start_buf,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            )
        }
        .map_err(|e| e.to_string())?;
        // SAFETY: the sink is read only after the server said its write is done.
        let sink_mr = unsafe {
            pd.register_with_access(
                &mut sink,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
        }
        .map_err(|e| e.to_string())?;
        let mut adv_mr = pd.register(&mut adv).map_err(|e| e.to_string())?;
        let mut ack_mr = pd.register(&mut ack).map_err(|e| e.to_string())?;
        let mut start = 65u8;
        for n in 0..count {
            // Between pings the server touches neither buffer (register_with_access above).
            message(n, start, start_mr.as_mut_slice());
            start = if start >= 122 { 65 } else { start + 1 };
            // Source, then sink: each advertisement answered by a go-ahead, whose receive
            // is posted first.
            for mr in [start_mr.remote(), sink_mr.remote()] {
                adv_mr.as_mut_slice().copy_from_slice(&info(&mr));
                conn.channel()
                    .scope(|s| {
                        let go = s.post_receive([ack_mr.slice_mut(..)?])?;
                        s.post_send([adv_mr.slice(..)?])?;
                        s.wait_receive(go).map(drop)
                    })
                    .map_err(|e| format!("ping {n}: {e}"))?;
            }
            if sink_mr.as_slice() != start_mr.as_slice() {
                return Err(format!("ping {n}: data mismatch"));
            }
            let text = &sink_mr.as_slice()[..SIZE - 1];
            println!("ping data: {}", String::from_utf8_lossy(text));
        }
        conn.disconnect(STEP).map(drop).map_err(|e| e.to_string())
    }

    /// The server: accepts one client, serves its `count` pings (rping's `-C`), then waits
    /// for it to disconnect.
    pub fn serve<P: ConnectionManager>(
        provider: &P,
        device: &str,
        listener: &CmListener<P>,
        count: usize,
    ) -> Result<(), String> {
        let ctx = Context::open(provider, device).map_err(|e| e.to_string())?;
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let (mut buf, mut adv, mut go) = ([0u8; SIZE], [0u8; 16], [0u8; 16]);
        let mut conn = listener
            .accept::<64, 4>(&ctx, &pd, &config(), STEP)
            .map_err(|e| format!("accept: {e}"))?;
        let mut buf_mr = pd.register(&mut buf).map_err(|e| e.to_string())?;
        let mut adv_mr = pd.register(&mut adv).map_err(|e| e.to_string())?;
        let go_mr = pd.register(&mut go).map_err(|e| e.to_string())?;
        // The first advertisement; each later one comes after a go-ahead.
        let first = adv_mr.slice_mut(..).map_err(|e| e.to_string())?;
        conn.channel()
            .receive([first])
            .map_err(|e| format!("receive: {e}"))?;
        for n in 0..count {
            let source = region_of(adv_mr.as_slice())?;
            let len = (source.len as usize).min(SIZE);
            conn.channel()
                .read(
                    [buf_mr.slice_mut(..len).map_err(|e| e.to_string())?],
                    &source,
                )
                .map_err(|e| format!("read: {e}"))?;
            let text = buf_mr.as_slice();
            let text = &text[..text.iter().position(|&b| b == 0).unwrap_or(len)];
            if !text.starts_with(format!("rdma-ping-{n}: ").as_bytes()) {
                return Err(format!(
                    "ping {n}: read {:?}",
                    String::from_utf8_lossy(text)
                ));
            }
            println!("server ping data: {}", String::from_utf8_lossy(text));
            let sink = go_ahead(&mut conn, &go_mr, Some(&mut adv_mr))?;
            let sink = sink.ok_or("no sink advertised")?;
            // What was read, up to and with its NUL (rping: strlen + 1).
            let k = (text.len() + 1).min(len);
            conn.channel()
                .write([buf_mr.slice(..k).map_err(|e| e.to_string())?], &sink)
                .map_err(|e| format!("write: {e}"))?;
            let last = n + 1 == count;
            go_ahead(&mut conn, &go_mr, (!last).then_some(&mut adv_mr))?;
        }
        let start = Instant::now();
        while !conn.peer_disconnected().map_err(|e| e.to_string())? {
            if start.elapsed() > STEP {
                return Err("the client did not disconnect".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Says go ahead, and takes the next advertisement into `next` if one is due.
    fn go_ahead<P: ConnectionManager>(
        conn: &mut CmConnection<P, 64, 4>,
        go: &zverbs::MemoryRegion<'_, P>,
        next: Option<&mut zverbs::MemoryRegion<'_, P>>,
    ) -> Result<Option<RemoteRegion>, String> {
        let Some(next) = next else {
            let go = go.slice(..).map_err(|e| e.to_string())?;
            conn.channel()
                .send([go])
                .map_err(|e| format!("go ahead: {e}"))?;
            return Ok(None);
        };
        conn.channel()
            .scope(|s| {
                let adv = s.post_receive([next.slice_mut(..)?])?;
                s.post_send([go.slice(..)?])?;
                s.wait_receive(adv).map(drop)
            })
            .map_err(|e| format!("go ahead: {e}"))?;
        region_of(next.as_slice()).map(Some)
    }
}
