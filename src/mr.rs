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
use crate::types::{AccessFlags, SendOp, Sge};

/// Resolves `range` against a region of `len` bytes: `(offset, length)` of the sub-range.
///
/// Total over every bound: the bounds are widened to `u128`, so `x..=u64::MAX` and an
/// excluded start of `u64::MAX` are computed exactly instead of saturating (which would
/// pass `0..=u64::MAX` on a region of `u64::MAX` bytes with a length one short).
pub(crate) fn resolve(range: impl RangeBounds<u64>, len: u64) -> Result<(u64, u64), BoundsError> {
    let start = match range.start_bound() {
        Bound::Included(&s) => u128::from(s),
        Bound::Excluded(&s) => u128::from(s) + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => u128::from(e) + 1,
        Bound::Excluded(&e) => u128::from(e),
        Bound::Unbounded => u128::from(len),
    };
    if start <= end && end <= u128::from(len) {
        // Both fit in a u64: start <= end <= len.
        let (start, end) = (clamp(start), clamp(end));
        return Ok((start, end - start));
    }
    Err(BoundsError {
        offset: clamp(start),
        len: clamp(end.saturating_sub(start)),
        region_len: len,
    })
}

/// `v`, or `u64::MAX` if it does not fit (only error reports see that case).
fn clamp(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

pub(crate) fn to_u64(r: impl RangeBounds<usize>) -> (Bound<u64>, Bound<u64>) {
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
// SAFETY: `&MemoryRegion` reads the borrowed bytes only through `as_slice` (as `&[u8]`
// would) and the provider handle is Sync by the trait's bounds.
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
        Ok(LocalSlice::from_sge(self.extent().range(range)?))
    }

    /// A byte range the device may write (receives, reads, atomics).
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<LocalSliceMut<'_>, BoundsError> {
        Ok(LocalSliceMut::from_sge(self.extent().range(range)?))
    }

    fn extent(&self) -> Extent {
        Extent::new(self.ptr as u64, self.len, self.lkey)
    }

    /// The backend's handle.
    pub fn raw(&self) -> &P::Mr {
        &self.raw
    }
}

/// `len` registered bytes at `addr` under `lkey`: what a region or a pool's buffer names to
/// the device. Every entry of every kind of registered memory is cut here.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Extent {
    addr: u64,
    len: u64,
    lkey: u32,
}

impl Extent {
    pub(crate) fn new(addr: u64, len: usize, lkey: u32) -> Extent {
        Extent {
            addr,
            len: len as u64,
            lkey,
        }
    }

    /// The entry for `len` bytes at `off`, or why it does not fit: past the end, longer
    /// than an entry holds (4 GiB), or (impossible for live memory, checked so that no
    /// input makes the arithmetic wrap) past the end of the address space.
    pub(crate) fn sge(self, off: u64, len: u64) -> Result<Sge, BoundsError> {
        let err = BoundsError {
            offset: off,
            len,
            region_len: self.len,
        };
        match off.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => return Err(err),
        }
        Ok(Sge {
            addr: self.addr.checked_add(off).ok_or(err)?,
            length: u32::try_from(len).map_err(|_| err)?,
            lkey: self.lkey,
        })
    }

    /// The entry for `range` of the bytes.
    pub(crate) fn range(self, range: impl RangeBounds<usize>) -> Result<Sge, BoundsError> {
        let (off, len) = resolve(to_u64(range), self.len)?;
        self.sge(off, len)
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
    /// The memory is the process's (not a device's, [`crate::dmabuf`]): the library may
    /// read an atomic's result from it.
    host: bool,
    _b: PhantomData<&'a mut [u8]>,
}

impl LocalSlice<'_> {
    /// A slice over `sge`. The caller ties the lifetime to a shared borrow of the memory
    /// the entry names (as [`MemoryRegion::slice`] does).
    pub(crate) fn from_sge(sge: Sge) -> Self {
        LocalSlice {
            sge,
            _b: PhantomData,
        }
    }
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

