//! A registered-memory pool: one slab per protection domain, registered once, carved into
//! owned buffers without touching the heap or the device again.
//!
//! [`MrPool::new`] allocates one page-aligned slab, registers it with local rights only
//! (`LOCAL_WRITE`) and sets up the allocator's side arrays; after that,
//! [`alloc`](MrPool::alloc) and dropping a [`LocalBuf`] allocate nothing and make no verb
//! call. A [`LocalBuf`] owns its block exclusively and gives it back on drop, so a double
//! free or a buffer returned to the wrong pool cannot be written. Remote access is granted
//! per buffer by a separate registration of its range, never by this one: with local
//! rights only, the device touches a buffer's bytes solely for work posted through it.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::provider::sim::Sim;
//! use zverbs::{Context, MrPool, PoolError};
//!
//! let ctx = Context::open(&Sim::with_devices(1), "sim0")?;
//! let pd = ctx.alloc_pd()?;
//! let pool = MrPool::new(&pd, 64 << 10)?; // 64 KiB, registered once
//!
//! let mut buf = pool.alloc(100)?;
//! assert_eq!((buf.len(), buf.capacity()), (100, 128)); // a 128-byte block
//! buf[..5].copy_from_slice(b"hello");
//! let head = buf.slice(..5)?; // for a send or a write
//! assert_eq!(head.sge().lkey, pool.lkey());
//!
//! let big = pool.alloc(20 << 10)?; // a 32 KiB block
//! let e = pool.alloc(32 << 10).unwrap_err(); // 64 KiB - 32 KiB - 128 B: no 32 KiB block
//! assert_eq!(e, PoolError::Exhausted { requested: 32 << 10, largest_free: 16 << 10 });
//! drop((buf, big)); // blocks coalesce
//! assert_eq!(pool.stats().largest_free, 64 << 10);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The allocator
//!
//! A binary buddy allocator over the slab (rounded up to `64 << k` bytes): blocks of
//! `64 << order` bytes, one free list per order, buddies coalesced on free. All metadata
//! lives outside the slab, in arrays set up by [`MrPool::new`] (9 bytes per 64-byte unit:
//! two `u32` list links and an order/free tag): a peer granted remote rights to a range
//! could otherwise rewrite free-list links inside registered memory. Alloc and free are
//! O(1) list operations plus at most one split or merge per order (31 at most), under one
//! [`Mutex`].
//!
//! Why buddy and not size classes: a size-class pool must split the slab between classes
//! up front, so memory free in one class cannot serve another, and a workload whose sizes
//! shift (bulk 64 KiB transfers, then small messages) runs out with most of the slab
//! free. Buddy blocks serve every size from one slab and coalesce back, with the same
//! worst-case internal fragmentation as power-of-two classes (under 2×). What an
//! alloc + free pair costs, warm and when it splits a slab all the way down, is in
//! BENCHMARKS.md (`benches/pool.rs`).
//!
//! Why a `Mutex` and not a spin lock: a spin lock (one locked instruction per lock instead
//! of two) is a little cheaper on one thread but several times dearer per alloc + free
//! pair with two threads contending, and a spinner cannot help a holder the scheduler
//! preempted.
//!
//! Contents: a block's bytes are initialized (the slab is zeroed once at set-up) but not
//! zeroed between owners: a new buffer may hold what an earlier one wrote.
//!
//! No fairness: `alloc_wait` (feature `tokio`) wakes every waiter on every free and they
//! race for the space; a large request can wait while small ones keep succeeding.

mod buddy;
mod buf;
#[cfg(unix)]
mod device;

pub use buf::LocalBuf;
#[cfg(unix)]
pub use device::{DeviceBuf, DevicePool};

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::device::ProtectionDomain;
use crate::error::{verb, Error, ErrorKind};
use crate::provider::Provider;
use crate::types::AccessFlags;
use buddy::{block_bytes, order_for, Buddy, SetupError};

