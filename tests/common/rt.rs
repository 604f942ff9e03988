//! Shared set-up for the async (tokio) tests: runtimes, bounds, buffers.

use std::time::Duration;

use zverbs::provider::sim::Sim;
use zverbs::{AccessFlags, ChannelConfig, MemoryRegion, MrPool, ProtectionDomain, RemoteRegion};

pub fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A channel configuration waiting `timeout` at most, with a short flush grace.
pub fn config(timeout: Duration) -> ChannelConfig {
    ChannelConfig {
        timeout: Some(timeout),
        flush_grace: Duration::from_millis(50),
        ..ChannelConfig::default()
    }
}

/// `op`'s output, or a failed test once `bound` passed (an operation that misses its own
/// bound must fail the test, not hang it).
pub async fn within<T>(bound: Duration, op: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(bound, op)
        .await
        .unwrap_or_else(|_| panic!("no outcome within {bound:?}"))
}

/// A buffer of `pool` holding `bytes`.
pub fn filled(pool: &MrPool<Sim>, bytes: &[u8]) -> zverbs::LocalBuf<Sim> {
    let mut buf = pool.alloc(bytes.len()).unwrap();
    buf.copy_from_slice(bytes);
    buf
}

/// `len` bytes the peer may read, write and use atomics on (leaked for the test's life).
pub fn target(
    pd: &ProtectionDomain<Sim>,
    len: usize,
) -> (MemoryRegion<'static, Sim>, RemoteRegion) {
    let buf = Box::leak(vec![0u8; len].into_boxed_slice());
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    // SAFETY: the tests read the bytes only after the peer's operation completed.
    let mr = unsafe { pd.register_with_access(buf, access) }.unwrap();
    let remote = mr.remote();
    (mr, remote)
}
