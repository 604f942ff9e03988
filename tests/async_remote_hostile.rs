//! A hostile peer on a `Connection`'s control queue pair: the first message out of protocol
//! ends the connection at once (well within the timeout, not when the peer speaks again),
//! every lease lent to the peer is no longer remotely writable, waiting calls return the
//! protocol error, and nothing the peer sends afterwards is acted on.
//!
//! The rogue speaks the set-up correctly by hand, then sends raw control messages.
#![cfg(all(feature = "sim", feature = "tokio"))]

mod common;

use std::time::{Duration, Instant};

use common::rt::multi_thread as runtime;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use zverbs::bootstrap::encode_frame;
use zverbs::provider::sim::Sim;
use zverbs::tokio::{AsyncChannel, Connection, RemoteError, WireError};
use zverbs::{
    AccessFlags, ChannelConfig, Context, Endpoint, Error, LocalBuf, MrPool, RemoteRegion, WcStatus,
};

const POOL: usize = 1 << 16;
/// The connection's timeout: every protocol error must come long before it.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How soon "at once" must be: a hundredth of the timeout (the error came in 10 µs to
/// 5 ms in debug builds here).
const AT_ONCE: Duration = Duration::from_millis(100);

fn cfg() -> ChannelConfig {
    ChannelConfig {
        timeout: Some(TIMEOUT),
        flush_grace: Duration::from_millis(50),
        ..ChannelConfig::default()
    }
}

/// A control message, as `tokio/wire.rs` lays it out (40 bytes, big-endian).
#[derive(Clone, Copy, Default)]
struct Raw {
    kind: u8,
    id: u32,
    lease: u32,
    addr: u64,
    len: u64,
    rkey: u32,
    access: u32,
}

const REQUEST: u8 = 1;
const GRANT: u8 = 2;
const GIVE: u8 = 4;
const RETURN: u8 = 5;

