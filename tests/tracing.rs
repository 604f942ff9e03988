//! Feature `tracing`: what the library tells a subscriber — the set-up spans of a
//! connection, a barrier that times out and poisons its node, an RPC session that changes,
//! a verb the provider refuses — captured from a `tracing-subscriber` formatter.
#![cfg(all(feature = "sim", feature = "tracing"))]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing_subscriber::fmt::format::FmtSpan;
use zverbs::node::NodeConfig;
use zverbs::rpc::EngineConfig;
use zverbs::testing::{Pair, RpcPair, World};
use zverbs::{AccessFlags, ChannelConfig, Error};

/// A writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What `f` made the library say on this thread at `debug` and above: one line per event
/// and per closed span.
fn log_of(f: impl FnOnce()) -> String {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = out.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn connecting_a_pair_shows_each_side_s_connect_span() {
    let mut qps = (0, 0);
    let log = log_of(|| {
        let p = Pair::<16, 1>::connected(&ChannelConfig::default()).unwrap();
        qps = (p.a.ch.queue_pair().qp_num(), p.b.ch.queue_pair().qp_num());
    });
    for (me, peer) in [(qps.0, qps.1), (qps.1, qps.0)] {
        let span = format!("connect{{qp={me} peer_qp={peer}}}");
        assert!(log.contains(&span), "no {span} in:\n{log}");
    }
    assert!(log.contains("close time.busy"), "{log}");
}

#[test]
fn a_barrier_that_times_out_says_so_and_poisons_the_node() {
    let cfg = NodeConfig {
        barrier_timeout: Some(Duration::from_millis(20)),
        ..NodeConfig::default()
    };
    let mut world = World::<2>::connected(2, &cfg).unwrap();
    let log = log_of(|| {
        // Rank 1 never enters.
        assert!(world.ranks[0].1.barrier_all().is_err());
    });
    assert!(world.ranks[0].1.is_poisoned());
    assert!(
        log.contains("WARN") && log.contains("a barrier timed out; the node is poisoned"),
        "{log}"
    );
}

#[test]
fn an_rpc_session_that_connects_is_reported() {
    let cfg = EngineConfig::default();
    let log = log_of(|| {
        let sim = zverbs::provider::sim::Sim::with_devices(2);
        RpcPair::connected(&sim, cfg.clone(), cfg, |_| Ok(())).unwrap();
    });
    assert!(
        log.contains("an RPC session changed") && log.contains("Connected"),
        "{log}"
    );
}

#[test]
fn a_verb_the_provider_refuses_is_reported() {
    let p = Pair::<16, 1>::connected(&ChannelConfig::default()).unwrap();
    let mut r = None;
    let log = log_of(|| {
        // Remote rights without local write: the device refuses the registration.
        let mut bytes = [0u8; 8];
        // SAFETY: the registration fails; nothing is exposed.
        r = Some(
            unsafe {
                p.a.pd
                    .register_with_access(&mut bytes, AccessFlags::REMOTE_WRITE)
            }
            .map(drop),
        );
    });
    assert!(matches!(r, Some(Err(Error::Provider { .. }))), "{r:?}");
    assert!(log.contains("the provider refused a verb"), "{log}");
}
