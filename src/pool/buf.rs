//! [`LocalBuf`]: a block of a pool's slab, owned.

use core::fmt;
use core::ops::{Deref, DerefMut, RangeBounds};
use core::ptr::NonNull;

use super::MrPool;
use crate::error::BoundsError;
use crate::mr::{Extent, LocalSlice, LocalSliceMut};
use crate::provider::Provider;

/// A buffer from an [`MrPool`]: one block of the registered slab, owned exclusively, given
/// back (and coalesced) on drop.
///
/// It reads and writes like a `Box<[u8]>` of [`len`](Self::len) bytes (`Deref`,
/// `DerefMut`), and names its bytes to the device through [`slice`](Self::slice) and
/// [`slice_mut`](Self::slice_mut), which borrow it as [`MemoryRegion`]'s slices borrow a
/// region.
///
/// Why reading and writing it is sound: the slab is registered with local rights only, so
/// the device touches a block's bytes solely for work posted with an entry of that block;
/// such entries come from a slice that borrows the buffer (the channel layers hold the
/// borrow until the work completes) or from a crate layer that holds the buffer itself
/// until then. Either way no `&`/`&mut` to the bytes can be used meanwhile. Remote rights
/// to a buffer's range need a separate registration that must take the same care.
///
/// The bytes are initialized but not zeroed between owners: a new buffer may hold what an
/// earlier one wrote.
///
/// [`MemoryRegion`]: crate::MemoryRegion
pub struct LocalBuf<P: Provider> {
    pool: MrPool<P>,
    ptr: NonNull<u8>,
    len: usize,
    unit: u32,
    order: u8,
}

// SAFETY: the buffer owns its block exclusively (the allocator hands each block to one
// owner at a time) and its pool handle is Send + Sync: it is sent and shared like a
// `Box<[u8]>`.
unsafe impl<P: Provider> Send for LocalBuf<P> {}
// SAFETY: `&LocalBuf` gives only shared access to the bytes of the block it owns
// exclusively (as `&Box<[u8]>` does), and its pool handle is Sync.
unsafe impl<P: Provider> Sync for LocalBuf<P> {}

impl<P: Provider> LocalBuf<P> {
    /// Wraps block `unit` of `order`, just taken from `pool`'s allocator, for `len` bytes.
    pub(super) fn new(pool: MrPool<P>, unit: u32, order: u8, len: usize) -> Self {
        debug_assert!(len != 0 && len <= super::buddy::MIN_BLOCK << order);
        // `unit << 6` lies inside the slab (the block does), so the offset fits and the
        // pointer stays in the allocation.
        let off = (unit as usize) << super::buddy::MIN_SHIFT;
        // SAFETY: `off` is the offset of block `unit`, which lies inside the slab, so the
        // pointer stays in the allocation.
        let ptr = unsafe { pool.base().add(off) };
        LocalBuf {
            pool,
            ptr,
            len,
            unit,
            order,
        }
    }

    /// Bytes asked for: the length of the slices and of `Deref`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a pool hands out no empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes in the block (the next power of two times 64 at or above [`len`](Self::len)).
    pub fn capacity(&self) -> usize {
        super::buddy::MIN_BLOCK << self.order
    }

    /// The address of the first byte, as work requests and remote regions name it.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The local key (the pool's).
    pub fn lkey(&self) -> u32 {
        self.pool.lkey()
    }

    /// The pool this buffer came from, and goes back to.
    pub fn pool(&self) -> &MrPool<P> {
        &self.pool
    }

    /// Whether this buffer came from `pool` (or a clone of it).
    pub fn belongs_to(&self, pool: &MrPool<P>) -> bool {
        std::sync::Arc::ptr_eq(&self.pool.inner, &pool.inner)
    }

    /// The bytes' range: first byte and [`len`](Self::len), e.g. to register it with
    /// remote rights.
    pub(crate) fn range(&self) -> (*mut u8, usize) {
        (self.ptr.as_ptr(), self.len)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        let (ptr, len) = self.range();
        // SAFETY: `ptr..ptr+len` lies in this buffer's block, initialized (zeroed at set-up)
        // and owned by `self`; no device write is in flight (see the type's docs).
        unsafe { core::slice::from_raw_parts(ptr, len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let (ptr, len) = self.range();
        // SAFETY: as in `as_slice`, and `&mut self` excludes every other reference and
        // every slice naming the block.
        unsafe { core::slice::from_raw_parts_mut(ptr, len) }
    }

    /// Bytes `off..off + len`, while the device may still use the rest of the buffer.
    ///
    /// # Safety
    /// No device write to `off..off + len` may be in flight or start while the slice
    /// lives, and `off + len` must not exceed [`len`](Self::len).
    pub(crate) unsafe fn part(&self, off: usize, len: usize) -> &[u8] {
        debug_assert!(off + len <= self.len);
        // SAFETY: in this buffer's block (the caller's bound), initialized, and not being
        // written (the caller's contract).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// Bytes `off..off + len`, mutably, while the device may still use the rest.
    ///
    /// # Safety
    /// No device access to `off..off + len` may be in flight or start while the slice
    /// lives, and `off + len` must not exceed [`len`](Self::len).
    pub(crate) unsafe fn part_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        debug_assert!(off + len <= self.len);
        // SAFETY: as in `part`, and `&mut self` excludes every other slice of the buffer
        // this module hands out.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
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
        Ok(LocalSliceMut::from_sge(self.extent().range(range)?))
    }

    /// Its bytes, to cut entries from.
    pub(crate) fn extent(&self) -> Extent {
        Extent::new(self.addr(), self.len, self.lkey())
    }
}

impl<P: Provider> Drop for LocalBuf<P> {
    fn drop(&mut self) {
        self.pool.release(self.unit, self.order);
    }
}

impl<P: Provider> Deref for LocalBuf<P> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl<P: Provider> DerefMut for LocalBuf<P> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl<P: Provider> AsRef<[u8]> for LocalBuf<P> {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl<P: Provider> AsMut<[u8]> for LocalBuf<P> {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl<P: Provider> fmt::Debug for LocalBuf<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("lkey", &self.lkey())
            .finish()
    }
}