impl Raw {
    fn encode(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[0..4].copy_from_slice(b"ZVRX");
        b[4] = 1;
        b[5] = self.kind;
        b[8..12].copy_from_slice(&self.id.to_be_bytes());
        b[12..16].copy_from_slice(&self.lease.to_be_bytes());
        b[16..24].copy_from_slice(&self.addr.to_be_bytes());
        b[24..32].copy_from_slice(&self.len.to_be_bytes());
        b[32..36].copy_from_slice(&self.rkey.to_be_bytes());
        b[36..40].copy_from_slice(&self.access.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Raw {
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        Raw {
            kind: b[5],
            id: u32_at(8),
            lease: u32_at(12),
            addr: u64_at(16),
            len: u64_at(24),
            rkey: u32_at(32),
            access: u32_at(36),
        }
    }
}

/// The rogue's end: its data and control channels on sim1, its pool, the set-up socket.
struct Rogue {
    data: AsyncChannel<Sim>,
    ctrl: AsyncChannel<Sim, LocalBuf<Sim>, 16, 1>,
    pool: MrPool<Sim>,
    _tcp: TcpStream,
}

impl Rogue {
    async fn send(&self, bytes: &[u8]) {
        let mut b = self.pool.alloc(bytes.len()).unwrap();
        b.copy_from_slice(bytes);
        self.ctrl.send(b).await.0.unwrap();
    }

    async fn send_msg(&self, m: Raw) {
        self.send(&m.encode()).await;
    }

    async fn receive(&self) -> Raw {
        let (r, b) = self.ctrl.receive(self.pool.alloc(40).unwrap()).await;
        r.unwrap();
        Raw::decode(&b[..])
    }

    /// Writes 8 bytes into `region` over the data queue pair.
    async fn write(&self, region: RemoteRegion) -> Result<(), Error<zverbs_sim::SimError>> {
        let b = self.pool.alloc(8).unwrap();
        self.data.write(b, &region).await.0
    }
}

/// A victim `Connection` on sim0 and a rogue that set it up by hand.
async fn victim_and_rogue(sim: &Sim) -> (Connection<Sim>, Rogue) {
    let c = cfg();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rogue = async {
        let ctx = Box::leak(Box::new(Context::open(sim, "sim1").unwrap()));
        let pd = Box::leak(Box::new(ctx.alloc_pd().unwrap()));
        let data = AsyncChannel::<Sim>::prepare(ctx, pd, &c).unwrap();
        let ctrl = AsyncChannel::<Sim, LocalBuf<Sim>, 16, 1>::prepare(ctx, pd, &c).unwrap();
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut mine = data.endpoint().encode().to_vec();
        mine.extend_from_slice(&ctrl.endpoint().encode());
        let mut frame = Vec::new();
        encode_frame(0, &mine, &mut frame).unwrap();
        s.write_all(&frame).await.unwrap();
        let mut theirs = vec![0u8; frame.len()];
        s.read_exact(&mut theirs).await.unwrap();
        let (d, k) = (&theirs[14..48], &theirs[48..82]);
        let data = data.connect(&Endpoint::decode(d).unwrap()).unwrap();
        let ctrl = ctrl.connect(&Endpoint::decode(k).unwrap()).unwrap();
        // The readiness round: say ready, read theirs.
        frame.clear();
        encode_frame(0, &[1], &mut frame).unwrap();
        s.write_all(&frame).await.unwrap();
        let mut ready = vec![0u8; frame.len()];
        s.read_exact(&mut ready).await.unwrap();
        Rogue {
            data: AsyncChannel::new(data).unwrap(),
            ctrl: AsyncChannel::new(ctrl).unwrap(),
            pool: MrPool::new(pd, 1 << 16).unwrap(),
            _tcp: s,
        }
    };
    let (rogue, victim) = tokio::join!(rogue, Connection::listen(sim, "sim0", &listener, POOL, &c));
    (victim.unwrap(), rogue)
}

/// The victim lends the rogue 8 writable bytes; the region, after checking that the rogue
/// can write it.
async fn lend8(victim: &Connection<Sim>, rogue: &Rogue) -> RemoteRegion {
    let buf = victim.pool().alloc(8).unwrap();
    let (sent, give) = tokio::join!(
        victim.send_local(buf, AccessFlags::REMOTE_WRITE),
        rogue.receive()
    );
    sent.unwrap();
    assert_eq!(give.kind, GIVE);
    let region = RemoteRegion {
        addr: give.addr,
        len: give.len,
        rkey: give.rkey,
    };
    rogue.write(region).await.unwrap();
    region
}

/// What every hostile sequence must end in: the lease gone, the lent memory no longer
/// writable, later calls failing with the protocol error.
async fn assert_torn_down(victim: &Connection<Sim>, rogue: &Rogue, lent: RemoteRegion) {
    assert_eq!(victim.leases_out(), 0, "every lease ended");
    let w = rogue.write(lent).await;
    assert!(
        matches!(&w, Err(Error::Completion(c)) if c.status == WcStatus::RemAccessErr),
        "the lent memory is no longer remotely writable: {w:?}"
    );
    let r = victim.request_remote(8, AccessFlags::REMOTE_WRITE).await;
    assert!(matches!(r, Err(RemoteError::Protocol(_))), "{r:?}");
}

/// Waits on `receive_remote` while `act` runs; the error it ends in, and how long after
/// `act` finished.
async fn waiting_through(
    victim: &Connection<Sim>,
    act: impl std::future::Future<Output = ()>,
) -> (RemoteError<zverbs_sim::SimError>, Duration) {
    let waiting = victim.receive_remote();
    tokio::pin!(waiting);
    // Start waiting first.
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut waiting)
            .await
            .is_err(),
        "nothing offered yet"
    );
    act.await;
    let t0 = Instant::now();
    let r = waiting.await;
    (r.expect_err("no lease was offered"), t0.elapsed())
}

/// `msg` from the rogue, with 8 bytes lent and a request waiting: the waiting request fails
/// at once with an error `want` accepts, and the connection is torn down.
fn ends_at_once(msg: Raw, want: impl Fn(&RemoteError<zverbs_sim::SimError>) -> bool) {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let (victim, rogue) = victim_and_rogue(&sim).await;
        let lent = lend8(&victim, &rogue).await;
        let (e, took) = waiting_through(&victim, rogue.send_msg(msg)).await;
        assert!(want(&e), "{e:?}");
        assert!(took < AT_ONCE, "at once, not at the timeout: {took:?}");
        assert_torn_down(&victim, &rogue, lent).await;
    });
}