/// Splits `sge` at `mid` bytes. Total: a `mid` past the end, or (impossible for an entry
/// of a registered buffer) an entry whose addresses would pass `u64::MAX`, is an error.
fn split_sge(sge: Sge, mid: usize) -> Result<(Sge, Sge), BoundsError> {
    let err = BoundsError {
        offset: u64::try_from(mid).unwrap_or(u64::MAX),
        len: 0,
        region_len: u64::from(sge.length),
    };
    let mid = u32::try_from(mid)
        .ok()
        .filter(|&m| m <= sge.length)
        .ok_or(err)?;
    let head = Sge { length: mid, ..sge };
    let tail = Sge {
        addr: sge.addr.checked_add(u64::from(mid)).ok_or(err)?,
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
        let host = self.host;
        let half = |sge| LocalSliceMut {
            sge,
            host,
            _b: PhantomData,
        };
        Ok((half(a), half(b)))
    }
}

impl LocalSliceMut<'_> {
    /// A slice over `sge`. The caller ties the lifetime to an exclusive borrow of the
    /// memory the entry names (as [`MemoryRegion::slice_mut`] does).
    pub(crate) fn from_sge(sge: Sge) -> Self {
        LocalSliceMut {
            sge,
            host: true,
            _b: PhantomData,
        }
    }
    /// A slice over `sge` in device memory, which the library never reads.
    #[cfg(all(feature = "std", unix))]
    pub(crate) fn from_device_sge(sge: Sge) -> Self {
        LocalSliceMut {
            sge,
            host: false,
            _b: PhantomData,
        }
    }
    /// Whether the memory is the process's: `false` for a slice of device memory
    /// ([`crate::dmabuf::DeviceRegion`]), whose bytes the host cannot read.
    pub fn is_host(&self) -> bool {
        self.host
    }
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
    /// The same slice, borrowed for as long as this one is: to post it in an operation and
    /// read it after that operation completed.
    pub fn reborrow(&mut self) -> LocalSliceMut<'_> {
        LocalSliceMut {
            sge: self.sge,
            host: self.host,
            _b: PhantomData,
        }
    }
    /// Reads the first 8 bytes as a native-endian `u64` (the result of an atomic); `None`
    /// for fewer, or for device memory.
    pub(crate) fn read_u64(&self) -> Option<u64> {
        if self.sge.length < 8 || !self.host {
            return None;
        }
        let mut b = [0u8; 8];
        // SAFETY: the slice borrows 8+ bytes of a registered buffer exclusively; the caller
        // reads only after the work that wrote them completed.
        unsafe { core::ptr::copy_nonoverlapping(self.sge.addr as *const u8, b.as_mut_ptr(), 8) };
        Some(u64::from_ne_bytes(b))
    }
}

