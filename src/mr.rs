//! Memory regions, local slices of them, and remote regions.
//!
//! A [`MemoryRegion`] borrows its buffer for as long as it is registered. Work requests name
//! memory through slices borrowed from the region: a [`LocalSlice`] (the device reads it:
//! sends, writes) borrows the region shared, a [`LocalSliceMut`] (the device writes it:
//! receives, reads, atomics) borrows it exclusively. So while work is in flight, Rust code
//! cannot touch the bytes the device may be writing.
//!
//! A [`RemoteRegion`] is plain data — address, length, rkey — that a peer sends you; sub-
//! ranges are bounds-checked.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use zverbs::{provider::sim::Sim, Context};
//! let ctx = Context::open(&Sim::with_devices(1), "sim0").unwrap();
//! let pd = ctx.alloc_pd().unwrap();
//! let mut buf = [7u8; 128];
//! let mut mr = pd.register(&mut buf).unwrap();
//! let head = mr.slice(0..64).unwrap();
//! assert_eq!(head.len(), 64);
//! assert!(mr.slice(100..200).is_err());
//! mr.as_mut_slice()[0] = 1;
//! # }
//! ```

use core::marker::PhantomData;
use core::ops::{Bound, RangeBounds};

use crate::device::ProtectionDomain;
use crate::error::{verb, BoundsError, Error};
use crate::provider::Provider;
use crate::types::{AccessFlags, Sge};

/// Resolves `range` against a region of `len` bytes.
fn resolve(range: impl RangeBounds<u64>, len: u64) -> Result<(u64, u64), BoundsError> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(BoundsError {
            offset: start,
            len: end.saturating_sub(start),
            region_len: len,
        });
    }
    Ok((start, end - start))
}

fn to_u64(r: impl RangeBounds<usize>) -> (Bound<u64>, Bound<u64>) {
    let map = |b: Bound<&usize>| match b {
        Bound::Included(&v) => Bound::Included(v as u64),
        Bound::Excluded(&v) => Bound::Excluded(v as u64),
        Bound::Unbounded => Bound::Unbounded,
    };
    (map(r.start_bound()), map(r.end_bound()))
}

impl<P: Provider> ProtectionDomain<P> {
    /// Registers `buf` for local use only (`LOCAL_WRITE`): sends, receives, and the local
    /// side of writes, reads and atomics.
    pub fn register<'a>(&self, buf: &'a mut [u8]) -> Result<MemoryRegion<'a, P>, Error<P::Error>> {
        // SAFETY: `buf` is borrowed exclusively for 'a and the registration ends (drop) before
        // the borrow does. With local rights only, the device touches the memory only for
        // work posted through slices that borrow the region, which the channel layers keep
        // borrowed until that work completes.
        unsafe { self.register_with_access(buf, AccessFlags::LOCAL_WRITE) }
    }

    /// Registers `buf` with the given rights, remote ones included.
    ///
    /// # Safety
    /// Remote rights let a peer read or write the buffer at any time, outside Rust's view.
    /// The caller must ensure that no peer accesses the memory while Rust code reads or
    /// writes it through [`MemoryRegion::as_slice`] / [`MemoryRegion::as_mut_slice`] (the
    /// application protocol orders them, e.g. by a message or a barrier), and that a leaked
    /// region (`mem::forget`) is never accessed by a peer after `buf` is reused.
    pub unsafe fn register_with_access<'a>(
        &self,
        buf: &'a mut [u8],
        access: AccessFlags,
    ) -> Result<MemoryRegion<'a, P>, Error<P::Error>> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` stays borrowed for 'a, longer than the registration; the caller
        // upholds the rules on remote access.
        let raw = verb("ibv_reg_mr", unsafe {
            P::register_mr(&self.raw, ptr, len, access)
        })?;
        let (lkey, rkey) = P::mr_keys(&raw);
        Ok(MemoryRegion {
            raw,
            ptr,
            len,
            lkey,
            rkey,
            _buf: PhantomData,
        })
    }
}

/// A registered buffer. Dropping it deregisters the memory.
pub struct MemoryRegion<'a, P: Provider> {
    raw: P::Mr,
    ptr: *mut u8,
    len: usize,
    lkey: u32,
    rkey: u32,
    _buf: PhantomData<&'a mut [u8]>,
}

// SAFETY: the region is a unique borrow of a byte buffer (Send + Sync like `&mut [u8]`)
// plus a provider handle that is Send + Sync by the trait's bounds.
unsafe impl<P: Provider> Send for MemoryRegion<'_, P> {}
// SAFETY: as above; shared access only reads through `as_slice`.
unsafe impl<P: Provider> Sync for MemoryRegion<'_, P> {}

impl<'a, P: Provider> MemoryRegion<'a, P> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The whole region as a remote region, to hand to a peer.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.ptr as u64,
            len: self.len as u64,
            rkey: self.rkey,
        }
    }

    /// The bytes. No work can be writing them: slices that let the device write borrow the
    /// region exclusively.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is the buffer borrowed for 'a; `&self` excludes every
        // `LocalSliceMut`, so no local work writes it now.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, mutably. `&mut self` excludes every slice, so no local work touches them.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` excludes all slices.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// A byte range the device may read (sends, writes).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<LocalSlice<'_>, BoundsError> {
        let (off, len) = resolve(to_u64(range), self.len as u64)?;
        let sge = self.sge(off, len)?;
        Ok(LocalSlice {
            sge,
            _b: PhantomData,
        })
    }

    /// A byte range the device may write (receives, reads, atomics).
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<LocalSliceMut<'_>, BoundsError> {
        let (off, len) = resolve(to_u64(range), self.len as u64)?;
        let sge = self.sge(off, len)?;
        Ok(LocalSliceMut {
            sge,
            _b: PhantomData,
        })
    }

    fn sge(&self, off: u64, len: u64) -> Result<Sge, BoundsError> {
        let length = u32::try_from(len).map_err(|_| BoundsError {
            offset: off,
            len,
            region_len: self.len as u64,
        })?;
        Ok(Sge {
            addr: self.ptr as u64 + off,
            length,
            lkey: self.lkey,
        })
    }

    /// The backend's handle.
    pub fn raw(&self) -> &P::Mr {
        &self.raw
    }
}

