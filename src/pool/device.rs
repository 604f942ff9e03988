//! [`DevicePool`]: the pool's allocator over device memory (a [`DeviceRegion`], registered
//! from a dmabuf), carved into owned [`DeviceBuf`]s that async operations lend to the
//! device as they lend [`LocalBuf`](super::LocalBuf)s, with no bytes for the host.

use core::fmt;
use core::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::buddy::{self, order_for, Buddy};
use super::{PoolError, PoolStats};
use crate::dmabuf::DeviceRegion;
use crate::error::{BoundsError, Error};
use crate::mr::{Extent, LocalSlice, LocalSliceMut};
use crate::provider::Provider;

struct Inner<P: Provider> {
    region: DeviceRegion<'static, P>,
    /// The pool is `64 << top` bytes at the start of the region.
    top: u8,
    state: Mutex<Buddy>,
}

/// A registered range of device memory carved into [`DeviceBuf`]s by the same buddy
/// allocator as [`MrPool`](super::MrPool) (metadata outside the memory, no allocation
/// after set-up). Cheap to clone: clones share the region, which is deregistered when the
/// last clone and the last buffer are gone.
///
/// ```
/// # #[cfg(feature = "sim")] {
/// use zverbs::provider::sim::Sim;
/// use zverbs::{AccessFlags, Context, DevicePool};
/// let ctx = Context::open(&Sim::with_devices(1), "sim0")?;
/// let gpu = ctx.raw().alloc_device_memory(1 << 20)?;
/// let pd = ctx.alloc_pd()?;
/// let fd = gpu.dmabuf_fd().try_clone_to_owned()?;
/// let region = pd.register_dmabuf_owned(fd, 0, 1 << 20, 0, AccessFlags::LOCAL_WRITE)?;
/// let pool = DevicePool::new(region)?;
/// let buf = pool.alloc(4000)?; // a 4 KiB block of device memory
/// assert_eq!((buf.len(), buf.iova()), (4000, 0));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DevicePool<P: Provider> {
    inner: Arc<Inner<P>>,
}

impl<P: Provider> Clone for DevicePool<P> {
    fn clone(&self) -> Self {
        DevicePool {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P: Provider> fmt::Debug for DevicePool<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevicePool")
            .field("iova", &self.inner.region.iova())
            .field("stats", &self.stats())
            .finish()
    }
}

impl<P: Provider> DevicePool<P> {
    /// A pool over the first `64 << k` bytes of `region` (the largest such that fit).
    ///
    /// # Errors
    /// [`Error::InvalidAttribute`] for a region under 64 bytes or no memory for the
    /// allocator's side arrays.
    pub fn new(region: DeviceRegion<'static, P>) -> Result<Self, Error<P::Error>> {
        let units = region.len() >> buddy::MIN_SHIFT;
        if units == 0 {
            return Err(Error::InvalidAttribute("a device pool under 64 bytes"));
        }
        let top = (usize::BITS - 1 - units.leading_zeros()) as u8;
        let buddy = Buddy::new(buddy::MIN_BLOCK << top)
            .map_err(|_| Error::InvalidAttribute("no memory for the pool's allocator"))?;
        Ok(DevicePool {
            inner: Arc::new(Inner {
                region,
                top: buddy.top(),
                state: Mutex::new(buddy),
            }),
        })
    }

    /// A buffer of `len` bytes, in a block of the next power of two times 64 bytes, or
    /// why there is none. Allocates nothing.
    pub fn alloc(&self, len: usize) -> Result<DeviceBuf<P>, PoolError> {
        if len == 0 {
            return Err(PoolError::ZeroLength);
        }
        let order = order_for(len)
            .filter(|&o| o <= self.inner.top)
            .ok_or(PoolError::TooLarge {
                requested: len,
                capacity: self.capacity(),
            })?;
        let mut state = self.lock();
        match state.alloc(order) {
            Some(unit) => Ok(DeviceBuf {
                pool: self.clone(),
                unit,
                order,
                len,
            }),
            None => Err(PoolError::Exhausted {
                requested: len,
                largest_free: state.largest_free().map_or(0, |k| buddy::MIN_BLOCK << k),
            }),
        }
    }

    /// Occupancy now.
    pub fn stats(&self) -> PoolStats {
        super::stats_of(&self.lock(), self.inner.top)
    }

    /// The pool's size in bytes.
    pub fn capacity(&self) -> usize {
        buddy::MIN_BLOCK << self.inner.top
    }

    fn lock(&self) -> MutexGuard<'_, Buddy> {
        // As `MrPool::lock`: the allocator does not panic while holding the lock.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A block of a [`DevicePool`], owned exclusively, given back on drop. Device memory: no
/// bytes, only entries for work requests ([`slice`](Self::slice),
/// [`slice_mut`](Self::slice_mut)) and, as an async operation's buffer, its own.
pub struct DeviceBuf<P: Provider> {
    pool: DevicePool<P>,
    unit: u32,
    order: u8,
    len: usize,
}

impl<P: Provider> fmt::Debug for DeviceBuf<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuf")
            .field("iova", &self.iova())
            .field("len", &self.len)
            .finish()
    }
}

impl<P: Provider> Drop for DeviceBuf<P> {
    fn drop(&mut self) {
        self.pool.lock().free(self.unit, self.order);
    }
}

impl<P: Provider> DeviceBuf<P> {
    /// Length in bytes (at most its block's).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: an allocation has some).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The I/O virtual address of its first byte, as work requests name it.
    pub fn iova(&self) -> u64 {
        let off = (self.unit as u64) << buddy::MIN_SHIFT;
        self.pool.inner.region.iova() + off
    }

    /// Its offset in the pool's region (where the accelerator finds it).
    pub fn offset(&self) -> usize {
        (self.unit as usize) << buddy::MIN_SHIFT
    }

    /// A byte range the device may read (sends, writes).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice<'_>, BoundsError> {
        Ok(LocalSlice::from_sge(self.extent().range(range)?))
    }

    /// A byte range the device may write (receives, reads, atomics).
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<LocalSliceMut<'_>, BoundsError> {
        Ok(LocalSliceMut::from_device_sge(self.extent().range(range)?))
    }

    /// Its pool's region: the remote key a peer names it by, and its rights.
    pub(crate) fn region(&self) -> &DeviceRegion<'static, P> {
        &self.pool.inner.region
    }

    /// Its bytes, to cut entries from.
    pub(crate) fn extent(&self) -> Extent {
        Extent::new(self.iova(), self.len, self.pool.inner.region.lkey())
    }
}
