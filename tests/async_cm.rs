//! `tokio::Connection` through the connection manager on the simulator: a connection made
//! by `connect_cm` / `accept_cm` lends and writes memory as one made over TCP does; a
//! stranger's connect request is rejected with a reason and the accepting side takes the
//! next; nobody listening is a typed error within the timeout.
#![cfg(all(feature = "sim", feature = "tokio"))]

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::rt::{config, multi_thread};
use zverbs::cm::{CmConnection, CmError, CmListener};
use zverbs::provider::cm::{REJECT_CONSUMER, REJECT_NO_LISTENER};
use zverbs::provider::sim::Sim;
use zverbs::tokio::{ConnectError, Connection};
use zverbs::{AccessFlags, ChannelConfig, Context};

const POOL: usize = 1 << 16;
const T: Duration = Duration::from_secs(5);

fn cfg() -> ChannelConfig {
    config(T)
}

fn ip(dev: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, dev + 1])
}

#[test]
fn a_connection_made_through_the_manager_lends_and_writes() {
    multi_thread().block_on(async {
        let sim = Sim::with_devices(2);
        let at = SocketAddr::new(ip(1), 7480);
        let listener = Arc::new(CmListener::bind(&sim, at).unwrap());
        let cfg = cfg();
        let (client, server) = tokio::join!(
            Connection::connect_cm(&sim, "sim0", Some(ip(0)), at, POOL, &cfg),
            Connection::accept_cm(&sim, "sim1", &listener, POOL, &cfg)
        );
        let (client, server) = (client.unwrap(), server.unwrap());
        let remote = client
            .request_remote(8, AccessFlags::REMOTE_WRITE)
            .await
            .unwrap();
        let mut local = client.pool().alloc(8).unwrap();
        local.copy_from_slice(b"via CM!!");
        let (r, _local) = client
            .channel()
            .write(local, &remote.region().slice(0..8).unwrap())
            .await;
        r.unwrap();
        client.send_remote(remote).await.unwrap();
        assert_eq!(&server.receive_local().await.unwrap()[..], b"via CM!!");
    });
}

#[test]
fn a_stranger_is_rejected_and_the_next_request_accepted() {
    multi_thread().block_on(async {
        let sim = Sim::with_devices(2);
        let at = SocketAddr::new(ip(1), 7481);
        let listener = Arc::new(CmListener::bind(&sim, at).unwrap());
        let server = tokio::spawn({
            let (sim, listener) = (sim.clone(), listener.clone());
            async move { Connection::accept_cm(&sim, "sim1", &listener, POOL, &cfg()).await }
        });
        let stranger = tokio::task::spawn_blocking({
            let sim = sim.clone();
            move || {
                let ctx = Context::open(&sim, "sim0").unwrap();
                let pd = ctx.alloc_pd().unwrap();
                let r = CmConnection::<Sim>::connect(
                    &sim,
                    &ctx,
                    &pd,
                    Some(ip(0)),
                    at,
                    b"GET / HTTP/1.1",
                    &cfg(),
                    T,
                );
                match r {
                    Err(CmError::Rejected {
                        status,
                        private_data,
                    }) => (status, private_data.starts_with(b"ZVTC?")),
                    other => panic!("{:?}", other.map(|_| ())),
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(stranger, (REJECT_CONSUMER, true));
        let client = Connection::connect_cm(&sim, "sim0", Some(ip(0)), at, POOL, &cfg())
            .await
            .unwrap();
        let server = server.await.unwrap().unwrap();
        let lease = server
            .request_remote(8, AccessFlags::REMOTE_WRITE)
            .await
            .unwrap();
        assert_eq!(lease.len(), 8);
        drop((lease, client));
    });
}

#[test]
fn nobody_listening_is_a_typed_error_within_the_timeout() {
    multi_thread().block_on(async {
        let sim = Sim::with_devices(2);
        let start = Instant::now();
        let at = SocketAddr::new(ip(1), 7482);
        let r = Connection::connect_cm(&sim, "sim0", Some(ip(0)), at, POOL, &cfg()).await;
        assert!(
            matches!(
                r,
                Err(ConnectError::Cm(CmError::Rejected {
                    status: REJECT_NO_LISTENER,
                    ..
                }))
            ),
            "{:?}",
            r.map(|_| ())
        );
        assert!(start.elapsed() < 10 * T);
    });
}