/// A range of a memory region that the device may read. Borrows the region shared.
#[derive(Clone, Copy, Debug)]
pub struct LocalSlice<'a> {
    sge: Sge,
    _b: PhantomData<&'a [u8]>,
}

/// A range of a memory region that the device may write. Borrows the region exclusively.
#[derive(Debug)]
pub struct LocalSliceMut<'a> {
    sge: Sge,
    _b: PhantomData<&'a mut [u8]>,
}

impl LocalSlice<'_> {
    /// The scatter/gather entry.
    pub fn sge(&self) -> Sge {
        self.sge
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.sge.length as usize
    }
    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.sge.length == 0
    }
}

fn split_sge(sge: Sge, mid: usize) -> Result<(Sge, Sge), BoundsError> {
    let len = u64::from(sge.length);
    if mid as u64 > len {
        return Err(BoundsError {
            offset: mid as u64,
            len: 0,
            region_len: len,
        });
    }
    let mid = mid as u32;
    let head = Sge { length: mid, ..sge };
    let tail = Sge {
        addr: sge.addr + u64::from(mid),
        length: sge.length - mid,
        lkey: sge.lkey,
    };
    Ok((head, tail))
}

impl<'a> LocalSlice<'a> {
    /// Splits into `[..mid]` and `[mid..]`.
    pub fn split_at(self, mid: usize) -> Result<(LocalSlice<'a>, LocalSlice<'a>), BoundsError> {
        let (a, b) = split_sge(self.sge, mid)?;
        Ok((
            LocalSlice {
                sge: a,
                _b: PhantomData,
            },
            LocalSlice {
                sge: b,
                _b: PhantomData,
            },
        ))
    }
}

impl<'a> LocalSliceMut<'a> {
    /// Splits into two disjoint slices `[..mid]` and `[mid..]`, e.g. to post several
    /// receives into one region.
    pub fn split_at(
        self,
        mid: usize,
    ) -> Result<(LocalSliceMut<'a>, LocalSliceMut<'a>), BoundsError> {
        let (a, b) = split_sge(self.sge, mid)?;
        Ok((
            LocalSliceMut {
                sge: a,
                _b: PhantomData,
            },
            LocalSliceMut {
                sge: b,
                _b: PhantomData,
            },
        ))
    }
}

impl LocalSliceMut<'_> {
    /// The scatter/gather entry.
    pub fn sge(&self) -> Sge {
        self.sge
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.sge.length as usize
    }
    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.sge.length == 0
    }
    /// Reads the first 8 bytes as a native-endian `u64` (the result of an atomic).
    pub(crate) fn read_u64(&self) -> Option<u64> {
        if self.sge.length < 8 {
            return None;
        }
        let mut b = [0u8; 8];
        // SAFETY: the slice borrows 8+ bytes of a registered buffer exclusively; the caller
        // reads only after the work that wrote them completed.
        unsafe { core::ptr::copy_nonoverlapping(self.sge.addr as *const u8, b.as_mut_ptr(), 8) };
        Some(u64::from_ne_bytes(b))
    }
}

/// Memory of a peer: address, length and remote key. Plain data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// Remote virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteRegion {
    /// A sub-range, bounds-checked.
    ///
    /// ```
    /// use zverbs::RemoteRegion;
    /// let r = RemoteRegion { addr: 0x1000, len: 64, rkey: 7 };
    /// assert_eq!(r.slice(16..32).unwrap().addr, 0x1010);
    /// assert!(r.slice(60..70).is_err());
    /// ```
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteRegion, BoundsError> {
        let (off, len) = resolve(range, self.len)?;
        Ok(RemoteRegion {
            addr: self.addr + off,
            len,
            rkey: self.rkey,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_checks_every_bound_form() {
        assert_eq!(resolve(.., 10), Ok((0, 10)));
        assert_eq!(resolve(2..5, 10), Ok((2, 3)));
        assert_eq!(resolve(2..=5, 10), Ok((2, 4)));
        assert_eq!(resolve(10..10, 10), Ok((10, 0)));
        assert!(resolve(5..11, 10).is_err());
        assert!(resolve((Bound::Included(6), Bound::Excluded(5)), 10).is_err());
        assert!(resolve(0..=u64::MAX, 10).is_err());
        let e = resolve(8..12, 10).unwrap_err();
        assert_eq!((e.offset, e.len, e.region_len), (8, 4, 10));
    }

    #[test]
    fn remote_slices_nest() {
        let r = RemoteRegion {
            addr: 100,
            len: 50,
            rkey: 1,
        };
        let a = r.slice(10..40).unwrap();
        let b = a.slice(5..).unwrap();
        assert_eq!((b.addr, b.len, b.rkey), (115, 25, 1));
        assert!(a.slice(..31).is_err());
    }
}
