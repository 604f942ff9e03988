//! Drives a client and a server `Rpc` on one thread, for the RPC engine's tests.

use std::time::{Duration, Instant};

use zverbs::provider::Provider;
use zverbs::rpc::{Notice, Rpc};

/// Passes on both engines (the server's first) until `on` returns true for a client
/// notice or `limit` passes; whether it did.
pub fn pump<P: Provider>(
    client: &mut Rpc<P>,
    server: &mut Rpc<P>,
    limit: Duration,
    mut on: impl FnMut(Notice<'_, P>) -> bool,
) -> bool {
    let end = Instant::now() + limit;
    let mut hit = false;
    while !hit && Instant::now() < end {
        server.run_event_loop_once(&mut |_| {}).unwrap();
        client.run_event_loop_once(&mut |n| hit |= on(n)).unwrap();
    }
    hit
}