/// Why [`MrPool::alloc`] gave no buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// No free block is large enough now; a later free may make one.
    Exhausted {
        /// Bytes asked for.
        requested: usize,
        /// The largest free block, in bytes (0 if nothing is free).
        largest_free: usize,
    },
    /// More bytes than the whole slab: no free will ever make room.
    TooLarge {
        /// Bytes asked for.
        requested: usize,
        /// The slab's size in bytes.
        capacity: usize,
    },
    /// A length of zero: a buffer would hold nothing, and a zero-length send or write
    /// needs no buffer.
    ZeroLength,
}

impl PoolError {
    /// What the error means: `OutOfResources` for [`Exhausted`](Self::Exhausted),
    /// `InvalidArgument` for the others.
    pub fn kind(&self) -> ErrorKind {
        match self {
            PoolError::Exhausted { .. } => ErrorKind::OutOfResources,
            PoolError::TooLarge { .. } | PoolError::ZeroLength => ErrorKind::InvalidArgument,
        }
    }
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Exhausted {
                requested,
                largest_free,
            } => write!(
                f,
                "pool exhausted: {requested} bytes asked for, largest free block {largest_free}"
            ),
            PoolError::TooLarge {
                requested,
                capacity,
            } => write!(
                f,
                "{requested} bytes asked for from a pool of {capacity} bytes"
            ),
            PoolError::ZeroLength => f.write_str("a pool buffer of zero bytes"),
        }
    }
}

impl std::error::Error for PoolError {}

/// A snapshot of a pool's occupancy ([`MrPool::stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    /// The slab's size in bytes.
    pub capacity: usize,
    /// Bytes in free blocks.
    pub free: usize,
    /// The largest free block in bytes: the largest request that succeeds now (0 if
    /// nothing is free).
    pub largest_free: usize,
    /// Buffers alive now.
    pub allocations: usize,
}

/// The slab's memory: page-aligned, zeroed, freed on drop.
struct Slab {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Slab {
    const ALIGN: usize = 4096;

