//! Remote-region exchange (`zverbs::tokio::Connection`) on the simulator, set up over TCP on
//! loopback: leases asked for, lent, written, read, handed back, dropped; refusals;
//! foreign tokens; a peer that goes away; strangers on the set-up port. A peer that breaks
//! the control protocol: `tests/async_remote_hostile.rs`.
#![cfg(all(feature = "sim", feature = "tokio"))]

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use zverbs::provider::sim::Sim;
use zverbs::tokio::{ConnectError, Connection, RemoteError};
use zverbs::{AccessFlags, ChannelConfig, Error};

const POOL: usize = 1 << 16;

fn cfg(timeout: Duration) -> ChannelConfig {
    ChannelConfig {
        timeout: Some(timeout),
        flush_grace: Duration::from_millis(50),
        ..ChannelConfig::default()
    }
}

/// A client on sim0 connected to a server on sim1, over TCP on 127.0.0.1.
async fn pair(sim: &Sim, cfg: &ChannelConfig) -> (Connection<Sim>, Connection<Sim>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (client, server) = tokio::join!(
        Connection::connect(sim, "sim0", addr, POOL, cfg),
        Connection::listen(sim, "sim1", &listener, POOL, cfg)
    );
    (client.unwrap(), server.unwrap())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Eight bytes of the peer's, writable.
async fn lease8(conn: &Connection<Sim>) -> zverbs::tokio::RemoteBuf<Sim> {
    conn.request_remote(8, AccessFlags::REMOTE_WRITE)
        .await
        .unwrap()
}

/// Waits (bounded) until `f` holds.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(5), "never: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The async-rdma README story: the client asks the server for a region, writes into it,
/// hands the token back; the server receives its own buffer with the bytes.
#[test]
fn request_write_and_hand_back() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let (client, server) = pair(&sim, &cfg(Duration::from_secs(5))).await;
        let remote = lease8(&client).await;
        assert_eq!(remote.len(), 8);
        assert_eq!(server.leases_out(), 1);
        let mut local = client.pool().alloc(8).unwrap();
        local.copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let (r, local) = client
            .channel()
            .write(local, &remote.region().slice(0..8).unwrap())
            .await;
        r.unwrap();
        client.send_remote(remote).await.unwrap();
        let back = server.receive_local().await.unwrap();
        assert_eq!(&back[..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(server.leases_out(), 0);
        drop((back, local));
    });
}

#[test]
fn lend_read_and_drop_the_token() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let (client, server) = pair(&sim, &cfg(Duration::from_secs(5))).await;
        let mut mine = server.pool().alloc(16).unwrap();
        mine.copy_from_slice(b"sixteen bytes!!!");
        server
            .send_local(mine, AccessFlags::REMOTE_READ)
            .await
            .unwrap();
        let remote = client.receive_remote().await.unwrap();
        let (r, got) = client
            .channel()
            .read(client.pool().alloc(16).unwrap(), &remote.region())
            .await;
        r.unwrap();
        assert_eq!(&got[..], b"sixteen bytes!!!");
        assert_eq!(server.leases_out(), 1);
        drop(remote);
        // The drop releases the lease: the server's buffer goes back to its pool, which
        // then holds only its control loop's two receive buffers.
        eventually("the lease released", || server.leases_out() == 0).await;
        eventually("the buffer freed", || {
            server.pool().stats().allocations == 2
        })
        .await;
    });
}

#[test]
fn an_ended_lease_is_no_longer_remotely_accessible() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let (client, server) = pair(&sim, &cfg(Duration::from_secs(5))).await;
        let remote = lease8(&client).await;
        let region = remote.region();
        client.send_remote(remote).await.unwrap();
        let _back = server.receive_local().await.unwrap();
        let (r, _) = client
            .channel()
            .write(client.pool().alloc(8).unwrap(), &region)
            .await;
        assert!(
            matches!(r, Err(Error::Completion(_))),
            "the registration is gone: {r:?}"
        );
    });
}

