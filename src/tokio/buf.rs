//! Buffers an async operation may lend to the device.

use crate::error::BoundsError;
use crate::pool::{DeviceBuf, LocalBuf};
use crate::provider::Provider;
use crate::types::Sge;

/// Registered memory that an async operation owns while the device uses it.
///
/// An operation takes the buffer by value, posts its [`sge`](IoBuf::sge), and gives the
/// buffer back with the result; if the operation's future is dropped first, the channel
/// keeps the buffer until the device is done with it (completion or flush), then drops it.
/// So a buffer is never back in Rust's hands while the device may still touch it — which
/// no borrowed buffer can promise once a future may be dropped.
///
/// # Safety
///
/// From the moment the buffer is moved into an operation until the operation gives it back
/// (or drops it), the memory [`sge`](IoBuf::sge) names must stay valid, at the same address,
/// and must not be read or written by anything else: owning the value must mean owning that
/// memory exclusively, and moving the value must not move the memory (a heap block, a
/// registered slab). `sge` must return the same entry every time. A key from another
/// protection domain is no unsafety: the device refuses it with an error completion.
pub unsafe trait IoBuf: Send + 'static {
    /// The memory the device reads (sends, writes) or writes (receives, reads, atomics); an
    /// error if it cannot be named by one entry (over 4 GiB).
    fn sge(&self) -> Result<Sge, BoundsError>;
}

/// An [`IoBuf`] in the process's memory, whose bytes the library may read once the
/// operation that wrote them completed: what an async atomic takes, to return the value it
/// fetched. A [`DeviceBuf`] (device memory) is not one, so an atomic into it does not
/// compile.
///
/// # Safety
///
/// [`sge`](IoBuf::sge) names memory of this process, readable by the host.
pub unsafe trait HostBuf: IoBuf {}

// SAFETY: a `LocalBuf` owns its block of the pool's slab exclusively (the allocator hands a
// block to one owner at a time) and the slab neither moves nor is freed while a buffer of
// it lives; the slab is registered for local access only, so no peer writes it either.
unsafe impl<P: Provider + 'static> IoBuf for LocalBuf<P> {
    fn sge(&self) -> Result<Sge, BoundsError> {
        self.extent().sge(0, self.len() as u64)
    }
}

// SAFETY: the slab is process memory (`MrPool` allocates it).
unsafe impl<P: Provider + 'static> HostBuf for LocalBuf<P> {}

// SAFETY: a `DeviceBuf` owns its block of the pool's region exclusively (one owner per
// block, as for `LocalBuf`), the region stays registered while a buffer of it lives, and
// the host never reads or writes device memory.
unsafe impl<P: Provider + 'static> IoBuf for DeviceBuf<P> {
    fn sge(&self) -> Result<Sge, BoundsError> {
        self.extent().sge(0, self.len() as u64)
    }
}