    fn new(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len, Self::ALIGN).ok()?;
        // SAFETY: `len` is at least 64 (one block), so the layout is not zero-sized.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(Slab { ptr, layout })
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

struct Inner<P: Provider> {
    // Declared before `slab`: fields drop in order, so the registration ends before the
    // memory is freed.
    mr: P::Mr,
    slab: Slab,
    lkey: u32,
    /// The remote key, which only a pool registered with remote rights hands out.
    rkey: u32,
    /// The slab is `64 << top` bytes.
    top: u8,
    state: Mutex<Buddy>,
    #[cfg(feature = "tokio")]
    waiting: waiting::Waiting,
}

// SAFETY: `slab` is the only field not Send + Sync by itself (a raw pointer). The pool
// reads and writes no byte of it; each byte is reached only through the `LocalBuf` that
// owns its block, which the allocator (behind the mutex) hands to one owner at a time.
unsafe impl<P: Provider> Send for Inner<P> {}
// SAFETY: shared access to `Inner` touches only the mutex, the Notify and immutable
// fields; the slab's bytes are reached only through the `LocalBuf` that owns each block.
unsafe impl<P: Provider> Sync for Inner<P> {}

/// A registered slab carved into [`LocalBuf`]s. See the module docs.
///
/// Cheap to clone: clones share one slab. The slab is deregistered and freed when the
/// last clone and the last buffer are gone.
pub struct MrPool<P: Provider> {
    inner: Arc<Inner<P>>,
}

impl<P: Provider> Clone for MrPool<P> {
    fn clone(&self) -> Self {
        MrPool {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P: Provider> fmt::Debug for MrPool<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrPool")
            .field("addr", &self.inner.slab.ptr)
            .field("lkey", &self.inner.lkey)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<P: Provider> MrPool<P> {
    /// A pool of at least `capacity` bytes in `pd`: the slab is `capacity` rounded up to
    /// `64 << k` bytes (at most 128 GiB), page-aligned, zeroed, registered with local
    /// rights. The allocator's side arrays take another 9 bytes per 64 (about 14 %).
    ///
    /// A capacity of 0 or beyond 128 GiB (or the address space), or memory the system
    /// refuses, is [`Error::InvalidAttribute`]; a failed registration is the provider's
    /// error.
    pub fn new(pd: &ProtectionDomain<P>, capacity: usize) -> Result<Self, Error<P::Error>> {
        // SAFETY: local rights only (see `with_access`).
        unsafe { Self::with_access(pd, capacity, AccessFlags::LOCAL_WRITE) }
    }

    /// [`new`](Self::new) with the registration's rights given: the RPC engine's
    /// large-message pool adds [`AccessFlags::REMOTE_READ`], so that its peers read
    /// messages straight from their buffers.
    ///
    /// # Safety
    /// With remote rights the device also touches the slab for work a peer sends: the
    /// caller guarantees that no such right lets the device *write* a byte a `LocalBuf`
    /// owner may be using (remote reads only, or remote writes to buffers the caller
    /// keeps out of Rust's reach meanwhile), and that every peer with the `rkey` may see
    /// every byte of the slab.
    pub(crate) unsafe fn with_access(
        pd: &ProtectionDomain<P>,
        capacity: usize,
        access: AccessFlags,
    ) -> Result<Self, Error<P::Error>> {
        let buddy = Buddy::new(capacity).map_err(|e| {
            Error::InvalidAttribute(match e {
                SetupError::Zero => "pool capacity of 0 bytes",
                SetupError::TooLarge => "pool capacity beyond 128 GiB",
                SetupError::OutOfMemory => "no memory for the pool's allocator",
            })
        })?;
        let top = buddy.top();
        let len = block_bytes(top).ok_or(Error::InvalidAttribute("pool capacity too large"))?;
        let slab = Slab::new(len).ok_or(Error::InvalidAttribute("no memory for the pool slab"))?;
        // SAFETY: the slab stays allocated until after the registration is dropped (field
        // order of `Inner`). With local rights, the device accesses it solely for work
        // posted through a `LocalBuf`, whose rules keep Rust references away meanwhile;
        // remote rights are the caller's to vouch for (`with_access`).
        let mr = verb("ibv_reg_mr", unsafe {
            P::register_mr(&pd.raw, slab.ptr.as_ptr(), len, access)
        })?;
        let (lkey, rkey) = P::mr_keys(&mr);
        Ok(MrPool {
            inner: Arc::new(Inner {
                mr,
                slab,
                lkey,
                rkey,
                top,
                state: Mutex::new(buddy),
                #[cfg(feature = "tokio")]
                waiting: waiting::Waiting::new(),
            }),
        })
    }

    /// A buffer of `len` bytes, in a block of the next power of two times 64 bytes, or
    /// why there is none. Never blocks beyond the pool's lock; allocates nothing.
    pub fn alloc(&self, len: usize) -> Result<LocalBuf<P>, PoolError> {
        self.try_alloc(self.order(len)?, len)
    }

    /// The block order for `len` bytes, or why no block will ever do.
    fn order(&self, len: usize) -> Result<u8, PoolError> {
        if len == 0 {
            return Err(PoolError::ZeroLength);
        }
        match order_for(len) {
            Some(order) if order <= self.inner.top => Ok(order),
            _ => Err(PoolError::TooLarge {
                requested: len,
                capacity: self.capacity(),
            }),
        }
    }

    fn try_alloc(&self, order: u8, len: usize) -> Result<LocalBuf<P>, PoolError> {
        let mut state = self.lock();
        match state.alloc(order) {
            Some(unit) => {
                drop(state);
                Ok(LocalBuf::new(self.clone(), unit, order, len))
            }
            None => Err(PoolError::Exhausted {
                requested: len,
                largest_free: state.largest_free().map_or(0, |k| buddy::MIN_BLOCK << k),
            }),
        }
    }

    /// Gives block `unit` of `order` back (from `LocalBuf::drop`) and wakes the waiters.
    fn release(&self, unit: u32, order: u8) {
        let mut state = self.lock();
        state.free(unit, order);
        #[cfg(feature = "tokio")]
        {
            // Read under the lock: a waiter counts itself before its re-check takes it.
            let wake = self.inner.waiting.any();
            drop(state);
            if wake {
                self.inner.waiting.wake();
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buddy> {
        // The allocator does not panic while holding the lock (its operations index only
        // within its arrays), so a poisoned lock still holds a consistent state.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Occupancy now. Takes the lock briefly.
    pub fn stats(&self) -> PoolStats {
        stats_of(&self.lock(), self.inner.top)
    }

    /// The slab's size in bytes.
    pub fn capacity(&self) -> usize {
        buddy::MIN_BLOCK << self.inner.top
    }

    /// The local key of the slab's registration, which every buffer's entries carry.
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }

    /// The remote key of the slab's registration (meaningful with remote rights only).
    pub(crate) fn rkey(&self) -> u32 {
        self.inner.rkey
    }

    /// The backend's handle of the slab's registration.
    pub fn raw(&self) -> &P::Mr {
        &self.inner.mr
    }

    /// The slab's first byte.
    fn base(&self) -> NonNull<u8> {
        self.inner.slab.ptr
    }
}

/// What the allocator `b` of a pool of `64 << top` bytes holds now.
fn stats_of(b: &Buddy, top: u8) -> PoolStats {
    let unit = buddy::MIN_BLOCK;
    PoolStats {
        capacity: unit << top,
        free: b.free_units() * unit,
        largest_free: b.largest_free().map_or(0, |k| unit << k),
        allocations: b.live(),
    }
}

#[cfg(feature = "tokio")]
mod waiting {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Notify;

    /// Tasks waiting for space: a count, so that frees skip the Notify's own lock when
    /// nobody waits, and the Notify.
    pub(super) struct Waiting {
        count: AtomicUsize,
        notify: Notify,
    }

    impl Waiting {
        pub(super) fn new() -> Self {
            Waiting {
                count: AtomicUsize::new(0),
                notify: Notify::new(),
            }
        }

        /// Whether a task waits. Called under the pool's lock, after a free.
        pub(super) fn any(&self) -> bool {
            self.count.load(Ordering::Relaxed) != 0
        }

        pub(super) fn wake(&self) {
            self.notify.notify_waiters();
        }

        pub(super) fn notify(&self) -> &Notify {
            &self.notify
        }

        /// Counts the caller as waiting until the guard drops (also when its future is
        /// dropped). Must come before the re-check under the pool's lock: the lock then
        /// orders the increment before any later free's [`any`](Self::any).
        pub(super) fn enter(&self) -> Guard<'_> {
            self.count.fetch_add(1, Ordering::Relaxed);
            Guard(&self.count)
        }
    }

    pub(super) struct Guard<'a>(&'a AtomicUsize);

    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(feature = "tokio")]
impl<P: Provider> MrPool<P> {
    /// A buffer of `len` bytes, waiting for a free block if none is large enough now.
    ///
    /// [`TooLarge`](PoolError::TooLarge) and [`ZeroLength`](PoolError::ZeroLength) fail at
    /// once; otherwise this returns only a buffer. Cancel-safe: dropping the future takes
    /// nothing from the pool. Every free wakes every waiter (no queue, no fairness).
    pub async fn alloc_wait(&self, len: usize) -> Result<LocalBuf<P>, PoolError> {
        let order = self.order(len)?;
        if let Ok(buf) = self.try_alloc(order, len) {
            return Ok(buf);
        }
        let waiting = &self.inner.waiting;
        let _counted = waiting.enter();
        let mut notified = core::pin::pin!(waiting.notify().notified());
        loop {
            // Registered before the re-check: a free after the re-check wakes this future
            // (and sees the count, which `enter` raised before the re-check's lock).
            notified.as_mut().enable();
            if let Ok(buf) = self.try_alloc(order, len) {
                return Ok(buf);
            }
            notified.as_mut().await;
            notified.set(waiting.notify().notified());
        }
    }
}
