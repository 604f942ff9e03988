//! `AsyncRpc` on the simulator: calls awaited on current-thread and multi-thread runtimes,
//! many at once, cancelled ones, and a server that vanishes.
#![cfg(all(feature = "sim", feature = "tokio"))]

use std::time::Duration;

use zverbs::provider::sim::Sim;
use zverbs::rpc::{BulkConfig, BulkFailure, Config, EngineConfig, EngineError, Rpc, RpcError};
use zverbs::tokio::AsyncRpc;
use zverbs::Context;

const ECHO: u8 = 1;

fn cfg() -> EngineConfig {
    EngineConfig {
        core: Config {
            max_sessions: 4,
            max_msg_size: 128 << 10,
            session_timeout_ns: 100_000_000,
            ..Config::default()
        },
        events: true,
        ..EngineConfig::default()
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn engine(sim: &Sim, dev: &str) -> Rpc<Sim> {
    let ctx = Context::open(sim, dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut rpc = Rpc::new(&ctx, pd, cfg()).unwrap();
    rpc.register_handler(ECHO, |req, out| {
        out[..req.len()].copy_from_slice(req);
        req.len()
    })
    .unwrap();
    rpc
}

async fn pair(sim: &Sim) -> (AsyncRpc<Sim>, AsyncRpc<Sim>, zverbs::rpc::SessionId) {
    let server = AsyncRpc::new(engine(sim, "sim1")).unwrap();
    let client = AsyncRpc::new(engine(sim, "sim0")).unwrap();
    let session = client.connect(&server.addr()).await.unwrap();
    (client, server, session)
}

fn echo_many(rt: tokio::runtime::Runtime) {
    rt.block_on(async {
        let sim = Sim::with_devices(2);
        let (client, _server, s) = pair(&sim).await;
        let (r, buf) = client.call(s, ECHO, b"hello", Vec::new()).await;
        r.unwrap();
        assert_eq!(buf, b"hello");
        let big: Vec<u8> = (0..100_000).map(|i| i as u8).collect();
        let (r, buf) = client.call(s, ECHO, &big, buf).await;
        r.unwrap();
        assert_eq!(buf, big);
        // Eight at once (the window), each its own bytes.
        let calls = (0..8u8).map(|i| {
            let c = client.clone();
            async move { c.call(s, ECHO, &[i; 64], Vec::with_capacity(64)).await }
        });
        let results = futures_join(calls.collect()).await;
        for (i, (r, buf)) in results.into_iter().enumerate() {
            r.unwrap();
            assert_eq!(buf, [i as u8; 64]);
        }
    });
}

/// Joins futures without a helper crate.
async fn futures_join<F: std::future::Future>(fs: Vec<F>) -> Vec<F::Output> {
    let mut handles = Vec::new();
    let mut out = Vec::new();
    for f in fs {
        handles.push(Box::pin(f));
    }
    for h in handles {
        out.push(h.await);
    }
    out
}

#[test]
fn calls_on_a_current_thread_runtime() {
    echo_many(current_thread());
}

#[test]
fn calls_on_a_multi_thread_runtime() {
    echo_many(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    );
}

/// A call dropped before its answer leaves nothing behind: later calls work, many times.
#[test]
fn cancelled_calls_leave_the_engine_usable() {
    let rt = current_thread();
    rt.block_on(async {
        let sim = Sim::with_devices(2);
        let (client, _server, s) = pair(&sim).await;
        for i in 0..200u32 {
            let req = i.to_le_bytes();
            let call = client.call(s, ECHO, &req, Vec::new());
            // Dropped at once, or after one poll.
            let _ = tokio::time::timeout(Duration::ZERO, call).await;
            // Some of them got the window's slots; let the driver take their answers.
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        for i in 0..20u32 {
            let (r, buf) = client.call(s, ECHO, &i.to_le_bytes(), Vec::new()).await;
            r.unwrap();
            assert_eq!(buf, i.to_le_bytes());
        }
    });
}

/// The server's device crashes: a waiting call fails with `TimedOut` within the session
/// timeout and a grace, woken by the driver's timer (nothing else happens on the fabric).
#[test]
fn a_vanished_server_times_calls_out() {
    let rt = current_thread();
    rt.block_on(async {
        let sim = Sim::with_devices(2);
        let (client, _server, s) = pair(&sim).await;
        sim.fabric().crash(1).unwrap();
        let t0 = std::time::Instant::now();
        let bounded = tokio::time::timeout(
            Duration::from_secs(2),
            client.call(s, ECHO, b"anyone?", Vec::new()),
        )
        .await;
        let (r, _) = bounded.expect("bounded by the 100 ms session timeout");
        assert!(
            matches!(r, Err(EngineError::Rpc(RpcError::TimedOut))),
            "{r:?}"
        );
        assert!(t0.elapsed() >= Duration::from_millis(100));
    });
}

fn bulk_engine(sim: &Sim, dev: &str) -> Rpc<Sim> {
    let ctx = Context::open(sim, dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cfg = EngineConfig {
        bulk: Some(BulkConfig {
            max_msg_size: 1 << 20,
            pool_bytes: 8 << 20,
        }),
        ..cfg()
    };
    let mut rpc = Rpc::new(&ctx, pd, cfg).unwrap();
    rpc.register_handler(ECHO, |req, out| {
        out[..req.len()].copy_from_slice(req);
        req.len()
    })
    .unwrap();
    rpc
}

/// Large calls over the bulk path: the buffer comes back with each outcome; calls dropped
/// early give theirs back to the pool once the engine is done, and later calls work.
#[test]
fn large_calls_hand_their_buffer_back_also_when_cancelled() {
    let rt = current_thread();
    rt.block_on(async {
        let sim = Sim::with_devices(2);
        let server = AsyncRpc::new(bulk_engine(&sim, "sim1")).unwrap();
        let client = AsyncRpc::new(bulk_engine(&sim, "sim0")).unwrap();
        let s = client.connect(&server.addr()).await.unwrap();
        let mut msg = client.alloc_msg(1 << 20).unwrap();
        for (i, b) in msg.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let (r, msg, resp) = client.call_bulk(s, ECHO, msg, Vec::new()).await;
        r.unwrap();
        let msg = msg.expect("the buffer comes back");
        assert_eq!(resp, msg.as_slice());
        drop(msg);
        for _ in 0..20 {
            let m = client.alloc_msg(64 << 10).unwrap();
            let call = client.call_bulk(s, ECHO, m, Vec::new());
            let _ = tokio::time::timeout(Duration::ZERO, call).await;
            tokio::task::yield_now().await;
        }
        // Every dropped call's buffer (and every response the server held) goes back.
        let t0 = std::time::Instant::now();
        let in_use = |a: &AsyncRpc<Sim>| a.alloc_msg(8 << 20).is_err();
        while (in_use(&client) || in_use(&server)) && t0.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            !in_use(&client) && !in_use(&server),
            "a buffer was not given back"
        );
        let m = client.alloc_msg(3000).unwrap();
        let (r, m, resp) = client.call_bulk(s, ECHO, m, resp).await;
        r.unwrap();
        assert_eq!(resp.len(), 3000);
        assert_eq!(m.map(|m| m.len()), Some(3000));
        // A plain session engine has no bulk path: the buffer comes back with the error.
        let plain = AsyncRpc::new(engine(&sim, "sim1")).unwrap();
        let s2 = client.connect(&plain.addr()).await.unwrap();
        let m = client.alloc_msg(100).unwrap();
        let (r, m, _) = client.call_bulk(s2, ECHO, m, Vec::new()).await;
        assert!(
            matches!(
                r,
                Err(EngineError::Rpc(RpcError::Bulk(BulkFailure::NoLink)))
            ),
            "{r:?}"
        );
        assert!(m.is_some());
    });
}