/// Memory of a peer: address, length and remote key. Plain data, usually received from
/// the peer, so nothing about it is trusted: [`slice`](Self::slice) is total over every
/// value of every field.
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
    /// An RDMA write to the start of this region: the one place its [`SendOp`] is built
    /// (every level posts what these return).
    pub fn write_op(&self) -> SendOp {
        SendOp::Write {
            remote_addr: self.addr,
            rkey: self.rkey,
        }
    }

    /// An RDMA write with immediate data to the start of this region.
    pub fn write_with_imm_op(&self, imm: u32) -> SendOp {
        SendOp::WriteWithImm {
            remote_addr: self.addr,
            rkey: self.rkey,
            imm,
        }
    }

    /// An RDMA read from the start of this region.
    pub fn read_op(&self) -> SendOp {
        SendOp::Read {
            remote_addr: self.addr,
            rkey: self.rkey,
        }
    }

    /// A fetch-and-add on the 8 bytes at the start of this region.
    pub fn fetch_add_op(&self, add: u64) -> SendOp {
        SendOp::FetchAdd {
            remote_addr: self.addr,
            rkey: self.rkey,
            add,
        }
    }

    /// A compare-and-swap on the 8 bytes at the start of this region.
    pub fn compare_swap_op(&self, compare: u64, swap: u64) -> SendOp {
        SendOp::CompareSwap {
            remote_addr: self.addr,
            rkey: self.rkey,
            compare,
            swap,
        }
    }

    /// A sub-range, bounds-checked.
    ///
    /// `Ok` exactly when the range lies inside `0..len` and its end address, `addr +
    /// end`, does not pass `u64::MAX`; otherwise a [`BoundsError`], never a panic or a
    /// wrapped address, whatever the fields hold. So the result's `addr + len` never
    /// overflows. For a region (from a peer) whose addresses would pass `u64::MAX`, the
    /// error reports the bytes it has up to there (`u64::MAX - addr`) as `region_len`.
    ///
    /// ```
    /// use zverbs::RemoteRegion;
    /// let r = RemoteRegion { addr: 0x1000, len: 64, rkey: 7 };
    /// assert_eq!(r.slice(16..32).unwrap().addr, 0x1010);
    /// assert!(r.slice(60..70).is_err());
    /// // A peer's nonsense: the region would run past the end of the address space.
    /// let bad = RemoteRegion { addr: u64::MAX - 8, len: 64, rkey: 7 };
    /// assert_eq!(bad.slice(..8).unwrap().len, 8);
    /// assert_eq!(bad.slice(..9).unwrap_err().region_len, 8);
    /// assert!(bad.slice(..).is_err());
    /// ```
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteRegion, BoundsError> {
        let (off, len) = resolve(range, self.len)?;
        // `off + len <= self.len`: the sum cannot overflow; the address may.
        if self.addr.checked_add(off + len).is_none() {
            return Err(BoundsError {
                offset: off,
                len,
                region_len: u64::MAX - self.addr,
            });
        }
        Ok(RemoteRegion {
            // `addr + off <= addr + off + len`, which was just checked.
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
        // The bounds at u64::MAX are exact, not saturated.
        assert!(resolve(0..=u64::MAX, u64::MAX).is_err());
        assert_eq!(resolve(0..=u64::MAX - 1, u64::MAX), Ok((0, u64::MAX)));
        let past = (Bound::Excluded(u64::MAX), Bound::Unbounded);
        assert!(resolve(past, u64::MAX).is_err());
        let e = resolve(past, 1).unwrap_err();
        assert_eq!((e.offset, e.len, e.region_len), (u64::MAX, 0, 1));
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

    #[test]
    fn split_sge_is_total() {
        let sge = |addr, length| Sge {
            addr,
            length,
            lkey: 3,
        };
        let (h, t) = split_sge(sge(u64::MAX - 10, 10), 4).unwrap();
        assert_eq!(
            (h.addr, h.length, t.addr, t.length),
            (u64::MAX - 10, 4, u64::MAX - 6, 6)
        );
        assert!(split_sge(sge(u64::MAX - 2, 10), 4).is_err());
        assert!(split_sge(sge(0, 10), 11).is_err());
        assert!(split_sge(sge(0, u32::MAX), usize::MAX).is_err());
        assert!(split_sge(sge(0, u32::MAX), u32::MAX as usize + 1).is_err());
        assert!(split_sge(sge(0, u32::MAX), u32::MAX as usize).is_ok());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// Values spread over the whole range, with the edges often.
        fn any_u64() -> impl Strategy<Value = u64> {
            prop_oneof![
                any::<u64>(),
                0..64u64,
                (0..64u64).prop_map(|d| u64::MAX - d),
                (0..64u64).prop_map(|d| (1u64 << 32).wrapping_sub(32).wrapping_add(d)),
            ]
        }

        proptest! {
            #[test]
            fn split_sge_ok_exactly_when_the_halves_fit(
                addr in any_u64(),
                length in prop_oneof![any::<u32>(), Just(u32::MAX), 0..8u32],
                mid in prop_oneof![any::<usize>(), 0..16usize, Just(usize::MAX)],
            ) {
                let sge = Sge { addr, length, lkey: 9 };
                let fits = (mid as u128) <= u128::from(length)
                    && u128::from(addr) + mid as u128 <= u128::from(u64::MAX);
                match split_sge(sge, mid) {
                    Ok((h, t)) => {
                        prop_assert!(fits);
                        prop_assert_eq!((h.addr, h.length as usize, h.lkey), (addr, mid, 9));
                        prop_assert_eq!(t.addr as u128, u128::from(addr) + mid as u128);
                        prop_assert_eq!(t.length as usize, length as usize - mid);
                    }
                    Err(e) => {
                        prop_assert!(!fits);
                        prop_assert_eq!(e.region_len, u64::from(length));
                    }
                }
            }
        }
    }
}