#[test]
fn refusals_are_typed_and_leave_nothing_behind() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let (client, server) = pair(&sim, &cfg(Duration::from_secs(5))).await;
        // Past the owner's pool.
        let r = client
            .request_remote(POOL as u64 * 2, AccessFlags::REMOTE_WRITE)
            .await;
        assert!(matches!(r, Err(RemoteError::Refused)), "{r:?}");
        // Rights a peer may not have, or none: refused before asking.
        let r = client.request_remote(8, AccessFlags::LOCAL_WRITE).await;
        assert!(matches!(r, Err(RemoteError::Refused)), "{r:?}");
        // The owner's pool full.
        let hog = server.pool().alloc(POOL / 2).unwrap();
        let hog2 = server.pool().alloc(POOL / 4).unwrap();
        let r = client
            .request_remote(POOL as u64 / 2, AccessFlags::REMOTE_WRITE)
            .await;
        assert!(matches!(r, Err(RemoteError::Exhausted)), "{r:?}");
        assert_eq!(server.leases_out(), 0);
        drop((hog, hog2));
        // And the connection still works.
        let ok = client.request_remote(8, AccessFlags::REMOTE_READ).await;
        assert!(ok.is_ok(), "{ok:?}");
    });
}

#[test]
fn a_token_of_another_connection_is_refused() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let c = cfg(Duration::from_secs(5));
        let (client, _server) = pair(&sim, &c).await;
        let (other, _other_server) = pair(&sim, &c).await;
        let token = lease8(&other).await;
        let r = client.send_remote(token).await;
        assert!(matches!(r, Err(RemoteError::ForeignToken)), "{r:?}");
    });
}

#[test]
fn a_dropped_peer_ends_its_leases_and_requests_fail_within_the_timeout() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let timeout = Duration::from_millis(300);
        let (client, server) = pair(&sim, &cfg(timeout)).await;
        let _remote = lease8(&client).await;
        let pool = server.pool().clone();
        // The lease and the control loop's two receive buffers (once the grant's own
        // message buffer is back: its send completes after the client has the grant).
        eventually("only the lease and the control buffers", || {
            pool.stats().allocations == 1 + 2
        })
        .await;
        drop(server);
        eventually("the owner's lease ended with its connection", || {
            pool.stats().allocations < 3
        })
        .await;
        let t0 = Instant::now();
        let r = client.request_remote(8, AccessFlags::REMOTE_WRITE).await;
        assert!(r.is_err(), "{r:?}");
        assert!(t0.elapsed() < 10 * timeout, "bounded: {:?}", t0.elapsed());
    });
}

#[test]
fn strangers_on_the_setup_port_get_typed_errors_within_the_timeout() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let timeout = Duration::from_millis(300);
        let c = cfg(timeout);
        // One sends garbage: refused after four bytes.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let garbage = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n").await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
        let r = Connection::listen(&sim, "sim1", &listener, POOL, &c).await;
        assert!(matches!(r, Err(ConnectError::Frame(_))), "{:?}", r.err());
        garbage.abort();
        // One connects and says nothing: the deadline.
        let silent = tokio::spawn(async move {
            let _s = TcpStream::connect(addr).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let t0 = Instant::now();
        let r = Connection::listen(&sim, "sim1", &listener, POOL, &c).await;
        assert!(matches!(r, Err(ConnectError::Timeout)), "{:?}", r.err());
        assert!(t0.elapsed() < 10 * timeout);
        silent.abort();
    });
}

/// The server's device crashes while the client holds a lease and waits for an offer: the
/// waiting future and the next request end with an error within the timeout (the control
/// queue pair's retries run out, or no answer comes), never a hang.
#[test]
fn a_crashed_peer_fails_every_pending_future_within_the_timeout() {
    runtime().block_on(async {
        let sim = Sim::with_devices(2);
        let timeout = Duration::from_millis(300);
        let (client, server) = pair(&sim, &cfg(timeout)).await;
        let lease = lease8(&client).await;
        let t0 = Instant::now();
        let waiting = client.receive_remote();
        sim.fabric().crash(1).unwrap();
        let region = lease.region();
        let (offer, request, write) = tokio::join!(
            waiting,
            client.request_remote(8, AccessFlags::REMOTE_WRITE),
            client
                .channel()
                .write(client.pool().alloc(8).unwrap(), &region)
        );
        assert!(offer.is_err(), "{offer:?}");
        assert!(request.is_err(), "{request:?}");
        assert!(write.0.is_err(), "{:?}", write.0);
        assert!(t0.elapsed() < 10 * timeout, "bounded: {:?}", t0.elapsed());
        drop((lease, server));
    });
}