#[test]
fn a_return_of_a_lease_not_out_then_silence() {
    let bad = Raw {
        kind: RETURN,
        lease: 99,
        ..Raw::default()
    };
    ends_at_once(bad, |e| {
        matches!(e, RemoteError::Protocol(WireError::Lease(99)))
    });
}

#[test]
fn an_unsolicited_grant() {
    let grant = Raw {
        kind: GRANT,
        id: 7,
        len: 8,
        ..Raw::default()
    };
    ends_at_once(grant, |e| {
        matches!(e, RemoteError::Protocol(WireError::Unexpected(2)))
    });
}

/// A grant of 1 TiB for an 8-byte request ends the connection; a `Give` sent after it is
/// not acted on.
#[test]
fn a_grant_beyond_the_request_then_a_give() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let (victim, rogue) = victim_and_rogue(&sim).await;
        let lent = lend8(&victim, &rogue).await;
        let answer = async {
            let req = rogue.receive().await;
            assert_eq!((req.kind, req.len), (REQUEST, 8));
            let grant = Raw {
                kind: GRANT,
                id: req.id,
                len: 1 << 40,
                ..Raw::default()
            };
            rogue.send_msg(grant).await;
            Instant::now()
        };
        let asking = victim.request_remote(8, AccessFlags::REMOTE_WRITE);
        let (r, sent) = tokio::join!(asking, answer);
        let took = sent.elapsed();
        assert!(
            matches!(
                r,
                Err(RemoteError::Protocol(WireError::Granted {
                    asked: 8,
                    granted: 0x100_0000_0000
                }))
            ),
            "{r:?}"
        );
        assert!(took < AT_ONCE, "at once: {took:?}");
        // The peer goes on: a lease offered after the teardown is not taken.
        let give = Raw {
            kind: GIVE,
            lease: 1,
            addr: 0x1000,
            len: 8,
            rkey: 1,
            ..Raw::default()
        };
        rogue.send_msg(give).await;
        let r = victim.receive_remote().await;
        assert!(matches!(r, Err(RemoteError::Protocol(_))), "{r:?}");
        assert_torn_down(&victim, &rogue, lent).await;
    });
}

/// A call still waiting for its control message to be taken (the rogue posts no receive)
/// fails with the protocol error once the rogue breaks the protocol, not at its timeout.
#[test]
fn a_pending_send_fails_with_the_protocol_error() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let (victim, rogue) = victim_and_rogue(&sim).await;
        let buf = victim.pool().alloc(8).unwrap();
        let offering = victim.send_local(buf, AccessFlags::REMOTE_READ);
        let bad = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            rogue.send(&[0x5a; 40]).await;
            Instant::now()
        };
        let (r, sent) = tokio::join!(offering, bad);
        let took = sent.elapsed();
        assert!(
            matches!(r, Err(RemoteError::Protocol(WireError::Magic(_)))),
            "{r:?}"
        );
        assert!(took < AT_ONCE, "at once, not at the timeout: {took:?}");
        assert_eq!(victim.leases_out(), 0);
    });
}

/// Bytes that are no control message (a bad magic) end the connection as well.
#[test]
fn a_malformed_control_message() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let (victim, rogue) = victim_and_rogue(&sim).await;
        let lent = lend8(&victim, &rogue).await;
        let (e, took) = waiting_through(&victim, rogue.send(&[0x5a; 40])).await;
        assert!(
            matches!(e, RemoteError::Protocol(WireError::Magic(_))),
            "{e:?}"
        );
        assert!(took < AT_ONCE, "{took:?}");
        assert_torn_down(&victim, &rogue, lent).await;
    });
}

/// Another connection of the same process is untouched by one peer's violation.
#[test]
fn other_connections_are_untouched() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let (victim, rogue) = victim_and_rogue(&sim).await;
        let (other, other_rogue) = victim_and_rogue(&sim).await;
        let other_lent = lend8(&other, &other_rogue).await;
        rogue.send(&[0; 40]).await;
        let r = victim.receive_remote().await;
        assert!(matches!(r, Err(RemoteError::Protocol(_))), "{r:?}");
        assert_eq!(other.leases_out(), 1);
        other_rogue.write(other_lent).await.unwrap();
    });
}
